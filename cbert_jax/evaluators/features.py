"""Frozen features: texts -> padded rows -> mean-pooled encoder states.

`encode_texts` turns texts into one model row each (no packing: a probe wants one feature
vector per example). `Featurizer` runs `steps.make_features_step` jitted once, over batches
of a fixed size, so any number of rows costs one compilation; it takes the parameter pytree
only, so live training params and params restored from a checkpoint are used the same way.

Example:
  graphdef, params = nnx.split(model, nnx.Param)
  feat = Featurizer(graphdef, params, batch_size=64, seq_len=128)
  x = feat(encode_texts(texts, tokenizer, 128))                    # [N, d]
  xp = feat.pair(encode_texts(a, tok, 128), encode_texts(b, tok, 128))  # [N, 4d]

`featurizer_from_evals` builds the `Featurizer` a `config.evals` block describes (the offline
suite and GLUE both probe through it).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from cbert_jax.errors import ConfigError
from cbert_jax.step import sharding as sharding_lib
from cbert_jax.step import steps

ROW_KEYS = ("tokens", "positions", "segment_ids")
LAYERS = ("final", "all")
PAIR_MODES = ("senteval", "concat")


def encode_texts(texts: Sequence[str], tokenizer, seq_len: int) -> dict[str, np.ndarray]:
  """One model row per text: truncated to `seq_len`, right-padded with the pad id 0.

  Rows carry no BOS/EOS (pre-training packs plain ids too, see `data.packing`). Real tokens get
  segment id 1 and positions 0..n-1; padding gets token 0, segment 0 and position 0, which is
  what the features step treats as "not a token". An empty text gives an all-padding row,
  whose mean-pooled feature is 0.

  Args:
    texts: N strings.
    tokenizer: anything with `encode_batch(texts) -> list[list[int]]` (e.g. `data.Tokenizer`).
    seq_len: row length T.

  Returns:
    {"tokens", "positions", "segment_ids"}, each int32 [N, T].

  Raises:
    ConfigError: if `seq_len` is not positive.
  """
  if int(seq_len) < 1:
    raise ConfigError(f"seq_len: must be >= 1, got {seq_len}.")
  return rows_from_ids(tokenizer.encode_batch(list(texts)) if len(texts) else [], seq_len)


def rows_from_ids(ids: Sequence[Sequence[int]], seq_len: int) -> dict[str, np.ndarray]:
  """`encode_texts` after tokenisation: N id lists -> rows of `seq_len` (truncated, padded)."""
  n = len(ids)
  tokens = np.zeros((n, seq_len), np.int32)  # [N, T]
  segment_ids = np.zeros((n, seq_len), np.int32)  # [N, T]
  positions = np.zeros((n, seq_len), np.int32)  # [N, T]
  for i, row in enumerate(ids):
    row = row[:seq_len]
    tokens[i, : len(row)] = row
    segment_ids[i, : len(row)] = 1
    positions[i, : len(row)] = np.arange(len(row))
  return {"tokens": tokens, "positions": positions, "segment_ids": segment_ids}


def combine_pair(u: np.ndarray, v: np.ndarray, mode: str = "senteval") -> np.ndarray:
  """Features of a sentence pair from the features of its two separately encoded sides.

  Args:
    u: [..., N, d] features of side a.
    v: [..., N, d] features of side b.
    mode: "senteval" (default): `[u, v, |u - v|, u * v]` as in SentEval / InferSent, [..., N, 4d];
      "concat": `[u, v]`, [..., N, 2d].

  Returns:
    The concatenation along the last axis.

  Raises:
    ConfigError: for an unknown `mode` or mismatched shapes.
  """
  if mode not in PAIR_MODES:
    raise ConfigError(f"pair_mode: expected one of {PAIR_MODES}, got {mode!r}.")
  if u.shape != v.shape:
    raise ConfigError(f"pair features: sides have shapes {u.shape} and {v.shape}.")
  if mode == "concat":
    return np.concatenate([u, v], axis=-1)
  return np.concatenate([u, v, np.abs(u - v), u * v], axis=-1)


class Featurizer:
  """Mean-pooled frozen features of a model, one compilation for any number of rows.

  Rows are cut into batches of exactly `batch_size`; the last one is padded with all-padding
  rows (segment 0) whose outputs are dropped, so the jitted step sees a single shape and is
  traced once (`num_traces` counts traces, for tests and logs).

  Pair tasks: `pair(rows_a, rows_b)` encodes the two sides *separately* and combines them with
  `pair_mode`; the default "senteval" is `[u, v, |u - v|, u * v]` (see `combine_pair`).
  """

  def __init__(
    self,
    graphdef: nnx.GraphDef,
    params,
    *,
    batch_size: int,
    seq_len: int,
    layers: str = "final",
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    pair_mode: str = "senteval",
    layer: int = -1,
  ):
    """Builds the jitted step (compiled lazily, on the first batch).

    Args:
      graphdef: from `nnx.split(model, nnx.Param)` (the trainer's graphdef works too).
      params: the matching nnx.Param state: live, or restored from a checkpoint; host
        (numpy) or device arrays. With a mesh, put it on the mesh beforehand (as the trainer
        and `Checkpointer.restore` do); jit follows the arrays' shardings.
      batch_size: rows per step; with a mesh, a multiple of the data-parallel size.
      seq_len: row length T the step is compiled for.
      layers: "final" -> [N, d] from the normalised last layer; "all" -> [L + 1, N, d].
      mesh: optional mesh; batches are laid out with the logical axes ("batch", "seq").
      rules: the logical sharding rules (`config.sharding_rules`); required with a mesh.
      pair_mode: how `pair` combines the two sides ("senteval" or "concat").
      layer: with layers="final", which layer: -1 = the normalised last layer; l in [0, L] = the
        residual stream after block l (0 = embeddings), for probing intermediate layers.

    Raises:
      ConfigError: naming the argument that is out of range.
    """
    if layers not in LAYERS:
      raise ConfigError(f"layers: expected one of {LAYERS}, got {layers!r}.")
    if int(batch_size) < 1:
      raise ConfigError(f"batch_size: must be >= 1, got {batch_size}.")
    if int(seq_len) < 1:
      raise ConfigError(f"seq_len: must be >= 1, got {seq_len}.")
    if pair_mode not in PAIR_MODES:
      raise ConfigError(f"pair_mode: expected one of {PAIR_MODES}, got {pair_mode!r}.")
    if mesh is not None and rules is None:
      raise ConfigError("rules: required when a mesh is given (the logical sharding rules).")
    self.batch_size, self.seq_len, self.layers = int(batch_size), int(seq_len), layers
    if int(layer) < -1:
      raise ConfigError(f"layer: expected -1 (final) or a block index >= 0, got {layer}.")
    self.pair_mode, self.params, self.layer = pair_mode, params, int(layer)
    self._mesh, self._rules = mesh, None if rules is None else tuple(tuple(r) for r in rules)
    self._batch_sh = None
    if mesh is not None:
      dp = sharding_lib.data_parallel_size(mesh, self._rules)
      if self.batch_size % dp:
        raise ConfigError(
          f"batch_size: {batch_size} is not a multiple of the data-parallel size {dp}."
        )
      self._batch_sh = sharding_lib.logical_sharding(mesh, self._rules, ("batch", "seq"))
    self.num_traces = 0
    inner = steps.make_features_step(graphdef, layers, self.layer)

    def step(p, batch):
      self.num_traces += 1  # Python side effect: runs once per trace, not per call.
      return inner(p, batch)

    # With a mesh, replicate the (small) output so every host can read all of it.
    self._step = (
      jax.jit(step) if mesh is None else jax.jit(step, out_shardings=sharding_lib.replicated(mesh))
    )

  def _check(self, rows: dict) -> int:
    """Validates `rows` and returns N."""
    missing = [k for k in ROW_KEYS if k not in rows]
    if missing:
      raise ConfigError(f"rows: missing {missing}; expected keys {ROW_KEYS} (see encode_texts).")
    shapes = {k: np.shape(rows[k]) for k in ROW_KEYS}
    n = shapes["tokens"][0] if len(shapes["tokens"]) == 2 else -1
    if any(s != (n, self.seq_len) for s in shapes.values()):
      raise ConfigError(f"rows: expected [N, {self.seq_len}] arrays (seq_len), got {shapes}.")
    return n

  def _run(self, batch: dict) -> np.ndarray:
    """One fixed-size batch through the compiled step."""
    if self._mesh is None:
      return np.asarray(self._step(self.params, batch))
    with jax.set_mesh(self._mesh), nnx.logical_axis_rules(self._rules):
      # Every host holds the whole batch (probe data is small and read by all), so each device
      # takes its slice of the full array; correct on one host and on many.
      batch = {
        k: jax.make_array_from_callback(v.shape, self._batch_sh, lambda i, v=v: v[i])
        for k, v in batch.items()
      }
      out = self._step(self.params, batch)
      return np.asarray(jax.device_get(out))

  def __call__(self, rows: dict) -> np.ndarray:
    """Features of N rows: float32 [N, d] (layers="final") or [L + 1, N, d] (layers="all")."""
    n = self._check(rows)
    b = self.batch_size
    outs = []
    for start in range(0, max(n, 1), b):
      chunk = {k: np.asarray(rows[k][start : start + b], np.int32) for k in ROW_KEYS}  # [<=B, T]
      real = chunk["tokens"].shape[0]
      if real < b:  # Pad with all-padding rows (segment 0) so the shape never changes.
        chunk = {
          k: np.concatenate([v, np.zeros((b - real, self.seq_len), np.int32)])
          for k, v in chunk.items()
        }  # [B, T]
      out = self._run(chunk)  # [B, d] or [L + 1, B, d]
      outs.append(out[..., :real, :])
    return np.concatenate(outs, axis=-2).astype(np.float32)

  def pair(self, rows_a: dict, rows_b: dict) -> np.ndarray:
    """Pair features from separately encoded sides, combined by `pair_mode`.

    Returns:
      [N, 4d] (senteval) or [N, 2d] (concat); with layers="all", [L + 1, N, ...].
    """
    u, v = self(rows_a), self(rows_b)
    if u.shape != v.shape:
      raise ConfigError(f"rows_b: {v.shape[-2]} rows, but rows_a has {u.shape[-2]}.")
    return combine_pair(u, v, self.pair_mode)


def layer_of(ecfg) -> int:
  """`evals.layer` (configs that predate it: -1, the final layer)."""
  return int(ecfg.get("layer", -1))


def featurizer_from_evals(
  graphdef: nnx.GraphDef, params, ecfg, *, mesh=None, rules=None
) -> Featurizer:
  """The `Featurizer` that `config.evals` (`ecfg`) describes, for the probe suites.

  Batch size, row length, layers and layer are `evals.batch_size`, `evals.seq_len`,
  `evals.layers` and `evals.layer` (`layer_of`); mesh and rules as `Featurizer`. `params` is only
  read.
  """
  return Featurizer(
    graphdef,
    params,
    batch_size=ecfg.batch_size,
    seq_len=ecfg.seq_len,
    layers=ecfg.layers,
    mesh=mesh,
    rules=rules,
    layer=layer_of(ecfg),
  )
