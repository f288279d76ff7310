"""Can a checkpoint commit in this directory? `python -m launch.commit_check DIR`, before training.

Orbax commits a checkpoint whose path is not `gs://` by writing it to a temporary directory and
renaming that directory, subdirectories and all (orbax/checkpoint/_src/path/atomicity.py:
AtomicRenameTemporaryPath, the default off GCS). On a Cloud Storage FUSE mount of a flat bucket
gcsfuse refuses that rename unless the mount allows it: `rename-dir-limit` defaults to 0 ("Allow
rename a directory containing fewer descendants than this limit", gcsfuse cfg/params.yaml; its
`aiml-checkpointing` profile sets 200000), and `xpk storage attach` mounts with `implicit-dirs`
only. The trainer would then fail its first checkpoint (exit 5) after training up to it. This
check does the same kind of rename (a directory holding a subdirectory and a file) in DIR and
removes it: exit 0, or one `checkpoint error:` line naming the fix and exit 5 (the trainer's
checkpoint status, on which xpk does not restart a workload).

The xpk member command runs it first when the workload mounts a storage (launch/backends.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

EXIT_CHECKPOINT = 5  # the trainer's exit status for a checkpoint error (cbert_jax/main.py)
RENAME_DIR_LIMIT = 200000  # gcsfuse's aiml-checkpointing profile
MOUNT_OPTIONS = f"implicit-dirs,rename-dir-limit={RENAME_DIR_LIMIT}"


def check(directory: str) -> str | None:
  """None when a directory tree renames in `directory`; else the one-line reason."""
  try:
    os.makedirs(directory, exist_ok=True)
    probe = tempfile.mkdtemp(prefix=".commit-check-", dir=directory)
  except OSError as e:
    return f"cannot write in {directory} ({e.strerror or e}): checkpoints could not be saved"
  try:
    os.makedirs(os.path.join(probe, "tmp", "d"))
    with open(os.path.join(probe, "tmp", "d", "f"), "w") as f:
      f.write("x")
    os.rename(os.path.join(probe, "tmp"), os.path.join(probe, "done"))
  except OSError as e:
    return (
      f"{directory} cannot rename a directory ({e.strerror or e}), and orbax commits each "
      "checkpoint by renaming its directory: on a gcsfuse mount (xpk storage) attach it with "
      f"`--mount-options={MOUNT_OPTIONS}` (or use a bucket with hierarchical namespace)"
    )
  finally:
    shutil.rmtree(probe, ignore_errors=True)
  return None


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print("usage: python -m launch.commit_check DIR", file=sys.stderr)
    return 2
  reason = check(argv[0])
  if reason:
    print(f"checkpoint error: {reason}", file=sys.stderr)
    return EXIT_CHECKPOINT
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
