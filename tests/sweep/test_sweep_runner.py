"""The in-process sweep runner: trains and probes every member, skips finished ones, resumes a
member killed mid-run, and writes the status, the manifest and the scaling report."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from cbert_jax import train
from cbert_jax.report import archive
from cbert_jax.run import record, status
from cbert_jax.sweep import experiment, runner
from tests import xla_flags
from tests.helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "experiments", "sweep.py")


def tiny_overrides(cache) -> dict:
  """The quick scale's d32L2 members on the tiny corpus, 128-token steps."""
  return {
    "data.corpus": "files",
    "data.corpus_files": TINY,
    "data.vocab_size": 400,
    "data.cache_dir": str(cache),
    "data.seq_len": 32,
    "sweep.sizes": "d32L2",
    "sweep.batch_size": 4,
    "num_devices": 1,
    "peak_flops": 1e11,
    "plot": False,
    "eval_batches": 1,
    "final_validation": False,
  }


def whole_sweep_config(cache, **extra):
  """The in-process sweep's config. Its compilation cache is this test process's (conftest.py):
  a member sets `jax_compilation_cache_dir` to it, and JAX derives part of every compile's cache
  key from that setting (its autotune cache folder), so another folder (the runner's default,
  `<root>/compilation_cache`) would change the key of every later compile in this process: these
  tests' members would never load each other's programs, nor later tests those cached before."""
  c = experiment.load_experiment(SWEEP).get_config("quick")
  jax_cache = jax.config.jax_compilation_cache_dir
  in_process = {"compilation_cache_dir": jax_cache} if jax_cache else {}
  for path, value in (tiny_overrides(cache) | in_process | extra).items():
    experiment._set(c, path, value)  # pylint: disable=protected-access
  return c


@pytest.fixture(autouse=True)
def _restore_min_compile_time():
  """A member sets JAX's persistent-cache threshold to 0.5 s (train.py); put back this process's
  (conftest.py: 0, every program cached) for the tests after."""
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  yield
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def test_runner_trains_probes_reports_then_skips_finished_members(tmp_path, toy_tasks, monkeypatch):  # noqa: F811
  root = tmp_path / "sweep"
  # 0.1 tokens per parameter: 45 and 68 steps (the budget as test_a_failing_member's, so the
  # same programs), plenty for "trains, checkpoints, probes, reports, skips".
  c = whole_sweep_config(
    tmp_path / "cache",
    **{"sweep.tokens_per_param": 0.1, "evals.tasks": "toy_cls,toy_retrieval", "evals.seq_len": 16},
  )
  assert runner.run(c, str(root)) == 0
  names = ["bert_d32L2", "crossbert_d32L2"]
  st = json.loads((root / "sweep_status.json").read_text())
  assert [m["state"] for m in st["members"]] == ["done", "done"] and st["flops_done"] == st[
    "flops_total"
  ]
  manifest = json.loads((root / "sweep.json").read_text())
  assert [m["name"] for m in manifest["members"]] == names and manifest["scale"] == "quick"
  for name, m in zip(names, manifest["members"]):
    cfg = json.loads((root / name / "config.json").read_text())["config"]
    # the command-line overrides reached the member; the derived budget is in its config.json
    assert (
      cfg["data"]["seq_len"] == 32
      and cfg["batch_size"] == 4
      and cfg["evals"]["tasks"] == "toy_cls,toy_retrieval"
    )
    assert cfg["sweep"]["compute"] == m["compute"] > 0 and cfg["total_steps"] == m["steps"]
    assert cfg["total_steps"] * 4 * 32 == cfg["sweep"]["tokens"] >= cfg["sweep"]["target_tokens"]
    assert status.is_done(str(root / name), probe=True)
  rep = (root / "report" / "report.md").read_text()
  assert "| bert_d32L2 |" in rep and "| crossbert_d32L2 |" in rep and "## The four claims" in rep
  ckpt_mtime = os.path.getmtime(root / "bert_d32L2" / "checkpoints")

  def no_training(*a, **k):
    raise AssertionError("a finished member was trained again")

  monkeypatch.setattr(train, "run", no_training)
  assert runner.run(c, str(root)) == 0  # the rerun: everything skipped
  assert os.path.getmtime(root / "bert_d32L2" / "checkpoints") == ckpt_mtime

  # The archive (no checkpoints): its members count as done, so rerunning the sweep on it trains
  # nothing, and the report written from it has the same tables as the one from the run root.
  arch = tmp_path / "archive"
  assert archive.main(["--root", str(root), "--out", str(arch)]) == 0
  assert not list(arch.rglob("checkpoints")) and not list(arch.rglob("*.model"))
  for name in names:
    assert status.is_done(str(arch / name), probe=True)
    assert status.member_state(name, str(arch / name)).state == "done"
  assert runner.run(c, str(arch)) == 0

  def tables(path):
    return [line for line in path.read_text().splitlines() if line.startswith("|")]

  assert tables(arch / "report" / "report.md") == tables(root / "report" / "report.md")
  assert archive.main(["--root", str(root), "--out", str(root / "inside")]) == 2


def _sweep_cmd(root, cache):
  args = [f"--config.{k}={v}" for k, v in tiny_overrides(cache).items()]
  return [
    sys.executable,
    "-m",
    "cbert_jax.main",
    f"--config={SWEEP}:quick",
    f"--workdir={root}",
    *args,
    # 68 and 102 steps, a checkpoint every 7 and 11: the second member is killed at its first
    # checkpoint with 90-odd steps (seconds) to go
    "--config.sweep.tokens_per_param=0.15",
    "--config.sweep.probe=false",
    "--config.sweep.report=false",
  ]


def test_a_killed_sweep_resumes_the_interrupted_member_and_skips_the_finished_one(tmp_path):
  root, cache = tmp_path / "sweep", tmp_path / "cache"
  env = dict(os.environ, XLA_FLAGS=xla_flags.flags(1))
  log = open(tmp_path / "first.log", "w")
  proc = subprocess.Popen(_sweep_cmd(root, cache), cwd=ROOT, env=env, stdout=log, stderr=log)
  second = root / "crossbert_d32L2"
  deadline = time.time() + 240
  while not record.checkpoint_steps(str(second)) and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)  # mid-run: no clean shutdown
  proc.wait()
  log.close()
  killed_at = record.checkpoint_steps(str(second))
  total = record.total_steps(str(second))
  assert killed_at and total not in killed_at, (tmp_path / "first.log").read_text()[-3000:]
  assert status.is_done(str(root / "bert_d32L2"), probe=False)
  first_mtime = os.path.getmtime(root / "bert_d32L2" / "metrics.jsonl")

  r = subprocess.run(
    _sweep_cmd(root, cache), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "bert_d32L2: done already, skipped" in r.stderr
  assert "resumed from checkpoint at step" in r.stderr
  assert status.is_done(str(second), probe=False)
  assert os.path.getmtime(root / "bert_d32L2" / "metrics.jsonl") == first_mtime
  steps = [json.loads(line)["step"] for line in (second / "metrics.jsonl").read_text().splitlines()]
  train_steps = sorted(set(steps))
  assert train_steps[-1] == total  # reached the end
  st = json.loads((root / "sweep_status.json").read_text())
  assert [m["state"] for m in st["members"]] == ["done", "done"]


def test_a_failing_member_is_marked_and_the_others_go_on(tmp_path, toy_tasks):  # noqa: F811
  root = tmp_path / "sweep"
  c = whole_sweep_config(
    tmp_path / "cache",
    **{"sweep.tokens_per_param": 0.1, "sweep.probe": False, "sweep.report": False},
  )
  c.sweep.models = "crossbert"
  assert runner.run(c, str(root)) == 0
  c.sweep.models = ""
  c.faults.plant_nan_step = 2  # every member that trains now diverges at step 2
  assert runner.run(c, str(root)) == 1  # bert fails; crossbert was done and is skipped
  st = {m["name"]: m for m in json.loads((root / "sweep_status.json").read_text())["members"]}
  assert st["crossbert_d32L2"]["state"] == "done" and st["bert_d32L2"]["state"] == "failed"
  assert st["bert_d32L2"]["error"].startswith(
    "NonFiniteError: non-finite training metrics at step 2"
  )
  assert (root / "bert_d32L2" / "FAILED").read_text().startswith("NonFiniteError: non-finite")
  assert status.member_state("bert_d32L2", str(root / "bert_d32L2"), probe=False).state == "failed"


def test_sweep_level_bad_input_is_refused_before_training(tmp_path, monkeypatch):
  monkeypatch.setattr(train, "run", lambda *a, **k: pytest.fail("trained despite bad input"))
  root = tmp_path / "sweep"
  root.mkdir()
  (root / "sweep.json").write_text(json.dumps({"scale": "cpu", "members": []}))
  c = whole_sweep_config(tmp_path / "cache")
  with pytest.raises(experiment.ConfigError, match=r"holds a cpu sweep; this is the quick sweep"):
    runner.run(c, str(root))
  c.sweep.sizes = "d2304L32"
  with pytest.raises(experiment.ConfigError, match=r"select no member of the quick sweep"):
    runner.run(c, str(tmp_path / "other"))
  c = whole_sweep_config(
    tmp_path / "cache", **{"batch_size": 0, "sweep.batch_size": 6, "num_devices": 4}
  )
  with pytest.raises(
    experiment.ConfigError, match=r"batch_size=6 is not divisible by the data-parallel size 4"
  ):
    runner.run(c, str(tmp_path / "third"))
  assert not (tmp_path / "third").exists()
