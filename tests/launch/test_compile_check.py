"""launch.compile_check: members compile on a fake 4-device CPU mesh in a child process, with the
memory XLA reports checked against parameter + AdamW bytes from the abstract shapes; divisibility
errors are one line per member and the others still compile."""

import argparse
import json
import math
import os
import subprocess
import sys

import jax
import pytest
from flax import nnx

from cbert_jax.errors import ConfigError
from cbert_jax.models import FAMILIES
from cbert_jax.scaling import plan
from launch import compile_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A sweep of one quick member (BERT d32L2: 2 heads, vocabulary 4096) on differently shaped meshes.
EXPERIMENT = """
from cbert_jax.sweep import experiment as _members

sweep = _members.load_experiment({sweep!r})

MEMBERS = {{  # name: (mesh data, fsdp, tensor), batch rows
    "fsdp4": ((1, -1, 1), 8),
    "data4": ((-1, 1, 1), 8),
    "batch6": ((1, -1, 1), 6),     # 6 rows over 4 data-parallel ways
    "tensor4": ((1, 1, 4), 8),     # 2 heads over 4 tensor ways
    "tensor3": ((1, 1, 3), 8),     # a mesh of 3 on 4 devices
}}


def get_sweep(arg=None):
  return list(MEMBERS)


def workdir_name(arg):
  return arg


def get_config(arg=None):
  c = sweep.get_config("scale=quick,model=bert,size=d32L2")
  (c.mesh.data, c.mesh.fsdp, c.mesh.tensor), c.sweep.batch_size = MEMBERS[arg]
  return c
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
  """One run of the CLI over the five members (one child with 4 fake devices): (process, rows)."""
  tmp = tmp_path_factory.mktemp("compile_check")
  exp = tmp / "meshes.py"
  exp.write_text(EXPERIMENT.format(sweep=os.path.join(ROOT, "experiments", "sweep.py")))
  out = tmp / "check.json"
  cmd = [
    sys.executable,
    "-m",
    "launch.compile_check",
    "--config",
    str(exp),
    "--out",
    str(out),
    "--override=--config.sweep.target_devices=4",
  ]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  rows = {r["member"]: r for r in json.loads(out.read_text())["members"]} if out.exists() else {}
  return proc, rows, exp


def param_bytes(exp) -> int:
  """Parameter bytes of the member, from the model's abstract shapes (no compile involved)."""
  module, args = compile_check.member_args(str(exp))
  _, config = compile_check.load_member(str(exp), module, args[0], [])
  model_cfg, mask_cfg = plan.model_config(config)
  with nnx.use_eager_sharding(False):  # shapes only, outside any mesh
    model = nnx.eval_shape(lambda: FAMILIES["bert"](model_cfg, mask_cfg, nnx.Rngs(0)))
  return sum(
    math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param))
  )


def test_members_compile_on_a_fake_mesh_with_memory_per_device(checked):
  proc, rows, exp = checked
  assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]  # some members fail
  assert "fake CPU mesh" in proc.stdout.splitlines()[0]  # which path was used
  for name, mesh in (("fsdp4", (1, 4, 1)), ("data4", (4, 1, 1))):
    r = rows[name]
    assert r["error"] is None and r["devices"] == 4, r
    assert tuple(r["mesh"][a] for a in ("data", "fsdp", "tensor")) == mesh
    mem = r["memory"]
    assert mem["total"] == mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] > 0
    assert r["params"] > 0 and r["compile_s"] > 0
  # Parameters + AdamW's mu and nu, all float32: FSDP over 4 devices holds a quarter of each
  # sharded array (norm scales stay whole), pure data parallelism holds all of them.
  state = 3 * param_bytes(exp)
  fsdp4, data4 = rows["fsdp4"]["memory"]["argument"], rows["data4"]["memory"]["argument"]
  assert state / 4 <= fsdp4 < data4
  assert state <= data4
  assert data4 > 2 * fsdp4
  # Donated parameters and optimizer state come back as the step's outputs, aliased.
  assert rows["fsdp4"]["memory"]["alias"] >= state / 4


def test_divisibility_errors_are_one_line_per_member(checked):
  proc, rows, _ = checked
  expect = {
    "batch6": "config error: batch_size=6 is not divisible by the data-parallel size 4",
    "tensor4": "is not divisible by mesh axis tensor of size 4",
    "tensor3": "config error: mesh {'data': 1, 'fsdp': 1, 'tensor': 3} needs 3 devices, but 4",
  }
  for name, text in expect.items():
    assert text in (rows[name]["error"] or ""), rows[name]
    line = [l for l in proc.stdout.splitlines() if l.startswith(name + " ")]
    assert len(line) == 1 and "FAILED" in line[0] and text in line[0], proc.stdout
  assert rows["tensor4"]["error"].startswith("config error: parameter ['encoder']")  # names it
  assert [l for l in proc.stdout.splitlines() if l.endswith("  OK")] != []
  assert proc.stdout.splitlines()[-1] == "2 OK, 3 failed: batch6, tensor4, tensor3"


def test_members_filter_and_tpu_usage_errors(capsys, monkeypatch):
  spec = os.path.join(ROOT, "experiments", "sweep.py") + ":quick"
  assert compile_check.main(["--config", spec, "--members", "bert_d32L2,bert_d999L9"]) == 2
  err = capsys.readouterr().err
  assert "bert_d999L9: not members of" in err and "crossbert_d96L3" in err
  # Each TPU flag without libtpu: one line saying how to get it, before any member is loaded.
  monkeypatch.setattr(compile_check, "libtpu_available", lambda: False)
  for flag in ("--tpu", "--tpu_topology=v5p:2x2x4", "--generation=v6e"):
    assert compile_check.main(["--config", spec, flag]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"compile check: {flag.split('=')[0]} needs libtpu (pip install"), line
  monkeypatch.setattr(compile_check, "libtpu_available", lambda: True)
  bad = {
    "--tpu_topology=v5p:2x4": "--tpu_topology=v5p:2x4: v5p:2x4: a v5p topology is AxBxC",
    "--tpu_topology=h100:8": "expected <generation>:<AxB[xC]> with a generation of",
    "--generation=h300": "--generation=h300: expected one of v4, v5e, v5p, v6e, a100",
  }
  for flag, text in bad.items():
    assert compile_check.main(["--config", spec, flag]) == 2
    assert text in capsys.readouterr().err
  assert compile_check.main(["--config", spec, "--tpu", "--tpu_topology=v5p:2x2x1"]) == 2
  assert "give one of them" in capsys.readouterr().err
  assert compile_check.main(["--config", spec, "--gpu", "--tpu"]) == 2
  assert "--gpu compiles members planned for a GPU; --tpu a TPU" in capsys.readouterr().err
  monkeypatch.setattr(compile_check, "cuda_plugin_available", lambda: False)
  assert compile_check.main(["--config", spec, "--gpu"]) == 2
  assert (
    "--gpu needs jax's CUDA plugin (pip install 'jax[cuda12]==0.10.2'" in capsys.readouterr().err
  )


def test_tpu_needs_a_member_planned_for_a_tpu(tmp_path, monkeypatch):
  """--tpu on members without a TPU plan: each row says what is missing (no compile starts)."""
  spec = os.path.join(ROOT, "experiments", "sweep.py") + ":quick"
  monkeypatch.setattr(compile_check, "libtpu_available", lambda: True)
  out = tmp_path / "o.json"
  argv = ["--config", spec, "--members", "bert_d32L2", "--tpu", f"--out={out}"]
  assert (
    compile_check.main(
      [*argv, "--override=--config.sweep.chip=h100", "--override=--config.sweep.target_devices=4"]
    )
    == 1
  )
  (row,) = json.loads(out.read_text())["members"]
  assert row["error"] == (
    "config error: --tpu needs a member planned for a TPU (sweep.chip='h100', "
    "sweep.target_devices=4); type one with --tpu_topology"
  )


def test_generation_replans_at_the_same_hbm_in_all(monkeypatch):
  """--generation v6e: a member planned for 8 v5p chips (760 GiB) compiles for 32 v6e chips
  (1024 GiB, v6e:4x8), with its chip, devices and batch multiple set for them."""
  spec = os.path.join(ROOT, "experiments", "sweep.py")
  module, _ = compile_check.member_args(spec)
  ns = argparse.Namespace(
    config=spec, override=[], generation="v6e", tpu=False, tpu_topology="", gpu=False
  )
  arg = "scale=paper,model=bert,size=d384L6"
  name, config, job = compile_check.plan_job(ns, module, arg)
  assert (name, job.topology) == ("bert_d384L6", "v6e:4x8")
  assert (config.sweep.chip, config.sweep.target_devices) == ("v6e", 32)
  assert config.batch_size % 32 == 0 and config.sweep.memory_verdict
  ns.generation, ns.tpu = "", True  # the member as planned: v5p, 8 chips
  assert compile_check.plan_job(ns, module, arg)[2].topology == "v5p:2x2x2"
  ns.tpu, ns.tpu_topology = False, "v6e:2x4"  # typed: the chip judged against follows it
  _, config, job = compile_check.plan_job(ns, module, arg)
  assert (config.sweep.chip, job.topology) == ("v6e", "v6e:2x4")
  # --gpu: the member re-planned for 16 H100s compiles for 2 nodes of 8 (XLA:GPU's 1x2x8)
  ns.tpu_topology, ns.gpu = "", True
  ns.override = ["--config.sweep.chip=h100", "--config.sweep.target_devices=16"]
  _, config, job = compile_check.plan_job(ns, module, arg)
  assert (config.sweep.chip, job.topology, job.group) == ("h100", "h100@1x2x8", ("h100@1x2x8", 0))
  env = compile_check.gpu_env(job.topology)
  assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_OPTIMIZATION_LEVEL"] == "O1"
  assert "--xla_gpu_enable_latency_hiding_scheduler=true" in env["XLA_FLAGS"]
  ns.override = ["--config.sweep.chip=a100", "--config.sweep.target_devices=8"]
  with pytest.raises(ConfigError, match="no target description of a100 for XLA:GPU yet"):
    compile_check.plan_job(ns, module, arg)
  ns.override = []  # planned for v5p: not a GPU member
  with pytest.raises(ConfigError, match="--gpu needs a member planned for a GPU"):
    compile_check.plan_job(ns, module, arg)


def test_child_env_replaces_the_device_count(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_foo=1")
  env = compile_check.child_env(64, tpu=False)
  assert env["XLA_FLAGS"].split() == [
    "--xla_foo=1",
    "--xla_force_host_platform_device_count=64",
    "--xla_disable_hlo_passes=cse_barrier_expander",
  ]
  assert env["JAX_PLATFORMS"] == "cpu"
  assert (
    "--xla_force_host_platform_device_count=8" in compile_check.child_env(0, False)["XLA_FLAGS"]
  )
