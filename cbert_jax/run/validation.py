r"""Full-split validation loss: the model's own training loss on every row of the validation split.

  python -m cbert_jax.run.validation --workdir runs/smoke [--step N] [--batch_size B] [--force]
  python -m cbert_jax.run.validation --root ~/cbert_runs/grid_cpu   # every finished run below it

The trainer's `eval/loss` reads the first `eval_batches` x `batch_size` rows of the split (a biased
and noisy sample); `full_split_loss` reads all of them, with masks that do not depend on the run.
The trainer computes it once at the end of a run (`config.final_validation`); this CLI computes it
for a run read back from its workdir alone (`trained.load`) and the run's prepared data.
Both write `<workdir>/eval/val_full-step_<N>.json`:

  {"step", "loss", "masked_acc", "rows", "target_tokens", "mask_key", "definition", "seconds",
   "model_name", "metrics", "half" (CrossBERT only), "batch_size", "devices"}

Definition (what is averaged)
-----------------------------
loss = (sum over every target token of every row of the split of its loss term) / (number of
target tokens), i.e. the model's `loss_sums` (the function its training step differentiates)
summed over the whole split and divided once by the global counts (`losses.finish` on the
totals): a token-weighted mean, not a mean of batch means. Rows added to fill the last batch
have segment id 0 everywhere, so they hold no target and add nothing to any sum. Per family:
  * BERT: cross-entropy at its K = round(mask_ratio x T) targets per row (maskable tokens only),
    the input corrupted 80/10/10 as in training;
  * CrossBERT with CMS: cross-entropy at every maskable token of the row, each predicted from the
    half of the row it is not in: BOTH complementary halves count, once each (its training loss);
  * CrossBERT without CMS: cross-entropy at its K = round(mask_ratio x T) targets, predicted from
    the other T - K tokens;
  * ELECTRA: gen_loss + disc_weight x disc_loss (its training loss), each a mean over its own
    count (generator targets; real tokens); `masked_acc` and `target_tokens` are the generator's.
masked_acc: the fraction of the same target tokens whose target has the largest logit.

Masks: every row's randomness is `fold_in(k, r)` with r the row's index in the validation split
(the models' per-row keys, `masking.row_keys`, given the split's row indices as `row_ids`) and k
derived from `jax.random.key(MASK_SEED)` only, never from the run's seed: a row's mask is the same
for every run, batch size, device count and process count. k is chosen per family so that all
families draw their target choice from the same per-row noise u (uniform [T]):
BERT and ELECTRA are given key(MASK_SEED) (they split it, in 2 and 3 parts, and select targets
with the first part: the same key under JAX's default partitionable threefry, tested), CrossBERT
is given that first part (`family_key`). Targets are the lowest-u positions
(CMS: the split into halves is the order of u), so the target sets are nested, row by row:
  ELECTRA's generator targets (15%) <= BERT's (20%) <= CrossBERT-noCMS's (50%) <= CMS's (all),
and CMS's view "encoder sees the high-u half, predicts the low-u half" is exactly
CrossBERT-noCMS's task (the same targets, the same visible tokens) on every row whose low-u half
holds no special or padding token.

Comparability. The families' losses cannot share one set of targets: they are different
objectives (BERT predicts 20% of the tokens from a corrupted row that still shows 80%; CrossBERT
predicts 50% from the other 50%; CMS predicts all tokens, half at a time). Within a family the
metric is defined identically for every run, which is what a hyperparameter grid needs. For
CrossBERT with vs without CMS, `loss` has the same expectation over masks up to the handling of
special tokens (both: a random half of the row predicted from the other half; without CMS the
special tokens are always in the visible half), but not the same targets. So for CrossBERT the
file also holds `half`: the loss of the no-CMS form at mask ratio 0.5 (K = T/2 targets, the
lowest-u maskable positions, predicted from the other T/2 positions) for either model, from the
same forward code (the model with `mask_cfg.cms = False`); for CrossBERT without CMS at ratio
0.5 it equals `loss`. CrossBERT with and without CMS are compared on `half`: the same targets and
the same visible tokens in every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from cbert_jax.data import prepare, settings
from cbert_jax.errors import CheckpointError, ConfigError
from cbert_jax.run import checkpoint as ckpt_lib
from cbert_jax.run import record as record_lib
from cbert_jax.run import trained
from cbert_jax.run.progress import format_duration
from cbert_jax.step import sharding

MASK_SEED = 20261203  # the fixed key of every row's mask: jax.random.key(MASK_SEED)
HALF_RATIO = 0.5  # CrossBERT's `half` metric: the no-CMS form at this mask ratio
DEFINITION = (
  "token-weighted mean of the model's own training loss (models' loss_sums summed over every "
  "row of the validation split, divided once by the global target counts; batch padding rows "
  "hold no target) - BERT: CE at round(r*T) targets, 80/10/10 corruption; CrossBERT+CMS: CE at "
  "every maskable token, each predicted from the other half (both halves count); CrossBERT "
  "no-CMS: CE at round(r*T) targets from the other tokens; ELECTRA: gen CE + disc_weight x disc "
  "BCE. Row r's masks: fold_in(k, r), k from jax.random.key(mask_key) only (BERT/ELECTRA: the "
  "key; CrossBERT: split(key)[0], so all families' targets come from the same per-row noise). "
  "CrossBERT's `half`: the no-CMS form at ratio 0.5, the same targets for CMS and no-CMS"
)


@dataclasses.dataclass
class Result:
  """The full-split metric of one model (see the module docstring for the definition)."""

  loss: float
  masked_acc: float
  rows: int  # rows of the split (padding excluded)
  target_tokens: int  # targets the loss averages over (ELECTRA: the generator's)
  metrics: dict  # every metric of the model's loss over the split (ELECTRA: gen_loss, ...)
  half: dict | None  # CrossBERT: {"loss", "masked_acc", "target_tokens"} of the no-CMS form at 0.5
  seconds: float  # wall time, compilation included
  batch_size: int  # rows per step (a multiple of the data-parallel size)
  devices: int


def family_key(model_name: str, seed: int = MASK_SEED):
  """The key `model_name`'s `loss` is given: its per-row target noise is the same for every
  family (BERT and ELECTRA select targets with split(key)[0]; CrossBERT with its key itself)."""
  key = jax.random.key(seed)
  return jax.random.split(key)[0] if model_name == "crossbert" else key


def _num_rows(rows) -> int:
  return len(next(iter(rows.values()))) if isinstance(rows, dict) else len(rows)


def _read(rows, idx: np.ndarray) -> dict[str, np.ndarray]:
  """Rows at `idx` ([B] int, -1 = a padding row: segment id 0, no target) as {key: [B, T]}."""
  real = idx >= 0
  src = np.where(real, idx, 0)
  got = {k: v[src] for k, v in rows.items()} if isinstance(rows, dict) else rows.read(src)
  out = {k: np.where(real[:, None], got[k], 0).astype(np.int32) for k in got}
  return {k: out[k] for k in ("tokens", "positions", "segment_ids")}


def _step_fn(graphdef, model_name: str, seed: int, coefs_out: dict):
  """(params, batch) -> {"own": sums, "half": sums (CrossBERT)}; sums as `loss_sums`, masks from
  `family_key(model_name, seed)` (made inside the step: nothing to place on non-local devices)."""

  def step(params, batch):
    key = family_key(model_name, seed)
    model = nnx.merge(graphdef, params)
    sums, coefs = model.loss_sums(batch, key)
    coefs_out.update(coefs)  # static floats: recorded while tracing
    out = {"own": sums}
    if model_name == "crossbert":
      mc = model.mask_cfg
      if mc.cms or mc.mask_ratio != HALF_RATIO:
        model.mask_cfg = dataclasses.replace(mc, cms=False, mask_ratio=HALF_RATIO)
        out["half"] = model.loss_sums(batch, key)[0]
    return out

  return step


_STEPS: dict = {}  # (graphdef, model_name, seed, mesh, rules) -> (jitted step, loss coefficients)


def _jitted_step(graphdef, model_name: str, seed: int, mesh, rules):
  """The jitted `_step_fn`, one per model, mesh and rules in this process: runs of the same model
  (a grid's members of one size, read one after another) share its traces and executables."""
  key = (graphdef, model_name, int(seed), mesh, tuple(rules))
  if key not in _STEPS:
    if len(_STEPS) >= 8:
      _STEPS.clear()
    coefs: dict = {}
    step = jax.jit(
      _step_fn(graphdef, model_name, seed, coefs), out_shardings=sharding.replicated(mesh)
    )
    _STEPS[key] = (step, coefs)
  return _STEPS[key]


def _finish(sums: dict, coefs: dict) -> dict:
  """`losses.finish` on host float64 totals: {metric: num / max(den, 1)} plus "loss"."""
  out = {n: num if den is None else num / max(den, 1.0) for n, (num, den) in sums.items()}
  out["loss"] = sum(c * out[n] for n, c in coefs.items())
  return {n: float(v) for n, v in out.items()}


def full_split_loss(
  graphdef,
  params,
  rows,
  *,
  mesh,
  rules,
  batch_size: int,
  model_name: str,
  seed: int = MASK_SEED,
  process_index: int | None = None,
  process_count: int | None = None,
  log: Callable[[str], None] | None = None,
  log_every_s: float = 30.0,
) -> Result:
  """The full-split validation metric of the model `graphdef`/`params` (module docstring).

  Args:
    graphdef, params: the model (params laid out on `mesh`, any layout: replicated or FSDP).
    rows: the validation split, {key: [N, T]} arrays or `pipeline.ArrayRecordRows`.
    mesh, rules: the mesh and logical-axis rules; batches are split over the axes "batch" maps
      to (data parallel); every step has the same shapes, so it compiles once.
    batch_size: rows per step over all processes; rounded up to a multiple of the data-parallel
      size (and of the process count). The result does not depend on it.
    model_name: bert | crossbert | electra (which key the loss is given, `family_key`).
    seed: MASK_SEED unless a test wants another mask draw.
    process_index, process_count: this process and the count (default: JAX's); each process
      reads only its slice of every batch; every process must call this.
    log: a progress sink (a line every `log_every_s` seconds), or None.
  """
  start = time.perf_counter()
  p = jax.process_index() if process_index is None else process_index
  pc = jax.process_count() if process_count is None else process_count
  n = _num_rows(rows)
  if n == 0:
    raise ConfigError("full-split validation: the validation split has no rows")
  unit = math.lcm(sharding.data_parallel_size(mesh, rules), pc)
  b = -(-max(int(batch_size), 1) // unit) * unit
  lb = b // pc
  batch_sh = sharding.logical_sharding(mesh, rules, ("batch", "seq"))
  row_sh = sharding.logical_sharding(mesh, rules, ("batch",))
  step, coefs = _jitted_step(graphdef, model_name, seed, mesh, rules)
  num_steps = -(-n // b)
  totals: dict = {}

  def add(out) -> None:  # host float64 totals of {"own"/"half": {metric: (num, den | None)}}
    for part, sums in jax.device_get(out).items():
      acc = totals.setdefault(part, {})
      for name, (num, den) in sums.items():
        old = acc.get(name, (0.0, None if den is None else 0.0))
        acc[name] = (old[0] + float(num), None if den is None else old[1] + float(den))

  last_log, pending = time.perf_counter(), None
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    for s in range(num_steps):
      idx = s * b + p * lb + np.arange(lb)  # this process's slice of global batch s
      ids = np.where(idx < n, idx, -1)
      local = _read(rows, ids)
      batch = sharding.global_batch(local, batch_sh)
      batch["row_ids"] = jax.make_array_from_process_local_data(row_sh, idx.astype(np.int32))
      out = step(params, batch)
      if pending is not None:  # fetch the previous step's sums while this one runs
        add(pending)
      pending = out
      if log is not None and time.perf_counter() - last_log > log_every_s:
        last_log = time.perf_counter()
        log(f"  full-split validation: batch {s + 1}/{num_steps}")
    add(pending)
  own = _finish(totals["own"], coefs)
  if not math.isfinite(own["loss"]):
    raise FloatingPointError(f"full-split validation: non-finite loss {own}")
  half = None
  if model_name == "crossbert":
    h = _finish(totals["half"], {"loss": 1.0}) if "half" in totals else own
    half = {
      "loss": h["loss"],
      "masked_acc": h["masked_acc"],
      "target_tokens": int(round(h["num_targets"])),
    }
  return Result(
    loss=own["loss"],
    masked_acc=own["masked_acc"],
    rows=n,
    target_tokens=int(round(own["num_targets"])),
    metrics={k: v for k, v in own.items() if k != "num_targets"},
    half=half,
    seconds=time.perf_counter() - start,
    batch_size=b,
    devices=int(mesh.devices.size),
  )


# ------------------------------------------------------------------------------ files ---
def output_path(workdir: str, step: int) -> str:
  return record_lib.val_full_path(workdir, step)


def record(step: int, result: Result, model_name: str, seed: int = MASK_SEED) -> dict:
  """The JSON record of `result` (the file's content)."""
  rec = {
    "step": int(step),
    "loss": result.loss,
    "masked_acc": result.masked_acc,
    "rows": result.rows,
    "target_tokens": result.target_tokens,
    "mask_key": int(seed),
    "definition": DEFINITION,
    "seconds": round(result.seconds, 3),
    "model_name": model_name,
    "metrics": result.metrics,
    "batch_size": result.batch_size,
    "devices": result.devices,
  }
  if result.half is not None:
    rec["half"] = result.half
  return rec


def in_run(
  graphdef,
  params,
  rows,
  *,
  mesh,
  rules,
  batch_size: int,
  model_name: str,
  workdir: str | None,
  step: int,
  eval_loss: tuple[int, float | None],
  log=print,
) -> tuple[dict, dict]:
  """The trainer's full-split validation at `step` (every process computes it; `workdir` None on
  the processes that do not write). Returns (the record, the metrics of its metrics.jsonl row:
  val_full/loss, val_full/masked_acc, val_full/half_loss for CrossBERT, time/full_validation_s).
  `eval_loss`: (rows, the trainer's eval/loss on them), logged beside it for comparison."""
  start = time.perf_counter()
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    res = full_split_loss(
      graphdef,
      params,
      rows,
      mesh=mesh,
      rules=rules,
      batch_size=batch_size,
      model_name=model_name,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      log=log,
    )
  seconds = time.perf_counter() - start
  path = write(workdir, step, res, model_name) if workdir else "process 0's workdir"
  out = {"val_full/loss": res.loss, "val_full/masked_acc": res.masked_acc}
  if res.half is not None:
    out["val_full/half_loss"] = res.half["loss"]
  log(
    f"full-split validation at step {step}: loss {res.loss:.4f}, masked_acc "
    f"{res.masked_acc:.4f} over {res.rows} rows / {res.target_tokens} targets (eval/loss on the "
    f"first {eval_loss[0]} rows: {eval_loss[1]}) in {seconds:.1f}s; wrote {path}"
  )
  return record(step, res, model_name), out | {"time/full_validation_s": seconds}


def write(workdir: str, step: int, result: Result, model_name: str) -> str:
  """Writes `eval/val_full-step_<step>.json` (atomically: a temporary file, then a rename)."""
  path = output_path(workdir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(record(step, result, model_name), f, indent=2)
    f.write("\n")
  os.replace(tmp, path)
  return path


def summary_line(workdir: str, rec: dict) -> str:
  half = f", half {rec['half']['loss']:.4f}" if "half" in rec else ""
  return (
    f"{workdir} step {rec['step']}: val_full loss {rec['loss']:.4f}{half}, masked_acc "
    f"{rec['masked_acc']:.4f} over {rec['rows']} rows / {rec['target_tokens']} targets "
    f"({format_duration(rec['seconds'])})"
  )


# -------------------------------------------------------------------------------- CLI ---
def checkpoint_steps(workdir: str) -> list[int]:
  """The workdir's readable checkpoint steps, ascending (without restoring anything)."""
  config = trained.read_config(workdir)["config"]
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    return []
  checkpointer = ckpt_lib.Checkpointer(ckpt_dir, int(config.get("keep_checkpoints", 2)))
  try:
    return sorted(int(s) for s in checkpointer.all_steps())
  finally:
    checkpointer.close()


def _prepare(config):
  return prepare.prepare(settings.data_config(config), config.data.seq_len)


def validate_workdir(
  workdir: str,
  step: int | None = None,
  *,
  batch_size: int = 0,
  force: bool = False,
  log: Callable[[str], None] = print,
  data_memo: dict | None = None,
) -> dict | None:
  """Computes and writes the metric of `workdir` at checkpoint `step` (default: the latest).

  Returns the record written, or None when the file existed (and not `force`): then nothing is
  loaded. `batch_size` 0 = the run's. `data_memo`: prepared data shared between runs (--root).
  Raises ConfigError when the prepared data's tokenizer is not the run's.
  """
  workdir = os.path.abspath(workdir)
  if step is None:
    steps = checkpoint_steps(workdir)
    if not steps:
      raise ConfigError(f"workdir {workdir}: no checkpoint in checkpoints/; train first")
    step = steps[-1]
  path = output_path(workdir, step)
  if os.path.exists(path) and not force:
    log(f"{workdir} step {step}: already computed ({path})")
    return None
  run = trained.load(workdir, step)
  config = run.config
  memo_key = json.dumps(config.data.to_dict(), sort_keys=True, default=str)
  memo = data_memo if data_memo is not None else {}
  if memo_key not in memo:
    memo.clear()  # one split in memory at a time
    memo[memo_key] = _prepare(config)
  data = memo[memo_key]
  if data.tokenizer.sha256 != run.tokenizer.sha256:
    raise ConfigError(
      f"workdir {workdir}: the prepared data's tokenizer (sha256 {data.tokenizer.sha256[:12]}...) "
      f"is not the run's (sha256 {run.tokenizer.sha256[:12]}..., its tokenizer.model); the data "
      "cache or the data config no longer gives the run's data, so its validation split cannot "
      "be rebuilt here"
    )
  result = full_split_loss(
    run.graphdef,
    run.params,
    data.val,
    mesh=run.mesh,
    rules=run.rules,
    batch_size=batch_size or int(config.batch_size),
    model_name=run.model_name,
    log=log,
  )
  write(workdir, run.step, result, run.model_name)
  rec = record(run.step, result, run.model_name)
  log(summary_line(workdir, rec))
  return rec


def run_workdirs(root: str) -> list[str]:
  """The run workdirs below `root` (directories with config.json and checkpoints/), sorted; a
  run's own subdirectories are not searched."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    if "config.json" in filenames and "checkpoints" in dirnames:
      out.append(dirpath)
      dirnames[:] = []
    else:
      dirnames.sort()
  return sorted(out)


def validate_root(
  root: str,
  *,
  batch_size: int = 0,
  force: bool = False,
  unfinished: bool = False,
  log: Callable[[str], None] = print,
) -> dict[str, str]:
  """`validate_workdir` on every run below `root`, one after another, at its latest checkpoint.

  A run whose latest checkpoint is before its total_steps (not finished, or still training) is
  skipped unless `unfinished`. Returns {workdir: "written" | "already computed" | "unfinished" |
  "failed: ..."}; one run's failure does not stop the others.
  """
  workdirs = run_workdirs(root)
  if not workdirs:
    raise ConfigError(f"--root {root}: no run workdir (config.json + checkpoints/) below it")
  log(f"full-split validation of {len(workdirs)} runs under {root}")
  status, memo, start = {}, {}, time.perf_counter()
  for i, w in enumerate(workdirs):
    head = f"[{i + 1}/{len(workdirs)}, {format_duration(time.perf_counter() - start)}]"
    try:
      steps = checkpoint_steps(w)
      total = int(trained.read_config(w)["config"].get("total_steps", 0))
      if not steps or (steps[-1] < total and not unfinished):
        status[w] = "unfinished"
        log(f"{head} {w}: skipped, not finished (checkpoints {steps}, total_steps {total})")
        continue
      rec = validate_workdir(
        w,
        steps[-1],
        batch_size=batch_size,
        force=force,
        log=lambda s, head=head: log(f"{head} {s}"),
        data_memo=memo,
      )
      status[w] = "written" if rec is not None else "already computed"
    except (ConfigError, CheckpointError, FloatingPointError) as e:
      status[w] = f"failed: {e}"
      log(f"{head} {w}: FAILED: {e}")
  counts: dict[str, int] = {}
  for v in status.values():
    k = v.split(":")[0]
    counts[k] = counts.get(k, 0) + 1
  log(f"done in {format_duration(time.perf_counter() - start)}: {counts}")
  return status


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="python -m cbert_jax.run.validation", description=__doc__.splitlines()[0]
  )
  where = p.add_mutually_exclusive_group(required=True)
  where.add_argument("--workdir", help="a training run's directory")
  where.add_argument("--root", help="every run workdir below this directory, one after another")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  p.add_argument(
    "--batch_size",
    type=int,
    default=0,
    help="rows per step (default: the run's batch_size; rounded up to a multiple of the "
    "device count); the result does not depend on it",
  )
  p.add_argument("--force", action="store_true", help="recompute when the file exists")
  p.add_argument(
    "--unfinished",
    action="store_true",
    help="--root: also runs whose latest checkpoint is before total_steps",
  )
  return p


def main(argv: list[str] | None = None) -> int:
  ns = parser().parse_args(argv)
  log = lambda s: print(s, flush=True)
  try:
    if ns.batch_size < 0:
      raise ConfigError(f"--batch_size {ns.batch_size}: expected a positive size (0 = the run's)")
    if ns.root is not None:
      if ns.step is not None:
        raise ConfigError("--step applies to --workdir; --root uses each run's latest checkpoint")
      status = validate_root(
        ns.root, batch_size=ns.batch_size, force=ns.force, unfinished=ns.unfinished, log=log
      )
      return 1 if any(v.startswith("failed") for v in status.values()) else 0
    validate_workdir(ns.workdir, ns.step, batch_size=ns.batch_size, force=ns.force, log=log)
  except (ConfigError, CheckpointError) as e:
    kind = "checkpoint error" if isinstance(e, CheckpointError) else "config error"
    print(f"{kind}: {e}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 5
  return 0


if __name__ == "__main__":
  sys.exit(main())
