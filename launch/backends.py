r"""The backends: how each member's job is rendered for this machine, SLURM, Cloud TPU VMs or xpk.

`RENDER[backend](launch, members, ns, python)` -> one `Job` per member (its steps, and for slurm
its sbatch script); nothing here starts a process or writes a file.
  local   subprocesses here (launch/jobs.py runs them): train, then probe.
  slurm   one script per member, <root>/slurm/<member>.sbatch (+ <member>.config.json, its
          resolved config): nodes = target_devices / --gpus_per_node, one task per GPU (below),
          srun'd train then probe with --multiprocess. `--requeue --signal=B:USR1@<--signal_seconds>`
          (sbatch(1): "B:" signals "only the batch shell"; "the signal may be sent up to 60
          seconds earlier than specified"): the script's USR1 trap has Slurm send SIGTERM to the
          running step's tasks (`scancel --signal=TERM $SLURM_JOB_ID`: every step's tasks, not
          the batch shell or its srun), the trainers checkpoint and exit, then `scontrol requeue`;
          the requeued job resumes. Never `kill -TERM <srun>`: srun answers SIGTERM by SIGKILLing
          its tasks (src/srun/signals.c, "forcing job termination"). A TERM to the script (a
          preemption, `scancel --batch --signal=TERM`) stops the step the same way and exits
          143 without a requeue of its own (Slurm requeues a preempted job under
          PreemptMode=REQUEUE; a cancelled job stays cancelled). Slurm's own preemption signal
          goes to the tasks (preempt.shtml: "sent SIGCONT and SIGTERM"; flags KILL_STEPS_ONLY):
          the trainers checkpoint by themselves, if GraceTime leaves them the time. A train step
          that ends without the final checkpoint (stopped by such a SIGTERM) is not probed.
          A failing step writes the member's FAILED marker. A member on a `data.corpus=sources`
          corpus first prepares its data in one task (`python -m cbert_jax.data.preprocess`):
          G x nodes trainer processes would otherwise each tokenise the same corpus, each with all
          the node's cores. The script `cd`s into a snapshot of the code (launch/snapshot.py).
          --execute submits with `--sbatch`.
  tpu-vm  per member a TPU VM named <--tpu_prefix><member> (lowercase, `_` -> `-`): its
          `gcloud compute tpus tpu-vm create` command and the
          `gcloud compute tpus tpu-vm ssh --worker=all --command='cd <code> && <member wrapper>'`
          that runs the member on every host. --execute runs the ssh commands here, all members
          at once (`--parallel` caps it), each one's output in <root>/logs/<member>.log (run the
          launcher in tmux/screen: an ssh that drops stops its member; launching again resumes
          it); `--create_tpus` runs the create commands first, `--setup_workers` then sets every
          worker up (`setup_line`): the images' python3 is Ubuntu 22.04's 3.10, so uv makes
          ~/cbert_jax-venv with a Python 3.11 of its own, the version is checked (one line, exit 1,
          nothing installed when it is not >= 3.11), then the snapshot is installed into it
          (`uv pip install <copy>[tpu]`, the pinned dependencies). Members run on its python.
  xpk     per member `xpk workload create --cluster=... --workload=<name> --tpu-type=...
          --num-slices=1 --docker-image=... --max-restarts=N --termination-grace-period-seconds=S
          [--storage=...] --command='<member wrapper>'`; the image holds this repository at its
          working directory (or give --code_dir) with its dependencies installed. The names xpk
          checks (--cluster, the workload names: its name_type, [a-z]([-a-z0-9]*[a-z0-9])? and
          at most 40 characters) are checked first, and --xpk_storage by the same rule; workload
          names are unique (a hash suffix when truncated). With a storage, the member first runs
          `python -m launch.commit_check <workdir>`: orbax commits a checkpoint by renaming its
          directory, which a gcsfuse mount allows only with `rename-dir-limit` (the dry run shows
          the `xpk storage attach ... --mount-options=implicit-dirs,rename-dir-limit=200000`).

Processes per accelerator: what JAX 0.10's `jax.distributed.initialize()` expects (read in
jax/_src/clusters/*.py). `ClusterEnv.auto_detect_unset_distributed_params` takes the coordinator,
process count and process id from the cluster, and, unless `running_in_cloud_tpu_vm`, sets
`local_device_ids = [get_local_process_id()]`, which `jax._src.distributed` turns into
`jax_cuda_visible_devices` (env JAX_LOCAL_DEVICE_IDS overrides it).
  slurm   SlurmCluster: SLURM_NTASKS processes, id SLURM_PROCID, coordinator the first host of
          SLURM_STEP_NODELIST (port from SLURM_JOB_ID), local process id SLURM_LOCALID. So each
          process gets exactly one GPU, the one numbered SLURM_LOCALID among those it can see:
          one task per node (this launcher before) used GPU 0 of each node only. The script runs
          one task per GPU: `#SBATCH --ntasks-per-node=G --gpus-per-node=G` and
          `srun --ntasks-per-node=G --gpu-bind=none`, so every task sees the node's G GPUs
          (CUDA_VISIBLE_DEVICES=0..G-1) and task i picks GPU i. Not `--gpus-per-task=1`: SLURM would
          give each task one GPU, renumbered 0 by CUDA, while JAX asks for GPU SLURM_LOCALID, which
          tasks 1..G-1 do not have. Each task gets the node's allocated CPUs / G
          (`--cpus-per-task`, from SLURM_CPUS_ON_NODE at run time).
  tpu-vm  GceTpuCluster (needs `running_in_cloud_tpu_vm`, set by jax's cloud_tpu_init when libtpu
          finds TPU chips, and the GCE metadata server): process id = metadata
          `agent-worker-number`, the hosts = `worker-network-endpoints` (coordinator: the first,
          port 8482 or JAX_COORDINATOR_PORT), slices from `tpu-env`. One process per host
          (`gcloud ... ssh --worker=all`); local_device_ids is never set on a TPU VM, so each
          process drives all its host's chips (4 on v4/v5p/v5e/v6e hosts).
  xpk     GkeTpuCluster (`running_in_cloud_tpu_vm` and TPU_WORKER_HOSTNAMES or
          TPU_PROCESS_ADDRESSES, which GKE sets in each TPU pod): process id TPU_WORKER_ID, hosts
          from that list; one pod, so one process, per host, all its chips.

The member wrapper (tpu-vm, xpk): one POSIX-shell line that runs train, then probe, each in the
background with a TERM (and HUP) trap that forwards SIGTERM to the trainer, again each second
until it exits, and waits for it (the slurm script's USR1 trap repeats it the same way; a trainer
can miss a single SIGTERM: one that comes after jax.distributed.initialize but before the train
loop is taken by JAX's preemption notifier, and one that comes during the processes' stop vote
can be overwritten; both seen in tests/launch/test_launch_simulations.py):
a pod's shell (`bash -c 'cd X && train && probe'`) would itself die on SIGTERM and leave the
trainer to be killed without its checkpoint (xpk runs the command as `(command) &` and sends
SIGTERM to that subshell). The trainer checkpoints on SIGTERM and exits 0; the wrapper then does
not probe an unfinished run but exits 143 (128 + SIGTERM), one of the exit codes on which xpk's
JobSet restarts a workload (42 and 127-255 by default; --max-restarts times), so the restarted
pods resume from the checkpoint. A train step is skipped when the final checkpoint exists (a
restart after train, during the probe). Other trainer failures keep their status (2 config,
3 non-finite, 4 distributed, 5 checkpoint), on which xpk does not restart.

TPU types (`--tpu_generation`, from a member's target_devices = chips): v4 and v5p names count
TensorCores, 2 per chip (8 chips -> v4-16 / v5p-16; slices of whole 4-chip hosts); v5e and v6e
names count chips (8 chips -> v5litepod-8 / v6e-8; slices of 1, 4, 8, ..., 256 chips).

The chip's XLA flags and variables (`launch_env`: cbert_jax/scaling/chips.py `chip_env` for
--gpu_type / --tpu_generation, sources in docs/launch.md): XLA_FLAGS (GPU) or LIBTPU_INIT_ARGS
(TPU) and the chip's other variables, exported by every backend before the member's --setup:
  slurm   `export` lines in the sbatch script, after XLA_PYTHON_CLIENT_MEM_FRACTION (srun passes
          the batch shell's environment to the tasks);
  tpu-vm  `cd <code> && export LIBTPU_INIT_ARGS=... && <setup> || exit 1; <member wrapper>`;
  xpk     the same at the head of the pod's --command (MaxText's xpk runner exports them there too).
`--xla_flags=V` replaces the flags (the other variables stay); `--xla_flags=` sets none of them.
The trainer records what it ran with in config.json (cbert_jax/run/provenance.py `recorded_env`).

Every value ends up in a script line, an #SBATCH line or a remote command: values in #SBATCH
lines are quoted the way sbatch reads them when they hold anything but [A-Za-z0-9_./:@%+,=-].
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import sys

from cbert_jax.scaling.chips import (
  CHIPS,
  GPU_MEM_FRACTION,
  TPU_CORES_PER_CHIP,  # noqa: F401 (the launcher's name of the planner's table, tested the same)
  TPU_RUNTIME,
  accelerator_type,
  chip_env,
  is_slice,
)
from launch.commit_check import MOUNT_OPTIONS
from launch.members import LOG_DIR, Job, Launch, LaunchError, Member, member_commands

BACKENDS = ("local", "slurm", "tpu-vm", "xpk")
# TPU generations: their accelerator-type prefix, TensorCores per chip, slice sizes and default TPU
# VM runtime (TPU_RUNTIME, Cloud TPU's documented software versions) are their records in the one
# chip table, cbert_jax.scaling.chips; so is GPU_MEM_FRACTION, the GPU memory JAX may take.
# xpk's rule for the names it checks (`--cluster`, `--workload`: xpk/parser/validators.py
# name_type, xpk 1.16): the whole name matches this, and it is at most 40 characters.
XPK_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
XPK_NAME_MAX = 40
# tpu-vm: the environment --setup_workers makes on every worker, with a Python of its own. The TPU
# VM images' `python3` is Ubuntu 22.04's 3.10; this package and jax 0.10 need 3.11 or newer, so the
# setup has uv install one (`uv venv --python 3.11`: a managed CPython, whatever the image has).
TPU_VENV = "~/cbert_jax-venv"
TPU_SRC = "~/cbert_jax-src"  # the private copy of the code the setup installs from
TPU_PYTHON = "3.11"
# Default interpreter per backend: this one here; on a TPU VM the setup's environment.
DEFAULT_PYTHON = {
  "local": sys.executable,
  "slurm": "python",
  "tpu-vm": f"{TPU_VENV}/bin/python",
  "xpk": "python",
}
# The member wrapper's exit status for a train step stopped before its final step (SIGTERM): 128 +
# SIGTERM, which xpk's JobSet restarts on (its podFailurePolicy fails the job without a restart
# unless the exit code is 42 or 127-255: xpk/commands/workload.py get_restart_exit_codes).
STOPPED_EXIT = 143
DEFAULT_MAX_RESTARTS = 10  # xpk --max-restarts (xpk's own default is 0: no restart at all)
DEFAULT_GRACE_S = 300  # xpk --termination-grace-period-seconds (xpk's default: 30)
# Characters an #SBATCH value may hold unquoted (sbatch reads its #SBATCH lines with quotes,
# backslash escapes and `#` comments: src/sbatch/opt.c _get_argument).
SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+,=-]+")


# ---------------------------------------------------------- shell quoting ---


def shell_join(argv: list[str]) -> str:
  """argv as one shell line; `--flag=value` quotes only the value (`--command='a && b'`); a word
  that starts with `~/` keeps it unquoted (the remote shell expands it: ~/cbert_jax-venv/...)."""
  out = []
  for a in argv:
    flag = re.fullmatch(r"(--[\w.-]+=)(.*)", a, re.S)  # keep the flag name outside the quotes
    out.append(flag.group(1) + shlex.quote(flag.group(2)) if flag else quote_path(a))
  return " ".join(out)


def quote_path(path: str) -> str:
  """shlex.quote, but a leading `~/` stays outside the quotes (so the remote shell expands it)."""
  return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def double_quote(text: str) -> str:
  """`text` in shell double quotes (`\\`, `"`, `$` and backquote escaped)."""
  return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def sbatch_value(value: str) -> str:
  """A value as an #SBATCH line reads it: as is when plain, else in double quotes with `"` and
  `\\` escaped (sbatch's parser takes quotes and backslash escapes; line breaks never get here)."""
  if SBATCH_PLAIN.fullmatch(value):
    return value
  return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------- the chip's flags ---


def launch_env(chip: str, xla_flags: str | None = None) -> list[tuple[str, str]]:
  """The variables every member exports on `chip` (a CHIPS key; "" = none, the local backend):
  the chip's XLA flags (XLA_FLAGS on a GPU, LIBTPU_INIT_ARGS on a TPU) and its other variables,
  from the chip table (`chips.chip_env`, sources in docs/launch.md). `--xla_flags` replaces the
  flags (the other variables stay); an empty `--xla_flags=` sets none of them."""
  return chip_env(CHIPS[chip], xla_flags) if chip else []


def export_words(env: list[tuple[str, str]]) -> list[str]:
  """`NAME=value` words for a shell `export`, each value quoted for the shell."""
  return [f"{k}={shlex.quote(v)}" for k, v in env]


def env_text(env: list[tuple[str, str]]) -> str:
  """The variables as the dry run shows them: `A='x y' B=1`."""
  return " ".join(export_words(env))


# ------------------------------------------------------------------- slurm ---


def slurm_seconds(text: str) -> int:
  """A SLURM --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds; ValueError if malformed."""
  days, dash, rest = text.partition("-")
  if not dash:
    days, rest = "0", text
  parts = rest.split(":")
  if not (days.isdigit() and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
    raise ValueError(text)
  nums = [int(p) for p in parts]
  if dash:  # with days: H, H:M, H:M:S
    h, m, s = (nums + [0, 0])[:3]
  elif len(nums) == 3:  # H:M:S
    h, m, s = nums
  else:  # M or M:S
    h, (m, s) = 0, (nums + [0])[:2]
  return int(days) * 86400 + h * 3600 + m * 60 + s


def slurm_nodes(member: Member, gpus_per_node: int) -> int:
  """Nodes for a member: target_devices / --gpus_per_node, which must divide it."""
  if member.target_devices <= 0:
    raise LaunchError(
      f"member {member.name} has target_devices=0 (planned for this machine): "
      "use --backend local, or a scale planned for a cluster (paper)"
    )
  if member.target_devices % gpus_per_node:
    raise LaunchError(
      f"--gpus_per_node={gpus_per_node} does not divide target_devices="
      f"{member.target_devices} of member {member.name}"
    )
  return member.target_devices // gpus_per_node


def preprocess_command(
  python: list[str], experiment: str, member: Member, overrides: list[str]
) -> list[str]:
  """`python -m cbert_jax.data.preprocess` for a member's data (its --config.* overrides only:
  the preprocess CLI has no trainer flags)."""
  return [
    *python,
    "-m",
    "cbert_jax.data.preprocess",
    f"--config={experiment}:{member.arg}",
    *[o for o in overrides if o.startswith("--config.")],
  ]


def render_sbatch(
  member: Member,
  train: list[str],
  probe: list[str],
  ns: argparse.Namespace,
  code_dir: str,
  root: str,
  prepare: list[str] | None = None,
  env: list[tuple[str, str]] = (),
) -> str:
  """The member's sbatch script: one task per GPU; requeue on the time-limit signal; train (after
  a one-task data preparation for `sources` corpora) then probe, each srun'd in the background."""
  nodes = slurm_nodes(member, ns.gpus_per_node)
  gpus = ns.gpus_per_node
  log = os.path.join(root, LOG_DIR, f"{member.name}.log")
  config_json = os.path.join(root, "slurm", f"{member.name}.config.json")
  q = shlex.quote
  setup = f"{ns.setup}\n" if ns.setup else ""  # a line of its own, when given
  frac = GPU_MEM_FRACTION  # the GPU memory JAX may take (cbert_jax.scaling.chips)
  chip = f"{ns.gpu_type}'s" if getattr(ns, "gpu_type", "") else "the chip's"
  tuning = (
    f"# {chip} XLA flags and variables (cbert_jax/scaling/chips.py; their sources: docs/launch.md;\n"
    "# launch.sweep --xla_flags replaces the flags, --xla_flags= sets none of them):\n"
    + "".join(f"export {w}\n" for w in export_words(list(env)))
    if env
    else "# No XLA flags or variables of the chip (launch.sweep --xla_flags=).\n"
  )
  head = [
    "#!/bin/bash",
    f"#SBATCH --job-name={sbatch_value(member.name)}",
    f"#SBATCH --nodes={nodes}",
    f"#SBATCH --ntasks-per-node={gpus}",
    f"#SBATCH --gpus-per-node={gpus}",
    f"#SBATCH --time={ns.time}",
    f"#SBATCH --output={sbatch_value(log)}",
    "#SBATCH --open-mode=append",
    "#SBATCH --requeue",
    f"#SBATCH --signal=B:USR1@{ns.signal_seconds}",
  ]
  head += [f"#SBATCH --partition={sbatch_value(ns.partition)}"] if ns.partition else []
  head += [f"#SBATCH --account={sbatch_value(ns.account)}"] if ns.account else []
  steps = member.total_steps
  prep = (
    f'  run_step "${{one[@]}}" {shell_join(prepare)} || fail prepare $?  # the data, once\n'
    if prepare
    else ""
  )
  probe_line = (
    f'run_step "${{tasks[@]}}" {shell_join(probe)} || fail probe $?\n' if probe else ""
  )  # a grid member has no probe step
  body = f"""\
# {member.name} ({member.arg}): {member.summary()}.
# Written by launch/sweep.py; the resolved config: {config_json}
# One task per GPU ({gpus} per node, {nodes * gpus} in all): each task sees the node's {gpus} GPUs
# and JAX's SLURM detection gives task i of a node the GPU numbered SLURM_LOCALID = i.
# Near the time limit SLURM sends USR1 to this script: the running step's tasks get SIGTERM (the
# trainers checkpoint and exit), then the job is requeued and resumes from that checkpoint. A TERM
# to this script (a preemption) stops the step the same way; Slurm requeues a preempted job.
set -uo pipefail
cd {quote_path(code_dir)} || exit 1
# JAX preallocates 75% of a GPU's memory by default; the memory plan counts on {frac:.0%} of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${{XLA_PYTHON_CLIENT_MEM_FRACTION:-{frac}}}"
{tuning}{setup}workdir={q(member.workdir)}
final="$workdir/checkpoints/{steps}"  # the final checkpoint: train is done
cpus=$(( ${{SLURM_CPUS_ON_NODE:-{gpus}}} / {gpus} ))  # the node's CPUs, split over its {gpus} tasks
if [ "$cpus" -lt 1 ]; then cpus=1; fi
tasks=(--nodes={nodes} --ntasks-per-node={gpus} --cpus-per-task="$cpus" --gpu-bind=none)
one=(--nodes=1 --ntasks=1 --cpus-per-task="${{SLURM_CPUS_ON_NODE:-1}}")
step=""  # the running srun's pid
stopping=""
# Signals for the trainers go to the step's tasks through Slurm, never to srun: srun answers SIGTERM
# (and SIGHUP, SIGQUIT) by SIGKILLing its tasks (src/srun/signals.c: "forcing job termination";
# srun(1), --ignore-signals: "SIGTERM Forwarded as SIGKILL"), so no trainer would checkpoint.
# scancel(1): "When --batch is not used but --signal is used, then all job steps will be signaled,
# but the batch script itself will not be signaled" (the same steps Slurm itself signals on a
# preemption). Again each second until srun ends: a trainer can miss one SIGTERM.
stop_step() {{
  stopping=1
  [ -n "$step" ] || return 0
  ( while kill -0 "$step" 2>/dev/null; do scancel --signal=TERM "$SLURM_JOB_ID"; sleep 1; done ) &
  while kill -0 "$step" 2>/dev/null; do wait "$step"; done  # the trainers checkpoint and exit
}}
on_usr1() {{  # --signal=B:USR1@{ns.signal_seconds}: the time limit is near
  [ -z "$stopping" ] || return 0
  echo "$(date -Is) USR1: time limit near; checkpointing, then requeueing job $SLURM_JOB_ID"
  stop_step
  scontrol requeue "$SLURM_JOB_ID"  # back to the queue; the rerun resumes from the checkpoint
  exit 0
}}
on_term() {{  # a preemption or a cancel that reaches this shell
  [ -z "$stopping" ] || return 0
  echo "$(date -Is) TERM: checkpointing before job $SLURM_JOB_ID ends (requeued if preempted)"
  stop_step
  exit 143
}}
trap on_usr1 USR1
trap on_term TERM
run_step() {{
  srun "$@" &  # in the background: USR1 and TERM run their traps during the wait
  step=$!
  wait "$step"
  local rc=$?
  while kill -0 "$step" 2>/dev/null; do wait "$step"; rc=$?; done
  step=""
  return "$rc"
}}
fail() {{  # the member's FAILED marker, read by `python -m launch.sweep status`
  echo "slurm job $SLURM_JOB_ID: $1 exited with status $2; log: "{q(log)} > "$workdir/FAILED"
  exit "$2"
}}
echo "$(date -Is) job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST"
mkdir -p "$workdir" && rm -f "$workdir/FAILED"
if [ ! -d "$final" ]; then  # no final checkpoint yet
{prep}  run_step "${{tasks[@]}}" {shell_join(train)} || fail train $?
  if [ ! -d "$final" ]; then  # stopped early by a SIGTERM from Slurm (a preemption) or a user
    echo "$(date -Is) train stopped before step {steps}: not probing; launch again to resume"
    exit 0
  fi
fi
{probe_line}"""
  return "\n".join(head) + "\n" + body


def render_slurm(
  launch: Launch, members: list[Member], ns: argparse.Namespace, python: list[str]
) -> list[Job]:
  try:
    limit = slurm_seconds(ns.time)
  except ValueError:
    raise LaunchError(
      f"--time={ns.time}: expected a SLURM time (e.g. 48:00:00 or 2-00:00:00)"
    ) from None
  if not 0 < ns.signal_seconds < limit or ns.signal_seconds > 65535:
    raise LaunchError(
      f"--signal_seconds={ns.signal_seconds} must be in 1..65535 and below "
      f"--time={ns.time} ({limit} s)"
    )
  if ns.gpus_per_node < 1:
    raise LaunchError(f"--gpus_per_node={ns.gpus_per_node} must be >= 1")
  for m in members:  # every member is checked before any is rendered
    slurm_nodes(m, ns.gpus_per_node)
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    prepare = (
      preprocess_command(python, launch.experiment, m, launch.overrides)
      if m.config.data.corpus == "sources"
      else None
    )
    path = os.path.join(launch.root, "slurm", f"{m.name}.sbatch")
    script = render_sbatch(m, train, probe, ns, launch.code_dir, launch.root, prepare, launch.env)
    nodes = slurm_nodes(m, ns.gpus_per_node)
    jobs.append(
      Job(
        m,
        train,
        probe,
        [("submit", [*shlex.split(ns.sbatch), path])],
        script,
        path,
        {"nodes": nodes, "gpus_per_node": ns.gpus_per_node, "tasks": nodes * ns.gpus_per_node},
      )
    )
  return jobs


# ------------------------------------------------------------- TPU VMs, xpk ---


def tpu_type(generation: str, chips: int, member: str = "") -> str:
  """The accelerator type of a slice of `chips` chips: v4/v5p count TensorCores (2 per chip),
  v5e/v6e count chips. Raises LaunchError for a size the generation has no slice of."""
  where = f" (member {member})" if member else ""
  if chips <= 0:
    raise LaunchError(
      f"member {member} has target_devices=0 (planned for this machine): use "
      "--backend local, or a scale planned for a pod (paper)"
    )
  chip = CHIPS[generation]
  if chip.slices and not is_slice(chip, chips):  # v5e, v6e: the listed sizes
    raise LaunchError(
      f"--tpu_generation={generation} has no slice of {chips} chips{where}; "
      f"slices: {', '.join(map(str, chip.slices))} chips"
    )
  if not is_slice(chip, chips):  # v4, v5p: whole hosts
    raise LaunchError(
      f"--tpu_generation={generation} slices are whole hosts of {chip.host_chips} chips; "
      f"target_devices={chips}{where} is not a multiple of {chip.host_chips}"
    )
  return accelerator_type(generation, chips)


def resource_name(prefix: str, member: str) -> str:
  """A cloud resource name: lowercase, anything but [a-z0-9-] -> '-'."""
  return re.sub(r"[^a-z0-9-]+", "-", (prefix + member).lower()).strip("-")


def xpk_names(prefix: str, members: list[str]) -> dict[str, str]:
  """Unique xpk workload names (<= 40 chars, [a-z0-9-], a letter first): a name truncated or
  shared by two members ends in 6 hex digits of its member's hash."""
  base = {m: resource_name(prefix, m) for m in members}
  counts: dict[str, int] = {}
  for name in base.values():
    counts[name] = counts.get(name, 0) + 1
  out = {}
  for m, name in base.items():
    if len(name) > XPK_NAME_MAX or counts[name] > 1:
      tag = hashlib.sha1(m.encode()).hexdigest()[:6]  # stable: the same member, same name
      name = name[: XPK_NAME_MAX - 7].rstrip("-") + "-" + tag
    out[m] = name
  return out


def member_wrapper(
  member: Member, train: list[str], probe: list[str], precheck: list[str] | None = None
) -> str:
  """The member's train-then-probe as one POSIX-shell line for a pod or a TPU host (module
  docstring): each step runs in the background under a TERM/HUP trap that passes SIGTERM on to
  it, again each second until it ends (`nag`: a trainer can miss one, see the module docstring),
  and waits for it to checkpoint; a train that ends before the final checkpoint, or a SIGTERM
  before the probe, exits STOPPED_EXIT instead of probing; a finished train is not run again
  (a restart during the probe only probes). `precheck` (xpk with a storage: launch.commit_check)
  runs before the train step and ends the line with its status when it fails. No `$(`:
  Kubernetes would expand `$(NAME)` in a pod's command."""
  final = f"{member.workdir}/checkpoints/{member.total_steps}"
  stopped = (
    f"{member.name}: train stopped before its final step {member.total_steps} "
    f"(SIGTERM); exit {STOPPED_EXIT}: the next attempt resumes from its checkpoint"
  )
  no_probe = (
    f"{member.name}: SIGTERM; exit {STOPPED_EXIT} before the probe: the next attempt runs it"
  )
  return " ".join(
    [
      f"final={shlex.quote(final)}; child=; stop=;",
      'nag() { ( while kill -TERM "$child" 2>/dev/null; do sleep 1; done ) & };',
      'fwd() { [ -z "$stop" ] || return 0; stop=1; [ -z "$child" ] || nag; }; trap fwd TERM HUP;',
      'step() { "$@" & child=$!; [ -z "$stop" ] || nag;',
      'wait "$child"; rc=$?; while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?;',
      'done; child=; return "$rc"; };',
      'if [ ! -d "$final" ]; then'
      + (f" {shell_join(precheck)} || exit $?;" if precheck else "")
      + f" step {shell_join(train)} ||",
      '{ rc=$?; [ -n "$stop" ] || exit "$rc"; }; fi;',
      f'if [ ! -d "$final" ]; then echo {double_quote(stopped)} >&2; exit {STOPPED_EXIT}; fi;',
    ]
    + (  # a grid member has no probe step: done at its final checkpoint
      [
        f'if [ -n "$stop" ]; then echo {double_quote(no_probe)} >&2; exit {STOPPED_EXIT}; fi;',
        f"step {shell_join(probe)}",
      ]
      if probe
      else []
    )
  )


def remote_line(
  code_dir: str,
  setup: str,
  member: Member,
  train: list[str],
  probe: list[str],
  precheck: list[str] | None = None,
  env: list[tuple[str, str]] = (),
) -> str:
  """'cd <code> && export <the chip's variables> && <setup> || exit 1; <member wrapper>': one shell
  line for a remote host (the setup runs after the exports, so it can still change them)."""
  parts = [f"cd {quote_path(code_dir)}"] if code_dir else []
  parts += [f"export {' '.join(export_words(list(env)))}"] if env else []
  parts += [setup] if setup else []
  head = f"{' && '.join(parts)} || exit 1; " if parts else ""
  return head + member_wrapper(member, train, probe, precheck)


def setup_line(code_dir: str) -> str:
  """--setup_workers, on every worker: a private copy of the code (pip builds in the source tree;
  the shared one stays untouched), uv (from PyPI with the image's pip when the worker has none),
  a fresh TPU_VENV with uv's Python TPU_PYTHON, its version checked (one line and exit 1 when it is
  not >= 3.11, before anything is installed), then the code with its pinned dependencies and the
  `tpu` extra installed into it."""
  py = f"{TPU_VENV}/bin/python"
  no_uv = "tpu-vm setup: no uv on this worker, and `python3 -m pip install --user uv` failed"
  too_old = (
    f"tpu-vm setup: {py} is not Python >= 3.11 (`uv venv --python {TPU_PYTHON}` failed, see "
    "above): nothing installed"
  )
  check = (
    'import sys; v = sys.version_info; print("tpu-vm setup: Python %d.%d.%d" % v[:3]); '
    "sys.exit(v < (3, 11))"
  )
  return " ".join(
    [
      f"rm -rf {TPU_SRC} && cp -r {quote_path(code_dir)} {TPU_SRC} || exit 1;",
      'export PATH="$HOME/.local/bin:$PATH";',  # where pip --user puts uv
      "command -v uv >/dev/null || python3 -m pip install --quiet --user uv ||",
      f"{{ echo {shlex.quote(no_uv)} >&2; exit 1; }};",
      f"rm -rf {TPU_VENV}; uv venv --quiet --python {TPU_PYTHON} {TPU_VENV};",
      f"{py} -c {shlex.quote(check)} || {{ echo {shlex.quote(too_old)} >&2; exit 1; }};",
      f"uv pip install --quiet --python {py} {quote_path(TPU_SRC + '[tpu]')}",
    ]
  )


def venv_check() -> str:
  """The member line's first test on a TPU VM run with the default interpreter: the setup's
  environment is there (one line otherwise, not a shell's 'No such file')."""
  py = f"{TPU_VENV}/bin/python"
  missing = (
    f"no {py} on this worker: launch with --setup_workers (it makes {TPU_VENV} with Python "
    f"{TPU_PYTHON}), or give --python"
  )
  return f"{{ [ -x {py} ] || {{ echo {shlex.quote(missing)} >&2; exit 1; }}; }}"


def check_xpk_name(flag: str, name: str, what: str) -> None:
  """One error line when xpk would refuse `name` (its name_type): checked before rendering."""
  if not XPK_NAME.fullmatch(name) or len(name) > XPK_NAME_MAX:
    raise LaunchError(
      f"{flag}={name!r}: xpk refuses this {what} name: it must be lowercase letters, digits "
      f"and '-', start with a letter, not end with '-', and be at most {XPK_NAME_MAX} "
      "characters (xpk's name_type)"
    )


def check_prefix(flag: str, prefix: str) -> None:
  if not re.fullmatch(r"[a-z][a-z0-9-]*", prefix):
    raise LaunchError(
      f"{flag}={prefix!r}: must start with a lowercase letter and hold only [a-z0-9-]"
    )


def render_tpu_vm(
  launch: Launch, members: list[Member], ns: argparse.Namespace, python: list[str]
) -> list[Job]:
  missing = [f for f in ("zone", "project") if not getattr(ns, f)]
  if missing:
    raise LaunchError(f"--backend tpu-vm needs {' and '.join('--' + f for f in missing)}")
  check_prefix("--tpu_prefix", ns.tpu_prefix)
  types = {m.name: tpu_type(ns.tpu_generation, m.target_devices, m.name) for m in members}
  runtime = ns.runtime_version or TPU_RUNTIME[ns.tpu_generation]
  gcloud = [*shlex.split(ns.gcloud), "compute", "tpus", "tpu-vm"]
  default_python = python == [DEFAULT_PYTHON["tpu-vm"]]
  if ns.setup_workers and not default_python:
    raise LaunchError(
      f"--python={shlex.join(python)} with --setup_workers: the setup installs into "
      f"{DEFAULT_PYTHON['tpu-vm']} (Python {TPU_PYTHON} from uv); leave --python out, or set "
      "the workers up yourself"
    )
  member_setup = " && ".join(filter(None, [venv_check() if default_python else "", ns.setup]))
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    name = resource_name(ns.tpu_prefix, m.name)
    where = [f"--zone={ns.zone}", f"--project={ns.project}"]
    create = [
      *gcloud,
      "create",
      name,
      *where,
      f"--accelerator-type={types[m.name]}",
      f"--version={runtime}",
    ]
    ssh = [
      *gcloud,
      "ssh",
      name,
      *where,
      "--worker=all",
      f"--command={remote_line(launch.code_dir, member_setup, m, train, probe, env=launch.env)}",
    ]
    setup = [
      *gcloud,
      "ssh",
      name,
      *where,
      "--worker=all",
      f"--command={setup_line(launch.code_dir)}",
    ]
    steps = (
      ([("create", create)] if ns.create_tpus else [])
      + ([("setup", setup)] if ns.setup_workers else [])
      + [("ssh", ssh)]
    )
    jobs.append(
      Job(
        m,
        train,
        probe,
        steps,
        info={"tpu_name": name, "tpu_type": types[m.name], "create": shell_join(create)},
      )
    )
  return jobs


def render_xpk(
  launch: Launch, members: list[Member], ns: argparse.Namespace, python: list[str]
) -> list[Job]:
  for flag in ("cluster", "docker_image"):
    if not getattr(ns, flag):
      raise LaunchError(f"--backend xpk needs --{flag}")
  check_xpk_name("--cluster", ns.cluster, "cluster")
  check_prefix("--workload_prefix", ns.workload_prefix)
  if ns.max_restarts < 0:
    raise LaunchError(f"--max_restarts={ns.max_restarts} must be >= 0")
  if ns.termination_grace_seconds < 1:
    raise LaunchError(f"--termination_grace_seconds={ns.termination_grace_seconds} must be >= 1")
  for name in ns.xpk_storage:  # a Kubernetes object's name (xpk's Storage resource): stricter here
    if not XPK_NAME.fullmatch(name):
      raise LaunchError(
        f"--xpk_storage={name!r}: expected an xpk storage name (lowercase letters, digits and "
        "'-', a letter first, not '-' last), as given to `xpk storage attach NAME`"
      )
  if any("$(" in v for _, v in launch.env):  # Kubernetes expands $(NAME) in a pod's command
    raise LaunchError(f"--xla_flags={ns.xla_flags!r}: holds '$(', which Kubernetes would expand")
  types = {m.name: tpu_type(ns.tpu_generation, m.target_devices, m.name) for m in members}
  names = xpk_names(ns.workload_prefix, [m.name for m in members])
  for m in members:  # xpk_names makes them so; checked as xpk will check them
    check_xpk_name("--workload", names[m.name], f"workload (member {m.name})")
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    cmd = [
      *shlex.split(ns.xpk),
      "workload",
      "create",
      f"--cluster={ns.cluster}",
      f"--workload={names[m.name]}",
      f"--tpu-type={types[m.name]}",
      "--num-slices=1",
      f"--docker-image={ns.docker_image}",
    ]
    cmd += [f"--project={ns.project}"] if ns.project else []
    cmd += [f"--zone={ns.zone}"] if ns.zone else []
    cmd += [
      f"--max-restarts={ns.max_restarts}",
      f"--termination-grace-period-seconds={ns.termination_grace_seconds}",
    ]
    cmd += [f"--storage={name}" for name in ns.xpk_storage]
    # With a storage (a gcsfuse bucket, most often), first check that a checkpoint can commit
    # there: one line and exit 5 in seconds, instead of at the first checkpoint.
    check = [*python, "-m", "launch.commit_check", m.workdir] if ns.xpk_storage else None
    line = remote_line(ns.code_dir, ns.setup, m, train, probe, check, launch.env)
    cmd += [f"--command={line}"]
    jobs.append(
      Job(
        m,
        train,
        probe,
        [("submit", cmd)],
        info={"workload": names[m.name], "tpu_type": types[m.name]},
      )
    )
  return jobs


def xpk_storage_attach(ns: argparse.Namespace, shared_root: str) -> list[list[str]]:
  """`xpk storage attach` for each --xpk_storage, shown by the dry run (run once, before the
  workloads; not by the launcher): a gcsfuse bucket (xpk's default bucket: the storage's name)
  mounted at --shared_root with the mount options under which a checkpoint can commit (orbax
  renames its directory; launch/commit_check.py). With several storages the first gets
  --shared_root, the others a mount point of their own (MOUNT_POINT)."""
  where = [f"--project={ns.project}"] if ns.project else []
  where += [f"--zone={ns.zone}"] if ns.zone else []
  out = []
  for i, name in enumerate(ns.xpk_storage):
    mount = shared_root if shared_root and i == 0 else "MOUNT_POINT"
    out.append(
      [
        *shlex.split(ns.xpk),
        "storage",
        "attach",
        name,
        f"--cluster={ns.cluster}",
        *where,
        "--type=gcsfuse",
        f"--mount-point={mount}",
        "--auto-mount=false",
        "--readonly=false",
        f"--mount-options={MOUNT_OPTIONS}",
      ]
    )
  return out


def render_local(
  launch: Launch, members: list[Member], ns: argparse.Namespace, python: list[str]
) -> list[Job]:
  """Subprocesses here: train, then probe (`--args` and grid members: train only)."""
  del ns  # local has no options that change the commands
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, False)
    steps = [("train", train)] + ([("probe", probe)] if probe else [])
    jobs.append(Job(m, train, probe, steps))
  return jobs


RENDER = {"local": render_local, "slurm": render_slurm, "tpu-vm": render_tpu_vm, "xpk": render_xpk}


def describe(job: Job) -> str:
  """Where a job runs: ', 1 node x 8 GPUs' | ', TPU VM <name> (v5p-16)' | ', workload <name>'."""
  i = job.info
  if "nodes" in i:
    return (
      f", {i['nodes']} node{'s' if i['nodes'] > 1 else ''} x {i['gpus_per_node']} GPUs, "
      f"{i['tasks']} tasks"
    )
  if "tpu_name" in i:
    return f", TPU VM {i['tpu_name']} ({i['tpu_type']})"
  if "workload" in i:
    return f", workload {i['workload']} ({i['tpu_type']})"
  return ""
