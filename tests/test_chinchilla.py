"""The Chinchilla-style surface: a known surface is recovered from noisy synthetic runs, the
allocation matches a brute-force search, and a floor at the optimiser's bound is refused."""

import itertools

import numpy as np
import pytest

from cbert_jax.scaling import chinchilla

TRUE = chinchilla.LossSurface(E=1.7, A=400.0, alpha=0.34, B=410.0, beta=0.28)
# Every 8th point of the default start grid (16 of 128): the tests stay fast; the full grid is what
# `fit` uses by default.
STARTS = list(itertools.product(*chinchilla.START_GRID.values()))[::8]


def synthetic(law, noise=0.0, seed=0):
  rng = np.random.default_rng(seed)
  n = np.repeat([1e6, 3e6, 1e7, 3e7, 1e8], 3)
  d = n * np.tile([5.0, 20.0, 80.0], 5)  # 5, 20, 80 tokens per parameter
  loss = law(n, d) * np.exp(rng.normal(0.0, noise, n.shape))
  return n, d, loss


def test_a_known_surface_is_recovered():
  n, d, loss = synthetic(TRUE)
  got = chinchilla.fit(n, d, loss, starts=STARTS)
  assert got.usable, got.problems
  for name in ("E", "alpha", "beta"):
    assert getattr(got.law, name) == pytest.approx(getattr(TRUE, name), rel=0.02)
  np.testing.assert_allclose(got.law(n, d), loss, rtol=1e-4)


def test_noisy_runs_give_intervals_that_cover_the_truth():
  n, d, loss = synthetic(TRUE, noise=0.005, seed=1)
  got = chinchilla.fit(n, d, loss, n_boot=10, seed=0, starts=STARTS)
  assert got.usable, got.problems
  for name in ("alpha", "beta"):
    lo, hi = got.intervals[name]
    assert lo < getattr(got.law, name) < hi
    assert lo - 0.05 < getattr(TRUE, name) < hi + 0.05  # close to, usually inside, the interval


def test_optimal_allocation_equals_a_brute_force_search():
  k, compute = 6.0, 1e20
  n_opt, d_opt = TRUE.optimal(compute, k)
  assert k * n_opt * d_opt == pytest.approx(compute)
  grid = np.logspace(6, 12, 200001)
  best = grid[np.argmin(TRUE(grid, compute / (k * grid)))]
  assert n_opt == pytest.approx(best, rel=1e-3)


def test_a_floor_at_the_bound_or_above_the_data_is_refused():
  at_bound = chinchilla.LossSurface(E=float(np.exp(-10.0)), A=400.0, alpha=0.34, B=410.0, beta=0.28)
  assert any("lower bound" in p for p in chinchilla.problems(at_bound, np.array([2.0, 3.0])))
  law = chinchilla.LossSurface(E=5.0, A=1.0, alpha=0.3, B=1.0, beta=0.3)
  assert any("not below the smallest" in p for p in chinchilla.problems(law, np.array([4.0, 6.0])))
  steep = chinchilla.LossSurface(E=1.0, A=1.0, alpha=2.5, B=1.0, beta=0.3)
  assert any("alpha" in p for p in chinchilla.problems(steep, np.array([4.0])))
  assert chinchilla.problems(TRUE, np.array([2.0, 3.0])) == []


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match="at least 5 runs"):
    chinchilla.fit([1, 2], [1, 2], [3, 3])
  with pytest.raises(ValueError, match="2 distinct values"):
    chinchilla.fit([1e6] * 6, [1e7, 2e7, 3e7, 4e7, 5e7, 6e7], [3.0] * 6)


def test_k_is_the_median_flops_per_parameter_token():
  n, d = np.array([1e6, 2e6, 4e6]), np.array([2e7, 4e7, 8e7])
  assert chinchilla.flops_per_param_token(6.5 * n * d, n, d) == pytest.approx(6.5)
