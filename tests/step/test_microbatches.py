"""Gradient accumulation (optim.microbatches = k): k = 1, 2, 4 train identically, sharded or not.

Every run starts from the same parameters and takes 3 AdamW steps on one packed batch whose rows
have very different amounts of padding, so the micro-batches' target counts differ (a mean of
micro-batch means would not be the full batch's loss). Each run is compared with the unsharded
k = 1 run: losses, every metric (grad_norm, param_norm, masked_acc, ..., the guard's grad_sq) and
the final parameters, to rtol 1e-5 / atol 1e-6. (A small LR: AdamW's g / sqrt(v) magnifies the
last-bit differences of summation order in near-zero gradients; at 3e-3 the worst difference
measured is about a third of the tolerance.) Models: d 32, 2 layers (ELECTRA 1), T = 16, B = 32.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from cbert_jax import config_groups, config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.step import guard, optim, sharding, steps
from tests import helpers

B, T, STEPS = 32, 16, 3
RULES = config_groups.DEFAULT_RULES
MODELS = {
  "bert": ("bert", {}),
  "crossbert_cms": ("crossbert", {"cms": True}),
  "electra": ("electra", {}),
}
MESHES = {"data": {"data": 8, "fsdp": 1, "tensor": 1}, "fsdp": {"data": 1, "fsdp": 8, "tensor": 1}}
GUARD = guard.GuardConfig(spike="warn", warmup=0)
# LLVM at -O0 halves the CPU compile time of these tiny steps; every comparison is between runs
# compiled alike, and the cost and memory analyses are of the optimised HLO either way.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def padded_batch() -> dict:
  """helpers.packed_batch with each row cut to its own length (1 to T real tokens): with K = 3
  BERT targets per row, the short rows have weight-0 targets, so counts differ per micro-batch."""
  batch = helpers.packed_batch(b=B, t=T, seed=1)
  lengths = np.random.RandomState(2).randint(1, T + 1, B)
  lengths[:4] = (1, 2, 16, 16)
  for r, n in enumerate(lengths):
    for key in batch:
      batch[key][r, n:] = 0
  return batch


def _optimizer():
  c = ml_collections.ConfigDict(config_lib.base_config().optim.to_dict())
  c.lr, c.warmup_steps, c.schedule = 3e-3, 1, "constant"
  return optim.make_optimizer(c, 10)


def run(model: str, mesh_name: str | None, k: int, guarded: bool = True):
  """`_run`, cached whichever way the arguments are passed (each run compiles once per file)."""
  return _run(model, mesh_name, k, guarded)


@functools.cache
def _run(model: str, mesh_name: str | None, k: int, guarded: bool):
  """STEPS steps of `model` with k micro-batches -> (host metrics per step, final params, traced
  step, compiled step). mesh_name None: plain jit of the guarded step (as the trainer has it) or,
  guarded=False, of the plain one; else the trainer's layout: guarded step, shardings, donation."""
  name, kw = MODELS[model]
  cfg = helpers.model_cfg(d_model=32, num_layers=1 if name == "electra" else 2)
  graphdef, params = nnx.split(helpers.build(name, cfg=cfg, **kw), nnx.Param)
  tx, lr = _optimizer()
  batch, key = padded_batch(), jax.random.key(3)
  metrics = []
  if mesh_name is None:
    opt_state, guard_state = tx.init(params), guard.init_state()
    state = (params, opt_state, guard_state) if guarded else (params, opt_state)
    step = jax.jit(
      steps.make_train_step(graphdef, tx, lr, guard_cfg=GUARD if guarded else None, microbatches=k)
    )
    traced = step.trace(*state, batch, jnp.int32(0), key)
    compiled = traced.lower().compile(compiler_options=FAST_COMPILE)
    for i in range(STEPS):
      *state, m = compiled(*state, batch, jnp.int32(i), key)
      metrics.append(jax.device_get(m))
    return metrics, jax.device_get(state[0]), traced, compiled
  mesh = sharding.make_mesh(MESHES[mesh_name])
  with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES):
    p_sh = nnx.get_named_sharding(params, mesh)
    o_sh = nnx.get_named_sharding(jax.eval_shape(tx.init, params), mesh)
    rep = sharding.replicated(mesh)
    batch_sh = sharding.logical_sharding(mesh, RULES, ("batch", "seq"))
    params = jax.device_put(params, p_sh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    guard_state = guard.init_state()
    batch = jax.device_put(batch, batch_sh)
    step = jax.jit(
      steps.make_train_step(graphdef, tx, lr, guard_cfg=GUARD, microbatches=k),
      in_shardings=(p_sh, o_sh, rep, batch_sh, rep, rep),
      out_shardings=(p_sh, o_sh, rep, rep),
      donate_argnums=(0, 1, 2),
    )
    traced = step.trace(params, opt_state, guard_state, batch, jnp.int32(0), key)
    compiled = traced.lower().compile(compiler_options=FAST_COMPILE)
    for i in range(STEPS):
      params, opt_state, guard_state, m = compiled(
        params, opt_state, guard_state, batch, jnp.int32(i), key
      )
      metrics.append(jax.device_get(m))
    assert isinstance(jax.tree.leaves(params)[0].sharding, NamedSharding)
    return metrics, jax.device_get(params), traced, compiled


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def assert_same_run(got, want):
  (m_got, p_got, *_), (m_want, p_want, *_) = got, want
  for step, (a, b) in enumerate(zip(m_got, m_want, strict=True)):
    for key in a.keys() & b.keys():  # an unguarded run has no guard metrics (grad_sq, ...)
      for x, y in zip(jax.tree.leaves(a[key]), jax.tree.leaves(b[key]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=f"{key} @ {step}")
  for a, b in zip(jax.tree.leaves(p_got), jax.tree.leaves(p_want), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_batch_has_different_counts_per_microbatch():
  real = (padded_batch()["segment_ids"] != 0).sum(1)  # [B]
  for k in (2, 4):
    per_micro = real.reshape(B // k, k).sum(0)  # micro-batch i: rows i, i+k, ...
    assert len(set(per_micro.tolist())) > 1, per_micro
  assert (real < 3).any()  # BERT rows with < K targets


@pytest.mark.parametrize("mesh_name", [None, "data", "fsdp"])
@pytest.mark.parametrize("model", ["bert", "crossbert_cms"])
def test_microbatches_train_like_the_full_batch(model, mesh_name):
  ref = run(model, None, 1)
  assert ref[0][-1]["loss"] < ref[0][0]["loss"]  # it trains
  # Sharded: k = 4, the extreme case on 8 devices (one row per device per micro-batch), against
  # the unsharded full-batch run. (More sharded runs add compile time, not coverage.)
  for k in (2, 4) if mesh_name is None else (4,):
    # CrossBERT's k = 2: the plain step (no guard), which the trainer does not use.
    assert_same_run(run(model, mesh_name, k, guarded=(model, k) != ("crossbert_cms", 2)), ref)


def test_electra_microbatches_train_like_the_full_batch():
  # Sharded k = 4 (guarded, as the trainer runs it) against the plain unsharded full-batch step.
  assert_same_run(run("electra", "fsdp", 4), run("electra", None, 1, False))


def test_k1_has_no_scan_and_the_count_prepass_is_dead_code():
  """k = 1 is the single-pass program; for k > 1 XLA's cost analysis counts a loop body once, so
  the k = 4 step's FLOPs are C4 + 3 x (one micro-batch) with one micro-batch = C2 - C4; the
  full-batch pass that only yields the target counts must add (almost) nothing."""
  (t1, c1), (_, c2), (t4, c4) = (run("bert", None, k)[2:] for k in (1, 2, 4))
  assert "scan" not in str(t1.jaxpr) and "scan" in str(t4.jaxpr)
  flops = {k: _flops(c) for k, c in ((1, c1), (2, c2), (4, c4))}
  total4 = flops[4] + 3 * (flops[2] - flops[4])
  assert abs(total4 / flops[1] - 1) < 0.05, flops
  # Activation memory shrinks with k.
  temp = {k: c.memory_analysis().temp_size_in_bytes for k, c in ((1, c1), (2, c2), (4, c4))}
  assert temp[4] < temp[2] < temp[1], temp


@pytest.mark.parametrize("model", ["bert", "crossbert_cms"])
def test_the_split_moves_no_rows(model):
  """The [B, T] -> [k, B/k, T] split keeps every device's rows local: no all-to-all or
  collective-permute appears in the sharded steps with k = 4 (those of the test above)."""
  for mesh_name in MESHES:
    text = run(model, mesh_name, 4)[3].as_text()
    assert "all-to-all" not in text and "collective-permute" not in text, mesh_name


def test_bad_microbatches_are_one_line_config_errors():
  c = config_lib.resolve(config_lib.base_config())
  c.batch_size, c.optim.microbatches = 32, 3
  with pytest.raises(
    ConfigError,
    match=r"batch_size=32 is not divisible by optim.microbatches=3 "
    r"x the data-parallel size 8 \(= 24\)",
  ) as e:
    config_lib.validate(c, 8)
  assert "\n" not in str(e.value)
  c.optim.microbatches = 0
  with pytest.raises(ConfigError, match="optim.microbatches must be >= 1"):
    config_lib.validate(c, 8)
  c.optim.microbatches = 4
  config_lib.validate(c, 8)  # 32 = 4 x 8
  # The step itself refuses a batch it cannot split (e.g. called outside the trainer).
  graphdef, params = nnx.split(helpers.build("bert"), nnx.Param)
  tx, lr = _optimizer()
  step = steps.make_train_step(graphdef, tx, lr, microbatches=3)
  with pytest.raises(ConfigError, match="batch_size=32 is not divisible by optim.microbatches=3"):
    jax.eval_shape(step, params, tx.init(params), padded_batch(), jnp.int32(0), jax.random.key(0))
