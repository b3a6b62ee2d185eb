#!/usr/bin/env bash
# One device call measuring what a change to the launch path must not regress:
#   library   bench/library_vs_cublas.py over the committed library (JSON, PNG under $OUT)
#   tunes     fresh 4096^3 tunes, fp32 and fp16, default budget, into a scratch library:
#             their winners and ratios as JSON lines in $OUT/tunes.jsonl
#   tests     the GPU tests named by $TESTS (default: all of them), log in $OUT
#   record    bench/record_and_tune.py: a program recorded, its problems tuned, then served
#   variants  the problems of $PROBLEMS (default bench/problems/layouts_epilogues.jsonl)
#             tuned into a copy of the committed library ($OUT/library), with a summary in
#             $OUT/variant-tunes.json; VAR_TRIALS, VAR_TIMEOUT (per problem), VAR_BUDGET
#   layouts   bench/layouts_epilogues.py over $LAYOUTS_LIBRARY (default: the variants
#             step's library if it ran, else the committed one)
# Usage on the GPU machine: GEMM_TUNE_COMMIT=abc1234 bash bench/launch_path_check.sh library tunes
# (writes under $OUT)
set -uo pipefail
source .device-env/install.sh >/dev/null
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# the GPU machine's copy of the tree has a stale .git: name the commit from here
echo "commit ${GEMM_TUNE_COMMIT:-unknown (set GEMM_TUNE_COMMIT)}"
for step in "$@"; do
  echo "== $step $(date +%T)"
  case $step in
    library)
      timeout ${LIBRARY_TIMEOUT:-330} python3 bench/library_vs_cublas.py --out "$OUT" 2>&1 \
        | tee "$OUT/library-vs-cublas.log" | tail -45 ;;
    tunes)
      for dtype in ${TUNE_DTYPES:-fp32 fp16}; do
        start=$(date +%s.%N)
        timeout ${TUNE_TIMEOUT:-240} python3 -m tuner --shape 4096x4096x4096 --dtype "$dtype" \
          --artifacts /tmp/art --library /tmp/tune-library --force --json \
          > "/tmp/tune-$dtype.json" 2> "/tmp/tune-$dtype.err"
        echo "rc $? wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
        python3 - "$dtype" "$start" <<'PY' | tee -a "$OUT/tunes.jsonl"
import json, sys, time
dtype, start = sys.argv[1], float(sys.argv[2])
try:
    r = json.load(open(f"/tmp/tune-{dtype}.json"))
except Exception as e:  # noqa: BLE001
    print(json.dumps({"dtype": dtype, "error": str(e),
                      "stderr": open(f"/tmp/tune-{dtype}.err").read()[-2000:]}))
    raise SystemExit
r = r[0] if isinstance(r, list) else r
w, s = r["winner"], r["stats"]
print(json.dumps({"dtype": dtype, "wall_s": round(time.time() - start, 1), "kernel": w["name"],
                  "tflops": w["tflops"], "cublas_tflops": w["cublas_tflops"],
                  "ratio": w["ratio"], **{k: s[k] for k in ("compiled", "timed", "pruned",
                                                            "seconds", "rank_rho")}}))
PY
      done ;;
    record)
      timeout ${RECORD_TIMEOUT:-300} python3 bench/record_and_tune.py --out "$OUT" \
        --budget ${RECORD_BUDGET:-150} 2>&1 | tail -25 ;;
    variants)
      rm -rf /tmp/var-library && cp -r artifacts/library /tmp/var-library
      timeout ${VAR_WALL:-600} python3 -m tuner --problems "${PROBLEMS:-bench/problems/layouts_epilogues.jsonl}" \
        --trials ${VAR_TRIALS:-40} --timeout ${VAR_TIMEOUT:-45} --budget ${VAR_BUDGET:-480} \
        --artifacts /tmp/art-var --library /tmp/var-library --json \
        > "$OUT/variant-tunes.json" 2> "$OUT/variant-tunes.err"
      echo "rc $?"; tail -20 "$OUT/variant-tunes.err"
      cp -r /tmp/var-library "$OUT/library"
      export LAYOUTS_LIBRARY=${LAYOUTS_LIBRARY:-/tmp/var-library} ;;
    layouts)
      timeout ${LAYOUTS_TIMEOUT:-420} python3 bench/layouts_epilogues.py --out "$OUT" \
        --library "${LAYOUTS_LIBRARY:-artifacts/library}" 2>&1 | tee "$OUT/layouts-epilogues.log" | tail -40 ;;
    tests)
      # -v: a line per test as it ends, so a log cut by the timeout still names each result
      timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu -v -rfs --durations=15 ${TESTS:-tests/} \
        > "$OUT/gpu-tests.log" 2>&1
      grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu-tests.log" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
ls -la "$OUT"
