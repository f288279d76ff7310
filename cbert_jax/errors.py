"""The one error type users see for bad input: a config field, a file, or a mesh that does not fit.

Raised before any expensive work (compilation, data preparation, checkpoint writes); `main.py`
prints it as one line, without a traceback.
"""


class ConfigError(ValueError):
  """Bad user input. The message names the field or file and what was expected."""
