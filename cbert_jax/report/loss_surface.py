"""The scaling report's loss surface: L(N, D) = E + A/N^alpha + B/D^beta per family
(`cbert_jax.scaling.chinchilla`, Hoffmann et al.'s approach 3) and the compute-optimal allocation
it implies, or the reasons it is refused.

Points, per family (bert, crossbert with CMS): every finished sweep member, each seed its own
point (N = sweep.n_params, D = sweep.tokens, L = its final validation loss), plus, with a
hyperparameter grid (`--grid`), the grid's optimum of each (family, size): its lowest-loss member
in state "done" (`report.grid_read`, full-split loss), D = total_steps x batch x seq_len. All
points of a family share one loss metric: the full-split loss when any point has it (members
without it are left out and named), else eval/loss. k in C = k N D is the median over the points
of their own analytic FLOPs / (N D) (`chinchilla.flops_per_param_token`).

No fit when the points' D/N spans less than `MIN_DN_SPAN`: with D a fixed multiple of N (a sweep
at 20 tokens per parameter alone) the data do not separate A/N^alpha from B/D^beta, whatever
the optimiser would return. The allocation (N_opt, D_opt at the largest sweep member's C, 10x
and 100x it) is given only when the fit is usable (`Fit.problems` empty) and its D/N at the
largest member's C lies within the points' D/N (`chinchilla.allocation_problems`); otherwise the
problems are printed ("refused").

With an output directory, each fitted family's surface is also written as
`surface_<family>.json` (`chinchilla.save`: the law, k, bootstrap draws, the problems above, and
provenance: the points, their N and D/N ranges, N's definition, the command), the file
`python -m cbert_jax.sweep.planner --surface` plans from (it refuses one with problems unless
--allow_unusable).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from cbert_jax.scaling import chinchilla

FAMILIES = ("bert", "crossbert")
N_BOOT = 200
SCALES = (1, 10, 100)
MIN_DN_SPAN = 2.0  # max(D/N) / min(D/N) below which the allocation is not identified


def grid_optima(grid_dir: str, members=None) -> list[dict]:
  """The best done member of each (arch, size) of the grid, as points (`members`: the grid's
  `grid_read.Member`s when already read, else read from `grid_dir`)."""
  from cbert_jax.report import grid_read  # pylint: disable=import-outside-toplevel

  best = {}
  for m in members if members is not None else grid_read.read_grid(grid_dir):
    if m.state != "done" or m.loss is None or not np.isfinite(m.loss):
      continue
    if (m.arch, m.size) not in best or m.loss < best[(m.arch, m.size)].loss:
      best[(m.arch, m.size)] = m
  return [
    {
      "source": "grid",
      "name": m.name,
      "arch": m.arch,
      "n": float(m.n_params),
      "d": float(m.total_steps * m.batch_size * m.seq_len),
      "loss": float(m.loss),
      "compute": float(m.compute),
      "metric": "val_full",
    }
    for m in best.values()
  ]


def sweep_points(members: list[dict]) -> list[dict]:
  return [
    {
      "source": "sweep",
      "name": m["name"],
      "arch": m["arch"],
      "n": float(m["n_params"]),
      "d": float(m["tokens"]),
      "loss": float(m["final_loss"]),
      "compute": float(m["compute"]),
      "metric": m["loss_source"],
      "n_definition": m.get("n_definition"),
    }
    for m in members
    if m["finished"] and m["n_params"] > 0 and m["tokens"] > 0 and m["compute"] > 0
  ]


def surface_file(out_dir: str, family: str) -> str:
  return os.path.join(out_dir, f"surface_{family}.json")


def fit_family(
  points: list[dict],
  n_boot: int = N_BOOT,
  starts=None,
  save_path: str | None = None,
  provenance: dict | None = None,
  progress=None,
) -> dict:
  """The surface fitted to `points` (one family), its intervals and, when usable, the allocation;
  with `save_path`, the fit (its problems included) is written there (`chinchilla.save`) with
  `provenance` plus the points and their ranges. `progress(done, n_boot)`: the bootstrap's."""
  metric = "val_full" if any(p["metric"] == "val_full" for p in points) else "eval_loss"
  left_out = [p["name"] for p in points if p["metric"] != metric]
  pts = [p for p in points if p["metric"] == metric]
  out = {
    "metric": metric,
    "left_out": left_out,
    "points": len(pts),
    "sweep_points": sum(p["source"] == "sweep" for p in pts),
    "grid_points": sum(p["source"] == "grid" for p in pts),
    "n_boot": n_boot,
    "fitted": False,
    "usable": False,
  }
  if not pts:
    return out | {"reason": "no finished points"}
  n, d, loss, c = (np.array([p[k] for p in pts]) for k in ("n", "d", "loss", "compute"))
  dn = d / n
  out |= {
    "d_per_n": [float(dn.min()), float(dn.max())],
    "n_range": [float(n.min()), float(n.max())],
  }
  if dn.max() / dn.min() < MIN_DN_SPAN:  # the surface degenerates to a function of N alone
    return out | {
      "reason": (
        f"D/N is {dn.min():.3g} at every point"
        if f"{dn.min():.3g}" == f"{dn.max():.3g}"
        else f"D/N spans only {dn.min():.3g}-{dn.max():.3g} (< {MIN_DN_SPAN:g}x)"
      )
      + ", so A/N^alpha and B/D^beta are not separated; a grid at another tokens-per-parameter "
      "ratio (--grid) would separate them"
    }
  try:
    f = chinchilla.fit(n, d, loss, n_boot=n_boot, seed=0, starts=starts, progress=progress)
  except ValueError as e:
    return out | {"reason": str(e)}
  law = f.law
  k = chinchilla.flops_per_param_token(c, n, d)
  sweep_c = [p["compute"] for p in pts if p["source"] == "sweep"] or list(c)
  c_max = float(max(sweep_c))
  # the allocation's own test, beside the surface's (both reasons are named when both fail)
  extra = chinchilla.allocation_problems(law, c_max, k, out["d_per_n"])
  f = dataclasses.replace(f, problems=[*f.problems, *extra])
  out |= {
    "fitted": True,
    "E": law.E,
    "A": law.A,
    "alpha": law.alpha,
    "B": law.B,
    "beta": law.beta,
    "objective": f.objective,
    "intervals": {name: list(ci) for name, ci in f.intervals.items()},
    "boot_failed": f.boot_failed,
    "k": k,
    "problems": list(f.problems),
    "usable": bool(f.usable),
  }
  out["c_largest"] = c_max
  if out["usable"]:
    out["allocation"] = [
      {"scale": s, "compute": c_max * s, "n_opt": no, "d_opt": do, "d_per_n": do / no}
      for s in SCALES
      for no, do in [law.optimal(c_max * s, k)]
    ]
  if save_path:
    defs = {p.get("n_definition") for p in pts if p["source"] == "sweep"} - {None}
    chinchilla.save(
      save_path,
      f,
      k,
      dict(provenance or {})
      | {
        "metric": metric,
        "n_definition": defs.pop() if len(defs) == 1 else None,
        "n_range": out["n_range"],
        "d_per_n": out["d_per_n"],
        "c_largest": c_max,
        "points": [{key: p[key] for key in ("source", "name", "n", "d", "loss")} for p in pts],
      },
    )
    out["surface_file"] = save_path
  return out


def surfaces(
  members,
  grid_dir=None,
  n_boot: int = N_BOOT,
  starts=None,
  out_dir: str | None = None,
  provenance: dict | None = None,
  grid_members=None,
  progress=None,
) -> dict:
  """{family: fit_family(...)} over the sweep's members plus the grid's optima (if any); with
  `out_dir`, each fitted surface is written to `surface_file(out_dir, family)`. `grid_members`:
  the grid already read (else read from `grid_dir`); `progress`: a `report.progress.Progress`
  (each family's bootstrap counts as steps of its current stage)."""
  pts = sweep_points(members) + (grid_optima(grid_dir, grid_members) if grid_dir else [])
  out = {}
  for fam in FAMILIES:
    if not any(p["arch"] == fam for p in pts):
      continue
    out[fam] = fit_family(
      [p for p in pts if p["arch"] == fam],
      n_boot,
      starts,
      save_path=surface_file(out_dir, fam) if out_dir else None,
      provenance=dict(provenance or {}) | {"family": fam, "grid": grid_dir},
      progress=progress.callback(f"{fam}, bootstrap resample") if progress else None,
    )
  for fam, r in out.items():
    r["grid"] = grid_dir
    r["point_list"] = [p for p in pts if p["arch"] == fam]
  return out


AT_BOUND = "\u2020"  # marks an interval end at the optimiser's bound (see `_iv`)


def _at_bound(x: float, bound: float) -> bool:
  """x within 1% of an optimiser bound (relative; absolute near 0)."""
  return abs(x - bound) <= 0.01 * max(abs(bound), 1e-2)


def _iv(r: dict, name: str, spec: str) -> str:
  """' [lo, hi]' of the bootstrap interval, an end marked AT_BOUND where it sits at the
  optimiser's bound (resamples whose fit went there: the interval is cut by the optimiser)."""
  ci = r.get("intervals", {}).get(name)
  if not ci:
    return ""
  ends = [
    f"{v:{spec}}" + (AT_BOUND if _at_bound(v, b) else "")
    for v, b in zip(ci, chinchilla.optimiser_bounds(name))
  ]
  return f" [{ends[0]}, {ends[1]}]"


def markdown(chin: dict) -> list[str]:
  """The report's section on the loss surface."""
  if not chin:
    return []
  lines = [
    "## Loss surface L(N, D) = E + A/N^alpha + B/D^beta",
    "",
    "Hoffmann et al.'s approach 3 (`cbert_jax.scaling.chinchilla`: Huber on log L, L-BFGS-B from "
    "a grid of starts), per family, on every finished sweep member (each seed a point)"
    + (
      " plus the hyperparameter grid's optimum per size"
      if any(r.get("grid") for r in chin.values())
      else ""
    )
    + ". Intervals: 90% percentile bootstrap over the points.",
    "",
    "| family | points (sweep + grid) | D/N | E | A | alpha | B | beta | k = C/(N D) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for fam, r in chin.items():
    dn = r.get("d_per_n")
    dn_s = f"{dn[0]:.3g}-{dn[1]:.3g}" if dn else "-"
    pts = f"{r['points']} ({r['sweep_points']} + {r['grid_points']})"
    if not r["fitted"]:
      lines.append(f"| {fam} | {pts} | {dn_s} | not fitted: {r['reason']} | | | | | |")
      continue
    lines.append(
      f"| {fam} | {pts} | {dn_s} | {r['E']:.3g}{_iv(r, 'E', '.3g')} | {r['A']:.3g}{_iv(r, 'A', '.3g')} "
      f"| {r['alpha']:.3f}{_iv(r, 'alpha', '.3f')} | {r['B']:.3g}{_iv(r, 'B', '.3g')} "
      f"| {r['beta']:.3f}{_iv(r, 'beta', '.3f')} | {r['k']:.3g} |"
    )
  lines.append("")
  if any(AT_BOUND in line for line in lines):
    lines += [
      f"{AT_BOUND} an interval end at the optimiser's bound: some resamples' fits went to the "
      "bound, so the interval there is set by the optimiser, not by the data.",
      "",
    ]
  for fam, r in chin.items():
    notes = []
    if r.get("left_out"):
      notes.append(f"left out (no {r['metric']} loss): {', '.join(r['left_out'])}")
    if r.get("fitted") and r.get("boot_failed"):
      notes.append(f"{r['boot_failed']}/{r['n_boot']} bootstrap resamples did not fit")
    if not r.get("fitted"):
      lines.append(f"* {fam}: no allocation (not fitted: {r['reason']}).")
    elif not r["usable"]:
      lines.append(f"* {fam}: allocation refused: {'; '.join(r['problems'])}.")
    else:
      alloc = "; ".join(
        f"C = {a['compute']:.3g} ({a['scale']}x the largest member): N_opt {a['n_opt']:.3g}, "
        f"D_opt {a['d_opt']:.3g}, D/N {a['d_per_n']:.3g}"
        for a in r["allocation"]
      )
      lines.append(f"* {fam}: compute-optimal allocation (C = k N D, k = {r['k']:.3g}): {alloc}.")
    if r.get("surface_file"):
      notes.append(
        f"surface file `{os.path.basename(r['surface_file'])}` for "
        "`python -m cbert_jax.sweep.planner --surface`"
        + ("" if r["usable"] else ", which refuses it without --allow_unusable")
      )
    if notes:
      lines[-1] = lines[-1][:-1] + f" ({'; '.join(notes)})."
  return lines + [""]
