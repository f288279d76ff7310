"""Crash safety: SIGKILL at a random step or mid-checkpoint, unreadable checkpoints, a full disk."""

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import time

import orbax.checkpoint as ocp
import pytest

from cbert_jax import train
from cbert_jax.errors import CheckpointError
from tests.cli_helpers import cli, cli_env, run_cli
from tests.helpers import ROOT, losses, tiny_config

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax writes here, then renames to <step> when complete
STEPS = 10  # a checkpoint every step: a kill at a random step 3..7, or during checkpoint 2..9


def _cli(workdir, cache, *extra):
  return cli(
    workdir,
    cache,
    f"--config.total_steps={STEPS}",
    "--config.log_every=1",
    "--config.checkpoint_every=1",
    "--config.keep_checkpoints=3",
    *extra,
  )


def _train_losses(workdir) -> dict:
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in rows if "train/loss" in r]
  assert steps == sorted(set(steps)), f"duplicate or unordered steps: {steps}"
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("crash_cache"))


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
  """One JAX compilation cache for the CLI runs of this module: all of one config, so the
  reference run compiles and the killed and restarted runs load the same executables."""
  return str(tmp_path_factory.mktemp("crash_jax_cache"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache, jax_cache):
  """An uninterrupted run (checkpointing every step like the killed ones)."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  r = run_cli(_cli(workdir, cache), jax_cache=jax_cache)
  assert r.returncode == 0, r.stderr[-3000:]
  return _train_losses(workdir)


def _start(workdir, cache, jax_cache):
  return subprocess.Popen(
    _cli(workdir, cache),
    cwd=ROOT,
    env=cli_env(jax_cache),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )


def _wait_for(predicate, proc, timeout=240.0, poll=0.002):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    if proc.poll() is not None:
      return False
    time.sleep(poll)
  return False


@pytest.mark.parametrize("when", ["random_step", "mid_checkpoint"])
def test_sigkill_then_restart_equals_uninterrupted(tmp_path, cache, jax_cache, reference, when):
  ckpts = tmp_path / "checkpoints"
  proc = _start(tmp_path, cache, jax_cache)
  try:
    if when == "random_step":  # kill as soon as a randomly drawn step has been logged
      kill_at = random.Random(os.getpid()).randint(3, STEPS - 3)
      metrics = tmp_path / "metrics.jsonl"
      ok = _wait_for(
        lambda: metrics.exists() and metrics.read_text().count('"train/loss"') >= kill_at, proc
      )
    else:  # kill while orbax is writing a checkpoint (its temporary dir exists)
      ok = _wait_for(
        lambda: (
          ckpts.exists()
          and any(TMP_SUFFIX in n and not n.startswith("1") for n in os.listdir(ckpts))
        ),
        proc,
      )
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert ok, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
  assert proc.returncode == -signal.SIGKILL
  complete = sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())
  assert complete, "no checkpoint completed before the kill"

  r = run_cli(_cli(tmp_path, cache), jax_cache=jax_cache)
  assert r.returncode == 0, r.stderr[-3000:]
  resumed_from = int(r.stderr.split("resumed from checkpoint at step ")[1].split()[0])
  assert resumed_from in complete  # a complete checkpoint, never a temporary one
  assert "cannot be read" not in r.stderr  # and it was readable
  after = _train_losses(tmp_path)
  assert sorted(after) == list(range(1, STEPS + 1))
  for step in range(resumed_from + 1, STEPS + 1):
    assert after[step] == pytest.approx(reference[step], rel=1e-6), step
  assert not [n for n in os.listdir(ckpts) if TMP_SUFFIX in n]  # cleaned up on restart


def test_unreadable_latest_checkpoint_falls_back_to_the_previous(tmp_path, cache_dir):
  # total_steps=12 like the disk-full tests below: the same programs, compiled once per session.
  full = tiny_config(cache_dir, total_steps=12, checkpoint_every=4)
  work = tmp_path / "w"
  train.run(
    tiny_config(cache_dir, total_steps=12, checkpoint_every=4, stop_after_step=8), str(work)
  )
  before = losses(work)  # steps 1..8, uninterrupted
  assert sorted(os.listdir(work / "checkpoints")) == ["4", "8"]
  shutil.rmtree(work / "checkpoints" / "8" / "state")  # a checkpoint with files missing
  summary = train.run(full, str(work))
  assert summary.final_step == 12
  moved = os.listdir(str(work / "checkpoints") + ".unreadable")
  assert len(moved) == 1 and moved[0].startswith("8-")  # kept for inspection
  after = losses(work)
  assert sorted(after) == list(range(1, 13))
  for step in range(5, 9):  # recomputed from checkpoint 4
    assert after[step] == pytest.approx(before[step], rel=1e-6)


def test_no_readable_checkpoint_is_one_clear_error(tmp_path, cache_dir):
  # total_steps=12 like the tests around it: the same programs, compiled once per session.
  train.run(
    tiny_config(cache_dir, total_steps=12, checkpoint_every=4, stop_after_step=4), str(tmp_path)
  )
  shutil.rmtree(tmp_path / "checkpoints" / "4" / "state")
  with pytest.raises(
    CheckpointError,
    match=r"no checkpoint in .*checkpoints can be resumed from: "
    r"damaged checkpoints were moved aside \(step 4 \(file state/.* is missing\)",
  ):
    train.run(tiny_config(cache_dir, total_steps=12, checkpoint_every=4), str(tmp_path))
  metrics, first = (tmp_path / "metrics.jsonl").read_text(), losses(tmp_path)
  # Never a silent restart: the refused run wrote nothing; restart_from_scratch starts over.
  with pytest.raises(CheckpointError, match="restart_from_scratch=true"):
    train.run(tiny_config(cache_dir, total_steps=12, checkpoint_every=4), str(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text() == metrics
  summary = train.run(
    tiny_config(cache_dir, total_steps=12, checkpoint_every=4, restart_from_scratch=True),
    str(tmp_path),
  )
  again = losses(tmp_path)  # steps 1..12 from scratch
  assert summary.final_step == 12 and sorted(again) == list(range(1, 13))
  for step in first:  # the same seed, the same run
    assert again[step] == pytest.approx(first[step], rel=1e-6)


@pytest.mark.parametrize("where", ["save", "async", "tensorstore"])
def test_disk_full_while_checkpointing(tmp_path, cache_dir, monkeypatch, where):
  real_save, real_wait = ocp.CheckpointManager.save, ocp.CheckpointManager.wait_until_finished
  full = OSError(errno.ENOSPC, "No space left on device")
  if where == "tensorstore":  # what orbax raised on a real full tmpfs (issue 33): not an OSError
    full = ValueError(
      'RESOURCE_EXHAUSTED: Error writing "x/0.0" in OCDBT database at local file "/f/ck/1.orbax-'
      'checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed writing: "/f/ck/d/e3": '
      "Failed to write 2985281 bytes to file 11: No space left on device [os_error_code='28']"
    )

  def save(self, step, *a, **k):
    if step == 8:
      if where != "async":
        raise full
      self._fail_next_wait = True
    return real_save(self, step, *a, **k)

  def wait(self):
    real_wait(self)
    if getattr(self, "_fail_next_wait", False):
      self._fail_next_wait = False
      raise full

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", wait)
  cfg = tiny_config(cache_dir, total_steps=12, checkpoint_every=4, log_every=4)
  expected = (
    "could not write checkpoint step 8 .*the disk is full. The last complete checkpoint is step 4"
    if where != "async"
    # orbax waits for the previous write inside its next save, so it surfaces there
    else r"could not write (a checkpoint|checkpoint step \d+) .*the disk is full"
  )
  with pytest.raises(CheckpointError, match=expected):
    train.run(cfg, str(tmp_path))
  monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
  monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", real_wait)
  assert "4" in os.listdir(tmp_path / "checkpoints")  # nothing written before is lost
  summary = train.run(cfg, str(tmp_path))  # space freed: it resumes
  assert summary.final_step == 12


def test_workdir_unwritable_mid_run_is_one_checkpoint_error(tmp_path, cache_dir, monkeypatch):
  """The workdir turns unwritable mid-run (issue 33): the checkpoint write fails with EACCES and so
  does removing the lock at exit. Before, the lock release raised and its traceback hid the
  checkpoint error; now the checkpoint error is what surfaces and the release only warns (the lock
  names a process that has ended, so the next run takes it over)."""
  real_save, real_remove = ocp.CheckpointManager.save, os.remove
  denied = lambda path: PermissionError(errno.EACCES, "Permission denied", str(path))

  def save(self, step, *a, **k):
    if step == 8:
      raise denied(tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp")
    return real_save(self, step, *a, **k)

  def remove(path, *a, **k):
    if str(path).endswith("run.lock"):
      raise denied(path)
    return real_remove(path, *a, **k)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  monkeypatch.setattr(os, "remove", remove)
  warnings = []
  monkeypatch.setattr(
    "cbert_jax.run.workdir_lock.logging.warning", lambda msg, *a: warnings.append(msg % a)
  )
  cfg = tiny_config(cache_dir, total_steps=12, checkpoint_every=4, log_every=4)
  with pytest.raises(
    CheckpointError,
    match=r"could not write checkpoint step 8 .*the write failed \(PermissionError: .*Permission "
    r"denied.*The last complete checkpoint is step 4; .*Make .*/checkpoints writable by this "
    r"user \(for example chmod -R u\+rwX\) and rerun the same command to resume",
  ):
    train.run(cfg, str(tmp_path))
  assert any("could not remove the lock" in w and "Permission denied" in w for w in warnings)
  assert json.load(open(tmp_path / "run.lock"))["pid"] == os.getpid()
  assert "4" in os.listdir(tmp_path / "checkpoints")
