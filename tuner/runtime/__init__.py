"""gemm-tune's run path: the tuned-kernel library, its dispatch, operands and launches,
and the C/C++ export. A program that only runs tuned kernels imports this package and
nothing of the search: no optuna, matplotlib or rich; cuda-bindings (NVIDIA's driver-API
bindings) only when a call first reaches the GPU.

Example:
    >>> from tuner.runtime import load_library
    >>> lib = load_library("artifacts/library")   # doctest: +SKIP
    >>> C = lib.gemm(A, B)                         # doctest: +SKIP
"""

from tuner.runtime.dispatch import Choice
from tuner.runtime.library import Library, LibraryError, load_library

__all__ = ["load_library", "Library", "LibraryError", "Choice"]
