"""`python -m cbert_jax.report --sweep DIR [--grid DIR] [--cms DIR] [--heldout DIR]
[--lawcheck DIR ...] [--out DIR]`:
the scaling report of a sweep (report/sweep_report.py), written to report.md, report.json and
PNGs."""

import argparse
import sys

from cbert_jax.report import loss_surface
from cbert_jax.report.progress import Progress
from cbert_jax.report.sweep_report import ReportError, write


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m cbert_jax.report", description=__doc__.splitlines()[0]
  )
  parser.add_argument("--sweep", required=True, help="the sweep directory (member workdirs inside)")
  parser.add_argument("--out", default=None, help="where the report goes (default <sweep>/report)")
  parser.add_argument(
    "--cms", default=None, help="the controlled CMS experiment's directory (cms.json)"
  )
  parser.add_argument(
    "--grid", default=None, help="a hyperparameter grid: its optima join the L(N, D) fit"
  )
  parser.add_argument(
    "--heldout",
    default=None,
    help="a held-out size's directory (predictions.json + its runs): predicted vs measured",
  )
  parser.add_argument(
    "--lawcheck",
    action="append",
    default=[],
    help="a check of the sweep's LR/batch laws where it used them (check.json of python -m "
    "cbert_jax.report.lawcheck); shown under the laws it checked; repeatable",
  )
  parser.add_argument(
    "--n_boot", type=int, default=loss_surface.N_BOOT, help="bootstrap resamples of the L(N, D) fit"
  )
  parser.add_argument(
    "--quiet", action="store_true", help="no progress lines on stderr (stage n/N, elapsed)"
  )
  ns = parser.parse_args(argv)
  try:
    command = " ".join(
      ["python -m cbert_jax.report", *(argv if argv is not None else sys.argv[1:])]
    )
    path = write(
      ns.sweep,
      ns.out,
      cms=ns.cms,
      grid=ns.grid,
      n_boot=ns.n_boot,
      command=command,
      progress=None if ns.quiet else Progress(),
      heldout_dir=ns.heldout,
      lawcheck_dirs=tuple(ns.lawcheck),
    )
  except ReportError as e:
    print(f"report error: {e}", file=sys.stderr)
    return 2
  with open(path) as f:
    print(f.read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
