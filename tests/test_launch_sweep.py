"""launch.sweep: golden renders per backend, dry runs that start nothing, a local run, bad flags.

Nothing trains: the paper members resolve analytically (no data), the local run's members are a
fake interpreter that writes what a finished member leaves, and the sbatch script's trap is run
with fake srun / scontrol.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cbert_jax.scaling import status as status_lib
from launch import backends, members, snapshot, sweep
from tests.stubs import simlib

EXP = "experiments/sweep.py"
FIRST = "scale=paper,model=bert,size=d384L6"  # the first paper member, bert_d384L6


def build(root, *argv):
  """Renders a launch (nothing runs) -> the Launch."""
  launch, _ = sweep.build(["--workdir_root", str(root), *argv])
  return launch


def job(launch, name):
  return next(j for j in launch.jobs if j.member.name == name)


def run_main(capsys, *argv):
  """sweep.main in this process -> (exit status, stdout, stderr)."""
  rc = sweep.main([str(a) for a in argv])
  out = capsys.readouterr()
  return rc, out.out, out.err


# ------------------------------------------------------------------ golden ---


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
# Near the time limit SLURM sends USR1 to this script: the running step gets SIGTERM (the trainer
# checkpoints and exits), then the job is requeued and resumes from that checkpoint.
set -uo pipefail
cd ROOT/code/CODE || exit 1
# JAX preallocates 75% of a GPU's memory by default; the memory plan counts on 92% of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
source /opt/venv/bin/activate
workdir=ROOT/bert_d384L6
final="$workdir/checkpoints/STEPS"  # the final checkpoint: train is done
cpus=$(( ${SLURM_CPUS_ON_NODE:-8} / 8 ))  # the node's CPUs, split over its 8 tasks
if [ "$cpus" -lt 1 ]; then cpus=1; fi
tasks=(--nodes=1 --ntasks-per-node=8 --cpus-per-task="$cpus" --gpu-bind=none)
one=(--nodes=1 --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}")
step=""
on_usr1() {
  echo "$(date -Is) USR1: time limit near; checkpointing, then requeueing job $SLURM_JOB_ID"
  if [ -n "$step" ]; then  # srun forwards SIGTERM to its tasks: the trainer checkpoints, exits
    ( while kill -TERM "$step" 2>/dev/null; do sleep 1; done ) &  # each second: one can be missed
    wait "$step"
  fi
  scontrol requeue "$SLURM_JOB_ID"  # back to the queue; the rerun resumes from the checkpoint
  exit 0
}
trap on_usr1 USR1
run_step() {
  srun "$@" &  # in the background: USR1 runs the trap during the wait
  step=$!
  wait "$step"
  local rc=$?
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
  if [ ! -d "$final" ]; then  # stopped early by a SIGTERM that was not our USR1 trap's
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
  remote = f"cd {root}/code/{snapshot.snapshot_id()} || exit 1; " + wrapper(
    "bert_d384L6",
    f"{root}/bert_d384L6",
    j.member.total_steps,
    f"python3 -m cbert_jax.main {member}",
    f"python3 -m cbert_jax.main {member} --config.mode=eval",
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
  )
  create, ssh = v6e.jobs[0].steps  # --create_tpus: created, then run
  assert create[0] == "create" and create[1][-2:] == [
    "--accelerator-type=v6e-16",
    "--version=v2-alpha-tpuv6e",
  ]
  assert ssh[1][5] == "run7-bert-d1024l16" and ssh[1][-1].startswith(
    "--command=cd ~/cbert_jax && source ~/venv/bin/activate || exit 1; final="
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
  copy = f"/tmp/cbert_jax-{snapshot.snapshot_id()}"
  assert setup[9] == (
    f"--command=rm -rf {copy} && cp -r {code} {copy} && "
    f"python3 -m pip install --quiet '{copy}[tpu]'"
  )
  rc, out, err = run_main(capsys, *args)  # the dry run shows all three
  assert rc == 0, err
  assert f"--worker=all --command='rm -rf {copy} && cp -r {code} {copy} && python3 -m pip " in out
  assert "  gcloud compute tpus tpu-vm create cbert-bert-d384l6 " in out


def test_tpu_type_mapping():
  assert backends.tpu_type("v4", 8) == "v4-16" and backends.tpu_type("v5p", 64) == "v5p-128"
  assert backends.tpu_type("v5e", 8) == "v5litepod-8" and backends.tpu_type("v6e", 256) == "v6e-256"
  assert backends.tpu_type("v5p", 4) == "v5p-8"
  with pytest.raises(members.LaunchError, match=r"--tpu_generation=v5e has no slice of 12 chips"):
    backends.tpu_type("v5e", 12, "m")
  with pytest.raises(members.LaunchError, match=r"whole hosts of 4 chips; target_devices=6"):
    backends.tpu_type("v4", 6, "m")


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
  remote = wrapper(
    "bert_d384L6",
    f"{root}/bert_d384L6",
    j.member.total_steps,
    f"python -m cbert_jax.main {member}",
    f"python -m cbert_jax.main {member} --config.mode=eval",
  )
  assert backends.shell_join(j.steps[0][1]) == (
    "xpk workload create --cluster=pod1 --workload=cbert-bert-d384l6 --tpu-type=v5litepod-8 "
    "--num-slices=1 --docker-image=gcr.io/p/cbert:1 --max-restarts=3 "
    "--termination-grace-period-seconds=300 --command='" + remote + "'"
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


# ------------------------------------------------------- storage, quoting ---


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
  assert cmd[-1].startswith(f"--command=final={shared}/sweep_paper/bert_d384L6/checkpoints/")
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


def sbatch_words(line: str) -> list[str]:
  """An #SBATCH line's words as sbatch reads them (src/sbatch/opt.c _get_argument: quotes group,
  a backslash escapes the next character, an unescaped # outside quotes ends the line)."""
  words, i, n = [], len("#SBATCH"), len(line)
  while True:
    while i < n and line[i].isspace():
      i += 1
    if i >= n:
      return words
    word, quote, escape = "", "", False
    while i < n and (quote or not line[i].isspace()):
      c = line[i]
      i += 1
      if escape:
        escape = False
      elif c == "\\":
        escape = True
        continue
      elif quote:
        if c == quote:
          quote = ""
          continue
      elif c in "\"'":
        quote = c
        continue
      elif c == "#":
        return words + ([word] if word else [])
      word += c
    words.append(word)


@pytest.mark.parametrize(
  "flag, value",
  [
    ("--partition", "gpu a100#1"),
    ("--account", 'lab "x" \\y'),
    ("--account", "it's"),
    ("--partition", "gpu,gpu-long"),
  ],
)
def test_sbatch_values_are_read_back_as_given(tmp_path, flag, value):
  root = tmp_path / "my runs #2"  # a space and a # in the path
  launch = build(
    root, "--config", EXP, "--backend", "slurm", "--members", "bert_d384L6", flag, value
  )
  lines = {
    sbatch_words(l)[0].split("=", 1)[0]: sbatch_words(l)[0].split("=", 1)[1]
    for l in launch.jobs[0].script.splitlines()
    if l.startswith("#SBATCH ") and "=" in l
  }
  assert lines[flag] == value
  assert lines["--output"] == f"{root}/logs/bert_d384L6.log"
  assert lines["--job-name"] == "bert_d384L6"
  if value == "gpu,gpu-long":  # plain values stay unquoted
    assert f"#SBATCH {flag}=gpu,gpu-long\n" in launch.jobs[0].script


def test_snapshot_holds_an_experiment_file_outside_experiments(tmp_path):
  launch = build(
    tmp_path / "r",
    "--config",
    "tests/data/launch_member.py:sim2",
    "--backend",
    "slurm",
    "--gpus_per_node",
    "2",
  )
  assert launch.snapshot_extra == ("tests/data/launch_member.py",)
  assert "tests/data/launch_member.py" in snapshot.snapshot_files(
    members.REPO, launch.snapshot_extra
  )
  assert launch.code_dir.endswith(snapshot.snapshot_id(members.REPO, launch.snapshot_extra))
  assert snapshot.snapshot_id(members.REPO, launch.snapshot_extra) != snapshot.snapshot_id()
  snapshot.write_snapshot(str(tmp_path / "snap"), members.REPO, launch.snapshot_extra)
  assert (tmp_path / "snap" / "tests" / "data" / "launch_member.py").is_file()
  assert not (tmp_path / "snap" / "tests" / "data" / "tiny_corpus.txt").exists()


# --------------------------------------------------------- the member wrapper ---


FAKE_MEMBER = r"""#!/bin/bash
# A trainer stand-in for the member wrapper: probe returns at once; train ends at once (FINISH:
# with its final checkpoint; TRAIN_RC: with that status) or runs until SIGTERM, then "checkpoints"
# and exits 0, as the trainer does.
case "$*" in *--config.mode=eval*) echo probe >> "$EVENTS"; exit 0;; esac
echo "train $$" >> "$EVENTS"
if [ -n "${TRAIN_RC:-}" ]; then exit "$TRAIN_RC"; fi
if [ -n "${FINISH:-}" ]; then mkdir -p "$FINAL"; exit 0; fi
ignore=${IGNORE_TERM:-0}   # miss that many SIGTERMs, as the trainer can (start-up, stop vote)
trap 'if [ "$ignore" -gt 0 ]; then ignore=$((ignore - 1)); echo ignored >> "$EVENTS"; else stopping=1; fi' TERM
if [ -n "${RUN_FOR:-}" ]; then      # train on to the end, whatever comes
  for i in $(seq "$RUN_FOR"); do sleep 0.1; done
  mkdir -p "$FINAL"; exit 0
fi
for i in $(seq 300); do
  if [ -n "${stopping:-}" ]; then echo checkpoint >> "$EVENTS"; exit 0; fi
  sleep 0.1
done
"""


def wrapper_run(tmp_path, shell: list[str], naive: bool = False, **env_extra):
  """The tpu-vm/xpk member command (or the old `cd X && train && probe`) under `shell`, with the
  fake trainer; -> (process, events file, member)."""
  (tmp_path / "fake.sh").write_text(FAKE_MEMBER)
  launch = build(
    tmp_path / "sweep",
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--members",
    "bert_d384L6",
    "--code_dir",
    str(tmp_path),
    "--python",
    f"bash {tmp_path / 'fake.sh'}",
  )
  j = launch.jobs[0]
  command = j.steps[0][1][-1][len("--command=") :]
  if naive:  # what the launcher rendered before
    command = f"cd {tmp_path} && {backends.shell_join(j.train)} && {backends.shell_join(j.probe)}"
  events = tmp_path / "events"
  env = dict(
    os.environ,
    EVENTS=str(events),
    FINAL=f"{j.member.workdir}/checkpoints/{j.member.total_steps}",
    **env_extra,
  )
  script = shell[-1].format(command=command, poll=0.1) if "{command}" in shell[-1] else command
  proc = subprocess.Popen(
    [*shell[:-1], script],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  return proc, events, j.member


SHELLS = {
  "bash": ["bash", "-c", "{command}"],
  "sh": ["sh", "-c", "{command}"],
  "xpk pod": ["bash", "-c", simlib.XPK_CONTAINER],
}


def wait_events(proc, events, what: str) -> list[str]:
  deadline = time.time() + 20
  while not any(e.startswith(what) for e in read_events(events)):
    assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
    time.sleep(0.05)
  return read_events(events)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shell", list(SHELLS))
def test_member_wrapper_forwards_sigterm_and_does_not_probe_an_unfinished_run(tmp_path, shell):
  proc, events, member = wrapper_run(tmp_path, SHELLS[shell])
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)  # Kubernetes / a preemption: the pod's PID 1
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == backends.STOPPED_EXIT == 143, out  # xpk restarts on 42 and 127-255
  assert [e.split()[0] for e in read_events(events)] == ["train", "checkpoint"]  # no probe
  assert (
    f"bert_d384L6: train stopped before its final step {member.total_steps} (SIGTERM); "
    "exit 143: the next attempt resumes from its checkpoint"
  ) in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shell", ["xpk pod", "sh"])
def test_a_missed_sigterm_is_sent_again(tmp_path, shell):
  proc, events, _ = wrapper_run(tmp_path, SHELLS[shell], IGNORE_TERM="2")
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)  # once, as Kubernetes does
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 143, out  # missed twice, caught the third: stopped
  assert [e.split()[0] for e in read_events(events)] == [
    "train",
    "ignored",
    "ignored",
    "checkpoint",
  ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_sigterm_the_trainer_never_heeds_still_skips_the_probe(tmp_path):
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], IGNORE_TERM="1000", RUN_FOR="15")
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=20)  # the train finished all the same:
  assert proc.returncode == 143, out  # no probe in a pod being stopped
  assert [e.split()[0] for e in read_events(events)][:2] == ["train", "ignored"]
  assert "probe" not in read_events(events)
  assert "bert_d384L6: SIGTERM; exit 143 before the probe: the next attempt runs it" in out
  events.unlink()
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], RUN_FOR="15")  # the restart
  assert proc.wait(timeout=20) == 0 and read_events(events) == ["probe"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_old_pod_command_never_told_the_trainer(tmp_path):
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], naive=True)
  pid = int(wait_events(proc, events, "train")[0].split()[1])
  proc.send_signal(signal.SIGTERM)
  try:
    assert proc.wait(timeout=20) == 143  # the pod ends (its output pipe stays
    # open: the trainer still holds it) ...
    time.sleep(0.5)
    assert read_events(events) == [f"train {pid}"]  # ... but the trainer never got SIGTERM:
    os.kill(pid, 0)  # still running, to be SIGKILLed unsaved
  finally:
    os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "env, rc, expected",
  [
    ({"FINISH": "1"}, 0, ["train", "probe"]),  # finished: probed
    ({"TRAIN_RC": "2"}, 2, ["train"]),  # a config error: its status, no restart
  ],
)
def test_member_wrapper_outcomes(tmp_path, env, rc, expected):
  proc, events, member = wrapper_run(tmp_path, SHELLS["sh"], **env)
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == rc, out
  assert [e.split()[0] for e in read_events(events)] == expected
  if rc == 0:  # run again (a restart during the probe):
    events.unlink()  # the finished train is not run again
    proc, events, _ = wrapper_run(tmp_path, SHELLS["sh"], **env)
    assert proc.wait(timeout=20) == 0 and read_events(events) == ["probe"]


# ----------------------------------------------------------------- dry run ---


BACKEND_ARGS = {
  "local": [],
  "slurm": [],
  "tpu-vm": ["--zone", "z", "--project", "p"],
  "xpk": ["--cluster", "c", "--docker_image", "img"],
}


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
  assert out.count("\n[") == 17 and "[17/17] crossbert_d2304L32 (pending; " in out
  assert {
    "local": "--config.mode=eval",
    "slurm": "#SBATCH --requeue",
    "tpu-vm": "--worker=all",
    "xpk": "--tpu-type=v5p-16",
  }[backend] in out


# --------------------------------------------------------- local --execute ---


FAKE = r"""
import json, os, sys
# A stand-in for `python -m cbert_jax.main`: a member's train or probe, in milliseconds.
flags = dict(a.split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
workdir, arg = flags["--workdir"], flags["--config"].split(":", 1)[1]
name = os.path.basename(workdir)
here = os.path.dirname(os.path.abspath(__file__))
mode = flags.get("--config.mode", "train")
with open(os.path.join(here, "calls.txt"), "a") as f:
  f.write(f"{name} {mode}\n")
if os.path.exists(os.path.join(here, "fail_" + name)):
  print("I0101 train.py] some log line", file=sys.stderr)
  print("config error: planted failure", file=sys.stderr)
  print("W0101 a warning after it", file=sys.stderr)
  sys.exit(2)
os.makedirs(workdir, exist_ok=True)
if mode == "eval":
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  with open(os.path.join(workdir, "eval", "step_4.json"), "w") as f:
    json.dump({"suite": "offline"}, f)
else:
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"config": {"total_steps": 4}}, f)
  os.makedirs(os.path.join(workdir, "checkpoints", "4"), exist_ok=True)
  print(f"{name}: step 4/4")
"""

TRIO = "bert_d32L2,crossbert_d32L2,bert_d64L2"


def local_sweep(capsys, tmp_path, root):
  return run_main(
    capsys,
    "--config",
    f"{EXP}:quick",
    "--backend",
    "local",
    "--workdir_root",
    root,
    "--members",
    TRIO,
    "--parallel",
    "2",
    "--execute",
    "--python",
    f"{sys.executable} {tmp_path / 'fake.py'}",
    "--override=--config.log_every=5",
  )


def calls(tmp_path) -> list[str]:
  return sorted((tmp_path / "calls.txt").read_text().splitlines())


def test_local_execute_runs_members_in_parallel_marks_failures_and_skips_done(tmp_path, capsys):
  (tmp_path / "fake.py").write_text(FAKE)
  (tmp_path / "fail_bert_d64L2").write_text("")
  root = tmp_path / "sweep"
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 1 and "1 of 3 members failed: bert_d64L2" in err
  assert calls(tmp_path) == [
    "bert_d32L2 eval",
    "bert_d32L2 train",
    "bert_d64L2 train",
    "crossbert_d32L2 eval",
    "crossbert_d32L2 train",
  ]
  states = {n: status_lib.member_state(n, str(root / n)).state for n in TRIO.split(",")}
  assert states == {"bert_d32L2": "done", "crossbert_d32L2": "done", "bert_d64L2": "failed"}
  assert (root / "bert_d64L2" / "FAILED").read_text() == "train: config error: planted failure\n"
  log = (root / "logs" / "bert_d32L2.log").read_text()
  assert "bert_d32L2: step 4/4" in log and log.count("==== ") == 2  # train and probe, headed
  assert "train: " in log and "--config.log_every=5 --config.mode=eval" in log
  assert "W0101 a warning after it" in (root / "logs" / "bert_d64L2.log").read_text()
  manifest = json.loads((root / "launch_manifest.json").read_text())
  assert manifest["backend"] == "local" and manifest["scale"] == "quick"
  assert manifest["experiment"] == EXP and manifest["overrides"] == ["--config.log_every=5"]
  assert [m["name"] for m in manifest["members"]] == TRIO.split(",")
  first = manifest["members"][0]
  assert first["workdir"] == str(root / "bert_d32L2") and first["target_devices"] == 0
  assert first["commands"]["probe"].endswith("--config.mode=eval")
  assert first["arg"] == "scale=quick,model=bert,size=d32L2" and first["script"] == ""

  rc, out, err = run_main(capsys, "status", "--workdir_root", root)
  assert rc == 0 and "3 members, 2 done, 0 running, 0 pending, 1 failed" in out
  rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
  assert rows["bert_d32L2"][:2] == ["done", "4/4"] and rows["bert_d64L2"][0] == "failed"
  row = next(line for line in out.splitlines() if line.startswith("bert_d64L2 "))
  assert row.endswith("train: config error: planted failure")
  # the FLOPs done: the two finished members' share of the manifest's planned compute
  manifest = json.loads((root / "launch_manifest.json").read_text())
  c = {m["name"]: m["compute"] for m in manifest["members"]}
  share = 100 * (c["bert_d32L2"] + c["crossbert_d32L2"]) / sum(c.values())
  assert (
    out.splitlines()[-1]
    == f"now: {share:.1f}% of the sweep's {sum(c.values()):.3g} training FLOPs done"
  )

  (tmp_path / "calls.txt").unlink()  # a rerun: only the failed member runs
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 1 and calls(tmp_path) == ["bert_d64L2 train"]
  assert "bert_d32L2: done, skipped" in out and "crossbert_d32L2: done, skipped" in out

  (tmp_path / "fail_bert_d64L2").unlink()  # fixed: the rerun finishes it
  (tmp_path / "calls.txt").unlink()
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 0, err
  assert calls(tmp_path) == ["bert_d64L2 eval", "bert_d64L2 train"]
  assert not (root / "bert_d64L2" / "FAILED").exists()
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root)
  assert "3 members, 3 done" in out


def test_a_member_that_looks_running_is_skipped_unless_asked(tmp_path, capsys):
  (tmp_path / "fake.py").write_text(FAKE)
  root = tmp_path / "sweep"
  (root / "bert_d32L2").mkdir(parents=True)
  (root / "bert_d32L2" / "metrics.jsonl").write_text("{}\n")  # just written: another trainer?
  args = (
    "--config",
    f"{EXP}:quick",
    "--backend",
    "local",
    "--workdir_root",
    root,
    "--members",
    "bert_d32L2",
    "--execute",
    "--python",
    f"{sys.executable} {tmp_path / 'fake.py'}",
  )
  rc, out, _ = run_main(capsys, *args)
  assert rc == 0
  assert "bert_d32L2: running (metrics.jsonl written in the last 10 min), skipped" in out
  assert not (tmp_path / "calls.txt").exists()
  rc, out, _ = run_main(capsys, *args, "--include_running")
  assert rc == 0 and calls(tmp_path) == ["bert_d32L2 eval", "bert_d32L2 train"]


def test_slurm_execute_writes_snapshot_scripts_configs_and_submits(tmp_path, capsys):
  root = tmp_path / "sweep"
  fake_sbatch = (
    f"{sys.executable} -c "  # prints what sbatch prints
    "'import sys; print(\"Submitted batch job 7 for\", sys.argv[1])'"
  )
  args = (
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--workdir_root",
    root,
    "--members",
    "bert_d384L6,crossbert_d384L6",
    "--sbatch",
    fake_sbatch,
    "--execute",
  )
  rc, out, err = run_main(capsys, *args)  # no corpus given: refused
  assert rc == 2 and "data.sources is empty for 2 member(s)" in err and not root.exists()
  rc, out, err = run_main(capsys, *args, "--override=--config.data.sources=/data/dclm/*.jsonl.zst")
  assert rc == 0, err
  script = root / "slurm" / "bert_d384L6.sbatch"
  assert f"bert_d384L6: Submitted batch job 7 for {script}" in out
  assert os.access(script, os.X_OK) and (root / "logs").is_dir()
  config = json.loads((root / "slurm" / "bert_d384L6.config.json").read_text())
  assert config["arg"] == FIRST and config["config"]["sweep"]["target_devices"] == 8
  code = root / "code" / snapshot.snapshot_id()
  for rel in ("cbert_jax/main.py", "experiments/sweep.py", "launch/sweep.py", "pyproject.toml"):
    assert (code / rel).read_bytes() == (pathlib.Path(members.REPO) / rel).read_bytes()
  assert not list(code.rglob("__pycache__"))
  manifest = json.loads((root / "launch_manifest.json").read_text())
  assert manifest["code_dir"] == str(code) and manifest["members"][0]["script"] == str(script)
  assert manifest["members"][0]["launch"][0].endswith(f" {script}")  # the sbatch command
  # A later launch of other members keeps these in the manifest; another scale is refused.
  rc, out, err = run_main(
    capsys,
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--workdir_root",
    root,
    "--members",
    "bert_d512L8",
    "--sbatch",
    fake_sbatch,
    "--execute",
    "--override=--config.data.sources=/data/dclm/*.jsonl.zst",
  )
  assert rc == 0 and "(exists: same code)" in out
  names = [m["name"] for m in json.loads((root / "launch_manifest.json").read_text())["members"]]
  assert names == ["bert_d384L6", "crossbert_d384L6", "bert_d512L8"]
  rc, out, err = run_main(
    capsys, "--config", f"{EXP}:cpu", "--backend", "local", "--workdir_root", root
  )
  assert rc == 2 and err == (
    f"error: --workdir_root={root} holds a paper sweep "
    "(launch_manifest.json); this is the cpu sweep: use another "
    "--workdir_root\n"
  )


# -------------------------------------------------------- the sbatch trap ---


FAKE_TRAIN = r"""#!/bin/bash
# A member step under a fake srun: prepare and probe return at once; train waits to be stopped,
# fails (TRAIN_FAILS), or ends at once (TRAIN_ENDS=final: with its final checkpoint; =early: without).
case "$*" in *cbert_jax.data.preprocess*) echo prepare >> "$EVENTS"; exit 0;; esac
case "$*" in *--config.mode=eval*) echo probe >> "$EVENTS"; exit 0;; esac
if [ -n "${TRAIN_FAILS:-}" ]; then echo "config error: planted" >&2; exit 3; fi
if [ -n "${TRAIN_ENDS:-}" ]; then
  echo "train $TRAIN_ENDS" >> "$EVENTS"
  if [ "$TRAIN_ENDS" = final ]; then mkdir -p "$FINAL"; fi
  exit 0
fi
trap 'echo term >> "$EVENTS"; kill $sleeper; exit 0' TERM
echo started >> "$EVENTS"
sleep 30 & sleeper=$!
wait $sleeper
"""


def sbatch_run(tmp_path, **env_extra):
  """The first paper member's sbatch script under bash, with fake srun and scontrol."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  (bindir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
  (bindir / "scontrol").write_text('#!/bin/bash\necho "scontrol $*" >> "$EVENTS"\n')
  (tmp_path / "train.sh").write_text(FAKE_TRAIN)
  for f in ("srun", "scontrol"):
    os.chmod(bindir / f, 0o755)
  launch = build(
    tmp_path / "sweep",
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--members",
    "bert_d384L6",
    "--code_dir",
    str(tmp_path),
    "--python",
    f"bash {tmp_path / 'train.sh'}",
  )
  member = launch.jobs[0].member
  script = tmp_path / "job.sbatch"
  script.write_text(launch.jobs[0].script)
  events = tmp_path / "events"
  env = dict(
    os.environ,
    PATH=f"{bindir}:{os.environ['PATH']}",
    EVENTS=str(events),
    SLURM_JOB_ID="42",
    SLURM_JOB_NODELIST="node1",
    FINAL=f"{member.workdir}/checkpoints/{member.total_steps}",
    **env_extra,
  )
  proc = subprocess.Popen(
    ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  return proc, events, member.workdir


def read_events(events) -> list[str]:
  return events.read_text().splitlines() if events.exists() else []


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_usr1_stops_the_step_and_requeues(tmp_path):
  proc, events, _ = sbatch_run(tmp_path)
  deadline = time.time() + 20
  while "started" not in read_events(events):
    assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
    time.sleep(0.05)
  proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 sends
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 0, out
  # the data once (a sources corpus), then train; stopped and requeued; no probe
  assert read_events(events) == ["prepare", "started", "term", "scontrol requeue 42"]
  assert "USR1: time limit near" in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_failing_step_writes_the_failed_marker(tmp_path):
  proc, events, workdir = sbatch_run(tmp_path, TRAIN_FAILS="1")
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 3, out
  assert read_events(events) == ["prepare"]  # no probe, no requeue
  marker = open(os.path.join(workdir, "FAILED")).read()
  assert marker.startswith("slurm job 42: train exited with status 3; log: ")
  assert status_lib.member_state("bert_d384L6", workdir).state == "failed"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "ends, expected",
  [
    ("final", ["prepare", "train final", "probe"]),  # finished: probed
    ("early", ["prepare", "train early"]),  # stopped by someone else's SIGTERM
  ],
)
def test_sbatch_probes_only_a_finished_train(tmp_path, ends, expected):
  proc, events, workdir = sbatch_run(tmp_path, TRAIN_ENDS=ends)
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 0, out
  assert read_events(events) == expected
  assert ("not probing; launch again to resume" in out) == (ends == "early")
  assert not os.path.exists(os.path.join(workdir, "FAILED"))


# ------------------------------------------------------------ status input ---


def test_status_reads_the_runner_manifest_or_member_directories(tmp_path, capsys):
  root = tmp_path / "sweep"
  for name in ("bert_d32L2", "crossbert_d32L2"):
    (root / name / "checkpoints" / "2").mkdir(parents=True)
    (root / name / "config.json").write_text(json.dumps({"config": {"total_steps": 4}}))
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root)
  assert rc == 0 and "(member directories): 2 members, 0 done, 0 running, 2 pending" in out
  assert "bert_d32L2       pending  2/4" in out
  (root / "sweep.json").write_text(
    json.dumps({"scale": "cpu", "members": [{"name": "bert_d32L2"}, {"name": "bert_d64L2"}]})
  )
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root, "--no-probe")
  assert rc == 0 and "(sweep.json): 2 members" in out and "bert_d64L2  pending  0/?" in out
  rc, _, err = run_main(capsys, "status", "--workdir_root", tmp_path / "nope")
  assert rc == 2 and err.startswith("error: --workdir_root=")


# --------------------------------------------------------------- bad input ---


@pytest.mark.parametrize(
  "argv, message",
  [
    (
      ["--backend", "slurm", "--gpus_per_node", "3"],
      "error: --gpus_per_node=3 does not divide target_devices=8 of member bert_d384L6",
    ),
    (
      ["--backend", "slurm", "--time", "2 days"],
      "error: --time=2 days: expected a SLURM time (e.g. 48:00:00 or 2-00:00:00)",
    ),
    (
      ["--backend", "slurm", "--time", "5:00"],
      "error: --signal_seconds=300 must be in 1..65535 and below --time=5:00 (300 s)",
    ),
    (["--backend", "tpu-vm", "--project", "p"], "error: --backend tpu-vm needs --zone"),
    (["--backend", "tpu-vm"], "error: --backend tpu-vm needs --zone and --project"),
    (
      ["--backend", "tpu-vm", "--zone", "z", "--project", "p", "--tpu_prefix", "Big_"],
      "error: --tpu_prefix='Big_': must start with a lowercase letter and hold only [a-z0-9-]",
    ),
    (["--backend", "xpk", "--docker_image", "i"], "error: --backend xpk needs --cluster"),
    (["--backend", "xpk", "--cluster", "c"], "error: --backend xpk needs --docker_image"),
    (
      ["--backend", "local", "--members", "bert_d384L6,gpt_d1"],
      "error: --members: gpt_d1 not in the paper sweep; its members: bert_d384L6, ",
    ),
    (["--backend", "local", "--parallel", "0"], "error: --parallel=0 must be >= 1"),
    (
      ["--backend", "local", "--override=--config.batchsize=3"],
      "error: --override=--config.batchsize=3: unknown config field 'batchsize'",
    ),
    (
      ["--backend", "local", "--override=--config.total_steps=many"],
      "error: --override=--config.total_steps=many: expected int, got 'many'",
    ),
    (
      ["--backend", "local", "--override=--workdir=/x"],
      "error: --override=--workdir=/x: the launcher sets --config, --workdir",
    ),
    (
      ["--backend", "local", "--override=config.seed=1"],
      "error: --override=config.seed=1: expected a trainer flag",
    ),
    # A line break would end the #SBATCH line, the script comment or the pod's one-line command.
    (
      ["--backend", "slurm", "--partition", "gpu\n#SBATCH --qos=high"],
      "error: --partition='gpu\\n#SBATCH --qos=high': holds a line break or control character;",
    ),
    (["--backend", "slurm", "--account", "lab\r"], "error: --account='lab\\r': holds a line break"),
    (
      ["--backend", "slurm", "--setup", "module load cuda\nrm -rf /"],
      "error: --setup='module load cuda\\nrm -rf /': holds a line break",
    ),
    (["--backend", "slurm", "--shared_root", "/shared\nx"], "error: --shared_root='/shared\\nx'"),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i\n"],
      "error: --docker_image='i\\n': holds a line break",
    ),
    (
      ["--backend", "tpu-vm", "--zone", "z", "--project", "p", "--python", "python3\nid"],
      "error: --python='python3\\nid': holds a line break",
    ),
    (
      ["--backend", "local", "--override=--config.name=a\nb"],
      "error: --override='--config.name=a\\nb': holds a line break",
    ),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i", "--xpk_storage", "My_Fs"],
      "error: --xpk_storage='My_Fs': expected an xpk storage name",
    ),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i", "--max_restarts", "-1"],
      "error: --max_restarts=-1 must be >= 0",
    ),
    (
      [
        "--backend",
        "xpk",
        "--cluster",
        "c",
        "--docker_image",
        "i",
        "--termination_grace_seconds",
        "0",
      ],
      "error: --termination_grace_seconds=0 must be >= 1",
    ),
  ],
)
def test_bad_flags_are_one_error_line(tmp_path, capsys, argv, message):
  rc, out, err = run_main(capsys, "--config", EXP, "--workdir_root", tmp_path / "r", *argv)
  assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err
  assert out == "" and not (tmp_path / "r").exists()  # nothing rendered, nothing written


@pytest.mark.parametrize(
  "config, message",
  [
    (f"{EXP}:cpu", "error: member bert_d32L2 has target_devices=0 (planned for this machine)"),
    (
      f"{EXP}:model=bert,size=d384L6",
      "error: --config=experiments/sweep.py:model=bert,size=d384L6:"
      " 'model=bert,size=d384L6' is one member",
    ),
    (f"{EXP}:auto", "error: --config=experiments/sweep.py:auto: the launcher needs a scale"),
    ("experiments/nope.py", "error: --config=experiments/nope.py: no such experiment file"),
    (f"{EXP}:scale=huge", "config error: experiments/sweep.py: scale must be one of"),
  ],
)
def test_bad_configs(tmp_path, capsys, config, message):
  rc, out, err = run_main(
    capsys, "--config", config, "--backend", "slurm", "--workdir_root", tmp_path / "r"
  )
  assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_a_workdir_root_or_shared_root_is_required(capsys):
  rc, out, err = run_main(capsys, "--config", EXP, "--backend", "slurm")
  assert (
    rc == 2
    and out == ""
    and err
    == (
      "error: --workdir_root: required, or --shared_root (the workdirs then go to "
      "<shared_root>/<experiment>_<scale>)\n"
    )
  )


def test_argparse_rejects_an_unknown_backend(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    sweep.main(["--config", EXP, "--backend", "k8s", "--workdir_root", str(tmp_path)])
  assert e.value.code == 2 and "invalid choice: 'k8s'" in capsys.readouterr().err


def test_slurm_time_formats():
  assert backends.slurm_seconds("48:00:00") == 48 * 3600 and backends.slurm_seconds("90") == 5400
  assert backends.slurm_seconds("1:30") == 90 and backends.slurm_seconds("2-00:00:00") == 2 * 86400
  assert (
    backends.slurm_seconds("1-12") == 36 * 3600 and backends.slurm_seconds("1-0:30") == 86400 + 1800
  )
  with pytest.raises(ValueError):
    backends.slurm_seconds("1:2:3:4")


def test_members_are_planned_for_the_backends_chip_and_too_big_ones_are_refused(
  tmp_path, capsys, monkeypatch
):
  # slurm plans for --gpu_type, tpu-vm / xpk for --tpu_generation; the summary shows the plan.
  launch = build(
    tmp_path / "a",
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--gpu_type",
    "h200",
    "--override=--config.data.sources=/data/c.jsonl",
  )
  c = job(launch, "crossbert_d2304L32").member.config
  assert c.sweep.chip == "h200" and c.sweep.memory_verdict == "fits"
  assert "memory on h200: remat=" in job(launch, "crossbert_d2304L32").member.summary()
  assert "--config.sweep.chip=h200" in job(launch, "bert_d384L6").train
  # A chip too small for any setting: a warning in the dry run, --execute refuses (exit 2).
  import dataclasses  # pylint: disable=import-outside-toplevel

  from cbert_jax.scaling import memory  # pylint: disable=import-outside-toplevel

  monkeypatch.setitem(memory.CHIPS, "v5e", dataclasses.replace(memory.CHIPS["v5e"], hbm=2**30))
  args = (
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--tpu_generation",
    "v5e",
    "--workdir_root",
    tmp_path / "b",
    "--override=--config.data.sources=/data/c.jsonl",
  )
  rc, out, err = run_main(capsys, *args)
  assert (
    rc == 0
    and "do not fit their chips at any memory setting (" in err
    and "crossbert_d2304L32" in err
  )
  rc, out, err = run_main(capsys, *args, "--execute")
  assert rc == 2 and err.startswith("error: ") and "give them more chips" in err
  assert not (tmp_path / "b").exists()  # nothing written
