#!/bin/bash
# Every paper member re-planned for H100 (8-GPU nodes: 8, 16, 32, 64 GPUs) and compiled deviceless by
# XLA:GPU on a CPU-only machine (launch.compile_check --gpu; issue 51). Needs jax's CUDA plugin in
# the interpreter: python3 -m venv V && V/bin/pip install 'jax[cuda12]==0.10.2' && V/bin/pip install -e .
# (5.5 GB; no GPU needed). Resumable: members archived for the same config are skipped.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
$PY -m launch.compile_check --config experiments/sweep.py --gpu --override=--config.sweep.chip=h100 \
  --archive "${OUT:-results/gpu_aot}/h100"
