"""GLUE through tensorflow-datasets, probed with the offline suite's frozen-feature probes.

The paper reports GLUE with frozen features. This module turns a TFDS GLUE config into the same
`task_tfds.Task` the offline kit produces, and runs `suite.probe_task` on it: mean-pooled
frozen features (pairs: SentEval [u, v, |u - v|, u * v] of the separately encoded sentences),
ridge and kNN probes whose λ / k are chosen on a held-out part of *train*, scored on the
validation split(s). GLUE's test labels are hidden (-1), so validation is the reported split, as
in the BERT and SentEval papers.

  task  fields                  target            metric (also)       eval splits
  cola  sentence                2 classes         mcc                 validation
  sst2  sentence                2 classes         accuracy            validation
  mrpc  sentence1, sentence2    2 classes         f1 (accuracy)       validation
  qqp   question1, question2    2 classes         f1 (accuracy)       validation
  stsb  sentence1, sentence2    score in [0, 5]   spearman            validation
  mnli  premise, hypothesis     3 classes         accuracy            validation_matched, _mismatched
  qnli  question, sentence      2 classes         accuracy            validation
  rte   sentence1, sentence2    2 classes         accuracy            validation
  wnli  sentence1, sentence2    2 classes         accuracy            validation (not in the default)

Reading: TFDS's GLUE builder is prepared once into `<data_dir>/glue/<task>` in the ArrayRecord
format and read back with `as_data_source` (random access, numpy), which needs no TensorFlow.
The first preparation downloads and extracts the GLUE archives, so it needs internet once, and
TensorFlow (the `tf` extra: TFDS's zip extractor calls `tf.compat.as_text`); a prepared
directory can be copied to machines without either. Only the rows a
probe uses are read: train is capped at `evals.max_train` and each validation split at
`evals.max_eval` (seeded random subsets, the same for every model), so QQP's 364k and MNLI's 393k
training rows cost a probe no more than the kit's tasks do.

Tests run it offline under `tfds.testing.mock_data`, which replaces the download and the data
source with generated rows of GLUE's real feature spec.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from cbert_jax.data.tasks import tfds as task_tfds
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import features as features_lib
from cbert_jax.evaluators import suite


@dataclasses.dataclass(frozen=True)
class GlueSpec:
  """One GLUE task: the TFDS text fields, the target, the metric and the splits it is scored on."""

  fields: tuple[str, ...]  # one field: single sentence; two: a pair
  kind: str  # "classification" | "regression"
  metric: str  # key of probes.METRICS, the headline
  label_names: tuple[str, ...] = ()
  also: tuple[str, ...] = ()  # further metrics reported next to `metric`
  eval_splits: tuple[str, ...] = ("validation",)


GLUE_TASKS: dict[str, GlueSpec] = {
  "cola": GlueSpec(("sentence",), "classification", "mcc", ("unacceptable", "acceptable")),
  "sst2": GlueSpec(("sentence",), "classification", "accuracy", ("negative", "positive")),
  "mrpc": GlueSpec(
    ("sentence1", "sentence2"),
    "classification",
    "f1",
    ("not_equivalent", "equivalent"),
    also=("accuracy",),
  ),
  "qqp": GlueSpec(
    ("question1", "question2"),
    "classification",
    "f1",
    ("not_duplicate", "duplicate"),
    also=("accuracy",),
  ),
  "stsb": GlueSpec(("sentence1", "sentence2"), "regression", "spearman"),
  "mnli": GlueSpec(
    ("premise", "hypothesis"),
    "classification",
    "accuracy",
    ("entailment", "neutral", "contradiction"),
    eval_splits=("validation_matched", "validation_mismatched"),
  ),
  "qnli": GlueSpec(
    ("question", "sentence"), "classification", "accuracy", ("entailment", "not_entailment")
  ),
  "rte": GlueSpec(
    ("sentence1", "sentence2"), "classification", "accuracy", ("entailment", "not_entailment")
  ),
  "wnli": GlueSpec(
    ("sentence1", "sentence2"), "classification", "accuracy", ("not_entailment", "entailment")
  ),
}
# The usual GLUE average leaves out WNLI (adversarial dev set, majority class wins).
DEFAULT_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")


def task_names(value: str) -> list[str]:
  """The GLUE tasks of `evals.glue_tasks` ("" = the default 8), checked; ConfigError names the field."""
  names = [t.strip() for t in str(value).split(",") if t.strip()] or list(DEFAULT_TASKS)
  for name in names:
    if name not in GLUE_TASKS:
      raise ConfigError(
        f"evals.glue_tasks: unknown GLUE task {name!r}; known: {', '.join(GLUE_TASKS)}"
      )
  return names


def _text(x: Any) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _builder(name: str, data_dir: str):
  """The TFDS GLUE builder for `name`, prepared (downloaded once) in the ArrayRecord format."""
  import tensorflow_datasets as tfds

  # Importing the module registers the "glue" builder; without TensorFlow, TFDS's lazy catalog
  # does not find it by name alone.
  import tensorflow_datasets.text.glue  # noqa: F401  pylint: disable=unused-import

  builder = tfds.builder(f"glue/{name}", data_dir=data_dir or None, file_format="array_record")
  try:
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
  except ImportError as e:  # TFDS's archive extractor calls TensorFlow (tf.compat.as_text)
    raise ConfigError(
      f"evals.glue_tasks: preparing glue/{name} (download and extract, once) "
      "needs TensorFlow: pip install -e '.[tf]'; reading it afterwards does not "
      f"({e})"
    ) from e
  except Exception as e:  # a network or disk failure: one line naming the task and directory
    raise ConfigError(
      f"evals.glue_tasks: could not prepare glue/{name} in {builder.data_dir!r} "
      f"(the first use downloads GLUE, which needs internet): "
      f"{type(e).__name__}: {e}"
    ) from e
  return builder


def _read(source, cap: int, seed: int) -> list[dict]:
  """At most `cap` rows of a data source: a seeded random subset, read in index order."""
  n = len(source)
  idx = np.arange(n) if n <= cap else np.sort(np.random.RandomState(seed).permutation(n)[:cap])
  # Row by row: `__getitems__` would batch the reads, but tfds.testing.mock_data's fake source
  # does not support it, and at <= a few thousand rows per split the difference is small.
  return [source[int(i)] for i in idx]


def load_task(
  name: str, *, data_dir: str = "", max_train: int = 5000, max_eval: int = 2000, seed: int = 0
) -> task_tfds.Task:
  """GLUE task `name` as a `task_tfds.Task` (train plus its validation split(s)).

  Rows with a hidden label (-1) are dropped. Labels: int32 class ids, or float32 scores (STS-B).
  """
  spec = GLUE_TASKS[name]
  builder = _builder(name, data_dir)
  task = task_tfds.Task(
    name=f"glue/{name}",
    kind=spec.kind,
    metric=spec.metric,
    label_names=spec.label_names,
    description=f"GLUE {name}",
    source="tensorflow_datasets glue",
    license="see the GLUE papers",
    headline_split=spec.eval_splits[0],
    extra_metrics=spec.also,
  )
  dtype = np.float32 if spec.kind == "regression" else np.int32
  for i, split in enumerate(("train",) + spec.eval_splits):
    rows = _read(
      builder.as_data_source(split=split), max_train if split == "train" else max_eval, seed + i
    )
    if spec.kind == "classification":
      rows = [r for r in rows if int(r["label"]) >= 0]
    if not rows:
      raise ConfigError(f"evals.glue_tasks: glue/{name} split {split!r} has no labelled rows")
    d: dict[str, Any] = {
      "ids": [f"{name}-{split}-{int(r['idx'])}" for r in rows],
      "labels": np.asarray([r["label"] for r in rows], dtype),
    }
    if len(spec.fields) == 1:
      d["texts"] = [_text(r[spec.fields[0]]) for r in rows]
    else:
      d["texts_a"] = [_text(r[spec.fields[0]]) for r in rows]
      d["texts_b"] = [_text(r[spec.fields[1]]) for r in rows]
    task.splits[split] = d
  return task


def run(
  graphdef,
  params,
  tokenizer,
  ecfg,
  *,
  cache_dir: str = "",
  mesh=None,
  rules=None,
  tasks: Sequence[str] | None = None,
) -> dict:
  """The GLUE probes over `evals.glue_tasks` for one set of parameters (only read).

  GLUE is prepared in `evals.glue_data_dir`, default `<cache_dir>/tfds` (next to the task kit).

  Returns {"glue/<task>": probe_task result, ..., "average": {ridge, logreg, knn, all}} where every
  score is on the task's headline split (MNLI: matched; mismatched is in the task's entry).
  """
  names = list(tasks) if tasks is not None else task_names(ecfg.get("glue_tasks", ""))
  featurizer = features_lib.featurizer_from_evals(graphdef, params, ecfg, mesh=mesh, rules=rules)
  data_dir = ecfg.get("glue_data_dir", "") or task_tfds.default_data_dir(cache_dir)
  results: dict = {}
  for name in names:
    start = time.perf_counter()
    task = load_task(name, data_dir=data_dir, max_train=ecfg.max_train, max_eval=ecfg.max_eval)
    results[task.name] = suite.probe_task(task, featurizer, tokenizer, ecfg.seq_len, ecfg)
    results[task.name]["seconds"] = round(time.perf_counter() - start, 1)
    logging.info(
      "glue %s: %s", name, {k: v for k, v in results[task.name].items() if k != "layerwise"}
    )
  results["average"] = suite.average(results)
  return results


def markdown(results: dict, title: str = "") -> str:
  """One row per (task, validation split): metric, ridge, logreg, kNN, and the extra metrics."""
  lines = [f"### {title}", ""] if title else []
  lines += [
    "| task | split | metric | ridge | logreg | kNN | also (ridge) |",
    "|---|---|---|---|---|---|---|",
  ]
  fmt = lambda x: "-" if x is None else f"{x:.4f}"
  for name, r in results.items():
    if name == "average":
      continue
    for split in [s for s in r["sizes"] if s != "train"]:
      extra = r.get("extra", {}).get("ridge", {}).get(split, {})
      also = ", ".join(f"{m} {v:.4f}" for m, v in extra.items()) or "-"
      lines.append(
        f"| {name} | {split} | {r['metric']} | {fmt(r.get('ridge', {}).get(split))} | "
        f"{fmt(r.get('logreg', {}).get(split))} | {fmt(r.get('knn', {}).get(split))} | {also} |"
      )
  return "\n".join(lines + suite.markdown_footer(results, "headline splits"))
