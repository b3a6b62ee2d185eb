"""Several gemm-tune processes, one per GPU, joining one Optuna study through a journal
file (as processes on several hosts would through a shared file system or PostgreSQL):
who timed what, that nothing was timed twice or left unfinished, and each one's winner.

    python bench/shared_study.py [--shape 2048x2048x2048] [--trials 60] [--devices 0,1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, trial_counts, write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2048x2048x2048")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--devices", default="0,1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import optuna

    from tuner.gpu import device
    from tuner.search import open_storage

    with tempfile.TemporaryDirectory() as d:
        url = f"journal:///{d}/study.log"
        # outputs to files: reading one process's pipes to the end before the next's
        # blocked a process that wrote more than a pipe holds until the first had finished
        files = [(open(f"{d}/out{i}", "w+"), open(f"{d}/err{i}", "w+"))
                 for i in args.devices.split(",")]
        procs = [subprocess.Popen(
            [sys.executable, "-m", "tuner", "--shape", args.shape, "--trials", str(args.trials),
             "--storage", url, "--study", "shared", "--devices", i, "--artifacts",
             f"{d}/art{i}", "--json", "--seed", i], stdout=o, stderr=e)
            for i, (o, e) in zip(args.devices.split(","), files)]
        outs = []
        for p, (o, e) in zip(procs, files):
            p.wait()
            o.seek(0)
            e.seek(0)
            outs.append((o.read(), e.read()))
        for p, (_, err) in zip(procs, outs):
            if p.returncode:
                raise SystemExit(err[-2000:])
        results = [json.loads(o) for o, _ in outs]
        study = optuna.load_study(study_name="shared", storage=open_storage(url))
        trials = study.trials  # read before the journal file goes
    best = max(t.value for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    row = dict(processes=len(procs), trials=len(trials), **trial_counts(trials, "worker"),
               claimed_elsewhere=sum(t.user_attrs.get("reason") ==
                                     "claimed by another worker of this study" for t in trials),
               study_best_tflops=best,
               winners=[dict(winner=r["winner"]["name"], tflops=r["winner"]["tflops"],
                             cublas_tflops=r["winner"]["cublas_tflops"], stats=r["stats"])
                        for r in results])
    print(json.dumps(row, indent=1))
    print("wrote", write("shared-study", dict(header(device()), benchmark="shared_study",
                                              shape=args.shape, **row), args.out))


if __name__ == "__main__":
    main()
