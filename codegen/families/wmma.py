"""The WMMA family: tensor cores through nvcuda::wmma, fp16 / bf16 / tf32 inputs, FP32
accumulation; A and B row- or column-major (every Layout), C fp32, fp16 or bf16 with an
optional bias and activation, and strided batches.

Its config (:class:`WmmaConfig`), its check, its search space and its template values;
registered as "wmma" with templates/gemm_wmma.cu.j2.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from codegen.arch import ArchLimits, parse_arch
from codegen.families import Family, FamilySpec, Math, register
from codegen.families._common import (
    EPILOGUE_NAME, EPILOGUE_TEXTS, DType, Layout, Name, Named, Serial, Shape, epilogue_values,
    positive_sizes, smem_reasons, stages_reasons, swizzle_reasons, threads_reasons,
)

__all__ = ["WmmaConfig", "DEFAULT_WMMA", "TEMPLATE", "check", "SPACE", "from_params",
           "suggest", "params_of", "valid_configs", "arch_efficiency", "HOPPER_EFFICIENCY",
           "WMMA"]

TEMPLATE = "gemm_wmma.cu.j2"
#: registers a thread needs beyond its accumulators not to spill, fitted to ptxas (CUDA
#: 13.0, sm_90) on the fp16 / bf16 kernels of 95 configs (NT with fp16 C, NN with bf16 C;
#: every warp tile and block size): they held 64-80 registers at 32x32, 109-128 at 32x64
#: and 168-214 at 64x64 (32, 64 and 128 accumulators) under a cap of 128 or 255, and every
#: one whose accumulators plus 48 exceeded its block's cap spilled (32x32 and 32x64 at 1024
#: threads, cap 64: 8-3480 bytes; 64x64 at 512, cap 128: 672-8456), each under it did not
MIN_OTHER_REGS = 48

_WMMA_CPP = {DType.F16: ("__half", "__half"), DType.BF16: ("__nv_bfloat16", "__nv_bfloat16"),
             DType.TF32: ("float", "wmma::precision::tf32")}


@dataclasses.dataclass(frozen=True)
class WmmaConfig(Serial, Named):
    """One point of the tensor-core (WMMA) GEMM family: fp16, bf16 or tf32 inputs, FP32
    accumulation, C written in `out` after the epilogue.

    Attributes:
        bm, bn, bk: block tile.
        wm, wn: warp tile; (BM/WM) x (BN/WN) warps, each holding (WM/16) x (WN/16)
            16x16 accumulator fragments.
        skew: elements added to each shared row (bank conflicts of the fragment loads).
        vec: elements per global-to-shared copy (16, 8 or 4 bytes), scalar at edges.
        stages: 1 = synchronous loads; 2-4 = a cp.async ring of that depth (sm_80+).
        swizzle: block rows per rasterisation group (1 = row order).
        layout, out, bias, act: how A and B are stored, C's type, the bias vector and
            the activation of the epilogue (see _common.EPILOGUE_NAME: each is named
            only when not the default).

    Example:
        >>> WmmaConfig().name
        'gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8'
    """

    bm: int = 128
    bn: int = 128
    bk: int = 32
    wm: int = 64
    wn: int = 32
    skew: int = 8
    vec: int = 8
    stages: int = 3
    swizzle: int = 8
    dtype: DType = DType.F16
    family: Family = Family.WMMA
    layout: Layout = Layout.NN
    out: DType = DType.F32
    bias: str = "none"
    act: str = "none"

    #: the procedural name, encoding every field (``Named`` writes and reads it)
    NAME = Name("gemm_wmma_{dtype}_{bm}x{bn}x{bk}_w{wm}x{wn}_p{skew}_v{vec}_s{stages}"
                "_g{swizzle}" + EPILOGUE_NAME, **EPILOGUE_TEXTS)

    @property
    def frag_k(self) -> int:
        """K of the WMMA fragment shape: m16n16k16 for fp16/bf16, m16n16k8 for tf32."""
        return 8 if self.dtype is DType.TF32 else 16

    @property
    def threads(self) -> int:
        if not (self.wm and self.wn):
            return 0
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    @property
    def elem(self) -> int:
        return self.dtype.size

    @property
    def acc_regs(self) -> int:
        """FP32 accumulator registers a thread holds: 8 per 16x16 fragment of its warp tile."""
        return (self.wm // 16) * (self.wn // 16) * 8

    @property
    def min_regs(self) -> int:
        """Registers a thread needs not to spill: its accumulators and MIN_OTHER_REGS more
        (fragments, addresses, loop state), a line fitted to ptxas (see MIN_OTHER_REGS)."""
        return self.acc_regs + MIN_OTHER_REGS

    def register_cap(self, arch: ArchLimits) -> int:
        """The registers ptxas may give a thread of this block (__launch_bounds__(THREADS):
        64K / THREADS in whole 8s, at most 255)."""
        per = arch.regs_per_block // max(self.threads, 1) // 8 * 8
        return min(arch.max_regs_per_thread, per)

    @property
    def a_col(self) -> bool:
        """A column-major (TN, TT)?"""
        return self.layout in (Layout.TN, Layout.TT)

    @property
    def b_col(self) -> bool:
        """B column-major (NT, TT)?"""
        return self.layout in (Layout.NT, Layout.TT)

    @property
    def a_tile(self) -> tuple[int, int]:
        """A's shared tile as (rows, contiguous elements), in its storage order: BM x BK
        row-major, BK x BM column-major (each row then padded by the skew)."""
        return (self.bk, self.bm) if self.a_col else (self.bm, self.bk)

    @property
    def b_tile(self) -> tuple[int, int]:
        """B's shared tile as (rows, contiguous elements): BK x BN row-major, BN x BK
        column-major."""
        return (self.bn, self.bk) if self.b_col else (self.bk, self.bn)

    @property
    def pipeline_bytes(self) -> int:
        (ar, ac), (br, bc) = self.a_tile, self.b_tile
        return self.stages * (ar * (ac + self.skew) + br * (bc + self.skew)) * self.elem

    @property
    def epilogue_bytes(self) -> int:
        """Each warp's 16 x 20 FP32 scratch for staging an edge fragment of C."""
        return self.threads // 32 * 16 * 20 * 4

    @property
    def smem_bytes(self) -> int:
        return max(self.pipeline_bytes, self.epilogue_bytes)

    def template_values(self) -> dict:
        t = self.threads or 1
        elem_t, frag_t = _WMMA_CPP.get(self.dtype, ("float", "float"))
        return dict(
            **epilogue_values(self),
            name=self.name, template=TEMPLATE, dtype=self.dtype.short,
            BM=self.bm, BN=self.bn, BK=self.bk, WM=self.wm, WN=self.wn,
            WARPS_N=self.bn // self.wn if self.wn else 0, FM=self.wm // 16, FN=self.wn // 16,
            FK=self.frag_k, SKEW=self.skew, VEC=self.vec, STAGES=self.stages,
            SWIZZLE=self.swizzle, THREADS=self.threads, LDA_S=self.a_tile[1] + self.skew,
            LDB_S=self.b_tile[1] + self.skew, LDC_S=20, ES=self.elem,
            A_LOADS=(self.bm * self.bk) // (self.vec * t),
            B_LOADS=(self.bk * self.bn) // (self.vec * t),
            SMEM_BYTES=self.smem_bytes, PIPELINE_BYTES=self.pipeline_bytes,
            ELEM_T=elem_t, FRAG_T=frag_t, IS_TF32=self.dtype is DType.TF32,
            OUT_BYTES=self.out.size,
            # fp32 C and no bias: a whole fragment may be stored straight from registers
            DIRECT=self.out is DType.F32 and self.bias == "none",
        )

    # The launch interface shared with KernelConfig (the runner needs nothing else).
    split = 1  # no split-K in this family yet
    cluster = last = reduce_pass = has_workspace = False

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (-(-m // self.bm)) * (-(-n // self.bn)), 1, 1

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1

    def workspace_floats(self, m: int, n: int, batch: int = 1) -> int:
        return 0

    def ticket_count(self, m: int, n: int, batch: int = 1) -> int:
        return 0


DEFAULT_WMMA = WmmaConfig()



# ---- validation -----------------------------------------------------------------------
def check(c: WmmaConfig, a: ArchLimits) -> list[str]:
    """Reasons `c` cannot be built for `a`; empty when it can."""
    why: list[str] = []
    if c.family is not Family.WMMA:
        why.append(f"a WmmaConfig must be of the wmma family, not {c.family.value}")
    if c.dtype not in (DType.F16, DType.BF16, DType.TF32):
        why.append(f"the wmma family takes f16, bf16 or tf32 inputs, not {c.dtype.short} "
                   "(f32 runs on the simt family)")
        return why
    if c.dtype in (DType.BF16, DType.TF32) and a.cc < 80:
        why.append(f"{c.dtype.short} tensor cores need sm_80 or newer; {a.sm} has none")
    bad = positive_sizes(BM=c.bm, BN=c.bn, BK=c.bk, WM=c.wm, WN=c.wn)
    if bad:
        return why + bad
    shape = []  # what the rest of the checks need to be true
    if c.wm % 16 or c.wn % 16:
        shape.append(f"warp tile {c.wm}x{c.wn} is not made of 16x16 fragments")
    if c.bm % c.wm or c.bn % c.wn:
        shape.append(f"warp tile {c.wm}x{c.wn} does not divide the block tile {c.bm}x{c.bn}")
    if c.bk % c.frag_k:
        shape.append(f"BK={c.bk} is not a multiple of the {c.dtype.short} fragment depth "
                     f"{c.frag_k}")
    if shape:
        return why + shape
    t = c.threads
    why += threads_reasons(t, a)
    if c.vec * c.elem not in (4, 8, 16):
        why.append(f"vector width {c.vec} x {c.elem} B is not a 4, 8 or 16 byte copy")
    else:
        # each tile moves in vectors along its operand's contiguous dimension
        for op, (rows, cols), along in (("A", c.a_tile, "M" if c.a_col else "K"),
                                        ("B", c.b_tile, "K" if c.b_col else "N")):
            if cols % c.vec:
                why.append(f"the {op} tile's {cols} elements along {along} (its contiguous "
                           f"dimension) are not a multiple of the vector width {c.vec}")
            elif (rows * cols // c.vec) % t:
                why.append(f"{t} threads cannot load the {rows}x{cols} {op} tile evenly "
                           f"in vectors of {c.vec}")
    if c.skew < 0 or (c.skew * c.elem) % 16:
        why.append(f"skew {c.skew} x {c.elem} B must keep shared rows 16-byte aligned "
                   "(wmma's ldm)")
    why += stages_reasons(c.stages, a, cp_async_from=2)
    why += swizzle_reasons(c.swizzle)
    why += smem_reasons(c.smem_bytes, a)
    if c.acc_regs > 128:
        why.append(f"the {c.wm}x{c.wn} warp tile holds {c.acc_regs} accumulator registers per "
                   "thread, over 128")
    elif c.min_regs > c.register_cap(a):
        why.append(f"the {c.wm}x{c.wn} warp tile needs at least {c.min_regs} registers per "
                   f"thread ({c.acc_regs} accumulators); a block of {t} threads leaves each "
                   f"{c.register_cap(a)}: it would spill")
    return why


# ---- the search space -----------------------------------------------------------------
#: Tiles in elements; skew and vector width in bytes (16 B rows for wmma's ldm; 16-byte
#: copies), turned into elements per input type. Trial parameters are named wmma_<name>.
SPACE: dict[str, tuple[int, ...]] = {
    "bm": (64, 128, 256),
    "bn": (64, 128, 256),
    "bk": (16, 32, 64),
    "wm": (32, 64),
    "wn": (32, 64),
    "skew_bytes": (16, 32),
    "stages": (2, 3, 4),
    "swizzle": (1, 8),
}


def from_params(params: dict, dtype: DType) -> WmmaConfig:
    es = dtype.size
    return WmmaConfig(dtype=dtype, skew=int(params["skew_bytes"]) // es, vec=16 // es,
                      **{k: int(params[k]) for k in SPACE if k != "skew_bytes"})


def suggest(trial, dtype: DType, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> WmmaConfig:
    """Ask a trial (anything with Optuna's suggest_categorical) for one point."""
    return from_params({k: trial.suggest_categorical(f"wmma_{k}", v) for k, v in SPACE.items()},
                       dtype)


def params_of(config: WmmaConfig, shape: Shape, arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config`."""
    p = {f"wmma_{k}": getattr(config, k) for k in SPACE if k != "skew_bytes"}
    p["wmma_skew_bytes"] = config.skew * config.elem
    return p


def valid_configs(arch: ArchLimits | str, dtype: DType,
                  shape: Shape | None = None) -> Iterator[WmmaConfig]:
    """Every point of SPACE that `check` accepts for `arch`, in grid order."""
    arch = parse_arch(arch)
    for vals in itertools.product(*SPACE.values()):
        c = from_params(dict(zip(SPACE, vals)), dtype)
        if not check(c, arch):
            yield c


#: the share of the tensor peak (ArchLimits.peak_tensor_tflops: wgmma's rate on sm_90)
#: that WMMA's mma.sync-class instructions reach on Hopper, by input size. The best WMMA
#: kernels measured on the H200 at 4096^3 (2026-11-30, bench/NOTES.md, "Tensor cores: the
#: WMMA family") ran 278-299 TFLOP/s in fp16 / bf16 and 77 in tf32: 0.26-0.28 and 0.14 of
#: the peak at 1980 MHz. Held above the best measured, since the model's bound must never
#: prune a kernel that could win. Elsewhere (sm_70-sm_89) mma.sync is the tensor path: 1.
HOPPER_EFFICIENCY = {2: 0.35, 4: 0.18}


def arch_efficiency(c: WmmaConfig, arch: ArchLimits) -> float:
    """1, except on Hopper, where wgmma sets the tensor peak (HOPPER_EFFICIENCY)."""
    return HOPPER_EFFICIENCY[c.dtype.size] if arch.cc >= 90 else 1.0


WMMA = register(FamilySpec(
    name=Family.WMMA.value,
    config=WmmaConfig,
    template=TEMPLATE,
    check=check,
    # tf32 only by consent: a tf32 request (--dtype tf32 or --allow-tf32), never fp32's
    dtypes={DType.TF32: DType.TF32, DType.F16: DType.F16, DType.BF16: DType.BF16},
    math=Math.TENSOR_CORE,
    arch_efficiency=arch_efficiency,
    space=SPACE,
    suggest=suggest,
    params_of=params_of,
    valid_configs=valid_configs,
    default=lambda dtype, variant=None: dataclasses.replace(
        DEFAULT_WMMA, dtype=dtype, vec=16 // dtype.size, skew=16 // dtype.size),
    min_cc=70,
    layouts=frozenset(Layout),
    epilogue=True,
))
