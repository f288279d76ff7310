#!/bin/bash
# The memory plan against XLA's compiled bytes (issue 34, item 4): every paper member up to
# d1024L16, both families, under each remat policy (sweep.memory=check keeps the policy given),
# compiled by launch.compile_check on a fake CPU mesh of the member's target devices.
# paper_v5p.*: every paper member (all 17) at the setting the planner chose for v5p.
set -u
cd "$(dirname "$0")/../.."
OUT=results/memory_calibration
MEMBERS=bert_d384L6,crossbert_d384L6,bert_d512L8,crossbert_d512L8,bert_d768L12,crossbert_d768L12,bert_d1024L16,crossbert_d1024L16
for remat in none dots full; do
  [ -s $OUT/compile_$remat.json ] && continue
  .venv/bin/python -m launch.compile_check --config experiments/sweep.py --members $MEMBERS \
    --override=--config.sweep.memory=check --override=--config.model.remat=$remat \
    --override=--config.model.ce_chunk=0 --override=--config.optim.microbatches=1 \
    --out $OUT/compile_$remat.json > $OUT/compile_$remat.txt 2>&1
done
# Every paper member at its planned setting on v5p, and the H100 re-plan of the d1024L16 members:
[ -s $OUT/paper_v5p.json ] || .venv/bin/python -m launch.compile_check --config experiments/sweep.py \
  --out $OUT/paper_v5p.json > $OUT/paper_v5p.txt 2>&1
[ -s $OUT/replan_h100.json ] || .venv/bin/python -m launch.compile_check --config experiments/sweep.py \
  --members crossbert_d1024L16,bert_d1024L16 --override=--config.sweep.chip=h100 \
  --out $OUT/replan_h100.json > $OUT/replan_h100.txt 2>&1
