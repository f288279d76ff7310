"""Document sources for pod-scale corpora: text, JSONL(.zst), Parquet, ArrayRecord, mixtures.

`data.corpus = "sources"` reads documents from one or more *sources*, each a path or glob
(local, or any `etils.epath` URL such as `gs://...`) with a mixture weight:

  data.sources = "gs://bucket/dclm/*.jsonl.zst:0.7,/data/books/*.txt:0.3"

The weight is the last `:<number>` of an entry (default 1.0), so URLs keep their colons.
Entries are separated by commas; a glob therefore cannot use `{a,b}` alternation.

Formats, chosen by file name (per file, so one glob may mix them):

  * `*.jsonl`, `*.json`, `*.jsonl.zst`, `*.json.zst`, `*.zst` (the DCLM shard format): one
    JSON object per line; the document is the string in `data.text_field` ("text").
    Blank lines are ignored. A `.zst` file may hold several frames; one that ends
    mid-frame is *truncated*.
  * `*.parquet`: the string column `data.text_field`; one row = one document.
  * `*.array_record*` (also TFDS-style `name.array_record-00000-of-00004`): each record is
    a document, as UTF-8 text (`data.record_format = "text"`) or a JSON object holding
    `data.text_field` (`"json"`). ArrayRecord files must be local (or mounted, e.g.
    gcsfuse): the reader is C++ and opens paths itself.
  * anything else: UTF-8 plain text; `data.text_mode = "paragraphs"` splits it on blank
    lines with the same normaliser as `data.corpus = "files"` (`text.book_paragraphs`,
    which drops paragraphs shorter than `text.MIN_DOC_CHARS`), `"file"` makes the whole
    file one document.

Every document (other than paragraphs, which the normaliser already cleans) is Unicode
NFC with whitespace runs collapsed to one space; SentencePiece's default normaliser
would collapse them anyway, and this keeps the split hash independent of layout.

Bad input is never dropped silently. With `data.on_bad_record = "error"` (default) the
first problem raises one `ConfigError` naming the file, the line/record/row, and what was
expected. With `"skip"` the record (or the rest of a truncated/undecodable file) is
skipped and counted in a `BadCounts`, which the preprocessor puts in the manifest:

  invalid_utf8, invalid_json, missing_field (absent, null or not a string),
  empty_doc (a record whose text is empty after normalisation), empty_file (a file that
  yields no document at all), truncated (a `.zst` ending mid-frame; the documents read
  before the cut are kept), unreadable (a file that cannot be opened or parsed at all).

A glob that matches nothing and a path that does not exist are always errors: they are
configuration mistakes, not bad records.
"""

from __future__ import annotations

import collections
import dataclasses
import glob as glob_lib
import io
import json
import os
import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

from etils import epath

from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

FORMATS = ("text", "jsonl", "jsonl.zst", "parquet", "array_record")
TEXT_MODES = ("paragraphs", "file")
RECORD_FORMATS = ("text", "json")
ON_BAD = ("error", "skip")
BAD_KINDS = (
  "invalid_utf8",
  "invalid_json",
  "missing_field",
  "empty_doc",
  "empty_file",
  "truncated",
  "unreadable",
)
# Read granularity for streamed files; big enough to amortise Python overhead.
_CHUNK = 1 << 20
_ARRAY_RECORD = re.compile(r"\.array_?record(-\d+-of-\d+)?$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """How documents are extracted from files (the `data.*` fields of the same names)."""

  text_field: str = "text"
  text_mode: str = "paragraphs"
  record_format: str = "text"
  on_bad_record: str = "error"


@dataclasses.dataclass(frozen=True)
class FileInfo:
  """One input file: where it is, its format, and a cheap fingerprint (size, mtime)."""

  path: str
  format: str
  size: int
  mtime: float


@dataclasses.dataclass(frozen=True)
class Source:
  """One mixture component: the pattern as configured, its weight, and its files."""

  pattern: str
  weight: float
  files: tuple[FileInfo, ...]


class BadCounts(collections.Counter):
  """Counts of skipped bad input by kind (see the module docstring)."""

  def as_dict(self) -> dict[str, int]:
    """All kinds, zeros included, so manifests have a fixed shape."""
    return {k: int(self.get(k, 0)) for k in BAD_KINDS}


# --- Config ------------------------------------------------------------------------------


def parse_sources(spec: str | Sequence[str]) -> list[tuple[str, float]]:
  """Parses `data.sources` into [(pattern, weight)].

  Args:
    spec: "pattern[:weight],pattern[:weight],..." or a list of such entries.

  Returns:
    The entries in the order given; the weight defaults to 1.0.

  Raises:
    ConfigError: for an empty spec, a non-positive or non-finite weight, or an entry
      without a path.
  """
  if isinstance(spec, str):
    entries = [e.strip() for e in spec.split(",") if e.strip()]
  else:
    entries = [str(e).strip() for e in (spec or []) if str(e).strip()]
  if not entries:
    raise ConfigError(
      "data.sources is empty; with data.corpus='sources' give "
      "'pattern[:weight],...', e.g. 'gs://b/dclm/*.jsonl.zst:0.7,/data/books/*.txt:0.3'."
    )
  out = []
  for entry in entries:
    pattern, weight = entry, 1.0
    head, sep, tail = entry.rpartition(":")
    if sep and head and not tail.startswith("//"):
      try:
        weight = float(tail)
        pattern = head
      except ValueError:
        pass  # a colon inside the path (e.g. a URL scheme): no weight given.
    if not (weight > 0 and weight != float("inf")):
      raise ConfigError(
        f"data.sources: entry {entry!r} has weight {weight}; expected a finite number "
        "> 0 after the last ':'."
      )
    out.append((pattern.strip(), weight))
  return out


def read_options(cfg: Any) -> ReadOptions:
  """Builds and validates `ReadOptions` from the `data` config.

  Raises:
    ConfigError: naming the bad field and the allowed values.
  """
  opts = ReadOptions(
    text_field=getattr(cfg, "text_field", "text"),
    text_mode=getattr(cfg, "text_mode", "paragraphs"),
    record_format=getattr(cfg, "record_format", "text"),
    on_bad_record=getattr(cfg, "on_bad_record", "error"),
  )
  if not isinstance(opts.text_field, str) or not opts.text_field:
    raise ConfigError(f"data.text_field must be a non-empty string, got {opts.text_field!r}.")
  for name, allowed in (
    ("text_mode", TEXT_MODES),
    ("record_format", RECORD_FORMATS),
    ("on_bad_record", ON_BAD),
  ):
    if getattr(opts, name) not in allowed:
      raise ConfigError(f"data.{name} must be one of {allowed}, got {getattr(opts, name)!r}.")
  return opts


def file_format(path: str) -> str:
  """The format of `path` from its name (see the module docstring)."""
  name = os.path.basename(str(path)).lower()
  if name.endswith((".jsonl.zst", ".json.zst", ".zst")):
    return "jsonl.zst"
  if name.endswith((".jsonl", ".json")):
    return "jsonl"
  if name.endswith(".parquet"):
    return "parquet"
  if _ARRAY_RECORD.search(name):
    return "array_record"
  return "text"


def _expand_one(pattern: str) -> list[str]:
  """Expands one path or glob to existing files (sorted), via epath for URLs."""
  is_url = "://" in pattern
  if not is_url:
    pattern = os.path.expandvars(os.path.expanduser(pattern))
  if not glob_lib.has_magic(pattern):
    try:
      ok = epath.Path(pattern).is_file()
    except Exception as e:  # a backend may raise for missing buckets or credentials.
      raise ConfigError(f"data.sources: cannot access {pattern!r} ({e}).") from e
    return [pattern] if ok else []
  if not is_url:
    return sorted(p for p in glob_lib.glob(pattern, recursive=True) if os.path.isfile(p))
  # URL glob: the part before the first magic component is the directory to list.
  parts = pattern.split("/")
  first = next(i for i, part in enumerate(parts) if glob_lib.has_magic(part))
  base, rest = "/".join(parts[:first]), "/".join(parts[first:])
  try:
    return sorted(os.fspath(p) for p in epath.Path(base).glob(rest) if p.is_file())
  except Exception as e:
    raise ConfigError(f"data.sources: cannot list {pattern!r} ({e}).") from e


def _stat(path: str) -> FileInfo:
  """Size and mtime without reading the file (local stat or the backend's listing)."""
  try:
    if "://" in path:
      st = epath.Path(path).stat()
      size, mtime = int(st.length), float(st.mtime or 0.0)
    else:
      st = os.stat(path)
      size, mtime = int(st.st_size), float(st.st_mtime)
  except Exception as e:
    raise ConfigError(f"data.sources: cannot stat {path!r} ({e}).") from e
  return FileInfo(path=path, format=file_format(path), size=size, mtime=mtime)


def expand_sources(cfg: Any) -> list[Source]:
  """Parses `data.sources` and lists every file (no file is read).

  Raises:
    ConfigError: for a bad spec, a pattern that matches no file, or a missing path.
  """
  sources = []
  for pattern, weight in parse_sources(getattr(cfg, "sources", "")):
    paths = _expand_one(pattern)
    if not paths:
      raise ConfigError(
        f"data.sources: {pattern!r} matches no file (expected a path or glob of "
        ".txt/.jsonl/.jsonl.zst/.parquet/.array_record files)."
      )
    sources.append(Source(pattern=pattern, weight=weight, files=tuple(_stat(p) for p in paths)))
  return sources


def check_sources_config(cfg: Any) -> list[Source]:
  """Validates every `data.*` field the sources path reads; returns the expanded sources."""
  read_options(cfg)
  val_fraction = getattr(cfg, "val_fraction", 0.02)
  if (
    isinstance(val_fraction, bool)
    or not isinstance(val_fraction, (int, float))
    or not 0.0 <= val_fraction < 1.0
  ):
    raise ConfigError(f"data.val_fraction must be a float in [0, 1), got {val_fraction!r}.")
  seed = getattr(cfg, "split_seed", 0)
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise ConfigError(f"data.split_seed must be an int, got {seed!r}.")
  if getattr(cfg, "max_docs", 0):
    raise ConfigError(
      "data.max_docs is not supported with data.corpus='sources' (it has no global "
      "document order to cut); point data.sources at fewer files instead."
    )
  return expand_sources(cfg)


# --- Reading -----------------------------------------------------------------------------


def normalise_doc(text: str) -> str:
  """NFC and collapsed whitespace: the normal form of a whole-document record."""
  return " ".join(unicodedata.normalize("NFC", text).split())


class _Reader:
  """Per-file state for error messages and the error/skip policy."""

  def __init__(self, info: FileInfo, opts: ReadOptions, bad: BadCounts):
    self.info, self.opts, self.bad = info, opts, bad
    self.yielded = 0
    self.failures = 0

  def fail(self, kind: str, where: str, what: str) -> None:
    """Raises (on_bad_record='error') or counts (skip) one bad record."""
    self.failures += 1
    if self.opts.on_bad_record == "skip":
      self.bad[kind] += 1
      return
    raise ConfigError(
      f"data.sources: {self.info.path}{(': ' + where) if where else ''}: {what} "
      f"(set data.on_bad_record='skip' to skip and count such input)."
    )

  def text_of(self, obj: Any, where: str) -> str | None:
    """The text field of a parsed JSON object, or None after reporting it."""
    field = self.opts.text_field
    if not isinstance(obj, dict):
      self.fail("invalid_json", where, f"expected a JSON object, got {type(obj).__name__}")
      return None
    value = obj.get(field)
    if not isinstance(value, str):
      what = "missing" if field not in obj else f"a {type(value).__name__}, not a string"
      self.fail(
        "missing_field",
        where,
        f"field {field!r} is {what}; expected the document text (data.text_field)",
      )
      return None
    return value

  def doc(self, text: str, where: str) -> str | None:
    """Normalises one record's text; an empty result is reported as empty_doc."""
    text = normalise_doc(text)
    if not text:
      self.fail("empty_doc", where, "the document text is empty")
      return None
    self.yielded += 1
    return text


def _zstd_chunks(f: io.BufferedIOBase, r: _Reader) -> Iterator[bytes]:
  """Decompresses a (multi-frame) zstd stream; reports a stream that ends mid-frame."""
  import zstandard  # pylint: disable=g-import-not-at-top  (only needed for .zst input)

  dctx = zstandard.ZstdDecompressor()
  dobj, fed = dctx.decompressobj(), False
  pending = b""
  while True:
    chunk = pending or f.read(_CHUNK)
    pending = b""
    if not chunk:
      break
    try:
      out = dobj.decompress(chunk)
    except zstandard.ZstdError as e:
      r.fail("unreadable", "", f"is not valid zstd data ({e}); expected a .zst stream")
      return
    fed = True
    if out:
      yield out
    if dobj.eof:
      # A frame ended: the rest of this chunk (if any) starts the next frame.
      pending = dobj.unused_data
      dobj, fed = dctx.decompressobj(), False
  if fed and not dobj.eof:
    r.fail(
      "truncated",
      "",
      "the zstd stream ends mid-frame (a truncated or partly "
      "copied file); expected a complete .zst file",
    )


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
  """Splits a byte stream into lines (without the newline)."""
  tail = b""
  for chunk in chunks:
    lines = (tail + chunk).split(b"\n")
    tail = lines.pop()
    yield from lines
  if tail:
    yield tail


def _utf8(r: _Reader, raw: bytes, where: str) -> str | None:
  """`raw` as UTF-8; otherwise r.fail (raises, or counts and returns None under on_bad_record=skip)."""
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    r.fail("invalid_utf8", where, f"is not valid UTF-8 ({e})")
    return None


def _jsonl_docs(r: _Reader, f: io.BufferedIOBase, zst: bool) -> Iterator[str]:
  chunks = _zstd_chunks(f, r) if zst else iter(lambda: f.read(_CHUNK), b"")
  for n, raw in enumerate(_lines(chunks), start=1):
    if not raw.strip():
      continue
    where = f"line {n}"
    line = _utf8(r, raw, where)
    if line is None:
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      r.fail("invalid_json", where, f"is not valid JSON ({e}); expected one JSON object per line")
      continue
    text = r.text_of(obj, where)
    if text is not None and (doc := r.doc(text, where)) is not None:
      yield doc


def _text_docs(r: _Reader, data: bytes) -> Iterator[str]:
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[: e.start].count(b"\n") + 1
    r.fail(
      "invalid_utf8",
      f"line {line} (byte {e.start})",
      f"is not valid UTF-8 ({e.reason}); expected UTF-8 text",
    )
    return
  if r.opts.text_mode == "file":
    if (doc := r.doc(text, "")) is not None:
      yield doc
    return
  for doc in text_lib.book_paragraphs(text):
    r.yielded += 1
    yield doc


def _parquet_docs(r: _Reader, f: io.BufferedIOBase) -> Iterator[str]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    pf = pq.ParquetFile(f)
  except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-Parquet bytes.
    r.fail("unreadable", "", f"is not a Parquet file ({e})")
    return
  field = r.opts.text_field
  if field not in pf.schema_arrow.names:
    r.fail(
      "missing_field",
      "",
      f"has no column {field!r} (columns: "
      f"{pf.schema_arrow.names}); expected the text column data.text_field",
    )
    return
  row = 0
  for batch in pf.iter_batches(columns=[field], batch_size=4096):
    for value in batch.column(0).to_pylist():
      row += 1
      where = f"row {row}"
      if not isinstance(value, str):
        r.fail(
          "missing_field",
          where,
          f"column {field!r} is {'null' if value is None else type(value).__name__}, not a string",
        )
        continue
      if (doc := r.doc(value, where)) is not None:
        yield doc


def _array_record_docs(r: _Reader) -> Iterator[str]:
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  try:
    reader = array_record_module.ArrayRecordReader(r.info.path)
  except Exception as e:  # the C++ reader raises RuntimeError/ValueError on bad files.
    r.fail("unreadable", "", f"is not a readable ArrayRecord file ({e})")
    return
  try:
    n = reader.num_records()
    for start in range(0, n, 1024):
      for i, raw in enumerate(reader.read(start, min(n, start + 1024)), start=start):
        where = f"record {i}"
        text = _utf8(r, raw, where)
        if text is None:
          continue
        if r.opts.record_format == "json":
          try:
            text = r.text_of(json.loads(text), where)
          except json.JSONDecodeError as e:
            r.fail(
              "invalid_json",
              where,
              f"is not valid JSON ({e}); expected a JSON object (data.record_format='json')",
            )
            continue
          if text is None:
            continue
        if (doc := r.doc(text, where)) is not None:
          yield doc
  finally:
    reader.close()


def iter_documents(
  info: FileInfo, opts: ReadOptions, bad: BadCounts | None = None
) -> Iterator[str]:
  """Yields the normalised documents of one file, in file order.

  Args:
    info: the file (from `expand_sources`).
    opts: read options.
    bad: where skipped input is counted (on_bad_record='skip'); a fresh one if None.

  Yields:
    Non-empty normalised document strings.

  Raises:
    ConfigError: on the first bad record when `opts.on_bad_record == "error"`.
  """
  bad = BadCounts() if bad is None else bad
  r = _Reader(info, opts, bad)
  path = epath.Path(info.path)
  try:
    if info.format == "array_record":
      yield from _array_record_docs(r)
    elif info.format == "text":
      yield from _text_docs(r, path.read_bytes())
    else:
      with path.open("rb") as f:
        if info.format == "parquet":
          yield from _parquet_docs(r, f)
        else:
          yield from _jsonl_docs(r, f, zst=info.format == "jsonl.zst")
  except OSError as e:
    r.fail("unreadable", "", f"cannot be read ({e})")
  if r.yielded == 0 and not r.failures:  # a file of only bad records is counted above.
    r.fail(
      "empty_file",
      "",
      f"yields no document; expected at least one non-empty {info.format} document",
    )
