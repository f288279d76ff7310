"""Peak matmul throughput of the accelerator, for model-FLOPs utilisation (MFU).

MFU = achieved model FLOP/s per device / peak FLOP/s per device. The peak comes from the chip
table's vendor spec-sheet numbers for known accelerators (cbert_jax/scaling/chips.py, the records
the memory plan reads too), found by `jax.Device.device_kind`. CPUs and
devices not in the table have no meaningful spec-sheet peak, so they are measured instead: the
best of several timed square-matmul loops, measured in full once per machine and kept in a small
JSON cache (`peak_cache_path`), with a short check at each start-up that raises the cached figure
or warns that the machine is loaded now. A measured "peak" is what XLA actually achieves on that
machine, so MFU on CPU reads as "fraction of the best matmul rate", not as a fraction of a
theoretical peak.

All numbers are *dense* (the NVIDIA spec sheets headline 2:4 structured-sparsity figures, which
are twice the dense ones and never reached by a dense model) and *per JAX device*.
"""

import datetime
import functools
import json
import logging
import math
import os
import platform as py_platform
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging as absl_logging  # the trainer's log (run_peak)
from jaxlib import version as jaxlib_version

from cbert_jax.scaling import chips as chips_lib

# `jax.Device.device_kind` substring -> its chip's record in the one chip table
# (cbert_jax/scaling/chips.py: `bf16`, `fp32`, `fp32_label`, `source`); the same dict, not a copy.
PEAK_FLOPS: dict[str, chips_lib.Chip] = chips_lib.DEVICE_KINDS


def lookup_peak(device_kind: str) -> tuple[str, chips_lib.Chip] | None:
  """Finds the chip table's entry for a `jax.Device.device_kind` string.

  Args:
    device_kind: e.g. "TPU v5 lite", "NVIDIA H100 80GB HBM3".

  Returns:
    `(key, chip)`: the most specific matching `device_kinds` entry and its record (whose `bf16` and
    `fp32` are the peaks), or None if the device is not in the table.
  """
  return chips_lib.lookup_device_kind(device_kind)


def _dtype_column(compute_dtype: Any) -> str:
  """Maps a compute dtype to the table column that holds its peak ("bf16" or "fp32")."""
  dtype = jnp.dtype(compute_dtype)
  # fp16 and bf16 run at the same tensor-core / MXU rate on every device in the table.
  if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return "bf16"
  if dtype == jnp.dtype(jnp.float32):
    return "fp32"
  raise ValueError(
    f"No peak FLOP/s for compute dtype {dtype}; expected bfloat16, float16 or float32."
  )


def _matmul_rates(
  dtype: Any, n: int, seconds: float, repeats: int, device: jax.Device | None
) -> list[float]:
  """FLOP/s of each of `repeats` timed loops of jitted n x n matmuls, after a compile and warm run."""
  if n <= 0 or seconds <= 0 or repeats <= 0:
    raise ValueError(
      f"n, seconds and repeats must be positive, got n={n}, seconds={seconds}, repeats={repeats}."
    )
  device = device if device is not None else jax.local_devices()[0]
  dtype = jnp.dtype(dtype)
  # Committing the key to `device` makes the jitted generator (and then the matmul) run there.
  key_a, key_b = jax.random.split(jax.device_put(jax.random.key(0), device))
  normal = jax.jit(lambda k: jax.random.normal(k, (n, n), dtype))
  a, b = normal(key_a), normal(key_b)
  matmul = jax.jit(jnp.matmul)

  matmul(a, b).block_until_ready()  # Compile.
  start = time.perf_counter()
  matmul(a, b).block_until_ready()  # Warm run, also sizes the inner loop.
  one = max(time.perf_counter() - start, 1e-9)
  # On a fast accelerator a single matmul is ~1 ms, where host dispatch overhead would show; so
  # each timed repeat queues several matmuls back to back and blocks once.
  inner = max(1, round(seconds / repeats / one))
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(inner):
      out = matmul(a, b)
    out.block_until_ready()
    rates.append(2.0 * n**3 * inner / max(time.perf_counter() - start, 1e-9))
  return rates


def measure_matmul_peak(
  dtype: Any = jnp.float32,
  n: int = 2048,
  seconds: float = 1.0,
  *,
  device: jax.Device | None = None,
  repeats: int = 5,
  best: bool = False,
) -> float:
  """Measures the FLOP/s of a jitted n x n matmul on one device.

  Compiles and warms up first, then times `repeats` loops of back-to-back matmuls, about
  `seconds` in all. Returns the median over the repeats (robust to the odd slow one), or with
  `best=True` the fastest: other work on the machine only ever slows a repeat down, so the
  fastest repeat is the closest to what the idle machine can do (what `device_peak` uses).

  Args:
    dtype: Input dtype of both operands.
    n: Matrix side; 2048 takes about 0.1 s per matmul on a 2-core CPU.
    seconds: Time budget for the timed repeats (compilation and warm-up come on top).
    device: Device to run on; defaults to this process's first local device.
    repeats: Number of timed loops.
    best: Return the fastest repeat instead of the median.

  Returns:
    Achieved FLOP/s (2 n^3 per matmul).
  """
  rates = _matmul_rates(dtype, n, seconds, repeats, device)
  return max(rates) if best else statistics.median(rates)


# --- Measured peaks, cached per machine -------------------------------------------------------
# A measured peak is only as good as the machine was idle while measuring: under load a 2048^2
# float32 matmul read 92 GFLOP/s instead of ~395 on a 2-core CPU (issue 19), and MFUs against that
# figure were published. So a measured peak is the best of several repeats, and the best figure
# ever seen for this machine and software is kept in a small JSON file and reused by later runs.

# The full measurement, made when the cache holds no figure for this machine: the best of
# FULL_REPEATS timed loops, FULL_SECONDS in all (compilation and one warm run come on top).
FULL_REPEATS = 5
FULL_SECONDS = 1.0
# With a cached figure, start-up only runs a short check: it raises the cache when the machine
# is faster now, and reveals a loaded machine.
QUICK_REPEATS = 3
QUICK_SECONDS = 0.3
# A start-up check below this fraction of the cached figure means other work is taking the cores
# now (issue 19 saw 0.23x). Two start-ups in a row agreed to 0.96x here, so 0.6 leaves room for
# that spread and for light background work, and warns only about a clearly loaded machine.
LOADED_RATIO = 0.6
# An MFU above this against a *measured* peak is implausible: a training step also runs
# attention, normalisation, the loss and the optimizer update, and its matmuls have smaller,
# less regular shapes than the square benchmark, so it cannot keep 90% of a bare matmul's rate
# (this repo's CPU steps reach 37-55%). Such an MFU says the peak was measured under load.
IMPLAUSIBLE_MFU = 0.9

# Where the cache lives: this environment variable, else DEFAULT_PEAK_CACHE. An empty value
# turns the file off (every run measures in full and nothing is written).
PEAK_CACHE_ENV = "CBERT_JAX_PEAK_CACHE"
DEFAULT_PEAK_CACHE = "~/.cache/cbert_jax/matmul_peak.json"
_CACHE_VERSION = 1


def peak_cache_path() -> str | None:
  """The cache file from $CBERT_JAX_PEAK_CACHE or the default, `~` expanded; None when off."""
  path = os.environ.get(PEAK_CACHE_ENV, DEFAULT_PEAK_CACHE)
  return os.path.expanduser(path) if path else None


def _shown(path: str) -> str:
  """`path` with the home directory written as `~`, for logs."""
  home = os.path.expanduser("~")
  return "~" + path[len(home) :] if path.startswith(home + os.sep) else path


def _cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return py_platform.processor() or py_platform.machine() or "unknown"


def _cache_key(dtype_name: str, n: int, device: jax.Device) -> dict[str, Any]:
  """What a measured matmul peak depends on: the machine, the JAX build and its flags, the op."""
  affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
  return {
    "cpu_model": _cpu_model(),
    "cpu_count": os.cpu_count(),
    # The cores this process may use (taskset, container CPU sets) can be fewer than the host's.
    "cpu_affinity": len(affinity) if affinity is not None else None,
    "platform": device.platform,
    "device_kind": device.device_kind,
    # Fake CPU devices (--xla_force_host_platform_device_count) share the host's cores.
    "local_devices": jax.local_device_count(),
    # XLA_FLAGS holds that device count and threading flags that change the matmul rate; sorted
    # so that the same flags in another order are the same key.
    "xla_flags": " ".join(sorted(set(os.environ.get("XLA_FLAGS", "").split()))),
    "jax": jax.__version__,
    "jaxlib": jaxlib_version.__version__,
    "dtype": dtype_name,
    "n": n,
  }


def _read_cache(path: str) -> list[dict[str, Any]]:
  """The cache's entries; an absent file is empty, an unreadable or corrupt one is warned about
  and treated as empty (it is rewritten at the next save)."""
  try:
    with open(path) as f:
      data = json.load(f)
  except FileNotFoundError:
    return []
  except (OSError, ValueError) as e:  # ValueError covers JSONDecodeError and bad UTF-8.
    logging.warning("Ignoring the matmul peak cache %s: %s", path, e)
    return []
  versioned = isinstance(data, dict) and data.get("version") == _CACHE_VERSION
  entries = data.get("entries") if versioned else None
  if not isinstance(entries, list) or not all(_valid_entry(e) for e in entries):
    logging.warning(
      "Ignoring the matmul peak cache %s: not a version %d cache", path, _CACHE_VERSION
    )
    return []
  return entries


def _valid_entry(entry: Any) -> bool:
  """Whether a cache entry has a key, a positive finite FLOP/s figure, a date and a repeat count."""
  return (
    isinstance(entry, dict)
    and isinstance(entry.get("key"), dict)
    and isinstance(entry.get("flops"), int | float)
    and math.isfinite(entry["flops"])
    and entry["flops"] > 0
    and isinstance(entry.get("measured_at"), str)
    and isinstance(entry.get("repeats"), int)
  )


def _write_cache(path: str, entries: list[dict[str, Any]]) -> str | None:
  """Writes the cache atomically (temp file + os.replace); returns None, or why it could not."""
  try:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".matmul_peak.", dir=os.path.dirname(path) or ".")
    try:
      with os.fdopen(fd, "w") as f:
        json.dump({"version": _CACHE_VERSION, "entries": entries}, f, indent=1)
      os.replace(tmp, path)
    except BaseException:
      os.unlink(tmp)
      raise
  except OSError as e:
    logging.warning("Could not write the matmul peak cache %s: %s", path, e)
    return str(e)
  return None


def _save(path: str, key: dict[str, Any], flops: float, repeats: int) -> str:
  """Stores `flops` as this key's figure; returns the source-string suffix saying where it went.

  Re-reads the file first so that other keys written meanwhile survive. Two processes saving at
  once can lose one figure (each replaces the whole file), never corrupt the file.
  """
  entries = [e for e in _read_cache(path) if e["key"] != key]
  entries.append(
    {
      "key": key,
      "flops": flops,
      "repeats": repeats,
      "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
  )
  error = _write_cache(path, entries)
  return f"saved to {_shown(path)}" if error is None else f"not cached ({error})"


def cached_matmul_peak(
  dtype: Any = jnp.float32, *, n: int | None = None, device: jax.Device | None = None
) -> tuple[float, str]:
  """The matmul peak of `device`, measured once per machine and reused from the cache after.

  With no cached figure for this machine (see `_cache_key`), measures the best of FULL_REPEATS
  and saves it to `peak_cache_path()`. With one, runs a short start-up check instead: a faster
  check raises the cached figure; one below LOADED_RATIO of it logs that the machine looks loaded
  now. Either way the result is the best figure seen so far, never a loaded one.

  Args:
    dtype: Input dtype of both operands.
    n: Matrix side; defaults to 2048 on CPU and 8192 on accelerators (a 2048 matmul is far too
      small to load a big accelerator; 8192 is still only ~1 TFLOP, milliseconds).
    device: Device to measure; defaults to this process's first local device.

  Returns:
    `(flops_per_sec, source)`, the source saying how and when the figure was measured.
  """
  device = device if device is not None else jax.local_devices()[0]
  dtype_name = jnp.dtype(dtype).name
  n = n if n is not None else (2048 if device.platform == "cpu" else 8192)
  what = f"{n}^2 {dtype_name} matmuls on {device.platform} ({device.device_kind})"
  path = peak_cache_path()
  key = _cache_key(dtype_name, n, device)
  cached = None
  if path is not None:
    cached = next((e for e in _read_cache(path) if e["key"] == key), None)

  if cached is None:
    peak = measure_matmul_peak(
      dtype_name, n=n, seconds=FULL_SECONDS, device=device, repeats=FULL_REPEATS, best=True
    )
    where = _save(path, key, peak, FULL_REPEATS) if path is not None else "not cached"
    logging.info("Measured matmul peak: %.3g FLOP/s (%s)", peak, what)
    return peak, f"measured: best of {FULL_REPEATS} x {what}, now; {where}"

  now = measure_matmul_peak(
    dtype_name, n=n, seconds=QUICK_SECONDS, device=device, repeats=QUICK_REPEATS, best=True
  )
  ratio = now / cached["flops"]
  if now > cached["flops"]:
    where = _save(path, key, now, QUICK_REPEATS)
    logging.info(
      "Matmul peak: %.3g FLOP/s now, above the cached %.3g (%s)", now, cached["flops"], what
    )
    return (
      now,
      f"measured: best of {QUICK_REPEATS} x {what}, now ({ratio:.2f}x the cached); {where}",
    )
  source = (
    f"measured: best of {cached['repeats']} x {what}, cached {cached['measured_at'][:10]} in "
    f"{_shown(path)}; start-up check {ratio:.2f}x"
  )
  if ratio < LOADED_RATIO:
    logging.warning(
      "The machine looks loaded now: a %s matmul runs at %.3g FLOP/s, %.2fx the %.3g cached for "
      "this machine on %s. MFU uses the cached (unloaded) peak; this run's step times will be "
      "slower than the machine can do.",
      dtype_name,
      now,
      ratio,
      cached["flops"],
      cached["measured_at"][:10],
    )
    source += " (machine loaded now)"
  else:
    logging.info("Matmul peak: %.3g FLOP/s (%s)", cached["flops"], source)
  return cached["flops"], source


@functools.cache
def _device_peak_cached(
  column: str, dtype_name: str, platform: str, device_kind: str
) -> tuple[float, str]:
  """Table lookup or measurement; cached so a process measures only once."""
  # A CPU's device_kind ("cpu") is never in the table, but check the platform explicitly: a CPU
  # has no spec-sheet matmul peak worth trusting.
  found = None if platform == "cpu" else lookup_peak(device_kind)
  if found is not None:
    _, chip = found
    if column == "bf16":
      return chip.bf16, f"table: {device_kind} bf16 dense ({chip.source})"
    # Name what the number is: e.g. an NVIDIA float32 matmul runs on TF32 tensor cores.
    return chip.fp32, f"table: {device_kind} {chip.fp32_label} dense ({chip.source})"
  return cached_matmul_peak(dtype_name)


def device_peak(compute_dtype: Any = jnp.bfloat16) -> tuple[float, str]:
  """Returns the peak FLOP/s of one device of this process and where the number comes from.

  Known accelerators (`PEAK_FLOPS`: the chip table, cbert_jax/scaling/chips.py) use the vendor's
  dense spec-sheet number (never cached on disk); CPUs and unknown devices are measured by
  `cached_matmul_peak` (the best figure seen on this machine, from the per-machine cache file
  after the first run; once per process).
  Call after `jax.distributed.initialize()` if you use it.

  Args:
    compute_dtype: dtype the model's matmuls run in: bfloat16, float16 or float32.

  Returns:
    `(flops_per_sec, source)`, e.g. `(989.4e12, "table: NVIDIA H100 80GB HBM3 bf16 dense (...)")`
    or `(3.9e11, "measured: best of 5 x 2048^2 float32 matmuls on cpu (cpu), cached 2026-12-04
    in ~/.cache/cbert_jax/matmul_peak.json; start-up check 0.97x")`.
  """
  column = _dtype_column(compute_dtype)
  device = jax.local_devices()[0]
  return _device_peak_cached(
    column, jnp.dtype(compute_dtype).name, device.platform, device.device_kind
  )


def mfu(flops_per_sec_per_device: float, peak: float) -> float:
  """Model-FLOPs utilisation as a fraction (0.31 means 31%).

  Args:
    flops_per_sec_per_device: Model FLOPs of a step (forward + backward, without rematerialised
      recomputation) times steps per second, divided by the global device count.
    peak: Peak FLOP/s per device, from `device_peak`.

  Returns:
    flops_per_sec_per_device / peak.
  """
  if not peak > 0:
    raise ValueError(f"peak FLOP/s must be positive, got {peak}.")
  return float(flops_per_sec_per_device) / float(peak)


def mfu_flag(value: float, peak_source: str = "measured") -> str:
  """Judges an MFU against a measured peak: "" when plausible, else why it is not.

  Only measured peaks are judged (`peak_source` starting with "measured", as `device_peak`
  writes it): a spec-sheet or configured peak is not the benchmark that load can spoil.

  Args:
    value: MFU as a fraction, from `mfu`.
    peak_source: The peak's source string from `device_peak`.

  Returns:
    "" or "implausible: ...", for the log.
  """
  if peak_source.startswith("measured") and value > IMPLAUSIBLE_MFU:
    return (
      f"implausible: MFU {value:.1%} is above {IMPLAUSIBLE_MFU:.0%} of a measured matmul peak; "
      f"the peak was probably measured under load ({peak_source})"
    )
  return ""


_flagged_sources: set[str] = set()


def warn_implausible_mfu(value: float, peak_source: str) -> bool:
  """Logs `mfu_flag`'s warning once per process and peak source; returns whether it flagged."""
  flag = mfu_flag(value, peak_source)
  if flag and peak_source not in _flagged_sources:
    _flagged_sources.add(peak_source)
    logging.warning("%s", flag)
  return bool(flag)


def run_peak(setting: float, devices: list, dtype) -> tuple[float, str]:
  """(per-device peak FLOP/s for a run's MFU, where it came from), logged once: `setting`
  (config.peak_flops) when > 0, else `device_peak` (the chip table, or measured on a CPU)."""
  peak, source = (setting, "config.peak_flops") if setting > 0 else device_peak(dtype)
  if devices[0].platform == "cpu" and setting <= 0 and len(devices) > 1:
    # Fake CPU devices (xla_force_host_platform_device_count) share the host's cores.
    peak, source = peak / len(devices), f"{source} / {len(devices)} fake devices"
  absl_logging.info(
    "MFU is model FLOPs / (%d x %s at %.3g FLOP/s per device; source: %s)",
    len(devices),
    devices[0].device_kind,
    peak,
    source,
  )
  return peak, source
