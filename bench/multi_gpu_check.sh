#!/usr/bin/env bash
# One device call (2-GPU machine) for fault isolation and multi-GPU tuning: GPU tests,
# the 1-vs-2 GPU search, then compute-sanitizer memcheck on a sample. Writes under $OUT.
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 -m pytest -m gpu -q -rs -s tests/test_gpu_worker.py tests/test_gpu_tune.py \
  tests/test_gpu_wmma.py -k "isolated or tune" > "$OUT/gpu-tests.log" 2>&1
grep -E "fault:|hang:|TFLOP|passed|failed|Error" "$OUT/gpu-tests.log" | tail -20
python3 bench/multi_gpu.py --shape ${SHAPE:-2048x2048x2048} --trials ${TRIALS:-100} --out "$OUT" \
  2>&1 | tail -4
timeout ${SANITIZE_S:-200} python3 bench/sanitize.py --out "$OUT" 2>&1 | tail -25
