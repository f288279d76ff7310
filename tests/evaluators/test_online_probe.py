"""config.evals.every: the probe suite runs during training and its scores land in metrics.jsonl."""

import pytest

from cbert_jax import train
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import online
from cbert_jax.run import metrics as metrics_lib
from tests.helpers import eval_config


def test_online_probes_are_logged_every_n_steps(tmp_path, tmp_path_factory, toy_tasks):
  cfg = eval_config(str(tmp_path_factory.mktemp("cache")))
  cfg.total_steps = 4
  cfg.evals.every = 2
  cfg.evals.tasks = "toy_cls,toy_retrieval"
  cfg.evals.probes = "ridge"
  train.run(cfg, str(tmp_path))
  rows = metrics_lib.read_metrics(tmp_path / "metrics.jsonl")
  probe_rows = [r for r in rows if "probe/toy_cls/ridge" in r]
  assert [r["step"] for r in probe_rows] == [2, 4]
  for r in probe_rows:
    assert r["probe/toy_cls/ridge"] > 0.9 and 0 <= r["probe/toy_retrieval/ndcg@10"] <= 1
    assert {"probe/avg/ridge", "probe/avg/all"} <= set(r)


def test_unknown_online_task_fails_before_training(tmp_path, tmp_path_factory, toy_tasks):
  cfg = eval_config(str(tmp_path_factory.mktemp("cache")))
  cfg.evals.every = 2
  cfg.evals.tasks = "toy_cls,missing"
  with pytest.raises(ConfigError, match="evals.tasks"):
    train.run(cfg, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_flatten_names():
  res = {
    "t": {"kind": "classification", "metric": "accuracy", "ridge": {"test": 0.5, "dev": 0.4}},
    "r": {
      "kind": "retrieval",
      "metric": "ndcg@10",
      "test": {"ndcg@10": 0.25},
      "pooler_frozen": {"test": {"ndcg@10": 0.5}, "steps": 4},
    },
    "average": {"ridge": 0.5, "all": 0.375},
  }
  assert online.flatten(res) == {
    "probe/t/ridge": 0.5,
    "probe/r/ndcg@10": 0.25,
    "probe/r/pooler_frozen_ndcg@10": 0.5,
    "probe/avg/ridge": 0.5,
    "probe/avg/all": 0.375,
  }
