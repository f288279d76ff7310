"""ELECTRA (Clark et al., 2020), the paper's second baseline: replaced-token detection on a flat encoder.

A small MLM *generator* fills the masked positions with samples from its own predictions; the
*discriminator* (the same encoder stack as BERT, and the one probes and the pooler evaluate) reads
the corrupted row and classifies every real token as original or replaced.

  loss = MLM(generator, masked positions) + disc_weight * BCE(discriminator, every real token)

Choices (ModelConfig fields):
  * generator width = `generator_width` x d_model (rounded to whole heads of the encoder's head
    size), depth = `generator_depth` x num_layers (at least 1); ELECTRA used 1/4 to 1/3 width at
    full depth;
  * `generator_shared_embeddings` (default on, as in ELECTRA): one token-embedding table [V, d] for
    both; a narrower generator reads it through a projection d -> d_gen and predicts through
    d_gen -> d and the transposed table (ELECTRA's tied generator head); off: the generator has its
    own table and an untied head;
  * sampling from the generator's softmax (temperature 1, special tokens excluded) happens inside
    the jitted step, on `stop_gradient(logits)`: the discriminator's loss never reaches the
    generator through the samples (ELECTRA's choice; the shared embedding table still receives both
    losses' gradients, as in ELECTRA);
  * a sample equal to the original token counts as *original* for the discriminator;
  * discriminator head: dense d -> d, GELU, dense d -> 1 (ELECTRA's), on the final normalised output.
The generator's input is the BERT corruption of `masking.p_mask` / `p_random` at `mask_ratio`
(ELECTRA: 15%) of the tokens.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cbert_jax.models import layers, losses, masking
from cbert_jax.models.encoder import Encoder, features, remat_block
from cbert_jax.models.model_config import (
  MaskConfig,
  ModelConfig,
  generator_config,  # noqa: F401  (electra.generator_config)
)


class Generator(nnx.Module):
  """The MLM generator: (shared or own) embedding -> blocks -> norm -> vocabulary logits."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, shared: layers.Embedding | None):
    g = generator_config(cfg)
    self.cfg = g
    self.shared = shared
    narrow = g.d_model != cfg.d_model
    std = cfg.std()
    if shared is None:
      self.embed = layers.Embedding(g, rngs)
      self.head = layers.VocabHead(g.d_model, g, rngs)
    else:  # ELECTRA: the discriminator's table, projected to the generator's width and back
      self.in_proj = (
        layers.param(rngs, (cfg.d_model, g.d_model), ("embed", None), std, cfg.pdtype)
        if narrow
        else None
      )
      self.out_proj = (
        layers.param(
          rngs,
          (g.d_model, cfg.d_model),
          (None, "embed"),
          g.d_model**-0.5 * cfg.init_scale,
          cfg.pdtype,
        )
        if narrow
        else None
      )
    self.blocks = nnx.List([layers.Block(g, i, rngs) for i in range(g.num_layers)])
    self.norm = layers.RMSNorm(g.d_model, g)
    self.dtype = cfg.dtype

  def __call__(self, tokens, positions, mask, masked_idx):
    """tokens, positions: [B, T]; mask: [B, T, T]; masked_idx: [B, K] -> logits [B, K, V] fp32."""
    dt = self.dtype
    if self.shared is None:
      x = self.embed(tokens)  # [B, T, d_gen]
    else:
      x = self.shared(tokens)  # [B, T, d]
      if self.in_proj is not None:
        x = x @ self.in_proj[...].astype(dt)  # [B, T, d_gen]
    run = remat_block(self.cfg.remat)
    for block in self.blocks:
      x = run(block, x, positions, mask)
    h = self.norm(masking.gather(x, masked_idx))  # [B, K, d_gen]
    if self.shared is None:
      return self.head(h)
    if self.out_proj is not None:
      h = h @ self.out_proj[...].astype(dt)  # [B, K, d]
    logits = jnp.einsum(
      "bkd,vd->bkv", h, self.shared.table[...].astype(dt), preferred_element_type=jnp.float32
    )
    return layers.constrain(logits, ("batch", "seq", "vocab"))


class DiscriminatorHead(nnx.Module):
  """ELECTRA's replaced-token head: dense d -> d, GELU, dense d -> 1 (a logit per token)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d = cfg.d_model
    self.w1 = layers.param(rngs, (d, d), ("embed", "mlp"), cfg.std(), cfg.pdtype)
    self.w2 = layers.param(rngs, (d,), ("embed",), d**-0.5 * cfg.init_scale, cfg.pdtype)
    self.dtype = cfg.dtype

  def __call__(self, h: jax.Array) -> jax.Array:  # h: [B, T, d] -> logits [B, T] fp32
    x = jax.nn.gelu(h @ self.w1[...].astype(self.dtype))
    return jnp.einsum(
      "btd,d->bt", x, self.w2[...].astype(self.dtype), preferred_element_type=jnp.float32
    )


def replace_and_label(
  tokens: jax.Array, masked_idx: jax.Array, samples: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Put the generator's samples at the masked positions; label what changed.

  tokens: [B, T]; masked_idx, samples: [B, K]; weights: [B, K] (0 = a padding/special slot that
  is not a real target: left unchanged). Returns (corrupted [B, T], replaced [B, T] bool), where
  a sample equal to the original token is *not* replaced.
  """
  orig = masking.gather(tokens, masked_idx)  # [B, K]
  new = jnp.where(weights > 0, samples.astype(tokens.dtype), orig)
  rows = jnp.arange(tokens.shape[0])[:, None]
  corrupted = tokens.at[rows, masked_idx].set(new)  # [B, T]
  return corrupted, corrupted != tokens


def sample_tokens(
  rng: jax.Array, logits: jax.Array, special_ids: tuple[int, ...], row_ids: jax.Array | None = None
) -> jax.Array:
  """One token per position of logits [B, K, V] from softmax(logits) (no gradient), specials
  excluded; row b samples with its own key (`masking.row_keys`, row_ids default arange(B))."""
  logits = jax.lax.stop_gradient(logits)
  banned = jnp.zeros(logits.shape[-1], bool).at[jnp.asarray(special_ids)].set(True)
  logits = jnp.where(banned, -jnp.inf, logits)  # [B, K, V]
  keys = masking.row_keys(rng, logits.shape[0], row_ids)  # [B]
  return jax.vmap(lambda key, lg: jax.random.categorical(key, lg, axis=-1))(keys, logits)  # [B, K]


class Electra(nnx.Module):
  """Generator + discriminator; `loss` trains both, `features` exposes the discriminator alone."""

  def __init__(self, cfg: ModelConfig, mask_cfg: MaskConfig, rngs: nnx.Rngs):
    self.cfg, self.mask_cfg = cfg, mask_cfg
    self.encoder = Encoder(cfg, rngs)  # the discriminator's stack
    self.disc_head = DiscriminatorHead(cfg, rngs)
    self.generator = Generator(
      cfg, rngs, shared=self.encoder.embed if cfg.generator_shared_embeddings else None
    )

  def features(self, tokens, positions, segment_ids):
    """Unmasked input -> {"final": [B, T, d], "hidden": [L + 1, B, T, d]} (the discriminator)."""
    return features(self.encoder, tokens, positions, segment_ids)

  def loss(self, batch: dict, rng: jax.Array):
    """batch: tokens, positions, segment_ids [B, T] (optional row_ids [B], see masking).
    Returns (loss, metrics)."""
    return losses.finish(*self.loss_sums(batch, rng))

  def loss_sums(self, batch: dict, rng: jax.Array):
    """The loss as (sums, coefs) (see losses.finish): gen_loss (mean CE over the generator's
    targets) + disc_weight x disc_loss (mean BCE over the real tokens), each over its own count."""
    out = self.forward(batch, rng)
    gen = losses.masked_cross_entropy_sums(out["gen_logits"], out["targets"], out["weights"])
    w = out["disc_weights"]  # [B, T]
    n = w.sum()
    bce = optax.sigmoid_binary_cross_entropy(
      out["disc_logits"], out["replaced"].astype(jnp.float32)
    )
    said_replaced = out["disc_logits"] > 0  # [B, T]
    # Recall on the replaced tokens: accuracy alone stays at 1 - replaced_frac while the
    # discriminator only knows the prior ("nothing is replaced").
    replaced_w = out["replaced"] * w  # [B, T]
    sums = {
      "gen_loss": gen["loss"],
      "masked_acc": gen["masked_acc"],
      "num_targets": gen["num_targets"],
      "disc_loss": ((bce * w).sum(), n),
      "disc_acc": (((said_replaced == out["replaced"]) * w).sum(), n),
      "disc_recall": ((said_replaced * replaced_w).sum(), replaced_w.sum()),
      "replaced_frac": (replaced_w.sum(), n),
    }
    return sums, {"gen_loss": 1.0, "disc_loss": self.cfg.disc_weight}

  def forward(self, batch: dict, rng: jax.Array) -> dict:
    """Masking, generator, sampling, discriminator: {"gen_logits" [B, K, V], "targets",
    "weights" [B, K], "masked_idx" [B, K], "samples" [B, K], "corrupted" [B, T],
    "replaced" [B, T] bool, "disc_logits" [B, T], "disc_weights" [B, T]}."""
    mc = self.mask_cfg
    tokens, positions, seg = batch["tokens"], batch["positions"], batch["segment_ids"]
    rows = masking.batch_row_ids(batch)  # [B] or None = arange(B)
    r_split, r_corrupt, r_sample = jax.random.split(rng, 3)
    gen_in, masked_idx, can_mask = masking.mlm_corrupt(
      r_split, r_corrupt, tokens, seg, mc, self.cfg.vocab_size, rows
    )  # [B, T], [B, K], [B, T]
    attn = layers.attention_mask(seg, seg)  # [B, T, T]
    gen_logits = self.generator(gen_in, positions, attn, masked_idx)  # [B, K, V]
    weights = masking.gather(can_mask, masked_idx).astype(jnp.float32)  # [B, K]
    samples = sample_tokens(r_sample, gen_logits, mc.special_ids, rows)  # [B, K]
    corrupted, replaced = replace_and_label(tokens, masked_idx, samples, weights)
    disc_logits = self.disc_head(self.encoder(corrupted, positions, attn))  # [B, T]
    return {
      "gen_logits": gen_logits,
      "targets": masking.gather(tokens, masked_idx),
      "weights": weights,
      "masked_idx": masked_idx,
      "samples": samples,
      "corrupted": corrupted,
      "replaced": replaced,
      "disc_logits": disc_logits,
      "disc_weights": (seg != 0).astype(jnp.float32),
    }
