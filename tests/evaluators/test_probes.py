"""Frozen-feature probes: features from a tiny model, ridge/logreg/kNN probes, selection hygiene,
the kNN tie rule."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge

from cbert_jax import config_groups
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import features as features_lib
from cbert_jax.evaluators import knn, logreg, probes, ridge
from cbert_jax.step import sharding
from tests import helpers


# ------------------------------------------------------------------------------ synthetic data ---
def _blobs(n, d=16, classes=3, seed=0, sep=6.0):
  """Linearly separable classes: well-separated Gaussian blobs. Returns x [n, d], y [n]."""
  rs = np.random.RandomState(seed)
  centres = np.random.RandomState(123).randn(classes, d) * sep
  y = rs.randint(0, classes, n)
  return centres[y] + rs.randn(n, d), y


def _linear(n, d=12, seed=0):
  """A noiseless linear regression target. Returns x [n, d], y [n]."""
  rs = np.random.RandomState(seed)
  x = rs.randn(n, d)
  return x, x @ np.random.RandomState(7).randn(d) + 3.0


@pytest.mark.parametrize("probe", [probes.ridge_probe, probes.logreg_probe, probes.knn_probe])
def test_separable_classes_are_solved(probe):
  x, y = _blobs(600)
  xd, yd = _blobs(300, seed=1)
  res = probe(x, y, {"dev": (xd, yd)}, kind="classification", metric="accuracy")
  assert res.scores["dev"] >= 0.99
  assert res.selection.value in res.selection.scores


def test_shuffled_labels_score_at_chance():
  x, y = _blobs(1500, classes=4)
  xd, yd = _blobs(1000, classes=4, seed=1)
  rs = np.random.RandomState(0)
  res = probes.ridge_probe(
    x,
    rs.permutation(y),
    {"dev": (xd, rs.permutation(yd))},
    kind="classification",
    metric="accuracy",
  )
  assert abs(res.scores["dev"] - 0.25) < 0.06
  mcc = probes.ridge_probe(
    x, rs.permutation(y), {"dev": (xd, rs.permutation(yd))}, kind="classification", metric="mcc"
  )
  assert abs(mcc.scores["dev"]) < 0.08


def test_linear_regression_target_gives_spearman_one():
  x, y = _linear(400)
  xd, yd = _linear(200, seed=1)
  res = probes.ridge_probe(x, y, {"dev": (xd, yd)}, kind="regression", metric="spearman")
  assert res.scores["dev"] > 0.999
  assert (
    probes.knn_probe(x, y, {"dev": (xd, yd)}, kind="regression", metric="spearman").scores["dev"]
    > 0.5
  )


@pytest.mark.parametrize("n,d", [(80, 10), (15, 40)])  # primal (covariance) and dual (Gram)
def test_closed_form_ridge_equals_sklearn(n, d):
  rs = np.random.RandomState(0)
  x, y = rs.randn(n, d) + 2.0, rs.randn(n, 3)
  path = probes._RidgePath(x, y)
  x_new = rs.randn(7, d)
  preds = path.predict_path(x_new, [1e-2, 1.0, 30.0, 1e3])
  for lam, p in zip([1e-2, 1.0, 30.0, 1e3], preds):
    ref = Ridge(alpha=lam, fit_intercept=True, solver="cholesky").fit(x, y)
    w, b = path.weights(lam)
    np.testing.assert_allclose(w, ref.coef_.T, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(b, ref.intercept_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(p, ref.predict(x_new), rtol=1e-6, atol=1e-8)


def test_classification_ridge_is_one_vs_rest_sklearn_on_standardised_features():
  x, y = _blobs(120, classes=3, sep=0.5)
  xq = _blobs(50, classes=3, seed=2, sep=0.5)[0]
  mean, std = x.mean(0), x.std(0)
  targets = np.where(y[:, None] == np.arange(3)[None], 1.0, -1.0)
  ref = Ridge(alpha=5.0).fit((x - mean) / std, targets).predict((xq - mean) / std).argmax(1)
  np.testing.assert_array_equal(probes.fit_ridge(x, y, 5.0, "classification")(xq), ref)


# ------------------------------------------------------------------- logistic regression ---
def test_logreg_equals_sklearn_with_the_chosen_c_on_standardised_features():
  x, y = _blobs(300, classes=4, sep=0.5)
  xq = _blobs(120, classes=4, seed=2, sep=0.5)[0]
  res = probes.logreg_probe(x, y, {"q": (xq, np.zeros(len(xq), int))}, kind="pair", metric="mcc")
  c = res.selection.value
  assert res.probe == "logreg" and res.param == "C" and c in probes.DEFAULT_CS
  assert res.fit["converged"] and 0 < res.fit["n_iter"] < res.fit["max_iter"]
  mean, std = x.mean(0), x.std(0)
  ref = LogisticRegression(C=c, max_iter=probes.LOGREG_MAX_ITER).fit((x - mean) / std, y)
  predict, info = probes.fit_logreg(x, y, c)
  np.testing.assert_array_equal(predict(xq), ref.predict((xq - mean) / std))
  assert info == res.fit
  # The held-out curve: each C refit on the fit part of train's own split, standardised with all
  # of train (as ridge); spot-check one candidate against sklearn directly.
  fit, held = probes.holdout_split(len(y), 0.2, 0)
  z = (x - mean) / std
  c0 = probes.DEFAULT_CS[2]
  acc = LogisticRegression(C=c0, max_iter=1000).fit(z[fit], y[fit]).predict(z[held])
  assert res.selection.scores[c0] == probes.score("mcc", y[held], acc)


def test_logreg_edge_is_reported_and_interior_is_not():
  x, y = _blobs(300, classes=4, sep=0.5)
  sel = probes.select_logreg_c(x, y, kind="classification", metric="accuracy")
  assert sel.edge is None and min(probes.DEFAULT_CS) < sel.value < max(probes.DEFAULT_CS)
  assert len(set(sel.scores.values())) > 1
  low = probes.select_logreg_c(x, y, kind="classification", metric="accuracy", cs=(1e-4, 1e-3))
  assert low.value == 1e-3 and low.edge == "high"
  assert probes.Selection(1.0, {1.0: 0.5, 2.0: 0.4}).edge == "low"
  assert probes.Selection(1.0, {1.0: 0.5}).edge is None


def test_logreg_reports_non_convergence_and_is_deterministic():
  x, y = _blobs(200, classes=3, sep=0.5)
  xd, yd = _blobs(100, classes=3, seed=1, sep=0.5)
  run = lambda: probes.logreg_probe(
    x, y, {"dev": (xd, yd)}, kind="classification", metric="accuracy", max_iter=2
  )
  with warnings.catch_warnings():
    warnings.simplefilter("error", ConvergenceWarning)  # caught and reported, never leaked
    a, b = run(), run()
  assert a.fit == {"converged": False, "n_iter": 2, "max_iter": 2}
  assert a.selection.unconverged  # the large-C held-out fits need more than 2 steps
  assert a.selection == b.selection and a.scores == b.scores


def test_logreg_refuses_regression_and_handles_one_class():
  x, y = _linear(60)
  with pytest.raises(ConfigError, match="logistic-regression probe needs class labels"):
    probes.logreg_probe(x, y, {}, kind="regression", metric="spearman")
  predict, info = probes.fit_logreg(x, np.full(60, 4), 1.0)
  assert (predict(x[:5]) == 4).all() and info["converged"]


# --------------------------------------------------------------------------------------- kNN ---
def _brute_knn(train_x, train_y, query_x, k, kind):
  """Reference: full similarity matrix, explicit per-query loops (no ties in its data)."""
  nrm = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
  sim = nrm(query_x) @ nrm(train_x).T  # [M, N]
  out = []
  for row in sim:
    nb = np.argsort(-row, kind="stable")[:k]
    if kind == "regression":
      out.append(train_y[nb].mean())
      continue
    best = None
    for c in np.unique(train_y):
      key = ((train_y[nb] == c).sum(), row[nb][train_y[nb] == c].sum(), -c)
      best = (key, c) if best is None or key > best[0] else best
    out.append(best[1])
  return np.array(out)


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_knn_equals_brute_force(kind, monkeypatch):
  monkeypatch.setattr(knn, "_KNN_CHUNK", 7)  # several query chunks, and a partial one
  rs = np.random.RandomState(0)
  x, xq = rs.randn(90, 8), rs.randn(40, 8)
  y = rs.randint(0, 4, 90) if kind == "classification" else rs.randn(90)
  for k in (1, 4, 10):
    idx, sim = probes.nearest(x, xq, k)
    got = probes._knn_predict(idx, sim, y, k, kind)
    ref = _brute_knn(x, y, xq, k, kind)
    if kind == "regression":
      np.testing.assert_allclose(got, ref, rtol=1e-6)
    else:
      np.testing.assert_array_equal(got, ref)


def _tie_data(seed=0, n=40, m=60, d=5, classes=4):
  """kNN data whose similarities are exact, with ties everywhere.

  Train rows are positive multiples of axis vectors (several per axis: exact duplicates after
  normalisation); query entries are in {0, 1, 2, 4}, so the cosine of a query with a train row on
  axis a is q[a] * u exactly (u = 1/|q| rounded once; scaling by a power of 2 is exact) and
  every sum of them is exact. The reference below therefore works with the integers q[a] alone.
  Returns train_x [n, d], axes [n], train_y [n], query_x [m, d] (integer-valued).
  """
  rs = np.random.RandomState(seed)
  axes = rs.randint(0, d, n)
  train_x = np.eye(d)[axes] * rs.choice([1.0, 3.0, 0.5], n)[:, None]
  query_x = rs.choice([0.0, 1.0, 2.0, 4.0], (m, d))
  query_x[query_x.sum(1) == 0, 0] = 1.0
  return train_x, axes, rs.randint(0, classes, n), query_x


def _tie_rule_reference(axes, train_y, query_x, k):
  """The documented rule, by hand: neighbours by (similarity desc, train index asc); votes by
  (count, summed similarity, -class id), on the exact integer similarities."""
  idx, preds = [], []
  for q in query_x:
    sim = q[axes]  # integer multiples of the same u > 0
    nb = sorted(range(len(axes)), key=lambda i: (-sim[i], i))[:k]
    idx.append(nb)
    votes = {}
    for i in nb:
      cnt, tot = votes.get(train_y[i], (0, 0.0))
      votes[train_y[i]] = (cnt + 1, tot + sim[i])
    preds.append(max(votes, key=lambda c: (*votes[c], -c)))
  return np.array(idx), np.array(preds)


@pytest.mark.parametrize("chunk", [1024, 7])
def test_knn_tie_rule_equals_the_reference_on_exact_ties(chunk, monkeypatch):
  monkeypatch.setattr(knn, "_KNN_CHUNK", chunk)
  vote_ties = boundary_ties = 0
  for seed in range(3):
    train_x, axes, train_y, query_x = _tie_data(seed)
    for k in (1, 4, 6, 10):
      idx, sim = probes.nearest(train_x, query_x, k)
      ref_idx, ref_pred = _tie_rule_reference(axes, train_y, query_x, k)
      np.testing.assert_array_equal(idx, ref_idx)
      np.testing.assert_array_equal(
        probes._knn_predict(idx, sim, train_y, k, "classification"), ref_pred
      )
      # The data must exercise both rules, not just allow them.
      full = query_x[:, axes]  # [m, n] integer similarities
      kth = -np.sort(-full, axis=1)[:, k - 1 : k]  # the k-th largest
      boundary_ties += int(((full >= kth).sum(1) > k).sum())  # more candidates than places
      onehot = train_y[ref_idx][:, :, None] == np.arange(4)
      counts = onehot.sum(1)
      vote_ties += int(((counts == counts.max(1, keepdims=True)).sum(1) > 1).sum())
  assert boundary_ties > 50 and vote_ties > 50


def test_knn_vote_ties_by_summed_similarity_then_class_id():
  train_y = np.array([0, 1, 2, 1, 0, 2])
  idx = np.array([[1, 0, 3, 4], [1, 0, 3, 4], [0, 1, 2, 5]])  # neighbours, most similar first
  sim = np.array(
    [
      [0.9, 0.9, 0.8, 0.8],  # 2-2 votes, equal sums (1.7, 1.7) -> the lower class id, 0
      [0.9, 0.85, 0.8, 0.7],  # 2-2 votes, class 1 sums 1.7 > class 0's 1.55 -> 1
      [0.99, 0.98, 0.3, 0.2],  # class 2 has 2 votes (sum 0.5) -> 2, whatever the sums
    ],
    np.float32,
  )
  got = probes._knn_predict(idx, sim, train_y, 4, "classification")
  np.testing.assert_array_equal(got, [0, 1, 2])
  three = probes._knn_predict(
    np.array([[2, 1, 0]]), np.full((1, 3), 0.5, np.float32), train_y, 3, "classification"
  )
  np.testing.assert_array_equal(three, [0])  # 1-1-1, equal sums -> class 0


def test_knn_duplicated_training_rows_tie_exactly_lower_index_first():
  rs = np.random.RandomState(0)
  x, xq = rs.randn(80, 24).astype(np.float32), rs.randn(30, 24).astype(np.float32)
  for src, dst in [(3, 50), (3, 77), (10, 11), (60, 2)]:
    x[dst] = x[src]  # exact duplicates, at lower and higher positions
  idx, sim = probes.nearest(x, xq, 80)  # every row ranked
  for row_idx, row_sim in zip(idx, sim):
    pos = {int(i): j for j, i in enumerate(row_idx)}
    for group in ([3, 50, 77], [10, 11], [2, 60]):
      assert len({float(row_sim[pos[i]]) for i in group}) == 1  # bit-identical similarities
      assert [pos[i] for i in group] == sorted(pos[i] for i in group)  # lower index first
      assert max(pos[i] for i in group) - min(pos[i] for i in group) == len(group) - 1
  # Ranked by (similarity desc, index asc) throughout.
  keys = [list(zip(-s.astype(np.float64), i)) for i, s in zip(idx, sim)]
  assert all(kk == sorted(kk) for kk in keys)


# -------------------------------------------------------------------- selection hygiene -----
@pytest.mark.parametrize("probe", ["ridge", "logreg", "knn"])
def test_selection_ignores_the_eval_split(probe):
  x, y = _blobs(300, sep=0.7)
  xd, yd = _blobs(200, seed=1, sep=0.7)
  run = lambda ev: probes.PROBES[probe](x, y, ev, kind="classification", metric="accuracy")
  clean = run({"dev": (xd, yd)})
  rs = np.random.RandomState(5)
  garbage = run({"dev": (rs.randn(*xd.shape) * 100, rs.randint(0, 3, len(yd)))})
  assert clean.selection == garbage.selection  # same chosen value, same held-out scores
  assert len(set(clean.selection.scores.values())) > 1  # the sweep actually discriminates


@pytest.mark.parametrize(
  "probe,selector",
  [("ridge", "select_ridge_lambda"), ("logreg", "select_logreg_c"), ("knn", "select_knn_k")],
)
def test_selection_code_never_receives_eval_arrays(probe, selector, monkeypatch):
  x, y = _blobs(200)
  xd, yd = _blobs(100, seed=1)
  xt, yt = _blobs(100, seed=2)
  evals = [xd, yd, xt, yt]
  seen = []
  module = {"ridge": ridge, "logreg": logreg, "knn": knn}[probe]  # where the probe looks it up
  real = getattr(module, selector)

  def spy(*args, **kwargs):
    seen.extend(a for a in (*args, *kwargs.values()) if isinstance(a, np.ndarray))
    return real(*args, **kwargs)

  monkeypatch.setattr(module, selector, spy)
  probes.PROBES[probe](
    x, y, {"dev": (xd, yd), "test": (xt, yt)}, kind="classification", metric="accuracy"
  )
  assert len(seen) >= 2  # it ran, on train
  for a in seen:
    for e in evals:
      assert not np.shares_memory(a, e)
      assert a.shape != e.shape or not np.array_equal(a, e)


def test_layerwise_and_markdown_table():
  x, y = _blobs(200)
  xd, yd = _blobs(100, seed=1)
  noise = np.random.RandomState(0).randn(*x.shape)
  stack = lambda a, b: np.stack([np.random.RandomState(1).randn(*a.shape), a, b])  # [3, N, d]
  rows = probes.layerwise(
    stack(x, noise[:200] + x),
    y,
    {"dev": (stack(xd, noise[:100] + xd), yd)},
    kind="classification",
    metric="accuracy",
  )
  assert [r["layer"] for r in rows] == [0, 1, 2]
  assert rows[0]["dev"] < 0.6 and rows[1]["dev"] > 0.95  # noise layer vs. signal layer
  table = probes.markdown_table(rows)
  assert table.splitlines()[0] == "| layer | lambda | heldout | dev |"
  assert len(table.splitlines()) == 5


def test_bad_input_names_the_field():
  x, y = _blobs(50)
  with pytest.raises(ConfigError, match="kind"):
    probes.ridge_probe(x, y, {}, kind="ranking", metric="accuracy")
  with pytest.raises(ConfigError, match="metric"):
    probes.knn_probe(x, y, {}, kind="classification", metric="bleu")
  with pytest.raises(ConfigError, match="holdout_fraction"):
    probes.ridge_probe(x, y, {}, kind="classification", metric="accuracy", holdout_fraction=1.0)
  with pytest.raises(ConfigError, match="eval_sets"):
    probes.ridge_probe(x, y, {"dev": (x[:, :3], y)}, kind="classification", metric="accuracy")


def test_metrics_by_name():
  t, p = np.array([0, 1, 1, 0]), np.array([0, 1, 0, 0])
  assert probes.score("accuracy", t, p) == 0.75
  assert probes.score("macro_f1", t, p) == pytest.approx((0.8 + 2 / 3) / 2)
  assert probes.score("f1", t, p) == pytest.approx(2 / 3)
  assert probes.score("mcc", t, t) == 1.0
  assert probes.score("spearman", np.arange(5.0), np.arange(5.0) ** 3) == pytest.approx(1.0)
  assert probes.score("spearman", np.arange(5.0), np.zeros(5)) == 0.0


# ------------------------------------------------------------------------------ featurizer ---
class _FakeTokenizer:
  """encode_batch: one id per character (ids 10..), enough to test padding and truncation."""

  def encode_batch(self, texts):
    return [[10 + (ord(c) % 50) for c in t] for t in texts]


def test_encode_texts_pads_and_truncates():
  rows = features_lib.encode_texts(["abc", "", "abcdefgh"], _FakeTokenizer(), 5)
  assert all(v.shape == (3, 5) and v.dtype == np.int32 for v in rows.values())
  np.testing.assert_array_equal(rows["segment_ids"], [[1, 1, 1, 0, 0], [0] * 5, [1] * 5])
  np.testing.assert_array_equal(rows["positions"], [[0, 1, 2, 0, 0], [0] * 5, [0, 1, 2, 3, 4]])
  np.testing.assert_array_equal(rows["tokens"][0], [10 + ord(c) % 50 for c in "abc"] + [0, 0])
  np.testing.assert_array_equal(rows["tokens"][2], [10 + ord(c) % 50 for c in "abcde"])
  with pytest.raises(ConfigError, match="seq_len"):
    features_lib.encode_texts(["a"], _FakeTokenizer(), 0)


def _rows(n, t=12, seed=0):
  """n rows of random length (1..t) padded to t."""
  rs = np.random.RandomState(seed)
  texts = ["".join(chr(97 + c) for c in rs.randint(0, 26, rs.randint(1, t + 4))) for _ in range(n)]
  return features_lib.encode_texts(texts, _FakeTokenizer(), t)


@functools.cache
def _model(model_name):
  """One tiny model per family for the whole module (features never mutate it; builds are slow)."""
  return helpers.build(model_name)


def _by_hand(model, rows):
  """model.features + mean over real tokens, in numpy. Returns final [N, d], hidden [L+1, N, d]."""
  out = model.features(
    jnp.asarray(rows["tokens"]), jnp.asarray(rows["positions"]), jnp.asarray(rows["segment_ids"])
  )
  w = (rows["segment_ids"] != 0).astype(np.float32)  # [N, T]
  pool = lambda h: (np.asarray(h, np.float32) * w[..., None]).sum(-2) / w.sum(-1)[:, None]
  return pool(out["final"]), pool(out["hidden"])


@pytest.mark.parametrize("model_name", ["bert", "crossbert"])
def test_featurizer_matches_model_features(model_name):
  model = _model(model_name)
  graphdef, params = nnx.split(model, nnx.Param)
  rows = _rows(11)
  final, hidden = _by_hand(model, rows)
  feat = features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12)
  got = feat(rows)  # 3 batches, the last one 3/4 full
  assert got.shape == final.shape == (11, 32)
  np.testing.assert_allclose(got, final, rtol=1e-4, atol=1e-5)
  assert feat.num_traces == 1
  feat(_rows(2, seed=1))  # another size: still no retrace
  assert feat.num_traces == 1
  # Params as a checkpoint restore hands them over (host arrays) work the same way.
  host = jax.tree.map(np.asarray, params)
  all_layers = features_lib.Featurizer(graphdef, host, batch_size=8, seq_len=12, layers="all")(rows)
  assert all_layers.shape == (3, 11, 32)  # L + 1 = 3
  np.testing.assert_allclose(all_layers, hidden, rtol=1e-4, atol=1e-5)


def test_featurizer_pairs_and_edge_cases():
  model = _model("bert")
  graphdef, params = nnx.split(model, nnx.Param)
  feat = features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12)
  a, b = _rows(5, seed=2), _rows(5, seed=3)
  u, v = feat(a), feat(b)
  np.testing.assert_allclose(
    feat.pair(a, b), np.concatenate([u, v, np.abs(u - v), u * v], -1), rtol=1e-6
  )
  assert features_lib.combine_pair(u, v, "concat").shape == (5, 64)
  assert feat({k: x[:0] for k, x in a.items()}).shape == (0, 32)
  with pytest.raises(ConfigError, match="seq_len"):
    feat(_rows(3, t=8))
  with pytest.raises(ConfigError, match="layers"):
    features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12, layers="last")
  with pytest.raises(ConfigError, match="pair_mode"):
    features_lib.Featurizer(graphdef, params, batch_size=4, seq_len=12, pair_mode="diff")


def test_featurizer_on_a_mesh():
  model = _model("bert")
  graphdef, params = nnx.split(model, nnx.Param)
  rows = _rows(10)
  mesh = sharding.make_mesh({"data": -1})
  params = jax.device_put(params, sharding.replicated(mesh))
  feat = features_lib.Featurizer(
    graphdef, params, batch_size=8, seq_len=12, mesh=mesh, rules=config_groups.DEFAULT_RULES
  )
  np.testing.assert_allclose(feat(rows), _by_hand(model, rows)[0], rtol=1e-4, atol=1e-5)
  assert feat.num_traces == 1
  with pytest.raises(ConfigError, match="batch_size"):
    features_lib.Featurizer(
      graphdef, params, batch_size=6, seq_len=12, mesh=mesh, rules=config_groups.DEFAULT_RULES
    )
