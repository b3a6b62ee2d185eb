"""Matrix operands of Library.gemm: numpy arrays, pycuda GPUArrays, or objects exposing
__cuda_array_interface__ (torch, cupy). Everything is checked before any launch."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses

import numpy as np

from tuner.library import LibraryError

from codegen.config import DType

_F32 = np.dtype(np.float32)
#: element types by numpy dtype (bfloat16 has none: it comes through torch only)
_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16}
_TORCH = {"torch.float32": DType.F32, "torch.float16": DType.F16, "torch.bfloat16": DType.BF16}


@dataclasses.dataclass
class Operand:
    name: str
    obj: object
    rows: int
    cols: int
    ld: int  # elements between rows
    ptr: int | None  # device pointer, None for host (numpy) arrays
    host: np.ndarray | None = None
    dtype: DType = DType.F32


def _elem(name: str, kind, inputs: bool) -> DType:
    """The operand's element type; A and B may be float32, float16 or bfloat16, C float32."""
    dt = _TORCH.get(str(kind)) or _NUMPY.get(_np_dtype(kind))
    if dt is None or (dt is not DType.F32 and not inputs):
        want = "float32, float16 or bfloat16" if inputs else "float32 (FP32 output)"
        raise LibraryError(f"{name} is {str(kind).replace('torch.', '')}; {name} must be {want}")
    return dt


def _np_dtype(kind):
    try:
        return np.dtype(kind)
    except TypeError:
        return None


def _dims(name, shape, strides, itemsize):
    if len(shape) != 2:
        raise LibraryError(f"{name} must be a 2-D matrix (got {len(shape)} dimensions)")
    rows, cols = (int(x) for x in shape)
    if rows < 1 or cols < 1:
        raise LibraryError(f"{name} is {rows}x{cols}: every dimension must be at least 1")
    if strides is None:
        return rows, cols, cols
    rs, cs = (int(x) for x in strides)
    if cs != itemsize or rs % itemsize or rs // itemsize < cols:
        raise LibraryError(f"{name} is not row-major with contiguous columns (strides {rs}, "
                           f"{cs} bytes); pass a contiguous array")
    return rows, cols, rs // itemsize


def _device_of(ptr: int, name: str) -> int:
    from tuner.gpu import _libcuda

    ordinal = ctypes.c_int()
    # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    status = _libcuda().cuPointerGetAttribute(ctypes.byref(ordinal), 9, ctypes.c_uint64(ptr))
    if status != 0:
        raise LibraryError(f"{name}'s data pointer {ptr:#x} is not CUDA device memory")
    return ordinal.value


def operand(x, name: str, writable: bool = False, inputs: bool = False) -> Operand:
    """Shape, dtype, layout and kind of one operand; no device access. `inputs`: A or B
    (float32, float16 or bfloat16); otherwise C (float32)."""
    if isinstance(x, np.ndarray):
        dt = _elem(name, x.dtype, inputs)
        rows, cols, _ = _dims(name, x.shape, None, x.itemsize)
        if writable and not x.flags.writeable:
            raise LibraryError(f"{name} is read-only")
        return Operand(name, x, rows, cols, cols, None, host=x, dtype=dt)
    if type(x).__module__.split(".")[0] == "torch":  # torch exports no bfloat16 through CAI
        dt = _elem(name, x.dtype, inputs)
        if not x.is_cuda:
            raise LibraryError(f"{name} is a CPU torch tensor; pass a CUDA tensor or numpy")
        if x.dim() != 2:
            raise LibraryError(f"{name} must be a 2-D matrix (got {x.dim()} dimensions)")
        rows, cols, ld = _dims(name, x.shape, [st * x.element_size() for st in x.stride()],
                               x.element_size())
        return Operand(name, x, rows, cols, ld, int(x.data_ptr()), dtype=dt)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None and hasattr(x, "gpudata"):  # a pycuda GPUArray
        dt = _elem(name, x.dtype, inputs)
        rows, cols, ld = _dims(name, x.shape, x.strides, x.dtype.itemsize)
        ptr = int(x.gpudata)
    elif cai is not None:
        dt = _elem(name, np.dtype(cai["typestr"]), inputs)
        rows, cols, ld = _dims(name, cai["shape"], cai.get("strides"),
                               np.dtype(cai["typestr"]).itemsize)
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise LibraryError(f"{name} is read-only")
    else:
        raise LibraryError(f"{name} must be a numpy array, a pycuda GPUArray, a torch tensor "
                           f"or expose __cuda_array_interface__ (got {type(x).__name__})")
    return Operand(name, x, rows, cols, ld, int(ptr), dtype=dt)


def check_devices(device: int, *ops: Operand) -> None:
    """Every GPU operand must live on `device` (the library's)."""
    for o in ops:
        if o.ptr is not None:
            where = _device_of(o.ptr, o.name)
            if where != device:
                raise LibraryError(f"{o.name} is on GPU {where}; the library runs on GPU {device}")


def empty_like(a, shape):
    """An output of a's kind: numpy, pycuda, torch or cupy."""
    mod = type(a).__module__.split(".")[0]
    if isinstance(a, np.ndarray):
        return np.empty(shape, np.float32)
    if mod == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32, device=a.device)
    if mod == "cupy":
        import cupy

        return cupy.empty(shape, dtype=cupy.float32)
    import pycuda.gpuarray as ga

    return ga.empty(shape, np.float32)


@contextlib.contextmanager
def on_device(*ops: Operand):
    """Device pointers for the operands; host ones are copied in, and C back out, around
    a launch on the default stream (synchronized before returning when a copy is due)."""
    import pycuda.gpuarray as ga

    from tuner.gpu import _drv

    staged = {}
    for o in ops:
        if o.host is not None:
            staged[o.name] = ga.to_gpu(np.ascontiguousarray(o.host))
    yield tuple(int(staged[o.name].gpudata) if o.name in staged else o.ptr for o in ops)
    if staged:
        _drv().Context.synchronize()
        for o in ops:
            if o.host is not None and o.name == "C":
                o.host[...] = staged["C"].get()
