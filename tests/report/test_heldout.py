"""Pre-registered held-out predictions (cbert_jax.report.heldout) on a synthetic sweep with a
planted law: the prediction at a new compute is the law's value, its interval is the textbook t
prediction interval, the check reads held-out workdirs back and says inside/outside, a run trained
on other hyperparameters than predicted for is refused, and a predictions file is never
rewritten."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from cbert_jax.report import heldout
from tests import members as members_lib

COMPUTE = np.geomspace(1e12, 1e14, 4)  # the sweep: 4 sizes over 2 decades
C0 = 3e14  # the held-out size's compute


def _loss(c):
  return 50.0 * c**-0.1


def _score(c):
  return 0.3 + 0.05 * math.log10(c / 1e12)


def _sweep_members(noise=0.01, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i, c in enumerate(COMPUTE):
    for s in range(2):
      out.append(
        {
          "name": f"bert_s{i}_{s}",
          "arch": "bert",
          "size": f"s{i}",
          "seed": s,
          "finished": True,
          "compute": float(c),
          "final_loss": float(_loss(c) * math.exp(rng.normal(0, noise))),
          "probes": {"ridge": _score(c) + rng.normal(0, noise)},
        }
      )
  return out


TARGET = {
  "member": "scale=heldout,model=bert,size=d160L3",
  "size": "d160L3",
  "n_params": 1_000_000,
  "tokens": 20_000_000,
  "compute": C0,
  "batch_size": 64,
  "lr": 3e-3,
  "total_steps": 2000,
  "laws": "shipped:cpu-{model}",
  "corpus": "offline_small",
  "tasks": ["sentiment", "new_task"],
}


def test_the_prediction_is_the_planted_law_with_the_textbook_interval():
  ms = _sweep_members()
  got = heldout.predict_family(ms, TARGET)
  loss = got["loss"]
  assert loss["slope"] == pytest.approx(-0.1, abs=0.01)
  assert got["extrapolation"] == pytest.approx(3.0)
  # the interval by hand: ln L on ln C, t_{n-2} s sqrt(1/n0 + 1/n + (x0 - xbar)^2 / Sxx)
  x = np.log([m["compute"] for m in ms])
  y = np.log([m["final_loss"] for m in ms])
  slope, intercept = np.polyfit(x, y, 1)
  s = math.sqrt(((y - intercept - slope * x) ** 2).sum() / (len(x) - 2))
  x0 = math.log(C0)
  for n0 in (1, 2):
    half = (
      stats.t.ppf(0.95, len(x) - 2)
      * s
      * math.sqrt(1 / n0 + 1 / len(x) + (x0 - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum())
    )
    yhat = intercept + slope * x0
    assert loss["predicted"] == pytest.approx(math.exp(yhat))
    assert loss["intervals"][str(n0)] == pytest.approx(
      [math.exp(yhat - half), math.exp(yhat + half)]
    )
  one, two = loss["intervals"]["1"], loss["intervals"]["2"]
  assert two[1] - two[0] < one[1] - one[0]  # the mean of 2 seeds is known better
  ridge = got["probes"]["ridge"]
  assert ridge["predicted"] == pytest.approx(_score(C0), abs=0.03)
  assert loss["lack_of_fit"]["dof"] == [2, 4] and loss["is_law"]


def test_the_intervals_cover_new_seeds_at_their_level():
  """Over 300 simulated sweeps, the mean of n0 new seeds at C0 falls inside the n0-seed interval
  about 90% of the time (binomial sd 1.7%: the bounds are 3 sd)."""
  rng = np.random.default_rng(1)
  hits = {1: 0, 2: 0}
  trials = 300
  for t in range(trials):
    got = heldout.predict_family(_sweep_members(seed=100 + t), TARGET)["loss"]
    for n0 in hits:
      new = _loss(C0) * math.exp(rng.normal(0, 0.01, n0).mean())
      lo, hi = got["intervals"][str(n0)]
      hits[n0] += lo <= new <= hi
  for n0, h in hits.items():
    assert 0.85 <= h / trials <= 0.95, (n0, h / trials)


def test_a_sweep_of_two_sizes_is_refused():
  ms = [m for m in _sweep_members() if m["compute"] < 5e12]
  with pytest.raises(heldout.HeldoutError, match="2 finished sizes"):
    heldout.predict_family(ms, TARGET)


def _task_results(scores: dict) -> dict:
  """The offline suite's results: one classification task per name, ridge test score given."""
  return {
    t: {
      "kind": "classification",
      "metric": "accuracy",
      "headline_split": "test",
      "sizes": {"train": 100, "dev": 10, "test": 10},
      "ridge": {"test": v},
    }
    for t, v in scores.items()
  }


def test_probe_averages_are_over_the_tasks_both_kits_have(tmp_path, monkeypatch):
  """The sweep scored sentiment and old_task; the held-out list is sentiment and new_task: the
  averages predicted, and the ones checked, are over sentiment alone."""
  sweep = tmp_path / "sweep"
  for m in _sweep_members(noise=0.0):
    config = members_lib.member_config(
      model="bert", size=m["size"], seed=m["seed"], sweep={"compute": m["compute"]}
    )
    score = _score(m["compute"])  # sentiment on the law; old_task far off it
    members_lib.write_member(
      sweep / m["name"],
      config,
      val_full={100: m["final_loss"]},
      probes={100: _task_results({"sentiment": score, "old_task": 0.9 - score})},
    )
  monkeypatch.setattr(heldout, "targets", lambda spec: {"bert": TARGET})
  pred = heldout.predict(str(sweep), "unused")["families"]["bert"]
  assert pred["tasks"] == ["sentiment"]
  assert pred["task_sizes"] == {"sentiment": {"train": 100, "dev": 10, "test": 10}}
  assert pred["probes"]["ridge"]["predicted"] == pytest.approx(_score(C0))
  assert pred["probes"]["ridge"]["slope"] == pytest.approx(0.05)


def _heldout_dir(tmp_path, losses, lr=TARGET["lr"]):
  """A held-out directory: predictions.json for bert at C0, and one workdir per seed."""
  d = tmp_path / "heldout"
  d.mkdir()
  sizes = {"train": 100, "dev": 10, "test": 10}
  fam = {"target": TARGET, "tasks": ["sentiment"], "task_sizes": {"sentiment": sizes}}
  pred = {
    "created": "2026-12-06T00:00:00+00:00",
    "level": 0.9,
    "families": {"bert": fam | heldout.predict_family(_sweep_members(), TARGET)},
  }
  (d / heldout.PREDICTIONS).write_text(json.dumps(pred))
  for seed, loss in enumerate(losses):
    config = members_lib.member_config(
      model="bert",
      size="d160L3",
      total_steps=TARGET["total_steps"],
      batch_size=TARGET["batch_size"],
      lr=lr,
      seed=seed,
      sweep={"n_params": TARGET["n_params"], "compute": C0, "tokens": TARGET["tokens"]},
    )
    members_lib.write_member(
      d / f"bert_d160L3_s{seed}",
      config,
      val_full={TARGET["total_steps"]: loss},
      # new_task is not among the predicted tasks: it must not enter the averages
      probes={
        TARGET["total_steps"]: _task_results({"sentiment": 0.5 + seed / 10, "new_task": 0.0})
      },
    )
  return d, pred["families"]["bert"]


def test_check_reads_the_runs_back_and_says_inside_or_outside(tmp_path):
  predicted = heldout.predict_family(_sweep_members(), TARGET)["loss"]["predicted"]
  measured = predicted * 1.002  # seeds 0.1% either side of it: inside any interval
  d, fam = _heldout_dir(tmp_path, [measured * 1.001, measured * 0.999])
  got = heldout.check(str(d))["families"]["bert"]
  loss = got["loss"]
  assert got["seeds"] == [0, 1] and loss["seeds"] == 2
  assert loss["measured"] == pytest.approx(measured)
  assert loss["interval"] == fam["loss"]["intervals"]["2"]  # the 2-seed interval applies
  assert loss["inside"] is True
  assert loss["miss"] == pytest.approx(predicted - measured)
  assert loss["miss_pct"] == pytest.approx(-100 * 0.002 / 1.002)
  ridge = got["probes"]["ridge"]
  assert ridge["per_seed"] == pytest.approx([0.5, 0.6]) and ridge["measured"] == pytest.approx(0.55)
  assert ridge["interval"] == fam["probes"]["ridge"]["intervals"]["2"]
  assert got["task_sizes_differ"] == []


def test_a_measurement_far_off_the_law_is_outside(tmp_path):
  d, _ = _heldout_dir(tmp_path, [_loss(C0) * 0.8])
  loss = heldout.check(str(d))["families"]["bert"]["loss"]
  assert loss["seeds"] == 1 and loss["inside"] is False and loss["miss_pct"] > 20


def test_a_run_on_other_hyperparameters_than_predicted_for_is_refused(tmp_path):
  d, _ = _heldout_dir(tmp_path, [_loss(C0)], lr=2 * TARGET["lr"])
  with pytest.raises(heldout.HeldoutError, match=r"bert_d160L3_s0: trained with lr"):
    heldout.check(str(d))


def test_a_predictions_file_is_never_rewritten(tmp_path, capsys):
  d, _ = _heldout_dir(tmp_path, [])
  before = (d / heldout.PREDICTIONS).read_bytes()
  argv = ["predict", "--sweep", str(tmp_path), "--experiment", "x.py:y", "--out", str(d)]
  assert heldout.main(argv) == 2
  assert "is never rewritten" in capsys.readouterr().err
  assert (d / heldout.PREDICTIONS).read_bytes() == before
