"""One search on one GPU and on two (--devices 0,1): the same budget and seed, wall time
and trials per second, and from the saved study: which GPU timed each trial, and that no
candidate was lost or timed twice.

    python bench/multi_gpu.py [--shape 2048x2048x2048] [--trials 120] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, trial_counts, write  # noqa: E402


def run(shape: str, trials: int, devices: str, art: Path) -> dict:
    cmd = [sys.executable, "-m", "tuner", "--shape", shape, "--trials", str(trials), "--force",
           "--seed", "0", "--json", "--artifacts", str(art), "--devices", devices,
           "--timeout", "500"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    r = json.loads(p.stdout)
    import optuna

    study = optuna.load_study(study_name=r["key"], storage=f"sqlite:///{art / 'studies.db'}")
    s = r["stats"]
    return dict(devices=devices, wall_s=round(wall, 1), search_s=s["seconds"], stats=s,
                trials_per_s=round(s["compiled"] / s["seconds"], 2),
                timed_per_s=round(s["timed"] / s["seconds"], 2),
                **trial_counts(study.trials, "gpu"),
                winner=r["winner"]["name"], tflops=r["winner"]["tflops"],
                cublas_tflops=r["winner"]["cublas_tflops"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2048x2048x2048")
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from tuner.gpu import device

    rows = []
    for devices in ("0", "0,1"):
        with tempfile.TemporaryDirectory() as d:
            row = run(args.shape, args.trials, devices, Path(d))
        rows.append(row)
        print(json.dumps(row), flush=True)
    speedup = rows[1]["timed_per_s"] / rows[0]["timed_per_s"]
    print(f"timed candidates per second: 1 GPU {rows[0]['timed_per_s']}, 2 GPUs "
          f"{rows[1]['timed_per_s']} ({speedup:.2f}x)")
    data = dict(header(device()), benchmark="multi_gpu", shape=args.shape, trials=args.trials,
                rows=rows, speedup_timed_per_s=round(speedup, 3))
    print("wrote", write("multi-gpu", data, args.out))


if __name__ == "__main__":
    main()
