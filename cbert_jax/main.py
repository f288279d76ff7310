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


class _QuietLibraries:
  """Drop orbax's per-save INFO chatter from the log; its warnings and errors still show."""

  def filter(self, record) -> bool:
    return record.levelno >= 30 or "/orbax/" not in record.pathname


def main(argv):
  logging.get_absl_handler().addFilter(_QuietLibraries())
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
    if config.get("mode", "train") == "eval":
      from cbert_jax import evaluate
      evaluate.run(config, workdir)
      return
    if config.get("mode", "train") != "train":
      raise ConfigError(f"mode must be train|eval, got {config.mode!r}")
    summary = train.run(config, workdir)
  except ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    sys.exit(2)
  except train.NonFiniteError as e:
    print(f"training stopped: {e}", file=sys.stderr)
    sys.exit(3)
  logging.info("done: step %d, train/loss %.4f -> %.4f, eval %s", summary.final_step,
               summary.first_loss, summary.last_loss, summary.eval)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with an unknown `--config.FIELD` reported in one line (ml_collections
  raises a bare AttributeError/KeyError there, which absl would print as a traceback)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    # An experiment file's get_config raised ConfigError: ml_collections wraps it with a traceback.
    marker = "cbert_jax.errors.ConfigError: "
    if marker in str(e):
      print(f"config error: {str(e).split(marker)[-1].strip()}", file=sys.stderr)
      sys.exit(2)
    print(f"FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull to see help on flags.",
          file=sys.stderr)
    sys.exit(1)
  except (AttributeError, KeyError) as e:
    name = str(e).strip("\"'")
    culprit = next((a for a in argv if a.startswith("--config.") and name in a), name)
    print(f"config error: {culprit}: unknown config field {name!r} (every field is listed in "
          f"cbert_jax/config_lib.py:base_config)", file=sys.stderr)
    sys.exit(2)


def run():
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
