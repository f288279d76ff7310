#!/bin/bash
# Issue 35's closing-note demos: a smoke run continued from its own export for 100 steps, and a
# CrossBERT started from a BERT export. From the worktree; CBERT_JAX_CACHE shared with the runs.
set -eu
PY=/work/main/.venv/bin/python
D=$HOME/cbert_runs/demo35
export CBERT_JAX_CACHE=$HOME/cbert_runs/cache
cd $HOME/cbert_runs/wt
$PY -m cbert_jax.main --config experiments/smoke.py --workdir $D/smoke > $D/smoke.log 2>&1
$PY -m cbert_jax.export --workdir $D/smoke --out $D/smoke_export > $D/export.log 2>&1
$PY -m cbert_jax.main --config experiments/smoke.py --workdir $D/continued \
  --config.init_from=$D/smoke_export --config.model.size=from_init --config.total_steps=100 \
  --config.optim.warmup_steps=10 > $D/continued.log 2>&1
$PY -m cbert_jax.main --config experiments/smoke.py:model=bert --workdir $D/smoke_bert > $D/smoke_bert.log 2>&1
$PY -m cbert_jax.export --workdir $D/smoke_bert --out $D/bert_export > $D/export_bert.log 2>&1
$PY -m cbert_jax.main --config experiments/smoke.py --workdir $D/crossbert_from_bert \
  --config.init_from=$D/bert_export --config.model.size=from_init --config.total_steps=100 \
  --config.optim.warmup_steps=10 > $D/crossbert_from_bert.log 2>&1
echo done
