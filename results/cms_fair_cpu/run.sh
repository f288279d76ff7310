#!/bin/bash
# The fair CMS comparison (experiments/cms_fair.py, committed before its runs), resumable across
# machines: members archived here are copied back into the run root, so the sweep runner skips
# them and trains only what is missing. STAGES: grid, then compare once NOCMS_BEST is set.
# Run from a separate git worktree (~/cbert_runs/wt):
#   STAGES=grid nohup nice -n 5 bash results/cms_fair_cpu/run.sh > ~/cbert_runs/cms_fair.out 2>&1 &
set -u
MAIN=${MAIN:-/work/main}
PY=$MAIN/.venv/bin/python
ROOT=${ROOT:-$HOME/cbert_runs/cms_fair_cpu}
OUT=$MAIN/results/cms_fair_cpu
STAGES=${STAGES:-grid compare}
export CBERT_JAX_CACHE=${CBERT_JAX_CACHE:-$HOME/cbert_runs/cache}
mkdir -p "$ROOT"
for d in "$OUT"/*/; do  # archived members come back as done
  [ -f "$d/config.json" ] && [ ! -e "$ROOT/$(basename "$d")" ] && cp -r "$d" "$ROOT/"
done
archive() { $PY -m cbert_jax.report.archive --root "$ROOT" --out "$OUT" >> "$ROOT/archive.log" 2>&1; }
( while sleep 300; do archive; done ) &
watcher=$!
for stage in $STAGES; do
  $PY -m cbert_jax.main --config "experiments/cms_fair.py:$stage" --workdir "$ROOT"
  echo "stage $stage exit $?"
done
kill $watcher
archive
$PY -m cbert_jax.report.cms_fair --runs "$OUT" --out "$OUT/report"
