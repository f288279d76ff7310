r"""Train-step benchmark: cbert_jax against the PyTorch peers, in one process (prints numbers).

  pip install -e '.[bench]'
  python benchmarks/train_step.py                       # both shapes, ~10 min on 2 cores
  python benchmarks/train_step.py --shapes tiny --steps 6

Contestants, each timed on the full train step (forward, loss, backward, optimizer update) at the
same shapes, alternating between contestants round by round so machine noise hits all alike
(the first step after each switch is not timed; torch's OpenMP threads wait passively):
  cbert_jax BERT                 20% masking, vocabulary head on the masked positions only
  cbert_jax CrossBERT            50% masking, no CMS (the encoder sees half the tokens)
  cbert_jax CrossBERT+CMS        two complementary views of T/2, every token a target
  ... ce_chunk=32                the same, vocabulary head + CE 32 positions at a time (memory)
  HF BertForMaskedLM             transformers, built from a config (GELU FFN, dropout 0)
  HF ModernBertForMaskedLM       transformers, built from a config (GLU FFN, RoPE, no biases)
Shapes (the Performance issue): tiny = 4 layers, d 256, 4 heads, FFN 1024, vocab 8192, seq 128,
batch 32; small = 6 layers, d 512, 8 heads, FFN 2048, vocab 32768, seq 128, batch 16. cbert_jax
uses the same FFN width (`model.ffn_dim`); the peers' masked-LM labels mark 20% of the tokens.

FLOPs (training = 3 x forward matmul FLOPs, 2 per multiply-add; attention counts QK^T and AV;
elementwise work is not counted), per data token, for what each contestant *executes*:
  cbert_jax: `models.flops.flops_per_token` (BERT and CrossBERT project to the vocabulary only at
    their targets; CMS: at every token, from a T/2 context);
  HF BERT: 6 L (4 d^2 + 2 d F) + 12 L T d + 6 (d^2 + d V): the MLM head (dense d x d and the
    decoder) runs at *every* position;
  HF ModernBERT: 6 L (4 d^2 + 3 d F) + 12 L T d + 6 (d^2 + d V), likewise (sparse_prediction off,
    its default); its local attention window (128) covers the whole 128-token row.
MFU divides model FLOP/s by the best matmul FLOP/s measured in this run (a 2048^2 float32 matmul
in JAX and in torch, before and after the contestants). Memory: for cbert_jax, XLA's compiled
buffer sizes (arguments + outputs - donated + temporaries); for torch, parameters, gradients and
AdamW state plus every tensor saved for the backward pass (counted with saved_tensors_hooks). The
process's peak RSS is printed too. Numbers on a shared VM are noisy: medians over >= 10 steps.

Writes <out>/train_step.json, .md and .png.
"""

from __future__ import annotations

import argparse
import dataclasses
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

MASK_ID, SPECIAL = 4, (0, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class Shape:
  layers: int
  d: int
  heads: int
  ffn: int
  vocab: int
  seq: int
  batch: int


SHAPES = {
  "tiny": Shape(layers=4, d=256, heads=4, ffn=1024, vocab=8192, seq=128, batch=32),
  "small": Shape(layers=6, d=512, heads=8, ffn=2048, vocab=32768, seq=128, batch=16),
}
CONTESTANTS = (
  "cbert_jax BERT",
  "cbert_jax CrossBERT",
  "cbert_jax CrossBERT+CMS",
  "cbert_jax CrossBERT+CMS ce_chunk=32",
  "HF BertForMaskedLM",
  "HF ModernBertForMaskedLM",
)


# ----------------------------------------------------------------------------------- cbert_jax --
class JaxStep:
  """One cbert_jax model's jitted, donated train step on a fixed random batch."""

  def __init__(self, family: str, shape: Shape, mask_ratio: float, cms: bool, **model_kw):
    import jax
    import jax.numpy as jnp
    import ml_collections
    from flax import nnx

    from cbert_jax import config_lib, optim, steps
    from cbert_jax.models import FAMILIES
    from cbert_jax.models import flops as flops_lib
    from cbert_jax.models.model_config import MaskConfig, ModelConfig

    s = shape
    cfg = ModelConfig(
      vocab_size=s.vocab,
      d_model=s.d,
      num_layers=s.layers,
      num_heads=s.heads,
      ffn_dim=s.ffn,
      predictor_layers=max(1, s.layers // 4),
      **model_kw,
    )
    mask = MaskConfig(mask_ratio=mask_ratio, mask_id=MASK_ID, special_ids=SPECIAL, cms=cms)
    with nnx.use_eager_sharding(False):
      model = FAMILIES[family](cfg, mask, nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    ocfg = ml_collections.ConfigDict(config_lib.base_config().optim.to_dict())
    tx, lr = optim.make_optimizer(ocfg, 1000)
    opt_state = tx.init(params)
    rs = np.random.RandomState(0)
    self.batch = {
      "tokens": jnp.asarray(rs.randint(5, s.vocab, (s.batch, s.seq)), jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(s.seq, dtype=jnp.int32), (s.batch, s.seq)),
      "segment_ids": jnp.ones((s.batch, s.seq), jnp.int32),
    }
    self.rng = jax.random.key(0)
    step = jax.jit(steps.make_train_step(graphdef, tx, lr), donate_argnums=(0, 1))
    compiled = step.lower(params, opt_state, self.batch, jnp.int32(0), self.rng).compile()
    mem = compiled.memory_analysis()
    self.memory_bytes = (
      (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
      )
      if mem
      else float("nan")
    )
    self.flops_per_step = flops_lib.flops_per_token(family, cfg, mask, s.seq) * s.batch * s.seq
    self.params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    self._compiled, self._state, self._i = compiled, (params, opt_state), 0
    self._jnp = jnp

  def step(self) -> float:
    params, opt_state = self._state
    self._i += 1
    params, opt_state, metrics = self._compiled(
      params, opt_state, self.batch, self._jnp.int32(self._i), self.rng
    )
    loss = float(metrics["loss"])  # blocks
    self._state = (params, opt_state)
    return loss


# ---------------------------------------------------------------------------------- torch peers --
class TorchStep:
  """A Hugging Face masked LM, AdamW and grad clipping, on a fixed random batch."""

  def __init__(self, kind: str, shape: Shape):
    import torch
    import transformers

    torch.manual_seed(0)
    s = shape
    if kind == "bert":
      cfg = transformers.BertConfig(
        vocab_size=s.vocab,
        hidden_size=s.d,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn,
        max_position_embeddings=s.seq,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
      )
      self.model = transformers.BertForMaskedLM(cfg)
      ffn_mm = 2 * s.d * s.ffn
    else:
      cfg = transformers.ModernBertConfig(
        vocab_size=s.vocab,
        hidden_size=s.d,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn,
        max_position_embeddings=s.seq,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        cls_token_id=2,
        sep_token_id=3,
      )
      self.model = transformers.ModernBertForMaskedLM(cfg)
      ffn_mm = 3 * s.d * s.ffn
    self.model.train()
    self.opt = torch.optim.AdamW(
      self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, s.vocab, (s.batch, s.seq), generator=g)
    masked = torch.rand(s.batch, s.seq, generator=g) < 0.2
    self.labels = torch.where(masked, ids, torch.full_like(ids, -100))
    self.inputs = torch.where(masked, torch.full_like(ids, MASK_ID), ids)
    self.attention_mask = torch.ones_like(ids)
    per_token = (
      6 * s.layers * (4 * s.d * s.d + ffn_mm)
      + 12 * s.layers * s.seq * s.d
      + 6 * (s.d * s.d + s.d * s.vocab)
    )
    self.flops_per_step = per_token * s.batch * s.seq
    self.params = sum(p.numel() for p in self.model.parameters())
    self.memory_bytes = self._memory()
    self._torch = torch

  def _loss(self):
    return self.model(
      input_ids=self.inputs, attention_mask=self.attention_mask, labels=self.labels
    ).loss

  def _memory(self) -> int:
    """Parameters + gradients + AdamW's two moments (fp32) + tensors saved for backward."""
    import torch

    saved: dict[int, int] = {}

    def pack(t):
      saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
      return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
      loss = self._loss()
    loss.backward()
    self.model.zero_grad(set_to_none=True)
    return 4 * 4 * self.params + sum(saved.values())

  def step(self) -> float:
    loss = self._loss()
    loss.backward()
    self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    return float(loss)


def build(name: str, shape: Shape):
  if name == "cbert_jax BERT":
    return JaxStep("bert", shape, 0.2, cms=False)
  if name == "cbert_jax CrossBERT":
    return JaxStep("crossbert", shape, 0.5, cms=False)
  if name == "cbert_jax CrossBERT+CMS":
    return JaxStep("crossbert", shape, 0.5, cms=True)
  if name == "cbert_jax CrossBERT+CMS ce_chunk=32":  # logits 32 positions at a time (memory)
    return JaxStep("crossbert", shape, 0.5, cms=True, ce_chunk=32)
  if name == "HF BertForMaskedLM":
    return TorchStep("bert", shape)
  if name == "HF ModernBertForMaskedLM":
    return TorchStep("modernbert", shape)
  raise ValueError(name)


# ------------------------------------------------------------------------------------ peaks -----
def matmul_peaks(n: int = 2048, seconds: float = 2.0) -> dict[str, float]:
  """FLOP/s of an n x n float32 matmul in JAX and in torch (median of repeats)."""
  import torch

  from cbert_jax import hardware

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
def run_shape(shape_name: str, names, steps: int, warmup: int, rounds: int) -> dict:
  shape = SHAPES[shape_name]
  contestants = {}
  for name in names:
    t0 = time.perf_counter()
    contestants[name] = build(name, shape)
    for _ in range(warmup):
      contestants[name].step()
    print(
      f"  [{shape_name}] {name}: built and warmed up in {time.perf_counter() - t0:.1f} s",
      flush=True,
    )
  times = {name: [] for name in names}
  per_round = max(1, -(-steps // rounds))
  for r in range(rounds):
    for name in names:
      contestants[name].step()  # untimed: the first step after switching pays for caches
      for _ in range(per_round):
        start = time.perf_counter()
        contestants[name].step()
        times[name].append(time.perf_counter() - start)
    print(
      f"  [{shape_name}] round {r + 1}/{rounds}: "
      + ", ".join(f"{n} {statistics.median(t):.3f} s" for n, t in times.items()),
      flush=True,
    )
  tokens = shape.batch * shape.seq
  out = {}
  for name in names:
    c, med = contestants[name], statistics.median(times[name])
    out[name] = {
      "step_s": med,
      "steps_timed": len(times[name]),
      "step_s_min": min(times[name]),
      "step_s_max": max(times[name]),
      "tokens_per_s": tokens / med,
      "flops_per_step": c.flops_per_step,
      "model_flops_per_s": c.flops_per_step / med,
      "memory_mb": c.memory_bytes / 2**20,
      "params": c.params,
    }
  del contestants
  return out


def ratios(res: dict) -> dict:
  out = {}
  for shape, r in res.items():
    tps = {n: v["tokens_per_s"] for n, v in r.items()}
    pairs = [
      ("cbert_jax BERT", "HF BertForMaskedLM"),
      ("cbert_jax BERT", "HF ModernBertForMaskedLM"),
      ("cbert_jax CrossBERT+CMS", "cbert_jax BERT"),
      ("cbert_jax CrossBERT", "cbert_jax BERT"),
    ]
    out[shape] = {f"{a} / {b}": tps[a] / tps[b] for a, b in pairs if a in tps and b in tps}
  return out


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
      f"### {shape}: {s.layers} layers, d {s.d}, {s.heads} heads, FFN {s.ffn}, vocab "
      f"{s.vocab}, seq {s.seq}, batch {s.batch}",
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
    lines += [""] + [f"- {k}: **{v:.2f}x**" for k, v in rat[shape].items()] + [""]
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


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="tiny,small")
  p.add_argument("--contestants", default=",".join(CONTESTANTS))
  p.add_argument("--steps", type=int, default=10, help="timed steps per contestant")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--rounds", type=int, default=2, help="alternation rounds")
  p.add_argument("--out", default="runs/bench/train_step")
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
  for k, v in matmul_peaks().items():
    peaks[k].append(v)
  print(
    f"matmul peak: JAX {peaks['jax'][0] / 1e9:.1f}, torch {peaks['torch'][0] / 1e9:.1f} GFLOP/s",
    flush=True,
  )
  res = {s: run_shape(s, names, args.steps, args.warmup, args.rounds) for s in shapes}
  for k, v in matmul_peaks().items():
    peaks[k].append(v)
  peak = max(max(v) for v in peaks.values())
  rat = ratios(res)
  table = markdown(res, peak, peaks, rat)
  print("\n" + table)
  os.makedirs(args.out, exist_ok=True)
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
  print(
    f"\npeak RSS {info['peak_rss_mb']:.0f} MB; wall {info['wall_s']:.0f} s; "
    f"written to {args.out}/train_step.{{json,md,png}}"
  )


if __name__ == "__main__":
  main()
