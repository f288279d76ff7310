r"""Run several members of an experiment one after another on this machine.

  python -m launch.local --config experiments/smoke.py --args model=bert model=crossbert \
      --workdir_root runs/smoke_pair            # dry run: prints the commands
  python -m launch.local ... --run              # runs them, each in runs/smoke_pair/<arg>

Every member is the ordinary training command, so any one can be rerun by hand (and resumes from
its own workdir). A member that exits non-zero is retried up to `--retries` more times (default 1;
each retry resumes from its workdir); if it still fails it is marked failed and the others go on.

`<workdir_root>/sweep_status.json` records every member (name, command, workdir, state pending |
running | done | failed, attempts, return code, error) and is rewritten atomically after every
change of state. A failed member's error is its last stderr line starting with "config error:",
"training stopped:", "checkpoint error:" or "distributed error:", else its last stderr line. The
full stderr of every attempt is kept in `<workdir_root>/logs/<member>.attempt<k>.log` (k counts
across reruns, so no log is overwritten; the member's workdir may not exist after a config error).

Rerunning the same sweep skips members that are done with the same command (the Python
interpreter aside) and whose workdir holds the checkpoint of its final step; failed (or
interrupted) members run again. A summary table (member, state, attempts, error) ends the run; the
exit status is non-zero if any member failed.
Pod backends (SLURM, TPU VMs, xpk) and concurrency: `launch/sweep.py`.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

from cbert_jax.scaling import status as status_lib

STATUS_FILE = "sweep_status.json"
LOG_DIR = "logs"
# One-line errors the trainer prints (cbert_jax/main.py), preferred over the last stderr line.
ERROR_PREFIXES = ("config error:", "training stopped:", "checkpoint error:", "distributed error:")


def member_name(arg: str) -> str:
  """A filesystem-safe workdir name for a config arg: 'model=bert,size=d64L2' -> 'model-bert_size-d64L2'."""
  return re.sub(r"[^A-Za-z0-9.-]+", "_", arg.replace("=", "-")).strip("_") or "default"


def commands(config: str, args: list[str], workdir_root: str, overrides: list[str]) -> list[list[str]]:
  """The training command of every member, in order."""
  out = []
  for arg in args or [""]:
    spec = f"{config}:{arg}" if arg else config
    out.append([sys.executable, "-m", "cbert_jax.main", f"--config={spec}",
                f"--workdir={os.path.join(workdir_root, member_name(arg))}", *overrides])
  return out


class ErrorLine:
  """Follows a member's stderr line by line and keeps the line that says why it failed."""

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
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}, no stderr"


def final_checkpoint(workdir: str) -> int | None:
  """The final step if `workdir` holds its checkpoint (step = config.json's total_steps), else None."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      total = int(json.load(f)["config"]["total_steps"])
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return total if os.path.isdir(os.path.join(workdir, "checkpoints", str(total))) else None


def read_status(workdir_root: str) -> dict:
  """The members of an earlier run's status file by name ({} if there is none or it is unreadable)."""
  try:
    with open(os.path.join(workdir_root, STATUS_FILE)) as f:
      return {m["name"]: m for m in json.load(f)["members"]}
  except (OSError, ValueError, KeyError, TypeError):
    return {}


def write_status(workdir_root: str, members: list[dict]) -> None:
  """Writes the status file atomically (a temp file in the same directory, then os.replace)."""
  status_lib.write_json_atomic(os.path.join(workdir_root, STATUS_FILE),
                               {"updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "members": members})


def run_attempt(cmd: list[str], log_path: str) -> tuple[int, str]:
  """Runs `cmd`, its stderr shown live and copied to `log_path`; -> (return code, error line)."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  error = ErrorLine()
  with open(log_path, "w", buffering=1) as log:
    log.write(f"$ {shlex.join(cmd)}\n")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    try:
      for line in proc.stderr:
        sys.stderr.write(line)
        log.write(line)
        error.add(line)
      returncode = proc.wait()
    finally:
      if proc.poll() is None:   # the launcher was interrupted: stop the member too
        proc.terminate()
        proc.wait()
  return returncode, error.get(returncode)


def summary(members: list[dict]) -> str:
  """A plain-text table: member, state, attempts, error."""
  rows = [("member", "state", "attempts", "error")]
  rows += [(m["name"], m["state"], str(m["attempts"]), m.get("error") or "") for m in members]
  widths = [max(len(r[i]) for r in rows) for i in range(3)]
  return "\n".join(("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3]).rstrip()
                   for r in rows)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiment file, e.g. experiments/smoke.py")
  parser.add_argument("--args", nargs="*", default=[], help="one config arg per member")
  parser.add_argument("--workdir_root", required=True, help="members go to <root>/<arg>")
  parser.add_argument("--override", action="append", default=[],
                      help="extra flag for every member, e.g. --override=--config.total_steps=50")
  parser.add_argument("--retries", type=int, default=1,
                      help="retry a member that exits non-zero up to this many more times")
  parser.add_argument("--run", action="store_true", help="run (default: print the commands)")
  ns = parser.parse_args(argv)
  if ns.retries < 0:
    parser.error(f"--retries must be >= 0, got {ns.retries}")
  cmds = commands(ns.config, ns.args, ns.workdir_root, ns.override)
  names = [member_name(a) for a in ns.args or [""]]
  if len(set(names)) != len(names):
    parser.error(f"two members would share a workdir: {names}")
  n = len(cmds)
  if not ns.run:
    for i, cmd in enumerate(cmds):
      print(f"[{i + 1}/{n}] {shlex.join(cmd)}", flush=True)
    return 0

  previous = read_status(ns.workdir_root)
  members = []
  for name, cmd in zip(names, cmds):
    old = previous.get(name, {})
    workdir = os.path.join(ns.workdir_root, name)
    same_command = shlex.split(old.get("command", ""))[1:] == cmd[1:]   # any Python interpreter
    finished = old.get("state") == "done" and same_command and final_checkpoint(workdir) is not None
    members.append({"name": name, "command": shlex.join(cmd), "workdir": workdir,
                    "state": "done" if finished else "pending", "attempts": old.get("attempts", 0),
                    "returncode": old.get("returncode") if finished else None, "error": None,
                    "logs": old.get("logs", [])})
  others = [m for name, m in previous.items() if name not in names]   # members of other sweeps
  save = lambda: write_status(ns.workdir_root, members + others)
  save()

  for i, (m, cmd) in enumerate(zip(members, cmds)):
    tag = f"[{i + 1}/{n}] {m['name']}"
    if m["state"] == "done":
      print(f"{tag}: skipped, done (checkpoint of the final step {final_checkpoint(m['workdir'])})",
            flush=True)
      continue
    for k in range(ns.retries + 1):
      m["attempts"] += 1
      log = os.path.join(ns.workdir_root, LOG_DIR, f"{m['name']}.attempt{m['attempts']}.log")
      while os.path.exists(log):   # a log of an earlier sweep whose status file is gone: keep it
        m["attempts"] += 1
        log = os.path.join(ns.workdir_root, LOG_DIR, f"{m['name']}.attempt{m['attempts']}.log")
      m.update(state="running", returncode=None, error=None)
      m["logs"].append(log)
      save()
      print(f"{tag} (attempt {m['attempts']}): {shlex.join(cmd)}", flush=True)
      try:
        returncode, error = run_attempt(cmd, log)
      except BaseException:
        m.update(state="failed", error="interrupted (the launcher stopped)")
        save()
        raise
      m["returncode"] = returncode
      if returncode == 0:
        m["state"] = "done"
        save()
        break
      m.update(state="failed", error=error)
      save()
      more = ns.retries - k
      print(f"{tag}: attempt {m['attempts']} failed (exit {returncode}): {m['error']}; "
            + (f"retrying ({more} left)" if more else "FAILED; continuing with the others"),
            flush=True)

  print(f"\nsweep {ns.workdir_root} ({os.path.join(ns.workdir_root, STATUS_FILE)}):\n{summary(members)}",
        flush=True)
  failed = [m for m in members if m["state"] != "done"]
  if failed:
    print(f"{len(failed)} of {n} members failed; their stderr is in "
          f"{os.path.join(ns.workdir_root, LOG_DIR)}/", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
