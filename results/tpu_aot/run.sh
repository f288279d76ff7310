#!/bin/bash
# Every paper member compiled by the TPU compiler (libtpu, ahead of time, on a CPU-only machine),
# issue 51. Resumable: each step archives a member's row as soon as it is compiled and skips the
# members already archived for the same config (launch.compile_check --archive), so rerunning this
# script after a kill goes on where it stopped. Needs `pip install -e '.[tpu]'` (libtpu).
#
#   OUT=~/cbert_runs/tpu_aot bash results/tpu_aot/run.sh      # then copy OUT's rows here
#
# Steps, in order (each a directory of OUT with its rows and table.md):
#   v5p/            the 17 paper members at their planned setting, for their planned v5p topology
#   calibration/R/  the members up to d1024L16 at remat R (dots, full; none is v5p/), the memory
#                   plan's TPU calibration (issue 51, item 3)
#   design/...      crossbert_d768L12 as the compiler sees other choices (item 4, docs/performance.md)
#   v6e/            the 17 paper members re-planned for v6e at the same HBM in all (8 v5p -> 32 v6e)
#   calibration/none_large/  the 4 dots members that might fit without remat, at remat none
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/tpu_aot}
PY=${PYTHON:-.venv/bin/python}
CHECK="$PY -m launch.compile_check --config experiments/sweep.py"
SMALL=bert_d384L6,crossbert_d384L6,bert_d512L8,crossbert_d512L8,bert_d768L12,crossbert_d768L12,bert_d1024L16,crossbert_d1024L16
mkdir -p "$OUT"
log() { echo "[$(date -u +%FT%TZ)] $*" | tee -a "$OUT/run.log"; }

log "v5p: every paper member"
$CHECK --tpu --archive "$OUT/v5p" >> "$OUT/run.log" 2>&1
for remat in dots full; do
  log "calibration: remat=$remat"
  $CHECK --tpu --members $SMALL --archive "$OUT/calibration/$remat" \
    --override=--config.sweep.memory=check --override=--config.model.remat=$remat \
    --override=--config.model.ce_chunk=0 --override=--config.optim.microbatches=1 \
    >> "$OUT/run.log" 2>&1
done
D768=crossbert_d768L12
log "design: $D768 data x fsdp 2x4"
$CHECK --tpu --members $D768 --archive "$OUT/design/data2_fsdp4" \
  --override=--config.mesh.data=2 --override=--config.mesh.fsdp=4 >> "$OUT/run.log" 2>&1
log "design: $D768 on 4 chips (v5p:2x2x1), the same global batch, the planner's setting and remat none"
$CHECK --tpu --members $D768 --archive "$OUT/design/chips4" \
  --override=--config.sweep.target_devices=4 >> "$OUT/run.log" 2>&1
$CHECK --tpu --members $D768 --archive "$OUT/design/chips4_none" \
  --override=--config.sweep.target_devices=4 --override=--config.sweep.memory=check \
  --override=--config.model.remat=none >> "$OUT/run.log" 2>&1
log "design: $D768 on 16 chips (v5p:2x2x4), the same global batch"
$CHECK --tpu --members $D768 --archive "$OUT/design/chips16" \
  --override=--config.sweep.target_devices=16 >> "$OUT/run.log" 2>&1
log "v6e: every paper member at the same HBM in all"
$CHECK --generation v6e --archive "$OUT/v6e" >> "$OUT/run.log" 2>&1
# The members planned with remat dots whose remat=none plan, at the TPU's 0.67-0.73 compiled /
# predicted, may fit v5p's 85.5 GiB without remat (predicted 82-121 GiB): does the TPU compiler
# say they pay for remat they do not need? (issue 51, item 3)
log "remat none for the dots members that may not need it"
$CHECK --tpu --members bert_d1280L20,bert_d1536L24,bert_d2048L24,crossbert_d2048L24 \
  --archive "$OUT/calibration/none_large" --override=--config.sweep.memory=check \
  --override=--config.model.remat=none --override=--config.model.ce_chunk=0 \
  --override=--config.optim.microbatches=1 >> "$OUT/run.log" 2>&1
log "done"
