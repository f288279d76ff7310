r"""Entry point: `python -m cbert_jax.main --config experiments/smoke.py[:arg] --workdir DIR`.

Any config field can be overridden: `--config.total_steps=50 --config.model.size=d64L2`. Multi-process
runs start one process per host (or several on one machine) with `--num_processes=N --process_id=i
--coordinator_address=HOST:PORT` (process 0's host), or with `--multiprocess` where JAX detects the
cluster (TPU pods, SLURM, Open MPI); single-process runs need nothing. Every process then checks
that all are present and run the same code and config (`cbert_jax/run/distributed.py`).
"""

import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from cbert_jax.errors import CheckpointError, ConfigError, WorkdirError

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment file[:arg]", lock_config=True)
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


def main(argv):
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
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
    print(f"distributed error: {e}", file=sys.stderr)
    sys.exit(distributed.EXIT_CODE)
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
    print(f"distributed error: {e}", file=sys.stderr)
    sys.exit(distributed.EXIT_CODE)
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
  """absl flag parsing, with bad `--config` input reported in one line and exit status 2.

  ml_collections raises these as tracebacks or multi-line flag errors: an unknown `--config.FIELD`
  (a bare AttributeError/KeyError), a value that does not parse as the field's type, a wrong type
  or a ConfigError inside the experiment file, and an experiment file that does not exist.
  """
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    message = _flag_error_message(str(e), argv)
    if message:
      _config_error(message)
    print(
      f"FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull to see help on flags.",
      file=sys.stderr,
    )
    sys.exit(1)
  except OSError as e:  # an override (--config.X=V) of an experiment file that failed to load
    _config_error(_flag_error_message(str(e), argv) or f"--config={_config_spec(argv)}: {e}")
  except (AttributeError, KeyError) as e:
    from cbert_jax import config_lib  # pylint: disable=g-import-not-at-top (the error path only)

    # ml_collections' message may carry a suggestion on a second line ("'total_step'\nDid you
    # mean ..."); the field name is the first line, without its quotes.
    while e.args and isinstance(e.args[0], BaseException):  # AttributeError(KeyError(...))
      e = e.args[0]
    raw = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    name = raw.strip().splitlines()[0].strip("\"' ") if raw.strip() else raw
    args = [a for a in argv if a.startswith("--config.") and name in a.split("=")[0]]
    unknown = [a for a in args if config_lib.expected_type(_field_path(a)) is None]
    culprit = (unknown or args or [None])[0]
    where = culprit or _config_spec(argv)
    _config_error(f"{where}: {config_lib.unknown_field(_field_path(culprit) if culprit else name)}")
  try:
    if _CONFIG.value is not None:
      _CONFIG.value.keys()  # an experiment file that failed to load raises here, not while parsing
  except OSError as e:
    _config_error(_flag_error_message(str(e), argv) or f"--config={_config_spec(argv)}: {e}")
  return rest


def _flag_error_message(text: str, argv: list[str]) -> str | None:
  """The one-line message for an absl/ml_collections flag error about `--config`, or None."""
  marker = "cbert_jax.errors.ConfigError: "  # an experiment file's get_config raised ConfigError
  if marker in text:
    return text.split(marker)[-1].strip()
  if "Failed loading config file" in text:
    detail = text.strip().splitlines()[-1].strip()
    return f"--config={_config_spec(argv)}: cannot load the experiment file ({detail})"
  cast = re.search(
    r"Could not override field '(\w+)' \(reference\)\. (.*) is of original type "
    r"<class '(\w+)'> and cannot be casted to type <class '([\w.]+)'>",
    text,
  )
  if cast:  # the experiment file assigned a value of another type
    field, value, got, want = cast.groups()
    return (
      f"{_config_spec(argv)} sets {field} to {value} ({got}); expected "
      f"{'true or false' if want == 'bool' else want.rsplit('.', 1)[-1]}"
    )
  flag = re.match(r"flag --config\.([\w.]+)=", text.strip())
  if flag:  # a --config.FIELD=VALUE that does not parse as the field's type
    from cbert_jax import config_lib  # pylint: disable=g-import-not-at-top (the error path only)

    path = flag.group(1)
    given = [a for a in argv if a.startswith(f"--config.{path}=") and f"flag {a}: " in text]
    value = given[-1].split("=", 1)[1] if given else text.strip()[flag.end() :].split(": ")[0]
    expected = config_lib.expected_type(path)
    if expected:
      return f"--config.{path}={value}: expected {expected}, got {value!r}"
  return None


def _field_path(arg: str) -> str:
  """`--config.model.size=d64L2` -> `model.size`."""
  return arg[len("--config.") :].split("=", 1)[0]


def _config_spec(argv: list[str]) -> str:
  """The `--config` value (the experiment file[:arg]) as the user typed it."""
  for i in reversed(range(len(argv))):  # absl keeps the last one
    if argv[i].startswith("--config="):
      return argv[i].split("=", 1)[1]
    if argv[i] == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return "the experiment file"


def _config_error(message: str) -> None:
  print(f"config error: {message}", file=sys.stderr)
  sys.exit(2)


def run():
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
