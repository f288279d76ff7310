"""The light contrastive pooler of the MTEB protocol (SPEC §6), its InfoNCE training, and `embed`.

A few learned query vectors cross-attend over the encoder's final (normalised) hidden states,
padding masked; the per-query outputs are normalised, concatenated (or averaged), projected and L2
normalised. It is trained with InfoNCE over in-batch negatives on (query, passage) pairs:

* frozen: only the pooler trains; the backbone parameters are an input of the step under
  `stop_gradient`, never differentiated or updated (what is measured is the frozen features);
* unfrozen: the backbone trains too, with its own learning rate (`optax.multi_transform`).

Rows are dicts of `tokens`, `positions`, `segment_ids` [N, T] int32, one text per row: segment 1
on real tokens, 0 on padding.

Controls (SPEC §7): `layer` pools any layer instead of the final one; `init="predictor"`
warm-starts the pooler's cross-attention from a CrossBERT predictor's first cross-attention block
(its queries start at the predictor's mask vector plus the fresh queries' noise), while the
default `init="fresh"` gives every backbone the same freshly initialised pooler.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cbert_jax.errors import ConfigError
from cbert_jax.models import layers
from cbert_jax.models.model_config import ModelConfig
from cbert_jax.step import steps as steps_lib

INITS = ("fresh", "predictor")

ROW_KEYS = ("tokens", "positions", "segment_ids")


class AttentionPooler(nnx.Module):
  """Learned-query cross-attention pooling -> RMSNorm -> concat|mean -> linear -> L2 normalise."""

  def __init__(
    self,
    cfg: ModelConfig,
    *,
    num_queries: int = 4,
    num_heads: int = 0,
    out_dim: int = 256,
    combine: str = "concat",
    rngs: nnx.Rngs,
  ):
    """cfg: the backbone's ModelConfig (width d_model, dtypes, init std); num_heads 0 = cfg's."""
    if combine not in ("concat", "mean"):
      raise ValueError(f"combine must be concat|mean, got {combine!r}")
    d = cfg.d_model
    heads = num_heads or cfg.num_heads
    self.queries = layers.param(rngs, (num_queries, d), (None, "embed"), cfg.std(), cfg.pdtype)
    self.attn = layers.Attention(d, d, heads, d // heads, cfg, 1.0, rngs)
    self.norm = layers.RMSNorm(d, cfg)
    d_in = d * num_queries if combine == "concat" else d
    self.proj = layers.param(rngs, (d_in, out_dim), (None, None), d_in**-0.5, cfg.pdtype)
    self.combine = combine
    self.dtype = cfg.dtype

  def __call__(self, hidden: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """hidden: [B, T, d] encoder output; segment_ids: [B, T] (0 = padding) -> [B, p] unit vectors."""
    b, t, _ = hidden.shape
    nq = self.queries.shape[0]
    q = jnp.broadcast_to(
      self.queries[...].astype(self.dtype), (b,) + self.queries.shape
    )  # [B, Q, d]
    mask = jnp.broadcast_to((segment_ids != 0)[:, None, :], (b, nq, t))  # [B, Q, T]
    # Zero positions make RoPE the identity: pooling is position-free (the encoder has already mixed
    # positions in), and learned queries have no position of their own.
    pooled = self.attn(
      q,
      jnp.zeros((b, nq), jnp.int32),
      hidden.astype(self.dtype),
      jnp.zeros((b, t), jnp.int32),
      mask,
    )  # [B, Q, d]
    pooled = self.norm(pooled).astype(jnp.float32)
    flat = (
      pooled.reshape(b, -1) if self.combine == "concat" else pooled.mean(axis=1)
    )  # [B, Q*d | d]
    z = flat @ self.proj[...].astype(jnp.float32)  # [B, p] fp32
    # An all-padding row (the tail of a padded batch) has zero attention output: it stays zero.
    return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-6)


@dataclasses.dataclass(frozen=True)
class PoolerSpec:
  """Hyper-parameters that fix the pooler's graph (kept with the params to rebuild it)."""

  num_queries: int = 4
  num_heads: int = 0
  out_dim: int = 256
  combine: str = "concat"


def spec_from_params(pooler_params: nnx.State, cfg: ModelConfig) -> PoolerSpec:
  """Recover the PoolerSpec from parameter shapes, so `embed` needs only the params."""
  nq = pooler_params["queries"].shape[0]
  d_in, out_dim = pooler_params["proj"].shape
  heads = pooler_params["attn"]["wq"].shape[1]
  return PoolerSpec(nq, heads, out_dim, "concat" if d_in == nq * cfg.d_model and nq > 1 else "mean")


def save(path: str, pooler_params: nnx.State, *, layer: int = -1) -> None:
  """Writes a trained pooler as `.npz`: its parameters by path ("attn/wq", "proj", ...) and the
  backbone layer it pools (`__layer__`). `load` reads it back; `cbert_jax.embed --pooler` uses it."""
  flat = {
    "/".join(str(k) for k in path_): np.asarray(v) for path_, v in nnx.to_flat_state(pooler_params)
  }
  with open(path, "wb") as f:
    np.savez(f, __layer__=np.int64(layer), **flat)


def load(path: str) -> tuple[nnx.State, int]:
  """(pooler params, the layer it pools) from a file written by `save`. ConfigError when the file
  is not a saved pooler."""
  try:
    with np.load(path) as z:
      arrays = {k: z[k] for k in z.files}
  except (OSError, ValueError) as e:
    raise ConfigError(f"pooler file {path!r}: cannot read it ({e})") from e
  layer = int(arrays.pop("__layer__", -1))
  if not {"queries", "proj"} <= set(arrays):
    raise ConfigError(
      f"pooler file {path!r}: not a saved pooler (has {sorted(arrays)[:6]}; "
      "expected queries, attn/..., norm/..., proj)"
    )
  return nnx.State(
    nnx.traversals.unflatten_mapping({tuple(k.split("/")): v for k, v in arrays.items()})
  ), layer


def build_pooler(cfg: ModelConfig, spec: PoolerSpec, seed: int = 0):
  """(graphdef, params) of a freshly initialised pooler, built outside any mesh."""
  with nnx.use_eager_sharding(False):
    pooler = AttentionPooler(
      cfg,
      num_queries=spec.num_queries,
      num_heads=spec.num_heads,
      out_dim=spec.out_dim,
      combine=spec.combine,
      rngs=nnx.Rngs(seed),
    )
  return nnx.split(pooler, nnx.Param)


def info_nce(za: jax.Array, zb: jax.Array, temperature: float, symmetric: bool = True):
  """InfoNCE with in-batch negatives: row i of za matches row i of zb, every other row is negative.

  za, zb: [B, p] L2-normalised. Returns (loss, metrics). Symmetric averages the a->b and b->a
  losses. Duplicated texts in a batch act as false negatives (tolerated, as in the usual recipe).
  """
  logits = (za @ zb.T).astype(jnp.float32) / temperature  # [B, B]
  labels = jnp.arange(za.shape[0])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  if symmetric:
    loss = 0.5 * (loss + optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean())
  acc = jnp.mean(jnp.argmax(logits, axis=1) == labels)
  return loss, {"loss": loss, "acc": acc}


def _pool(
  graphdef, pooler_graphdef, backbone_params, pooler_params, rows: dict, layer: int = -1
) -> jax.Array:
  """Backbone features of rows (layer `layer`, see steps.select_layer) -> pooled unit vectors [B, p]."""
  out = nnx.merge(graphdef, backbone_params).features(
    rows["tokens"], rows["positions"], rows["segment_ids"]
  )  # unused layers are DCE'd
  feats = steps_lib.select_layer(out, layer)  # [B, T, d]
  return nnx.merge(pooler_graphdef, pooler_params)(feats, rows["segment_ids"])


def _optimizer(lr: float, total_steps: int, weight_decay: float) -> optax.GradientTransformation:
  """AdamW, 10% linear warm-up then cosine decay to lr/10, global-norm clipping at 1."""
  warmup = max(1, total_steps // 10)
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1), lr / 10)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=weight_decay))


def train_pooler(
  graphdef: nnx.GraphDef,
  backbone_params: nnx.State,
  pairs_rows_a: dict,
  pairs_rows_b: dict,
  *,
  frozen: bool = True,
  epochs: int = 1,
  steps: int | None = None,
  batch_size: int = 128,
  lr_pooler: float = 1e-3,
  lr_backbone: float = 2e-5,
  temperature: float = 0.05,
  symmetric: bool = True,
  weight_decay: float = 0.0,
  spec: PoolerSpec = PoolerSpec(),
  seed: int = 0,
  layer: int = -1,
  init: str = "fresh",
):
  """Train the pooler (and, unfrozen, the backbone) with InfoNCE on pairs (a[i], b[i]).

  `layer`: the backbone layer pooled (steps.select_layer); `init`: "fresh" or "predictor" (warm
  start from a CrossBERT predictor, `warm_start`).

  pairs_rows_a/b: rows dicts [N, T] (module docstring). Batches are drawn without replacement from a
  fresh shuffle per epoch; the last incomplete batch is dropped (a fixed shape keeps one compile,
  and the number of in-batch negatives constant). `steps`, when given, overrides `epochs`.

  Returns (pooler_params, backbone_params, history): backbone_params is the input object itself
  when frozen; history is a list of {"step", "loss", "acc"} (acc: a->b in-batch top-1).
  """
  cfg = nnx.merge(graphdef, backbone_params).cfg
  pooler_graphdef, pooler_params = build_pooler(cfg, spec, seed)
  if init not in INITS:
    raise ConfigError(f"evals.pooler_init: expected one of {INITS}, got {init!r}")
  if init == "predictor":
    pooler_params = warm_start(pooler_params, backbone_params)
  n = pairs_rows_a["tokens"].shape[0]
  if n < 2 or pairs_rows_b["tokens"].shape[0] != n:
    raise ValueError(
      f"need >= 2 aligned pairs (in-batch negatives), got {n} and "
      f"{pairs_rows_b['tokens'].shape[0]} rows"
    )
  batch_size = max(2, min(batch_size, n))
  per_epoch = n // batch_size
  total = steps if steps is not None else epochs * per_epoch

  if frozen:
    trainable = {"pooler": pooler_params}
    tx = _optimizer(lr_pooler, total, weight_decay)
  else:
    trainable = {"pooler": pooler_params, "backbone": backbone_params}
    tx = optax.multi_transform(
      {
        "pooler": _optimizer(lr_pooler, total, weight_decay),
        "backbone": _optimizer(lr_backbone, total, weight_decay),
      },
      lambda p: {name: jax.tree.map(lambda _, name=name: name, sub) for name, sub in p.items()},
    )
  opt_state = tx.init(trainable)

  @jax.jit
  def train_step(trainable, const_backbone, opt_state, batch_a, batch_b):
    def loss_fn(t):
      # Frozen: the backbone is a non-differentiated input under stop_gradient (not a closed-over
      # constant, which XLA would bake into the executable), so no backbone gradient is computed.
      bp = t["backbone"] if "backbone" in t else jax.lax.stop_gradient(const_backbone)
      za = _pool(graphdef, pooler_graphdef, bp, t["pooler"], batch_a, layer)  # [B, p]
      zb = _pool(graphdef, pooler_graphdef, bp, t["pooler"], batch_b, layer)  # [B, p]
      return info_nce(za, zb, temperature, symmetric)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, metrics

  rng = np.random.RandomState(seed)
  const_backbone = backbone_params if frozen else None
  history, step = [], 0
  while step < total:
    order = rng.permutation(n)
    for i in range(per_epoch):
      if step >= total:
        break
      idx = order[i * batch_size : (i + 1) * batch_size]
      batch_a = {k: jnp.asarray(pairs_rows_a[k][idx]) for k in ROW_KEYS}
      batch_b = {k: jnp.asarray(pairs_rows_b[k][idx]) for k in ROW_KEYS}
      trainable, opt_state, metrics = train_step(
        trainable, const_backbone, opt_state, batch_a, batch_b
      )
      history.append(metrics)  # device arrays: fetched once at the end, no per-step host sync
      step += 1
  history = [
    {"step": i, **{k: float(v) for k, v in m.items()}}
    for i, m in enumerate(jax.device_get(history))
  ]
  return trainable["pooler"], (backbone_params if frozen else trainable["backbone"]), history


def warm_start(pooler_params: nnx.State, backbone_params: nnx.State) -> nnx.State:
  """The pooler's attention copied from a CrossBERT predictor's first cross-attention block.

  Queries become the predictor's mask vector plus the fresh queries (so they are not identical).
  ConfigError when the backbone has no predictor or its shapes differ from the pooler's.
  """
  if "predictor" not in backbone_params:
    raise ConfigError(
      "evals.pooler_init=predictor needs a CrossBERT backbone (it copies the "
      "predictor's cross-attention); use evals.pooler_init=fresh"
    )
  pred = backbone_params["predictor"]
  cross = pred["blocks"][0]["cross"]
  out = jax.tree.map(lambda x: x, pooler_params)  # a new State, same leaves
  for name in ("wq", "wk", "wv", "wo"):
    if cross[name][...].shape != out["attn"][name][...].shape:
      raise ConfigError(
        f"evals.pooler_init=predictor: the predictor's {name} has shape "
        f"{cross[name][...].shape}, the pooler's {out['attn'][name][...].shape}; "
        "it needs predictor width and heads equal to the encoder's"
      )
    out["attn"][name][...] = cross[name][...]
  out["queries"][...] = out["queries"][...] + pred["mask_vec"][...][None, :]
  return out


_EMBED_CACHE: dict = {}


def embed(
  graphdef: nnx.GraphDef,
  backbone_params: nnx.State,
  pooler_params: nnx.State,
  rows: dict,
  batch_size: int = 256,
  layer: int = -1,
) -> np.ndarray:
  """Pooled, L2-normalised embeddings of rows (backbone layer `layer`) -> [N, p] float32 (numpy).

  The last batch is padded with all-padding rows to `batch_size` so one executable serves all.
  """
  cfg = nnx.merge(graphdef, backbone_params).cfg
  spec = spec_from_params(pooler_params, cfg)
  key = (graphdef, spec, cfg, layer)
  if key not in _EMBED_CACHE:
    # Only the graph is needed (the params come from the caller): build it abstractly, no init.
    with nnx.use_eager_sharding(False):
      abstract = nnx.eval_shape(
        lambda: AttentionPooler(
          cfg,
          num_queries=spec.num_queries,
          num_heads=spec.num_heads,
          out_dim=spec.out_dim,
          combine=spec.combine,
          rngs=nnx.Rngs(0),
        )
      )
    pooler_graphdef, _ = nnx.split(abstract, nnx.Param)
    _EMBED_CACHE[key] = jax.jit(
      lambda bp, pp, r: _pool(graphdef, pooler_graphdef, bp, pp, r, layer)
    )
  fn = _EMBED_CACHE[key]
  n = rows["tokens"].shape[0]
  batch_size = min(batch_size, max(n, 1))
  out = []
  for start in range(0, n, batch_size):
    chunk = {k: np.asarray(rows[k][start : start + batch_size]) for k in ROW_KEYS}
    m = chunk["tokens"].shape[0]
    if m < batch_size:  # zero rows: segment 0 everywhere, i.e. padding
      chunk = {
        k: np.concatenate([v, np.zeros((batch_size - m,) + v.shape[1:], v.dtype)])
        for k, v in chunk.items()
      }
    out.append(np.asarray(fn(backbone_params, pooler_params, chunk))[:m])
  return np.concatenate(out) if out else np.zeros((0, spec.out_dim), np.float32)
