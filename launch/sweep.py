r"""Fan a scaling sweep's members out to this machine, SLURM, Cloud TPU VMs or xpk (GKE).

  python -m launch.sweep --config experiments/sweep.py --backend slurm --shared_root /shared
      # dry run (the default): prints every member's sbatch script; starts and writes nothing
  python -m launch.sweep ... --execute        # writes the scripts + manifest and submits them
  python -m launch.sweep status --workdir_root /shared/sweep_paper   # pending/running/done/failed

The scale is the `--config` arg (`experiments/sweep.py:cpu`, `:quick`; default `paper`). The
members are the experiment's `get_sweep(scale)`; each one's config is resolved
(`config_lib.resolve`) with the `--override=--config.X=V` overrides applied, which checks the
overrides and gives `sweep.target_devices` (the chips a member is planned for; 0 = this machine),
`total_steps` and the sizes shown. `--members a,b` launches a subset (names as in `status`).
docs/running_on_a_pod.md walks through each backend.

A member's job is two ordinary trainer commands, run from the repository root (or a snapshot):
  train  python -m cbert_jax.main --config=<experiment>:<member arg> --workdir=<root>/<member>
  probe  the same + --config.mode=eval (the offline probe suite on the final checkpoint)
followed by every `--override`. Multi-host backends add `--multiprocess` (jax.distributed finds
the SLURM / TPU environment). An interrupted member resumes from its workdir's checkpoint when
launched again. Members already done (final checkpoint + probe results) are skipped, and so are
members that look running (metrics.jsonl written in the last 10 minutes) unless
--include_running. A member still queued in SLURM or xpk looks pending: do not launch it again.
The trainer refuses (exit 2, `config error: ...planned for N devices...`) to train a member on
another device count than its target_devices, so a launch that gets fewer devices fails at once.

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

Backends:
  local   subprocesses here, `--parallel N` at a time (default 1); each member's stdout+stderr
          is appended to <root>/logs/<member>.log; a failing member gets a FAILED marker (its
          error line) and the others go on; the exit status is 1 if any member failed.
  slurm   one script per member, <root>/slurm/<member>.sbatch (+ <member>.config.json, its
          resolved config): nodes = target_devices / --gpus_per_node, one task per GPU (above),
          srun'd train then probe with --multiprocess. `--requeue --signal=B:USR1@<--signal_seconds>`:
          near the time limit the script sends SIGTERM to the running step (the trainer
          checkpoints and exits) and runs `scontrol requeue`; the requeued job resumes (SLURM may
          signal up to a minute late: leave time for a step and a checkpoint). A train step that
          ends without the final checkpoint (stopped by a SIGTERM from elsewhere) is not probed.
          A failing step writes the member's FAILED marker. A member on a `data.corpus=sources`
          corpus first prepares its data in one task (`python -m cbert_jax.data.preprocess`):
          G x nodes trainer processes would otherwise each tokenise the same corpus, each with all
          the node's cores. The script `cd`s into a snapshot of the code, <code root>/code/<hash>/
          (cbert_jax/, experiments/, launch/, pyproject.toml and the experiment file, copied at
          --execute time; the hash is of their contents, so unchanged code reuses its snapshot and
          queued or requeued jobs never see later edits). --execute submits with `--sbatch`.
  tpu-vm  per member a TPU VM named <--tpu_prefix><member> (lowercase, `_` -> `-`): prints its
          `gcloud compute tpus tpu-vm create` command and the
          `gcloud compute tpus tpu-vm ssh --worker=all --command='cd <code> && <member wrapper>'`
          that runs the member on every host. --execute runs the ssh commands here, all members
          at once (`--parallel` caps it), each one's output in <root>/logs/<member>.log (run the
          launcher in tmux/screen: an ssh that drops stops its member; launching again resumes
          it); `--create_tpus` runs the create commands first, `--setup_workers` then installs
          the snapshot (`pip install <copy>[tpu]`, the pinned dependencies) on every worker.
  xpk     per member `xpk workload create --cluster=... --workload=<name> --tpu-type=...
          --num-slices=1 --docker-image=... --max-restarts=N --termination-grace-period-seconds=S
          [--storage=...] --command='<member wrapper>'`; the image holds this repository at its
          working directory (or give --code_dir) with its dependencies installed. Workload names
          are lowercase [a-z0-9-], at most 40 characters, unique (a hash suffix when truncated).

The member wrapper (tpu-vm, xpk): one POSIX-shell line that runs train, then probe, each in the
background with a TERM (and HUP) trap that forwards SIGTERM to the trainer, again each second
until it exits, and waits for it (the slurm script's USR1 trap repeats it the same way; a trainer
can miss a single SIGTERM: one that comes after jax.distributed.initialize but before the train
loop is taken by JAX's preemption notifier, and one that comes during the processes' stop vote
can be overwritten; both seen in tests/test_launch_simulations.py):
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

Storage: the member workdirs (and for slurm/tpu-vm the code snapshot) must be on storage every
host mounts at the same path (NFS, Filestore, Lustre, a gcsfuse mount of a GCS bucket).
`--shared_root DIR` names it once: the workdirs go to DIR/<experiment>_<scale> (unless
--workdir_root), the snapshot to DIR/code/<hash>, and every member gets
--config.data.cache_dir=DIR/cache (unless an override sets data.cache_dir), so the tokenizer and
packed data are built once for all hosts (the cache's writes are atomic renames of
content-addressed files). For xpk, DIR is a storage attached to the cluster (`xpk storage attach
NAME --type=gcsfuse|gcpfilestore --mount-point=DIR ...`) and mounted with `--xpk_storage NAME`
(`--storage=NAME`), unless attached with --auto-mount=true. `status`, the skip of done members
and the FAILED markers read the workdirs from the launching machine too. Paths are made absolute.

Dry run vs --execute: a dry run prints the commands and scripts, the snapshot directory and where
the manifest would go; it never starts a process and writes nothing. --execute writes (in this
order) the code snapshot, the scripts, <root>/launch_manifest.json (backend, scale, experiment,
creation time, git commit read from .git without running git, overrides, and per member its name,
arg, workdir, target_devices, commands and script / TPU / workload), then starts or submits. A
later launch into the same root keeps the manifest's other members; a root holding another scale's
sweep is refused.

`status` lists the members of <root>/launch_manifest.json (else the in-process runner's
<root>/sweep.json, else the subdirectories holding a config.json) with their state from
`cbert_jax.scaling.status.member_state`.

Bad input (a flag, an override, a member that does not fit a backend, a value with a newline:
every value ends up in a script line, an #SBATCH line or a remote command) is one `error:` line
naming the flag, before anything is rendered; exit status 2. Values in #SBATCH lines are quoted
the way sbatch reads them when they hold anything but [A-Za-z0-9_./:@%+,=-].
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from cbert_jax.errors import ConfigError
from cbert_jax.progress import format_duration
from cbert_jax.scaling import status as status_lib
from launch import local

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = "launch_manifest.json"
RUNNER_MANIFEST = "sweep.json"        # scaling.members.MANIFEST, written by the in-process sweep (cbert_jax.sweep)
LOG_DIR = "logs"
BACKENDS = ("local", "slurm", "tpu-vm", "xpk")
DEFAULT_SCALE = "paper"
# What a code snapshot holds (relative to the repository root): everything a member runs.
SNAPSHOT_PATHS = ("cbert_jax", "experiments", "launch", "pyproject.toml")
# TPU generations: the accelerator-type prefix, TensorCores per chip in the type's number, and the
# default TPU VM runtime (Cloud TPU's documented software versions).
TPU_PREFIX = {"v4": "v4", "v5p": "v5p", "v5e": "v5litepod", "v6e": "v6e"}
TPU_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
TPU_RUNTIME = {"v4": "tpu-ubuntu2204-base", "v5p": "v2-alpha-tpuv5",
               "v5e": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
GPU_CHIPS = ("a100", "h100", "h200", "b200")    # GPU keys of cbert_jax/scaling/memory.py:CHIPS
CHIP_SLICES = (1, 4, 8, 16, 32, 64, 128, 256)   # v5e / v6e slice sizes, in chips
XPK_NAME_MAX = 40                                # xpk's limit on workload names
# Default interpreter per backend: this one here; TPU VM images ship `python3` only.
DEFAULT_PYTHON = {"local": sys.executable, "slurm": "python", "tpu-vm": "python3", "xpk": "python"}
# Flags the launcher sets itself (config, workdir, train/eval mode, multi-process): no overrides.
RESERVED_FLAGS = ("--config", "--workdir", "--config.mode", "--multiprocess", "--nomultiprocess")
# The member wrapper's exit status for a train step stopped before its final step (SIGTERM): 128 +
# SIGTERM, which xpk's JobSet restarts on (its podFailurePolicy fails the job without a restart
# unless the exit code is 42 or 127-255: xpk/commands/workload.py get_restart_exit_codes).
STOPPED_EXIT = 143
DEFAULT_MAX_RESTARTS = 10     # xpk --max-restarts (xpk's own default is 0: no restart at all)
DEFAULT_GRACE_S = 300         # xpk --termination-grace-period-seconds (xpk's default: 30)
# Characters an #SBATCH value may hold unquoted (sbatch reads its #SBATCH lines with quotes,
# backslash escapes and `#` comments: src/sbatch/opt.c _get_argument).
SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+,=-]+")


class LaunchError(ValueError):
  """Bad launcher input; the message names the flag (printed as one `error:` line)."""


@dataclasses.dataclass
class Member:
  """One member of the sweep, resolved."""
  name: str                  # its workdir's name, e.g. bert_d384L6
  arg: str                   # the experiment's config arg, e.g. scale=paper,model=bert,size=d384L6
  workdir: str               # <root>/<name>, absolute
  config: Any                # the resolved ml_collections.ConfigDict (overrides applied)

  @property
  def target_devices(self) -> int:
    return int(self.config.sweep.target_devices)

  @property
  def total_steps(self) -> int:
    return int(self.config.total_steps)

  def summary(self) -> str:
    """'10.6M params, 3458 steps x 120 rows, 1.97e+16 FLOPs, 8 devices'."""
    c = self.config
    devices = f"{self.target_devices} devices" if self.target_devices else "this machine"
    memory = (f"; memory on {c.sweep.chip}: {c.sweep.memory_setting}, "
              f"{c.sweep.memory_bytes / 2**30:.1f} of {c.sweep.memory_budget / 2**30:.1f} GiB "
              f"({c.sweep.memory_verdict})" if c.sweep.chip else "")
    return (f"{c.sweep.n_params / 1e6:.1f}M params, {c.total_steps} steps x {c.batch_size} rows, "
            f"{c.sweep.compute:.3g} FLOPs, {devices}{memory}")


@dataclasses.dataclass
class Job:
  """What a backend does for one member: shell steps here, or a submission."""
  member: Member
  train: list[str]                                       # the member's train command
  probe: list[str]                                       # ... and its probe command
  steps: list[tuple[str, list[str]]]                     # (kind, argv) run here, in order
  script: str = ""                                       # slurm: the sbatch script's text
  script_path: str = ""                                  # slurm: where it goes
  info: dict = dataclasses.field(default_factory=dict)   # backend names for the manifest


@dataclasses.dataclass
class Launch:
  """A rendered launch: everything the dry run prints and --execute does."""
  backend: str
  scale: str
  experiment: str            # the experiment file as the commands name it
  root: str                  # the workdir root, absolute
  overrides: list[str]
  jobs: list[Job]
  code_dir: str              # where remote commands run ("" = the repository root, local)
  snapshot: bool             # --execute copies the code to code_dir first
  shared_root: str = ""      # --shared_root (workdirs, snapshot and data cache), absolute
  snapshot_extra: tuple = ()  # the experiment file, when outside SNAPSHOT_PATHS (repo-relative)


# ------------------------------------------------------------------ members ---


def split_config_spec(spec: str) -> tuple[str, str]:
  """'experiments/sweep.py:cpu' -> ('experiments/sweep.py', 'cpu'); no arg -> the paper scale."""
  path, _, arg = spec.partition(":")
  return path, arg or DEFAULT_SCALE


def command_path(path: str) -> str:
  """The experiment file as the member commands name it: relative to the repository root when
  inside it (the commands run there, or in a snapshot of it), else absolute."""
  full = os.path.abspath(path)
  rel = os.path.relpath(full, REPO)
  return full if rel.startswith("..") else rel


def parse_value(text: str, current: Any) -> Any:
  """An override's value, read as the type of the field's current value."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(text)
    return text.lower() in ("true", "1")
  if isinstance(current, str):
    return text
  value = ast.literal_eval(text)                  # numbers and tuples, as Python literals
  if isinstance(current, tuple) and isinstance(value, list):
    value = tuple(value)                          # [a, b] for a tuple field is (a, b)
  if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)                          # 3 for a float field is 3.0
  if not isinstance(value, type(current)) or isinstance(value, bool):
    raise ValueError(text)
  return value


def apply_override(config, override: str) -> None:
  """Sets one `--config.X=V` override on `config`; other flags are passed through unchecked."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel (imports jax)
  if not override.startswith("--"):
    raise LaunchError(f"--override={override}: expected a trainer flag, e.g. "
                      "--override=--config.data.sources=/data/*.jsonl.zst")
  if override.split("=", 1)[0] in RESERVED_FLAGS:
    raise LaunchError(f"--override={override}: the launcher sets --config, --workdir, "
                      "--multiprocess and the mode (train, then eval) itself")
  if not override.startswith("--config."):
    return
  path, eq, text = override[len("--config."):].partition("=")
  node = config
  *groups, leaf = path.split(".")
  try:
    for g in groups:
      node = node[g]                              # KeyError: no such group
    current = node[leaf]                          # KeyError: no such field
  except (KeyError, AttributeError, TypeError):
    raise LaunchError(f"--override={override}: {config_lib.unknown_field(path)}") from None
  if not eq:
    raise LaunchError(f"--override={override}: expected --config.{path}=VALUE")
  try:
    value = parse_value(text, current)
  except (ValueError, SyntaxError):
    raise LaunchError(f"--override={override}: expected {config_lib.expected_type(path)}, got "
                      f"{text!r}") from None
  with node.unlocked():
    node[leaf] = value


def load_members(spec: str, root: str, overrides: list[str],
                 only: list[str]) -> tuple[str, str, list[Member]]:
  """(scale, experiment path for the commands, members) of `--config spec`, each resolved with
  the overrides applied; `only` selects members by name."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel (imports jax)
  from cbert_jax.scaling import members as members_lib  # pylint: disable=import-outside-toplevel
  path, arg = split_config_spec(spec)
  if not os.path.exists(path):
    raise LaunchError(f"--config={spec}: no such experiment file {path!r}")
  experiment = members_lib.load_experiment(path)
  whole = experiment.get_config(arg)
  scale = whole.get("sweep", {}).get("scale", "") or arg
  if whole.get("mode", "sweep") != "sweep":
    raise LaunchError(f"--config={spec}: {arg!r} is one member; name a scale (e.g. :paper, :cpu, "
                      ":quick) and pick members with --members")
  if scale == "auto":
    raise LaunchError(f"--config={spec}: the launcher needs a scale (paper, cpu, quick); auto is "
                      "resolved by the in-process runner")
  members = []
  for member_arg in experiment.get_sweep(arg):
    cfg = experiment.get_config(member_arg)
    for override in overrides:
      apply_override(cfg, override)
    cfg = config_lib.resolve(cfg)
    name = (experiment.workdir_name(member_arg) if hasattr(experiment, "workdir_name")
            else members_lib.member_name(cfg))
    members.append(Member(name, member_arg, os.path.join(root, name) if root else "", cfg))
  known = [m.name for m in members]
  unknown = [n for n in only if n not in known]
  if unknown:
    raise LaunchError(f"--members: {', '.join(unknown)} not in the {scale} sweep; its members: "
                      f"{', '.join(known)}")
  if only:
    members = [m for m in members if m.name in only]
  return scale, command_path(path), members


def member_commands(python: list[str], experiment: str, member: Member, overrides: list[str],
                    multiprocess: bool) -> tuple[list[str], list[str]]:
  """(train, probe) argv of a member. The mode flag goes last so that no override can undo it."""
  base = [*python, "-m", "cbert_jax.main", f"--config={experiment}:{member.arg}",
          f"--workdir={member.workdir}", *(["--multiprocess"] if multiprocess else []),
          *overrides]
  return base, [*base, "--config.mode=eval"]


def shell_join(argv: list[str]) -> str:
  """argv as one shell line; `--flag=value` quotes only the value (`--command='a && b'`)."""
  out = []
  for a in argv:
    flag = re.fullmatch(r"(--[\w.-]+=)(.*)", a, re.S)    # keep the flag name outside the quotes
    out.append(flag.group(1) + shlex.quote(flag.group(2)) if flag else shlex.quote(a))
  return " ".join(out)


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
  if dash:                                        # with days: H, H:M, H:M:S
    h, m, s = (nums + [0, 0])[:3]
  elif len(nums) == 3:                            # H:M:S
    h, m, s = nums
  else:                                           # M or M:S
    h, (m, s) = 0, (nums + [0])[:2]
  return int(days) * 86400 + h * 3600 + m * 60 + s


def slurm_nodes(member: Member, gpus_per_node: int) -> int:
  """Nodes for a member: target_devices / --gpus_per_node, which must divide it."""
  if member.target_devices <= 0:
    raise LaunchError(f"member {member.name} has target_devices=0 (planned for this machine): "
                      "use --backend local, or a scale planned for a cluster (paper)")
  if member.target_devices % gpus_per_node:
    raise LaunchError(f"--gpus_per_node={gpus_per_node} does not divide target_devices="
                      f"{member.target_devices} of member {member.name}")
  return member.target_devices // gpus_per_node


def sbatch_value(value: str) -> str:
  """A value as an #SBATCH line reads it: as is when plain, else in double quotes with `"` and
  `\\` escaped (sbatch's parser takes quotes and backslash escapes; line breaks never get here)."""
  if SBATCH_PLAIN.fullmatch(value):
    return value
  return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def preprocess_command(python: list[str], experiment: str, member: Member,
                       overrides: list[str]) -> list[str]:
  """`python -m cbert_jax.data.preprocess` for a member's data (its --config.* overrides only:
  the preprocess CLI has no trainer flags)."""
  return [*python, "-m", "cbert_jax.data.preprocess", f"--config={experiment}:{member.arg}",
          *[o for o in overrides if o.startswith("--config.")]]


def render_sbatch(member: Member, train: list[str], probe: list[str], ns: argparse.Namespace,
                  code_dir: str, root: str, prepare: list[str] | None = None) -> str:
  """The member's sbatch script: one task per GPU; requeue on the time-limit signal; train (after
  a one-task data preparation for `sources` corpora) then probe, each srun'd in the background."""
  nodes = slurm_nodes(member, ns.gpus_per_node)
  gpus = ns.gpus_per_node
  log = os.path.join(root, LOG_DIR, f"{member.name}.log")
  config_json = os.path.join(root, "slurm", f"{member.name}.config.json")
  q = shlex.quote
  setup = f"{ns.setup}\n" if ns.setup else ""     # a line of its own, when given
  head = ["#!/bin/bash",
          f"#SBATCH --job-name={sbatch_value(member.name)}",
          f"#SBATCH --nodes={nodes}",
          f"#SBATCH --ntasks-per-node={gpus}",
          f"#SBATCH --gpus-per-node={gpus}",
          f"#SBATCH --time={ns.time}",
          f"#SBATCH --output={sbatch_value(log)}",
          "#SBATCH --open-mode=append",
          "#SBATCH --requeue",
          f"#SBATCH --signal=B:USR1@{ns.signal_seconds}"]
  head += [f"#SBATCH --partition={sbatch_value(ns.partition)}"] if ns.partition else []
  head += [f"#SBATCH --account={sbatch_value(ns.account)}"] if ns.account else []
  steps = member.total_steps
  prep = (f'  run_step "${{one[@]}}" {shell_join(prepare)} || fail prepare $?  # the data, once\n'
          if prepare else "")
  body = f"""\
# {member.name} ({member.arg}): {member.summary()}.
# Written by launch/sweep.py; the resolved config: {config_json}
# One task per GPU ({gpus} per node, {nodes * gpus} in all): each task sees the node's {gpus} GPUs
# and JAX's SLURM detection gives task i of a node the GPU numbered SLURM_LOCALID = i.
# Near the time limit SLURM sends USR1 to this script: the running step gets SIGTERM (the trainer
# checkpoints and exits), then the job is requeued and resumes from that checkpoint.
set -uo pipefail
cd {quote_path(code_dir)} || exit 1
# JAX preallocates 75% of a GPU's memory by default; the memory plan counts on 92% of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${{XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}}"
{setup}workdir={q(member.workdir)}
final="$workdir/checkpoints/{steps}"  # the final checkpoint: train is done
cpus=$(( ${{SLURM_CPUS_ON_NODE:-{gpus}}} / {gpus} ))  # the node's CPUs, split over its {gpus} tasks
if [ "$cpus" -lt 1 ]; then cpus=1; fi
tasks=(--nodes={nodes} --ntasks-per-node={gpus} --cpus-per-task="$cpus" --gpu-bind=none)
one=(--nodes=1 --ntasks=1 --cpus-per-task="${{SLURM_CPUS_ON_NODE:-1}}")
step=""
on_usr1() {{
  echo "$(date -Is) USR1: time limit near; checkpointing, then requeueing job $SLURM_JOB_ID"
  if [ -n "$step" ]; then  # srun forwards SIGTERM to its tasks: the trainer checkpoints, exits
    ( while kill -TERM "$step" 2>/dev/null; do sleep 1; done ) &  # each second: one can be missed
    wait "$step"
  fi
  scontrol requeue "$SLURM_JOB_ID"  # back to the queue; the rerun resumes from the checkpoint
  exit 0
}}
trap on_usr1 USR1
run_step() {{
  srun "$@" &  # in the background: USR1 runs the trap during the wait
  step=$!
  wait "$step"
  local rc=$?
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
  if [ ! -d "$final" ]; then  # stopped early by a SIGTERM that was not our USR1 trap's
    echo "$(date -Is) train stopped before step {steps}: not probing; launch again to resume"
    exit 0
  fi
fi
run_step "${{tasks[@]}}" {shell_join(probe)} || fail probe $?
"""
  return "\n".join(head) + "\n" + body


def render_slurm(launch: Launch, members: list[Member], ns: argparse.Namespace,
                 python: list[str]) -> list[Job]:
  try:
    limit = slurm_seconds(ns.time)
  except ValueError:
    raise LaunchError(f"--time={ns.time}: expected a SLURM time (e.g. 48:00:00 or "
                      "2-00:00:00)") from None
  if not 0 < ns.signal_seconds < limit or ns.signal_seconds > 65535:
    raise LaunchError(f"--signal_seconds={ns.signal_seconds} must be in 1..65535 and below "
                      f"--time={ns.time} ({limit} s)")
  if ns.gpus_per_node < 1:
    raise LaunchError(f"--gpus_per_node={ns.gpus_per_node} must be >= 1")
  for m in members:                               # every member is checked before any is rendered
    slurm_nodes(m, ns.gpus_per_node)
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    prepare = (preprocess_command(python, launch.experiment, m, launch.overrides)
               if m.config.data.corpus == "sources" else None)
    path = os.path.join(launch.root, "slurm", f"{m.name}.sbatch")
    script = render_sbatch(m, train, probe, ns, launch.code_dir, launch.root, prepare)
    nodes = slurm_nodes(m, ns.gpus_per_node)
    jobs.append(Job(m, train, probe, [("submit", [*shlex.split(ns.sbatch), path])], script, path,
                    {"nodes": nodes, "gpus_per_node": ns.gpus_per_node,
                     "tasks": nodes * ns.gpus_per_node}))
  return jobs


# ------------------------------------------------------------- TPU VMs, xpk ---


def tpu_type(generation: str, chips: int, member: str = "") -> str:
  """The accelerator type of a slice of `chips` chips: v4/v5p count TensorCores (2 per chip),
  v5e/v6e count chips. Raises LaunchError for a size the generation has no slice of."""
  where = f" (member {member})" if member else ""
  if chips <= 0:
    raise LaunchError(f"member {member} has target_devices=0 (planned for this machine): use "
                      "--backend local, or a scale planned for a pod (paper)")
  if generation in ("v5e", "v6e") and chips not in CHIP_SLICES:
    raise LaunchError(f"--tpu_generation={generation} has no slice of {chips} chips{where}; "
                      f"slices: {', '.join(map(str, CHIP_SLICES))} chips")
  if generation in ("v4", "v5p") and chips % 4:
    raise LaunchError(f"--tpu_generation={generation} slices are whole hosts of 4 chips; "
                      f"target_devices={chips}{where} is not a multiple of 4")
  return f"{TPU_PREFIX[generation]}-{chips * TPU_CORES_PER_CHIP[generation]}"


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
      tag = hashlib.sha1(m.encode()).hexdigest()[:6]          # stable: the same member, same name
      name = name[:XPK_NAME_MAX - 7].rstrip("-") + "-" + tag
    out[m] = name
  return out


def quote_path(path: str) -> str:
  """shlex.quote, but a leading `~/` stays outside the quotes (so the remote shell expands it)."""
  return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def double_quote(text: str) -> str:
  """`text` in shell double quotes (`\\`, `"`, `$` and backquote escaped)."""
  return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def member_wrapper(member: Member, train: list[str], probe: list[str]) -> str:
  """The member's train-then-probe as one POSIX-shell line for a pod or a TPU host (module
  docstring): each step runs in the background under a TERM/HUP trap that passes SIGTERM on to
  it, again each second until it ends (`nag`: a trainer can miss one, see the module docstring),
  and waits for it to checkpoint; a train that ends before the final checkpoint, or a SIGTERM
  before the probe, exits STOPPED_EXIT instead of probing; a finished train is not run again
  (a restart during the probe only probes). No `$(`: Kubernetes
  would expand `$(NAME)` in a pod's command."""
  final = f"{member.workdir}/checkpoints/{member.total_steps}"
  stopped = (f"{member.name}: train stopped before its final step {member.total_steps} "
             f"(SIGTERM); exit {STOPPED_EXIT}: the next attempt resumes from its checkpoint")
  no_probe = (f"{member.name}: SIGTERM; exit {STOPPED_EXIT} before the probe: the next attempt "
              "runs it")
  return " ".join([
      f"final={shlex.quote(final)}; child=; stop=;",
      "nag() { ( while kill -TERM \"$child\" 2>/dev/null; do sleep 1; done ) & };",
      "fwd() { [ -z \"$stop\" ] || return 0; stop=1; [ -z \"$child\" ] || nag; }; trap fwd TERM HUP;",
      "step() { \"$@\" & child=$!; [ -z \"$stop\" ] || nag;",
      "wait \"$child\"; rc=$?; while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; rc=$?;",
      "done; child=; return \"$rc\"; };",
      f"if [ ! -d \"$final\" ]; then step {shell_join(train)} ||",
      "{ rc=$?; [ -n \"$stop\" ] || exit \"$rc\"; }; fi;",
      f"if [ ! -d \"$final\" ]; then echo {double_quote(stopped)} >&2; exit {STOPPED_EXIT}; fi;",
      f"if [ -n \"$stop\" ]; then echo {double_quote(no_probe)} >&2; exit {STOPPED_EXIT}; fi;",
      f"step {shell_join(probe)}"])


def remote_line(code_dir: str, setup: str, member: Member, train: list[str],
                probe: list[str]) -> str:
  """'cd <code> && <setup> || exit 1; <member wrapper>': one shell line for a remote host."""
  parts = [f"cd {quote_path(code_dir)}"] if code_dir else []
  parts += [setup] if setup else []
  head = f"{' && '.join(parts)} || exit 1; " if parts else ""
  return head + member_wrapper(member, train, probe)


def setup_line(code_dir: str, python: list[str], snapshot: str) -> str:
  """--setup_workers: install the code (and its pinned dependencies, with the `tpu` extra) on a
  worker from a private copy (pip builds in the source tree; the shared one stays untouched)."""
  copy = f"/tmp/cbert_jax-{snapshot}"
  return (f"rm -rf {copy} && cp -r {quote_path(code_dir)} {copy} && "
          f"{shell_join(python)} -m pip install --quiet {shlex.quote(copy + '[tpu]')}")


def check_prefix(flag: str, prefix: str) -> None:
  if not re.fullmatch(r"[a-z][a-z0-9-]*", prefix):
    raise LaunchError(f"{flag}={prefix!r}: must start with a lowercase letter and hold only "
                      "[a-z0-9-]")


def render_tpu_vm(launch: Launch, members: list[Member], ns: argparse.Namespace,
                  python: list[str]) -> list[Job]:
  missing = [f for f in ("zone", "project") if not getattr(ns, f)]
  if missing:
    raise LaunchError(f"--backend tpu-vm needs {' and '.join('--' + f for f in missing)}")
  check_prefix("--tpu_prefix", ns.tpu_prefix)
  types = {m.name: tpu_type(ns.tpu_generation, m.target_devices, m.name) for m in members}
  runtime = ns.runtime_version or TPU_RUNTIME[ns.tpu_generation]
  gcloud = [*shlex.split(ns.gcloud), "compute", "tpus", "tpu-vm"]
  tag = os.path.basename(launch.code_dir.rstrip("/")) or "code"   # the snapshot's hash
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    name = resource_name(ns.tpu_prefix, m.name)
    where = [f"--zone={ns.zone}", f"--project={ns.project}"]
    create = [*gcloud, "create", name, *where, f"--accelerator-type={types[m.name]}",
              f"--version={runtime}"]
    ssh = [*gcloud, "ssh", name, *where, "--worker=all",
           f"--command={remote_line(launch.code_dir, ns.setup, m, train, probe)}"]
    setup = [*gcloud, "ssh", name, *where, "--worker=all",
             f"--command={setup_line(launch.code_dir, python, tag)}"]
    steps = ([("create", create)] if ns.create_tpus else []) + (
        [("setup", setup)] if ns.setup_workers else []) + [("ssh", ssh)]
    jobs.append(Job(m, train, probe, steps,
                    info={"tpu_name": name, "tpu_type": types[m.name],
                          "create": shell_join(create)}))
  return jobs


def render_xpk(launch: Launch, members: list[Member], ns: argparse.Namespace,
               python: list[str]) -> list[Job]:
  for flag in ("cluster", "docker_image"):
    if not getattr(ns, flag):
      raise LaunchError(f"--backend xpk needs --{flag}")
  check_prefix("--workload_prefix", ns.workload_prefix)
  if ns.max_restarts < 0:
    raise LaunchError(f"--max_restarts={ns.max_restarts} must be >= 0")
  if ns.termination_grace_seconds < 1:
    raise LaunchError(f"--termination_grace_seconds={ns.termination_grace_seconds} must be >= 1")
  for name in ns.xpk_storage:
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
      raise LaunchError(f"--xpk_storage={name!r}: expected an xpk storage name ([a-z0-9-], a "
                        "letter first), as given to `xpk storage attach NAME`")
  types = {m.name: tpu_type(ns.tpu_generation, m.target_devices, m.name) for m in members}
  names = xpk_names(ns.workload_prefix, [m.name for m in members])
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, True)
    cmd = [*shlex.split(ns.xpk), "workload", "create", f"--cluster={ns.cluster}",
           f"--workload={names[m.name]}", f"--tpu-type={types[m.name]}", "--num-slices=1",
           f"--docker-image={ns.docker_image}"]
    cmd += [f"--project={ns.project}"] if ns.project else []
    cmd += [f"--zone={ns.zone}"] if ns.zone else []
    cmd += [f"--max-restarts={ns.max_restarts}",
            f"--termination-grace-period-seconds={ns.termination_grace_seconds}"]
    cmd += [f"--storage={name}" for name in ns.xpk_storage]
    cmd += [f"--command={remote_line(ns.code_dir, ns.setup, m, train, probe)}"]
    jobs.append(Job(m, train, probe, [("submit", cmd)],
                    info={"workload": names[m.name], "tpu_type": types[m.name]}))
  return jobs


def render_local(launch: Launch, members: list[Member], ns: argparse.Namespace,
                 python: list[str]) -> list[Job]:
  del ns  # local has no options that change the commands
  jobs = []
  for m in members:
    train, probe = member_commands(python, launch.experiment, m, launch.overrides, False)
    jobs.append(Job(m, train, probe, [("train", train), ("probe", probe)]))
  return jobs


RENDER = {"local": render_local, "slurm": render_slurm, "tpu-vm": render_tpu_vm,
          "xpk": render_xpk}


# ---------------------------------------------------- snapshot and manifest ---


def snapshot_extra(experiment: str) -> tuple[str, ...]:
  """The experiment file, when the commands name it inside the repository but outside
  SNAPSHOT_PATHS (e.g. tests/data/x.py): the snapshot must hold it too."""
  if os.path.isabs(experiment) or experiment.split("/", 1)[0] in SNAPSHOT_PATHS:
    return ()
  return (experiment,)


def snapshot_files(repo: str = REPO, extra: tuple[str, ...] = ()) -> list[str]:
  """The files a snapshot holds, relative to `repo`, sorted (caches and dotfiles left out)."""
  out = list(extra)
  for top in SNAPSHOT_PATHS:
    full = os.path.join(repo, top)
    if os.path.isfile(full):
      out.append(top)
    for dirpath, dirnames, filenames in os.walk(full):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
      out += [os.path.relpath(os.path.join(dirpath, f), repo) for f in filenames
              if not f.startswith(".") and not f.endswith(".pyc")]
  return sorted(out)


def snapshot_id(repo: str = REPO, extra: tuple[str, ...] = ()) -> str:
  """12 hex digits of a hash of the snapshot's paths and contents (read here, no git)."""
  h = hashlib.sha256()
  for rel in snapshot_files(repo, extra):
    h.update(rel.encode() + b"\0")
    with open(os.path.join(repo, rel), "rb") as f:
      h.update(f.read() + b"\0")
  return h.hexdigest()[:12]


def write_snapshot(dest: str, repo: str = REPO, extra: tuple[str, ...] = ()) -> bool:
  """Copies the snapshot files to `dest` (via a temp dir and a rename); False if it existed."""
  if os.path.isdir(dest):
    return False
  tmp = f"{dest}.tmp-{os.getpid()}"
  for rel in snapshot_files(repo, extra):
    os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
    shutil.copy2(os.path.join(repo, rel), os.path.join(tmp, rel))
  os.rename(tmp, dest)                            # whole or absent: a job never sees half of it
  return True


def git_commit(repo: str = REPO) -> str:
  """HEAD's commit, read from .git without running git ("" if it cannot be read)."""
  try:
    git = os.path.join(repo, ".git")
    if os.path.isfile(git):                       # a worktree: "gitdir: <path>"
      with open(git) as f:
        git = os.path.join(repo, f.read().split(":", 1)[1].strip())
    with open(os.path.join(git, "HEAD")) as f:
      head = f.read().strip()
    if not head.startswith("ref: "):
      return head                                 # detached HEAD: the commit itself
    ref = head[5:]
    if os.path.exists(os.path.join(git, ref)):
      with open(os.path.join(git, ref)) as f:
        return f.read().strip()
    with open(os.path.join(git, "packed-refs")) as f:
      return next((ln.split()[0] for ln in f if ln.rstrip().endswith(" " + ref)), "")
  except (OSError, IndexError, StopIteration):
    return ""


def manifest(launch: Launch) -> dict:
  """The launch record (<root>/launch_manifest.json), other members of earlier launches kept."""
  old = read_json(os.path.join(launch.root, MANIFEST)) or {}
  launched = {j.member.name for j in launch.jobs}
  kept = [m for m in old.get("members", []) if m.get("name") not in launched]
  return {"backend": launch.backend, "scale": launch.scale, "experiment": launch.experiment,
          "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": git_commit(),
          "code_dir": launch.code_dir or REPO, "shared_root": launch.shared_root,
          "overrides": launch.overrides,
          "members": kept + [member_record(j) for j in launch.jobs]}


def member_record(job: Job) -> dict:
  m = job.member
  return {"name": m.name, "arg": m.arg, "workdir": m.workdir, "target_devices": m.target_devices,
          "model": m.config.model_name, "size": m.config.model.size,
          "n_params": int(m.config.sweep.n_params), "compute": float(m.config.sweep.compute),
          "total_steps": m.total_steps, "batch_size": int(m.config.batch_size),
          "commands": {"train": shell_join(job.train), "probe": shell_join(job.probe)},
          "launch": [shell_join(argv) for _, argv in job.steps],
          "script": job.script_path, **job.info}


def read_json(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_root(root: str, scale: str) -> None:
  """A root holds one sweep: refuse one whose manifest names another scale."""
  for name in (MANIFEST, RUNNER_MANIFEST):
    old = (read_json(os.path.join(root, name)) or {}).get("scale")
    if old and old != scale:
      raise LaunchError(f"--workdir_root={root} holds a {old} sweep ({name}); this is the {scale} "
                        "sweep: use another --workdir_root")


# ----------------------------------------------------------------- running ---


class JobRunner:
  """Runs jobs' steps as subprocesses (local, tpu-vm), `parallel` members at a time."""

  def __init__(self, root: str, cwd: str):
    self.root, self.cwd = root, cwd
    self.lock = threading.Lock()
    self.procs: set = set()                       # live subprocesses, stopped on Ctrl-C
    self.stopping = False

  def log_path(self, name: str) -> str:
    return os.path.join(self.root, LOG_DIR, f"{name}.log")

  def run(self, job: Job) -> str:
    """done | failed | pending (interrupted) for one member; failures get a FAILED marker."""
    name, workdir, path = job.member.name, job.member.workdir, self.log_path(job.member.name)
    status_lib.clear_failed(workdir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as log:
      for kind, argv in job.steps:
        if self.stopping:
          return "pending"
        print(f"{name}: {kind} started (log: {path})", flush=True)
        log.write(f"==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {kind}: {shell_join(argv)}\n")
        log.flush()                               # the header before the step's own output
        start = os.path.getsize(path)
        returncode = self.call(argv, log)
        if returncode == 0:
          continue
        if self.stopping:
          return "pending"                        # stopped by us: resumable, not failed
        error = local.ErrorLine()
        with open(path, "rb") as f:
          f.seek(start)
          for line in f:                          # this step's output only
            error.add(line.decode(errors="replace"))
        reason = f"{kind}: {error.get(returncode)}"
        status_lib.mark_failed(workdir, reason)
        print(f"{name}: FAILED ({reason})", flush=True)
        return "failed"
    print(f"{name}: done", flush=True)
    return "done"

  def call(self, argv: list[str], log) -> int:
    """Runs argv with stdout+stderr into `log`; its exit status (127 if it cannot start)."""
    try:
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd)
    except OSError as e:
      log.write(f"cannot start {argv[0]}: {e}\n")
      log.flush()
      return 127
    with self.lock:
      self.procs.add(proc)
      if self.stopping:                           # stop() ran while this one was starting
        proc.terminate()
    try:
      return proc.wait()
    finally:
      with self.lock:
        self.procs.discard(proc)

  def stop(self) -> None:
    """SIGTERM to every live step (the trainer checkpoints and exits), then wait for them."""
    self.stopping = True
    with self.lock:
      procs = list(self.procs)
    for p in procs:
      p.terminate()
    for p in procs:
      p.wait()

  def run_all(self, jobs: list[Job], parallel: int) -> dict[str, str]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel)
    futures = {pool.submit(self.run, j): j.member.name for j in jobs}
    try:
      return {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
    except KeyboardInterrupt:
      print("interrupted: stopping the running members (they checkpoint; launch again to resume)",
            file=sys.stderr, flush=True)
      self.stop()
      raise
    finally:
      pool.shutdown(wait=True, cancel_futures=True)


def submit(jobs: list[Job]) -> int:
  """Runs each job's submission command (sbatch / xpk) in turn; the number that failed."""
  failed = 0
  for job in jobs:
    argv = job.steps[0][1]
    try:
      r = subprocess.run(argv, capture_output=True, text=True, check=False)
      output, code = (r.stdout + r.stderr).strip(), r.returncode
    except OSError as e:
      output, code = f"cannot run {argv[0]}: {e}", 127
    print(f"{job.member.name}: {output or f'exit status {code}'}", flush=True)
    failed += code != 0
  return failed


# ----------------------------------------------------------------- the CLI ---


def launch_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m launch.sweep", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True,
                 help="experiment file[:scale], e.g. experiments/sweep.py:paper (default scale)")
  p.add_argument("--backend", required=True, choices=BACKENDS)
  p.add_argument("--workdir_root", default="",
                 help="members go to <root>/<member> (default: <shared_root>/<experiment>_<scale>)")
  p.add_argument("--shared_root", default="",
                 help="storage every host mounts at this path (NFS, Filestore, a gcsfuse bucket): "
                      "the workdirs, the code snapshot (code/<hash>) and the data cache (cache/)")
  p.add_argument("--execute", action="store_true", help="write, run or submit (default: dry run)")
  p.add_argument("--override", action="append", default=[],
                 help="trainer flag for every member, e.g. --override=--config.data.sources=...")
  p.add_argument("--members", default="", help="comma list of member names (default: all)")
  p.add_argument("--python", default=None,
                 help="interpreter (a shell-split prefix); default: this one for local, python3 "
                      "for tpu-vm, python for slurm and xpk")
  p.add_argument("--setup", default="",
                 help="shell line run before the member (e.g. source venv/bin/activate)")
  p.add_argument("--code_dir", default="",
                 help="slurm/tpu-vm/xpk: run from this checkout (default: slurm, tpu-vm use a "
                      "snapshot under <root>/code/; xpk the image's working directory)")
  p.add_argument("--include_running", action="store_true",
                 help="also launch members that look running (metrics.jsonl written in the last "
                      "10 minutes): by default they are skipped, as another process may train them")
  p.add_argument("--parallel", type=int, default=None,
                 help="local/tpu-vm: members at once (default 1 for local, all for tpu-vm)")
  g = p.add_argument_group("slurm")
  g.add_argument("--partition", default="")
  g.add_argument("--account", default="")
  g.add_argument("--gpus_per_node", type=int, default=8)
  g.add_argument("--gpu_type", choices=GPU_CHIPS, default="h100",
                 help="the GPUs, for each member's memory plan (sets --config.sweep.chip)")
  g.add_argument("--time", default="48:00:00", help="time limit per job (SLURM format)")
  g.add_argument("--signal_seconds", type=int, default=300,
                 help="USR1 this long before the time limit: checkpoint, then requeue")
  g.add_argument("--sbatch", default="sbatch", help="the submit command (a shell-split prefix)")
  g = p.add_argument_group("tpu-vm and xpk")
  g.add_argument("--zone", default="")
  g.add_argument("--project", default="")
  g.add_argument("--tpu_generation", choices=tuple(TPU_PREFIX), default="v5p")
  g.add_argument("--tpu_prefix", default="cbert-", help="TPU VM name = prefix + member")
  g.add_argument("--runtime_version", default="",
                 help="TPU VM software version (default per generation: " +
                      ", ".join(f"{k} {v}" for k, v in TPU_RUNTIME.items()) + ")")
  g.add_argument("--create_tpus", action="store_true",
                 help="tpu-vm --execute: create the TPU VMs first")
  g.add_argument("--setup_workers", action="store_true",
                 help="tpu-vm: before the member, pip install the code snapshot with its pinned "
                      "dependencies (the tpu extra) on every worker")
  g.add_argument("--gcloud", default="gcloud", help="the gcloud command (a shell-split prefix)")
  g.add_argument("--cluster", default="", help="xpk: the GKE cluster")
  g.add_argument("--docker_image", default="", help="xpk: the image holding this repository")
  g.add_argument("--workload_prefix", default="cbert-", help="xpk: workload name = prefix + member")
  g.add_argument("--max_restarts", type=int, default=DEFAULT_MAX_RESTARTS,
                 help="xpk --max-restarts: JobSet restarts after a preemption (the member wrapper "
                      f"exits {STOPPED_EXIT}) or a crash with exit status 42 or 127-255")
  g.add_argument("--termination_grace_seconds", type=int, default=DEFAULT_GRACE_S,
                 help="xpk --termination-grace-period-seconds: how long a pod has after SIGTERM "
                      "to finish its step and checkpoint before SIGKILL")
  g.add_argument("--xpk_storage", action="append", default=[],
                 help="xpk: a storage attached with `xpk storage attach NAME` to mount "
                      "(--storage=NAME; repeat for more); mount --shared_root this way")
  g.add_argument("--xpk", default="xpk", help="the xpk command (a shell-split prefix)")
  return p


# Flags whose values end up in a script line, an #SBATCH line or a remote command.
ONE_LINE_FLAGS = ("config", "workdir_root", "shared_root", "members", "python", "setup",
                  "code_dir", "partition", "account", "time", "sbatch", "zone", "project",
                  "tpu_prefix", "runtime_version", "gcloud", "cluster", "docker_image",
                  "workload_prefix", "xpk")


def check_one_line(ns: argparse.Namespace) -> None:
  """Refuses a value holding a line break (or another control character) with one line naming
  its flag: each value goes into one line of a script or one remote command."""
  values = [(f, getattr(ns, f)) for f in ONE_LINE_FLAGS]
  values += [("override", v) for v in ns.override] + [("xpk_storage", v) for v in ns.xpk_storage]
  for flag, value in values:
    if isinstance(value, str) and any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in value):
      raise LaunchError(f"--{flag}={value!r}: holds a line break or control character; every "
                        "value goes into one line of a script or remote command")


def effective_overrides(overrides: list[str], shared_root: str) -> list[str]:
  """The overrides every member gets: with --shared_root, the data cache on it first (unless an
  override sets data.cache_dir)."""
  if shared_root and not any(o.split("=", 1)[0] == "--config.data.cache_dir" for o in overrides):
    return [f"--config.data.cache_dir={os.path.join(shared_root, 'cache')}", *overrides]
  return list(overrides)


def planned_chip(ns: argparse.Namespace) -> str:
  """The chip a backend's members run on (cbert_jax/scaling/memory.py:CHIPS): --gpu_type for
  slurm, --tpu_generation for tpu-vm and xpk; "" for local (no memory plan)."""
  return {"slurm": ns.gpu_type, "tpu-vm": ns.tpu_generation, "xpk": ns.tpu_generation}.get(
      ns.backend, "")


def build(argv: list[str]) -> tuple[Launch, argparse.Namespace]:
  """Parses a launch command line and renders every member's job; raises LaunchError."""
  ns = launch_parser().parse_args(argv)
  check_one_line(ns)
  if ns.parallel is not None and ns.parallel < 1:
    raise LaunchError(f"--parallel={ns.parallel} must be >= 1")
  if not ns.workdir_root and not ns.shared_root:
    raise LaunchError("--workdir_root: required, or --shared_root (the workdirs then go to "
                      "<shared_root>/<experiment>_<scale>)")
  shared = os.path.abspath(ns.shared_root) if ns.shared_root else ""
  overrides = effective_overrides(ns.override, shared)
  only = [n.strip() for n in ns.members.split(",") if n.strip()]
  scale, experiment, members = load_members(ns.config, "", overrides, only)
  chip = planned_chip(ns)
  if (chip and members and all(m.target_devices > 0 for m in members)
      and not any(o.startswith("--config.sweep.chip=") for o in overrides)):
    # Members are planned (memory: remat, ce_chunk, micro-batches) for the chip they run on; the
    # trainer gets the same flag, so it derives the same plan.
    overrides = [*overrides, f"--config.sweep.chip={chip}"]
    scale, experiment, members = load_members(ns.config, "", overrides, only)
  stem = os.path.splitext(os.path.basename(experiment))[0]
  root = (os.path.abspath(ns.workdir_root) if ns.workdir_root
          else os.path.join(shared, f"{stem}_{scale}"))
  for m in members:
    if any(ord(c) < 32 for c in m.name + m.arg):
      raise LaunchError(f"--config={ns.config}: member {m.name!r} ({m.arg!r}) holds a control "
                        "character; member names and args go into scripts")
    m.workdir = os.path.join(root, m.name)
  check_root(root, scale)
  # slurm and tpu-vm run from a code snapshot unless --code_dir names a checkout on the hosts;
  # xpk runs in its image (optionally in --code_dir); local in this repository.
  snapshot = ns.backend in ("slurm", "tpu-vm") and not ns.code_dir
  extra = snapshot_extra(experiment) if snapshot else ()
  code_dir = (os.path.join(shared or root, "code", snapshot_id(REPO, extra)) if snapshot
              else "" if ns.backend == "local" else ns.code_dir)
  launch = Launch(ns.backend, scale, experiment, root, overrides, [], code_dir, snapshot, shared,
                  extra)
  python = shlex.split(ns.python) if ns.python is not None else [DEFAULT_PYTHON[ns.backend]]
  launch.jobs = RENDER[ns.backend](launch, members, ns, python)
  return launch, ns


def member_states(jobs: list[Job]) -> dict:
  return {j.member.name: status_lib.member_state(j.member.name, j.member.workdir, probe=True)
          for j in jobs}


def describe(job: Job) -> str:
  """Where a job runs: ', 1 node x 8 GPUs' | ', TPU VM <name> (v5p-16)' | ', workload <name>'."""
  i = job.info
  if "nodes" in i:
    return (f", {i['nodes']} node{'s' if i['nodes'] > 1 else ''} x {i['gpus_per_node']} GPUs, "
            f"{i['tasks']} tasks")
  if "tpu_name" in i:
    return f", TPU VM {i['tpu_name']} ({i['tpu_type']})"
  if "workload" in i:
    return f", workload {i['workload']} ({i['tpu_type']})"
  return ""


def skipped(state: str, include_running: bool) -> bool:
  """Done members are never launched again; running ones only with --include_running."""
  return state == "done" or (state == "running" and not include_running)


def show(launch: Launch, states: dict, execute: bool, include_running: bool) -> None:
  """Prints the plan: per member its commands or script; skipped members say why."""
  n = len(launch.jobs)
  print(f"launch.sweep: {launch.scale} sweep of {launch.experiment}, {n} members, backend "
        f"{launch.backend}, workdirs under {launch.root}")
  image = "the image's working directory"        # xpk without --code_dir
  where = launch.code_dir or (REPO if launch.backend == "local" else image)
  print(f"code: {where}" + (" (a snapshot, written with --execute)" if launch.snapshot else ""))
  if launch.shared_root:
    cache = next((o.split("=", 1)[1] for o in launch.overrides
                  if o.split("=", 1)[0] == "--config.data.cache_dir"), "")
    print(f"shared root: {launch.shared_root} (workdirs {launch.root}, data cache {cache})")
  if not execute:
    print(f"dry run: nothing is started or written; --execute writes "
          f"{os.path.join(launch.root, MANIFEST)}" +
          (" and the scripts" if launch.backend == "slurm" else "") + " and launches")
  for i, job in enumerate(launch.jobs):
    m, st = job.member, states[job.member.name]
    tag = f"[{i + 1}/{n}] {m.name}"
    if st.state == "done":
      print(f"{tag}: done, skipped")
      continue
    if st.state == "running" and not include_running:
      print(f"{tag}: running (metrics.jsonl written in the last "
            f"{status_lib.RUNNING_WINDOW_S / 60:.0f} min), skipped; --include_running launches it")
      continue
    print(f"{tag} ({st.state}; {m.summary()}{describe(job)})")
    if job.script:
      print(f"# {job.script_path}\n{job.script}", end="")
    if "create" in job.info and job.steps[0][0] != "create":   # tpu-vm: shown, not run
      print(f"  {job.info['create']}")
    for _, argv in job.steps:
      print(f"  {shell_join(argv)}")
  sys.stdout.flush()


def write_files(launch: Launch) -> None:
  """--execute: the code snapshot, the slurm scripts + configs, the log dir, the manifest."""
  os.makedirs(os.path.join(launch.root, LOG_DIR), exist_ok=True)
  if launch.snapshot:
    os.makedirs(os.path.dirname(launch.code_dir), exist_ok=True)
    fresh = write_snapshot(launch.code_dir, REPO, launch.snapshot_extra)
    print(f"code snapshot: {launch.code_dir}" + ("" if fresh else " (exists: same code)"))
  for job in launch.jobs:
    if job.script_path:
      os.makedirs(os.path.dirname(job.script_path), exist_ok=True)
      with open(job.script_path, "w") as f:
        f.write(job.script)
      os.chmod(job.script_path, 0o755)
      config_path = job.script_path[:-len(".sbatch")] + ".config.json"
      status_lib.write_json_atomic(config_path, {
          "arg": job.member.arg, "experiment": launch.experiment, "overrides": launch.overrides,
          "config": json.loads(json.dumps(job.member.config.to_dict(), default=str))})
  status_lib.write_json_atomic(os.path.join(launch.root, MANIFEST), manifest(launch))


def execute(launch: Launch, ns: argparse.Namespace, states: dict) -> int:
  """Writes the files, then runs (local, tpu-vm) or submits (slurm, xpk) the members not done."""
  write_files(launch)
  todo = [j for j in launch.jobs if not skipped(states[j.member.name].state, ns.include_running)]
  if launch.backend in ("slurm", "xpk"):
    failed = submit(todo)
    if failed:
      print(f"{failed} of {len(todo)} submissions failed", file=sys.stderr)
    return 1 if failed else 0
  parallel = ns.parallel or (1 if launch.backend == "local" else max(1, len(todo)))
  try:
    results = JobRunner(launch.root, REPO).run_all(todo, parallel)
  except KeyboardInterrupt:
    return 130                                    # the members stopped; they resume when launched

  final = [status_lib.member_state(j.member.name, j.member.workdir, probe=True)
           for j in launch.jobs]
  print(f"\nsweep {launch.root}:\n{status_lib.table(final)}", flush=True)
  failed = [name for name, result in results.items() if result != "done"]
  if failed:
    print(f"{len(failed)} of {len(todo)} members failed: {', '.join(sorted(failed))}; logs in "
          f"{os.path.join(launch.root, LOG_DIR)}/", file=sys.stderr)
  return 1 if failed else 0


def launch_main(argv: list[str]) -> int:
  try:
    launch, ns = build(argv)
  except LaunchError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    return 2
  no_corpus = [j.member.name for j in launch.jobs
               if j.member.config.data.corpus == "sources" and not j.member.config.data.sources]
  if no_corpus:   # the paper scale trains on a corpus only the user has
    message = (f"data.sources is empty for {len(no_corpus)} member(s) ({no_corpus[0]}, ...): pass "
               "--override=--config.data.sources=PATTERN (your preprocessed pod corpus)")
    if ns.execute:
      print(f"error: {message}", file=sys.stderr)
      return 2
    print(f"warning: {message}; --execute refuses until then", file=sys.stderr)
  too_big = [j.member.name for j in launch.jobs
             if j.member.config.sweep.memory_verdict == "needs more chips"]
  if too_big:   # no remat / ce_chunk / micro-batch setting fits the member's chips
    message = (f"{len(too_big)} member(s) do not fit their chips at any memory setting "
               f"({', '.join(too_big)}): give them more chips (sweep.target_devices) or a chip "
               "with more memory; `python -m launch.compile_check` shows the figures")
    if ns.execute:
      print(f"error: {message}", file=sys.stderr)
      return 2
    print(f"warning: {message}; --execute refuses until then", file=sys.stderr)
  if launch.backend == "xpk" and launch.shared_root and not ns.xpk_storage:
    print(f"warning: --shared_root={launch.shared_root} without --xpk_storage: the pods see it "
          "only if a storage is attached there with --auto-mount=true (else the workdirs are "
          "lost with each pod); `xpk storage attach NAME --mount-point=... --auto-mount=false` "
          "and --xpk_storage NAME mount it for these workloads", file=sys.stderr)
  states = member_states(launch.jobs)
  show(launch, states, ns.execute, ns.include_running)
  return execute(launch, ns, states) if ns.execute else 0


# ------------------------------------------------------------------ status ---


def find_members(root: str) -> tuple[str, list[tuple[str, str]]]:
  """(where they came from, [(member, workdir)]) of the sweep under `root`."""
  launched = read_json(os.path.join(root, MANIFEST))
  if launched and launched.get("members"):
    return MANIFEST, [(m["name"], m.get("workdir") or os.path.join(root, m["name"]))
                      for m in launched["members"]]
  ran = read_json(os.path.join(root, RUNNER_MANIFEST))
  if ran and ran.get("members"):
    return RUNNER_MANIFEST, [(m["name"], os.path.join(root, m["name"])) for m in ran["members"]]
  names = sorted(n for n in os.listdir(root)
                 if os.path.isfile(os.path.join(root, n, "config.json")))
  return "member directories", [(n, os.path.join(root, n)) for n in names]


def status_main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="python -m launch.sweep status",
                              description="State of every member of a launched sweep.")
  p.add_argument("--workdir_root", required=True)
  p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                 help="done needs the probe results too (--no-probe: the final checkpoint only)")
  ns = p.parse_args(argv)
  root = os.path.abspath(ns.workdir_root)
  if not os.path.isdir(root):
    print(f"error: --workdir_root={ns.workdir_root}: no such directory", file=sys.stderr)
    return 2
  source, members = find_members(root)
  states = [status_lib.member_state(n, w, probe=ns.probe) for n, w in members]
  counts = {k: sum(s.state == k for s in states) for k in ("done", "running", "pending", "failed")}
  print(f"{root} ({source}): {len(states)} members, "
        + ", ".join(f"{v} {k}" for k, v in counts.items()))
  if states:
    print(status_lib.table(states))
  progress = read_json(os.path.join(root, status_lib.STATUS_FILE)) or {}
  if progress.get("progress"):   # the in-process runner's last line: FLOPs done, rate, ETA
    print(f"runner ({progress.get('updated', '?')}): {progress['progress']}")
  live = live_eta(root, states, progress.get("flops_per_sec") or 0.0)
  if live:
    print(live)
  return 0


def live_eta(root: str, states: list, rate: float) -> str:
  """Now: the FLOPs done (finished members + the running ones' logged fraction) and the time the
  rest takes at the runner's measured FLOP/s; "" without a manifest with per-member compute."""
  manifest = read_json(os.path.join(root, "sweep.json")) or read_json(
      os.path.join(root, "launch_manifest.json")) or {}
  compute = {m["name"]: float(m.get("compute") or 0) for m in manifest.get("members", [])}
  total = sum(compute.values())
  if not total:
    return ""
  done = sum(compute.get(st.name, 0.0) * (1.0 if st.state == "done" else
                                          st.step / st.total_steps if st.total_steps else 0.0)
             for st in states)
  eta = (f", ETA {format_duration((total - done) / rate)} at {rate:.3g} FLOP/s"
         if rate > 0 else "")
  return f"now: {100 * done / total:.1f}% of the sweep's {total:.3g} training FLOPs done{eta}"


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["status"]:
    return status_main(argv[1:])
  return launch_main(argv)


if __name__ == "__main__":
  sys.exit(main())
