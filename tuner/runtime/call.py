"""The call path of Library.gemm: operands -> memoised plan -> launch on the caller's stream.

A plan is made once per call key, which for torch tensors is the tuple of what a call
reads off them anyway (dtypes, shapes, strides, devices and the pointers' alignment), so
a repeated call costs a tuple, one dict lookup, the raw current-stream handle, one
context check and one cuLaunchKernel. Other operand kinds are parsed in full on every
call (a few microseconds more) and keyed by what the parse found.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from codegen.config import DType, Layout
from tuner.runtime import driver
from tuner.runtime.errors import LibraryError
from tuner.runtime.operands import (
    Operand, align_class, empty_like, operand, resolve_stream, same_device, stream_handle,
)

__all__ = ["Plan", "Problem", "gemm", "gemm_batch", "fp32_request", "check_call"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything about a call that its key fixes."""

    gpu: driver.Gpu
    dtype: DType  # what runs: F32, TF32, F16 or BF16
    m: int
    n: int
    k: int
    choice: object  # dispatch.Choice
    run: Callable | None  # (a, b, c, alpha, beta, stream) -> None, on pointers
    memo: bool  # False: decided by the estimate only because a graph was being captured
    torch_run: Callable | None = None  # (A, B, C, alpha, beta): cuBLAS through torch
    problem: "Problem | None" = None  # what it was built from
    #: rows -> the plan running the same choice on a chunk of that many packed rows
    chunks: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    #: the call counter of a recorded problem (tuner.runtime.record), or None
    tally: list | None = dataclasses.field(default=None, compare=False, repr=False)

    def chunk(self, lib, rows: int) -> "Plan":
        """This plan's choice (the same kernel) on `rows` packed rows of A and C."""
        p = self.chunks.get(rows)
        if p is None:
            problem = dataclasses.replace(self.problem, m=rows, lda=self.k, ldb=self.n,
                                          ldc=self.n, offsets=(0, 0, 0))
            p = self.chunks[rows] = problem.build(lib, self.choice)
        return p


def _torch_tf32() -> bool:
    """Does torch let its fp32 matmuls use TF32 (torch.backends.cuda.matmul.allow_tf32)?"""
    import torch

    return torch.backends.cuda.matmul.allow_tf32


def _torch_addmm(A, B, C, alpha: float = 1.0, beta: float = 0.0):
    """cuBLAS through torch on its current stream: C = alpha A B + beta C (beta 0: C unread);
    torch.matmul itself when alpha is 1 and beta 0 (what such a caller would have called)."""
    import torch

    if alpha == 1.0 and beta == 0.0:
        return torch.matmul(A, B, out=C)
    return torch.addmm(C, A, B, beta=beta, alpha=alpha, out=C)


_TENSOR = None  # torch.Tensor, once a torch tensor has been seen
_TF32 = None  # torch's fp32-matmul TF32 flag, read cheaply, once torch has been seen
_DEVICE = None  # torch's current device (torch._C._cuda_getDevice), once torch has been seen


def gemm(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline=True):
    """Library.gemm (see its doc)."""
    if C is None and beta != 0:
        raise LibraryError("beta != 0 needs a C to read")
    t = type(A)
    if t is not _TENSOR and _TENSOR is None and t.__module__ == "torch" and t.__name__ == "Tensor":
        _see_torch()
    if t is _TENSOR and type(B) is t and (C is None or type(C) is t):
        return _torch_call(lib, A, B, C, alpha, beta, mode, stream, measure)
    return _general_call(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline)


def fp32_request(dtype: DType, mode: DType | None) -> DType:
    """What a call asks for: fp32 data under `mode` (TF32 or F32X3: the caller's
    allow_tf32 / allow_3xtf32) is that request; other data is its own type."""
    return mode if mode is not None and dtype is DType.F32 else dtype


def _see_torch() -> None:
    """Bind torch's cheap accessors, once torch tensors are seen."""
    global _TENSOR, _TF32, _DEVICE
    import torch

    _TF32 = getattr(torch._C, "_get_cublas_allow_tf32", _torch_tf32)
    _DEVICE = torch._C._cuda_getDevice
    _TENSOR = torch.Tensor


def _torch_key(A, B, C, mode, measure, stream):
    """The memo key of a torch call: what the call reads off its tensors anyway."""
    pa, pb = A.data_ptr(), B.data_ptr()
    if C is None:
        ckey, pc = None, 0
    else:
        pc = C.data_ptr()
        ckey = (C.dtype, C.shape, C.stride(), C.get_device(), pc & 15)
    key = ("torch", A.dtype, B.dtype, A.shape, B.shape, A.stride(), B.stride(), A.get_device(),
           B.get_device(), pa & 15, pb & 15, ckey, mode, measure, stream is None,
           _TF32())
    return key, pa, pb, pc


def _torch_call(lib, A, B, C, alpha, beta, mode, stream, measure):
    key, pa, pb, pc = _torch_key(A, B, C, mode, measure, stream)
    plan = lib.plans.get(key)
    s = None
    if plan is None:
        ops = (operand(A, "A", inputs=True), operand(B, "B", inputs=True),
               None if C is None else operand(C, "C", writable=True))
        dev = same_device(*(o for o in ops if o is not None))
        s = resolve_stream(stream, ops[:2], dev)
        dtype = fp32_request(ops[0].dtype, mode)
        # cuBLAS through torch where torch's own precision is the one asked for
        via_torch = stream is None and (dtype is DType.TF32) == key[-1] \
            and dtype in (DType.F32, DType.TF32, DType.F32X3)
        plan = _plan(lib, *ops, mode, measure, dev, s, allocate=_torch_allocator(A),
                     via_torch=via_torch)
        if plan.memo:
            lib.plans[key] = plan
    if plan.tally is not None:
        plan.tally[0] += 1
    if plan.torch_run is not None:
        if C is None:
            import torch

            C = torch.empty((plan.m, plan.n), dtype=torch.float32, device=A.device)
        plan.torch_run(A, B, C, alpha, beta)
        return C
    g = plan.gpu
    if s is None:
        import torch

        s = torch._C._cuda_getCurrentRawStream(g.index) if stream is None \
            else stream_handle(stream)
    if C is None:
        import torch

        C = torch.empty((plan.m, plan.n), dtype=torch.float32, device=A.device)
        pc = C.data_ptr()
    if _DEVICE() == g.index:  # torch's device is current: launch; if no context is, retry
        try:
            plan.run(pa, pb, pc, alpha, beta, s)
            return C
        except driver.DriverError as e:
            if "CONTEXT" not in str(e) and "INVALID_HANDLE" not in str(e):
                raise
    with driver.entered(g):
        plan.run(pa, pb, pc, alpha, beta, s)
    return C


def _torch_allocator(A):
    """Graph-safe scratch for torch callers: torch's caching allocator, which serves a
    capture from the graph's private pool."""
    import torch

    device = A.device

    def allocate(nbytes: int):
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return t.data_ptr(), t

    return allocate


def _general_plan(lib, A, B, C, mode, stream, measure):
    """(plan, operands a, b, c, stream) of a call with operands of any kind but torch's
    fast path: each parsed in full, the plan memoised on what the parse found."""
    a, b = operand(A, "A", inputs=True), operand(B, "B", inputs=True)
    c = None if C is None else operand(C, "C", writable=True)
    ops = (a, b) if c is None else (a, b, c)
    check_call(a, b, c)
    dev = same_device(*ops)
    host = a.host is not None or b.host is not None or (c is not None and c.host is not None)
    if dev is None:
        dev = driver.current_device()
    s = resolve_stream(stream, ops, dev)
    key = ("general", dev, a.dtype, b.dtype, a.rows, a.cols, a.ld, a.column_major, b.rows,
           b.cols, b.ld, b.column_major,
           None if c is None else (c.rows, c.cols, c.ld, c.host is None), host,
           tuple(align_class(o.ptr or 0, o.ld, o.dtype.size) for o in ops),
           mode, measure)
    plan = lib.plans.get(key)
    if plan is None:
        allocate = _torch_allocator(A) if a.kind == "torch" else None
        plan = _plan(lib, a, b, c, mode, measure, dev, s, allocate=allocate)
        if plan.memo:
            lib.plans[key] = plan
    return plan, a, b, c, s


def _general_call(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline=True):
    plan, a, b, c, s = _general_plan(lib, A, B, C, mode, stream, measure)
    if plan.tally is not None:
        plan.tally[0] += 1
    if C is None:
        C = empty_like(a, (plan.m, plan.n), plan.gpu.index)
        c = operand(C, "C", writable=True)
    g = plan.gpu
    with driver.entered(g):
        if all(o.host is not None for o in (a, b, c)):
            from tuner.runtime.host import run_pipelined

            run_pipelined(g, lambda rows: plan.chunk(lib, rows), a.host, b.host, c.host,
                          alpha, beta, chunks=None if pipeline else [(0, plan.m)],
                          pinned_staging=pipeline != "pageable")
        elif a.host is not None or b.host is not None or c.host is not None:
            _staged(plan, a, b, c, alpha, beta, s)
        else:
            plan.run(a.ptr, b.ptr, c.ptr, alpha, beta, s)
    return C


def gemm_batch(lib, pairs, alpha, beta, outs, mode, measure):
    """Library.gemm_batch (see its doc)."""
    from tuner.runtime.host import run_batch

    import numpy as np

    pairs = list(pairs)
    outs = list(outs) if outs is not None else [None] * len(pairs)
    if len(outs) != len(pairs):
        raise LibraryError(f"{len(outs)} outputs for {len(pairs)} (A, B) pairs")
    items = []
    for (A, B), C in zip(pairs, outs):
        for x, name in ((A, "A"), (B, "B"), (C, "C")):
            if x is not None and not isinstance(x, np.ndarray):
                raise LibraryError(f"gemm_batch takes numpy arrays; {name} is "
                                   f"{type(x).__name__} (lib.gemm runs device arrays)")
        plan, a, b, c, _ = _general_plan(lib, A, B, C, mode, None, measure)
        if C is None:
            C = np.empty((plan.m, plan.n), np.float32)
        items.append((plan, a.host, b.host, C))
    if items:
        g = items[0][0].gpu
        with driver.entered(g):
            run_batch(g, items, alpha, beta)
    return [C for _, _, _, C in items]


def _staged(plan: Plan, a: Operand, b: Operand, c: Operand, alpha, beta, s: int) -> None:
    """Host operands copied into per-stream device buffers, C copied back; synchronous."""
    import numpy as np

    ptrs = []
    for o in (a, b, c):
        if o.host is None:
            ptrs.append(o.ptr)
            continue
        host = np.ascontiguousarray(o.host)
        dptr = driver.scratch().get(plan.gpu, s, f"staged {o.name}", host.nbytes)
        if o.name != "C" or beta != 0:
            driver.call("cuMemcpyHtoDAsync", dptr, host.ctypes.data, host.nbytes, s)
        ptrs.append(dptr)
    plan.run(*ptrs, alpha, beta, s)
    if c.host is not None:
        out = np.empty_like(c.host) if not c.host.flags.c_contiguous else c.host
        driver.call("cuMemcpyDtoHAsync", out.ctypes.data, ptrs[2], out.nbytes, s)
        driver.sync(s)
        if out is not c.host:
            c.host[...] = out
    else:
        driver.sync(s)  # the host inputs' staging buffers are reused by the next call


def check_call(a: Operand, b: Operand, c: Operand | None) -> tuple[int, int, int]:
    """M, N, K of a call whose operands agree; LibraryError otherwise (no GPU touched)."""
    if a.dtype is not b.dtype:
        raise LibraryError(f"A is {a.dtype.short} and B is {b.dtype.short}: "
                           "they must be of one type")
    if a.cols != b.rows:
        raise LibraryError(f"A is {a.rows}x{a.cols} and B is {b.rows}x{b.cols}: "
                           "A's columns must equal B's rows")
    m, n, k = a.rows, b.cols, a.cols
    if c is not None and (c.rows, c.cols) != (m, n):
        raise LibraryError(f"C is {c.rows}x{c.cols}; A @ B is {m}x{n}")
    return m, n, k


def _plan(lib, a: Operand, b: Operand, c: Operand | None, mode: DType | None, measure: bool,
          dev: int, stream: int, allocate=None, via_torch: bool = False) -> Plan:
    """Check a call and decide it (dispatch.py's rule); raises LibraryError. `via_torch`:
    cuBLAS is reached through torch (a torch caller on torch's current stream, whose
    precision flags match the request), else through gemm-tune's own binding."""
    m, n, k = check_call(a, b, c)
    dtype = fp32_request(a.dtype, mode)
    g = driver.gpu(dev)
    ldc = c.ld if c is not None else n
    align = tuple(align_class(o.ptr or 0, o.ld, o.dtype.size)
                  for o in (a, b)) + (align_class(c.ptr or 0, ldc, 4) if c is not None else 16,)
    offsets = tuple((o.ptr or 0) & 255 for o in (a, b)) + ((c.ptr or 0) & 255 if c else 0,)
    layout = Layout.of(a.column_major, b.column_major)
    problem = Problem(g, dtype, m, n, k, a.ld, b.ld, ldc, offsets, via_torch, mode,
                      measure, stream, allocate, layout)
    with driver.entered(g):
        choice = lib.choose(g, dtype, m, n, k, align, stream,
                            problem.timer(lib) if measure else None, problem.route, layout)
        capturing = driver.is_capturing(stream)
        plan = problem.build(lib, choice, capturing)
    if measure and choice.rule == "estimate" and capturing:
        plan = dataclasses.replace(plan, memo=False)
    if lib.recorder is not None and lib.select(m, n, k, dtype, g.cc, g.arch.sm_count, layout,
                                               g.name, align=align).rule != "exact":
        plan = dataclasses.replace(plan, tally=lib.recorder.tally(problem.record(choice, align)))
    return plan


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a plan for a call is built from, and how its candidates are timed."""

    gpu: driver.Gpu
    dtype: DType
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    offsets: tuple  # the operands' byte offsets past a 256-byte boundary
    via_torch: bool
    mode: DType | None  # the caller's fp32 mode (TF32, F32X3) or None
    measure: bool
    stream: int  # the call's stream: candidates are timed there, as the call would run
    allocate: Callable | None = None  # graph-safe scratch (torch callers)
    layout: Layout = Layout.NN  # how A and B are stored (C is row-major)

    @property
    def route(self) -> str:
        return "torch" if self.via_torch else "gemm-tune"

    def record(self, choice, align: tuple) -> dict:
        """This problem as a line of a record file (tuner.runtime.record), with what the
        decision knew of a call's time."""
        ms = choice.measured_ms or {}
        per = ms.get(choice.kernel or "cublas")
        if per is None and choice.estimate_tflops:
            per = 2.0 * self.m * self.n * self.k / (choice.estimate_tflops * 1e9)
        return dict(gpu=self.gpu.name, dtype=self.dtype.short, layout=self.layout.value,
                    out="f32", epilogue="none", batch=1, m=self.m, n=self.n, k=self.k,
                    align=list(align), ms_per_call=None if per is None else round(per, 5),
                    rule=choice.rule, runs=choice.kernel or "cuBLAS")

    def build(self, lib, choice, capturing: bool = False) -> Plan:
        """The plan that runs `choice` (a kernel, or cuBLAS by this problem's route)."""
        from tuner.runtime.cublas import device_blas, has_handle

        g, dtype, m, n, k = self.gpu, self.dtype, self.m, self.n, self.k
        lda, ldb, ldc, allocate = self.lda, self.ldb, self.ldc, self.allocate
        layout = self.layout
        run = torch_run = None
        if choice.kernel is not None:
            run = lib.runner(choice.kernel, g.sm).bind(g, m, n, k, lda, ldb, ldc, allocate)
        elif self.via_torch:
            torch_run = _torch_addmm
        else:
            if capturing and not has_handle(g):
                raise LibraryError("a CUDA graph is being captured and cuBLAS has not run on "
                                   f"GPU {g.index} yet (its handle cannot be made during "
                                   "capture): make one call before capturing")
            blas = device_blas(g)

            def run(pa, pb, pc, alpha, beta, s):
                blas.gemm(dtype, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc, s, allocate,
                          layout=layout)
        return Plan(g, dtype, m, n, k, choice, run, True, torch_run, self)

    def timer(self, lib) -> Callable:
        """time(kernel names) -> {name or "cublas": ms per call}: each candidate timed on
        scratch operands like the caller's, on the call's stream, in loops, as the call
        would run it. A torch caller's candidates are timed through lib.gemm itself (the
        call's whole host path, its own plan swapped in), everyone else's through the
        plan's launcher."""
        from tuner.runtime import measure
        from tuner.runtime.dispatch import Choice

        def plans(names):
            out = {name: self.build(lib, Choice(name, "measured", "")) for name in names}
            out["cublas"] = self.build(lib, Choice(None, "measured", ""))
            return out

        def time_torch(names):
            _see_torch()
            with measure.torch_operands(self.gpu, self.m, self.n, self.k, self.lda, self.ldb,
                                        self.ldc, self.dtype, self.offsets,
                                        self.layout) as ops:
                A, B, C = ops
                key = _torch_key(A, B, C, self.mode, self.measure, None)[0]
                saved = lib.plans.get(key)

                def runner(plan):
                    def run(stream):
                        lib.plans[key] = plan
                        gemm(lib, A, B, C, 1.0, 0.0, self.mode, None, self.measure)
                    return run

                try:
                    return measure.time_candidates(
                        self.gpu, {name: runner(p) for name, p in plans(names).items()},
                        self.stream)
                finally:
                    if saved is None:
                        lib.plans.pop(key, None)
                    else:
                        lib.plans[key] = saved

        def time_pointers(names):
            with measure.driver_operands(self.gpu, self.m, self.n, self.k, self.lda, self.ldb,
                                         self.ldc, self.dtype.size, self.offsets,
                                         self.layout) as ptrs:
                return measure.time_candidates(
                    self.gpu, {name: (lambda st, p=p: p.run(*ptrs, 1.0, 0.0, st))
                               for name, p in plans(names).items()}, self.stream)

        return time_torch if self.via_torch else time_pointers
