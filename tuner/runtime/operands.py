"""Matrix operands of Library.gemm, and the stream a call runs on.

Operands: torch tensors, cupy arrays, anything exposing __cuda_array_interface__, pycuda
GPUArrays (used in place), and numpy arrays (staged through the GPU). Everything is
checked before any launch.

Streams, in this order: the call's `stream=` argument (an int handle, or an object with
`.handle`, `.ptr`, `.cuda_stream` or `__cuda_stream__`); torch's current stream on the
tensors' device for torch tensors (its raw handle, not a Python stream object); cupy's
current stream for cupy arrays; the stream a __cuda_array_interface__ producer names;
else the legacy default stream (0).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from codegen.config import DType
from tuner.runtime.errors import DriverError, LibraryError

__all__ = ["Operand", "operand", "resolve_stream", "same_device", "empty_like", "align_class"]

#: element types by numpy dtype (bfloat16 has none: it comes through torch only)
_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16}
_TORCH = {"torch.float32": DType.F32, "torch.float16": DType.F16, "torch.bfloat16": DType.BF16}


def _error(msg: str) -> LibraryError:
    return LibraryError(msg)


@dataclasses.dataclass
class Operand:
    name: str
    obj: object
    rows: int
    cols: int
    ld: int  # elements between rows (between columns where column_major)
    ptr: int | None  # device pointer, None for host (numpy) arrays
    device: int | None = None  # GPU ordinal, None for host arrays
    host: np.ndarray | None = None
    dtype: DType = DType.F32
    kind: str = "cai"  # "torch", "cupy", "pycuda", "cai" or "numpy"
    stream: int | None = None  # a stream the producer names (__cuda_array_interface__ v3)
    column_major: bool = False  # stored by columns: a transposed view of a row-major matrix

    @property
    def stored(self) -> tuple[int, int]:
        """(lines, elements per line) as stored: rows x cols, or cols x rows by columns."""
        return (self.cols, self.rows) if self.column_major else (self.rows, self.cols)


def _elem(name: str, kind, inputs: bool) -> DType:
    """The operand's element type; A and B may be float32, float16 or bfloat16, C float32."""
    dt = _TORCH.get(str(kind)) or _NUMPY.get(_np_dtype(kind))
    if dt is None or (dt is not DType.F32 and not inputs):
        want = "float32, float16 or bfloat16" if inputs else "float32 (FP32 output)"
        raise _error(f"{name} is {str(kind).replace('torch.', '')}; {name} must be {want}")
    return dt


def _np_dtype(kind):
    try:
        return np.dtype(kind)
    except TypeError:
        return None


def _dims(name, shape, strides, itemsize, column_major_ok: bool = True):
    """(rows, cols, ld, column_major) of a matrix: row-major (unit stride along a row, rows
    ld >= cols elements apart) or, where `column_major_ok`, column-major (a transposed
    view: unit stride down a column, columns ld >= rows apart). A matrix of one row or one
    column is read as row-major."""
    if len(shape) != 2:
        raise _error(f"{name} must be a 2-D matrix (got {len(shape)} dimensions)")
    rows, cols = (int(x) for x in shape)
    if rows < 1 or cols < 1:
        raise _error(f"{name} is {rows}x{cols}: every dimension must be at least 1")
    if strides is None:
        return rows, cols, cols, False
    rs, cs = (int(x) for x in strides)
    if not (rs % itemsize or cs % itemsize):
        if (cs == itemsize or cols == 1) and (rs // itemsize >= cols or rows == 1):
            return rows, cols, max(rs // itemsize, cols), False
        if column_major_ok and (rs == itemsize or rows == 1) and cs // itemsize >= rows:
            return rows, cols, max(cs // itemsize, rows), True
    what = "row-major" + (" or column-major" if column_major_ok else "")
    raise _error(f"{name} is {rows}x{cols} with strides ({rs}, {cs}) bytes: it must be "
                 f"{what} with a unit stride (a contiguous array, or a transposed view "
                 "of one)")


def _device_of(ptr: int, name: str) -> int:
    from tuner.runtime import driver

    try:
        return int(driver.call("cuPointerGetAttribute",
                               driver.api().CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               ptr))
    except DriverError:
        raise _error(f"{name}'s data pointer {ptr:#x} is not CUDA device memory") from None


def operand(x, name: str, writable: bool = False, inputs: bool = False) -> Operand:
    """Shape, dtype, layout, kind and device of one operand. `inputs`: A or B (float32,
    float16 or bfloat16, row- or column-major); otherwise C (float32, row-major). numpy
    arrays are staged through row-major copies."""
    if isinstance(x, np.ndarray):
        dt = _elem(name, x.dtype, inputs)
        rows, cols, _, _ = _dims(name, x.shape, None, x.itemsize)
        if writable and not x.flags.writeable:
            raise _error(f"{name} is read-only")
        return Operand(name, x, rows, cols, cols, None, host=x, dtype=dt, kind="numpy")
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":  # torch exports no bfloat16 through __cuda_array_interface__
        dt = _elem(name, x.dtype, inputs)
        if not x.is_cuda:
            raise _error(f"{name} is a CPU torch tensor; pass a CUDA tensor or numpy")
        if x.dim() != 2:
            raise _error(f"{name} must be a 2-D matrix (got {x.dim()} dimensions)")
        rows, cols, ld, colmajor = _dims(name, x.shape, [st * x.element_size()
                                                         for st in x.stride()],
                                         x.element_size(), inputs)
        return Operand(name, x, rows, cols, ld, int(x.data_ptr()), device=x.get_device(),
                       dtype=dt, kind="torch", column_major=colmajor)
    cai = getattr(x, "__cuda_array_interface__", None)
    stream = None
    if hasattr(x, "gpudata"):  # a pycuda GPUArray (which also exports the interface)
        dt = _elem(name, x.dtype, inputs)
        rows, cols, ld, colmajor = _dims(name, x.shape, x.strides, x.dtype.itemsize, inputs)
        ptr, kind = int(x.gpudata), "pycuda"
    elif cai is not None:
        dt = _elem(name, np.dtype(cai["typestr"]), inputs)
        rows, cols, ld, colmajor = _dims(name, cai["shape"], cai.get("strides"),
                                         np.dtype(cai["typestr"]).itemsize, inputs)
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise _error(f"{name} is read-only")
        kind = "cupy" if mod == "cupy" else "cai"
        stream = cai.get("stream")
    else:
        raise _error(f"{name} must be a numpy array, a pycuda GPUArray, a torch tensor "
                     f"or expose __cuda_array_interface__ (got {type(x).__name__})")
    device = int(x.device.id) if kind == "cupy" else _device_of(int(ptr), name)
    return Operand(name, x, rows, cols, ld, int(ptr), device=device, dtype=dt, kind=kind,
                   stream=stream if isinstance(stream, int) and stream > 2 else None,
                   column_major=colmajor)


def same_device(*ops: Operand) -> int | None:
    """The one GPU every device operand lives on (None: all on the host)."""
    devices = {o.device for o in ops if o.device is not None}
    if len(devices) > 1:
        where = ", ".join(f"{o.name} on GPU {o.device}" for o in ops if o.device is not None)
        raise _error(f"the operands are on different GPUs ({where}): put them on one")
    return devices.pop() if devices else None


def resolve_stream(stream, ops: tuple[Operand, ...], device: int) -> int:
    """The stream handle the call runs on (see the module doc)."""
    if stream is not None:
        return stream_handle(stream)
    kinds = {o.kind for o in ops}
    if "torch" in kinds:
        import torch

        return torch._C._cuda_getCurrentRawStream(device)
    if "cupy" in kinds:
        import cupy

        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)
    named = {o.stream for o in ops if o.stream is not None}
    return named.pop() if len(named) == 1 else 0


def stream_handle(stream) -> int:
    """An int handle of any stream object gemm-tune's callers use."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):  # the CUDA Python stream protocol
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, cupy, pycuda
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise _error(f"stream must be an int handle or a torch, cupy, pycuda or CUDA Python "
                 f"stream (got {type(stream).__name__})")


def empty_like(a: Operand, shape, device: int):
    """An FP32 output of a's kind: numpy, torch, cupy or pycuda."""
    if a.kind == "numpy":
        return np.empty(shape, np.float32)
    if a.kind == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32, device=a.obj.device)
    if a.kind == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=cupy.float32)
    if a.kind == "pycuda":
        import pycuda.gpuarray as ga

        return ga.empty(shape, np.float32)
    raise _error("C is needed: gemm-tune cannot allocate an output like "
                 f"{type(a.obj).__name__}; pass C")


_ALIGN = [16] + [next(v for v in (8, 4, 2, 1) if r % v == 0) for r in range(1, 16)]


def align_class(ptr: int, ld: int, size: int) -> int:
    """The widest access (16, 8, 4, 2 or 1 bytes) that every row of an operand allows."""
    return _ALIGN[(ptr | ld * size) & 15]
