"""The logistic-regression probe of frozen features: C by the shared protocol (`probe_base`).

scikit-learn's L2-regularised `LogisticRegression` (L-BFGS) on standardised features, for class
labels only (it refuses "regression"). Fits are capped at `LOGREG_MAX_ITER` iterations; a fit that
hits the cap is reported as unconverged (`ProbeResult.fit`, `Selection.unconverged`), never
silently accepted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from sklearn import exceptions as sk_exceptions
from sklearn import linear_model as sk_linear

from cbert_jax.errors import ConfigError
from cbert_jax.evaluators.probe_base import (
  ProbeResult,
  Selection,
  _check,
  _check_classes,
  _Standardizer,
  select_on_heldout,
  select_then_probe,
)

# Logistic regression: inverse L2 strength C on a log grid, and the L-BFGS iteration cap (bounded
# time; a fit that hits it is reported as unconverged, never silently accepted).
DEFAULT_CS = tuple(float(c) for c in np.logspace(-4, 2, 7))
LOGREG_MAX_ITER = 1000


def _logreg_standardised(
  z: np.ndarray, y: np.ndarray, c: float, max_iter: int, seed: int
) -> tuple[Callable[[np.ndarray], np.ndarray], dict]:
  """`fit_logreg` on features that are already standardised: (predict(z_new), fit facts)."""
  classes = np.unique(y)
  if len(classes) < 2:
    info = {"converged": True, "n_iter": 0, "max_iter": int(max_iter)}
    return (lambda z_new: np.full(len(z_new), classes[0])), info
  model = sk_linear.LogisticRegression(
    C=float(c), solver="lbfgs", max_iter=int(max_iter), random_state=seed
  )
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", sk_exceptions.ConvergenceWarning)
    model.fit(z, y)
  failed = False
  for w in caught:
    if issubclass(w.category, sk_exceptions.ConvergenceWarning):
      failed = True  # reported through the result instead
    else:  # not ours to swallow
      warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
  n_iter = int(np.max(model.n_iter_))
  info = {
    "converged": not failed and n_iter < max_iter,
    "n_iter": n_iter,
    "max_iter": int(max_iter),
  }
  return model.predict, info


def fit_logreg(
  x: np.ndarray, y: np.ndarray, c: float, *, max_iter: int = LOGREG_MAX_ITER, seed: int = 0
) -> tuple[Callable[[np.ndarray], np.ndarray], dict]:
  """L2-regularised logistic regression on x standardised with x's own statistics.

  scikit-learn's `LogisticRegression(C=c, solver="lbfgs")`: the multinomial (softmax) loss for 3
  or more classes, the binary logistic loss for 2; intercept unpenalised; objective
  ½‖W‖² + C · Σ log-loss. L-BFGS is deterministic; `random_state=seed` is fixed all the same.
  A single class in y gives the constant predictor (nothing to fit).

  Returns:
    (predict(x_new) -> class predictions [m], {"converged": bool, "n_iter": int,
    "max_iter": int}). `converged` is False when L-BFGS stopped at `max_iter` or reported a
    failure (scikit-learn's ConvergenceWarning, which is caught and turned into this flag; other
    warnings pass through).
  """
  std = _Standardizer(np.asarray(x, np.float64))
  predict, info = _logreg_standardised(std(x), np.asarray(y), c, max_iter, seed)
  return (lambda x_new: predict(std(x_new))), info


def select_logreg_c(
  train_x: np.ndarray,
  train_y: np.ndarray,
  *,
  kind: str,
  metric: str,
  cs: Sequence[float] = DEFAULT_CS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
  max_iter: int = LOGREG_MAX_ITER,
) -> Selection:
  """Chooses C on the held-out part of train (the same split as ridge). Training arrays only.

  As ridge: standardisation statistics from all of train; one fit per C on the fit part (each
  from scratch, so a candidate's score never depends on the others), scored on the held-out part.
  Candidates whose fit did not converge are listed in `Selection.unconverged`.
  """
  x, y = _check(train_x, train_y, kind, metric, "train")
  _check_classes(kind)
  cs = [float(c) for c in cs]
  if not cs or min(cs) <= 0:
    raise ConfigError(f"cs: need at least one value, all > 0, got {cs}.")

  def predict_heldout(fit, held):
    z = _Standardizer(np.asarray(x, np.float64))(x)
    preds, unconverged = [], []
    for c in cs:
      predict, info = _logreg_standardised(z[fit], y[fit], c, max_iter, seed)
      preds.append(predict(z[held]))
      if not info["converged"]:
        unconverged.append(c)
    return preds, unconverged

  return select_on_heldout(
    y, cs, predict_heldout, metric=metric, holdout_fraction=holdout_fraction, seed=seed
  )


def logreg_probe(
  train_x: np.ndarray,
  train_y: np.ndarray,
  eval_sets: Mapping[str, tuple],
  *,
  kind: str,
  metric: str,
  cs: Sequence[float] = DEFAULT_CS,
  holdout_fraction: float = 0.2,
  seed: int = 0,
  max_iter: int = LOGREG_MAX_ITER,
  also: Sequence[str] = (),
) -> ProbeResult:
  """Logistic-regression probe: C chosen on held-out train, refit on all of train, scored.

  Classification and pair tasks only (ConfigError for "regression"). Arguments as `ridge_probe`,
  with `cs` the C sweep and `max_iter` the L-BFGS cap. The result's `fit` says whether the final
  fit converged; `selection.unconverged` lists the C whose held-out fit did not.
  """
  _check(train_x, train_y, kind, metric, "train")
  _check_classes(kind)
  return select_then_probe(
    "logreg",
    "C",
    lambda: select_logreg_c(
      train_x,
      train_y,
      kind=kind,
      metric=metric,
      cs=cs,
      holdout_fraction=holdout_fraction,
      seed=seed,
      max_iter=max_iter,
    ),
    lambda c: fit_logreg(np.asarray(train_x), np.asarray(train_y), c, max_iter=max_iter, seed=seed),
    train_x,
    eval_sets,
    kind=kind,
    metric=metric,
    also=also,
  )
