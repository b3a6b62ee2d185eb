#!/usr/bin/env bash
# One device call for a session's changes: the run-time library (GPU tests and the
# library-vs-cuBLAS benchmark), the GPU tests of the kernels and precision gate, two
# processes sharing one study, and the storage overhead of a tune. Writes under $OUT.
set -uo pipefail
source .device-env/install.sh >/dev/null
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache OUT=${OUT:-out}
mkdir -p "$OUT"
bash bench/runtime_check.sh
timeout 200 python3 -m pytest -q -m gpu -x tests/test_gpu_kernels.py tests/test_precision.py \
  > "$OUT/gpu-tests-kernels.log" 2>&1; tail -3 "$OUT/gpu-tests-kernels.log"
timeout 150 python3 bench/two_process.py --shape 2048x2048x2048 --trials 120 --devices 0,0 \
  --out "$OUT" 2>&1 | tail -8
timeout 150 python3 bench/storage_overhead.py --shape 2048x2048x2048 --trials 120 --repeat 1 \
  --out "$OUT" 2>&1 | tail -8
ls "$OUT"
