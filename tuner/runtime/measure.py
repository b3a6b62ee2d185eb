"""Timing a few candidates for a case on first use, as the dispatch rule asks.

The candidates run as the caller's call would run them: through the same route (a torch
caller's through lib.gemm itself, so cuBLAS is torch.matmul / addmm / bmm on torch's
current stream and a kernel pays the call's whole host path; anyone else's through the
plan's launcher, cuBLAS through gemm-tune's binding, tuner/runtime/cublas.py), on
scratch operands of the problem's shape, layout, leading dimensions, batch strides,
byte offsets (so the same alignment), C's type and bias (never the caller's data, nor
its C), filled with random values (never zeros), B rotated through copies that together
pass the L2 (each call reads the next: a program's weights come from DRAM, where a loop
over one B would time it from the L2), on the call's own stream once it has
drained (a private stream measured the same launches several microseconds slower on the
H200, enough to flip the decision for the smallest problems). Each is timed as a
caller's loop sees it: CUDA events around N back-to-back calls (so a split-K kernel's
second launch and cuBLAS's own host work count), N sized to about `budget_ms`, after a
warm-up loop, turn about for 5 rounds, median per call. That is the call's cost where the
host sets the pace (a small problem's loop); where the GPU does (a program whose host runs
ahead), its cost is the GPU's time alone, so each candidate is also timed with the calls
queued behind a kernel that keeps the stream busy meanwhile (driver.spin), each call
then run after the tuner's L2 flush, with events around it alone. A bucket of Ms is timed
at its smallest and its largest M (tuner.runtime.dispatch), and `decision` weighs the
four figures (two Ms, two paces): at each M a kernel must beat cuBLAS in both, or save
more time in one than it costs in the other.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import statistics
import time
from typing import Callable

import numpy as np

from codegen.config import DType
from tuner.runtime import driver

__all__ = ["time_candidates", "driver_operands", "torch_operands", "candidates", "decision",
           "b_copies", "rotation", "MEASURE_TOP", "MEASURE_MARGIN", "GPU_LOSS_MAX", "PACES"]

#: how many library kernels (best estimates first) a first-use measurement times beside cuBLAS
MEASURE_TOP = 3
#: a kernel must beat cuBLAS by this much in a first-use measurement to be chosen
MEASURE_MARGIN = 1.02
#: with pace "either", the most a kernel may cost the GPU alone, over cuBLAS's time there,
#: for what it saves in the caller's loop: a program whose GPU sets the pace (CUDA graphs,
#: torch.compile, a host that runs ahead) pays the GPU's time and gets none of the host's
GPU_LOSS_MAX = 1.05
#: what a program says sets its pace (load_library(..., pace=...), GEMM_TUNE_PACE): "either"
#: (unknown: both figures weighed), "gpu" (its host runs ahead, as under CUDA graphs: only
#: the GPU's time alone counts), "host" (only the caller's loop counts)
PACES = ("either", "gpu", "host")
#: the most calls queued behind a held stream (their launches wait in its queue), and the
#: longest it is held (ms)
HELD_CALLS = 32
HOLD_MS = 50.0
#: tries at a held loop (the second with a hold of twice the first's queueing time: a host
#: that paused once, a collection or another thread, still gets the GPU's time measured)
HELD_ATTEMPTS = 2
#: a loop whose calls took the host less than this fraction of their time to issue was
#: paced by the GPU: its time per call is the GPU's, and no held loop is run
GPU_BOUND = 0.5
#: a loop that the GPU paced gives the GPU's time alone as it is only where its calls take at
#: least this long (ms); a shorter call's GPU-alone figure is timed after an L2 flush (below)
FLUSHED_BELOW_MS = 0.2
#: B's copies together span at least this many times the L2 (DESIGN's timing contract: inputs
#: rotated among buffers of at least 3x the L2), and there are at most ROTATE_MAX of them (a
#: B so small that more would be needed is read in a few microseconds from anywhere)
ROTATE_L2 = 3
ROTATE_MAX = 64

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


def decision(at: dict[int, dict[str, float]], route: str,
             device: dict[int, dict[str, float]] | None = None, pace: str = "either") -> dict:
    """The table's decision from ms per call measured at one or two Ms of a bucket: `at`,
    M -> {kernel name or "cublas": ms} in the caller's loop, and `device`, M -> the same
    of the GPU's time alone (empty or None where it was not measured).

    A kernel must hold against cuBLAS at every M measured: it wins every figure there by
    MEASURE_MARGIN; or it wins one by the margin and is slower in none (a cheaper launch at
    cuBLAS's GPU time: on the H200 a decode kernel at 3x4096x4096 fp16, 20.5 against 26.8 us
    in the loop, 15.6 against 15.6 on the GPU alone, which this rule turned down until
    2026-12-04); or it wins one and loses the other (a cheaper launch but a slower GPU time,
    or the reverse: which one a call pays depends on whether its program's host or its GPU
    sets the pace), the most time it can lose, by the margin, is less than the most it can
    save, and its GPU time alone is at most GPU_LOSS_MAX times cuBLAS's (on the H200 the
    host-time trade chose kernels 15-40% slower on the GPU for GPT-2's 128-token linears,
    which a GPU-paced forward then paid in full). Of the kernels that hold, the one of the
    least regret runs: at each M, the most it falls behind the best option (cuBLAS included)
    in any figure, over the best loop time there (with pace "gpu", the best GPU time); the
    most over the Ms. With none, cuBLAS (kernel None). A kernel not measured at every M (it
    could not take the operands there) is no candidate. Where the GPU's time alone was to be
    measured (`device` given) and was not at some M (the host could not queue the calls
    behind a hold), no kernel runs: the loop there was the host's pace, which tells nothing
    of what a kernel costs the GPU (on the H200, fp16 1024^3: kernels 1.35x-1.6x slower than
    cuBLAS on the GPU alone tied it in such loops, 15.2-15.8 against 15.4-16.4 us a call).

    `pace` (PACES): with "gpu" only the GPU's time alone is weighed (not measured: no
    kernel runs); with "host" only the caller's loop; "either" weighs both as above."""
    weighs_gpu = pace == "gpu" or (pace == "either" and device is not None)
    device = device or {}
    unmeasured = weighs_gpu and not all(device.get(m) for m in at)

    def figures(m: int) -> list[dict]:
        if pace == "gpu":
            return [device[m]]
        return [at[m]] + ([device[m]] if device.get(m) and pace == "either" else [])

    def measured(name: str) -> bool:
        return all(name in x for m in at for x in figures(m))

    def holds(name: str) -> bool:
        for m in at:
            xs = figures(m)
            wins = [x[name] * MEASURE_MARGIN < x["cublas"] for x in xs]
            if all(wins):
                continue
            loss = max(x[name] - x["cublas"] for x in xs)
            gain = max(x["cublas"] - x[name] for x in xs)
            if loss <= 0.0:  # slower in no figure: it holds where it wins one by the margin
                if not any(wins):
                    return False
            elif not loss * MEASURE_MARGIN < gain:
                return False
            if pace == "either" and device.get(m) \
                    and device[m][name] > GPU_LOSS_MAX * device[m]["cublas"]:
                return False
        return True

    def regret(name: str) -> float:
        worst = 0.0
        for m in at:
            xs = figures(m)
            behind = max(x[name] - min(x.values()) for x in xs)
            worst = max(worst, behind / max(min(xs[0].values()), 1e-9))
        return worst

    names = [] if unmeasured else [name for name in at[max(at)]
                                   if name != "cublas" and measured(name)]
    kernel = min((name for name in names if holds(name)), key=regret, default=None)
    log.info("dispatch measured (%s): %s, on the GPU alone %s", route, at, device)
    lo, hi = min(at), max(at)
    d = dict(kernel=kernel, route=route, measured_m=[lo, hi],
             measured_ms={name: round(t, 5) for name, t in at[hi].items()})
    if lo != hi:
        d["measured_ms_low"] = {name: round(t, 5) for name, t in at[lo].items()}
    if device.get(hi):
        d["device_ms"] = {name: round(t, 5) for name, t in device[hi].items()}
    if lo != hi and device.get(lo):
        d["device_ms_low"] = {name: round(t, 5) for name, t in device[lo].items()}
    if unmeasured:
        d["gpu_alone"] = "not measured"
    if pace != "either":
        d["pace"] = pace
    d["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return d


def b_copies(g, b_span: int) -> int:
    """How many copies of a B of `b_span` bytes a first-use measurement rotates through on
    GPU g: enough to span ROTATE_L2 times its L2 (so that each call reads its B from DRAM,
    as a program reads its weights), at most ROTATE_MAX; 1 for a B that alone spans that."""
    if b_span <= 0:
        return 1
    return max(1, min(ROTATE_MAX, -(-ROTATE_L2 * int(g.l2_bytes) // b_span)))


def rotation(copies) -> Callable:
    """next(): the copies in turn, round and round (one rotation per candidate)."""
    return itertools.cycle(copies).__next__


def _pitch(span: int) -> int:
    """Bytes from one copy of an operand to the next: its span rounded up to 256 (so every
    copy keeps the caller's offset from a 256-byte boundary)."""
    return -(-span // 256) * 256


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
    """(a, bs, c, bias) pointers on cuMemAlloc'd scratch laid out as the caller's operands
    (problem.spans(): the bytes each spans, its batch included), each `problem.offsets`
    bytes past a 256-byte boundary as the caller's were; bs the b_copies() copies of B (a
    tuple); bias 0 where the problem has none. Freed on exit."""
    bufs, ptrs = [], []
    offsets = tuple(problem.offsets) + (0,)
    try:
        for i, (size, off) in enumerate(zip(problem.spans(), offsets)):
            if not size:
                ptrs.append(0)
                continue
            copies = b_copies(g, size) if i == 1 else 1
            pitch = _pitch(size)
            bufs.append(driver.Buffer(copies * pitch + 256))
            _fill(bufs[-1].ptr, copies * pitch + 256, np.random.default_rng(len(bufs)))
            at = tuple(bufs[-1].ptr + j * pitch + off for j in range(copies))
            ptrs.append(at if i == 1 else at[0])
        yield tuple(ptrs)
    finally:
        driver.synchronize()
        bufs.clear()


#: the torch element type of each request's data (tf32 and 3xTF32 requests are fp32 data)
TORCH_DATA = {DType.F32: "float32", DType.TF32: "float32", DType.F32X3: "float32",
              DType.F16: "float16", DType.BF16: "bfloat16"}


@contextlib.contextmanager
def torch_operands(g, problem):
    """(A, Bs, C, bias) tensors for a torch caller, from torch's allocator on its current
    stream, laid out as the caller's are (problem.shapes: shapes and strides, a
    column-major operand a transposed view, a shared one a batch stride of 0; the same
    byte offset from a 256-byte boundary); Bs the b_copies() copies of B (a tuple of views
    of one allocation); bias None where the problem has none."""
    import torch

    out = []
    offsets = tuple(problem.offsets) + (0,)
    for i, (geometry, off, name) in enumerate(zip(problem.shapes, offsets, problem.elements)):
        if geometry is None:
            out.append(None)
            continue
        shape, strides = geometry
        typ = getattr(torch, name)
        size = torch.empty((), dtype=typ).element_size()
        skip = off // size
        span = 1 + sum((d - 1) * st for d, st in zip(shape, strides))
        copies = b_copies(g, span * size) if i == 1 else 1
        pitch = _pitch((skip + span) * size) // size
        flat = torch.randn(copies * pitch, device=f"cuda:{g.index}", dtype=typ)
        views = tuple(flat.as_strided(shape, strides, j * pitch + skip) for j in range(copies))
        out.append(views if i == 1 else views[0])
    yield tuple(out)
    torch.cuda.current_stream(g.index).synchronize()


class _Flush:
    """driver.L2Flush on GPU g, made at its first call: a first use that runs no held loop
    (every candidate's loop paced by the GPU) allocates no flush buffer (twice the L2)."""

    def __init__(self, g):
        self.g, self.flush = g, None

    def __call__(self, stream: int) -> None:
        if self.flush is None:
            self.flush = driver.L2Flush(self.g)
        self.flush(stream)


class _Loops:
    """time_candidates' two ways of timing `reps` calls of a runner on `stream`: `loop`, a
    caller's loop in its steady state (and the host's ms a call to issue it, kept in
    `host` by name); `held`, the same calls queued behind `hold`, each after `flush` and
    timed alone by events around it where a flush is given, back to back otherwise (the
    GPU's time alone, or None where the host outlasted the hold twice)."""

    def __init__(self, stream: int, hold, clock):
        self.stream, self.hold, self.clock = stream, hold, clock
        self.start, self.end = driver.Event(), driver.Event()
        self.starts = [driver.Event() for _ in range(HELD_CALLS)]
        self.ends = [driver.Event() for _ in range(HELD_CALLS)]
        self.host: dict[str, float] = {}  # ms of host time a call takes to issue

    def loop(self, run, reps, name=None) -> float:
        stream, start, end = self.stream, self.start, self.end
        run(stream)  # in flight when the clock starts
        t0 = self.clock()
        start.record(stream)
        for _ in range(reps):
            run(stream)
        end.record(stream)
        if name is not None:
            self.host[name] = (self.clock() - t0) * 1e3 / reps
        end.synchronize()
        return end.since(start) / reps

    def held(self, run, reps, host_ms, name, flush=None) -> float | None:
        stream = self.stream
        if flush:
            starts, ends = self.starts[:reps], self.ends[:reps]
        else:
            starts, ends = [self.start], [self.end]
        ms = min(HOLD_MS, 1.0 + 3.0 * reps * host_ms)  # ample time to queue the calls
        for attempt in range(HELD_ATTEMPTS):
            self.hold(stream, ms)
            t0 = self.clock()
            if flush:
                for start, end in zip(starts, ends):
                    flush(stream)
                    start.record(stream)
                    run(stream)
                    end.record(stream)
            else:
                starts[0].record(stream)
                for _ in range(reps):
                    run(stream)
                ends[0].record(stream)
            queued_ms = (self.clock() - t0) * 1e3
            ends[-1].synchronize()
            if queued_ms < ms:
                return sum(end.since(start) for start, end in zip(starts, ends)) / reps
            log.info("queueing %d calls of %s took %.2f ms, past the %.2f ms hold%s", reps,
                     name, queued_ms, ms, "" if attempt + 1 < HELD_ATTEMPTS
                     else ": no GPU-alone times")
            ms = min(HOLD_MS, 1.0 + 2.0 * queued_ms)  # a pause of the host's: a longer hold
        return None


def time_candidates(g, runners: dict, stream: int, budget_ms: float = 4.0, rounds: int = 5,
                    hold=None, clock=time.perf_counter,
                    flush=None) -> tuple[dict[str, float], dict[str, float]]:
    """(loop, device): median milliseconds per call of each runner (name -> callable(stream))
    on `stream`: `loop` in loops as a caller's loop runs in its steady state; `device` the
    GPU's time alone: the same calls queued behind a kernel that keeps the stream busy
    meanwhile (`hold`(stream, ms), default driver.spin on GPU g), then run one after
    another, each after `flush`(stream) (default driver.L2Flush on GPU g: the tuner's), with
    CUDA events around each call alone (False: no flush, the calls back to back, events
    around them all). So the GPU-alone figure is the tuner's and the benchmarks', each call
    after the L2 is flushed of A, C and the code, and after a kernel of another op: back to
    back, a kernel launched with programmatic dependent launch overlaps its start with its
    own previous call's end, which cuBLAS does not (on the H200 a 64x64 wgmma kernel at
    128x1024x1024 took 4.7 us a call so, against cuBLAS's 4.5, and 6.1 against 4.4 when
    each call came alone), and with A warm in the L2 a 128x128 kernel at 2048x1024x4096 was
    1.02x cuBLAS's time where the flushed rows of bench/model_gemms.py read 1.14x. `device`
    is empty where the host took longer to queue the calls than the hold lasted (a call
    that waits for the GPU, say). Where the host issued a loop's calls in less than
    GPU_BOUND of their time and a call took at least FLUSHED_BELOW_MS, the GPU set its pace
    and what the L2 holds is a small part of a call: the loop's time is the GPU's, and no
    held loop is run (a large problem's first use costs no more for it).

    Each loop starts its clock with a call already in flight, so the host's start-up (the
    first call's issue, which the GPU would wait for) is not counted: on a GPU-bound loop
    the clock sees the calls back to back, on a host-bound one the host's rate; either way
    what a caller's loop sees. The number of calls per loop is sized from a warm loop, not
    from a first call (which includes cuBLAS choosing its algorithm and a kernel's load:
    sized from it, a loop of cuBLAS ran 2-4 calls and counted the issue of the first)."""
    if hold is None:
        def hold(st, ms):
            driver.spin(g, st, int(ms * 1e6))
    if flush is None:
        flush = _Flush(g)
    driver.sync(stream)
    timing = _Loops(stream, hold, clock)
    loop, held, host = timing.loop, timing.held, timing.host

    # warm-up: a first call (cuBLAS picks its algorithm, kernels load, clocks rise), then a
    # short loop each (sizing the loops), then one whole loop each, discarded: on the H200
    # the first loop of a shape still ran up to 3x slower than the later ones
    for run in runners.values():
        run(stream)
    warm = {name: loop(run, 3) for name, run in runners.items()}
    reps = {name: int(min(100, max(3, budget_ms / max(t, 1e-4)))) for name, t in warm.items()}
    for name, run in runners.items():
        loop(run, reps[name], name)
    times: dict[str, list] = {name: [] for name in runners}
    device: dict[str, list] | None = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            t = loop(run, reps[name], name)
            times[name].append(t)
            if device is None:
                continue
            if host[name] < GPU_BOUND * t and t >= FLUSHED_BELOW_MS:  # the GPU's pace
                device[name].append(t)
                continue
            if flush and "flush" not in host:  # the host's time to issue a flush
                loop(flush, 3, "flush")
            t = held(run, min(reps[name], HELD_CALLS), host[name] + host.get("flush", 0.0),
                     name, flush)
            if t is None:
                device = None
            else:
                device[name].append(t)
    return ({name: statistics.median(t) for name, t in times.items()},
            {} if device is None else {name: statistics.median(t) for name, t in device.items()})
