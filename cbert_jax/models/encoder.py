"""The flat bidirectional encoder stack shared by BERT and CrossBERT (and the probes' feature path)."""

import jax
import jax.numpy as jnp
from flax import nnx

from cbert_jax.models import layers
from cbert_jax.models.model_config import ModelConfig


class Encoder(nnx.Module):
  """Token embedding -> L pre-norm blocks -> final RMSNorm."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg_remat = cfg.remat
    self.embed = layers.Embedding(cfg, rngs)
    self.blocks = nnx.List([layers.Block(cfg, i, rngs) for i in range(cfg.num_layers)])
    self.norm = layers.RMSNorm(cfg.d_model, cfg)

  def __call__(
    self, tokens: jax.Array, positions: jax.Array, mask: jax.Array, return_hidden: bool = False
  ):
    """tokens, positions: [B, S] int; mask: [B, S, S] bool.

    Returns the final normalised output [B, S, d]; with `return_hidden`, also every layer's
    residual stream stacked as [L + 1, B, S, d] (index 0 = embeddings, l = after block l).
    """
    x = self.embed(tokens)  # [B, S, d]
    hidden = [x]
    run = remat_block(self.cfg_remat)
    for block in self.blocks:
      x = run(block, x, positions, mask)
      hidden.append(x)
    out = self.norm(x)
    return (out, jnp.stack(hidden)) if return_hidden else out


REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def remat_block(remat: str):
  """block(*args) as is (remat "none") or under `nnx.remat` with the named policy: "full" keeps
  only each block's inputs, "dots" also keeps the matmul outputs (no batch dims). Used for the
  encoder's blocks, CrossBERT's predictor blocks and ELECTRA's generator blocks."""

  def run(block, *args):
    return block(*args)

  if remat == "none":
    return run
  if remat not in REMAT_POLICIES:
    raise ValueError(f"model.remat must be none|full|dots, got {remat!r}")
  return nnx.remat(run, policy=REMAT_POLICIES[remat])


def features(encoder: Encoder, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array):
  """The feature path for probes: the encoder on full, unmasked input.

  Returns {"final": [B, S, d] (normalised last layer), "hidden": [L + 1, B, S, d]}.
  """
  mask = layers.attention_mask(segment_ids, segment_ids)
  final, hidden = encoder(tokens, positions, mask, return_hidden=True)
  return {"final": final, "hidden": hidden}
