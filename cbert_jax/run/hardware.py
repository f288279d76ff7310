"""Peak matmul throughput of the accelerator, for model-FLOPs utilisation (MFU).

MFU = achieved model FLOP/s per device / peak FLOP/s per device. The peak comes from a table of
vendor spec-sheet numbers for known accelerators, keyed by `jax.Device.device_kind`. CPUs and
devices not in the table have no meaningful spec-sheet peak, so they are measured instead: the
best of several timed square-matmul loops, measured in full once per machine and kept in a small
JSON cache (`peak_cache_path`), with a short check at each start-up that raises the cached figure
or warns that the machine is loaded now. A measured "peak" is what XLA actually achieves on that
machine, so MFU on CPU reads as "fraction of the best matmul rate", not as a fraction of a
theoretical peak.

All numbers are *dense* (the NVIDIA spec sheets headline 2:4 structured-sparsity figures, which
are twice the dense ones and never reached by a dense model) and *per JAX device*.
"""

import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import platform as py_platform
import re
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
from jaxlib import version as jaxlib_version

# Spec-sheet numbers are quoted in TFLOP/s; this keeps the table readable.
_T = 1e12
# At default precision a TPU runs a float32 matmul as one bf16 MXU pass.
_TPU_F32 = "fp32 as 1-pass bf16"


@dataclasses.dataclass(frozen=True)
class PeakSpec:
  """Peak dense matmul throughput of one JAX device of a given kind.

  Attributes:
    name: Product name, for logs.
    bf16: Peak FLOP/s with bf16 (or fp16) inputs and fp32 accumulation.
    fp32: Peak FLOP/s for float32 matmuls at JAX's default precision. On NVIDIA Ampere and later
      the default precision lets XLA use TF32 tensor cores, so this is the TF32 figure. On TPU the
      default precision runs a float32 matmul as a single bf16 MXU pass, so this equals `bf16`
      (with `jax_default_matmul_precision="highest"` the real peak is several times lower).
    source: Where the numbers come from.
    fp32_label: What a float32 matmul actually runs as, for the source string.
  """

  name: str
  bf16: float
  fp32: float
  source: str
  fp32_label: str = "tf32"


# Keyed by a substring of `device_kind` (matched case-insensitively at word boundaries, longest
# key first, so that "TPU v5 lite" wins over "TPU v5" and "A10" never matches "A100").
PEAK_FLOPS: dict[str, PeakSpec] = {
  # --- Google TPU. Current JAX shows one device per chip on v4 / v5p (the two TensorCores
  # are fused into a "megacore"), so the per-chip number is the per-device number. v2, v3 and
  # TPU7x have no megacore: each TensorCore is its own JAX device and gets half the chip.
  # v2: 45 TFLOP/s bf16 per chip, 2 TensorCores (Google Cloud "TPU architecture" page).
  "TPU v2": PeakSpec(
    "TPU v2 (per TensorCore)",
    22.5 * _T,
    22.5 * _T,
    "Google Cloud TPU v2 spec, 45 TFLOP/s per chip / 2 cores",
    _TPU_F32,
  ),
  # v3: 123 TFLOP/s bf16 per chip, 2 TensorCores (Google Cloud "TPU architecture" page).
  "TPU v3": PeakSpec(
    "TPU v3 (per TensorCore)",
    61.5 * _T,
    61.5 * _T,
    "Google Cloud TPU v3 spec, 123 TFLOP/s per chip / 2 cores",
    _TPU_F32,
  ),
  # v4: 275 TFLOP/s bf16 per chip (cloud.google.com/tpu/docs/v4).
  "TPU v4": PeakSpec("TPU v4", 275 * _T, 275 * _T, "Google Cloud TPU v4 spec", _TPU_F32),
  # v4i, device_kind "TPU v4 lite" (inference chip, one TensorCore): 137 TFLOP/s bf16 (the
  # figure JAX's own jax._src.pallas.mosaic.tpu_info uses).
  "TPU v4 lite": PeakSpec("TPU v4i", 137 * _T, 137 * _T, "TPU v4i spec", _TPU_F32),
  # v5e, device_kind "TPU v5 lite": 197 TFLOP/s bf16 per chip (cloud.google.com/tpu/docs/v5e).
  "TPU v5 lite": PeakSpec("TPU v5e", 197 * _T, 197 * _T, "Google Cloud TPU v5e spec", _TPU_F32),
  "TPU v5e": PeakSpec("TPU v5e", 197 * _T, 197 * _T, "Google Cloud TPU v5e spec", _TPU_F32),
  # v5p, device_kind "TPU v5": 459 TFLOP/s bf16 per chip (cloud.google.com/tpu/docs/v5p).
  "TPU v5": PeakSpec("TPU v5p", 459 * _T, 459 * _T, "Google Cloud TPU v5p spec", _TPU_F32),
  "TPU v5p": PeakSpec("TPU v5p", 459 * _T, 459 * _T, "Google Cloud TPU v5p spec", _TPU_F32),
  # v6e Trillium, device_kind "TPU v6 lite": 918 TFLOP/s bf16 per chip
  # (cloud.google.com/tpu/docs/v6e).
  "TPU v6 lite": PeakSpec(
    "TPU v6e (Trillium)", 918 * _T, 918 * _T, "Google Cloud TPU v6e spec", _TPU_F32
  ),
  "TPU v6e": PeakSpec(
    "TPU v6e (Trillium)", 918 * _T, 918 * _T, "Google Cloud TPU v6e spec", _TPU_F32
  ),
  # TPU7x Ironwood: 2307 TFLOP/s bf16 per chip, two TensorCores and no megacore, so JAX shows
  # two devices per chip (cloud.google.com/tpu/docs/tpu7x; JAX's pallas tpu_info agrees).
  "TPU7x": PeakSpec(
    "TPU7x Ironwood (per TensorCore)",
    1153.5 * _T,
    1153.5 * _T,
    "Google Cloud TPU7x spec, 2307 TFLOP/s per chip / 2 cores",
    _TPU_F32,
  ),
  # --- NVIDIA. "fp32" is the dense TF32 tensor-core figure (see PeakSpec).
  # A100 SXM4 and PCIe (40/80 GB): BF16 312, TF32 156 dense (NVIDIA A100 datasheet).
  "A100": PeakSpec("NVIDIA A100", 312 * _T, 156 * _T, "NVIDIA A100 datasheet"),
  # A10: BF16 125, TF32 62.5 dense (NVIDIA A10 datasheet).
  "A10": PeakSpec("NVIDIA A10", 125 * _T, 62.5 * _T, "NVIDIA A10 datasheet"),
  # A10G (AWS G5 only): NVIDIA publishes no datasheet. AWS / third-party comparisons give
  # about 70 TFLOP/s bf16 and 35 TFLOP/s TF32 dense; treat as approximate.
  "A10G": PeakSpec(
    "NVIDIA A10G", 70 * _T, 35 * _T, "no NVIDIA datasheet; AWS/third-party figures, approximate"
  ),
  # L4: BF16 242 / TF32 120 on the datasheet are *with sparsity*; dense is half.
  "L4": PeakSpec("NVIDIA L4", 121 * _T, 60 * _T, "NVIDIA L4 datasheet, sparse figures / 2"),
  # L40S: BF16 362 dense (733 sparse), TF32 183 dense (366 sparse) (NVIDIA L40S datasheet).
  "L40S": PeakSpec("NVIDIA L40S", 362 * _T, 183 * _T, "NVIDIA L40S datasheet"),
  # L40: BF16 181 dense (362 sparse), TF32 90.5 dense (181 sparse) (NVIDIA L40 datasheet).
  "L40": PeakSpec("NVIDIA L40", 181 * _T, 90.5 * _T, "NVIDIA L40 datasheet"),
  # H100 SXM5, device_kind "NVIDIA H100 80GB HBM3": BF16 1979 / TF32 989 sparse on the
  # datasheet -> 989.4 / 494.7 dense. GH200 carries the same H100 GPU.
  "H100": PeakSpec(
    "NVIDIA H100 SXM", 989.4 * _T, 494.7 * _T, "NVIDIA H100 datasheet (SXM), sparse figures / 2"
  ),
  "GH200": PeakSpec(
    "NVIDIA GH200",
    989.4 * _T,
    494.7 * _T,
    "NVIDIA GH200 datasheet (H100 SXM numbers), sparse figures / 2",
  ),
  # H100 PCIe: BF16 1513 / TF32 756 sparse -> 756.5 / 378 dense (NVIDIA H100 datasheet).
  "H100 PCIe": PeakSpec(
    "NVIDIA H100 PCIe", 756.5 * _T, 378 * _T, "NVIDIA H100 datasheet (PCIe), sparse figures / 2"
  ),
  # H100 NVL: BF16 1671 / TF32 835 sparse -> 835.5 / 417.5 dense (NVIDIA H100 datasheet).
  "H100 NVL": PeakSpec(
    "NVIDIA H100 NVL", 835.5 * _T, 417.5 * _T, "NVIDIA H100 datasheet (NVL), sparse figures / 2"
  ),
  # H200 SXM: same compute as H100 SXM, BF16 1979 / TF32 989 sparse (NVIDIA H200 datasheet).
  "H200": PeakSpec(
    "NVIDIA H200 SXM", 989.4 * _T, 494.7 * _T, "NVIDIA H200 datasheet (SXM), sparse figures / 2"
  ),
  # H200 NVL: BF16 1671 / TF32 835 sparse (NVIDIA H200 datasheet).
  "H200 NVL": PeakSpec(
    "NVIDIA H200 NVL", 835.5 * _T, 417.5 * _T, "NVIDIA H200 datasheet (NVL), sparse figures / 2"
  ),
  # B200 (HGX, 1000 W): BF16 4.5 PF / TF32 2.2 PF sparse -> 2.25 / 1.1 PF dense
  # (NVIDIA HGX B200 / DGX B200 datasheet).
  "B200": PeakSpec(
    "NVIDIA B200", 2250 * _T, 1100 * _T, "NVIDIA HGX B200 datasheet, sparse figures / 2"
  ),
  # GB200 (1200 W): BF16 5 PF / TF32 2.5 PF sparse -> 2.5 / 1.25 PF dense per GPU
  # (NVIDIA GB200 NVL72 datasheet).
  "GB200": PeakSpec(
    "NVIDIA GB200", 2500 * _T, 1250 * _T, "NVIDIA GB200 NVL72 datasheet, sparse figures / 2"
  ),
}

# Longest key first so that the most specific entry wins when several match.
_KEYS_BY_SPECIFICITY = sorted(PEAK_FLOPS, key=len, reverse=True)


def _key_pattern(key: str) -> re.Pattern[str]:
  # Word boundaries that treat letters and digits as word characters but "-" and " " as
  # separators, so "A100" matches "NVIDIA A100-SXM4-80GB" but "A10" does not.
  return re.compile(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![A-Za-z0-9])", re.IGNORECASE)


_KEY_PATTERNS = {key: _key_pattern(key) for key in _KEYS_BY_SPECIFICITY}


def lookup_peak(device_kind: str) -> tuple[str, PeakSpec] | None:
  """Finds the table entry for a `jax.Device.device_kind` string.

  Args:
    device_kind: e.g. "TPU v5 lite", "NVIDIA H100 80GB HBM3".

  Returns:
    `(key, spec)` of the most specific matching entry, or None if the device is not in the table.
  """
  for key in _KEYS_BY_SPECIFICITY:
    if _KEY_PATTERNS[key].search(device_kind):
      return key, PEAK_FLOPS[key]
  return None


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
    _, spec = found
    if column == "bf16":
      return spec.bf16, f"table: {device_kind} bf16 dense ({spec.source})"
    # Name what the number is: e.g. an NVIDIA float32 matmul runs on TF32 tensor cores.
    return spec.fp32, f"table: {device_kind} {spec.fp32_label} dense ({spec.source})"
  return cached_matmul_peak(dtype_name)


def device_peak(compute_dtype: Any = jnp.bfloat16) -> tuple[float, str]:
  """Returns the peak FLOP/s of one device of this process and where the number comes from.

  Known accelerators (see `PEAK_FLOPS`) use the vendor's dense spec-sheet number (never cached
  on disk); CPUs and unknown devices are measured by `cached_matmul_peak` (the best figure seen
  on this machine, from the per-machine cache file after the first run; once per process).
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
