#!/bin/bash
# The held-out runs (predictions.md first, committed before them), resumable across machines:
# finished members archived here are copied back into the run root, so the sweep runner skips
# them and trains only what is missing. MODELS picks the families (default both).
# Run from a separate git worktree (~/cbert_runs/wt):
#   nohup nice -n 5 bash results/heldout_cpu/run.sh > ~/cbert_runs/heldout.out 2>&1 &
set -u
MAIN=${MAIN:-/work/main}
PY=$MAIN/.venv/bin/python
ROOT=${ROOT:-$HOME/cbert_runs/heldout_cpu}
OUT=$MAIN/results/heldout_cpu
MODELS=${MODELS:-bert,crossbert}
export CBERT_JAX_CACHE=${CBERT_JAX_CACHE:-$HOME/cbert_runs/cache}
. "$(dirname "$0")/../runner_lib.sh"
restore_archived "$OUT" "$ROOT"
start_archiver "$ROOT" "$OUT"
$PY -m cbert_jax.main --config experiments/sweep.py:heldout --config.sweep.models="$MODELS" \
  --config.sweep.report=false --workdir "$ROOT"
echo "sweep exit $?"
kill $ARCHIVER
archive "$ROOT" "$OUT"
