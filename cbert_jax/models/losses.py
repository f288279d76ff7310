"""The masked-token objective shared by BERT and CrossBERT: weighted cross-entropy in fp32."""
import jax
import jax.numpy as jnp
import optax


def masked_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array):
  """Mean CE over targets with weight 1 (padding/special targets carry weight 0).

  logits: [B, K, V] fp32; targets: [B, K] int; weights: [B, K] float.
  Returns (loss, {"loss", "masked_acc", "num_targets"}).
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)  # [B, K]
  n = jnp.maximum(weights.sum(), 1.0)
  loss = (ce * weights).sum() / n
  # "The target has the largest logit": a max-reduction XLA shares with the softmax's, cheaper
  # than an argmax pass over [B, K, V] (ties, measure zero for float logits, count as correct).
  logits = logits.astype(jnp.float32)
  hit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] >= logits.max(axis=-1)
  acc = (hit * weights).sum() / n
  return loss, {"loss": loss, "masked_acc": acc, "num_targets": weights.sum()}
