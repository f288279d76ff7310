"""A process of a 2-process run dies mid-training: the other stops with one line, in bounded time.

Two real 2-process runs (localhost, 2 fake CPU devices per process) train at once; in one,
process 1 is SIGKILLed once it has logged a training step, in the other process 0 (the
coordinator); the second starts once the first has compiled its train step, and loads the
compiled programs from their shared compilation cache. The survivor must exit with
distributed.EXIT_CODE within the heartbeat timeout (CBERT_PEER_TIMEOUT_S, small here) plus a
margin, printing exactly one "distributed error:" line that names the dead process and no C++
fatal message or stack dump. A normal 2-process finish (no message, exit 0) is tested in
test_multiprocess.py.
"""

import re
import signal
import subprocess
import sys
import time

import pytest

from cbert_jax.run import distributed, peer_watch
from tests.cli_helpers import cli, cli_env, free_port
from tests.helpers import ROOT, tiny_config

PEER_TIMEOUT_S = 6  # JAX sends heartbeats every 3 s; a process silent for 6 s is declared dead
BOUND_S = PEER_TIMEOUT_S + 2 + 8  # the documented bound (timeout + 2 s) + a margin for busy CPUs
TRAINING = re.compile(r"step \d+/\d+ \(")  # a progress line: the process is in the training loop
# What JAX's own abort prints: an absl FATAL line, a check failure, a stack dump, Python's dump.
CRASH = re.compile(
  r"^F\d{4} |Check fail|^\*\*\* |^\s+@\s+0x|Fatal Python error|terminate called|"
  r"Traceback|^Thread 0x",
  re.M,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """A data cache filled here, so the two processes of a run do not both build the tokenizer."""
  from cbert_jax.data import prepare, settings

  path = str(tmp_path_factory.mktemp("peer_cache"))
  prepare.prepare(settings.data_config(tiny_config(path)), 32)
  return path


class _Run:
  """A 2-process run whose process `victim` gets SIGKILL once it is training (`start` starts it)."""

  def __init__(self, victim: int, base, cache_dir: str, jax_cache: str):
    self.victim, self.survivor = victim, 1 - victim
    self.base, self.cache_dir = base, cache_dir
    self.env = cli_env(jax_cache) | {distributed.PEER_TIMEOUT_ENV: str(PEER_TIMEOUT_S)}
    self.logs = [base / f"p{i}.log" for i in range(2)]
    self.procs = []
    self.killed_at = self.exited_after = None

  def start(self) -> None:
    flags = [
      f"--coordinator_address=127.0.0.1:{free_port()}",
      "--num_processes=2",
      "--init_timeout=120",
      "--config.total_steps=1000",
      "--config.log_every=1",
      "--config.checkpoint_every=1000",
      "--config.mesh.data=-1",
    ]
    for i, log in enumerate(self.logs):
      args = cli(self.base / "run", self.cache_dir, *flags, f"--process_id={i}")
      with open(log, "w") as f:
        self.procs.append(
          subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=f)
        )

  def log(self, i: int) -> str:
    return self.logs[i].read_text() if self.logs[i].exists() else ""

  def step(self) -> bool:
    """Advance: kill the victim once it trains, note when the survivor exits. True when done."""
    if not self.procs:
      return False
    survivor = self.procs[self.survivor]
    if self.killed_at is None:
      if any(p.poll() is not None for p in self.procs):  # nothing may exit before the kill
        return True
      if TRAINING.search(self.log(self.victim)):
        self.procs[self.victim].send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
      return False
    if survivor.poll() is None:
      return False
    if self.exited_after is None:
      self.exited_after = time.monotonic() - self.killed_at
    return True

  def close(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
      p.wait()


@pytest.fixture(scope="module")
def killed_runs(cache, cli_jax_cache, tmp_path_factory):
  """{victim: finished _Run}: both runs at once, to halve the wall time; the second starts once
  the first has compiled its train step (process 0 writes the cache), so it compiles nothing."""
  runs = {
    v: _Run(v, tmp_path_factory.mktemp(f"kill_process_{v}"), cache, cli_jax_cache) for v in (1, 0)
  }
  first, second = runs[1], runs[0]
  try:
    first.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
      first_done = first.step()
      if not second.procs and (first_done or "compiled train step" in first.log(0)):
        second.start()
      if second.step() and first_done:
        break
      time.sleep(0.1)
  finally:
    for r in runs.values():
      r.close()
  return runs


@pytest.mark.parametrize("victim", [1, 0], ids=["process_1_dies", "coordinator_dies"])
def test_survivor_of_a_dead_peer_prints_one_line_and_exits_in_bounded_time(killed_runs, victim):
  run = killed_runs[victim]
  err = run.log(run.survivor)
  assert run.killed_at is not None, f"exited before process {victim} was killed:\n{err[-3000:]}"
  assert run.exited_after is not None, err[-3000:]
  assert run.exited_after < BOUND_S, (run.exited_after, err[-3000:])
  assert run.procs[run.survivor].returncode == distributed.EXIT_CODE, err[-3000:]
  lines = [l for l in err.splitlines() if "distributed error" in l]
  assert len(lines) == 1 and lines[0].startswith("distributed error: "), lines
  line = lines[0]
  dead = "process 0 of 2 (the coordinator at 127.0.0.1:" if victim == 0 else "process 1 of 2 "
  assert line.startswith(f"distributed error: {dead}"), line
  assert "stopped responding" in line and f"no heartbeat for {PEER_TIMEOUT_S} s" in line
  assert f"This is process {run.survivor} of 2, which stops too" in line
  assert f"Check process {victim}'s log" in line
  assert "rerun the same command on every process to resume from the last checkpoint" in line
  assert not CRASH.search(err), CRASH.search(err).group(0)
  assert TRAINING.search(err)  # the survivor was training too


def test_peer_failure_message_names_the_dead_process():
  msg = peer_watch.peer_failure_message(3, 4, 25, "h:1", coordinator_gone=True)
  assert msg.startswith("process 0 of 4 (the coordinator at h:1) stopped responding: ")
  assert "This is process 3 of 4" in msg and "Check process 0's log" in msg
  msg = peer_watch.peer_failure_message(3, 4, 25, "h:1", coordinator_gone=False)
  assert msg.startswith("another process (process 0's log names it) stopped responding")
  msg = peer_watch.peer_failure_message(0, 4, 25, "h:1")
  assert msg.startswith("one of processes 1..3 (the coordination service's error logged just above")
  msg = peer_watch.peer_failure_message(1, 2, 7.5, "h:1", stage="shutdown")
  assert msg.startswith(
    "process 0 of 2 (the coordinator at h:1) stopped responding while this "
    "process waited, at exit, for every process to finish: "
  )
  assert "no heartbeat for 7.5 s" in msg and "--peer_timeout than 7.5 s" in msg
  assert "\n" not in msg


def test_peer_timeout_from_argument_environment_or_default(monkeypatch):
  monkeypatch.delenv(distributed.PEER_TIMEOUT_ENV, raising=False)
  assert distributed.peer_timeout() == distributed.DEFAULT_PEER_TIMEOUT_S
  assert distributed.peer_timeout(9) == 9
  monkeypatch.setenv(distributed.PEER_TIMEOUT_ENV, "12.5")
  assert distributed.peer_timeout() == 12.5 and distributed.peer_timeout(3) == 3
  for bad in ("1", "soon", "nan", "inf"):
    monkeypatch.setenv(distributed.PEER_TIMEOUT_ENV, bad)
    with pytest.raises(
      distributed.DistributedError,
      match=f"CBERT_PEER_TIMEOUT_S='{bad}': expected a number of seconds >= 2",
    ):
      distributed.peer_timeout()


def test_terminate_hook_leaves_other_terminations_alone(tmp_path):
  """Only std::bad_cast (JAX's callback) is a lost peer; any other std::terminate still aborts."""
  code = (
    "import ctypes, ctypes.util\n"
    "from cbert_jax.run import peer_watch\n"
    "hook = peer_watch._TerminateHook(lambda: print('hooked', flush=True))\n"
    "assert hook.exception_name() is None\n"
    "lib = ctypes.CDLL(ctypes.util.find_library('stdc++'))\n"
    "getattr(lib, '_ZSt9terminatev')()\n"
  )  # std::terminate(), no exception in flight
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == -signal.SIGABRT, r.stderr[-3000:]
  assert "terminate called without an active exception" in r.stderr
  assert "hooked" not in r.stdout and "distributed error" not in r.stderr
