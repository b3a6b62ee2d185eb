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
non-pipelined path's bit for bit where a tuned kernel runs (but see the first block
below). cuBLAS, where it runs, is bound to the chunk's stream.

Every chunk's GEMM needs all of B, so a large B's upload would be a prefix that nothing
hides (at 16384^3 fp32 on the H200: B's 1 GiB took 53 ms of a 225 ms pipeline). Where B is
large (plan_block) and the product may be summed in parts (fp32 C, beta 0, no bias or
activation), a first block of rows, half of M, goes first and K-outer: B and the block's
A go up slice of K by slice of K, and the block's GEMM over each slice runs as soon as that
slice is up (C += A[:, slice] B[slice], C kept on the GPU), so the GPU starts on B's first
slice instead of after all of it. The chunks of the other half follow, and the block's C
comes down between them. The block's rows are then summed in a different order from the
plain path (each slice's sum rounded to fp32 before the next is added, as a split-K
kernel does): within the precision gate, not bit for bit; the chunks after it are exact.

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
import itertools
import os
import threading

import numpy as np

from tuner.runtime import driver

__all__ = ["plan_chunks", "plan_block", "Pinned", "pinned", "run_pipelined", "run_batch",
           "STREAMS", "B_SLICE_BYTES"]

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
#: a B of at least this many bytes goes up K-slice by K-slice behind a first block of rows
#: (plan_block)
BLOCK_MIN_B_BYTES = 256 << 20
#: at most this many bytes of fp32 C in that block (it stays on the GPU until the block ends)
BLOCK_C_BYTES = 1 << 30
#: bytes of A and B staged per K-slice of the block
BLOCK_STEP_BYTES = 64 << 20
#: K-slices are a multiple of this many columns wide (alignment kept, whole k-tiles)
K_GRAIN = 64
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


def plan_block(m: int, n: int, k: int, elem: int) -> tuple[int, list[tuple[int, int]]] | None:
    """(rows R, K-slices [k0, k1)) of the first block of a pipelined product whose B is
    large (BLOCK_MIN_B_BYTES or more), or None: rows [0, R) are summed slice by slice as B's
    slices arrive. R is half of M (at most BLOCK_C_BYTES of fp32 C), a multiple of
    ROW_GRAIN; a slice stages about BLOCK_STEP_BYTES of A's and B's columns and rows, and
    is a multiple of K_GRAIN wide (the last one excepted), so that every slice of A and B
    keeps the operands' alignment. At least two slices, or None."""
    if k * n * elem < BLOCK_MIN_B_BYTES:
        return None
    rows = min(m // 2, BLOCK_C_BYTES // (4 * n)) // ROW_GRAIN * ROW_GRAIN
    if rows < ROW_GRAIN:
        return None
    want = max(K_GRAIN, BLOCK_STEP_BYTES // ((n + rows) * elem) // K_GRAIN * K_GRAIN)
    steps = -(-k // want)
    if steps < 2:
        return None
    width = -(-(-(-k // steps)) // K_GRAIN) * K_GRAIN
    return rows, [(k0, min(k, k0 + width)) for k0 in range(0, k, width)]


def run_pipelined(g, chunk_plan, A: np.ndarray, B: np.ndarray, C: np.ndarray, alpha: float,
                  beta: float, chunks: list[tuple[int, int]] | None = None,
                  pinned_staging: bool = True, bias: int = 0, k_slices: bool = False) -> None:
    """C = alpha A B + beta C for host arrays, pipelined over row chunks (module doc).
    `chunk_plan(rows, k=None)` returns the plan (same kernel) for a chunk of that many
    packed rows of A (of `k` columns, a K-slice, where given); without `pinned_staging` the
    copies go straight from pageable memory (the pitfall the benchmark shows). `bias`: the
    device pointer of a bias vector (the plan's epilogue applies it with its activation),
    or 0. `k_slices`: the product may be summed over K-slices (fp32 C, no bias or
    activation), which lets a large B's upload overlap a first block's compute (module
    doc)."""
    m, k = A.shape
    n = B.shape[1]
    chunks = chunks or plan_chunks(m, n, k, A.itemsize)
    block = None
    if k_slices and beta == 0 and pinned_staging and len(chunks) > 1:
        block = plan_block(m, n, k, A.itemsize)
    streams = _streams(g)
    scratch = driver.scratch()
    dB = scratch.get(g, streams[0], "host B", B.nbytes)
    pB = _view(_PINNED.get(g, "B", B.nbytes), k, n, B.dtype) if pinned_staging else None
    if block is None:
        items = [(r0, r1, True) for r0, r1 in chunks]
        _stage_b(streams[0], B, dB, pB, len(chunks) > 1)
    else:
        top, slices = block
        items = _after_block(m, n, k, A.itemsize, top)
        dBlock = scratch.get(g, streams[0], "host C block", top * n * C.itemsize)
        block_done = _run_block(g, chunk_plan, A, B, dB, pB, dBlock, top, slices, alpha,
                                streams[1], streams[2])
    # B is up once the stream that copied it gets here: every other stream waits for that
    b_ready = driver.call("cuEventCreate", 2)  # disable timing
    up = streams[0] if block is None else streams[1]
    driver.call("cuEventRecord", b_ready, up)
    rows_max = max(r1 - r0 for r0, r1, _ in items)
    # C's chunks go through buffers of their own (pinned, or pageable where C is a view
    # whose rows are not one run of memory), copied into C as each chunk comes down
    staged = pinned_staging or not C.flags.c_contiguous
    slots = []
    for s in streams:
        if s != up:
            driver.call("cuStreamWaitEvent", s, b_ready, 0)
        slots.append(_Slot(s, driver.call("cuEventCreate", 2)))

    try:
        for t, (r0, r1, gemm) in enumerate(items):
            slot = slots[t % STREAMS]
            slot.drain()  # its buffers are free again once its last chunk is out
            rows, s = r1 - r0, slot.stream
            dC = scratch.get(g, s, "host C", rows_max * n * C.itemsize)
            if pinned_staging:
                pc = _view(_PINNED.get(g, f"C{t % STREAMS}", rows_max * n * C.itemsize),
                           rows, n, C.dtype)
            elif C.flags.c_contiguous:
                pc = C[r0:r1]
            else:  # C's rows are not one run of memory (a view): staged in pageable memory
                pc = np.empty((rows, n), C.dtype)
            if not gemm:  # rows of the first block: its C comes down once it is summed
                driver.call("cuStreamWaitEvent", s, block_done, 0)
                driver.call("cuMemcpyDtoHAsync", pc.ctypes.data, dBlock + r0 * n * C.itemsize,
                            pc.nbytes, s)
            else:
                dA = _chunk_up(g, s, t % STREAMS, A[r0:r1], C[r0:r1] if beta else None,
                               rows_max, pc if staged else None, dC, pinned_staging)
                chunk_plan(rows).run(dA, dB, dC, alpha, beta, s, bias)
                driver.call("cuMemcpyDtoHAsync", pc.ctypes.data, dC, pc.nbytes, s)
            driver.call("cuEventRecord", slot.event, s)
            slot.pending = (C[r0:r1], pc) if staged else None
        for slot in slots:
            slot.drain()
    finally:
        for slot in slots:
            driver.sync(slot.stream)
            driver.call("cuEventDestroy", slot.event)
        driver.call("cuEventDestroy", b_ready)
        if block is not None:
            driver.call("cuEventDestroy", block_done)


def _after_block(m: int, n: int, k: int, elem: int, top: int) -> list[tuple[int, int, bool]]:
    """The pipeline's items after a first block of `top` rows: (r0, r1, GEMM?) of the other
    rows' chunks, each followed by a piece of the block's rows whose C comes down (no
    GEMM), as long as there are pieces."""
    rest = [(top + r0, top + r1, True) for r0, r1 in plan_chunks(m - top, n, k, elem)]
    size = rest[0][1] - rest[0][0]
    out = [(r0, min(top, r0 + size), False) for r0 in range(0, top, size)]
    return [x for pair in itertools.zip_longest(rest, out) for x in pair if x]


def _chunk_up(g, s: int, slot: int, A: np.ndarray, C: np.ndarray | None, rows_max: int,
              pc: np.ndarray | None, dC: int, pinned_staging: bool) -> int:
    """A chunk's rows of A (and of C, where given: beta != 0) copied up on stream `s`:
    A through slot `slot`'s pinned buffer unless `pinned_staging` is off, C through its
    staging buffer `pc` where it has one (None: C's rows go up from C itself, one run of
    memory); returns A's device buffer."""
    rows, k = A.shape
    dA = driver.scratch().get(g, s, "host A", rows_max * k * A.itemsize)
    if pinned_staging:
        pa = _view(_PINNED.get(g, f"A{slot}", rows_max * k * A.itemsize), rows, k, A.dtype)
        copy_rows(pa, A)
    else:
        pa = np.ascontiguousarray(A)
    driver.call("cuMemcpyHtoDAsync", dA, pa.ctypes.data, pa.nbytes, s)
    if C is not None:
        if pc is None:
            pc = C
        else:
            copy_rows(pc, C)
        driver.call("cuMemcpyHtoDAsync", dC, pc.ctypes.data, pc.nbytes, s)
    return dA


def _stage_b(stream: int, B: np.ndarray, dB: int, pB: np.ndarray | None, sliced: bool) -> None:
    """B up once, on `stream`. Pipelined (`sliced`), B is staged in slices, each copied up
    while the CPU stages the next; the one-chunk path, the sequential baseline, stages it
    whole; without pinned staging (`pB` None) it goes straight from pageable memory."""
    k, n = B.shape
    row_bytes = n * B.itemsize
    step = max(1, B_SLICE_BYTES // max(1, row_bytes)) if sliced and pB is not None else k
    src = np.ascontiguousarray(B) if pB is None else pB
    for r0 in range(0, k, step):
        r1 = min(k, r0 + step)
        if pB is not None:
            copy_rows(pB[r0:r1], B[r0:r1])
        driver.call("cuMemcpyHtoDAsync", dB + r0 * row_bytes, src[r0:r1].ctypes.data,
                    (r1 - r0) * row_bytes, stream)


def _run_block(g, chunk_plan, A, B, dB, pB, dBlock, rows, slices, alpha, copy: int,
               compute: int) -> int:
    """The first block, rows [0, `rows`), summed over K-slices as B comes up: slice i of B
    and the same columns of the block's A are staged (pinned) and copied up on stream
    `copy`, and the block's GEMM over that slice runs on stream `compute` once they are up
    (beta 1 after the first slice) while the CPU stages slice i + 1. C stays on the GPU
    (`dBlock`); B ends on the GPU whole (the row chunks after the block need it). Three
    slots of A's columns rotate: a slot's pinned buffer is refilled once its last copy up
    is done, its device buffer once the GEMM that read it is. Returns an event recorded
    after the block's last GEMM (the caller destroys it)."""
    scratch, elem, n = driver.scratch(), A.itemsize, B.shape[1]
    width = slices[0][1] - slices[0][0]
    copied = [driver.call("cuEventCreate", 2) for _ in range(STREAMS)]
    used = [driver.call("cuEventCreate", 2) for _ in range(STREAMS)]
    try:
        for i, (k0, k1) in enumerate(slices):
            j, w = i % STREAMS, k1 - k0
            pa = _view(_PINNED.get(g, f"A slice {j}", rows * width * elem), rows, w, A.dtype)
            dA = scratch.get(g, copy, f"host A slice {j}", rows * width * elem)
            if i >= STREAMS:
                driver.call("cuEventSynchronize", copied[j])
                driver.call("cuStreamWaitEvent", copy, used[j], 0)
            copy_rows(pB[k0:k1], B[k0:k1])
            copy_rows(pa, A[:rows, k0:k1])
            driver.call("cuMemcpyHtoDAsync", dB + k0 * n * elem, pB[k0:k1].ctypes.data,
                        pB[k0:k1].nbytes, copy)
            driver.call("cuMemcpyHtoDAsync", dA, pa.ctypes.data, pa.nbytes, copy)
            driver.call("cuEventRecord", copied[j], copy)
            driver.call("cuStreamWaitEvent", compute, copied[j], 0)
            chunk_plan(rows, w).run(dA, dB + k0 * n * elem, dBlock, alpha, 1.0 if i else 0.0,
                                    compute, 0)
            driver.call("cuEventRecord", used[j], compute)
        done = driver.call("cuEventCreate", 2)
        driver.call("cuEventRecord", done, compute)
        return done
    finally:
        for e in copied + used:
            driver.call("cuEventDestroy", e)


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
