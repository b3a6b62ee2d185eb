"""What the L2 flush does to a timing: torch.matmul (cuBLAS) timed, CUDA events around each
call, after each of four preparations, turn about, on the GPU.

    python3 bench/flush_effect.py [--shapes MxNxK,...] [--dtype bf16] [--layout nt]
                                  [--reps 50] [--rounds 3] [--out DIR]

- memset: a buffer of twice the L2 written before each call (tuner.bench.L2Flush: what the
  tuner does); the L2 is left full of dirty lines, which the call's reads evict (write-backs
  beside its reads);
- memset+read: the same, then another buffer of twice the L2 read (its lines clean);
- read: that read alone;
- rotate: no flush; W taken from as many copies as make at least 3x the L2, a different
  one each call (bench/decode_roof.py's way, and the first use's: a model reads its weights
  from DRAM);
- resident: no flush, the same W every call (a loop over one set of operands, as
  bench/library_vs_cublas.py times: W from the L2 where it fits).

Each call is y = x @ W.t() (W stored N x K, as nn.Linear keeps it; --layout nn: y = x @ W,
W stored K x N), in and out of --dtype (bf16, fp16 or fp32; fp32 without TF32), a batch
of --reps enqueued behind a sleep kernel (no call waits on the host). Reported
per shape: each preparation's median microseconds (median of the rounds' medians) and its
ratio to rotate's. JSON under --out (default bench/results/) named flush-effect-<gpu>-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import commit, write  # noqa: E402
from decode_roof import Timer  # noqa: E402

SHAPES = "128x4096x4096,16x14336x4096,64x4096x14336,1x8192x28672,4096x4096x4096"
METHODS = ("memset", "memset+read", "read", "rotate", "resident")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--layout", choices=("nt", "nn"), default="nt")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 3 or min(s) < 1 for s in shapes) or args.reps < 1 or args.rounds < 1:
            raise ValueError
    except ValueError:
        print("flush_effect: --shapes MxNxK,... with sides >= 1; --reps, --rounds >= 1",
              file=sys.stderr)
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    size = torch.empty((), dtype=dtype).element_size()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    dirty = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    clean = torch.ones(2 * l2, dtype=torch.uint8, device="cuda")
    timer = Timer(torch)  # (bench/decode_roof.py's: a batch enqueued behind a sleep kernel)
    prepare = {"memset": lambda: dirty.zero_(),
               "memset+read": lambda: (dirty.zero_(), clean.sum()),
               "read": lambda: clean.sum(),
               "rotate": lambda: None, "resident": lambda: None}
    doc = dict(benchmark="flush-effect", gpu=torch.cuda.get_device_name(0),
               torch=torch.__version__, commit=commit(), l2_bytes=l2, reps=args.reps,
               dtype=args.dtype, layout=args.layout,
               rounds=args.rounds, method=__doc__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               rows=[])
    for m, n, k in shapes:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        copies = max(2, math.ceil(3 * l2 / (n * k * size)))
        ws = [torch.randn(n, k, device="cuda", dtype=dtype) for _ in range(copies)]
        if args.layout == "nn":  # W stored K x N: the same bytes read as their transpose
            ws = [w.view(k, n).t() for w in ws]
        y = torch.empty(m, n, device="cuda", dtype=dtype)
        times = {name: [] for name in METHODS}
        for _ in range(args.rounds):
            for name in METHODS:
                w_of = (lambda i: ws[i % copies]) if name == "rotate" else (lambda i: ws[0])
                us = timer.batch(lambda i: torch.matmul(x, w_of(i).t(), out=y), args.reps,
                                 before=lambda i: prepare[name]())
                times[name].append(statistics.median(us))
        us = {name: round(statistics.median(v), 2) for name, v in times.items()}
        row = dict(shape=[m, n, k], w_copies=copies, us=us, rounds_us=times,
                   vs_rotate={name: round(us[name] / us["rotate"], 3) for name in METHODS})
        doc["rows"].append(row)
        print(f"{m}x{n}x{k}: " + "  ".join(f"{name} {us[name]:.2f} us ({row['vs_rotate'][name]:.3f})"
                                           for name in METHODS), flush=True)
    print(write("flush-effect", doc, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
