"""The hyperparameter grid's plots: the fitted laws over the grid's points (laws.png)."""

from __future__ import annotations

import math
import os

import numpy as np

from cbert_jax.data import fetch
from cbert_jax.report.grid_read import Optimum
from cbert_jax.run import plotting
from cbert_jax.scaling import fit as fit_lib
from cbert_jax.scaling import laws as laws_lib

CI_LEVEL = fit_lib.LEVEL  # the bands' level (as the laws' intervals)
MARKERS = {"bert": "o", "crossbert": "s", "crossbert-nocms": "^"}


def mpl_cache_dir() -> str:
  """matplotlib's font cache: the package's cache ($CBERT_JAX_CACHE or ~/.cache/cbert_jax), not
  the plots' folder (laws may be written into the package or the repo's results/)."""
  return os.path.join(fetch.cache_root(), "matplotlib")


def law_axes(ax, xkey: str, ylabel: str) -> None:
  """A law panel's axes: log-log, x training compute (xkey "compute") or N ("n_params")."""
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("training compute C (FLOPs)" if xkey == "compute" else "N (parameters)")
  ax.set_ylabel(ylabel)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7, loc="best")


def _band(x, y, xs, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
  """Bootstrap percentile band of the fitted line at `xs` (exact or `n_boot` draws, as the
  laws' intervals; None without a bootstrap)."""
  if n_boot <= 0:
    return None
  boot = fit_lib.bootstrap_line(np.log(x), np.log(y), n_boot, seed)
  if not boot.has_interval:  # no band where the laws have no interval
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
  several share an x, y), diverged points as grey crosses, the best grid points as stars, the
  located optima the laws are fitted to (`grid_vertex`) as red diamonds."""
  Figure, FigureCanvasAgg = plotting.matplotlib_classes(mpl_cache_dir())  # pylint: disable=invalid-name
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
      # the located optimum the law is fitted to (the star itself for --optimum argmin)
      ax.scatter([x0], [getattr(o, ykey)], marker="D", s=22, c="tab:red", zorder=4)
    x = np.array([getattr(o.best, xkey) for o in optima], np.float64)
    y = np.array([getattr(o, ykey) for o in optima], np.float64)
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
    law_axes(ax, xkey, ylabel)
  fig.colorbar(
    cm.ScalarMappable(norm=norm, cmap=cmap),
    ax=fig.axes,
    label="final val loss - best of its size (grey x: diverged; star: best grid point; "
    "red diamond: located optimum)",
  )
  fig.suptitle(
    f"hyperparameter laws ({', '.join(sorted({o.best.arch for o in optima}))}; "
    "markers: o bert, s crossbert)",
    fontsize=10,
  )
  FigureCanvasAgg(fig).print_png(path)


def draw_curves(optima: list[Optimum], path: str, metric: str = "val_full") -> None:
  """grid.png: one panel per (model, size), final validation loss (`metric`) against peak LR
  (log x), one line per batch size; the size's best run starred, diverged runs as crosses on the
  panel's top edge, the located lr* (what the law is fitted to) as a red dotted line. What the
  optima in laws.png were chosen from."""
  Figure, FigureCanvasAgg = plotting.matplotlib_classes(mpl_cache_dir())  # pylint: disable=invalid-name
  import matplotlib  # pylint: disable=import-outside-toplevel
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel

  archs = sorted({o.best.arch for o in optima})
  cols = max(sum(o.best.arch == a for o in optima) for a in archs)
  fig = Figure(figsize=(4.2 * cols, 3.4 * len(archs)), layout="constrained")
  cmap = matplotlib.colormaps["plasma"]
  for r, arch in enumerate(archs):
    row = sorted((o for o in optima if o.best.arch == arch), key=lambda o: o.best.compute)
    for c, o in enumerate(row):
      ax = fig.add_subplot(len(archs), cols, r * cols + c + 1)
      finite = [m.loss for m in o.members if math.isfinite(m.loss)]
      top = max(finite) + 0.05 * (max(finite) - min(finite) + 1e-3)
      batches = sorted({m.batch_size for m in o.members})
      for i, b in enumerate(batches):
        at = sorted((m for m in o.members if m.batch_size == b), key=lambda m: m.lr)
        ok = [m for m in at if math.isfinite(m.loss)]
        colour = cmap(0.85 * i / max(1, len(batches) - 1))
        ax.plot(
          [m.lr for m in ok],
          [m.loss for m in ok],
          "o-",
          color=colour,
          ms=4,
          lw=1.2,
          label=f"B {b} rows ({b * o.best.seq_len} tok)",
        )
        bad = [m.lr for m in at if not math.isfinite(m.loss)]
        if bad:
          ax.scatter(bad, [top] * len(bad), marker="x", color=colour, s=30, zorder=3)
      ax.scatter(
        [o.best.lr], [o.best.loss], marker="*", s=160, facecolors="none", edgecolors="k", zorder=4
      )
      if math.isfinite(o.lr):
        ax.axvline(
          o.lr, color="tab:red", ls=":", lw=1, label=f"lr* {o.lr:.3g}, B* {o.batch_tokens:.4g} tok"
        )
      edge = f"; edge: {', '.join(o.edges)}" if o.edges else ""
      ax.set_title(
        f"{arch} {o.best.size} (N {o.best.n_params:.3g}, C {o.best.compute:.2g}){edge}", fontsize=8
      )
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(ticker.NullFormatter())  # minor labels overlap
      ax.set_xlabel("peak LR")
      ax.set_ylabel(f"final {metric} loss")
      ax.grid(True, which="both", alpha=0.3)
      ax.legend(fontsize=6)
  fig.suptitle("hyperparameter grid: final validation loss vs LR per batch size", fontsize=10)
  FigureCanvasAgg(fig).print_png(path)
