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

from cbert_jax import guard


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, lr_schedule,
                    trace_counter: list | None = None, guard_cfg: guard.GuardConfig | None = None):
  """train_step(params, opt_state, batch, step, rng) -> (params, opt_state, metrics).

  With `guard_cfg` (the trainer), the step also carries the loss statistics of `guard`:
  train_step(params, opt_state, guard_state, batch, step, rng)
    -> (params, opt_state, guard_state, metrics), metrics with spike / loss_z / skipped and
  `grad_sq` ({parameter path: squared gradient norm}, for diagnostics); with
  `guard_cfg.spike == "skip"` a spike's update is not applied.
  """

  def update(params, opt_state, batch, step, rng):
    if trace_counter is not None:
      trace_counter.append(1)  # Python side effect: runs once per trace, not per call
    step_rng = jax.random.fold_in(rng, step)

    def loss_fn(p):
      loss, metrics = nnx.merge(graphdef, p).loss(batch, step_rng)
      if guard_cfg is not None:
        loss = guard.plant(guard_cfg, loss, step)
        metrics = dict(metrics, loss=loss)
      return loss, metrics

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=lr_schedule(step))
    return loss, grads, new_params, new_opt_state, metrics

  def train_step(params, opt_state, batch, step, rng):
    _, _, params, opt_state, metrics = update(params, opt_state, batch, step, rng)
    return params, opt_state, dict(metrics, param_norm=optax.tree.norm(params))

  def guarded_train_step(params, opt_state, guard_state, batch, step, rng):
    loss, grads, new_params, new_opt_state, metrics = update(params, opt_state, batch, step, rng)
    _, apply, guard_state, guard_metrics = guard.step_check(guard_cfg, guard_state, loss)
    if guard_cfg.spike == "skip":        # keep the old state where the step was a spike
      keep = lambda new, old: jnp.where(apply, new, old)
      new_params = jax.tree.map(keep, new_params, params)
      new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    metrics = dict(metrics, **guard_metrics, param_norm=optax.tree.norm(new_params),
                   grad_sq=guard.grad_sq_by_param(grads))
    return new_params, new_opt_state, guard_state, metrics

  return train_step if guard_cfg is None else guarded_train_step


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
