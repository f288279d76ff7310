"""Planned vs actual devices: a sweep member planned for N chips refuses to train on any other count.

A member's batch, learning rate and memory plan are derived for `sweep.target_devices` chips
(`cbert_jax/scaling/plan.py`). A launch that silently gets fewer devices (one process per node
under SLURM, where JAX then gives each process the single GPU numbered SLURM_LOCALID; a multi-host
job started without `--multiprocess`; a smaller allocation than asked for) would still run,
because the batch divides the smaller mesh, but at another per-device batch and memory than
planned, and a 64-chip member would quietly train on 8. `check` turns that into one line, before
any data preparation.
"""

from __future__ import annotations

import os

from cbert_jax.errors import ConfigError


def check(
  target: int,
  num_devices: int,
  *,
  process_count: int,
  local_devices: int,
  platform: str,
  num_devices_flag: int = 0,
  env: dict | None = None,
) -> None:
  """Raise ConfigError when a member planned for `target` devices sees `num_devices` (0 = no plan).

  Args:
    target: `sweep.target_devices` (0: not planned for a device count; nothing to check).
    num_devices: the devices the run would use (jax.device_count(), or `num_devices` if set).
    process_count, local_devices, platform: jax.process_count(), jax.local_device_count() and
      the devices' platform, for the likely cause.
    num_devices_flag: `config.num_devices` (> 0 restricts the run to the first N devices).
    env: the environment (default os.environ), read for SLURM's variables.
  """
  if target <= 0 or num_devices == target:
    return
  env = os.environ if env is None else env
  seen = (
    f"{num_devices} ({process_count} process{'es' if process_count != 1 else ''} x "
    f"{local_devices} local {platform} device{'s' if local_devices != 1 else ''})"
  )
  raise ConfigError(
    f"sweep.target_devices={target}: this member is planned for {target} devices "
    f"(its batch, learning rate and memory plan assume them), but the run sees "
    f"{seen}; {likely_cause(target, num_devices, process_count, local_devices, num_devices_flag, env)}"
  )


def likely_cause(
  target: int, num_devices: int, process_count: int, local_devices: int, num_devices_flag: int, env
) -> str:
  """The most likely reason for the mismatch, as advice."""
  if num_devices_flag > 0:
    return (
      f"config.num_devices={num_devices_flag} restricts the run to the first "
      f"{num_devices_flag} devices; set it to 0 (all) or to {target}"
    )
  ntasks = env.get("SLURM_NTASKS")
  if "SLURM_LOCALID" in env and local_devices == 1 and num_devices < target:
    per_node = env.get("SLURM_NTASKS_PER_NODE", "?")
    return (
      f"likely cause: SLURM started {ntasks or process_count} task(s) "
      f"({per_node} per node) and JAX gives each process only the GPU numbered "
      "SLURM_LOCALID, so a node contributes one GPU per task; start one task per GPU "
      "(#SBATCH --ntasks-per-node=<GPUs per node> with --gpus-per-node=<GPUs per node>, "
      "as `python -m launch.sweep --backend slurm` renders it) and pass --multiprocess"
    )
  if ntasks and process_count != int(ntasks):
    return (
      f"likely cause: SLURM started {ntasks} tasks but JAX joined {process_count} "
      "process(es): pass --multiprocess so that every task joins one run"
    )
  if process_count == 1 and num_devices < target:
    return (
      "likely cause: a single process sees only this host's devices; a multi-host member "
      "needs every host started with --multiprocess (TPU pods, SLURM) or --num_processes/"
      "--process_id/--coordinator_address, on an allocation of "
      f"{target} devices"
    )
  if num_devices > target:
    return (
      f"likely cause: the allocation has more devices than planned; launch the member on "
      f"{target} devices, or plan it for {num_devices} with "
      f"--config.sweep.target_devices={num_devices} (which changes its batch multiple and "
      "memory plan)"
    )
  return (
    f"likely cause: the allocation has fewer devices than planned; launch it on {target} "
    f"devices (e.g. nodes x GPUs per node = {target})"
  )
