"""Timing on the GPU: one function for candidates and cuBLAS alike, and the problem
whose output every candidate must get right before its time counts.

Timing follows DESIGN.md: CUDA events around the kernel alone; warm-up first;
repetitions sized to about `target_ms` of work (bounded); the L2 flushed before
every repetition by writing a buffer twice its size; median and quantiles.

The problem is the one a program makes (:class:`Problem`): A and B stored in its layout
(NN/NT/TN/TT: a column-major operand's leading dimension is its column stride), a strided
batch (B possibly shared: stride 0), C in its output type (fp32, fp16, bf16), a bias
vector and an activation; the float64 reference applies the same epilogue. cuBLAS, the
baseline, computes the same GEMM (op flags, strided batched, C in the output type where
cuBLAS has that type for these inputs) without the bias and the activation, which it
does not fuse: see :func:`baseline_label`.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Callable

import numpy as np

from codegen.config import DType, Layout
from codegen.families import Config, Math, family_of
from codegen.families._common import Variant
from tuner.gpu import cublas, device
from tuner.outcome import Measurement, Outcome, Timing
from tuner.runtime import driver
from tuner.runtime.errors import DriverError, Unsupported
from tuner.runtime.runners import runner_for

__all__ = ["L2Flush", "do_bench", "Problem", "DeviceArray", "GpuBenchmark", "TOLERANCE",
           "tolerance", "output_rounding", "error_floor", "round_to", "blas_out", "baseline_label",
           "stored_shape", "logical"]

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


def output_rounding(out: DType) -> float:
    """The relative error, in norm, that rounding C to `out` may add on its own: the unit
    roundoff of the type, half an ulp relative (2^-11 for fp16's 11-bit significand,
    2^-8 for bf16's 8 bits); 0 for fp32 C, whose rounding the accumulation gates
    (TOLERANCE) already include.

    Each element rounded to nearest moves by at most that fraction of itself
    (|round(x) - x| <= u |x|) inside the type's normal range, so ||round(C) - C|| <= u ||C||:
    a kernel whose FP32 result meets the accumulation gate meets gate + u after its one
    rounding to C's type. Below the normal range the step is absolute (fp16: 2^-24 under
    2^-14), so errors are taken against a norm of at least :func:`error_floor`'s.

    Example:
        >>> output_rounding(DType.F16) == 2**-11, output_rounding(DType.BF16) == 2**-8
        (True, True)
    """
    return {DType.F16: 2.0**-11, DType.BF16: 2.0**-8}.get(out, 0.0)


#: the smallest normal number of each C type: below it rounding steps are absolute
_NORMAL_MIN = {DType.F16: 2.0**-14, DType.BF16: 2.0**-126, DType.F32: 2.0**-126}


def error_floor(out: DType, elements: int) -> float:
    """The least norm a relative error of C is taken against: that of `elements` values at
    the smallest normal number of C's type. Below it a correctly rounded C is off by up to
    half an absolute step (fp16: 2^-25), which relative to a C of that size is within
    :func:`output_rounding`'s u; relative to a tinier C it is not (a 1x1x1 product whose GELU
    is 1e-10 rounds to an fp16 zero: error 1.0, yet the right answer in fp16).

    Example:
        >>> error_floor(DType.F16, 4) == 2 * 2.0**-14
        True
    """
    return _NORMAL_MIN.get(out, _NORMAL_MIN[DType.F32]) * math.sqrt(elements)


def tolerance(config: Config, k: int) -> float:
    """The gate for `config` at depth K: the accumulation's, by its family's math (FP32
    FMAs on exactly widened inputs meet fp32's gate; tensor cores their input type's,
    growing with K), plus one rounding of C's type (:func:`output_rounding`: 2^-11 for
    fp16 C, 2^-8 for bf16 C, nothing for fp32 C)."""
    out = output_rounding(getattr(config, "out", DType.F32))
    if family_of(config).math is Math.CUDA_CORE or config.dtype is DType.F32:
        return TOLERANCE[DType.F32] + out  # FP32 FMAs, or 3xTF32 held to fp32's gate
    return TOLERANCE[config.dtype] * max(1.0, k / 4096) + out


def blas_out(dtype: DType, out: DType) -> DType:
    """C's type cuBLAS is asked for, for `dtype` inputs and the problem's C type `out`:
    `out` where cublasGemmEx computes that pair in FP32 (fp16 inputs to fp16 or fp32 C,
    bf16 to bf16 or fp32), else fp32 (fp32 / tf32 data write fp32 C only)."""
    if dtype in (DType.F16, DType.BF16) and out in (dtype, DType.F32):
        return out
    return DType.F32


def baseline_label(dtype: DType, variant: Variant = Variant(), batch: int = 1,
                   broadcast_b: bool = False) -> str:
    """What the cuBLAS figure is: its call and precision, and what of the problem it does
    not do. cuBLAS has no bias or activation to fuse (cuBLASLt's epilogues cover a few:
    no SiLU, no erf GELU), so the baseline times its GEMM alone, which flatters it: a
    program without fusion pays another pass over C for them.

    Example:
        >>> baseline_label(DType.F16, Variant(Layout.NT, DType.F16, "out", "gelu"), 8)
        'cublasGemmStridedBatchedEx (batch 8), fp16 inputs, COMPUTE_32F, op(B)=T, fp16 C; GEMM alone: without the bias and gelu (not fused by cuBLAS)'
    """
    call = "cublasGemmEx" if batch == 1 else (
        f"cublasGemmStridedBatchedEx (batch {batch}{', B stride 0' if broadcast_b else ''})")
    precision = {DType.F32: "fp32 data, COMPUTE_32F, no TF32",
                 DType.F32X3: "fp32 data, COMPUTE_32F, no TF32",
                 DType.TF32: "fp32 data, COMPUTE_32F_FAST_TF32",
                 DType.F16: "fp16 inputs, COMPUTE_32F",
                 DType.BF16: "bf16 inputs, COMPUTE_32F"}[dtype]
    ops = [f"op({x})=T" for x, t in zip("AB", variant.layout.value) if t == "t"]
    c = blas_out(dtype, variant.out)
    text = ", ".join([call, precision, *ops, f"{_TYPE_WORD[c]} C"])
    if c is not variant.out:
        text += f" (cuBLAS writes no {_TYPE_WORD[variant.out]} C from these inputs)"
    extra = [w for w in ("the bias" if variant.bias != "none" else "",
                         variant.act if variant.act != "none" else "") if w]
    if extra:
        text += f"; GEMM alone: without {' and '.join(extra)} (not fused by cuBLAS)"
    return text


_TYPE_WORD = {DType.F32: "fp32", DType.F16: "fp16", DType.BF16: "bf16"}


# ---- operands stored as a layout says ----------------------------------------------------
def stored_shape(rows: int, cols: int, ld: int, column_major: bool) -> tuple[int, int]:
    """The 2-D numpy shape of a rows x cols operand as stored with leading dimension `ld`:
    row-major, rows x ld; column-major (element (r, c) at c * ld + r), cols x ld."""
    return (cols, ld) if column_major else (rows, ld)


def logical(stored: np.ndarray, rows: int, cols: int, column_major: bool) -> np.ndarray:
    """The rows x cols matrix (a view; over a leading batch axis too) that `stored`, laid
    out as :func:`stored_shape` says, holds."""
    if column_major:
        return np.swapaxes(stored[..., :cols, :rows], -1, -2)
    return stored[..., :rows, :cols]


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


#: the flush before each timed call: a buffer of twice the L2 read through it (its lines left
#: clean), the same kernel a program's first use flushes with (tuner.runtime.measure)
L2Flush = driver.L2Flush


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


#: gemm_tune_squared_error_<type>: ||C - ref||^2 over `rows` rows of N elements of C
#: (leading dimension ldc; a batch's problems follow each other at M x ldc, so its rows
#: are batch x M rows of one matrix) in C's type against a packed float64 reference,
#: summed in float64 (a NaN anywhere makes the sum NaN): the check every candidate's output
#: passes before its time counts.
#: gemm_tune_epilogue_ref: the reference's epilogue, in float64 on the packed product
#: (alpha * acc + beta * C0 + bias[col], then the activation: ACT_CODES; the same formulas
#: as the kernels' (templates/macros.cu.j2), in double precision)
_REFERENCE_KERNELS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ double gt_load(const float* p) { return static_cast<double>(*p); }
__device__ __forceinline__ double gt_load(const __half* p)
{ return static_cast<double>(__half2float(*p)); }
__device__ __forceinline__ double gt_load(const __nv_bfloat16* p)
{ return static_cast<double>(__bfloat162float(*p)); }

#define GEMM_TUNE_SQUARED_ERROR(NAME, T)                                                    \
extern "C" __global__ void __launch_bounds__(256)                                          \
NAME(const T* __restrict__ C, int ldc, const double* __restrict__ ref, long long rows,     \
     int n, double* __restrict__ sum)                                                      \
{                                                                                          \
    __shared__ double part[256];                                                           \
    double s = 0.0;                                                                        \
    const long long total = rows * n;                                                      \
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < total; i += gridDim.x * 256ll) { \
        const long long row = i / n, col = i - row * n;                                    \
        const double d = gt_load(C + row * ldc + col) - ref[i];                            \
        s += d * d;                                                                        \
    }                                                                                      \
    part[threadIdx.x] = s;                                                                 \
    __syncthreads();                                                                       \
    for (int w = 128; w > 0; w >>= 1) {                                                    \
        if (threadIdx.x < w)                                                               \
            part[threadIdx.x] += part[threadIdx.x + w];                                    \
        __syncthreads();                                                                   \
    }                                                                                      \
    if (threadIdx.x == 0)                                                                  \
        atomicAdd(sum, part[0]);                                                           \
}

GEMM_TUNE_SQUARED_ERROR(gemm_tune_squared_error_f32, float)
GEMM_TUNE_SQUARED_ERROR(gemm_tune_squared_error_f16, __half)
GEMM_TUNE_SQUARED_ERROR(gemm_tune_squared_error_bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(256)
gemm_tune_epilogue_ref(double* __restrict__ ref, long long rows, int n, float alpha,
                       float beta, const double* __restrict__ c0,
                       const double* __restrict__ bias, int act)
{
    const long long total = rows * n;
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < total; i += gridDim.x * 256ll) {
        double x = static_cast<double>(alpha) * ref[i];
        if (c0 != nullptr)
            x += static_cast<double>(beta) * c0[i];
        if (bias != nullptr)
            x += bias[i % n];
        if (act == 1)
            x = x < 0.0 ? 0.0 : x;
        else if (act == 2)
            x = 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
        else if (act == 3)
            x = 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
        else if (act == 4)
            x = x / (1.0 + exp(-x));
        ref[i] = x;
    }
}
"""

#: the activation's code in gemm_tune_epilogue_ref
ACT_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_REFERENCE_MODULE = "gemm_tune_epilogue_ref"  # the module is named (and checked) by one entry


def reference_kernels_source() -> str:
    """The CUDA source of the error and reference-epilogue kernels (compiled on first use)."""
    return _REFERENCE_KERNELS


@functools.cache
def _kernel(name: str):
    """One of the reference module's kernels, the module compiled once (through nvcc's
    cache) and loaded: (image, CUfunction on the tuning GPU)."""
    image = driver.KernelImage(_reference_library(), name, 0)
    return image, image.prepare(device())


@functools.cache
def _reference_library():
    from codegen.compile import compile_source

    res = compile_source(_REFERENCE_KERNELS, device().arch, _REFERENCE_MODULE,
                         flags=("-O3", "-Xptxas=-v"))
    if not res.ok:
        raise RuntimeError(f"the reference kernels do not compile: {res.error}")
    return driver.load_cubin(res.cubin.read_bytes(), res.name)


def _blocks(elements: int) -> int:
    return max(1, min(-(-elements // 256), 8 * device().arch.sm_count))


#: C's type -> (numpy storage type, the NaN written to poison it, its bits per element)
_C_STORAGE = {DType.F32: (np.float32, 0x7FC00000, 32), DType.F16: (np.float16, 0x7E00, 16),
              DType.BF16: (np.uint16, 0x7FC0, 16)}


def _poison(buf, out: DType, elements: int) -> None:
    """Fill `elements` of a C buffer of type `out` with NaN."""
    _, nan, bits = _C_STORAGE[out]
    if bits == 32:
        buf.fill32(nan, elements)
    else:
        driver.call("cuMemsetD16", buf.ptr, nan, elements)


# ---- cuBLAS at the problem's layout, batch and C type (a local wrapper: see baseline) ----
def _blas_gemm(blas, dtype: DType, out: DType, layout: Layout, m: int, n: int, k: int,
               alpha: float, a: int, lda: int, sa: int, b: int, ldb: int, sb: int,
               beta: float, c: int, ldc: int, sc: int, batch: int = 1) -> None:
    """Row-major C = alpha op(A) op(B) + beta C on the tuner's cuBLAS handle (`blas`, a
    tuner.runtime.cublas.Cublas): cublasGemmEx, or cublasGemmStridedBatchedEx for a batch
    (strides in elements; 0 shares the operand), A and B as `layout` stores them, C in
    `out` (one of blas_out's). The run path's DeviceBlas.gemm takes a layout but neither a
    C type nor a batch: this is the tuner's until it does."""
    import ctypes

    from tuner.runtime.cublas import CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, GEMM_DEFAULT, OP_N, \
        OP_T, _PRECISION

    ab_t, _, compute, scalar = _PRECISION[dtype]
    c_t = {DType.F32: CUDA_R_32F, DType.F16: CUDA_R_16F, DType.BF16: CUDA_R_16BF}[out]
    al, be = scalar(alpha), scalar(beta)
    # column-major C^T (n x m) = op(B)^T op(A)^T: a row-major operand is its own transpose
    # to cuBLAS (OP_N), a column-major one needs OP_T
    op_a, op_b = (OP_T if x == "t" else OP_N for x in layout.value)
    P, I, LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    if batch == 1:
        status = blas.lib.cublasGemmEx(
            blas.handle, I(op_b), I(op_a), I(n), I(m), I(k), ctypes.byref(al), P(int(b)),
            I(ab_t), I(ldb), P(int(a)), I(ab_t), I(lda), ctypes.byref(be), P(int(c)), I(c_t),
            I(ldc), I(compute), I(GEMM_DEFAULT))
        what = "cublasGemmEx"
    else:
        status = blas.lib.cublasGemmStridedBatchedEx(
            blas.handle, I(op_b), I(op_a), I(n), I(m), I(k), ctypes.byref(al), P(int(b)),
            I(ab_t), I(ldb), LL(sb), P(int(a)), I(ab_t), I(lda), LL(sa), ctypes.byref(be),
            P(int(c)), I(c_t), I(ldc), LL(sc), I(batch), I(compute), I(GEMM_DEFAULT))
        what = "cublasGemmStridedBatchedEx"
    if status != 0:
        from tuner.runtime.errors import CublasError

        raise CublasError(f"{what} failed with cublasStatus {status}")


class Problem:
    """A, B (fresh random normal inputs stored in `dtype`'s input type: fp32 for fp32 and
    tf32), C (in the variant's output type), and float64 references of
    act(alpha*A*B + beta*C0 + bias), made on demand: `reference(r)` for the inputs rounded
    to r (what a kernel multiplying in r computes exactly), `reference(DType.F32)` for the
    fp32 values drawn before any rounding.

    A and B are stored as `variant.layout` says (a column-major A holds element (m, k) at
    A[k * lda + m]; lda, ldb default to the dense stride of that storage); a batch of
    `batch` problems follows each other at the dense strides (of A, of B unless
    `broadcast_b`: one B, stride 0, and of C: M x ldc). With a bias (variant.bias) the
    vector holds N random values in its type. For batch 1 the host arrays are 2-D, as
    before batches: ``a32`` (the stored A, before rounding), ``b32``, ``c0``.

    The references are cuBLAS float64 products, on the GPU, their epilogue applied there in
    float64 (gemm_tune_epilogue_ref); the error of C against one is summed on the GPU too
    (only a float comes back).
    """

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 alpha: float = 1.0, beta: float = 0.0, lda: int | None = None,
                 ldb: int | None = None, ldc: int | None = None, *,
                 variant: Variant | None = None, batch: int = 1, broadcast_b: bool = False):
        self.m, self.n, self.k = shape
        self.dtype, self.alpha, self.beta = dtype, alpha, beta
        self.variant = v = variant or Variant()
        self.out, self.batch, self.broadcast_b = v.out, int(batch), bool(broadcast_b)
        self.a_col, self.b_col = (x == "t" for x in v.layout.value)
        m, n, k = self.m, self.n, self.k
        self.lda = lda or (m if self.a_col else k)
        self.ldb = ldb or (k if self.b_col else n)
        self.ldc = ldc or n
        a_shape = stored_shape(m, k, self.lda, self.a_col)
        b_shape = stored_shape(k, n, self.ldb, self.b_col)
        b_count = 1 if self.broadcast_b else self.batch
        # strides between a batch's problems, in elements (0: one operand for all)
        self.strides = (a_shape[0] * a_shape[1], 0 if self.broadcast_b else b_shape[0] * b_shape[1],
                        m * self.ldc)
        lead = () if self.batch == 1 else (self.batch,)
        rng = np.random.default_rng(seed)
        self.a32 = rng.standard_normal(lead + a_shape, dtype=np.float32)
        self.b32 = rng.standard_normal((() if b_count == 1 else (b_count,)) + b_shape,
                                       dtype=np.float32)
        self.c0 = rng.standard_normal(lead + (m, self.ldc), dtype=np.float32) if beta else None
        stored = DType.F32 if dtype in (DType.TF32, DType.F32X3) else dtype
        self.a = DeviceArray(round_to(self.a32, stored)[0])
        self.b = DeviceArray(round_to(self.b32, stored)[0])
        self.c = self._c_buffer(self.out)
        self.bias = None  # the bias vector on the GPU (its type: C's, or fp32)
        self.bias64 = None  # its values, float64
        if v.bias != "none":
            bias_t = DType.F32 if v.bias == "f32" else self.out
            stored_bias, values = round_to(rng.standard_normal(n, dtype=np.float32), bias_t)
            self.bias, self.bias64 = DeviceArray(stored_bias), values.astype(np.float64)
        self._refs: dict = {}
        self._sum = driver.Buffer(8)
        self.flops = 2.0 * m * n * k * self.batch

    def _c_buffer(self, out: DType) -> "DeviceArray":
        """A C of type `out` (batch x M x ldc), uninitialised (reset_c poisons it)."""
        shape = ((self.m, self.ldc) if self.batch == 1 else (self.batch, self.m, self.ldc))
        return DeviceArray(np.empty(shape, _C_STORAGE[out][0]))

    def _logical(self, x: np.ndarray, rows: int, cols: int, column_major: bool, i: int):
        """Problem i's rows x cols operand of host array x (stored as the layout says;
        a lone matrix serves every problem), as contiguous float64."""
        one = x if x.ndim == 2 else x[i]
        return np.ascontiguousarray(logical(one, rows, cols, column_major), dtype=np.float64)

    def reference(self, rounding: DType = DType.F32, epilogue: bool = True):
        """(float64 reference on the GPU, its norm) for inputs rounded to `rounding`,
        packed as batch x M rows of N; with `epilogue`, alpha, beta, the bias and the
        activation applied (without: alpha * A * B + beta * C0, cuBLAS's problem)."""
        key = (rounding, epilogue)
        if key not in self._refs:
            m, n, k = self.m, self.n, self.k
            a_r, b_r = (round_to(x, rounding)[1] for x in (self.a32, self.b32))
            ref = driver.Buffer(self.batch * m * n * 8)
            for i in range(self.batch):  # one problem's float64 operands on the GPU at a time
                a = DeviceArray(self._logical(a_r, m, k, self.a_col, i))
                b = DeviceArray(self._logical(b_r, k, n, self.b_col, i))
                cublas().dgemm(m, n, k, a.ptr, k, b.ptr, n, ref.ptr + i * m * n * 8, n)
                driver.synchronize()  # before a and b are freed (rebound) for the next one
            c0 = bias = None
            if self.c0 is not None:  # C0 as C holds it (rounded to C's type)
                c0 = DeviceArray(np.ascontiguousarray(round_to(self.c0, self.out)[1][..., :n],
                                                      dtype=np.float64))
            v = self.variant
            if epilogue and self.bias64 is not None:
                bias = DeviceArray(self.bias64)
            act = ACT_CODES[v.act] if epilogue else 0
            image, f = _kernel("gemm_tune_epilogue_ref")
            image.launch(f, (_blocks(self.batch * m * n), 1, 1), (256, 1, 1), 0,
                         image.params("PLiffPPi").pack(
                             ref.ptr, self.batch * m, n, self.alpha, self.beta,
                             c0.ptr if c0 is not None else 0,
                             bias.ptr if bias is not None else 0, act))
            host = ref.download(np.empty(self.batch * m * n, np.float64))
            self._refs[key] = ref, float(np.linalg.norm(host)) or 1.0
        return self._refs[key]

    def reset_c(self, c: "DeviceArray | None" = None, out: DType | None = None) -> None:
        """Poison C (or `c`, of type `out`) with NaN (then restore C0 where beta reads it)."""
        c, out = (self.c, self.out) if c is None else (c, out)
        _poison(c.buf, out, c.buf.nbytes // out.size)
        if self.c0 is not None:
            c.set(round_to(self.c0, out)[0])

    def error(self, rounding: DType | None = None, *, c: "DeviceArray | None" = None,
              out: DType | None = None, epilogue: bool = True) -> float:
        """||C - ref|| / ||ref|| over the problems' M x N blocks (NaN if any element is
        unwritten; ||ref|| at least :func:`error_floor`'s for C's type), ref on the inputs rounded to `rounding` (default: as stored; F32: before
        rounding); `c` of type `out` instead of C, `epilogue` False for a reference without
        the bias and the activation."""
        ref, norm = self.reference(self.dtype if rounding is None else rounding, epilogue)
        c, out = (self.c, self.out) if c is None else (c, out)
        image, f = _kernel(f"gemm_tune_squared_error_{out.short}")
        rows = self.batch * self.m
        self._sum.fill32(0)
        image.launch(f, (_blocks(rows * self.n), 1, 1), (256, 1, 1), 0, image.params(
            "PiPLiP").pack(c.ptr, self.ldc, ref.ptr, rows, self.n, self._sum.ptr))
        total = self._sum.download(np.empty(1, np.float64))[0]
        norm = max(norm, error_floor(out, rows * self.n))
        return math.sqrt(total) / norm if total == total else float("nan")

    def args(self):
        """(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): a launch's arguments, pointers."""
        return (self.m, self.n, self.k, self.alpha, self.a.ptr, self.lda, self.b.ptr,
                self.ldb, self.beta, self.c.ptr, self.ldc)

    def bind(self, runner, dev):
        """`runner` (tuner.runtime.runners) bound to this problem on `dev`: its layout's
        leading dimensions, and for a batch its count and strides."""
        extra = {} if self.batch == 1 else dict(batch=self.batch, strides=self.strides)
        return runner.bind(dev, self.m, self.n, self.k, self.lda, self.ldb, self.ldc, **extra)

    def run(self, launch) -> None:
        """launch(a, b, c, alpha, beta, stream[, bias]) on this problem, on the legacy
        default stream (a runner's bound call)."""
        if self.bias is None:
            launch(self.a.ptr, self.b.ptr, self.c.ptr, self.alpha, self.beta, 0)
        else:
            launch(self.a.ptr, self.b.ptr, self.c.ptr, self.alpha, self.beta, 0,
                   bias=self.bias.ptr)


class GpuBenchmark:
    """Verifies and times candidates, and times cuBLAS with the same function.

    The search takes it as an argument (a fake one stands in for it in CPU tests).
    `variant` (default: the plain problem, NN and fp32 C without an epilogue), `batch` and
    `broadcast_b` make the problem a program's (see :class:`Problem`).
    """

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 target_ms: float = 50.0, *, variant: Variant | None = None, batch: int = 1,
                 broadcast_b: bool = False):
        self.dev = device()
        self.arch = driver.arch_with_clusters(self.dev)
        self.shape, self.dtype, self.target_ms = tuple(shape), dtype, target_ms
        self.problem = Problem(shape, dtype, seed, variant=variant, batch=batch,
                               broadcast_b=broadcast_b)
        self.flush = L2Flush(self.dev)
        self.flops = self.problem.flops
        self._blas_c = None  # cuBLAS's own C where it cannot write the problem's type

    def measure(self, config: Config, cubin) -> Measurement:
        """Load, check and time one candidate on this problem, through its family's runner
        (tuner.runtime.runners: the launcher the library ships). A kernel that cannot take
        the problem's operands (a wgmma kernel where TMA cannot describe them), or builds
        another variant than the problem's, is REJECTED with its reason and never
        launched; a launch that fails is LAUNCH_FAILED."""
        p = self.problem
        want = getattr(p, "variant", None)
        if want is not None and Variant.of(config) != want:
            return Measurement(Outcome.REJECTED, message=(
                f"{config.name} builds {Variant.of(config).key}; the problem is {want.key}"))
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        try:
            runner = runner_for(config, image)
            run = (p.bind(runner, self.dev) if hasattr(p, "bind")
                   else runner.bind(self.dev, p.m, p.n, p.k, p.lda, p.ldb, p.ldc))
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

    @property
    def baseline_label(self) -> str:
        p = self.problem
        return baseline_label(self.dtype, p.variant, p.batch, p.broadcast_b)

    def baseline_call(self) -> tuple[Callable[[], None], "DeviceArray", DType]:
        """(run, C, C's type): cuBLAS's launch of the same GEMM (layout, batch, C's type
        where it has it: blas_out) on the legacy default stream, and the C it writes."""
        p, blas = self.problem, cublas()
        out = blas_out(self.dtype, p.out)
        if out is p.out:
            c = p.c
        else:
            if self._blas_c is None:
                self._blas_c = p._c_buffer(out)
            c = self._blas_c
        sa, sb, sc = p.strides

        def run():
            _blas_gemm(blas, self.dtype, out, p.variant.layout, p.m, p.n, p.k, p.alpha,
                       p.a.ptr, p.lda, sa, p.b.ptr, p.ldb, sb, p.beta, c.ptr, p.ldc, sc,
                       p.batch)
        return run, c, out

    def baseline(self) -> Measurement:
        """cuBLAS on the same GEMM (baseline_call), checked the same way against the
        reference without the bias and the activation (which it does not do:
        baseline_label), timed the same way."""
        p = self.problem
        run, c, out = self.baseline_call()
        p.reset_c(c, out)
        run()
        driver.synchronize()
        err = p.error(c=c, out=out, epilogue=False)
        err_exact = err if p.dtype is DType.F32 else p.error(DType.F32, c=c, out=out,
                                                             epilogue=False)
        return Measurement(Outcome.TIMED, timing=do_bench(run, self.flush, self.target_ms),
                           error=err, error_exact=err_exact)
