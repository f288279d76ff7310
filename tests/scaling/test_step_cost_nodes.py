"""The step cost's collectives at the link they cross: NVLink / ICI within a node (8 GPUs) or a
TPU slice, the inter-node link (InfiniBand per GPU, DCN) when FSDP's shards span nodes."""

import dataclasses

import pytest

from cbert_jax import config_lib
from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import memory
from cbert_jax.scaling import plan as plan_lib

MODEL = ModelConfig(32768, 1024, 16, 16, compute_dtype="bfloat16")
MASK = MaskConfig(0.15, 4, (0, 2, 3, 4))


def fsdp(devices: int, rows: int, slices: int = 1) -> memory.Shape:
  """BERT d1024L16, 512-token rows, FSDP over `devices` (`slices` of them across slices/nodes)."""
  mesh = {"data": 1, "fsdp": devices, "tensor": 1}
  return memory.shape_of("bert", MODEL, MASK, 512, rows, mesh, {**mesh, "fsdp": slices})


def moved(s: memory.Shape, setting: memory.Setting) -> float:
  """Bytes FSDP moves per device per step: gathers (fwd + bwd) and the fp32 reduce-scatter."""
  return setting.microbatches * s.num_params * (2 * 2 + 4) * (s.shard - 1) / s.shard


@pytest.mark.parametrize("gpu", chips_lib.GPU_CHIPS)
def test_fsdp_over_8_gpu_nodes_runs_at_the_inter_node_bandwidth(gpu):
  c = memory.CHIPS[gpu]
  one_node, eight_nodes = fsdp(8, 64), fsdp(64, 512)  # the same rows per device
  for setting in (memory.Setting(), memory.Setting("dots", 0, 4)):
    assert not memory.crosses_nodes(one_node, c) and memory.crosses_nodes(eight_nodes, c)
    assert memory.collective_bandwidth(one_node, c) == c.link_bytes_per_s  # NVLink
    assert memory.collective_bandwidth(eight_nodes, c) == c.dcn_bytes_per_s  # InfiniBand
    near = memory.collective_seconds(one_node, setting, c)
    far = memory.collective_seconds(eight_nodes, setting, c)
    assert near == pytest.approx(moved(one_node, setting) / c.link_bytes_per_s)
    assert far == pytest.approx(moved(eight_nodes, setting) / c.dcn_bytes_per_s)
    # Per byte moved, the cross-node member is slower by NVLink / InfiniBand (9x on H100).
    per_byte = (far / moved(eight_nodes, setting)) / (near / moved(one_node, setting))
    assert per_byte == pytest.approx(c.link_bytes_per_s / c.dcn_bytes_per_s)
    # The step cost is the compute (the same per device here) plus that collective term.
    for s in (one_node, eight_nodes):
      assert memory.step_cost(s, setting, c) == pytest.approx(
        memory.compute_seconds(s, setting, c) + memory.collective_seconds(s, setting, c)
      )
    assert memory.compute_seconds(one_node, setting, c) == pytest.approx(
      memory.compute_seconds(eight_nodes, setting, c)
    )
  h100 = memory.CHIPS["h100"]  # the figures: NVLink 900 GB/s both ways, 400 Gb/s IB per GPU
  assert (h100.link_bytes_per_s, h100.dcn_bytes_per_s, h100.node_devices) == (450e9, 50e9, 8)


def test_the_old_cost_priced_cross_node_fsdp_at_nvlink():
  c = memory.CHIPS["h100"]
  s, setting = fsdp(64, 512), memory.Setting()
  nvlink_everywhere = dataclasses.replace(c, dcn_bytes_per_s=c.link_bytes_per_s)
  old = memory.step_cost(s, setting, nvlink_everywhere)
  new = memory.step_cost(s, setting, c)
  gap = memory.collective_seconds(s, setting, c) - memory.collective_seconds(
    s, setting, nvlink_everywhere
  )
  assert new - old == pytest.approx(gap) and gap == pytest.approx(
    moved(s, setting) * (1 / 50e9 - 1 / 450e9)
  )


def test_a_tpu_slice_is_one_ici_domain_and_dcn_only_between_slices():
  c = memory.CHIPS["v5p"]
  one_slice, two_slices = fsdp(64, 512), fsdp(64, 512, slices=2)
  assert memory.collective_bandwidth(one_slice, c) == c.link_bytes_per_s  # ICI, any slice size
  assert memory.collective_bandwidth(two_slices, c) == c.dcn_bytes_per_s  # mesh_dcn fsdp=2
  assert c.dcn_bytes_per_s == 50e9 / 8  # Cloud TPU v5p: DCN 50 Gbps per chip
  # The member's mesh_dcn reaches the shape through the plan.
  cfg = config_lib.base_config()
  cfg.model_name, cfg.model.size, cfg.data.seq_len, cfg.batch_size = "bert", "d256L4", 128, 64
  cfg.data.vocab_size, cfg.mesh.data, cfg.mesh.fsdp = 8192, 1, -1
  cfg.mesh_dcn.fsdp = 2
  s = plan_lib.memory_shape(config_lib.resolve(cfg), 16)
  assert (s.shard, s.shard_slices) == (16, 2) and memory.crosses_nodes(s, c)
