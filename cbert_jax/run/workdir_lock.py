"""One training run per workdir: an advisory lock file, `<workdir>/run.lock`.

Two runs writing one workdir interleave metrics.jsonl, write two TensorBoard files and race on
checkpoints. `acquire` creates the lock file with O_CREAT|O_EXCL (atomic on local disks and NFS)
holding this run's host, pid, process start time and command; `release` removes it. While the run
lives, a daemon thread touches the file every `HEARTBEAT_S` seconds, so a lock from another host
can be judged by its age.

A lock that exists is *stale* (taken over with a warning) when
- it was written on this host and its pid is gone, or the pid now belongs to a process started
  at another time (pid reuse), or
- it was written by an earlier attempt of this same scheduler job (`SLURM_JOB_ID` survives a
  requeue, `JOBSET_NAME` an xpk/JobSet restart; neither scheduler runs two attempts of one job at
  once), so a job requeued onto another node after a hard kill is not locked out, or
- it was written on another host and its heartbeat is older than `STALE_AFTER_S` (a run killed
  with SIGKILL or a lost host; the live holder touches it every `HEARTBEAT_S`).
Otherwise the run is refused with one line naming the other run and the lock file.

Filesystems without working mtimes or O_EXCL (some FUSE mounts) still get the same-host check.
Why not flock for the lock itself: on Lustre/GCS FUSE it is host-local or missing, and it says
nothing about a holder on another host; the heartbeat does.

Taking over a stale lock is atomic: two starters that both find it stale can never both win.
The judgement and the removal run under an exclusive `flock` of the workdir directory (released
by the kernel if the starter dies, so it never goes stale itself), and the removal renames the
lock aside and checks that what it moved is the very file it judged (device, inode, mtime); a
fresh lock another starter wrote in between is put back with `os.link` (which never overwrites)
and the lock is judged again. Where the filesystem has no flock, the rename-and-check alone
keeps the second starter out.

Only process 0 of a multi-process run takes the lock; `train.run` shares the outcome with the
other processes so all of them stop together when it is refused.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time

from absl import logging

from cbert_jax.errors import WorkdirError

LOCK_NAME = "run.lock"
HEARTBEAT_S = 15.0  # the holder touches the lock this often
STALE_AFTER_S = 300.0  # another host's lock untouched this long belongs to a dead run


def _process_start(pid: int) -> str | None:
  """The start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22); None if gone
  or unknown (no /proc: then only the pid's existence is checked)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, start: str | None) -> bool:
  """True while `pid` runs and (when both are known) started at `start`."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # exists, owned by another user
  now = _process_start(pid)
  return start is None or now is None or now == start


# Environment variables that name a scheduler job across its restarts (first one set wins).
JOB_ENV = ("SLURM_JOB_ID", "JOBSET_NAME")


def _job_id() -> str:
  """ "SLURM_JOB_ID=123" (or JOBSET_NAME=...) when run by a scheduler, else ""."""
  for name in JOB_ENV:
    if os.environ.get(name):
      return f"{name}={os.environ[name]}"
  return ""


def _describe(info: dict) -> str:
  started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("start_time", 0)))
  return (
    f"pid {info.get('pid')} on host {info.get('host')}, started {started}"
    f" ({' '.join(info.get('command', []))[:120]})"
  )


class WorkdirLock:
  """The lock of one workdir; `acquire` then `release` (or use as a context manager)."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_NAME)
    self._info = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "pid_start": _process_start(os.getpid()),
      "start_time": time.time(),
      "command": sys.argv,
      "job": _job_id(),
    }
    self._stop = threading.Event()
    self._thread = None
    self._created = False  # whether acquire() created the workdir (release removes it if empty)

  def acquire(self) -> None:
    """Take the lock, or raise WorkdirError (one line) naming the run that holds it.

    Also the first write into the workdir, so an unusable workdir (a file, read-only, no
    permission) is reported here, before any data preparation.
    """
    self._make_dir()
    for _ in range(3):  # a stale lock is moved away and this run's created, else retried
      if self._create() or self._take_over_if_stale():
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="workdir-lock")
        self._thread.start()
        return
    raise WorkdirError(
      f"--workdir {self.workdir}: could not take the lock {self.path} (another "
      "run keeps taking it); retry"
    )

  def release(self) -> None:
    """Stop the heartbeat and remove the lock file if it is still this run's."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
      self._thread = None
      if self._read() == self._info:
        try:
          os.remove(self.path)
        except FileNotFoundError:
          pass
        except OSError as e:  # the workdir became unwritable: never hide the error that stops us
          logging.warning(
            "could not remove the lock %s (%s); it names this finished process, so the next run "
            "takes it over",
            self.path,
            e.strerror,
          )
    if self._created:  # a run that failed before writing anything leaves no empty workdir
      try:
        os.rmdir(self.workdir)  # only succeeds when it is empty
        logging.info("removed the empty workdir %s this run had created", self.workdir)
      except OSError:
        pass

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()

  def _make_dir(self) -> None:
    if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
      raise WorkdirError(
        f"--workdir {self.workdir} is a file, not a directory; pass a directory "
        "path (it is created if missing)"
      )
    self._created = not os.path.exists(self.workdir)
    try:
      os.makedirs(self.workdir, exist_ok=True)
    except OSError as e:
      raise WorkdirError(
        f"--workdir {self.workdir} cannot be created ({e.strerror}); pass a writable path"
      ) from e
    if not os.access(self.workdir, os.W_OK | os.X_OK):
      raise WorkdirError(
        f"--workdir {self.workdir} is not writable by this user; fix its "
        "permissions or pass another path"
      )

  def _read(self) -> dict | None:
    return self._read_identified()[0]

  def _read_identified(self) -> tuple[dict | None, tuple | None]:
    """(the lock's contents or None, the identity (dev, inode, mtime) of the file read or None
    when there is none)."""
    try:
      with open(self.path) as f:
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino, st.st_mtime_ns)
        try:
          return json.load(f), ident
        except ValueError:
          return None, ident
    except OSError:
      return None, None

  @contextlib.contextmanager
  def _takeover_guard(self):
    """An exclusive flock of the workdir while a stale lock is judged, removed and replaced
    (nothing where the filesystem has no flock: the identity check in `_remove_judged` then
    suffices)."""
    try:
      fd = os.open(self.workdir, os.O_RDONLY)
    except OSError:
      yield
      return
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX)
      except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF):
          raise
      yield
    finally:
      os.close(fd)  # releases the flock

  def _create(self) -> bool:
    """Create the lock file with this run's info (O_EXCL); False if a lock file exists."""
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    except OSError as e:
      raise WorkdirError(
        f"--workdir {self.workdir}: cannot write the lock file {self.path} "
        f"({e.strerror}); the workdir must be writable"
      ) from e
    with os.fdopen(fd, "w") as f:
      json.dump(self._info, f)
    return True

  def _take_over_if_stale(self) -> bool:
    """Move a stale lock away (with a warning) and create this run's, both under the guard, so a
    starter waiting on the guard finds this run's live lock; True if created. Raises
    WorkdirError for a live lock."""
    with self._takeover_guard():
      self._judge_and_remove()
      return self._create()

  def _judge_and_remove(self) -> None:
    info, ident = self._read_identified()
    if ident is None:
      return  # gone already (its run released it, or another starter took it over): retry
    if info is None:  # being written right now, or garbage: judge it by its age
      try:
        age = time.time() - os.path.getmtime(self.path)
      except FileNotFoundError:
        return
      if age < 5:
        time.sleep(1)
        return
      why = f"an unreadable lock file {age:.0f} s old"
    elif info.get("host") == self._info["host"]:
      if _alive(int(info.get("pid", -1)), info.get("pid_start")):
        raise WorkdirError(
          f"--workdir {self.workdir} is in use by another run ({_describe(info)}); "
          "wait for it to finish, stop it, or use another --workdir"
        )
      why = f"its run ({_describe(info)}) is no longer running"
    elif self._info["job"] and info.get("job") == self._info["job"]:
      why = (
        f"it was left by an earlier attempt of this job ({self._info['job']}; {_describe(info)})"
      )
    else:
      try:
        age = time.time() - os.path.getmtime(self.path)
      except FileNotFoundError:
        return
      if age < STALE_AFTER_S:
        raise WorkdirError(
          f"--workdir {self.workdir} is in use by a run on another host ({_describe(info)}; "
          f"lock touched {age:.0f} s ago); wait for it, or if that run is dead, delete "
          f"{self.path} (it is taken over by itself after {STALE_AFTER_S:.0f} s untouched)"
        )
      why = f"its run ({_describe(info)}) has not touched it for {age:.0f} s"
    _after_judging()
    if self._remove_judged(ident):
      logging.warning("taking over the lock of %s: %s", self.workdir, why)

  def _remove_judged(self, ident: tuple) -> bool:
    """Remove the lock file if it is still the one judged stale (`ident`); True if it was.

    Renames whatever is at the lock's path aside (atomic), then compares: a lock another starter
    wrote since the judgement is put back with `os.link` (never overwriting) and left alone."""
    aside = f"{self.path}.stale-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False  # another starter moved it first; retry the create
    st = os.stat(aside)
    if (st.st_dev, st.st_ino, st.st_mtime_ns) != ident:
      try:
        os.link(aside, self.path)  # a live lock: back where it was
      except FileExistsError:
        logging.warning("the lock of %s changed hands twice during a takeover", self.workdir)
      os.remove(aside)
      return False
    os.remove(aside)
    return True

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self.path)
      except OSError:
        pass  # a lock removed by hand or a filesystem without mtimes: nothing to refresh


def _after_judging() -> None:
  """Between judging a lock stale and removing it (a seam where a test forces another starter in)."""


def lock_for_run(workdir: str, is_primary: bool) -> WorkdirLock | None:
  """Process 0 takes the workdir's lock; every process raises WorkdirError if it could not (the
  others learn process 0's outcome through an all-gather)."""
  lock, error = None, None
  if is_primary:
    lock = WorkdirLock(workdir)
    try:
      lock.acquire()
    except WorkdirError as e:
      lock, error = None, e
  import jax  # pylint: disable=import-outside-toplevel  # only runs need it, not the launcher
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  if jax.process_count() > 1:  # the others wait here for process 0's outcome
    failed = bool(multihost_utils.process_allgather(np.int32(error is not None)).any())
    if failed and error is None:
      raise WorkdirError(
        f"process 0 could not take the lock of --workdir {workdir} (its output says why)"
      )
  if error is not None:
    raise error
  return lock
