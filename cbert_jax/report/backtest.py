"""Leave-one-size-out backtests and lack-of-fit tests of the laws the scaling report fits.

Every law the report prints (loss vs compute L(C) per family, as a power law and as the saturating
law; each probe's score-vs-compute line; the LR and batch laws of the hyperparameter grid) is
refitted on all sizes but one and asked for the size left out. The miss is printed beside the
exponent, in the law's units and in %, with whether the measured value falls inside the
prediction's 90% interval, plus a lack-of-fit test of the law's form.

A straight line y = b0 + b1 x (x = ln C, y = ln L for the loss; x = log10 C, y = score for a probe;
x = ln C or ln N, y = ln lr* or ln B* for the grid's laws) is fitted by least squares to the
individual observations: every seed of every size (equal to the report's fit on the seed means
when each size has every seed). Then:
  * prediction interval (`predict`): for the mean of the n0 seeds measured at a held-out x0,
    yhat +- t_{n-2} s sqrt(1/n0 + 1/n + (x0 - xbar)^2 / Sxx), s^2 the residual variance of the
    n training observations: exact under independent Gaussian errors around the line, with
    n - 2 >= 1 degrees of freedom (none otherwise: 2 points give a line without a residual).
  * lack of fit (`lack_of_fit`): the F-test of the law against the saturated model (one mean per
    size) with the seed replicates as pure error: F = (SS_lof / (m - p)) / (SS_pe / (n - m)), m sizes,
    p the law's parameters, SS_pe the scatter of the seeds about their size's mean and
    SS_lof = SSE - SS_pe; p-value from F(m - p, n - m). Exact for a line under Gaussian errors,
    approximate for the nonlinear saturating law. Needs replicates (n > m) and m > p: the grid
    has one optimum per size, so its laws are not testable.
An exponent is called a law only when its lack-of-fit test runs and passes (p >= `LOF_ALPHA`);
otherwise it is "a slope over the sizes measured (N lo-hi)": the line summarises those sizes and
is not a claim about others.

The grid's laws (`hparam_backtest`) are also compared with the best constant: the geometric mean of
the other sizes' optima (the power law with exponent 0, fitted the same way). Their loss cost at
the held-out size is read off that size's grid (`profile_cost`): along the best member's batch row
for an LR, along the rows' best losses for a batch, as `grid_vertex` locates the optimum.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

LEVEL = 0.9  # the prediction intervals' coverage
LOF_ALPHA = 0.05  # lack-of-fit p-value below which an exponent is only a slope
LOF_TEST = "F-test of the law against one mean per size, seed replicates as pure error"


# ------------------------------------------------------------------------ the line itself ---
@dataclasses.dataclass(frozen=True)
class Line:
  """y = intercept + slope x by least squares on n observations (x in the law's axis units)."""

  slope: float
  intercept: float
  n: int  # observations fitted
  dof: int  # n - 2: the residual's degrees of freedom
  s2: float  # residual variance SSE / dof (nan when dof < 1)
  x_mean: float
  sxx: float  # sum (x - x_mean)^2 over the observations

  def __call__(self, x):
    return self.intercept + self.slope * np.asarray(x, np.float64)


def fit_line(x, y) -> Line:
  """Least squares of y on x (1-d, equal lengths, >= 2 distinct x)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1 or np.unique(x).size < 2:
    raise ValueError(f"fit_line: need equal-length 1-d x, y with >= 2 distinct x, got {x.shape}")
  x_mean = float(x.mean())
  sxx = float(((x - x_mean) ** 2).sum())
  slope = float(((x - x_mean) * (y - y.mean())).sum() / sxx)
  intercept = float(y.mean() - slope * x_mean)
  dof = x.size - 2
  sse = float(((y - intercept - slope * x) ** 2).sum())
  return Line(slope, intercept, int(x.size), dof, sse / dof if dof > 0 else math.nan, x_mean, sxx)


def predict(line: Line, x0: float, n0: int = 1, level: float = LEVEL) -> dict:
  """The line's value at x0 and the t prediction interval for the mean of n0 new observations
  there (`interval` None without residual degrees of freedom)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  y0 = float(line(x0))
  if line.dof < 1:
    return {"predicted": y0, "interval": None, "dof": line.dof}
  se = math.sqrt(line.s2 * (1.0 / n0 + 1.0 / line.n + (x0 - line.x_mean) ** 2 / line.sxx))
  t = float(stats.t.ppf((1 + level) / 2, line.dof))
  return {"predicted": y0, "interval": [y0 - t * se, y0 + t * se], "dof": line.dof}


# ------------------------------------------------------------------------- lack of fit ---
def pure_error(x, y) -> tuple[float, int, int]:
  """(SS of each observation about its size's mean, its degrees of freedom n - m, m sizes)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  sizes = np.unique(x)
  ss = sum(float(((y[x == u] - y[x == u].mean()) ** 2).sum()) for u in sizes)
  return ss, int(x.size - sizes.size), int(sizes.size)


def lack_of_fit(x, y, fitted, n_params: int = 2) -> dict:
  """The F-test of a law (its `fitted` values at the observations, p parameters) against one mean
  per size. {"test", "F", "p", "dof": [m - p, n - m]}; "p" None with the reason when the test
  cannot run (no replicates, or no more sizes than parameters)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  ss_pe, dof_pe, m = pure_error(x, y)
  dof_lof = m - n_params
  out = {"test": LOF_TEST, "F": None, "p": None, "dof": [dof_lof, dof_pe]}
  if dof_pe < 1:
    return out | {"reason": "not testable: one observation per size (no replicates)"}
  if dof_lof < 1:
    return out | {"reason": f"not testable: {m} sizes for {n_params} parameters"}
  if ss_pe <= 0:
    return out | {"reason": "not testable: the replicates agree exactly (no pure error)"}
  sse = float(((y - np.asarray(fitted, np.float64)) ** 2).sum())
  f = max(sse - ss_pe, 0.0) / dof_lof / (ss_pe / dof_pe)
  return out | {"F": f, "p": float(stats.f.sf(f, dof_lof, dof_pe))}


def passes(lof: dict | None) -> bool:
  """The law's form survived its lack-of-fit test (which ran)."""
  return bool(lof) and lof.get("p") is not None and lof["p"] >= LOF_ALPHA


def reading(lof: dict | None, span: str) -> str:
  """What to call the exponent: "law" when its lack-of-fit test ran and passed, else "a slope over
  the sizes measured (`span`)" (failed or not testable: the p-value or the reason is printed
  beside it)."""
  return "law" if passes(lof) else f"a slope over the sizes measured ({span})"


# ------------------------------------------------------------------ leave one size out ---
@dataclasses.dataclass(frozen=True)
class Space:
  """How a law's y relates to its units: identity (probe scores) or log (losses, LR, batch)."""

  log: bool

  def to_units(self, y: float) -> float:
    return math.exp(y) if self.log else y


LOG, LINEAR = Space(True), Space(False)


def miss(predicted: float, measured: float) -> dict:
  """Predicted - measured, in the law's units and in % of the measured value, and the ratio."""
  return {
    "miss": predicted - measured,
    "miss_pct": 100.0 * (predicted - measured) / measured if measured else math.nan,
    "ratio": predicted / measured if measured else math.nan,
  }


def loo_line(x, y, labels, space: Space, level: float = LEVEL) -> list[dict]:
  """Each size (distinct x) left out in turn: the line through the rest predicts the mean of its
  observations; the predicted and measured values in the law's units, the miss, and whether the
  measured mean falls inside the prediction's t interval (None: no interval). `labels[i]` names
  observation i's size. Sizes whose rest has fewer than 2 distinct x are skipped."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  rows = []
  for x0 in np.unique(x):
    keep = x != x0
    if np.unique(x[keep]).size < 2:
      continue
    line = fit_line(x[keep], y[keep])
    n0 = int((~keep).sum())
    got = predict(line, float(x0), n0, level)
    y_meas = float(y[~keep].mean())
    iv = got["interval"]
    rows.append(
      {
        "size": labels[int(np.nonzero(~keep)[0][0])],
        "x": float(x0),
        "seeds": n0,
        "fitted_on": int(np.unique(x[keep]).size),
        "slope": line.slope,
        "predicted": space.to_units(got["predicted"]),
        "measured": space.to_units(y_meas),
        "interval": [space.to_units(v) for v in iv] if iv else None,
        "dof": got["dof"],
        "inside": (iv[0] <= y_meas <= iv[1]) if iv else None,
      }
      | miss(space.to_units(got["predicted"]), space.to_units(y_meas))
    )
  return rows


def line_backtest(x, y, labels, space: Space, span: str, level: float = LEVEL) -> dict:
  """A line law's leave-one-size-out rows, its lack-of-fit test and what to call its slope."""
  line = fit_line(x, y)
  lof = lack_of_fit(x, y, line(x), 2)
  return {
    "slope": line.slope,
    "loo": loo_line(x, y, labels, space, level),
    "lack_of_fit": lof,
    "is_law": passes(lof),
    "reading": reading(lof, span),
    "span": span,
    "level": level,
  }


# ---------------------------------------------------------------- the report's own laws ---
def _span(members: list[dict]) -> str:
  """'N 57.5k-787k' over the members' sizes (non-embedding parameters)."""
  n = [m["n_params"] for m in members]
  return f"N {_si(min(n))}-{_si(max(n))}"


def _si(v: float) -> str:
  return f"{v / 1e6:.3g}M" if v >= 1e6 else f"{v / 1e3:.3g}k"


def loss_backtest(members: list[dict]) -> dict | None:
  """L(C) = a C^alpha on every seed of one family (`members`: finished, compute > 0)."""
  if len({m["compute"] for m in members}) < 3:
    return None
  x = np.log([m["compute"] for m in members])  # ln FLOPs
  y = np.log([m["final_loss"] for m in members])  # ln nats
  return line_backtest(x, y, [m["size"] for m in members], LOG, _span(members))


def probe_backtest(members: list[dict], key: str) -> dict | None:
  """score = s0 + slope log10 C on every seed of one family that has probe `key`."""
  if len({m["compute"] for m in members}) < 3:
    return None
  x = np.log10([m["compute"] for m in members])  # decades of FLOPs
  y = np.array([m["probes"][key] for m in members])  # the probe's score
  return line_backtest(x, y, [m["size"] for m in members], LINEAR, _span(members))


def saturating_backtest(members: list[dict]) -> dict | None:
  """L(C) = e + b C^-beta on every seed (scaling.fit.fit_saturating): leave-one-size-out misses
  (no interval: a nonlinear fit) and the approximate F-test of its 3 parameters; None with fewer
  than 4 sizes."""
  from cbert_jax.scaling import fit as fit_lib  # pylint: disable=import-outside-toplevel

  c = np.array([m["compute"] for m in members])
  loss = np.array([m["final_loss"] for m in members])
  if np.unique(c).size < 4:
    return None
  with warnings.catch_warnings():  # 3 sizes fit 3 parameters exactly: no covariance, by design
    warnings.simplefilter("ignore")
    try:
      law = fit_lib.fit_saturating(c, loss)
    except (RuntimeError, ValueError) as e:
      return {"error": str(e)}
    rows = []
    for c0 in np.unique(c):
      keep = c != c0
      held = [m for m, k in zip(members, keep) if not k]
      measured = float(loss[~keep].mean())
      try:
        pred = float(fit_lib.fit_saturating(c[keep], loss[keep])(c0))
      except (RuntimeError, ValueError):
        continue
      rows.append(
        {
          "size": held[0]["size"],
          "x": float(c0),
          "seeds": len(held),
          "fitted_on": int(np.unique(c[keep]).size),
          "predicted": pred,
          "measured": measured,
          "interval": None,
          "inside": None,
        }
        | miss(pred, measured)
      )
  lof = lack_of_fit(c, loss, law(c), 3)
  lof["test"] += " (approximate: a nonlinear fit)"
  return {
    "beta": law.beta,
    "loo": rows,
    "lack_of_fit": lof,
    "is_law": passes(lof),
    "reading": reading(lof, _span(members)),
    "span": _span(members),
  }


def report_backtests(members: list[dict], archs, probes) -> dict:
  """{arch: {"loss", "saturating", "probes": {key: ...}}} over the finished members."""
  out = {}
  for arch in archs:
    ms = [m for m in members if m["arch"] == arch and m["finished"] and m["compute"] > 0]
    entry = {"loss": loss_backtest(ms), "saturating": saturating_backtest(ms), "probes": {}}
    for key in probes:
      with_key = [m for m in ms if m["probes"].get(key) is not None]
      got = probe_backtest(with_key, key)
      if got:
        entry["probes"][key] = got
    out[arch] = entry
  return out


# ------------------------------------------------------------- the grid's LR/batch laws ---
def profile_cost(points: list[tuple[float, float]], at: float) -> float | None:
  """The loss above a profile's minimum at `at`, read off tried points (x, loss) with x = ln LR or
  ln batch (loss +inf: diverged): between the lowest point's two neighbours, the parabola through
  the three (grid_vertex's; its vertex is the minimum); beyond them, straight lines between tried
  points. None outside the tried range, across a diverged point, or with fewer than 2 points."""
  from cbert_jax.report import grid_vertex  # pylint: disable=import-outside-toplevel

  pts = sorted(points)
  xs = np.array([p[0] for p in pts])
  ys = np.array([p[1] for p in pts])
  if xs.size < 2 or not xs[0] <= at <= xs[-1]:
    return None
  i = int(np.argmin(ys))
  floor = float(ys[i])
  if 0 < i < xs.size - 1 and np.isfinite(ys[i - 1 : i + 2]).all():
    x3, y3 = xs[i - 1 : i + 2], ys[i - 1 : i + 2]
    a, b, c = np.polyfit(x3, y3, 2)  # loss = a x^2 + b x + c through the three
    v = grid_vertex.vertex(x3, y3)
    floor = float(a * v**2 + b * v + c)
    if x3[0] <= at <= x3[2]:
      return float(a * at**2 + b * at + c) - floor
  j = int(np.searchsorted(xs, at, side="right")) - 1
  j = min(j, xs.size - 2)
  y0, y1 = ys[j], ys[j + 1]
  if not (np.isfinite(y0) and np.isfinite(y1)):
    return None
  w = (at - xs[j]) / (xs[j + 1] - xs[j])
  return float(y0 + w * (y1 - y0)) - floor


def lr_profile(opt) -> list[tuple[float, float]]:
  """(ln LR, loss) along the best member's batch row of one size's grid (`grid_read.Optimum`)."""
  b = opt.best.batch_size
  return [
    (math.log(m.lr), m.loss if m.state == "done" else math.inf)
    for m in opt.members
    if m.batch_size == b
  ]


def batch_profile(opt) -> list[tuple[float, float]]:
  """(ln batch tokens, the row's lowest loss over its LRs) per batch row of one size's grid."""
  best: dict[int, float] = {}
  for m in opt.members:
    loss = m.loss if m.state == "done" else math.inf
    best[m.batch_tokens] = min(best.get(m.batch_tokens, math.inf), loss)
  return [(math.log(b), y) for b, y in best.items()]


HPARAM_LAWS = (  # (laws field, optimum attribute, x attribute, profile)
  ("lr", "lr", "compute", lr_profile),
  ("batch_tokens", "batch_tokens", "compute", batch_profile),
  ("lr_n", "lr", "n_params", lr_profile),
  ("batch_tokens_n", "batch_tokens", "n_params", batch_profile),
)


def hparam_law_backtest(optima: list, target: str, axis: str, profile) -> dict:
  """One grid law (y = `target` optimum vs x = `axis`) left one size out at a time: the law's and
  the best constant's predictions, misses and loss cost at the held-out size."""
  x = np.log([getattr(o.best, axis) for o in optima])  # ln FLOPs or ln N
  y = np.log([getattr(o, target) for o in optima])  # ln LR or ln batch tokens
  labels = [o.best.size for o in optima]
  span = _span([{"n_params": o.best.n_params} for o in optima])
  out = line_backtest(x, y, labels, LOG, span)
  for row in out["loo"]:
    keep = x != row["x"]
    opt = optima[int(np.nonzero(~keep)[0][0])]  # the held-out size's grid
    const = float(np.exp(y[keep].mean()))  # the best constant on the other sizes
    prof = profile(opt)
    row["constant"] = const
    row["constant_ratio"] = const / row["measured"]
    row["cost_law"] = profile_cost(prof, math.log(row["predicted"]))
    row["cost_constant"] = profile_cost(prof, math.log(const))
  out["constant_all"] = float(np.exp(y.mean()))
  return out


def hparam_backtest(grid_dir: str, provenance: dict, members=None) -> dict:
  """The laws file's fit redone on `grid_dir` (its provenance's model filter, exclusions, optimum
  method and metric), then every law backtested; "error" when the grid does not give them.
  `members`: the grid already read with the full-split loss (reused when that is the laws'
  metric)."""
  from cbert_jax.report import grid as grid_lib  # pylint: disable=import-outside-toplevel
  from cbert_jax.report.grid_read import GridError, read_grid  # pylint: disable=import-outside-toplevel

  metric = provenance.get("metric", "val_full")
  try:
    if members is None or metric != "val_full":
      members = read_grid(grid_dir, metric)
    optima, _, _ = grid_lib.select(
      members,
      provenance.get("model_filter", "all"),
      provenance.get("excluded", []),
      provenance.get("optimum", "vertex"),
    )
  except (GridError, ValueError) as e:
    return {"error": str(e), "grid": grid_dir}
  return {
    "grid": grid_dir,
    "sizes": [o.best.size for o in optima],
    "laws": {
      field: hparam_law_backtest(optima, target, axis, profile)
      for field, target, axis, profile in HPARAM_LAWS
    },
  }
