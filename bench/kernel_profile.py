"""Why a kernel trails cuBLAS: the two (and torch.matmul where C is the input's type) side
by side under sustained load, with the SM clock and the board's power sampled, and then
under Nsight Compute.

Sustained: each call runs back to back for --seconds (no L2 flush: a program's steady
state), turn about for --rounds, while `nvidia-smi -lms 50` samples the SM clock and the
power. Reported per run: TFLOP/s, the median SM clock and power, and TFLOP/s per GHz: the
work a clock does, which tells a kernel that loses clock (power) from one that loses
issue (its pipeline) at the same clock.

--ncu: a child process runs each pair's kernel, cuBLAS and torch once each between
cuProfilerStart and cuProfilerStop under ncu (--clock-control none, --set detailed plus
the tensor pipes' activity, and the warp-stall sampling by instruction: SourceCounters);
its reports are written as text, one file per pair and run.

    python bench/kernel_profile.py --pair 4096x4096x4096 gemm_wgmma_f16_... [--pair ...]
        [--seconds 2] [--rounds 2] [--ncu] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header, problem_for, write  # noqa: E402

from codegen import compile_many  # noqa: E402
from codegen.config import DType, config_from_name  # noqa: E402

NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis",
                "WarpStateStats", "SchedulerStats", "LaunchStats", "Occupancy")
#: the tensor pipes' activity (names vary by ncu version: a regular expression)
NCU_TENSOR = "regex:^sm__pipe_tensor_op.*cycles_active.avg.pct_of_peak_sustained_(active|elapsed)$"


class Sampler:
    """nvidia-smi sampling the SM clock (MHz) and power (W) every 50 ms while open."""

    def __enter__(self):
        self.p = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "50"], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        self.p.terminate()
        out, _ = self.p.communicate(timeout=10)
        self.samples = []
        for line in out.splitlines():
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((mhz, watts))


def sustained(fn, seconds: float, flops: float) -> dict:
    """`fn` back to back for about `seconds`, events around chunks of calls."""
    from tuner.runtime import driver

    for _ in range(3):
        fn()
    start, end = driver.Event(), driver.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    chunk = max(1, int(0.05 / max(end.since(start) * 1e-3, 1e-6)))
    with Sampler() as s:
        t_end, ms, calls = time.perf_counter() + seconds, 0.0, 0
        while time.perf_counter() < t_end:
            start.record()
            for _ in range(chunk):
                fn()
            end.record()
            end.synchronize()
            ms += end.since(start)
            calls += chunk
    per_call = ms / calls
    mhz = statistics.median(x for x, _ in s.samples) if s.samples else None
    watts = statistics.median(w for _, w in s.samples) if s.samples else None
    tflops = flops / (per_call * 1e-3) / 1e12
    return dict(ms=per_call, tflops=tflops, sm_mhz=mhz, watts=watts, calls=calls,
                tflops_per_ghz=tflops / (mhz / 1e3) if mhz else None)


def torch_call(config, shape):
    """torch.matmul on the same problem (layout, input type) where C is the input's type
    and there is no epilogue; None otherwise (or without torch). fp32 data: tf32 with
    torch's allow_tf32 (cuBLASLt as torch calls it, whose kernel may not be the one
    cublasGemmEx picks), strict fp32 and 3xTF32 without."""
    try:
        import torch
    except ImportError:
        return None
    from codegen.families._common import Variant

    v = Variant.of(config)
    data = DType.F32 if config.dtype is DType.TF32 else config.dtype  # tf32: fp32 data and C
    if v.out is not data or v.bias != "none" or v.act != "none":
        return None
    m, n, k = shape
    typ = {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.TF32: torch.float32,
           DType.F32: torch.float32}[config.dtype]
    tf32 = config.dtype is DType.TF32
    a_col, b_col = v.layout.value[0] == "t", v.layout.value[1] == "t"
    a = torch.randn(k, m, device="cuda", dtype=typ).t() if a_col else \
        torch.randn(m, k, device="cuda", dtype=typ)
    b = torch.randn(n, k, device="cuda", dtype=typ).t() if b_col else \
        torch.randn(k, n, device="cuda", dtype=typ)
    c = torch.empty(m, n, device="cuda", dtype=typ)

    def run():
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.matmul(a, b, out=c)
    return run


def kernel_call(bench, config, cubin):
    """`config`'s launch (its cubin: bytes or a path) on `bench`'s problem, through its
    family's runner, on the legacy default stream."""
    from tuner.runtime.runners import runner_for

    cubin = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
    p = bench.problem
    bound = p.bind(runner_for(config, cubin), bench.dev)
    return lambda: p.run(bound)


def calls_for(benches, text, config, cubin):
    """name -> no-argument launch on the legacy default stream: ours, cuBLAS, torch."""
    bench = problem_for(benches, text, config)
    p = bench.problem
    calls = {"ours": kernel_call(bench, config, cubin), "cublas": bench.baseline_call()[0]}
    t = torch_call(config, (p.m, p.n, p.k)) if p.batch == 1 else None
    if t is not None:
        calls["torch"] = t
    return bench, calls


def child(argv) -> None:
    """Under ncu: each call once to warm up, then once each while profiling."""
    from tuner.runtime import driver

    text, name, cubin = argv
    config = config_from_name(name)
    _, calls = calls_for({}, text, config, Path(cubin).read_bytes())
    for fn in calls.values():
        fn()
    driver.synchronize()
    driver.call("cuProfilerStart")
    for fn in calls.values():
        fn()
        driver.synchronize()
    driver.call("cuProfilerStop")


def ncu(text, name, cubin_path: Path, out: Path) -> None:
    """Each run's report to kernel-profile-<shape>-<kernel>-<run>.txt."""
    from tuner.profile import ncu_path

    base = [ncu_path(), "--clock-control", "none", "--profile-from-start", "off"]
    me = [sys.executable, __file__, "--child", text, name, str(cubin_path)]
    runs = {"sections": [a for s in NCU_SECTIONS for a in ("--section", s)],
            "tensor": ["--metrics", NCU_TENSOR],
            # the warp-stall sampling by instruction (the "sections" run's WarpStateStats
            # asks for it: where a block's time goes, instruction fetch included)
            "stalls": ["--section", "SourceCounters", "--section", "WarpStateStats",
                       "--print-details", "all"]}
    for label, extra in runs.items():
        p = subprocess.run(base + extra + me, capture_output=True, text=True, timeout=300)
        path = out / f"kernel-profile-{text}-{name}-{label}.txt"
        path.write_text(p.stdout + "\n--- stderr ---\n" + p.stderr[-4000:])
        print(f"ncu {label}: rc {p.returncode}, {path}", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("SHAPE", "KERNEL"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--label", default="kernel-profile")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()

    from tuner.gpu import device

    dev = device()
    pairs = [(text, config_from_name(name)) for text, name in args.pair]
    built = {c.name: r for c, r in compile_many({c.name: c for _, c in pairs}.values(), dev.sm)}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, benches = [], {}
    for text, cfg in pairs:
        res = built[cfg.name]
        assert res.ok, res.error
        bench, calls = calls_for(benches, text, cfg, res.cubin)
        runs = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                runs[name].append(sustained(fn, args.seconds, bench.flops))
        row = dict(shape=text, kernel=cfg.name, registers=res.resources.registers, runs=runs)
        rows.append(row)
        for name, rs in runs.items():
            for r in rs:
                print(f"{text:>16} {name:<7} {r['tflops']:7.1f} TFLOP/s  {r['sm_mhz'] or 0:6.0f} MHz "
                      f"{r['watts'] or 0:6.0f} W  {r['tflops_per_ghz'] or 0:6.1f} TFLOP/s per GHz",
                      flush=True)
        if args.ncu:
            ncu(text, cfg.name, Path(res.cubin), args.out)
    data = dict(header(dev), benchmark="kernel_profile", seconds=args.seconds, rows=rows)
    print("wrote", write(args.label, data, args.out))


if __name__ == "__main__":
    main()
