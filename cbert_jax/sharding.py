"""The device mesh and how arrays are laid out on it.

Models only speak logical axis names (batch, seq, embed, heads, kv, mlp, vocab); `config.sharding_rules`
maps them to the mesh axes `data` (pure data parallel), `fsdp` (data parallel with parameters and
optimizer state sharded, ZeRO-3 style) and `tensor` (Megatron-style tensor parallel). The mesh is
built from `config.mesh` (ICI sizes, one of which may be -1 = fill with the remaining devices) and
`config.mesh_dcn` (sizes across slices / hosts, for multi-slice TPU or multi-node GPU).
"""
import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

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
    raise ConfigError(f"mesh: sizes must be positive with at most one -1, got {dict(zip(AXES, ici))}")
  if -1 in ici:
    known = math.prod(x for x in ici if x != -1)
    if per_slice % known:
      raise ConfigError(f"mesh {dict(zip(AXES, ici))}: {per_slice} devices per slice are not divisible "
                        f"by the fixed axes' product {known}")
    ici[ici.index(-1)] = per_slice // known
  if math.prod(ici) != per_slice:
    raise ConfigError(f"mesh {dict(zip(AXES, ici))} needs {math.prod(ici) * math.prod(dcn)} devices, "
                      f"but {num_devices} are available (set one axis to -1 to fill automatically)")
  return tuple(ici), dcn


def make_mesh(mesh_cfg, dcn_cfg=None, devices=None) -> Mesh:
  """A GSPMD (Auto axes) mesh over AXES; hybrid ICI x DCN when mesh_dcn has a size > 1."""
  devices = devices if devices is not None else jax.devices()
  ici, dcn = mesh_shape(mesh_cfg, len(devices), dcn_cfg)
  if math.prod(dcn) > 1:
    arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
  else:
    try:
      arr = mesh_utils.create_device_mesh(ici, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):  # unusual topologies: plain order
      arr = np.asarray(devices).reshape(ici)
  return Mesh(arr, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def logical_sharding(mesh: Mesh, rules, names: tuple) -> NamedSharding:
  """NamedSharding of an activation/batch with logical `names` (linen's resolver: no axis twice)."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(names, rules))


def data_parallel_size(mesh: Mesh, rules) -> int:
  """How many ways the batch dimension is split: the product of the mesh axes 'batch' maps to."""
  spec = nn.logical_to_mesh_axes(("batch",), rules)[0]
  axes = (spec,) if isinstance(spec, str) else (spec or ())
  return math.prod(mesh.shape[a] for a in axes)


def global_batch(local: dict, sharding: NamedSharding) -> dict:
  """Assemble this process's rows (a contiguous slice of the global batch) into global arrays."""
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
