"""What was trained, with what code, on what: the parameter table and the run's provenance.

* `parameter_overview` tabulates the model's parameters (names, shapes, sizes, mean/std).
* `provenance` records the git commit, package versions, devices, command and XLA / NCCL
  environment of a run.

The trainer writes both into the run directory next to metrics.jsonl.
"""

import datetime
import importlib.metadata
import os
import pathlib
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from cbert_jax import __version__ as _CBERT_VERSION


def parameter_overview(
  params: Any, *, include_stats: bool = True, max_lines: int | None = None
) -> str:
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
  # pylint: disable=g-import-not-at-top  # Keep `import cbert_jax.run.provenance` light.
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
    for leaf in jax.tree.leaves(params)
  ):
    include_stats = False
  return clu_overview.get_parameter_overview(
    params, include_stats=include_stats, max_lines=max_lines
  )


_VERSIONED_PACKAGES = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "grain",
  "numpy",
  "sentencepiece",
)


# The environment a run records (`provenance()["environment"]`): the variables launch.sweep
# exports for the chip (XLA flags, LIBTPU_INIT_ARGS and the chip's others: cbert_jax/scaling/
# chips.py) and every NCCL_* variable, as the process actually ran with them, whoever set them
# (the launcher, --xla_flags, --setup, the cluster's modules).
RECORDED_ENV = (
  "XLA_FLAGS",
  "LIBTPU_INIT_ARGS",
  "XLA_PYTHON_CLIENT_MEM_FRACTION",
  "JAX_OPTIMIZATION_LEVEL",
  "CUDA_DEVICE_MAX_CONNECTIONS",
)
RECORDED_ENV_PREFIXES = ("NCCL_",)


def recorded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
  """The XLA / NCCL variables of `environ` (default: this process's) that a run records,
  sorted by name; a variable that is not set is left out."""
  environ = os.environ if environ is None else environ
  return {
    k: environ[k]
    for k in sorted(environ)
    if k in RECORDED_ENV or k.startswith(RECORDED_ENV_PREFIXES)
  }


def _git(args: Sequence[str], cwd: pathlib.Path) -> str | None:
  """Output of a git command, or None if git or the repository is unavailable."""
  try:
    result = subprocess.run(
      ["git", *args],
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=10,
      check=False,
      # Do not take the index lock for `git status`: other runs may share the checkout.
      env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
    )
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


def provenance(
  extra: Mapping[str, Any] | None = None, *, repo_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
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
    time_utc (ISO 8601), argv, command, environment (`recorded_env`: XLA_FLAGS,
    LIBTPU_INIT_ARGS, NCCL_*, ... as this process has them), plus `extra`.

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
    "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "argv": list(sys.argv),
    "command": shlex.join([sys.executable, *sys.argv]),
    "environment": recorded_env(),
  }
  for key, value in (extra or {}).items():
    if key in info:
      raise ValueError(f"provenance extra key {key!r} clashes with a built-in key.")
    info[key] = value
  return info
