"""One of several processes joining one study (run by test_search's sharing test)."""

import sys

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[4])
    import optuna

    from _fakes import FakeBenchmark
    from tuner.search import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, log, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    bench = FakeBenchmark(log=log, delay=0.05, nvcc=False)
    trials = int(sys.argv[5]) if len(sys.argv) > 5 else 12
    res = search(bench.shape, bench, trials=trials, jobs=1, seed=4, sampler="random", model=False,
                 storage=storage, study_name="shared", cache_dir=cache)
    best = res.timed()[0]
    print(res.stats.compiled, res.stats.timed, res.stats.duplicates, best.tflops,
          res.stats.resumed, len(bench.measured))
