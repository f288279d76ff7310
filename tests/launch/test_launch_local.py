"""launch.sweep --backend local --args: a member that keeps failing is marked failed with its error;
the others go on."""

import json
import os
import subprocess
import sys

from launch import jobs
from tests import xla_flags
from tests.cli_helpers import tiny_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ERROR = "config error: model_name: unknown model 'gpt'; expected one of bert, crossbert, electra"


def sweep(root, cache) -> subprocess.CompletedProcess:
  tiny = [
    *tiny_flags(cache),
    "--config.plot=false",
    "--config.final_validation=false",
    "--config.total_steps=2",
  ]
  args = [
    sys.executable,
    "-m",
    "launch.sweep",
    "--config",
    "experiments/smoke.py",
    "--backend",
    "local",
    "--args",
    "model=gpt",
    "model=bert",
    "--workdir_root",
    str(root),
    "--retries",
    "1",
    "--execute",
    *(f"--override={o}" for o in tiny),
  ]
  env = dict(os.environ, XLA_FLAGS=xla_flags.flags(2))
  return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def status(root) -> dict:
  return {m["name"]: m for m in json.loads((root / "sweep_status.json").read_text())["members"]}


def test_failing_member_is_retried_then_marked_failed_and_a_rerun_skips_done_ones(tmp_path):
  root, cache = tmp_path / "sweep", tmp_path / "cache"
  r = sweep(root, cache)
  assert r.returncode == 1, r.stdout + r.stderr[-3000:]
  s = status(root)
  # The failing member comes first: the one after it still runs.
  assert [s[n]["state"] for n in ("model-gpt", "model-bert")] == ["failed", "done"]
  assert s["model-gpt"]["attempts"] == 2 and s["model-gpt"]["returncode"] == 2
  assert s["model-gpt"]["error"] == ERROR  # the one line, not the absl log around it
  assert s["model-bert"]["attempts"] == 1
  assert s["model-bert"]["error"] is None and s["model-bert"]["workdir"] == str(root / "model-bert")
  assert s["model-bert"]["command"].endswith("--config.total_steps=2")
  assert "model-gpt: attempt 1 failed (exit 2): " + ERROR + "; retrying (1 left)" in r.stdout
  assert "model-gpt: attempt 2 failed (exit 2): " + ERROR + "; FAILED" in r.stdout
  assert "[2/2] model-bert: train started (attempt 1; " in r.stdout
  table = r.stdout[
    r.stdout.index("member  ") :
  ].splitlines()  # the summary: member, state, attempts, step, error
  assert table[1].split()[:3] == ["model-gpt", "failed", "2"] and table[1].endswith(ERROR)
  logs = sorted(os.listdir(root / "logs"))
  assert logs == ["model-bert.attempt1.log", "model-gpt.attempt1.log", "model-gpt.attempt2.log"]
  assert ERROR in (root / "logs" / "model-gpt.attempt1.log").read_text()  # each attempt's stderr
  assert "step 2/2" in (root / "logs" / "model-bert.attempt1.log").read_text()
  assert not [n for n in os.listdir(root) if n.endswith(".tmp")]  # the atomic write's temp file
  metrics_mtime = (root / "model-bert" / "metrics.jsonl").stat().st_mtime_ns

  r = sweep(root, cache)  # the rerun: only the failed member runs
  assert r.returncode == 1
  assert "model-bert: done, skipped (checkpoint of the final step 2)" in r.stdout
  assert "model-bert: train started" not in r.stdout
  s = status(root)
  assert [s[n]["attempts"] for n in ("model-bert", "model-gpt")] == [1, 4]
  assert s["model-gpt"]["state"] == "failed" and s["model-gpt"]["error"] == ERROR
  assert (root / "model-bert" / "metrics.jsonl").stat().st_mtime_ns == metrics_mtime
  assert sorted(n for n in os.listdir(root / "logs") if n.startswith("model-gpt")) == [
    f"model-gpt.attempt{k}.log" for k in (1, 2, 3, 4)
  ]  # earlier logs kept


def test_error_line_prefers_the_trainers_one_liner():
  e = jobs.ErrorLine()
  for line in [
    "I1203 train.py] step 3",
    "training stopped: non-finite loss at step 3",
    "",
    "W orbax: x",
  ]:
    e.add(line)
  assert e.get(3) == "training stopped: non-finite loss at step 3"
  e = jobs.ErrorLine()
  e.add("Traceback (most recent call last):\n")
  e.add("MemoryError\n")
  assert e.get(1) == "MemoryError"
  assert jobs.ErrorLine().get(-9) == "killed by signal 9"
