"""One worker of a shared problem set (run by test_problems_shared.py): `gemm-tune tune
--problems FILE --storage URL` through tune.run_problems, with a fake GPU (tests/_fakes.py's
VariantBenchmark, each timing slowed by --delay seconds) and its own artifacts (its own
cache and library, as on a host of its own). Waits for the file --go, if given, before it
starts; prints the summary rows (JSON) and exits with the CLI's status."""

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("storage")
    ap.add_argument("problems")
    ap.add_argument("artifacts")
    ap.add_argument("--tests", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--go", default=None)
    a = ap.parse_args()
    sys.path.insert(0, a.tests)
    import optuna

    import tuner.gpu
    import tuner.tune as tt
    from _fakes import VariantBenchmark
    from codegen import parse_arch
    from codegen.errors import GemmTuneError
    from tuner.problems import read_problems

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dev = SimpleNamespace(name="Fake H200", cc=90, sm="sm_90", arch=parse_arch("sm_90"),
                          l2_bytes=50 << 20)
    tuner.gpu.device = lambda: dev
    tt._check_fits = lambda *args, **kw: None

    class SlowBenchmark(VariantBenchmark):
        def measure(self, config, cubin):
            time.sleep(a.delay)
            return super().measure(config, cubin)

    def fake_tune(args, task, artifacts, dev, key, devices):
        bench = SlowBenchmark(task.shape, variant=task.variant, batch=task.batch,
                              broadcast_b=task.broadcast_b)
        return tt._tune_with(args, task, artifacts, dev, key, [bench])

    tt._tune = fake_tune
    args = SimpleNamespace(budget=None, json=True, force=False, cache=None, library=None,
                           devices=None, arch=None, trials=4, timeout=120.0, sampler="random",
                           seed=0, jobs=1, storage=a.storage, study=None, lease=a.lease,
                           no_model=True, top=2, kernel_timeout=60.0)
    problems = read_problems(a.problems)
    print("ready", file=sys.stderr, flush=True)
    while a.go and not Path(a.go).exists():
        time.sleep(0.05)
    try:
        sys.exit(tt.run_problems(args, problems, Path(a.artifacts)))
    except GemmTuneError as e:  # what the CLI prints: one line, status 2
        print(f"gemm-tune: error: {e}", file=sys.stderr)
        sys.exit(2)
