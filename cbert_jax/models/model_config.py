"""Static description of a model: the frozen dataclass every model module is built from.

`config_lib.resolve` turns the user's `config.model` / `config.masking` ConfigDicts (plus the
tokenizer's vocabulary and special ids) into these dataclasses; models never read ConfigDicts, so a
model can be built in a test or a notebook without the config machinery.
"""

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np


def numpy_dtype(name: str) -> np.dtype:
  """The dtype object `jax.numpy.dtype(name)` gives (jnp.dtype is np.dtype; bfloat16 and the other
  ML types come from ml_dtypes, as in JAX), without importing JAX."""
  ml_type = getattr(ml_dtypes, name, None)
  return np.dtype(ml_type if isinstance(ml_type, type) else name)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of an encoder (and, for CrossBERT, its predictor)."""

  vocab_size: int  # rows of the embedding table and columns of the output head
  d_model: int  # residual width of the encoder
  num_layers: int  # encoder blocks
  num_heads: int  # attention heads (encoder)
  head_dim: int = 0  # per-head width; 0 = d_model // num_heads
  ffn_dim: int = 0  # SwiGLU hidden width; 0 = 256 * ceil((8d/3) / 256)  (SPEC §2)
  norm_eps: float = 1e-5  # RMSNorm epsilon (computed in fp32)
  rope_theta: float = 10000.0  # RoPE base
  init_std: float = 0.0  # truncated-normal std of input projections; 0 = d_model ** -0.5
  init_scale: float = 1.0  # global multiplier on every init std (the paper's large-model fix)
  depth_init: str = (
    "none"  # output-projection std divisor: none | global (sqrt(2(L+1))) | current (sqrt(2(l+1)))
  )
  tie_embeddings: bool = False  # head = embedding table transposed
  compute_dtype: str = (
    "float32"  # matmul/activation dtype (bfloat16 on TPU/GPU); params stay param_dtype
  )
  remat: str = (
    "none"  # recompute block activations in backward: none | full | dots (save matmul outputs)
  )
  ce_chunk: int = 0  # vocab head + CE over this many target positions at a time (0 = all at once)
  # attention: auto (xla) | xla | cudnn (jax.nn.dot_product_attention's) | splash (Pallas' TPU
  # splash kernel, models/splash.py; opt-in: estimated slower for the paper members, docs/performance.md)
  attention_impl: str = "auto"
  param_dtype: str = "float32"  # storage dtype of parameters and optimizer state
  # q/k/v (k/v in cross-attention) and SwiGLU's w1/w3 as one matmul each, the weights concatenated
  # at compute time: the parameters and checkpoints are the same either way
  fused_projections: bool = False
  # CrossBERT predictor (ignored by BERT).
  predictor_layers: int = 1  # cross-attention blocks
  predictor_d_model: int = 0  # predictor width; 0 = d_model (a projection is added when it differs)
  predictor_heads: int = 0  # predictor heads; 0 = num_heads (or d_pred // head_dim when narrower)
  predictor_self_attn: bool = (
    False  # also let queries attend to each other (an ablation; default off)
  )
  predictor_positions: str = (
    "rope"  # rope (queries placed by RoPE) | learned (absolute table, MAE-style)
  )
  max_positions: int = 0  # rows of the learned position table (>= seq_len); only for "learned"
  # ELECTRA generator and objective (ignored by BERT and CrossBERT).
  generator_width: float = (
    0.25  # generator d_model as a fraction of d_model (whole heads; ELECTRA: 1/4-1/3)
  )
  generator_depth: float = 1.0  # generator layers as a fraction of num_layers (at least 1)
  generator_shared_embeddings: bool = (
    True  # one token-embedding table for generator and discriminator
  )
  disc_weight: float = 50.0  # weight of the replaced-token-detection loss (ELECTRA: 50)

  @property
  def head_size(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def ffn_size(self) -> int:
    return self.ffn_dim or ffn_size_for(self.d_model)

  @property
  def pred_d(self) -> int:
    return self.predictor_d_model or self.d_model

  @property
  def pred_heads(self) -> int:
    if self.predictor_heads:
      return self.predictor_heads
    return self.num_heads if self.pred_d == self.d_model else max(1, self.pred_d // self.head_size)

  @property
  def pred_head_size(self) -> int:
    return self.pred_d // self.pred_heads

  @property
  def pred_ffn_size(self) -> int:
    return ffn_size_for(self.pred_d) if self.pred_d != self.d_model else self.ffn_size

  @property
  def dtype(self) -> np.dtype:
    return numpy_dtype(self.compute_dtype)

  @property
  def pdtype(self) -> np.dtype:
    return numpy_dtype(self.param_dtype)

  def std(self) -> float:
    """Base init std of input projections and embeddings."""
    return (self.init_std or self.d_model**-0.5) * self.init_scale

  def out_divisor(self, layer: int, num_layers: int) -> float:
    """Divisor of the output-projection std of block `layer` (0-based) in a stack of `num_layers`."""
    if self.depth_init == "none":
      return 1.0
    if self.depth_init == "global":
      return math.sqrt(2 * (num_layers + 1))
    if self.depth_init == "current":
      return math.sqrt(2 * (layer + 1))
    raise ValueError(f"model.depth_init must be none|global|current, got {self.depth_init!r}")


@dataclasses.dataclass(frozen=True)
class MaskConfig:
  """How training inputs are corrupted. Ids come from the tokenizer."""

  mask_ratio: float  # fraction of tokens per row that are targets (static K = round(r*T))
  mask_id: int  # id of [MASK] (BERT corruption only; CrossBERT never feeds it)
  special_ids: tuple[int, ...]  # ids never masked or predicted (pad, bos, eos, mask)
  p_mask: float = 0.8  # BERT: fraction of targets replaced by [MASK]
  p_random: float = 0.1  # BERT: fraction replaced by a random (non-special) token; rest unchanged
  cms: bool = True  # CrossBERT: complementary masking (both halves are targets)
  cms_form: str = "gather"  # CrossBERT+CMS: gather (two rows of T/2) | inplace (one row, masks)


def ffn_size_for(d: int) -> int:
  """SwiGLU hidden width of SPEC §2 (Lingua's rule): 256 * ceil((8d/3) / 256)."""
  return 256 * math.ceil((8 * d / 3) / 256)


def from_config(
  config: Any, vocab_size: int, mask_id: int, special_ids: tuple[int, ...]
) -> tuple[ModelConfig, MaskConfig]:
  """The frozen dataclasses a resolved config's `model` / `masking` groups describe.

  Args:
    config: a resolved run config (ml_collections.ConfigDict; reads model.*, masking.* and
      model_name).
    vocab_size, mask_id, special_ids: from the tokenizer (or planned values before it exists).
  """
  m = config.model
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  model_cfg = ModelConfig(
    **({k: m[k] for k in m.keys() if k in fields} | {"vocab_size": int(vocab_size)})
  )
  mk = config.masking
  mask_cfg = MaskConfig(
    mask_ratio=mk.mask_ratio,
    mask_id=int(mask_id),
    special_ids=tuple(int(i) for i in special_ids),
    p_mask=mk.p_mask,
    p_random=mk.p_random,
    cms=mk.cms and config.model_name == "crossbert",
    cms_form=mk.cms_form,
  )
  return model_cfg, mask_cfg


def num_masked(seq_len: int, ratio: float) -> int:
  """K, the static number of targets per row (at least 1, at most T - 1)."""
  return int(min(max(round(ratio * seq_len), 1), seq_len - 1))


def generator_config(cfg: ModelConfig) -> ModelConfig:
  """ELECTRA's generator ModelConfig: narrower and/or shallower, same head size and numerics."""
  hd = cfg.head_size
  heads = max(1, round(cfg.d_model * cfg.generator_width / hd))
  return dataclasses.replace(
    cfg,
    d_model=heads * hd,
    num_heads=heads,
    head_dim=hd,
    ffn_dim=0,
    num_layers=max(1, round(cfg.num_layers * cfg.generator_depth)),
  )
