"""The hyperparameter-law grid: `cbert_jax.report.grid fit` recovers known exponents from a
synthetic grid (tests/members.py's make_grid: losses from a bowl whose optimum follows lr* = a C^alpha, B* = b C^beta), writes a
laws file the sweep reads, skips unfinished members; it refuses (exit 2, nothing written) a fit on
fewer than 3 sizes, with an optimum on a grid's edge or with an implausible exponent, unless the
check's flag (with a reason) overrides it, and then records the override (and the sweep warns).
experiments/hparam_grid.py's members: tests/sweep/test_hparam_grid_experiment.py; the shipped laws:
tests/scaling/test_shipped_laws.py."""

import json
import math
import os
import shutil

import numpy as np
import pytest

from cbert_jax import config_lib
from cbert_jax.report import grid as grid_lib
from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.sweep import experiment
from tests.members import (
  B_BETA,
  JITTER,
  LR_ALPHA,
  SEQ_LEN,
  SIZES,
  append_rows,
  grid_member,
  make_grid,
  true_optimum,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "experiments", "sweep.py")


def test_fit_recovers_exponents_writes_laws_and_plot_the_sweep_reads(tmp_path, capsys):
  root = str(tmp_path / "grid")
  best = make_grid(root)
  assert grid_lib.main(["fit", "--grid", root, "--bootstrap", "100"]) == 0
  out = capsys.readouterr()
  assert "lr* =" in out.out and "B* (tokens) =" in out.out and "d128L3" in out.out
  # 7 sizes: the exact bootstrap (7^7 ordered resamples, the 7 constant ones skipped) and t.
  assert "exact bootstrap over 823543 resamples, 7 skipped" in out.out and "; t [" in out.out
  assert "overridden" not in out.out + out.err
  laws = laws_lib.load(os.path.join(root, "laws.json"))
  assert laws.overridden == () and laws.provenance["exponent_bounds"]["lr"] == [-0.5, 0.0]
  assert all(not c["overridden"] and c["passed"] for c in laws.provenance["checks"].values())
  # The exact least-squares fit of the located optima (parabolic vertices around the best grid
  # points): the bowl is quadratic in log lr and log B, so they are its true optima and the fit
  # recovers the true exponents (up to the grid's rounding of B to whole rows).
  prov_runs = {(r["model"], r["size"]): r for r in laws.provenance["runs"]}
  assert {k: prov_runs[k]["name"] for k in best} == {k: b[0] for k, b in best.items()}
  c = np.array([b[1] for b in best.values()])
  n = np.array([b[2] for b in best.values()])
  lr = np.array([prov_runs[k]["lr_located"] for k in best])
  bt = np.array([prov_runs[k]["batch_tokens_located"] for k in best], np.float64)
  truth = np.array([true_optimum(cc, jit) for cc, jit in zip(c, JITTER)])
  np.testing.assert_allclose(lr, truth[:, 0], rtol=1e-9)
  np.testing.assert_allclose(bt, truth[:, 1], rtol=1e-9)
  assert laws.provenance["optimum"] == "vertex"
  for law, x, y in (
    (laws.lr, c, lr),
    (laws.batch_tokens, c, bt),
    (laws.lr_n, n, lr),
    (laws.batch_tokens_n, n, bt),
  ):
    alpha, log_a = np.polyfit(np.log(x), np.log(y), 1)
    assert law.alpha == pytest.approx(alpha, abs=1e-9) and law.a == pytest.approx(math.exp(log_a))
    assert law.n_points == len(SIZES)
    assert law.alpha_ci[0] <= law.alpha <= law.alpha_ci[1]
    assert law.alpha_t_ci[0] < law.alpha < law.alpha_t_ci[1] and law.ci_level == 0.9
    assert law.bootstrap == {"method": "exact", "resamples": 7**7, "skipped": 7}
  assert laws.lr.alpha == pytest.approx(LR_ALPHA, abs=0.03)
  assert laws.batch_tokens.alpha == pytest.approx(B_BETA, abs=0.03)
  assert laws.lr_n.alpha == pytest.approx(2 * LR_ALPHA, abs=0.06)  # C ∝ N^2 here
  # Provenance: which runs, which models, when; the source names the grid.
  prov = laws.provenance
  assert sorted(r["name"] for r in prov["runs"]) == sorted(b[0] for b in best.values())
  run = next(r for r in prov["runs"] if r["size"] == "d96L3" and r["model"] == "bert")
  assert run["batch_tokens"] == run["batch_size"] * SEQ_LEN and len(run["grid_members"]) == 25
  assert prov["models"] == ["bert", "crossbert"] and prov["skipped"] == [] and prov["created"]
  assert prov["grid"] == root and prov["grid_abs"] == os.path.abspath(root)
  assert "grid fit --grid" in prov["command"]
  assert laws.source.startswith(f"fit: {os.path.abspath(root)} (7 sizes), 20")
  for png in ("laws.png", "grid.png"):
    with open(os.path.join(root, png), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # One architecture alone; another output path (the plot goes next to it).
  out_file = str(tmp_path / "fits" / "bert.json")
  assert (
    grid_lib.main(["fit", "--grid", root, "--model", "bert", "--bootstrap", "0", "--out", out_file])
    == 0
  )
  bert = laws_lib.load(out_file)
  assert bert.lr.n_points == 4 and bert.lr.alpha_ci is None and bert.lr.bootstrap is None
  assert bert.lr.alpha_t_ci is not None
  assert {r["model"] for r in bert.provenance["runs"]} == {"bert"}
  # its plots are named after it, so a second fit in the folder keeps its own
  assert sorted(os.listdir(tmp_path / "fits")) == ["bert.json", "bert.png", "bert_grid.png"]
  cross_file = str(tmp_path / "fits" / "crossbert.json")
  assert (
    grid_lib.main(
      ["fit", "--grid", root, "--model", "crossbert", "--bootstrap", "0", "--out", cross_file]
    )
    == 0
  )
  assert {"bert.png", "crossbert.png", "crossbert_grid.png"} <= set(os.listdir(tmp_path / "fits"))
  # one family's fit names it in its source, which a member records: the two fits stay apart
  cross = laws_lib.load(cross_file)
  assert bert.source.startswith(f"fit: {root} (bert, 4 sizes), 20")
  assert cross.source.startswith(f"fit: {root} (crossbert, ") and cross.source != bert.source
  # experiments/sweep.py reads the file through sweep.laws: the member's LR and batch follow it.
  sweep = experiment.load_experiment(SWEEP)
  for axis in ("compute", "params"):
    m = sweep.get_config("model=bert,size=d64L2")
    m.sweep.laws, m.sweep.law_axis = os.path.join(root, "laws.json"), axis
    m = config_lib.resolve(m)
    assert m.sweep.laws_source == laws.source
    # The laws see the planned compute (target tokens); sweep.compute counts the rounded-up steps.
    planned = m.sweep.compute * m.sweep.target_tokens / m.sweep.tokens
    want_lr, want_rows = laws_lib.suggest(
      laws, planned if axis == "compute" else m.sweep.n_params, m.data.seq_len, law_axis=axis
    )
    assert m.optim.lr == pytest.approx(want_lr) and m.batch_size == want_rows


def test_vertex_is_the_parabola_minimum_and_argmin_keeps_the_grid_points(tmp_path, capsys):
  """grid_vertex.vertex is the minimum of the parabola through 3 unevenly spaced points (checked
  against numpy's quadratic fit); --optimum argmin fits the best grid points themselves (the
  least-squares line through them); a size whose best LR has a diverged or missing neighbour
  keeps the grid point on that axis and says why."""
  from cbert_jax.report import grid_vertex

  x = np.array([-1.3, 0.2, 0.9])
  y = 2.0 * (x - 0.41) ** 2 + 5.0
  a2, a1, _ = np.polyfit(x, y, 2)
  assert grid_vertex.vertex(x, y) == pytest.approx(-a1 / (2 * a2)) == pytest.approx(0.41)
  assert grid_vertex.vertex([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]) == 1.0  # flat: the grid point
  with pytest.raises(ValueError, match="middle point must be the lowest"):
    grid_vertex.vertex([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
  root = str(tmp_path / "grid")
  best = make_grid(root)
  out = str(tmp_path / "argmin.json")
  argv = ["fit", "--grid", root, "--bootstrap", "0", "--optimum", "argmin", "--out", out]
  assert grid_lib.main(argv) == 0
  laws = laws_lib.load(out)
  c = np.array([b[1] for b in best.values()])
  lr = np.array([b[4] for b in best.values()])
  alpha, log_a = np.polyfit(np.log(c), np.log(lr), 1)
  assert laws.lr.alpha == pytest.approx(alpha, abs=1e-9) and laws.lr.a == pytest.approx(
    math.exp(log_a)
  )
  assert laws.provenance["optimum"] == "argmin" and laws.source.endswith("; optima: argmin")
  assert abs(laws.lr.alpha - LR_ALPHA) > 1e-3  # the grid points miss the true optima a little
  capsys.readouterr()
  # A diverged LR neighbour of BERT d64L2's best: its lr stays the grid point, its B does not.
  name, compute, n, rows, lr_best = best[("bert", "d64L2")]
  higher = sorted(
    float(d.split("_lr")[1])
    for d in os.listdir(root)
    if d.startswith(f"bert_d64L2_b{rows}_lr") and float(d.split("_lr")[1]) > lr_best
  )[0]
  status_lib.mark_failed(
    os.path.join(root, f"bert_d64L2_b{rows}_lr{higher:.3g}"),
    "NonFiniteLossError: loss nan at step 50",
  )
  assert grid_lib.main(["fit", "--grid", root, "--bootstrap", "0"]) == 0
  table = capsys.readouterr().out
  assert "bert d64L2: lr* grid point (a neighbour diverged); B* vertex of the rows' best" in table
  run = next(
    r
    for r in laws_lib.load(os.path.join(root, "laws.json")).provenance["runs"]
    if r["name"] == name
  )
  assert (
    run["lr_located"] == lr_best and run["located"]["lr"] == "grid point (a neighbour diverged)"
  )
  want_b = true_optimum(compute, JITTER[[s[1] for s in SIZES].index("d64L2")])[1]
  assert run["batch_tokens_located"] == pytest.approx(want_b, rel=1e-9)
  # Its best row without the LRs below the best (other rows still tried them): the best is on
  # its row's lowest-LR edge, which the edge check names though the size's grid went lower.
  lower = [
    d
    for d in os.listdir(root)
    if d.startswith(f"bert_d64L2_b{rows}_lr") and float(d.split("_lr")[1]) < lr_best
  ]
  for d in lower:
    shutil.rmtree(os.path.join(root, d))
  removed_lrs = {d.split("_lr")[1] for d in lower}
  assert removed_lrs and any(  # another row has those LRs
    d.startswith("bert_d64L2_") and d.split("_lr")[1] in removed_lrs for d in os.listdir(root)
  )
  assert grid_lib.main(["fit", "--grid", root, "--bootstrap", "0"]) == 2
  err = capsys.readouterr().err
  assert f"bert d64L2 (B {rows} rows, lr {lr_best:.3g}: lowest lr)" in err, err


def test_unfinished_skipped_diverged_kept_and_edge_refused_unless_allowed(tmp_path, capsys, caplog):
  root = str(tmp_path / "grid")
  # Grids shifted 3 octaves below the optimum LR: the best is on the highest-LR edge.
  best = make_grid(root, SIZES[:3], lr_shift=-3.0)
  model, size, n = SIZES[0]
  compute = 120.0 * n * n
  # An unfinished member with a (partial) loss lower than anything: skipped, not chosen.
  grid_member(
    root, "bert_d32L2_b999_lr0.5", model, size, int(n), compute, 999, 0.5, -5.0, final_step=40
  )
  # A diverged member (NaN loss, FAILED by the runner): part of the grid, never the best.
  best_rows = best[("bert", "d32L2")][3]  # in the best's row, beyond its LR: it bounds the row
  wd = grid_member(
    root,
    f"bert_d32L2_b{best_rows}_lr9",
    model,
    size,
    int(n),
    compute,
    best_rows,
    9.0,
    -9.0,
    final_step=30,
    failed="NonFiniteError: loss is nan at step 30",
  )
  append_rows(wd, [{"step": 30, "train/loss": "nan"}])
  # A torn last line (a crash mid-write) is ignored.
  append_rows(os.path.join(root, best[("bert", "d64L2")][0]), [], torn='{"step": 100, "eval/lo')
  # Refused: one line naming the sizes on an edge and the flag; nothing written.
  assert grid_lib.main(["fit", "--grid", root, "--bootstrap", "50"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and root in err and "fit refused" in err, err
  assert "bert d64L2 (B " in err and "bert d96L3 (B " in err and "highest lr" in err
  assert "bert d32L2" not in err and "(override: --allow_edges)" in err
  assert not os.path.exists(os.path.join(root, "laws.json"))
  assert not os.path.exists(os.path.join(root, "laws.png"))
  # An override needs a reason, and a reason needs an override (argparse: exit 2, nothing written).
  with pytest.raises(SystemExit):
    grid_lib.main(["fit", "--grid", root, "--allow_edges"])
  assert "--allow_edges needs --override_reason" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    grid_lib.main(["fit", "--grid", root, "--override_reason", "why not"])
  assert "without an --allow_* flag" in capsys.readouterr().err
  assert not os.path.exists(os.path.join(root, "laws.json"))
  with pytest.raises(ValueError, match="needs a reason"):
    grid_lib.fit_grid(root, allow=("edges",), override_reason="  ")
  # Overridden: written, with the override and its reason recorded, and the sweep's load warns.
  argv = ["fit", "--grid", root, "--bootstrap", "50", "--allow_edges"]
  assert grid_lib.main([*argv, "--override_reason", "test: edges are fine here"]) == 0
  out = capsys.readouterr()
  err = out.err
  assert "1 unfinished member(s) skipped: bert_d32L2_b999_lr0.5 (step 40/100)" in err
  assert "bert d64L2: the best run" in err and "highest lr" in err and "may lie outside" in err
  assert "check edges overridden (--allow_edges)" in err and "checks overridden: edges" in out.out
  with open(os.path.join(root, "laws.json")) as f:
    assert json.load(f)["overridden"] == ["edges"]
  with caplog.at_level("WARNING"):
    laws = laws_lib.load(os.path.join(root, "laws.json"))
  assert "overridden (edges; reason: test: edges are fine here)" in caplog.text
  assert laws.overridden == ("edges",)
  assert laws.source.endswith("; checks overridden: edges (reason: test: edges are fine here)")
  assert laws.provenance["override_reason"] == "test: edges are fine here"
  checks = laws.provenance["checks"]
  assert checks["edges"]["overridden"] and "bert d64L2" in checks["edges"]["detail"]
  assert checks["few_sizes"] == {"passed": True, "detail": "", "overridden": False}
  prov = laws.provenance
  assert prov["skipped"] == [{"name": "bert_d32L2_b999_lr0.5", "reason": "step 40/100"}]
  assert prov["diverged"] == [f"bert_d32L2_b{best_rows}_lr9"]
  runs = {r["size"]: r for r in prov["runs"]}
  assert runs["d32L2"]["name"] == best[("bert", "d32L2")][0]
  assert "highest lr" in runs["d64L2"]["edge"] and "highest lr" in runs["d96L3"]["edge"]
  assert "highest lr" not in runs["d32L2"]["edge"]  # the diverged lr=9 run bounds that grid
  # With the optimum inside the grid, no edge warning, nothing overridden.
  inner = str(tmp_path / "inner")
  make_grid(inner, SIZES[:3])
  result = grid_lib.fit_grid(inner, n_boot=0, plot=False, allow=("edges",), override_reason="t")
  assert not any("edge" in w for w in result.warnings) and not result.skipped
  assert result.plot_path is None and os.path.exists(os.path.join(inner, "laws.json"))
  assert result.laws.overridden == () and "overridden" not in result.laws.source
  assert result.laws.provenance["override_reason"] == ""  # nothing was overridden


def test_a_size_best_at_one_row_is_refused_as_unwidenable_and_can_be_excluded(tmp_path, capsys):
  root = str(tmp_path / "grid")
  best = make_grid(root, SIZES[:4])  # BERT d32L2 .. d128L3, optima inside their grids
  model, size, n = SIZES[0]
  compute = 120.0 * n * n
  # d32L2's best moves to 1 row, below its grid: an edge no grid can widen.
  grid_member(root, "bert_d32L2_b1_lr0.001", model, size, int(n), compute, 1, 1e-3, -1.0)
  assert grid_lib.main(["fit", "--grid", root, "--bootstrap", "0", "--no_plot"]) == 2
  err = capsys.readouterr().err.strip()
  assert "bert d32L2 (B 1 rows" in err and "(1 row, the smallest batch there is)" in err, err
  out = str(tmp_path / "laws.json")
  argv = ["fit", "--grid", root, "--out", out, "--bootstrap", "0", "--no_plot"]
  assert grid_lib.main([*argv, "--exclude", "bert:d32L2"]) == 0
  capsys.readouterr()
  laws = laws_lib.load(out)
  assert laws.provenance["excluded"] == ["bert:d32L2"] and "excluded: bert:d32L2" in laws.source
  assert [r["size"] for r in laws.provenance["runs"]] == ["d64L2", "d96L3", "d128L3"]
  assert [r["name"] for r in laws.provenance["runs"]] == [
    best[("bert", s)][0] for s in ("d64L2", "d96L3", "d128L3")
  ]
  assert laws.overridden == () and laws.lr.n_points == 3
  assert grid_lib.main([*argv, "--exclude", "bert:d999"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--exclude: bert:d999 not in the grid" in err


def test_members_are_judged_by_the_full_split_loss_unless_told_otherwise(tmp_path, capsys):
  """The default metric is the full-split validation loss; eval/loss (the first rows of the
  split) only with --metric eval_loss; a finished member without the full-split record is
  skipped with the backfill command, never judged by eval/loss instead."""
  root = str(tmp_path / "grid")
  best = make_grid(root, SIZES[:3])
  model, size, n = SIZES[1]
  compute = 120.0 * n * n
  winner = best[(model, size)]
  # A member whose eval/loss beats the size's best but whose full-split loss does not ...
  grid_member(root, "decoy", model, size, int(n), compute, 7, 0.0123, 99.0, eval_loss=-1.0)
  # ... and one whose full-split record is missing (a run from before val_full).
  grid_member(root, "old", model, size, int(n), compute, 9, 0.0123, -2.0, val_full=False)
  assert grid_lib.main(["fit", "--grid", root, "--no_plot", "--bootstrap", "0"]) == 0
  out = capsys.readouterr()
  assert "old (finished, but no eval/val_full-step_100.json" in out.err
  assert "python -m cbert_jax.run.validation --root GRID" in out.err
  laws = laws_lib.load(os.path.join(root, "laws.json"))
  assert laws.provenance["metric"] == "val_full" and "full-split" in laws.provenance["selection"]
  runs = {(r["model"], r["size"]): r for r in laws.provenance["runs"]}
  assert runs[model, size]["name"] == winner[0]
  # ("old" is then the best, alone at its batch: only one lr tried there, an edge)
  result = grid_lib.fit_grid(
    root, n_boot=0, plot=False, metric="eval_loss", allow=("edges",), override_reason="test"
  )
  eval_runs = {(r["model"], r["size"]): r["name"] for r in result.laws.provenance["runs"]}
  assert result.laws.provenance["metric"] == "eval_loss" and not result.skipped
  assert eval_runs[model, size] == "old"  # eval/loss -2.0 is the lowest there
  with pytest.raises(ValueError, match="metric"):
    grid_lib.fit_grid(root, metric="loss")
  # The record is where cbert_jax.run.validation writes it.
  from cbert_jax.run import validation  # pylint: disable=import-outside-toplevel

  assert validation.output_path(root, 7) == record_lib.val_full_path(root, 7)


def test_few_sizes_refused_unless_allowed_and_every_failed_check_named(tmp_path, capsys):
  two = str(tmp_path / "two")
  make_grid(two, SIZES[:2])
  assert grid_lib.main(["fit", "--grid", two, "--no_plot"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and two in err, err
  assert "rest on 2 sizes (bert d32L2, bert d64L2); need at least 3" in err
  assert "(override: --allow_few_sizes)" in err and "--allow_edges" not in err
  assert not os.path.exists(os.path.join(two, "laws.json"))
  assert (
    grid_lib.main(
      [
        "fit",
        "--grid",
        two,
        "--no_plot",
        "--allow_few_sizes",
        "--override_reason",
        "test: the grid is synthetic",
      ]
    )
    == 0
  )
  capsys.readouterr()
  laws = laws_lib.load(os.path.join(two, "laws.json"))
  assert laws.overridden == ("few_sizes",)
  # Two points: no interval of either kind (every bootstrap resample with a slope is the line
  # through both: a zero-width "interval"); the resamples are still counted.
  assert laws.lr.alpha_t_ci is None and laws.lr.alpha_ci is None and laws.lr.a_ci is None
  assert laws.lr.bootstrap == {"method": "exact", "resamples": 4, "skipped": 2}
  # Two sizes, both on an edge: both checks named, each with its flag; both flags override both.
  edged = str(tmp_path / "edged")
  make_grid(edged, SIZES[:2], lr_shift=-3.0)
  assert (
    grid_lib.main(
      [
        "fit",
        "--grid",
        edged,
        "--no_plot",
        "--allow_few_sizes",
        "--override_reason",
        "test: the grid is synthetic",
      ]
    )
    == 2
  )
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "(override: --allow_edges)" in err
  assert "--allow_few_sizes" not in err  # that one is overridden
  assert grid_lib.main(["fit", "--grid", edged, "--no_plot"]) == 2
  err = capsys.readouterr().err
  assert "(override: --allow_few_sizes)" in err and "(override: --allow_edges)" in err
  argv = [
    "fit",
    "--grid",
    edged,
    "--no_plot",
    "--allow_few_sizes",
    "--allow_edges",
    "--override_reason",
    "test: the grid is synthetic",
  ]
  assert grid_lib.main(argv) == 0
  capsys.readouterr()
  assert laws_lib.load(os.path.join(edged, "laws.json")).overridden == ("few_sizes", "edges")
  with pytest.raises(ValueError, match="unknown check"):
    grid_lib.fit_grid(edged, allow=("everything",), override_reason="test")


def test_implausible_exponent_refused_unless_allowed_and_the_sweep_warns(tmp_path, capsys, caplog):
  # The short grid: lr* growing with compute (C^+0.31).
  root = str(tmp_path / "grid")
  make_grid(root, SIZES[:4], lr_a=1e-6, lr_alpha=0.31)
  assert grid_lib.main(["fit", "--grid", root, "--no_plot"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and root in err, err
  # the exponents of the sizes' true optima (the law's +0.31, moved by their jitter)
  n = np.array([size[2] for size in SIZES[:4]])
  lr_true = [true_optimum(120.0 * x * x, j, 1e-6, 0.31)[0] for x, j in zip(n, JITTER)]
  want_c = np.polyfit(np.log(120.0 * n * n), np.log(lr_true), 1)[0]
  want_n = np.polyfit(np.log(n), np.log(lr_true), 1)[0]
  assert 0.25 < want_c < 0.35
  assert f"lr*(C) exponent {want_c:+.3f} outside [-0.5, 0]" in err, err
  assert f"lr*(N) exponent {want_n:+.3f} outside [-1, 0]" in err, err
  assert "B*(C)" not in err and "(override: --allow_implausible)" in err
  assert not os.path.exists(os.path.join(root, "laws.json"))
  assert (
    grid_lib.main(
      [
        "fit",
        "--grid",
        root,
        "--no_plot",
        "--allow_implausible",
        "--override_reason",
        "test: the grid is synthetic",
      ]
    )
    == 0
  )
  assert "check implausible overridden" in capsys.readouterr().err
  path = os.path.join(root, "laws.json")
  # A sweep member planned with these laws warns and records them (laws_source).
  sweep = experiment.load_experiment(SWEEP)
  m = sweep.get_config("model=bert,size=d32L2")
  m.sweep.laws = path
  with caplog.at_level("WARNING"):
    m = config_lib.resolve(m)
  assert (
    f"sweep.laws: {path} was fitted with its checks overridden (implausible; reason: test: the"
    in caplog.text
  )
  assert m.sweep.laws_source.endswith(
    "checks overridden: implausible (reason: test: the grid is synthetic)"
  )
  # The warning comes once per file and process, however often the sweep loads the laws.
  caplog.clear()
  with caplog.at_level("WARNING"):
    laws = laws_lib.load(path)
  assert "overridden" not in caplog.text
  assert laws.overridden == ("implausible",) and laws.lr.alpha == pytest.approx(0.31, abs=0.03)
  assert f"lr*(C) exponent {want_c:+.3f}" in laws.provenance["checks"]["implausible"]["detail"]


def test_bad_grid_input_is_one_line_naming_the_path_exit_2(tmp_path, capsys):
  missing = str(tmp_path / "nope")
  empty = tmp_path / "empty"
  (empty / "compilation_cache").mkdir(parents=True)
  one = str(tmp_path / "one")
  make_grid(one, SIZES[:1])
  half = str(tmp_path / "half")  # two sizes, but one is unfinished
  grid_member(half, "a", "bert", "d32L2", 50_000, 3e11, 8, 1e-2, 3.0)
  grid_member(half, "b", "bert", "d64L2", 150_000, 3e12, 8, 1e-2, 3.0, final_step=5)
  for argv, path, words in (
    (["fit", "--grid", missing], missing, "no such directory"),
    (["fit", "--grid", str(empty)], str(empty), "holds no member workdirs"),
    (["fit", "--grid", one], one, "need at least 2 sizes"),
    (["fit", "--grid", half], half, "1 member(s) unfinished"),
    (["fit", "--grid", one, "--model", "crossbert"], "crossbert", "has no crossbert members"),
  ):
    assert grid_lib.main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path in err and words in err, err
  with pytest.raises(SystemExit) as e:
    grid_lib.main(["fit", "--grid", one, "--bootstrap", "-1"])
  assert e.value.code == 2
  capsys.readouterr()


def test_seeds_of_one_point_are_pooled_to_their_mean_as_if_measured_once(tmp_path, capsys):
  """A grid point run with two seeds counts once, at the mean of its seeds' losses: the fit on a
  grid with a second seed at BERT d64L2's best (a bad draw, so the mean moves the best to a
  neighbour) equals the fit on the same grid with that point's loss replaced by the mean. A
  diverged seed makes the point diverged; the same point twice with one seed is refused."""
  two_seeds, one_point = str(tmp_path / "two_seeds"), str(tmp_path / "one_point")
  best = make_grid(two_seeds)
  make_grid(one_point)
  name, compute, n, rows, lr = best[("bert", "d64L2")]
  with open(os.path.join(two_seeds, name, "eval", f"val_full-step_{100}.json")) as f:
    seed0 = json.load(f)["loss"]
  seed1 = seed0 + 0.5  # bad enough that the pooled point is no longer the size's best
  grid_member(two_seeds, name + "_s1", "bert", "d64L2", int(n), compute, rows, lr, seed1, seed=1)
  shutil.rmtree(os.path.join(one_point, name))
  grid_member(one_point, name, "bert", "d64L2", int(n), compute, rows, lr, (seed0 + seed1) / 2)
  fits = {}
  for root in (two_seeds, one_point):
    out = str(tmp_path / f"{os.path.basename(root)}.json")
    argv = ["fit", "--grid", root, "--model", "bert", "--bootstrap", "0", "--out", out]
    assert grid_lib.main(argv) == 0
    fits[root] = laws_lib.load(out)
  capsys.readouterr()
  a, b = fits[two_seeds], fits[one_point]
  for law in ("lr", "batch_tokens", "lr_n", "batch_tokens_n"):
    assert getattr(a, law).alpha == pytest.approx(getattr(b, law).alpha, abs=1e-12)
    assert getattr(a, law).a == pytest.approx(getattr(b, law).a, rel=1e-12)
  run = next(r for r in a.provenance["runs"] if r["size"] == "d64L2")
  assert run["name"] != name  # the pooled point lost; a neighbour is the best now
  assert f"{name}+{name}_s1" in run["grid_members"]
  assert next(r for r in b.provenance["runs"] if r["size"] == "d64L2")["name"] == run["name"]
  # One seed diverged: the point is diverged (+inf), named in the provenance.
  status_lib.mark_failed(os.path.join(two_seeds, name + "_s1"), "NonFiniteLossError: loss nan")
  out = str(tmp_path / "diverged.json")
  argv = ["fit", "--grid", two_seeds, "--model", "bert", "--bootstrap", "0", "--out", out]
  assert grid_lib.main(argv) == 0
  assert f"{name}+{name}_s1" in laws_lib.load(out).provenance["diverged"]
  # The same point and seed twice: one line naming both, exit 2, nothing written.
  shutil.rmtree(os.path.join(two_seeds, name + "_s1"))
  grid_member(two_seeds, name + "_copy", "bert", "d64L2", int(n), compute, rows, lr, seed1)
  out = str(tmp_path / "dup.json")
  argv = ["fit", "--grid", two_seeds, "--model", "bert", "--bootstrap", "0", "--out", out]
  assert grid_lib.main(argv) == 2
  err = capsys.readouterr().err
  assert f"{name}, {name}_copy are the same grid point with the same seed" in err, err
  assert not os.path.exists(out)


def test_the_laws_record_their_grid_budget_and_a_member_at_another_budget_is_warned(
  tmp_path, capsys, caplog, monkeypatch
):
  # The optimal batch and LR move with the training budget (tokens per parameter): the fit
  # records the budget its grid trained at, refuses a grid that mixes budgets, and a member or a
  # plan more than 1.5x away from it is told (the cpu sweep at 20 used laws fitted at 5).
  from cbert_jax.scaling import plan as plan_lib
  from cbert_jax.sweep import planner

  root = str(tmp_path / "grid")
  make_grid(root, SIZES[:3])  # members at the sweep's 20 tokens per parameter
  path = os.path.join(root, "laws.json")
  assert grid_lib.main(["fit", "--grid", root, "--no_plot", "--bootstrap", "0"]) == 0
  capsys.readouterr()
  laws = laws_lib.load(path)
  assert laws.provenance["tokens_per_param"] == 20.0 and laws.tokens_per_param == 20.0
  assert laws.budget_mismatch(20.0) == laws.budget_mismatch(29.0) == ""  # within 1.5x
  assert laws.budget_mismatch(5.0) == (
    "the laws were fitted on a grid trained at 20 tokens per parameter and this member trains "
    "at 5; the optimal batch and LR move with the budget"
  )
  assert laws_lib.DEFAULT.tokens_per_param is None and laws_lib.DEFAULT.budget_mismatch(5.0) == ""
  # A sweep member at the laws' budget resolves quietly; one at 5 is warned once per process.
  monkeypatch.setattr(plan_lib, "_BUDGET_WARNED", set())
  sweep = experiment.load_experiment(SWEEP)
  member = sweep.get_config("model=bert,size=d64L2")
  member.sweep.laws = path
  assert member.sweep.tokens_per_param == 20.0
  with caplog.at_level("WARNING"):
    config_lib.resolve(member)
  assert "tokens per parameter" not in caplog.text
  for _ in range(2):
    member = sweep.get_config("model=bert,size=d64L2")
    member.sweep.laws, member.sweep.tokens_per_param = path, 5.0
    with caplog.at_level("WARNING"):
      config_lib.resolve(member)
  assert caplog.text.count("trained at 20 tokens per parameter and this member trains at 5") == 1
  # Both LR and batch set by hand: the laws are not used, nothing to warn about.
  caplog.clear()
  monkeypatch.setattr(plan_lib, "_BUDGET_WARNED", set())
  member = sweep.get_config("model=bert,size=d64L2")
  member.sweep.laws, member.sweep.tokens_per_param = path, 5.0
  member.sweep.lr, member.sweep.batch_size = 1e-3, 8
  with caplog.at_level("WARNING"):
    config_lib.resolve(member)
  assert "tokens per parameter" not in caplog.text
  # The planner's notes say the same for a plan at another budget, and nothing at the laws' own.
  for budget, noted in (("20", False), ("5", True)):
    assert planner.main(["--flops", "1e13", "--model", "bert", "--ladder", "all", "--laws", path,
                         "--tokens_per_param", budget, "--json"]) == 0  # fmt: skip
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("this plan trains at" in n for n in notes) == noted, notes
  # A grid whose members trained on two budgets is refused, one line naming both; nothing written.
  os.remove(path)
  size = SIZES[0]
  grid_member(
    root, "extra", size[0], size[1], int(size[2]), 120.0 * size[2] ** 2, 3, 1e-3, 9.0,
    tokens_per_param=5.0,
  )  # fmt: skip
  assert grid_lib.main(["fit", "--grid", root, "--no_plot", "--bootstrap", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and root in err, err
  assert "different budgets (sweep.tokens_per_param 5, 20)" in err and "one budget at a time" in err
  assert not os.path.exists(path)
