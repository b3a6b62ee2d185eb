"""The wgmma family against torch.matmul, cuBLAS and Triton (issue 23's bar), in one run,
on the GPU.

    python3 bench/wgmma_vs_cublas.py [--out DIR] [--triton-budget 240] [--no-triton]
                                     [--dtypes f16,bf16|tf32] [--fp32-c] [--tunes JSONL]

fp16 and bf16 at 4096^3, 8192^3, 8192x8192x1024, 4096x14336x4096 and 16384x1024x4096, C
in the input type (2-byte C, as torch.matmul writes it). Three interleaved rounds: each
round times every candidate, torch.matmul and Triton once more, turn about, so all figures
of a shape come from the same minutes. Each timing: CUDA events around one launch, the L2
flushed before each repetition (a buffer of four times its size read: the flush also
gives the host time to enqueue the launch, so a runner's Python overhead stays off its
time), repetitions to ~40 ms.

- ours: a small fixed list of wgmma configs per dtype (the tunes' winners and neighbours:
  persistence, raster group, ring depth, the TMA store, a cluster), writing C in the input
  type, launched through their runner (tuner.runtime.runners.TmaRunner, what the tuner
  times and the library ships) on torch's buffers and stream; the row reports the best
  candidate by its median over the three rounds, and every candidate's figures beside it
  (best-of-N: a small selection bias, stated).
- the peer: torch.matmul(a, b, out=c) with C in the input type (cuBLAS as torch calls it).
  The bar: ours at least 1.05x of it on each shape, and ahead of Triton.
- Triton: torch.compile(mode="max-autotune-no-cudagraphs") of torch.mm with
  torch._inductor.config.max_autotune_gemm_backends = "TRITON" (Triton templates only),
  2-byte C. Compiles are bounded by --triton-budget seconds in all (the bar's shapes
  first); a shape left without Triton, or a compile that fails, is recorded with the reason.
- --fp32-c: the earlier comparison (issue 13): ours and cuBLAS writing FP32 C
  (torch.mm(a, b, out_dtype=torch.float32) where torch has it, else cublasGemmEx), Triton
  2-byte C beside them (with --triton-f32 also Triton's cast to FP32 fused into its
  epilogue); bar 0.90x cuBLAS.
- --dtypes tf32: FP32 data and C against cuBLAS TF32 (torch.mm with allow_tf32); the
  pre-pass candidates; no Triton; bar 0.95x.
- --tunes JSONL: fresh tunes' lines (bench/device_steps.sh tunes) copied into the JSON
  (issue 23 item 5: tune wall time and rank correlation).

Every candidate's output is checked against the peer's before it is timed (relative
Frobenius error <= 1e-4 x max(1, K/4096) for FP32 C; 2e-3 for 2-byte C, which rounds each
element to 11 or 8 bits on both sides). JSON and a PNG go to --out (default bench/results/)
named wgmma-vs-cublas[-...]-<gpu>-<date>.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codegen.config import DType  # noqa: E402
from codegen.families.wgmma import WgmmaConfig  # noqa: E402

BAR_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
MORE_SHAPES = [(8192, 8192, 1024), (4096, 14336, 4096), (16384, 1024, 4096)]
DTYPES = (DType.F16, DType.BF16)
#: tf32 (--dtypes tf32): one operand through registers (prep 3), its rows in pairs (_rp, the
#: family's default: bench/results/tf32-register-pairs-770481b-h200-2026-12-05.json) with
#: the fresh tunes' winners of 2026-12-05 at 4096^3 and 8192^3 (a block a tile: p0) and
#: clusters along M and N, and without the pairs; TMA's rounding with B's pre-pass (prep 2,
#: alone and in a cluster) and the pre-pass
TF32_CANDIDATES = ["256x128x32_c2_s4_x1_p1_g8_prer_rp", "256x128x32_c2_s4_x1_p0_g1_prer_rp",
                   "256x128x32_c2_s4_x1_p0_g8_prer_rp", "256x128x32_c2_s4_x2_p1_g8_prer_rp",
                   "256x128x32_c2_s4_x2n_p1_g8_prer_rp", "256x128x32_c2_s4_x1_p1_g8_prer",
                   "128x256x32_c2_s4_x1_p1_g8_pret", "128x256x32_c2_s4_x2_p1_g8_pret",
                   "256x128x32_c2_s4_x1_p1_g8_pre"]
#: per dtype, FP32 C (--fp32-c): the probe's winners
#: (bench/results/wgmma-probe-h200-2026-12-01.json) and neighbours (persistence, raster
#: group, a shallower ring)
CANDIDATES = ["128x256x64_c2_s4_x1_p0_g8", "128x256x64_c2_s4_x1_p1_g8",
              "256x128x64_c2_s4_x1_p0_g8", "256x128x64_c2_s4_x1_p1_g8",
              "128x256x64_c2_s3_x1_p1_g16", "128x192x64_c2_s4_x1_p1_g16"]
#: per dtype, C in the input type: the fresh fp16 tunes' winners of 2026-12-03
#: (bench/results/tunes-fp16-*-2026-12-03.jsonl: the TMA store, persistent or not, 256x128
#: and 128x256, a cluster, ping-pong consumers) and neighbours
CANDIDATES_2B = ["256x128x64_c2_s4_x1_p1_g8_ts", "256x128x64_c2_s4_x1_p1_g16_ts",
                 "128x256x64_c2_s4_x1_p1_g8_ts", "128x256x64_c2_s3_x1_p0_g8_ts",
                 "128x256x64_c2_s4_x1_p0_g16_ts", "128x192x64_c2_s4_x2_p1_g1_ts",
                 "128x256x64_c2_s4_x2_p1_g8_ts", "128x128x64_c2_s5_x1_p1_g16_pp_ts",
                 "128x128x64_c2_s4_x1_p1_g8_pp_ts"]
ROUNDS = 3
TARGET_MS = 40.0
#: ours / the peer each row must reach (issue 23): 2-byte C against torch.matmul, tf32
#: against cuBLAS TF32; FP32 C against cuBLAS (issue 13's)
BAR = {"2-byte": 1.05, "tf32": 0.95, "fp32_c": 0.90}


def configs(dtype: DType, extra: tuple[str, ...] = (), fp32_c: bool = False
            ) -> list[WgmmaConfig]:
    """The candidates for `dtype`, plus `extra` (name tails such as
    ``128x256x64_c2_s4_x2_p1_g8``: variants measured beside), writing C in the input type
    (fp16 / bf16 unless `fp32_c`; tf32 always FP32 C)."""
    if dtype is DType.TF32:
        names = TF32_CANDIDATES
    else:
        names = CANDIDATES if fp32_c else CANDIDATES_2B
    two_byte = "" if fp32_c or dtype is DType.TF32 else f"_o{dtype.short}"
    return [WgmmaConfig.from_name(f"gemm_wgmma_{dtype.short}_{c}{two_byte}")
            for c in names + list(extra)]


def _tdt(torch, dtype: DType):
    return {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.TF32: torch.float32}[dtype]



class Timer:
    """do_bench with torch events: warm-up, repetitions sized to TARGET_MS, L2 flushed."""

    def __init__(self, torch):
        self.torch = torch
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buf = torch.zeros(max(4 * l2, 1 << 20) // 4, dtype=torch.int32, device="cuda")

    def flush(self) -> None:
        """Evict the L2 by reading a buffer of four times its size, which leaves its lines
        clean (tuner.bench.L2Flush's way). A memset (this Timer's flush until 2026-12-04) left
        them dirty, and a memory-bound call then paid their write-backs: cuBLAS 1.08x-1.24x
        slower than with its weights rotated beyond the L2 (bench/flush_effect.py)."""
        self.flush_buf.sum()

    def __call__(self, fn) -> list[float]:
        torch = self.torch
        for _ in range(3):
            fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        reps = int(min(200, max(10, TARGET_MS / max(e0.elapsed_time(e1), 1e-3))))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush()
            s.record()
            fn()
            e.record()
        ends[-1].synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def back_to_back(self, fn, calls: int = 20, reps: int = 5) -> list[float]:
        """Milliseconds a call of `fn` run `calls` times back to back between two events, no
        flush and no event between the calls (as a program's forward runs them: at the
        clock the power cap holds under sustained work), `reps` times, each after a flush."""
        torch = self.torch
        fn()
        out = []
        for _ in range(reps):
            self.flush()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) / calls)
        return out

    def pair(self, fa, fb) -> tuple[list[float], list[float]]:
        """Two functions timed as __call__ times one, repetition by repetition in turn (a,
        b, a, b ...): where the host paces them (a short forward), its speed drifts over
        seconds, and both then see the same drift."""
        torch = self.torch
        for _ in range(3):
            fa(), fb()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fa(), fb()
        e1.record()
        e1.synchronize()
        reps = int(min(200, max(10, 2 * TARGET_MS / max(e0.elapsed_time(e1), 1e-3))))
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(reps)]
        for ev in events:
            for (s, e), fn in zip((ev[:2], ev[2:]), (fa, fb)):
                self.flush()
                s.record()
                fn()
                e.record()
        events[-1][-1].synchronize()
        return ([ev[0].elapsed_time(ev[1]) for ev in events],
                [ev[2].elapsed_time(ev[3]) for ev in events])


def cublas_runner(torch, a, b, c, dtype):
    """(callable running cuBLAS with an FP32 C, how); c receives its result once."""
    if dtype is DType.TF32:
        def run():
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.mm(a, b, out=c)
            torch.backends.cuda.matmul.allow_tf32 = False
        run()
        return run, "torch.mm fp32, allow_tf32=True (cuBLAS TF32)"
    try:
        torch.mm(a, b, out_dtype=torch.float32, out=c)
        return (lambda: torch.mm(a, b, out_dtype=torch.float32, out=c)), \
            f"torch.mm {dtype.short} -> fp32 (out_dtype, out=)"
    except (TypeError, RuntimeError):
        pass
    try:
        c.copy_(torch.mm(a, b, out_dtype=torch.float32))
        return (lambda: torch.mm(a, b, out_dtype=torch.float32)), \
            f"torch.mm {dtype.short} -> fp32 (out_dtype)"
    except (TypeError, RuntimeError):
        pass
    from tuner.runtime.cublas import Cublas

    blas = Cublas()
    m, k = a.shape
    n = b.shape[1]
    stream = torch.cuda.current_stream().cuda_stream

    def run():
        blas.gemm(dtype, m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), n, 0.0, c.data_ptr(), n,
                  stream)

    run()
    return run, f"cublasGemmEx {dtype.short} -> fp32 (COMPUTE_32F)"


def compile_triton(torch, dtype, shape, deadline: float, f32_out: bool = False
                   ) -> tuple[object, str]:
    """(compiled fn or None, note); `f32_out`: the product cast to fp32 (fused)."""
    if time.monotonic() > deadline:
        return None, "not compiled: the Triton budget was spent on earlier shapes"
    import torch._inductor.config as ic

    ic.max_autotune_gemm_backends = "TRITON"
    torch._dynamo.reset()
    # every shape and dtype compiles the same lambda: past dynamo's recompile limit (8) a
    # call would run eager (cuBLAS) under Triton's name
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 1024)
    m, n, k = shape
    a = torch.randn(m, k, device="cuda").to(_tdt(torch, dtype))
    b = torch.randn(k, n, device="cuda").to(_tdt(torch, dtype))
    t0 = time.monotonic()
    try:
        # no CUDA graphs: a graph tree copies non-static inputs into its buffers on every
        # call, which would add two operand copies to Triton's time
        fn = torch.compile((lambda x, y: torch.mm(x, y).float()) if f32_out else
                           (lambda x, y: torch.mm(x, y)), mode="max-autotune-no-cudagraphs",
                           dynamic=False)
        fn(a, b)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - recorded, the benchmark goes on
        return None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return fn, f"compiled in {time.monotonic() - t0:.0f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--triton-budget", type=float, default=240.0)
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--triton-f32", action="store_true",
                    help="with --fp32-c: also Triton writing FP32 C (mm(a, b).float(), the "
                         "cast fused)")
    ap.add_argument("--fp32-c", action="store_true",
                    help="ours and cuBLAS writing FP32 C (issue 13's comparison)")
    ap.add_argument("--tunes", type=Path, default=None, metavar="JSONL",
                    help="fresh tunes' lines (bench/device_steps.sh tunes) to copy in")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: the five)")
    ap.add_argument("--dtypes", default="f16,bf16",
                    help="f16, bf16, tf32 (tf32: against cuBLAS TF32; no Triton)")
    ap.add_argument("--extra", default="",
                    help="more candidates, comma-separated name tails (e.g. "
                         "128x256x64_c2_s4_x2_p1_g8,128x256x64_c2_s4_x1_p1_g8_ts)")
    args = ap.parse_args(argv)
    extra = tuple(x for x in args.extra.split(",") if x)
    fp32_c = args.fp32_c

    import torch

    from _common import commit, gpu_slug
    from codegen.compile import compile_many, nvcc_version
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else BAR_SHAPES + MORE_SHAPES)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    gpu = torch.cuda.get_device_name(0)
    import datetime

    doc = dict(benchmark="wgmma-vs-cublas", gpu=gpu, torch=torch.__version__,
               nvcc=nvcc_version(), commit=commit(), rounds=ROUNDS,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               method=__doc__, rows=[], triton={}, extra_candidates=list(extra),
               c_type="fp32" if fp32_c else "input")
    if args.tunes:
        doc["tunes"] = [json.loads(line) for line in args.tunes.read_text().splitlines()
                        if line.strip()]
    try:
        import triton

        doc["triton_version"] = triton.__version__
    except ImportError:
        doc["triton_version"] = None
    slug = gpu_slug(gpu)
    tag = ("" if args.dtypes == "f16,bf16" else "-" + args.dtypes.replace(",", "-")) + \
        ("-fp32c" if fp32_c else "") + ("-extra" if extra else "")
    path = args.out / f"wgmma-vs-cublas{tag}-{doc['commit']}-{slug}-{doc['date'][:10]}.json"
    args.out.mkdir(parents=True, exist_ok=True)

    dtypes = [DType.parse(d) for d in args.dtypes.split(",")]
    cfgs = [c for d in dtypes for c in configs(d, extra, fp32_c)]
    t0 = time.monotonic()
    built = {}
    for cfg, res in compile_many(cfgs, "sm_90", jobs=8):
        if not res.ok:
            print(f"{cfg.name}: compile failed: {res.error.splitlines()[0]}")
            continue
        built[cfg] = runner_for(cfg, Path(res.cubin).read_bytes())
    print(f"compiled {len(built)} of {len(cfgs)} candidates in {time.monotonic() - t0:.0f} s",
          flush=True)

    # Triton first, bar shapes first, within the budget (so its figures share the run)
    triton_fns = {}
    if not args.no_triton:
        deadline = time.monotonic() + args.triton_budget
        for shape in shapes:
            for dtype in [d for d in dtypes if d is not DType.TF32]:
                key = f"{dtype.short} {'x'.join(map(str, shape))}"
                for f32_out in (False, True) if args.triton_f32 and fp32_c else (False,):
                    fn, note = compile_triton(torch, dtype, shape, deadline, f32_out)
                    doc["triton"][key + (" f32 C" if f32_out else "")] = note
                    print(f"Triton {key}{' f32 C' if f32_out else ''}: {note}", flush=True)
                    if fn is not None:
                        triton_fns[(dtype, shape, f32_out)] = fn
    else:
        doc["triton"]["all"] = "not run (--no-triton)"

    timer = Timer(torch)
    stream = torch.cuda.current_stream().cuda_stream
    g = driver.gpu(torch.cuda.current_device())  # torch made its primary context current
    for shape in shapes:
        m, n, k = shape
        flops = 2.0 * m * n * k
        for dtype in dtypes:
            tdt = _tdt(torch, dtype)
            two_byte = not fp32_c and dtype is not DType.TF32
            a = torch.randn(m, k, device="cuda").to(tdt)
            b = torch.randn(k, n, device="cuda").to(tdt)
            c = torch.empty(m, n, device="cuda", dtype=tdt if two_byte else torch.float32)
            ref = torch.empty_like(c)
            if two_byte:  # torch.matmul writing C in the input type: the bar's peer
                blas = (lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref))
                how = f"torch.matmul {dtype.short} -> {dtype.short} (out=)"
            else:
                blas, how = cublas_runner(torch, a, b, ref, dtype)
            blas()
            gate = 2e-3 if two_byte else 1e-4 * max(1.0, k / 4096)
            if dtype is DType.TF32:  # against float64 of the inputs rounded as the kernels do
                # (cuBLAS TF32 rounds otherwise: its own result is no reference at 1e-4)
                from wgmma_probe import _tf32

                ref = (_tf32(torch, a, "rna").double() @ _tf32(torch, b, "rna").double()).float()
            runs, errors = {}, {}
            for cfg in configs(dtype, extra, fp32_c):
                if cfg not in built:
                    continue
                bound = built[cfg].bind(g, m, n, k, k, n, n)
                run = (lambda bound=bound, pa=a.data_ptr(), pb=b.data_ptr(), pc=c.data_ptr():
                       bound(pa, pb, pc, 1.0, 0.0, stream))
                c.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = ((c.double() - ref.double()).norm() / ref.double().norm()).item()
                errors[cfg.name] = err
                if err <= gate:
                    runs[cfg.name] = run
                else:
                    print(f"{cfg.name} {shape}: WRONG, error {err:.2e} vs the peer", flush=True)
            runs["peer"] = blas
            for f32_out, name in ((False, "triton"), (True, "triton_f32")):
                tfn = triton_fns.get((dtype, shape, f32_out))
                if tfn is not None:
                    runs[name] = (lambda tfn=tfn: tfn(a, b))
            times = {name: [] for name in runs}
            for _ in range(ROUNDS):  # interleaved: every runner once per round
                for name, fn in runs.items():
                    times[name].append(statistics.median(timer(fn)))
            tf = {name: [flops / (t * 1e-3) / 1e12 for t in ts] for name, ts in times.items()}
            med = {name: statistics.median(v) for name, v in tf.items()}
            ours = [nm for nm in med if nm.startswith("gemm_wgmma_")]
            best = max(ours, key=med.get) if ours else None
            row = dict(dtype=dtype.short, shape=list(shape), peer=how,
                       peer_tflops=med["peer"], peer_rounds=tf["peer"],
                       kernel=best, tflops=med.get(best), tflops_rounds=tf.get(best),
                       ratio=med[best] / med["peer"] if best else None,
                       triton_tflops=med.get("triton"), triton_rounds=tf.get("triton"),
                       triton_ratio=(med["triton"] / med["peer"] if "triton" in med else None),
                       triton_note=doc["triton"].get(f"{dtype.short} {'x'.join(map(str, shape))}"),
                       triton_f32_tflops=med.get("triton_f32"),
                       triton_f32_ratio=(med["triton_f32"] / med["peer"]
                                         if "triton_f32" in med else None),
                       candidates={nm: dict(tflops=med[nm], rounds=tf[nm],
                                            error_vs_peer=errors.get(nm)) for nm in ours},
                       errors_vs_peer=errors)
            if best:  # issue 23: 2-byte C every shape; tf32 and FP32 C the two bar shapes
                row["meets_bar"] = None
                if two_byte or shape in BAR_SHAPES:
                    row["meets_bar"] = row["ratio"] >= BAR[
                        "tf32" if dtype is DType.TF32 else "fp32_c" if fp32_c else "2-byte"] \
                        and (row["triton_tflops"] is None or row["tflops"] > row["triton_tflops"])
            doc["rows"].append(row)
            tri = f"{row['triton_tflops']:.1f} ({row['triton_ratio']:.2f}x)" \
                if row["triton_tflops"] else "-"
            if row["triton_f32_tflops"]:
                tri += f", FP32 C {row['triton_f32_tflops']:.1f} ({row['triton_f32_ratio']:.2f}x)"
            print(f"{dtype.short:4} {'x'.join(map(str, shape)):>16}  ours {row['tflops'] or 0:7.1f} "
                  f"({(row['ratio'] or 0):.3f}x) {best}  peer {row['peer_tflops']:7.1f}  "
                  f"Triton {tri}", flush=True)
            path.write_text(json.dumps(doc, indent=2) + "\n")  # as it goes: a cut run keeps it
            del a, b, c, ref
    print(f"wrote {path}")
    try:
        _plot(doc, path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
    except ImportError as e:
        print(f"no PNG: {e}")
    return 0


def _plot(doc: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    labels = [f"{r['dtype']}\n{r['shape'][0]}x{r['shape'][1]}\nx{r['shape'][2]}" for r in rows]
    x = range(len(rows))
    series = [("ratio", "gemm-tune wgmma"), ("triton_ratio", "Triton (max-autotune), 2-byte C"),
              ("triton_f32_ratio", "Triton, FP32 C (cast fused)")]
    series = [(k, name) for k, name in series if any(r.get(k) for r in rows)]
    w = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.2), 4.8))
    for j, (key, name) in enumerate(series):
        ax.bar([i + (j - (len(series) - 1) / 2) * w for i in x], [r.get(key) or 0 for r in rows],
               w, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    bar = BAR["fp32_c"] if doc.get("c_type") == "fp32" else BAR["2-byte"]
    if all(r["dtype"] == "tf32" for r in rows):
        bar = BAR["tf32"]
    ax.axhline(bar, color="r", lw=0.8, ls="--", label=f"bar: {bar:.2f}x")
    values = [r.get(k) for r in rows for k, _ in series if r.get(k)]
    ax.set_ylim(max(0.0, min(values + [bar]) - 0.1), max(values + [bar]) + 0.05)
    ax.set_xticks(list(x), labels, fontsize=8)
    peer = "cuBLAS" if doc.get("c_type") == "fp32" or all(r["dtype"] == "tf32" for r in rows) \
        else "torch.matmul, C in the input type"
    ax.set_ylabel(f"TFLOP/s / {peer}", fontsize=9)
    ax.set_title(f"wgmma against {peer.split(',')[0]} and Triton on {doc['gpu']} "
                 f"({doc['date'][:10]}, {doc['commit']}), median of {doc['rounds']} rounds",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
