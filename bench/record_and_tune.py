"""Record a program's GEMMs, tune them, serve them: the whole loop on a GPU, end to end.

1. A small program (torch: an MLP's layers at a few token counts, fp32 and fp16, one
   layer through ``x @ W.t()``) runs under ``lib.record(FILE)`` on a copy of a library.
2. ``gemm-tune tune --problems FILE`` tunes what was recorded, within a budget.
3. A fresh process loads the library with measuring off (GEMM_TUNE_MEASURE=0: decisions
   come from the library alone, identical in every process) and runs the same calls,
   each checked against float64.

    python bench/record_and_tune.py [--library artifacts/library] [--budget 150] [--out DIR]

Writes record-and-tune-<gpu>-<date>.json (the record file, the tune's summary, what the
fresh process ran) under bench/results (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit  # noqa: E402

#: (tokens, in, out, dtype, transposed weight): an MLP's layers as torch would call them
CALLS = [(16, 1024, 4096, "float32", False), (16, 4096, 1024, "float32", False),
         (128, 1024, 4096, "float32", False), (48, 1000, 3000, "float16", False),
         (16, 1024, 4096, "float32", True)]


def program(lib_dir: str, record: str | None) -> list[dict]:
    """Run CALLS (three times each) through lib.gemm; with `record`, under lib.record."""
    import contextlib

    import torch

    from tuner.runtime import load_library

    lib = load_library(lib_dir)
    torch.manual_seed(0)
    rows = []
    ctx = lib.record(record) if record else contextlib.nullcontext()
    with ctx:
        for m, k, n, dtype, transposed in CALLS:
            dt = getattr(torch, dtype)
            x = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt).t() if transposed else \
                torch.randn(k, n, device="cuda", dtype=dt)
            for _ in range(3):
                c = torch.full((m, n), float("nan"), device="cuda")
                lib.gemm(x, w, c)
            ref = x.double() @ w.double()
            err = ((c.double() - ref).norm() / ref.norm()).item()
            plan = next(p for p in lib.plans.values() if (p.m, p.n, p.k) == (m, n, k)
                        and p.problem.layout.value == ("nt" if transposed else "nn"))
            rows.append(dict(shape=f"{m}x{n}x{k}", dtype=dtype, transposed=transposed,
                             runs=plan.choice.kernel or "cuBLAS", rule=plan.choice.rule,
                             error=err))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default="artifacts/library")
    p.add_argument("--budget", type=float, default=150.0)
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:  # the fresh process of step 3
        print(json.dumps(program(a.child[0], None if a.child[1] == "-" else a.child[1])))
        return 0
    work = Path(tempfile.mkdtemp(prefix="record-"))
    lib_dir = work / "library"
    shutil.copytree(a.library, lib_dir, ignore=shutil.ignore_patterns("dispatch.json*"))
    record = work / "problems.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))

    def child(lib, rec, **extra):
        out = subprocess.run([sys.executable, __file__, "--child", str(lib), rec],
                             capture_output=True, text=True, env=dict(env, **extra))
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    before = child(lib_dir, str(record))
    t0 = time.monotonic()
    tune = subprocess.run([sys.executable, "-m", "tuner", "tune", "--problems", str(record),
                           "--trials", str(a.trials), "--budget", str(a.budget),
                           "--library", str(lib_dir), "--artifacts", str(work / "art"),
                           "--json"], capture_output=True, text=True, env=env)
    tune_s = time.monotonic() - t0
    if tune.returncode:
        raise SystemExit(tune.stderr[-3000:])
    summary = json.loads(tune.stdout)
    after = child(lib_dir, "-", GEMM_TUNE_MEASURE="0")
    import torch

    doc = dict(benchmark="record_and_tune", gpu=torch.cuda.get_device_name(), commit=commit(),
               date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), calls=CALLS,
               record=[json.loads(x) for x in record.read_text().splitlines()],
               before=before, tune=summary, tune_seconds=round(tune_s, 1), after=after)
    a.out.mkdir(parents=True, exist_ok=True)
    gpu = doc["gpu"].split()[-1].lower()
    path = a.out / f"record-and-tune-{gpu}-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(doc, indent=2))
    print(f"recorded {len(doc['record'])} problems; tune {tune_s:.0f} s:")
    for r in summary:
        print(f"  {r['problem']:28s} calls {r['calls']:3d}  "
              + (f"skipped: {r['skipped']}" if "skipped" in r else
                 f"{r['kernel']} {r['ratio']:.2f}x cuBLAS ({r['seconds']} s)"))
    print("a fresh process, measuring off:")
    for b, r in zip(before, after):
        print(f"  {r['shape']:16s} {r['dtype']:8s} {'x @ W.t()' if r['transposed'] else '':9s} "
              f"before {b['runs'][:40]} ({b['rule']}), after {r['runs'][:40]} ({r['rule']}), "
              f"error {r['error']:.1e}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
