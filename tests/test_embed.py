"""`python -m cbert_jax.embed`: the same numbers as the probes' feature path, in input order,
whatever the input format, output format, length bucketing or device count; clear errors."""

import gzip
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from cbert_jax import embed
from cbert_jax.evaluators import features, pooler
from cbert_jax.run import trained
from tests.helpers import TINY


@pytest.fixture(scope="module")
def run(trained_run):
  return trained.load(trained_run("crossbert"))


def texts(n=60):
  with open(TINY) as f:
    lines = [line.strip() for line in f if line.strip()]
  # Mixed lengths (1-40 words: short, and cut to seq_len alike), an empty text, and input order
  # unlike length order.
  words = " ".join(lines).split()
  sizes = [1 + (7 * i) % 40 for i in range(n - 2)]
  out = [" ".join(words[i * 40 : i * 40 + k]) for i, k in enumerate(sizes)]
  return out + ["", " ".join(words[:200])]


def reference(run, xs, layer=-1):
  """The probes' path, unsharded and unbucketed: every text padded to the run's seq_len."""
  t = int(run.config.data.seq_len)
  feat = features.Featurizer(run.graphdef, run.params, batch_size=8, seq_len=t, layer=layer)
  return feat(features.encode_texts(xs, run.tokenizer, t))


def test_embed_text_file_matches_the_probe_features(tmp_path, trained_run, run, capsys):
  xs = texts()
  (tmp_path / "in.txt").write_text("\n".join(xs) + "\n")
  out = tmp_path / "emb.npy"
  rc = embed.main(
    [
      "--workdir",
      trained_run("crossbert"),
      "--input",
      str(tmp_path / "in.txt"),
      "--out",
      str(out),
      "--batch_size",
      "16",
    ]
  )
  assert rc == 0
  got = np.load(out)
  assert got.shape == (len(xs), run.model_cfg.d_model) and got.dtype == np.float32
  np.testing.assert_allclose(got, reference(run, xs), atol=1e-5)  # 8 devices + buckets vs 1, T
  assert not got[len(xs) - 2].any()  # the empty line: a zero vector
  summary = json.loads((tmp_path / "emb.npy.json").read_text())
  assert summary["texts"] == len(xs) and summary["step"] == 2 and summary["devices"] == 8
  ids = run.tokenizer.encode_batch(xs)
  assert (
    summary["truncated_texts"] == sum(len(i) > 32 for i in ids) and summary["pooling"] == "mean"
  )
  assert 0 < summary["truncated_texts"] < len(xs) - 10  # short and long texts alike
  assert summary["tokens"] == sum(min(len(i), 32) for i in ids)
  assert "texts/s" in capsys.readouterr().out  # progress line
  assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_jsonl_directory_to_parquet_layer_and_normalize(tmp_path, trained_run, run, capsys):
  xs = texts(30)
  d = tmp_path / "in"
  d.mkdir()
  for k, part in enumerate((xs[:10], xs[10:])):  # two files, read in sorted name order
    (d / f"part{k}.jsonl").write_text(
      "".join(json.dumps({"doc": f"d{k}-{i}", "body": x}) + "\n" for i, x in enumerate(part))
    )
  (d / "README.md").write_text("not an input")  # skipped, and said so
  (d / "notes.csv").write_text("a,b")
  (d / "old").mkdir()
  out = tmp_path / "emb.parquet"
  assert (
    embed.main(
      [
        "--workdir",
        trained_run("crossbert"),
        "--input",
        str(d),
        "--out",
        str(out),
        "--text_field",
        "body",
        "--id_field",
        "doc",
        "--layer",
        "1",
        "--normalize",
      ]
    )
    == 0
  )
  assert (
    f"--input {d}: skipped 3 entries that are not a .txt/.jsonl/.txt.gz/.jsonl.gz file: "
    "README.md, notes.csv, old/" in capsys.readouterr().out.splitlines()
  )
  table = pq.read_table(out).to_pydict()
  assert table["id"][:2] == ["d0-0", "d0-1"] and table["id"][10] == "d1-0"
  assert table["line"][:3] == [1, 2, 3] and table["source"][10].endswith("part1.jsonl")
  ref = reference(run, xs, layer=1)
  ref = ref / np.maximum(np.linalg.norm(ref, axis=-1, keepdims=True), 1e-12)
  np.testing.assert_allclose(np.array(table["embedding"]), ref, atol=1e-5)


def test_embed_with_a_saved_pooler_equals_the_pooler(tmp_path, trained_run, run):
  _, params = pooler.build_pooler(run.model_cfg, pooler.PoolerSpec(num_queries=2, out_dim=16))
  pooler.save(str(tmp_path / "pooler.npz"), params, layer=-1)
  xs = texts(20)
  (tmp_path / "in.txt").write_text("\n".join(xs) + "\n")
  assert (
    embed.main(
      [
        "--workdir",
        trained_run("crossbert"),
        "--input",
        str(tmp_path / "in.txt"),
        "--out",
        str(tmp_path / "e.npy"),
        "--pooler",
        str(tmp_path / "pooler.npz"),
        "--batch_size",
        "8",
      ]
    )
    == 0
  )
  t = int(run.config.data.seq_len)
  ref = pooler.embed(run.graphdef, run.params, params, features.encode_texts(xs, run.tokenizer, t))
  np.testing.assert_allclose(np.load(tmp_path / "e.npy"), ref, atol=1e-5)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, trained_run, capsys):
  w = trained_run("crossbert")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "fine"}\n{"title": "no text"}\n')
  out = tmp_path / "e.npy"
  assert embed.main(["--workdir", w, "--input", str(bad), "--out", str(out)]) == 2
  assert f"config error: --input {bad}:2: no field 'text' (--text_field)" in capsys.readouterr().err
  assert os.listdir(tmp_path) == ["bad.jsonl"]  # no output, no temp file
  out.write_bytes(b"keep me")
  good = tmp_path / "in.txt"
  good.write_text("a line\n")
  assert embed.main(["--workdir", w, "--input", str(good), "--out", str(out)]) == 2
  assert "--out" in capsys.readouterr().err and out.read_bytes() == b"keep me"
  assert (
    embed.main(
      [
        "--workdir",
        w,
        "--input",
        str(good),
        "--out",
        str(tmp_path / "e2.npy"),
        "--batch_size",
        "12",
      ]
    )
    == 2
  )
  assert "multiple of the 8 devices" in capsys.readouterr().err
  assert (
    embed.main(
      ["--workdir", str(tmp_path), "--input", str(good), "--out", str(tmp_path / "e3.npy")]
    )
    == 2
  )
  assert "no config.json" in capsys.readouterr().err


def test_input_that_is_not_utf8_is_one_line(tmp_path, trained_run, capsys):
  """A file that is not valid UTF-8 was a traceback (UnicodeDecodeError while counting). Now it is
  one line naming the file, the byte offset and the line, before the model is loaded; nothing is
  written. The same inside a .gz and in a folder."""
  w = trained_run("crossbert")
  bad = b"fine\nsecond line caf\xe9 au lait\nthird\n"  # latin-1, not UTF-8: byte 20, line 2
  d = tmp_path / "in"
  d.mkdir()
  (d / "a.txt").write_text("good\n")
  (d / "b.txt").write_bytes(bad)
  with gzip.open(tmp_path / "bad.txt.gz", "wb") as f:
    f.write(bad)
  for src, path in ((d / "b.txt", d / "b.txt"), (d, d / "b.txt"), (tmp_path / "bad.txt.gz",) * 2):
    out = tmp_path / "e.npy"
    assert embed.main(["--workdir", w, "--input", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
      f"config error: --input {path}: not UTF-8 text: byte 0xe9 at offset 20 (line 2) "
      "(invalid continuation byte); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    ), err
    assert sorted(os.listdir(tmp_path)) == ["bad.txt.gz", "in"]  # no output, no temp file
