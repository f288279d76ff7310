"""Two processes on localhost (jax.distributed, gloo CPU collectives, 2 fake devices each).

One 2-process run (mesh data=4 over both processes) trains the tiny model to step STOP and
checkpoints; a 1-process run on another mesh restores it and continues. Both are compared with one
uninterrupted 1-process run. The start-up checks (same config, every process present) fail fast
with one line. That each process reads a disjoint slice of every global batch, and that the
slices make up the 1-process batch, is tested on the pipeline itself in test_data.py
(test_train_iterator_topology_invariant_and_epochs); here equal losses show it end to end.
"""

import glob
import os
import re
import shutil
import time

import numpy as np
import pytest

from cbert_jax.run import distributed
from tests.cli_helpers import cli, cli_env, launch, two_processes
from tests.helpers import losses

STEPS = 6  # total_steps of every run (the learning-rate schedule depends on it)
STOP = 3  # the 2-process run checkpoints and stops after this step
PROGRESS = re.compile(r"step (\d+)/\d+ \([^)]*\) \| loss (\S+)")


def progress_losses(stderr: str) -> dict[int, str]:
  """{step: loss as printed} from the progress lines a process logs."""
  return {int(s): loss for s, loss in PROGRESS.findall(stderr)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("mp_cache"))


@pytest.fixture(scope="module")
def reference(cache, cli_jax_cache, tmp_path_factory):
  """Losses of an uninterrupted 1-process run (2 devices, mesh tensor=2); also fills the data
  cache, and the compilation cache with the programs of the 1-process run that continues the
  2-process checkpoint on the same mesh (so that one loads them instead of compiling again)."""
  workdir = tmp_path_factory.mktemp("reference")
  [(rc, err)], _ = launch(
    [
      cli(
        workdir,
        cache,
        f"--config.total_steps={STEPS}",
        "--config.log_every=1",
        "--config.mesh.data=1",
        "--config.mesh.tensor=2",
      )
    ],
    workdir / "logs",
    env=cli_env(cli_jax_cache),
  )
  assert rc == 0, err[-3000:]
  return losses(workdir)


@pytest.fixture(scope="module")
def two_process_run(cache, reference, tmp_path_factory):
  """2 processes x 2 devices, mesh data=4, stopped and checkpointed after step STOP."""
  del reference  # only its cache: both processes would otherwise build the tokenizer at once
  base = tmp_path_factory.mktemp("two")
  workdir = base / "run"
  out, pids = launch(
    two_processes(
      workdir,
      cache,
      f"--config.total_steps={STEPS}",
      f"--config.stop_after_step={STOP}",
      "--config.log_every=1",
      "--config.mesh.data=-1",
    ),
    base / "logs",
  )
  return base, workdir, out, pids


def test_two_processes_agree_and_match_one_process(two_process_run, reference):
  base, workdir, out, pids = two_process_run
  for i, (rc, err) in enumerate(out):
    assert rc == 0, f"process {i}: {err[-3000:]}"
    assert "all 2 processes run the same code" in err
  printed = [progress_losses(err) for _, err in out]
  assert sorted(printed[0]) == list(range(1, STOP + 1))
  assert printed[0] == printed[1]  # both processes see the same loss
  # Only process 0 writes metrics: one line per step, one metrics file, its TensorBoard file alone.
  assert sorted(losses(workdir)) == list(range(1, STOP + 1))
  assert [
    os.path.relpath(p, base) for p in glob.glob(f"{base}/**/metrics.jsonl", recursive=True)
  ] == [os.path.join("run", "metrics.jsonl")]
  tb = os.listdir(workdir / "tb")
  assert len(tb) == 1 and f".{pids[0]}." in tb[0], tb
  assert os.listdir(workdir / "checkpoints") == [str(STOP)]
  # The same global batches as the 1-process run: the processes' slices partition each batch.
  got = losses(workdir)
  np.testing.assert_allclose(
    [got[s] for s in range(1, STOP + 1)], [reference[s] for s in range(1, STOP + 1)], rtol=1e-4
  )


def test_two_process_checkpoint_continues_on_one_process(
  two_process_run, reference, cache, cli_jax_cache, tmp_path
):
  _, workdir, out, _ = two_process_run
  assert all(rc == 0 for rc, _ in out)
  shutil.copytree(workdir, tmp_path / "run")
  [(rc, err)], _ = launch(
    [
      cli(
        tmp_path / "run",
        cache,
        f"--config.total_steps={STEPS}",
        "--config.log_every=1",
        "--config.mesh.data=1",
        "--config.mesh.tensor=2",
      )
    ],
    tmp_path / "logs",
    env=cli_env(cli_jax_cache),
  )
  assert rc == 0, err[-3000:]
  assert f"resumed from checkpoint at step {STOP}" in err
  got = losses(tmp_path / "run")
  assert sorted(got) == list(range(1, STEPS + 1))
  steps = range(
    STOP + 1, STEPS + 1
  )  # resharded from data=4 over 2 processes to tensor=2, same data
  np.testing.assert_allclose([got[s] for s in steps], [reference[s] for s in steps], rtol=1e-4)


@pytest.mark.parametrize(
  "process_1_flag,expected",
  [
    (
      "--config.seed=1",
      "2 processes do not run the same thing: process 1: its config differs from "
      "process 0's in: seed.",
    ),
    ("--num_processes=3", "process 1 was started with --num_processes=3, but 2 processes joined"),
  ],
)
def test_a_process_that_differs_fails_every_process_naming_it(
  cache, tmp_path, process_1_flag, expected
):
  start = time.time()
  out, _ = launch(
    two_processes(
      tmp_path / "run", cache, "--config.total_steps=2", per_process=((), (process_1_flag,))
    ),
    tmp_path / "logs",
    timeout=120,
  )
  assert time.time() - start < 60
  for i, (rc, err) in enumerate(out):
    assert rc == distributed.EXIT_CODE, f"process {i}: {err[-3000:]}"
    assert f"distributed error: {expected}" in err
    assert "Traceback" not in err
  assert not (tmp_path / "run").exists()


def test_a_missing_process_times_out_with_one_clear_line(cache, tmp_path):
  start = time.time()
  [(rc, err)], _ = launch(
    two_processes(tmp_path / "run", cache, init_timeout=3)[:1], tmp_path / "logs", timeout=60
  )
  assert time.time() - start < 30
  assert rc == distributed.EXIT_CODE, err[-3000:]
  line = [l for l in err.splitlines() if l.startswith("distributed error:")]
  assert len(line) == 1 and "process 0 of 2 waited 3 s" in line[0], err[-3000:]
  assert "missing: process 1" in line[0] and "--num_processes=2" in line[0]
  assert "Traceback" not in err and "Check failure" not in err


def test_mismatch_message_names_each_process_and_what_differs():
  same, differs = np.array([True, True, True]), np.array([True, False, True])
  assert distributed.mismatch_message(same, same, same, None, []) == ""
  msg = distributed.mismatch_message(differs, same, same, None, [])
  assert "process 1: its code" in msg and "process 2" not in msg
  fields = np.array([[1, 2], [1, 2], [1, 3]])
  msg = distributed.mismatch_message(
    same, np.array([True, True, False]), same, fields, ["a.b", "seed"]
  )
  assert (
    "process 2: its config differs from process 0's in: seed." in msg and "process 1" not in msg
  )
  base = distributed.config_hashes(_config(seed=0))
  other = distributed.config_hashes(_config(seed=1))
  assert base[0] != other[0]
  assert [k for k in base[1] if base[1][k] != other[1][k]] == ["seed"]
  assert len(distributed.code_hash()) == 64 and distributed.code_hash() == distributed.code_hash()


def _config(**overrides):
  from cbert_jax import config_lib

  c = config_lib.base_config()
  c.update(overrides)
  return c
