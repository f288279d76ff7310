"""Power-law fits recover known exponents from synthetic data."""

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
  assert law.e == pytest.approx(1.8, abs=0.02)
  assert law.beta == pytest.approx(0.2, abs=0.01)
  assert law(1e18) == pytest.approx(1.8 + 4e3 * 1e18**-0.2, rel=1e-3)


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
  assert laws.load("") is laws.DEFAULT
  with pytest.raises(ConfigError, match="sweep.laws: no such file"):
    laws.load(str(tmp_path / "nope.json"))
