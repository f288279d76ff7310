#!/bin/bash
set -eu
PY=/work/main/.venv/bin/python
D=$HOME/cbert_runs/demo35
export CBERT_JAX_CACHE=$HOME/cbert_runs/cache
while pgrep -f "demo35/run.sh" > /dev/null; do sleep 10; done
cd /work/main  # the repository (the code under test)
$PY -m cbert_jax.export --workdir $D/smoke --out $D/smoke_export_pt --pretraining > $D/export_pt.log 2>&1
$PY -m cbert_jax.main --config experiments/smoke.py --workdir $D/continued_pt \
  --config.init_from=$D/smoke_export_pt --config.model.size=from_init --config.total_steps=100 \
  --config.optim.warmup_steps=10 > $D/continued_pt.log 2>&1
echo done2
