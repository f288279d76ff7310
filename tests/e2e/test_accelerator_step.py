"""The GPU window's prepared command (benchmarks/gpu_window.sh) and what it relies on in
benchmarks/accelerator_step.py: the pinned wheels listed without the network, a CPU dry run of
`run` end to end (the same script, environment and benchmark invocation a GPU host gets, at a tiny
shape), the memory plan that shrinks the batch or skips a contestant, each isolated contestant's
own time limit, and SIGTERM (the window's `timeout`) still writing the table.
tests/e2e/test_benchmarks.py covers the benchmark's numbers at the same shape."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import types

import pytest

from benchmarks import accelerator_step, contestants
from cbert_jax.models.model_config import ffn_size_for
from cbert_jax.run import hardware
from cbert_jax.scaling import chips, memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_window.sh")
MICRO = ["--d", "64", "--layers", "2", "--heads", "2", "--vocab", "512", "--seq", "32"]
MICRO += ["--batch", "4", "--steps", "2", "--warmup", "1"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\d+(?:\.\d+)*)$")


def window(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", SCRIPT, *args],
    cwd=ROOT,
    env={**os.environ, **(env or {})},
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def script_list(name: str) -> list[str]:
  """A bash array of the script (`NAME=(` ... `)`), its quoted entries."""
  text = open(SCRIPT, encoding="utf-8").read()
  body = re.search(rf"^{name}=\($(.*?)^\)$", text, re.M | re.S).group(1)
  return re.findall(r'^\s*"([^"]+)"\s*$', body, re.M)


def script_value(name: str) -> str:
  text = open(SCRIPT, encoding="utf-8").read()
  return re.search(rf'^{name}="([^"]*)"$', text, re.M).group(1)


@pytest.fixture
def small_matmul(monkeypatch):
  """The probe's measured matmul at 256^2 instead of 2048^2 (the same code path; no assertion
  reads it)."""
  measure = hardware.measure_matmul_peak
  monkeypatch.setattr(
    hardware,
    "measure_matmul_peak",
    lambda dtype, n=2048, seconds=1.0, **kw: measure(dtype, n=min(n, 256), seconds=0.2, **kw),
  )


def test_the_pinned_wheels_are_listed_and_their_download_printed_without_the_network(tmp_path):
  listed = window("list")
  assert listed.returncode == 0, listed.stderr
  pins = listed.stdout.split()
  assert pins == [entry.split()[0] for entry in script_list("PINNED")]
  assert pins and all(PIN.match(p) for p in pins), pins
  # ml-collections is the project's own pin; each pinned module imports here, so the CPU dry run
  # below installs nothing
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  assert "ml-collections==1.1.0" in pins and "ml-collections==1.1.0" in deps
  for entry in script_list("PINNED"):
    module = entry.split()[1]
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, check=False)
    assert r.returncode == 0, (module, r.stderr)
  wheels = tmp_path / "wheels"
  dry = window("prepare", "--dry-run", env={"WHEELS": str(wheels), "PYTHON": "python3"})
  assert dry.returncode == 0, dry.stderr
  words = dry.stdout.split()
  assert words[:4] == ["python3", "-m", "pip", "download"]
  flags = "--no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none"
  assert f"{flags} --platform any -d {wheels}" in dry.stdout
  assert words[-len(pins) :] == pins
  assert not wheels.exists()  # printed, not run
  usage = window()
  assert usage.returncode == 64 and "gpu_window.sh run" in usage.stderr


def test_the_window_runs_every_contestant_in_the_order_that_matters():
  order = script_value("CONTESTANTS").split(",")
  assert sorted(order) == sorted(accelerator_step.CONTESTANTS)
  assert order[:2] == ["BERT", "CrossBERT+CMS"]  # the comparison that matters first


def test_gpu_window_run_cpu_dry_run(tmp_path):
  """`bash benchmarks/gpu_window.sh run` as on the GPU host, on CPU at the micro shape: nothing to
  install, the memory fraction and the H100's XLA flags set (XLA:CPU parses the GPU flags too, so
  an unknown one would abort here), the plan checked on h100, one row per contestant."""
  out = tmp_path / "out"
  env = {
    "OUT": str(out),
    "PYTHON": sys.executable,
    "WHEELS": str(tmp_path / "no_wheels"),
    "JAX_PLATFORMS": "cpu",
    "CHIP": "h100",
    "TMPDIR": str(tmp_path),
    "TOTAL_S": "500",
  }
  names = ["BERT", "CrossBERT+CMS"]
  r = window(
    "run", *MICRO, "--dtype", "bfloat16", "--contestants", ",".join(names), env=env, timeout=560
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  log = (out / "gpu_window.log").read_text()
  assert "wheels: ml_collections is installed; ml-collections==1.1.0 not needed" in log
  assert "jax " in log and "backend cpu" in log
  info = json.loads((out / "accelerator_step.json").read_text())
  assert info["complete"] and list(info["results"]) == names
  for name in names:
    row = info["results"][name]
    assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0, row
    assert math.isfinite(row["mfu"]) and row["mfu"] > 0, row
    assert row["plan"]["chip"] == "h100" and row["plan"]["verdict"] == "fits"
  assert info["plan"]["chip"] == "h100" and info["shape"]["batch"] == 4
  env_seen = info["env"]
  assert env_seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == str(chips.GPU_MEM_FRACTION)
  for name, value in chips.chip_env(chips.CHIPS["h100"]):
    if name == "XLA_FLAGS":  # the chip's flags, then the ones already set (the tests' 8 devices)
      assert env_seen[name].startswith(value) and os.environ["XLA_FLAGS"] in env_seen[name]
    else:
      assert env_seen[name] == value
  assert info["versions"]["jax"] and info["versions"]["ml_collections"] == "1.1.0"
  table = (out / "accelerator_step.md").read_text()
  rows = [line for line in table.splitlines() if re.match(r"\| [A-Z]", line)]
  assert [line.split(" | ")[0][2:] for line in rows] == names
  margin = memory.GPU_MARGINS["none"]  # an H100 is planned with XLA:GPU's margins
  assert f"memory plan (h100, remat none: estimate x {margin:g} within 70.4 GB): batch 4" in table


def test_the_memory_plan_shrinks_the_batch_until_every_contestant_fits_with_margin():
  """The default ~300M shape at 40 rows of 512: BERT's estimate x the GPU margin is over an H100's
  88% of 80 GB, so the batch shrinks to the largest that fits every contestant; an H200 takes all
  40."""
  args = types.SimpleNamespace(dtype="bfloat16", attention="auto", remat="none")
  shape = contestants.Shape(
    layers=24, d=1024, heads=16, ffn=ffn_size_for(1024), vocab=32768, seq=512, batch=40
  )
  names = list(accelerator_step.CONTESTANTS)
  batch, plans = accelerator_step.fit_batch(names, shape, args, "h100")
  assert 16 <= batch < 40
  budget = chips.CHIPS["h100"].hbm * chips.CHIPS["h100"].usable
  for p in plans.values():
    assert p["batch"] == batch and p["verdict"] == "fits" and p["budget_bytes"] == budget
    assert p["predicted_bytes"] * p["margin"] <= budget
    assert p["margin"] == memory.GPU_MARGINS["none"]
    assert p["largest_fitting_batch"] >= batch
  tightest = min(plans.values(), key=lambda p: p["largest_fitting_batch"])
  assert tightest["largest_fitting_batch"] == batch  # one more row would not fit it
  assert accelerator_step.fit_batch(names, shape, args, "h200")[0] == 40


def test_a_contestant_the_plan_cannot_fit_gets_a_row_saying_so(tmp_path, small_matmul):
  """A vocabulary of 2^27 at d 64: 8.6G embedding parameters, 137 GB of fp32 state and AdamW
  moments at any batch: every contestant is skipped on h100 before anything is built."""
  vocab = MICRO.index("--vocab") + 1
  argv = [*MICRO[:vocab], str(2**27), *MICRO[vocab + 1 :], "--plan_chip", "h100"]
  info = accelerator_step.main([*argv, "--contestants", "BERT,CrossBERT", "--out", str(tmp_path)])
  assert info["complete"] and info["plan"]["chip"] == "h100"
  for name in ("BERT", "CrossBERT"):
    skipped = info["results"][name]["skipped"]
    assert skipped.startswith("memory plan: needs more chips on h100 at batch 1 ("), skipped
  assert "| BERT | memory plan: needs more chips" in (tmp_path / "accelerator_step.md").read_text()


def test_each_isolated_contestant_is_killed_at_its_own_time_limit(tmp_path, small_matmul):
  info = accelerator_step.main(
    [*MICRO, "--isolate", "yes", "--contestant_s", "0.5", "--contestants", "BERT,CrossBERT"]
    + ["--out", str(tmp_path)]
  )
  for name in ("BERT", "CrossBERT"):
    row = info["results"][name]
    assert row["error"].startswith("killed after ") and "(time limit 0.5 s)" in row["error"], row
    assert 0.5 <= row["killed_s"] < 30
  assert info["complete"]
  on_disk = json.loads((tmp_path / "accelerator_step.json").read_text())
  assert on_disk["results"] == info["results"] and on_disk["contestant_s"] == 0.5
  assert "| CrossBERT | killed after " in (tmp_path / "accelerator_step.md").read_text()


def test_sigterm_kills_the_running_contestant_and_still_writes_the_table(tmp_path):
  """The window's `timeout` sends SIGTERM: the running child's process group is killed, its row
  says so, the rest are skipped, the JSON says incomplete, and the exit status is 1."""
  out = tmp_path / "out"
  cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "accelerator_step.py"), *MICRO]
  cmd += ["--isolate", "yes", "--contestants", "BERT,CrossBERT", "--out", str(out)]
  proc = subprocess.Popen(
    cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  try:
    deadline = time.monotonic() + 240
    while not (out / "accelerator_step.json").exists():  # written before the first contestant
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
      time.sleep(0.2)
    time.sleep(0.5)  # the first child is starting (its imports alone take longer)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 1, output
  info = json.loads((out / "accelerator_step.json").read_text())
  assert not info["complete"]
  assert info["results"]["BERT"] == {
    "error": "stopped by SIGTERM (the run's time box) while it ran"
  }
  assert info["results"]["CrossBERT"] == {"skipped": "stopped by SIGTERM (the run's time box)"}
  assert "**incomplete**" in (out / "accelerator_step.md").read_text()
