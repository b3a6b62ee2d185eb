"""Programmatic dependent launch (PDL), measured: what a small GEMM costs the GPU back to
back, each launch overlapping the end of the kernel before it (as the library launches a
kernel of the current templates) and without, beside cuBLAS and torch.

    python bench/launch_overlap.py [--pairs FILE] [--out DIR]

A pairs file names "MxNxK kernel" per line (default bench/pairs/small-gemms.txt: the GPT-2
rows of bench/model_gemms.py that trailed torch on the GPU alone). Every kernel of the
templates starts with dependent_launch_begin() (macros.cu.j2: griddepcontrol.wait, then
griddepcontrol.launch_dependents), and its runner launches it with programmatic stream
serialization (driver.DEPENDENT_MARKER). Timed, each as tuner.runtime.measure.
time_candidates times a first use (a loop, and the same calls queued behind a held
stream: the GPU's time alone, back to back):
  ours           the kernel as the library launches it (cuLaunchKernelEx, PDL)
  ours, no pdl   the same cubin launched with cuLaunchKernel (its wait then a no-op)
  cublas         cuBLAS (tuner.bench's baseline: the GEMM alone, without bias or activation)
  torch          F.linear(x, W, bias) and the activation (NT), or torch.matmul
Then each call alone, as a benchmark's timer and a program's forward see it:
  isolated       CUDA events around one call after the L2 is evicted by a read
                 (bench/wgmma_vs_cublas.Timer, the per-GEMM timer of model_gemms.py and
                 layouts_epilogues.py), median of its repetitions
  kernel         the same calls' kernels' own durations (CUPTI through torch.profiler, the
                 flush's kernels left out): what is left of `isolated` is launch latency
Each kernel is checked against float64 first (tuner.bench's gate, through its runner).
Writes launch-overlap-<gpu>-<date>.json under --out (default bench/results).

The probe that led here (results/launch-overlap-probe-58461c1-*: the wait put in by hand
before the templates had it) found the wait alone free (ours 4.51 us, with the wait 4.52)
and the launch with PDL 0.7-1.2 us faster a call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, problem_for, write  # noqa: E402
from kernel_profile import torch_call  # noqa: E402
from codegen import compile_many  # noqa: E402
from codegen.config import DType, config_from_name  # noqa: E402


def kernel_call(bench, cfg, cubin: bytes, pdl: bool = True):
    """`cfg`'s launch on `bench`'s problem through its family's runner, on the legacy
    default stream; with pdl=False its kernels launch without programmatic stream
    serialization."""
    from tuner.runtime.runners import runner_for

    runner = runner_for(cfg, cubin)
    if not pdl:
        for image in (runner.main, getattr(runner, "reduce", None),
                      getattr(runner, "prep", None)):
            if image is not None:
                image.dependent = False
    p = bench.problem
    bound = p.bind(runner, bench.dev)
    return lambda: p.run(bound)


def torch_linear(cfg, shape):
    """F.linear(x, W, bias) and the activation, x (M x K) and W (N x K) in the input type
    (an NT problem with C of the input type), or torch_call's torch.matmul; None otherwise."""
    import torch
    import torch.nn.functional as F

    from codegen.families._common import Variant

    v = Variant.of(cfg)
    if v.act == "none" and v.bias == "none":
        return torch_call(cfg, shape)
    if v.layout.value != "nt" or v.out is not cfg.dtype or v.bias == "f32":
        return None
    typ = {DType.F16: torch.float16, DType.BF16: torch.bfloat16}[cfg.dtype]
    m, n, k = shape
    x, w = (torch.randn(m, k, device="cuda", dtype=typ),
            torch.randn(n, k, device="cuda", dtype=typ))
    b = torch.randn(n, device="cuda", dtype=typ) if v.bias == "out" else None
    act = {"none": lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[v.act]
    return lambda: act(F.linear(x, w, b))


def one_call(timer, fn, reps: int = 50) -> dict:
    """us per call of `fn` timed alone (the docstring's isolated and kernel)."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    def kernels(body) -> dict:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        out = {}
        for a in prof.key_averages():
            t = getattr(a, "device_time_total", None) or getattr(a, "cuda_time_total", 0.0)
            if t:
                out[a.key] = (a.count, t)
        return out

    flush_names = set(kernels(lambda: [timer.flush() for _ in range(3)]))

    def flushed_calls():
        for _ in range(reps):
            timer.flush()
            fn()

    ours = {k: v for k, v in kernels(flushed_calls).items() if k not in flush_names}
    return dict(isolated=round(statistics.median(timer(fn)) * 1e3, 2),
                kernel=round(sum(t for _, t in ours.values()) / reps, 2),
                kernels=sorted(ours))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(HERE / "pairs" / "small-gemms.txt"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch

    from tuner.gpu import device
    from tuner.runtime import driver, measure
    from wgmma_vs_cublas import Timer

    pairs = [line.split() for line in open(args.pairs) if line.strip() and not line.startswith("#")]
    dev = device()
    g = driver.gpu(0)
    configs = {name: config_from_name(name) for _, name in pairs}
    built = {c.name: r for c, r in compile_many(list(configs.values()), dev.sm)}
    rows, benches, timer = [], {}, Timer(torch)
    print(f"{'shape':>16} {'kernel':<58} us a call on the GPU alone (in a loop)")
    for shape, name in pairs:
        cfg, r = configs[name], built[name]
        assert r.ok, f"{name}: {r.log[-2000:]}"
        cubin = Path(r.cubin).read_bytes()
        assert driver.DEPENDENT_MARKER in cubin, f"{name}: its kernels do not wait"
        bench = problem_for(benches, shape, cfg)
        m = bench.measure(cfg, cubin)
        if m.outcome.value != "timed":
            raise RuntimeError(f"{name}: {m.outcome.value} {m.message}")
        calls = {"ours": kernel_call(bench, cfg, cubin),
                 "ours, no pdl": kernel_call(bench, cfg, cubin, pdl=False),
                 "cublas": bench.baseline_call()[0]}
        t = torch_linear(cfg, tuple(int(x) for x in shape.split("x")))
        if t is not None:
            calls["torch"] = t
        loop, alone = measure.time_candidates(g, {k: (lambda st, f=f: f()) for k, f in
                                                  calls.items()}, 0, flush=False)
        us = {k: round(v * 1e3, 2) for k, v in alone.items()}
        single = {k: one_call(timer, f) for k, f in calls.items()}
        rows.append(dict(shape=shape, kernel=name, baseline=bench.baseline_label,
                         error=m.error, gpu_alone_us=us,
                         loop_us={k: round(v * 1e3, 2) for k, v in loop.items()},
                         alone_us=single))
        print(f"{shape:>16} {name:<58} " + "  ".join(
            f"{k} {us.get(k, float('nan')):5.2f} ({loop[k] * 1e3:5.2f})" for k in calls), flush=True)
        print(f"{'':>16} alone (isolated / kernel): " + "  ".join(
            f"{k} {v['isolated']:5.2f} / {v['kernel']:5.2f}"
            for k, v in single.items()), flush=True)
    doc = dict(benchmark="launch-overlap", **header(dev), rows=rows)
    print(write("launch-overlap", doc, args.out))


if __name__ == "__main__":
    main()
