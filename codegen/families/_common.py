"""What every family shares: the closed sets (DType, Layout), the to_dict / from_dict
mixin, the shape rules of split-K, and the checks of limits every kernel meets."""

from __future__ import annotations

import dataclasses
import enum

from codegen.arch import ArchLimits
from codegen.errors import UsageError

__all__ = ["DType", "Layout", "Serial", "Shape", "MAX_STAGES", "cdiv", "widest",
           "wants_split", "shape_reasons", "positive_sizes", "threads_reasons",
           "stages_reasons", "swizzle_reasons", "smem_reasons"]

Shape = tuple[int, int, int]

#: The deepest shared-memory pipeline any family builds.
MAX_STAGES = 4


class DType(enum.Enum):
    """Input type of a GEMM: its short name (used in names), C++ spelling, size in bytes."""

    F32 = ("f32", "float", 4)
    TF32 = ("tf32", "float", 4)
    #: a request, not a kernel type: fp32 data at fp32 accuracy, 3xTF32 tensor-core kernels
    #: allowed beside the CUDA-core ones (--allow-3xtf32); those kernels' configs are f32
    F32X3 = ("f32x3", "float", 4)
    F16 = ("f16", "__half", 2)
    BF16 = ("bf16", "__nv_bfloat16", 2)

    def __init__(self, short: str, cpp: str, size: int):
        self.short = short
        self.cpp = cpp
        self.size = size

    @classmethod
    def parse(cls, text: str) -> "DType":
        """`fp32`, `f32`, `float32`, `float` ... -> DType; UsageError otherwise."""
        aliases = {
            "fp32": cls.F32, "f32": cls.F32, "float32": cls.F32, "float": cls.F32,
            "tf32": cls.TF32, "f32x3": cls.F32X3, "3xtf32": cls.F32X3,
            "fp16": cls.F16, "f16": cls.F16, "float16": cls.F16, "half": cls.F16,
            "bf16": cls.BF16, "bfloat16": cls.BF16,
        }
        try:
            return aliases[str(text).strip().lower()]
        except KeyError:
            raise UsageError(
                f"unknown dtype {text!r} (choose from fp32, tf32, 3xtf32, fp16, bf16)"
            ) from None

    @classmethod
    def from_short(cls, short: str) -> "DType | None":
        """The DType whose short name (as in kernel names) is `short`, or None."""
        return next((d for d in cls if d.short == short), None)


class Layout(enum.Enum):
    """Operand layout in row-major terms: N = as stored, T = transposed."""

    NN = "nn"  # C = A * B with A (M x K) and B (K x N) both row-major


class Serial:
    """to_dict / from_dict of a config dataclass: enums as their short strings.

    The "family" field is turned back into the type of the class's own default (its
    Family member), so this module needs no list of families.
    """

    #: which of A, B and C a kernel needs 16-byte aligned in address and row stride (the
    #: wgmma family's TMA reads and writes them); the default: any alignment runs
    aligned_operands = (False, False, False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(dtype=self.dtype.short, family=getattr(self.family, "value", self.family),
                 layout=self.layout.value)
        return d

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        d["dtype"] = next(x for x in DType if x.short == d["dtype"])
        default = cls.__dataclass_fields__["family"].default
        d["family"] = type(default)(d["family"])
        d["layout"] = Layout(d["layout"])
        return cls(**d)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def widest(n: int, *also: int) -> int:
    """The widest of 4, 2, 1 floats that divides n and every value in `also`."""
    return next(v for v in (4, 2, 1) if n % v == 0 and all(a % v == 0 for a in also))


# ---- shape rules (split-K) ------------------------------------------------------------
def wants_split(config, shape: Shape, arch: ArchLimits) -> bool:
    """Split-K is searched only where the M x N tiles alone leave SMs idle."""
    m, n, _ = shape
    return cdiv(m, config.bm) * cdiv(n, config.bn) < max(arch.sm_count, 1)


def shape_reasons(config, shape: Shape, arch: ArchLimits) -> list[str]:
    """Reasons a buildable config is pointless for this shape (rejected before compiling)."""
    m, n, k = shape
    why = []
    if config.split > 1:
        tiles = cdiv(m, config.bm) * cdiv(n, config.bn)
        if not wants_split(config, shape, arch):
            why.append(f"split-K {config.split} is not needed: {tiles} tiles already cover "
                       f"the {arch.sm_count} SMs")
        if config.split > cdiv(k, config.bk):
            why.append(f"split-K {config.split} exceeds the {cdiv(k, config.bk)} K tiles")
    return why


# ---- checks every family makes (the sentences are part of the interface) ----------------
def positive_sizes(**sizes: int) -> list[str]:
    """["tile sizes must be positive (BM=0)"] where any size is below 1."""
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    return [f"tile sizes must be positive ({', '.join(bad)})"] if bad else []


def threads_reasons(threads: int, a: ArchLimits) -> list[str]:
    if threads > a.max_threads_per_block:
        return [f"{threads} threads per block exceeds the limit of {a.max_threads_per_block}"]
    return []


def stages_reasons(stages: int, a: ArchLimits, cp_async_from: int) -> list[str]:
    """Stages within 1..MAX_STAGES, and cp.async (sm_80+) from `cp_async_from` stages on."""
    if not 1 <= stages <= MAX_STAGES:
        return [f"stages={stages} is outside 1..{MAX_STAGES}"]
    if stages >= cp_async_from and not a.has_cp_async:
        return [f"cp.async stages ({stages}) need sm_80 or newer; {a.sm} has none"]
    return []


def swizzle_reasons(swizzle: int) -> list[str]:
    return [f"swizzle group {swizzle} must be at least 1"] if swizzle < 1 else []


def smem_reasons(smem: int, a: ArchLimits) -> list[str]:
    if smem > a.smem_per_block_optin:
        return [f"shared memory {smem} B exceeds the {a.smem_per_block_optin} B per-block "
                f"limit of {a.sm}"]
    return []
