"""The command line, as a user types it: a short run end to end, one-line errors, SIGTERM, launcher."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import sweep
from tests.cli_helpers import cli, cli_env, run_cli
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("cli_cache"))


@pytest.mark.parametrize("arg", [":model=bert", ""])
def test_cli_trains_a_few_steps(tmp_path, cache, cli_jax_cache, arg):
  r = run_cli(
    cli(
      tmp_path,
      cache,
      "--config.total_steps=3",
      "--config.log_every=1",
      config=f"experiments/smoke.py{arg}",
    ),
    jax_cache=cli_jax_cache,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines if "train/loss" in l] == [1, 2, 3]
  saved = json.loads((tmp_path / "config.json").read_text())["config"]
  assert saved["model_name"] == ("bert" if arg else "crossbert")
  assert saved["masking"]["cms"] is (not arg)  # BERT does not use CMS
  assert "step 3/3" in r.stderr  # the progress line


@pytest.mark.parametrize(
  "flag,expected",
  [
    ("--config.model_name=gpt", "config error: model_name: unknown model 'gpt'"),
    (
      "--config.batch_size=3",
      "config error: batch_size=3 is not divisible by the data-parallel size 2",
    ),
    ("--config.no_such_field=1", "config error: --config.no_such_field=1: unknown config field"),
    (
      "--config=experiments/smoke.py:colour=red",
      "config error: config argument 'colour' is unknown",
    ),
  ],
)
def test_cli_bad_input_is_one_clear_line(tmp_path, cache, flag, expected):
  r = run_cli(cli(tmp_path / "w", cache, flag))
  assert r.returncode != 0
  assert expected in r.stderr
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_saves_a_checkpoint_and_the_next_run_resumes(
  tmp_path, cache, cli_jax_cache, sig, code
):
  """SIGTERM (preemption) and SIGINT (Ctrl-C) both checkpoint and stop (exit 0 / 130). With
  SIGINT, also: a second run on the live run's workdir is refused in one line and writes nothing,
  and rerunning the finished run changes nothing.

  Every run here has the constant LR schedule (no decay, so the train step does not depend on
  total_steps): the killed run, its resumption and both parametrizations compile one set of
  programs, loaded from the shared compilation cache after the first."""
  env = cli_env(cli_jax_cache)
  constant = "--config.optim.schedule=constant"
  args = cli(
    tmp_path,
    cache,
    "--config.total_steps=2000",
    "--config.log_every=1",
    "--config.checkpoint_every=1000",
    constant,
  )
  proc = subprocess.Popen(
    args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 240
  if sig == signal.SIGINT:  # the workdir is locked while its run lives (here: while it compiles)
    while time.time() < deadline and not (tmp_path / "run.lock").exists():
      time.sleep(0.05)
    second = run_cli(cli(tmp_path, cache, "--config.total_steps=2000", constant))
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [l for l in second.stderr.splitlines() if "error" in l.lower()]
    assert (
      errors == [l for l in errors if l.startswith("workdir error: --workdir ")]
      and len(errors) == 1
    )
    assert f"is in use by another run (pid {proc.pid} on host" in errors[0]
  while time.time() < deadline and (not metrics.exists() or metrics.read_text().count("\n") < 3):
    time.sleep(0.05)
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == code, err[-3000:]
  steps = sorted(int(s) for s in os.listdir(tmp_path / "checkpoints"))
  assert len(steps) == 1 and 3 <= steps[0] < 2000
  assert f"({signal.Signals(sig).name}); saving a checkpoint" in err
  assert not (tmp_path / "run.lock").exists()  # released on the way out
  rerun = cli(
    tmp_path, cache, f"--config.total_steps={steps[0] + 2}", "--config.log_every=1", constant
  )
  r = run_cli(rerun, jax_cache=cli_jax_cache)
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"resumed from checkpoint at step {steps[0]}" in r.stderr
  logged = [json.loads(l)["step"] for l in metrics.read_text().splitlines()]
  assert logged[-3:] == [steps[0] + 1, steps[0] + 2, steps[0] + 2]  # 2 train lines + final eval
  if sig == signal.SIGINT:  # the finished run, rerun: says so, and no file changes
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    r = run_cli(rerun, jax_cache=cli_jax_cache)
    assert r.returncode == 0 and "this run already finished" in r.stderr, r.stderr[-3000:]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_local_launcher_commands_are_golden(tmp_path, capsys):
  launch, _ = sweep.build(
    [
      "--config",
      "experiments/smoke.py",
      "--backend",
      "local",
      "--args",
      "model=bert",
      "model=crossbert,size=d64L2",
      "--workdir_root",
      "runs/pair",
      "--override=--config.total_steps=50",
    ]
  )
  pair = os.path.abspath("runs/pair")
  assert [j.steps for j in launch.jobs] == [[("train", j.train)] for j in launch.jobs]  # no probe
  assert all(j.train[:2] == [sys.executable, "-m"] for j in launch.jobs)
  assert [j.train[2:] for j in launch.jobs] == [
    [
      "cbert_jax.main",
      "--config=experiments/smoke.py:model=bert",
      f"--workdir={pair}/model-bert",
      "--config.total_steps=50",
    ],
    [
      "cbert_jax.main",
      "--config=experiments/smoke.py:model=crossbert,size=d64L2",
      f"--workdir={pair}/model-crossbert_size-d64L2",
      "--config.total_steps=50",
    ],
  ]
  root = tmp_path / "r"
  assert (
    sweep.main(
      [
        "--config",
        "experiments/smoke.py",
        "--backend",
        "local",
        "--args",
        "model=bert",
        "--workdir_root",
        str(root),
      ]
    )
    == 0
  )
  out = capsys.readouterr().out  # dry run prints, runs nothing
  assert "dry run: nothing is started or written" in out and "[1/1] model-bert (pending; " in out
  assert not root.exists()
