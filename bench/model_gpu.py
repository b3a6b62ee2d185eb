"""GPU half of issue 15 items 1-2, one device call (under 5 minutes on an H200):

  1. `gemm-tune inspect NAME --profile --json` on the committed library's 4096^3 fp32
     entry (ncu on it and on cuBLAS), into a copy of the library;
  2. trials to within 2% of the best known, with and without the model, on the shapes that
     have no exhaustive record (127x129x4097, 16x4096x4096): real searches (TPE, a budget
     of 120 candidates, seeds 0-1, each mode), the best known being the best of all of
     these runs and of the recorded studies (NOT an exhaustive best: 24432 candidates per
     shape would take about 30 minutes each).

    python bench/model_gpu.py --out $OUT [--skip-profile] [--shapes 127x129x4097]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))


def run_profile(out: Path) -> dict:
    lib = out / "library"
    shutil.copytree(ROOT / "artifacts" / "library", lib, dirs_exist_ok=True)
    man = json.loads((lib / "manifest.json").read_text())
    e = next(x for x in man["entries"] if (x["m"], x["n"], x["k"]) == (4096, 4096, 4096)
             and x["dtype"] == "f32")
    cmd = [sys.executable, "-m", "tuner", "inspect", e["kernel"], "--profile", "--json",
           "--library", str(lib)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    print(p.stderr[-2000:], file=sys.stderr)
    res = dict(cmd=" ".join(cmd[1:]), rc=p.returncode, seconds=round(time.monotonic() - t0, 1),
               stderr=p.stderr[-2000:])
    if p.returncode == 0:
        res["profile"] = json.loads(p.stdout)
    subprocess.run([sys.executable, "-m", "tuner", "report", "--shape", "4096x4096x4096",
                    "--library", str(lib), "--out", str(out / "report")], cwd=ROOT)
    return res


def run_searches(shape, seeds, budget) -> dict:
    import optuna

    from tuner.bench import GpuBenchmark
    from tuner.search import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    bench = GpuBenchmark(shape, seed=0, target_ms=10)
    runs = []
    for model in (True, False):
        for seed in seeds:
            trace = []

            def on_event(rec, s, trace=trace):
                if rec is not None and rec.tflops:
                    trace.append((s.compiled, s.timed, round(rec.tflops, 3)))
            with tempfile.TemporaryDirectory() as tmp:
                res = search(shape, bench, trials=budget, seed=seed, artifacts=Path(tmp),
                             model=model, on_event=on_event, timeout=100)
            runs.append(dict(model=model, seed=seed, trace=trace, rank_rho=res.stats.rank_rho,
                             compiled=res.stats.compiled, pruned=res.stats.pruned,
                             best=res.stats.best_tflops, seconds=round(res.stats.seconds, 1)))
            print(f"{shape} model={model} seed={seed}: best {res.stats.best_tflops:.2f}, "
                  f"rho {res.stats.rank_rho}, {res.stats.seconds:.0f} s", flush=True)
    from _recorded import from_studies_db
    recorded = max((p.tflops for s in from_studies_db() if s.shape == tuple(shape)
                    for p in s.points), default=0.0)
    best = max([recorded] + [r["best"] or 0 for r in runs])
    for r in runs:
        hit = next((c for c, _, t in r["trace"] if t >= best / 1.02), None)
        r["compiled_to_2pct_of_best_known"] = hit
    return dict(shape="x".join(map(str, shape)), best_known=best, recorded_best=recorded,
                runs=runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=["127x129x4097", "16x4096x4096"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budget", type=int, default=120)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from tuner._shape import parse_shape

    data = dict(benchmark="model_gpu", date=time.strftime("%Y-%m-%d"))
    if not args.skip_profile:
        data["profile"] = run_profile(args.out)
        (args.out / "model-gpu.json").write_text(json.dumps(data, indent=1))
    data["searches"] = [run_searches(parse_shape(s), range(args.seeds), args.budget)
                        for s in args.shapes]
    (args.out / "model-gpu.json").write_text(json.dumps(data, indent=1))
    for s in data["searches"]:
        for r in s["runs"]:
            print(s["shape"], "model" if r["model"] else "no model", r["seed"],
                  r["compiled_to_2pct_of_best_known"], "of best known", s["best_known"])


if __name__ == "__main__":
    main()
