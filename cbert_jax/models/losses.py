"""The masked-token objective shared by BERT and CrossBERT: weighted cross-entropy in fp32.

`masked_cross_entropy` takes logits; `chunked_cross_entropy` takes the head's input and weight
and never materialises all the logits at once (`model.ce_chunk`), for large vocabularies with
many targets (CrossBERT+CMS predicts every token).
"""
import jax
import jax.numpy as jnp
import optax

from cbert_jax.models.dense import dense


def masked_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean CE over targets with weight 1 (padding/special targets carry weight 0).

  logits: [B, K, V] fp32; targets: [B, K] int; weights: [B, K] float.
  Returns (loss, {"loss", "masked_acc", "num_targets"}).
  """
  # Accuracy is "the target has the largest logit": a max-reduction XLA shares with the softmax's,
  # cheaper than an argmax pass over [B, K, V] (ties, measure zero for float logits, count).
  ce, hit = _ce_and_hits(logits.astype(jnp.float32), targets)               # [B, K] each
  n = jnp.maximum(weights.sum(), 1.0)
  loss = (ce * weights).sum() / n
  acc = (hit * weights).sum() / n
  return loss, {"loss": loss, "masked_acc": acc, "num_targets": weights.sum()}


def _ce_and_hits(logits: jax.Array, targets: jax.Array):
  """Per-target CE [..] and "target has the largest logit" [..] from fp32 logits [.., V]."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  hit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] >= logits.max(axis=-1)
  return ce, hit


def chunked_cross_entropy(h: jax.Array, w: jax.Array, targets: jax.Array, weights: jax.Array,
                          chunk: int):
  """`masked_cross_entropy(h @ w, ...)`, computed `chunk` target positions at a time.

  h: [B, K, d] head input; w: [d, V]; targets: [B, K] int; weights: [B, K]. The K axis is cut
  into chunks (padded with weight-0 positions) and scanned under `jax.checkpoint`, so only one
  [B, chunk, V] slice of logits exists at a time, in the forward and the backward pass; the batch
  axis is untouched, so a data-parallel sharding stays as it is. Same loss, accuracy and
  gradients as the unchunked form (tested); more FLOPs (the backward recomputes the logits).
  """
  b, k, d = h.shape
  n_chunks = -(-k // chunk)
  pad = n_chunks * chunk - k
  if pad:
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    weights = jnp.pad(weights, ((0, 0), (0, pad)))
  # [n_chunks, B, chunk, ...]: the scan axis first, the batch axis kept whole.
  split = lambda x: jnp.moveaxis(x.reshape((b, n_chunks, chunk) + x.shape[2:]), 1, 0)
  wts = weights.astype(jnp.float32)

  @jax.checkpoint
  def body(carry, xs):
    hc, tc, wc = xs                                                         # [B, c, d], [B, c], [B, c]
    ce, hit = _ce_and_hits(dense(hc, w, preferred_element_type=jnp.float32), tc)  # [B, c]
    return (carry[0] + (ce * wc).sum(), carry[1] + (hit * wc).sum()), None

  zero = jnp.zeros((), jnp.float32)
  (ce_sum, hit_sum), _ = jax.lax.scan(body, (zero, zero), (split(h), split(targets), split(wts)))
  n = jnp.maximum(wts.sum(), 1.0)
  loss = ce_sum / n
  return loss, {"loss": loss, "masked_acc": hit_sum / n, "num_targets": wts.sum()}


def head_loss(head, out: dict, chunk: int):
  """The masked-token loss of a model's `forward` output: from its logits, or (chunk > 0) from
  its head input `out["head_in"]` through `chunked_cross_entropy` with `head.weight()`. Under jit
  the unused branch's logits are dead code and never computed."""
  if chunk > 0:
    return chunked_cross_entropy(out["head_in"], head.weight(), out["targets"], out["weights"],
                                 chunk)
  return masked_cross_entropy(out["logits"], out["targets"], out["weights"])
