"""The evaluator registry: one entry per suite, the same check / run / markdown for each."""

import ml_collections
import pytest

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import glue, mteb_encoder, registry, suite


def _evals(**kw):
  e = config_lib.base_config().evals
  with e.unlocked():
    for k, v in kw.items():
      e[k] = v
  return e


def test_every_suite_has_the_same_entry_points():
  assert list(registry.SUITES) == ["offline", "glue", "mteb"]
  assert registry.SUITES["offline"].markdown is suite.markdown
  assert registry.SUITES["glue"].markdown is glue.markdown
  assert registry.SUITES["mteb"].markdown is mteb_encoder.markdown
  assert registry.SUITES["mteb"].check is mteb_encoder.check
  for s in registry.SUITES.values():
    assert callable(s.check) and callable(s.run) and callable(s.markdown)


def test_selected_keeps_order_drops_repeats_and_checks_each_suite():
  assert [s.name for s in registry.selected(_evals(suites="glue, offline,glue"))] == [
    "glue",
    "offline",
  ]
  with pytest.raises(
    ConfigError,
    match="evals.suites: unknown suite 'gleu'; expected a comma list of offline, glue, mteb",
  ):
    registry.selected(_evals(suites="offline,gleu"))
  with pytest.raises(ConfigError, match="evals.suites: empty"):
    registry.selected(_evals(suites=" , "))
  with pytest.raises(ConfigError, match="sst"):  # glue's own check runs
    registry.selected(_evals(suites="glue", glue_tasks="sst"))


def test_run_passes_the_context_to_the_suite(monkeypatch):
  seen = {}

  def fake_mteb(graphdef, params, tokenizer, ecfg, **kw):
    seen.update(kw)
    return {"ok": 1}

  monkeypatch.setattr(mteb_encoder, "run", fake_mteb)
  ctx = registry.Context(
    cache_dir="/c", out_dir="/w/eval", model_label="cbert_jax/bert-d32L2", tag="step_4"
  )
  assert registry.SUITES["mteb"].run(None, None, None, ml_collections.ConfigDict(), ctx) == {
    "ok": 1
  }
  assert seen == {
    "out_dir": "/w/eval/mteb",
    "name": "cbert_jax/bert-d32L2",
    "revision": "step_4",
    "cache_dir": "/c",
    "mesh": None,
    "rules": None,
  }
