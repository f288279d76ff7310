"""What every frozen-feature probe shares: metrics, checks, the held-out split, the protocol.

Protocol, the same for every probe (ridge in `ridge`, logistic regression in `logreg`, kNN in
`knn`; the front with the registry and the layer-wise table is `probes`):
  1. split train into a fit part and a held-out part (seeded; `holdout_fraction`);
  2. choose the hyper-parameter (ridge λ, logistic-regression C, kNN k) by the task metric on the
     held-out part;
  3. refit on *all* of train with the chosen value;
  4. score every evaluation set (dev, test) with the task metric.
Steps 1-2 are `select_on_heldout` (each probe's `select_*` function calls it), steps 3-4 are
`select_then_probe` (each probe's `*_probe` function calls it): the protocol exists once.

Selection can never see evaluation data, by construction: `select_ridge_lambda`,
`select_logreg_c` and `select_knn_k` take only training arrays, and the probes hand the eval sets
to the final scoring alone (tests/evaluators/test_probes.py checks this with a spy and garbage labels).

Kinds: "classification" and "pair" (labels are class ids; pair features come from
`features.combine_pair`) and "regression" (float targets). The logistic-regression probe is for
class labels only: it refuses "regression".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import scipy.stats
from sklearn import metrics as sk_metrics

from cbert_jax.errors import ConfigError

KINDS = ("classification", "pair", "regression")


# ----------------------------------------------------------------------------------- metrics ---
def _spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
  # Constant predictions make the correlation undefined (nan); score them as 0 (no signal) so
  # selection never prefers them and tables stay numeric.
  if np.ptp(y_pred) == 0 or np.ptp(y_true) == 0:
    return 0.0
  return float(scipy.stats.spearmanr(y_true, y_pred).statistic)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
  "accuracy": lambda t, p: float(np.mean(np.asarray(t) == np.asarray(p))),
  "mcc": lambda t, p: float(sk_metrics.matthews_corrcoef(t, p)),
  "macro_f1": lambda t, p: float(sk_metrics.f1_score(t, p, average="macro")),
  # GLUE's F1 (MRPC, QQP): binary F1 of the positive class 1.
  "f1": lambda t, p: float(sk_metrics.f1_score(t, p, average="binary", pos_label=1)),
  "spearman": _spearman,
}


def score(metric: str, y_true: np.ndarray, y_pred: np.ndarray) -> float:
  """The metric `metric` (a key of METRICS) of predictions against targets; higher is better."""
  if metric not in METRICS:
    raise ConfigError(f"metric: expected one of {sorted(METRICS)}, got {metric!r}.")
  return METRICS[metric](np.asarray(y_true), np.asarray(y_pred))


# ---------------------------------------------------------------------------------- results ---
@dataclasses.dataclass(frozen=True)
class Selection:
  """The outcome of hyper-parameter selection on the held-out part of train.

  Attributes:
    value: the chosen λ, C or k.
    scores: held-out metric per candidate value, in sweep order.
    unconverged: candidates whose fit on the fit part stopped at the iteration cap (or whose
      solver reported a failure) before converging; logistic regression only, else empty.
  """

  value: float
  scores: dict[float, float]
  unconverged: tuple[float, ...] = ()

  @property
  def edge(self) -> str | None:
    """ "low" / "high" when the chosen value is the smallest / largest candidate (the optimum may
    lie outside the grid), None when it is interior or there was only one candidate."""
    if len(self.scores) < 2:
      return None
    if self.value == min(self.scores):
      return "low"
    if self.value == max(self.scores):
      return "high"
    return None


@dataclasses.dataclass(frozen=True)
class ProbeResult:
  """A probe's report.

  Attributes:
    probe: "ridge", "logreg" or "knn".
    metric: the task metric.
    param: "lambda", "C" or "k".
    selection: the chosen value and the held-out scores that chose it.
    scores: the metric on each evaluation set, by name.
    extra: further metrics reported (never used for selection) per evaluation set, e.g. GLUE's
      accuracy next to MRPC's F1: {set name: {metric: value}}; empty unless `also` was given.
    fit: facts about the final fit on all of train (logreg: {"converged", "n_iter",
      "max_iter"}); empty for ridge and kNN (closed form / no fit).
  """

  probe: str
  metric: str
  param: str
  selection: Selection
  scores: dict[str, float]
  extra: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  fit: dict = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------- checks, scaling ---
def _check(x: np.ndarray, y: np.ndarray, kind: str, metric: str, field: str):
  """Validates one (x, y) set and returns float x [N, d] and y [N]."""
  if kind not in KINDS:
    raise ConfigError(f"kind: expected one of {KINDS}, got {kind!r}.")
  if metric not in METRICS:
    raise ConfigError(f"metric: expected one of {sorted(METRICS)}, got {metric!r}.")
  x, y = np.asarray(x), np.asarray(y)
  if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
    raise ConfigError(
      f"{field}: expected features [N, d] and labels [N] with N > 0, got {x.shape} and {y.shape}."
    )
  return x, y


def _check_classes(kind: str) -> None:
  """ConfigError unless `kind` has class labels (the logistic-regression probe's requirement)."""
  if kind == "regression":
    raise ConfigError(
      "kind: the logistic-regression probe needs class labels (classification or pair), got "
      "'regression'; regression tasks are probed by ridge and kNN only."
    )


class _Standardizer:
  """Feature (and regression target) standardisation with *train* statistics only (shared by
  ridge and logistic regression)."""

  def __init__(self, x: np.ndarray):
    self.mean = x.mean(0)  # [d]
    # Constant features (e.g. a dead unit) would divide by 0; leave them at 0 instead.
    self.std = np.where(x.std(0) > 0, x.std(0), 1.0)  # [d]

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float64) - self.mean) / self.std


# -------------------------------------------------------------------------------- protocol ---
def holdout_split(n: int, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Seeded (fit_idx, heldout_idx) of range(n); both non-empty.

  Raises:
    ConfigError: if the fraction is not in (0, 1) or n < 2.
  """
  if not 0.0 < holdout_fraction < 1.0:
    raise ConfigError(f"holdout_fraction: must be in (0, 1), got {holdout_fraction}.")
  if n < 2:
    raise ConfigError(f"train: need at least 2 examples to hold some out, got {n}.")
  perm = np.random.RandomState(seed).permutation(n)
  m = min(max(int(round(n * holdout_fraction)), 1), n - 1)
  return np.sort(perm[m:]), np.sort(perm[:m])


def _choose(scores: dict[float, float]) -> float:
  """The best candidate; ties go to the first in sweep order."""
  vals = list(scores)
  best = np.argmax([scores[v] for v in vals])
  return vals[best]


def select_on_heldout(
  train_y: np.ndarray,
  candidates: Sequence[float],
  predict_heldout: Callable[[np.ndarray, np.ndarray], tuple[Iterable, Sequence[float]]],
  *,
  metric: str,
  holdout_fraction: float,
  seed: int,
) -> Selection:
  """Protocol steps 1-2: split train, score every candidate on the held-out part, choose.

  Args:
    train_y: [N] the (checked) training labels or targets.
    candidates: the sweep (λ, C or k), already validated, in sweep order.
    predict_heldout: (fit_idx, heldout_idx) -> (predictions of train_y[heldout_idx], one per
      candidate in sweep order, from a fit on the fit part alone; the candidates whose fit did
      not converge). Receives training indices only.
    metric: the task metric (a key of METRICS). holdout_fraction, seed: as `holdout_split`.

  Returns:
    Selection of the best candidate (ties: the first in sweep order).
  """
  fit, held = holdout_split(len(train_y), holdout_fraction, seed)
  preds, unconverged = predict_heldout(fit, held)
  scores = {v: score(metric, train_y[held], p) for v, p in zip(candidates, preds, strict=True)}
  return Selection(_choose(scores), scores, tuple(unconverged))


def _eval_scores(
  predict,
  eval_sets: Mapping[str, tuple],
  kind: str,
  metric: str,
  dim: int,
  also: Sequence[str] = (),
) -> tuple[dict[str, float], dict]:
  """The final scoring: the only place evaluation arrays are used.

  Returns ({set: metric}, {set: {other metric: value}} for the metrics in `also`).
  """
  out, extra = {}, {}
  for name, (x, y) in eval_sets.items():
    x, y = _check(x, y, kind, metric, f"eval_sets[{name!r}]")
    if x.shape[1] != dim:
      raise ConfigError(f"eval_sets[{name!r}]: features have dim {x.shape[1]}, train has {dim}.")
    pred = predict(x)
    out[name] = score(metric, y, pred)
    if also:
      extra[name] = {m: score(m, y, pred) for m in also}
  return out, extra


def select_then_probe(
  probe: str,
  param: str,
  select: Callable[[], Selection],
  refit: Callable[[float], tuple[Callable[[np.ndarray], np.ndarray], dict]],
  train_x: np.ndarray,
  eval_sets: Mapping[str, tuple],
  *,
  kind: str,
  metric: str,
  also: Sequence[str] = (),
) -> ProbeResult:
  """The whole protocol: select on held-out train, refit on all of train, score the eval sets.

  Args:
    probe, param: the result's names ("ridge" / "lambda", "logreg" / "C", "knn" / "k").
    select: () -> Selection, the probe's `select_*` on the training arrays only (steps 1-2,
      through `select_on_heldout`).
    refit: chosen value -> (predict(x_new) -> predictions [m], facts about the fit on all of
      train; {} when there are none) (step 3).
    train_x: [N, d] train features (only their width is read here, to check the eval sets).
    eval_sets: name -> (x [M, d], y [M]); used only for the final scores (step 4).
    kind, metric, also: as the probe's function.
  """
  sel = select()
  predict, fit_info = refit(sel.value)
  scores, extra = _eval_scores(predict, eval_sets, kind, metric, np.shape(train_x)[1], also)
  return ProbeResult(probe, metric, param, sel, scores, extra, fit_info)
