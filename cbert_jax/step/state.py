"""The model and optimizer state on a mesh, abstractly: what train, evaluate and compile_check share.

`setup(config, model_cfg, mask_cfg, devices)` builds the mesh, the optimizer, the abstract
parameters and optimizer state with their shardings, allocating nothing (`State`).
`jit_train_step(state, microbatches)` is the jitted training step with those shardings, and
`abstract_step_inputs` the abstract arguments to lower it with, so `launch.compile_check` compiles
exactly the step `train.run` runs. `init(state, key)` makes real parameters and optimizer state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from cbert_jax.models import FAMILIES
from cbert_jax.step import guard, optim, sharding, steps


@dataclasses.dataclass(frozen=True)
class State:
  """A run's mesh, optimizer and abstract (shape + sharding only) parameters and optimizer state."""

  mesh: jax.sharding.Mesh
  rules: tuple  # logical axis -> mesh axes (config.sharding_rules)
  make_model: Callable[[Any], nnx.Module]  # key -> model
  graphdef: Any  # nnx graph definition of the model
  tx: optax.GradientTransformation
  lr_schedule: Callable[[Any], Any]  # step -> learning rate
  guard_cfg: guard.GuardConfig
  abs_params: Any  # ShapeDtypeStructs carrying their NamedShardings
  abs_opt_state: Any  # the same for AdamW's state
  param_shardings: Any
  opt_shardings: Any
  replicated: jax.sharding.NamedSharding
  batch_sharding: jax.sharding.NamedSharding  # [batch, seq] arrays


def abstract_model(model_name: str, model_cfg, mask_cfg, mesh, rules):
  """(make_model(key), graphdef, abstract params, their NamedShardings), allocating nothing."""
  family = FAMILIES[model_name]
  make_model = lambda key: family(model_cfg, mask_cfg, nnx.Rngs(params=key))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    abs_model = nnx.eval_shape(lambda: make_model(jax.random.key(0)))
    graphdef, abs_params, abs_rest = nnx.split(abs_model, nnx.Param, ...)
    if jax.tree.leaves(abs_rest):
      raise ValueError("models must hold only nnx.Param state (found other variables)")
    return make_model, graphdef, abs_params, nnx.get_named_sharding(abs_params, mesh)


def abstract_like(tree, shardings):
  """ShapeDtypeStructs of `tree` with the given shardings (targets for a restore or a lowering)."""
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
  )


def setup(config: ml_collections.ConfigDict, model_cfg, mask_cfg, devices) -> State:
  """The "mesh & abstract state" of a resolved, validated config on `devices`."""
  mesh = sharding.make_mesh(config.mesh, config.mesh_dcn, devices)
  rules = tuple(tuple(r) for r in config.sharding_rules)
  tx, lr_schedule = optim.make_optimizer(config.optim, config.total_steps)
  make_model, graphdef, abs_params, p_sh = abstract_model(
    config.model_name, model_cfg, mask_cfg, mesh, rules
  )
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    abs_opt = jax.eval_shape(tx.init, abs_params)  # AdamW mu, nu (+ counts)
    o_sh = nnx.get_named_sharding(abs_opt, mesh)
  return State(
    mesh=mesh,
    rules=rules,
    make_model=make_model,
    graphdef=graphdef,
    tx=tx,
    lr_schedule=lr_schedule,
    guard_cfg=guard.GuardConfig.from_config(config.faults),
    abs_params=abstract_like(abs_params, p_sh),
    abs_opt_state=abstract_like(abs_opt, o_sh),
    param_shardings=p_sh,
    opt_shardings=o_sh,
    replicated=sharding.replicated(mesh),
    batch_sharding=sharding.logical_sharding(mesh, rules, ("batch", "seq")),
  )


def init(state: State, key) -> tuple[Any, Any]:
  """Freshly initialised (params, opt_state), laid out as the shardings say."""

  def init_fn(key):
    params = nnx.state(state.make_model(key), nnx.Param)
    return params, state.tx.init(params)

  return jax.jit(init_fn, out_shardings=(state.param_shardings, state.opt_shardings))(key)


def jit_train_step(state: State, microbatches: int, traces: list | None = None):
  """The jitted train step: (params, opt_state, guard_state, batch, step, key) -> (params,
  opt_state, guard_state, metrics); params, optimizer and guard state are donated."""
  rep = state.replicated
  return jax.jit(
    steps.make_train_step(
      state.graphdef,
      state.tx,
      state.lr_schedule,
      [] if traces is None else traces,
      state.guard_cfg,
      microbatches=microbatches,
    ),
    in_shardings=(state.param_shardings, state.opt_shardings, rep, state.batch_sharding, rep, rep),
    out_shardings=(state.param_shardings, state.opt_shardings, rep, rep),
    donate_argnums=(0, 1, 2),
  )


def abstract_step_inputs(state: State, batch_size: int, seq_len: int) -> tuple:
  """Abstract (guard_state, batch, step, key) for lowering the train step without data."""
  rep = state.replicated
  guard_state = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), jax.eval_shape(guard.init_state)
  )  # {mean, var, count}: f32 []
  batch = {
    k: jax.ShapeDtypeStruct(
      (batch_size, seq_len), jnp.int32, sharding=state.batch_sharding
    )  # [batch, seq_len]
    for k in ("tokens", "positions", "segment_ids")
  }
  step = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
  key = jax.eval_shape(lambda: jax.random.key(0))  # a typed PRNG key, []
  return guard_state, batch, step, jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep)
