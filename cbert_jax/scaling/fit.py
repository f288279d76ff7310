"""Power-law fits in log space, with bootstrap confidence intervals.

`fit_power_law(x, y)`: y = a * x^alpha by least squares on (log x, log y) -- the form SPEC §5 uses
for the optimal learning rate and batch size against compute (or N). `fit_saturating(x, y)`:
y = e + b * x^-beta (loss against compute, with an irreducible term) by nonlinear least squares
(scipy.optimize.curve_fit). `bootstrap` resamples the points with replacement and refits, giving
percentile intervals; with few points (a sweep has 4-9 sizes) the intervals are wide, and the
report prints them so nobody reads more into an exponent than the data holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """y = a * x^alpha, with bootstrap percentile intervals (None without a bootstrap)."""

  a: float
  alpha: float
  n_points: int
  a_ci: tuple[float, float] | None = None
  alpha_ci: tuple[float, float] | None = None

  def __call__(self, x):
    return self.a * np.asarray(x, np.float64) ** self.alpha

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


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
  n: int = 1000,
  seed: int = 0,
  level: float = 0.9,
) -> dict[str, tuple[float, float]]:
  """Percentile intervals of every parameter `fit(x, y)` returns (a dict of floats).

  Resamples that draw fewer than 2 distinct x values (or that fail to fit) are dropped."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  rng = np.random.default_rng(seed)
  draws: dict[str, list[float]] = {}
  for _ in range(n):
    idx = rng.integers(0, x.size, x.size)
    if np.unique(x[idx]).size < 2:
      continue
    try:
      params = fit(x[idx], y[idx])
    except (ValueError, RuntimeError, np.linalg.LinAlgError):
      continue
    for k, v in params.items():
      draws.setdefault(k, []).append(v)
  lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
  return {k: (float(np.percentile(v, lo)), float(np.percentile(v, hi))) for k, v in draws.items()}


def fit_power_law_ci(x, y, n: int = 1000, seed: int = 0, level: float = 0.9) -> PowerLaw:
  """`fit_power_law` with bootstrap intervals for a and alpha."""
  law = fit_power_law(x, y)
  ci = bootstrap(
    lambda xs, ys: {"a": fit_power_law(xs, ys).a, "alpha": fit_power_law(xs, ys).alpha},
    x,
    y,
    n=n,
    seed=seed,
    level=level,
  )
  return dataclasses.replace(law, a_ci=ci.get("a"), alpha_ci=ci.get("alpha"))


@dataclasses.dataclass(frozen=True)
class SaturatingLaw:
  """y = e + b * x^-beta (e: the irreducible loss)."""

  e: float
  b: float
  beta: float
  n_points: int

  def __call__(self, x):
    return self.e + self.b * np.asarray(x, np.float64) ** -self.beta

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def fit_saturating(x: Sequence[float], y: Sequence[float]) -> SaturatingLaw:
  """Nonlinear least squares of y = e + b x^-beta, with x rescaled to its geometric mean for
  conditioning. Needs >= 4 points; e is bounded to [0, min(y)) so the fit stays a power law."""
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
    bounds=([0.0, 0.0, 0.0], [float(y.min()), np.inf, 10.0]),
    maxfev=20000,
  )
  return SaturatingLaw(e=float(e), b=float(b * scale**beta), beta=float(beta), n_points=int(x.size))
