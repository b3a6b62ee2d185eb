"""Matrix operands of Library.gemm, and the stream a call runs on.

Operands: torch tensors, cupy arrays, anything exposing __cuda_array_interface__, pycuda
GPUArrays (used in place), and numpy arrays (staged through the GPU). Everything is
checked before any launch.

A matrix is 2-D, rows x cols, row-major (unit stride along a row) or, for A and B,
column-major (a transposed view: unit stride down a column); or 3-D, batch x rows x
cols, each problem of the batch a matrix as above at a batch stride of its own (0: one
matrix shared by the whole batch, as an expanded tensor or a batch of 1 is). The bias is
a vector of N elements with a unit stride.

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
from codegen.families._common import whole
from tuner.runtime.errors import DriverError, LibraryError

__all__ = ["Operand", "operand", "bias_operand", "resolve_stream", "same_device", "empty_like",
           "align_class", "out_dtype", "batch_stride"]

#: element types by numpy dtype (bfloat16 has none: it comes through torch only)
_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16}
_TORCH = {"torch.float32": DType.F32, "torch.float16": DType.F16, "torch.bfloat16": DType.BF16}
#: the names a caller may give an output type by (beside torch, numpy and cupy dtypes)
_OUT_NAMES = {"float32": DType.F32, "fp32": DType.F32, "f32": DType.F32, "float": DType.F32,
              "float16": DType.F16, "fp16": DType.F16, "f16": DType.F16, "half": DType.F16,
              "bfloat16": DType.BF16, "bf16": DType.BF16}


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
    batch: int = 1  # problems in a batch (1: a matrix, or a batch of one)
    bstride: int = 0  # elements between its problems (0: one matrix for the whole batch)
    batched: bool = False  # 3-D or more (batch dimensions x rows x cols), even of one problem
    lead: tuple = ()  # the batch dimensions as given (batch: their product)

    @property
    def stored(self) -> tuple[int, int]:
        """(lines, elements per line) as stored: rows x cols, or cols x rows by columns."""
        return (self.cols, self.rows) if self.column_major else (self.rows, self.cols)

    def geometry(self) -> tuple[tuple, tuple]:
        """(shape, strides in elements) of this operand as the caller's is laid out (a
        batch of one, or a shared matrix, at a batch stride of 0)."""
        shape = (self.rows, self.cols)
        strides = (1, self.ld) if self.column_major else (self.ld, 1)
        if self.batched:
            return (self.batch,) + shape, (self.bstride,) + strides
        return shape, strides


def _elem(name: str, kind, inputs: bool) -> DType:
    """The operand's element type: A and B float32, float16 or bfloat16; C too (FP32
    accumulation always, rounded once to C's type)."""
    dt = _TORCH.get(str(kind)) or _NUMPY.get(_np_dtype(kind))
    if dt is None:
        got = str(kind).replace("torch.", "")
        if got == "|V2":  # what cupy makes of a torch bfloat16 tensor: it has no bfloat16
            raise _error(f"{name} is a 2-byte type cupy cannot name (|V2: bfloat16 through "
                         "__cuda_array_interface__?); pass bfloat16 data as torch tensors")
        raise _error(f"{name} is {got}; {name} must be float32, float16 or bfloat16")
    return dt


def out_dtype(x) -> DType | None:
    """The DType an `out_dtype=` argument names: a torch, numpy or cupy dtype, or a name
    ("float16", "fp16", "bf16" ...); None for None."""
    if x is None or isinstance(x, DType):
        return x
    dt = _TORCH.get(str(x)) or _OUT_NAMES.get(str(x).strip().lower())
    if dt is None and not isinstance(x, str):
        dt = _NUMPY.get(_np_dtype(x))
    if dt is None:
        raise _error(f"out_dtype {x!r} is not float32, float16 or bfloat16")
    return dt


def _np_dtype(kind):
    try:
        return np.dtype(kind)
    except (TypeError, ValueError):  # not a dtype at all (("f4", -1), say)
        return None


def _dims(name, shape, strides, itemsize, column_major_ok: bool = True):
    """(rows, cols, ld, column_major, batch, bstride, lead) of a matrix, or of a batch of
    them (3-D or more: batch dimensions, then rows x cols, as torch.matmul takes them):
    row-major (unit stride along a row, rows ld >= cols elements apart) or, where
    `column_major_ok`, column-major (a transposed view: unit stride down a column, columns
    ld >= rows apart); a batch's problems bstride >= 0 elements apart (0: one matrix for
    every problem). `lead`: the batch dimensions as given (() for a matrix); several of them
    must fold into one stride (as a view of them as one dimension would: an expanded one
    may be folded only with its stride 0 throughout). A matrix of one row or one column is
    read as row-major, and so is an empty one (a dimension of 0: its strides say nothing)."""
    if len(shape) < 2:
        raise _error(f"{name} must be a 2-D matrix or a batch of them "
                     f"(got {len(shape)} dimension{'s' * (len(shape) != 1)})")
    dims = [int(x) for x in shape]
    lead, (rows, cols) = tuple(dims[:-2]), dims[-2:]
    batch = 1
    for d in lead:
        batch *= d
    if min(dims) < 0:
        what = "x".join(map(str, dims))
        raise _error(f"{name} is {what}: no dimension may be negative")
    if strides is None or not min(dims):  # (nothing of an empty operand is read)
        return rows, cols, max(cols, 1), False, batch, rows * cols if batch > 1 else 0, lead
    st = [int(x) for x in strides]
    bs = _batch_stride(name, dims, st) if lead else 0
    rs, cs = st[-2:]
    if not (rs % itemsize or cs % itemsize or bs % itemsize) and bs >= 0:
        bstride = bs // itemsize if batch > 1 else 0
        if (cs == itemsize or cols == 1) and (rs // itemsize >= cols or rows == 1):
            return rows, cols, max(rs // itemsize, cols), False, batch, bstride, lead
        if column_major_ok and (rs == itemsize or rows == 1) and cs // itemsize >= rows:
            return rows, cols, max(cs // itemsize, rows), True, batch, bstride, lead
    what = "row-major" + (" or column-major" if column_major_ok else "")
    size = "x".join(map(str, dims))
    strides_text = ", ".join(map(str, st))
    each = " (each problem of the batch)" if lead else ""
    like = "a contiguous array, or a transposed view of one" if column_major_ok else \
        "a contiguous array, or a slice of one's rows or columns"
    raise _error(f"{name} is {size} with strides ({strides_text}) bytes: it must be "
                 f"{what}{each} with a unit stride ({like})"
                 + (", at a batch stride >= 0" if lead else ""))


def batch_stride(dims, strides) -> int | None:
    """The one stride between the problems of a batch whose batch dimensions are dims[:-2]
    (0 for none): each dimension's stride the next one's times its size (dimensions of size
    1 aside), as x.view(-1, rows, cols) needs; None where they do not fold so."""
    kept = [(d, s) for d, s in zip(dims[:-2], strides[:-2]) if d != 1]
    if any(outer != inner * d for (_, outer), (d, inner) in zip(kept, kept[1:])):
        return None
    return kept[-1][1] if kept else 0


def _batch_stride(name, dims, strides) -> int:
    """batch_stride (bytes), or LibraryError where the batch dimensions do not fold."""
    bs = batch_stride(dims, strides)
    if bs is None:
        size = "x".join(map(str, dims))
        raise _error(f"{name} is {size} with strides ({', '.join(map(str, strides))}) "
                     f"bytes: its batch dimensions do not fold into one (each "
                     "dimension's stride must be the next one's times its size; "
                     "a contiguous copy will do)")
    return bs


def _device_of(ptr: int, name: str) -> int:
    from tuner.runtime import driver

    try:
        return int(driver.call("cuPointerGetAttribute",
                               driver.api().CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               ptr))
    except DriverError:
        raise _error(f"{name}'s data pointer {ptr:#x} is not CUDA device memory") from None


def operand(x, name: str, writable: bool = False, inputs: bool = False) -> Operand:
    """Shape, dtype, layout, batch, kind and device of one operand. `inputs`: A or B (row-
    or column-major); otherwise C (row-major). numpy arrays are staged through row-major
    copies and take no batch."""
    if isinstance(x, np.ndarray):
        dt = _elem(name, x.dtype, inputs)
        if x.ndim != 2:
            raise _error(f"{name} is a {x.ndim}-D numpy array: numpy operands are 2-D "
                         "matrices (a batch runs on device arrays)")
        rows, cols, *_ = _dims(name, x.shape, None, x.itemsize)
        if writable and not x.flags.writeable:
            raise _error(f"{name} is read-only")
        return Operand(name, x, rows, cols, cols, None, host=x, dtype=dt, kind="numpy")
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":  # torch exports no bfloat16 through __cuda_array_interface__
        dt = _elem(name, x.dtype, inputs)
        if not x.is_cuda:
            raise _error(f"{name} is a CPU torch tensor; pass a CUDA tensor or numpy")
        size = x.element_size()
        rows, cols, ld, colmajor, batch, bstride, lead = _dims(
            name, x.shape, [st * size for st in x.stride()], size, inputs)
        return Operand(name, x, rows, cols, ld, int(x.data_ptr()), device=x.get_device(),
                       dtype=dt, kind="torch", column_major=colmajor, batch=batch,
                       bstride=bstride, batched=bool(lead), lead=lead)
    cai = getattr(x, "__cuda_array_interface__", None)
    stream = None
    if hasattr(x, "gpudata"):  # a pycuda GPUArray (which also exports the interface)
        dt = _elem(name, x.dtype, inputs)
        dims = _dims(name, x.shape, x.strides, x.dtype.itemsize, inputs)
        ptr, kind = int(x.gpudata), "pycuda"
    elif cai is not None:
        typ, shape, strides, ptr, readonly = _interface(cai, name)
        dt = _elem(name, typ, inputs)
        dims = _dims(name, shape, strides, typ.itemsize, inputs)
        if writable and readonly:
            raise _error(f"{name} is read-only")
        kind = "cupy" if mod == "cupy" else "cai"
        stream = cai.get("stream")
    else:
        raise _error(f"{name} must be a numpy array, a pycuda GPUArray, a torch tensor "
                     f"or expose __cuda_array_interface__ (got {type(x).__name__})")
    rows, cols, ld, colmajor, batch, bstride, lead = dims
    if kind == "cupy":
        device = int(x.device.id)
    elif not ptr and not rows * cols * batch:  # an empty array may have no memory at all
        device = None
    else:
        device = _device_of(int(ptr), name)
    return Operand(name, x, rows, cols, ld, int(ptr), device=device, dtype=dt, kind=kind,
                   stream=stream if isinstance(stream, int) and stream > 2 else None,
                   column_major=colmajor, batch=batch, bstride=bstride, batched=bool(lead),
                   lead=lead)


def _interface(cai, name: str) -> tuple:
    """(element dtype, shape, byte strides or None, pointer, read-only) of a
    __cuda_array_interface__ dict; a one-line error where it is not one."""
    try:
        typ = np.dtype(cai["typestr"])
        shape, strides, (ptr, readonly) = tuple(cai["shape"]), cai.get("strides"), cai["data"]
        strides = None if strides is None else tuple(strides)
    except (TypeError, KeyError, ValueError) as e:
        raise _error(f"{name}'s __cuda_array_interface__ is malformed ({type(e).__name__}: "
                     f"{e})") from None
    if not (all(whole(v, 0) for v in shape) and whole(ptr)
            and (strides is None or (len(strides) == len(shape)
                                     and all(whole(v) for v in strides)))):
        raise _error(f"{name}'s __cuda_array_interface__ is malformed (shape {shape}, "
                     f"strides {strides}, data {cai['data']!r:.40})")
    return typ, shape, strides, int(ptr), bool(readonly)


def bias_operand(x, n: int, out: DType) -> tuple[Operand, str]:
    """The bias vector and its kind ("out": of C's type, "f32": fp32 beside 16-bit C): N
    elements with a unit stride, on the GPU."""
    if isinstance(x, np.ndarray):
        raise _error("the bias is a numpy array: pass it on the GPU (a torch tensor, a cupy "
                     "array ...)")
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        dt = _TORCH.get(str(x.dtype))
        shape, strides = tuple(x.shape), tuple(x.stride())
        if not x.is_cuda:
            raise _error("the bias is a CPU torch tensor; pass a CUDA tensor")
        ptr, device, kind = int(x.data_ptr()), x.get_device(), "torch"
    else:
        cai = getattr(x, "__cuda_array_interface__", None)
        if cai is None:
            raise _error("the bias must be a torch tensor, a cupy array or expose "
                         f"__cuda_array_interface__ (got {type(x).__name__})")
        typ, shape, strides, ptr, _ = _interface(cai, "the bias")
        dt = _NUMPY.get(typ)
        strides = tuple(s // typ.itemsize for s in strides) if strides else (1,) * len(shape)
        kind = "cupy" if mod == "cupy" else "cai"
        device = int(x.device.id) if kind == "cupy" else _device_of(ptr, "the bias")
    if len(shape) != 1 or shape[0] != n or (n > 1 and strides[0] != 1):
        raise _error(f"the bias is {'x'.join(map(str, shape)) or 'a scalar'} with strides "
                     f"{strides} elements: it must be a vector of N = {n} elements with a "
                     "unit stride")
    if dt is out:
        what = "out"
    elif dt is DType.F32:
        what = "f32"
    else:
        name = getattr(dt, "short", None) or str(
            getattr(x, "dtype", None) or typ).replace("torch.", "")
        raise _error(f"the bias is {name}; it must be of C's type ({out.short}) or float32")
    return Operand("bias", x, 1, n, n, ptr, device=device, dtype=dt, kind=kind), what


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
    """An int handle of any stream object gemm-tune's callers use: a CUstream's address
    (0: the legacy default stream; 1 and 2, the per-thread and legacy default stream
    handles), so 0 to 2**64 - 1."""
    if whole(stream):  # (not a bool: a flag passed in the stream's place)
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):  # the CUDA Python stream protocol
        handle = int(stream.__cuda_stream__()[1])
    else:
        attr = next((a for a in ("cuda_stream", "ptr", "handle") if hasattr(stream, a)), None)
        handle = None if attr is None else int(getattr(stream, attr))  # torch, cupy, pycuda
    if handle is None or not 0 <= handle < 2**64:
        raise _error(f"stream must be an int handle (0 to 2**64 - 1) or a torch, cupy, "
                     f"pycuda or CUDA Python stream (got {type(stream).__name__} "
                     f"{stream!r:.40})")
    return handle


def empty_like(a: Operand, shape, device: int, dtype: DType = DType.F32):
    """An output of a's kind (numpy, torch, cupy or pycuda), of `dtype`."""
    name = _NP_NAMES[dtype]
    if a.kind == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, name), device=a.obj.device)
    if dtype is DType.BF16:
        raise _error("C is needed: gemm-tune allocates bfloat16 outputs for torch tensors "
                     "only (numpy and cupy have no bfloat16); pass C")
    if a.kind == "numpy":
        return np.empty(shape, name)
    if a.kind == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=name)
    if a.kind == "pycuda":
        import pycuda.gpuarray as ga

        return ga.empty(shape, np.dtype(name))
    raise _error("C is needed: gemm-tune cannot allocate an output like "
                 f"{type(a.obj).__name__}; pass C")


_NP_NAMES = {DType.F32: "float32", DType.F16: "float16", DType.BF16: "bfloat16"}

_ALIGN = [16] + [next(v for v in (8, 4, 2, 1) if r % v == 0) for r in range(1, 16)]


def align_class(ptr: int, ld: int, size: int, bstride: int = 0) -> int:
    """The widest access (16, 8, 4, 2 or 1 bytes) that every row of an operand allows (of
    every problem of a batch, `bstride` elements apart)."""
    return _ALIGN[(ptr | ld * size | bstride * size) & 15]
