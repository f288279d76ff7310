"""The full-split validation metric (cbert_jax/run/validation.py): one number per run, independent of
batch size and device count, equal to a plain per-row loop, nested target sets across families,
and the same file from the trainer's end of run and from the CLI."""

import dataclasses
import json
import os
import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax.data import prepare, settings
from cbert_jax.models import masking
from cbert_jax.run import metrics as metrics_lib
from cbert_jax.run import trained, validation


def _val_rows(run) -> dict:
  return prepare.prepare(settings.data_config(run.config), run.config.data.seq_len).val


def _metric(run, rows, batch_size):
  return validation.full_split_loss(
    run.graphdef,
    run.params,
    rows,
    mesh=run.mesh,
    rules=run.rules,
    batch_size=batch_size,
    model_name=run.model_name,
  )


def _per_row_reference(run, rows) -> dict:
  """A plain loop: every row alone (a batch of one, its split index as row id), one device,
  the sums added in float64, then divided once."""
  key = validation.family_key(run.model_name)

  @jax.jit
  def sums(params, batch):  # {False: the model's loss, True: the no-CMS form at ratio 0.5}
    model = nnx.merge(run.graphdef, params)
    own = model.loss_sums(batch, key)[0]
    model.mask_cfg = dataclasses.replace(model.mask_cfg, cms=False, mask_ratio=0.5)
    return {False: own, True: model.loss_sums(batch, key)[0]}

  tot = {False: np.zeros(3), True: np.zeros(3)}  # CE, hits, targets
  for r in range(len(rows["tokens"])):
    batch = {k: jnp.asarray(rows[k][r : r + 1]) for k in ("tokens", "positions", "segment_ids")}
    for half, s in sums(run.params, batch | {"row_ids": jnp.array([r], jnp.int32)}).items():
      tot[half] += [float(s["loss"][0]), float(s["masked_acc"][0]), float(s["num_targets"][0])]
  return {
    h: {"loss": t[0] / t[2], "masked_acc": t[1] / t[2], "targets": t[2]} for h, t in tot.items()
  }


def test_independent_of_batch_size_and_devices_and_equal_to_a_per_row_loop(trained_run):
  w = trained_run("crossbert")  # CMS: the loss of both halves, and the `half` form
  run8, run1 = trained.load(w), trained.load(w, devices=jax.devices()[:1])
  rows = _val_rows(run8)
  n = len(rows["tokens"])
  assert n % 8 and n % 3  # every batch size below pads its last batch
  got = [_metric(run8, rows, 8), _metric(run8, rows, 16), _metric(run1, rows, 3)]
  assert [r.devices for r in got] == [8, 8, 1] and [r.batch_size for r in got] == [8, 16, 3]
  ref = _per_row_reference(run1, rows)
  for r in got:
    assert r.rows == n
    assert r.target_tokens == ref[False]["targets"]  # every maskable token (both halves)
    assert r.loss == pytest.approx(ref[False]["loss"], abs=1e-5)
    assert r.masked_acc == pytest.approx(ref[False]["masked_acc"], abs=1e-6)
    assert r.half["target_tokens"] == ref[True]["targets"]
    assert r.half["loss"] == pytest.approx(ref[True]["loss"], abs=1e-5)
  assert got[0].half["target_tokens"] < got[0].target_tokens
  # Another key draws other masks (the fixed key is what makes runs comparable).
  other = validation.full_split_loss(
    run1.graphdef,
    run1.params,
    rows,
    mesh=run1.mesh,
    rules=run1.rules,
    batch_size=3,
    model_name="crossbert",
    seed=1,
  )
  assert abs(other.loss - got[0].loss) > 1e-4


def test_the_families_targets_are_nested_row_by_row(trained_run):
  """One per-row noise for every family: ELECTRA's targets <= BERT's <= CrossBERT-noCMS's, and
  the CMS view that predicts the low-noise half has exactly the no-CMS targets in the rows where
  that half holds no special or padding token."""
  runs = {m: trained.load(trained_run(m), devices=jax.devices()[:1]) for m in ("bert", "electra")}
  runs["crossbert"] = trained.load(trained_run("crossbert"), devices=jax.devices()[:1])
  rows = _val_rows(runs["bert"])
  ids = np.arange(len(rows["tokens"]), dtype=np.int32)
  batch = {k: jnp.asarray(rows[k]) for k in ("tokens", "positions", "segment_ids")}
  batch["row_ids"] = jnp.asarray(ids)

  def forward(name, **mask_changes):  # the target positions and weights only: the encoders
    run = runs[name]  # and heads are dead code under jit

    @jax.jit
    def indices(params):
      model = nnx.merge(run.graphdef, params)
      model.mask_cfg = dataclasses.replace(model.mask_cfg, **mask_changes)
      out = model.forward(batch, validation.family_key(name))
      return {k: out[k] for k in ("masked_idx", "query_idx", "weights") if k in out}

    with jax.set_mesh(run.mesh), nnx.logical_axis_rules(run.rules):
      return jax.device_get(indices(run.params))

  targets = lambda idx, w: [set(np.asarray(i)[np.asarray(x) > 0]) for i, x in zip(idx, w)]
  e, b = forward("electra"), forward("bert")
  no_cms = forward("crossbert", cms=False, mask_ratio=0.5)
  cms = forward("crossbert")
  t_e = targets(e["masked_idx"], e["weights"])
  t_b = targets(b["masked_idx"], b["weights"])
  t_n = targets(no_cms["query_idx"], no_cms["weights"])
  t_c = targets(cms["query_idx"][1::2], cms["weights"][1::2])  # view 1: predicts the low half
  can = np.asarray(
    masking.maskable(batch["tokens"], batch["segment_ids"], runs["bert"].tokenizer.special_ids)
  )
  exact = 0
  for r in range(len(ids)):
    assert t_e[r] <= t_b[r] <= t_n[r], r
    assert t_c[r] <= t_n[r], r
    low_half = np.asarray(cms["query_idx"][2 * r + 1])
    if can[r, low_half].all():
      assert t_c[r] == t_n[r], r
      exact += 1
  assert exact > 0


def _copy_run(src: str, dst: str) -> str:
  shutil.copytree(src, dst)
  shutil.rmtree(os.path.join(dst, "eval"), ignore_errors=True)
  return dst


def test_cli_matches_the_trainer_skips_when_done_and_covers_a_root(trained_run, tmp_path, capsys):
  root = tmp_path / "grid"
  runs = {m: trained_run(m) for m in ("bert", "electra")}
  for m, w in runs.items():
    _copy_run(w, str(root / m))
  unfinished = _copy_run(runs["bert"], str(root / "more" / "bert_unfinished"))
  cfg_path = os.path.join(unfinished, "config.json")
  rec = json.load(open(cfg_path))
  rec["config"]["total_steps"] = 4  # its checkpoint is at step 2
  json.dump(rec, open(cfg_path, "w"))

  assert validation.main(["--root", str(root)]) == 0
  out = capsys.readouterr().out
  assert "full-split validation of 3 runs" in out and "not finished" in out
  assert not os.path.exists(os.path.join(unfinished, "eval"))
  for m, w in runs.items():
    with open(validation.output_path(w, 2)) as f:
      by_trainer = json.load(f)  # written by the trainer at the end of the fixture's run
    if m == "bert":
      by_trainer_bert = by_trainer
    with open(validation.output_path(str(root / m), 2)) as f:
      by_cli = json.load(f)
    assert set(by_cli) >= {
      "step",
      "loss",
      "masked_acc",
      "rows",
      "target_tokens",
      "mask_key",
      "definition",
      "seconds",
    }
    assert by_cli["step"] == 2 and by_cli["mask_key"] == validation.MASK_SEED
    for k in ("rows", "target_tokens", "mask_key", "definition", "model_name", "batch_size"):
      assert by_cli[k] == by_trainer[k], k
    for k in ("loss", "masked_acc"):
      assert by_cli[k] == pytest.approx(by_trainer[k], rel=1e-6, abs=1e-6), k  # 8 vs 2 devices
    assert by_cli["metrics"] == pytest.approx(by_trainer["metrics"], rel=1e-6, abs=1e-6)
    assert "half" not in by_cli
  electra = by_cli["metrics"]
  assert electra["loss"] == pytest.approx(electra["gen_loss"] + 50.0 * electra["disc_loss"])

  # During the run (val_full_every=1) the trainer wrote step 1's record and metrics row: the
  # same as the CLI's on the step-1 checkpoint.
  assert validation.main(["--workdir", str(root / "bert"), "--step", "1"]) == 0
  assert "step 1: val_full loss" in capsys.readouterr().out
  with open(validation.output_path(runs["bert"], 1)) as f:
    mid_trainer = json.load(f)
  with open(validation.output_path(str(root / "bert"), 1)) as f:
    mid_cli = json.load(f)
  assert mid_trainer["step"] == mid_cli["step"] == 1
  for k in ("loss", "masked_acc"):
    assert mid_cli[k] == pytest.approx(mid_trainer[k], abs=1e-6), k
  rows = metrics_lib.read_metrics(os.path.join(runs["bert"], "metrics.jsonl"))
  logged = {r["step"]: r["val_full/loss"] for r in rows if "val_full/loss" in r}
  assert logged == pytest.approx({1: mid_trainer["loss"], 2: by_trainer_bert["loss"]}, abs=1e-6)

  # A rerun computes nothing: the files are there (also for --workdir, with or without --step).
  assert validation.main(["--root", str(root)]) == 0
  assert capsys.readouterr().out.count(": already computed") == 2
  assert validation.main(["--workdir", str(root / "bert"), "--step", "2"]) == 0
  assert "already computed" in capsys.readouterr().out


def test_cli_refuses_data_whose_tokenizer_is_not_the_runs(
  trained_run, tmp_path, monkeypatch, capsys
):
  w = _copy_run(trained_run("bert"), str(tmp_path / "bert"))
  other = types.SimpleNamespace(tokenizer=types.SimpleNamespace(sha256="0" * 64), val=None)
  monkeypatch.setattr(validation, "_prepare", lambda config: other)
  assert validation.main(["--workdir", w]) == 2
  err = capsys.readouterr().err
  assert "tokenizer" in err and "is not the run's" in err
  assert not os.path.exists(validation.output_path(w, 2))
