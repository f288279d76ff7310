"""Attention through JAX's Pallas splash kernel (TPU), masked by segment ids (`model.attention_impl
= splash`).

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) takes no dense mask at run time: a
query attends a key iff their int32 ids are equal (`SegmentIds`), AND-ed with a static mask (here
FullMask: everything). `layers.AttnMask.splash_ids` turns the model's masks into such ids: packed
documents (BERT, the CrossBERT encoder, the predictor's cross-attention from the masked queries to
the encoder's keys, gather-form CMS) and the in-place CMS views (the view folded into the id). This
module only runs the kernel on [B, S, H, D] inputs with those ids:

  * q is scaled by 1/sqrt(D) first (the kernel does not scale; jax.nn.dot_product_attention does);
  * each sequence is padded to a multiple of 128 (the kernel's lane width and smallest block):
    padded keys get the id PAD_KV, which no query has (ids are >= 0), padded queries PAD_Q, and
    both are cut off again;
  * the kernel is per example and heads-major ([H, S, D]): vmapped over the batch;
  * under a mesh (`jax.set_mesh`), it runs inside `jax.shard_map` with the batch split as the
    logical rules split "batch" and the heads as they split "heads": a Mosaic custom call is opaque
    to XLA's SPMD partitioner, which would otherwise gather whole operands onto every device.
    Sharding the sequence or the per-head width ("seq", "kv") is refused.

A query with no allowed key gets the kernel's uniform average over all keys (no NaN: the masked
logits are a large finite negative); `layers.Attention` zeroes such rows on both paths.

TPU only: lowering a Pallas TPU kernel for another platform fails. Tests run it on CPU through
Pallas's interpreter inside `interpret_mode()` (same kernel code, jnp semantics, slow).
"""

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

LANES = 128  # the kernel's blocks are multiples of this many tokens
PAD_KV = -1  # id of padded keys (and of padding keys in layers.AttnMask.splash_ids): no query's
PAD_Q = -2  # id of padded queries (cut off again)
_INTERPRET = [False]


@contextlib.contextmanager
def interpret_mode(on: bool = True):
  """Trace the kernel for Pallas's interpreter (CPU tests) while inside this context."""
  before, _INTERPRET[0] = _INTERPRET[0], on
  try:
    yield
  finally:
    _INTERPRET[0] = before


def _pallas_splash():
  """jax's splash attention package, imported on first use (Pallas' TPU ops are not light)."""
  from jax.experimental.pallas.ops.tpu import splash_attention

  return splash_attention


def _block(n: int) -> int:
  """The largest of 512, 256, 128 tokens dividing n (a multiple of 128)."""
  return next(b for b in (512, 256, 128) if n % b == 0)


def kernel(heads: int, sq: int, sk_len: int, interpret: bool):
  """The per-example multi-head SplashAttentionKernel for padded lengths sq x sk_len (multiples
  of 128), called as kernel(q, k, v, segment_ids=SegmentIds(q_ids, kv_ids)) on [H, S, D].

  Built anew at each trace, not cached: it holds its block tables as arrays, which are tracers of
  the trace that built them (the numpy work behind them is cached by the mask module)."""
  spl = _pallas_splash()
  bq, bkv = _block(sq), _block(sk_len)
  blocks = spl.BlockSizes(
    block_q=bq,
    block_kv=bkv,
    block_kv_compute=bkv,
    block_q_dkv=bq,
    block_kv_dkv=bkv,
    block_kv_dkv_compute=bkv,
    block_q_dq=bq,
    block_kv_dq=bkv,
  )
  mask = spl.MultiHeadMask([spl.FullMask((sq, sk_len))] * heads)
  return spl.make_splash_mha(
    mask, head_shards=1, q_seq_shards=1, block_sizes=blocks, interpret=interpret
  )


def _pad(x: jax.Array, n: int, value) -> jax.Array:
  """Pad axis 1 of x up to n with `value`."""
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, n - x.shape[1])
  return jnp.pad(x, widths, constant_values=value)


def _local(q, k, v, q_ids, kv_ids, interpret: bool):
  """The kernel on one device's share: q [B, Sq, H, D], k/v [B, Sk, H, D], ids [B, S*]."""
  (_, sq, h, d), sk_len = q.shape, k.shape[1]
  pq, pk = -(-sq // LANES) * LANES, -(-sk_len // LANES) * LANES
  scale = jnp.asarray(d**-0.5, jnp.float32)
  q = (q.astype(jnp.float32) * scale).astype(q.dtype)

  def heads_major(x, n):  # [B, S, H, D] -> [B, H, n, D]
    return jnp.swapaxes(_pad(x, n, 0), 1, 2)

  run = kernel(h, pq, pk, interpret)
  segment_ids = _pallas_splash().SegmentIds

  def one(q, k, v, iq, ik):  # one example
    return run(q, k, v, segment_ids=segment_ids(q=iq, kv=ik))

  o = jax.vmap(one)(
    heads_major(q, pq),
    heads_major(k, pk),
    heads_major(v, pk),
    _pad(q_ids.astype(jnp.int32), pq, PAD_Q),
    _pad(kv_ids.astype(jnp.int32), pk, PAD_KV),
  )  # [B, H, pq, D]
  return jnp.swapaxes(o, 1, 2)[:, :sq]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_ids: jax.Array, kv_ids: jax.Array):
  """Softmax(q k^T / sqrt(D)) v where q_ids[b, i] == kv_ids[b, j], through the splash kernel.

  q: [B, Sq, H, D]; k, v: [B, Sk, H, D]; q_ids: [B, Sq], kv_ids: [B, Sk] int (query ids >= 0 and
  key ids >= -1; -1 = a key no query may see) -> [B, Sq, H, D] in q's dtype.
  """
  interpret = _INTERPRET[0]
  body = functools.partial(_local, interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return body(q, k, v, q_ids, kv_ids)
  batch, seq, heads, width = nn.logical_to_mesh_axes(("batch", "seq", "heads", "kv"))
  if seq is not None or width is not None:
    raise ValueError(
      "model.attention_impl=splash shards attention over batch and heads only; the sharding "
      f"rules split seq over {seq!r} / kv over {width!r}"
    )
  for axes, size, what in ((batch, q.shape[0], "batch"), (heads, q.shape[2], "heads")):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    shards = 1
    for a in names:
      shards *= mesh.shape[a]
    if size % shards:
      raise ValueError(
        f"model.attention_impl=splash: {what} {size} does not split evenly over mesh axes "
        f"{names} ({shards} shards)"
      )
  qkv, ids = P(batch, None, heads, None), P(batch, None)
  return jax.shard_map(body, in_specs=(qkv, qkv, qkv, ids, ids), out_specs=qkv, check_vma=False)(
    q, k, v, q_ids, kv_ids
  )
