r"""Train-step benchmark: cbert_jax against the PyTorch peers, in one process (prints numbers).

  pip install -e '.[bench]'
  python benchmarks/train_step.py                       # every shape and contestant, ~35 min
  python benchmarks/train_step.py --shapes tiny --steps 6 --contestants "cbert_jax BERT,HF BertForMaskedLM"

Contestants, each timed on the full train step (forward, loss, backward, optimizer update) at the
same shapes, alternating between contestants round by round so machine noise hits all alike
(the first step after each switch is not timed; torch's OpenMP threads wait passively):
  cbert_jax BERT                 20% masking, vocabulary head on the masked positions only
  ... fused                      q/k/v and SwiGLU's gate/up as one matmul each
                                 (`model.fused_projections`; the same FLOPs)
  cbert_jax CrossBERT            50% masking, no CMS (the encoder sees half the tokens)
  cbert_jax CrossBERT r=0.75     75% masking, no CMS (the encoder sees a quarter)
  cbert_jax CrossBERT+CMS        two complementary views of T/2, every token a target (+ fused)
  ... ce_chunk=32                the same, vocabulary head + CE 32 positions at a time (memory;
                                 not in the default run)
  HF BertForMaskedLM             transformers, built from a config (GELU FFN, dropout 0); its
                                 default attention is SDPA (transformers 5)
  ... eager                      the same with attn_implementation="eager"
  ... sparse head                the encoder, then the MLM head only at the masked positions
                                 (gathered before `model.cls`: what a user who knows
                                 ModernBERT's trick would do)
  ... sparse head compiled       the same under torch.compile (inductor; compile time reported
                                 apart): HF BERT at its best
  HF ModernBertForMaskedLM       transformers, built from a config (GLU FFN, RoPE, no biases)
  ... sparse                     `sparse_prediction=True`: its head only at the masked positions
Shapes: tiny = 4 layers, d 256, 4 heads, FFN 1024, vocab 8192, seq 128, batch 32; small = 6
layers, d 512, 8 heads, FFN 2048, vocab 32768, seq 128, batch 16; paper = the paper's base
encoder, 12 layers, d 768, 12 heads, FFN 2048 (our ladder's SwiGLU width at d 768), vocab 32768,
seq 512, batch 2 (6 timed steps), HF BERT as BERT-base (GELU FFN 3072: the FFN FLOPs of SwiGLU
at 2048); micro = a seconds-long dry run for the tests. cbert_jax uses the
same FFN width (`model.ffn_dim`); the peers' masked-LM labels mark 20% of the tokens.

FLOPs (training = 3 x forward matmul FLOPs, 2 per multiply-add; attention counts QK^T and AV;
elementwise work is not counted), per data token, for what each contestant *executes*:
  cbert_jax: `models.flops.flops_per_token` (BERT and CrossBERT project to the vocabulary only at
    their targets; CMS: at every token, from a T/2 context);
  HF BERT: 6 L (4 d^2 + 2 d F_gelu) + 12 L T d + 6 (d^2 + d V) f: the MLM head (dense d x d and the
    decoder) runs at every position (f = 1), or at the masked fraction f with a sparse head;
  HF ModernBERT: 6 L (4 d^2 + 3 d F) + 12 L T d + 6 (d^2 + d V) f, likewise; its local attention
    window (128) covers the whole row at T 128; at T 512 transformers applies it as a mask on
    full SDPA attention, so the executed attention FLOPs are the global ones counted here.
Every ratio of data tokens/s is printed with the analytic one beside it (the denominator's FLOPs
per data token over the numerator's: the ratio at equal MFU), and the issue's targets are checked
in the table (met / MISSED), never in a timed test.
MFU divides model FLOP/s by the best matmul FLOP/s measured in this run (a 2048^2 float32 matmul
in JAX and in torch, before and after the contestants). Memory: for cbert_jax, XLA's compiled
buffer sizes (arguments + outputs - donated + temporaries); for torch, parameters, gradients and
AdamW state plus every tensor saved for the backward pass (counted with saved_tensors_hooks). The
process's peak RSS is printed too. Numbers on a shared VM are noisy: medians over >= 6-10 steps.

Writes <out>/train_step.json, .md and .png (and train_step.partial.json after each shape, removed
at the end: what a crash leaves). The paper shape builds its contestants one at a time per round
(`Shape.one_at_a_time`: all twelve at once need more than 24 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch's OpenMP workers otherwise spin-wait after each op, taking cores from the next contestant.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from benchmarks.contestants import (  # noqa: E402
  CONTESTANTS,
  DEFAULT_CONTESTANTS,
  HF_BERT,
  HF_MODERNBERT,
  SHAPES,
  build,
)


# ------------------------------------------------------------------------------------ peaks -----
def matmul_peaks(n: int = 2048, seconds: float = 2.0) -> dict[str, float]:
  """FLOP/s of an n x n float32 matmul in JAX and in torch (median of repeats)."""
  import torch

  from cbert_jax.run import hardware

  out = {"jax": hardware.measure_matmul_peak(np.float32, n=n, seconds=seconds)}
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  times = []
  deadline = time.perf_counter() + seconds
  while len(times) < 3 or time.perf_counter() < deadline:
    start = time.perf_counter()
    torch.mm(a, b)
    times.append(time.perf_counter() - start)
  out["torch"] = 2.0 * n**3 / statistics.median(times)
  return out


# ------------------------------------------------------------------------------------- run ------
def _summary(c, times: list[float], tokens: int) -> dict:
  """One contestant's numbers from its timed steps."""
  med = statistics.median(times)
  return {
    "step_s": med,
    "steps_timed": len(times),
    "step_s_min": min(times),
    "step_s_max": max(times),
    "tokens_per_s": tokens / med,
    "flops_per_step": c.flops_per_step,
    "model_flops_per_s": c.flops_per_step / med,
    "memory_mb": c.memory_bytes / 2**20,
    "params": c.params,
    "compile_s": c.compile_s,
  }


def run_shape(shape_name: str, names, steps: int | None, warmup: int, rounds: int) -> dict:
  """Times every contestant at the shape, alternating round by round; steps None: the shape's
  own. All contestants are held in memory at once, except at shapes with `one_at_a_time`
  (paper: twelve ~110M-parameter models with their AdamW states and activations do not fit in
  24 GB together), where each round builds, warms up, times and frees one contestant after the
  other (build and warm-up untimed)."""
  shape = SHAPES[shape_name]
  steps = steps or shape.steps
  tokens = shape.batch * shape.seq
  times = {name: [] for name in names}
  per_round = max(1, -(-steps // rounds))
  held, last = {}, {}

  def get(name: str, round_: int):
    if name in held:
      return held[name]
    t0 = time.perf_counter()
    c = build(name, shape)
    for _ in range(warmup):
      c.step()
    print(
      f"  [{shape_name}] {name}: built and warmed up in {time.perf_counter() - t0:.1f} s"
      + (f" (round {round_ + 1})" if shape.one_at_a_time else ""),
      flush=True,
    )
    if not shape.one_at_a_time:
      held[name] = c
    return c

  if not shape.one_at_a_time:
    for name in names:
      get(name, 0)
  for r in range(rounds):
    for name in names:
      c = get(name, r)
      c.step()  # untimed: the first step after switching pays for caches
      for _ in range(per_round):
        start = time.perf_counter()
        c.step()
        times[name].append(time.perf_counter() - start)
      last[name] = _summary(c, times[name], tokens)
      if shape.one_at_a_time:
        del c
        gc.collect()
    print(
      f"  [{shape_name}] round {r + 1}/{rounds}: "
      + ", ".join(f"{n} {statistics.median(t):.3f} s" for n, t in times.items()),
      flush=True,
    )
  held.clear()
  gc.collect()
  return {name: last[name] for name in names}


# Targets (issue 19), checked in the table, never in a timed test:
# (numerator, denominator or a peer group, shapes, at least).
TARGETS = (
  ("cbert_jax BERT", "HF BertForMaskedLM", ("tiny", "small"), 1.5),
  ("cbert_jax BERT", "best HF BertForMaskedLM", ("tiny", "small"), 1.2),
  ("cbert_jax CrossBERT", "cbert_jax BERT", ("paper",), 1.4),
)
MFU_TARGET = ("cbert_jax BERT", "small", 0.60)


def best_of(tps: dict, group: tuple[str, ...]) -> tuple[str, float] | None:
  """The fastest contestant of a peer group that ran (name, tokens/s)."""
  ran = [(n, tps[n]) for n in group if n in tps]
  return max(ran, key=lambda x: x[1]) if ran else None


def ratios(res: dict) -> dict:
  """Per shape: measured data-token throughput ratios, with the analytic ratio (FLOPs per data
  token of the denominator over the numerator's: what equal MFU would give) beside each."""
  out = {}
  for shape, r in res.items():
    tps = {n: v["tokens_per_s"] for n, v in r.items()}
    fpt = {n: v["flops_per_step"] for n, v in r.items()}
    groups = {"best HF BertForMaskedLM": HF_BERT, "best HF ModernBertForMaskedLM": HF_MODERNBERT}
    for label, group in groups.items():
      best = best_of(tps, group)
      if best:
        tps[label], fpt[label] = best[1], r[best[0]]["flops_per_step"]
    pairs = [
      ("cbert_jax BERT", "HF BertForMaskedLM"),
      ("cbert_jax BERT", "best HF BertForMaskedLM"),
      ("cbert_jax BERT", "HF ModernBertForMaskedLM"),
      ("cbert_jax BERT", "best HF ModernBertForMaskedLM"),
      ("cbert_jax CrossBERT", "cbert_jax BERT"),
      ("cbert_jax CrossBERT r=0.75", "cbert_jax BERT"),
      ("cbert_jax CrossBERT+CMS", "cbert_jax BERT"),
      ("cbert_jax BERT fused", "cbert_jax BERT"),
      ("cbert_jax CrossBERT+CMS fused", "cbert_jax CrossBERT+CMS"),
    ]
    out[shape] = {
      f"{a} / {b}": {"measured": tps[a] / tps[b], "analytic": fpt[b] / fpt[a]}
      for a, b in pairs
      if a in tps and b in tps
    }
    for group in groups.values():
      best = best_of(tps, group)
      if best:
        out[shape][f"best of {group[0]}"] = {"name": best[0]}
  return out


def targets(res: dict, rat: dict, peak: float) -> list[str]:
  """One line per target that this run measured: met or missed, with the number."""
  lines = []
  for a, b, shapes, want in TARGETS:
    for shape in shapes:
      got = rat.get(shape, {}).get(f"{a} / {b}")
      if got:
        ok = "met" if got["measured"] >= want else "MISSED"
        lines.append(f"- {a} / {b} at {shape} >= {want}x: {got['measured']:.2f}x, {ok}")
  name, shape, want = MFU_TARGET
  if name in res.get(shape, {}):
    mfu = res[shape][name]["model_flops_per_s"] / peak
    lines.append(
      f"- {name} MFU at {shape} >= {want:.0%}: {mfu:.1%}, {'met' if mfu >= want else 'MISSED'}"
    )
  return lines


def markdown(res: dict, peak: float, peaks: dict, rat: dict) -> str:
  lines = [
    f"matmul peak (2048^2 float32, best of JAX/torch, this run): {peak / 1e9:.1f} GFLOP/s "
    f"(JAX {', '.join(f'{v / 1e9:.0f}' for v in peaks['jax'])}; torch "
    f"{', '.join(f'{v / 1e9:.0f}' for v in peaks['torch'])}; before, after)",
    "",
  ]
  for shape, r in res.items():
    s = SHAPES[shape]
    lines += [
      f"### {shape}: {s.describe()}",
      "",
      "| contestant | params | median step (s) | data tokens/s | model GFLOP/s | MFU | memory (MB) |",
      "|---|---|---|---|---|---|---|",
    ]
    for name, v in r.items():
      lines.append(
        f"| {name} | {v['params'] / 1e6:.1f}M | {v['step_s']:.3f} | {v['tokens_per_s']:,.0f} | "
        f"{v['model_flops_per_s'] / 1e9:.1f} | {100 * v['model_flops_per_s'] / peak:.1f}% | "
        f"{v['memory_mb']:.0f} |"
      )
    lines += [""]
    for k, v in rat[shape].items():
      if "name" in v:
        lines.append(f"- {k}: {v['name']}")
      else:
        lines.append(f"- {k}: **{v['measured']:.2f}x** (analytic {v['analytic']:.2f}x)")
    compiled = [(n, v["compile_s"]) for n, v in r.items() if v.get("compile_s")]
    lines += [f"- {n}: torch.compile took {t:.0f} s (not in the step time)" for n, t in compiled]
    lines += [""]
  lines += ["### Targets", ""] + targets(res, rat, peak) + [""]
  return "\n".join(lines)


def plot(res: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(res), figsize=(6 * len(res), 4), squeeze=False)
  for ax, (shape, r) in zip(axes[0], res.items()):
    names = list(r)
    ax.barh(
      names,
      [r[n]["tokens_per_s"] for n in names],
      color=["C0" if n.startswith("cbert") else "C1" for n in names],
    )
    ax.set_title(f"{shape}: data tokens/s (median step)")
    ax.invert_yaxis()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="tiny,small,paper")
  p.add_argument("--contestants", default=",".join(DEFAULT_CONTESTANTS))
  p.add_argument(
    "--steps", type=int, default=0, help="timed steps per contestant (0: the shape's own)"
  )
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--rounds", type=int, default=2, help="alternation rounds")
  p.add_argument("--out", default="runs/bench/train_step")
  p.add_argument("--peak_seconds", type=float, default=2.0, help="time per matmul-peak measurement")
  args = p.parse_args(argv)
  names = [n.strip() for n in args.contestants.split(",") if n.strip()]
  shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
  for n in names:
    if n not in CONTESTANTS:
      p.error(f"--contestants: unknown {n!r}; known: {', '.join(CONTESTANTS)}")
  for s in shapes:
    if s not in SHAPES:
      p.error(f"--shapes: unknown {s!r}; known: {', '.join(SHAPES)}")
  try:
    import torch
    import transformers  # noqa: F401
  except ImportError as e:
    p.error(f"the PyTorch peers need the bench extra: pip install -e '.[bench]' ({e})")
  torch.set_num_threads(os.cpu_count() or 1)
  start = time.perf_counter()
  peaks = {"jax": [], "torch": []}
  for k, v in matmul_peaks(seconds=args.peak_seconds).items():
    peaks[k].append(v)
  print(
    f"matmul peak: JAX {peaks['jax'][0] / 1e9:.1f}, torch {peaks['torch'][0] / 1e9:.1f} GFLOP/s",
    flush=True,
  )
  os.makedirs(args.out, exist_ok=True)
  res = {}
  for s in shapes:  # each finished shape is kept on disk: a crash later loses only the rest
    res[s] = run_shape(s, names, args.steps or None, args.warmup, args.rounds)
    with open(os.path.join(args.out, "train_step.partial.json"), "w") as f:
      json.dump({"peaks": peaks, "results": res}, f, indent=2)
  for k, v in matmul_peaks(seconds=args.peak_seconds).items():
    peaks[k].append(v)
  peak = max(max(v) for v in peaks.values())
  rat = ratios(res)
  table = markdown(res, peak, peaks, rat)
  print("\n" + table)
  info = {
    "peak_flops": peak,
    "peaks": peaks,
    "results": res,
    "ratios": rat,
    "shapes": {s: dataclasses.asdict(SHAPES[s]) for s in shapes},
    "versions": {
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "jax": __import__("jax").__version__,
    },
    "cpu_count": os.cpu_count(),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "wall_s": time.perf_counter() - start,
  }
  with open(os.path.join(args.out, "train_step.json"), "w") as f:
    json.dump(info, f, indent=2)
  with open(os.path.join(args.out, "train_step.md"), "w") as f:
    f.write(table + "\n")
  plot(res, os.path.join(args.out, "train_step.png"))
  os.remove(os.path.join(args.out, "train_step.partial.json"))
  print(
    f"\npeak RSS {info['peak_rss_mb']:.0f} MB; wall {info['wall_s']:.0f} s; "
    f"written to {args.out}/train_step.{{json,md,png}}"
  )
  return info


if __name__ == "__main__":
  main()
