"""The scaling report's text for the backtests (`report.backtest`): the two cells the fits tables
print beside each exponent, the section with every held-out size, and the grid laws' table with
the best constant beside the law."""

from __future__ import annotations

import math

from cbert_jax.report.backtest import LEVEL, LOF_ALPHA, LOF_TEST

LOSS_UNIT = "nats"


def _pct(v: float) -> str:
  return f"{v:+.1f}%"


def _inside(row: dict) -> str:
  return "-" if row["inside"] is None else "in" if row["inside"] else "OUT"


def p_cell(bt: dict | None) -> str:
  """'p = 0.012 (F = 16.2, 2 and 4 dof)', or why there is no test."""
  if not bt or "lack_of_fit" not in bt:
    return "- (not backtested: needs 3 sizes)" if not bt else f"- ({bt.get('error', 'no fit')})"
  lof = bt["lack_of_fit"]
  if lof["p"] is None:
    return f"- ({lof['reason']})"
  return f"p = {lof['p']:.2g} (F = {lof['F']:.3g}, {lof['dof'][0]} and {lof['dof'][1]} dof)"


def miss_cell(bt: dict | None, relative: bool) -> str:
  """Each held-out size's miss, % (`relative`) or in the law's units, with in/OUT of its 90%
  interval: 'd32L2 +5.3% OUT, d64L2 -2.1% in, ...'; '-' without a backtest."""
  if not bt or not bt.get("loo"):
    return "- (not backtested: needs 3 sizes)" if not bt else "-"
  parts = []
  for r in bt["loo"]:
    m = _pct(r["miss_pct"]) if relative else f"{r['miss']:+.3f}"
    parts.append(f"{r['size']} {m}" + ("" if r["inside"] is None else f" {_inside(r)}"))
  return ", ".join(parts)


def reads_as(bt: dict | None) -> str:
  """'law' or 'slope over N ...' (the wording the report must use for the exponent)."""
  if not bt or "reading" not in bt:
    return "a slope (not backtested: needs 3 sizes)"
  return bt["reading"]


def method_lines(level: float = LEVEL) -> list[str]:
  pct = int(round(100 * level))
  return [
    "Each law is refitted on all sizes but one and predicts the size left out, by least squares "
    "on every seed of the other sizes (the same line as the fit on seed means when each size has "
    f"every seed). Interval: the {pct}% t prediction interval for the mean of the held-out "
    "size's seeds, yhat +- t(n-2) s sqrt(1/n0 + 1/n + (x0 - xbar)^2 / Sxx), in log space for "
    "the loss (exact under Gaussian errors about the line; none with 2 training points). Lack "
    f"of fit: the {LOF_TEST} (F(m-p, n-m), m sizes, p parameters; approximate for the "
    "saturating law, which is nonlinear). An exponent is called a law only when that test runs "
    f"and passes (p >= {LOF_ALPHA:g}); otherwise it is a slope over the sizes measured, not a "
    "law to extrapolate.",
    "",
  ]


def _law_rows(arch: str, law: str, exponent: str, bt: dict, unit: str):
  """One table row per held-out size of one law; the law's own cells on its first row only."""
  rows = []
  for i, r in enumerate(bt["loo"]):
    iv = r["interval"]
    pred = f"{r['predicted']:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else " (-)")
    head = " | ".join([arch, law, exponent, p_cell(bt), reads_as(bt)] if i == 0 else [""] * 5)
    rows.append(
      f"| {head} | {r['size']} | {r['fitted_on']} | {pred} | {r['measured']:.3f} | "
      f"{r['miss']:+.3f}{unit} | {_pct(r['miss_pct'])} | {_inside(r)} |"
    )
  return rows


def section(backtests: dict, loss_fits: dict, probe_fits: dict) -> list[str]:
  """The report's section on the loss and probe laws' backtests."""
  if not backtests:
    return []
  lines = ["## Backtests: each law fitted on all sizes but one", ""] + method_lines()
  lines += [
    "| arch | law | exponent / slope (all sizes) | lack of fit | reads as | held out | sizes "
    f"fitted | predicted [{int(round(100 * LEVEL))}% t] | measured (seed mean) | miss | miss % "
    "| inside |",
    "|" + "---|" * 12,
  ]
  for arch, e in backtests.items():
    lf = loss_fits.get(arch)
    if e.get("loss") and lf:
      alpha = f"C^{lf['power_law']['alpha']:.4f}"
      lines += _law_rows(arch, "val loss, a C^alpha", alpha, e["loss"], f" {LOSS_UNIT}")
    sat = e.get("saturating")
    if sat and "loo" in sat:
      beta = f"beta {sat['beta']:.4f}"
      lines += _law_rows(arch, "val loss, e + b C^-beta", beta, sat, f" {LOSS_UNIT}")
    for key, bt in e.get("probes", {}).items():
      slope = probe_fits.get(arch, {}).get(key, {}).get("slope_per_decade", math.nan)
      lines += _law_rows(arch, f"{key}, s0 + slope log10 C", f"{slope:+.4f}/decade", bt, "")
  lines += [
    "",
    "Measured: the seed mean of the held-out size in the fit's space (for the loss, the "
    "geometric mean over seeds, the mean of log loss the power law is fitted to). The saturating "
    "law has no interval (a nonlinear fit); '-' in 'inside' means no interval.",
    "",
  ]
  return lines


# ------------------------------------------------------------------ the grid's laws ---
LAW_LABELS = {
  "lr": ("lr*", "C"),
  "batch_tokens": ("B* (tokens)", "C"),
  "lr_n": ("lr*", "N"),
  "batch_tokens_n": ("B* (tokens)", "N"),
}


def _cost(v: float | None) -> str:
  return "- (outside the grid)" if v is None else f"{v:+.3f}"


def _value(v: float, field: str) -> str:
  return f"{v:.3g}" if field.startswith("lr") else f"{v:,.0f}"


def hparam_miss_cell(bt: dict | None) -> str:
  """'d64L2 1.23x (+0.025 nats), ...': the law's prediction / the optimum, and its loss cost."""
  if not bt or not bt.get("loo"):
    return "-"
  return ", ".join(f"{r['size']} {r['ratio']:.2f}x ({_cost(r['cost_law'])})" for r in bt["loo"])


def hparam_section(entry: dict) -> list[str]:
  """The grid laws' backtests for one laws file (`entry["backtest"]`: backtest.hparam_backtest)."""
  hb = entry.get("backtest")
  if not hb:
    return []
  if "error" in hb:
    return [f"Backtests: not run ({hb['error']}).", ""]
  lines = []
  if hb.get("mismatch"):
    lines += [
      f"The grid given does not reproduce this laws file ({'; '.join(hb['mismatch'])}): the "
      "backtests below are those of the grid's own fit.",
      "",
    ]
  lines += [
    f"Backtests (the fit redone on {hb['grid']}: sizes {', '.join(hb['sizes'])}; each size left "
    "out in turn). 'law': the law fitted on the other sizes; 'constant': the best constant on "
    "the other sizes (their optima's geometric mean: the law with exponent 0). Loss cost at the "
    "held-out size, read off its grid: for an LR along the best member's batch row, for a batch "
    "along the rows' best losses (the LR re-tuned per row); the parabola through the best grid "
    "point and its two neighbours (grid_vertex's, minimum at its vertex) between those "
    "neighbours, straight lines between tried points beyond them, '-' outside the grid. No "
    "interval: 2 training points leave no residual.",
    "",
    "| law | exponent (all sizes) | reads as | held out | optimum | law predicts | x optimum "
    "| loss cost | constant | x optimum | loss cost |",
    "|" + "---|" * 11,
  ]
  for field, bt in hb["laws"].items():
    what, x = LAW_LABELS[field]
    for i, r in enumerate(bt["loo"]):
      head = " | ".join(
        [f"{what} vs {x}", f"{bt['slope']:+.3f}", reads_as(bt)] if i == 0 else [""] * 3
      )
      lines.append(
        f"| {head} | {r['size']} | "
        f"{_value(r['measured'], field)} | {_value(r['predicted'], field)} | {r['ratio']:.2f}x | "
        f"{_cost(r['cost_law'])} | {_value(r['constant'], field)} | {r['constant_ratio']:.2f}x "
        f"| {_cost(r['cost_constant'])} |"
      )
  lines += [""] + [summary(field, bt) for field, bt in hb["laws"].items()] + [""]
  return lines


def _cost_range(values: list[float | None]) -> str:
  got = [v for v in values if v is not None]
  if not got:
    return "not readable"
  out = f"{min(got):.3f}-{max(got):.3f} {LOSS_UNIT}"
  return out + (f" ({len(values) - len(got)} outside the grid)" if len(got) < len(values) else "")


def summary(field: str, bt: dict) -> str:
  """One line per law: its misses and the loss they cost, the constant's beside them."""
  what, x = LAW_LABELS[field]
  rows = bt["loo"]
  if not rows:
    return f"* {what} vs {x}: no backtest (fewer than 3 sizes)."
  ratios = [r["ratio"] for r in rows]
  consts = [r["constant_ratio"] for r in rows]
  return (
    f"* {what} vs {x}: left out, each size's optimum is predicted {min(ratios):.2f}-"
    f"{max(ratios):.2f}x by the law (loss cost {_cost_range([r['cost_law'] for r in rows])}) and "
    f"{min(consts):.2f}-{max(consts):.2f}x by the best constant (loss cost "
    f"{_cost_range([r['cost_constant'] for r in rows])}); lack of fit: {p_cell(bt).lstrip('- ')}"
    "."
  )
