"""Optimizer pieces and the pure train step: schedules, weight-decay mask, clipping, overfitting."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from cbert_jax import config_lib
from cbert_jax.step import optim, steps
from tests import helpers


def ocfg(**kw):
  c = ml_collections.ConfigDict(config_lib.base_config().optim.to_dict())
  for k, v in kw.items():
    c[k] = v
  return c


def test_wsd_schedule_shape():
  lr = optim.schedule(ocfg(lr=1.0, warmup_steps=10, decay_frac=0.2, final_lr_frac=0.1), 100)
  vals = np.array([float(lr(s)) for s in range(101)])
  np.testing.assert_allclose(vals[[0, 5, 10]], [0.0, 0.5, 1.0], atol=1e-6)  # linear warmup
  np.testing.assert_allclose(vals[10:80], 1.0)  # stable
  assert np.all(np.diff(vals[80:]) < 0)  # decays over the last 20%
  np.testing.assert_allclose(vals[100], 0.1, atol=1e-6)


def test_cosine_schedule_and_warmup_frac():
  lr = optim.schedule(ocfg(lr=2.0, schedule="cosine", warmup_frac=0.1, final_lr_frac=0.0), 50)
  assert optim.warmup_steps(ocfg(warmup_frac=0.1), 50) == 5
  np.testing.assert_allclose([float(lr(5)), float(lr(50))], [2.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(float(lr(27.5)), 1.0, atol=1e-2)  # half way down the cosine


def test_weight_decay_skips_norms_and_the_mask_vector():
  model = helpers.build("crossbert")
  params = nnx.state(model, nnx.Param)
  tx, _ = optim.make_optimizer(
    ocfg(lr=0.1, weight_decay=0.5, warmup_steps=1, schedule="constant"), 10
  )
  zero = jax.tree.map(jnp.zeros_like, params)
  _, state = tx.update(zero, tx.init(params), params)  # step 0 has lr 0
  updates, _ = tx.update(zero, state, params)  # zero grads: decay only
  flat = dict(nnx.to_flat_state(updates))
  norm_scale = flat[("encoder", "blocks", 0, "attn_norm", "scale")][...]
  w1 = flat[("encoder", "blocks", 0, "ffn", "w1")][...]
  p_w1 = dict(nnx.to_flat_state(params))[("encoder", "blocks", 0, "ffn", "w1")][...]
  mask_vec = flat[("predictor", "mask_vec")][...]
  assert np.all(norm_scale == 0) and np.all(mask_vec == 0)
  np.testing.assert_allclose(w1, -0.1 * 0.5 * p_w1, rtol=1e-5)  # decoupled decay lr * wd * p


@pytest.mark.parametrize(
  "model_name,kw", [("bert", {}), ("crossbert", {"cms": True}), ("crossbert", {"cms": False})]
)
def test_tiny_model_overfits_one_batch(model_name, kw):
  model = helpers.build(model_name, cfg=helpers.model_cfg(d_model=64, num_heads=4), **kw)
  graphdef, params = nnx.split(model, nnx.Param)
  tx, lr = optim.make_optimizer(
    ocfg(lr=3e-3, warmup_steps=5, schedule="constant", weight_decay=0.0), 200
  )
  step = jax.jit(steps.make_train_step(graphdef, tx, lr), donate_argnums=(0, 1))
  batch = helpers.packed_batch(b=4, t=32, seed=5)
  opt_state = tx.init(params)
  losses = []
  for i in range(200):
    params, opt_state, m = step(params, opt_state, batch, jnp.int32(i), jax.random.key(0))
    losses.append(float(m["loss"]))
  first, last = np.mean(losses[:5]), np.mean(losses[-10:])
  assert last < 0.25 * first, (first, last)  # memorised: from ~ln(96) = 4.6 nats to under 1.2
