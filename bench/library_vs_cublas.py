"""The committed library end to end against torch.matmul (cuBLAS), as a caller times them.

For each shape (the 13 suite shapes and 19 that no entry was tuned for: tiny, odd and
prime, K-heavy, M-heavy, skinny both ways, leading dimensions that are not multiples of
4), on torch tensors with fresh random values:
  - the first call of lib.gemm (which may measure the shape's candidates once), timed;
  - lib.gemm(A, B, C) and torch.matmul(A, B, out=C) timed as a user times a loop: CUDA
    events around N back-to-back calls (N sized to about 20 ms), turn about, median of
    3 rounds; their ratio (torch's time over ours: above 1 means the library is faster);
  - the host cost of one call (wall clock of 50 calls without a sync, over 50);
  - the kernel chosen and the rule, and the error against float64 (checked before timing).
Then the host cost of each step of a call, measured on a 1x1x1 problem, next to the
alternatives (torch's Python stream object against its raw handle; cuda-bindings'
cuLaunchKernel against ctypes on libcuda).

    python bench/library_vs_cublas.py [--library artifacts/library] [--out DIR]

Writes library-vs-cublas-<gpu>-<date>.json and .png under bench/results (or --out).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit, write  # noqa: E402

SUITE = ["4096x4096x4096", "8192x8192x8192", "2048x2048x2048", "1024x1024x1024",
         "512x512x512", "1000x1000x1000", "4095x4097x1023", "127x129x4097",
         "8192x8192x1024", "128x4096x4096", "16x4096x4096", "4096x4096x256",
         "256x256x16384"]
#: untuned shapes; "+p" pads every leading dimension by p elements (not a multiple of 4)
UNTUNED = ["1x1x1", "2x3x5", "17x33x9", "31x7x61", "63x63x63", "97x89x83", "1009x1013x1019",
           "6144x6144x6144", "4097x1023x2049", "64x64x65536", "512x512x32768",
           "65536x64x64", "32768x256x256", "8x8192x8192", "8192x16x8192", "4096x32x4096",
           "1000x1000x1000+3", "777x555x333+1", "2048x2048x2048+1"]


def parse(spec: str):
    shape, _, pad = spec.partition("+")
    m, n, k = (int(v) for v in shape.split("x"))
    return m, n, k, int(pad or 0)


def operands(torch, m, n, k, pad):
    def mat(r, c):
        return torch.randn(r, c + pad, device="cuda")[:, :c] if pad else \
            torch.randn(r, c, device="cuda")

    return mat(m, k), mat(k, n), mat(m, n)


def loop_ms(torch, fn, budget_ms=20.0):
    """Milliseconds per call of `fn` over N back-to-back calls between two events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end)
    reps = int(min(1000, max(3, budget_ms / max(once, 1e-3))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def host_us(torch, fn, calls=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def per_call_us(fn, calls=20000) -> float:
    """Median over 5 batches of the wall clock per call (host only)."""
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        out.append((time.perf_counter() - t) / (calls // 5) * 1e6)
    return statistics.median(out)


def host_steps(torch, lib) -> dict:
    """The host cost of each step of a 1x1x1 call, and of the alternatives."""
    from tuner.runtime import call, driver
    from tuner.runtime.runners import TmaRunner

    a, b, c = (torch.randn(1, 1, device="cuda") for _ in range(3))
    lib.gemm(a, b, c)
    torch.cuda.synchronize()
    key, plan = next((k, p) for k, p in lib.plans.items() if k[0] == "torch" and k[3] == (1, 1))
    g = plan.gpu
    steps = {}
    steps["lib.gemm(a, b, c), whole call"] = per_call_us(lambda: lib.gemm(a, b, c))
    steps["torch.matmul(a, b, out=c), whole call"] = per_call_us(
        lambda: torch.matmul(a, b, out=c))
    # the call path's own key function (tuner.runtime.call), as lib.gemm(a, b, c) calls it
    steps["read the operands and build the key"] = per_call_us(
        lambda: call._torch_key(a, b, c, None, lib.measure, None))
    steps["memo lookup"] = per_call_us(lambda: lib.plans.get(key))
    steps["stream: torch._C._cuda_getCurrentRawStream"] = per_call_us(
        lambda: torch._C._cuda_getCurrentRawStream(0))
    steps["stream: torch.cuda.current_stream() (not used)"] = per_call_us(
        lambda: torch.cuda.current_stream().cuda_stream)

    def ctx():
        with driver.entered(g):
            pass

    steps["context check (entered)"] = per_call_us(ctx)
    if plan.run is None:  # the 1x1x1 call went to cuBLAS through torch: no launch of ours
        torch.cuda.synchronize()
        return {k: round(v, 3) for k, v in steps.items()}
    steps["plan.run: pack + cuLaunchKernel (cuda-bindings)"] = per_call_us(
        lambda: plan.run(a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0, 0))
    runner = lib.runner(plan.choice.kernel, g.sm) if plan.choice.kernel else None
    if runner is not None and not isinstance(runner, TmaRunner) and not runner.config.has_workspace:
        # the plan's launch, its parameters packed once, through cuda-bindings and through
        # ctypes on libcuda, for comparison
        img = runner.main
        blk = img.params(runner.signature)
        address = blk.pack(1, 1, 1, 1.0, a.data_ptr(), 1, b.data_ptr(), 1, 0.0, c.data_ptr(),
                           1)
        libcuda = ctypes.CDLL("libcuda.so.1")
        fn = img.prepare(g)
        f, grid, block = ctypes.c_void_p(int(fn)), runner.config.grid(1, 1), runner.config.block()
        steps["cuLaunchKernel through cuda-bindings"] = per_call_us(
            lambda: img.launch(fn, grid, block, 0, address))
        steps["cuLaunchKernel through ctypes (not used)"] = per_call_us(
            lambda: libcuda.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                           block[2], img.smem, None,
                                           ctypes.c_void_p(address), None))
    torch.cuda.synchronize()
    return {k: round(v, 3) for k, v in steps.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default=str(HERE.parent / "artifacts" / "library"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--shapes", nargs="*", default=SUITE + UNTUNED)
    args = p.parse_args(argv)
    import torch

    from tuner.runtime import load_library

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means FP32 here, for both
    lib = load_library(args.library)
    tuned = {(e["m"], e["n"], e["k"]) for e in lib.manifest["entries"] if e["dtype"] == "f32"}
    rows = []
    for spec in args.shapes:
        m, n, k, pad = parse(spec)
        a, b, c = operands(torch, m, n, k, pad)
        c.fill_(float("nan"))
        torch.cuda.synchronize()
        t = time.perf_counter()
        lib.gemm(a, b, c)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t) * 1e3
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        del ref
        ours, theirs = [], []
        for _ in range(3):
            ours.append(loop_ms(torch, lambda: lib.gemm(a, b, c)))
            theirs.append(loop_ms(torch, lambda: torch.matmul(a, b, out=c)))
        host = host_us(torch, lambda: lib.gemm(a, b, c))
        host_torch = host_us(torch, lambda: torch.matmul(a, b, out=c))
        choice = next(pl.choice for key, pl in lib.plans.items()
                      if key[0] == "torch" and key[3] == (m, k) and key[4] == (k, n))
        lib_ms, torch_ms = statistics.median(ours), statistics.median(theirs)
        row = dict(shape=spec, m=m, n=n, k=k, ld_pad=pad, tuned=(m, n, k) in tuned and not pad,
                   kernel=choice.kernel or "cuBLAS", rule=choice.rule,
                   lib_ms=lib_ms, torch_ms=torch_ms, ratio=torch_ms / lib_ms,
                   lib_rounds=ours, torch_rounds=theirs,
                   tflops=2 * m * n * k / lib_ms / 1e9, torch_tflops=2 * m * n * k / torch_ms / 1e9,
                   host_us=host, torch_host_us=host_torch, first_call_ms=first_ms, error=err)
        rows.append(row)
        print(f"{spec:>18} {row['kernel'][:46]:>46} {row['rule']:>8} ratio {row['ratio']:.3f} "
              f"host {host:5.1f} us (torch {host_torch:5.1f}) err {err:.1e} "
              f"first {first_ms:8.1f} ms", flush=True)
        del a, b, c
        torch.cuda.empty_cache()
    steps = host_steps(torch, lib)
    ratios = [r["ratio"] for r in rows]
    summary = dict(shapes=len(rows), untuned=sum(not r["tuned"] for r in rows),
                   geomean=math.exp(statistics.fmean(math.log(x) for x in ratios)),
                   min_ratio=min(ratios), worst=min(rows, key=lambda r: r["ratio"])["shape"],
                   below_095=[r["shape"] for r in rows if r["ratio"] < 0.95],
                   max_error=max(r["error"] for r in rows),
                   median_host_us=statistics.median(r["host_us"] for r in rows),
                   median_torch_host_us=statistics.median(r["torch_host_us"] for r in rows))
    import datetime

    from tuner.runtime import driver
    from tuner.runtime.cublas import cublas_version

    g = driver.gpu(0)
    data = dict(gpu=g.name, cc=g.cc, driver=g.driver_version, cublas=cublas_version(),
                torch=torch.__version__, commit=commit(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                library=str(args.library), summary=summary, host_steps_us=steps, rows=rows)
    path = write("library-vs-cublas", data, args.out)
    table = lib.table_path
    if table.is_file():  # the decisions measured on first use, for inspection
        (args.out / "dispatch-table.json").write_text(table.read_text())
    plot(rows, summary, path.with_suffix(".png"), g.name)
    print(f"\ngeomean {summary['geomean']:.3f}, min {summary['min_ratio']:.3f} "
          f"({summary['worst']}), below 0.95: {summary['below_095']}, median host "
          f"{summary['median_host_us']:.1f} us (torch {summary['median_torch_host_us']:.1f})")
    for k, v in steps.items():
        print(f"  {k:58} {v:7.2f} us")
    print(path)
    return 0


def plot(rows, summary, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 5))
    colors = ["tab:green" if r["ratio"] >= 1 else ("tab:orange" if r["ratio"] >= 0.95
                                                     else "tab:red") for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], color=colors)
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(0.95, color="gray", lw=1, ls=":")
    ax.axhline(summary["geomean"], color="tab:blue", lw=1, ls="--",
               label=f"geomean {summary['geomean']:.3f}")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["shape"] + ("" if r["tuned"] else " *") for r in rows], rotation=70,
                       fontsize=7)
    ax.set_ylabel("torch.matmul time / lib.gemm time")
    ax.set_yscale("log")
    ax.set_title(f"gemm-tune library end to end vs torch.matmul (cuBLAS), fp32, {gpu} "
                 "(* = no entry tuned for the shape)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
