#!/usr/bin/env bash
# One device call for the tensor-core work: GPU tests of the fp16/bf16/tf32 paths (and the
# fp32 regression), then the tuner at 4096^3 for fp16 and tf32 against cuBLAS.
# Usage on the GPU machine: bash bench/wmma_check.sh   (writes under $OUT)
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
python3 -m pytest -m gpu -q -rs -s tests/test_gpu_wmma.py tests/test_gpu_kernels.py \
  tests/test_gpu_library.py > "$OUT/gpu-tests.log" 2>&1
grep -E "TFLOP|passed|failed|Error" "$OUT/gpu-tests.log" | tail -30
for d in fp16 tf32; do
  python3 -m tuner --shape 4096x4096x4096 --dtype $d --trials ${TRIALS:-60} \
    --timeout ${TUNE_TIMEOUT:-150} --artifacts "$OUT/art" --json > "$OUT/tune-$d.json" \
    2> "$OUT/tune-$d.err"
  python3 - "$OUT/tune-$d.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); w = r["winner"]
print(r["dtype"], r["shape"], w["name"], w["tflops"], "vs cuBLAS", w["cublas_tflops"],
      "ratio", w["ratio"], "err", w["error"], "exact", w["error_exact"], r["stats"])
PY
done
