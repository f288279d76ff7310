"""`--config.init_from`: a run started from a workdir, an export or a Hugging Face Llama folder.

* export -> init_from -> 0 training steps -> export: the same model.safetensors tensors, byte for
  byte (only the provenance metadata, workdir and step, differs);
* that run continued for 2 steps (it resumes from its own step-0 checkpoint: init_from is not
  applied again, and a log line says so) logs the same losses as a run started from the exported
  checkpoint through `init_from=W:step` (the optimizer fresh in both);
* a BERT workdir starts a CrossBERT: its encoder is BERT's exactly, its predictor the fresh random
  init, the counts of the record are the trees'; the run then trains and config.json keeps the
  record;
* a folder written by transformers' `save_pretrained` (and the same weights as a LlamaForCausalLM
  state dict in a sharded index) reads back as the exported arrays;
* model.size=from_init takes the shape from each kind of source;
* every refusal is one line naming the field, before any data preparation.

All runs are d32L2 on the tiny corpus, starting from the session's shared BERT run (2 steps).
"""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from cbert_jax import config_lib, train
from cbert_jax.data import prepare
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError
from cbert_jax.export import export, init_from, llama
from cbert_jax.run import trained
from cbert_jax.step import state as state_lib
from tests.helpers import TINY, losses, tiny_config


@pytest.fixture(scope="module")
def bert(trained_run):
  """The shared BERT run: checkpoints at steps 1 and 2."""
  return trained_run("bert")


@pytest.fixture(scope="module")
def exported(bert, tmp_path_factory):
  """Step 1 of the BERT run exported with its MLM head (so the export holds every parameter)."""
  out = str(tmp_path_factory.mktemp("init_from") / "export")
  export(bert, out, step=1, mlm_head=True, devices=jax.devices()[:1])
  return out


def flat(params) -> dict:
  return llama.flat_params(params)


def safetensors_parts(path: str) -> tuple[dict, bytes, dict]:
  """(tensor entries of the header, the data bytes, the metadata) of a safetensors file."""
  with open(path, "rb") as f:
    raw = f.read()
  n = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8 : 8 + n])
  return header, raw[8 + n :], header.pop("__metadata__")


def resolved(cache_dir, model="bert", **overrides):
  return config_lib.resolve(tiny_config(cache_dir, model, **overrides))


# ------------------------------------------------------------------------------ round trips ---
@pytest.fixture(scope="module")
def converted(exported, cache_dir, tmp_path_factory):
  """A BERT run started from the export with 0 training steps: its weights saved as step 0."""
  w = str(tmp_path_factory.mktemp("converted") / "w")
  summary = train.run(tiny_config(cache_dir, "bert", total_steps=0, init_from=exported), w)
  assert summary.final_step == 0 and sorted(os.listdir(os.path.join(w, "checkpoints"))) == ["0"]
  return w


def test_export_init_from_zero_steps_export_is_byte_identical(exported, converted, tmp_path):
  again = export(converted, str(tmp_path / "again"), devices=jax.devices()[:1])
  with open(os.path.join(exported, "model.safetensors"), "rb") as f1:
    with open(os.path.join(again.out, "model.safetensors"), "rb") as f2:
      assert f1.read() == f2.read()  # the whole file, byte for byte
  a = safetensors_parts(os.path.join(exported, "model.safetensors"))
  assert a[2] == {"format": "pt", "cbert_jax_model": "bert"}  # no path, no step: those are in
  with open(os.path.join(again.out, "cbert_export.json")) as f:  # the manifest
    assert json.load(f)["workdir"] == os.path.basename(converted)  # its name, not its path
  # The tokenizer came with the weights; config.json records what was loaded, counted.
  for name in ("tokenizer.model",):
    with open(os.path.join(converted, name), "rb") as f1:
      with open(os.path.join(exported, name), "rb") as f2:
        assert f1.read() == f2.read()
  with open(os.path.join(converted, "config.json")) as f:
    record = json.load(f)["init_from"]
  assert record["kind"] == "export" and record["source"] == exported
  assert record["loaded"]["groups"] == ["encoder", "head"] and record["fresh"]["tensors"] == 0
  tensors = load_file(os.path.join(exported, "model.safetensors"))
  head = load_file(os.path.join(exported, "mlm_head.safetensors"))["lm_head.weight"]
  assert record["loaded"]["parameters"] == sum(v.size for v in tensors.values()) + head.size


def test_a_run_continued_from_an_export_matches_one_from_the_checkpoint(
  exported, converted, bert, cache_dir, tmp_path, caplog
):
  # The converted run, continued for 2 steps (it resumes from its own step 0: init_from is not
  # applied again), against a run started from the exported step through our checkpoint
  # (init_from=W:1); both with a fresh optimizer and the same seed.
  a, b = str(tmp_path / "from_export"), str(tmp_path / "from_checkpoint")
  shutil.copytree(converted, a)
  caplog.set_level(logging.INFO, logger="absl")
  train.run(tiny_config(cache_dir, "bert", total_steps=2, init_from=exported), a)
  assert "not applied: the run resumed from its own checkpoint at step 0" in caplog.text
  train.run(tiny_config(cache_dir, "bert", total_steps=2, init_from=f"{bert}:1"), b)
  la, lb = losses(a), losses(b)
  assert sorted(la) == sorted(lb) == [1, 2]
  np.testing.assert_allclose([la[1], la[2]], [lb[1], lb[2]], rtol=1e-6)
  with open(os.path.join(b, "config.json")) as f:
    record = json.load(f)["init_from"]
  assert (record["kind"], record["step"], record["loaded"]["groups"]) == (
    "workdir",
    1,
    ["encoder", "head"],
  )
  with open(os.path.join(a, "config.json")) as f:
    assert json.load(f)["init_from"]["kind"] == "export"  # kept on resume


def test_a_bert_workdir_starts_crossberts_encoder(bert, cache_dir, tmp_path):
  w = str(tmp_path / "crossbert")
  config = config_lib.resolve(tiny_config(cache_dir, "crossbert", total_steps=2, init_from=bert))
  # What the trainer does at step 0, in process: the random init, then init_from's weights.
  source = init_from.check(config, w)
  assert (source.kind, source.step) == ("workdir", 2)  # the newest checkpoint
  tok = tokenizer_lib.Tokenizer(source.tokenizer_path)
  model_cfg, mask_cfg = config_lib.build_model_configs(
    config, tok.vocab_size, tok.mask_id, tok.special_ids
  )
  st = state_lib.setup(config, model_cfg, mask_cfg, jax.devices())
  with jax.set_mesh(st.mesh), nnx.logical_axis_rules(st.rules):
    params, _ = state_lib.init(st, jax.random.key(0))
    fresh = flat(params)
    params, record = init_from.apply(source, params)
  ours, theirs = flat(params), flat(trained.load(bert, 2).params)
  encoder = [k for k in ours if k.startswith("encoder/")]
  assert encoder and sorted(encoder) == sorted(k for k in theirs if k.startswith("encoder/"))
  for k in encoder:
    np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    assert not np.array_equal(ours[k], fresh[k]), k
  predictor = [k for k in ours if k.startswith("predictor/")]
  assert predictor and not any(k.startswith("predictor/") for k in theirs)
  for k in predictor:  # the random init, as a run without init_from starts
    np.testing.assert_array_equal(ours[k], fresh[k], err_msg=k)
  assert record["loaded"] == {
    "tensors": len(encoder),
    "parameters": sum(ours[k].size for k in encoder),
    "groups": ["encoder"],
  }
  assert record["fresh"] == {
    "tensors": len(predictor),
    "parameters": sum(ours[k].size for k in predictor),
    "groups": ["predictor"],
  }
  assert record["unused"] == {"tensors": 1, "parameters": theirs["head/w"].size, "groups": ["head"]}
  # The run trains, and its config.json keeps the record.
  summary = train.run(tiny_config(cache_dir, "crossbert", total_steps=2, init_from=bert), w)
  assert summary.final_step == 2 and np.isfinite(summary.last_loss)
  with open(os.path.join(w, "config.json")) as f:
    saved = json.load(f)["init_from"]
  assert {k: saved[k] for k in ("loaded", "fresh", "unused")} == {
    k: record[k] for k in ("loaded", "fresh", "unused")
  }


def test_a_crossbert_export_with_its_pretraining_file_continues_where_it_stopped(
  trained_run, cache_dir, tmp_path
):
  """export --pretraining also writes the predictor (our names, float32): init_from of that export
  into CrossBERT loads every parameter (nothing fresh), equal to the checkpoint's, so its first
  training step starts from the trained model's loss; into BERT only the encoder is taken."""
  source = trained_run("crossbert")
  out = str(tmp_path / "export")
  export(source, out, step=2, pretraining=True, devices=jax.devices()[:1])
  extra = load_file(os.path.join(out, "pretraining.safetensors"))
  want = flat(trained.load(source, 2).params)
  assert sorted(extra) == sorted(k for k in want if not k.startswith("encoder/"))
  assert any(k.startswith("predictor/") for k in extra)
  w = str(tmp_path / "continued")
  train.run(tiny_config(cache_dir, "crossbert", total_steps=0, init_from=out), w)
  got = flat(trained.load(w, 0).params)
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  with open(os.path.join(w, "config.json")) as f:
    record = json.load(f)["init_from"]
  assert record["fresh"]["tensors"] == 0 and "predictor" in record["loaded"]["groups"]
  # Another family takes the encoder alone from the same export.
  config = config_lib.resolve(tiny_config(cache_dir, "bert", total_steps=2, init_from=out))
  checked = init_from.check(config, str(tmp_path / "bert"))
  assert all(k.startswith("encoder/") for k in checked.loaded)
  assert any(k.startswith("predictor/") for k in checked.unused)


@pytest.fixture(scope="module")
def hf(exported, tmp_path_factory) -> str:
  """The export loaded by transformers and saved with `save_pretrained`: a Hugging Face folder of
  config.json and model.safetensors (no SentencePiece tokenizer.model)."""
  from transformers import AutoModel  # pylint: disable=import-outside-toplevel

  d = str(tmp_path_factory.mktemp("hf") / "model")
  AutoModel.from_pretrained(exported).save_pretrained(d)
  assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
  return d


def test_a_hugging_face_folder(hf, exported, bert, cache_dir, tmp_path):
  config = resolved(cache_dir, "crossbert", init_from=hf)
  with pytest.raises(ConfigError, match=f"^init_from: {hf} has no tokenizer.model; "):
    init_from.check(config, str(tmp_path / "run"))
  config.data.tokenizer_path = os.path.join(exported, "tokenizer.model")
  source = init_from.check(config, str(tmp_path / "run"))
  assert source.kind == "hf" and all(k.startswith("encoder/") for k in source.loaded)
  want = flat(trained.load(bert, 1).params)
  got = init_from.read_weights(source)
  assert sorted(got) == sorted(source.loaded) == sorted(k for k in want if k.startswith("encoder"))
  for k in got:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # The same weights as a LlamaForCausalLM state dict ("model." names, an lm_head) in two shards.
  sharded = str(tmp_path / "sharded")
  os.makedirs(sharded)
  shutil.copy(os.path.join(hf, "config.json"), sharded)
  tensors = {"model." + k: v for k, v in load_file(os.path.join(hf, "model.safetensors")).items()}
  tensors["lm_head.weight"] = np.zeros((400, 32), np.float32)
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[::2], names[1::2])):
    file = f"model-{i + 1:05d}-of-00002.safetensors"
    save_file({k: tensors[k] for k in part}, os.path.join(sharded, file))
    weight_map |= dict.fromkeys(part, file)
  with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": weight_map}, f)
  config.init_from = sharded
  got = init_from.read_weights(init_from.check(config, str(tmp_path / "run")))
  for k in want:
    if k.startswith("encoder/"):
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ------------------------------------------------------------------------ model.size=from_init ---
def test_size_from_init(hf, exported, bert, cache_dir):
  plain = resolved(cache_dir).model
  fields = ("size", "d_model", "num_layers", "num_heads", "head_dim", "ffn_dim", "norm_eps")
  for source in (exported, bert, f"{bert}:1", hf):
    m = resolved(cache_dir, **{"model.size": "from_init", "init_from": source}).model
    assert [m[k] for k in fields] == ["", *[plain[k] for k in fields[1:]]], source
    assert m.rope_theta == plain.rope_theta
  with pytest.raises(ConfigError, match="^model.d_model=64 conflicts with model.size=from_init"):
    resolved(cache_dir, **{"model.size": "from_init", "model.d_model": 64, "init_from": bert})


# ---------------------------------------------------------------------------------- refusals ---
def other_tokenizer(path: str) -> str:
  """A SentencePiece model with our layout that is not the run's (vocabulary 350)."""
  with open(TINY, encoding="utf-8") as f:
    docs = [line.strip() for line in f if line.strip()]
  with open(path, "wb") as f:
    f.write(tokenizer_lib._train(docs, vocab_size=350, model_type="bpe"))  # pylint: disable=protected-access
  return path


def llama_folder(root, exported, name: str, edit_config=None, extra=None) -> str:
  """A Hugging Face folder made from the export: its config.json (edited) and weights (+ extra)."""
  d = os.path.join(root, name)
  os.makedirs(d)
  with open(os.path.join(exported, "config.json")) as f:
    body = json.load(f)
  body |= edit_config or {}
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(body, f)
  tensors = load_file(os.path.join(exported, "model.safetensors")) | (extra or {})
  save_file(tensors, os.path.join(d, "model.safetensors"))
  shutil.copy(os.path.join(exported, "tokenizer.model"), d)
  return d


REFUSALS = {  # id -> (init_from ("{bert}", "{export}", "{tmp}" filled in), overrides, message)
  "missing-path": ("{tmp}/nope", {}, "init_from: no such file or directory '{tmp}/nope'"),
  "a-file": ("{tmp}/file.txt", {}, "init_from: {tmp}/file.txt is a file; expected a folder: "),
  "none-of-the-kinds": ("{tmp}/empty", {}, "init_from: {tmp}/empty is none of: a cbert_jax workdir"),
  "not-llama": ("{tmp}/bert_hf", {}, "init_from: {tmp}/bert_hf/config.json describes a 'bert' model"),
  "no-such-step": ("{bert}:7", {}, "init_from: workdir {bert} has no checkpoint at step 7 (its steps: 1, 2)"),
  "step-of-an-export": ("{export}:1", {}, "init_from: {export}:1: ':1' picks a checkpoint of a cbert_jax workdir"),
  "no-checkpoint": ("{tmp}/untrained", {}, "init_from: workdir {tmp}/untrained has no checkpoint; train it first"),
  "vocab": ("{export}", {"data.vocab_size": 500}, "data.vocab_size=500, but init_from's tokenizer has 400 pieces"),
  "embedding-vs-tokenizer": ("{tmp}/small_vocab", {}, "init_from: {tmp}/small_vocab: the embedding has 400 rows but the tokenizer (tokenizer.model) has 350 pieces"),
  "other-tokenizer": ("{export}", {"data.tokenizer_path": "{tmp}/other.model"}, "data.tokenizer_path: {tmp}/other.model is not init_from's tokenizer"),
  "width": ("{export}", {"model.size": "d64L2"}, "init_from: {export} does not fit this config: the first tensor that differs is encoder/embed/table (embed_tokens.weight): ours [400, 64], theirs [400, 32]"),
  "depth": ("{bert}", {"model.size": "", "model.d_model": 32, "model.num_layers": 3, "model.num_heads": 2}, "the first tensor that differs is encoder/blocks/2/attn/wq: ours [32, 2, 16], theirs absent"),
  "heads": ("{export}", {"model.size": "", "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 4}, "init_from: {export} has num_heads 2, this config model.num_heads=4"),
  "rope": ("{export}", {"model.rope_theta": 500000.0}, "init_from: {export} has rope_theta 10000.0, this config model.rope_theta=500000.0"),
  "grouped-query": ("{tmp}/gqa", {}, "init_from: {tmp}/gqa/config.json: num_key_value_heads=1 with num_attention_heads=2 (grouped-query)"),
  "a-bias": ("{tmp}/bias", {}, "init_from: {tmp}/bias/model.safetensors holds layers.0.self_attn.q_proj.bias, which has no place"),
}  # fmt: skip


@pytest.fixture(scope="module")
def refusal_sources(bert, exported, tmp_path_factory):
  root = str(tmp_path_factory.mktemp("refusals"))
  open(os.path.join(root, "file.txt"), "w").close()
  os.makedirs(os.path.join(root, "empty"))
  os.makedirs(os.path.join(root, "bert_hf"))
  with open(os.path.join(root, "bert_hf", "config.json"), "w") as f:
    json.dump({"model_type": "bert", "hidden_size": 32}, f)
  os.makedirs(os.path.join(root, "untrained"))
  shutil.copy(os.path.join(bert, "config.json"), os.path.join(root, "untrained"))
  other_tokenizer(os.path.join(root, "other.model"))
  small = llama_folder(root, exported, "small_vocab")
  shutil.copy(os.path.join(root, "other.model"), os.path.join(small, "tokenizer.model"))
  llama_folder(root, exported, "gqa", {"num_key_value_heads": 1})
  llama_folder(
    root, exported, "bias", extra={"layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}
  )
  return root


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_naming_the_field(case, refusal_sources, bert, exported, cache_dir):
  spec, overrides, message = REFUSALS[case]
  fill = lambda s: s.format(tmp=refusal_sources, bert=bert, export=exported)
  overrides = {k: fill(v) if isinstance(v, str) else v for k, v in overrides.items()}
  config = resolved(cache_dir, init_from=fill(spec), **overrides)
  with pytest.raises(ConfigError) as e:
    init_from.check(config, os.path.join(refusal_sources, "run"))
  assert str(e.value).startswith(fill(message)) or fill(message) in str(e.value), str(e.value)
  assert "\n" not in str(e.value)


def test_refused_before_data_preparation(cache_dir, tmp_path, monkeypatch):
  def prepare_once(*args, **kwargs):
    raise AssertionError("data preparation started")

  monkeypatch.setattr(prepare, "prepare_once", prepare_once)
  with pytest.raises(ConfigError, match="^init_from: no such file or directory"):
    train.run(tiny_config(cache_dir, "bert", init_from=str(tmp_path / "nope")), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_config_refusals():
  c = config_lib.base_config()
  c.model.size = "from_init"
  with pytest.raises(ConfigError, match="^model.size=from_init needs init_from"):
    config_lib.resolve(c)
  c = config_lib.resolve(tiny_config("", "bert", total_steps=0))
  with pytest.raises(ConfigError, match=r"^total_steps must be positive, got 0 \(0 only with"):
    config_lib.validate(c, 8)
  assert config_lib.split_init_from("runs/x:300") == ("runs/x", 300)
  assert config_lib.split_init_from("runs/x") == ("runs/x", None)
