"""The committed cpu report (docs/sweep_cpu) is what the committed archives (results/) give.

docs/sweep_cpu/report.json and docs/sweep_cpu/cms/cms.json were written from the live run roots;
results/sweep_cpu and results/cms_control are those roots' archives (configs, metrics, full-split
validation and probe records, no checkpoints). Recomputing from the archives must reproduce every
member's numbers, the loss and probe fits with their intervals, and the CMS experiment's ratios
and probe differences: the numbers docs/scaling.md and the README quote are reproducible from the
repository alone. (The loss surface, the report's slow part, is left out: its inputs are the same
members checked here.) The backtests beside every exponent (each law refitted without one size,
its lack-of-fit test; the grid laws' misses and loss costs against the best constant) are
recomputed too, and the report written from the archives prints a miss and a lack-of-fit p-value
(or, for the grid's laws, the reason there is none) beside every exponent.
"""

import json
import os
import re

import pytest

from cbert_jax.report import backtest, hparam_laws
from cbert_jax.report import cms as cms_lib
from cbert_jax.report import sweep_report as report
from cbert_jax.report.fits import ALL_ARCHS, ARCHS, PROBES, fit_loss, fit_probes, group, read_sweep
from cbert_jax.report.grid_read import read_grid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "docs", "sweep_cpu", "report.json")
HELDOUT = os.path.join("results", "heldout_cpu")  # predictions.json, check.md and the runs
CMS = os.path.join(ROOT, "docs", "sweep_cpu", "cms", "cms.json")
LAWCHECK = os.path.join("results", "lawcheck20_cpu")  # the laws checked at 20 tokens/param
CMS_FAIR = os.path.join(ROOT, "results", "cms_fair_cpu")  # grid/, compare/ and report/
MEMBER_KEYS = ("seed", "n_params", "compute", "tokens", "steps", "batch_size", "lr", "final_loss")


def _close(got, want, where="") -> None:
  """Nested JSON values equal, floats to 1e-6 relative: the fits are iterative (L-BFGS-B, least
  squares), and their last digits move with numpy/scipy/BLAS releases (a rel. 3e-9 change with
  scipy 1.17.1); every committed figure is reported to 4 digits or fewer."""
  if isinstance(want, dict):
    assert isinstance(got, dict) and sorted(got) == sorted(want), where
    for k in want:
      _close(got[k], want[k], f"{where}.{k}")
  elif isinstance(want, list):
    assert isinstance(got, list) and len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
      _close(g, w, f"{where}[{i}]")
  elif isinstance(want, float):
    assert got == pytest.approx(want, rel=1e-6), where
  else:
    assert got == want, where


def _load(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def test_the_committed_sweep_report_is_recomputed_from_the_archive():
  committed = _load(REPORT)
  members = read_sweep(os.path.join(ROOT, "results", "sweep_cpu"))
  by_name = {m["name"]: m for m in members}
  finished = [m["name"] for m in committed["members"] if m["final_loss"] is not None]
  assert finished and set(finished) <= set(by_name)  # every reported member is archived
  for row in committed["members"]:
    if row["final_loss"] is None:
      continue
    m = by_name[row["name"]]
    for key in MEMBER_KEYS:
      _close(m[key], row[key], f"{row['name']}.{key}")
    assert {"ridge", "logreg", "knn", "retrieval"} <= set(row["probes"])  # every probe ran
    _close(m["probes"], row["probes"], f"{row['name']}.probes")
  groups = group(members)
  for arch in ALL_ARCHS:
    fit = fit_loss(groups, members, arch)
    if arch not in committed["loss_fits"]:
      assert fit is None
      continue
    want = committed["loss_fits"][arch]["power_law"]
    got = fit["power_law"]
    for key in ("alpha", "a", "alpha_ci", "alpha_t_ci"):
      assert got[key] == pytest.approx(want[key], rel=1e-9), (arch, key)
  for arch in ARCHS:
    fits = fit_probes(groups, members, arch)
    for probe, want in committed["probe_fits"][arch].items():
      got = fits[probe]
      for key in ("slope_per_decade", "slope_ci", "slope_t_ci", "spearman"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), (arch, probe, key)
      assert [s["slope_per_decade"] for s in got["per_seed"]] == pytest.approx(
        [s["slope_per_decade"] for s in want["per_seed"]], rel=1e-9
      )


def test_the_committed_cms_analysis_is_recomputed_from_the_archive(tmp_path):
  committed = _load(CMS)
  got = cms_lib.analyse(
    os.path.join(ROOT, "results", "cms_control"), out=str(tmp_path), allow_incomplete=False
  )
  assert got["LEVELS"] == committed["LEVELS"] and got["definition"] == committed["definition"]
  got = json.loads(json.dumps(got))  # as written: tuples become lists, keys strings
  for key in ("pairs", "sizes", "probes", "verdict"):
    _close(got[key], committed[key], key)


def test_the_committed_fair_cms_comparison_is_recomputed_from_its_archive(tmp_path):
  """results/cms_fair_cpu/report (docs/scaling.md's fair CMS comparison, quoted in the README) is
  what its archived members give: the grid, the rule's decision, the tokens ratio, the
  matched-FLOPs and equal-token differences."""
  from cbert_jax.report import cms_fair  # pylint: disable=import-outside-toplevel

  committed = _load(os.path.join(CMS_FAIR, "report", "cms_fair.json"))
  runs = [os.path.join(CMS_FAIR, stage) for stage in ("grid", "compare")]
  got = json.loads(json.dumps(cms_fair.analyse(runs, out=str(tmp_path))))
  assert committed["runs"] == [os.path.relpath(r, ROOT) for r in runs]
  assert got["grid"]["decision"] and got["compare"]["tokens_ratio"]  # finished, not interim
  for key in ("warnings", "grid", "compare"):
    _close(got[key], committed[key], key)


def test_the_committed_backtests_are_recomputed_from_the_archives():
  committed = _load(REPORT)
  members = read_sweep(os.path.join(ROOT, "results", "sweep_cpu"))
  got = json.loads(json.dumps(backtest.report_backtests(members, ALL_ARCHS, PROBES)))
  _close(got, committed["backtests"], "backtests")
  grid = os.path.join("results", "grid_cpu")  # as the committed report was run: from the root
  grid_members = read_grid(os.path.join(ROOT, grid))
  for entry in committed["laws"]:
    laws = hparam_laws.describe(entry["spec"], entry["families"], grid, grid_members)
    _close(json.loads(json.dumps(laws["backtest"])), entry["backtest"], entry["spec"])


def _table(text: str, header_start: str) -> list[list[str]]:
  """The rows (cells) of every markdown table whose header line starts with `header_start`."""
  rows, inside, header = [], False, []
  for line in text.splitlines():
    if line.startswith(header_start):
      inside, header = True, [c.strip() for c in line.strip("|").split("|")]
      continue
    if inside and line.startswith("|---"):
      continue
    if inside and line.startswith("|"):
      rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    else:
      inside = False
  return rows


def test_the_report_prints_a_miss_and_a_p_value_beside_every_exponent(tmp_path, monkeypatch):
  for name in ("plot_loss", "plot_probes", "plot_flops_per_token", "plot_cms"):
    monkeypatch.setattr(report, name, lambda *a, **k: None)  # figures: not what is checked here
  monkeypatch.chdir(ROOT)
  path = report.write(
    os.path.join("results", "sweep_cpu"),
    str(tmp_path),
    grid=os.path.join("results", "grid_cpu"),
    n_boot=0,  # the loss surface's bootstrap: not what is checked here
    chinchilla_starts=[(6.0, 6.8, 0.4, 0.35, 0.3)],
    heldout_dir=HELDOUT,
    lawcheck_dirs=(LAWCHECK,),
  )
  text = open(path, encoding="utf-8").read()
  # The check of the laws at the sweep's budget, under the laws it checked (each family its own)
  lines = text.splitlines()
  checked = [i for i, line in enumerate(lines) if line.startswith("* Checked at 20 tokens")]
  assert len(checked) == 2, checked
  assert "moved at crossbert d64L2;" in lines[checked[1]] and " bert " not in lines[checked[1]]
  assert "not moved at bert d64L2, bert d96L3" in lines[checked[0]]
  assert lines[checked[0] - 1].startswith("* Fitted on a grid trained at 5 tokens per parameter")
  # The held-out size's check: the committed check.md's table, recomputed from the archived runs
  # and the predictions file, is in the report.
  held = text.split("## Held-out size: pre-registered prediction vs measured", 1)[1]
  committed = open(os.path.join(HELDOUT, "check.md"), encoding="utf-8").read()
  table = [line for line in committed.splitlines() if line.startswith("| ")]
  assert table and all(line in held.splitlines() for line in table), held
  fits = _table(text, "| arch | quantity | law |")
  assert len(fits) == 2 * (2 + len(PROBES))  # per family: power law, saturating law, 4 probes
  miss = re.compile(
    r"^(d\d+L\d+ [+-]\d+\.\d+%?( in| OUT)?, ){3}d\d+L\d+ [+-]\d+\.\d+%?( in| OUT)?$"
  )
  for row in fits:
    where = (row["arch"], row["quantity"], row["law"])
    assert miss.match(row["leave one size out: miss"]), where
    assert re.match(r"p = [\d.e-]+ \(F = ", row["lack of fit"]), where
    p = float(row["lack of fit"].split()[2])
    want = "law" if p >= backtest.LOF_ALPHA else "a slope over the sizes measured (N "
    assert row["reads as"].startswith(want), where
  by_law = {(r["arch"], r["quantity"], r["law"][:5]): r for r in fits}
  assert by_law[("bert", "val loss", "a C^a")]["reads as"] == (
    "a slope over the sizes measured (N 57.5k-787k)"  # p = 0.012: a chord, not a law
  )
  laws = _table(text, "| law | a | exponent |")
  assert len(laws) == 8  # lr* and B* vs C and N, per family
  for row in laws:
    assert re.match(
      r"^(d\d+L\d+ \d\.\d\dx \(([+-]\d\.\d{3}|- \(outside the grid\))\)(, |$)){3}",
      row["leave one size out: law / optimum (loss cost, nats)"],
    ), row["law"]
    # one optimum per size: no replicates, so no lack-of-fit test, and never called a law
    assert row["lack of fit"] == "- (not testable: one observation per size (no replicates))"
    assert row["reads as"].startswith("a slope over the sizes measured (N ")


def test_the_committed_check_of_the_laws_at_20_tokens_per_parameter_is_recomputed(tmp_path):
  # results/lawcheck20_cpu/check.json (docs/scaling.md's table and verdicts) from the archived
  # runs beside it, the sweep's points re-derived from the shipped laws the check is about.
  from cbert_jax.report import lawcheck  # pylint: disable=import-outside-toplevel

  where = LAWCHECK
  committed = _load(os.path.join(ROOT, where, lawcheck.CHECK))
  got = lawcheck.check(os.path.join(ROOT, where), committed["experiment"], committed["laws"])
  assert committed["grid"] == where and not committed["pending"]
  got["grid"] = where
  _close(got, committed)
  statuses = {f"{g['arch']} {g['size']}": g["status"] for g in committed["groups"]}
  assert statuses["crossbert d64L2"] == "moved" and statuses["bert d64L2"] == "not moved"


def test_a_check_of_laws_the_sweep_did_not_use_is_refused_before_the_fits(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  check = _load(os.path.join(LAWCHECK, "check.json"))
  check["laws"] = "shipped:other-{model}"
  os.makedirs(tmp_path / "check")
  with open(tmp_path / "check" / "check.json", "w") as f:
    json.dump(check, f)
  with pytest.raises(report.ReportError) as e:
    report.write(
      os.path.join("results", "sweep_cpu"),
      str(tmp_path / "out"),
      lawcheck_dirs=(str(tmp_path / "check"),),
    )
  assert "it checked the laws 'shipped:other-{model}', which no member of the sweep used" in str(
    e.value
  )
  assert "(they used: shipped:cpu-bert, shipped:cpu-crossbert)" in str(e.value)
  assert not os.path.exists(tmp_path / "out" / "report.md")
  with pytest.raises(report.ReportError, match=r"--lawcheck: no .*check.json"):
    report.write(
      os.path.join("results", "sweep_cpu"), str(tmp_path / "out"), lawcheck_dirs=(str(tmp_path),)
    )
