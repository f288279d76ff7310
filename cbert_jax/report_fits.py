"""A sweep's members read back from their workdirs, and what the scaling report fits to them.

`read_sweep` reads every member workdir under the sweep directory (`config.json`, `metrics.jsonl`,
the final step's offline probe results) into one dict per member; `fit_loss`, `fit_probes`,
`throughput_ratios` and `cms_efficiency` compute the numbers that report.py states and
report_plots.py draws.

Fits: loss vs C as L = e + b C^-beta (`scaling.fit.fit_saturating`, >= 4 sizes; its floor e is
None, with the reason, unless it is interior to the optimiser's bounds) and as a pure power law;
probe score vs C as score = s0 + slope * log10(C) by least squares (slope = change per decade of
compute), plus Spearman's rank correlation (1 = rises monotonically). Every exponent and slope
carries two 90% intervals: the percentile bootstrap (exact over every distinct resample up to 10
sizes, else 10,000 draws; `scaling.fit`) and the t-interval of the least-squares slope. BERT's
MLM loss (20% masked, from the corrupted full row) and CrossBERT's (50% predicted from the other
half) are different tasks: compare each one's trend, not their levels. A member without probe
results (or unfinished) is listed and left out of fits.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

from cbert_jax import metrics as metrics_lib
from cbert_jax.scaling import fit as fit_lib
from cbert_jax.scaling import status as status_lib

ARCHS = ("bert", "crossbert")  # the curves; other members (controls) are listed only
PROBES = ("ridge", "knn", "retrieval")  # offline-suite averages (evaluators.suite.average)


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
def usable(members, arch, key=None):
  out = [m for m in members if m["arch"] == arch and m["finished"] and m["compute"] > 0]
  if key:
    out = [m for m in out if m["probes"].get(key) is not None]
  return out


def fit_loss(members: list[dict], arch: str) -> dict | None:
  pts = usable(members, arch)
  if len(pts) < 2:
    return None
  c = np.array([m["compute"] for m in pts])
  loss = np.array([m["final_loss"] for m in pts])
  out = {"n_points": len(pts), "power_law": fit_lib.fit_power_law_ci(c, loss).to_dict()}
  if len(pts) >= 4:
    try:
      out["saturating"] = fit_lib.fit_saturating(c, loss).to_dict()
    except (RuntimeError, ValueError) as e:
      out["saturating_error"] = str(e)
  return out


def trend(x: np.ndarray, y: np.ndarray, n_boot: int = fit_lib.N_DRAWS, seed: int = 0) -> dict:
  """y = s0 + slope * log10(x): slope per decade with 90% bootstrap (exact when small, else
  `n_boot` draws) and t-intervals; Spearman rho."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  lx = np.log10(x)
  slope, s0 = np.polyfit(lx, y, 1)
  boot = fit_lib.bootstrap_line(lx, np.asarray(y, np.float64), n_boot, seed)
  t = fit_lib.t_interval(lx, y)
  # Spearman's rho is undefined for a constant score (reported as 0: no trend)
  rho = (float(stats.spearmanr(x, y)[0]) if np.ptp(y) > 0 else 0.0) if len(x) >= 3 else float("nan")
  return {
    "slope_per_decade": float(slope),
    "intercept": float(s0),
    "slope_ci": boot.ci(boot.slopes),
    "slope_t_ci": t["slope"] if t else None,
    "bootstrap": boot.info(),
    "spearman": rho,
    "n_points": int(len(x)),
    "first": float(y[np.argmin(x)]),
    "last": float(y[np.argmax(x)]),
    "best_at_largest": bool(np.argmax(y) == np.argmax(x)),
  }


def fit_probes(members: list[dict], arch: str) -> dict:
  out = {}
  for key in PROBES:
    pts = usable(members, arch, key)
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
