"""Ridge, logistic-regression and kNN probes of frozen features; the layer-wise table (SPEC §6).

Protocol, the same for every probe:
  1. split train into a fit part and a held-out part (seeded; `holdout_fraction`);
  2. choose the hyper-parameter (ridge λ, logistic-regression C, kNN k) by the task metric on the
     held-out part;
  3. refit on *all* of train with the chosen value;
  4. score every evaluation set (dev, test) with the task metric.

Selection can never see evaluation data, by construction: `select_ridge_lambda`,
`select_logreg_c` and `select_knn_k` take only training arrays, and the probes hand the eval sets
to the final scoring alone (tests/test_probes.py checks this with a spy and garbage labels).

Kinds: "classification" and "pair" (labels are class ids; pair features come from
`features.combine_pair`) and "regression" (float targets). The logistic-regression probe is for
class labels only: it refuses "regression".

kNN tie rule (deterministic, independent of how numpy partitions or sorts): neighbours are ranked
by cosine similarity, higher first, and equal similarities by training-example index, lower
first; so among the k nearest, a tie at the k-th similarity keeps the lower-indexed training
examples. Identical (L2-normalised) training rows get bit-identical similarities by construction
(each distinct row's similarity is computed once). The vote: most neighbours wins; a tie in
votes goes to the larger summed similarity of the tied classes' neighbours, then to the lower
class id (classes sorted as `np.unique` sorts them).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import scipy.stats
from sklearn import exceptions as sk_exceptions
from sklearn import linear_model as sk_linear
from sklearn import metrics as sk_metrics

from cbert_jax.errors import ConfigError

KINDS = ("classification", "pair", "regression")
DEFAULT_LAMBDAS = np.logspace(-3, 4, 15)
DEFAULT_KS = (1, 3, 5, 10, 20, 50)
# Logistic regression: inverse L2 strength C on a log grid, and the L-BFGS iteration cap (bounded
# time; a fit that hits it is reported as unconverged, never silently accepted).
DEFAULT_CS = tuple(float(c) for c in np.logspace(-4, 2, 7))
LOGREG_MAX_ITER = 1000
# kNN similarities are computed for this many queries at a time: [chunk, N_train] floats, never
# an [N, N] matrix.
_KNN_CHUNK = 1024


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


# ------------------------------------------------------------------------------ common parts ---
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


# ---------------------------------------------------------------------------------- ridge ------
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


class _Standardizer:
  """Feature (and regression target) standardisation with *train* statistics only."""

  def __init__(self, x: np.ndarray):
    self.mean = x.mean(0)  # [d]
    # Constant features (e.g. a dead unit) would divide by 0; leave them at 0 instead.
    self.std = np.where(x.std(0) > 0, x.std(0), 1.0)  # [d]

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float64) - self.mean) / self.std


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
  fit, held = holdout_split(len(y), holdout_fraction, seed)
  std = _Standardizer(np.asarray(x, np.float64))
  task = _RidgeTask(y[fit], kind)
  path = _RidgePath(std(x[fit]), task.targets(y[fit]))
  outs = path.predict_path(std(x[held]), lambdas)  # each [m, c]
  scores = {l: score(metric, y[held], task.predict(o)) for l, o in zip(lambdas, outs)}
  return Selection(_choose(scores), scores)


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
  sel = select_ridge_lambda(
    train_x,
    train_y,
    kind=kind,
    metric=metric,
    lambdas=lambdas,
    holdout_fraction=holdout_fraction,
    seed=seed,
  )
  predict = fit_ridge(np.asarray(train_x), np.asarray(train_y), sel.value, kind)
  return ProbeResult(
    "ridge",
    metric,
    "lambda",
    sel,
    *_eval_scores(predict, eval_sets, kind, metric, np.shape(train_x)[1], also),
  )


# ------------------------------------------------------------------------ logistic regression ---
def _check_classes(kind: str) -> None:
  if kind == "regression":
    raise ConfigError(
      "kind: the logistic-regression probe needs class labels (classification or pair), got "
      "'regression'; regression tasks are probed by ridge and kNN only."
    )


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
  fit, held = holdout_split(len(y), holdout_fraction, seed)
  std = _Standardizer(np.asarray(x, np.float64))
  z = std(x)
  scores, unconverged = {}, []
  for c in cs:
    predict, info = _logreg_standardised(z[fit], y[fit], c, max_iter, seed)
    scores[c] = score(metric, y[held], predict(z[held]))
    if not info["converged"]:
      unconverged.append(c)
  return Selection(_choose(scores), scores, tuple(unconverged))


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
  sel = select_logreg_c(
    train_x,
    train_y,
    kind=kind,
    metric=metric,
    cs=cs,
    holdout_fraction=holdout_fraction,
    seed=seed,
    max_iter=max_iter,
  )
  predict, info = fit_logreg(
    np.asarray(train_x), np.asarray(train_y), sel.value, max_iter=max_iter, seed=seed
  )
  scores, extra = _eval_scores(predict, eval_sets, kind, metric, np.shape(train_x)[1], also)
  return ProbeResult("logreg", metric, "C", sel, scores, extra, info)


# ------------------------------------------------------------------------------------ kNN ------
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
  fit, held = holdout_split(len(y), holdout_fraction, seed)
  idx, sim = nearest(x[fit], x[held], max(ks))
  classes = None if kind == "regression" else np.unique(y[fit])
  scores = {
    k: score(metric, y[held], _knn_predict(idx, sim, y[fit], min(k, len(fit)), kind, classes))
    for k in ks
  }
  return Selection(_choose(scores), scores)


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
  sel = select_knn_k(
    train_x, train_y, kind=kind, metric=metric, ks=ks, holdout_fraction=holdout_fraction, seed=seed
  )
  x, y = np.asarray(train_x), np.asarray(train_y)
  k = min(int(sel.value), len(y))
  classes = None if kind == "regression" else np.unique(y)

  def predict(q):
    idx, sim = nearest(x, q, k)
    return _knn_predict(idx, sim, y, k, kind, classes)

  return ProbeResult(
    "knn",
    metric,
    "k",
    sel,
    *_eval_scores(predict, eval_sets, kind, metric, np.shape(train_x)[1], also),
  )


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
