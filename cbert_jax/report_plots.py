"""The scaling report's figures (PNG): loss and probe scores vs compute with their fitted laws,
throughput and MFU per member, and CrossBERT's loss curves with and without CMS.
"""

from __future__ import annotations

import os

import numpy as np

from cbert_jax import plotting
from cbert_jax.report_fits import ARCHS, PROBES, usable

COLORS = {"bert": "tab:blue", "crossbert": "tab:red", "crossbert-nocms": "tab:orange"}


def _figure(root: str):
  """(Figure, FigureCanvasAgg), matplotlib's font cache in the sweep's `.matplotlib`."""
  return plotting.matplotlib_classes(os.path.join(root, ".matplotlib"))


def plot_loss(members, fits, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  for arch in (*ARCHS, "crossbert-nocms"):
    pts = usable(members, arch)
    if not pts:
      continue
    c = np.array([m["compute"] for m in pts])
    ax.scatter(c, [m["final_loss"] for m in pts], color=COLORS[arch], label=arch, zorder=3)
    for m in pts:
      ax.annotate(
        m["size"],
        (m["compute"], m["final_loss"]),
        fontsize=7,
        xytext=(3, 3),
        textcoords="offset points",
      )
    f = fits.get(arch)
    if f and len(pts) >= 2:
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
  ax.set_xlabel("training compute C (FLOPs)")
  ax.set_ylabel("final validation MLM loss")
  ax.set_title("MLM loss vs compute (levels differ by task: compare trends)", fontsize=9)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_probes(members, probe_fits, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(12, 4))
  for i, key in enumerate(PROBES):
    ax = fig.add_subplot(1, len(PROBES), i + 1)
    for arch in (*ARCHS, "crossbert-nocms"):
      pts = usable(members, arch, key)
      if not pts:
        continue
      c = np.array([m["compute"] for m in pts])
      y = np.array([m["probes"][key] for m in pts])
      ax.plot(c, y, "o", color=COLORS[arch], label=arch)
      t = probe_fits.get(arch, {}).get(key)
      if t:
        xs = np.geomspace(c.min(), c.max(), 20)
        ax.plot(
          xs,
          t["intercept"] + t["slope_per_decade"] * np.log10(xs),
          color=COLORS[arch],
          lw=1,
          alpha=0.7,
          label=f"{t['slope_per_decade']:+.3f}/decade",
        )
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_title(
      {
        "ridge": "frozen ridge probe (mean test score)",
        "knn": "frozen kNN probe (mean test score)",
        "retrieval": "frozen retrieval (mean nDCG@10)",
      }[key],
      fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_throughput(members, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(10, 4))
  ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
  for arch in (*ARCHS, "crossbert-nocms"):
    pts = [m for m in members if m["arch"] == arch and m["tokens_per_sec"]]
    if not pts:
      continue
    n = [m["n_params"] for m in pts]
    ax1.plot(n, [m["tokens_per_sec"] for m in pts], "o-", color=COLORS[arch], label=arch)
    ax2.plot(n, [100 * (m["mfu"] or 0) for m in pts], "o-", color=COLORS[arch], label=arch)
  for ax, label in ((ax1, "training tokens/s (median)"), (ax2, "MFU (%)")):
    ax.set_xscale("log")
    ax.set_xlabel("N (non-embedding parameters)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def plot_cms(members, eff, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  for m in members:
    if m["size"] == eff["size"] and m["arch"] in ("crossbert", "crossbert-nocms"):
      t = [t for t, _ in m["loss_curve"]]
      ax.plot(
        t,
        [l for _, l in m["loss_curve"]],
        "o-",
        ms=3,
        color=COLORS[m["arch"]],
        label=m["name"] + (" (CMS)" if m["arch"] == "crossbert" else ""),
      )
  ax.set_xscale("log")
  ax.set_xlabel("training tokens seen")
  ax.set_ylabel("validation loss (50% of tokens predicted)")
  r = eff.get("ratio")
  ax.set_title(
    f"CMS sample efficiency at {eff['size']}: "
    + (f"{r:.2f}x fewer tokens to the same loss" if r else "curves do not overlap"),
    fontsize=9,
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  Canvas(fig).print_png(path)
