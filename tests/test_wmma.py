"""The WMMA (tensor-core) family on the CPU: names, validation, rendering, compiling.

Not yet run on a GPU (no device time was left in the session that wrote it): correctness
and speed are the next GPU session's work, and the tuner does not search it yet.
"""

import dataclasses
import random

import pytest
from _golden import rendered_as_golden

from codegen import DType, UsageError, check, compile_many, render
from codegen.compile import compile_config
from codegen.config import DEFAULT_WMMA, Layout, WmmaConfig, config_from_name
from codegen.families import family_of

VALUES = {
    "bm": (32, 64, 128, 256), "bn": (32, 64, 128, 256), "bk": (16, 32, 64),
    "wm": (16, 32, 64), "wn": (16, 32, 64), "stages": (1, 2, 3, 4), "swizzle": (1, 8),
    "dtype": (DType.F16, DType.BF16, DType.TF32),
}
PER_TYPE = {  # skew and vector width depend on the element size
    DType.F16: dict(skew=(0, 8, 16), vec=(2, 4, 8)),
    DType.BF16: dict(skew=(0, 8, 16), vec=(2, 4, 8)),
    DType.TF32: dict(skew=(0, 4, 8), vec=(1, 2, 4)),
}


def _draw(rng, **fixed):
    p = {k: rng.choice(v) for k, v in VALUES.items()}
    p.update(fixed)
    p.update({k: rng.choice(v) for k, v in PER_TYPE[p["dtype"]].items() if k not in fixed})
    return WmmaConfig(**p)


def wmma_sample(n=30, seed=7):
    """>= n configs valid on sm_80 and sm_90 that cover every value of every parameter."""
    rng = random.Random(seed)
    ok = lambda c: not check(c, "sm_80") and not check(c, "sm_90")
    chosen = []
    wanted = [(k, v) for k, vs in VALUES.items() for v in vs]
    wanted += [(k, v, d) for d, kv in PER_TYPE.items() for k, vs in kv.items() for v in vs]
    for want in wanted:
        for _ in range(100000):
            c = _draw(rng, **({want[0]: want[1]} if len(want) == 2
                              else {"dtype": want[2], want[0]: want[1]}))
            if ok(c):
                chosen.append(c)
                break
        else:
            raise AssertionError(f"no valid WMMA configuration has {want}")
    while len(chosen) < n:
        c = _draw(rng)
        if ok(c) and c not in chosen:
            chosen.append(c)
    return chosen


def test_name_is_pinned_and_round_trips():
    assert DEFAULT_WMMA.name == "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8"
    c = WmmaConfig(bm=64, bn=256, bk=16, wm=32, wn=64, skew=4, vec=4, stages=2, swizzle=1,
                   dtype=DType.TF32)
    assert c.name == "gemm_wmma_tf32_64x256x16_w32x64_p4_v4_s2_g1"
    assert config_from_name(c.name) == c
    assert config_from_name("gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8").family.value == "simt"
    with pytest.raises(UsageError):
        WmmaConfig.from_name("gemm_wmma_f99_1x1x1_w1x1_p0_v1_s1_g1")


@pytest.mark.parametrize("cfg,name", [
    (WmmaConfig(layout=Layout.NT, out=DType.F16, bias="out", act="gelu"),
     "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8_nt_of16_bias_gelu"),
    (WmmaConfig(dtype=DType.BF16, layout=Layout.TN, out=DType.BF16, stages=1),
     "gemm_wmma_bf16_128x128x32_w64x32_p8_v8_s1_g8_tn_obf16"),
    (WmmaConfig(dtype=DType.TF32, bk=16, vec=4, skew=4, layout=Layout.TT, act="relu"),
     "gemm_wmma_tf32_128x128x16_w64x32_p4_v4_s3_g8_tt_relu"),
    (WmmaConfig(out=DType.BF16, bias="f32", act="gelu_tanh"),
     "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8_obf16_biasf32_gelut"),
])
def test_layout_and_epilogue_names_round_trip(cfg, name):
    assert cfg.name == name
    assert config_from_name(name) == cfg == WmmaConfig.from_dict(cfg.to_dict())


def test_every_layout_and_epilogue_is_buildable():
    """The spec takes every layout and epilogue (check refused them before the template
    read them); the bias of C's type, or fp32 beside a 2-byte C."""
    spec = family_of(DEFAULT_WMMA)
    assert spec.layouts == frozenset(Layout) and spec.epilogue
    for layout in Layout:
        for out in (DType.F32, DType.F16, DType.BF16):
            for bias in ("none", "out") + (("f32",) if out is not DType.F32 else ()):
                for act in ("none", "relu", "gelu", "gelu_tanh", "silu"):
                    cfg = WmmaConfig(layout=layout, out=out, bias=bias, act=act)
                    assert check(cfg, "sm_90") == [], (cfg.name, check(cfg, "sm_90"))


def test_shared_memory_follows_each_operands_storage_order():
    """A row-major tile is BM x (BK + skew) (A) or BK x (BN + skew) (B); a column-major
    one is BK x (BM + skew) (A) or BN x (BK + skew) (B); the epilogue scratch is the same."""
    c = dict(bm=64, bn=128, bk=32, wm=32, wn=64, skew=8, stages=2)
    a_row, a_col = 64 * 40, 32 * 72
    b_row, b_col = 32 * 136, 128 * 40
    for layout, elems in ((Layout.NN, a_row + b_row), (Layout.NT, a_row + b_col),
                          (Layout.TN, a_col + b_row), (Layout.TT, a_col + b_col)):
        cfg = WmmaConfig(layout=layout, **c)
        assert cfg.pipeline_bytes == 2 * elems * 2, layout
        assert cfg.smem_bytes == max(cfg.pipeline_bytes, cfg.epilogue_bytes)
        v = cfg.template_values()
        assert (v["LDA_S"], v["LDB_S"]) == ((72 if cfg.a_col else 40), (40 if cfg.b_col else 136))
        assert f"static_assert({cfg.pipeline_bytes} == STAGES * (A_ROWS * LDA_S" in render(cfg)


@pytest.mark.parametrize("cfg,arch,reason", [
    (WmmaConfig(dtype=DType.F32), "sm_90", "the wmma family takes f16, bf16 or tf32 inputs"),
    (WmmaConfig(dtype=DType.BF16, stages=1), "sm_75", "bf16 tensor cores need sm_80 or newer"),
    (WmmaConfig(stages=3), "sm_75", "cp.async stages (3) need sm_80 or newer; sm_75 has none"),
    (WmmaConfig(wm=24), "sm_90", "warp tile 24x32 is not made of 16x16 fragments"),
    (WmmaConfig(bn=80), "sm_90", "warp tile 64x32 does not divide the block tile 128x80"),
    (WmmaConfig(dtype=DType.TF32, bk=20, vec=4, skew=4), "sm_90",
     "BK=20 is not a multiple of the tf32 fragment depth 8"),
    (WmmaConfig(vec=16), "sm_90", "vector width 16 x 2 B is not a 4, 8 or 16 byte copy"),
    (WmmaConfig(skew=4), "sm_90", "skew 4 x 2 B must keep shared rows 16-byte aligned"),
    (WmmaConfig(bm=256, bn=256, wm=32, wn=16), "sm_90",
     "4096 threads per block exceeds the limit of 1024"),  # 8 x 16 warps
    (WmmaConfig(bm=32, bn=32, bk=16, wm=16, wn=16), "sm_90",
     "128 threads cannot load the 32x16 A tile evenly in vectors of 8"),
    (WmmaConfig(bm=128, bn=128, wm=128, wn=64), "sm_90",
     "the 128x64 warp tile holds 256 accumulator registers per thread, over 128"),
    (WmmaConfig(bm=256, bn=256, bk=64, stages=4, wm=64, wn=64), "sm_90",
     # 4 stages x (256 x 72 + 64 x 264) halves x 2 B
     "shared memory 282624 B exceeds the 232448 B per-block limit of sm_90"),
    # fits as NN (3 x (256 x 80 + 64 x 272) x 2 B = 227328 B), not with B column-major:
    # 3 x (256 x 80 + 256 x 80) x 2 B
    (WmmaConfig(bm=256, bn=256, bk=64, skew=16, stages=3, wm=64, wn=64, layout=Layout.NT),
     "sm_90", "shared memory 245760 B exceeds the 232448 B per-block limit of sm_90"),
    # a column-major A tile is BK rows of BM: 32 x 16 / 8 = 64 vectors for 128 threads
    (WmmaConfig(bm=32, bn=32, bk=16, wm=16, wn=16, layout=Layout.TN), "sm_90",
     "128 threads cannot load the 16x32 A tile evenly in vectors of 8"),
    (WmmaConfig(out=DType.TF32), "sm_90", "C cannot be tf32"),
    (WmmaConfig(bias="f32"), "sm_90", "an fp32 bias with fp32 C is bias='out'"),
    (WmmaConfig(act="tanh"), "sm_90", "activation 'tanh' is not one of"),
])
def test_invalid_wmma_configs_say_why(cfg, arch, reason):
    assert any(reason in r for r in check(cfg, arch)), check(cfg, arch)


def test_the_shared_memory_limit_depends_on_the_layout():
    """The NT tile of test_invalid_wmma_configs_say_why fits as NN and TN (the 512 threads of
    its 64x64 warp tiles leave each 128 registers: it is refused for that alone)."""
    fits = WmmaConfig(bm=256, bn=256, bk=64, skew=16, stages=3, wm=64, wn=64)
    assert fits.smem_bytes == 227328
    spill = ["the 64x64 warp tile needs at least 176 registers per thread (128 accumulators); "
             "a block of 512 threads leaves each 128: it would spill"]
    assert check(fits, "sm_90") == spill
    assert check(dataclasses.replace(fits, layout=Layout.TN), "sm_90") == spill


def test_golden_wmma_source():
    cfg = WmmaConfig(bm=64, bn=64, bk=32, wm=32, wn=32, stages=2, swizzle=1)
    src = rendered_as_golden(cfg)
    assert "wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);" in src
    assert "cp_async_bytes<VEC * ES>(d, s);" in src


@pytest.mark.parametrize("cfg", [
    # x @ W.t(): B column-major, fp16 C with a bias of its type and the erf GELU
    WmmaConfig(layout=Layout.NT, out=DType.F16, bias="out", act="gelu"),
    # A column-major, bf16 C, synchronous loads
    WmmaConfig(dtype=DType.BF16, layout=Layout.TN, out=DType.BF16, stages=1),
    # both column-major, tf32 fragments, fp32 C (stored straight from registers) with relu
    WmmaConfig(dtype=DType.TF32, bm=64, bn=128, bk=32, wm=32, wn=64, vec=4, skew=4,
               stages=2, swizzle=1, layout=Layout.TT, act="relu"),
])
def test_golden_layout_and_epilogue_sources(cfg):
    rendered_as_golden(cfg)


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
def test_each_operand_is_read_in_its_storage_order(layout):
    """A column-major operand is copied along its columns and read as a col_major fragment;
    the load's outer index runs over the other dimension (K for A, N for B). bf16 and tf32
    fragments load by wmma.load from the .shared state space (load_matrix_sync's overloads
    for them address shared memory generically), fp16 ones by load_matrix_sync."""
    for dtype, extra in ((DType.F16, {}), (DType.BF16, {}),
                         (DType.TF32, dict(vec=4, skew=4, bk=16))):
        cfg = WmmaConfig(dtype=dtype, layout=layout, **extra)
        src = render(cfg)
        a, b = ("col" if cfg.a_col else "row"), ("col" if cfg.b_col else "row")
        frag = {DType.F16: "__half", DType.BF16: "__nv_bfloat16",
                DType.TF32: "wmma::precision::tf32"}[dtype]
        assert f"using FragA = wmma::fragment<wmma::matrix_a, 16, 16, FK, {frag}, " \
               f"wmma::{a}_major>;" in src
        assert f"using FragB = wmma::fragment<wmma::matrix_b, 16, 16, FK, {frag}, " \
               f"wmma::{b}_major>;" in src
        a_load = ("<BK, BM, LDA_S, A_LOADS>(As + s * A_ROWS * LDA_S, A, lda, k0, K, m0, M"
                  if cfg.a_col else
                  "<BM, BK, LDA_S, A_LOADS>(As + s * A_ROWS * LDA_S, A, lda, m0, M, k0, K")
        b_load = ("<BN, BK, LDB_S, B_LOADS>(Bs + s * B_ROWS * LDB_S, B, ldb, n0, N, k0, K"
                  if cfg.b_col else
                  "<BK, BN, LDB_S, B_LOADS>(Bs + s * B_ROWS * LDB_S, B, ldb, k0, K, n0, N")
        assert f"load_tile{a_load}" in src and f"load_tile{b_load}" in src
        a_frag = "kk * LDA_S + wm0 + i * 16" if cfg.a_col else "(wm0 + i * 16) * LDA_S + kk"
        b_frag = "(wn0 + j * 16) * LDB_S + kk" if cfg.b_col else "kk * LDB_S + wn0 + j * 16"
        assert f"load_a(af[i], as + {a_frag}, LDA_S);" in src
        assert f"load_b(bf[j], bs + {b_frag}, LDB_S);" in src
        if dtype is DType.F16:
            assert src.count("wmma::load_matrix_sync(f, p, ldm);") == 2 and "wmma.load" not in src
        else:
            k = cfg.frag_k
            assert f'"wmma.load.a.sync.aligned.{a}.m16n16k{k}.shared.{dtype.short} ' in src
            assert f'"wmma.load.b.sync.aligned.{b}.m16n16k{k}.shared.{dtype.short} ' in src
            assert "{%0, %1, %2, %3}, [%4], %5;" in src and "load_matrix_sync(f," not in src
        assert (src.count("__float_to_tf32") == 2) == (dtype is DType.TF32)


def test_epilogue_paths_render_what_they_use():
    """fp32 C without a bias keeps the direct store of whole fragments (the activation
    applied in registers); a 2-byte C or a bias stages every fragment; C and the bias have
    their own types."""
    plain = render(DEFAULT_WMMA)
    assert "wmma::store_matrix_sync(c, acc[i][j], ldc, wmma::mem_row_major);" in plain
    assert "activate(acc[i][j].x[e])" not in plain
    assert "float beta, OutT* __restrict__ C" in plain and "using OutT = float;" in plain
    relu = render(WmmaConfig(act="relu"))
    assert "acc[i][j].x[e] = activate(acc[i][j].x[e]);" in relu
    assert "return x < 0.0f ? 0.0f : x;" in relu
    for cfg, out_t, bias_t in ((WmmaConfig(out=DType.F16), "__half", "float"),
                               (WmmaConfig(bias="out"), "float", "float"),
                               (WmmaConfig(out=DType.BF16, bias="f32", act="silu"),
                                "__nv_bfloat16", "float")):
        src = render(cfg)
        assert "wmma::store_matrix_sync(c," not in src and "c_direct" not in src, cfg.name
        assert f"using OutT = {out_t};" in src and f"using BiasT = {bias_t};" in src
        assert f"{out_t}* C, int ldc, long long sC, const {bias_t}* bias)" in src  # the header
        assert "finish_store<CV, true>(c + h, v + h, beta, bias, gn + sc + h, N, c_vec);" in src
    both = render(WmmaConfig(dtype=DType.BF16, out=DType.F16))
    assert "#include <cuda_fp16.h>" in both and "#include <cuda_bf16.h>" in both
    assert "cuda_bf16" not in render(WmmaConfig(dtype=DType.TF32, vec=4, skew=4, out=DType.F16))


def test_tf32_converts_its_fragments():
    src = render(WmmaConfig(dtype=DType.TF32, bk=16, vec=4, skew=4))
    assert "wmma::precision::tf32" in src and "__float_to_tf32" in src and "using T = float;" in src
    assert "__float_to_tf32" not in render(DEFAULT_WMMA)


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16, DType.TF32])
def test_default_of_each_type_compiles_without_spills(dtype, compile_cache):
    cfg = WmmaConfig(dtype=dtype, **({"vec": 4, "skew": 4, "bk": 16} if dtype is DType.TF32 else {}))
    for arch in ("sm_80", "sm_90"):
        r = compile_config(cfg, arch, compile_cache)
        assert r.ok, r.error
        assert r.resources.spill_bytes == 0 and r.resources.smem == cfg.smem_bytes


def test_sample_covers_every_value():
    sample = wmma_sample()
    assert len(sample) >= 30
    for k, vs in VALUES.items():
        assert {getattr(c, k) for c in sample} == set(vs), k
    for d, kv in PER_TYPE.items():
        for k, vs in kv.items():
            assert {getattr(c, k) for c in sample if c.dtype is d} == set(vs), (d, k)


def epilogue_sample():
    """A dozen configs: every (layout, C type) pair once, and among them every epilogue
    (none, or a bias with each activation; both bias types of a 2-byte C), stages 1 and 3,
    every input type and both architectures (the config's index picks the arch)."""
    epis = [("none", "none"), ("out", "relu"), ("f32", "gelu"), ("out", "gelu_tanh"),
            ("f32", "silu")]
    dtypes = (DType.F16, DType.BF16, DType.TF32)
    chosen = []
    for i, (layout, out) in enumerate((l, o) for l in Layout
                                      for o in (DType.F32, DType.F16, DType.BF16)):
        bias, act = epis[i % len(epis)]
        if out is DType.F32 and bias == "f32":
            bias = "out"
        dtype = dtypes[i % 3]
        tf32 = dict(vec=4, skew=4, bk=16) if dtype is DType.TF32 else {}
        chosen.append(WmmaConfig(dtype=dtype, layout=layout, out=out, bias=bias, act=act,
                                 stages=(1, 3)[i // 2 % 2], **tf32))
    return chosen


def test_epilogue_sample_covers_every_value():
    sample = epilogue_sample()
    assert len(sample) == 12
    assert {(c.layout, c.out) for c in sample} == {(l, o) for l in Layout
                                                  for o in (DType.F32, DType.F16, DType.BF16)}
    assert {c.act for c in sample} == {"none", "relu", "gelu", "gelu_tanh", "silu"}
    assert {c.bias for c in sample} == {"none", "out", "f32"}
    assert all((c.bias == "none") == (c.act == "none") for c in sample)
    assert {c.stages for c in sample} == {1, 3} and {c.dtype for c in sample} == {
        DType.F16, DType.BF16, DType.TF32}
    for arch in ("sm_80", "sm_90"):
        assert not any(check(c, arch) for c in sample)
    assert {c.layout for c in sample[0::2]} == {c.layout for c in sample[1::2]} == set(Layout)


def test_epilogue_sample_compiles_without_spills(compile_cache):
    """Each of the dozen on one of sm_80 / sm_90 (alternating): no error, no spill, the
    shared memory it launches with."""
    sample = epilogue_sample()
    results = {}
    for k, arch in enumerate(("sm_80", "sm_90")):
        results.update((c, r) for c, r in compile_many(sample[k::2], arch, jobs=2,
                                                       cache_dir=compile_cache))
    assert len(results) == 12
    failed = {c.name: r.error for c, r in results.items() if not r.ok}
    assert not failed, failed
    spilled = {c.name: r.resources.spill_bytes for c, r in results.items()
               if r.resources.spill_bytes}
    assert not spilled, spilled
    assert all(r.resources.smem == c.smem_bytes for c, r in results.items())


def _compiles(sample, arch, compile_cache) -> None:
    results = dict(compile_many(sample, arch, cache_dir=compile_cache))
    failed = {c.name: r.error for c, r in results.items() if not r.ok}
    assert not failed, failed
    assert all(r.resources.registers > 0 for r in results.values())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_wmma_sample_compiles(arch, compile_cache):
    """A subset of the sample holding every value of every field the sample has
    (tests/_sample.covering) compiles for each architecture; the whole sample compiles on
    the GPU machine (below), whose cores do it in seconds where CI's two take minutes."""
    from _sample import covering

    whole = wmma_sample()
    sample = covering(whole)
    fields = [f.name for f in dataclasses.fields(whole[0])]
    assert len(sample) < len(whole) and all(
        {getattr(c, f) for c in sample} == {getattr(c, f) for c in whole} for f in fields)
    _compiles(sample, arch, compile_cache)


@pytest.mark.gpu
def test_the_whole_wmma_sample_compiles_for_the_gpus_architecture(compile_cache):
    from tuner.gpu import device

    _compiles(wmma_sample(), device().sm, compile_cache)


def test_the_register_floor_refuses_exactly_the_tiles_that_spill(compile_cache):
    """check refuses a warp tile whose accumulators plus MIN_OTHER_REGS exceed what its
    block leaves a thread; ptxas agrees on each side of that line: the refused spill, the
    accepted compile without spilling."""
    from codegen.arch import parse_arch

    names = ["gemm_wmma_f16_128x256x64_w32x32_p16_v8_s2_g1_nt_of16",  # 1024 threads: cap 64
             "gemm_wmma_bf16_256x256x32_w64x32_p8_v8_s2_g1_obf16",
             "gemm_wmma_f16_256x256x16_w64x64_p16_v8_s3_g8_nt_of16",  # 512: cap 128
             "gemm_wmma_f16_256x128x64_w64x32_p16_v8_s3_g8_nt_of16",  # 512, 112 of 128
             "gemm_wmma_bf16_128x128x64_w32x32_p16_v8_s2_g8_obf16"]  # 512, 80 of 128
    cfgs = [WmmaConfig.from_name(n) for n in names]
    refused = [bool(check(c, "sm_90")) for c in cfgs]
    assert refused == [True, True, True, False, False]
    assert all(any("it would spill" in w for w in check(c, "sm_90")) for c, r in
               zip(cfgs, refused) if r)
    arch = parse_arch("sm_90")
    for c, r in compile_many(cfgs, "sm_90", cache_dir=compile_cache):
        assert r.ok, r.error
        assert bool(r.resources.spill_bytes) == bool(check(c, "sm_90")), (c.name, r.resources)
        assert r.resources.registers <= c.register_cap(arch)
