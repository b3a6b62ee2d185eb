"""Timing on the GPU: one function for candidates and cuBLAS alike, and the problem
whose output every candidate must get right before its time counts.

Timing follows DESIGN.md: CUDA events around the kernel alone; warm-up first;
repetitions sized to about `target_ms` of work (bounded); the L2 flushed before
every repetition by writing a buffer twice its size; median and quantiles.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

from codegen.config import DType, KernelConfig
from tuner.cublas import cublas
from tuner.gpu import Kernel, _drv, device
from tuner.outcome import Measurement, Outcome, Timing

__all__ = ["L2Flush", "do_bench", "Problem", "GpuBenchmark", "TOLERANCE"]

log = logging.getLogger(__name__)

#: ||C - ref|| / ||ref|| gates, against a float64 product of the same inputs.
TOLERANCE = {DType.F32: 1e-5}
NAN_BITS = 0x7FC00000


class L2Flush:
    """A buffer of twice the L2 size, allocated once; writing it evicts the inputs."""

    def __init__(self, l2_bytes: int):
        drv = _drv()
        self.words = max(2 * l2_bytes, 1 << 20) // 4
        self.buf = drv.mem_alloc(self.words * 4)

    def __call__(self, stream=None):
        _drv().memset_d32_async(self.buf, 0, self.words, stream)


def do_bench(fn: Callable[[], None], flush: L2Flush | None, target_ms: float = 50.0,
             warmup: int = 3, min_reps: int = 10, max_reps: int = 500) -> Timing:
    """Time `fn` (an asynchronous launch on the default stream) like Triton's do_bench."""
    drv = _drv()
    for _ in range(warmup):
        fn()
    start, end = drv.Event(), drv.Event()
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate = max(end.time_since(start), 1e-3)
    reps = int(min(max_reps, max(min_reps, math.ceil(target_ms / estimate))))
    starts = [drv.Event() for _ in range(reps)]
    ends = [drv.Event() for _ in range(reps)]
    for s, e in zip(starts, ends):
        if flush is not None:
            flush()
        s.record()
        fn()
        e.record()
    ends[-1].synchronize()
    return Timing(tuple(e.time_since(s) for s, e in zip(starts, ends)))


class Problem:
    """A, B (fresh random normal inputs), C, and the float64 reference of alpha*A*B + beta*C0.

    The reference is a cuBLAS float64 product of the same inputs, on the GPU.
    """

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 alpha: float = 1.0, beta: float = 0.0, lda: int | None = None,
                 ldb: int | None = None, ldc: int | None = None):
        import pycuda.gpuarray as ga

        self.m, self.n, self.k = shape
        self.dtype, self.alpha, self.beta = dtype, alpha, beta
        self.lda, self.ldb, self.ldc = lda or self.k, ldb or self.n, ldc or self.n
        rng = np.random.default_rng(seed)
        host_a = rng.standard_normal((self.m, self.lda), dtype=np.float32)
        host_b = rng.standard_normal((self.k, self.ldb), dtype=np.float32)
        self.c0 = rng.standard_normal((self.m, self.ldc), dtype=np.float32) if beta else None
        self.a, self.b = ga.to_gpu(host_a), ga.to_gpu(host_b)
        self.c = ga.empty((self.m, self.ldc), np.float32)
        ref = ga.zeros((self.m, self.n), np.float64)
        cublas().dgemm(self.m, self.n, self.k, self.a.astype(np.float64).gpudata, self.lda,
                       self.b.astype(np.float64).gpudata, self.ldb, ref.gpudata, self.n)
        ref = ref.get() * alpha
        if beta:
            ref += beta * self.c0[:, : self.n].astype(np.float64)
        self.ref = ga.to_gpu(ref)
        self.ref_norm = math.sqrt(float(ga.dot(self.ref, self.ref).get())) or 1.0
        self.flops = 2.0 * self.m * self.n * self.k

    def reset_c(self) -> None:
        """Poison C with NaN (then restore C0 where beta reads it)."""
        _drv().memset_d32(self.c.gpudata, NAN_BITS, self.m * self.ldc)
        if self.c0 is not None:
            self.c.set(self.c0)

    def error(self) -> float:
        """||C - ref|| / ||ref|| over the M x N block (NaN if any element is unwritten)."""
        import pycuda.gpuarray as ga

        c = self.c if self.ldc == self.n else ga.to_gpu(self.c.get()[:, : self.n])
        diff = c.astype(np.float64) - self.ref
        return math.sqrt(float(ga.dot(diff, diff).get())) / self.ref_norm

    def args(self):
        return (self.m, self.n, self.k, self.alpha, self.a.gpudata, self.lda, self.b.gpudata,
                self.ldb, self.beta, self.c.gpudata, self.ldc)


class GpuBenchmark:
    """Verifies and times candidates, and times cuBLAS with the same function.

    The search takes it as an argument (a fake one stands in for it in CPU tests).
    """

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 target_ms: float = 50.0):
        self.dev = device()
        self.arch = self.dev.arch
        self.shape, self.dtype, self.target_ms = tuple(shape), dtype, target_ms
        self.problem = Problem(shape, dtype, seed)
        self.flush = L2Flush(self.dev.l2_bytes)
        self.flops = self.problem.flops

    def measure(self, config: KernelConfig, cubin) -> Measurement:
        drv = _drv()
        p = self.problem
        try:
            kernel = Kernel(config, cubin)
            p.reset_c()
            kernel(*p.args())
            drv.Context.synchronize()
        except drv.Error as e:
            return Measurement(Outcome.LAUNCH_FAILED, message=str(e).splitlines()[0][:300])
        err = p.error()
        if not err <= TOLERANCE[self.dtype]:
            return Measurement(Outcome.WRONG_RESULT, error=err,
                               message=f"||C-ref||/||ref|| = {err:.3g} > {TOLERANCE[self.dtype]:g}")
        timing = do_bench(lambda: kernel(*p.args()), self.flush, self.target_ms)
        return Measurement(Outcome.TIMED, timing=timing, error=err)

    def baseline(self) -> Measurement:
        """cuBLAS on the same problem, checked the same way, timed the same way."""
        p, blas = self.problem, cublas()
        args = p.args()

        def run():
            blas.gemm(self.dtype, *args)

        p.reset_c()
        run()
        _drv().Context.synchronize()
        err = p.error()
        return Measurement(Outcome.TIMED, timing=do_bench(run, self.flush, self.target_ms),
                           error=err)
