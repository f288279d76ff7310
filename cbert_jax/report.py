r"""The scaling report of a sweep: fits, plots and the four claims of SPEC §6, with numbers.

  python -m cbert_jax.report --sweep runs/sweep_cpu [--out DIR]

(also run by the in-process sweep at its end). Reads every member workdir under the sweep
directory -- `config.json` (model, size, N, compute C = training FLOPs, tokens), `metrics.jsonl`
(validation loss over tokens, tokens/s), `eval/step_<final>*.json` (the offline probe suite) --
and writes to `<sweep>/report/`:
  report.md, report.json   member table, fits with bootstrap intervals, the four claims
  loss_vs_flops.png        final validation MLM loss vs C per architecture, with the fitted law
  probes_vs_flops.png      frozen ridge / kNN / retrieval scores vs C, with the fitted trend
  throughput.png           training tokens/s and MFU per member
  cms_efficiency.png       validation loss vs tokens of CrossBERT with and without CMS (if the
                           sweep has the control)
Reading and fits: report_fits.py; figures: report_plots.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from cbert_jax.report_fits import (
  ARCHS,
  PROBES,
  ReportError,
  cms_efficiency,
  fit_loss,
  fit_probes,
  read_sweep,
  throughput_ratios,
)
from cbert_jax.report_plots import plot_cms, plot_loss, plot_probes, plot_throughput

PAPER_THROUGHPUT_RATIO = 207 / 123  # SPEC §6: CrossBERT 207k vs BERT 123k tokens/s


# ------------------------------------------------------------------------------ markdown ---
def _fmt(x, spec=".4g"):
  return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def _ci(ci, spec=".3f"):
  return f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""


def _boot(info) -> str:
  """How a bootstrap interval was computed, e.g. ' (exact, 4/256 skipped)'."""
  if not info:
    return ""
  return f" ({info['method']}, {info['skipped']}/{info['resamples']} skipped)"


def claims(members, loss_fits, probe_fits, ratios, eff) -> list[str]:
  """SPEC §6's four claims, each stated with this sweep's numbers, whichever way they come out."""
  out = []
  # 1. throughput
  if "crossbert" in ratios or "crossbert-nocms" in ratios:
    parts = []
    for arch, label in (("crossbert", "CrossBERT+CMS"), ("crossbert-nocms", "CrossBERT (no CMS)")):
      if arch in ratios:
        sizes = ", ".join(f"{s} {r:.2f}x" for s, r in ratios[arch]["per_size"].items())
        parts.append(f"{label}/BERT tokens/s median {ratios[arch]['median']:.2f}x ({sizes})")
    out.append(
      "1. **Throughput** (paper: CrossBERT 207k vs BERT 123k tokens/s, 1.68x): "
      + "; ".join(parts)
      + ". CMS puts the predictor and the vocabulary head on every "
      "token, so it is expected below 1x per data token; the paper's gain is from the "
      "encoder seeing half the tokens. These are medians over each member's own training "
      "log: members that ran under different machine load are not comparable to better "
      "than that load's effect (`benchmarks/train_step.py` alternates the contestants "
      "step by step for a clean ratio)."
    )
  else:
    out.append("1. **Throughput**: not measured (no BERT/CrossBERT pair with throughput).")
  # 2. CMS sample efficiency
  if eff and eff.get("ratio"):
    out.append(
      f"2. **CMS sample efficiency** (paper: ~2x): at {eff['size']}, CrossBERT without CMS "
      f"needs {eff['ratio']:.2f}x the training tokens of CrossBERT+CMS to reach the same "
      f"validation loss (median over {eff['levels']} loss levels, range "
      f"{eff['min']:.2f}-{eff['max']:.2f}); per training FLOP that is "
      f"{eff['flops_ratio']:.2f}x. Final losses at {eff['tokens'] / 1e6:.1f}M tokens: "
      f"CMS {eff['final_loss_cms']:.3f}, no CMS {eff['final_loss_nocms']:.3f}."
    )
  elif eff:
    out.append(
      f"2. **CMS sample efficiency**: at {eff['size']} the loss curves do not overlap "
      f"(final: CMS {_fmt(eff['final_loss_cms'])}, no CMS {_fmt(eff['final_loss_nocms'])})."
    )
  else:
    out.append(
      "2. **CMS sample efficiency**: not measured (the sweep has no CrossBERT without "
      "CMS next to a CrossBERT+CMS of the same size)."
    )
  # 3 and 4. frozen trends
  for i, (arch, label, paper) in enumerate(
    (("bert", "BERT", "flat or falling"), ("crossbert", "CrossBERT", "rising monotonically"))
  ):
    t = probe_fits.get(arch, {})
    lf = loss_fits.get(arch)
    if not t:
      out.append(f"{3 + i}. **{label}'s frozen trend**: not measured (fewer than 2 probed sizes).")
      continue
    loss_part = ""
    if lf:
      p = lf["power_law"]
      loss_part = (
        f" Its validation loss falls as C^{p['alpha']:.3f} (90%: bootstrap"
        f"{_ci(p['alpha_ci']) or ' -'}, t{_ci(p.get('alpha_t_ci')) or ' -'}) "
        f"over {lf['n_points']} sizes."
      )
    probes = []
    for key in PROBES:
      if key in t:
        k = t[key]
        probes.append(
          f"{key} {k['first']:.3f} -> {k['last']:.3f} "
          f"({k['slope_per_decade']:+.4f} per decade of C{_ci(k['slope_ci'], '+.4f')}, "
          f"Spearman {k['spearman']:+.2f})"
        )
    verdict = _verdict(t)
    out.append(
      f"{3 + i}. **{label}'s frozen trend** (paper: {paper}): "
      + "; ".join(probes)
      + f". Reading: {verdict}."
      + loss_part
    )
  return out


def _verdict(t: dict) -> str:
  """Rising / flat / falling from the ridge and kNN slopes' intervals (0 inside = flat)."""
  words = []
  for key in ("ridge", "knn"):
    if key not in t:
      continue
    lo, hi = t[key]["slope_ci"] or (t[key]["slope_per_decade"],) * 2
    mono = " monotonically" if abs(t[key]["spearman"]) == 1.0 else ""
    words.append(
      f"{key} "
      + (
        "rising" + mono
        if lo > 0
        else "falling" + mono
        if hi < 0
        else "flat within the 90% interval"
      )
    )
  return ", ".join(words) or "no probe"


def markdown(root, members, loss_fits, probe_fits, ratios, eff, plots) -> str:
  lines = [
    f"# Scaling report: {root}",
    "",
    f"Generated {time.strftime('%Y-%m-%d %H:%M %Z')} by `python -m cbert_jax.report --sweep "
    f"{root}`. C = training FLOPs (SPEC §4, analytic, per data token x tokens); N = "
    "non-embedding parameters (the sweep's `sweep.n_definition`). Probe scores: mean over "
    "the offline task kit's tasks (test split) of the frozen, mean-pooled final layer.",
    "",
    "## Members",
    "",
    "| member | N | tokens | C (FLOPs) | steps x batch | lr | final val loss | ridge | kNN "
    "| retrieval | tokens/s | MFU |",
    "|" + "---|" * 12,
  ]
  for m in members:
    p = m["probes"]
    lines.append(
      f"| {m['name']} | {m['n_params'] / 1e6:.3f}M | {m['tokens'] / 1e6:.1f}M | "
      f"{m['compute']:.3g} | {m['steps']} x {m['batch_size']} | {m['lr']:.2g} | "
      f"{_fmt(m['final_loss'])} | {_fmt(p.get('ridge'))} | {_fmt(p.get('knn'))} | "
      f"{_fmt(p.get('retrieval'))} | {_fmt(m['tokens_per_sec'], ',.0f')} | "
      f"{_fmt(100 * m['mfu'] if m['mfu'] else None, '.1f')}{'%' if m['mfu'] else ''} |"
    )
  missing = [m["name"] for m in members if not m["finished"] or not m["probes"]]
  if missing:
    lines += ["", f"Unfinished or unprobed (left out of the fits): {', '.join(missing)}."]
  lines += ["", "## The four claims (SPEC §6)", ""] + claims(
    members, loss_fits, probe_fits, ratios, eff
  )
  lines += [
    "",
    "## Fits",
    "",
    "| arch | quantity | law | exponent / slope [90% bootstrap] | [90% t] | points |",
    "|---|---|---|---|---|---|",
  ]
  for arch in ARCHS:
    f = loss_fits.get(arch)
    if f:
      p = f["power_law"]
      lines.append(
        f"| {arch} | val loss | a C^alpha, a={p['a']:.3g} | alpha {p['alpha']:.4f}"
        f"{_ci(p['alpha_ci'], '.4f')}{_boot(p.get('bootstrap'))} "
        f"| {_ci(p.get('alpha_t_ci'), '.4f').strip() or '-'} | {f['n_points']} |"
      )
      if "saturating" in f:
        s = f["saturating"]
        e = f"e={s['e']:.3f}" if s.get("e") is not None else f"e not identified ({s['e_note']})"
        lines.append(
          f"| {arch} | val loss | e + b C^-beta, {e} | beta {s['beta']:.4f} | - | {f['n_points']} |"
        )
    for key, t in probe_fits.get(arch, {}).items():
      lines.append(
        f"| {arch} | {key} | s0 + slope log10 C | slope {t['slope_per_decade']:+.4f}"
        f"{_ci(t['slope_ci'], '+.4f')}{_boot(t.get('bootstrap'))}, Spearman "
        f"{t['spearman']:+.2f} | {_ci(t.get('slope_t_ci'), '+.4f').strip() or '-'} | {t['n_points']} |"
      )
  lines += [
    "",
    "With 4-9 sizes the intervals are wide; an exponent whose interval spans 0 is not a trend. "
    "Bootstrap: percentiles of the resampling distribution, exact (every distinct resample, "
    "weighted) up to 10 sizes, resamples with all C equal skipped (counted in brackets); t: "
    "least-squares slope +- t(n-2) x standard error, in log-log space for the loss. A "
    "saturating floor e is given only when it is interior to the fit's bounds [0, min loss].",
    "",
    "## Plots",
    "",
  ] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
  return "\n".join(lines) + "\n"


def write(root: str, out_dir: str | None = None) -> str:
  """Reads the sweep in `root`, writes the report files; returns the markdown's path."""
  root = os.path.abspath(root)
  members = read_sweep(root)
  out_dir = out_dir or os.path.join(root, "report")
  os.makedirs(out_dir, exist_ok=True)
  loss_fits = {a: f for a in (*ARCHS, "crossbert-nocms") for f in [fit_loss(members, a)] if f}
  probe_fits = {a: fit_probes(members, a) for a in ARCHS}
  ratios = throughput_ratios(members)
  eff = cms_efficiency(members)
  plots = [
    os.path.join(out_dir, "loss_vs_flops.png"),
    os.path.join(out_dir, "probes_vs_flops.png"),
    os.path.join(out_dir, "throughput.png"),
  ]
  # matplotlib's font cache goes into the sweep directory, never into the report's
  plot_loss(members, loss_fits, plots[0], root)
  plot_probes(members, probe_fits, plots[1], root)
  plot_throughput(members, plots[2], root)
  if eff:
    plots.append(os.path.join(out_dir, "cms_efficiency.png"))
    plot_cms(members, eff, plots[-1], root)
  shown = os.path.relpath(root) if not os.path.relpath(root).startswith("..") else root
  text = markdown(shown, members, loss_fits, probe_fits, ratios, eff, plots)
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write(text)
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(
      {
        "members": [{k: v for k, v in m.items()} for m in members],
        "loss_fits": loss_fits,
        "probe_fits": probe_fits,
        "throughput_ratios": ratios,
        "cms_efficiency": eff,
        "claims": claims(members, loss_fits, probe_fits, ratios, eff),
      },
      f,
      indent=2,
    )
  return path


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", required=True, help="the sweep directory (member workdirs inside)")
  parser.add_argument("--out", default=None, help="where the report goes (default <sweep>/report)")
  ns = parser.parse_args(argv)
  try:
    path = write(ns.sweep, ns.out)
  except ReportError as e:
    print(f"report error: {e}", file=sys.stderr)
    return 2
  with open(path) as f:
    print(f.read())
  print(f"written: {path}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
