r"""Running a launch's members and reading their state back.

Members run here (local, and tpu-vm's ssh commands) through one `JobRunner`: each member's steps
(train then probe; an `--args` member trains only) run as subprocesses in order, `--parallel N`
members at a time (default 1 for local, all for tpu-vm). Every step's stdout and stderr go to
the member's log under <root>/logs/. A step that exits non-zero makes the attempt fail; the
member then runs again from that step up to `--retries` more times (default 0 for a sweep's
members, 1 for `--args` members; each retry resumes from the workdir's checkpoint). A member that
still fails gets a FAILED marker in its workdir holding its error (prefixed by the step when a job
has several), which `status` shows, and the others go on; the exit status is 1 if any member
failed. A member's error is the step's last output line starting with "config error:",
"training stopped:", "checkpoint error:" or "distributed error:" (the trainer's one-line errors,
cbert_jax/main.py), else its last output line. Ctrl-C stops the running steps with SIGTERM (the
trainer checkpoints and exits) and waits for them; launching again resumes them.

The members of an experiment's sweep (`get_sweep`) append to <root>/logs/<member>.log, each step
headed by a `====` line; a member is done when its workdir holds the checkpoint of its final step
and the probe results of that step (`cbert_jax.run.status.member_state`).

`--args` members (one experiment file, one member per config arg) keep the log of every attempt,
<root>/logs/<member>.attempt<k>.log (k counts across reruns, so no log is overwritten), show their
output here (on stderr) as it comes when one runs at a time, and are recorded in
<root>/sweep_status.json (name, command, workdir, state pending | running | done | failed,
attempts, return code, error, logs), rewritten atomically after every change of state. Such a
member is done when the status file says so for the same command (the Python interpreter aside)
and its workdir holds the checkpoint of its final step; failed (or interrupted) members run again.

Members that look running (metrics.jsonl written in the last 10 minutes) are skipped unless
--include_running. A member still queued in SLURM or xpk looks pending: do not launch it again.
slurm and xpk members are submitted (`submit`), one command each.

`status` lists the members of <root>/launch_manifest.json (else the in-process runner's
<root>/sweep.json, else the subdirectories holding a config.json) with their state, and the share
of the sweep's training FLOPs done with an ETA at the runner's measured FLOP/s (`live_eta`).
"""

from __future__ import annotations

import codecs
import concurrent.futures
import dataclasses
import os
import shlex
import subprocess
import sys
import threading
import time

from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib
from cbert_jax.run.progress import format_duration
from launch.backends import shell_join
from launch.members import LOG_DIR, Job, Launch
from launch.snapshot import MANIFEST, RUNNER_MANIFEST, read_json

STATUS_FILE = status_lib.STATUS_FILE  # <root>/sweep_status.json: the --args members' records
# One-line errors the trainer prints (cbert_jax/main.py), preferred over the last output line.
ERROR_PREFIXES = ("config error:", "training stopped:", "checkpoint error:", "distributed error:")
INTERRUPTED = "interrupted (the launcher stopped)"


class ErrorLine:
  """Follows a step's output line by line and keeps the line that says why it failed."""

  def __init__(self):
    self.known = self.last = None

  def add(self, line: str) -> None:
    line = line.strip()
    if line:
      self.last = line
      if line.startswith(ERROR_PREFIXES):
        self.known = line

  def get(self, returncode: int) -> str:
    """The last line with a known prefix, else the last non-empty line, else the exit status."""
    if self.known or self.last:
      return self.known or self.last
    return (
      f"killed by signal {-returncode}"
      if returncode < 0
      else f"exit status {returncode}, no output"
    )


# ----------------------------------------------------------- member states ---


def read_records(root: str) -> dict:
  """The member records of an earlier run's status file by name ({} if none or unreadable)."""
  try:
    return {m["name"]: m for m in read_json(os.path.join(root, STATUS_FILE))["members"]}
  except (KeyError, TypeError):
    return {}


def same_command(recorded: str | None, argv: list[str]) -> bool:
  """Whether a recorded command line is `argv`, the Python interpreter aside (from `-m` on)."""
  old = shlex.split(recorded or "")
  return "-m" in old and "-m" in argv and old[old.index("-m") :] == argv[argv.index("-m") :]


def member_states(launch: Launch) -> dict:
  """{name: MemberState} of the launch's members. An `--args` member (no probe) is done only when
  the status file records it done with the same command."""
  if not launch.plain:
    return {
      j.member.name: status_lib.member_state(j.member.name, j.member.workdir, probe=j.member.probes)
      for j in launch.jobs
    }
  records, out = read_records(launch.root), {}
  for j in launch.jobs:
    st = status_lib.member_state(j.member.name, j.member.workdir, probe=False)
    rec = records.get(j.member.name, {})
    if st.state == "done" and not (
      rec.get("state") == "done" and same_command(rec.get("command"), j.train)
    ):
      st.state = "pending"  # finished, but not by this command: run it
    out[j.member.name] = st
  return out


def skipped(state: str, include_running: bool) -> bool:
  """Done members are never launched again; running ones only with --include_running."""
  return state == "done" or (state == "running" and not include_running)


def summary(states: list, attempts: dict[str, int]) -> str:
  """member, state, attempts (this launcher's), step/total, error: a plain-text table."""
  rows = [("member", "state", "attempts", "step", "error")]
  rows += [
    (s.name, s.state, str(attempts.get(s.name, 0)), f"{s.step}/{s.total_steps or '?'}", s.error)
    for s in states
  ]
  w = [max(len(r[i]) for r in rows) for i in range(4)]
  return "\n".join(
    ("  ".join(r[i].ljust(w[i]) for i in range(4)) + "  " + r[4]).rstrip() for r in rows
  )


# ----------------------------------------------------------------- running ---


@dataclasses.dataclass
class RunOptions:
  """How a JobRunner runs the members of one launch."""

  retries: int = 0  # a failing member runs again up to this many times, from its failed step
  attempt_logs: bool = (
    False  # logs/<member>.attempt<k>.log per attempt (else one logs/<member>.log)
  )
  echo: bool = False  # show the steps' output here too, as it comes
  records: bool = False  # keep every member's record in <root>/sweep_status.json


def say(line: str) -> None:
  """One line on stdout in one write (members running at once do not split each other's lines)."""
  sys.stdout.write(line + "\n")
  sys.stdout.flush()


def follow(path: str, start: int, done: threading.Event) -> None:
  """Copies what is written to `path` after offset `start` to stderr until `done` is set."""
  decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  with open(path, "rb") as f:
    f.seek(start)
    while True:
      last = done.wait(0.2)
      chunk = f.read()
      if chunk:
        sys.stderr.write(decoder.decode(chunk))
        sys.stderr.flush()
      if last:
        return


class JobRunner:
  """Runs jobs' steps as subprocesses here (local, tpu-vm), `parallel` members at a time, each
  member's steps in order, with retries, logs, records and FAILED markers (module docstring)."""

  def __init__(
    self, root: str, cwd: str, jobs: list[Job], states: dict, options: RunOptions | None = None
  ):
    self.root, self.cwd = root, cwd
    self.options = options or RunOptions()
    self.lock = threading.Lock()
    self.procs: set = set()  # live subprocesses, stopped on Ctrl-C
    self.stopping = False
    previous = read_records(root) if self.options.records else {}
    n = len(jobs)
    self.tags = {j.member.name: f"[{i + 1}/{n}] {j.member.name}" for i, j in enumerate(jobs)}
    self.records = {}  # name -> record (as in the status file)
    for j in jobs:
      old, state = previous.get(j.member.name, {}), states[j.member.name].state
      done = state == "done"
      self.records[j.member.name] = {
        "name": j.member.name,
        "command": shell_join(j.train),
        "workdir": j.member.workdir,
        "state": state if state in ("done", "running") else "pending",
        "attempts": old.get("attempts", 0),
        "returncode": old.get("returncode") if done else None,
        "error": None,
        "logs": list(old.get("logs", [])),
      }
    self.others = [r for name, r in previous.items() if name not in self.records]

  def save(self) -> None:
    """Rewrites the status file (with the records of other runs' members), atomically."""
    if self.options.records:
      with self.lock:
        body = {
          "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          "members": [dict(r) for r in self.records.values()] + self.others,
        }
      status_lib.write_json_atomic(os.path.join(self.root, STATUS_FILE), body)

  def update(self, record: dict, **changes) -> None:
    with self.lock:
      record.update(changes)
    self.save()

  def attempts(self) -> dict[str, int]:
    return {name: r["attempts"] for name, r in self.records.items()}

  def next_log(self, record: dict) -> str:
    """Counts an attempt; its log (a log of an earlier run whose status file is gone is kept)."""
    record["attempts"] += 1
    if not self.options.attempt_logs:
      return os.path.join(self.root, LOG_DIR, f"{record['name']}.log")
    while True:
      path = os.path.join(self.root, LOG_DIR, f"{record['name']}.attempt{record['attempts']}.log")
      if not os.path.exists(path):
        return path
      record["attempts"] += 1

  def run(self, job: Job) -> str:
    """done | failed | pending (stopped by us) for one member."""
    name, workdir = job.member.name, job.member.workdir
    record, tag = self.records[name], self.tags[name]
    status_lib.clear_failed(workdir)
    steps, left = list(job.steps), self.options.retries
    while not self.stopping:
      with self.lock:
        path = self.next_log(record)
        record.update(state="running", returncode=None, error=None)
        if path not in record["logs"]:
          record["logs"].append(path)
      self.save()
      failed, returncode, error = self.attempt(steps, path, tag, record["attempts"])
      if failed is None:
        self.update(record, state="done", returncode=0)
        say(f"{tag}: done")
        return "done"
      if self.stopping:  # stopped by us: resumable
        self.update(record, state="failed", error=INTERRUPTED)
        return "pending"
      reason = error if len(job.steps) == 1 else f"{steps[failed][0]}: {error}"
      self.update(record, state="failed", returncode=returncode, error=reason)
      say(
        f"{tag}: attempt {record['attempts']} failed (exit {returncode}): {reason}; "
        + (f"retrying ({left} left)" if left else "FAILED; continuing with the others")
      )
      if not left:
        status_lib.mark_failed(workdir, reason)
        return "failed"
      left -= 1
      steps = steps[failed:]  # the steps before it are done
    return "pending"

  def attempt(
    self, steps: list[tuple[str, list[str]]], path: str, tag: str, k: int
  ) -> tuple[int | None, int, str]:
    """Runs `steps` in order, their output into the log at `path` -> (the index of the step that
    failed or was not started, None if all succeeded; its exit status; its error line)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as log:
      for i, (kind, argv) in enumerate(steps):
        if self.stopping:
          return i, 1, INTERRUPTED
        say(f"{tag}: {kind} started (attempt {k}; log: {path})")
        log.write(f"==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {kind}: {shell_join(argv)}\n")
        log.flush()  # the header before the step's own output
        start = os.path.getsize(path)
        returncode = self.call(argv, log, start if self.options.echo else None)
        if returncode == 0:
          continue
        error = ErrorLine()
        with open(path, "rb") as f:
          f.seek(start)
          for line in f:  # this step's output only
            error.add(line.decode(errors="replace"))
        return i, returncode, error.get(returncode)
    return None, 0, ""

  def call(self, argv: list[str], log, echo_from: int | None = None) -> int:
    """Runs argv with stdout+stderr into `log` (shown here from offset `echo_from` when given);
    its exit status (127 if it cannot start)."""
    try:
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd)
    except OSError as e:
      log.write(f"cannot start {argv[0]}: {e}\n")
      log.flush()
      return 127
    with self.lock:
      self.procs.add(proc)
      if self.stopping:  # stop() ran while this one was starting
        proc.terminate()
    done = threading.Event()
    echo = (
      threading.Thread(target=follow, args=(log.name, echo_from, done), daemon=True)
      if echo_from is not None
      else None
    )
    if echo:
      echo.start()
    try:
      return proc.wait()
    finally:
      with self.lock:
        self.procs.discard(proc)
      if echo:
        done.set()
        echo.join()

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
    self.save()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel)
    futures = {pool.submit(self.run, j): j.member.name for j in jobs}
    try:
      return {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
    except KeyboardInterrupt:
      print(
        "interrupted: stopping the running members (they checkpoint; launch again to resume)",
        file=sys.stderr,
        flush=True,
      )
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
    say(f"{job.member.name}: {output or f'exit status {code}'}")
    failed += code != 0
  return failed


# ------------------------------------------------------------------ status ---


def find_members(root: str) -> tuple[str, list[tuple[str, str]]]:
  """(where they came from, [(member, workdir)]) of the sweep under `root`."""
  launched = read_json(os.path.join(root, MANIFEST))
  if launched and launched.get("members"):
    return MANIFEST, [
      (m["name"], m.get("workdir") or os.path.join(root, m["name"])) for m in launched["members"]
    ]
  ran = read_json(os.path.join(root, RUNNER_MANIFEST))
  if ran and ran.get("members"):
    return RUNNER_MANIFEST, [(m["name"], os.path.join(root, m["name"])) for m in ran["members"]]
  names = record_lib.run_names(root)
  return "member directories", [(n, os.path.join(root, n)) for n in names]


def recorded_probes(root: str) -> dict[str, bool]:
  """{member: whether it has a probe step} as the launch manifest records it (members launched
  before it recorded this: absent)."""
  launched = read_json(os.path.join(root, MANIFEST)) or {}
  return {m["name"]: bool(m["probe"]) for m in launched.get("members", []) if "probe" in m}


def live_eta(root: str, states: list, rate: float) -> str:
  """Now: the FLOPs done (finished members + the running ones' logged fraction) and the time the
  rest takes at the runner's measured FLOP/s; "" without a manifest with per-member compute."""
  manifest = (
    read_json(os.path.join(root, RUNNER_MANIFEST)) or read_json(os.path.join(root, MANIFEST)) or {}
  )
  compute = {m["name"]: float(m.get("compute") or 0) for m in manifest.get("members", [])}
  total = sum(compute.values())
  if not total:
    return ""
  done = sum(
    compute.get(st.name, 0.0)
    * (1.0 if st.state == "done" else st.step / st.total_steps if st.total_steps else 0.0)
    for st in states
  )
  eta = f", ETA {format_duration((total - done) / rate)} at {rate:.3g} FLOP/s" if rate > 0 else ""
  return f"now: {100 * done / total:.1f}% of the sweep's {total:.3g} training FLOPs done{eta}"
