"""The whole sweep in this process: `python -m cbert_jax.main --config experiments/sweep.py[:scale]`.

Plans the members (`sweep.experiment.resolve_members`: the experiment file, the command line's overrides,
every member resolved and validated before anything trains), writes the sweep manifest
`<root>/sweep.json`, then for each member, smallest first:
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

import os
import time

import ml_collections
from absl import logging

from cbert_jax import evaluate, train
from cbert_jax.errors import CheckpointError, ConfigError
from cbert_jax.report import sweep_report
from cbert_jax.run import progress as progress_lib
from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib
from cbert_jax.sweep import experiment as experiment_lib


def run(config: ml_collections.ConfigDict, root: str) -> int:
  """Runs every member not yet done; returns the number of failed members."""
  root = os.path.abspath(root)
  scale, members = experiment_lib.resolve_members(config, root)
  experiment_lib.check_manifest(root, scale)
  probe = config.sweep.probe
  status_lib.write_json_atomic(
    os.path.join(root, experiment_lib.MANIFEST),
    experiment_lib.manifest(scale, config.sweep.experiment, members),
  )
  planned = {n: c.sweep.get("compute", 0.0) for n, _, c in members}
  total_compute = sum(planned.values())
  logging.info(
    "sweep %s: %d members, %.3g training FLOPs in all; %s",
    scale,
    len(members),
    total_compute,
    ", ".join(n for n, _, _ in members),
  )
  for source in sorted({c.sweep.get("laws_source", "") for _, _, c in members} - {""}):
    logging.info("LR and batch size from: %s", source)
  start = time.time()
  measured = {"flops": 0.0, "seconds": 0.0}  # members trained (not skipped) in this process
  states: dict[str, str] = {}
  errors: dict[str, str] = {}

  def done_compute() -> float:
    return sum(planned[n] for n, s in states.items() if s == "done")

  def report_progress(current: str | None) -> None:
    rate = measured["flops"] / measured["seconds"] if measured["seconds"] else 0.0
    remaining = total_compute - done_compute()
    eta = remaining / rate if rate else None
    n_done = sum(s == "done" for s in states.values())
    line = (
      f"sweep {scale}: {n_done}/{len(members)} members done "
      f"({100 * done_compute() / total_compute:.1f}% of the FLOPs), "
      f"{sum(s == 'failed' for s in states.values())} failed; elapsed "
      f"{progress_lib.format_duration(time.time() - start)}; ETA "
      + (
        f"{progress_lib.format_duration(eta)} at {rate:.3g} FLOP/s measured"
        if eta is not None
        else "after the first trained member"
      )
      + (f"; now: {current}" if current else "")
    )
    logging.info("%s", line)
    status_lib.write_json_atomic(
      os.path.join(root, status_lib.STATUS_FILE),
      {
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scale": scale,
        "progress": line,
        "flops_done": done_compute(),
        "flops_total": total_compute,
        "flops_per_sec": rate,
        "eta_s": eta,
        "members": [
          {
            "name": n,
            "workdir": os.path.join(root, n),
            "state": states.get(n, "pending"),
            "compute": planned[n],
            "error": errors.get(n, ""),
          }
          for n, _, _ in members
        ],
      },
    )

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
    logging.info(
      "[%d/%d] %s (%s): %d steps x %d rows, lr %.3g, N %d, %.3g FLOPs",
      i + 1,
      len(members),
      name,
      arg,
      cfg.total_steps,
      cfg.batch_size,
      cfg.optim.lr,
      cfg.sweep.get("n_params", 0),
      cfg.sweep.get("compute", 0.0),
    )
    t0 = time.time()
    try:
      summary = None
      if cfg.total_steps not in record_lib.checkpoint_steps(workdir):
        before = (record_lib.checkpoint_steps(workdir) or [0])[-1]
        summary = train.run(cfg, workdir)
        if summary.stopped_early:
          logging.warning(
            "sweep stopped at %s step %d (SIGTERM or stop_after_step); rerun the "
            "same command to resume",
            name,
            summary.final_step,
          )
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
      logging.error(
        "[%d/%d] %s FAILED: %s; continuing with the others", i + 1, len(members), name, errors[name]
      )
    report_progress(None)

  failed = [n for n, s in states.items() if s == "failed"]
  if config.sweep.report:
    try:
      path = sweep_report.write(root)
      logging.info("scaling report: %s", path)
    except Exception as e:  # pylint: disable=broad-except  (the members' results are safe on disk)
      logging.exception(
        "the scaling report failed (%s); the members are done -- rerun it with "
        "python -m cbert_jax.report --sweep %s",
        e,
        root,
      )
  logging.info(
    "sweep %s finished in %s: %d done, %d failed%s",
    scale,
    progress_lib.format_duration(time.time() - start),
    sum(s == "done" for s in states.values()),
    len(failed),
    f" ({', '.join(failed)})" if failed else "",
  )
  return len(failed)
