"""The whole sweep in this process: `python -m cbert_jax.main --config experiments/sweep.py[:scale]`.

Reads the members from the experiment file (`get_sweep(scale)`, `get_config(member)`, and
optionally `workdir_name(member)`; the default name is `<model>[-nocms]_<size>`), applies the
command line's `--config.X=V` overrides to every member, resolves and validates *all* of them
before anything trains (a bad field fails in seconds, not after the first member), writes the
sweep manifest `<root>/sweep.json`, then for each member, smallest first:
  * skips it when done (checkpoint of its final step + offline probe results: `status.is_done`);
  * otherwise trains it in `<root>/<member>` (`train.run` resumes an interrupted member from its
    latest checkpoint) and runs the offline probe suite on its final checkpoint (`evaluate.run`);
  * a member that fails (config, non-finite loss, checkpoint error) is marked `FAILED` with its
    one-line reason and the sweep goes on; SIGTERM (preemption) stops the sweep after the member's
    checkpoint, to be resumed by rerunning the same command.
JAX's persistent compilation cache is on (`<root>/compilation_cache` unless
`compilation_cache_dir` is set), so a shape compiled once (a rerun, a resumed member, the same
shape in the eval step) is not compiled again. After every member `<root>/sweep_status.json`
(state per member, FLOPs done, measured FLOP/s, ETA) is rewritten atomically and one progress line
is logged. At the end the scaling report (`cbert_jax.report`) is written to `<root>/report/`.
"""
from __future__ import annotations

import importlib.util
import os
import time

import ml_collections
from absl import logging

from cbert_jax import config_lib
from cbert_jax.errors import CheckpointError, ConfigError
from cbert_jax.scaling import status as status_lib

MANIFEST = "sweep.json"
# Fields of the whole-sweep config that are not per-member overrides.
_SWEEP_ONLY = ("mode", "name", "sweep.scale", "sweep.arg", "sweep.models", "sweep.sizes",
               "sweep.probe", "sweep.report", "sweep.experiment")


def load_experiment(path: str):
  if not path or not os.path.exists(path):
    raise ConfigError(f"sweep.experiment: no such experiment file {path!r}")
  spec = importlib.util.spec_from_file_location("cbert_sweep_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for fn in ("get_config", "get_sweep"):
    if not callable(getattr(module, fn, None)):
      raise ConfigError(f"sweep.experiment: {path} has no {fn}()")
  return module


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
  return {k: v for k, v in config_lib.leaves(config)
          if k not in _SWEEP_ONLY and (k not in base or base[k] != v)}


def _set(config: ml_collections.ConfigDict, path: str, value) -> None:
  *groups, leaf = path.split(".")
  node = config
  for g in groups:
    node = node[g]
  with node.unlocked():
    node[leaf] = value


def member_name(config: ml_collections.ConfigDict) -> str:
  cms = config.masking.cms or config.model_name != "crossbert"
  return f"{config.model_name}{'' if cms else '-nocms'}_{config.model.size or 'custom'}"


def plan(config: ml_collections.ConfigDict, root: str) -> tuple[str, list[tuple[str, str, ml_collections.ConfigDict]]]:
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
    name = experiment.workdir_name(arg) if hasattr(experiment, "workdir_name") else member_name(cfg)
    members.append((name, arg, cfg))
  if not members:
    raise ConfigError(f"sweep.models={config.sweep.models!r} / sweep.sizes={config.sweep.sizes!r} "
                      f"select no member of the {scale} sweep")
  return scale, members


def _check_manifest(root: str, scale: str) -> None:
  import json  # pylint: disable=import-outside-toplevel
  path = os.path.join(root, MANIFEST)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f).get("scale")
    if old and old != scale:
      raise ConfigError(f"{root} holds a {old} sweep; this is the {scale} sweep. Use another "
                        "--workdir")


def manifest(scale: str, experiment: str, members) -> dict:
  return {"scale": scale, "experiment": experiment,
          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "members": [{"name": n, "arg": a, "model": c.model_name, "size": c.model.size,
                       "cms": bool(c.masking.cms), "n_params": c.sweep.n_params,
                       "compute": c.sweep.compute, "tokens": c.sweep.tokens,
                       "steps": c.total_steps, "batch_size": c.batch_size, "lr": c.optim.lr,
                       "target_devices": c.sweep.target_devices, **memory_record(c)}
                      for n, a, c in members]}


def memory_record(c: ml_collections.ConfigDict) -> dict:
  """A member's memory plan for the manifests (empty without sweep.chip)."""
  s = c.sweep
  if not s.chip:
    return {}
  return {"memory": {"chip": s.chip, "setting": s.memory_setting, "verdict": s.memory_verdict,
                     "predicted_bytes": s.memory_bytes, "usable_bytes": s.memory_budget}}


def run(config: ml_collections.ConfigDict, root: str) -> int:
  """Runs every member not yet done; returns the number of failed members."""
  from cbert_jax import evaluate, metrics as metrics_lib, train  # pylint: disable=import-outside-toplevel
  root = os.path.abspath(root)
  scale, members = plan(config, root)
  _check_manifest(root, scale)
  probe = config.sweep.probe
  status_lib.write_json_atomic(os.path.join(root, MANIFEST),
                               manifest(scale, config.sweep.experiment, members))
  planned = {n: c.sweep.compute for n, _, c in members}
  total_compute = sum(planned.values())
  logging.info("sweep %s: %d members, %.3g training FLOPs in all; %s", scale, len(members),
               total_compute, ", ".join(n for n, _, _ in members))
  start = time.time()
  measured = {"flops": 0.0, "seconds": 0.0}    # members trained (not skipped) in this process
  states: dict[str, str] = {}
  errors: dict[str, str] = {}

  def done_compute() -> float:
    return sum(planned[n] for n, s in states.items() if s == "done")

  def report_progress(current: str | None) -> None:
    rate = measured["flops"] / measured["seconds"] if measured["seconds"] else 0.0
    remaining = total_compute - done_compute()
    eta = remaining / rate if rate else None
    n_done = sum(s == "done" for s in states.values())
    line = (f"sweep {scale}: {n_done}/{len(members)} members done "
            f"({100 * done_compute() / total_compute:.1f}% of the FLOPs), "
            f"{sum(s == 'failed' for s in states.values())} failed; elapsed "
            f"{metrics_lib.format_duration(time.time() - start)}; ETA "
            + (f"{metrics_lib.format_duration(eta)} at {rate:.3g} FLOP/s measured"
               if eta is not None else "after the first trained member")
            + (f"; now: {current}" if current else ""))
    logging.info("%s", line)
    status_lib.write_json_atomic(os.path.join(root, status_lib.STATUS_FILE), {
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scale": scale, "progress": line,
        "flops_done": done_compute(), "flops_total": total_compute,
        "flops_per_sec": rate, "eta_s": eta,
        "members": [{"name": n, "workdir": os.path.join(root, n), "state": states.get(n, "pending"),
                     "compute": planned[n], "error": errors.get(n, "")} for n, _, _ in members]})

  for name, _, _ in members:
    if status_lib.is_done(os.path.join(root, name), probe):
      states[name] = "done"
  report_progress(None)
  for i, (name, arg, cfg) in enumerate(members):
    workdir = os.path.join(root, name)
    if states.get(name) == "done":
      logging.info("[%d/%d] %s: done already, skipped", i + 1, len(members), name)
      continue
    states[name] = "running"
    status_lib.clear_failed(workdir)
    report_progress(name)
    logging.info("[%d/%d] %s (%s): %d steps x %d rows, lr %.3g, N %d, %.3g FLOPs", i + 1,
                 len(members), name, arg, cfg.total_steps, cfg.batch_size, cfg.optim.lr,
                 cfg.sweep.n_params, cfg.sweep.compute)
    t0 = time.time()
    try:
      summary = None
      if cfg.total_steps not in status_lib.checkpoint_steps(workdir):
        before = (status_lib.checkpoint_steps(workdir) or [0])[-1]
        summary = train.run(cfg, workdir)
        if summary.stopped_early:
          logging.warning("sweep stopped at %s step %d (SIGTERM or stop_after_step); rerun the "
                          "same command to resume", name, summary.final_step)
          states[name] = "pending"
          report_progress(None)
          return sum(s == "failed" for s in states.values())
        measured["flops"] += planned[name] * (1 - before / cfg.total_steps)
        measured["seconds"] += time.time() - t0
      if probe:
        eval_cfg = ml_collections.ConfigDict(cfg.to_dict())
        with eval_cfg.unlocked():
          eval_cfg.mode = "eval"
        evaluate.run(eval_cfg, workdir)
      states[name] = "done"
    except (ConfigError, CheckpointError, train.NonFiniteError) as e:
      states[name], errors[name] = "failed", f"{type(e).__name__}: {e}"
      status_lib.mark_failed(workdir, errors[name])
      logging.error("[%d/%d] %s FAILED: %s; continuing with the others", i + 1, len(members),
                    name, errors[name])
    report_progress(None)

  failed = [n for n, s in states.items() if s == "failed"]
  if config.sweep.report:
    try:
      from cbert_jax import report  # pylint: disable=import-outside-toplevel
      path = report.write(root)
      logging.info("scaling report: %s", path)
    except Exception as e:  # pylint: disable=broad-except  (the members' results are safe on disk)
      logging.exception("the scaling report failed (%s); the members are done -- rerun it with "
                        "python -m cbert_jax.report --sweep %s", e, root)
  logging.info("sweep %s finished in %s: %d done, %d failed%s", scale,
               metrics_lib.format_duration(time.time() - start),
               sum(s == "done" for s in states.values()), len(failed),
               f" ({', '.join(failed)})" if failed else "")
  return len(failed)
