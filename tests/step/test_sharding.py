"""Mesh construction and the logical-axis layout of parameters and optimizer state."""

import ast
import glob
import os

import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from cbert_jax import config_groups, config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.models import FAMILIES
from cbert_jax.step import optim, sharding
from tests import helpers


def test_mesh_shape_fills_minus_one_and_rejects_mismatches():
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == ((4, 2, 1), (1, 1, 1))
  assert sharding.mesh_shape({"data": 1, "fsdp": -1, "tensor": 2}, 8, {"data": 2}) == (
    (1, 2, 2),
    (2, 1, 1),
  )
  for bad in (
    {"data": 3, "fsdp": 1, "tensor": 1},
    {"data": -1, "fsdp": 3, "tensor": 1},
    {"data": -1, "fsdp": -1, "tensor": 1},
    {"data": 0, "fsdp": 1, "tensor": 8},
  ):
    with pytest.raises(ConfigError, match="mesh"):
      sharding.mesh_shape(bad, 8)


@pytest.mark.parametrize("model_name", ["bert", "crossbert"])
def test_params_and_adam_state_follow_the_rules(model_name):
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rules = config_groups.DEFAULT_RULES
  tx, _ = optim.make_optimizer(config_lib.base_config().optim, 10)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    abs_model = nnx.eval_shape(
      lambda: FAMILIES[model_name](helpers.model_cfg(), helpers.mask_cfg(model_name), nnx.Rngs(0))
    )
    params = nnx.state(abs_model, nnx.Param)
    p_sh = dict(nnx.to_flat_state(nnx.get_named_sharding(params, mesh)))
    o_sh = nnx.get_named_sharding(jax.eval_shape(tx.init, params), mesh)
  assert p_sh[("encoder", "blocks", 0, "ffn", "w1")].spec == P("fsdp", "tensor")
  assert p_sh[("encoder", "blocks", 0, "attn", "wq")].spec == P("fsdp", "tensor", None)
  assert p_sh[("encoder", "embed", "table")].spec == P("tensor", "fsdp")
  mu = dict(nnx.to_flat_state(o_sh[1][0].mu))  # chain(clip, adamw): adamw's ScaleByAdamState
  assert mu[("encoder", "blocks", 0, "ffn", "w1")].spec == P("fsdp", "tensor")
  # every logical name on a parameter has a rule (NNX would pass an unknown name through as a mesh axis)
  names = {n for _, v in nnx.to_flat_state(params) for n in v.get_metadata("out_sharding") if n}
  assert names <= {name for name, _ in rules}


def test_models_never_name_mesh_axes():
  root = os.path.join(os.path.dirname(__file__), "..", "..", "cbert_jax", "models")
  for path in glob.glob(os.path.join(root, "*.py")):
    strings = {
      n.value
      for n in ast.walk(ast.parse(open(path).read()))
      if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    assert not strings & {"data", "fsdp", "tensor"}, path
