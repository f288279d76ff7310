"""Training metrics: a JSONL + TensorBoard writer, progress/ETA, time accounting, provenance, plots.

Everything here runs on the host and never needs TensorFlow (`clu.metric_writers` and
`clu.periodic_actions` import it, so they are not used; `clu.parameter_overview` does not).

* `MetricWriter` writes `workdir/metrics.jsonl` (the record of truth, one JSON object per line,
  `"step"` first) and TensorBoard scalars under `workdir/tb/`. Only the primary process writes.
* `read_metrics` reads `metrics.jsonl` back; `plot_metrics` draws it to a PNG.
* `Progress` turns step timestamps into steps/s, an ETA and a one-line status string.
* `Timers` adds up wall time spent outside the train step (compile, data wait, checkpoints, eval).
* `parameter_overview` and `provenance` describe what was trained, with what code, on what.
"""

import collections
import contextlib
import datetime
import importlib.metadata
import json
import logging
import math
import operator
import os
import pathlib
import platform
import secrets
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from cbert_jax import __version__ as _CBERT_VERSION

METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tb"

# JSON has no NaN/Infinity literals (Python would write invalid JSON); they are stored as these
# strings and turned back into floats by `read_metrics`.
_NONFINITE_TO_STR = {math.inf: "inf", -math.inf: "-inf"}
_STR_TO_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


# ---------------------------------------------------------------------------------------------
# metrics.jsonl encoding.


def _encode_value(name: str, value: Any) -> bool | int | float | str:
  """Turns one metric value (Python, NumPy or JAX scalar) into a JSON-safe Python value."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  # np.asarray also fetches a jax.Array from the device.
  array = np.asarray(value)
  if array.size != 1:
    raise ValueError(f"Metric {name!r} must be a scalar, got shape {array.shape}.")
  if array.dtype.kind == "b":
    return bool(array.item())
  if array.dtype.kind in "iu":
    return int(array.item())
  if array.dtype.kind != "f":
    raise TypeError(f"Metric {name!r} must be a real number, got dtype {array.dtype}.")
  if array.dtype.itemsize <= 4:
    # Print float32/bf16/fp16 values with the shortest decimal that round-trips at float32
    # precision (0.1, not 0.10000000149011612), which keeps metrics.jsonl readable.
    number = float(str(array.astype(np.float32).reshape(())))
  else:
    number = float(array.item())
  if math.isnan(number):
    return "nan"
  return _NONFINITE_TO_STR.get(number, number)


def _decode_record(record: dict[str, Any]) -> dict[str, Any]:
  """Inverse of the encoding: the non-finite strings become floats again."""
  return {
      key: _STR_TO_NONFINITE[value] if isinstance(value, str) and value in _STR_TO_NONFINITE
      else value for key, value in record.items()
  }


def _parse_lines(text: str, path: pathlib.Path) -> tuple[list[str], list[dict[str, Any]]]:
  """Splits metrics.jsonl text into (raw lines, parsed records), skipping unreadable lines.

  A crash in the middle of a write can leave a truncated last line; it is dropped with a
  warning rather than making the whole file unreadable.
  """
  lines, records = [], []
  bad = 0
  for line in text.splitlines():
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      bad += 1
      continue
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
      bad += 1
      continue
    lines.append(line)
    records.append(record)
  if bad:
    logging.warning("Skipped %d unreadable line(s) in %s.", bad, path)
  return lines, records


def read_metrics(path: str | os.PathLike[str], missing_ok: bool = False) -> list[dict[str, Any]]:
  """Reads a metrics.jsonl file written by `MetricWriter`.

  Args:
    path: The metrics.jsonl file (or a workdir containing one).
    missing_ok: Return [] when the file does not exist (a run that has not logged yet).

  Returns:
    One dict per line, in file order, with `"step"` first and "nan"/"inf"/"-inf" turned back
    into floats. Unreadable lines (e.g. one truncated by a crash) are skipped with a warning.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / METRICS_FILENAME
  if missing_ok and not path.exists():
    return []
  _, records = _parse_lines(path.read_text(encoding="utf-8"), path)
  return [_decode_record(record) for record in records]


def _atomic_write_text(path: pathlib.Path, text: str) -> None:
  """Writes `text` to `path` so that readers see either the old or the new file, never half."""
  tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)


class _DropNonFiniteWarning(logging.Filter):
  """Drops tensorboardX's "NaN or Inf found in input tensor." warning.

  metrics.jsonl records non-finite values on purpose (e.g. a metric that is unavailable is NaN)
  and the trainer reports non-finite losses itself; without this filter tensorboardX would
  repeat the warning on every write of such a metric.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return "NaN or Inf found in input tensor" not in record.getMessage()


def _quiet_tensorboardx_nan_warning() -> None:
  tbx_logger = logging.getLogger("tensorboardX.x2num")
  if not any(isinstance(f, _DropNonFiniteWarning) for f in tbx_logger.filters):
    tbx_logger.addFilter(_DropNonFiniteWarning())


def _tensorboard_markdown(text: str) -> str:
  # TensorBoard renders text as Markdown; indenting every line by four spaces makes it a code
  # block, so tables such as the parameter overview keep their alignment.
  return "\n".join("    " + line for line in text.splitlines())


# ---------------------------------------------------------------------------------------------
# MetricWriter.


class MetricWriter:
  """Writes scalar metrics to `workdir/metrics.jsonl` and TensorBoard (`workdir/tb/`).

  Only the primary process (JAX process 0) writes; on other processes no file or directory is
  created, so all processes can call it unconditionally. Arguments are checked the same way on
  every process, so a bad call fails everywhere instead of leaving the other processes waiting
  in a collective for a crashed process 0.

  Each `write` appends one line `{"step": 100, "train/loss": 5.2, ...}` and flushes it to the
  OS, so a crash loses nothing already written. Steps must not decrease; several writes may
  share a step (e.g. train and eval metrics), each is its own line.

  Resuming: pass `resume_step` (the step of the restored checkpoint). Lines with
  `step > resume_step` were written after that checkpoint and will be written again, so they are
  dropped (the file is rewritten atomically) and TensorBoard is told to purge events past
  `resume_step`; appending then continues in the same file. Writing a step below `resume_step`
  is an error; writing at `resume_step` itself adds a second line for that step, so a resumed
  run should log from `resume_step + 1` on. Without `resume_step` the run is a fresh start: an
  existing metrics.jsonl is emptied (with a warning) so the file never mixes two runs, and old
  TensorBoard events are purged from step 0.

  The workdir must be on a local (or locally mounted) filesystem.
  """

  def __init__(self,
               workdir: str | os.PathLike[str],
               *,
               is_primary: bool,
               resume_step: int | None = None,
               tensorboard: bool = True) -> None:
    """Opens the writer.

    Args:
      workdir: Run directory; created if needed (primary process only).
      is_primary: True on the process that writes (`jax.process_index() == 0`).
      resume_step: Step of the checkpoint this run resumed from, or None for a fresh run.
      tensorboard: Also write TensorBoard event files.
    """
    self._workdir = pathlib.Path(workdir)
    self._enabled = bool(is_primary)
    self._closed = False
    self._file = None
    self._tb = None
    # The step floor depends only on the arguments (not on the file, which only the primary
    # reads), so that all processes accept and reject the same writes.
    self._last_step = None if resume_step is None else operator.index(resume_step)
    if not self._enabled:
      return
    self._workdir.mkdir(parents=True, exist_ok=True)
    self._prepare_metrics_file(resume_step)
    self._file = open(self.metrics_path, "a", encoding="utf-8")
    if tensorboard:
      import tensorboardX  # pylint: disable=g-import-not-at-top  # Only the primary needs it.

      _quiet_tensorboardx_nan_warning()

      tb_dir = self._workdir / TENSORBOARD_DIRNAME
      if resume_step is not None:
        purge_step = resume_step + 1
      else:
        # A fresh run in a directory with old events hides all of them.
        purge_step = 0 if tb_dir.is_dir() and any(tb_dir.glob("*tfevents*")) else None
      self._tb = tensorboardX.SummaryWriter(
          logdir=str(tb_dir),
          purge_step=purge_step,
          flush_secs=30,
          # tensorboardX names event files by the second and hostname and opens them with "wb":
          # a restart within the same second would overwrite the previous file without this.
          filename_suffix=f".{os.getpid()}.{secrets.token_hex(3)}",
      )

  @property
  def workdir(self) -> pathlib.Path:
    """The run directory."""
    return self._workdir

  @property
  def metrics_path(self) -> pathlib.Path:
    """Path of metrics.jsonl (which exists only on the primary process)."""
    return self._workdir / METRICS_FILENAME

  @property
  def is_primary(self) -> bool:
    """Whether this writer writes anything."""
    return self._enabled

  def _prepare_metrics_file(self, resume_step: int | None) -> None:
    """Truncates metrics.jsonl to what precedes the resume point."""
    path = self.metrics_path
    if not path.exists():
      return
    text = path.read_text(encoding="utf-8")
    lines, records = _parse_lines(text, path)
    if resume_step is None:
      if lines:
        logging.warning("Fresh run: discarding %d existing line(s) of %s.", len(lines), path)
      kept = []
    else:
      kept = [line for line, r in zip(lines, records) if r["step"] <= resume_step]
      if len(kept) < len(lines):
        logging.info("Resuming at step %d: dropping %d line(s) past it from %s.", resume_step,
                     len(lines) - len(kept), path)
    new_text = "".join(line + "\n" for line in kept)
    # Also rewrites a file whose last line was cut off by a crash (no trailing newline), which
    # appending would otherwise glue onto the next record.
    if new_text != text:
      _atomic_write_text(path, new_text)

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError("MetricWriter is closed.")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Writes one record of scalar metrics.

    Args:
      step: Training step (an integer; NumPy/JAX integer scalars are accepted).
      metrics: Name -> scalar (Python, NumPy or JAX; bools and ints stay ints). Non-finite floats
        are stored as "nan"/"inf"/"-inf" in the JSONL file and as floats in TensorBoard.

    Raises:
      ValueError: `step` is smaller than the previous one (or than `resume_step`), `metrics`
        has a "step" key or a non-scalar value, or the writer is closed.
      TypeError: A value is not a real number.
    """
    self._check_open()
    step = operator.index(step)
    if self._last_step is not None and step < self._last_step:
      raise ValueError(f"Metric steps must not decrease: got step {step} after {self._last_step}.")
    if "step" in metrics:
      raise ValueError('"step" is reserved; pass it as the `step` argument.')
    record: dict[str, Any] = {"step": step}
    # Encode everything before writing anything, so a bad value leaves no partial record.
    for name, value in metrics.items():
      if not isinstance(name, str):
        raise TypeError(f"Metric names must be strings, got {name!r}.")
      record[name] = _encode_value(name, value)
    self._last_step = step
    if not self._enabled:
      return
    self._file.write(json.dumps(record, allow_nan=False) + "\n")
    self._file.flush()
    if self._tb is not None:
      for name, value in record.items():
        if name != "step":
          scalar = _STR_TO_NONFINITE[value] if isinstance(value, str) else float(value)
          self._tb.add_scalar(name, scalar, global_step=step)

  def write_text(self,
                 name: str,
                 text: str,
                 *,
                 step: int = 0,
                 filename: str | None = None) -> None:
    """Writes a one-off text (e.g. the parameter overview) to TensorBoard and to a file.

    Args:
      name: TensorBoard tag.
      text: The text; shown in TensorBoard as a preformatted block.
      step: TensorBoard step.
      filename: File name inside the workdir; defaults to `<name>.txt` with "/" replaced by "_".
        The file is written atomically and replaced if it exists.
    """
    self._check_open()
    if not self._enabled:
      return
    filename = filename or name.replace("/", "_") + ".txt"
    _atomic_write_text(self._workdir / filename, text if text.endswith("\n") else text + "\n")
    if self._tb is not None:
      self._tb.add_text(name, _tensorboard_markdown(text), global_step=step)

  def flush(self) -> None:
    """Forces everything written so far onto disk (JSONL fsync'ed, TensorBoard flushed)."""
    if self._file is None:
      return
    self._file.flush()
    os.fsync(self._file.fileno())
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes; safe to call twice."""
    self._closed = True
    if self._file is None:
      return
    self.flush()
    self._file.close()
    self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


# ---------------------------------------------------------------------------------------------
# Progress and timers.


def _as_float(value: Any) -> float:
  return float(np.asarray(value))


def _format_si(value: float) -> str:
  """12800 -> "12.8k", 1.5e6 -> "1.5M" (three significant digits)."""
  for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(value) >= factor:
      return f"{value / factor:.3g}{suffix}"
  return f"{value:.3g}"


def format_duration(seconds: float) -> str:
  """Formats a duration compactly: "42s", "10m02s", "3h07m", "2d05h"."""
  if not math.isfinite(seconds):
    return "?"
  s = max(0, round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
  """Training speed, ETA and a one-line status from step timestamps.

  Call `update(step)` whenever the host learns that `step` steps are done (e.g. when it fetches
  the metrics of that step, which waits for the device). The rate is measured between updates
  over the last `window` of them, never from construction: the first interval contains
  compilation (and, after a resume, restoring), so the first update only starts the clock.
  Steps are absolute, so a resumed run (`start_step > 0`) gets the right percentage and ETA.
  """

  # Metric names shown in the status line, first present one wins.
  LOSS_KEYS = ("train/loss", "loss")
  TOKENS_PER_SEC_KEYS = ("perf/tokens_per_sec", "tokens_per_sec")
  MFU_KEYS = ("perf/mfu", "mfu")

  def __init__(self,
               total_steps: int,
               start_step: int = 0,
               *,
               window: int = 20,
               time_fn: Callable[[], float] = time.monotonic) -> None:
    """Starts tracking.

    Args:
      total_steps: Step at which training ends.
      start_step: Step training starts (or resumes) from.
      window: Number of recent updates the rate is averaged over (at least 2).
      time_fn: Clock in seconds; injectable for tests.
    """
    if window < 2:
      raise ValueError(f"window must be at least 2, got {window}.")
    self.total_steps = int(total_steps)
    self.start_step = int(start_step)
    self._time_fn = time_fn
    self._start_time = time_fn()
    self._points: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)
    self._step = self.start_step

  @property
  def step(self) -> int:
    """The last step passed to `update` (or `start_step`)."""
    return self._step

  def update(self, step: int) -> None:
    """Records that `step` steps are complete now."""
    step = operator.index(step)
    if self._points and step < self._points[-1][0]:
      # Steps went backwards (a restart inside the same process): old timings are meaningless.
      self._points.clear()
    if self._points and step == self._points[-1][0]:
      return
    self._points.append((step, self._time_fn()))
    self._step = step

  def reset_window(self) -> None:
    """Forgets the timings so far, e.g. after a recompilation that should not count."""
    self._points.clear()

  @property
  def elapsed_seconds(self) -> float:
    """Wall time since construction."""
    return self._time_fn() - self._start_time

  @property
  def steps_per_sec(self) -> float | None:
    """Steps per second over the recent window; None until two updates are known."""
    if len(self._points) < 2:
      return None
    (first_step, first_t), (last_step, last_t) = self._points[0], self._points[-1]
    if last_t <= first_t:
      return None
    return (last_step - first_step) / (last_t - first_t)

  @property
  def eta_seconds(self) -> float | None:
    """Seconds left until `total_steps` at the recent rate; None while the rate is unknown."""
    remaining = max(0, self.total_steps - self._step)
    if remaining == 0:
      return 0.0
    rate = self.steps_per_sec
    if not rate:
      return None
    return remaining / rate

  def format(self, step: int | None = None, metrics: Mapping[str, Any] | None = None) -> str:
    """Returns a one-line status for logs.

    For example
    "step 120/2000 (6.0%) | loss 5.214 | 3.12 steps/s | 12.8k tok/s | MFU 31.2% | ETA 10m02s".

    Args:
      step: Step to show; defaults to the last `update`.
      metrics: Metrics of the step; loss, tokens/s and MFU (a fraction) are shown when present
        under one of `LOSS_KEYS`, `TOKENS_PER_SEC_KEYS`, `MFU_KEYS`.

    Returns:
      The line. Parts that are not known yet are left out.
    """
    step = self._step if step is None else int(step)
    metrics = metrics or {}
    percent = 100.0 * step / self.total_steps if self.total_steps > 0 else 100.0
    parts = [f"step {step}/{self.total_steps} ({percent:.1f}%)"]

    def first(keys: Sequence[str]) -> float | None:
      for key in keys:
        if key in metrics:
          return _as_float(metrics[key])
      return None

    if (loss := first(self.LOSS_KEYS)) is not None:
      parts.append(f"loss {loss:.4g}")
    if (rate := self.steps_per_sec) is not None:
      parts.append(f"{rate:.3g} steps/s")
    if (tokens := first(self.TOKENS_PER_SEC_KEYS)) is not None:
      parts.append(f"{_format_si(tokens)} tok/s")
    if (mfu := first(self.MFU_KEYS)) is not None:
      parts.append(f"MFU {100 * mfu:.1f}%")
    if (eta := self.eta_seconds) is not None:
      parts.append(f"ETA {format_duration(eta)}")
    return " | ".join(parts)

  def line(self, metrics: Mapping[str, Any] | None = None, *, step: int | None = None) -> str:
    """Same as `format(step, metrics)`, with the metrics first."""
    return self.format(step, metrics)


class Timers:
  """Adds up named wall-clock spans, e.g. time lost outside the train step.

  Example:
    timers = Timers()
    with timers.span("data_wait"):
      batch = next(batches)
    ...
    writer.write(step, timers.as_metrics())  # time/data_wait_s, time/data_wait_frac, ...

  JAX dispatches asynchronously: a span around a jitted call measures only the dispatch unless
  the result is waited for (`jax.block_until_ready`) inside the span. Nested spans each count
  their full duration, so fractions of nested names can add up to more than 1.
  """

  def __init__(self, time_fn: Callable[[], float] = time.perf_counter) -> None:
    """Starts the wall clock that `fractions()` divides by by default.

    Args:
      time_fn: Clock in seconds; injectable for tests.
    """
    self._time_fn = time_fn
    self._start = time_fn()
    self._totals: dict[str, float] = {}
    self._counts: dict[str, int] = {}

  @contextlib.contextmanager
  def span(self, name: str) -> Iterator[None]:
    """Times the body of a `with` block under `name` (also if it raises)."""
    start = self._time_fn()
    try:
      yield
    finally:
      self.add(name, self._time_fn() - start)

  def add(self, name: str, seconds: float) -> None:
    """Adds a duration measured elsewhere (e.g. compile time reported by the trainer)."""
    self._totals[name] = self._totals.get(name, 0.0) + float(seconds)
    self._counts[name] = self._counts.get(name, 0) + 1

  def elapsed(self) -> float:
    """Wall time since construction or the last `reset()`."""
    return self._time_fn() - self._start

  def totals(self) -> dict[str, float]:
    """Seconds per name."""
    return dict(self._totals)

  def counts(self) -> dict[str, int]:
    """Number of spans per name."""
    return dict(self._counts)

  def fractions(self, of_total: float | None = None) -> dict[str, float]:
    """Each total divided by `of_total` seconds (default: `elapsed()`)."""
    total = self.elapsed() if of_total is None else float(of_total)
    if not total > 0:
      raise ValueError(f"of_total must be positive, got {total}.")
    return {name: seconds / total for name, seconds in self._totals.items()}

  def as_metrics(self, of_total: float | None = None) -> dict[str, float]:
    """`{"time/<name>_s": seconds, "time/<name>_frac": fraction}` for every name."""
    fractions = self.fractions(of_total)
    metrics = {}
    for name, seconds in self._totals.items():
      metrics[f"time/{name}_s"] = seconds
      metrics[f"time/{name}_frac"] = fractions[name]
    return metrics

  def reset(self) -> None:
    """Clears all totals and restarts the wall clock."""
    self._start = self._time_fn()
    self._totals.clear()
    self._counts.clear()


# ---------------------------------------------------------------------------------------------
# What was trained, and how.


def parameter_overview(params: Any, *, include_stats: bool = True,
                       max_lines: int | None = None) -> str:
  """A table of parameter names, shapes, dtypes, sizes (and mean/std), with the total count.

  Args:
    params: Nested dict of arrays, a flax `nnx.State` (converted with `nnx.to_pure_dict`), or an
      `nnx.Module` (its `nnx.Param` state is used).
    include_stats: Add mean/std columns. They are left out automatically when some array is not
      fully addressable from this process (multi-host sharding), since computing them would need
      every process to take part.
    max_lines: Show at most this many parameters (the total still counts all).

  Returns:
    The table from `clu.parameter_overview.get_parameter_overview`, ending in
    "Total: <count> -- <bytes> bytes".
  """
  # pylint: disable=g-import-not-at-top  # Keep `import cbert_jax.metrics` light.
  from clu import parameter_overview as clu_overview
  from flax import nnx
  # pylint: enable=g-import-not-at-top
  if isinstance(params, nnx.Module):
    params = nnx.state(params, nnx.Param)
  if isinstance(params, nnx.State):
    # clu only recurses into dict/FrozenDict, not into nnx.State.
    params = nnx.to_pure_dict(params)
  if include_stats and any(
      isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
      for leaf in jax.tree.leaves(params)):
    include_stats = False
  return clu_overview.get_parameter_overview(params, include_stats=include_stats,
                                             max_lines=max_lines)


_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy",
                       "sentencepiece")


def _git(args: Sequence[str], cwd: pathlib.Path) -> str | None:
  """Output of a git command, or None if git or the repository is unavailable."""
  try:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False,
        # Do not take the index lock for `git status`: other runs may share the checkout.
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
  except (OSError, subprocess.SubprocessError):
    return None
  if result.returncode != 0:
    return None
  return result.stdout.strip()


def _package_version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def provenance(extra: Mapping[str, Any] | None = None,
               *,
               repo_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
  """Describes the code, software, hardware and invocation of this run, for the run directory.

  Args:
    extra: More entries (e.g. the data manifest hash); must not reuse a key set here.
    repo_dir: Directory inside the git checkout of the code; defaults to this package's
      directory.

  Returns:
    A JSON-serialisable dict with keys: git_commit ("unknown" outside a git checkout),
    git_dirty (True/False; None if unknown; untracked files count as dirty), versions (python,
    cbert_jax and the packages in `_VERSIONED_PACKAGES`, None if not installed), jax_backend,
    device_kind, process_index, process_count, device_count, local_device_count, hostname,
    time_utc (ISO 8601), argv, command, plus `extra`.

  Raises:
    ValueError: `extra` has a key that is already set.
  """
  repo = pathlib.Path(repo_dir) if repo_dir is not None else pathlib.Path(__file__).parent
  commit = _git(["rev-parse", "HEAD"], repo)
  status = _git(["status", "--porcelain"], repo) if commit else None
  versions = {"python": platform.python_version(), "cbert_jax": _CBERT_VERSION}
  versions.update({name: _package_version(name) for name in _VERSIONED_PACKAGES})
  info: dict[str, Any] = {
      "git_commit": commit or "unknown",
      "git_dirty": None if status is None else bool(status),
      "versions": versions,
      "jax_backend": jax.default_backend(),
      "device_kind": jax.local_devices()[0].device_kind,
      "process_index": jax.process_index(),
      "process_count": jax.process_count(),
      "device_count": jax.device_count(),
      "local_device_count": jax.local_device_count(),
      "hostname": socket.gethostname(),
      "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "argv": list(sys.argv),
      "command": shlex.join([sys.executable, *sys.argv]),
  }
  for key, value in (extra or {}).items():
    if key in info:
      raise ValueError(f"provenance extra key {key!r} clashes with a built-in key.")
    info[key] = value
  return info


# ---------------------------------------------------------------------------------------------
# Plot.

# (panel title, metric names drawn in it, scale applied to the values).
_PLOT_PANELS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("loss", ("train/loss", "eval/loss"), 1.0),
    ("masked accuracy", ("train/masked_acc", "eval/masked_acc"), 1.0),
    ("learning rate", ("train/lr",), 1.0),
    ("gradient norm", ("train/grad_norm",), 1.0),
    ("tokens / s", ("perf/tokens_per_sec",), 1.0),
    ("MFU (%)", ("perf/mfu",), 100.0),
)


def plot_metrics(metrics_path: str | os.PathLike[str],
                 out_png: str | os.PathLike[str],
                 x: str = "step",
                 mpl_cache_dir: str | None = None) -> list[str]:
  """Plots the main training curves from metrics.jsonl into a PNG.

  Panels: loss (train and eval), masked accuracy, learning rate, gradient norm, tokens/s and
  MFU; a panel whose metrics never appear is left out. Uses matplotlib's Agg renderer directly
  (no pyplot), so it works headless and does not change the process's matplotlib backend.

  Args:
    metrics_path: metrics.jsonl (or the workdir holding it).
    out_png: Output file; written atomically.
    x: Name of the x-axis value, "step" or a metric such as "tokens_seen". Records without it
      are not plotted.
    mpl_cache_dir: MPLCONFIGDIR for matplotlib's first import in this process (its font cache
      and config go there instead of ~/.cache/matplotlib); ignored when MPLCONFIGDIR is set or
      matplotlib is already imported. None: matplotlib's defaults.

  Returns:
    Titles of the panels drawn (empty if there was nothing to plot; the PNG then says so).
  """
  Figure = _matplotlib_figure(mpl_cache_dir)  # pylint: disable=invalid-name
  records = [r for r in read_metrics(metrics_path) if x in r]
  panels = []
  for title, names, scale in _PLOT_PANELS:
    series = []
    for name in names:
      points = [(r[x], r[name]) for r in records if name in r]
      if points:
        xs, ys = zip(*points)
        series.append((name, np.asarray(xs, float), np.asarray(ys, float) * scale))
    if series:
      panels.append((title, series))

  ncols = max(1, min(3, len(panels)))
  nrows = max(1, math.ceil(len(panels) / ncols))
  fig = Figure(figsize=(5 * ncols, 3.4 * nrows), layout="constrained")
  if not panels:
    fig.text(0.5, 0.5, f"no metrics with {x!r} to plot", ha="center", va="center")
  for i, (title, series) in enumerate(panels):
    ax = fig.add_subplot(nrows, ncols, i + 1)
    for name, xs, ys in series:
      # Eval points are sparse, so give them markers to stay visible.
      ax.plot(xs, ys, label=name, marker="o" if len(xs) < 50 else None, markersize=3)
    ax.set_title(title)
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)
    if len(series) > 1:
      ax.legend(fontsize="small")
  fig.suptitle(str(metrics_path))

  out_png = pathlib.Path(out_png)
  out_png.parent.mkdir(parents=True, exist_ok=True)
  tmp = out_png.with_name(f".{out_png.name}.{secrets.token_hex(4)}.tmp")
  try:
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
  finally:
    tmp.unlink(missing_ok=True)
  return [title for title, _ in panels]


def _matplotlib_figure(config_dir: str | None):
  """matplotlib's Figure class, imported with MPLCONFIGDIR=config_dir the first time (see above).

  matplotlib reads MPLCONFIGDIR once, when first imported (its config and cache directories are
  memoized), so the variable is set only around that import and the process's environment (and
  its child processes') is left as it was.
  """
  # pylint: disable=g-import-not-at-top  # matplotlib is slow to import; only needed here.
  if config_dir and "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ:
    os.makedirs(config_dir, exist_ok=True)
    os.environ["MPLCONFIGDIR"] = config_dir
    try:
      from matplotlib.figure import Figure
    finally:
      del os.environ["MPLCONFIGDIR"]
    return Figure
  from matplotlib.figure import Figure
  return Figure
