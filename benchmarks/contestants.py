r"""The train-step benchmark's contestants: the shapes they run at and each model's full train step.

benchmarks/train_step.py times them against each other; benchmarks/embed.py reuses the shapes and
the masking ids, benchmarks/profile_step.py and accelerator_step.py the steps.

  Shape / SHAPES      tiny, small, paper (the paper's base encoder at 512-token rows) and micro (a
                      seconds-long dry run for the tests): layers, width, heads, FFN, vocabulary,
                      row length, rows per step, timed steps
  JaxStep             a cbert_jax model's jitted, donated train step (forward, loss, backward,
                      AdamW update) on a fixed random batch, with its executed FLOPs and XLA's
                      buffer sizes
  TorchStep           a Hugging Face masked LM (BERT or ModernBERT; SDPA or eager attention; a
                      dense or sparse MLM head; optionally torch.compile) with AdamW and gradient
                      clipping, with its executed FLOPs and the memory its backward pass holds
  hf_config           a Hugging Face peer's transformers config at a shape (embed.py's peers too)
  model_config        cbert_jax's ModelConfig at a shape (embed.py's encoders too)
  step_configs        a cbert_jax contestant's ModelConfig and MaskConfig (JaxStep's, and what
                      accelerator_step.py asks the memory plan about)
  CONTESTANTS/build   the named contestants and how each is built at a shape
FLOPs conventions and what each contestant measures: benchmarks/train_step.py's docstring.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

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
  # a dry run in seconds (tests/e2e/test_benchmarks.py); not part of the default run
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
def model_config(s: Shape, **model_kw):
  """The cbert_jax ModelConfig at shape `s`: its width, depth, heads, FFN and vocabulary, the
  predictor a quarter of the encoder's depth (at least 1; BERT has none, so its parameters do not
  depend on it). `model_kw`: further ModelConfig fields (fused attention, a CE chunk)."""
  from cbert_jax.models.model_config import ModelConfig

  return ModelConfig(
    vocab_size=s.vocab,
    d_model=s.d,
    num_layers=s.layers,
    num_heads=s.heads,
    ffn_dim=s.ffn,
    predictor_layers=max(1, s.layers // 4),
    **model_kw,
  )


def step_configs(shape: Shape, mask_ratio: float, cms: bool, **model_kw):
  """(ModelConfig, MaskConfig) of a cbert_jax contestant at `shape`: what `JaxStep` builds and
  trains, and what the memory plan is asked about (benchmarks/accelerator_step.py checks a shape
  against a chip with it before building anything)."""
  from cbert_jax.models.model_config import MaskConfig

  mask = MaskConfig(mask_ratio=mask_ratio, mask_id=MASK_ID, special_ids=SPECIAL, cms=cms)
  return model_config(shape, **model_kw), mask


# Custom-call targets of fused attention kernels in compiled HLO: cuDNN's flash attention
# (jax.nn.dot_product_attention(implementation="cudnn")) and, should one appear, a Pallas/Mosaic
# kernel on TPU. Without one, attention is XLA's own dot + softmax fusions.
FUSED_ATTENTION_TARGETS = {
  "__cudnn$fmha": "cuDNN fused attention",
  "tpu_custom_call": "Pallas/Mosaic",
}


def attention_kernel(hlo_text: str) -> str:
  """Which attention kernel a compiled step runs, read off its HLO's custom calls."""
  found = [name for target, name in FUSED_ATTENTION_TARGETS.items() if target in hlo_text]
  return ", ".join(found) if found else "XLA (dot + softmax fusions)"


class JaxStep:
  """One cbert_jax model's jitted, donated train step on a fixed random batch."""

  def __init__(self, family: str, shape: Shape, mask_ratio: float, cms: bool, **model_kw):
    import jax
    import jax.numpy as jnp
    import ml_collections
    from flax import nnx

    from cbert_jax import config_lib
    from cbert_jax.models import FAMILIES
    from cbert_jax.models import flops as flops_lib
    from cbert_jax.step import optim, steps

    s = shape
    cfg, mask = step_configs(s, mask_ratio, cms, **model_kw)
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
    self.model_cfg, self.mask_cfg = cfg, mask  # what the memory plan is asked about
    self.attention_kernel = attention_kernel(compiled.as_text())
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
def hf_config(kind: str, s: Shape, attention: str | None = None, **extra):
  """The transformers config of a Hugging Face peer at shape `s`: kind "bert" (BertConfig, GELU
  FFN of width `s.bert_ffn`, dropout 0) or "modernbert" (ModernBertConfig, GLU FFN of width
  `s.ffn`, our special ids); attention: its attn_implementation (None: transformers' default);
  extra: further config fields. The train-step and the embedding benchmarks build their peers
  from it."""
  import transformers

  common = dict(
    vocab_size=s.vocab,
    hidden_size=s.d,
    num_hidden_layers=s.layers,
    num_attention_heads=s.heads,
    max_position_embeddings=s.seq,
    **({"attn_implementation": attention} if attention else {}),
    **extra,
  )
  if kind == "bert":
    return transformers.BertConfig(
      **common,
      intermediate_size=s.bert_ffn,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
    )
  return transformers.ModernBertConfig(
    **common,
    intermediate_size=s.ffn,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=3,
    cls_token_id=2,
    sep_token_id=3,
  )


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
      self.model = transformers.BertForMaskedLM(hf_config("bert", s, attention))
      ffn_mm = 2 * s.d * s.bert_ffn
    else:
      cfg = hf_config("modernbert", s, attention, sparse_prediction=sparse)
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
