"""The scaling report's figures (PNG): loss and probe scores vs compute (every seed, the seed means
and the law fitted to them), the analytic training FLOPs per data token per member, and
CrossBERT's loss curves with and without CMS.
"""

from __future__ import annotations

import os

import numpy as np

from cbert_jax.report.fits import ALL_ARCHS, PROBES, usable
from cbert_jax.run import plotting

COLORS = {"bert": "tab:blue", "crossbert": "tab:red", "crossbert-nocms": "tab:orange"}
PROBE_TITLES = {
  "ridge": "frozen ridge probe (mean test score)",
  "logreg": "frozen logistic-regression probe\n(mean test accuracy, classification tasks)",
  "knn": "frozen kNN probe (mean test score)",
  "retrieval": "frozen retrieval (mean nDCG@10)",
}


def _figure(root: str):
  """(Figure, FigureCanvasAgg), matplotlib's font cache in the sweep's `.matplotlib`."""
  return plotting.matplotlib_classes(os.path.join(root, ".matplotlib"))


def plot_loss(members, groups, fits, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  for arch in ALL_ARCHS:
    pts = usable(members, arch)
    gs = [g for g in groups if g["arch"] == arch and g["loss"]["n"] and g["compute"] > 0]
    if not pts:
      continue
    ax.scatter(
      [m["compute"] for m in pts],
      [m["final_loss"] for m in pts],
      color=COLORS[arch],
      s=10,
      alpha=0.5,
      zorder=3,
    )
    c = np.array([g["compute"] for g in gs])
    y = [g["loss"]["mean"] for g in gs]
    ax.scatter(
      c, y, color=COLORS[arch], marker="D", label=f"{arch} (seed mean; dots: seeds)", zorder=4
    )
    for g in gs:
      ax.annotate(
        g["size"],
        (g["compute"], g["loss"]["mean"]),
        fontsize=7,
        xytext=(3, 3),
        textcoords="offset points",
      )
    f = fits.get(arch)
    if f and len(gs) >= 2:
      xs = np.geomspace(c.min(), c.max(), 50)
      if "saturating" in f and f["saturating"].get("e") is not None:  # an interior floor
        s = f["saturating"]
        ax.plot(
          xs,
          s["e"] + s["b"] * xs ** -s["beta"],
          color=COLORS[arch],
          lw=1,
          label=f"{arch}: {s['e']:.2f} + b C^-{s['beta']:.3f}",
        )
      else:
        p = f["power_law"]
        ax.plot(
          xs,
          p["a"] * xs ** p["alpha"],
          color=COLORS[arch],
          lw=1,
          label=f"{arch}: a C^{p['alpha']:.3f}",
        )
  ax.set_xscale("log")
  ax.set_yscale("log")
  plotting.plain_log_ticks(ax.yaxis)  # losses span 3-7: "4", "5", "6", not "6 x 10^0"
  ax.set_xlabel("training compute C (FLOPs)")
  ax.set_ylabel("final validation MLM loss (full split)")
  ax.set_title("MLM loss vs compute (levels differ by task: compare trends)", fontsize=9)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_probes(members, groups, probe_fits, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(4 * len(PROBES), 4))
  for i, key in enumerate(PROBES):
    ax = fig.add_subplot(1, len(PROBES), i + 1)
    drawn = False
    for arch in ALL_ARCHS:
      pts = usable(members, arch, key)
      if not pts:
        continue
      drawn = True
      ax.plot(
        [m["compute"] for m in pts],
        [m["probes"][key] for m in pts],
        ".",
        color=COLORS[arch],
        alpha=0.5,
      )
      gs = [g for g in groups if g["arch"] == arch and key in g["probes"] and g["compute"] > 0]
      c = np.array([g["compute"] for g in gs])
      ax.plot(
        c,
        [g["probes"][key]["mean"] for g in gs],
        "D",
        color=COLORS[arch],
        label=f"{arch} (seed mean)",
      )
      t = probe_fits.get(arch, {}).get(key)
      if t:
        xs = np.geomspace(c.min(), c.max(), 20)
        ax.plot(
          xs,
          t["intercept"] + t["slope_per_decade"] * np.log10(xs),
          color=COLORS[arch],
          lw=1,
          alpha=0.7,
          label=f"{arch} {key}: {t['slope_per_decade']:+.3f}/decade",
        )
    if not drawn:
      ax.text(0.5, 0.5, f"{key}: not run", ha="center", va="center", transform=ax.transAxes)
    else:
      ax.set_xscale("log")
      ax.legend(fontsize=7)
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_title(PROBE_TITLES[key], fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_flops_per_token(groups, path, root) -> None:
  """Analytic training FLOPs per data token vs N: what the architectures cost, not a speed."""
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  for arch in ALL_ARCHS:
    gs = [g for g in groups if g["arch"] == arch and g["flops_per_token"] and g["n_params"]]
    if gs:
      ax.plot(
        [g["n_params"] for g in gs],
        [g["flops_per_token"] for g in gs],
        "o-",
        color=COLORS[arch],
        label=arch,
      )
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("N (non-embedding parameters)")
  ax.set_ylabel("training FLOPs per data token (analytic)")
  ax.set_title(
    "training FLOPs per data token (SPEC §4, analytic): not a measured throughput;\n"
    "for tokens/s run benchmarks/train_step.py",
    fontsize=9,
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_cms(members, eff, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  styles = ("o-", "s--", "^:", "v-.")
  metric = eff.get("metric") or "eval/loss"
  for m in members:
    if m["size"] == eff["size"] and m["arch"] in ("crossbert", "crossbert-nocms") and m["finished"]:
      curve = m["curves"].get(metric) or m["loss_curve"]
      ax.plot(
        [t for t, _ in curve],
        [x for _, x in curve],
        styles[m["seed"] % len(styles)],
        ms=3,
        color=COLORS[m["arch"]],
        label=m["name"] + (" (CMS)" if m["arch"] == "crossbert" else ""),
      )
  levels = [x for p in eff["pairs"] for x in p.get("levels", [])]
  if levels:
    ax.axhspan(min(levels), max(levels), color="grey", alpha=0.12, label="compared loss range")
  ax.set_xscale("log")
  ax.set_xlabel("training tokens seen")
  ax.set_ylabel(f"validation loss ({metric})")
  r = eff.get("ratio")
  ax.set_title(
    f"CMS sample efficiency at {eff['size']} (in-sweep control): "
    + (f"no CMS needs {r:.2f}x the tokens" if r else "curves do not overlap"),
    fontsize=9,
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)
