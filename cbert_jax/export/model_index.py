"""The exported step's scores as the model card's `model-index` metadata (the YAML front matter
that Hugging Face reads into a model's evaluation results, and that sentence-transformers and
mteb model cards carry).

One entry per scored task of every probe suite run on the exported step
(`eval/[<suite>-]step_<N>[-<hash>].json`):
  * mteb: task type (Classification, Retrieval, STS, ...), the task's dataset (its hub path and
    revision, as mteb names it), the first evaluation split, and the main score under its mteb
    name (ndcg_at_10, accuracy, cosine_spearman, ...), as mteb writes them;
  * the offline kit and GLUE: the task's kind (Classification, Regression, PairClassification,
    Retrieval), `cbert_jax/<suite>/<task>` as the dataset (these are not hub datasets), the headline
    split and metric (the ridge probe's, as the suite's table). Tasks that were skipped or failed
    are left out.
Strings are written as JSON strings (valid YAML), so a task or dataset name cannot break the
front matter; `tests/export/test_export.py` parses it with huggingface_hub's own reader.
"""

from __future__ import annotations

import json
import math
import os

from cbert_jax.run import record as record_lib

KIND_TO_TASK = {
  "classification": "Classification",
  "regression": "Regression",
  "pair": "PairClassification",
  "retrieval": "Retrieval",
}


def _entry(task: str, dataset: str, name: str, split: str, metric: str, value: float, **extra):
  return {
    "task": {"type": task},
    "dataset": {"type": dataset, "name": name, "split": split, **extra},
    "metrics": [{"type": metric, "value": float(value)}],
  }


def mteb_entries(results: dict) -> list[dict]:
  out = []
  for name, r in results.items():
    if name in ("average", "failed") or not isinstance(r, dict) or "score" not in r:
      continue
    extra = {"revision": str(r["dataset_revision"])} if r.get("dataset_revision") else {}
    out.append(
      _entry(
        r.get("type", "?"),
        str(r.get("dataset") or f"mteb/{name}"),
        f"MTEB {name}",
        (r.get("splits") or ["test"])[0],
        r.get("main_score", "main_score"),
        r["score"],
        **extra,
      )
    )
  return out


def probe_entries(suite: str, results: dict) -> list[dict]:
  """The offline kit's or GLUE's tasks: the headline split's ridge metric (retrieval: its metric)."""
  from cbert_jax.evaluators import suite as suite_lib  # pylint: disable=import-outside-toplevel

  out = []
  for name, r in results.items():
    if name == "average" or not isinstance(r, dict) or suite_lib.not_scored(r) or "kind" not in r:
      continue
    split = "test" if r["kind"] == "retrieval" else r.get("headline_split", "test")
    out.append(
      _entry(
        KIND_TO_TASK.get(r["kind"], r["kind"]),
        f"cbert_jax/{suite}/{name}",
        f"cbert_jax {suite} {name}",
        split,
        r.get("metric", "score"),
        suite_lib.headline(r),
      )
    )
  return out


def entries(workdir: str, step: int) -> list[dict]:
  """Every scored task of every suite run on `step`, in file order (unreadable files skipped:
  the card's body names them)."""
  out = []
  for path in record_lib.suite_results(workdir, step):
    try:
      with open(path) as f:
        rec = json.load(f)
    except (OSError, ValueError):
      continue
    if not isinstance(rec, dict) or not isinstance(rec.get("results"), dict):
      continue
    suite = rec.get("suite", "offline")
    if suite == "mteb":
      out += mteb_entries(rec["results"])
    else:
      out += probe_entries(suite, rec["results"])
  return out


def yaml_lines(model_name: str, items: list[dict]) -> list[str]:
  """The `model-index:` block of the front matter (no lines without entries)."""
  if not items:
    return []
  q = json.dumps  # a JSON string is a YAML double-quoted scalar
  items = [e for e in items if all(math.isfinite(m["value"]) for m in e["metrics"])]
  if not items:
    return []
  lines = ["model-index:", f"- name: {q(model_name)}", "  results:"]
  for e in items:
    lines += ["  - task:", f"      type: {q(e['task']['type'])}", "    dataset:"]
    lines += [f"      {k}: {q(str(v))}" for k, v in e["dataset"].items()]
    lines.append("    metrics:")
    for m in e["metrics"]:
      lines += [f"    - type: {q(m['type'])}", f"      value: {m['value']!r}"]
  return lines


def card_name(workdir: str, model_name: str, size: str) -> str:
  """The name the metadata gives the model: cbert_jax/<family>-<size>-<run>."""
  return f"cbert_jax/{model_name}-{size}-{os.path.basename(os.path.normpath(workdir))}"
