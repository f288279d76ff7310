#!/bin/bash
# The refit stage of PLAN.md, resumable: runs each (model, size, rows, lr) in order, skipping
# runs already archived under results/lawcheck20_cpu; archives each finished run there
# (results/runner_lib.sh's archive, logged in ROOT/archive.log).
# Run from a separate git worktree (~/cbert_runs/wt) so edits to the main tree cannot break it:
#   nohup nice -n 19 bash results/lawcheck20_cpu/run_refit.sh > ~/cbert_runs/refit.out 2>&1 &
# SHARD=k/n runs every n-th run of the list starting at the k-th (0-based), so n copies share the
# list without training the same run twice (one per core: SHARD=0/2 and SHARD=1/2).
# ONLY=REGEX trains only the runs whose name matches (grep -E), e.g. ONLY=bert_d96L3 to fill the
# end of a session with the short runs.
set -u
SHARD=${SHARD:-0/1}
ONLY=${ONLY:-.}
shard_k=${SHARD%/*} shard_n=${SHARD#*/}
MAIN=${MAIN:-/work/main}
PY=$MAIN/.venv/bin/python
ROOT=${ROOT:-$HOME/cbert_runs/lawcheck20_cpu}
export CBERT_JAX_CACHE=${CBERT_JAX_CACHE:-$HOME/cbert_runs/cache}
. "$(dirname "$0")/../runner_lib.sh"
mkdir -p "$ROOT"
RUNS="
crossbert d128L3 43 0.002263
crossbert d128L3 22 0.002263
crossbert d128L3 86 0.002263
crossbert d128L3 43 0.0011315
crossbert d128L3 43 0.004526
crossbert d128L3 86 0.004526
bert d96L3 20 0.001475
bert d96L3 10 0.001475
bert d96L3 40 0.001475
bert d96L3 20 0.0059
bert d96L3 10 0.0059
bert d96L3 40 0.0059
bert d128L3 52 0.003271
bert d128L3 26 0.003271
bert d128L3 104 0.003271
bert d128L3 52 0.0016355
bert d128L3 52 0.006542
bert d128L3 104 0.006542
bert d96L3 80 0.0059
bert d96L3 40 0.0118
"
i=-1
echo "$RUNS" | while read -r model size rows lr; do
  [ -z "$model" ] && continue
  i=$((i + 1))
  [ $((i % shard_n)) -ne "$shard_k" ] && continue
  name="${model}_${size}_b${rows}_lr$($PY -c "print(f'{$lr:.3g}')")"
  if [ -e "$MAIN/results/lawcheck20_cpu/$name" ]; then continue; fi
  echo "$name" | grep -Eq "$ONLY" || continue
  echo "$(date -u +%FT%TZ) start $name (shard $SHARD)" >> "$ROOT/progress.log"
  $PY -m cbert_jax.main \
    --config "experiments/hparam_grid.py:scale=cpu,model=$model,size=$size,batch=$rows,lr=$lr" \
    --config.sweep.tokens_per_param=20 --config.seed=0 \
    --workdir "$ROOT/$name" > "$ROOT/$name.log" 2>&1
  rc=$?
  echo "$(date -u +%FT%TZ) end $name rc=$rc" >> "$ROOT/progress.log"
  [ $rc -eq 0 ] && archive "$ROOT" "$MAIN/results/lawcheck20_cpu"  # log: $ROOT/archive.log
done
