"""Chinchilla-style loss surface L(N, D) = E + A / N^alpha + B / D^beta and the allocation it implies.

The fit follows Hoffmann et al. (2022, approach 3): minimise the Huber loss (delta 1e-3) between
log L and log(exp(a - alpha log N) + exp(b - beta log D) + exp(e)) over (a, b, e, alpha, beta),
A = exp(a), B = exp(b), E = exp(e), with scipy's L-BFGS-B (analytic gradient) from a grid of
starting points, keeping the best. Written here because no maintained library fits this form
(scipy supplies the optimiser; the objective and its gradient are ten lines).

A fit is *usable* only when every exponent and the floor are interior: alpha and beta inside
(EXPONENT_BOUNDS) and not at a bound of the optimiser, and FLOOR_MIN_FRACTION x the smallest
observed loss <= E < the smallest observed loss (a floor at or above the data is not a floor; one
at the optimiser's bound, or within a hair of it -- under 1% of the data, below what a seed's
noise could tell from 0 -- is no floor identified: the data fit a pure power law). `Fit.problems`
lists what fails; callers refuse an unusable fit unless told otherwise. `allocation_problems`
adds the allocation's own test: the compute-optimal D/N at the runs' compute must lie within
(a margin of) the D/N the runs span, or the allocation extrapolates the trade-off between N and
D the data never measured.

Intervals: a percentile bootstrap over the runs (resampling (N, D, L) points with replacement,
each resample refitted from the point estimate and a few grid starts), with the number of
resamples that failed to fit reported. With few points the intervals are wide; they are reported,
not narrowed.

Compute-optimal allocation: with training compute C = k N D (k = FLOPs per parameter per token,
about 6 for a dense encoder; CrossBERT's predictor and ELECTRA's generator make it larger, so k
is estimated from the runs' own FLOPs), minimising L subject to C gives
N_opt = G (C / k)^(beta / (alpha + beta)), D_opt = (C / k) / N_opt, G = (alpha A / (beta B))^(1 / (alpha + beta)).

Speed: every L-BFGS-B step on these 5 parameters makes tiny BLAS/LAPACK calls; with OpenBLAS's
default threads on a loaded 2-core machine, the report's two surface fits took 34 minutes (cProfile:
1,627 of 2,045 s inside L-BFGS-B's `setulb`). `fit` runs with one BLAS thread (threadpoolctl): a
32-start fit on 12 points took 0.52 s of CPU instead of 8.0 s, with the same result. The objective
computes scipy's logsumexp itself (`logsumexp_rows`, bit for bit the same), whose per-call overhead
was most of what remained. The committed surface files (docs/sweep_cpu) are reproduced bit for bit.

Predicted loss and its interval: `Fit.draws` keeps the bootstrap refits ([R, 5], in the optimiser's
parameterisation (log A, log B, log E, alpha, beta)); `Fit.loss_interval(n, d)` is the percentile
interval of L(n, d) over them at the fit's `level`, the same percentile convention as
`Fit.intervals`. `save(path, fit, k, provenance)` writes a surface file (JSON: the law, k, level,
intervals, draws, problems, provenance) and `load(path)` reads it back, refusing (ValueError, one
line naming the file and every problem) a fit that is not usable unless `allow_unusable=True`;
`python -m cbert_jax.sweep.planner --surface FILE` plans a run from one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize

HUBER_DELTA = 1e-3
# Plausible exponent range (Hoffmann et al. find alpha 0.34, beta 0.28; Besiroglu et al.'s
# replication 0.35 / 0.37): outside it, or at the optimiser's bounds, a fit is refused.
EXPONENT_BOUNDS = (0.05, 2.0)
# Starting grid (log A, log B, log E, alpha, beta): Hoffmann et al.'s appendix grid, coarser (128
# starts; on synthetic runs it finds the same optimum as a 675-start grid, 4x faster).
START_GRID = dict(
  a=(0.0, 7.0, 14.0, 21.0),
  b=(0.0, 7.0, 14.0, 21.0),
  e=(-1.0, 0.5),
  alpha=(0.3, 0.8),
  beta=(0.3, 0.8),
)
_BOUNDS = [(-10.0, 60.0), (-10.0, 60.0), (-10.0, 5.0), (0.0, 3.0), (0.0, 3.0)]
# A floor E under this fraction of the smallest observed loss is not told apart from E = 0 (two
# seeds of one config differ by 0.5-1.1% of the loss for 4 BERT d32L2 grid configs, results/
# grid_cpu_seed1 vs grid_cpu, and by 1.9% for the sweep's bert_d96L3): "no floor identified",
# like E at the bound.
FLOOR_MIN_FRACTION = 0.01
# The compute-optimal D/N at the runs' own compute must lie within [min / m, max x m] of the runs'
# D/N (m = this margin): beyond it the N-vs-D trade-off is extrapolated, not measured.
ALLOCATION_DN_MARGIN = 2.0


@dataclasses.dataclass(frozen=True)
class LossSurface:
  """L(N, D) = E + A / N^alpha + B / D^beta."""

  E: float
  A: float
  alpha: float
  B: float
  beta: float

  def __call__(self, n, d):
    n, d = np.asarray(n, float), np.asarray(d, float)
    return self.E + self.A / n**self.alpha + self.B / d**self.beta

  def optimal(self, compute: float, k: float) -> tuple[float, float]:
    """(N_opt, D_opt) minimising L subject to k N D = compute."""
    a, b = self.alpha, self.beta
    g = (a * self.A / (b * self.B)) ** (1.0 / (a + b))
    nd = compute / k
    n = g * nd ** (b / (a + b))
    return float(n), float(nd / n)


@dataclasses.dataclass
class Fit:
  """The best fit, its objective, and why it may not be usable."""

  law: LossSurface
  objective: float
  points: int
  problems: list[str]
  intervals: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
  boot_failed: int = 0  # bootstrap resamples whose fit did not converge
  # The bootstrap refits, [R, 5] rows (log A, log B, log E, alpha, beta) (`DRAW_COLUMNS`); None
  # without a bootstrap (or when every resample failed).
  draws: np.ndarray | None = dataclasses.field(default=None, compare=False)  # eq: arrays
  level: float = 0.0  # the intervals' level (0 without a bootstrap)

  @property
  def usable(self) -> bool:
    return not self.problems

  def draw_laws(self) -> list[LossSurface]:
    """The bootstrap refits as surfaces (empty without draws)."""
    return [] if self.draws is None else [_unpack(row) for row in self.draws]

  def loss_draws(self, n, d) -> np.ndarray:
    """L(n, d) under every bootstrap refit, [R, *broadcast(n, d).shape]; ValueError without draws."""
    if self.draws is None or len(self.draws) == 0:
      raise ValueError("the fit has no bootstrap draws (fit with n_boot > 0)")
    return draw_losses(self.draws, n, d)

  def loss_interval(self, n, d, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) percentiles of L(n, d) over the bootstrap refits at `level` (default the fit's
    level), the convention of `intervals`: ((1 - level) / 2, (1 + level) / 2) x 100."""
    losses = self.loss_draws(n, d)  # [R, ...]
    level = self.level if level is None else level
    if not 0.0 < level < 1.0:
      raise ValueError(f"level must be in (0, 1), got {level}")
    return percentile_interval(losses, level)


def _unpack(theta: np.ndarray) -> LossSurface:
  a, b, e, alpha, beta = theta
  return LossSurface(
    E=float(np.exp(e)), A=float(np.exp(a)), alpha=float(alpha), B=float(np.exp(b)), beta=float(beta)
  )


def logsumexp_rows(terms: np.ndarray) -> np.ndarray:
  """scipy.special.logsumexp(terms, axis=0) for a real 2-d array, the same floats without its
  per-call overhead (it dominated the surface fit: 0.5 ms a call, 320k calls per report). The
  algorithm is scipy 1.17's: the largest term of each column is taken out of the sum (every term
  equal to it, counted m times), log1p(sum(exp(rest - top)) / m) + log(m) + top, and a column
  whose result is not finite gets log(sum(exp(terms))). tests/scaling/test_chinchilla.py checks
  the two agree bit for bit."""
  top = terms.max(axis=0)  # [P]
  at_top = terms == top  # [3, P]
  m = at_top.astype(terms.dtype).sum(axis=0)  # [P], >= 1
  s = np.exp(np.where(at_top, -np.inf, terms) - top).sum(axis=0)  # [P]
  s = np.where(s == 0, s, s / m)
  out = np.log1p(s) + np.log(m) + top
  finite = np.isfinite(out)
  if not finite.all():
    with np.errstate(divide="ignore", over="ignore"):
      out = np.where(finite, out, np.log(np.exp(terms).sum(axis=0)))
  return out


def _objective(theta, log_n, log_d, log_l, delta):
  """Huber loss of log L and its gradient in theta = (a, b, e, alpha, beta)."""
  a, b, e, alpha, beta = theta
  terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # [3, P]
  pred = logsumexp_rows(terms)  # [P]
  r = pred - log_l
  small = np.abs(r) <= delta
  value = np.where(small, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta)).sum()
  dr = np.where(small, r, delta * np.sign(r))  # d huber / d pred, [P]
  w = np.exp(terms - pred)  # softmax weights, [3, P]
  grad = np.array(
    [
      (dr * w[0]).sum(),
      (dr * w[1]).sum(),
      (dr * w[2]).sum(),
      -(dr * w[0] * log_n).sum(),
      -(dr * w[1] * log_d).sum(),
    ]
  )
  return value, grad


def _minimise(starts, log_n, log_d, log_l, delta) -> tuple[np.ndarray, float] | None:
  best = None
  for x0 in starts:
    res = optimize.minimize(
      _objective,
      np.asarray(x0, float),
      args=(log_n, log_d, log_l, delta),
      jac=True,
      method="L-BFGS-B",
      bounds=_BOUNDS,
    )
    if np.isfinite(res.fun) and (best is None or res.fun < best[1]):
      best = (res.x, float(res.fun))
  return best


def _check(n, d, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  n, d, loss = (np.asarray(v, float) for v in (n, d, loss))
  if not (n.shape == d.shape == loss.shape and n.ndim == 1):
    raise ValueError(
      f"n, d, loss: expected three equal-length 1-d arrays, got {n.shape}, {d.shape}, {loss.shape}"
    )
  if len(n) < 5:
    raise ValueError(f"a 5-parameter surface needs at least 5 runs, got {len(n)}")
  if not (np.all(n > 0) and np.all(d > 0) and np.all(loss > 0) and np.all(np.isfinite(loss))):
    raise ValueError("n, d and loss must be positive and finite")
  if len(np.unique(n)) < 2 or len(np.unique(d)) < 2:
    raise ValueError("N and D must each take at least 2 distinct values to identify alpha and beta")
  return n, d, loss


def problems(law: LossSurface, loss: np.ndarray) -> list[str]:
  """Why a fitted surface is not an estimate (empty when every parameter is interior)."""
  out = []
  lo, hi = EXPONENT_BOUNDS
  for name in ("alpha", "beta"):
    v = getattr(law, name)
    if not lo < v < hi:
      out.append(f"{name} = {v:.3g} is outside the plausible range ({lo}, {hi})")
  if law.E <= optimiser_bounds("E")[0] * 1.01:
    out.append(f"E = {law.E:.3g} sits at the optimiser's lower bound (no floor identified)")
  elif law.E < FLOOR_MIN_FRACTION * float(np.min(loss)):
    out.append(
      f"E = {law.E:.3g} is under {FLOOR_MIN_FRACTION:.0%} of the smallest observed loss "
      f"{np.min(loss):.4g} (no floor identified: the data fit a pure power law)"
    )
  elif law.E >= float(np.min(loss)):
    out.append(f"E = {law.E:.3g} is not below the smallest observed loss {np.min(loss):.4g}")
  return out


def range_factor(x: float, lo: float, hi: float) -> float:
  """How many times x lies outside [lo, hi]: x / hi above it, lo / x below it, 1.0 inside."""
  return x / hi if x > hi else lo / x if x < lo else 1.0


def allocation_problems(
  law: LossSurface,
  compute: float,
  k: float,
  d_per_n: Sequence[float],
  margin: float = ALLOCATION_DN_MARGIN,
) -> list[str]:
  """Why the allocation at `compute` is not supported by runs spanning D/N `d_per_n` = (lo, hi):
  its D/N_opt outside [lo / margin, hi x margin] (empty when inside)."""
  lo, hi = float(min(d_per_n)), float(max(d_per_n))
  n_opt, d_opt = law.optimal(compute, k)
  dn = d_opt / n_opt
  if lo / margin <= dn <= hi * margin:
    return []
  factor = range_factor(dn, lo, hi)
  return [
    f"the compute-optimal D/N at C = {compute:.3g} is {dn:.3g}, {factor:.3g}x outside the D/N "
    f"{lo:.3g}-{hi:.3g} the runs span (margin {margin:g}x): the N-vs-D trade-off there is "
    "extrapolated, not measured"
  ]


def fit(
  n: Sequence[float],
  d: Sequence[float],
  loss: Sequence[float],
  *,
  delta: float = HUBER_DELTA,
  n_boot: int = 0,
  seed: int = 0,
  level: float = 0.9,
  starts: Sequence[Sequence[float]] | None = None,
  progress: Callable[[int, int], None] | None = None,
) -> Fit:
  """The best L(N, D) over the starting grid; with `n_boot` > 0, percentile intervals at `level`.

  Args:
    n: non-embedding parameters of each run.
    d: training tokens of each run.
    loss: each run's final validation loss.
    starts: starting points (a, b, e, alpha, beta); default the product of START_GRID.
    progress: called as progress(done, n_boot) with the bootstrap resamples done so far, from 0
      (after the point fit) to n_boot.
  """
  import threadpoolctl  # pylint: disable=import-outside-toplevel  # scikit-learn's dependency

  with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # see "Speed" above
    return _fit(n, d, loss, delta, n_boot, seed, level, starts, progress or (lambda i, n: None))


def _fit(n, d, loss, delta, n_boot, seed, level, starts, progress) -> Fit:
  """`fit`'s body (the caller sets the BLAS threads)."""
  n, d, loss = _check(n, d, loss)
  log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
  starts = list(starts) if starts is not None else list(itertools.product(*START_GRID.values()))
  best = _minimise(starts, log_n, log_d, log_l, delta)
  if best is None:
    raise ValueError("no starting point gave a finite fit")
  law = _unpack(best[0])
  result = Fit(law=law, objective=best[1], points=len(n), problems=problems(law, loss))
  progress(0, n_boot)
  if n_boot > 0:
    rng = np.random.default_rng(seed)
    few = starts[:: max(1, len(starts) // 4)]  # a few grid starts besides the point estimate
    draws, failed = [], 0
    for i in range(n_boot):
      if i:
        progress(i, n_boot)
      idx = rng.integers(0, len(n), len(n))
      if len(np.unique(n[idx])) < 2 or len(np.unique(d[idx])) < 2:
        failed += 1
        continue
      got = _minimise([best[0], *few], log_n[idx], log_d[idx], log_l[idx], delta)
      if got is None:
        failed += 1
        continue
      draws.append(got[0])
    progress(n_boot, n_boot)
    if draws:
      arr = np.array(draws)  # [R, 5]
      result.draws, result.level = arr, float(level)
      q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
      names = ("A", "B", "E", "alpha", "beta")
      for i, name in enumerate(names):
        vals = np.exp(arr[:, i]) if name in ("A", "B", "E") else arr[:, i]
        lo_v, hi_v = np.percentile(vals, q)
        result.intervals[name] = (float(lo_v), float(hi_v))
    result.boot_failed = failed
  return result


def flops_per_param_token(flops: Sequence[float], n: Sequence[float], d: Sequence[float]) -> float:
  """k in C = k N D: the median over runs of C / (N D) (each run's analytic training FLOPs)."""
  flops, n, d = (np.asarray(v, float) for v in (flops, n, d))
  return float(np.median(flops / (n * d)))


# ------------------------------------------------------ draws, intervals and surface files ---
# The columns of `Fit.draws` (the optimiser's parameterisation; see `_unpack`).
DRAW_COLUMNS = ("log_A", "log_B", "log_E", "alpha", "beta")


def optimiser_bounds(name: str) -> tuple[float, float]:
  """The optimiser's bounds on a surface parameter ("A", "B", "E": in natural units; "alpha",
  "beta"): a bootstrap interval that ends there is cut by the optimiser, not by the data."""
  i = DRAW_COLUMNS.index(name if name in ("alpha", "beta") else f"log_{name}")
  lo, hi = _BOUNDS[i]
  return (lo, hi) if name in ("alpha", "beta") else (float(np.exp(lo)), float(np.exp(hi)))


SURFACE_FORMAT = "cbert_jax.chinchilla.surface/1"


def draw_losses(draws: np.ndarray, n, d) -> np.ndarray:
  """L(n, d) under each row of `draws` ([R, 5], `DRAW_COLUMNS`): [R, *broadcast(n, d).shape]."""
  draws = np.asarray(draws, float)
  if draws.ndim != 2 or draws.shape[1] != len(DRAW_COLUMNS):
    raise ValueError(f"draws: expected shape [R, {len(DRAW_COLUMNS)}], got {draws.shape}")
  n, d = np.asarray(n, float), np.asarray(d, float)
  extra = (1,) * np.broadcast(n, d).ndim
  a, b, e, alpha, beta = (draws[:, i].reshape(-1, *extra) for i in range(len(DRAW_COLUMNS)))
  return np.exp(e) + np.exp(a) / n**alpha + np.exp(b) / d**beta


def percentile_interval(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
  """The central `level` percentile interval over axis 0 (as `fit` computes `intervals`)."""
  lo, hi = np.percentile(values, [(1 - level) / 2 * 100, (1 + level) / 2 * 100], axis=0)
  return lo, hi


@dataclasses.dataclass(frozen=True)
class SavedSurface:
  """A surface file read back: the fit, k (FLOPs per parameter per token) and provenance."""

  path: str
  fit: Fit
  k: float
  provenance: dict


def to_dict(fit_: Fit, k: float, provenance: dict | None = None) -> dict:
  """The JSON form of a fit (see `save`)."""
  if not (np.isfinite(k) and k > 0):
    raise ValueError(f"k (FLOPs per parameter per token) must be positive, got {k}")
  return {
    "format": SURFACE_FORMAT,
    "law": dataclasses.asdict(fit_.law),
    "k": float(k),
    "level": float(fit_.level),
    "intervals": {name: list(v) for name, v in fit_.intervals.items()},
    "draw_columns": list(DRAW_COLUMNS),
    "draws": None if fit_.draws is None else np.asarray(fit_.draws, float).tolist(),  # [R, 5]
    "boot_failed": int(fit_.boot_failed),
    "objective": float(fit_.objective),
    "points": int(fit_.points),
    "problems": list(fit_.problems),
    "provenance": dict(provenance or {}),
  }


def save(path: str, fit_: Fit, k: float, provenance: dict | None = None) -> None:
  """Writes `fit_` with its k and provenance (what was fitted, from which runs, N's definition,
  the command) to `path` as JSON, atomically (a temporary file, then a rename)."""
  out = to_dict(fit_, k, provenance)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(out, f, indent=2)
  os.replace(tmp, path)


def load(path: str, allow_unusable: bool = False) -> SavedSurface:
  """The surface file at `path`. ValueError, one line naming the file, when it is missing, not a
  surface file, or (unless `allow_unusable`) records problems that make the fit unusable."""
  try:
    with open(path) as f:
      raw = json.load(f)
  except FileNotFoundError:
    raise ValueError(f"{path}: no such surface file") from None
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read the surface file ({type(e).__name__}: {e})") from None
  try:
    if raw.get("format") != SURFACE_FORMAT:
      raise ValueError(f"format is {raw.get('format')!r}, expected {SURFACE_FORMAT!r}")
    law = LossSurface(
      **{f.name: float(raw["law"][f.name]) for f in dataclasses.fields(LossSurface)}
    )
    draws = raw.get("draws")
    draws = None if draws is None else np.asarray(draws, float).reshape(-1, len(DRAW_COLUMNS))
    result = Fit(
      law=law,
      objective=float(raw.get("objective", float("nan"))),
      points=int(raw.get("points", 0)),
      problems=[str(p) for p in raw.get("problems", [])],
      intervals={name: (float(v[0]), float(v[1])) for name, v in raw.get("intervals", {}).items()},
      boot_failed=int(raw.get("boot_failed", 0)),
      draws=draws,
      level=float(raw.get("level", 0.0)),
    )
    k = float(raw["k"])
    if not (np.isfinite(k) and k > 0):
      raise ValueError(f"k must be positive, got {k}")
    provenance = dict(raw.get("provenance") or {})
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path}: not a loss-surface file ({type(e).__name__}: {e})") from None
  if result.problems and not allow_unusable:
    raise ValueError(f"{path}: the fit is not usable: {'; '.join(result.problems)}")
  return SavedSurface(path=path, fit=result, k=k, provenance=provenance)
