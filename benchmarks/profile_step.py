r"""Where a train step spends its time, by op (prints numbers; not a test).

  python benchmarks/profile_step.py --model bert --shape small [--top 15]
  python benchmarks/profile_step.py --model hf_bert_sparse_compiled --shape tiny   # a peer

Traces a few steps of the jitted train step (the benchmark shapes of benchmarks/contestants.py)
with `jax.profiler`, reads the Perfetto trace it writes, and prints the time per step grouped by
kind (matmuls: XLA:CPU's YNNPACK fusions and dots; everything else by fusion kind) and the
largest non-matmul ops with the JAX operation they come from (from the HLO metadata), so a
slow transpose or reduction can be traced back to the model code.

The `hf_*` models are benchmarks/contestants.py's Hugging Face contestants, profiled with
`torch.profiler`: self CPU time per aten op (or inductor kernel), grouped into matmuls, attention
and the rest, with the FLOP rate inside the matmuls. Side by side with a cbert_jax profile it
splits a throughput ratio into its FLOPs part and its FLOP-rate part, and says where the rate is
lost (docs/performance.md).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.contestants import SHAPES, JaxStep  # noqa: E402

MODELS = {
  "bert": ("bert", 0.2, False),
  "crossbert": ("crossbert", 0.5, False),
  "crossbert_cms": ("crossbert", 0.5, True),
}
# benchmarks/contestants.py's TorchStep arguments of each peer
PEERS = {
  "hf_bert": dict(kind="bert"),
  "hf_bert_sparse": dict(kind="bert", sparse=True),
  "hf_bert_sparse_compiled": dict(kind="bert", sparse=True, compiled=True),
  "hf_modernbert_sparse": dict(kind="modernbert", sparse=True),
}
# aten ops (and inductor's calls into them) that are matrix multiplies / fused attention
TORCH_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "extern_kernels.mm")
TORCH_ATTENTION = ("aten::_scaled_dot_product", "aten::_flash_attention")


def main(argv=None) -> dict:
  """Prints the profile; returns {wall_ms, op_ms, kinds (ms per step by kind), flops}."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="bert", choices=sorted(MODELS) + sorted(PEERS))
  p.add_argument("--shape", default="small", choices=sorted(SHAPES))
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--top", type=int, default=15)
  p.add_argument(
    "--matmul_rates",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also time the step's matmul shapes alone (JAX models)",
  )
  args = p.parse_args(argv)
  if args.model in PEERS:
    return _profile_torch(args)
  import jax

  family, ratio, cms = MODELS[args.model]
  step = JaxStep(family, SHAPES[args.shape], ratio, cms)
  for _ in range(2):
    step.step()
  meta = {}
  for line in step._compiled.as_text().splitlines():  # HLO op name -> the JAX op it came from
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{op_name=\"([^\"]+)\"", line)
    if m and m.group(1) not in meta:
      meta[m.group(1)] = m.group(2)
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(args.steps):
        step.step()
    wall = (time.perf_counter() - t0) / args.steps * 1e3  # ms per step (with tracing overhead)
    [path] = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)
    trace = json.load(gzip.open(path))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  per_op = collections.Counter()
  for e in events:
    # Device-side ops only: not the executor's own spans, Python frames or host-side waits.
    if (
      e.get("ph") == "X"
      and "dur" in e
      and not e["name"].startswith(
        ("ThunkExecutor", "$", "np.", "PjitFunction", "SlinkyThreadPool")
      )
    ):
      per_op[e["name"]] += e["dur"] / args.steps / 1e3  # ms per step
  is_mm = lambda n: n.startswith(("ynn_fusion", "dot", "xnn", "custom-call"))
  kinds = collections.Counter()
  for name, ms in per_op.items():
    kinds["matmul (YNNPACK fusions, dots)" if is_mm(name) else re.sub(r"[.\d]+$", "", name)] += ms
  total = sum(per_op.values())
  flops = step.flops_per_step
  mm = kinds["matmul (YNNPACK fusions, dots)"]
  # XLA's CPU runtime runs independent ops concurrently on the thread pool, so op times overlap:
  # their sum exceeds the step's wall time, and FLOPs / matmul op time is a lower bound.
  print(
    f"{args.model} @ {args.shape}: {total:.0f} ms of op time per step (ops may overlap; wall "
    f"{wall:.0f} ms under the tracer); model FLOPs {flops / 1e9:.1f} G -> "
    f"{flops / (wall / 1e3) / 1e9:.0f} GFLOP/s over the step, >= "
    f"{flops / (mm / 1e3) / 1e9:.0f} GFLOP/s inside matmuls"
  )
  _print_kinds(kinds, total, args.top)
  print("largest matmul ops:")
  for name, ms in [kv for kv in per_op.most_common() if is_mm(kv[0])][: args.top]:
    print(f"  {ms:8.1f} ms  {name:34s} {meta.get(name, '')[:90]}")
  print("largest non-matmul ops:")
  for name, ms in [kv for kv in per_op.most_common() if not is_mm(kv[0])][: args.top]:
    print(f"  {ms:8.1f} ms  {name:34s} {meta.get(name, '')[:90]}")
  summary = dict(wall_ms=wall, op_ms=total, kinds=dict(kinds), flops=flops)
  if not args.matmul_rates:
    return summary
  print("the step's matmul shapes alone (float32, forward; GFLOP/s and share of a 2048^2 matmul):")
  peak = _matmul_rate(2048, 2048, 2048)
  sh = SHAPES[args.shape]
  rows, k_rows = sh.batch * sh.seq, max(1, int(round(ratio * sh.seq))) * sh.batch
  for label, (m, k, n) in {
    "2048^2 reference": (2048, 2048, 2048),
    "attention projection": (rows, sh.d, sh.d),
    "FFN in (w1, w3)": (rows, sh.d, sh.ffn),
    "FFN out (w2)": (rows, sh.ffn, sh.d),
    "vocabulary head (targets)": (k_rows, sh.d, sh.vocab),
  }.items():
    rate = _matmul_rate(m, k, n)
    print(
      f"  {label:28s} [{m} x {k}] @ [{k} x {n}]: {rate / 1e9:6.1f} GFLOP/s ({100 * rate / peak:.0f}%)"
    )
  return summary


def _profile_torch(args) -> dict:
  """The peer's step under torch.profiler: self CPU time per op, grouped like the JAX side."""
  from torch.profiler import ProfilerActivity, profile

  from benchmarks.contestants import TorchStep

  step = TorchStep(shape=SHAPES[args.shape], **PEERS[args.model])
  for _ in range(2):
    step.step()
  t0 = time.perf_counter()
  with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(args.steps):
      step.step()
  wall = (time.perf_counter() - t0) / args.steps * 1e3  # ms per step (with profiler overhead)
  per_op = collections.Counter()
  for ev in prof.key_averages():
    if ev.self_cpu_time_total > 0 and not ev.key.startswith("ProfilerStep"):
      per_op[ev.key] += ev.self_cpu_time_total / args.steps / 1e3  # ms per step
  kinds = collections.Counter()
  for name, ms in per_op.items():
    if name.startswith(TORCH_MATMULS):
      kinds["matmul (aten mm/addmm/bmm)"] += ms
    elif name.startswith(TORCH_ATTENTION):
      kinds["attention (SDPA kernel)"] += ms
    else:
      kinds[name] += ms
  total = sum(per_op.values())
  mm = kinds["matmul (aten mm/addmm/bmm)"]
  flops = step.flops_per_step
  # torch runs one op at a time (each op multi-threaded), so self times add up to the step
  print(
    f"{args.model} @ {args.shape}: {total:.0f} ms of op self time per step (wall {wall:.0f} ms "
    f"under the profiler); model FLOPs {flops / 1e9:.1f} G -> {flops / (wall / 1e3) / 1e9:.0f} "
    f"GFLOP/s over the step; model FLOPs / matmul time {flops / (mm / 1e3) / 1e9:.0f} GFLOP/s "
    f"(attention's FLOPs are in the SDPA kernel's time)"
  )
  _print_kinds(kinds, total, args.top)
  return dict(wall_ms=wall, op_ms=total, kinds=dict(kinds), flops=flops)


def _print_kinds(kinds: collections.Counter, total: float, top: int) -> None:
  """The `top` op kinds by time per step, with their share of the op time."""
  for kind, ms in kinds.most_common(top):
    print(f"  {ms:8.1f} ms {100 * ms / total:5.1f}%  {kind}")


def _matmul_rate(m: int, k: int, n: int, seconds: float = 0.5) -> float:
  """FLOP/s of a jitted [m, k] @ [k, n] float32 matmul (median of repeats)."""
  import statistics
  import time

  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (m, k))
  b = jax.random.normal(jax.random.key(1), (k, n))
  f = jax.jit(jnp.matmul)
  f(a, b).block_until_ready()
  times, deadline = [], time.perf_counter() + seconds
  while len(times) < 5 or time.perf_counter() < deadline:
    t = time.perf_counter()
    f(a, b).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2.0 * m * k * n / statistics.median(times)


if __name__ == "__main__":
  main()
