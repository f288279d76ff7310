"""Checkpoints with orbax: parameters + optimizer state + data-iterator state + step, in one step dir.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a run
killed mid-write never leaves a checkpoint that `latest_step` would pick up. Saves are asynchronous
(the loop continues while arrays are written); `wait` blocks until the last one is on disk.
Restoring targets abstract arrays that carry the *current* mesh's shardings, so a checkpoint
restores onto a different mesh or device count (orbax reshards).
"""
import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """A thin adapter over `ocp.CheckpointManager`, so orbax API churn stays in one file."""

  def __init__(self, directory: str, keep: int, async_save: bool = True):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._mngr = ocp.CheckpointManager(directory, options=options)

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def save(self, step: int, params, opt_state, data_state: dict, meta: dict) -> None:
    """Start writing checkpoint `step` (returns before the write finishes; see `wait`)."""
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta)), force=True)

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
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


def abstract_like(tree, shardings):
  """ShapeDtypeStructs of `tree` with the given shardings (targets for a restore)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)
