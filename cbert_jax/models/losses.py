"""The masked-token objective shared by BERT and CrossBERT: weighted cross-entropy in fp32.

`masked_cross_entropy` takes logits; `chunked_cross_entropy` takes the head's input and weight
and never materialises all the logits at once (`model.ce_chunk`), for large vocabularies with
many targets (CrossBERT+CMS predicts every token).

Losses as sums: every model's `loss_sums(batch, rng)` returns (sums, coefs), sums =
{metric: (numerator, denominator)} over the batch (denominator None: a total, e.g. num_targets)
and coefs = {metric: coefficient} naming the loss terms; `finish` turns them into (loss, metrics)
with metric = numerator / max(denominator, 1) and loss = sum of coef * metric. Sums add over
micro-batches, so the train step's gradient accumulation can normalise by the global
denominators and report exactly the full batch's loss and metrics (steps.py).
"""

import functools
import operator

import jax
import jax.numpy as jnp
import optax

from cbert_jax.models.dense import dense

CE_LOSS = {"loss": 1.0}  # the masked-token models' loss: the mean CE, metric "loss"


def finish(sums: dict, coefs: dict):
  """(sums, coefs) of a model's `loss_sums` -> (loss, metrics).

  metrics[name] = numerator / max(denominator, 1) (a denominator of None: the numerator as is);
  loss = sum of coefs[name] * metrics[name], also reported as metrics["loss"].
  """
  metrics = {
    name: num if den is None else num / jnp.maximum(den, 1.0) for name, (num, den) in sums.items()
  }
  loss = combine(metrics, coefs)
  return loss, dict(metrics, loss=loss)


def combine(values: dict, coefs: dict) -> jax.Array:
  """sum of coefs[name] * values[name] (a coefficient of 1 multiplies nothing)."""
  terms = [values[name] if c == 1 else c * values[name] for name, c in coefs.items()]
  return functools.reduce(operator.add, terms)


def ce_sums(ce_sum: jax.Array, hit_sum: jax.Array, n: jax.Array) -> dict:
  """The masked-token metrics' sums: loss (mean CE) and masked_acc over n targets, num_targets."""
  return {"loss": (ce_sum, n), "masked_acc": (hit_sum, n), "num_targets": (n, None)}


def masked_cross_entropy_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> dict:
  """`masked_cross_entropy` as sums (see `finish`)."""
  # Accuracy is "the target has the largest logit": a max-reduction XLA shares with the softmax's,
  # cheaper than an argmax pass over [B, K, V] (ties, measure zero for float logits, count).
  ce, hit = _ce_and_hits(logits.astype(jnp.float32), targets)  # [B, K] each
  w = weights.astype(jnp.float32)
  return ce_sums((ce * w).sum(), (hit * w).sum(), w.sum())


def masked_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean CE over targets with weight 1 (padding/special targets carry weight 0).

  logits: [B, K, V] fp32; targets: [B, K] int; weights: [B, K] float.
  Returns (loss, {"loss", "masked_acc", "num_targets"}).
  """
  return finish(masked_cross_entropy_sums(logits, targets, weights), CE_LOSS)


def _ce_and_hits(logits: jax.Array, targets: jax.Array):
  """Per-target CE [..] and "target has the largest logit" [..] from fp32 logits [.., V]."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  hit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] >= logits.max(axis=-1)
  return ce, hit


def chunked_cross_entropy(
  h: jax.Array, w: jax.Array, targets: jax.Array, weights: jax.Array, chunk: int
):
  """`masked_cross_entropy(h @ w, ...)`, computed `chunk` target positions at a time.

  See `chunked_cross_entropy_sums`."""
  return finish(chunked_cross_entropy_sums(h, w, targets, weights, chunk), CE_LOSS)


def chunked_cross_entropy_sums(
  h: jax.Array, w: jax.Array, targets: jax.Array, weights: jax.Array, chunk: int
) -> dict:
  """`masked_cross_entropy_sums(h @ w, ...)`, computed `chunk` target positions at a time.

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
    hc, tc, wc = xs  # [B, c, d], [B, c], [B, c]
    ce, hit = _ce_and_hits(dense(hc, w, preferred_element_type=jnp.float32), tc)  # [B, c]
    return (carry[0] + (ce * wc).sum(), carry[1] + (hit * wc).sum()), None

  zero = jnp.zeros((), jnp.float32)
  (ce_sum, hit_sum), _ = jax.lax.scan(body, (zero, zero), (split(h), split(targets), split(wts)))
  return ce_sums(ce_sum, hit_sum, wts.sum())


def head_loss_sums(head, out: dict, chunk: int) -> dict:
  """The masked-token loss of a model's `forward` output as sums (see `finish`; its loss terms
  are `CE_LOSS`): from its logits, or (chunk > 0) from its head input `out["head_in"]` through
  `chunked_cross_entropy_sums` with `head.weight()`. Under jit the unused branch's logits are
  dead code and never computed."""
  if chunk > 0:
    return chunked_cross_entropy_sums(
      out["head_in"], head.weight(), out["targets"], out["weights"], chunk
    )
  return masked_cross_entropy_sums(out["logits"], out["targets"], out["weights"])


def head_loss(head, out: dict, chunk: int):
  """(loss, metrics) of `head_loss_sums`."""
  return finish(head_loss_sums(head, out, chunk), CE_LOSS)
