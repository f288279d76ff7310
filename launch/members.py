r"""A launch's members: which runs, under which names and workdirs, with which trainer commands.

Two kinds of member list (`python -m launch.sweep --config FILE ...`):
  a sweep   the experiment's `get_sweep(scale)` (the scale is the `--config` arg:
            `experiments/sweep.py:cpu`, `:quick`; default `paper`). Each member's config is
            resolved (`config_lib.resolve`) with the `--override=--config.X=V` overrides applied,
            which checks the overrides and gives `sweep.target_devices` (the chips a member is
            planned for; 0 = this machine), `total_steps` and the sizes shown. The member's name
            is the experiment's `workdir_name(arg)`, else `<model>[-nocms]_<size>`. `--members
            a,b` picks a subset (names as in `status`).
  --args    any experiment file, one member per config arg (`--args model=bert model=crossbert`;
            `--args` alone: one member without an arg); the name is the arg made filesystem-safe
            (`model=bert,size=d64L2` -> `model-bert_size-d64L2`). These configs are not loaded
            here: the trainer checks each one when it runs (a bad arg fails that member only).

A member's job is ordinary trainer commands, run from the repository root (or a snapshot of it):
  train  python -m cbert_jax.main --config=<experiment>:<member arg> --workdir=<root>/<member>
  probe  the same + --config.mode=eval (the offline probe suite on the final checkpoint; sweep
         members only: not grid members, whose config sets sweep.probe=False, nor --args ones)
followed by every `--override`. Multi-host backends add `--multiprocess` (jax.distributed finds
the SLURM / TPU environment). An interrupted member resumes from its workdir's checkpoint when
launched again. The trainer refuses (exit 2, `config error: ...planned for N devices...`) to train
a member on another device count than its target_devices, so a launch that gets fewer devices
fails at once.

Nothing here imports JAX: the sweep's configs are resolved with `config_lib` (light), and a launcher
host needs neither JAX nor an accelerator.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SCALE = "paper"
LOG_DIR = "logs"  # <root>/logs/: every member's output
# Flags the launcher sets itself (config, workdir, train/eval mode, multi-process): no overrides.
RESERVED_FLAGS = ("--config", "--workdir", "--config.mode", "--multiprocess", "--nomultiprocess")


class LaunchError(ValueError):
  """Bad launcher input; the message names the flag (printed as one `error:` line)."""


@dataclasses.dataclass
class Member:
  """One member of the launch: resolved (a sweep) or just named (`--args`: config is None)."""

  name: str  # its workdir's name, e.g. bert_d384L6
  arg: str  # the experiment's config arg, e.g. scale=paper,model=bert,size=d384L6
  workdir: str  # <root>/<name>, absolute
  config: Any  # the resolved ml_collections.ConfigDict (overrides applied), or None
  # its latest TPU compile (scaling/compiled.py Lookup; None: not planned for a TPU), set by
  # launch.sweep
  compiled: Any = None

  @property
  def target_devices(self) -> int:
    return int(self.config.sweep.target_devices) if self.config is not None else 0

  @property
  def total_steps(self) -> int:
    return int(self.config.total_steps)

  @property
  def probes(self) -> bool:
    """Whether the member gets the probe step: sweep members do; grid members (sweep.probe
    False: only the final validation loss counts) and `--args` members do not. A member without
    a probe step is done at its final checkpoint."""
    return self.config is not None and bool(self.config.sweep.get("probe", True))

  def summary(self) -> str:
    """'10.6M params, 3458 steps x 120 rows, 1.97e+16 FLOPs, 8 devices' (an `--args` member: its
    arg, as its config is read by the trainer only)."""
    c = self.config
    if c is None:
      return f"config arg {self.arg!r}" if self.arg else "no config arg"
    devices = f"{self.target_devices} devices" if self.target_devices else "this machine"
    memory = (
      f"; memory on {c.sweep.chip}: {c.sweep.memory_setting}, "
      f"{c.sweep.memory_bytes / 2**30:.1f} of {c.sweep.memory_budget / 2**30:.1f} GiB "
      f"({c.sweep.memory_verdict})"
      if c.sweep.get("memory_verdict")  # a member planned for sweep.chip (plan.derive)
      else ""
    )
    if self.compiled is not None:
      memory += f"; {self.compiled.describe()}"
    if "n_params" not in c.sweep:  # not a sweep member: no token budget, no derived record
      return f"{c.total_steps} steps x {c.batch_size} rows, {devices}{memory}"
    return (
      f"{c.sweep.n_params / 1e6:.1f}M params, {c.total_steps} steps x {c.batch_size} rows, "
      f"{c.sweep.compute:.3g} FLOPs, {devices}{memory}"
    )


@dataclasses.dataclass
class Job:
  """What a backend does for one member: shell steps here, or a submission."""

  member: Member
  train: list[str]  # the member's train command
  probe: list[str]  # ... and its probe command
  steps: list[tuple[str, list[str]]]  # (kind, argv) run here, in order
  script: str = ""  # slurm: the sbatch script's text
  script_path: str = ""  # slurm: where it goes
  info: dict = dataclasses.field(default_factory=dict)  # backend names for the manifest


@dataclasses.dataclass
class Launch:
  """A rendered launch: everything the dry run prints and --execute does."""

  backend: str
  scale: str  # the sweep's scale ("" for --args members)
  experiment: str  # the experiment file as the commands name it
  root: str  # the workdir root, absolute
  overrides: list[str]
  jobs: list[Job]
  code_dir: str  # where remote commands run ("" = the repository root, local)
  snapshot: bool  # --execute copies the code to code_dir first
  shared_root: str = ""  # --shared_root (workdirs, snapshot and data cache), absolute
  snapshot_extra: tuple = ()  # the experiment file, when outside SNAPSHOT_PATHS (repo-relative)
  plain: bool = False  # members from --args (configs not loaded), not a get_sweep sweep
  # The variables every member exports (launch.backends.launch_env: the chip's XLA flags and
  # variables, or --xla_flags), and the chip they are for ("" for local).
  env: list = dataclasses.field(default_factory=list)
  chip: str = ""
  xla_flags_given: bool = False  # --xla_flags replaced the chip's flags


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


def check_override(override: str) -> None:
  """An override is a trainer flag, and not one the launcher sets itself."""
  if not override.startswith("--"):
    raise LaunchError(
      f"--override={override}: expected a trainer flag, e.g. "
      "--override=--config.data.sources=/data/*.jsonl.zst"
    )
  if override.split("=", 1)[0] in RESERVED_FLAGS:
    raise LaunchError(
      f"--override={override}: the launcher sets --config, --workdir, "
      "--multiprocess and the mode (train, then eval) itself"
    )


def apply_override(config, override: str) -> None:
  """Sets one `--config.X=V` override on `config` as the trainer's command line reads it
  (config_lib.override); other flags are passed through unchecked."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel (loads the models' sizes)
  from cbert_jax.errors import ConfigError  # pylint: disable=import-outside-toplevel

  check_override(override)
  if not override.startswith("--config."):
    return
  path, eq, text = override[len("--config.") :].partition("=")
  if not eq:
    raise LaunchError(f"--override={override}: expected --config.{path}=VALUE")
  try:
    config_lib.override(config, path, text, where=f"--override={override}")
  except ConfigError as e:
    raise LaunchError(str(e)) from None


def select(members: list[Member], only: list[str], what: str) -> list[Member]:
  """The members named in `only` (all when empty); an unknown name is a LaunchError."""
  known = [m.name for m in members]
  unknown = [n for n in only if n not in known]
  if unknown:
    raise LaunchError(
      f"--members: {', '.join(unknown)} not in {what}; its members: {', '.join(known)}"
    )
  return [m for m in members if m.name in only] if only else members


def load_members(
  spec: str, root: str, overrides: list[str], only: list[str]
) -> tuple[str, str, list[Member]]:
  """(scale, experiment path for the commands, members) of `--config spec`, each resolved with
  the overrides applied; `only` selects members by name."""
  from cbert_jax import config_lib  # pylint: disable=import-outside-toplevel
  from cbert_jax.sweep import experiment as experiment_lib  # pylint: disable=import-outside-toplevel

  path, arg = split_config_spec(spec)
  if not os.path.exists(path):
    raise LaunchError(f"--config={spec}: no such experiment file {path!r}")
  experiment = experiment_lib.load_experiment(path)
  whole = experiment.get_config(arg)
  scale = whole.get("sweep", {}).get("scale", "") or arg
  if whole.get("mode", "sweep") != "sweep":
    raise LaunchError(
      f"--config={spec}: {arg!r} is one member; name a scale (e.g. :paper, :cpu, "
      ":quick) and pick members with --members"
    )
  if scale == "auto":
    raise LaunchError(
      f"--config={spec}: the launcher needs a scale (paper, cpu, quick); auto is "
      "resolved by the in-process runner"
    )
  members = []
  for member_arg in experiment.get_sweep(arg):
    cfg = experiment.get_config(member_arg)
    for override in overrides:
      apply_override(cfg, override)
    cfg = config_lib.resolve(cfg)
    name = (
      experiment.workdir_name(member_arg)
      if hasattr(experiment, "workdir_name")
      else experiment_lib.config_member_name(cfg)
    )
    members.append(Member(name, member_arg, os.path.join(root, name) if root else "", cfg))
  return scale, command_path(path), select(members, only, f"the {scale} sweep")


def arg_name(arg: str) -> str:
  """A filesystem-safe workdir name for a config arg: 'model=bert,size=d64L2' -> 'model-bert_size-d64L2'."""
  return re.sub(r"[^A-Za-z0-9.-]+", "_", arg.replace("=", "-")).strip("_") or "default"


def arg_members(
  path: str, args: list[str], root: str, overrides: list[str], only: list[str]
) -> tuple[str, list[Member]]:
  """(experiment path for the commands, members) for `--args`: one member per arg (no arg: one
  member, `default`), named by `arg_name`. The configs are not loaded: the trainer checks them."""
  if ":" in path:
    raise LaunchError(
      f"--config={path}: with --args, name the experiment file only; each arg "
      "is one member's config arg"
    )
  if not os.path.exists(path):
    raise LaunchError(f"--config={path}: no such experiment file {path!r}")
  for override in overrides:
    check_override(override)
  args = args or [""]
  names = [arg_name(a) for a in args]
  if len(set(names)) != len(names):
    raise LaunchError(f"--args: two members would share a workdir: {names}")
  members = [Member(n, a, os.path.join(root, n), None) for n, a in zip(names, args)]
  return command_path(path), select(members, only, f"--args of {path}")


def member_commands(
  python: list[str], experiment: str, member: Member, overrides: list[str], multiprocess: bool
) -> tuple[list[str], list[str]]:
  """(train, probe) argv of a member (probe [] when it has no probe step: `Member.probes`). The
  mode flag goes last so that no override can undo it."""
  spec = f"{experiment}:{member.arg}" if member.arg else experiment
  base = [
    *python,
    "-m",
    "cbert_jax.main",
    f"--config={spec}",
    f"--workdir={member.workdir}",
    *(["--multiprocess"] if multiprocess else []),
    *overrides,
  ]
  return base, ([*base, "--config.mode=eval"] if member.probes else [])
