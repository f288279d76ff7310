"""The optimizer: gradient clipping + AdamW with a weight-decay mask, and the LR schedules.

Everything is optax; the only code here is the warmup-stable-decay (WSD) schedule, which optax has
no single constructor for, assembled from optax's own linear/cosine schedules with join_schedules.
"""

import jax
import optax


def schedule(ocfg, total_steps: int) -> optax.Schedule:
  """LR schedule from `config.optim`: wsd (warmup, constant, decay over the last decay_frac) or cosine."""
  peak, floor = ocfg.lr, ocfg.lr * ocfg.final_lr_frac
  warmup = warmup_steps(ocfg, total_steps)
  if ocfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
      0.0, peak, warmup, max(total_steps, warmup + 1), floor
    )
  if ocfg.schedule == "wsd":
    decay = max(1, int(round(ocfg.decay_frac * total_steps)))
    stable = max(0, total_steps - warmup - decay)
    decay_fn = (
      optax.cosine_decay_schedule(peak, decay, alpha=ocfg.final_lr_frac)
      if ocfg.decay_shape == "cosine"
      else optax.linear_schedule(peak, floor, decay)
    )
    return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak), decay_fn],
      boundaries=[warmup, warmup + stable],
    )
  if ocfg.schedule == "constant":
    return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], boundaries=[warmup]
    )
  raise ValueError(f"optim.schedule must be wsd|cosine|constant, got {ocfg.schedule!r}")


def warmup_steps(ocfg, total_steps: int) -> int:
  """optim.warmup_steps if set (> 0), else warmup_frac of the run (at least 1 step)."""
  if ocfg.warmup_steps > 0:
    return int(ocfg.warmup_steps)
  return max(1, int(round(ocfg.warmup_frac * total_steps)))


def decay_mask(params) -> object:
  """Weight decay on matrices (ndim >= 2: projections, embeddings, head) only; not on norm scales
  or the predictor's mask vector."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(ocfg, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """clip_by_global_norm -> AdamW(schedule, b1, b2, eps, weight_decay on matrices)."""
  lr = schedule(ocfg, total_steps)
  parts = []
  if ocfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(ocfg.clip_norm))
  parts.append(
    optax.adamw(
      lr, b1=ocfg.b1, b2=ocfg.b2, eps=ocfg.eps, weight_decay=ocfg.weight_decay, mask=decay_mask
    )
  )
  return optax.chain(*parts), lr
