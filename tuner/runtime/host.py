"""Host-resident GEMMs: numpy operands, with the copies hidden behind the compute.

A product whose A, B and C are all in host memory runs as a pipeline over chunks of A's
and C's rows (B goes over once):

    chunk t:  A rows -> pinned buffer (CPU)  ->  H2D  ->  GEMM  ->  D2H  ->  C rows (CPU)

Chunk t runs on stream t mod 3, so the H2D copy of chunk t+1 and the D2H copy of chunk
t-1 overlap the GEMM of chunk t, and the CPU fills the next pinned buffer meanwhile.
Page-locked (pinned) staging buffers and device buffers are kept per GPU and reused; an
event after each chunk's D2H says when its buffers may be filled again. Every chunk runs
the kernel the whole problem was decided for (its rows are independent: the same kernel
sums each element of C in the same order whatever M is), so the result equals the
non-pipelined path's bit for bit where a tuned kernel runs. cuBLAS, where it runs, is
bound to the chunk's stream.

`gemm_batch` does the same over a list of (A, B) pairs, one GEMM per slot.

From pageable memory the driver's "asynchronous" copies are synchronous: the staging
through pinned buffers is what makes the overlap possible (bench/host_overlap.py shows
the same pipeline without it). The staging copies themselves are split across a few
threads (numpy releases the GIL while it copies): one thread copied about 7 GB/s on the
H200's host, under what the link carries.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import dataclasses
import functools
import os
import threading

import numpy as np

from tuner.runtime import driver

__all__ = ["plan_chunks", "Pinned", "pinned", "run_pipelined", "run_batch", "STREAMS",
           "B_SLICE_BYTES"]

#: streams (and buffer slots) of the pipeline: chunk t runs on stream t % STREAMS
STREAMS = 3
#: rows per chunk are a multiple of this (every tile height divides it), unless M is smaller
ROW_GRAIN = 256


def plan_chunks(m: int, n: int, k: int, elem: int, target_bytes: int = 64 << 20,
                min_chunks: int = 2 * STREAMS, max_chunks: int = 64) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) covering 0..m in order: about `target_bytes` of A and C rows
    each, at least `min_chunks` of them where M allows (so that copies and compute
    overlap from the start), at most `max_chunks`, each a multiple of ROW_GRAIN rows but
    the last."""
    if m <= ROW_GRAIN:
        return [(0, m)]
    row_bytes = k * elem + n * 4
    want = min(max(min_chunks, -(-m * row_bytes // target_bytes)), max_chunks)
    rows = max(ROW_GRAIN, m // want // ROW_GRAIN * ROW_GRAIN)
    if -(-m // rows) > max_chunks:
        rows = -(-m // max_chunks)
        rows = -(-rows // ROW_GRAIN) * ROW_GRAIN
    return [(r0, min(m, r0 + rows)) for r0 in range(0, m, rows)]


#: B's slices when pipelined: each is copied up while the CPU stages the next
B_SLICE_BYTES = 32 << 20
#: threads that copy between pageable arrays and pinned buffers
COPY_THREADS = max(1, min(8, (os.cpu_count() or 1) // 2))


@functools.cache
def _copiers() -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="gemm-tune-copy")


def copy_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, split by rows across the copy threads when it is large."""
    rows = dst.shape[0]
    parts = min(COPY_THREADS, max(1, dst.nbytes >> 20), rows)  # 1 MiB or more a thread
    if parts == 1:
        np.copyto(dst, src)
        return
    step = -(-rows // parts)
    list(_copiers().map(lambda r: np.copyto(dst[r:r + step], src[r:r + step]),
                        range(0, rows, step)))


class Pinned:
    """Page-locked host buffers per (GPU, purpose), grown by doubling and kept."""

    def __init__(self):
        self._bufs: dict[tuple, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def get(self, g, purpose: str, nbytes: int) -> np.ndarray:
        """A uint8 view of at least `nbytes` of pinned memory."""
        key = (g.index, purpose)
        with self._lock:
            have = self._bufs.get(key)
            if have is None or have[1] < nbytes:
                size = max(nbytes, 2 * have[1] if have else 0, 1 << 20)
                ptr = int(driver.call("cuMemHostAlloc", size, 0))
                if have is not None:
                    driver.call("cuMemFreeHost", have[0])
                self._bufs[key] = have = (ptr, size)
        return np.ctypeslib.as_array((ctypes.c_uint8 * have[1]).from_address(have[0]))


_PINNED = Pinned()
_STREAMS: dict[int, list[int]] = {}


def pinned() -> Pinned:
    return _PINNED


def _streams(g) -> list[int]:
    if g.index not in _STREAMS:
        _STREAMS[g.index] = [int(driver.call("cuStreamCreate", 1)) for _ in range(STREAMS)]
    return _STREAMS[g.index]


def _view(buf: np.ndarray, rows: int, cols: int, dtype) -> np.ndarray:
    return buf[: rows * cols * np.dtype(dtype).itemsize].view(dtype).reshape(rows, cols)


@dataclasses.dataclass
class _Slot:
    """One stream of the pipeline, its event, and the copy out it still owes."""

    stream: int
    event: object
    pending: tuple | None = None  # (destination, pinned source) to copy once the event is

    def drain(self) -> None:
        """Wait for this slot's last work and copy its result out: its buffers are free."""
        if self.pending is not None:
            driver.call("cuEventSynchronize", self.event)
            copy_rows(*self.pending)
            self.pending = None


def run_pipelined(g, chunk_plan, A: np.ndarray, B: np.ndarray, C: np.ndarray, alpha: float,
                  beta: float, chunks: list[tuple[int, int]] | None = None,
                  pinned_staging: bool = True, bias: int = 0) -> None:
    """C = alpha A B + beta C for host arrays, pipelined over row chunks (module doc).
    `chunk_plan(rows)` returns the plan (same kernel) for a chunk of that many rows;
    without `pinned_staging` the copies go straight from pageable memory (the pitfall the
    benchmark shows). `bias`: the device pointer of a bias vector (the plan's epilogue
    applies it with its activation), or 0."""
    m, k = A.shape
    n = B.shape[1]
    chunks = chunks or plan_chunks(m, n, k, A.itemsize)
    rows_max = max(r1 - r0 for r0, r1 in chunks)
    streams = _streams(g)
    scratch = driver.scratch()
    # B once, on the first stream; the others wait for it. Pipelined, B is staged in
    # slices, each copied up while the CPU stages the next (every chunk's GEMM needs all of
    # B, so this prefix is not hidden behind compute otherwise); the one-chunk path, the
    # sequential baseline, stages it whole.
    dB = scratch.get(g, streams[0], "host B", B.nbytes)
    if pinned_staging:
        pB = _view(_PINNED.get(g, "B", B.nbytes), k, n, B.dtype)
        step = max(1, B_SLICE_BYTES // max(1, n * B.itemsize)) if len(chunks) > 1 else k
    else:
        pB, step = np.ascontiguousarray(B), k
    row_bytes = n * B.itemsize
    for r0 in range(0, k, step):
        r1 = min(k, r0 + step)
        if pinned_staging:
            copy_rows(pB[r0:r1], B[r0:r1])
        driver.call("cuMemcpyHtoDAsync", dB + r0 * row_bytes, pB[r0:r1].ctypes.data,
                    (r1 - r0) * row_bytes, streams[0])
    b_ready = driver.call("cuEventCreate", 2)  # disable timing
    driver.call("cuEventRecord", b_ready, streams[0])
    slots = []
    for i, s in enumerate(streams):
        if i:
            driver.call("cuStreamWaitEvent", s, b_ready, 0)
        slots.append(_Slot(s, driver.call("cuEventCreate", 2)))

    try:
        for t, (r0, r1) in enumerate(chunks):
            slot = slots[t % STREAMS]
            slot.drain()  # its buffers are free again once its last chunk is out
            rows, s = r1 - r0, slot.stream
            dA = scratch.get(g, s, "host A", rows_max * k * A.itemsize)
            dC = scratch.get(g, s, "host C", rows_max * n * C.itemsize)
            if pinned_staging:
                pa = _view(_PINNED.get(g, f"A{t % STREAMS}", rows_max * k * A.itemsize),
                           rows, k, A.dtype)
                pc = _view(_PINNED.get(g, f"C{t % STREAMS}", rows_max * n * C.itemsize),
                           rows, n, C.dtype)
                copy_rows(pa, A[r0:r1])
                if beta != 0:
                    copy_rows(pc, C[r0:r1])
            else:
                pa, pc = np.ascontiguousarray(A[r0:r1]), C[r0:r1]
            driver.call("cuMemcpyHtoDAsync", dA, pa.ctypes.data, pa.nbytes, s)
            if beta != 0:
                driver.call("cuMemcpyHtoDAsync", dC, pc.ctypes.data, pc.nbytes, s)
            chunk_plan(rows).run(dA, dB, dC, alpha, beta, s, bias)
            driver.call("cuMemcpyDtoHAsync", pc.ctypes.data, dC, pc.nbytes, s)
            driver.call("cuEventRecord", slot.event, s)
            slot.pending = (C[r0:r1], pc) if pinned_staging else None
        for slot in slots:
            slot.drain()
    finally:
        for slot in slots:
            driver.sync(slot.stream)
            driver.call("cuEventDestroy", slot.event)
        driver.call("cuEventDestroy", b_ready)


def run_batch(g, items: list, alpha: float, beta: float) -> None:
    """Each (plan, A, B, C) of host arrays as one GEMM, item i on stream i mod 3 with its
    own pinned and device buffers, so that item i+1's copies in and item i-1's copy out
    overlap item i's GEMM."""
    streams = _streams(g)
    scratch = driver.scratch()
    slots = [_Slot(s, driver.call("cuEventCreate", 2)) for s in streams]

    try:
        for i, (plan, A, B, C) in enumerate(items):
            slot = slots[i % STREAMS]
            slot.drain()
            s, j = slot.stream, i % STREAMS
            staged = []
            for name, x, dtype in (("A", A, A.dtype), ("B", B, B.dtype), ("C", C, C.dtype)):
                buf = _view(_PINNED.get(g, f"batch {name}{j}", x.nbytes), *x.shape, dtype)
                d = scratch.get(g, s, f"batch {name}", x.nbytes)
                if name != "C" or beta != 0:
                    copy_rows(buf, x)
                    driver.call("cuMemcpyHtoDAsync", d, buf.ctypes.data, x.nbytes, s)
                staged.append((buf, d))
            (_, dA), (_, dB), (pc, dC) = staged
            plan.run(dA, dB, dC, alpha, beta, s)
            driver.call("cuMemcpyDtoHAsync", pc.ctypes.data, dC, pc.nbytes, s)
            driver.call("cuEventRecord", slot.event, s)
            slot.pending = (C, pc)
        for slot in slots:
            slot.drain()
    finally:
        for slot in slots:
            driver.sync(slot.stream)
            driver.call("cuEventDestroy", slot.event)
