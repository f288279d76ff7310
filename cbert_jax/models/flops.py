"""Parameter counts and training FLOPs per data token, next to the models they describe (SPEC §4).

Conventions (the x-axis of every scaling curve):
  * a matmul of an [m, k] by a [k, n] matrix costs 2mkn FLOPs; training = 3 x forward (the backward
    pass costs two matmuls per forward matmul); a weight applied to one token costs 2 FLOPs per
    parameter forward, 6 in training;
  * attention counts QK^T and AV only over the keys a query is *allowed* to see, as a flash-style
    kernel that skips nothing else would: 4 * S_k * d_attn FLOPs forward per query per layer, so
    `12 * L * S_k * d_attn` per query in training;
  * embedding gathers, norms, RoPE, softmax and the optimizer are not counted (they are O(d) per
    token, not O(d^2)); the test against XLA's cost analysis bounds what this leaves out;
  * "per data token" divides by the T tokens of a training row, so BERT and CrossBERT are charged on
    the same x-axis whatever they do with those tokens.

`executed_flops_per_token` counts what an implementation actually computes (e.g. the in-place CMS
form runs full T x T attention and masks half of it); `flops_per_token` is the algorithmic count that
scaling curves and MFU use. They differ only for in-place CMS.
"""

import dataclasses

from cbert_jax.models.model_config import MaskConfig, ModelConfig, generator_config, num_masked


@dataclasses.dataclass(frozen=True)
class ParamCounts:
  """Analytic parameter counts, split the way SPEC §4 needs them."""

  embedding: int  # token embedding table
  encoder: int  # encoder blocks + final norm (non-embedding)
  head: int  # vocabulary projection (0 when tied)
  pred_q: int  # predictor weights applied to queries (q, o, FFN, norms, mask vector, final norm)
  pred_kv: int  # predictor weights applied to encoder tokens (k, v, and the width projection)
  generator: int = 0  # ELECTRA generator blocks, final norm and width projections
  generator_embedding: int = 0  # ELECTRA generator's own table and head (0 when shared)

  @property
  def non_embedding(self) -> int:
    """N of the scaling laws [default]: every trained block, predictor and generator included;
    no embedding or vocabulary head."""
    return self.encoder + self.pred_q + self.pred_kv + self.generator

  @property
  def total(self) -> int:
    return (
      self.embedding
      + self.encoder
      + self.head
      + self.pred_q
      + self.pred_kv
      + self.generator
      + self.generator_embedding
    )


def _attn_params(d_q: int, d_kv: int, heads: int, head_dim: int) -> tuple[int, int]:
  """(weights applied to queries: wq + wo, weights applied to keys/values: wk + wv)."""
  inner = heads * head_dim
  return 2 * d_q * inner, 2 * d_kv * inner


def _encoder_params(cfg: ModelConfig) -> int:
  """Blocks (attention + SwiGLU + 2 norms each) + the final norm of a flat encoder."""
  d = cfg.d_model
  q, kv = _attn_params(d, d, cfg.num_heads, cfg.head_size)
  return cfg.num_layers * (q + kv + 3 * d * cfg.ffn_size + 2 * d) + d


def param_counts(model_name: str, cfg: ModelConfig) -> ParamCounts:
  d, v = cfg.d_model, cfg.vocab_size
  encoder = _encoder_params(cfg)
  if model_name == "electra":
    g = generator_config(cfg)
    gd = g.d_model
    if cfg.generator_shared_embeddings:
      gen, gen_emb = _encoder_params(g) + (2 * d * gd if gd != d else 0), 0
    else:
      gen, gen_emb = _encoder_params(g), 2 * v * gd  # own table + untied head
    return ParamCounts(
      embedding=v * d,
      encoder=encoder,
      head=d * d + d,
      pred_q=0,
      pred_kv=0,
      generator=gen,
      generator_embedding=gen_emb,
    )
  pred_q = pred_kv = 0
  head_d = d
  if model_name == "crossbert":
    pd = head_d = cfg.pred_d
    q, kv = _attn_params(pd, pd, cfg.pred_heads, cfg.pred_head_size)
    per_layer_q = q + 3 * pd * cfg.pred_ffn_size + 2 * pd
    if cfg.predictor_self_attn:
      per_layer_q += sum(_attn_params(pd, pd, cfg.pred_heads, cfg.pred_head_size)) + pd
    pred_q = cfg.predictor_layers * per_layer_q + pd + pd  # + mask vector + final norm
    if cfg.predictor_positions == "learned":
      pred_q += cfg.max_positions * pd  # position table (a gather)
    pred_kv = cfg.predictor_layers * kv + (d * pd if pd != d else 0)  # + encoder->predictor proj
  head = 0 if cfg.tie_embeddings else head_d * v
  return ParamCounts(embedding=v * d, encoder=encoder, head=head, pred_q=pred_q, pred_kv=pred_kv)


def flops_per_token(
  model_name: str, cfg: ModelConfig, mask_cfg: MaskConfig, seq_len: int, executed: bool = False
) -> float:
  """Training FLOPs per data token (forward + backward), SPEC §4.

  With `executed=True`, the FLOPs the chosen implementation performs (in-place CMS: full-length
  attention); otherwise the algorithmic count used for scaling curves and MFU.
  """
  pc = param_counts(model_name, cfg)
  t, r = seq_len, mask_cfg.mask_ratio
  d_attn = cfg.num_heads * cfg.head_size
  # Norm scales are elementwise, not matmul weights: take them out of the 6N term.
  enc_mm = pc.encoder - (2 * cfg.num_layers + 1) * cfg.d_model
  # model.ce_chunk recomputes the vocabulary projection in the backward pass: 8 instead of 6
  # FLOPs per weight per target, executed (the algorithmic count stays 6).
  head_mult = 8 if (executed and cfg.ce_chunk > 0) else 6
  if model_name == "bert":
    k = num_masked(t, r) / t
    return (
      6 * enc_mm + 12 * cfg.num_layers * t * d_attn + k * head_mult * cfg.d_model * cfg.vocab_size
    )
  if model_name == "electra":
    # Discriminator: encoder + head (d x d, then d x 1) on every token. Generator: its encoder on
    # every token, the width projection in, and at the K targets the projection out and the
    # vocabulary head. Sampling is not a matmul.
    k = num_masked(t, r) / t
    d, g = cfg.d_model, generator_config(cfg)
    gd = g.d_model
    disc = 6 * enc_mm + 12 * cfg.num_layers * t * d_attn + 6 * (d * d + d)
    gen_mm = _encoder_params(g) - (2 * g.num_layers + 1) * gd
    gen = 6 * gen_mm + 12 * g.num_layers * t * g.num_heads * g.head_size
    if cfg.generator_shared_embeddings and gd != d:
      gen += 6 * d * gd + k * 6 * gd * d + k * 6 * d * cfg.vocab_size
    else:
      gen += k * 6 * gd * cfg.vocab_size
    return disc + gen
  if model_name != "crossbert":
    raise ValueError(f"unknown model_name {model_name!r}")
  pd = cfg.pred_d
  pd_attn = cfg.pred_heads * cfg.pred_head_size
  lp = cfg.predictor_layers
  norms_q = (
    lp * 2 * pd + 2 * pd + (lp * pd if cfg.predictor_self_attn else 0)
  )  # elementwise weights
  if cfg.predictor_positions == "learned":
    norms_q += cfg.max_positions * pd  # a table lookup, not a matmul
  pred_q_mm = pc.pred_q - norms_q
  head = head_mult * pd * cfg.vocab_size
  if mask_cfg.cms:
    # Every token is encoded once (in a context of T/2) and predicted once (from a context of T/2).
    ctx = t if (executed and mask_cfg.cms_form == "inplace") else t / 2
    self_q = t if (executed and mask_cfg.cms_form == "inplace") else t / 2
    f = 6 * enc_mm + 12 * cfg.num_layers * ctx * d_attn
    f += 6 * (pred_q_mm + pc.pred_kv) + 12 * lp * ctx * pd_attn + head
    if cfg.predictor_self_attn:
      f += 12 * lp * self_q * pd_attn
    return f
  k = num_masked(t, r) / t  # fraction of tokens that are targets (static K per row)
  vis = 1 - k
  f = vis * 6 * enc_mm + 12 * cfg.num_layers * vis * vis * t * d_attn
  f += k * 6 * pred_q_mm + vis * 6 * pc.pred_kv + 12 * lp * k * vis * t * pd_attn + k * head
  if cfg.predictor_self_attn:
    f += 12 * lp * k * k * t * pd_attn
  return f
