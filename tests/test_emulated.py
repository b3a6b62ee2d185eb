"""The CUDA-core family's kernels run on the CPU (tests/_emulation.py: each thread a
std::thread, each __syncthreads() a barrier, each cp.async landing at the wait that retires
its group, AddressSanitizer and UBSan on, shared memory NaN at every block's start): the
main loop's paths (the checked loop; the interior path, one K tile a turn and two;
fragments loaded a step at a time, double-buffered, carried across tiles; a single
buffer, the register double buffer, cp.async rings of 3 and 4 stages), the FMA orders,
split-K summed by a reduce pass, by a tile's last slice and across a cluster (its blocks
run together), stream-K (runs of k-tiles cut across tiles, summed by each tile's last
block), every layout, 2-byte inputs
and C, the fused epilogue;
on shapes that run the interior path whole, cut it at every edge and in K, and leave it
for the checked loop at misaligned rows. The WMMA family's too, its fragments, loads,
stores and mma_sync emulated on the warps (tests/_emulation.py's _WMMA): fp16, bf16 and
tf32 inputs, every layout, a single buffer and cp.async rings of 2-4 stages, 2-byte C
and the epilogue. Against float64 of the same inputs, C poisoned with NaN, its padding
checked untouched. What the emulation cannot check (timing, the memory model, the real
instructions' rounding) is tests/test_gpu_simt_mainloop.py's and test_gpu_wmma.py's."""

from __future__ import annotations


import numpy as np
import pytest
from _emulation import build, build_all, emulate, emulation_source

from codegen import DType, KernelConfig, check
from codegen.config import Layout
from codegen.families.wmma import WmmaConfig

#: an 8x16 micro-tile (the fp32 winners') in a 64x128 block of 64 threads, and a 4x4 one
BIG = KernelConfig(bm=64, bn=128, bk=8, rm=8, rn=16, wt=4, pad=4, swizzle=1)
SMALL = KernelConfig(bm=32, bn=32, bk=8, rm=4, rn=4, wt=4, pad=4, swizzle=1)

EMULATED = [
    # fragments carried across tiles, the 2x2 FMA order: one K tile a turn, then two
    KernelConfig(**{**BIG.__dict__, "interior": 1, "frags": 3, "zigzag": 2, "ptxas": 1}),
    KernelConfig(**{**BIG.__dict__, "interior": 2, "frags": 3, "zigzag": 2,
                    "layout": Layout.TT}),
    KernelConfig(**{**SMALL.__dict__, "interior": 2, "frags": 3, "layout": Layout.NT,
                    "dtype": DType.BF16, "out": DType.BF16, "bias": "f32", "act": "gelu"}),
    # double-buffered fragments, the serpentine order; single-step fragments, the checked
    # loop alone, an fp16 C with its own bias
    KernelConfig(**{**BIG.__dict__, "interior": 1, "frags": 2, "zigzag": 1,
                    "layout": Layout.TN}),
    KernelConfig(**{**SMALL.__dict__, "dtype": DType.F16, "out": DType.F16, "bias": "out",
                    "act": "silu"}),
    # the cp.async rings (A transposed on the way: a float a copy), one stage a single
    # buffer; split-K summed by a reduce pass and by each tile's last slice
    KernelConfig(**{**BIG.__dict__, "stages": 3, "zigzag": 2}),
    KernelConfig(**{**SMALL.__dict__, "stages": 4, "layout": Layout.TN, "act": "relu"}),
    KernelConfig(**{**SMALL.__dict__, "stages": 1, "interior": 1, "layout": Layout.NT}),
    KernelConfig(**{**SMALL.__dict__, "split": 4, "bias": "out", "act": "gelu_tanh"}),
    KernelConfig(**{**SMALL.__dict__, "split": 2, "reduce": "last", "layout": Layout.TT,
                    "dtype": DType.BF16, "out": DType.F32}),
    # ... and across a cluster of the slices, summed through distributed shared memory
    KernelConfig(**{**SMALL.__dict__, "split": 4, "reduce": "cluster", "layout": Layout.NT,
                    "out": DType.BF16, "bias": "f32", "act": "silu"}),
    # stream-K on 3 blocks (the harness's slots): whole tiles, then runs of k-tiles cut
    # across tiles, summed by each cut tile's last block; on the interior path, and on a
    # cp.async ring with 2-byte C and the epilogue
    KernelConfig(**{**BIG.__dict__, "interior": 1, "streamk": 1, "layout": Layout.TN}),
    KernelConfig(**{**SMALL.__dict__, "stages": 3, "streamk": 1, "layout": Layout.NT,
                    "out": DType.F16, "bias": "f32", "act": "gelu"}),
]

#: the WMMA family: 128-thread blocks of 16x16 or 32x16 warp tiles
WMMA = [
    WmmaConfig(bm=32, bn=32, bk=32, wm=16, wn=16, stages=2, swizzle=1),
    WmmaConfig(bm=64, bn=32, bk=32, wm=32, wn=16, stages=3, swizzle=2, dtype=DType.BF16,
               layout=Layout.NT, out=DType.BF16, bias="f32", act="gelu"),
    WmmaConfig(bm=32, bn=32, bk=16, wm=16, wn=16, stages=2, swizzle=1, dtype=DType.TF32,
               skew=4, vec=4, layout=Layout.TN, act="relu"),
    WmmaConfig(bm=32, bn=64, bk=32, wm=16, wn=32, stages=1, swizzle=1, layout=Layout.TT,
               out=DType.F16, bias="out", act="silu"),
    WmmaConfig(bm=32, bn=32, bk=64, wm=16, wn=16, stages=4, swizzle=1, dtype=DType.BF16,
               bias="out", act="gelu_tanh"),
]

#: (M, N, K): the interior path whole; interior blocks beside edge blocks; K cut (the
#: interior path's whole tiles, then the checked loop); K under two tiles; one element;
#: a K of many tiles in a row of edge blocks
SHAPES = [(64, 128, 64), (130, 260, 72), (128, 256, 77), (64, 128, 12), (1, 1, 1),
          (33, 130, 136)]
#: the emulated products are exact in float64 but for FP32 accumulation, then C's rounding
GATE = {"f32": 1e-6, "f16": 1e-6 + 2.0 ** -11, "bf16": 1e-6 + 2.0 ** -8}
#: ... and tf32's rounding of the inputs (10 mantissa bits), against the inputs as given
TF32_GATE = 1e-3


def _gate(cfg) -> float:
    return GATE[cfg.out.short] + (TF32_GATE if cfg.dtype is DType.TF32 else 0.0)


def _aligned(cfg, shape) -> tuple:
    """Padding that leaves every stored row of A and B a whole number of vectors (8
    elements: so the interior path runs where a block's tile lies inside, and 2-byte
    tiles move 16 bytes a copy), and C's rows 2 elements apart."""
    m, n, k = shape
    a_row = m if cfg.layout in (Layout.TN, Layout.TT) else k
    b_row = k if cfg.layout in (Layout.NT, Layout.TT) else n
    return (8 + -a_row % 8, 8 + -b_row % 8, 2)


def test_the_emulated_configs_are_valid_and_cover_the_main_loop():
    assert all(not check(c, "sm_90") for c in EMULATED), [check(c, "sm_90") for c in EMULATED]
    assert {c.layout for c in EMULATED} == set(Layout)
    assert {c.frags for c in EMULATED} == {1, 2, 3} and {c.interior for c in EMULATED} == {
        0, 1, 2} and {c.zigzag for c in EMULATED} == {0, 1, 2}
    assert {c.stages for c in EMULATED} == {1, 2, 3, 4}
    assert {(c.split > 1, c.reduce) for c in EMULATED} == {(False, "pass"), (True, "pass"),
                                                           (True, "last"), (True, "cluster")}
    assert {c.streamk for c in EMULATED} == {0, 1}
    assert {c.dtype for c in EMULATED} == {c.out for c in EMULATED} == {
        DType.F32, DType.F16, DType.BF16}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    where = tmp_path_factory.mktemp("simt-emulated")
    return where, build_all(EMULATED + WMMA, where)


def test_the_emulated_wmma_configs_are_valid_and_cover_the_family():
    assert all(not check(c, "sm_90") for c in WMMA), [check(c, "sm_90") for c in WMMA]
    assert {c.layout for c in WMMA} == set(Layout)
    assert {c.dtype for c in WMMA} == {DType.F16, DType.BF16, DType.TF32}
    assert {c.out for c in WMMA} == {DType.F32, DType.F16, DType.BF16}
    assert {c.stages for c in WMMA} == {1, 2, 3, 4}


@pytest.mark.parametrize("cfg", EMULATED + WMMA, ids=lambda c: c.name)
def test_the_kernel_emulated_on_the_cpu(emulated, cfg):
    where, exes = emulated
    gate = _gate(cfg)
    for seed, shape in enumerate(SHAPES):
        err, untouched = emulate(exes[cfg], cfg, shape, where, pads=_aligned(cfg, shape),
                                 seed=seed)
        assert err <= gate and untouched, (shape, err)
    # rows one element past a vector: the checked loop everywhere; alpha, beta, a batch
    # of 2 with B shared
    err, untouched = emulate(exes[cfg], cfg, (70, 140, 75), where, batch=2, alpha=0.5,
                             beta=-2.0, pads=(1, 1, 3), broadcast_b=True, seed=9)
    assert err <= gate and untouched, err


def test_the_emulation_catches_a_handoff_without_its_barrier(emulated, tmp_path):
    """The emulation is a test that can fail: the carried fragments' handoff without its
    barrier reads the next tile's first fragments before every thread has stored them
    (shared memory starts as NaN)."""

    cfg = EMULATED[0]
    src = emulation_source(cfg)
    good = "compute_carried(kt & 1, [&] { store_tiles((kt + 1) & 1); __syncthreads(); });"
    assert good in src
    racy = build(cfg, tmp_path, src.replace(
        good, "compute_carried(kt & 1, [&] { store_tiles((kt + 1) & 1); });"), "racy")
    errs = [emulate(racy, cfg, (64, 128, 64), tmp_path,
                    pads=_aligned(cfg, (64, 128, 64)), seed=s)[0] for s in range(3)]
    assert not all(e <= GATE["f32"] for e in errs), errs


@pytest.mark.parametrize("family", ["simt", "wmma"])
def test_the_emulation_catches_a_ring_read_before_it_lands(emulated, tmp_path, family):
    """The cp.async ring's wait one group short: a stage is read before its copies have
    landed (the emulation lands them at the wait that retires their group)."""
    cfg = next(c for c in EMULATED + WMMA if c.stages == 3 and c.family.value == family)
    src = emulation_source(cfg)
    good = "cp_async_wait<STAGES - 2>();"
    assert good in src
    early = build(cfg, tmp_path, src.replace(good, "cp_async_wait<STAGES - 1>();"), "early")
    err, _ = emulate(early, cfg, (64, 128, 64), tmp_path,
                     pads=_aligned(cfg, (64, 128, 64)))
    assert not err <= _gate(cfg), err


#: (M tiles, N tiles, K, slots), edges cut in M and N: every tile in the stream-K run (8
#: tiles on 5 blocks), whole waves then a run cut across tiles (24 on 5: 15 whole, 9 in the
#: run), K of one tile (no tile is cut), and a deep K cut into many units (one tile on 3)
STREAMK_RUNS = [(2, 4, 72, 5), (4, 6, 77, 5), (2, 5, 8, 3), (1, 1, 400, 3)]


def _sk_shape(cfg, tiles_m, tiles_n, k):
    return tiles_m * cfg.bm - 3, tiles_n * cfg.bn - 5, k


@pytest.mark.parametrize("cfg", [c for c in EMULATED if c.streamk], ids=lambda c: c.name)
def test_stream_k_sums_the_cut_tiles_the_same_way_whatever_ends_last(cfg, tmp_path):
    """Stream-K on several grids gives the product with beta on (a tile stored twice
    would fold C in twice), and the same bits whichever block of a cut tile ends last:
    its partial tiles are summed in k order (the blocks run in three shuffled orders)."""
    exes = {}
    for tiles_m, tiles_n, k, slots in STREAMK_RUNS:
        shape = _sk_shape(cfg, tiles_m, tiles_n, k)
        exe = exes.get(slots) or exes.setdefault(slots, build(cfg, tmp_path,
                                                              name=f"sk{slots}", slots=slots))
        outs = []
        for order in range(3):
            err, untouched = emulate(exe, cfg, shape, tmp_path, beta=0.5, seed=4,
                                     order=order, raw=outs)
            assert err <= _gate(cfg) and untouched, (shape, slots, order, err)
        assert all(np.array_equal(o, outs[0], equal_nan=True) for o in outs), (shape, slots)


def test_the_emulation_catches_a_cut_tile_stored_by_a_block_that_is_not_its_last(tmp_path):
    """The emulation can fail here too: a block storing its cut tile without holding the
    last ticket stores a sum that lacks (or is NaN for) the parts still to come, and with
    beta on, the tile's last block then folds that C in."""
    cfg = next(c for c in EMULATED if c.streamk)
    src = emulation_source(cfg, slots=5)
    good = "            if (!*is_last)\n                continue;\n"
    assert good in src
    eager = build(cfg, tmp_path, src.replace(good, ""), "eager")
    errs = [emulate(eager, cfg, _sk_shape(cfg, 4, 6, 77), tmp_path, beta=0.5, seed=4,
                    order=order)[0] for order in range(3)]
    assert not all(e <= _gate(cfg) for e in errs), errs
