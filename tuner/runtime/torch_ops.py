"""gemm-tune's GEMM as a torch custom op, for torch.compile and CUDA graphs.

    from tuner.runtime import torch_ops
    name = torch_ops.library_key(lib)            # or a library's path
    C = torch_ops.gemm(A, B, library=name)                          # A @ B
    C = torch_ops.gemm(A, B, C0, alpha=0.5, beta=2.0, library=name) # ... + 2 C0 (C0 kept)

Importing this module (it needs torch) defines ``torch.ops.gemm_tune.gemm``: functional
(it returns a new float32 tensor), with a fake implementation for tracing, running
Library.gemm on torch's current stream; so a function calling it compiles under
``torch.compile(fullgraph=True)`` and records into ``torch.cuda.graph``. Operands that are
not row-major (a transposed view, say) are made contiguous first. A custom op takes no
Python objects, so the library is named by a string: its resolved path, loaded once per
process (or the object registered under it by :func:`library_key`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["gemm", "library_key"]

_LIBRARIES: dict[str, object] = {}
_LOCK = threading.Lock()


def library_key(library) -> str:
    """The string that names `library` (a Library, or the path of one) to the op."""
    if isinstance(library, (str, Path)):
        return str(Path(library).resolve())
    key = str(Path(library.path).resolve())
    with _LOCK:
        _LIBRARIES.setdefault(key, library)
    return key


def _library(key: str):
    lib = _LIBRARIES.get(key)
    if lib is None:
        from tuner.runtime.library import load_library

        with _LOCK:
            lib = _LIBRARIES.get(key) or load_library(key)
            _LIBRARIES[key] = lib
    return lib


def _rows(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 and x.stride(0) >= x.shape[1] else x.contiguous()


@torch.library.custom_op("gemm_tune::gemm", mutates_args=(), device_types="cuda")
def _gemm_op(a: Tensor, b: Tensor, c: Tensor | None, alpha: float, beta: float, library: str,
             allow_tf32: bool) -> Tensor:
    if c is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32, device=a.device)
        beta = 0.0
    else:
        out = c.to(torch.float32, copy=True, memory_format=torch.contiguous_format)
    _library(library).gemm(_rows(a), _rows(b), out, alpha=alpha, beta=beta,
                           allow_tf32=allow_tf32)
    return out


@_gemm_op.register_fake
def _(a, b, c, alpha, beta, library, allow_tf32):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)


def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0,
         beta: float = 0.0, *, library: str, allow_tf32: bool = False) -> Tensor:
    """alpha * a @ b + beta * c through torch.ops.gemm_tune.gemm; `library` from
    :func:`library_key`."""
    return torch.ops.gemm_tune.gemm(a, b, c, float(alpha), float(beta), library,
                                    bool(allow_tf32))
