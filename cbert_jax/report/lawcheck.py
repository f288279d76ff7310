r"""Check LR/batch laws where a sweep uses them: a batch x LR grid around the sweep's own points,
judged by a rule fixed before the runs.

  python -m cbert_jax.report.lawcheck --grid results/lawcheck20_cpu \
      --experiment experiments/sweep.py:cpu --laws 'shipped:cpu-{model}'

Laws fitted on a grid at one budget (tokens per parameter) may be used by a sweep at another; the
optimal batch and LR move with the budget. The check trains the sweep's own members
(`experiments/hparam_grid.py` with `--config.sweep.tokens_per_param` set to the sweep's) at
multiples of the batch and LR the laws give them, and asks, per (family, size), whether a point
beats the sweep's.

The sweep's point of each (family, size) is what `--laws` gives the experiment's seed-0 member,
resolved exactly as the sweep resolves it (`config_lib.resolve`); the grid point with the same
rows and an LR within `LR_MATCH` of it is that point (grid LRs are written to 3-4 significant
figures, grid steps are factors of 2). Every member is judged by its final full-split validation
loss (`grid_read.METRICS`); a diverged one counts as +inf.

The decision, per (family, size) (results/lawcheck20_cpu/PLAN.md, fixed before its runs):
  * open while the seed-0 best point sits on an edge of the group's grid (its rows the lowest or
    highest tried, or its LR the lowest or highest tried at its rows, `grid.edges_of`): the
    plan's edge rule adds a point beyond it;
  * not moved when the seed-0 best is the sweep's point;
  * otherwise, with at least 2 seeds at both the best and the sweep's point: moved when the
    best's seed mean beats the sweep point's by more than the larger of the two points' seed
    ranges (max - min over seeds), not moved otherwise; open without them.

Writes check.json, check.md and grid.png (final loss against LR per batch, seed 0) into `--out`
(default: the grid directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from cbert_jax.errors import ConfigError
from cbert_jax.report import grid as grid_lib
from cbert_jax.report.grid_read import GridError, Member, read_grid
from cbert_jax.scaling import laws as laws_lib

LR_MATCH = 0.02  # relative: the grid point that is the sweep's point (grid LRs are factors 2 apart)
CHECK = "check.json"


# ------------------------------------------------------------------------- the sweep's points ---
def sweep_points(experiment_spec: str, laws: str) -> dict[tuple[str, str], dict]:
  """{(arch, size): {"rows", "lr", "tokens_per_param", "member"}}: the batch and LR `laws` gives
  each seed-0 member of the experiment's sweep (`experiments/sweep.py:cpu`), resolved as the sweep
  resolves it. arch is the family, with "-nocms" for CrossBERT without CMS."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel (imports the models)

  path, _, arg = experiment_spec.partition(":")
  exp = config_lib.import_experiment(path, field="--experiment", needs=("get_config", "get_sweep"))
  out = {}
  for member in exp.get_sweep(arg or None):
    cfg = exp.get_config(member)
    cfg.sweep.laws = laws
    cfg = config_lib.resolve(cfg)
    if cfg.seed != 0:
      continue
    cms = cfg.masking.cms or cfg.model_name != "crossbert"
    out[(cfg.model_name + ("" if cms else "-nocms"), str(cfg.model.size))] = {
      "rows": int(cfg.batch_size),
      "lr": float(cfg.optim.lr),
      "tokens_per_param": float(cfg.sweep.tokens_per_param),
      "member": member,
    }
  if not out:
    raise ConfigError(f"--experiment {experiment_spec!r}: its sweep has no seed-0 member")
  return out


# --------------------------------------------------------------------------- the decision ---
def _seed_losses(members: list[Member]) -> dict[tuple[int, float], dict[int, float]]:
  """{(rows, lr): {seed: loss}} of finished members (+inf for a diverged one)."""
  points: dict[tuple[int, float], dict[int, float]] = {}
  for m in members:
    seeds = points.setdefault((m.batch_size, m.lr), {})
    if m.seeds[0] in seeds:
      raise GridError(
        f"--grid: two members at {m.arch} {m.size}, {m.batch_size} rows, lr {m.lr:.4g} with seed "
        f"{m.seeds[0]} (one is {m.name}); keep one of them"
      )
    seeds[m.seeds[0]] = m.loss if m.state == "done" else math.inf
  return points


def judge(members: list[Member], centre: tuple[int, float] | None) -> dict:
  """The verdict for one (family, size) group: its points with their seeds' losses, the seed-0
  best, its edges, and {"status": moved | not moved | open, "why": one sentence}. `centre` is the
  sweep's (rows, lr), None when the experiment has no such member."""
  points = _seed_losses(members)
  match = None
  if centre is not None:
    near = [p for p in points if p[0] == centre[0] and abs(p[1] / centre[1] - 1) <= LR_MATCH]
    match = near[0] if near else None
  out = {
    "points": [
      {"rows": p[0], "lr": p[1], "losses": {str(s): v for s, v in sorted(points[p].items())}}
      for p in sorted(points)
    ],
    "centre": None if centre is None else {"rows": centre[0], "lr": centre[1]},
    "centre_point": None if match is None else {"rows": match[0], "lr": match[1]},
  }
  seed0 = {p: s[0] for p, s in points.items() if math.isfinite(s.get(0, math.inf))}
  if match is None:
    return out | {"status": "open", "why": "the sweep's point has not been run", "best": None}
  if not seed0:
    return out | {"status": "open", "why": "no seed-0 member finished", "best": None}
  best = min(seed0, key=seed0.get)
  by_point = {(m.batch_size, m.lr): m for m in members if m.seeds[0] == 0}
  edges = grid_lib.edges_of(by_point[best], members)
  out |= {"best": {"rows": best[0], "lr": best[1], "loss": seed0[best]}, "edges": edges}
  where = "the sweep's point" if best == match else f"{best[0]} rows, lr {best[1]:.3g}"
  if edges:
    why = f"the seed-0 best ({where}) is on the grid's edge ({'; '.join(edges)}): run beyond it"
    return out | {"status": "open", "why": why}
  if best == match:
    return out | {"status": "not moved", "why": "the seed-0 best is the sweep's point"}
  pair = [points[best], points[match]]
  if any(len(s) < 2 for s in pair):
    why = f"the seed-0 best is {where}; a second seed of it and of the sweep's point decides"
    return out | {"status": "open", "why": why}
  means = [statistics.mean(s.values()) for s in pair]
  spread = max(max(s.values()) - min(s.values()) for s in pair)
  moved = means[1] - means[0] > spread
  why = (
    f"seed-0 best {where}; seed means {means[0]:.4f} (best) vs {means[1]:.4f} (the sweep's "
    f"point), the sweep's point minus the best {means[1] - means[0]:+.4f}, the larger seed "
    f"range {spread:.4f}"
  )
  return out | {
    "status": "moved" if moved else "not moved",
    "why": why,
    "means": {"best": means[0], "centre": means[1]},
    "seed_range": spread,
  }


def _family(arch: str) -> str:
  """The family whose laws an arch reads ("crossbert-nocms" -> "crossbert")."""
  return arch.split("-")[0]


def check(
  grid: str, experiment_spec: str, laws: str, metric: str = "val_full", members=None
) -> dict:
  """Every (family, size) group of the grid judged against the experiment's points under `laws`.
  `members`: the grid as `read_grid(grid, metric)` returns it, when already read."""
  members = read_grid(grid, metric) if members is None else members
  finished = [m for m in members if m.state in ("done", "diverged")]
  pending = sorted(m.name for m in members if m.state not in ("done", "diverged"))
  centres = sweep_points(experiment_spec, laws)
  budgets = {m.tokens_per_param for m in finished}
  swept = {c["tokens_per_param"] for c in centres.values()}
  if len(budgets) > 1 or budgets != swept:
    raise GridError(
      f"--grid {grid!r}: its members trained at {sorted(budgets)} tokens per parameter and the "
      f"sweep {experiment_spec!r} at {sorted(swept)}: a check where the laws are used trains at "
      "the sweep's budget"
    )
  fitted = {}
  for arch in sorted({m.arch for m in finished}):
    loaded = laws_lib.load(laws_lib.for_model(laws, _family(arch)))
    fitted[arch] = loaded.tokens_per_param
  groups = []
  sizes = {(m.arch, m.size): m.n_params for m in finished}
  for arch, size in sorted(sizes, key=lambda k: (sizes[k], k[0])):  # by size, then family
    group = [m for m in finished if (m.arch, m.size) == (arch, size)]
    c = centres.get((arch, size))
    verdict = judge(group, None if c is None else (c["rows"], c["lr"]))
    groups.append({"arch": arch, "size": size, "n_params": group[0].n_params} | verdict)
  return {
    "grid": grid,
    "experiment": experiment_spec,
    "laws": laws,
    "laws_tokens_per_param": fitted,
    "tokens_per_param": budgets.pop() if budgets else None,
    "metric": metric,
    "groups": groups,
    "pending": pending,
  }


# ---------------------------------------------------------------------------- next runs ---
# Beyond a best on an edge: one grid step (x2 or x1/2) along that edge at the best's other
# coordinate (PLAN.md's edge rule); "1 row" and "only one ... tried" have no automatic next point
# (no grid goes below 1 row; a group with one point needs its planned grid first).
_BEYOND = {
  "highest lr": lambda rows, lr: (rows, lr * 2),
  "lowest lr": lambda rows, lr: (rows, lr / 2),
  "highest batch": lambda rows, lr: (rows * 2, lr),
  "lowest batch": lambda rows, lr: (int(rows / 2 + 0.5), lr) if rows > 1 else None,
}


def next_runs(group: dict) -> list[tuple[int, float, int]]:
  """(rows, lr, seed) the decision rule asks for next in one judged group (`judge`'s output with
  "arch" and "size"): a point beyond each edge the seed-0 best sits on, else seed 1 of the best
  and of the sweep's point where missing; [] once the group is decided or when no rule applies."""
  if group["status"] != "open" or not group.get("best"):
    return []
  best = (group["best"]["rows"], group["best"]["lr"])
  if group.get("edges"):
    out = []
    for edge in group["edges"]:
      step = _BEYOND.get(edge.split(" (")[0])
      point = step(*best) if step else None
      if point and point not in out:
        out.append(point)
    return [(rows, lr, 0) for rows, lr in out]
  centre = (group["centre_point"]["rows"], group["centre_point"]["lr"])
  seeded = {(p["rows"], p["lr"]) for p in group["points"] if "1" in p["losses"]}
  return [(rows, lr, 1) for rows, lr in (best, centre) if (rows, lr) not in seeded]


# ------------------------------------------------------------------------------- output ---
def load(directory: str) -> dict:
  """check.json in `directory` (written by this command), for the scaling report's laws section;
  GridError naming the file when it is missing or not a check."""
  path = os.path.join(directory, CHECK)
  try:
    with open(path, encoding="utf-8") as f:
      result = json.load(f)
    if not isinstance(result.get("groups"), list) or not result.get("laws"):
      raise ValueError("no 'groups' or 'laws'")
  except FileNotFoundError as e:
    raise GridError(
      f"--lawcheck: no {path} (write it with python -m cbert_jax.report.lawcheck --grid "
      f"{directory} ...)"
    ) from e
  except (ValueError, AttributeError) as e:
    raise GridError(f"--lawcheck: {path} is not a check of laws ({e})") from e
  result["dir"] = directory
  return result


def for_spec(result: dict, spec: str) -> dict | None:
  """`result` with only the groups whose family read the laws file `spec` (as the members resolved
  it: "shipped:cpu-bert" for laws "shipped:cpu-{model}"); None when no group did."""
  groups = [
    g for g in result["groups"] if laws_lib.for_model(result["laws"], _family(g["arch"])) == spec
  ]
  return result | {"groups": groups} if groups else None


def summary_line(result: dict) -> str:
  """One bullet for the scaling report: where the laws were checked and each group's verdict."""
  by_status: dict[str, list[str]] = {}
  for g in result["groups"]:
    by_status.setdefault(g["status"], []).append(f"{g['arch']} {g['size']}")
  parts = []
  for status in ("moved", "not moved", "open"):
    if status in by_status:
      parts.append(f"{status} at {', '.join(by_status[status])}")
  moved = [g for g in result["groups"] if g["status"] == "moved"]
  detail = "".join(
    f" {g['arch']} {g['size']}: best {g['best']['rows']} rows, lr {g['best']['lr']:.3g} against "
    f"the sweep's {g['centre_point']['rows']} rows, lr {g['centre_point']['lr']:.3g} (seed means "
    f"{g['means']['best']:.4f} vs {g['means']['centre']:.4f}, seed range {g['seed_range']:.4f})."
    for g in moved
  )
  return (
    f"* Checked at {result['tokens_per_param']:g} tokens per parameter around the sweep's own "
    f"points (`{os.path.join(result['dir'], 'check.md')}`; a best moved when its seed mean beats "
    f"the sweep's point's by more than the seeds' range): {'; '.join(parts)}.{detail}"
  )


def _loss(v: float | None) -> str:
  if v is None:
    return ""
  return f"{v:.4f}" if math.isfinite(v) else "diverged"


def markdown(result: dict) -> str:
  """check.md: every point's seed losses, then each group's verdict."""
  seeds = sorted({int(s) for g in result["groups"] for p in g["points"] for s in p["losses"]})
  fitted = ", ".join(
    f"{a} {'not recorded' if t is None else f'{t:g}'}"
    for a, t in result["laws_tokens_per_param"].items()
  )
  lines = [
    f"# The LR/batch laws checked at {result['tokens_per_param']:g} tokens per parameter",
    "",
    f"Grid `{result['grid']}`; the sweep's points: what `{result['laws']}` gives "
    f"`{result['experiment']}` (laws fitted at {fitted} tokens per parameter); final "
    f"`{result['metric']}` loss (`python -m cbert_jax.report.lawcheck`).",
    "",
    "| family | size | rows | peak LR | " + " | ".join(f"seed {s}" for s in seeds) + " | |",
    "|---|---|---|---|" + "---|" * len(seeds) + "---|",
  ]
  for g in result["groups"]:
    centre = g["centre_point"]
    best = g.get("best")
    for p in g["points"]:
      here = (p["rows"], p["lr"])
      marks = []
      if centre and here == (centre["rows"], centre["lr"]):
        marks.append("sweep's point")
      if best and here == (best["rows"], best["lr"]):
        marks.append("seed-0 best")
      cells = " | ".join(_loss(p["losses"].get(str(s))) for s in seeds)
      lines.append(
        f"| {g['arch']} | {g['size']} | {p['rows']} | {p['lr']:.4g} | {cells} | "
        f"{', '.join(marks)} |"
      )
  lines.append("")
  for g in result["groups"]:
    lines.append(f"* {g['arch']} {g['size']}: **{g['status']}**: {g['why']}")
  if result["pending"]:
    lines += ["", f"Not finished (not counted): {', '.join(result['pending'])}."]
  return "\n".join(lines)


def plot(members: list[Member], path: str, metric: str = "val_full") -> None:
  """grid.png: seed 0's final loss against LR, one line per batch, one panel per (family, size)
  of the grid `members` (`read_grid`)."""
  from cbert_jax.report import grid_plot  # pylint: disable=import-outside-toplevel

  seed0 = [m for m in members if m.seeds == (0,)]
  optima, _, _ = grid_lib.select(seed0, optimum="argmin")
  grid_plot.draw_curves(optima, path, metric)


# ---------------------------------------------------------------------------------- CLI ---
def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m cbert_jax.report.lawcheck", description=__doc__)
  p.formatter_class = argparse.RawDescriptionHelpFormatter
  p.add_argument("--grid", required=True, help="the check's member workdirs")
  p.add_argument(
    "--experiment", required=True, help="FILE:ARG naming the sweep (experiments/sweep.py:cpu)"
  )
  p.add_argument(
    "--laws", required=True, help="the laws checked, as sweep.laws names them (shipped:cpu-{model})"
  )
  p.add_argument("--out", default=None, help="where check.json/.md and grid.png go (the grid)")
  p.add_argument("--no_plot", action="store_true", help="skip grid.png")
  p.add_argument(
    "--next",
    action="store_true",
    help="print the runs the rule asks for next, one 'model size rows lr seed' per line, and "
    "write nothing (a runner's input)",
  )
  p.add_argument(
    "--wait_for",
    action="append",
    default=[],
    help="with --next: model:size whose planned runs are not all finished (no next runs for it)",
  )
  ns = p.parse_args(argv)
  out = ns.out or ns.grid
  try:
    members = read_grid(ns.grid)
    result = check(ns.grid, ns.experiment, ns.laws, members=members)
    if ns.next:
      for g in result["groups"]:  # arch: bert | crossbert | crossbert-nocms (without CMS)
        if f"{g['arch']}:{g['size']}" not in ns.wait_for:
          for rows, lr, seed in next_runs(g):
            print(f"{g['arch']} {g['size']} {rows} {lr:.6g} {seed}")
      return 0
    os.makedirs(out, exist_ok=True)
    text = markdown(result)
    with open(os.path.join(out, CHECK), "w") as f:
      json.dump(result, f, indent=2)
    with open(os.path.join(out, "check.md"), "w") as f:
      f.write(text + "\n")
    if not ns.no_plot:
      plot(members, os.path.join(out, "grid.png"))
  except (GridError, ConfigError) as e:
    print(f"lawcheck error: {e}", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
