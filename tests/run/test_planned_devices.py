"""The planned-vs-actual device check names both counts and the likely cause of a mismatch."""

import pytest

from cbert_jax.errors import ConfigError
from cbert_jax.run import planned_devices


def message(target, seen, **kw) -> str:
  args = dict(process_count=1, local_devices=seen, platform="gpu", env={}) | kw
  with pytest.raises(ConfigError) as e:
    planned_devices.check(target, seen, **args)
  return str(e.value)


def test_no_plan_or_the_planned_count_passes():
  planned_devices.check(0, 3, process_count=1, local_devices=3, platform="cpu", env={})
  planned_devices.check(16, 16, process_count=2, local_devices=8, platform="gpu", env={})


def test_slurm_one_task_per_node_is_named():
  # 8 nodes x 1 task: JAX gives each process the GPU numbered SLURM_LOCALID (0) -> 8 of 64.
  env = {
    "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_LOCALID": "0",
    "SLURM_PROCID": "3",
  }
  text = message(64, 8, process_count=8, local_devices=1, env=env)
  assert text.startswith("sweep.target_devices=64: this member is planned for 64 devices")
  assert "sees 8 (8 processes x 1 local gpu device)" in text
  assert "SLURM started 8 task(s) (1 per node)" in text and "--ntasks-per-node" in text


def test_slurm_without_multiprocess_and_other_causes():
  env = {"SLURM_NTASKS": "16", "SLURM_PROCID": "0"}
  assert "pass --multiprocess so that every task joins" in message(16, 8, local_devices=8, env=env)
  assert "a single process sees only this host's devices" in message(16, 8)
  assert "more devices than planned" in message(8, 16, process_count=2, local_devices=8)
  assert "fewer devices than planned" in message(16, 8, process_count=2, local_devices=4)
