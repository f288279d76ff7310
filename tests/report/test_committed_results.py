"""The committed cpu report (docs/sweep_cpu) is what the committed archives (results/) give.

docs/sweep_cpu/report.json and docs/sweep_cpu/cms/cms.json were written from the live run roots;
results/sweep_cpu and results/cms_control are those roots' archives (configs, metrics, full-split
validation and probe records, no checkpoints). Recomputing from the archives must reproduce every
member's numbers, the loss and probe fits with their intervals, and the CMS experiment's ratios
and probe differences: the numbers docs/scaling.md and the README quote are reproducible from the
repository alone. (The loss surface, the report's slow part, is left out: its inputs are the same
members checked here.)
"""

import json
import os

import pytest

from cbert_jax.report import cms as cms_lib
from cbert_jax.report.fits import ALL_ARCHS, ARCHS, fit_loss, fit_probes, group, read_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, "docs", "sweep_cpu", "report.json")
CMS = os.path.join(ROOT, "docs", "sweep_cpu", "cms", "cms.json")
MEMBER_KEYS = ("seed", "n_params", "compute", "tokens", "steps", "batch_size", "lr", "final_loss")


def _close(got, want, where="") -> None:
  """Nested JSON values equal, floats to 1e-9 relative."""
  if isinstance(want, dict):
    assert isinstance(got, dict) and sorted(got) == sorted(want), where
    for k in want:
      _close(got[k], want[k], f"{where}.{k}")
  elif isinstance(want, list):
    assert isinstance(got, list) and len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
      _close(g, w, f"{where}[{i}]")
  elif isinstance(want, float):
    assert got == pytest.approx(want, rel=1e-9), where
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
