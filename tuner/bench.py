"""Timing on the GPU: one function for candidates and cuBLAS alike, and the problem
whose output every candidate must get right before its time counts.

Timing follows DESIGN.md: CUDA events around the kernel alone; warm-up first;
repetitions sized to about `target_ms` of work (bounded); the L2 flushed before
every repetition by writing a buffer twice its size; median and quantiles.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Callable

import numpy as np

from codegen.config import DType
from codegen.families import Config, Math, family_of
from tuner.gpu import cublas, device
from tuner.outcome import Measurement, Outcome, Timing
from tuner.runtime import driver
from tuner.runtime.errors import DriverError, Unsupported
from tuner.runtime.runners import runner_for

__all__ = ["L2Flush", "do_bench", "Problem", "DeviceArray", "GpuBenchmark", "TOLERANCE",
           "tolerance", "round_to"]

log = logging.getLogger(__name__)

#: ||C - ref|| / ||ref|| gates (DESIGN.md's two-reference protocol): against a float64
#: product of the inputs rounded as the candidate multiplies them (fp32 and the CUDA-core
#: family: as given, fp16 and bf16 widening exactly; tf32: rounded to tf32).
#: CUDA cores (FP32 FMAs): 1e-5; cuBLAS SGEMM lands near 1e-6.
#: Tensor cores, at K <= 4096 and growing in proportion above it: measured on the H200
#: at 4096^3 (bench/results/wmma-sweep-h200-2026-11-30.json) fp16 4.9e-6, bf16 4.4e-6,
#: tf32 1.9e-5, the same as cuBLAS's 4.9e-6 / 4.4e-6 / 1.3e-5 there, and growing linearly
#: in K (fp16 1.25e-6 at K=1023; tf32 4.8e-6): the tensor cores' FP32 accumulation does
#: not round to nearest. The gates leave 4-5x headroom and stay below the error that
#: rounding the inputs itself makes (fp16 2.9e-4: 15x, bf16 2.4e-3: 120x, tf32 2.9e-4:
#: only 3x), which a kernel that rounded wrongly or accumulated in half precision shows.
TOLERANCE = {DType.F32: 1e-5, DType.TF32: 1e-4, DType.F16: 2e-5, DType.BF16: 2e-5}


def tolerance(config: Config, k: int) -> float:
    """The gate for `config` at depth K, by its family's math: FP32 FMAs on exactly
    widened inputs meet fp32's gate; tensor cores their input type's, growing with K."""
    if family_of(config).math is Math.CUDA_CORE or config.dtype is DType.F32:
        return TOLERANCE[DType.F32]  # FP32 FMAs, or 3xTF32 held to fp32's gate
    return TOLERANCE[config.dtype] * max(1.0, k / 4096)


NAN_BITS = 0x7FC00000


def round_to(x: np.ndarray, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """float32 `x` -> (what the kernel is given, its value as float32).

    fp32 and tf32 kernels are given fp32 data (a tf32 kernel rounds it on load, to
    nearest with ties away from zero, as cvt.rna.tf32.f32); fp16 is numpy's float16;
    bf16 is stored as uint16 bits, rounded to nearest even.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype in (DType.F32, DType.F32X3):
        return x, x
    bits = x.view(np.uint32)
    if dtype is DType.TF32:
        return x, ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    if dtype is DType.F16:
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    if dtype is DType.BF16:
        u = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
        return u, (u.astype(np.uint32) << 16).view(np.float32)
    raise ValueError(dtype)


class L2Flush:
    """A buffer of twice the L2 size, allocated once; writing it evicts the inputs."""

    def __init__(self, l2_bytes: int):
        self.buf = driver.Buffer(max(2 * l2_bytes, 1 << 20))

    def __call__(self, stream: int = 0):
        self.buf.fill32(0, stream=stream)


def do_bench(fn: Callable[[], None], flush: L2Flush | None, target_ms: float = 50.0,
             warmup: int = 3, min_reps: int = 10, max_reps: int = 500) -> Timing:
    """Time `fn` (an asynchronous launch on the legacy default stream) like Triton's
    do_bench: CUDA events around each repetition, the L2 flushed before it."""
    for _ in range(warmup):
        fn()
    start = driver.Event().record()
    fn()
    end = driver.Event().record()
    end.synchronize()
    estimate = max(end.since(start), 1e-3)
    reps = int(min(max_reps, max(min_reps, math.ceil(target_ms / estimate))))
    starts = [driver.Event() for _ in range(reps)]
    ends = [driver.Event() for _ in range(reps)]
    for s, e in zip(starts, ends):
        if flush is not None:
            flush()
        s.record()
        fn()
        e.record()
    ends[-1].synchronize()
    return Timing(tuple(e.since(s) for s, e in zip(starts, ends)))


class DeviceArray:
    """A copy of a numpy array in device memory (a driver.Buffer): ``ptr``, ``get()``."""

    def __init__(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype = host.shape, host.dtype
        self.buf = driver.Buffer.of(host)

    @property
    def ptr(self) -> int:
        return self.buf.ptr

    def __int__(self) -> int:
        return self.buf.ptr

    def get(self) -> np.ndarray:
        return self.buf.download(np.empty(self.shape, self.dtype))

    def set(self, host: np.ndarray) -> None:
        self.buf.upload(np.ascontiguousarray(host, dtype=self.dtype))


#: ||C - ref||^2 over an M x N block of FP32 C (leading dimension ldc) against a packed
#: float64 reference, summed in float64 (a NaN anywhere makes the sum NaN): the check every
#: candidate's output passes before its time counts
_ERROR_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256)
gemm_tune_squared_error(const float* __restrict__ C, int ldc, const double* __restrict__ ref,
                        int m, int n, double* __restrict__ sum)
{
    __shared__ double part[256];
    double s = 0.0;
    const long long total = static_cast<long long>(m) * n;
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < total; i += gridDim.x * 256ll) {
        const long long row = i / n, col = i - row * n;
        const double d = static_cast<double>(C[row * ldc + col]) - ref[i];
        s += d * d;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        atomicAdd(sum, part[0]);
}
"""


@functools.cache
def _error_kernel():
    """The squared-error kernel, compiled once (through nvcc's cache) and loaded."""
    from codegen.compile import compile_source

    res = compile_source(_ERROR_KERNEL, device().arch, "gemm_tune_squared_error",
                         flags=("-O3", "-Xptxas=-v"))
    if not res.ok:
        raise RuntimeError(f"the error kernel does not compile: {res.error}")
    image = driver.KernelImage(driver.load_cubin(res.cubin.read_bytes(), res.name), res.name, 0)
    return image, image.prepare(device())


class Problem:
    """A, B (fresh random normal inputs stored in `dtype`'s input type: fp32 for fp32 and
    tf32), C (fp32), and float64 references of alpha*A*B + beta*C0, made on demand:
    `reference(r)` for the inputs rounded to r (what a kernel multiplying in r computes
    exactly), `reference(DType.F32)` for the fp32 values drawn before any rounding.

    The references are cuBLAS float64 products, on the GPU; the error of C against one is
    summed on the GPU too (only a float comes back).
    """

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 alpha: float = 1.0, beta: float = 0.0, lda: int | None = None,
                 ldb: int | None = None, ldc: int | None = None):
        self.m, self.n, self.k = shape
        self.dtype, self.alpha, self.beta = dtype, alpha, beta
        self.lda, self.ldb, self.ldc = lda or self.k, ldb or self.n, ldc or self.n
        rng = np.random.default_rng(seed)
        self.a32 = rng.standard_normal((self.m, self.lda), dtype=np.float32)
        self.b32 = rng.standard_normal((self.k, self.ldb), dtype=np.float32)
        self.c0 = rng.standard_normal((self.m, self.ldc), dtype=np.float32) if beta else None
        stored = DType.F32 if dtype in (DType.TF32, DType.F32X3) else dtype
        self.a = DeviceArray(round_to(self.a32, stored)[0])
        self.b = DeviceArray(round_to(self.b32, stored)[0])
        self.c = DeviceArray(np.empty((self.m, self.ldc), np.float32))
        self._refs: dict = {}
        self._sum = driver.Buffer(8)
        self.flops = 2.0 * self.m * self.n * self.k

    def reference(self, rounding: DType = DType.F32):
        """(float64 reference on the GPU, its norm) for inputs rounded to `rounding`."""
        if rounding not in self._refs:
            a, b = (DeviceArray(round_to(x, rounding)[1].astype(np.float64))
                    for x in (self.a32, self.b32))
            ref = DeviceArray(np.zeros((self.m, self.n), np.float64))
            cublas().dgemm(self.m, self.n, self.k, a.ptr, self.lda, b.ptr, self.ldb, ref.ptr,
                           self.n)
            host = ref.get() * self.alpha
            if self.beta:
                host += self.beta * self.c0[:, : self.n].astype(np.float64)
            ref.set(host)
            self._refs[rounding] = ref, float(np.linalg.norm(host)) or 1.0
        return self._refs[rounding]

    def reset_c(self) -> None:
        """Poison C with NaN (then restore C0 where beta reads it)."""
        self.c.buf.fill32(NAN_BITS)
        if self.c0 is not None:
            self.c.set(self.c0)

    def error(self, rounding: DType | None = None) -> float:
        """||C - ref|| / ||ref|| over the M x N block (NaN if any element is unwritten), ref
        on the inputs rounded to `rounding` (default: as stored; F32: before rounding)."""
        ref, norm = self.reference(self.dtype if rounding is None else rounding)
        image, f = _error_kernel()
        self._sum.fill32(0)
        blocks = min(-(-self.m * self.n // 256), 8 * device().arch.sm_count)
        image.launch(f, (blocks, 1, 1), (256, 1, 1), 0, image.params("PiPiiP").pack(
            self.c.ptr, self.ldc, ref.ptr, self.m, self.n, self._sum.ptr))
        total = self._sum.download(np.empty(1, np.float64))[0]
        return math.sqrt(total) / norm if total == total else float("nan")

    def args(self):
        """(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): a launch's arguments, pointers."""
        return (self.m, self.n, self.k, self.alpha, self.a.ptr, self.lda, self.b.ptr,
                self.ldb, self.beta, self.c.ptr, self.ldc)

    def run(self, launch) -> None:
        """launch(a, b, c, alpha, beta, stream) on this problem, on the legacy default stream
        (a runner's bound call)."""
        launch(self.a.ptr, self.b.ptr, self.c.ptr, self.alpha, self.beta, 0)


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

    def measure(self, config: Config, cubin) -> Measurement:
        """Load, check and time one candidate on this problem, through its family's runner
        (tuner.runtime.runners: the launcher the library ships). A kernel that cannot take
        the problem's operands (a wgmma kernel where TMA cannot describe them) is REJECTED
        with its reason and never launched; a launch that fails is LAUNCH_FAILED."""
        p = self.problem
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        try:
            run = runner_for(config, image).bind(self.dev, p.m, p.n, p.k, p.lda, p.ldb, p.ldc)
            p.reset_c()
            p.run(run)
            driver.synchronize()
        except Unsupported as e:
            return Measurement(Outcome.REJECTED, message=str(e)[:300])
        except DriverError as e:
            return Measurement(Outcome.LAUNCH_FAILED, message=str(e).splitlines()[0][:300])
        err = p.error(config.dtype)  # the inputs as this candidate multiplies them
        gate = tolerance(config, p.k)
        if not err <= gate:
            return Measurement(Outcome.WRONG_RESULT, error=err,
                               message=f"||C-ref||/||ref|| = {err:.3g} > {gate:g}")
        err_exact = err if config.dtype is DType.F32 else p.error(DType.F32)
        timing = do_bench(lambda: p.run(run), self.flush, self.target_ms)
        return Measurement(Outcome.TIMED, timing=timing, error=err, error_exact=err_exact)

    def baseline(self) -> Measurement:
        """cuBLAS on the same problem, checked the same way, timed the same way."""
        p, blas = self.problem, cublas()
        args = p.args()

        def run():
            blas.gemm(self.dtype, *args)

        p.reset_c()
        run()
        driver.synchronize()
        err = p.error()
        err_exact = err if p.dtype is DType.F32 else p.error(DType.F32)
        return Measurement(Outcome.TIMED, timing=do_bench(run, self.flush, self.target_ms),
                           error=err, error_exact=err_exact)
