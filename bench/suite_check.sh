#!/usr/bin/env bash
# Device calls for the FP32 performance work (issue 6). Writes logs and JSON under $OUT.
#   bash bench/suite_check.sh check   GPU tests, kernels side by side with cuBLAS
#                                      ($PAIRS), compute-sanitizer on the sample
#   TUNE="..." bash bench/suite_check.sh suite   tune those shapes on every GPU, time the
#                                      suite, and bring the library back (library.tgz)
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi -L | tee "$OUT/gpus.txt"
case "${1:-check}" in
check)
  # TESTS: the GPU test files (default all); PAIRS: a list of "SHAPE KERNEL" lines to time
  # next to cuBLAS (bench/pairs/)
  python3 -m pytest -m gpu -q -rs --durations=5 ${TESTS:-tests/} > "$OUT/gpu-tests.log" 2>&1
  tail -3 "$OUT/gpu-tests.log"
  PAIRS=${PAIRS:-bench/pairs/splitk-last.txt}
  args=(); while read -r shape kernel; do
    [[ -z "$shape" || "$shape" == \#* ]] || args+=(--pair "$shape" "$kernel"); done < "$PAIRS"
  label=$(basename "$PAIRS" .txt)
  python3 bench/default_vs_cublas.py --label "$label" --out "$OUT" "${args[@]}" 2>&1 \
    | tee "$OUT/$label.log"
  timeout ${SANITIZE_S:-150} python3 bench/sanitize.py --out "$OUT" 2>&1 | tail -12
  ;;
suite)
  # TUNE: the shapes to (re)tune first at TRIALS candidates; SHAPES: the shapes to time
  # (default all 13); the library comes back as library.tgz
  python3 bench/suite.py --tune-shapes ${TUNE} --force --devices ${DEVICES:-0,1} \
    --trials ${TRIALS:-150} ${SHAPES:+--shapes $SHAPES} --out "$OUT" 2>&1 | tee "$OUT/suite.log"
  tar czf "$OUT/library.tgz" artifacts/library
  ;;
esac
