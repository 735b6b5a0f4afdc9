#!/usr/bin/env bash
# The GPU check in one call (docs/gpu-check.md): on a machine with CUDA, the gpu-marked tests,
# a real request served end to end with the compute function on the GPU (equal to the CPU's
# answer), Update on GPU against CPU from Bitcoin OTC's sizes to a reddit-like batch, and the
# PSGS placement between them (scripts/gpu_check.py); one JSON, printed and written.
#
#   scripts/gpu-check.sh [OUT.json]     default: $OUT/gpu-check.json where $OUT is set, else
#                                       build/gpu-check.json
#
# Without CUDA: one line, exit 0, nothing run (no torch import where no NVIDIA device node
# exists). GNN_FAAS_GPU_CHECK_DEVICE=cpu runs the whole check with the CPU standing in for the
# GPU (how the tests prove it here); GNN_FAAS_GPU_CHECK_QUICK=1 takes small sizes.
# The core dependencies this Python lacks are installed from GNN_FAAS_GPU_WHEELS (default
# build/gpu-wheels, made by `make gpu-wheels` and carried to the machine) with --no-index;
# gnn_faas itself comes from this checkout through PYTHONPATH. PYTHON picks the interpreter
# (default: .venv/bin/python where it exists, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${GNN_FAAS_GPU_CHECK_DEVICE:-cuda}
WHEELS=${GNN_FAAS_GPU_WHEELS:-build/gpu-wheels}
PY=${PYTHON:-}
if [ -z "$PY" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
DEFAULT_OUT=build/gpu-check.json
[ -n "${OUT:-}" ] && DEFAULT_OUT=$OUT/gpu-check.json
JSON=${1:-$DEFAULT_OUT}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DEVICE" != cpu ]; then
  # the cheap test first: no NVIDIA device node and no nvidia-smi means no CUDA, without
  # paying for torch's import
  if ! compgen -G '/dev/nvidia*' >/dev/null && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-check: no CUDA here (no /dev/nvidia*, no nvidia-smi): nothing run"; exit 0
  fi
  why=$("$PY" -c 'import torch; print("" if torch.cuda.is_available() else "torch.cuda.is_available() is False")' \
    2>/dev/null) || why="torch does not import"
  if [ -n "$why" ]; then echo "gpu-check: no CUDA here ($why): nothing run"; exit 0; fi
fi

mapfile -t missing < <("$PY" scripts/gpu_check.py deps)
if [ ${#missing[@]} -gt 0 ]; then
  if [ ! -d "$WHEELS" ]; then
    echo "gpu-check: this Python lacks ${missing[*]} and $WHEELS does not exist:" \
      "run make gpu-wheels where an index is reachable and carry $WHEELS" >&2
    exit 2
  fi
  echo "gpu-check: installing ${missing[*]} from $WHEELS (--no-index)" >&2
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${missing[@]}"
fi

quick=()
[ "${GNN_FAAS_GPU_CHECK_QUICK:-0}" = 1 ] && quick=(--quick)
exec "$PY" scripts/gpu_check.py run --device "$DEVICE" --out "$JSON" "${quick[@]}"
