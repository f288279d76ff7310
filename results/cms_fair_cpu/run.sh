#!/bin/bash
# The fair CMS comparison (experiments/cms_fair.py, committed before its runs), resumable across
# machines: members archived here are copied back into the run root, so the sweep runner skips
# them and trains only what is missing. STAGES: grid and compare (independent; one
# root each under ROOT and OUT).
# Run from a separate git worktree (~/cbert_runs/wt):
#   STAGES=grid nohup nice -n 5 bash results/cms_fair_cpu/run.sh > ~/cbert_runs/cms_fair.out 2>&1 &
set -u
MAIN=${MAIN:-/work/main}
PY=$MAIN/.venv/bin/python
ROOT=${ROOT:-$HOME/cbert_runs/cms_fair_cpu}
OUT=$MAIN/results/cms_fair_cpu
STAGES=${STAGES:-grid compare}
export CBERT_JAX_CACHE=${CBERT_JAX_CACHE:-$HOME/cbert_runs/cache}
. "$(dirname "$0")/../runner_lib.sh"
for stage in $STAGES; do
  root="$ROOT/$stage" out="$OUT/$stage"
  restore_archived "$out" "$root"
  start_archiver "$root" "$out"
  $PY -m cbert_jax.main --config "experiments/cms_fair.py:$stage" --workdir "$root"
  echo "stage $stage exit $?"
  kill $ARCHIVER
  archive "$root" "$out"
done
# the report from the archives, from the repository root so it names them relative to it
cd "$MAIN" || exit 1
done_roots=$(for s in grid compare; do [ -d "results/cms_fair_cpu/$s" ] && echo "results/cms_fair_cpu/$s"; done)
$PY -m cbert_jax.report.cms_fair --runs $done_roots --out results/cms_fair_cpu/report
