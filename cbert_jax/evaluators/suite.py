"""The offline probe suite: every task of the task kit, frozen features, ridge/logreg/kNN probes.

For each task (cbert_jax/data/TASKS.md):
  * classification / regression / pair: mean-pooled frozen features of train, dev and test; the
    probes of `evals.probes` (ridge, logreg, knn) choose their regularisation (λ, C) / k on a
    held-out part of *train* only and report the task's metric on dev and test (pairs: SentEval
    features [u, v, |u - v|, u * v]); logreg (logistic regression) runs on class labels only, so
    regression tasks have no "logreg" entry; with `layers="all"`, the ridge probe on every layer
    (the paper's Table 1 shape);
  * retrieval: queries and corpus embedded with the same mean-pooled features, cosine search,
    nDCG@10 / MRR@10 / recall@k on dev and test;
  * retrieval with the contrastive pooler (SPEC §6; `evals.pooler` = none | frozen | unfrozen |
    frozen,unfrozen, default none = off): per task, a fresh pooler (unfrozen: and a copy of the
    backbone) is trained with InfoNCE on the task's *dev* (query, relevant document) pairs, then
    queries and corpus are embedded with it and scored on *test* only, under the task keys
    `pooler_frozen` / `pooler_unfrozen`. No dev numbers are reported for the pooler: it trained
    on dev. The caller's parameters are never modified (unfrozen trains a functional copy).
Results are one dict: {task: {...}, "average": {...}}, written as JSON and a markdown table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from absl import logging

from cbert_jax.data.tasks import tfds as task_tfds
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import features as features_lib
from cbert_jax.evaluators import pooler as pooler_lib
from cbert_jax.evaluators import probes, retrieval
from cbert_jax.evaluators.features import layer_of  # also read as suite.layer_of (glue, mteb)

POOLER_MODES = ("frozen", "unfrozen")
# Every probe `evals.probes` may name, in table order.
PROBE_NAMES = ("ridge", "logreg", "knn")


def _cap(split: dict, n: int, seed: int) -> dict:
  """At most n examples of a split, a fixed random subset (documented in the results)."""
  size = len(next(iter(split.values())))
  if size <= n:
    return split
  keep = np.sort(np.random.RandomState(seed).permutation(size)[:n])
  return {
    k: [v[i] for i in keep] if isinstance(v, list) else np.asarray(v)[keep]
    for k, v in split.items()
  }


def eval_splits(task) -> list[str]:
  """The splits a probe task is scored on: every split but train, in the task's order."""
  return [name for name in task.splits if name != "train"]


def probe_entry(res: probes.ProbeResult) -> dict:
  """A probe's JSON entry in the results (see `probe_task`)."""
  sel = res.selection
  entry = {
    **{name: float(v) for name, v in res.scores.items()},
    res.param: float(sel.value),
    "heldout": float(sel.scores[sel.value]),
    "curve": [[float(v), float(s)] for v, s in sel.scores.items()],
    "edge": sel.edge,
  }
  if res.probe == "logreg":
    entry.update(
      converged=bool(res.fit["converged"]),
      n_iter=int(res.fit["n_iter"]),
      max_iter=int(res.fit["max_iter"]),
      unconverged=[float(c) for c in sel.unconverged],
    )
  return entry


def probe_task(task, featurizer, tokenizer, seq_len: int, ecfg) -> dict:
  """The `evals.probes` probes (and layer-wise ridge) of one classification, regression or pair
  task.

  Rows with "texts_a"/"texts_b" are pairs (SentEval features), whatever the target kind, so
  GLUE's STS-B (pair regression) goes through the same code as the offline pair task. Returns
  {"kind", "metric", "headline_split", "sizes", probe: entry, ["extra": {probe: {split: {metric:
  value}}}], ["layerwise": rows]}, where a probe's entry is
  {<split>: score, ..., <param> ("lambda" | "C" | "k"): chosen value, "heldout": its held-out
  score, "curve": [[value, held-out score], ...] in sweep order, "edge": "low" | "high" when the
  chosen value is the grid's smallest / largest, else None}; logreg's entry adds "converged" and
  "n_iter" / "max_iter" (the final fit on all of train) and "unconverged" (the C whose held-out
  fit did not converge). Regression tasks have no "logreg" entry (no class labels).
  """
  enc = lambda texts: features_lib.encode_texts(list(texts), tokenizer, seq_len)
  splits = {
    name: _cap(task.splits[name], ecfg.max_train if name == "train" else ecfg.max_eval, i)
    for i, name in enumerate(["train"] + eval_splits(task))
  }
  feats, labels = {}, {}
  for name, split in splits.items():
    if "texts_a" in split:
      feats[name] = featurizer.pair(enc(split["texts_a"]), enc(split["texts_b"]))
    else:
      feats[name] = featurizer(enc(split["texts"]))
    labels[name] = np.asarray(split["labels"])
  kind = "regression" if task.kind == "regression" else "classification"
  headline_split = getattr(task, "headline_split", "test")
  also = tuple(getattr(task, "extra_metrics", ()))
  out = {
    "kind": task.kind,
    "metric": task.metric,
    "headline_split": headline_split,
    "sizes": {k: int(len(v)) for k, v in labels.items()},
  }
  layered = np.ndim(feats["train"]) == 3  # [L + 1, N, d]
  last = (lambda x: x[-1]) if layered else (lambda x: x)
  evals = {name: (last(feats[name]), labels[name]) for name in splits if name != "train"}
  for probe in probe_names(ecfg):
    if probe == "logreg" and kind == "regression":
      continue  # logistic regression needs class labels
    fn = probes.PROBES[probe]
    res = fn(last(feats["train"]), labels["train"], evals, kind=kind, metric=task.metric, also=also)
    out[probe] = probe_entry(res)
    if probe == "logreg" and (not res.fit["converged"] or res.selection.unconverged):
      logging.warning(
        "%s: logistic regression did not converge (at most %d iterations): final fit converged: "
        "%s; held-out fits that did not: C in %s",
        task.name,
        res.fit["max_iter"],
        res.fit["converged"],
        list(res.selection.unconverged),
      )
    if res.extra:
      out.setdefault("extra", {})[probe] = res.extra
  if layered:
    rows = probes.layerwise(
      feats["train"],
      labels["train"],
      {n: (feats[n], labels[n]) for n in evals},
      kind=kind,
      metric=task.metric,
      probe="ridge",
    )
    out["layerwise"] = [
      {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in r.items()}
      for r in rows
    ]
  return out


def probe_names(ecfg) -> list[str]:
  """The probes of `evals.probes`, in the given order; ConfigError naming the field."""
  names = [p.strip() for p in ecfg.probes.split(",") if p.strip()]
  for probe in names:
    if probe not in PROBE_NAMES:
      raise ConfigError(
        f"evals.probes: unknown probe {probe!r}; expected a comma list of {', '.join(PROBE_NAMES)}"
      )
  return names


def pooler_modes(ecfg) -> list[str]:
  """The pooler variants of `evals.pooler` ([] for "none"); ConfigError naming the field.

  Read with `ecfg.get` so configs without the field (older ones) mean "none".
  """
  value = str(ecfg.get("pooler", "none")).strip()
  if value in ("", "none"):
    return []
  modes = [m.strip() for m in value.split(",") if m.strip()]
  for mode in modes:
    if mode not in POOLER_MODES:
      raise ConfigError(
        f"evals.pooler: unknown mode {mode!r}; expected none, frozen, unfrozen or frozen,unfrozen"
      )
  return list(dict.fromkeys(modes))  # de-duplicated, ordered


def dev_pairs(task, ecfg) -> tuple[list[str], list[str]]:
  """(query texts, document texts): one pair per (dev query, relevant document in the corpus).

  Dev queries are the pooler's *training* data here, so they are capped by `max_train` (not
  `max_eval`); a query with k relevant documents gives k pairs.
  """
  queries = _cap(task.queries["dev"], ecfg.max_train, 20)
  doc_text = dict(zip(task.corpus["ids"], task.corpus["texts"]))
  qa, db = [], []
  for qid, qtext in zip(queries["ids"], queries["texts"]):
    for did, rel in task.qrels["dev"].get(qid, {}).items():
      if rel > 0 and did in doc_text:  # relevant, and embeddable
        qa.append(qtext)
        db.append(doc_text[did])
  return qa, db


def _pooled_retrieval(
  task, graphdef, params, tokenizer, ecfg, mode: str, doc_rows: dict, test_queries: dict
) -> dict:
  """Train the pooler on dev pairs (mode frozen|unfrozen), then retrieval metrics on test only.

  Returns {"test": metrics, "train_pairs", "steps", "loss": [first, last] InfoNCE loss, "seconds"}.
  The training batch is `evals.batch_size` (capped at the number of pairs by `train_pooler`), so
  it also sets the number of in-batch negatives.
  """
  start = time.perf_counter()
  enc = lambda texts: features_lib.encode_texts(list(texts), tokenizer, ecfg.seq_len)
  qa, db = dev_pairs(task, ecfg)
  if len(qa) < 2:  # in-batch negatives need at least two pairs; name the task, not just the count
    raise ValueError(
      f"{task.name}: the pooler needs >= 2 dev (query, relevant document) pairs, got {len(qa)}"
    )
  layer = layer_of(ecfg)
  pooler_params, backbone, history = pooler_lib.train_pooler(
    graphdef,
    params,
    enc(qa),
    enc(db),
    frozen=(mode == "frozen"),
    steps=int(ecfg.get("pooler_steps", 200)),
    batch_size=ecfg.batch_size,
    lr_pooler=float(ecfg.get("pooler_lr", 1e-3)),
    lr_backbone=float(ecfg.get("pooler_backbone_lr", 2e-5)),
    temperature=float(ecfg.get("pooler_temperature", 0.05)),
    seed=0,
    layer=layer,
    init=ecfg.get("pooler_init", "fresh"),
  )
  # Unfrozen: `backbone` is the trained copy (train_pooler is functional, `params` is unchanged);
  # queries and corpus must both be embedded with it, as a deployed unfrozen model would.
  doc_emb = pooler_lib.embed(graphdef, backbone, pooler_params, doc_rows, ecfg.batch_size, layer)
  q_emb = pooler_lib.embed(
    graphdef, backbone, pooler_params, enc(test_queries["texts"]), ecfg.batch_size, layer
  )
  scores = retrieval.evaluate(
    q_emb,
    doc_emb,
    list(test_queries["ids"]),
    list(task.corpus["ids"]),
    task.qrels["test"],
    ks=(1, 10, 100),
  )
  return {
    "test": {k: float(v) for k, v in scores.items()},
    "train_pairs": len(qa),
    "steps": len(history),
    "loss": [history[0]["loss"], history[-1]["loss"]] if history else [],
    "seconds": round(time.perf_counter() - start, 1),
  }


def _retrieval_task(
  task, featurizer, tokenizer, seq_len: int, ecfg, graphdef=None, params=None
) -> dict:
  """Mean-pooled retrieval on dev and test; plus, per `evals.pooler` mode, pooled test retrieval.

  graphdef/params (the backbone) are needed only when `evals.pooler` is not "none".
  """
  enc = lambda texts: features_lib.encode_texts(list(texts), tokenizer, seq_len)
  last = lambda x: x[-1] if np.ndim(x) == 3 else x
  doc_rows = enc(task.corpus["texts"])  # shared with the pooler
  doc_emb = last(featurizer(doc_rows))  # [D, d]
  out = {"kind": "retrieval", "metric": task.metric, "sizes": {"corpus": len(task.corpus["ids"])}}
  capped = {}
  for i, split in enumerate(("dev", "test")):
    queries = capped[split] = _cap(task.queries[split], ecfg.max_eval, 10 + i)
    q_emb = last(featurizer(enc(queries["texts"])))  # [Q, d]
    scores = retrieval.evaluate(
      q_emb,
      doc_emb,
      list(queries["ids"]),
      list(task.corpus["ids"]),
      task.qrels[split],
      ks=(1, 10, 100),
    )
    out[split] = {k: float(v) for k, v in scores.items()}
    out["sizes"][f"queries_{split}"] = len(queries["ids"])
  for mode in pooler_modes(ecfg):
    # The same capped test queries as the mean-pooled numbers, so the two are comparable.
    out[f"pooler_{mode}"] = _pooled_retrieval(
      task, graphdef, params, tokenizer, ecfg, mode, doc_rows, capped["test"]
    )
  return out


def check_model(ecfg, model_name: str, num_layers: int) -> None:
  """Checks of `evals` that need the model: the layer exists; the pooler warm start has a
  predictor to start from. ConfigError naming the field."""
  layer = layer_of(ecfg)
  if not -1 <= layer <= num_layers:
    raise ConfigError(
      f"evals.layer: expected -1 (final) or 0..{num_layers} (model.num_layers), got {layer}"
    )
  init = ecfg.get("pooler_init", "fresh")
  if init not in pooler_lib.INITS:
    raise ConfigError(f"evals.pooler_init: expected one of {pooler_lib.INITS}, got {init!r}")
  if init == "predictor" and model_name != "crossbert" and pooler_modes(ecfg):
    raise ConfigError(
      f"evals.pooler_init=predictor warm-starts from CrossBERT's predictor; "
      f"model_name is {model_name!r} (use evals.pooler_init=fresh)"
    )


def task_names(ecfg) -> list[str]:
  """The tasks of `evals.tasks`, checked against the task kit (ConfigError naming the field)."""
  names = [t.strip() for t in ecfg.tasks.split(",") if t.strip()]
  known = task_tfds.list_tasks()
  for name in names:
    if name not in known:
      raise ConfigError(f"evals.tasks: unknown task {name!r}; known: {', '.join(known)}")
  probe_names(ecfg)
  if ecfg.layers not in ("final", "all"):
    raise ConfigError(f"evals.layers must be final|all, got {ecfg.layers!r}")
  pooler_modes(ecfg)  # fail before any model is loaded
  return names


SKIPPED_SOURCE = "skipped (source unavailable)"
SKIPPED_UNCHECKED = "refused (the training corpus was not checked against this task)"


def unchecked_tasks(data_manifest: Mapping | None) -> dict[str, str]:
  """{task: why} of the probe tasks a run's training corpus was *not* checked against: the
  offline corpus's leakage guard left them out because their source could not be had
  (`leakage.tasks_skipped` of the data manifest). Empty for every other corpus."""
  leakage = (data_manifest or {}).get("leakage") or {}
  return dict(leakage.get("tasks_skipped") or {})


def not_scored(result: dict) -> str | None:
  """Why a task's entry has no scores ("skipped ...", "refused ...", "failed: ..."), or None."""
  return result.get("skipped") or result.get("failed")


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
  unchecked: Mapping[str, str] | None = None,
  done: Mapping[str, dict] | None = None,
  on_task: Callable[[dict], None] | None = None,
) -> dict:
  """The probe suite over `ecfg.tasks` (config.evals) for one set of parameters.

  `params` is only read: with `evals.pooler` set, the pooler trains on copies (module docstring).

  Each task ends in one of four ways, and the suite always goes on to the next task:
    * scored: the entries described above;
    * `{"skipped": SKIPPED_SOURCE, "detail", "manual_fix"}`: its source archive cannot be had
      (one WARNING line names it and the manual fix);
    * `{"skipped": SKIPPED_UNCHECKED, "detail"}`: the task is in `unchecked` ({task: why}: the
      training corpus's leakage guard did not check the corpus against it, so its texts may have
      been trained on); never scored;
    * `{"failed": "<error>"}`: scoring raised (logged with its traceback).
  Not-scored tasks are left out of the averages (the markdown table says which).

  Args:
    unchecked: tasks to refuse (see above).
    done: results of tasks already scored for these parameters (a rerun of an interrupted or
      partly failed evaluation); they are reused, not recomputed. Skipped and failed entries are
      tried again.
    on_task: called with the results so far after each task (the caller saves them).
  """
  from cbert_jax.data import fetch  # pylint: disable=import-outside-toplevel

  names = list(tasks) if tasks is not None else task_names(ecfg)
  featurizer = features_lib.featurizer_from_evals(graphdef, params, ecfg, mesh=mesh, rules=rules)
  unchecked, done = unchecked or {}, done or {}
  results: dict = {}
  for name in names:
    start = time.perf_counter()
    spec = task_tfds.kit.get_spec(name) if name in task_tfds.kit.TASKS else None
    head = {"kind": spec.kind, "metric": spec.metric} if spec else {}
    if name in done and not not_scored(done[name]):
      results[name] = done[name]
      logging.info("eval %s: scored by an earlier run of this evaluation; reused", name)
      continue
    if name in unchecked:
      results[name] = {**head, "skipped": SKIPPED_UNCHECKED, "detail": unchecked[name]}
      logging.warning(
        "eval %s: %s: its source was unavailable when the corpus was built (%s)",
        name,
        SKIPPED_UNCHECKED,
        unchecked[name],
      )
    else:
      try:
        task = task_tfds.load_task(name, cache_dir=cache_dir)
      except fetch.SourceUnavailable as e:
        results[name] = {
          **head,
          "skipped": SKIPPED_SOURCE,
          "detail": str(e),
          "manual_fix": e.manual_fix,
        }
        logging.warning("%s", e.task_skipped(name))
      except Exception as e:  # a broken build of this task must not cost the others
        results[name] = {**head, "failed": f"{type(e).__name__}: {e}"}
        logging.exception("eval %s: building the task failed; going on with the others", name)
      else:
        try:
          if task.kind == "retrieval":
            results[name] = _retrieval_task(
              task, featurizer, tokenizer, ecfg.seq_len, ecfg, graphdef, params
            )
          else:
            results[name] = probe_task(task, featurizer, tokenizer, ecfg.seq_len, ecfg)
          results[name]["seconds"] = round(time.perf_counter() - start, 1)
          logging.info(
            "eval %s: %s", name, {k: v for k, v in results[name].items() if k != "layerwise"}
          )
        except Exception as e:  # noqa: BLE001 (reported in the results, with the traceback logged)
          head = {"kind": task.kind, "metric": task.metric}
          results[name] = {**head, "failed": f"{type(e).__name__}: {e}"}
          logging.exception("eval %s: scoring failed; going on with the other tasks", name)
    if on_task is not None:
      on_task(dict(results))
  results["average"] = average(results)
  return results


def headline(task_result: dict) -> float:
  """The task's one number on its headline split (test, GLUE: validation): ridge metric (probe
  tasks) or the metric (retrieval)."""
  if task_result["kind"] == "retrieval":
    return task_result["test"][task_result["metric"]]
  split = task_result.get("headline_split", "test")
  return task_result["ridge"][split] if "ridge" in task_result else task_result["knn"][split]


def average(results: dict) -> dict:
  """Mean test score per probe over probe tasks, and the mean headline over all tasks.

  Each probe's mean is over the tasks it ran on: "logreg" has no regression tasks, so its mean is
  over fewer tasks than ridge's and kNN's (compare them per task, not by these means).

  With the pooler on, also `retrieval_pooler_<mode>`: the mean test metric of the pooled retrieval
  (kept out of "all", whose meaning must not depend on `evals.pooler`).
  """
  tasks = {k: v for k, v in results.items() if k != "average" and not not_scored(v)}
  out = {}
  for probe in PROBE_NAMES:
    vals = [v[probe][v.get("headline_split", "test")] for v in tasks.values() if probe in v]
    if vals:
      out[probe] = float(np.mean(vals))
  retr = [headline(v) for v in tasks.values() if v["kind"] == "retrieval"]
  if retr:
    out["retrieval"] = float(np.mean(retr))
  for mode in POOLER_MODES:
    vals = [
      v[f"pooler_{mode}"]["test"][v["metric"]] for v in tasks.values() if f"pooler_{mode}" in v
    ]
    if vals:
      out[f"retrieval_pooler_{mode}"] = float(np.mean(vals))
  out["all"] = float(np.mean([headline(v) for v in tasks.values()])) if tasks else float("nan")
  return out


def markdown(results: dict, title: str = "") -> str:
  """One row per task: metric, ridge dev/test, logreg dev/test, kNN dev/test (retrieval: its
  metric in the ridge columns).

  With pooled retrieval results, a second table follows: test only, the pooler trained on dev.
  """
  lines = [f"### {title}", ""] if title else []
  lines += [
    "| task | kind | metric | ridge dev | ridge test | logreg dev | logreg test | kNN dev "
    "| kNN test |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  fmt = lambda x: f"{x:.4f}" if isinstance(x, float) else "-"
  for name, r in results.items():
    if name == "average":
      continue
    if not_scored(r):
      why = r.get("skipped") or f"failed ({r['failed']})"
      lines.append(f"| {name} | {r.get('kind', '-')} | {r.get('metric', '-')} | {why} |||||| ")
      continue
    if r["kind"] == "retrieval":
      key = r["metric"]  # e.g. ndcg@10
      lines.append(
        f"| {name} | retrieval | {r['metric']} | {fmt(r['dev'][key])} | {fmt(r['test'][key])} "
        "| - | - | - | - |"
      )
    else:
      g = lambda p, s, r=r: r[p][s] if p in r else None
      lines.append(
        f"| {name} | {r['kind']} | {r['metric']} | {fmt(g('ridge', 'dev'))} | "
        f"{fmt(g('ridge', 'test'))} | {fmt(g('logreg', 'dev'))} | {fmt(g('logreg', 'test'))} | "
        f"{fmt(g('knn', 'dev'))} | {fmt(g('knn', 'test'))} |"
      )
  pooled = [
    (name, r)
    for name, r in results.items()
    if name != "average" and any(f"pooler_{m}" in r for m in POOLER_MODES)
  ]
  if pooled:
    # Only the test split: the pooler trained on the dev (query, relevant document) pairs.
    lines += [
      "",
      "pooled retrieval (contrastive pooler trained on dev pairs; test only):",
      "",
      "| task | metric | mean-pool test | pooler frozen test | pooler unfrozen test |",
      "|---|---|---|---|---|",
    ]
    for name, r in pooled:
      key = r["metric"]
      g = lambda m, r=r, key=key: r[f"pooler_{m}"]["test"][key] if f"pooler_{m}" in r else None
      lines.append(
        f"| {name} | {key} | {fmt(r['test'][key])} | {fmt(g('frozen'))} | {fmt(g('unfrozen'))} |"
      )
  return "\n".join(lines + markdown_footer(results, "test"))


def selection_notes(results: dict) -> list[str]:
  """One line per probe result whose chosen value is on its grid's edge or whose logistic
  regression did not converge (both are also in the JSON: "edge", "converged", "unconverged")."""
  notes = []
  for name, r in results.items():
    if name == "average" or not isinstance(r, dict):
      continue
    for probe in PROBE_NAMES:
      e = r.get(probe)
      if not isinstance(e, dict):
        continue
      param = {"ridge": "lambda", "logreg": "C", "knn": "k"}[probe]
      if e.get("edge"):
        notes.append(
          f"{name} {probe}: {param} = {e[param]:.4g} is the {e['edge']} edge of its grid"
        )
      if e.get("converged") is False:
        notes.append(
          f"{name} {probe}: the final fit did not converge ({e['n_iter']} of at most "
          f"{e['max_iter']} iterations)"
        )
      if e.get("unconverged"):
        cs = ", ".join(f"{c:.4g}" for c in e["unconverged"])
        notes.append(f"{name} {probe}: held-out fits that did not converge: C = {cs}")
  return notes


def markdown_footer(results: dict, split_label: str) -> list[str]:
  """The lines every suite's table ends with: the averages, notes on the probes' selection
  (grid edges, unconverged fits), then each layer-wise ridge table."""
  avg = results.get("average", {})
  lines = ["", f"average ({split_label}): " + ", ".join(f"{k} {v:.4f}" for k, v in avg.items())]
  entries = {k: r for k, r in results.items() if k != "average" and isinstance(r, dict)}
  missing = [k for k, r in entries.items() if not_scored(r)]
  if missing:
    lines.append(
      f"(over the {len(entries) - len(missing)} scored tasks of {len(entries)}; not scored: "
      f"{', '.join(missing)}; averages over other task sets are not comparable)"
    )
  probed = [
    r for k, r in results.items() if k != "average" and isinstance(r, dict) and not not_scored(r)
  ]
  if "logreg" in avg and any("ridge" in r and "logreg" not in r for r in probed):
    lines.append("(logreg: classification and pair tasks only; its mean covers fewer tasks)")
  notes = selection_notes(results)
  if notes:
    lines += ["", "selection notes:", ""] + [f"* {n}" for n in notes]
  for name, r in results.items():
    if name != "average" and "layerwise" in r:
      lines += ["", f"layer-wise ridge, {name}:", "", probes.markdown_table(r["layerwise"])]
  return lines
