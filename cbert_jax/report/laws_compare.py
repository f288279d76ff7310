r"""LR/batch laws fitted at different budgets, side by side: where each grid located its optima,
the lines fitted through them, and what each law says at the other's sizes.

  python -m cbert_jax.report.laws_compare --laws shipped:cpu-crossbert shipped:cpu20-crossbert \
      --out docs/laws_by_budget_crossbert

Each laws file (`report.grid fit`, or `shipped:<name>`) records its grid's budget
(`provenance["tokens_per_param"]`) and the optimum located at every size
(`provenance["runs"]`: compute C, N, lr*, B* in tokens). Written to `--out` + .md and .png:
  * per size present in two files, lr* and B* at each budget and their ratio (same N: the
    budget's effect on the optimum at fixed model size);
  * per file, each other file's law evaluated at this file's C and N, as a factor of the optimum
    located there (a law used at another budget is off by this much);
  * the figure: lr* and B* against C (top) and N (bottom), points per file, each fitted line solid
    over its own points and dotted beyond.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.scaling import laws as laws_lib

QUANTITIES = (("lr", "lr*"), ("batch_tokens", "B* (tokens)"))
AXES = (("compute", "C"), ("n_params", "N"))


def _laws_of(spec: str) -> laws_lib.HyperLaws:
  laws = laws_lib.load(spec)
  if not laws.provenance.get("runs"):
    raise ConfigError(f"--laws {spec!r}: no located optima in its provenance (not a grid fit)")
  return laws


def _label(spec: str, laws: laws_lib.HyperLaws) -> str:
  tpp = laws.tokens_per_param
  return f"{spec.split(':')[-1]} ({'budget not recorded' if tpp is None else f'{tpp:g} tok/param'})"


def _optima(laws: laws_lib.HyperLaws) -> dict[tuple[str, str], dict]:
  """{(model, size): its located optimum} from the laws' provenance."""
  return {
    (r["model"], r["size"]): {
      "compute": float(r["compute"]),
      "n_params": float(r["n_params"]),
      "lr": float(r["lr_located"]),
      "batch_tokens": float(r["batch_tokens_located"]),
    }
    for r in laws.provenance["runs"]
  }


def _law(laws: laws_lib.HyperLaws, quantity: str, axis: str):
  return getattr(laws, quantity if axis == "compute" else f"{quantity}_n")


def load_all(specs: list[str]) -> dict[str, laws_lib.HyperLaws]:
  """{spec: its laws} for the laws files to compare (two or more, each a grid fit)."""
  if len(specs) < 2:
    raise ConfigError(f"--laws: give two or more laws files to compare, got {len(specs)}")
  return {s: _laws_of(s) for s in specs}


def compare(loaded: dict[str, laws_lib.HyperLaws]) -> dict:
  """The numbers of the comparison (see the module docstring) for the laws `load_all` read."""
  specs = list(loaded)
  optima = {s: _optima(laws) for s, laws in loaded.items()}
  same_n = []
  for i, a in enumerate(specs):
    for b in specs[i + 1 :]:
      for key in sorted(set(optima[a]) & set(optima[b]), key=lambda k: optima[a][k]["n_params"]):
        oa, ob = optima[a][key], optima[b][key]
        same_n.append(
          {
            "size": f"{key[0]} {key[1]}",
            "from": a,
            "to": b,
            "n_params": oa["n_params"],
            **{f"{q}_from": oa[q] for q, _ in QUANTITIES},
            **{f"{q}_to": ob[q] for q, _ in QUANTITIES},
            **{f"{q}_ratio": ob[q] / oa[q] for q, _ in QUANTITIES},
          }
        )
  cross = []
  for law_spec, laws in loaded.items():
    for at_spec in specs:
      if at_spec == law_spec:
        continue
      for (model, size), o in sorted(optima[at_spec].items(), key=lambda kv: kv[1]["compute"]):
        row = {"law": law_spec, "at": at_spec, "size": f"{model} {size}"}
        for q, _ in QUANTITIES:
          for axis, _ in AXES:
            row[f"{q}_{axis}_factor"] = float(_law(laws, q, axis)(o[axis])) / o[q]
        cross.append(row)
  return {
    "laws": {
      s: {"tokens_per_param": laws.tokens_per_param, "source": laws.source}
      for s, laws in loaded.items()
    },
    "same_n": same_n,
    "cross": cross,
  }


def markdown(result: dict) -> str:
  lines = ["# LR/batch laws at different budgets", ""]
  for s, info in result["laws"].items():
    tpp = info["tokens_per_param"]
    lines.append(f"* `{s}`: grid at {'?' if tpp is None else f'{tpp:g}'} tokens per parameter")
  if result["same_n"]:
    lines += [
      "",
      "Same size, two budgets (the optimum located by each grid; ratio = second / first):",
      "",
      "| size | N | first | second | lr* first | lr* second | ratio | B* first | B* second | "
      "ratio |",
      "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["same_n"]:
      lines.append(
        f"| {r['size']} | {r['n_params']:.3g} | `{r['from']}` | `{r['to']}` | {r['lr_from']:.3g} | "
        f"{r['lr_to']:.3g} | {r['lr_ratio']:.2f}x | {r['batch_tokens_from']:.4g} | "
        f"{r['batch_tokens_to']:.4g} | {r['batch_tokens_ratio']:.2f}x |"
      )
  lines += [
    "",
    "Each law at the other grid's sizes, as a factor of the optimum located there (1.00x: right):",
    "",
    "| law | at the optima of | size | lr*(C) | B*(C) | lr*(N) | B*(N) |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in result["cross"]:
    lines.append(
      f"| `{r['law']}` | `{r['at']}` | {r['size']} | {r['lr_compute_factor']:.2f}x | "
      f"{r['batch_tokens_compute_factor']:.2f}x | {r['lr_n_params_factor']:.2f}x | "
      f"{r['batch_tokens_n_params_factor']:.2f}x |"
    )
  return "\n".join(lines)


def draw(loaded: dict[str, laws_lib.HyperLaws], path: str) -> None:
  """The figure: lr* and B* against C (top row) and N (bottom row), one colour per laws file."""
  from cbert_jax.report import grid_plot  # pylint: disable=import-outside-toplevel
  from cbert_jax.run import plotting  # pylint: disable=import-outside-toplevel

  Figure, FigureCanvasAgg = plotting.matplotlib_classes(grid_plot.mpl_cache_dir())  # pylint: disable=invalid-name
  specs = list(loaded)
  optima = {s: _optima(laws) for s, laws in loaded.items()}
  fig = Figure(figsize=(11, 8.5), layout="constrained")
  colours = [f"C{i}" for i in range(len(specs))]
  for row, (axis, xname) in enumerate(AXES):
    every = [o[axis] for s in specs for o in optima[s].values()]
    xs_all = np.geomspace(min(every) / 1.3, max(every) * 1.3, 60)
    for col, (q, qname) in enumerate(QUANTITIES):
      ax = fig.add_subplot(2, 2, row * 2 + col + 1)
      for s, colour in zip(specs, colours):
        pts = sorted(optima[s].items(), key=lambda kv: kv[1][axis])
        for (model, _), o in pts:
          ax.scatter(
            [o[axis]], [o[q]], color=colour, marker=grid_plot.MARKERS.get(model, "o"), s=40
          )
        law = _law(loaded[s], q, axis)
        lo, hi = pts[0][1][axis], pts[-1][1][axis]
        inside = (xs_all >= lo) & (xs_all <= hi)
        ax.plot(xs_all, law(xs_all), color=colour, ls=":", lw=1)
        ax.plot(
          xs_all[inside],
          law(xs_all[inside]),
          color=colour,
          lw=1.6,
          label=f"{_label(s, loaded[s])}: {law.a:.3g} {xname}^{law.alpha:.3f}",
        )
      grid_plot.law_axes(ax, axis, qname)
  fig.suptitle(
    "LR/batch laws fitted at different budgets: located optima (points), fits (solid over their "
    "own points, dotted beyond)",
    fontsize=10,
  )
  FigureCanvasAgg(fig).print_png(path)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m cbert_jax.report.laws_compare", description=__doc__)
  p.formatter_class = argparse.RawDescriptionHelpFormatter
  p.add_argument("--laws", nargs="+", required=True, help="laws files or shipped:<name>, 2 or more")
  p.add_argument("--out", required=True, help="writes <out>.md and <out>.png")
  ns = p.parse_args(argv)
  try:
    loaded = load_all(ns.laws)
    result = compare(loaded)
    text = markdown(result)
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    with open(f"{ns.out}.md", "w") as f:
      f.write(text + "\n")
    draw(loaded, f"{ns.out}.png")
  except ConfigError as e:
    print(f"laws_compare error: {e}", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
