"""Model behaviour: information flow, CMS forms, RoPE, parameter counts, masking invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax.models import flops as flops_lib
from cbert_jax.models import layers, masking
from tests import helpers

RNG = jax.random.key(7)


def _replace(batch, where, seed=1):
  """A copy of batch whose tokens at `where` (bool [B, T]) are other non-special ids."""
  rs = np.random.RandomState(seed)
  tokens = batch["tokens"].copy()
  new = rs.randint(len(helpers.SPECIAL) + 1, 96, tokens.shape)
  new = np.where(new == tokens, new % 90 + 5, new)  # always a different id
  tokens[where] = new[where]
  return dict(batch, tokens=tokens)


def test_crossbert_masked_ids_reach_neither_encoder_nor_predictor():
  model = helpers.build("crossbert", cms=False)
  batch = helpers.packed_batch()
  out = model.forward(batch, RNG)
  masked = np.zeros(batch["tokens"].shape, bool)
  np.put_along_axis(masked, np.asarray(out["query_idx"]), True, axis=1)
  changed = _replace(batch, masked & (batch["segment_ids"] != 0))
  out2 = model.forward(changed, RNG)
  np.testing.assert_array_equal(out["query_idx"], out2["query_idx"])  # same split
  np.testing.assert_array_equal(out["encoder_out"], out2["encoder_out"])
  np.testing.assert_array_equal(out["logits"], out2["logits"])
  assert not np.array_equal(out["targets"], out2["targets"])  # the targets did change
  # ...while changing a visible token does change the predictions (the test can fail).
  visible_changed = _replace(batch, ~masked & (batch["segment_ids"] != 0))
  assert not np.allclose(model.forward(visible_changed, RNG)["logits"], out["logits"])


def test_cms_inplace_prediction_ignores_own_half():
  model = helpers.build("crossbert", cms=True, cms_form="inplace")
  batch = helpers.packed_batch()
  _, _, view = masking.cms_split(RNG, *batch["tokens"].shape)
  view = np.asarray(view)
  out = model.forward(batch, RNG)
  for half in (0, 1):
    own = view == half
    changed = _replace(batch, own & (batch["segment_ids"] != 0), seed=half + 3)
    out2 = model.forward(changed, RNG)
    # Predictions for tokens of this half: identical; for the other half: changed.
    np.testing.assert_allclose(
      np.asarray(out2["logits"])[own], np.asarray(out["logits"])[own], rtol=0, atol=1e-6
    )
    real_other = (~own) & (batch["segment_ids"] != 0)
    assert not np.allclose(
      np.asarray(out2["logits"])[real_other], np.asarray(out["logits"])[real_other]
    )


@pytest.mark.parametrize(
  "predictor",
  [
    {},
    {"predictor_positions": "learned", "max_positions": 32},  # SPEC §2's predictor options
    {"predictor_self_attn": True},
    {"predictor_d_model": 16},
  ],
)
def test_cms_gather_and_inplace_agree_on_loss_and_grads(predictor):
  model = helpers.build(
    "crossbert", cfg=helpers.model_cfg(**predictor), cms=True, cms_form="gather"
  )
  graphdef, params = nnx.split(model, nnx.Param)
  batch = helpers.packed_batch(b=4, t=32)

  def loss(p, form):
    m = helpers.with_mask_cfg(nnx.merge(graphdef, p), cms_form=form)
    return m.loss(batch, RNG)

  (l_g, aux_g), g_g = jax.value_and_grad(loss, has_aux=True)(params, "gather")
  (l_i, aux_i), g_i = jax.value_and_grad(loss, has_aux=True)(params, "inplace")
  assert aux_g["num_targets"] == aux_i["num_targets"] == (batch["segment_ids"] != 0).sum()
  np.testing.assert_allclose(l_g, l_i, rtol=1e-5)
  np.testing.assert_allclose(aux_g["masked_acc"], aux_i["masked_acc"], atol=1e-6)
  for a, b in zip(jax.tree.leaves(g_g), jax.tree.leaves(g_i), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_cms_split_covers_every_token_once():
  idx_a, idx_b, view = masking.cms_split(RNG, 5, 24)
  both = np.concatenate([np.asarray(idx_a), np.asarray(idx_b)], axis=1)
  np.testing.assert_array_equal(np.sort(both, axis=1), np.tile(np.arange(24), (5, 1)))
  np.testing.assert_array_equal(np.asarray(view).sum(1), 12)
  np.testing.assert_array_equal(np.take_along_axis(np.asarray(view), np.asarray(idx_b), 1), 1)


@pytest.mark.parametrize(
  "model_name,kw",
  [
    ("bert", {}),
    ("crossbert", {"cms": False}),
    ("crossbert", {"cms": True, "cms_form": "gather"}),
    ("crossbert", {"cms": True, "cms_form": "inplace"}),
  ],
)
def test_packed_documents_do_not_see_each_other(model_name, kw):
  model = helpers.build(model_name, **kw)
  batch = helpers.packed_batch()
  seg = batch["segment_ids"]
  out = model.forward(batch, RNG)
  # Change every token of document 2 in each row; document 1's predictions and features must not move.
  changed = _replace(batch, seg == 2)
  out2 = model.forward(changed, RNG)
  rows = np.arange(seg.shape[0])[:, None]
  if model_name == "crossbert" and kw.get("cms_form") == "gather":
    rows = np.repeat(rows, 2, axis=0) // 1  # rows 2b, 2b+1 are sequence b's views
    rows = np.arange(seg.shape[0]).repeat(2)[:, None]
  q_idx = np.asarray(out.get("query_idx", out.get("masked_idx")))
  q_seg = seg[rows, q_idx]
  doc1 = q_seg == 1
  np.testing.assert_allclose(
    np.asarray(out2["logits"])[doc1], np.asarray(out["logits"])[doc1], atol=1e-6
  )
  assert not np.allclose(
    np.asarray(out2["logits"])[q_seg == 2], np.asarray(out["logits"])[q_seg == 2]
  )
  f1, f2 = (model.features(b["tokens"], b["positions"], seg)["hidden"] for b in (batch, changed))
  np.testing.assert_allclose(np.asarray(f2)[:, seg == 1], np.asarray(f1)[:, seg == 1], atol=1e-6)


def test_bert_corruption_and_targets():
  model = helpers.build("bert")
  batch = helpers.packed_batch(b=4, t=64)
  out = model.forward(batch, RNG)
  k = masking.num_masked(64, 0.2)
  assert out["logits"].shape == (4, k, 96)
  # targets are the original tokens; padding/special positions never carry weight
  idx = np.asarray(out["masked_idx"])
  np.testing.assert_array_equal(out["targets"], np.take_along_axis(batch["tokens"], idx, 1))
  w = np.asarray(out["weights"])
  assert (w[np.take_along_axis(batch["segment_ids"], idx, 1) == 0] == 0).all()
  # 80/10/10 over many rows: the share of [MASK] among targets is near 0.8
  big = helpers.packed_batch(b=64, t=64, seed=3)
  big["segment_ids"][:] = 1
  can = masking.maskable(
    jnp.asarray(big["tokens"]), jnp.asarray(big["segment_ids"]), helpers.SPECIAL
  )
  midx, _ = masking.random_split(RNG, can, k)
  cor = masking.bert_corrupt(
    RNG,
    jnp.asarray(big["tokens"]),
    midx,
    mask_id=helpers.MASK_ID,
    vocab_size=96,
    special_ids=helpers.SPECIAL,
  )
  new, orig = (np.take_along_axis(np.asarray(x), np.asarray(midx), 1) for x in (cor, big["tokens"]))
  frac_mask, frac_same = (new == helpers.MASK_ID).mean(), (new == orig).mean()
  assert abs(frac_mask - 0.8) < 0.03 and 0.08 < frac_same < 0.13
  assert not np.isin(new[new != helpers.MASK_ID], helpers.SPECIAL).any()
  # untouched positions keep their ids
  untouched = np.ones_like(big["tokens"], bool)
  np.put_along_axis(untouched, np.asarray(midx), False, 1)
  np.testing.assert_array_equal(np.asarray(cor)[untouched], big["tokens"][untouched])


def test_masking_never_picks_padding_or_special_when_avoidable():
  tokens = np.full((2, 20), 50, np.int32)
  tokens[:, :3] = (2, 4, 3)  # bos, [MASK], eos
  seg = np.ones((2, 20), np.int32)
  seg[1, 15:] = 0
  can = masking.maskable(jnp.asarray(tokens), jnp.asarray(seg), helpers.SPECIAL)
  for s in range(20):
    midx, vidx = masking.random_split(jax.random.key(s), can, 6)
    assert np.asarray(can)[np.arange(2)[:, None], np.asarray(midx)].all()
    assert sorted(np.concatenate([midx[0], vidx[0]]).tolist()) == list(range(20))


def test_rope_depends_only_on_relative_positions():
  model = helpers.build("bert")
  batch = helpers.packed_batch(b=1, t=16)
  batch["segment_ids"][:] = 1
  pos = np.arange(16, dtype=np.int32)[None]
  f = lambda p: model.features(batch["tokens"], p, batch["segment_ids"])["final"]
  np.testing.assert_allclose(f(pos), f(pos + 37), atol=2e-5)
  assert not np.allclose(f(pos), f(pos[:, ::-1].copy()), atol=1e-3)


def test_attention_mask_rules():
  seg_q = jnp.array([[1, 1, 2, 0]])
  view = jnp.array([[0, 1, 0, 1]])
  m = np.asarray(layers.attention_mask(seg_q, seg_q))[0]
  np.testing.assert_array_equal(m, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
  enc = np.asarray(layers.attention_mask(seg_q, seg_q, view, view, same_view=True))[0]
  pred = np.asarray(layers.attention_mask(seg_q, seg_q, view, view, same_view=False))[0]
  np.testing.assert_array_equal(enc, [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(pred, [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
  "model_name,kw",
  [
    ("bert", {}),
    ("bert", {"tie_embeddings": True}),
    ("crossbert", {}),
    ("crossbert", {"predictor_d_model": 16, "predictor_layers": 2}),
    ("crossbert", {"predictor_self_attn": True, "ffn_dim": 64}),
    ("crossbert", {"predictor_positions": "learned", "max_positions": 40}),
    ("electra", {}),
    ("electra", {"generator_shared_embeddings": False}),
    ("electra", {"generator_width": 1.0, "generator_depth": 0.5}),
  ],
)
def test_param_counts_match_analytic(model_name, kw):
  cfg = helpers.model_cfg(**kw)
  model = helpers.build(model_name, cfg=cfg)
  params = nnx.state(model, nnx.Param)
  actual = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  counts = flops_lib.param_counts(model_name, cfg)
  assert actual == counts.total
  enc = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model.encoder, nnx.Param)))
  assert enc == counts.encoder + counts.embedding


@pytest.mark.parametrize("model_name", ["bert", "crossbert", "electra"])
@pytest.mark.parametrize("depth_init", ["none", "global", "current"])
def test_init_std_and_depth_factor(depth_init, model_name):
  # The init-std reduction that stabilised the largest CrossBERT applies to every family's encoder.
  cfg = helpers.model_cfg(
    d_model=256, num_layers=4, num_heads=4, depth_init=depth_init, init_scale=0.5
  )
  model = helpers.build(model_name, cfg=cfg)
  wq = np.asarray(model.encoder.blocks[3].attn.wq[...])
  wo = np.asarray(model.encoder.blocks[3].attn.wo[...])
  assert abs(wq.std() / (0.5 * 256**-0.5) - 1) < 0.05
  div = {"none": 1.0, "global": np.sqrt(2 * 5), "current": np.sqrt(2 * 4)}[depth_init]
  assert abs(wo.std() / (0.5 * 256**-0.5 / div) - 1) < 0.05
  assert np.abs(wq).max() <= 3 * 0.5 * 256**-0.5 + 1e-7  # truncated at 3 std


@pytest.mark.parametrize("d_in,d_out", [(8, 24), (24, 8)])
def test_dense_matches_matmul_in_value_and_gradient(d_in, d_out):
  from cbert_jax.models.dense import dense

  rs = np.random.RandomState(0)
  x = jnp.asarray(rs.randn(3, 5, d_in), jnp.float32)
  w = jnp.asarray(rs.randn(d_in, d_out), jnp.float32)
  g = jnp.asarray(rs.randn(3, 5, d_out), jnp.float32)
  f = lambda fn: jax.vjp(fn, x, w)
  out_a, vjp_a = f(dense)
  out_b, vjp_b = f(jnp.matmul)
  np.testing.assert_allclose(out_a, out_b, rtol=1e-6)
  for a, b in zip(vjp_a(g), vjp_b(g)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert dense(x, w, preferred_element_type=jnp.float32).dtype == jnp.float32


@pytest.mark.parametrize("model_name", ["bert", "crossbert"])
def test_remat_keeps_loss_and_gradients_and_saves_memory(model_name):
  from cbert_jax.models import encoder as encoder_lib

  batch = helpers.packed_batch(b=4, t=32)
  results, temps = {}, {}
  for remat in ("none", "full", "dots"):
    model = helpers.build(model_name, cfg=helpers.model_cfg(remat=remat, num_layers=3, d_model=64))
    graphdef, params = nnx.split(model, nnx.Param)
    fn = jax.jit(jax.value_and_grad(lambda p, g=graphdef: nnx.merge(g, p).loss(batch, RNG)[0]))
    results[remat] = fn(params)
    temps[remat] = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
  for remat in ("full", "dots"):
    np.testing.assert_allclose(results[remat][0], results["none"][0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(results[remat][1]), jax.tree.leaves(results["none"][1])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert temps["full"] < temps["none"], temps  # recomputation frees block activations
  with pytest.raises(ValueError, match="model.remat must be none|full|dots"):
    encoder_lib.remat_block("some")


@pytest.mark.parametrize(
  "model_name,kw,chunk",
  [("bert", {}, 2), ("crossbert", {"cms": True}, 3), ("crossbert", {"cms": False}, 5)],
)
def test_chunked_cross_entropy_equals_the_full_logits(model_name, kw, chunk):
  batch = helpers.packed_batch(b=3, t=16)
  vals = {}
  for c in (0, chunk):  # chunk sizes that do not divide K: padded chunks
    model = helpers.build(model_name, cfg=helpers.model_cfg(ce_chunk=c), **kw)
    graphdef, params = nnx.split(model, nnx.Param)
    vals[c] = jax.value_and_grad(
      lambda p, g=graphdef: nnx.merge(g, p).loss(batch, RNG), has_aux=True
    )(params)
  (l0, m0), g0 = vals[0]
  (l1, m1), g1 = vals[chunk]
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for key in ("masked_acc", "num_targets"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
  "model_name,kw,cfg_kw",
  [
    ("bert", {}, {}),
    ("crossbert", {"cms": True}, {"predictor_self_attn": True}),  # self- and cross-attention
    ("crossbert", {"cms": False}, {"predictor_d_model": 48}),  # a narrower predictor
  ],
)
def test_fused_projections_keep_parameters_loss_and_gradients(model_name, kw, cfg_kw):
  """q/k/v and SwiGLU's gate/up as one matmul each: the same parameter tree (names, shapes, init
  values: checkpoints load either way), the same loss and gradients as three and two matmuls."""
  batch = helpers.packed_batch(b=3, t=16)
  vals, trees = {}, {}
  for fused in (False, True):
    model = helpers.build(
      model_name, cfg=helpers.model_cfg(fused_projections=fused, **cfg_kw), **kw
    )
    graphdef, params = nnx.split(model, nnx.Param)
    trees[fused] = params
    vals[fused] = jax.jit(
      jax.value_and_grad(lambda p, g=graphdef: nnx.merge(g, p).loss(batch, RNG)[0])
    )(params)
  assert jax.tree.structure(trees[True]) == jax.tree.structure(trees[False])
  for a, b in zip(jax.tree.leaves(trees[True]), jax.tree.leaves(trees[False])):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(vals[True][0], vals[False][0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(vals[True][1]), jax.tree.leaves(vals[False][1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_chunked_cross_entropy_never_holds_all_logits():
  batch = {k: jnp.asarray(v) for k, v in helpers.packed_batch(b=8, t=64).items()}
  temps = {}
  for c in (0, 8):
    cfg = helpers.model_cfg(vocab_size=8192, ce_chunk=c)
    graphdef, params = nnx.split(helpers.build("crossbert", cfg=cfg, cms=True), nnx.Param)
    fn = jax.jit(jax.grad(lambda p, g=graphdef: nnx.merge(g, p).loss(batch, RNG)[0]))
    temps[c] = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
  logits_bytes = 8 * 64 * 8192 * 4  # every token's fp32 logits (CMS)
  assert temps[0] - temps[8] > logits_bytes // 2, temps
