"""Test setup: 8 fake CPU devices (set before jax is imported anywhere) and shared tiny fixtures."""

import os

from tests import xla_flags  # noqa: E402  (no imports of its own)

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags.flags(8)).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def jax_compilation_cache(tmp_path_factory):
  """One persistent XLA compilation cache per test process (per xdist worker: no two processes
  write one directory), so a program compiled once in the session is loaded, not compiled again:
  the trainer's init, train and eval steps are the same programs across the many tiny runs (a
  resumed run, a run's rerun, the same model in another test). JAX fixes the directory at its
  first use, so this is set before any test; a run with `compilation_cache_dir` (the sweep
  runner) then reuses it. The executables are XLA's own, bit for bit: no result changes."""
  import jax  # pylint: disable=import-outside-toplevel

  jax.config.update(
    "jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_compilation_cache"))
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  yield


@pytest.fixture(scope="session")
def cli_jax_cache(tmp_path_factory):
  """One persistent XLA compilation cache for the CLI runs a test starts (`cli_helpers.run_cli`'s
  and `cli_env`'s `jax_cache`), per test process: the tiny CLI runs of one config compile their
  init, train and eval steps once per session instead of once per run. Apart from the in-process
  cache above (another device count: no program in common), so the test process and its runs never
  write one directory at once. The executables are XLA's own, bit for bit: no result changes."""
  return str(tmp_path_factory.mktemp("cli_jax_cache"))


@pytest.fixture(scope="session", autouse=True)
def matmul_peak_cache(tmp_path_factory):
  """Points the per-machine matmul peak cache (`hardware.peak_cache_path`) at a session tmp file,
  so no test (nor a run it starts in a subprocess) reads or writes the real ~/.cache."""
  path = tmp_path_factory.mktemp("matmul_peak") / "matmul_peak.json"
  with pytest.MonkeyPatch.context() as m:
    m.setenv("CBERT_JAX_PEAK_CACHE", str(path))
    yield path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  """One data cache for the session (per xdist worker): the tiny corpus and its tokenizer are
  built once and reused by every training test."""
  return str(tmp_path_factory.mktemp("cbert_cache"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """A data cache per test module (the probe-suite tests)."""
  return str(tmp_path_factory.mktemp("eval_cache"))


@pytest.fixture
def toy_tasks(monkeypatch):
  """The synthetic probe tasks of `helpers.synthetic_tasks` in place of the task kit."""
  from cbert_jax.data.tasks import tfds as task_tfds  # pylint: disable=import-outside-toplevel
  from tests import helpers  # pylint: disable=import-outside-toplevel

  tasks = helpers.synthetic_tasks()
  monkeypatch.setattr(task_tfds, "list_tasks", lambda: list(tasks))
  monkeypatch.setattr(task_tfds, "load_task", lambda name, **kw: tasks[name])
  return tasks


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, cache_dir):
  """A factory: `trained_run(model)` is the workdir of a tiny `model` run (d32L2, 2 steps,
  checkpoints and full-split validation files at steps 1 and 2), trained once per test session and shared by the
  tests that read trained runs back. Under xdist the workers share it: the first to need a run
  trains it under a file lock, the others wait and reuse it (pytest-xdist's documented pattern).
  Tests copy a run before changing it."""
  import fcntl  # pylint: disable=import-outside-toplevel

  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this session's root
  runs = {}

  def get(model: str = "crossbert") -> str:
    if model not in runs:
      from cbert_jax import train  # pylint: disable=import-outside-toplevel
      from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel

      workdir = shared / f"trained_{model}"
      with open(shared / f"trained_{model}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (workdir / "TRAINED").exists():
          config = tiny_config(cache_dir, model, total_steps=2, checkpoint_every=1)
          config.final_validation = True  # eval/val_full-step_2.json, read by test_validation.py
          config.val_full_every = 1  # ... and eval/val_full-step_1.json during the run
          train.run(config, str(workdir))
          (workdir / "TRAINED").touch()
      runs[model] = str(workdir)
    return runs[model]

  return get
