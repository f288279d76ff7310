"""A sweep's state, read from its members' workdirs through `record` (the in-process runner and
`launch.sweep status`).

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
import json
import os
import tempfile
import time

from cbert_jax.run import record as record_lib

RUNNING_WINDOW_S = 600.0
FAILED_FILE = record_lib.FAILED_FILE  # written by `mark_failed`, read by `record.failed`
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


def is_done(workdir: str, probe: bool) -> bool:
  total = record_lib.total_steps(workdir)
  return (
    bool(total)
    and (
      total in record_lib.checkpoint_steps(workdir) or record_lib.archived_step(workdir) == total
    )
    and (not probe or record_lib.probe_results(workdir, total) is not None)
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
  steps = record_lib.checkpoint_steps(workdir)
  st = MemberState(
    name=name,
    state="pending",
    step=steps[-1] if steps else 0,
    total_steps=record_lib.total_steps(workdir),
  )
  if is_done(workdir, probe):
    st.state, st.step = "done", st.total_steps  # an archived member has no checkpoints
    return st
  log_time = record_lib.modified(workdir, record_lib.METRICS_FILE)
  failed_time = record_lib.modified(workdir, FAILED_FILE)
  if failed_time is not None and (log_time is None or failed_time >= log_time):
    st.error = record_lib.failed(workdir) or ""
    st.state = "failed"
  elif log_time is not None and now - log_time < RUNNING_WINDOW_S:
    st.state = "running"
    st.step = max(st.step, record_lib.last_logged_step(workdir))
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
