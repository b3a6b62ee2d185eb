#!/usr/bin/env bash
# Device calls for the FP32 performance work (issue 6). Writes logs and JSON under $OUT.
#   bash bench/issue6_check.sh check   GPU tests, the split-K variants side by side with
#                                      cuBLAS, compute-sanitizer on the sample
#   TUNE="..." bash bench/issue6_check.sh suite   tune those shapes on every GPU, time the
#                                      suite, and bring the library back (library.tgz)
set -uo pipefail
source .device-env/install.sh >/dev/null
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache GEMM_TUNE_REQUIRE_GPU=1
nvidia-smi -L | tee "$OUT/gpus.txt"
case "${1:-check}" in
check)
  python3 -m pytest -m gpu -q -rs --durations=5 tests/ > "$OUT/gpu-tests.log" 2>&1
  tail -3 "$OUT/gpu-tests.log"
  # each pass variant next to its cluster twin (same tile), then small cluster tiles
  P=(127x129x4097 gemm_simt_f32_64x128x8_r8x8_w2x16_p0_v4_s4_g8_k32
     127x129x4097 gemm_simt_f32_64x128x8_r8x8_w2x16_p0_v4_s4_g8_k8
     127x129x4097 gemm_simt_f32_64x128x8_r8x8_w2x16_p0_v4_s4_g8_k8c
     127x129x4097 gemm_simt_f32_32x32x16_r2x4_w16x2_p0_v4_s3_g1_k8
     127x129x4097 gemm_simt_f32_32x32x16_r2x4_w16x2_p0_v4_s3_g1_k8c
     127x129x4097 gemm_simt_f32_32x64x16_r4x4_w8x4_p0_v4_s3_g1_k8c
     127x129x4097 gemm_simt_f32_16x32x16_r2x4_w8x4_p0_v4_s3_g1_k8c
     16x4096x4096 gemm_simt_f32_16x64x16_r8x4_w2x16_p0_v4_s3_g8_k16
     16x4096x4096 gemm_simt_f32_16x64x16_r8x4_w2x16_p0_v4_s3_g8_k8
     16x4096x4096 gemm_simt_f32_16x64x16_r8x4_w2x16_p0_v4_s3_g8_k8c
     128x4096x4096 gemm_simt_f32_128x256x16_r8x8_w16x2_p4_v4_s3_g1_k8
     128x4096x4096 gemm_simt_f32_128x256x16_r8x8_w16x2_p4_v4_s3_g1_k8c
     256x256x16384 gemm_simt_f32_128x128x16_r8x4_w16x2_p4_v4_s2_g1_k32
     256x256x16384 gemm_simt_f32_128x128x16_r8x4_w16x2_p4_v4_s2_g1_k8
     256x256x16384 gemm_simt_f32_128x128x16_r8x4_w16x2_p4_v4_s2_g1_k8c
     256x256x16384 gemm_simt_f32_64x64x16_r4x4_w8x4_p0_v4_s3_g1_k8c)
  args=(); for ((i = 0; i < ${#P[@]}; i += 2)); do args+=(--pair "${P[i]}" "${P[i+1]}"); done
  python3 bench/default_vs_cublas.py --label splitk-cluster --out "$OUT" "${args[@]}" 2>&1 \
    | tee "$OUT/splitk-cluster.log"
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
