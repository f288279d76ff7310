r"""Where a cbert_jax train step spends its time, by XLA op (prints numbers; not a test).

  python benchmarks/profile_step.py --model bert --shape small [--top 15]

Traces a few steps of the jitted train step (the benchmark shapes of benchmarks/train_step.py)
with `jax.profiler`, reads the Perfetto trace it writes, and prints the time per step grouped by
kind (matmuls: XLA:CPU's YNNPACK fusions and dots; everything else by fusion kind) and the
largest non-matmul ops with the JAX operation they come from (from the HLO metadata), so a
slow transpose or reduction can be traced back to the model code.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.train_step import SHAPES, JaxStep  # noqa: E402

MODELS = {
  "bert": ("bert", 0.2, False),
  "crossbert": ("crossbert", 0.5, False),
  "crossbert_cms": ("crossbert", 0.5, True),
}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model", default="bert", choices=sorted(MODELS))
  p.add_argument("--shape", default="small", choices=sorted(SHAPES))
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--top", type=int, default=15)
  args = p.parse_args(argv)
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
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(args.steps):
        step.step()
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
    f"{args.model} @ {args.shape}: {total:.0f} ms of op time per step (ops may overlap); model "
    f"FLOPs {flops / 1e9:.1f} G -> >= {flops / (mm / 1e3) / 1e9:.0f} GFLOP/s inside matmuls"
  )
  for kind, ms in kinds.most_common(args.top):
    print(f"  {ms:8.1f} ms {100 * ms / total:5.1f}%  {kind}")
  print("largest matmul ops:")
  for name, ms in [kv for kv in per_op.most_common() if is_mm(kv[0])][: args.top]:
    print(f"  {ms:8.1f} ms  {name:34s} {meta.get(name, '')[:90]}")
  print("largest non-matmul ops:")
  for name, ms in [kv for kv in per_op.most_common() if not is_mm(kv[0])][: args.top]:
    print(f"  {ms:8.1f} ms  {name:34s} {meta.get(name, '')[:90]}")
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
