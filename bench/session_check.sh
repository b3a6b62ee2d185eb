#!/usr/bin/env bash
# One device call for a session's GPU work, in steps named on the command line:
#   tests   the GPU tests named by $TESTS (default: the export bundle's check program with
#           wgmma entries, and `inspect --profile` under ncu)
#   host    bench/host_overlap.py (numpy in and out, pipelined against sequential)
#   tune    fp16 and bf16 tunes of $TUNE_SHAPES into artifacts/library (and its studies.db),
#           brought back as $OUT/library.tar.gz
#   model   bench/model_gpu.py: inspect --profile on the library's 4096^3 entry, and trials
#           to within 2% of the best with and without the model
#   probe   bench/wgmma_probe.py (correctness and speed of a few wgmma configs)
#   wgmma   bench/wgmma_vs_cublas.py (the tensor-core benchmark against cuBLAS and Triton)
#   pairs   the kernels of $PAIRS (a bench/pairs/ file) each timed next to cuBLAS
#           (bench/default_vs_cublas.py)
#   decode  bench/decode_roof.py (the decode family against torch at the DRAM roof)
#   tf32x3  bench/tf32x3_accuracy.py (3xTF32's two split modes beside SGEMM: error, speed)
#   storage bench/storage_overhead.py (the search in memory, SQLite and a journal file)
#   msweep  bench/library_vs_cublas.py --m-sweep (every M of the buckets up to 64 and more)
# Usage on the GPU machine: bash bench/session_check.sh tests host   (writes under $OUT)
set -uo pipefail
source .device-env/install.sh >/dev/null
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
for step in "$@"; do
  echo "== $step $(date +%T)"
  case $step in
    tests)
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -rs -s ${TESTS:-tests/test_gpu_profile.py \
        tests/test_wgmma_tune.py::test_export_bundle_check_passes_on_the_gpu} \
        > "$OUT/gpu-tests.log" 2>&1
      tail -40 "$OUT/gpu-tests.log" ;;
    host)
      timeout ${HOST_TIMEOUT:-240} python3 bench/host_overlap.py --out "$OUT" ${HOST_SHAPES:+--shapes $HOST_SHAPES} ;;
    tune)
      for dtype in ${TUNE_DTYPES:-fp16 bf16}; do
        for shape in ${TUNE_SHAPES:-4096x4096x4096}; do
          timeout ${TUNE_TIMEOUT:-200} python3 -m tuner --shape "$shape" --dtype "$dtype" \
            --trials ${TUNE_TRIALS:-60} --timeout ${TUNE_SECONDS:-150} --artifacts /tmp/art \
            --library artifacts/library --storage sqlite:///artifacts/studies.db --force \
            2>&1 | tail -15
        done
      done
      tar czf "$OUT/library.tar.gz" artifacts/library artifacts/studies.db ;;
    model)
      timeout ${MODEL_TIMEOUT:-420} python3 bench/model_gpu.py --out "$OUT/model" ${MODEL_ARGS:-} 2>&1 | tail -30
      tar czf "$OUT/model.tar.gz" -C "$OUT" model && rm -rf "$OUT/model" ;;
    probe)
      timeout ${PROBE_TIMEOUT:-240} python3 bench/wgmma_probe.py ${PROBE_ARGS:-} 2>&1 | tail -40 ;;
    wgmma)
      timeout ${WGMMA_TIMEOUT:-400} python3 bench/wgmma_vs_cublas.py --out "$OUT" ${WGMMA_ARGS:-} 2>&1 | tail -40 ;;
    pairs)
      args=(); while read -r shape kernel; do
        [[ -z "$shape" || "$shape" == \#* ]] || args+=(--pair "$shape" "$kernel"); done < "$PAIRS"
      timeout ${PAIRS_TIMEOUT:-300} python3 bench/default_vs_cublas.py --label "$(basename "$PAIRS" .txt)" \
        --out "$OUT" "${args[@]}" 2>&1 | tail -30 ;;
    decode)
      timeout ${DECODE_TIMEOUT:-240} python3 bench/decode_roof.py --out "$OUT" ${DECODE_ARGS:-} 2>&1 | tail -30 ;;
    tf32x3)
      timeout ${TF32X3_TIMEOUT:-300} python3 bench/tf32x3_accuracy.py ${TF32X3_ARGS:-} 2>&1 | tail -40 ;;
    storage)
      timeout ${STORAGE_TIMEOUT:-300} python3 bench/storage_overhead.py --out "$OUT" \
        --repeat ${STORAGE_REPEAT:-2} 2>&1 | tail -15 ;;
    msweep)
      timeout ${MSWEEP_TIMEOUT:-300} python3 bench/library_vs_cublas.py --m-sweep --out "$OUT" 2>&1 | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
ls -la "$OUT"
