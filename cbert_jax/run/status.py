"""A sweep's state, read from its members' workdirs (the in-process runner and `launch.sweep status`).

A member is
  done     its workdir holds the checkpoint of its final step (config.json's total_steps), or is
           an archived copy whose ARCHIVE.json records that step (`report.archive`: results
           kept, checkpoints left out), and, when the sweep probes, the offline probe results of
           that step (eval/step_<N>*.json);
  failed   the runner (or a launcher) recorded a failure in `<member>/FAILED` and nothing was
           logged since;
  running  not done, and metrics.jsonl changed in the last `RUNNING_WINDOW_S` seconds;
  pending  anything else (with `step` > 0 when it has checkpoints to resume from).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tempfile
import time

RUNNING_WINDOW_S = 600.0
FAILED_FILE = "FAILED"
ARCHIVE_FILE = "ARCHIVE.json"  # in an archived member: `report.archive`
STATUS_FILE = "sweep_status.json"


@dataclasses.dataclass
class MemberState:
  name: str
  state: str  # pending | running | done | failed
  step: int = 0  # latest checkpoint step (running: the latest logged step)
  total_steps: int = 0
  error: str = ""

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def total_steps(workdir: str) -> int:
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      return int(json.load(f)["config"]["total_steps"])
  except (OSError, ValueError, KeyError, TypeError):
    return 0


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the complete checkpoints in workdir/checkpoints (orbax's tmp dirs are skipped)."""
  root = os.path.join(workdir, "checkpoints")
  try:
    names = os.listdir(root)
  except OSError:
    return []
  return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(root, n)))


def probe_results(workdir: str, step: int) -> str | None:
  """The offline-suite results file of `step` (any evals settings), or None."""
  for path in sorted(glob.glob(os.path.join(workdir, "eval", f"step_{step}*.json"))):
    try:
      with open(path) as f:
        if json.load(f).get("suite", "offline") == "offline":
          return path
    except (OSError, ValueError):
      continue
  return None


def last_logged_step(workdir: str) -> int:
  """The step of metrics.jsonl's last complete line (0 if none): where a running member is."""
  path = os.path.join(workdir, "metrics.jsonl")
  try:
    with open(path, "rb") as f:
      f.seek(max(0, os.path.getsize(path) - 65536))
      lines = f.read().decode("utf-8", "replace").splitlines()
  except OSError:
    return 0
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue
  return 0


def archived_step(workdir: str) -> int:
  """The final step recorded by `ARCHIVE_FILE` in an archived member (0 if not archived)."""
  try:
    with open(os.path.join(workdir, ARCHIVE_FILE)) as f:
      return int(json.load(f)["final_step"])
  except (OSError, ValueError, KeyError, TypeError):
    return 0


def is_done(workdir: str, probe: bool) -> bool:
  total = total_steps(workdir)
  return (
    bool(total)
    and (total in checkpoint_steps(workdir) or archived_step(workdir) == total)
    and (not probe or probe_results(workdir, total) is not None)
  )


def mark_failed(workdir: str, error: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, FAILED_FILE), "w") as f:
    f.write(error.strip() + "\n")


def clear_failed(workdir: str) -> None:
  try:
    os.unlink(os.path.join(workdir, FAILED_FILE))
  except FileNotFoundError:
    pass


def member_state(
  name: str, workdir: str, probe: bool = True, now: float | None = None
) -> MemberState:
  now = time.time() if now is None else now
  steps = checkpoint_steps(workdir)
  st = MemberState(
    name=name, state="pending", step=steps[-1] if steps else 0, total_steps=total_steps(workdir)
  )
  if is_done(workdir, probe):
    st.state, st.step = "done", st.total_steps  # an archived member has no checkpoints
    return st
  failed, log = os.path.join(workdir, FAILED_FILE), os.path.join(workdir, "metrics.jsonl")
  log_time = os.path.getmtime(log) if os.path.exists(log) else None
  if os.path.exists(failed) and (log_time is None or os.path.getmtime(failed) >= log_time):
    with open(failed) as f:
      st.error = f.read().strip()
    st.state = "failed"
  elif log_time is not None and now - log_time < RUNNING_WINDOW_S:
    st.state = "running"
    st.step = max(st.step, last_logged_step(workdir))
  return st


def write_json_atomic(path: str, body: dict) -> None:
  """Writes `body` to `path` through a temp file in the same directory and os.replace."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(
    dir=os.path.dirname(os.path.abspath(path)), prefix=f".{os.path.basename(path)}.", suffix=".tmp"
  )
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(body, f, indent=2)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def table(states: list[MemberState]) -> str:
  """member, state, step/total, error: a plain-text table."""
  rows = [("member", "state", "step", "error")]
  rows += [(s.name, s.state, f"{s.step}/{s.total_steps or '?'}", s.error) for s in states]
  w = [max(len(r[i]) for r in rows) for i in range(3)]
  return "\n".join(
    ("  ".join(r[i].ljust(w[i]) for i in range(3)) + "  " + r[3]).rstrip() for r in rows
  )
