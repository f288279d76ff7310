"""Laws fitted at two budgets compared (cbert_jax.report.laws_compare): the same-size ratios are
the located optima's, each law's factor at the other's sizes is its value there over the optimum
located there (computed here by hand from the constants), and a file without located optima, or
a single file, is one clear error."""

import math

import pytest

from cbert_jax.report import laws_compare
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.scaling.fit import PowerLaw

SIZES = {"d64L2": (2e5, 1e13), "d96L3": (4.4e5, 5e13), "d128L3": (1.05e6, 2e14)}


def _write(path, tpp, lr_a, lr_alpha, b_a, b_alpha, located, runs=True):
  """A laws file whose C laws are the given constants (N laws: the same constants) and whose
  provenance holds the located optimum {size: (lr*, B*)} of each size."""
  rows = [
    {
      "model": "crossbert",
      "size": size,
      "compute": SIZES[size][1] * tpp / 20,
      "n_params": SIZES[size][0],
      "lr_located": located[size][0],
      "batch_tokens_located": located[size][1],
    }
    for size in located
  ]
  laws = laws_lib.HyperLaws(
    lr=PowerLaw(lr_a, lr_alpha, 3),
    batch_tokens=PowerLaw(b_a, b_alpha, 3),
    lr_n=PowerLaw(lr_a, lr_alpha, 3),
    batch_tokens_n=PowerLaw(b_a, b_alpha, 3),
    source=f"test at {tpp}",
    provenance={"tokens_per_param": tpp, **({"runs": rows} if runs else {})},
  )
  laws_lib.save(str(path), laws)
  return str(path)


def test_ratios_and_cross_factors_are_the_located_optima_and_the_laws_values(tmp_path, capsys):
  at5 = {"d64L2": (2.7e-3, 360.0), "d96L3": (3.0e-3, 1150.0), "d128L3": (2.3e-3, 2140.0)}
  at20 = {"d64L2": (3.9e-3, 1540.0), "d96L3": (2.75e-3, 2250.0), "d128L3": (2.26e-3, 4380.0)}
  a = _write(tmp_path / "a.json", 5.0, 0.0156, -0.059, 9e-6, 0.614, at5)
  b = _write(tmp_path / "b.json", 20.0, 1.235, -0.192, 0.0285, 0.361, at20)
  result = laws_compare.compare(laws_compare.load_all([a, b]))
  assert [r["size"] for r in result["same_n"]] == [
    "crossbert d64L2",
    "crossbert d96L3",
    "crossbert d128L3",
  ]
  for r in result["same_n"]:
    size = r["size"].split()[1]
    assert r["lr_ratio"] == pytest.approx(at20[size][0] / at5[size][0])
    assert r["batch_tokens_ratio"] == pytest.approx(at20[size][1] / at5[size][1])
  # law a (fitted at 5) at b's d64L2 (C = 1e13, N = 2e5): its value over b's located optimum
  row = next(r for r in result["cross"] if r["law"] == a and r["size"] == "crossbert d64L2")
  assert row["lr_compute_factor"] == pytest.approx(0.0156 * 1e13**-0.059 / 3.9e-3)
  assert row["batch_tokens_compute_factor"] == pytest.approx(9e-6 * 1e13**0.614 / 1540.0)
  assert row["batch_tokens_n_params_factor"] == pytest.approx(9e-6 * 2e5**0.614 / 1540.0)
  row = next(r for r in result["cross"] if r["law"] == b and r["size"] == "crossbert d128L3")
  c5 = 2e14 * 5 / 20  # a's grid trained d128L3 at a quarter of the tokens
  assert row["batch_tokens_compute_factor"] == pytest.approx(0.0285 * c5**0.361 / 2140.0)
  assert len(result["cross"]) == 6 and all(
    math.isfinite(v) for r in result["cross"] for v in r.values() if isinstance(v, float)
  )
  out = tmp_path / "cmp" / "crossbert"
  assert laws_compare.main(["--laws", a, b, "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert f"* `{a}`: grid at 5 tokens per parameter" in text
  assert "| crossbert d64L2 | 2e+05 | " in text and "| 1.44x | 360 | 1540 | 4.28x |" in text
  assert (tmp_path / "cmp" / "crossbert.md").read_text() == text
  assert (tmp_path / "cmp" / "crossbert.png").stat().st_size > 10_000


def test_a_file_without_located_optima_or_a_single_file_is_refused(tmp_path, capsys):
  a = _write(tmp_path / "a.json", 5.0, 0.01, -0.1, 1e-5, 0.6, {"d64L2": (3e-3, 400.0)})
  bare = _write(tmp_path / "bare.json", 20.0, 0.01, -0.1, 1e-5, 0.6, {}, runs=False)
  assert laws_compare.main(["--laws", a, bare, "--out", str(tmp_path / "x")]) == 2
  err = capsys.readouterr().err
  assert (
    err.strip()
    == f"laws_compare error: --laws {bare!r}: no located optima in its provenance (not a grid fit)"
  )
  assert laws_compare.main(["--laws", a, "--out", str(tmp_path / "x")]) == 2
  assert "give two or more laws files to compare, got 1" in capsys.readouterr().err
  assert not (tmp_path / "x.md").exists()
