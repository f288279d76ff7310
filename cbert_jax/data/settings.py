"""`data_config(config)`: a run config's `data` group as the data package reads it.

A leaf (ml_collections only), so the data entry points (`prepare`, `preprocess`'s CLI) read a run
config without importing `config_lib`, which sits above the data package.
"""

import ml_collections


def data_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config.data with corpus_files as a list (the config holds a comma-separated string, easy to
  override from the command line)."""
  files = config.data.corpus_files
  files = (
    [f.strip() for f in files.split(",") if f.strip()] if isinstance(files, str) else list(files)
  )
  return ml_collections.ConfigDict({**config.data.to_dict(), "corpus_files": files})
