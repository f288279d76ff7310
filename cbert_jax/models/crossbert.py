"""CrossBERT (SPEC §2-3): a deep encoder on visible tokens + a shallow cross-attention predictor.

The encoder never sees a mask token: it runs on the visible tokens only, at their original positions
(RoPE with the original indices). The predictor's queries are one shared learned mask vector per
target, placed by RoPE at the target's original index; they cross-attend to the encoder's final
normalised output (and, only in the `predictor_self_attn` ablation, to each other). The predictor is
discarded after pretraining: probes read `features`, the encoder alone on unmasked input.

Three training forms, selected by MaskConfig:
  * no CMS: K = round(r*T) targets, the encoder sees the other T - K tokens;
  * CMS, gather form: every row is split into halves A and B; the encoder runs on two rows of T/2
    (A and B, kept next to each other so a sequence's views stay on one device), the predictor of
    view A queries B's positions and vice versa;
  * CMS, in-place form: one row of T tokens; encoder attention only within a half, predictor query i
    only attends to the other half. Same loss and gradients as the gather form (tested); it costs
    twice the attention FLOPs, so it is the reference, gather the default.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from cbert_jax.models import layers, losses, masking
from cbert_jax.models.encoder import Encoder, features, remat_block
from cbert_jax.models.model_config import MaskConfig, ModelConfig


class Predictor(nnx.Module):
  """Cross-attention-only reconstruction head: mask queries -> CrossBlocks -> norm -> vocab head."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, tied: layers.Embedding | None):
    pd = cfg.pred_d
    self.mask_vec = layers.param(rngs, (pd,), ("embed",), cfg.std(), cfg.pdtype)
    # A predictor narrower than the encoder reads a projection of the encoder output (MAE-style).
    self.kv_proj = (
      layers.param(rngs, (cfg.d_model, pd), (None, "embed"), cfg.std(), cfg.pdtype)
      if pd != cfg.d_model
      else None
    )
    self.blocks = nnx.List([layers.CrossBlock(cfg, i, rngs) for i in range(cfg.predictor_layers)])
    # Learned absolute positions (an ablation): one table added to queries and keys; RoPE is then
    # switched off in the predictor (all positions 0 make it the identity).
    if cfg.predictor_positions not in ("rope", "learned"):
      raise ValueError(
        f"model.predictor_positions must be rope|learned, got {cfg.predictor_positions!r}"
      )
    self.pos_table = (
      layers.param(rngs, (cfg.max_positions, pd), (None, "embed"), cfg.std(), cfg.pdtype)
      if cfg.predictor_positions == "learned"
      else None
    )
    self.norm = layers.RMSNorm(pd, cfg)
    self.head = layers.VocabHead(pd, cfg, rngs, tied=tied)
    self.self_attn = cfg.predictor_self_attn
    self.dtype = cfg.dtype
    self.remat = cfg.remat

  def __call__(self, enc_out, enc_pos, enc_seg, q_pos, q_seg, enc_view=None, q_view=None):
    """enc_out: [B, S, d]; enc_pos/enc_seg: [B, S]; q_pos/q_seg: [B, Q] ->
    (logits [B, Q, V] fp32, the head's input [B, Q, d_pred]).

    With view ids ([B, S] and [B, Q], in-place CMS) a query only attends to keys of the other view.
    """
    b, q = q_pos.shape
    x = jnp.broadcast_to(self.mask_vec[...].astype(self.dtype), (b, q, self.mask_vec.shape[0]))
    x = layers.constrain(x, ("batch", "seq", "embed"))  # [B, Q, d_pred]
    kv = enc_out if self.kv_proj is None else enc_out @ self.kv_proj[...].astype(self.dtype)
    if self.pos_table is not None:
      table = self.pos_table[...].astype(self.dtype)  # [P, d_pred]
      x = x + jnp.take(table, q_pos, axis=0)  # [B, Q, d_pred]
      kv = kv + jnp.take(table, enc_pos, axis=0)  # [B, S, d_pred]
      q_pos, enc_pos = jnp.zeros_like(q_pos), jnp.zeros_like(enc_pos)  # RoPE off
    cross_mask = layers.attention_mask(q_seg, enc_seg, q_view, enc_view, same_view=False)
    self_mask = layers.attention_mask(q_seg, q_seg, q_view, q_view) if self.self_attn else None
    run = remat_block(self.remat)
    for block in self.blocks:
      x = run(block, x, q_pos, kv, enc_pos, cross_mask, self_mask)
    h = self.norm(x)  # [B, Q, d_pred]
    return self.head(h), h


def _views(x: jax.Array, idx: jax.Array) -> jax.Array:
  """Gather two complementary views and interleave them as rows: [B, T, ...] x [B, 2, H] -> [2B, H, ...]."""
  b, _, h = idx.shape
  return masking.gather(x, idx.reshape(b, 2 * h)).reshape((2 * b, h) + x.shape[2:])


class CrossBert(nnx.Module):
  """Encoder + predictor; `loss` trains both, `features` exposes the encoder alone."""

  def __init__(self, cfg: ModelConfig, mask_cfg: MaskConfig, rngs: nnx.Rngs):
    self.cfg, self.mask_cfg = cfg, mask_cfg
    self.encoder = Encoder(cfg, rngs)
    self.predictor = Predictor(cfg, rngs, tied=self.encoder.embed if cfg.tie_embeddings else None)

  def features(self, tokens, positions, segment_ids):
    """Unmasked input -> {"final": [B, T, d], "hidden": [L + 1, B, T, d]} (no predictor)."""
    return features(self.encoder, tokens, positions, segment_ids)

  def forward_encoder(self, tokens, positions, segment_ids, view=None):
    """Encoder on the tokens it may see ([B, S] each) -> [B, S, d]; view ids restrict to one half."""
    return self.encoder(
      tokens, positions, layers.attention_mask(segment_ids, segment_ids, view, view)
    )

  def loss(self, batch: dict, rng: jax.Array):
    """batch: tokens, positions, segment_ids [B, T] (optional row_ids [B], see masking).
    Returns (loss, metrics)."""
    return losses.finish(*self.loss_sums(batch, rng))

  def loss_sums(self, batch: dict, rng: jax.Array):
    """The loss as (sums, coefs) (see losses.finish): the mean CE over the targets."""
    return (
      losses.head_loss_sums(self.predictor.head, self.forward(batch, rng), self.cfg.ce_chunk),
      losses.CE_LOSS,
    )

  def forward(self, batch: dict, rng: jax.Array) -> dict:
    """Masking + encoder + predictor: {"logits" [R, Q, V], "targets" [R, Q], "weights" [R, Q],
    "query_idx" [R, Q] (original positions), "encoder_out", "head_in" [R, Q, d_pred]} with
    R = B (no CMS, in-place) or 2B
    (gather CMS: rows 2b, 2b+1 are the two views of sequence b)."""
    mc = self.mask_cfg
    tokens, pos, seg = batch["tokens"], batch["positions"], batch["segment_ids"]
    bsz, t = tokens.shape
    rows = masking.batch_row_ids(batch)  # [B] or None = arange(B)
    can_mask = masking.maskable(tokens, seg, mc.special_ids)  # [B, T]
    if not mc.cms:
      masked, visible = masking.random_split(
        rng, can_mask, masking.num_masked(t, mc.mask_ratio), rows
      )
      g = masking.gather
      enc = self.forward_encoder(
        g(tokens, visible), g(pos, visible), g(seg, visible)
      )  # [B, T-K, d]
      logits, head_in = self.predictor(
        enc, g(pos, visible), g(seg, visible), g(pos, masked), g(seg, masked)
      )
      targets, weights, q_idx = g(tokens, masked), g(can_mask, masked), masked  # [B, K]
    elif mc.cms_form == "gather":
      idx_a, idx_b, _ = masking.cms_split(rng, bsz, t, rows)  # [B, T/2] each
      enc_idx = jnp.stack([idx_a, idx_b], axis=1)  # [B, 2, T/2]: encoder sees
      q_idx = jnp.stack([idx_b, idx_a], axis=1)  # [B, 2, T/2]: ...predicts
      enc = self.forward_encoder(
        _views(tokens, enc_idx), _views(pos, enc_idx), _views(seg, enc_idx)
      )
      logits, head_in = self.predictor(
        enc, _views(pos, enc_idx), _views(seg, enc_idx), _views(pos, q_idx), _views(seg, q_idx)
      )  # [2B, T/2, V]
      targets, weights = _views(tokens, q_idx), _views(can_mask, q_idx)  # [2B, T/2]
      q_idx = q_idx.reshape(2 * bsz, t // 2)
    elif mc.cms_form == "inplace":
      _, _, view = masking.cms_split(rng, bsz, t, rows)  # [B, T] in {0, 1}
      enc = self.forward_encoder(tokens, pos, seg, view)  # [B, T, d]
      logits, head_in = self.predictor(
        enc, pos, seg, pos, seg, enc_view=view, q_view=view
      )  # [B, T, V]
      targets, weights = tokens, can_mask
      q_idx = jnp.broadcast_to(jnp.arange(t), (bsz, t))
    else:
      raise ValueError(f"masking.cms_form must be gather|inplace, got {mc.cms_form!r}")
    return {
      "logits": logits,
      "targets": targets,
      "weights": weights.astype(logits.dtype),
      "query_idx": q_idx,
      "encoder_out": enc,
      "head_in": head_in,
    }
