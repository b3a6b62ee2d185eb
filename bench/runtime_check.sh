#!/usr/bin/env bash
# One device call for the run-time library: a smoke test of the driver path, the GPU tests
# of the runtime (streams, graphs, threads, torch.compile, cupy) and of the library, then
# bench/library_vs_cublas.py over the committed library.
# Usage on the GPU machine: bash bench/runtime_check.sh   (writes under $OUT)
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 - <<'PY' 2>&1 | tee /tmp/smoke.log
import torch
from tuner.runtime import load_library
lib = load_library("artifacts/library")
a, b = torch.randn(300, 200, device="cuda"), torch.randn(200, 100, device="cuda")
c = lib.gemm(a, b)
print("smoke", ((c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item())
print(lib.explain(300, 100, 200, "fp32"))
PY
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs ${TESTS:-tests/test_gpu_runtime.py tests/test_gpu_library.py} \
  > "$OUT/gpu-tests-runtime.log" 2>&1
tail -25 "$OUT/gpu-tests-runtime.log"
[ -n "${NO_BENCH:-}" ] || timeout ${BENCH_TIMEOUT:-300} python3 bench/library_vs_cublas.py --out "$OUT" 2>&1 | tee /tmp/library-vs-cublas.log | tail -45
