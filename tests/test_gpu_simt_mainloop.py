"""GPU: the SIMT main loop's interior path (``interior`` 1 and 2) and the micro-tiles of
16x8 and 8x16 compute C right, and the interior path computes exactly what the checked
loop does (the same FMAs in the same order: bit for bit), in every layout, with fp32 and
bf16 inputs, one or two stages, and each split-K reduction; on shapes whose tiles all lie
inside, shapes cut at every edge and in K, a K of less than two tiles, and leading
dimensions that forbid whole vectors (the checked loop then runs everywhere). Fresh random
inputs, C poisoned with NaN, a float64 reference. Skipped without a GPU (conftest.py);
torch makes the operands and the references."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import pytest

from codegen import KernelConfig, check, compile_many
from codegen.config import DType, Layout

pytestmark = pytest.mark.gpu

#: 4096^3's tuned winner, and the best main-loop mixes of the new parameters (test_sass.py)
BASES = [KernelConfig(bm=128, bn=128, bk=8, rm=8, rn=8, wt=16, pad=0, swz=1, swizzle=1),
         KernelConfig(bm=128, bn=256, bk=8, rm=8, rn=16, wt=8, pad=0, swz=1, swizzle=1),
         KernelConfig(bm=128, bn=128, bk=8, rm=16, rn=8, wt=4, pad=0, swz=1, swizzle=8),
         KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, wt=8, pad=4, stages=1, swizzle=8)]
SPLITS = [(1, "pass"), (4, "pass"), (2, "last"), (2, "cluster")]
#: (M, N, K): every tile inside and K whole; every edge cut and K too; K under two tiles;
#: a single element; a deep K in one column of tiles
SHAPES = [(512, 512, 512), (515, 260, 517), (256, 384, 12), (1, 1, 1), (130, 1030, 2056)]


def _configs() -> list[KernelConfig]:
    """Each base with each interior path it builds in each layout (the swizzle where the
    layout transposes an operand); the winner's and the single-stage one's also with bf16
    inputs in each layout and each split-K in NN and TT."""
    def build(base, interior, layout, dtype=DType.F32, split=(1, "pass")):
        return dataclasses.replace(base, interior=interior, layout=layout, dtype=dtype,
                                   split=split[0], reduce=split[1],
                                   swz=base.swz if layout is not Layout.TN else 0)
    out = [build(b, i, lay) for b, i, lay in itertools.product(BASES, (1, 2), Layout)]
    for b, i in itertools.product((BASES[0], BASES[3]), (1, 2)):
        out += [build(b, i, lay, DType.BF16) for lay in Layout]
        out += [build(b, i, lay, split=s) for lay in (Layout.NN, Layout.TT) for s in SPLITS[1:]]
    return [c for c in out
            if not check(c, "sm_90") and not check(dataclasses.replace(c, interior=0), "sm_90")]


CONFIGS = _configs()


@pytest.fixture(scope="module")
def built(compile_cache):
    from tuner.gpu import device

    twins = [dataclasses.replace(c, interior=0) for c in CONFIGS]
    res = dict(compile_many(CONFIGS + twins, device().sm, cache_dir=compile_cache))
    bad = {c.name: r.error for c, r in res.items() if not r.ok}
    assert not bad, bad
    return res


@functools.cache
def _runner(cfg, cubin: Path):
    from tuner.runtime.runners import runner_for

    return runner_for(cfg, cubin.read_bytes())


def _operand(torch, rows, cols, column_major, dtype, aligned):
    """rows x cols stored row- or column-major, each stored row padded to a multiple of 4
    elements and 4 more (aligned: whole vectors may move), or to one that is not: (the
    logical view, leading dimension)."""
    store_rows, store_cols = (cols, rows) if column_major else (rows, cols)
    pad = -store_cols % 4 + 4 if aligned else (1 if (store_cols + 1) % 4 else 2)
    store = torch.randn(store_rows, store_cols + pad, device="cuda").to(
        torch.float32 if dtype is DType.F32 else torch.bfloat16)
    view = store[:, :store_cols]
    return (view.t() if column_major else view), store_cols + pad


def _problem(torch, cfg, shape, aligned):
    m, n, k = shape
    a, lda = _operand(torch, m, k, cfg.layout in (Layout.TN, Layout.TT), cfg.dtype, aligned)
    b, ldb = _operand(torch, k, n, cfg.layout in (Layout.NT, Layout.TT), cfg.dtype, aligned)
    ref = torch.matmul(a.double(), b.double())
    return a, lda, b, ldb, ref


def _run(torch, cfg, res, shape, a, lda, b, ldb):
    """C (m x n, row-major, ldc = n + 4, poisoned with NaN) as cfg computes it, and whether
    the columns past N are still NaN."""
    from tuner.gpu import device

    m, n, k = shape
    cstore = torch.full((m, n + 4), float("nan"), device="cuda", dtype=torch.float32)
    run = _runner(cfg, Path(res.cubin)).bind(device(), m, n, k, lda, ldb, n + 4)
    run(a.data_ptr(), b.data_ptr(), cstore.data_ptr(), 1.0, 0.0,
        torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return cstore[:, :n].clone(), bool(torch.isnan(cstore[:, n:]).all())


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned-ld"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_interior_path_is_right_and_the_checked_loops_twin(built, shape, aligned):
    import torch

    from tuner.bench import tolerance

    torch.manual_seed(torch.seed())  # fresh inputs every run
    failures = {}
    for cfg in CONFIGS:
        twin = dataclasses.replace(cfg, interior=0)
        a, lda, b, ldb, ref = _problem(torch, cfg, shape, aligned)
        c, untouched = _run(torch, cfg, built[cfg], shape, a, lda, b, ldb)
        c0, _ = _run(torch, twin, built[twin], shape, a, lda, b, ldb)
        err = float(torch.linalg.norm(c.double() - ref) /
                    max(float(torch.linalg.norm(ref)), 1e-30))
        same = bool(torch.equal(c, c0))  # NaN anywhere fails this too
        if not (err <= tolerance(cfg, shape[2]) and untouched and same):
            failures[cfg.name] = dict(error=err, untouched=untouched, bitwise_twin=same)
    print(f"{len(CONFIGS)} interior kernels at {shape}, {'aligned' if aligned else 'misaligned'}")
    assert not failures, failures


def test_the_new_micro_tiles_run_without_spilling(built):
    """The 16x8 and 8x16 micro-tiles (no interior path too) run with the resources ptxas
    reported and none spilled, 1 or 2 blocks per SM as the occupancy model says."""
    from codegen.occupancy import occupancy
    from tuner.gpu import device

    dev = device()
    for cfg, res in built.items():
        if 16 not in (cfg.rm, cfg.rn) or cfg.dtype is not DType.F32 or cfg.split > 1:
            continue
        assert res.resources.spill_bytes == 0, (cfg.name, res.resources)
        r = _runner(cfg, Path(res.cubin))
        assert r.attributes(dev)["registers"] == res.resources.registers, cfg.name
        occ = occupancy(cfg.threads, res.resources.registers, res.resources.smem, dev.arch)
        assert r.max_active_blocks(dev) == occ.blocks_per_sm, cfg.name


#: the 8x16 winners of 4096^3 and 8192^3 (98f87cf), each FMA order at each ptxas level,
#: and with the fragments carried across tiles on both interior paths
ORDER_BASES = [KernelConfig(bm=128, bn=256, bk=8, rm=8, rn=16, wt=16, interior=1),
               KernelConfig(bm=128, bn=128, bk=8, rm=8, rn=16, wt=16, interior=1, frags=2)]
ORDER_CONFIGS = [dataclasses.replace(b, zigzag=z, ptxas=o, layout=lay, frags=f, interior=i)
                 for b in ORDER_BASES for lay in (Layout.NN, Layout.TT)
                 for z, o, f, i in ((0, 1, b.frags, 1), (1, 1, b.frags, 1), (2, 1, b.frags, 1),
                                    (2, 3, b.frags, 1), (0, 3, 3, 1), (2, 1, 3, 2))]


def _plain(cfg: KernelConfig) -> KernelConfig:
    """The twin that computes the same FMAs in row order, fragments loaded a step at a
    time, at ptxas's default level."""
    return dataclasses.replace(cfg, zigzag=0, ptxas=3, frags=1)


@pytest.fixture(scope="module")
def built_orders(compile_cache):
    from tuner.gpu import device

    twins = [_plain(c) for c in ORDER_CONFIGS]
    res = dict(compile_many(ORDER_CONFIGS + twins, device().sm, cache_dir=compile_cache))
    bad = {c.name: r.error for c, r in res.items() if not r.ok}
    assert not bad, bad
    return res


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fma_orders_and_ptxas_levels_compute_the_plain_kernels_bits(built_orders, shape):
    """Each accumulator takes the same FMAs in the same K order whatever the order of a
    k-step's FMAs across the micro-tile, however its fragments are loaded (carried across
    tiles too, where the interior path hands over to the checked loop at the edges) and
    whatever ptxas's level: C equals the plain kernel's bit for bit, within the gate of
    float64, the columns past N untouched."""
    import torch

    from tuner.bench import tolerance

    torch.manual_seed(torch.seed())
    failures = {}
    for cfg in ORDER_CONFIGS:
        twin = _plain(cfg)
        a, lda, b, ldb, ref = _problem(torch, cfg, shape, True)
        c, untouched = _run(torch, cfg, built_orders[cfg], shape, a, lda, b, ldb)
        c0, _ = _run(torch, twin, built_orders[twin], shape, a, lda, b, ldb)
        err = float(torch.linalg.norm(c.double() - ref) /
                    max(float(torch.linalg.norm(ref)), 1e-30))
        same = bool(torch.equal(c, c0))
        if not (err <= tolerance(cfg, shape[2]) and untouched and same):
            failures[cfg.name] = dict(error=err, untouched=untouched, bitwise_twin=same)
    assert not failures, failures


#: stream-K: the fp32 winners' tiles (4096^3: 128x256 8x16, one block an SM; 8192^3:
#: 128x128 8x8), a cp.async ring with A column-major, bf16 inputs transposed
STREAMK = [KernelConfig.from_name(n) for n in (
    "gemm_simt_f32_128x256x16_r8x16_w8x4_p4_v4_s2_g8_i1_sk",
    "gemm_simt_f32_128x128x8_r8x8_w16x2_p4_v4_s2_g8_i1_sk_tt",
    "gemm_simt_f32_64x128x16_r4x8_w8x4_p0_v4_s3_g1_sk_tn",
    "gemm_simt_bf16_128x128x8_r8x8_w4x8_p4_v4_s2_g8_sk_nt")]
#: whole waves and a partial one on 132 SMs (4096 x 4096: 512 tiles of 128x256), fewer
#: tiles than blocks, a deep K cut many ways, and the edges
STREAMK_SHAPES = [(4096, 4096, 256), (1000, 3000, 777), (130, 1030, 2056), (515, 260, 517)]


@pytest.mark.parametrize("shape", STREAMK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_stream_k_shares_out_the_last_waves(compile_cache, shape):
    """Stream-K kernels on the GPU's block slots against float64, and bit for bit the same
    on a second launch (the cut tiles summed in k order, whichever block ends last)."""
    import torch

    from tuner.bench import tolerance
    from tuner.gpu import device

    res = dict(compile_many(STREAMK, device().sm, cache_dir=compile_cache))
    assert all(r.ok and r.resources.spill_bytes == 0 for r in res.values()), {
        c.name: (r.error if not r.ok else r.resources) for c, r in res.items()}
    torch.manual_seed(torch.seed())
    failures = {}
    for cfg in STREAMK:
        a, lda, b, ldb, ref = _problem(torch, cfg, shape, True)
        c, untouched = _run(torch, cfg, res[cfg], shape, a, lda, b, ldb)
        again, _ = _run(torch, cfg, res[cfg], shape, a, lda, b, ldb)
        err = float(torch.linalg.norm(c.double() - ref) /
                    max(float(torch.linalg.norm(ref)), 1e-30))
        if not (err <= tolerance(cfg, shape[2]) and untouched and torch.equal(c, again)):
            failures[cfg.name] = dict(error=err, untouched=untouched,
                                      same_bits=bool(torch.equal(c, again)))
    assert not failures, failures
