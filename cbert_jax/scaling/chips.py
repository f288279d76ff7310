"""The chip table: every fact the project uses about an accelerator, one record per chip.

One record (`Chip`) per chip: its key, the `jax.Device.device_kind` strings it matches, its dense
peak FLOP/s per JAX device per dtype, TensorCores and JAX devices per chip, and for the chips a run
is planned for (`CHIPS`) its HBM per device, the fraction the memory plan may fill, the interconnect
bandwidth of FSDP's collectives, and for a TPU its Cloud TPU accelerator-type prefix, slice sizes
and TPU VM runtime. Its readers:

  memory plan, step cost  cbert_jax/scaling/memory.py: `plan` fills `hbm x usable`; `step_cost`
                          divides by `bf16`, and by `link_bytes_per_s` (NVLink, ICI) or, for
                          collectives whose devices span nodes (more than `node_devices`),
                          `dcn_bytes_per_s` (InfiniBand, DCN) (`memory.CHIPS` is `CHIPS`);
  MFU                     cbert_jax/run/hardware.py: `lookup_peak(device_kind)` is
                          `lookup_device_kind`, the denominator `bf16` or `fp32` of that record;
  the planner             cbert_jax/sweep/planner.py: `--chips v5p-64` is `parse`, the wall time
                          divides by `bf16`;
  the launchers           launch/backends.py names TPU slices with `accelerator_type` (and checks
                          them with `is_slice`), picks the TPU VM runtime and exports
                          GPU_MEM_FRACTION to SLURM jobs; every backend exports the chip's
                          `chip_env` (`xla_flags` as XLA_FLAGS on a GPU, LIBTPU_INIT_ARGS on a
                          TPU, then `env`); launch/sweep.py offers GPU_CHIPS as --gpu_type and the
                          TPU generations as --tpu_generation.

Every number is per JAX device unless said otherwise, and *dense* (the NVIDIA spec sheets
headline 2:4 structured-sparsity figures, twice the dense ones and never reached by a dense
model). This module imports nothing beyond the standard library, so the launcher's dry runs stay
free of JAX (tests/test_light_imports.py); the measured peak of a CPU needs JAX and stays in
cbert_jax/run/hardware.py.
"""

from __future__ import annotations

import dataclasses
import math
import re

GiB = 2**30
_T = 1e12  # spec sheets quote TFLOP/s; this keeps the table readable
# What a float32 matmul runs as on a TPU at JAX's default precision: one bf16 MXU pass.
_TPU_F32 = "fp32 as 1-pass bf16"
# Slice sizes, in chips, of the generations whose slices are listed (v5e, v6e).
CHIP_SLICES = (1, 4, 8, 16, 32, 64, 128, 256)
# Chips per host of the generations whose slices are whole hosts (v4, v5p).
HOST_CHIPS = 4
# JAX preallocates 75% of a GPU's memory by default; the SLURM launcher (launch/backends.py) sets
# XLA_PYTHON_CLIENT_MEM_FRACTION to this, and a GPU's `usable` stays below it (tested).
GPU_MEM_FRACTION = 0.92


@dataclasses.dataclass(frozen=True)
class Flag:
  """One XLA flag ("--name=value") or environment variable ("NAME=value") a launch sets, and the
  guide or recipe that recommends it."""

  text: str
  source: str

  @property
  def name(self) -> str:
    """The flag's or variable's name, without its value: "--xla_gpu_...", "NCCL_PROTO"."""
    return self.text.split("=", 1)[0]

  @property
  def value(self) -> str:
    return self.text.split("=", 1)[1] if "=" in self.text else ""


# --- The chips' XLA flags: what MaxText's recipes and NVIDIA's / JAX's guides set for a dense
# transformer's training step (docs/launch.md lists them, with what was left out and why). Each
# flag keeps its source; flags deprecated or removed in recent XLA, and settings the guides
# disagree on or tie to hardware this project does not assume, are in LEFT_OUT instead.
_MT = "MaxText (github.com/AI-Hypercomputer/maxtext) "
_MT_LIB = "benchmarks/xla_flags_library.py "
# MaxText's flag groups (benchmarks/xla_flags_library.py): continuation fusion (CF) for the
# all-gathers, and the data-parallel all-reduce overlap.
_CF_FOR_ALL_GATHER = (
  "--xla_tpu_enable_async_collective_fusion=true",
  "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
  "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
  "--xla_tpu_overlap_compute_collective_tc=true",
  "--xla_enable_async_all_gather=true",
)
_DATA_PARALLEL_OVERLAP = (
  "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
  "--xla_tpu_data_parallel_opt_different_sized_ops=true",
)


def _tpu_flags(recipe: str, *texts: str) -> tuple[Flag, ...]:
  """The LIBTPU_INIT_ARGS of MaxText's dense recipe `recipe` (src/maxtext/configs/tpu/...), in its
  order; a flag of one of MaxText's groups names that group too."""

  def group(text: str) -> str:
    if text in _CF_FOR_ALL_GATHER:
      return f"; {_MT_LIB}CF_FOR_ALL_GATHER"
    if text in _DATA_PARALLEL_OVERLAP:
      return f"; {_MT_LIB}DATA_PARALLEL_OVERLAP"
    if text.startswith("--xla_tpu_scoped_vmem_limit_kib="):
      return f"; {_MT_LIB}DENSE_VMEM_LIMIT_FLAG"
    return ""

  return tuple(
    Flag(t, f"{_MT}src/maxtext/configs/tpu/{recipe} LIBTPU_INIT_ARGS{group(t)}") for t in texts
  )


_JAX_TIPS = "JAX GPU performance tips (docs.jax.dev/en/latest/gpu_performance_tips.html)"
_JT = "NVIDIA JAX-Toolbox (github.com/NVIDIA/JAX-Toolbox) "
_JT_PERF = f"{_JT}docs/GPU_performance.md"
_JT_SLURM = f"{_JT}docs/frameworks/maxtext/example_slurm.sub"
_MT_A3 = f"{_MT}src/maxtext/configs/gpu/a3/llama_2_7b/{{1,8}}vm.sh XLA_FLAGS (A3 = H100)"
# Every NVIDIA GPU of the plan: the latency-hiding scheduler, FSDP's collectives combined up to
# MaxText's sizes, double-buffered loops; O1 turns on collective pipelining.
_GPU_FLAGS = (
  Flag(
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    f"{_JAX_TIPS}; {_JT}docs/getting-started/environment-variables.md (set in NVIDIA's JAX "
    f"image); {_MT_A3}",
  ),
  Flag(
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    f"{_MT_A3}; {_JAX_TIPS}: combine at least a layer's weights",
  ),
  Flag(
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864",
    f"{_MT_A3}; {_JAX_TIPS}: combine at least a layer's gradients",
  ),
  Flag("--xla_gpu_enable_all_gather_combine_by_dim=false", f"{_MT_A3}; {_JT_SLURM}"),
  Flag("--xla_gpu_enable_reduce_scatter_combine_by_dim=false", f"{_MT_A3}; {_JT_SLURM}"),
  Flag(
    "--xla_gpu_enable_while_loop_double_buffering=true",
    f"{_MT_A3}; {_JT_PERF} (Optimization level: forces it regardless of O1)",
  ),
)
_O1 = Flag(
  "JAX_OPTIMIZATION_LEVEL=O1",
  f"{_JT_PERF} (Optimization level: the latency-hiding scheduler, collective pipelining of "
  "all-gather, reduce-scatter and all-reduce, while-loop unrolling; jax_optimization_level)",
)
_ONE_QUEUE = Flag(
  "CUDA_DEVICE_MAX_CONNECTIONS=1",
  f"{_JT_PERF} (CUDA configuration: for latency hiding with asynchronous collectives; not on "
  f"Blackwell); {_JT_SLURM}",
)
_HOPPER_ENV = (_O1, _ONE_QUEUE)
_BLACKWELL_FLAGS = (
  *_GPU_FLAGS,
  Flag(
    "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL",
    f"{_JT_PERF} (Tips for Blackwell: CUDA graphs for fusions and custom calls only)",
  ),
)
# Read, and left out (docs/launch.md has the same list): flag or variable -> why.
LEFT_OUT: dict[str, str] = {
  "--xla_gpu_enable_pipelined_all_gather": (
    "deprecated in XLA (MaxText commit 834e861, Aug 2026: 'Migrate deprecated XLA collective "
    "pipelining flags') for --xla_gpu_pipeline_all_gather=on, which the pinned jaxlib 0.10.2 "
    "refuses (Unknown flag in XLA_FLAGS); JAX_OPTIMIZATION_LEVEL=O1 pipelines collectives"
  ),
  "--xla_gpu_enable_pipelined_reduce_scatter": "as --xla_gpu_enable_pipelined_all_gather",
  "--xla_gpu_enable_pipelined_all_reduce": "as --xla_gpu_enable_pipelined_all_gather",
  "--xla_gpu_pipeline_all_gather": "unknown to the pinned jaxlib 0.10.2 (XLA aborts at start)",
  "--xla_gpu_enable_highest_priority_async_stream": (
    "JAX-Toolbox GPU_performance.md, 'Previously used XLA Flags': turned on by default"
  ),
  "--xla_gpu_enable_async_all_gather": (
    "JAX-Toolbox GPU_performance.md: on by default, no longer needed; unknown to jaxlib 0.10.2"
  ),
  "--xla_gpu_enable_command_buffer=''": (
    "MaxText's A3 recipes disable CUDA graphs on H100; JAX-Toolbox keeps them on by default "
    "(less launch overhead): the guides disagree, XLA's default stays (B200: FUSION,CUSTOM_CALL)"
  ),
  "--xla_gpu_enable_triton_gemm": (
    "MaxText's A3 recipes set false (cuBLAS only); JAX's tips suggest the opposite, "
    "--xla_gpu_triton_gemm_any=True: the guides disagree, XLA's default (autotuned) stays"
  ),
  "--xla_disable_hlo_passes=rematerialization": (
    "MaxText turns XLA's own rematerialisation off; here it is the fallback when the memory "
    "plan reads low, and one --xla_disable_hlo_passes would replace another"
  ),
  "--xla_gpu_all_reduce_combine_threshold_bytes": (
    "MaxText sets it per node count (128 MiB on 1 node, 1 GiB on 8); FSDP reduce-scatters the "
    "gradients, the sweep's members have no large all-reduce"
  ),
  "NCCL_PROTO": (
    "JAX's tips and JAX-Toolbox set SIMPLE,LL,LL128; NCCL's environment-variable docs: 'Users "
    "are discouraged from setting this variable' (LL128 where unsupported corrupts data), and "
    "the default already enables all three where LL128 is supported"
  ),
  "NCCL_LL_BUFFSIZE": (
    "JAX's tips set -2 (single host only, 'don't seem useful for multi-host'); -2 is NCCL's own "
    'default (src/init.cc NCCL_PARAM(LlBuffSize, "LL_BUFFSIZE", -2))'
  ),
  "NCCL_LL128_BUFFSIZE": "as NCCL_LL_BUFFSIZE",
  "NCCL_NVLS_ENABLE": (
    "JAX-Toolbox: optional, 'requires additional GPU memory' and a lower "
    "XLA_PYTHON_CLIENT_MEM_FRACTION, which the memory plan counts on"
  ),
  "NCCL_IB_SL": "JAX-Toolbox's MaxText SLURM example sets 1: the fabric's QoS, a site setting",
  "NCCL_LAUNCH_MODE": (
    "JAX-Toolbox (Blackwell tips): GROUP against hangs with several GPUs per process; the "
    "launchers run one process per GPU"
  ),
  "TPU_MEGACORE": (
    "MaxText's v4 recipes add TPU_MEGACORE=MEGACORE_DENSE to LIBTPU_INIT_ARGS: not a flag, and "
    "the table already runs v4 as megacore (one JAX device per chip)"
  ),
  "--xla_tpu_enable_sparse_core_collective_offload_all_gather": (
    "MaxText's larger v5p/v6e recipes offload collectives to the SparseCore, which turns "
    "continuation fusion for all-gathers off; its 7B dense recipes do not"
  ),
  "--xla_tpu_host_transfer_overlap_limit": "HOST_OFFLOAD_FLAGS: for host offloading, unused here",
  "--xla_tpu_use_bundle_aware_cost_model_for_fusions": (
    "DISABLE_BUNDLE_AWARE_COST_MODEL: a workaround MaxText applies to gpt3-175b only"
  ),
}


def chip_env(chip: Chip, xla_flags: str | None = None) -> list[tuple[str, str]]:
  """What a launch exports for `chip`, in order: its XLA flags in `flags_var` (none when it has
  none), then its `env`. `xla_flags` (a launch's or compile check's --xla_flags) replaces the flags
  and the other variables stay; a blank one sets none of them. launch/backends.py renders these,
  launch/compile_check.py compiles with them."""
  out = [(chip.flags_var, " ".join(f.text for f in chip.xla_flags))] if chip.xla_flags else []
  env = out + [(f.name, f.value) for f in chip.env]
  if xla_flags is None:
    return env
  if not xla_flags.strip():
    return []
  return [
    (chip.flags_var, " ".join(xla_flags.split())),
    *[(k, v) for k, v in env if k != chip.flags_var],
  ]


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator. The first fields are known for every chip (MFU needs them); the memory plan
  and the launchers' fields only for the chips a run is planned for (`CHIPS`), else None, "",
  () or 0.

  Attributes:
    key: The project's name of the chip: `--chips v5p-64`, `sweep.chip`, `--gpu_type`,
      `--tpu_generation`.
    name: Product name, for plans and logs.
    device_kinds: Substrings of `jax.Device.device_kind` that are this chip, matched
      case-insensitively at word boundaries, longest first (`lookup_device_kind`).
    bf16: Peak FLOP/s per JAX device with bf16 (or fp16) inputs and fp32 accumulation.
    fp32: Peak FLOP/s per JAX device for float32 matmuls at JAX's default precision: on NVIDIA
      Ampere and later XLA uses TF32 tensor cores, so the TF32 figure; on TPU a float32 matmul is
      one bf16 MXU pass, so `bf16` (with `jax_default_matmul_precision="highest"` the real peak is
      several times lower).
    fp32_label: What a float32 matmul runs as, in MFU's source string.
    source: Where `bf16` and `fp32` come from (MFU logs and records it).
    devices_per_chip: JAX devices per chip: 1 with a megacore (TPU v4, v5p: the two TensorCores
      fused), 2 on TPU v2, v3 and TPU7x (each TensorCore its own device), 1 for a GPU.
    cores_per_chip: TensorCores per chip, as a TPU accelerator type counts them (v5p-64 = 32
      chips); 1 where the type counts chips (v5e, v6e) and for a GPU.
    hbm: Bytes of device memory per JAX device (vendor spec).
    usable: The fraction of `hbm` the memory plan may fill (runtime reserve, allocator,
      fragmentation).
    link_bytes_per_s: Interconnect bandwidth per device for FSDP's collectives, one direction
      (ICI for a TPU, NVLink for a GPU), within one node (`node_devices`) or TPU slice.
    memory_source: Where `hbm` and `link_bytes_per_s` come from.
    accelerator: The Cloud TPU accelerator-type prefix (v5litepod for v5e); "" for a GPU.
    slices: The slice sizes in chips where the generation lists them (v5e, v6e); () where any
      whole number of hosts is a slice.
    host_chips: Chips per host where slices are whole hosts (v4, v5p); 0 otherwise.
    runtime: The default TPU VM software version (`gcloud compute tpus tpu-vm create --version`).
    node_devices: Devices that share `link_bytes_per_s`: 8 for an HGX/DGX GPU node (NVSwitch);
      0 for a TPU, whose slice is one ICI domain (the launchers run a member on one slice).
    dcn_bytes_per_s: Inter-node bandwidth per device, one direction: InfiniBand (one NIC per GPU)
      for a GPU, the data-center network between TPU hosts (slices) for a TPU. Collectives whose
      devices span nodes run at this rate (`memory.collective_bandwidth`).
    dcn_source: Where `dcn_bytes_per_s` comes from.
    xla_flags: The XLA flags a launch sets for a dense transformer's training step, each with its
      source (`Flag`): XLA_FLAGS on a GPU, LIBTPU_INIT_ARGS on a TPU (`flags_var`).
    env: Further environment variables (`Flag("NAME=value", source)`) a launch sets.
    aot_target: For a GPU, the file in cbert_jax/scaling/gpu_targets/ describing it to XLA:GPU
      (a GpuTargetConfigProto), so a step compiles for it on a machine without one
      (`launch.compile_check --gpu`); "" where none is written yet.
  """

  key: str
  name: str
  device_kinds: tuple[str, ...]
  bf16: float
  fp32: float
  fp32_label: str
  source: str
  devices_per_chip: int = 1
  cores_per_chip: int = 1
  hbm: float | None = None
  usable: float | None = None
  link_bytes_per_s: float | None = None
  memory_source: str = ""
  accelerator: str = ""
  slices: tuple[int, ...] = ()
  host_chips: int = 0
  runtime: str = ""
  node_devices: int = 0
  dcn_bytes_per_s: float | None = None
  dcn_source: str = ""
  xla_flags: tuple[Flag, ...] = ()
  env: tuple[Flag, ...] = ()
  aot_target: str = ""

  @property
  def planned(self) -> bool:
    """Whether a run can be planned for this chip (it has the memory plan's facts)."""
    return self.hbm is not None

  @property
  def flags_var(self) -> str:
    """The variable the XLA flags go in: LIBTPU_INIT_ARGS on a TPU (libtpu reads its compiler's
    flags there), XLA_FLAGS on a GPU."""
    return "LIBTPU_INIT_ARGS" if self.accelerator else "XLA_FLAGS"


# Per JAX device: TPU v4 and v5p show one device per chip (megacore). GPUs: JAX preallocates 75% of
# the memory by default; the SLURM launcher sets XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
# (GPU_MEM_FRACTION), and the plan fills at most 88% of the HBM, leaving room for XLA's scratch and
# fragmentation. The first eight rows are the chips a run is planned for, in the order the memory
# plan lists them; the rest are known to MFU only (no HBM, interconnect or slice facts here).
# Interconnects are quoted in Gbps both ways for a TPU (bytes one way: / 8 / 2) and in GB/s both
# ways for a GPU (/ 2).
# GPU nodes: 8 GPUs on NVSwitch; DGX H100, H200 and B200 have "eight single-port NVIDIA
# ConnectX-7 VPI, up to 400 Gb/s InfiniBand/Ethernet", one per GPU (NVIDIA DGX BasePOD reference
# architecture, Core Components): 400 Gb/s = 50 GB/s per GPU, one direction.
_DGX_IB = (
  "NVIDIA DGX BasePOD reference architecture: 8x single-port ConnectX-7, up to 400 Gb/s "
  "InfiniBand, per 8-GPU DGX H100/H200/B200"
)
TABLE: dict[str, Chip] = {
  c.key: c
  for c in (
    # v4: 275 TFLOP/s bf16 per chip, 32 GiB HBM2, 2,400 Gbps ICI (cloud.google.com/tpu/docs/v4).
    Chip(
      "v4",
      "TPU v4",
      ("TPU v4",),
      bf16=275 * _T,
      fp32=275 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v4 spec",
      cores_per_chip=2,
      hbm=32 * GiB,
      usable=0.90,
      link_bytes_per_s=2400e9 / 8 / 2,
      memory_source="Cloud TPU v4: 32 GiB HBM2, 275 TFLOP/s bf16, 2,400 Gbps ICI",
      accelerator="v4",
      host_chips=HOST_CHIPS,
      runtime="tpu-ubuntu2204-base",  # Cloud TPU's documented software versions
      # DCN: "typically around 2.5e10 bytes / second per host" (How to Scale Your Model,
      # jax-ml/scaling-book tpus.md), 4 chips per v4 host.
      dcn_bytes_per_s=2.5e10 / 4,
      dcn_source="How to Scale Your Model (jax-ml/scaling-book) tpus.md: DCN ~2.5e10 B/s per "
      "host, 4 chips per v4 host",
      xla_flags=_tpu_flags("v4/22b.sh", "--xla_enable_async_all_gather=true"),
    ),
    # v5e, device_kind "TPU v5 lite": 197 TFLOP/s bf16 per chip, 16 GiB HBM2, 1,600 Gbps ICI
    # (cloud.google.com/tpu/docs/v5e); accelerator type v5litepod-N, N chips.
    Chip(
      "v5e",
      "TPU v5e",
      ("TPU v5 lite", "TPU v5e"),
      bf16=197 * _T,
      fp32=197 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v5e spec",
      hbm=16 * GiB,
      usable=0.90,
      link_bytes_per_s=1600e9 / 8 / 2,
      memory_source="Cloud TPU v5e: 16 GiB HBM2, 197 TFLOP/s bf16, 1,600 Gbps ICI",
      accelerator="v5litepod",
      slices=CHIP_SLICES,
      runtime="v2-alpha-tpuv5-lite",  # Cloud TPU's documented software versions
      # DCN: "Per-host NIC configuration: 2 x 100 Gbps NIC", 8 chips per host (and "Data center
      # network bandwidth per Pod: 6.4 Tbps" / 256 chips): 25 Gbps per chip.
      dcn_bytes_per_s=2 * 100e9 / 8 / 8,
      dcn_source="Cloud TPU v5e: 2 x 100 Gbps NIC per 8-chip host (25 Gbps per chip)",
      xla_flags=_tpu_flags("v5e/llama2_7b.sh", *_DATA_PARALLEL_OVERLAP, *_CF_FOR_ALL_GATHER),
    ),
    # v5p, device_kind "TPU v5": 459 TFLOP/s bf16 per chip, 95 GiB HBM2e, 4,800 Gbps ICI
    # (cloud.google.com/tpu/docs/v5p).
    Chip(
      "v5p",
      "TPU v5p",
      ("TPU v5", "TPU v5p"),
      bf16=459 * _T,
      fp32=459 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v5p spec",
      cores_per_chip=2,
      hbm=95 * GiB,
      usable=0.90,
      link_bytes_per_s=4800e9 / 8 / 2,
      memory_source="Cloud TPU v5p: 95 GiB HBM2e, 459 TFLOP/s bf16, 4,800 Gbps ICI",
      accelerator="v5p",
      host_chips=HOST_CHIPS,
      runtime="v2-alpha-tpuv5",  # Cloud TPU's documented software versions
      # DCN: "Data center network (DCN) bandwidth per chip (Gbps): 50" (Cloud TPU versions).
      dcn_bytes_per_s=50e9 / 8,
      dcn_source="Cloud TPU v5p: DCN bandwidth per chip 50 Gbps",
      xla_flags=_tpu_flags(
        "v5p/llama2_7b.sh",
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
        "--xla_tpu_megacore_fusion_allow_ags=false",
        "--xla_enable_async_collective_permute=true",
        "--xla_tpu_enable_ag_backward_pipelining=true",
        *_DATA_PARALLEL_OVERLAP,
        "--xla_tpu_enable_async_collective_fusion=true",
        "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
        "--xla_tpu_overlap_compute_collective_tc=true",
        "--xla_enable_async_all_gather=true",
      ),
    ),
    # v6e Trillium, device_kind "TPU v6 lite": 918 TFLOP/s bf16 per chip, 32 GiB HBM, 3,584 Gbps
    # ICI (cloud.google.com/tpu/docs/v6e). MFU's table named it "TPU v6e (Trillium)", a name no
    # output showed; the plan's "TPU v6e" is kept.
    Chip(
      "v6e",
      "TPU v6e",
      ("TPU v6 lite", "TPU v6e"),
      bf16=918 * _T,
      fp32=918 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v6e spec",
      hbm=32 * GiB,
      usable=0.90,
      link_bytes_per_s=3584e9 / 8 / 2,
      memory_source="Cloud TPU v6e (Trillium): 32 GiB HBM, 918 TFLOP/s bf16, 3,584 Gbps ICI",
      accelerator="v6e",
      slices=CHIP_SLICES,
      runtime="v2-alpha-tpuv6e",  # Cloud TPU's documented software versions
      # DCN: "Per-host NIC configuration: 4 x 200 Gbps NIC", 8 chips per host; "DCN bandwidth per
      # chip (Gbps): 100" (Cloud TPU versions).
      dcn_bytes_per_s=100e9 / 8,
      dcn_source="Cloud TPU v6e: 4 x 200 Gbps NIC per 8-chip host, DCN 100 Gbps per chip",
      xla_flags=_tpu_flags(
        "v6e/llama2_7b_4096.sh",
        "--xla_tpu_scoped_vmem_limit_kib=98304",
        "--xla_enable_async_all_gather=true",
        "--xla_tpu_overlap_compute_collective_tc=true",
        "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
        "--xla_tpu_enable_async_collective_fusion=true",
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
      ),
    ),
    # A100 SXM4 and PCIe (40/80 GB): BF16 312, TF32 156 dense, NVLink 600 GB/s (NVIDIA A100
    # datasheet). The device kind "A100" matches the 40 GB cards too (same FLOP/s, for MFU);
    # the plan's HBM is the 80 GB card's.
    Chip(
      "a100",
      "NVIDIA A100 80GB",
      ("A100",),
      bf16=312 * _T,
      fp32=156 * _T,
      fp32_label="tf32",
      source="NVIDIA A100 datasheet",
      hbm=80e9,
      usable=0.88,
      link_bytes_per_s=600e9 / 2,
      memory_source="NVIDIA A100 datasheet: 80 GB HBM2e, 312 TFLOP/s bf16, NVLink 600 GB/s",
      # 8 GPUs per HGX/DGX node; InfiniBand: one single-port 200 Gb/s HDR ConnectX-6 per GPU.
      node_devices=8,
      dcn_bytes_per_s=200e9 / 8,
      dcn_source="NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand",
      xla_flags=_GPU_FLAGS,  # the H100 recipes' flags: the guides tune none for A100
      env=_HOPPER_ENV,
    ),
    # H100 SXM5, device_kind "NVIDIA H100 80GB HBM3": BF16 1979 / TF32 989 sparse on the
    # datasheet -> 989.4 / 494.7 dense; 80 GB HBM3, NVLink 900 GB/s.
    Chip(
      "h100",
      "NVIDIA H100 SXM",
      ("H100",),
      bf16=989.4 * _T,
      fp32=494.7 * _T,
      fp32_label="tf32",
      source="NVIDIA H100 datasheet (SXM), sparse figures / 2",
      hbm=80e9,
      usable=0.88,
      link_bytes_per_s=900e9 / 2,
      memory_source=(
        "NVIDIA H100 datasheet (SXM): 80 GB HBM3, 989 TFLOP/s bf16 dense, NVLink 900 GB/s"
      ),
      node_devices=8,
      dcn_bytes_per_s=400e9 / 8,
      dcn_source=_DGX_IB,
      xla_flags=_GPU_FLAGS,
      env=_HOPPER_ENV,
      aot_target="h100.txtpb",
    ),
    # H200 SXM: the H100 SXM's compute, BF16 1979 / TF32 989 sparse; 141 GB HBM3e, NVLink
    # 900 GB/s (NVIDIA H200 datasheet).
    Chip(
      "h200",
      "NVIDIA H200 SXM",
      ("H200",),
      bf16=989.4 * _T,
      fp32=494.7 * _T,
      fp32_label="tf32",
      source="NVIDIA H200 datasheet (SXM), sparse figures / 2",
      hbm=141e9,
      usable=0.88,
      link_bytes_per_s=900e9 / 2,
      memory_source=(
        "NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 989 TFLOP/s bf16 dense, NVLink 900 GB/s"
      ),
      node_devices=8,
      dcn_bytes_per_s=400e9 / 8,
      dcn_source=_DGX_IB,
      xla_flags=_GPU_FLAGS,
      env=_HOPPER_ENV,
    ),
    # B200 (HGX, 1000 W): BF16 4.5 PF / TF32 2.2 PF sparse -> 2.25 / 1.1 PF dense; 1,440 GB HBM3e
    # per 8 GPUs, NVLink 1.8 TB/s (NVIDIA HGX B200 / DGX B200 datasheet).
    Chip(
      "b200",
      "NVIDIA B200",
      ("B200",),
      bf16=2250 * _T,
      fp32=1100 * _T,
      fp32_label="tf32",
      source="NVIDIA HGX B200 datasheet, sparse figures / 2",
      hbm=180e9,
      usable=0.88,
      link_bytes_per_s=1800e9 / 2,
      memory_source=(
        "NVIDIA DGX B200 datasheet: 1,440 GB HBM3e / 8 GPUs, 2.25 PFLOP/s bf16 dense, "
        "NVLink 1.8 TB/s"
      ),
      node_devices=8,
      dcn_bytes_per_s=400e9 / 8,
      dcn_source=_DGX_IB,
      xla_flags=_BLACKWELL_FLAGS,
      env=(_O1,),  # JAX-Toolbox: no CUDA_DEVICE_MAX_CONNECTIONS=1 on Blackwell ("slower")
    ),
    # --- Known to MFU only.
    # v2: 45 TFLOP/s bf16 per chip, 2 TensorCores, no megacore: each core is a JAX device and
    # gets half the chip (Google Cloud "TPU architecture" page).
    Chip(
      "v2",
      "TPU v2 (per TensorCore)",
      ("TPU v2",),
      bf16=22.5 * _T,
      fp32=22.5 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v2 spec, 45 TFLOP/s per chip / 2 cores",
      devices_per_chip=2,
      cores_per_chip=2,
    ),
    # v3: 123 TFLOP/s bf16 per chip, 2 TensorCores, no megacore (Google Cloud "TPU architecture"
    # page).
    Chip(
      "v3",
      "TPU v3 (per TensorCore)",
      ("TPU v3",),
      bf16=61.5 * _T,
      fp32=61.5 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU v3 spec, 123 TFLOP/s per chip / 2 cores",
      devices_per_chip=2,
      cores_per_chip=2,
    ),
    # v4i, device_kind "TPU v4 lite" (inference chip, one TensorCore): 137 TFLOP/s bf16 (the
    # figure JAX's own jax._src.pallas.mosaic.tpu_info uses).
    Chip(
      "v4i",
      "TPU v4i",
      ("TPU v4 lite",),
      bf16=137 * _T,
      fp32=137 * _T,
      fp32_label=_TPU_F32,
      source="TPU v4i spec",
    ),
    # TPU7x Ironwood: 2307 TFLOP/s bf16 per chip, two TensorCores and no megacore, so JAX shows
    # two devices per chip (cloud.google.com/tpu/docs/tpu7x; JAX's pallas tpu_info agrees).
    Chip(
      "tpu7x",
      "TPU7x Ironwood (per TensorCore)",
      ("TPU7x",),
      bf16=1153.5 * _T,
      fp32=1153.5 * _T,
      fp32_label=_TPU_F32,
      source="Google Cloud TPU7x spec, 2307 TFLOP/s per chip / 2 cores",
      devices_per_chip=2,
      cores_per_chip=2,
    ),
    # A10: BF16 125, TF32 62.5 dense (NVIDIA A10 datasheet).
    Chip("a10", "NVIDIA A10", ("A10",), 125 * _T, 62.5 * _T, "tf32", "NVIDIA A10 datasheet"),
    # A10G (AWS G5 only): NVIDIA publishes no datasheet. AWS / third-party comparisons give
    # about 70 TFLOP/s bf16 and 35 TFLOP/s TF32 dense; treat as approximate.
    Chip(
      "a10g",
      "NVIDIA A10G",
      ("A10G",),
      70 * _T,
      35 * _T,
      "tf32",
      "no NVIDIA datasheet; AWS/third-party figures, approximate",
    ),
    # L4: BF16 242 / TF32 120 on the datasheet are *with sparsity*; dense is half.
    Chip(
      "l4",
      "NVIDIA L4",
      ("L4",),
      121 * _T,
      60 * _T,
      "tf32",
      "NVIDIA L4 datasheet, sparse figures / 2",
    ),
    # L40S: BF16 362 dense (733 sparse), TF32 183 dense (366 sparse) (NVIDIA L40S datasheet).
    Chip("l40s", "NVIDIA L40S", ("L40S",), 362 * _T, 183 * _T, "tf32", "NVIDIA L40S datasheet"),
    # L40: BF16 181 dense (362 sparse), TF32 90.5 dense (181 sparse) (NVIDIA L40 datasheet).
    Chip("l40", "NVIDIA L40", ("L40",), 181 * _T, 90.5 * _T, "tf32", "NVIDIA L40 datasheet"),
    # GH200 carries the H100 SXM GPU: its numbers (NVIDIA GH200 datasheet).
    Chip(
      "gh200",
      "NVIDIA GH200",
      ("GH200",),
      989.4 * _T,
      494.7 * _T,
      "tf32",
      "NVIDIA GH200 datasheet (H100 SXM numbers), sparse figures / 2",
    ),
    # H100 PCIe: BF16 1513 / TF32 756 sparse -> 756.5 / 378 dense (NVIDIA H100 datasheet).
    Chip(
      "h100-pcie",
      "NVIDIA H100 PCIe",
      ("H100 PCIe",),
      756.5 * _T,
      378 * _T,
      "tf32",
      "NVIDIA H100 datasheet (PCIe), sparse figures / 2",
    ),
    # H100 NVL: BF16 1671 / TF32 835 sparse -> 835.5 / 417.5 dense (NVIDIA H100 datasheet).
    Chip(
      "h100-nvl",
      "NVIDIA H100 NVL",
      ("H100 NVL",),
      835.5 * _T,
      417.5 * _T,
      "tf32",
      "NVIDIA H100 datasheet (NVL), sparse figures / 2",
    ),
    # H200 NVL: BF16 1671 / TF32 835 sparse (NVIDIA H200 datasheet).
    Chip(
      "h200-nvl",
      "NVIDIA H200 NVL",
      ("H200 NVL",),
      835.5 * _T,
      417.5 * _T,
      "tf32",
      "NVIDIA H200 datasheet (NVL), sparse figures / 2",
    ),
    # GB200 (1200 W): BF16 5 PF / TF32 2.5 PF sparse -> 2.5 / 1.25 PF dense per GPU (NVIDIA
    # GB200 NVL72 datasheet).
    Chip(
      "gb200",
      "NVIDIA GB200",
      ("GB200",),
      2500 * _T,
      1250 * _T,
      "tf32",
      "NVIDIA GB200 NVL72 datasheet, sparse figures / 2",
    ),
  )
}

# --- Views of the table (no number of their own) -------------------------------------------------
# The chips a run is planned for: `--chips`, `sweep.chip`, the memory plan and the step cost
# (`memory.CHIPS` is this dict).
CHIPS: dict[str, Chip] = {k: c for k, c in TABLE.items() if c.planned}
GPU_CHIPS = tuple(k for k, c in CHIPS.items() if not c.accelerator)  # a100, h100, h200, b200
# The TPU generations, megacore ones (v4, v5p) first: the order of --tpu_generation's choices.
_TPUS = sorted(
  (k for k, c in CHIPS.items() if c.accelerator), key=lambda k: -CHIPS[k].cores_per_chip
)
TPU_CORES_PER_CHIP = {k: CHIPS[k].cores_per_chip for k in _TPUS}  # in the type's number
TPU_PREFIX = {k: CHIPS[k].accelerator for k in _TPUS}  # accelerator types
TPU_RUNTIME = {k: CHIPS[k].runtime for k in _TPUS}  # the default TPU VM runtime
# `jax.Device.device_kind` substring -> its chip (run/hardware.py's `PEAK_FLOPS`).
DEVICE_KINDS: dict[str, Chip] = {kind: c for c in TABLE.values() for kind in c.device_kinds}
CHIPS_FORMS = (
  "<tpu>-<N> (v4/v5p: N TensorCores, 2 per chip, a multiple of 8, e.g. v5p-64 = 32 devices; "
  f"v5e (or v5litepod)/v6e: N chips in {', '.join(map(str, CHIP_SLICES))}) or <gpu>x<N> "
  f"({'/'.join(GPU_CHIPS)}: N GPUs, e.g. h100x16)"
)


def _kind_pattern(kind: str) -> re.Pattern[str]:
  # Word boundaries that treat letters and digits as word characters but "-" and " " as
  # separators, so "A100" matches "NVIDIA A100-SXM4-80GB" but "A10" does not.
  return re.compile(r"(?<![A-Za-z0-9])" + re.escape(kind) + r"(?![A-Za-z0-9])", re.IGNORECASE)


# Longest first, so that the most specific entry wins when several match ("TPU v5 lite" over
# "TPU v5", "H100 PCIe" over "H100").
_KIND_PATTERNS = {kind: _kind_pattern(kind) for kind in sorted(DEVICE_KINDS, key=len, reverse=True)}


def lookup_device_kind(device_kind: str) -> tuple[str, Chip] | None:
  """The chip of a `jax.Device.device_kind` string ("TPU v5 lite", "NVIDIA H100 80GB HBM3").

  Returns:
    `(kind, chip)`: the most specific `device_kinds` entry that matches and its record; None if
    the device is not in the table.
  """
  for kind, pattern in _KIND_PATTERNS.items():
    if pattern.search(device_kind):
      return kind, DEVICE_KINDS[kind]
  return None


def is_slice(chip: Chip, chips: int) -> bool:
  """Whether the TPU generation `chip` has a slice of `chips` chips: one of its listed sizes (v5e,
  v6e), or a whole number of hosts (v4, v5p)."""
  if chip.slices:
    return chips in chip.slices
  return chips > 0 and chips % chip.host_chips == 0


def accelerator_type(key: str, chips: int) -> str:
  """The Cloud TPU accelerator type of a slice of `chips` chips: v4/v5p count TensorCores (8 v5p
  chips -> v5p-16), v5e/v6e chips (8 v5e chips -> v5litepod-8). `parse` reads it back."""
  return f"{TPU_PREFIX[key]}-{chips * TPU_CORES_PER_CHIP[key]}"


def topology(key: str, chips: int) -> str:
  """libtpu's name of a slice of `chips` chips of TPU generation `key`, as
  `jax.experimental.topologies.get_topology_desc` takes it: a 3D torus for the generations whose
  slices are whole hosts (v4, v5p: 4 chips = 2x2x1, 8 = 2x2x2, 16 = 2x2x4, 32 = 2x4x4,
  64 = 4x4x4, ...), a 2D one for v5e/v6e (1 = 1x1, 4 = 2x2, 8 = 2x4, 16 = 4x4, ..., 256 = 16x16):
  the shapes of Cloud TPU's standard slices, from doubling the last of the smallest sides. ValueError
  for a GPU, a count that is no slice of the generation, or one that is not a power of two (a
  slice of another shape is typed: `launch.compile_check --tpu_topology`)."""
  chip = CHIPS.get(key)
  if chip is None or not chip.accelerator:
    raise ValueError(f"{key!r} is no TPU generation (TPUs: {', '.join(TPU_PREFIX)})")
  if not is_slice(chip, chips) or chips & (chips - 1):
    raise ValueError(
      f"{chips} {key} chips: no standard {key} topology (slices of a power-of-two chip count"
      + (f" in {', '.join(map(str, chip.slices))}" if chip.slices else f", >= {chip.host_chips}")
      + ")"
    )
  if chip.host_chips and chips == chip.host_chips:
    return f"{key}:2x2x1"  # one host
  sides = [1] * (3 if chip.host_chips else 2)
  while math.prod(sides) < chips:
    smallest = min(sides)
    i = max(j for j, side in enumerate(sides) if side == smallest)
    sides[i] *= 2
  return f"{key}:{'x'.join(map(str, sides))}"


def parse_topology(name: str) -> tuple[str, int]:
  """`v5p:2x2x4` -> ("v5p", 16): the generation (a CHIPS key) and its chip count; ValueError with
  the expected form otherwise."""
  m = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", name)
  tpus = ", ".join(TPU_PREFIX)
  if not m or m.group(1) not in TPU_PREFIX:
    raise ValueError(f"expected <generation>:<AxB[xC]> with a generation of {tpus}, e.g. v5p:2x2x4")
  sides = [int(x) for x in m.group(2).split("x")]
  if len(sides) != (3 if CHIPS[m.group(1)].host_chips else 2) or min(sides) < 1:
    want = "AxBxC" if CHIPS[m.group(1)].host_chips else "AxB"
    raise ValueError(f"{name}: a {m.group(1)} topology is {want} (chips per side, each >= 1)")
  return m.group(1), math.prod(sides)


def same_hbm_chips(from_key: str, chips: int, to_key: str) -> int:
  """The chips of generation `to_key` that hold as much HBM in all as `chips` chips of `from_key`:
  the smallest standard slice of `to_key` with chips x HBM per chip >= the other's (8 v5p = 760
  GiB -> 32 v6e = 1024 GiB). How a member planned for one TPU generation is re-planned for another
  with the same memory for its state and activations (`launch.compile_check --generation`)."""
  src, dst = CHIPS[from_key], CHIPS[to_key]
  need = chips * src.devices_per_chip * src.hbm / (dst.hbm * dst.devices_per_chip)
  sizes = dst.slices or tuple(dst.host_chips * 2**i for i in range(12))
  fitting = [n for n in sizes if n >= need - 1e-9 and not n & (n - 1)]
  if not fitting:
    raise ValueError(f"{chips} {from_key} chips: no {to_key} slice holds {need:.0f} chips' HBM")
  return min(fitting)


@dataclasses.dataclass(frozen=True)
class Chips:
  """What --chips names: the CHIPS key and the JAX devices (data-parallel size)."""

  name: str  # as given: v5p-64, h100x16
  chip: str  # CHIPS key
  devices: int  # JAX devices: TPU v4/v5p chips (TensorCores / 2), TPU v5e/v6e chips, GPUs


def parse(text: str) -> Chips:
  """`v5p-64` -> Chips("v5p-64", "v5p", 32); `h100x16` -> Chips("h100x16", "h100", 16). A TPU is
  named by its chip key or its accelerator-type prefix (v5e-16 = v5litepod-16)."""
  bad = f"expected {CHIPS_FORMS}"
  tpu = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  gpu = re.fullmatch(r"([a-z0-9]+?)x(\d+)", text)
  by_prefix = {prefix: key for key, prefix in TPU_PREFIX.items()}
  if tpu and (tpu.group(1) in TPU_PREFIX or tpu.group(1) in by_prefix):
    key, count = by_prefix.get(tpu.group(1), tpu.group(1)), int(tpu.group(2))
    chip = CHIPS[key]
    chips, cores = divmod(count, chip.cores_per_chip)  # v4, v5p: the count is TensorCores
    if cores or not is_slice(chip, chips):
      raise ValueError(f"{bad}; {text} is no {key} slice")
    return Chips(text, key, chips * chip.devices_per_chip)
  if gpu and gpu.group(1) in GPU_CHIPS:
    count = int(gpu.group(2))
    if count <= 0:
      raise ValueError(f"{bad}; at least one GPU")
    return Chips(text, gpu.group(1), count)
  raise ValueError(bad)
