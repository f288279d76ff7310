"""Checkpoints with orbax: parameters + optimizer state + data-iterator state + step, in one step dir.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a run
killed mid-write never leaves a checkpoint that `latest_step` would pick up. Saves are asynchronous
(the loop continues while arrays are written); `wait` blocks until the last one is on disk.
Restoring targets abstract arrays that carry the *current* mesh's shardings, so a checkpoint
restores onto a different mesh or device count (orbax reshards).

Seals. Once a save is complete (at the next save, or `wait`), process 0 writes `<step>/seal.json`:
the size of every file of the checkpoint and, when the checkpoint is small enough to read back
cheaply (`CRC_MAX_BYTES`), a CRC-32 of each. Orbax's zarr chunks carry no checksum of their own
(a flipped bit in an array file restores silently), so the seal is what proves a checkpoint's own
files intact or damaged.

Restore failures are classified (`restore_latest`), and only proven damage moves anything:
- damaged: a file the seal lists is missing or has another size or CRC, orbax's commit marker is
  absent, or the reader hits missing/short data. The checkpoint is moved to
  `<dir>.unreadable/<step>-<time>` (kept for inspection) and the previous one is tried.
- another model: the stored array shapes (orbax's metadata, read before any array) differ from
  this config's. ConfigError naming the differing shapes; nothing moved.
- permission: a file or directory of the checkpoint (or the checkpoint directory itself) that
  this user may not read or enter. Every walk and existence test raises on it (`os.walk` and
  `os.path.exists` would call it missing, which is damage), so it is CheckpointError (exit 5)
  naming the path and the `chmod` that fixes it; nothing moved, and the same command resumes from
  that checkpoint once access is back.
- I/O: a transient error. Retried `IO_ATTEMPTS` times with backoff, then CheckpointError
  (exit 5); nothing moved.
- anything else: CheckpointError naming the error; nothing moved.
When checkpoints were moved aside (now or by an earlier run) and none is left to resume from, the
run is refused with one line saying what was moved and how to put it back, unless
`restart_from_scratch` is set: a run never silently starts over at step 0.

Seal before trust. The newest checkpoint of a run that was killed (kill -9, a double Ctrl-C) has
no seal yet, and a seal over `CRC_MAX_BYTES` holds sizes only. So each save also records, in the
checkpoint's metadata, a checksum of every array's values (`array_checksums`: the sum of its bit
patterns modulo 2**32, computed on the devices; integer sums are exact and independent of the
mesh, and any one flipped bit changes them). Every restore checks the arrays it read against those
sums and the metadata for completeness (an unsealed checkpoint written before the sums were
recorded is checked finite instead); a failed check is damage (moved aside, the previous one
tried), and an unsealed checkpoint that passes is sealed then.

A full disk while saving (Python's OSError, or tensorstore's `ValueError: RESOURCE_EXHAUSTED ...
[os_error_code='28']`) raises `CheckpointError` naming the directory and the last complete
checkpoint; the partial write stays in orbax's temporary directory, which is never picked up.
"""

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from cbert_jax.errors import CheckpointError, ConfigError

SEAL = "seal.json"  # per checkpoint: {"files": {relpath: [bytes, crc32 | null]}}
CHECKSUMS = "array_checksums"  # the meta item's {array path: bit-pattern sum mod 2**32}
CRC_MAX_BYTES = 2 << 30  # checkpoints up to this size get a CRC per file (seconds to read)
IO_ATTEMPTS = 4  # reads tried before an I/O error is reported
IO_BACKOFF_S = 1.0  # wait before the 2nd attempt; doubles each time
MAX_SHOWN = 4  # differing shapes named in a ConfigError (the rest are counted)
# Replica-parallel saving: an array replicated on R devices is written 1/R by each replica, each
# part an on-device slice, compiled once per shape (jit(slice)). Below this many bytes per part
# the split saves no I/O worth its compiles, so the array is written whole by one replica. Large
# arrays still split; a d32L2 test model on 8 devices compiled 112 slices (~9 s) without it.
MIN_REPLICA_SLICE_BYTES = 1 << 20
_COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")  # orbax writes both on commit
# Reader errors that mean the files are not all there (tensorstore status codes; orbax's item lookup).
_DAMAGE_WORDS = (
  "OUT_OF_RANGE",
  "DATA_LOSS",
  "NOT_FOUND",
  "was not found in the checkpoint",
  "Unexpected end",
  "truncated",
  "corrupt",
)
_IO_WORDS = (
  "PERMISSION_DENIED",
  "UNAVAILABLE",
  "DEADLINE_EXCEEDED",
  "RESOURCE_EXHAUSTED",
  "Permission denied",
)
_IO_ERRNOS = (
  errno.EACCES,
  errno.EPERM,
  errno.EIO,
  errno.EAGAIN,
  errno.ETIMEDOUT,
  errno.ESTALE,
  errno.EBUSY,
  errno.ENOLCK,
)


class _Damaged(Exception):
  """A checkpoint's own files are proven damaged (the message says how)."""


class _IOFailure(Exception):
  """A checkpoint could not be read for an I/O reason (permission, transient), not damage."""


class _NoAccess(_IOFailure):
  """A checkpoint's file or directory may not be read by this user (EACCES/EPERM): not retried."""

  def __init__(self, path: str, err: OSError):
    self.path = path
    super().__init__(f"permission denied on {path} ({_mode(path)})")


@functools.cache  # once per process
def _register_array_handler() -> None:
  """jax.Array's orbax handler as orbax's default one (with its array metadata store), except
  for MIN_REPLICA_SLICE_BYTES. orbax 0.12 exposes the store's class only under _src (pinned)."""
  # pylint: disable-next=g-import-not-at-top
  from orbax.checkpoint._src.metadata import array_metadata_store

  handler = ocp.type_handlers.ArrayHandler(
    min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES,
    array_metadata_store=array_metadata_store.Store(),
  )
  ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


class Checkpointer:
  """A thin adapter over `ocp.CheckpointManager`, so orbax API churn stays in one file."""

  def __init__(self, directory: str, keep: int, async_save: bool = True):
    _register_array_handler()
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=async_save
    )
    self._dir = directory
    _check_listable(directory)
    try:
      self._mngr = ocp.CheckpointManager(directory, options=options)
    except PermissionError as e:  # orbax lists the directory (and each step's metadata) here
      raise CheckpointError(
        _no_access_message(
          f"the checkpoint directory {directory}", e.filename or directory, directory
        )
      ) from e

  @property
  def unreadable_dir(self) -> str:
    """Where damaged checkpoints are moved (`<dir>.unreadable/<step>-<unix time>`)."""
    return f"{self._dir}.unreadable"

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def save(self, step: int, params, opt_state, data_state: dict, meta: dict) -> None:
    """Start writing checkpoint `step` (returns before the write finishes; see `wait`)."""
    with self._disk_errors(step):
      self._mngr.wait_until_finished()  # orbax waits here anyway; then the finished ones are sealed
      self._seal_finished()
      self._mngr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
          data=ocp.args.JsonSave(data_state),
          meta=ocp.args.JsonSave(
            {**meta, CHECKSUMS: array_checksums({"params": params, "opt_state": opt_state})}
          ),
        ),
        force=True,
      )

  @contextlib.contextmanager
  def _disk_errors(self, step: int | None):
    """An OSError while writing checkpoint `step` (None: an earlier asynchronous save) --
    ENOSPC, EDQUOT, EIO, ... -- becomes one CheckpointError naming the last complete one."""
    try:
      yield
    except Exception as err:  # pylint: disable=broad-except  (tensorstore raises ValueError)
      code = _write_errno(err)
      if code is None:
        raise
      cause = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded"}.get(
        code, f"the write failed ({type(err).__name__}: {_first_line(err)})"
      )
      fix = {
        errno.ENOSPC: "Free space",
        errno.EDQUOT: "Free space",
        errno.EACCES: f"Make {self._dir} writable by this user (for example chmod -R u+rwX)",
        errno.EPERM: f"Make {self._dir} writable by this user (for example chmod -R u+rwX)",
        errno.EROFS: "Remount the filesystem read-write or pass another --workdir",
      }.get(code, "Fix the storage")
      done = [s for s in self._mngr.all_steps() if s != step]
      what = f"checkpoint step {step}" if step is not None else "a checkpoint"
      raise CheckpointError(
        f"could not write {what} to {self._dir}: {cause}. The last complete checkpoint is step "
        f"{max(done) if done else None}; the partial write is in a temporary directory that is "
        f"never resumed from. {fix} and rerun the same command to resume"
      ) from err

  # ------------------------------------------------------------------------------- seals ---

  def _seal_finished(self) -> None:
    """Process 0 writes `seal.json` into each complete checkpoint that has none yet."""
    if jax.process_index() != 0:
      return
    for step in self._mngr.all_steps():
      try:
        if not self.is_sealed(step):
          self._seal(step)
      except PermissionError as e:  # restore names it (and refuses it) if it is ever needed
        logging.warning("cannot seal checkpoint step %d in %s: %s", step, self._dir, e)

  def is_sealed(self, step: int) -> bool:
    return _exists(os.path.join(self._dir, str(step), SEAL))

  def _seal(self, step: int) -> None:
    """Write checkpoint `step`'s seal (sizes and, when small enough, CRC-32 of its files)."""
    if jax.process_index() == 0:
      step_dir = os.path.join(self._dir, str(step))
      files = _list_files(step_dir)
      with_crc = sum(files.values()) <= CRC_MAX_BYTES
      seal = {
        "files": {
          rel: [size, _crc32(os.path.join(step_dir, rel)) if with_crc else None]
          for rel, size in files.items()
        }
      }
      tmp = os.path.join(step_dir, f".{SEAL}.tmp")
      with open(tmp, "w") as f:
        json.dump(seal, f)
      os.replace(tmp, os.path.join(step_dir, SEAL))

  def check_files(self, step: int, full: bool = True) -> None:
    """Raise _Damaged when checkpoint `step`'s own files are missing, short or altered.

    Checks orbax's commit markers, then the seal (when there is one): every listed file present
    with its size and (`full` and recorded) its CRC-32. An OSError while reading is _IOFailure.
    """
    step_dir = os.path.join(self._dir, str(step))
    try:
      _check_access(step_dir)  # a directory we may not enter would otherwise look empty: damage
      for marker in _COMMIT_MARKERS:
        if not _exists(os.path.join(step_dir, marker)):
          raise _Damaged(f"orbax's commit marker {marker} is missing")
      seal_path = os.path.join(step_dir, SEAL)
      if not _exists(seal_path):
        return  # not sealed yet (the run stopped before its next save): checked after reading
      try:
        with open(seal_path) as f:
          listed = json.load(f)["files"]
      except (ValueError, KeyError, TypeError) as e:
        raise _Damaged(f"its {SEAL} is unreadable ({e})") from e
      present = _list_files(step_dir)
      for rel, (size, crc) in sorted(listed.items()):
        if rel not in present:
          raise _Damaged(f"file {rel} is missing")
        if present[rel] != size:
          raise _Damaged(f"file {rel} has {present[rel]} bytes, {size} when written")
        if full and crc is not None and _crc32(os.path.join(step_dir, rel)) != crc:
          raise _Damaged(f"file {rel} does not match its CRC-32 recorded when written")
    except OSError as e:
      if e.errno in _IO_ERRNOS:
        raise _io_failure(e) from e
      raise

  def check_values(self, step: int, params, opt_state, data_state, meta, sealed: bool) -> None:
    """Raise _Damaged unless a restored checkpoint holds what was written.

    Its metadata must be complete (the step, the data state) and its arrays must match the
    checksums recorded at save time (a sealed checkpoint over `CRC_MAX_BYTES` has only sizes in
    its seal, so this is what catches a flipped bit there); an unsealed one written before
    checksums were recorded must at least be finite.
    """
    state = "sealed" if sealed else "not sealed"
    if not isinstance(meta, dict) or meta.get("step") != step or not isinstance(data_state, dict):
      raise _Damaged(f"it is {state} and its metadata is incomplete (meta: {meta!r:.200})")
    restored = {"params": params, "opt_state": opt_state}
    recorded = meta.get(CHECKSUMS)
    if recorded is None:
      bad = [] if sealed else [k for k, ok in _all_finite(restored).items() if not ok]
      if bad:
        raise _Damaged(f"it is not sealed and holds non-finite values in {_few(bad)}")
      return
    now = array_checksums(restored)
    bad = sorted(k for k in recorded.keys() | now.keys() if recorded.get(k) != now.get(k))
    if bad:
      raise _Damaged(
        f"it is {state} and its arrays differ from the checksums recorded when it was written "
        f"({_few(bad)})"
      )

  # ----------------------------------------------------------------------------- restore ---

  def restore_latest(self, abstract_params, abstract_opt_state, restart_from_scratch: bool = False):
    """The newest restorable checkpoint -> (step, params, opt_state, data_state, meta), or None
    when there is none to resume from (a fresh run).

    Damaged checkpoints are moved aside and the previous one is tried; a checkpoint of another
    model raises ConfigError; an I/O failure raises CheckpointError after `IO_ATTEMPTS` reads
    (the module docstring has the classification). Nothing is moved except proven damage.

    Raises:
      ConfigError: the stored shapes differ from the abstract targets'.
      CheckpointError: an I/O or unclassified read failure (nothing moved), or checkpoints were
        moved aside, none is left, and `restart_from_scratch` is False.
    """
    moved = []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      try:

        def attempt(step=step):
          self.check_files(step)
          sealed = self.is_sealed(step)
          self.check_shapes(step, abstract_params, abstract_opt_state)
          out = self._read(step, abstract_params, abstract_opt_state)
          self.check_values(step, *out, sealed=sealed)
          return sealed, out

        sealed, out = self._agree(lambda step=step, attempt=attempt: self._retry_io(step, attempt))
        if not sealed:  # a killed run's newest: worth a line in the log
          logging.warning(
            "checkpoint step %d was not sealed (the run stopped before its next save); its arrays "
            "match the checksums recorded when it was written and its metadata is complete: "
            "sealed it now",
            step,
          )
          self._seal(step)
        params, opt_state, data_state, meta = out
        return step, params, opt_state, data_state, _without_checksums(meta)
      except _Damaged as e:
        aside = self._move_aside(step)
        moved.append(f"step {step} ({e}) -> {aside}")
        logging.warning(
          "checkpoint step %d in %s is damaged (%s); moved it to %s and trying the "
          "previous checkpoint",
          step,
          self._dir,
          e,
          aside,
        )
      except _NoAccess as e:
        raise CheckpointError(
          _no_access_message(
            f"checkpoint step {step} in {self._dir}", e.path, os.path.join(self._dir, str(step))
          )
        ) from e
      except _IOFailure as e:
        raise CheckpointError(
          f"checkpoint step {step} in {self._dir} could not be read after {IO_ATTEMPTS} "
          f"attempts ({e}): an I/O or permission problem, not damage, so nothing was moved. "
          "Fix access to the files and rerun the same command to resume"
        ) from e
    if not moved and not self._moved_before():
      return None
    what = (
      "; ".join(moved)
      if moved
      else f"by an earlier run, now in {self.unreadable_dir}: {', '.join(self._moved_before())}"
    )
    if restart_from_scratch:
      logging.warning(
        "no checkpoint to resume from in %s (damaged ones moved aside %s); "
        "restart_from_scratch: starting at step 0",
        self._dir,
        what,
      )
      return None
    step_of = lambda name: int(name.split("-")[0]) if name.split("-")[0].isdigit() else -1
    newest = max(self._moved_before(), key=step_of)
    raise CheckpointError(
      f"no checkpoint in {self._dir} can be resumed from: damaged checkpoints were moved aside "
      f"({what}). To retry one, move it back (e.g. mv {self.unreadable_dir}/{newest} "
      f"{self._dir}/{step_of(newest)}); to start this run over at step 0, rerun with "
      "--config.restart_from_scratch=true"
    )

  def _moved_before(self) -> list[str]:
    """The entries of `<dir>.unreadable/` (checkpoints moved aside by this or an earlier run)."""
    try:
      return sorted(os.listdir(self.unreadable_dir))
    except FileNotFoundError:
      return []
    except OSError as e:
      raise CheckpointError(
        _no_access_message(
          f"the folder of checkpoints moved aside {self.unreadable_dir}",
          self.unreadable_dir,
          self.unreadable_dir,
        )
      ) from e

  def stored_shapes(self, step: int, item_keys=("params", "opt_state")) -> dict[str, tuple]:
    """{"params/encoder/...": shape} of the arrays stored in checkpoint `step` (metadata only)."""
    try:
      tree = ocp.StandardCheckpointHandler().metadata(
        epath.Path(os.path.join(self._dir, str(step), "state"))
      )
    except OSError as e:
      if e.errno in _IO_ERRNOS:
        raise _io_failure(e) from e
      raise _Damaged(f"its array metadata cannot be read ({type(e).__name__}: {e})") from e
    except (ValueError, KeyError, TypeError) as e:
      raise _Damaged(
        f"its array metadata cannot be read ({type(e).__name__}: {_first_line(e)})"
      ) from e
    tree = getattr(tree, "tree", tree)
    return {k: v for k, v in _shapes(tree).items() if k.split("/")[0] in item_keys}

  def check_shapes(
    self, step: int, abstract_params, abstract_opt_state=None, extra_stored_ok: bool = False
  ) -> None:
    """ConfigError when checkpoint `step` holds arrays of other shapes or names than the targets
    (`extra_stored_ok`: stored arrays the targets do not name are fine, as in a partial restore)."""
    keys = ("params",) if abstract_opt_state is None else ("params", "opt_state")
    stored = self.stored_shapes(step, keys)
    wanted = _shapes(
      {"params": abstract_params}
      | ({} if abstract_opt_state is None else {"opt_state": abstract_opt_state})
    )
    order = lambda k: (not k.startswith("params/"), k)  # parameters first: they name the model
    diffs = [
      f"{k}: stored {stored[k]}, this config {wanted[k]}"
      for k in sorted(stored.keys() & wanted.keys(), key=order)
      if tuple(stored[k]) != tuple(wanted[k])
    ]
    if not extra_stored_ok:
      diffs += [
        f"{k}: stored, not in this model" for k in sorted(stored.keys() - wanted.keys(), key=order)
      ]
    diffs += [
      f"{k}: in this model, not stored" for k in sorted(wanted.keys() - stored.keys(), key=order)
    ]
    if diffs:
      more = f" (and {len(diffs) - MAX_SHOWN} more)" if len(diffs) > MAX_SHOWN else ""
      raise ConfigError(
        f"checkpoint step {step} in {self._dir} was written by another model than this config "
        f"builds: {'; '.join(diffs[:MAX_SHOWN])}{more}. Nothing was moved; use the config that "
        "wrote it (the workdir's config.json) or another --workdir"
      )

  def _read(self, step: int, abstract_params, abstract_opt_state):
    """`restore`, its failure classified: damage -> _Damaged, I/O -> _IOFailure, else
    CheckpointError (nothing moved)."""
    try:
      return self._restore_raw(step, abstract_params, abstract_opt_state)
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many types)
      kind = _classify(e)
      if kind == "io":
        if isinstance(e, OSError):
          raise _io_failure(e) from e
        raise _IOFailure(f"{type(e).__name__}: {_first_line(e)}") from e
      if kind == "damaged":
        self.check_files(step, full=True)  # a seal names the file when it can
        raise _Damaged(f"reading it failed: {type(e).__name__}: {_first_line(e)}") from e
      raise CheckpointError(
        f"checkpoint step {step} in {self._dir} could not be restored ({type(e).__name__}: "
        f"{_first_line(e)}); this is neither damage nor another model's checkpoint, so "
        "nothing was moved. Report it with the log"
      ) from e

  def _retry_io(self, step: int, fn):
    """`fn()`, retried after an _IOFailure (permission, transient) up to IO_ATTEMPTS times."""
    wait = IO_BACKOFF_S
    for attempt in range(1, IO_ATTEMPTS + 1):
      try:
        return fn()
      except _IOFailure as e:
        if attempt == IO_ATTEMPTS or isinstance(e, _NoAccess):  # permissions do not heal by waiting
          raise
        logging.warning("reading checkpoint step %d failed (%s); retrying in %.1f s", step, e, wait)
        time.sleep(wait)
        wait *= 2

  def _agree(self, fn):
    """Run `fn` on every process; if it raised on any, raise the same kind everywhere.

    The checks and reads run on every process (each reads its shards); a process that alone
    failed would otherwise go on to collectives the others never join.
    """
    kinds = (_Damaged, _NoAccess, _IOFailure, ConfigError, CheckpointError)
    if jax.process_count() == 1:
      return fn()
    try:
      out, code, error = fn(), 0, None
    except kinds as e:
      out, code, error = None, 1 + kinds.index(type(e)), e
    codes = np.asarray(multihost_utils.process_allgather(np.int32(code))).reshape(-1)
    if error is not None:
      raise error
    if codes.any():
      first = int(np.argmax(codes > 0))
      kind = kinds[int(codes[first]) - 1]
      if kind is _NoAccess:
        raise _NoAccess(f"a file on process {first} (see its log)", PermissionError())
      raise kind(f"on process {first} (see its log)")
    return out

  def _move_aside(self, step: int) -> str:
    dest = os.path.join(self.unreadable_dir, f"{step}-{int(time.time())}")
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.move(os.path.join(self._dir, str(step)), dest)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint_move_aside_{step}")
    self._mngr.reload()
    return dest

  def restore(self, step: int, abstract_params, abstract_opt_state):
    """-> (params, opt_state, data_state, meta), arrays laid out as the abstract targets say."""
    params, opt_state, data_state, meta = self._restore_raw(
      step, abstract_params, abstract_opt_state
    )
    return params, opt_state, data_state, _without_checksums(meta)

  def _restore_raw(self, step: int, abstract_params, abstract_opt_state):
    """`restore`, the meta item as stored (with its array checksums)."""
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(
          {"params": abstract_params, "opt_state": abstract_opt_state}
        ),
        data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore(),
      ),
    )
    return out.state["params"], out.state["opt_state"], out.data, out.meta

  def restore_params(self, step: int, abstract_params):
    """Only the parameters of checkpoint `step` (evaluation needs no optimizer state).

    Raises ConfigError (before reading any array) when the checkpoint holds another model.
    """
    try:
      self.check_shapes(step, abstract_params, extra_stored_ok=True)
    except (_Damaged, _IOFailure) as e:
      raise CheckpointError(f"checkpoint step {step} in {self._dir} cannot be read: {e}") from e
    target = {"params": abstract_params}
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          item=target,
          restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True,
        )
      ),
    )
    return out.state["params"]

  def wait(self) -> None:
    with self._disk_errors(None):
      self._mngr.wait_until_finished()
      self._seal_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._mngr.close()


def _raise(e: OSError) -> None:
  raise e


def _exists(path: str) -> bool:
  """os.path.exists that raises on a permission or I/O error instead of answering False."""
  try:
    os.stat(path)
  except (FileNotFoundError, NotADirectoryError):
    return False
  return True


def _check_listable(directory: str) -> None:
  """CheckpointError when the checkpoint directory exists but this user may not list or enter it."""
  try:
    with os.scandir(directory):
      pass
  except (FileNotFoundError, NotADirectoryError):
    return  # orbax creates it (or says what is in the way)
  except PermissionError as e:
    raise CheckpointError(
      _no_access_message(f"the checkpoint directory {directory}", directory, directory)
    ) from e


def _check_access(step_dir: str) -> None:
  """_NoAccess naming the first directory or file under `step_dir` this user may not read.

  `os.access` answers for the real user (root passes everything); the walk itself raises when a
  directory cannot be listed.
  """
  try:
    for root, dirs, files in os.walk(step_dir, onerror=_raise):
      for name in sorted(dirs):
        path = os.path.join(root, name)
        if not os.access(path, os.R_OK | os.X_OK):
          raise _NoAccess(path, PermissionError(errno.EACCES, "Permission denied", path))
      for name in sorted(files):
        path = os.path.join(root, name)
        if not os.access(path, os.R_OK):
          raise _NoAccess(path, PermissionError(errno.EACCES, "Permission denied", path))
    if not os.access(step_dir, os.R_OK | os.X_OK):
      raise _NoAccess(step_dir, PermissionError(errno.EACCES, "Permission denied", step_dir))
  except (FileNotFoundError, NotADirectoryError):
    return  # missing files are judged by the caller (damage)


def _io_failure(e: OSError) -> _IOFailure:
  """The _IOFailure for an I/O OSError: _NoAccess (not retried) for a permission error."""
  if e.errno in (errno.EACCES, errno.EPERM):
    return _NoAccess(e.filename or "a checkpoint file", e)
  return _IOFailure(f"{type(e).__name__}: {e}")


def _mode(path: str) -> str:
  """ "mode 000, owner uid 0; this process runs as uid 1000" for a path, or why it cannot be told."""
  try:
    st = os.stat(path)
  except OSError as e:
    return f"its mode cannot be read: {e.strerror}"
  return (
    f"mode {st.st_mode & 0o777:03o}, owner uid {st.st_uid}; this process runs as uid {os.geteuid()}"
  )


def _no_access_message(what: str, path: str, fix: str) -> str:
  """The one line for a checkpoint (or the checkpoint directory) this user may not read."""
  return (
    f"{what} cannot be read: permission denied on {path} ({_mode(path)}). This is a permission "
    f"problem, not damage, so nothing was moved. Give this user access (for example chmod -R "
    f"u+rwX {fix}) and rerun the same command to resume from it"
  )


def array_checksums(tree) -> dict[str, int]:
  """{"params/w": sum of the bit patterns of its values mod 2**32} for every array of `tree`.

  Computed where the arrays live (one jitted reduction per array, a replicated scalar each) and
  exact: integer addition is associative, so the mesh and device count do not change it; any one
  flipped bit changes it.
  """
  sums = _bit_sums(tree)
  return {k: int(_local(v)) for k, v in _flat(sums).items()}


@jax.jit
def _bit_sums(tree):
  def one(x):  # [...] any dtype -> [] uint32
    if x.dtype == jnp.bool_:
      x = x.astype(jnp.uint8)
    uint = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jnp.sum(jax.lax.bitcast_convert_type(x, uint).astype(jnp.uint32), dtype=jnp.uint32)

  return jax.tree.map(one, tree)


def _all_finite(tree) -> dict[str, bool]:
  """{"params/w": all values finite} for every floating array of `tree`."""
  flags = jax.jit(
    lambda t: jax.tree.map(
      lambda x: jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else True, t
    )
  )(tree)
  return {k: bool(_local(v)) for k, v in _flat(flags).items()}


def _local(x):
  """A replicated scalar as a host number (on several hosts: this process's copy)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    x = x.addressable_shards[0].data
  return np.asarray(x)


def _flat(tree) -> dict:
  return {
    "/".join(_key_name(k) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _without_checksums(meta):
  return {k: v for k, v in meta.items() if k != CHECKSUMS} if isinstance(meta, dict) else meta


def _few(names: list[str], shown: int = MAX_SHOWN) -> str:
  more = f" and {len(names) - shown} more" if len(names) > shown else ""
  return ", ".join(names[:shown]) + more


def _list_files(step_dir: str) -> dict[str, int]:
  """{relative path: bytes} of every file under a checkpoint directory, the seal excluded.

  Raises on a directory it cannot list (os.walk would skip it, and its files would look missing).
  """
  out = {}
  for root, _, files in os.walk(step_dir, onerror=_raise):
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != SEAL and not name.startswith(f".{SEAL}"):
        out[rel] = os.path.getsize(os.path.join(root, name))
  return out


def _crc32(path: str, block: int = 1 << 22) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(block):
      crc = zlib.crc32(chunk, crc)
  return crc


def _shapes(tree) -> dict[str, tuple]:
  """{"a/b/0/c": shape} for every array-like leaf (with a .shape) of a pytree."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if hasattr(leaf, "shape"):
      out["/".join(_key_name(k) for k in path)] = tuple(leaf.shape)
  return out


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _classify(e: BaseException) -> str:
  """ "io", "damaged" or "other" for an exception raised while restoring."""
  if isinstance(e, OSError) and e.errno in _IO_ERRNOS:
    return "io"
  text = f"{type(e).__name__}: {e} {e.__cause__ or ''}"
  if any(w in text for w in _IO_WORDS):
    return "io"
  if isinstance(e, (FileNotFoundError, KeyError)) or any(w in text for w in _DAMAGE_WORDS):
    return "damaged"
  return "other"


def _write_errno(e: BaseException) -> int | None:
  """The errno of a failed checkpoint write, or None when `e` is not a storage error.

  Python's writes raise OSError; tensorstore's raise ValueError with a status and the OS error in
  its text: `RESOURCE_EXHAUSTED: Error writing ... No space left on device [os_error_code='28']`
  (measured on a full tmpfs)."""
  if isinstance(e, OSError):
    return e.errno or errno.EIO
  text = str(e)
  found = re.search(r"os_error_code='?(\d+)", text)
  if found:
    return int(found.group(1))
  if "RESOURCE_EXHAUSTED" in text:
    return errno.ENOSPC
  if any(w in text for w in _IO_WORDS + ("DATA_LOSS", "INTERNAL: Error writing")):
    return errno.EIO
  return None


def _first_line(e: BaseException) -> str:
  """The first line of an exception's message, at most 300 characters (tensorstore's are long)."""
  lines = str(e).strip().splitlines()
  return (lines[0] if lines else "")[:300]
