"""Does the run fit in memory? The memory plan's verdict on the run's own devices, before any work.

A sweep member planned for a chip gets its memory verdict from `scaling/plan.py` (`sweep.chip`,
`sweep.memory_verdict`). Every run, member or not, on every backend, is also judged here on the
devices it actually has, before data preparation: `data.seq_len=1000000` used to prepare the data
and then die out of memory with a traceback. The plan is the same one (`memory.judge`: the
estimate of `cbert_jax/scaling/memory.py` for the run's model, batch, mesh and setting, x
`memory.margin(setting)`, against a budget per device); only the budget depends on the backend:

  cpu          MEMORY_FRACTION (80%) of the host's available memory (`MemAvailable` of
               /proc/meminfo, capped by the cgroup's `memory.max` or `memory.limit_in_bytes`
               where one is set; else the physical memory, `os.sysconf`), shared by this
               process's devices. The other 20% is for the data pipeline, XLA's compiler and the
               Python runtime. XLA:CPU drops JAX's remat barriers (`memory.py`'s docstring), so on
               CPU the step is judged as remat=none whatever `model.remat` says.
  gpu, tpu     the chip table's usable memory per device (`hbm x usable`,
               cbert_jax/scaling/chips.py: what the sweep planner fills, so a member planned to
               fit passes here too); for a device the table lacks, the allocator's `bytes_limit`
               (`jax.Device.memory_stats()`); neither known: not checked (one INFO line).

A run that fits logs the verdict in the form the launchers print it (`0.7 of 15.4 GiB per device
(fits; ...)`); one that does not is a ConfigError naming data.seq_len and batch_size, the planned
and the budgeted bytes, and what to lower. The check costs well under a millisecond.
"""

from __future__ import annotations

import dataclasses
import os

from absl import logging

from cbert_jax.errors import ConfigError
from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import memory as memory_lib
from cbert_jax.scaling import plan as plan_lib

# The fraction of the host's available memory the plan may fill on CPU (see the docstring).
MEMORY_FRACTION = 0.8


@dataclasses.dataclass(frozen=True)
class Budget:
  """The bytes per device a run's step may fill, and where that figure comes from."""

  per_device: float
  source: str  # for the message: "80% of this host's 19.3 GiB available memory, shared by ..."
  platform: str  # the devices' platform: cpu, gpu, tpu
  chip: str = ""  # the chip table's key on an accelerator it knows ("" otherwise)


def size(num_bytes: float) -> str:
  """`num_bytes` in MiB below a GiB, in GiB, or in TiB / PiB / EiB where GiB would be
  unreadable."""
  if num_bytes < memory_lib.GiB:
    return f"{num_bytes / 2**20:.1f} MiB"
  value, unit = num_bytes / memory_lib.GiB, "GiB"
  for bigger in ("TiB", "PiB", "EiB"):
    if value < 1024:
      break
    value, unit = value / 1024, bigger
  return f"{value:.1f} {unit}"


def host_available(
  meminfo: str = "/proc/meminfo", cgroup_root: str = "/sys/fs/cgroup", proc_cgroup=None
) -> tuple[float, str] | None:
  """(bytes, what they are) of the memory this host can still give a process: MemAvailable, capped
  by the tightest cgroup memory limit on this process's cgroup path (v2 `memory.max`, v1
  `memory.limit_in_bytes`); without /proc/meminfo the physical memory (`os.sysconf`). None when
  nothing is known."""
  available, what = None, ""
  try:
    with open(meminfo, encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available, what = float(line.split()[1]) * 1024, "available memory"
          break
  except OSError:
    pass
  if available is None:
    try:
      available = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
      what = "physical memory"
    except (ValueError, OSError, AttributeError):
      return None
  limit = _cgroup_limit(cgroup_root, proc_cgroup or "/proc/self/cgroup")
  if limit is not None and limit < available:
    return limit, "cgroup memory limit"
  return available, what


def _cgroup_limit(root: str, proc_cgroup: str) -> float | None:
  """The tightest memory limit of the cgroups this process is in and their ancestors; None if
  none is set (or none can be read)."""
  candidates = []
  try:
    with open(proc_cgroup, encoding="utf-8") as f:
      entries = [line.rstrip("\n").split(":", 2) for line in f]
  except OSError:
    entries = []
  for entry in entries:
    if len(entry) != 3:
      continue
    _, controllers, path = entry
    if controllers == "":  # cgroup v2
      base, names = root, ("memory.max",)
    elif "memory" in controllers.split(","):  # cgroup v1
      base, names = os.path.join(root, "memory"), ("memory.limit_in_bytes",)
    else:
      continue
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):  # this cgroup, then each ancestor up to the root
      candidates += [os.path.join(base, *parts[:depth], n) for n in names]
  # A cgroup namespace shows the process's own cgroup as the root: read the root's files too.
  candidates += [os.path.join(root, "memory.max"), os.path.join(root, "memory.limit_in_bytes")]
  candidates += [os.path.join(root, "memory", "memory.limit_in_bytes")]
  limits = []
  for path in dict.fromkeys(candidates):
    try:
      with open(path, encoding="ascii") as f:
        text = f.read().strip()
    except OSError:
      continue
    if text.isdigit() and int(text) < 2**60:  # "max", or v1's "no limit" (~2^63)
      limits.append(float(text))
  return min(limits) if limits else None


def budget(devices, process_index: int = 0) -> Budget | None:
  """The budget per device of `devices` (the run's devices; the ones of process `process_index`
  share its host's memory on CPU); None when it is unknown (an accelerator neither the chip table
  nor `memory_stats()` knows)."""
  local = [d for d in devices if getattr(d, "process_index", 0) == process_index] or list(devices)
  first = local[0]
  platform = first.platform
  if platform == "cpu":
    host = host_available()
    if host is None:
      return None
    available, what = host
    n = len(local)
    shared = f", shared by its {n} cpu devices" if n > 1 else ""
    return Budget(
      MEMORY_FRACTION * available / n,
      f"{MEMORY_FRACTION:.0%} of this host's {size(available)} {what}{shared}",
      platform,
    )
  found = chips_lib.lookup_device_kind(first.device_kind)
  if found is not None and found[1].planned:
    c = found[1]
    return Budget(
      c.hbm * c.usable,
      f"{c.usable:.0%} of the {c.name}'s {size(c.hbm)}, from the chip table",
      platform,
      c.key,
    )
  try:
    limit = (first.memory_stats() or {}).get("bytes_limit")
  except Exception:  # pylint: disable=broad-except (a backend without memory statistics)
    limit = None
  if limit:
    return Budget(float(limit), f"the allocator's limit on a {first.device_kind}", platform)
  return None


def setting_on(config, platform: str, xla_flags: str | None = None) -> memory_lib.Setting:
  """The memory setting the step runs with on `platform`: the config's (model.remat,
  model.ce_chunk, optim.microbatches), with remat=none on CPU unless XLA_FLAGS keeps the remat
  barriers (`memory.REMAT_XLA_FLAGS`)."""
  setting = plan_lib.current_setting(config)
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  if platform == "cpu" and memory_lib.REMAT_XLA_FLAGS not in flags:
    setting = dataclasses.replace(setting, remat="none")
  return setting


def judge(config, num_devices: int, budget_: Budget) -> tuple[str, float, memory_lib.Setting]:
  """(verdict, planned bytes per device, the setting judged) of the resolved `config` on
  `num_devices` devices against `budget_` (`memory.judge`)."""
  shape = plan_lib.memory_shape(config, num_devices)
  setting = setting_on(config, budget_.platform)
  verdict, est = memory_lib.judge(shape, setting, budget_.per_device, budget_.platform)
  return verdict, est["total"], setting


def check(config, devices, process_index: int = 0, budget_: Budget | None = None) -> str:
  """Raises ConfigError when the resolved, validated `config` does not fit its `devices`' memory
  (module docstring); else returns (and logs) the verdict line. `budget_` replaces the measured
  budget (tests)."""
  budget_ = budget_ or budget(devices, process_index)
  if budget_ is None:
    line = f"memory plan: not checked (no memory figure for a {devices[0].device_kind})"
    logging.info("%s", line)
    return line
  verdict, planned, setting = judge(config, len(devices), budget_)
  where = f"{setting.describe()}; budget: {budget_.source}"
  if verdict == "fits":
    line = (
      f"memory plan: {size(planned)} of {size(budget_.per_device)} per device ({verdict}; {where})"
    )
    logging.info("%s", line)
    return line
  raise ConfigError(
    f"data.seq_len={config.data.seq_len} with batch_size={config.batch_size} does not fit in "
    f"memory: the memory plan (cbert_jax/scaling/memory.py; {setting.describe()}) needs "
    f"{size(planned)} per device plus a {memory_lib.margin(setting, budget_.platform) - 1:.0%} margin, but the budget is "
    f"{size(budget_.per_device)} per device ({budget_.source}); "
    f"{_advice(config, len(devices), budget_, verdict)}"
  )


def _advice(config, num_devices: int, budget_: Budget, verdict: str) -> str:
  """What to change: on a chip of the table the planner's least costly setting that fits (what
  sweep.memory=auto picks for a member), else the verdict's micro-batches, else what to lower."""
  lower = "lower data.seq_len (attention's memory grows with its square) or batch_size"
  if budget_.chip:
    p = memory_lib.plan(plan_lib.memory_shape(config, num_devices), budget_.chip)
    if p.setting is not None:
      s = p.setting
      return (
        f"set model.remat={s.remat}, model.ce_chunk={s.ce_chunk} and "
        f"optim.microbatches={s.microbatches} (the memory planner's least costly setting that "
        f"fits), or {lower}"
      )
    lower += ", or use more devices"
  if verdict.startswith("needs microbatches="):
    k = verdict.split("=", 1)[1]
    return f"set optim.microbatches={k} (the same batch in {k} passes), or {lower}"
  return lower
