r"""Fault script: a checkpoint this user may not read is a permission problem, never damage.

Takes the newest checkpoint of a checkpoint directory and, level by level (the checkpoint
directory itself, the step directory, each directory under it, one file of each), removes every
permission (`chmod 000`), tries to resume, and puts the permissions back. Each try must fail with
the one line docs/errors.md promises (naming the path and `chmod`, exit 5 for a run) and move
nothing; after the last level, the resume must succeed at that newest step with nothing in
`checkpoints.unreadable/`.

  # the Checkpointer alone (what tests/run/test_restore_faults.py runs; seconds):
  python -m tests.faults.checkpoint_permissions --checkpoints RUN/checkpoints
  # a whole run: each try is the command after --, which must resume RUN (minutes):
  python -m tests.faults.checkpoint_permissions --checkpoints RUN/checkpoints -- \
      python -m cbert_jax.main --config experiments/smoke.py --workdir RUN --config.total_steps=40

Permissions only bind a process that lacks root's override: run as root, the script first drops
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from itself and from every process it starts (as uid 0
it still owns the files it chmods), and checks that a mode-000 file then really refuses it.
Prints one line per level and exits 0 when every level behaved, 1 otherwise.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

_CAPS = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)


def drop_permission_override() -> None:
  """Make file permissions bind this process and its children, even as root (Linux)."""
  if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in _CAPS:  # from the bounding set first, so a child's exec does not get them back
      libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP

    class Header(ctypes.Structure):
      _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
      _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
      raise OSError(ctypes.get_errno(), "capget failed")
    keep = ~sum(1 << c for c in _CAPS) & 0xFFFFFFFF
    for field in ("effective", "permitted", "inheritable"):
      setattr(data[0], field, getattr(data[0], field) & keep)
    if libc.capset(ctypes.byref(header), data) != 0:
      raise OSError(ctypes.get_errno(), "capset failed")
  with tempfile.NamedTemporaryFile() as f:
    os.chmod(f.name, 0)
    try:
      open(f.name).close()
    except PermissionError:
      return
  raise SystemExit("cannot make permissions bind this process (root's override is still on)")


def levels(ckpt_dir: str) -> list[str]:
  """The paths to chmod 000 in turn: the checkpoint directory, the newest step's directory, each
  directory under it, and the first file of each of those directories."""
  steps = sorted((int(n) for n in os.listdir(ckpt_dir) if n.isdigit()), reverse=True)
  if not steps:
    raise SystemExit(f"no checkpoint in {ckpt_dir}")
  out = [ckpt_dir]
  for root, dirs, files in os.walk(os.path.join(ckpt_dir, str(steps[0]))):
    dirs.sort()
    out.append(root)
    out += [os.path.join(root, f) for f in sorted(files)[:1]]
  return out


def _abstract_of(ckpt_dir: str, step: int):
  """{"params": ..., "opt_state": ...} of ShapeDtypeStructs for checkpoint `step` (read before
  any permission is taken away)."""
  import jax  # pylint: disable=import-outside-toplevel  (--help needs no JAX)
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel

  tree = ocp.StandardCheckpointHandler().metadata(epath.Path(ckpt_dir) / str(step) / "state")
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
    getattr(tree, "tree", tree),
    is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
  )


def _restore(ckpt_dir: str, abstract) -> tuple[int, str]:
  """Resume through the Checkpointer: (0 | 5 | 1, what happened)."""
  from cbert_jax.errors import CheckpointError  # pylint: disable=import-outside-toplevel
  from cbert_jax.run import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel

  ckpt_lib.IO_BACKOFF_S = 0.0
  try:
    c = ckpt_lib.Checkpointer(ckpt_dir, keep=3)
    try:
      got = c.restore_latest(abstract["params"], abstract["opt_state"])
    finally:
      c.close()
  except CheckpointError as e:
    return 5, f"checkpoint error: {e}"
  except Exception as e:  # pylint: disable=broad-except  (a traceback is what this looks for)
    return 1, f"{type(e).__name__}: {e}"
  return 0, f"resumed from checkpoint at step {got[0] if got else None}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--checkpoints", required=True, help="a run's checkpoints/ directory")
  parser.add_argument("command", nargs="*", help="a command that resumes the run (after --)")
  args = parser.parse_args(argv)
  ckpt_dir = os.path.abspath(args.checkpoints)
  paths = levels(ckpt_dir)
  newest = max(int(n) for n in os.listdir(ckpt_dir) if n.isdigit())
  abstract = None if args.command else _abstract_of(ckpt_dir, newest)
  drop_permission_override()

  def attempt() -> tuple[int, str, str]:
    """(exit code, its error line, all it printed)."""
    if not args.command:
      code, said = _restore(ckpt_dir, abstract)
      return code, said, said
    done = subprocess.run(args.command, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    lines = out.strip().splitlines()
    said = next(
      (ln for ln in reversed(lines) if " error: " in f" {ln}"), lines[-1] if lines else ""
    )
    return done.returncode, said, out

  failures = 0
  for path in paths:
    mode = os.stat(path).st_mode & 0o7777
    os.chmod(path, 0)
    try:
      code, said, _ = attempt()
    finally:
      os.chmod(path, mode)
    moved = os.path.exists(ckpt_dir + ".unreadable")
    good = code == 5 and f"permission denied on {path} " in said and "chmod" in said and not moved
    failures += not good
    rel = os.path.relpath(path, os.path.dirname(ckpt_dir))
    print(
      f"{'ok  ' if good else 'FAIL'} chmod 000 {rel}: exit {code}; moved aside: {moved}; {said}",
      flush=True,
    )
  code, said, out = attempt()
  moved = os.path.exists(ckpt_dir + ".unreadable")
  resumed = f"resumed from checkpoint at step {newest}" in out
  good = code == 0 and not moved and resumed
  failures += not good
  print(
    f"{'ok  ' if good else 'FAIL'} permissions back: exit {code}; moved aside: {moved}; "
    f"resumed from step {newest}: {resumed}",
    flush=True,
  )
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
