"""One builder per cache entry on a host: an exclusive `flock` on `<cache>/locks/<name>.lock`.

Several processes of one run (8 trainer processes per GPU node, or the two of the documented
two-process CPU run) start with the same empty cache. Without a lock each builds the same corpus,
tokenizer and probe task datasets at once; TFDS writes a dataset into a temporary folder and
renames it into place, and two renames of the same dataset race (one process crashed). `held`
serialises the builders: the first takes the lock and builds, the others wait, then find the entry
finished and only read it. Callers check for a finished entry again once they hold the lock.

Why flock and not the workdir's O_EXCL + heartbeat lock (`workdir_lock`): a cache build is short and
needs no takeover rule, and the kernel drops a flock when its holder dies (even by SIGKILL), so a
crashed builder never leaves a lock behind. flock is per host on some network filesystems (Lustre
without `flock`, GCS FUSE); across hosts the trainer therefore lets process 0 prepare the data
before the others start (`prepare.prepare_once`). Where flock is not supported at all the build
goes on unlocked, with one warning: the cache's atomic renames keep it correct, only the work is
repeated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator

from absl import logging

LOCK_DIR = "locks"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def lock_path(cache_root: str, name: str) -> str:
  """`<cache_root>/locks/<name>.lock` (`name` with '/' replaced, so it is one file name)."""
  return os.path.join(cache_root, LOCK_DIR, name.replace("/", "__") + ".lock")


@contextlib.contextmanager
def held(cache_root: str, name: str, what: str) -> Iterator[None]:
  """Holds the exclusive build lock `name` of the cache at `cache_root` for the `with` block.

  Args:
    cache_root: the data cache root (`fetch.cache_root`).
    name: the entry's lock name, e.g. "task-sentiment" or "prepare".
    what: what is being built, for the log line a waiting process prints.
  """
  path = lock_path(cache_root, name)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
  except OSError as e:  # a read-only cache: nothing will be built here anyway
    logging.warning("build lock %s cannot be created (%s); building %s unlocked", path, e, what)
    yield
    return
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      start = time.monotonic()
      logging.info("waiting for another process to finish building %s (lock %s)", what, path)
      fcntl.flock(fd, fcntl.LOCK_EX)
      logging.info("lock %s acquired after %.1f s", path, time.monotonic() - start)
    except OSError as e:
      if e.errno not in _UNSUPPORTED:
        raise
      logging.warning("flock is not supported at %s (%s); building %s unlocked", path, e, what)
    yield
  finally:
    os.close(fd)  # closing the descriptor releases the lock
