r"""What `launch.sweep --execute` writes before it starts anything: the code snapshot, the slurm
scripts and the launch manifest.

The code snapshot (slurm and tpu-vm, unless --code_dir names a checkout on the hosts): the script
`cd`s into <code root>/code/<hash>/, a copy of cbert_jax/, experiments/, launch/, pyproject.toml
and the experiment file, written at --execute time; the hash is of their paths and contents, so
unchanged code reuses its snapshot and queued or requeued jobs never see later edits.

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

--execute writes (in this order) the code snapshot, the scripts, <root>/launch_manifest.json
(backend, scale, experiment, creation time, git commit read from .git without running git,
overrides, and per member its name, arg, workdir, target_devices, commands and script / TPU /
workload), then starts or submits. A later launch into the same root keeps the manifest's other
members; a root holding another scale's sweep is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

from cbert_jax.run import status as status_lib
from launch.backends import shell_join
from launch.members import LOG_DIR, REPO, Job, Launch, LaunchError

MANIFEST = "launch_manifest.json"
RUNNER_MANIFEST = (
  "sweep.json"  # sweep.experiment.MANIFEST, written by the in-process sweep (cbert_jax.sweep)
)
# What a code snapshot holds (relative to the repository root): everything a member runs.
SNAPSHOT_PATHS = ("cbert_jax", "experiments", "launch", "pyproject.toml")


def snapshot_extra(experiment: str) -> tuple[str, ...]:
  """The experiment file, when the commands name it inside the repository but outside
  SNAPSHOT_PATHS (e.g. tests/fixtures/x.py): the snapshot must hold it too."""
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
      out += [
        os.path.relpath(os.path.join(dirpath, f), repo)
        for f in filenames
        if not f.startswith(".") and not f.endswith(".pyc")
      ]
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
  os.rename(tmp, dest)  # whole or absent: a job never sees half of it
  return True


def git_commit(repo: str = REPO) -> str:
  """HEAD's commit, read from .git without running git ("" if it cannot be read)."""
  try:
    git = os.path.join(repo, ".git")
    if os.path.isfile(git):  # a worktree: "gitdir: <path>"
      with open(git) as f:
        git = os.path.join(repo, f.read().split(":", 1)[1].strip())
    with open(os.path.join(git, "HEAD")) as f:
      head = f.read().strip()
    if not head.startswith("ref: "):
      return head  # detached HEAD: the commit itself
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
  return {
    "backend": launch.backend,
    "scale": launch.scale,
    "experiment": launch.experiment,
    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "git_commit": git_commit(),
    "code_dir": launch.code_dir or REPO,
    "shared_root": launch.shared_root,
    "overrides": launch.overrides,
    "chip": launch.chip,
    "environment": dict(launch.env),  # the chip's XLA flags and variables every member exports
    "members": kept + [member_record(j) for j in launch.jobs],
  }


def member_record(job: Job) -> dict:
  m = job.member
  return {
    "name": m.name,
    "arg": m.arg,
    "workdir": m.workdir,
    "target_devices": m.target_devices,
    "model": m.config.model_name,
    "size": m.config.model.size,
    "n_params": int(m.config.sweep.get("n_params", 0)),
    "compute": float(m.config.sweep.get("compute", 0.0)),
    "total_steps": m.total_steps,
    "batch_size": int(m.config.batch_size),
    "probe": m.probes,  # whether done needs the probe results (grid members: no)
    "commands": {"train": shell_join(job.train), "probe": shell_join(job.probe)},
    "launch": [shell_join(argv) for _, argv in job.steps],
    "script": job.script_path,
    **job.info,
  }


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
      raise LaunchError(
        f"--workdir_root={root} holds a {old} sweep ({name}); this is the {scale} "
        "sweep: use another --workdir_root"
      )


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
      config_path = job.script_path[: -len(".sbatch")] + ".config.json"
      status_lib.write_json_atomic(
        config_path,
        {
          "arg": job.member.arg,
          "experiment": launch.experiment,
          "overrides": launch.overrides,
          "config": json.loads(json.dumps(job.member.config.to_dict(), default=str)),
        },
      )
  status_lib.write_json_atomic(os.path.join(launch.root, MANIFEST), manifest(launch))
