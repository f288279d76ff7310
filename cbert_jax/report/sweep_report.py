r"""The scaling report of a sweep: fits, plots and the four claims of SPEC §6, with numbers.

  python -m cbert_jax.report --sweep runs/sweep_cpu [--out DIR] [--cms DIR] [--grid DIR]
                             [--n_boot 200]

(also run by the in-process sweep at its end). Reads every member workdir under the sweep
directory -- `config.json` (model, size, seed, N, compute C = training FLOPs, tokens), the
full-split validation record `eval/val_full-step_<final>.json` (else eval/loss, marked),
`metrics.jsonl` (validation loss over tokens, tokens/s), `eval/step_<final>*.json` (the offline
probe suite) -- and writes to `<sweep>/report/`:
  report.md, report.json   member table, per-size table over seeds, fits with bootstrap
                           intervals and per-seed exponents, beside each exponent its backtest
                           (report/backtest.py: the miss at each size left out, the lack-of-fit
                           test, "law" or "a slope over the sizes measured"), the four claims,
                           what the fits support, the loss surface L(N, D), the LR / batch laws
                           the members used (exponents, both intervals, fitted range, overridden
                           checks, leave-one-size-out misses and loss costs against the best
                           constant, read off the grid); report.json holds every number
  laws_<name>.png, laws_<name>_grid.png   those laws' plots, copied from beside their file
  loss_vs_flops.png        final validation loss vs C per architecture (seeds, seed means, law)
  probes_vs_flops.png      frozen ridge / logreg / kNN / retrieval scores vs C, fitted trends
  flops_per_token.png      analytic training FLOPs per data token vs N (not a throughput)
  cms_efficiency.png       validation loss vs tokens of CrossBERT with and without CMS (if the
                           sweep has the control)
  surface_<family>.json    each fitted loss surface with its problems and provenance, for
                           `python -m cbert_jax.sweep.planner --surface`
--cms DIR: the controlled CMS experiment's directory (cms.json from `python -m
cbert_jax.report.cms`), quoted for claim 2. --grid DIR: a hyperparameter grid whose optima join
the sweep's members in the loss-surface fit. --n_boot: its bootstrap resamples.
Reading and fits: fits.py; backtests: backtest.py (text: backtest_text.py); the loss surface:
loss_surface.py; figures: plots.py; the laws: hparam_laws.py. The CLI prints a progress line per
stage on stderr (progress.py: the stage n/N, its own count, seconds since the start).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from cbert_jax.report import backtest, backtest_text, heldout, hparam_laws, lawcheck, loss_surface
from cbert_jax.report.fits import (
  ALL_ARCHS,
  ARCHS,
  PROBES,
  VERDICT_PROBES,
  ReportError,
  cms_efficiency,
  fit_loss,
  fit_probes,
  flops_ratios,
  group,
  read_cms_dir,
  read_sweep,
)
from cbert_jax.report.grid_read import GridError, read_grid
from cbert_jax.report.plots import plot_cms, plot_flops_per_token, plot_loss, plot_probes
from cbert_jax.report.progress import Progress, silent

PAPER_THROUGHPUT_RATIO = 207 / 123  # SPEC §6: CrossBERT 207k vs BERT 123k tokens/s
LABELS = {"bert": "BERT", "crossbert": "CrossBERT", "crossbert-nocms": "CrossBERT (no CMS)"}
PROBE_LABELS = {"ridge": "ridge", "logreg": "logreg", "knn": "kNN", "retrieval": "retrieval"}
DAGGER = "eval/loss on the first rows of the split, not the full split"


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


def _spread(sp: dict, spec=".4g") -> str:
  """A seed spread: both values with two seeds, the sd with more, '1 seed' with one."""
  if sp["n"] >= 3:
    return f"sd {sp['sd']:{spec}}"
  if sp["n"] == 2:
    return ", ".join(format(v, spec) for _, v in sp["values"])
  return "-"


def _per_seed(rows, key, spec) -> str:
  return ", ".join(f"seed {r['seed']}: {r[key]:{spec}}" for r in rows) or "-"


def _range(lo: float, hi: float, spec: str = ".2f") -> str:
  return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{lo:{spec}}-{hi:{spec}}"


def _spans0(ci) -> bool:
  return bool(ci) and ci[0] <= 0 <= ci[1]


def claim_throughput(ratios: dict) -> str:
  if "crossbert" not in ratios and "crossbert-nocms" not in ratios:
    return "1. **Throughput**: no BERT/CrossBERT pair of one size with FLOPs per token."
  parts, mfu = [], ""
  for arch in ("crossbert", "crossbert-nocms"):
    if arch in ratios:
      r = ratios[arch]
      sizes = ", ".join(f"{s} {v:.2f}x" for s, v in r["per_size"].items())
      parts.append(f"{LABELS[arch] if arch != 'crossbert' else 'CrossBERT+CMS'}/BERT {sizes}")
  if "crossbert" in ratios:
    r = ratios["crossbert"]
    mfu = (
      f" At equal MFU, data tokens/s scale as the inverse: CrossBERT+CMS would run at "
      f"{_range(*r['tokens_per_sec_ratio_at_equal_mfu'])}x BERT's tokens/s, so the paper's "
      f"{PAPER_THROUGHPUT_RATIO:.2f}x would need it to reach "
      f"{_range(*r['mfu_ratio_for_paper_throughput'])}x BERT's MFU."
    )
  return (
    "1. **Throughput** (paper: CrossBERT 207k vs BERT 123k tokens/s, "
    f"{PAPER_THROUGHPUT_RATIO:.2f}x): not measured by this sweep. Analytic training FLOPs per "
    "data token (each member's sweep.compute / sweep.tokens; exact, the same for every seed): "
    + "; ".join(parts)
    + "."
    + mfu
    + " Measured throughput comes from `python benchmarks/train_step.py`, which alternates the "
    "contestants step by step; the tokens/s in the members table are training logs from a "
    "shared machine under varying load, not a benchmark."
  )


def claim_cms(eff: dict | None, controlled: dict | None) -> str:
  head = "2. **CMS sample efficiency** (paper: ~2x)"
  in_sweep = ""
  if eff and eff.get("ratio"):
    seeds = ", ".join(f"seed {p['seed']} {p['ratio']:.2f}x" for p in eff["pairs"] if p["ratio"])
    conf = (
      f"confounded: the control trains with batch {eff['batch_nocms']} and LR "
      f"{eff['lr_nocms']:.2g}, CrossBERT+CMS with batch {eff['batch_cms']} and LR "
      f"{eff['lr_cms']:.2g} (each from the laws at its own compute)"
      if eff["confounded"]
      else "the two runs share batch and LR, but only this sweep's seeds"
    )
    in_sweep = (
      f"at {eff['size']}, CrossBERT without CMS needs {eff['ratio']:.2f}x the training tokens "
      f"of CrossBERT+CMS to reach the same validation loss ({eff['metric']}; median over "
      f"{eff['levels']} loss levels evenly spaced over the whole range both curves pass through, "
      f"range {eff['min']:.2f}-{eff['max']:.2f}; {seeds}); in training FLOPs it needs "
      f"{eff['flops_ratio']:.2f}x. Final losses (seed means): CMS {eff['final_loss_cms']:.3f}, "
      f"no CMS {eff['final_loss_nocms']:.3f}. This in-sweep control is {conf}; the controlled "
      "experiment is experiments/cms_control.py (`--cms DIR`)."
    )
  elif eff:
    in_sweep = (
      f"at {eff['size']} the loss curves do not overlap (final: CMS "
      f"{_fmt(eff['final_loss_cms'])}, no CMS {_fmt(eff['final_loss_nocms'])})."
    )
  if controlled:
    if controlled["lines"]:
      text = (
        f"{head}, from the controlled experiment (experiments/cms_control.py, "
        f"{controlled['json']}; no-CMS / CMS ratios > 1 favour CMS): "
        + " ".join(controlled["lines"])
        + f" Details: {controlled['md']}."
      )
    else:
      why = "" if controlled["found"] else f" (no readable cms.json in {controlled['path']})"
      text = f"{head}: see {controlled['md']}{why}."
    return text + (f" The sweep's own control: {in_sweep}" if in_sweep else "")
  if in_sweep:
    return f"{head}: {in_sweep}"
  return (
    f"{head}: not measured (the sweep has no CrossBERT without CMS next to a CrossBERT+CMS of "
    "the same size; the controlled experiment is experiments/cms_control.py)."
  )


def _as_slope(bt: dict | None) -> str:
  """': a slope over the sizes measured (N ...), not a law' unless the loss law passed its
  lack-of-fit test (backtest.reading); '' when it passed."""
  if bt and bt.get("is_law"):
    return ""
  return f": {backtest_text.reads_as(bt)}, not a law"


def claim_trend(
  i: int, arch: str, paper: str, t: dict, lf: dict | None, bt: dict | None = None
) -> str:
  """Claim 3 or 4; `bt`: the family's backtests (report_backtests), which say whether the loss
  exponent is a law or a slope over the sizes measured."""
  label = LABELS[arch]
  if not t:
    return f"{3 + i}. **{label}'s frozen trend**: not measured (fewer than 2 probed sizes)."
  probes = []
  for key in PROBES:
    if key in t:
      k = t[key]
      probes.append(
        f"{key} {k['first']:.3f} -> {k['last']:.3f} ({k['slope_per_decade']:+.4f} per decade of "
        f"C{_ci(k['slope_ci'], '+.4f')}, Spearman {k['spearman']:+.2f}; per seed: "
        f"{_per_seed(k.get('per_seed', []), 'slope_per_decade', '+.4f')})"
      )
  loss_part = ""
  if lf:
    p = lf["power_law"]
    loss_part = (
      f" Its validation loss (seed means) falls as C^{p['alpha']:.3f} (90%: bootstrap"
      f"{_ci(p['alpha_ci']) or ' -'}, t{_ci(p.get('alpha_t_ci')) or ' -'}; over "
      f"{lf['n_points']} sizes; per seed: {_per_seed(lf.get('per_seed', []), 'alpha', '.3f')})"
      f"{_as_slope((bt or {}).get('loss'))}."
    )
    if lf.get("partial"):
      loss_part += f" Sizes with only some seeds (fitted on those): {', '.join(lf['partial'])}."
  return (
    f"{3 + i}. **{label}'s frozen trend** (paper: {paper}; seed means): "
    + "; ".join(probes)
    + f". Reading: {_verdict(t)}."
    + loss_part
  )


def _verdict(t: dict) -> str:
  """Rising / flat / falling from the ridge, logreg and kNN slopes' intervals (0 inside = flat),
  and whether every seed's own slope has that sign."""
  words = []
  for key in VERDICT_PROBES:
    if key not in t:
      continue
    lo, hi = t[key]["slope_ci"] or (t[key]["slope_per_decade"],) * 2
    mono = " monotonically" if abs(t[key]["spearman"]) == 1.0 else ""
    word = (
      "rising" + mono if lo > 0 else "falling" + mono if hi < 0 else "flat within the 90% interval"
    )
    slopes = [s["slope_per_decade"] for s in t[key].get("per_seed", [])]
    if lo > 0 or hi < 0:
      sign = 1 if lo > 0 else -1
      if len(slopes) >= 2:
        agree = all(sign * s > 0 for s in slopes)
        word += " (every seed's slope agrees)" if agree else " (but not in every seed)"
    words.append(f"{key} {word}")
  return ", ".join(words) or "no probe"


def claims(loss_fits, probe_fits, ratios, eff, controlled=None, backtests=None) -> list[str]:
  """SPEC §6's four claims, each stated with this sweep's numbers, whichever way they come out."""
  bts = backtests or {}
  return [
    claim_throughput(ratios),
    claim_cms(eff, controlled),
    claim_trend(
      0,
      "bert",
      "flat or falling",
      probe_fits.get("bert", {}),
      loss_fits.get("bert"),
      bts.get("bert"),
    ),
    claim_trend(
      1,
      "crossbert",
      "rising monotonically",
      probe_fits.get("crossbert", {}),
      loss_fits.get("crossbert"),
      bts.get("crossbert"),
    ),
  ]


def _backtest_sentence(bt: dict | None, what: str) -> str:
  """' Leaving one size out, ... misses ... ; the power law ... (p = ...): a slope ...'."""
  if not bt or not bt.get("loo"):
    return ""
  rows = bt["loo"]
  out_n = sum(r["inside"] is False for r in rows)
  with_iv = sum(r["inside"] is not None for r in rows)
  lof = bt["lack_of_fit"]
  test = (
    f"fails its lack-of-fit test (p = {lof['p']:.2g})"
    if lof["p"] is not None and not bt["is_law"]
    else f"passes its lack-of-fit test (p = {lof['p']:.2g})"
    if lof["p"] is not None
    else f"has no lack-of-fit test ({lof['reason']})"
  )
  return (
    f" Leaving one size out, the line through the others misses it by "
    f"{min(r['miss_pct'] for r in rows):+.1f}% to {max(r['miss_pct'] for r in rows):+.1f}% "
    f"({out_n} of {with_iv} outside the 90% prediction interval); the {what} {test}"
    + ("." if bt["is_law"] else f", so the exponent is {bt['reading']}, not a law.")
  )


def support(members, groups, loss_fits, probe_fits, chin, backtests=None) -> list[str]:
  """What the fits do and do not support: statements conditional on this sweep's numbers."""
  out = []
  seeds = sorted({m["seed"] for m in members})
  sizes = {a: sum(1 for g in groups if g["arch"] == a and g["loss"]["n"]) for a in ARCHS}
  few = [LABELS[a] for a, n in sizes.items() if n < 5]
  out.append(
    f"Sizes fitted (seed means): {', '.join(f'{LABELS[a]} {n}' for a, n in sizes.items())}; seeds "
    f"{', '.join(map(str, seeds))}."
    + (
      f" With fewer than 5 sizes ({', '.join(few)}), an interval rests on a handful of distinct "
      "resamples and an exponent is a rough slope, not a law."
      if few
      else ""
    )
  )
  for arch in ARCHS:
    lf = loss_fits.get(arch)
    if not lf:
      continue
    p = lf["power_law"]
    ci = p["alpha_ci"] or p.get("alpha_t_ci")
    s = f"{LABELS[arch]}'s loss exponent {p['alpha']:.3f}: its interval{_ci(ci)} " + (
      "spans 0: no trend in loss is shown."
      if _spans0(ci)
      else "excludes 0."
      if ci
      else f"is not defined ({lf['n_points']} sizes: a slope through 2 points)."
    )
    alphas = [r["alpha"] for r in lf.get("per_seed", [])]
    if len(alphas) >= 2 and ci:
      s += (
        f" Seeds alone give {min(alphas):.3f} to {max(alphas):.3f} (spread "
        f"{max(alphas) - min(alphas):.3f}, against an interval {ci[1] - ci[0]:.3f} wide)."
      )
    s += _backtest_sentence(((backtests or {}).get(arch) or {}).get("loss"), "power law")
    sat = lf.get("saturating")
    if sat:
      s += (
        f" Floor e = {sat['e']:.3f} is identified."
        if sat.get("e") is not None
        else f" No loss floor: {sat['e_note']}."
      )
    out.append(s)
  flat, split, undefined = [], [], []
  for arch in ARCHS:
    for key, t in probe_fits.get(arch, {}).items():
      if not t["slope_ci"]:
        undefined.append(f"{LABELS[arch]} {key}")
      elif _spans0(t["slope_ci"]):
        flat.append(f"{LABELS[arch]} {key}")
      signs = {np.sign(r["slope_per_decade"]) for r in t.get("per_seed", [])}
      if len(signs) > 1:
        split.append(f"{LABELS[arch]} {key}")
  n_trends = sum(len(t) for t in probe_fits.values())
  if n_trends:
    parts = []
    if flat:
      parts.append(f"Probe trends whose interval spans 0 (no trend): {', '.join(flat)}.")
    elif len(undefined) < n_trends:
      parts.append(
        "Every probe trend's 90% interval excludes 0"
        + (" (of those with an interval)." if undefined else ".")
      )
    if undefined:
      parts.append(
        f"No interval (fewer than 3 sizes): {', '.join(undefined)}: a slope through 2 points."
      )
    if split:
      parts.append(f"Seeds disagree in the sign of the slope: {', '.join(split)}.")
    out.append(" ".join(parts))
  if any("logreg" in t for t in probe_fits.values()):
    out.append(
      "logreg's mean covers the classification tasks only (no regression tasks), so its level "
      "is not comparable with ridge's and kNN's; its trend is."
    )
  done = [m for m in members if m["finished"] and m["n_params"] > 0]
  if done:
    tpp = [m["tokens"] / m["n_params"] for m in done]
    n_lo, n_hi = min(m["n_params"] for m in done), max(m["n_params"] for m in done)
    out.append(
      f"Scale: N {n_lo:.3g}-{n_hi:.3g} non-embedding parameters at {_range(min(tpp), max(tpp), '.3g')} "
      "tokens per parameter on this sweep's corpus."
      + (
        " The paper's members are 100M-2B parameters on a pod-scale corpus: exponents fitted "
        "here do not extrapolate there."
        if n_hi < 1e8
        else ""
      )
    )
  fallback = [m["name"] for m in members if m["loss_source"] == "eval_loss"]
  if fallback:
    out.append(
      f"Losses marked † ({', '.join(fallback)}) are {DAGGER}: fits that include them mix two metrics."
    )
  out.append(
    "BERT's loss (20% masked) and CrossBERT's (50% predicted from the other half) are different "
    "tasks: their levels are not comparable, their trends are."
  )
  for fam, r in (chin or {}).items():
    if not r.get("fitted"):
      out.append(f"{LABELS[fam]}'s loss surface L(N, D) is not fitted ({r['reason']}).")
    elif not r["usable"]:
      out.append(
        f"{LABELS[fam]}'s loss surface is refused, no allocation: {'; '.join(r['problems'])}."
      )
    else:
      out.append(
        f"{LABELS[fam]}'s loss surface is usable on {r['points']} points (D/N "
        f"{r['d_per_n'][0]:.3g}-{r['d_per_n'][1]:.3g}); its allocation beyond the largest member "
        "is an extrapolation of that range."
      )
  return [f"* {s}" for s in out]


def markdown(
  root,
  members,
  loss_fits,
  probe_fits,
  ratios,
  eff,
  plots,
  *,
  groups=None,
  controlled=None,
  chin=None,
  laws_lines=(),
  command=None,
  backtests=None,
) -> str:
  """The report's text (`ratios`: flops_ratios; `groups`: default group(members); `laws_lines`:
  hparam_laws.section's; `command`: the command line that wrote it, default the --sweep part;
  `backtests`: backtest.report_backtests's, printed beside each exponent and in their section)."""
  groups = group(members) if groups is None else groups
  bts = backtests or {}
  command = command or f"python -m cbert_jax.report --sweep {root}"
  lines = [
    f"# Scaling report: {root}",
    "",
    f"Generated {time.strftime('%Y-%m-%d %H:%M %Z')} by `{command}`. C = training FLOPs (SPEC "
    "§4, analytic, per data token x tokens); N = "
    "non-embedding parameters (the sweep's `sweep.n_definition`). Final validation loss: the "
    "full-split record (cbert_jax.run.validation, the same rows and masks for every member of a "
    "family). Probe scores: mean over the offline task kit's tasks (test split) of the frozen, "
    "mean-pooled final layer; '-' = not run.",
    "",
  ]
  laws = {}
  for m in members:
    laws.setdefault(m.get("laws_source") or "set by hand (no laws)", []).append(m["arch"])
  lines += [
    "LR and batch size from: "
    + "; ".join(f"{src} ({', '.join(sorted(set(a)))})" for src, a in sorted(laws.items())),
    "",
    "## Members",
    "",
    "| member | seed | N | tokens | C (FLOPs) | steps x batch | lr | final val loss | ridge "
    "| logreg | kNN | retrieval | tokens/s (training log, shared machine: not a benchmark) |",
    "|" + "---|" * 13,
  ]
  for m in members:
    p = m["probes"]
    mark = "†" if m["loss_source"] == "eval_loss" else ""
    lines.append(
      f"| {m['name']} | {m['seed']} | {m['n_params'] / 1e6:.3f}M | {m['tokens'] / 1e6:.1f}M | "
      f"{m['compute']:.3g} | {m['steps']} x {m['batch_size']} | {m['lr']:.2g} | "
      f"{_fmt(m['final_loss'])}{mark} | "
      + " | ".join(_fmt(p.get(k)) for k in PROBES)
      + f" | {_fmt(m['tokens_per_sec'], ',.0f')} |"
    )
  if any(m["loss_source"] == "eval_loss" for m in members):
    lines += ["", f"† {DAGGER}."]
  missing = [m["name"] for m in members if not m["finished"] or not m["probes"]]
  if missing:
    lines += ["", f"Unfinished or unprobed (left out of the fits): {', '.join(missing)}."]
  lines += [
    "",
    "## Per size, over seeds",
    "",
    "Mean over the finished seeds; spread: both values with two seeds, the sd with more "
    "(probes: in brackets).",
    "",
    "| arch | size | N | C (FLOPs) | seeds | final val loss | loss spread | "
    + " | ".join(PROBE_LABELS[k] for k in PROBES)
    + " |",
    "|" + "---|" * (7 + len(PROBES)),
  ]
  for g in groups:
    seeds = ", ".join(map(str, g["seeds"])) or "-"
    if g["missing_seeds"]:
      seeds += f" (missing {', '.join(map(str, g['missing_seeds']))})"
    probes = [
      f"{g['probes'][k]['mean']:.4g}"
      + (f" ({_spread(g['probes'][k])})" if g["probes"][k]["n"] >= 2 else "")
      if k in g["probes"]
      else "-"
      for k in PROBES
    ]
    lines.append(
      f"| {g['arch']} | {g['size']} | {g['n_params'] / 1e6:.3f}M | {g['compute']:.3g} | {seeds} | "
      f"{_fmt(g['loss']['mean'])}{'†' if g['eval_loss_fallback'] else ''} | {_spread(g['loss'])} | "
      + " | ".join(probes)
      + " |"
    )
  lines += ["", "## The four claims (SPEC §6)", ""] + claims(
    loss_fits, probe_fits, ratios, eff, controlled, bts
  )
  lines += [
    "",
    "## Fits",
    "",
    "On the seed means (one point per size); 'per seed': the same fit on one seed's members. "
    "Beside each exponent, its backtest (section 'Backtests' below): each size's miss when the "
    "law is fitted on the other sizes (% for the loss, score units for a probe; in/OUT: inside "
    "the 90% t prediction interval), the lack-of-fit test's p-value, and what the exponent may "
    "be called.",
    "",
    "| arch | quantity | law | exponent / slope [90% bootstrap] | [90% t] | points | per seed "
    "| leave one size out: miss | lack of fit | reads as |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for arch in ALL_ARCHS:
    f = loss_fits.get(arch)
    bt = bts.get(arch) or {}
    if f:
      p = f["power_law"]
      lb = bt.get("loss")
      lines.append(
        f"| {arch} | val loss | a C^alpha, a={p['a']:.3g} | alpha {p['alpha']:.4f}"
        f"{_ci(p['alpha_ci'], '.4f')}{_boot(p.get('bootstrap'))} "
        f"| {_ci(p.get('alpha_t_ci'), '.4f').strip() or '-'} "
        f"| {f['n_points']} | {_per_seed(f.get('per_seed', []), 'alpha', '.4f')} "
        f"| {backtest_text.miss_cell(lb, True)} | {backtest_text.p_cell(lb)} "
        f"| {backtest_text.reads_as(lb)} |"
      )
      if "saturating" in f:
        s = f["saturating"]
        sb = bt.get("saturating")
        e = f"e={s['e']:.3f}" if s.get("e") is not None else f"e not identified ({s['e_note']})"
        lines.append(
          f"| {arch} | val loss | e + b C^-beta, {e} | beta {s['beta']:.4f} | - | {f['n_points']} "
          f"| - | {backtest_text.miss_cell(sb, True)} | {backtest_text.p_cell(sb)} "
          f"| {backtest_text.reads_as(sb)} |"
        )
    for key, t in probe_fits.get(arch, {}).items():
      pb = bt.get("probes", {}).get(key)
      lines.append(
        f"| {arch} | {key} | s0 + slope log10 C | slope {t['slope_per_decade']:+.4f}"
        f"{_ci(t['slope_ci'], '+.4f')}{_boot(t.get('bootstrap'))}, Spearman "
        f"{t['spearman']:+.2f} | {_ci(t.get('slope_t_ci'), '+.4f').strip() or '-'} "
        f"| {t['n_points']} | {_per_seed(t.get('per_seed', []), 'slope_per_decade', '+.4f')} "
        f"| {backtest_text.miss_cell(pb, False)} | {backtest_text.p_cell(pb)} "
        f"| {backtest_text.reads_as(pb)} |"
      )
  lines += [
    "",
    "Bootstrap: percentiles of the resampling distribution over sizes, exact (every distinct "
    "resample, weighted) up to 10 sizes, resamples with all C equal skipped (counted in "
    "brackets); t: least-squares slope +- t(n-2) x standard error, in log-log space for the "
    "loss. A saturating floor e is given only when it is interior to the fit's bounds [0, min "
    "loss].",
    "",
    "## What the fits do and do not support",
    "",
  ]
  lines += support(members, groups, loss_fits, probe_fits, chin, bts)
  lines += [""] + backtest_text.section(bts, loss_fits, probe_fits)
  lines += loss_surface.markdown(chin)
  lines += list(laws_lines)
  lines += ["## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
  return "\n".join(lines) + "\n"


def write(
  root: str,
  out_dir: str | None = None,
  cms: str | None = None,
  grid: str | None = None,
  n_boot: int = loss_surface.N_BOOT,
  chinchilla_starts=None,
  command: str | None = None,
  progress: Progress | None = None,
  heldout_dir: str | None = None,
  lawcheck_dirs: tuple[str, ...] = (),
) -> str:
  """Reads the sweep in `root` (and the controlled CMS experiment in `cms`, the grid in `grid`,
  the pre-registered held-out size in `heldout_dir`, the checks of its laws where it used them in
  `lawcheck_dirs`), writes the report files; returns the
  markdown's path. `n_boot`, `chinchilla_starts`: the loss
  surface's bootstrap resamples and optimiser starts (default: chinchilla.START_GRID); `command`:
  the command line recorded in the surface files' provenance; `progress`: where the progress
  lines go (default none; the CLI prints them to stderr)."""
  prog = progress or silent()
  # read, fits, [the grid], the loss surfaces, plots, laws and their backtests, files
  prog.stages = 6 + (1 if grid else 0)
  root = os.path.abspath(root)
  # predicted (from the sweep, committed before the runs) vs measured at a held-out size: read
  # first, so a bad directory is refused before the fits
  held = heldout.check(heldout_dir) if heldout_dir else None
  try:
    checks = [lawcheck.load(d) for d in lawcheck_dirs]
  except GridError as e:
    raise ReportError(str(e)) from e
  prog.begin(f"reading the sweep {root}")
  members = read_sweep(root, prog.callback("member"))
  specs = hparam_laws.used(members)
  for c in checks:
    if not any(lawcheck.for_spec(c, spec) for spec in specs):
      raise ReportError(
        f"--lawcheck {c['dir']}: it checked the laws {c['laws']!r}, which no member of the sweep "
        f"used (they used: {', '.join(sorted(specs)) or 'none'})"
      )
  prog.begin("fitting loss and probe laws, with their backtests")
  groups = group(members)
  out_dir = out_dir or os.path.join(root, "report")
  os.makedirs(out_dir, exist_ok=True)
  loss_fits = {a: f for a in ALL_ARCHS for f in [fit_loss(groups, members, a)] if f}
  probe_fits = {a: fit_probes(groups, members, a) for a in ARCHS}
  backtests = backtest.report_backtests(members, ALL_ARCHS, PROBES)
  ratios = flops_ratios(groups)
  for r in ratios.values():  # what the analytic ratio implies (claim 1), range over sizes
    r["tokens_per_sec_ratio_at_equal_mfu"] = [1 / r["max"], 1 / r["min"]]
    r["mfu_ratio_for_paper_throughput"] = [PAPER_THROUGHPUT_RATIO * r[k] for k in ("min", "max")]
  eff = cms_efficiency(members)
  controlled = read_cms_dir(cms) if cms else None
  grid_members = None
  try:
    if grid:
      prog.begin(f"reading the grid {grid}")
      grid_members = read_grid(grid, progress=prog.callback("member"))
    prog.begin("loss surfaces L(N, D)")
    chin = loss_surface.surfaces(
      members,
      grid,
      n_boot,
      chinchilla_starts,
      out_dir=out_dir,
      provenance={"sweep": root, "command": command},
      grid_members=grid_members,
      progress=prog,
    )
  except GridError as e:
    raise ReportError(str(e)) from e
  prog.begin("plots")
  plots = [
    os.path.join(out_dir, f)
    for f in ("loss_vs_flops.png", "probes_vs_flops.png", "flops_per_token.png")
  ]
  # matplotlib's font cache goes into the sweep directory, never into the report's
  plot_loss(members, groups, loss_fits, plots[0], root)
  plot_probes(members, groups, probe_fits, plots[1], root)
  plot_flops_per_token(groups, plots[2], root)
  if eff:
    plots.append(os.path.join(out_dir, "cms_efficiency.png"))
    plot_cms(members, eff, plots[-1], root)
  prog.begin("hyperparameter laws and their backtests")
  laws_lines, laws_entries = hparam_laws.section(members, out_dir, grid, grid_members, checks)
  prog.begin(f"writing {out_dir}")
  shown = os.path.relpath(root) if not os.path.relpath(root).startswith("..") else root
  text = markdown(
    shown,
    members,
    loss_fits,
    probe_fits,
    ratios,
    eff,
    plots,
    groups=groups,
    controlled=controlled,
    chin=chin,
    laws_lines=laws_lines,
    command=command,
    backtests=backtests,
  )
  if held:
    title = "## Held-out size: pre-registered prediction vs measured"
    text += "\n".join(["", title, "", *heldout.check_markdown(held), ""])
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write(text)
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(
      {
        "members": members,
        "groups": groups,
        "loss_fits": loss_fits,
        "probe_fits": probe_fits,
        "backtests": backtests,
        "flops_ratios": ratios,
        "cms_efficiency": eff,
        "cms_controlled": controlled,
        "chinchilla": chin,
        "laws": laws_entries,
        "heldout": held,
        "claims": claims(loss_fits, probe_fits, ratios, eff, controlled, backtests),
        "support": support(members, groups, loss_fits, probe_fits, chin, backtests),
      },
      f,
      indent=2,
    )
  prog.done(f"written: {path}")
  return path
