"""Plots: the one matplotlib setup of the package, and the training curves of a run.

* `matplotlib_classes` imports matplotlib (headless, Agg, its cache in a chosen directory); the
  training curves here, the sweep report (`report/sweep_report.py`) and the laws plot (`report/grid.py`)
  all go through it.
* `plot_metrics` draws a run's metrics.jsonl to a PNG.
* `plain_log_ticks` labels a log axis of about a decade with plain numbers.
"""

import math
import os
import pathlib
import secrets
import sys

import numpy as np

from cbert_jax.run import metrics as metrics_lib


def matplotlib_classes(config_dir: str | None) -> tuple[type, type]:
  """matplotlib's `Figure` and `FigureCanvasAgg`, first imported with MPLCONFIGDIR=config_dir.

  The one matplotlib setup of the package: every plot imports matplotlib through here, so that
  its font cache and config go to `config_dir` (not ~/.cache/matplotlib, ~/.config) and the Agg
  renderer is used directly (no pyplot: headless, and the process's backend is left alone).

  matplotlib reads MPLCONFIGDIR once, when first imported (its config and cache directories are
  memoized), so the variable is set only around that import and the process's environment (and
  its child processes') is left as it was. It is not set when MPLCONFIGDIR is already set or
  matplotlib is already imported; after this call, the rest of matplotlib (`matplotlib.colors`,
  ...) can be imported as usual.

  Args:
    config_dir: MPLCONFIGDIR for the first import (created if needed); None: matplotlib's
      defaults.

  Returns:
    (matplotlib.figure.Figure, matplotlib.backends.backend_agg.FigureCanvasAgg).
  """
  # pylint: disable=g-import-not-at-top  # matplotlib is slow to import; only plots need it.
  if config_dir and "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ:
    os.makedirs(config_dir, exist_ok=True)
    os.environ["MPLCONFIGDIR"] = config_dir
    try:
      from matplotlib.figure import Figure
    finally:
      del os.environ["MPLCONFIGDIR"]
  else:
    from matplotlib.figure import Figure
  from matplotlib.backends.backend_agg import FigureCanvasAgg

  # pylint: enable=g-import-not-at-top
  return Figure, FigureCanvasAgg


def plain_log_ticks(axis) -> None:
  """Labels a log axis that spans about a decade or less at 1-9 x 10^k as plain numbers ("4", "5",
  "6"), not matplotlib's "6 x 10^0"; minor ticks unlabelled. `axis`: ax.xaxis or ax.yaxis."""
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel  # after the setup

  axis.set_major_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
  axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
  axis.set_minor_formatter(ticker.NullFormatter())


# ---------------------------------------------------------------------------------------------
# Training curves.

# (panel title, metric names drawn in it, scale applied to the values).
_PLOT_PANELS: tuple[tuple[str, tuple[str, ...], float], ...] = (
  ("loss", ("train/loss", "eval/loss"), 1.0),
  ("masked accuracy", ("train/masked_acc", "eval/masked_acc"), 1.0),
  ("learning rate", ("train/lr",), 1.0),
  ("gradient norm", ("train/grad_norm",), 1.0),
  ("tokens / s", ("perf/tokens_per_sec",), 1.0),
  ("MFU (%)", ("perf/mfu",), 100.0),
)


def plot_metrics(
  metrics_path: str | os.PathLike[str],
  out_png: str | os.PathLike[str],
  x: str = "step",
  mpl_cache_dir: str | None = None,
) -> list[str]:
  """Plots the main training curves from metrics.jsonl into a PNG.

  Panels: loss (train and eval), masked accuracy, learning rate, gradient norm, tokens/s and
  MFU; a panel whose metrics never appear is left out. Uses matplotlib's Agg renderer directly
  (no pyplot), so it works headless and does not change the process's matplotlib backend.

  Args:
    metrics_path: metrics.jsonl (or the workdir holding it).
    out_png: Output file; written atomically.
    x: Name of the x-axis value, "step" or a metric such as "tokens_seen". Records without it
      are not plotted.
    mpl_cache_dir: MPLCONFIGDIR for matplotlib's first import in this process (its font cache
      and config go there instead of ~/.cache/matplotlib); ignored when MPLCONFIGDIR is set or
      matplotlib is already imported. None: matplotlib's defaults.

  Returns:
    Titles of the panels drawn (empty if there was nothing to plot; the PNG then says so).
  """
  Figure, _ = matplotlib_classes(mpl_cache_dir)  # pylint: disable=invalid-name
  records = [r for r in metrics_lib.read_metrics(metrics_path) if x in r]
  panels = []
  for title, names, scale in _PLOT_PANELS:
    series = []
    for name in names:
      points = [(r[x], r[name]) for r in records if name in r]
      if points:
        xs, ys = zip(*points)
        series.append((name, np.asarray(xs, float), np.asarray(ys, float) * scale))
    if series:
      panels.append((title, series))

  ncols = max(1, min(3, len(panels)))
  nrows = max(1, math.ceil(len(panels) / ncols))
  fig = Figure(figsize=(5 * ncols, 3.4 * nrows), layout="constrained")
  if not panels:
    fig.text(0.5, 0.5, f"no metrics with {x!r} to plot", ha="center", va="center")
  for i, (title, series) in enumerate(panels):
    ax = fig.add_subplot(nrows, ncols, i + 1)
    for name, xs, ys in series:
      # Eval points are sparse, so give them markers to stay visible.
      ax.plot(xs, ys, label=name, marker="o" if len(xs) < 50 else None, markersize=3)
    ax.set_title(title)
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)
    if len(series) > 1:
      ax.legend(fontsize="small")
  fig.suptitle(str(metrics_path))

  out_png = pathlib.Path(out_png)
  out_png.parent.mkdir(parents=True, exist_ok=True)
  tmp = out_png.with_name(f".{out_png.name}.{secrets.token_hex(4)}.tmp")
  try:
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out_png)
  finally:
    tmp.unlink(missing_ok=True)
  return [title for title, _ in panels]
