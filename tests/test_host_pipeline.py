"""The host pipeline's schedule (tuner.runtime.host), on a driver whose streams run late.

`LateStreams` queues every copy and GEMM on its stream and runs queued work only when its
scheduler gets to it, in a random order across streams (in order on each, after the events
each waits for), while the CPU goes on. A schedule that refills a pinned or device buffer
before the work reading it has run, or reads a result before the work writing it has,
gives a wrong C here: each run below is checked against float64, C poisoned first.
"""

import ctypes
import types
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.runtime import driver, host


class LateStreams:
    """The driver calls host.py makes, on host memory, with streams that run late."""

    def __init__(self, rng, pace: float, ranked: bool):
        self.rng, self.pace = rng, pace  # pace: how often the GPU moves on during a call
        #: ranked: of the streams that may go on, the one of highest rank (drawn when the
        #: stream is made) always goes first, which drives one stream far ahead of others
        self.ranked, self.rank = ranked, {}
        self.now, self.when = 0.0, {}  # a clock that each op run moves by 1 ms; event times
        self.keep = []  # every allocation, alive until the test ends
        self.queues: dict[int, deque] = {}
        self.events: dict[int, list[int]] = {}  # id -> [records queued, records run]
        self.gemms = []  # (rows, k, beta) of each GEMM run

    def call(self, name, *args):
        out = getattr(self, name)(*args)
        for _ in range(self.rng.binomial(2, self.pace)):  # the GPU moves on meanwhile
            self._step()
        return out

    def sync(self, stream):
        while self.queues[stream]:
            self._step()

    # ---- memory
    def alloc(self, size):
        buf = np.full(size, 0xFF, np.uint8)  # NaN in every float
        self.keep.append(buf)
        return buf.ctypes.data

    def cuMemHostAlloc(self, size, flags):
        return self.alloc(size)

    def cuMemFreeHost(self, ptr):
        pass

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, s):
        self.queues[s].append(lambda: ctypes.memmove(dst, src, nbytes))

    cuMemcpyDtoHAsync = cuMemcpyHtoDAsync

    # ---- streams and events
    def cuStreamCreate(self, flags):
        s = 100 + len(self.queues)
        self.queues[s], self.rank[s] = deque(), self.rng.random()
        return s

    def cuEventCreate(self, flags):
        e = 1000 + len(self.events)
        self.events[e] = [0, 0]
        return e

    def cuEventDestroy(self, e):
        pass

    def cuEventRecord(self, e, s):
        self.events[e][0] += 1
        gen = self.events[e][0]
        def record():
            self.events[e][1] = max(self.events[e][1], gen)
            self.when[e] = self.now

        self.queues[s].append(record)

    def cuEventElapsedTime(self, start, end):
        return self.when[end] - self.when[start]

    def cuStreamWaitEvent(self, s, e, flags):
        self.queues[s].append(("wait", e, self.events[e][0]))

    def cuEventSynchronize(self, e):
        while self.events[e][1] < self.events[e][0]:
            self._step()

    def _ready(self, s):
        head = self.queues[s][0]
        return not isinstance(head, tuple) or self.events[head[1]][1] >= head[2]

    def _step(self):
        """Run the head of one stream of those that may go on."""
        ready = [s for s, q in self.queues.items() if q and self._ready(s)]
        if not ready:
            assert not any(self.queues.values()), "the streams wait forever"
            return
        pick = max(ready, key=self.rank.get) if self.ranked else \
            ready[self.rng.integers(len(ready))]
        head = self.queues[pick].popleft()
        if not isinstance(head, tuple):
            head()
            self.now += 1.0


def _floats(ptr, count):
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr))


class _Plan:
    def __init__(self, fake, rows, k, n):
        self.fake, self.rows, self.k, self.n = fake, rows, k, n

    def run(self, a, b, c, alpha, beta, s, bias=0):
        rows, k, n = self.rows, self.k, self.n

        def gemm():
            A = _floats(a, rows * k).reshape(rows, k).astype(np.float64)
            B = _floats(b, k * n).reshape(k, n).astype(np.float64)
            C = _floats(c, rows * n).reshape(rows, n)
            acc = alpha * (A @ B) + (beta * C if beta else 0.0)
            C[...] = acc
            self.fake.gemms.append((rows, k, beta))

        self.fake.queues[s].append(gemm)


class _Scratch:
    def __init__(self, fake):
        self.fake, self.bufs = fake, {}

    def get(self, g, stream, purpose, nbytes, **kw):
        have = self.bufs.get((stream, purpose))
        if have is None or have[1] < nbytes:
            self.bufs[stream, purpose] = have = (self.fake.alloc(nbytes), nbytes)
        return have[0]


@pytest.fixture(params=[(pace, ranked) for pace in (0.02, 0.3, 0.9) for ranked in (0, 1)],
                ids=lambda p: f"pace{p[0]}-{'ranked' if p[1] else 'random'}")
def late(monkeypatch, request):
    fake = LateStreams(np.random.default_rng(), *request.param)
    scratch = _Scratch(fake)
    monkeypatch.setattr(driver, "call", fake.call)
    monkeypatch.setattr(driver, "sync", fake.sync)
    monkeypatch.setattr(driver, "scratch", lambda: scratch)
    monkeypatch.setattr(host, "_PINNED", host.Pinned())
    monkeypatch.setattr(host, "_STREAMS", {})
    # small enough that a test's matrices make many chunks, a block and K-slices
    monkeypatch.setattr(host, "ROW_GRAIN", 8)
    monkeypatch.setattr(host, "K_GRAIN", 8)
    monkeypatch.setattr(host, "B_SLICE_BYTES", 1000)
    monkeypatch.setattr(host, "BLOCK_MIN_B_BYTES", 4096)
    monkeypatch.setattr(host, "BLOCK_STEP_BYTES", 6000)
    return fake


def _run(fake, m, n, k, alpha, beta, c_layout="rows", **kw):
    """C = alpha A B + beta C through run_pipelined, against float64. `c_layout`: C's
    memory, "rows" (one run of memory), "view" (the first n columns of a wider array, whose
    other columns must stay as they were) or "fortran" (column-major)."""
    rng = np.random.default_rng()
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C0 = rng.standard_normal((m, n), dtype=np.float32)
    wide = np.full((m, n + 5), 7.0, np.float32)
    C = wide[:, :n] if c_layout == "view" else np.empty((m, n), np.float32,
                                                         order="F" if c_layout == "fortran" else "C")
    C[...] = C0 if beta else np.nan
    plans = []

    def chunk_plan(rows, kk=None):
        plans.append((rows, kk))
        return _Plan(fake, rows, k if kk is None else kk, n)

    host.run_pipelined(types.SimpleNamespace(index=0), chunk_plan, A, B, C, alpha, beta, **kw)
    ref = alpha * (A.astype(np.float64) @ B) + (beta * C0.astype(np.float64) if beta else 0)
    assert not any(fake.queues.values())
    assert np.linalg.norm(C - ref) / np.linalg.norm(ref) <= 1e-6
    assert (wide[:, n:] == 7.0).all()
    return plans


@pytest.mark.parametrize("repeat", range(3))
def test_a_large_b_goes_up_behind_a_k_outer_first_block(late, repeat):
    """B of 9 KiB (over the block's threshold here): rows [0, 96) are summed over K-slices
    as they come up, the other 97 rows in chunks after them; the block's C comes down
    between those chunks."""
    m, n, k = 193, 48, 50
    block = host.plan_block(m, n, k, 4)
    assert block is not None
    top, slices = block
    assert top == 96 and len(slices) >= 2
    plans = _run(late, m, n, k, 0.5, 0.0, k_slices=True)
    assert [p for p in plans if p[1] is not None] == [(top, k1 - k0) for k0, k1 in slices]
    betas = [b for rows, kk, b in late.gemms if kk != k]
    assert betas == [0.0] + [1.0] * (len(slices) - 1)
    assert sum(rows for rows, kk, _ in late.gemms if kk == k) == m - top


@pytest.mark.parametrize("repeat", range(2))
@pytest.mark.parametrize("kw", [dict(k_slices=False), dict(k_slices=True, beta=2.0),
                                dict(k_slices=True, chunks=[(0, 193)])],
                         ids=["no-k-slices", "beta", "one-chunk"])
def test_row_chunks_alone_where_the_sum_must_not_be_split(late, repeat, kw):
    """Without k_slices (a 2-byte C, a bias, an activation), with beta != 0 (C comes up
    with A) and on the sequential path, every GEMM is over all of K."""
    kw = dict(kw)
    beta = kw.pop("beta", 0.0)
    plans = _run(late, 193, 48, 50, 0.5, beta, **kw)
    assert all(kk is None for _, kk in plans)
    assert sum(rows for rows, _, _ in late.gemms) == 193


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("beta", [0.0, 2.0])
@pytest.mark.parametrize("c_layout", ["view", "fortran"])
def test_a_c_whose_rows_are_not_one_run_of_memory(late, pinned, beta, c_layout):
    """C a column slice of a wider array, or column-major: each chunk of C goes through a
    buffer of its own both ways, never as if C[r0:r1] were contiguous (on the pageable path
    that wrote C's rows over the wider array's other columns, and read beta's C wrong)."""
    _run(late, 193, 48, 50, 0.5, beta, c_layout, pinned_staging=pinned)


def test_pageable_copies_take_no_block(late):
    plans = _run(late, 193, 48, 50, 1.0, 0.0, k_slices=True, pinned_staging=False)
    assert all(kk is None for _, kk in plans)


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 200_000), n=st.integers(1, 50_000), k=st.integers(1, 50_000),
       elem=st.sampled_from([2, 4]))
def test_block_rows_and_slices(m, n, k, elem):
    block = host.plan_block(m, n, k, elem)
    if k * n * elem < host.BLOCK_MIN_B_BYTES:
        assert block is None
        return
    if block is None:  # too few rows for half of them to make a block, or K one slice
        assert (min(m // 2, host.BLOCK_C_BYTES // (4 * n)) < host.ROW_GRAIN
                or k <= host.K_GRAIN or k * (n + host.ROW_GRAIN) * elem <= host.BLOCK_STEP_BYTES)
        return
    top, slices = block
    assert top % host.ROW_GRAIN == 0 and host.ROW_GRAIN <= top <= m // 2
    assert top * n * 4 <= host.BLOCK_C_BYTES
    assert len(slices) >= 2 and slices[0][0] == 0 and slices[-1][1] == k
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
    widths = [k1 - k0 for k0, k1 in slices]
    assert all(w % host.K_GRAIN == 0 for w in widths[:-1]) and 0 < widths[-1] <= widths[0]
    # at most BLOCK_STEP_BYTES of A and B staged a slice, unless one grain is more
    assert widths[0] == host.K_GRAIN or widths[0] * (n + top) * elem <= host.BLOCK_STEP_BYTES


def _host_timeline():
    """bench/host_timeline.py, imported from the bench folder."""
    import importlib
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("host_timeline")


def test_the_timeline_bench_traces_every_copy_gemm_and_staging(late):
    """bench/host_timeline.py on the late streams: a span for every copy up and down, every
    GEMM and every staging copy, each on its lane, and C still right."""
    host_timeline = _host_timeline()

    m, n, k = 193, 48, 50
    top, slices = host.plan_block(m, n, k, 4)
    rest = host.plan_chunks(m - top, n, k, 4)
    rng = np.random.default_rng()
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C = np.full((m, n), np.nan, np.float32)
    origin_stream = driver.call("cuStreamCreate", 1)
    origin = driver.call("cuEventCreate", 0)
    driver.call("cuEventRecord", origin, origin_stream)
    driver.call("cuEventSynchronize", origin)
    copy_rows = host.copy_rows
    with host_timeline.instrumented(driver, host) as (spans, traced):
        host.run_pipelined(types.SimpleNamespace(index=0),
                           lambda rows, kk=None: traced(_Plan(late, rows, kk or k, n)),
                           A, B, C, 1.0, 0.0, k_slices=True)
    assert driver.call == late.call and host.copy_rows is copy_rows  # put back
    spans = host_timeline.resolve(driver, spans, origin, 0.0)
    ref = A.astype(np.float64) @ B
    assert np.linalg.norm(C - ref) / np.linalg.norm(ref) <= 1e-6
    count = lambda what: sum(s[1] == what for s in spans)  # noqa: E731
    pieces = -(-top // (rest[0][1] - rest[0][0]))
    assert count("GEMM") == len(slices) + len(rest)
    assert count("H2D") == 2 * len(slices) + len(rest)
    assert count("D2H") == len(rest) + pieces
    assert count("staging") >= 2 * len(slices) + len(rest)
    assert {s[0] for s in spans} <= {"CPU", "stream 0", "stream 1", "stream 2"}
    assert all(0 <= s[2] <= s[3] for s in spans if s[0] != "CPU")
    assert 0 < host_timeline.summary(spans)["gemm_share"] <= 1


def test_the_timeline_summary_counts_overlaps_once_and_lists_gaps():
    host_timeline = _host_timeline()

    spans = [("CPU", "staging", 0.0, 3.0, 1), ("stream 0", "H2D", 1.0, 2.0, 1),
             ("stream 0", "GEMM", 2.0, 4.0, 0), ("stream 1", "GEMM", 3.0, 5.0, 0),
             ("CPU", "staging", 5.5, 6.0, 1), ("stream 1", "GEMM", 7.0, 8.0, 0)]
    s = host_timeline.summary(spans)
    assert s["total_ms"] == 8.0
    assert s["busy_ms"]["stream 0 GEMM"] == 2.0 and s["busy_ms"]["stream 1 GEMM"] == 3.0
    assert s["gemm_share"] == 4.0 / 8.0  # [2, 5] and [7, 8]
    assert s["gaps"] == [dict(start_ms=0.0, ms=2.0, cpu_busy_ms=2.0),
                         dict(start_ms=5.0, ms=2.0, cpu_busy_ms=0.5)]
