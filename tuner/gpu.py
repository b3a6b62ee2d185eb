"""The tuner's GPU: the device a tuning process times on (GEMM_TUNE_DEVICE, default 0),
reached through the run path's driver binding (tuner.runtime.driver, NVIDIA's
cuda-bindings) like everything else that touches the GPU, and the tuner's cuBLAS handle.

Candidates are launched by their family's runner (tuner.runtime.runners), the same object
the library ships; nothing here launches a kernel.
"""

from __future__ import annotations

import functools
import os

from tuner.runtime import driver
from tuner.runtime.errors import NoGPUError, UsageError

__all__ = ["NoGPUError", "device", "cublas"]


@functools.cache
def device(index: int | None = None) -> driver.Gpu:
    """The tuning GPU, its primary context made current on this thread (once per process)."""
    if index is None:
        text = os.environ.get("GEMM_TUNE_DEVICE", "0")
        if not text.strip().isdigit():
            raise UsageError(f"GEMM_TUNE_DEVICE={text!r} is not a GPU's index (0, 1, ...)")
        index = int(text)
    try:
        g = driver.gpu(index)
    except NoGPUError as e:
        raise NoGPUError(f"timing needs a CUDA GPU, and here {e}. Without one, `gemm-tune "
                         "--shape MxNxK --dry-run` generates, compiles and models the "
                         "candidates") from None
    driver.call("cuCtxSetCurrent", g.ctx)
    return g


@functools.cache
def cublas():
    """The tuner's cuBLAS handle (the baseline), in this process's primary context."""
    from tuner.runtime.cublas import Cublas

    device()  # the primary context must be current before cublasCreate
    return Cublas()
