"""Training metrics: the metrics.jsonl + TensorBoard writer and its reader.

Everything here runs on the host and never needs TensorFlow (`clu.metric_writers` imports it,
so it is not used).

* `MetricWriter` writes `workdir/metrics.jsonl` (the record of truth, one JSON object per line,
  `"step"` first) and TensorBoard scalars under `workdir/tb/`. Only the primary process writes.
* `read_metrics` reads `metrics.jsonl` back.

Beside it: `progress.py` (steps/s, ETA, time accounting), `provenance.py` (what was trained, with
what code, on what) and `plotting.py` (metrics.jsonl drawn to a PNG).
"""

import json
import logging
import math
import operator
import os
import pathlib
import secrets
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

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
    key: _STR_TO_NONFINITE[value]
    if isinstance(value, str) and value in _STR_TO_NONFINITE
    else value
    for key, value in record.items()
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


def _import_tensorboardx():
  """tensorboardX, imported without PyTorch. Its writer module runs `import torch` when it can
  (only to accept torch tensors, which we never log); with torch installed beside JAX (the test
  extra's CPU torch, or a shared environment) that import costs 2-3 s of every run's start. An
  entry of None in sys.modules makes that `import torch` raise ImportError, so tensorboardX takes
  its numpy-only path; the entry is removed again, and a torch already imported is left alone."""
  blocked = "torch" not in sys.modules
  if blocked:
    sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    if blocked and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return tensorboardX


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

  def __init__(
    self,
    workdir: str | os.PathLike[str],
    *,
    is_primary: bool,
    resume_step: int | None = None,
    tensorboard: bool = True,
    sinks: tuple = (),
  ) -> None:
    """Opens the writer.

    Args:
      workdir: Run directory; created if needed (primary process only).
      is_primary: True on the process that writes (`jax.process_index() == 0`).
      resume_step: Step of the checkpoint this run resumed from, or None for a fresh run.
      tensorboard: Also write TensorBoard event files.
      sinks: Objects with `log(record)`, given every record as written to metrics.jsonl (the
        W&B logger, run/wandb_logger.py); their owner closes them.
    """
    self._sinks = tuple(sinks)
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
      tensorboardX = _import_tensorboardx()  # Only the primary needs it.
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
        logging.info(
          "Resuming at step %d: dropping %d line(s) past it from %s.",
          resume_step,
          len(lines) - len(kept),
          path,
        )
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
    for sink in self._sinks:
      sink.log(record)
    if self._tb is not None:
      for name, value in record.items():
        if name != "step":
          scalar = _STR_TO_NONFINITE[value] if isinstance(value, str) else float(value)
          self._tb.add_scalar(name, scalar, global_step=step)

  def write_text(self, name: str, text: str, *, step: int = 0, filename: str | None = None) -> None:
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
