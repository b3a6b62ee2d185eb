"""The Hopper (sm_90a) GEMM family: TMA loads, mbarrier ring, warp-specialised wgmma.

One frozen dataclass, :class:`WgmmaConfig`, its validation :func:`check_wgmma`, its
searchable values :data:`WGMMA_SPACE`, and :func:`tma_reasons`, the host-side test of
whether given operands can be described by TMA tensor maps at all (when not, the
library dispatches another family). Pure Python: nothing here touches a GPU.

The kernel (templates/gemm_wgmma.cu.j2) is built in steps that are values of its
parameters, so that a simpler step still works if a fancier one fails on the GPU:

    (a) consumers=1, cluster=1, persistent=0   one wgmma warpgroup, one tile per block
    (b) consumers=2                            two wgmma warpgroups share a block tile
    (c) persistent=1                           #SMs blocks walk the tiles (swizzled raster)
    (d) cluster=2                              two blocks along M share B by TMA multicast;
                                               with cluster_n=1 two along N share A
    (e) pingpong=1                             the two consumers take turns: each owns a whole
                                               tile, and one's epilogue overlaps the other's
                                               wgmmas (needs persistent=1; in a cluster,
                                               not searched until measured)
    (f) prep=1 (tf32)                          a pre-pass kernel rounds A and transposes B
                                               into a workspace; no conversion in the loop
    (g) prep=1 (f32, terms=3: pre-split)       the pre-pass writes big and small K-major
                                               copies of A and B; TMA loads four tiles a
                                               stage, three wgmma products, no conversion

The same kernel takes fp32 data (``dtype`` tf32, or f32 with ``terms=3``): wgmma's k8 tf32
shape wants both operands K-major, so the consumer warpgroups convert each stage in shared
memory before their wgmmas read it (A rounded in place, B transposed into a K-major copy),
see the template's header; or, with ``prep=1``, a pre-pass kernel writes those copies
into a workspace ahead of the GEMM (tf32: measured faster, 0.75-0.89x cuBLAS TF32 against
0.53-0.61x). ``terms=3`` is 3xTF32: big = tf32(x), small = tf32(x - big),
A*B ~ Abig*Bbig + Abig*Bsmall + Asmall*Bbig, an fp32 candidate held to fp32's gate; its
``prep`` is the split mode: 0 splits each stage in shared memory (in-loop), 1 pre-splits
(the pre-pass writes big and small copies of A and B, the main loop only multiplies).

What a problem asks beyond its input type (the config's ``layout``, ``out``, ``bias``,
``act``; _common.Variant) is compiled in:

- **C's type and the epilogue.** C is fp32, fp16 or bf16; the epilogue computes
  act(alpha * acc + beta * C + bias[col]) in FP32 (beta reads the old C in its own type;
  the bias is N values of C's type or fp32) and rounds once. From registers, each thread
  stores column pairs (8 bytes of fp32, 4 of fp16 / bf16). The TMA-store epilogue stages
  32-column slices in C's type: 128-byte rows swizzled 128B for fp32 C, 64-byte rows
  swizzled 64B for 2-byte C (half the buffers; a warp's 4-byte stores on 32 distinct
  banks), C's map in its type; TMA's rules then want C 16-byte aligned, ldc a whole number
  of 16 bytes and N too (4 floats, 8 halves: :func:`c_tma_reasons`).
- **Layouts.** TMA maps A and B as stored and wgmma reads each tile K-major or MN-major:
  row-major A is K-major (transpose-A 0), column-major A M-major (BM/64 boxes of BK x 64,
  transpose-A 1); row-major B is N-major (transpose-B 1), column-major B K-major (one box
  of BN rows, transpose-B 0: x @ W.t() reads W as it is). tf32 has no transpose: the
  consumers' conversion takes a row-major A with B either way (a column-major B is
  rounded in place, no transposed copy), and the pre-pass reads every layout.
- **Strided batches.** One launch walks batch x tiles; a batched operand's map has rank
  3 (its stride a multiple of 16 bytes), an operand every problem shares (stride 0) keeps
  a map of rank 2; the kernel's ``maps3`` says which (tuner/runtime/runners.py).
"""

from __future__ import annotations

import dataclasses
import random

from codegen.arch import ArchLimits, parse_arch
from codegen.families import Family, FamilySpec, Math, register
from codegen.families._common import (
    EPILOGUE_NAME, EPILOGUE_TEXTS, FLAG, DType, Layout, Name, Named, cdiv, choice,
    epilogue_values, SplitK, Variant, shape_reasons as split_reasons, wants_split,
)
from codegen.families._common import Serial as _Serial

__all__ = ["WgmmaConfig", "DEFAULT_WGMMA", "WGMMA_SPACE", "TF32_SPACE", "check_wgmma",
           "sample_wgmma", "sample_wgmma_tf32", "tma_reasons", "c_tma_reasons", "PRODUCER_REGS",
           "SWIZZLE_BYTES", "C_SLICE", "STORE_INSTR", "EPILOGUE_SLOWDOWN",
           "serial_epilogue_clk"]

#: registers a producer (TMA) thread keeps after setmaxnreg.dec
PRODUCER_REGS = 40
#: bytes of one row of a 128B-swizzled tile: the TMA box's inner extent and the swizzle span
SWIZZLE_BYTES = 128
#: columns of C per TMA store of the store=1 epilogue: 128 bytes of fp32 C (SWIZZLE_128B), 64
#: bytes of 2-byte C (SWIZZLE_64B: half the staging buffer)
C_SLICE = 32
#: slack added to the dynamic shared memory so the kernel can round its base up to 1024 B
ALIGN_SLACK = 1024
#: registers a consumer thread needs besides its accumulators (addresses, loop state, epilogue)
CONSUMER_OVERHEAD_REGS = 48

_PTX_TYPE = {DType.F16: "f16", DType.BF16: "bf16", DType.TF32: "tf32", DType.F32: "tf32"}
#: fp32 data multiplied on the tf32 tensor cores: tf32 (one product, inputs rounded to
#: nearest) or f32 (terms=3: 3xTF32)
FP32_DATA = (DType.TF32, DType.F32)
#: registers a consumer thread of the fp32-data variants needs besides its accumulators: the
#: stage conversion holds a 4x4 block of B and its tf32 parts on top of the f16 overhead
TF32_OVERHEAD_REGS = 72
#: ... and of the pre-split 3xTF32 kernel: its compensated acc += part holds a sum and its
#: error per element beside acc and part (64x192 with one consumer, 192 + 48, spilled 752
#: bytes at 255 registers)
PRESPLIT_OVERHEAD_REGS = 72
#: ... and of prep=3, per 64 rows of its consumer tile: the register operand's fragments of
#: two k-tiles (one read by the wgmmas in flight, one loaded), 4 k-steps of 4 tf32 each
RS_OVERHEAD_REGS = 32

#: the searchable values of each parameter (check_wgmma prunes the combinations)
WGMMA_SPACE: dict[str, tuple] = {
    "bm": (64, 128, 256),
    "bn": (64, 128, 192, 256),
    "bk": (64,),
    "stages": (2, 3, 4, 5, 6, 7, 8),
    "consumers": (1, 2),
    "cluster": (1, 2),
    "persistent": (0, 1),
    "group": (1, 8, 16),
    "dtype": (DType.F16, DType.BF16),
    "pingpong": (0, 1),
    "store": (0, 1),
}

#: the searchable values for fp32 data (tf32, and f32 as 3xTF32): BK = 32 floats = 128 bytes;
#: the converted copies take shared memory, so fewer stages fit (check_wgmma prunes)
TF32_SPACE: dict[str, tuple] = {
    "bm": (64, 128, 256),
    "bn": (64, 128, 192, 256),
    "bk": (32,),
    "stages": (2, 3, 4),
    "consumers": (1, 2),
    "cluster": (1, 2),
    "persistent": (0, 1),
    "group": (1, 8, 16),
    "dtype": (DType.TF32, DType.F32),
}


#: split-K's slices (1: none), all buildable and CPU-tested
SPLITS = (1, 2, 4, 8, 16)
#: the splits the search asks for, only where a point's tiles leave SMs idle (split-K passed
#: its GPU tests on the H200: bench/NOTES.md, sixteenth session)
SEARCH_SPLITS: tuple[int, ...] = SPLITS


def _up(x: int, to: int) -> int:
    return -(-x // to) * to


@dataclasses.dataclass(frozen=True)
class WgmmaConfig(_Serial, SplitK, Named):
    """One point of the wgmma family: fp16, bf16 or fp32 (tf32, 3xTF32) inputs, FP32
    accumulation, C in fp32, fp16 or bf16 with a fused bias and activation.

    Attributes:
        bm, bn, bk: block tile. BM = 64 or 128 rows per consumer warpgroup; BN up to 256
            (wgmma's largest N): a multiple of 64 for a row-major B (one 128-byte swizzled
            TMA box of B per 64 columns) or fp32 data (32), of 8 for a column-major B of
            2-byte data (one box of BN rows, whole 8-row swizzle atoms: 96, 112, 160 fill
            132 SMs where 64-multiples divide N badly), of 32 with the TMA store; BK = 64
            elements (128 bytes, the 128B swizzle span).
        stages: depth of the shared-memory ring the TMA producer fills ahead of the consumers.
        consumers: wgmma warpgroups (1 or 2), each owning BM/consumers rows of the tile.
        cluster: 1, or 2 blocks in a thread-block cluster that load one operand once and
            multicast it to both (each block loads half of its rows): along M sharing B, or
            (cluster_n) along N sharing A.
        cluster_n: 0 = the cluster's blocks are neighbours along M (B multicast, ``_x2``);
            1 = along N (A multicast, ``_x2n``: where N has more tiles than M, or A is the
            larger operand per tile).
        persistent: 0 = one (cluster) tile per block; 1 = min(#tiles, #SMs) blocks stride
            over the tiles (the kernel is the same; only the launch grid differs).
        group: cluster-tile rows per rasterisation group (1 = row order).
        pingpong: 0 = the consumers share each tile (BM/consumers rows each); 1 = two
            consumers take a block's tiles in turn, each the whole BM x BN tile, their main
            loops ordered by an mbarrier, so that one's epilogue overlaps the other's
            wgmmas (fp16 / bf16, or tf32 with nothing converted in the main loop: prep 1-3;
            persistent; in a cluster both blocks take the same turns).
        prep: fp32 data: 0 = the consumers convert each stage in shared memory; 1 = a
            pre-pass kernel (<name>_prep, launched first) writes A rounded to tf32 and B
            transposed and rounded into a workspace of (M + N) x prep_ld(K) floats, which
            the tensor maps describe (prep 1-3 take clusters, the pre-pass's Bt multicast
            as any K-major B). For 3xTF32 (terms=3) it
            is the split mode: 1 = pre-split, the pre-pass writes the big and small parts
            of each, [Abig; Asmall] (2M rows) then [Bbig; Bsmall] (2N rows), and each stage
            holds the four tiles (:attr:`presplit`; no cluster, no ping-pong: the small
            parts load apart). 2 (tf32, ``_pret``) = TMA rounds the
            operands that are K-major as stored (a row-major A, a column-major B) to tf32 as
            it loads them (TFLOAT32 maps, round to nearest even), and the pre-pass copies
            only the others (:attr:`copies_a`, :attr:`copies_b`): none for NT (x @ W.t()),
            B alone for NN, A alone for TT; the main loop is the pre-pass's. 3 (tf32,
            ``_prer``) = no pre-pass and no copy: wgmma takes one operand from registers
            (tf32's only way to read an MN-major tile), the other K-major from shared
            memory, both rounded by TMA (TFLOAT32 maps): NT and TT feed A through the
            registers; NN feeds B (the kernel computes C^T = B^T A^T tile by tile and
            writes C transposed from its accumulators, pairs of columns gathered by a
            lane exchange: :attr:`swap`). TN has neither operand K-major: A (M-major)
            goes through the registers and the pre-pass writes B transposed (Bt, K-major),
            as prep=2 does for NN's B. The register epilogue only.
        rs_pairs: prep=3 with an MN-major register operand (NN, TT): 1 (``_rp``) lays a
            thread's two wgmma rows (g, g + 8) on adjacent rows of the tile, so each
            k-step's fragments load as two 8-byte shared loads where 0 takes four 4-byte
            ones (two wavefronts either way: conflict-free), and NN's transposed epilogue
            finds both columns of a pair in one thread (no lane exchange); TN's register
            operand (A, M-major) takes it too. 0.3-22% faster on the H200 (NN, TT);
            searched.
        store: the epilogue. 0 = each thread stores its accumulators to C from registers;
            1 = per 32-column slice, the consumer warpgroup writes them into one of two
            swizzled WM x 32 shared-memory buffers and one thread issues a TMA store, which
            runs on while the next slice is written and the next tile's wgmmas run (C must
            then meet TMA's 16-byte rules: :func:`c_tma_reasons`); 2 = the same, a 2-byte
            C written into the buffers by stmatrix (four 8x8 matrices an instruction,
            where 1 stores a pair of elements an instruction; ``_tsm``; not searched: on
            the H200 it ran 1-5% behind 1 on three of four kernels and 6% ahead on one,
            bench/NOTES.md, "Thirty-sixth session").
        split: split-K: the K tiles of each tile of C are cut into `split` slices
            (whole k-tiles, as even as they divide), each a work item of its own; a slice's
            partial tile goes to a workspace W[split][M][N] (fp32) and the last of the
            tile's slices to finish (a ticket per tile) sums them in order z = 0..split-1
            and runs the epilogue (fp16 / bf16, register epilogue, no cluster, no
            ping-pong). For shapes whose tiles of C alone leave SMs idle: decode-like M
            (a 64-row tile, B streamed once by TMA) and short, wide K.
        streamk: 1 (``_sk``) = stream-K over the tiles a last, partial wave would leave
            to some SMs: the tiles up to the last whole wave but one go a tile to a block, as
            without it; the rest (a wave and the remainder, or every tile where there are
            fewer than two waves) are shared out as one range of k-tiles per block, cut at
            tile boundaries, so every block does the same number of k-tiles. A tile cut
            between blocks is summed by the last of them to finish (a ticket per tile), in
            k order, from a workspace of two partial tiles per block (FP32; its first and
            its last, the only ones of a block's range that can be cut). fp16 / bf16, no
            cluster, no ping-pong, no split-K, persistent blocks.
        terms: TF32 products per multiply: 1 (fp16, bf16, tf32), or 3 (dtype f32: 3xTF32,
            Abig*Bbig + Abig*Bsmall + Asmall*Bbig, each k-tile's sum added into the FP32
            accumulators with round-to-nearest FADDs).
        out, bias, act: C's type (fp32, fp16, bf16), the bias vector (none; "out": N values
            of C's type; "f32": N floats) and the activation, applied in FP32 by either
            epilogue before the one rounding to C's type (see _common.EPILOGUE_NAME: each
            is named only when not the default).
        layout: how A and B are stored (_common.Layout).

    Name: ``gemm_wgmma_<dtype>_<BM>x<BN>x<BK>_c<consumers>_s<stages>_x<cluster>_p<persistent>_g<group>``,
    plus ``_pp`` for ping-pong consumers, ``_pre`` for the pre-pass, ``_ts`` for the TMA-store
    epilogue and ``_t3`` for 3xTF32
    (``gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp``, ``gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3``;
    pre-split 3xTF32: ``gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3``), and ``_k<split>l`` for
    split-K summed by the last slice (``gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l``).

    Example:
        >>> WgmmaConfig().name
        'gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8'
    """

    bm: int = 128
    bn: int = 256
    bk: int = 64
    stages: int = 4
    consumers: int = 2
    cluster: int = 1
    cluster_n: int = 0
    persistent: int = 1
    group: int = 8
    dtype: DType = DType.F16
    terms: int = 1
    pingpong: int = 0
    prep: int = 0
    rs_pairs: int = 0
    store: int = 0
    split: int = 1
    streamk: int = 0
    family: Family = Family.WGMMA
    layout: Layout = Layout.NN
    out: DType = DType.F32
    bias: str = "none"
    act: str = "none"

    # ---- identity -----------------------------------------------------------
    #: the procedural name, encoding every field (``Named`` writes and reads it); the
    #: switches and 3xTF32's terms are marked only when on, so older names still read
    NAME = Name("gemm_wgmma_{dtype}_{bm}x{bn}x{bk}_c{consumers}_s{stages}_x{cluster}"
                "[n{cluster_n}]_p{persistent}_g{group}[_pp{pingpong}][_pre{prep}][_rp{rs_pairs}]"
                "[_ts{store}][_t{terms}][_k{split}l][_sk{streamk}]" + EPILOGUE_NAME,
                cluster_n=FLAG, pingpong=FLAG, streamk=FLAG, rs_pairs=FLAG, prep=choice({1: "", 2: "t", 3: "r"}),
                store=choice({1: "", 2: "m"}), **EPILOGUE_TEXTS)

    # ---- derived geometry -----------------------------------------------------
    @property
    def elem(self) -> int:
        return self.dtype.size

    @property
    def fp32_data(self) -> bool:
        """fp32 data on the tf32 tensor cores (tf32, or f32 as 3xTF32): converted in shared
        memory by the consumers before the wgmmas read it."""
        return self.dtype in FP32_DATA

    @property
    def presplit(self) -> bool:
        """3xTF32 pre-split (prep=1, terms=3): the pre-pass writes big and small copies of A
        and B, and TMA loads four K-major tiles a stage (no conversion in the main loop)."""
        return self.pre_pass and self.terms == 3

    @property
    def copies_a(self) -> bool:
        """A goes through the pre-pass: prep=1, or prep=2 with A M-major (column-major), which
        tf32 wgmma cannot read; prep=2 reads a row-major A as stored, rounded by TMA."""
        return self.prep == 1 or (self.prep == 2 and self.a_col)

    @property
    def copies_b(self) -> bool:
        """B goes through the pre-pass: prep=1, or prep=2 with B N-major (row-major), or
        prep=3 on TN (A, M-major, through the registers; B transposed to K-major)."""
        return self.prep == 1 or (self.prep == 2 and not self.b_col) or (
            self.prep == 3 and self.layout is Layout.TN)

    @property
    def pre_pass(self) -> bool:
        """A pre-pass kernel (<name>_prep) writes copies of A, of B or of both first."""
        return self.copies_a or self.copies_b

    @property
    def prep_copies(self) -> int:
        """Copies of each operand the pre-pass writes: 2 pre-split (big, small), else 1."""
        return 2 if self.presplit else 1

    @property
    def mma_k(self) -> int:
        """K of one wgmma: 16 for fp16 / bf16, 8 for tf32 (32 bytes of a row either way)."""
        return 32 // self.elem

    @property
    def tma_dtype(self) -> DType:
        """The element type of the TMA tensor maps: fp32 data is copied bit for bit (the kernel
        or its pre-pass rounds it; 3xTF32 needs every bit), or with prep=2 rounded to tf32
        by TMA as it loads (a TFLOAT32 map)."""
        if self.prep in (2, 3):
            return DType.TF32
        return DType.F32 if self.fp32_data else self.dtype

    @property
    def threads(self) -> int:
        """One producer warpgroup plus the consumer warpgroups."""
        return 128 * (1 + self.consumers)

    @property
    def swap(self) -> bool:
        """prep=3 on layout NN: the wgmmas compute C^T = B^T A^T (B's tile through the
        registers, A's K-major tile from shared memory): the consumers' rows are columns of
        C, wgmma's N runs along M, and the epilogue writes C transposed."""
        return self.prep == 3 and self.layout is Layout.NN

    @property
    def rs(self) -> bool:
        """prep=3: wgmma's A operand from registers (tf32 from an MN-major or K-major tile)."""
        return self.prep == 3

    @property
    def r_mn(self) -> bool:
        """prep=3 with the register operand's tile MN-major (NN: B's, TT: A's)."""
        return self.rs and (self.b_mn_major if self.swap else self.a_mn_major)

    @property
    def wm(self) -> int:
        """Rows of wgmma's M each consumer warpgroup owns (all of the tile's in ping-pong):
        rows of C, or with :attr:`swap` columns of C."""
        rows = self.bn if self.swap else self.bm
        if self.pingpong:
            return rows
        return rows // self.consumers if self.consumers else 0

    @property
    def mma_n(self) -> int:
        """wgmma's N: the tile's columns, or with :attr:`swap` its rows."""
        return self.bm if self.swap else self.bn

    @property
    def a_stage_bytes(self) -> int:
        return self.bm * self.bk * self.elem

    @property
    def b_chunk_bytes(self) -> int:
        """One 128-byte wide (64 fp16 or 32 fp32 columns), BK-deep column block of B, as TMA
        swizzles it."""
        return self.bk * SWIZZLE_BYTES

    @property
    def b_box_cols(self) -> int:
        """Columns of B in one 128-byte TMA box."""
        return SWIZZLE_BYTES // self.elem

    # ---- the layout: which operands sit in shared memory K-major ------------------------
    @property
    def a_col(self) -> bool:
        """A stored column-major (layout TN, TT)?"""
        return self.layout in (Layout.TN, Layout.TT)

    @property
    def b_col(self) -> bool:
        """B stored column-major (layout NT, TT: B^T row-major, as torch.nn.Linear's W)?"""
        return self.layout in (Layout.NT, Layout.TT)

    @property
    def a_mn_major(self) -> bool:
        """A's tile in shared memory M-major (wgmma's transpose-A = 1): a column-major A of
        fp16 / bf16 as TMA reads it (BM/64 boxes of BK rows of K by 64 columns of M). A
        row-major A, and the pre-pass's copies, are K-major."""
        return self.a_col and self.prep in (0, 3)

    @property
    def b_mn_major(self) -> bool:
        """B's tile as TMA brings it N-major (row-major B: BN/64 boxes of BK rows by 64
        columns); a column-major B, and the pre-pass's Bt, come K-major (one box of BN rows
        by BK). fp16 / bf16 read an N-major B with transpose-B = 1; fp32 data's consumers
        transpose it into a K-major copy (tf32 has no transpose)."""
        return not self.b_col and self.prep in (0, 3) and not self.copies_b

    @property
    def a_chunk_bytes(self) -> int:
        """One 64-column (M) box of an M-major A: BK rows of 128 bytes."""
        return self.bk * SWIZZLE_BYTES

    @property
    def b_stage_bytes(self) -> int:
        return self.bk * self.bn * self.elem

    @property
    def tx_bytes(self) -> int:
        """Bytes TMA writes into one ring stage: the mbarrier's expect_tx count (out-of-bounds
        parts of a box are zero-filled and counted too); pre-split, the big and small tiles
        of A and of B."""
        return (self.a_stage_bytes + self.b_stage_bytes) * self.prep_copies

    @property
    def conv_bytes(self) -> int:
        """Per stage, the copies the consumers write for fp32 data: B transposed to K-major
        (tf32 big parts), and for 3xTF32 the small parts of A and of B as well (none with
        the pre-pass, which converts ahead of the GEMM)."""
        if not self.fp32_data or self.prep:
            return 0
        bt = self.b_stage_bytes if self.b_mn_major else 0  # a K-major B is rounded in place
        return bt + (self.a_stage_bytes + self.b_stage_bytes if self.terms == 3 else 0)

    @property
    def conv_offsets(self) -> tuple[int, int, int]:
        """(BT_OFF, AS_OFF, BTS_OFF) in a stage of fp32 data: where the wgmmas read B (the
        transposed copy after TMA's part; a K-major B where TMA put it), and the 3xTF32
        small parts of A and B after that (pre-split: where TMA puts them)."""
        tx, a, b = self.tx_bytes, self.a_stage_bytes, self.b_stage_bytes
        if self.b_mn_major:
            return tx, tx + b, tx + b + a
        return a, a + b, 2 * a + b

    @property
    def stage_bytes(self) -> int:
        """Bytes of one ring stage: what TMA writes, plus the converted copies for fp32 data."""
        return self.tx_bytes + self.conv_bytes

    @property
    def c_row_bytes(self) -> int:
        """Bytes of one row of a C slice (store=1): 32 columns of C's type, 128 B for fp32
        C, 64 B for fp16 / bf16 C; also the TMA swizzle of C's map and buffers."""
        return C_SLICE * self.out.size

    @property
    def c_buf_bytes(self) -> int:
        """One epilogue staging buffer (store=1): WM rows of a 32-column slice of C's type
        (128 B each for fp32 C, 64 B for 2-byte C); 0 without the TMA-store epilogue."""
        return self.wm * self.c_row_bytes if self.store else 0

    @property
    def c_bytes(self) -> int:
        """The epilogue's staging buffers: two per consumer warpgroup (one written while
        the other's TMA store reads it)."""
        return 2 * self.consumers * self.c_buf_bytes

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the ring (1024-byte aligned stages), the epilogue's
        staging buffers, the full and empty mbarriers and the ping-pong order barrier,
        rounded up to 1024, plus 1024 of slack for aligning the base."""
        return ALIGN_SLACK + _up(self.stages * self.stage_bytes + self.c_bytes
                                 + 16 * self.stages + 8, 1024)

    @property
    def acc_regs(self) -> int:
        """FP32 accumulators per consumer thread: its rows (WM) x BN over 128 threads (twice
        that for 3xTF32: the k-tile's partial sums and the running total)."""
        return self.wm * self.mma_n // 128 * (2 if self.terms == 3 else 1)

    @property
    def launch_regs(self) -> int:
        """Registers per thread at launch: what __launch_bounds__(threads, 1) leaves
        (64K per SM over the block, in units of 8, at most 255)."""
        return min(255, 65536 // self.threads // 8 * 8) if self.threads else 0

    @property
    def consumer_regs(self) -> int:
        """Registers per consumer thread after setmaxnreg.inc: what the producer gives back,
        shared among the consumer threads, in units of 8, at most 256 (never below launch)."""
        spare = 65536 - 128 * PRODUCER_REGS
        regs = min(256, spare // (128 * max(self.consumers, 1)) // 8 * 8)
        # ptxas's entry allocation rounds 255 up to 256; setmaxnreg never shrinks a consumer
        return max(regs, _up(self.launch_regs, 8)) if self.threads else 0

    @property
    def setmaxnreg_inc(self) -> bool:
        """Is there anything for the consumers to take? (not with one consumer: 256 threads
        launch with 255 registers each already)"""
        return self.consumer_regs > _up(self.launch_regs, 8)

    def template_values(self) -> dict:
        """Every value the template uses, derived here so the template stays plain."""
        boxes = self.tma_boxes()
        box_rows, box_cols = boxes["B"]
        bt_off, as_off, bts_off = self.conv_offsets
        return dict(
            **epilogue_values(self), C_ES=self.out.size, C_ROW_BYTES=self.c_row_bytes,
            name=self.name, template=self.family.template, dtype=self.dtype.short,
            PTX_T=_PTX_TYPE.get(self.dtype, "f16"),
            BM=self.bm, BN=self.bn, BK=self.bk, STAGES=self.stages,
            CONSUMERS=self.consumers, CLUSTER=self.cluster, CLUSTER_N=self.cluster_n,
            PERSISTENT=self.persistent,
            GROUP=self.group, THREADS=self.threads, WM=self.wm, PINGPONG=self.pingpong,
            EMPTY_ARRIVALS=(1 if self.pingpong else self.consumers) * self.cluster,
            A_BOX_ROWS=boxes["A"][0],
            M_WGMMAS=self.wm // 64, K_STEPS=self.bk // self.mma_k, ACC=self.mma_n // 2,
            B_CHUNKS=self.bn // self.b_box_cols if self.b_mn_major else 1, B_BOX_ROWS=box_rows,
            A_MN=self.a_mn_major, B_MN=self.b_mn_major,
            A_CHUNKS=self.bm // self.b_box_cols, A_BOX_COLS=self.b_box_cols,
            A_CHUNK_BYTES=self.a_chunk_bytes,
            ES=self.elem, A_STAGE_BYTES=self.a_stage_bytes, B_CHUNK_BYTES=self.b_chunk_bytes,
            B_STAGE_BYTES=self.b_stage_bytes, STAGE_BYTES=self.stage_bytes,
            TILES_BYTES=self.stages * self.stage_bytes, SMEM_BYTES=self.smem_bytes,
            PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=self.consumer_regs,
            LAUNCH_REGS=self.launch_regs, SETMAXNREG_INC=self.setmaxnreg_inc,
            ACC_REGS=self.acc_regs,
            TF32=self.fp32_data and not self.prep, PREP=self.prep in (1, 2),
            RS=self.rs, SWAP=self.swap, R_MN=self.r_mn, RS_PAIRS=self.rs_pairs,
            MMA_N=self.mma_n, R_CHUNK_BYTES=self.bk * SWIZZLE_BYTES,
            PREP_KERNEL=self.pre_pass, COPY_A=self.copies_a, COPY_B=self.copies_b,
            TERMS=self.terms,
            SPLIT=self.presplit,
            MMA_K=self.mma_k, B_BOX_COLS=box_cols, TX_BYTES=self.tx_bytes,
            BT_OFF=bt_off, AS_OFF=as_off, BTS_OFF=bts_off,
            NC=128 * self.consumers, STORE=self.store, C_SLICE=C_SLICE,
            C_OFF=self.stages * self.stage_bytes, C_BUF_BYTES=self.c_buf_bytes,
            C_BYTES=self.c_bytes, KSPLIT=self.split, STREAMK=self.streamk,
        )

    # ---- launch geometry ------------------------------------------------------
    @property
    def cluster_shape(self) -> tuple[int, int]:
        """(blocks along M, blocks along N) of one cluster."""
        return (1, self.cluster) if self.cluster_n else (self.cluster, 1)

    def tiles(self, m: int, n: int, batch: int = 1) -> int:
        """Cluster tiles of `batch` M x N outputs: ceil(M/BM) and ceil(N/BN) each rounded up
        to the cluster's blocks along it, counted in clusters (the kernel walks them
        problem after problem)."""
        cm, cn = self.cluster_shape
        return cdiv(cdiv(m, self.bm), cm) * cdiv(cdiv(n, self.bn), cn) * batch

    def grid(self, m: int, n: int, sms: int = 132, batch: int = 1) -> tuple[int, int, int]:
        """Blocks along x: a cluster per work item (a tile of the whole batch, or with
        split-K a slice of one), or (persistent) at most sms // cluster clusters, which
        stride over the work items."""
        clusters = self.tiles(m, n, batch) * self.split
        if self.persistent:
            clusters = max(1, min(clusters, sms // self.cluster))
        return clusters * self.cluster, 1, 1

    def block(self) -> tuple[int, int, int]:
        return self.threads, 1, 1

    def cluster_dims(self) -> tuple[int, int, int]:
        """The cluster-dimension launch attribute (blocks of one cluster are adjacent in x)."""
        return self.cluster, 1, 1

    def tma_boxes(self) -> dict[str, tuple[int, int]]:
        """(rows, cols) of the TMA box of each operand, in elements of the matrix as stored
        (the runner's maps describe A, B and C as they are in memory):

        - A row-major (and the pre-pass's At): its BM x BK tile in one box (K-major);
          column-major (M-major): BM/64 boxes of BK rows (K) by 64 columns (M). In a
          cluster along N each block loads 1/cluster of those rows and multicasts them.
        - B row-major: BN/64 boxes of BK rows by 64 columns (BN/32 of 32 for fp32 data);
          column-major (and the pre-pass's Bt, N x K): one box of BN rows (N) by BK. In a
          cluster along M each block loads 1/cluster of those rows and multicasts them.
        - C (store=1): a consumer's WM x 32 slice.
        """
        sa, sb = self.a_multicast, self.b_multicast
        a = (self.bk // sa, self.b_box_cols) if self.a_mn_major else (self.bm // sa, self.bk)
        if self.b_mn_major:
            b = (self.bk // sb, self.b_box_cols)
        else:
            b = (self.bn // sb, self.bk)
        boxes = {"A": a, "B": b}
        if self.store:  # C in its type, written a consumer's WM x 32 slice per store
            boxes["C"] = (self.wm, C_SLICE)
        return boxes

    def takes(self, m: int, n: int, k: int, align: tuple) -> bool:
        """The default rule (aligned_operands), and with the TMA-store epilogue N a whole
        number of 16 bytes of C (4 floats, 8 halves: c_tma_reasons)."""
        return super().takes(m, n, k, align) and not (self.store and n % (16 // self.out.size))

    @property
    def b_multicast(self) -> int:
        """The blocks of a cluster along M share each B tile: one load, multicast."""
        return self.cluster_shape[0]

    @property
    def a_multicast(self) -> int:
        """The blocks of a cluster along N share each A tile: one load, multicast."""
        return self.cluster_shape[1]

    @property
    def aligned_operands(self) -> tuple[bool, bool, bool]:
        """TMA reads the caller's A and B (not those the pre-pass copies: it reads them with
        plain loads) and, with the TMA-store epilogue, writes C: those meet its 16-byte rules."""
        return not self.copies_a, not self.copies_b, bool(self.store)

    def direct_tma_reasons(self, lda: int, ldb: int, a_ptr: int, b_ptr: int, m: int, n: int,
                           k: int, sa: int = 0, sb: int = 0) -> list[str]:
        """:func:`tma_reasons` of the operands TMA reads as the caller stores them (an operand
        the pre-pass copies stands in as a dense, aligned one: it has no rule to meet)."""
        if self.copies_a:
            lda, a_ptr, sa = self.prep_ld(m if self.a_col else k), 0, 0
        if self.copies_b:
            ldb, b_ptr, sb = self.prep_ld(k if self.b_col else n), 0, 0
        return tma_reasons(self.tma_dtype, lda, ldb, a_ptr, b_ptr, m, n, k, self.layout, sa, sb)

    @staticmethod
    def prep_ld(k: int) -> int:
        """The pre-pass copies' leading dimension: K rounded up to 4 floats (16 bytes, TMA's
        row-stride rule)."""
        return -(-k // 4) * 4

    def prep_floats(self, m: int, n: int, k: int) -> int:
        """Floats of the pre-pass workspace: At (M x ldw) then Bt (N x ldw), pre-split
        [Abig; Asmall] (2M x ldw) then [Bbig; Bsmall] (2N x ldw), each only where that
        operand is copied (copies_a, copies_b); 0 without a pre-pass."""
        rows = (m if self.copies_a else 0) + (n if self.copies_b else 0)
        return rows * self.prep_ld(k) * self.prep_copies

    def prep_bytes(self, m: int, n: int, k: int) -> int:
        """DRAM bytes the pre-pass moves for one problem: what it copies read once, its
        copies written (0 without it); the model adds them to the kernel's time."""
        rows = (m if self.copies_a else 0) + (n if self.copies_b else 0)
        return rows * k * 4 + self.prep_floats(m, n, k) * 4

    @property
    def operand_bytes(self) -> int:
        """Bytes the main kernel loads per element of A and of B: the input type's, twice
        that pre-split (a big and a small tile each)."""
        return self.dtype.size * self.prep_copies

    def prep_grid(self, m: int, n: int, k: int) -> tuple[int, int]:
        """(blocks, a_blocks) of the pre-pass: 32 x 32 tiles of A, then of B (of those it
        copies: a_blocks = 0 where TMA reads A as stored)."""
        tk = -(-k // 32)
        a_blocks = -(-m // 32) * tk if self.copies_a else 0
        return a_blocks + (tk * -(-n // 32) if self.copies_b else 0), a_blocks

    # ---- split-K: the launch interface shared with the other families ------------------
    #: the slices of a tile are summed by the last one to finish (one launch; no reduce
    #: pass): SplitK's last and reduce_pass follow
    reduce = "last"

    @property
    def has_workspace(self) -> bool:
        """Partial tiles through a workspace: split-K's slices, stream-K's cut tiles."""
        return self.split > 1 or bool(self.streamk)

    def workspace_floats(self, m: int, n: int, batch: int = 1, sms: int = 132) -> int:
        """The partial tiles: W[batch][split][M][N] floats for split-K; for stream-K, two
        BM x BN tiles per block of the grid on `sms` SMs; 0 for neither."""
        if self.streamk:
            return self.grid(m, n, sms, batch)[0] * 2 * self.bm * self.bn
        return batch * self.split * m * n if self.split > 1 else 0

    def ticket_count(self, m: int, n: int, batch: int = 1) -> int:
        """A counter per tile of C of each problem (0 without split-K or stream-K)."""
        return self.tiles(m, n, batch) if self.has_workspace else 0


DEFAULT_WGMMA = WgmmaConfig()


def check_wgmma(c: WgmmaConfig, arch: str | int | ArchLimits) -> list[str]:
    """Reasons `c` cannot be built for `arch`, as sentences with numbers; empty when it can.

    Example:
        >>> check_wgmma(WgmmaConfig(bn=200), "sm_90")
        ['BN=200 is not a multiple of 64, the width of one 128-byte swizzled B box']
    """
    a = parse_arch(arch)
    why = _type_reasons(c, a)
    bad = {k: v for k, v in dict(BM=c.bm, BN=c.bn, BK=c.bk, stages=c.stages,
                                 consumers=c.consumers, cluster=c.cluster).items() if v < 1}
    if bad:
        return why + [f"sizes must be positive ({', '.join(f'{k}={v}' for k, v in bad.items())})"]
    why += _tile_reasons(c) + _switch_reasons(c)
    return why or _resource_reasons(c, a)


def _type_reasons(c: WgmmaConfig, a: ArchLimits) -> list[str]:
    """check_wgmma's rules of the family, the input type, 3xTF32's terms and the GPU."""
    why: list[str] = []
    if c.family is not Family.WGMMA:
        why.append(f"a WgmmaConfig must be of the wgmma family, not {c.family.value}")
    if c.dtype not in (DType.F16, DType.BF16, DType.TF32, DType.F32):
        why.append(f"the wgmma family takes f16, bf16, tf32 or f32 (3xTF32) inputs, "
                   f"not {c.dtype.short}")
    elif c.terms not in (1, 3):
        why.append(f"terms={c.terms}: 1 product, or 3 (3xTF32)")
    elif c.dtype is DType.F32 and c.terms != 3:
        why.append("f32 in the wgmma family is 3xTF32 only (terms=3); one tf32 product is "
                   "dtype tf32, and FP32 FMAs are the CUDA-core family's")
    elif c.terms == 3 and c.dtype is not DType.F32:
        why.append(f"terms=3 (3xTF32) splits fp32 data: dtype f32, not {c.dtype.short}")
    if a.cc < 90:
        why.append(f"wgmma, TMA and setmaxnreg need sm_90a; {a.sm} has none")
    return why


def _tile_reasons(c: WgmmaConfig) -> list[str]:
    """check_wgmma's rules of the tile: the consumers' rows, wgmma's N, the swizzled K row."""
    why: list[str] = []
    if c.consumers not in (1, 2):
        why.append(f"consumers={c.consumers}: one or two wgmma warpgroups")
    elif c.pingpong == 1 and c.wm not in (64, 128):
        why.append(f"{'BN' if c.swap else 'BM'}={c.wm}: each ping-pong consumer owns the whole "
                   f"tile, and its {'columns (wgmma rows of C^T)' if c.swap else 'rows'} must be "
                   f"64 or 128 (wgmma's M is 64)")
    elif c.swap and (c.bn % c.consumers or c.wm not in (64, 128)):
        why.append(f"BN={c.bn} gives each of the {c.consumers} consumer warpgroups "
                   f"{c.bn / c.consumers:g} columns of C (wgmma's rows: the kernel computes "
                   f"C^T), not 64 or 128 (wgmma's M is 64)")
    elif not c.swap and (c.bm % c.consumers or c.wm not in (64, 128)):
        why.append(f"BM={c.bm} gives each of the {c.consumers} consumer warpgroups "
                   f"{c.bm / c.consumers:g} rows, not 64 or 128 (wgmma's M is 64)")
    if c.bm > 256:
        why.append(f"BM={c.bm} rows exceed the 256 of one TMA box")
    if c.bn % 8 or c.bn > 256:
        why.append(f"BN={c.bn} is not one of wgmma's N: a multiple of 8 up to 256")
    elif (c.b_mn_major or c.fp32_data) and c.bn % c.b_box_cols:
        why.append(f"BN={c.bn} is not a multiple of {c.b_box_cols}, the width of one 128-byte "
                   f"swizzled B box")
    elif not c.b_mn_major and c.b_multicast > 1 and (c.bn // c.cluster) % 8:
        why.append(f"BN={c.bn} rows of a K-major B split over a cluster of {c.cluster} into "
                   f"{c.bn / c.cluster:g}-row halves, not whole 8-row swizzle atoms")
    if c.store and c.bn % 8 == 0 and c.bn % 32:
        why.append(f"BN={c.bn}: the TMA-store epilogue writes C in 32-column slices, and "
                   f"{c.bn} is not a multiple of 32")
    if c.bk * c.elem != SWIZZLE_BYTES:
        why.append(f"BK={c.bk} x {c.elem} B = {c.bk * c.elem} B per row; the 128B swizzle needs "
                   f"{SWIZZLE_BYTES} (BK={SWIZZLE_BYTES // c.elem})")
    return why


def _needs(switch: str, rules) -> list[str]:
    """One reason naming what `switch` needs and lacks: "<switch> needs <what> (it has
    <have>), ..." over the (what, ok, have) rules that fail; none if all hold."""
    unmet = [f"{what} (it has {have})" for what, ok, have in rules if not ok]
    return [f"{switch} needs " + ", ".join(unmet)] if unmet else []


def _switch_reasons(c: WgmmaConfig) -> list[str]:
    """check_wgmma's rules of the switches: cluster, persistence, the pre-pass, TMA stores,
    ping-pong, the raster group and the stages."""
    why: list[str] = []
    if c.cluster not in (1, 2):
        why.append(f"cluster={c.cluster}: 1, or 2 blocks sharing B (or A: cluster_n)")
    elif c.cluster == 2 and (c.bk // 2) % 8 and (c.a_mn_major if c.cluster_n else c.b_mn_major):
        why.append(f"BK={c.bk} splits into {c.bk / 2:g}-row halves, not whole 8-row swizzle atoms")
    if c.cluster_n not in (0, 1):
        why.append(f"cluster_n={c.cluster_n} is not 0 (blocks along M) or 1 (along N)")
    elif c.cluster_n and c.cluster == 1:
        why.append("cluster_n=1 lays a cluster's blocks along N; it needs cluster=2")
    if c.persistent not in (0, 1):
        why.append(f"persistent={c.persistent} is not 0 or 1")
    if c.prep not in (0, 1, 2, 3):
        why.append(f"prep={c.prep} is not 0, 1, 2 or 3")
    elif c.prep == 3 and (c.dtype is not DType.TF32 or c.store):
        why.append(f"prep=3 (tf32, one operand through registers) needs dtype tf32 and the "
                   f"register epilogue (it has {c.dtype.short}, store={c.store})")
    elif c.prep == 2 and (c.dtype is not DType.TF32 or c.layout is Layout.TN):
        why.append(f"prep=2 (tf32 rounded by TMA as it loads) needs dtype tf32 and an operand "
                   f"K-major as stored (not layout tn: prep=1 copies both; it has "
                   f"{c.dtype.short}, {c.layout.value})")
    elif c.prep and not c.fp32_data:
        why.append(f"prep=1 (the pre-pass of fp32 data) needs dtype tf32 or f32 (3xTF32), "
                   f"not {c.dtype.short}")
    elif c.rs_pairs not in (0, 1) or (c.rs_pairs and not c.r_mn):
        why.append(f"rs_pairs={c.rs_pairs}: 0, or 1 with prep=3 and an MN-major register "
                   f"operand (layouts nn, tt, tn; it has prep={c.prep}, {c.layout.value})")
    elif c.presplit and c.cluster != 1:
        why.append(f"3xTF32 pre-split (prep=1, terms=3) loads its small parts apart: no "
                   f"cluster (it has cluster={c.cluster})")
    if c.fp32_data and not c.prep and c.a_col:
        why.append(f"layout {c.layout.value}: fp32 data converted in shared memory needs a "
                   f"row-major A (wgmma's tf32 reads K-major operands only, and the consumers "
                   f"transpose B alone); the pre-pass (prep=1) reads a column-major A")
    if c.store not in (0, 1, 2):  # (its 32-column slices of C: _tile_reasons)
        why.append(f"store={c.store} is not 0, 1 or 2")
    elif c.store == 2 and c.out.size != 2:
        why.append(f"store=2 stages C by stmatrix, 2-byte elements: C is {c.out.short}")
    if c.pingpong not in (0, 1):
        why.append(f"pingpong={c.pingpong} is not 0 or 1")
    elif c.pingpong:
        why += _needs("pingpong=1", (
            ("two consumers", c.consumers == 2, f"consumers={c.consumers}"),
            ("persistent=1: a block takes several tiles", c.persistent == 1,
             f"persistent={c.persistent}"),
            ("fp16 or bf16 data, or tf32 with nothing converted in the main loop (prep 1-3)",
             not c.fp32_data or (c.prep and c.terms == 1),
             f"{c.dtype.short}, prep={c.prep}")))
    if c.split not in SPLITS:
        why.append(f"split-K {c.split} is not one of {', '.join(map(str, SPLITS))}")
    elif c.split > 1:
        why += _needs(f"split-K {c.split}", (
            ("fp16 or bf16 data", not c.fp32_data, c.dtype.short),
            ("the register epilogue", not c.store, f"store={c.store}"),
            ("no cluster", c.cluster == 1, f"cluster={c.cluster}"),
            ("no ping-pong", not c.pingpong, "pingpong=1")))
    if c.streamk not in (0, 1):
        why.append(f"streamk={c.streamk} is not 0 or 1")
    elif c.streamk:
        why += _needs("streamk=1", (
            ("fp16 or bf16 data", not c.fp32_data, c.dtype.short),
            ("no cluster", c.cluster == 1, f"cluster={c.cluster}"),
            ("no ping-pong", not c.pingpong, "pingpong=1"),
            ("no split-K", c.split == 1, f"split={c.split}"),
            ("persistent=1: each block walks a range of k-tiles", c.persistent == 1,
             f"persistent={c.persistent}")))
    if c.group < 1:
        why.append(f"raster group {c.group} must be at least 1")
    if not 1 <= c.stages <= 8:
        why.append(f"stages={c.stages} is outside 1..8")
    elif c.fp32_data and c.stages < 2:
        why.append(f"stages={c.stages}: fp32 data needs 2 or more " + (
            "(with no conversion: one stage loads while the wgmmas read another)" if c.prep
            else "(the consumers convert one stage while the wgmmas read the previous one)"))
    return why


def _resource_reasons(c: WgmmaConfig, a: ArchLimits) -> list[str]:
    """check_wgmma's rules of resources (for a config that passed the others): shared
    memory, the setmaxnreg budget, the consumers' accumulators."""
    why: list[str] = []
    if c.smem_bytes > a.smem_per_block_optin:
        what = (f": the big and small tiles of A and of B, 2 x ({c.bm} + {c.bn}) x 128 B"
                if c.presplit else "")
        why.append(f"shared memory {c.smem_bytes} B ({c.stages} stages of {c.stage_bytes} B"
                   f"{what}) exceeds the {a.smem_per_block_optin} B per-block opt-in limit "
                   f"of {a.sm}")
    budget = 128 * PRODUCER_REGS + 128 * c.consumers * c.consumer_regs
    if budget > a.regs_per_sm:
        why.append(f"setmaxnreg budget 128 x {PRODUCER_REGS} + {128 * c.consumers} x "
                   f"{c.consumer_regs} = {budget} registers exceeds the {a.regs_per_sm} of an SM")
    # the stage conversion's registers (pre-split 3xTF32 converts nothing in the loop, but
    # sums compensated)
    overhead = PRESPLIT_OVERHEAD_REGS if c.presplit else RS_OVERHEAD_REGS * (c.wm // 64) \
        + CONSUMER_OVERHEAD_REGS if c.rs else TF32_OVERHEAD_REGS if c.fp32_data \
        else CONSUMER_OVERHEAD_REGS
    if c.acc_regs + overhead > c.consumer_regs:
        why.append(f"the {c.wm}x{c.mma_n} consumer tile holds {c.acc_regs} accumulators per thread"
                   f"{' (partial sums and totals: 3xTF32)' if c.terms == 3 else ''}; "
                   f"with {overhead} more that is over the {c.consumer_regs} "
                   f"registers a consumer thread gets")
    return why


def tma_reasons(dtype: DType, lda: int, ldb: int, a_ptr: int, b_ptr: int,
                m: int = 1, n: int = 1, k: int = 1, layout: Layout = Layout.NN,
                sa: int = 0, sb: int = 0) -> list[str]:
    """Why A (lda) and B (ldb), stored as `layout` says, at these addresses cannot be TMA
    tensor maps; empty when they can. The library dispatches another family when this is
    not empty. lda and ldb are the operands' leading dimensions as stored: a column-major
    A (M x K) is a row-major K x M matrix with rows of lda >= M elements, a column-major B
    (K x N) one of N rows of ldb >= K. `sa` and `sb` are the batch strides (elements; 0:
    one operand shared by the batch, a map of rank 2), a third dimension of the map that
    follows the same 16-byte rule as a row.

    cuTensorMapEncodeTiled needs a 16-byte aligned global address, row strides that are
    multiples of 16 bytes (and below 2^40), and dimensions below 2^32.

    Example:
        >>> tma_reasons(DType.F16, 1001, 1024, 0, 0)
        ['lda=1001 x 2 B = 2002 B is not a multiple of 16 bytes']
        >>> tma_reasons(DType.F16, 64, 1024, 0, 0, m=100, n=1024, k=64, layout=Layout.TN)
        ['lda=64 is below M=100 (A is column-major)']
    """
    why: list[str] = []
    es = dtype.size
    for op, ptr in (("A", a_ptr), ("B", b_ptr)):
        if ptr % 16:
            why.append(f"{op} at 0x{ptr:x} is not 16-byte aligned (off by {ptr % 16} B)")
    for op, ld in (("lda", lda), ("ldb", ldb)):
        if (ld * es) % 16:
            why.append(f"{op}={ld} x {es} B = {ld * es} B is not a multiple of 16 bytes")
        if ld * es >= 1 << 40:
            why.append(f"{op}={ld} x {es} B is not below the 2^40-byte stride limit")
    why += _batch_stride_reasons((("A", "sA", sa), ("B", "sB", sb)), es)
    for what, v in (("M", m), ("N", n), ("K", k)):
        if v >= 1 << 32:
            why.append(f"{what}={v} is not below TMA's 2^32 elements per dimension")
    a_col, b_col = layout in (Layout.TN, Layout.TT), layout in (Layout.NT, Layout.TT)
    if a_col and lda < m:
        why.append(f"lda={lda} is below M={m} (A is column-major)")
    elif not a_col and lda < k:
        why.append(f"lda={lda} is below K={k}")
    if b_col and ldb < k:
        why.append(f"ldb={ldb} is below K={k} (B is column-major)")
    elif not b_col and ldb < n:
        why.append(f"ldb={ldb} is below N={n}")
    return why


def _batch_stride_reasons(strides, es: int) -> list[str]:
    """The 16-byte rules of a batch stride (a map's third dimension), per (operand, name,
    stride in elements); 0 is a shared operand, no dimension at all."""
    why = []
    for op, name, s in strides:
        if s < 0:
            why.append(f"{name}={s}: {op}'s batch stride is negative")
        elif (s * es) % 16:
            why.append(f"{name}={s} x {es} B = {s * es} B ({op}'s batch stride) is not a "
                       "multiple of 16 bytes")
        elif s * es >= 1 << 40:
            why.append(f"{name}={s} x {es} B is not below the 2^40-byte stride limit")
    return why


#: how c_tma_reasons counts 16 bytes of C in its elements
_C_UNITS = {DType.F32: "floats", DType.F16: "fp16 values", DType.BF16: "bf16 values"}


def c_tma_reasons(ldc: int, c_ptr: int, n: int, out: DType = DType.F32,
                  sc: int = 0) -> list[str]:
    """Why C of type `out` (ldc, at c_ptr; batch stride sc) cannot be the TMA-store
    epilogue's tensor map; empty when it can: the same 16-byte rules as A and B (address,
    row stride, batch stride), and N a whole number of 16 bytes (4 floats, 8 halves).

    Example:
        >>> c_tma_reasons(1004, 0, 1001)
        ["N=1001 is not a multiple of 4 floats: TMA stores write C's rows in 16-byte pieces, past column N"]
        >>> c_tma_reasons(1004, 0, 1004, DType.BF16)
        ['ldc=1004 x 2 B = 2008 B is not a multiple of 16 bytes', "N=1004 is not a multiple of 8 bf16 values: TMA stores write C's rows in 16-byte pieces, past column N"]
    """
    why = []
    es = out.size
    if c_ptr % 16:
        why.append(f"C at 0x{c_ptr:x} is not 16-byte aligned (off by {c_ptr % 16} B)")
    if (ldc * es) % 16:
        why.append(f"ldc={ldc} x {es} B = {ldc * es} B is not a multiple of 16 bytes")
    if ldc < n:
        why.append(f"ldc={ldc} is below N={n}")
    why += _batch_stride_reasons((("C", "sC", sc),), es)
    if n % (16 // es):  # seen on the H200: the columns up to the next 16 bytes past N were written
        why.append(f"N={n} is not a multiple of {16 // es} {_C_UNITS[out]}: TMA stores write "
                   "C's rows in 16-byte pieces, past column N")
    return why


def _draw(rng: random.Random, **fixed) -> WgmmaConfig:
    p = {k: rng.choice(v) for k, v in WGMMA_SPACE.items()}
    p.update(fixed)
    return WgmmaConfig(**p)


def sample_wgmma(n: int = 8, seed: int = 13, arch: str = "sm_90") -> list[WgmmaConfig]:
    """n distinct valid configurations that between them take every value of consumers,
    cluster, persistent, dtype, ping-pong and epilogue (deterministic for a seed)."""
    rng = random.Random(seed)
    chosen: list[WgmmaConfig] = []
    wanted = [(k, v) for k in ("consumers", "cluster", "persistent", "dtype", "pingpong",
                               "store") for v in WGMMA_SPACE[k]]
    for key, value in wanted:
        if any(getattr(c, key) == value for c in chosen):
            continue
        for _ in range(10000):
            c = _draw(rng, **{key: value})
            if not check_wgmma(c, arch) and c not in chosen:
                chosen.append(c)
                break
    while len(chosen) < n:
        c = _draw(rng)
        if not check_wgmma(c, arch) and c not in chosen:
            chosen.append(c)
    return chosen[:max(n, len(chosen))]


def _draw_fp32(rng: random.Random, **fixed) -> WgmmaConfig:
    p = {k: rng.choice(v) for k, v in TF32_SPACE.items()}
    p.update(fixed)
    return WgmmaConfig(terms=3 if p["dtype"] is DType.F32 else 1, **p)


def sample_wgmma_tf32(n: int = 6, seed: int = 14, arch: str = "sm_90") -> list[WgmmaConfig]:
    """n distinct valid fp32-data configurations (tf32 and 3xTF32) that between them take
    every value of consumers, cluster, persistent and dtype (deterministic for a seed)."""
    rng = random.Random(seed)
    chosen: list[WgmmaConfig] = []
    wanted = [(k, v) for k in ("consumers", "cluster", "persistent", "dtype")
              for v in TF32_SPACE[k]]
    wanted += [("dtype", DType.F32)] * 2  # 3xTF32 has few valid tiles: make sure of two
    for key, value in wanted:
        if key != "dtype" and any(getattr(c, key) == value for c in chosen):
            continue
        for _ in range(10000):
            c = _draw_fp32(rng, **{key: value})
            if not check_wgmma(c, arch) and c not in chosen:
                chosen.append(c)
                break
    while len(chosen) < n:
        c = _draw_fp32(rng)
        if not check_wgmma(c, arch) and c not in chosen:
            chosen.append(c)
    return chosen


# ---- the family's registration ----------------------------------------------------------
#: what the tuner searches (a subset of WGMMA_SPACE, which stays the buildable space). The GPU
#: probe (bench/results/wgmma-probe-h200-2026-12-01.json) measured two consumers with
#: BN 128-256 winning (0.93-1.01x cuBLAS). Clusters of 2 (B multicast) lost there
#: (0.30-0.59x) until the cluster fence was fixed; since, a cluster kernel was the best
#: candidate measured at 4096^3 fp16 (633 TFLOP/s), and the TMA-store epilogue (store=1)
#: the best at 8192x8192x1024 (534): both are searched. Ping-pong consumers measured 0.63-0.84x against the
#: cooperative 128x256's 0.94-1.00x (bench/results/wgmma-probe-pingpong-h200-2026-12-01.json):
#: a consumer's whole tile fits its registers only up to 128x128 or 64x256, and those
#: tiles read more shared memory per FLOP than the shared 128x256. Searched since 3ebe9b6,
#: with today's main loop and TMA store they win: the 128x128 ping-pong TMA-store kernel ran
#: 1.02x-1.21x cuBLAS at issue 23's shapes, ahead of the cooperative winners by 2-12%
#: (bench/results/pingpong-wgmma-3ebe9b6-h200-2026-12-03.json). The model still puts them
#: at about 0.8x of the cooperative 128x256 (more L2 traffic per FLOP, where the cooperative
#: kernels' predicted issue bound is the boost clock's peak, which none reaches), so a
#: guided search times them late (tests/test_model.py's KNOWN_MISRANKED); the family's
#: default (_default) is one of them, timed first.
#: Two stages never keep the tensor cores fed (one TMA in flight), so the ring starts at
#: three.
SEARCH_SPACE: dict[str, tuple] = {
    "bm": (64, 128, 256),
    "bn": (64, 128, 192, 256),
    "stages": (3, 4, 5, 6),
    "consumers": (1, 2),
    "cluster": (1, 2),
    "persistent": (0, 1),
    "group": (1, 8, 16),
    "store": (0, 1),
}
#: fp16 / bf16 data also chooses the consumers' arrangement: cooperative (0) or ping-pong
#: (1; fp32 data has no ping-pong: check_wgmma)
TWO_BYTE_SEARCH: dict[str, tuple] = {"pingpong": (0, 1)}
#: fp16 / bf16 tiles of up to 24 KB a stage (BM + BN <= 192: 64x64, 128x64, 64x128) ask their
#: ring from DEEP_STAGES, under a parameter of its own ("wgmma_stages_deep": Optuna's
#: categorical parameters keep their choices), so no other tile is asked a ring it cannot
#: fit: memory-bound problems want the deepest ring (8 stages ran 4-8% faster than 6 at
#: 128x64 with the weights read from DRAM, bench/NOTES.md, twenty-fifth session)
DEEP_STAGES = (3, 4, 5, 6, 7, 8)
DEEP_TILE = 192
#: tf32 data also chooses how its operands reach the tensor cores: converted in the main
#: loop (0), a pre-pass (1), TMA's own rounding of what is K-major as stored (2), or one
#: operand through registers (3). On the H200 (bench/results/pairs-tf32-registers-9ae7ca8-*,
#: pairs-tf32-tma-rounded-9ae7ca8-*, each beside cuBLAS TF32): NN 256x128 prep 3 0.967x at
#: 4096^3 and 0.981x at 8192^3 against the pre-pass's 0.78x and 0.87x; NT prep 2 1.02-1.04x,
#: prep 3 1.02x; TT prep 3 1.00x; the conversion 0.40x. With prep 3 and an MN-major register
#: operand (NN, TT) it also chooses whether that operand's rows come in pairs (rs_pairs):
#: 1.01x-1.06x cuBLAS TF32, 0.3-22% ahead of the same kernels without
#: (bench/results/tf32-register-pairs-770481b-h200-2026-12-05.json); asked of prep 3 only
#: (_conditional), and check_wgmma rejects 1 for a K-major register operand (NT)
TF32_SEARCH: dict[str, tuple] = {"prep": (0, 1, 2, 3), "rs_pairs": (0, 1)}
#: 3xTF32 (fp32 data on three tf32 products) chooses its split mode: in the main loop (0),
#: or pre-split (1: the pre-pass writes big and small copies); TMA's rounding and the
#: register operand keep only tf32's bits
F32X3_SEARCH: dict[str, tuple] = {"prep": (0, 1)}


def _searched(dtype: DType) -> dict[str, tuple]:
    """The searched parameters of a request in `dtype` and their values."""
    extra = {DType.TF32: TF32_SEARCH, DType.F32: F32X3_SEARCH}.get(dtype, TWO_BYTE_SEARCH)
    return {**SEARCH_SPACE, **extra}


def _conditional(k: str, params: dict) -> bool:
    """Is parameter `k` asked, given the ones asked before it? (rs_pairs only of prep 3.)"""
    return k != "rs_pairs" or params.get("prep") == 3


def _point(dtype: DType, **params) -> WgmmaConfig:
    """A searched point: BK one 128-byte swizzle row of the input type (64 halves, 32
    floats), and fp32 data (an f32x3 request's f32 configs) as 3xTF32."""
    return WgmmaConfig(dtype=dtype, bk=128 // dtype.size, terms=3 if dtype is DType.F32 else 1,
                       **params)


def _splits_wanted(c: WgmmaConfig, shape, arch: ArchLimits | None) -> bool:
    """Is split-K searched for this point? Where SEARCH_SPLITS has more than one value, for
    fp16 / bf16, and only where its tiles of C leave SMs idle (the rule every family's
    split-K follows)."""
    return (len(SEARCH_SPLITS) > 1 and shape is not None and arch is not None
            and not c.fp32_data and wants_split(c, shape, arch))


def _stages_param(dtype: DType, bm: int, bn: int) -> tuple[str, tuple]:
    """The trial parameter of a tile's ring and its values (DEEP_STAGES for small fp16 /
    bf16 tiles)."""
    if dtype not in FP32_DATA and bm + bn <= DEEP_TILE:
        return "wgmma_stages_deep", DEEP_STAGES
    return "wgmma_stages", SEARCH_SPACE["stages"]


def suggest(trial, dtype: DType, shape=None, arch: ArchLimits | None = None) -> WgmmaConfig:
    """Ask a trial (anything with Optuna's suggest_categorical) for one point; the ring
    after the tile (_stages_param); split-K ("wgmma_split") only where it can help."""
    params = {}
    for k, values in _searched(dtype).items():  # (BM and BN come before the ring)
        name = f"wgmma_{k}"
        if k == "stages":
            name, values = _stages_param(dtype, params["bm"], params["bn"])
        if _conditional(k, params):
            params[k] = trial.suggest_categorical(name, values)
    c = _point(dtype, **params)
    if _splits_wanted(c, shape, arch):
        c = dataclasses.replace(c, split=trial.suggest_categorical("wgmma_split",
                                                                   SEARCH_SPLITS))
    return c


def params_of(config: WgmmaConfig, shape, arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config`."""
    deep = _stages_param(config.dtype, config.bm, config.bn)[0]
    p = {deep if k == "stages" else f"wgmma_{k}": getattr(config, k)
         for k in _searched(config.dtype) if _conditional(k, vars(config))}
    if _splits_wanted(config, shape, arch):
        p["wgmma_split"] = config.split
    return p


def problem_reasons(config: WgmmaConfig, shape, arch: ArchLimits | None = None) -> list[str]:
    """Why the tuner's problem at `shape` (dense A and B stored as config.layout says,
    lda = K or M, ldb = N or K, in allocations aligned to 256 bytes) cannot be given to
    `config` as TMA tensor maps, or would leave blocks of its clusters idle; the search
    rejects such candidates before compiling them, with these reasons.

    Example:
        >>> problem_reasons(WgmmaConfig(), (4096, 4095, 4096))
        ['TMA cannot describe the operands: ldb=4095 x 2 B = 8190 B is not a multiple of 16 bytes']
    """
    m, n, k = shape
    # dense operands as the layout stores them: lda = K (row-major A) or M (column-major),
    # ldb = N (row-major B) or K (column-major); the pre-pass reads A and B with plain
    # loads, and TMA reads its copies
    lda, ldb = (m if config.a_col else k), (k if config.b_col else n)
    why = config.direct_tma_reasons(lda, ldb, 0, 0, m, n, k)
    if config.store:  # the tuner's C: ldc = N
        why += c_tma_reasons(n, 0, n, config.out)
    why = [f"TMA cannot describe the operands: {w}" for w in why] + unproven_reasons(config)
    # measured at 128 rows: 30 us against 17 without the cluster
    for blocks, dim, size, tile, shared in zip(config.cluster_shape, "MN", (m, n),
                                               (config.bm, config.bn), "BA"):
        tiles = -(-size // tile)
        if blocks > tiles:
            why.append(f"a cluster of {blocks} blocks along {dim} ({shared} multicast) needs as "
                       f"many {dim} tiles; {dim}={size} makes {tiles} of {tile} "
                       f"{'rows' if dim == 'M' else 'columns'}, so {blocks - tiles} of each "
                       f"cluster's blocks would compute nothing")
    return why


def unproven_reasons(config: WgmmaConfig) -> list[str]:
    """Why the search leaves a buildable config out: ping-pong consumers in a cluster, which
    ran 1-10% behind the same tile without one on the H200
    (bench/results/pairs-wgmma-clusters-9ae7ca8-h200-2026-12-05.json), and stream-K, 10-28%
    behind the same tile without it on an H100
    (bench/results/stream-k-a6e4fb2-h100-2026-12-05.json). (A cluster along N, -1% to -7%,
    is not in SEARCH_SPACE at all.)"""
    if config.pingpong and config.cluster > 1:
        return ["ping-pong consumers in a cluster are not searched: they measured 1-10% "
                "behind the same tile without a cluster"]
    if config.streamk:
        return ["stream-K is not searched: it measured 10-28% behind the same tile without it"]
    return []


def valid_configs(arch, dtype: DType, shape=None):
    """Every searched point that `check_wgmma` (and, given a shape, `problem_reasons` and
    the split-K rules) accepts for `arch`, in grid order (a small tile's deeper rings after
    its last shallow one); split-K variants where the shape's tiles leave SMs idle."""
    import itertools

    arch = parse_arch(arch)
    space = _searched(dtype)
    for vals in itertools.product(*space.values()):
        params = dict(zip(space, vals))
        rings = [params["stages"]]
        if params["stages"] == space["stages"][-1]:
            rings += [s for s in _stages_param(dtype, params["bm"], params["bn"])[1]
                      if s > params["stages"]]
        for ring in rings:
            base = _point(dtype, **{**params, "stages": ring})
            for split in SEARCH_SPLITS if _splits_wanted(base, shape, arch) else (1,):
                c = dataclasses.replace(base, split=split)
                if not (check_wgmma(c, arch) or unproven_reasons(c)) and (shape is None or not (
                        problem_reasons(c, shape, arch) or split_reasons(c, shape, arch))):
                    yield c


def _default(dtype: DType, variant: Variant | None = None) -> WgmmaConfig:
    """The best measured on the H200, built as `variant` (default: the plain one):
    fp16/bf16 128x128x64 with ping-pong consumers and the TMA store
    (bench/results/pingpong-wgmma-3ebe9b6-h200-2026-12-03.json: ahead of the cooperative
    winners at issue 23's shapes by 2-12%; the model ranks it low, so the search times it
    first as the family's default); tf32 256x128x32 with one operand through registers (4
    stages: 0.97x-0.98x cuBLAS TF32 in NN; 128x256 where A is the register operand,
    1.00x-1.02x in NT and TT;
    bench/results/pairs-tf32-registers-9ae7ca8-h200-2026-12-05.json; TN's, with B's
    pre-pass, is out of the search until the GPU has run it), its rows in pairs where the register operand's tile is
    MN-major (NN, TT: 1.01x-1.06x cuBLAS TF32, +0.3% to +22% on the same kernel without,
    bench/results/tf32-register-pairs-770481b-h200-2026-12-05.json); 3xTF32 128x128x32 (2
    stages: its split tiles take the room of the others;
    bench/results/wgmma-probe*-h200-2026-12-01.json)."""
    variant = variant or Variant()
    if dtype is DType.TF32:
        c = variant.apply(_point(dtype, bm=256, bn=128, stages=4, consumers=2, cluster=1,
                                 persistent=1, group=8, prep=3))
        if not c.swap:  # the register operand is A: a consumer's 128 rows of it fit as 128x256
            c = dataclasses.replace(c, bm=128, bn=256)
        return dataclasses.replace(c, rs_pairs=1) if c.r_mn else c
    if dtype is DType.F32:
        c = _point(dtype, bm=128, bn=128, stages=2, consumers=2, cluster=1, persistent=1,
                   group=8)
    else:
        c = _point(dtype, bm=128, bn=128, stages=5, consumers=2, cluster=1, persistent=1,
                   group=16, pingpong=1, store=1)
    return variant.apply(c)


#: fp32 data converted in the main loop (prep=0: the consumers round A and transpose B in
#: shared memory, and split both for 3xTF32, before each stage's wgmmas) against the same
#: tile fed by the pre-pass, measured on the H200: tf32 0.61-0.70x (256x128,
#: bench/results/wgmma-probe-prep-h200-2026-12-01.json), 3xTF32 0.43-0.44x (4096^3, 8192^3,
#: 8192x8192x1024, bench/results/tf32x3-accuracy-h200-2026-12-01.json), by terms
CONVERT_EFFICIENCY = {1: 0.65, 3: 0.44}


def issue_efficiency(c: WgmmaConfig) -> float:
    """The share of the tensor cores' rate the main loop keeps: 1 / terms (3xTF32 spends
    three TF32 products on each multiply), times CONVERT_EFFICIENCY where fp32 data is
    converted in the loop rather than by the pre-pass (which the model charges apart, as
    DRAM traffic)."""
    eff = 1.0 / c.terms
    return eff * CONVERT_EFFICIENCY[c.terms] if c.fp32_data and not c.prep else eff


#: instructions a consumer thread issues per output of its tile in the epilogue, beyond the
#: bias, activation and conversion (the model's EPILOGUE_INSTR), on the beta = 0 path of a
#: tile inside C: by its store (0 registers -> C, 1 a shared slice -> TMA). Estimated from
#: nvcc 13.0's SASS of gemm_wgmma_f16_256x128x64_c2_s4_x1_p1_g8[_ts]_of16 (128 outputs a
#: thread): after the last HGMMA 4,371 static instructions with the register store (a
#: predicate and a branch per pair for beta and the edges; the interior beta = 0 path some
#: 40% of them); the TMA store's beta = 0 copy of its slice loop 92 instructions a slice of
#: 16 pairs (2.9 an output, its conversions' 0.5 counted apart; 7 before that copy, when
#: every pair tested beta and the edges). Counted, not calibrated on timings. Not yet
#: recounted for the copies since (56b02db, bf4ae5e): with alpha = 1 the TMA store's slice
#: is 55-58 instructions, and a register-store tile inside C tests nothing per element.
#: Staged by stmatrix (2), counted the same way (nvcc 13.0, the three copies of the slice
#: loop of gemm_wgmma_f16_256x128x64_c2_s4_x1_p1_g8_ts[m]_of16 and of a bf16 128x256): 168-200
#: instructions fewer, 0.44-0.52 an output (48 STSM for 192 STS, and fewer addresses).
STORE_INSTR = {0: 14.0, 1: 2.5, 2: 2.0}
#: the cooperative consumers' epilogue takes this many times the clocks its instructions
#: issue in: its stores, the staging's barriers and the TMA store's waits are in the path
#: of the math, not beside it. Fitted on the recorded fp16 studies of the H200: the 17
#: fresh default tunes (bench/results/tune-studies-fp16-*.json, 1,463 kernels) and the
#: exhaustive 4096^3 grid (1,008). At 1 (the instructions alone) the tunes ranked at
#: 0.49-0.88, the three at 8192x8192x1024 with ping-pong searched below 0.6: there the
#: cooperative 128x256 and 256x128 kernels ran at 0.65-0.72 of their predicted rate where
#: ping-pong ran at 0.92-1.20 (short K: 16 k-tiles of math a tile, and one block an SM, so
#: nothing hides the epilogue). At 2 the tunes rank at 0.61-0.92 and the grid as before
#: (0.855 over it, 0.618 over the 150 the model puts first); 3-5 lift the tunes' worst to
#: 0.63-0.64 but drop the grid's first 150 to 0.44-0.25 (its K of 4096 hides what short K
#: shows): one factor cannot serve both, 2 serves each at its bar (tests/test_model.py)
EPILOGUE_SLOWDOWN = 2.0
#: outputs a consumer's register store writes per L1 wavefront: a warp's store of a column
#: pair per lane spans 8 rows of C (the accumulator fragment's), 8 lines a request
STG_OUTPUTS_PER_WAVEFRONT = 8


def serial_epilogue_clk(c: WgmmaConfig, extra_per_output: float, fill_clk: float) -> float:
    """Clocks per tile in which the tensor cores wait for the epilogue (FamilySpec's
    serial_epilogue_clk): the cooperative consumers' epilogue issues STORE_INSTR plus
    `extra_per_output` instructions per output over their warps (4 schedulers); the
    register store is held at least by its stores' wavefronts. Ping-pong overlaps one
    consumer's epilogue with the other's wgmmas: none. A block per tile (not persistent)
    also starts its ring cold: `fill_clk`, where a persistent producer fills the next
    tile's stages during the epilogue."""
    fill = 0.0 if c.persistent else fill_clk
    if c.pingpong:
        return fill
    outputs = c.bm * c.bn
    # a warp instruction covers 32 outputs; the SM's 4 schedulers issue one each a clock
    issue = outputs / 32 * (STORE_INSTR[c.store] + extra_per_output) / 4
    if not c.store:
        issue = max(issue, outputs / STG_OUTPUTS_PER_WAVEFRONT)
    return EPILOGUE_SLOWDOWN * issue + fill


WGMMA = register(FamilySpec(
    name=Family.WGMMA.value,
    config=WgmmaConfig,
    template="gemm_wgmma.cu.j2",
    check=check_wgmma,
    # fp32 data: tf32 (a tf32 request) and 3xTF32 (an f32x3 one, --allow-3xtf32)
    dtypes={DType.F16: DType.F16, DType.BF16: DType.BF16, DType.TF32: DType.TF32,
            DType.F32X3: DType.F32},
    searched=True,
    math=Math.TENSOR_CORE,
    # fp32 data adds TF32_SEARCH, fp16 / bf16 TWO_BYTE_SEARCH
    space={f"wgmma_{k}": v for k, v in SEARCH_SPACE.items()},
    suggest=suggest,
    params_of=params_of,
    valid_configs=valid_configs,
    default=_default,
    shape_reasons=problem_reasons,
    # launched through tensor maps (and cuLaunchKernelEx for clusters)
    runner="tuner.runtime.runners:TmaRunner",
    # C in fp32, fp16 or bf16, a bias and an activation, in both epilogues
    epilogue=True,
    # A and B row- or column-major (fp32 data without the pre-pass: A row-major; check says)
    layouts=frozenset(Layout),
    issue_efficiency=issue_efficiency,
    serial_epilogue_clk=serial_epilogue_clk,
    # measured / predicted over an fp16 4096^3 study with the model off (33 wgmma kernels
    # timed, H200, bench/results/model-calibration-wgmma-h200-2026-12-01.json): 0.71-1.25:
    # the model underestimates some by 1.25x, where the CUDA-core family's margin would
    # prune them (3xTF32 kernels converted in the loop measured 0.22-0.32 of their
    # prediction before CONVERT_EFFICIENCY, about 0.5-0.73 with it: never pruned)
    prune_margin=1.5,
    min_cc=90,
    max_cc=90,
))
