"""A workdir is never lost or shared: its lock, unusable workdirs, another model's checkpoint.

The lock's stale-detection rules run on `WorkdirLock` directly (no training); the trainer-level
cases replay the faults of issue 15 through `train.run` / `evaluate.run` in-process and check
that nothing was written or moved. (The CLI replay of two runs on one workdir, SIGINT and the
finished-run rerun is `test_cli.py::test_a_signal_saves_a_checkpoint_and_the_next_run_resumes`.)
"""

import errno
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from cbert_jax import config_lib, evaluate, train
from cbert_jax.errors import ConfigError, WorkdirError
from cbert_jax.run import workdir_lock
from tests.helpers import losses, tiny_config


def _write_lock(workdir, **info):
  os.makedirs(workdir, exist_ok=True)
  base = {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "pid_start": workdir_lock._process_start(os.getpid()),
    "start_time": time.time(),
    "command": ["python", "-m", "cbert_jax.main", "--config=other.py"],
  }
  path = os.path.join(workdir, workdir_lock.LOCK_NAME)
  with open(path, "w") as f:
    json.dump(base | info, f)
  return path


def test_a_live_run_on_this_host_is_refused_naming_it(tmp_path):
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    _write_lock(tmp_path, pid=sleeper.pid, pid_start=workdir_lock._process_start(sleeper.pid))
    with pytest.raises(
      WorkdirError,
      match=rf"--workdir {tmp_path} is in use by another run "
      rf"\(pid {sleeper.pid} on host {socket.gethostname()}, started .*other.py",
    ):
      workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  finally:
    sleeper.kill()
    sleeper.wait()


@pytest.mark.parametrize("case", ["pid-gone", "pid-reused"])
def test_a_stale_lock_on_this_host_is_taken_over(tmp_path, case, caplog):
  if case == "pid-gone":
    gone = subprocess.Popen(["true"])
    gone.wait()
    _write_lock(tmp_path, pid=gone.pid, pid_start="1")
  else:  # our own pid, but the lock's process started at another time
    _write_lock(tmp_path, pid_start="12345")
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  held = json.load(open(lock.path))
  assert held["pid"] == os.getpid() and held["pid_start"] == workdir_lock._process_start(
    os.getpid()
  )
  assert any(
    "taking over the lock" in r.getMessage() and "no longer running" in r.getMessage()
    for r in caplog.records
  )
  lock.release()
  assert not os.path.exists(lock.path)


@pytest.mark.parametrize("flock", ["flock", "no-flock"])
def test_two_starters_taking_over_one_stale_lock_never_both_win(tmp_path, monkeypatch, flock):
  # Issue 33: takeover was check-then-act. Starter A judges the stale lock and pauses before
  # removing it; starter B runs meanwhile. With the workdir's flock, B waits until A has replaced
  # the stale lock with its own (both under the flock) and then finds A's live lock; without
  # flock (some FUSE mounts), B takes over first and A's removal must find that the file is no
  # longer the one it judged. Either way exactly one wins, and the lock file is the winner's.
  gone = subprocess.Popen(["true"])
  gone.wait()
  _write_lock(tmp_path, pid=gone.pid, pid_start="1")
  if flock == "no-flock":

    def no_flock(fd, op):
      raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(workdir_lock.fcntl, "flock", no_flock)
  a, b = workdir_lock.WorkdirLock(str(tmp_path)), workdir_lock.WorkdirLock(str(tmp_path))
  outcome = {}

  def start(name, lock):
    try:
      lock.acquire()
      outcome[name] = "won"
    except WorkdirError as e:
      outcome[name] = str(e)

  b_thread = threading.Thread(target=start, args=("b", b))
  paused = []

  def after_judging():  # only A's first judgement pauses: B runs inside it
    if threading.current_thread() is threading.main_thread() and not paused:
      paused.append(True)
      b_thread.start()
      b_thread.join(timeout=1.5)  # without flock B finishes; with it B waits on A

  monkeypatch.setattr(workdir_lock, "_after_judging", after_judging)
  start("a", a)
  b_thread.join(timeout=30)
  assert paused and not b_thread.is_alive()
  winners = [n for n in ("a", "b") if outcome[n] == "won"]
  assert len(winners) == 1, outcome
  loser = "b" if winners == ["a"] else "a"
  assert "is in use by another run" in outcome[loser]
  winner = a if winners == ["a"] else b
  assert workdir_lock.WorkdirLock(str(tmp_path))._read() == winner._info
  assert winners == (["a"] if flock == "flock" else ["b"])
  assert sorted(os.listdir(tmp_path)) == [workdir_lock.LOCK_NAME]  # nothing left aside
  winner.release()
  assert os.listdir(tmp_path) == []


def test_another_hosts_lock_is_refused_while_fresh_and_taken_over_when_untouched(tmp_path):
  path = _write_lock(tmp_path, host="tpu-vm-7", pid=4242)
  with pytest.raises(
    WorkdirError,
    match=r"in use by a run on another host \(pid 4242 on host "
    r"tpu-vm-7.*if that run is dead, delete .*run.lock",
  ):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  old = time.time() - workdir_lock.STALE_AFTER_S - 60
  os.utime(path, (old, old))
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  assert json.load(open(path))["host"] == socket.gethostname()
  lock.release()


def test_a_lock_left_by_an_earlier_attempt_of_the_same_slurm_job_is_taken_over(
  tmp_path, monkeypatch
):
  """A requeued job may land on another node seconds after a hard kill of the first attempt."""
  monkeypatch.setenv("SLURM_JOB_ID", "777")
  _write_lock(tmp_path, host="node-a", pid=4242, job="SLURM_JOB_ID=778")
  with pytest.raises(WorkdirError, match="in use by a run on another host"):  # another job
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  _write_lock(tmp_path, host="node-a", pid=4242, job="SLURM_JOB_ID=777")
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  assert json.load(open(lock.path))["job"] == "SLURM_JOB_ID=777"
  lock.release()


def test_the_holder_heartbeats_and_releases_only_its_own_lock(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_S", 0.05)
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  old = time.time() - 1000
  os.utime(lock.path, (old, old))
  time.sleep(0.5)
  assert time.time() - os.path.getmtime(lock.path) < 60  # touched again
  _write_lock(tmp_path, pid=1)  # someone replaced it by hand
  lock.release()
  assert json.load(open(lock.path))["pid"] == 1  # not ours: left alone


@pytest.fixture()
def no_data_prep(monkeypatch):
  """Fails the test if data preparation starts (the refusal must come before it)."""
  from cbert_jax.data import prepare as prepare_lib  # pylint: disable=g-import-not-at-top

  def prepare(*a, **k):
    raise AssertionError("data preparation started")

  monkeypatch.setattr(prepare_lib, "prepare", prepare)


def test_training_on_a_locked_workdir_writes_nothing(tmp_path, cache_dir, no_data_prep):
  holder = workdir_lock.WorkdirLock(str(tmp_path / "w"))
  holder.acquire()
  with pytest.raises(WorkdirError, match="is in use by another run"):
    train.run(tiny_config(cache_dir), str(tmp_path / "w"))
  assert os.listdir(tmp_path / "w") == [workdir_lock.LOCK_NAME]  # the holder's lock, only
  holder.release()


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, cache_dir, no_data_prep):
  (tmp_path / "w").write_text("notes")
  with pytest.raises(WorkdirError, match=rf"--workdir {tmp_path / 'w'} is a file, not a directory"):
    train.run(tiny_config(cache_dir), str(tmp_path / "w"))
  assert (tmp_path / "w").read_text() == "notes"


def test_a_workdir_without_write_permission_is_one_line(
  tmp_path, cache_dir, no_data_prep, monkeypatch
):
  (tmp_path / "w").mkdir()
  real = os.access  # as root, chmod cannot take write permission away: the check is simulated
  monkeypatch.setattr(
    os,
    "access",
    lambda p, mode, **k: False if str(p) == str(tmp_path / "w") else real(p, mode, **k),
  )
  with pytest.raises(WorkdirError, match="is not writable by this user"):
    train.run(tiny_config(cache_dir), str(tmp_path / "w"))
  assert os.listdir(tmp_path / "w") == []


def test_a_read_only_filesystem_is_one_line(tmp_path, cache_dir, no_data_prep, monkeypatch):
  real = os.open

  def read_only(path, flags, *a, **k):
    if str(path).endswith(workdir_lock.LOCK_NAME):
      raise OSError(30, "Read-only file system", path)
    return real(path, flags, *a, **k)

  monkeypatch.setattr(os, "open", read_only)
  with pytest.raises(
    WorkdirError,
    match=r"cannot write the lock file .*\(Read-only file system\); "
    "the workdir must be writable",
  ):
    train.run(tiny_config(cache_dir), str(tmp_path / "w"))


def test_resuming_with_another_model_size_moves_nothing_and_the_run_resumes(tmp_path, cache_dir):
  """Issue 15's first fault: allow_config_change with another model.size used to move both good
  checkpoints aside, and the next run then trained from step 1."""
  work = str(tmp_path / "w")
  train.run(tiny_config(cache_dir, stop_after_step=4), work)
  before = losses(work)
  with pytest.raises(
    ConfigError,
    match=r"checkpoint step 4 in .* was written by another model "
    r"than this config builds: params/.*stored \(.*32.*\), this config \(.*64",
  ):
    train.run(tiny_config(cache_dir, allow_config_change=True, **{"model.size": "d64L2"}), work)
  assert sorted(os.listdir(os.path.join(work, "checkpoints"))) == ["4"]
  assert not os.path.exists(os.path.join(work, "checkpoints.unreadable"))
  summary = train.run(tiny_config(cache_dir), work)  # the original config resumes
  after = losses(work)
  assert summary.final_step == 8 and sorted(after) == list(range(1, 9))
  assert summary.first_loss == after[5]  # resumed at step 5, not 1
  assert all(after[s] == before[s] for s in range(1, 5))


def test_eval_of_another_model_family_or_size_is_refused_before_restoring(
  tmp_path, cache_dir, no_data_prep
):
  work = tmp_path / "w"
  os.makedirs(work / "checkpoints" / "4")  # (never read: refused first)
  trained = config_lib.resolve(tiny_config(cache_dir))
  (work / "config.json").write_text(
    json.dumps({"config": json.loads(trained.to_json_best_effort())})
  )
  as_bert = tiny_config(cache_dir, model="bert", mode="eval")
  with pytest.raises(
    ConfigError,
    match=rf"mode=eval: {work} holds a crossbert d32L2 run \(its "
    r"config.json\), not the model this config describes: model_name 'crossbert' "
    r"\(trained\) vs 'bert' \(this config\)",
  ):
    evaluate.run(as_bert, str(work))
  bigger = tiny_config(cache_dir, mode="eval", **{"model.size": "d64L2"})
  with pytest.raises(ConfigError, match=r"model.d_model 32 \(trained\) vs 64 \(this config\)"):
    evaluate.run(bigger, str(work))


def test_bert_records_that_it_does_not_use_cms(cache_dir, tmp_path):
  assert config_lib.resolve(tiny_config(cache_dir, model="bert")).masking.cms is False
  assert config_lib.resolve(tiny_config(cache_dir)).masking.cms is True
  # A BERT workdir written before (masking.cms: true) still resumes.
  from cbert_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top

  old = json.loads(config_lib.resolve(tiny_config(cache_dir, model="bert")).to_json_best_effort())
  old["masking"]["cms"] = True
  (tmp_path / "config.json").write_text(json.dumps({"config": old}))
  assert (
    workdir_lib.check_config(
      str(tmp_path), config_lib.resolve(tiny_config(cache_dir, model="bert"))
    )
    == []
  )


def test_a_first_run_that_fails_leaves_no_empty_workdir(tmp_path, cache_dir, monkeypatch):
  """A run that fails after taking the lock (here: its data cannot be prepared) removes the workdir
  it created, so the next attempt does not find a stray empty folder; a workdir that was already
  there stays, and so does one the run wrote into."""
  from cbert_jax.data import prepare  # pylint: disable=import-outside-toplevel

  def unavailable(*args, **kwargs):
    raise ConfigError("data source x==1 (pypi): download failed (gone)")

  monkeypatch.setattr(prepare, "prepare_once", unavailable)
  fresh = tmp_path / "runs" / "first"
  with pytest.raises(ConfigError, match="download failed"):
    train.run(tiny_config(cache_dir), str(fresh))
  assert not fresh.exists() and (tmp_path / "runs").is_dir()
  mine = tmp_path / "mine"
  mine.mkdir()
  with pytest.raises(ConfigError, match="download failed"):
    train.run(tiny_config(cache_dir), str(mine))
  assert mine.is_dir() and os.listdir(mine) == []
