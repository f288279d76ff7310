"""launch.sweep: golden renders per backend, a shared root, and dry runs that start nothing.

Nothing trains: the paper members resolve analytically (no data). The rendered scripts run under a
shell in test_launch_scripts.py; --execute, status and bad input are in test_launch_execute.py;
the three share tests/launch_helpers.py.
"""

import os
import re
import shlex
import subprocess

import pytest

from launch import backends, members, snapshot, sweep
from tests import members as synthetic
from tests.launch_helpers import BACKEND_ARGS, EXP, FIRST, build, job, run_main

# ---------------------------------------------------------------------------------- golden ---


def test_paper_members_and_local_commands(tmp_path):
  root = tmp_path / "sweep"
  launch = build(
    root,
    "--config",
    EXP,
    "--backend",
    "local",
    "--python",
    "python",
    "--override=--config.data.sources=/data/*.jsonl.zst",
  )
  names = [j.member.name for j in launch.jobs]
  assert launch.scale == "paper" and launch.experiment == EXP and len(names) == 17
  assert names[:3] == ["bert_d384L6", "crossbert_d384L6", "bert_d512L8"]
  assert names[-1] == "crossbert_d2304L32" and len(set(names)) == 17
  assert sum(n.startswith("bert_") for n in names) == 8
  j = launch.jobs[0]
  assert backends.shell_join(j.train) == (
    f"python -m cbert_jax.main --config=experiments/sweep.py:{FIRST} "
    f"--workdir={root}/bert_d384L6 --config.data.sources='/data/*.jsonl.zst'"
  )
  assert j.probe == [*j.train, "--config.mode=eval"]
  assert j.steps == [("train", j.train), ("probe", j.probe)]
  assert j.member.target_devices == 8 and j.member.total_steps > 0
  assert job(launch, "crossbert_d2304L32").member.target_devices == 64


SBATCH = r"""#!/bin/bash
#SBATCH --job-name=bert_d384L6
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --output=ROOT/logs/bert_d384L6.log
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --partition=gpu
#SBATCH --account=lab
# bert_d384L6 (scale=paper,model=bert,size=d384L6): SUMMARY.
# Written by launch/sweep.py; the resolved config: ROOT/slurm/bert_d384L6.config.json
# One task per GPU (8 per node, 8 in all): each task sees the node's 8 GPUs
# and JAX's SLURM detection gives task i of a node the GPU numbered SLURM_LOCALID = i.
# Near the time limit SLURM sends USR1 to this script: the running step's tasks get SIGTERM (the
# trainers checkpoint and exit), then the job is requeued and resumes from that checkpoint. A TERM
# to this script (a preemption) stops the step the same way; Slurm requeues a preempted job.
set -uo pipefail
cd ROOT/code/CODE || exit 1
# JAX preallocates 75% of a GPU's memory by default; the memory plan counts on 92% of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
# h100's XLA flags and variables (cbert_jax/scaling/chips.py; their sources: docs/launch.md;
# launch.sweep --xla_flags replaces the flags, --xla_flags= sets none of them):
export XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_all_gather_combine_threshold_bytes=134217728 --xla_gpu_reduce_scatter_combine_threshold_bytes=67108864 --xla_gpu_enable_all_gather_combine_by_dim=false --xla_gpu_enable_reduce_scatter_combine_by_dim=false --xla_gpu_enable_while_loop_double_buffering=true'
export JAX_OPTIMIZATION_LEVEL=O1
export CUDA_DEVICE_MAX_CONNECTIONS=1
source /opt/venv/bin/activate
workdir=ROOT/bert_d384L6
final="$workdir/checkpoints/STEPS"  # the final checkpoint: train is done
cpus=$(( ${SLURM_CPUS_ON_NODE:-8} / 8 ))  # the node's CPUs, split over its 8 tasks
if [ "$cpus" -lt 1 ]; then cpus=1; fi
tasks=(--nodes=1 --ntasks-per-node=8 --cpus-per-task="$cpus" --gpu-bind=none)
one=(--nodes=1 --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}")
step=""  # the running srun's pid
stopping=""
# Signals for the trainers go to the step's tasks through Slurm, never to srun: srun answers SIGTERM
# (and SIGHUP, SIGQUIT) by SIGKILLing its tasks (src/srun/signals.c: "forcing job termination";
# srun(1), --ignore-signals: "SIGTERM Forwarded as SIGKILL"), so no trainer would checkpoint.
# scancel(1): "When --batch is not used but --signal is used, then all job steps will be signaled,
# but the batch script itself will not be signaled" (the same steps Slurm itself signals on a
# preemption). Again each second until srun ends: a trainer can miss one SIGTERM.
stop_step() {
  stopping=1
  [ -n "$step" ] || return 0
  ( while kill -0 "$step" 2>/dev/null; do scancel --signal=TERM "$SLURM_JOB_ID"; sleep 1; done ) &
  while kill -0 "$step" 2>/dev/null; do wait "$step"; done  # the trainers checkpoint and exit
}
on_usr1() {  # --signal=B:USR1@600: the time limit is near
  [ -z "$stopping" ] || return 0
  echo "$(date -Is) USR1: time limit near; checkpointing, then requeueing job $SLURM_JOB_ID"
  stop_step
  scontrol requeue "$SLURM_JOB_ID"  # back to the queue; the rerun resumes from the checkpoint
  exit 0
}
on_term() {  # a preemption or a cancel that reaches this shell
  [ -z "$stopping" ] || return 0
  echo "$(date -Is) TERM: checkpointing before job $SLURM_JOB_ID ends (requeued if preempted)"
  stop_step
  exit 143
}
trap on_usr1 USR1
trap on_term TERM
run_step() {
  srun "$@" &  # in the background: USR1 and TERM run their traps during the wait
  step=$!
  wait "$step"
  local rc=$?
  while kill -0 "$step" 2>/dev/null; do wait "$step"; rc=$?; done
  step=""
  return "$rc"
}
fail() {  # the member's FAILED marker, read by `python -m launch.sweep status`
  echo "slurm job $SLURM_JOB_ID: $1 exited with status $2; log: "ROOT/logs/bert_d384L6.log > "$workdir/FAILED"
  exit "$2"
}
echo "$(date -Is) job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"
mkdir -p "$workdir" && rm -f "$workdir/FAILED"
if [ ! -d "$final" ]; then  # no final checkpoint yet
  run_step "${one[@]}" python -m cbert_jax.data.preprocess --config=experiments/sweep.py:scale=paper,model=bert,size=d384L6 --config.data.sources=/data/c.jsonl --config.sweep.chip=h100 || fail prepare $?  # the data, once
  run_step "${tasks[@]}" python -m cbert_jax.main --config=experiments/sweep.py:scale=paper,model=bert,size=d384L6 --workdir=ROOT/bert_d384L6 --multiprocess --config.data.sources=/data/c.jsonl --config.sweep.chip=h100 || fail train $?
  if [ ! -d "$final" ]; then  # stopped early by a SIGTERM from Slurm (a preemption) or a user
    echo "$(date -Is) train stopped before step STEPS: not probing; launch again to resume"
    exit 0
  fi
fi
run_step "${tasks[@]}" python -m cbert_jax.main --config=experiments/sweep.py:scale=paper,model=bert,size=d384L6 --workdir=ROOT/bert_d384L6 --multiprocess --config.data.sources=/data/c.jsonl --config.sweep.chip=h100 --config.mode=eval || fail probe $?
"""


SLURM_ARGS = (
  "--config",
  EXP,
  "--backend",
  "slurm",
  "--partition",
  "gpu",
  "--account",
  "lab",
  "--time",
  "24:00:00",
  "--signal_seconds",
  "600",
  "--setup",
  "source /opt/venv/bin/activate",
  "--override=--config.data.sources=/data/c.jsonl",
)


def test_slurm_script_golden(tmp_path):
  root = tmp_path / "sweep"
  launch = build(root, *SLURM_ARGS)
  j = job(launch, "bert_d384L6")
  expected = (
    SBATCH.replace("ROOT", str(root))
    .replace("CODE", snapshot.snapshot_id())
    .replace("SUMMARY", j.member.summary())
    .replace("STEPS", str(j.member.total_steps))
  )
  assert j.script == expected
  assert j.script_path == f"{root}/slurm/bert_d384L6.sbatch"
  assert j.steps == [("submit", ["sbatch", j.script_path])]
  assert launch.code_dir == f"{root}/code/{snapshot.snapshot_id()}" and launch.snapshot
  assert len(launch.jobs) == 17
  big = job(launch, "crossbert_d2304L32")  # 64 GPUs: 8 nodes of 8, 64 tasks
  assert "#SBATCH --nodes=8\n#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=8\n" in big.script
  assert '\ntasks=(--nodes=8 --ntasks-per-node=8 --cpus-per-task="$cpus" --gpu-bind=none)\n' in (
    big.script
  )
  assert big.info == {"nodes": 8, "gpus_per_node": 8, "tasks": 64}
  assert "--gpus-per-task" not in big.script  # every task sees all its node's GPUs
  wide = build(root, *SLURM_ARGS, "--gpus_per_node", "4")  # 8 GPUs: 2 nodes of 4, 8 tasks
  assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n" in (
    job(wide, "bert_d384L6").script
  )
  assert "\ntasks=(--nodes=2 --ntasks-per-node=4 " in job(wide, "bert_d384L6").script
  mine = build(root, *SLURM_ARGS, "--code_dir", "/shared/cbert")  # a checkout: no snapshot
  assert not mine.snapshot and "\ncd /shared/cbert || exit 1\n" in mine.jobs[0].script


def wrapper(name: str, workdir: str, steps: int, train: str, probe: str) -> str:
  """The member wrapper line (tpu-vm, xpk), spelled out: the golden text."""
  return (
    f"final={workdir}/checkpoints/{steps}; child=; stop=; "
    'nag() { ( while kill -TERM "$child" 2>/dev/null; do sleep 1; done ) & }; '
    'fwd() { [ -z "$stop" ] || return 0; stop=1; [ -z "$child" ] || nag; }; '
    "trap fwd TERM HUP; "
    'step() { "$@" & child=$!; [ -z "$stop" ] || nag; wait "$child"; rc=$?; '
    'while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done; child=; '
    'return "$rc"; }; '
    f'if [ ! -d "$final" ]; then step {train} || '
    '{ rc=$?; [ -n "$stop" ] || exit "$rc"; }; fi; '
    'if [ ! -d "$final" ]; then '
    f'echo "{name}: train stopped before its final step {steps} (SIGTERM); exit 143: the '
    'next attempt resumes from its checkpoint" >&2; exit 143; fi; '
    f'if [ -n "$stop" ]; then echo "{name}: SIGTERM; exit 143 before the probe: the next '
    'attempt runs it" >&2; exit 143; fi; '
    f"step {probe}"
  )


def test_tpu_vm_commands_golden(tmp_path):
  root = tmp_path / "sweep"
  launch = build(
    root,
    "--config",
    f"{EXP}:paper",
    "--backend",
    "tpu-vm",
    "--zone",
    "us-east5-a",
    "--project",
    "my-proj",
    "--override=--config.data.sources=gs://b/c/*.zst",
  )
  assert len(launch.jobs) == 17
  j = job(launch, "bert_d384L6")
  member = (
    f"--config=experiments/sweep.py:{FIRST} --workdir={root}/bert_d384L6 --multiprocess "
    "--config.data.sources='gs://b/c/*.zst' --config.sweep.chip=v5p"
  )
  venv = (  # the default interpreter: the environment --setup_workers makes (uv's Python 3.11)
    "{ [ -x ~/cbert_jax-venv/bin/python ] || { echo 'no ~/cbert_jax-venv/bin/python on this "
    "worker: launch with --setup_workers (it makes ~/cbert_jax-venv with Python 3.11), or give "
    "--python' >&2; exit 1; }; }"
  )
  v5p = (  # MaxText's v5p dense recipe (src/maxtext/configs/tpu/v5p/llama2_7b.sh)
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
    "--xla_tpu_megacore_fusion_allow_ags=false --xla_enable_async_collective_permute=true "
    "--xla_tpu_enable_ag_backward_pipelining=true "
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
    "--xla_tpu_data_parallel_opt_different_sized_ops=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
  )
  remote = (
    f"cd {root}/code/{snapshot.snapshot_id()} && export LIBTPU_INIT_ARGS='{v5p}' && {venv} "
    "|| exit 1; "
  ) + wrapper(
    "bert_d384L6",
    f"{root}/bert_d384L6",
    j.member.total_steps,
    f"~/cbert_jax-venv/bin/python -m cbert_jax.main {member}",
    f"~/cbert_jax-venv/bin/python -m cbert_jax.main {member} --config.mode=eval",
  )
  assert [k for k, _ in j.steps] == ["ssh"]
  assert backends.shell_join(j.steps[0][1]) == (
    "gcloud compute tpus tpu-vm ssh cbert-bert-d384l6 --zone=us-east5-a --project=my-proj "
    "--worker=all --command=" + shlex.quote(remote)
  )
  assert j.steps[0][1][-1] == "--command=" + remote  # one argv item, no shell needed
  assert j.info["create"] == (
    "gcloud compute tpus tpu-vm create cbert-bert-d384l6 --zone=us-east5-a --project=my-proj "
    "--accelerator-type=v5p-16 --version=v2-alpha-tpuv5"
  )
  big = job(launch, "crossbert_d2304L32")
  assert big.info == {**big.info, "tpu_name": "cbert-crossbert-d2304l32", "tpu_type": "v5p-128"}
  v6e = build(
    root,
    "--config",
    EXP,
    "--backend",
    "tpu-vm",
    "--zone",
    "z",
    "--project",
    "p",
    "--tpu_generation",
    "v6e",
    "--create_tpus",
    "--code_dir",
    "~/cbert_jax",
    "--tpu_prefix",
    "run7-",
    "--members",
    "bert_d1024L16",
    "--setup",
    "source ~/venv/bin/activate",
    "--python",
    "python",
  )
  create, ssh = v6e.jobs[0].steps  # --create_tpus: created, then run
  assert create[0] == "create" and create[1][-2:] == [
    "--accelerator-type=v6e-16",
    "--version=v2-alpha-tpuv6e",
  ]
  assert ssh[1][5] == "run7-bert-d1024l16" and ssh[1][-1].startswith(
    "--command=cd ~/cbert_jax && export LIBTPU_INIT_ARGS='--xla_tpu_scoped_vmem_limit_kib=98304 "
    "--xla_enable_async_all_gather=true --xla_tpu_overlap_compute_collective_tc=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true' && "
    "source ~/venv/bin/activate || exit 1; final="
  )


def test_tpu_vm_setup_workers_installs_the_snapshot_on_every_worker(tmp_path, capsys):
  root = tmp_path / "sweep"
  args = (
    "--config",
    EXP,
    "--backend",
    "tpu-vm",
    "--zone",
    "z",
    "--project",
    "p",
    "--members",
    "bert_d384L6",
    "--setup_workers",
    "--create_tpus",
    "--workdir_root",
    root,
  )
  launch, _ = sweep.build([str(a) for a in args])
  code = f"{root}/code/{snapshot.snapshot_id()}"
  kinds = [k for k, _ in launch.jobs[0].steps]
  assert kinds == ["create", "setup", "ssh"]  # created, set up, then run
  setup = launch.jobs[0].steps[1][1]
  assert setup[:9] == [
    "gcloud",
    "compute",
    "tpus",
    "tpu-vm",
    "ssh",
    "cbert-bert-d384l6",
    "--zone=z",
    "--project=p",
    "--worker=all",
  ]
  assert setup[9] == "--command=" + backends.setup_line(code)
  line = backends.setup_line(code)  # (run under bash in test_launch_scripts.py)
  assert line.startswith(f"rm -rf ~/cbert_jax-src && cp -r {code} ~/cbert_jax-src || exit 1; ")
  assert "uv venv --quiet --python 3.11 ~/cbert_jax-venv;" in line  # uv's Python, not python3
  check, install = line.index("~/cbert_jax-venv/bin/python -c"), line.index("uv pip install")
  assert check < install  # the version check before anything is installed
  assert line.endswith(
    "uv pip install --quiet --python ~/cbert_jax-venv/bin/python ~/'cbert_jax-src[tpu]'"
  )
  rc, out, err = run_main(capsys, *args)  # the dry run shows all three
  assert rc == 0, err
  assert f"--worker=all --command='rm -rf ~/cbert_jax-src && cp -r {code} ~/cbert_jax-src " in out
  assert "  gcloud compute tpus tpu-vm create cbert-bert-d384l6 " in out
  # The setup installs into its own environment, which the members then run: another --python
  # with --setup_workers is refused.
  rc, out, err = run_main(capsys, *args, "--python", "python3")
  assert rc == 2 and err == (
    "error: --python=python3 with --setup_workers: the setup installs into "
    "~/cbert_jax-venv/bin/python (Python 3.11 from uv); leave --python out, or set the workers "
    "up yourself\n"
  )


def test_tpu_type_mapping():
  assert backends.tpu_type("v4", 8) == "v4-16" and backends.tpu_type("v5p", 64) == "v5p-128"
  assert backends.tpu_type("v5e", 8) == "v5litepod-8" and backends.tpu_type("v6e", 256) == "v6e-256"
  assert backends.tpu_type("v5p", 4) == "v5p-8"
  with pytest.raises(members.LaunchError, match=r"--tpu_generation=v5e has no slice of 12 chips"):
    backends.tpu_type("v5e", 12, "m")
  with pytest.raises(members.LaunchError, match=r"whole hosts of 4 chips; target_devices=6"):
    backends.tpu_type("v4", 6, "m")


def test_slurm_time_formats():
  assert backends.slurm_seconds("48:00:00") == 48 * 3600 and backends.slurm_seconds("90") == 5400
  assert backends.slurm_seconds("1:30") == 90 and backends.slurm_seconds("2-00:00:00") == 2 * 86400
  assert (
    backends.slurm_seconds("1-12") == 36 * 3600 and backends.slurm_seconds("1-0:30") == 86400 + 1800
  )
  with pytest.raises(ValueError):
    backends.slurm_seconds("1:2:3:4")


def test_xpk_command_golden_and_names(tmp_path):
  root = tmp_path / "sweep"
  launch = build(
    root,
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "pod1",
    "--docker_image",
    "gcr.io/p/cbert:1",
    "--tpu_generation",
    "v5e",
    "--max_restarts",
    "3",
  )
  assert len(launch.jobs) == 17
  j = job(launch, "bert_d384L6")
  member = (
    f"--config=experiments/sweep.py:{FIRST} --workdir={root}/bert_d384L6 --multiprocess "
    "--config.sweep.chip=v5e"
  )
  v5e = (  # MaxText's v5e dense recipe (src/maxtext/configs/tpu/v5e/llama2_7b.sh)
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true "
    "--xla_tpu_data_parallel_opt_different_sized_ops=true "
    "--xla_tpu_enable_async_collective_fusion=true "
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
    "--xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
  )
  remote = f"export LIBTPU_INIT_ARGS='{v5e}' || exit 1; " + wrapper(
    "bert_d384L6",
    f"{root}/bert_d384L6",
    j.member.total_steps,
    f"python -m cbert_jax.main {member}",
    f"python -m cbert_jax.main {member} --config.mode=eval",
  )
  assert backends.shell_join(j.steps[0][1]) == (
    "xpk workload create --cluster=pod1 --workload=cbert-bert-d384l6 --tpu-type=v5litepod-8 "
    "--num-slices=1 --docker-image=gcr.io/p/cbert:1 --max-restarts=3 "
    "--termination-grace-period-seconds=300 --command=" + shlex.quote(remote)
  )
  assert "\n" not in remote and "$(" not in remote  # one YAML line; no k8s $(VAR) expansion
  assert job(launch, "crossbert_d2304L32").info["tpu_type"] == "v5litepod-64"
  names = [jb.info["workload"] for jb in launch.jobs]
  assert len(set(names)) == 17
  assert all(len(n) <= 40 and re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", n) for n in names)
  long = backends.xpk_names(
    "a-very-long-team-prefix-for-runs-", ["crossbert_d2304L32", "bert_d384L6"]
  )
  assert all(len(n) <= 40 for n in long.values()) and len(set(long.values())) == 2
  assert long["crossbert_d2304L32"].startswith("a-very-long-team-prefix-for-runs-")
  assert re.fullmatch(r".*-[0-9a-f]{6}", long["crossbert_d2304L32"])  # the hash suffix
  same = backends.xpk_names("x-", ["Bert_A", "bert-a"])  # equal once lowercased: suffixed
  assert len(set(same.values())) == 2


# -------------------------------------------------------------------------- shared storage ---


def test_shared_root_holds_workdirs_snapshot_and_data_cache(tmp_path, capsys):
  shared = tmp_path / "shared"
  launch = build_shared(
    shared,
    "--backend",
    "slurm",
    "--members",
    "bert_d384L6,crossbert_d384L6",
    "--override=--config.data.sources=/data/c.jsonl",
  )
  assert launch.root == f"{shared}/sweep_paper" and launch.shared_root == str(shared)
  assert launch.code_dir == f"{shared}/code/{snapshot.snapshot_id()}"  # shared by every sweep
  for j in launch.jobs:
    assert j.member.workdir == f"{shared}/sweep_paper/{j.member.name}"
    assert j.member.config.data.cache_dir == f"{shared}/cache"  # what the trainer gets
    assert f" --config.data.cache_dir={shared}/cache " in f" {backends.shell_join(j.train)} "
    assert f"--config.data.cache_dir={shared}/cache" in j.script  # prepare, train, probe
  assert launch.overrides == [
    f"--config.data.cache_dir={shared}/cache",
    "--override=--config.data.sources=/data/c.jsonl"[11:],
    "--config.sweep.chip=h100",
  ]
  # An explicit --workdir_root and data.cache_dir win.
  mine = build_shared(
    shared,
    "--backend",
    "tpu-vm",
    "--zone",
    "z",
    "--project",
    "p",
    "--workdir_root",
    str(tmp_path / "runs"),
    "--members",
    "bert_d384L6",
    "--override=--config.data.cache_dir=/fast/cache",
  )
  assert mine.root == str(tmp_path / "runs") and mine.overrides == [
    "--config.data.cache_dir=/fast/cache",
    "--config.sweep.chip=v5p",
  ]
  assert mine.code_dir == f"{shared}/code/{snapshot.snapshot_id()}"
  rc, out, err = run_main(capsys, "--config", EXP, "--backend", "local", "--shared_root", shared)
  assert rc == 0, err
  assert f"shared root: {shared} (workdirs {shared}/sweep_paper, data cache {shared}/cache)" in out
  assert not shared.exists()  # a dry run writes nothing


def build_shared(shared, *argv):
  launch, _ = sweep.build(["--config", EXP, "--shared_root", str(shared), *map(str, argv)])
  return launch


def test_xpk_storage_restarts_and_grace_period(tmp_path, capsys):
  shared = tmp_path / "gcs"
  launch = build_shared(
    shared,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--members",
    "bert_d384L6",
    "--xpk_storage",
    "sweep-fuse",
    "--xpk_storage",
    "data-fs",
    "--termination_grace_seconds",
    "900",
  )
  cmd = launch.jobs[0].steps[0][1]
  assert cmd[8:12] == [
    "--max-restarts=10",
    "--termination-grace-period-seconds=900",
    "--storage=sweep-fuse",
    "--storage=data-fs",
  ]  # xpk's defaults: 0 and 30
  assert cmd[-1].startswith("--command=export LIBTPU_INIT_ARGS='--xla_tpu_")  # v5p's flags
  assert f"|| exit 1; final={shared}/sweep_paper/bert_d384L6/checkpoints/" in cmd[-1]
  rc, out, err = run_main(
    capsys,
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--shared_root",
    shared,
    "--override=--config.data.sources=/gcs/c/*.zst",
  )
  assert rc == 0 and err.startswith(f"warning: --shared_root={shared} without --xpk_storage: ")
  assert "--auto-mount=true" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------- dry run ---


@pytest.mark.parametrize("backend", list(BACKEND_ARGS))
def test_dry_run_starts_no_process_and_writes_nothing(tmp_path, monkeypatch, capsys, backend):
  def refuse(*a, **k):
    raise AssertionError(f"the dry run started a process: {a}")

  for mod, name in (
    (subprocess, "Popen"),
    (subprocess, "run"),
    (subprocess, "call"),
    (subprocess, "check_call"),
    (subprocess, "check_output"),
    (os, "system"),
    (os, "posix_spawn"),
    (os, "fork"),
  ):
    monkeypatch.setattr(mod, name, refuse)
  root = tmp_path / "sweep"
  rc, out, err = run_main(
    capsys, "--config", EXP, "--backend", backend, "--workdir_root", root, *BACKEND_ARGS[backend]
  )
  assert rc == 0, err
  assert not root.exists()  # nothing written
  assert "dry run: nothing is started or written" in out and f"{root}/launch_manifest.json" in out
  assert "LR and batch size from: default: DeepSeek LLM (arXiv 2401.02954)" in out  # paper scale
  assert out.count("\n[") == 17 and "[17/17] crossbert_d2304L32 (pending; " in out
  assert {
    "local": "--config.mode=eval",
    "slurm": "#SBATCH --requeue",
    "tpu-vm": "--worker=all",
    "xpk": "--tpu-type=v5p-16",
  }[backend] in out


def test_grid_members_are_trained_never_probed_and_done_at_their_final_checkpoint(tmp_path, capsys):
  """A grid member (sweep.probe False: only its final validation loss counts) gets no probe
  step from any backend, and the dry run and `status` count it done at its final checkpoint;
  a sweep member keeps its probe step."""

  for backend, extra in BACKEND_ARGS.items():
    root = tmp_path / backend
    launch = build(
      root, "--config", "experiments/hparam_grid.py:paper", "--backend", backend, *extra
    )
    j = launch.jobs[0]
    assert not j.member.probes and j.probe == []
    rendered = j.script + "\n".join(backends.shell_join(argv) for _, argv in j.steps)
    assert "cbert_jax.main" in rendered and "--config.mode=eval" not in rendered
    if backend == "local":
      assert [kind for kind, _ in j.steps] == ["train"]
  sweep_job = build(tmp_path / "s", "--config", EXP, "--backend", "local").jobs[0]
  assert sweep_job.member.probes and sweep_job.probe[-1] == "--config.mode=eval"
  assert [kind for kind, _ in sweep_job.steps] == ["train", "probe"]
  # done: the final checkpoint, no probe results (the manifest records it has no probe step)
  root = tmp_path / "local"
  launch = build(root, "--config", "experiments/hparam_grid.py:paper", "--backend", "local")
  first = launch.jobs[0].member
  synthetic.write_member(
    first.workdir,
    synthetic.member_config(total_steps=first.total_steps),
    checkpoints=[first.total_steps],
  )
  rc, out, _ = run_main(
    capsys,
    "--config",
    "experiments/hparam_grid.py:paper",
    "--backend",
    "local",
    "--workdir_root",
    root,
  )
  assert rc == 0 and f"{first.name}: done, skipped (checkpoint of the final step " in out
  assert "and its probe results" not in out
  snapshot.write_files(launch)  # the manifest, as --execute writes it
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root)
  assert rc == 0 and f"{len(launch.jobs)} members, 1 done" in out
