r"""Predict a size the sweep has not trained, before training it; then check the prediction.

  python -m cbert_jax.report.heldout predict --sweep results/sweep_cpu \
      --experiment experiments/sweep.py:heldout --out results/heldout_cpu
  python -m cbert_jax.report.heldout check --dir results/heldout_cpu

`predict` reads the sweep's finished members (`fits.read_sweep`), resolves the held-out members
the experiment file names (seed 0 of each family: its N, tokens, compute, and the batch and LR the
sweep's laws give it, exactly as training will), and writes `predictions.json` and
`predictions.md` into `--out`. It refuses to write over an existing predictions file: the file is
meant to be committed before the first held-out run, so git history shows the order.

What is predicted, per family, from every seed of every sweep size (the report's own fits):
  * the final full-split validation loss, from the power law ln L = b0 + b1 ln C (the report's
    headline fit) with its t prediction interval for the mean of n0 = 1 and n0 = 2 new seeds
    (`backtest.predict`: exact under Gaussian errors about the line; the interval that applies is
    the one for the number of seeds measured); the saturating law L = e + b C^-beta's point
    prediction beside it (a nonlinear fit: no interval);
  * each probe average (ridge, logreg, kNN, retrieval) from score = s0 + slope log10 C, with the
    same intervals, averaged over the tasks that every sweep member scored and the held-out
    member's task list names (`shared_tasks`: a task kit can change between the sweep and the
    held-out runs, and an average over other tasks is another quantity); the tasks and their
    split sizes are recorded, and the check averages the held-out runs over the same tasks.
The lack-of-fit test of each line is recorded with it: a line the test rejects (BERT's loss, for
one) is still the prediction made, and the file says so, so nobody can pick the better-looking
law afterwards.

`check` reads the held-out members trained in `--dir` (the same layout as a sweep: one workdir
per member, `python -m cbert_jax.report.archive` output included), refuses members whose compute,
batch or LR differ from what was predicted for, and writes `check.json` and `check.md`:
predicted vs measured in the law's units and in %, and inside/outside the interval for the number
of seeds measured. The scaling report shows the same table (`python -m cbert_jax.report
--heldout DIR`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np

from cbert_jax.report import backtest
from cbert_jax.report.fits import ARCHS, PROBES, ReportError, read_sweep

PREDICTIONS = "predictions.json"
CHECK = "check.json"
SEEDS = (1, 2)  # the n0 (seeds measured at the held-out size) each interval is given for
# a held-out member must have been trained on the compute, batch and LR predicted for
MATCH_RTOL = 1e-6


class HeldoutError(ReportError):
  """A predictions file or held-out run that cannot be used (one line names the file or field)."""


# ------------------------------------------------------------------------- the targets ---
def targets(experiment_spec: str) -> dict:
  """{family: the held-out member's resolved numbers} for seed 0 of each family the experiment's
  sweep names (`experiments/sweep.py:heldout`)."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel (imports the models)

  path, _, arg = experiment_spec.partition(":")
  exp = config_lib.import_experiment(path, field="--experiment", needs=("get_config", "get_sweep"))
  out = {}
  for member in exp.get_sweep(arg or None):
    cfg = config_lib.resolve(exp.get_config(member))
    arch = cfg.model_name + ("" if cfg.masking.cms or cfg.model_name != "crossbert" else "-nocms")
    if cfg.seed != 0 or arch in out:
      continue
    out[arch] = {
      "member": member,
      "size": cfg.model.size,
      "n_params": int(cfg.sweep.n_params),
      "tokens": int(cfg.sweep.tokens),
      "compute": float(cfg.sweep.compute),
      "batch_size": int(cfg.batch_size),
      "lr": float(cfg.optim.lr),
      "total_steps": int(cfg.total_steps),
      "laws": str(cfg.sweep.laws),
      "corpus": str(cfg.data.corpus),
      "tasks": [t.strip() for t in cfg.evals.tasks.split(",") if t.strip()],
    }
  return out


# ------------------------------------------------------------------ probes on shared tasks ---
def _scored(workdir: str, step: int) -> dict:
  """{task: its result} of the offline suite at `step` in `workdir` (scored tasks only)."""
  from cbert_jax.evaluators import suite  # pylint: disable=import-outside-toplevel
  from cbert_jax.run import record as record_lib  # pylint: disable=import-outside-toplevel

  found = record_lib.offline_results(workdir, step)
  results = found[1]["results"] if found else {}
  return {k: v for k, v in results.items() if k != "average" and not suite.not_scored(v)}


def shared_tasks(root: str, members: list[dict], wanted: list[str]) -> list[str]:
  """The tasks of `wanted` (the held-out member's task list) that every member has scored: the
  probe averages are predicted and checked over these only, since a task kit can change between
  the sweep and the held-out runs."""
  have = [set(_scored(os.path.join(root, m["name"]), m["steps"])) for m in members]
  return [t for t in wanted if all(t in h for h in have)]


def task_averages(workdir: str, step: int, tasks: list[str]) -> tuple[dict, dict]:
  """({probe: mean score over `tasks`}, {task: its split sizes}) of one member
  (`evaluators.suite.average` on those tasks' results)."""
  from cbert_jax.evaluators import suite  # pylint: disable=import-outside-toplevel

  scored = _scored(workdir, step)
  chosen = {t: scored[t] for t in tasks if t in scored}
  if len(chosen) < len(tasks):
    return {}, {}
  averages = suite.average(chosen)
  return {k: v for k, v in averages.items() if k in PROBES}, {
    t: r.get("sizes") for t, r in chosen.items()
  }


# ------------------------------------------------------------------------ predictions ---
def _line_prediction(x, y, x0: float, space: backtest.Space, n_params_law: int = 2) -> dict:
  """A line's value at x0 with its t intervals for 1 and 2 new seeds, in the law's units."""
  line = backtest.fit_line(x, y)
  lof = backtest.lack_of_fit(x, y, line(x), n_params_law)
  intervals = {}
  for n0 in SEEDS:
    got = backtest.predict(line, x0, n0)
    iv = got["interval"]
    intervals[str(n0)] = [space.to_units(v) for v in iv] if iv else None
  return {
    "predicted": space.to_units(backtest.predict(line, x0, 1)["predicted"]),
    "intervals": intervals,  # {"1": [lo, hi], "2": [lo, hi]} at backtest.LEVEL
    "slope": line.slope,
    "fitted_on": {"observations": line.n, "sizes": int(np.unique(x).size), "dof": line.dof},
    "lack_of_fit": lof,
    "is_law": backtest.passes(lof),
  }


def _saturating(c, loss, c0: float) -> dict:
  from cbert_jax.scaling import fit as fit_lib  # pylint: disable=import-outside-toplevel

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      law = fit_lib.fit_saturating(c, loss)
    except (RuntimeError, ValueError) as e:
      return {"error": str(e)}
  return {"predicted": float(law(c0)), "beta": float(law.beta), "interval": None}


def predict_family(members: list[dict], target: dict) -> dict:
  """The loss and probe predictions for one family's held-out member from its sweep members."""
  c = np.array([m["compute"] for m in members], np.float64)
  if np.unique(c).size < 3:
    raise HeldoutError(
      f"{target['member']}: the sweep has {np.unique(c).size} finished sizes of this family; "
      "a prediction with an interval needs at least 3"
    )
  c0 = target["compute"]
  loss = np.array([m["final_loss"] for m in members], np.float64)
  out = {
    "loss": _line_prediction(np.log(c), np.log(loss), math.log(c0), backtest.LOG)
    | {"law": "ln L = b0 + b1 ln C (power law)"},
    "loss_saturating": _saturating(c, loss, c0),
    "probes": {},
    "extrapolation": c0 / float(c.max()),  # held-out compute / the sweep's largest
  }
  for key in PROBES:
    have = [m for m in members if m["probes"].get(key) is not None]
    if len({m["compute"] for m in have}) < 3:
      continue
    x = np.log10([m["compute"] for m in have])
    y = np.array([m["probes"][key] for m in have], np.float64)
    out["probes"][key] = _line_prediction(x, y, math.log10(c0), backtest.LINEAR) | {
      "law": "score = s0 + slope log10 C"
    }
  return out


def _git_head() -> str | None:
  try:
    return subprocess.run(
      ["git", "rev-parse", "HEAD"],
      capture_output=True,
      text=True,
      check=True,
      cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def predict(sweep: str, experiment_spec: str, note: str = "") -> dict:
  """The predictions record (what `predict` writes as predictions.json); `note`: why this size,
  data and setup (kept in the file)."""
  members = [m for m in read_sweep(sweep) if m["finished"] and m["compute"] > 0]
  tgts = targets(experiment_spec)
  families = {}
  for arch, target in tgts.items():
    if arch not in ARCHS:
      continue
    ms = [m for m in members if m["arch"] == arch]
    tasks = shared_tasks(sweep, ms, target["tasks"])
    sizes = {}
    for m in ms:  # the probe averages over the shared tasks only
      m["probes"], sizes = task_averages(os.path.join(sweep, m["name"]), m["steps"], tasks)
    families[arch] = {
      "target": target,
      "fitted_on": sorted(m["name"] for m in ms),
      "tasks": tasks,
      "task_sizes": sizes,  # train/dev/test sizes in the sweep's kit, checked against the runs'
    } | predict_family(ms, target)
  return {
    "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "git_head": _git_head(),
    "sweep": os.path.relpath(os.path.abspath(sweep)),
    "experiment": experiment_spec,
    "note": note,
    "level": backtest.LEVEL,
    "metric": "final full-split validation loss (val_full) and offline probe-suite averages",
    "rule": (
      "a prediction holds when the mean of the seeds measured falls inside the interval for that "
      "number of seeds; the power-law line is the loss prediction whatever its lack-of-fit test "
      "says; the saturating law is reported beside it, not used to judge"
    ),
    "families": families,
  }


# ---------------------------------------------------------------------------- checking ---
def load_predictions(directory: str) -> dict:
  path = os.path.join(directory, PREDICTIONS)
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError as e:
    raise HeldoutError(
      f"{path}: no predictions file (write it first: python -m cbert_jax.report.heldout predict)"
    ) from e
  except json.JSONDecodeError as e:
    raise HeldoutError(f"{path}: not JSON ({e})") from e


def _matches(member: dict, target: dict) -> str | None:
  """What differs between a trained member and the target it was predicted for (None: nothing)."""
  for key, got in (
    ("compute", member["compute"]),
    ("batch_size", member["batch_size"]),
    ("lr", member["lr"]),
  ):
    want = target[key]
    if not math.isclose(float(got), float(want), rel_tol=MATCH_RTOL):
      return f"{key} {got!r}, predicted for {want!r}"
  return None


def _compare(pred: dict, values: list[float]) -> dict:
  measured = float(np.mean(values))
  n0 = min(len(values), max(SEEDS))
  iv = pred["intervals"].get(str(n0))
  return {
    "predicted": pred["predicted"],
    "measured": measured,
    "seeds": len(values),
    "per_seed": values,
    "interval": iv,
    "inside": (iv[0] <= measured <= iv[1]) if iv else None,
  } | backtest.miss(pred["predicted"], measured)


def check(directory: str) -> dict:
  """Predicted vs measured for every family with finished held-out members in `directory`."""
  preds = load_predictions(directory)
  members = [m for m in read_sweep(directory) if m["finished"]] if _has_runs(directory) else []
  out = {"predictions_created": preds["created"], "level": preds["level"], "families": {}}
  for arch, fam in preds["families"].items():
    ms = [m for m in members if m["arch"] == arch and m["size"] == fam["target"]["size"]]
    for m in ms:
      why = _matches(m, fam["target"])
      if why:
        raise HeldoutError(f"{m['name']}: trained with {why}; the prediction does not apply")
    if not ms:
      out["families"][arch] = {"measured": None, "seeds": []}
      continue
    entry = {
      "seeds": sorted(m["seed"] for m in ms),
      "loss": _compare(fam["loss"], [m["final_loss"] for m in ms]),
      "probes": {},
    }
    sat = fam.get("loss_saturating", {})
    if "predicted" in sat:
      entry["loss_saturating"] = _compare(
        {"predicted": sat["predicted"], "intervals": {}}, [m["final_loss"] for m in ms]
      )
    got = [task_averages(os.path.join(directory, m["name"]), m["steps"], fam["tasks"]) for m in ms]
    entry["task_sizes_differ"] = sorted(
      {t for _, sizes in got for t, n in sizes.items() if n != fam["task_sizes"].get(t)}
    )
    for key, pred in fam["probes"].items():
      vals = [avg[key] for avg, _ in got if avg.get(key) is not None]
      if vals:
        entry["probes"][key] = _compare(pred, vals)
    out["families"][arch] = entry
  return out


def _has_runs(directory: str) -> bool:
  return any(
    os.path.isfile(os.path.join(directory, d, "config.json")) for d in os.listdir(directory)
  )


# ---------------------------------------------------------------------------- markdown ---
def _iv(iv, spec) -> str:
  return f"[{iv[0]:{spec}}, {iv[1]:{spec}}]" if iv else "-"


def predictions_markdown(p: dict) -> str:
  pct = round(100 * p["level"])
  lines = [
    "# Pre-registered predictions for the held-out size",
    "",
    f"Written {p['created']} at commit {p['git_head'] or '?'}, from the sweep `{p['sweep']}`, "
    f"before any run of the held-out members (`{p['experiment']}`). {pct}% t prediction "
    "intervals for the mean of 1 and of 2 seeds. Rule: " + p["rule"] + ".",
    "",
  ]
  if p.get("note"):
    lines += [p["note"], ""]
  for arch, fam in p["families"].items():
    t = fam["target"]
    lo = fam["loss"]
    lines += [
      f"## {arch} {t['size']}",
      "",
      f"N {t['n_params']:,} non-embedding parameters, {t['tokens']:,} tokens, C {t['compute']:.4g} "
      f"FLOPs ({fam['extrapolation']:.2f}x the sweep's largest), batch {t['batch_size']} rows, "
      f"LR {t['lr']:.4g}, {t['total_steps']} steps, corpus {t['corpus']}, laws {t['laws']}. "
      f"Fitted on {len(fam['fitted_on'])} members: {', '.join(fam['fitted_on'])}. Probe "
      f"averages over the {len(fam['tasks'])} tasks both the sweep and the held-out task list "
      f"have: {', '.join(fam['tasks'])}.",
      "",
      f"| quantity | law | predicted | {pct}% interval, 1 seed | {pct}% interval, 2 seeds | "
      "lack-of-fit p |",
      "|---|---|---|---|---|---|",
    ]
    p_lof = (lo["lack_of_fit"] or {}).get("p")
    lines.append(
      f"| val_full loss (nats) | power law, exponent {lo['slope']:.4f} | {lo['predicted']:.4f} | "
      f"{_iv(lo['intervals']['1'], '.4f')} | {_iv(lo['intervals']['2'], '.4f')} | "
      f"{p_lof if p_lof is None else format(p_lof, '.3g')} |"
    )
    sat = fam["loss_saturating"]
    if "predicted" in sat:
      lines.append(
        f"| val_full loss (nats) | saturating, beta {sat['beta']:.3g} (beside, not judged) | "
        f"{sat['predicted']:.4f} | - | - | - |"
      )
    for key, pr in fam["probes"].items():
      p_lof = (pr["lack_of_fit"] or {}).get("p")
      lines.append(
        f"| {key} probe average | line, {pr['slope']:+.4f} per decade | {pr['predicted']:.4f} | "
        f"{_iv(pr['intervals']['1'], '.4f')} | {_iv(pr['intervals']['2'], '.4f')} | "
        f"{p_lof if p_lof is None else format(p_lof, '.3g')} |"
      )
    lines.append("")
  return "\n".join(lines)


def check_markdown(c: dict) -> list[str]:
  pct = round(100 * c["level"])
  lines = [
    f"Predictions written {c['predictions_created']} (before the runs); {pct}% t intervals for "
    "the number of seeds measured.",
    "",
    "| family | quantity | seeds | predicted | measured | miss | miss % | interval | inside |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for arch, fam in c["families"].items():
    if not fam.get("seeds"):
      lines.append(f"| {arch} | - | 0 | not trained yet | | | | | |")
      continue
    rows = [("val_full loss", fam["loss"])]
    if "loss_saturating" in fam:
      rows.append(("loss, saturating law", fam["loss_saturating"]))
    rows += [(f"{k} probe", v) for k, v in fam["probes"].items()]
    if fam.get("task_sizes_differ"):
      lines.append(
        f"| {arch} | task splits differ from the sweep's: {', '.join(fam['task_sizes_differ'])} "
        "| | | | | | | |"
      )
    for name, r in rows:
      inside = "-" if r["inside"] is None else ("yes" if r["inside"] else "**no**")
      lines.append(
        f"| {arch} | {name} | {r['seeds']} | {r['predicted']:.4f} | {r['measured']:.4f} | "
        f"{r['miss']:+.4f} | {r['miss_pct']:+.1f}% | {_iv(r['interval'], '.4f')} | {inside} |"
      )
  return lines


# -------------------------------------------------------------------------------- CLI ---
def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m cbert_jax.report.heldout", description=__doc__)
  p.formatter_class = argparse.RawDescriptionHelpFormatter
  sub = p.add_subparsers(dest="cmd", required=True)
  pp = sub.add_parser("predict", help="write predictions.json/.md before the held-out runs")
  pp.add_argument("--sweep", required=True, help="the sweep directory the laws are fitted on")
  pp.add_argument("--experiment", required=True, help="FILE:ARG naming the held-out members")
  pp.add_argument("--out", required=True, help="the held-out directory (predictions go here)")
  pp.add_argument("--note", default="", help="why this size, data and setup (kept in the file)")
  pc = sub.add_parser("check", help="predicted vs measured for the runs in --dir")
  pc.add_argument("--dir", required=True, help="holds predictions.json and the held-out runs")
  ns = p.parse_args(argv)
  try:
    if ns.cmd == "predict":
      path = os.path.join(ns.out, PREDICTIONS)
      if os.path.exists(path):
        raise HeldoutError(
          f"{path} exists: a pre-registered prediction is never rewritten (move it aside to "
          "predict again, and say why)"
        )
      preds = predict(ns.sweep, ns.experiment, ns.note)
      os.makedirs(ns.out, exist_ok=True)
      text = predictions_markdown(preds)
      with open(path, "w") as f:
        json.dump(preds, f, indent=2)
      with open(os.path.join(ns.out, "predictions.md"), "w") as f:
        f.write(text + "\n")
    else:
      result = check(ns.dir)
      text = "\n".join(["# Held-out size: predicted vs measured", "", *check_markdown(result)])
      with open(os.path.join(ns.dir, CHECK), "w") as f:
        json.dump(result, f, indent=2)
      with open(os.path.join(ns.dir, "check.md"), "w") as f:
        f.write(text + "\n")
  except ReportError as e:
    print(f"heldout error: {e}", file=sys.stderr)
    return 2
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
