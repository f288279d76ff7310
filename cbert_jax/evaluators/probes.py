"""The probes' front: the registry `PROBES`, the layer-wise table, and every probe name re-exported.

The probes of frozen features (SPEC §6) live one per module, over a shared base:
  probe_base  metrics (`score`, `METRICS`), `Selection`, `ProbeResult`, the held-out split and the
              protocol every probe follows (select on held-out train, refit, score);
  ridge       the ridge probe (λ; one eigendecomposition for the whole sweep);
  logreg      the logistic-regression probe (C; class labels only);
  knn         the cosine kNN probe (k) and its deterministic tie rule.
This module adds `PROBES` (name -> probe function), `layerwise` (one probe on every layer's
features) and `markdown_table`, and re-exports the names callers use (`probes.ridge_probe`,
`probes.score`, ...), so they need not know which module holds what.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.evaluators.knn import DEFAULT_KS, _knn_predict, knn_probe, nearest, select_knn_k
from cbert_jax.evaluators.logreg import (
  DEFAULT_CS,
  LOGREG_MAX_ITER,
  fit_logreg,
  logreg_probe,
  select_logreg_c,
)
from cbert_jax.evaluators.probe_base import (
  KINDS,
  METRICS,
  ProbeResult,
  Selection,
  holdout_split,
  score,
)
from cbert_jax.evaluators.ridge import (
  DEFAULT_LAMBDAS,
  _RidgePath,
  fit_ridge,
  ridge_probe,
  select_ridge_lambda,
)

__all__ = [
  "DEFAULT_CS",
  "DEFAULT_KS",
  "DEFAULT_LAMBDAS",
  "KINDS",
  "LOGREG_MAX_ITER",
  "METRICS",
  "PROBES",
  "ProbeResult",
  "Selection",
  "_RidgePath",
  "_knn_predict",
  "fit_logreg",
  "fit_ridge",
  "holdout_split",
  "knn_probe",
  "layerwise",
  "logreg_probe",
  "markdown_table",
  "nearest",
  "ridge_probe",
  "score",
  "select_knn_k",
  "select_logreg_c",
  "select_ridge_lambda",
]


# ------------------------------------------------------------------------------- layer-wise ---
PROBES = {"ridge": ridge_probe, "logreg": logreg_probe, "knn": knn_probe}


def layerwise(
  train_x: np.ndarray,
  train_y: np.ndarray,
  eval_sets: Mapping[str, tuple],
  *,
  kind: str,
  metric: str,
  probe: str = "ridge",
  **probe_kw,
) -> list[dict]:
  """The same probe on every layer's features.

  Args:
    train_x: [L + 1, N, d] (Featurizer with layers="all"); train_y: [N].
    eval_sets: name -> (x [L + 1, M, d], y [M]).
    kind, metric, probe_kw: as the probe's function. probe: a key of PROBES ("logreg" needs
      class labels).

  Returns:
    One row per layer: {"layer", <param> (chosen λ, C or k), "heldout" (its held-out score),
    <eval name>: score, ...}; layer 0 is the embeddings.
  """
  if probe not in PROBES:
    raise ConfigError(f"probe: expected one of {sorted(PROBES)}, got {probe!r}.")
  train_x = np.asarray(train_x)
  if train_x.ndim != 3:
    raise ConfigError(f"train_x: expected [L + 1, N, d] per-layer features, got {train_x.shape}.")
  for name, (x, _) in eval_sets.items():
    if np.ndim(x) != 3 or np.shape(x)[0] != train_x.shape[0]:
      raise ConfigError(
        f"eval_sets[{name!r}]: expected [{train_x.shape[0]}, M, d], got {np.shape(x)}."
      )
  rows = []
  for layer in range(train_x.shape[0]):
    res = PROBES[probe](
      train_x[layer],
      train_y,
      {n: (x[layer], y) for n, (x, y) in eval_sets.items()},
      kind=kind,
      metric=metric,
      **probe_kw,
    )
    rows.append(
      {
        "layer": layer,
        res.param: res.selection.value,
        "heldout": res.selection.scores[res.selection.value],
        **res.scores,
      }
    )
  return rows


def markdown_table(
  rows: Sequence[Mapping], columns: Sequence[str] | None = None, floatfmt: str = ".4g"
) -> str:
  """A GitHub markdown table of dict rows (columns default to the first row's keys)."""
  if not rows:
    return ""
  columns = list(columns or rows[0].keys())
  fmt = lambda v: format(v, floatfmt) if isinstance(v, (float, np.floating)) else str(v)
  lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
  lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines)
