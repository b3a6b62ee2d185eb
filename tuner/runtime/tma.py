"""TMA tensor maps: the arguments of cuTensorMapEncodeTiled for a row-major matrix, or a
strided batch of them (rank 3), checked against TMA's rules (:func:`tensor_map_args`, pure: tested without a GPU), and their
encoding through the driver (:func:`encode`). The run-time library, the tuner's runner
(tuner/runtime/runners.py) and the export bundle's C++ launchers (the same values) use them.
"""

from __future__ import annotations

from codegen.config import DType
from tuner.runtime.errors import TmaUnsupported

__all__ = ["TmaUnsupported", "tensor_map_args", "encode"]

#: names of the driver's CUtensorMapDataType per input type
_TMA_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
              DType.TF32: "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32",
              DType.F32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
_SWIZZLE = {"none": ("CU_TENSOR_MAP_SWIZZLE_NONE", 0), "32B": ("CU_TENSOR_MAP_SWIZZLE_32B", 32),
            "64B": ("CU_TENSOR_MAP_SWIZZLE_64B", 64), "128B": ("CU_TENSOR_MAP_SWIZZLE_128B", 128)}


# ---- tensor maps ------------------------------------------------------------------
def tensor_map_args(dtype: DType, ptr: int, rows: int, cols: int, ld: int, box_rows: int,
                    box_cols: int, swizzle: str = "128B", batch: int = 1,
                    batch_stride: int = 0) -> dict:
    """The arguments of cuTensorMapEncodeTiled for a row-major rows x cols matrix with
    leading dimension ld (elements) at ptr, as plain values (enum members by name). With
    batch > 1: `batch` such matrices batch_stride elements apart, a map of rank 3 (the
    batch its outermost dimension, a box of one matrix); a batch that shares one matrix is
    a map of rank 2 (batch=1: TMA strides are multiples of 16 bytes, 0 is none).

    Raises:
        TmaUnsupported: a rule of cuTensorMapEncodeTiled is broken; the message says which.
    """
    es = dtype.size
    why = []
    if ptr % 16:
        why.append(f"address 0x{ptr:x} is not 16-byte aligned")
    if (ld * es) % 16 or ld * es >= 1 << 40:
        why.append(f"row stride {ld} x {es} B is not a multiple of 16 bytes below 2^40")
    if ld < cols:
        why.append(f"leading dimension {ld} is below the {cols} columns")
    if not (1 <= box_rows <= 256 and 1 <= box_cols <= 256):
        why.append(f"box {box_rows} x {box_cols} has a side outside 1..256")
    name, span = _SWIZZLE[swizzle]
    if span and box_cols * es > span:
        why.append(f"box rows of {box_cols} x {es} B exceed the {span} B of SWIZZLE_{swizzle}")
    if (box_cols * es) % 16:
        why.append(f"box rows of {box_cols} x {es} B are not a multiple of 16 bytes")
    if not (1 <= rows < 1 << 32 and 1 <= cols < 1 << 32):
        why.append(f"dimensions {rows} x {cols} are outside 1..2^32-1")
    rank = 3 if batch > 1 else 2
    if rank == 3:
        if not 1 <= batch < 1 << 32:
            why.append(f"a batch of {batch} is outside 1..2^32-1")
        if batch_stride <= 0 or (batch_stride * es) % 16 or batch_stride * es >= 1 << 40:
            why.append(f"batch stride {batch_stride} x {es} B is not a positive multiple of "
                       f"16 bytes below 2^40")
    if why:
        raise TmaUnsupported("cannot encode a TMA tensor map: " + "; ".join(why))
    return dict(
        tensorDataType=_TMA_DTYPE[dtype], tensorRank=rank, globalAddress=ptr,
        globalDim=[cols, rows] + [batch] * (rank == 3),  # innermost first
        # bytes, rank - 1 entries (the innermost is implied)
        globalStrides=[ld * es] + [batch_stride * es] * (rank == 3),
        boxDim=[box_cols, box_rows] + [1] * (rank == 3),
        elementStrides=[1] * rank,
        interleave="CU_TENSOR_MAP_INTERLEAVE_NONE", swizzle=name,
        l2Promotion="CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
        oobFill="CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",  # out-of-bounds elements read as zero
    )


def encode(args: dict):
    """The CUtensorMap of `args` (tensor_map_args' values), through the driver."""
    from tuner.runtime import driver

    rec = driver.recorder()
    if rec is not None:
        return rec.tensor_map(args)
    cu = driver.api()
    return driver.call("cuTensorMapEncodeTiled",
        getattr(cu.CUtensorMapDataType, args["tensorDataType"]), args["tensorRank"],
        args["globalAddress"],
        [cu.cuuint64_t(v) for v in args["globalDim"]],
        [cu.cuuint64_t(v) for v in args["globalStrides"]],
        [cu.cuuint32_t(v) for v in args["boxDim"]],
        [cu.cuuint32_t(v) for v in args["elementStrides"]],
        getattr(cu.CUtensorMapInterleave, args["interleave"]),
        getattr(cu.CUtensorMapSwizzle, args["swizzle"]),
        getattr(cu.CUtensorMapL2promotion, args["l2Promotion"]),
        getattr(cu.CUtensorMapFloatOOBfill, args["oobFill"]))
