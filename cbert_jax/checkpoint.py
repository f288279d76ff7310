"""Checkpoints with orbax: parameters + optimizer state + data-iterator state + step, in one step dir.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a run
killed mid-write never leaves a checkpoint that `latest_step` would pick up. Saves are asynchronous
(the loop continues while arrays are written); `wait` blocks until the last one is on disk.
Restoring targets abstract arrays that carry the *current* mesh's shardings, so a checkpoint
restores onto a different mesh or device count (orbax reshards).

Faults: `restore_latest` falls back to the previous checkpoint when the newest cannot be read
(files missing or truncated), moving the unreadable one aside to `<dir>.unreadable/<step>` (kept
for inspection, out of the manager's way) and saying so in the log. A full disk while saving
raises `CheckpointError` naming the directory and the last complete checkpoint; the partial write
stays in orbax's temporary directory, which is never picked up.
"""
import contextlib
import errno
import os
import shutil
import time

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from cbert_jax.errors import CheckpointError


class Checkpointer:
  """A thin adapter over `ocp.CheckpointManager`, so orbax API churn stays in one file."""

  def __init__(self, directory: str, keep: int, async_save: bool = True):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._dir = directory
    self._mngr = ocp.CheckpointManager(directory, options=options)

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def save(self, step: int, params, opt_state, data_state: dict, meta: dict) -> None:
    """Start writing checkpoint `step` (returns before the write finishes; see `wait`)."""
    with self._disk_errors(step):
      self._mngr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
          data=ocp.args.JsonSave(data_state),
          meta=ocp.args.JsonSave(meta)), force=True)

  @contextlib.contextmanager
  def _disk_errors(self, step: int | None):
    """An OSError while writing checkpoint `step` (None: an earlier asynchronous save) --
    ENOSPC, EDQUOT, EIO, ... -- becomes one CheckpointError naming the last complete one."""
    try:
      yield
    except OSError as err:
      cause = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}.get(
          err.errno, f"the write failed ({err})")
      done = [s for s in self._mngr.all_steps() if s != step]
      what = f"checkpoint step {step}" if step is not None else "a checkpoint"
      raise CheckpointError(
          f"could not write {what} to {self._dir}: {cause}. The last complete checkpoint is step "
          f"{max(done) if done else None}; the partial write is in a temporary directory that is "
          "never resumed from. Free space and rerun the same command to resume") from err

  def restore_latest(self, abstract_params, abstract_opt_state):
    """The newest *readable* checkpoint -> (step, params, opt_state, data_state, meta), or None
    when there is no checkpoint. An unreadable one is moved to `<dir>.unreadable/<step>` with a
    warning and the previous one is tried; CheckpointError if none can be read."""
    errors = []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      try:
        return (step, *self.restore(step, abstract_params, abstract_opt_state))
      except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many types)
        errors.append(f"step {step}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        aside = self._move_aside(step)
        logging.warning("checkpoint step %d in %s cannot be read (%s); moved it to %s and falling "
                        "back to the previous checkpoint", step, self._dir, errors[-1], aside)
    if errors:
      raise CheckpointError(f"no checkpoint in {self._dir} can be read ({'; '.join(errors)}); the "
                            f"unreadable ones were moved to {self._dir}.unreadable/. Start a new "
                            "run in another --workdir, or restore a checkpoint from a backup")
    return None

  def _move_aside(self, step: int) -> str:
    dest = os.path.join(f"{self._dir}.unreadable", f"{step}-{int(time.time())}")
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.move(os.path.join(self._dir, str(step)), dest)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint_move_aside_{step}")
    self._mngr.reload()
    return dest

  def restore(self, step: int, abstract_params, abstract_opt_state):
    """-> (params, opt_state, data_state, meta), arrays laid out as the abstract targets say."""
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore({"params": abstract_params, "opt_state": abstract_opt_state}),
        data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return out.state["params"], out.state["opt_state"], out.data, out.meta

  def restore_params(self, step: int, abstract_params):
    """Only the parameters of checkpoint `step` (evaluation needs no optimizer state)."""
    target = {"params": abstract_params}
    out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)))
    return out.state["params"]

  def wait(self) -> None:
    with self._disk_errors(None):
      self._mngr.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._mngr.close()


def abstract_like(tree, shardings):
  """ShapeDtypeStructs of `tree` with the given shardings (targets for a restore)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)
