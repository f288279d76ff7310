"""Power-law fits in log space, with bootstrap and t confidence intervals.

`fit_power_law(x, y)`: y = a * x^alpha by least squares on (log x, log y) -- the form SPEC §5 uses
for the optimal learning rate and batch size against compute (or N). `fit_saturating(x, y)`:
y = e + b * x^-beta (loss against compute, with an irreducible term) by nonlinear least squares
(scipy.optimize.curve_fit); e is reported only when it is interior to the optimiser's bounds.

Intervals (a sweep or a grid has 3-10 sizes, so they are wide, and are printed so that nobody
reads more into an exponent than the data hold), two kinds side by side:
  * the percentile bootstrap: the points are resampled with replacement and refitted. With n
    points there are only C(2n-1, n) distinct resamples (multisets); when that is at most
    `EXACT_LIMIT` (n <= 10) every one of them is enumerated with its multinomial probability
    n! / (k_1! ... k_n!) / n^n, and the interval is the exact percentiles (inverse CDF) of the
    resampling distribution -- no Monte Carlo error. Otherwise `N_DRAWS` random resamples. A
    resample in which all x are equal has no slope: it is skipped and counted (out of the n^n
    ordered resamples, or of the draws), and the percentiles are those of the rest.
  * the t-interval of the least-squares slope (and intercept) in log-log space:
    slope +- t_{n-2, (1+level)/2} * SE (scipy.stats.linregress, scipy.stats.t), exact under
    independent Gaussian errors in log y; needs n >= 3.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

EXACT_LIMIT = 100_000  # enumerate the bootstrap when it has at most this many distinct resamples
N_DRAWS = 10_000  # random resamples otherwise
LEVEL = 0.9  # the intervals' default coverage


@dataclasses.dataclass(frozen=True)
class Resamples:
  """The bootstrap's resampling distribution over n points: row i draws point j counts[i, j]
  times, with probability weights[i]."""

  counts: np.ndarray  # (M, n) ints, each row sums to n
  weights: np.ndarray  # (M,) probabilities, summing to 1
  multiplicity: np.ndarray  # (M,) ordered resamples per row (exact), or 1 per draw
  exact: bool  # every distinct resample enumerated (else random draws)
  total: int  # n^n ordered resamples (exact), or the number of draws

  @property
  def method(self) -> str:
    return "exact" if self.exact else "draws"


def n_distinct_resamples(n: int) -> int:
  """Distinct bootstrap resamples of n points: multisets of size n from n, C(2n-1, n)."""
  return math.comb(2 * n - 1, n)


def resamples(
  n: int, draws: int = N_DRAWS, seed: int = 0, exact_limit: int = EXACT_LIMIT
) -> Resamples:
  """Every distinct resample with its multinomial probability when there are at most
  `exact_limit` of them, else `draws` uniform resamples (seeded)."""
  if n < 1:
    raise ValueError(f"need at least one point to resample, got {n}")
  if n_distinct_resamples(n) <= exact_limit:
    from scipy import special  # pylint: disable=import-outside-toplevel

    combos = np.array(list(itertools.combinations_with_replacement(range(n), n)), np.int64)
    counts = np.zeros((len(combos), n), np.int64)
    np.add.at(counts, (np.arange(len(combos))[:, None], combos), 1)
    log_mult = special.gammaln(n + 1) - special.gammaln(counts + 1).sum(axis=1)
    mult = np.rint(np.exp(log_mult)).astype(np.int64)
    total = n**n
    if int(mult.sum()) != total:  # the multinomial coefficients count every ordered resample
      raise AssertionError(f"multinomial weights sum to {int(mult.sum())}, not {total}")
    return Resamples(counts, mult / total, mult, True, total)
  if draws < 1:
    raise ValueError(f"need at least one bootstrap draw, got {draws}")
  rng = np.random.default_rng(seed)
  counts = rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.int64)
  return Resamples(counts, np.full(draws, 1.0 / draws), np.ones(draws, np.int64), False, draws)


def linear_fits(u, v, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(slopes, intercepts, defined) of v = intercept + slope u by least squares on each resample
  (row of `counts`: how often each point is drawn), vectorised. A resample whose drawn points
  share one u has no slope: `defined` is False there and its slope and intercept are NaN."""
  u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
  w = counts.astype(np.float64)
  mean_u = w @ u / w.sum(axis=1)
  mean_v = w @ v / w.sum(axis=1)
  du = u[None, :] - mean_u[:, None]
  sxx = (w * du**2).sum(axis=1)
  sxy = (w * du * (v[None, :] - mean_v[:, None])).sum(axis=1)
  drawn = counts > 0
  defined = np.where(drawn, u, -np.inf).max(axis=1) > np.where(drawn, u, np.inf).min(axis=1)
  slope = np.where(defined, sxy / np.where(defined, sxx, 1.0), np.nan)
  return slope, mean_v - slope * mean_u, defined


def percentiles(values, weights, level: float = LEVEL) -> np.ndarray:
  """The (1-level)/2 and (1+level)/2 quantiles (inverse CDF) of the discrete distribution that
  puts `weights` on `values` (along axis 0); shape (2, ...)."""
  q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
  return np.percentile(values, q, weights=weights, method="inverted_cdf", axis=0)


MIN_POINTS = 3  # points a bootstrap interval needs (with 2, every resample is the same line)


@dataclasses.dataclass(frozen=True)
class LinearBootstrap:
  """The bootstrap distribution of a straight-line fit: the defined resamples' parameters."""

  slopes: np.ndarray
  intercepts: np.ndarray
  weights: np.ndarray  # renormalised over the defined resamples
  method: str  # exact | draws
  total: int  # resamples in all (n^n when exact, else draws)
  skipped: int  # of them, the resamples with no slope (all drawn points at one x)
  n_points: int = MIN_POINTS  # the points resampled (below 3: no interval, see `ci`)

  @property
  def has_interval(self) -> bool:
    """False without a defined resample or with fewer than 3 points: every resample of 2 points
    that has a slope is the line through both, so its "interval" would have zero width."""
    return bool(self.weights.size) and self.n_points >= MIN_POINTS

  def ci(self, values: np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """The percentile interval; None when there is none (`has_interval`)."""
    if not self.has_interval:
      return None
    lo, hi = percentiles(values, self.weights, level)
    return float(lo), float(hi)

  def info(self) -> dict:
    return {"method": self.method, "resamples": self.total, "skipped": self.skipped}


def bootstrap_line(
  u, v, n: int = N_DRAWS, seed: int = 0, exact_limit: int = EXACT_LIMIT
) -> LinearBootstrap:
  """Bootstrap of v = intercept + slope u (exact or `n` draws; see the module docstring)."""
  r = resamples(len(u), n, seed, exact_limit)
  slopes, intercepts, ok = linear_fits(u, v, r.counts)
  w = r.weights[ok]
  return LinearBootstrap(
    slopes=slopes[ok],
    intercepts=intercepts[ok],
    weights=w / w.sum() if w.size else w,
    method=r.method,
    total=int(r.total),
    skipped=int(r.multiplicity[~ok].sum()),
    n_points=int(len(u)),
  )


def t_interval(u, v, level: float = LEVEL) -> dict[str, tuple[float, float]] | None:
  """{"slope": ..., "intercept": ...}: estimate +- t_{n-2} * standard error of the least-squares
  line v = intercept + slope u (scipy.stats.linregress); None with fewer than 3 points or one u."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
  if u.size < 3 or np.ptp(u) == 0:
    return None
  fit = stats.linregress(u, v)
  t = float(stats.t.ppf((1 + level) / 2, u.size - 2))
  slope, se, icpt, ise = (
    float(v) for v in (fit.slope, fit.stderr, fit.intercept, fit.intercept_stderr)
  )
  if np.ptp(v) == 0:  # a constant v fits exactly (linregress's r, and so its SE, is 0/0 there)
    se = ise = 0.0
  return {"slope": (slope - t * se, slope + t * se), "intercept": (icpt - t * ise, icpt + t * ise)}


def _pair(x) -> tuple[float, float] | None:
  return (float(x[0]), float(x[1])) if x else None


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """y = a * x^alpha, with bootstrap percentile intervals (`a_ci`, `alpha_ci`; None without a
  bootstrap) and t-intervals (`a_t_ci`, `alpha_t_ci`; None with fewer than 3 points)."""

  a: float
  alpha: float
  n_points: int
  a_ci: tuple[float, float] | None = None
  alpha_ci: tuple[float, float] | None = None
  a_t_ci: tuple[float, float] | None = None
  alpha_t_ci: tuple[float, float] | None = None
  ci_level: float | None = None
  bootstrap: dict | None = None  # {"method": exact|draws, "resamples": int, "skipped": int}

  def __call__(self, x):
    return self.a * np.asarray(x, np.float64) ** self.alpha

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> PowerLaw:
    return cls(
      a=float(d["a"]),
      alpha=float(d["alpha"]),
      n_points=int(d.get("n_points", 0)),
      a_ci=_pair(d.get("a_ci")),
      alpha_ci=_pair(d.get("alpha_ci")),
      a_t_ci=_pair(d.get("a_t_ci")),
      alpha_t_ci=_pair(d.get("alpha_t_ci")),
      ci_level=float(d["ci_level"]) if d.get("ci_level") is not None else None,
      bootstrap=dict(d["bootstrap"]) if d.get("bootstrap") else None,
    )


def _check(x, y, min_points: int) -> tuple[np.ndarray, np.ndarray]:
  x, y = np.asarray(x, np.float64).reshape(-1), np.asarray(y, np.float64).reshape(-1)
  if x.shape != y.shape:
    raise ValueError(f"x and y differ in length: {x.size} vs {y.size}")
  if x.size < min_points:
    raise ValueError(f"need at least {min_points} points to fit, got {x.size}")
  if (x <= 0).any() or (y <= 0).any() or not (np.isfinite(x).all() and np.isfinite(y).all()):
    raise ValueError("power-law fits need finite, positive x and y")
  return x, y


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLaw:
  """Least squares of log y = log a + alpha log x."""
  x, y = _check(x, y, 2)
  alpha, log_a = np.polyfit(np.log(x), np.log(y), 1)
  return PowerLaw(a=float(np.exp(log_a)), alpha=float(alpha), n_points=int(x.size))


def bootstrap(
  fit: Callable[[np.ndarray, np.ndarray], dict],
  x,
  y,
  n: int = N_DRAWS,
  seed: int = 0,
  level: float = LEVEL,
  exact_limit: int = EXACT_LIMIT,
) -> dict[str, tuple[float, float]]:
  """Percentile intervals of every parameter `fit(x, y)` returns (a dict of floats), for any fit:
  exact over every distinct resample when there are at most `exact_limit`, else `n` draws (one
  `fit` call per resample: for straight lines `bootstrap_line` is vectorised).

  Resamples that draw fewer than 2 distinct x values (or that fail to fit) are dropped."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  r = resamples(x.size, n, seed, exact_limit)
  draws: dict[str, list[float]] = {}
  weights: dict[str, list[float]] = {}
  for counts, w in zip(r.counts, r.weights):
    idx = np.repeat(np.arange(x.size), counts)
    if np.unique(x[idx]).size < 2:
      continue
    try:
      params = fit(x[idx], y[idx])
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
      continue
    for k, v in params.items():
      draws.setdefault(k, []).append(v)
      weights.setdefault(k, []).append(w)
  out = {}
  for k, v in draws.items():
    lo, hi = percentiles(np.array(v), np.array(weights[k]), level)
    out[k] = (float(lo), float(hi))
  return out


def fit_power_law_ci(
  x, y, n: int = N_DRAWS, seed: int = 0, level: float = LEVEL, exact_limit: int = EXACT_LIMIT
) -> PowerLaw:
  """`fit_power_law` with intervals for a and alpha: the percentile bootstrap (exact, or `n`
  draws; none when n <= 0) and the t-interval (with >= 3 points)."""
  law = fit_power_law(x, y)
  u, v = np.log(np.asarray(x, np.float64)), np.log(np.asarray(y, np.float64))
  fields: dict = {"ci_level": level}
  if n > 0:
    boot = bootstrap_line(u, v, n, seed, exact_limit)
    fields |= {
      "alpha_ci": boot.ci(boot.slopes, level),
      "a_ci": _exp(boot.ci(boot.intercepts, level)),
      "bootstrap": boot.info(),
    }
  t = t_interval(u, v, level)
  if t:
    fields |= {"alpha_t_ci": t["slope"], "a_t_ci": _exp(t["intercept"])}
  return dataclasses.replace(law, **fields)


def _exp(ci: tuple[float, float] | None) -> tuple[float, float] | None:
  return (float(np.exp(ci[0])), float(np.exp(ci[1]))) if ci else None


@dataclasses.dataclass(frozen=True)
class SaturatingLaw:
  """y = e + b * x^-beta (e: the irreducible loss). `e` is None when the fit does not identify
  it (the optimiser's value sits on a bound: `e_note` says which); `e_fit` is that value, and the
  curve (`__call__`) uses it."""

  e: float | None
  b: float
  beta: float
  n_points: int
  e_fit: float
  e_note: str = ""

  def __call__(self, x):
    return self.e_fit + self.b * np.asarray(x, np.float64) ** -self.beta

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


BETA_MAX = 10.0  # fit_saturating's upper bound on beta
BOUND_RTOL = 1e-3  # a parameter within this fraction of its range's scale of a bound is on it


def _floor_note(e: float, beta: float, y_min: float) -> str:
  """Why e is not identified ("" when it is interior to [0, min(y)] and beta to (0, BETA_MAX))."""
  if e <= BOUND_RTOL * y_min:
    return f"e at the optimiser's lower bound 0 (e = {e:.3g}): the data fit a pure power law"
  if e >= (1 - BOUND_RTOL) * y_min:
    return (
      f"e at the optimiser's upper bound min(y) = {y_min:.4g}: the data do not fall toward a "
      "floor below the lowest point"
    )
  if beta <= BOUND_RTOL:
    return f"beta at the lower bound 0 (beta = {beta:.3g}): e and b trade off"
  if beta >= (1 - BOUND_RTOL) * BETA_MAX:
    return f"beta at the upper bound {BETA_MAX:g}: the curve is a step, e is its last level"
  return ""


def fit_saturating(x: Sequence[float], y: Sequence[float]) -> SaturatingLaw:
  """Nonlinear least squares of y = e + b x^-beta, with x rescaled to its geometric mean for
  conditioning. Needs >= 4 points; e is bounded to [0, min(y)] so the fit stays a power law, and
  is reported (`e`) only when it lands inside those bounds (and beta inside (0, BETA_MAX)): at a
  bound it is the optimiser's limit, not an estimate."""
  from scipy import optimize  # pylint: disable=import-outside-toplevel

  x, y = _check(x, y, 4)
  scale = float(np.exp(np.log(x).mean()))
  xs = x / scale
  start = fit_power_law(x, np.maximum(y - 0.5 * y.min(), 1e-12))
  p0 = (0.5 * y.min(), max(start(scale), 1e-12), max(-start.alpha, 1e-3))
  (e, b, beta), _ = optimize.curve_fit(
    lambda t, e, b, beta: e + b * t**-beta,
    xs,
    y,
    p0=p0,
    bounds=([0.0, 0.0, 0.0], [float(y.min()), np.inf, BETA_MAX]),
    maxfev=20000,
  )
  note = _floor_note(float(e), float(beta), float(y.min()))
  return SaturatingLaw(
    e=None if note else float(e),
    b=float(b * scale**beta),
    beta=float(beta),
    n_points=int(x.size),
    e_fit=float(e),
    e_note=note,
  )
