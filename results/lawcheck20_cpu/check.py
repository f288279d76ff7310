"""The LR/batch laws at the sweep's 20 tokens per parameter (issue 36, item 3): the verdict of
PLAN.md's decision rule on the archived runs in this directory, as RESULTS.md's tables and
grid.png.

  python results/lawcheck20_cpu/check.py        # prints the tables; writes grid.png beside it

Every number comes from the members' own files (config.json, eval/val_full-step_<N>.json), read
with `cbert_jax.report.grid_read`; the panels are `cbert_jax.report.grid_plot.draw_curves`.
"""

import os
import statistics
import sys

from cbert_jax.report import grid, grid_plot, grid_read

HERE = os.path.dirname(os.path.abspath(__file__))
# The sweep's own point per (family, size): what results/sweep_cpu trained (PLAN.md).
CENTRE = {
  ("bert", "d64L2"): (7, 0.00263),
  ("crossbert", "d64L2"): (7, 0.00268),
  ("bert", "d96L3"): (20, 0.00295),
  ("crossbert", "d96L3"): (17, 0.00247),
  # the refit stage (PLAN.md, 2026-12-06)
  ("bert", "d128L3"): (52, 0.003271),
  ("crossbert", "d128L3"): (43, 0.002263),
}


def seed(m: grid_read.Member) -> int:
  return 1 if m.name.endswith("_s1") else 0


def main() -> int:
  members = [m for m in grid_read.read_grid(HERE) if m.state == "done"]
  print("| family | size | rows | peak LR | seed 0 | seed 1 | sweep's point |")
  print("|---|---|---|---|---|---|---|")
  verdicts = []
  for (model, size), (rows, lr) in CENTRE.items():
    group = [m for m in members if m.model == model and m.size == size]
    if not group:
      verdicts.append(f"{model} {size}: no run archived yet")
      continue
    points = sorted({(m.batch_size, m.lr) for m in group})
    by = {(p, s): m.loss for m in group for p in [(m.batch_size, m.lr)] for s in [seed(m)]}
    for p in points:
      s1 = by.get((p, 1))
      print(
        f"| {model} | {size} | {p[0]} | {p[1]:.3g} | {by[(p, 0)]:.4f} | "
        f"{'' if s1 is None else f'{s1:.4f}'} | {'yes' if p == (rows, lr) else ''} |"
      )
    best = min((p for p in points if (p, 0) in by), key=lambda p: by[(p, 0)])
    centre = (rows, lr)
    if best == centre:
      verdicts.append(
        f"{model} {size}: the seed-0 best is the sweep's point; the optimum has not moved"
      )
      continue
    pair = [(by.get((best, 0)), by.get((best, 1))), (by.get((centre, 0)), by.get((centre, 1)))]
    if any(v is None for p in pair for v in p):
      verdicts.append(f"{model} {size}: seed 1 of the best or the centre is missing; no verdict")
      continue
    means = [statistics.mean(p) for p in pair]
    spread = max(abs(a - b) for a, b in pair)
    moved = means[1] - means[0] > spread
    verdicts.append(
      f"{model} {size}: seed-0 best {best[0]} rows, lr {best[1]:.3g}; 2-seed means best "
      f"{means[0]:.4f} vs the sweep's point {means[1]:.4f} (larger seed difference {spread:.4f}): "
      + ("the optimum has moved" if moved else "the optimum has not moved")
    )
  print()
  for v in verdicts:
    print(f"* {v}")
  optima, _, _ = grid.select([m for m in members if seed(m) == 0], optimum="argmin")
  grid_plot.draw_curves(optima, os.path.join(HERE, "grid.png"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
