"""gemm-tune's tuner: search space, occupancy model, GPU runner, cuBLAS baseline,
Optuna search, cache of winners, the tuned-kernel library and the command line.

Importing it loads no GPU package; the GPU modules import cuda-bindings (the driver
binding of the run path, tuner.runtime, which the tuner's timing uses too) when first
used.

Example:
    >>> from tuner import load_library
    >>> lib = load_library("artifacts/library")   # doctest: +SKIP
    >>> C = lib.gemm(A, B)                         # doctest: +SKIP
"""

from tuner.runtime import Library, LibraryError, load_library

__all__ = ["load_library", "Library", "LibraryError"]
