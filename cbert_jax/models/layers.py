"""Building blocks shared by every model: RMSNorm, RoPE, attention (self and cross), SwiGLU.

Conventions (SPEC §2, following Meta Lingua): pre-norm, no biases, RMSNorm in fp32, RoPE on q/k at
arbitrary position ids, fp32 softmax, truncated-normal init. Every parameter carries logical axis
names (`out_sharding` metadata) and the main activations are constrained by logical names; the
mapping to mesh axes lives in the config's `sharding_rules`, never here.

Logical names: vocab, embed, heads, kv (per-head width), mlp; activations add batch, seq.
"""

import dataclasses

import flax.linen as nn  # only for with_logical_constraint (activations), which reads the same rules
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cbert_jax.models import splash
from cbert_jax.models.dense import dense
from cbert_jax.models.model_config import ModelConfig


def constrain(x: jax.Array, names: tuple) -> jax.Array:
  """Shard an activation by logical names; a no-op outside a mesh + rules context."""
  return nn.with_logical_constraint(x, names)


def param(rngs: nnx.Rngs, shape: tuple, names: tuple, std: float, dtype) -> nnx.Param:
  """A normal(0, std) parameter truncated at +-3 std (as Lingua's trunc_normal_), with logical names."""
  value = std * jax.random.truncated_normal(rngs.params(), -3.0, 3.0, shape, jnp.float32)
  return nnx.Param(value.astype(dtype), out_sharding=names)


class RMSNorm(nnx.Module):
  """RMSNorm computed in fp32 whatever the compute dtype; returns the compute dtype."""

  def __init__(self, dim: int, cfg: ModelConfig):
    self.scale = nnx.Param(jnp.ones((dim,), cfg.pdtype), out_sharding=("embed",))
    self.eps = cfg.norm_eps
    self.dtype = cfg.dtype

  def __call__(self, x: jax.Array) -> jax.Array:  # x: [..., d]
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding at explicit position ids (half-split rotation), computed in fp32.

  x: [B, S, H, D]; positions: [B, S] int (any values: original indices of visible tokens, positions
  that restart at each packed document, the masked positions a predictor query stands for).
  """
  d = x.shape[-1]
  freqs = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [D/2]
  angles = positions.astype(jnp.float32)[..., None] * freqs  # [B, S, D/2]
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]  # [B, S, 1, D/2]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # 2 x [B, S, H, D/2]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttnMask:
  """An attention mask as the boolean [B, Sq, Sk] array *and* the ids it was built from.

  XLA's attention reads `dense`; the splash kernel (models/splash.py) reads `splash_ids()`. Under
  jit the one a step does not use is dead code. `np.asarray(mask)` gives `dense`.
  """

  dense: jax.Array  # [B, Sq, Sk] bool
  seg_q: jax.Array  # [B, Sq] int, 0 = padding
  seg_k: jax.Array  # [B, Sk] int, 0 = padding
  view_q: jax.Array | None = None  # [B, Sq] in {0, 1} (in-place CMS) or None
  view_k: jax.Array | None = None  # [B, Sk]
  same_view: bool = dataclasses.field(default=True, metadata={"static": True})

  def __array__(self, dtype=None, copy=None):
    return np.asarray(self.dense, dtype=dtype)

  def splash_ids(self) -> tuple[jax.Array, jax.Array]:
    """(q_ids [B, Sq], kv_ids [B, Sk]) int32 with q_ids[i] == kv_ids[j] iff dense[i, j].

    Padding keys get splash.PAD_KV (-1; query ids are >= 0). With views (0/1, as
    masking.cms_split makes them), id = 2 * segment + view; a query of the predictor
    (`same_view=False`) carries the view it may read, 1 - its own.
    """
    seg_q, seg_k = self.seg_q.astype(jnp.int32), self.seg_k.astype(jnp.int32)
    if self.view_q is not None:
      view_q, view_k = self.view_q.astype(jnp.int32), self.view_k.astype(jnp.int32)
      seg_q = 2 * seg_q + (view_q if self.same_view else 1 - view_q)
      seg_k = 2 * seg_k + view_k
    return seg_q, jnp.where(self.seg_k != 0, seg_k, splash.PAD_KV)


def attention_mask(
  seg_q: jax.Array,
  seg_k: jax.Array,
  view_q: jax.Array | None = None,
  view_k: jax.Array | None = None,
  *,
  same_view: bool = True,
) -> AttnMask:
  """Query i may attend key j: an AttnMask whose `dense` is the boolean [B, Sq, Sk].

  Keys must be real tokens (segment id != 0) of the same packed document as the query. With view ids
  (complementary masking in place), keys must also be in the same view (`same_view=True`, the
  encoder) or in the other view (`same_view=False`, the predictor).
  """
  m = (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_k[:, None, :] != 0)
  if view_q is not None:
    same = view_q[:, :, None] == view_k[:, None, :]
    m = m & (same if same_view else ~same)
  return AttnMask(m, seg_q, seg_k, view_q, view_k, same_view)


def attention_implementation(impl: str, dtype) -> str | None:
  """`implementation=` for jax.nn.dot_product_attention (not called for `splash`).

  "auto" is XLA's on every backend for now: our masks (packed documents, CMS views) are arbitrary
  boolean [Sq, Sk] masks, and cuDNN's fused kernel (`cudnn`, opt-in, 16-bit inputs on NVIDIA GPUs
  only) has not been verified with them on a GPU in this project yet. `splash` (TPU, opt-in) is
  Pallas's splash kernel, models/splash.py.
  """
  if impl == "auto":
    return "xla"
  if impl == "cudnn" and (jax.default_backend() != "gpu" or jnp.dtype(dtype).itemsize != 2):
    raise ValueError(
      "model.attention_impl=cudnn needs an NVIDIA GPU and compute_dtype "
      f"bfloat16/float16 (backend {jax.default_backend()}, dtype {jnp.dtype(dtype)})"
    )
  return impl


class Attention(nnx.Module):
  """Multi-head attention; self-attention when x_kv is x_q, cross-attention otherwise."""

  def __init__(
    self,
    d_q: int,
    d_kv: int,
    num_heads: int,
    head_dim: int,
    cfg: ModelConfig,
    out_divisor: float,
    rngs: nnx.Rngs,
  ):
    std, pd = cfg.std(), cfg.pdtype
    self.wq = param(rngs, (d_q, num_heads, head_dim), ("embed", "heads", "kv"), std, pd)
    self.wk = param(rngs, (d_kv, num_heads, head_dim), ("embed", "heads", "kv"), std, pd)
    self.wv = param(rngs, (d_kv, num_heads, head_dim), ("embed", "heads", "kv"), std, pd)
    out_std = (num_heads * head_dim) ** -0.5 * cfg.init_scale / out_divisor
    self.wo = param(rngs, (num_heads, head_dim, d_q), ("heads", "kv", "embed"), out_std, pd)
    self.theta = cfg.rope_theta
    self.dtype = cfg.dtype
    self.impl = cfg.attention_impl
    self.fused = cfg.fused_projections

  def __call__(
    self,
    x_q: jax.Array,
    pos_q: jax.Array,
    x_kv: jax.Array,
    pos_kv: jax.Array,
    mask: "AttnMask | jax.Array",
  ) -> jax.Array:
    """x_q: [B, Sq, d_q]; x_kv: [B, Sk, d_kv]; pos_*: [B, S*]; mask: an AttnMask, or a plain
    [B, Sq, Sk] bool (always XLA's attention: splash needs the ids) -> [B, Sq, d_q]."""
    dt, names = self.dtype, ("batch", "seq", "heads", "kv")

    def project(x, *ws):  # [B, S, d] x n [d, H, D] -> n [B, S, H, D], as one [d, n H D] matmul
      flat = [w[...].astype(dt).reshape(w.shape[0], -1) for w in ws]  # n [d, H D]
      w = flat[0] if len(ws) == 1 else jnp.concatenate(flat, axis=1)  # [d, n H D]
      out = dense(x, w).reshape(x.shape[:2] + (len(ws),) + ws[0].shape[1:])  # [B, S, n, H, D]
      return [constrain(out[:, :, i], names) for i in range(len(ws))]

    if not self.fused:  # three matmuls
      (q,), (k,), (v,) = project(x_q, self.wq), project(x_kv, self.wk), project(x_kv, self.wv)
    elif x_q is x_kv:  # self-attention: one [d, 3HD] matmul
      q, k, v = project(x_q, self.wq, self.wk, self.wv)
    else:  # cross-attention: q from the queries, k and v from the keys in one [d, 2HD] matmul
      (q,), (k, v) = project(x_q, self.wq), project(x_kv, self.wk, self.wv)
    q, k = apply_rope(q, pos_q, self.theta), apply_rope(k, pos_kv, self.theta)
    # Logits and softmax in fp32 inside. A query with no allowed key (padding; a CMS query whose
    # document has no token in the other half) would get a uniform softmax over *all* keys, leaking
    # across documents and halves: its output is zeroed instead.
    if self.impl == "splash" and isinstance(mask, AttnMask):
      ids_q, ids_k = mask.splash_ids()  # [B, Sq], [B, Sk]
      o = splash.attention(q, k, v, ids_q, ids_k)  # [B, Sq, H, D]
      has_key = jnp.any(ids_q[:, :, None] == ids_k[:, None, :], axis=-1)  # [B, Sq]
    else:
      allowed = mask.dense if isinstance(mask, AttnMask) else mask  # [B, Sq, Sk] bool
      impl = attention_implementation("xla" if self.impl == "splash" else self.impl, q.dtype)
      o = jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None, :, :], implementation=impl)
      has_key = jnp.any(allowed, axis=-1)  # [B, Sq]
    o = constrain(o * has_key[:, :, None, None].astype(o.dtype), names)
    b, sq = o.shape[:2]
    return dense(o.reshape(b, sq, -1), self.wo[...].astype(dt).reshape(-1, self.wo.shape[-1]))


class SwiGLU(nnx.Module):
  """w2(silu(w1 x) * w3 x)."""

  def __init__(self, d: int, hidden: int, cfg: ModelConfig, out_divisor: float, rngs: nnx.Rngs):
    std, pd = cfg.std(), cfg.pdtype
    self.w1 = param(rngs, (d, hidden), ("embed", "mlp"), std, pd)
    self.w3 = param(rngs, (d, hidden), ("embed", "mlp"), std, pd)
    self.w2 = param(
      rngs, (hidden, d), ("mlp", "embed"), hidden**-0.5 * cfg.init_scale / out_divisor, pd
    )
    self.dtype = cfg.dtype
    self.fused = cfg.fused_projections

  def __call__(self, x: jax.Array) -> jax.Array:  # x: [B, S, d]
    dt = self.dtype
    w1, w3 = self.w1[...].astype(dt), self.w3[...].astype(dt)  # [d, F] each
    if self.fused:  # gate and up as one [d, 2F] matmul
      gate, up = jnp.split(dense(x, jnp.concatenate([w1, w3], axis=1)), 2, axis=-1)
    else:
      gate, up = dense(x, w1), dense(x, w3)  # [B, S, F] each
    h = jax.nn.silu(gate) * up  # [B, S, F]
    h = constrain(h, ("batch", "seq", "mlp"))
    return dense(h, self.w2[...].astype(dt))


class Block(nnx.Module):
  """Pre-norm transformer block: x + SelfAttn(norm(x)), then x + SwiGLU(norm(x))."""

  def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
    div = cfg.out_divisor(layer, cfg.num_layers)
    d = cfg.d_model
    self.attn_norm = RMSNorm(d, cfg)
    self.attn = Attention(d, d, cfg.num_heads, cfg.head_size, cfg, div, rngs)
    self.ffn_norm = RMSNorm(d, cfg)
    self.ffn = SwiGLU(d, cfg.ffn_size, cfg, div, rngs)

  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
    h = self.attn_norm(x)  # [B, S, d]
    x = constrain(x + self.attn(h, positions, h, positions, mask), ("batch", "seq", "embed"))
    return constrain(x + self.ffn(self.ffn_norm(x)), ("batch", "seq", "embed"))


class CrossBlock(nnx.Module):
  """Predictor block: x + CrossAttn(norm(x), enc), then x + SwiGLU(norm(x)).

  Keys/values are the encoder's final normalised output, used as is. With `predictor_self_attn`
  a self-attention sub-layer among the queries comes first (an ablation; SPEC's default is off).
  """

  def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
    div = cfg.out_divisor(layer, cfg.predictor_layers)
    d, h, hd = cfg.pred_d, cfg.pred_heads, cfg.pred_head_size
    if cfg.predictor_self_attn:
      self.self_norm = RMSNorm(d, cfg)
      self.self_attn = Attention(d, d, h, hd, cfg, div, rngs)
    self.use_self = cfg.predictor_self_attn
    self.cross_norm = RMSNorm(d, cfg)
    self.cross = Attention(
      d, d, h, hd, cfg, div, rngs
    )  # kv is projected to d first if widths differ
    self.ffn_norm = RMSNorm(d, cfg)
    self.ffn = SwiGLU(d, cfg.pred_ffn_size, cfg, div, rngs)

  def __call__(
    self,
    x: jax.Array,
    pos_q: jax.Array,
    kv: jax.Array,
    pos_kv: jax.Array,
    cross_mask: jax.Array,
    self_mask: jax.Array | None,
  ) -> jax.Array:
    """x: [B, Q, d_pred] queries; kv: [B, S, d_pred]; cross_mask: [B, Q, S]; self_mask: [B, Q, Q]."""
    names = ("batch", "seq", "embed")
    if self.use_self:
      h = self.self_norm(x)
      x = constrain(x + self.self_attn(h, pos_q, h, pos_q, self_mask), names)
    x = constrain(x + self.cross(self.cross_norm(x), pos_q, kv, pos_kv, cross_mask), names)
    return constrain(x + self.ffn(self.ffn_norm(x)), names)


class Embedding(nnx.Module):
  """Token embedding table [V, d], gathered from a replicated view (an FSDP-style all-gather)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.table = param(
      rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.std(), cfg.pdtype
    )
    self.dtype = cfg.dtype

  def __call__(self, tokens: jax.Array) -> jax.Array:  # [B, S] int -> [B, S, d]
    # Gathering straight from a sharded table makes XLA rematerialise it; replicate it first.
    table = constrain(self.table[...].astype(self.dtype), (None, None))
    return constrain(jnp.take(table, tokens, axis=0), ("batch", "seq", "embed"))


class VocabHead(nnx.Module):
  """Projection to vocabulary logits (fp32), applied only to the gathered target positions."""

  def __init__(self, d: int, cfg: ModelConfig, rngs: nnx.Rngs, tied: Embedding | None = None):
    self.tied = tied
    if tied is None:
      self.w = param(
        rngs, (d, cfg.vocab_size), ("embed", "vocab"), d**-0.5 * cfg.init_scale, cfg.pdtype
      )
    self.dtype = cfg.dtype

  def weight(self) -> jax.Array:
    """[d, V] in the compute dtype (the embedding table transposed when tied)."""
    w = self.tied.table[...].T if self.tied is not None else self.w[...]
    return w.astype(self.dtype)

  def __call__(self, h: jax.Array) -> jax.Array:  # h: [B, K, d] -> logits [B, K, V] fp32
    logits = dense(h, self.weight(), preferred_element_type=jnp.float32)  # [B, K, V]
    return constrain(logits, ("batch", "seq", "vocab"))
