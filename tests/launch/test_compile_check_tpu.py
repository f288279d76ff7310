"""launch.compile_check's TPU path: a tiny sweep member compiled by libtpu (the real TPU compiler,
ahead of time, on this CPU-only machine) for the v5p topology its chip and chip count name.

Checked against independent figures: the compiled step's argument bytes against parameter + AdamW
bytes from the abstract shapes, every parameter and both AdamW moments in the compiled HLO's entry
signature at the per-device shape FSDP gives them (`NamedSharding.shard_shape` of the trainer's
shardings), the compiler's FLOPs against models/flops.py, its verdict against the memory plan's;
a rerun with --archive compiles nothing. libtpu comes with the test extra (`pip install -e
'.[test]'`); on a platform libtpu has no wheel for, these tests are skipped with that reason.
"""

import collections
import json
import math
import os
import platform
import re
import subprocess
import sys

import jax
import pytest

from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import compiled as compiled_lib
from cbert_jax.scaling import plan
from cbert_jax.step import state as state_lib
from launch import compile_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "experiments", "sweep.py") + ":quick"
MEMBER = "bert_d32L2"
# The quick sweep's smallest BERT planned for 4 v5p chips (one host: v5p:2x2x1), FSDP over them.
OVERRIDES = [
  "--config.sweep.chip=v5p",
  "--config.sweep.target_devices=4",
  "--config.sweep.batch_multiple=4",
  "--config.mesh.data=1",
  "--config.mesh.fsdp=-1",
]
# What libtpu prints on a host without a TPU when nothing tells it the slice (tpu_env does).
LIBTPU_NOISE = ("could not determine TPU", "TPU_WORKER_HOSTNAMES", "host bounds")

if platform.system() != "Linux" or platform.machine() != "x86_64":
  pytest.skip("libtpu has wheels for Linux x86_64 only", allow_module_level=True)
if not compile_check.libtpu_available():  # the test extra installs it: its absence is a failure
  pytest.fail("libtpu is not installed: pip install -e '.[test]' installs it", pytrace=False)


def run_check(*args: str) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "-m", "launch.compile_check", "--config", SWEEP, "--members", MEMBER]
  cmd += [f"--override={o}" for o in OVERRIDES] + list(args)
  env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
  """One libtpu compile of the member (--tpu, archived, HLO dumped), then the same command again."""
  tmp = tmp_path_factory.mktemp("tpu_aot")
  args = (
    "--tpu",
    f"--archive={tmp / 'v5p'}",
    f"--dump_hlo={tmp / 'hlo'}",
    f"--out={tmp / 'o.json'}",
  )
  first = run_check(*args)
  rows = json.loads((tmp / "o.json").read_text())["members"] if (tmp / "o.json").exists() else []
  again = run_check(*args)
  return first, rows, again, tmp


def test_a_tiny_member_compiles_for_its_v5p_topology(compiled):
  proc, rows, _, tmp = compiled
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert proc.stdout.splitlines()[0].endswith(
    "path: TPU ahead of time (libtpu's compile-only devices for each topology)"
  )
  (row,) = rows
  assert row["error"] is None, row
  assert (row["path"], row["topology"], row["chip"], row["devices"]) == (
    "tpu",
    "v5p:2x2x1",
    "v5p",
    4,
  )
  assert row["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert row["versions"]["libtpu"] and row["key"]["topology"] == "v5p:2x2x1"
  mem = row["memory"]
  assert mem["total"] == mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] > 0
  # The archived row is the printed one, and the archive's table names the member and topology.
  assert compiled_lib.load(str(tmp / "v5p"))[MEMBER]["memory"] == mem
  assert f"| {MEMBER} | v5p:2x2x1 | 1x4x1 |" in (tmp / "v5p" / "table.md").read_text()


def member_state():
  """The member's config and its abstract state on 4 of the test process's fake CPU devices: the
  trainer's shardings, independent of any TPU compile."""
  module, _ = compile_check.member_args(SWEEP)
  _, config = compile_check.load_member(
    SWEEP, module, "scale=quick,model=bert,size=d32L2", OVERRIDES
  )
  model_cfg, mask_cfg = plan.model_config(config)
  return config, state_lib.setup(config, model_cfg, mask_cfg, jax.devices()[:4])


def test_fsdp_shards_every_parameter_and_moment_in_the_compiled_hlo(compiled):
  proc, rows, _, tmp = compiled
  config, st = member_state()
  params = jax.tree.leaves(st.abs_params)
  shardings = jax.tree.leaves(st.param_shardings)
  local = [tuple(sh.shard_shape(p.shape)) for p, sh in zip(params, shardings)]
  # FSDP over 4: about a quarter of the parameters per device (norm scales stay whole)
  assert sum(math.prod(s) for s in local) < 0.3 * sum(math.prod(p.shape) for p in params)
  hlo = (tmp / "hlo" / f"{MEMBER}.hlo.txt").read_text()
  entry = re.search(r"ENTRY [^(]*\((.*?)\) ->", hlo).group(1)
  shapes = collections.Counter(
    tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"f32\[([\d,]*)\]", entry)
  )
  # Each parameter, its AdamW mu and its nu enter the step at the per-device FSDP shape.
  for shape, n in collections.Counter(local).items():
    assert shapes[shape] >= 3 * n, (shape, n, shapes)
  # and no sharded parameter enters whole.
  whole = {tuple(p.shape) for p, s in zip(params, local) if tuple(p.shape) != s}
  assert whole and not whole & set(shapes), whole & set(shapes)


def test_the_compiler_agrees_with_the_analytic_flops_and_the_plan(compiled):
  _, (row,), _, _ = compiled
  cost, analytic = row["cost"], row["analytic"]
  # models/flops.py counts matmul FLOPs only; the compiler adds elementwise work: within 15%.
  assert 1.0 <= cost["flops"] / (analytic["model_flops"] + analytic["recompute_flops"]) < 1.15
  assert cost["optimal_seconds"] > 0 and cost["bytes_accessed"] > 0
  est = compiled_lib.estimate(row)
  assert est["step_s"] == cost["optimal_seconds"]
  assert est["mfu"] == pytest.approx(
    analytic["model_flops"] / cost["optimal_seconds"] / chips_lib.CHIPS["v5p"].bf16
  )
  # The analytic plan and the compiler agree that it fits: its bytes under v5p's usable HBM.
  assert row["plan"]["verdict"] == "fits" and compiled_lib.compiled_verdict(row) == "fits"
  assert row["plan"]["predicted"]["total"] > 0


def test_a_rerun_with_the_archive_compiles_nothing(compiled):
  _, _, again, _ = compiled
  assert again.returncode == 0, again.stdout + again.stderr[-2000:]
  assert "(1 already in " in again.stdout.splitlines()[0]
  assert "compiling for" not in again.stderr


def test_libtpus_host_warnings_are_kept_out(compiled):
  """libtpu, started as the check starts it (`tpu_env`), prints none of its absent-host warnings,
  which it does print without that environment (so the check is not vacuous)."""
  proc, _, _, _ = compiled
  assert not [n for n in LIBTPU_NOISE if n in proc.stdout + proc.stderr], proc.stderr[-2000:]
  probe = (
    "from jax.experimental import topologies\n"
    "print(len(topologies.get_topology_desc('v5p:2x2x1', 'tpu').devices))\n"
  )
  bare = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  bare["JAX_PLATFORMS"] = "cpu"
  plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=bare)
  quiet = subprocess.run(
    [sys.executable, "-c", probe],
    capture_output=True,
    text=True,
    env=bare | compile_check.tpu_env("v5p:2x2x1"),
  )
  assert plain.stdout.split() == quiet.stdout.split() == ["4"], plain.stderr + quiet.stderr
  assert any(n in plain.stderr for n in LIBTPU_NOISE), plain.stderr
  assert not [n for n in LIBTPU_NOISE if n in quiet.stderr], quiet.stderr


def test_tpu_env_names_the_slice_and_the_chips_flags():
  env = compile_check.tpu_env("v6e:4x8")
  assert env["TPU_ACCELERATOR_TYPE"] == "v6e-32" and env["TPU_SKIP_MDS_QUERY"] == "1"
  assert env["JAX_PLATFORMS"] == "cpu" and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
  flags = dict(chips_lib.chip_env(chips_lib.CHIPS["v6e"]))["LIBTPU_INIT_ARGS"]
  assert env["LIBTPU_INIT_ARGS"].endswith(flags)
  assert compile_check.tpu_env("v5p:2x2x4")["TPU_ACCELERATOR_TYPE"] == "v5p-32"  # TensorCores
