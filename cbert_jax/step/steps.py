"""Pure step functions, jitted by the trainer: train_step, eval_step, features_step.

All take the parameter pytree (an `nnx.State` of Params) and rebuild the module inside with
`nnx.merge(graphdef, params)`, so the compiled function is a pure function of arrays. The masking
key is `fold_in(rng, step)`: masks are a function of (seed, step), so a resumed run draws the same
masks as an uninterrupted one, and the data pipeline stays model-agnostic.

Gradient accumulation (`microbatches` = k > 1, config optim.microbatches) runs k micro-batches
through one jitted step under `jax.lax.scan` and applies one optimizer update; the global batch,
the LR schedule and the data order are the plan's. See `accumulate_grads` for the split, the
masks' randomness and the exact normalisation.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cbert_jax.errors import ConfigError
from cbert_jax.models import layers, losses
from cbert_jax.step import guard


def make_train_step(
  graphdef: nnx.GraphDef,
  tx: optax.GradientTransformation,
  lr_schedule,
  trace_counter: list | None = None,
  guard_cfg: guard.GuardConfig | None = None,
  microbatches: int = 1,
):
  """train_step(params, opt_state, batch, step, rng) -> (params, opt_state, metrics).

  With `guard_cfg` (the trainer), the step also carries the loss statistics of `guard`:
  train_step(params, opt_state, guard_state, batch, step, rng)
    -> (params, opt_state, guard_state, metrics), metrics with spike / loss_z / skipped and
  `grad_sq` ({parameter path: squared gradient norm}, for diagnostics); with
  `guard_cfg.spike == "skip"` a spike's update is not applied.

  `microbatches` = k > 1: the gradient is accumulated over k micro-batches of the batch
  (`accumulate_grads`), then one update; loss, metrics, grad_norm, grad_sq and the guard see the
  accumulated (= full-batch) values. k = 1 traces exactly the single-pass step (no scan).
  """
  if microbatches < 1:
    raise ConfigError(f"optim.microbatches must be >= 1, got {microbatches}")

  def update(params, opt_state, batch, step, rng):
    if trace_counter is not None:
      trace_counter.append(1)  # Python side effect: runs once per trace, not per call
    step_rng = jax.random.fold_in(rng, step)
    plant = (
      (lambda loss: loss)
      if guard_cfg is None
      else (lambda loss: guard.plant(guard_cfg, loss, step))
    )

    def loss_fn(p):
      loss, metrics = nnx.merge(graphdef, p).loss(batch, step_rng)
      if guard_cfg is not None:
        loss = plant(loss)
        metrics = dict(metrics, loss=loss)
      return loss, metrics

    if microbatches == 1:
      (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    else:
      loss, metrics, grads = accumulate_grads(
        graphdef, params, batch, step_rng, microbatches, plant
      )
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
    if guard_cfg.spike == "skip":  # keep the old state where the step was a spike
      keep = lambda new, old: jnp.where(apply, new, old)
      new_params = jax.tree.map(keep, new_params, params)
      new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    metrics = dict(
      metrics,
      **guard_metrics,
      param_norm=optax.tree.norm(new_params),
      grad_sq=guard.grad_sq_by_param(grads),
    )
    return new_params, new_opt_state, guard_state, metrics

  return train_step if guard_cfg is None else guarded_train_step


def split_microbatches(batch: dict, k: int) -> dict:
  """The global batch {name: [B, ...]} as k micro-batches {name: [k, B/k, ...]}, with the rows'
  global indices added as row_ids [k, B/k] (unless the batch already has row_ids).

  Micro-batch i holds the global rows i, i + k, i + 2k, ...: [B, ...] -> [B/k, k, ...] ->
  [k, B/k, ...]. With the batch split over D data-parallel devices in contiguous blocks of B/D
  rows and B % (k D) == 0, each device's block is B/(k D) whole groups of k rows, so every
  micro-batch takes B/(k D) rows from every device and no row moves between devices (MaxText
  splits the same way). Each array is constrained to the batch layout on its B/k axis.
  """
  b = batch["tokens"].shape[0]
  if b % k:
    raise ConfigError(f"batch_size={b} is not divisible by optim.microbatches={k}")
  batch = dict(batch)
  batch.setdefault("row_ids", jnp.arange(b, dtype=jnp.int32))  # [B]

  def split(x):  # [B, ...]
    x = x.reshape((b // k, k) + x.shape[1:])  # [B/k, k, ...]
    x = jnp.swapaxes(x, 0, 1)  # [k, B/k, ...]
    return layers.constrain(x, (None,) + _batch_names(x.ndim - 1))

  return {name: split(x) for name, x in batch.items()}


def _batch_names(ndim: int) -> tuple:
  """Logical axis names of a batch array [B, T, ...] of `ndim` dimensions."""
  return (("batch", "seq") + (None,) * ndim)[:ndim]


def _constrain_like(tree, params):
  """Each array of `tree` (shaped like the nnx.State `params`) laid out like its parameter: the
  parameter's logical axis names under the active rules (a no-op outside a mesh)."""
  names = [
    v.get_metadata().get("out_sharding")
    for v in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  ]
  leaves, treedef = jax.tree.flatten(tree)
  return treedef.unflatten(
    [x if n is None else layers.constrain(x, n) for x, n in zip(leaves, names, strict=True)]
  )


def accumulate_grads(
  graphdef: nnx.GraphDef, params, batch: dict, rng: jax.Array, k: int, plant=lambda loss: loss
):
  """(loss, metrics, grads) of the full batch, computed over k micro-batches under `lax.scan`.

  Split: `split_microbatches` (micro-batch i = global rows i, i + k, ...; no row changes device).

  Randomness: the models draw every row's mask (and ELECTRA's samples) from that row's own key,
  fold_in(rng, global row index) (masking.row_keys); a micro-batch passes its rows' global indices
  as batch["row_ids"], so each row gets exactly the mask it gets in the full batch.

  Normalisation: a model's loss is sum_t coef_t * S_t / N_t over its terms t (`loss_sums`:
  numerator S_t, e.g. summed CE, and denominator N_t, e.g. the batch's target count). Summing
  micro-batch means would weight the micro-batches equally whatever their counts (padding), so
  this first computes the global N_t with a full-batch call of `loss_sums` of which only the
  denominators are used: they depend on the masks and the batch only, so XLA drops the encoder,
  the heads and the rest as dead code (checked with the compiled cost analysis in
  tests/step/test_microbatches.py). Micro-batch j then contributes sum_t coef_t * S_t,j / N_t, and
  the summed gradients are the full batch's gradient (up to float summation order). Every
  metric's numerator and denominator are summed over the micro-batches, so the reported loss and
  all metrics (masked_acc, ELECTRA's disc_acc / disc_recall / ...) are the full batch's exactly.

  The gradient accumulator is float32 and laid out like the parameters (constrained to their
  shardings); the result is cast back to the parameters' dtypes. `plant` is the guard's test
  hook (guard.plant), applied to every micro-batch loss and to the reported loss.
  """
  # 1. The global denominators N_t (the full-batch pass is dead code but for them).
  full_sums, coefs = nnx.merge(graphdef, params).loss_sums(batch, rng)
  counts = {t: jnp.maximum(jax.lax.stop_gradient(full_sums[t][1]), 1.0) for t in coefs}
  micro = split_microbatches(batch, k)  # {name: [k, B/k, T]}

  def micro_loss(p, mb):
    sums, _ = nnx.merge(graphdef, p).loss_sums(mb, rng)
    return plant(losses.combine({t: sums[t][0] / counts[t] for t in coefs}, coefs)), sums

  def body(carry, mb):  # mb: {name: [B/k, T]}
    acc, total = carry
    mb = {name: layers.constrain(x, _batch_names(x.ndim)) for name, x in mb.items()}
    (_, sums), g = jax.value_and_grad(micro_loss, has_aux=True)(params, mb)
    acc = _constrain_like(jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, g), params)
    return (acc, jax.tree.map(jnp.add, total, sums)), None

  acc = _constrain_like(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), params)
  total = jax.tree.map(jnp.zeros_like, full_sums)  # {metric: (num, den or None)}, summed
  (acc, total), _ = jax.lax.scan(body, (acc, total), micro)
  grads = jax.tree.map(lambda a, p: a.astype(p.dtype), acc, params)
  loss, metrics = losses.finish(total, coefs)
  loss = plant(loss)
  return loss, dict(metrics, loss=loss), grads


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
    out = nnx.merge(graphdef, params).features(
      batch["tokens"], batch["positions"], batch["segment_ids"]
    )
    w = (batch["segment_ids"] != 0).astype(jnp.float32)  # [B, T]
    denom = jnp.maximum(w.sum(-1, keepdims=True), 1.0)  # [B, 1]
    if layers == "final":
      h = select_layer(out, layer).astype(jnp.float32)  # [B, T, d]
      return jnp.einsum("btd,bt->bd", h, w) / denom
    return jnp.einsum("lbtd,bt->lbd", out["hidden"].astype(jnp.float32), w) / denom[None]

  return features_step
