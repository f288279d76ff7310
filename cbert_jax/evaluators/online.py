"""Online probing: the suite's results as flat metric names for metrics.jsonl / TensorBoard.

`config.evals.every = N` runs the probe suite on the live parameters every N training steps; these
lines give the paper's figure of frozen probe quality over training next to the loss.
"""


def flatten(results: dict) -> dict[str, float]:
  """{task: {...}, "average": {...}} -> {"probe/<task>/<probe>": test score, "probe/avg/<k>": ...}.

  Probe tasks give their ridge, logreg and kNN test scores (those that ran); retrieval tasks their
  metric (e.g. ndcg@10) with mean-pooled features, and with the contrastive pooler where it ran.
  """
  out = {}
  for task, r in results.items():
    if task == "average":
      out.update({f"probe/avg/{k}": float(v) for k, v in r.items()})
    elif r.get("skipped") or r.get("failed"):
      continue  # not scored (suite.not_scored): no metric, the suite's log line says why
    elif r["kind"] == "retrieval":
      out[f"probe/{task}/{r['metric']}"] = float(r["test"][r["metric"]])
      for key in ("pooler_frozen", "pooler_unfrozen"):
        if key in r:
          out[f"probe/{task}/{key}_{r['metric']}"] = float(r[key]["test"][r["metric"]])
    else:
      for probe in ("ridge", "logreg", "knn"):
        if probe in r:
          out[f"probe/{task}/{probe}"] = float(r[probe]["test"])
  return out
