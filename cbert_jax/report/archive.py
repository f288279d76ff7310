r"""A sweep's or grid's results without its checkpoints, small enough to keep in git.

  python -m cbert_jax.report.archive --root runs/grid_cpu --out results/grid_cpu

copies what the fits and the scaling report read, and nothing they do not:
  * the root's manifest and status (sweep.json, sweep_status.json) and its outputs (laws.json,
    laws.png, grid.png, report/);
  * for every member that is done (`status.is_done`, or archived done already) or failed: its
    config.json, metrics.jsonl, parameters.txt, FAILED and eval/*.json (the full-split validation
    and probe results), plus `ARCHIVE.json` naming the final step whose checkpoint was left out.
Checkpoints, TensorBoard events, tokenizers, plots of single runs and compilation caches stay
behind (a grid of 150 tiny members is ~1.2 GB with them and ~20 MB without); members still
running or pending are not copied (nothing in them is a result yet).

An archived member counts as done (`status.is_done`): copying the archive back into a run root and
rerunning the sweep or grid command skips it and trains only what is missing, which is how a sweep
survives a machine that does not keep its run directory. `report.grid fit --grid` and
`cbert_jax.report --sweep` read an archive as they read the run root. Rerunning the archive
command updates the archive (every file written atomically), so it can follow a sweep in progress.

Damage is never archived silently; the members concerned are named at the end, with the reason:
  * a member whose config.json is not valid JSON (cut mid-write), cannot be read, is not a run's
    record or has no total_steps is skipped: `skipped 1 member: b_lr2 (config.json is not valid
    JSON: ...)` on stderr, and the exit status is 1 (the rest is archived; an earlier archive of
    the member in --out is kept as it was);
  * metrics.jsonl lines that are not JSON rows (a last line cut mid-write by a kill, or another
    unreadable line) are dropped from the archived copy, which holds exactly the rows
    `metrics.read_metrics` reads from the member: `repaired 1 member: b_lr4 (metrics.jsonl:
    dropped its last line 5, cut mid-write: 21 bytes without a newline, not a JSON row)` on
    stdout, exit status 0. The member's own file is left as it is.
Bad arguments are one line and exit status 2: a missing --root, an --out that is a file, cannot be
created, is a symbolic link (refused outright: it could lead anywhere, --root included), or is
inside --root once every link in its path is resolved (os.path.realpath).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

from cbert_jax.run import record as record_lib
from cbert_jax.run import status as status_lib

ROOT_FILES = ("sweep.json", status_lib.STATUS_FILE, "laws.json", "laws.png", "grid.png")
ROOT_DIRS = ("report",)
MEMBER_FILES = (
  record_lib.CONFIG_FILE,
  record_lib.METRICS_FILE,
  "parameters.txt",
  record_lib.FAILED_FILE,
)
MEMBER_GLOBS = (f"{record_lib.EVAL_DIR}/*.json",)


class ArchiveError(ValueError):
  """Bad archive input: one line naming the flag or path and what was expected."""


def _copy(src: str, dst: str, data: bytes | None = None) -> None:
  """Copies one file (or writes `data` in its place) atomically (a temporary name, then a
  rename): a reader or an interrupted archive never sees half a file."""
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = dst + ".tmp-archive"
  if data is None:
    shutil.copyfile(src, tmp)
  else:
    with open(tmp, "wb") as f:
      f.write(data)
  os.replace(tmp, dst)


def _is_row(line: bytes) -> bool:
  """Whether a metrics.jsonl line is a row `metrics.read_metrics` reads (an object with a step)."""
  try:
    row = json.loads(line)
  except ValueError:  # not JSON, or not UTF-8
    return False
  return isinstance(row, dict) and isinstance(row.get("step"), int)


def _readable_metrics(path: str) -> tuple[bytes | None, str]:
  """(metrics.jsonl without its unreadable lines, what was dropped), or (None, "") when every
  line is a row and the file ends with a newline (then it is copied as it is)."""
  with open(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  cut = lines.pop() if lines else b""  # b"" when the file ends with a newline
  if cut:
    lines.append(cut)
  bad = [i for i, line in enumerate(lines, 1) if line.strip() and not _is_row(line)]
  if not bad and not cut:
    return None, ""
  kept = b"".join(line + b"\n" for i, line in enumerate(lines, 1) if i not in bad)
  if bad == [len(lines)] and cut:
    why = f"dropped its last line {len(lines)}, cut mid-write: {len(cut)} bytes without a newline"
    return kept, f"metrics.jsonl: {why}, not a JSON row"
  if not bad:
    return kept, ""  # a complete last row without its newline: archived with one, nothing lost
  shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
  return kept, f"metrics.jsonl: dropped {len(bad)} line(s) that are not JSON rows: {shown}"


def _unreadable_config(workdir: str) -> str:
  """Why the member's config.json cannot say what the member is ("" when it can)."""
  try:
    config = record_lib.read_config(workdir)
  except record_lib.ConfigFileError as e:
    cause = e.cause
    if isinstance(cause, json.JSONDecodeError):
      return f"config.json is not valid JSON: {cause}"
    if isinstance(cause, UnicodeDecodeError):
      return f"config.json is not UTF-8 text: {cause}"
    if isinstance(cause, OSError):
      return f"config.json cannot be read: {cause.strerror or cause}"
    return f"config.json is not a run's record: {type(cause).__name__}: {cause}"
  try:
    if int(config["total_steps"]) > 0:
      return ""
  except (KeyError, TypeError, ValueError):
    pass
  return f"config.json has no positive total_steps (got {config.get('total_steps')!r})"


def _check_out(root: str, out: str) -> str:
  """The real path of --out once it is known to be a directory outside --root (created if absent).
  Raises ArchiveError."""
  if os.path.islink(out):
    raise ArchiveError(
      f"--out: {out!r} is a symbolic link (to {os.readlink(out)!r}); pass a real directory"
    )
  real = os.path.realpath(out)
  if real == root or real.startswith(root + os.sep):
    shown = f"{out!r}" + (f" ({real!r})" if real != out else "")
    raise ArchiveError(f"--out: {shown} is inside --root {root!r}; archive to another directory")
  if os.path.exists(real) and not os.path.isdir(real):
    raise ArchiveError(
      f"--out: {out!r} is a file, not a directory; pass a directory (created if absent)"
    )
  try:
    os.makedirs(real, exist_ok=True)
  except OSError as e:
    raise ArchiveError(f"--out: cannot create the directory {out!r} ({e.strerror or e})") from e
  return real


def _member_files(workdir: str) -> list[str]:
  """Paths relative to `workdir` of the member's result files that exist."""
  rel = [f for f in MEMBER_FILES if os.path.isfile(os.path.join(workdir, f))]
  for pattern in MEMBER_GLOBS:
    rel += sorted(os.path.relpath(p, workdir) for p in glob.glob(os.path.join(workdir, pattern)))
  return rel


def _probes(workdir: str) -> bool:
  """Whether the member's sweep probes it (its config.json's sweep.probe): then it is done only
  with its probe results."""
  try:
    return bool(record_lib.read_config(workdir)["sweep"]["probe"])
  except (record_lib.ConfigFileError, KeyError, TypeError):
    return False


def archive(root: str, out: str, notes: dict[str, dict[str, str]] | None = None) -> dict[str, int]:
  """Copies `root`'s results into `out`; returns counts {"done", "failed", "left"}.

  `notes`, when given, gets {"skipped": {member: why}, "repaired": {member: what}} (the module
  docstring says which is which)."""
  root = os.path.abspath(root)
  if not os.path.isdir(root):
    raise ArchiveError(f"--root: no such directory {root!r}")
  out = _check_out(os.path.realpath(root), os.path.abspath(out))
  notes = {} if notes is None else notes
  skipped, repaired = notes.setdefault("skipped", {}), notes.setdefault("repaired", {})
  counts = {"done": 0, "failed": 0, "left": 0}
  for name in record_lib.run_names(root):
    wd = os.path.join(root, name)
    why = _unreadable_config(wd)
    if why:
      skipped[name] = why + (
        "; its earlier archive is kept" if os.path.isdir(os.path.join(out, name)) else ""
      )
      continue
    total = record_lib.total_steps(wd)
    done = status_lib.is_done(wd, _probes(wd))
    failed = record_lib.failed(wd) is not None
    if not done and not failed:
      counts["left"] += 1
      continue
    rels = _member_files(wd)
    for rel in rels:
      data = None
      if rel == record_lib.METRICS_FILE:
        data, what = _readable_metrics(os.path.join(wd, rel))
        if what:
          repaired[name] = what
      _copy(os.path.join(wd, rel), os.path.join(out, name, rel), data)
    # What an earlier archive of the member holds and the member no longer does: a FAILED file
    # that a successful retry cleared (it would mark the archived member failed).
    archived = os.path.join(out, name)
    for rel in set(_member_files(archived)) - set(rels):
      os.unlink(os.path.join(archived, rel))
    if done:
      record = {"final_step": total, "source": wd, "checkpoints_left_out": True}
      status_lib.write_json_atomic(os.path.join(out, name, record_lib.ARCHIVE_FILE), record)
    counts["done" if done else "failed"] += 1
  for f in ROOT_FILES:
    if os.path.isfile(os.path.join(root, f)):
      _copy(os.path.join(root, f), os.path.join(out, f))
  for d in ROOT_DIRS:
    for dirpath, _, files in os.walk(os.path.join(root, d)):
      for f in files:
        src = os.path.join(dirpath, f)
        _copy(src, os.path.join(out, os.path.relpath(src, root)))
  return counts


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m cbert_jax.report.archive",
    description="Copy a sweep's or grid's results (no checkpoints) to a directory.",
  )
  p.add_argument("--root", required=True, help="the sweep's or grid's run root")
  p.add_argument("--out", required=True, help="the archive directory (created or updated)")
  args = p.parse_args(argv)
  notes: dict[str, dict[str, str]] = {}
  try:
    counts = archive(args.root, args.out, notes)
  except ArchiveError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # e.g. --out not writable, or the disk full, while copying
    print(f"error: archiving {args.root} to {args.out} failed: {e}", file=sys.stderr)
    return 1
  print(
    f"archived {counts['done']} done and {counts['failed']} failed member(s) of {args.root} to "
    f"{args.out}; {counts['left']} not finished (not copied)"
  )
  if notes["repaired"]:
    print(_named("repaired", notes["repaired"]))
  if notes["skipped"]:
    print(_named("skipped", notes["skipped"]), file=sys.stderr)
    return 1
  return 0


def _named(verb: str, members: dict[str, str]) -> str:
  """One line: 'skipped 2 members: a (why); b (why)'."""
  n = len(members)
  listed = "; ".join(f"{name} ({why})" for name, why in sorted(members.items()))
  return f"{verb} {n} member{'s' if n > 1 else ''}: {listed}"


if __name__ == "__main__":
  sys.exit(main())
