r"""Accelerator train-step benchmark: tokens/s and bf16 MFU of a ~300M-parameter BERT and CrossBERT.

  python benchmarks/accelerator_step.py                  # on a GPU/TPU host: ~300M, bf16, seq 512
  python benchmarks/accelerator_step.py --attention cudnn          # NVIDIA: cuDNN fused attention
  python benchmarks/accelerator_step.py --d 64 --layers 2 --heads 2 --vocab 512 --seq 32 \
      --batch 4 --dtype float32 --steps 3                           # a CPU dry run of the script

The default shape is BERT-large's trunk with SwiGLU: d 1024, 24 layers, 16 heads, FFN 2816
(SPEC §2's 8d/3 rounded to 256), vocabulary 32768, sequence 512: 308M non-embedding + 34M
embedding parameters. Parameters and optimizer state stay float32; matmuls and activations run in
`--dtype` (the `model.compute_dtype` switch of training). Contestants (the same cbert_jax train
step as training: forward, loss, backward, AdamW with clipping, buffers donated):
  BERT            20% masking, vocabulary head on the targets only
  CrossBERT       50% masking, no CMS (the encoder sees half the tokens)
  CrossBERT+CMS   two complementary views of T/2, every token a target
  ... fused       BERT and CrossBERT+CMS with `model.fused_projections` (q/k/v and SwiGLU's
                  gate/up as one matmul each; off by default: no gain on CPU, see
                  docs/performance.md), so one run on the accelerator decides it there too
Each is compiled, warmed up, then timed over `--steps` steps (median; the clock stops on the loss
of every step, so no work is left queued). On an accelerator each contestant runs in its own child
process (`--isolate auto`), so the device's peak memory (`memory_stats()["peak_bytes_in_use"]`) is
that contestant's alone; it is printed beside XLA's compiled figure and the memory plan's
prediction for the same shape and remat policy (`cbert_jax.scaling.memory.estimate`, what the sweep
planner fits members with), and the attention kernel that ran is read off the compiled HLO's custom
calls (cuDNN's fused attention, else XLA's dot + softmax). `--budget_s` (default 420 s) skips the
contestants that would not finish in time, so the whole check stays under 8 minutes. Model FLOPs are `models.flops.flops_per_token` (3x
forward matmul FLOPs, no recompute), MFU is against the device's dense spec-sheet peak for
`--dtype` (`cbert_jax.run.hardware`, e.g. H100/H200 SXM bf16 989 TFLOP/s); a measured 8192^2 matmul
in the same dtype is printed next to it. Writes <out>/accelerator_step.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.contestants import JaxStep, Shape  # noqa: E402

CONTESTANTS = {  # name -> (family, mask ratio, cms, fused projections)
  "BERT": ("bert", 0.2, False, False),
  "BERT fused": ("bert", 0.2, False, True),
  "CrossBERT": ("crossbert", 0.5, False, False),
  "CrossBERT+CMS": ("crossbert", 0.5, True, False),
  "CrossBERT+CMS fused": ("crossbert", 0.5, True, True),
}


def _without(argv: list[str], flag: str) -> list[str]:
  """argv less `flag VALUE` and `flag=VALUE`."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a == flag:
      skip = True
    elif not a.startswith(flag + "="):
      out.append(a)
  return out


def time_steps(step: JaxStep, steps: int, warmup: int) -> list[float]:
  for _ in range(warmup):
    step.step()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    step.step()  # returns the loss as a float: blocks on the step
    times.append(time.perf_counter() - start)
  return times


def plan_bytes(step: JaxStep, family: str, shape: Shape, remat: str) -> float:
  """The memory plan's bytes for this step on one device (no sharding, one micro-batch)."""
  from cbert_jax.scaling import memory as memory_lib

  one = {"data": 1, "fsdp": 1, "tensor": 1}
  s = memory_lib.shape_of(family, step.model_cfg, step.mask_cfg, shape.seq, shape.batch, one)
  return float(memory_lib.estimate(s, memory_lib.Setting(remat=remat))["total"])


def measure(name: str, shape: Shape, args, peak: float) -> dict:
  """One contestant: build and compile, warm up, time; its numbers."""
  import jax

  family, ratio, cms, fused = CONTESTANTS[name]
  t0 = time.perf_counter()
  step = JaxStep(
    family,
    shape,
    ratio,
    cms,
    compute_dtype=args.dtype,
    attention_impl=args.attention,
    remat=args.remat,
    fused_projections=fused,
  )
  compile_s = time.perf_counter() - t0
  times = time_steps(step, args.steps, args.warmup)
  med = statistics.median(times)
  flops_s = step.flops_per_step / med
  stats = jax.local_devices()[0].memory_stats() or {}
  measured = stats.get("peak_bytes_in_use")
  planned = plan_bytes(step, family, shape, args.remat)
  return {
    "params": step.params,
    "compile_s": compile_s,
    "step_s": med,
    "step_s_min": min(times),
    "step_s_max": max(times),
    "tokens_per_s": shape.batch * shape.seq / med,
    "model_flops_per_s": flops_s,
    "mfu": flops_s / peak,
    "memory_mb": step.memory_bytes / 2**20,  # XLA's compiled figure
    "plan_memory_mb": planned / 2**20,  # the memory plan's prediction
    "peak_memory_mb": measured / 2**20 if measured else None,  # the device's, None on CPU
    "attention_kernel": step.attention_kernel,
  }


def measure_in_child(name: str, argv: list[str], tmp: str) -> dict:
  """`measure` in a fresh process: the device's peak memory is this contestant's alone."""
  out = os.path.join(tmp, f"{len(os.listdir(tmp))}.json")
  cmd = [sys.executable, os.path.abspath(__file__), *argv, "--contestants", name]
  r = subprocess.run([*cmd, "--isolate", "no", "--child_json", out], check=False)
  if r.returncode != 0:
    return {"error": f"child exited {r.returncode}"}
  with open(out) as f:
    return json.load(f)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--d", type=int, default=1024)
  p.add_argument("--layers", type=int, default=24)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--ffn", type=int, default=0, help="SwiGLU width; 0 = 8d/3 rounded up to 256")
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--seq", type=int, default=512)
  p.add_argument("--batch", type=int, default=32, help="sequences per step (one device)")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn"))
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--contestants", default=",".join(CONTESTANTS))
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--out", default="runs/bench/accelerator_step")
  p.add_argument(
    "--isolate",
    default="auto",
    choices=("auto", "yes", "no"),
    help="each contestant in its own process (auto: on an accelerator, for its peak memory)",
  )
  p.add_argument(
    "--budget_s",
    type=float,
    default=420.0,
    help="skip contestants that would end past this many seconds (the check stays < 8 min)",
  )
  p.add_argument("--child_json", default="", help=argparse.SUPPRESS)  # --isolate's child
  argv = list(sys.argv[1:] if argv is None else argv)
  args = p.parse_args(argv)
  names = [n.strip() for n in args.contestants.split(",") if n.strip()]
  for n in names:
    if n not in CONTESTANTS:
      p.error(f"--contestants: unknown {n!r}; known: {', '.join(CONTESTANTS)}")

  import jax

  from cbert_jax.models.model_config import ffn_size_for
  from cbert_jax.run import hardware

  device = jax.local_devices()[0]
  ffn = args.ffn or ffn_size_for(args.d)
  shape = Shape(
    layers=args.layers,
    d=args.d,
    heads=args.heads,
    ffn=ffn,
    vocab=args.vocab,
    seq=args.seq,
    batch=args.batch,
  )
  peak, peak_source = hardware.device_peak(args.dtype)
  if args.child_json:  # one contestant, for the parent's --isolate
    with open(args.child_json, "w") as f:
      json.dump(measure(names[0], shape, args, peak), f)
    return {}
  measured = hardware.measure_matmul_peak(
    args.dtype, n=2048 if device.platform == "cpu" else 8192, seconds=1.0
  )
  print(
    f"device: {device.device_kind} ({device.platform}); peak {peak / 1e12:.1f} TFLOP/s "
    f"[{peak_source}]; measured {args.dtype} matmul {measured / 1e12:.1f} TFLOP/s",
    flush=True,
  )
  isolate = args.isolate == "yes" or (args.isolate == "auto" and device.platform != "cpu")
  parent_argv = _without(argv, "--contestants")  # each child is given its one contestant
  results, start, longest = {}, time.perf_counter(), 0.0
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      elapsed = time.perf_counter() - start
      if results and elapsed + longest > args.budget_s:  # the first always runs
        results[name] = {"skipped": f"--budget_s {args.budget_s:g}: {elapsed:.0f} s used"}
        print(f"  {name}: skipped ({results[name]['skipped']})", flush=True)
        continue
      t0 = time.perf_counter()
      r = measure_in_child(name, parent_argv, tmp) if isolate else measure(name, shape, args, peak)
      longest = max(longest, time.perf_counter() - t0)
      results[name] = r
      if "error" in r:
        print(f"  {name}: {r['error']}", flush=True)
        continue
      peak_mem = f"{r['peak_memory_mb']:,.0f}" if r["peak_memory_mb"] else "-"
      print(
        f"  {name}: {r['params'] / 1e6:.0f}M params, step {r['step_s'] * 1e3:.1f} ms, "
        f"{r['tokens_per_s']:,.0f} tokens/s, {r['model_flops_per_s'] / 1e12:.1f} TFLOP/s, "
        f"MFU {100 * r['mfu']:.1f}%, memory: compiled {r['memory_mb']:,.0f} MB, plan "
        f"{r['plan_memory_mb']:,.0f} MB, measured peak {peak_mem} MB; attention "
        f"{r['attention_kernel']} (compiled in {r['compile_s']:.0f} s)",
        flush=True,
      )
  timed = {n: r for n, r in results.items() if "step_s" in r}
  lines = [
    f"{device.device_kind}, {args.dtype} compute / float32 parameters, attention "
    f"{args.attention}, remat {args.remat}; d {shape.d}, {shape.layers} layers, {shape.heads} "
    f"heads, FFN {shape.ffn}, vocab {shape.vocab}, seq {shape.seq}, batch {shape.batch}; "
    f"peak {peak / 1e12:.1f} TFLOP/s ({peak_source}); measured matmul "
    f"{measured / 1e12:.1f} TFLOP/s; median of {args.steps} steps",
    "",
    "| model | params | step (ms) | data tokens/s | model TFLOP/s | MFU | memory: compiled / "
    "plan / measured peak (MB) | plan / compiled | attention kernel |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in results.items():
    if name not in timed:
      lines.append(f"| {name} | {r.get('skipped') or r.get('error')} |||||||| ")
      continue
    peak_mem = f"{r['peak_memory_mb']:,.0f}" if r["peak_memory_mb"] else "-"
    lines.append(
      f"| {name} | {r['params'] / 1e6:.0f}M | {r['step_s'] * 1e3:.1f} | "
      f"{r['tokens_per_s']:,.0f} | {r['model_flops_per_s'] / 1e12:.1f} | "
      f"{100 * r['mfu']:.1f}% | {r['memory_mb']:,.0f} / {r['plan_memory_mb']:,.0f} / {peak_mem} | "
      f"{r['plan_memory_mb'] / r['memory_mb']:.2f} | {r['attention_kernel']} |"
    )
  if "BERT" in timed:
    lines += [""] + [
      f"- {n} / BERT data tokens/s: **{r['tokens_per_s'] / timed['BERT']['tokens_per_s']:.2f}x**"
      for n, r in timed.items()
      if n != "BERT"
    ]
  if {"CrossBERT+CMS", "CrossBERT+CMS fused"} <= timed.keys():
    ratio = timed["CrossBERT+CMS fused"]["tokens_per_s"] / timed["CrossBERT+CMS"]["tokens_per_s"]
    lines.append(f"- CrossBERT+CMS fused / CrossBERT+CMS data tokens/s: **{ratio:.2f}x**")
  table = "\n".join(lines)
  print("\n" + table)
  info = {
    "device_kind": device.device_kind,
    "platform": device.platform,
    "peak_flops": peak,
    "peak_source": peak_source,
    "measured_matmul_flops": measured,
    "dtype": args.dtype,
    "attention": args.attention,
    "remat": args.remat,
    "shape": dataclasses.asdict(shape),
    "results": results,
    "jax": jax.__version__,
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "accelerator_step.json"), "w") as f:
    json.dump(info, f, indent=2)
  with open(os.path.join(args.out, "accelerator_step.md"), "w") as f:
    f.write(table + "\n")
  return info


if __name__ == "__main__":
  main()
