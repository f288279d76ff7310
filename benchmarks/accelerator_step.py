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
of every step, so no work is left queued). Model FLOPs are `models.flops.flops_per_token` (3x
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
import sys
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


def time_steps(step: JaxStep, steps: int, warmup: int) -> list[float]:
  for _ in range(warmup):
    step.step()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    step.step()  # returns the loss as a float: blocks on the step
    times.append(time.perf_counter() - start)
  return times


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
  measured = hardware.measure_matmul_peak(
    args.dtype, n=2048 if device.platform == "cpu" else 8192, seconds=1.0
  )
  print(
    f"device: {device.device_kind} ({device.platform}); peak {peak / 1e12:.1f} TFLOP/s "
    f"[{peak_source}]; measured {args.dtype} matmul {measured / 1e12:.1f} TFLOP/s",
    flush=True,
  )
  results = {}
  for name in names:
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
    results[name] = {
      "params": step.params,
      "compile_s": compile_s,
      "step_s": med,
      "step_s_min": min(times),
      "step_s_max": max(times),
      "tokens_per_s": shape.batch * shape.seq / med,
      "model_flops_per_s": flops_s,
      "mfu": flops_s / peak,
      "memory_mb": step.memory_bytes / 2**20,
    }
    r = results[name]
    print(
      f"  {name}: {r['params'] / 1e6:.0f}M params, step {med * 1e3:.1f} ms, "
      f"{r['tokens_per_s']:,.0f} tokens/s, {flops_s / 1e12:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}%, "
      f"{r['memory_mb']:,.0f} MB (compiled in {compile_s:.0f} s)",
      flush=True,
    )
    del step
  lines = [
    f"{device.device_kind}, {args.dtype} compute / float32 parameters, attention "
    f"{args.attention}, remat {args.remat}; d {shape.d}, {shape.layers} layers, {shape.heads} "
    f"heads, FFN {shape.ffn}, vocab {shape.vocab}, seq {shape.seq}, batch {shape.batch}; "
    f"peak {peak / 1e12:.1f} TFLOP/s ({peak_source}); measured matmul "
    f"{measured / 1e12:.1f} TFLOP/s; median of {args.steps} steps",
    "",
    "| model | params | step (ms) | data tokens/s | model TFLOP/s | MFU | memory (MB) |",
    "|---|---|---|---|---|---|---|",
  ]
  for name, r in results.items():
    lines.append(
      f"| {name} | {r['params'] / 1e6:.0f}M | {r['step_s'] * 1e3:.1f} | "
      f"{r['tokens_per_s']:,.0f} | {r['model_flops_per_s'] / 1e12:.1f} | "
      f"{100 * r['mfu']:.1f}% | {r['memory_mb']:,.0f} |"
    )
  if "BERT" in results:
    lines += [""] + [
      f"- {n} / BERT data tokens/s: **{r['tokens_per_s'] / results['BERT']['tokens_per_s']:.2f}x**"
      for n, r in results.items()
      if n != "BERT"
    ]
  if {"CrossBERT+CMS", "CrossBERT+CMS fused"} <= results.keys():
    ratio = (
      results["CrossBERT+CMS fused"]["tokens_per_s"] / results["CrossBERT+CMS"]["tokens_per_s"]
    )
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
