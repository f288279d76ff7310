"""The report's backtests (cbert_jax.report.backtest) on synthetic data with known answers: a pure
power law with noise is predicted closely and passes the lack-of-fit test; a curved law fails it
and its exponent is called a slope; the interval and the F-test equal their textbook formulas; the
grid laws' misses and loss costs are the planted bowl's."""

import math

import numpy as np
import pytest
from scipy import stats

from cbert_jax.report import backtest, backtest_text
from cbert_jax.report import sweep_report as report
from tests import members as members_lib

COMPUTE = np.geomspace(1e12, 1e15, 5)  # 5 sizes, 3 decades of FLOPs
N_PARAMS = [1e5, 3e5, 1e6, 3e6, 1e7]  # their non-embedding parameters


def _members(loss_of_c, seeds=3, noise=0.0, seed=0) -> list[dict]:
  """Sweep members (the fields the backtests read): every size x `seeds`, loss = loss_of_c(C)
  times exp(N(0, noise)), and a ridge score rising 0.05 per decade with the same noise."""
  rng = np.random.default_rng(seed)
  out = []
  for size, (c, n) in enumerate(zip(COMPUTE, N_PARAMS)):
    for s in range(seeds):
      out.append(
        {
          "name": f"bert_s{size}_{s}",
          "arch": "bert",
          "size": f"s{size}",
          "tokens": 20 * n,
          "loss_source": "val_full",
          "seed": s,
          "finished": True,
          "compute": float(c),
          "n_params": n,
          "final_loss": float(loss_of_c(c) * math.exp(rng.normal(0, noise))),
          "probes": {"ridge": 0.3 + 0.05 * math.log10(c / 1e12) + rng.normal(0, noise)},
        }
      )
  return out


# --------------------------------------------------------------------- known answers ---
def test_a_pure_power_law_is_predicted_closely_and_passes_lack_of_fit():
  ms = _members(lambda c: 40.0 * c**-0.1, noise=0.005)  # 0.5% seed noise
  bt = backtest.loss_backtest(ms)
  assert bt["slope"] == pytest.approx(-0.1, abs=0.005)
  assert len(bt["loo"]) == 5 and all(r["fitted_on"] == 4 and r["seeds"] == 3 for r in bt["loo"])
  # a held-out size is missed by about the seed noise, well under 1%
  assert max(abs(r["miss_pct"]) for r in bt["loo"]) < 1.0
  assert sum(r["inside"] for r in bt["loo"]) >= 4  # 90% intervals: most sizes inside
  lof = bt["lack_of_fit"]
  assert lof["dof"] == [3, 10] and lof["p"] > 0.05
  assert bt["is_law"] and bt["reading"] == "law"
  probe = backtest.probe_backtest(ms, "ridge")
  assert probe["slope"] == pytest.approx(0.05, abs=0.005) and probe["is_law"]
  assert max(abs(r["miss"]) for r in probe["loo"]) < 0.01  # score units


def test_a_curved_law_fails_lack_of_fit_and_is_called_a_slope_over_the_sizes():
  # a floor makes log L curve in log C; a power law through it is a chord
  ms = _members(lambda c: 2.0 + 400.0 * c**-0.2, noise=0.002)
  bt = backtest.loss_backtest(ms)
  assert bt["lack_of_fit"]["p"] < 1e-6 and not bt["is_law"]
  assert bt["reading"] == "a slope over the sizes measured (N 100k-10M)"
  # log L is convex in log C: it lies above the line through the other sizes, extended to
  # either end, so both end sizes are predicted too low, outside their intervals
  first, last = bt["loo"][0], bt["loo"][-1]
  assert first["miss"] < 0 and last["miss"] < 0
  assert first["inside"] is False and last["inside"] is False
  # the wording reaches the report's text: the fits table, the backtests section, the claims
  lines = backtest_text.section({"bert": {"loss": bt, "probes": {}}}, {"bert": _loss_fit(ms)}, {})
  assert any("a slope over the sizes measured (N 100k-10M)" in line for line in lines)
  claim = report.claim_trend(0, "bert", "flat", {"ridge": _trend(ms)}, _loss_fit(ms), {"loss": bt})
  assert "a slope over the sizes measured (N 100k-10M), not a law." in claim
  cells = backtest_text.p_cell(bt), backtest_text.miss_cell(bt, True)
  assert cells[0].startswith("p = ") and cells[1].count("OUT") >= 2


def _loss_fit(ms):
  from cbert_jax.report import fits  # pylint: disable=import-outside-toplevel

  return fits.fit_loss(fits.group(ms), ms, "bert")


def _trend(ms):
  from cbert_jax.report import fits  # pylint: disable=import-outside-toplevel

  return fits.fit_probes(fits.group(ms), ms, "bert")["ridge"]


def test_the_interval_and_the_f_test_are_the_textbook_formulas():
  rng = np.random.default_rng(3)
  x = np.repeat([0.0, 1.0, 2.5, 4.0], [2, 3, 1, 2]).astype(float)  # unbalanced replicates
  y = 1.0 + 0.5 * x + 0.1 * x**2 + rng.normal(0, 0.2, x.size)
  # prediction of the mean of n0 = 2 new observations at x0, by the design matrix
  line = backtest.fit_line(x, y)
  design = np.stack([np.ones_like(x), x], 1)
  beta, sse, *_ = np.linalg.lstsq(design, y, rcond=None)
  s2 = float(sse[0]) / (x.size - 2)
  x0 = np.array([1.0, 3.0])
  se = math.sqrt(s2 * (1 / 2 + x0 @ np.linalg.inv(design.T @ design) @ x0))
  t = stats.t.ppf(0.95, x.size - 2)
  got = backtest.predict(line, 3.0, n0=2)
  assert got["predicted"] == pytest.approx(float(x0 @ beta), rel=1e-12)
  assert got["interval"] == pytest.approx([x0 @ beta - t * se, x0 @ beta + t * se], rel=1e-12)
  # lack of fit: the line against one free mean per x (dummy variables), F(m - 2, n - m)
  dummies = (x[:, None] == np.unique(x)[None, :]).astype(float)
  sse_sat = float(np.linalg.lstsq(dummies, y, rcond=None)[1][0])
  f = ((float(sse[0]) - sse_sat) / 2) / (sse_sat / (x.size - 4))
  lof = backtest.lack_of_fit(x, y, line(x))
  assert lof["F"] == pytest.approx(f, rel=1e-9) and lof["dof"] == [2, 4]
  assert lof["p"] == pytest.approx(stats.f.sf(f, 2, 4), rel=1e-9)


def test_without_replicates_or_residuals_there_is_no_test_and_no_interval():
  x, y = np.log([1.0, 2.0, 4.0]), np.log([1.0, 1.5, 2.5])  # one point per size
  lof = backtest.lack_of_fit(x, y, backtest.fit_line(x, y)(x))
  assert lof["p"] is None and "no replicates" in lof["reason"]
  assert backtest.reading(lof, "N 1k-4k") == "a slope over the sizes measured (N 1k-4k)"
  rows = backtest.loo_line(x, y, ["a", "b", "c"], backtest.LOG)
  assert [r["interval"] for r in rows] == [None] * 3 and [r["inside"] for r in rows] == [None] * 3
  # two points fix the line: the held-out prediction is the exact extrapolation
  assert rows[2]["predicted"] == pytest.approx(1.5**2, rel=1e-12)  # 1 -> 1.5 -> 2.25 at x 4
  assert rows[2]["ratio"] == pytest.approx(2.25 / 2.5, rel=1e-12)


def test_the_prediction_interval_covers_at_its_level():
  rng = np.random.default_rng(0)
  x = np.repeat(np.arange(4.0), 2)
  hits = []
  for _ in range(1500):
    y = 0.3 - 0.2 * x + rng.normal(0, 0.1, x.size)
    hits += [r["inside"] for r in backtest.loo_line(x, y, list("aabbccdd"), backtest.LINEAR)]
  assert np.mean(hits) == pytest.approx(0.90, abs=0.02)


# ---------------------------------------------------------------------- the grid's laws ---
def test_profile_cost_reads_the_parabola_between_neighbours_and_lines_beyond():
  xs = np.log([1e-3, 2e-3, 4e-3, 8e-3, 16e-3])
  bowl = lambda x: 5.0 + 0.3 * (x - math.log(2.5e-3)) ** 2  # noqa: E731
  pts = [(x, bowl(x)) for x in xs]
  for lr in (1.2e-3, 2.5e-3, 3.9e-3):  # between the best point's neighbours: the parabola, exact
    assert backtest.profile_cost(pts, math.log(lr)) == pytest.approx(
      0.3 * math.log(lr / 2.5e-3) ** 2, abs=1e-12
    )
  # beyond the neighbours: straight between the tried points, above the parabola's minimum
  at = math.log(6e-3)
  w = (at - xs[2]) / (xs[3] - xs[2])
  want = bowl(xs[2]) + w * (bowl(xs[3]) - bowl(xs[2])) - 5.0
  assert backtest.profile_cost(pts, at) == pytest.approx(want, abs=1e-12)
  assert backtest.profile_cost(pts, math.log(5e-4)) is None  # outside the grid
  pts[4] = (xs[4], math.inf)  # a diverged point: no reading across it
  assert backtest.profile_cost(pts, math.log(12e-3)) is None


def test_grid_laws_backtest_against_the_planted_bowl(tmp_path):
  members_lib.make_grid(str(tmp_path))  # optima jittered off the laws, an exact bowl around them
  prov = {"model_filter": "bert", "excluded": [], "optimum": "vertex", "metric": "val_full"}
  hb = backtest.hparam_backtest(str(tmp_path), prov)
  assert hb["sizes"] == ["d32L2", "d64L2", "d96L3", "d128L3"]
  lr = hb["laws"]["lr"]
  assert lr["slope"] == pytest.approx(members_lib.LR_ALPHA, abs=0.05)
  assert "no replicates" in lr["lack_of_fit"]["reason"] and not lr["is_law"]
  by_size = {  # BERT's sizes: (N, the optimum's jitter off the laws)
    size: (n, jit)
    for (model, size, n), jit in zip(members_lib.SIZES, members_lib.JITTER)
    if model == "bert"
  }
  for row in lr["loo"]:
    n, jitter = by_size[row["size"]]
    lr_true, _ = members_lib.true_optimum(120.0 * n * n, jitter)
    assert row["measured"] == pytest.approx(lr_true, rel=1e-6)  # the bowl's vertex, exactly
    assert row["interval"] is not None  # 3 training sizes: 1 residual degree of freedom
    # the loss cost is the bowl's 0.3 (ln lr - ln lr*)^2 wherever the parabola reads it
    if row["cost_law"] is not None and abs(math.log(row["ratio"])) < math.log(2):
      assert row["cost_law"] == pytest.approx(0.3 * math.log(row["ratio"]) ** 2, abs=1e-9)
    others = [s for s in hb["sizes"] if s != row["size"]]
    assert row["constant"] == pytest.approx(
      math.exp(np.mean([math.log(_located(hb, "lr", s)) for s in others])), rel=1e-9
    )
  # the planted LR moves with compute (C^-0.15): the law costs less than the best constant
  both = [r for r in lr["loo"] if r["cost_law"] is not None and r["cost_constant"] is not None]
  assert len(both) == 4
  assert sum(r["cost_law"] for r in both) < 0.1 * sum(r["cost_constant"] for r in both)
  batch = hb["laws"]["batch_tokens"]
  for row in batch["loo"]:  # the rows' best losses: 0.2 (ln B - ln B*)^2 plus a constant
    if row["cost_law"] is not None and abs(math.log(row["ratio"])) < math.log(2):
      assert row["cost_law"] == pytest.approx(0.2 * math.log(row["ratio"]) ** 2, abs=1e-9)
  lines = backtest_text.hparam_section({"backtest": hb})
  assert any(line.startswith("* lr* vs C: left out, each size's optimum") for line in lines)


def _located(hb, field, size):
  return next(r["measured"] for r in hb["laws"][field]["loo"] if r["size"] == size)


def test_a_grid_that_does_not_reproduce_the_laws_file_is_named():
  from cbert_jax.report import hparam_laws  # pylint: disable=import-outside-toplevel

  hb = {"laws": {"lr": {"slope": -0.15, "loo": []}, "batch_tokens": {"slope": 0.4, "loo": []}}}
  laws = {"lr": {"alpha": -0.15 + 1e-9}, "batch_tokens": {"alpha": 0.5}}
  assert hparam_laws._mismatch(hb, laws) == [
    "batch_tokens: +0.4000 from the grid, +0.5000 in the file"
  ]
  lines = backtest_text.hparam_section(
    {"backtest": hb | {"mismatch": ["x"], "grid": "g", "sizes": []}}
  )
  assert lines[0].startswith("The grid given does not reproduce this laws file (x)")
