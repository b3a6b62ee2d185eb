"""One process of a shared study (run by the distributed tests): the fake benchmark, a
study-wide budget, a short lease. Prints one JSON line of what it did."""

import argparse
import json
import sys

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("storage")
    ap.add_argument("--study", default="shared")
    ap.add_argument("--log", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--tests", required=True)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--lease", default="0.5,4")
    ap.add_argument("--retry", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    sys.path.insert(0, a.tests)
    import optuna

    from _fakes import FakeBenchmark
    from codegen.errors import GemmTuneError
    from tuner.search import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # compiles take a second, as nvcc's would, without its CPU (the tests' timing: others
    # are up before the first result, and survive a killed worker's lease)
    bench = FakeBenchmark(log=a.log, delay=a.delay, nvcc=False, compile_s=1.0)
    try:
        res = search(bench.shape, bench, trials=a.trials, jobs=1, seed=a.seed,
                     sampler="random", model=False, storage=a.storage, study_name=a.study,
                     cache_dir=a.cache, lease=tuple(map(float, a.lease.split(","))),
                     storage_retry=a.retry, timeout=a.timeout)
    except GemmTuneError as e:  # what the CLI prints: one line, status 2
        print(f"gemm-tune: error: {e}", file=sys.stderr)
        sys.exit(2)
    s = res.stats
    best = res.timed()[0].tflops if res.timed() else None
    print(json.dumps(dict(compiled=s.compiled, timed=s.timed, duplicates=s.duplicates,
                          resumed=s.resumed, from_others=s.from_others, lost=s.lost,
                          best=best, seconds=s.seconds)))
