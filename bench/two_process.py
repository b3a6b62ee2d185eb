"""Two gemm-tune processes on one study, timing concurrently from the start: per process,
every candidate's timing start and end (wall clock, from the study's `timed_at`), and
how much the two overlapped.

    python bench/two_process.py [--shape 2048x2048x2048] [--trials 120]
        [--devices 0,0] (both on GPU 0; 0,1 for one GPU each) [--storage journal|sqlite]

The processes write their output to files, not pipes: bench/shared_study.py read the
first one's pipes to the end before the second's, so a second process that wrote more
than a pipe holds (64 KiB) to stderr would block until the first had finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2048x2048x2048")
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--devices", default="0,0")
    ap.add_argument("--storage", choices=("journal", "sqlite"), default="journal")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import optuna

    from _common import header, write
    from tuner._study import open_storage
    from tuner.gpu import device

    with tempfile.TemporaryDirectory() as d:
        url = (f"journal:///{d}/study.log" if args.storage == "journal"
               else f"sqlite:///{d}/study.db")
        procs, t0 = [], time.time()
        for i, dev in enumerate(args.devices.split(",")):
            out = open(f"{d}/out{i}.json", "w")
            err = open(f"{d}/err{i}.log", "w")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "tuner", "--shape", args.shape, "--trials",
                 str(args.trials), "--storage", url, "--study", "two", "--devices", dev,
                 "--artifacts", f"{d}/art{i}", "--json", "--seed", str(i), "--force"],
                stdout=out, stderr=err, env=dict(os.environ)), out, err))
        for p, out, err in procs:
            p.wait(timeout=900)
            out.close()
            err.close()
        errs = [Path(f"{d}/err{i}.log").read_text() for i in range(len(procs))]
        for (p, _, _), e in zip(procs, errs):
            if p.returncode:
                raise SystemExit(e[-3000:])
        results = [json.loads(Path(f"{d}/out{i}.json").read_text()) for i in range(len(procs))]
        trials = optuna.load_study(study_name="two", storage=open_storage(url)).trials
    per: dict[str, list] = {}
    for t in trials:
        if "timed_at" in t.user_attrs and "duplicate_of" not in t.user_attrs:
            s, e = t.user_attrs["timed_at"]
            per.setdefault(t.user_attrs["worker"], []).append(
                dict(kernel=t.user_attrs["kernel"], start=round(s - t0, 3), end=round(e - t0, 3),
                     outcome=t.user_attrs.get("outcome")))
    for v in per.values():
        v.sort(key=lambda r: r["start"])
    spans = {w: (v[0]["start"], v[-1]["end"]) for w, v in per.items()}
    (a, sa), (b, sb) = sorted(spans.items(), key=lambda kv: kv[1][0])[:2] if len(spans) > 1 \
        else (list(spans.items()) * 2)[:2]
    overlap = max(0.0, min(sa[1], sb[1]) - max(sa[0], sb[0]))
    names = [r["kernel"] for v in per.values() for r in v]
    row = dict(processes=len(procs), devices=args.devices, storage=args.storage,
               spans_s={w: [round(x, 3) for x in s] for w, s in spans.items()},
               overlap_s=round(overlap, 3),
               overlap_fraction_of_shorter=round(overlap / max(1e-9, min(
                   sa[1] - sa[0], sb[1] - sb[0])), 3),
               second_started_timing_after_s=round(sb[0] - sa[0], 3),
               measured=len(names), measured_twice=len(names) - len(set(names)),
               stderr_bytes=[len(e) for e in errs],
               stats=[r["stats"] for r in results], per_process=per)
    print(json.dumps({k: v for k, v in row.items() if k != "per_process"}, indent=1))
    print("wrote", write("two-process", dict(header(device()), benchmark="two_process",
                                             shape=args.shape, trials=args.trials, **row),
                         args.out))


if __name__ == "__main__":
    main()
