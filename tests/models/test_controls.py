"""The reviewer's controls as config switches (SPEC §7): intermediate layers in every evaluator,
the same fresh pooler on every backbone vs a predictor warm start, CrossBERT's masking ratio."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import features as features_lib
from cbert_jax.evaluators import glue, mteb_encoder, suite
from cbert_jax.evaluators import pooler as pooler_lib
from tests import helpers


def _rows(n=6, t=12, seed=0):
  b = helpers.packed_batch(b=n, t=t, seed=seed)
  return {
    "tokens": b["tokens"],
    "positions": b["positions"],
    "segment_ids": (b["segment_ids"] != 0).astype(np.int32),
  }


@pytest.mark.parametrize("model_name", ["bert", "crossbert", "electra"])
def test_any_layer_equals_that_row_of_the_all_layers_features(model_name):
  graphdef, params = nnx.split(helpers.build(model_name), nnx.Param)
  rows = _rows()
  every = features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12, layers="all")(rows)
  assert every.shape == (3, 6, 32)  # L + 1 = 3 layers
  for layer in (0, 1, 2):
    one = features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12, layer=layer)(rows)
    np.testing.assert_allclose(one, every[layer], rtol=1e-5, atol=1e-6)
  final = features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12)(rows)
  assert not np.allclose(final, every[2])  # -1 is the *normalised* last layer


def test_pooler_reads_the_chosen_layer():
  graphdef, params = nnx.split(helpers.build("crossbert"), nnx.Param)
  cfg = nnx.merge(graphdef, params).cfg
  pooler_graphdef, pooler_params = pooler_lib.build_pooler(cfg, pooler_lib.PoolerSpec(out_dim=8))
  rows = {k: jnp.asarray(v) for k, v in _rows().items()}
  hidden = nnx.merge(graphdef, params).features(
    rows["tokens"], rows["positions"], rows["segment_ids"]
  )["hidden"]
  direct = nnx.merge(pooler_graphdef, pooler_params)(hidden[1], rows["segment_ids"])
  got = pooler_lib.embed(graphdef, params, pooler_params, _rows(), batch_size=4, layer=1)
  np.testing.assert_allclose(got, np.asarray(direct), rtol=1e-5, atol=1e-6)
  assert not np.allclose(got, pooler_lib.embed(graphdef, params, pooler_params, _rows(), 4))


def test_every_evaluator_is_built_on_the_configured_layer(monkeypatch, toy_tasks, tmp_path):
  graphdef, params = nnx.split(helpers.build("bert"), nnx.Param)
  layers_seen, pooler_layers = [], []
  real_init, real_train = features_lib.Featurizer.__init__, pooler_lib.train_pooler

  def spy_init(self, *a, **kw):
    layers_seen.append(kw.get("layer", -1))
    real_init(self, *a, **kw)

  monkeypatch.setattr(features_lib.Featurizer, "__init__", spy_init)
  monkeypatch.setattr(
    pooler_lib,
    "train_pooler",
    lambda *a, **kw: pooler_layers.append(kw["layer"]) or real_train(*a, **kw),
  )
  ecfg = config_lib.base_config().evals
  ecfg.tasks, ecfg.seq_len, ecfg.batch_size = "toy_cls,toy_retrieval", 8, 8
  ecfg.layer, ecfg.pooler, ecfg.pooler_steps = 1, "frozen", 2
  tok = helpers.WordTokenizer()
  suite.run(graphdef, params, tok, ecfg)  # ridge/kNN, retrieval, pooler
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=8):
    glue.run(graphdef, params, tok, ecfg, cache_dir=str(tmp_path), tasks=["rte"])
  encoder = mteb_encoder.CbertEncoder(
    graphdef, params, tok, seq_len=8, batch_size=8, layer=ecfg.layer
  )
  assert layers_seen == [1, 1, 1] and pooler_layers == [1] and encoder.layer == 1
  np.testing.assert_allclose(  # and the mteb path really reads layer 1
    encoder.embed_texts(["good bad the"]),
    features_lib.Featurizer(graphdef, params, batch_size=8, seq_len=8, layers="all")(
      features_lib.encode_texts(["good bad the"], tok, 8)
    )[1],
    rtol=1e-5,
    atol=1e-6,
  )


def test_layer_and_pooler_init_are_checked_against_the_model():
  ecfg = config_lib.base_config().evals
  suite.check_model(ecfg, "bert", 4)
  ecfg.layer = 4
  suite.check_model(ecfg, "bert", 4)  # 0..L are all valid
  ecfg.layer = 5
  with pytest.raises(ConfigError, match=r"evals.layer: expected -1 \(final\) or 0..4"):
    suite.check_model(ecfg, "bert", 4)
  ecfg.layer, ecfg.pooler, ecfg.pooler_init = -1, "frozen", "predictor"
  with pytest.raises(ConfigError, match="evals.pooler_init=predictor warm-starts from CrossBERT"):
    suite.check_model(ecfg, "electra", 4)
  suite.check_model(ecfg, "crossbert", 4)
  ecfg.pooler_init = "hot"
  with pytest.raises(ConfigError, match="evals.pooler_init: expected one of"):
    suite.check_model(ecfg, "crossbert", 4)


def test_predictor_warm_start_copies_cross_attention_and_fresh_does_not():
  cb_graph, cb_params = nnx.split(helpers.build("crossbert"), nnx.Param)
  cfg = nnx.merge(cb_graph, cb_params).cfg
  _, fresh = pooler_lib.build_pooler(cfg, pooler_lib.PoolerSpec(), seed=0)
  warm = pooler_lib.warm_start(fresh, cb_params)
  cross = cb_params["predictor"]["blocks"][0]["cross"]
  for name in ("wq", "wk", "wv", "wo"):
    np.testing.assert_array_equal(np.asarray(warm["attn"][name][...]), np.asarray(cross[name][...]))
    assert not np.allclose(np.asarray(fresh["attn"][name][...]), np.asarray(cross[name][...]))
  np.testing.assert_allclose(
    np.asarray(warm["queries"][...]),
    np.asarray(fresh["queries"][...]) + np.asarray(cb_params["predictor"]["mask_vec"][...]),
  )
  np.testing.assert_array_equal(np.asarray(warm["proj"][...]), np.asarray(fresh["proj"][...]))
  # Training from the warm start runs; the fresh default is the same pooler for any backbone.
  rows = _rows(n=8)
  _, _, hist = pooler_lib.train_pooler(
    cb_graph, cb_params, rows, _rows(n=8, seed=1), steps=2, batch_size=4, init="predictor"
  )
  assert np.isfinite([h["loss"] for h in hist]).all()
  bert_graph, bert_params = nnx.split(helpers.build("bert"), nnx.Param)
  with pytest.raises(ConfigError, match="needs a CrossBERT backbone"):
    pooler_lib.warm_start(fresh, bert_params)
  narrow = nnx.split(
    helpers.build("crossbert", cfg=helpers.model_cfg(predictor_d_model=16)), nnx.Param
  )[1]
  with pytest.raises(ConfigError, match="predictor width and heads equal"):
    pooler_lib.warm_start(fresh, narrow)


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.5, 0.75])
def test_crossbert_masking_ratio_from_015_to_075(ratio):
  model = helpers.build("crossbert", cms=False, mask_ratio=ratio)
  batch = helpers.packed_batch(b=2, t=20)
  out = model.forward(batch, jax.random.key(0))
  k = int(round(ratio * 20))
  assert out["logits"].shape == (2, k, 96)  # K targets per row
  assert out["encoder_out"].shape == (2, 20 - k, 32)  # the rest is encoded
  loss, _ = model.loss(batch, jax.random.key(0))
  assert np.isfinite(float(loss))
  # The config accepts any ratio without CMS, and says why CMS needs 0.5.
  c = config_lib.base_config()
  c.masking.mask_ratio, c.masking.cms = ratio, False
  config_lib.validate(config_lib.resolve(c), 1)
  if ratio != 0.5:
    c.masking.cms = True
    with pytest.raises(ConfigError, match="masking.cms splits every row in halves"):
      config_lib.validate(c, 1)


def test_learned_predictor_positions_are_validated():
  c = config_lib.resolve(config_lib.base_config())
  assert c.model.max_positions == c.data.seq_len
  c.model.predictor_positions = "alibi"
  with pytest.raises(ConfigError, match="model.predictor_positions must be rope|learned"):
    config_lib.validate(c, 1)
  c.model.predictor_positions, c.model.max_positions = "learned", 64
  with pytest.raises(ConfigError, match="model.max_positions=64 is smaller than data.seq_len=128"):
    config_lib.validate(c, 1)
