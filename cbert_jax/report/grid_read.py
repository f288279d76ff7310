"""A hyperparameter grid's members, read back from their workdirs (SPEC §5).

`read_grid(grid)` reads every member workdir under a grid directory (the subdirectories with a
config.json, as `experiments/hparam_grid.py` run by `python -m cbert_jax.main` leaves them) through
`cbert_jax.run.record`: the member's resolved config (model, size, N = `sweep.n_params`, compute
C = `sweep.compute`, rows, seq_len, peak LR, total_steps), its metrics.jsonl and its final
validation loss. `Member` is one such run; `Optimum` the best member of one (model, size) and the
grid it was chosen from. `cbert_jax.report.grid` fits the laws from them;
`cbert_jax.report.grid_plot` draws them.
"""

from __future__ import annotations

import dataclasses
import math
import os

from cbert_jax.run import record as record_lib

# The final validation loss a member is judged by (`--metric`).
METRICS = {
  # cbert_jax.run.validation: the training loss on every row of the validation split, masks from a
  # fixed key (the same for every run); the trainer writes it at the end, the CLI backfills it
  "val_full": "full-split validation loss at the final step (eval/val_full-step_<N>.json)",
  # the trainer's eval/loss: the first eval_batches x batch_size rows, the run's own masks (a
  # biased, batch-dependent sample; kept for grids run before val_full existed)
  "eval_loss": "eval/loss at the final step (metrics.jsonl)",
}


class GridError(Exception):
  """Bad input to the fit: one line, naming the path; the CLI exits 2."""


@dataclasses.dataclass
class Member:
  """One grid member's settings and outcome, read from its workdir."""

  name: str  # the sub-workdir's name
  arch: str  # model name, "-nocms" for CrossBERT without CMS
  model: str  # bert | crossbert
  size: str  # ladder rung
  n_params: int  # sweep.n_params (N under sweep.n_definition)
  n_definition: str  # sweep.n_definition
  tokens_per_param: float  # sweep.tokens_per_param: the training budget (0 = not recorded)
  compute: float  # sweep.compute: training FLOPs of the run
  batch_size: int  # rows per step
  seq_len: int  # tokens per row
  lr: float  # peak LR
  total_steps: int
  final_step: int  # the last step in metrics.jsonl (0 without one)
  loss: float | None  # the grid's metric (METRICS) at total_steps; +inf when diverged
  state: str  # done | diverged | unfinished | failed
  reason: str = ""  # why it is not done
  seeds: tuple[int, ...] = (0,)  # the config's seed; several after pool_seeds (their mean loss)

  @property
  def batch_tokens(self) -> int:
    return self.batch_size * self.seq_len


@dataclasses.dataclass
class Optimum:
  """The best member of one (model, size) and where it sits in that size's grid."""

  best: Member
  members: list[Member]  # done and diverged members of the size (its grid)
  edges: list[str]  # e.g. ["highest lr"]: the optimum may lie outside the grid
  lr: float = math.nan  # the optimum's peak LR as the laws use it (grid_vertex.locate)
  batch_tokens: float = math.nan  # the optimum's batch in tokens as the laws use it
  how: dict = dataclasses.field(default_factory=dict)  # how lr and batch were located


# ------------------------------------------------------------------------------- reading ---
def _nonfinite(x) -> bool:
  return isinstance(x, (int, float)) and not math.isfinite(x)


def read_member(workdir: str, metric: str = "val_full") -> Member | None:
  """The member in `workdir`, or None when it is not a run (no readable config.json). Its `loss`
  is `metric` (`METRICS`) at total_steps."""
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
  cfg = record_lib.config_or_none(workdir)
  if cfg is None:
    return None
  try:
    sweep = cfg.get("sweep", {})
    model = str(cfg["model_name"])
    cms = bool(cfg.get("masking", {}).get("cms", True)) or model != "crossbert"
    m = Member(
      name=os.path.basename(os.path.normpath(workdir)),
      arch=model + ("" if cms else "-nocms"),
      model=model,
      size=str(cfg.get("model", {}).get("size", "")) or "custom",
      n_params=int(sweep.get("n_params", 0)),
      n_definition=str(sweep.get("n_definition", "")),
      tokens_per_param=float(sweep.get("tokens_per_param", 0.0)),
      compute=float(sweep.get("compute", 0.0)),
      batch_size=int(cfg["batch_size"]),
      seq_len=int(cfg["data"]["seq_len"]),
      lr=float(cfg["optim"]["lr"]),
      total_steps=int(cfg["total_steps"]),
      final_step=0,
      loss=None,
      state="unfinished",
      seeds=(int(cfg.get("seed", 0)),),
    )
  except (ValueError, KeyError, TypeError):
    return None
  rows = record_lib.metrics_rows(workdir)
  m.final_step = max((r["step"] for r in rows), default=0)
  if metric == "val_full":
    try:
      rec = record_lib.read_val_full(workdir, m.total_steps)
    except ValueError as e:
      raise GridError(str(e)) from e
    final = [float(rec["loss"])] if rec is not None else []
  else:
    final = [r["eval/loss"] for r in rows if r["step"] == m.total_steps and "eval/loss" in r]
  failed = record_lib.failed(workdir) or ""  # written by the sweep runner
  diverged = "NonFinite" in failed or any(
    _nonfinite(r.get("train/loss")) or _nonfinite(r.get("eval/loss")) for r in rows
  )
  if not m.compute > 0 or not m.n_params > 0:
    m.state, m.reason = "failed", "no sweep.compute / sweep.n_params: not a sweep or grid member"
  elif diverged:
    m.state, m.loss, m.reason = "diverged", math.inf, failed or "non-finite loss"
  elif final and m.final_step >= m.total_steps:
    m.state, m.loss = "done", float(final[-1])
  elif failed:
    m.state, m.reason = "failed", failed
  elif m.final_step >= m.total_steps:
    m.reason = (
      f"finished, but no {record_lib.val_full_path('', m.total_steps)} (backfill: python -m "
      "cbert_jax.run.validation --root GRID)"
      if metric == "val_full"
      else f"no eval/loss at the final step {m.total_steps}"
    )
  else:
    m.reason = f"step {m.final_step}/{m.total_steps}"
  return m


def pool_seeds(members: list[Member]) -> list[Member]:
  """One member per grid point: finished (done or diverged) members that differ only in their seed
  (same arch, size, compute, rows, LR and steps) become one, named by their names joined with "+",
  whose loss is the mean over the seeds, or +inf (diverged) when any seed diverged. A point's
  optimum is judged on every seed run there, the rule the 20-tokens-per-parameter check decides by
  (results/lawcheck20_cpu/PLAN.md: 2-seed means). Unfinished and failed members pass through."""
  points: dict[tuple, list[Member]] = {}
  out = []
  for m in members:
    if m.state in ("done", "diverged"):
      key = (m.arch, m.size, m.compute, m.batch_size, m.lr, m.total_steps)
      points.setdefault(key, []).append(m)
    else:
      out.append(m)
  for group in points.values():
    if len(group) == 1:
      out.append(group[0])
      continue
    group = sorted(group, key=lambda m: m.seeds)
    seeds = tuple(s for m in group for s in m.seeds)
    if len(set(seeds)) < len(seeds):
      raise GridError(
        f"--grid: {', '.join(m.name for m in group)} are the same grid point with the same seed "
        f"({seeds}); keep one of them"
      )
    bad = [m for m in group if m.state == "diverged"]
    pooled = dataclasses.replace(
      group[0],
      name="+".join(m.name for m in group),
      final_step=min(m.final_step for m in group),
      seeds=seeds,
    )
    if bad:
      pooled.state, pooled.loss = "diverged", math.inf
      pooled.reason = f"seed(s) {', '.join(str(m.seeds[0]) for m in bad)} diverged"
    else:
      pooled.loss = sum(m.loss for m in group) / len(group)
    out.append(pooled)
  return sorted(out, key=lambda m: (m.arch, m.compute, m.batch_size, m.lr))


def read_grid(grid: str, metric: str = "val_full", progress=None) -> list[Member]:
  """Every member workdir directly under `grid`, sorted by (arch, compute, batch, lr); each
  member's loss is `metric` at its final step. `progress(done, total)` (optional) after each
  directory read."""
  if not os.path.exists(grid):
    raise GridError(f"--grid: no such directory {grid!r}")
  if not os.path.isdir(grid):
    raise GridError(f"--grid: {grid!r} is not a directory")
  names = record_lib.run_names(grid)
  members = []
  for i, d in enumerate(names):
    m = read_member(os.path.join(grid, d), metric)
    if m is not None:
      members.append(m)
    if progress:
      progress(i + 1, len(names))
  if not members:
    raise GridError(
      f"--grid: {grid!r} holds no member workdirs (subdirectories with a "
      "config.json; run experiments/hparam_grid.py into it first)"
    )
  return sorted(members, key=lambda m: (m.arch, m.compute, m.batch_size, m.lr))
