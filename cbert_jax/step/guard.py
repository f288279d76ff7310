"""Numerical faults: non-finite losses and loss spikes, detected without a host sync per step.

Inside the jitted train step (`step_check`), a loss spike is judged against an exponential
moving average of the loss and of its variance, carried from step to step as a small `GuardState`
(checkpointed with the run so a resumed run judges exactly as an uninterrupted one):

  spike  <=>  count >= warmup  and  loss - mean > max(threshold * std, min_jump * |mean|)

A spike's loss is not folded into the average. `faults.spike` decides what happens:
  off       nothing (the statistics are still tracked and logged as train/loss_z)
  warn      log a warning, keep the update
  skip      the step's update is not applied (parameters and optimizer state stay as they
            were; decided on the device, so no host sync), the step counter moves on
  rollback  restore the last checkpoint and continue with the data iterator advanced past the
            offending batch (decided on the host at the next sync)
Per-step metrics stay on the device until the loop's next sync (a log step or a checkpoint), where
`scan` finds the first non-finite step and every spike among them; the offending batch and the
per-parameter gradient norms of that step are written by `save_diagnostics`. Non-finite loss or
gradients always stop the run (see train.NonFiniteError).

Why not optax.apply_if_finite / skip_not_finite: they only see gradients, not the loss, so they
cannot judge a spike, and they skip silently where we want to stop and name the step.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbert_jax.errors import ConfigError

MODES = ("off", "warn", "skip", "rollback")


@dataclasses.dataclass(frozen=True)
class GuardConfig:
  """config.faults as the step sees it (see config_lib.base_config for each field)."""

  spike: str = "off"
  threshold: float = 6.0
  min_jump: float = 0.1
  ema: float = 0.98
  warmup: int = 50
  plant_nan_step: int = 0

  @classmethod
  def from_config(cls, faults) -> GuardConfig:
    cfg = cls(**{f.name: faults[f.name] for f in dataclasses.fields(cls)})
    if cfg.spike not in MODES:
      raise ConfigError(f"faults.spike must be one of {'|'.join(MODES)}, got {cfg.spike!r}")
    if not 0 < cfg.ema < 1:
      raise ConfigError(f"faults.ema must be in (0, 1), got {cfg.ema}")
    if cfg.threshold <= 0 or cfg.min_jump < 0 or cfg.warmup < 0:
      raise ConfigError(
        "faults.threshold must be > 0 and faults.min_jump, faults.warmup >= 0 "
        f"(got {cfg.threshold}, {cfg.min_jump}, {cfg.warmup})"
      )
    return cfg


def init_state() -> dict[str, jax.Array]:
  """The loss statistics before the first step: {mean, var, count} float32 scalars."""
  return {"mean": jnp.float32(0), "var": jnp.float32(0), "count": jnp.float32(0)}


def state_to_json(state) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(state).items()}


def state_from_json(d: dict | None) -> dict[str, jax.Array]:
  return init_state() if not d else {k: jnp.float32(d[k]) for k in ("mean", "var", "count")}


def plant(cfg: GuardConfig, loss: jax.Array, step: jax.Array) -> jax.Array:
  """Test hook: the loss (and so every gradient) of update `plant_nan_step` (1-based) becomes NaN.
  A static no-op when the step is 0."""
  if cfg.plant_nan_step > 0:
    # A factor, not where(cond, NaN, loss): where's gradient would be 0 * NaN = NaN on every step.
    loss = loss * jnp.where(step + 1 == cfg.plant_nan_step, jnp.nan, 1.0)
  return loss


def planted_batches(spec: str) -> set[int]:
  """faults.plant_spike_batches "9,12" -> {9, 12} (1-based global batch numbers)."""
  try:
    return {int(x) for x in spec.split(",") if x.strip()}
  except ValueError as e:
    raise ConfigError(
      f"faults.plant_spike_batches must be comma-separated integers, got {spec!r}"
    ) from e


def corrupt(batch: dict, token: int) -> dict:
  """A bad batch, as a test plant: every real token replaced by one (rare) token id, which the
  model predicts badly, so the loss jumps. Padding stays padding."""
  tokens = np.where(batch["segment_ids"] != 0, token, batch["tokens"]).astype(batch["tokens"].dtype)
  return dict(batch, tokens=tokens)


def step_check(cfg: GuardConfig, state: dict, loss: jax.Array):
  """-> (spike [] bool, apply_update [] bool, new state, metrics). Pure; runs inside jit."""
  loss = loss.astype(jnp.float32)
  mean, var, count = state["mean"], state["var"], state["count"]
  std = jnp.sqrt(var)
  excess = loss - mean
  finite = jnp.isfinite(loss)
  spike = (count >= cfg.warmup) & (
    excess > jnp.maximum(cfg.threshold * std, cfg.min_jump * jnp.abs(mean))
  )
  spike = spike & finite
  take = finite & ~spike  # fold this loss into the statistics
  b = cfg.ema
  new_mean = jnp.where(count == 0, loss, b * mean + (1 - b) * loss)
  new_var = jnp.where(count == 0, 0.0, b * (var + (1 - b) * excess * excess))
  new = {
    "mean": jnp.where(take, new_mean, mean),
    "var": jnp.where(take, new_var, var),
    "count": count + take.astype(jnp.float32),
  }
  apply = ~spike if cfg.spike == "skip" else jnp.bool_(True)
  metrics = {
    "spike": spike.astype(jnp.float32),
    "loss_z": jnp.where(std > 0, excess / jnp.maximum(std, 1e-12), 0.0),
    "skipped": (~apply).astype(jnp.float32),
  }
  return spike, apply, new, metrics


def grad_sq_by_param(grads) -> dict[str, jax.Array]:
  """{parameter path: sum of squared gradient entries} (float32 scalars)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(grads)
  return {_path_name(p): jnp.sum(jnp.square(g.astype(jnp.float32))) for p, g in flat}


def _path_name(path) -> str:
  parts = []
  for k in path:
    key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
    parts.append(str(key))
  return "/".join(p for p in parts if p != "value")


def per_layer_norms(grad_sq: dict[str, float]) -> dict[str, float]:
  """Gradient norms grouped by layer: 'encoder/blocks/3/...' -> 'encoder/blocks/3'; other
  parameters by their module path (the name without the final parameter name)."""
  groups: dict[str, float] = {}
  for name, sq in grad_sq.items():
    parts = name.split("/")
    if "blocks" in parts and parts.index("blocks") + 1 < len(parts):
      key = "/".join(parts[: parts.index("blocks") + 2])
    else:
      key = "/".join(parts[:-1]) or name
    groups[key] = groups.get(key, 0.0) + float(sq)
  return {k: float(np.sqrt(v)) for k, v in sorted(groups.items())}


@dataclasses.dataclass
class Finding:
  """The first non-finite step and every spike among a window of steps."""

  nonfinite_step: int | None
  spike_steps: list[int]


def scan(pending: list[tuple[int, dict]]) -> Finding:
  """pending: [(step, host metrics)] in step order (metrics already fetched to the host)."""
  nonfinite = None
  spikes = []
  for step, m in pending:
    if nonfinite is None and not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
      nonfinite = step
    if m.get("spike", 0) > 0:
      spikes.append(step)
  return Finding(nonfinite, spikes)


def save_diagnostics(
  workdir: str, step: int, reason: str, metrics: dict, batch: dict | None
) -> str:
  """Write workdir/diagnostics/step_<step>/{batch.npz, report.json}; returns the directory.

  batch: this process's rows of the step ({key: [LB, T]}); metrics: the step's host metrics,
  including `grad_sq` ({parameter path: squared norm}).
  """
  out = os.path.join(workdir, "diagnostics", f"step_{step}")
  os.makedirs(out, exist_ok=True)
  if batch is not None:
    np.savez_compressed(
      os.path.join(out, "batch.npz"), **{k: np.asarray(v) for k, v in batch.items()}
    )
  grad_sq = metrics.get("grad_sq", {})
  report: dict[str, Any] = {
    "step": step,
    "reason": reason,
    "metrics": {k: float(v) for k, v in metrics.items() if k != "grad_sq"},
    "grad_norm_per_layer": per_layer_norms(grad_sq),
    "grad_norm_per_param": {k: float(np.sqrt(v)) for k, v in sorted(grad_sq.items())},
  }
  with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f, indent=2, default=str)
  return out
