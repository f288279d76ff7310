"""Each chip's XLA flags and variables (cbert_jax/scaling/chips.py): every planned chip has them,
each with its source; the pinned jaxlib knows every GPU flag; every backend's dry run exports the
chip's (golden lines); `--xla_flags` replaces them and an empty value drops them all; the trainer
records what it ran with (config.json's provenance); docs/launch.md lists them."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from cbert_jax.run import provenance
from cbert_jax.scaling import chips as chips_lib
from launch import backends
from tests.launch_helpers import BACKEND_ARGS, EXP, build, run_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, "docs", "launch.md")
# The chips issue 34 names, and the guides a source must be one of.
NAMED = ("v4", "v5e", "v5p", "v6e", "h100", "h200", "b200")
GUIDES = ("MaxText", "JAX GPU performance tips", "NVIDIA JAX-Toolbox")

# Golden: what the dry run exports, per chip (MaxText's dense recipes for the TPUs; MaxText's A3
# recipes, JAX's tips and JAX-Toolbox for the GPUs).
H100_FLAGS = (
  "--xla_gpu_enable_latency_hiding_scheduler=true "
  "--xla_gpu_all_gather_combine_threshold_bytes=134217728 "
  "--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864 "
  "--xla_gpu_enable_all_gather_combine_by_dim=false "
  "--xla_gpu_enable_reduce_scatter_combine_by_dim=false "
  "--xla_gpu_enable_while_loop_double_buffering=true"
)
B200_FLAGS = H100_FLAGS + " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"
CF_AG = (
  "--xla_tpu_enable_async_collective_fusion=true "
  "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
  "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
  "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
)
DP = (
  "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
  "--xla_tpu_data_parallel_opt_different_sized_ops=true"
)
EXPORTS = {
  "h100": f"export XLA_FLAGS='{H100_FLAGS}'\n"
  "export JAX_OPTIMIZATION_LEVEL=O1\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n",
  "h200": f"export XLA_FLAGS='{H100_FLAGS}'\n"
  "export JAX_OPTIMIZATION_LEVEL=O1\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n",
  "b200": f"export XLA_FLAGS='{B200_FLAGS}'\nexport JAX_OPTIMIZATION_LEVEL=O1\n",
}
LIBTPU = {
  "v4": "--xla_enable_async_all_gather=true",
  "v5e": f"{DP} {CF_AG}",
  "v5p": (
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
    "--xla_tpu_megacore_fusion_allow_ags=false --xla_enable_async_collective_permute=true "
    f"--xla_tpu_enable_ag_backward_pipelining=true {DP} "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
  ),
  "v6e": (
    "--xla_tpu_scoped_vmem_limit_kib=98304 --xla_enable_async_all_gather=true "
    "--xla_tpu_overlap_compute_collective_tc=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
  ),
}
TPU_MEMBER = {"v4": "bert_d384L6", "v5e": "bert_d384L6", "v5p": "bert_d384L6", "v6e": "bert_d512L8"}


def left_out(flag: chips_lib.Flag) -> bool:
  """Whether `flag` is one LEFT_OUT lists (by name, or by its whole text where that has a value)."""
  return any(flag.text == k if "=" in k else flag.name == k for k in chips_lib.LEFT_OUT)


# ------------------------------------------------------------------------ the chip table ---


@pytest.mark.parametrize("key", list(chips_lib.CHIPS))
def test_every_planned_chip_has_its_flags_each_with_a_source(key):
  c = chips_lib.CHIPS[key]
  assert c.xla_flags, key
  names = [f.name for f in (*c.xla_flags, *c.env)]
  assert len(names) == len(set(names)), names  # no flag set twice
  for f in c.xla_flags:  # "--name=value" flags of the chip's compiler
    assert re.fullmatch(r"--xla_[a-z0-9_]+=\S+", f.text), f.text
    assert f.text.startswith("--xla_gpu_" if not c.accelerator else ("--xla_tpu_", "--xla_"))
    assert any(g in f.source for g in GUIDES), (f.text, f.source)
    assert not left_out(f), f.text
  for f in c.env:  # NAME=value variables
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*=\S+", f.text) and any(g in f.source for g in GUIDES)
    assert not left_out(f), f.text
  assert c.flags_var == ("LIBTPU_INIT_ARGS" if c.accelerator else "XLA_FLAGS")
  env = chips_lib.chip_env(c)
  assert env[0] == (c.flags_var, " ".join(f.text for f in c.xla_flags))
  if key in LIBTPU:
    assert env == [("LIBTPU_INIT_ARGS", LIBTPU[key])]  # TPUs: flags only
  if key in EXPORTS:
    assert "".join(f"export {w}\n" for w in backends.export_words(env)) == EXPORTS[key]
  assert all(k in provenance.RECORDED_ENV for k, _ in env)  # the trainer records each one


def test_the_named_chips_follow_their_guides():
  assert set(NAMED) <= set(chips_lib.CHIPS)
  for key in ("v4", "v5e", "v5p", "v6e"):  # MaxText's dense recipe for that generation
    assert {f"configs/tpu/{key}/" in f.source for f in chips_lib.CHIPS[key].xla_flags} == {True}
  hopper = {f.text for f in chips_lib.CHIPS["h100"].env}
  assert hopper == {"JAX_OPTIMIZATION_LEVEL=O1", "CUDA_DEVICE_MAX_CONNECTIONS=1"}
  # Blackwell: CUDA graphs for fusions and custom calls, and no single CUDA queue ("slower").
  b200 = chips_lib.CHIPS["b200"]
  assert "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL" in {f.text for f in b200.xla_flags}
  assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {f.name for f in b200.env}


def test_every_gpu_flag_is_known_to_the_pinned_jaxlib():
  """XLA aborts at start on a flag it does not know ("Unknown flag in XLA_FLAGS"), on every
  platform: the CPU jaxlib here parses the same DebugOptions flags as the CUDA plugin."""
  flags = {f.text for c in chips_lib.CHIPS.values() if not c.accelerator for f in c.xla_flags}
  code = (
    "import jax; print(jax.config.jax_optimization_level); jax.numpy.zeros(1).block_until_ready()"
  )

  def run(xla_flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu", JAX_OPTIMIZATION_LEVEL="O1")
    return subprocess.run(
      [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )

  ok = run(" ".join(sorted(flags)))
  assert ok.returncode == 0 and ok.stdout.strip() == "O1", ok.stderr[-2000:]
  # The check has teeth: the pipelining flag recent XLA renamed to is unknown to this jaxlib.
  bad = run("--xla_gpu_pipeline_all_gather=on")
  assert bad.returncode != 0 and "Unknown flag in XLA_FLAGS" in bad.stderr


def test_docs_list_every_flag_with_its_source():
  text = open(DOCS).read()
  section = text[text.index("## XLA flags per chip") :]
  section = section[: section.index("\n## ", 3)] if "\n## " in section[3:] else section
  for key, c in chips_lib.CHIPS.items():
    for f in (*c.xla_flags, *c.env):
      row = next((ln for ln in section.splitlines() if f"`{f.text}`" in ln), None)
      assert row is not None and key in row, (key, f.text)
  for name in chips_lib.LEFT_OUT:  # what was read and left out, with why
    assert f"`{name}" in section, name


# ---------------------------------------------------------------- every backend's dry run ---


def dry_run(capsys, root, backend: str, *extra: str) -> str:
  rc, out, err = run_main(
    capsys,
    "--config",
    EXP,
    "--backend",
    backend,
    "--workdir_root",
    root,
    *BACKEND_ARGS[backend],
    *extra,
  )
  assert rc == 0, err
  return out


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_slurm_dry_run_exports_the_gpus_flags(tmp_path, capsys, gpu):
  out = dry_run(capsys, tmp_path, "slurm", "--gpu_type", gpu, "--members", "bert_d384L6")
  # In the script: after JAX's memory fraction, before --setup (which can still change them).
  assert (
    'export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"\n'
    f"# {gpu}'s XLA flags and variables (cbert_jax/scaling/chips.py; their sources: "
    "docs/launch.md;\n# launch.sweep --xla_flags replaces the flags, --xla_flags= sets none of "
    "them):\n" + EXPORTS[gpu] + "workdir="
  ) in out
  env = dict(chips_lib.chip_env(chips_lib.CHIPS[gpu]))
  assert f"environment ({gpu}; the chip's XLA flags and variables from" in out
  assert f"): XLA_FLAGS={shlex.quote(env['XLA_FLAGS'])} JAX_OPTIMIZATION_LEVEL=O1" in out


@pytest.mark.parametrize("tpu", ["v4", "v5e", "v5p", "v6e"])
@pytest.mark.parametrize("backend", ["tpu-vm", "xpk"])
def test_tpu_dry_runs_export_the_generations_flags(tmp_path, capsys, backend, tpu):
  member = TPU_MEMBER[tpu]  # a member whose chips are a slice of the generation
  out = dry_run(capsys, tmp_path, backend, "--tpu_generation", tpu, "--members", member)
  export = f"export LIBTPU_INIT_ARGS={shlex.quote(LIBTPU[tpu])}"
  prefix = "  gcloud compute tpus tpu-vm ssh " if backend == "tpu-vm" else "  xpk workload create "
  command = next(ln for ln in out.splitlines() if ln.startswith(prefix))
  remote = shlex.split(command)[-1].removeprefix("--command=")  # what runs on every host / pod
  if backend == "tpu-vm":  # in the code snapshot, then the export, then the setup's checks
    assert remote.startswith("cd ") and remote.split(" && ", 2)[1] == export, remote
  else:  # xpk: in the image's working directory, the export first
    assert remote.startswith(export + " || exit 1; "), remote
  assert f"environment ({tpu}; the chip's XLA flags and variables from" in out
  assert f"): LIBTPU_INIT_ARGS={shlex.quote(LIBTPU[tpu])}\n" in out


def test_xla_flags_replaces_the_chips_flags_and_empty_sets_none(tmp_path, capsys):
  own = "--xla_gpu_enable_latency_hiding_scheduler=false  --xla_dump_to=/tmp/d"
  slurm = ["--config", EXP, "--backend", "slurm", "--members", "bert_d384L6"]
  script = build(tmp_path, *slurm, f"--xla_flags={own}").jobs[0].script
  # Replaced (whitespace normalised), the chip's other variables kept.
  assert (
    "export XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/d'\n"
    "export JAX_OPTIMIZATION_LEVEL=O1\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
  ) in script
  assert H100_FLAGS not in script
  # Empty: none of the chip's flags or variables, and the script says so.
  script = build(tmp_path, *slurm, "--xla_flags=").jobs[0].script
  assert "# No XLA flags or variables of the chip (launch.sweep --xla_flags=).\n" in script
  assert "XLA_FLAGS=" not in script and "JAX_OPTIMIZATION_LEVEL" not in script
  for backend in ("tpu-vm", "xpk"):
    tpu = [
      "--config",
      EXP,
      "--backend",
      backend,
      *BACKEND_ARGS[backend],
      "--members",
      "bert_d384L6",
    ]
    line = build(tmp_path, *tpu, "--xla_flags=--xla_tpu_foo=1").jobs[0].steps[-1][1][-1]
    assert "export LIBTPU_INIT_ARGS=--xla_tpu_foo=1 " in line and LIBTPU["v5p"] not in line
    line = build(tmp_path, *tpu, "--xla_flags=").jobs[0].steps[-1][1][-1]
    assert "LIBTPU_INIT_ARGS" not in line and "export " not in line.split("final=")[0]
  # The dry run shows where the flags came from; the manifest records them.
  rc, out, _ = run_main(capsys, *slurm, "--workdir_root", tmp_path, "--xla_flags=")
  assert rc == 0 and "environment: none of h100's XLA flags or variables (--xla_flags=)" in out
  rc, out, _ = run_main(capsys, *slurm, "--workdir_root", tmp_path, f"--xla_flags={own}")
  assert rc == 0 and "environment (h100; XLA flags from --xla_flags, the other variables" in out
  # local runs with this shell's environment: one error line.
  rc, _, err = run_main(
    capsys, "--config", EXP, "--backend", "local", "--workdir_root", tmp_path, "--xla_flags=x"
  )
  assert rc == 2 and err.startswith("error: --xla_flags: --backend local") and err.count("\n") == 1
  rc, _, err = run_main(capsys, *slurm, "--workdir_root", tmp_path, "--xla_flags=a\nb")
  assert rc == 2 and "--xla_flags=" in err and "line break" in err
  xpk = ["--config", EXP, "--backend", "xpk", *BACKEND_ARGS["xpk"], "--workdir_root", tmp_path]
  rc, _, err = run_main(capsys, *xpk, "--xla_flags=--xla_dump_to=$(HOME)")
  assert rc == 2 and "Kubernetes would expand" in err


def test_the_manifest_records_the_exported_environment(tmp_path):
  from launch import snapshot  # pylint: disable=import-outside-toplevel

  launch = build(tmp_path, "--config", EXP, "--backend", "xpk", *BACKEND_ARGS["xpk"])
  record = snapshot.manifest(launch)
  assert record["chip"] == "v5p"
  assert record["environment"] == {"LIBTPU_INIT_ARGS": LIBTPU["v5p"]}


# ------------------------------------------------------------------ what the trainer records ---


def test_the_trainer_records_the_xla_and_nccl_environment_it_ran_with(tmp_path, monkeypatch):
  for k in list(os.environ):
    if k.startswith("NCCL_") or k in provenance.RECORDED_ENV:
      monkeypatch.delenv(k)
  monkeypatch.setenv("XLA_FLAGS", H100_FLAGS)
  monkeypatch.setenv("JAX_OPTIMIZATION_LEVEL", "O1")
  monkeypatch.setenv("NCCL_IB_HCA", "mlx5")
  monkeypatch.setenv("HOME_SECRET_TOKEN", "not recorded")
  # config.json's provenance (cbert_jax/run/workdir.py write_config_json calls provenance()).
  info = provenance.provenance(repo_dir=tmp_path)
  assert info["environment"] == {
    "JAX_OPTIMIZATION_LEVEL": "O1",
    "NCCL_IB_HCA": "mlx5",
    "XLA_FLAGS": H100_FLAGS,
  }
  assert provenance.recorded_env({"LIBTPU_INIT_ARGS": "--a=1", "PATH": "/bin"}) == {
    "LIBTPU_INIT_ARGS": "--a=1"
  }
