r"""The CMS control's analysis: CrossBERT with vs without CMS at equal data (experiments/cms_control.py).

  python -m cbert_jax.report.cms --runs runs/cms_control [--out DIR] [--allow_incomplete]

Reads the member workdirs under --runs (config.json, eval/val_full-step_<N>.json, metrics.jsonl,
the final offline probe suite), pairs them by (size, seed) into a CMS and a no-CMS arm, refuses (one
line, exit 2) when a pair's arms differ in batch size, LR, steps, sequence length or N, or when a
member is unfinished (no val_full record at total_steps; --allow_incomplete skips its pair), and
writes <out>/cms.md, cms.json, cms_curves.png and cms_probes.png. Reads files only: no JAX.

The rule, as experiments/cms_control.py declared it before its runs:
  * metric: `half` of the full-split validation record (cbert_jax/run/validation.py), the no-CMS form
    at mask ratio 0.5: the same targets and the same visible tokens for both arms;
  * levels: per (size, seed) pair, L_hi = the lower of the two runs' first `half` losses, L_lo =
    the higher of their final ones; LEVELS levels L_lo + (L_hi - L_lo) k / LEVELS, k = 0 ..
    LEVELS - 1: evenly spaced, L_lo included, L_hi excluded, so every level lies below both
    arms' first measurement and both curves cross it between measurements (none when L_lo >=
    L_hi: the pair has no shared range);
  * tokens to a level: the first measurement at or below it, linearly interpolated in log tokens
    from the measurement before (the first measurement's tokens when it is already at or below:
    an upper bound, marked *);
  * ratios: tokens no-CMS / CMS (> 1: CMS needs fewer tokens); FLOPs no-CMS / CMS (the tokens
    ratio times the arms' FLOPs-per-token ratio); median, min and max over levels per pair, then
    per size the mean over seeds of the pairs' medians, with each seed's value;
  * probes: per member, probe/avg/<probe> of the online rows and the final suite's averages at
    total_steps; per pair, CMS - no-CMS at the same steps (the same tokens), both seeds.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

from cbert_jax.run import plotting
from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib

LEVELS = 10  # loss levels per pair: must equal experiments/cms_control.py's LEVELS (tested)
# config fields both arms of a pair must share (the experiment's premise); member key: last part
PREMISE = ("batch_size", "optim.lr", "total_steps", "data.seq_len", "sweep.n_params")
PROBE_ORDER = ("ridge", "logreg", "knn", "retrieval", "all")  # table order; others after, sorted
PLOT_PROBE = "all"  # cms_probes.png: the suite's mean headline over all tasks
ARM = {True: "CMS", False: "no-CMS"}
COLUMNS = ("CMS", "no-CMS", "ratio")  # of tokens and of FLOPs in cms.md's level tables
DESIGN = __doc__.split("\n\n")[3]  # the docstring's paragraph on the rule, quoted in cms.md


class CmsError(ValueError):
  """The runs cannot be analysed as the experiment declared (the message is one line)."""


def _field(cfg: dict, dotted: str):
  """cfg["a"]["b"] for "a.b"; None where absent."""
  for part in dotted.split("."):
    cfg = cfg.get(part) if isinstance(cfg, dict) else None
  return cfg


# ------------------------------------------------------------------------------- reading ---
def _curve(workdir: str, total: int, tokens_per_step: int, fpt: float) -> list[dict]:
  """[{step, tokens (data tokens seen: step x rows x seq_len), flops (training FLOPs: tokens x
  `fpt`, the FLOPs per data token), half_loss (mean nats per target)}] of the val_full records,
  by step; steps <= 0 (no place on a log axis) and beyond total_steps are left out."""
  curve = []
  for step in (s for s in record_lib.val_full_steps(workdir) if 0 < s <= total):
    try:
      rec = record_lib.read_val_full(workdir, step)
    except ValueError as e:
      raise CmsError(str(e).replace("\n", " ")) from e
    half = rec.get("half") if isinstance(rec, dict) else None
    if not isinstance(half, dict) or not isinstance(half.get("loss"), (int, float)):
      raise CmsError(f"{record_lib.val_full_path(workdir, step)}: no half.loss in the record")
    tokens = step * tokens_per_step  # data tokens seen at `step`
    curve.append({"step": step, "tokens": tokens, "flops": tokens * fpt, "half_loss": half["loss"]})
  return curve


def _probes(workdir: str, total: int) -> tuple[dict[int, dict], str | None]:
  """({step: {probe: mean score}}, the final suite's file): online probe/avg/<k> rows, then the
  final offline suite's averages at total_steps (the `average` the suite stored: suite.average)."""
  prefix = "probe/avg/"
  out = {}
  for row in record_lib.metrics_rows(workdir):
    avg = {k[len(prefix) :]: float(v) for k, v in row.items() if k.startswith(prefix)}
    if avg:
      out[int(row["step"])] = avg  # a resumed run's repeated step: the last row wins
  found = record_lib.offline_results(workdir, total)
  if not found:
    return out, None
  path, body = found
  average = body.get("results", {}).get("average")
  if not isinstance(average, dict):
    raise CmsError(f"{path}: no results.average (the offline suite writes it)")
  out[total] = {k: float(v) for k, v in average.items()}
  return out, path


def read_member(workdir: str) -> dict | None:
  """One member of the experiment, or None if `workdir` holds no config.json."""
  try:
    cfg = record_lib.read_config(workdir)
  except record_lib.ConfigFileError as e:
    if e.missing:
      return None
    raise CmsError(str(e)) from e
  path = os.path.join(workdir, record_lib.CONFIG_FILE)
  if cfg.get("model_name") != "crossbert":
    raise CmsError(f"{workdir}: model_name {cfg.get('model_name')!r}, not a CrossBERT member")
  needed = [*PREMISE, "masking.cms", "model.size", "seed", "sweep.compute", "sweep.tokens"]
  missing = [k for k in needed if _field(cfg, k) is None]
  if missing or not float(cfg["sweep"]["tokens"]) > 0:
    raise CmsError(f"{path}: missing {', '.join(missing) or 'sweep.tokens > 0'}")
  name = os.path.basename(os.path.normpath(workdir))
  m = {"name": name, "path": workdir, "size": str(cfg["model"]["size"]), "seed": int(cfg["seed"])}
  m["cms"] = bool(cfg["masking"]["cms"])
  m |= {k.split(".")[-1]: _field(cfg, k) for k in PREMISE}
  m["flops_per_token"] = float(cfg["sweep"]["compute"]) / float(cfg["sweep"]["tokens"])
  tps, total = int(m["batch_size"]) * int(m["seq_len"]), int(m["total_steps"])  # tokens / step
  m["curve"] = _curve(workdir, total, tps, m["flops_per_token"])
  m["complete"] = bool(m["curve"]) and m["curve"][-1]["step"] == total
  probes, m["probe_file"] = _probes(workdir, total)
  m["probes"] = [{"step": s, "tokens": s * tps, **probes[s]} for s in sorted(probes)]
  return m


def read_runs(root: str) -> list[dict]:
  """Every member workdir directly under `root`."""
  if not os.path.isdir(root):
    raise CmsError(f"--runs: no such directory {root!r}")
  found = [m for d in record_lib.run_names(root) if (m := read_member(os.path.join(root, d)))]
  if not found:
    raise CmsError(f"--runs: {root!r} holds no member workdirs (subdirectories with config.json)")
  return found


def pair_up(found: list[dict], allow_incomplete: bool) -> tuple[list[tuple[dict, dict]], list[str]]:
  """[(CMS member, no-CMS member)] per (size, seed), smallest N first; warnings for the pairs
  skipped (allow_incomplete). Raises CmsError on a duplicate arm, a premise mismatch, or (without
  allow_incomplete) a missing arm or an unfinished member."""
  groups: dict[tuple[str, int], dict[bool, dict]] = {}
  for m in found:
    arms = groups.setdefault((m["size"], m["seed"]), {})
    if m["cms"] in arms:
      raise CmsError(f"{m['path']}: a second {ARM[m['cms']]} arm for {m['size']} seed {m['seed']}")
    arms[m["cms"]] = m
  for arms in groups.values():  # the premise first: a mismatch is never skipped
    if len(arms) == 2:
      for k in PREMISE:
        a, b = arms[True][k.split(".")[-1]], arms[False][k.split(".")[-1]]
        if a != b:
          raise CmsError(
            f"{arms[False]['path']}: {k} {b!r} differs from {arms[True]['name']}'s {a!r} (the "
            f"arms must share {', '.join(PREMISE)})"
          )
  pairs, warnings = [], []
  by_n = lambda kv: (min(int(m["n_params"]) for m in kv[1].values()), kv[0])  # smallest N first
  for (size, seed), arms in sorted(groups.items(), key=by_n):
    problem = next((f"no {ARM[c]} arm for {size} seed {seed}" for c in ARM if c not in arms), "")
    late = [
      f"{m['path']}: no val_full record at total_steps {m['total_steps']}"
      for m in arms.values()
      if not m["complete"]
    ]
    problem = problem or "; ".join(late)
    if problem and not allow_incomplete:
      raise CmsError(problem + " (--allow_incomplete skips the pair)")
    if problem:
      warnings.append(f"{problem}: pair {size} seed {seed} skipped")
    else:
      pairs.append((arms[True], arms[False]))
  if not pairs:
    raise CmsError(f"no complete pair to analyse ({'; '.join(warnings)})")
  return pairs, warnings


# ------------------------------------------------------------------------------ analysis ---
def levels(l_lo: float, l_hi: float, n: int = LEVELS) -> list[float]:
  """The declared levels, high to low (training order): L_lo + (L_hi - L_lo) k / n for
  k = n - 1 .. 0 (L_hi excluded, L_lo included)."""
  return [float(l_lo + (l_hi - l_lo) * k / n) for k in range(n - 1, -1, -1)]


def tokens_to_level(curve: list[dict], level: float) -> tuple[float, bool] | None:
  """(tokens to reach `level`, whether the first measurement already is at or below it: then the
  tokens are that measurement's, an upper bound); None if the curve never reaches it."""
  for i, p in enumerate(curve):
    if p["half_loss"] <= level:
      if i == 0:
        return float(p["tokens"]), True
      q = curve[i - 1]  # q's loss > level >= p's: interpolate log tokens linearly in loss
      frac = (q["half_loss"] - level) / (q["half_loss"] - p["half_loss"])
      return math.exp(math.log(q["tokens"]) + frac * math.log(p["tokens"] / q["tokens"])), False
  return None


def analyse_pair(cms: dict, nocms: dict) -> dict:
  """The pair's shared range, its levels, tokens and FLOPs to each level, ratios and summaries."""
  c, n = cms["curve"], nocms["curve"]
  out = {"size": cms["size"], "seed": cms["seed"], "cms": cms["name"], "nocms": nocms["name"]}
  out |= {"L_hi": min(c[0]["half_loss"], n[0]["half_loss"])}
  out |= {"L_lo": max(c[-1]["half_loss"], n[-1]["half_loss"])}
  fpt = out["flops_per_token_ratio"] = nocms["flops_per_token"] / cms["flops_per_token"]
  out |= {"shared_range": out["L_lo"] < out["L_hi"], "levels": []}
  if not out["shared_range"]:
    return out
  for level in levels(out["L_lo"], out["L_hi"]):
    (tc, first_c), (tn, first_n) = tokens_to_level(c, level), tokens_to_level(n, level)
    row = {"level": level, "tokens_cms": tc, "tokens_nocms": tn, "at_first_cms": first_c}
    row |= {"at_first_nocms": first_n, "flops_cms": tc * cms["flops_per_token"]}
    row |= {"flops_nocms": tn * nocms["flops_per_token"], "tokens_ratio": tn / tc}
    row["flops_ratio"] = row["tokens_ratio"] * fpt  # = flops_nocms / flops_cms
    out["levels"].append(row)
  for key in ("tokens_ratio", "flops_ratio"):
    v = [r[key] for r in out["levels"]]
    out[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
  first = [r["at_first_cms"] or r["at_first_nocms"] for r in out["levels"]]
  interior = [r["tokens_ratio"] for r, f in zip(out["levels"], first) if not f]
  out["levels_at_first"] = len(out["levels"]) - len(interior)
  out["tokens_ratio_interior_median"] = statistics.median(interior) if interior else None
  return out


def per_size(pairs: list[dict]) -> list[dict]:
  """Per size: the mean over seeds of the pairs' median ratios, with each seed's median."""
  sizes = []
  for size in dict.fromkeys(p["size"] for p in pairs):
    mine = [p for p in pairs if p["size"] == size]
    ranged = [p for p in mine if p["shared_range"]]
    s = {"size": size, "seeds_without_range": [p["seed"] for p in mine if not p["shared_range"]]}
    for key in ("tokens_ratio", "flops_ratio"):
      seeds = {str(p["seed"]): p[key]["median"] for p in ranged}
      s[key] = {"mean": statistics.fmean(seeds.values()) if seeds else None, "seeds": seeds}
    sizes.append(s)
  return sizes


def probe_diffs(cms: dict, nocms: dict) -> list[dict]:
  """CMS - no-CMS per probe average at every step both arms probed (same steps: same tokens)."""
  rows = []
  other = {p["step"]: p for p in nocms["probes"]}
  for p in cms["probes"]:
    q = other.get(p["step"])
    keys = {k for k in p if q and k in q and k not in ("step", "tokens")}
    for k in [k for k in PROBE_ORDER if k in keys] + sorted(keys - set(PROBE_ORDER)):
      row = {"size": cms["size"], "seed": cms["seed"], "step": p["step"], "tokens": p["tokens"]}
      rows.append(row | {"probe": k, "cms": p[k], "nocms": q[k], "diff": p[k] - q[k]})
  return rows


def _fewer(ratio: float | None, what: str) -> str:
  """'1.8x fewer tokens' (ratio > 1), '1.3x more tokens' (< 1), 'the same tokens' (= 1)."""
  if ratio is None:
    return f"no {what} ratio (no shared range)"
  if ratio == 1:
    return f"the same {what}"
  return f"{max(ratio, 1 / ratio):.3g}x {'fewer' if ratio > 1 else 'more'} {what}"


def verdict(sizes: list[dict]) -> list[str]:
  """One sentence per size, whichever way the ratios came out."""
  lines = []
  for s in sizes:
    t, f = s["tokens_ratio"], s["flops_ratio"]
    seeds = ", ".join(f"seed {k}: {v:.3g}" for k, v in t["seeds"].items())
    line = (
      f"{s['size']}: CMS reaches the shared loss levels with {_fewer(t['mean'], 'tokens')} and "
      f"{_fewer(f['mean'], 'FLOPs')} than no-CMS (mean over seeds of the median over levels; "
      f"tokens ratio no-CMS/CMS {seeds or '-'})"
    )
    if len({v > 1 for v in t["seeds"].values()}) > 1:
      line += "; the seeds disagree in direction"
    if s["seeds_without_range"]:
      line += f"; no shared range for seed(s) {', '.join(map(str, s['seeds_without_range']))}"
    lines.append(line + ".")
  return lines


def probe_verdict(rows: list[dict]) -> list[str]:
  """One sentence per size on the frozen probes (what the paper's claim is about): CMS - no-CMS
  at each pair's last probed step (both arms at the same tokens; the final offline suite), the
  mean over seeds with each seed's value, per probe; and at how many (seed, step) points CMS is
  ahead on the PLOT_PROBE average."""
  lines = []
  for size in dict.fromkeys(r["size"] for r in rows):
    mine = [r for r in rows if r["size"] == size]
    last = {}
    for r in mine:
      last[r["seed"]] = max(last.get(r["seed"], r["step"]), r["step"])
    final = [r for r in mine if r["step"] == last[r["seed"]]]
    present = {r["probe"] for r in final}
    parts = []
    for probe in [k for k in PROBE_ORDER if k in present] + sorted(present - set(PROBE_ORDER)):
      by_seed = {r["seed"]: r["diff"] for r in final if r["probe"] == probe}
      seeds = ", ".join(f"seed {k} {v:+.4f}" for k, v in sorted(by_seed.items()))
      parts.append(f"{probe} {statistics.fmean(by_seed.values()):+.4f} ({seeds})")
    line = (
      f"{size}: frozen probes at the last step (both arms at the same tokens), CMS - no-CMS, "
      f"mean over seeds: {'; '.join(parts)}"
    )
    headline = [r for r in mine if r["probe"] == PLOT_PROBE]
    if headline:
      ahead = sum(r["diff"] > 0 for r in headline)
      line += (
        f"; CMS ahead on the {PLOT_PROBE} average at {ahead} of {len(headline)} (seed, step) points"
      )
    lines.append(line + ".")
  return lines


# ------------------------------------------------------------------------------- outputs ---
def _g(x: float | None, star: bool = False) -> str:
  """A table cell: 4 significant digits, '*' when an upper bound, '-' for None."""
  return "-" if x is None else f"{x:.4g}" + ("*" if star else "")


def _row(*cells) -> str:
  """A markdown table row."""
  return "| " + " | ".join(map(str, cells)) + " |"


def markdown(result: dict) -> str:
  """cms.md: the design, a table per pair, the per-size summary, probes, the verdict."""
  L = [
    "# CMS control: CrossBERT with vs without CMS at equal data",
    "",
    f"Runs: `{result['runs']}`.",
    "",
    DESIGN.replace("LEVELS", str(LEVELS)),
    "",
    f"`half` (the val_full record's definition): {result['definition']}",
    "",
    "## Pairs",
  ]
  for p in result["pairs"]:
    L += ["", f"### {p['size']} seed {p['seed']}: {p['cms']} vs {p['nocms']}", ""]
    if not p["shared_range"]:
      L.append(f"No shared range: L_lo = {p['L_lo']:.4f} >= L_hi = {p['L_hi']:.4f}; no ratios.")
      continue
    L += [
      f"Shared range [L_lo, L_hi] = [{p['L_lo']:.4f}, {p['L_hi']:.4f}]; FLOPs per token "
      f"no-CMS / CMS = {p['flops_per_token_ratio']:.4g}.",
      "",
      _row("level", "half loss", *(f"{q} {a}" for q in ("tokens", "FLOPs") for a in COLUMNS)),
      "|---" * 8 + "|",
    ]
    for i, r in enumerate(p["levels"]):
      fc, fn = r["at_first_cms"], r["at_first_nocms"]
      tokens = _g(r["tokens_cms"], fc), _g(r["tokens_nocms"], fn), _g(r["tokens_ratio"])
      flops = _g(r["flops_cms"], fc), _g(r["flops_nocms"], fn), _g(r["flops_ratio"])
      L.append(_row(i + 1, f"{r['level']:.6g}", *tokens, *flops))
    t, f, im = p["tokens_ratio"], p["flops_ratio"], p["tokens_ratio_interior_median"]
    L += [
      "",
      f"Median over levels: tokens ratio {t['median']:.4g} (range {t['min']:.4g}-{t['max']:.4g}), "
      f"FLOPs ratio {f['median']:.4g} (range {f['min']:.4g}-{f['max']:.4g}).",
      f"\\* {p['levels_at_first']} of {len(p['levels'])} levels are at or above an arm's first "
      "measurement: that arm's tokens are its first measurement's, an upper bound (the ratio is "
      f"biased towards 1 there). Median over the other levels (not declared; for reference): "
      f"{_g(im)}.",
    ]
  L += [
    "",
    "## Per size",
    "",
    "| size | tokens ratio (mean over seeds) | per seed | FLOPs ratio (mean over seeds) | per seed |",
    "|---|---|---|---|---|",
  ]
  per = lambda d: ", ".join(f"{k}: {v:.4g}" for k, v in d.items()) or "-"  # seed: median
  for s in result["sizes"]:
    t, f = s["tokens_ratio"], s["flops_ratio"]
    L.append(_row(s["size"], _g(t["mean"]), per(t["seeds"]), _g(f["mean"]), per(f["seeds"])))
  L += [
    "",
    "## Probes vs tokens",
    "",
    "Probe averages (`probe/avg/<probe>` online, the final offline suite at the last step); "
    "both arms at the same steps, so the same tokens.",
    "",
    "| size | seed | step | tokens | probe | CMS | no-CMS | CMS - no-CMS |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in result["probes"]:
    cells = (r[k] for k in ("size", "seed", "step", "tokens", "probe"))
    L.append(_row(*cells, f"{r['cms']:.4f}", f"{r['nocms']:.4f}", f"{r['diff']:+.4f}"))
  L += ["", "## Verdict", "", *(f"* {v}" for v in result["verdict"])]
  L += [f"* warning: {w}" for w in result["warnings"]]
  return "\n".join(L) + "\n"


def plot(result: dict, members: list[dict], what: str, path: str, root: str) -> None:
  """cms_curves.png (what="curves": half loss vs log tokens, the levels as faint lines) or
  cms_probes.png (what="probes": the PLOT_PROBE average vs tokens, linear); one panel per size,
  CMS solid, no-CMS dashed, one colour per seed."""
  Figure, Canvas = plotting.matplotlib_classes(os.path.join(root, ".matplotlib"))
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel  # after the setup

  sizes = [s["size"] for s in result["sizes"]]
  fig = Figure(figsize=(5.5 * len(sizes), 4.2))
  for i, size in enumerate(sizes):
    ax = fig.add_subplot(1, len(sizes), i + 1)
    for m in (m for m in members if m["size"] == size):
      style = dict(ls="-" if m["cms"] else "--", marker="o" if m["cms"] else "s", ms=3)
      style |= dict(color=f"C{m['seed'] % 10}", label=f"{ARM[m['cms']]} seed {m['seed']}")
      if what == "curves":
        pts = [(p["tokens"], p["half_loss"]) for p in m["curve"]]
      else:
        pts = [(p["tokens"], p[PLOT_PROBE]) for p in m["probes"] if PLOT_PROBE in p]
      if pts:
        ax.plot(*zip(*pts), **style)
    if what == "curves":
      for p in (p for p in result["pairs"] if p["size"] == size):
        for r in p["levels"]:
          ax.axhline(r["level"], color=f"C{p['seed'] % 10}", alpha=0.15, lw=0.7)
    ylabel = "val_full half loss" if what == "curves" else f"probe average ({PLOT_PROBE})"
    # the loss curve on log tokens (its measurements span >1 decade), the probes' evenly spaced
    # points on linear tokens; labels "200k", "1M"
    ax.set(xscale="log" if what == "curves" else "linear", xlabel="training tokens seen")
    ax.set(ylabel=ylabel, title=size)
    if what == "curves":  # ticks at 1, 2, 5 x 10^k (matplotlib labels every minor tick of a log
      # axis spanning about a decade, and they overlap)
      ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
      ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  Canvas(fig).print_png(path)


def analyse(runs: str, out: str | None = None, allow_incomplete: bool = False) -> dict:
  """Reads the runs, computes everything and writes cms.md, cms.json and the two PNGs to `out`
  (default <runs>/report); returns the result (cms.json's content) with "files"."""
  found = read_runs(runs)
  pairs, warnings = pair_up(found, allow_incomplete)
  analysed = [analyse_pair(c, n) for c, n in pairs]
  used = [m for pair in pairs for m in pair]
  definition = record_lib.read_val_full(used[0]["path"], used[0]["curve"][-1]["step"])
  result = {
    "runs": os.path.abspath(runs),
    "LEVELS": LEVELS,
    "definition": definition.get("definition", ""),
    "warnings": warnings,
    "members": used,
    "pairs": analysed,
    "sizes": per_size(analysed),
    "probes": [r for c, n in pairs for r in probe_diffs(c, n)],
  }
  result["verdict"] = verdict(result["sizes"]) + probe_verdict(result["probes"])
  out = out or os.path.join(runs, "report")
  os.makedirs(out, exist_ok=True)
  files = {k: os.path.join(out, f"cms{k}") for k in (".md", ".json", "_curves.png", "_probes.png")}
  with open(files[".md"], "w") as f:
    f.write(markdown(result))
  status_lib.write_json_atomic(files[".json"], result)
  plot(result, used, "curves", files["_curves.png"], runs)
  plot(result, used, "probes", files["_probes.png"], runs)
  return result | {"files": list(files.values())}


def main(argv=None) -> int:
  """The CLI: 0, or 2 with a one-line `cms error:` on stderr."""
  parser = argparse.ArgumentParser("python -m cbert_jax.report.cms", description=DESIGN)
  parser.add_argument("--runs", required=True, help="the experiment's root (member workdirs)")
  parser.add_argument("--out", default=None, help="output directory (default <runs>/report)")
  parser.add_argument("--allow_incomplete", action="store_true", help="skip unfinished pairs")
  ns = parser.parse_args(argv)
  try:
    result = analyse(ns.runs, ns.out, ns.allow_incomplete)
  except CmsError as e:
    print(f"cms error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"cms error: {e.filename or ns.out}: {e.strerror or e}", file=sys.stderr)
    return 2
  for w in result["warnings"]:
    print(f"warning: {w}", file=sys.stderr)
  print("\n".join([*result["verdict"], *result["files"]]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
