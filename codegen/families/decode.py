"""The decode family: skinny GEMMs (M <= 64: one token, or a few, through a weight matrix)
at the DRAM roof. fp16 / bf16 inputs, FP32 accumulation; every layout; C fp32, fp16 or
bf16 with the bias and activation; strided batches; split-K summed by the plain runner's
workspace (a reduce pass, or the last block of each tile).

At M <= 64 a GEMM reads N x K weights once and does little with each: what it costs is the
bytes of B in flight from DRAM. Each block owns a BN-wide panel of C (MT rows) and a slice
of K; its WK x WN warps split the panel's columns WN ways and take the slice's K chunks in
turn WK ways, each streaming its chunks of B straight into registers with 16-byte loads
that bypass L1, STAGES-1 chunks ahead of its math (no shared memory and no barrier in the
main loop), and sum them with mma.sync m16n8k16 (MT = 16, 32, 64: rows >= M masked) or
FP32 FMAs (MT = 1, 2, 4, 8). The warps' partial tiles meet in shared memory once, in a
fixed order; then the epilogue or the split-K partial. See templates/gemm_decode.cu.j2 for
the data flow and the figures of Little's law.

Its config (:class:`DecodeConfig`), its check, its search space and its template values;
registered as "decode" with templates/gemm_decode.cu.j2 and searched for fp16 / bf16
problems of M <= 64 (problem_reasons), since its GPU tests (tests/test_gpu_decode.py)
passed and bench/decode_roof.py timed it at 0.95x-1.06x torch.matmul on four of the five
decode shapes of issue 23 (B read from DRAM each call; 0.59x at 64x4096x14336) on the
H200 (bench/results/decode-roof-h200-2026-12-01.json). The model times it by its bytes in
flight per SM (tuner/model.py, the streaming model), fitted on nine exhaustive grids.

What the SASS shows of the register ring (nvcc 13.0, sm_90): ptxas puts every global load
of the main loop on one scoreboard and the math waits for it to clear, so a warp has about
one chunk in flight whatever STAGES says, and 3 or 4 stages cost registers and code for
little depth (bench/NOTES.md, "Thirtieth session"). ring="async" is the in-order ring:
each thread's slots of shared memory, filled by cp.async and waited for with wait_group,
STAGES-1 chunks really in flight. On the H200 it runs the average config 4-23% faster
than the register ring, and each decode shape's best by 1-5% back to back (bench/NOTES.md,
"Thirty-first session", "Thirty-third session"); both rings are searched, the streaming
model charging the register ring alone its stage cost. prefetch_b (B's first chunks before
the wait for the kernel before: into the ring, or into L2) is built and tested, not searched:
a search times each kernel alone, where nothing runs before it to overlap. Back to back on
the H200 (fp16, B rotated beyond L2) the best ring twin ran 1-11% faster than the best plain
kernel of each decode shape and the best L2 twin 0.5-3% (bench/NOTES.md, "Thirty-sixth
session").
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from codegen.arch import ArchLimits, parse_arch
from codegen.families import Family, FamilySpec, Math, register
from codegen.families._common import (
    CLUSTER_SPLITS, EPILOGUE_NAME, EPILOGUE_TEXTS, FLAG, DType, Layout, Name, Named, Serial, Shape,
    SplitK, cdiv, choice, split_k_reasons,
    epilogue_values, positive_sizes, shape_reasons as split_reasons, smem_reasons,
    threads_reasons, wants_split,
)

__all__ = ["DecodeConfig", "DEFAULT_DECODE", "TEMPLATE", "check", "SPACE", "MMA_TILES",
           "FMA_ROWS", "SPLITS", "REDUCES", "RINGS", "MAX_ACC_REGS", "OVERHEAD_REGS", "FMA_RATE",
           "from_params", "suggest", "params_of", "valid_configs", "problem_reasons",
           "issue_efficiency", "DECODE"]

TEMPLATE = "gemm_decode.cu.j2"

#: M tiles of the tensor-core path (m16n8k16 fragments) and of the CUDA-core path
MMA_TILES = (16, 32, 64)
FMA_ROWS = (1, 2, 4, 8)
#: elements of one lane's load of B (16 or 8 bytes); a K chunk is 4 lanes x VEC deep
VECS = (4, 8)
SPLITS = (1, 2, 4, 8, 16, 32)
REDUCES = ("pass", "last", "cluster")
#: where a warp's ring lives: registers, or its threads' slots of shared memory (cp.async)
RINGS = ("reg", "async")
#: the name's text of each prefetch_b (0, none, is never written): into the ring, into L2
PREFETCH_TEXTS = {1: "", 2: "l"}
#: the most registers a thread may give its accumulators
MAX_ACC_REGS = 64
#: registers besides the accumulators, the rings and the per-load terms of
#: DecodeConfig.regs_estimate. The terms were fitted to ptxas (CUDA 13.0, sm_90) over the
#: 837 configs of the space with at most 64 accumulators (NT with an fp16 C, bias and GELU;
#: NN plain): with 48 here the estimate is at or above the registers of every one that
#: compiled without spilling (by 26 on average, 3 at least: 8 of it a margin for other
#: compilers) and above the cap of every one that spilled. check keeps the estimate within
#: the cap, so every valid config compiles without spilling: all 191 of the grid (each
#: input type), as NT with fp16 C, bias and GELU, as NN and as TN with bf16 C, an fp32 bias
#: and SiLU, did so for sm_90 and sm_80, at least 2 registers under the estimate
#: (tests/test_decode_family.py compiles a sample and holds ptxas to the estimate)
OVERHEAD_REGS = 48
#: FP32 FMA FLOP per clock and SM over the fp16 tensor cores' (sm_80, sm_90: 256 / 4096):
#: what the model's tensor-core peak is worth to the FMA path
FMA_RATE = 1 / 16

_CPP = {DType.F16: "__half", DType.BF16: "__nv_bfloat16"}


@dataclasses.dataclass(frozen=True)
class DecodeConfig(SplitK, Serial, Named):
    """One point of the decode family.

    Attributes:
        math: "mma" (mma.sync m16n8k16, FP32 accumulation; MT 16, 32 or 64) or "fma"
            (CUDA-core FP32 FMAs on the widened inputs; MT 1, 2, 4 or 8).
        mt: rows of C a block computes (its M tile); rows >= M are masked.
        bn: columns of C a block computes (its panel of B), in blocks of 8.
        wk, wn: the block's WK x WN warps: those of one column of the arrangement share
            BN/WN columns of the panel and take every WK-th K chunk of the block's slice
            (their partial tiles are summed in shared memory); the WN warps of a row read
            the same chunk of A at once (L1 serves all but the first).
        vec: elements (2 bytes each) of a lane's load of A or B: 8 (16 bytes) or 4; a K
            chunk is 4 x VEC deep. Scalar loads where an edge or the alignment forbids it.
        stages: each warp's ring: the loads of STAGES-1 chunks of B are in flight while
            it computes one (1: load, then compute).
        ring: where the ring lives. "reg": B's loads go straight into registers, A's
            through a 2-stage ring of its own (A comes from L2 or L1: one chunk ahead);
            ptxas waits for all of a warp's register loads at once, so about one chunk
            is in flight whatever STAGES says. "async": each thread's own slots of shared
            memory, a chunk's B and A one cp.async group, waited for in order
            (cp.async.wait_group): STAGES-1 chunks really in flight (``a<stages>`` in the
            name, 2..8 stages; A row-major).
        prefetch_b: B's first chunks before the kernel waits for the one before it in
            the stream (griddepcontrol.wait), so that under programmatic dependent launch
            they stream from DRAM while that kernel finishes. 1 (``_pb``): the ring's first
            STAGES-1 chunks loaded into it, only for a B that the kernel just before does
            not write (a weight matrix: the caller's promise); 2 (``_pbl``): the same
            chunks prefetched into L2, loaded after the wait (a hint: right whatever the
            kernel before writes). With 0 every access follows the wait.
        split: split-K; SPLIT blocks share one tile of C, each summing a slice of K.
        reduce: how the slices are summed, in a fixed order: "pass" (a second kernel, the
            name's plain ``_k<split>``), "last" (the last block of a tile, through a
            workspace and a ticket, ``l``) or "cluster" (the SPLIT blocks of a tile are
            one thread-block cluster and sum through distributed shared memory, ``c``:
            sm_90, split 2, 4 or 8).
        layout, out, bias, act: how A and B are stored, C's type, the bias vector and
            the activation (see _common.EPILOGUE_NAME).

    Example:
        >>> DecodeConfig().name
        'gemm_decode_f16_mma16x64_w4x2_v8_s3'
        >>> DecodeConfig(split=4, reduce="last", layout=Layout.NT, out=DType.F16).name
        'gemm_decode_f16_mma16x64_w4x2_v8_s3_k4l_nt_of16'
        >>> DecodeConfig(ring="async", stages=6).name
        'gemm_decode_f16_mma16x64_w4x2_v8_a6'
    """

    math: str = "mma"
    mt: int = 16
    bn: int = 64
    wk: int = 4
    wn: int = 2
    vec: int = 8
    stages: int = 3
    ring: str = "reg"
    prefetch_b: int = 0
    split: int = 1
    reduce: str = "pass"
    dtype: DType = DType.F16
    family: Family = Family.DECODE
    layout: Layout = Layout.NN
    out: DType = DType.F32
    bias: str = "none"
    act: str = "none"

    #: the procedural name, encoding every field (``Named`` writes and reads it)
    NAME = Name("gemm_decode_{dtype}_{math}{mt}x{bn}_w{wk}x{wn}_v{vec}_{ring}{stages}"
                "[_pb{prefetch_b}][_k{split}{reduce}]" + EPILOGUE_NAME,
                prefetch_b=choice(PREFETCH_TEXTS),
                math=choice({"mma": "mma", "fma": "fma"}),
                ring=choice({"reg": "s", "async": "a"}),
                reduce=choice({"pass": "", "last": "l", "cluster": "c"}), **EPILOGUE_TEXTS)

    # ---- the launch interface (tuner.runtime.runners.Runner) ------------------------
    @property
    def cluster(self) -> bool:
        """Split-K summed across a thread-block cluster (one launch, no workspace; the
        cluster's shape is compiled into the kernel)."""
        return self.split > 1 and self.reduce == "cluster"

    @property
    def warps(self) -> int:
        return self.wk * self.wn

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def bnw(self) -> int:
        """Columns of a warp: BN / WN."""
        return self.bn // self.wn if self.wn > 0 else 0

    @property
    def bm(self) -> int:
        return self.mt

    @property
    def kc(self) -> int:
        """K of one chunk: 4 lanes x VEC elements."""
        return 4 * self.vec

    @property
    def bk(self) -> int:
        """K a block covers per step of its warps (WK chunks)."""
        return self.kc * self.wk

    @property
    def b_col(self) -> bool:
        """B column-major (NT, TT: x @ W.t() with W stored N x K)?"""
        return self.layout in (Layout.NT, Layout.TT)

    @property
    def ldr(self) -> int:
        """Floats per row of a warp's partial tile in shared memory (8 of padding: a
        half-warp's float2 stores fall on distinct banks)."""
        return self.bn + 8

    @property
    def is_async(self) -> bool:
        """The ring in shared memory, filled by cp.async?"""
        return self.ring == "async"

    @property
    def ring_bytes(self) -> int:
        """The shared-memory ring (async): STAGES x (B's NB + A's a_loads) loads of a
        thread, 2 x VEC bytes each."""
        if not self.is_async:
            return 0
        return self.stages * (self.bnw // 8 + self.a_loads) * self.threads * 2 * self.vec

    @property
    def smem_bytes(self) -> int:
        """The partial tiles of the WK warps of each column, [WK][MT][LDR] floats, and the
        ring (async) after them (dynamic)."""
        return self.wk * self.mt * self.ldr * 4 + self.ring_bytes

    @property
    def acc_regs(self) -> int:
        """Accumulator registers per thread: m16n8 fragments of 4, or (fma) one per row
        and n8 block of the warp (the lane's column)."""
        if self.math == "mma":
            return (self.mt // 16) * (self.bnw // 8) * 4
        return self.mt * (self.bnw // 8)

    @property
    def a_loads(self) -> int:
        """Loads of A per lane and chunk: rows g and g+8 of each 16-row tile (mma), or
        every row (fma)."""
        return (self.mt // 16) * 2 if self.math == "mma" else self.mt

    @property
    def stage_regs(self) -> int:
        """Registers of one stage of B's ring: a VEC-element load per n8 block of the warp."""
        return (self.bnw // 8) * (self.vec // 2)

    @property
    def a_ring_regs(self) -> int:
        """Registers of A's ring: 2 stages (A comes from L2: one chunk ahead) of a_loads
        VEC-element loads; one (the chunk computed) with the ring in shared memory."""
        return (1 if self.is_async else 2) * self.a_loads * (self.vec // 2)

    @property
    def regs_estimate(self) -> int:
        """Registers per thread, estimated (an upper bound, fitted: see OVERHEAD_REGS): the
        accumulators, B's ring (a single stage counted as two: it measured as much), A's, a
        quarter of the FMA path's widened A rows (MT x VEC), one per load of a stage (two
        per load of a row-major B: movmatrix's copies) and OVERHEAD_REGS."""
        nb = self.bnw // 8
        widened = self.mt * self.vec // 4 if self.math == "fma" else 0
        loads = nb * (1 if self.b_col else 2) + self.a_loads
        b_ring = 2 if self.is_async else max(self.stages, 2)
        return (self.acc_regs + b_ring * self.stage_regs + self.a_ring_regs
                + widened + loads + OVERHEAD_REGS)

    def register_cap(self, arch: ArchLimits) -> int:
        """The registers ptxas may give a thread of this block (__launch_bounds__(THREADS,
        1): 64K / THREADS in whole 8s, at most 255)."""
        per = arch.regs_per_block // max(self.threads, 1) // 8 * 8
        return min(arch.max_regs_per_thread, per)

    @property
    def b_in_flight(self) -> int:
        """Bytes of B a warp has in flight while it computes a chunk: STAGES-1 chunks (one
        with a single stage) of a warp-wide load per n8 block."""
        return max(self.stages - 1, 1) * (self.bnw // 8) * 32 * self.vec * 2

    def template_values(self) -> dict:
        mma = self.math == "mma"
        return dict(
            **epilogue_values(self),
            name=self.name, template=TEMPLATE, dtype=self.dtype.short,
            ELEM_T=_CPP.get(self.dtype, "__half"), MMA=mma, MATH=self.math,
            MT=self.mt, BN=self.bn, WK=self.wk, WN=self.wn, WARPS=self.warps,
            THREADS=self.threads, BNW=self.bnw, VEC=self.vec, KC=self.kc, STAGES=self.stages,
            ASYNC=self.is_async, PREFETCH_B=self.prefetch_b,
            NB=self.bnw // 8, MTILES=self.mt // 16,
            A_LOADS=self.a_loads, LDR=self.ldr, SMEM_BYTES=self.smem_bytes,
            ACC_REGS=self.acc_regs, STAGE_REGS=self.stage_regs, A_RING_REGS=self.a_ring_regs,
            B_FLIGHT=self.b_in_flight,
            SPLIT=self.split, LAST=self.last, REDUCE_PASS=self.reduce_pass,
            WORKSPACE=self.has_workspace, CLUSTER=self.cluster,
        )

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """M tiles fastest along x (the blocks of one panel of B run together), the K
        slices along z; the runner puts the batch along y."""
        return cdiv(m, self.mt) * cdiv(n, self.bn), 1, self.split

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1

    def workspace_floats(self, m: int, n: int, batch: int = 1) -> int:
        return batch * self.split * m * n if self.has_workspace else 0

    def ticket_count(self, m: int, n: int, batch: int = 1) -> int:
        return batch * self.grid(m, n)[0] if self.last else 0


#: the family's default (the first batch's decode kernel): 16x32 tiles of 8 warps along K,
#: chosen of the register rings as the best by geometric mean of its share of each recorded
#: grid's best (0.80 over the nine grids of bench/results/search-quality-exhaustive-*decode*.json,
#: M 1-64; the 16x64 4x2-warp 3-stage config before it: 0.57), its ring in shared memory
#: with 3 stages since both rings are searched: over the three recorded decode_roof runs of
#: both rings (the five decode shapes, NT, fp16 and bf16 C), its share of each shape's best
#: is 0.92, 0.92 and 0.97 where the 2-stage register ring's is 0.86, 0.86 and 0.93 (5 stages:
#: 0.92, 0.92, 0.96)
DEFAULT_DECODE = DecodeConfig(bn=32, wk=8, wn=1, stages=3, ring="async")


# ---- validation -----------------------------------------------------------------------
def check(c: DecodeConfig, a: ArchLimits) -> list[str]:
    """Reasons `c` cannot be built for `a`; empty when it can.

    Example:
        >>> check(DecodeConfig(mt=8), parse_arch("sm_90"))
        ['an mma tile has 16, 32 or 64 rows, not 8']
    """
    why: list[str] = []
    if c.family is not Family.DECODE:
        why.append(f"a DecodeConfig must be of the decode family, not {c.family.value}")
    if c.dtype not in _CPP:
        why.append(f"the decode family takes f16 or bf16 inputs, not {c.dtype.short}")
    if a.cc < 80:
        why.append(f"mma.sync m16n8k16 and the streaming loads need sm_80 or newer; {a.sm} "
                   "has none")
    bad = positive_sizes(MT=c.mt, BN=c.bn, WK=c.wk, WN=c.wn, VEC=c.vec, STAGES=c.stages)
    if bad:
        return why + bad
    if c.math == "mma" and c.mt not in MMA_TILES:
        why.append(f"an mma tile has {', '.join(map(str, MMA_TILES[:-1]))} or "
                   f"{MMA_TILES[-1]} rows, not {c.mt}")
    elif c.math == "fma" and c.mt not in FMA_ROWS:
        why.append(f"the FMA path takes {', '.join(map(str, FMA_ROWS[:-1]))} or "
                   f"{FMA_ROWS[-1]} rows, not {c.mt}")
    elif c.math not in ("mma", "fma"):
        why.append(f"math {c.math!r} is not mma or fma")
    if c.vec not in VECS:
        why.append(f"a lane loads 4 or 8 elements (8 or 16 bytes), not {c.vec}")
    if c.bn % (8 * c.wn):
        why.append(f"BN={c.bn} does not split into WN={c.wn} warps' columns of whole n8 "
                   "blocks (the mma's 8)")
    elif not c.b_col and c.vec in VECS and c.bnw % (4 * c.vec):
        why.append(f"a row-major B is read {4 * c.vec} columns at a time (4 lanes x "
                   f"VEC={c.vec}): a warp's BN/WN={c.bnw} is not a multiple of {4 * c.vec}")
    why += threads_reasons(c.threads, a)
    if c.ring == "reg" and not 1 <= c.stages <= 4:
        why.append(f"stages={c.stages} is outside 1..4 (a register ring)")
    elif c.is_async and not 2 <= c.stages <= 8:
        why.append(f"stages={c.stages} is outside 2..8 (a shared-memory ring)")
    elif c.ring not in RINGS:
        why.append(f"ring {c.ring!r} is not one of {', '.join(RINGS)}")
    if c.prefetch_b not in (0, *PREFETCH_TEXTS):
        why.append(f"prefetch_b is 0, 1 or 2, not {c.prefetch_b!r}")
    if c.is_async and c.layout in (Layout.TN, Layout.TT):
        why.append("a shared-memory ring copies rows of A 2 x VEC bytes at a time: a "
                   f"column-major A ({c.layout.value}) takes the register ring")
    why += _split_reasons(c, a)
    if why:
        return why
    if c.acc_regs > MAX_ACC_REGS:
        why.append(f"a warp's {c.mt}x{c.bnw} tile holds {c.acc_regs} accumulator registers "
                   f"per thread, over {MAX_ACC_REGS}")
    if c.regs_estimate > c.register_cap(a):
        why.append(f"{c.acc_regs} accumulators, {c.stages} stages of {c.stage_regs} "
                   f"registers of B, {c.a_ring_regs} of A"
                   f"{' and the widened A rows' if c.math == 'fma' else ''} need about "
                   f"{c.regs_estimate} registers per thread, over the {c.register_cap(a)} a "
                   f"block of {c.threads} threads leaves each")
    why += smem_reasons(c.smem_bytes, a)
    return why


def _split_reasons(c: DecodeConfig, a: ArchLimits) -> list[str]:
    return split_k_reasons(c, a, SPLITS, REDUCES)


def reduces(split: int, arch: ArchLimits) -> tuple[str, ...]:
    """The split-K reductions searched for `split` slices on `arch` (a cluster's only
    where one can hold the split)."""
    if split == 1:
        return ("pass",)
    return REDUCES if split in CLUSTER_SPLITS and arch.cc >= 90 else REDUCES[:2]


def _reduce_param(split: int, arch: ArchLimits) -> str:
    """The trial parameter of the reduction: one per set of choices (Optuna's categorical
    parameters keep their choices)."""
    return "decode_reduce" if reduces(split, arch) == REDUCES[:2] else "decode_reduce_c"


def problem_reasons(c: DecodeConfig, shape: Shape, arch: ArchLimits) -> list[str]:
    """The family's own reasons a config is pointless at `shape`: an M tile that a smaller
    one of the same math covers in as few tiles, and FMA tiles that read B more than once
    (fewer rows than M: the FMA path serves M <= 8, in one tile); and any config at an M
    past the largest M tile, which would read B more than once: the GEMM families'."""
    m = shape[0]
    tiles = MMA_TILES if c.math == "mma" else FMA_ROWS
    why = []
    if m > MMA_TILES[-1]:
        why.append(f"the decode family serves M <= {MMA_TILES[-1]} (B read once), not {m}")
    elif c.math == "fma" and m > FMA_ROWS[-1]:
        why.append(f"the FMA path serves M <= {FMA_ROWS[-1]}, not {m}: it would read B "
                   f"{cdiv(m, c.mt)} times")
    elif c.math == "fma" and c.mt < m:
        once = next(t for t in FMA_ROWS if t >= m)
        why.append(f"an FMA tile of {c.mt} rows reads B {cdiv(m, c.mt)} times for M={m}: "
                   f"{once} rows read it once")
    smaller = [t for t in tiles if t < c.mt and cdiv(m, t) == cdiv(m, c.mt)]
    if smaller:
        why.append(f"an M tile of {c.mt} rows is pointless for M={m}: {smaller[0]} rows take "
                   f"it in as few tiles")
    return why


# ---- the search space -----------------------------------------------------------------
#: Trial parameters decode_<name>. The math follows from the M tile (FMAs below 16 rows,
#: mma from 16); split-K ("decode_split") is asked only where the tiles of C leave SMs
#: idle, its reduction ("decode_reduce") only with a split. A lane's 8-byte loads (vec=4)
#: and panels of 16 columns stay buildable and tested, not searched (a row-major B, the
#: plain problem whose check the grid asks, reads 32 columns a warp). Both rings are
#: searched: back to back with W beyond L2 the shared-memory ring's best ran 1-5% ahead of
#: the register ring's at each decode shape (bench/NOTES.md, "Thirty-third session"); 5
#: stages and more are the shared-memory ring's alone (check refuses a register ring of 5).
#: Deep rings and 16 warps: back to back (W beyond L2) 1x4096x4096 with 16 warps of 4
#: stages against 8 of 5 went from 77% to 87-88% of the DRAM roof on the H200 (83% to 97%
#: on an H100), 16x4096x4096 at 6 stages or 12 warps from 77% to 78-79%: the bytes in
#: flight an SM holds decide the ramp of a short call (bench/NOTES.md, "Forty-first
#: session").
SPACE: dict[str, tuple] = {
    "mt": FMA_ROWS + MMA_TILES,
    "bn": (32, 64, 128),
    "wk": (2, 4, 8, 16),
    "wn": (1, 2, 4),
    "ring": RINGS,
    "stages": (2, 3, 4, 5, 6, 7, 8),
}
SEARCH_SPLITS = (1, 2, 4, 8, 16)
SEARCH_VEC = 8


def from_params(params: dict, dtype: DType) -> DecodeConfig:
    mt = int(params["mt"])
    split = int(params.get("split", 1))
    return DecodeConfig(math="mma" if mt >= 16 else "fma", mt=mt, bn=int(params["bn"]),
                        wk=int(params["wk"]), wn=int(params["wn"]), vec=SEARCH_VEC,
                        stages=int(params["stages"]), ring=params.get("ring", "reg"),
                        split=split,
                        reduce=params.get("reduce", "pass") if split > 1 else "pass",
                        dtype=dtype)


def suggest(trial, dtype: DType, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> DecodeConfig:
    """Ask a trial (anything with Optuna's suggest_categorical) for one point; split-K only
    where it can help."""
    params = {k: trial.suggest_categorical(f"decode_{k}", v) for k, v in SPACE.items()}
    cfg = from_params(params, dtype)
    if shape is not None and arch is not None and wants_split(cfg, shape, arch):
        params["split"] = trial.suggest_categorical("decode_split", SEARCH_SPLITS)
        if params["split"] > 1:
            params["reduce"] = trial.suggest_categorical(
                _reduce_param(params["split"], arch), reduces(params["split"], arch))
        cfg = from_params(params, dtype)
    return cfg


def params_of(config: DecodeConfig, shape: Shape, arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config`."""
    p = {f"decode_{k}": getattr(config, k) for k in SPACE}
    if wants_split(config, shape, arch):
        p["decode_split"] = config.split
        if config.split > 1:
            p[_reduce_param(config.split, arch)] = config.reduce
    return p


def valid_configs(arch: ArchLimits | str, dtype: DType,
                  shape: Shape | None = None) -> Iterator[DecodeConfig]:
    """Every point of SPACE that `check` accepts (and, given a shape, that the shape rules
    keep, split-K variants included), in grid order."""
    arch = parse_arch(arch)
    for vals in itertools.product(*SPACE.values()):
        c = from_params(dict(zip(SPACE, vals)), dtype)
        if check(c, arch):
            continue
        splits = SEARCH_SPLITS if shape is not None and wants_split(c, shape, arch) else (1,)
        for s, r in ((s, r) for s in splits for r in reduces(s, arch)):
            cs = dataclasses.replace(c, split=s, reduce=r)
            if shape is None or not (check(cs, arch) or split_reasons(cs, shape, arch)
                                     or problem_reasons(cs, shape, arch)):
                yield cs


def issue_efficiency(c: DecodeConfig) -> float:
    """1 for mma (the model's tensor-core peak, far above what the DRAM feeds: it sees the
    kernel as memory-bound); FMA_RATE for the FMA path, whose math runs at the FP32 rate."""
    return 1.0 if c.math == "mma" else FMA_RATE


DECODE = register(FamilySpec(
    name=Family.DECODE.value,
    config=DecodeConfig,
    template=TEMPLATE,
    check=check,
    dtypes={DType.F16: DType.F16, DType.BF16: DType.BF16},
    # the gate of the input type (the FMA path is more accurate than that)
    math=Math.TENSOR_CORE,
    space={f"decode_{k}": v for k, v in SPACE.items()},
    suggest=suggest,
    params_of=params_of,
    valid_configs=valid_configs,
    default=lambda dtype, variant=None: dataclasses.replace(DEFAULT_DECODE, dtype=dtype),
    issue_efficiency=issue_efficiency,
    shape_reasons=problem_reasons,
    min_cc=80,
    layouts=frozenset(Layout),
    epilogue=True,
    # nine recorded grids (bench/results/search-quality-exhaustive-*decode*.json, every
    # valid kernel timed on the H200): under the streaming model every kernel within 2% of
    # its grid's best was predicted at most 1.47x slower than that best (0.69-1.47 by
    # grid), so 2.0 keeps them all and would prune 12-57% of each grid once its best is
    # known (before that model 2.0 pruned 1.6% of one grid: its predictions ran twice too
    # fast)
    prune_margin=2.0,
    streams_b=True,
))
