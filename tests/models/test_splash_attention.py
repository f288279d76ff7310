"""model.attention_impl=splash: Pallas' splash kernel (run by Pallas' interpreter on CPU) against
XLA's attention, on the masks the models build: packed rows with padding, CrossBERT's
cross-attention (Sq != Sk, a query whose document has no key), the in-place CMS views; then whole
tiny models, and under a data x fsdp x tensor mesh (shard_map)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax import config_groups, config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.models import FAMILIES, layers, splash
from cbert_jax.step import sharding
from tests import helpers

RNG = jax.random.key(11)
H, D = 2, 64  # heads, head width


def _segments(rs, b: int, s: int, docs: int, pad: int) -> np.ndarray:
  """[b, s] packed segment ids 1..docs in random contiguous runs, then `pad` zeros."""
  out = np.zeros((b, s), np.int32)
  for i in range(b):
    cuts = np.sort(rs.choice(np.arange(1, s - pad), docs - 1, replace=False))
    out[i, : s - pad] = 1 + np.searchsorted(cuts, np.arange(s - pad), side="right")
  return out


def _grads(impl: str, dtype: str, seg_q, seg_k, view_q=None, view_k=None, same_view=True):
  """(output [B, Sq, d], grads of a random projection of it wrt params, x_q, x_kv) of one
  Attention layer with `impl`; the parameters and inputs do not depend on impl."""
  cfg = helpers.model_cfg(
    d_model=H * D, num_heads=H, attention_impl=impl, compute_dtype=dtype, param_dtype=dtype
  )
  with nnx.use_eager_sharding(False):
    attn = layers.Attention(H * D, H * D, H, D, cfg, 1.0, nnx.Rngs(0))
  graphdef, params = nnx.split(attn)
  (b, sq), sk = seg_q.shape, seg_k.shape[1]
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  x_q = jax.random.normal(k1, (b, sq, H * D), jnp.float32).astype(dtype)
  x_kv = jax.random.normal(k2, (b, sk, H * D), jnp.float32).astype(dtype)
  proj = jax.random.normal(k3, (b, sq, H * D), jnp.float32)
  pos_q, pos_k = (
    jnp.broadcast_to(jnp.arange(sq), (b, sq)),
    jnp.broadcast_to(jnp.arange(sk), (b, sk)),
  )
  mask = layers.attention_mask(
    jnp.asarray(seg_q), jnp.asarray(seg_k), view_q, view_k, same_view=same_view
  )

  def f(params, x_q, x_kv):
    out = nnx.merge(graphdef, params)(x_q, pos_q, x_kv, pos_k, mask)
    return jnp.sum(out.astype(jnp.float32) * proj), out

  with splash.interpret_mode():
    grads, out = jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))(params, x_q, x_kv)
  return out, grads


def _assert_same(a, b, tol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    scale = max(1.0, float(np.abs(y).max()))
    np.testing.assert_allclose(x, y, rtol=0, atol=tol * scale)


def _compare(dtype, tol, seg_q, seg_k, **kw):
  out_s, g_s = _grads("splash", dtype, seg_q, seg_k, **kw)
  out_x, g_x = _grads("xla", dtype, seg_q, seg_k, **kw)
  _assert_same(out_s, out_x, tol)
  _assert_same(g_s, g_x, tol)
  return np.asarray(out_s, np.float32)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("bfloat16", 3e-2)])
def test_packed_rows_with_padding(dtype, tol):
  # 200 tokens: padded to 256 inside (two 128-blocks of keys and queries), 3-5 documents per row
  # and a padded tail whose queries see no key (zeroed on both paths).
  rs = np.random.RandomState(0)
  seg = np.concatenate([_segments(rs, 1, 200, 3, 23), _segments(rs, 1, 200, 5, 0)])
  out = _compare(dtype, tol, seg, seg)
  assert not np.any(out[0, -23:]) and np.all(np.any(out[0, :-23] != 0, axis=-1))


def test_crossbert_cross_attention_sq_ne_sk():
  # The predictor's queries (masked positions) attend the encoder's visible tokens of the same
  # document: 96 queries, 160 keys (padded to 128 and 256). Document 4 of row 1 has queries but
  # no visible key: those rows are zero.
  rs = np.random.RandomState(1)
  seg_k = _segments(rs, 2, 160, 3, 10)
  seg_q = np.sort(rs.randint(0, 4, (2, 96)), axis=1).astype(np.int32)
  seg_q[1, -8:] = 4
  out = _compare("float32", 2e-5, seg_q, seg_k)
  assert not np.any(out[1, -8:]) and not np.any(out[seg_q == 0])


@pytest.mark.parametrize("same_view", [True, False], ids=["encoder", "predictor"])
def test_inplace_cms_views(same_view):
  # One row of T tokens split into two random views: the encoder attends its own view of the
  # document, the predictor the other view (view folded into the splash id).
  rs = np.random.RandomState(2)
  seg = _segments(rs, 2, 128, 3, 12)
  view = jnp.asarray(rs.randint(0, 2, seg.shape).astype(np.int32))
  _compare("float32", 2e-5, seg, seg, view_q=view, view_k=view, same_view=same_view)


def test_splash_ids_reproduce_the_dense_mask():
  rs = np.random.RandomState(3)
  seg = jnp.asarray(_segments(rs, 2, 48, 4, 5))
  view = jnp.asarray(rs.randint(0, 2, seg.shape))
  for kw in ({}, {"view_q": view, "view_k": view}):
    for same in (True, False):
      m = layers.attention_mask(seg, seg, same_view=same, **kw)
      iq, ik = m.splash_ids()
      np.testing.assert_array_equal(iq[:, :, None] == ik[:, None, :], np.asarray(m))


def _loss_and_grads(model, batch):
  graphdef, params = nnx.split(model)

  def f(params):
    return nnx.merge(graphdef, params).loss(batch, RNG)[0]

  with splash.interpret_mode():
    return jax.jit(jax.value_and_grad(f))(params)


@pytest.mark.parametrize(
  "family,mask_kw",
  [("bert", {}), ("crossbert", {"cms": True, "cms_form": "gather"})],
  ids=["bert", "crossbert_cms_gather"],
)
def test_whole_model_loss_and_grads(family, mask_kw):
  batch = helpers.packed_batch(b=2, t=40)
  cfg = helpers.model_cfg(d_model=64, num_heads=2, num_layers=1)
  ref = _loss_and_grads(helpers.build(family, cfg=cfg, **mask_kw), batch)
  cfg = dataclasses.replace(cfg, attention_impl="splash")
  got = _loss_and_grads(helpers.build(family, cfg=cfg, **mask_kw), batch)
  _assert_same(got, ref, 2e-5)


def test_inplace_cms_model_loss_equals_xla():
  batch = helpers.packed_batch(b=2, t=40)
  cfg = helpers.model_cfg(d_model=64, num_heads=2, num_layers=1)
  fam = lambda c: helpers.build("crossbert", cfg=c, cms=True, cms_form="inplace")
  loss = lambda m: nnx.jit(lambda m: m.loss(batch, RNG)[0])(m)
  with splash.interpret_mode():
    got = loss(fam(dataclasses.replace(cfg, attention_impl="splash")))
  np.testing.assert_allclose(got, loss(fam(cfg)), rtol=1e-6)


def test_under_a_data_fsdp_tensor_mesh():
  # 8 fake devices: batch over data x fsdp (4), heads over tensor (2); the kernel runs in
  # shard_map on each device's rows and heads.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rules = config_groups.DEFAULT_RULES
  batch = helpers.packed_batch(b=4, t=40)
  cfg = helpers.model_cfg(d_model=64, num_heads=2, num_layers=1)
  mask_cfg = helpers.mask_cfg("crossbert", cms=True)

  def loss(c):
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules), splash.interpret_mode():
      model = FAMILIES["crossbert"](c, mask_cfg, nnx.Rngs(0))
      jaxpr = jax.make_jaxpr(lambda b: model.loss(b, RNG)[0])(batch)
      return nnx.jit(lambda m, b: m.loss(b, RNG)[0])(model, batch), jaxpr

  got, jaxpr = loss(dataclasses.replace(cfg, attention_impl="splash"))
  ref, _ = loss(cfg)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  assert "shard_map" in str(jaxpr)


def test_refuses_a_sharded_sequence():
  mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
  rules = tuple((n, "fsdp" if n == "seq" else None) for n, _ in config_groups.DEFAULT_RULES)
  q = jnp.zeros((2, 128, H, D))
  ids = jnp.ones((2, 128), jnp.int32)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules), splash.interpret_mode():
    with pytest.raises(ValueError, match="batch and heads only"):
      jax.eval_shape(splash.attention, q, q, q, ids, ids)


def test_config_accepts_splash():
  c = config_lib.resolve(config_lib.base_config())
  c.model.attention_impl = "splash"
  config_lib.validate(c, 1)
  c.model.attention_impl = "flash"
  with pytest.raises(ConfigError, match=re.escape("auto|xla|cudnn|splash, got 'flash'")):
    config_lib.validate(c, 1)
