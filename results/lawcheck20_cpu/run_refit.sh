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
# After the list, the runs PLAN.md's rule asks for next (the edge rule's points, then seed 1 of each
# group's best and sweep point), as `python -m cbert_jax.report.lawcheck --next` reads them off the
# archived runs, until none is left; a group with list runs still unarchived waits. Shards share
# these through claims ($ROOT/<name>.claim holds the pid of the shard training it).
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
# train NAME MODEL SIZE ROWS LR SEED: one run into $ROOT/NAME, archived when it finishes.
train() {
  echo "$(date -u +%FT%TZ) start $1 (shard $SHARD)" >> "$ROOT/progress.log"
  $PY -m cbert_jax.main \
    --config "experiments/hparam_grid.py:scale=cpu,model=$2,size=$3,batch=$4,lr=$5" \
    --config.sweep.tokens_per_param=20 --config.seed="$6" \
    --workdir "$ROOT/$1" > "$ROOT/$1.log" 2>&1
  local rc=$?
  echo "$(date -u +%FT%TZ) end $1 rc=$rc" >> "$ROOT/progress.log"
  [ $rc -eq 0 ] && archive "$ROOT" "$MAIN/results/lawcheck20_cpu"  # log: $ROOT/archive.log
  [ $rc -ne 0 ] && touch "$ROOT/$1.failed"  # not retried by the rule's loop: look at its log
  return 0
}

# name MODEL SIZE ROWS LR SEED: the run's directory name (the grid's convention)
name() {
  echo "${1}_${2}_b${3}_lr$($PY -c "print(f'{$4:.3g}')")$([ "$5" -ne 0 ] && echo "_s$5")"
}

i=-1
echo "$RUNS" | while read -r model size rows lr; do
  [ -z "$model" ] && continue
  i=$((i + 1))
  [ $((i % shard_n)) -ne "$shard_k" ] && continue
  run=$(name "$model" "$size" "$rows" "$lr" 0)
  if [ -e "$MAIN/results/lawcheck20_cpu/$run" ]; then continue; fi
  echo "$run" | grep -Eq "$ONLY" || continue
  train "$run" "$model" "$size" "$rows" "$lr" 0
done

# claim NAME: true when this shard may train NAME (no live shard holds its claim)
claim() {
  local c="$ROOT/$1.claim"
  if mkdir "$c" 2>/dev/null || ! kill -0 "$(cat "$c/pid" 2>/dev/null)" 2>/dev/null; then
    echo $$ > "$c/pid"
    return 0
  fi
  return 1
}

while :; do
  wait_for=$(echo "$RUNS" | while read -r model size rows lr; do
    [ -z "$model" ] && continue
    [ -e "$MAIN/results/lawcheck20_cpu/$(name "$model" "$size" "$rows" "$lr" 0)" ] ||
      echo "--wait_for $model:$size"
  done | sort -u)
  # shellcheck disable=SC2086  # wait_for: flags, split on purpose
  next=$($PY -m cbert_jax.report.lawcheck --grid "$MAIN/results/lawcheck20_cpu" \
    --experiment experiments/sweep.py:cpu --laws 'shipped:cpu-{model}' --next $wait_for 2>/dev/null)
  picked="" others=0
  while read -r model size rows lr seed; do
    [ -z "$model" ] && continue
    run=$(name "$model" "$size" "$rows" "$lr" "$seed")
    [ -e "$MAIN/results/lawcheck20_cpu/$run" ] || [ -e "$ROOT/$run.failed" ] && continue
    echo "$run" | grep -Eq "$ONLY" || continue
    if claim "$run"; then
      picked="$run $model $size $rows $lr $seed"
      break
    fi
    others=$((others + 1))
  done <<< "$next"
  if [ -z "$picked" ]; then
    # nothing to take: done, unless list runs or another shard's run may still add some
    if [ -z "$wait_for" ] && [ "$others" -eq 0 ]; then break; fi
    sleep "${POLL:-300}"
    continue
  fi
  # shellcheck disable=SC2086
  train $picked
  rm -rf "$ROOT/${picked%% *}.claim"
done
echo "$(date -u +%FT%TZ) shard $SHARD: nothing left" >> "$ROOT/progress.log"
