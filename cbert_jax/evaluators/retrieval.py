"""Retrieval metrics (nDCG@k, MRR@k, recall@k), batched cosine top-k search, and `evaluate`.

Definitions follow what BEIR and MTEB report: pytrec_eval's `ndcg_cut_k` and `recall_k`, and
their own MRR@k (reciprocal rank of the first relevant document within the top k):

* A query's *judged* documents are its qrels entry `{doc_id: relevance}`; relevance is an int (or
  float) grade and a document counts as *relevant* when its relevance is > 0. Unjudged documents
  have relevance 0.
* nDCG@k = DCG@k / IDCG@k with DCG@k = sum_{r=1..k} gain(d_r) / log2(r + 1), gain = relevance
  (linear gains as trec_eval, not 2^rel - 1; negative grades are clipped to 0 here). IDCG@k is the DCG@k of the judged
  documents sorted by relevance, *whether or not they are in `doc_ids`*, so a relevant document
  missing from the corpus still costs score. A query with no relevant document scores 0.
* MRR@k = 1 / rank of the first relevant document in the top k, 0 when there is none.
* recall@k = |relevant in top k| / |relevant|, 0 for a query with no relevant document.
* Each metric is the mean over the queries of `query_ids` that have a qrels entry (queries
  without one are skipped, as pytrec_eval evaluates only queries present in both run and qrels).

Ranking: scores descending; ties keep the lower column index first (a stable sort). pytrec_eval
breaks ties by document id instead, which only matters for exactly equal scores.
"""

from collections.abc import Mapping, Sequence

import numpy as np

Qrels = Mapping[object, Mapping[object, float]]


def _normalise(x: np.ndarray) -> np.ndarray:
  """Row-wise L2 normalisation in fp32; all-zero rows stay zero."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _top_k_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Top-k of every row of `scores` [B, D] -> (scores [B, k], column ids [B, k]), best first."""
  k = min(k, scores.shape[1])
  if k < scores.shape[1]:
    # argpartition is O(D) per row; only the k survivors are sorted. It may cut a tie at the k-th
    # place arbitrarily, so the survivors are re-sorted by (score desc, index asc) below.
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # [B, k] unordered
  else:
    part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
  part_scores = np.take_along_axis(scores, part, axis=1)  # [B, k]
  order = np.lexsort((part, -part_scores), axis=1)  # primary key last
  idx = np.take_along_axis(part, order, axis=1)
  return np.take_along_axis(scores, idx, axis=1), idx


def search(
  query_emb: np.ndarray, doc_emb: np.ndarray, k: int, batch_size: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
  """Exact cosine top-k: (scores [Q, k'], doc indices [Q, k']) with k' = min(k, D), best first.

  Queries are processed `batch_size` at a time so at most a [batch_size, D] block of scores exists
  (an MTEB corpus times all its queries would not fit in memory).
  """
  q, d = _normalise(query_emb), _normalise(doc_emb)  # [Q, p], [D, p]
  k = min(k, d.shape[0])
  out_scores = np.empty((q.shape[0], k), np.float32)
  out_idx = np.empty((q.shape[0], k), np.int64)
  for start in range(0, q.shape[0], batch_size):
    block = q[start : start + batch_size] @ d.T  # [b, D]
    out_scores[start : start + batch_size], out_idx[start : start + batch_size] = _top_k_rows(
      block, k
    )
  return out_scores, out_idx


def _ranking(scores_or_ids: np.ndarray, k: int) -> np.ndarray:
  """[Q, K] column ids best first: the top k of a float score matrix [Q, D], or int ids cut at k."""
  x = np.asarray(scores_or_ids)
  if np.issubdtype(x.dtype, np.integer):
    return x[:, :k]
  return _top_k_rows(x.astype(np.float64), k)[1]


def _judgements(
  ranked: np.ndarray, qrels: Qrels, query_ids: Sequence | None, doc_ids: Sequence | None
):
  """Relevance of the ranked documents and each query's judged grades.

  Returns (rel [Q', K] float (0 where unjudged), judged: list of Q' grade arrays), over the Q'
  queries that have a qrels entry. Ids default to row/column indices.
  """
  query_ids = range(ranked.shape[0]) if query_ids is None else query_ids
  rows, rel, judged = [], [], []
  for row, qid in enumerate(query_ids):
    if qid not in qrels:
      continue
    j = qrels[qid]
    docs = ranked[row] if doc_ids is None else [doc_ids[c] for c in ranked[row]]
    rel.append([float(j.get(doc, 0.0)) for doc in docs])
    judged.append(np.asarray(list(j.values()), np.float64))
    rows.append(row)
  rel = np.asarray(rel, np.float64).reshape(len(rows), ranked.shape[1])
  return rel, judged


def _ndcg(rel: np.ndarray, judged: list, k: int) -> np.ndarray:
  """Per-query nDCG@k from ranked relevances [Q, K] (K >= k not required) and judged grades."""
  rel = np.maximum(rel[:, :k], 0.0)  # linear gains
  discount = 1.0 / np.log2(np.arange(2, k + 2))  # [k]: 1/log2(r + 1)
  dcg = rel @ discount[: rel.shape[1]]  # [Q]
  idcg = np.array(
    [np.sort(np.maximum(g, 0.0))[::-1][:k] @ discount[: min(k, g.size)] for g in judged]
  )  # [Q]
  return np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), 0.0)


def _mrr(rel: np.ndarray, k: int) -> np.ndarray:
  """Per-query reciprocal rank of the first relevant document in the top k (0 if none)."""
  hit = rel[:, :k] > 0  # [Q, k]
  first = np.argmax(hit, axis=1)  # 0 also when no hit
  return np.where(hit.any(axis=1), 1.0 / (first + 1), 0.0)


def _recall(rel: np.ndarray, judged: list, k: int) -> np.ndarray:
  """Per-query fraction of the relevant documents found in the top k (0 if none is relevant)."""
  n_rel = np.array([(g > 0).sum() for g in judged], np.float64)  # [Q]
  found = (rel[:, :k] > 0).sum(axis=1)  # [Q]
  return np.where(n_rel > 0, found / np.maximum(n_rel, 1.0), 0.0)


def _mean(x: np.ndarray) -> float:
  return float(x.mean()) if x.size else 0.0


def ndcg_at_k(
  scores_or_ids: np.ndarray,
  qrels: Qrels,
  k: int,
  query_ids: Sequence | None = None,
  doc_ids: Sequence | None = None,
) -> float:
  """Mean nDCG@k (module docstring). `scores_or_ids`: float scores [Q, D] or int top ids [Q, K].

  `query_ids[i]` names row i and `doc_ids[c]` column c (both default to the index itself).
  """
  rel, judged = _judgements(_ranking(scores_or_ids, k), qrels, query_ids, doc_ids)
  return _mean(_ndcg(rel, judged, k))


def mrr_at_k(
  scores_or_ids: np.ndarray,
  qrels: Qrels,
  k: int,
  query_ids: Sequence | None = None,
  doc_ids: Sequence | None = None,
) -> float:
  """Mean reciprocal rank cut at k; arguments as `ndcg_at_k`."""
  rel, _ = _judgements(_ranking(scores_or_ids, k), qrels, query_ids, doc_ids)
  return _mean(_mrr(rel, k))


def recall_at_k(
  scores_or_ids: np.ndarray,
  qrels: Qrels,
  k: int,
  query_ids: Sequence | None = None,
  doc_ids: Sequence | None = None,
) -> float:
  """Mean recall@k; arguments as `ndcg_at_k`."""
  rel, judged = _judgements(_ranking(scores_or_ids, k), qrels, query_ids, doc_ids)
  return _mean(_recall(rel, judged, k))


def evaluate(
  query_emb: np.ndarray,
  doc_emb: np.ndarray,
  query_ids: Sequence,
  doc_ids: Sequence,
  qrels: Qrels,
  ks: Sequence[int] = (1, 10, 100),
  batch_size: int = 1024,
) -> dict:
  """Cosine retrieval of every query over the corpus, scored against qrels.

  query_emb: [Q, p]; doc_emb: [D, p]; ids name the rows. One top-max(ks) search serves every k.
  Returns {"ndcg@k", "mrr@k", "recall@k" for k in ks, "num_queries"}; nDCG@10 is MTEB's main score.
  """
  _, ranked = search(query_emb, doc_emb, max(ks), batch_size)  # [Q, K]
  rel, judged = _judgements(ranked, qrels, query_ids, doc_ids)
  out = {}
  for k in ks:
    out[f"ndcg@{k}"] = _mean(_ndcg(rel, judged, k))
    out[f"mrr@{k}"] = _mean(_mrr(rel, k))
    out[f"recall@{k}"] = _mean(_recall(rel, judged, k))
  out["num_queries"] = len(judged)
  return out
