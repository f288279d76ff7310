"""Text helpers shared by every data module: decoding, normalisation, split and hashing.

A leaf module (it imports nothing from the data package but `errors`), so the corpus
dispatcher, the offline corpus build, the task kit and the streaming preprocessor can all
use the same rules without import cycles:

* decoding bytes: `decode_book` (UTF-8, Latin-1 fallback for the Gutenberg tarball),
  `decode_utf8` (strict) and `decode_utf8_or_cp1252` (the task kit's archives);
* normalisation: `book_paragraphs` splits a raw book or file into normalised paragraphs
  (documents of the pretraining corpus); `collapse_whitespace` normalises one probe text to
  a single line (NFC, whitespace collapsed) for the task kit and the leakage guard;
* the hash-based train/validation split `is_val` and the corpus `content_hash`.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence

from cbert_jax.errors import ConfigError

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
  re.IGNORECASE | re.MULTILINE,
)
_PG_START = re.compile(
  r"^[^\S\n]*\*{3}\s*START OF TH(E|IS) PROJECT GUTENBERG[^\n]*", re.IGNORECASE | re.MULTILINE
)
# NLTK puts "[Emma by Jane Austen 1816]" on the first line of each book.
_NLTK_TITLE = re.compile(r"^\[[^\]\n]{1,200}\]$")
# KJV verse numbers ("1:1 In the beginning ..."): pure digit noise for an MLM.
# A paragraph may hold several verses, so once a paragraph starts with one, all go.
_VERSE_START = re.compile(r"^\d+:\d+\s")
_VERSE_NUMBER = re.compile(r"(?:^|(?<=\s))\d+:\d+\s+")


def book_paragraphs(text: str) -> list[str]:
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
    text = text[start.end() :]
  end = _PG_END.search(text)
  if end:
    text = text[: _blank_lines_before(text, end.start())]
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


def why_empty(text: str) -> str:
  """Why `book_paragraphs(text)` gave no document, for the one-line error."""
  if not text.strip():
    return f"it holds {len(text)} characters, all whitespace" if text else "it is empty"
  return (
    f"no paragraph between blank lines reaches {MIN_DOC_CHARS} characters once "
    "Gutenberg licence blocks, title lines and verse numbers are removed"
  )


# --- Decoding -------------------------------------------------------------------------------


def decode_book(data: bytes, name: str, strict: bool) -> str:
  """Decodes UTF-8; the Gutenberg tarball has two Latin-1 files, so it may fall back."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    if strict:
      raise ConfigError(
        f"data.corpus_files: {name} is not valid UTF-8 text ({e}). Re-encode it as UTF-8."
      ) from e
    # Checked: chesterton-ball.txt and shakespeare-caesar.txt hold bare Latin-1 accents
    # (è, é, æ) and no other non-ASCII bytes.
    return data.decode("latin-1")


def decode_utf8(data: bytes, where: str) -> str:
  """Strict UTF-8: these sources are documented UTF-8, so anything else is a bad file."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ConfigError(f"{where}: expected UTF-8 text, got invalid bytes ({e}).") from e


def decode_utf8_or_cp1252(data: bytes, where: str) -> str:
  """UTF-8, else cp1252 (one BBC article has a bare 0xA3 pound sign)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    try:
      return data.decode("cp1252")
    except UnicodeDecodeError as e:
      raise ConfigError(f"{where}: expected UTF-8 (or cp1252) text; cannot decode it ({e})") from e


# A word for matching and dedupe (offline/readers.py, offline/dedupe.py).
WORD = re.compile(r"\w+")


# --- Probe texts ---------------------------------------------------------------------------


def collapse_whitespace(text: str) -> str:
  """NFC, U+FFFD (a lost character, usually a no-break space) -> space, whitespace collapsed.

  Every probe text goes through this; the corpus builder should normalise its lines the same way
  before comparing them with `all_probe_texts`.
  """
  text = unicodedata.normalize("NFC", text).replace("\ufffd", " ")
  return " ".join(text.split())


# --- Split and hashing --------------------------------------------------------------------


def is_val(text: str, seed: int, val_fraction: float) -> bool:
  """Hash-based split: depends only on (seed, text), not on order or corpus size."""
  digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
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
