"""Retrieval metrics against sklearn / brute force, exact search, and the contrastive pooler."""

import time

import jax
import numpy as np
import pytest
from flax import nnx
from sklearn.metrics import ndcg_score

from cbert_jax.evaluators import pooler as pooler_lib
from cbert_jax.evaluators import retrieval
from tests import helpers


def _qrels_from_matrix(rel: np.ndarray) -> dict:
  """Dense relevance [Q, D] -> qrels with only the judged (non-zero) entries, string ids."""
  return {
    f"q{i}": {f"d{j}": int(rel[i, j]) for j in np.flatnonzero(rel[i])} for i in range(rel.shape[0])
  }


def _ids(rel: np.ndarray):
  return [f"q{i}" for i in range(rel.shape[0])], [f"d{j}" for j in range(rel.shape[1])]


def _random_case(seed: int, graded: bool, q: int = 20, d: int = 50):
  rs = np.random.RandomState(seed)
  scores = rs.randn(q, d)  # continuous: no ties, so rankings are unique
  if graded:
    rel = rs.randint(0, 4, (q, d)) * (rs.rand(q, d) < 0.15)
  else:
    rel = (rs.rand(q, d) < 0.08).astype(int)
  rel[:, 0] = np.maximum(rel[:, 0], 1)  # every query has a relevant doc (sklearn, pytrec agree)
  return scores, rel


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ndcg_matches_sklearn(seed, graded):
  scores, rel = _random_case(seed, graded)
  qids, dids = _ids(rel)
  for k in (1, 10):
    ours = retrieval.ndcg_at_k(scores, _qrels_from_matrix(rel), k, qids, dids)
    np.testing.assert_allclose(ours, ndcg_score(rel, scores, k=k), rtol=1e-10)
  # The same from precomputed top-k ids.
  top = np.argsort(-scores, axis=1)[:, :10]
  np.testing.assert_allclose(
    retrieval.ndcg_at_k(top, _qrels_from_matrix(rel), 10, qids, dids),
    ndcg_score(rel, scores, k=10),
    rtol=1e-10,
  )


def _brute_mrr_recall(scores, rel, k):
  mrr, rec = [], []
  for i in range(scores.shape[0]):
    order = sorted(range(scores.shape[1]), key=lambda j: -scores[i, j])[:k]
    first = next((r for r, j in enumerate(order) if rel[i, j] > 0), None)
    mrr.append(0.0 if first is None else 1.0 / (first + 1))
    rec.append(sum(rel[i, j] > 0 for j in order) / (rel[i] > 0).sum())
  return np.mean(mrr), np.mean(rec)


@pytest.mark.parametrize("graded", [False, True])
def test_mrr_recall_match_brute_force(graded):
  scores, rel = _random_case(3, graded)
  qids, dids = _ids(rel)
  qrels = _qrels_from_matrix(rel)
  for k in (1, 5, 10):
    mrr, rec = _brute_mrr_recall(scores, rel, k)
    np.testing.assert_allclose(retrieval.mrr_at_k(scores, qrels, k, qids, dids), mrr, rtol=1e-12)
    np.testing.assert_allclose(retrieval.recall_at_k(scores, qrels, k, qids, dids), rec, rtol=1e-12)


def test_metric_conventions():
  """Hand-checked cases: a relevant doc outside the corpus still counts in IDCG and recall."""
  scores = np.array([[0.9, 0.1, 0.5]])  # ranking: d0, d2, d1
  qrels = {0: {0: 0, 1: 2, 99: 1}}  # d0 judged non-relevant; d99 not in the corpus
  # DCG@3 = 2 / log2(4) = 1; IDCG@3 = 2 + 1 / log2(3).
  np.testing.assert_allclose(retrieval.ndcg_at_k(scores, qrels, 3), 1.0 / (2 + 1 / np.log2(3)))
  assert retrieval.mrr_at_k(scores, qrels, 3) == pytest.approx(1 / 3)
  assert retrieval.mrr_at_k(scores, qrels, 2) == 0.0
  assert retrieval.recall_at_k(scores, qrels, 3) == pytest.approx(0.5)
  # Queries without a qrels entry are skipped; one with no relevant doc scores 0.
  assert retrieval.ndcg_at_k(np.vstack([scores, scores]), {1: {1: 1}}, 3) == pytest.approx(0.5)
  assert retrieval.recall_at_k(scores, {0: {0: 0}}, 3) == 0.0


def test_search_equals_full_argsort():
  rs = np.random.RandomState(0)
  q, d = rs.randn(37, 16), rs.randn(203, 16) * rs.rand(203, 1) * 5  # norms vary: cosine != dot
  s, idx = retrieval.search(q, d, k=10, batch_size=8)  # 5 blocks, the last partial
  cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
    d / np.linalg.norm(d, axis=1, keepdims=True)
  ).T
  np.testing.assert_array_equal(idx, np.argsort(-cos, axis=1)[:, :10])
  np.testing.assert_allclose(s, np.take_along_axis(cos, idx, 1), rtol=1e-5, atol=1e-6)
  _, idx_all = retrieval.search(q, d, k=500)  # k > D: the whole ranking
  np.testing.assert_array_equal(idx_all, np.argsort(-cos, axis=1))


def test_evaluate_perfect_and_keys():
  rs = np.random.RandomState(0)
  docs = rs.randn(30, 8)
  qids, dids = [f"q{i}" for i in range(30)], [f"d{i}" for i in range(30)]
  out = retrieval.evaluate(
    docs + 0.01 * rs.randn(30, 8),
    docs,
    qids,
    dids,
    {f"q{i}": {f"d{i}": 1} for i in range(30)},
    ks=(1, 10, 100),
  )
  assert out["num_queries"] == 30
  for k in (1, 10, 100):
    assert out[f"ndcg@{k}"] == out[f"mrr@{k}"] == out[f"recall@{k}"] == 1.0


def test_info_nce():
  rs = np.random.RandomState(0)
  z = rs.randn(8, 4).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  same = np.ones((8, 4), np.float32) / 2.0  # every pair identical
  loss, m = pooler_lib.info_nce(same, same, temperature=0.1)
  np.testing.assert_allclose(loss, np.log(8), rtol=1e-5)  # uniform over the batch
  # Symmetric = mean of the two directions; a->b alone is the row-wise cross-entropy.
  zb = z[rs.permutation(8)]
  logits = z @ zb.T / 0.1
  ce = lambda l: np.mean(np.log(np.exp(l).sum(1)) - np.diag(l))
  np.testing.assert_allclose(
    pooler_lib.info_nce(z, zb, 0.1, symmetric=False)[0], ce(logits), rtol=1e-5
  )
  np.testing.assert_allclose(
    pooler_lib.info_nce(z, zb, 0.1)[0], (ce(logits) + ce(logits.T)) / 2, rtol=1e-5
  )


# --- the pooler -----------------------------------------------------------------------------------

SEQ = 16
# Few noise ids, so a linear read-out of the tiny model's width can tell topic from noise tokens.
TOPIC_VOCAB = np.arange(5, 29)  # ids that carry the "topic" shared by the two sides of a pair
NOISE_VOCAB = np.arange(29, 37)  # ids drawn independently on each side


def _rows(token_lists, seq_len: int) -> dict:
  """One text per row, right-padded: segment 1 on real tokens, 0 on padding; positions 0.."""
  n = len(token_lists)
  rows = {k: np.zeros((n, seq_len), np.int32) for k in pooler_lib.ROW_KEYS}
  for i, toks in enumerate(token_lists):
    toks = list(toks)[:seq_len]
    rows["tokens"][i, : len(toks)] = toks
    rows["segment_ids"][i, : len(toks)] = 1
    rows["positions"][i, : len(toks)] = np.arange(len(toks))
  return rows


def _pairs(n: int, seed: int):
  """Pairs that share 3 topic tokens; each side adds 6-10 of its own noise tokens, shuffled."""
  rs = np.random.RandomState(seed)
  a, b = [], []
  for _ in range(n):
    topic = rs.choice(TOPIC_VOCAB, 3, replace=False)
    for side in (a, b):
      toks = np.concatenate([topic, rs.choice(NOISE_VOCAB, rs.randint(6, 11))])
      side.append(rs.permutation(toks))
  return _rows(a, SEQ), _rows(b, SEQ)


def _recall_at_1(graphdef, bp, pp, a, b) -> float:
  za = pooler_lib.embed(graphdef, bp, pp, a, batch_size=64)
  zb = pooler_lib.embed(graphdef, bp, pp, b, batch_size=64)
  n = za.shape[0]
  return retrieval.evaluate(
    za, zb, list(range(n)), list(range(n)), {i: {i: 1} for i in range(n)}, ks=(1,)
  )["recall@1"]


@pytest.fixture(scope="module")
def backbone():
  # d_model 64: at width 32 a random frozen backbone's features cap recall@1 near 0.2 on this task.
  model = helpers.build("crossbert", seed=0, cfg=helpers.model_cfg(d_model=64))
  return nnx.split(model, nnx.Param)


def test_pooler_shapes_and_padding(backbone):
  graphdef, bp = backbone
  spec = pooler_lib.PoolerSpec(num_queries=2, out_dim=24)
  _, pp = pooler_lib.build_pooler(nnx.merge(graphdef, bp).cfg, spec)
  a, _ = _pairs(5, seed=7)
  z = pooler_lib.embed(graphdef, bp, pp, a, batch_size=4)  # 2 batches, the last padded
  assert z.shape == (5, 24)
  np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-5)
  # Padding is masked: changing tokens under segment 0 changes nothing.
  a2 = {k: v.copy() for k, v in a.items()}
  a2["tokens"][a2["segment_ids"] == 0] = 77
  np.testing.assert_allclose(pooler_lib.embed(graphdef, bp, pp, a2, batch_size=4), z, atol=1e-6)


def test_frozen_pooler_learns_synthetic_retrieval(backbone):
  graphdef, bp = backbone
  before = jax.tree.map(np.array, bp)  # host copies
  train_a, train_b = _pairs(4096, seed=1)
  test_a, test_b = _pairs(128, seed=2)  # unseen topics
  spec = pooler_lib.PoolerSpec(num_queries=4, out_dim=64)
  _, pp0 = pooler_lib.build_pooler(nnx.merge(graphdef, bp).cfg, spec, seed=0)
  r_init = _recall_at_1(graphdef, bp, pp0, test_a, test_b)
  t0 = time.time()
  pp, bp_out, hist = pooler_lib.train_pooler(
    graphdef,
    bp,
    train_a,
    train_b,
    frozen=True,
    steps=250,
    batch_size=64,
    lr_pooler=3e-3,
    temperature=0.05,
    spec=spec,
    seed=0,
  )
  r = _recall_at_1(graphdef, bp, pp, test_a, test_b)
  print(
    f"frozen: recall@1 init {r_init:.3f} -> trained {r:.3f} (chance {1 / 128:.3f}); "
    f"loss {hist[0]['loss']:.3f} -> {hist[-1]['loss']:.3f}; {time.time() - t0:.1f}s"
  )
  assert len(hist) == 250
  assert bp_out is bp
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, bp), before)  # bit-identical
  assert hist[-1]["loss"] < hist[0]["loss"]
  assert r > 0.3 and r > r_init + 0.2  # chance: 1/128


def test_unfrozen_changes_backbone(backbone):
  graphdef, bp = backbone
  before = jax.tree.map(np.array, bp)
  a, b = _pairs(256, seed=3)
  _, bp_out, hist = pooler_lib.train_pooler(
    graphdef,
    bp,
    a,
    b,
    frozen=False,
    epochs=1,
    batch_size=64,
    lr_backbone=1e-3,
    spec=pooler_lib.PoolerSpec(num_queries=2, out_dim=32),
  )
  assert len(hist) == 4  # one epoch, 256 / 64
  diffs = jax.tree.leaves(
    jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - y).max()), bp_out, before)
  )
  assert max(diffs) > 0
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.array, bp), before)  # input untouched
