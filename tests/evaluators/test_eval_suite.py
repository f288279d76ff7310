"""The offline probe suite and --config.mode=eval, on synthetic tasks (no task-kit download)."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from cbert_jax import config_lib, evaluate, train
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import pooler as pooler_lib
from cbert_jax.evaluators import retrieval, suite
from tests import helpers
from tests.helpers import WORDS, eval_config


def test_mode_eval_on_a_trained_checkpoint_writes_json_and_table(
  tmp_path, cache, toy_tasks, capsys, monkeypatch
):
  train.run(eval_config(cache), str(tmp_path))

  # The workdir alone is enough: the run's tokenizer is read from it, the data is not prepared.
  def no_data(*a, **kw):
    raise AssertionError("mode=eval prepared the data instead of reading workdir/tokenizer.model")

  with monkeypatch.context() as m:
    m.setattr(evaluate.prepare, "prepare", no_data)
    results = evaluate.run(eval_config(cache, mode="eval"), str(tmp_path))
  [saved_path] = (tmp_path / "eval").glob("step_2-*.json")  # non-default evals: hashed name
  saved = json.loads(saved_path.read_text())
  assert saved["step"] == 2 and saved["results"] == json.loads(json.dumps(results))
  assert results["toy_cls"]["ridge"]["test"] > 0.95  # the marker word decides the label
  assert results["toy_cls"]["knn"]["test"] > 0.95
  assert results["toy_reg"]["ridge"]["test"] > 0.8  # Spearman
  assert 0 <= results["toy_retrieval"]["test"]["ndcg@10"] <= 1
  assert set(results["average"]) >= {"ridge", "logreg", "knn", "retrieval", "all"}
  # Logistic regression: class-label tasks only, with its selection and convergence facts.
  logreg = results["toy_cls"]["logreg"]
  assert logreg["test"] > 0.95 and "logreg" in results["toy_pair"]
  assert "logreg" not in results["toy_reg"] and "ridge" in results["toy_reg"]
  assert logreg["C"] in [c for c, _ in logreg["curve"]] and len(logreg["curve"]) == 7
  assert logreg["heldout"] == dict(map(tuple, logreg["curve"]))[logreg["C"]]
  assert logreg["edge"] in (None, "low", "high") and isinstance(logreg["converged"], bool)
  assert logreg["n_iter"] <= logreg["max_iter"] and isinstance(logreg["unconverged"], list)
  assert results["average"]["logreg"] == pytest.approx(
    np.mean([results[t]["logreg"]["test"] for t in ("toy_cls", "toy_pair")])
  )
  for probe, param in (("ridge", "lambda"), ("knn", "k")):  # the same schema for every probe
    entry = results["toy_cls"][probe]
    assert entry[param] in [v for v, _ in entry["curve"]] and "edge" in entry
  table = capsys.readouterr().out
  assert (
    "| toy_cls | classification | accuracy |" in table and saved_path.with_suffix(".md").exists()
  )
  assert "| ridge dev | ridge test | logreg dev | logreg test | kNN dev | kNN test |" in table
  row = next(line for line in table.splitlines() if line.startswith("| toy_reg |"))
  assert row.split("|")[6:8] == [" - ", " - "]  # regression: no logreg

  # A tokenizer.model that is not the run's (config.json records its sha256) is one clear error.
  conf_path = tmp_path / "config.json"
  conf = json.loads(conf_path.read_text())
  conf["provenance"]["data_manifest"]["tokenizer"]["sha256"] = "0" * 64
  conf_path.write_text(json.dumps(conf))
  with pytest.raises(ConfigError, match=r"tokenizer.model has sha256 .* config.json records"):
    evaluate.run(eval_config(cache, mode="eval"), str(tmp_path))
  (tmp_path / "tokenizer.model").write_bytes(b"not a model")
  with pytest.raises(ConfigError, match=r"tokenizer.model: .* is not a valid SentencePiece model"):
    evaluate.run(eval_config(cache, mode="eval"), str(tmp_path))


def test_layerwise_and_random_init_floor(tmp_path, cache, toy_tasks):
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init = "random"
  cfg.evals.layers = "all"
  cfg.evals.tasks = "toy_cls"
  results = evaluate.run(cfg, str(tmp_path))
  rows = results["toy_cls"]["layerwise"]
  assert [r["layer"] for r in rows] == [0, 1, 2]  # embeddings + 2 blocks of d32L2
  assert len(list((tmp_path / "eval").glob("random_init-*.json"))) == 1


def test_mode_eval_without_checkpoint_or_with_unknown_task_fails_clearly(
  tmp_path, cache, toy_tasks
):
  with pytest.raises(ConfigError, match="no checkpoint"):
    evaluate.run(eval_config(cache, mode="eval"), str(tmp_path / "empty"))
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init = "random"
  cfg.evals.tasks = "toy_cls,nope"
  with pytest.raises(ConfigError, match="evals.tasks: unknown task 'nope'"):
    evaluate.run(cfg, str(tmp_path / "w"))


def _pooler_evals(pooler: str):
  """The evals config of the suite with the pooler on and a few steps (fields may predate it)."""
  ecfg = config_lib.base_config().evals
  ecfg.tasks = "toy_retrieval"
  ecfg.seq_len = 8
  ecfg.batch_size = 8
  ecfg.pooler = pooler
  ecfg.pooler_steps = 4
  return ecfg


@pytest.fixture(scope="module")
def tiny_backbone():
  return nnx.split(helpers.build("crossbert", seed=0), nnx.Param)


def test_pooler_frozen_scores_test_only_and_leaves_params_untouched(
  toy_tasks, tiny_backbone, monkeypatch
):
  graphdef, params = tiny_backbone
  before = jax.tree.map(np.array, params)  # host copies
  # Spies: which pairs the pooler trains on, and which qrels the pooled search is scored against.
  trained, scored = [], []
  real_train, real_eval = pooler_lib.train_pooler, retrieval.evaluate
  monkeypatch.setattr(
    pooler_lib,
    "train_pooler",
    lambda g, p, a, b, **kw: trained.append((a, b, kw)) or real_train(g, p, a, b, **kw),
  )
  monkeypatch.setattr(
    retrieval, "evaluate", lambda *a, **kw: scored.append(a[4]) or real_eval(*a, **kw)
  )
  task = toy_tasks["toy_retrieval"]
  results = suite.run(graphdef, params, helpers.WordTokenizer(), _pooler_evals("frozen"))
  r = results["toy_retrieval"]
  assert set(r["pooler_frozen"]["test"]) >= {"ndcg@10", "mrr@10", "recall@1"}
  assert 0 <= r["pooler_frozen"]["test"]["ndcg@10"] <= 1
  assert "dev" not in r["pooler_frozen"] and "pooler_unfrozen" not in r
  # Trained on the dev pairs (one per query here), frozen; scored: mean-pool dev, test, pooled test.
  assert (
    len(trained) == 1 and trained[0][2]["frozen"] and trained[0][0]["tokens"].shape[0] == len(WORDS)
  )
  assert r["pooler_frozen"]["train_pairs"] == len(WORDS) and r["pooler_frozen"]["steps"] == 4
  assert [q is task.qrels["test"] for q in scored] == [False, True, True]
  assert scored[0] is task.qrels["dev"]
  assert results["average"]["retrieval_pooler_frozen"] == r["pooler_frozen"]["test"]["ndcg@10"]
  table = suite.markdown(results)
  assert "pooled retrieval" in table and "| toy_retrieval | ndcg@10 |" in table
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, params), before)


def test_pooler_unfrozen_runs_and_none_is_unchanged(toy_tasks, tiny_backbone):
  graphdef, params = tiny_backbone
  before = jax.tree.map(np.array, params)
  tok = helpers.WordTokenizer()
  # Only "unfrozen" runs here (the frozen path is the test above); the list form is parsed below.
  unfrozen = suite.run(graphdef, params, tok, _pooler_evals("unfrozen"))["toy_retrieval"]
  assert (
    0 <= unfrozen["pooler_unfrozen"]["test"]["ndcg@10"] <= 1 and "pooler_frozen" not in unfrozen
  )
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, params), before)
  # Default "none": no pooler keys, no pooled table, same mean-pooled numbers.
  none = suite.run(graphdef, params, tok, _pooler_evals("none"))
  assert not any(k.startswith("pooler") for k in none["toy_retrieval"])
  assert set(none["average"]) == {"retrieval", "all"}
  assert "pooled" not in suite.markdown(none)
  assert none["toy_retrieval"]["test"] == unfrozen["test"]
  assert suite.pooler_modes(_pooler_evals("frozen, unfrozen")) == ["frozen", "unfrozen"]
  with pytest.raises(ConfigError, match="evals.pooler: unknown mode 'frozn'"):
    suite.task_names(_pooler_evals("frozn"))
  bad = _pooler_evals("none")
  bad.probes = "ridge,logistic"
  with pytest.raises(ConfigError, match="evals.probes: unknown probe 'logistic'"):
    suite.task_names(bad)


def test_markdown_and_average_with_logreg_edges_and_unconverged_fits():
  """The table, the averages and the selection notes from a hand-made results dict."""
  entry = lambda test, **kw: {"dev": test - 0.1, "test": test, "heldout": 0.5, "edge": None, **kw}
  results = {
    "a": {
      "kind": "classification",
      "metric": "accuracy",
      "ridge": entry(0.6, **{"lambda": 10.0}),
      "logreg": entry(
        0.7, C=100.0, edge="high", converged=False, n_iter=1000, max_iter=1000, unconverged=[100.0]
      ),
      "knn": entry(0.5, k=1, edge="low"),
    },
    "b": {"kind": "regression", "metric": "spearman", "ridge": entry(0.2, **{"lambda": 1.0})},
  }
  avg = suite.average(results)
  assert avg == pytest.approx({"ridge": 0.4, "logreg": 0.7, "knn": 0.5, "all": 0.4})
  assert list(avg) == ["ridge", "logreg", "knn", "all"]
  results["average"] = avg
  table = suite.markdown(results)
  assert (
    "| a | classification | accuracy | 0.5000 | 0.6000 | 0.6000 | 0.7000 | 0.4000 | 0.5000 |"
    in (table)
  )
  assert "| b | regression | spearman | 0.1000 | 0.2000 | - | - | - | - |" in table
  assert "* a logreg: C = 100 is the high edge of its grid" in table
  assert "* a logreg: the final fit did not converge (1000 of at most 1000 iterations)" in table
  assert "* a logreg: held-out fits that did not converge: C = 100" in table
  assert "* a knn: k = 1 is the low edge of its grid" in table
  assert "logreg: classification and pair tasks only" in table


def test_a_failing_task_costs_no_other_and_each_result_is_saved_as_it_finishes(
  toy_tasks, tiny_backbone, monkeypatch
):
  graphdef, params = tiny_backbone
  tok = helpers.WordTokenizer()
  ecfg = _pooler_evals("none")
  ecfg.tasks = "toy_cls,toy_reg,toy_pair,toy_retrieval"
  real = suite.probe_task

  def flaky(task, *args, **kwargs):
    if task.name == "toy_reg":
      raise FloatingPointError("the ridge solve blew up")
    return real(task, *args, **kwargs)

  monkeypatch.setattr(suite, "probe_task", flaky)
  saved = []
  results = suite.run(graphdef, params, tok, ecfg, on_task=saved.append)
  assert results["toy_reg"]["failed"] == "FloatingPointError: the ridge solve blew up"
  assert [list(s) for s in saved] == [
    ["toy_cls"],
    ["toy_cls", "toy_reg"],
    ["toy_cls", "toy_reg", "toy_pair"],
    ["toy_cls", "toy_reg", "toy_pair", "toy_retrieval"],
  ]
  for name in ("toy_cls", "toy_pair", "toy_retrieval"):
    assert not suite.not_scored(results[name])
  # The averages leave the failed task out and the table says so.
  assert results["average"]["all"] == pytest.approx(
    np.mean([suite.headline(results[n]) for n in ("toy_cls", "toy_pair", "toy_retrieval")])
  )
  table = suite.markdown(results)
  assert "| toy_reg | regression | spearman | failed (FloatingPointError" in table
  assert "over the 3 scored tasks of 4; not scored: toy_reg" in table
  # A rerun with the scored tasks given: only the failed one is scored again.
  monkeypatch.setattr(suite, "probe_task", real)
  calls = []
  monkeypatch.setattr(
    suite, "probe_task", lambda task, *a, **kw: calls.append(task.name) or real(task, *a, **kw)
  )
  done = {k: v for k, v in results.items() if k != "average" and not suite.not_scored(v)}
  again = suite.run(graphdef, params, tok, ecfg, done=done)
  assert calls == ["toy_reg"] and not suite.not_scored(again["toy_reg"])
  assert again["toy_cls"] is done["toy_cls"]
