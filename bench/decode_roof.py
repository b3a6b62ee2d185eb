"""The decode family at the DRAM roof, against torch.matmul, in one run, on the GPU.

    python3 bench/decode_roof.py [--out DIR] [--dtypes f16,bf16] [--shapes MxNxK,...]
                                 [--epilogue] [--candidates NAME,...] [--prefetch-b [ring,l2]]
                                 [--wave-tiles] [--library DIR] [--alias-a]
                                 [--back-to-back] [--list]

The five decode shapes (M x N x K: 1x4096x4096, 16x4096x4096, 64x4096x14336,
16x14336x4096, 1x8192x28672), fp16 and bf16 with C of the input type, called as a model
calls them: y = x @ W.t() with W stored N x K, as nn.Linear keeps its weight (layout NT);
with --epilogue, y = gelu(x @ W.t() + b), ours fused, torch's as
F.gelu(F.linear(x, W, b)).

Each call reads W from DRAM: W rotates through as many copies as make at least 3x the L2
(and at least 2), a different copy each call; x (tiny, an activation) stays in L2, as in
a model. The roof is a device-to-device copy measured in the same run (1 GiB copied by
torch: 2 GiB moved). Bytes of a call: W + x + y (+ b). Timing: the GPU is held by a sleep
kernel while the host enqueues a batch of calls, each between two CUDA events, so no
call waits on the host (the runners' Python launch takes a few microseconds, as much as
a small decode GEMM); median over the calls, and over three interleaved rounds (torch and
every candidate once a round). With --back-to-back a batch runs with no event between its
calls, and a call's time is the batch's over its calls: our kernels launch with
programmatic dependent launch, so one's start overlaps the end of the one before, as a
model's consecutive layers run (torch's are timed the same way). --prefetch-b adds, for
each decode candidate, its twins that fetch B's first chunks before that wait: into the
ring (ring: prefetch_b=1, for a B the kernel before does not write) and into L2 (l2:
prefetch_b=2, for any B); both where no list follows. --wave-tiles adds N tiles fitted to
the SMs (wave_tiles: the least BN, a multiple of 8, whose panels fill at most one, or two,
waves of them), where the fixed ones leave the busiest SM more columns than its share.
--library DIR also times the calls as a program makes them through a tuned library:
lib.gemm(x, W.t(), y) as it decides (its first use measured, as in a program), and the
same with static_b=True (the promise that no work ahead writes W: a decode entry runs as
its twin that loads W before the kernel ahead ends; Library.gemm), rows "library" and
"library static_b"; --candidates none leaves the generated kernels out.
--alias-a is a diagnostic of what reading A costs: x's M rows alias one row (our kernels
get lda = 0, torch an expanded view), so every block's reads of A from the L2 are one
row's and the rest of each kernel is unchanged; torch's figure there is not a peer's.

Ours: candidates() below: per shape, the M tiles that cover M (the FMA path for M <= 8,
mma tiles otherwise), a few warp arrangements and rings, split-K by the last block and
across a cluster where the panels leave SMs idle (and one reduce pass), each checked against float64 before it is
timed (the tuner's gate, codegen's tolerance for the family), launched through its runner
(tuner.runtime.runners.Runner, what the tuner times and the library ships). The row's
figure is the best candidate's (a best-of-N selection, stated); all are in the JSON.

Per row: microseconds, GB/s, the fraction of the copy roof, the ratio torch time / ours;
the bar (issue 23): ratio >= 1.0, and where torch is below 60% of the roof, ours >= 85%.
JSON under --out (default bench/results/) named decode-roof-<gpu>-<date>.json.
--list prints the candidates and exits (no GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codegen.check import check  # noqa: E402
from codegen.errors import UsageError  # noqa: E402
from codegen.families._common import DType, Layout, Variant, cdiv  # noqa: E402
from codegen.families.decode import DecodeConfig, problem_reasons  # noqa: E402
from codegen.families.wgmma import SPLITS as WGMMA_SPLITS, WgmmaConfig, check_wgmma  # noqa: E402
from codegen.families.wgmma import problem_reasons as wgmma_reasons  # noqa: E402

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 14336), (16, 14336, 4096),
          (1, 8192, 28672)]
DTYPES = (DType.F16, DType.BF16)
#: (BN, WK, WN) of the candidates
ARRANGEMENTS = [(32, 4, 1), (32, 8, 1), (32, 16, 1), (64, 4, 2), (64, 2, 4), (128, 2, 4),
                (128, 4, 2)]
#: (ring, stages) of the candidates: registers, or shared memory filled by cp.async (as
#: deep as fits: a short call's ramp wants the bytes in flight, bench/NOTES.md,
#: "Forty-first session")
RINGS = (("reg", 2), ("async", 3), ("async", 5), ("async", 7))
#: --prefetch-b's words: B's first chunks into the ring, or into L2 (DecodeConfig.prefetch_b)
PREFETCH_MODES = {"ring": 1, "l2": 2}
SMS = 132
ROUNDS = 3
CALLS = 40  # calls a batch, between events
BAR_RATIO, BAR_ROOF, TORCH_LOW = 1.0, 0.85, 0.60


def m_tiles(m: int) -> list[tuple[str, int]]:
    """(math, MT) of the candidates for M rows: the FMA tile holding M (M <= 8) and the
    mma tile of 16; or the mma tile holding M (64 at most) and the one of half its rows
    (B then read twice, the second time from L2)."""
    if m <= 8:
        return [("fma", next(t for t in (1, 2, 4, 8) if t >= m)), ("mma", 16)]
    hold = next((t for t in (16, 32, 64) if t >= m), 64)
    return [("mma", hold)] + ([("mma", hold // 2)] if hold > 16 else [])


def splits(c: DecodeConfig, shape) -> list[tuple[int, str]]:
    """No split, and split-K by the last block and across a cluster (a split of 8 at
    most) at the splits that bring the blocks to 1-4 per SM (the largest of them also as a
    reduce pass)."""
    m, n, _ = shape
    panels = cdiv(m, c.mt) * cdiv(n, c.bn)
    out = [(1, "pass")]
    if panels < SMS:
        fits = [s for s in (2, 4, 8, 16) if SMS <= panels * s <= 4 * SMS]
        out += [(s, "last") for s in fits] + [(s, "cluster") for s in fits if s <= 8] + [
            (s, "pass") for s in fits[-1:]]
    return out


def wave_tiles(shape) -> list[tuple[int, int, int]]:
    """(BN, WK, WN=1) arrangements whose panels fill whole waves of the SMs: for 1 and 2
    waves, the least BN, a multiple of 8 (at most 256), with ceil(N / BN) <= waves x SMS,
    unless ARRANGEMENTS has it. At N = 14336 the fixed tiles leave the busiest SM 128
    columns (448 panels of 32 on 132 SMs: 4 of them), where 112 and 56 leave it 112."""
    have = {a[0] for a in ARRANGEMENTS}
    bns = dict.fromkeys(8 * cdiv(shape[1], 8 * w * SMS) for w in (1, 2))
    return [(bn, wk, 1) for bn in bns if bn not in have and bn <= 256 for wk in (4, 8)]


def candidates(shape, dtype: DType, epilogue: bool = False, arch: str = "sm_90",
               prefetch_b: tuple[int, ...] = (), waves: bool = False) -> list:
    """The decode configs timed at `shape` (see the module doc), NT, C in `dtype`; each
    also as its twin of each of `prefetch_b`'s modes, which fetch B's first chunks before
    the wait for the kernel before (DecodeConfig.prefetch_b); with `waves`, also the N
    tiles of wave_tiles."""
    variant = Variant(Layout.NT, dtype, *(("out", "gelu") if epilogue else ("none", "none")))
    arrangements = ARRANGEMENTS + (wave_tiles(shape) if waves else [])
    out = []
    for (math_, mt), (bn, wk, wn), (ring, stages) in ((t, a, r) for t in m_tiles(shape[0])
                                                      for a in arrangements for r in RINGS):
        base = variant.apply(DecodeConfig(math=math_, mt=mt, bn=bn, wk=wk, wn=wn,
                                          stages=stages, ring=ring, dtype=dtype))
        for split, reduce in splits(base, shape):
            c = dataclasses.replace(base, split=split, reduce=reduce)
            if not check(c, arch) and not problem_reasons(c, shape, arch) and \
                    c.split <= cdiv(shape[2], c.bk):
                out += [c] + [dataclasses.replace(c, prefetch_b=p) for p in prefetch_b]
    return list(dict.fromkeys(out + wgmma_candidates(shape, dtype, variant, arch)))


def wgmma_candidates(shape, dtype: DType, variant: Variant, arch: str = "sm_90") -> list:
    """The wgmma family's split-K kernels for a skinny M: a 64-row tile (TMA zero-fills the
    rows past M, which cost no DRAM traffic), one consumer, BN of 64-256, as many stages as
    fit, persistent or a block per slice, and the splits that bring the work items to
    between half and twice the SMs."""
    m, n, k = shape
    out = []
    for bn, stages, persistent in ((bn, st, p) for bn in (64, 128, 256) for st in (4, 6, 8)
                                   for p in (0, 1)):
        tiles = cdiv(m, 64) * cdiv(n, bn)
        for split in (s for s in WGMMA_SPLITS if SMS // 2 <= tiles * s <= 2 * SMS
                      and s <= cdiv(k, 64)):
            c = variant.apply(WgmmaConfig(bm=64, bn=bn, consumers=1, stages=stages,
                                          persistent=persistent, group=1, split=split,
                                          dtype=dtype))
            if not check_wgmma(c, arch) and not wgmma_reasons(c, shape):
                out.append(c)
    return out


def _tdt(torch, dtype: DType):
    return {DType.F16: torch.float16, DType.BF16: torch.bfloat16}[dtype]


class Timer:
    """Per-call GPU times of `fn(i)` (i: the call's index), the GPU held by a sleep kernel
    while a batch is enqueued; `before(i)`, if given, runs ahead of each call, outside its
    events (bench/flush_effect.py: an L2 flush)."""

    def __init__(self, torch, back_to_back: bool = False):
        self.torch, self.back_to_back = torch, back_to_back

    def stream(self, fn, calls: int = CALLS) -> float:
        """Microseconds a call of `calls` back to back between two events (nothing between
        the kernels: under programmatic dependent launch one's start overlaps the end of
        the one before, as a model's consecutive layers run)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(max(5_000_000, 100_000 * calls))
        start.record()
        for i in range(calls):
            fn(i)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls

    def batch(self, fn, calls: int = CALLS, before=None) -> list[float]:
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        # ~2.5 ms (50 us a call beyond 50 calls): longer than enqueueing the batch
        torch.cuda._sleep(max(5_000_000, 100_000 * calls))
        for i, (s, e) in enumerate(zip(starts, ends)):
            if before is not None:
                before(i)
            s.record()
            fn(i)
            e.record()
        ends[-1].synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]  # microseconds

    def __call__(self, fn) -> float:
        for i in range(3):
            fn(i)
        if self.back_to_back:
            return self.stream(fn)
        return statistics.median(self.batch(fn))


def copy_roof(torch, timer: Timer) -> float:
    """GB/s of a device-to-device copy of 1 GiB (2 GiB moved)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    us = statistics.median([statistics.median(timer.batch(lambda i: dst.copy_(src), 5))
                            for _ in range(3)])
    del src, dst
    return 2 * n / (us * 1e-6) / 1e9


class Problem:
    """One shape and dtype: x, the rotating copies of W, y, the reference."""

    def __init__(self, torch, shape, dtype: DType, l2_bytes: int, epilogue: bool,
                 alias_a: bool = False):
        m, n, k = shape
        self.torch, self.shape, self.dtype, self.epilogue = torch, shape, dtype, epilogue
        t = _tdt(torch, dtype)
        w_bytes = n * k * 2
        self.copies = max(2, math.ceil(3 * l2_bytes / w_bytes))
        self.alias_a = alias_a  # x's rows alias one row (--alias-a)
        self.x = torch.randn(1 if alias_a else m, k, device="cuda").to(t).expand(m, k)
        self.ws = [torch.randn(n, k, device="cuda").to(t) for _ in range(self.copies)]
        self.b = torch.randn(n, device="cuda").to(t) if epilogue else None
        self.y = torch.empty(m, n, device="cuda", dtype=t)
        self.bytes = w_bytes + m * k * 2 + m * n * 2 + (n * 2 if epilogue else 0)
        ref = self.x.double() @ self.ws[0].double().t()
        if epilogue:
            ref = torch.nn.functional.gelu(ref + self.b.double())
        self.ref = ref

    def torch_call(self):
        F, torch = self.torch.nn.functional, self.torch
        if self.epilogue:
            return lambda i: F.gelu(F.linear(self.x, self.ws[i % self.copies], self.b))
        return lambda i: torch.matmul(self.x, self.ws[i % self.copies].t(), out=self.y)

    def ours(self, runner, g, stream):
        m, n, k = self.shape
        bound = runner.bind(g, m, n, k, 0 if self.alias_a else k, k, n)
        x, y, ws = self.x.data_ptr(), self.y.data_ptr(), [w.data_ptr() for w in self.ws]
        b = self.b.data_ptr() if self.b is not None else 0
        return lambda i: bound(x, ws[i % self.copies], y, 1.0, 0.0, stream, bias=b)

    def library_call(self, lib, static_b: bool):
        """lib.gemm(x, W.t(), y): the library's decision, as a program calls it; with
        `static_b` the promise that nothing ahead writes W."""
        x, y, ws, b = self.x, self.y, self.ws, self.b
        act = "gelu" if self.epilogue else None
        return lambda i: lib.gemm(x, ws[i % self.copies].t(), y, bias=b, activation=act,
                                  static_b=static_b)

    def error(self, fn) -> float:
        """Relative error of fn's y (copy 0 of W) against float64, y poisoned first."""
        self.y.fill_(float("nan"))
        out = fn(0)  # ours: None (y written); torch: its output
        self.torch.cuda.synchronize()
        got = self.y if out is None else out
        return float((got.double() - self.ref).norm() / self.ref.norm())


def _figures(us: float, nbytes: int, roof_gbs: float) -> dict:
    gbs = nbytes / (us * 1e-6) / 1e9
    return dict(us=round(us, 2), gbs=round(gbs, 1), roof=round(gbs / roof_gbs, 3))


def _row(problem: Problem, times: dict, errors: dict, roof_gbs: float, torch_how: str) -> dict:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ours = [nm for nm in med if nm != "torch"]
    best = min(ours, key=med.get) if ours else None
    torch_fig = _figures(med["torch"], problem.bytes, roof_gbs)
    row = dict(dtype=problem.dtype.short, shape=list(problem.shape), bytes=problem.bytes,
               w_copies=problem.copies, torch=torch_how, torch_us=torch_fig["us"],
               torch_gbs=torch_fig["gbs"], torch_roof=torch_fig["roof"],
               torch_rounds=[round(t, 2) for t in times["torch"]], kernel=best,
               candidates={nm: dict(**_figures(med[nm], problem.bytes, roof_gbs),
                                    rounds=[round(t, 2) for t in times[nm]],
                                    error=errors[nm]) for nm in ours})
    if best:
        fig = row["candidates"][best]
        row.update(us=fig["us"], gbs=fig["gbs"], roof=fig["roof"],
                   ratio=round(med["torch"] / med[best], 3))
        row["meets_bar"] = row["ratio"] >= BAR_RATIO and (
            row["torch_roof"] >= TORCH_LOW or row["roof"] >= BAR_ROOF)
    return row


def _parse_shapes(text: str | None) -> list:
    if not text:
        return SHAPES
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: the five)")
    ap.add_argument("--epilogue", action="store_true",
                    help="y = gelu(x @ W.t() + b), ours fused, torch's F.gelu(F.linear)")
    ap.add_argument("--candidates", default="",
                    help="kernel names to time instead of the generated list")
    ap.add_argument("--prefetch-b", nargs="?", const="ring,l2", default="",
                    help="each decode candidate also with B's first chunks fetched before "
                         "the wait for the kernel before: into the ring, into L2, or both "
                         "(ring,l2: the default)")
    ap.add_argument("--wave-tiles", action="store_true",
                    help="also the N tiles fitted to whole waves of the SMs (wave_tiles)")
    ap.add_argument("--back-to-back", action="store_true",
                    help="time a call as the mean of a batch back to back between two "
                         "events (no event between the kernels), not each call alone")
    ap.add_argument("--library", type=Path, default=None,
                    help="also lib.gemm through this library, with and without static_b")
    ap.add_argument("--alias-a", action="store_true",
                    help="a diagnostic: x's rows alias one row (lda = 0 for ours), so A's "
                         "reads from the L2 are one row's")
    ap.add_argument("--list", action="store_true", help="print the candidates and exit")
    args = ap.parse_args(argv)
    try:
        shapes = _parse_shapes(args.shapes)
        dtypes = [DType.parse(d) for d in args.dtypes.split(",")]
        if any(d not in DTYPES for d in dtypes) or any(min(s) < 1 or len(s) != 3
                                                       for s in shapes):
            raise UsageError("the decode family takes f16 and bf16, shapes MxNxK >= 1")
        words = [w for w in args.prefetch_b.split(",") if w]
        if any(w not in PREFETCH_MODES for w in words):
            raise UsageError(f"--prefetch-b takes ring and l2, not {args.prefetch_b!r}")
        prefetch = tuple(PREFETCH_MODES[w] for w in words)
        plan = {(s, d): _chosen(args.candidates, s, d, args.epilogue, prefetch, args.wave_tiles)
                for s in shapes for d in dtypes}
    except (ValueError, UsageError) as e:
        print(f"decode_roof: {e}", file=sys.stderr)
        return 2
    if args.list:
        for (s, d), cs in plan.items():
            print(f"{d.short} {'x'.join(map(str, s))}: {len(cs)} candidates")
            for c in cs:
                print(f"  {c.name}")
        return 0
    return _run(args, plan)


def _chosen(names: str, shape, dtype: DType, epilogue: bool,
            prefetch_b: tuple[int, ...] = (), waves: bool = False) -> list:
    if not names:
        return candidates(shape, dtype, epilogue, prefetch_b=prefetch_b, waves=waves)
    if names == "none":
        return []
    from codegen.config import config_from_name

    cs = [config_from_name(n) for n in names.split(",") if n]
    return [c for c in cs if c.dtype is dtype]


def _run(args, plan: dict) -> int:
    import torch

    from _common import commit, cpp_path, gpu_slug
    from codegen.compile import compile_many, nvcc_version
    from tuner.bench import tolerance
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    props = torch.cuda.get_device_properties(0)
    gpu = torch.cuda.get_device_name(0)
    timer = Timer(torch, args.back_to_back)
    roof = copy_roof(torch, timer)
    doc = dict(benchmark="decode-roof", gpu=gpu, torch=torch.__version__, nvcc=nvcc_version(),
               commit=commit(), rounds=ROUNDS, calls=CALLS, l2_bytes=props.L2_cache_size,
               copy_roof_gbs=round(roof, 1), epilogue=args.epilogue, alias_a=args.alias_a,
               back_to_back=args.back_to_back,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               method=__doc__, rows=[])
    print(f"{gpu}: device copy {roof:.0f} GB/s; L2 {props.L2_cache_size >> 20} MiB", flush=True)
    slug = gpu_slug(gpu)
    tag = ("-epilogue" if args.epilogue else "") + ("-back-to-back" if args.back_to_back else "") \
        + ("-library" if args.library else "") + ("-alias-a" if args.alias_a else "")
    path = args.out / f"decode-roof{tag}-{slug}-{doc['date'][:10]}.json"
    args.out.mkdir(parents=True, exist_ok=True)

    every = list(dict.fromkeys(c for cs in plan.values() for c in cs))
    t0 = time.monotonic()
    built = {}
    for cfg, res in compile_many(every, "sm_90", jobs=16):
        if res.ok:
            built[cfg] = runner_for(cfg, Path(res.cubin).read_bytes())
        else:
            print(f"{cfg.name}: compile failed: {res.error.splitlines()[0]}", flush=True)
    print(f"compiled {len(built)} of {len(every)} in {time.monotonic() - t0:.0f} s", flush=True)

    stream = torch.cuda.current_stream().cuda_stream
    g = driver.gpu(torch.cuda.current_device())  # torch made its primary context current
    lib = None
    if args.library is not None:
        from tuner.runtime.library import load_library

        lib = load_library(args.library)
        # the C++ call path built before anything is timed (it builds in a background
        # thread on the first torch call, and a row timed meanwhile measures the host)
        doc["library"], doc["cpp_path"] = str(args.library), cpp_path()
    torch_how = ("F.gelu(F.linear(x, W, b))" if args.epilogue else
                 "torch.matmul(x, W.t(), out=y)") + ", C in the input type"
    for (shape, dtype), cfgs in plan.items():
        problem = Problem(torch, shape, dtype, props.L2_cache_size, args.epilogue,
                          args.alias_a)
        runs, errors = {"torch": problem.torch_call()}, {}
        errors["torch"] = problem.error(runs["torch"])
        if lib is not None:
            for name, static in (("library", False), ("library static_b", True)):
                run = problem.library_call(lib, static)
                err = errors[name] = problem.error(run)
                if err <= 1e-2:
                    runs[name] = run
                else:
                    print(f"{name} {shape}: WRONG, error {err:.2e}", flush=True)
        for cfg in (c for c in cfgs if c in built):
            run = problem.ours(built[cfg], g, stream)
            err = errors[cfg.name] = problem.error(run)
            if err <= tolerance(cfg, shape[2]):
                runs[cfg.name] = run
            else:
                print(f"{cfg.name} {shape}: WRONG, error {err:.2e}", flush=True)
        times = {name: [] for name in runs}
        for _ in range(ROUNDS):
            for name, fn in runs.items():
                times[name].append(timer(fn))
        row = _row(problem, times, {k: v for k, v in errors.items() if k in times}, roof,
                   torch_how)
        doc["rows"].append(row)
        print(f"{dtype.short:4} {'x'.join(map(str, shape)):>14}  torch {row['torch_us']:8.2f} us "
              f"({row['torch_roof']:.0%} of roof)  ours {row.get('us', 0):8.2f} us "
              f"({row.get('roof', 0):.0%}, {row.get('ratio', 0):.2f}x) {row['kernel']}",
              flush=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")  # as it goes: a cut run keeps it
        del problem
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
