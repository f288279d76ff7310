"""Tests for pod-scale data: sources.py (formats, mixtures, bad input), preprocess.py and shards.py
(parallel, resumable ArrayRecord packing) and the ArrayRecord-backed pipeline.

Everything is built in tmp_path from tests/fixtures/tiny_corpus.txt; no network.
"""

import filecmp
import json
import os

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from array_record.python import array_record_module

from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import packing, pipeline, prepare, shard_tasks, shards, sources
from cbert_jax.data import text as text_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError

TINY = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tiny_corpus.txt"
)
DOCS = [
  " ".join(p.split())
  for p in open(TINY, encoding="utf-8").read().split("\n\n")
  if len(" ".join(p.split())) >= 60
]


def _jsonl(docs, field="text"):
  return "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def _write_array_record(path, records):
  w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
  for r in records:
    w.write(r)
  w.close()


def _docs(path, **opts):
  info = sources._stat(str(path))
  return list(sources.iter_documents(info, sources.ReadOptions(**opts)))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  """One small tokenizer for the module (trained on the tiny corpus, cached)."""
  cache = tmp_path_factory.mktemp("tok")
  cfg = ml_collections.ConfigDict(
    dict(
      tokenizer_path="",
      vocab_size=400,
      tokenizer_type="bpe",
      cache_dir=str(cache),
      tokenizer_sample_chars=20_000_000,
    )
  )
  corpus = corpus_lib.Corpus(
    train_docs=DOCS, val_docs=[], manifest=dict(content_hash=text_lib.content_hash([DOCS]))
  )
  return tokenizer_lib.get_tokenizer(cfg, corpus)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  """Four input files in three formats (about 30 KB each)."""
  d = tmp_path_factory.mktemp("inputs")
  q = len(DOCS) // 4
  (d / "a.jsonl").write_bytes(_jsonl(DOCS[:q]))
  (d / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(DOCS[q : 2 * q])))
  pq.write_table(pa.table({"text": DOCS[2 * q : 3 * q]}), d / "c.parquet")
  (d / "d.txt").write_text("\n\n".join(DOCS[3 * q :]))
  return d


def _cfg(cache, **kw):
  cfg = ml_collections.ConfigDict(
    dict(
      corpus="sources",
      sources="",
      text_field="text",
      text_mode="paragraphs",
      record_format="text",
      on_bad_record="error",
      preprocess_workers=1,
      shard_input_mb=1,
      val_fraction=0.1,
      split_seed=0,
      max_docs=0,
      cache_dir=str(cache),
      tokenizer_path="",
      vocab_size=400,
      tokenizer_type="bpe",
      tokenizer_sample_chars=20_000_000,
    )
  )
  cfg.update(kw)
  return cfg


def _build(corpus_dir, out, tok, workers=1, spec=None, **kw):
  cfg = _cfg(out, sources=spec or f"{corpus_dir}/*")
  return shards.build(
    sources.expand_sources(cfg),
    sources.read_options(cfg),
    tokenizer=tok,
    seq_len=32,
    out_dir=str(out),
    split_seed=0,
    val_fraction=0.1,
    shard_bytes=1,
    workers=workers,
    **kw,
  )


# --- sources -------------------------------------------------------------------------------


def test_every_format_reads_expected_docs(tmp_path):
  docs = ["First  document,\nwith a line break.", "Second document — ünïcode.", "Third."]
  want = [" ".join(d.split()) for d in docs]
  (tmp_path / "x.jsonl").write_bytes(b"\n" + _jsonl(docs, field="body"))  # blank lines ok
  assert _docs(tmp_path / "x.jsonl", text_field="body") == want
  # Two zstd frames back to back (as concatenated shards are).
  z = zstandard.ZstdCompressor()
  (tmp_path / "x.jsonl.zst").write_bytes(
    z.compress(_jsonl(docs[:2])) + z.compress(_jsonl(docs[2:]))
  )
  assert _docs(tmp_path / "x.jsonl.zst") == want
  pq.write_table(pa.table({"text": docs, "n": [1, 2, 3]}), tmp_path / "x.parquet")
  assert _docs(tmp_path / "x.parquet") == want
  _write_array_record(tmp_path / "t.array_record", [d.encode() for d in docs])
  assert _docs(tmp_path / "t.array_record") == want
  _write_array_record(
    tmp_path / "j.array_record-00000-of-00001", [json.dumps({"text": d}).encode() for d in docs]
  )
  assert _docs(tmp_path / "j.array_record-00000-of-00001", record_format="json") == want
  (tmp_path / "x.txt").write_text("\n\n".join(DOCS[:3]) + "\n\nshort\n")
  assert _docs(tmp_path / "x.txt") == DOCS[:3]  # paragraphs, short ones normalised away
  assert _docs(tmp_path / "x.txt", text_mode="file") == [" ".join(DOCS[:3] + ["short"])]


def test_parse_sources_and_globs(tmp_path):
  assert sources.parse_sources("gs://b/x/*.jsonl.zst:0.7, /d/*.txt:0.3,/e.txt") == [
    ("gs://b/x/*.jsonl.zst", 0.7),
    ("/d/*.txt", 0.3),
    ("/e.txt", 1.0),
  ]
  assert sources.parse_sources("gs://b/x.jsonl") == [("gs://b/x.jsonl", 1.0)]
  with pytest.raises(ConfigError, match="data.sources is empty"):
    sources.parse_sources(" , ")
  with pytest.raises(ConfigError, match=r"weight -1\.0"):
    sources.parse_sources("a.txt:-1")
  (tmp_path / "b.txt").write_text("x")
  (tmp_path / "a.txt").write_text("x")
  srcs = sources.expand_sources(_cfg(tmp_path, sources=f"{tmp_path}/*.txt:2"))
  assert [os.path.basename(f.path) for f in srcs[0].files] == ["a.txt", "b.txt"]
  assert srcs[0].weight == 2.0
  with pytest.raises(ConfigError, match="matches no file"):
    sources.expand_sources(_cfg(tmp_path, sources=f"{tmp_path}/*.jsonl"))
  with pytest.raises(ConfigError, match="matches no file"):
    sources.expand_sources(_cfg(tmp_path, sources=f"{tmp_path}/missing.txt"))
  with pytest.raises(ConfigError, match="data.on_bad_record"):
    sources.read_options(_cfg(tmp_path, on_bad_record="ignore"))
  with pytest.raises(ConfigError, match="data.max_docs"):
    sources.check_sources_config(_cfg(tmp_path, sources=f"{tmp_path}/a.txt", max_docs=5))


def test_bad_inputs_named_or_counted(tmp_path):
  good = json.dumps({"text": "fine"}).encode()
  cases = {  # file -> (bytes, error pattern, counted kind)
    "empty.jsonl": (b"", r"empty\.jsonl: yields no document", "empty_file"),
    "utf8.jsonl": (
      good + b'\n{"text": "\xff\xfe"}\n',
      r"utf8\.jsonl: line 2: is not valid UTF-8",
      "invalid_utf8",
    ),
    "json.jsonl": (
      good + b"\n{not json\n",
      r"json\.jsonl: line 2: is not valid JSON",
      "invalid_json",
    ),
    "field.jsonl": (
      good + b'\n{"txt": "x"}\n',
      r"field\.jsonl: line 2: field 'text' is missing",
      "missing_field",
    ),
    "null.jsonl": (
      good + b'\n{"text": null}\n',
      r"line 2: field 'text' is a NoneType",
      "missing_field",
    ),
    "blank.jsonl": (
      good + b'\n{"text": "  "}\n',
      r"line 2: the document text is empty",
      "empty_doc",
    ),
    "trunc.jsonl.zst": (
      zstandard.ZstdCompressor().compress(good + b"\n" + _jsonl(DOCS[:50]))[:-20],
      r"trunc\.jsonl\.zst: the zstd stream ends mid-frame",
      "truncated",
    ),
    "latin1.txt": (
      ("Caf\u00e9 " * 20).encode("latin-1"),
      r"latin1\.txt: line 1 \(byte 3\): is not valid UTF-8",
      "invalid_utf8",
    ),
    "bad.parquet": (b"not parquet", r"bad\.parquet: is not a Parquet file", "unreadable"),
  }
  for name, (data, pattern, kind) in cases.items():
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ConfigError, match=pattern):
      _docs(tmp_path / name)
    bad = sources.BadCounts()
    docs = list(
      sources.iter_documents(
        sources._stat(str(tmp_path / name)), sources.ReadOptions(on_bad_record="skip"), bad
      )
    )
    assert bad[kind] == 1, (name, bad)
    assert sum(bad.values()) == 1, (name, bad)
    if name.endswith(".jsonl") and name != "empty.jsonl":
      assert docs == ["fine"]
  pq.write_table(pa.table({"body": ["x"]}), tmp_path / "col.parquet")
  with pytest.raises(ConfigError, match=r"col\.parquet: has no column 'text'"):
    _docs(tmp_path / "col.parquet")


# --- preprocess ----------------------------------------------------------------------------


def _read_shards(out_dir, index, split):
  """All rows of a split, shard by shard: [(shard name, int32 [N, 3, T])]."""
  out = []
  for name in sorted(index["shards"]):
    e = index["shards"][name][split]
    r = array_record_module.ArrayRecordReader(os.path.join(out_dir, e["file"]))
    rows = np.frombuffer(b"".join(r.read_all()), "<i4").reshape(-1, 3, 32)
    r.close()
    assert len(rows) == e["rows"]
    out.append((name, rows))
  return out


def test_preprocess_preserves_tokens_and_boundaries(tmp_path, corpus_dir, tok, monkeypatch):
  # A tiny flush threshold exercises carrying a cut document across flushes.
  monkeypatch.setattr(shard_tasks, "_FLUSH_TOKENS", 100)
  index = _build(corpus_dir, tmp_path / "out", tok)
  srcs = sources.expand_sources(_cfg(tmp_path, sources=f"{corpus_dir}/*"))
  tasks = shards.plan_tasks(srcs, 1)
  assert len(tasks) == 4 and len(index["shards"]) == 4  # one file per shard here
  opts = sources.ReadOptions()
  for split in ("train", "val"):
    for task, (name, rows) in zip(tasks, _read_shards(tmp_path / "out", index, split)):
      docs = [
        d
        for d in sources.iter_documents(task.files[0], opts)
        if text_lib.is_val(d, 0, 0.1) == (split == "val")
      ]
      want = packing.pack(tok.encode_batch(docs), 32)  # the in-memory packer
      for j, k in enumerate(packing.KEYS):
        np.testing.assert_array_equal(rows[:, j], want[k], err_msg=f"{name} {split} {k}")
  m = index["manifest"]
  assert m["rows"]["train"] > 0 and m["rows"]["val"] > 0
  assert sum(s["train"]["docs"] + s["val"]["docs"] for s in m["sources"]) == len(DOCS)


def _same_dirs(a, b):
  names = sorted(os.listdir(a))
  assert names == sorted(os.listdir(b))
  assert not [n for n in names if n.startswith(".tmp")]
  _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
  assert not mismatch and not errors, (mismatch, errors)


def test_workers_and_resume_give_identical_bytes(tmp_path, corpus_dir, tok):
  one = _build(corpus_dir, tmp_path / "one", tok, workers=1)
  two = _build(corpus_dir, tmp_path / "two", tok, workers=2)
  assert one == two
  _same_dirs(tmp_path / "one", tmp_path / "two")

  class Interrupt(Exception):
    pass

  def stop(shard):
    raise Interrupt(shard)

  with pytest.raises(Interrupt):
    _build(corpus_dir, tmp_path / "resumed", tok, on_shard_done=stop)
  partial = json.loads((tmp_path / "resumed" / "index.json").read_text())
  assert len(partial["shards"]) == 1 and not partial["done"]
  seen = []
  resumed = _build(corpus_dir, tmp_path / "resumed", tok, on_shard_done=seen.append)
  assert seen == [1, 2, 3]  # shard 0 was not redone
  assert resumed == one
  _same_dirs(tmp_path / "one", tmp_path / "resumed")


def test_mixture_weights(tmp_path, tok):
  d = tmp_path / "in"
  d.mkdir()
  (d / "big.jsonl").write_bytes(_jsonl(DOCS))  # ~4x the small source
  (d / "small.jsonl").write_bytes(_jsonl(DOCS[::4][::-1]))
  index = _build(d, tmp_path / "out", tok, spec=f"{d}/big.jsonl:1,{d}/small.jsonl:1")
  big, small = index["manifest"]["sources"]
  assert small["keep_rate"] == 1.0 and 0.2 < big["keep_rate"] < 0.3
  chars = [s["train"]["chars"] + s["val"]["chars"] for s in (big, small)]
  assert abs(chars[0] / sum(chars) - 0.5) < 0.05  # equal weights: equal characters
  assert big["mixture_dropped_docs"] + big["train"]["docs"] + big["val"]["docs"] == len(DOCS)
  index = _build(d, tmp_path / "out3", tok, spec=f"{d}/big.jsonl:3,{d}/small.jsonl:1")
  big, small = index["manifest"]["sources"]
  chars = [s["train"]["chars"] + s["val"]["chars"] for s in (big, small)]
  assert abs(chars[0] / sum(chars) - 0.75) < 0.05


def test_prepare_sources_end_to_end_with_skip(tmp_path, corpus_dir):
  bad = tmp_path / "bad.jsonl"
  bad.write_bytes(_jsonl(DOCS[:5]) + b"{oops\n")
  spec = f"{corpus_dir}/a.jsonl:1,{bad}:0.2"
  with pytest.raises(ConfigError, match=r"bad\.jsonl: line 6: is not valid JSON"):
    prepare.prepare(_cfg(tmp_path / "c", sources=spec), 32)
  data = prepare.prepare(_cfg(tmp_path / "c", sources=spec, on_bad_record="skip"), 32)
  assert "preprocess" in data.timings
  assert data.manifest["sources"][1]["bad_records"]["invalid_json"] == 1
  assert isinstance(data.train, pipeline.ArrayRecordRows)
  assert pipeline.num_rows(data.train) == data.manifest["rows"]["train"] > 0
  again = prepare.prepare(_cfg(tmp_path / "c", sources=spec, on_bad_record="skip"), 32)
  assert "cache_load" in again.timings and again.manifest == data.manifest
  row = data.train[0]
  assert data.tokenizer.decode(row["tokens"][row["segment_ids"] == 1])


# --- loader --------------------------------------------------------------------------------


def test_array_record_loader_matches_memory(tmp_path, corpus_dir, tok):
  index = _build(corpus_dir, tmp_path / "out", tok)
  rows = shards.row_sources(str(tmp_path / "out"), index)["train"]
  n = len(rows)
  mem = rows.read(np.arange(n))  # the same rows in memory
  for k in packing.KEYS:
    assert mem[k].shape == (n, 32) and mem[k].dtype == np.int32
  gb, steps = 8, 2 * (n // 8)  # two epochs' worth of whole batches
  ref = pipeline.train_iterator(mem, global_batch=gb, seed=1, process_index=0, process_count=1)
  its = [
    pipeline.train_iterator(rows, global_batch=gb, seed=1, process_index=p, process_count=2)
    for p in range(2)
  ]
  ids = []
  for _ in range(steps):
    want = next(ref)
    local = [next(it) for it in its]
    for k in packing.KEYS:
      np.testing.assert_array_equal(np.concatenate([b[k] for b in local]), want[k])
    # Identify rows by their content to check coverage.
    ids.append(np.concatenate([b["tokens"] for b in local]))
  # The first n stream elements (epoch 0, assembled from both processes) are every row
  # exactly once; rows are told apart by content (the packed rows are all distinct).
  keys = {r.tobytes() for r in mem["tokens"]}
  assert len(keys) == n
  epoch0 = [r.tobytes() for r in np.concatenate(ids)[:n]]
  assert len(set(epoch0)) == n and set(epoch0) == keys
  assert its[0].get_state() == {"next_index": steps} == ref.get_state()
  ev = [
    pipeline.eval_batches(rows, global_batch=4, num_batches=3, process_index=p, process_count=2)
    for p in range(2)
  ]
  ev_mem = pipeline.eval_batches(
    mem, global_batch=4, num_batches=3, process_index=0, process_count=1
  )
  for s in range(3):
    np.testing.assert_array_equal(
      np.concatenate([ev[p][s]["tokens"] for p in range(2)]), ev_mem[s]["tokens"]
    )
