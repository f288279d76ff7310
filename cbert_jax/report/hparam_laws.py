"""The scaling report's hyperparameter-law section: the laws the sweep's members took their LR and
batch from, with both intervals, the range they were fitted on, any overridden check and its
reason, and their plots (copied next to the report).

A member records `sweep.laws` (a file, "shipped:<name>", or "" for the published defaults; with
"{model}" standing for its family) and `sweep.laws_source`; a member whose LR and batch were both set
by hand (`sweep.lr`, `sweep.batch_size`: the grid, the CMS experiment) used no law.
"""

from __future__ import annotations

import os
import shutil

from cbert_jax.errors import ConfigError
from cbert_jax.report import backtest, backtest_text, lawcheck
from cbert_jax.report.grid import plot_paths
from cbert_jax.scaling import laws as laws_lib

# (law field, what it is, x) in the order the table shows them
LAWS = (
  ("lr", "lr*", "C"),
  ("batch_tokens", "B* (tokens)", "C"),
  ("lr_n", "lr*", "N"),
  ("batch_tokens_n", "B* (tokens)", "N"),
)


def used(members: list[dict]) -> dict[str, list[str]]:
  """{laws spec as the members resolved it ("shipped:cpu-bert", a path, "" = defaults): the
  families that used it}, over the members that took their LR or batch from a law."""
  out: dict[str, list[str]] = {}
  for m in members:
    if m.get("laws_spec") is None:  # LR and batch both set by hand
      continue
    fams = out.setdefault(m["laws_spec"], [])
    if m["arch"] not in fams:
      fams.append(m["arch"])
  return out


def _ci(ci) -> str:
  return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-"


def describe(spec: str, families: list[str], grid_dir=None, grid_members=None) -> dict:
  """One laws file as the report shows it: its laws, fitted range, checks and plots; with a grid
  (`grid_dir`, its members when already read; else the grid its provenance names, when that
  directory exists), its leave-one-size-out backtests."""
  entry = {"spec": spec, "families": families, "file": None, "error": None}
  try:
    path = laws_lib.resolve_path(spec) if spec else ""
    laws = laws_lib.load(path)
  except ConfigError as e:  # a file that has moved since the sweep ran: its source is all we have
    entry["error"] = str(e)
    return entry
  entry["file"] = path or None
  entry["source"] = laws.source
  entry["laws"] = {
    field: getattr(laws, field).to_dict() for field, _, _ in LAWS if getattr(laws, field)
  }
  span = laws_lib.fitted_range(laws, "compute")
  entry["fitted_compute"] = list(span) if span else None
  entry["overridden"] = list(laws.overridden)
  entry["override_reason"] = laws.override_reason
  entry["tokens_per_param"] = laws.tokens_per_param  # the grid's budget (None: not recorded)
  # [file, suffix of its copy]: the laws plot (.png) and the grid plot (_grid.png), if they exist
  pairs = zip(plot_paths(path), (".png", "_grid.png")) if path else ()
  entry["plots"] = [[p, suffix] for p, suffix in pairs if os.path.exists(p)]
  if not grid_dir:  # the grid the laws file says it was fitted on, if it is still there
    grid_members = None
    grid_dir = next(
      (g for g in (laws.provenance.get(k) for k in ("grid", "grid_abs")) if g and os.path.isdir(g)),
      None,
    )
  if grid_dir and laws.provenance.get("runs"):  # a fitted laws file, not the published defaults
    entry["backtest"] = backtest.hparam_backtest(grid_dir, laws.provenance, grid_members)
    entry["backtest"]["mismatch"] = _mismatch(entry["backtest"], entry["laws"])
  return entry


def _mismatch(hb: dict, laws: dict) -> list[str]:
  """The laws whose exponent the grid's refit does not reproduce (then the backtests are those of
  the grid's own fit, not of the laws file's)."""
  return [
    f"{field}: {bt['slope']:+.4f} from the grid, {laws[field]['alpha']:+.4f} in the file"
    for field, bt in hb.get("laws", {}).items()
    if field in laws and abs(bt["slope"] - laws[field]["alpha"]) > 1e-6 * max(1.0, abs(bt["slope"]))
  ]


def budget_line(entry: dict, members: list[dict]) -> str:
  """The bullet comparing the budget the laws' grid trained at with the budgets of the members
  that used them ("" when the laws file does not record it); more than BUDGET_TOLERANCE apart is
  called out: the optimal batch and LR move with the budget."""
  fitted = entry.get("tokens_per_param")
  if not fitted:
    return ""
  budgets = sorted(
    {m["tokens_per_param"] for m in members if m.get("laws_spec") == entry["spec"]} - {0.0}
  )
  text = f"* Fitted on a grid trained at {fitted:g} tokens per parameter"
  if budgets:
    text += f"; the members that used it train at {', '.join(f'{b:g}' for b in budgets)}"
    if any(laws_lib.budgets_apart(fitted, b) for b in budgets):
      text += (
        f", more than {laws_lib.BUDGET_TOLERANCE:g}x away: the optimal batch and LR move with the "
        "budget, so these laws were used outside the budget they were measured at"
      )
  return text + "."


def section(
  members: list[dict], out_dir: str, grid_dir=None, grid_members=None, lawchecks=()
) -> tuple[list[str], list[dict]]:
  """The markdown lines of the section and its entries (report.json); each laws file's plots are
  copied into `out_dir` as laws_<name>.png and embedded. With the grid the laws were fitted on
  (`grid_dir`; `grid_members` when already read), each law's leave-one-size-out misses, loss costs
  and the best constant's beside them. `lawchecks`: checks of laws where the sweep used them
  (`lawcheck.load`), each shown under the laws it checked."""
  entries = [
    describe(spec, fams, grid_dir, grid_members) for spec, fams in sorted(used(members).items())
  ]
  if not entries:
    return [], []
  lines = [
    "## Hyperparameter laws",
    "",
    "Where each family's LR and batch came from: lr* = a x^alpha and B* = b x^beta, x = C "
    "(training FLOPs; the sweep's axis) or N; 90% intervals of the exponent from the exact "
    "bootstrap over the grid's sizes and from the t-distribution.",
    "",
  ]
  for e in entries:
    name = e["spec"] or "published defaults"
    lines.append(f"**{name}** (used by {', '.join(e['families'])})")
    lines.append("")
    if e["error"]:
      lines += [f"Not readable now ({e['error']}); the members record only its source.", ""]
      continue
    # the override and its reason get a line of their own below
    lines += [f"Source: {e['source'].split(laws_lib.OVERRIDDEN_MARK)[0]}.", ""]
    bts = (e.get("backtest") or {}).get("laws", {})
    lines += [
      "| law | a | exponent | 90% bootstrap | 90% t | sizes | leave one size out: law / "
      "optimum (loss cost, nats) | lack of fit | reads as |",
      "|---|---|---|---|---|---|---|---|---|",
    ]
    for field, what, x in LAWS:
      law = e["laws"].get(field)
      if law:
        bt = bts.get(field)
        lines.append(
          f"| {what} vs {x} | {law['a']:.4g} | {law['alpha']:+.3f} | {_ci(law['alpha_ci'])} | "
          f"{_ci(law['alpha_t_ci'])} | {law['n_points'] or '-'} | "
          f"{backtest_text.hparam_miss_cell(bt) if bt else '- (no grid: --grid)'} | "
          f"{backtest_text.p_cell(bt) if bt else '-'} | "
          f"{backtest_text.reads_as(bt) if bt else 'a slope (not backtested)'} |"
        )
    lines.append("")
    lines += backtest_text.hparam_section(e)
    if e["fitted_compute"]:
      lo, hi = e["fitted_compute"]
      text = f"Fitted on C {lo:.3g}-{hi:.3g}"
      used_c = [m["compute"] for m in members if m.get("laws_spec") == e["spec"]]
      used_c = [c for c in used_c if c > 0]
      if used_c:
        e["used_compute"] = [min(used_c), max(used_c)]
        text += (
          f"; the members that used it train at C {min(used_c):.3g}-{max(used_c):.3g} "
          f"({max(used_c) / hi:.2g}x the largest fitted C at most)"
        )
      lines.append(f"* {text}.")
    budget = budget_line(e, members)
    if budget:
      lines.append(budget)
    checked = [c for c in (lawcheck.for_spec(c, e["spec"]) for c in lawchecks) if c]
    e["lawchecks"] = [
      {"dir": c["dir"], "status": {f"{g['arch']} {g['size']}": g["status"] for g in c["groups"]}}
      for c in checked
    ]
    lines += [lawcheck.summary_line(c) for c in checked]
    if e["overridden"]:
      lines.append(
        f"* Refused by default; fitted with check(s) {', '.join(e['overridden'])} overridden "
        f"(reason: {e['override_reason']})."
      )
    lines.append("")
    # laws_<file stem>.png and laws_<file stem>_grid.png (the laws and the grid they came from)
    stem = os.path.splitext(os.path.basename(e["spec"].split(":")[-1]))[0]
    copied = []
    for p, suffix in e["plots"]:
      dst = os.path.join(out_dir, f"laws_{stem}{suffix}")
      shutil.copyfile(p, dst)
      copied.append(os.path.basename(dst))
      lines.append(f"![{os.path.basename(dst)}]({os.path.basename(dst)})")
    e["plots_copied"] = copied
    if copied:
      lines.append("")
  return lines, entries
