"""The ridge probe of frozen features: λ by the shared protocol (`probe_base`), one eigendecomposition.

Classification and pair tasks: one-vs-rest ridge regression on ±1 targets, argmax; regression:
ridge on the standardised target. Features are standardised with train statistics. Every λ of the
sweep comes from one eigendecomposition (`_RidgePath`), as in big_vision's fewshot evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.evaluators.probe_base import (
  ProbeResult,
  Selection,
  _check,
  _Standardizer,
  select_on_heldout,
  select_then_probe,
)

DEFAULT_LAMBDAS = np.logspace(-3, 4, 15)


class _RidgePath:
  """Ridge regression with intercept for many λ from ONE eigendecomposition.

  With X centred (Xc) and targets centred (Yc), W(λ) = (Xc^T Xc + λ I)^-1 Xc^T Yc. We
  eigendecompose the smaller of the covariance Xc^T Xc = V S V^T ([d, d]) or the Gram
  Xc Xc^T = U S U^T ([n, n]) once (as big_vision's fewshot evaluator does); every λ is then
  a diagonal rescale: W(λ) = V diag(1 / (s + λ)) V^T Xc^T Yc, or in the dual
  W(λ) = Xc^T U diag(1 / (s + λ)) U^T Yc. Same objective as sklearn's Ridge(alpha=λ).
  """

  def __init__(self, x: np.ndarray, y: np.ndarray):
    x = np.asarray(x, np.float64)  # [n, d]
    y = np.asarray(y, np.float64)  # [n, c]
    self.x_mean, self.y_mean = x.mean(0), y.mean(0)  # [d], [c]
    xc, yc = x - self.x_mean, y - self.y_mean
    n, d = xc.shape
    self.primal = d <= n
    if self.primal:
      s, v = np.linalg.eigh(xc.T @ xc)  # [d], [d, d]
      self.basis = v  # [d, k]
      self.coef_in = v.T @ (xc.T @ yc)  # [d, c]
    else:
      s, u = np.linalg.eigh(xc @ xc.T)  # [n], [n, n]
      self.basis = xc.T @ u  # [d, n]
      self.coef_in = u.T @ yc  # [n, c]
    # Round-off can make zero eigenvalues slightly negative; they are 0 by construction.
    self.s = np.maximum(s, 0.0)

  def weights(self, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(W [d, c], b [c]) for one λ: predictions are x @ W + b."""
    w = self.basis @ (self.coef_in / (self.s + lam)[:, None])  # [d, c]
    return w, self.y_mean - self.x_mean @ w

  def predict_path(self, x: np.ndarray, lambdas: Sequence[float]) -> list[np.ndarray]:
    """Predictions [m, c] on x for each λ; the projection of x onto the basis is done once."""
    z = (np.asarray(x, np.float64) - self.x_mean) @ self.basis  # [m, k]
    return [z @ (self.coef_in / (self.s + lam)[:, None]) + self.y_mean for lam in lambdas]


class _RidgeTask:
  """Targets for ridge and the map from ridge outputs back to predictions."""

  def __init__(self, y: np.ndarray, kind: str):
    self.kind = kind
    if kind == "regression":
      y = y.astype(np.float64)
      self.mean, self.std = y.mean(), (y.std() if y.std() > 0 else 1.0)
    else:
      self.classes = np.unique(y)

  def targets(self, y: np.ndarray) -> np.ndarray:
    """[n, c]: the standardised target (c = 1), or one-vs-rest ±1 columns (c = classes)."""
    if self.kind == "regression":
      return ((y.astype(np.float64) - self.mean) / self.std)[:, None]
    return np.where(y[:, None] == self.classes[None, :], 1.0, -1.0)

  def predict(self, out: np.ndarray) -> np.ndarray:
    """Ridge outputs [m, c] -> predictions [m]: the target, or the argmax class."""
    if self.kind == "regression":
      return out[:, 0] * self.std + self.mean
    return self.classes[np.argmax(out, axis=1)]


def fit_ridge(
  x: np.ndarray, y: np.ndarray, lam: float, kind: str
) -> Callable[[np.ndarray], np.ndarray]:
  """Ridge on (standardised) x, y; returns predict(x_new) -> predictions [m].

  Classification/pair: one-vs-rest ridge regression on ±1 targets, argmax. Regression: ridge
  on the standardised target, mapped back to the target's scale.
  """
  std, task = _Standardizer(np.asarray(x, np.float64)), _RidgeTask(np.asarray(y), kind)
  w, b = _RidgePath(std(x), task.targets(np.asarray(y))).weights(lam)
  return lambda x_new: task.predict(std(x_new) @ w + b)


def select_ridge_lambda(
  train_x: np.ndarray,
  train_y: np.ndarray,
  *,
  kind: str,
  metric: str,
  lambdas: Sequence[float] = DEFAULT_LAMBDAS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
) -> Selection:
  """Chooses λ on a held-out part of train. Receives training arrays only, by design.

  Standardisation statistics come from all of train (both parts are training data); ridge is
  fitted on the fit part for every λ from one eigendecomposition, scored on the held-out part.
  """
  x, y = _check(train_x, train_y, kind, metric, "train")
  lambdas = [float(l) for l in lambdas]
  if not lambdas or min(lambdas) <= 0:
    raise ConfigError(f"lambdas: need at least one value, all > 0, got {lambdas}.")

  def predict_heldout(fit, held):
    std = _Standardizer(np.asarray(x, np.float64))
    task = _RidgeTask(y[fit], kind)
    path = _RidgePath(std(x[fit]), task.targets(y[fit]))
    outs = path.predict_path(std(x[held]), lambdas)  # each [m, c]
    return [task.predict(o) for o in outs], ()

  return select_on_heldout(
    y, lambdas, predict_heldout, metric=metric, holdout_fraction=holdout_fraction, seed=seed
  )


def ridge_probe(
  train_x: np.ndarray,
  train_y: np.ndarray,
  eval_sets: Mapping[str, tuple],
  *,
  kind: str,
  metric: str,
  lambdas: Sequence[float] = DEFAULT_LAMBDAS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
  also: Sequence[str] = (),
) -> ProbeResult:
  """Ridge probe: λ chosen on held-out train, refit on all of train, scored on `eval_sets`.

  Args:
    train_x: [N, d] train features. train_y: [N] labels (class ids) or float targets.
    eval_sets: name -> (x [M, d], y [M]); used only for the final scores.
    kind: "classification", "pair" or "regression".
    metric: a key of METRICS (the task's metric), used for selection and for the report.
    lambdas: the λ sweep. holdout_fraction, seed: the held-out split of train.
    also: further metrics (keys of METRICS) to report on the eval sets; never used to select.

  Returns:
    ProbeResult with the chosen λ, its held-out scores and the eval-set scores.
  """
  return select_then_probe(
    "ridge",
    "lambda",
    lambda: select_ridge_lambda(
      train_x,
      train_y,
      kind=kind,
      metric=metric,
      lambdas=lambdas,
      holdout_fraction=holdout_fraction,
      seed=seed,
    ),
    lambda lam: (fit_ridge(np.asarray(train_x), np.asarray(train_y), lam, kind), {}),
    train_x,
    eval_sets,
    kind=kind,
    metric=metric,
    also=also,
  )
