"""ELECTRA: replacement at exactly the masked positions, labels, gradient isolation, training."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax import train
from cbert_jax.models import electra
from cbert_jax.run import metrics as metrics_lib
from tests import helpers
from tests.helpers import tiny_config


def _batch(**kw):
  return {k: jnp.asarray(v) for k, v in helpers.packed_batch(**kw).items()}


@pytest.mark.parametrize("shared", [True, False])
def test_samples_replace_exactly_the_masked_positions(shared):
  model = helpers.build("electra", cfg=helpers.model_cfg(generator_shared_embeddings=shared))
  batch = _batch(b=3, t=16)
  out = model.forward(batch, jax.random.key(3))
  tokens = np.asarray(batch["tokens"])
  corrupted, idx = np.asarray(out["corrupted"]), np.asarray(out["masked_idx"])
  weights, samples = np.asarray(out["weights"]), np.asarray(out["samples"])
  for row in range(tokens.shape[0]):
    real = idx[row][weights[row] > 0]  # the real targets of this row
    outside = np.setdiff1d(np.arange(tokens.shape[1]), real)
    np.testing.assert_array_equal(corrupted[row, outside], tokens[row, outside])
    np.testing.assert_array_equal(corrupted[row, real], samples[row][weights[row] > 0])
  np.testing.assert_array_equal(np.asarray(out["replaced"]), corrupted != tokens)
  assert not np.isin(samples, helpers.SPECIAL).any()  # specials are never sampled
  # The discriminator reads only real tokens: padding carries no loss.
  np.testing.assert_array_equal(
    np.asarray(out["disc_weights"]), np.asarray(batch["segment_ids"]) != 0
  )


def test_labels_count_a_sample_equal_to_the_original_as_original():
  tokens = jnp.asarray([[10, 11, 12, 13, 14, 0]])
  idx = jnp.asarray([[1, 3, 5]])
  samples = jnp.asarray([[11, 42, 7]])  # same as original, replaced, padding slot
  weights = jnp.asarray([[1.0, 1.0, 0.0]])  # position 5 is padding: not a target
  corrupted, replaced = electra.replace_and_label(tokens, idx, samples, weights)
  np.testing.assert_array_equal(np.asarray(corrupted), [[10, 11, 12, 42, 14, 0]])
  np.testing.assert_array_equal(np.asarray(replaced), [[False, False, False, True, False, False]])


def test_sampling_follows_the_generator_and_skips_special_ids():
  logits = jnp.full((2, 3, 12), -5.0).at[..., 7].set(5.0).at[..., 4].set(50.0)  # 4 is [MASK]
  s = np.asarray(electra.sample_tokens(jax.random.key(0), logits, helpers.SPECIAL))
  assert (s == 7).all()
  flat = jnp.zeros((1, 4000, 8)).at[..., :5].set(-jnp.inf)  # uniform over 5, 6, 7
  counts = np.bincount(
    np.asarray(electra.sample_tokens(jax.random.key(1), flat, (0,))).ravel(), minlength=8
  )
  assert counts[:5].sum() == 0 and all(abs(c / 4000 - 1 / 3) < 0.04 for c in counts[5:])


def _grads(model, batch, metric):
  graphdef, params = nnx.split(model, nnx.Param)

  def f(p):
    return nnx.merge(graphdef, p).loss(batch, jax.random.key(5))[1][metric]

  return jax.grad(f)(params)


def _max_abs(tree) -> float:
  return max(float(jnp.abs(x).max()) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("shared", [True, False])
def test_discriminator_loss_never_reaches_the_generator(shared):
  model = helpers.build(
    "electra", cfg=helpers.model_cfg(generator_shared_embeddings=shared, generator_width=0.5)
  )
  batch = _batch(b=3, t=16)
  g_disc = _grads(model, batch, "disc_loss")
  g_gen = _grads(model, batch, "gen_loss")
  # Through the samples (stop-gradient) nothing flows back into the generator's own weights...
  assert _max_abs(g_disc["generator"]) == 0.0
  # ...while the discriminator gets its gradient, and the generator loss trains the generator only.
  assert _max_abs(g_disc["encoder"]["blocks"]) > 0 and _max_abs(g_disc["disc_head"]) > 0
  assert _max_abs(g_gen["generator"]["blocks"]) > 0
  assert _max_abs(g_gen["encoder"]["blocks"]) == 0.0 and _max_abs(g_gen["disc_head"]) == 0.0
  # The shared table is trained by both losses (ELECTRA's embedding sharing).
  if shared:
    assert _max_abs(g_gen["encoder"]["embed"]) > 0 and _max_abs(g_disc["encoder"]["embed"]) > 0


def test_features_are_the_discriminators():
  model = helpers.build("electra")
  b = _batch(b=2, t=16)
  feats = model.features(b["tokens"], b["positions"], b["segment_ids"])
  bert_like = helpers.build("bert")
  bert_like.encoder = model.encoder  # the same stack, read as BERT does
  ref = bert_like.features(b["tokens"], b["positions"], b["segment_ids"])
  np.testing.assert_array_equal(np.asarray(feats["final"]), np.asarray(ref["final"]))
  assert feats["hidden"].shape == (3, 2, 16, 32)


def test_generator_shapes_follow_the_config_fractions():
  g = electra.generator_config(
    helpers.model_cfg(
      d_model=128, num_layers=8, num_heads=4, generator_width=1 / 3, generator_depth=0.5
    )
  )
  assert (g.d_model, g.num_heads, g.head_size, g.num_layers) == (32, 1, 32, 4)


def test_tiny_electra_trains_with_both_losses_falling(tmp_path, cache_dir):
  cfg = tiny_config(cache_dir, "electra", total_steps=40, checkpoint_every=40, **{"optim.lr": 3e-3})
  train.run(cfg, str(tmp_path))
  rows = [
    r
    for r in metrics_lib.read_metrics(os.path.join(tmp_path, "metrics.jsonl"))
    if "train/gen_loss" in r
  ]
  first, last = rows[:3], rows[-3:]
  mean = lambda rs, k: float(np.mean([r[k] for r in rs]))
  assert mean(last, "train/gen_loss") < mean(first, "train/gen_loss") - 0.5
  assert mean(last, "train/disc_loss") < mean(first, "train/disc_loss") - 0.1
  assert all(0 < r["train/replaced_frac"] < 0.5 for r in rows)
  assert rows[-1]["train/loss"] == pytest.approx(
    rows[-1]["train/gen_loss"] + 50.0 * rows[-1]["train/disc_loss"], rel=1e-4
  )
