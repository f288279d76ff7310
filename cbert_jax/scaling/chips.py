"""Accelerator slices by name: how many JAX devices `v5p-64`, `v5e-16` or `h100x16` is.

The one table of Cloud TPU slice naming in the project: the launcher (launch/backends.py) names
slices with it, the planner (cbert_jax/sweep/planner.py) reads `--chips` with it. Chip keys are
those of `cbert_jax.scaling.memory.CHIPS` (HBM and peak FLOP/s per device); this module imports
nothing heavy, so the launcher's dry runs stay free of JAX.
"""

from __future__ import annotations

import dataclasses
import re

# Cloud TPU slice naming: the accelerator-type prefix per generation and TensorCores per chip in
# the type's number (v5p-64 = 32 chips); launch/backends.py names slices with these.
TPU_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
TPU_PREFIX = {"v4": "v4", "v5p": "v5p", "v5e": "v5litepod", "v6e": "v6e"}  # accelerator types
CHIP_SLICES = (1, 4, 8, 16, 32, 64, 128, 256)  # v5e / v6e slice sizes, in chips
HOST_CHIPS = 4  # v4 / v5p slices are whole hosts of 4 chips
GPU_CHIPS = ("a100", "h100", "h200", "b200")  # the GPU keys of memory.CHIPS (tested equal)
CHIPS_FORMS = (
  "<tpu>-<N> (v4/v5p: N TensorCores, 2 per chip, a multiple of 8, e.g. v5p-64 = 32 devices; "
  f"v5e (or v5litepod)/v6e: N chips in {', '.join(map(str, CHIP_SLICES))}) or <gpu>x<N> "
  f"({'/'.join(GPU_CHIPS)}: N GPUs, e.g. h100x16)"
)


@dataclasses.dataclass(frozen=True)
class Chips:
  """What --chips names: the memory.CHIPS key and the JAX devices (data-parallel size)."""

  name: str  # as given: v5p-64, h100x16
  chip: str  # memory.CHIPS key
  devices: int  # JAX devices: TPU v4/v5p chips (TensorCores / 2), TPU v5e/v6e chips, GPUs


def parse(text: str) -> Chips:
  """`v5p-64` -> Chips("v5p-64", "v5p", 32); `h100x16` -> Chips("h100x16", "h100", 16). A TPU is
  named by its chip key or its accelerator-type prefix (v5e-16 = v5litepod-16)."""
  bad = f"expected {CHIPS_FORMS}"
  tpu = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  gpu = re.fullmatch(r"([a-z0-9]+?)x(\d+)", text)
  by_prefix = {prefix: key for key, prefix in TPU_PREFIX.items()}
  if tpu and (tpu.group(1) in TPU_CORES_PER_CHIP or tpu.group(1) in by_prefix):
    key, count = by_prefix.get(tpu.group(1), tpu.group(1)), int(tpu.group(2))
    per_chip = TPU_CORES_PER_CHIP[key]
    if per_chip > 1:  # v4, v5p: the count is TensorCores, the slice whole hosts
      if count <= 0 or count % (per_chip * HOST_CHIPS):
        raise ValueError(f"{bad}; {text} is no {key} slice")
      return Chips(text, key, count // per_chip)
    if count not in CHIP_SLICES:
      raise ValueError(f"{bad}; {text} is no {key} slice")
    return Chips(text, key, count)
  if gpu and gpu.group(1) in GPU_CHIPS:
    count = int(gpu.group(2))
    if count <= 0:
      raise ValueError(f"{bad}; at least one GPU")
    return Chips(text, gpu.group(1), count)
  raise ValueError(bad)
