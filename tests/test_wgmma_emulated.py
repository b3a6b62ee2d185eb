"""The wgmma family's kernels run on the CPU (tests/_wgmma_emulation.py: TMA's loads and
stores with their tensor maps and swizzles, mbarriers, wgmma through its descriptors and
register fragments, named and cluster barriers, multicast, stmatrix; each thread a
std::thread, AddressSanitizer and UBSan on), launched as the family's runner launches
them (its grids, clusters, tensor maps, pre-pass and split-K workspace): every layout,
fp16, bf16, tf32 (converted in the loop, a pre-pass, TMA's rounding, one operand through
registers) and 3xTF32 (in the loop, pre-split), the register, TMA-store and stmatrix
epilogues, ping-pong consumers, clusters along M and N, split-K, batches with a shared B,
persistent blocks walking several tiles each, stream-K. Each config runs twice: TMA's loads landing
as late as the ISA allows (when waited for) and as early (when issued). Against float64 of
the same inputs, C poisoned with NaN, its padding checked untouched. What the emulation
cannot check (timing, the memory model, the real instructions' rounding) is
tests/test_gpu_wgmma.py's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _wgmma_emulation import build, build_all, emulation_source, kernels_of, run

from codegen.config import DType, Layout
from codegen.families.wgmma import DEFAULT_WGMMA, check_wgmma

F16, BF16, TF32, F32 = DType.F16, DType.BF16, DType.TF32, DType.F32
#: a 128 x 128 tile of two consumers, a 3-stage ring: the others are its variations
BASE = dataclasses.replace(DEFAULT_WGMMA, bn=128, stages=3)


def _v(**kw):
    return dataclasses.replace(BASE, **kw)


def _tf32(**kw):
    return _v(dtype=TF32, bk=32, **kw)


EMULATED = [
    BASE,
    DEFAULT_WGMMA,
    _v(dtype=BF16, layout=Layout.NT, out=BF16, bias="out", act="gelu"),  # x @ W.t() + b
    _v(layout=Layout.TN, out=F16, store=1),
    _v(layout=Layout.TT, out=F16, store=2, bias="f32", act="silu"),
    _v(pingpong=1, out=F16, bias="out", act="relu"),
    _v(layout=Layout.NT, cluster=2, pingpong=1),
    _v(dtype=BF16, layout=Layout.TN, cluster=2, cluster_n=1, out=BF16),
    _v(bm=64, consumers=1, stages=4, split=2, layout=Layout.NT, out=F16),
    _v(bm=256, bn=96, layout=Layout.NT, out=F16, bias="out", act="gelu_tanh"),
    _tf32(),                                                     # converted in the loop
    _tf32(prep=1, layout=Layout.TN),                             # the pre-pass
    _tf32(prep=2, act="relu"),                                   # TMA's rounding
    _tf32(prep=3, rs_pairs=1),                                   # NN through registers: C^T
    _tf32(prep=3, layout=Layout.TT, cluster=2, out=BF16),
    _tf32(prep=3, rs_pairs=1, layout=Layout.TN),
    _v(dtype=F32, terms=3, bk=32, bn=64, stages=2),              # 3xTF32 in the loop
    _v(dtype=F32, terms=3, bk=32, prep=1, layout=Layout.NT),     # 3xTF32 pre-split
    _v(streamk=1, layout=Layout.NT, out=F16, store=1),           # stream-K, TMA stores
    _v(streamk=1, bm=64, consumers=1, dtype=BF16, out=BF16, bias="out", act="gelu"),
]

#: the emulated products are exact in float64 but for FP32 accumulation, then C's rounding
GATE = {"f32": 1e-6, "f16": 1e-6 + 2.0 ** -11, "bf16": 1e-6 + 2.0 ** -8}
#: tf32 against its inputs rounded to tf32 (ties away; TMA's maps round ties to even)
TF32_GATE = 1e-5


def _gate(cfg) -> float:
    return GATE[cfg.out.short] + (TF32_GATE if cfg.dtype is TF32 else 0.0)


def _n(cfg, n: int) -> int:
    """n rounded up to whole 16 bytes of C where the TMA store writes it."""
    step = 16 // cfg.out.size if cfg.store else 1
    return -(-n // step) * step


def test_the_emulated_configs_are_valid_and_cover_the_family():
    assert all(not check_wgmma(c, "sm_90") for c in EMULATED), [
        (c.name, check_wgmma(c, "sm_90")) for c in EMULATED if check_wgmma(c, "sm_90")]
    assert {c.layout for c in EMULATED} == set(Layout)
    assert {c.dtype for c in EMULATED} == {F16, BF16, TF32, F32}
    assert {c.out for c in EMULATED} == {F32, F16, BF16}
    assert {c.store for c in EMULATED} == {0, 1, 2}
    assert {c.prep for c in EMULATED if c.dtype is TF32} == {0, 1, 2, 3}
    assert {(c.terms, c.prep) for c in EMULATED if c.dtype is F32} == {(3, 0), (3, 1)}
    assert {c.rs_pairs for c in EMULATED if c.prep == 3} == {0, 1}
    assert {(c.cluster, c.cluster_n) for c in EMULATED} == {(1, 0), (2, 0), (2, 1)}
    assert {c.pingpong for c in EMULATED} == {0, 1} and {c.split for c in EMULATED} == {1, 2}
    assert {c.wm for c in EMULATED} == {64, 128} and {c.streamk for c in EMULATED} == {0, 1}


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    where = tmp_path_factory.mktemp("wgmma-emulated")
    return where, build_all(EMULATED, where)


@pytest.mark.parametrize("cfg", EMULATED, ids=lambda c: c.name)
def test_the_wgmma_kernel_emulated_on_the_cpu(emulated, cfg):
    """Edges in M, N and K (K not a whole number of k-tiles), three SMs (the persistent
    blocks walk several tiles, their rings wrapping); then a batch of 2 sharing B, alpha,
    beta, padded operands, TMA's loads landing as they are issued."""
    where, exes = emulated
    gate = _gate(cfg)
    err, untouched = run(exes[cfg], cfg, (200, _n(cfg, 300), 150), where, seed=0)
    assert err <= gate and untouched, err
    err, untouched = run(exes[cfg], cfg, (130, _n(cfg, 260), 200), where, batch=2,
                         alpha=0.5, beta=-2.0, shared_b=True, pads=(1, 2, 1), sms=2, seed=1,
                         land="eager")
    assert err <= gate and untouched, err


@pytest.mark.parametrize("terms", [1, 3])
def test_the_pre_pass_takes_operands_tma_cannot_describe(emulated, terms):
    """The pre-pass reads A and B as stored, so its kernels take what TMA refuses: both
    operands one element past a 16-byte boundary, odd leading dimensions and batch
    strides (a slice of a larger fp32 tensor, as torch hands it over)."""
    where, exes = emulated
    cfg = next(c for c in EMULATED if c.pre_pass and c.terms == terms)
    for seed, batch in enumerate((1, 2)):
        err, untouched = run(exes[cfg], cfg, (77, 150, 99), where, batch=batch, seed=seed,
                             unaligned=True, land=("lazy", "eager")[seed])
        assert err <= _gate(cfg) and untouched, err


#: (M, N, K, SMs, batch) that share the tiles out differently: every tile stream-K's (fewer
#: than two waves), whole waves then a wave and the remainder, a batch, one k-tile a tile,
#: a block's run inside one tile (a tile cut three ways)
STREAMK_RUNS = [(200, 296, 150, 4, 1), (520, 264, 600, 4, 1), (300, 200, 64, 5, 2),
                (130, 136, 8, 3, 1), (64, 64, 1000, 7, 1)]


@pytest.mark.parametrize("cfg", [c for c in EMULATED if c.streamk], ids=lambda c: c.name)
def test_stream_k_shares_the_tiles_out_and_sums_them_the_same_way_every_time(emulated, cfg):
    """Every way the grid can share the tiles out gives the product; and the cut tiles are
    summed in k order, so the bits of C do not depend on which block finishes last (the
    blocks' order shuffled, TMA's loads landing early or late)."""
    where, exes = emulated
    for m, n, k, sms, batch in STREAMK_RUNS:
        shape, outs = (m, _n(cfg, n), k), []
        for order, land in ((0, "lazy"), (1, "eager")):
            err, untouched = run(exes[cfg], cfg, shape, where, batch=batch, beta=0.5, sms=sms,
                                 seed=3, order=order, land=land, raw=outs)
            assert err <= _gate(cfg) and untouched, (shape, sms, err)
        assert all(np.array_equal(o, outs[0], equal_nan=o.dtype.kind == "f") for o in outs), shape


def _sabotaged(cfg, where, good: str, bad: str, name: str):
    src = emulation_source(cfg, kernels_of(cfg))
    assert good in src, good
    return build(cfg, where, src.replace(good, bad), name, extra=["-DEMU_PATIENCE_S=10"])


def _caught(exe, cfg, land: str, seeds=range(3)) -> list:
    """Per seed: did the run abort (a deadlock, an arrival beyond a barrier's count) or
    miss the gate?"""
    out = []
    for seed in seeds:
        try:
            err, untouched = run(exe, cfg, (200, _n(cfg, 296), 150), exe.parent, seed=seed,
                                 land=land)
            out.append(not (err <= _gate(cfg) and untouched))
        except AssertionError:
            out.append(True)
    return out


def test_the_emulation_catches_a_stage_released_while_its_wgmmas_run(tmp_path):
    """The emulation is a test that can fail: a consumer that waits for all but two
    wgmma groups, not one, releases a stage its wgmmas still read, and the producer's
    next load (landing as issued) is what they multiply."""
    exe = _sabotaged(BASE, tmp_path, "wgmma_wait<1>();  // the previous k-tile's wgmmas",
                     "wgmma_wait<2>();  //", "early_release")
    assert any(_caught(exe, BASE, "eager"))


def test_the_emulation_catches_a_stage_read_before_its_load_lands(tmp_path):
    """A consumer that does not wait for a stage's full barrier reads it before TMA's
    load has landed (landing when waited for)."""
    good = "                mbar_wait(full(stage), phase);\n                // this k-tile's"
    exe = _sabotaged(BASE, tmp_path, good, "                // this k-tile's", "no_wait")
    assert all(_caught(exe, BASE, "lazy", seeds=[0]))


def test_the_emulation_catches_a_store_buffer_written_under_its_tma_store(tmp_path):
    """The TMA-store epilogue without its wait for the store before last: a buffer is
    written again while its store has yet to read it (made at the wait that retires it)."""
    cfg = next(c for c in EMULATED if c.store == 1)
    exe = _sabotaged(cfg, tmp_path, "bulk_wait_read<1>();", ";", "no_store_wait")
    assert all(_caught(exe, cfg, "lazy", seeds=[0]))
