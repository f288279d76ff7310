"""The task kit as TFDS datasets (ArrayRecord, no TensorFlow) and the loader the probes call.

Builders, one per task kind, with one BuilderConfig per task (`kit.TASKS`):

  cbert_classification  sentiment, news_topic, tweet_source, genre   train, dev, test
  cbert_regression      graded_sentiment                              train, dev, test
  cbert_pairs           nli                                           train, dev, test
  cbert_retrieval       question_passage, entailment_retrieval        corpus, queries_dev,
                                                                      queries_test

Features: `id` (Text) everywhere; classification `text` + `label` (ClassLabel with the task's
names); regression `text` + `label` (Scalar float32); pairs `text_a`, `text_b` + `label`
(ClassLabel); retrieval `text` + `relevant_ids` (Sequence of Text). The retrieval layout keeps
qrels inside the query rows: a query's `relevant_ids` are the corpus ids with relevance 1 (corpus
rows have an empty list). TFDS needs one feature spec per builder, hence the shared layout.

Nothing touches the network through TFDS: `_split_generators` ignores the download manager and
calls `kit.build_task`, which reads archives from `fetch.fetch` (cached under
`<cache>/downloads`) or the `archive` the builder was given. `file_format="array_record"` is the
only format that works without TensorFlow; read back with `builder_from_directory(...)
.as_data_source(split)`, never `as_dataset`/`tfds.load` (those need TF).

`load_task(name)` builds a dataset on first use into `<cache>/tfds` and afterwards only reads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from cbert_jax.data import build_lock, fetch
from cbert_jax.data.tasks import kit
from cbert_jax.data.tasks import spec as spec_lib

_VERSION = tfds.core.Version("2.0.0")
# Bump the version (and add a note) whenever a reader, the split rule, SPLIT_SEED or a cap changes:
# a stored dataset is keyed by builder/config/version and is otherwise reused as is.
_RELEASE_NOTES = {
  "1.0.0": "First release: 8 offline tasks from pinned PyPI/npm archives; hash-ranked "
  "train/dev/test splits (seed 0), exact-duplicate texts removed, train capped at 20k, "
  "dev/test at 5k, retrieval query splits at 5k.",
  "2.0.0": "The bigbench 1.0.0 sdist is no longer served: claim_evidence, question_paragraph "
  "and claim_evidence_retrieval are replaced by nli (SNLI), question_passage (BoolQ) and "
  "entailment_retrieval (SNLI). The other five tasks are unchanged.",
}


def _configs(kind: str) -> list[tfds.core.BuilderConfig]:
  """One BuilderConfig per registered task of `kind`; the config name is the task name."""
  return [
    tfds.core.BuilderConfig(
      name=s.name, version=_VERSION, release_notes=_RELEASE_NOTES, description=s.description
    )
    for s in kit.TASKS.values()
    if s.kind == kind
  ]


class _TaskBuilder(tfds.core.GeneratorBasedBuilder):
  """Shared plumbing: configs from the registry, examples from `kit.build_task`."""

  VERSION = _VERSION
  RELEASE_NOTES = _RELEASE_NOTES
  KIND = ""  # the task kind of the configs

  def __init__(self, *, cache_dir: str = "", archive: str | None = None, **kwargs: Any):
    """Args: cache_dir: the cache root for `fetch`; archive: read this archive instead of
    fetching (tests); other kwargs go to GeneratorBasedBuilder (config, data_dir, file_format)."""
    self._cache_dir = cache_dir
    self._archive = archive
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS's own lookup of this file goes through `importlib_resources`, which is not installed
    # (and not otherwise needed); the answer is simply this module.
    return epath.Path(__file__)

  @property
  def spec(self) -> spec_lib.TaskSpec:
    return kit.get_spec(self.builder_config.name)

  def _features(self) -> dict[str, tfds.features.FeatureConnector]:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    # DatasetInfo directly, not dataset_info_from_configs: the latter reads metadata files from
    # this module's folder, which has none.
    spec = self.spec
    return tfds.core.DatasetInfo(
      builder=self,
      description=f"{spec.description} Source: {spec.source} ({spec.license}). "
      f"Metric: {spec.metric}.",
      features=tfds.features.FeaturesDict(self._features()),
      homepage=fetch.PACKAGES[spec.package].url,
      metadata=tfds.core.MetadataDict(
        kind=spec.kind, metric=spec.metric, source=spec.source, license=spec.license
      ),
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[str, dict]]]:
    del dl_manager  # archives come from fetch.fetch (pinned, verified), never TFDS downloads
    data = kit.build_task(
      self.builder_config.name, archive=self._archive, cache_dir=self._cache_dir
    )
    return {name: self._generate_examples(records) for name, records in data.splits.items()}

  def _generate_examples(self, records: list[spec_lib.Record]) -> Iterator[tuple[str, dict]]:
    for r in records:
      yield r.id, self._row(r)

  def _row(self, r: spec_lib.Record) -> dict:
    return {"id": r.id, "text": r.text, "label": r.label}


class CbertClassification(_TaskBuilder):
  """Single-text classification tasks (`cbert_classification/<task>`)."""

  KIND = "classification"
  BUILDER_CONFIGS = _configs(KIND)

  def _features(self):
    return {
      "id": tfds.features.Text(),
      "text": tfds.features.Text(),
      "label": tfds.features.ClassLabel(names=list(self.spec.label_names)),
    }


class CbertRegression(_TaskBuilder):
  """Single-text regression tasks (`cbert_regression/<task>`)."""

  KIND = "regression"
  BUILDER_CONFIGS = _configs(KIND)

  def _features(self):
    return {
      "id": tfds.features.Text(),
      "text": tfds.features.Text(),
      "label": tfds.features.Scalar(dtype=np.float32),
    }

  def _row(self, r):
    return {"id": r.id, "text": r.text, "label": np.float32(r.label)}


class CbertPairs(_TaskBuilder):
  """Text-pair classification tasks (`cbert_pairs/<task>`)."""

  KIND = "pair"
  BUILDER_CONFIGS = _configs(KIND)

  def _features(self):
    return {
      "id": tfds.features.Text(),
      "text_a": tfds.features.Text(),
      "text_b": tfds.features.Text(),
      "label": tfds.features.ClassLabel(names=list(self.spec.label_names)),
    }

  def _row(self, r):
    return {"id": r.id, "text_a": r.text, "text_b": r.text_b, "label": r.label}


class CbertRetrieval(_TaskBuilder):
  """Retrieval tasks (`cbert_retrieval/<task>`): corpus, queries_dev, queries_test."""

  KIND = "retrieval"
  BUILDER_CONFIGS = _configs(KIND)

  def _features(self):
    return {
      "id": tfds.features.Text(),
      "text": tfds.features.Text(),
      "relevant_ids": tfds.features.Sequence(tfds.features.Text()),
    }

  def _split_generators(self, dl_manager):
    del dl_manager
    data = kit.build_task(
      self.builder_config.name, archive=self._archive, cache_dir=self._cache_dir
    )
    out = {
      "corpus": self._generate_rows(
        (i, {"id": i, "text": t, "relevant_ids": []}) for i, t in data.corpus
      )
    }
    for name, queries in data.queries.items():
      out[f"queries_{name}"] = self._generate_rows(
        (q.id, {"id": q.id, "text": q.text, "relevant_ids": list(q.relevant_ids)}) for q in queries
      )
    return out

  def _generate_rows(self, rows):
    yield from rows


BUILDERS: dict[str, type[_TaskBuilder]] = {
  b.KIND: b for b in (CbertClassification, CbertRegression, CbertPairs, CbertRetrieval)
}


# ----------------------------------------------------------------------------------------------
# Loader API.


@dataclasses.dataclass
class Task:
  """A task as plain numpy/python, ready for probes.

  Non-retrieval tasks fill `splits[split]` for split in train/dev/test with
    classification / regression: {"ids": list[str], "texts": list[str], "labels": ndarray}
    pair:                        {"ids", "texts_a", "texts_b", "labels"}
  (labels int32 class indices into `label_names`, or float32 scores for regression; a
  regression task may have pair rows too, e.g. GLUE's STS-B), rows sorted by id (a fixed,
  label-mixed order). The evaluation splits are every split but "train" (the offline kit: dev
  and test; GLUE: validation, MNLI: validation_matched / _mismatched); `headline_split` is the one
  averages use, `extra_metrics` are reported next to `metric`. Retrieval tasks leave `splits`
  empty and fill
    corpus:  {"ids": list[str], "texts": list[str]}
    queries: {"dev"|"test": {"ids": list[str], "texts": list[str]}}
    qrels:   {"dev"|"test": {query id: {corpus id: 1}}}  (every relevant doc is in the corpus)
  """

  name: str
  kind: str
  metric: str
  label_names: tuple[str, ...]
  description: str = ""
  source: str = ""
  license: str = ""
  splits: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  corpus: dict[str, list[str]] | None = None
  queries: dict[str, dict[str, list[str]]] | None = None
  qrels: dict[str, dict[str, dict[str, int]]] | None = None
  headline_split: str = "test"
  extra_metrics: tuple[str, ...] = ()

  def sizes(self) -> dict[str, int]:
    """Examples per split (retrieval: corpus and queries per split)."""
    if self.kind == "retrieval":
      return {
        "corpus": len(self.corpus["ids"]),
        **{f"queries_{s}": len(q["ids"]) for s, q in self.queries.items()},
      }
    return {s: len(d["ids"]) for s, d in self.splits.items()}

  def texts(self) -> Iterator[str]:
    """Every text of the task (both sides of pairs, the corpus and the queries)."""
    for d in self.splits.values():
      for key in ("texts", "texts_a", "texts_b"):
        yield from d.get(key, ())
    if self.corpus is not None:
      yield from self.corpus["texts"]
    for q in (self.queries or {}).values():
      yield from q["texts"]


def list_tasks() -> list[str]:
  """Names of every task in the kit, in registry order."""
  return list(kit.TASKS)


def tfds_name(name: str) -> str:
  """'builder/config' of a task, e.g. 'cbert_classification/sentiment'."""
  spec = kit.get_spec(name)
  return f"{BUILDERS[spec.kind].name}/{name}"


def default_data_dir(cache_dir: str = "") -> str:
  return os.path.join(fetch.cache_root(cache_dir), "tfds")


def prepare(
  name: str, *, cache_dir: str = "", data_dir: str | None = None, archive: str | None = None
) -> str:
  """Build task `name` into `data_dir` unless it is there already; returns its directory."""
  spec = kit.get_spec(name)
  data_dir = data_dir or default_data_dir(cache_dir)
  builder_cls = BUILDERS[spec.kind]
  out = os.path.join(data_dir, builder_cls.name, name, str(_VERSION))
  done = lambda: os.path.exists(os.path.join(out, "dataset_info.json"))
  if done():
    return out
  # One builder per host (build_lock): two processes renaming the same TFDS folder race.
  with build_lock.held(fetch.cache_root(cache_dir), f"task-{name}", f"probe task {name}"):
    if done():  # another process built it while this one waited
      return out
    # The archive first, outside TFDS: a source that cannot be had raises
    # fetch.SourceUnavailable here, and the caller skips this task.
    archive = archive or fetch.fetch(spec.package, cache_dir)
    start = time.perf_counter()
    builder = builder_cls(config=name, data_dir=data_dir, cache_dir=cache_dir, archive=archive)
    # TFDS writes into an `incomplete.*` folder and renames it at the end, so a crash never
    # leaves a half-built dataset that a later call would trust. One log line per dataset
    # instead of TFDS's progress bars (several per split).
    tfds.disable_progress_bar()
    with contextlib.redirect_stdout(io.StringIO()):  # TFDS prints two banners per dataset
      builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
      )
    sizes = {k: v.num_examples for k, v in builder.info.splits.items()}
    logging.info(
      "probe task %s built in %.1f s (%s) at %s", name, time.perf_counter() - start, sizes, out
    )
  return out


def _str(x: Any) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict]:
  source = builder.as_data_source(split=split)
  n = len(source)
  rows = source.__getitems__(list(range(n))) if n else []
  return sorted(rows, key=lambda r: _str(r["id"]))


def load_task(
  name: str, *, cache_dir: str = "", data_dir: str | None = None, archive: str | None = None
) -> Task:
  """Task `name` as numpy/python, built into `<cache>/tfds` on first use, read back afterwards.

  Args:
    name: one of `list_tasks()`.
    cache_dir: cache root (`fetch.cache_root`): archives under downloads/, datasets under tfds/.
    data_dir: where the TFDS datasets live; default `<cache>/tfds`.
    archive: read this package archive instead of the pinned download (tests, air-gapped hosts).
  """
  spec = kit.get_spec(name)
  builder = tfds.builder_from_directory(
    prepare(name, cache_dir=cache_dir, data_dir=data_dir, archive=archive)
  )
  task = Task(
    name=name,
    kind=spec.kind,
    metric=spec.metric,
    label_names=spec.label_names,
    description=spec.description,
    source=spec.source,
    license=spec.license,
  )
  if spec.kind == "retrieval":
    corpus = _read_split(builder, "corpus")
    task.corpus = {
      "ids": [_str(r["id"]) for r in corpus],
      "texts": [_str(r["text"]) for r in corpus],
    }
    task.queries, task.qrels = {}, {}
    for split in spec_lib.QUERY_SPLITS:
      rows = _read_split(builder, f"queries_{split}")
      task.queries[split] = {
        "ids": [_str(r["id"]) for r in rows],
        "texts": [_str(r["text"]) for r in rows],
      }
      task.qrels[split] = {_str(r["id"]): {_str(d): 1 for d in r["relevant_ids"]} for r in rows}
    return task
  for split in spec_lib.SPLITS:
    rows = _read_split(builder, split)
    d: dict[str, Any] = {"ids": [_str(r["id"]) for r in rows]}
    if spec.kind == "pair":
      d["texts_a"] = [_str(r["text_a"]) for r in rows]
      d["texts_b"] = [_str(r["text_b"]) for r in rows]
    else:
      d["texts"] = [_str(r["text"]) for r in rows]
    dtype = np.float32 if spec.kind == "regression" else np.int32
    d["labels"] = np.asarray([r["label"] for r in rows], dtype=dtype)
    task.splits[split] = d
  return task


def all_probe_texts(
  cache_dir: str = "",
  tasks: Iterable[str] | None = None,
  *,
  data_dir: str | None = None,
  archives: Mapping[str, str] | None = None,
) -> Iterator[str]:
  """Every distinct text of every task and split (pairs' both sides, queries, corpora).

  Texts are `text.collapse_whitespace`-normalised. Reads the built TFDS datasets (building them on first use
  under `<cache>/tfds`, which needs the archives), so the texts are exactly what the probes see.

  Args:
    cache_dir: cache root (`fetch.cache_root`).
    tasks: task names; default all of TASKS.
    data_dir: TFDS data dir; default `<cache>/tfds`.
    archives: {package name: archive path} to read instead of the pinned downloads (tests).
  """
  names = list(tasks) if tasks is not None else list(kit.TASKS)
  for name in names:
    kit.get_spec(name)  # fail on a bad name before any work
  archives = archives or {}
  seen: set[str] = set()
  for name in names:
    task = load_task(
      name, cache_dir=cache_dir, data_dir=data_dir, archive=archives.get(kit.TASKS[name].package)
    )
    for text in task.texts():
      if text not in seen:
        seen.add(text)
        yield text
