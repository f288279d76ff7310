"""The offline probe suite and --config.mode=eval, on synthetic tasks (no task-kit download)."""
import json
import os

import numpy as np
import pytest

from cbert_jax import evaluate, train
from cbert_jax.data import tfds_tasks
from cbert_jax.errors import ConfigError
from tests.test_train import tiny_config

WORDS = "the a of and to in that it was for on with as his at by from had not be".split()


def _texts(rs, marker, n):
  return [" ".join([marker] * 3 + list(rs.choice(WORDS, 6))) for _ in range(n)]


def synthetic_tasks():
  """A classification task decided by a marker word, a regression task, pairs and retrieval."""
  rs = np.random.RandomState(0)
  def split(n):
    texts = _texts(rs, "good", n // 2) + _texts(rs, "bad", n // 2)
    return {"ids": [str(i) for i in range(n)], "texts": texts,
            "labels": np.array([1] * (n // 2) + [0] * (n // 2), np.int32)}
  cls = tfds_tasks.Task("toy_cls", "classification", "accuracy", ("bad", "good"),
                        splits={"train": split(200), "dev": split(60), "test": split(60)})
  reg_splits = {}
  for name, n in (("train", 200), ("dev", 60), ("test", 60)):
    s = split(n)
    reg_splits[name] = dict(s, labels=s["labels"].astype(np.float32) * 2 - 1)
  reg = tfds_tasks.Task("toy_reg", "regression", "spearman", (), splits=reg_splits)
  pair_splits = {}
  for name, n in (("train", 200), ("dev", 60), ("test", 60)):
    s = split(n)
    pair_splits[name] = {"ids": s["ids"], "texts_a": s["texts"], "texts_b": list(reversed(s["texts"])),
                         "labels": s["labels"]}
  pair = tfds_tasks.Task("toy_pair", "pair", "accuracy", ("no", "yes"), splits=pair_splits)
  corpus = [f"{w} {w} {w} story" for w in WORDS]
  retr = tfds_tasks.Task(
      "toy_retrieval", "retrieval", "ndcg@10", (), corpus={"ids": WORDS, "texts": corpus},
      queries={s: {"ids": [f"q{w}" for w in WORDS], "texts": [f"{w} {w}" for w in WORDS]} for s in ("dev", "test")},
      qrels={s: {f"q{w}": {w: 1} for w in WORDS} for s in ("dev", "test")})
  return {t.name: t for t in (cls, reg, pair, retr)}


@pytest.fixture
def toy_tasks(monkeypatch):
  tasks = synthetic_tasks()
  monkeypatch.setattr(tfds_tasks, "list_tasks", lambda: list(tasks))
  monkeypatch.setattr(tfds_tasks, "load_task", lambda name, **kw: tasks[name])
  return tasks


def eval_config(cache, **kw):
  c = tiny_config(cache, total_steps=2, checkpoint_every=2, **kw)
  c.evals.tasks = "toy_cls,toy_reg,toy_pair,toy_retrieval"
  c.evals.seq_len = 16
  c.evals.batch_size = 32
  return c


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("eval_cache"))


def test_mode_eval_on_a_trained_checkpoint_writes_json_and_table(tmp_path, cache, toy_tasks, capsys):
  train.run(eval_config(cache), str(tmp_path))
  results = evaluate.run(eval_config(cache, mode="eval"), str(tmp_path))
  saved = json.loads((tmp_path / "eval" / "step_2.json").read_text())
  assert saved["step"] == 2 and saved["results"] == json.loads(json.dumps(results))
  assert results["toy_cls"]["ridge"]["test"] > 0.95          # the marker word decides the label
  assert results["toy_cls"]["knn"]["test"] > 0.95
  assert results["toy_reg"]["ridge"]["test"] > 0.8            # Spearman
  assert 0 <= results["toy_retrieval"]["test"]["ndcg@10"] <= 1
  assert set(results["average"]) >= {"ridge", "knn", "retrieval", "all"}
  table = capsys.readouterr().out
  assert "| toy_cls | classification | accuracy |" in table and (tmp_path / "eval" / "step_2.md").exists()


def test_layerwise_and_random_init_floor(tmp_path, cache, toy_tasks):
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init = "random"
  cfg.evals.layers = "all"
  cfg.evals.tasks = "toy_cls"
  results = evaluate.run(cfg, str(tmp_path))
  rows = results["toy_cls"]["layerwise"]
  assert [r["layer"] for r in rows] == [0, 1, 2]             # embeddings + 2 blocks of d32L2
  assert (tmp_path / "eval" / "random_init.json").exists()


def test_mode_eval_without_checkpoint_or_with_unknown_task_fails_clearly(tmp_path, cache, toy_tasks):
  with pytest.raises(ConfigError, match="no checkpoint"):
    evaluate.run(eval_config(cache, mode="eval"), str(tmp_path / "empty"))
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init = "random"
  cfg.evals.tasks = "toy_cls,nope"
  with pytest.raises(ConfigError, match="evals.tasks: unknown task 'nope'"):
    evaluate.run(cfg, str(tmp_path / "w"))
