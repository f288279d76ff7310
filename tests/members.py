"""Synthetic member workdirs: the files a training run leaves, written from keyword arguments.

`write_member` writes what a run's writers would: config.json ({"config", "provenance"}, as
`train.py` writes it), metrics.jsonl (one JSON row per line, "step" first: `run/metrics.py`),
checkpoints/<step>/ (a stand-in for orbax's files), eval/val_full-step_<N>.json
(`run/validation.py`), eval/step_<N>.json (the offline suite's record: `evaluate.py`), FAILED (the
sweep runner's `status.mark_failed`) and ARCHIVE.json (`report.archive`). `member_config` is
config.json's "config" with the fields the readers use. `cbert_jax.run.record` reads them back.

The hyperparameter grid's synthetic grid is built on it (`grid_member`, `make_grid`): final
losses from a bowl in log lr and log B whose optimum follows known laws, lr* = LR_A C^LR_ALPHA and
B* = B_A C^B_BETA (tests/report/test_grid.py; the archive and the shipped laws use it too).
"""

import json
import math
import os
import re

from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib


# ------------------------------------------------------------------------------- files ---
def member_config(
  *,
  model: str = "bert",
  size: str = "d32L2",
  total_steps: int = 100,
  batch_size: int = 8,
  seq_len: int = 128,
  lr: float = 1e-3,
  cms: bool = True,
  seed: int = 0,
  sweep: dict | None = None,
  **fields,
) -> dict:
  """config.json's "config": the resolved config's fields the readers use, nested as train.py
  writes them (model.size, masking.cms, data.seq_len, optim.lr, sweep.*); `fields` adds or
  replaces top-level ones (e.g. name)."""
  return {
    "model_name": model,
    "seed": seed,
    "total_steps": total_steps,
    "batch_size": batch_size,
    "model": {"size": size},
    "masking": {"cms": cms},
    "data": {"seq_len": seq_len},
    "optim": {"lr": lr},
    "sweep": dict(sweep or {}),
    **fields,
  }


def write_config(workdir, config: dict, provenance: dict | None = None) -> None:
  """workdir/config.json: {"config": `config`, "provenance": `provenance`} (replaced if there)."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, record_lib.CONFIG_FILE), "w") as f:
    json.dump({"config": config, "provenance": provenance or {}}, f)


def append_rows(workdir, rows, torn: str = "") -> None:
  """Appends `rows` (dicts with "step") to metrics.jsonl, one JSON line each; then `torn`, a last
  line cut short (no newline), as a crash in the middle of a write leaves it."""
  with open(os.path.join(workdir, record_lib.METRICS_FILE), "a") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows) + torn)


def write_val_full(workdir, step: int, loss_or_record) -> None:
  """eval/val_full-step_<step>.json: {"step", "loss"} from a number, else {"step", **record}."""
  body = dict(loss_or_record) if isinstance(loss_or_record, dict) else {"loss": loss_or_record}
  path = record_lib.val_full_path(workdir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"step": step, **body}, f)


def write_probes(workdir, tag, results: dict, model: str = "", suite: str = "offline") -> str:
  """eval/<tag>.json, the probe suite's record of `results` (evaluate.py's fields); `tag` is
  step_<N> (an int N: that), optionally with evaluate.py's -<hash> of non-default evals."""
  tag = f"step_{tag}" if isinstance(tag, int) else tag
  step = int(re.match(r"step_(\d+)", tag).group(1))
  body = {"tag": tag, "suite": suite, "step": step, "model_name": model, "evals": {}}
  path = os.path.join(workdir, record_lib.EVAL_DIR, f"{tag}.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(body | {"complete": True, "results": results}, f)
  return path


def add_checkpoint(workdir, step: int) -> None:
  """checkpoints/<step>/ with a 4 KiB stand-in for the checkpoint's arrays."""
  state = os.path.join(workdir, record_lib.CHECKPOINTS_DIR, str(step), "state")
  os.makedirs(state, exist_ok=True)
  with open(os.path.join(state, "blob"), "wb") as f:
    f.write(b"\0" * 4096)


def write_member(
  workdir,
  config: dict,
  *,
  rows=(),
  val_full: dict | None = None,
  probes: dict | None = None,
  checkpoints=(),
  failed: str = "",
  archived: int = 0,
) -> str:
  """A new member workdir with the files its run would leave; returns its path.

  Args:
    config: config.json's "config" (`member_config`).
    rows: metrics.jsonl's rows, in order (none: no metrics.jsonl).
    val_full: {step: loss or record}: eval/val_full-step_<step>.json (`write_val_full`).
    probes: {step or tag: results}: the offline suite's eval/<tag>.json (`write_probes`).
    checkpoints: the steps with a checkpoint (checkpoints/<step>/).
    failed: FAILED's text (the sweep runner's record of a failure); "" for none.
    archived: an archived copy's final step (ARCHIVE.json, checkpoints left out); 0 for none.
  """
  workdir = str(workdir)
  os.makedirs(workdir)
  write_config(workdir, config)
  if rows:
    append_rows(workdir, rows)
  for step, rec in (val_full or {}).items():
    write_val_full(workdir, step, rec)
  for tag, results in (probes or {}).items():
    write_probes(workdir, tag, results, config.get("model_name", ""))
  for step in checkpoints:
    add_checkpoint(workdir, step)
  if failed:
    status_lib.mark_failed(workdir, failed)
  if archived:
    record = {"final_step": archived, "source": workdir, "checkpoints_left_out": True}
    status_lib.write_json_atomic(os.path.join(workdir, record_lib.ARCHIVE_FILE), record)
  return workdir


# -------------------------------------------------------------------------------- grid ---
SEQ_LEN = 128
# The bowl's optimum: lr* = LR_A C^LR_ALPHA, B* (tokens) = B_A C^B_BETA.
LR_A, LR_ALPHA = 0.5, -0.15
B_A, B_BETA = 0.05, 0.4


def grid_member(
  root,
  name,
  model,
  size,
  n,
  compute,
  rows,
  lr,
  loss,
  final_step=None,
  total_steps=100,
  failed="",
  eval_loss=None,
  val_full=True,
  seed=0,
  tokens_per_param=20.0,
):
  """A grid member `root/name` as train.run leaves it: metrics.jsonl with eval/loss at the end
  (`eval_loss`, default `loss`) and, for a finished run (unless `val_full` is False), the
  full-split validation record with `loss`; optionally cut short at `final_step` or marked
  FAILED."""
  last = total_steps if final_step is None else final_step
  config = member_config(
    model=model,
    size=size,
    total_steps=total_steps,
    batch_size=rows,
    seq_len=SEQ_LEN,
    lr=lr,
    sweep={
      "n_params": n,
      "compute": compute,
      "n_definition": "non_embedding",
      "tokens_per_param": tokens_per_param,
    },
    seed=seed,
    name=name,
  )
  metrics = [
    {"step": 10, "train/loss": loss + 1.0},
    {"step": last // 2, "eval/loss": loss + 0.5},
    {"step": last, "train/loss": loss + 0.1},
    {"step": last, "eval/loss": loss if eval_loss is None else eval_loss},
  ]
  finished = val_full and final_step is None and not failed
  record = {"loss": loss, "masked_acc": 0.1}
  return write_member(
    os.path.join(root, name),
    config,
    rows=metrics,
    val_full={total_steps: record} if finished else None,
    failed=failed,
  )


def true_optimum(compute, jitter=(0.0, 0.0), lr_a=LR_A, lr_alpha=LR_ALPHA):
  """(lr*, B* tokens) of a size: the laws' values moved by `jitter` octaves (lr, B), the scatter
  of real optima about a law."""
  return (lr_a * compute**lr_alpha * 2.0 ** jitter[0], B_A * compute**B_BETA * 2.0 ** jitter[1])


def bowl(compute, rows, lr, lr_a=LR_A, lr_alpha=LR_ALPHA, jitter=(0.0, 0.0)):
  """Final loss: a level falling with C plus a quadratic bowl in log lr and log B around the
  size's true optimum."""
  lr_opt, b_opt = true_optimum(compute, jitter, lr_a, lr_alpha)
  return (
    3.0 * compute**-0.05
    + 0.3 * math.log(lr / lr_opt) ** 2
    + 0.2 * math.log(rows * SEQ_LEN / b_opt) ** 2
  )


# (model, size, N); C = 6 N x 20 N (the sweep's budget), so lr* and B* are power laws in N too.
SIZES = [
  ("bert", "d32L2", 5e4),
  ("bert", "d64L2", 1.5e5),
  ("bert", "d96L3", 4e5),
  ("bert", "d128L3", 1e6),
  ("crossbert", "d32L2", 8e4),
  ("crossbert", "d64L2", 2.5e5),
  ("crossbert", "d96L3", 6e5),
]
# Off-centre grids (per size, in octaves): the best grid point misses the true optimum a little.
OFFSETS = [0.1, -0.15, 0.05, -0.05, 0.15, -0.1, 0.0]
# Each size's true optimum off the laws (octaves of lr, of B): the fits have residuals.
JITTER = [
  (0.1, -0.05),
  (-0.05, 0.08),
  (0.08, 0.02),
  (-0.1, -0.08),
  (0.02, 0.1),
  (0.05, -0.02),
  (-0.08, 0.05),
]


def make_grid(root, sizes=SIZES, lr_shift=0.0, lr_a=LR_A, lr_alpha=LR_ALPHA):
  """A 5 x 5 grid per size around the true optimum (shifted by `lr_shift` octaves; the optimum
  lr* = lr_a C^lr_alpha); returns {(model, size): the best member's (name, C, N, rows, lr)}."""
  best = {}
  for (model, size, n), u, jit in zip(sizes, OFFSETS, JITTER):
    compute = 120.0 * n * n
    lr0, rows0 = lr_a * compute**lr_alpha, B_A * compute**B_BETA / SEQ_LEN
    cands = []
    for i in range(-2, 3):
      for j in range(-2, 3):
        lr = float(f"{lr0 * 2.0 ** (i + u + lr_shift):.3g}")
        rows = max(1, int(round(rows0 * 2.0 ** (j - u))))
        name = f"{model}_{size}_b{rows}_lr{lr:.3g}"
        if os.path.exists(os.path.join(root, name)):
          continue  # rounding made two points equal
        loss = bowl(compute, rows, lr, lr_a, lr_alpha, jit)
        grid_member(root, name, model, size, int(n), compute, rows, lr, loss)
        cands.append((loss, name, compute, n, rows, lr))
    best[(model, size)] = min(cands)[1:]
  return best
