"""The decode family on the CPU: names, validation, the search space, the model's view,
rendering (golden sources, static_asserts), compiling without spills, and the kernels run
on the CPU by an emulation of their warps (tests/_emulation.py: every index, edge,
layout, split-K sum and epilogue of the source; what it cannot check, timing, the memory
model and the real instructions' rounding, is tests/test_gpu_decode.py's, on a GPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _emulation import build, build_all, emulate, emulation_source
from _golden import rendered_as_golden

from codegen import DType, UsageError, check, compile_many, render
from codegen.arch import parse_arch
from codegen.compile import compile_source
from codegen.families import FAMILIES, Math, config_from_name, families_for, family_of
from codegen.families._common import Layout, Variant
from codegen.families.decode import (
    FMA_RATE, MAX_ACC_REGS, OVERHEAD_REGS, SPACE, DecodeConfig, from_params, params_of,
    problem_reasons, suggest, valid_configs,
)

ARCH = parse_arch("sm_90")
NT16 = Variant(Layout.NT, DType.F16, "out", "gelu")  # x @ W.t() + b, GELU, fp16 C


# ---- names and the launch interface -------------------------------------------------------
@pytest.mark.parametrize("cfg,name", [
    (DecodeConfig(), "gemm_decode_f16_mma16x64_w4x2_v8_s3"),
    (DecodeConfig(dtype=DType.BF16, math="fma", mt=1, bn=32, wk=8, wn=1, stages=4),
     "gemm_decode_bf16_fma1x32_w8x1_v8_s4"),
    (DecodeConfig(mt=64, bn=32, split=8), "gemm_decode_f16_mma64x32_w4x2_v8_s3_k8"),
    (DecodeConfig(vec=4, split=4, reduce="last", layout=Layout.NT, out=DType.F16, bias="out",
                  act="gelu"), "gemm_decode_f16_mma16x64_w4x2_v4_s3_k4l_nt_of16_bias_gelu"),
    (DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, split=8, reduce="cluster",
                  layout=Layout.NT, out=DType.F16), "gemm_decode_f16_fma1x32_w8x1_v8_s3_k8c_nt_of16"),
    (DecodeConfig(bn=32, wk=8, wn=1, stages=6, ring="async", split=2, reduce="cluster",
                  layout=Layout.NT), "gemm_decode_f16_mma16x32_w8x1_v8_a6_k2c_nt"),
    (DecodeConfig(bn=32, wk=8, wn=1, stages=2, prefetch_b=1, layout=Layout.NT, out=DType.F16),
     "gemm_decode_f16_mma16x32_w8x1_v8_s2_pb_nt_of16"),
    (DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, ring="async", stages=5, prefetch_b=2,
                  split=2, reduce="cluster", layout=Layout.NT),
     "gemm_decode_f16_fma1x32_w8x1_v8_a5_pbl_k2c_nt"),
])
def test_names_are_pinned_and_round_trip(cfg, name):
    assert cfg.name == name
    assert config_from_name(name) == cfg == DecodeConfig.from_dict(cfg.to_dict())


@pytest.mark.parametrize("name", [
    "gemm_decode_f16_mma16x64_w4x2_v8_s3_k1",      # split 1 is written as nothing
    "gemm_decode_f16_mma16x64_w4x2_v8_s3_k4l_k4",  # parts once each
    "gemm_decode_f16_mma16x64_w8_v8_s3",           # the warps as WK x WN
    "gemm_decode_f16_xma16x64_w4x2_v8_s3",
    "gemm_decode_f16_mma16x64_w4x2_v8_s3_nn",      # the default layout is not written
])
def test_other_strings_are_not_names(name):
    with pytest.raises(UsageError):
        DecodeConfig.from_name(name)


def test_the_launch_interface():
    c = DecodeConfig(mt=16, bn=64, wk=4, wn=2, vec=8, split=4, reduce="last")
    assert (c.threads, c.block(), c.bm, c.bk, c.kc, c.bnw) == (256, (256, 1, 1), 16, 128, 32, 32)
    assert c.grid(33, 4097) == (3 * 65, 1, 4)  # M tiles x N panels, the K slices along z
    assert c.smem_bytes == 4 * 16 * (64 + 8) * 4  # [WK][MT][BN + 8] floats
    assert c.last and c.has_workspace and not c.reduce_pass and not c.cluster
    assert c.workspace_floats(33, 4097, batch=2) == 2 * 4 * 33 * 4097
    assert c.ticket_count(33, 4097, batch=2) == 2 * 3 * 65
    plain = DecodeConfig()
    assert plain.workspace_floats(16, 4096) == plain.ticket_count(16, 4096) == 0
    assert not plain.has_workspace and DecodeConfig(split=2).reduce_pass
    # a cluster of the tile's slices: one launch, no workspace, no tickets, the grid's z
    cl = dataclasses.replace(c, reduce="cluster")
    assert cl.cluster and not (cl.last or cl.has_workspace or cl.reduce_pass)
    assert cl.grid(33, 4097) == c.grid(33, 4097) and cl.smem_bytes == c.smem_bytes
    assert cl.workspace_floats(33, 4097) == cl.ticket_count(33, 4097) == 0
    assert not (c.cluster or plain.cluster or DecodeConfig(split=2).cluster)
    # registers: 1 m16 tile x 4 n8 blocks of fragments; a stage of B is 4 loads, A's ring
    # 2 stages of 2 loads
    assert (c.acc_regs, c.stage_regs, c.a_ring_regs, c.b_in_flight) == (16, 4 * 4, 2 * 2 * 4,
                                                                         2 * 4 * 512)
    fma = DecodeConfig(math="fma", mt=4, bn=64, wk=4, wn=2)
    assert (fma.acc_regs, fma.a_loads, fma.stage_regs, fma.a_ring_regs) == (4 * 4, 4, 4 * 4,
                                                                            2 * 4 * 4)


# ---- validation --------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,arch,reason", [
    (DecodeConfig(dtype=DType.F32), "sm_90", "the decode family takes f16 or bf16 inputs"),
    (DecodeConfig(), "sm_75", "mma.sync m16n8k16 and the streaming loads need sm_80"),
    (DecodeConfig(mt=8), "sm_90", "an mma tile has 16, 32 or 64 rows, not 8"),
    (DecodeConfig(math="fma", mt=16), "sm_90", "the FMA path takes 1, 2, 4 or 8 rows, not 16"),
    (DecodeConfig(math="wmma"), "sm_90", "math 'wmma' is not mma or fma"),
    (DecodeConfig(vec=2), "sm_90", "a lane loads 4 or 8 elements (8 or 16 bytes), not 2"),
    (DecodeConfig(bn=40, wn=2), "sm_90",
     "BN=40 does not split into WN=2 warps' columns of whole n8 blocks"),
    (DecodeConfig(bn=64, wn=4, layout=Layout.NN), "sm_90",
     "a row-major B is read 32 columns at a time (4 lanes x VEC=8): a warp's BN/WN=16 is not "
     "a multiple of 32"),
    (DecodeConfig(wk=8, wn=8), "sm_90", "2048 threads per block exceeds the limit of 1024"),
    (DecodeConfig(stages=5), "sm_90", "stages=5 is outside 1..4 (a register ring)"),
    (DecodeConfig(stages=9, ring="async"), "sm_90", "stages=9 is outside 2..8 (a shared-memory"),
    (DecodeConfig(stages=1, ring="async"), "sm_90", "stages=1 is outside 2..8"),
    (DecodeConfig(ring="lds"), "sm_90", "ring 'lds' is not one of reg, async"),
    (DecodeConfig(prefetch_b=3), "sm_90", "prefetch_b is 0, 1 or 2, not 3"),
    (DecodeConfig(ring="async", layout=Layout.TN), "sm_90",
     "a shared-memory ring copies rows of A 2 x VEC bytes at a time: a column-major A (tn)"),
    # 16 KB a stage (6 loads x 16 bytes x 256 threads) + 3 KB of partial tiles
    (DecodeConfig(bn=32, wk=8, wn=1, stages=8, mt=32, ring="async"), "sm_90",
     "shared memory"),
    (DecodeConfig(split=3), "sm_90", "split-K 3 is not one of 1, 2, 4, 8, 16, 32"),
    (DecodeConfig(reduce="gather", split=2), "sm_90", "split-K reduce 'gather' is not one of"),
    (DecodeConfig(reduce="cluster", split=16), "sm_90",
     "a cluster split-K takes 2, 4, 8 slices (a portable cluster size), not 16"),
    (DecodeConfig(reduce="cluster", split=4), "sm_80",
     "a cluster split-K needs thread-block clusters (sm_90 or newer); sm_80 has none"),
    (DecodeConfig(reduce="last"), "sm_90", "a last-block split-K needs a split of 2 or more"),
    (DecodeConfig(mt=64, bn=64, wn=1), "sm_90",
     "a warp's 64x64 tile holds 128 accumulator registers per thread, over 64"),
    # 64 accumulators + 4 stages x 4 x 4 of B + 2 x 8 x 4 of A + 2 x 4 + 8 (loads) + 48:
    # one over (B column-major, no movmatrix copies, it fits)
    (DecodeConfig(mt=64, bn=32, wn=1, stages=4), "sm_90",
     "64 accumulators, 4 stages of 16 registers of B, 64 of A need about 256 registers per "
     "thread, over the 255 a block of 128 threads leaves each"),
    # + a quarter of the 8 x 8 widened A rows
    (DecodeConfig(math="fma", mt=8, bn=64, wn=1, stages=4), "sm_90",
     "64 accumulators, 4 stages of 32 registers of B, 64 of A and the widened A rows need "
     "about 344 registers per thread, over the 255 a block of 128 threads leaves each"),
    # 16 + 3 x 16 + 16 + 10 + 48: fine for 256 threads, not for 512 (64K / 512)
    (DecodeConfig(wk=8, wn=2), "sm_90", "need about 138 registers per thread, over the 128 a "
                                        "block of 512 threads leaves each"),
    (DecodeConfig(layout=Layout.NT, out=DType.TF32), "sm_90", "C cannot be tf32"),
    (DecodeConfig(act="tanh"), "sm_90", "activation 'tanh' is not one of"),
])
def test_invalid_configs_say_why(cfg, arch, reason):
    assert any(reason in r for r in check(cfg, arch)), check(cfg, arch)


def test_every_layout_and_epilogue_is_buildable():
    spec = family_of(DecodeConfig())
    assert spec.layouts == frozenset(Layout) and spec.epilogue
    for layout in Layout:
        for out in (DType.F32, DType.F16, DType.BF16):
            for bias in ("none", "out") + (("f32",) if out is not DType.F32 else ()):
                for act in ("none", "relu", "gelu", "gelu_tanh", "silu"):
                    cfg = DecodeConfig(layout=layout, out=out, bias=bias, act=act)
                    assert check(cfg, "sm_90") == check(cfg, "sm_80") == [], cfg.name


def test_the_register_estimate_and_cap():
    """The estimate's terms (the compile test below checks it against ptxas); the cap of
    __launch_bounds__(THREADS, 1)."""
    c = DecodeConfig()  # NN: 16 accumulators, 3 stages of 4 x 4 (B), 2 of 2 x 4 (A)
    assert (MAX_ACC_REGS, OVERHEAD_REGS) == (64, 48)
    assert (c.stage_regs, c.a_ring_regs) == (16, 16)
    assert c.regs_estimate == 16 + 3 * 16 + 16 + (4 * 2 + 2) + 48 == 138
    assert Variant(Layout.NT).apply(c).regs_estimate == 138 - 4  # no movmatrix copies
    assert DecodeConfig(math="fma", mt=4, bn=32, wn=1).regs_estimate == \
        4 * 4 + 3 * 4 * 4 + 2 * 4 * 4 + 4 * 8 // 4 + (4 * 2 + 4) + 48 == 164
    assert DecodeConfig(stages=1).regs_estimate == c.regs_estimate - 16  # counted as 2
    big = DecodeConfig(mt=64, bn=32, wn=1, stages=4)
    assert check(big, ARCH) and not check(Variant(Layout.NT).apply(big), ARCH)
    assert [DecodeConfig(wk=wk, wn=1).register_cap(ARCH) for wk in (2, 8, 16, 32)] == \
        [255, 255, 128, 64]
    # the ring in shared memory: the chunk computed (B's counted as two, as one stage is)
    # and A's one, whatever STAGES
    a = DecodeConfig(ring="async", stages=8)
    assert a.a_ring_regs == 8 and a.regs_estimate == 16 + 2 * 16 + 8 + 10 + 48 == 114
    assert a.ring_bytes == 8 * (4 + 2) * 256 * 16 and a.smem_bytes == a.ring_bytes + 4 * 16 * 72 * 4


# ---- the search space, the registry and the model ----------------------------------------
def test_the_family_is_registered_and_searched_for_fp16_and_bf16():
    spec = FAMILIES["decode"]
    assert spec.template == "gemm_decode.cu.j2" and spec.math is Math.TENSOR_CORE
    assert spec.searched and spec.min_cc == 80 and spec.prune_margin == 2.0
    assert set(spec.dtypes) == {DType.F16, DType.BF16}
    for dtype in (DType.F16, DType.BF16):
        assert spec in families_for(dtype) and spec.serves(dtype)
    for dtype in (DType.F32, DType.TF32, DType.F32X3):
        assert spec not in families_for(dtype) and not spec.serves(dtype)
    # M <= 64 only: past the largest M tile the GEMM families serve the problem
    assert problem_reasons(DecodeConfig(mt=64), (65, 4096, 4096), ARCH) == [
        "the decode family serves M <= 64 (B read once), not 65"]
    assert not problem_reasons(DecodeConfig(mt=64), (64, 4096, 4096), ARCH)
    assert spec.space == {f"decode_{k}": v for k, v in SPACE.items()}


def test_both_rings_are_searched():
    """The shared-memory ring beside the register one, 5 to 8 stages its alone (as deep
    as its shared memory allows), 16 warps along K; a study's params from before the ring
    was searched read as the register ring."""
    cs = list(valid_configs(ARCH, DType.F16, (16, 4096, 4096)))
    assert {(c.ring, c.stages) for c in cs} == {("reg", s) for s in (2, 3, 4)} | {
        ("async", s) for s in range(2, 9)}
    assert all(c.smem_bytes <= ARCH.smem_per_block_optin for c in cs)
    deep = {(c.wk, c.wn, c.stages) for c in cs if c.bn == 32 and c.is_async}
    assert {(8, 1, 8), (16, 1, 3)} <= deep and (16, 1, 4) not in deep  # A's slots overflow
    one_row = list(valid_configs(ARCH, DType.F16, (1, 4096, 4096)))
    assert (16, 1, 5) in {(c.wk, c.wn, c.stages) for c in one_row if c.mt == 1 and c.bn == 32}
    old = {"mt": 16, "bn": 32, "wk": 8, "wn": 1, "stages": 3}
    assert from_params(old, DType.F16) == DecodeConfig(bn=32, wk=8, wn=1, stages=3)


def test_the_math_follows_from_the_m_tile():
    cs = list(valid_configs(ARCH, DType.BF16))
    assert {c.math for c in cs if c.mt < 16} == {"fma"} and {c.math for c in cs
                                                           if c.mt >= 16} == {"mma"}
    assert {c.vec for c in cs} == {8} and {c.mt for c in cs} == set(SPACE["mt"])
    assert all(c.dtype is DType.BF16 and c.split == 1 for c in cs)


@pytest.mark.parametrize("shape,mts", [
    ((1, 4096, 4096), {1, 16}),        # the smallest tile of each math
    ((7, 4096, 4096), {8, 16}),
    ((16, 4096, 4096), {16}),          # FMAs serve M <= 8
    ((33, 4096, 14336), {16, 32, 64}),
    ((64, 4096, 14336), {16, 32, 64}),
])
def test_the_shape_rules_keep_useful_m_tiles(shape, mts):
    cs = list(valid_configs(ARCH, DType.F16, shape))
    assert {c.mt for c in cs} == mts
    assert all(not problem_reasons(c, shape, ARCH) for c in cs)


def test_problem_reasons_say_why():
    assert problem_reasons(DecodeConfig(mt=32), (16, 4096, 4096), ARCH) == [
        "an M tile of 32 rows is pointless for M=16: 16 rows take it in as few tiles"]
    assert problem_reasons(DecodeConfig(math="fma", mt=8), (9, 4096, 4096), ARCH) == [
        "the FMA path serves M <= 8, not 9: it would read B 2 times"]


def test_split_k_is_asked_only_where_the_panels_leave_sms_idle():
    import optuna

    small, wide = (16, 4096, 4096), (16, 28672, 4096)
    cfg = DecodeConfig(split=4, reduce="last")  # 64 panels of 64 columns < 132 SMs
    p = params_of(cfg, small, ARCH)
    # (a split a cluster holds asks its reduction among the three, a larger one between two)
    assert p == {"decode_mt": 16, "decode_bn": 64, "decode_wk": 4, "decode_wn": 2,
                 "decode_ring": "reg", "decode_stages": 3, "decode_split": 4,
                 "decode_reduce_c": "last"}
    assert suggest(optuna.trial.FixedTrial(p), DType.F16, small, ARCH) == cfg
    for c in (DecodeConfig(split=16, reduce="last"), DecodeConfig(split=8, reduce="cluster"),
              DecodeConfig(ring="async", stages=5, split=2, reduce="cluster")):
        assert suggest(optuna.trial.FixedTrial(params_of(c, small, ARCH)), DType.F16, small,
                       ARCH) == c
    assert params_of(DecodeConfig(split=16), small, ARCH)["decode_reduce"] == "pass"
    assert "decode_split" not in params_of(DecodeConfig(), wide, ARCH)  # 448 panels
    splits = {(c.split, c.reduce) for c in valid_configs(ARCH, DType.F16, small)}
    assert splits == {(1, "pass"), (16, "pass"), (16, "last")} | {
        (s, r) for s in (2, 4, 8) for r in ("pass", "last", "cluster")}
    # no cluster without thread-block clusters
    assert {c.reduce for c in valid_configs("sm_80", DType.F16, small)} == {"pass", "last"}
    assert {c.split for c in valid_configs(ARCH, DType.F16, wide)} == {1}


def test_the_model_sees_a_decode_kernel_memory_bound():
    from tuner.model import bound_tflops, predict_before_compile

    spec = family_of(DecodeConfig())
    assert spec.issue_efficiency(DecodeConfig()) == 1.0
    assert spec.issue_efficiency(DecodeConfig(math="fma", mt=1)) == FMA_RATE == 1 / 16
    cfg = NT16.apply(DecodeConfig(split=4, reduce="last"))
    pred = predict_before_compile(cfg, (16, 4096, 4096), ARCH)
    assert pred.limiter == "stream", pred.terms  # B streamed from DRAM (tuner/model.py)
    # B's 32 MiB at least, once, and no faster than the DRAM reads it; the bound stays far
    # above what the DRAM allows
    assert pred.traffic["dram_bytes"] >= 4096 * 4096 * 2
    assert pred.terms["stream"] >= 4096 * 4096 * 2 / 4.3e12
    bound, _ = bound_tflops(cfg, (16, 4096, 4096), ARCH)
    assert bound > 2 * 16 * 4096 * 4096 / pred.terms["stream"] / 1e12


# ---- rendering ---------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [
    # x @ W.t() + bias, GELU, fp16 C: the linear layer of a decode step
    NT16.apply(DecodeConfig()),
    # FMAs on one row, a last-block split-K, bf16 C, row-major B (movmatrix)
    Variant(Layout.NN, DType.BF16).apply(
        DecodeConfig(dtype=DType.BF16, math="fma", mt=1, bn=64, wk=4, wn=2, split=4,
                     reduce="last")),
    # A column-major, 8-byte loads, two m16 tiles, a reduce pass
    Variant(Layout.TN, DType.F32, "none", "silu").apply(
        DecodeConfig(mt=32, bn=32, wk=4, wn=1, vec=4, stages=2, split=8)),
    # the slices of a tile as one cluster, summed through distributed shared memory
    NT16.apply(DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, split=4, reduce="cluster")),
    # the ring in shared memory, filled by cp.async, 4 stages
    Variant(Layout.NT, DType.BF16).apply(
        DecodeConfig(dtype=DType.BF16, bn=32, wk=8, wn=1, stages=4, ring="async")),
    # and B's first chunks loaded before the wait for the kernel before
    NT16.apply(DecodeConfig(bn=32, wk=8, wn=1, stages=3, ring="async", prefetch_b=1)),
    # or prefetched into L2 before it, a register ring, a row-major B
    Variant(Layout.NN).apply(DecodeConfig(mt=32, bn=64, wk=4, wn=2, stages=3, prefetch_b=2)),
])
def test_golden_sources(cfg):
    src = rendered_as_golden(cfg)
    assert src.startswith("// Generated by gemm-tune from templates/gemm_decode.cu.j2")


def test_the_header_states_the_launch_and_the_bytes_in_flight():
    src = render(NT16.apply(DecodeConfig(split=4, reduce="last")))
    assert "// In flight:  4096 bytes of B per warp (2 chunks x 4 loads x 512), 32768 per block" \
        in src
    assert "grid  = (ceil(M / 16) * ceil(N / 64), batch, 4)" in src
    assert "const __half* bias, float* W, unsigned* tickets)" in src
    assert "ld.global.nc.L1::no_allocate.L2::256B.v4.b32" in src
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert "movmatrix" not in src  # a column-major B is loaded in the column form
    nn = render(Variant(Layout.NN).apply(DecodeConfig(dtype=DType.BF16, split=2)))
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in nn and ".f32.bf16.bf16.f32" in nn
    assert "_reduce(int M, int N, float alpha, const float* __restrict__ W" in nn
    cl = render(NT16.apply(DecodeConfig(split=4, reduce="cluster")))
    assert "block = (256, 1, 1), cluster = (1, 1, 4) (compiled in)" in cl
    assert "__cluster_dims__(1, 1, SPLIT) __launch_bounds__(THREADS, 1)" in cl
    assert "const __half* bias)" in cl and "tickets" not in cl and "float* W" not in cl
    assert "cluster.map_shared_rank(red + r * LDR + col, z)" in cl
    ring = render(NT16.apply(DecodeConfig(stages=4, ring="async")))
    assert "STAGES=4 (shared memory, cp.async)" in ring
    assert "cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" in ring
    assert "cp.async.ca.shared.global [%0], [%1], %2, %3;" in ring  # A, through L1
    assert "ring_wait<STAGES - 1>();" in ring and "ld_stream<VEC>(" not in ring
    # prefetch_b: every load of B's prologue before the wait, every load of A after it
    for async_ in (False, True):
        cfg = DecodeConfig(ring="async" if async_ else "reg", prefetch_b=1)
        src = render(cfg)
        body = src[src.index(f"{cfg.name}(int M"):]
        wait = body.index("dependent_launch_begin();")
        assert body.index("load_b(") < wait < body.index("load_a(")
        assert "// Prefetch:   B's first chunks load before the wait" in src
        plain = render(dataclasses.replace(cfg, prefetch_b=0))
        body = plain[plain.index(f"{cfg.name.replace('_pb', '')}(int M"):]
        assert body.index("dependent_launch_begin();") < body.index("load_b(")
        assert "prefetch_l2(" not in body
        # prefetch_b=2: the same chunks into L2 before the wait, every load after it
        l2 = dataclasses.replace(cfg, prefetch_b=2)
        src = render(l2)
        body = src[src.index(f"{l2.name}(int M"):]
        wait = body.index("dependent_launch_begin();")
        assert body.index("prefetch_b(s);") < wait < body.index("load_b(")
        assert body.count("dependent_launch_begin();") == 1
        assert "// Prefetch:   B's first chunks into L2 before the wait" in src
        assert 'asm volatile("prefetch.global.L2 [%0];\\n" :: "l"(p));' in src


@pytest.mark.parametrize("edit,message", [
    ("constexpr int MT = 16,", "constexpr int MT = 24,"),
    ("constexpr int BNW = 32,", "constexpr int BNW = 24,"),
    ("constexpr int WK = 4, WN = 2, WARPS = 8, THREADS = 256;",
     "constexpr int WK = 4, WN = 2, WARPS = 8, THREADS = 320;"),
])
def test_a_hand_edited_source_fails_its_static_asserts(edit, message, tmp_path):
    src = render(DecodeConfig())
    assert edit in src
    res = compile_source(src.replace(edit, message), "sm_90", "edited", cache_dir=tmp_path)
    assert not res.ok and "static assertion failed" in res.log


def _sample() -> list[DecodeConfig]:
    """Configs covering every searched value of every parameter, both maths and every
    layout, C type and epilogue, split-K both ways, 8-byte loads, 1 stage: valid on sm_80
    and sm_90. The largest register estimates of the space are among them."""
    by_estimate = sorted(valid_configs(ARCH, DType.F16), key=lambda c: -c.regs_estimate)
    base = [by_estimate[0], by_estimate[1]]  # the heaviest of each kind
    base += [next(c for c in by_estimate if c.math == m) for m in ("mma", "fma")]
    for k, values in SPACE.items():
        for v in values:
            base.append(next(c for c in valid_configs(ARCH, DType.BF16)
                             if getattr(c, k) == v))
    base += [DecodeConfig(stages=1), DecodeConfig(vec=4, stages=4, split=2, reduce="last"),
             DecodeConfig(math="fma", mt=2, split=32), DecodeConfig(mt=64, bn=16, wn=1)]
    epilogues = [(DType.F32, "none", "none"), (DType.F16, "out", "gelu"),
                 (DType.BF16, "f32", "silu"), (DType.F32, "out", "relu")]
    variants = [Variant(layout, *epi) for epi in epilogues for layout in Layout]
    out = []
    for i, c in enumerate(base):
        v = variants[i % len(variants)]
        cv = v.apply(c)
        if check(cv, "sm_80") or check(cv, "sm_90"):  # a row-major B wants 32 columns a warp
            cv = Variant(Layout.NT, v.out, v.bias, v.act).apply(c)
        out.append(cv)
    out += [NT16.apply(c) for c in base[:4]]
    return list(dict.fromkeys(out))


SAMPLE = _sample()


def test_the_sample_covers_the_space():
    assert len(SAMPLE) >= 25
    for k, values in SPACE.items():
        assert {getattr(c, k) for c in SAMPLE} >= set(values), k
    assert {c.layout for c in SAMPLE} == set(Layout) and {c.math for c in SAMPLE} == {
        "mma", "fma"}
    assert {c.reduce for c in SAMPLE if c.split > 1} == {"pass", "last"}
    assert all(not check(c, "sm_80") and not check(c, "sm_90") for c in SAMPLE)


def _compiles_without_spills(configs, arch, compile_cache) -> None:
    res = dict(compile_many(configs, arch, cache_dir=compile_cache))
    bad = {c.name: r.error[:400] for c, r in res.items() if not r.ok}
    assert not bad, bad
    spills = {c.name: (r.resources.registers, r.resources.spill_bytes, r.resources.stack_frame)
              for c, r in res.items() if r.resources.spill_bytes or r.resources.stack_frame}
    assert not spills, spills
    over = {c.name: (r.resources.registers, c.regs_estimate) for c, r in res.items()
            if r.resources.registers > c.regs_estimate}
    assert not over, over  # the estimate that check keeps within the cap is an upper bound
    for c, r in res.items():
        assert r.resources.smem_dynamic == c.smem_bytes
        if c.reduce_pass:
            assert f"{c.name}_reduce" in r.log


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_sample_compiles_without_spills(arch, compile_cache):
    """A subset of the sample holding every value of every field it has
    (tests/_sample.covering), for each architecture; the whole sample on the GPU machine
    (below), whose cores compile it in seconds where CI's two take a minute."""
    from _sample import covering

    _compiles_without_spills(covering(SAMPLE), arch, compile_cache)


def test_cluster_split_k_compiles_without_spills(compile_cache):
    """The cluster reduction (sm_90 only, so outside the sample): both maths, each cluster
    size, a row-major B, the fused epilogue; cooperative_groups' cluster calls compile."""
    _compiles_without_spills([
        NT16.apply(DecodeConfig(split=2, reduce="cluster")),
        Variant(Layout.NN, DType.BF16, "f32", "silu").apply(
            DecodeConfig(dtype=DType.BF16, mt=32, bn=64, wk=4, wn=2, split=4, reduce="cluster")),
        Variant(Layout.NT, DType.F16).apply(
            DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, split=8, reduce="cluster")),
    ], "sm_90", compile_cache)


@pytest.mark.gpu
def test_the_whole_sample_compiles_without_spills_for_the_gpus_architecture(compile_cache):
    from tuner.gpu import device

    _compiles_without_spills(SAMPLE, device().sm, compile_cache)


# ---- the kernels, run on the CPU (tests/_emulation.py) ------------------------------------
#: FP32 accumulation (the emulated mma sums 16 products exactly) and one rounding of C
_GATE = {"f32": 1e-6, "f16": 1e-6 + 2.0 ** -11, "bf16": 1e-6 + 2.0 ** -8}

EMULATED = [
    NT16.apply(DecodeConfig(wk=2, wn=2)),
    Variant(Layout.NN).apply(DecodeConfig(mt=16, bn=64, wk=2, wn=2, stages=2)),
    Variant(Layout.TN, DType.BF16, "f32", "gelu").apply(
        DecodeConfig(dtype=DType.BF16, bn=32, wk=2, wn=2, vec=4, stages=2)),
    Variant(Layout.TT, DType.F16, "out", "silu").apply(
        DecodeConfig(mt=32, bn=32, wk=2, wn=2, stages=1, split=4)),
    Variant(Layout.NT, DType.F16, "f32", "gelu_tanh").apply(
        DecodeConfig(mt=64, bn=16, wk=4, wn=1, stages=2, split=2, reduce="last")),
    Variant(Layout.NT, DType.F32, "none", "relu").apply(
        DecodeConfig(math="fma", mt=4, bn=32, wk=1, wn=2, split=2, reduce="last")),
    Variant(Layout.NN, DType.BF16).apply(
        DecodeConfig(dtype=DType.BF16, math="fma", mt=1, bn=64, wk=2, wn=2, stages=4,
                     prefetch_b=2)),
    Variant(Layout.TT, DType.F32, "out", "gelu").apply(
        DecodeConfig(math="fma", mt=8, bn=16, wk=2, wn=1, vec=4, split=4)),
    Variant(Layout.NN, DType.F16, "out", "none").apply(
        DecodeConfig(mt=16, bn=128, wk=1, wn=4, stages=3, split=2, reduce="last")),
    # the ring in shared memory: mma and FMAs, both B layouts, 8- and 16-byte copies
    NT16.apply(DecodeConfig(wk=2, wn=2, stages=4, ring="async")),
    Variant(Layout.NN, DType.BF16, "out", "silu").apply(
        DecodeConfig(dtype=DType.BF16, mt=32, bn=64, wk=2, wn=2, stages=3, ring="async",
                     prefetch_b=1, split=2, reduce="last")),
    Variant(Layout.NT, DType.F32).apply(
        DecodeConfig(math="fma", mt=2, bn=32, wk=2, wn=2, vec=4, stages=5, ring="async")),
    # split-K across a cluster of the slices (its blocks run together, distributed shared
    # memory a peer's at the same offset): mma and FMAs, 4 and 8 slices
    Variant(Layout.NT, DType.F16, "out", "gelu").apply(
        DecodeConfig(mt=16, bn=64, wk=4, wn=2, split=4, reduce="cluster")),
    Variant(Layout.TN, DType.BF16).apply(
        DecodeConfig(dtype=DType.BF16, math="fma", mt=1, bn=32, wk=4, wn=1, split=8,
                     reduce="cluster")),
]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    where = tmp_path_factory.mktemp("emulated")
    return where, build_all(EMULATED, where)


def test_the_emulated_configs_are_valid_and_cover_the_family():
    assert all(not check(c, "sm_90") for c in EMULATED)
    assert {c.layout for c in EMULATED} == set(Layout)
    assert {c.out for c in EMULATED} == {DType.F32, DType.F16, DType.BF16}
    assert {(c.split > 1, c.reduce) for c in EMULATED} == {(False, "pass"), (True, "pass"),
                                                           (True, "last"), (True, "cluster")}
    assert {c.math for c in EMULATED} == {"mma", "fma"} and {c.vec for c in EMULATED} == {4, 8}
    assert {c.prefetch_b for c in EMULATED} == {0, 1, 2}
    async_ = [c for c in EMULATED if c.is_async]
    assert {c.math for c in async_} == {"mma", "fma"} and {c.b_col for c in async_} == {
        True, False} and {c.vec for c in async_} == {4, 8}


#: M across the tiles; N, K odd (element-wise edges) and even (whole vectors), one K deeper
#: than a block's warps take in one step
SHAPES = [(1, 40, 64), (7, 41, 301), (16, 64, 256), (33, 70, 515), (64, 24, 96)]


def _rows(m: int, cfg: DecodeConfig) -> int:
    """M capped at two whole tiles and one row more: every block of a row of tiles runs
    the same code, so more rows add emulated threads (each a std::thread, sanitised), not
    cases; the cap keeps a full tile, a partial one and several tiles."""
    return min(m, 2 * cfg.mt + 1)


@pytest.mark.parametrize("cfg", EMULATED, ids=lambda c: c.name)
def test_the_kernel_emulated_on_the_cpu(emulated, cfg):
    where, exes = emulated
    gate = _GATE[cfg.out.short]
    for seed, (m, n, k) in enumerate(SHAPES):
        shape = (_rows(m, cfg), n, k)
        err, untouched = emulate(exes[cfg], cfg, shape, where, seed=seed)
        assert err <= gate and untouched, (shape, err)
    # a batch of 3, B shared (stride 0), alpha and beta, rows padded (no 16-byte vectors)
    err, untouched = emulate(exes[cfg], cfg, (_rows(33, cfg), 45, 200), where, batch=3,
                             alpha=0.5, beta=2.0, pads=(3, 5, 1), broadcast_b=True, seed=7)
    assert err <= gate and untouched, err
    err, untouched = emulate(exes[cfg], cfg, (7, 64, 512), where, batch=2, alpha=-1.5,
                             beta=0.5, pads=(8, 8, 2), seed=8)
    assert err <= gate and untouched, err


def test_the_emulation_catches_a_cluster_sum_without_its_barrier(emulated, tmp_path):
    """A cluster's blocks run together: without the barrier after each block's own sum,
    a peer reads its partial tile before it is written (shared memory starts as NaN)."""
    cfg = next(c for c in EMULATED if c.cluster)
    src = emulation_source(cfg)
    good = "cluster.sync();  // every block's partial tile is in its red[0] (release / acquire)"
    assert good in src
    racy = build(cfg, tmp_path, src.replace(good, ""), "racy")
    errs = [emulate(racy, cfg, (16, 200, 300), tmp_path, seed=s)[0] for s in range(3)]
    assert not all(e <= _GATE[cfg.out.short] for e in errs), errs


def test_the_emulation_catches_a_wrong_fragment(emulated, tmp_path):
    """The emulation is a test that can fail: A's rows g and g+8 swapped in the mma."""
    cfg = EMULATED[0]
    src = emulation_source(cfg)
    good = "mma_16816(acc[i][j], as[2 * i][2 * u], as[2 * i + 1][2 * u],"
    assert good in src
    bad = build(cfg, tmp_path, src.replace(good, "mma_16816(acc[i][j], as[2 * i + 1][2 * u], "
                                                 "as[2 * i][2 * u],"), "bad")
    err, _ = emulate(bad, cfg, (16, 64, 256), tmp_path)
    assert err > 0.1


def test_the_emulation_catches_a_chunk_read_before_it_lands(emulated, tmp_path):
    """The shared-memory ring's wait one group short: its chunk is read before its copies
    have landed (the emulation lands them at the wait that retires their group)."""
    cfg = next(c for c in EMULATED if c.is_async)
    src = emulation_source(cfg)
    good = "ring_wait<STAGES - 1>();"
    assert good in src
    early = build(cfg, tmp_path, src.replace(good, "ring_wait<STAGES>();"), "early")
    err, _ = emulate(early, cfg, (16, 64, 1024), tmp_path)
    assert not err <= _GATE[cfg.out.short], err


# ---- the bench's candidates (bench/decode_roof.py; it times them on a GPU) -----------------
def _bench():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "decode_roof.py"
    spec = importlib.util.spec_from_file_location("decode_roof", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_times_valid_candidates_of_each_shape():
    bench = _bench()
    assert bench.SHAPES == [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 14336),
                            (16, 14336, 4096), (1, 8192, 28672)]
    from codegen.families import wgmma

    for shape in bench.SHAPES:
        for epilogue in (False, True):
            every = bench.candidates(shape, DType.BF16, epilogue)
            cs = [c for c in every if isinstance(c, DecodeConfig)]
            tc = [c for c in every if isinstance(c, wgmma.WgmmaConfig)]
            assert len(cs) >= 10 and len(tc) >= 10 and len(cs) + len(tc) == len(every), shape
            assert all(not check(c, ARCH) and not problem_reasons(c, shape, ARCH) for c in cs)
            # the wgmma family's: a 64-row tile, split-K (where the tiles alone leave SMs
            # idle) bringing the work items to 66-264
            assert all(not wgmma.check_wgmma(c, ARCH) and not wgmma.problem_reasons(c, shape)
                       and c.bm == 64 and (c.split == 1 or c.tiles(*shape[:2]) < 132)
                       and 66 <= c.tiles(*shape[:2]) * c.split <= 264 for c in tc)
            assert {Variant.of(c) for c in every} == {Variant(
                Layout.NT, DType.BF16, *(("out", "gelu") if epilogue else ("none", "none")))}
    # M = 1: the FMA path and the smallest mma tile; split-K by the last block, across a
    # cluster and by a pass where the panels leave SMs idle (4096 columns: 128 panels of
    # 32), none where they do not (14336 columns: 448 panels of 32, 112 of 128)
    one = [c for c in bench.candidates((1, 4096, 4096), DType.F16) if isinstance(c, DecodeConfig)]
    assert {(c.math, c.mt) for c in one} == {("fma", 1), ("mma", 16)}
    assert {c.reduce for c in one if c.split > 1} == {"last", "cluster", "pass"}
    assert all(c.split <= 8 for c in one if c.cluster)
    wide = [c for c in bench.candidates((16, 14336, 4096), DType.F16)
            if isinstance(c, DecodeConfig)]
    assert {c.split for c in wide if c.bn == 32} == {1}
    assert {c.split for c in wide if c.bn == 128} == {1, 2, 4}
    # --wave-tiles: N tiles whose panels fill one or two waves of the 132 SMs
    assert bench.wave_tiles((16, 14336, 4096)) == [(112, 4, 1), (112, 8, 1), (56, 4, 1),
                                                   (56, 8, 1)]
    assert bench.wave_tiles((1, 8192, 28672)) == []  # 64 and 32: the fixed tiles
    waved = [c for c in bench.candidates((16, 14336, 4096), DType.F16, waves=True)
             if isinstance(c, DecodeConfig)]
    assert waved[:len(wide)] == wide and {c.bn for c in waved[len(wide):]} == {112, 56}
    assert all(not check(c, ARCH) for c in waved)
    # both rings; --prefetch-b: each decode candidate and its prefetching twin, all valid
    assert {(c.ring, c.stages) for c in one} == set(bench.RINGS)
    twins = [c for c in bench.candidates((1, 4096, 4096), DType.F16, prefetch_b=(1, 2))
             if isinstance(c, DecodeConfig)]
    assert twins[::3] == one and all(
        (r, l2) == (dataclasses.replace(c, prefetch_b=1), dataclasses.replace(c, prefetch_b=2))
        for c, r, l2 in zip(twins[::3], twins[1::3], twins[2::3]))
    assert all(not check(c, ARCH) for c in twins)


def test_the_bench_lists_without_a_gpu_and_refuses_bad_arguments(capsys):
    bench = _bench()
    assert bench.main(["--list", "--shapes", "16x4096x4096", "--dtypes", "f16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("f16 16x4096x4096: ") and "gemm_decode_f16_mma16x" in out
    assert bench.main(["--list", "--shapes", "16x4096x4096", "--dtypes", "f16",
                       "--prefetch-b", "l2"]) == 0
    out = capsys.readouterr().out
    assert "_pbl_nt_of16" in out and "_pb_nt_of16" not in out
    for argv in (["--list", "--shapes", "16x4096"], ["--list", "--shapes", "0x1x1"],
                 ["--list", "--dtypes", "f32"], ["--list", "--candidates", "gemm_nope"],
                 ["--list", "--prefetch-b", "l3"]):
        assert bench.main(argv) == 2, argv
        assert capsys.readouterr().err.startswith("decode_roof: ")
