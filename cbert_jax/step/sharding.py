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
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cbert_jax.step.mesh_shape import AXES, mesh_shape  # the axes and their sizes (no JAX there)


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
    lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local
  )


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
