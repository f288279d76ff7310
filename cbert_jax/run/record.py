"""A run's record read back from its workdir: the one reader of the files a training run leaves.

  config.json                    {"config": the resolved config, "provenance", "param_counts",
                                 "flops_per_token"} (train.py)
  metrics.jsonl                  one JSON row per write, "step" first (run/metrics.py)
  checkpoints/<step>/            the checkpoints (run/checkpoint.py; orbax's tmp dirs are no step)
  eval/val_full-step_<N>.json    the full-split validation record (run/validation.py)
  eval/step_<N>*.json            the offline probe suite's results at step N (evaluate.py)
  FAILED                         a failure the sweep runner or a launcher recorded (run/status.py)
  ARCHIVE.json                   in an archived member: its final step (report/archive.py)

Reads files only (no JAX, no orbax): the sweep's status (`status`), the launcher and the reports
read runs through it. A file that is absent reads as "nothing yet" (None, 0, [], ...); an
unreadable config.json raises `ConfigFileError` where the caller asks for it (`read_config`).
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from cbert_jax.run import metrics as metrics_lib

CONFIG_FILE = "config.json"
METRICS_FILE = metrics_lib.METRICS_FILENAME
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
FAILED_FILE = "FAILED"
ARCHIVE_FILE = "ARCHIVE.json"


class ConfigFileError(ValueError):
  """A workdir's config.json is absent or not a run's record (no "config" object in it)."""

  def __init__(self, workdir: str, cause: Exception):
    self.path = os.path.join(workdir, CONFIG_FILE)
    self.cause = cause  # the error reading it: OSError, ValueError, KeyError or TypeError
    super().__init__(f"{self.path}: not a run's config.json ({cause})")

  @property
  def missing(self) -> bool:
    """Whether there is no config.json at all (rather than an unreadable one)."""
    return isinstance(self.cause, (FileNotFoundError, NotADirectoryError))


# ------------------------------------------------------------------------------- config ---
def read_record(workdir: str) -> dict[str, Any]:
  """config.json's whole body, whose "config" is a dict. Raises ConfigFileError."""
  try:
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
      body = json.load(f)
    config = body["config"]
    if not isinstance(config, dict):
      raise TypeError(f"'config' is a {type(config).__name__}, not an object")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigFileError(workdir, e) from e
  return body


def read_config(workdir: str) -> dict[str, Any]:
  """The resolved config the run trained with (config.json's "config"). Raises ConfigFileError."""
  return read_record(workdir)["config"]


def config_or_none(workdir: str) -> dict[str, Any] | None:
  """`read_config`, or None when config.json is absent or unreadable (not a run)."""
  try:
    return read_config(workdir)
  except ConfigFileError:
    return None


def data_manifest(workdir: str) -> dict[str, Any]:
  """The manifest of the data the run trained on (config.json's provenance.data_manifest: corpus,
  tokenizer, rows); {} when config.json or the manifest is absent or unreadable."""
  try:
    manifest = read_record(workdir)["provenance"]["data_manifest"]
  except (ConfigFileError, KeyError, TypeError):
    return {}
  return manifest if isinstance(manifest, dict) else {}


def total_steps(workdir: str) -> int:
  """The run's planned length (config.json's total_steps); 0 when it has none or no config.json."""
  try:
    return int(read_config(workdir)["total_steps"])
  except (ConfigFileError, ValueError, KeyError, TypeError):
    return 0


def run_names(root: str) -> list[str]:
  """The names of the directories directly under `root` that hold a config.json, sorted."""
  return sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, CONFIG_FILE)))


# ------------------------------------------------------------------------------ metrics ---
def metrics_rows(workdir: str) -> list[dict[str, Any]]:
  """metrics.jsonl's rows (`metrics.read_metrics`: a cut last line is skipped); [] without one."""
  return metrics_lib.read_metrics(os.path.join(workdir, METRICS_FILE), missing_ok=True)


def last_logged_step(workdir: str) -> int:
  """The step of metrics.jsonl's last complete line (0 if none): where a running run is. Reads
  only the file's last 64 KiB."""
  path = os.path.join(workdir, METRICS_FILE)
  try:
    with open(path, "rb") as f:
      f.seek(max(0, os.path.getsize(path) - 65536))
      lines = f.read().decode("utf-8", "replace").splitlines()
  except OSError:
    return 0
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue
  return 0


def modified(workdir: str, name: str) -> float | None:
  """When `workdir/name` (e.g. METRICS_FILE, FAILED_FILE) last changed; None when it is absent."""
  try:
    return os.path.getmtime(os.path.join(workdir, name))
  except OSError:
    return None


# ---------------------------------------------------------------------------- checkpoints ---
def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the complete checkpoints in workdir/checkpoints (orbax's tmp dirs are skipped)."""
  root = os.path.join(workdir, CHECKPOINTS_DIR)
  try:
    names = os.listdir(root)
  except OSError:
    return []
  return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(root, n)))


# ---------------------------------------------------------------------------------- eval/ ---
def val_full_path(workdir: str | os.PathLike[str], step: int) -> str:
  """Where `cbert_jax.run.validation` writes a run's full-split validation record at `step`."""
  return os.path.join(workdir, EVAL_DIR, f"val_full-step_{int(step)}.json")


def read_val_full(workdir: str | os.PathLike[str], step: int) -> dict[str, Any] | None:
  """The run's full-split validation record at `step` (`cbert_jax.run.validation`), None without
  one; a file that is not JSON raises ValueError naming it."""
  path = val_full_path(workdir, step)
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    return None
  try:
    return json.loads(text)
  except ValueError as e:
    raise ValueError(f"{path}: not a validation record ({e})") from e


def val_full_steps(workdir: str) -> list[int]:
  """The steps of the run's full-split validation records, ascending."""
  paths = glob.glob(os.path.join(workdir, EVAL_DIR, "val_full-step_*.json"))
  return sorted(int(m.group(1)) for p in paths if (m := re.search(r"step_(\d+)\.json$", p)))


def _results_files(workdir: str, step: int, suite_prefix: str) -> list[str]:
  """eval/<suite_prefix>step_<step>[-<hash>].json, sorted: exactly `step` (step 1 is not step 12)."""
  pattern = re.compile(rf"^{suite_prefix}step_{step}(?:-[0-9a-f]+)?\.json$")
  return sorted(
    p
    for p in glob.glob(os.path.join(workdir, EVAL_DIR, "*.json"))
    if pattern.match(os.path.basename(p)) and not os.path.basename(p).startswith("val_full-")
  )


def suite_results(workdir: str, step: int) -> list[str]:
  """Every probe suite's result files of `step`: eval/[<suite>-]step_<N>[-<hash>].json, sorted
  (not eval/val_full-step_<N>.json, the full-split validation loss of run/validation.py)."""
  return _results_files(workdir, step, r"(?:[\w.]+-)?")


def offline_results(workdir: str, step: int) -> tuple[str, dict[str, Any]] | None:
  """(path, record) of the offline probe suite's results at `step` (eval/step_<step>[-<hash>].json,
  any evals settings; the first by name), or None without one."""
  for path in _results_files(workdir, step, ""):
    try:
      with open(path) as f:
        body = json.load(f)
      if body.get("suite", "offline") == "offline":
        return path, body
    except (OSError, ValueError, AttributeError):
      continue
  return None


def probe_results(workdir: str, step: int) -> str | None:
  """The offline-suite results file of `step` (any evals settings), or None."""
  found = offline_results(workdir, step)
  return found[0] if found else None


# ------------------------------------------------------------------------ failed, archived ---
def failed(workdir: str) -> str | None:
  """The failure recorded in FAILED (stripped), or None without a readable one."""
  try:
    with open(os.path.join(workdir, FAILED_FILE)) as f:
      return f.read().strip()
  except OSError:
    return None


def archived_step(workdir: str) -> int:
  """The final step recorded by `ARCHIVE_FILE` in an archived member (0 if not archived)."""
  try:
    with open(os.path.join(workdir, ARCHIVE_FILE)) as f:
      return int(json.load(f)["final_step"])
  except (OSError, ValueError, KeyError, TypeError):
    return 0
