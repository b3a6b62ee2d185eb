"""What a study's storage costs the search: the same search (same sampler, seed and
trials) in memory, in SQLite, in a journal file and in PostgreSQL; search seconds, the
ratio to in-memory, and, for the SQL storages, the statements and the committed write
transactions per compiled candidate.

    python bench/storage_overhead.py --fake [--trials 120] [--delay 0.1]   (CPU: the fake
        benchmark of tests/_fakes.py; nvcc compiles, cached after the warm-up run)
    python bench/storage_overhead.py [--shape 2048x2048x2048] [--trials 120]   (the GPU)

PostgreSQL is measured when --postgres URL (or $GEMM_TUNE_TEST_POSTGRES) is given.
Each of `--repeat` rounds runs every storage once, in turn (a fresh study each time), so
a change in the machine's load falls on all of them alike; a storage's seconds are the
median of its rounds, its ratio the median of its per-round ratios to memory. The load
average before and after is recorded (the CPU machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
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


def _counted(url: str, counts: dict):
    """The storage at `url`, its SQL statements and committed write transactions counted
    into `counts` (RDB storages; others are returned uncounted)."""
    import sqlalchemy

    from tuner.search import open_storage

    storage = open_storage(url)
    engine = getattr(getattr(storage, "_backend", None), "engine", None)
    if engine is None:
        return storage

    def statement(conn, cursor, sql, params, context, many):
        counts["statements"] += 1
        if sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            conn.info["wrote"] = True

    def commit(conn):
        counts["commits"] += bool(conn.info.pop("wrote", False))

    sqlalchemy.event.listen(engine, "before_cursor_execute", statement)
    sqlalchemy.event.listen(engine, "commit", commit)
    sqlalchemy.event.listen(engine, "rollback", lambda conn: conn.info.pop("wrote", None))
    return storage


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake", action="store_true", help="the fake benchmark (no GPU)")
    ap.add_argument("--shape", default="2048x2048x2048")
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--delay", type=float, default=0.0, help="fake timing seconds")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--postgres", default=os.environ.get("GEMM_TUNE_TEST_POSTGRES"))
    ap.add_argument("--tag", default="", help="added to the file name (CPU runs)")
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
    load_before = _load()
    runs: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as d:
        kinds = dict(memory=lambda: None, sqlite=lambda: f"sqlite:///{d}/{uuid.uuid4().hex}.db",
                     journal=lambda: f"journal:///{d}/{uuid.uuid4().hex}.log")
        if args.postgres:
            kinds["postgresql"] = lambda: args.postgres
        # warm-up: fills the compile cache, so every measured run compiles nothing
        search(shape, bench, trials=args.trials, seed=0, jobs=args.jobs, timeout=1e9)
        for _ in range(args.repeat):
            for kind, url in kinds.items():
                counts, where = dict(statements=0, commits=0), url()
                storage = _counted(where, counts) if where else None
                res = search(shape, bench, trials=args.trials, seed=0, jobs=args.jobs,
                             storage=storage, study_name=f"overhead-{uuid.uuid4().hex[:8]}",
                             timeout=1e9)
                runs.setdefault(kind, []).append((res.stats, counts))
                print(json.dumps(dict(storage=kind, seconds=round(res.stats.seconds, 3),
                                      **counts)), flush=True)
    close()
    rows = _rows(runs)
    data = dict(head, benchmark="storage_overhead", shape="x".join(map(str, shape)),
                trials=args.trials, fake=args.fake, delay=args.delay, repeat=args.repeat,
                load_before=load_before, load_after=_load(), rows=rows,
                postgres="unix socket, local server, default fsync" if args.postgres else None)
    name = "storage-overhead-" + ("cpu-fake" if args.fake else "gpu")
    if args.fake:
        import datetime

        data["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        tag = f"-{args.tag}" if args.tag else ""
        path = Path(args.out or RESULTS) / f"{name}{tag}-{data['date'][:10]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    else:
        from _common import write

        path = write(name, data, args.out)
    print(json.dumps(rows, indent=1))
    print("wrote", path)


def _rows(runs: dict[str, list]) -> list[dict]:
    """Per storage: median seconds, the median of its per-round ratios to memory, and the
    statements and write commits per compiled candidate (SQL storages)."""
    base = [s.seconds for s, _ in runs["memory"]]
    rows = []
    for kind, got in runs.items():
        secs = [s.seconds for s, _ in got]
        last, counts = got[-1]
        row = dict(storage=kind, seconds=round(statistics.median(secs), 3),
                   runs=[round(s, 3) for s in secs],
                   ratio_to_memory=round(statistics.median(
                       s / b for s, b in zip(secs, base)), 3),
                   asked=last.asked, compiled=last.compiled, timed=last.timed)
        if counts["statements"]:
            row.update(statements_per_candidate=round(counts["statements"] / last.compiled, 1),
                       commits_per_candidate=round(counts["commits"] / last.compiled, 2))
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
