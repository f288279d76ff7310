r"""Run several members of an experiment one after another on this machine.

  python -m launch.local --config experiments/smoke.py --args model=bert model=crossbert \
      --workdir_root runs/smoke_pair            # dry run: prints the commands
  python -m launch.local ... --run              # runs them, each in runs/smoke_pair/<arg>

Every member is the ordinary training command, so any one can be rerun by hand (and resumes from
its own workdir). A member that fails is reported and the others go on; the exit status is non-zero
if any failed. Pod backends (SLURM, TPU VMs, xpk) come with the scaling sweep.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys


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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiment file, e.g. experiments/smoke.py")
  parser.add_argument("--args", nargs="*", default=[], help="one config arg per member")
  parser.add_argument("--workdir_root", required=True, help="members go to <root>/<arg>")
  parser.add_argument("--override", action="append", default=[],
                      help="extra flag for every member, e.g. --override=--config.total_steps=50")
  parser.add_argument("--run", action="store_true", help="run (default: print the commands)")
  ns = parser.parse_args(argv)
  cmds = commands(ns.config, ns.args, ns.workdir_root, ns.override)
  failed = []
  for i, cmd in enumerate(cmds):
    print(f"[{i + 1}/{len(cmds)}] {shlex.join(cmd)}", flush=True)
    if ns.run and subprocess.call(cmd) != 0:
      failed.append(cmd)
      print(f"[{i + 1}/{len(cmds)}] FAILED; continuing with the others", flush=True)
  if failed:
    print(f"{len(failed)} of {len(cmds)} members failed", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
