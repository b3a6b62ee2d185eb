"""The library end to end against torch.matmul (cuBLAS), as a caller times them.

Sweep (the default): SWEEP's shapes, each from a family of its own (GEMV both ways,
skinny both ways, padded rows, misaligned pointers, odd and prime sizes, K-heavy, tall,
wide, tiny, medium, large, x @ W.t(), x @ W over a batch of sequences; fp32 and fp16), on
torch tensors with fresh random values. For each:
  - the first call of lib.gemm, wall clock (it measures the call's case once: its
    M-bucket, leading-dimension and alignment classes, route), then torch's first call;
  - C (poisoned with NaN first) against a float64 product;
  - lib.gemm(A, B, C) and torch.matmul(A, B, out=C), C of the inputs' type for both,
    timed as a user times a loop: CUDA events around N back-to-back calls (N sized to
    about 20 ms), interleaved (ours, torch, ours, ...), median of 3 rounds each; their ratio
    (torch's time over ours: above 1 means the library is faster);
  - the host cost of one call (wall clock of 50 calls without a sync, over 50);
  - what ran, the rule, and explain() of exactly that call.
Then the host cost of each step of a call, measured on a 1x1x1 problem, next to the
alternatives (torch's Python stream object against its raw handle; cuda-bindings'
cuLaunchKernel against ctypes on libcuda).

M-sweep (--m-sweep): M = 1..64 and larger (M_SWEEP), N = K = 4096, fp16 by default
(--n, --k, --dtype), one B for every M (a layer's weight) and a fresh A each: per M the
ratio to torch (C of the inputs' type, or --out fp32 against torch.mm(..., out_dtype=
torch.float32)), the error, what ran; and the first pass: the wall clock of every M's
first call summed (ours: one measurement per M-bucket) against torch's first calls. Each M
is timed in M_SWEEP_ROUNDS (5) rounds, turn about, its ratio the medians' (the rounds
kept), beside both sides' host cost a call: at N = K = 4096 a call's GPU time (10-22 us,
B in L2) is within a few microseconds of the host's cost of a call (torch's and ours),
and a 3-round median moved single Ms by 5-10% from run to run (0.88x-0.93x at Ms whose
neighbours read 1.05x, with cuBLAS running the same kernels on both sides:
bench/cublas_kernels.py).

Both start from a copy of the library without its dispatch table (so first calls
measure, as in a fresh deployment) unless --keep-table.

    python bench/library_vs_cublas.py [--library artifacts/library] [--out DIR]
    python bench/library_vs_cublas.py --m-sweep [--dtype fp16] [--m-buckets exact]

Writes library-vs-cublas[-m-sweep]-<gpu>-<date>.json and .png under bench/results (or
--out).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit, cpp_path, write  # noqa: E402

#: (spec, family): "MxNxK", "+p" every row padded by p elements, "@e" A starting e elements
#: past its allocation, "/nt" B a transposed view (x @ W.t()), ":f16" / ":bf16" the type,
#: "b*MxNxK" A (and C) a batch of b matrices of M rows each, B one matrix (x @ W as a model's
#: activations of b sequences meet a weight: torch.matmul folds x's rows into one product)
SWEEP = [
    ("4096x1x4096", "gemv n=1"), ("8192x1x8192:f16", "gemv n=1 f16"),
    ("1x4096x4096", "gemv m=1"), ("1x8192x8192:f16", "gemv m=1 f16"),
    ("1000x1x1000", "gemv n=1 small"), ("1x1000x1000", "gemv m=1 small"),
    ("4096x2x4096", "skinny n=2"), ("4096x8x4096:f16", "skinny n=8 f16"),
    ("8192x16x8192", "skinny n=16"), ("4096x32x4096", "skinny n=32"),
    ("8x8192x8192", "skinny m=8"), ("16x4096x4096", "skinny m=16"),
    ("32x4096x4096:f16", "skinny m=32 f16"), ("48x3000x1000:f16", "skinny m=48 f16"),
    ("777x555x333+1", "padded rows, odd"), ("1000x1000x1000+3", "padded rows, square"),
    ("2048x2048x2048+1", "padded rows, large"), ("512x512x512+4", "padded, aligned rows"),
    ("1024x1024x1024+8:f16", "padded rows f16"), ("333x517x129+1:f16", "padded odd f16"),
    ("500x300x200@1", "misaligned A"), ("1024x1024x1024@1", "misaligned A square"),
    ("2048x2048x2048@2:f16", "misaligned A f16"), ("777x555x333@3", "misaligned A odd"),
    ("127x129x4097", "odd, K-heavy"), ("97x89x83", "primes small"),
    ("1009x1013x1019", "primes medium"), ("4095x4097x1023", "odd large"),
    ("2039x2029x2017", "primes large"), ("4093x4091x4099:f16", "primes large f16"),
    ("31x7x61", "primes tiny"), ("255x257x259:f16", "odd f16"),
    ("64x64x65536", "K-heavy tiny"), ("256x256x16384", "K-heavy small"),
    ("512x512x32768", "K-heavy medium"), ("128x128x131072:f16", "K-heavy f16"),
    ("1024x1024x65536:f16", "K-heavy large f16"),
    ("65536x64x64", "tall"), ("32768x256x256", "tall wide-ish"),
    ("131072x128x128:f16", "tall f16"), ("64x65536x64", "wide"),
    ("256x32768x256:f16", "wide f16"),
    ("1x1x1", "tiny 1"), ("2x3x5", "tiny primes"), ("8x8x8", "tiny cube"),
    ("17x33x9", "tiny odd"), ("32x32x32:f16", "tiny f16"), ("63x63x63", "tiny 63"),
    ("512x512x512", "medium 512"), ("1000x1000x1000", "medium 1000"),
    ("1024x1024x1024", "medium 1024"), ("3000x3000x3000:f16", "medium f16"),
    ("2048x2048x2048", "large 2048"), ("4096x4096x4096", "large 4096"),
    ("6144x6144x6144", "large 6144"), ("8192x8192x8192", "large 8192"),
    ("8192x8192x1024", "large flat"), ("4096x4096x256", "large K-light"),
    ("4096x4096x4096:f16", "large f16"), ("8192x8192x8192:bf16", "large bf16"),
    ("4096x4096x4096/nt:f16", "x @ W.t() f16"), ("8192x1024x4096/nt", "x @ W.t() mlp"),
    ("16x4096x4096/nt:f16", "x @ W.t() decode f16"), ("128x11008x4096/nt:bf16",
                                                      "x @ W.t() bf16"),
    ("8*100x4096x4096/nt:f16", "x @ W.t() over a batch f16"),
    ("64*1x4096x4096/nt:bf16", "x @ W.t() a batch of rows bf16"),
    ("6*77x1024x1024", "x @ W over a batch fp32"),
]
#: the Ms of the M-sweep: every M up to 64, then some larger (bucket ends and between)
M_SWEEP = list(range(1, 65)) + [65, 96, 100, 128, 129, 200, 256, 257, 384, 512, 777, 1000,
                                1024, 2048, 4096]
#: rounds of each M's loops, turn about (module doc)
M_SWEEP_ROUNDS = 5
#: the error each C type is held to against float64 (fp32: the FP32 gate; 2-byte C: its
#: rounding and the tensor cores' accumulation, growing with K)
GATE = {"float32": 1e-5, "float16": 2.0**-11 + 2e-5, "bfloat16": 2.0**-8 + 2e-5}


def parse(spec: str) -> dict:
    """A sweep spec in parts (SWEEP's comment)."""
    spec, _, dtype = spec.partition(":")
    spec, _, layout = spec.partition("/")
    spec, _, off = spec.partition("@")
    shape, _, pad = spec.partition("+")
    batch, _, shape = shape.rpartition("*")
    m, n, k = (int(v) for v in shape.split("x"))
    name = {"": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    return dict(m=m, n=n, k=k, pad=int(pad or 0), offset=int(off or 0), nt=layout == "nt",
                dtype=name, batch=int(batch or 1))


def operands(torch, case: dict):
    """A, B and C (poisoned with NaN) of a case, fresh random values; A and C 3-D where
    the case is a batch of matrices (B shared)."""
    m, n, k, pad, typ = case["m"], case["n"], case["k"], case["pad"], getattr(torch,
                                                                              case["dtype"])

    def mat(r, c, skip=0, batch=1):
        flat = torch.randn(skip + batch * r * (c + pad), device="cuda", dtype=typ)
        x = flat[skip:].view(batch * r, c + pad)[:, :c]
        return x if batch == 1 else x.view(batch, r, c)

    a = mat(m, k, case["offset"], case["batch"])
    b = mat(n, k).t() if case["nt"] else mat(k, n)
    c = mat(m, n, batch=case["batch"])
    c.fill_(float("nan"))
    return a, b, c


def error(a, b, c) -> float:
    ref = a.double() @ b.double()
    return ((c.double() - ref).norm() / ref.norm()).item()


def gate(dtype: str, k: int) -> float:
    return GATE[dtype] * (1 if dtype == "float32" else max(1.0, k / 4096))


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


def interleaved(torch, ours, theirs, rounds=3):
    """(our ms per call, torch's, our rounds, torch's rounds): loops turn about."""
    mine, yours = [], []
    for _ in range(rounds):
        mine.append(loop_ms(torch, ours))
        yours.append(loop_ms(torch, theirs))
    return statistics.median(mine), statistics.median(yours), mine, yours


def first_ms(torch, fn) -> float:
    """Wall-clock milliseconds of one call, to its end on the GPU."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


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


def ran(lib, a, b, c):
    """The Choice lib.gemm(a, b, c) ran."""
    from tuner.runtime import call

    a, c = call._rows(a, b, c) or (a, c)  # x @ W over a batch: x's rows, as the call folds them
    return lib.plans[call._torch_key(a, b, c, None, lib.measure, None)[0]].choice


def run_case(torch, lib, spec: str, family: str) -> dict:
    case = parse(spec)
    m, n, k = case["batch"] * case["m"], case["n"], case["k"]
    a, b, c = operands(torch, case)
    first = first_ms(torch, lambda: lib.gemm(a, b, c))
    err = error(a, b, c)
    torch_first = first_ms(torch, lambda: torch.matmul(a, b, out=c))
    lib_ms, torch_ms, ours, theirs = interleaved(
        torch, lambda: lib.gemm(a, b, c), lambda: torch.matmul(a, b, out=c))
    choice = ran(lib, a, b, c)
    return dict(shape=spec, family=family, **case, kernel=choice.kernel or "cuBLAS",
                rule=choice.rule, explain=lib.explain(a, b, c).splitlines()[0],
                lib_ms=lib_ms, torch_ms=torch_ms, ratio=torch_ms / lib_ms,
                lib_rounds=ours, torch_rounds=theirs,
                tflops=2 * m * n * k / lib_ms / 1e9, torch_tflops=2 * m * n * k / torch_ms / 1e9,
                host_us=host_us(torch, lambda: lib.gemm(a, b, c)),
                torch_host_us=host_us(torch, lambda: torch.matmul(a, b, out=c)),
                first_call_ms=first, torch_first_call_ms=torch_first, error=err,
                ok=err <= gate(case["dtype"], k))


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
        address = blk.pack(1, 1, 1, 1.0, a.data_ptr(), 1, 0, b.data_ptr(), 1, 0, 0.0,
                           c.data_ptr(), 1, 0, 0)
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


def fresh_library(path: Path, keep_table: bool) -> Path:
    """The library itself (keep_table), or a copy without its dispatch table."""
    if keep_table:
        return path
    copy = Path(tempfile.mkdtemp(prefix="gemm-tune-bench-")) / "library"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("dispatch.json*"))
    return copy


def geomean(xs) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def sweep(torch, lib, specs) -> tuple[list, dict]:
    rows = []
    for spec, family in specs:
        row = run_case(torch, lib, spec, family)
        rows.append(row)
        print(f"{spec:>24} {row['kernel'][:44]:>44} {row['rule']:>8} ratio {row['ratio']:.3f} "
              f"host {row['host_us']:5.1f} us (torch {row['torch_host_us']:5.1f}) "
              f"err {row['error']:.1e}{'' if row['ok'] else ' OVER GATE'} "
              f"first {row['first_call_ms']:7.1f} ms (torch {row['torch_first_call_ms']:6.1f})",
              flush=True)
        torch.cuda.empty_cache()
    ratios = [r["ratio"] for r in rows]
    summary = dict(shapes=len(rows), families=len({r["family"] for r in rows}),
                   geomean=geomean(ratios), min_ratio=min(ratios),
                   worst=min(rows, key=lambda r: r["ratio"])["shape"],
                   below_095=[r["shape"] for r in rows if r["ratio"] < 0.95],
                   over_gate=[r["shape"] for r in rows if not r["ok"]],
                   max_error=max(r["error"] for r in rows),
                   first_calls_ms=sum(r["first_call_ms"] for r in rows),
                   torch_first_calls_ms=sum(r["torch_first_call_ms"] for r in rows),
                   median_host_us=statistics.median(r["host_us"] for r in rows),
                   median_torch_host_us=statistics.median(r["torch_host_us"] for r in rows))
    return rows, summary


def m_sweep(torch, lib, ms, n: int, k: int, dtype: str, out: str) -> tuple[list, dict]:
    """Every M of `ms` against torch, one B for all (module doc)."""
    from tuner.runtime import measure

    measured = []
    real = measure.time_candidates
    measure.time_candidates = lambda *a, **kw: measured.append(1) or real(*a, **kw)
    typ, otyp = getattr(torch, dtype), getattr(torch, out)
    b = torch.randn(k, n, device="cuda", dtype=typ)

    def theirs(a, c):
        if otyp is typ:
            return lambda: torch.matmul(a, b, out=c)
        return lambda: torch.mm(a, b, otyp, out=c)

    rows = []
    try:
        for m in ms:
            a = torch.randn(m, k, device="cuda", dtype=typ)
            c = torch.full((m, n), float("nan"), device="cuda", dtype=otyp)
            before = len(measured)
            first = first_ms(torch, lambda: lib.gemm(a, b, c))
            err = error(a, b, c)
            torch_first = first_ms(torch, theirs(a, c))
            lib_ms, torch_ms, mine, yours = interleaved(
                torch, lambda: lib.gemm(a, b, c), theirs(a, c), rounds=M_SWEEP_ROUNDS)
            choice = ran(lib, a, b, c)
            rows.append(dict(m=m, bucket=list(lib.m_buckets.of(m)), measured=len(measured) > before,
                             kernel=choice.kernel or "cuBLAS", rule=choice.rule,
                             lib_ms=lib_ms, torch_ms=torch_ms, ratio=torch_ms / lib_ms,
                             lib_rounds_ms=mine, torch_rounds_ms=yours,
                             host_us=host_us(torch, lambda: lib.gemm(a, b, c)),
                             torch_host_us=host_us(torch, theirs(a, c)),
                             first_call_ms=first, torch_first_call_ms=torch_first, error=err,
                             ok=err <= gate(out, k)))
            r = rows[-1]
            print(f"M={m:5d} bucket {r['bucket'][0]}-{r['bucket'][1]} {r['kernel'][:44]:>44} "
                  f"{r['rule']:>8} ratio {r['ratio']:.3f} first {first:7.1f} ms (torch "
                  f"{torch_first:6.1f}){' measured' if r['measured'] else ''}", flush=True)
    finally:
        measure.time_candidates = real
    ratios = [r["ratio"] for r in rows]
    summary = dict(n=n, k=k, dtype=dtype, out=out, m_buckets=str(lib.m_buckets),
                   ms=len(rows), buckets=len({tuple(r["bucket"]) for r in rows}),
                   measurements=sum(r["measured"] for r in rows), timer_calls=len(measured), geomean=geomean(ratios), min_ratio=min(ratios),
                   below_095=[r["m"] for r in rows if r["ratio"] < 0.95],
                   over_gate=[r["m"] for r in rows if not r["ok"]],
                   first_pass_ms=sum(r["first_call_ms"] for r in rows),
                   torch_first_pass_ms=sum(r["torch_first_call_ms"] for r in rows))
    return rows, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default=str(HERE.parent / "artifacts" / "library"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--shapes", nargs="*", help="sweep these specs instead of SWEEP's")
    p.add_argument("--keep-table", action="store_true",
                   help="use the library's own dispatch table (default: start without one)")
    p.add_argument("--m-buckets", help="the library's M-buckets (default: its default)")
    p.add_argument("--m-sweep", action="store_true", help="the M-sweep (module doc)")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--m-out", default="same", choices=["same", "fp32"],
                   help="the M-sweep's C: the inputs' type, or fp32 (torch.mm out_dtype)")
    args = p.parse_args(argv)
    try:
        specs = [(s, "custom") for s in args.shapes] if args.shapes else SWEEP
        for s, _ in specs:
            parse(s)
    except (ValueError, KeyError) as e:
        print(f"library_vs_cublas: a bad shape spec ({e}); e.g. 777x555x333+1, 500x300x200@1, "
              "16x4096x4096/nt:f16", file=sys.stderr)
        return 2
    import torch

    from tuner.runtime import load_library

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means FP32 here, for both
    lib = load_library(fresh_library(Path(args.library), args.keep_table),
                       m_buckets=args.m_buckets)
    from tuner.runtime import driver
    from tuner.runtime.cublas import cublas_version

    g = driver.gpu(0)
    import datetime

    head = dict(gpu=g.name, cc=g.cc, driver=g.driver_version, cublas=cublas_version(),
                torch=torch.__version__, commit=commit(), call_path=cpp_path(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                library=str(args.library), table=str(lib.table_path))
    if args.m_sweep:
        names = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
        dtype = names[args.dtype]
        out = dtype if args.m_out == "same" else "float32"
        if out != dtype and not _mm_takes_out_dtype(torch):
            print(f"library_vs_cublas: torch {torch.__version__} has no torch.mm(..., "
                  "out_dtype=): use --m-out same", file=sys.stderr)
            return 2
        rows, summary = m_sweep(torch, lib, M_SWEEP, args.n, args.k, dtype, out)
        path = write("library-vs-cublas-m-sweep", dict(head, summary=summary, rows=rows),
                     args.out)
        plot_m(rows, summary, path.with_suffix(".png"), g.name)
        print(f"\n{summary['ms']} Ms in {summary['buckets']} buckets, {summary['measurements']} "
              f"measured; geomean {summary['geomean']:.3f}, min {summary['min_ratio']:.3f}, "
              f"below 0.95 at M {summary['below_095']}; first pass {summary['first_pass_ms']:.0f}"
              f" ms (torch {summary['torch_first_pass_ms']:.0f})")
        print(path)
        return 0
    rows, summary = sweep(torch, lib, specs)
    steps = host_steps(torch, lib)
    path = write("library-vs-cublas", dict(head, summary=summary, host_steps_us=steps,
                                           rows=rows), args.out)
    if lib.table_path.is_file():  # the decisions measured on first use, for inspection
        (args.out / "dispatch-table.json").write_text(lib.table_path.read_text())
    plot(rows, summary, path.with_suffix(".png"), g.name)
    print(f"\n{summary['shapes']} shapes of {summary['families']} families: geomean "
          f"{summary['geomean']:.3f}, min {summary['min_ratio']:.3f} ({summary['worst']}), "
          f"below 0.95: {summary['below_095']}, over the gate: {summary['over_gate']}, median "
          f"host {summary['median_host_us']:.1f} us (torch {summary['median_torch_host_us']:.1f})")
    for k, v in steps.items():
        print(f"  {k:58} {v:7.2f} us")
    print(path)
    return 0


def _mm_takes_out_dtype(torch) -> bool:
    x = torch.ones(2, 2, device="cuda", dtype=torch.float16)
    try:
        return torch.mm(x, x, torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False


def _bars(ax, labels, ratios, geo):
    colors = ["tab:green" if r >= 1 else ("tab:orange" if r >= 0.95 else "tab:red")
              for r in ratios]
    ax.bar(range(len(ratios)), ratios, color=colors)
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(0.95, color="gray", lw=1, ls=":")
    ax.axhline(geo, color="tab:blue", lw=1, ls="--", label=f"geomean {geo:.3f}")
    ax.set_xticks(range(len(ratios)))
    ax.set_xticklabels(labels, rotation=70, fontsize=6)
    ax.set_yscale("log")
    ax.legend()


def plot(rows, summary, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(16, 5))
    _bars(ax, [r["shape"] for r in rows], [r["ratio"] for r in rows], summary["geomean"])
    ax.set_ylabel("torch.matmul time / lib.gemm time")
    ax.set_title(f"gemm-tune library end to end vs torch.matmul (cuBLAS), {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_m(rows, summary, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(16, 5))
    _bars(ax, [str(r["m"]) + ("*" if r["measured"] else "") for r in rows],
          [r["ratio"] for r in rows], summary["geomean"])
    ax.set_ylabel("torch time / lib.gemm time")
    ax.set_title(f"M-sweep, N={summary['n']} K={summary['k']} {summary['dtype']} -> "
                 f"{summary['out']}, buckets {summary['m_buckets']} (* = measured), {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
