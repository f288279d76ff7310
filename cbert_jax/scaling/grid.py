r"""Fit the hyperparameter laws from a finished batch-size x LR grid (SPEC §5).

  python -m cbert_jax.scaling.grid fit --grid runs/hparam_grid_cpu \
      [--out FILE] [--model bert|crossbert|all] [--bootstrap 10000] [--seed 0] \
      [--allow_few_sizes] [--allow_edges] [--allow_implausible]

Reads every member workdir under `--grid` (the subdirectories with a config.json, as
`experiments/hparam_grid.py` run by `python -m cbert_jax.main` leaves them): the member's resolved
config (model, size, N = `sweep.n_params`, compute C = `sweep.compute`, rows, seq_len, peak LR,
total_steps) and its metrics.jsonl (the validation loss `eval/loss` at the final step). Then:
  * members whose last logged step is short of total_steps are skipped, with a warning listing
    them; a member that diverged (non-finite loss, or a FAILED file saying so) stays in the grid
    as a loss of +inf: it bounds the grid, it is never the best;
  * per (model, size), the member with the lowest final validation loss is the optimum (B*, lr*),
    B* in tokens = rows x seq_len;
  * lr* = a C^alpha and B* = b C^beta by least squares in log space (`fit.fit_power_law_ci`: 90%
    percentile-bootstrap intervals, exact over every distinct resample up to 10 sizes, else
    `--bootstrap` draws; and 90% t-intervals beside them), and the same against N; `--model all`
    (default) pools both architectures' optima into one law, `--model bert|crossbert` fits one;
  * refuses (one line naming every failed check and its override flag, exit 2, nothing written)
    a fit that fails a check, unless that check is overridden (`CHECKS`):
      few_sizes    fewer than 3 sizes (optima with distinct C and N): a line through 2 points has
                   no residual, its bootstrap interval is a point and its t-interval undefined;
                   override: --allow_few_sizes
      edges        a size whose optimum is at the lowest or highest LR or batch its grid tried
                   (or whose grid tried only one): the true optimum may lie outside (widen the
                   grid); a diverged member beyond the best bounds the grid; --allow_edges
      implausible  an exponent outside `EXPONENT_BOUNDS` (below); --allow_implausible
    an overridden check is recorded in laws.json (`overridden`, and `provenance["checks"]`), in
    the laws' `source`, and loading such a file for a sweep logs a warning;
  * writes the laws (`laws.HyperLaws`, `laws.save`) to `--out` (default `<grid>/laws.json`) with
    provenance -- the grid directory, the runs used (name, size, C, N, chosen B and lr, loss),
    the runs skipped and why, the models pooled, the checks and exponent bounds, when -- and
    `source` "fit: <grid> (<n> sizes), <date>"; draws `<out dir>/laws.png` (log-log: lr* and B*
    against C and N, fitted lines with bootstrap bands, every grid point coloured by its loss
    above its size's best); prints a table.

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
import json
import math
import os
import sys
import time
from collections.abc import Collection

import numpy as np

from cbert_jax import metrics as metrics_lib
from cbert_jax import plotting
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
MARKERS = {"bert": "o", "crossbert": "s", "crossbert-nocms": "^"}
LAWS_FILE, PLOT_FILE = "laws.json", "laws.png"


class GridError(Exception):
  """Bad input to the fit: one line, naming the path; the CLI exits 2."""


@dataclasses.dataclass
class Member:
  """One grid member's settings and outcome, read from its workdir."""

  name: str  # the sub-workdir's name
  arch: str  # model name, "-nocms" for CrossBERT without CMS
  model: str  # bert | crossbert
  size: str  # ladder rung
  n_params: int  # sweep.n_params (N under sweep.n_definition)
  n_definition: str  # sweep.n_definition
  compute: float  # sweep.compute: training FLOPs of the run
  batch_size: int  # rows per step
  seq_len: int  # tokens per row
  lr: float  # peak LR
  total_steps: int
  final_step: int  # the last step in metrics.jsonl (0 without one)
  loss: float | None  # eval/loss at total_steps; +inf when diverged
  state: str  # done | diverged | unfinished | failed
  reason: str = ""  # why it is not done

  @property
  def batch_tokens(self) -> int:
    return self.batch_size * self.seq_len


@dataclasses.dataclass
class Optimum:
  """The best member of one (model, size) and where it sits in that size's grid."""

  best: Member
  members: list[Member]  # done and diverged members of the size (its grid)
  edges: list[str]  # e.g. ["highest lr"]: the optimum may lie outside the grid


@dataclasses.dataclass
class FitResult:
  laws: laws_lib.HyperLaws
  optima: list[Optimum]
  skipped: list[Member]
  warnings: list[str]
  laws_path: str
  plot_path: str | None


# ------------------------------------------------------------------------------- reading ---
def _nonfinite(x) -> bool:
  return isinstance(x, (int, float)) and not math.isfinite(x)


def read_member(workdir: str) -> Member | None:
  """The member in `workdir`, or None when it is not a run (no readable config.json)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      cfg = json.load(f)["config"]
    sweep = cfg.get("sweep", {})
    model = str(cfg["model_name"])
    cms = bool(cfg.get("masking", {}).get("cms", True)) or model != "crossbert"
    m = Member(
      name=os.path.basename(os.path.normpath(workdir)),
      arch=model + ("" if cms else "-nocms"),
      model=model,
      size=str(cfg.get("model", {}).get("size", "")) or "custom",
      n_params=int(sweep.get("n_params", 0)),
      n_definition=str(sweep.get("n_definition", "")),
      compute=float(sweep.get("compute", 0.0)),
      batch_size=int(cfg["batch_size"]),
      seq_len=int(cfg["data"]["seq_len"]),
      lr=float(cfg["optim"]["lr"]),
      total_steps=int(cfg["total_steps"]),
      final_step=0,
      loss=None,
      state="unfinished",
    )
  except (OSError, ValueError, KeyError, TypeError):
    return None
  rows = [
    r
    for r in metrics_lib.read_metrics(os.path.join(workdir, "metrics.jsonl"), missing_ok=True)
    if isinstance(r.get("step"), int)
  ]
  m.final_step = max((r["step"] for r in rows), default=0)
  final = [r["eval/loss"] for r in rows if r["step"] == m.total_steps and "eval/loss" in r]
  failed = ""
  try:
    with open(os.path.join(workdir, "FAILED")) as f:  # written by the sweep runner
      failed = f.read().strip()
  except OSError:
    pass
  diverged = "NonFinite" in failed or any(
    _nonfinite(r.get("train/loss")) or _nonfinite(r.get("eval/loss")) for r in rows
  )
  if not m.compute > 0 or not m.n_params > 0:
    m.state, m.reason = "failed", "no sweep.compute / sweep.n_params: not a sweep or grid member"
  elif diverged:
    m.state, m.loss, m.reason = "diverged", math.inf, failed or "non-finite loss"
  elif final and m.final_step >= m.total_steps:
    m.state, m.loss = "done", float(final[-1])
  elif failed:
    m.state, m.reason = "failed", failed
  elif m.final_step >= m.total_steps:
    m.reason = f"no eval/loss at the final step {m.total_steps}"
  else:
    m.reason = f"step {m.final_step}/{m.total_steps}"
  return m


def read_grid(grid: str) -> list[Member]:
  """Every member workdir directly under `grid`, sorted by (arch, compute, batch, lr)."""
  if not os.path.exists(grid):
    raise GridError(f"--grid: no such directory {grid!r}")
  if not os.path.isdir(grid):
    raise GridError(f"--grid: {grid!r} is not a directory")
  members = [
    m
    for d in sorted(os.listdir(grid))
    if os.path.isdir(os.path.join(grid, d))
    for m in [read_member(os.path.join(grid, d))]
    if m is not None
  ]
  if not members:
    raise GridError(
      f"--grid: {grid!r} holds no member workdirs (subdirectories with a "
      "config.json; run experiments/hparam_grid.py into it first)"
    )
  return sorted(members, key=lambda m: (m.arch, m.compute, m.batch_size, m.lr))


# ---------------------------------------------------------------------------------- fits ---
def _edges(best: Member, grid: list[Member]) -> list[str]:
  """Where `best` touches the edge of its size's grid (lowest/highest lr or batch tried)."""
  out = []
  for label, value, values in (
    ("lr", best.lr, [m.lr for m in grid]),
    ("batch", best.batch_size, [m.batch_size for m in grid]),
  ):
    if len(set(values)) < 2:
      out.append(f"only one {label} tried")
    elif value <= min(values):
      out.append(f"lowest {label}")
    elif value >= max(values):
      out.append(f"highest {label}")
  return out


def select(
  members: list[Member], model: str = "all"
) -> tuple[list[Optimum], list[Member], list[str]]:
  """(the optimum of every (arch, size) with a done member, the members skipped, warnings)."""
  chosen = [m for m in members if model == "all" or m.model == model]
  if not chosen:
    raise GridError(
      f"--model {model}: the grid has no {model} members (it has "
      f"{', '.join(sorted({m.model for m in members}))})"
    )
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
    edges = _edges(best, grid)
    if edges:
      warnings.append(
        f"{arch} {size}: the best run {best.name} (B {best.batch_size} rows, "
        f"lr {best.lr:.3g}) is at the {' and '.join(edges)} of its grid; the "
        "optimum may lie outside it (widen the grid and rerun)"
      )
    optima.append(
      Optimum(best=best, members=sorted(grid, key=lambda m: (m.batch_size, m.lr)), edges=edges)
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
) -> FitResult:
  """Reads the grid, fits the laws, writes laws.json (and laws.png); see the module docstring.
  `n_boot`: bootstrap draws when the exact bootstrap is too large (0 = no bootstrap). `allow`:
  the refusal checks (`CHECKS`) to override; a failed check not in it raises GridError before
  anything is written. `command`: how it was invoked, for the provenance (the CLI passes its
  command line)."""
  unknown = sorted(set(allow) - set(CHECKS))
  if unknown:
    raise ValueError(f"allow: unknown check(s) {unknown}; known: {sorted(CHECKS)}")
  members = read_grid(grid)
  optima, skipped, warnings = select(members, model)
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
  c = np.array([o.best.compute for o in optima])
  n = np.array([o.best.n_params for o in optima], np.float64)
  lr = np.array([o.best.lr for o in optima])
  bt = np.array([o.best.batch_tokens for o in optima], np.float64)
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
    "grid": grid_abs,
    "created": created,
    "models": models,
    "model_filter": model,
    "n_definition": defs[0],
    "selection": "lowest eval/loss at the final step per (model, size)",
    "n_bootstrap": n_boot,
    "exact_bootstrap_limit": fit_lib.EXACT_LIMIT,
    "ci_level": CI_LEVEL,
    "seed": seed,
    "command": command or "cbert_jax.scaling.grid.fit_grid (Python)",
    "checks": {
      k: {"passed": k not in failed, "detail": failed.get(k, ""), "overridden": k in failed}
      for k in CHECKS
    },
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
        "edge": o.edges,
        "grid_members": [m.name for m in o.members],
      }
      for o in optima
    ],
    "diverged": [m.name for o in optima for m in o.members if m.state == "diverged"],
    "skipped": [{"name": m.name, "reason": m.reason} for m in skipped],
  }
  source = f"fit: {grid_abs} ({len(optima)} sizes), {created[:10]}"
  if overridden:
    source += f"; checks overridden: {', '.join(overridden)}"
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
    plot_path = os.path.join(os.path.dirname(os.path.abspath(laws_path)), PLOT_FILE)
    draw(optima, laws, plot_path, n_boot, seed)
  return FitResult(
    laws=laws,
    optima=optima,
    skipped=skipped,
    warnings=warnings,
    laws_path=laws_path,
    plot_path=plot_path,
  )


# --------------------------------------------------------------------------------- plots ---
def _band(x, y, xs, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
  """Bootstrap percentile band of the fitted line at `xs` (exact or `n_boot` draws, as the
  laws' intervals; None without a bootstrap)."""
  if n_boot <= 0:
    return None
  boot = fit_lib.bootstrap_line(np.log(x), np.log(y), n_boot, seed)
  if not boot.weights.size:
    return None
  log_y = boot.intercepts[:, None] + boot.slopes[:, None] * np.log(xs)[None, :]
  lo, hi = fit_lib.percentiles(log_y, boot.weights, CI_LEVEL)
  return np.exp(lo), np.exp(hi)


def _profile(o: Optimum, ykey: str) -> dict[float, float]:
  """{value of `ykey` (lr | batch_tokens): the lowest loss of the size's members at it}."""
  best_at: dict[float, float] = {}
  for m in o.members:
    y = float(getattr(m, ykey))
    best_at[y] = min(best_at.get(y, math.inf), m.loss)
  return best_at


def draw(
  optima: list[Optimum], laws: laws_lib.HyperLaws, path: str, n_boot: int = 1000, seed: int = 0
) -> None:
  """laws.png: lr* and B* against C (top) and N (bottom), log-log; each grid point coloured by
  its final loss above the best of its size (the lowest over the other hyperparameter where
  several share an x, y), diverged points as grey crosses, the optima as stars."""
  Figure, FigureCanvasAgg = plotting.matplotlib_classes(  # pylint: disable=invalid-name
    os.path.join(os.path.dirname(path), ".matplotlib")
  )
  # After plotting's first import, the rest of matplotlib imports as usual.
  import matplotlib  # pylint: disable=import-outside-toplevel
  from matplotlib import cm, colors  # pylint: disable=import-outside-toplevel

  # Per optimum and y field: y -> the lowest loss over the other hyperparameter (what is drawn).
  profiles = {(id(o), ykey): _profile(o, ykey) for o in optima for ykey in ("lr", "batch_tokens")}
  deltas = [
    loss - o.best.loss
    for o in optima
    for ykey in ("lr", "batch_tokens")
    for loss in profiles[id(o), ykey].values()
    if math.isfinite(loss)
  ]
  norm = colors.Normalize(0.0, max(max(deltas), 1e-6))
  cmap = matplotlib.colormaps["viridis"]
  fig = Figure(figsize=(11, 8.5))
  panels = (
    (laws.lr, "compute", "lr", "peak LR"),
    (laws.batch_tokens, "compute", "batch_tokens", "batch (tokens)"),
    (laws.lr_n, "n_params", "lr", "peak LR"),
    (laws.batch_tokens_n, "n_params", "batch_tokens", "batch (tokens)"),
  )
  for i, (law, xkey, ykey, ylabel) in enumerate(panels):
    ax = fig.add_subplot(2, 2, i + 1)
    for o in optima:
      x0 = getattr(o.best, xkey)  # the size's x (C differs slightly with the batch)
      marker = MARKERS.get(o.best.arch, "o")
      for y, loss in profiles[id(o), ykey].items():
        if math.isfinite(loss):
          ax.scatter(
            [x0],
            [y],
            c=[cmap(norm(loss - o.best.loss))],
            marker=marker,
            s=36,
            edgecolors="none",
            zorder=2,
          )
        else:
          ax.scatter([x0], [y], c="0.6", marker="x", s=30, zorder=2)
      ax.scatter(
        [x0],
        [getattr(o.best, ykey)],
        marker="*",
        s=180,
        facecolors="none",
        edgecolors="k",
        linewidths=1.2,
        zorder=3,
      )
    x = np.array([getattr(o.best, xkey) for o in optima], np.float64)
    y = np.array([getattr(o.best, ykey) for o in optima], np.float64)
    xs = np.geomspace(x.min() / 1.5, x.max() * 1.5, 40)
    band = _band(x, y, xs, n_boot, seed)
    if band is not None:
      ax.fill_between(
        xs,
        band[0],
        band[1],
        color="tab:red",
        alpha=0.15,
        lw=0,
        label=f"{int(CI_LEVEL * 100)}% bootstrap band ({(law.bootstrap or {}).get('method')})",
      )
    ci = f" [{law.alpha_ci[0]:.3f}, {law.alpha_ci[1]:.3f}]" if law.alpha_ci else ""
    ax.plot(
      xs,
      law(xs),
      color="tab:red",
      lw=1.2,
      label=f"{law.a:.3g} {'C' if xkey == 'compute' else 'N'}^{law.alpha:.3f}{ci}",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute C (FLOPs)" if xkey == "compute" else "N (parameters)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
  fig.colorbar(
    cm.ScalarMappable(norm=norm, cmap=cmap),
    ax=fig.axes,
    label="final val loss - best of its size (grey x: diverged; star: best)",
  )
  fig.suptitle(
    f"hyperparameter laws ({', '.join(sorted({o.best.arch for o in optima}))}; "
    "markers: o bert, s crossbert)",
    fontsize=10,
  )
  FigureCanvasAgg(fig).print_png(path)


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
    ("model", "size", "N", "C (FLOPs)", "B* rows", "B* tokens", "lr*", "loss", "grid", "edge")
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
        str(b.batch_tokens),
        f"{b.lr:.3g}",
        f"{b.loss:.4f}",
        str(len(o.members)),
        ", ".join(o.edges) or "-",
      )
    )
  w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(r[i].ljust(w[i]) for i in range(len(r))).rstrip() for r in rows]
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
    prog="python -m cbert_jax.scaling.grid", description=__doc__.splitlines()[0]
  )
  sub = parser.add_subparsers(dest="command", required=True)
  f = sub.add_parser("fit", help="fit lr*(C), B*(C) (and against N) from a finished grid")
  f.add_argument("--grid", required=True, help="the grid directory (member workdirs inside)")
  f.add_argument(
    "--out",
    default=None,
    help=f"the laws file (default <grid>/{LAWS_FILE}; the plot goes next to it as {PLOT_FILE})",
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
  f.add_argument("--no_plot", action="store_true", help=f"skip {PLOT_FILE}")
  for check, flag in CHECKS.items():
    f.add_argument(
      flag,
      action="store_true",
      help=f"fit even when check {check} fails (recorded in the laws file as overridden)",
    )
  ns = parser.parse_args(argv)
  if ns.bootstrap < 0:
    parser.error(f"--bootstrap must be >= 0, got {ns.bootstrap}")
  try:
    command = " ".join(
      ["python -m cbert_jax.scaling.grid", *(argv if argv is not None else sys.argv[1:])]
    )
    result = fit_grid(
      ns.grid,
      ns.out,
      ns.model,
      ns.bootstrap,
      ns.seed,
      plot=not ns.no_plot,
      command=command,
      allow=[k for k, flag in CHECKS.items() if getattr(ns, flag.lstrip("-"))],
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
