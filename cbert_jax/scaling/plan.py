"""A sweep member's derived training plan: N, budget, compute, LR and batch from the laws.

`derive(config)` is called by `config_lib.resolve` for every config with
`sweep.tokens_per_param > 0`, so the plan is computed in one place whichever way the member is
started (the in-process sweep, `launch.sweep`, a single member by hand) and lands in the member's
config.json. Order (no circularity): N from the analytic parameter counts -> target tokens =
tokens_per_param x N -> compute C = training FLOPs per data token x target tokens -> lr(C), B(C)
from the laws (or N, `sweep.law_axis`) -> steps = ceil(target / (rows x seq_len)).
"""

from __future__ import annotations

import logging
import math

import ml_collections

from cbert_jax.errors import ConfigError
from cbert_jax.models import flops as flops_lib
from cbert_jax.models import model_config as model_config_lib
from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.scaling import budget as budget_lib
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.scaling import memory as memory_lib
from cbert_jax.step import mesh_shape

_BUDGET_WARNED: set[tuple[str, float]] = set()  # (laws source, budget) already warned about

# Ids only matter to the data path; FLOPs and counts do not depend on them.
_MASK_ID, _SPECIAL = 4, (0, 2, 3, 4)


def model_config(config: ml_collections.ConfigDict) -> tuple[ModelConfig, MaskConfig]:
  """The model and masking the member will train, before the tokenizer exists (vocabulary =
  model.vocab_size if set, else data.vocab_size: what a trained tokenizer gets)."""
  return model_config_lib.from_config(
    config, int(config.model.vocab_size or config.data.vocab_size), _MASK_ID, _SPECIAL
  )


def derive(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills total_steps, batch_size, optim.lr, checkpoint_every, eval_every and the member's derived
  record (`config_groups.SWEEP_DERIVED`, in its sweep group) of a resolved member config, in
  place."""
  s = config.sweep
  for name in ("checkpoints", "evals", "batch_multiple"):
    if s[name] < (1 if name != "evals" else 0):
      raise ConfigError(f"sweep.{name} must be >= {1 if name != 'evals' else 0}, got {s[name]}")
  if s.lr < 0 or s.batch_size < 0 or not s.lr_scale > 0:
    raise ConfigError(
      f"sweep.lr and sweep.batch_size must be >= 0 (0 = from the laws) and "
      f"sweep.lr_scale > 0; got {s.lr}, {s.batch_size}, {s.lr_scale}"
    )
  model_cfg, mask_cfg = model_config(config)
  seq_len = config.data.seq_len
  counts = flops_lib.param_counts(config.model_name, model_cfg)
  n = budget_lib.n_params(counts, s.n_definition)
  target = int(math.ceil(s.tokens_per_param * n))
  per_token = flops_lib.flops_per_token(config.model_name, model_cfg, mask_cfg, seq_len)
  compute = per_token * target
  laws = laws_lib.load(laws_lib.for_model(s.laws, config.model_name))
  lr, rows = laws_lib.suggest(
    laws, compute if s.law_axis == "compute" else n, seq_len, s.batch_multiple, s.law_axis
  )
  rows = s.batch_size or rows
  lr = s.lr or lr * s.lr_scale
  mismatch = laws.budget_mismatch(s.tokens_per_param) if not (s.lr and s.batch_size) else ""
  if mismatch and (laws.source, s.tokens_per_param) not in _BUDGET_WARNED:
    _BUDGET_WARNED.add((laws.source, s.tokens_per_param))  # once per laws and budget (a sweep
    logging.warning("sweep.laws: %s (%s)", mismatch, laws.source)  # resolves its members often)
  plan = budget_lib.make_budget(counts, s.n_definition, s.tokens_per_param, rows, seq_len)
  with config.unlocked():
    config.total_steps = plan.steps
    config.batch_size = plan.batch_size
    config.optim.lr = float(lr)
    config.checkpoint_every = max(1, -(-plan.steps // s.checkpoints))
    # validation evals land on log steps (a multiple of log_every), about sweep.evals per run
    every = (
      max(1, round(plan.steps / s.evals / config.log_every)) * config.log_every if s.evals else 0
    )
    config.eval_every = every if every < plan.steps else 0
    s.n_params = plan.n_params
    s.target_tokens = plan.target_tokens
    s.tokens = plan.tokens
    s.compute = float(per_token * plan.tokens)
    explicit = [f"sweep.{k}" for k in ("lr", "batch_size") if s[k]]
    s.laws_source = (
      f"{' and '.join(explicit)} set explicitly; laws otherwise: {laws.source}"
      if explicit
      else laws.source
    )
    # the memory plan's record (config_groups.SWEEP_DERIVED): set by plan_memory with sweep.chip
    s.memory_setting, s.memory_verdict, s.memory_bytes, s.memory_budget = "", "", 0.0, 0.0
  if s.chip:
    plan_memory(config)
  return config


def mesh_sizes(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
  """{data, fsdp, tensor}: the member's mesh on `num_devices` devices (ICI x DCN)."""
  return mesh_shape.axis_sizes(config.mesh, num_devices, config.mesh_dcn)


def memory_shape(config: ml_collections.ConfigDict, num_devices: int) -> memory_lib.Shape:
  """The memory model's view of a resolved member on `num_devices` devices."""
  model_cfg, mask_cfg = model_config(config)
  _, dcn = mesh_shape.mesh_shape(config.mesh, num_devices, config.mesh_dcn)
  return memory_lib.shape_of(
    config.model_name,
    model_cfg,
    mask_cfg,
    config.data.seq_len,
    config.batch_size,
    mesh_sizes(config, num_devices),
    dict(zip(mesh_shape.AXES, dcn)),
  )


def current_setting(config: ml_collections.ConfigDict) -> memory_lib.Setting:
  return memory_lib.Setting(
    config.model.remat, int(config.model.ce_chunk), int(config.optim.microbatches)
  )


def plan_memory(config: ml_collections.ConfigDict) -> memory_lib.Plan:
  """The member's memory plan on `sweep.chip` x `sweep.target_devices`: with sweep.memory=auto,
  sets model.remat, model.ce_chunk and optim.microbatches to the least costly setting that fits
  (unchanged when none fits); records setting, verdict and bytes in sweep.memory_*."""
  s = config.sweep
  if s.chip not in memory_lib.CHIPS:
    raise ConfigError(
      f"sweep.chip={s.chip!r}: expected one of {', '.join(memory_lib.CHIPS)} "
      '(or "" for no memory plan)'
    )
  if s.memory not in ("auto", "check"):
    raise ConfigError(f"sweep.memory must be auto|check, got {s.memory!r}")
  if s.target_devices <= 0:
    raise ConfigError(
      f"sweep.chip={s.chip} needs sweep.target_devices > 0 (the chips the memory plan is for)"
    )
  shape = memory_shape(config, s.target_devices)
  result = memory_lib.plan(shape, s.chip, None if s.memory == "auto" else current_setting(config))
  chosen = result.setting or current_setting(config)
  with config.unlocked():
    if s.memory == "auto" and result.setting is not None:
      config.model.remat = chosen.remat
      config.model.ce_chunk = chosen.ce_chunk
      config.optim.microbatches = chosen.microbatches
    s.memory_setting = chosen.describe()
    s.memory_verdict = result.verdict
    s.memory_bytes = float(result.predicted["total"])
    s.memory_budget = float(result.budget)
  return result
