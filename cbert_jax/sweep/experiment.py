"""A sweep's members: the experiment file, the command line's overrides, names and the manifest.

`plan(config, root)` reads the members from the experiment file (`get_sweep(scale)`,
`get_config(member)`, optionally `workdir_name(member)`; the default name is
`<model>[-nocms]_<size>`), applies the command line's `--config.X=V` overrides to every member and
resolves and validates *all* of them, so a bad field fails in seconds, not after the first member.
`manifest` is `<root>/sweep.json`. Used by the in-process sweep (`cbert_jax.sweep`),
`launch.sweep` and `launch.compile_check`; it resolves configs, so it sits with `config_lib`.
"""

from __future__ import annotations

import os
import time

import ml_collections

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError

MANIFEST = "sweep.json"
# Fields of the whole-sweep config that are not per-member overrides.
_SWEEP_ONLY = (
  "mode",
  "name",
  "sweep.scale",
  "sweep.arg",
  "sweep.models",
  "sweep.sizes",
  "sweep.probe",
  "sweep.report",
  "sweep.experiment",
)


def load_experiment(
  path: str,
  *,
  field: str = "sweep.experiment",
  needs: tuple[str, ...] = ("get_config", "get_sweep"),
):
  """The sweep experiment file `path` as a module (config_lib.import_experiment)."""
  return config_lib.import_experiment(path, field=field, needs=needs)


def resolve_scale(scale: str) -> str:
  """`auto` -> cpu on a CPU-only machine, paper where there is an accelerator."""
  if scale != "auto":
    return scale
  import jax  # pylint: disable=import-outside-toplevel

  return "cpu" if jax.default_backend() == "cpu" else "paper"


def overrides(config: ml_collections.ConfigDict, fresh: ml_collections.ConfigDict) -> dict:
  """The fields the command line changed: where `config` differs from the experiment file's own
  config for the same arg (`fresh`), sweep-level fields excluded."""
  base = dict(config_lib.leaves(fresh))
  return {
    k: v
    for k, v in config_lib.leaves(config)
    if k not in _SWEEP_ONLY and (k not in base or base[k] != v)
  }


def _set(config: ml_collections.ConfigDict, path: str, value) -> None:
  *groups, leaf = path.split(".")
  node = config
  for g in groups:
    node = node[g]
  with node.unlocked():
    node[leaf] = value


def member_name(model: str, size: str, cms: bool = True, seed: int = 0) -> str:
  """A sweep member's name and sub-workdir: bert_d64L2, crossbert_d96L3, crossbert-nocms_d96L3;
  seed k > 0 adds _s<k> (bert_d64L2_s1)."""
  return f"{model}{'' if cms or model != 'crossbert' else '-nocms'}_{size}" + (
    f"_s{seed}" if seed else ""
  )


def config_member_name(config: ml_collections.ConfigDict) -> str:
  """`member_name` of a member's config."""
  return member_name(
    config.model_name, config.model.size or "custom", config.masking.cms, int(config.seed)
  )


def resolve_members(
  config: ml_collections.ConfigDict, root: str
) -> tuple[str, list[tuple[str, str, ml_collections.ConfigDict]]]:
  """(scale, [(member name, its arg, its resolved config)]) with the overrides applied; every
  member is validated against this machine's devices unless it is planned for other hardware."""
  experiment = load_experiment(config.sweep.experiment)
  scale = resolve_scale(config.sweep.scale)
  fresh = experiment.get_config(config.sweep.arg or None)
  changed = overrides(config, fresh)
  want_models = [m.strip() for m in config.sweep.models.split(",") if m.strip()]
  want_sizes = [s.strip() for s in config.sweep.sizes.split(",") if s.strip()]
  cache = config.compilation_cache_dir or os.path.join(os.path.abspath(root), "compilation_cache")
  import jax  # pylint: disable=import-outside-toplevel

  members = []
  for arg in experiment.get_sweep(scale):
    cfg = experiment.get_config(arg)
    for path, value in changed.items():
      _set(cfg, path, value)
    with cfg.unlocked():
      cfg.compilation_cache_dir = cache
    cfg = config_lib.resolve(cfg)
    if want_models and cfg.model_name not in want_models:
      continue
    if want_sizes and cfg.model.size not in want_sizes:
      continue
    devices = jax.device_count() if cfg.num_devices <= 0 else cfg.num_devices
    if not cfg.sweep.target_devices or cfg.sweep.target_devices == devices:
      config_lib.validate(cfg, devices)
    name = (
      experiment.workdir_name(arg)
      if hasattr(experiment, "workdir_name")
      else config_member_name(cfg)
    )
    members.append((name, arg, cfg))
  if not members:
    raise ConfigError(
      f"sweep.models={config.sweep.models!r} / sweep.sizes={config.sweep.sizes!r} "
      f"select no member of the {scale} sweep"
    )
  return scale, members


def check_manifest(root: str, scale: str) -> None:
  import json  # pylint: disable=import-outside-toplevel

  path = os.path.join(root, MANIFEST)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f).get("scale")
    if old and old != scale:
      raise ConfigError(
        f"{root} holds a {old} sweep; this is the {scale} sweep. Use another --workdir"
      )


def manifest(scale: str, experiment: str, members) -> dict:
  return {
    "scale": scale,
    "experiment": experiment,
    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "members": [
      {
        "name": n,
        "arg": a,
        "model": c.model_name,
        "size": c.model.size,
        "cms": bool(c.masking.cms),
        "n_params": c.sweep.get("n_params", 0),
        "compute": c.sweep.get("compute", 0.0),
        "tokens": c.sweep.get("tokens", 0),
        "steps": c.total_steps,
        "batch_size": c.batch_size,
        "lr": c.optim.lr,
        "target_devices": c.sweep.target_devices,
        **memory_record(c),
      }
      for n, a, c in members
    ],
  }


def memory_record(c: ml_collections.ConfigDict) -> dict:
  """A member's memory plan for the manifests (empty without sweep.chip)."""
  s = c.sweep
  if not s.get("memory_verdict"):  # no sweep.chip, or not a member (plan.derive records it)
    return {}
  return {
    "memory": {
      "chip": s.chip,
      "setting": s.memory_setting,
      "verdict": s.memory_verdict,
      "predicted_bytes": s.memory_bytes,
      "usable_bytes": s.memory_budget,
    }
  }
