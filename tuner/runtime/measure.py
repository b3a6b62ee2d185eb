"""Timing a few candidates for a shape on first use, as the dispatch rule asks.

The candidates run on scratch operands of the problem's shape, leading dimensions and
alignment (never the caller's data), filled with random values (never zeros), on the
call's own stream once it has drained (a private stream measured the same launches
several microseconds slower on the H200, enough to flip the decision for the smallest
problems). Each is timed as a caller's loop sees it:
CUDA events around N back-to-back calls through the same route a call would take (so a
split-K kernel's second launch and cuBLAS's own host work count), N sized to about
`budget_ms`, after a warm-up loop, turn about for 5 rounds, median per call.
"""

from __future__ import annotations

import contextlib
import statistics

import numpy as np

from tuner.runtime import driver

__all__ = ["time_candidates", "driver_operands", "torch_operands"]

_SEED_ELEMS = 1 << 18


def _sizes(m, n, k, lda, ldb, ldc, in_size):
    return ((m - 1) * lda + k) * in_size, ((k - 1) * ldb + n) * in_size, ((m - 1) * ldc + n) * 4


def _fill(cu, ptr: int, nbytes: int, rng) -> None:
    """Random values in [-1, 1) (read as any float type), doubled by device copies."""
    seed = rng.uniform(-1, 1, _SEED_ELEMS).astype(np.float16).view(np.uint8)
    first = min(nbytes, seed.nbytes)
    driver._check(cu.cuMemcpyHtoD(ptr, seed.ctypes.data, first), "cuMemcpyHtoD")
    done = first
    while done < nbytes:
        step = min(done, nbytes - done)
        driver._check(cu.cuMemcpyDtoD(ptr + done, ptr, step), "cuMemcpyDtoD")
        done += step


@contextlib.contextmanager
def driver_operands(g, m, n, k, lda, ldb, ldc, in_size, offsets):
    """(a, b, c) pointers on cuMemAlloc'd scratch, each `offsets` bytes past a 256-byte
    boundary as the caller's were; freed on exit."""
    cu = driver._cu()
    allocs, ptrs = [], []
    try:
        for size, off in zip(_sizes(m, n, k, lda, ldb, ldc, in_size), offsets):
            p = int(driver._check(cu.cuMemAlloc(size + 256), "cuMemAlloc"))
            allocs.append(p)
            ptrs.append(p + off)
            _fill(cu, p, size + 256, np.random.default_rng(len(allocs)))
        yield tuple(ptrs)
    finally:
        driver._check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for p in allocs:
            cu.cuMemFree(p)


@contextlib.contextmanager
def torch_operands(g, m, n, k, lda, ldb, ldc, dtype_name, offsets):
    """(A, B, C) tensors for a torch caller, from torch's allocator on its current stream,
    laid out as a caller's are (rows of `ld` elements, `cols` used, the same byte offset
    from a 256-byte boundary)."""
    import torch

    dt = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16,
          "bf16": torch.bfloat16}[dtype_name]
    out = []
    for (rows, cols, ld), off, t in zip(((m, k, lda), (k, n, ldb), (m, n, ldc)), offsets,
                                        (dt, dt, torch.float32)):
        skip = off // torch.empty((), dtype=t).element_size()
        flat = torch.randn(skip + rows * ld, device=f"cuda:{g.index}", dtype=t)
        out.append(flat[skip:].view(rows, ld)[:, :cols])
    yield tuple(out)
    torch.cuda.current_stream(g.index).synchronize()


def time_candidates(g, runners: dict, stream: int, budget_ms: float = 4.0,
                    rounds: int = 5) -> dict[str, float]:
    """Median milliseconds per call of each runner (name -> callable(stream)) in loops on
    `stream`."""
    cu = driver._cu()
    driver.sync(stream)
    start, end = (driver._check(cu.cuEventCreate(0), "cuEventCreate") for _ in "se")

    def loop(run, reps) -> float:
        driver._check(cu.cuEventRecord(start, stream), "cuEventRecord")
        for _ in range(reps):
            run(stream)
        driver._check(cu.cuEventRecord(end, stream), "cuEventRecord")
        driver._check(cu.cuEventSynchronize(end), "cuEventSynchronize")
        return float(driver._check(cu.cuEventElapsedTime(start, end),
                                   "cuEventElapsedTime")) / reps

    try:
        # warm-up: a first call (cuBLAS picks its algorithm, kernels load, clocks rise),
        # then one whole loop each, discarded: on the H200 the first loop of a shape still
        # ran up to 3x slower than the later ones
        first = {name: loop(run, 1) for name, run in runners.items()}
        reps = {name: int(min(100, max(2, budget_ms / max(t, 1e-4))))
                for name, t in first.items()}
        for name, run in runners.items():
            loop(run, reps[name])
        times: dict[str, list] = {name: [] for name in runners}
        for _ in range(rounds):
            for name, run in runners.items():
                times[name].append(loop(run, reps[name]))
    finally:
        for ev in (start, end):
            cu.cuEventDestroy(ev)
    return {name: statistics.median(t) for name, t in times.items()}
