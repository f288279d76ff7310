r"""Entry point: `python -m cbert_jax.main --config experiments/smoke.py[:arg] --workdir DIR`.

Any config field can be overridden: `--config.total_steps=50 --config.model.size=d64L2`. Multi-host
runs (TPU pods, multi-node GPU) call `jax.distributed.initialize()` when `--multiprocess` is set or a
cluster environment is detected by JAX; single-host runs need nothing.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from cbert_jax.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment file[:arg]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, metrics and config.json go")
_MULTIPROCESS = flags.DEFINE_bool("multiprocess", False,
                                  "call jax.distributed.initialize() (auto-detected on TPU pods / SLURM)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # after flag parsing, so XLA_FLAGS from the environment apply
  if _MULTIPROCESS.value:
    jax.distributed.initialize()
  from cbert_jax import train  # imports the heavy stack
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/smoke.py")
  workdir = _WORKDIR.value or os.path.join("runs", config.get("name", "run"))
  logging.info("workdir: %s", os.path.abspath(workdir))
  try:
    summary = train.run(config, workdir)
  except ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    sys.exit(2)
  except train.NonFiniteError as e:
    print(f"training stopped: {e}", file=sys.stderr)
    sys.exit(3)
  logging.info("done: step %d, train/loss %.4f -> %.4f, eval %s", summary.final_step,
               summary.first_loss, summary.last_loss, summary.eval)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
