#!/usr/bin/env bash
# GPU-machine work in one call, as steps named on the command line, run in that order;
# logs, JSON and plots under $OUT. Each step has a time limit of its own (STEP_TIMEOUT
# variables below) so that one call's steps fit the device's per-call limit.
#
#   tests     the GPU tests (pytest -m gpu) of $TESTS (default: all; $TESTS_K: pytest's -k
#             expression), a line per test as it
#             ends (a log cut by TEST_TIMEOUT still names each result); PYTEST_REPORT=-rfsP
#             keeps what passing tests printed (the fuzz's seed and what ran)
#   torch     the CPU tests that need torch ($TORCH_TESTS, default tests/test_torch_ops.py
#             tests/test_model_gemms.py)
#   library   bench/library_vs_cublas.py over $LIBRARY (default artifacts/library)
#   msweep    bench/library_vs_cublas.py --m-sweep over $LIBRARY
#   tunes     fresh tunes of $TUNE_DTYPES (default fp32 fp16) at $TUNE_SHAPES (default
#             4096x4096x4096), each at the default budget
#             into a scratch library: winner, ratio and time as JSON lines in tunes.jsonl,
#             their studies as tunes-studies.db (bench/model_rank.py --studies-db) and as
#             tune-studies.json (to commit as bench/results/tune-studies-*.json)
#   variants  the problems of $PROBLEMS (default bench/problems/layouts_epilogues.jsonl)
#             tuned into a copy of $VAR_BASE (default the committed library), at
#             /tmp/var-library (it comes back as $OUT/library unless VAR_RETURN=0, and
#             serves the steps after it); VAR_TRIALS, VAR_TIMEOUT (per problem), VAR_BUDGET
#   layouts   bench/layouts_epilogues.py over $LIBRARY ($LAYOUTS_ARGS, e.g. --parts linear)
#   record    bench/record_and_tune.py: a program recorded, its problems tuned, then served
#   pairs     the kernels of $PAIRS (bench/pairs/ files, space-separated), each timed
#             beside cuBLAS, a JSON per file
#   suite     bench/suite.py: the shapes of $TUNE (if any) tuned at $TRIALS, then the 13-shape
#             suite timed from the library
#   wgmma     bench/wgmma_vs_cublas.py (against cuBLAS and Triton)
#   probe     bench/wgmma_probe.py $PROBE_ARGS (e.g. --fp32)
#   decode    bench/decode_roof.py $DECODE_ARGS (the decode family at the DRAM roof)
#   cublas    bench/cublas_kernels.py $CUBLAS_ARGS (the kernels torch.matmul and the library's
#             cuBLAS call run at each M, side by side)
#   tf32x3    bench/tf32x3_accuracy.py $TF32X3_ARGS (3xTF32's split modes beside SGEMM)
#   storage   bench/storage_overhead.py (the search in memory, SQLite, a journal file, and
#             PostgreSQL where .pg-carry, from bench/postgres_carry.sh, was carried)
#   host      bench/host_overlap.py (numpy in and out: pipelined against sequential)
#   timeline  bench/host_timeline.py $TIMELINE_ARGS (the host pipeline's spans, a Gantt chart)
#   grids     bench/search_quality.py --exhaustive over one family each ($GRIDS: words
#             dtype:family[:shape[:variant]], default "fp16:wgmma 3xtf32:wgmma"; the shape
#             defaults to $GRID_SHAPE or 4096^3, the variant to the plain problem, e.g.
#             "bf16:decode:1x4096x4096:nt|bf16|none|none"): the records
#             bench/simulate_search.py and bench/model_rank.py replay
#   model     bench/model_gpu.py (inspect --profile, trials to within 2% with and without)
#   linear    bench/linear_host_path.py (a small linear's time through torch and each entry point)
#   models    bench/model_gemms.py $MODELS_ARGS (decoder layers recorded, tuned, patched; the
#             tuned library comes back as its manifest, model-gemms-manifest.json: a library
#             folder holding only a manifest is rebuilt from it by `gemm-tune upgrade --force`,
#             which compiles every kernel from its name, here or, with REBUILD_LIBRARY, there)
#   forwards  bench/forward_profile.py $FORWARDS_ARGS (a patched layer's forward against the
#             unpatched one, kernel by kernel)
#   ab        bench/template_ab.py --templates $AB_TEMPLATES templates (a template change
#             measured: each kernel of $AB_PAIRS from each template directory, turn about;
#             $AB_ARGS, e.g. --sustained 2: back to back at the power cap)
#   kprofile  bench/kernel_profile.py $KPROFILE_ARGS (kernels beside cuBLAS and torch under
#             sustained load, SM clock and power sampled; --ncu: Nsight Compute's sections)
#   flush     bench/flush_effect.py $FLUSH_ARGS (torch.matmul timed after each L2 preparation:
#             the tuner's memset, a clean read, W rotated beyond L2)
#   overlap   bench/launch_overlap.py $OVERLAP_ARGS (small GEMMs back to back, with and without
#             programmatic dependent launch)
#   sanitize  bench/sanitize.py (compute-sanitizer on a sample; $SANITIZE_ARGS)
#   multigpu  bench/multi_gpu.py (one search on one GPU and on all of them)
# REBUILD_LIBRARY=DIR (a carried library folder, its manifest alone will do) is recompiled
# first, so a library tuned in one call travels to the next as its manifest (a few hundred
# KB, where its cubins and tune artifacts ran to 47 MB: over what a call sends or returns).
# Usage on the GPU machine: GEMM_TUNE_COMMIT=abc1234 bash bench/device_steps.sh tests library
set -uo pipefail
source .device-env/install.sh >/dev/null
export PYTHONUNBUFFERED=1 GEMM_TUNE_CACHE_DIR=/tmp/gemm-tune-cache OUT=${OUT:-out}
mkdir -p "$OUT"
LIBRARY=${LIBRARY:-artifacts/library}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# the GPU machine's copy of the tree has a stale .git: name the commit from here
echo "commit ${GEMM_TUNE_COMMIT:-unknown (set GEMM_TUNE_COMMIT)}"
if [ -n "${REBUILD_LIBRARY:-}" ]; then
  python3 -m tuner upgrade --library "$REBUILD_LIBRARY" --force 2>&1 | tail -1
fi
T0=$SECONDS
for step in "$@"; do
  echo "== $step at $((SECONDS - T0)) s ($(date +%T))"
  case $step in
    tests)
      timeout ${TEST_TIMEOUT:-540} python3 -m pytest -m gpu -v ${PYTEST_REPORT:--rfs} --durations=15 \
        ${TESTS:-tests/} ${TESTS_K:+-k "$TESTS_K"} > "$OUT/gpu-tests.log" 2>&1
      grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu-tests.log" | tail -30 ;;
    torch)
      timeout ${TORCH_TIMEOUT:-120} python3 -m pytest -q \
        ${TORCH_TESTS:-tests/test_torch_ops.py tests/test_model_gemms.py} \
        > "$OUT/torch-tests.log" 2>&1; tail -3 "$OUT/torch-tests.log" ;;
    library)
      timeout ${LIBRARY_TIMEOUT:-330} python3 bench/library_vs_cublas.py --library "$LIBRARY" \
        --out "$OUT" 2>&1 | tee "$OUT/library-vs-cublas.log" | tail -45 ;;
    msweep)
      timeout ${MSWEEP_TIMEOUT:-300} python3 bench/library_vs_cublas.py --m-sweep \
        --library "$LIBRARY" --out "$OUT" 2>&1 | tail -30 ;;
    tunes)
      for shape in ${TUNE_SHAPES:-4096x4096x4096}; do
      for dtype in ${TUNE_DTYPES:-fp32 fp16}; do
        start=$(date +%s.%N)
        timeout ${TUNE_TIMEOUT:-240} python3 -m tuner --shape "$shape" --dtype "$dtype" \
          --artifacts /tmp/art --library /tmp/tune-library --force --json \
          > "/tmp/tune-$dtype.json" 2> "/tmp/tune-$dtype.err"
        echo "rc $? wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
        python3 - "$dtype" "$start" "$shape" <<'PY' | tee -a "$OUT/tunes.jsonl"
import json, sys, time
dtype, start, shape = sys.argv[1], float(sys.argv[2]), sys.argv[3]
try:
    r = json.load(open(f"/tmp/tune-{dtype}.json"))
except Exception as e:  # noqa: BLE001
    print(json.dumps({"dtype": dtype, "shape": shape, "error": str(e),
                      "stderr": open(f"/tmp/tune-{dtype}.err").read()[-2000:]}))
    raise SystemExit
r = r[0] if isinstance(r, list) else r
w, s = r["winner"], r["stats"]
print(json.dumps({"dtype": dtype, "shape": shape, "wall_s": round(time.time() - start, 1),
                  "kernel": w["name"],
                  "tflops": w["tflops"], "cublas_tflops": w["cublas_tflops"],
                  "ratio": w["ratio"], **{k: s.get(k) for k in ("compiled", "timed", "pruned",
                                                                "seconds", "rank_rho",
                                                                "steps_s")}}))
PY
      done
      done
      # the tunes' studies (every candidate's time and figures), for bench/model_rank.py
      # --studies-db, and saved as JSON to commit under bench/results (tune-studies-*.json,
      # which the model's tests and bench/model_rank.py read)
      if [ -f /tmp/art/studies.db ]; then
        cp /tmp/art/studies.db "$OUT/tunes-studies.db"
        python3 bench/model_rank.py --dtype f16 --dtype bf16 --dtype f32 --dtype tf32 \
          --dtype f32x3 --studies-db \
          /tmp/art/studies.db --save-studies "$OUT/tune-studies.json" \
          --commit "${GEMM_TUNE_COMMIT:-unknown}" --out "$OUT" 2>&1 | grep -v near-best | tail -12
      fi ;;
    variants)
      rm -rf /tmp/var-library && cp -r "${VAR_BASE:-artifacts/library}" /tmp/var-library
      timeout ${VAR_WALL:-600} python3 -m tuner \
        --problems "${PROBLEMS:-bench/problems/layouts_epilogues.jsonl}" \
        --trials ${VAR_TRIALS:-40} --timeout ${VAR_TIMEOUT:-45} --budget ${VAR_BUDGET:-480} \
        --artifacts /tmp/art-var --library /tmp/var-library --json \
        > "$OUT/variant-tunes.json" 2> "$OUT/variant-tunes.err"
      echo "rc $?"; tail -20 "$OUT/variant-tunes.err"
      [ "${VAR_RETURN:-1}" = 1 ] && cp -r /tmp/var-library "$OUT/library"
      LIBRARY=/tmp/var-library ;;
    layouts)
      timeout ${LAYOUTS_TIMEOUT:-420} python3 bench/layouts_epilogues.py --out "$OUT" \
        --library "$LIBRARY" ${LAYOUTS_ARGS:-} 2>&1 | tee "$OUT/layouts-epilogues.log" | tail -40 ;;
    record)
      timeout ${RECORD_TIMEOUT:-300} python3 bench/record_and_tune.py --out "$OUT" \
        --budget ${RECORD_BUDGET:-150} 2>&1 | tail -25 ;;
    pairs)
      for pairs in $PAIRS; do
        args=(); while read -r shape kernel; do
          [[ -z "$shape" || "$shape" == \#* ]] || args+=(--pair "$shape" "$kernel"); done < "$pairs"
        timeout ${PAIRS_TIMEOUT:-300} python3 bench/default_vs_cublas.py \
          --label "$(basename "$pairs" .txt)" --out "$OUT" "${args[@]}" 2>&1 | tail -30
      done ;;
    suite)
      timeout ${SUITE_TIMEOUT:-580} python3 bench/suite.py ${TUNE:+--tune-shapes $TUNE --force} \
        --devices ${DEVICES:-0} --trials ${TRIALS:-150} ${SHAPES:+--shapes $SHAPES} \
        --out "$OUT" 2>&1 | tee "$OUT/suite.log" | tail -30
      tar czf "$OUT/library.tgz" artifacts/library ;;
    wgmma)
      timeout ${WGMMA_TIMEOUT:-400} python3 bench/wgmma_vs_cublas.py --out "$OUT" ${WGMMA_ARGS:-} \
        2>&1 | grep -v Warning | tail -40 ;;
    probe)
      timeout ${PROBE_TIMEOUT:-240} python3 bench/wgmma_probe.py ${PROBE_ARGS:-} 2>&1 | tail -40 ;;
    decode)
      timeout ${DECODE_TIMEOUT:-240} python3 bench/decode_roof.py --out "$OUT" ${DECODE_ARGS:-} \
        2>&1 | tail -30 ;;
    cublas)
      timeout ${CUBLAS_TIMEOUT:-120} python3 bench/cublas_kernels.py --out "$OUT" ${CUBLAS_ARGS:-} \
        2>&1 | tail -60 ;;
    tf32x3)
      timeout ${TF32X3_TIMEOUT:-300} python3 bench/tf32x3_accuracy.py ${TF32X3_ARGS:-} \
        2>&1 | tail -40 ;;
    storage)
      # PostgreSQL too where the package of bench/postgres_carry.sh was carried (.pg-carry)
      pg=(); if [ -d .pg-carry ] && source bench/local_postgres.sh; then
        pg=(--postgres "$GEMM_TUNE_PG_URL"); fi
      timeout ${STORAGE_TIMEOUT:-300} python3 bench/storage_overhead.py --out "$OUT" \
        --repeat ${STORAGE_REPEAT:-2} "${pg[@]}" 2>&1 | tail -15 ;;
    timeline)
      timeout ${TIMELINE_TIMEOUT:-180} python3 bench/host_timeline.py --out "$OUT" \
        ${TIMELINE_ARGS:-} 2>&1 | tail -20 ;;
    host)
      timeout ${HOST_TIMEOUT:-240} python3 bench/host_overlap.py --out "$OUT" \
        ${HOST_SHAPES:+--shapes $HOST_SHAPES} ;;
    grids)
      for grid in ${GRIDS:-fp16:wgmma 3xtf32:wgmma}; do
        IFS=: read -r dtype family shape variant <<< "$grid"
        timeout ${GRID_TIMEOUT:-400} python3 bench/search_quality.py --exhaustive --skip-default \
          --shape ${shape:-${GRID_SHAPE:-4096x4096x4096}} --dtype "$dtype" --family "$family" \
          ${variant:+--variant "$variant"} --timeout ${GRID_SEARCH_TIMEOUT:-380} --out "$OUT" \
          2>&1 | grep -v Warning | tail -4
      done ;;
    model)
      timeout ${MODEL_TIMEOUT:-420} python3 bench/model_gpu.py --out "$OUT/model" ${MODEL_ARGS:-} \
        2>&1 | tail -30
      tar czf "$OUT/model.tar.gz" -C "$OUT" model && rm -rf "$OUT/model" ;;
    linear)
      timeout ${LINEAR_TIMEOUT:-120} python3 bench/linear_host_path.py --out "$OUT" ${LINEAR_ARGS:-} 2>&1 | tail -${LINEAR_TAIL:-45} ;;
    models)
      timeout ${MODELS_TIMEOUT:-580} python3 bench/model_gemms.py --out "$OUT" ${MODELS_ARGS:-} \
        2>&1 | tee "$OUT/model-gemms.log" | tail -40
      # the tuned library as its manifest (REBUILD_LIBRARY above, or gemm-tune upgrade here)
      lib=artifacts/model-gemms/library
      [[ "${MODELS_ARGS:-}" =~ --library\ ([^ ]+) ]] && lib=${BASH_REMATCH[1]}
      [ -f "$lib/manifest.json" ] && cp "$lib/manifest.json" "$OUT/model-gemms-manifest.json" ;;
    forwards)
      timeout ${FORWARDS_TIMEOUT:-200} python3 bench/forward_profile.py --out "$OUT" \
        ${FORWARDS_ARGS:-} 2>&1 | grep -v Warning | tail -60 ;;
    ab)
      timeout ${AB_TIMEOUT:-300} python3 bench/template_ab.py --out "$OUT" \
        --templates ${AB_TEMPLATES:?AB_TEMPLATES: older template directories} templates \
        ${AB_PAIRS:+--pairs $AB_PAIRS} ${AB_ARGS:-} 2>&1 | grep -v Warning | tail -30 ;;
    kprofile)
      timeout ${KPROFILE_TIMEOUT:-400} python3 bench/kernel_profile.py --out "$OUT" \
        ${KPROFILE_ARGS:?KPROFILE_ARGS: --pair SHAPE KERNEL ...} 2>&1 | grep -v Warning | tail -40 ;;
    flush)
      timeout ${FLUSH_TIMEOUT:-200} python3 bench/flush_effect.py --out "$OUT" ${FLUSH_ARGS:-} \
        2>&1 | tail -12 ;;
    overlap)
      timeout ${OVERLAP_TIMEOUT:-200} python3 bench/launch_overlap.py --out "$OUT" ${OVERLAP_ARGS:-} \
        2>&1 | tee "$OUT/launch-overlap.log" | tail -12 ;;
    sanitize)
      timeout ${SANITIZE_TIMEOUT:-200} python3 bench/sanitize.py --out "$OUT" ${SANITIZE_ARGS:-} \
        2>&1 | tail -25 ;;
    multigpu)
      nvidia-smi -L | tee "$OUT/gpus.txt"
      timeout ${MULTIGPU_TIMEOUT:-400} python3 bench/multi_gpu.py --shape ${SHAPE:-2048x2048x2048} \
        --trials ${TRIALS:-100} --out "$OUT" 2>&1 | tail -10 ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "== done at $((SECONDS - T0)) s"
ls -la "$OUT"
# The small results last, where the call's output tail keeps them even when a call's files
# are more than come back (a call returns at most eight: a ninth is left out)
[ -f "$OUT/tunes.jsonl" ] && { echo "== tunes.jsonl"; cat "$OUT/tunes.jsonl"; }
n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
[ "$n" -gt 8 ] && echo "note: $n files under \$OUT; a call brings back eight"
exit 0
