"""Memory per device of a training step, and the chips it has to fit on.

`estimate(...)` is an analytic model of the bytes one device holds at the step's peak, for a
member's model, batch, mesh and memory setting (`Setting`: remat policy, `ce_chunk`,
micro-batches). It counts, per device (`n` = the devices parameters are sharded over, FSDP x
tensor; `b` = rows per device per micro-batch; `c` = bytes of the compute dtype):

  state        parameters (fp32) + AdamW mu, nu + gradients = 16 P / n, + 4 P / n for the
               gradient accumulator when micro-batches > 1;
  gathered     FSDP's all-gathered weights in the compute dtype: two blocks in flight, plus the
               replicated embedding table (`layers.Embedding` gathers it whole) and the head;
  saved        activations kept for the backward pass, per layer and policy (below), for every
               encoder block and predictor block;
  working      one block's backward working set (its recomputed activations, the attention
               probabilities' gradient, fp32 cotangents);
  head         logits, softmax and their gradient in fp32 over the targets (or over one
               `ce_chunk` slice of them), plus the fp32 gradients of the embedding table and head
               before they are reduce-scattered.

Saved activations per block (t = tokens in the block's rows, R x S^2 = attention scores):
  none   h, rope(q), rope(k), v, attn out, x1, norm(x1) (7 t d c) + the block input (t d c) + the
         SwiGLU gate, up and product (3 t F c) + softmax output fp32 and its compute-dtype copy
         (R H S^2 (4 + c), c < 4) — what JAX's autodiff keeps;
  dots   the outputs of the weight matmuls (q, k, v, o: 4 t d c; w1, w3: 2 t F c; w2: t d c) and
         the block input (t d c) (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`:
         attention's batched matmuls are recomputed);
  full   the block input only (t d c).
Everything a policy does not save is recomputed in the backward pass, one block at a time.

The model is validated against XLA's compiled memory (`memory_analysis`) of the real train step
on fake CPU meshes (`tests/scaling/test_memory_plan.py`, and `launch.compile_check` prints both figures
side by side), where XLA honours the policy: XLA:CPU's pipeline removes JAX's rematerialisation
barriers before its common-subexpression pass (`cse_barrier_expander`), which merges the
recomputed forward back into the original and makes every remat policy a no-op on CPU; the compile
check therefore compiles with that pass disabled (`REMAT_XLA_FLAGS`), as TPU and GPU compilers keep
the barriers.

`plan(...)` picks the least costly setting that fits a chip's usable HBM: the cheapest estimated
step time (`step_cost`) over remat none/dots/full x ce_chunk off/on x micro-batches 1, 2, 4, ...
The step cost is the FLOPs at half the chip's peak plus FSDP's collectives (weights gathered
forward and backward, gradients reduce-scattered, once per micro-batch) at the interconnect they
cross: NVLink / ICI within a node (8 GPUs) or TPU slice, the inter-node link (InfiniBand per GPU,
DCN) when the shards span nodes (`collective_bandwidth`): FSDP over 8 H100 nodes moves its bytes
at 50 GB/s per GPU, not NVLink's 450. The chips' HBM, usable fraction, peak FLOP/s and both
interconnects are their records in the one chip table, cbert_jax/scaling/chips.py (which MFU's
peak also reads).
"""

from __future__ import annotations

import dataclasses
import math

from cbert_jax.models import flops as flops_lib
from cbert_jax.models.model_config import MaskConfig, ModelConfig, num_masked
from cbert_jax.scaling import chips as chips_lib

GiB = chips_lib.GiB
# XLA:CPU removes JAX's remat barriers before CSE unless this pass is disabled (see the docstring).
REMAT_XLA_FLAGS = "--xla_disable_hlo_passes=cse_barrier_expander"
REMAT_POLICIES = ("none", "dots", "full")
CE_CHUNK = 64  # the ce_chunk the planner tries (target positions per row and slice)
MAX_MICROBATCHES = 64  # the planner gives up (needs more chips) beyond this
# A setting fits when its estimate x margin(setting) is within the chip's usable memory. The margin
# is per remat policy: the largest compiled / predicted ratio measured for that policy over the
# calibration set (results/memory_calibration: every paper member up to d1024L16, BERT and
# CrossBERT+CMS, compiled by launch.compile_check on a fake CPU mesh of its target devices),
# rounded up to the next 0.05 and never below MARGIN_FLOOR. tests/scaling/test_memory_plan.py
# recomputes them from the committed measurements.
MARGIN_FLOOR = 1.10
MARGINS = {"none": 1.25, "dots": 1.10, "full": 1.10}
# The same rule over the TPU compiler's figures (libtpu ahead of time: every row of
# results/tpu_aot, `compiled.archived_rows`): the margins of a TPU chip; and over XLA:GPU's
# (deviceless compiles for an H100, results/gpu_aot): the margins of every GPU chip. A policy
# without a compile on that platform yet keeps XLA:CPU's margin; a CPU run keeps XLA:CPU's. Both
# compilers need far less than XLA:CPU without remat (0.64-0.73x the plan), and the TPU compiler
# more than the plan with remat dots (up to 1.34x: the plan's saved activations read low there);
# docs/scaling.md. tests/scaling/test_memory_plan.py recomputes these from the committed rows.
TPU_MARGINS = {"none": 1.10, "dots": 1.35, "full": 1.10}
GPU_MARGINS = {"none": 1.10, "dots": 1.10, "full": 1.10}


def margin(setting: Setting, platform: str = "") -> float:
  """The factor the estimate of `setting` is multiplied by before it is compared with a budget on
  `platform` ("tpu": the TPU compiler's calibration, "gpu": XLA:GPU's, anything else: XLA:CPU's)."""
  return {"tpu": TPU_MARGINS, "gpu": GPU_MARGINS}.get(platform, MARGINS)[setting.remat]


def platform_of(chip_name: str) -> str:
  """ "tpu" for a TPU chip of the table, "gpu" for the others: the margins they are planned with."""
  return "tpu" if CHIPS[chip_name].accelerator else "gpu"


# The chips the plan is made for, one record each in cbert_jax/scaling/chips.py (HBM, the fraction
# the plan may fill, peak FLOP/s, interconnect, and their sources): `CHIPS` is that table's dict
# itself, not a copy (scaling/plan.py and tests read and patch it under this name).
Chip = chips_lib.Chip
CHIPS = chips_lib.CHIPS


def chip(name: str) -> Chip:
  """The chip named `name` (a key of CHIPS); ValueError listing them if unknown."""
  if name not in CHIPS:
    raise ValueError(f"unknown chip {name!r}; known: {', '.join(CHIPS)}")
  return CHIPS[name]


@dataclasses.dataclass(frozen=True)
class Setting:
  """How a step trades compute for memory."""

  remat: str = "none"  # model.remat: none | dots | full
  ce_chunk: int = 0  # model.ce_chunk: target positions per vocabulary slice (0 = off)
  microbatches: int = 1  # optim.microbatches: micro-batches per step

  def describe(self) -> str:
    return f"remat={self.remat}, ce_chunk={self.ce_chunk}, microbatches={self.microbatches}"


@dataclasses.dataclass(frozen=True)
class Shape:
  """What the memory of a member's step depends on (per device quantities are derived)."""

  model_name: str
  model: ModelConfig
  mask: MaskConfig
  seq_len: int
  batch_size: int  # global rows per step
  data_parallel: int  # devices the batch is split over (data x fsdp)
  shard: int  # devices the parameters are split over (fsdp x tensor)
  num_params: int  # every trained parameter (embeddings and head included)
  compute_bytes: int  # 2 (bfloat16) or 4 (float32)
  shard_slices: int = 1  # of `shard`, the factor across slices / nodes (mesh_dcn fsdp x tensor)


def shape_of(
  model_name: str,
  model_cfg: ModelConfig,
  mask_cfg: MaskConfig,
  seq_len: int,
  batch_size: int,
  mesh: dict,
  dcn: dict | None = None,
) -> Shape:
  """A Shape from the model configs and the resolved mesh sizes {data, fsdp, tensor} (each ICI x
  DCN); `dcn`: their factors across slices / nodes (config.mesh_dcn), if any."""
  counts = flops_lib.param_counts(model_name, model_cfg)
  return Shape(
    model_name,
    model_cfg,
    mask_cfg,
    seq_len,
    batch_size,
    data_parallel=mesh["data"] * mesh["fsdp"],
    shard=mesh["fsdp"] * mesh["tensor"],
    num_params=counts.total,
    compute_bytes=model_cfg.dtype.itemsize,
    shard_slices=dcn["fsdp"] * dcn["tensor"] if dcn else 1,
  )


@dataclasses.dataclass(frozen=True)
class _Stack:
  """One stack of blocks as the step runs it on one device (per micro-batch)."""

  layers: int
  tokens: int  # query tokens per device (t)
  attn: int  # attention scores per head per device (R x Sq x Sk)
  d: int
  ffn: int
  heads: int


def _stacks(s: Shape, rows: int) -> tuple[list[_Stack], int]:
  """The block stacks of the family on `rows` rows per device, and the targets per device."""
  m, t = s.model, s.seq_len
  enc = lambda tokens, attn: _Stack(m.num_layers, tokens, attn, m.d_model, m.ffn_size, m.num_heads)
  if s.model_name == "crossbert":
    pred = lambda q, attn: _Stack(
      m.predictor_layers, q, attn, m.pred_d, m.pred_ffn_size, m.pred_heads
    )
    if s.mask.cms and s.mask.cms_form == "gather":  # 2 rows of T/2 per sequence, each way
      h = t // 2
      return [enc(rows * t, 2 * rows * h * h), pred(rows * t, 2 * rows * h * h)], rows * t
    if s.mask.cms:  # in place: T x T, masked
      return [enc(rows * t, rows * t * t), pred(rows * t, rows * t * t)], rows * t
    k = num_masked(t, s.mask.mask_ratio)
    return [enc(rows * (t - k), rows * (t - k) ** 2), pred(rows * k, rows * k * (t - k))], rows * k
  if s.model_name == "electra":
    from cbert_jax.models.model_config import generator_config  # pylint: disable=import-outside-toplevel

    g = generator_config(m)
    gen = _Stack(g.num_layers, rows * t, rows * t * t, g.d_model, g.ffn_size, g.num_heads)
    return [enc(rows * t, rows * t * t), gen], rows * num_masked(t, s.mask.mask_ratio)
  return [enc(rows * t, rows * t * t)], rows * num_masked(t, s.mask.mask_ratio)


def _saved_per_layer(st: _Stack, remat: str, c: int) -> float:
  """Bytes a block keeps for the backward pass under the policy."""
  td, tf = st.tokens * st.d * c, st.tokens * st.ffn * c
  if remat == "full":
    return td
  if remat == "dots":
    return 5 * td + 2 * tf
  # Scores: fp32 logits, softmax output and its compute-dtype copy (three fp32 copies in float32).
  scores = st.attn * st.heads * (8 + c if c < 4 else 12)
  return 10 * td + 5 * tf + scores


def _working_set(st: _Stack, remat: str, c: int) -> float:
  """One block's backward working set beyond what it saved: what the policy recomputes."""
  if remat == "none":
    return 0.0
  return _saved_per_layer(st, "none", c) - (
    _saved_per_layer(st, "dots", c) if remat == "dots" else 0
  )


def estimate(s: Shape, setting: Setting) -> dict[str, float]:
  """Bytes per device at the step's peak, by component, and their "total"."""
  k, c = setting.microbatches, s.compute_bytes
  rows = s.batch_size / (s.data_parallel * k)  # rows per device per micro-batch
  m = s.model
  stacks, targets = _stacks(s, rows)
  p_shard = s.num_params / s.shard
  state = 16 * p_shard + (4 * p_shard if k > 1 else 0)
  block_params = sum(st.layers * (4 * st.d * st.d + 3 * st.d * st.ffn) for st in stacks)
  vocab = m.vocab_size * m.d_model
  # Compute-dtype copies of the weights (all-gathered under FSDP): without remat the backward's
  # matmuls keep every block's copy; with remat two blocks' are in flight. fp32 needs no copy on
  # one device. The embedding table is replicated for the gather.
  copies = c < 4 or s.shard > 1
  per_block = max(4 * st.d * st.d + 3 * st.d * st.ffn for st in stacks)
  gathered = (
    ((block_params if setting.remat == "none" else 2 * per_block) + vocab) * c if copies else 0
  )
  saved = sum(st.layers * _saved_per_layer(st, setting.remat, c) for st in stacks)
  working = max(_working_set(st, setting.remat, c) for st in stacks)
  # The head runs on [head rows, K, V]: CMS (gather) has two view rows per sequence; ce_chunk
  # keeps one [head rows, ce_chunk, V] slice of the K targets per row at a time.
  head_rows = rows * (
    2 if s.model_name == "crossbert" and s.mask.cms and s.mask.cms_form == "gather" else 1
  )
  per_row = targets / head_rows
  ce_rows = head_rows * (min(per_row, setting.ce_chunk) if setting.ce_chunk else per_row)
  head = 2 * ce_rows * m.vocab_size * 4 + 2 * vocab * 4  # fp32 logits + gradient; embedding/head dW
  parts = {"state": state, "gathered": gathered, "saved": saved, "working": working, "head": head}
  parts["total"] = sum(parts.values())
  return parts


def crosses_nodes(s: Shape, chip_: Chip) -> bool:
  """Whether the devices the parameters are sharded over (FSDP x tensor) span more than one node:
  more than the chip's `node_devices` (8 GPUs on NVSwitch), or more than one slice / node by the
  mesh (`Shape.shard_slices`, mesh_dcn). A TPU slice is one ICI domain (node_devices 0)."""
  return s.shard_slices > 1 or (chip_.node_devices > 0 and s.shard > chip_.node_devices)


def collective_bandwidth(s: Shape, chip_: Chip) -> float:
  """Bytes/s per device, one direction, of the FSDP collectives: the chip's inter-node bandwidth
  (InfiniBand, DCN: `dcn_bytes_per_s`) when they cross nodes, else NVLink / ICI. A ring over
  several nodes runs at the slowest link on it, each device's own NIC."""
  return chip_.dcn_bytes_per_s if crosses_nodes(s, chip_) else chip_.link_bytes_per_s


def step_flops(s: Shape, setting: Setting) -> tuple[float, float]:
  """(model, recompute): the step's analytic FLOPs on one data-parallel shard, the model's
  (`flops.flops_per_token` x its tokens) and what the setting's remat policy recomputes in the
  backward pass: "full" the blocks' whole forward (weight matmuls 2 (4 d^2 + 3 d F) per token,
  attention 4 d per score), "dots" only attention's batched matmuls (elementwise work is not
  counted, as in flops.py)."""
  m = s.model
  tokens = s.batch_size * s.seq_len / s.data_parallel
  per_token = flops_lib.flops_per_token(s.model_name, m, s.mask, s.seq_len)
  stacks, _ = _stacks(s, s.batch_size / s.data_parallel)
  attention = sum(st.layers * 4 * st.attn * st.d for st in stacks)
  weights = sum(st.layers * st.tokens * 2 * (4 * st.d * st.d + 3 * st.d * st.ffn) for st in stacks)
  recompute = {"none": 0.0, "dots": attention, "full": weights + attention}[setting.remat]
  return per_token * tokens, recompute


def compute_seconds(s: Shape, setting: Setting, chip_: Chip) -> float:
  """The step's FLOPs on one device (the model's plus what the setting recomputes, `step_flops`)
  at 50% of the chip's peak."""
  return sum(step_flops(s, setting)) / (0.5 * chip_.bf16)


def collective_seconds(s: Shape, setting: Setting, chip_: Chip) -> float:
  """FSDP's collectives per step, which each micro-batch repeats: the weights all-gathered forward
  and backward in the compute dtype, the fp32 gradients reduce-scattered; (n - 1) / n of the
  bytes move per device, at `collective_bandwidth` (inter-node when the shards span nodes)."""
  if s.shard <= 1:
    return 0.0
  gathered = s.num_params * s.compute_bytes * 2 + s.num_params * 4  # fwd + bwd gathers, RS
  moved = setting.microbatches * gathered * (s.shard - 1) / s.shard
  return moved / collective_bandwidth(s, chip_)


def step_cost(s: Shape, setting: Setting, chip_: Chip) -> float:
  """Estimated seconds per step on `chip_`: `compute_seconds` (50% of peak) plus
  `collective_seconds` (not overlapped: the planner compares settings, and a setting that
  gathers the weights k times costs k times the traffic)."""
  return compute_seconds(s, setting, chip_) + collective_seconds(s, setting, chip_)


def microbatch_counts() -> list[int]:
  """The micro-batch counts the planner tries: 1, 2, 4, ..., MAX_MICROBATCHES."""
  return [2**i for i in range(int(math.log2(MAX_MICROBATCHES)) + 1)]


def candidates() -> list[Setting]:
  """Every setting the planner considers."""
  return [
    Setting(remat, ce, k)
    for k in microbatch_counts()
    for remat in REMAT_POLICIES
    for ce in (0, CE_CHUNK)
  ]


@dataclasses.dataclass(frozen=True)
class Plan:
  """The planner's answer for one member on one chip."""

  chip: str
  budget: float  # usable bytes per device
  setting: Setting | None  # None: no setting fits (needs more chips)
  predicted: dict  # estimate(...) of the chosen setting (or of the leanest one tried)
  verdict: str  # fits | needs microbatches=k | needs more chips
  cost_s: float  # step_cost of the chosen setting (0 if none)

  def to_dict(self) -> dict:
    return {
      "chip": self.chip,
      "budget_bytes": self.budget,
      "setting": dataclasses.asdict(self.setting) if self.setting else None,
      "predicted_bytes": self.predicted,
      "verdict": self.verdict,
      "estimated_step_s": self.cost_s,
    }


def plan(s: Shape, chip_name: str, fixed: Setting | None = None) -> Plan:
  """The least costly setting of `candidates()` whose estimate fits the chip's usable memory.

  With `fixed`, judge that setting only (the verdict says how many micro-batches it would need).
  Micro-batch counts that do not divide the per-device rows are skipped."""
  c = chip(chip_name)
  budget = c.hbm * c.usable
  per_device = s.batch_size // s.data_parallel

  def divides(k: int) -> bool:
    return per_device % k == 0

  if fixed is not None:
    verdict, est = judge(s, fixed, budget, platform_of(chip_name))
    if verdict == "fits":
      return Plan(chip_name, budget, fixed, est, verdict, step_cost(s, fixed, c))
    return Plan(chip_name, budget, None, est, verdict, 0.0)
  fitting = [
    (step_cost(s, st, c), i, st)
    for i, st in enumerate(candidates())
    if divides(st.microbatches)
    and estimate(s, st)["total"] * margin(st, platform_of(chip_name)) <= budget
  ]
  if not fitting:
    leanest = Setting("full", CE_CHUNK, max(k for k in microbatch_counts() if divides(k)))
    return Plan(chip_name, budget, None, estimate(s, leanest), "needs more chips", 0.0)
  cost, _, best = min(fitting)
  return Plan(chip_name, budget, best, estimate(s, best), "fits", cost)


def judge(
  s: Shape, setting: Setting, budget: float, platform: str = ""
) -> tuple[str, dict[str, float]]:
  """(verdict, estimate(s, setting)) of one setting against `budget` bytes per device on
  `platform` (its margins): "fits" when the estimate x margin(setting, platform) is within it, else "needs microbatches=k" (the fewest micro-batches,
  dividing the rows per device, that would fit), else "needs more chips". `plan(fixed=...)` on a
  chip's usable memory, and the trainer's check of any run on its own devices
  (cbert_jax/run/memory_fit.py), both judge with it."""
  est = estimate(s, setting)
  if est["total"] * margin(setting, platform) <= budget:
    return "fits", est
  per_device = s.batch_size // s.data_parallel
  for k in microbatch_counts():
    if k > setting.microbatches and per_device % k == 0:
      if (
        estimate(s, dataclasses.replace(setting, microbatches=k))["total"]
        * margin(setting, platform)
        <= budget
      ):
        return f"needs microbatches={k}", est
  return "needs more chips", est
