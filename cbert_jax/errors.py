"""The one error type users see for bad input: a config field, a file, or a mesh that does not fit.

Raised before any expensive work (compilation, data preparation, checkpoint writes); `main.py`
prints it as one line, without a traceback.
"""


class ConfigError(ValueError):
  """Bad user input. The message names the field or file and what was expected."""


class CheckpointError(RuntimeError):
  """A checkpoint could not be written (e.g. the disk is full) or none could be read. The message
  names the directory and the last complete checkpoint; nothing already written is removed."""


class WorkdirError(ConfigError):
  """The workdir cannot hold this run: not a writable directory, or in use by another run (its
  lock, cbert_jax/run/workdir_lock.py). Nothing is written to it."""
