#!/usr/bin/env bash
# One device call for the Hopper tensor-core families: the wgmma GPU tests (runner, odd
# shapes, occupancy, a short search), the benchmark against cuBLAS and Triton, the
# sanitizer on a wgmma sample, the fp32-data probe (tf32 and 3xTF32) and the 3xTF32
# accuracy study. Writes under $OUT; about 9 minutes at most.
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
T0=$SECONDS
timeout ${TEST_TIMEOUT:-100} python3 -m pytest -m gpu -q -rs tests/test_gpu_wgmma.py \
  > "$OUT/gpu-tests-wgmma.log" 2>&1
tail -4 "$OUT/gpu-tests-wgmma.log"; echo "[tests at $((SECONDS - T0)) s]"
timeout ${BENCH_TIMEOUT:-170} python3 bench/wgmma_vs_cublas.py --out "$OUT" \
  --triton-budget ${TRITON_BUDGET:-80} > /tmp/wgmma-vs-cublas.log 2>&1
grep -v Warning /tmp/wgmma-vs-cublas.log | tail -16; echo "[bench at $((SECONDS - T0)) s]"
timeout ${SAN_TIMEOUT:-85} python3 bench/sanitize.py --configs wgmma --tools memcheck,racecheck \
  --out "$OUT" 2>&1 | tail -3; echo "[sanitizer at $((SECONDS - T0)) s]"
timeout ${PROBE_TIMEOUT:-130} python3 bench/wgmma_probe.py --fp32 > /tmp/probe-fp32.log 2>&1
tail -16 /tmp/probe-fp32.log; cp /tmp/probe-fp32.log "$OUT/wgmma-probe-fp32.log"
echo "[probe at $((SECONDS - T0)) s]"
timeout ${ACC_TIMEOUT:-70} python3 bench/tf32x3_accuracy.py > /tmp/acc.log 2>&1
tail -14 /tmp/acc.log; echo "[all done at $((SECONDS - T0)) s]"
ls "$OUT"
