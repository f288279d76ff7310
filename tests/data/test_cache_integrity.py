"""Self-checking cache entries (issue 15, item 3): damaged entries are moved aside and rebuilt.

Every entry type (trained tokenizer, packed `.npz`, offline-corpus TFDS shards, task kit
extracts, packed ArrayRecord shards of `data.corpus="sources"`) is damaged the ways users
met (truncated, a flipped byte, garbage, empty) and the next read must warn, move the file
to `<cache>/damaged/` and rebuild exactly what was there. Small corpora keep this fast.
"""

import json
import logging
import os
import shutil
import urllib.error

import ml_collections
import numpy as np
import pytest

from cbert_jax.data import cache_entry, fetch, packing, prepare, shards, sources
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.data.offline import build as offline_build
from cbert_jax.data.offline import readers as offline_readers
from cbert_jax.data.offline import tfds as offline_tfds
from cbert_jax.errors import ConfigError

TINY = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "tiny_corpus.txt"
)
SEQ_LEN = 32
VOCAB = 400


# --- Damage -----------------------------------------------------------------------------------


def truncate(path):
  data = open(path, "rb").read()
  open(path, "wb").write(data[: len(data) // 2])


def flip_middle(path, offset=None):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2 if offset is None else offset] ^= 0x5A
  open(path, "wb").write(bytes(data))


def garbage(path):
  size = os.path.getsize(path)
  open(path, "wb").write((b"not a cache entry " * (size // 18 + 1))[:size])


def empty(path):
  open(path, "wb").write(b"")


DAMAGE = {"truncate": truncate, "flip_middle": flip_middle, "garbage": garbage, "empty": empty}


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _damaged(cache):
  d = os.path.join(cache, cache_entry.DAMAGED_DIR)
  return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _assert_moved_and_warned(caplog, cache, path, what):
  """One warning naming the entry and where it went; the file is under damaged/."""
  messages = [m for m in _warnings(caplog) if path in m]
  assert len(messages) == 1, _warnings(caplog)
  assert messages[0].startswith(f"Damaged {what} {path} (")
  moved = [n for n in _damaged(cache) if not n.endswith(cache_entry.SIDECAR_SUFFIX)]
  assert len(moved) == 1 and f"moved to {os.path.join(cache, 'damaged', moved[0])}" in messages[0]
  return messages[0]


# --- Tokenizer and packed arrays (prepare.prepare) ------------------------------------------


def _cfg(cache, corpus_file, **kw):
  cfg = ml_collections.ConfigDict(
    dict(
      corpus="files",
      corpus_files=[str(corpus_file)],
      val_fraction=0.1,
      split_seed=0,
      max_docs=0,
      cache_dir=str(cache),
      tokenizer_path="",
      vocab_size=VOCAB,
      tokenizer_type="bpe",
      tokenizer_sample_chars=20_000_000,
      verify_cache="sample",
    )
  )
  cfg.update(kw)
  return cfg


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
  """About 40 kB of the tiny corpus: enough paragraphs for a 10% validation split."""
  path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
  path.write_text(open(TINY, encoding="utf-8").read()[:40_000], encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, corpus_file):
  """A cache built once: (cache dir, PackedData, tokenizer path, packed path)."""
  cache = tmp_path_factory.mktemp("pristine")
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  (packed,) = [
    os.path.join(cache, "packed", n) for n in os.listdir(cache / "packed") if n.endswith(".npz")
  ]
  return str(cache), data, data.tokenizer.model_path, packed


def _copy(pristine, tmp_path):
  """A private copy of the pristine cache; returns (cache, tokenizer path, packed path)."""
  src, _, tok, packed = pristine
  cache = str(tmp_path / "cache")
  shutil.copytree(src, cache)
  return cache, tok.replace(src, cache), packed.replace(src, cache)


def _assert_same(data, ref):
  assert data.tokenizer.sha256 == ref.tokenizer.sha256
  for split in ("train", "val"):
    for k in packing.KEYS:
      np.testing.assert_array_equal(getattr(data, split)[k], getattr(ref, split)[k])
  assert data.manifest == ref.manifest


def test_entries_have_sidecars(pristine):
  cache, data, tok, packed = pristine
  for path in (tok, packed):
    side = json.load(open(cache_entry.sidecar_path(path)))
    assert side["size"] == os.path.getsize(path)
    assert side["sha256"] == cache_entry.full_sha256(path)
    assert cache_entry.verify(path, "full") is None
  assert json.load(open(cache_entry.sidecar_path(tok)))["sha256"] == data.tokenizer.sha256


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("entry", ["tokenizer", "packed arrays"])
def test_damaged_entry_is_moved_aside_and_rebuilt(
  pristine, corpus_file, tmp_path, caplog, damage, entry
):
  cache, tok, packed = _copy(pristine, tmp_path)
  path = tok if entry == "tokenizer" else packed
  DAMAGE[damage](path)
  caplog.set_level(logging.WARNING)
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  message = _assert_moved_and_warned(caplog, cache, path, entry)
  reason = {"truncate": "size", "empty": "size", "garbage": "sha256", "flip_middle": "sha256"}[
    damage
  ]
  assert reason in message
  _assert_same(data, pristine[1])
  assert cache_entry.verify(path, "full") is None  # rebuilt, with a fresh sidecar
  # The tokenizer retrains to the same bytes, so the packed arrays stay a cache hit.
  assert ("cache_load" in data.timings) == (entry == "tokenizer")


def test_out_of_vocab_ids_are_caught(pristine, corpus_file, tmp_path, caplog):
  """A well-formed npz with a matching sidecar but an id >= vocab_size is damaged too."""
  cache, _, packed = _copy(pristine, tmp_path)
  with np.load(packed) as z:
    arrays = {k: z[k] for k in z.files}
  arrays["train_tokens"][3, 5] = VOCAB + 7
  cache_entry.write_entry(packed, lambda f: np.savez(f, **arrays), kind="packed arrays")
  assert cache_entry.verify(packed, "full") is None
  caplog.set_level(logging.WARNING)
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  message = _assert_moved_and_warned(caplog, cache, packed, "packed arrays")
  assert f"outside the tokenizer's vocabulary [0, {VOCAB})" in message
  _assert_same(data, pristine[1])


def test_entries_without_sidecar_are_checked_and_adopted(
  pristine, corpus_file, tmp_path, caplog, monkeypatch
):
  """Entries written before sidecars: used if they load, then given a sidecar."""
  cache, tok, packed = _copy(pristine, tmp_path)
  for path in (tok, packed):
    os.remove(cache_entry.sidecar_path(path))
  monkeypatch.setattr(tokenizer_lib, "_train", lambda *a, **k: pytest.fail("retrained"))
  caplog.set_level(logging.WARNING)
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  assert "cache_load" in data.timings and not _warnings(caplog) and not _damaged(cache)
  _assert_same(data, pristine[1])
  for path in (tok, packed):
    assert cache_entry.verify(path, "full") is None
    assert "note" in json.load(open(cache_entry.sidecar_path(path)))
  # Without a sidecar a damaged npz is still caught: it does not load (zip CRC / header).
  os.remove(cache_entry.sidecar_path(packed))
  flip_middle(packed)
  monkeypatch.undo()
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  assert "does not load" in _assert_moved_and_warned(caplog, cache, packed, "packed arrays")
  _assert_same(data, pristine[1])


def test_full_verification_catches_what_the_sample_misses(
  corpus_file, tmp_path, caplog, monkeypatch
):
  """A flip outside the sampled first/middle/last regions: only verify_cache=full sees it
  in the digest (the zip CRC still stops the load in sample mode)."""
  monkeypatch.setattr(cache_entry, "SAMPLE_BYTES", 4096)  # recorded in the sidecars
  cache = str(tmp_path / "cache")
  ref = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  (packed,) = [
    os.path.join(cache, "packed", n)
    for n in os.listdir(os.path.join(cache, "packed"))
    if n.endswith(".npz")
  ]
  size = os.path.getsize(packed)
  assert size > 8 * 4096
  assert json.load(open(cache_entry.sidecar_path(packed)))["sample_bytes"] == 4096
  flip_middle(packed, offset=2 * 4096)  # inside train_tokens' data, outside every sample
  assert cache_entry.verify(packed, "sample") is None
  assert cache_entry.verify(packed, "full") == "sha256 does not match its record"
  caplog.set_level(logging.WARNING)
  data = prepare.prepare(_cfg(cache, corpus_file, verify_cache="full"), SEQ_LEN)
  assert "sha256 does not match its record" in _assert_moved_and_warned(
    caplog, cache, packed, "packed arrays"
  )
  _assert_same(data, ref)
  # The same damage in sample mode: not in the digest, but the load fails on the CRC.
  flip_middle(packed, offset=2 * 4096)
  caplog.clear()
  shutil.rmtree(os.path.join(cache, "damaged"))
  data = prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
  assert "CRC" in _assert_moved_and_warned(caplog, cache, packed, "packed arrays")
  _assert_same(data, ref)


def test_bad_verify_cache_value(corpus_file, tmp_path):
  with pytest.raises(ConfigError, match=r"^data\.verify_cache must be one of 'sample', 'full'"):
    prepare.prepare(_cfg(tmp_path, corpus_file, verify_cache="always"), SEQ_LEN)


def test_sources_gone(pristine, corpus_file, tmp_path):
  """The source file deleted and the entries damaged: one line naming the file."""
  cache, tok, packed = _copy(pristine, tmp_path)
  source = tmp_path / "gone.txt"
  shutil.copy(corpus_file, source)
  garbage(packed)
  garbage(tok)
  os.remove(source)
  with pytest.raises(ConfigError) as e:
    prepare.prepare(_cfg(cache, source), SEQ_LEN)
  assert str(e.value) == f"data.corpus_files: no such file {str(source)!r}."
  # A cached tokenizer given as data.tokenizer_path (its corpus is not needed any more):
  # damage is reported with the way to rebuild it.
  with pytest.raises(ConfigError) as e:
    prepare.prepare(_cfg(cache, corpus_file, tokenizer_path=tok), SEQ_LEN)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"data.tokenizer_path: {tok!r} is damaged (")
  assert "set data.tokenizer_path='' to train the tokenizer again" in msg


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_cache_files_honour_the_umask(corpus_file, tmp_path, umask):
  cache = tmp_path / "cache"
  old = os.umask(umask)
  try:
    prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)
    garbage(next((cache / "packed").glob("*.npz")))
    prepare.prepare(_cfg(cache, corpus_file), SEQ_LEN)  # moves it aside: damaged/ too
  finally:
    os.umask(old)
  seen = set()
  for root, dirs, files in os.walk(cache):
    for name in dirs:
      assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o777 & ~umask, name
    for name in files:
      assert os.stat(os.path.join(root, name)).st_mode & 0o777 == 0o666 & ~umask, name
      seen.add(name.rsplit(".", 1)[-1])
  assert {"model", "npz", "json"} <= seen and (cache / "damaged").is_dir()


# --- TFDS ArrayRecord shards of the offline corpus --------------------------------------------


def _built():
  docs = [
    offline_readers.Document(
      f"Document {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(40)),
      "gutenberg",
      f"book-{i % 3}.txt",
    )
    for i in range(300)
  ]
  return offline_build.Built(
    train=docs[:290], validation=docs[290:], manifest=dict(content_hash="test", counts={})
  )


@pytest.fixture(scope="module")
def tfds_pristine(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("tfds"))
  records, manifest = offline_tfds.load_records("small", cache, built=_built())
  return cache, records, manifest


def _shard(cache):
  path = offline_tfds.dataset_dir(cache, "small")
  (shard,) = [os.path.join(path, n) for n in os.listdir(path) if "train.array_record" in n]
  return shard


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_tfds_shard_is_rebuilt(tfds_pristine, tmp_path, caplog, damage):
  src, records, _ = tfds_pristine
  cache = str(tmp_path / "cache")
  shutil.copytree(src, cache)
  shard = _shard(cache)
  DAMAGE[damage](shard)
  caplog.set_level(logging.WARNING)
  again, _ = offline_tfds.load_records("small", cache, built=_built())
  assert again == records
  path = offline_tfds.dataset_dir(cache, "small")
  (message,) = [m for m in _warnings(caplog) if path in m]
  assert message.startswith(f"Damaged offline corpus dataset (small) {path} (")
  assert os.path.basename(shard) in message
  assert [n.startswith("tfds-offline_corpus-small-") for n in _damaged(cache)] == [True]
  assert offline_tfds.verify(path, "full") is None


def test_tfds_unreadable_shard_without_sidecar(tfds_pristine, tmp_path, caplog):
  """A dataset from before sidecars: adopted when it reads, rebuilt when it does not."""
  src, records, _ = tfds_pristine
  cache = str(tmp_path / "cache")
  shutil.copytree(src, cache)
  path = offline_tfds.dataset_dir(cache, "small")
  os.remove(os.path.join(path, offline_tfds.FILES_SIDECAR))
  assert offline_tfds.load_records("small", cache, built=None)[0] == records  # no rebuild
  assert offline_tfds.verify(path, "full") is None and not _damaged(cache)
  os.remove(os.path.join(path, offline_tfds.FILES_SIDECAR))
  truncate(_shard(cache))  # no digest to compare: reading the records fails
  caplog.set_level(logging.WARNING)
  assert offline_tfds.load_records("small", cache, built=_built())[0] == records
  (message,) = [m for m in _warnings(caplog) if path in m]
  assert "reading it fails" in message
  assert offline_tfds.verify(path, "full") is None


def test_tfds_damaged_and_archives_gone(tfds_pristine, tmp_path, monkeypatch):
  src, _, _ = tfds_pristine
  cache = str(tmp_path / "cache")
  shutil.copytree(src, cache)
  truncate(_shard(cache))

  def offline(*args, **kwargs):
    raise urllib.error.URLError("network disabled in tests")

  monkeypatch.setattr(fetch.urllib.request, "urlopen", offline)
  with pytest.raises(ConfigError) as e:
    offline_tfds.load_records("small", cache)
  msg = str(e.value)
  path = offline_tfds.dataset_dir(cache, "small")
  assert "\n" not in msg
  assert msg.startswith(f"data.corpus='offline_small': the cached dataset {path} was damaged (")
  assert "moved to " + os.path.join(cache, "damaged", "tfds-offline_corpus-small-") in msg
  assert "put it at " + os.path.join(cache, "downloads") in msg  # what to do


# --- Packed ArrayRecord shards (data.corpus="sources") ----------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "flip_middle"])
def test_damaged_preprocess_shard_is_rebuilt(pristine, corpus_file, tmp_path, caplog, damage):
  tok = pristine[1].tokenizer
  inputs = tmp_path / "in"
  inputs.mkdir()
  paras = open(corpus_file, encoding="utf-8").read().split("\n\n")
  for i in range(2):
    (inputs / f"{i}.txt").write_text("\n\n".join(paras[i::2]), encoding="utf-8")
  cfg = ml_collections.ConfigDict(dict(sources=f"{inputs}/*.txt"))
  kw = dict(
    tokenizer=tok, seq_len=SEQ_LEN, split_seed=0, val_fraction=0.1, shard_bytes=1, workers=1
  )
  srcs, opts = sources.expand_sources(cfg), sources.ReadOptions()
  out = str(tmp_path / "cache" / "packed" / "key")
  ref = shards.build(srcs, opts, out_dir=out, **kw)
  ref_bytes = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
  shard = os.path.join(out, ref["shards"]["00001"]["train"]["file"])
  DAMAGE[damage](shard)
  caplog.set_level(logging.WARNING)
  done = []
  again = shards.build(srcs, opts, out_dir=out, on_shard_done=done.append, **kw)
  assert done == [1] and again == ref
  assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == ref_bytes
  _assert_moved_and_warned(caplog, str(tmp_path / "cache"), shard, "packed shard")
