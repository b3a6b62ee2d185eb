#!/usr/bin/env bash
# One device call for the wgmma family in the tuner (issue 13): its GPU tests (runner,
# odd shapes, occupancy, a short search), a 40-trial fp16 tune at 4096^3, the benchmark
# against cuBLAS and Triton, and compute-sanitizer memcheck + racecheck on a sample.
# Usage on the GPU machine: bash bench/wgmma_check.sh   (writes under $OUT; ~7 minutes)
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
T0=$SECONDS
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -m gpu -q -rs -s tests/test_gpu_wgmma.py \
  > "$OUT/gpu-tests-wgmma.log" 2>&1
grep -E "TFLOP|passed|failed|Error|error" "$OUT/gpu-tests-wgmma.log" | tail -30
echo "[tests done at $((SECONDS - T0)) s]"
timeout ${TUNE_TIMEOUT:-100} python3 -m tuner --shape 4096x4096x4096 --dtype fp16 \
  --trials ${TRIALS:-40} --timeout $(( ${TUNE_TIMEOUT:-100} - 20 )) --artifacts "$OUT/art" \
  --library "$OUT/library" --json > "$OUT/tune-fp16.json" 2> "$OUT/tune-fp16.err"
python3 - "$OUT/tune-fp16.json" <<'PY'
import collections, json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("tune: no JSON", e); sys.exit(0)
w = r.get("winner") or {}
print("tune fp16 4096^3:", w.get("name"), w.get("tflops"), "vs cuBLAS", w.get("cublas_tflops"),
      "ratio", w.get("ratio"), "err", w.get("error"), r.get("stats"))
PY
echo "[tune done at $((SECONDS - T0)) s]"
timeout ${BENCH_TIMEOUT:-170} python3 bench/wgmma_vs_cublas.py --out "$OUT" \
  --triton-budget ${TRITON_BUDGET:-90} 2>&1 | tee "$OUT/wgmma-vs-cublas.log" | grep -v Warning | tail -20
echo "[bench done at $((SECONDS - T0)) s]"
for tool in memcheck racecheck; do
  timeout ${SAN_TIMEOUT:-45} python3 bench/sanitize.py --configs wgmma --tool $tool --out "$OUT" \
    2>&1 | tail -9
done
echo "[all done at $((SECONDS - T0)) s]"
