"""The check of LR/batch laws where a sweep uses them (cbert_jax.report.lawcheck): the sweep's
points are what the laws give the sweep's members (the values the committed check was centred
on, written in its plan before any run), and the plan's decision rule is applied to synthetic
groups whose answer is known: the best is the sweep's point; a best that wins by more than its
seeds' spread (moved) or by less (not moved); a second seed missing, a best on an edge and a
sweep's point never run (open); a diverged point; the same point and seed twice; a grid trained at
another budget than the sweep."""

import json
import os

import pytest

from cbert_jax.report import lawcheck
from cbert_jax.report.grid_read import GridError, read_grid
from tests.members import grid_member

CPU = "experiments/sweep.py:cpu"
LAWS = "shipped:cpu-{model}"
N, COMPUTE = 197_000, 1.1e13
CENTRE = (7, 0.00263)  # BERT d64L2's point in the cpu sweep under the shipped laws


def _group(root, losses: dict, model="bert", size="d64L2", tpp=20.0) -> list:
  """Grid members at {(rows, lr, seed): loss} (None: diverged); returns the group as read."""
  for (rows, lr, seed), loss in losses.items():
    name = f"{model}_{size}_b{rows}_lr{lr:.3g}" + (f"_s{seed}" if seed else "")
    failed = "NonFiniteLossError: loss nan" if loss is None else ""
    grid_member(
      root, name, model, size, N, COMPUTE, rows, lr, loss if loss is not None else 9.0,
      failed=failed, seed=seed, tokens_per_param=tpp,
    )  # fmt: skip
  return [m for m in read_grid(str(root)) if m.state in ("done", "diverged")]


def _cross(centre_loss=5.0, best=None, extra=None) -> dict:
  """A 3 x 3 around CENTRE (factor 2 in rows and LR), every other point 0.1 above the centre;
  `best` replaces one point's seed-0 loss; `extra` adds {(rows, lr, seed): loss}."""
  rows0, lr0 = CENTRE
  out = {
    (r, lr, 0): centre_loss + (0.0 if (r, lr) == CENTRE else 0.1)
    for r in (rows0 // 2, rows0, rows0 * 2)
    for lr in (lr0 / 2, lr0, lr0 * 2)
  }
  if best:
    out[best[0]] = best[1]
  out.update(extra or {})
  return out


# one point beyond the (14 rows, 2 x LR) corner on each axis, both worse: the edge rule's points
BEYOND = {(14, CENTRE[1] * 4, 0): 5.3, (28, CENTRE[1] * 2, 0): 5.2}


def test_the_sweeps_points_are_what_the_laws_give_its_members():
  # PLAN.md (committed before the first run) centred the check on these rows and LRs.
  points = lawcheck.sweep_points(CPU, LAWS)
  want = {
    ("bert", "d64L2"): (7, 2.63e-3),
    ("crossbert", "d64L2"): (7, 2.68e-3),
    ("bert", "d96L3"): (20, 2.95e-3),
    ("crossbert", "d96L3"): (17, 2.47e-3),
    ("bert", "d128L3"): (52, 3.271e-3),
    ("crossbert", "d128L3"): (43, 2.263e-3),
  }
  for key, (rows, lr) in want.items():
    assert points[key]["rows"] == rows and points[key]["lr"] == pytest.approx(lr, rel=2e-3), key
    assert points[key]["tokens_per_param"] == 20.0
  assert ("crossbert-nocms", "d96L3") in points  # the CMS control is a member too


def test_the_decision_rule_on_groups_with_a_known_answer(tmp_path):
  rows0, lr0 = CENTRE
  best = (rows0 * 2, lr0 * 2)
  cases = {
    # the centre is the best and surrounded: nothing to run
    "centre": (_cross(), "not moved"),
    # the best wins by 0.05 in both seeds; seeds spread 0.01
    "moved": (
      _cross(best=((*best, 0), 4.95), extra={(*best, 1): 4.96, (*CENTRE, 1): 5.01, **BEYOND}),
      "moved",
    ),
    # the same means, but the sweep's point's seeds spread 0.2 > 0.05
    "noisy": (
      _cross(best=((*best, 0), 4.95), extra={(*best, 1): 4.96, (*CENTRE, 1): 4.81, **BEYOND}),
      "not moved",
    ),
    # no second seed yet: the rule cannot decide
    "one seed": (_cross(best=((*best, 0), 4.95), extra=BEYOND), "open"),
  }
  for name, (losses, status) in cases.items():
    group = _group(tmp_path / name, losses)
    verdict = lawcheck.judge(group, CENTRE)
    assert verdict["status"] == status, (name, verdict["why"])
  moved = lawcheck.judge(_group(tmp_path / "moved2", cases["moved"][0]), CENTRE)
  assert moved["means"]["best"] == pytest.approx(4.955) and moved["seed_range"] == pytest.approx(
    0.01
  )
  assert moved["best"] == {"rows": 14, "lr": pytest.approx(lr0 * 2), "loss": pytest.approx(4.95)}


def test_open_while_the_best_is_on_an_edge_or_the_sweeps_point_is_missing(tmp_path):
  rows0, lr0 = CENTRE
  # the corner (twice the rows, twice the LR) is best: beyond it on both axes is unexplored
  corner = lawcheck.judge(_group(tmp_path / "corner", _cross(best=((14, lr0 * 2, 0), 4.9))), CENTRE)
  assert corner["status"] == "open" and corner["edges"] == ["highest lr", "highest batch"]
  assert "on the grid's edge (highest lr; highest batch)" in corner["why"]
  # a point beyond it on each axis, both worse: interior now, and the seeds decide
  widened = _cross(best=((14, lr0 * 2, 0), 4.9), extra=BEYOND)
  verdict = lawcheck.judge(_group(tmp_path / "widened", widened), CENTRE)
  assert verdict["status"] == "open" and not verdict["edges"] and "a second seed" in verdict["why"]
  # only the sweep's point run: the best by default, but nothing around it
  alone = lawcheck.judge(_group(tmp_path / "alone", {(*CENTRE, 0): 5.0}), CENTRE)
  assert alone["status"] == "open" and "only one lr tried" in alone["why"]
  # the sweep's point never run
  missing = _cross()
  del missing[(*CENTRE, 0)]
  verdict = lawcheck.judge(_group(tmp_path / "missing", missing), CENTRE)
  assert verdict["status"] == "open" and verdict["why"] == "the sweep's point has not been run"


def test_a_diverged_point_loses_and_the_same_point_and_seed_twice_is_refused(tmp_path):
  rows0, lr0 = CENTRE
  losses = _cross()
  losses[(14, lr0 * 2, 0)] = None  # diverged
  group = _group(tmp_path / "diverged", losses)
  verdict = lawcheck.judge(group, CENTRE)
  assert verdict["status"] == "not moved"
  point = next(
    p for p in verdict["points"] if p["rows"] == 14 and p["lr"] == pytest.approx(lr0 * 2)
  )
  assert point["losses"] == {"0": float("inf")}
  root = tmp_path / "twice"
  group = _group(root, _cross())
  grid_member(root, "copy", "bert", "d64L2", N, COMPUTE, rows0, lr0, 5.5, seed=0)
  with pytest.raises(GridError, match=r"two members at bert d64L2, 7 rows, lr 0.00263 with seed 0"):
    lawcheck.judge([m for m in read_grid(str(root))], CENTRE)


def test_the_cli_writes_the_check_and_refuses_a_grid_at_another_budget(tmp_path, capsys):
  rows0, lr0 = CENTRE
  root = tmp_path / "grid"
  _group(root, _cross(best=((14, lr0 * 2, 0), 4.95), extra=BEYOND))
  out = tmp_path / "out"
  argv = ["--grid", str(root), "--experiment", CPU, "--laws", LAWS, "--out", str(out), "--no_plot"]
  assert lawcheck.main(argv) == 0
  text = capsys.readouterr().out
  assert "# The LR/batch laws checked at 20 tokens per parameter" in text
  assert "laws fitted at bert 5 tokens per parameter" in text
  assert "| bert | d64L2 | 7 | 0.00263 | 5.0000 | sweep's point |" in text
  assert "| bert | d64L2 | 14 | 0.00526 | 4.9500 | seed-0 best |" in text
  assert "* bert d64L2: **open**: the seed-0 best is 14 rows, lr 0.00526; a second seed" in text
  with open(out / "check.json") as f:
    result = json.load(f)
  assert result["groups"][0]["status"] == "open" and result["tokens_per_param"] == 20.0
  assert (out / "check.md").read_text() == text
  # the same grid trained at 5 tokens per parameter: not where the cpu sweep uses the laws
  other = tmp_path / "at5"
  _group(other, _cross(), tpp=5.0)
  argv = ["--grid", str(other), "--experiment", CPU, "--laws", LAWS, "--no_plot"]
  assert lawcheck.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("lawcheck error: --grid") and len(err.strip().splitlines()) == 1
  assert "trained at [5.0] tokens per parameter and the sweep" in err
  assert not os.path.exists(other / "check.json")


def test_the_next_runs_are_the_rules_edge_points_then_the_second_seeds(tmp_path, capsys):
  rows0, lr0 = CENTRE
  corner = _cross(best=((14, lr0 * 2, 0), 4.9))
  group = lawcheck.judge(_group(tmp_path / "corner", corner), CENTRE)
  assert lawcheck.next_runs(group) == [
    (14, pytest.approx(lr0 * 4), 0),
    (28, pytest.approx(lr0 * 2), 0),
  ]
  low = _cross(best=((3, lr0 / 2, 0), 4.9))  # 7 // 2 = 3 rows: the lowest batch and LR
  group = lawcheck.judge(_group(tmp_path / "low", low), CENTRE)
  assert lawcheck.next_runs(group) == [
    (3, pytest.approx(lr0 / 4), 0),
    (2, pytest.approx(lr0 / 2), 0),
  ]
  # interior after the edge points: seed 1 of the best and of the sweep's point
  widened = lawcheck.judge(_group(tmp_path / "widened", corner | BEYOND), CENTRE)
  assert lawcheck.next_runs(widened) == [
    (14, pytest.approx(lr0 * 2), 1),
    (7, pytest.approx(lr0), 1),
  ]
  half = lawcheck.judge(_group(tmp_path / "half", corner | BEYOND | {(*CENTRE, 1): 5.0}), CENTRE)
  assert lawcheck.next_runs(half) == [(14, pytest.approx(lr0 * 2), 1)]
  # decided (either way), or a lone point: nothing more
  done = corner | BEYOND | {(*CENTRE, 1): 5.0, (14, lr0 * 2, 1): 4.91}
  decided = lawcheck.judge(_group(tmp_path / "done", done), CENTRE)
  assert decided["status"] == "moved" and lawcheck.next_runs(decided) == []
  alone = lawcheck.judge(_group(tmp_path / "alone", {(*CENTRE, 0): 5.0}), CENTRE)
  assert lawcheck.next_runs(alone) == []
  # the CLI prints them for a runner, and none for a group it is told to wait for
  argv = ["--grid", str(tmp_path / "corner"), "--experiment", CPU, "--laws", LAWS, "--next"]
  assert lawcheck.main(argv) == 0
  assert capsys.readouterr().out.splitlines() == [
    "bert d64L2 14 0.01052 0",
    "bert d64L2 28 0.00526 0",
  ]
  assert lawcheck.main([*argv, "--wait_for", "bert:d64L2"]) == 0
  assert capsys.readouterr().out == ""
  assert not os.path.exists(tmp_path / "corner" / "check.json")
