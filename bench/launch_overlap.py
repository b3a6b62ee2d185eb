"""Programmatic dependent launch (PDL), measured before it is built: what a small GEMM
costs the GPU back to back, as the kernels stand and with each kernel's launch allowed to
overlap the end of the one before it, beside cuBLAS and torch.

    python bench/launch_overlap.py [--pairs FILE] [--out DIR]

A pairs file names "MxNxK kernel" per line (default bench/pairs/small-gemms.txt: the GPT-2
rows of bench/model_gemms.py that trailed torch on the GPU alone). Each kernel is built
twice from the working tree's templates: as it is, and with `griddepcontrol.wait` (no
global memory is touched before the kernel before it has completed and its writes are
visible) and `griddepcontrol.launch_dependents` (the next such kernel may start launching)
put in front of the main kernel's body (and its split-K reduce kernel's). Timed, each as
tuner.runtime.measure.time_candidates times a first use (a loop, and the same calls queued
behind a held stream: the GPU's time alone, back to back):
  ours        the kernel as it is, launched as the library launches it (cuLaunchKernel)
  ours+wait   the waiting build, launched the same way (what the wait costs by itself)
  ours+pdl    the waiting build, launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
              SERIALIZATION (the next call's launch overlaps this one's end)
  cublas      cuBLAS (tuner.bench's baseline: the GEMM alone, without bias or activation)
  torch       F.linear(x, W, bias) and the activation (NT), or torch.matmul
Every build is checked against float64 first (tuner.bench's gate). Writes
launch-overlap-<gpu>-<date>.json under --out (default bench/results).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, problem_for, write  # noqa: E402
from kernel_profile import kernel_call, torch_call  # noqa: E402
from codegen.compile import compile_source, target_arch  # noqa: E402
from codegen.config import DType, config_from_name  # noqa: E402
from codegen.rendering import render  # noqa: E402

WAIT = ('    asm volatile("griddepcontrol.wait;" ::: "memory");\n'
        '    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n')


def waiting_source(src: str, name: str) -> str:
    """`src` with WAIT first in the body of kernel `name` and of `name`_reduce."""
    out = src
    for kernel in (name, f"{name}_reduce"):
        m = re.search(rf"\n{re.escape(kernel)}\([^{{]*?\)\s*\{{\n", out)
        if m is None:
            if kernel == name:
                raise ValueError(f"no body of {kernel} in its source")
            continue
        out = out[:m.end()] + WAIT + out[m.end():]
    return out


def pdl_launch():
    """A stand-in for cuLaunchKernel that launches with programmatic stream serialization."""
    from tuner.runtime import driver

    cu = driver.api()
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        lc = cu.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = gx, gy, gz
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = bx, by, bz
        lc.sharedMemBytes = smem
        lc.hStream = cu.CUstream(stream)
        lc.attrs = [attr]
        lc.numAttrs = 1
        return cu.cuLaunchKernelEx(lc, f, params, 0)
    return launch


def pdl_call(bench, cfg, cubin):
    """kernel_call's launch with every launch of the runner made through pdl_launch."""
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    launch = pdl_launch()
    runner = runner_for(cfg, cubin)
    for image in (runner.main, getattr(runner, "reduce", None)):
        if image is None:
            continue

        def image_launch(f, grid, block, stream, address, image=image):
            err, = launch(f, *grid, *block, image.smem, stream, address, 0)
            if err != 0:
                image.failed(err)
        image.launch = image_launch
    real = driver.launch_function
    driver.launch_function = lambda name: launch  # the inlined launch of Runner.bind
    try:
        p = bench.problem
        bound = p.bind(runner, bench.dev)
    finally:
        driver.launch_function = real
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(HERE / "pairs" / "small-gemms.txt"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from tuner.gpu import device
    from tuner.runtime import driver, measure

    pairs = [line.split() for line in open(args.pairs) if line.strip() and not line.startswith("#")]
    dev = device()
    g = driver.gpu(0)
    rows, benches = [], {}
    print(f"{'shape':>16} {'kernel':<58} {'us a call on the GPU alone (loop)':>40}")
    for shape, name in pairs:
        cfg = config_from_name(name)
        src = render(cfg)
        arch = target_arch(cfg, dev.sm)
        built = {"ours": compile_source(src, arch, name),
                 "wait": compile_source(waiting_source(src, name), arch, name)}
        for key, r in built.items():
            assert r.ok, f"{name} ({key}): {r.log[-2000:]}"
        cubins = {key: Path(r.cubin).read_bytes() for key, r in built.items()}
        bench = problem_for(benches, shape, cfg)
        for key, cubin in cubins.items():
            m = bench.measure(cfg, cubin)
            if m.outcome.value != "timed":
                raise RuntimeError(f"{name} ({key}): {m.outcome.value} {m.message}")
        calls = {"ours": kernel_call(bench, cfg, cubins["ours"]),
                 "ours+wait": kernel_call(bench, cfg, cubins["wait"]),
                 "ours+pdl": pdl_call(bench, cfg, cubins["wait"]),
                 "cublas": bench.baseline_call()[0]}
        t = torch_linear(cfg, tuple(int(x) for x in shape.split("x")))
        if t is not None:
            calls["torch"] = t
        loop, alone = measure.time_candidates(g, {k: (lambda st, f=f: f()) for k, f in
                                                  calls.items()}, 0)
        us = {k: round(v * 1e3, 2) for k, v in alone.items()}
        rows.append(dict(shape=shape, kernel=name, baseline=bench.baseline_label,
                         gpu_alone_us=us, loop_us={k: round(v * 1e3, 2) for k, v in loop.items()}))
        print(f"{shape:>16} {name:<58} " + "  ".join(
            f"{k} {us.get(k, float('nan')):5.2f} ({loop[k] * 1e3:5.2f})" for k in calls), flush=True)
    doc = dict(benchmark="launch-overlap", **header(dev), rows=rows)
    print(write("launch-overlap", doc, args.out))


if __name__ == "__main__":
    main()
