"""The accelerator benchmark script runs end to end on CPU (bf16 compute switch included)."""

import dataclasses
import functools
import json

import pytest

from benchmarks import accelerator_step, contestants
from cbert_jax.models import flops as flops_lib
from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.run import hardware
from cbert_jax.scaling import memory

# The accelerator benchmark at a CPU-sized shape (a d64L2 model on 4 rows of 32 tokens).
MICRO = ["--d", "64", "--layers", "2", "--heads", "2", "--vocab", "512", "--seq", "32"]
MICRO += ["--batch", "4", "--dtype", "bfloat16", "--steps", "2", "--warmup", "1"]
ONE = {"data": 1, "fsdp": 1, "tensor": 1}  # one device: no sharding


def test_accelerator_step_cpu_dry_run_bf16(tmp_path, monkeypatch):
  # The script's measured matmul at 256^2 instead of 2048^2 (seconds of bf16 on a CPU): the same
  # code path; no assertion reads the measured figure.
  measure = hardware.measure_matmul_peak
  monkeypatch.setattr(
    hardware,
    "measure_matmul_peak",
    lambda dtype, n=2048, seconds=1.0, **kw: measure(dtype, n=min(n, 256), seconds=0.2, **kw),
  )
  info = accelerator_step.main(
    [
      "--d",
      "64",
      "--layers",
      "2",
      "--heads",
      "2",
      "--vocab",
      "512",
      "--seq",
      "32",
      "--batch",
      "4",
      "--dtype",
      "bfloat16",
      "--steps",
      "2",
      "--warmup",
      "1",
      "--contestants",
      "BERT,CrossBERT+CMS",
      "--out",
      str(tmp_path),
    ]
  )
  on_disk = json.loads((tmp_path / "accelerator_step.json").read_text())
  assert on_disk["results"].keys() == {"BERT", "CrossBERT+CMS"}
  assert on_disk["dtype"] == "bfloat16" and on_disk["shape"]["ffn"] == 256
  for name, family, ratio, cms in (
    ("BERT", "bert", 0.2, False),
    ("CrossBERT+CMS", "crossbert", 0.5, True),
  ):
    r = info["results"][name]
    cfg = ModelConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=2, predictor_layers=1)
    mask = MaskConfig(mask_ratio=ratio, mask_id=4, special_ids=(0, 2, 3, 4), cms=cms)
    per_step = flops_lib.flops_per_token(family, cfg, mask, 32) * 4 * 32
    assert r["tokens_per_s"] == pytest.approx(4 * 32 / r["step_s"])
    assert r["model_flops_per_s"] == pytest.approx(per_step / r["step_s"])
    assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / info["peak_flops"])
    assert r["step_s_min"] <= r["step_s"] <= r["step_s_max"]
    # CPU: XLA's attention, no device memory statistics; the plan's bytes for this very shape
    assert r["attention_kernel"] == "XLA (dot + softmax fusions)" and r["peak_memory_mb"] is None
    micro = contestants.Shape(layers=2, d=64, heads=2, ffn=256, vocab=512, seq=32, batch=4)
    mc = contestants.model_config(micro, compute_dtype="bfloat16")
    shape = memory.shape_of(family, mc, mask, 32, 4, ONE)
    want = memory.estimate(shape, memory.Setting(remat="none"))["total"] / 2**20
    assert r["plan_memory_mb"] == pytest.approx(want) and r["memory_mb"] > 0
  assert "| CrossBERT+CMS |" in (tmp_path / "accelerator_step.md").read_text()


def test_accelerator_step_isolates_contestants_and_keeps_to_its_time_budget(tmp_path):
  """--isolate yes: the contestant is measured in a child process and its numbers come back;
  --budget_s 0: the contestants after the first are skipped, and the table says so."""
  info = accelerator_step.main(
    [*MICRO, "--contestants", "BERT,CrossBERT", "--isolate", "yes", "--budget_s", "0"]
    + ["--out", str(tmp_path)]
  )
  bert, crossbert = info["results"]["BERT"], info["results"]["CrossBERT"]
  assert bert["tokens_per_s"] > 0 and bert["plan_memory_mb"] > 0 and "skipped" not in bert
  assert crossbert == {"skipped": crossbert["skipped"]}
  assert crossbert["skipped"].startswith("--budget_s 0:")
  table = (tmp_path / "accelerator_step.md").read_text()
  assert "| CrossBERT | --budget_s 0:" in table


def test_attention_kernel_is_read_off_the_compiled_hlo():
  cudnn = 'custom-call(...), custom_call_target="__cudnn$fmhaSoftmax"'
  assert contestants.attention_kernel(cudnn) == "cuDNN fused attention"
  assert contestants.attention_kernel("dot(...) fusion(...)") == "XLA (dot + softmax fusions)"


def test_accelerator_step_rejects_unknown_contestant(capsys):
  with pytest.raises(SystemExit):
    accelerator_step.main(["--contestants", "BERT,GPT"])
  assert "--contestants: unknown 'GPT'" in capsys.readouterr().err


def test_train_step_benchmark_micro_dry_run(tmp_path, monkeypatch):
  """The train-step benchmark end to end at the micro shape: every ratio is the ratio of the
  measured medians, its analytic twin the ratio of FLOPs per step, and the sparse heads count the
  vocabulary projection at the masked positions only."""
  from benchmarks import contestants, train_step

  # The matmul peaks (measured before and after each run) at 256^2 instead of 2048^2: the same
  # code path; no assertion reads them.
  monkeypatch.setattr(train_step, "matmul_peaks", functools.partial(train_step.matmul_peaks, n=256))
  names = [
    "cbert_jax BERT",
    "cbert_jax CrossBERT",
    "HF BertForMaskedLM",
    "HF BertForMaskedLM sparse head",
  ]
  info = train_step.main(
    [
      "--shapes",
      "micro",
      "--contestants",
      ",".join(names),
      "--warmup",
      "1",
      "--rounds",
      "1",
      "--peak_seconds",
      "0.2",
      "--out",
      str(tmp_path),
    ]
  )
  res, rat = info["results"]["micro"], info["ratios"]["micro"]
  assert list(res) == names and json.loads((tmp_path / "train_step.json").read_text())
  for a, b in (("cbert_jax BERT", "HF BertForMaskedLM"), ("cbert_jax CrossBERT", "cbert_jax BERT")):
    r = rat[f"{a} / {b}"]
    assert r["measured"] == pytest.approx(res[a]["tokens_per_s"] / res[b]["tokens_per_s"])
    assert r["analytic"] == pytest.approx(res[b]["flops_per_step"] / res[a]["flops_per_step"])
  best = rat["best of HF BertForMaskedLM"]["name"]
  assert best in ("HF BertForMaskedLM", "HF BertForMaskedLM sparse head")
  assert rat["cbert_jax BERT / best HF BertForMaskedLM"]["measured"] == pytest.approx(
    res["cbert_jax BERT"]["tokens_per_s"] / res[best]["tokens_per_s"]
  )
  # a sparse head: the head's 6 (d^2 + d V) per token at the masked fraction only (the
  # benchmark's fixed 20% mask, redrawn here from its seed)
  import torch

  s = contestants.SHAPES["micro"]
  g = torch.Generator().manual_seed(0)
  torch.randint(5, s.vocab, (s.batch, s.seq), generator=g)
  frac = float((torch.rand(s.batch, s.seq, generator=g) < 0.2).float().mean())
  dense, sparse = (res[n]["flops_per_step"] for n in names[2:])
  head = 6 * (s.d * s.d + s.d * s.vocab) * s.batch * s.seq
  assert dense - sparse == pytest.approx(head * (1 - frac))
  assert "### Targets" in (tmp_path / "train_step.md").read_text()
  # One contestant at a time (the paper shape's memory mode): built per round, the same numbers.
  monkeypatch.setitem(
    contestants.SHAPES, "micro", dataclasses.replace(s, one_at_a_time=True, steps=4)
  )
  info = train_step.main(
    ["--shapes", "micro", "--contestants", ",".join(names[:2]), "--rounds", "2", "--warmup", "1"]
    + ["--peak_seconds", "0.2", "--out", str(tmp_path / "one")]
  )
  res = info["results"]["micro"]
  assert list(res) == names[:2] and all(r["steps_timed"] == 4 for r in res.values())
  assert not (tmp_path / "one" / "train_step.partial.json").exists()


@pytest.mark.parametrize("model", ["bert", "hf_bert_sparse"])
def test_profile_step_micro(model, capsys):
  """The step profile (ours by XLA op, a peer's by aten op) at the micro shape: the kinds add up
  to the op time, matmuls are among them, and the FLOPs are the benchmark's own count."""
  from benchmarks import contestants, profile_step

  out = profile_step.main(
    ["--model", model, "--shape", "micro", "--steps", "2", "--no-matmul_rates"]
  )
  assert sum(out["kinds"].values()) == pytest.approx(out["op_ms"])
  assert out["wall_ms"] > 0 and out["op_ms"] > 0
  [mm] = [k for k in out["kinds"] if k.startswith("matmul")]
  assert out["kinds"][mm] > 0
  shape = contestants.SHAPES["micro"]
  if model == "bert":
    want = contestants.JaxStep("bert", shape, 0.2, cms=False).flops_per_step
  else:
    want = contestants.TorchStep("bert", shape, sparse=True).flops_per_step
  assert out["flops"] == pytest.approx(want)
  assert f"{model} @ micro" in capsys.readouterr().out
