"""Where a small linear layer's time goes: the same x @ W.t() (+ bias) through torch and
through each of gemm-tune's entry points, on the GPU.

    python bench/linear_host_path.py [--library DIR] [--out DIR]

For each problem (bf16 Llama-like rows of 1 and 16 tokens, no bias; fp16 GPT-2-like rows
with a bias), per call, two ways, each entry point once a round, turn about, for --rounds
rounds (the median of the rounds: the GPU machine's host drifts by tens of percent between
minutes, so the entry points are compared within the same ones):
  - "flushed": CUDA events around one call after an L2 flush (bench/wgmma_vs_cublas.Timer,
    as bench/model_gemms.py times), the median;
  - "loop": 200 calls back to back between two events, per call (a host-bound call shows
    its host time here).
Entry points: torch F.linear; torch.mm(x, W.t()) and torch.mm(..., out=C) (the library's
route to cuBLAS for torch callers); lib.gemm(x, W.t(), bias=b); torch_ops.linear (eager:
the direct call), torch.ops.gemm_tune.linear (the custom op's dispatch) and a patched
nn.Linear (torch_ops.patch) against the same layer unpatched. The library's decision for
the problem is printed beside them. With --profile, cProfile's view of 2000 calls of
lib.gemm and of the patched nn.Linear on the first problem (the functions with the most
time of their own) goes into the JSON and the output. JSON under --out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import header, interleaved, write  # noqa: E402

PROBLEMS = [("bfloat16", 1, 4096, 4096, False), ("bfloat16", 16, 2048, 4096, False),
            ("bfloat16", 128, 4096, 4096, False), ("float16", 1, 3072, 1024, True),
            ("float16", 16, 1024, 1024, True)]


def loop_us(torch, fn, reps: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def profile(fn, calls: int = 2000, top: int = 18) -> str:
    """cProfile's table of `calls` calls of fn: the `top` functions by time of their own."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--library", type=Path, default=Path("artifacts/library"))
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds, every entry point once a round, turn about (medians)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile lib.gemm and the patched nn.Linear on the first problem")
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from tuner.runtime import torch_ops
    from tuner.runtime.library import load_library
    from wgmma_vs_cublas import Timer

    lib = load_library(args.library)
    key = torch_ops.library_key(lib)
    timer = Timer(torch)
    rows = []
    with torch.inference_mode():
        for dtype, m, n, k, with_bias in PROBLEMS:
            dt = getattr(torch, dtype)
            x = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt)
            b = torch.randn(n, device="cuda", dtype=dt) if with_bias else None
            c = torch.empty(m, n, device="cuda", dtype=dt)
            plain = torch.nn.Linear(k, n, bias=with_bias, device="cuda", dtype=dt)
            patched = torch_ops.patch(torch.nn.Linear(k, n, bias=with_bias, device="cuda",
                                                      dtype=dt), lib)
            fns = {
                "F.linear": lambda: F.linear(x, w, b),
                "torch.mm": lambda: torch.mm(x, w.t()),
                "torch.mm out=": lambda: torch.mm(x, w.t(), out=c),
                "lib.gemm": lambda: lib.gemm(x, w.t(), bias=b),
                "torch_ops.linear": lambda: torch_ops.linear(x, w, b, library=key),
                "custom op": lambda: torch.ops.gemm_tune.linear(x, w, b, "none", key),
                "nn.Linear": lambda: plain(x),
                "nn.Linear patched": lambda: patched(x),
            }
            fns["lib.gemm"]()  # decides (and measures, on first use)
            plan = next(p for p in lib.plans.values() if (p.m, p.n, p.k) == (m, n, k))
            row = dict(dtype=dtype, m=m, n=n, k=k, bias=with_bias,
                       runs=plan.choice.kernel or "cuBLAS", reason=plan.choice.reason)
            flushed = interleaved(timer, fns, args.rounds)
            loops = interleaved(lambda fn: [loop_us(torch, fn)], fns, args.rounds)
            for name in fns:
                row[name] = dict(flushed_us=round(flushed[name][0] * 1e3, 2),
                                 loop_us=round(loops[name][0], 2),
                                 loop_rounds_us=[round(t, 2) for t in loops[name][1]])
            if args.profile and not rows:
                patched(x)
                torch.cuda.synchronize()
                row["profile"] = {name: profile(fns[name]) for name in ("lib.gemm",
                                                                         "nn.Linear patched")}
                torch.cuda.synchronize()
                for name, text in row["profile"].items():
                    print(f"-- cProfile, {name}, 2000 calls:\n{text}")
            rows.append(row)
            print(f"{dtype} {m}x{n}x{k}{' +bias' if with_bias else ''}: {row['runs']}")
            for name in fns:
                print(f"  {name:18} flushed {row[name]['flushed_us']:7.1f} us   loop "
                      f"{row[name]['loop_us']:7.1f} us")
    from tuner.gpu import device

    path = write("linear-host-path", dict(header(device()), torch=torch.__version__, rows=rows),
                 args.out)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
