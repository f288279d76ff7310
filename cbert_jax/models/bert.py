"""BERT baseline (SPEC §2): one flat encoder over all tokens, 80/10/10 corruption, head on targets only."""

import jax
from flax import nnx

from cbert_jax.models import layers, losses, masking
from cbert_jax.models.encoder import Encoder, features
from cbert_jax.models.model_config import MaskConfig, ModelConfig


class Bert(nnx.Module):
  """Masked-language-model encoder; `loss` is the training objective, `features` the probe path."""

  def __init__(self, cfg: ModelConfig, mask_cfg: MaskConfig, rngs: nnx.Rngs):
    self.cfg, self.mask_cfg = cfg, mask_cfg
    self.encoder = Encoder(cfg, rngs)
    self.head = layers.VocabHead(
      cfg.d_model, cfg, rngs, tied=self.encoder.embed if cfg.tie_embeddings else None
    )

  def features(self, tokens, positions, segment_ids):
    """Unmasked input -> {"final": [B, T, d], "hidden": [L + 1, B, T, d]}."""
    return features(self.encoder, tokens, positions, segment_ids)

  def loss(self, batch: dict, rng: jax.Array):
    """batch: tokens, positions, segment_ids [B, T] (optional row_ids [B], see masking).
    Returns (loss, metrics)."""
    return losses.finish(*self.loss_sums(batch, rng))

  def loss_sums(self, batch: dict, rng: jax.Array):
    """The loss as (sums, coefs) (see losses.finish): the mean CE over the targets."""
    return losses.head_loss_sums(
      self.head, self.forward(batch, rng), self.cfg.ce_chunk
    ), losses.CE_LOSS

  def forward(self, batch: dict, rng: jax.Array) -> dict:
    """Masking + encoder + head: {"logits" [B, K, V], "targets" [B, K], "weights" [B, K],
    "masked_idx" [B, K], "encoder_out" [B, T, d], "head_in" [B, K, d]}."""
    tokens, positions, seg = batch["tokens"], batch["positions"], batch["segment_ids"]
    r_split, r_corrupt = jax.random.split(rng)
    corrupted, masked_idx, can_mask = masking.mlm_corrupt(
      r_split,
      r_corrupt,
      tokens,
      seg,
      self.mask_cfg,
      self.cfg.vocab_size,
      masking.batch_row_ids(batch),
    )  # [B, T], [B, K], [B, T]
    out = self.encoder(corrupted, positions, layers.attention_mask(seg, seg))  # [B, T, d]
    head_in = layers.constrain(
      masking.gather(out, masked_idx), ("batch", "seq", "embed")
    )  # [B, K, d]
    logits = self.head(head_in)  # [B, K, V]
    targets = masking.gather(tokens, masked_idx)  # [B, K]
    weights = masking.gather(can_mask, masked_idx).astype(logits.dtype)  # [B, K]
    return {
      "logits": logits,
      "targets": targets,
      "weights": weights,
      "masked_idx": masked_idx,
      "encoder_out": out,
      "head_in": head_in,
    }
