"""The memory plan's verdict on the run's own devices (cbert_jax/run/memory_fit.py), in-process:
a run that does not fit is one ConfigError naming data.seq_len, batch_size, the planned bytes and
the budget, before any data preparation; the tests' and the smoke run's configs fit. The CLI case
(`seq_len=1000000`) is
tests/e2e/test_bad_input.py::test_seq_len_beyond_memory_fails_fast_before_data_preparation."""

import dataclasses
import time

import pytest

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.run import memory_fit
from cbert_jax.scaling import memory as memory_lib
from tests.helpers import ROOT, tiny_config

GiB = memory_lib.GiB


@dataclasses.dataclass
class FakeDevice:
  platform: str = "cpu"
  device_kind: str = "cpu"
  process_index: int = 0
  stats: dict | None = None

  def memory_stats(self):
    return self.stats


def cpu_budget(per_device: float) -> memory_fit.Budget:
  return memory_fit.Budget(per_device, "a test budget", "cpu")


def resolved(**overrides):
  return config_lib.resolve(tiny_config("/unused", **overrides))


def test_the_tests_and_the_smoke_run_fit_this_host_and_the_check_is_cheap():
  devices = [FakeDevice()] * 8
  start = time.perf_counter()
  line = memory_fit.check(resolved(), devices)
  assert time.perf_counter() - start < 0.5
  assert line.startswith("memory plan: ") and "per device (fits; remat=none" in line
  assert "of this host's" in line and "shared by its 8 cpu devices" in line
  smoke = config_lib.load_config(f"{ROOT}/experiments/smoke.py")
  smoke = config_lib.resolve(smoke)
  assert "(fits;" in memory_fit.check(smoke, [FakeDevice()])  # its defaults on one device


def test_a_seq_len_beyond_memory_is_one_line_naming_seq_len_batch_and_both_figures():
  with pytest.raises(ConfigError) as e:
    memory_fit.check(
      resolved(**{"data.seq_len": 1_000_000}), [FakeDevice()] * 2, budget_=cpu_budget(8 * GiB)
    )
  text = str(e.value)
  assert "\n" not in text
  assert text.startswith("data.seq_len=1000000 with batch_size=8 does not fit in memory: ")
  assert (
    "the memory plan (cbert_jax/scaling/memory.py; remat=none, ce_chunk=0, microbatches=1)" in text
  )
  assert (
    " TiB per device plus a 25% margin, but the budget is 8.0 GiB per device (a test budget)"
    in text
  )
  assert text.endswith(
    "lower data.seq_len (attention's memory grows with its square) or batch_size"
  )


def test_a_batch_that_fits_in_micro_batches_says_how_many():
  c = resolved(batch_size=64, **{"data.seq_len": 512})
  need = memory_fit.judge(c, 8, cpu_budget(1e15))[1]
  # Between the plan of 2 and of 1 micro-batches: 2 would fit.
  shape = memory_fit.plan_lib.memory_shape(c, 8)
  two = memory_lib.estimate(shape, memory_lib.Setting(microbatches=2))["total"]
  budget = cpu_budget((two + need) / 2 * memory_lib.margin(memory_lib.Setting()))
  with pytest.raises(ConfigError) as e:
    memory_fit.check(c, [FakeDevice()] * 8, budget_=budget)
  assert "data.seq_len=512 with batch_size=64 does not fit in memory" in str(e.value)
  assert "set optim.microbatches=2 (the same batch in 2 passes), or lower data.seq_len" in str(
    e.value
  )
  # The planner's own judgement of a chip uses the same rule (memory.judge).
  assert (
    memory_lib.judge(shape, memory_lib.Setting(), budget.per_device)[0] == "needs microbatches=2"
  )


def test_remat_counts_only_where_xla_keeps_its_barriers():
  c = resolved(**{"model.remat": "full"})
  assert memory_fit.setting_on(c, "cpu", xla_flags="").remat == "none"  # XLA:CPU drops it
  assert memory_fit.setting_on(c, "cpu", xla_flags=memory_lib.REMAT_XLA_FLAGS).remat == "full"
  assert memory_fit.setting_on(c, "gpu", xla_flags="").remat == "full"


def test_accelerator_budgets_come_from_the_chip_table_or_the_allocator():
  h100 = FakeDevice("gpu", "NVIDIA H100 80GB HBM3", stats={"bytes_limit": 60 * GiB})
  b = memory_fit.budget([h100] * 4)
  chip = memory_lib.CHIPS["h100"]
  assert (b.per_device, b.chip, b.platform) == (chip.hbm * chip.usable, "h100", "gpu")
  other = FakeDevice("gpu", "Some GPU 7", stats={"bytes_limit": 10 * GiB})
  assert memory_fit.budget([other]).per_device == 10 * GiB
  bare = FakeDevice("gpu", "Some GPU 7")
  assert memory_fit.budget([bare]) is None
  assert memory_fit.check(resolved(), [bare]).startswith("memory plan: not checked")
  # On a known chip a step that does not fit as configured is told the planner's setting.
  big = resolved(batch_size=512, **{"data.seq_len": 4096, "model.size": "d512L8"})
  with pytest.raises(ConfigError) as e:
    memory_fit.check(big, [h100] * 8)
  text = str(e.value)
  assert "data.seq_len=4096 with batch_size=512 does not fit in memory" in text
  assert "(88% of the NVIDIA H100 SXM's 74.5 GiB, from the chip table)" in text
  assert (
    "set model.remat=" in text and "(the memory planner's least costly setting that fits)" in text
  )
  # Beyond any setting: more devices, or less data per step.
  with pytest.raises(ConfigError, match=r"or batch_size, or use more devices$"):
    memory_fit.check(resolved(**{"data.seq_len": 1_000_000}), [h100] * 8)


def test_host_memory_reads_meminfo_capped_by_the_cgroup(tmp_path):
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemTotal:       24683772 kB\nMemAvailable:   20000000 kB\n")
  root = tmp_path / "cgroup"
  (root / "job" / "step").mkdir(parents=True)
  proc = tmp_path / "proc_cgroup"
  proc.write_text("0::/job/step\n")
  (root / "job" / "step" / "memory.max").write_text("max\n")
  read = lambda: memory_fit.host_available(str(meminfo), str(root), str(proc))
  assert read() == (20000000 * 1024, "available memory")
  (root / "job" / "memory.max").write_text(f"{4 * GiB}\n")  # an ancestor's limit applies too
  assert read() == (4 * GiB, "cgroup memory limit")
  v1 = tmp_path / "v1"
  (v1 / "memory" / "slurm").mkdir(parents=True)
  (v1 / "memory" / "slurm" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # no limit
  proc.write_text("4:memory:/slurm\n")
  assert memory_fit.host_available(str(meminfo), str(v1), str(proc))[1] == "available memory"


def test_seq_len_beyond_what_rope_positions_tell_apart_is_refused():
  c = config_lib.resolve(config_lib.base_config())
  c.data.seq_len = 2**24 + 2
  with pytest.raises(ConfigError, match=r"data\.seq_len must be at most 16777216 \(2\^24: RoPE"):
    config_lib.validate(c, 1)
