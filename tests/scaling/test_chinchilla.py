"""The Chinchilla-style surface: a known surface is recovered from noisy synthetic runs, the
allocation matches a brute-force search, a floor at (or within a hair of) the optimiser's bound is
refused, and so is an allocation outside the runs' D/N."""

import dataclasses
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


def test_a_floor_within_a_hair_of_zero_is_no_floor():
  """E above the optimiser's bound but under 1% of the data is refused like E at the bound;
  at 1% it is a floor."""
  loss = np.array([3.5, 5.0])
  tiny = chinchilla.LossSurface(E=1.9e-4, A=400.0, alpha=0.34, B=410.0, beta=0.28)
  got = chinchilla.problems(tiny, loss)
  assert len(got) == 1 and "under 1% of the smallest observed loss 3.5" in got[0]
  assert "no floor identified" in got[0]
  edge = dataclasses.replace(tiny, E=chinchilla.FLOOR_MIN_FRACTION * 3.5)
  assert chinchilla.problems(edge, loss) == []


def test_an_allocation_outside_the_runs_d_per_n_is_refused():
  """D/N_opt at C, from the closed form, inside [lo / 2, hi x 2] of the runs' D/N passes; a
  compute whose optimum lies past that margin is named with the factor."""
  k = 6.0
  n_opt, d_opt = TRUE.optimal(1e20, k)
  dn = d_opt / n_opt
  assert chinchilla.allocation_problems(TRUE, 1e20, k, (dn / 2.5, dn * 1.5)) == []
  assert chinchilla.allocation_problems(TRUE, 1e20, k, (dn * 2.0, dn * 4.0)) == []  # at lo / 2
  got = chinchilla.allocation_problems(TRUE, 1e20, k, (dn / 40.0, dn / 10.0))
  assert len(got) == 1 and f"is {dn:.3g}, 10x outside the D/N" in got[0]
  got = chinchilla.allocation_problems(TRUE, 1e20, k, (dn * 5.0, dn * 20.0))
  assert len(got) == 1 and "5x outside" in got[0]


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match="at least 5 runs"):
    chinchilla.fit([1, 2], [1, 2], [3, 3])
  with pytest.raises(ValueError, match="2 distinct values"):
    chinchilla.fit([1e6] * 6, [1e7, 2e7, 3e7, 4e7, 5e7, 6e7], [3.0] * 6)


def test_k_is_the_median_flops_per_parameter_token():
  n, d = np.array([1e6, 2e6, 4e6]), np.array([2e7, 4e7, 8e7])
  assert chinchilla.flops_per_param_token(6.5 * n * d, n, d) == pytest.approx(6.5)


def test_the_bootstrap_draws_are_kept_and_give_the_intervals():
  n, d, loss = synthetic(TRUE, noise=0.005, seed=2)
  # One start near the truth (each resample refits from the estimate and it): fast.
  start = [[np.log(400.0), np.log(410.0), np.log(1.7), 0.34, 0.28]]
  got = chinchilla.fit(n, d, loss, n_boot=6, seed=0, level=0.8, starts=start)
  assert got.draws is not None and got.draws.shape == (6 - got.boot_failed, 5)
  assert got.level == 0.8
  # The parameter intervals are the draws' percentiles (A, B, E stored as logs).
  lo, hi = np.percentile(np.exp(got.draws[:, 0]), [10, 90])
  assert got.intervals["A"] == pytest.approx((lo, hi))
  lo, hi = np.percentile(got.draws[:, 4], [10, 90])
  assert got.intervals["beta"] == pytest.approx((lo, hi))
  # The loss interval at (N, D): percentiles of L(N, D) over the draws, each law built here.
  laws = [
    chinchilla.LossSurface(E=np.exp(e), A=np.exp(a), alpha=al, B=np.exp(b), beta=be)
    for a, b, e, al, be in got.draws
  ]
  assert [law.alpha for law in got.draw_laws()] == pytest.approx([law.alpha for law in laws])
  want = np.percentile([law(3e7, 6e8) for law in laws], [10, 90])
  assert [float(v) for v in got.loss_interval(3e7, 6e8)] == pytest.approx(list(want))
  want95 = np.percentile([law(3e7, 6e8) for law in laws], [2.5, 97.5])
  assert [float(v) for v in got.loss_interval(3e7, 6e8, level=0.95)] == pytest.approx(list(want95))
  # Vectorised over points: one interval per (N, D).
  lo_v, hi_v = got.loss_interval(np.array([1e7, 3e7]), np.array([2e8, 6e8]))
  assert lo_v.shape == hi_v.shape == (2,) and float(hi_v[1]) == pytest.approx(want[1])
  without = chinchilla.fit(n, d, loss, starts=start)
  assert without.draws is None and without.level == 0.0
  with pytest.raises(ValueError, match="no bootstrap draws"):
    without.loss_interval(3e7, 6e8)


def test_a_surface_file_round_trips_and_an_unusable_one_is_refused(tmp_path):
  draws = np.array([[6.0, 6.0, 0.5, 0.34, 0.28], [6.1, 5.9, 0.52, 0.33, 0.29]])
  fit = chinchilla.Fit(
    law=TRUE,
    objective=1e-6,
    points=15,
    problems=[],
    intervals={"alpha": (0.33, 0.34)},
    boot_failed=1,
    draws=draws,
    level=0.9,
  )
  path = str(tmp_path / "surface.json")
  chinchilla.save(path, fit, 6.3, {"n_definition": "non_embedding", "runs": ["a", "b"]})
  got = chinchilla.load(path)
  assert got.fit.law == TRUE and got.k == 6.3 and got.path == path
  assert got.fit.level == 0.9 and got.fit.boot_failed == 1 and got.fit.points == 15
  assert got.fit.intervals == {"alpha": (0.33, 0.34)}
  np.testing.assert_array_equal(got.fit.draws, draws)
  assert got.provenance == {"n_definition": "non_embedding", "runs": ["a", "b"]}
  assert got.fit.usable

  bad = dataclasses.replace(fit, problems=["E = 5 is not below the smallest observed loss 4"])
  chinchilla.save(path, bad, 6.3)
  with pytest.raises(ValueError) as e:
    chinchilla.load(path)
  assert str(e.value).startswith(path) and "not below the smallest" in str(e.value)
  assert len(str(e.value).splitlines()) == 1
  assert chinchilla.load(path, allow_unusable=True).fit.problems == bad.problems

  (tmp_path / "garbage.json").write_text('{"law": 3}')
  with pytest.raises(ValueError, match="garbage.json: not a loss-surface file"):
    chinchilla.load(str(tmp_path / "garbage.json"))
  with pytest.raises(ValueError, match="missing.json: no such surface file"):
    chinchilla.load(str(tmp_path / "missing.json"))
  with pytest.raises(ValueError, match="k .* must be positive"):
    chinchilla.save(path, fit, 0.0)


# ------------------------------------------------------------------------------- speed ---
def test_logsumexp_rows_is_scipys_logsumexp_bit_for_bit():
  from scipy import special  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(0)
  for trial in range(2000):
    terms = rng.normal(0.0, [0.1, 1.0, 10.0, 300.0][trial % 4], (3, int(rng.integers(1, 20))))
    if trial % 3 == 0:  # ties for the largest term (counted, not summed)
      terms[1] = terms[0]
    if trial % 5 == 0:  # one term far below the others
      terms[2] -= 800.0
    np.testing.assert_array_equal(
      chinchilla.logsumexp_rows(terms), special.logsumexp(terms, axis=0)
    )


def test_the_fit_reports_its_bootstrap_progress_and_runs_on_one_blas_thread():
  import threadpoolctl  # pylint: disable=import-outside-toplevel

  n, d, loss = synthetic(TRUE, noise=0.005, seed=1)
  seen, threads = [], []

  def progress(done, total):
    seen.append((done, total))
    threads.append(
      {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}
    )

  chinchilla.fit(n, d, loss, n_boot=4, seed=0, starts=STARTS[:2], progress=progress)
  assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
  assert all(t <= {1} for t in threads)  # every BLAS library limited to 1 thread inside the fit
