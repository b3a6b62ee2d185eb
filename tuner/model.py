"""The model: prunes compiled candidates before they reach the GPU, and ranks them.

Two things live here.

**The bound** (:func:`bound_tflops`, used by :func:`judge`). A candidate is hopeless,
and never timed, when
  1. it spills registers to local memory (spill stores or loads > 0 bytes), or
  2. no block fits on an SM (occupancy model: 0 blocks per SM), or
  3. its *bound* is below the best time already measured.

The bound is an upper bound on the TFLOP/s a kernel of this shape can reach, the
product of:
  peak            by the family's math (codegen.families.Math): CUDA cores: SMs x FMA
                  lanes x 2 x clock (the device's own figures on a GPU); tensor cores:
                  SMs x tensor-core FLOP/clock x clock (tf32 half of fp16)
  tile efficiency useful / computed work when M, N, K are rounded up to the tile
  wave efficiency blocks / (SMs x ceil(blocks / SMs)), blocks = tiles x split-K:
                  SMs idle in the last wave
  issue efficiency the family's own figure (FamilySpec.issue_efficiency); SIMT:
                  FFMA / (FFMA + LDS) in the inner loop, RM*RN FMAs per RM/VA + RN/VB
                  shared loads, each taking an issue slot; WMMA: 1
Every factor only removes work a real kernel must do, so a kernel can never beat
its bound; pruning on it loses nothing that could have won.

**The predicted time** (:func:`predict`): an estimate, not a bound, whose job is to
*rank* candidates of one shape before they are timed. It is the largest of four times,
plus an epilogue the math waits for, plus the fixed costs of the launch:

  issue    the busiest SM's instruction issue. Per thread and K tile of a register
           micro-tile (FamilySpec.micro_tile: SIMT): BK*RM*RN FFMA, BK*(RM/VA + RN/VB)
           LDS, the global loads and shared stores of the tile (A is stored
           transposed: one STS per float; cp.async: one copy per float of A, one per
           vector of B) and ``K_TILE_OVERHEAD`` instructions of loop, address and
           barrier; the epilogue's RM*RN stores and scaling; for a kernel with an interior
           path (SIMT's ``interior``), times ``INTERIOR_ISSUE`` over the tiles of C that
           lie wholly inside. Any other family (the
           tensor-core ones) issues its FLOP at its math's peak rate over its own
           issue efficiency (FamilySpec.issue_efficiency). An SM issues 4 warp
           instructions a clock (one per scheduler) when it holds ``SATURATING_WARPS``
           warps or more, proportionally less below (occupancy); a micro-tile of more
           than ``SATURATING_FMAS`` FFMAs a k-step needs proportionally fewer warps.
  latency  per K tile the wait for global memory, ``MEM_LATENCY_CLK`` clocks, hidden
           by the STAGES-1 tiles in flight (stages >= 2); with one stage the wait adds
           to the tile's compute. An SM runs its blocks in waves of blocks/SM
           (occupancy); the busiest SM gets ceil(blocks / SMs) of them (wave
           quantisation), so a wave's time is max(issue of its blocks, latency). Blocks
           in clusters run in waves of the clusters that fit at once
           (ArchLimits.cluster_slots: a cluster's blocks share a GPC, and a GPC whose
           SMs the size does not divide leaves some idle; :func:`busiest_sm`).
  dram     the tiled DRAM traffic over the DRAM bandwidth: the blocks resident at once
           (one wave over the GPU, rasterised in swizzle groups) read the A panels of
           their block rows and the B panels of their block columns; waves read again
           what the one before read unless A and B fit in half the L2; never less than
           A + B once, plus C written once in its type (2 bytes an element for fp16 /
           bf16 C), the bias vector read once, and the split-K workspace (FP32,
           written and read). A strided batch is that many problems, each its own A,
           B and C (a B shared by the batch is not modelled: read once per problem).
  l2       every block's A and B panels, its C tile and its slice of the bias over the
           L2 bandwidth (a B panel multicast to a cluster's blocks counted as
           ``MULTICAST_L2_CREDIT`` says: measured, the clusters save nothing).

A batch of B problems launches B x tiles x split-K blocks: the wave quantisation, the
bound's wave efficiency and every byte count are over all of them, and the FLOPs are B
times one problem's. The epilogue's bias and activation cost their instructions
(``EPILOGUE_INSTR``, per element of C: estimates, not calibrated).
  epilogue an epilogue the math waits for (FamilySpec.serial_epilogue_clk: the wgmma
           family's cooperative consumers store C after their last wgmma; ping-pong
           overlaps it, and a block per tile also starts its ring cold), per tile on the
           busiest SM's waves of one block, added to the largest of the four.
  arch     a family whose instructions reach only part of the arch's peak
           (FamilySpec.arch_efficiency: WMMA's mma.sync on Hopper) has the sum divided
           by that share.
  fixed    ``LAUNCH_S`` per kernel launched (split-K's second pass is a second one; a
           pre-pass of fp32 data, tf32 or pre-split 3xTF32, another per problem), and the
           pre-pass's DRAM traffic (``prep_bytes``: A and B read, their copies written).
  stream-K (the wgmma family's ``streamk``) evens the busiest SM's share out: past a
           whole number of waves, each SM does blocks x k-tiles / SMs of the k-tiles (up
           to one more), in as many units as it has tiles whole or cut; the cut tiles cost
           the busiest SM two partial tiles written and two read at its share of the L2's
           rate (its first and last units'), plus ``STREAMK_FIXUP_S``. (Measured, it ran
           8-47% behind the same tiles without it, where this predicts 2.5-3.1% ahead:
           bench/NOTES.md, fortieth session; stream-K is not searched.)

**The streaming model** (:func:`_predict_stream`, families with ``streams_b``: decode). A
skinny kernel (M <= 64) reads B once from DRAM and does little with it; its warps stream B
into registers, STAGES-1 chunks ahead. Its time is the busiest SM's: each wave of its
resident blocks waits ``STREAM_LATENCY_S`` for the first bytes, then moves its blocks' B
at the least of three rates: Little's law (the wave's bytes in flight over the latency),
what one SM's loads pull (``SM_DRAM_SHARE`` of its share of the DRAM: an SM alone does not
reach the DRAM's rate, so a grid of fewer blocks than SMs cannot) and its share of the
DRAM's bandwidth among the SMs with work. Then the larger of that, the issue of its instructions per chunk
(``STREAM_ISSUE_SCALE`` times the math and loads counted) and the L2's traffic (A read by
every panel); a register ring of more than two stages costs ``STREAM_STAGE_COST`` a stage
(measured on every grid; the SASS says why: ptxas puts every load of the ring on one
scoreboard, and the math waits for all of them, so the deeper ring buys its registers and
code and little depth; with it a warp has about one chunk in flight, which is the per-SM
limit above: bench/NOTES.md, "Thirtieth session"), a shared-memory ring (cp.async, its
stages really in flight) nothing (fitted on three decode_roof runs, 2,300 kernels of both
rings: measured over predicted 0.61-0.87 for that ring with the cost, 0.91-1.28 without;
bench/NOTES.md, "Thirty-third session"); split-K adds its partial tiles' bytes
(``STREAM_PARTIAL_COST`` times, through the workspace or the cluster's shared memory) and
a fixed cost per reduction (``STREAM_LAST_S``, ``STREAM_CLUSTER_S``, ``STREAM_PASS_S``);
and ``STREAM_FIXED_S``. Calibrated on nine exhaustive decode grids
(bench/results/search-quality-exhaustive-*decode*.json: M 1-64, N 1024-14336, K
1024-14336, NT and NN, fp16 and bf16, 4,870 kernels; bench/model_rank.py
--calibrate-stream, whose criterion is the rank correlation less the error of the
predicted time of each grid's fastest tenth: a search weighs these kernels against other
families', so their scale counts, not only their order): rank correlation 0.56-0.89 per
grid (the tiled terms: 0.04-0.62), 0.56-0.89 on each grid left out of the calibration;
the fastest tenth predicted at 0.82x-1.06x its measured time.

The constants are physical figures of the H100 / H200 class, then calibrated (a small
grid search, ``bench/model_rank.py --calibrate``) on the measured studies committed
under artifacts/studies.db and bench/results (the exhaustive 4096^3 grid and the
TPE runs of 127x129x4097, 16x4096x4096 and four other shapes), maximising the mean
Spearman rank correlation between predicted and measured time; the figures and the
per-shape correlations are in bench/results/model-rank-*.json.

:func:`spearman` is the rank correlation the tune's JSON, ``inspect`` and the report
quote; :func:`predict_before_compile` ranks configurations whose registers are not
known yet (an estimate from the micro-tile), which is how the search orders its first
batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

from codegen.arch import ArchLimits
from codegen.compile import Resources
from codegen.families import Config, DType, family_of
# the shape rules live with the configs (the families' spaces use them); re-exported here
from codegen.families._common import cdiv as _cdiv, shape_reasons as _shape_reasons, wants_split
from codegen.occupancy import Occupancy, occupancy

__all__ = ["Verdict", "judge", "bound_tflops", "shape_reasons", "wants_split", "Prediction",
           "predict", "predict_before_compile", "estimate_registers", "register_cap",
           "likely_spills", "spearman",
           "tile_traffic", "out_bytes", "bias_bytes", "PRUNE_MARGIN", "CONSTANTS",
           "EPILOGUE_INSTR", "MULTICAST_L2_CREDIT"]


# ---- the time model's constants (see the module doc; calibrated in bench/model_rank.py) --
#: The values below were calibrated (bench/model_rank.py --calibrate, a coordinate search
#: from the physical guesses in brackets) on the recorded H200 studies:
#: warps per SM at which the schedulers issue every clock (latency of FFMA, LDS hidden) [8]
SATURATING_WARPS = 12
#: a micro-tile's FFMAs a k-step (RM x RN, independent) up to which SATURATING_WARPS holds;
#: a warp with more keeps its scheduler busy longer on its own, so fewer warps saturate
#: (x SATURATING_FMAS / (RM x RN); 0: none). Set from the recorded studies where the 8x16
#: and 16x8 micro-tiles (8 warps, one block an SM) won: at 12 warps the model put them 17%
#: slower than they ran and 64th-71st in its order at 4096^3; at 64 FFMAs, 4th-5th
#: (bench/NOTES.md, "Forty-third session")
SATURATING_FMAS = 64
#: clocks from a global load to its data in shared memory or registers, under load [1000]
MEM_LATENCY_CLK = 1500
#: instructions per thread and K tile besides FFMA, LDS and the tile's loads and stores [12]
K_TILE_OVERHEAD = 4
#: achieved fraction of the DRAM bandwidth (ArchLimits.mem_gbs is the vendor's figure of
#: the typical part; the H200's copy measured 4.3 TB/s)
DRAM_GBS = {90: 4300.0}
#: L2 bandwidth, GB/s, and size, bytes. sm_90: the least the H200's L2 is known to deliver:
#: a ping-pong wgmma kernel (128x128x64, 8192x8192x1024 fp16) read this model's 2.28 GB of
#: tile loads in 184.5 us, 12.4 TB/s (bench/results/tune-studies-fp16-three-shapes-pingpong-
#: 3ebe9b6-h200-2026-12-03.json; 10 TB/s before, about 2.5x DRAM, which that run refutes)
L2_GBS = {90: 12400.0, 80: 5000.0}
L2_BYTES = {90: 50 << 20, 89: 96 << 20, 86: 6 << 20, 80: 40 << 20, 75: 4 << 20, 70: 6 << 20}
#: shared-memory wavefronts per float a warp's LDS reads per lane (1: no broadcast gain) [1]
LDS_WAVEFRONT_SCALE = 1.0
#: wavefronts of one 4-byte cp.async of A (a float per copy, lanes on different rows:
#: their sectors are not coalesced) [1]; the largest single gain of the calibration
CP_ASYNC_A_COST = 4.0
#: extra wavefronts of a transposed A store without padding (bank conflicts) [0]
STS_CONFLICT = 0.5
#: seconds per kernel launched, back to back in a timing loop
LAUNCH_S = 2.0e-6
#: instructions per element of C the epilogue spends beyond scaling and storing it: the
#: bias (its load, amortised over a thread's rows, and an add), each activation in FP32
#: (the erf form's tail expression 30, where erfcf took 50, and the tanh form 11, counted
#: in nvcc 13.0's sm_90 SASS of templates/macros.cu.j2's activate) and the conversion to a
#: 2-byte C. Counted, not calibrated: no recorded study has an epilogue yet.
EPILOGUE_INSTR = {"bias": 2, "relu": 1, "gelu": 30, "gelu_tanh": 11, "silu": 8,
                  "convert": 1}
#: the share of a multicast B tile's L2 reads that a cluster's blocks save (1: B leaves the
#: L2 once for the whole cluster). Ours save nothing measurable: on the exhaustive fp16
#: 4096^3 wgmma grid the best cluster kernel ran 698 TFLOP/s against 715 without one, and
#: with the full credit the model ranked every cluster kernel first (predicted 1015 TFLOP/s
#: against 810), the first kernel within 2% of the grid's best 81st in its order; with
#: none, 11th, and rho 0.77 -> 0.86 over the grid (bench/NOTES.md, "Eighteenth session").
MULTICAST_L2_CREDIT = 0.0

#: The streaming model's constants (module doc), calibrated by bench/model_rank.py
#: --calibrate-stream from the physical guesses in brackets:
#: DRAM latency under load, s: Little's law's [0.8e-6]
STREAM_LATENCY_S = 1.0e-6
#: the most one SM's loads pull from DRAM, over its share of the DRAM's rate (DRAM_GBS /
#: SMs) [1.0]: on the H200 a grid of 64 blocks of 64 columns ran at 27 GB/s an SM. The
#: tiled terms take it too (a grid of fewer blocks than SMs)
SM_DRAM_SHARE = 1.0
#: instructions issued per one counted (the mma or FMAs, the loads of B and A, 6 of loop):
#: the rest (addresses, conversions, predicates) [2]
STREAM_ISSUE_SCALE = 6.0
#: the time a stage of B's register ring beyond two adds, as a share [0] (none for the
#: shared-memory ring)
STREAM_STAGE_COST = 0.4
#: weight of split-K's partial tiles' bytes (written and read) against the DRAM rate [1]
STREAM_PARTIAL_COST = 4.0
#: seconds a split-K reduction adds besides its bytes: the last block's (its ticket, then
#: the others' partial tiles) [1e-6], the cluster's (its barrier) [0.5e-6] and a second
#: pass's (its launch) [2e-6]
STREAM_LAST_S = 4.0e-6
STREAM_CLUSTER_S = 2.0e-6
STREAM_PASS_S = 1.0e-6
#: seconds of every launch (the launch, the warps' partial tiles summed, the epilogue) [2e-6]
STREAM_FIXED_S = 2.0e-6
#: seconds stream-K's cut tiles add besides their bytes: tickets and fences [1e-6]
STREAMK_FIXUP_S = 1.0e-6

#: A K tile's instructions issued by the interior path (KernelConfig.interior: 1 unchecked,
#: 2 paired) over those of the checked loop, as read from the SASS (codegen.sass, nvcc
#: 13.0, sm_90): 0.957-0.964 unchecked, 0.928-0.938 paired on 8x8 and 16x8 micro-tiles
#: (bench/NOTES.md, "the main loop's instruction mix"). Counted, not calibrated on timings.
INTERIOR_ISSUE = {0: 1.0, 1: 0.96, 2: 0.93}

#: Prune a compiled candidate whose predicted time exceeds the best measured time by more
#: than this factor: predicted TFLOP/s x PRUNE_MARGIN < best measured TFLOP/s. The model
#: is optimistic about good kernels: on the 9 recorded fp32 studies (bench/model_rank.py,
#: bench/results/model-rank-*.json) every candidate within 2% of its study's best
#: measured at most 0.98x of its own prediction (0.77-0.98 by study), so 1.25 leaves
#: 28% of headroom over the worst of them, and would still have pruned 10-77% of each
#: study's candidates once its best was known.
PRUNE_MARGIN = 1.25

CONSTANTS = dict(SATURATING_WARPS=SATURATING_WARPS, SATURATING_FMAS=SATURATING_FMAS,
                 MEM_LATENCY_CLK=MEM_LATENCY_CLK,
                 K_TILE_OVERHEAD=K_TILE_OVERHEAD, LAUNCH_S=LAUNCH_S, PRUNE_MARGIN=PRUNE_MARGIN,
                 STREAM_LATENCY_S=STREAM_LATENCY_S, SM_DRAM_SHARE=SM_DRAM_SHARE,
                 STREAM_ISSUE_SCALE=STREAM_ISSUE_SCALE, STREAM_STAGE_COST=STREAM_STAGE_COST,
                 STREAM_PARTIAL_COST=STREAM_PARTIAL_COST, STREAM_LAST_S=STREAM_LAST_S,
                 STREAM_CLUSTER_S=STREAM_CLUSTER_S, STREAM_PASS_S=STREAM_PASS_S,
                 STREAM_FIXED_S=STREAM_FIXED_S)


def shape_reasons(config: Config, shape: tuple[int, int, int], arch: ArchLimits) -> list[str]:
    """Reasons a buildable config is pointless or unusable at this shape (rejected before
    compiling): the split-K rules every family shares, then the family's own."""
    return _shape_reasons(config, shape, arch) + family_of(config).shape_reasons(
        config, shape, arch)


@dataclasses.dataclass(frozen=True)
class Verdict:
    hopeless: bool
    reason: str
    figures: dict
    occupancy: Occupancy


def streamk_cut(c, blocks: int, k_tiles: int, sms: int, per_sm: int = 1):
    """(k-tiles of a unit, [(per_sm, units)]) of the busiest SM under stream-K where the
    tiles leave a partial wave of the grid's sms x per_sm block slots, else None: each slot
    blocks x k-tiles / slots k-tiles (up to one more), over ceil(blocks / slots) units,
    whole tiles or cut, its SM's per_sm slots side by side."""
    slots = sms * per_sm
    if not getattr(c, "streamk", 0) or blocks <= slots or blocks % slots == 0:
        return None
    units = _cdiv(blocks, slots)
    return _cdiv(blocks * k_tiles, slots) / units, [(per_sm, units)]


def bound_tflops(config: Config, shape: tuple[int, int, int],
                 arch: ArchLimits, batch: int = 1) -> tuple[float, dict]:
    """Upper bound on the TFLOP/s of `config` at `shape` (a batch of `batch` problems) on
    `arch`, and its factors."""
    m, n, k = shape
    c = config
    tile = (m * n * k) / (_cdiv(m, c.bm) * c.bm * _cdiv(n, c.bn) * c.bn * _cdiv(k, c.bk) * c.bk)
    tiles = _cdiv(m, c.bm) * _cdiv(n, c.bn) * c.split * batch
    sms = max(arch.sm_count, 1)
    wave = 1.0 if getattr(c, "streamk", 0) and tiles > sms else tiles / (sms * _cdiv(tiles, sms))
    family = family_of(c)
    issue = family.issue_efficiency(c) * family.arch_efficiency(c, arch)
    peak = family.math.peak_tflops(c.dtype, arch)
    figures = dict(peak=round(peak, 2), tile_eff=round(tile, 4), wave_eff=round(wave, 4),
                   issue_eff=round(issue, 4))
    bound = peak * tile * wave * issue
    figures["bound_tflops"] = round(bound, 2)
    return bound, figures


# ---- the predicted time -----------------------------------------------------------------
def _elem(config: Config) -> int:
    """Bytes per element of A and B as the kernel reads them from global memory: a
    family's `operand_bytes` where it declares them (pre-split 3xTF32 loads a big and a small
    tf32 copy of each: 8), else the input type's."""
    return getattr(config, "operand_bytes", None) or config.dtype.size


def out_bytes(config: Config) -> int:
    """Bytes per element of C as the kernel writes it (its `out`: 4, or 2 for fp16 /
    bf16; a family without the field writes fp32)."""
    return getattr(config, "out", DType.F32).size


def bias_bytes(config: Config) -> int:
    """Bytes per element of the bias vector: 0 without one, C's for bias="out", 4 for
    bias="f32"."""
    bias = getattr(config, "bias", "none")
    return 0 if bias == "none" else 4 if bias == "f32" else out_bytes(config)


def _epilogue_instr(config: Config) -> int:
    """EPILOGUE_INSTR's instructions per element of C for this config's epilogue."""
    extra = EPILOGUE_INSTR.get(getattr(config, "act", "none"), 0)
    if getattr(config, "bias", "none") != "none":
        extra += EPILOGUE_INSTR["bias"]
    if out_bytes(config) < 4:
        extra += EPILOGUE_INSTR["convert"]
    return extra


def tile_traffic(config: Config, shape: tuple[int, int, int], batch: int = 1) -> dict:
    """Bytes one block moves for its tile: A (BM x K slice), B (K slice x BN), C (BM x BN
    written, in C's type), the bias (its BN slice, where there is one), and the
    arithmetic intensity that follows (FLOP per byte); with the totals over all blocks
    of the `batch` problems (the L2's traffic).

    Example:
        >>> from codegen.families.simt import KernelConfig
        >>> t = tile_traffic(KernelConfig(), (4096, 4096, 4096))
        >>> t["a_bytes"], t["c_bytes"], t["intensity"]
        (2097152, 65536, 31.51)
    """
    m, n, k = shape
    c = config
    es = _elem(c)
    ks = _cdiv(_cdiv(k, c.split), c.bk) * c.bk  # the K slice a block walks, in whole tiles
    a = c.bm * ks * es
    b = ks * c.bn * es
    cb = c.bm * c.bn * out_bytes(c)
    bb = c.bn * bias_bytes(c)
    flops = 2 * c.bm * c.bn * ks
    blocks = _cdiv(m, c.bm) * _cdiv(n, c.bn) * c.split * batch
    # an A or B tile multicast to the blocks of a cluster: what leaving the L2 once for all
    # of them saves, as measured (MULTICAST_L2_CREDIT)
    shared_a = a / (1 + (max(c.a_multicast, 1) - 1) * MULTICAST_L2_CREDIT)
    shared_b = b / (1 + (max(c.b_multicast, 1) - 1) * MULTICAST_L2_CREDIT)
    return dict(a_bytes=a, b_bytes=b, c_bytes=cb, bias_bytes=bb,
                intensity=round(flops / (a + b + cb + bb), 2),
                blocks=blocks, k_slice=ks, l2_bytes=int(blocks * (shared_a + shared_b + cb + bb)))


def _dram_bytes(config: Config, shape, arch: ArchLimits, resident: int,
                batch: int = 1) -> float:
    """Tiled DRAM traffic: what each wave of resident blocks reads, or A + B once, for
    each of `batch` problems; C written once in its type, the bias read once, the split-K
    workspace (FP32) written and read."""
    m, n, k = shape
    c = config
    out = batch * m * n * out_bytes(c) + n * bias_bytes(c) + (
        2 * c.split * m * n * 4 * batch if getattr(c, "has_workspace", False)
        and not getattr(c, "streamk", 0) else 0)  # (stream-K's partial tiles stay in L2)
    return batch * _dram_reads(c, shape, arch, resident) + out


def _dram_reads(c: Config, shape, arch: ArchLimits, resident: int) -> float:
    """One problem's A and B as its tiles read them from DRAM."""
    m, n, k = shape
    es = _elem(c)
    tm, tn = _cdiv(m, c.bm), _cdiv(n, c.bn)
    once = (m * k + k * n) * es
    l2 = L2_BYTES.get(arch.cc, 40 << 20)
    if once <= l2 / 2 or tm * tn <= resident:
        return once
    # tile rows per rasterisation group: the CUDA-core and WMMA families' swizzle; wgmma's
    # group counts cluster tiles (the blocks of a cluster along M are adjacent rows)
    g = max(getattr(c, "swizzle", None) or getattr(c, "group", 1) * c.b_multicast, 1)
    p = min(resident, tm * tn)
    if p <= g * tn:
        rows, cols = min(g, tm), min(_cdiv(p, g), tn)
    else:
        rows, cols = min(tm, g * _cdiv(p, g * tn)), tn
    waves = _cdiv(tm * tn, p)
    per_wave = (rows * c.bm + cols * c.bn) * k * es
    return min(max(waves * per_wave, once), (tm * tn) * (c.bm + c.bn) * k * es)


def _simt_instructions(c) -> tuple[float, float, float, float]:
    """Per thread and K tile: instructions (compute, then global loads and shared stores),
    shared-memory wavefronts (a warp's 32-bit access is one, a 128-bit one four: 128 B a
    clock per SM); and the epilogue's instructions."""
    va, vb = c.frag_vecs
    fma = c.bk * c.rm * c.rn
    lds = c.bk * (c.rm // va + c.rn // vb)
    lds_wf = c.bk * (c.rm + c.rn) * LDS_WAVEFRONT_SCALE
    a_floats = c.bm * c.bk / c.threads
    b_vecs = c.bk * c.bn / (c.vec * c.threads)
    if c.stages >= 3:  # cp.async: one copy per float of A (transposed), per vector of B
        mem = a_floats + b_vecs
        sts_wf = CP_ASYNC_A_COST * a_floats + b_vecs * c.vec
    else:  # a vector load each, then A's floats stored one by one, B's as vectors
        mem = a_floats / c.vec + a_floats + 2 * b_vecs
        sts_wf = a_floats * (1 + (c.pad == 0) * STS_CONFLICT) + b_vecs * c.vec
    epilogue = 3 * c.rm * c.rn
    return fma + lds + K_TILE_OVERHEAD, mem, lds_wf + sts_wf, epilogue


def _interior_issue(c, shape) -> float:
    """INTERIOR_ISSUE of `c`'s interior path, over the share of the tiles of C that lie
    wholly inside (the others run the checked loop); 1 without one."""
    saved = 1.0 - INTERIOR_ISSUE[getattr(c, "interior", 0)]
    if not saved:
        return 1.0
    m, n, _ = shape
    inside = (m // c.bm) * (n // c.bn) / (_cdiv(m, c.bm) * _cdiv(n, c.bn))
    return 1.0 - saved * inside


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The predicted time of one candidate and the terms it came from."""

    seconds: float
    tflops: float
    limiter: str  # "issue", "latency", "dram" or "l2": the largest term
    terms: dict  # term -> seconds
    traffic: dict  # tile_traffic() plus dram_bytes
    blocks_per_sm: int
    waves: int

    def to_dict(self) -> dict:
        return dict(predicted_s=self.seconds, predicted_tflops=round(self.tflops, 2),
                    predicted_limiter=self.limiter,
                    terms={k: float(f"{v:.4g}") for k, v in self.terms.items()},
                    traffic=self.traffic, waves=self.waves)


def _clock_hz(arch: ArchLimits) -> float:
    return max(arch.clock_mhz, 1) * 1e6


def _dram_bw(arch: ArchLimits) -> float:
    """Bytes a second from DRAM (DRAM_GBS, else the vendor's figure)."""
    return DRAM_GBS.get(arch.cc, float(arch.mem_gbs)) * 1e9


def _l2_bw(arch: ArchLimits) -> float:
    """Bytes a second through the L2 (L2_GBS, else 2.5x the DRAM's vendor figure)."""
    return L2_GBS.get(arch.cc, 2.5 * arch.mem_gbs) * 1e9


def cluster_size(c) -> int:
    """Blocks of one thread-block cluster of `c` (1 without one): the split of a split-K
    summed across a cluster, or the wgmma family's cluster."""
    size = getattr(c, "cluster", 1)
    if isinstance(size, bool):
        return c.split if size else 1
    return max(int(size or 1), 1)


def busiest_sm(blocks: int, size: int, r: int, arch: ArchLimits) -> int:
    """The blocks the busiest SM runs, `r` at a time: the grid spread over the SMs; in
    clusters of `size`, whole waves of the clusters that fit at once
    (ArchLimits.cluster_slots: a GPC of SMs not divisible by the size leaves some idle),
    then the rest spread.

    Example (an H100 SXM, whose table is sm_90's: 15 clusters of 8 fit at one block an SM,
    30 of 4):
        >>> from codegen.arch import parse_arch
        >>> a = parse_arch("sm_90")
        >>> busiest_sm(128, 1, 1, a), busiest_sm(128, 8, 1, a), busiest_sm(120, 8, 1, a)
        (1, 2, 1)
    """
    sms = max(arch.sm_count, 1)
    per_sm = _cdiv(blocks, sms)
    if size <= 1:
        return per_sm
    slots = max(arch.cluster_slots(size, r), 1)
    waves = _cdiv(_cdiv(blocks, size), slots)
    if waves <= 1:
        return per_sm
    rest = blocks - (waves - 1) * slots * size
    return max(per_sm, (waves - 1) * r + _cdiv(rest, sms))


def _predict_stream(c, shape: tuple[int, int, int], arch: ArchLimits, occ: Occupancy,
                    batch: int = 1) -> Prediction:
    """The streaming model's time of a skinny kernel (module doc)."""
    m, n, k = shape
    sms = max(arch.sm_count, 1)
    hz = _clock_hz(arch)
    tiles = _cdiv(m, c.mt) * _cdiv(n, c.bn)
    blocks = tiles * c.split * batch
    ks = _cdiv(k, c.split)
    es = _elem(c)
    block_b = c.bn * ks * es  # the B panel slice one block streams
    r = max(occ.blocks_per_sm, 1)
    per_sm = busiest_sm(blocks, cluster_size(c), r, arch)
    full, rem = divmod(per_sm, r)
    chunks = [(j, count) for j, count in ((r, full), (rem, 1)) if j and count]
    dram_bw = _dram_bw(arch)
    sm_bw = SM_DRAM_SHARE * dram_bw / sms
    share = dram_bw / min(blocks, sms)  # the DRAM's rate over the SMs with work
    flight = c.warps * c.b_in_flight  # a block's bytes of B in flight
    stream_s = 0.0
    for j, count in chunks:
        rate = min(sm_bw, share, j * flight / STREAM_LATENCY_S)
        stream_s += count * (STREAM_LATENCY_S + j * block_b / rate)
    # a warp's instructions per K chunk: the math (mma m16n8k16 twice a 32-deep chunk, or
    # MT x VEC FMAs per n8 block and lane, and the widening of B), its loads, 6 of loop
    nb = c.bnw // 8
    if c.math == "mma":
        counted = (c.mt // 16) * nb * 2 + nb + c.a_loads + 6
    else:
        counted = c.mt * nb * c.vec + nb * c.vec + 2 * c.a_loads + 6
    steps = _cdiv(ks, c.kc * c.wk)
    issue_s = STREAM_ISSUE_SCALE * per_sm * c.warps * steps * counted / (4 * hz)
    a_l2 = blocks * c.mt * ks * es  # every panel's block reads its rows of A from the L2
    l2_s = (a_l2 + batch * n * k * es) / _l2_bw(arch)
    terms = dict(stream=stream_s, issue=issue_s, l2=l2_s)
    limiter = max(terms, key=terms.get)
    stage_cost = 0.0 if getattr(c, "is_async", False) else STREAM_STAGE_COST
    body = max(terms.values()) * (1 + stage_cost * max(c.stages - 2, 0))
    reduce_s = 0.0
    if c.split > 1:
        partial = 2 * c.split * m * n * 4 * batch  # FP32 partial tiles, written and read
        fixed = {"last": STREAM_LAST_S, "cluster": STREAM_CLUSTER_S, "pass": STREAM_PASS_S}
        reduce_s = fixed[c.reduce] + STREAM_PARTIAL_COST * partial / dram_bw
        if c.reduce == "cluster":  # a block's (split-1) partial tiles through DSMEM
            reduce_s += (STREAM_PARTIAL_COST * (c.split - 1) * c.mt * c.bn
                         / max(c.threads, 1) * 8 / hz * per_sm)
    seconds = body + reduce_s + STREAM_FIXED_S
    terms.update(reduce=reduce_s, fixed=STREAM_FIXED_S)
    dram = batch * (n * k * es + m * n * out_bytes(c)) + n * bias_bytes(c)
    traffic = dict(tile_traffic(c, shape, batch), dram_bytes=int(dram))
    return Prediction(seconds, 2.0 * m * n * k * batch / seconds / 1e12, limiter, terms,
                      traffic, r, sum(count for _, count in chunks))


def predict(config: Config, shape: tuple[int, int, int], arch: ArchLimits,
            occ: Occupancy, batch: int = 1) -> Prediction:
    """Predicted time of `config` at `shape` (a batch of `batch` problems) on `arch` with
    occupancy `occ` (see the module doc for the terms). Use
    :func:`predict_before_compile` without resources."""
    m, n, k = shape
    c = config
    spec = family_of(c)
    if spec.streams_b:
        return _predict_stream(c, shape, arch, occ, batch)
    sms = max(arch.sm_count, 1)
    hz = _clock_hz(arch)
    traffic = tile_traffic(c, shape, batch)
    blocks, ks = traffic["blocks"], traffic["k_slice"]
    r = max(occ.blocks_per_sm, 1)
    warps = max(occ.warps_per_block, 1)
    k_tiles = max(ks // c.bk, 1)
    per_sm = busiest_sm(blocks, cluster_size(c), r, arch)  # wave quantisation
    full, rem = divmod(per_sm, r)
    # its waves: `full` of r blocks, then one of rem (counted, not listed: a shape of
    # 2^31-sized sides has some 10^16 waves)
    chunks = [(j, count) for j, count in ((r, full), (rem, 1)) if j and count]
    cut = streamk_cut(c, blocks, k_tiles, sms, r)
    if cut:  # stream-K: the busiest SM's k-tiles evened out, over its units
        k_tiles, chunks = cut

    # a family slower on this arch than its instructions' own rate (WMMA's mma.sync on
    # Hopper, whose tensor peak is wgmma's) has its whole time scaled by that share: its
    # own candidates keep their order, and it takes its place against the others
    arch_scale = max(spec.arch_efficiency(c, arch), 1e-3)
    serial_clk = 0.0  # clocks per tile of an epilogue the math waits for (one block per SM)
    if spec.micro_tile:
        compute, mem, wavefronts, epilogue = _simt_instructions(c)
        # warp instructions per K tile of one block
        step_instr = warps * (compute + mem) * _interior_issue(c, shape)
        step_smem = warps * wavefronts  # shared-memory clocks per K tile of one block
        epi_instr = warps * (epilogue + _epilogue_instr(c) * c.rm * c.rn)
    else:  # tensor cores: a block's FLOP at the SM's tensor rate, over the issue efficiency
        peak_clk = spec.math.peak_tflops(c.dtype, arch) * 1e12 / hz / sms  # FLOP/clk/SM
        eff = max(spec.issue_efficiency(c), 1e-3)
        step_instr = 4 * (2 * c.bm * c.bn * c.bk / peak_clk) / eff  # in issue slots of 4/clk
        serial_clk = spec.serial_epilogue_clk(c, _epilogue_instr(c), MEM_LATENCY_CLK)
        epi_instr = 0.0 if serial_clk else \
            warps * (c.bm * c.bn / max(c.threads, 1)) * (2 + _epilogue_instr(c))
        step_smem = 0.0
    stages = getattr(c, "stages", 2)

    issue_clk = lat_clk = 0.0
    saturating = SATURATING_WARPS
    if spec.micro_tile and SATURATING_FMAS:  # more independent FFMAs a warp: fewer warps
        saturating *= min(1.0, SATURATING_FMAS / (c.rm * c.rn))
    for j, count in chunks:
        rate = 4.0 * min(1.0, j * warps / saturating)  # warp instructions per clock
        step_issue = max(j * step_instr / rate, j * step_smem)
        if stages >= 2:
            step_lat = MEM_LATENCY_CLK / (stages - 1)
        else:
            step_lat = MEM_LATENCY_CLK + step_instr / min(warps, 4)
        step = max(step_issue, step_lat)
        issue_clk += count * (k_tiles * step_issue + j * epi_instr / rate)
        lat_clk += count * (k_tiles * step + j * epi_instr / rate)
    issue_s, latency_s = issue_clk / hz, lat_clk / hz

    dram = _dram_bytes(c, shape, arch, sms * r, batch)
    # at the DRAM's rate; a grid of fewer blocks than SMs at what its blocks pull, each at
    # one SM's rate (the idle SMs' share is not made up by the others)
    dram_bw = _dram_bw(arch)
    dram_s = dram / dram_bw / min(1.0, SM_DRAM_SHARE * blocks / sms)
    l2_s = traffic["l2_bytes"] / _l2_bw(arch)
    launches = 2 if getattr(c, "reduce_pass", False) else 1
    fixed = 0.0
    if getattr(c, "pre_pass", False):  # launched first for each problem: its copies
        launches += batch
        fixed += batch * c.prep_bytes(m, n, k) / dram_bw
    fixed += LAUNCH_S * launches
    if getattr(c, "reduce_pass", False):  # the second pass reads every slice, writes C
        fixed += (c.split * 4 + out_bytes(c)) * m * n * batch / dram_bw
    if cut:  # two partial tiles written and two read at the SM's share of the L2
        fixed += 4 * c.bm * c.bn * 4 / (_l2_bw(arch) / sms) + STREAMK_FIXUP_S
    if getattr(c, "cluster", False):  # partial tiles summed through distributed shared memory
        fixed += (c.split - 1) * c.bm * c.bn / max(c.threads, 1) * 8 / hz
    # an epilogue the math waits for, on the busiest SM's waves of one block (where two or
    # more share an SM, one's epilogue runs beside the others' math)
    serial_s = sum(count for j, count in chunks if j == 1) * serial_clk / hz
    terms = dict(issue=issue_s, latency=latency_s, dram=dram_s, l2=l2_s)
    limiter = max(("latency", "dram", "l2"), key=lambda t: terms[t])
    if limiter == "latency" and latency_s <= issue_s * 1.0001:
        limiter = "issue"
    seconds = (max(latency_s, dram_s, l2_s) + serial_s) / arch_scale + fixed
    terms["epilogue"] = serial_s
    terms["fixed"] = fixed
    flops = 2.0 * m * n * k * batch
    traffic = dict(traffic, dram_bytes=int(dram))
    return Prediction(seconds, flops / seconds / 1e12, limiter, terms, traffic, r,
                      sum(count for _, count in chunks))


def estimate_registers(config: Config) -> int:
    """Registers per thread before compiling: accumulators, fragments, the register
    prefetch of a two-stage pipeline and about 40 of addresses and loop state (SIMT);
    ptxas's own figure replaces it once compiled."""
    c = config
    if family_of(c).micro_tile:
        regs = c.tile_regs + 40
        if c.stages == 2:
            regs += (c.bm * c.bk + c.bk * c.bn) // max(c.threads, 1)
        return min(regs, 255)
    # a family's own estimate where it has one (decode's, fitted to ptxas as an upper bound)
    return min(getattr(c, "regs_estimate", 128), 255)


def register_cap(config: Config, arch: ArchLimits) -> int:
    """The most registers per thread ptxas may give a block of this size (and its
    __launch_bounds__ minimum of blocks): above it, the kernel spills."""
    threads = max(config.threads, 1) * max(getattr(config, "minb", 1), 1)
    return min(arch.max_regs_per_thread, (arch.regs_per_block // threads) // 8 * 8)


def likely_spills(config: Config, arch: ArchLimits) -> bool:
    """Before compiling: does the least a thread must hold (SIMT: its accumulators and
    fragments and 16 of addresses) exceed :func:`register_cap`? (ptxas squeezes the rest
    under the cap: the 512-thread 128x256 tiles estimated at 132 compile to 126-128.)"""
    if family_of(config).micro_tile:
        return config.tile_regs + 16 > register_cap(config, arch)
    return False


def predict_before_compile(config: Config, shape, arch: ArchLimits,
                           batch: int = 1) -> Prediction:
    """:func:`predict` with the occupancy of estimated registers (:func:`estimate_registers`,
    at most :func:`register_cap`)."""
    regs = min(estimate_registers(config), register_cap(config, arch))
    occ = occupancy(config.threads, regs, config.smem_bytes, arch)
    return predict(config, shape, arch, occ, batch)


# ---- rank correlation ---------------------------------------------------------------------
def _ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Iterable[float], ys: Iterable[float]) -> float | None:
    """Spearman's rank correlation of two paired samples (ties at their mean rank): the
    Pearson correlation of the ranks. None with fewer than 3 pairs or a constant sample.

    Example:
        >>> spearman([1, 2, 3, 4], [10, 20, 30, 40])
        1.0
        >>> spearman([1, 2, 3, 4], [4, 3, 2, 1])
        -1.0
    """
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} values against {len(ys)}")
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


# ---- the verdict --------------------------------------------------------------------------
def judge(
    config: Config,
    resources: Resources,
    shape: tuple[int, int, int],
    arch: ArchLimits,
    best_tflops: float | None = None,
    margin: float | None = None,
    batch: int = 1,
) -> Verdict:
    """Is this compiled candidate worth timing (at `shape`, a batch of `batch` problems)?
    The reason and figures are stored on the trial.

    With `margin`, a candidate is also hopeless when its predicted time is more than
    `margin` times the time of `best_tflops` (the best measured so far)."""
    occ = occupancy(config.threads, resources.registers, resources.smem, arch)
    bound, figures = bound_tflops(config, shape, arch, batch)
    figures.update(registers=resources.registers, smem=resources.smem,
                   spill_bytes=resources.spill_bytes, **occ.to_dict())
    pred = None
    if occ.blocks_per_sm:
        pred = predict(config, shape, arch, occ, batch)
        figures.update(predicted_tflops=round(pred.tflops, 2),
                       predicted_limiter=pred.limiter)
    if resources.spill_bytes:
        return Verdict(True, f"spills {resources.spill_stores} B stored, "
                             f"{resources.spill_loads} B loaded", figures, occ)
    if occ.blocks_per_sm == 0:
        return Verdict(True, f"no block fits on an SM (limited by {occ.limiter})", figures, occ)
    if best_tflops is not None and bound < best_tflops:
        return Verdict(True, f"bound {bound:.1f} < best {best_tflops:.1f} TFLOP/s", figures, occ)
    if (margin is not None and best_tflops is not None and pred is not None
            and pred.tflops * margin < best_tflops):
        return Verdict(True, f"predicted {pred.tflops:.1f} TFLOP/s, more than {margin:g}x "
                             f"slower than the best measured {best_tflops:.1f}", figures, occ)
    return Verdict(False, "", figures, occ)
