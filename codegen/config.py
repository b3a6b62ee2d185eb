"""Kernel configurations: frozen dataclasses whose procedural name is their identity."""

from __future__ import annotations

import dataclasses
import enum
import re

from codegen.errors import UsageError

__all__ = ["DType", "Family", "Layout", "KernelConfig", "WmmaConfig", "DEFAULT_CONFIG",
           "DEFAULT_WMMA", "config_from_name", "config_from_dict"]


class DType(enum.Enum):
    """Input type of a GEMM: its short name (used in names), C++ spelling, size in bytes."""

    F32 = ("f32", "float", 4)
    TF32 = ("tf32", "float", 4)
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
            "tf32": cls.TF32,
            "fp16": cls.F16, "f16": cls.F16, "float16": cls.F16, "half": cls.F16,
            "bf16": cls.BF16, "bfloat16": cls.BF16,
        }
        try:
            return aliases[str(text).strip().lower()]
        except KeyError:
            raise UsageError(
                f"unknown dtype {text!r} (choose from fp32, tf32, fp16, bf16)"
            ) from None


class Family(enum.Enum):
    """Kernel family: one Jinja2 template each."""

    SIMT = "simt"  # CUDA cores, FP32 FMAs
    WMMA = "wmma"  # tensor cores through nvcuda::wmma, FP32 accumulation
    WGMMA = "wgmma"  # Hopper: TMA + mbarriers + warp-specialised wgmma (codegen/wgmma.py)

    @property
    def template(self) -> str:
        return f"gemm_{self.value}.cu.j2"


class Layout(enum.Enum):
    """Operand layout in row-major terms: N = as stored, T = transposed."""

    NN = "nn"  # C = A * B with A (M x K) and B (K x N) both row-major


_VEC_TYPES = {1: "float", 2: "float2", 4: "float4"}
#: C++ element type of the SIMT family's inputs (fp16 / bf16 are widened on load)
_SIMT_CPP = {DType.F32: "float", DType.TF32: "float", DType.F16: "__half",
             DType.BF16: "__nv_bfloat16"}


#: the name's mark of each split-K reduction, after `_k<split>`
_REDUCE_SUFFIX = {"pass": "", "last": "l", "cluster": "c"}


def _widest(n: int, *also: int) -> int:
    """The widest of 4, 2, 1 floats that divides n and every value in `also`."""
    return next(v for v in (4, 2, 1) if n % v == 0 and all(a % v == 0 for a in also))


class _Serial:
    """to_dict / from_dict of a config dataclass: enums as their short strings."""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(dtype=self.dtype.short, family=self.family.value, layout=self.layout.value)
        return d

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        d["dtype"] = next(x for x in DType if x.short == d["dtype"])
        d["family"] = Family(d["family"])
        d["layout"] = Layout(d["layout"])
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class KernelConfig(_Serial):
    """One point of the SIMT GEMM family.

    Attributes:
        bm, bn, bk: block tile; a block computes BM x BN of C, marching along K by BK.
        rm, rn: register micro-tile; each thread accumulates RM x RN outputs.
        wt: a warp's threads are arranged WT x (32/WT) over its WM x WN warp tile,
            WM = WT*RM and WN = (32/WT)*RN, so lanes in a row share (broadcast) the
            A fragment they read from shared memory and lanes in a column share B's.
        pad: words added to the leading dimension of each shared tile (bank conflicts).
        vec: floats per global load and store (1, 2, 4); scalar fallback at run time
            where alignment, a leading dimension or an edge forbids it.
        stages: 1 = one shared buffer; 2 = double buffer with register prefetch;
            3-4 = a cp.async ring of that depth (sm_80 and newer).
        swizzle: blocks are rasterised in groups of this many block rows so that
            neighbouring blocks share A and B panels in L2 (1 = plain row order).
        split: split-K; SPLIT blocks share one tile of C, each summing a slice of K.
            1 = no split. The name carries `_k<split>` only when split > 1.
        reduce: how split-K's partial tiles are summed, in a fixed order (deterministic)
            each way: "pass" = each block writes its partial tile to a workspace and
            a second kernel adds them and applies alpha and beta; "last" = the same
            workspace, but the last block of each tile to finish (a ticket counter per
            tile) adds them: one launch; "cluster" = the SPLIT blocks of a tile form a
            thread-block cluster (sm_90+, SPLIT <= 8), leave their partial tiles in
            shared memory and sum them through distributed shared memory: one launch,
            no workspace. The name carries `l` or `c` after `_k<split>` for "last" or
            "cluster".
        frags: 1 = each k-step loads its A and B fragments from shared memory and then
            does its FMAs; 2 = the fragments are double-buffered in registers (step
            kk+1's loads are issued before step kk's FMAs). The name carries `_f2` only
            when 2.
        minb: the second argument of __launch_bounds__, the blocks per SM ptxas must
            leave room for (it caps the registers at 64K / (threads x minb)). The name
            carries `_b<minb>` only when above 1.

    Example:
        >>> KernelConfig().name
        'gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8'
    """

    bm: int = 128
    bn: int = 128
    bk: int = 8
    rm: int = 8
    rn: int = 8
    wt: int = 4
    pad: int = 4
    vec: int = 4
    stages: int = 2
    swizzle: int = 8
    split: int = 1
    frags: int = 1
    reduce: str = "pass"
    minb: int = 1
    dtype: DType = DType.F32
    family: Family = Family.SIMT
    layout: Layout = Layout.NN

    # ---- identity -----------------------------------------------------------
    @property
    def name(self) -> str:
        """Procedural name encoding every parameter; names files, caches and logs."""
        return (
            f"gemm_{self.family.value}_{self.dtype.short}"
            f"_{self.bm}x{self.bn}x{self.bk}_r{self.rm}x{self.rn}"
            f"_w{self.wt}x{self.wt_n}_p{self.pad}_v{self.vec}_s{self.stages}_g{self.swizzle}"
            + (f"_k{self.split}" if self.split != 1 else "")
            + (_REDUCE_SUFFIX[self.reduce] if self.split > 1 else "")
            + (f"_f{self.frags}" if self.frags != 1 else "")
            + (f"_b{self.minb}" if self.minb != 1 else "")
        )

    _NAME_RE = re.compile(
        r"^gemm_(?P<family>[a-z]+)_(?P<dtype>[a-z0-9]+)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
        r"_r(?P<rm>\d+)x(?P<rn>\d+)_w(?P<wt>\d+)x(?P<wtn>\d+)_p(?P<pad>\d+)_v(?P<vec>\d+)"
        r"_s(?P<stages>\d+)_g(?P<swizzle>\d+)(?:_k(?P<split>\d+)(?P<reduce>[cl])?)?(?:_f(?P<frags>\d+))?(?:_b(?P<minb>\d+))?$"
    )

    @classmethod
    def from_name(cls, name: str) -> "KernelConfig":
        """Inverse of :attr:`name`; UsageError for a string that is not a kernel name."""
        m = cls._NAME_RE.match(name.strip())
        if not m:
            raise UsageError(f"{name!r} is not a gemm-tune kernel name")
        try:
            family = Family(m["family"])
            dtype = next(d for d in DType if d.short == m["dtype"])
        except (ValueError, StopIteration):
            raise UsageError(f"{name!r} names an unknown family or dtype") from None
        ints = {k: int(m[k]) for k in ("bm", "bn", "bk", "rm", "rn", "wt", "pad", "vec",
                                       "stages", "swizzle")}
        ints["split"] = int(m["split"] or 1)
        ints["frags"] = int(m["frags"] or 1)
        ints["minb"] = int(m["minb"] or 1)
        reduce = {v: k for k, v in _REDUCE_SUFFIX.items()}[m["reduce"] or ""]
        cfg = cls(dtype=dtype, family=family, reduce=reduce, **ints)
        if cfg.wt_n != int(m["wtn"]):
            raise UsageError(f"{name!r}: warp arrangement must multiply to 32")
        return cfg

    # ---- derived geometry (computed here, passed to the template) -------------
    @property
    def cluster(self) -> bool:
        """Split-K summed across a thread-block cluster (one launch, no workspace)."""
        return self.split > 1 and self.reduce == "cluster"

    @property
    def last(self) -> bool:
        """Split-K summed by the last block of each tile (one launch, workspace + tickets)."""
        return self.split > 1 and self.reduce == "last"

    @property
    def reduce_pass(self) -> bool:
        """Does a launch end with the <name>_reduce kernel?"""
        return self.split > 1 and self.reduce == "pass"

    @property
    def has_workspace(self) -> bool:
        """Do the partial tiles go through a workspace in global memory (pass or last)?"""
        return self.reduce_pass or self.last

    @property
    def wt_n(self) -> int:
        return 32 // self.wt if self.wt > 0 else 0

    @property
    def threads(self) -> int:
        return (self.bm // self.rm) * (self.bn // self.rn) if self.rm and self.rn else 0

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.wt * self.rm, self.wt_n * self.rn

    @property
    def lda_s(self) -> int:
        """Leading dimension of the shared A tile, stored transposed as [BK][BM+pad]."""
        return self.bm + self.pad

    @property
    def ldb_s(self) -> int:
        return self.bn + self.pad

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block, in bytes (with a cluster split-K, at least the
        BM x BN partial tile the main loop's buffers are reused for)."""
        main = self.stages * self.bk * (self.lda_s + self.ldb_s) * 4
        return max(main, self.bm * self.bn * 4) if self.cluster else main

    def template_values(self) -> dict:
        """Every value the template uses, derived here so the template stays plain."""
        wm, wn = self.warp_tile
        va = _widest(self.rm, self.lda_s)  # floats per shared read of the A fragment
        vb = _widest(self.rn, self.ldb_s)
        store_vec = min(vb, self.vec)
        return dict(
            name=self.name,
            template=self.family.template,
            dtype=self.dtype.short,
            ELEM_T=_SIMT_CPP[self.dtype],
            BM=self.bm, BN=self.bn, BK=self.bk, RM=self.rm, RN=self.rn,
            WT_M=self.wt, WT_N=self.wt_n, WM=wm, WN=wn,
            WARPS_M=self.bm // wm if wm else 0, WARPS_N=self.bn // wn if wn else 0,
            THREADS=self.threads, PAD=self.pad, VEC=self.vec, STAGES=self.stages,
            SWIZZLE=self.swizzle, LDA_S=self.lda_s, LDB_S=self.ldb_s,
            VA=va, VB=vb, STORE_VEC=store_vec,
            VEC_T=_VEC_TYPES[self.vec], VA_T=_VEC_TYPES[va], VB_T=_VEC_TYPES[vb],
            STORE_T=_VEC_TYPES[store_vec],
            B_STS_VEC=self.vec if self.ldb_s % self.vec == 0 else 1,
            A_LOADS=(self.bm * self.bk) // (self.vec * self.threads) if self.threads else 0,
            B_LOADS=(self.bk * self.bn) // (self.vec * self.threads) if self.threads else 0,
            SMEM_BYTES=self.smem_bytes,
            SPLIT=self.split, FRAGS=self.frags, CLUSTER=self.cluster,
            LAST=self.last, REDUCE_PASS=self.reduce_pass,
            MIN_BLOCKS=self.minb,
            MAIN_SMEM_BYTES=self.stages * self.bk * (self.lda_s + self.ldb_s) * 4,
        )

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """Launch grid for an M x N output: tiles along x (the kernel swizzles), K slices along z."""
        return (-(-m // self.bm)) * (-(-n // self.bn)), 1, self.split

    def workspace_floats(self, m: int, n: int) -> int:
        """Floats of workspace a split-K launch needs (0 without split, or in a cluster)."""
        return self.split * m * n if self.has_workspace else 0

    def ticket_count(self, m: int, n: int) -> int:
        """Zeroed tile counters a "last" split-K launch needs (one per tile of C; each is
        reset to zero by the block that sums its tile)."""
        return self.grid(m, n)[0] if self.last else 0

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1


#: The configuration gemm-tune recommends before any tuning (compiles with 0 spills).
DEFAULT_CONFIG = KernelConfig()


_WMMA_CPP = {DType.F16: ("__half", "__half"), DType.BF16: ("__nv_bfloat16", "__nv_bfloat16"),
             DType.TF32: ("float", "wmma::precision::tf32")}


@dataclasses.dataclass(frozen=True)
class WmmaConfig(_Serial):
    """One point of the tensor-core (WMMA) GEMM family: fp16, bf16 or tf32 inputs, FP32
    accumulation and FP32 output.

    Attributes:
        bm, bn, bk: block tile.
        wm, wn: warp tile; (BM/WM) x (BN/WN) warps, each holding (WM/16) x (WN/16)
            16x16 accumulator fragments.
        skew: elements added to each shared row (bank conflicts of the fragment loads).
        vec: elements per global-to-shared copy (16, 8 or 4 bytes), scalar at edges.
        stages: 1 = synchronous loads; 2-4 = a cp.async ring of that depth (sm_80+).
        swizzle: block rows per rasterisation group (1 = row order).

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

    @property
    def name(self) -> str:
        return (f"gemm_wmma_{self.dtype.short}_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}"
                f"_p{self.skew}_v{self.vec}_s{self.stages}_g{self.swizzle}")

    _NAME_RE = re.compile(
        r"^gemm_wmma_(?P<dtype>[a-z0-9]+)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
        r"_w(?P<wm>\d+)x(?P<wn>\d+)_p(?P<skew>\d+)_v(?P<vec>\d+)_s(?P<stages>\d+)"
        r"_g(?P<swizzle>\d+)$"
    )

    @classmethod
    def from_name(cls, name: str) -> "WmmaConfig":
        m = cls._NAME_RE.match(name.strip())
        dtype = next((d for d in DType if m and d.short == m["dtype"]), None)
        if not m or dtype is None:
            raise UsageError(f"{name!r} is not a gemm-tune WMMA kernel name")
        return cls(dtype=dtype, **{k: int(v) for k, v in m.groupdict().items() if k != "dtype"})

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
    def pipeline_bytes(self) -> int:
        return self.stages * (self.bm * (self.bk + self.skew) + self.bk * (self.bn + self.skew)) \
            * self.elem

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
            name=self.name, template=self.family.template, dtype=self.dtype.short,
            BM=self.bm, BN=self.bn, BK=self.bk, WM=self.wm, WN=self.wn,
            WARPS_N=self.bn // self.wn if self.wn else 0, FM=self.wm // 16, FN=self.wn // 16,
            FK=self.frag_k, SKEW=self.skew, VEC=self.vec, STAGES=self.stages,
            SWIZZLE=self.swizzle, THREADS=self.threads, LDA_S=self.bk + self.skew,
            LDB_S=self.bn + self.skew, LDC_S=20, ES=self.elem,
            A_LOADS=(self.bm * self.bk) // (self.vec * t),
            B_LOADS=(self.bk * self.bn) // (self.vec * t),
            SMEM_BYTES=self.smem_bytes, PIPELINE_BYTES=self.pipeline_bytes,
            ELEM_T=elem_t, FRAG_T=frag_t, IS_TF32=self.dtype is DType.TF32,
        )

    # The launch interface shared with KernelConfig (the runner needs nothing else).
    split = 1  # no split-K in this family yet
    cluster = last = reduce_pass = has_workspace = False

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (-(-m // self.bm)) * (-(-n // self.bn)), 1, 1

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1

    def workspace_floats(self, m: int, n: int) -> int:
        return 0

    def ticket_count(self, m: int, n: int) -> int:
        return 0


DEFAULT_WMMA = WmmaConfig()


def config_from_name(name: str):
    """KernelConfig or WmmaConfig from a procedural name; UsageError otherwise."""
    if name.strip().startswith("gemm_wmma_"):
        return WmmaConfig.from_name(name)
    return KernelConfig.from_name(name)


def config_from_dict(d: dict):
    """KernelConfig or WmmaConfig from its to_dict(), by its family."""
    return (WmmaConfig if d.get("family") == Family.WMMA.value else KernelConfig).from_dict(d)
