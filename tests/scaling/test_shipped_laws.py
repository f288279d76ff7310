"""Laws shipped in the package (`shipped:<name>`): loading them by name, "{model}" per family, and
that the shipped cpu laws are the fit of the archived cpu grid in results/grid_cpu."""

import os

import pytest

from cbert_jax import config_lib
from cbert_jax.report import grid as grid_lib
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.sweep import experiment
from tests.members import SIZES, make_grid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _assert_same_laws(got_laws, want_laws) -> None:
  """Every constant and interval of the four laws equal up to float rounding (another CPU's
  libm/BLAS moves the last bits, 1e-15 relative)."""
  for law in ("lr", "batch_tokens", "lr_n", "batch_tokens_n"):
    got, want = getattr(got_laws, law).to_dict(), getattr(want_laws, law).to_dict()
    assert got.keys() == want.keys(), law
    for field, value in want.items():
      if isinstance(value, float) or (isinstance(value, (list, tuple)) and value):
        assert got[field] == pytest.approx(value, rel=1e-9), (law, field)
      else:
        assert got[field] == value, (law, field)


def test_shipped_laws_load_by_name_and_unknown_names_are_listed(tmp_path, monkeypatch):
  root = str(tmp_path / "grid")
  make_grid(root, SIZES[:3])
  fitted = tmp_path / "fitted"
  grid_lib.fit_grid(root, str(fitted / "cpu-bert.json"), model="bert", n_boot=0, plot=False)
  monkeypatch.setattr(laws_lib, "SHIPPED_DIR", str(fitted))
  assert laws_lib.shipped_names() == ["cpu-bert"]
  shipped = laws_lib.load("shipped:cpu-bert")
  assert shipped == laws_lib.load(str(fitted / "cpu-bert.json"))
  assert shipped.provenance["model_filter"] == "bert"
  with pytest.raises(
    config_lib.ConfigError, match=r"no shipped laws named 'cpu-x'; shipped: cpu-bert"
  ):
    laws_lib.load("shipped:cpu-x")
  # "{model}": each member reads its own family's laws (here only BERT's are shipped).
  sweep = experiment.load_experiment(os.path.join(ROOT, "experiments", "sweep.py"))
  bert = sweep.get_config("model=bert,size=d64L2")
  bert.sweep.laws = "shipped:cpu-{model}"
  bert = config_lib.resolve(bert)
  by_file = sweep.get_config("model=bert,size=d64L2")
  by_file.sweep.laws = str(fitted / "cpu-bert.json")
  by_file = config_lib.resolve(by_file)
  assert (bert.optim.lr, bert.batch_size) == (by_file.optim.lr, by_file.batch_size)
  assert bert.sweep.laws_source == shipped.source
  cross = sweep.get_config("model=crossbert,size=d64L2")
  cross.sweep.laws = "shipped:cpu-{model}"
  with pytest.raises(config_lib.ConfigError, match=r"no shipped laws named 'cpu-crossbert'"):
    config_lib.resolve(cross)


@pytest.mark.parametrize("model", ["bert", "crossbert"])
def test_the_shipped_cpu_laws_are_the_fit_of_the_archived_cpu_grid(model, tmp_path):
  # The shipped laws (the cpu and quick sweeps' default) were fitted on the live grid; fitting
  # its archive in the repo (results/grid_cpu: configs, metrics and full-split validation, no
  # checkpoints) must give the same optima and the same laws, intervals included.
  shipped = laws_lib.load(f"shipped:cpu-{model}")
  prov = shipped.provenance
  assert prov["excluded"] == [f"{model}:d32L2"] and shipped.overridden == ("implausible",)
  assert "fixed before the final fit" in prov["override_reason"]
  assert prov["optimum"] == "vertex" and prov["metric"] == "val_full"
  refit = grid_lib.fit_grid(
    os.path.join(ROOT, "results", "grid_cpu"),
    str(tmp_path / f"cpu-{model}.json"),
    model=model,
    n_boot=prov["n_bootstrap"],
    seed=prov["seed"],
    plot=False,
    allow=("implausible",),
    override_reason="test",
    exclude=[f"{model}:d32L2"],
  )
  assert not refit.skipped
  _assert_same_laws(refit.laws, shipped)
  assert refit.laws.provenance["runs"] == prov["runs"]
  # The grid trained at 5 tokens per parameter (added to the shipped provenance on 2026-12-07,
  # when the fit began recording it); the cpu sweep trains at 20, and its members are told.
  assert refit.laws.provenance["tokens_per_param"] == prov["tokens_per_param"] == 5.0
  assert "trained at 5 tokens per parameter and this member trains at 20" in (
    shipped.budget_mismatch(20.0)
  )


@pytest.mark.parametrize("model", ["bert", "crossbert"])
def test_the_shipped_refits_at_20_are_the_fits_of_the_archived_check_grid(model, tmp_path):
  # cpu20-{bert,crossbert} (the cpu sweep's laws since 2026-12-07) were fitted on the check at 20
  # tokens per parameter, results/lawcheck20_cpu, by the command in their provenance, with every
  # check passed (nothing overridden, nothing excluded): the archive must give them again.
  shipped = laws_lib.load(f"shipped:cpu20-{model}")
  prov = shipped.provenance
  assert prov["grid"] == "results/lawcheck20_cpu" and prov["tokens_per_param"] == 20.0
  assert prov["model_filter"] == model
  assert shipped.overridden == () and not prov["excluded"]
  assert all(c["passed"] for c in prov["checks"].values())
  assert prov["optimum"] == "vertex" and prov["metric"] == "val_full"
  assert shipped.budget_mismatch(20.0) == "" and shipped.budget_mismatch(5.0)
  refit = grid_lib.fit_grid(
    os.path.join(ROOT, "results", "lawcheck20_cpu"),
    str(tmp_path / f"cpu20-{model}.json"),
    model=model,
    n_boot=prov["n_bootstrap"],
    seed=prov["seed"],
    plot=False,
  )
  _assert_same_laws(refit.laws, shipped)
  assert [r["name"] for r in refit.laws.provenance["runs"]] == [r["name"] for r in prov["runs"]]
  # the sizes it was fitted on: each optimum interior, located between grid points
  assert [r["size"] for r in prov["runs"]] == ["d64L2", "d96L3", "d128L3"]
