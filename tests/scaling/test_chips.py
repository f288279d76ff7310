"""The one chip table (cbert_jax.scaling.chips): every record complete, and the memory plan, the
step cost, MFU, the planner's --chips and the launcher's slice names all reading the same record."""

import dataclasses
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.run import hardware
from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import memory
from launch import backends

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The device_kind each planned chip shows in JAX (the first of its device_kinds is this string).
REAL_KINDS = {
  "v4": "TPU v4",
  "v5e": "TPU v5 lite",
  "v5p": "TPU v5",
  "v6e": "TPU v6 lite",
  "a100": "NVIDIA A100-SXM4-80GB",
  "h100": "NVIDIA H100 80GB HBM3",
  "h200": "NVIDIA H200",
  "b200": "NVIDIA B200",
}
# The record's fields: every chip's (MFU), a planned chip's (memory plan, step cost), a TPU's.
MFU_FIELDS = (
  "key",
  "name",
  "device_kinds",
  "bf16",
  "fp32",
  "fp32_label",
  "source",
  "devices_per_chip",
  "cores_per_chip",
)
PLAN_FIELDS = ("hbm", "usable", "link_bytes_per_s", "memory_source")
TPU_FIELDS = ("accelerator", "slices", "host_chips", "runtime")
# A planned chip's inter-node link (the step cost) and launch environment (the launchers).
NODE_FIELDS = ("node_devices", "dcn_bytes_per_s", "dcn_source", "xla_flags", "env")
# A GPU's description for deviceless compiles (launch.compile_check --gpu), where one is written.
AOT_FIELDS = ("aot_target",)


def test_every_record_has_the_fields_its_readers_need():
  assert list(chips_lib.CHIPS) == list(REAL_KINDS)  # the planned chips, in the plan's order
  kinds = [kind for c in chips_lib.TABLE.values() for kind in c.device_kinds]
  assert len(kinds) == len(set(kinds)) == len(chips_lib.DEVICE_KINDS)  # no kind in two records
  every = {f.name for f in dataclasses.fields(chips_lib.Chip)}
  assert every == {
    *MFU_FIELDS,
    *PLAN_FIELDS,
    *TPU_FIELDS,
    *NODE_FIELDS,
    *AOT_FIELDS,
  }  # sort new ones
  targets = os.path.join(ROOT, "cbert_jax", "scaling", "gpu_targets")
  for c in chips_lib.CHIPS.values():  # a GPU's description file exists; a TPU has none
    assert not c.aot_target or (not c.accelerator and os.path.isfile(f"{targets}/{c.aot_target}"))
  for key, c in chips_lib.TABLE.items():
    assert c.key == key and all(getattr(c, f) for f in MFU_FIELDS), key
    # MFU: dense peaks, bf16 never below the float32 path, none near a sparse 3 PFLOP/s figure.
    assert 3e15 > c.bf16 >= c.fp32 > 0
    assert c.devices_per_chip in (1, 2) and c.cores_per_chip >= c.devices_per_chip
    if not c.planned:  # known to MFU only: no plan or launcher facts to get wrong
      assert key not in chips_lib.CHIPS
      assert not any(getattr(c, f) for f in (*PLAN_FIELDS, *TPU_FIELDS, *NODE_FIELDS)), key
      continue
    assert key in chips_lib.CHIPS and c.devices_per_chip == 1
    assert all(getattr(c, f) for f in PLAN_FIELDS), key
    # The memory plan and the step cost: bytes, a fraction, bytes per second.
    assert c.hbm >= 16 * chips_lib.GiB and 0.5 < c.usable < 1 and c.link_bytes_per_s >= 1e11
    # Between nodes (InfiniBand, DCN): slower than NVLink / ICI, with a source; XLA flags.
    assert 1e9 < c.dcn_bytes_per_s < c.link_bytes_per_s and c.dcn_source and c.xla_flags, key
    assert c.node_devices == (0 if c.accelerator else 8), key
    if c.accelerator:  # a TPU: its slices, either listed or whole hosts, and its runtime
      assert bool(c.slices) != bool(c.host_chips) and c.runtime
      assert c.cores_per_chip == (2 if c.host_chips else 1)
    else:  # a GPU: SLURM's XLA_PYTHON_CLIENT_MEM_FRACTION leaves the plan its usable memory
      assert c.cores_per_chip == 1 and not any(getattr(c, f) for f in TPU_FIELDS), key
      assert c.usable <= chips_lib.GPU_MEM_FRACTION
  assert set(chips_lib.GPU_CHIPS) | set(chips_lib.TPU_PREFIX) == set(chips_lib.CHIPS)
  assert (
    set(chips_lib.TPU_PREFIX) == set(chips_lib.TPU_CORES_PER_CHIP) == set(chips_lib.TPU_RUNTIME)
  )


def test_every_device_kind_finds_its_own_record():
  # Longest first: each entry is found as itself, never as a shorter entry it contains.
  for kind, c in chips_lib.DEVICE_KINDS.items():
    assert chips_lib.lookup_device_kind(kind) == (kind, c)
    assert chips_lib.lookup_device_kind(f"NVIDIA {kind}-SXM 80GB") == (kind, c)
  assert chips_lib.lookup_device_kind("NVIDIA A10")[1].key == "a10"  # not a100
  assert chips_lib.lookup_device_kind("NVIDIA H100 PCIe")[1].key == "h100-pcie"  # not h100
  assert chips_lib.lookup_device_kind("TPU v5 lite")[1].key == "v5e"  # not v5p
  for unknown in ("cpu", "NVIDIA A1000", "TPU v9"):
    assert chips_lib.lookup_device_kind(unknown) is None


@pytest.mark.parametrize("key", list(REAL_KINDS))
def test_the_plan_the_step_cost_mfu_and_the_launcher_read_one_record(key):
  c = chips_lib.CHIPS[key]
  # --chips: the accelerator type the launcher names (or <gpu>xN) reads back as this chip.
  name = chips_lib.accelerator_type(key, 16) if c.accelerator else f"{key}x16"
  parsed = chips_lib.parse(name)
  assert (parsed.chip, parsed.devices) == (key, 16)
  if c.accelerator:
    assert backends.tpu_type(key, 16) == name
  # MFU: the device_kind JAX shows finds the same record, and the peak is its number.
  kind, found = hardware.lookup_peak(REAL_KINDS[key])
  assert found is c and kind == c.device_kinds[0]
  for dtype, peak in ((jnp.bfloat16, c.bf16), (jnp.float32, c.fp32)):
    column, name = hardware._dtype_column(dtype), jnp.dtype(dtype).name
    got, source = hardware._device_peak_cached(column, name, "tpu", REAL_KINDS[key])
    assert got == peak and c.source in source
  # The memory plan: the same record, its HBM x usable the budget, its peak the step cost's.
  assert memory.chip(key) is c
  model = ModelConfig(1000, 64, 2, 4, compute_dtype="bfloat16")
  mask = MaskConfig(0.15, 4, (0, 2, 3, 4))
  s = memory.shape_of("bert", model, mask, 128, 64, {"data": 1, "fsdp": 16, "tensor": 1})
  plan = memory.plan(s, key)
  assert plan.budget == c.hbm * c.usable
  slower = dataclasses.replace(
    c,
    bf16=c.bf16 / 2,
    link_bytes_per_s=c.link_bytes_per_s / 2,
    dcn_bytes_per_s=c.dcn_bytes_per_s / 2,
  )
  assert memory.step_cost(s, plan.setting, slower) == pytest.approx(2 * plan.cost_s)


def test_the_old_names_are_the_table():
  # memory.CHIPS and hardware.PEAK_FLOPS are the table's dicts, not copies: a patch to one is
  # seen by every reader; launch.backends names slices with the planner's numbers.
  assert memory.CHIPS is chips_lib.CHIPS and memory.Chip is chips_lib.Chip
  assert hardware.PEAK_FLOPS is chips_lib.DEVICE_KINDS
  assert backends.TPU_CORES_PER_CHIP is chips_lib.TPU_CORES_PER_CHIP
  assert backends.TPU_RUNTIME is chips_lib.TPU_RUNTIME


def test_slices_are_judged_alike_by_the_planner_and_the_launcher():
  for key in chips_lib.TPU_PREFIX:
    c = chips_lib.CHIPS[key]
    for chips in range(0, 300):
      if chips_lib.is_slice(c, chips):
        assert chips_lib.parse(backends.tpu_type(key, chips)).devices == chips
      else:
        with pytest.raises(backends.LaunchError):
          backends.tpu_type(key, chips)
        with pytest.raises(ValueError, match="is no"):
          chips_lib.parse(f"{key}-{chips * c.cores_per_chip}")
  with pytest.raises(ValueError, match="expected"):  # known to MFU only: no slice, no plan
    chips_lib.parse("l4x8")


def test_the_table_imports_without_jax():
  code = "import sys\nsys.modules['jax'] = None\nimport cbert_jax.scaling.chips\nprint('ok')\n"
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
  )
  assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


@pytest.mark.parametrize("key", ["v4", "v5p", "v5e", "v6e"])
def test_standard_topologies_round_trip_and_are_cloud_tpus_slices(key):
  """`chips.topology` names a slice as libtpu takes it, `parse_topology` reads it back; the shapes
  are Cloud TPU's standard ones (a 3D torus for v4/v5p, 2D for v5e/v6e)."""
  chip = chips_lib.CHIPS[key]
  sizes = chip.slices or (4, 8, 16, 32, 64, 128, 256)
  for chips in sizes:
    name = chips_lib.topology(key, chips)
    assert chips_lib.parse_topology(name) == (key, chips)
    assert chips_lib.is_slice(chip, chips)
  if chip.host_chips:
    expect = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8"}
  else:
    expect = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 256: "16x16"}
  assert {n: chips_lib.topology(key, n).split(":")[1] for n in expect} == expect
  with pytest.raises(ValueError, match="no standard"):
    chips_lib.topology(key, 12)


def test_topology_errors_name_the_form():
  with pytest.raises(ValueError, match="is no TPU generation"):
    chips_lib.topology("h100", 8)
  for bad in ("v5p", "v5p:2x2", "v6e:2x2x2", "h100:8", "v5p:0x2x2"):
    with pytest.raises(ValueError, match="topology is|expected <generation>"):
      chips_lib.parse_topology(bad)


def test_same_hbm_chips_holds_at_least_the_memory_of_the_planned_slice():
  """v5p -> v6e at the same HBM in all: 95 GiB / 32 GiB per chip, rounded up to a v6e slice."""
  for v5p, v6e in ((8, 32), (16, 64), (32, 128), (64, 256)):
    got = chips_lib.same_hbm_chips("v5p", v5p, "v6e")
    assert got == v6e and got * 32 >= v5p * 95 and chips_lib.is_slice(chips_lib.CHIPS["v6e"], got)
  assert chips_lib.same_hbm_chips("v6e", 32, "v5p") == 16  # 1024 GiB -> 11 chips -> 16
  with pytest.raises(ValueError, match="no v6e slice"):
    chips_lib.same_hbm_chips("v5p", 128, "v6e")  # 380 v6e chips: more than v6e's 256
