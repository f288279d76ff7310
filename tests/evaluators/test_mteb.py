"""The mteb encoder wrapper, offline: tiny local mteb tasks (classification, retrieval, STS).

mteb runs its real protocol on our frozen encoder; its retrieval scores (pytrec_eval) are
checked against our own retrieval metrics on the same embeddings.
"""

import json
import sys

import mteb  # noqa: F401  (the test extra installs it; these tests need it)
import numpy as np
import pytest
from datasets import Dataset, DatasetDict  # installed with mteb
from flax import nnx
from mteb.abstasks.classification import AbsTaskClassification
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.sts import AbsTaskSTS
from mteb.abstasks.task_metadata import TaskMetadata
from torch.utils.data import DataLoader

from cbert_jax import config_lib, evaluate
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import mteb_encoder, retrieval
from tests import helpers
from tests.helpers import WORDS, eval_config

KEYS = [f"k{i}" for i in range(20)]  # retrieval's rare words


def _metadata(name: str, kind: str, main_score: str, splits=("test",)) -> TaskMetadata:
  return TaskMetadata(
    name=name,
    type=kind,
    main_score=main_score,
    description=f"tiny local {kind} task",
    reference=None,
    dataset={"path": "local", "revision": "0"},
    category="t2t",
    eval_splits=list(splits),
    eval_langs=["eng-Latn"],
    date=("2026-01-01", "2026-01-01"),
    dialect=[],
    domains=[],
    task_subtypes=[],
    license="cc-by-4.0",
    annotations_creators="derived",
    modalities=["text"],
    sample_creation="found",
    bibtex_citation="",
  )


def _filler(rs, n=5):
  return " ".join(rs.choice(WORDS, n))


class TinyClassification(AbsTaskClassification):
  metadata = _metadata("TinyClassification", "Classification", "accuracy")

  def load_data(self, **kwargs):
    rs = np.random.RandomState(0)
    split = lambda n: {
      "text": [f"{['bad ', 'good '][i % 2] * 3}{_filler(rs)}" for i in range(n)],
      "label": [i % 2 for i in range(n)],
    }
    self.dataset = DatasetDict(
      {"train": Dataset.from_dict(split(40)), "test": Dataset.from_dict(split(20))}
    )
    self.data_loaded = True


def retrieval_data():
  """(queries {id: text}, corpus {id: text}, qrels {qid: {did: 1}}): a query shares its doc's key."""
  rs = np.random.RandomState(1)
  corpus = {f"d{i}": f"{k} {k} {k} {_filler(rs)}" for i, k in enumerate(KEYS)}
  queries = {f"q{i}": f"{k} {k}" for i, k in enumerate(KEYS)}
  return queries, corpus, {f"q{i}": {f"d{i}": 1} for i in range(len(KEYS))}


class TinyRetrieval(AbsTaskRetrieval):
  metadata = _metadata("TinyRetrieval", "Retrieval", "ndcg_at_10")

  def load_data(self, **kwargs):
    queries, corpus, qrels = retrieval_data()
    split = RetrievalSplitData(
      queries=Dataset.from_list([{"id": k, "text": v} for k, v in queries.items()]),
      corpus=Dataset.from_list([{"id": k, "text": v, "title": ""} for k, v in corpus.items()]),
      relevant_docs=qrels,
      top_ranked=None,
    )
    self.dataset = {"default": {"test": split}}
    self.data_loaded = True


class TinySTS(AbsTaskSTS):
  metadata = _metadata("TinySTS", "STS", "cosine_spearman")
  min_score, max_score = 0, 5

  def load_data(self, **kwargs):
    rs = np.random.RandomState(2)
    s1, s2, score = [], [], []
    for i in range(30):
      same = i % 4  # 0..3 shared key words
      keys = list(rs.choice(KEYS, 3, replace=False))
      other = list(rs.choice([k for k in KEYS if k not in keys], 3 - same, replace=False))
      s1.append(" ".join(keys * 2))
      s2.append(" ".join((keys[:same] + other) * 2))
      score.append(same * 5 / 3)
    self.dataset = DatasetDict(
      {"test": Dataset.from_dict({"sentence1": s1, "sentence2": s2, "score": score})}
    )
    self.data_loaded = True


@pytest.fixture(scope="module")
def backbone():
  return nnx.split(helpers.build("bert", seed=0), nnx.Param)


def _ecfg(**kw):
  ecfg = config_lib.base_config().evals
  ecfg.seq_len, ecfg.batch_size = 16, 8
  for k, v in kw.items():
    ecfg[k] = v
  return ecfg


def test_encoder_embeds_a_dataloader_like_the_featurizer(backbone):
  graphdef, params = backbone
  tok = helpers.WordTokenizer()
  enc = mteb_encoder.CbertEncoder(graphdef, params, tok, seq_len=16, batch_size=8)
  queries, corpus, _ = retrieval_data()
  texts = list(corpus.values()) + list(queries.values())  # 40 texts
  loader = DataLoader(Dataset.from_dict({"text": texts}), batch_size=3)  # mteb's batches differ
  got = enc.encode(
    loader, task_metadata=TinyRetrieval.metadata, hf_split="test", hf_subset="default"
  )
  direct = mteb_encoder.features_lib.Featurizer(graphdef, params, batch_size=5, seq_len=16)(
    mteb_encoder.features_lib.encode_texts(texts, tok, 16)
  )
  assert got.shape == (40, 32) and got.dtype == np.float32 and enc.num_texts == 40
  np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-6)
  sim = enc.similarity(got[:3], got)
  assert sim.shape == (3, 40)
  np.testing.assert_allclose(np.diag(sim[:, :3]), 1.0, rtol=1e-5)
  np.testing.assert_allclose(
    enc.similarity_pairwise(got[:3], got[3:6]), np.diag(sim[:, 3:6]), rtol=1e-5
  )


def test_mteb_runs_tiny_tasks_and_agrees_with_our_retrieval_metrics(tmp_path, backbone):
  graphdef, params = backbone
  tasks = [TinyClassification(), TinyRetrieval(), TinySTS()]
  tok = helpers.WordTokenizer()  # ids by first sight: share it to compare below
  results = mteb_encoder.run(
    graphdef,
    params,
    tok,
    _ecfg(),
    out_dir=str(tmp_path / "mteb"),
    name="cbert_jax/test",
    revision="r0",
    tasks=tasks,
  )
  assert results["failed"] == {}
  assert {k: v["type"] for k, v in results.items() if k not in ("average", "failed")} == {
    "TinyClassification": "Classification",
    "TinyRetrieval": "Retrieval",
    "TinySTS": "STS",
  }
  # Planted signals: far above chance (accuracy 0.5, nDCG@10 0.23 for 20 docs, correlation 0).
  assert results["TinyClassification"]["score"] > 0.9
  assert results["TinyRetrieval"]["score"] > 0.6
  assert results["TinySTS"]["score"] > 0.5
  assert results["average"]["all"] == pytest.approx(
    np.mean([results[t]["score"] for t in ("TinyClassification", "TinyRetrieval", "TinySTS")])
  )
  # mteb (pytrec_eval) and our retrieval module, on the same embeddings: the same numbers.
  enc = mteb_encoder.CbertEncoder(graphdef, params, tok, seq_len=16, batch_size=8)
  queries, corpus, qrels = retrieval_data()
  ours = retrieval.evaluate(
    enc.embed_texts(list(queries.values())),
    enc.embed_texts(list(corpus.values())),
    list(queries),
    list(corpus),
    qrels,
    ks=(1, 10),
  )
  saved = list((tmp_path / "mteb").rglob("TinyRetrieval.json"))
  assert len(saved) == 1  # mteb's result cache, in our workdir
  scores = json.loads(saved[0].read_text())["scores"]["test"][0]
  assert scores["ndcg_at_10"] == pytest.approx(ours["ndcg@10"], abs=1e-4)
  assert scores["mrr_at_10"] == pytest.approx(ours["mrr@10"], abs=1e-4)
  assert scores["recall_at_1"] == pytest.approx(ours["recall@1"], abs=1e-4)
  table = mteb_encoder.markdown(results)
  assert "| TinyRetrieval | Retrieval | ndcg_at_10 |" in table
  # Each task's result is also mteb's own file, which mteb's TaskResult loads back unchanged.
  for name in ("TinyClassification", "TinyRetrieval", "TinySTS"):
    r = results[name]
    assert r["dataset"] == "local" and r["dataset_revision"] == "0" and r["splits"] == ["test"]
    loaded = mteb.TaskResult.from_disk(tmp_path / "mteb" / r["mteb_file"])
    assert loaded.task_name == name and loaded.get_score() == pytest.approx(r["score"])


def test_pooler_embedding_trains_on_the_kit_and_returns_unit_vectors(
  tmp_path, backbone, toy_tasks, monkeypatch
):
  graphdef, params = backbone
  ecfg = _ecfg(mteb_embedding="pooler", pooler_steps=3, tasks="toy_cls,toy_retrieval")
  pooler_params, history = mteb_encoder.kit_retrieval_pooler(
    graphdef, params, helpers.WordTokenizer(), ecfg
  )
  assert len(history) == 3  # trained on toy_retrieval's dev pairs
  enc = mteb_encoder.CbertEncoder(
    graphdef, params, helpers.WordTokenizer(), seq_len=16, batch_size=8, pooler_params=pooler_params
  )
  z = enc.embed_texts(["k1 k1", "good good bad", ""])
  assert z.shape == (3, 256)
  np.testing.assert_allclose(np.linalg.norm(z[:2], axis=-1), 1.0, rtol=1e-5)
  results = mteb_encoder.run(
    graphdef,
    params,
    helpers.WordTokenizer(),
    ecfg,
    out_dir=str(tmp_path / "mteb"),
    name="cbert_jax/pooled",
    revision="r0",
    tasks=[TinyRetrieval()],
  )
  assert results["failed"] == {} and 0 <= results["TinyRetrieval"]["score"] <= 1


def test_mteb_settings_are_checked_before_any_model_work(monkeypatch, tmp_path, cache, toy_tasks):
  mteb_encoder.check(_ecfg(mteb_tasks="STS12, ArguAna"))  # real MTEB(eng, v2) tasks
  assert [t.metadata.name for t in mteb_encoder.select_tasks(_ecfg(mteb_tasks="STS12"))] == [
    "STS12"
  ]
  with pytest.raises(
    ConfigError, match=r"evals.mteb_tasks: \['STS99'\] are not in MTEB\(eng, v2\)"
  ):
    mteb_encoder.check(_ecfg(mteb_tasks="STS99"))
  with pytest.raises(ConfigError, match="evals.mteb_benchmark"):
    mteb_encoder.check(_ecfg(mteb_benchmark="MTEB(klingon)"))
  with pytest.raises(ConfigError, match="evals.mteb_embedding: expected one of"):
    mteb_encoder.check(_ecfg(mteb_embedding="cls"))
  monkeypatch.setitem(sys.modules, "mteb", None)  # as if not installed
  with pytest.raises(ConfigError, match=r"needs the `mteb` package: pip install -e '\.\[mteb\]'"):
    mteb_encoder.check(_ecfg())
  # mode=eval fails on the setting before building data or a model.
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init, cfg.evals.suites = "random", "offline,mteb"
  with pytest.raises(ConfigError, match="needs the `mteb` package"):
    evaluate.run(cfg, str(tmp_path))
  assert not (tmp_path / "eval").exists()
