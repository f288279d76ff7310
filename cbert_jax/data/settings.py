"""`data_config(config)`: a run config's `data` group as the data package reads it; `check`: the
one check of its fields.

A leaf (ml_collections only), so the data entry points (`prepare`, `preprocess`'s CLI) read a run
config without importing `config_lib`, which sits above the data package.
"""

import ml_collections

from cbert_jax.errors import ConfigError


def data_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config.data with corpus_files as a list (the config holds a comma-separated string, easy to
  override from the command line)."""
  files = config.data.corpus_files
  files = (
    [f.strip() for f in files.split(",") if f.strip()] if isinstance(files, str) else list(files)
  )
  return ml_collections.ConfigDict({**config.data.to_dict(), "corpus_files": files})


def check(cfg: ml_collections.ConfigDict) -> None:
  """Checks a `data_config` group before any text is read: the corpus kind, then the fields of
  that kind (`sources` or the others), then the tokenizer's. The one check of the data settings:
  `config_lib.validate` (every run) and `prepare.prepare` (the data package's entry) call it.

  Raises:
    ConfigError: naming the first bad field and what was expected.
  """
  # pylint: disable=g-import-not-at-top (sentencepiece, numpy: `data_config` stays a leaf)
  from cbert_jax.data import corpus, sources, tokenizer

  kinds, kind = (*corpus.CORPUS_KINDS, "sources"), getattr(cfg, "corpus", "gutenberg")
  if kind not in kinds:
    raise ConfigError(f"data.corpus must be one of {', '.join(map(repr, kinds))}, got {kind!r}")
  if kind == "sources":
    sources.check_sources_config(cfg)
  else:
    corpus.check_corpus_config(cfg)
  tokenizer.check_tokenizer_config(cfg)
