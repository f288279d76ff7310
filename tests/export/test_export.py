"""`python -m cbert_jax.export`: an exported BERT / CrossBERT / ELECTRA encoder loads with stock
`transformers` and `sentence-transformers` (no custom code) and gives our numbers.

* `AutoModel` (a bidirectional LlamaModel) gives `features(...)["final"]` on the same ids within
  1e-4 in float32, with padding in the batch (real tokens compared) and without (one text at a
  time: transformers then passes no mask at all and relies on `is_causal: false`), with the
  default (sdpa) and the eager attention;
* `SentenceTransformer(DIR).encode` gives the probes' mean-pooled `Featurizer` features;
* `AutoTokenizer` gives `Tokenizer.encode_batch`'s ids (no BOS/EOS) on real text: the tiny corpus
  and the repository's Markdown (a BPE model, and a unigram one trained here);
* bad input (no config.json, a missing step, a non-empty --out, an unsupported pooler) is one
  line and writes nothing; --overwrite replaces a previous export only, never a user's file, and
  never exports into a non-empty folder an export did not create or through a symlinked --out.

Padding positions: transformers' bidirectional mask masks padding *keys* only, so a padding
query attends to the real tokens and gets a finite but meaningless state; our encoder zeroes the
attention output of padding queries. Neither is ever pooled; only real tokens are compared.
"""

import glob
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from cbert_jax import embed
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.evaluators import features
from cbert_jax.export import __main__ as export_cli
from cbert_jax.export import card as card_lib
from cbert_jax.export import hf_tokenizer, llama
from cbert_jax.run import record as record_lib
from cbert_jax.run import trained
from tests.helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ("bert", "crossbert", "electra")
TOL = 1e-4


def corpus_lines() -> list[str]:
  with open(TINY, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def sample_texts() -> list[str]:
  """Mixed lengths: a word, short sentences, texts cut at seq_len (32 tokens), odd whitespace."""
  lines = corpus_lines()
  return [
    lines[0].split()[0],
    lines[3],
    "  Two  spaces,\ta tab\nand a newline. ",
    " ".join(lines[10:14]),
    lines[20][:40],
    lines[40],
  ]


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
  """{family: (Trained, export dir)}: each family trained once (shared fixture) and exported once
  through the command line, in the sentence-transformers format (a superset of hf)."""
  out = {}
  for name in FAMILIES:
    workdir = trained_run(name)
    d = str(tmp_path_factory.mktemp(f"export_{name}") / "model")
    assert (
      export_cli.main(["--workdir", workdir, "--out", d, "--format", "sentence-transformers"]) == 0
    )
    out[name] = (trained.load(workdir, devices=jax.devices()[:1]), d)
  return out


def our_final(run, params, rows) -> np.ndarray:
  """features(...)["final"] [N, T, d] of rows under `params` (any values of the run's shapes)."""

  def final(p, r):
    return nnx.merge(run.graphdef, p).features(r["tokens"], r["positions"], r["segment_ids"])

  return np.asarray(jax.jit(final)(params, rows)["final"])


def perturbed(params, seed: int):
  """`params` plus noise: the norm scales move far from 1 (a swapped or misplaced norm, or a
  wrong transpose, then shows), the matrices by a few percent of their size."""
  rng = np.random.default_rng(seed)

  def noisy(x):
    x = np.asarray(x)
    std = 0.5 if x.ndim == 1 else 0.5 * float(x.std())
    return x + rng.normal(0.0, std, x.shape).astype(x.dtype)

  return jax.tree.map(noisy, params)


def hf_states(d: str, texts, impl: str = "sdpa"):
  """(last_hidden_state [N, T, d] of the padded batch, real-token mask [N, T], and each text's
  states alone, unpadded) from the export in `d`."""
  tok = AutoTokenizer.from_pretrained(d)
  model = AutoModel.from_pretrained(d, attn_implementation=impl).eval()
  assert type(model).__name__ == "LlamaModel" and model.config.is_causal is False
  batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
  with torch.no_grad():
    padded = model(**batch).last_hidden_state.numpy()
    alone = [
      model(**tok([t], truncation=True, return_tensors="pt")).last_hidden_state.numpy()[0]
      for t in texts
    ]  # no padding: transformers passes no mask at all
  return padded, batch["attention_mask"].numpy().astype(bool), alone, batch["input_ids"].numpy()


def assert_same_states(d: str, run, params, impl: str = "sdpa") -> None:
  seq_len = int(run.config.data.seq_len)
  texts = sample_texts()
  rows = features.encode_texts(texts, run.tokenizer, seq_len)
  ours = our_final(run, params, rows)  # [N, T, d]
  padded, real, alone, ids = hf_states(d, texts, impl)
  assert ids.shape[1] == seq_len  # one text is cut
  np.testing.assert_array_equal(ids, rows["tokens"])
  assert np.isfinite(padded).all()  # padding: finite
  np.testing.assert_allclose(padded[real], ours[real], rtol=0, atol=TOL)
  for i, h in enumerate(alone):
    np.testing.assert_allclose(h, ours[i, : h.shape[0]], rtol=0, atol=TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_hidden_states_equal_ours(exported, family, tmp_path):
  run, d = exported[family]
  for impl in ("sdpa", "eager"):
    assert_same_states(d, run, run.params, impl)
  # The same with every parameter moved well away from its (nearly initial) trained value, the
  # safetensors rewritten by the exporter's own mapping.
  params = perturbed(run.params, seed=FAMILIES.index(family))
  d2 = str(tmp_path / "perturbed")
  shutil.copytree(d, d2)
  tensors = llama.llama_tensors(llama.flat_params(params), run.model_cfg.num_layers)
  llama.write_safetensors(os.path.join(d2, "model.safetensors"), tensors, {})
  assert_same_states(d2, run, params)


@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_transformers_equals_the_probe_features(exported, family):
  run, d = exported[family]
  seq_len = int(run.config.data.seq_len)
  texts = sample_texts() + corpus_lines()[100:110]
  feat = features.Featurizer(run.graphdef, run.params, batch_size=8, seq_len=seq_len)
  want = feat(features.encode_texts(texts, run.tokenizer, seq_len))  # [N, d]
  model = SentenceTransformer(d, device="cpu")
  assert model.max_seq_length == seq_len
  got = model.encode(texts, batch_size=8)
  np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_normalize_bfloat16_and_the_card(trained_run, tmp_path):
  workdir = trained_run("crossbert")
  run = trained.load(workdir, devices=jax.devices()[:1])
  seq_len = int(run.config.data.seq_len)
  texts = sample_texts()
  feat = features.Featurizer(run.graphdef, run.params, batch_size=8, seq_len=seq_len)
  want = feat(features.encode_texts(texts, run.tokenizer, seq_len))
  d = str(tmp_path / "st")
  assert (
    export_cli.main(
      ["--workdir", workdir, "--out", d, "--format", "sentence-transformers", "--normalize"]
    )
    == 0
  )
  got = SentenceTransformer(d, device="cpu").encode(texts)
  np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=-1, keepdims=True), atol=TOL)

  d16 = str(tmp_path / "bf16")
  assert export_cli.main(["--workdir", workdir, "--out", d16, "--dtype", "bfloat16"]) == 0
  assert AutoModel.from_pretrained(d16).dtype == torch.bfloat16
  # The card: what is and is not exported, the data, tokens, FLOPs, no probe run; its
  # transformers snippet runs as written (pointed at this export).
  with open(os.path.join(d16, "README.md")) as f:
    card = f.read()
  for needle in (
    "crossbert d32L2",
    "Not exported: the predictor",
    "tiny_corpus.txt",
    "tokens seen: 512",
    "training FLOPs",
    "No probe suite was run on step 2",
    "bfloat16",
    "transformers >= 5.2",
  ):
    assert needle in card, needle
  snippet = re.findall(r"```python\n(.*?)```", card, re.S)[0].replace("path/to/this/directory", d16)
  scope = {}
  exec(snippet, scope)  # noqa: S102  (the card's own example)
  raw = feat(features.encode_texts(["a sentence", "another one"], run.tokenizer, seq_len))
  np.testing.assert_allclose(scope["emb"].float().numpy(), raw, atol=5e-2)  # bfloat16 weights


def test_tokenizer_gives_our_ids_on_real_text(exported):
  run, d = exported["crossbert"]
  texts = corpus_lines()
  for path in [os.path.join(ROOT, "README.md")] + sorted(
    glob.glob(os.path.join(ROOT, "docs", "*.md"))
  ):
    with open(path, encoding="utf-8") as f:
      texts += [line for line in f.read().splitlines() if line.strip()]
  texts += list(hf_tokenizer.SELF_CHECK) + ["x [MASK] y", "a\u00a0b", "\u3000x"]
  assert len(texts) > 1000
  tok = AutoTokenizer.from_pretrained(d)
  got = tok(texts)["input_ids"]  # default: specials on
  want = run.tokenizer.encode_batch(texts)
  bad = [t for t, a, b in zip(texts, got, want) if a != b]
  assert not bad, bad[:3]
  assert tok.pad_token_id == 0 and tok.mask_token_id == run.tokenizer.mask_id
  assert tok.bos_token_id is None and tok.eos_token_id is None
  # The documented difference: SentencePiece puts a lone "▁" before a mask that starts a text.
  assert run.tokenizer.encode_batch(["[MASK] y"])[0][1:] == tok("[MASK] y")["input_ids"]


def test_unigram_tokenizer_converts_exactly(tmp_path):
  docs = corpus_lines()
  path = str(tmp_path / "unigram.model")
  with open(path, "wb") as f:
    f.write(tokenizer_lib._train(docs, vocab_size=400, model_type="unigram"))  # pylint: disable=protected-access
  assert (
    hf_tokenizer.check(hf_tokenizer.build(path), path, docs + list(hf_tokenizer.SELF_CHECK)) == []
  )


def test_mlm_head_is_bert_only(trained_run, tmp_path, capsys):
  workdir = trained_run("bert")
  run = trained.load(workdir, devices=jax.devices()[:1])
  d = str(tmp_path / "bert")
  assert export_cli.main(["--workdir", workdir, "--out", d, "--mlm_head"]) == 0
  head = load_file(os.path.join(d, "mlm_head.safetensors"))["lm_head.weight"]  # [V, d]
  np.testing.assert_array_equal(head, np.asarray(run.params["head"]["w"][...]).T)
  assert not os.path.exists(os.path.join(d, "modules.json"))  # --format hf
  assert (
    export_cli.main(
      ["--workdir", trained_run("crossbert"), "--out", str(tmp_path / "x"), "--mlm_head"]
    )
    == 2
  )
  assert "only BERT has one" in capsys.readouterr().err


def one_line_error(capsys, argv, *needles) -> str:
  assert export_cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("config error: "), err
  for needle in needles:
    assert needle in err, err
  return err


def test_bad_input_is_one_line_and_never_deletes_user_files(trained_run, tmp_path, capsys):
  workdir = trained_run("crossbert")
  out = tmp_path / "out"
  one_line_error(capsys, ["--workdir", str(tmp_path), "--out", str(out)], "no config.json")
  one_line_error(
    capsys,
    ["--workdir", workdir, "--out", str(out), "--step", "7"],
    "--step 7",
    "checkpoints at steps [1, 2]",
  )
  one_line_error(
    capsys,
    ["--workdir", workdir, "--out", str(out), "--pooler", str(tmp_path / "pooler-step_2.npz")],
    "no stock sentence-transformers module",
  )
  one_line_error(
    capsys,
    ["--workdir", workdir, "--out", str(out), "--normalize"],
    "--format sentence-transformers",
  )
  assert not out.exists()
  assert not [p for p in os.listdir(tmp_path) if ".export-" in p]  # no staging left

  out.mkdir()
  (out / "notes.txt").write_text("mine")
  for extra in ([], ["--overwrite"]):  # a folder the export did not create: never, even so
    one_line_error(
      capsys,
      ["--workdir", workdir, "--out", str(out)] + extra,
      "not empty (notes.txt)",
      "holds no earlier export (no readable cbert_export.json)",
    )
  assert os.listdir(out) == ["notes.txt"]
  (out / "notes.txt").unlink()

  # An empty folder takes an export; a later one needs --overwrite, which replaces the earlier
  # export (its stale files too) and keeps other files, never a user's file of an export's name.
  args = ["--workdir", workdir, "--out", str(out)]
  assert export_cli.main(args + ["--format", "sentence-transformers", "--normalize"]) == 0
  assert (out / "2_Normalize").is_dir() and (out / "modules.json").is_file()
  (out / "notes.txt").write_text("mine")
  one_line_error(capsys, args, "not empty", "--overwrite")
  assert export_cli.main(args + ["--overwrite"]) == 0  # now hf only
  assert not (out / "modules.json").exists() and not (out / "2_Normalize").exists()
  assert (out / "notes.txt").read_text() == "mine"
  (out / "modules.json").write_text("my own")
  one_line_error(
    capsys,
    args + ["--overwrite", "--format", "sentence-transformers"],
    "modules.json",
    "not replacing user files",
  )
  assert (out / "modules.json").read_text() == "my own"
  (out / "modules.json").unlink()
  with open(out / "cbert_export.json") as f:
    manifest = json.load(f)
  assert manifest["format"] == "hf" and manifest["step"] == 2
  assert sorted(os.listdir(out)) == sorted(["notes.txt"] + manifest["files"])
  assert AutoModel.from_pretrained(str(out)).config.is_causal is False


def test_out_that_is_a_symlink_is_refused(trained_run, tmp_path, capsys):
  """`--out` a symlink to a system directory plus `--overwrite` exported into that directory. Now
  a symlinked --out is refused outright (to a full folder, an empty one or nowhere), before the
  workdir is read, and nothing is written through it or beside it."""
  workdir = trained_run("crossbert")
  system = tmp_path / "usr_share"
  system.mkdir()
  (system / "passwd").write_text("root:x:0:0")
  (tmp_path / "empty").mkdir()
  for name, target in (("link", system), ("link_empty", tmp_path / "empty"), ("dangling", "nope")):
    link = tmp_path / name
    os.symlink(target, link)
    one_line_error(
      capsys,
      ["--workdir", workdir, "--out", str(link), "--overwrite"],
      f"--out {link}: is a symbolic link (to {target})",
    )
  assert os.listdir(system) == ["passwd"] and os.listdir(tmp_path / "empty") == []
  assert sorted(os.listdir(tmp_path)) == sorted(
    ["usr_share", "empty", "link", "link_empty", "dangling"]
  )


def test_card_shows_the_probe_scores_of_the_exported_step(tmp_path):
  ev = tmp_path / "eval"
  ev.mkdir()
  (ev / "step_2.json").write_text(json.dumps({"suite": "offline", "results": {}}))
  (ev / "step_2.md").write_text("### offline crossbert step_2 (/some/workdir)\n\n| task | x |\n")
  (ev / "mteb-step_2-0123abcd.json").write_text(
    json.dumps({"suite": "mteb", "results": {"average": {"all": 0.25}}})
  )
  (ev / "step_20.json").write_text(json.dumps({"suite": "offline", "results": {}}))
  assert [os.path.basename(p) for p in record_lib.suite_results(str(tmp_path), 2)] == [
    "mteb-step_2-0123abcd.json",
    "step_2.json",
  ]
  text = "\n".join(card_lib._eval_section(str(tmp_path), 2))  # pylint: disable=protected-access
  assert "| task | x |" in text and "/some/workdir" not in text and "all 0.2500" in text
  assert "step_20" not in text
  assert "No probe suite" in "\n".join(card_lib._eval_section(str(tmp_path), 3))  # pylint: disable=protected-access


def readme_snippets() -> list[str]:
  """The ```python blocks of the README's "Use your encoder" section."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## Use your encoder", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_snippets_give_the_probe_features(exported):
  """What a user copies from the README (the export path swapped for a tiny export) runs and
  gives the probes' mean-pooled features of the same two texts."""
  run, d = exported["crossbert"]
  snippets = readme_snippets()
  assert len(snippets) == 2 and all('"runs/smoke_export"' in code for code in snippets)
  seq_len = int(run.config.data.seq_len)
  feat = features.Featurizer(run.graphdef, run.params, batch_size=8, seq_len=seq_len)
  texts = ["A sentence to embed.", "Another one."]
  want = feat(features.encode_texts(texts, run.tokenizer, seq_len))  # [2, d]
  # cbert_jax.embed's vectors are the same (length buckets, its own batching).
  jax_emb = embed.Embedder(run, seq_len=seq_len, batch_size=8)(texts)
  np.testing.assert_allclose(jax_emb, want, rtol=0, atol=1e-5)
  for code in snippets:
    scope: dict = {}
    exec(code.replace('"runs/smoke_export"', repr(d)), scope)  # noqa: S102
    got = scope["emb"].numpy() if hasattr(scope["emb"], "numpy") else scope["emb"]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


EDGE_TEXTS = ["", "  ", "a" * 5000, "\t\n", "A sentence to embed.", " ".join(["word"] * 400)]


def test_empty_and_long_texts_embed_as_cbert_jax_embed_does(exported):
  """An empty or whitespace-only text (no tokens) embeds to zeros and a text past seq_len is cut,
  identically through cbert_jax.embed, sentence-transformers (also a batch of only empty texts,
  which the default --st_padding max_length makes runnable) and the README's transformers
  snippet; never NaN, never an exception."""
  run, d = exported["crossbert"]
  seq_len = int(run.config.data.seq_len)
  want = embed.Embedder(run, seq_len=seq_len, batch_size=8)(EDGE_TEXTS)  # [6, d]
  assert np.isfinite(want).all()
  assert not want[[0, 1, 3]].any() and np.abs(want[[2, 4, 5]]).min(axis=1).max() > 0
  st = SentenceTransformer(d, device="cpu")
  assert st.max_seq_length == seq_len
  np.testing.assert_allclose(st.encode(EDGE_TEXTS), want, rtol=0, atol=1e-5)
  # sentence-transformers sorts by length: 40 empty texts fill a whole batch of 32 with nothing
  only_empty = st.encode(["", " "] * 20)
  assert only_empty.shape == (40, want.shape[1]) and not only_empty.any()
  hf = [s for s in readme_snippets() if "AutoModel" in s][0]
  scope: dict = {}
  exec(hf.replace('"runs/smoke_export"', repr(d)), scope)  # noqa: S102  (as a user copies it)
  np.testing.assert_allclose(scope["embed"](EDGE_TEXTS).numpy(), want, rtol=0, atol=1e-5)
  got = scope["embed"](["", "  "]).numpy()
  assert got.shape == (2, want.shape[1]) and not got.any()
  assert AutoTokenizer.from_pretrained(d).model_max_length == seq_len


def test_st_padding_longest_writes_the_library_default_and_a_bad_value_is_refused(
  trained_run, tmp_path, capsys
):
  workdir = trained_run("crossbert")
  fast = tmp_path / "fast"
  argv = ["--workdir", workdir, "--format", "sentence-transformers"]
  assert export_cli.main([*argv, "--out", str(fast), "--st_padding", "longest"]) == 0
  cfg = json.loads((fast / "sentence_bert_config.json").read_text())
  assert "processing_kwargs" not in cfg and cfg["max_seq_length"] > 0
  assert "--st_padding longest" in (fast / "README.md").read_text()
  assert SentenceTransformer(str(fast), device="cpu").encode(["", "a b c"]).shape[0] == 2
  bad = tmp_path / "bad"
  assert export_cli.main([*argv, "--out", str(bad), "--st_padding", "shortest"]) == 2
  assert "--st_padding shortest: expected one of max_length, longest" in capsys.readouterr().err
  assert not bad.exists()


def test_the_card_and_manifest_name_the_run_not_its_path(exported):
  run, d = exported["bert"]
  card = open(os.path.join(d, "README.md"), encoding="utf-8").read()
  manifest = json.load(open(os.path.join(d, export_cli.export_lib.MANIFEST)))
  name = os.path.basename(os.path.normpath(run.workdir))
  assert f"of the run `{name}`" in card and manifest["workdir"] == name
  parent = os.path.dirname(os.path.normpath(run.workdir))
  assert parent not in card and parent not in json.dumps(manifest)


def test_the_card_metadata_carries_the_exported_steps_scores(trained_run, tmp_path):
  """The offline kit's and mteb's scores of the exported step become the card's `model-index`,
  which huggingface_hub reads back as evaluation results with the same values; a skipped task and
  a non-finite score are left out."""
  from huggingface_hub import ModelCard  # pylint: disable=import-outside-toplevel

  workdir = tmp_path / "run"
  shutil.copytree(trained_run("bert"), workdir)
  ev = workdir / "eval"
  offline = {
    "sentiment": {
      "kind": "classification",
      "metric": "accuracy",
      "headline_split": "test",
      "ridge": {"dev": 0.6, "test": 0.625},
    },
    "graded_sentiment": {
      "kind": "regression",
      "metric": "spearman",
      "headline_split": "test",
      "ridge": {"test": 0.3125},
    },
    "nli": {"kind": "pair", "skipped": "source archive missing"},
    "average": {"ridge": 0.46875},
  }
  mteb_results = {
    "Banking77Classification": {
      "type": "Classification",
      "main_score": "accuracy",
      "score": 0.5,
      "dataset": "mteb/banking77",
      "dataset_revision": "0fd18e25",
      "splits": ["test"],
    },
    "BrokenTask": {"type": "STS", "main_score": "cosine_spearman", "score": float("nan")},
    "average": {"all": 0.5},
    "failed": {},
  }
  (ev / "step_2.json").write_text(json.dumps({"suite": "offline", "results": offline}))
  (ev / "mteb-step_2.json").write_text(json.dumps({"suite": "mteb", "results": mteb_results}))
  out = tmp_path / "export"
  assert export_cli.main(["--workdir", str(workdir), "--out", str(out)]) == 0
  data = ModelCard.load(out / "README.md").data
  got = {
    (r.dataset_type, r.task_type, r.dataset_split, r.metric_type): r.metric_value
    for r in data.eval_results
  }
  assert got == {
    ("mteb/banking77", "Classification", "test", "accuracy"): 0.5,
    ("cbert_jax/offline/sentiment", "Classification", "test", "accuracy"): 0.625,
    ("cbert_jax/offline/graded_sentiment", "Regression", "test", "spearman"): 0.3125,
  }
  assert data.model_name == "cbert_jax/bert-d32L2-run"
  assert {r.dataset_revision for r in data.eval_results} == {"0fd18e25", None}


def test_safetensors_files_are_the_same_bytes_in_every_process(tmp_path):
  """safetensors orders a header's metadata as a Rust HashMap does, differently per process;
  `llama.write_safetensors` writes it sorted, so four processes write the same bytes (with six
  metadata keys the unsorted orders of four processes agree by chance about once in 10^8)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  code = (
    "import sys, numpy as np; from cbert_jax.export import llama; "
    "llama.write_safetensors(sys.argv[1], {'w': np.arange(6, dtype=np.float32).reshape(2, 3), "
    "'a': np.ones(4, np.float32)}, {k: k * 2 for k in ('m', 'b', 'z', 'c', 'q')})"
  )
  files = [tmp_path / f"{i}.safetensors" for i in range(4)]
  for f in files:
    subprocess.run([sys.executable, "-c", code, str(f)], check=True, cwd=ROOT)
  assert len({f.read_bytes() for f in files}) == 1
  got = load_file(str(files[0]))
  np.testing.assert_array_equal(got["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
