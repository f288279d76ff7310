"""The trainer end to end on the tiny committed corpus: resume, sharding, one compile, NaN guard, errors."""

import json
import os

import numpy as np
import pytest

from cbert_jax import train
from cbert_jax.errors import ConfigError
from cbert_jax.run import metrics as metrics_lib
from tests.helpers import losses, tiny_config


@pytest.mark.parametrize("model", ["crossbert", "bert"])
def test_resumed_run_logs_the_same_losses(tmp_path, cache_dir, model):
  full = train.run(tiny_config(cache_dir, model), str(tmp_path / "full"))
  part = train.run(tiny_config(cache_dir, model, stop_after_step=3), str(tmp_path / "resumed"))
  assert part.stopped_early and part.final_step == 3
  resumed = train.run(tiny_config(cache_dir, model), str(tmp_path / "resumed"))
  assert resumed.final_step == 8 and full.final_step == 8
  a, b = losses(tmp_path / "full"), losses(tmp_path / "resumed")
  assert sorted(a) == sorted(b) == list(range(1, 9))  # no step lost or duplicated on resume
  for s in range(4, 9):
    assert a[s] == b[s], (s, a[s], b[s])
  assert full.eval == resumed.eval
  assert full.num_traces == 1  # the train step compiled once for 8 steps


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory, cache_dir):
  """The plain single-device run both sharded runs are compared with (the same run for each, so
  it is trained once per module): its summary and its {step: loss}."""
  workdir = tmp_path_factory.mktemp("single")
  summary = train.run(tiny_config(cache_dir, num_devices=1, total_steps=4), str(workdir))
  return summary, losses(workdir)


@pytest.mark.parametrize("memory_options", [{}, {"model.ce_chunk": 8, "model.remat": "dots"}])
def test_sharded_step_equals_single_device(tmp_path, cache_dir, memory_options, single_device_run):
  # The sharded run may also chunk the CE and recompute activations: still the plain run's losses.
  mesh_222 = tiny_config(
    cache_dir,
    **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "total_steps": 4, "num_devices": 0},
    **memory_options,
  )
  a = train.run(mesh_222, str(tmp_path / "sharded"))
  b, lb = single_device_run
  la = losses(tmp_path / "sharded")
  np.testing.assert_allclose([la[s] for s in range(1, 5)], [lb[s] for s in range(1, 5)], rtol=2e-5)
  np.testing.assert_allclose(a.eval["eval/loss"], b.eval["eval/loss"], rtol=2e-5)


def test_metrics_and_config_json(tmp_path, cache_dir):
  # 8 steps (tiny_config's): the programs of test_resumed_run_logs_the_same_losses[crossbert].
  train.run(tiny_config(cache_dir, log_every=2, eval_every=3), str(tmp_path))
  rows = metrics_lib.read_metrics(tmp_path / "metrics.jsonl")
  logged = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in logged] == [1, 2, 4, 6, 8]
  # eval_every need not be a multiple of log_every: steps 3 and 6 are evaluated, then the final
  # step
  evals = [r for r in rows if "eval/loss" in r]
  assert [r["step"] for r in evals] == [3, 6, 8] and evals[0]["tokens_seen"] == 3 * 8 * 32
  required = {
    "step",
    "train/loss",
    "train/masked_acc",
    "train/grad_norm",
    "train/lr",
    "tokens_seen",
    "flops_seen",
    "perf/tokens_per_sec",
    "perf/mfu",
    "time/compile_s",
    "time/data_wait_s",
  }
  assert required <= set(logged[-1])
  assert logged[-1]["tokens_seen"] == 8 * 8 * 32
  assert "eval/loss" in rows[-1]
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["config"]["model"]["vocab_size"] > 0 and saved["config"]["model"]["d_model"] == 32
  prov = saved["provenance"]
  assert len(prov["data_manifest_hash"]) >= 16 and "jax" in json.dumps(prov)
  assert saved["flops_per_token"] > 0
  assert os.listdir(tmp_path / "tb")
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "8"]


def test_planted_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, cache_dir):
  # Update 5 goes NaN; logs every 3 steps, checkpoints every 2: detected at the step-6 sync, but
  # the message names step 5, and checkpoint 6 is never written.
  cfg = tiny_config(
    cache_dir, checkpoint_every=2, log_every=3, total_steps=8, **{"faults.plant_nan_step": 5}
  )
  with pytest.raises(train.NonFiniteError, match="at step 5 .*last good checkpoint is step 4"):
    train.run(cfg, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
  report = json.loads((tmp_path / "diagnostics" / "step_5" / "report.json").read_text())
  assert report["reason"] == "non-finite" and not np.isfinite(report["metrics"]["loss"])
  assert any("blocks/1" in k for k in report["grad_norm_per_layer"])
  batch = np.load(tmp_path / "diagnostics" / "step_5" / "batch.npz")
  assert batch["tokens"].shape == (8, 32)


def _spike_run(tmp_path, cache_dir, mode, **kw):
  cfg = tiny_config(
    cache_dir,
    total_steps=14,
    checkpoint_every=4,
    log_every=2,
    **{
      "faults.spike": mode,
      "faults.warmup": 4,
      "faults.threshold": 4.0,
      "faults.plant_spike_batches": "9",
      **kw,
    },
  )
  summary = train.run(cfg, str(tmp_path / mode))
  rows = metrics_lib.read_metrics(os.path.join(tmp_path / mode, "metrics.jsonl"))
  return summary, {r["step"]: r for r in rows if "train/loss" in r}


def test_planted_spike_warn_skip_and_rollback(tmp_path, cache_dir):
  _, off = _spike_run(tmp_path, cache_dir, "off")
  _, warn = _spike_run(tmp_path, cache_dir, "warn")
  _, skip = _spike_run(tmp_path, cache_dir, "skip")
  roll, rolled = _spike_run(tmp_path, cache_dir, "rollback")
  # warn: same training as off (the update is kept), the spike counted and diagnosed.
  assert [warn[s]["train/loss"] for s in warn] == [off[s]["train/loss"] for s in off]
  assert warn[10]["train/spikes"] == 1 and off[10]["train/spikes"] == 1
  report = json.loads((tmp_path / "warn" / "diagnostics" / "step_9" / "report.json").read_text())
  assert report["metrics"]["loss_z"] > 6 and report["grad_norm_per_layer"]
  assert np.load(tmp_path / "warn" / "diagnostics" / "step_9" / "batch.npz")["tokens"].shape == (
    8,
    32,
  )
  # skip: the same training up to the spike (where(apply, new, old) keeps every update while there
  # is no spike), then the update of step 9 is not applied -> different after. The skip step is
  # another XLA program (the select), whose fusions may round differently in the last bits: a CI
  # run saw 6.1363525 against 6.1363530 at step 4, so "the same" is to float32 rounding (1e-5),
  # and "different" is 100x that.
  before = [(skip[s]["train/loss"], off[s]["train/loss"]) for s in (1, 2, 4, 6, 8)]
  np.testing.assert_allclose(*zip(*before), rtol=1e-5, atol=0)
  assert all(off[s]["train/spikes"] == 0 for s in (1, 2, 4, 6, 8, 12, 14))  # no false alarm
  assert skip[10]["train/skipped"] == 1 and off[10]["train/skipped"] == 0
  after = abs(skip[12]["train/loss"] - off[12]["train/loss"])
  assert after > 1e-3 * off[12]["train/loss"], after
  # rollback: back to checkpoint 8, batch 9 (global batch index 8) skipped, so the logged step
  # 10 is trained on the data of uninterrupted step 11: the weights differ but the run finishes.
  assert roll.final_step == 14 and rolled[8]["train/loss"] == off[8]["train/loss"]
  assert rolled[10]["train/spikes"] == 0 and rolled[10]["train/loss"] != off[10]["train/loss"]
  assert sorted(rolled) == sorted(off)  # the metrics file was rewound, no duplicate steps


def test_rollback_gives_up_after_max_rollbacks(tmp_path, cache_dir):
  with pytest.raises(
    train.NonFiniteError, match="loss spike at step 9: already rolled back 1 times"
  ):
    _spike_run(
      tmp_path,
      cache_dir,
      "rollback",
      **{"faults.plant_spike_batches": "9,10", "faults.max_rollbacks": 1},
    )


@pytest.mark.parametrize(
  "overrides,field",
  [
    ({"model_name": "gpt"}, "model_name"),
    ({"masking.mask_ratio": 1.5, "masking.cms": False}, "mask_ratio"),
    ({"masking.mask_ratio": 0.0, "masking.cms": False}, "mask_ratio"),
    ({"mesh.data": 3}, "mesh"),
    ({"batch_size": 12, "num_devices": 0}, "batch_size"),  # 8 devices
    ({"data.corpus_files": "/nonexistent/corpus.txt"}, "data.corpus_files"),
    ({"data.tokenizer_path": "/nonexistent/sp.model"}, "data.tokenizer_path"),
    ({"model.size": "d7L7"}, "model.size"),
  ],
)
def test_bad_input_fails_fast_with_the_field_named(
  tmp_path, cache_dir, overrides, field, monkeypatch
):
  prepared = []
  import cbert_jax.data.prepare as prepare_lib

  monkeypatch.setattr(prepare_lib, "prepare", lambda *a, **k: prepared.append(1))
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    train.run(tiny_config(cache_dir, **overrides), str(tmp_path / "w"))
  assert not prepared and not os.path.exists(tmp_path / "w")  # nothing expensive, nothing written
