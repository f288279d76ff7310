#!/usr/bin/env bash
# One prepared command for a short NVIDIA GPU window: benchmarks/accelerator_step.py's MFU table
# under the GPU host's own jax/jaxlib/flax/optax (nothing can be fetched there), with the few
# pure-Python packages its image lacks carried in as wheels (docs/performance.md, "A GPU window").
#
#   bash benchmarks/gpu_window.sh list                 # the pinned wheels, name==version a line
#   bash benchmarks/gpu_window.sh prepare [DIR]        # here: download them (runs/gpu_wheels)
#   bash benchmarks/gpu_window.sh prepare --dry-run    # the download command, without the network
#   bash benchmarks/gpu_window.sh run [FLAGS...]       # there: install the missing ones, run
#
# `run` installs the pinned wheels whose module does not import (offline: pip --no-index
# --no-deps --target a temp dir put first on PYTHONPATH; the image's own packages stay as they
# are), checks that the benchmark's modules import, sets the GPU memory JAX may take
# (XLA_PYTHON_CLIENT_MEM_FRACTION = cbert_jax.scaling.chips.GPU_MEM_FRACTION, the launchers' 0.92)
# and the chip's XLA flags and environment (`chips.chip_env`, as a launch sets them; dropped if JAX
# will not start with them), starts JAX once to see the GPU, then runs accelerator_step.py inside
# `timeout TOTAL_S`, each contestant in its own process with its own limit. It writes
# $OUT/accelerator_step.json, $OUT/accelerator_step.md (rewritten after every contestant, so a run
# cut short keeps what it measured) and $OUT/gpu_window.log. FLAGS go to accelerator_step.py after
# the window's defaults (the last of a repeated flag wins).
#
# Environment of `run` (defaults): OUT (runs/bench/accelerator_step), PYTHON (python3), WHEELS
# (runs/gpu_wheels), TOTAL_S (450: the whole benchmark's time box, compiles included), BUDGET_S
# (360: all contestants), CONTESTANT_S (150: one contestant), CHIP (auto: nvidia-smi's GPU in the
# chip table; or a chip key; none: no chip flags), XLA_PYTHON_CLIENT_MEM_FRACTION, FORCE_WHEELS
# (set: install every pinned wheel, importable or not: should the image's flax import but fail).
set -euo pipefail
cd "$(dirname "$0")/.."

# Pure-Python (py3-none-any) wheels, as `name==version module`: installed when `import module`
# fails. ml-collections: the GPU image lacks it (cbert_jax.config_lib and config_groups import it
# at module level; JaxStep reads the training config's optimizer from it); its dependencies
# (absl-py, PyYAML) are in the image. flax: a fallback only, should the image's flax not import
# nnx under its jax (flax 0.12.8, the project's pin, and 0.12.9 fail under jax 0.11.2:
# jax.experimental.hijax has no HiPrimitive; 0.12.10 and 0.12.12 run the benchmark); its
# dependencies (treescope, msgpack, rich, orbax-checkpoint, tensorstore, ...) are in the image.
# The benchmark's import path needs no other absent package: grain, tensorflow-datasets, clu,
# sentencepiece, tensorboardX and zstandard are imported by the data pipeline and trainer only.
PINNED=(
  "ml-collections==1.1.0 ml_collections"
  "flax==0.12.12 flax.nnx"
)
# The default order puts the comparisons that matter first, should the time box end the run early.
CONTESTANTS="BERT,CrossBERT+CMS,CrossBERT,BERT fused,CrossBERT+CMS fused"
MAX_WHEEL_BYTES=$((8 * 1024 * 1024))  # far under the 64 MiB a device call may carry

PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-runs/gpu_wheels}"

pins() {
  local entry
  for entry in "${PINNED[@]}"; do echo "${entry%% *}"; done
}

wheel_file() {  # name==version -> the py3-none-any wheel's file name
  local name="${1%%==*}" version="${1##*==}"
  echo "${name//-/_}-${version}-py3-none-any.whl"
}

prepare() {
  local dir="$WHEELS" dry=0
  for a in "$@"; do
    case "$a" in
      --dry-run) dry=1 ;;
      *) dir="$a" ;;
    esac
  done
  local cmd=("$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12
    --implementation py --abi none --platform any -d "$dir")
  mapfile -t reqs < <(pins)
  if ((dry)); then
    printf '%q ' "${cmd[@]}" "${reqs[@]}"
    echo
    return 0
  fi
  mkdir -p "$dir"
  "${cmd[@]}" "${reqs[@]}"
  local total=0 req file size
  for req in "${reqs[@]}"; do
    file="$dir/$(wheel_file "$req")"
    [[ -f $file ]] || { echo "prepare: $file was not downloaded" >&2; return 1; }
    size=$(wc -c <"$file")
    total=$((total + size))
    echo "$(wheel_file "$req") $size bytes sha256 $(sha256sum "$file" | cut -d' ' -f1)"
  done
  echo "total $total bytes in $dir (carry it: run's carry [\"$dir\"])"
  ((total <= MAX_WHEEL_BYTES)) || { echo "prepare: over $MAX_WHEEL_BYTES bytes" >&2; return 1; }
}

install_missing() {  # the pinned wheels whose module does not import, into a temp dir
  local entry req mod file site
  site="$(mktemp -d "${TMPDIR:-/tmp}/gpu_window_site.XXXXXX")"
  SITE="$site"
  trap 'rm -rf "$SITE"' EXIT
  for entry in "${PINNED[@]}"; do
    req="${entry%% *}"
    mod="${entry##* }"
    if [[ -z ${FORCE_WHEELS:-} ]] && "$PY" -c "import $mod" 2>/dev/null; then
      echo "wheels: $mod is installed; $req not needed"
      continue
    fi
    file="$WHEELS/$(wheel_file "$req")"
    if [[ ! -f $file ]]; then
      echo "wheels: $mod is missing and $file is not here: run" \
        "'bash benchmarks/gpu_window.sh prepare' before the window and carry $WHEELS" >&2
      return 2
    fi
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$file"; then
      echo "wheels: pip could not install $file; unpacking it instead" >&2
      "$PY" -m zipfile -e "$file" "$site"  # a pure-Python wheel is an importable tree
    fi
    echo "wheels: installed $(wheel_file "$req") into $site"
  done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

chip_env_lines() {  # $1 chip, $2 apply|restore: shell lines for the chip's launch environment
  # (chips.chip_env, what a launch exports), or lines that put back what is set now
  "$PY" - "$1" "$2" <<'EOF'
import os, shlex, sys

from cbert_jax.scaling import chips

for name, value in chips.chip_env(chips.CHIPS[sys.argv[1]]):
  old = os.environ.get(name)
  if sys.argv[2] == "restore":
    print(f"export {name}={shlex.quote(old)}" if old is not None else f"unset {name}")
    continue
  if name == "XLA_FLAGS":  # the chip's flags first: a flag already set (later) wins
    value = f"{value} {old or ''}".strip()
  else:
    value = old or value  # a value already set wins
  print(f"export {name}={shlex.quote(value)}")
EOF
}

start_jax() {  # JAX starts and sees its devices with this environment (XLA aborts on a bad flag)
  timeout 240 "$PY" -c '
import jax
d = jax.devices()
print(f"jax {jax.__version__}: backend {jax.default_backend()}, {len(d)} x {d[0].device_kind}")
'
}

run_window() {
  local out="${OUT:-runs/bench/accelerator_step}"
  local total_s="${TOTAL_S:-450}" budget_s="${BUDGET_S:-360}" contestant_s="${CONTESTANT_S:-150}"
  echo "gpu_window: $(date -u +%Y-%m-%dT%H:%M:%SZ), $("$PY" -V 2>&1) at $(command -v "$PY")"
  local gpu=""
  if command -v nvidia-smi >/dev/null; then
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  fi
  install_missing
  "$PY" - <<'EOF'
from importlib import metadata

for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections"):
  try:
    print(f"  {name} {metadata.version(name)}")
  except metadata.PackageNotFoundError:
    print(f"  {name} absent")
EOF
  # The benchmark's whole import path, before any device time is spent on it.
  "$PY" -c "import benchmarks.contestants, cbert_jax.config_lib, cbert_jax.models.families, \
cbert_jax.step.optim, cbert_jax.step.steps, cbert_jax.run.hardware, cbert_jax.scaling.memory" || {
    echo "gpu_window: the benchmark's modules do not import (above)" >&2
    return 3
  }
  local frac
  frac="$("$PY" -c 'from cbert_jax.scaling.chips import GPU_MEM_FRACTION as f; print(f)')"
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-$frac}"
  local chip="${CHIP:-auto}"
  if [[ $chip == auto ]]; then
    chip="$("$PY" -c '
import sys
from cbert_jax.scaling import chips
found = chips.lookup_device_kind(sys.argv[1]) if sys.argv[1] else None
print(found[0] if found and found[1].planned else "none")' "$gpu")"
  fi
  local restore=""
  if [[ $chip != none ]]; then
    restore="$(chip_env_lines "$chip" restore)"
    eval "$(chip_env_lines "$chip" apply)"
  fi
  echo "gpu_window: chip $chip; XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION" \
    "XLA_FLAGS=${XLA_FLAGS:-} JAX_OPTIMIZATION_LEVEL=${JAX_OPTIMIZATION_LEVEL:-}" \
    "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-}"
  local seen
  if ! seen="$(start_jax)"; then
    [[ $chip != none ]] || { echo "gpu_window: JAX does not start" >&2; return 4; }
    echo "gpu_window: JAX does not start with $chip's flags; without them" >&2
    eval "$restore"
    seen="$(start_jax)" || { echo "gpu_window: JAX does not start" >&2; return 4; }
  fi
  echo "$seen"
  if [[ -n $gpu && $seen != *"backend gpu"* ]]; then
    echo "gpu_window: nvidia-smi shows $gpu but JAX does not use it (above)" >&2
    return 5
  fi
  local plan=()
  [[ $chip == none ]] || plan=(--plan_chip "$chip")
  mkdir -p "$out"
  local rc=0
  timeout -k 20 "$total_s" "$PY" -u benchmarks/accelerator_step.py --out "$out" \
    --contestants "$CONTESTANTS" --budget_s "$budget_s" --contestant_s "$contestant_s" \
    "${plan[@]}" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "gpu_window: the ${total_s} s time box ended the run; $out holds what finished" >&2
  fi
  echo "gpu_window: exit $rc; in $out:"
  ls -l "$out"
  return "$rc"
}

case "${1:-}" in
  list) pins ;;
  prepare)
    shift
    prepare "$@"
    ;;
  run)
    shift
    out="${OUT:-runs/bench/accelerator_step}"
    mkdir -p "$out"
    run_window "$@" 2>&1 | tee "$out/gpu_window.log"  # pipefail: run_window's exit status
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 64
    ;;
esac
