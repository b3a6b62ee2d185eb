"""The SIMT family: CUDA cores, FP32 FMAs (fp16 / bf16 inputs widened exactly on load).

Its config (:class:`KernelConfig`), its check, its search space and its template
values; registered as "simt" with templates/gemm_simt.cu.j2.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from codegen.arch import ArchLimits, parse_arch
from codegen.families import Family, FamilySpec, Math, register
from codegen.families._common import (
    CLUSTER_SPLITS, EPILOGUE_NAME, EPILOGUE_TEXTS, FLAG, DType, Layout, Name, Named, Serial,
    Shape, SplitK, choice, split_k_reasons,
    epilogue_values, positive_sizes, shape_reasons,
    smem_reasons, stages_reasons, swizzle_reasons, threads_reasons, wants_split, widest,
)

__all__ = ["KernelConfig", "DEFAULT_CONFIG", "TEMPLATE", "check", "SPLITS", "REDUCES",
           "CLUSTER_SPLITS", "WARP_ARRANGEMENTS", "INTERIORS", "SPACE", "SEARCH_SPLITS",
           "SPLIT_REDUCES", "SWIZZLES", "SEARCH_INTERIORS", "RN16", "RN_OF_16",
           "WIDENED_STAGES", "config_from_params", "suggest", "params_of", "valid_configs",
           "issue_efficiency", "SIMT"]

TEMPLATE = "gemm_simt.cu.j2"

_VEC_TYPES = {1: "float", 2: "float2", 4: "float4"}
#: C++ element type of the SIMT family's inputs (fp16 / bf16 are widened on load)
_SIMT_CPP = {DType.F32: "float", DType.TF32: "float", DType.F16: "__half",
             DType.BF16: "__nv_bfloat16"}


@dataclasses.dataclass(frozen=True)
class KernelConfig(SplitK, Serial, Named):
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
            kk+1's loads are issued before step kk's FMAs); 3 = (the double buffer's
            interior path) across tiles too: the next tile is stored and the barrier
            passed before the last k-step's FMAs, so that the next tile's first
            fragments load under them instead of after the barrier, where every warp
            waits for them at once (cuBLAS's SGEMM issues each fragment load at least 67
            instructions before its first use; the 4096^3 winner's first uses come 4-40
            instructions after). The name carries `_f<frags>` only above 1. frags 3 ran
            1-8% slower on the H200: not searched.
        minb: the second argument of __launch_bounds__, the blocks per SM ptxas must
            leave room for (it caps the registers at 64K / (threads x minb)). The name
            carries `_b<minb>` only when above 1.
        swz: 1 = the k-major shared tile of an operand transposed on its way in (A
            row-major, B column-major) is XOR-swizzled instead of padded (pad must be 0):
            one warp's transposed stores then hit 32 distinct banks where padding leaves
            2-way conflicts (BK=16). The name carries `_sw` only when 1.
        interior: 0 = one main loop, every global load checked; 1 = (stages 1-2) a block
            whose tile lies inside A and B, with aligned rows, runs its whole K tiles
            through a loop whose global loads take no bounds check and no test of a next
            tile, the checked loop taking the rest; 2 = (stages 2) that loop also takes
            two K tiles a turn, so the shared stages it reads and writes are constants.
            Fewer instructions besides the FFMAs in the main loop (bench/NOTES.md, "the
            main loop's instruction mix"). The name carries `_i<interior>` only above 0.
        zigzag: the order of a k-step's FMAs. 1 = serpentine (odd rows of the
            micro-tile right to left), so that consecutive FFMAs share an operand at the
            turns too; 2 = 2x2 blocks, serpentine along the row pairs, so that the
            operand-reuse cache (a value per register bank and operand slot) serves one
            of each block's two pairs (ptxas's .reuse flags: fewer register-file reads).
            The name carries `_z` for 1 and `_z2` for 2. Buildable and tested, not
            searched: both ran 1-5% behind row order on the H200 (bench/NOTES.md,
            thirty-fifth session).
        ptxas: ptxas's optimisation level (nvcc -Xptxas -O<n>): 3, its default, or 1.
            At 3 ptxas schedules a k-step's FFMAs in an order of its own (by the
            arrival of their shared loads), whatever the source's; at 1 it keeps the
            source's order, and so the reuse that zigzag 2 lays out (nvcc 13.0, 8x16
            micro-tile: 1,314 .reuse flags a main-loop iteration of 1,024 FFMAs, against
            949 at 3, and cuBLAS's own SGEMM's 1,465). The name carries `_o1`. Not searched:
            -O1 ran 1-4% slower on the H200, the 2x2 order with it no better.
        streamk: 1 = stream-K (``_sk``): the grid is the GPU's block slots (SMs x blocks
            an SM), each block persistent. The tiles up to the last whole wave but one go
            a tile to a block; the rest (a wave and the remainder, or every tile below two
            waves) are one run of k-tiles shared out evenly over the blocks, cut at tile
            boundaries; a cut tile's blocks leave partial tiles in a workspace (two slots
            a block) and the last of them to finish sums them in k order (deterministic)
            and runs the epilogue. A partial last wave costs the CUDA-core kernels 3% at
            4096^3 (512 tiles of 128x256 on 132 SMs: 3.88 waves) and 8192^3 (2048 tiles
            of 128x256, 4096 of 128x128 two an SM: 15.5 waves either way); the model
            predicts stream-K takes back 2.9-3.1% there. Not with split-K. Built, emulated
            on the CPU, and not searched until a GPU has timed it
            (bench/pairs/simt-stream-k.txt). The schedule sits in shared memory, so the
            loop over units holds few registers: 255 -> 255 without spills for 128x256
            8x16, but 128 -> 130 for 128x128 8x8 (two blocks an SM become one).
        layout, out, bias, act: how A and B are stored, C's type, the bias vector and
            the activation of the epilogue (see _common.EPILOGUE_NAME: each is named
            only when not the default).

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
    swz: int = 0
    interior: int = 0
    zigzag: int = 0
    ptxas: int = 3
    streamk: int = 0
    dtype: DType = DType.F32
    family: Family = Family.SIMT
    layout: Layout = Layout.NN
    out: DType = DType.F32
    bias: str = "none"
    act: str = "none"

    # ---- identity -----------------------------------------------------------
    #: the procedural name, encoding every field (``Named`` writes and reads it): split-K
    #: and its reduction's mark (none, ``l`` or ``c``) only with a split, ``_f`` and
    #: ``_b`` only above 1, ``_sw``, ``_i``, ``_z`` and ``_sk`` only above 0, so that
    #: names from before those fields still read
    NAME = Name("gemm_{family}_{dtype}_{bm}x{bn}x{bk}_r{rm}x{rn}_w{wt}x{wt_n}_p{pad}_v{vec}"
                "_s{stages}_g{swizzle}[_k{split}{reduce}][_f{frags}][_b{minb}][_sw{swz}]"
                "[_i{interior}][_z{zigzag}][_o{ptxas}][_sk{streamk}]" + EPILOGUE_NAME,
                swz=FLAG, streamk=FLAG,
                zigzag=choice({1: "", 2: "2"}),
                family=choice({f: f.value for f in Family}),
                reduce=choice({"pass": "", "last": "l", "cluster": "c"}), **EPILOGUE_TEXTS)

    @property
    def nvcc_extra(self) -> tuple[str, ...]:
        """nvcc's flags for this kernel beyond codegen.compile.NVCC_FLAGS."""
        return () if self.ptxas == 3 else (f"-Xptxas=-O{self.ptxas}",)

    # ---- derived geometry (computed here, passed to the template) -------------
    @property
    def cluster(self) -> bool:
        """Split-K summed across a thread-block cluster (one launch, no workspace)."""
        return self.split > 1 and self.reduce == "cluster"

    @property
    def last(self) -> bool:
        """Partial tiles summed by the last block of their tile (a ticket each): split-K's
        "last" reduction, and stream-K's cut tiles."""
        return (self.split > 1 and self.reduce == "last") or bool(self.streamk)

    @property
    def has_workspace(self) -> bool:
        """Partial tiles through a workspace: split-K's pass and last, stream-K's cut
        tiles."""
        return self.reduce_pass or self.last

    @property
    def wt_n(self) -> int:
        return 32 // self.wt if self.wt > 0 else 0

    @property
    def tile_regs(self) -> int:
        """Registers a thread's RM x RN accumulators and its `frags` sets of A and B
        fragments take."""
        return self.rm * self.rn + (self.rm + self.rn) * min(self.frags, 2)

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

    @property
    def frag_vecs(self) -> tuple[int, int]:
        """Floats per shared read of the A and of the B fragment."""
        return widest(self.rm, self.lda_s), widest(self.rn, self.ldb_s)

    @property
    def swizzled(self) -> tuple[bool, bool]:
        """Whether the A and the B tile are XOR-swizzled (a transposed store: swz=1)."""
        return (bool(self.swz) and self.layout in (Layout.NN, Layout.NT),
                bool(self.swz) and self.layout in (Layout.NT, Layout.TT))

    def template_values(self) -> dict:
        """Every value the template uses, derived here so the template stays plain."""
        wm, wn = self.warp_tile
        va, vb = self.frag_vecs
        store_vec = min(vb, self.vec)
        return dict(
            **epilogue_values(self),
            name=self.name,
            template=TEMPLATE,
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
            A_STS_VEC=self.vec if self.lda_s % self.vec == 0 else 1,
            SWZ_A=self.swizzled[0], SWZ_B=self.swizzled[1],
            A_LOADS=(self.bm * self.bk) // (self.vec * self.threads) if self.threads else 0,
            B_LOADS=(self.bk * self.bn) // (self.vec * self.threads) if self.threads else 0,
            SMEM_BYTES=self.smem_bytes,
            SPLIT=self.split, FRAGS=self.frags, CLUSTER=self.cluster,
            LAST=self.last and not self.streamk, REDUCE_PASS=self.reduce_pass,
            STREAMK=self.streamk,
            MIN_BLOCKS=self.minb, INTERIOR=self.interior, FMA_ORDER=self.zigzag,
            NVCC_EXTRA=self.nvcc_extra,
            MAIN_SMEM_BYTES=self.stages * self.bk * (self.lda_s + self.ldb_s) * 4,
        )

    def tiles(self, m: int, n: int) -> int:
        """Tiles of an M x N output."""
        return (-(-m // self.bm)) * (-(-n // self.bn))

    def grid(self, m: int, n: int, slots: int = 0) -> tuple[int, int, int]:
        """Launch grid for an M x N output: tiles along x (the kernel swizzles), K slices
        along z; with stream-K, the GPU's `slots` (SMs x blocks an SM) along x."""
        if self.streamk:
            if slots < 1:
                raise ValueError("a stream-K grid is the GPU's block slots: give slots")
            return slots, 1, 1
        return self.tiles(m, n), 1, self.split

    def workspace_floats(self, m: int, n: int, batch: int = 1, slots: int = 0) -> int:
        """Floats of workspace a launch needs: split-K's partial tiles (0 without split, or
        in a cluster), or stream-K's two partial tiles a block of `slots` a problem."""
        if self.streamk:
            return batch * self.grid(m, n, slots)[0] * 2 * self.bm * self.bn
        return batch * self.split * m * n if self.has_workspace else 0

    def ticket_count(self, m: int, n: int, batch: int = 1) -> int:
        """Zeroed tile counters a "last" split-K or a stream-K launch needs (one per tile
        of C and problem of the batch; each is reset to zero by the block that sums its
        tile)."""
        return batch * self.tiles(m, n) if self.last else 0

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1


#: The configuration gemm-tune recommends before any tuning (compiles with 0 spills).
DEFAULT_CONFIG = KernelConfig()



# ---- validation -----------------------------------------------------------------------
SPLITS = (1, 2, 4, 8, 16, 32)
REDUCES = ("pass", "last", "cluster")
WARP_ARRANGEMENTS = (1, 2, 4, 8, 16, 32)
#: the main loop's interior paths (KernelConfig.interior)
INTERIORS = (0, 1, 2)
#: the orders of a k-step's FMAs (KernelConfig.zigzag): rows, serpentine rows, 2x2 blocks
FMA_ORDERS = (0, 1, 2)
#: ptxas optimisation levels (KernelConfig.ptxas)
PTXAS_LEVELS = (1, 3)


def check(c: KernelConfig, a: ArchLimits) -> list[str]:
    """Reasons `c` cannot be built for `a`; empty when it can.

    Example:
        >>> check(KernelConfig(stages=3), parse_arch("sm_75"))
        ['cp.async stages (3) need sm_80 or newer; sm_75 has none']
    """
    why: list[str] = []

    if c.family is not Family.SIMT or c.dtype is DType.TF32:
        why.append(f"the {c.family.value} family has no {c.dtype.short} kernel")
    elif c.dtype is not DType.F32 and c.stages > 2:
        why.append(f"{c.dtype.short} inputs are widened to fp32 on the way through registers, "
                   f"so stages must be 1 or 2, not {c.stages} (cp.async cannot convert)")

    bad = positive_sizes(BM=c.bm, BN=c.bn, BK=c.bk, RM=c.rm, RN=c.rn)
    if bad:
        return why + bad  # nothing below is meaningful
    if c.bm % c.rm:
        why.append(f"BM={c.bm} is not a multiple of RM={c.rm}")
    if c.bn % c.rn:
        why.append(f"BN={c.bn} is not a multiple of RN={c.rn}")
    if c.wt not in WARP_ARRANGEMENTS:
        why.append(f"warp arrangement {c.wt} x 32/{c.wt} is not a split of 32 lanes")
        return why
    if why:
        return why

    t = c.threads
    if t % a.warp_size:
        why.append(f"{t} threads per block is not a multiple of the warp size {a.warp_size}")
    why += threads_reasons(t, a)
    wm, wn = c.warp_tile
    if c.bm % wm:
        why.append(f"warp tile {wm}x{wn} (WT={c.wt} x RM={c.rm}) does not divide BM={c.bm}")
    if c.bn % wn:
        why.append(f"warp tile {wm}x{wn} ({c.wt_n} lanes x RN={c.rn}) does not divide BN={c.bn}")

    why += _load_reasons(c, t, not why)
    why += stages_reasons(c.stages, a, cp_async_from=3)
    if not 0 <= c.pad <= 32:
        why.append(f"padding {c.pad} words is outside 0..32")
    why += swizzle_reasons(c.swizzle)
    if c.swz not in (0, 1):
        why.append(f"swizzle flag {c.swz} must be 0 or 1")
    elif c.swz:
        why += _swizzle_reasons(c)
    why += _loop_reasons(c)
    if c.minb < 1 or c.minb * t > a.max_threads_per_sm:
        why.append(f"__launch_bounds__ minimum of {c.minb} blocks of {t} threads does not fit "
                   f"the {a.max_threads_per_sm} threads of an SM")
    why += _split_reasons(c, a)
    why += smem_reasons(c.smem_bytes, a)
    regs = c.tile_regs
    if regs > a.max_regs_per_thread:
        why.append(
            f"the {c.rm}x{c.rn} accumulators and fragments need {regs} registers, over "
            f"the {a.max_regs_per_thread} per-thread limit"
        )
    return why


def _load_reasons(c: KernelConfig, threads: int, even: bool) -> list[str]:
    """Why `c`'s vector width cannot load its tiles (`even`: also whether `threads` share
    them evenly, asked only of a config with no other reason so far)."""
    if c.vec not in (1, 2, 4):
        return [f"vector width {c.vec} is not 1, 2 or 4 floats"]
    why = []
    if c.bk % c.vec:
        why.append(f"BK={c.bk} is not a multiple of the vector width {c.vec}")
    if c.bn % c.vec:
        why.append(f"BN={c.bn} is not a multiple of the vector width {c.vec}")
    if c.bm % c.vec and c.layout in (Layout.TN, Layout.TT):
        why.append(f"BM={c.bm} is not a multiple of the vector width {c.vec} (a "
                   "column-major A is read along M)")
    if threads and even and not why:
        for op, rows, cols in (("A", c.bm, c.bk), ("B", c.bk, c.bn)):
            vecs = rows * cols // c.vec
            if vecs % threads:
                why.append(f"{threads} threads cannot load the {rows}x{cols} {op} tile evenly "
                           f"({vecs} vectors of {c.vec})")
    return why


def _loop_reasons(c: KernelConfig) -> list[str]:
    """Why `c`'s main-loop switches (zigzag, interior path, fragment buffers) cannot be
    built."""
    why = []
    if c.zigzag not in FMA_ORDERS:
        why.append(f"FMA order {c.zigzag} is not one of {', '.join(map(str, FMA_ORDERS))}")
    elif c.zigzag == 2 and (c.rm % 2 or c.rn % 2):
        why.append(f"the 2x2-block FMA order needs an even micro-tile, not {c.rm}x{c.rn}")
    if c.ptxas not in PTXAS_LEVELS:
        why.append(f"ptxas level {c.ptxas} is not one of {', '.join(map(str, PTXAS_LEVELS))}")
    if c.interior not in INTERIORS:
        why.append(f"interior path {c.interior} is not one of "
                   f"{', '.join(map(str, INTERIORS))}")
    elif c.interior and c.stages > 2:
        why.append(f"the unchecked interior path is built for the register-staged loop "
                   f"(stages 1-2), not a cp.async ring of {c.stages}")
    elif c.interior == 2 and c.stages != 2:
        why.append(f"an interior path of two K tiles a turn pairs the double buffer's "
                   f"stages: stages 2, not {c.stages}")
    if c.frags not in (1, 2, 3):
        why.append(f"fragment buffers {c.frags} must be 1, 2 or 3")
    elif c.frags == 3 and (c.stages != 2 or not c.interior):
        why.append("fragments carried across tiles (frags 3) are built for the double "
                   f"buffer's interior path (stages 2, interior 1-2), not stages {c.stages}, "
                   f"interior {c.interior}")
    return why


def _split_reasons(c: KernelConfig, a: ArchLimits) -> list[str]:
    """Why `c`'s split-K (the slices and how they are summed) or stream-K cannot be built
    for `a`."""
    why = split_k_reasons(c, a, SPLITS, REDUCES)
    if c.streamk not in (0, 1):
        why.append(f"streamk={c.streamk} is not 0 or 1")
    elif c.streamk and c.split > 1:
        why.append(f"stream-K shares out k-tiles itself: not with split-K {c.split}")
    return why


def _swizzle_reasons(c: KernelConfig) -> list[str]:
    """Why the XOR swizzle of transposed tiles (swz=1) cannot be built for `c`."""
    why = []
    if c.layout is Layout.TN:
        why.append("nothing to swizzle: with layout tn no operand is transposed on its way in")
    if c.pad:
        why.append(f"a swizzled tile takes no padding (pad={c.pad})")
    if c.vec not in (1, 2, 4) or (32 * c.vec) % c.bk:
        return why + [f"the swizzle needs BK={c.bk} to divide 32 x VEC={32 * c.vec}"]
    unit = 32 * c.vec // c.bk
    for op, width, v, on in zip("AB", (c.bm, c.bn), c.frag_vecs, c.swizzled):
        if on and width % 32:
            why.append(f"a swizzled {op} tile needs its width ({width}) a multiple of 32")
        if on and unit % v:
            why.append(f"the swizzle's {unit}-column chunks split {op}'s {v}-wide fragment reads")
    return why


# ---- the search space -----------------------------------------------------------------
#: Fixed categorical lists keep every Optuna trial on the same distributions. The space
#: is narrower than what codegen builds: values that rarely win on a real GPU (narrower
#: global vectors, which help only where a leading dimension is 2 mod 4; BK=32; a padding
#: that breaks 16-byte shared reads) stay buildable and tested, but are not searched,
#: which keeps the valid space small enough for an exhaustive grid (11830 on sm_90: 3738
#: swizzled, 5070 with an interior path, 4928 of micro-tiles of 16: see RN16).
SPACE: dict[str, tuple[int, ...]] = {
    "bm": (16, 32, 64, 128, 256),
    "bn": (32, 64, 128, 256),
    "bk": (8, 16),
    "rm": (2, 4, 8, 16),
    "rn": (4, 8),
    "wt": (2, 4, 8, 16),
    "pad": (0, 4),
    "vec": (4,),  # the kernel falls back to scalar at run time where 4 is not allowed
    "stages": (1, 2, 3, 4),
    "swizzle": (1, 8),
}

#: Split-K, a conditional parameter: asked for only where the tiles of C leave SMs idle.
SEARCH_SPLITS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
#: How split-K sums its slices ("split_reduce"): asked for only where a cluster can hold
#: the split (sm_90 or newer). The "last" reduction (REDUCES) stays buildable and tested
#: but is not searched: it lost to the pass on every shape measured (bench/NOTES.md).
SPLIT_REDUCES: tuple[str, ...] = ("pass", "cluster")

#: The XOR swizzle of transposed tiles ("swz"), a conditional parameter: asked only where
#: pad is 0 (it replaces the padding).
SWIZZLES: tuple[int, ...] = (0, 1)

#: Micro-tiles of 16 (a 64x64 warp tile over 4x8 lanes: 128 FFMAs per 6 LDS.128 a k-step
#: where 8x8 does 64 per 4; cuBLAS's shape) are searched as 16x8 and 8x16 only, the shapes
#: that raise the FFMAs' share of the loop (16x4 and 4x16 lower it): RM=16 takes RN=8 (RN
#: not asked), and an 8x8 micro-tile asks "rn16" (0, 1: 1 makes it 8x16).
RN_OF_16 = 8
RN16: tuple[int, ...] = (0, 1)

#: The main loop's interior path ("interior"), a conditional parameter: asked only of the
#: register-staged loop (stages 1-2); 2 (two K tiles a turn) builds with stages 2 only.
SEARCH_INTERIORS: tuple[int, ...] = INTERIORS


#: fp16 / bf16 inputs on CUDA cores are widened on their way through registers, so that
#: variant takes stages 1-2 only: a parameter of its own, so no ask is wasted on 3-4.
WIDENED_STAGES = (1, 2)


def config_from_params(params: dict, dtype: DType = DType.F32) -> KernelConfig:
    return KernelConfig(dtype=dtype, split=int(params.get("split", 1)),
                        reduce=params.get("split_reduce", "pass"), swz=int(params.get("swz", 0)),
                        interior=int(params.get("interior", 0)),
                        **{k: int(params[k]) for k in SPACE})


def _reduces(split: int, arch: ArchLimits) -> tuple[str, ...]:
    """The split-K reductions searched for a split of `split` slices on `arch`."""
    return SPLIT_REDUCES if split in CLUSTER_SPLITS and arch.cc >= 90 else ("pass",)


def _param(name: str, widened: bool, rm: int) -> str | None:
    """The trial parameter holding field `name` of SPACE (None: not asked) for a micro-tile
    of `rm` rows."""
    if name == "stages" and widened:
        return "widened_stages"
    return None if name == "rn" and rm == 16 else name


def _values(param: str | None) -> tuple[int, ...]:
    """The values of a trial parameter (None: the one RN of 16 rows)."""
    extra = {None: (RN_OF_16,), "widened_stages": WIDENED_STAGES}
    return extra[param] if param in extra else SPACE[param]


def _rns(rm: int, rn: int) -> tuple[int, ...]:
    """The RNs a point of (rm, rn) stands for: an 8x8 micro-tile also 8x16 ("rn16")."""
    return (rn, 2 * rn) if (rm, rn) == (8, 8) else (rn,)


def _grid(widened: bool) -> list[dict]:
    """Every point of the searched space's fields (SPACE's, RN as asked: see RN16), in the
    order of SPACE's fields and values."""
    points: list[dict] = [{}]
    for k in SPACE:
        points = [{**p, k: v} for p in points
                  for v in _values(_param(k, widened, p.get("rm", 0)))]
    return [dict(p, rn=rn) for p in points for rn in _rns(p["rm"], p["rn"])]


def suggest(trial, dtype: DType = DType.F32, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> KernelConfig:
    """Ask a trial (anything with Optuna's suggest_categorical) for one point; split-K
    only where it can help. Parameter names: those of SPACE, unprefixed (RN: see RN16)."""
    widened = dtype is not DType.F32  # register-staged only: its own stages list
    params: dict = {}
    for k in SPACE:
        name = _param(k, widened, params.get("rm", 0))
        params[k] = trial.suggest_categorical(name, _values(name)) if name else RN_OF_16
    if len(_rns(params["rm"], params["rn"])) > 1 and trial.suggest_categorical("rn16", RN16):
        params["rn"] = 16
    if params["pad"] == 0:  # unpadded tiles: plain, or XOR-swizzled
        params["swz"] = trial.suggest_categorical("swz", SWIZZLES)
    if params["stages"] <= 2:  # the register-staged loop: with or without an interior path
        params["interior"] = trial.suggest_categorical("interior", SEARCH_INTERIORS)
    cfg = config_from_params(params, dtype)
    if shape is not None and arch is not None and wants_split(cfg, shape, arch):
        params["split"] = trial.suggest_categorical("split", SEARCH_SPLITS)
        if len(_reduces(params["split"], arch)) > 1:
            params["split_reduce"] = trial.suggest_categorical("split_reduce", SPLIT_REDUCES)
        cfg = config_from_params(params, dtype)
    return cfg


def params_of(config: KernelConfig, shape: Shape, arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config` (the grid's inverse)."""
    widened = config.dtype is not DType.F32
    p = {name: getattr(config, k) for k in SPACE
         if (name := _param(k, widened, config.rm)) is not None}
    if config.rm == 8 and config.rn in (8, 16):
        p.update(rn=8, rn16=int(config.rn == 16))
    if config.pad == 0:
        p["swz"] = config.swz
    if config.stages <= 2:
        p["interior"] = config.interior
    if wants_split(config, shape, arch):
        p["split"] = config.split
        if len(_reduces(config.split, arch)) > 1:
            p["split_reduce"] = config.reduce
    return p


def valid_configs(arch: ArchLimits | str, dtype: DType = DType.F32,
                  shape: Shape | None = None) -> Iterator[KernelConfig]:
    """Every point of the searched space that `check` accepts (and, given a shape, that the shape rules
    keep, split-K variants included), in grid order."""
    arch = parse_arch(arch)
    for point, swz, interior in itertools.product(_grid(dtype is not DType.F32), SWIZZLES,
                                                  SEARCH_INTERIORS):
        params = dict(point, swz=swz, interior=interior)
        if (params["pad"] and swz) or (params["stages"] > 2 and interior):
            continue  # asked only of unpadded tiles, of the register-staged loop
        c = config_from_params(params, dtype)
        if check(c, arch):
            continue
        splits = SEARCH_SPLITS if shape is not None and wants_split(c, shape, arch) else (1,)
        for s, r in ((s, r) for s in splits for r in _reduces(s, arch)):
            cs = c if s == 1 else dataclasses.replace(c, split=s, reduce=r)
            if shape is None or not (check(cs, arch) or shape_reasons(cs, shape, arch)):
                yield cs


def issue_efficiency(c: KernelConfig) -> float:
    """FFMA / (FFMA + LDS) in the inner loop: RM*RN FMAs per RM/VA + RN/VB shared loads,
    each taking an issue slot."""
    va, vb = c.frag_vecs
    fma = c.rm * c.rn
    return fma / (fma + c.rm // va + c.rn // vb)


SIMT = register(FamilySpec(
    name=Family.SIMT.value,
    config=KernelConfig,
    template=TEMPLATE,
    check=check,
    # fp32 data on FP32 FMAs also for a tf32 request; fp16 / bf16 widened on load
    dtypes={DType.F32: DType.F32, DType.TF32: DType.F32, DType.F32X3: DType.F32,
            DType.F16: DType.F16,
            DType.BF16: DType.BF16},
    math=Math.CUDA_CORE,
    space=SPACE,
    suggest=suggest,
    params_of=params_of,
    valid_configs=valid_configs,
    default=lambda dtype, variant=None: dataclasses.replace(DEFAULT_CONFIG, dtype=dtype),
    issue_efficiency=issue_efficiency,
    micro_tile=True,
    layouts=frozenset(Layout),
    epilogue=True,
))
