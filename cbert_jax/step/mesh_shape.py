"""The mesh's axes and their sizes on a device count: plain arithmetic, no JAX.

`sharding` builds the mesh from these sizes; the memory plan (`scaling/plan.py`) and the launcher
read them without importing JAX.
"""

import math

from cbert_jax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg, num_devices: int, dcn_cfg=None) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Resolve (ici_shape, dcn_shape) over AXES; -1 in the ICI shape takes the remaining devices.

  Raises ConfigError naming `mesh` when the sizes cannot multiply to the device count.
  """
  dcn = tuple(int(dcn_cfg.get(a, 1)) if dcn_cfg else 1 for a in AXES)
  ici = [int(mesh_cfg.get(a, 1)) for a in AXES]
  per_slice, rem = divmod(num_devices, math.prod(dcn))
  if rem or any(x < 1 for x in dcn):
    raise ConfigError(f"mesh_dcn {dict(zip(AXES, dcn))} does not divide the {num_devices} devices")
  if ici.count(-1) > 1 or any(x == 0 or x < -1 for x in ici):
    raise ConfigError(
      f"mesh: sizes must be positive with at most one -1, got {dict(zip(AXES, ici))}"
    )
  if -1 in ici:
    known = math.prod(x for x in ici if x != -1)
    if per_slice % known:
      raise ConfigError(
        f"mesh {dict(zip(AXES, ici))}: {per_slice} devices per slice are not divisible "
        f"by the fixed axes' product {known}"
      )
    ici[ici.index(-1)] = per_slice // known
  if math.prod(ici) != per_slice:
    raise ConfigError(
      f"mesh {dict(zip(AXES, ici))} needs {math.prod(ici) * math.prod(dcn)} devices, "
      f"but {num_devices} are available (set one axis to -1 to fill automatically)"
    )
  return tuple(ici), dcn


def axis_sizes(mesh_cfg, num_devices: int, dcn_cfg=None) -> dict[str, int]:
  """{data, fsdp, tensor}: each axis's size over all devices (ICI x DCN)."""
  ici, dcn = mesh_shape(mesh_cfg, num_devices, dcn_cfg)
  return {a: i * j for a, i, j in zip(AXES, ici, dcn)}
