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
Fits: loss vs C as L = e + b C^-beta (`scaling.fit.fit_saturating`, >= 4 sizes) and as a pure
power law with bootstrap intervals; probe score vs C as score = s0 + slope * log10(C) by least
squares (slope = change per decade of compute) with a bootstrap interval, plus Spearman's rank
correlation (1 = rises monotonically). BERT's MLM loss (20% masked, from the corrupted full row)
and CrossBERT's (50% predicted from the other half) are different tasks: compare each one's trend,
not their levels. A member without probe results (or unfinished) is listed and left out of fits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from cbert_jax import metrics as metrics_lib
from cbert_jax import plotting
from cbert_jax.scaling import fit as fit_lib
from cbert_jax.scaling import status as status_lib

ARCHS = ("bert", "crossbert")  # the curves; other members (controls) are listed only
COLORS = {"bert": "tab:blue", "crossbert": "tab:red", "crossbert-nocms": "tab:orange"}
PROBES = ("ridge", "knn", "retrieval")  # offline-suite averages (evaluators.suite.average)
PAPER_THROUGHPUT_RATIO = 207 / 123  # SPEC §6: CrossBERT 207k vs BERT 123k tokens/s


class ReportError(ValueError):
  """The sweep directory has nothing to report on."""


# ------------------------------------------------------------------------------- reading ---
def read_member(workdir: str) -> dict | None:
  """One member's numbers, or None if `workdir` is not a run (no config.json)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      cfg = json.load(f)["config"]
  except (OSError, ValueError, KeyError):
    return None
  from cbert_jax.evaluators import suite  # pylint: disable=import-outside-toplevel

  sweep = cfg.get("sweep", {})
  cms = bool(cfg["masking"]["cms"]) or cfg["model_name"] != "crossbert"
  arch = cfg["model_name"] + ("" if cms else "-nocms")
  rows = metrics_lib.read_metrics(os.path.join(workdir, "metrics.jsonl"), missing_ok=True)
  total = int(cfg["total_steps"])
  evals = [(r["step"], r.get("tokens_seen"), r["eval/loss"]) for r in rows if "eval/loss" in r]
  tps = [r["perf/tokens_per_sec"] for r in rows if "perf/tokens_per_sec" in r]
  mfu = [r["perf/mfu"] for r in rows if "perf/mfu" in r]
  tokens_per_step = int(cfg["batch_size"]) * int(cfg["data"]["seq_len"])
  final = [loss for step, _, loss in evals if step == total]
  probe_path = status_lib.probe_results(workdir, total)
  probes = {}
  if probe_path:
    with open(probe_path) as f:
      probes = suite.average(json.load(f)["results"])
  return {
    "name": os.path.basename(workdir.rstrip("/")),
    "arch": arch,
    "model": cfg["model_name"],
    "size": cfg["model"].get("size", ""),
    "n_params": int(sweep.get("n_params", 0)),
    "compute": float(sweep.get("compute", 0.0)),
    "tokens": int(sweep.get("tokens", 0)),
    "steps": total,
    "batch_size": int(cfg["batch_size"]),
    "lr": float(cfg["optim"]["lr"]),
    "finished": bool(final),
    "final_loss": final[-1] if final else None,
    # validation loss curve: (tokens seen, loss); tokens from the step when the row lacks them
    "loss_curve": [(t if t is not None else s * tokens_per_step, loss) for s, t, loss in evals],
    # median over log intervals, skipping the first (warm-up) interval
    "tokens_per_sec": statistics.median(tps[1:] or tps) if tps else None,
    "mfu": statistics.median(mfu[1:] or mfu) if mfu else None,
    "probes": probes,
    "probe_file": probe_path,
  }


def read_sweep(root: str) -> list[dict]:
  if not os.path.isdir(root):
    raise ReportError(f"--sweep: no such directory {root!r}")
  members = [
    m
    for d in sorted(os.listdir(root))
    if os.path.isdir(os.path.join(root, d))
    for m in [read_member(os.path.join(root, d))]
    if m is not None
  ]
  if not members:
    raise ReportError(
      f"--sweep: {root!r} holds no member workdirs (subdirectories with a config.json)"
    )
  return sorted(members, key=lambda m: (m["arch"], m["compute"]))


# ---------------------------------------------------------------------------------- fits ---
def _usable(members, arch, key=None):
  out = [m for m in members if m["arch"] == arch and m["finished"] and m["compute"] > 0]
  if key:
    out = [m for m in out if m["probes"].get(key) is not None]
  return out


def fit_loss(members: list[dict], arch: str) -> dict | None:
  pts = _usable(members, arch)
  if len(pts) < 2:
    return None
  c = np.array([m["compute"] for m in pts])
  loss = np.array([m["final_loss"] for m in pts])
  out = {"n_points": len(pts), "power_law": fit_lib.fit_power_law_ci(c, loss, n=500).to_dict()}
  if len(pts) >= 4:
    try:
      out["saturating"] = fit_lib.fit_saturating(c, loss).to_dict()
    except (RuntimeError, ValueError) as e:
      out["saturating_error"] = str(e)
  return out


def trend(x: np.ndarray, y: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
  """y = s0 + slope * log10(x): slope per decade with a 90% bootstrap interval; Spearman rho."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  lx = np.log10(x)
  slope, s0 = np.polyfit(lx, y, 1)
  ci = fit_lib.bootstrap(
    lambda xs, ys: {"slope": float(np.polyfit(np.log10(xs), ys, 1)[0])}, x, y, n=n_boot, seed=seed
  )
  # Spearman's rho is undefined for a constant score (reported as 0: no trend)
  rho = (float(stats.spearmanr(x, y)[0]) if np.ptp(y) > 0 else 0.0) if len(x) >= 3 else float("nan")
  return {
    "slope_per_decade": float(slope),
    "intercept": float(s0),
    "slope_ci": ci.get("slope"),
    "spearman": rho,
    "n_points": int(len(x)),
    "first": float(y[np.argmin(x)]),
    "last": float(y[np.argmax(x)]),
    "best_at_largest": bool(np.argmax(y) == np.argmax(x)),
  }


def fit_probes(members: list[dict], arch: str) -> dict:
  out = {}
  for key in PROBES:
    pts = _usable(members, arch, key)
    if len(pts) >= 2:
      out[key] = trend(
        np.array([m["compute"] for m in pts]), np.array([m["probes"][key] for m in pts])
      )
  return out


def throughput_ratios(members: list[dict]) -> dict:
  """tokens/s of CrossBERT (+CMS) and of the no-CMS control over BERT's, size by size."""
  by = {(m["arch"], m["size"]): m for m in members if m["tokens_per_sec"]}
  out = {}
  for arch in ("crossbert", "crossbert-nocms"):
    per_size = {
      size: by[(arch, size)]["tokens_per_sec"] / by[("bert", size)]["tokens_per_sec"]
      for (a, size) in by
      if a == arch and ("bert", size) in by
    }
    if per_size:
      out[arch] = {"per_size": per_size, "median": statistics.median(per_size.values())}
  return out


def cms_efficiency(members: list[dict]) -> dict | None:
  """Tokens CrossBERT without CMS needs to reach a validation loss, over the tokens CrossBERT+CMS
  needs for the same loss, at the size where the sweep has both (interpolated on log tokens)."""
  nocms = {m["size"]: m for m in members if m["arch"] == "crossbert-nocms" and m["finished"]}
  cms = {m["size"]: m for m in members if m["arch"] == "crossbert" and m["finished"]}
  for size in nocms:
    if size not in cms:
      continue
    a, b = cms[size]["loss_curve"], nocms[size]["loss_curve"]
    if len(a) < 3 or len(b) < 3:
      continue
    ta, la = np.array([t for t, _ in a], float), np.array([l for _, l in a])
    tb, lb = np.array([t for t, _ in b], float), np.array([l for _, l in b])
    # levels both runs pass through after their first evals: the no-CMS run's later losses
    levels = [l for l in lb[len(lb) // 3 :] if la.min() <= l <= la.max()]
    ratios = []
    for level in levels:
      t_cms = _tokens_to_reach(ta, la, level)
      t_nocms = _tokens_to_reach(tb, lb, level)
      if t_cms and t_nocms:
        ratios.append(t_nocms / t_cms)
    fpt_cms = cms[size]["compute"] / max(cms[size]["tokens"], 1)
    fpt_nocms = nocms[size]["compute"] / max(nocms[size]["tokens"], 1)
    if not ratios:
      return {
        "size": size,
        "ratio": None,
        "note": "the two loss curves do not overlap",
        "final_loss_cms": cms[size]["final_loss"],
        "final_loss_nocms": nocms[size]["final_loss"],
      }
    ratio = statistics.median(ratios)
    return {
      "size": size,
      "ratio": ratio,
      "levels": len(ratios),
      "min": min(ratios),
      "max": max(ratios),
      "flops_ratio": ratio * fpt_nocms / fpt_cms,
      "final_loss_cms": cms[size]["final_loss"],
      "final_loss_nocms": nocms[size]["final_loss"],
      "tokens": cms[size]["tokens"],
    }
  return None


def _tokens_to_reach(tokens: np.ndarray, loss: np.ndarray, level: float) -> float | None:
  """First point where the (running-min) loss curve reaches `level`, log-linear interpolation."""
  best = np.minimum.accumulate(loss)
  hit = np.nonzero(best <= level)[0]
  if not hit.size:
    return None
  i = int(hit[0])
  if i == 0:
    return float(tokens[0])
  l0, l1 = best[i - 1], best[i]
  w = (l0 - level) / (l0 - l1) if l0 != l1 else 1.0
  return float(np.exp(np.log(tokens[i - 1]) + w * (np.log(tokens[i]) - np.log(tokens[i - 1]))))


# --------------------------------------------------------------------------------- plots ---
def _figure(root: str):
  """(Figure, FigureCanvasAgg), matplotlib's font cache in the sweep's `.matplotlib`."""
  return plotting.matplotlib_classes(os.path.join(root, ".matplotlib"))


def plot_loss(members, fits, path, root) -> None:
  Figure, Canvas = _figure(root)
  fig = Figure(figsize=(6.5, 4.5))
  ax = fig.add_subplot(1, 1, 1)
  for arch in (*ARCHS, "crossbert-nocms"):
    pts = _usable(members, arch)
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
      if "saturating" in f and f["saturating"]["e"] > 0.01 * min(m["final_loss"] for m in pts):
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
      pts = _usable(members, arch, key)
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


# ------------------------------------------------------------------------------ markdown ---
def _fmt(x, spec=".4g"):
  return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def _ci(ci, spec=".3f"):
  return f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""


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
        f" Its validation loss falls as C^{p['alpha']:.3f}{_ci(p['alpha_ci'])} "
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
    "| arch | quantity | law | exponent / slope [90% bootstrap] | points |",
    "|---|---|---|---|---|",
  ]
  for arch in ARCHS:
    f = loss_fits.get(arch)
    if f:
      p = f["power_law"]
      lines.append(
        f"| {arch} | val loss | a C^alpha, a={p['a']:.3g} | alpha {p['alpha']:.4f}"
        f"{_ci(p['alpha_ci'], '.4f')} | {f['n_points']} |"
      )
      if "saturating" in f:
        s = f["saturating"]
        lines.append(
          f"| {arch} | val loss | e + b C^-beta, e={s['e']:.3f} | beta {s['beta']:.4f} "
          f"| {f['n_points']} |"
        )
    for key, t in probe_fits.get(arch, {}).items():
      lines.append(
        f"| {arch} | {key} | s0 + slope log10 C | slope {t['slope_per_decade']:+.4f}"
        f"{_ci(t['slope_ci'], '+.4f')}, Spearman {t['spearman']:+.2f} | {t['n_points']} |"
      )
  lines += [
    "",
    "With 4-9 sizes the intervals are wide; an exponent whose interval spans 0 is not a trend.",
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
