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
  steps: int = 10  # timed steps per contestant unless --steps is given
  gelu_ffn: int = 0  # HF BERT's (GELU, two matmuls) FFN width; 0 = ffn (the same width)
  one_at_a_time: bool = False  # build each contestant per round and free it (memory)

  @property
  def bert_ffn(self) -> int:
    return self.gelu_ffn or self.ffn

  def describe(self) -> str:
    """'4 layers, d 256, 4 heads, FFN 1024, vocab 8192, seq 128, batch 32' (the tables' headings)."""
    gelu = f" (HF BERT: GELU {self.gelu_ffn})" if self.gelu_ffn else ""
    return (
      f"{self.layers} layers, d {self.d}, {self.heads} heads, FFN {self.ffn}{gelu}, vocab "
      f"{self.vocab}, seq {self.seq}, batch {self.batch}"
    )


SHAPES = {
  "tiny": Shape(layers=4, d=256, heads=4, ffn=1024, vocab=8192, seq=128, batch=32),
  "small": Shape(layers=6, d=512, heads=8, ffn=2048, vocab=32768, seq=128, batch=16),
  # The paper's base encoder (d 768 x 12, our ladder's SwiGLU width 2048 for d 768), at the
  # paper's 512-token rows: where its throughput claim is made. HF BERT runs as BERT-base, GELU
  # FFN 3072: the same FFN FLOPs as SwiGLU at 2048 (2 x 3072 = 3 x 2048). 2 rows (1024 tokens)
  # per step keep a step at several seconds on 2 cores.
  "paper": Shape(
    layers=12,
    d=768,
    heads=12,
    ffn=2048,
    vocab=32768,
    seq=512,
    batch=2,
    steps=6,
    gelu_ffn=3072,
    one_at_a_time=True,
  ),
  # a dry run in seconds (tests/test_benchmarks.py); not part of the default run
  "micro": Shape(layers=2, d=64, heads=2, ffn=128, vocab=512, seq=32, batch=4, steps=2),
}
CONTESTANTS = (
  "cbert_jax BERT",
  "cbert_jax BERT fused",
  "cbert_jax CrossBERT",
  "cbert_jax CrossBERT r=0.75",
  "cbert_jax CrossBERT+CMS",
  "cbert_jax CrossBERT+CMS fused",
  "cbert_jax CrossBERT+CMS ce_chunk=32",
  "HF BertForMaskedLM",
  "HF BertForMaskedLM eager",
  "HF BertForMaskedLM sparse head",
  "HF BertForMaskedLM sparse head compiled",
  "HF ModernBertForMaskedLM",
  "HF ModernBertForMaskedLM sparse",
)
# The run without --contestants: every one but the memory variant (ce_chunk: same FLOPs, slower).
DEFAULT_CONTESTANTS = tuple(n for n in CONTESTANTS if "ce_chunk" not in n)
HF_BERT = tuple(n for n in CONTESTANTS if n.startswith("HF BertForMaskedLM"))
HF_MODERNBERT = tuple(n for n in CONTESTANTS if n.startswith("HF ModernBert"))


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
    self.compile_s = None  # XLA's compile time is in "built and warmed up"
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

  def __init__(
    self,
    kind: str,
    shape: Shape,
    attention: str = "sdpa",
    sparse: bool = False,
    compiled: bool = False,
  ):
    """kind: bert | modernbert; attention: transformers' attn_implementation (sdpa is its
    default); sparse: the MLM head only at the masked positions (ModernBERT's
    `sparse_prediction`; for BERT the encoder's output gathered at the masked positions before
    `model.cls`, the same trick by hand); compiled: the loss function under torch.compile
    (inductor), its compile time timed on its own."""
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
        intermediate_size=s.bert_ffn,
        max_position_embeddings=s.seq,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation=attention,
      )
      self.model = transformers.BertForMaskedLM(cfg)
      ffn_mm = 2 * s.d * s.bert_ffn
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
        sparse_prediction=sparse,
        attn_implementation=attention,
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
    # A fixed index of the masked positions: a static shape for torch.compile.
    self.masked_idx = masked.flatten().nonzero().squeeze(1)  # [M]
    self.sparse_bert = sparse and kind == "bert"
    head_frac = float(masked.float().mean()) if sparse else 1.0  # where the MLM head runs
    per_token = (
      6 * s.layers * (4 * s.d * s.d + ffn_mm)
      + 12 * s.layers * s.seq * s.d
      + 6 * (s.d * s.d + s.d * s.vocab) * head_frac
    )
    self.flops_per_step = per_token * s.batch * s.seq
    self.params = sum(p.numel() for p in self.model.parameters())
    self.memory_bytes = self._memory()
    self._torch = torch
    self.compile_s = None
    if compiled:
      self._loss = torch.compile(self._loss)
      t0 = time.perf_counter()
      self.step()  # compiles forward and backward
      self.compile_s = time.perf_counter() - t0

  def _loss(self):
    if self.sparse_bert:  # the encoder, then the MLM head at the masked positions only
      import torch.nn.functional as F  # noqa: N812

      h = self.model.bert(input_ids=self.inputs, attention_mask=self.attention_mask)[0]
      h = h.reshape(-1, h.shape[-1]).index_select(0, self.masked_idx)  # [M, d]
      logits = self.model.cls(h)  # [M, V]
      return F.cross_entropy(logits, self.labels.flatten().index_select(0, self.masked_idx))
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
    return float(loss.detach())


def build(name: str, shape: Shape):
  """The contestant `name` (one of CONTESTANTS) at `shape`, compiled."""
  jax_steps = {
    "cbert_jax BERT": lambda: JaxStep("bert", shape, 0.2, cms=False),
    "cbert_jax BERT fused": lambda: JaxStep("bert", shape, 0.2, cms=False, fused_projections=True),
    "cbert_jax CrossBERT": lambda: JaxStep("crossbert", shape, 0.5, cms=False),
    "cbert_jax CrossBERT r=0.75": lambda: JaxStep("crossbert", shape, 0.75, cms=False),
    "cbert_jax CrossBERT+CMS": lambda: JaxStep("crossbert", shape, 0.5, cms=True),
    "cbert_jax CrossBERT+CMS fused": lambda: JaxStep(
      "crossbert", shape, 0.5, cms=True, fused_projections=True
    ),
    # logits 32 positions at a time (memory)
    "cbert_jax CrossBERT+CMS ce_chunk=32": lambda: JaxStep(
      "crossbert", shape, 0.5, cms=True, ce_chunk=32
    ),
    "HF BertForMaskedLM": lambda: TorchStep("bert", shape),
    "HF BertForMaskedLM eager": lambda: TorchStep("bert", shape, attention="eager"),
    "HF BertForMaskedLM sparse head": lambda: TorchStep("bert", shape, sparse=True),
    "HF BertForMaskedLM sparse head compiled": lambda: TorchStep(
      "bert", shape, sparse=True, compiled=True
    ),
    "HF ModernBertForMaskedLM": lambda: TorchStep("modernbert", shape),
    "HF ModernBertForMaskedLM sparse": lambda: TorchStep("modernbert", shape, sparse=True),
  }
  return jax_steps[name]()


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
