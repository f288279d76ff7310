r"""The fair CMS comparison's analysis (experiments/cms_fair.py): each arm at its own batch and LR.

  python -m cbert_jax.report.cms_fair --runs runs/cms_fair/grid runs/cms_fair/compare [--out DIR]

Reads the member workdirs under each --runs root, one per stage, as cbert_jax.report.cms reads them
(config.json, the `half` full-split validation records, the final offline probe suite), and writes
<out>/cms_fair.md, cms_fair.json and cms_fair.png (the grid's losses; `half` loss against training
FLOPs of every stage-B member). Unlike
the controlled experiment, the arms' batch, LR and steps differ by design; they must share the
sequence length and N. A member without its final validation record is listed as unfinished and
left out. Reads files only: no JAX.

The rule, as experiments/cms_fair.py declared it before its runs:
  * the grid (no-CMS, seed 2): the final `half` loss per (rows, LR), its best, whether the best
    lies on the edge of the points run (then the edge rule asks for the points beyond it);
  * the no-CMS best: the seed-2 best when its 2-seed mean (seeds 2, 3) beats the centre's 2-seed
    mean, else the centre;
  * tokens to a level, no-CMS at its best against CMS at its own, per seed: cbert_jax.report.cms's
    levels and interpolation; median over levels, then the mean over seeds;
  * matched FLOPs: `cms_flops` - no-CMS final `half` loss and final probe averages; equal tokens:
    `cms` - no-CMS final probe averages; per seed and the mean; a difference whose seeds disagree
    in sign is unresolved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from cbert_jax.report import cms as cms_lib
from cbert_jax.run import plotting
from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib

CENTRE = (7, 2.68e-3)  # experiments/cms_fair.py's CENTRE (tested equal)
SEEDS = (2, 3)  # experiments/cms_fair.py's SEEDS: the grid's seed first
PREMISE = ("seq_len", "n_params")  # what every member must share
ARMS = ("cms", "nocms", "cms_flops")
LABEL = {"cms": "CMS", "nocms": "no-CMS", "cms_flops": "CMS at no-CMS's FLOPs"}
DESIGN = __doc__.split("\n\n")[2]  # the docstring's paragraph on the rule, quoted in the report


class FairError(cms_lib.CmsError):
  """The runs cannot be analysed as the experiment declared (the message is one line)."""


def _point(m: dict) -> tuple[int, float]:
  return int(m["batch_size"]), float(m["lr"])


def read(runs: list[str]) -> tuple[list[dict], list[str]]:
  """(finished members under the roots `runs`, with their arm; warnings for unfinished ones)."""
  members, warnings = [], []
  for m in (m for root in runs for m in cms_lib.read_runs(root)):
    arg = record_lib.read_config(m["path"]).get("sweep", {}).get("arg", "")
    fields = dict(kv.split("=", 1) for kv in str(arg).split(",") if "=" in kv)
    if fields.get("arm") not in ARMS:
      raise FairError(f"{m['path']}: sweep.arg {arg!r} names no arm of {', '.join(ARMS)}")
    m["arm"] = fields["arm"]
    if not m["complete"]:
      warnings.append(f"{m['name']}: unfinished (no val_full record at its last step), left out")
      continue
    members.append(m)
  if not members:
    raise FairError(f"--runs: {' '.join(runs)} hold no finished member")
  for k in PREMISE:
    values = {m[k] for m in members}
    if len(values) > 1:
      raise FairError(f"--runs: the members differ in {k} ({sorted(values)}); they must share it")
  return members, warnings


def final_loss(m: dict) -> float:
  return float(m["curve"][-1]["half_loss"])


def final_probes(m: dict) -> dict:
  """The final offline suite's averages ({} when the member has none)."""
  last = [p for p in m["probes"] if p["step"] == m["total_steps"]]
  return {k: v for k, v in last[-1].items() if k not in ("step", "tokens")} if last else {}


def grid(members: list[dict]) -> dict:
  """The no-CMS grid at the first seed, its best, edge, seed-2 means and the decision."""
  first = {_point(m): m for m in members if m["arm"] == "nocms" and m["seed"] == SEEDS[0]}
  if not first:
    return {"points": [], "best": None}
  points = [{"rows": r, "lr": lr, "loss": final_loss(m)} for (r, lr), m in sorted(first.items())]
  best = min(points, key=lambda p: p["loss"])
  rows, lrs = {p["rows"] for p in points}, {p["lr"] for p in points}
  edge = [
    side
    for side, on in (
      ("the smallest batch", best["rows"] == min(rows)),
      ("the largest batch", best["rows"] == max(rows)),
      ("the lowest LR", best["lr"] == min(lrs)),
      ("the highest LR", best["lr"] == max(lrs)),
    )
    if on
  ]
  second = {
    _point(m): final_loss(m) for m in members if m["arm"] == "nocms" and m["seed"] == SEEDS[1]
  }
  out = {"points": points, "best": best, "edge": edge, "centre": list(CENTRE)}
  b, c = (best["rows"], best["lr"]), CENTRE
  means = {}
  for name, p in (("best", b), ("centre", c)):
    if p in first and p in second:
      means[name] = statistics.fmean([final_loss(first[p]), second[p]])
  out["two_seed_means"] = means
  if b == c:
    out["decision"] = {"point": list(c), "why": "the seed-2 best is the centre"}
  elif len(means) == 2:
    won = means["best"] < means["centre"]
    out["decision"] = {
      "point": list(b if won else c),
      "why": f"2-seed means: best {means['best']:.4f}, centre {means['centre']:.4f}",
    }
  else:
    out["decision"] = None  # seed 3 of the best and the centre not yet run
  return out


def _diff(a: dict, b: dict, key) -> dict:
  """key(a) - key(b) per seed present in both, the mean and whether the seeds agree in sign."""
  seeds = {s: key(a[s]) - key(b[s]) for s in SEEDS if s in a and s in b}
  if not seeds:
    return {"seeds": {}, "mean": None, "resolved": False}
  signs = {v > 0 for v in seeds.values()}
  out = {"seeds": {str(s): v for s, v in seeds.items()}, "mean": statistics.fmean(seeds.values())}
  return out | {"resolved": len(seeds) == len(SEEDS) and len(signs) == 1}


def compare(members: list[dict], best: tuple[int, float] | None) -> dict | None:
  """Stage B: tokens to a level (CMS vs no-CMS at its best), matched FLOPs, equal tokens."""
  arms: dict[str, dict[int, dict]] = {a: {} for a in ARMS}
  for m in members:
    if m["arm"] != "nocms" or (best and _point(m) == tuple(best)):
      arms[m["arm"]][m["seed"]] = m
  if not best or not arms["cms"] or not arms["nocms"]:
    return None
  pairs = [
    cms_lib.analyse_pair(arms["cms"][s], arms["nocms"][s])
    for s in SEEDS
    if s in arms["cms"] and s in arms["nocms"]
  ]
  out = {"pairs": pairs, "arms": {a: sorted(arms[a]) for a in ARMS}}
  ranged = {str(p["seed"]): p for p in pairs if p["shared_range"]}
  for key in ("tokens_ratio", "flops_ratio"):
    seeds = {s: p[key]["median"] for s, p in ranged.items()}
    out[key] = {"mean": statistics.fmean(seeds.values()) if seeds else None, "seeds": seeds}
  out["flops"] = {
    a: {str(s): float(m["curve"][-1]["flops"]) for s, m in arms[a].items()} for a in ARMS
  }
  out["matched_loss"] = _diff(arms["cms_flops"], arms["nocms"], final_loss)
  probes = sorted({k for a in ARMS for m in arms[a].values() for k in final_probes(m)})
  out["matched_probes"] = {
    k: _diff(arms["cms_flops"], arms["nocms"], lambda m, k=k: final_probes(m).get(k, float("nan")))
    for k in probes
  }
  out["equal_token_probes"] = {
    k: _diff(arms["cms"], arms["nocms"], lambda m, k=k: final_probes(m).get(k, float("nan")))
    for k in probes
  }
  out["final_loss"] = {a: {str(s): final_loss(m) for s, m in arms[a].items()} for a in ARMS}
  return out


# ------------------------------------------------------------------------------- outputs ---
def _seeds(d: dict, fmt: str = "+.4f") -> str:
  if d["mean"] is None:
    return "-"
  per = ", ".join(f"seed {s} {v:{fmt}}" for s, v in d["seeds"].items())
  return f"{d['mean']:{fmt}} ({per}){'' if d['resolved'] else ', unresolved'}"


def markdown(result: dict) -> str:
  g, c = result["grid"], result["compare"]
  L = [
    "# A fair CMS comparison: each arm at its own batch and LR",
    "",
    "Runs: " + ", ".join(f"`{r}`" for r in result["runs"]) + ".",
  ]
  L += ["", DESIGN, "", "## Stage A: the no-CMS grid, seed 2 (final `half` loss)", ""]
  if g["points"]:
    lrs = sorted({p["lr"] for p in g["points"]})
    L += [cms_lib._row("rows \\ LR", *(f"{lr:.3g}" for lr in lrs)), "|---" * (len(lrs) + 1) + "|"]
    for rows in sorted({p["rows"] for p in g["points"]}):
      by_lr = {p["lr"]: p["loss"] for p in g["points"] if p["rows"] == rows}
      L.append(cms_lib._row(rows, *(f"{by_lr[lr]:.4f}" if lr in by_lr else "" for lr in lrs)))
    b = g["best"]
    L += ["", f"Best: {b['rows']} rows, LR {b['lr']:.3g}: {b['loss']:.4f}."]
    if g["edge"]:
      L.append(f"On the edge of the points run ({', '.join(g['edge'])}): the edge rule applies.")
    d = g["decision"]
    L.append(
      f"No-CMS best by the rule: {d['point'][0]} rows, LR {d['point'][1]:.3g} ({d['why']})."
      if d
      else "No decision yet: seed 3 of the best and of the centre have not both finished."
    )
  else:
    L.append("No grid member has finished.")
  L += ["", "## Stage B", ""]
  if not c:
    L.append("Not run yet (needs the no-CMS best and finished CMS and no-CMS members).")
  else:
    L += ["Final `half` loss and training FLOPs per member:", ""]
    L += ["| arm | seed | final half loss | training FLOPs |", "|---|---|---|---|"]
    for a in ARMS:
      for s, v in c["final_loss"][a].items():
        L.append(cms_lib._row(LABEL[a], s, f"{v:.4f}", f"{c['flops'][a][s]:.4g}"))
    t, f = c["tokens_ratio"], c["flops_ratio"]
    per = lambda d: ", ".join(f"seed {k} {v:.3g}" for k, v in d["seeds"].items()) or "-"
    L += [
      "",
      f"* Tokens to a level, no-CMS / CMS (> 1: CMS needs fewer): {cms_lib._g(t['mean'])} "
      f"({per(t)}); the FLOPs ratio it implies: {cms_lib._g(f['mean'])} ({per(f)}).",
      f"* At matched training FLOPs, final `half` loss CMS - no-CMS (< 0: CMS lower): "
      f"{_seeds(c['matched_loss'])}.",
    ]
    for what, key in (
      ("At matched FLOPs", "matched_probes"),
      ("At equal tokens", "equal_token_probes"),
    ):
      parts = [f"{k} {_seeds(v)}" for k, v in c[key].items()]
      L.append(f"* {what}, final probe averages CMS - no-CMS: {'; '.join(parts) or '-'}.")
  L += [f"* warning: {w}" for w in result["warnings"]]
  return "\n".join(L) + "\n"


def plot(result: dict, members: list[dict], path: str, root: str) -> None:
  """Two panels: the no-CMS grid's final `half` loss per (rows, LR) at the first seed, the best
  boxed; and `half` loss against training FLOPs of every stage-B member (one colour per arm, one
  line style per seed), or a note that stage B has not run."""
  Figure, Canvas = plotting.matplotlib_classes(os.path.join(root, ".matplotlib"))
  from matplotlib import patches  # pylint: disable=import-outside-toplevel  # after the setup

  fig = Figure(figsize=(12, 4.5))
  g = result["grid"]
  ax = fig.add_subplot(1, 2, 1)
  if g["points"]:
    rows = sorted({p["rows"] for p in g["points"]})
    lrs = sorted({p["lr"] for p in g["points"]})
    grid_loss = [[float("nan")] * len(lrs) for _ in rows]
    for p in g["points"]:
      grid_loss[rows.index(p["rows"])][lrs.index(p["lr"])] = p["loss"]
    im = ax.imshow(grid_loss, cmap="viridis_r", aspect="auto", origin="lower")
    for p in g["points"]:
      i, j = rows.index(p["rows"]), lrs.index(p["lr"])
      best = p == g["best"]
      dark = im.norm(p["loss"]) > 0.5  # viridis_r: high losses are the dark cells
      ax.text(
        j,
        i,
        f"{p['loss']:.3f}",
        ha="center",
        va="center",
        fontsize=9,
        fontweight="bold" if best else "normal",
        color="w" if dark else "k",
      )
      if best:  # the best point boxed
        ax.add_patch(patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2.5, ec="r"))
    ax.set_xticks(range(len(lrs)), [f"{lr:.3g}" for lr in lrs])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    fig.colorbar(im, ax=ax, label="final val_full half loss")
  ax.set(xlabel="peak LR", ylabel="rows per step", title=f"no-CMS grid, seed {SEEDS[0]}")
  ax = fig.add_subplot(1, 2, 2)
  c = result["compare"] or {"arms": {}}
  best = (g.get("decision") or {}).get("point")
  for i, a in enumerate(ARMS):
    for m in members:
      if m["arm"] != a or m["seed"] not in c["arms"].get(a, []):
        continue
      if a == "nocms" and list(_point(m)) != list(best or []):
        continue
      pts = [(p["flops"], p["half_loss"]) for p in m["curve"]]
      ls = "-" if m["seed"] == SEEDS[0] else "--"
      ax.plot(*zip(*pts), ls=ls, color=f"C{i}", label=f"{LABEL[a]} seed {m['seed']}")
  if ax.lines:
    ax.set(xscale="log")
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, "stage B: not run yet", ha="center", va="center", transform=ax.transAxes)
  ax.set(xlabel="training FLOPs", ylabel="val_full half loss", title="each arm at its own best")
  ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def analyse(runs: list[str], out: str | None = None) -> dict:
  """Reads the roots `runs` and writes cms_fair.md, .json and .png to `out` (default
  <first root>/report)."""
  members, warnings = read(runs)
  g = grid(members)
  best = tuple(g["decision"]["point"]) if g.get("decision") else None
  result = {"runs": list(runs), "warnings": warnings, "grid": g}  # as given: relative stays so
  result["compare"] = compare(members, best)
  out = out or os.path.join(runs[0], "report")
  os.makedirs(out, exist_ok=True)
  files = [os.path.join(out, f"cms_fair{ext}") for ext in (".md", ".json", ".png")]
  with open(files[0], "w") as f:
    f.write(markdown(result))
  status_lib.write_json_atomic(files[1], result)
  plot(result, members, files[2], runs[0])
  return result | {"files": files}


def main(argv=None) -> int:
  """The CLI: 0, or 2 with a one-line `cms_fair error:` on stderr."""
  parser = argparse.ArgumentParser("python -m cbert_jax.report.cms_fair", description=DESIGN)
  parser.add_argument(
    "--runs", required=True, nargs="+", help="each stage's root (member workdirs)"
  )
  parser.add_argument(
    "--out", default=None, help="output directory (default <first --runs root>/report)"
  )
  ns = parser.parse_args(argv)
  try:
    result = analyse(ns.runs, ns.out)
  except cms_lib.CmsError as e:
    print(f"cms_fair error: {e}", file=sys.stderr)
    return 2
  print("\n".join(result["files"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
