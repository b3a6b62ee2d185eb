#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks named in $@ (python scripts with args).
# Usage on the GPU machine:  bash bench/gpu_check.sh [test-args...]
# Writes logs and JSON under $OUT (or ./out).
set -uo pipefail
source .device-env/install.sh
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.used \
  --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m pytest -m gpu -q -rs -s --durations=8 tests/ "$@" 2>&1 | tee "$OUT/gpu-tests.log"
