"""The fair CMS comparison's analysis (cbert_jax/report/cms_fair.py) on synthetic member workdirs.

`half` loss curves in closed form: CMS L(t) = 2 + 5 t^-0.3; no-CMS the same curve stretched by R
in tokens, plus a bowl in log rows and log LR that is 0 at (14 rows, LR 2.68e-3), so the grid's
best is there (on its largest-batch edge) and the tokens ratio no-CMS / CMS at that point is R.
CMS costs 2x no-CMS's FLOPs per token and `cms_flops` trains on half the tokens: the same FLOPs.
Probe averages 0.5 + 0.01 log(t / R_arm). Real files throughout; no JAX, no network.
"""

import json
import math
import os

import pytest

from cbert_jax.report import cms_fair
from cbert_jax.sweep import experiment as experiment_lib
from tests import members

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T, EVERY = 16, 5  # seq_len, val_full_every
TOKENS = 28 * T * 10  # the full budget: 70, 40 and 20 steps at 4, 7 and 14 rows
FPT = {"nocms": 1000.0, "cms": 2000.0, "cms_flops": 2000.0}
R = 1.6  # no-CMS needs R x CMS's tokens for the same loss
LRS = (1.34e-3, 2.68e-3, 5.36e-3)
BEST = (14, 2.68e-3)


def bowl(rows: int, lr: float) -> float:
  return 0.1 * math.log2(rows / BEST[0]) ** 2 + 0.1 * math.log2(lr / BEST[1]) ** 2


def loss_at(t: float, arm: str, rows: int, lr: float) -> float:
  if arm == "nocms":
    return 2.0 + 5.0 * (t / R) ** -0.3 + bowl(rows, lr)
  return 2.0 + 5.0 * t**-0.3


def write(root, arm: str, rows: int, lr: float, seed: int, *, offset: float = 0.0, last=None):
  """A member workdir named as experiments/cms_fair.py names it; `offset` is added to every
  `half` loss (a seed that drew worse); `last` stops the validations early (unfinished)."""
  tokens = TOKENS // 2 if arm == "cms_flops" else TOKENS
  steps = tokens // (rows * T)
  arg = f"arm={arm},rows={rows},lr={lr:.3g},seed={seed}"
  config = members.member_config(
    model="crossbert",
    size="d64L2",
    total_steps=steps,
    batch_size=rows,
    seq_len=T,
    lr=lr,
    cms=arm != "nocms",
    seed=seed,
    sweep={"n_params": 1000, "compute": FPT[arm] * tokens, "tokens": tokens, "arg": arg},
  )
  val_full = {}
  for step in range(EVERY, (last or steps) + 1, EVERY):
    value = loss_at(step * rows * T, arm, rows, lr) + offset
    rec = {"loss": value, "masked_acc": 0.1, "rows": 64, "target_tokens": 512, "mask_key": 1}
    rec |= {"definition": "test", "model_name": "crossbert", "metrics": {}}
    val_full[step] = rec | {"half": {"loss": value, "masked_acc": 0.1, "target_tokens": 512}}
  sc = 0.5 + 0.01 * math.log(tokens / (R if arm == "nocms" else 1.0))
  task = {"kind": "classification", "metric": "acc", "ridge": {"dev": sc, "test": sc}}
  results = {"task": task, "average": {"ridge": sc, "all": sc}}
  rows_ = [{"step": s, "train/loss": 3.0} for s in range(EVERY, steps + 1, EVERY)]
  name = f"{arm.replace('_', '-')}_d64L2_b{rows}_lr{lr:.3g}_s{seed}"
  probes = {steps: results} if not last else {}
  members.write_member(root / name, config, rows=rows_, val_full=val_full, probes=probes)


def grid(root, seed3_offset: float = 0.0) -> None:
  for rows in (4, 7, 14):
    for lr in LRS:
      write(root, "nocms", rows, lr, 2)
  write(root, "nocms", *BEST, 3, offset=seed3_offset)
  write(root, "nocms", *cms_fair.CENTRE, 3)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  root = tmp_path_factory.mktemp("cms_fair")
  grid(root / "grid")  # one root per stage, as experiments/cms_fair.py runs them
  for seed in (2, 3):
    write(root / "compare", "cms", 14, 5.36e-3, seed)
    write(root / "compare", "cms_flops", 14, 5.36e-3, seed)
  write(root / "compare", "cms", 7, 2.68e-3, 3, last=10)  # an unfinished member: left out
  assert cms_fair.main(["--runs", str(root / "grid"), str(root / "compare")]) == 0
  with open(root / "grid" / "report" / "cms_fair.json") as f:
    return root, json.load(f)


def test_constants_are_the_experiments():
  path = os.path.join(ROOT, "experiments", "cms_fair.py")
  experiment = experiment_lib.load_experiment(path, field="tests/report/test_cms_fair.py")
  assert cms_fair.CENTRE == experiment.CENTRE and cms_fair.SEEDS == experiment.SEEDS


def test_grid_best_edge_and_decision(report):
  _, res = report
  g = res["grid"]
  assert len(g["points"]) == 9
  final = {(p["rows"], p["lr"]): p["loss"] for p in g["points"]}
  for (rows, lr), loss in final.items():  # the final half loss at the full budget
    assert loss == pytest.approx(loss_at(TOKENS, "nocms", rows, lr))
  assert (g["best"]["rows"], g["best"]["lr"]) == BEST
  assert g["edge"] == ["the largest batch"]
  assert g["decision"]["point"] == list(BEST)
  assert g["two_seed_means"]["best"] < g["two_seed_means"]["centre"]


def test_a_worse_second_seed_keeps_the_centre(tmp_path):
  """The best's seed 3 draws 0.5 nats worse: its 2-seed mean loses to the centre's."""
  grid(tmp_path, seed3_offset=0.5)
  res = cms_fair.analyse([str(tmp_path)])
  assert res["grid"]["decision"]["point"] == list(cms_fair.CENTRE)
  assert res["compare"] is None  # no CMS member yet
  assert "No decision yet" not in (tmp_path / "report" / "cms_fair.md").read_text()


def test_tokens_ratio_matched_flops_and_equal_token_probes(report):
  root, res = report
  c = res["compare"]
  assert c["arms"] == {"cms": [2, 3], "nocms": [2, 3], "cms_flops": [2, 3]}
  for s in ("2", "3"):  # interpolation in log tokens errs a little on a convex curve
    assert c["tokens_ratio"]["seeds"][s] == pytest.approx(R, rel=0.03)
    assert c["flops_ratio"]["seeds"][s] == pytest.approx(c["tokens_ratio"]["seeds"][s] / 2)
    assert c["flops"]["cms_flops"][s] == c["flops"]["nocms"][s] == c["flops"]["cms"][s] / 2
  want = loss_at(TOKENS / 2, "cms", 14, 5.36e-3) - loss_at(TOKENS, "nocms", *BEST)
  assert c["matched_loss"]["mean"] == pytest.approx(want) and c["matched_loss"]["resolved"]
  assert c["matched_probes"]["ridge"]["mean"] == pytest.approx(0.01 * math.log(R / 2))
  assert c["equal_token_probes"]["ridge"]["mean"] == pytest.approx(0.01 * math.log(R))
  md = (root / "grid" / "report" / "cms_fair.md").read_text()
  assert "cms_d64L2_b7_lr0.00268_s3: unfinished" in md
  assert f"{want:+.4f}" in md and (root / "grid" / "report" / "cms_fair.png").stat().st_size > 1000


def test_members_of_another_sequence_length_are_refused(tmp_path):
  grid(tmp_path)
  cfg_path = next(tmp_path.glob("nocms_*_s3")) / "config.json"
  body = json.loads(cfg_path.read_text())
  body["config"]["data"]["seq_len"] = 32
  cfg_path.write_text(json.dumps(body))
  assert cms_fair.main(["--runs", str(tmp_path)]) == 2
