"""Timing a few candidates for a shape on first use, as the dispatch rule asks.

The candidates run on scratch buffers of the problem's shape, leading dimensions and
alignment (never the caller's data), filled with pseudo-random values (never zeros), on a
private stream after the device has drained, with CUDA events around each launch: one
warm-up, then repetitions until about `budget_ms` of work (3 to 25), median. The library
kernels and cuBLAS are timed turn about, so a clock change hits them alike.
"""

from __future__ import annotations

import statistics

import numpy as np

from tuner.runtime import driver

__all__ = ["time_candidates"]

_SEED_ELEMS = 1 << 18
_STREAMS: dict[int, int] = {}  # one private stream per GPU, kept (its scratch is keyed by it)


def _fill(cu, ptr: int, nbytes: int, rng) -> None:
    """Pseudo-random bytes of values in [-1, 1) (of the buffer's type), doubled by copies."""
    seed = rng.uniform(-1, 1, _SEED_ELEMS).astype(np.float16).view(np.uint8)
    first = min(nbytes, seed.nbytes)
    driver._check(cu.cuMemcpyHtoD(ptr, seed.ctypes.data, first), "cuMemcpyHtoD")
    done = first
    while done < nbytes:
        step = min(done, nbytes - done)
        driver._check(cu.cuMemcpyDtoD(ptr + done, ptr, step), "cuMemcpyDtoD")
        done += step


def time_candidates(g, runners: dict, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
                    in_size: int, offsets: tuple[int, int, int], budget_ms: float = 20.0
                    ) -> dict[str, float]:
    """Median milliseconds of each runner (name -> callable(a, b, c, stream)) on scratch
    operands: A m x k (leading dimension lda), B k x n, C m x n float32, each starting
    `offsets` bytes past a 256-byte boundary, as the caller's did."""
    cu = driver._cu()
    rng = np.random.default_rng(0)
    sizes = ((m - 1) * lda + k) * in_size, ((k - 1) * ldb + n) * in_size, ((m - 1) * ldc + n) * 4
    allocs, ptrs = [], []
    with driver.entered(g):
        driver._check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        try:
            for size, off in zip(sizes, offsets):
                p = int(driver._check(cu.cuMemAlloc(size + 256), "cuMemAlloc"))
                allocs.append(p)
                ptrs.append(p + off)
                _fill(cu, p, size + 256, rng)
            if g.index not in _STREAMS:  # non-blocking: no implicit sync with stream 0
                _STREAMS[g.index] = int(driver._check(cu.cuStreamCreate(1), "cuStreamCreate"))
            s = _STREAMS[g.index]
            start, end = (driver._check(cu.cuEventCreate(0), "cuEventCreate") for _ in "se")

            def once(run) -> float:
                driver._check(cu.cuEventRecord(start, s), "cuEventRecord")
                run(*ptrs, s)
                driver._check(cu.cuEventRecord(end, s), "cuEventRecord")
                driver._check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                return float(driver._check(cu.cuEventElapsedTime(start, end),
                                           "cuEventElapsedTime"))

            first = {name: once(run) for name, run in runners.items()}  # warm-up
            reps = int(min(25, max(3, budget_ms / max(min(first.values()), 1e-3))))
            times = {name: [] for name in runners}
            for _ in range(reps):
                for name, run in runners.items():
                    times[name].append(once(run))
            for ev in (start, end):
                driver._check(cu.cuEventDestroy(ev), "cuEventDestroy")
        finally:
            driver._check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            for p in allocs:
                cu.cuMemFree(p)
    return {name: statistics.median(t) for name, t in times.items()}
