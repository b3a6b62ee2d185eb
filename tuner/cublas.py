"""The cuBLAS baseline at matched precision, through a thin ctypes layer over the
cuBLAS shared library of the CUDA install (found as the CUDA Python ecosystem finds
it: cuda-pathfinder when installed, else $CUDA_HOME/lib64, else the loader's path).

Row-major C = A * B is computed as the column-major C^T = B^T * A^T, which is the
same memory: no transposes, no copies.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from pathlib import Path

from codegen.config import DType
from codegen.errors import GemmTuneError

__all__ = ["CublasError", "Cublas", "cublas"]

log = logging.getLogger(__name__)

# cudaDataType_t, cublasComputeType_t (cublas_api.h / library_types.h)
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
OP_N, GEMM_DEFAULT = 0, -1

#: dtype -> (A/B type, C type, compute type, scalar ctype)
_PRECISION = {
    DType.F32: (CUDA_R_32F, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),  # no TF32: pure FP32
    DType.TF32: (CUDA_R_32F, CUDA_R_32F, COMPUTE_32F_FAST_TF32, ctypes.c_float),
    DType.F16: (CUDA_R_16F, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),
    DType.BF16: (CUDA_R_16BF, CUDA_R_32F, COMPUTE_32F, ctypes.c_float),
}


class CublasError(GemmTuneError):
    pass


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


class Cublas:
    """One cuBLAS handle on the current context's default stream."""

    def __init__(self):
        from tuner.gpu import device

        device()  # the primary context must be current before cublasCreate
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
        """Row-major C = alpha*A*B + beta*C at `dtype`'s precision, asynchronously."""
        ab_t, c_t, compute, scalar = _PRECISION[dtype]
        self._gemm(ab_t, c_t, compute, scalar, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream)

    def dgemm(self, m, n, k, a, lda, b, ldb, c, ldc, stream=None) -> None:
        """Row-major float64 C = A*B: the reference the candidates are checked against."""
        self._gemm(CUDA_R_64F, CUDA_R_64F, COMPUTE_64F, ctypes.c_double,
                   m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc, stream)

    def _gemm(self, ab_t, c_t, compute, scalar, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
              stream):
        self._check(self.lib.cublasSetStream_v2(
            self.handle, ctypes.c_void_p(int(stream.handle) if stream else 0)), "cublasSetStream")
        al, be = scalar(alpha), scalar(beta)
        # column-major C^T (n x m) = B^T (n x k) * A^T (k x m)
        self._check(self.lib.cublasGemmEx(
            self.handle, OP_N, OP_N, n, m, k, ctypes.byref(al),
            ctypes.c_void_p(int(b)), ab_t, ldb, ctypes.c_void_p(int(a)), ab_t, lda,
            ctypes.byref(be), ctypes.c_void_p(int(c)), c_t, ldc, compute, GEMM_DEFAULT,
        ), "cublasGemmEx")


@functools.cache
def cublas() -> Cublas:
    return Cublas()
