r"""Fit the hyperparameter laws from a finished batch-size x LR grid (SPEC §5).

  python -m cbert_jax.report.grid fit --grid runs/hparam_grid_cpu \
      [--out FILE] [--model bert|crossbert|all] [--bootstrap 10000] [--seed 0] \
      [--metric val_full|eval_loss] [--exclude arch:size,...] [--allow_few_sizes] [--allow_edges]
      [--allow_implausible --override_reason TEXT] [--optimum vertex|argmin]

Reads every member workdir under `--grid` (the subdirectories with a config.json, as
`experiments/hparam_grid.py` run by `python -m cbert_jax.main` leaves them): the member's resolved
config (model, size, N = `sweep.n_params`, compute C = `sweep.compute`, rows, seq_len, peak LR,
total_steps), its metrics.jsonl and its final validation loss (`--metric`, `grid_read.METRICS`):
`val_full` (default), the full-split loss `cbert_jax.run.validation` writes at the end of a run (with
masks from a fixed key, identical for every member; backfill older runs with `python -m
cbert_jax.run.validation --root GRID`), or `eval_loss`, the trainer's eval/loss on the first rows of
the split (biased and batch-dependent; for grids from before val_full). Then:
  * members whose last logged step is short of total_steps are skipped, with a warning listing
    them; a member that diverged (non-finite loss, or a FAILED file saying so) stays in the grid
    as a loss of +inf: it bounds the grid, it is never the best;
  * members that differ only in their seed are one grid point whose loss is their mean
    (`grid_read.pool_seeds`; +inf when a seed diverged), named by their names joined with "+";
  * per (model, size), the member with the lowest final validation loss is the best grid point;
    the optimum (B*, lr*) is located around it (`--optimum`, `grid_vertex`): by default the vertex
    of a parabola in log lr through it and its LR neighbours in its batch row, and of one in log B
    through the best losses of its row and the neighbouring rows (a factor-2 grid's best point is
    up to a factor sqrt(2) off on each axis, too coarse for the exponents measured); `argmin`
    takes the grid point itself. B* in tokens = rows x seq_len; `--exclude arch:size` leaves a
    size out (recorded in laws.json and the laws' source), for a size whose optimum sits on an
    edge no grid can widen: a batch of 1 row (the refusal says so);
  * lr* = a C^alpha and B* = b C^beta by least squares in log space (`fit.fit_power_law_ci`: 90%
    percentile-bootstrap intervals, exact over every distinct resample up to 10 sizes, else
    `--bootstrap` draws; and 90% t-intervals beside them), and the same against N; `--model all`
    (default) pools both architectures' optima into one law, `--model bert|crossbert` fits one;
  * refuses (one line naming every failed check and its override flag, exit 2, nothing written)
    a fit that fails a check, unless that check is overridden (`CHECKS`):
      few_sizes    fewer than 3 sizes (optima with distinct C and N): a line through 2 points has
                   no residual, its bootstrap interval is a point and its t-interval undefined;
                   override: --allow_few_sizes
      edges        a size whose optimum is at the lowest or highest batch its grid tried, or at
                   the lowest or highest LR tried at its batch (or whose grid tried only one):
                   the true optimum may lie outside (widen the grid); a diverged member beyond
                   the best bounds the grid; --allow_edges
      implausible  an exponent outside `EXPONENT_BOUNDS` (below); --allow_implausible
    an override needs `--override_reason` (why, kept in `provenance["override_reason"]`); an
    overridden check is recorded in laws.json (`overridden`, and `provenance["checks"]`), in
    the laws' `source`, and loading such a file for a sweep logs a warning with the reason;
  * writes the laws (`laws.HyperLaws`, `laws.save`) to `--out` (default `<grid>/laws.json`) with
    provenance -- the grid directory, the runs used (name, size, C, N, chosen B and lr, loss),
    the runs skipped and why, the models pooled, the checks and exponent bounds, when -- and
    `source` "fit: <grid> ([<model>, ]<n> sizes), <date>"; draws `<out dir>/laws.png`
    (`<stem>.png` for an --out not named laws.json; log-log: lr* and B* against C and N, fitted
    lines with bootstrap bands, every grid point coloured by its loss above its size's best) and
    `grid.png` (per size, final validation loss against LR, one line
    per batch size; `<stem>_grid.png`); prints a table.

Exponent bounds (`EXPONENT_BOUNDS`), fixed from the literature before looking at any grid:
  * lr*(C) exponent in [-0.5, 0]. The optimal LR should not grow with compute: DeepSeek LLM (Bi et
    al. 2024, arXiv 2401.02954) fit lr* ∝ C^-0.125 (Porian et al. 2024, arXiv 2406.19146, fit
    optimal-LR and batch laws of the same power-law form). The steepest fall theory suggests is
    Adam's 1/width rule for hidden weights (muP, Yang et al. 2022): width grows at most as N^1/2
    (at a fixed depth; N^1/3 at a fixed aspect ratio), and C ∝ N^2 at the sweep's fixed tokens
    per parameter, so lr ∝ C^-1/4 at the steepest; -0.5 leaves twice that.
  * B*(C) exponent in [0, 0.6]. The optimal batch should not shrink with compute: DeepSeek LLM fit
    B* ∝ C^0.327 (tokens); Kaplan et al. (2020)'s critical batch B_crit ∝ L^(-1/0.21) with
    L ∝ C^-0.050 gives about C^0.24. At a fixed tokens per parameter D ∝ C^1/2, so beta = 0.5
    already keeps the number of steps D/B constant as compute grows; 0.6 allows 0.1 of noise
    above that, past which bigger runs would take markedly fewer steps.
  * Against N (law_axis=params): C ∝ N^2 at fixed tokens per parameter, so the same bounds
    doubled: lr*(N) in [-1, 0], B*(N) in [0, 1.2].
  The check is on the point estimate; both intervals are printed beside it.

The sweep reads the file through `sweep.laws` (`cbert_jax.scaling.plan` loads it for every member):

  python -m cbert_jax.main --config experiments/sweep.py:cpu \
      --config.sweep.laws=runs/hparam_grid_cpu/laws.json [--config.sweep.law_axis=params]

(`law_axis=params` uses the fits against N.) Until a fit exists the sweep uses the shipped
defaults, DeepSeek LLM's laws (`laws.DEFAULT`; its `source` says so). Bad input (no such
directory, no member workdirs, fewer than 2 complete sizes, a refused fit) is one line naming the
path, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Collection

import numpy as np

from cbert_jax.report import grid_vertex
from cbert_jax.report.grid_plot import draw, draw_curves
from cbert_jax.report.grid_read import METRICS, GridError, Member, Optimum, pool_seeds, read_grid
from cbert_jax.scaling import fit as fit_lib
from cbert_jax.scaling import laws as laws_lib

CI_LEVEL = fit_lib.LEVEL  # the intervals' level (bootstrap and t)
MIN_SIZES = 3  # sizes a law needs (check few_sizes)
# Plausible exponents per law (check implausible); the module docstring gives the reasons.
EXPONENT_BOUNDS = {
  "lr": (-0.5, 0.0),
  "batch_tokens": (0.0, 0.6),
  "lr_n": (-1.0, 0.0),
  "batch_tokens_n": (0.0, 1.2),
}
LAW_NAMES = {"lr": "lr*(C)", "batch_tokens": "B*(C)", "lr_n": "lr*(N)", "batch_tokens_n": "B*(N)"}
# The refusal checks and the CLI flag that overrides each.
CHECKS = {
  "few_sizes": "--allow_few_sizes",
  "edges": "--allow_edges",
  "implausible": "--allow_implausible",
}
MODELS = ("bert", "crossbert")
LAWS_FILE, PLOT_FILE, CURVES_FILE = "laws.json", "laws.png", "grid.png"


@dataclasses.dataclass
class FitResult:
  """What fit_grid wrote and why: the laws, the optima they rest on, what was skipped."""

  laws: laws_lib.HyperLaws
  optima: list[Optimum]
  skipped: list[Member]
  warnings: list[str]
  laws_path: str
  plot_path: str | None


# ---------------------------------------------------------------------------------- fits ---
def edges_of(best: Member, grid: list[Member]) -> list[str]:
  """Where `best` touches the edge of its size's grid: the lowest/highest batch tried, or the
  lowest/highest LR tried at its own batch. The LR edge is judged within the best member's row
  because lr* is located along that row (`grid_vertex`); a grid whose rows try different LRs (the
  cpu grid's added rows) can put the best at its row's lowest LR while another row tried lower."""
  out = []
  row = [m.lr for m in grid if m.batch_size == best.batch_size]
  for label, value, values in (
    ("lr", best.lr, row),
    ("batch", best.batch_size, [m.batch_size for m in grid]),
  ):
    if len(set(values)) < 2:
      out.append(f"only one {label} tried")
    elif value <= min(values):
      floor = label == "batch" and value == 1  # 1 row: no grid can go lower
      out.append(f"lowest {label}" + (" (1 row, the smallest batch there is)" if floor else ""))
    elif value >= max(values):
      out.append(f"highest {label}")
  return out


def select(
  members: list[Member], model: str = "all", exclude: Collection[str] = (), optimum: str = "vertex"
) -> tuple[list[Optimum], list[Member], list[str]]:
  """(the optimum of every (arch, size) with a done member, the members skipped, warnings).
  `exclude`: "arch:size" names left out of the fit (`--exclude`). `optimum`: how each size's
  (lr*, B*) is located from its best member (`grid_vertex.METHODS`)."""
  chosen = [m for m in members if model == "all" or m.model == model]
  if not chosen:
    raise GridError(
      f"--model {model}: the grid has no {model} members (it has "
      f"{', '.join(sorted({m.model for m in members}))})"
    )
  present = {f"{m.arch}:{m.size}" for m in chosen}
  unknown = sorted(set(exclude) - present)
  if unknown:
    raise GridError(
      f"--exclude: {', '.join(unknown)} not in the grid (its sizes: {', '.join(sorted(present))})"
    )
  chosen = [m for m in chosen if f"{m.arch}:{m.size}" not in set(exclude)]
  chosen = pool_seeds(chosen)  # one point per (size, rows, LR): its seeds' mean loss
  skipped = [m for m in chosen if m.state in ("unfinished", "failed")]
  warnings = []
  if skipped:
    warnings.append(
      f"{len(skipped)} unfinished member(s) skipped: "
      + ", ".join(f"{m.name} ({m.reason})" for m in skipped)
    )
  groups: dict[tuple[str, str], list[Member]] = {}
  for m in chosen:
    if m.state in ("done", "diverged"):
      groups.setdefault((m.arch, m.size), []).append(m)
  optima, empty = [], []
  for (arch, size), grid in groups.items():
    done = [m for m in grid if m.state == "done"]
    if not done:
      empty.append(f"{arch} {size}")
      continue
    best = min(done, key=lambda m: m.loss)
    edges = edges_of(best, grid)
    if edges:
      warnings.append(
        f"{arch} {size}: the best run {best.name} (B {best.batch_size} rows, "
        f"lr {best.lr:.3g}) is at the {' and '.join(edges)} of its grid; the "
        "optimum may lie outside it (widen the grid and rerun)"
      )
    where = grid_vertex.locate(best, grid, optimum)
    optima.append(
      Optimum(
        best=best,
        members=sorted(grid, key=lambda m: (m.batch_size, m.lr)),
        edges=edges,
        lr=where.lr,
        batch_tokens=where.batch_tokens,
        how=where.how,
      )
    )
  if empty:
    warnings.append(f"no finished member (all diverged) at: {', '.join(empty)}")
  optima.sort(key=lambda o: (o.best.compute, o.best.arch))
  return optima, skipped, warnings


def _fit_axis(x, y, n_boot: int, seed: int) -> fit_lib.PowerLaw:
  return fit_lib.fit_power_law_ci(x, y, n=n_boot, seed=seed, level=CI_LEVEL)


def _describe(o: Optimum) -> str:
  b = o.best
  return f"{b.arch} {b.size} (B {b.batch_size} rows, lr {b.lr:.3g}: {' and '.join(o.edges)})"


def checks(optima: list[Optimum], fits: dict[str, fit_lib.PowerLaw]) -> dict[str, str]:
  """{check: what failed} for every refusal check (`CHECKS`) the fit fails."""
  failed = {}
  sizes = min(
    len(optima), len({o.best.compute for o in optima}), len({o.best.n_params for o in optima})
  )
  if sizes < MIN_SIZES:
    failed["few_sizes"] = (
      f"the laws rest on {sizes} sizes ({', '.join(f'{o.best.arch} {o.best.size}' for o in optima)}"
      f"); need at least {MIN_SIZES} for a slope with an interval"
    )
  edged = [o for o in optima if o.edges]
  if edged:
    failed["edges"] = (
      f"{len(edged)} size(s) with the optimum on an edge of the grid: "
      + ", ".join(map(_describe, edged))
      + "; the optimum may lie outside (widen the grid and rerun)"
    )
  bad = [
    f"{LAW_NAMES[k]} exponent {fits[k].alpha:+.3f} outside [{lo:g}, {hi:g}]"
    for k, (lo, hi) in EXPONENT_BOUNDS.items()
    if k in fits and not lo <= fits[k].alpha <= hi
  ]
  if bad:
    failed["implausible"] = "implausible exponents: " + ", ".join(bad)
  return failed


def fit_grid(
  grid: str,
  out: str | None = None,
  model: str = "all",
  n_boot: int = fit_lib.N_DRAWS,
  seed: int = 0,
  plot: bool = True,
  command: str = "",
  allow: Collection[str] = (),
  metric: str = "val_full",
  exclude: Collection[str] = (),
  optimum: str = "vertex",
  override_reason: str = "",
) -> FitResult:
  """Reads the grid, fits the laws, writes laws.json (and laws.png); see the module docstring.
  `n_boot`: bootstrap draws when the exact bootstrap is too large (0 = no bootstrap). `allow`:
  the refusal checks (`CHECKS`) to override; a failed check not in it raises GridError before
  anything is written. `command`: how it was invoked, for the provenance (the CLI passes its
  command line). `metric`: the final validation loss members are judged by (`grid_read.METRICS`).
  `exclude`: "arch:size" sizes left out (recorded in the provenance and the source). `optimum`:
  how each size's (lr*, B*) is located (`grid_vertex.METHODS`: between grid points, or the best
  grid point). `override_reason`: why the checks in `allow` may be overridden, required with
  them (an override is a decision, and the laws file keeps its reason)."""
  unknown = sorted(set(allow) - set(CHECKS))
  if unknown:
    raise ValueError(f"allow: unknown check(s) {unknown}; known: {sorted(CHECKS)}")
  if allow and not override_reason.strip():
    raise ValueError(
      f"override_reason: overriding check(s) {sorted(allow)} needs a reason (--override_reason), "
      "kept in the laws file"
    )
  if override_reason.strip() and not allow:
    raise ValueError("override_reason: given without a check to override (--allow_*)")
  if metric not in METRICS:
    raise ValueError(f"metric: expected one of {sorted(METRICS)}, got {metric!r}")
  if optimum not in grid_vertex.METHODS:
    raise ValueError(f"optimum: expected one of {grid_vertex.METHODS}, got {optimum!r}")
  members = read_grid(grid, metric)
  exclude = sorted(set(exclude))
  optima, skipped, warnings = select(members, model, exclude, optimum)
  grid_abs = os.path.abspath(grid)
  if (
    len(optima) < 2
    or len({o.best.compute for o in optima}) < 2
    or len({o.best.n_params for o in optima}) < 2
  ):
    have = ", ".join(f"{o.best.arch} {o.best.size}" for o in optima) or "none"
    raise GridError(
      f"--grid {grid!r}: {len(optima)} size(s) complete ({have}; "
      f"{len(skipped)} member(s) unfinished); need at least 2 sizes with a finished "
      "member to fit a law"
    )
  defs = sorted({o.best.n_definition for o in optima})
  if len(defs) > 1:
    raise GridError(
      f"--grid {grid!r}: members count N differently ({', '.join(defs)}); fit "
      "grids with one sweep.n_definition"
    )
  budgets = sorted({m.tokens_per_param for o in optima for m in o.members})
  if len(budgets) > 1:
    raise GridError(
      f"--grid {grid!r}: members trained on different budgets (sweep."
      f"tokens_per_param {', '.join(f'{b:g}' for b in budgets)}); the optimal batch and LR move "
      "with it: fit one budget at a time"
    )
  c = np.array([o.best.compute for o in optima])
  n = np.array([o.best.n_params for o in optima], np.float64)
  lr = np.array([o.lr for o in optima])
  bt = np.array([o.batch_tokens for o in optima], np.float64)
  fits = {
    "lr": _fit_axis(c, lr, n_boot, seed),
    "batch_tokens": _fit_axis(c, bt, n_boot, seed),
    "lr_n": _fit_axis(n, lr, n_boot, seed),
    "batch_tokens_n": _fit_axis(n, bt, n_boot, seed),
  }
  failed = checks(optima, fits)
  refused = [k for k in CHECKS if k in failed and k not in allow]
  if refused:
    raise GridError(
      f"--grid {grid!r}: fit refused: "
      + "; ".join(f"{failed[k]} (override: {CHECKS[k]})" for k in refused)
    )
  overridden = [k for k in CHECKS if k in failed]
  warnings += [f"check {k} overridden ({CHECKS[k]}): {failed[k]}" for k in overridden]
  created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
  models = sorted({o.best.arch for o in optima})
  provenance = {
    "grid": grid,  # as given (a path in the repo stays relative: results/grid_cpu)
    "grid_abs": grid_abs,
    "created": created,
    "models": models,
    "model_filter": model,
    "n_definition": defs[0],
    # the budget the grid trained at (sweep.tokens_per_param; null when its configs lack it): a
    # sweep at another budget is warned that the laws were not fitted there (scaling/plan.py)
    "tokens_per_param": budgets[0] or None,
    "selection": f"lowest {metric} per (model, size): {METRICS[metric]}",
    "optimum": optimum,  # grid_vertex.METHODS: how lr* and B* are located around that member
    "metric": metric,
    "n_bootstrap": n_boot,
    "exact_bootstrap_limit": fit_lib.EXACT_LIMIT,
    "ci_level": CI_LEVEL,
    "seed": seed,
    "command": command or "cbert_jax.report.grid.fit_grid (Python)",
    "checks": {
      k: {"passed": k not in failed, "detail": failed.get(k, ""), "overridden": k in failed}
      for k in CHECKS
    },
    # why the failed checks were overridden ("" when none was)
    "override_reason": override_reason.strip() if overridden else "",
    "min_sizes": MIN_SIZES,
    "exponent_bounds": {k: list(v) for k, v in EXPONENT_BOUNDS.items()},
    "runs": [
      {
        "name": o.best.name,
        "model": o.best.arch,
        "size": o.best.size,
        "compute": o.best.compute,
        "n_params": o.best.n_params,
        "batch_size": o.best.batch_size,
        "batch_tokens": o.best.batch_tokens,
        "lr": o.best.lr,
        "loss": o.best.loss,
        "lr_located": o.lr,  # what the laws are fitted to (`optimum`)
        "batch_tokens_located": o.batch_tokens,
        "located": o.how,
        "edge": o.edges,
        "grid_members": [m.name for m in o.members],
      }
      for o in optima
    ],
    "diverged": [m.name for o in optima for m in o.members if m.state == "diverged"],
    "skipped": [{"name": m.name, "reason": m.reason} for m in skipped],
    "excluded": exclude,  # sizes left out by --exclude
  }
  family = f"{model}, " if model != "all" else ""  # two families' fits of one grid differ here
  source = f"fit: {grid} ({family}{len(optima)} sizes), {created[:10]}"
  if exclude:
    source += f"; excluded: {', '.join(exclude)}"
  if optimum != "vertex":
    source += f"; optima: {optimum}"
  if overridden:
    source += (
      f"{laws_lib.OVERRIDDEN_MARK}{', '.join(overridden)} (reason: {override_reason.strip()})"
    )
  laws = laws_lib.HyperLaws(
    lr=fits["lr"],
    batch_tokens=fits["batch_tokens"],
    lr_n=fits["lr_n"],
    batch_tokens_n=fits["batch_tokens_n"],
    source=source,
    provenance=provenance,
    overridden=tuple(overridden),
  )
  laws_path = out or os.path.join(grid, LAWS_FILE)
  laws_lib.save(laws_path, laws)
  plot_path = None
  if plot:
    plot_path, curves_path = plot_paths(laws_path)
    draw(optima, laws, plot_path, n_boot, seed)
    draw_curves(optima, curves_path, metric)
  return FitResult(
    laws=laws,
    optima=optima,
    skipped=skipped,
    warnings=warnings,
    laws_path=laws_path,
    plot_path=plot_path,
  )


def plot_paths(laws_path: str) -> tuple[str, str]:
  """(laws plot, grid curves plot) beside `laws_path`: laws.png and grid.png for laws.json;
  <stem>.png and <stem>_grid.png for any other name, so two fits in one directory (cpu-bert.json,
  cpu-crossbert.json) keep their own plots."""
  folder = os.path.dirname(os.path.abspath(laws_path))
  stem = os.path.splitext(os.path.basename(laws_path))[0]
  if stem == os.path.splitext(LAWS_FILE)[0]:
    return os.path.join(folder, PLOT_FILE), os.path.join(folder, CURVES_FILE)
  return os.path.join(folder, f"{stem}.png"), os.path.join(folder, f"{stem}_grid.png")


# ---------------------------------------------------------------------------------- table ---
def _ci(ci: tuple[float, float] | None, spec: str = ".3g") -> str:
  return f"[{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else "-"


def describe_law(name: str, law: fit_lib.PowerLaw, x: str) -> list[str]:
  """Two lines: the law, then its exponent's bootstrap and t-intervals."""
  boot = law.bootstrap or {}
  how = (
    f"{boot['method']} bootstrap over {boot['resamples']} resamples, {boot['skipped']} skipped "
    "(all x equal)"
    if boot
    else "no bootstrap"
  )
  level = int(round(100 * (law.ci_level or CI_LEVEL)))
  return [
    f"{name} = {law.a:.4g} * {x}^{law.alpha:.4f}  ({law.n_points} sizes)",
    f"    {x} exponent {level}%: bootstrap {_ci(law.alpha_ci, '.4f')} ({how}); "
    f"t {_ci(law.alpha_t_ci, '.4f')}" + ("" if law.alpha_t_ci else " (needs >= 3 sizes)"),
  ]


def table(result: FitResult) -> str:
  """The optima and the four fits, as plain text."""
  rows = [
    (
      "model",
      "size",
      "N",
      "C (FLOPs)",
      "best B rows",
      "best lr",
      "loss",
      "B* tokens",
      "lr*",
      "grid",
      "edge",
    )
  ]
  for o in result.optima:
    b = o.best
    rows.append(
      (
        b.arch,
        b.size,
        f"{b.n_params:.3g}",
        f"{b.compute:.3g}",
        str(b.batch_size),
        f"{b.lr:.3g}",
        f"{b.loss:.4f}",
        f"{o.batch_tokens:.4g}",
        f"{o.lr:.3g}",
        str(len(o.members)),
        ", ".join(o.edges) or "-",
      )
    )
  w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(r[i].ljust(w[i]) for i in range(len(r))).rstrip() for r in rows]
  lines.append("(best: the grid's lowest-loss member; B*, lr*: what the laws are fitted to)")
  for o in result.optima:
    lines.append(f"  {o.best.arch} {o.best.size}: lr* {o.how['lr']}; B* {o.how['batch']}")
  lines.append("")
  lv = result.laws
  for name, law, x in (
    ("lr*", lv.lr, "C"),
    ("B* (tokens)", lv.batch_tokens, "C"),
    ("lr*", lv.lr_n, "N"),
    ("B* (tokens)", lv.batch_tokens_n, "N"),
  ):
    lines += describe_law(name, law, x)
  lines += ["", f"source: {lv.source}", f"written: {result.laws_path}"]
  if result.plot_path:
    lines.append(f"plot: {result.plot_path}")
  return "\n".join(lines)


# ------------------------------------------------------------------------------------ CLI ---
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m cbert_jax.report.grid", description=__doc__.splitlines()[0]
  )
  sub = parser.add_subparsers(dest="command", required=True)
  f = sub.add_parser("fit", help="fit lr*(C), B*(C) (and against N) from a finished grid")
  f.add_argument("--grid", required=True, help="the grid directory (member workdirs inside)")
  f.add_argument(
    "--out",
    default=None,
    help=f"the laws file (default <grid>/{LAWS_FILE}; the plots go next to it: {PLOT_FILE} and "
    f"{CURVES_FILE}, or <stem>.png and <stem>_grid.png for another name)",
  )
  f.add_argument(
    "--model",
    default="all",
    choices=(*MODELS, "all"),
    help="fit one architecture's optima, or pool them (all)",
  )
  f.add_argument(
    "--bootstrap",
    type=int,
    default=fit_lib.N_DRAWS,
    help="bootstrap draws for the intervals when the exact bootstrap (every distinct resample, "
    "up to 10 sizes) is too large (0 = no bootstrap)",
  )
  f.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  f.add_argument(
    "--metric",
    default="val_full",
    choices=tuple(METRICS),
    help="the final validation loss each member is judged by: "
    + "; ".join(f"{k}: {v}" for k, v in METRICS.items()),
  )
  f.add_argument(
    "--exclude",
    default="",
    help="comma-separated arch:size (e.g. bert:d32L2) to leave out of the fit, recorded in the "
    "laws file: a size whose optimum is at an edge no grid can widen (1 row)",
  )
  f.add_argument(
    "--optimum",
    default="vertex",
    choices=grid_vertex.METHODS,
    help="how each size's lr* and B* are located around its best member: vertex (parabolas in "
    "log lr and log B through it and its grid neighbours; cbert_jax/report/grid_vertex.py) or "
    "argmin (the best grid point itself)",
  )
  f.add_argument("--no_plot", action="store_true", help=f"skip {PLOT_FILE}")
  for check, flag in CHECKS.items():
    f.add_argument(
      flag,
      action="store_true",
      help=f"fit even when check {check} fails (recorded in the laws file as overridden; "
      "needs --override_reason)",
    )
  f.add_argument(
    "--override_reason",
    default="",
    help="why the --allow_* checks may be overridden (required with them; kept in the laws "
    "file's provenance and shown wherever the laws are used)",
  )
  ns = parser.parse_args(argv)
  if ns.bootstrap < 0:
    parser.error(f"--bootstrap must be >= 0, got {ns.bootstrap}")
  allow = [k for k, flag in CHECKS.items() if getattr(ns, flag.lstrip("-"))]
  if allow and not ns.override_reason.strip():
    parser.error(
      f"{', '.join(CHECKS[k] for k in allow)} needs --override_reason: say why the check may be "
      "overridden (kept in the laws file)"
    )
  if ns.override_reason.strip() and not allow:
    parser.error("--override_reason without an --allow_* flag: there is nothing to override")
  try:
    command = " ".join(
      ["python -m cbert_jax.report.grid", *(argv if argv is not None else sys.argv[1:])]
    )
    result = fit_grid(
      ns.grid,
      ns.out,
      ns.model,
      ns.bootstrap,
      ns.seed,
      plot=not ns.no_plot,
      command=command,
      allow=allow,
      override_reason=ns.override_reason,
      metric=ns.metric,
      exclude=[x.strip() for x in ns.exclude.split(",") if x.strip()],
      optimum=ns.optimum,
    )
  except GridError as e:
    print(f"grid error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"grid error: cannot write {e.filename or ns.out}: {e.strerror or e}", file=sys.stderr)
    return 2
  for w in result.warnings:
    print(f"warning: {w}", file=sys.stderr)
  print(table(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
