"""A sweep's members read back from their workdirs, grouped by size over seeds, and what the
scaling report fits to them.

`read_sweep` reads every member workdir under the sweep directory through `cbert_jax.run.record`
(`config.json`, `metrics.jsonl`, the full-split validation record, the final step's offline probe
results) into one dict per member; `group` folds the seeds of one (arch, size) into their mean
and spread; `fit_loss`, `fit_probes`, `flops_ratios` and `cms_efficiency` compute the numbers that
report.py states and report_plots.py draws; `read_cms_dir` reads the controlled CMS experiment's
summary.

The final validation loss is the full-split record `eval/val_full-step_<total_steps>.json`
(cbert_jax.run.validation: every row of the split, masks that do not depend on the run), defined
identically for every member of a family. A member without one falls back to the trainer's
`eval/loss` at the final step (the first rows of the split, the run's own masks), and is marked
(`loss_source` = "eval_loss").

Fits: on the seed means, one point per size: loss vs C as a pure power law and as
L = e + b C^-beta (`scaling.fit.fit_saturating`, >= 4 sizes; its floor e is None, with the reason,
unless interior); probe score vs C as score = s0 + slope * log10(C) by least squares (slope =
change per decade of compute), plus Spearman's rank correlation (1 = rises monotonically). Every
exponent and slope carries two 90% intervals: the percentile bootstrap over sizes (exact up to 10
sizes; `scaling.fit`) and the t-interval of the least-squares slope. Beside them, the same
exponent or slope fitted on each seed's members alone (no interval), so seed variation shows. A
size with only some seeds finished enters with the seeds it has (`missing_seeds` says which it
lacks). BERT's MLM loss (20% masked) and CrossBERT's (50% predicted from the other half) are
different tasks: compare each one's trend, not their levels.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

from cbert_jax.run import record as record_lib
from cbert_jax.scaling import fit as fit_lib
from cbert_jax.scaling import laws as laws_lib

ARCHS = ("bert", "crossbert")  # the curves; other members (controls) are listed only
ALL_ARCHS = (*ARCHS, "crossbert-nocms")
PROBES = (
  "ridge",
  "logreg",
  "knn",
  "retrieval",
)  # offline-suite averages (evaluators.suite.average)
VERDICT_PROBES = ("ridge", "logreg", "knn")
# Loss curves, in order of preference for comparing CrossBERT with and without CMS: the no-CMS
# form at ratio 0.5 on the full split (the same targets for both), the full-split loss, eval/loss.
CURVE_METRICS = ("val_full/half_loss", "val_full/loss", "eval/loss")
CMS_LEVELS = 10


class ReportError(ValueError):
  """The sweep directory has nothing to report on (or a record in it is unreadable)."""


# ------------------------------------------------------------------------------- reading ---
def read_member(workdir: str) -> dict | None:
  """One member's numbers, or None if `workdir` is not a run (no readable config.json)."""
  cfg = record_lib.config_or_none(workdir)
  if cfg is None:
    return None
  from cbert_jax.evaluators import suite  # pylint: disable=import-outside-toplevel

  sweep = cfg.get("sweep", {})
  cms = bool(cfg["masking"]["cms"]) or cfg["model_name"] != "crossbert"
  rows = record_lib.metrics_rows(workdir)
  total = int(cfg["total_steps"])
  tokens_per_step = int(cfg["batch_size"]) * int(cfg["data"]["seq_len"])
  curves = {
    key: [
      (
        r["tokens_seen"] if r.get("tokens_seen") is not None else r["step"] * tokens_per_step,
        r[key],
      )
      for r in rows
      if key in r
    ]
    for key in CURVE_METRICS
  }
  try:
    record = record_lib.read_val_full(workdir, total)
  except ValueError as e:
    raise ReportError(str(e)) from e
  final_eval = [r["eval/loss"] for r in rows if r.get("step") == total and "eval/loss" in r]
  if record is not None:
    final, source = float(record["loss"]), "val_full"
    half = (record.get("half") or {}).get("loss")
  else:
    final, source, half = (final_eval[-1], "eval_loss", None) if final_eval else (None, None, None)
  tps = [r["perf/tokens_per_sec"] for r in rows if "perf/tokens_per_sec" in r]
  found = record_lib.offline_results(workdir, total)
  probe_path, probes = (found[0], suite.average(found[1]["results"])) if found else (None, {})
  curve_metric = "val_full/loss" if len(curves["val_full/loss"]) >= 2 else "eval/loss"
  return {
    "name": os.path.basename(workdir.rstrip("/")),
    "arch": cfg["model_name"] + ("" if cms else "-nocms"),
    "model": cfg["model_name"],
    "size": cfg["model"].get("size", ""),
    "seed": int(cfg.get("seed", 0) or 0),
    "n_params": int(sweep.get("n_params", 0)),
    "n_definition": sweep.get("n_definition"),
    "compute": float(sweep.get("compute", 0.0)),
    "tokens": int(sweep.get("tokens", 0)),
    "tokens_per_param": float(sweep.get("tokens_per_param", 0.0) or 0.0),  # the budget
    "steps": total,
    "batch_size": int(cfg["batch_size"]),
    "lr": float(cfg["optim"]["lr"]),
    "laws_source": str(sweep.get("laws_source", "")),  # where the LR and batch came from
    # the laws file the member read ("shipped:cpu-bert", a path, "" = the published defaults);
    # None when its LR and batch were both set by hand (a grid or CMS-experiment member)
    "laws_spec": None
    if float(sweep.get("lr", 0) or 0) > 0 and int(sweep.get("batch_size", 0) or 0) > 0
    else laws_lib.for_model(str(sweep.get("laws", "")), cfg["model_name"]),
    "finished": final is not None,
    "final_loss": final,
    "loss_source": source,  # val_full | eval_loss (fallback, marked in the table) | None
    "final_half_loss": float(half) if half is not None else None,
    "final_eval_loss": final_eval[-1] if final_eval else None,
    # validation loss curves: (tokens seen, loss) per metric; the plots' default is curve_metric
    "curves": curves,
    "curve_metric": curve_metric,
    "loss_curve": curves[curve_metric],
    # median over log intervals, skipping the first (warm-up); a shared machine: not a benchmark
    "tokens_per_sec": statistics.median(tps[1:] or tps) if tps else None,
    "probes": {k: v for k, v in probes.items() if k in PROBES},
    "probe_file": probe_path,
  }


def read_sweep(root: str, progress=None) -> list[dict]:
  """Every member workdir under `root`, sorted by (arch, compute, seed); `progress(done, total)`
  (optional) after each directory read."""
  if not os.path.isdir(root):
    raise ReportError(f"--sweep: no such directory {root!r}")
  names = record_lib.run_names(root)
  members = []
  for i, d in enumerate(names):
    m = read_member(os.path.join(root, d))
    if m is not None:
      members.append(m)
    if progress:
      progress(i + 1, len(names))
  if not members:
    raise ReportError(
      f"--sweep: {root!r} holds no member workdirs (subdirectories with a config.json)"
    )
  order = {a: i for i, a in enumerate(ALL_ARCHS)}
  return sorted(
    members, key=lambda m: (order.get(m["arch"], 9), m["arch"], m["compute"], m["seed"])
  )


def usable(members, arch, key=None):
  out = [m for m in members if m["arch"] == arch and m["finished"] and m["compute"] > 0]
  if key:
    out = [m for m in out if m["probes"].get(key) is not None]
  return out


def seeds_of(members) -> list[int]:
  return sorted({m["seed"] for m in members})


# ------------------------------------------------------------------------ seeds per size ---
def spread(values: list[tuple[int, float]]) -> dict:
  """Mean of (seed, value) pairs and their spread: every value, and the sd (n-1) with >= 2."""
  v = [x for _, x in values]
  return {
    "values": [[s, x] for s, x in values],
    "n": len(v),
    "mean": float(np.mean(v)) if v else None,
    "sd": float(np.std(v, ddof=1)) if len(v) >= 2 else None,
    "min": min(v) if v else None,
    "max": max(v) if v else None,
  }


def group(members: list[dict]) -> list[dict]:
  """One entry per (arch, size): the finished seeds' final losses and probe scores, mean and
  spread; `missing_seeds`: the sweep's seeds this size has no finished member of."""
  all_seeds = seeds_of(members)
  keys = list(dict.fromkeys((m["arch"], m["size"]) for m in members))
  out = []
  for arch, size in keys:
    ms = [m for m in members if (m["arch"], m["size"]) == (arch, size)]
    done = sorted((m for m in ms if m["finished"]), key=lambda m: m["seed"])
    ref = next((m for m in ms if m["compute"] > 0 and m["tokens"] > 0), ms[0])
    out.append(
      {
        "arch": arch,
        "size": size,
        "members": [m["name"] for m in ms],
        "n_params": ref["n_params"],
        "compute": ref["compute"],
        "tokens": ref["tokens"],
        "flops_per_token": ref["compute"] / ref["tokens"] if ref["tokens"] else None,
        "seeds": [m["seed"] for m in done],
        "missing_seeds": [s for s in all_seeds if s not in {m["seed"] for m in done}],
        "eval_loss_fallback": any(m["loss_source"] == "eval_loss" for m in done),
        "loss": spread([(m["seed"], m["final_loss"]) for m in done]),
        "probes": {
          key: spread([(m["seed"], m["probes"][key]) for m in done if key in m["probes"]])
          for key in PROBES
          if any(key in m["probes"] for m in done)
        },
      }
    )
  return out


# ---------------------------------------------------------------------------------- fits ---
def _groups(groups, arch, key=None):
  out = [g for g in groups if g["arch"] == arch and g["compute"] > 0 and g["loss"]["n"]]
  return [g for g in out if key in g["probes"]] if key else out


def fit_loss(groups: list[dict], members: list[dict], arch: str) -> dict | None:
  """Power law (and, with >= 4 sizes, the saturating law) of the seed-mean final loss vs C; the
  exponent fitted on each seed alone beside it."""
  pts = _groups(groups, arch)
  if len(pts) < 2:
    return None
  c = np.array([g["compute"] for g in pts])
  loss = np.array([g["loss"]["mean"] for g in pts])
  out = {
    "n_points": len(pts),
    "power_law": fit_lib.fit_power_law_ci(c, loss).to_dict(),
    "per_seed": [],
    "partial": [
      f"{g['size']} (no seed {', '.join(map(str, g['missing_seeds']))})"
      for g in pts
      if g["missing_seeds"]
    ],
  }
  for s in seeds_of(members):
    ms = [m for m in usable(members, arch) if m["seed"] == s]
    if len({m["compute"] for m in ms}) >= 2:
      law = fit_lib.fit_power_law([m["compute"] for m in ms], [m["final_loss"] for m in ms])
      out["per_seed"].append({"seed": s, "alpha": law.alpha, "n_points": law.n_points})
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


def fit_probes(groups: list[dict], members: list[dict], arch: str) -> dict:
  """Per probe: the trend of the seed-mean score vs C, and each seed's own slope."""
  out = {}
  for key in PROBES:
    pts = _groups(groups, arch, key)
    if len(pts) < 2:
      continue
    t = trend(
      np.array([g["compute"] for g in pts]), np.array([g["probes"][key]["mean"] for g in pts])
    )
    t["per_seed"] = []
    for s in seeds_of(members):
      ms = [m for m in usable(members, arch, key) if m["seed"] == s]
      if len({m["compute"] for m in ms}) >= 2:
        lx = np.log10([m["compute"] for m in ms])
        slope = float(np.polyfit(lx, [m["probes"][key] for m in ms], 1)[0])
        t["per_seed"].append({"seed": s, "slope_per_decade": slope, "n_points": len(ms)})
    t["partial"] = [g["size"] for g in pts if g["missing_seeds"]]
    out[key] = t
  return out


def flops_ratios(groups: list[dict]) -> dict:
  """Analytic training FLOPs per data token (sweep.compute / sweep.tokens) of CrossBERT (+CMS) and
  of the no-CMS control over BERT's, size by size: exact, the same for every seed."""
  fpt = {(g["arch"], g["size"]): g["flops_per_token"] for g in groups if g["flops_per_token"]}
  out = {}
  for arch in ("crossbert", "crossbert-nocms"):
    per_size = {
      size: fpt[(arch, size)] / fpt[("bert", size)]
      for (a, size) in fpt
      if a == arch and ("bert", size) in fpt
    }
    if per_size:
      out[arch] = {
        "per_size": per_size,
        "min": min(per_size.values()),
        "max": max(per_size.values()),
      }
  return out


# ------------------------------------------------------------------- CMS sample efficiency ---
def cms_levels(a: list, b: list, n: int = CMS_LEVELS) -> list[float]:
  """`n` loss levels evenly spaced over the whole range both curves pass through: from the lower
  of the two first losses down to the higher of the two final losses (empty if they do not
  overlap). Both curves reach every level within their evaluated span, so no level is censored."""
  top, bottom = min(a[0][1], b[0][1]), max(a[-1][1], b[-1][1])
  return [float(x) for x in np.linspace(top, bottom, n)] if top > bottom else []


def cms_efficiency(members: list[dict], n_levels: int = CMS_LEVELS) -> dict | None:
  """Tokens CrossBERT without CMS needs to reach a validation loss over the tokens CrossBERT+CMS
  needs, at the smallest size where the sweep has both, seed by seed (interpolated on log tokens).
  Curves: the first of CURVE_METRICS both runs of a pair logged >= 3 times."""
  done = [m for m in members if m["finished"]]
  nocms = {(m["size"], m["seed"]): m for m in done if m["arch"] == "crossbert-nocms"}
  cms = {(m["size"], m["seed"]): m for m in done if m["arch"] == "crossbert"}
  sizes = [k[0] for k in sorted(nocms, key=lambda k: nocms[k]["compute"]) if k in cms]
  if not sizes:
    return None
  size = sizes[0]
  pairs = []
  for seed in sorted(s for z, s in nocms if z == size and (z, s) in cms):
    mc, mn = cms[(size, seed)], nocms[(size, seed)]
    metric = next(
      (k for k in CURVE_METRICS if min(len(mc["curves"][k]), len(mn["curves"][k])) >= 3), None
    )
    pair = {
      "seed": seed,
      "metric": metric,
      "final_loss_cms": mc["final_loss"],
      "final_loss_nocms": mn["final_loss"],
      "ratio": None,
    }
    if metric:
      a, b = mc["curves"][metric], nocms[(size, seed)]["curves"][metric]
      levels = cms_levels(a, b, n_levels)
      ta, la = np.array([t for t, _ in a], float), np.array([x for _, x in a])
      tb, lb = np.array([t for t, _ in b], float), np.array([x for _, x in b])
      ratios = [
        r
        for level in levels
        for t_cms, t_nocms in [(_tokens_to_reach(ta, la, level), _tokens_to_reach(tb, lb, level))]
        if t_cms and t_nocms
        for r in [t_nocms / t_cms]
      ]
      pair |= {"levels": levels, "ratios": ratios}
      if ratios:
        ratio = statistics.median(ratios)
        fpt = (mn["compute"] / max(mn["tokens"], 1)) / (mc["compute"] / max(mc["tokens"], 1))
        pair |= {"ratio": ratio, "min": min(ratios), "max": max(ratios), "flops_ratio": ratio * fpt}
    pairs.append(pair)
  ok = [p for p in pairs if p["ratio"]]
  mc, mn = cms[(size, pairs[0]["seed"])], nocms[(size, pairs[0]["seed"])]
  out = {
    "size": size,
    "pairs": pairs,
    "seeds": [p["seed"] for p in ok],
    "levels": n_levels,
    "metric": ok[0]["metric"] if ok else None,
    "tokens": mc["tokens"],
    "batch_cms": mc["batch_size"],
    "batch_nocms": mn["batch_size"],
    "lr_cms": mc["lr"],
    "lr_nocms": mn["lr"],
    "confounded": (mc["batch_size"], mc["lr"]) != (mn["batch_size"], mn["lr"]),
    "final_loss_cms": float(np.mean([p["final_loss_cms"] for p in pairs])),
    "final_loss_nocms": float(np.mean([p["final_loss_nocms"] for p in pairs])),
    "ratio": None,
  }
  if ok:
    out |= {
      "ratio": statistics.median(p["ratio"] for p in ok),
      "min": min(p["min"] for p in ok),
      "max": max(p["max"] for p in ok),
      "flops_ratio": statistics.median(p["flops_ratio"] for p in ok),
    }
  return out


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


# ------------------------------------------------------------ the controlled CMS experiment ---
def read_cms_dir(path: str) -> dict:
  """What `python -m cbert_jax.report.cms` left in `path`: cms.json's `verdict` sentences (one
  per size on the loss ratios, one per size on the probes), quoted by claim 2 as `lines`; none
  when the file is missing, unreadable or has no verdict (the claim then points at cms.md)."""
  path = os.path.abspath(path)
  out = {"path": path, "json": os.path.join(path, "cms.json"), "md": os.path.join(path, "cms.md")}
  try:
    with open(out["json"]) as f:
      data = json.load(f)
  except FileNotFoundError:
    return out | {"found": False, "lines": []}
  except (OSError, ValueError) as e:
    return out | {"found": False, "error": str(e), "lines": []}
  verdict = data.get("verdict") if isinstance(data, dict) else None
  lines = [v for v in verdict if isinstance(v, str)] if isinstance(verdict, list) else []
  return out | {"found": True, "lines": lines}
