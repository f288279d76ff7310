"""Command lines of tiny runs and the subprocesses that run them: the CLI in one process or in a
localhost pair (jax.distributed), and a fresh interpreter in which JAX cannot be imported."""

import os
import socket
import subprocess
import sys
import time

from tests import xla_flags
from tests.helpers import ROOT, TINY


def tiny_flags(cache_dir) -> list[str]:
  """The `--config.*` flags of a tiny run (d32L2, 8 rows of 32 tokens, tests/fixtures' corpus,
  a 400-piece vocabulary) on the data cache `cache_dir`."""
  return [
    "--config.model.size=d32L2",
    "--config.batch_size=8",
    "--config.data.seq_len=32",
    "--config.data.corpus=files",
    f"--config.data.corpus_files={TINY}",
    "--config.data.vocab_size=400",
    f"--config.data.cache_dir={cache_dir}",
    "--config.peak_flops=1e11",
    "--config.eval_batches=1",
  ]


def cli(workdir, cache_dir, *extra, config="experiments/smoke.py"):
  return [
    sys.executable,
    "-m",
    "cbert_jax.main",
    f"--config={config}",
    f"--workdir={workdir}",
    *tiny_flags(cache_dir),
    "--config.plot=false",
    "--config.final_validation=false",  # tested in test_validation.py and test_files_created.py
    *extra,
  ]


def cli_env(jax_cache=None) -> dict:
  """The environment of a CLI run: 2 fake CPU devices; with `jax_cache`, JAX's persistent
  compilation cache there (runs of one config compile once)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags.flags(2))
  if jax_cache:
    env |= {
      "JAX_COMPILATION_CACHE_DIR": str(jax_cache),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
  return env


def run_cli(args, jax_cache=None, **kw):
  return subprocess.run(
    args, cwd=ROOT, env=cli_env(jax_cache), capture_output=True, text=True, timeout=300, **kw
  )


# ---------------------------------------------------------------- localhost processes ---
TWO_DEVICES_ENV = dict(os.environ, XLA_FLAGS=xla_flags.flags(2))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(commands, log_dir, timeout=240, env=None):
  """Run `commands` concurrently -> [(returncode, stderr)], killing any still running at the end."""
  os.makedirs(log_dir, exist_ok=True)
  logs = [open(os.path.join(log_dir, f"p{i}.log"), "w+") for i in range(len(commands))]
  procs = [
    subprocess.Popen(
      c, cwd=ROOT, env=env or TWO_DEVICES_ENV, stdout=subprocess.DEVNULL, stderr=f, text=True
    )
    for c, f in zip(commands, logs)
  ]
  try:
    deadline = time.time() + timeout
    for p in procs:
      p.wait(timeout=max(deadline - time.time(), 1))
    out = []
    for p, f in zip(procs, logs):
      f.seek(0)
      out.append((p.returncode, f.read()))
    return out, [p.pid for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for f in logs:
      f.close()


def two_processes(workdir, cache, *extra, per_process=((), ()), init_timeout=60):
  """The CLI commands of process 0 and 1 of a localhost 2-process run."""
  flags = [
    f"--coordinator_address=127.0.0.1:{free_port()}",
    "--num_processes=2",
    f"--init_timeout={init_timeout}",
  ]
  return [
    cli(workdir, cache, *extra, *flags, f"--process_id={i}", *per_process[i]) for i in range(2)
  ]


# --------------------------------------------------------------------- without JAX ---
# Packages a launcher host should not need to import.
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "sentencepiece", "matplotlib")


def run_without_jax(code: str, *args: str) -> subprocess.CompletedProcess:
  """Runs `code` in a fresh interpreter (repository root as cwd) in which JAX cannot be imported;
  prints the heavy packages that got imported anyway as the last line: `heavy: [...]`."""
  prologue = "import sys\nsys.modules['jax'] = None\n"
  # The blocked `jax` entry is None: only modules that were really imported count.
  epilogue = (
    "\nprint('heavy:', sorted({name.split('.')[0] for name, module in sys.modules.items()"
    f" if module is not None}} & set({HEAVY!r})))\n"
  )
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  return subprocess.run(
    [sys.executable, "-c", prologue + code + epilogue, *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
