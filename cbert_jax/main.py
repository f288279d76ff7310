r"""Entry point: `python -m cbert_jax.main --config experiments/smoke.py[:arg] --workdir DIR`.

Any config field can be overridden: `--config.total_steps=50 --config.model.size=d64L2`. Multi-process
runs start one process per host (or several on one machine) with `--num_processes=N --process_id=i
--coordinator_address=HOST:PORT` (process 0's host), or with `--multiprocess` where JAX detects the
cluster (TPU pods, SLURM, Open MPI); single-process runs need nothing. Every process then checks
that all are present and run the same code and config (`cbert_jax/run/distributed.py`).
"""

import os
import sys

from absl import app, flags, logging

from cbert_jax.errors import CheckpointError, ConfigError, WorkdirError

_CONFIG = flags.DEFINE_string(
  "config", None, "experiment file[:arg]; --config.FIELD=VALUE overrides one of its fields"
)
_LOADED = None  # the config _parse_flags loaded from --config and its overrides
_WORKDIR = flags.DEFINE_string("workdir", None, "where checkpoints, metrics and config.json go")
_MULTIPROCESS = flags.DEFINE_bool(
  "multiprocess", False, "call jax.distributed.initialize() (auto-detected on TPU pods / SLURM)"
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "HOST:PORT of process 0, where the coordinator listens"
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", 1, "processes in the run (> 1: multi-process)"
)
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "this process's index in 0..num_processes-1")
_INIT_TIMEOUT = flags.DEFINE_float(
  "init_timeout", 300.0, "seconds to wait for every process to join before exiting"
)
_PEER_TIMEOUT = flags.DEFINE_float(
  "peer_timeout",
  None,
  "seconds a process may go without a heartbeat before the others stop with one "
  "'distributed error:' line (default 25, or $CBERT_PEER_TIMEOUT_S)",
)


class _QuietLibraries:
  """Drop orbax's per-save and TFDS's per-file INFO chatter from the log (a first run builds nine
  datasets; each gets our one 'built in' line); their warnings and errors still show."""

  def filter(self, record) -> bool:
    return record.levelno >= 30 or not any(
      part in record.pathname for part in ("/orbax/", "/tensorflow_datasets/")
    )


def _exit_distributed(error: Exception):
  """One "distributed error:" line, then exit with EXIT_CODE without JAX's shutdown barrier.

  Every process raises the same error (the checks compare gathered values), but the barrier is
  not reliable between processes that do not fit together: with process 1 started with
  --num_processes=3, process 1 exited at once and process 0 (it hosts the coordinator) hung in the
  barrier for minutes after its line (2 of 9 localhost pairs on a loaded machine). No process
  needs another at the barrier here: each prints its own line and exits the same way."""
  from cbert_jax.run import peer_watch  # pylint: disable=g-import-not-at-top

  sys.stdout.flush()
  peer_watch.exit_with(str(error))


def main(argv):
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _LOADED
  if config is None:
    raise app.UsageError("--config is required, e.g. --config experiments/smoke.py")
  # imported after flag parsing (it imports jax), so XLA_FLAGS from the env apply
  from cbert_jax.run import distributed

  try:
    if _NUM_PROCESSES.value > 1:
      if not _COORDINATOR.value:
        raise app.UsageError(
          "--num_processes > 1 needs --coordinator_address=HOST:PORT (process 0's)"
        )
      distributed.initialize(
        _COORDINATOR.value,
        _NUM_PROCESSES.value,
        _PROCESS_ID.value,
        _INIT_TIMEOUT.value,
        peer_timeout_s=_PEER_TIMEOUT.value,
      )
    elif _MULTIPROCESS.value:
      distributed.initialize(timeout_s=_INIT_TIMEOUT.value, peer_timeout_s=_PEER_TIMEOUT.value)
  except distributed.DistributedError as e:
    _exit_distributed(e)
  from cbert_jax import train  # imports the heavy stack

  workdir = _WORKDIR.value or os.path.join("runs", config.get("name", "run"))
  logging.info("workdir: %s", os.path.abspath(workdir))
  try:
    if config.get("mode", "train") == "eval":
      from cbert_jax import evaluate

      try:
        evaluate.run(config, workdir)
      except evaluate.EvalFailed as e:
        print(f"eval: {e}", file=sys.stderr)
        sys.exit(1)
      return
    if config.get("mode", "train") == "sweep":
      from cbert_jax.sweep import runner

      failed = runner.run(config, workdir)
      if failed:
        print(f"sweep: {failed} member(s) failed; see {workdir}/sweep_status.json", file=sys.stderr)
        sys.exit(1)
      return
    if config.get("mode", "train") != "train":
      raise ConfigError(f"mode must be train|eval|sweep, got {config.mode!r}")
    summary = train.run(config, workdir)
  except ConfigError as e:
    print(f"{'workdir' if isinstance(e, WorkdirError) else 'config'} error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:  # a second Ctrl-C (the first one checkpoints and stops cleanly)
    print(
      "interrupted: stopped without a new checkpoint; rerun the same command to resume from "
      "the last one",
      file=sys.stderr,
    )
    sys.exit(130)
  except train.NonFiniteError as e:
    print(f"training stopped: {e}", file=sys.stderr)
    sys.exit(3)
  except CheckpointError as e:
    print(f"checkpoint error: {e}", file=sys.stderr)
    sys.exit(5)
  except distributed.DistributedError as e:
    _exit_distributed(e)
  logging.info(
    "done: step %d, train/loss %.4f -> %.4f, eval %s",
    summary.final_step,
    summary.first_loss,
    summary.last_loss,
    summary.eval,
  )
  if summary.signal == "SIGINT":  # Ctrl-C: checkpointed at summary.final_step; 128 + SIGINT
    print(
      f"interrupted: checkpoint saved at step {summary.final_step}; rerun the same command to "
      "resume",
      file=sys.stderr,
    )
    sys.exit(130)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl reads the other flags; `--config` (the experiment file[:arg]) and every
  `--config.FIELD=VALUE` are read by config_lib, and any mistake in them (a missing or failing
  experiment file, an unknown field, a value of the wrong type) is one `config error:` line and
  exit status 2 (config_lib raises ConfigError naming the flag or file)."""
  config_args, rest = _split_config_args(argv)
  try:
    rest = flags.FLAGS(rest)
  except flags.Error as e:
    print(
      f"FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull to see help on flags.",
      file=sys.stderr,
    )
    sys.exit(1)
  if _CONFIG.value is None:
    if config_args:
      _config_error(f"{config_args[0][0]}: needs --config=EXPERIMENT_FILE[:ARG] to override")
    return rest
  from cbert_jax import config_lib  # pylint: disable=g-import-not-at-top (imports the models)

  global _LOADED
  try:
    config = config_lib.load_config(_CONFIG.value)
    for typed, path, text in config_args:
      config_lib.override(config, path, text, where=typed)
  except ConfigError as e:
    _config_error(str(e))
  config.lock()  # code that adds a field says so (config.unlocked())
  _LOADED = config
  return rest


def _split_config_args(argv: list[str]) -> tuple[list[tuple[str, str, str | None]], list[str]]:
  """([(as typed, dotted field, value text or None)], the other arguments) of the command line:
  `--config.F=V`, `--config.F V`, `--config.F` (a boolean: true) and `--noconfig.F` (false)."""
  from cbert_jax import config_lib  # pylint: disable=g-import-not-at-top

  found, rest, i = [], argv[:1], 1
  while i < len(argv):
    arg = argv[i]
    if arg == "--":
      rest += argv[i:]
      break
    if arg.startswith("--noconfig."):
      found.append((arg, arg[len("--noconfig.") :], "false"))
    elif arg.startswith("--config."):
      path, eq, text = arg[len("--config.") :].partition("=")
      if not eq and not config_lib.is_bool_field(path) and i + 1 < len(argv):
        i, text, arg = i + 1, argv[i + 1], f"{arg} {argv[i + 1]}"  # `--config.F V`
      found.append((arg, path, text if eq or text else None))
    else:
      rest.append(arg)
    i += 1
  return found, rest


def _config_error(message: str) -> None:
  print(f"config error: {message}", file=sys.stderr)
  sys.exit(2)


def run():
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
