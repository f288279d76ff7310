"""Pure step functions, jitted by the trainer: train_step, eval_step, features_step.

All take the parameter pytree (an `nnx.State` of Params) and rebuild the module inside with
`nnx.merge(graphdef, params)`, so the compiled function is a pure function of arrays. The masking
key is `fold_in(rng, step)`: masks are a function of (seed, step), so a resumed run draws the same
masks as an uninterrupted one, and the data pipeline stays model-agnostic.
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, lr_schedule,
                    trace_counter: list | None = None):
  """train_step(params, opt_state, batch, step, rng) -> (params, opt_state, metrics)."""

  def train_step(params, opt_state, batch, step, rng):
    if trace_counter is not None:
      trace_counter.append(1)  # Python side effect: runs once per trace, not per call
    step_rng = jax.random.fold_in(rng, step)

    def loss_fn(p):
      return nnx.merge(graphdef, p).loss(batch, step_rng)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(params),
                   lr=lr_schedule(step))
    return params, opt_state, metrics

  return train_step


def make_eval_step(graphdef: nnx.GraphDef):
  """eval_step(params, batch, rng) -> metrics: the training loss on held-out rows, fixed masks."""

  def eval_step(params, batch, rng):
    _, metrics = nnx.merge(graphdef, params).loss(batch, rng)
    return metrics

  return eval_step


def select_layer(out: dict, layer: int) -> jax.Array:
  """One layer of a model's `features` output: -1 = the final normalised output [B, T, d];
  l >= 0 = the residual stream after block l (0 = the embeddings), un-normalised."""
  return out["final"] if layer == -1 else out["hidden"][layer]


def make_features_step(graphdef: nnx.GraphDef, layers: str = "final", layer: int = -1):
  """features_step(params, batch) -> mean-pooled features over real (segment != 0) tokens.

  layers="final": [B, d] from layer `layer` (-1 = the normalised last layer, see `select_layer`);
  "all": [L + 1, B, d], one per layer.
  """

  def features_step(params, batch):
    out = nnx.merge(graphdef, params).features(batch["tokens"], batch["positions"], batch["segment_ids"])
    w = (batch["segment_ids"] != 0).astype(jnp.float32)                    # [B, T]
    denom = jnp.maximum(w.sum(-1, keepdims=True), 1.0)                      # [B, 1]
    if layers == "final":
      h = select_layer(out, layer).astype(jnp.float32)                      # [B, T, d]
      return jnp.einsum("btd,bt->bd", h, w) / denom
    return jnp.einsum("lbtd,bt->lbd", out["hidden"].astype(jnp.float32), w) / denom[None]

  return features_step
