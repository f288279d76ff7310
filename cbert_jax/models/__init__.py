"""Model families by name; `config.model_name` picks one.

`NAMES` is importable without JAX (config files and `config_lib` check names against it);
`FAMILIES` ({name: class}) imports the model modules on first use.
"""

NAMES = ("bert", "crossbert", "electra")


def __getattr__(name: str):
  if name == "FAMILIES":
    from cbert_jax.models.families import FAMILIES  # pylint: disable=import-outside-toplevel

    return FAMILIES
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
