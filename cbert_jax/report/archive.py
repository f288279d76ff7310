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
"""

from __future__ import annotations

import argparse
import glob
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


def _copy(src: str, dst: str) -> None:
  """Copies one file atomically (a temporary name, then a rename): a reader or an interrupted
  archive never sees half a file."""
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = dst + ".tmp-archive"
  shutil.copyfile(src, tmp)
  os.replace(tmp, dst)


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


def archive(root: str, out: str) -> dict[str, int]:
  """Copies `root`'s results into `out`; returns counts {"done", "failed", "left"}."""
  root, out = os.path.abspath(root), os.path.abspath(out)
  if not os.path.isdir(root):
    raise ArchiveError(f"--root: no such directory {root!r}")
  if out == root or out.startswith(root + os.sep):
    raise ArchiveError(f"--out: {out!r} is inside --root {root!r}; archive to another directory")
  counts = {"done": 0, "failed": 0, "left": 0}
  for name in record_lib.run_names(root):
    wd = os.path.join(root, name)
    total = record_lib.total_steps(wd)
    if not total:
      continue  # not a member (no readable config.json)
    done = status_lib.is_done(wd, _probes(wd))
    failed = record_lib.failed(wd) is not None
    if not done and not failed:
      counts["left"] += 1
      continue
    rels = _member_files(wd)
    for rel in rels:
      _copy(os.path.join(wd, rel), os.path.join(out, name, rel))
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
  try:
    counts = archive(args.root, args.out)
  except ArchiveError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(
    f"archived {counts['done']} done and {counts['failed']} failed member(s) of {args.root} to "
    f"{args.out}; {counts['left']} not finished (not copied)"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
