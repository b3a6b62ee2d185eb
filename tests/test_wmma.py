"""The WMMA (tensor-core) family on the CPU: names, validation, rendering, compiling.

Not yet run on a GPU (no device time was left in the session that wrote it): correctness
and speed are the next GPU session's work, and the tuner does not search it yet.
"""

import random

import pytest
from _golden import rendered_as_golden

from codegen import DType, UsageError, check, compile_many, render
from codegen.compile import compile_config
from codegen.config import DEFAULT_WMMA, WmmaConfig, config_from_name

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
])
def test_invalid_wmma_configs_say_why(cfg, arch, reason):
    assert any(reason in r for r in check(cfg, arch)), check(cfg, arch)


def test_golden_wmma_source():
    cfg = WmmaConfig(bm=64, bn=64, bk=32, wm=32, wn=32, stages=2, swizzle=1)
    src = rendered_as_golden(cfg)
    assert "wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);" in src
    assert "cp_async_bytes<VEC * ES>(dst, src);" in src


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


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_wmma_sample_compiles(arch, compile_cache):
    results = dict(compile_many(wmma_sample(), arch, jobs=2, cache_dir=compile_cache))
    failed = {c.name: r.error for c, r in results.items() if not r.ok}
    assert not failed, failed
    assert all(r.resources.registers > 0 for r in results.values())
