"""Power-law fits recover known exponents from synthetic data; the exact bootstrap is the full
enumeration of resamples, the t-interval is linregress's and covers at its nominal rate; the
saturating floor is reported only when it is interior."""

import itertools

import numpy as np
import pytest

from cbert_jax.scaling import fit


def test_power_law_recovers_exact_and_noisy_exponents():
  c = np.logspace(15, 20, 6)
  exact = fit.fit_power_law(c, 3e3 * c**-0.31)
  assert exact.alpha == pytest.approx(-0.31, abs=1e-9) and exact.a == pytest.approx(3e3, rel=1e-6)
  rng = np.random.default_rng(0)
  noisy = fit.fit_power_law_ci(c, 0.02 * c**0.12 * np.exp(rng.normal(0, 0.05, c.size)), n=500)
  assert noisy.alpha == pytest.approx(0.12, abs=0.03)
  lo, hi = noisy.alpha_ci
  assert lo < noisy.alpha < hi and lo < 0.12 < hi and hi - lo < 0.1


def test_bootstrap_interval_widens_with_noise():
  c = np.logspace(15, 20, 8)
  rng = np.random.default_rng(1)
  widths = []
  for sigma in (0.01, 0.2):
    law = fit.fit_power_law_ci(c, c**0.2 * np.exp(rng.normal(0, sigma, c.size)), n=300)
    widths.append(law.alpha_ci[1] - law.alpha_ci[0])
  assert widths[0] < widths[1] / 5


def test_saturating_law_recovers_irreducible_loss_and_exponent():
  c = np.logspace(15, 21, 9)
  law = fit.fit_saturating(c, 1.8 + 4e3 * c**-0.2)
  assert law.e == pytest.approx(1.8, abs=0.02) and law.e == law.e_fit and law.e_note == ""
  assert law.beta == pytest.approx(0.2, abs=0.01)
  assert law(1e18) == pytest.approx(1.8 + 4e3 * 1e18**-0.2, rel=1e-3)


def test_saturating_floor_on_a_bound_is_not_identified():
  c = np.logspace(15, 21, 6)
  # A pure power law: the floor runs to the optimiser's lower bound 0.
  pure = fit.fit_saturating(c, 5 * c**-0.1)
  assert pure.e is None and pure.e_fit < 1e-3 and "lower bound 0" in pure.e_note
  assert pure.beta == pytest.approx(0.1, abs=0.01) and pure(1e18) == pytest.approx(
    5 * 1e18**-0.1, rel=1e-4
  )
  # The lowest loss in the middle, the last sizes above it: the floor runs to min(y).
  bumpy = fit.fit_saturating(c, [3.0, 2.5, 2.2, 2.0, 2.2, 2.2])
  assert bumpy.e is None and bumpy.e_fit == pytest.approx(2.0) and "upper bound" in bumpy.e_note
  assert bumpy.to_dict()["e"] is None and bumpy.to_dict()["e_note"] == bumpy.e_note


def _brute_force(x, y, level=0.9):
  """Every ordered resample of the points (n^n of them), refitted with np.polyfit; those with
  all x equal skipped: (exact percentiles of alpha and a, the number skipped)."""
  u, v = np.log(x), np.log(y)
  alphas, log_as, skipped = [], [], 0
  for idx in itertools.product(range(len(x)), repeat=len(x)):
    idx = list(idx)
    if np.ptp(u[idx]) == 0:
      skipped += 1
      continue
    alpha, log_a = np.polyfit(u[idx], v[idx], 1)
    alphas.append(alpha)
    log_as.append(log_a)
  q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
  return (
    np.percentile(alphas, q, method="inverted_cdf"),
    np.exp(np.percentile(log_as, q, method="inverted_cdf")),
    skipped,
  )


@pytest.mark.parametrize(
  "x,y,skipped",
  [
    ([1e15, 1e16, 1e17, 1e18], [3.1, 2.8, 2.65, 2.4], 4),
    # two points share an x: every resample drawn from them alone has no slope either
    ([1e15, 1e15, 3e16, 1e18], [3.1, 2.9, 2.6, 2.4], 2**4 + 2),
  ],
)
def test_exact_bootstrap_equals_brute_force_enumeration(x, y, skipped):
  law = fit.fit_power_law_ci(x, y, n=7, seed=123)  # exact: n and seed are not used
  alpha_ci, a_ci, brute_skipped = _brute_force(np.array(x), np.array(y))
  assert brute_skipped == skipped
  assert law.bootstrap == {"method": "exact", "resamples": 4**4, "skipped": skipped}
  assert law.alpha_ci == pytest.approx(tuple(alpha_ci), rel=1e-9)
  assert law.a_ci == pytest.approx(tuple(a_ci), rel=1e-9)
  # The generic bootstrap (any fit, one call per distinct resample) is exact too.
  generic = fit.bootstrap(lambda xs, ys: {"alpha": fit.fit_power_law(xs, ys).alpha}, x, y)
  assert generic["alpha"] == pytest.approx(tuple(alpha_ci), rel=1e-9)


def test_exact_up_to_the_limit_then_draws():
  r = fit.resamples(5)
  assert r.exact and len(r.counts) == fit.n_distinct_resamples(5) == 126 and r.total == 5**5
  assert (r.counts.sum(axis=1) == 5).all() and r.weights.sum() == pytest.approx(1.0)
  assert r.multiplicity.sum() == 5**5
  assert fit.resamples(10).exact and not fit.resamples(11).exact  # C(21, 11) = 352,716 > 1e5
  c = np.logspace(15, 20, 12)
  rng = np.random.default_rng(3)
  y = 0.02 * c**0.1 * np.exp(rng.normal(0, 0.05, c.size))
  law = fit.fit_power_law_ci(c, y, n=2000)
  assert law.bootstrap == {"method": "draws", "resamples": 2000, "skipped": 0}
  # Draws approximate the exact distribution (forced here on 6 points with a small limit).
  exact = fit.fit_power_law_ci(c[::2], y[::2])
  drawn = fit.fit_power_law_ci(c[::2], y[::2], n=10_000, exact_limit=10)
  assert exact.bootstrap["method"] == "exact" and drawn.bootstrap["method"] == "draws"
  assert drawn.alpha_ci == pytest.approx(exact.alpha_ci, abs=0.01)
  none = fit.fit_power_law_ci(c, y, n=0)  # no bootstrap; the t-interval stays
  assert none.alpha_ci is None and none.bootstrap is None and none.alpha_t_ci is not None


def test_t_interval_is_linregress_stderr_interval_and_covers_at_its_level():
  from scipy import stats

  rng = np.random.default_rng(7)
  c = np.logspace(15, 20, 6)
  y = 0.3 * c**-0.125 * np.exp(rng.normal(0, 0.1, c.size))
  law = fit.fit_power_law_ci(c, y, n=0, level=0.9)
  ref = stats.linregress(np.log(c), np.log(y))
  t = stats.t.ppf(0.95, c.size - 2)
  assert law.alpha_t_ci == pytest.approx((ref.slope - t * ref.stderr, ref.slope + t * ref.stderr))
  lo, hi = ref.intercept - t * ref.intercept_stderr, ref.intercept + t * ref.intercept_stderr
  assert law.a_t_ci == pytest.approx((np.exp(lo), np.exp(hi)))
  assert fit.fit_power_law_ci(c[:2], y[:2]).alpha_t_ci is None  # no residual degree of freedom
  # Coverage: 2000 synthetic data sets with a known slope, Gaussian noise in log space.
  u = np.log(np.logspace(15, 20, 5))
  hits = 0
  for _ in range(2000):
    lo, hi = fit.t_interval(u, 1.0 - 0.2 * u + rng.normal(0, 0.3, u.size), level=0.9)["slope"]
    hits += lo <= -0.2 <= hi
  assert abs(hits / 2000 - 0.9) <= 0.03, hits / 2000


@pytest.mark.parametrize(
  "x,y,match",
  [
    ([1, 2], [1], "differ in length"),
    ([1], [1], "at least 2 points"),
    ([1, -2], [1, 2], "positive"),
  ],
)
def test_bad_fit_input_is_named(x, y, match):
  with pytest.raises(ValueError, match=match):
    fit.fit_power_law(x, y)


def test_budget_arithmetic():
  from cbert_jax.errors import ConfigError
  from cbert_jax.models.flops import ParamCounts
  from cbert_jax.scaling import budget

  counts = ParamCounts(embedding=1000, encoder=50_000, head=1000, pred_q=3000, pred_kv=1000)
  b = budget.make_budget(counts, "non_embedding", 20, batch_size=8, seq_len=64)
  assert b.n_params == 54_000 and b.target_tokens == 1_080_000 and b.tokens_per_step == 512
  assert b.steps == 2110 and b.tokens == 2110 * 512 >= b.target_tokens > (b.steps - 1) * 512
  assert budget.make_budget(counts, "total", 20, 8, 64).n_params == 56_000
  assert budget.make_budget(counts, "encoder", 1, 1000, 50).steps == 1
  with pytest.raises(ConfigError, match="sweep.n_definition must be one of"):
    budget.make_budget(counts, "all", 20, 8, 64)
  with pytest.raises(ConfigError, match="sweep.tokens_per_param must be positive"):
    budget.make_budget(counts, "total", 0, 8, 64)


def test_default_laws_and_round_trip(tmp_path):
  from cbert_jax.errors import ConfigError
  from cbert_jax.scaling import laws

  lr, rows = laws.suggest(laws.DEFAULT, 1e21, seq_len=512, multiple=8)
  assert lr == pytest.approx(0.3118 * 1e21**-0.125) and rows % 8 == 0
  assert abs(rows * 512 - 0.2920 * 1e21**0.3271) <= 4 * 512
  assert laws.suggest(laws.DEFAULT, 1e6, seq_len=512, multiple=4)[1] == 4  # at least one multiple
  fitted = laws.HyperLaws(
    lr=fit.fit_power_law_ci([1e15, 1e16, 1e17], [4e-3, 3e-3, 2.2e-3], n=50),
    batch_tokens=fit.fit_power_law([1e15, 1e16, 1e17], [2e4, 4e4, 8e4]),
    source="fit",
    provenance={"runs": ["a", "b", "c"]},
  )
  laws.save(str(tmp_path / "laws.json"), fitted)
  assert laws.load(str(tmp_path / "laws.json")) == fitted
  assert fitted.lr.bootstrap == {"method": "exact", "resamples": 27, "skipped": 3}
  assert fitted.lr.alpha_t_ci is not None and fitted.overridden == ()
  assert laws.load("") is laws.DEFAULT
  with pytest.raises(ConfigError, match="sweep.laws: no such file"):
    laws.load(str(tmp_path / "nope.json"))


def test_report_states_both_intervals_and_an_unidentified_floor_in_words():
  from cbert_jax.report import sweep_report
  from cbert_jax.report.fits import trend

  c = np.logspace(15, 21, 6)
  loss = 5 * c**-0.1 * np.exp(np.random.default_rng(2).normal(0, 0.01, c.size))
  power = fit.fit_power_law_ci(c, loss)
  fits = {
    "bert": {
      "n_points": 6,
      "power_law": power.to_dict(),
      "saturating": fit.fit_saturating(c, 5 * c**-0.1).to_dict(),
    }
  }
  flat = trend(c, np.full(c.size, 0.5))  # a constant score: zero-width intervals, not NaN
  assert flat["slope_ci"] == (0.0, 0.0) and flat["slope_t_ci"] == (0.0, 0.0)
  probes = {"bert": {"ridge": trend(c, 0.6 - 0.02 * np.log10(c)), "knn": flat}}
  assert probes["bert"]["ridge"]["bootstrap"] == {
    "method": "exact",
    "resamples": 6**6,
    "skipped": 6,
  }
  text = sweep_report.markdown("root", [], fits, probes, {}, None, [])
  assert "| e + b C^-beta, e not identified (e at the optimiser's lower bound 0" in text
  lo, hi = power.alpha_t_ci
  assert f"(exact, 6/46656 skipped) | [{lo:.4f}, {hi:.4f}] | 6 |" in text
  assert f"t [{lo:.3f}, {hi:.3f}]; over 6 sizes" in text


def test_two_points_give_no_bootstrap_interval_three_do():
  # With 2 points every resample that has a slope is the line through both: a zero-width
  # "interval", so none is given. 3 points, even at 2 distinct x, vary between resamples.
  law = fit.fit_power_law_ci([1e12, 1e13], [5.0, 4.0])
  assert law.alpha_ci is None and law.a_ci is None and law.alpha_t_ci is None
  assert law.alpha == pytest.approx(fit.fit_power_law([1e12, 1e13], [5.0, 4.0]).alpha)
  for x, y in (([1e12, 1e13, 1e14], [5.0, 4.1, 3.5]), ([1e12, 1e12, 1e13], [5.0, 5.2, 4.0])):
    law = fit.fit_power_law_ci(x, y)
    assert law.alpha_ci is not None and law.alpha_ci[0] < law.alpha_ci[1], x
