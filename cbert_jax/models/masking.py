"""Masking on device, inside the train step, from `fold_in(rng, step)`.

Randomness is per row: every random draw here takes a key `rng` and the rows' global indices
`row_ids` ([B] int, default arange(B)), and row b draws its noise from its own key
`fold_in(rng, row_ids[b])`. A row's mask is then a function of (rng, its index in the global
batch) only, not of the batch's shape: a micro-batch of rows (i, i + k, ...) with those row ids
gets exactly the masks those rows get in the full batch (gradient accumulation, steps.py).

Static shapes everywhere: every row gets exactly K = round(ratio * T) targets (the argsort-of-noise
trick of MAE), so one compiled step serves the whole run. Padding (segment id 0) and special tokens
are pushed to the end of the noise order, so they are never targets while a row has K real tokens
to offer; if a row has fewer (the last, padded row of a corpus), the extra targets get weight 0.
"""

import jax
import jax.numpy as jnp
import numpy as np

from cbert_jax.models.model_config import num_masked  # noqa: F401  (masking.num_masked)


def maskable(tokens: jax.Array, segment_ids: jax.Array, special_ids: tuple[int, ...]) -> jax.Array:
  """[B, T] bool: real (non-padding), non-special tokens: the only ones that may be targets."""
  special = jnp.isin(tokens, jnp.asarray(special_ids, dtype=tokens.dtype))
  return (segment_ids != 0) & ~special


def row_keys(rng: jax.Array, num_rows: int, row_ids: jax.Array | None = None) -> jax.Array:
  """One key per row, [B]: fold_in(rng, row_ids[b]); row_ids defaults to arange(B)."""
  ids = jnp.arange(num_rows, dtype=jnp.int32) if row_ids is None else jnp.asarray(row_ids)
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, ids)


def per_row_uniform(rng: jax.Array, shape: tuple[int, ...], row_ids: jax.Array | None = None):
  """[B, ...] uniform [0, 1) noise whose row b is drawn from row b's own key (`row_keys`)."""
  keys = row_keys(rng, shape[0], row_ids)  # [B]
  return jax.vmap(lambda key: jax.random.uniform(key, shape[1:]))(keys)


def random_split(rng: jax.Array, can_mask: jax.Array, k: int, row_ids: jax.Array | None = None):
  """Choose K targets per row uniformly among maskable tokens (row b's noise from its own key).

  Returns (masked_idx [B, K], visible_idx [B, T - K]), each sorted ascending (original order).
  """
  noise = per_row_uniform(rng, can_mask.shape, row_ids)  # [B, T] in [0, 1)
  noise = jnp.where(can_mask, noise, 2.0)  # unmaskable sort last
  order = jnp.argsort(noise, axis=1)  # [B, T]
  return jnp.sort(order[:, :k], axis=1), jnp.sort(order[:, k:], axis=1)


def cms_split(rng: jax.Array, batch: int, seq_len: int, row_ids: jax.Array | None = None):
  """Complementary Masking: one random split of every row into halves A and B of T/2 tokens each
  (row b's split from its own key).

  Returns (idx_a [B, T/2], idx_b [B, T/2], view [B, T] int32: 0 for tokens of A, 1 for B).
  Every position is in exactly one half.
  """
  if seq_len % 2:
    raise ValueError(f"complementary masking needs an even seq_len, got {seq_len}")
  order = jnp.argsort(per_row_uniform(rng, (batch, seq_len), row_ids), axis=1)  # [B, T]
  half = seq_len // 2
  idx_a, idx_b = jnp.sort(order[:, :half], axis=1), jnp.sort(order[:, half:], axis=1)
  view = jnp.zeros((batch, seq_len), jnp.int32)
  view = view.at[jnp.arange(batch)[:, None], idx_b].set(1)
  return idx_a, idx_b, view


def bert_corrupt(
  rng: jax.Array,
  tokens: jax.Array,
  masked_idx: jax.Array,
  *,
  mask_id: int,
  vocab_size: int,
  special_ids: tuple[int, ...],
  p_mask: float = 0.8,
  p_random: float = 0.1,
  row_ids: jax.Array | None = None,
) -> jax.Array:
  """BERT's 80/10/10 corruption at the target positions: [MASK] / random token / unchanged.

  Random replacements are drawn uniformly from the non-special vocabulary; row b's draws come
  from its own key. Returns [B, T].
  """
  allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids))  # static, [V - |special|]
  kk = masked_idx.shape[1]

  def draw(key):  # one row: [K], [K]
    r_kind, r_tok = jax.random.split(key)
    return (jax.random.uniform(r_kind, (kk,)), jax.random.randint(r_tok, (kk,), 0, len(allowed)))

  u, tok_i = jax.vmap(draw)(row_keys(rng, tokens.shape[0], row_ids))  # [B, K] each
  rand_tok = jnp.asarray(allowed, tokens.dtype)[tok_i]  # [B, K]
  orig = jnp.take_along_axis(tokens, masked_idx, axis=1)  # [B, K]
  new = jnp.where(u < p_mask, mask_id, jnp.where(u < p_mask + p_random, rand_tok, orig))
  rows = jnp.arange(tokens.shape[0])[:, None]
  return jnp.asarray(tokens).at[rows, masked_idx].set(new.astype(tokens.dtype))


def mlm_corrupt(
  r_split: jax.Array,
  r_corrupt: jax.Array,
  tokens: jax.Array,
  segment_ids: jax.Array,
  mask_cfg,
  vocab_size: int,
  row_ids: jax.Array | None = None,
):
  """The masked-LM input of BERT and of ELECTRA's generator: K = round(ratio * T) targets per row
  among the maskable tokens, corrupted by `bert_corrupt` with `mask_cfg`'s p_mask / p_random
  (per-row keys from the rows' global indices `row_ids`, default arange(B)).

  Returns (corrupted [B, T], masked_idx [B, K], can_mask [B, T] bool).
  """
  can_mask = maskable(tokens, segment_ids, mask_cfg.special_ids)  # [B, T]
  k = num_masked(tokens.shape[1], mask_cfg.mask_ratio)
  masked_idx, _ = random_split(r_split, can_mask, k, row_ids)  # [B, K]
  corrupted = bert_corrupt(
    r_corrupt,
    tokens,
    masked_idx,
    mask_id=mask_cfg.mask_id,
    vocab_size=vocab_size,
    special_ids=mask_cfg.special_ids,
    p_mask=mask_cfg.p_mask,
    p_random=mask_cfg.p_random,
    row_ids=row_ids,
  )
  return corrupted, masked_idx, can_mask


def batch_row_ids(batch: dict) -> jax.Array | None:
  """The rows' indices in the global batch: `batch["row_ids"]` [B] (a micro-batch, set by the
  train step) or None (the batch is the global batch: arange(B))."""
  return batch.get("row_ids")


def gather(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x[b, idx[b, k], ...]: [B, T, ...] x [B, K] -> [B, K, ...]."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)
