"""Self-checking cache entries: atomic writes, a sha256 sidecar, verification, move-aside.

Every file the data stack caches (the trained tokenizer, the packed `.npz`, the TFDS
ArrayRecord files of the offline corpus, the packed shards of `data.corpus="sources"`) is written with `write_entry` (or `atomic_write` plus a
digest), which records its size and sha256 next to it:

  <entry>.sha256.json   {"format": 1, "entry": "<name>", "size": bytes, "sha256": hex,
                         "sample_bytes": S, "sample_sha256": hex, ...}

Directory entries (a TFDS dataset) keep one such record per file in one sidecar
(`write_dir_sidecar`), and shards.py keeps them in its `index.json`.

What is verified when, and why:

* Every read checks the size and `sample_sha256`: the sha256 of the first, middle and last
  `S` bytes (S = 1 MiB; 64 KiB for the packed shards of `data.corpus="sources"`, which
  come by the thousand; S is recorded with each digest). That reads at most 3 S bytes
  whatever the entry's size, so it costs milliseconds, and it catches what real faults
  produce: a truncated copy or a disk-full write (size), an entry overwritten by garbage
  or by another file (first/last bytes), and damage in the middle of a file. Files of at
  most 3 S bytes (the tokenizer, small packed arrays) are hashed whole, so for them the
  sample check *is* the full check; the task kit extracts (tens of MB) are always hashed
  whole.
* `data.verify_cache="full"` also compares the full sha256. A packed array of a large
  corpus is several GB; hashing it on every run would add seconds per GB to every start
  (and every host of a pod reads it), for a fault (a flipped bit outside the sampled
  regions) that ECC and the filesystem's own checksums make rare. Use "full" after a disk
  or copy problem, or once on a freshly copied cache.
* After the digest check the reader still checks structure (the tokenizer loads and has
  pad 0 and `[MASK]`; the `.npz` loads, which also checks its zip CRC-32s, and its token
  ids are inside the vocabulary), so even damage the sample misses is caught when it makes
  the entry unusable.

An entry written by an older version has no sidecar: it is checked structurally only and,
if that passes, given a sidecar (best effort: a read-only cache is left as it is). A
damaged entry is moved aside to `<cache>/damaged/<name>-<time>-<pid>` with a warning
naming the file and the reason, and the caller rebuilds it from its sources; where those
are gone the caller raises one ConfigError naming the file and what rebuilds it.

Concurrency: writers hash the temporary file *before* the rename and rename the data file
and then its sidecar, so the window in which a reader sees a new file with an old sidecar
is two renames long; a reader that sees the file or its sidecar change while it verifies
checks again before calling the entry damaged.

Files and directories honour the umask (a group can share a cache): temporary files are
created with mode 0o666 & ~umask, not `tempfile.mkstemp`'s 0o600.

This is a leaf module (only the standard library, absl logging and `cbert_jax.errors`), so
every data module can import it without import cycles.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, TypeVar

from absl import logging

from cbert_jax.errors import ConfigError

FORMAT = 1
SIDECAR_SUFFIX = ".sha256.json"
# Bytes hashed at the start, middle and end of an entry by the default ("sample") check.
SAMPLE_BYTES = 1 << 20
VERIFY_MODES = ("sample", "full")
DAMAGED_DIR = "damaged"
_READ_CHUNK = 1 << 20

T = TypeVar("T")


class Damaged(Exception):
  """A cache entry exists but is unusable; the message says why (for the warning)."""


def check_mode(mode: Any) -> str:
  """Validates `data.verify_cache`; returns it.

  Raises:
    ConfigError: naming the field and the allowed values.
  """
  if mode not in VERIFY_MODES:
    raise ConfigError(
      f"data.verify_cache must be one of {', '.join(map(repr, VERIFY_MODES))} (size + "
      f"sha256 of a 3 MiB sample, or of the whole file), got {mode!r}."
    )
  return mode


# --- Writing --------------------------------------------------------------------------------


def _create_temp(directory: str, name: str) -> tuple[int, str]:
  """Creates a new temp file next to `name`; mode 0o666 & ~umask (mkstemp would give 0o600)."""
  while True:
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex[:12]}-{name}")
    try:
      return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
    except FileExistsError:
      continue


def atomic_write(
  path: str,
  write: bytes | Callable[[BinaryIO], None],
  *,
  before_rename: Callable[[str], None] | None = None,
) -> None:
  """Writes `path` via a temp file in the same directory and `os.replace`.

  Several processes (or hosts sharing a filesystem) may build the same cache entry at
  once; each writes its own temp file and the rename is atomic, so a reader never sees a
  half-written file and the last writer wins. The file gets mode 0o666 & ~umask and its
  directories 0o777 & ~umask, so a group-shared cache works with umask 0o002.

  Args:
    path: destination file.
    write: the bytes to write, or a function that writes to a binary file object.
    before_rename: called with the finished temp file's path just before the rename
      (`write_entry` hashes it there).
  """
  directory = os.path.dirname(path) or "."
  os.makedirs(directory, exist_ok=True)
  fd, tmp = _create_temp(directory, os.path.basename(path))
  try:
    with os.fdopen(fd, "wb") as f:
      if isinstance(write, bytes):
        f.write(write)
      else:
        write(f)
    if before_rename is not None:
      before_rename(tmp)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


# --- Digests --------------------------------------------------------------------------------


def _sample_regions(size: int, sample_bytes: int) -> list[tuple[int, int]]:
  """(offset, length) of the sampled regions: all of a small file, else first/middle/last."""
  if size <= 3 * sample_bytes:
    return [(0, size)]
  middle = size // 2 - sample_bytes // 2
  return [(0, sample_bytes), (middle, sample_bytes), (size - sample_bytes, sample_bytes)]


def _hash_regions(f: BinaryIO, regions: list[tuple[int, int]]) -> str:
  h = hashlib.sha256()
  for offset, length in regions:
    f.seek(offset)
    while length > 0:
      chunk = f.read(min(_READ_CHUNK, length))
      if not chunk:
        break  # the file shrank under us: the digest will not match
      h.update(chunk)
      length -= len(chunk)
  return h.hexdigest()


def sample_sha256(path: str, size: int, sample_bytes: int = SAMPLE_BYTES) -> str:
  """sha256 of the sampled regions of `path` (assuming it has `size` bytes)."""
  with open(path, "rb") as f:
    return _hash_regions(f, _sample_regions(size, sample_bytes))


def full_sha256(path: str) -> str:
  """sha256 of the whole file, read in 1 MiB chunks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_READ_CHUNK), b""):
      h.update(chunk)
  return h.hexdigest()


def digest(path: str, sample_bytes: int | None = None) -> dict[str, Any]:
  """{"size", "sha256", "sample_bytes", "sample_sha256"} of the file at `path`."""
  sample_bytes = SAMPLE_BYTES if sample_bytes is None else int(sample_bytes)
  size = os.path.getsize(path)
  return dict(
    size=size,
    sha256=full_sha256(path),
    sample_bytes=sample_bytes,
    sample_sha256=sample_sha256(path, size, sample_bytes),
  )


def check(path: str, expected: Mapping[str, Any], mode: str = "sample") -> str | None:
  """Compares `path` with a recorded digest; None if it matches, else the reason.

  Args:
    path: the file.
    expected: a `digest` dict (extra keys are ignored).
    mode: "sample" (size + sample hash) or "full" (size + full sha256, plus the sample).

  Raises:
    OSError: the file cannot be read (missing, permissions): not evidence of damage, so
      the caller decides.
  """
  size = os.path.getsize(path)
  try:
    want_size = int(expected["size"])
    sample_bytes = int(expected.get("sample_bytes", SAMPLE_BYTES))
  except (KeyError, TypeError, ValueError) as e:
    return f"its record is unusable ({e!r})"
  if size != want_size:
    return f"size {size} bytes, expected {want_size}"
  if "sample_sha256" in expected:
    if sample_sha256(path, size, sample_bytes) != expected["sample_sha256"]:
      return "sha256 of its first/middle/last bytes does not match its record"
  if mode == "full" or "sample_sha256" not in expected:
    if full_sha256(path) != expected["sha256"]:
      return "sha256 does not match its record"
  return None


# --- Sidecars -------------------------------------------------------------------------------


def sidecar_path(path: str) -> str:
  """`<path>.sha256.json`."""
  return path + SIDECAR_SUFFIX


def read_sidecar(path: str) -> dict[str, Any] | None:
  """The sidecar of `path`, None if there is none.

  Raises:
    Damaged: the sidecar exists but is not a readable record.
  """
  try:
    with open(sidecar_path(path), "rb") as f:
      raw = f.read()
  except FileNotFoundError:
    return None
  except OSError as e:
    raise Damaged(f"its sidecar {sidecar_path(path)} cannot be read ({e})") from e
  try:
    record = json.loads(raw)
  except ValueError as e:
    raise Damaged(f"its sidecar {sidecar_path(path)} is not JSON ({e})") from e
  if not isinstance(record, dict) or "size" not in record or "sha256" not in record:
    raise Damaged(f"its sidecar {sidecar_path(path)} lacks size/sha256")
  return record


def _sidecar_bytes(path: str, record: Mapping[str, Any], extra: Mapping[str, Any]) -> bytes:
  body = dict(format=FORMAT, entry=os.path.basename(path), **record, **extra)
  return json.dumps(body, indent=1, sort_keys=True).encode("utf-8")


def write_sidecar(path: str, record: Mapping[str, Any] | None = None, **extra: Any) -> None:
  """Writes `<path>.sha256.json` (atomically) from `record`, or from a fresh digest."""
  record = digest(path) if record is None else record
  atomic_write(sidecar_path(path), _sidecar_bytes(path, record, extra))


def write_entry(path: str, write: bytes | Callable[[BinaryIO], None], **extra: Any) -> None:
  """`atomic_write` plus the sidecar: the digest is taken from the temp file before rename.

  Args:
    path: destination file.
    write: bytes, or a function writing to a binary file object.
    **extra: JSON-able facts stored in the sidecar (e.g. `kind`, `vocab_size`).
  """
  record: dict[str, Any] = {}
  atomic_write(path, write, before_rename=lambda tmp: record.update(digest(tmp)))
  atomic_write(sidecar_path(path), _sidecar_bytes(path, record, extra))


def _stat_key(path: str) -> tuple[int, int, int] | None:
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_ino, st.st_size, st.st_mtime_ns


def verify(path: str, mode: str = "sample") -> str | None:
  """Checks `path` against its sidecar; None if it matches (or has no sidecar), else why.

  Checks again (up to 3 times) when the file or its sidecar changed during the check: a
  concurrent writer replacing the entry is not damage.

  Raises:
    OSError: `path` cannot be read (see `check`).
  """
  reason = None
  for attempt in range(3):
    before = (_stat_key(path), _stat_key(sidecar_path(path)))
    try:
      record = read_sidecar(path)
      reason = None if record is None else check(path, record, mode)
    except Damaged as e:
      reason = str(e)
    if reason is None or before == (_stat_key(path), _stat_key(sidecar_path(path))):
      return reason
    time.sleep(0.05 * (attempt + 1))
  return reason


# --- Directory entries ------------------------------------------------------------------------


def write_dir_sidecar(directory: str, names: list[str], sidecar: str, **extra: Any) -> None:
  """Records the digest of each file `names` (relative to `directory`) in one sidecar file."""
  files = {name: digest(os.path.join(directory, name)) for name in sorted(names)}
  body = dict(format=FORMAT, files=files, **extra)
  atomic_write(
    os.path.join(directory, sidecar), json.dumps(body, indent=1, sort_keys=True).encode("utf-8")
  )


def verify_dir(directory: str, sidecar: str, mode: str = "sample") -> str | None:
  """Checks every file recorded in `directory/sidecar`; None if all match, else why.

  Raises:
    FileNotFoundError: there is no sidecar (an entry from an older version).
    PermissionError: a file cannot be read (not evidence of damage).
  """
  path = os.path.join(directory, sidecar)
  with open(path, "rb") as f:
    raw = f.read()
  try:
    files = json.loads(raw)["files"]
    items = sorted(files.items())
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return f"its sidecar {path} is unreadable ({e!r})"
  for name, record in items:
    try:
      reason = check(os.path.join(directory, name), record, mode)
    except FileNotFoundError:
      reason = "missing"
    except PermissionError:
      raise
    except OSError as e:
      reason = f"cannot be read ({e})"
    if reason is not None:
      return f"{name}: {reason}"
  return None


# --- Damaged entries --------------------------------------------------------------------------


def move_aside(
  path: str, cache_root: str, reason: str, what: str = "cache entry", name: str | None = None
) -> str | None:
  """Moves a damaged entry (file or directory, with its sidecar) to `<cache>/damaged/`.

  Logs one warning naming the entry, the reason and where it went. Nothing is deleted, so
  the damage can be inspected; `<cache>/damaged/` may be removed at any time.

  Args:
    path: the damaged file or directory.
    cache_root: the cache root.
    reason: why it is damaged (for the warning).
    what: what it is, e.g. "packed arrays".
    name: the name under `damaged/` (before the time stamp); default the base name.

  Returns:
    The new path, or None if the entry was already gone (another process moved it).
  """
  stamp = time.strftime("%Y%m%d-%H%M%S")
  dest_dir = os.path.join(cache_root, DAMAGED_DIR)
  os.makedirs(dest_dir, exist_ok=True)
  name = name or os.path.basename(path.rstrip(os.sep))
  dest = os.path.join(dest_dir, f"{name}-{stamp}-{os.getpid()}")
  n = 1
  while os.path.exists(dest) or os.path.exists(sidecar_path(dest)):
    n += 1
    dest = os.path.join(dest_dir, f"{name}-{stamp}-{os.getpid()}-{n}")
  try:
    os.replace(path, dest)
  except FileNotFoundError:
    return None
  except OSError:
    # Not on the same filesystem (or a directory over a non-empty one): copy, then remove.
    try:
      shutil.move(path, dest)
    except FileNotFoundError:
      return None
  side = sidecar_path(path)
  if os.path.exists(side):
    try:
      os.replace(side, sidecar_path(dest))
    except OSError:
      pass
  logging.warning("Damaged %s %s (%s): moved to %s; rebuilding it.", what, path, reason, dest)
  return dest


def load_verified(
  path: str, mode: str, load: Callable[[str], T], *, cache_root: str, what: str
) -> T | None:
  """Reads a cache file through its digest check and a structural `load`.

  Args:
    path: the entry.
    mode: "sample" | "full" (`data.verify_cache`).
    load: reads the entry; raises `Damaged` (or returns normally) after its structural
      checks.
    cache_root: the cache root (where `damaged/` is).
    what: what the entry is, for the warning ("packed arrays", "tokenizer").

  Returns:
    What `load` returned, or None if the entry is absent or was damaged (moved aside):
    the caller then rebuilds it. An entry without a sidecar that loads gets one.
  """
  if not os.path.exists(path):
    return None
  had_sidecar = os.path.exists(sidecar_path(path))
  try:
    reason = verify(path, mode)
    if reason is None:
      try:
        value = load(path)
      except Damaged as e:
        reason = str(e)
  except FileNotFoundError:
    return None  # moved or replaced by another process meanwhile: rebuild
  except PermissionError as e:
    # Not damage: moving a good entry aside would only hide the real problem.
    raise ConfigError(
      f"data.cache_dir: the cached {what} {path} cannot be read ({e.strerror}); fix its "
      "permissions, or set data.cache_dir to a directory of your own."
    ) from e
  except OSError as e:  # EIO and the like: the bytes cannot be had, so rebuild them
    reason = f"cannot be read ({e})"
  if reason is not None:
    move_aside(path, cache_root, reason, what)
    return None
  if not had_sidecar:
    try:
      write_sidecar(path, kind=what, note="added to an entry written before sidecars")
    except OSError as e:  # a read-only cache: verified structurally, leave it as it is
      logging.info("Cannot add a sidecar to %s (%s).", path, e)
  return value
