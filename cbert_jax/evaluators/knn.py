"""The cosine kNN probe of frozen features: k by the shared protocol (`probe_base`), and its tie rule.

Features are L2-normalised (cosine similarity), not standardised. Classification: majority vote;
regression: mean of the neighbours' targets.

kNN tie rule (deterministic, independent of how numpy partitions or sorts): neighbours are ranked
by cosine similarity, higher first, and equal similarities by training-example index, lower
first; so among the k nearest, a tie at the k-th similarity keeps the lower-indexed training
examples. Identical (L2-normalised) training rows get bit-identical similarities by construction
(each distinct row's similarity is computed once). The vote: most neighbours wins; a tie in
votes goes to the larger summed similarity of the tied classes' neighbours, then to the lower
class id (classes sorted as `np.unique` sorts them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.evaluators.probe_base import (
  ProbeResult,
  Selection,
  _check,
  select_on_heldout,
  select_then_probe,
)

DEFAULT_KS = (1, 3, 5, 10, 20, 50)
# kNN similarities are computed for this many queries at a time: [chunk, N_train] floats, never
# an [N, N] matrix.
_KNN_CHUNK = 1024


def _normalize(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit L2 norm (zero rows stay zero), float32."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _top_k(sim: np.ndarray, k: int) -> np.ndarray:
  """Indices [c, k] of each row's k largest entries, ordered by (value descending, index
  ascending): the module's tie rule, whatever numpy's partition and sort do internally.

  Only the *value* of each row's k-th largest entry is taken from `np.partition` (it is the same
  for any correct selection algorithm); which entries are kept is then decided by value and index
  alone: all entries above it, and the lowest-indexed entries equal to it, k in all.
  """
  kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1 : k]  # [c, 1] the k-th largest value
  above = sim > kth  # fewer than k per row
  at = sim == kth  # at least one per row
  need = k - above.sum(1, keepdims=True)  # [c, 1], >= 1
  keep = above | (at & (np.cumsum(at, axis=1, dtype=np.int64) <= need))  # exactly k per row
  idx = np.nonzero(keep)[1].reshape(sim.shape[0], k)  # row-major: ascending index in each row
  order = np.argsort(-np.take_along_axis(sim, idx, axis=1), axis=1, kind="stable")
  return np.take_along_axis(idx, order, axis=1)  # stable: equal values stay in index order


def nearest(train_x: np.ndarray, query_x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k most cosine-similar train rows of each query: similarity descending, ties by lower
  train index (the module's tie rule).

  Similarities are float32 dot products of L2-normalised rows, computed once per *distinct*
  normalised train row, so duplicated training examples tie exactly; a NaN similarity (a NaN
  feature) ranks below every number. Computed in chunks of queries ([chunk, N_train]
  similarities at a time), never [N, N].

  Returns:
    (idx [M, k] int, sim [M, k] float32).
  """
  tr, q = _normalize(train_x), _normalize(query_x)  # [N, d], [M, d]
  uniq, inverse = np.unique(tr, axis=0, return_inverse=True)  # [U, d], [N]
  inverse = np.reshape(inverse, -1)
  k = min(int(k), tr.shape[0])
  idx_out, sim_out = [], []
  for start in range(0, q.shape[0], _KNN_CHUNK):
    sim = (q[start : start + _KNN_CHUNK] @ uniq.T)[:, inverse]  # [c, N]
    sim = np.where(np.isnan(sim), -np.inf, sim)
    top = _top_k(sim, k)  # [c, k]
    idx_out.append(top)
    sim_out.append(np.take_along_axis(sim, top, axis=1))
  return np.concatenate(idx_out), np.concatenate(sim_out)


def _knn_predict(
  idx: np.ndarray,
  sim: np.ndarray,
  train_y: np.ndarray,
  k: int,
  kind: str,
  classes: np.ndarray | None = None,
) -> np.ndarray:
  """Predictions [M] from the first k of precomputed neighbours (idx, sim [M, >=k], in
  `nearest`'s order).

  Regression: the plain mean of the neighbours' targets. Classification: a plain majority vote;
  ties between classes go to the larger summed similarity, then the smaller class id. The sums
  are accumulated neighbour by neighbour in `nearest`'s order, so two classes whose neighbours
  have the same similarities get bit-identical sums (a true tie, resolved by class id).
  """
  idx, sim = idx[:, :k], sim[:, :k].astype(np.float64)  # [M, k]
  ny = train_y[idx]  # [M, k]
  if kind == "regression":
    return ny.astype(np.float64).mean(1)
  classes = np.unique(train_y) if classes is None else classes
  onehot = ny[:, :, None] == classes[None, None, :]  # [M, k, C]
  counts = onehot.sum(1)  # [M, C]
  sums = np.zeros(counts.shape)  # [M, C]
  for j in range(k):  # sequential on purpose (see the docstring)
    sums += np.where(onehot[:, j], sim[:, j, None], 0.0)
  best = counts == counts.max(1, keepdims=True)  # most votes
  tied_sums = np.where(best, sums, -np.inf)
  best &= tied_sums == tied_sums.max(1, keepdims=True)  # then the largest summed similarity
  return classes[np.argmax(best, axis=1)]  # then the first (smallest) class id


def select_knn_k(
  train_x: np.ndarray,
  train_y: np.ndarray,
  *,
  kind: str,
  metric: str,
  ks: Sequence[int] = DEFAULT_KS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
) -> Selection:
  """Chooses k on a held-out part of train (neighbours from the fit part). Training arrays only.

  Neighbours are found once for the largest k; smaller k reuse the prefix. k larger than the
  fit part is clipped to it.
  """
  x, y = _check(train_x, train_y, kind, metric, "train")
  ks = [int(k) for k in ks]
  if not ks or min(ks) < 1:
    raise ConfigError(f"ks: need at least one value, all >= 1, got {ks}.")

  def predict_heldout(fit, held):
    idx, sim = nearest(x[fit], x[held], max(ks))
    classes = None if kind == "regression" else np.unique(y[fit])
    return [_knn_predict(idx, sim, y[fit], min(k, len(fit)), kind, classes) for k in ks], ()

  return select_on_heldout(
    y, ks, predict_heldout, metric=metric, holdout_fraction=holdout_fraction, seed=seed
  )


def knn_probe(
  train_x: np.ndarray,
  train_y: np.ndarray,
  eval_sets: Mapping[str, tuple],
  *,
  kind: str,
  metric: str,
  ks: Sequence[int] = DEFAULT_KS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
  also: Sequence[str] = (),
) -> ProbeResult:
  """Cosine kNN probe: k chosen on held-out train; eval sets' neighbours come from all of train.

  Features are L2-normalised (cosine similarity), not standardised. Classification: majority
  vote; regression: mean of the neighbours' targets. Ties follow the module's rule (similarity
  ties by lower train index; vote ties by summed similarity, then lower class id). Arguments as
  `ridge_probe`, with `ks` the k sweep.
  """

  def refit(value):
    x, y = np.asarray(train_x), np.asarray(train_y)
    k = min(int(value), len(y))
    classes = None if kind == "regression" else np.unique(y)

    def predict(q):
      idx, sim = nearest(x, q, k)
      return _knn_predict(idx, sim, y, k, kind, classes)

    return predict, {}

  return select_then_probe(
    "knn",
    "k",
    lambda: select_knn_k(
      train_x,
      train_y,
      kind=kind,
      metric=metric,
      ks=ks,
      holdout_fraction=holdout_fraction,
      seed=seed,
    ),
    refit,
    train_x,
    eval_sets,
    kind=kind,
    metric=metric,
    also=also,
  )
