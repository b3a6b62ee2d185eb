"""cuBLAS at matched precision, through a thin ctypes layer over the cuBLAS shared
library of the CUDA install (found as the CUDA Python ecosystem finds it:
cuda-pathfinder when installed, else $CUDA_HOME/lib64, else the loader's path). It is
the tuner's baseline and the run-time library's fallback and rival.

Row-major C = A * B is computed as the column-major C^T = B^T * A^T, which is the
same memory: no transposes, no copies.

The run path (:func:`device_blas`) keeps one handle per GPU, used under a lock; every
call sets the caller's stream and a workspace of that (device, stream) (cublasSetStream
would otherwise fall back to one default workspace that two streams would share), and
during CUDA-graph capture, where nothing may be allocated, a stream with no workspace
yet runs without one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from pathlib import Path

from codegen.config import DType
from tuner.runtime.errors import CublasError

__all__ = ["CublasError", "Cublas", "DeviceBlas", "device_blas", "has_handle", "WORKSPACE_BYTES",
           "cublas_version", "writes"]

log = logging.getLogger(__name__)

# cudaDataType_t, cublasComputeType_t (cublas_api.h / library_types.h)
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
OP_N, OP_T, GEMM_DEFAULT = 0, 1, -1

#: dtype -> (A/B type, C type, compute type, scalar ctype)
_PRECISION = {
    DType.F32: (CUDA_R_32F, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),  # no TF32: pure FP32
    DType.TF32: (CUDA_R_32F, CUDA_R_32F, COMPUTE_32F_FAST_TF32, ctypes.c_float),
    DType.F32X3: (CUDA_R_32F, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),  # fp32 accuracy
    DType.F16: (CUDA_R_16F, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),
    DType.BF16: (CUDA_R_16BF, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),
}
#: C's cudaDataType_t by its type
_C_TYPE = {DType.F32: CUDA_R_32F, DType.F16: CUDA_R_16F, DType.BF16: CUDA_R_16BF}


def writes(dtype: DType, out: DType) -> bool:
    """Can cublasGemmEx write C of type `out` for a `dtype` request (FP32 compute)? fp32 C
    always; a 16-bit C only of the inputs' own type (cuBLAS's table of GemmEx types)."""
    return out is DType.F32 or out is dtype


def _load() -> ctypes.CDLL:
    tried = []
    try:
        from cuda import pathfinder  # type: ignore[import-not-found]

        return ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception as e:  # noqa: BLE001 - not installed, or found nothing: try the rest
        tried.append(f"cuda-pathfinder: {e}")
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for root in filter(None, roots):
        for lib in sorted(Path(root, "lib64").glob("libcublas.so*"), reverse=True):
            try:
                return ctypes.CDLL(str(lib))
            except OSError as e:
                tried.append(f"{lib}: {e}")
    name = ctypes.util.find_library("cublas")
    if name:
        return ctypes.CDLL(name)
    raise CublasError("cannot find the cuBLAS library (" + "; ".join(tried) + ")")


@functools.cache
def cublas_version() -> int:
    """cuBLAS's version as major * 10000 + minor * 100 + patch (no handle, no GPU needed)."""
    lib = _load()
    parts = []
    for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        if lib.cublasGetProperty(prop, ctypes.byref(v)) != 0:
            raise CublasError("cublasGetProperty failed")
        parts.append(v.value)
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


class Cublas:
    """One cuBLAS handle, made in the context current on this thread (a primary context)."""

    def __init__(self):
        self.lib = _load()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        ver = ctypes.c_int()
        self._check(self.lib.cublasGetVersion_v2(self.handle, ctypes.byref(ver)), "cublasGetVersion")
        self.version = ver.value

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cublasStatus {status}")

    def gemm(self, dtype, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream=None) -> None:
        """Row-major C = alpha*A*B + beta*C at `dtype`'s precision, asynchronously on
        `stream` (an int handle, an object with `.handle`, or None: the default stream)."""
        self.set_stream(stream)
        self._gemm(*_PRECISION[dtype], m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def dgemm(self, m, n, k, a, lda, b, ldb, c, ldc, stream=None) -> None:
        """Row-major float64 C = A*B: the reference the candidates are checked against."""
        self.set_stream(stream)
        self._gemm(CUDA_R_64F, CUDA_R_64F, COMPUTE_64F, ctypes.c_double,
                   m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)

    def set_stream(self, stream) -> None:
        """Bind the handle to `stream` (cuBLAS then uses its default workspace)."""
        if stream is not None and not isinstance(stream, int):
            stream = int(stream.handle)
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream or 0)),
                    "cublasSetStream")

    def _gemm(self, ab_t, c_t, compute, scalar, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        al, be = scalar(alpha), scalar(beta)
        # column-major C^T (n x m) = B^T (n x k) * A^T (k x m)
        self._check(self.lib.cublasGemmEx(
            self.handle, OP_N, OP_N, n, m, k, ctypes.byref(al),
            ctypes.c_void_p(int(b)), ab_t, ldb, ctypes.c_void_p(int(a)), ab_t, lda,
            ctypes.byref(be), ctypes.c_void_p(int(c)), c_t, ldc, compute, GEMM_DEFAULT,
        ), "cublasGemmEx")

    def set_workspace(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(ptr),
                                                   ctypes.c_size_t(nbytes)), "cublasSetWorkspace")


#: cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB suffices before it)
WORKSPACE_BYTES = 32 << 20


class DeviceBlas:
    """The run path's cuBLAS on one GPU: one handle, any thread, the caller's stream.

    The handle is re-bound (stream, then that stream's workspace) only when a call comes
    on another stream than the last: cublasSetStream and cublasSetWorkspace on every call
    cost host time and, measured on the H200, serialised back-to-back calls. The GemmEx
    entry point has its argument types declared once, and alpha and beta live in two
    floats of the handle's own, so a call converts no more than it must.
    """

    def __init__(self, g):
        from tuner.runtime.driver import entered

        self.gpu = g
        with entered(g):
            self.blas = Cublas()
        self.version = self.blas.version
        self._lock = threading.Lock()
        self._bound: tuple | None = None  # (stream, workspace) the handle is set to
        self._alpha, self._beta = ctypes.c_float(), ctypes.c_float()
        self._dalpha, self._dbeta = ctypes.c_double(), ctypes.c_double()
        self._ex = self.blas.lib.cublasGemmEx
        P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        self._ex.argtypes = [P, I, I, I, I, I, P, P, I, I, P, I, I, P, P, I, I, I, I]
        self._ex.restype = I
        self._batched = self.blas.lib.cublasGemmStridedBatchedEx
        self._batched.argtypes = [P, I, I, I, I, I, P, P, I, I, L, P, I, I, L, P, P, I, I, L,
                                  I, I, I]
        self._batched.restype = I

    def gemm(self, dtype, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream: int,
             allocate_captured=None, layout=None, out=None, batch: int = 1,
             strides: tuple = (0, 0, 0)) -> None:
        """Row-major C = alpha A B + beta C on `stream`; `layout` (codegen's Layout, default
        NN) says which of A and B are stored column-major (lda / ldb between columns);
        `out`: C's type (default fp32; see :func:`writes`); `batch` problems `strides`
        elements apart (0: one A or B for all) through cublasGemmStridedBatchedEx."""
        ab_t, c_t, compute, scalar = _PRECISION[dtype]
        if out is not None:
            c_t = _C_TYPE[out]
        with self._lock:
            if self._bound is None or self._bound[0] != stream or not self._bound[1]:
                self._bind(stream, allocate_captured)
            al, be = (self._alpha, self._beta) if scalar is ctypes.c_float else \
                (self._dalpha, self._dbeta)
            al.value, be.value = alpha, beta
            # column-major C^T (n x m) = B^T (n x k) * A^T (k x m): a row-major operand is
            # its transpose to cuBLAS (OP_N), a column-major one is itself (OP_T)
            op_a, op_b = (OP_T if x == "t" else OP_N for x in (layout.value if layout else "nn"))
            if batch == 1:
                status = self._ex(self.blas.handle, op_b, op_a, n, m, k, ctypes.addressof(al),
                                  b, ab_t, ldb, a, ab_t, lda, ctypes.addressof(be), c, c_t, ldc,
                                  compute, GEMM_DEFAULT)
            else:
                sa, sb, sc = strides
                status = self._batched(self.blas.handle, op_b, op_a, n, m, k,
                                       ctypes.addressof(al), b, ab_t, ldb, sb, a, ab_t, lda, sa,
                                       ctypes.addressof(be), c, c_t, ldc, sc, batch, compute,
                                       GEMM_DEFAULT)
        if status != 0:
            what = "cublasGemmEx" if batch == 1 else "cublasGemmStridedBatchedEx"
            raise CublasError(f"{what} failed with cublasStatus {status}")

    def _bind(self, stream: int, allocate_captured) -> None:
        from codegen.errors import UsageError
        from tuner.runtime.driver import scratch

        try:
            ws = scratch().get(self.gpu, stream, "cuBLAS workspace", WORKSPACE_BYTES,
                               allocate_captured=allocate_captured)
        except UsageError:  # capturing, none for this stream yet: run without one
            ws = 0
        self.blas.set_stream(stream)
        self.blas.set_workspace(ws, WORKSPACE_BYTES if ws else 0)  # after the stream
        self._bound = (stream, ws)


_BLAS: dict[int, DeviceBlas] = {}
_BLAS_LOCK = threading.Lock()


def has_handle(g) -> bool:
    """Has the run path made its cuBLAS handle on GPU `g` yet (it cannot during capture)?"""
    return g.index in _BLAS


def device_blas(g) -> DeviceBlas:
    """The run path's cuBLAS on GPU `g` (made once per process)."""
    blas = _BLAS.get(g.index)
    if blas is None:
        with _BLAS_LOCK:
            blas = _BLAS.get(g.index) or DeviceBlas(g)
            _BLAS[g.index] = blas
    return blas
