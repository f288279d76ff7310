"""Where a size's optimum lies between its grid points: parabolic interpolation in log LR and log B.

A grid's best point places the optimum only to within half a grid step. The cpu grid steps LR and
batch by factors of 2, so the best point can be off by up to a factor of sqrt(2) on each axis. A
law through 3 sizes spanning 18-27x in compute can then be off by up to 2 ln(sqrt 2) / ln(18) =
0.24 in its exponent. That is as large as the exponents being measured (DeepSeek LLM: -0.125 for
LR, +0.327 for batch), so the argmin of a factor-2 grid cannot resolve them. Interpolating between
grid points can: Porian et al. 2024 (arXiv 2406.19146) interpolate each sweep (Akima splines in
log LR, then in log batch) for regression targets finer than their grid. Around a grid's best
point there are three points per axis, and the interpolant three points support is a parabola.

Per size, with `best` the lowest-loss member (which the edge check requires to be interior):
  lr*  the vertex of the parabola in log LR through `best` and its two LR neighbours in the same
       batch row (the next lower and next higher LR tried at that batch);
  B*   the vertex of the parabola in log B (tokens) through the best row's best loss and the best
       losses of the next smaller and next larger batch rows (each row's lowest loss over the LRs
       it tried).
Because the middle point is the lowest of the three, the parabola is convex and its vertex lies
between the outer points: the estimate never moves more than half a grid step from the grid point.
Where a neighbour is missing or diverged (a loss of +inf), that axis keeps the grid point, and
`how` says so. A row whose LRs miss its own optimum reports a best loss above the row's true
minimum. Its neighbours' minima are then overestimated, which pulls B* towards the best row, so
B* errs towards the grid point. A lopsided valley (loss climbing much faster above the optimal LR
than below it, as these grids' LR curves do) pulls the vertex towards the gentle side, by at most
the same half step.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cbert_jax.report.grid_read import Member

METHODS = ("vertex", "argmin")  # `grid fit --optimum`: interpolated, or the best grid point


@dataclasses.dataclass(frozen=True)
class Location:
  """One size's optimum as the laws use it, and how each coordinate was obtained."""

  lr: float  # peak LR
  batch_tokens: float  # batch in tokens (rows x seq_len; fractional when interpolated)
  how: dict  # {"lr": ..., "batch": ...}: "vertex of ..." or "grid point (...)"


def vertex(x: np.ndarray, y: np.ndarray) -> float:
  """The x of the vertex of the parabola through 3 points (x increasing, y[1] the lowest)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != (3,) or y.shape != (3,) or not (x[0] < x[1] < x[2]):
    raise ValueError(f"vertex: 3 points with increasing x, got x={x.tolist()}")
  if y[1] > min(y[0], y[2]):
    raise ValueError(f"vertex: the middle point must be the lowest, got y={y.tolist()}")
  slope_left = (y[1] - y[0]) / (x[1] - x[0])
  slope_right = (y[2] - y[1]) / (x[2] - x[1])
  curvature = (slope_right - slope_left) / (x[2] - x[0])  # the x^2 coefficient; >= 0 here
  if curvature <= 0.0:  # all three equal: no information beyond the grid point
    return float(x[1])
  # The derivative is zero where slope_left + curvature * (2x - x0 - x1) = 0.
  return float(0.5 * (x[0] + x[1]) - slope_left / (2.0 * curvature))


def _neighbours(points: list[tuple[float, float]], at: float):
  """((x_lo, y_lo), (x_hi, y_hi)) around x == at in sorted (x, y) points, or the reason there
  are none."""
  xs = [x for x, _ in points]
  i = xs.index(at)
  if i == 0 or i == len(points) - 1:
    return None, "no neighbour on one side"
  lo, hi = points[i - 1], points[i + 1]
  if not (math.isfinite(lo[1]) and math.isfinite(hi[1])):
    return None, "a neighbour diverged"
  return (lo, hi), ""


def locate(best: Member, members: list[Member], method: str = "vertex") -> Location:
  """The optimum of one size's grid (`members`: its done and diverged members; `best`: the one
  with the lowest loss), by `method` (`METHODS`)."""
  if method not in METHODS:
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
  if method == "argmin":
    return Location(best.lr, float(best.batch_tokens), {"lr": "grid point", "batch": "grid point"})
  how = {}
  # LR: the best member's row.
  row = sorted(
    (m.lr, m.loss if m.state == "done" else math.inf)
    for m in members
    if m.batch_size == best.batch_size
  )
  around, why = _neighbours(row, best.lr)
  lr = best.lr
  if around is None:
    how["lr"] = f"grid point ({why})"
  else:
    (lr_lo, y_lo), (lr_hi, y_hi) = around
    lr = math.exp(vertex(np.log([lr_lo, best.lr, lr_hi]), [y_lo, best.loss, y_hi]))
    how["lr"] = f"vertex of lr {lr_lo:.3g} / {best.lr:.3g} / {lr_hi:.3g} at {best.batch_size} rows"
  # B: every batch row's lowest loss over the LRs it tried.
  row_best: dict[int, float] = {}
  for m in members:
    loss = m.loss if m.state == "done" else math.inf
    row_best[m.batch_tokens] = min(row_best.get(m.batch_tokens, math.inf), loss)
  profile = sorted((float(b), y) for b, y in row_best.items())
  around, why = _neighbours(profile, float(best.batch_tokens))
  batch = float(best.batch_tokens)
  if around is None:
    how["batch"] = f"grid point ({why})"
  else:
    (b_lo, y_lo), (b_hi, y_hi) = around
    batch = math.exp(vertex(np.log([b_lo, batch, b_hi]), [y_lo, row_best[best.batch_tokens], y_hi]))
    seq = best.seq_len
    how["batch"] = (
      f"vertex of the rows' best losses at {b_lo / seq:g} / {best.batch_size} / {b_hi / seq:g} rows"
    )
  return Location(lr, batch, how)
