r"""Launch an experiment's members on this machine, SLURM, Cloud TPU VMs or xpk (GKE).

  python -m launch.sweep --config experiments/sweep.py --backend slurm --shared_root /shared
      # dry run (the default): prints every member's commands or script; starts, writes nothing
  python -m launch.sweep ... --execute        # writes the scripts + manifest, runs or submits them
  python -m launch.sweep status --workdir_root /shared/sweep_paper   # pending/running/done/failed
  python -m launch.sweep --config experiments/smoke.py --backend local \
      --args model=bert model=crossbert --workdir_root runs/smoke_pair --execute --retries 1

The members are the experiment's get_sweep(scale) (`--config FILE:scale`, default paper;
`--members a,b` picks some), or with `--args` one member per config arg of any experiment file
(launch/members.py). Done members are skipped, and so are members that look running
(metrics.jsonl written in the last 10 minutes) unless --include_running; an interrupted member
resumes from its checkpoint when launched again. The backends, the processes per accelerator and
the member wrapper: launch/backends.py; the code snapshot, --shared_root and the manifest:
launch/snapshot.py; members run here (local, tpu-vm), retries, logs and `status`: launch/jobs.py.
docs/running_on_a_pod.md walks through each backend.

Every member exports its chip's XLA flags and variables (XLA_FLAGS on a GPU, LIBTPU_INIT_ARGS
on a TPU: cbert_jax/scaling/chips.py, sources in docs/launch.md); the dry run shows them,
`--xla_flags=V` replaces the flags and `--xla_flags=` sets none of them.

A member planned for a TPU shows its latest TPU compile beside its analytic plan (the rows of
`launch.compile_check --archive`, results/tpu_aot/<chip>/ by default, `--aot DIR`): the compiled
HBM per chip and the compiler's step-time estimate, or STALE when the member's config changed since;
the dry run also gives the sweep's chip-hours at a stated MFU and from the compiler's estimate.
`--execute` refuses when a member's current TPU compile does not fit its chip
(`--ignore_tpu_compile` overrides).

Bad input (a flag, an override, a member that does not fit a backend, a value with a newline:
every value ends up in a script line, an #SBATCH line or a remote command) is one `error:` line
naming the flag, before anything is rendered; exit status 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from cbert_jax.errors import ConfigError
from cbert_jax.run import status as status_lib
from cbert_jax.scaling import compiled as compiled_lib
from cbert_jax.scaling.chips import GPU_CHIPS, TPU_PREFIX
from launch import jobs as jobs_lib
from launch.backends import (
  BACKENDS,
  DEFAULT_GRACE_S,
  DEFAULT_MAX_RESTARTS,
  DEFAULT_PYTHON,
  RENDER,
  STOPPED_EXIT,
  TPU_RUNTIME,
  describe,
  env_text,
  launch_env,
  shell_join,
  xpk_storage_attach,
)
from launch.commit_check import MOUNT_OPTIONS
from launch.members import LOG_DIR, REPO, Launch, LaunchError, arg_members, load_members
from launch.snapshot import (
  MANIFEST,
  check_root,
  read_json,
  snapshot_extra,
  snapshot_id,
  write_files,
)

# ----------------------------------------------------------------- the CLI ---


def launch_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="python -m launch.sweep",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument(
    "--config",
    required=True,
    help="experiment file[:scale], e.g. experiments/sweep.py:paper (default scale)",
  )
  p.add_argument("--backend", required=True, choices=BACKENDS)
  p.add_argument(
    "--args",
    nargs="*",
    default=None,
    help="local: one member per config arg of --config (any experiment file), e.g. "
    "--args model=bert model=crossbert; the trainer checks each config",
  )
  p.add_argument(
    "--workdir_root",
    default="",
    help="members go to <root>/<member> (default: <shared_root>/<experiment>_<scale>)",
  )
  p.add_argument(
    "--shared_root",
    default="",
    help="storage every host mounts at this path (NFS, Filestore, a gcsfuse bucket): "
    "the workdirs, the code snapshot (code/<hash>) and the data cache (cache/)",
  )
  p.add_argument("--execute", action="store_true", help="write, run or submit (default: dry run)")
  p.add_argument(
    "--override",
    action="append",
    default=[],
    help="trainer flag for every member, e.g. --override=--config.data.sources=...",
  )
  p.add_argument("--members", default="", help="comma list of member names (default: all)")
  p.add_argument(
    "--python",
    default=None,
    help="interpreter (a shell-split prefix); default: this one for local, "
    "~/cbert_jax-venv/bin/python for tpu-vm (the environment --setup_workers makes, with "
    "Python 3.11 from uv), python for slurm and xpk",
  )
  p.add_argument(
    "--setup", default="", help="shell line run before the member (e.g. source venv/bin/activate)"
  )
  p.add_argument(
    "--xla_flags",
    default=None,
    help="slurm/tpu-vm/xpk: the XLA flags every member runs with, replacing the chip's from "
    "cbert_jax/scaling/chips.py (XLA_FLAGS on a GPU, LIBTPU_INIT_ARGS on a TPU; the chip's other "
    "variables, e.g. JAX_OPTIMIZATION_LEVEL, stay). --xla_flags= (empty) sets none of the "
    "chip's flags or variables. Default: the chip's (--gpu_type, --tpu_generation), shown by the "
    "dry run; docs/launch.md lists them with their sources",
  )
  p.add_argument(
    "--code_dir",
    default="",
    help="slurm/tpu-vm/xpk: run from this checkout (default: slurm, tpu-vm use a "
    "snapshot under <root>/code/; xpk the image's working directory)",
  )
  p.add_argument(
    "--aot",
    default=compiled_lib.ARCHIVE,
    help="the TPU compiles (launch.compile_check --archive: <DIR>/<chip>/<member>.json) shown "
    "beside each member's plan and checked by --execute; default results/tpu_aot",
  )
  p.add_argument(
    "--ignore_tpu_compile",
    action="store_true",
    help="--execute even where a member's latest TPU compile does not fit its chip",
  )
  p.add_argument(
    "--include_running",
    action="store_true",
    help="also launch members that look running (metrics.jsonl written in the last "
    "10 minutes): by default they are skipped, as another process may train them",
  )
  p.add_argument(
    "--parallel",
    type=int,
    default=None,
    help="local/tpu-vm: members at once (default 1 for local, all for tpu-vm)",
  )
  p.add_argument(
    "--retries",
    type=int,
    default=None,
    help="local/tpu-vm: run a failing member again up to this many times, from the "
    "step that failed (default 0; 1 for --args members)",
  )
  g = p.add_argument_group("slurm")
  g.add_argument("--partition", default="")
  g.add_argument("--account", default="")
  g.add_argument("--gpus_per_node", type=int, default=8)
  g.add_argument(
    "--gpu_type",
    choices=GPU_CHIPS,
    default="h100",
    help="the GPUs, for each member's memory plan (sets --config.sweep.chip)",
  )
  g.add_argument("--time", default="48:00:00", help="time limit per job (SLURM format)")
  g.add_argument(
    "--signal_seconds",
    type=int,
    default=300,
    help="USR1 this long before the time limit: checkpoint, then requeue",
  )
  g.add_argument("--sbatch", default="sbatch", help="the submit command (a shell-split prefix)")
  g = p.add_argument_group("tpu-vm and xpk")
  g.add_argument("--zone", default="")
  g.add_argument("--project", default="")
  g.add_argument("--tpu_generation", choices=tuple(TPU_PREFIX), default="v5p")
  g.add_argument("--tpu_prefix", default="cbert-", help="TPU VM name = prefix + member")
  g.add_argument(
    "--runtime_version",
    default="",
    help="TPU VM software version (default per generation: "
    + ", ".join(f"{k} {v}" for k, v in TPU_RUNTIME.items())
    + ")",
  )
  g.add_argument(
    "--create_tpus", action="store_true", help="tpu-vm --execute: create the TPU VMs first"
  )
  g.add_argument(
    "--setup_workers",
    action="store_true",
    help="tpu-vm: before the member, on every worker: uv makes ~/cbert_jax-venv with its own "
    "Python 3.11 (the images' python3 is 3.10), checks the version (one line and exit 1 if "
    "not >= 3.11), then installs the code snapshot with its pinned dependencies (the tpu "
    "extra) into it",
  )
  g.add_argument("--gcloud", default="gcloud", help="the gcloud command (a shell-split prefix)")
  g.add_argument(
    "--cluster",
    default="",
    help="xpk: the GKE cluster (an xpk name: lowercase letters, digits and '-', a letter "
    "first, at most 40 characters)",
  )
  g.add_argument("--docker_image", default="", help="xpk: the image holding this repository")
  g.add_argument("--workload_prefix", default="cbert-", help="xpk: workload name = prefix + member")
  g.add_argument(
    "--max_restarts",
    type=int,
    default=DEFAULT_MAX_RESTARTS,
    help="xpk --max-restarts: JobSet restarts after a preemption (the member wrapper "
    f"exits {STOPPED_EXIT}) or a crash with exit status 42 or 127-255",
  )
  g.add_argument(
    "--termination_grace_seconds",
    type=int,
    default=DEFAULT_GRACE_S,
    help="xpk --termination-grace-period-seconds: how long a pod has after SIGTERM "
    "to finish its step and checkpoint before SIGKILL",
  )
  g.add_argument(
    "--xpk_storage",
    action="append",
    default=[],
    help="xpk: a storage attached with `xpk storage attach NAME` to mount "
    "(--storage=NAME; repeat for more); mount --shared_root this way. The dry run shows the "
    "attach command (a gcsfuse bucket needs rename-dir-limit for checkpoints to commit); "
    "each workload first checks that a checkpoint can commit there",
  )
  g.add_argument("--xpk", default="xpk", help="the xpk command (a shell-split prefix)")
  return p


# Flags whose values end up in a script line, an #SBATCH line or a remote command.
ONE_LINE_FLAGS = (
  "config",
  "workdir_root",
  "shared_root",
  "members",
  "python",
  "setup",
  "code_dir",
  "partition",
  "account",
  "time",
  "sbatch",
  "zone",
  "project",
  "tpu_prefix",
  "runtime_version",
  "gcloud",
  "cluster",
  "docker_image",
  "workload_prefix",
  "xpk",
  "xla_flags",
)


def check_one_line(ns: argparse.Namespace) -> None:
  """Refuses a value holding a line break (or another control character) with one line naming
  its flag: each value goes into one line of a script or one remote command."""
  values = [(f, getattr(ns, f)) for f in ONE_LINE_FLAGS]
  values += [("override", v) for v in ns.override] + [("xpk_storage", v) for v in ns.xpk_storage]
  values += [("args", v) for v in ns.args or []]
  for flag, value in values:
    if isinstance(value, str) and any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in value):
      raise LaunchError(
        f"--{flag}={value!r}: holds a line break or control character; every "
        "value goes into one line of a script or remote command"
      )


def effective_overrides(overrides: list[str], shared_root: str) -> list[str]:
  """The overrides every member gets: with --shared_root, the data cache on it first (unless an
  override sets data.cache_dir)."""
  if shared_root and not any(o.split("=", 1)[0] == "--config.data.cache_dir" for o in overrides):
    return [f"--config.data.cache_dir={os.path.join(shared_root, 'cache')}", *overrides]
  return list(overrides)


def planned_chip(ns: argparse.Namespace) -> str:
  """The chip a backend's members run on (cbert_jax/scaling/chips.py:CHIPS): --gpu_type for
  slurm, --tpu_generation for tpu-vm and xpk; "" for local (no memory plan)."""
  return {"slurm": ns.gpu_type, "tpu-vm": ns.tpu_generation, "xpk": ns.tpu_generation}.get(
    ns.backend, ""
  )


def check_flags(ns: argparse.Namespace) -> None:
  """The flags that need no experiment file: one `error:` line each."""
  check_one_line(ns)
  if ns.parallel is not None and ns.parallel < 1:
    raise LaunchError(f"--parallel={ns.parallel} must be >= 1")
  if ns.retries is not None and ns.retries < 0:
    raise LaunchError(f"--retries={ns.retries} must be >= 0")
  if ns.retries is not None and ns.backend in ("slurm", "xpk"):
    raise LaunchError(
      f"--retries: --backend {ns.backend} submits the members (slurm requeues "
      "a member, xpk restarts it up to --max_restarts times)"
    )
  if ns.xla_flags is not None and ns.backend == "local":
    raise LaunchError(
      "--xla_flags: --backend local runs the members with this shell's environment (set "
      "XLA_FLAGS there); the chip's flags are for slurm, tpu-vm and xpk"
    )
  if ns.args is not None and ns.backend != "local":
    raise LaunchError(
      f"--args: members of config args run with --backend local; --backend "
      f"{ns.backend} launches the members of an experiment's get_sweep"
    )
  if not ns.workdir_root and not ns.shared_root:
    raise LaunchError(
      "--workdir_root: required, or --shared_root (the workdirs then go to "
      "<shared_root>/<experiment>_<scale>)"
    )
  for flag, value in (("--workdir_root", ns.workdir_root), ("--shared_root", ns.shared_root)):
    if value and "://" in value:
      raise LaunchError(
        f"{flag}={value}: a URL; workdirs are files every process opens, so give the path "
        "where the bucket is mounted on every host (e.g. a GCS FUSE mount such as /gcs/B/run; "
        "xpk: --storage=NAME)"
      )


def build(argv: list[str]) -> tuple[Launch, argparse.Namespace]:
  """Parses a launch command line and renders every member's job; raises LaunchError."""
  ns = launch_parser().parse_args(argv)
  check_flags(ns)
  shared = os.path.abspath(ns.shared_root) if ns.shared_root else ""
  overrides = effective_overrides(ns.override, shared)
  only = [n.strip() for n in ns.members.split(",") if n.strip()]
  plain = ns.args is not None
  if plain:  # --args: the configs are the trainer's to check
    scale, (experiment, members) = "", arg_members(ns.config, ns.args, "", overrides, only)
  else:
    scale, experiment, members = load_members(ns.config, "", overrides, only)
  chip = planned_chip(ns)
  if (
    chip
    and members
    and all(m.target_devices > 0 for m in members)
    and not any(o.startswith("--config.sweep.chip=") for o in overrides)
  ):
    # Members are planned (memory: remat, ce_chunk, micro-batches) for the chip they run on; the
    # trainer gets the same flag, so it derives the same plan.
    overrides = [*overrides, f"--config.sweep.chip={chip}"]
    scale, experiment, members = load_members(ns.config, "", overrides, only)
  stem = os.path.splitext(os.path.basename(experiment))[0]
  root = (
    os.path.abspath(ns.workdir_root)
    if ns.workdir_root
    else os.path.join(shared, f"{stem}_{scale}" if scale else stem)
  )
  for m in members:
    if any(ord(c) < 32 for c in m.name + m.arg):
      raise LaunchError(
        f"--config={ns.config}: member {m.name!r} ({m.arg!r}) holds a control "
        "character; member names and args go into scripts"
      )
    m.workdir = os.path.join(root, m.name)
    if m.config is not None:  # its latest TPU compile, if planned for a TPU
      m.compiled = compiled_lib.member_lookup(m.name, m.config, ns.aot)
  if not plain:
    check_root(root, scale)
  # slurm and tpu-vm run from a code snapshot unless --code_dir names a checkout on the hosts;
  # xpk runs in its image (optionally in --code_dir); local in this repository.
  snapshot = ns.backend in ("slurm", "tpu-vm") and not ns.code_dir
  extra = snapshot_extra(experiment) if snapshot else ()
  code_dir = (
    os.path.join(shared or root, "code", snapshot_id(REPO, extra))
    if snapshot
    else ""
    if ns.backend == "local"
    else ns.code_dir
  )
  launch = Launch(
    ns.backend, scale, experiment, root, overrides, [], code_dir, snapshot, shared, extra, plain
  )
  # The chip's XLA flags and variables (or --xla_flags) every member exports; rendered by each
  # backend, shown by the dry run, recorded in the manifest and by the trainer (config.json).
  launch.chip = planned_chip(ns)
  launch.env = launch_env(launch.chip, ns.xla_flags)
  launch.xla_flags_given = ns.xla_flags is not None
  python = shlex.split(ns.python) if ns.python is not None else [DEFAULT_PYTHON[ns.backend]]
  launch.jobs = RENDER[ns.backend](launch, members, ns, python)
  return launch, ns


def show(
  launch: Launch, states: dict, execute: bool, include_running: bool, attach: list = ()
) -> None:
  """Prints the plan: per member its commands or script; skipped members say why. `attach`: the
  `xpk storage attach` commands to run once first (xpk with --xpk_storage)."""
  n = len(launch.jobs)
  if launch.plain:
    print(
      f"launch.sweep: {n} member{'s' if n != 1 else ''} of {launch.experiment} (--args), "
      f"backend local, workdirs under {launch.root}"
    )
  else:
    print(
      f"launch.sweep: {launch.scale} sweep of {launch.experiment}, {n} members, backend "
      f"{launch.backend}, workdirs under {launch.root}"
    )
  image = "the image's working directory"  # xpk without --code_dir
  where = launch.code_dir or (REPO if launch.backend == "local" else image)
  print(f"code: {where}" + (" (a snapshot, written with --execute)" if launch.snapshot else ""))
  if launch.chip:
    print(env_line(launch))
  laws = sorted(
    {
      j.member.config.sweep.get("laws_source", "")
      for j in launch.jobs
      if j.member.config is not None
    }
    - {""}
  )
  if laws:
    print(f"LR and batch size from: {'; '.join(laws)}")
  hours = chip_hours_line([j.member for j in launch.jobs])
  if hours:
    print(hours)
  if launch.shared_root:
    cache = next(
      (
        o.split("=", 1)[1]
        for o in launch.overrides
        if o.split("=", 1)[0] == "--config.data.cache_dir"
      ),
      "",
    )
    print(f"shared root: {launch.shared_root} (workdirs {launch.root}, data cache {cache})")
  if attach:
    print(
      "xpk storage, attached once before the workloads (not by the launcher): a gcsfuse bucket "
      f"needs --mount-options={MOUNT_OPTIONS}, else no checkpoint can commit (orbax renames its "
      "directory; a hierarchical-namespace bucket renames without it); each workload checks "
      "first (python -m launch.commit_check)"
    )
    for argv in attach:
      print(f"  {shell_join(argv)}")
  if not execute:
    does = (
      f"runs them, recording them in {os.path.join(launch.root, jobs_lib.STATUS_FILE)}"
      if launch.plain
      else f"writes {os.path.join(launch.root, MANIFEST)}"
      + (" and the scripts" if launch.backend == "slurm" else "")
      + " and launches"
    )
    print(f"dry run: nothing is started or written; --execute {does}")
  for i, job in enumerate(launch.jobs):
    m, st = job.member, states[job.member.name]
    tag = f"[{i + 1}/{n}] {m.name}"
    if st.state == "done":
      print(
        f"{tag}: done, skipped (checkpoint of the final step {st.step}"
        + (" and its probe results" if m.probes else "")
        + ")"
      )
      continue
    if st.state == "running" and not include_running:
      print(
        f"{tag}: running (metrics.jsonl written in the last "
        f"{status_lib.RUNNING_WINDOW_S / 60:.0f} min), skipped; --include_running launches it"
      )
      continue
    print(f"{tag} ({st.state}; {m.summary()}{describe(job)})")
    if job.script:
      print(f"# {job.script_path}\n{job.script}", end="")
    if "create" in job.info and job.steps[0][0] != "create":  # tpu-vm: shown, not run
      print(f"  {job.info['create']}")
    for _, argv in job.steps:
      print(f"  {shell_join(argv)}")
  sys.stdout.flush()


def chip_hours_line(members: list) -> str:
  """The sweep's chip-hours at the stated MFU (compiled.ASSUMED_MFU) and from the TPU compiler's
  estimate (`optimal_seconds` x steps x chips) of the members with a current compile; "" when no
  member is planned for a TPU."""
  planned = [  # members planned for a TPU, with a token budget (plan.derive's record)
    m
    for m in members
    if m.config is not None and m.compiled is not None and m.config.sweep.get("compute")
  ]
  if not planned:
    return ""
  total, with_est, est_sum = 0.0, 0.0, 0.0
  n = 0
  for m in planned:
    c = m.config
    analytic, est = compiled_lib.chip_hours(
      c.sweep.compute,
      c.total_steps,
      m.target_devices,
      c.sweep.chip,
      compiled_lib.ASSUMED_MFU,
      m.compiled,
    )
    total += analytic
    if est is not None:
      n, with_est, est_sum = n + 1, with_est + analytic, est_sum + est
  line = (
    f"chip-hours: {total:.3g} for {len(planned)} members at a stated MFU of "
    f"{compiled_lib.ASSUMED_MFU:.0%} (an assumption)"
  )
  if n:
    line += (
      f"; the TPU compiler's estimate for the {n} with a current compile: {est_sum:.3g} "
      f"(vs {with_est:.3g} at {compiled_lib.ASSUMED_MFU:.0%} MFU; optimal_seconds x steps x "
      "chips, an estimate, not a measurement)"
    )
  else:
    line += "; no member has a current TPU compile (python -m launch.compile_check --tpu --archive)"
  return line


def env_line(launch: Launch) -> str:
  """The dry run's line on what every member exports for its chip."""
  if not launch.env:
    return f"environment: none of {launch.chip}'s XLA flags or variables (--xla_flags=)"
  where = (
    "XLA flags from --xla_flags, the other variables"
    if launch.xla_flags_given
    else "the chip's XLA flags and variables"
  )
  return (
    f"environment ({launch.chip}; {where} from cbert_jax/scaling/chips.py, sources in "
    f"docs/launch.md; --xla_flags replaces the flags): {env_text(launch.env)}"
  )


def execute(launch: Launch, ns: argparse.Namespace, states: dict) -> int:
  """Writes the files, then runs (local, tpu-vm) or submits (slurm, xpk) the members not done."""
  if not launch.plain:  # --args members: the status file records them
    write_files(launch)
  todo = [
    j for j in launch.jobs if not jobs_lib.skipped(states[j.member.name].state, ns.include_running)
  ]
  if launch.backend in ("slurm", "xpk"):
    failed = jobs_lib.submit(todo)
    if failed:
      print(f"{failed} of {len(todo)} submissions failed", file=sys.stderr)
    return 1 if failed else 0
  parallel = ns.parallel or (1 if launch.backend == "local" else max(1, len(todo)))
  retries = ns.retries if ns.retries is not None else (1 if launch.plain else 0)
  options = jobs_lib.RunOptions(
    retries=retries,
    attempt_logs=launch.plain,
    echo=launch.plain and parallel == 1,
    records=launch.plain,
  )
  runner = jobs_lib.JobRunner(launch.root, REPO, launch.jobs, states, options)
  try:
    results = runner.run_all(todo, parallel)
  except KeyboardInterrupt:
    return 130  # the members stopped; they resume when launched

  final = [
    status_lib.member_state(j.member.name, j.member.workdir, probe=j.member.probes)
    for j in launch.jobs
  ]
  record = f" ({os.path.join(launch.root, jobs_lib.STATUS_FILE)})" if launch.plain else ""
  print(f"\nsweep {launch.root}{record}:\n{jobs_lib.summary(final, runner.attempts())}", flush=True)
  failed = [name for name, result in results.items() if result != "done"]
  if failed:
    print(
      f"{len(failed)} of {len(todo)} members failed: {', '.join(sorted(failed))}; logs in "
      f"{os.path.join(launch.root, LOG_DIR)}/",
      file=sys.stderr,
    )
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
  resolved = [j.member for j in launch.jobs if j.member.config is not None]
  no_corpus = [
    m.name for m in resolved if m.config.data.corpus == "sources" and not m.config.data.sources
  ]
  if no_corpus:  # the paper scale trains on a corpus only the user has
    message = (
      f"data.sources is empty for {len(no_corpus)} member(s) ({no_corpus[0]}, ...): pass "
      "--override=--config.data.sources=PATTERN (your preprocessed pod corpus)"
    )
    if ns.execute:
      print(f"error: {message}", file=sys.stderr)
      return 2
    print(f"warning: {message}; --execute refuses until then", file=sys.stderr)
  too_big = [m.name for m in resolved if m.config.sweep.get("memory_verdict") == "needs more chips"]
  if too_big:  # no remat / ce_chunk / micro-batch setting fits the member's chips
    message = (
      f"{len(too_big)} member(s) do not fit their chips at any memory setting "
      f"({', '.join(too_big)}): give them more chips (sweep.target_devices) or a chip "
      "with more memory; `python -m launch.compile_check` shows the figures"
    )
    if ns.execute:
      print(f"error: {message}", file=sys.stderr)
      return 2
    print(f"warning: {message}; --execute refuses until then", file=sys.stderr)
  refused = [r for m in resolved if (r := compiled_lib.refusal(m.name, m.compiled))]
  if refused:  # the TPU compiler says it does not fit, whatever the analytic plan says
    message = (
      f"{len(refused)} member(s) do not fit their chips by their latest TPU compile: "
      f"{'; '.join(refused)}; re-plan them (python -m launch.compile_check --tpu) or pass "
      "--ignore_tpu_compile"
    )
    if ns.execute and not ns.ignore_tpu_compile:
      print(f"error: {message}", file=sys.stderr)
      return 2
    print(
      f"warning: {message}" + ("" if ns.execute else "; --execute refuses until then"),
      file=sys.stderr,
    )
  if launch.backend == "xpk" and launch.shared_root and not ns.xpk_storage:
    print(
      f"warning: --shared_root={launch.shared_root} without --xpk_storage: the pods see it "
      "only if a storage is attached there with --auto-mount=true (else the workdirs are "
      "lost with each pod); `xpk storage attach NAME --mount-point=... --auto-mount=false` "
      "and --xpk_storage NAME mount it for these workloads",
      file=sys.stderr,
    )
  states = jobs_lib.member_states(launch)
  attach = xpk_storage_attach(ns, launch.shared_root) if launch.backend == "xpk" else []
  show(launch, states, ns.execute, ns.include_running, attach)
  return execute(launch, ns, states) if ns.execute else 0


def status_main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(
    prog="python -m launch.sweep status", description="State of every member of a launched sweep."
  )
  p.add_argument("--workdir_root", required=True)
  p.add_argument(
    "--probe",
    action=argparse.BooleanOptionalAction,
    default=None,
    help="done needs the probe results too (--no-probe: the final checkpoint only); default: "
    "as the launch manifest records each member (grid members have no probe step), else yes",
  )
  ns = p.parse_args(argv)
  root = os.path.abspath(ns.workdir_root)
  if not os.path.isdir(root):
    print(f"error: --workdir_root={ns.workdir_root}: no such directory", file=sys.stderr)
    return 2
  source, members = jobs_lib.find_members(root)
  recorded = jobs_lib.recorded_probes(root)
  states = [
    status_lib.member_state(n, w, probe=ns.probe if ns.probe is not None else recorded.get(n, True))
    for n, w in members
  ]
  counts = {k: sum(s.state == k for s in states) for k in ("done", "running", "pending", "failed")}
  print(
    f"{root} ({source}): {len(states)} members, " + ", ".join(f"{v} {k}" for k, v in counts.items())
  )
  if states:
    print(status_lib.table(states))
  progress = read_json(os.path.join(root, status_lib.STATUS_FILE)) or {}
  if progress.get("progress"):  # the in-process runner's last line: FLOPs done, rate, ETA
    print(f"runner ({progress.get('updated', '?')}): {progress['progress']}")
  live = jobs_lib.live_eta(root, states, progress.get("flops_per_sec") or 0.0)
  if live:
    print(live)
  return 0


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["status"]:
    return status_main(argv[1:])
  return launch_main(argv)


if __name__ == "__main__":
  sys.exit(main())
