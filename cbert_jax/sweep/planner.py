r"""Compute-optimal planner: for a training budget C (FLOPs) and a model family, the model size,
tokens, batch, LR, steps, predicted loss, memory setting and wall time of the run to train.

  python -m cbert_jax.sweep.planner --flops 1e21 --model crossbert
  python -m cbert_jax.sweep.planner --flops 1e21 --model crossbert --chips v5p-64 \
      [--laws FILE] [--surface FILE [--allow_unusable]] [--mfu 0.4] [--seq_len 512] \
      [--vocab 32768] [--tokens_per_param 20] [--ladder paper|all] [--law_axis compute|params] \
      [--n_definition non_embedding] [--json]

Where every number comes from:
  model configs  each rung of the ladder is the paper sweep's member config for (model, rung):
                 `experiments/sweep.py` get_config(member_arg("paper", model, size)) (vocabulary
                 32768, 512-token rows, bf16, CrossBERT = CrossBERT+CMS), with --seq_len / --vocab
                 applied, resolved by `config_lib.resolve` (sizes.lookup -> d_model, layers, heads;
                 predictor depth), then `plan.model_config`. `--ladder paper` (default) offers the
                 family's paper rungs (`PAPER_SIZES`: CrossBERT all 9, BERT the first 8); `all`
                 offers every rung of `cbert_jax/models/sizes.py` with the same settings.
  N              parameters under --n_definition (`budget.n_params` of `flops.param_counts`;
                 default non_embedding: blocks + predictor, no embedding or vocabulary head).
  FLOPs/token    `flops.flops_per_token` (training FLOPs per data token, algorithmic count).
  N_opt, D_opt   with --surface FILE (a fitted Chinchilla surface, `chinchilla.save`): the surface's
                 `LossSurface.optimal(C, k)`, k = FLOPs per parameter per token stored with the
                 surface, i.e. N_opt = G (C/k)^(beta/(alpha+beta)), D_opt = C / (k N_opt); a note
                 says how many decades N_opt and D_opt/N_opt lie outside the N and D/N the
                 surface was fitted on (its provenance; `python -m cbert_jax.report` writes
                 surface_<family>.json with them).
                 Without one: the sweep's rule D = tokens_per_param x N (--tokens_per_param,
                 default 20) with C = k(N) N D, k(N) = FLOPs per data token / N of the ladder's rungs,
                 interpolated log-linearly in log N (clamped at the ends); solved for N by bisection.
  rung           the ladder rung nearest N_opt in log N; its exact N; its tokens D = C / (its
                 FLOPs per token), so the run spends the budget C at that rung.
  LR, batch      `laws.suggest(laws, x, seq_len, multiple=devices)` with x = C (--law_axis compute,
                 default) or the rung's N (params): lr = a x^alpha, rows = b x^beta / seq_len
                 rounded to a multiple of the data-parallel devices (FSDP over every chip), at least
                 one multiple. --laws FILE is a laws.json of `python -m cbert_jax.report.grid fit`
                 (or shipped:<name>); without it `laws.DEFAULT` (DeepSeek LLM's published laws);
                 the output names the source (`laws.source`), the x range the laws were fitted on
                 (from their provenance's grid runs) and, in a note, how many decades x lies
                 outside it (an extrapolation), any refusal check overridden with its reason, and
                 a note when the plan's tokens per parameter are more than 1.5x away from the
                 budget the laws' grid trained at (`HyperLaws.budget_mismatch`).
  steps          ceil(D / (rows x seq_len)); the run trains steps x rows x seq_len tokens (at most
                 one step's tokens more than D).
  loss           with --surface: the point L(N, D) at the rung and its trained tokens, and the
                 interval: percentiles of L(N, D) over the surface fit's bootstrap draws at the
                 fit's level (`Fit.loss_interval`); also L at (N_opt, D_opt). Without a surface:
                 "no loss surface given" (no number).
  memory         with --chips: `memory.plan(memory.shape_of(model, model_cfg, mask_cfg, seq_len,
                 rows, {data: 1, fsdp: devices, tensor: 1}), chip)` (FSDP over every device, as the
                 sweep plans its members): the least costly remat / ce_chunk / micro-batch setting
                 that fits, its predicted bytes per device and the chip's usable bytes.
  wall time      with --chips: C / (devices x the chip's bf16 peak per device
                 (`chips.CHIPS[chip].bf16`, the MFU denominator's figure) x MFU), at a *stated*
                 MFU (--mfu, default 0.4): an assumption, not a measurement.
  TPU compile    with --chips on a TPU: the rung's latest TPU compile (`launch.compile_check
                 --archive`, rows in --aot DIR/<chip>/<member>.json, default results/tpu_aot),
                 compared with the plan on batch, sequence, vocabulary, devices and memory
                 setting (STALE, with the fields that differ, when it was compiled for another
                 config): its HBM per chip, and the compiler's `optimal_seconds` step estimate; the
                 plan's chip-hours from the stated MFU and from that estimate (optimal_seconds x
                 steps x chips; none from a stale compile). The compiler's figures are its own
                 estimate, not a measurement (scaling/compiled.py).

--chips: `<tpu>-<N>` names a Cloud TPU slice the way its accelerator type does: v4 and v5p count
TensorCores (2 per chip, one JAX device per chip: v5p-64 = 32 chips = 32 devices; slices are
whole hosts of 4 chips), v5e and v6e count chips (slices of 1, 4, 8, 16, 32, 64, 128, 256; v5e's
accelerator-type prefix v5litepod is accepted too) -- `cbert_jax.scaling.chips`, the one chip
table (slice names, HBM, peak FLOP/s, interconnect) that `launch/backends.py` names slices with
and the memory plan and MFU read. `<gpu>x<N>` names N GPUs (a100, h100, h200, b200: h100x16). The
chip names are the keys of `chips.CHIPS`. Without --chips: no memory plan, no wall time, and the
batch is rounded to a multiple of 1.

Bad input (a non-positive or non-finite --flops or --mfu, an unknown --model, a --chips that is no
slice, a missing or malformed --laws or --surface file, a surface whose fit is not usable without
--allow_unusable) stops with one line `planner error: ...` naming the flag or file, exit 2, before
any model config is built. Nothing touches a device: configs, counts and FLOPs are arithmetic.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import re
import sys

import numpy as np

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.models import flops as flops_lib
from cbert_jax.models import sizes as sizes_lib
from cbert_jax.run.progress import format_duration
from cbert_jax.scaling import budget as budget_lib
from cbert_jax.scaling import chinchilla
from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import compiled as compiled_lib
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.scaling import memory as memory_lib
from cbert_jax.scaling import plan as plan_lib
from cbert_jax.sweep import experiment as experiment_lib

PROG = "python -m cbert_jax.sweep.planner"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENT = os.path.join(ROOT, "experiments", "sweep.py")  # the paper ladder's member configs
MODELS = ("bert", "crossbert")  # the sweep's families (crossbert = CrossBERT+CMS)
FAMILY = {"bert": "BERT", "crossbert": "CrossBERT+CMS"}


class PlanError(ValueError):
  """Bad planner input; the message names the flag or file (printed as one line, exit 2)."""


def parse_chips(text: str) -> chips_lib.Chips:
  """`chips_lib.parse` with its error as a PlanError (one line naming --chips)."""
  try:
    return chips_lib.parse(text)
  except ValueError as e:
    raise PlanError(f"--chips={text!r}: {e}") from e


# ---------------------------------------------------------------------------------- ladder ---
@dataclasses.dataclass(frozen=True)
class Rung:
  """One ladder rung as the sweep would train it."""

  size: str  # ladder name, d<width>L<depth>
  model_name: str
  model: object  # ModelConfig
  mask: object  # MaskConfig
  seq_len: int
  n_params: int  # N under the n_definition
  flops_per_token: float  # training FLOPs per data token

  @property
  def k(self) -> float:
    """FLOPs per parameter per token at this rung: flops_per_token / N."""
    return self.flops_per_token / self.n_params


def ladder_sizes(model: str, which: str, experiment) -> tuple[str, ...]:
  """The rungs offered: the family's paper rungs, or every rung of sizes.LADDER."""
  if which == "paper":
    return tuple(experiment.SCALES["paper"][model])
  return tuple(sizes_lib.LADDER)


def build_ladder(
  model: str, which: str, seq_len: int, vocab: int, n_definition: str
) -> tuple[list[Rung], int, int]:
  """(rungs sorted by N, seq_len, vocab) from the paper member configs (see the module docstring);
  seq_len / vocab 0 = the paper member's."""
  experiment = experiment_lib.load_experiment(EXPERIMENT, field="planner experiment", needs=())
  paper = experiment.SCALES["paper"][model]
  rungs = []
  for size in ladder_sizes(model, which, experiment):
    # A paper member's config; another rung gets the first paper member's with its size replaced.
    cfg = experiment.get_config(
      experiment.member_arg("paper", model, size if size in paper else paper[0])
    )
    with cfg.unlocked():
      cfg.model.size = size
      cfg.sweep.tokens_per_param = 0.0  # no sweep plan: the planner derives its own
      cfg.sweep.chip = ""
      if seq_len:
        cfg.data.seq_len = seq_len
      if vocab:
        cfg.data.vocab_size = vocab
        cfg.model.vocab_size = vocab
    cfg = config_lib.resolve(cfg)
    model_cfg, mask_cfg = plan_lib.model_config(cfg)
    counts = flops_lib.param_counts(model, model_cfg)
    rungs.append(
      Rung(
        size=size,
        model_name=model,
        model=model_cfg,
        mask=mask_cfg,
        seq_len=int(cfg.data.seq_len),
        n_params=budget_lib.n_params(counts, n_definition),
        flops_per_token=flops_lib.flops_per_token(model, model_cfg, mask_cfg, cfg.data.seq_len),
      )
    )
  rungs.sort(key=lambda r: r.n_params)
  return rungs, rungs[0].seq_len, int(rungs[0].model.vocab_size)


def k_of_n(rungs: list[Rung], n: float) -> float:
  """k(N): the rungs' FLOPs per parameter-token, log-linear in log N between rungs, clamped."""
  log_n = np.log([r.n_params for r in rungs])
  log_k = np.log([r.k for r in rungs])
  return float(np.exp(np.interp(math.log(n), log_n, log_k)))


def rule_allocation(
  compute: float, tokens_per_param: float, rungs: list[Rung]
) -> tuple[float, float, float]:
  """(N_opt, D_opt, k) with D = tokens_per_param x N and C = k(N) N D: bisection in log N of
  log(k(N) tokens_per_param N^2) = log C (increasing in N: k falls more slowly than 1/N^2)."""
  f = lambda log_n: (
    math.log(k_of_n(rungs, math.exp(log_n)) * tokens_per_param) + 2 * log_n - math.log(compute)
  )
  lo, hi = 0.0, 100.0  # N from 1 to e^100: far beyond any budget
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
  n = math.exp((lo + hi) / 2)
  return n, tokens_per_param * n, k_of_n(rungs, n)


def nearest(rungs: list[Rung], n: float) -> int:
  """The index of the rung nearest `n` in log N (rungs sorted by N)."""
  return int(np.argmin([abs(math.log(r.n_params / n)) for r in rungs]))


def _rung_ref(r: Rung | None) -> dict | None:
  return None if r is None else {"size": r.size, "n_params": r.n_params}


# ------------------------------------------------------------------------------------ plan ---
def check_args(
  ns: argparse.Namespace,
) -> tuple[chips_lib.Chips | None, laws_lib.HyperLaws, chinchilla.SavedSurface | None]:
  """Every input check that needs no model config; PlanError naming the flag or file."""
  for flag, value in (("--flops", ns.flops), ("--tokens_per_param", ns.tokens_per_param)):
    if not (math.isfinite(value) and value > 0):
      raise PlanError(f"{flag} must be a positive finite number, got {value}")
  if not (math.isfinite(ns.mfu) and 0 < ns.mfu <= 1):
    raise PlanError(f"--mfu must be in (0, 1] (a fraction of the chip's peak), got {ns.mfu}")
  for flag, value in (("--seq_len", ns.seq_len), ("--vocab", ns.vocab)):
    if value < 0:
      raise PlanError(f"{flag} must be positive (0 = the paper sweep's), got {value}")
  chips = parse_chips(ns.chips) if ns.chips else None
  if ns.laws and not ns.laws.startswith(laws_lib.SHIPPED_PREFIX) and not os.path.isfile(ns.laws):
    raise PlanError(
      f"--laws={ns.laws}: no such file (a laws.json of `python -m cbert_jax.report.grid fit`, "
      "or shipped:<name>; leave it out for the published defaults)"
    )
  try:
    laws = laws_lib.load(ns.laws)
  except ConfigError as e:
    why = re.sub(r"^sweep[.]laws(=\S*?)?: ", "", str(e))  # the flag is --laws here
    raise PlanError(f"--laws={ns.laws}: {why}") from None
  if ns.law_axis == "params" and (laws.lr_n is None or laws.batch_tokens_n is None):
    raise PlanError(f"--law_axis=params: the laws ({laws.source}) have no fit against N")
  surface = None
  if ns.surface:
    try:
      surface = chinchilla.load(ns.surface, allow_unusable=ns.allow_unusable)
    except ValueError as e:
      hint = " (pass --allow_unusable to plan with it anyway)" if "not usable" in str(e) else ""
      raise PlanError(f"--surface={e}{hint}") from None
    defined = surface.provenance.get("n_definition")
    if defined and defined != ns.n_definition:
      raise PlanError(
        f"--surface={ns.surface}: its N is {defined!r}, not --n_definition={ns.n_definition}"
      )
  return chips, laws, surface


def range_note(subject: str, name: str, label: str, x: float, span, consequence: str) -> str | None:
  """'<subject> fitted on <name> lo-hi; <label> = x is <f>x above the largest (<d> decades):
  <consequence>' when x lies outside span = (lo, hi) (`chinchilla.range_factor`); None inside."""
  lo, hi = float(min(span)), float(max(span))
  factor = chinchilla.range_factor(x, lo, hi)
  if factor <= 1.0:
    return None
  side = "above the largest" if x > hi else "below the smallest"
  return (
    f"{subject} fitted on {name} {lo:.3g}-{hi:.3g}; {label} = {x:.3g} is {factor:.3g}x {side} "
    f"({math.log10(factor):.1f} decades): {consequence}"
  )


def surface_range_notes(surface: chinchilla.SavedSurface, n_opt: float, d_opt: float) -> list[str]:
  """Notes on how far N_opt and D_opt / N_opt lie outside the N and D/N the surface was fitted on
  (its provenance's `n_range`, `d_per_n`; nothing when the file does not record them)."""
  notes = (
    range_note("the surface was", name, f"{name}_opt", x, span, "an extrapolation")
    for name, x, span in (
      ("N", n_opt, surface.provenance.get("n_range")),
      ("D/N", d_opt / n_opt, surface.provenance.get("d_per_n")),
    )
    if span
  )
  return [n for n in notes if n]


def make_plan(
  ns: argparse.Namespace,
  chips: chips_lib.Chips | None,
  laws: laws_lib.HyperLaws,
  surface: chinchilla.SavedSurface | None,
) -> dict:
  """The plan as a JSON-able dict (what --json prints; the table is formatted from it)."""
  compute = float(ns.flops)
  rungs, seq_len, vocab = build_ladder(ns.model, ns.ladder, ns.seq_len, ns.vocab, ns.n_definition)
  notes = []
  # 1. N_opt, D_opt, then the nearest rung and the tokens that spend C there.
  if surface is not None:
    n_opt, d_opt = surface.fit.law.optimal(compute, surface.k)
    k, k_source = surface.k, f"stored with the surface {surface.path}"
    allocation = {
      "source": f"surface {surface.path}: LossSurface.optimal(C, k)",
      "tokens_per_param": None,
    }
  else:
    n_opt, d_opt, k = rule_allocation(compute, ns.tokens_per_param, rungs)
    k_source = "the ladder's FLOPs per data token / N, log-interpolated at N_opt"
    allocation = {
      "source": f"rule D = {ns.tokens_per_param:g} x N, C = k N D",
      "tokens_per_param": float(ns.tokens_per_param),
    }
  allocation |= {"n_opt": n_opt, "d_opt": d_opt, "k": k, "k_source": k_source}
  if surface is not None:
    notes.extend(surface_range_notes(surface, n_opt, d_opt))
  i = nearest(rungs, n_opt)
  rung = rungs[i]
  cut = bisect.bisect_left([r.n_params for r in rungs], n_opt)
  below = rungs[cut - 1] if cut > 0 else None
  above = rungs[cut] if cut < len(rungs) else None
  if above is None or below is None:
    end, side = ("largest", "above") if above is None else ("smallest", "below")
    notes.append(
      f"N_opt = {n_opt:.4g} is {n_opt / rung.n_params:.3g}x the N of the {end} rung of the "
      f"{ns.ladder} ladder ({rung.size}): no rung {side} it, so {rung.size} is planned"
      + (" (--ladder all offers the CPU rungs)" if ns.ladder == "paper" and below is None else "")
    )
  tokens = compute / rung.flops_per_token
  # 2. LR and batch from the laws.
  devices = chips.devices if chips else 1
  x = compute if ns.law_axis == "compute" else float(rung.n_params)
  lr, rows = laws_lib.suggest(laws, x, seq_len, multiple=devices, law_axis=ns.law_axis)
  # 3. Steps.
  steps = max(1, math.ceil(tokens / (rows * seq_len)))
  trained = steps * rows * seq_len
  plan = {
    "command": ns.command,
    "compute": compute,
    "model": ns.model,
    "family": FAMILY[ns.model],
    "seq_len": seq_len,
    "vocab": vocab,
    "n_definition": ns.n_definition,
    "allocation": allocation,
    "rung": {
      "ladder": ns.ladder,
      "size": rung.size,
      "d_model": rung.model.d_model,
      "layers": rung.model.num_layers,
      "heads": rung.model.num_heads,
      "predictor_layers": rung.model.predictor_layers if ns.model == "crossbert" else 0,
      "n_params": rung.n_params,
      "flops_per_token": rung.flops_per_token,
      "k": rung.k,
      "tokens": tokens,
      "tokens_per_param": tokens / rung.n_params,
      "below": _rung_ref(below),
      "above": _rung_ref(above),
    },
    "laws": {
      "source": laws.source,
      "file": ns.laws,
      "law_axis": ns.law_axis,
      "x": x,
      "lr": lr,
      "rows": rows,
      "batch_tokens": rows * seq_len,
      "multiple": devices,
      "fitted_range": None,  # the x the laws were fitted on (None: no runs in their provenance)
      "extrapolation": None,  # how far x lies outside it (1 = inside)
    },
    "steps": steps,
    "tokens_trained": trained,
    "compute_trained": rung.flops_per_token * trained,
    "loss": None,
    "chips": None,
    "memory": None,
    "wall_time": None,
    "notes": notes,
  }
  span = laws_lib.fitted_range(laws, ns.law_axis)
  if span is not None:
    name = "C" if ns.law_axis == "compute" else "N"
    plan["laws"]["fitted_range"] = list(span)
    plan["laws"]["extrapolation"] = chinchilla.range_factor(x, span[0], span[1])
    note = range_note("the laws were", name, name, x, span, "the LR and batch are an extrapolation")
    if note:
      notes.append(note)
  mismatch = laws.budget_mismatch(trained / rung.n_params, subject="this plan")
  if mismatch:
    notes.append(mismatch)
  if laws.overridden:
    notes.append(
      f"the laws were fitted with checks overridden: {', '.join(laws.overridden)} "
      f"(reason: {laws.override_reason})"
    )
  # 4. Predicted loss.
  if surface is not None:
    fit = surface.fit
    loss = {
      "surface": surface.path,
      "law": dataclasses.asdict(fit.law),
      "point": float(fit.law(rung.n_params, trained)),
      "at_optimum": float(fit.law(n_opt, d_opt)),
      "level": fit.level,
      "draws": 0 if fit.draws is None else len(fit.draws),
      "interval": None,
      "at_optimum_interval": None,
      "problems": list(fit.problems),
    }
    if fit.draws is not None and len(fit.draws) and 0 < fit.level < 1:
      loss["interval"] = [float(v) for v in fit.loss_interval(rung.n_params, trained)]
      loss["at_optimum_interval"] = [float(v) for v in fit.loss_interval(n_opt, d_opt)]
    else:
      notes.append(f"the surface {surface.path} has no bootstrap draws: no loss interval")
    if fit.problems:
      notes.append(f"the surface is NOT usable ({'; '.join(fit.problems)}); --allow_unusable")
    plan["loss"] = loss
  # 5. Memory; 6. wall time.
  if chips is not None:
    chip = memory_lib.chip(chips.chip)
    plan["chips"] = {
      "name": chips.name,
      "chip": chips.chip,
      "chip_name": chip.name,
      "devices": chips.devices,
      "peak_flops_per_device": chip.bf16,
    }
    mesh = {"data": 1, "fsdp": chips.devices, "tensor": 1}
    shape = memory_lib.shape_of(rung.model_name, rung.model, rung.mask, seq_len, rows, mesh)
    mem = memory_lib.plan(shape, chips.chip)
    plan["memory"] = {"mesh": mesh, **mem.to_dict()}
    if mem.setting is None:
      notes.append(f"no memory setting fits {rung.size} on {chips.name}: {mem.verdict}")
    seconds = compute / (chips.devices * chip.bf16 * ns.mfu)
    plan["wall_time"] = {
      "seconds": seconds,
      "mfu": ns.mfu,
      "hours": seconds / 3600,
      "days": seconds / 86400,
    }
    if chip.accelerator:
      plan["compiled"] = compiled_plan(ns, rung, rows, seq_len, vocab, chips, mem, steps)
  return plan


def compiled_plan(ns, rung: Rung, rows: int, seq_len: int, vocab: int, chips, mem, steps) -> dict:
  """The rung's latest TPU compile on the plan's chip (`scaling/compiled.py`, --aot DIR), compared
  with this plan on what the planner knows (batch, sequence, vocabulary, devices, memory setting):
  its compiled HBM per chip and the compiler's step-time estimate, and the plan's chip-hours from
  the stated MFU and from that estimate."""
  key = {
    "model_name": rung.model_name,
    "size": rung.size,
    "batch_size": rows,
    "seq_len": seq_len,
    "vocab_size": vocab,
    "devices": chips.devices,
    "chip": chips.chip,
  }
  if mem.setting is not None:
    key |= {"remat": mem.setting.remat, "ce_chunk": mem.setting.ce_chunk}
    key["microbatches"] = mem.setting.microbatches
  found = compiled_lib.lookup(f"{rung.model_name}_{rung.size}", key, ns.aot)
  analytic, estimated = compiled_lib.chip_hours(
    rung.flops_per_token * steps * rows * seq_len, steps, chips.devices, chips.chip, ns.mfu, found
  )
  return {
    "archive": ns.aot,
    "line": found.describe(),
    "stale": found.stale,
    "row": found.row,
    "chip_hours": analytic,
    "chip_hours_compiler": estimated,
  }


# ---------------------------------------------------------------------------------- output ---
def _g(x: float) -> str:
  return f"{x:.4g}"


def _gib(b: float) -> str:
  return f"{b / memory_lib.GiB:.2f} GiB"


def table(plan: dict) -> str:
  """The plan as a Markdown table: quantity | value | source."""
  a, r, lw = plan["allocation"], plan["rung"], plan["laws"]
  seq = plan["seq_len"]
  nd = plan["n_definition"]
  rows = [
    ("budget C", f"{_g(plan['compute'])} FLOPs", "--flops"),
    (
      "model",
      f"{plan['model']} ({plan['family']}), seq_len {seq}, vocab {plan['vocab']}",
      "experiments/sweep.py paper member configs",
    ),
    (f"N_opt ({nd})", _g(a["n_opt"]), a["source"]),
    ("D_opt (tokens)", _g(a["d_opt"]), f"C / (k N_opt), k = {_g(a['k'])}: {a['k_source']}"),
  ]
  ref = lambda x: f"{x['size']} (N {x['n_params']})"
  if r["below"] and r["above"]:
    where = f"between {ref(r['below'])} and {ref(r['above'])}"
  else:
    where = f"above {ref(r['below'])}" if r["below"] else f"below {ref(r['above'])}"
  rows += [
    (
      "rung",
      f"{r['size']} (d_model {r['d_model']}, {r['layers']} layers, {r['heads']} heads"
      + (f", predictor {r['predictor_layers']} layers" if r["predictor_layers"] else "")
      + ")",
      f"nearest to N_opt in log N on the {r['ladder']} ladder (N_opt lies {where})",
    ),
    (f"N ({nd}) of the rung", str(r["n_params"]), "flops.param_counts, budget.n_params"),
    (
      "FLOPs per token",
      _g(r["flops_per_token"]),
      f"flops.flops_per_token (training, per data token); k = {_g(r['k'])}",
    ),
    (
      "D (tokens) at the rung",
      _g(r["tokens"]),
      f"C / FLOPs per token ({_g(r['tokens_per_param'])} tokens per parameter)",
    ),
    ("laws", lw["source"], f"--laws {lw['file']}" if lw["file"] else "laws.DEFAULT (no --laws)"),
    ("LR", _g(lw["lr"]), f"lr({lw['law_axis']}) = a x^alpha at x = {_g(lw['x'])}"),
    (
      "batch",
      f"{lw['rows']} rows ({lw['batch_tokens']} tokens)",
      f"B(x) / seq_len, rounded to a multiple of {lw['multiple']} device(s)",
    ),
    ("steps", str(plan["steps"]), "ceil(D / (rows x seq_len))"),
    (
      "tokens trained",
      f"{plan['tokens_trained']} ({_g(plan['compute_trained'])} FLOPs)",
      "steps x rows x seq_len (x FLOPs per token)",
    ),
  ]
  loss = plan["loss"]
  if loss is None:
    rows.append(("predicted loss", "no loss surface given", "--surface FILE"))
  else:
    iv = loss["interval"]
    level = f"{loss['level']:.0%}"
    rows.append(
      (
        "predicted loss",
        _g(loss["point"]) + (f" [{_g(iv[0])}, {_g(iv[1])}]" if iv else " (no interval)"),
        f"L(N, tokens trained) of {loss['surface']}"
        + (f"; {level} percentiles over {loss['draws']} bootstrap draws" if iv else ""),
      )
    )
    oi = loss["at_optimum_interval"]
    rows.append(
      (
        "loss at N_opt, D_opt",
        _g(loss["at_optimum"]) + (f" [{_g(oi[0])}, {_g(oi[1])}]" if oi else ""),
        "the same surface at the unrounded optimum",
      )
    )
  chips = plan["chips"]
  if chips is None:
    rows.append(("memory, wall time", "no --chips given", "--chips v5p-64 | h100x16 ..."))
  else:
    mem, wall = plan["memory"], plan["wall_time"]
    rows.append(
      (
        "chips",
        f"{chips['name']} = {chips['devices']} {chips['chip_name']} devices",
        f"peak {_g(chips['peak_flops_per_device'])} FLOP/s bf16 per device (scaling/chips.py)",
      )
    )
    setting = mem["setting"]
    what = ", ".join(f"{k}={v}" for k, v in setting.items()) if setting else mem["verdict"]
    rows.append(
      (
        "memory",
        f"{what}: {_gib(mem['predicted_bytes']['total'])} of {_gib(mem['budget_bytes'])} "
        "usable per device",
        f"memory.plan, FSDP over {chips['devices']} devices ({mem['verdict']})",
      )
    )
    rows.append(
      (
        "wall time",
        f"{format_duration(wall['seconds'])} ({_g(wall['hours'])} h) at a stated MFU of "
        f"{wall['mfu']:.0%}",
        f"C / ({chips['devices']} devices x peak x MFU); the MFU is an assumption, not a "
        "measurement",
      )
    )
  done = plan.get("compiled")
  if done:
    rows.append(("TPU compile", done["line"], f"scaling/compiled.py rows in {done['archive']}"))
    est = done["chip_hours_compiler"]
    rows.append(
      (
        "chip-hours",
        f"{_g(done['chip_hours'])} at the stated MFU; "
        + (
          f"{_g(est)} from the compiler's estimate"
          if est is not None
          else "no compiler's estimate (no compile of this plan's config)"
        ),
        "C / (peak x MFU) x chips; optimal_seconds x steps x chips (the compiler's estimate, "
        "not a measurement)",
      )
    )
  out = ["| quantity | value | source |", "|---|---|---|"]
  out += [f"| {q} | {v} | {s} |" for q, v, s in rows]
  out += [f"note: {n}" for n in plan["notes"]]
  return "\n".join(out)


# ------------------------------------------------------------------------------------- CLI ---
class _Parser(argparse.ArgumentParser):
  """argparse's usage errors as one line `planner error: ...`, exit 2."""

  def error(self, message):
    print(f"planner error: {message}", file=sys.stderr)
    sys.exit(2)


def parser() -> argparse.ArgumentParser:
  p = _Parser(prog=PROG, description=__doc__.splitlines()[0])
  p.add_argument("--flops", type=float, required=True, help="the training budget C, in FLOPs")
  p.add_argument(
    "--model", required=True, choices=MODELS, help="the family (crossbert = CrossBERT+CMS)"
  )
  p.add_argument(
    "--chips",
    default="",
    help=f"the slice to train on: {chips_lib.CHIPS_FORMS}; empty (default) = no memory plan, no wall time",
  )
  p.add_argument(
    "--laws",
    default="",
    help="a laws.json of `python -m cbert_jax.report.grid fit` (or shipped:<name>); "
    "default: laws.DEFAULT (DeepSeek LLM's published laws)",
  )
  p.add_argument(
    "--law_axis",
    default="compute",
    choices=("compute", "params"),
    help="the laws' x: the budget C (compute, default) or the rung's N (params)",
  )
  p.add_argument(
    "--surface",
    default="",
    help="a fitted loss surface (chinchilla.save): N_opt, D_opt and the predicted loss",
  )
  p.add_argument(
    "--allow_unusable",
    action="store_true",
    help="plan with a surface whose fit records problems (otherwise refused)",
  )
  p.add_argument(
    "--mfu",
    type=float,
    default=0.4,
    help="the MFU the wall time assumes (a stated assumption, default 0.4)",
  )
  p.add_argument(
    "--seq_len", type=int, default=0, help="tokens per row (0 = the paper sweep's, 512)"
  )
  p.add_argument("--vocab", type=int, default=0, help="vocabulary (0 = the paper sweep's, 32768)")
  p.add_argument(
    "--tokens_per_param",
    type=float,
    default=20.0,
    help="without --surface: D = this x N (the sweep's rule, default 20)",
  )
  p.add_argument(
    "--ladder",
    default="paper",
    choices=("paper", "all"),
    help="the rungs offered: the family's paper rungs (default) or every rung of models/sizes.py",
  )
  p.add_argument(
    "--n_definition",
    default="non_embedding",
    choices=tuple(budget_lib.N_DEFINITIONS),
    help="which parameters N counts (as sweep.n_definition; default non_embedding)",
  )
  p.add_argument(
    "--aot",
    default=compiled_lib.ARCHIVE,
    help="the TPU compiles to show beside a TPU plan (launch.compile_check --archive; "
    "<DIR>/<chip>/<member>.json); default results/tpu_aot",
  )
  p.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")
  return p


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  ns = parser().parse_args(argv)
  ns.command = " ".join([PROG, *argv])
  try:
    chips, laws, surface = check_args(ns)
    plan = make_plan(ns, chips, laws, surface)
  except (PlanError, ConfigError) as e:
    print(f"planner error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(plan, indent=2) if ns.json else table(plan))
  return 0


if __name__ == "__main__":
  sys.exit(main())
