"""What a study's storage costs the search: the same search (same sampler, seed and
trials) in memory, in SQLite, in a journal file and in PostgreSQL; search seconds and
the ratio to in-memory.

    python bench/storage_overhead.py --fake [--trials 60] [--delay 0.0]   (CPU: the fake
        benchmark of tests/_fakes.py; nvcc compiles, cached after the warm-up run)
    python bench/storage_overhead.py [--shape 2048x2048x2048] [--trials 120]   (the GPU)

PostgreSQL is measured when --postgres URL (or $GEMM_TUNE_TEST_POSTGRES) is given.
Each storage runs `--repeat` times (fresh study each time); the median counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def main() -> None:
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--fake", action="store_true", help="the fake benchmark (no GPU)")
    ap.add_argument("--shape", default="2048x2048x2048")
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--delay", type=float, default=0.0, help="fake timing seconds")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--postgres", default=os.environ.get("GEMM_TUNE_TEST_POSTGRES"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import optuna

    from _common import RESULTS, commit
    from tuner._shape import parse_shape
    from tuner.search import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shape = parse_shape(args.shape) if not args.fake else (512, 512, 512)
    if args.fake:
        from _fakes import FakeBenchmark

        bench, close = FakeBenchmark(shape=shape, delay=args.delay), lambda: None
        head = dict(gpu="none (fake benchmark)", host=platform.node(), commit=commit())
    else:
        from _common import header
        from tuner.gpu import device
        from tuner.worker import GpuWorker

        bench = GpuWorker(shape)
        close = bench.close
        head = header(device())
    rows = []
    with tempfile.TemporaryDirectory() as d:
        kinds = dict(memory=lambda: None, sqlite=lambda: f"sqlite:///{d}/{uuid.uuid4().hex}.db",
                     journal=lambda: f"journal:///{d}/{uuid.uuid4().hex}.log")
        if args.postgres:
            kinds["postgresql"] = lambda: args.postgres
        # warm-up: fills the compile cache, so every measured run compiles nothing
        search(shape, bench, trials=args.trials, seed=0, jobs=args.jobs, timeout=1e9)
        for kind, url in kinds.items():
            secs, stats = [], None
            for _ in range(args.repeat):
                res = search(shape, bench, trials=args.trials, seed=0, jobs=args.jobs,
                             storage=url(), study_name=f"overhead-{uuid.uuid4().hex[:8]}",
                             timeout=1e9)
                secs.append(res.stats.seconds)
                stats = res.stats
            rows.append(dict(storage=kind, seconds=round(statistics.median(secs), 3),
                             runs=[round(s, 3) for s in secs], asked=stats.asked,
                             compiled=stats.compiled, timed=stats.timed))
            print(json.dumps(rows[-1]), flush=True)
    close()
    base = rows[0]["seconds"]
    for r in rows:
        r["ratio_to_memory"] = round(r["seconds"] / base, 3)
    data = dict(head, benchmark="storage_overhead", shape="x".join(map(str, shape)),
                trials=args.trials, fake=args.fake, delay=args.delay, rows=rows,
                postgres="unix socket, local server, default fsync" if args.postgres else None)
    name = "storage-overhead-" + ("cpu-fake" if args.fake else "gpu")
    if args.fake:
        import datetime

        data["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        path = Path(args.out or RESULTS) / f"{name}-{data['date'][:10]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    else:
        from _common import write

        path = write(name, data, args.out)
    print(json.dumps(rows, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
