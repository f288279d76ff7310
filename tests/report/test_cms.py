"""The CMS control's analysis (cbert_jax/report/cms.py) on synthetic member workdirs.

The members' `half` loss curves are closed forms: CMS L(t) = 2 + 5 t^-0.3, no-CMS the same curve
stretched by r in tokens, L(t) = 2 + 5 (t / r)^-0.3, so the true tokens ratio no-CMS / CMS is r at
every loss level. Real files throughout (config.json, eval/val_full-step_<N>.json, metrics.jsonl,
the final offline suite's eval/step_<N>.json); no JAX, no network.
"""

import json
import math
import os
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest

from cbert_jax.report import cms
from cbert_jax.sweep import experiment as experiment_lib
from tests import members

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, T, STEPS, EVERY = 8, 16, 100, 5  # rows, seq_len, total_steps, val_full_every
PROBE_STEPS = (25, 50, 75)  # online probe rows; the final suite at STEPS
FPT = {True: 3000.0, False: 2000.0}  # FLOPs per data token of each arm (cms: True / False)
N = {"d64L2": 1000, "d96L3": 2000}
PNG = b"\x89PNG\r\n\x1a\n"


def loss_at(tokens: float, r: float = 1.0) -> float:
  """The closed-form half loss: CMS with r = 1, no-CMS stretched by r in tokens."""
  return 2.0 + 5.0 * (tokens / r) ** -0.3


def score_at(tokens: float, r: float = 1.0) -> float:
  """A probe average rising with log tokens: the CMS - no-CMS difference is 0.01 log r."""
  return 0.5 + 0.01 * math.log(tokens / r)


def write_member(root, size, seed, cms_arm, r=1.0, *, loss=None, last=STEPS, batch=B, lr=1e-3):
  """A member workdir `root/<name>` whose half loss is loss_at(tokens, r) (or loss(step)),
  measured every EVERY steps up to `last`; probe rows and the final suite at STEPS."""
  name = f"crossbert{'' if cms_arm else '-nocms'}_{size}_s{seed}"
  tokens = STEPS * batch * T
  config = members.member_config(
    model="crossbert",
    size=size,
    total_steps=STEPS,
    batch_size=batch,
    seq_len=T,
    lr=lr,
    cms=cms_arm,
    seed=seed,
    sweep={"n_params": N[size], "compute": FPT[cms_arm] * tokens, "tokens": tokens},
  )
  val_full = {}
  for step in range(EVERY, last + 1, EVERY):
    value = loss(step) if loss else loss_at(step * batch * T, r)
    rec = {"loss": value, "masked_acc": 0.1, "rows": 64, "target_tokens": 512}
    rec |= {"mask_key": 1, "definition": "test definition", "model_name": "crossbert"}
    rec |= {"metrics": {}, "half": {"loss": value, "masked_acc": 0.1, "target_tokens": 512}}
    val_full[step] = rec
  rows = [{"step": s, "train/loss": 3.0, "tokens_seen": s * batch * T} for s in range(10, 101, 10)]
  for s in PROBE_STEPS:
    sc = score_at(s * batch * T, r)
    rows.append({"step": s, "probe/avg/ridge": sc, "probe/avg/knn": sc - 0.1, "probe/avg/all": sc})
  sc = score_at(STEPS * batch * T, r)  # the final offline suite: one task, its stored average
  task = {"kind": "classification", "metric": "acc", "ridge": {"dev": sc, "test": sc}}
  task["knn"] = {"dev": sc - 0.1, "test": sc - 0.1}
  results = {"task": task, "average": {"ridge": sc, "knn": sc - 0.1, "all": sc}}
  members.write_member(root / name, config, rows=rows, val_full=val_full, probes={STEPS: results})
  return root / name


# size -> seed -> r; d96L3 seed 1's no-CMS curve rises (no shared range)
RATIOS = {"d64L2": {0: 2.0, 1: 1.5}, "d96L3": {0: 0.8}}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  """The experiment's 8 members, analysed once: (runs dir, result, out dir)."""
  root = tmp_path_factory.mktemp("cms_control")
  for size, seeds in RATIOS.items():
    for seed, r in seeds.items():
      write_member(root, size, seed, True)
      write_member(root, size, seed, False, r)
  write_member(root, "d96L3", 1, True)
  write_member(root, "d96L3", 1, False, loss=lambda step: 10.0 + 0.01 * step)
  assert cms.main(["--runs", str(root)]) == 0
  out = root / "report"
  with open(out / "cms.json") as f:
    return root, json.load(f), out


def interpolation_bound() -> float:
  """|log(measured ratio / r)|: both arms' crossings are late by at most 0.3 h^2 e^(0.3 h) / 8
  in log tokens (the chord of the convex 5 e^(-0.3 x), x = log t, over a step of h, crosses a
  level late by at most the chord's gap h^2 max f'' / 8 over min |f'|, f''/|f'| = 0.3 and
  |f'| falling by at most e^(0.3 h) over the step); both late, so the ratio errs by at most the
  larger; h = the widest log-token step between measurements (steps 5 -> 10: log 2)."""
  steps = np.arange(EVERY, STEPS + 1, EVERY)
  h = float(np.max(np.diff(np.log(steps))))
  return 0.3 * h**2 * math.exp(0.3 * h) / 8


def test_levels_constant_is_the_experiments():
  path = os.path.join(ROOT, "experiments", "cms_control.py")
  experiment = experiment_lib.load_experiment(path, field="tests/report/test_cms.py")
  assert cms.LEVELS == experiment.LEVELS


def test_levels_follow_the_declared_rule(report):
  _, res, _ = report
  t = np.arange(EVERY, STEPS + 1, EVERY) * B * T
  for p in res["pairs"]:
    r = RATIOS[p["size"]].get(p["seed"])
    if r is None:
      continue
    c, n = loss_at(t), loss_at(t, r)
    hi, lo = min(c[0], n[0]), max(c[-1], n[-1])  # the rule, computed here independently
    want = [lo + (hi - lo) * k / cms.LEVELS for k in range(cms.LEVELS)][::-1]
    got = [row["level"] for row in p["levels"]]
    assert len(got) == cms.LEVELS and got[0] < hi and got[-1] == lo
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert p["L_hi"] == hi and p["L_lo"] == lo


def test_tokens_ratio_is_r_and_flops_ratio_scales_by_flops_per_token(report):
  _, res, _ = report
  bound, t0 = interpolation_bound(), EVERY * B * T
  assert 0 < bound < 0.03
  for p in (p for p in res["pairs"] if p["shared_range"]):
    r = RATIOS[p["size"]][p["seed"]]
    interior = 0
    for row in p["levels"]:
      assert row["flops_ratio"] == pytest.approx(row["tokens_ratio"] * FPT[False] / FPT[True])
      assert row["flops_cms"] == pytest.approx(row["tokens_cms"] * FPT[True])
      # every declared level lies below both first measurements: both arms interpolate
      assert not (row["at_first_cms"] or row["at_first_nocms"]) and row["tokens_cms"] > t0
      interior += 1
      assert abs(math.log(row["tokens_ratio"] / r)) <= bound
    assert interior == cms.LEVELS and p["levels_at_first"] == 0
    ratios = [row["tokens_ratio"] for row in p["levels"]]
    assert p["tokens_ratio"]["median"] == statistics.median(ratios)
    assert (p["tokens_ratio"]["min"], p["tokens_ratio"]["max"]) == (min(ratios), max(ratios))
  size = {s["size"]: s for s in res["sizes"]}
  medians = [p["tokens_ratio"]["median"] for p in res["pairs"] if p["size"] == "d64L2"]
  assert size["d64L2"]["tokens_ratio"]["mean"] == pytest.approx(statistics.fmean(medians))
  assert list(size["d64L2"]["tokens_ratio"]["seeds"]) == ["0", "1"]


def test_no_shared_range_and_verdict(report):
  _, res, out = report
  (p,) = [p for p in res["pairs"] if (p["size"], p["seed"]) == ("d96L3", 1)]
  assert not p["shared_range"] and p["levels"] == [] and p["L_lo"] >= p["L_hi"]
  assert "tokens_ratio" not in p
  md = (out / "cms.md").read_text()
  assert "No shared range: L_lo = " in md
  d64, d96 = res["verdict"][:2]
  assert (
    d64.startswith("d64L2: CMS reaches the shared loss levels with ") and "x fewer tokens" in d64
  )
  assert "x more tokens" in d96 and "no shared range for seed(s) 1" in d96
  assert all(v in md for v in res["verdict"])


def test_probe_differences_at_equal_tokens(report):
  _, res, _ = report
  rows = [r for r in res["probes"] if (r["size"], r["seed"]) == ("d64L2", 0)]
  assert [(r["step"], r["probe"]) for r in rows] == [
    (s, k) for s in (*PROBE_STEPS, STEPS) for k in ("ridge", "knn", "all")
  ]
  for r in rows:
    assert r["tokens"] == r["step"] * B * T
    assert r["diff"] == pytest.approx(0.01 * math.log(2.0))  # the final row: the suite's average
    assert r["diff"] == pytest.approx(r["cms"] - r["nocms"])


def test_the_probe_verdict_gives_the_last_steps_difference_per_seed(report):
  """The planted difference is 0.01 log r at every step: at the last one, per seed and its mean
  over seeds; CMS ahead on `all` wherever r > 1."""
  _, res, out = report
  d64, d96 = res["verdict"][2:]
  diffs = {s: 0.01 * math.log(r) for s, r in RATIOS["d64L2"].items()}
  mean = statistics.fmean(diffs.values())
  want = f"ridge {mean:+.4f} (seed 0 {diffs[0]:+.4f}, seed 1 {diffs[1]:+.4f})"
  assert d64.startswith("d64L2: frozen probes at the last step") and want in d64
  assert d64.index("ridge") < d64.index("knn") < d64.index("all")
  assert d64.endswith("CMS ahead on the all average at 8 of 8 (seed, step) points.")
  # d96L3: seed 0's no-CMS is ahead (r = 0.8), seed 1's arms tie (the same probe curve)
  assert (
    f"ridge {0.01 * math.log(0.8) / 2:+.4f} (seed 0 {0.01 * math.log(0.8):+.4f}, seed 1 +0.0000)"
    in d96
  )
  assert d96.endswith("at 0 of 8 (seed, step) points.")
  assert all(v in (out / "cms.md").read_text() for v in (d64, d96))


def test_outputs_pngs_and_json_matches_markdown(report):
  root, res, out = report
  for name in ("cms_curves.png", "cms_probes.png"):
    assert (out / name).read_bytes()[:8] == PNG
  # cms.json round-trips: its numbers are those computed in memory, exactly
  pairs, _ = cms.pair_up(cms.read_runs(str(root)), False)
  assert [cms.analyse_pair(c, n) for c, n in pairs] == res["pairs"]
  assert cms.per_size(res["pairs"]) == res["sizes"]
  md = (out / "cms.md").read_text()
  assert "The rule, as experiments/cms_control.py declared" in md and "test definition" in md
  sections = md.split("\n### ")[1:]
  ranged = [p for p in res["pairs"] if p["shared_range"]]
  tables = [s for s in sections if "| level |" in s]
  assert len(tables) == len(ranged)
  keys = ("tokens_cms", "tokens_nocms", "tokens_ratio", "flops_cms", "flops_nocms", "flops_ratio")
  for p, text in zip(ranged, tables):
    assert text.startswith(f"{p['size']} seed {p['seed']}: ")
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == cms.LEVELS
    for row, line in zip(p["levels"], rows):
      cells = [c.strip() for c in line.strip("|").split("|")]
      assert float(cells[1]) == pytest.approx(row["level"], rel=1e-5)
      for key, cell in zip(keys, cells[2:]):
        upper_bound = not key.endswith("ratio") and row["at_first_" + key.split("_")[1]]
        assert cell.endswith("*") == upper_bound
        assert float(cell.rstrip("*")) == pytest.approx(row[key], rel=5e-4)  # 4 digits


def _pair(root, **nocms_kw):
  """One complete d64L2 seed-0 pair under `root` (the no-CMS arm with `nocms_kw`)."""
  write_member(root, "d64L2", 0, True)
  return write_member(root, "d64L2", 0, False, 2.0, **nocms_kw)


@pytest.mark.parametrize("kw,field", [({"batch": 16}, "batch_size"), ({"lr": 2e-3}, "optim.lr")])
def test_premise_mismatch_is_refused(tmp_path, capsys, kw, field):
  _pair(tmp_path, **kw)
  assert cms.main(["--runs", str(tmp_path), "--allow_incomplete"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("cms error: ")
  assert "crossbert-nocms_d64L2_s0" in err and f": {field} " in err
  assert not (tmp_path / "report").exists()


def test_incomplete_member(tmp_path, capsys):
  _pair(tmp_path)
  wd = write_member(tmp_path, "d96L3", 0, True, last=STEPS - EVERY)  # no final val_full
  write_member(tmp_path, "d96L3", 0, False, 2.0)
  assert cms.main(["--runs", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and str(wd) in err and "--allow_incomplete" in err
  assert cms.main(["--runs", str(tmp_path), "--allow_incomplete"]) == 0
  err = capsys.readouterr().err
  assert err.startswith("warning: ") and str(wd) in err and "skipped" in err
  with open(tmp_path / "report" / "cms.json") as f:
    res = json.load(f)
  assert [(p["size"], p["seed"]) for p in res["pairs"]] == [("d64L2", 0)]
  assert res["warnings"] and (tmp_path / "report" / "cms_curves.png").read_bytes()[:8] == PNG


def test_reads_without_jax(report):
  """The analysis only reads files: it runs where `import jax` fails, importing no flax either
  (the plots, matplotlib only, are left out to keep the subprocess short)."""
  root, res, _ = report
  code = (
    "import json, sys\nsys.modules['jax'] = None\nfrom cbert_jax.report import cms\n"
    "pairs, _ = cms.pair_up(cms.read_runs(sys.argv[1]), False)\n"
    "print(json.dumps([cms.analyse_pair(c, n) for c, n in pairs]))\n"
    "assert not {'flax', 'jaxlib', 'tensorflow'} & {n.split('.')[0] for n in sys.modules}\n"
  )
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  args = [sys.executable, "-c", code, str(root)]
  r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout) == res["pairs"]
