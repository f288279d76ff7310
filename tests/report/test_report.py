"""The scaling report (cbert_jax.report) on synthetic sweeps with planted numbers: seeds grouped per
size, the full-split loss preferred over eval/loss, the CMS levels over the whole shared range,
the loss surface L(N, D) and its refusal, the controlled CMS summary."""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from cbert_jax.report import __main__ as report_cli
from cbert_jax.report import fits as report_fits
from cbert_jax.report import grid as grid_lib
from cbert_jax.report import loss_surface
from cbert_jax.report import sweep_report as report
from cbert_jax.run import record as record_lib
from cbert_jax.scaling import chinchilla, fit
from cbert_jax.scaling import laws as laws_lib
from tests import members

SIZES = ("d32L2", "d64L2", "d96L3", "d128L3")
# A few optimiser starts near the planted surface keep these tests fast: the start grid's search
# is chinchilla.py's business (tested there).
STARTS = [(6.0, 6.8, 0.4, 0.35, 0.3), (5.5, 7.0, 0.5, 0.3, 0.35)]


# --------------------------------------------------------------- the report, synthetic sweep ---
def _member(
  root,
  name,
  model,
  size,
  n,
  compute,
  tokens,
  probes,
  tps,
  curve,
  cms=True,
  seed=0,
  val_full=None,
  half_curve=None,
  batch=4,
  lr=1e-3,
  finished=True,
):
  """A member workdir. probes: (ridge, knn, retrieval) or {probe: score} (with "logreg"); curve:
  (tokens, eval/loss) rows every 10 steps (the last at total_steps); val_full: the full-split
  record's loss (None: no record); half_curve: val_full/half_loss rows at the same steps."""
  steps = len(curve) * 10
  config = members.member_config(
    model=model,
    size=size,
    total_steps=steps,
    batch_size=batch,
    seq_len=32,
    lr=lr,
    cms=cms,
    seed=seed,
    sweep={"n_params": n, "compute": compute, "tokens": tokens},
  )
  rows = [
    {"step": 10 * (i + 1), "tokens_seen": t, "eval/loss": l}
    for i, (t, l) in enumerate(curve if finished else curve[:-1])
  ]
  for r, (_, h) in zip(rows, half_curve or []):
    r["val_full/half_loss"] = h
  rows += [{"step": s, "perf/tokens_per_sec": tps, "perf/mfu": 0.3} for s in (5, 15, 25)]
  if not isinstance(probes, dict):
    probes = dict(zip(("ridge", "knn", "retrieval"), probes))
  cls = {"kind": "classification", "metric": "accuracy", "headline_split": "test"}
  cls |= {k: {"test": v} for k, v in probes.items() if k != "retrieval"}
  results = {"cls": cls}
  if "retrieval" in probes:
    results["retr"] = {
      "kind": "retrieval",
      "metric": "ndcg@10",
      "test": {"ndcg@10": probes["retrieval"]},
    }
  members.write_member(
    root / name,
    config,
    rows=rows,
    val_full={steps: val_full} if val_full is not None and finished else None,
    probes={steps: results} if finished else None,
  )


def test_report_on_a_synthetic_sweep_states_the_four_claims_with_the_planted_numbers(tmp_path):
  root = tmp_path / "sweep"
  tokens = np.geomspace(1e5, 1e7, 12)
  for i, size in enumerate(SIZES):
    c = 1e12 * 10**i  # one decade of compute per size
    loss = 2.0 + 50 * c**-0.1  # falls with compute
    # planted: BERT's ridge falls 0.02 per decade; CrossBERT's rises 0.03 per decade
    _member(
      root,
      f"bert_{size}",
      "bert",
      size,
      10 ** (5 + i),
      c,
      int(tokens[-1]),
      (0.6 - 0.02 * i, 0.5 - 0.01 * i, 0.1),
      2000.0,
      [(t, loss + 1 / np.log(t)) for t in tokens],
      val_full=loss,
    )
    _member(
      root,
      f"crossbert_{size}",
      "crossbert",
      size,
      10 ** (5 + i),
      c * 1.5,
      int(tokens[-1]),
      (0.6 + 0.03 * i, 0.5 + 0.02 * i, 0.1 + 0.01 * i),
      1000.0,
      [(t, 2.0 + 30 * t**-0.3) for t in tokens],
      val_full=2.0 + 40 * (1.5 * c) ** -0.08,
    )
  # the no-CMS control reaches each loss with exactly twice the tokens
  _member(
    root,
    "crossbert-nocms_d96L3",
    "crossbert",
    "d96L3",
    10**7,
    1e14,
    int(tokens[-1]),
    (0.5, 0.4, 0.05),
    1500.0,
    [(t, 2.0 + 30 * (t / 2) ** -0.3) for t in tokens],
    cms=False,
    val_full=2.0 + 30 * (tokens[-1] / 2) ** -0.3,
    batch=8,
  )
  command = f"python -m cbert_jax.report --sweep {root} --cms {tmp_path / 'cms'}"
  path = report.write(str(root), command=command)
  text = open(path).read()
  out = json.load(open(root / "report" / "report.json"))
  assert f"by `{command}`." in text.splitlines()[2]  # the whole command line, not only --sweep
  # claim 1: the analytic FLOPs-per-token ratio, not logged tokens/s
  assert out["flops_ratios"]["crossbert"]["per_size"] == {s: pytest.approx(1.5) for s in SIZES}
  assert out["flops_ratios"]["crossbert-nocms"]["per_size"] == {"d96L3": pytest.approx(1.0)}
  assert "CrossBERT+CMS/BERT d32L2 1.50x, d64L2 1.50x" in text
  need = out["flops_ratios"]["crossbert"]["mfu_ratio_for_paper_throughput"]
  assert need == pytest.approx([207 / 123 * 1.5] * 2) and f"reach {need[0]:.2f}x BERT's MFU" in text
  assert "python benchmarks/train_step.py" in text and "tokens/s median" not in text
  assert "not a benchmark" in text
  # the members' config.json name no laws: the report says so rather than naming any
  assert "LR and batch size from: set by hand (no laws) (bert, crossbert, crossbert-nocms)" in text
  assert out["cms_efficiency"]["ratio"] == pytest.approx(2.0, rel=0.03)
  assert re.search(r"without CMS needs (1\.9[7-9]|2\.0[0-3])x the training tokens", text)
  assert "confounded: the control trains with batch 8" in text
  assert out["probe_fits"]["bert"]["ridge"]["slope_per_decade"] == pytest.approx(-0.02)
  assert out["probe_fits"]["crossbert"]["ridge"]["slope_per_decade"] == pytest.approx(0.03)
  assert out["probe_fits"]["crossbert"]["ridge"]["spearman"] == pytest.approx(1.0)
  assert out["loss_fits"]["bert"]["saturating"]["beta"] == pytest.approx(0.1, rel=0.05)
  assert "ridge falling monotonically" in text
  assert "ridge rising monotonically" in text
  # no MFU anywhere; logreg has a column, "-" where it did not run; every loss is full-split
  header = next(line for line in text.splitlines() if line.startswith("| member |"))
  assert "MFU" not in header and "mfu" not in json.dumps(out["members"])
  assert header.split(" | ")[:2] == ["| member", "seed"] and "| ridge | logreg | kNN |" in header
  row = next(line for line in text.splitlines() if line.startswith("| bert_d32L2 |"))
  assert row.split(" | ")[8:12] == ["0.6", "-", "0.5", "0.1"]
  assert "†" not in text
  assert "What the fits do and do not support" in text and "Scale: N 1e+05-1e+08" in text
  assert out["chinchilla"]["bert"]["fitted"] is False  # one D for every member: no surface
  for png in ("loss_vs_flops", "probes_vs_flops", "flops_per_token", "cms_efficiency"):
    assert (root / "report" / f"{png}.png").stat().st_size > 10_000
  assert not (root / "report" / "throughput.png").exists()


def test_report_names_the_directory_when_there_is_nothing_to_read(tmp_path, capsys):
  assert report_cli.main(["--sweep", str(tmp_path / "nope")]) == 2
  assert "no such directory" in capsys.readouterr().err
  (tmp_path / "empty").mkdir()
  assert report_cli.main(["--sweep", str(tmp_path / "empty")]) == 2
  assert "holds no member workdirs" in capsys.readouterr().err


# ------------------------------------------------------------------- seeds, val_full, probes ---
def _two_seed_sweep(root):
  """BERT and CrossBERT at 4 sizes x seeds 0 and 1, D = 20 N; planted losses and probe scores
  per (size, seed). bert_d32L2_s1 has no full-split record (eval/loss only); crossbert_d128L3_s1
  is unfinished. Returns {(arch, size, seed): (compute, loss, {probe: score})}."""
  planted = {}
  tokens = np.geomspace(1e4, 1e6, 5)
  for i, size in enumerate(SIZES):
    n = 10 ** (4 + i)
    for arch, fpt in (("bert", 9.0), ("crossbert", 20.0)):
      for seed in (0, 1):
        c = fpt * n * 20 * n
        loss = 3.0 + 40 * c**-0.12 * (1 + 0.03 * seed * (i + 1))
        probes = {
          "ridge": 0.40 + (0.02 if arch == "crossbert" else -0.01) * i + 0.004 * seed * i,
          "logreg": 0.50 + 0.015 * i - 0.003 * seed * (i % 2),
          "knn": 0.30 + 0.01 * i + 0.002 * seed,
          "retrieval": 0.05 + 0.01 * i * (seed + 1),
        }
        name = f"{arch}_{size}" + (f"_s{seed}" if seed else "")
        eval_final = loss + 0.5  # the trainer's eval/loss differs from the full split
        no_val_full = name == "bert_d32L2_s1"
        finished = name != "crossbert_d128L3_s1"
        _member(
          root,
          name,
          arch,
          size,
          n,
          c,
          20 * n,
          probes,
          1000.0,
          [(t, eval_final + 1.0 - 0.2 * j) for j, t in enumerate(tokens[:-1])]
          + [(tokens[-1], eval_final)],
          seed=seed,
          val_full=None if no_val_full else loss,
          finished=finished,
        )
        if finished:
          planted[(arch, size, seed)] = (c, eval_final if no_val_full else loss, probes)
  return planted


def _no_plots(monkeypatch):
  """The figures are drawn (and checked) by the first test; the others skip them for time."""
  for name in ("plot_loss", "plot_probes", "plot_flops_per_token", "plot_cms"):
    monkeypatch.setattr(report, name, lambda *a, **k: None)


def test_seeds_are_grouped_per_size_and_fits_use_the_seed_means(tmp_path, monkeypatch):
  _no_plots(monkeypatch)
  root = tmp_path / "sweep"
  planted = _two_seed_sweep(root)
  path = report.write(str(root), n_boot=0)
  text = open(path).read()
  out = json.load(open(root / "report" / "report.json"))
  groups = {(g["arch"], g["size"]): g for g in out["groups"]}
  for arch in ("bert", "crossbert"):
    for size in SIZES:
      g = groups[(arch, size)]
      pts = [planted[(arch, size, s)] for s in (0, 1) if (arch, size, s) in planted]
      assert g["seeds"] == [s for s in (0, 1) if (arch, size, s) in planted]
      assert g["loss"]["mean"] == pytest.approx(np.mean([p[1] for p in pts]), rel=1e-12)
      assert [v for _, v in g["loss"]["values"]] == pytest.approx([p[1] for p in pts])
      for key in report_fits.PROBES:
        assert g["probes"][key]["mean"] == pytest.approx(np.mean([p[2][key] for p in pts]))
        assert [v for _, v in g["probes"][key]["values"]] == pytest.approx([p[2][key] for p in pts])
  assert groups[("crossbert", "d128L3")]["missing_seeds"] == [1]
  # the primary exponent: an independent polyfit on the log seed means; per seed: on each seed
  for arch in ("bert", "crossbert"):
    sizes = [s for s in SIZES if (arch, s, 0) in planted]
    c = [planted[(arch, s, 0)][0] for s in sizes]
    means = [np.mean([planted[k][1] for k in planted if k[:2] == (arch, s)]) for s in sizes]
    lf = out["loss_fits"][arch]
    assert lf["power_law"]["alpha"] == pytest.approx(np.polyfit(np.log(c), np.log(means), 1)[0])
    for r in lf["per_seed"]:
      ks = [k for k in planted if k[0] == arch and k[2] == r["seed"]]
      cs, ls = [planted[k][0] for k in ks], [planted[k][1] for k in ks]
      assert r["alpha"] == pytest.approx(np.polyfit(np.log(cs), np.log(ls), 1)[0])
      assert r["n_points"] == len(ks)
    assert [r["seed"] for r in lf["per_seed"]] == [0, 1]
    for key in report_fits.PROBES:
      t = out["probe_fits"][arch][key]
      pm = [np.mean([planted[k][2][key] for k in planted if k[:2] == (arch, s)]) for s in sizes]
      assert t["slope_per_decade"] == pytest.approx(np.polyfit(np.log10(c), pm, 1)[0])
      for r in t["per_seed"]:
        ks = [k for k in planted if k[0] == arch and k[2] == r["seed"]]
        want = np.polyfit(
          np.log10([planted[k][0] for k in ks]), [planted[k][2][key] for k in ks], 1
        )
        assert r["slope_per_decade"] == pytest.approx(want[0])
  assert out["loss_fits"]["crossbert"]["partial"] == ["d128L3 (no seed 1)"]
  assert "Sizes with only some seeds (fitted on those): d128L3 (no seed 1)" in text
  # the text: spreads and per-seed exponents, logreg in the verdict
  g = groups[("bert", "d64L2")]
  vals = ", ".join(format(v, ".4g") for _, v in g["loss"]["values"])
  assert (
    f"| bert | d64L2 | 0.100M | {g['compute']:.3g} | 0, 1 | {g['loss']['mean']:.4g} | {vals} |"
    in text
  )
  alphas = out["loss_fits"]["bert"]["per_seed"]
  assert f"per seed: seed 0: {alphas[0]['alpha']:.3f}, seed 1: {alphas[1]['alpha']:.3f}" in text
  assert "logreg rising" in text and "logreg" in out["probe_fits"]["crossbert"]
  # the full-split loss wins over eval/loss; the member without it is marked
  member = {m["name"]: m for m in out["members"]}
  assert member["bert_d64L2"]["final_loss"] == pytest.approx(planted[("bert", "d64L2", 0)][1])
  assert member["bert_d64L2"]["final_eval_loss"] == pytest.approx(
    member["bert_d64L2"]["final_loss"] + 0.5
  )
  assert member["bert_d32L2_s1"]["loss_source"] == "eval_loss"
  row = next(line for line in text.splitlines() if line.startswith("| bert_d32L2_s1 |"))
  assert f"| {member['bert_d32L2_s1']['final_loss']:.4g}† |" in row
  assert "† eval/loss on the first rows of the split, not the full split." in text
  row = next(line for line in text.splitlines() if line.startswith("| bert_d64L2 |"))
  assert "†" not in row
  assert not member["crossbert_d128L3_s1"]["finished"]
  # D = 20 N for every member: the loss surface is not fitted, and says why
  assert out["chinchilla"]["bert"]["reason"].startswith("D/N is 20 at every point, so A/N^alpha")


def test_a_sweep_of_two_sizes_gets_slopes_but_no_intervals(tmp_path, monkeypatch):
  # A sweep cut short at 2 sizes: a line through 2 points has no interval (its bootstrap would
  # be one line, zero width), and the report says so rather than "excludes 0".
  _no_plots(monkeypatch)
  root = tmp_path / "sweep"
  _two_seed_sweep(root)
  for d in root.iterdir():
    if not d.name.split("_")[1].startswith(("d32L2", "d64L2")):
      shutil.rmtree(d)
  text = open(report.write(str(root), n_boot=0)).read()
  out = json.load(open(root / "report" / "report.json"))
  for arch in ("bert", "crossbert"):
    p = out["loss_fits"][arch]["power_law"]
    assert p["n_points"] == 2 and p["alpha_ci"] is None and p["alpha_t_ci"] is None
    assert all(t["slope_ci"] is None for t in out["probe_fits"][arch].values())
  assert (
    "BERT's loss exponent" in text and "is not defined (2 sizes: a slope through 2 points)" in text
  )
  assert "excludes 0" not in text
  assert "\n* No interval (fewer than 3 sizes): BERT ridge" in text


def test_the_laws_the_members_used_are_shown_with_intervals_range_override_and_plots(
  tmp_path, monkeypatch
):
  _no_plots(monkeypatch)
  root = tmp_path / "sweep"
  _two_seed_sweep(root)
  # A fitted laws file per family ("{model}"), with its grid runs and plots beside it; BERT's
  # fitted with a check overridden. crossbert_d32L2 set its LR and batch by hand: no law.
  laws_dir = tmp_path / "laws"
  for model, runs, over in (
    ("bert", (1e9, 4e9, 2e10), ("implausible",)),
    ("crossbert", (1e9, 1e10), ()),
  ):
    law = fit.fit_power_law_ci([1e9, 4e9, 2e10, 5e10], [1e-3, 9e-4, 8e-4, 7.5e-4])
    laws = laws_lib.HyperLaws(
      lr=law,
      batch_tokens=fit.PowerLaw(a=0.5, alpha=0.3, n_points=3),
      source=f"fit: grid_{model} (3 sizes)"
      + ("; checks overridden: implausible (reason: because)" if over else ""),
      provenance={
        "runs": [{"compute": c, "n_params": 1} for c in runs],
        "override_reason": "because" if over else "",
        "tokens_per_param": 5.0 if model == "bert" else 20.0,  # the grid's budget
      },
      overridden=over,
    )
    path = laws_dir / f"{model}.json"
    laws_lib.save(str(path), laws)
    for plot in grid_lib.plot_paths(str(path)):
      open(plot, "wb").write(b"png")
  for d in root.iterdir():
    cfg = record_lib.read_config(str(d))
    cfg["sweep"]["laws"] = str(laws_dir / "{model}.json")
    cfg["sweep"]["tokens_per_param"] = 20.0
    if d.name == "crossbert_d32L2":
      cfg["sweep"]["lr"], cfg["sweep"]["batch_size"] = 1e-3, 4
    members.write_config(str(d), cfg)
  path = report.write(str(root), n_boot=0)
  text = open(path).read()
  out = json.load(open(root / "report" / "report.json"))
  entries = {e["spec"]: e for e in out["laws"]}
  bert, cross = entries[str(laws_dir / "bert.json")], entries[str(laws_dir / "crossbert.json")]
  assert bert["families"] == ["bert"] and cross["families"] == ["crossbert"]
  assert bert["fitted_compute"] == [1e9, 2e10] and cross["fitted_compute"] == [1e9, 1e10]
  # the members that used each law: CrossBERT's hand-set d32L2 is not among them
  used = {
    a: [m["compute"] for m in out["members"] if m["arch"] == a and m["name"] != "crossbert_d32L2"]
    for a in ("bert", "crossbert")
  }
  assert bert["used_compute"] == [min(used["bert"]), max(used["bert"])]
  assert cross["used_compute"] == [min(used["crossbert"]), max(used["crossbert"])]
  want = bert["laws"]["lr"]
  assert (
    f"| lr* vs C | {want['a']:.4g} | {want['alpha']:+.3f} | [{want['alpha_ci'][0]:+.3f}, "
    f"{want['alpha_ci'][1]:+.3f}] | [{want['alpha_t_ci'][0]:+.3f}, {want['alpha_t_ci'][1]:+.3f}] | 4 |"
    in text
  )
  assert (
    "* Refused by default; fitted with check(s) implausible overridden (reason: because)." in text
  )
  assert text.count("Refused by default") == 1 and "Source: fit: grid_bert (3 sizes)." in text
  assert f"({max(used['bert']) / 2e10:.2g}x the largest fitted C at most)" in text
  # The budget the laws' grid trained at against the members': BERT's laws were used 4x away.
  assert bert["tokens_per_param"] == 5.0 and cross["tokens_per_param"] == 20.0
  assert (
    "* Fitted on a grid trained at 5 tokens per parameter; the members that used it train at 20, "
    "more than 1.5x away: the optimal batch and LR move with the budget" in text
  )
  assert (
    "* Fitted on a grid trained at 20 tokens per parameter; the members that used it train at 20.\n"
    in text
  )
  for name in ("laws_bert.png", "laws_bert_grid.png", "laws_crossbert.png"):
    assert (root / "report" / name).read_bytes() == b"png" and f"![{name}]({name})" in text
  # A laws plot that is missing: the grid plot keeps its own name.
  (laws_dir / "crossbert.png").unlink()
  (root / "report" / "laws_crossbert.png").unlink()
  text = open(report.write(str(root), n_boot=0)).read()
  assert "laws_crossbert.png" not in text and "![laws_crossbert_grid.png]" in text
  # A laws file that has gone since the sweep ran: named, its source only.
  (laws_dir / "crossbert.json").unlink()
  text = open(report.write(str(root), n_boot=0)).read()
  assert "Not readable now (sweep.laws: no such file" in text


def test_seed_spread_with_more_than_two_seeds_is_the_sample_sd():
  sp = report_fits.spread([(0, 1.0), (1, 2.0), (2, 4.0)])
  assert (sp["mean"], sp["sd"]) == (pytest.approx(7 / 3), pytest.approx(np.std([1, 2, 4], ddof=1)))
  assert report._spread(sp) == f"sd {np.std([1, 2, 4], ddof=1):.4g}"
  assert report._spread(report_fits.spread([(0, 1.0), (1, 2.0)])) == "1, 2"


# ----------------------------------------------------------------------- CMS sample efficiency ---
def test_cms_levels_cover_the_whole_shared_range_and_ratios_are_exact(tmp_path):
  """Losses linear in log tokens (log-linear interpolation is exact): the no-CMS runs reach every
  loss with k x the tokens (seed 0: 2x on val_full/half_loss, while eval/loss says 5x; seed 1:
  3x on eval/loss)."""
  root = tmp_path / "sweep"
  tokens = np.geomspace(1e5, 1e7, 12)
  curve = lambda k: [(t, 12.0 - 0.5 * np.log(t / k)) for t in tokens]  # noqa: E731
  for seed, k_eval, k_half in ((0, 5.0, 2.0), (1, 3.0, None)):
    s = f"_s{seed}" if seed else ""
    for arch, k_e, k_h, cms in (
      ("crossbert", 1.0, 1.0, True),
      ("crossbert-nocms", k_eval, k_half, False),
    ):
      _member(
        root,
        f"{arch}_d96L3{s}",
        "crossbert",
        "d96L3",
        10**6,
        2e14 if cms else 1e14,
        int(tokens[-1]),
        (0.5, 0.4, 0.1),
        1000.0,
        curve(k_e),
        cms=cms,
        seed=seed,
        val_full=curve(k_e)[-1][1],
        half_curve=curve(k_h) if k_h else None,
        batch=4 if cms else 6,
        lr=1e-3 if cms else 2e-3,
      )
  eff = report_fits.cms_efficiency(report_fits.read_sweep(str(root)))
  for pair, k, metric in zip(eff["pairs"], (2.0, 3.0), ("val_full/half_loss", "eval/loss")):
    a, b = curve(1.0), curve(k)
    top, bottom = min(a[0][1], b[0][1]), max(a[-1][1], b[-1][1])
    assert pair["metric"] == metric
    assert pair["levels"] == pytest.approx(list(np.linspace(top, bottom, 10)))
    assert pair["ratios"] == pytest.approx([k] * 10)
    assert (pair["min"], pair["max"]) == (pytest.approx(k), pytest.approx(k))
    assert pair["flops_ratio"] == pytest.approx(k * 0.5)  # no CMS: half the FLOPs per token
  assert eff["ratio"] == pytest.approx(2.5) and eff["confounded"]
  text = report.claim_cms(eff, None)
  assert "median over 10 loss levels evenly spaced over the whole range" in text
  assert "seed 0 2.00x, seed 1 3.00x" in text and "experiments/cms_control.py" in text


def test_the_controlled_cms_summary_is_quoted_when_given(tmp_path):
  """Claim 2 quotes the verdict sentences `python -m cbert_jax.report.cms` wrote into cms.json
  (its own schema; tests/report/test_cms.py builds one from runs), and points at cms.md without them."""
  d = tmp_path / "cms"
  d.mkdir()
  verdict = ["d64L2: CMS reaches the shared loss levels with 1.8x fewer tokens.", "d64L2: probes."]
  (d / "cms.json").write_text(json.dumps({"sizes": [], "verdict": verdict}))
  c = report_fits.read_cms_dir(str(d))
  assert c["found"] and c["lines"] == verdict
  text = report.claim_cms(None, c)
  assert "from the controlled experiment" in text and " ".join(verdict) in text
  assert text.endswith(f"Details: {d}/cms.md.")
  (d / "cms.json").write_text(json.dumps({"whatever": [1, 2]}))
  assert f"see {d}/cms.md" in report.claim_cms(None, report_fits.read_cms_dir(str(d)))
  (d / "cms.json").write_text("{not json")
  assert "no readable cms.json" in report.claim_cms(None, report_fits.read_cms_dir(str(d)))
  text = report.claim_cms(None, report_fits.read_cms_dir(str(tmp_path / "none")))
  assert "see " in text and "no readable cms.json" in text


# ------------------------------------------------------------------------- the loss surface ---
TRUE = chinchilla.LossSurface(E=1.5, A=400.0, alpha=0.35, B=900.0, beta=0.3)


def _points(loss_of):
  n, d = (a.ravel() for a in np.meshgrid(np.geomspace(1e5, 1e7, 4), np.geomspace(1e6, 1e8, 4)))
  return [
    {
      "source": "sweep",
      "name": f"p{i}",
      "arch": "bert",
      "n": a,
      "d": b,
      "loss": float(loss_of(a, b)),
      "compute": 8.0 * a * b,
      "metric": "val_full",
    }
    for i, (a, b) in enumerate(zip(n, d))
  ]


def test_the_loss_surface_recovers_a_planted_one_and_allocates_by_it():
  r = loss_surface.fit_family(_points(TRUE), n_boot=4, starts=STARTS)
  assert r["usable"] and r["problems"] == [] and r["points"] == 16
  assert (r["alpha"], r["beta"]) == (pytest.approx(0.35, abs=0.01), pytest.approx(0.3, abs=0.01))
  assert r["E"] == pytest.approx(1.5, rel=0.02) and r["k"] == pytest.approx(8.0)
  assert set(r["intervals"]) == {"A", "B", "E", "alpha", "beta"}
  law = chinchilla.LossSurface(E=r["E"], A=r["A"], alpha=r["alpha"], B=r["B"], beta=r["beta"])
  assert r["c_largest"] == pytest.approx(8.0 * 1e7 * 1e8)
  for a, s in zip(r["allocation"], (1, 10, 100)):
    n_opt, d_opt = law.optimal(r["c_largest"] * s, 8.0)
    assert (a["n_opt"], a["d_opt"]) == (pytest.approx(n_opt), pytest.approx(d_opt))
    assert a["d_per_n"] == pytest.approx(d_opt / n_opt)
  lines = "\n".join(loss_surface.markdown({"bert": r | {"grid": None}}))
  assert (
    "compute-optimal allocation" in lines and f"N_opt {r['allocation'][0]['n_opt']:.3g}" in lines
  )
  assert loss_surface.AT_BOUND not in lines  # no interval reaches the optimiser's bounds
  # An interval end at the optimiser's bound (alpha's upper 3, E's lower e^-10) is marked, once
  # per end, with the footnote; an end near but not at it is not.
  cut = r | {"grid": None, "intervals": r["intervals"] | {"alpha": [0.2, 3.0], "E": [4.54e-5, 1.0]}}
  lines = "\n".join(loss_surface.markdown({"bert": cut}))
  assert "[0.200, 3.000\u2020]" in lines and "[4.54e-05\u2020, 1]" in lines
  assert "\u2020 an interval end at the optimiser's bound" in lines
  near = r | {"grid": None, "intervals": r["intervals"] | {"alpha": [0.2, 2.9]}}
  assert loss_surface.AT_BOUND not in "\n".join(loss_surface.markdown({"bert": near}))


def test_an_unusable_surface_is_refused_with_its_problems():
  r = loss_surface.fit_family(_points(lambda n, d: 2.0 + 400 * n**-0.35), n_boot=0, starts=STARTS)
  assert r["fitted"] and not r["usable"] and r["problems"] and "allocation" not in r
  lines = "\n".join(loss_surface.markdown({"bert": r | {"grid": None}}))
  assert "allocation refused: " + "; ".join(r["problems"]) in lines
  assert "N_opt" not in lines


# The planted surface with B = 500: its compute-optimal D/N at the largest member's C is ~13,
# inside the points' D/N 5-20; TRUE's (B = 900) is ~80, 4x past it (> the 2x margin).
IN_RANGE = dataclasses.replace(TRUE, B=500.0)


@pytest.mark.parametrize("law", [IN_RANGE, TRUE], ids=["optimum_inside", "optimum_outside"])
def test_grid_optima_join_the_sweep_in_the_surface_fit(tmp_path, monkeypatch, law):
  """Sweep members at D = 20 N, the grid's best member per size at D = 5 N (a worse one beside
  it), losses from the planted surface: the fit uses sweep + optima, recovers the surface and
  writes it for the planner; its allocation is given when the optimum's D/N lies within the
  points' D/N (closed form on the fitted law) and refused, naming the factor, when not."""
  _no_plots(monkeypatch)
  root, grid = tmp_path / "sweep", tmp_path / "grid"
  for i, (size, m) in enumerate(zip(SIZES, (1000, 2500, 6250, 15626))):
    n = 64 * m  # the grid's D = 5 N = steps x rows x 32 with rows 10 or 20
    d = 20 * n
    _member(
      root,
      f"bert_{size}",
      "bert",
      size,
      n,
      8.0 * n * d,
      d,
      (0.5, 0.4, 0.1),
      1.0,
      [(d / 2, 9.0), (d, 8.0)],
      val_full=float(law(n, d)),
    )
    for j, extra in enumerate((0.0, 0.3)):
      if i == 3:
        continue  # the grid has 3 sizes
      steps, rows = m // (j + 1), 10 * (j + 1)
      config = members.member_config(
        size=size,
        total_steps=steps,
        batch_size=rows,
        seq_len=32,
        sweep={"n_params": n, "compute": 8.0 * n * 5 * n},
      )
      members.write_member(
        grid / f"bert_{size}_b{j}",
        config,
        rows=[{"step": steps, "train/loss": 5.0}],
        val_full={steps: float(law(n, 5 * n)) + extra},
      )
  starts = [(6.0, float(np.log(law.B)), 0.4, 0.35, 0.3), *STARTS]  # one near each planted law
  path = report.write(str(root), grid=str(grid), n_boot=2, chinchilla_starts=starts)
  out = json.load(open(root / "report" / "report.json"))
  r = out["chinchilla"]["bert"]
  assert (r["points"], r["sweep_points"], r["grid_points"]) == (7, 4, 3)
  assert {p["name"] for p in r["point_list"] if p["source"] == "grid"} == {
    f"bert_{s}_b0" for s in SIZES[:3]
  }
  assert r["fitted"] and r["d_per_n"][1] / r["d_per_n"][0] > 2
  text = open(path).read()
  assert (
    "## Loss surface L(N, D)" in text and "plus the hyperparameter grid's optimum per size" in text
  )
  assert r["alpha"] == pytest.approx(0.35, abs=0.01) and r["B"] == pytest.approx(law.B, rel=0.05)
  got = chinchilla.LossSurface(E=r["E"], A=r["A"], alpha=r["alpha"], B=r["B"], beta=r["beta"])
  assert r["c_largest"] == pytest.approx(max(p["compute"] for p in r["point_list"]))
  n_opt, d_opt = got.optimal(r["c_largest"], r["k"])
  lo, hi = r["d_per_n"]
  assert (lo, hi) == (pytest.approx(5.0), pytest.approx(20.0))
  if law is IN_RANGE:
    assert lo / 2 < d_opt / n_opt < hi * 2 and r["usable"], r["problems"]
    for a, s in zip(r["allocation"], (1, 10, 100)):
      assert [a["n_opt"], a["d_opt"]] == pytest.approx(got.optimal(s * r["c_largest"], r["k"]))
    assert f"N_opt {r['allocation'][2]['n_opt']:.3g}" in text
  else:
    assert d_opt / n_opt > hi * 2 and not r["usable"] and "allocation" not in r
    assert r["problems"] == [
      f"the compute-optimal D/N at C = {r['c_largest']:.3g} is {d_opt / n_opt:.3g}, "
      f"{d_opt / n_opt / hi:.3g}x outside the D/N 5-20 the runs span (margin 2x): the N-vs-D "
      "trade-off there is extrapolated, not measured"
    ]
    assert "bert: allocation refused: the compute-optimal D/N" in text
  # The surface file: the fit as reported, its problems, where it came from.
  path_s = root / "report" / "surface_bert.json"
  assert r["surface_file"] == str(path_s) and "`surface_bert.json` for" in text
  saved = chinchilla.load(str(path_s), allow_unusable=True)
  assert saved.fit.law == got and saved.k == r["k"] and saved.fit.problems == r["problems"]
  assert saved.provenance["d_per_n"] == r["d_per_n"] and saved.provenance["family"] == "bert"
  assert saved.provenance["grid"] == str(grid) and len(saved.provenance["points"]) == 7
  assert saved.fit.draws is not None and len(saved.fit.draws) == 2  # n_boot
  assert report_cli.main(["--sweep", str(root), "--grid", str(tmp_path / "nogrid")]) == 2


def test_the_cli_prints_a_progress_line_per_stage_with_counts_and_elapsed(
  tmp_path, monkeypatch, capsys
):
  _no_plots(monkeypatch)
  root = tmp_path / "sweep"
  _two_seed_sweep(root)
  assert report_cli.main(["--sweep", str(root), "--n_boot", "0"]) == 0
  err = capsys.readouterr().err.splitlines()
  stages = [line for line in err if re.match(r"report \[\d+/\d+\] ", line)]
  # read, fits, the loss surfaces, plots, laws, files: 6 stages (no grid), in order
  numbers = [int(re.match(r"report \[(\d+)/6\]", line)[1]) for line in stages]
  assert numbers == sorted(numbers) and set(numbers) == set(range(1, 7))
  assert any(re.search(r"reading the sweep .*: member 16/16 \(\d+ s\)$", line) for line in stages)
  assert re.match(r"report written: .*report\.md \(\d+ s\)$", err[-1])
  assert report_cli.main(["--sweep", str(root), "--n_boot", "0", "--quiet"]) == 0
  assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("report")]
