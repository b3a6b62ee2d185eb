"""Timing a few candidates for a shape on first use, as the dispatch rule asks.

The candidates run on scratch operands of the problem's shape, layout, leading
dimensions, batch strides, alignment, C's type and bias (never the caller's data),
filled with random values (never zeros), on the
call's own stream once it has drained (a private stream measured the same launches
several microseconds slower on the H200, enough to flip the decision for the smallest
problems). Each is timed as a caller's loop sees it:
CUDA events around N back-to-back calls through the same route a call would take (so a
split-K kernel's second launch and cuBLAS's own host work count), N sized to about
`budget_ms`, after a warm-up loop, turn about for 5 rounds, median per call.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import statistics

import numpy as np

from codegen.config import DType
from tuner.runtime import driver

__all__ = ["time_candidates", "driver_operands", "torch_operands", "candidates", "decision",
           "MEASURE_TOP", "MEASURE_MARGIN"]

#: how many library kernels (best estimates first) a first-use measurement times beside cuBLAS
MEASURE_TOP = 3
#: a kernel must beat cuBLAS by this much in a first-use measurement to be chosen
MEASURE_MARGIN = 1.02

log = logging.getLogger(__name__)

_SEED_ELEMS = 1 << 18


def candidates(ranked: list[str]) -> list[str]:
    """The kernels a first-use measurement times beside cuBLAS: the MEASURE_TOP best
    estimates and the best-estimated kernel of one launch (where a host-bound call is
    decided)."""
    from codegen.config import config_from_name

    names = ranked[:MEASURE_TOP]
    single = [name for name in ranked if not config_from_name(name).reduce_pass]
    if single and single[0] not in names:
        names.append(single[0])
    return names


def decision(ms: dict[str, float], route: str) -> dict:
    """The table's decision from measured ms per call (kernel names and "cublas"): the
    fastest kernel if it beats cuBLAS by MEASURE_MARGIN, else cuBLAS (kernel None)."""
    kernels = [(t, name) for name, t in ms.items() if name != "cublas"]
    best = min(kernels) if kernels else None
    kernel = best[1] if best is not None and best[0] * MEASURE_MARGIN < ms["cublas"] else None
    log.info("dispatch measured (%s): %s", route, ms)
    return dict(kernel=kernel, route=route,
                measured_ms={name: round(t, 5) for name, t in ms.items()},
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def _fill(ptr: int, nbytes: int, rng) -> None:
    """Random values in [-1, 1) (read as any float type), doubled by device copies."""
    seed = rng.uniform(-1, 1, _SEED_ELEMS).astype(np.float16).view(np.uint8)
    first = min(nbytes, seed.nbytes)
    driver.call("cuMemcpyHtoD", ptr, seed.ctypes.data, first)
    done = first
    while done < nbytes:
        step = min(done, nbytes - done)
        driver.call("cuMemcpyDtoD", ptr + done, ptr, step)
        done += step


@contextlib.contextmanager
def driver_operands(g, problem):
    """(a, b, c, bias) pointers on cuMemAlloc'd scratch laid out as the caller's operands
    (problem.spans(): the bytes each spans, its batch included), each `problem.offsets`
    bytes past a 256-byte boundary as the caller's were; bias 0 where the problem has
    none. Freed on exit."""
    bufs, ptrs = [], []
    offsets = tuple(problem.offsets) + (0,)
    try:
        for size, off in zip(problem.spans(), offsets):
            if not size:
                ptrs.append(0)
                continue
            bufs.append(driver.Buffer(size + 256))
            _fill(bufs[-1].ptr, size + 256, np.random.default_rng(len(bufs)))
            ptrs.append(bufs[-1].ptr + off)
        yield tuple(ptrs)
    finally:
        driver.synchronize()
        bufs.clear()


#: the torch element type of each request's data (tf32 and 3xTF32 requests are fp32 data)
TORCH_DATA = {DType.F32: "float32", DType.TF32: "float32", DType.F32X3: "float32",
              DType.F16: "float16", DType.BF16: "bfloat16"}


@contextlib.contextmanager
def torch_operands(g, problem):
    """(A, B, C, bias) tensors for a torch caller, from torch's allocator on its current
    stream, laid out as the caller's are (problem.shapes: shapes and strides, a
    column-major operand a transposed view, a shared one a batch stride of 0; the same
    byte offset from a 256-byte boundary); bias None where the problem has none."""
    import torch

    out = []
    offsets = tuple(problem.offsets) + (0,)
    for geometry, off, name in zip(problem.shapes, offsets, problem.elements):
        if geometry is None:
            out.append(None)
            continue
        shape, strides = geometry
        typ = getattr(torch, name)
        skip = off // torch.empty((), dtype=typ).element_size()
        span = 1 + sum((d - 1) * st for d, st in zip(shape, strides))
        flat = torch.randn(skip + span, device=f"cuda:{g.index}", dtype=typ)
        out.append(flat.as_strided(shape, strides, skip))
    yield tuple(out)
    torch.cuda.current_stream(g.index).synchronize()


def time_candidates(g, runners: dict, stream: int, budget_ms: float = 4.0,
                    rounds: int = 5) -> dict[str, float]:
    """Median milliseconds per call of each runner (name -> callable(stream)) in loops on
    `stream`."""
    driver.sync(stream)
    start, end = driver.Event(), driver.Event()

    def loop(run, reps) -> float:
        start.record(stream)
        for _ in range(reps):
            run(stream)
        end.record(stream)
        end.synchronize()
        return end.since(start) / reps

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
    return {name: statistics.median(t) for name, t in times.items()}
