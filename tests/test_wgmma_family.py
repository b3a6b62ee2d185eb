"""The wgmma (Hopper, sm_90a) family on the CPU: names, validation, rendering, compiling,
SASS, the host-side TMA rules and the GPU probe's non-GPU parts.

Correctness and speed on a GPU are bench/wgmma_probe.py's (run by hand on an H200).
"""

import collections
import ctypes
import dataclasses
import itertools
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from _golden import rendered_as_golden

from tuner.commands import find_cuobjdump

from codegen import DType, UsageError, compile_many, render
from codegen.compile import arch_target, compile_config
from codegen.config import Family
from codegen.families import FAMILIES
from codegen.families._common import Layout, Variant
from codegen.families.wgmma import (DEFAULT_WGMMA, WGMMA_SPACE, WgmmaConfig, check_wgmma, sample_wgmma,
                           tma_reasons)
from tuner.runtime.errors import TmaUnsupported
from tuner.runtime.tma import tensor_map_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import wgmma_probe  # noqa: E402


# ---- identity ------------------------------------------------------------------------
#: the TMA-store epilogue's slice loop is rendered three times: for beta != 0 (reading C), for
#: beta = 0 (no per-element test) and for beta = 0 with alpha = 1 (no multiply either); each
#: issues one UTMASTG per slice
TS_COPIES = 3

def test_name_is_pinned_and_round_trips():
    assert DEFAULT_WGMMA.name == "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8"
    c = WgmmaConfig(bm=64, bn=192, stages=6, consumers=1, cluster=2, persistent=0, group=16,
                    dtype=DType.BF16)
    assert c.name == "gemm_wgmma_bf16_64x192x64_c1_s6_x2_p0_g16"
    assert WgmmaConfig.from_name(c.name) == c
    assert WgmmaConfig.from_dict(c.to_dict()) == c
    assert c.to_dict()["family"] == "wgmma" and c.to_dict()["dtype"] == "bf16"
    pp = WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1)
    assert pp.name == "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp"
    assert WgmmaConfig.from_name(pp.name) == pp and WgmmaConfig.from_dict(pp.to_dict()) == pp
    xn = dataclasses.replace(pp, cluster=2, cluster_n=1, store=1, out=DType.F16)
    assert xn.name == "gemm_wgmma_f16_128x128x64_c2_s5_x2n_p1_g8_pp_ts_of16"
    assert WgmmaConfig.from_name(xn.name) == xn and WgmmaConfig.from_dict(xn.to_dict()) == xn
    assert Family.WGMMA.template == "gemm_wgmma.cu.j2"
    for bad in ("gemm_wgmma_f99_64x64x64_c1_s4_x1_p0_g1", "gemm_wgmma_f16_64x64x64_c1_s4_p0_g1",
                "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8"):
        with pytest.raises(UsageError):
            WgmmaConfig.from_name(bad)


def test_derived_geometry():
    c = DEFAULT_WGMMA  # 128 x 256, two consumers of 64 rows, 4 stages
    assert c.threads == 384 and c.block() == (384, 1, 1) and c.wm == 64
    assert c.stage_bytes == 128 * 64 * 2 + 64 * 256 * 2 == 49152
    assert c.smem_bytes == 1024 + 4 * 49152 + 1024 == 198656
    assert c.smem_bytes % 1024 == 0
    assert c.acc_regs == 128 and c.launch_regs == 168 and c.consumer_regs == 232
    assert c.setmaxnreg_inc
    one = WgmmaConfig(bm=128, bn=128, consumers=1)
    assert one.threads == 256 and one.launch_regs == 255 and not one.setmaxnreg_inc
    assert c.tma_boxes() == {"A": (128, 64), "B": (64, 64)}
    assert dataclasses.replace(c, cluster=2).tma_boxes() == {"A": (128, 64), "B": (32, 64)}
    # 4096 x 4096: 32 x 16 tiles; persistent caps at the SMs, clusters count in pairs
    assert dataclasses.replace(c, persistent=0).grid(4096, 4096) == (512, 1, 1)
    assert c.grid(4096, 4096, sms=132) == (132, 1, 1)
    cl = dataclasses.replace(c, cluster=2)
    assert cl.tiles(4095, 4097) == 16 * 17 and cl.grid(4095, 4097, 132) == (132, 1, 1)
    assert dataclasses.replace(cl, persistent=0).grid(100, 1, 132) == (2, 1, 1)
    assert cl.cluster_dims() == (2, 1, 1) and c.cluster_dims() == (1, 1, 1)
    assert c.grid(1, 1) == (1, 1, 1)
    # ping-pong: each consumer owns the whole 128 x 128 tile, one release per stage
    pp = WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1)
    assert pp.wm == 128 and pp.acc_regs == 128 and pp.threads == 384
    v = pp.template_values()
    assert v["M_WGMMAS"] == 2 and v["EMPTY_ARRIVALS"] == 1 and v["PINGPONG"] == 1
    assert c.template_values()["EMPTY_ARRIVALS"] == 2
    assert pp.grid(4096, 4096) == (132, 1, 1) and pp.grid(256, 256) == (4, 1, 1)


def test_pingpong_reasons_say_what_it_needs():
    assert check_wgmma(WgmmaConfig(bm=128, bn=128, pingpong=1), "sm_90") == []
    assert check_wgmma(WgmmaConfig(bm=128, bn=128, pingpong=1, persistent=0, cluster=2),
                       "sm_90") == ["pingpong=1 needs persistent=1: a block takes several tiles "
                                    "(it has persistent=0)"]
    # in a cluster (either way) each block's consumer of a stage releases it in both blocks
    for cn in (0, 1):
        ppc = WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1, cluster=2, cluster_n=cn)
        assert check_wgmma(ppc, "sm_90") == []
        assert ppc.template_values()["EMPTY_ARRIVALS"] == 2
    assert check_wgmma(WgmmaConfig(bm=128, bn=128, pingpong=1, consumers=1), "sm_90")[0] == (
        "pingpong=1 needs two consumers (it has consumers=1)")
    # the whole 128 x 256 tile per consumer: 256 accumulators a thread
    assert "256 accumulators" in check_wgmma(WgmmaConfig(pingpong=1), "sm_90")[0]
    assert check_wgmma(WgmmaConfig(bm=256, bn=64, pingpong=1), "sm_90") == [
        "BM=256: each ping-pong consumer owns the whole tile, and its rows must be 64 or 128 "
        "(wgmma's M is 64)"]
    # tf32 with nothing converted in the main loop (the pre-pass, TMA's rounding, registers);
    # in-loop conversion keeps its consumers in step with a named barrier: no ping-pong
    tf = dict(dtype=DType.TF32, bk=32, stages=4, pingpong=1)
    for prep, layout, bm, bn in ((1, Layout.TN, 128, 128), (2, Layout.NT, 128, 128),
                                 (3, Layout.TT, 64, 256)):  # (128 rows: fragments too)
        assert check_wgmma(WgmmaConfig(bm=bm, bn=bn, prep=prep, layout=layout, **tf), "sm_90") == []
    swap = WgmmaConfig(bm=256, bn=64, prep=3, **tf)  # NN: each consumer all 64 columns
    assert check_wgmma(swap, "sm_90") == [] and (swap.wm, swap.mma_n) == (64, 256)
    assert check_wgmma(dataclasses.replace(swap, bn=256, stages=3), "sm_90")[0].startswith(
        "BN=256: each ping-pong consumer owns the whole tile, and its columns")
    assert check_wgmma(WgmmaConfig(bm=128, bn=128, **tf), "sm_90") == [
        "pingpong=1 needs fp16 or bf16 data, or tf32 with nothing converted in the main loop "
        "(prep 1-3) (it has tf32, prep=0)"]


# ---- validation -----------------------------------------------------------------------
@pytest.mark.parametrize("cfg,arch,reason", [
    (WgmmaConfig(), "sm_80", "wgmma, TMA and setmaxnreg need sm_90a; sm_80 has none"),
    (WgmmaConfig(dtype=DType.F32, bk=32), "sm_90",
     "f32 in the wgmma family is 3xTF32 only (terms=3)"),
    (WgmmaConfig(dtype=DType.TF32), "sm_90",
     "BK=64 x 4 B = 256 B per row; the 128B swizzle needs 128 (BK=32)"),
    (WgmmaConfig(terms=3), "sm_90", "terms=3 (3xTF32) splits fp32 data: dtype f32, not f16"),
    (WgmmaConfig(dtype=DType.F32, bk=32, terms=2), "sm_90", "terms=2: 1 product, or 3 (3xTF32)"),
    (WgmmaConfig(dtype=DType.TF32, bk=32, stages=1), "sm_90",
     "stages=1: fp32 data needs 2 or more"),
    (WgmmaConfig(dtype=DType.TF32, bk=32, bn=80), "sm_90",
     "BN=80 is not a multiple of 32, the width of one 128-byte swizzled B box"),
    (WgmmaConfig(dtype=DType.F32, bk=32, terms=3, bm=128, bn=256, stages=2), "sm_90",
     # 1024 + 2 x (16384 A + 32768 B + 32768 Bt + 16384 As + 32768 Bts) + 1024
     "shared memory 264192 B (2 stages of 131072 B) exceeds the 232448 B per-block opt-in"),
    (WgmmaConfig(dtype=DType.F32, bk=32, terms=3, bm=128, bn=256, stages=2), "sm_90",
     "the 64x256 consumer tile holds 256 accumulators per thread (partial sums and totals: "
     "3xTF32); with 72 more that is over the 232 registers"),
    (WgmmaConfig(dtype=DType.TF32, bk=32, bm=128, bn=256, stages=3), "sm_90",
     # 1024 + 3 x (16384 A + 32768 B + 32768 Bt) + 1024 (48 B of barriers, rounded up)
     "shared memory 247808 B (3 stages of 81920 B) exceeds the 232448 B"),
    (WgmmaConfig(bn=260), "sm_90", "BN=260 is not one of wgmma's N: a multiple of 8 up to 256"),
    (WgmmaConfig(bn=100), "sm_90", "BN=100 is not one of wgmma's N"),
    (WgmmaConfig(bn=200), "sm_90", "BN=200 is not a multiple of 64, the width of one 128-byte"),
    (WgmmaConfig(bn=112, layout=Layout.NT, store=1), "sm_90",
     "BN=112: the TMA-store epilogue writes C in 32-column slices, and 112 is not a multiple "
     "of 32"),
    (WgmmaConfig(bn=120, layout=Layout.NT, cluster=2), "sm_90",
     "BN=120 rows of a K-major B split over a cluster of 2 into 60-row halves, not whole "
     "8-row swizzle atoms"),
    (WgmmaConfig(bk=32), "sm_90", "BK=32 x 2 B = 64 B per row; the 128B swizzle needs 128 (BK=64)"),
    (WgmmaConfig(bm=96), "sm_90", "BM=96 gives each of the 2 consumer warpgroups 48 rows"),
    (WgmmaConfig(bm=512, consumers=2), "sm_90", "BM=512 rows exceed the 256 of one TMA box"),
    (WgmmaConfig(consumers=3, bm=192), "sm_90", "consumers=3: one or two wgmma warpgroups"),
    (WgmmaConfig(cluster=4), "sm_90", "cluster=4: 1, or 2 blocks sharing B (or A: cluster_n)"),
    (WgmmaConfig(cluster_n=1), "sm_90",
     "cluster_n=1 lays a cluster's blocks along N; it needs cluster=2"),
    (WgmmaConfig(cluster=2, cluster_n=2), "sm_90",
     "cluster_n=2 is not 0 (blocks along M) or 1 (along N)"),
    (WgmmaConfig(persistent=2), "sm_90", "persistent=2 is not 0 or 1"),
    (WgmmaConfig(group=0), "sm_90", "raster group 0 must be at least 1"),
    (WgmmaConfig(stages=0), "sm_90", "sizes must be positive (stages=0)"),
    (WgmmaConfig(stages=5), "sm_90",
     # 1024 + 5 x 49152 + 1024 (80 B of barriers, rounded up)
     "shared memory 247808 B (5 stages of 49152 B) exceeds the 232448 B per-block opt-in "
     "limit of sm_90"),
    (WgmmaConfig(bm=256, bn=256, consumers=2, stages=2), "sm_90",
     "the 128x256 consumer tile holds 256 accumulators per thread; with 48 more that is over "
     "the 232 registers a consumer thread gets"),
])
def test_invalid_configs_say_why(cfg, arch, reason):
    why = check_wgmma(cfg, arch)
    assert any(reason in r for r in why), why


def test_default_and_space_values_are_buildable():
    assert check_wgmma(DEFAULT_WGMMA, "sm_90") == []
    assert check_wgmma(DEFAULT_WGMMA, "sm_90a") == []
    keys = list(WGMMA_SPACE)
    valid = [c for vals in itertools.product(*WGMMA_SPACE.values())
             if not check_wgmma(c := WgmmaConfig(**dict(zip(keys, vals))), "sm_90")]
    assert len(valid) > 200
    for k, vs in WGMMA_SPACE.items():  # every searchable value is part of a valid config
        assert {getattr(c, k) for c in valid} == set(vs), k


def test_sample_is_valid_and_covers_the_steps():
    s = sample_wgmma(8)
    assert len(s) == 8 and len(set(s)) == 8
    assert all(check_wgmma(c, "sm_90") == [] for c in s)
    for k in ("consumers", "cluster", "persistent", "dtype", "pingpong", "store"):
        assert {getattr(c, k) for c in s} == set(WGMMA_SPACE[k]), k
    assert sample_wgmma(8) == s  # deterministic


# ---- rendering ------------------------------------------------------------------------
GOLDEN_CFG = WgmmaConfig(bm=128, bn=128, stages=4, consumers=2, cluster=2, persistent=1, group=8)
PINGPONG_GOLDEN = WgmmaConfig(bm=128, bn=128, stages=5, group=8, pingpong=1)
STORE_GOLDEN = dataclasses.replace(DEFAULT_WGMMA, store=1)
#: a 2-byte C staged by stmatrix (store=2), ping-pong, the library's fp16 4096^3 entry's shape
STMATRIX_GOLDEN = WgmmaConfig(bm=128, bn=128, stages=5, group=16, pingpong=1, store=2,
                              out=DType.F16)
#: ping-pong consumers in a cluster along N (A multicast), a column-major A (M-major boxes)
CLUSTER_N_GOLDEN = WgmmaConfig(bm=128, bn=128, stages=5, group=16, pingpong=1, cluster=2,
                               cluster_n=1, store=1, out=DType.F16, layout=Layout.TN)


@pytest.mark.parametrize("cfg", [GOLDEN_CFG, PINGPONG_GOLDEN, STORE_GOLDEN, STMATRIX_GOLDEN,
                                 CLUSTER_N_GOLDEN, dataclasses.replace(
                                     DEFAULT_WGMMA, dtype=DType.TF32, bk=32, bm=256, bn=128,
                                     prep=3), dataclasses.replace(
                                     DEFAULT_WGMMA, dtype=DType.TF32, bk=32, bm=256, bn=128,
                                     prep=3, rs_pairs=1)],
                         ids=lambda c: c.name)
def test_golden_source(cfg):
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(cfg)


def test_header_and_invariants_in_the_source():
    src = render(DEFAULT_WGMMA)
    head = src.splitlines()
    assert head[0] == "// Generated by gemm-tune from templates/gemm_wgmma.cu.j2 - do not edit."
    assert "// Kernel:     gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8" in head
    assert any("dynamic shared memory = 198656 bytes" in l for l in head[:14])
    assert any("block = (384, 1, 1), cluster = (1, 1, 1)" in l for l in head[:14])
    assert 'extern "C" __global__ void __launch_bounds__(THREADS, 1)' in src
    assert "const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB" in src
    assert src.count("static_assert(") >= 9
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in src
    assert " %128, %129, p, 1, 1, 0, 1;" in src  # transpose-B for the N-major B tile
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in src
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in src
    assert "multicast" not in src and "cluster_sync()" not in src and "__syncthreads();" in src
    assert "mbar_init(empty(s), EMPTY_ARRIVALS);" in src and "EMPTY_ARRIVALS = 2;" in src


def test_variants_render_what_they_use():
    one = render(WgmmaConfig(bm=128, bn=128, consumers=1))
    assert "setmaxnreg.dec" in one and "setmaxnreg.inc" not in one
    bf = render(dataclasses.replace(DEFAULT_WGMMA, dtype=DType.BF16, bn=192))
    assert "m64n192k16.f32.bf16.bf16" in bf and "%95}," in bf
    cl = render(dataclasses.replace(DEFAULT_WGMMA, cluster=2))
    assert cl.count("cluster_sync();") == 2 and "multicast::cluster" in cl
    assert "mapa.shared::cluster.u32" in cl and "__trap();" in cl
    assert "constexpr int ES = 2, B_CHUNKS = 4, B_BOX_ROWS = 32;" in cl
    p0, p1 = (render(dataclasses.replace(DEFAULT_WGMMA, persistent=p)) for p in (0, 1))
    assert "grid  = (tiles * 1, 1, 1)" in p0 and "grid  = (min(tiles, SMs / 1) * 1, 1, 1)" in p1


# ---- compiling ------------------------------------------------------------------------
def test_arch_target():
    assert arch_target("sm_90") == ("sm_90", ["-arch=sm_90"])
    assert arch_target("sm_90a") == ("sm_90a", ["-gencode=arch=compute_90a,code=sm_90a"])
    assert arch_target(80) == ("sm_80", ["-arch=sm_80"])


def _probe_set() -> list[WgmmaConfig]:
    """The sample and the probe's configs."""
    return list(dict.fromkeys(sample_wgmma(8) + [WgmmaConfig.from_name(n)
                                                 for n in wgmma_probe.CONFIGS]))


def _compiled(configs, compile_cache, whole: bool) -> dict:
    """`configs` compiled in parallel (on every core) for sm_90a: all of them (`whole`: the
    GPU machine's sixteen cores), else the subset holding every value of every field they
    have (tests/_sample.covering; CI's two cores compile a wgmma kernel in seconds each)."""
    from _sample import covering

    return dict(compile_many(configs if whole else covering(configs), "sm_90",
                             cache_dir=compile_cache))


@pytest.fixture(scope="module")
def compiled(compile_cache):
    return _compiled(_probe_set(), compile_cache, whole=False)


@pytest.mark.gpu
def test_the_whole_probe_set_compiles_without_spills_or_c7508(compile_cache):
    _compile_checks(_compiled(_probe_set(), compile_cache, whole=True))


def test_every_config_compiles_without_spills_or_c7508(compiled):
    _compile_checks(compiled)


def _compile_checks(compiled) -> None:
    failed = {c.name: r.error for c, r in compiled.items() if not r.ok}
    assert not failed, failed
    for c, r in compiled.items():
        assert r.arch == "sm_90a"
        assert "C7508" not in r.log and "setmaxnreg" not in r.log.lower(), (c.name, r.log)
        assert "serialized" not in r.log, (c.name, r.log)  # wgmma serialisation warning
        res = r.resources
        assert res.spill_bytes == 0 and res.stack_frame == 0, (c.name, res)
        assert res.registers == c.launch_regs, (c.name, res.registers)
        assert res.smem_dynamic == c.smem_bytes and res.smem_static == 0, (c.name, res)


def test_sass_of_the_tma_store_epilogue(compiled, compile_cache):
    """store=1: one UTMASTG per 32-column slice of a consumer's tile, the slices written to
    shared memory as 8-byte stores, in each of the slice loop's two copies (beta != 0, which
    reads C, beta = 0, and beta = 0 with alpha = 1); the register epilogue has no TMA store."""
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")

    def sass(c):
        r = compile_config(c, "sm_90", compile_cache)
        assert r.ok, r.error
        return subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                              env=env, check=True).stdout

    for c in (STORE_GOLDEN, WgmmaConfig.from_name("gemm_wgmma_bf16_128x128x64_c1_s5_x1_p0_g1_ts")):
        code = sass(c)
        assert code.count("UTMASTG.2D") == TS_COPIES * c.bn // 32, c.name
        assert code.count("STS.64") == TS_COPIES * (c.wm // 64) * 2 * (c.bn // 8), c.name
        assert not re.search(r"\bSTG\.", code) and "STL" not in code, c.name  # C only by TMA
    assert "UTMASTG" not in sass(DEFAULT_WGMMA)
    # store=2: a 2-byte C staged by one STSM (four 8x8 matrices) per 16 x 16 of a warp, where
    # store=1 issues four 4-byte STS; nothing else stores to shared memory
    for c in (STMATRIX_GOLDEN, dataclasses.replace(STMATRIX_GOLDEN, store=1)):
        code = sass(c)
        assert code.count("UTMASTG.2D") == TS_COPIES * c.bn // 32, c.name
        stsm = TS_COPIES * (c.wm // 64) * (c.bn // 16)
        assert re.findall(r"\bSTSM\S*", code) == ["STSM.16.M88.4"] * (stsm if c.store == 2 else 0)
        assert len(re.findall(r"\bSTS\b", code)) == (0 if c.store == 2 else 4 * stsm), c.name


def test_sass_has_hgmma_and_tma(compiled, compile_cache):
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    for c in (DEFAULT_WGMMA, WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x2_p1_g8"),
              WgmmaConfig.from_name("gemm_wgmma_bf16_256x128x64_c2_s4_x1_p0_g8")):
        r = compile_config(c, "sm_90", compile_cache)  # cached when the sample had it
        sass = subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                              env=env, check=True).stdout
        hgmma = [l for l in sass.splitlines() if "HGMMA.64x" in l]
        assert len(hgmma) == (c.wm // 64) * (c.bk // 16), (c.name, len(hgmma))
        assert all(f"HGMMA.64x{c.bn}x16.F32" in l and "tnspB" in l for l in hgmma)
        assert sass.count("UTMALDG.2D") >= 1 + c.bn // 64, c.name  # A box + one per 64 columns
        assert "USETMAXREG.DEALLOC" in sass and "SYNCS.PHASECHK" in sass
        assert "STL" not in sass and "LDL" not in sass  # no local memory
        if c.cluster > 1:
            assert "MULTICAST" in sass.upper(), c.name
            # the barrier init's fence and the exit's cluster barrier; none per k-tile (a
            # release.cluster arrive put one before every consumer's release of a stage)
            assert sass.count("MEMBAR.ALL.GPU") == 2, c.name


# ---- host side: TMA rules and launch arguments ---------------------------------------------
def test_tma_reasons_say_why_with_numbers():
    assert tma_reasons(DType.F16, 1024, 4096, 0x10000, 0x20000, 64, 4096, 1024) == []
    assert tma_reasons(DType.F16, 1001, 4096, 0, 0) == [
        "lda=1001 x 2 B = 2002 B is not a multiple of 16 bytes"]
    why = tma_reasons(DType.BF16, 1024, 4100, 0x10002, 0x20000, 8, 4096, 1024)
    assert "A at 0x10002 is not 16-byte aligned (off by 2 B)" in why
    assert "ldb=4100 x 2 B = 8200 B is not a multiple of 16 bytes" in why
    assert tma_reasons(DType.F16, 1000, 4096, 0, 0, k=1024) == ["lda=1000 is below K=1024"]
    mis = wgmma_probe.misaligned_case()
    assert mis["refused"] and mis["lda"] % 8 and "not a multiple of 16 bytes" in mis["reasons"][0]


def test_tensor_map_arguments_are_well_formed():
    args = tensor_map_args(DType.F16, 0x7F0000000000, rows=4095, cols=1023, ld=1024,
                           box_rows=128, box_cols=64)
    assert args["globalDim"] == [1023, 4095]  # innermost first
    assert args["globalStrides"] == [2048]     # bytes, rank - 1 of them
    assert args["boxDim"] == [64, 128] and args["elementStrides"] == [1, 1]
    assert args["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert args["oobFill"] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"  # zeros out of bounds
    assert args["tensorDataType"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"
    assert tensor_map_args(DType.BF16, 0, 64, 64, 64, 32, 64)["tensorDataType"] == \
        "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"
    for bad, says in [(dict(ptr=8), "not 16-byte aligned"), (dict(ld=1025), "multiple of 16"),
                      (dict(box_cols=128), "exceed the 128 B of SWIZZLE_128B"),
                      (dict(box_rows=512), "outside 1..256"), (dict(ld=512), "below the 1023")]:
        kw = dict(dtype=DType.F16, ptr=0, rows=4095, cols=1023, ld=1024, box_rows=128,
                  box_cols=64)
        kw.update(bad)
        with pytest.raises(TmaUnsupported, match=says):
            tensor_map_args(**kw)


def test_tensor_map_enum_names_exist_in_cuda_bindings():
    from cuda.bindings import driver  # the dev extra brings cuda-bindings (no GPU needed)
    args = tensor_map_args(DType.F16, 0, 64, 64, 64, 64, 64)
    for key, enum in [("tensorDataType", "CUtensorMapDataType"), ("swizzle", "CUtensorMapSwizzle"),
                      ("interleave", "CUtensorMapInterleave"),
                      ("l2Promotion", "CUtensorMapL2promotion"),
                      ("oobFill", "CUtensorMapFloatOOBfill")]:
        assert hasattr(getattr(driver, enum), args[key]), (enum, args[key])
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x = 2
    assert attr.value.clusterDim.x == 2


#: the kernel's scalars after the tensor maps, in order: (name, ctypes kind, a value)
KERNEL_SCALARS = [("M", ctypes.c_int32, 17), ("N", ctypes.c_int32, 33), ("K", ctypes.c_int32, 9),
                  ("alpha", ctypes.c_float, 0.5), ("beta", ctypes.c_float, 2.0),
                  ("C", ctypes.c_uint64, 0xABC0), ("ldc", ctypes.c_int32, 36),
                  ("bias", ctypes.c_uint64, 0xBEE0), ("batch", ctypes.c_int32, 5),
                  ("maps3", ctypes.c_int32, 6), ("sC", ctypes.c_int64, 1 << 33)]


def test_kernel_arguments_follow_the_signature():
    """The TMA runner's scalars after the tensor maps (A and B, and C with the TMA-store
    epilogue) are the kernel's parameters in order (KERNEL_SCALARS), the first seven as
    they were before C's type, the bias and the batch (callers that read M N K alpha beta C
    ldc off a parameter block still find them there)."""
    from tuner.runtime.driver import ParamBlock
    from tuner.runtime.runners import TmaRunner

    assert TmaRunner.SIGNATURE == "iiiffPiPiiL"
    assert TmaRunner.SIGNATURE.startswith("iiiffPi")
    blk = ParamBlock(TmaRunner.SIGNATURE)
    values = [v for _, _, v in KERNEL_SCALARS]
    ptrs = (ctypes.c_void_p * len(values)).from_address(blk.pack(*values))
    assert [kind.from_address(p).value for (_, kind, _), p in zip(KERNEL_SCALARS, ptrs)] == values
    src = render(DEFAULT_WGMMA)
    assert ("int M, int N, int K, float alpha, float beta, OutT* __restrict__ C, int ldc,\n"
            "    const BiasT* __restrict__ bias, int batch, int maps3, long long sC)") in src
    assert "using OutT = float;" in src and "using BiasT = float;" in src
    bf = render(dataclasses.replace(DEFAULT_WGMMA, out=DType.BF16, bias="f32"))
    assert "using OutT = __nv_bfloat16;" in bf and "using BiasT = float;" in bf
    # the launch geometry the runner gives the driver: a cluster per tile, or (persistent)
    # at most sms // cluster clusters; one warpgroup per consumer plus the producer's
    cl = WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x2_p1_g8")
    assert cl.grid(4096, 4096, 132) == (132, 1, 1) and cl.cluster_dims() == (2, 1, 1)
    assert cl.block() == (384, 1, 1) and DEFAULT_WGMMA.cluster_dims() == (1, 1, 1)
    flat = dataclasses.replace(DEFAULT_WGMMA, persistent=0)
    assert flat.grid(4096, 4096, 132) == (32 * 16, 1, 1)  # a block per 128 x 256 tile


class _Image:
    """A driver.KernelImage that records instead of touching the driver."""

    def __init__(self, library, name, smem, dependent=False):
        self.name, self.smem, self.dependent, self.launches = name, smem, dependent, []

    def prepare(self, g):
        return self.name

    def params(self, signature):
        from tuner.runtime.driver import ParamBlock

        return ParamBlock(signature)

    def launch(self, f, grid, block, stream, address, cluster=None):
        self.launches.append((f, grid, block) + ((cluster,) if cluster else ()))

    def launcher(self, grid, block, cluster):
        """A cluster launch: recorded with its cluster dimensions."""
        return types.SimpleNamespace(
            launch=lambda f, stream, address: self.launch(f, grid, block, stream, address, cluster))


class _FakeTma:
    """The driver and TMA as the runners see them, recording: the kernels loaded (name,
    smem), launched (name, grid, block, stream), the pre-pass's parameters, the scratch
    asked for (purpose, bytes, stream) and the tensor maps encoded (their arguments)."""

    def __init__(self, monkeypatch):
        import types

        from tuner.runtime import driver, tma

        self.loaded, self.launched, self.prep_args, self.asked, self.encoded = [], [], [], [], []
        fake = self

        class Image(_Image):
            def __init__(self, library, name, smem, dependent=False):
                super().__init__(library, name, smem, dependent)
                fake.loaded.append((name, smem))

            def params(self, signature):
                self.blk = super().params(signature)
                return self.blk

            def launch(self, f, grid, block, stream, address, cluster=None):
                fake.launched.append((self.name, grid, block, stream) + ((cluster,) if cluster else ()))
                if self.name.endswith("_prep"):
                    fake.prep_args.append(self.blk.fmt.unpack_from(self.blk.buf))

        class Map:
            def getPtr(self):
                return 0

        class Scratch:
            def get(self, g, stream, purpose, nbytes, zero=False, allocate_captured=None):
                fake.asked.append((purpose, nbytes, stream))
                return 0x4000000

        monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
        monkeypatch.setattr(driver, "KernelImage", Image)
        monkeypatch.setattr(driver, "scratch", lambda: Scratch())
        monkeypatch.setattr(tma, "encode", lambda args: fake.encoded.append(args) or Map())
        self.g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))


def test_the_tma_runner_refuses_misaligned_operands_before_any_launch(monkeypatch):
    """The TMA runner's rules refuse operands before anything is launched: lda and ldb
    when bound, A's and B's pointers when run (before their maps are encoded), and, with
    the TMA-store epilogue, C's leading dimension and N when bound, C's pointer when run."""
    import types

    from tuner.runtime import driver, tma
    from tuner.runtime.runners import TmaRunner

    encoded = []
    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", _Image)
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args))
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
    plain, store = TmaRunner(DEFAULT_WGMMA, b""), TmaRunner(STORE_GOLDEN, b"")
    with pytest.raises(TmaUnsupported, match="lda=1025"):
        plain.bind(g, 64, 1024, 1023, 1025, 1024, 1024)
    run = plain.bind(g, 64, 1024, 1024, 1024, 1024, 1024)
    with pytest.raises(TmaUnsupported, match="A at 0x10002 is not 16-byte aligned"):
        run(0x10002, 0, 0, 1.0, 0.0, 0)
    assert encoded == []  # A and B refused before their maps are encoded
    with pytest.raises(TmaUnsupported, match="ldc=1027 x 4 B = 4108 B"):
        store.bind(g, 64, 1024, 1024, 1024, 1024, 1027)
    with pytest.raises(TmaUnsupported, match="N=1030 is not a multiple of 4 floats"):
        store.bind(g, 64, 1030, 1024, 1024, 1032, 1032)
    run = store.bind(g, 64, 1024, 1024, 1024, 1024, 1024)
    with pytest.raises(TmaUnsupported, match="C at 0x1008 is not 16-byte aligned"):
        run(0, 0, 0x1008, 1.0, 0.0, 0)
    assert plain.main.launches == store.main.launches == []  # nothing launched


# ---- the TMA-store epilogue (store=1) -------------------------------------------------------
def test_store_epilogue_name_geometry_and_reasons():
    from codegen.families.wgmma import C_SLICE, c_tma_reasons, problem_reasons

    c = STORE_GOLDEN
    assert c.name == "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts"
    pp = WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1, store=1)
    pre = dataclasses.replace(PREP_GOLDEN, store=1)
    assert pp.name.endswith("_pp_ts") and pre.name.endswith("_pre_ts")
    for x in (c, pp, pre):
        assert WgmmaConfig.from_name(x.name) == x and WgmmaConfig.from_dict(x.to_dict()) == x
        assert check_wgmma(x, "sm_90") == []
    # two WM x 32 FP32 buffers per consumer after the ring: 2 x 2 x 64 x 128 B at 128x256 c2
    assert C_SLICE == 32 and c.c_buf_bytes == 64 * 32 * 4 == 8192 and c.c_bytes == 32768
    assert c.smem_bytes == 1024 + 4 * 49152 + 32768 + 1024 == 231424
    assert pp.c_buf_bytes == 128 * 128 and pp.c_bytes == 65536  # ping-pong: whole tiles
    assert DEFAULT_WGMMA.c_bytes == 0 and "C" not in DEFAULT_WGMMA.tma_boxes()
    assert c.tma_boxes()["C"] == (64, 32) and pp.tma_boxes()["C"] == (128, 32)
    v = c.template_values()
    assert (v["STORE"], v["C_OFF"], v["C_BUF_BYTES"], v["C_BYTES"]) == (1, 4 * 49152, 8192, 32768)
    # what does not fit, or does not slice, says so
    why = check_wgmma(dataclasses.replace(c, stages=5), "sm_90")
    assert any("shared memory 280576 B" in w for w in why), why
    assert check_wgmma(dataclasses.replace(c, store=3), "sm_90") == ["store=3 is not 0, 1 or 2"]
    assert check_wgmma(dataclasses.replace(c, store=2), "sm_90") == [
        "store=2 stages C by stmatrix, 2-byte elements: C is f32"]
    # stmatrix staging (store=2): a 2-byte C, the same buffers
    sm = STMATRIX_GOLDEN
    assert sm.name == "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g16_pp_tsm_of16"
    assert WgmmaConfig.from_name(sm.name) == sm and check_wgmma(sm, "sm_90") == []
    assert (sm.c_buf_bytes, sm.c_bytes) == (128 * 64, 2 * 2 * 128 * 64)
    # C's rules: the tuner's ldc = N must be 16 bytes a row
    assert c_tma_reasons(1024, 0x100, 1024) == []
    assert c_tma_reasons(1001, 0x104, 1001) == [
        "C at 0x104 is not 16-byte aligned (off by 4 B)",
        "ldc=1001 x 4 B = 4004 B is not a multiple of 16 bytes",
        "N=1001 is not a multiple of 4 floats: TMA stores write C's rows in 16-byte pieces, past column N"]
    # an N that ends inside 16 bytes: TMA's stores were seen writing on to them (H200)
    assert c_tma_reasons(1028, 0x100, 1026) == ["N=1026 is not a multiple of 4 floats: TMA stores write C's rows in 16-byte pieces, past column N"]
    assert problem_reasons(c, (4096, 4096, 4096)) == []
    assert problem_reasons(c, (4096, 4098, 4096)) == [
        "TMA cannot describe the operands: ldb=4098 x 2 B = 8196 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: ldc=4098 x 4 B = 16392 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: " + "N=4098 is not a multiple of 4 floats: TMA stores write C's rows in 16-byte pieces, past column N"]
    assert problem_reasons(pre, (4096, 4098, 4097)) == [
        "TMA cannot describe the operands: ldc=4098 x 4 B = 16392 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: " + "N=4098 is not a multiple of 4 floats: TMA stores write C's rows in 16-byte pieces, past column N"]
    # not searched; the run-time library runs it (its runner writes C through a tensor map,
    # so the dispatch gives it only a C that is 16-byte aligned, as A and B are)
    from codegen.config import config_from_name
    from codegen.families.wgmma import SEARCH_SPACE

    assert SEARCH_SPACE["store"] == (0, 1)  # searched, now that the GPU measured it
    assert c.aligned_operands == (True, True, True)
    assert DEFAULT_WGMMA.aligned_operands == (True, True, False)
    assert PREP_GOLDEN.aligned_operands == (False, False, False)  # the pre-pass reads A, B
    assert pre.aligned_operands == (False, False, True)
    assert config_from_name("gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8").aligned_operands \
        == (False, False, False)


def test_store_epilogue_source():
    src = render(STORE_GOLDEN)
    assert ("const __grid_constant__ CUtensorMap tmB,\n    const __grid_constant__ CUtensorMap tmC,"
            in src)
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in src
    assert "cp.async.bulk.wait_group.read %0;" in src and "bulk_wait_read<1>();" in src
    assert "cp.async.bulk.wait_group 0;" in src and "fence.proxy.async.shared::cta;" in src
    assert "bar.sync 2, 128;" in src and "bar.sync 3, 128;" in src
    assert "constexpr uint32_t C_BYTES = 32768;" in src and "C (fp32, SWIZZLE_128B) box 64 x 32" in src
    assert "const uint32_t bars = base + TILES_BYTES + C_BYTES;" in src
    plain = render(DEFAULT_WGMMA)
    assert "tmC" not in plain and "cp.async.bulk.wait_group" not in plain
    assert "constexpr uint32_t C_BYTES = 0;" in plain


@pytest.mark.parametrize("wm", [64, 128])
def test_store_epilogue_writes_each_slice_once_with_two_way_conflicts_at_most(wm):
    """The template's writes into a WM x 32 slice buffer (as it computes them): every element
    once, where TMA's SWIZZLE_128B reads it (16-byte chunk c ^ row % 8), and each half-warp's
    8-byte stores on 16 banks, each hit twice (two wavefronts; the comment in the template says
    why not one)."""
    written = {}
    for warp in range(4):
        for i in range(wm // 64):
            for h in range(2):
                for q in range(4):
                    banks: dict[int, list] = {0: [], 1: []}
                    for lane in range(32):
                        cc = q * 8 + (lane % 4) * 2
                        r = i * 64 + warp * 16 + lane // 4 + h * 8
                        at = r * 128 + (((cc // 4) ^ (r % 8)) * 16) + (cc % 4) * 4
                        for e in range(2):  # the pair's two floats
                            col = cc + e
                            assert at + 4 * e == r * 128 + (((col // 4) ^ (r % 8)) << 4) + (col % 4) * 4
                            assert (r, col) not in written
                            written[(r, col)] = at + 4 * e
                            banks[lane // 16].append((at + 4 * e) // 4 % 32)
                    for half in banks.values():
                        assert sorted(collections.Counter(half).values()) == [2] * 16, half
    assert len(written) == wm * 32 and len(set(written.values())) == wm * 32


@pytest.mark.parametrize("wm", [64, 128])
def test_stmatrix_staging_writes_each_element_where_the_pair_stores_would(wm):
    """store=2, as the template computes it: per warp, row block i and column blocks 2 q2,
    2 q2 + 1 of a slice, register j of lane l holds the pair (h = j % 2, q = 2 q2 + j / 2) of
    the accumulators that store=1 writes with one sts_pair, and stmatrix puts row l / 4 of
    matrix j at the address lane 8 j + l / 4 gives, columns 2 (l % 4) and + 1. Each element
    lands where store=1 puts it (SWIZZLE_64B: 16-byte chunk col / 8 ^ (row / 2) % 4), once;
    each matrix's 8 rows fall on 32 distinct banks (one wavefront)."""
    written = {}
    for warp in range(4):
        for i in range(wm // 64):
            for q2 in range(2):
                # the row address each lane gives: matrix lane / 8, its row lane % 8
                addr = {}
                for lane in range(32):
                    j = lane // 8
                    r = i * 64 + warp * 16 + (lane // 8) % 2 * 8 + lane % 8
                    addr[lane] = r * 64 + (((2 * q2 + lane // 16) ^ ((r // 2) % 4)) * 16)
                for j in range(4):
                    rows = [addr[8 * j + k] for k in range(8)]
                    banks = [a // 4 % 32 + w for a in rows for w in range(4)]
                    assert sorted(banks) == list(range(32)), (warp, i, q2, j)
                for lane in range(32):
                    for j in range(4):
                        h, q = j % 2, 2 * q2 + j // 2
                        # the pair this register holds (store=1's sts_pair of (i, h, q))
                        r = i * 64 + warp * 16 + lane // 4 + h * 8
                        cc = q * 8 + (lane % 4) * 2
                        # where stmatrix puts it: row lane / 4 of matrix j
                        at = addr[8 * j + lane // 4] + (lane % 4) * 4
                        assert at == r * 64 + (((cc // 8) ^ ((r // 2) % 4)) * 16) + (cc % 8) * 2
                        for e in range(2):
                            assert (r, cc + e) not in written
                            written[(r, cc + e)] = at + 2 * e
    assert len(written) == wm * 32 and len(set(written.values())) == wm * 32


def test_no_gpu_package_on_import():
    code = ("import sys; sys.path.insert(0, 'bench'); import wgmma_probe, tf32x3_accuracy, tuner.runtime.runners, "
            "codegen.compile; bad = [m for m in ('optuna', 'pycuda', 'cuda.bindings', 'torch') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---- the probe's plan -------------------------------------------------------------------
def test_probe_plan_covers_every_step():
    cfgs = [WgmmaConfig.from_name(n) for n in wgmma_probe.CONFIGS]
    assert 8 <= len(cfgs) <= 14 and all(check_wgmma(c, "sm_90") == [] for c in cfgs)
    assert {wgmma_probe.step(c) for c in cfgs} == {"a", "b", "c", "d", "e", "f"}
    for s in "abcdef":
        assert {c.dtype for c in cfgs if wgmma_probe.step(c) == s} >= {DType.F16}, s
    assert {c.dtype for c in cfgs} == {DType.F16, DType.BF16}
    cases = wgmma_probe.cases()
    assert len(cases) == 10 and {c["beta"] for c in cases} == {0.0, 2.0}
    assert wgmma_probe.gate(4096) == 2e-5 and wgmma_probe.gate(8192) == 4e-5
    assert wgmma_probe.padded(9, DType.F16) == 16 and wgmma_probe.padded(4096, DType.BF16) == 4096


def test_probe_table_and_json_shape():
    report = dict(configs=[dict(
        name=wgmma_probe.CONFIGS[0], step="a", compile=dict(registers=255, spill_bytes=0),
        cases=[dict(m=1, n=1, k=1, beta=0.0, status="ok", err=1e-7),
               dict(m=17, n=33, k=9, beta=2.0, status="hang", error="no answer in 25 s")])],
        timing=[dict(shape=[4096, 4096, 4096], kernels={
            wgmma_probe.CONFIGS[0]: dict(ms=1.0, tflops=137.4, vs_cublas=0.2),
            "cublas_f16": dict(ms=0.2, tflops=687.2, variant="torch.mm")})])
    table = wgmma_probe._table(report)
    assert "1/2" in table and "137.4" in table and "NOT OK" in table and "hang" in table


def test_probe_child_reader_times_out_on_a_hang():
    script = "import json, time; print(json.dumps({'ready': True}), flush=True); time.sleep(60)"
    child = wgmma_probe._Child([sys.executable, "-c", script])
    assert child.line(30) == {"ready": True}
    assert child.line(0.5) is None  # the hang: no answer within the deadline
    assert child.proc.poll() is None
    child.stop()
    assert child.proc.poll() is not None


# ---- fp32 data: tf32 and 3xTF32 ---------------------------------------------------------
from codegen.families.wgmma import TF32_SPACE, sample_wgmma_tf32  # noqa: E402

TF32_GOLDEN = WgmmaConfig(bm=128, bn=128, bk=32, stages=4, consumers=2, cluster=1, persistent=1,
                          group=8, dtype=DType.TF32)
T3_GOLDEN = WgmmaConfig(bm=128, bn=128, bk=32, stages=2, consumers=2, cluster=1, persistent=1,
                        group=8, dtype=DType.F32, terms=3)
PREP_GOLDEN = WgmmaConfig(bm=128, bn=256, bk=32, stages=4, consumers=2, cluster=1, persistent=1,
                          group=8, dtype=DType.TF32, prep=1)


def test_fp32_names_are_pinned_and_round_trip():
    assert TF32_GOLDEN.name == "gemm_wgmma_tf32_128x128x32_c2_s4_x1_p1_g8"
    assert T3_GOLDEN.name == "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3"
    for c in (TF32_GOLDEN, T3_GOLDEN):
        assert WgmmaConfig.from_name(c.name) == c
        assert WgmmaConfig.from_dict(c.to_dict()) == c
    assert T3_GOLDEN.to_dict()["terms"] == 3 and T3_GOLDEN.to_dict()["dtype"] == "f32"
    assert "_t" not in DEFAULT_WGMMA.name  # terms=1 adds nothing: the f16 names stay as they were
    with pytest.raises(UsageError):
        WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_tx")


def test_prep_names_geometry_and_reasons():
    c = PREP_GOLDEN
    assert c.name == "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre"
    assert WgmmaConfig.from_name(c.name) == c and WgmmaConfig.from_dict(c.to_dict()) == c
    assert check_wgmma(c, "sm_90") == []
    # no conversion copies in a stage: A and Bt as TMA writes them, 48 KiB at 128x256
    assert c.stage_bytes == c.tx_bytes == (128 + 256) * 32 * 4 == 49152
    assert c.smem_bytes == DEFAULT_WGMMA.smem_bytes == 198656
    assert c.tma_boxes() == {"A": (128, 32), "B": (256, 32)}
    v = c.template_values()
    assert v["PREP"] == 1 and not v["TF32"] and v["B_CHUNKS"] == 1 and v["K_STEPS"] == 4
    # workspace: At (M x ldw) then Bt (N x ldw), ldw = K rounded up to 4 floats
    assert c.prep_ld(1023) == 1024 and c.prep_ld(1) == 4
    assert c.prep_floats(100, 300, 1023) == 400 * 1024 and TF32_GOLDEN.prep_floats(1, 1, 1) == 0
    assert c.prep_grid(100, 300, 1023) == (4 * 32 + 32 * 10, 4 * 32)
    # any leading dimension: the pre-pass reads A and B with plain loads
    from codegen.families.wgmma import problem_reasons

    assert problem_reasons(c, (4096, 4095, 4097)) == []
    assert problem_reasons(TF32_GOLDEN, (4096, 4095, 4097)) != []
    assert any("prep=1 (the pre-pass of fp32 data) needs dtype tf32 or f32 (3xTF32), not bf16"
               in w for w in check_wgmma(dataclasses.replace(c, dtype=DType.BF16, bk=64), "sm_90"))
    # a cluster multicasts the pre-pass's Bt (K-major) like any K-major B; the pre-split's
    # small parts load apart, so 3xTF32 takes none
    cl = dataclasses.replace(c, cluster=2)
    assert check_wgmma(cl, "sm_90") == [] and cl.tma_boxes()["B"] == (c.bn // 2, 32)
    assert "tma_load_multicast(b_dst, &tmB, bar, kt * BK, n0 + static_cast<int>(rank) * B_BOX_ROWS" in render(cl)
    assert any(w.startswith("3xTF32 pre-split (prep=1, terms=3) loads its small parts apart: no "
                            "cluster") for w in check_wgmma(
        dataclasses.replace(c, dtype=DType.F32, terms=3, cluster=2), "sm_90"))
    src = render(c)
    assert f"{c.name}_prep(const float* __restrict__ A" in src and "cvt.rna.tf32.f32" in src
    assert "convert_stage" not in src and "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" in src


def test_the_runner_of_a_prep_kernel_launches_its_pre_pass_first(monkeypatch):
    """A pre-pass config's runner loads <name>_prep beside the GEMM (a plain one does not),
    and each run launches it into the stream's workspace before the GEMM, whose tensor maps
    describe that workspace (At: M x K, Bt: N x K, leading dimension prep_ld(K)), whatever
    lda and ldb the caller's A and B have."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    loaded, launched, encoded, asked, g = (fake.loaded, fake.launched, fake.encoded,
                                           fake.asked, fake.g)
    assert TmaRunner(DEFAULT_WGMMA, b"").prep is None
    loaded.clear()
    cfg = PREP_GOLDEN
    r = TmaRunner(cfg, b"")
    assert loaded == [(cfg.name, cfg.smem_bytes), (f"{cfg.name}_prep", 0)]
    m, n, k = 128, 256, 64
    run = r.bind(g, m, n, k, 65, 257, 256)  # rows of A and B TMA could not read
    run(0x10004, 0x20004, 0x30000, 1.0, 0.0, 7)
    blocks, _ = cfg.prep_grid(m, n, k)
    assert launched == [(f"{cfg.name}_prep", (blocks, 1, 1), (256, 1, 1), 7),
                        (cfg.name, cfg.grid(m, n, 132), cfg.block(), 7)]
    assert asked == [("tf32 pre-pass", cfg.prep_floats(m, n, k) * 4, 7)]
    ldw = cfg.prep_ld(k)
    assert [(e["globalAddress"], e["globalDim"], e["globalStrides"]) for e in encoded] == [
        (0x4000000, [k, m], [ldw * 4]), (0x4000000 + m * ldw * 4, [k, n], [ldw * 4])]


#: tf32 rounded by TMA (prep=2): x @ W.t() with both operands K-major as stored
PRET_GOLDEN = dataclasses.replace(PREP_GOLDEN, prep=2, layout=Layout.NT)


def test_tma_rounded_tf32_names_geometry_and_reasons():
    """prep=2: the pre-pass's main loop over the operands that are K-major as stored (a
    row-major A, a column-major B) read through TFLOAT32 maps (TMA rounds each value to tf32
    as it loads it), the pre-pass copying only the others: none for NT (no pre-pass kernel,
    no workspace), B for NN, A for TT; TMA's rules on what it reads as stored."""
    from codegen.families.wgmma import problem_reasons

    c = PRET_GOLDEN
    assert c.name == "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pret_nt"
    assert WgmmaConfig.from_name(c.name) == c and WgmmaConfig.from_dict(c.to_dict()) == c
    assert check_wgmma(c, "sm_90") == [] and not c.pre_pass and PREP_GOLDEN.pre_pass
    assert c.tma_dtype is DType.TF32 and PREP_GOLDEN.tma_dtype is DType.F32
    assert c.aligned_operands == (True, True, False)
    assert c.prep_floats(4096, 4096, 4096) == c.prep_bytes(4096, 4096, 4096) == 0
    assert c.stage_bytes == c.tx_bytes == PREP_GOLDEN.stage_bytes and c.conv_bytes == 0
    assert c.tma_boxes() == {"A": (128, 32), "B": (256, 32)}
    v = c.template_values()
    assert v["PREP"] and not v["PREP_KERNEL"] and not v["TF32"]
    assert problem_reasons(c, (4096, 4096, 4096)) == []
    assert problem_reasons(c, (4096, 4096, 4095)) != []  # rows of 4095 floats: not for TMA
    # NN: B copied (transposed) alone; TT: A alone; TN would copy both (prep=1's)
    nn, tt = (dataclasses.replace(c, layout=x) for x in (Layout.NN, Layout.TT))
    assert (nn.copies_a, nn.copies_b, tt.copies_a, tt.copies_b) == (False, True, True, False)
    assert nn.pre_pass and tt.pre_pass and check_wgmma(nn, "sm_90") == check_wgmma(tt, "sm_90") == []
    assert nn.aligned_operands == (True, False, False) and tt.aligned_operands == (False, True, False)
    m, n, k = 100, 300, 1023
    ldw = c.prep_ld(k)
    assert nn.prep_floats(m, n, k) == n * ldw and tt.prep_floats(m, n, k) == m * ldw
    assert nn.prep_bytes(m, n, k) == n * k * 4 + n * ldw * 4  # B read, Bt written
    assert PREP_GOLDEN.prep_bytes(m, n, k) == (m + n) * k * 4 + (m + n) * ldw * 4
    assert nn.prep_grid(m, n, k) == (32 * 10, 0) and tt.prep_grid(m, n, k) == (4 * 32, 4 * 32)
    # what TMA reads as stored meets its rules; the copied operand any leading dimension
    assert problem_reasons(nn, (4096, 4095, 4096)) == []  # B's rows of 4095: the pre-pass's
    assert problem_reasons(nn, (4096, 4096, 4095)) != []  # A's rows of 4095 floats: TMA's
    assert problem_reasons(tt, (4095, 4096, 4096)) == [] and problem_reasons(tt, (4096, 4096, 4095)) != []
    for bad, why in ((dataclasses.replace(c, layout=Layout.TN), "tn"),
                     (dataclasses.replace(c, dtype=DType.F32, terms=3), "f32")):
        assert any(w.startswith("prep=2 (tf32 rounded by TMA as it loads) needs dtype tf32")
                   and why in w for w in check_wgmma(bad, "sm_90")), bad.name
    for cl in (dataclasses.replace(c, cluster=2), dataclasses.replace(c, cluster=2, cluster_n=1)):
        assert check_wgmma(cl, "sm_90") == [], cl.name  # TFLOAT32 maps multicast as any
    assert check_wgmma(dataclasses.replace(c, prep=4), "sm_90")[0] == "prep=4 is not 0, 1, 2 or 3"
    src = render(c)
    assert "_prep(" not in src and "cvt.rna" not in src and "convert_stage" not in src
    assert "A by TMA as it loads it (a TFLOAT32 map);" in src
    assert "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" in src
    assert "tmB over Bt (N x K, ldw)" in render(nn) and "tmA over A as stored" in render(nn)
    # the same main loop as the pre-pass's: the sources differ only where the pre-pass is
    pre = render(dataclasses.replace(PREP_GOLDEN, layout=Layout.NT))
    body = lambda x: x[x.index("extern \"C\" __global__"):]  # noqa: E731
    assert body(src).split("\n")[3:] == body(pre).split("\n")[3:len(body(src).split("\n"))]


#: tf32 through registers (prep=3): NN computes C^T (B's tile through the registers), TT and
#: NT feed A through them
RS_GOLDEN = dataclasses.replace(PREP_GOLDEN, bm=256, bn=128, prep=3)
RS_SET = [RS_GOLDEN] + [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_tt",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_nt",
    "gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_obf16_bias_silu",
    "gemm_wgmma_tf32_64x128x32_c1_s5_x1_p0_g1_prer_tt_of16_biasf32_relu",
    "gemm_wgmma_tf32_128x128x32_c1_s4_x1_p1_g8_prer",  # NN, 128 of wgmma's rows a consumer
    "gemm_wgmma_tf32_256x64x32_c2_s4_x1_p1_g8_pp_prer",  # NN, ping-pong consumers
)]
#: the register operand's rows in pairs (rs_pairs=1): NN (C^T, B's tile) and TT (A's), one
#: consumer of 128 wgmma rows, ping-pong
RP_SET = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_rp",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_rp_tt",
    "gemm_wgmma_tf32_128x128x32_c1_s4_x1_p1_g8_prer_rp_obf16_bias_silu",
    "gemm_wgmma_tf32_256x64x32_c2_s4_x1_p1_g8_pp_prer_rp",
)]


def test_register_fed_tf32_names_geometry_and_reasons():
    """prep=3: no pre-pass, both operands as stored through TFLOAT32 maps; NN swaps the roles
    (the consumers' rows are BN / consumers columns of C, wgmma's N the tile's BM rows), TT and
    NT feed A through the registers (TN too, with B's pre-pass: below); the register
    epilogue only; clusters either way."""
    c = RS_GOLDEN
    assert c.name == "gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer"
    assert WgmmaConfig.from_name(c.name) == c and WgmmaConfig.from_dict(c.to_dict()) == c
    assert check_wgmma(c, "sm_90") == [] and not c.pre_pass and c.prep_bytes(4096, 4096, 4096) == 0
    assert c.swap and c.rs and c.tma_dtype is DType.TF32 and c.aligned_operands == (True, True, False)
    assert (c.wm, c.mma_n, c.acc_regs) == (64, 256, 128)  # 64 columns of C a consumer, all 256 rows
    assert c.tma_boxes() == {"A": (256, 32), "B": (32, 32)}  # A K-major; B as stored, 32-column boxes
    tt, nt = RS_SET[1], RS_SET[2]
    assert not tt.swap and (tt.wm, tt.mma_n) == (64, 256) and tt.a_mn_major
    assert tt.tma_boxes() == {"A": (32, 32), "B": (256, 32)}
    assert nt.tma_boxes() == {"A": (128, 32), "B": (256, 32)} and not nt.a_mn_major
    v, vt = c.template_values(), tt.template_values()
    assert (v["RS"], v["SWAP"], v["R_MN"], v["MMA_N"], v["ACC"], v["PREP"], v["TF32"]) == \
        (True, True, True, 256, 128, False, False)
    assert (vt["SWAP"], vt["R_MN"], vt["A_CHUNKS"], nt.template_values()["R_MN"]) == (False, True, 4, False)
    cl, cn = dataclasses.replace(c, cluster=2), dataclasses.replace(c, cluster=2, cluster_n=1)
    assert check_wgmma(cl, "sm_90") == [] == check_wgmma(cn, "sm_90")
    # along M the blocks share B's tile (C^T's register operand: BK/2 rows of each 32-column
    # box a block); along N, A's (the K-major one the descriptors read: BM/2 rows a block)
    assert cl.tma_boxes() == {"A": (256, 32), "B": (16, 32)}
    assert cn.tma_boxes() == {"A": (128, 32), "B": (32, 32)}
    for bad, why in ((dataclasses.replace(c, store=1), "store=1"),
                     (dataclasses.replace(c, dtype=DType.F32, terms=3), "f32")):
        assert any(w.startswith("prep=3 (tf32, one operand through registers) needs dtype tf32")
                   and why in w for w in check_wgmma(bad, "sm_90")), bad.name
    # NN: BN / consumers columns of C are a consumer's wgmma rows
    assert check_wgmma(dataclasses.replace(c, bn=96, consumers=2), "sm_90")[0].startswith(
        "BN=96 gives each of the 2 consumer warpgroups 48 columns of C")
    # 128 of wgmma's rows by 256: 256 accumulators and two sets of fragments do not fit
    assert "the 128x256 consumer tile holds 256 accumulators" in check_wgmma(
        dataclasses.replace(c, bn=256, stages=3), "sm_90")[0]


#: prep=3 on TN: A (M-major) through the registers, B transposed by the pre-pass
RS_TN = WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_rp_tn")


def _main_kernel(source: str, name: str) -> str:
    """The text of kernel `name`'s definition in `source`, the name replaced by K."""
    start = source.index(f"{name}(", source.index('extern "C" __global__'))
    return source[start:source.index("\n}\n", start) + 3].replace(name, "K")


def test_register_fed_tf32_on_tn_copies_b_alone(compile_cache):
    """prep=3 on TN (neither operand K-major as stored): A, M-major, through the registers
    as on TT, read as stored through a TFLOAT32 map; the pre-pass transposes and rounds B
    alone (a_blocks = 0) into Bt, K-major, which the descriptors read. The main kernel is
    TT's, line for line; searched, TN's only tf32 path (it beat the pre-pass of both)."""
    from codegen.families.wgmma import problem_reasons, unproven_reasons, valid_configs

    tn, tt = RS_TN, dataclasses.replace(RS_TN, layout=Layout.TT)
    assert WgmmaConfig.from_name(tn.name) == tn and check_wgmma(tn, "sm_90") == []
    assert check_wgmma(dataclasses.replace(tn, rs_pairs=0), "sm_90") == []
    assert (tn.copies_a, tn.copies_b, tn.a_mn_major, tn.b_mn_major, tn.r_mn, tn.swap) == \
        (False, True, True, False, True, False)
    assert tn.tma_boxes() == tt.tma_boxes() == {"A": (32, 32), "B": (256, 32)}
    assert tn.aligned_operands == (True, False, False)
    m, n, k = 300, 500, 200
    assert tn.prep_grid(m, n, k) == (7 * 16, 0)  # B's 32 x 32 tiles only
    assert tn.prep_bytes(m, n, k) == n * k * 4 + n * tn.prep_ld(k) * 4
    assert unproven_reasons(tn) == []  # 1.12x the pre-pass of both on an H100 (NOTES)
    shape = (4096, 4096, 4096)
    on_tn = [dataclasses.replace(c, layout=Layout.TN)
             for c in valid_configs("sm_90", DType.TF32, shape)]
    searched = [c for c in on_tn if not (check_wgmma(c, "sm_90") or problem_reasons(c, shape))]
    assert any(c.prep == 3 for c in searched), {c.prep for c in searched}
    src_tn, src_tt = render(tn), render(tt)
    assert _main_kernel(src_tn, tn.name) == _main_kernel(src_tt, tt.name)
    prep = _main_kernel(src_tn, f"{tn.name}_prep")
    assert "prep_transpose(B, ldb, K, N, bid - a_blocks, Bt, ldw, tile);" in prep
    assert f"{tt.name}_prep" not in src_tt and "tf32_rna" in src_tn
    built = dict(compile_many([tn, tt], "sm_90", cache_dir=compile_cache))
    r_tn, r_tt = built[tn].resources, built[tt].resources
    assert r_tn.spill_stores == 0 and r_tn.registers == r_tt.registers
    assert r_tn.smem_dynamic == r_tt.smem_dynamic


def test_the_runner_of_a_register_fed_tn_kernel_maps_a_as_stored_and_bt(monkeypatch):
    """prep=3 on TN: the pre-pass (B's tiles, a_blocks = 0) writes Bt into the stream's
    workspace; A's map is over the caller's column-major A (K x M as stored) as TFLOAT32,
    Bt's over the workspace as FLOAT32; A's leading dimension is TMA's, B's free."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    g, cfg = fake.g, RS_TN
    m, n, k = 300, 500, 200
    r = TmaRunner(cfg, b"")
    assert [x[0] for x in fake.loaded] == [cfg.name, f"{cfg.name}_prep"]
    ldw, (blocks, a_blocks) = cfg.prep_ld(k), cfg.prep_grid(m, n, k)
    r.bind(g, m, n, k, 304, 501, 512)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
    assert [x[:2] for x in fake.launched] == [(f"{cfg.name}_prep", (blocks, 1, 1)),
                                              (cfg.name, cfg.grid(m, n, 132))]
    assert fake.prep_args[-1] == (0x10000, 304, 0x20000, 501, m, n, k, 0x4000000, 0x4000000,
                                  ldw, a_blocks) and a_blocks == 0
    boxes = cfg.tma_boxes()
    assert [(e["tensorDataType"][len("CU_TENSOR_MAP_DATA_TYPE_"):], e["globalAddress"],
             e["globalDim"], e["globalStrides"], e["boxDim"]) for e in fake.encoded] == [
        ("TFLOAT32", 0x10000, [m, k], [304 * 4], list(boxes["A"][::-1])),
        ("FLOAT32", 0x4000000, [k, n], [ldw * 4], list(boxes["B"][::-1]))]
    with pytest.raises(TmaUnsupported, match="lda=301"):
        r.bind(g, m, n, k, 301, 501, 512)


def _tma_swizzled(rows: int, k: int, kmajor: bool, box_cols: int = 32):
    """The R tile as TMA writes it (fp32, SWIZZLE_128B), modelled apart from the template:
    byte offset -> (tile row, k). K-major: one box of `rows` rows of 32 floats (k); MN-major:
    rows/32 boxes of `k` rows (k) by 32 floats (tile rows). In each 128-byte row the 16-byte
    chunk c is stored at chunk c ^ (row of the box % 8)."""
    where = {}
    if kmajor:
        for r in range(rows):
            for kk in range(k):
                where[r * 128 + ((kk // 4) ^ (r % 8)) * 16 + (kk % 4) * 4] = (r, kk)
    else:
        for box in range(rows // box_cols):
            for kk in range(k):
                for col in range(box_cols):
                    off = box * k * 128 + kk * 128 + ((col // 4) ^ (kk % 8)) * 16 + (col % 4) * 4
                    where[off] = (box * box_cols + col, kk)
    return where


@pytest.mark.parametrize("cfg", [RS_SET[0], RS_SET[1], RS_SET[2], RP_SET[0], RP_SET[1]],
                         ids=lambda c: c.name)
def test_register_fragments_are_wgmmas_layout_and_conflict_free(cfg):
    """The template's fragment loads (rs_row and load_fragments' offsets, read from the
    rendered source) against TMA's swizzled tile and wgmma's register layout for tf32 A
    (PTX ISA, m64nNk8: a_v of lane l in warp w is row 16 w + l/4 + 8 (v%2), column l%4 +
    4 (v/2)): each thread's a_v is the element of tile row rs_row(w, l, v%2) + 64 i at that
    k; the wgmma rows of a 64-row slice are its 64 tile rows once each (so the epilogue's
    rs_row writes every accumulator where it belongs); each ld.shared of a warp touches 32
    distinct banks (one wavefront). With the rows in pairs (rs_pairs) a thread's h = 0 and
    1 are adjacent rows, loaded as one 8-byte ld.shared: its 64 words take each bank at most
    twice (two wavefronts, as two 4-byte loads take)."""
    src = render(cfg)
    r_mn, pairs = cfg.template_values()["R_MN"], cfg.rs_pairs
    if pairs:
        assert "return 32 * (warp / 2) + 16 * (g / 4) + 8 * (warp % 2) + 2 * (g % 4) + h;" in src
        assert ("const int off = (row / 32) * 4096 + k * 128\n"
                "                              + ((((row % 32) / 4) ^ (k % 8)) * 16) + (row % 4) * 4;") in src
        assert "const uint2 v = *reinterpret_cast<const uint2*>(r + off);" in src
        assert "fr[i][kk][2 * q] = v.x;" in src and "fr[i][kk][1 + 2 * q] = v.y;" in src
        assert "const int row = row0 + 64 * i + rs_row(warp, lane, 0);" in src
        rs_row = lambda w, l, h: 32 * (w // 2) + 16 * (l // 4 // 4) + 8 * (w % 2) + 2 * ((l // 4) % 4) + h  # noqa: E731
        off = lambda row, k: (row // 32) * 4096 + k * 128 + ((((row % 32) // 4) ^ (k % 8)) * 16) + (row % 4) * 4  # noqa: E731
    elif r_mn:
        assert "return 32 * (warp / 2) + 16 * (g / 4) + 8 * (warp % 2) + 4 * h + g % 4;" in src
        assert ("const int off = (row / 32) * 4096 + k * 128\n"
                "                                  + ((((row % 32) / 4) ^ (k % 8)) * 16) + (row % 4) * 4;") in src
        rs_row = lambda w, l, h: 32 * (w // 2) + 16 * (l // 4 // 4) + 8 * (w % 2) + 4 * h + (l // 4) % 4  # noqa: E731
        off = lambda row, k: (row // 32) * 4096 + k * 128 + ((((row % 32) // 4) ^ (k % 8)) * 16) + (row % 4) * 4  # noqa: E731
    else:
        assert "return 16 * warp + lane / 4 + 8 * h;" in src
        assert "const int off = row * 128 + (((k / 4) ^ (row % 8)) * 16) + (k % 4) * 4;" in src
        rs_row = lambda w, l, h: 16 * w + l // 4 + 8 * h  # noqa: E731
        off = lambda row, k: row * 128 + (((k // 4) ^ (row % 8)) * 16) + (k % 4) * 4  # noqa: E731
    if not pairs:
        assert "fr[i][kk][h + 2 * q] = *reinterpret_cast<const uint32_t*>(r + off);" in src
        assert "const int row = row0 + 64 * i + rs_row(warp, lane, h);" in src
    assert "const int k = 8 * kk + lane % 4 + 4 * q;" in src
    rows = cfg.wm * cfg.consumers  # the R tile's rows
    tile = _tma_swizzled(rows, cfg.bk, kmajor=not r_mn)
    for consumer in range(cfg.consumers):
        row0 = consumer * cfg.wm
        for i in range(cfg.wm // 64):
            seen = set()
            for w in range(4):
                for h in range(2):
                    seen |= {rs_row(w, l, h) for l in range(32)}
                for kk in range(cfg.bk // 8):
                    for q in range(2):
                        banks = {h: [] for h in range(2)}
                        for lane in range(32):
                            for h in range(2):
                                row = row0 + 64 * i + rs_row(w, lane, h)
                                k = 8 * kk + lane % 4 + 4 * q
                                # the pairs' load: h = 1 the word after h = 0's
                                at = off(row - h, k) + 4 * h if pairs else off(row, k)
                                got = tile[at]
                                # wgmma's a_v (v = h + 2q): row 16w + l/4 + 8h, col l%4 + 4q
                                assert got == (row, k) and k == lane % 4 + 4 * q + 8 * kk
                                banks[h].append(at // 4 % 32)
                        if pairs:  # one 8-byte load: 64 words, each bank twice at most
                            both = banks[0] + banks[1]
                            assert max(both.count(b) for b in both) == 2, (cfg.name, w, kk, q)
                        else:
                            for h in range(2):
                                assert len(set(banks[h])) == 32, (cfg.name, w, kk, h, q, sorted(banks[h]))
            assert seen == set(range(64)), cfg.name


def test_sass_of_the_register_fed_tf32_kernels(compile_cache):
    """prep=3: the tf32 HGMMAs read A from registers (a register where the descriptor would
    be), a k-tile's K_STEPS of them in one group, the fragments of two k-tiles in distinct
    registers (ptxas waits for the group before last, never for each HGMMA), 4 ld.shared a
    k-step and 64 rows; no local memory, one kernel."""
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    built = dict(compile_many(RS_SET, "sm_90", cache_dir=compile_cache))
    _fp32_compile_checks(built)  # no spill, no serialisation, no warning
    for c in RS_SET:
        r = built[c]
        sass = subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                              env=env, check=True).stdout
        assert re.findall(r"Function : (\w+)", sass) == [c.name]
        hgmma = [l for l in sass.splitlines() if "HGMMA.64x" in l]
        per_tile = (c.wm // 64) * (c.bk // 8)
        assert len(hgmma) == 2 * per_tile, (c.name, len(hgmma))  # the k-tiles in pairs
        assert all(re.search(rf"HGMMA\.64x{c.mma_n}x8\.F32\.TF32 R\d+, R\d+, gdesc", l) for l in hgmma), c.name
        a_regs = {re.search(r"TF32 R\d+, (R\d+)", l).group(1) for l in hgmma}
        assert len(a_regs) == 2 * per_tile, (c.name, a_regs)  # two sets of fragments
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" not in sass.split(hgmma[-1].strip()[:8])[0], c.name
        assert sass.count("DEPBAR.LE gsb0, 0x1") == 2, c.name
        assert len(re.findall(r"\bLDS\b", sass)) >= 2 * per_tile * 4, c.name
        assert "STL" not in sass and "LDL" not in sass


def test_register_operand_rows_in_pairs(compile_cache):
    """rs_pairs=1 (``_rp``): prep 3 with an MN-major register operand (NN, TT) only,
    searched beside rs_pairs=0 and taken by the tf32 default wherever the variant allows it;
    its fragments load as two LDS.64 a k-step where the plain kernel takes four LDS, and NN's
    transposed epilogue stores each thread's own pairs (h = 0 and 1: neighbouring columns of
    C) with no lane exchange."""
    import optuna

    from codegen.arch import parse_arch
    from codegen.families.wgmma import params_of, suggest, unproven_reasons, valid_configs

    nn = RP_SET[0]
    assert nn.name.endswith("_prer_rp") and WgmmaConfig.from_name(nn.name) == nn
    assert WgmmaConfig.from_dict(nn.to_dict()) == nn and nn.rs_pairs == 1 and nn.r_mn
    assert all(check_wgmma(c, "sm_90") == [] for c in RP_SET)
    assert unproven_reasons(nn) == []
    valid = list(valid_configs("sm_90", DType.TF32, (4096, 4096, 4096)))
    paired = [c for c in valid if c.rs_pairs]
    # every paired point is prep 3 (NN: the plain problem), beside its twin without pairs
    assert paired and all(c.prep == 3 and c.r_mn for c in paired)
    assert all(dataclasses.replace(c, rs_pairs=0) in valid for c in paired)
    assert len(paired) == sum(c.prep == 3 and not c.rs_pairs for c in valid)
    # the trial parameters round-trip, rs_pairs asked of prep 3 alone
    arch = parse_arch("sm_90")
    for c in valid:
        p = params_of(c, (4096, 4096, 4096), arch)
        assert ("wgmma_rs_pairs" in p) is (c.prep == 3), c.name
        assert suggest(optuna.trial.FixedTrial(p), DType.TF32) == c, c.name
    spec = FAMILIES["wgmma"]
    for layout, pairs in ((Layout.NN, 1), (Layout.TT, 1), (Layout.NT, 0)):
        d = spec.default(DType.TF32, Variant(layout=layout))
        assert (d.layout, d.prep, d.rs_pairs) == (layout, 3, pairs) and not check_wgmma(d, "sm_90")
    for bad, why in ((dataclasses.replace(nn, layout=Layout.NT), "nt"),
                     (dataclasses.replace(nn, prep=2), "prep=2"),
                     (dataclasses.replace(nn, rs_pairs=2), "rs_pairs=2")):
        assert any(w.startswith("rs_pairs=") and why in w for w in check_wgmma(bad, "sm_90")), bad.name
    src, plain = render(nn), render(RS_GOLDEN)
    assert "__shfl_xor_sync" in plain and "__shfl_xor_sync" not in src
    assert "float v0 = alpha * acc[i][mb * 4 + e];" in src
    assert "float v1 = alpha * acc[i][mb * 4 + 2 + e];" in src
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    pairs = [RP_SET[0], RP_SET[1]]
    built = dict(compile_many(pairs + [RS_GOLDEN, RS_SET[1]], "sm_90", cache_dir=compile_cache))
    _fp32_compile_checks({c: built[c] for c in pairs})  # no spill, no serialisation, no warning
    for c, before in zip(pairs, (RS_GOLDEN, RS_SET[1])):
        sass, old = (subprocess.run([tool, "-sass", str(built[x].cubin)], capture_output=True,
                                    text=True, env=env, check=True).stdout for x in (c, before))
        per_tile = (c.wm // 64) * (c.bk // 8)  # wgmma k-steps a k-tile; two k-tiles' loops
        assert len(re.findall(r"\bLDS\.64\b", sass)) == 2 * per_tile * 2, c.name
        lds32 = r"\bLDS(?!\.)\b"  # a 4-byte ld.shared
        assert not re.findall(lds32, sass) and len(re.findall(lds32, old)) == 2 * per_tile * 4
        assert "SHFL.BFLY" not in sass, c.name


def test_the_transposed_epilogue_keeps_its_row_addresses_out_of_local_memory(compile_cache):
    """NN's C^T epilogue (prep 3) walks 32 rows of C a thread, 8 apart: their addresses are
    one 64-bit offset stepped by 8 ldc, not a sign extension and a 64-bit multiply a row,
    which nvcc computed up front wherever the tile's first row was not a constant (a
    cluster's rank) and ptxas then spilled beside 128 accumulators (248 bytes in the
    256x128 pairs in a cluster, 100 with bias + SiLU into bf16, 52 with one consumer of
    128x128, 272 in 256x64's cluster). The lane-exchange form (no pairs) keeps its row
    products: stepped, one with bias + SiLU into bf16 spilled 4 bytes."""
    names = ["gemm_wgmma_tf32_256x128x32_c2_s4_x2_p1_g8_prer_rp",
             "gemm_wgmma_tf32_256x128x32_c2_s4_x2n_p1_g8_prer_rp",
             "gemm_wgmma_tf32_128x128x32_c1_s4_x1_p1_g8_prer_rp",
             "gemm_wgmma_tf32_256x64x32_c1_s4_x2_p1_g8_prer_rp",
             "gemm_wgmma_tf32_256x128x32_c2_s4_x2_p1_g8_prer_rp_obf16_bias_silu",
             "gemm_wgmma_tf32_256x128x32_c2_s4_x2_p1_g8_prer",
             "gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_obf16_bias_silu"]
    cfgs = [WgmmaConfig.from_name(n) for n in names]
    assert all(check_wgmma(c, "sm_90") == [] for c in cfgs)
    src = render(cfgs[0])
    assert "OutT* const p = Cb + off0 + static_cast<size_t>(mb * 8) * ldc;" in src
    assert "static_cast<size_t>(row) * ldc" not in src
    built = dict(compile_many(cfgs, "sm_90", cache_dir=compile_cache))
    for c in cfgs:
        r = built[c].resources
        assert built[c].ok and r.spill_stores == 0 and r.stack_frame == 0, (c.name, r)


def test_the_runner_of_a_register_fed_kernel_maps_both_operands_as_stored(monkeypatch):
    """prep=3: one kernel, no pre-pass and no workspace; A and B mapped as stored, TFLOAT32,
    with tma_boxes' boxes (NN: A K-major BM x 32, B in 32 x 32 boxes of its rows)."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    for cfg, lda, ldb, a_dim, b_dim in ((RS_GOLDEN, 204, 516, [200, 300], [512, 200]),
                                        (RS_SET[1], 304, 208, [300, 200], [200, 512])):
        fake.encoded.clear(), fake.launched.clear()
        r = TmaRunner(cfg, b"")
        assert r.prep is None
        m, n, k = 300, 512, 200
        r.bind(fake.g, m, n, k, lda, ldb, 512)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
        assert fake.launched == [(cfg.name, cfg.grid(m, n, 132), cfg.block(), 5)] and not fake.asked
        boxes = cfg.tma_boxes()
        assert [(e["tensorDataType"], e["globalDim"], e["globalStrides"], e["boxDim"])
                for e in fake.encoded] == [
            ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", a_dim, [lda * 4], list(boxes["A"][::-1])),
            ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", b_dim, [ldb * 4], list(boxes["B"][::-1]))]


def test_the_runner_of_a_tma_rounded_kernel_maps_the_callers_operands_as_tf32(monkeypatch):
    """prep=2's runner loads the GEMM alone and launches it once, its maps over the caller's A
    (M x K) and B (stored N x K) at their own leading dimensions, of type TFLOAT32."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    g = fake.g
    cfg = PRET_GOLDEN
    r = TmaRunner(cfg, b"")
    assert r.prep is None and fake.loaded == [(cfg.name, cfg.smem_bytes)]
    m, n, k = 300, 512, 200
    r.bind(g, m, n, k, 204, 208, 512)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
    assert fake.launched == [(cfg.name, cfg.grid(m, n, 132), cfg.block(), 5)]
    assert [(e["tensorDataType"], e["globalAddress"], e["globalDim"], e["globalStrides"])
            for e in fake.encoded] == [("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", 0x10000, [k, m], [204 * 4]),
                                  ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", 0x20000, [k, n], [208 * 4])]
    with pytest.raises(TmaUnsupported, match="lda=201"):
        r.bind(g, m, n, k, 201, 208, 512)


def test_the_runner_of_a_tma_rounded_nn_kernel_copies_b_alone(monkeypatch):
    """prep=2 NN: the pre-pass transposes and rounds B alone (a_blocks = 0, B's tiles only)
    into the stream's workspace; A's map is over the caller's A as TFLOAT32, Bt's over the
    workspace as FLOAT32 (rounded already). A batch with A shared and B batched: a copy of
    B per problem (one pre-pass launch each), Bt's map rank 3, A's rank 2; TT the other way
    round. B's leading dimension is free, A's is TMA's."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    g, encoded, packs = fake.g, fake.encoded, fake.prep_args
    m, n, k = 300, 500, 200
    cfg = dataclasses.replace(PRET_GOLDEN, layout=Layout.NN)
    r = TmaRunner(cfg, b"")
    assert [x[0] for x in fake.loaded] == [cfg.name, f"{cfg.name}_prep"]
    ldw = cfg.prep_ld(k)
    blocks, a_blocks = cfg.prep_grid(m, n, k)
    assert a_blocks == 0 and blocks == 7 * 16
    r.bind(g, m, n, k, 204, 501, 512)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
    assert [x[:2] for x in fake.launched] == [(f"{cfg.name}_prep", (blocks, 1, 1)),
                                              (cfg.name, cfg.grid(m, n, 132))]
    assert packs[-1] == (0x10000, 204, 0x20000, 501, m, n, k, 0x4000000, 0x4000000, ldw, 0)
    view = lambda e: (e["tensorDataType"][len("CU_TENSOR_MAP_DATA_TYPE_"):], e["globalAddress"],  # noqa: E731
                      e["tensorRank"], e["globalDim"], e["globalStrides"])
    assert [view(e) for e in encoded] == [("TFLOAT32", 0x10000, 2, [k, m], [204 * 4]),
                                          ("FLOAT32", 0x4000000, 2, [k, n], [ldw * 4])]
    with pytest.raises(TmaUnsupported, match="lda=201"):
        r.bind(g, m, n, k, 201, 501, 512)
    # a batch of 3: A shared (x @ W for a batch of W), B batched
    fake.launched.clear(), encoded.clear()
    sb = k * 501
    r.bind(g, m, n, k, 204, 501, 512, batch=3, strides=(0, sb, m * 512))(
        0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
    assert [x[0] for x in fake.launched] == [f"{cfg.name}_prep"] * 3 + [cfg.name]
    assert [p[2] for p in packs[-3:]] == [0x20000 + i * sb * 4 for i in range(3)]
    assert [p[8] for p in packs[-3:]] == [0x4000000 + i * n * ldw * 4 for i in range(3)]
    assert [view(e)[:3] for e in encoded] == [("TFLOAT32", 0x10000, 2), ("FLOAT32", 0x4000000, 3)]
    # TT: A copied (transposed) alone, B read as stored (N x K)
    encoded.clear()
    tt = dataclasses.replace(PRET_GOLDEN, layout=Layout.TT)
    TmaRunner(tt, b"").bind(g, m, n, k, 301, 204, 512)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 5)
    assert packs[-1][-1] == tt.prep_grid(m, n, k)[1] > 0
    assert [view(e) for e in encoded] == [("FLOAT32", 0x4000000, 2, [k, m], [ldw * 4]),
                                          ("TFLOAT32", 0x20000, 2, [k, n], [204 * 4])]


def test_fp32_geometry():
    c = TF32_GOLDEN
    assert c.fp32_data and c.mma_k == 8 and c.elem == 4 and c.tma_dtype is DType.F32
    assert c.tx_bytes == 128 * 32 * 4 + 32 * 128 * 4 == 32768
    assert c.stage_bytes == c.tx_bytes + 32 * 128 * 4 == 49152  # + Bt
    assert c.smem_bytes == 1024 + 4 * 49152 + 1024
    assert c.tma_boxes() == {"A": (128, 32), "B": (32, 32)}
    assert dataclasses.replace(c, cluster=2).tma_boxes() == {"A": (128, 32), "B": (16, 32)}
    t = T3_GOLDEN
    assert t.stage_bytes == 16384 + 16384 + 16384 + 16384 + 16384  # A, B, Bt, As, Bts
    assert t.acc_regs == 2 * 64 * 128 // 128  # partial sums and totals
    v = t.template_values()
    assert (v["BT_OFF"], v["AS_OFF"], v["BTS_OFF"]) == (32768, 49152, 65536)
    assert v["K_STEPS"] == 4 and v["B_CHUNKS"] == 4 and v["B_BOX_COLS"] == 32 and v["NC"] == 256
    assert DEFAULT_WGMMA.tma_dtype is DType.F16 and DEFAULT_WGMMA.conv_bytes == 0


def test_fp32_space_and_sample():
    keys = list(TF32_SPACE)
    valid = [c for vals in itertools.product(*TF32_SPACE.values())
             if not check_wgmma(c := WgmmaConfig(terms=3 if vals[-1] is DType.F32 else 1,
                                                 **dict(zip(keys, vals))), "sm_90")]
    assert {c.dtype for c in valid} == {DType.TF32, DType.F32}
    for k, vs in TF32_SPACE.items():
        assert {getattr(c, k) for c in valid} == set(vs), k
    s = sample_wgmma_tf32()
    assert len(s) >= 6 and len(set(s)) == len(s) and sample_wgmma_tf32() == s
    assert all(check_wgmma(c, "sm_90") == [] for c in s)
    for k in ("consumers", "cluster", "persistent", "dtype"):
        assert {getattr(c, k) for c in s} == set(TF32_SPACE[k]), k


@pytest.mark.parametrize("cfg", [TF32_GOLDEN, T3_GOLDEN, PREP_GOLDEN, PRET_GOLDEN], ids=lambda c: c.name)
def test_fp32_golden_source(cfg):
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(cfg)


def test_fp32_source_says_what_it_does():
    src = render(TF32_GOLDEN)
    assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in src
    assert " %64, %65, p, 1, 1;" in src  # no transpose immediates for tf32
    assert "cvt.rna.tf32.f32" in src and "fence.proxy.async.shared::cta" in src
    assert "mbar_arrive_expect_tx(bar, TX_BYTES);" in src and "n0 + j * 32" in src
    assert "bar.sync 1, %0" in src and "split_tf32" not in src and "bar.red" not in src
    assert "B box 32 x 32 (rows x cols)" in src
    t3 = render(T3_GOLDEN)
    assert "split_tf32" in t3 and "bar.red.or.pred" in t3 and "clear_nonfinite_big" in t3
    assert "acc[i][j] += part[i][j]" in t3
    # two stages: the tf32 loop syncs the consumers before converting into the previous stage
    two = render(dataclasses.replace(TF32_GOLDEN, stages=2))
    assert two.count("consumers_sync();") == render(TF32_GOLDEN).count("consumers_sync();") + 1


def _conversion_plan(bn: int, nc: int):
    """The template's B conversion, mirrored: (phase key, raw address, Bt offset, n, k block)."""
    for ct in range(nc):
        for it in range((bn * 2 + nc - 1) // nc):
            w = ct + it * nc
            if w >= bn * 2:
                continue
            l, box, kb = w % 8, w // 64, ((w % 8 >> 1) + w // 8) % 8
            yield (it, ct // 8), l, box, kb


@pytest.mark.parametrize("bn,nc", [(64, 128), (128, 256), (192, 128), (256, 256)])
def test_fp32_conversion_covers_b_once_without_bank_conflicts(bn, nc):
    """B (k, n) from TMA's 128B-swizzled boxes to Bt (n, k), K-major 128B-swizzled: every
    element exactly once, and each 8-lane phase of 16-byte accesses on 8 distinct bank groups."""
    def swz(row, chunk):
        return row * 128 + ((chunk ^ (row % 8)) << 4)

    seen, reads, writes = [], {}, {}
    for key, l, box, kb in _conversion_plan(bn, nc):
        for i in range(4):
            k = 4 * kb + i
            raw = box * 4096 + k * 128 + ((l ^ (k % 8)) << 4)  # as the template computes it
            assert raw == box * 4096 + swz(k, ((box * 32 + 4 * l) % 32) // 4)  # where TMA put it
            reads.setdefault(key + (i,), []).append(raw % 128 // 16)
        for j in range(4):
            n = box * 32 + 4 * l + j
            off = n * 128 + ((kb ^ (n % 8)) << 4)
            assert off == swz(n, kb)  # K-major: row n, k = 4 kb .. 4 kb + 3
            writes.setdefault(key + (j,), []).append(off % 128 // 16)
            seen += [(n, 4 * kb + i) for i in range(4)]
    assert sorted(seen) == [(n, k) for n in range(bn) for k in range(32)]
    for banks in list(reads.values()) + list(writes.values()):
        assert len(set(banks)) == len(banks), banks


def _fp32_set() -> list[WgmmaConfig]:
    return list(dict.fromkeys(sample_wgmma_tf32() + [TF32_GOLDEN, T3_GOLDEN, PRET_GOLDEN] + RS_SET +
                              [WgmmaConfig.from_name(n) for n in wgmma_probe.FP32_CONFIGS]))


@pytest.fixture(scope="module")
def compiled_fp32(compile_cache):
    return _compiled(_fp32_set(), compile_cache, whole=False)


@pytest.mark.gpu
def test_the_whole_fp32_set_compiles_without_spills_or_serialisation(compile_cache):
    _fp32_compile_checks(_compiled(_fp32_set(), compile_cache, whole=True))


def test_fp32_configs_compile_without_spills_or_serialisation(compiled_fp32):
    _fp32_compile_checks(compiled_fp32)


def _fp32_compile_checks(compiled_fp32) -> None:
    failed = {c.name: r.error for c, r in compiled_fp32.items() if not r.ok}
    assert not failed, failed
    for c, r in compiled_fp32.items():
        assert r.arch == "sm_90a"
        assert "C7508" not in r.log and "C7520" not in r.log, (c.name, r.log)
        assert "serialized" not in r.log and "warning" not in r.log.lower(), (c.name, r.log)
        res = r.resources
        assert res.spill_bytes == 0 and res.stack_frame == 0, (c.name, res)
        assert res.registers == c.launch_regs, (c.name, res.registers)
        assert res.smem_dynamic == c.smem_bytes and res.smem_static == 0, (c.name, res)


def test_fp32_sass_has_tf32_hgmma(compiled_fp32, compile_cache):
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    for c in (TF32_GOLDEN, T3_GOLDEN, WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c2_s4_x2_p1_g8"),
              WgmmaConfig.from_name("gemm_wgmma_f32_128x64x32_c1_s3_x2_p1_g8_t3")):
        r = compile_config(c, "sm_90", compile_cache)
        sass = subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                              env=env, check=True).stdout
        hgmma = [l for l in sass.splitlines() if "HGMMA.64x" in l]
        assert len(hgmma) == c.terms * (c.wm // 64) * (c.bk // 8), (c.name, len(hgmma))
        assert all(f"HGMMA.64x{c.bn}x8.F32.TF32" in l and "tnsp" not in l for l in hgmma), c.name
        assert sass.count("UTMALDG.2D") >= 1 + c.bn // 32, c.name
        assert "FENCE.VIEW.ASYNC.S" in sass and "BAR.SYNC.DEFER_BLOCKING 0x1" in sass
        assert ("BAR.RED.OR" in sass) == (c.terms == 3), c.name
        assert "STL" not in sass and "LDL" not in sass


def test_sass_of_the_tma_rounded_tf32_kernel(compiled_fp32, compile_cache):
    """prep=2: the pre-pass's main loop alone: tf32 HGMMAs from two TMA loads a stage (A and
    B as stored), nothing converted, one kernel in the cubin."""
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    c = PRET_GOLDEN
    r = compiled_fp32[c]
    sass = subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                          env=env, check=True).stdout
    assert re.findall(r"Function : (\w+)", sass) == [c.name]
    hgmma = [l for l in sass.splitlines() if "HGMMA.64x" in l]
    assert len(hgmma) == (c.wm // 64) * (c.bk // 8)
    assert all(f"HGMMA.64x{c.bn}x8.F32.TF32" in l and "tnsp" not in l for l in hgmma)
    assert sass.count("UTMALDG.2D") == 2 and "STS" not in sass.split("HGMMA")[0]
    assert "STL" not in sass and "LDL" not in sass


def test_fp32_probe_plan():
    cfgs = [WgmmaConfig.from_name(n) for n in wgmma_probe.FP32_CONFIGS]
    assert all(check_wgmma(c, "sm_90") == [] for c in cfgs)
    assert {c.dtype for c in cfgs} == {DType.TF32, DType.F32}
    assert {c.stages == 2 for c in cfgs} == {True, False} and {c.cluster for c in cfgs} == {1, 2}
    assert {c.consumers for c in cfgs if c.terms == 3} == {1, 2}
    kinds = [c.get("kind") for c in wgmma_probe.cases(fp32=True)]
    assert kinds.count(None) == 10 and {"deep", "nonfinite", "tiny"} <= set(kinds)
    assert wgmma_probe.gate(4096, DType.F32) == 1e-5 == wgmma_probe.gate(16384, DType.F32)
    assert wgmma_probe.gate(8192, DType.TF32) == 2e-4
    assert wgmma_probe.timeable([dict(status="ok"), dict(status="fail", kind="deep")])
    assert not wgmma_probe.timeable([dict(status="fail"), dict(status="ok", kind="deep")])
    assert not wgmma_probe.timeable([dict(status="ok"), dict(status="hang", kind="tiny")])


def test_tf32x3_accuracy_bench_plan_and_plot(tmp_path):
    import tf32x3_accuracy as acc  # bench/, on the path above; imports no GPU package

    for name in (acc.T3_DEFAULT, acc.TF32_DEFAULT, acc.PRESPLIT_DEFAULT):
        assert check_wgmma(WgmmaConfig.from_name(name), "sm_90") == []
    assert WgmmaConfig.from_name(acc.T3_DEFAULT).terms == 3
    # the two split modes of 3xTF32, raced in one run
    assert not WgmmaConfig.from_name(acc.T3_DEFAULT).presplit
    assert WgmmaConfig.from_name(acc.PRESPLIT_DEFAULT).presplit
    assert {"wgmma_3xtf32", "wgmma_3xtf32_presplit"} <= set(acc.WGMMA_METHODS) <= set(acc.METHODS)
    # the NaN / Inf case: rows every method's TMA maps can read (16-byte multiples)
    import inspect

    special = inspect.signature(acc.special_inputs).parameters
    assert special["n"].default % 4 == 0 and special["k"].default % 4 == 0
    assert acc.SIMT_DEFAULT in (ROOT / "artifacts/library/manifest.json").read_text()
    assert acc.DISTRIBUTIONS["uniform_pm1_k16384"]["k"] == 16384 and len(acc.DISTRIBUTIONS) == 5
    assert [tuple(s) for s in acc.SPEED_SHAPES] == [(4096,) * 3, (8192,) * 3, (8192, 8192, 1024)]
    pytest.importorskip("matplotlib")
    report = dict(gpu="NVIDIA H200", accuracy=[
        dict(distribution=d, methods={m: dict(rel_fro=1e-6 * (i + 1)) for i, m in
                                      enumerate(acc.METHODS)}) for d in acc.DISTRIBUTIONS],
        speed=[dict(shape=list(s), methods={m: dict(tflops=10.0 * (i + 1)) for i, m in
                                            enumerate(acc.METHODS)}) for s in acc.SPEED_SHAPES])
    acc.plot(report, tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 10000


# ---- C's type, the bias and the activation (the epilogue) ----------------------------------
from codegen.check import check  # noqa: E402
from codegen.families.wgmma import c_tma_reasons, problem_reasons  # noqa: E402

#: x @ W.t() (NT: B column-major, both operands K-major), fp16 C with an fp16 bias and gelu,
#: from registers
EPI_GOLDEN = dataclasses.replace(DEFAULT_WGMMA, layout=Layout.NT, out=DType.F16, bias="out",
                                 act="gelu")
#: bf16 C through the TMA-store epilogue (SWIZZLE_64B buffers), silu, no bias
EPI_TS_GOLDEN = WgmmaConfig(bm=128, bn=256, stages=4, dtype=DType.BF16, store=1, out=DType.BF16,
                            act="silu")


def test_epilogue_names_round_trip_and_check():
    assert EPI_GOLDEN.name == "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_nt_of16_bias_gelu"
    assert EPI_TS_GOLDEN.name == "gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_ts_obf16_silu"
    pre = dataclasses.replace(PREP_GOLDEN, out=DType.BF16, bias="f32", act="gelu_tanh", store=1)
    t3 = dataclasses.replace(T3_GOLDEN, out=DType.F16, act="relu")
    assert pre.name == "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre_ts_obf16_biasf32_gelut"
    for c in (EPI_GOLDEN, EPI_TS_GOLDEN, pre, t3):
        assert WgmmaConfig.from_name(c.name) == c and WgmmaConfig.from_dict(c.to_dict()) == c
        assert check(c, "sm_90") == [], c.name
    # the family writes every C type with every bias and activation (FamilySpec.epilogue)
    from codegen.families import FAMILIES

    assert FAMILIES["wgmma"].epilogue
    assert check(dataclasses.replace(DEFAULT_WGMMA, bias="out", act="silu"), "sm_90") == []
    # the common rules still hold for this family
    assert check(dataclasses.replace(DEFAULT_WGMMA, bias="f32"), "sm_90") == [
        "an fp32 bias with fp32 C is bias='out'"]
    assert any("activation 'tanh' is not one of" in w
               for w in check(dataclasses.replace(DEFAULT_WGMMA, act="tanh"), "sm_90"))
    assert any("C cannot be tf32" in w
               for w in check(dataclasses.replace(DEFAULT_WGMMA, out=DType.TF32), "sm_90"))


def test_two_byte_c_halves_the_staging_buffers():
    c = EPI_TS_GOLDEN
    assert c.c_row_bytes == 64 and c.c_buf_bytes == 64 * 64 == 4096 and c.c_bytes == 16384
    assert STORE_GOLDEN.c_row_bytes == 128 and STORE_GOLDEN.c_bytes == 32768
    assert c.smem_bytes == 1024 + 4 * 49152 + 16384 + 1024
    assert c.tma_boxes()["C"] == (64, 32)  # 32 columns: 64 B rows, the SWIZZLE_64B span
    v = c.template_values()
    assert (v["C_ES"], v["C_ROW_BYTES"], v["OUT_T"], v["ACT"], v["BIAS"]) == \
        (2, 64, "__nv_bfloat16", "silu", False)
    # a 128x256 tile of 2-byte C fits 5 stages with its buffers (fp32 C does not)
    assert check_wgmma(dataclasses.replace(c, stages=5), "sm_90") != []
    assert dataclasses.replace(c, stages=4, bn=192).smem_bytes < \
        dataclasses.replace(STORE_GOLDEN, stages=4, bn=192).smem_bytes


def test_c_tma_reasons_for_two_byte_c():
    assert c_tma_reasons(1024, 0x100, 1024, DType.F16) == []
    assert c_tma_reasons(1028, 0x100, 1028, DType.F16) == [
        "ldc=1028 x 2 B = 2056 B is not a multiple of 16 bytes",
        "N=1028 is not a multiple of 8 fp16 values: TMA stores write C's rows in 16-byte pieces, past column N"]
    assert c_tma_reasons(1032, 0x108, 1030, DType.BF16) == [
        "C at 0x108 is not 16-byte aligned (off by 8 B)",
        "N=1030 is not a multiple of 8 bf16 values: TMA stores write C's rows in 16-byte pieces, past column N"]
    assert c_tma_reasons(1028, 0x100, 1028) == []  # fp32 C: 4 floats are 16 bytes
    ts16 = dataclasses.replace(STORE_GOLDEN, out=DType.F16)
    assert problem_reasons(ts16, (4096, 4100, 4096)) == [
        "TMA cannot describe the operands: ldb=4100 x 2 B = 8200 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: ldc=4100 x 2 B = 8200 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: N=4100 is not a multiple of 8 fp16 values: TMA stores "
        "write C's rows in 16-byte pieces, past column N"]
    assert problem_reasons(STORE_GOLDEN, (4096, 4104, 4096)) == []
    # the dispatch's rule: N a whole number of 16 bytes of C
    assert STORE_GOLDEN.takes(64, 4100, 64, (16, 16, 16))
    assert not ts16.takes(64, 4100, 64, (16, 16, 16)) and ts16.takes(64, 4104, 64, (16, 16, 16))
    assert EPI_GOLDEN.takes(64, 4100, 64, (16, 16, 2))  # registers: any N, any C


#: the tf32 pre-pass reading a column-major A (it transposes A, copies a column-major B)
PREP_TN_GOLDEN = dataclasses.replace(PREP_GOLDEN, layout=Layout.TN)


@pytest.mark.parametrize("cfg", [EPI_GOLDEN, EPI_TS_GOLDEN, PREP_TN_GOLDEN], ids=lambda c: c.name)
def test_epilogue_golden_source(cfg):
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(cfg)


def test_epilogue_source_says_what_it_does():
    src = render(EPI_GOLDEN)
    assert "// Computes:   C = gelu(alpha * A * B + beta * C + bias);" in src
    assert "fp32 accumulation, fp16 output, a __half bias of N" in src
    assert "#include <cuda_fp16.h>" in src and "cuda_bf16.h" not in src
    assert "using OutT = __half;" in src and "using BiasT = __half;" in src
    assert "constexpr bool HAS_BIAS = true;" in src
    # GELU from the tail beyond |x| (no 1 + erf, no cancellation), no libm erf call
    assert "return x * (x < 0.0f ? q : 1.0f - q);" in src
    assert "erff(" not in src and "erfcf(" not in src
    # each thread reads the bias of a column pair once for all its rows in those columns
    assert "const float2 b = b_next;" in src and "b_next = bias_pair(bias, col + 8, N);" in src
    assert "__floats2half2_rn" in src and "v0 = finish_with(v0, b.x);" in src
    ts = render(EPI_TS_GOLDEN)
    assert "#include <cuda_bf16.h>" in ts and "cuda_fp16.h" not in ts
    assert "C (bf16, SWIZZLE_64B) box 64 x 32" in ts and "C_ES = 2;" in ts
    assert "sts_pair(cbuf + r * 64 + (((cc / 8) ^ ((r / 2) % 4)) * 16) + (cc % 8) * 2, v0, v1);" in ts
    assert "sts64" not in ts and "expf(-x)" in ts
    assert "bq[q] = bias_pair(bias, n0 + sb * C_SLICE + q * 8 + (lane % 4) * 2, N);" in ts
    plain = render(DEFAULT_WGMMA)  # fp32 C: no fp16 / bf16 header, the 8-byte pair stores
    assert "cuda_fp16.h" not in plain and "cuda_bf16.h" not in plain
    assert "return *reinterpret_cast<const float2*>(p);" in plain


@pytest.mark.parametrize("wm", [64, 128])
def test_two_byte_c_slices_are_written_once_without_bank_conflicts(wm):
    """2-byte C: each thread's pair of columns (cc, cc + 1) of row r goes, as one 4-byte store,
    where TMA's SWIZZLE_64B reads it (16-byte chunk c of a 64-byte row at c ^ ((r / 2) % 4):
    address bits 4-5 XOR bits 7-8), every element once, and each warp's 32 stores on 32
    distinct banks."""
    written = {}
    for warp in range(4):
        for i in range(wm // 64):
            for h in range(2):
                for q in range(4):
                    banks = []
                    for lane in range(32):
                        cc = q * 8 + (lane % 4) * 2
                        r = i * 64 + warp * 16 + lane // 4 + h * 8
                        at = r * 64 + (((cc // 8) ^ ((r // 2) % 4)) * 16) + (cc % 8) * 2
                        assert at % 4 == 0
                        for e in range(2):
                            plain = r * 64 + (cc + e) * 2  # unswizzled byte address
                            assert at + 2 * e == plain ^ (((plain >> 7) & 3) << 4)
                            assert (r, cc + e) not in written
                            written[(r, cc + e)] = at + 2 * e
                        banks.append(at // 4 % 32)
                    assert sorted(banks) == list(range(32)), banks
    assert len(written) == wm * 32 and len(set(written.values())) == wm * 32


def test_the_runner_maps_c_in_its_type_and_passes_the_bias(monkeypatch):
    """The TMA-store epilogue's C map is encoded in C's type (SWIZZLE_64B for 2-byte C, the
    16-byte rules in C's elements), and the bias pointer follows ldc in the parameters."""
    import types

    from tuner.runtime import driver, tma
    from tuner.runtime.runners import TmaRunner

    encoded, packed = [], []

    class Map:
        def getPtr(self):
            return 0

    class Image(_Image):
        def launch(self, f, grid, block, stream, address):
            n = len(TmaRunner.SIGNATURE)
            ptrs = (ctypes.c_void_p * (3 + n)).from_address(address)
            packed.append([kind.from_address(p).value
                           for (_, kind, _), p in zip(KERNEL_SCALARS, ptrs[3:])])

    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", Image)
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map())
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
    cfg = dataclasses.replace(EPI_TS_GOLDEN, bias="f32")
    r = TmaRunner(cfg, b"")
    with pytest.raises(TmaUnsupported, match="N=1028 is not a multiple of 8 bf16 values"):
        r.bind(g, 64, 1028, 1024, 1024, 1032, 1032)
    with pytest.raises(TmaUnsupported, match="ldc=1036 x 2 B = 2072 B"):
        r.bind(g, 64, 1024, 1024, 1024, 1024, 1036)
    run = r.bind(g, 64, 1024, 512, 512, 1024, 1032)
    run(0x10000, 0x20000, 0x30000, 0.5, 2.0, 0, bias=0x40000)
    c_map = encoded[2]
    assert c_map["tensorDataType"] == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"
    assert c_map["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_64B"
    assert c_map["globalDim"] == [1024, 64] and c_map["globalStrides"] == [1032 * 2]
    assert c_map["boxDim"] == [32, 64]
    assert packed == [[64, 1024, 512, 0.5, 2.0, 0x30000, 1032, 0x40000, 1, 0, 0]]


#: a modest sample of the new paths, compiled for sm_90a (CI has two cores): each C type in
#: each epilogue, a bias of each kind, each activation, each layout, with ping-pong, a
#: cluster, the tf32 pre-pass, tf32 and 3xTF32 converted in shared memory
VARIANT_NAMES = [
    EPI_GOLDEN.name,                                                          # NT, fp16 C + bias, gelu
    EPI_TS_GOLDEN.name,                                                       # bf16 C by TMA, silu
    PREP_TN_GOLDEN.name,                                                      # the pre-pass transposing A
    "gemm_wgmma_f16_128x128x64_c1_s5_x1_p0_g1_ts_bias_relu",                  # fp32 C + bias, TMA store
    "gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_ts_tn_obf16_bias",             # TN, 2-byte TMA store
    "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts_tn_of16_gelut",           # ping-pong, TN
    "gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8_tt_obf16_biasf32",             # cluster, TT, fp32 bias
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre_ts_tt_of16_biasf32_relu",  # pre-pass TT, fp16 C
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2_p1_g8_nt_of16",                      # tf32 B^T in place, cluster
    "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3_nt_obf16_gelu",              # 3xTF32 NT, bf16 C
]
#: clusters along N (A multicast) and ping-pong consumers in a cluster either way
CLUSTER_NAMES = [
    "gemm_wgmma_f16_128x128x64_c2_s5_x2_p1_g16_pp_ts_of16",                   # ping-pong, along M
    "gemm_wgmma_f16_128x128x64_c2_s5_x2n_p1_g16_pp_ts_tn_of16_gelut",         # along N, M-major A
    "gemm_wgmma_bf16_128x256x64_c2_s4_x2n_p1_g8_ts_nt_obf16",                 # cooperative, along N
    "gemm_wgmma_bf16_128x112x64_c2_s5_x2n_p1_g16_pp_nt_obf16_silu",           # along N, BN 112
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2n_p1_g8_nt_of16",                     # tf32 in-loop
]
VARIANT_NAMES += CLUSTER_NAMES
#: N tiles a K-major B allows beyond the 64-multiples: 112 (Llama's 14336 = 128 x 112), 96
#: with a cluster and the TMA store, and the extremes, 8 and 248
K_MAJOR_N_NAMES = [
    "gemm_wgmma_bf16_128x112x64_c2_s5_x1_p1_g16_pp_nt_obf16_silu",
    "gemm_wgmma_f16_128x96x64_c2_s6_x2_p1_g16_ts_nt_of16",
    "gemm_wgmma_f16_128x8x64_c2_s4_x1_p1_g8_nt",
    "gemm_wgmma_bf16_64x248x64_c1_s4_x1_p1_g8_tt_obf16_bias",
]
VARIANT_NAMES += K_MAJOR_N_NAMES
#: stream-K: the largest tile's accumulators with the fix-up (fp32 C from registers), TMA
#: stores of 2-byte C, a 256-row tile with a bias and GELU
STREAMK_NAMES = [
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_sk",
    "gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_ts_sk_nt_of16",
    "gemm_wgmma_bf16_256x128x64_c2_s4_x1_p1_g8_ts_sk_obf16_bias_gelu",
]
VARIANT_NAMES += STREAMK_NAMES


@pytest.fixture(scope="module")
def compiled_variants(compile_cache):
    cfgs = [WgmmaConfig.from_name(n) for n in VARIANT_NAMES]
    return dict(compile_many(cfgs, "sm_90", jobs=2, cache_dir=compile_cache))


def test_variants_compile_without_spills_or_warnings(compiled_variants):
    failed = {c.name: r.error for c, r in compiled_variants.items() if not r.ok}
    assert not failed, failed
    assert len(compiled_variants) == len(VARIANT_NAMES)
    for c, r in compiled_variants.items():
        assert check(c, "sm_90") == [], c.name
        assert r.arch == "sm_90a"
        assert "warning" not in r.log.lower() and "C7508" not in r.log, (c.name, r.log)
        res = r.resources
        assert res.spill_bytes == 0 and res.stack_frame == 0, (c.name, res)
        assert res.registers == c.launch_regs, (c.name, res.registers)
        assert res.smem_dynamic == c.smem_bytes and res.smem_static == 0, (c.name, res)


def _sass(c, compile_cache) -> str:
    tool, env = find_cuobjdump()
    if tool is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    r = compile_config(c, "sm_90", compile_cache)
    assert r.ok, r.error
    return subprocess.run([tool, "-sass", str(r.cubin)], capture_output=True, text=True,
                          env=env, check=True).stdout


def test_sass_of_the_epilogues(compiled_variants, compile_cache):
    """2-byte C through TMA: one 4-byte STS per pair (as many as fp32 C's 8-byte ones), one
    UTMASTG per slice (in each copy of the slice loop), no global store; from registers:
    4-byte pair stores of 2-byte C."""
    for name in (EPI_TS_GOLDEN.name, "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts_tn_of16_gelut"):
        c = WgmmaConfig.from_name(name)
        code = _sass(c, compile_cache)
        assert code.count("UTMASTG.2D") == TS_COPIES * c.bn // 32, c.name
        sts = re.findall(r"\bSTS(\.\w+)?\s", code)
        assert len(sts) == TS_COPIES * (c.wm // 64) * 2 * (c.bn // 8) and set(sts) == {""}, \
            (c.name, len(sts))
        assert not re.search(r"\bSTG\.", code) and "STL" not in code, c.name
    code = _sass(EPI_GOLDEN, compile_cache)
    assert re.search(r"\bSTG\.E\s", code) and not re.search(r"\bSTG\.E\.64", code)
    assert "UTMASTG" not in code and "STL" not in code


# ---- layouts: A and B row- or column-major ----------------------------------------------------
def _at(layout, **kw):
    return dataclasses.replace(DEFAULT_WGMMA, layout=Layout(layout), **kw)


def test_layouts_choose_each_operands_box_and_major_ness():
    """A row-major: one BM x BK box, K-major; column-major: BM/64 boxes of BK rows (K) by 64
    (M), M-major. B row-major: BN/64 boxes of BK rows by 64 (N-major); column-major: one
    box of BN rows (N) by BK, K-major; a cluster splits B along K or along N."""
    want = {"nn": ((128, 64), (64, 64), False, True), "nt": ((128, 64), (256, 64), False, False),
            "tn": ((64, 64), (64, 64), True, True), "tt": ((64, 64), (256, 64), True, False)}
    for layout, (a, b, a_mn, b_mn) in want.items():
        c = _at(layout)
        assert c.tma_boxes() == {"A": a, "B": b}, layout
        assert (c.a_mn_major, c.b_mn_major) == (a_mn, b_mn), layout
        v = c.template_values()
        assert (v["A_MN"], v["B_MN"], v["B_CHUNKS"]) == (a_mn, b_mn, 4 if b_mn else 1), layout
        assert (v["A_CHUNKS"], v["A_CHUNK_BYTES"]) == (2, 64 * 128)
        assert c.stage_bytes == DEFAULT_WGMMA.stage_bytes and check_wgmma(c, "sm_90") == []
    assert _at("nt", cluster=2).tma_boxes()["B"] == (128, 64)  # half of N per block
    assert _at("tt", cluster=2).template_values()["B_BOX_ROWS"] == 128
    # fp32 data: a column-major B comes K-major, so it is rounded in place (no Bt copy)
    nt = dataclasses.replace(TF32_GOLDEN, layout=Layout.NT)
    assert nt.tma_boxes() == {"A": (128, 32), "B": (128, 32)}
    assert nt.conv_bytes == 0 and nt.stage_bytes == nt.tx_bytes == 32768
    assert nt.conv_offsets[0] == nt.a_stage_bytes  # the wgmmas read B where TMA put it
    t3 = dataclasses.replace(T3_GOLDEN, layout=Layout.NT)
    assert t3.conv_bytes == t3.a_stage_bytes + t3.b_stage_bytes  # the small parts only
    assert t3.conv_offsets == (16384, 32768, 49152)
    assert T3_GOLDEN.conv_offsets == (32768, 49152, 65536)  # NN as before: A | B | Bt | As | Bts
    # the pre-pass writes K-major copies whatever the layout: its boxes do not change
    for layout in Layout:
        p = dataclasses.replace(PREP_GOLDEN, layout=layout)
        assert p.tma_boxes() == PREP_GOLDEN.tma_boxes() and not p.a_mn_major and not p.b_mn_major


@pytest.mark.parametrize("bn", [96, 112, 160, 224])
def test_a_k_major_b_takes_n_tiles_of_whole_8_row_atoms(bn):
    """A column-major B of 2-byte data (NT, TT: x @ W.t()) is one TMA box of BN rows, so BN
    need only be a multiple of 8 (and of 32 with the TMA store's slices); a row-major B
    (NN, TN) comes in 64-column boxes, and fp32 data in 32-column ones."""
    base = WgmmaConfig(dtype=DType.BF16, bm=128, bn=bn, stages=4, consumers=2, persistent=1)
    for layout in (Layout.NT, Layout.TT):
        assert check_wgmma(dataclasses.replace(base, layout=layout), "sm_90") == [], layout
        ts = check_wgmma(dataclasses.replace(base, layout=layout, store=1), "sm_90")
        assert ts == ([] if bn % 32 == 0 else [
            f"BN={bn}: the TMA-store epilogue writes C in 32-column slices, and {bn} is not a "
            "multiple of 32"]), (layout, ts)
    for layout in (Layout.NN, Layout.TN):
        assert check_wgmma(dataclasses.replace(base, layout=layout), "sm_90") == [
            f"BN={bn} is not a multiple of 64, the width of one 128-byte swizzled B box"]
    tf32 = WgmmaConfig(dtype=DType.TF32, bk=32, bm=128, bn=bn, stages=3, consumers=2,
                       layout=Layout.NT)
    assert any("not a multiple of 32" in w for w in check_wgmma(tf32, "sm_90")) == bool(bn % 32)


def test_layout_rules_in_check():
    from codegen.families import FAMILIES

    assert FAMILIES["wgmma"].layouts == frozenset(Layout)
    for layout in Layout:
        assert check(_at(layout.value), "sm_90") == []
        assert check(dataclasses.replace(PREP_GOLDEN, layout=layout), "sm_90") == []
    assert check(dataclasses.replace(TF32_GOLDEN, layout=Layout.NT), "sm_90") == []
    assert check(dataclasses.replace(T3_GOLDEN, layout=Layout.NT), "sm_90") == []
    for cfg, tail in ((dataclasses.replace(TF32_GOLDEN, layout=Layout.TN),
                       "the pre-pass (prep=1) reads a column-major A"),
                      (dataclasses.replace(T3_GOLDEN, layout=Layout.TT),
                       "the pre-pass (prep=1) reads a column-major A")):
        why = check(cfg, "sm_90")
        assert len(why) == 1 and why[0].startswith(
            f"layout {cfg.layout.value}: fp32 data converted in shared memory needs a row-major "
            "A") and why[0].endswith(tail), why


def test_tma_reasons_read_the_layout():
    # column-major A: lda is its column stride, at least M; column-major B: at least K
    assert tma_reasons(DType.F16, 128, 64, 0, 0, m=100, n=64, k=64, layout=Layout.TT) == []
    assert tma_reasons(DType.F16, 64, 64, 0, 0, m=100, n=64, k=64, layout=Layout.TT) == [
        "lda=64 is below M=100 (A is column-major)"]
    assert tma_reasons(DType.F16, 128, 56, 0, 0, m=100, n=512, k=64, layout=Layout.NT) == [
        "ldb=56 is below K=64 (B is column-major)"]
    assert tma_reasons(DType.F16, 1024, 1024, 0, 0, m=64, n=1000, k=1024, layout=Layout.NT) == []
    # the tuner's dense problem: lda = M for a column-major A, ldb = K for a column-major B
    assert problem_reasons(_at("tn"), (4095, 4096, 4096)) == [
        "TMA cannot describe the operands: lda=4095 x 2 B = 8190 B is not a multiple of 16 bytes"]
    assert problem_reasons(_at("nn"), (4095, 4096, 4096)) == []
    assert problem_reasons(_at("nt"), (4096, 4095, 4096)) == []  # ldb = K
    assert problem_reasons(_at("nt"), (4096, 4096, 4095)) == [
        "TMA cannot describe the operands: lda=4095 x 2 B = 8190 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: ldb=4095 x 2 B = 8190 B is not a multiple of 16 bytes"]


def test_layout_source():
    imm = {"nn": "0, 1", "nt": "0, 0", "tn": "1, 1", "tt": "1, 0"}
    for layout, flags in imm.items():
        src = render(_at(layout))
        assert f" %128, %129, p, 1, 1, {flags};" in src, layout
        assert f"{'column' if layout[0] == 't' else 'row'}-major A (M x K), " \
               f"{'column' if layout[1] == 't' else 'row'}-major B (K x N)" in src, layout
    tn = render(_at("tn"))
    assert "tma_load(a_dst + j * A_CHUNK_BYTES, &tmA, bar, m0 + j * 64, kt * BK, bt, a3);" in tn
    assert "(row0 / 64) * A_CHUNK_BYTES" in tn and "A box 64 x 64 (2 per stage)" in tn
    assert "(row0 / 64) * A_CHUNK_BYTES,\n                                               A_CHUNK_BYTES, 1024);" in tn
    assert "desc_at(da0, i * A_CHUNK_BYTES + kk * 16 * 128)" in tn
    nt = render(_at("nt", cluster=2))
    assert "tma_load_multicast(b_dst, &tmB, bar, kt * BK, n0 + static_cast<int>(rank) * B_BOX_ROWS," in nt
    assert "const uint64_t db0 = smem_desc(base + stage * STAGE_BYTES + A_STAGE_BYTES, 16, 1024);" in nt
    assert "const uint64_t db = desc_at(db0, kk * 32);" in nt
    tf = render(dataclasses.replace(TF32_GOLDEN, layout=Layout.NT))
    assert "B^T (column-major B): K-major as TMA brings it, so rounded in place" in tf
    assert "k block kb" not in tf and "BT_OFF = 16384" in tf
    pre = render(PREP_TN_GOLDEN)
    assert "prep_transpose(A, lda, K, M, bid, At, ldw, tile);" in pre
    assert "prep_transpose(B, ldb, K, N, bid - a_blocks, Bt, ldw, tile);" in pre
    tt = render(dataclasses.replace(PREP_GOLDEN, layout=Layout.NT))
    assert "prep_copy(A, lda, M, K, bid, At, ldw);" in tt
    assert "prep_copy(B, ldb, N, K, bid - a_blocks, Bt, ldw);" in tt and "tile[32][33]" not in tt


def test_the_runner_maps_operands_as_stored(monkeypatch):
    """Column-major operands are mapped as stored: A as K rows of M (lda), B as N rows of K
    (ldb), with the boxes of tma_boxes; lda and ldb below M and K are refused."""
    import types

    from tuner.runtime import driver, tma
    from tuner.runtime.runners import TmaRunner

    encoded = []

    class Map:
        def getPtr(self):
            return 0

    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", _Image)
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map())
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
    m, n, k = 300, 520, 136
    for layout, lda, ldb, a_dim, b_dim in (("nn", 136, 520, [k, m], [n, k]),
                                           ("nt", 136, 144, [k, m], [k, n]),
                                           ("tn", 304, 520, [m, k], [n, k]),
                                           ("tt", 304, 144, [m, k], [k, n])):
        encoded.clear()
        cfg = _at(layout)
        TmaRunner(cfg, b"").bind(g, m, n, k, lda, ldb, 520)(0x10000, 0x20000, 0x30000, 1.0, 0.0, 0)
        a, b = encoded
        assert (a["globalDim"], a["globalStrides"]) == (a_dim, [lda * 2]), layout
        assert (b["globalDim"], b["globalStrides"]) == (b_dim, [ldb * 2]), layout
        boxes = cfg.tma_boxes()
        assert a["boxDim"] == list(boxes["A"][::-1]) and b["boxDim"] == list(boxes["B"][::-1]), layout
    with pytest.raises(TmaUnsupported, match="lda=296 is below M=300"):
        TmaRunner(_at("tt"), b"").bind(g, m, n, k, 296, 144, 520)
    with pytest.raises(TmaUnsupported, match="ldb=128 is below K=136"):
        TmaRunner(_at("nt"), b"").bind(g, m, n, k, 136, 128, 520)


def test_sass_of_the_layouts(compiled_variants, compile_cache):
    """Each layout's wgmmas carry the transpose flags of its operands' tiles (tnspA for an
    M-major A, tnspB for an N-major B), TMA loads a box per 64 columns of an MN-major tile
    and one for a K-major one; tf32 never transposes."""
    for name, flags in ((EPI_GOLDEN.name, ""),
                        ("gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_ts_tn_obf16_bias", ".tnspA.tnspB"),
                        ("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8_tt_obf16_biasf32", ".tnspA"),
                        ("gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts_tn_of16_gelut", ".tnspA.tnspB")):
        c = WgmmaConfig.from_name(name)
        code = _sass(c, compile_cache)
        hgmma = [line for line in code.splitlines() if "HGMMA.64x" in line]
        assert len(hgmma) == (c.wm // 64) * (c.bk // 16), (name, len(hgmma))
        assert all(re.search(r"gdesc\[UR\d+\]" + re.escape(flags) + r",", line) for line in hgmma), \
            (name, hgmma[0])
        loads = c.bm // 64 if c.a_mn_major else 1
        loads += c.bn // 64 if c.b_mn_major else 1
        assert code.count("UTMALDG.2D") >= loads, name
        assert ("MULTICAST" in code.upper()) == (c.cluster > 1), name
    for name in K_MAJOR_N_NAMES:  # wgmma's N is the tile's, B read untransposed
        c = WgmmaConfig.from_name(name)
        code = _sass(c, compile_cache)
        hgmma = [line for line in code.splitlines() if "HGMMA.64x" in line]
        assert len(hgmma) == (c.wm // 64) * (c.bk // 16) and \
            all(f"HGMMA.64x{c.bn}x16.F32" in line and "tnspB" not in line
                and ("tnspA" in line) == c.a_mn_major for line in hgmma), \
            (name, hgmma[:1])
        assert ("MULTICAST" in code.upper()) == (c.cluster > 1), name
    for name in ("gemm_wgmma_tf32_128x128x32_c2_s4_x2_p1_g8_nt_of16",
                 "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3_nt_obf16_gelu"):
        c = WgmmaConfig.from_name(name)
        code = _sass(c, compile_cache)
        hgmma = [line for line in code.splitlines() if "HGMMA.64x" in line]
        assert len(hgmma) == c.terms * (c.wm // 64) * (c.bk // 8) and \
            all("tnsp" not in line for line in hgmma), name
        assert "STL" not in code and "LDL" not in code


# ---- strided batches ---------------------------------------------------------------------------
def test_batched_tensor_maps_have_rank_3():
    args = tensor_map_args(DType.F16, 0x10000, rows=300, cols=136, ld=136, box_rows=128,
                           box_cols=64, batch=7, batch_stride=300 * 136)
    assert args["tensorRank"] == 3 and args["globalDim"] == [136, 300, 7]
    assert args["globalStrides"] == [272, 300 * 136 * 2]
    assert args["boxDim"] == [64, 128, 1] and args["elementStrides"] == [1, 1, 1]
    one = tensor_map_args(DType.F16, 0x10000, 300, 136, 136, 128, 64, batch=1, batch_stride=8)
    assert one["tensorRank"] == 2 and one["globalStrides"] == [272]  # one problem: rank 2
    for stride, says in ((0, "batch stride 0 x 2 B"), (300 * 136 + 4, "not a positive multiple")):
        with pytest.raises(TmaUnsupported, match=says):
            tensor_map_args(DType.F16, 0, 300, 136, 136, 128, 64, batch=7, batch_stride=stride)


def test_batch_strides_follow_tma_rules():
    assert tma_reasons(DType.F16, 64, 64, 0, 0, 64, 64, 64, sa=64 * 64, sb=0) == []
    assert tma_reasons(DType.BF16, 64, 64, 0, 0, 64, 64, 64, sa=4100, sb=-8) == [
        "sA=4100 x 2 B = 8200 B (A's batch stride) is not a multiple of 16 bytes",
        "sB=-8: B's batch stride is negative"]
    assert c_tma_reasons(64, 0, 64, DType.F16, sc=64 * 63 + 4) == [
        "sC=4036 x 2 B = 8072 B (C's batch stride) is not a multiple of 16 bytes"]
    assert c_tma_reasons(64, 0, 64, DType.F32, sc=64 * 63 + 4) == []
    # the grid: a cluster per tile of every problem, or the persistent SMs over all of them
    flat = dataclasses.replace(DEFAULT_WGMMA, persistent=0)
    assert flat.tiles(300, 520, 3) == 3 * 3 * 3 and flat.grid(300, 520, 132, batch=3) == (27, 1, 1)
    assert DEFAULT_WGMMA.grid(300, 520, 132, batch=3) == (27, 1, 1)
    assert DEFAULT_WGMMA.grid(4096, 4096, 132, batch=3) == (132, 1, 1)
    cl = dataclasses.replace(DEFAULT_WGMMA, cluster=2, persistent=0)
    assert cl.grid(300, 520, 132, batch=3) == (2 * 2 * 3 * 3, 1, 1)


def test_batch_source():
    src = render(_at("tn", cluster=2, store=1, out=DType.BF16))
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert ".multicast::cluster [%0], [%1, { %3, %4, %5 }], [%2], %6;" in src
    assert "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, { %2, %3, %4 }], [%1];" in src
    assert "const int num_tiles = ctiles_m * tiles_n * batch;" in src
    assert "bt = t / (ctiles_m * tiles_n);" in src
    assert "OutT* const Cb = C + static_cast<long long>(bt) * sC;" in src
    assert "tma_store(&tmC, cbuf, n0 + sb * C_SLICE, m0 + row0, bt, c3);" in src
    assert "const bool a3 = maps3 & 1, b3 = maps3 & 2;" in src and "const bool c3 = maps3 & 4;" in src


def test_the_runner_launches_a_batch_once_with_shared_operands_of_rank_2(monkeypatch):
    """A batch is one launch: the grid over every problem's tiles, batched operands' maps of
    rank 3 (their strides in bytes), a shared operand's (stride 0) of rank 2, maps3 saying
    which, C's stride for the register epilogue; C's stride 0 and strides TMA cannot take
    are refused when bound."""
    import types

    from tuner.runtime import driver, tma
    from tuner.runtime.runners import TmaRunner

    encoded, packed, grids = [], [], []

    class Map:
        def getPtr(self):
            return 0

    class Image(_Image):
        def launch(self, f, grid, block, stream, address):
            ptrs = (ctypes.c_void_p * (3 + len(KERNEL_SCALARS))).from_address(address)
            n_maps = 3 if "_ts" in self.name else 2
            packed.append([kind.from_address(p).value
                           for (_, kind, _), p in zip(KERNEL_SCALARS, ptrs[n_maps:])])
            grids.append(grid)

    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", Image)
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map())
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
    m, n, k, batch = 100, 264, 72, 5
    plain = TmaRunner(_at("nt", persistent=0), b"")
    # A shared (x @ W.t() for a batch of W), B and C batched
    run = plain.bind(g, m, n, k, 72, 72, 270, batch=batch, strides=(0, n * k, m * 270))
    run(0x10000, 0x20000, 0x30000, 1.0, 0.0, 0)
    a, b = encoded
    assert a["tensorRank"] == 2 and a["globalDim"] == [k, m]
    assert b["tensorRank"] == 3 and b["globalDim"] == [k, n, batch]
    assert b["globalStrides"] == [72 * 2, n * k * 2] and b["boxDim"] == [64, 256, 1]
    assert packed[-1][-3:] == [batch, 0b010, m * 270]
    assert grids[-1] == (1 * 2 * batch, 1, 1)  # ceil(100/128) x ceil(264/256) tiles a problem
    # the TMA store (either staging): C's map of rank 3 too, three maps before the scalars
    for store in (2, 1):
        encoded.clear()
        ts = TmaRunner(_at("nn", store=store, out=DType.F16), b"")
        run = ts.bind(g, m, n, k, 72, 264, 264, batch=batch, strides=(m * 72, 0, m * 264))
        run(0x10000, 0x20000, 0x30000, 1.0, 0.0, 0)
        a, b, c = encoded
        assert (a["tensorRank"], b["tensorRank"], c["tensorRank"]) == (3, 2, 3)
        assert c["globalDim"] == [n, m, batch] and c["globalStrides"] == [264 * 2, m * 264 * 2]
        assert packed[-1][:7] == [m, n, k, 1.0, 0.0, 0x30000, 264]
        assert packed[-1][-3:] == [batch, 0b101, m * 264]
    # one problem: rank 2 everywhere, whatever strides are passed
    encoded.clear()
    plain.bind(g, m, n, k, 72, 72, 270, batch=1, strides=(8, 8, 8))(0x10000, 0x20000, 0, 1.0,
                                                                    0.0, 0)
    assert [e["tensorRank"] for e in encoded] == [2, 2] and packed[-1][-3:] == [1, 0, 0]
    with pytest.raises(TmaUnsupported, match="sC=0: every problem of the batch needs a C"):
        plain.bind(g, m, n, k, 72, 72, 270, batch=batch, strides=(0, n * k, 0))
    with pytest.raises(TmaUnsupported, match="sA=7201 x 2 B = 14402 B"):
        plain.bind(g, m, n, k, 72, 72, 270, batch=batch, strides=(m * 72 + 1, n * k, m * 270))
    with pytest.raises(TmaUnsupported, match="sC=26402 x 2 B = 52804 B"):  # C's map: 16 B
        ts.bind(g, m, n, k, 72, 264, 264, batch=batch, strides=(0, 0, m * 264 + 2))
    plain.bind(g, m, n, k, 72, 72, 270, batch=batch, strides=(0, 0, m * 270 + 1))  # registers


def test_the_pre_pass_writes_each_problems_copies(monkeypatch):
    """tf32 pre-pass with a batch: one pre-pass launch per problem, at its A and B, into its
    own pair of copies; the GEMM's maps of rank 3 over them. Both shared: one pair, rank 2."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    g, encoded, prep_args = fake.g, fake.encoded, fake.prep_args
    cfg = PREP_TN_GOLDEN
    m, n, k, batch = 100, 130, 70, 3
    per = cfg.prep_floats(m, n, k)
    TmaRunner(cfg, b"").bind(g, m, n, k, 101, 131, 130, batch=batch,
                             strides=(101 * k, 0, m * 130))(0x10000, 0x20000, 0x30000, 1.0, 0.0, 7)
    prep = f"{cfg.name}_prep"
    assert fake.asked == [("tf32 pre-pass", batch * per * 4, 7)]
    assert [x[0] for x in fake.launched] == [prep, prep, prep, cfg.name]
    ldw, w = cfg.prep_ld(k), 0x4000000
    assert prep_args == [(0x10000 + i * 101 * k * 4, 101, 0x20000, 131, m, n, k,
                          w + i * per * 4, w + i * per * 4 + m * ldw * 4, ldw,
                          cfg.prep_grid(m, n, k)[1]) for i in range(batch)]
    a, b = encoded
    assert a["tensorRank"] == b["tensorRank"] == 3 and a["globalStrides"][1] == per * 4
    assert b["globalAddress"] == 0x4000000 + m * cfg.prep_ld(k) * 4
    fake.launched.clear(), fake.asked.clear(), encoded.clear()
    TmaRunner(cfg, b"").bind(g, m, n, k, 101, 131, 130, batch=batch,
                             strides=(0, 0, m * 130))(0x10000, 0x20000, 0x30000, 1.0, 0.0, 7)
    assert fake.asked == [("tf32 pre-pass", per * 4, 7)]
    assert [x[0] for x in fake.launched] == [prep, cfg.name]
    assert [e["tensorRank"] for e in encoded] == [2, 2]


def test_sass_loads_and_stores_rank_3_boxes_for_a_batch(compiled_variants, compile_cache):
    """Every kernel can run a batch: beside each 2-D TMA load (and store) the 3-D one of a
    batched operand's map, chosen per launch (maps3)."""
    for name in (EPI_TS_GOLDEN.name, "gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8_tt_obf16_biasf32"):
        c = WgmmaConfig.from_name(name)
        code = _sass(c, compile_cache)
        assert code.count("UTMALDG.3D") >= 2 and code.count("UTMALDG.2D") >= 2, name
        assert (code.count("UTMASTG.3D") == code.count("UTMASTG.2D") == TS_COPIES * c.bn // 32) \
            == bool(c.store), name
        assert "STL" not in code, name


# ---- 3xTF32 pre-split (prep=1 with terms=3): the pre-pass splits, the loop only multiplies ----
#: the pre-split kernel the GPU tests and the accuracy bench start from, and a TT one (the
#: pre-pass transposing A, copying B) with bf16 C through the TMA-store epilogue
PRESPLIT_GOLDEN = WgmmaConfig(bm=128, bn=128, bk=32, stages=3, consumers=2, cluster=1,
                              persistent=1, group=8, dtype=DType.F32, terms=3, prep=1)
PRESPLIT_TT_GOLDEN = dataclasses.replace(PRESPLIT_GOLDEN, layout=Layout.TT, out=DType.BF16,
                                         bias="f32", act="silu", store=1)


def _presplit_tiles(arch="sm_90"):
    """One searched pre-split config per (BM, BN, consumers, stages) check accepts."""
    from codegen.families.wgmma import valid_configs

    tiles = {}
    for c in valid_configs(arch, DType.F32):
        if c.prep:
            tiles.setdefault((c.bm, c.bn, c.consumers, c.stages), c)
    return list(tiles.values())


def test_presplit_name_round_trips_and_marks_both_switches():
    c = PRESPLIT_GOLDEN
    assert c.name == "gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3"
    assert PRESPLIT_TT_GOLDEN.name == "gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_ts_t3_tt_obf16_biasf32_silu"
    for x in (c, PRESPLIT_TT_GOLDEN):
        assert WgmmaConfig.from_name(x.name) == x and WgmmaConfig.from_dict(x.to_dict()) == x
        assert check_wgmma(x, "sm_90") == []
    assert c.presplit and c.to_dict()["prep"] == 1 and c.to_dict()["terms"] == 3
    # the other fp32-data kernels are not pre-split, and keep their names
    assert not T3_GOLDEN.presplit and not PREP_GOLDEN.presplit and not DEFAULT_WGMMA.presplit
    assert T3_GOLDEN.name.endswith("_g8_t3") and PREP_GOLDEN.name.endswith("_g8_pre")


def test_presplit_geometry_workspace_and_template_values():
    c = PRESPLIT_GOLDEN
    # a stage is four 16 KiB tiles as TMA writes them: A, Bt, As, Bts; nothing converted
    assert c.tx_bytes == c.stage_bytes == 4 * 128 * 32 * 4 == 65536 and c.conv_bytes == 0
    assert c.conv_offsets == (16384, 32768, 49152)
    assert c.smem_bytes == 1024 + 3 * 65536 + 1024 == 198656
    assert c.tma_boxes() == {"A": (128, 32), "B": (128, 32)}  # K-major boxes, two of each a stage
    assert c.acc_regs == 2 * 64 * 128 // 128  # the k-tile's partial sums and the totals
    assert c.prep_copies == 2 and PREP_GOLDEN.prep_copies == 1
    # [Abig; Asmall] then [Bbig; Bsmall], ldw = K rounded up to 4 floats
    assert c.prep_floats(100, 300, 1023) == 2 * 400 * 1024
    assert PREP_GOLDEN.prep_floats(100, 300, 1023) == 400 * 1024
    assert c.prep_grid(100, 300, 1023) == PREP_GOLDEN.prep_grid(100, 300, 1023)
    # DRAM bytes of the pre-pass: A and B read (4 B), their copies written (8 B pre-split)
    assert c.prep_bytes(4096, 4096, 4096) == 2 * 4096 * 4096 * (4 + 8)
    assert PREP_GOLDEN.prep_bytes(4096, 4096, 4096) == 2 * 4096 * 4096 * (4 + 4)
    assert T3_GOLDEN.prep_bytes(4096, 4096, 4096) == 0
    assert c.operand_bytes == 8 and T3_GOLDEN.operand_bytes == 4 and DEFAULT_WGMMA.operand_bytes == 2
    assert c.aligned_operands == (False, False, False)  # the pre-pass reads any A and B
    v = c.template_values()
    assert v["SPLIT"] and v["PREP"] == 1 and not v["TF32"] and v["TERMS"] == 3
    assert (v["BT_OFF"], v["AS_OFF"], v["BTS_OFF"]) == (16384, 32768, 49152)
    assert v["STAGE_BYTES"] == 65536 and v["K_STEPS"] == 4 and v["B_CHUNKS"] == 1
    assert not any(x.template_values()["SPLIT"] for x in (T3_GOLDEN, PREP_GOLDEN, DEFAULT_WGMMA))


@pytest.mark.parametrize("cfg,reason", [
    (dataclasses.replace(PRESPLIT_GOLDEN, stages=4),
     "shared memory 264192 B (4 stages of 65536 B: the big and small tiles of A and of B, "
     "2 x (128 + 128) x 128 B) exceeds the 232448 B per-block opt-in limit of sm_90"),
    (dataclasses.replace(PRESPLIT_GOLDEN, bm=256, bn=64),
     "shared memory 247808 B (3 stages of 81920 B: the big and small tiles of A and of B, "
     "2 x (256 + 64) x 128 B) exceeds"),
    (dataclasses.replace(PRESPLIT_GOLDEN, bn=256, stages=2),
     "the 64x256 consumer tile holds 256 accumulators per thread (partial sums and totals: "
     "3xTF32); with 72 more that is over the 232 registers a consumer thread gets"),
    (dataclasses.replace(PRESPLIT_GOLDEN, bm=64, bn=192, consumers=1),
     "the 64x192 consumer tile holds 192 accumulators per thread (partial sums and totals: "
     "3xTF32); with 72 more that is over the 256 registers a consumer thread gets"),
    (dataclasses.replace(PRESPLIT_GOLDEN, cluster=2, stages=2),
     "3xTF32 pre-split (prep=1, terms=3) loads its small parts apart: no cluster (it has "
     "cluster=2)"),
    (dataclasses.replace(PRESPLIT_GOLDEN, stages=1), "stages=1: fp32 data needs 2 or more"),
    # the pre-split's consumers take turns of their own: no ping-pong
    (dataclasses.replace(PRESPLIT_GOLDEN, pingpong=1),
     "pingpong=1 needs fp16 or bf16 data, or tf32 with nothing converted in the main loop "
     "(prep 1-3) (it has f32, prep=1)"),
], ids=["smem-128x128-s4", "smem-256x64", "registers-128x256", "registers-64x192", "cluster",
        "one-stage", "ping-pong"])
def test_presplit_rules_say_why_with_numbers(cfg, reason):
    assert any(w.startswith(reason) for w in check_wgmma(cfg, "sm_90")), check_wgmma(cfg, "sm_90")


def test_presplit_takes_every_layout_and_any_leading_dimension():
    from codegen.families import FAMILIES

    for layout in Layout:
        c = dataclasses.replace(PRESPLIT_GOLDEN, layout=layout)
        assert check(c, "sm_90") == [] and c.tma_boxes() == PRESPLIT_GOLDEN.tma_boxes()
        assert not c.a_mn_major and not c.b_mn_major  # the copies are K-major in any layout
        assert c.takes(4095, 4097, 1023, (4, 4, 4))  # operands of any alignment
    assert FAMILIES["wgmma"].layouts == frozenset(Layout)
    assert not [w for w in problem_reasons(PRESPLIT_GOLDEN, (4096, 4095, 4097)) if "TMA" in w]
    assert problem_reasons(T3_GOLDEN, (4096, 4095, 4097)) != []  # in-loop: TMA reads B as stored


def test_presplit_is_a_search_value_of_3xtf32_requests():
    """An f32x3 request searches the split mode (prep 0: in-loop, 1: pre-split) beside the
    tiles; the trial parameters round-trip; the valid pre-split tiles are the ones whose
    four tiles a stage and doubled accumulators fit."""
    import optuna

    from codegen.arch import parse_arch
    from codegen.families.wgmma import params_of, suggest, valid_configs

    arch = parse_arch("sm_90")
    grid = list(valid_configs(arch, DType.F32, (4096, 4096, 4096)))
    assert {c.prep for c in grid} == {0, 1} and all(c.terms == 3 for c in grid)
    assert PRESPLIT_GOLDEN in grid
    assert {(c.bm, c.bn, c.consumers) for c in grid if c.prep} == {
        (64, 64, 1), (64, 128, 1), (128, 64, 1), (128, 64, 2), (128, 128, 2)}
    assert max(c.stages for c in grid if c.prep and (c.bm, c.bn) == (128, 128)) == 3
    p = params_of(PRESPLIT_GOLDEN, (4096, 4096, 4096), arch)
    assert p["wgmma_prep"] == 1
    assert suggest(optuna.trial.FixedTrial(p), DType.F32) == PRESPLIT_GOLDEN
    # an odd shape TMA cannot read as stored: only the pre-split kernels are left
    odd = list(valid_configs(arch, DType.F32, (4096, 4095, 4097)))
    assert odd and all(c.prep for c in odd)


def _split(x: float) -> tuple[float, float]:
    """The pre-pass's split of x (split_put in the template), mirrored in Python."""
    def rna(v):
        if not math.isfinite(v):
            return v
        bits = int(np.array(v, np.float32).view(np.uint32))
        return float(np.array((bits + 0x1000) & 0xFFFFE000, np.uint32).view(np.float32))

    if math.isnan(x):
        return rna(x), 0.0
    if math.isinf(x):
        return math.copysign(1.0, x), x
    big = rna(x)
    if math.isinf(big):
        big = float(np.array(int(np.array(x, np.float32).view(np.uint32)) & 0xFFFFE000,
                             np.uint32).view(np.float32))
    return big, rna(float(np.float32(x) - np.float32(big)))


def _kind(v: float) -> str:
    return "nan" if math.isnan(v) else "+inf" if v == math.inf else "-inf" if v == -math.inf \
        else "finite"


def test_presplit_encoding_gives_sgemms_nan_and_inf_for_every_pair():
    """The three products the kernel forms of one a and one b (Abig*Bsmall + Asmall*Bbig +
    Abig*Bbig) are NaN, +Inf, -Inf or finite exactly where SGEMM's a*b is, for every pair of
    specials and ordinary values (the pre-pass writes +-Inf as big +-1, small +-Inf); a
    finite x splits into big + small within 2^-21 of x, a big past FLT_MAX truncated."""
    values = [math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -2.5, 1.2e-30, 1.0000001,
              -7.0e5, 0.3]
    for x in values + [3.4028234663852886e38, -3.3e38]:
        big, small = _split(x)
        if math.isfinite(x):
            assert math.isfinite(big) and math.isfinite(small), x
            assert abs(x - (big + small)) <= 2.0 ** -21 * abs(x), x
    for a in values:
        ab, as_ = _split(a)
        for b in values:
            bb, bs = _split(b)
            with np.errstate(all="ignore"):
                terms = np.float64(ab) * bs + np.float64(as_) * bb + np.float64(ab) * bb
                want = np.float32(a) * np.float32(b)
            assert _kind(float(terms)) == _kind(float(want)), (a, b, terms, want)


@pytest.mark.parametrize("cfg", [PRESPLIT_GOLDEN, PRESPLIT_TT_GOLDEN], ids=lambda c: c.name)
def test_presplit_golden_source(cfg):
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(cfg)


def test_presplit_source_says_what_it_does():
    src = render(PRESPLIT_GOLDEN)
    main, prep = src.split("\nconstexpr float FLT_MAX_")  # the pre-pass's code follows the GEMM's
    # the main loop: four TMA tiles a stage, the small products first, no conversion
    assert "tma_load(a_dst + AS_OFF, &tmA, bar, kt * BK, M + m0, bt, a3);" in main
    assert "tma_load(a_dst + BTS_OFF, &tmB, bar, kt * BK, N + n0, bt, b3);" in main
    assert "mbar_arrive_expect_tx(bar, STAGE_BYTES);" in main
    body = main[main.index("void mma_split("):]
    first, second, big = (body.index(s) for s in (
        "wgmma_m64k8(part[i], smem_desc(a + i * 64 * 128 + kk * 32, 16, 1024), dbs, 1);",
        "wgmma_m64k8(part[i], smem_desc(as + i * 64 * 128 + kk * 32, 16, 1024), db, 1);",
        "wgmma_m64k8(part[i], smem_desc(a + i * 64 * 128 + kk * 32, 16, 1024), db, 1);"))
    assert first < second < big  # Abig*Bsmall, Asmall*Bbig, then Abig*Bbig, all onto part
    assert "wgmma_wait<0>();\n                release(stage);" in main
    # acc += part compensated: its rounding error starts the next k-tile's part, with no test
    # in the loop; part cleared for each tile, the last error added before the epilogue, and
    # an element whose total is not finite summed again as SGEMM does, from the copies
    loop = main[main.index("mma_split(part,"):]
    update = ("const float t = acc[i][j] + part[i][j];",
              "part[i][j] = (acc[i][j] - t) + part[i][j];", "acc[i][j] = t;",
              "acc[i][j] += part[i][j];  // the last k-tile's error",
              "nonfinite |= !(fabsf(acc[i][j]) < __int_as_float(0x7f800000));",
              "if (nonfinite) {", "acc[i][j] = split_dot(Wa + static_cast<size_t>(row) * ldw,")
    at = [loop.index(x) for x in update]
    assert at == sorted(at)
    assert loop[:at[3]].count("0x7f800000") == 0  # the k-loop itself tests nothing
    assert main.index("part[i][j] = 0.0f;  // no error carried") < main.index("mma_split(part,")
    dot = main[main.index("float split_dot("):]
    assert "s = fmaf(a[k], bs[k], s);\n        s = fmaf(as[k], b[k], s);\n        s = fmaf(a[k], b[k], s);" in dot
    assert "long long sC,\n    const float* __restrict__ W, int ldw, long long sW)" in main
    assert "const float* __restrict__ W" not in render(T3_GOLDEN)  # the in-loop split has none
    # two consumers issue their k-tiles' wgmmas in turn (named barriers 4 and 5), the last
    # turn of the last tile handed to no one; one consumer has no turns
    turns = loop[:loop.index("wgmma_wait<0>();")]
    assert main.index("turn_wait(consumer, issued);") < main.index("mma_split(part,") < \
        main.index("turn_pass(consumer, t + clusters < num_tiles || kt + 1 < k_tiles);")
    assert "turn_pass(" in turns
    for x in ('asm volatile("bar.sync 4, 256;\\n"', 'asm volatile("bar.arrive 4, 256;\\n"',
              'asm volatile("bar.sync 5, 256;\\n"', 'asm volatile("bar.arrive 5, 256;\\n"'):
        assert x in main, x
    one = render(dataclasses.replace(PRESPLIT_GOLDEN, bm=64, consumers=1))
    assert "turn_wait" not in one and "bar.sync 4" not in one
    for absent in ("convert_stage", "split_tf32", "bar.red", "clear_nonfinite_big", "lds128"):
        assert absent not in src, absent
    assert main.count("tf32_rna(") == 1  # its definition: the main loop rounds nothing
    # the pre-pass: big and small parts, the small ones M (N) rows of ldw after the big ones
    assert "prep_copy(A, lda, M, K, bid, At, ldw, static_cast<size_t>(M) * ldw);" in prep
    assert "prep_transpose(B, ldb, K, N, bid - a_blocks, Bt, ldw, static_cast<size_t>(N) * ldw, tile);" in prep
    assert "big = copysignf(1.0f, x);" in src and "dst[i + small] = lo;" in src
    tt = render(PRESPLIT_TT_GOLDEN)
    assert "prep_transpose(A, lda, K, M, bid, At, ldw, static_cast<size_t>(M) * ldw, tile);" in tt
    assert "prep_copy(B, ldb, N, K, bid - a_blocks, Bt, ldw, static_cast<size_t>(N) * ldw);" in tt


def test_the_runner_of_a_presplit_kernel_maps_four_copies(monkeypatch):
    """The runner launches <name>_prep into a "3xTF32 pre-split" workspace of 2 (M + N) x ldw
    floats, then the GEMM, whose maps span both halves: A over [Abig; Asmall] (2M rows), B
    over [Bbig; Bsmall] (2N rows) after it; with a batch, one set per problem (rank 3)."""
    import types

    from tuner.runtime import driver, tma
    from tuner.runtime.runners import TmaRunner

    launched, encoded, prep_args, main_args = [], [], [], []

    class Image(_Image):
        def params(self, signature):
            self.blk = super().params(signature)
            return self.blk

        def launch(self, f, grid, block, stream, address):
            launched.append((self.name, grid))
            if self.name.endswith("_prep"):
                prep_args.append(self.blk.fmt.unpack_from(self.blk.buf))
            else:  # the scalars after the two maps, as the kernel reads them
                sig = TmaRunner.SPLIT_SIGNATURE
                ptrs = (ctypes.c_void_p * (2 + len(sig))).from_address(address)
                kinds = {"i": ctypes.c_int32, "f": ctypes.c_float, "P": ctypes.c_uint64,
                         "L": ctypes.c_int64}
                main_args.append(tuple(kinds[x].from_address(p).value
                                       for x, p in zip(sig, ptrs[2:])))

    class Map:
        def getPtr(self):
            return 0

    class Scratch:
        def get(self, g, stream, purpose, nbytes, zero=False, allocate_captured=None):
            launched.append((purpose, nbytes))
            return 0x4000000

    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", Image)
    monkeypatch.setattr(driver, "scratch", lambda: Scratch())
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map())
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
    cfg = PRESPLIT_GOLDEN
    m, n, k = 100, 130, 70
    ldw, w, per = cfg.prep_ld(k), 0x4000000, cfg.prep_floats(m, n, k)
    assert per == 2 * (m + n) * ldw
    TmaRunner(cfg, b"").bind(g, m, n, k, 71, 131, 130)(0x10004, 0x20004, 0x30000, 1.0, 0.0, 7)
    blocks, a_blocks = cfg.prep_grid(m, n, k)
    assert launched == [("3xTF32 pre-split", per * 4), (f"{cfg.name}_prep", (blocks, 1, 1)),
                        (cfg.name, cfg.grid(m, n, 132))]
    assert prep_args == [(0x10004, 71, 0x20004, 131, m, n, k, w, w + 2 * m * ldw * 4, ldw,
                          a_blocks)]
    # the GEMM's scalars end with the copies' address, ldw and a problem's stride (0: one set)
    assert TmaRunner.SPLIT_SIGNATURE == TmaRunner.SIGNATURE + "PiL"
    assert main_args[-1][-3:] == (w, ldw, 0) and main_args[-1][:3] == (m, n, k)
    assert [(e["globalAddress"], e["globalDim"], e["globalStrides"], e["boxDim"])
            for e in encoded] == [(w, [k, 2 * m], [ldw * 4], [32, 128]),
                                  (w + 2 * m * ldw * 4, [k, 2 * n], [ldw * 4], [32, 128])]
    launched.clear()
    encoded.clear()
    prep_args.clear()
    batch = 3
    TmaRunner(cfg, b"").bind(g, m, n, k, 71, 131, 130, batch=batch,
                             strides=(m * 71, 0, m * 130))(0x10000, 0x20000, 0x30000, 1.0, 0.0, 7)
    assert launched[0] == ("3xTF32 pre-split", batch * per * 4)
    assert [a[7] for a in prep_args] == [w + i * per * 4 for i in range(batch)]
    assert main_args[-1][-3:] == (w, ldw, per)  # a set of copies per problem, per floats apart
    assert [a[8] - a[7] for a in prep_args] == [2 * m * ldw * 4] * batch
    assert [(e["tensorRank"], e["globalDim"]) for e in encoded] == [
        (3, [k, 2 * m, batch]), (3, [k, 2 * n, batch])]


def test_the_model_counts_the_presplit_pre_pass_and_its_wider_operands():
    from codegen.arch import parse_arch
    from codegen.occupancy import occupancy
    from codegen.families.wgmma import CONVERT_EFFICIENCY
    from tuner.model import DRAM_GBS, LAUNCH_S, bound_tflops, predict, tile_traffic

    arch = parse_arch("sm_90")
    shape = (4096, 4096, 4096)
    occ = occupancy(PRESPLIT_GOLDEN.threads, 168, PRESPLIT_GOLDEN.smem_bytes, arch)
    inloop = dataclasses.replace(PRESPLIT_GOLDEN, prep=0, stages=2)
    pre, loop = (predict(c, shape, arch, occ) for c in (PRESPLIT_GOLDEN, inloop))
    prep_s = PRESPLIT_GOLDEN.prep_bytes(*shape) / (DRAM_GBS[90] * 1e9)
    assert pre.terms["fixed"] == pytest.approx(2 * LAUNCH_S + prep_s)
    assert loop.terms["fixed"] == pytest.approx(LAUNCH_S)
    # the main loop loads a big and a small tile of each operand: twice in-loop's bytes
    assert tile_traffic(PRESPLIT_GOLDEN, shape)["a_bytes"] == 128 * 4096 * 8
    assert pre.traffic["l2_bytes"] == 2 * loop.traffic["l2_bytes"] - 32 * 32 * 128 * 128 * 4
    # three tf32 products a multiply, either way: a third of the tf32 peak; in-loop keeps
    # the share of it its conversion leaves (measured: CONVERT_EFFICIENCY)
    b_pre, f_pre = bound_tflops(PRESPLIT_GOLDEN, shape, arch)
    assert f_pre["issue_eff"] == 0.3333
    assert b_pre * CONVERT_EFFICIENCY[3] == pytest.approx(bound_tflops(inloop, shape, arch)[0])
    # a batch: one pre-pass per problem
    pre3 = predict(PRESPLIT_GOLDEN, shape, arch, occ, batch=3)
    assert pre3.terms["fixed"] == pytest.approx(4 * LAUNCH_S + 3 * prep_s)
    # tf32 rounded by TMA (prep=2): the pre-pass's main loop, its launch and traffic gone,
    # and all of the tf32 peak (no conversion)
    tma, prep1 = (predict(c, shape, arch, occ) for c in (PRET_GOLDEN, PREP_GOLDEN))
    assert tma.terms["fixed"] == pytest.approx(LAUNCH_S)
    assert prep1.terms["fixed"] == pytest.approx(
        2 * LAUNCH_S + PREP_GOLDEN.prep_bytes(*shape) / (DRAM_GBS[90] * 1e9))
    assert bound_tflops(PRET_GOLDEN, shape, arch)[1]["issue_eff"] == 1.0
    assert tma.seconds < prep1.seconds


def _presplit_set() -> list[WgmmaConfig]:
    """Every pre-split tile the search can ask for, and the golden in each layout with each
    epilogue (both C paths, each C type, a bias of each kind)."""
    cfgs = _presplit_tiles() + [PRESPLIT_TT_GOLDEN] + [
        dataclasses.replace(PRESPLIT_GOLDEN, layout=layout, out=out, bias=bias, act=act,
                            store=store)
        for layout, out, bias, act, store in (
            (Layout.NT, DType.F16, "f32", "gelu", 0), (Layout.TN, DType.F32, "out", "relu", 1),
            (Layout.TT, DType.F32, "none", "none", 0), (Layout.NN, DType.BF16, "out", "gelu_tanh", 1))]
    return list(dict.fromkeys(cfgs))


@pytest.fixture(scope="module")
def compiled_presplit(compile_cache):
    return _compiled(_presplit_set(), compile_cache, whole=False)


def test_the_presplit_set_holds_every_searched_tile():
    assert len(_presplit_set()) == 16


@pytest.mark.gpu
def test_every_presplit_config_compiles_without_spills_or_serialisation(compile_cache):
    _presplit_compile_checks(_compiled(_presplit_set(), compile_cache, whole=True))


def test_presplit_configs_compile_without_spills_or_serialisation(compiled_presplit):
    _presplit_compile_checks(compiled_presplit)


def _presplit_compile_checks(compiled_presplit) -> None:
    failed = {c.name: r.error for c, r in compiled_presplit.items() if not r.ok}
    assert not failed, failed
    for c, r in compiled_presplit.items():
        assert r.arch == "sm_90a"
        assert "C7508" not in r.log and "C7520" not in r.log, (c.name, r.log)
        assert "warning" not in r.log.lower(), (c.name, r.log)
        res = r.resources
        assert res.spill_bytes == 0 and res.stack_frame == 0, (c.name, res)
        assert res.registers == c.launch_regs, (c.name, res.registers)
        assert res.smem_dynamic == c.smem_bytes and res.smem_static == 0, (c.name, res)
        assert f"Function properties for {c.name}_prep\n    0 bytes stack frame, 0 bytes spill" \
            in r.log, c.name


def _function_sass(sass: str, name: str) -> str:
    """The SASS of one kernel of a cubin's dump."""
    parts = re.split(r"\n\s*Function : ", sass)
    return next(p for p in parts if p.split()[0] == name)


def test_presplit_sass_multiplies_tma_tiles_without_converting(compiled_presplit, compile_cache):
    """The main kernel: 3 x M_WGMMAS x 4 tf32 HGMMAs a k-tile (no transpose), every one
    adding to part (none with scale-d 0: part starts at the error carried from the last
    k-tile), four TMA loads a stage (2-D, and 3-D for a batch), and no shared-memory load,
    nor a store outside the TMA-store epilogue (nothing is converted in the loop); the split
    is in <name>_prep."""
    for c in (PRESPLIT_GOLDEN, PRESPLIT_TT_GOLDEN,
              next(x for x in _presplit_tiles() if x.consumers == 1 and x.bm == 128)):
        sass = _sass(c, compile_cache)
        main, prep = _function_sass(sass, c.name), _function_sass(sass, f"{c.name}_prep")
        hgmma = [l for l in main.splitlines() if "HGMMA.64x" in l]
        assert len(hgmma) == 3 * (c.wm // 64) * (c.bk // 8), (c.name, len(hgmma))
        assert all(f"HGMMA.64x{c.bn}x8.F32.TF32" in l and "tnsp" not in l for l in hgmma)
        assert not [l for l in hgmma if "!UPT" in l or ", RZ" in l], c.name
        assert main.count("UTMALDG.2D") == 4 and main.count("UTMALDG.3D") == 4, c.name
        # (the TMA-store epilogue stages C through shared memory: its STS only)
        for op in ("LDS", "STL", "LDL", "BAR.RED") + (() if c.store else ("STS",)):
            assert not re.search(rf"\b{op}\b", main), (c.name, op)
        assert "HGMMA" not in prep and "STG" in prep, c.name


# ---- split-K (split > 1): slices of a tile's k-tiles, summed by the last --------------------
SPLIT_GOLDEN = WgmmaConfig.from_name("gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l_nt_of16")


def test_split_k_name_geometry_and_reasons():
    """A split config names its slices (``_k<split>l``), launches a block per slice (or the
    SMs' worth, persistent), and asks a workspace of split x M x N floats and a counter per
    tile of each problem; it needs fp16 / bf16, the register epilogue, no cluster and no
    ping-pong, and the search rejects splits a shape does not need or cannot fill."""
    from codegen.arch import parse_arch
    from codegen.families._common import shape_reasons

    c = SPLIT_GOLDEN
    assert (c.split, c.last, c.has_workspace, c.reduce_pass) == (4, True, True, False)
    assert WgmmaConfig.from_name(c.name) == c and DEFAULT_WGMMA.split == 1
    assert "_k" not in DEFAULT_WGMMA.name and not DEFAULT_WGMMA.has_workspace
    assert c.tiles(16, 4096) == 32 and c.grid(16, 4096, 132) == (128, 1, 1)
    assert c.grid(16, 8192, 132) == (132, 1, 1)  # persistent: at most the SMs
    assert dataclasses.replace(c, persistent=0).grid(16, 8192, 132) == (256, 1, 1)
    assert c.workspace_floats(16, 4096, batch=3) == 3 * 4 * 16 * 4096
    assert c.ticket_count(16, 4096, batch=3) == 3 * 32
    assert (DEFAULT_WGMMA.workspace_floats(16, 4096), DEFAULT_WGMMA.ticket_count(16, 4096)) == (0, 0)
    assert check_wgmma(dataclasses.replace(c, split=3), "sm_90") == [
        "split-K 3 is not one of 1, 2, 4, 8, 16"]
    why = check_wgmma(WgmmaConfig(split=2, store=1, cluster=2), "sm_90")
    assert why == ["split-K 2 needs the register epilogue (it has store=1), no cluster "
                   "(it has cluster=2)"], why
    assert check_wgmma(WgmmaConfig(bm=128, bn=128, split=2, pingpong=1), "sm_90") == [
        "split-K 2 needs no ping-pong (it has pingpong=1)"]
    tf32 = WgmmaConfig(dtype=DType.TF32, bk=32, bm=128, bn=128, stages=3, split=2, prep=1)
    assert check_wgmma(tf32, "sm_90") == ["split-K 2 needs fp16 or bf16 data (it has tf32)"]
    a = parse_arch("sm_90")
    assert shape_reasons(c, (4096, 4096, 4096), a) == [
        "split-K 4 is not needed: 2048 tiles already cover the 132 SMs"]
    assert shape_reasons(c, (16, 4096, 192), a) == ["split-K 4 exceeds the 3 K tiles"]


def test_split_k_is_searched_only_where_tiles_leave_sms_idle(monkeypatch):
    """With splits to search, the trial asks ``wgmma_split`` only where the point's tiles of
    C are fewer than the SMs (fp16 / bf16); params_of gives back what suggest made; the grid
    has split variants at a decode shape and none at 4096^3. With SEARCH_SPLITS = (1,),
    nothing asks it."""
    import optuna

    from codegen.arch import parse_arch
    from codegen.families import wgmma
    from codegen.families.wgmma import SPLITS, params_of, suggest, valid_configs

    a = parse_arch("sm_90")
    assert wgmma.SEARCH_SPLITS == SPLITS  # searched: split-K has passed on the GPU
    monkeypatch.setattr(wgmma, "SEARCH_SPLITS", (1,))
    assert all(c.split == 1 for c in valid_configs(a, DType.F16, (16, 4096, 4096)))
    assert "wgmma_split" not in params_of(SPLIT_GOLDEN, (16, 4096, 4096), a)
    monkeypatch.setattr(wgmma, "SEARCH_SPLITS", SPLITS)

    fixed = {f"wgmma_{k}": v for k, v in dict(bm=64, bn=128, stages_deep=6, consumers=1,
                                               cluster=1, persistent=1, group=1, store=0,
                                               pingpong=0).items()}
    for shape, asked in (((16, 4096, 4096), True), ((4096, 4096, 4096), False)):
        trial = optuna.trial.FixedTrial({**fixed, "wgmma_split": 4})
        c = suggest(trial, DType.F16, shape, a)
        assert c.split == (4 if asked else 1), shape
        assert ("wgmma_split" in params_of(c, shape, a)) is asked
        assert suggest(optuna.trial.FixedTrial(params_of(c, shape, a)), DType.F16, shape, a) == c
    decode = {c.split for c in valid_configs(a, DType.F16, (16, 4096, 4096))}
    assert decode == {1, 2, 4, 8, 16}
    assert all(c.split == 1 for c in valid_configs(a, DType.TF32, (16, 4096, 4096)))


def test_small_two_byte_tiles_ask_rings_of_up_to_eight_stages():
    """Tiles of up to 24 KB a stage (64x64, 128x64, 64x128) ask their ring under a parameter
    of its own, 3-8 stages; every other tile and fp32 data ask 3-6 under "wgmma_stages";
    the grid holds both, and a deep ring never where check would refuse it."""
    import optuna

    from codegen.arch import parse_arch
    from codegen.families.wgmma import DEEP_STAGES, SEARCH_SPACE, params_of, suggest, valid_configs

    a = parse_arch("sm_90")
    shape = (128, 4096, 4096)
    grid = list(valid_configs(a, DType.BF16, shape))
    rings = {}
    for c in grid:
        rings.setdefault((c.bm, c.bn), set()).add(c.stages)
    assert rings[(128, 64)] == rings[(64, 128)] == rings[(64, 64)] == set(DEEP_STAGES)
    assert all(max(r) <= SEARCH_SPACE["stages"][-1] for t, r in rings.items() if sum(t) > 192)
    for c in grid:
        p = params_of(c, shape, a)
        deep = c.bm + c.bn <= 192
        assert ("wgmma_stages_deep" in p) is deep and ("wgmma_stages" in p) is not deep, c.name
        assert suggest(optuna.trial.FixedTrial(p), DType.BF16, shape, a) == c
    f32 = list(valid_configs(a, DType.F32, (4096, 4096, 4096)))
    assert f32 and all(c.stages <= 6 and "wgmma_stages" in params_of(c, (4096,) * 3, a)
                       for c in f32)



def test_split_k_golden_source():
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(SPLIT_GOLDEN)


def test_split_k_sass_loads_a_row_of_partial_sums_before_adding_them(compile_cache):
    """The last slice's sum reads the other slices' partial tiles from L2: a row's BN/8
    float2 loads must all be in flight before the first add that uses one. With the column
    tests between them (before 56926bf), ptxas issued each load after the add before it,
    one L2 round trip a float2 (a 128x64 tile's sum of two slices took some 13 us on the
    H200). Counted in the SASS: the longest run of 64-bit L2 loads with no FADD between."""
    for c in (SPLIT_GOLDEN, WgmmaConfig.from_name("gemm_wgmma_bf16_128x64x64_c1_s8_x1_p1_g1_k2l_nt_obf16")):
        main = _function_sass(_sass(c, compile_cache), c.name)
        run = longest = 0
        for line in main.splitlines():
            if re.search(r"\bLDG\.E\.64\.STRONG\.GPU\b", line):
                run += 1
                longest = max(longest, run)
            elif re.search(r"\bFADD\b", line):
                run = 0
        assert longest >= c.bn // 8, (c.name, longest)


def _ran_with_a_workspace(monkeypatch, cfg, sms: int, m: int, n: int, k: int):
    """cfg's TmaRunner bound on a GPU of `sms` SMs and run once (maps and launches
    recorded): (the runner, the scratch it asked for (purpose, bytes, zeroed), the scalars
    it packed at each launch)."""
    import types

    from tuner.runtime import driver, runners, tma
    from tuner.runtime.runners import TmaRunner

    asked, packed = [], []

    class _Scratch:
        def get(self, g, stream, purpose, nbytes, zero=False, allocate_captured=None):
            asked.append((purpose, nbytes, zero))
            return 0x100000 * len(asked)

    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    monkeypatch.setattr(driver, "KernelImage", _Image)
    monkeypatch.setattr(driver, "scratch", lambda: _Scratch())
    monkeypatch.setattr(tma, "encode", lambda args: object())
    r = TmaRunner(cfg, b"")
    g = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=sms))
    run = r.bind(g, m, n, k, m if cfg.a_col else k, k if cfg.b_col else n, n)
    monkeypatch.setattr(runners._MapParams, "pack",
                        lambda self, maps, *scalars: packed.append(scalars) or 0)
    run(0x1000, 0x2000, 0x3000, 1.0, 0.0, 7)
    return r, asked, packed


def test_split_k_source_and_runner_arguments(monkeypatch):
    """The kernel takes the workspace and the tickets after the scalars; the runner passes a
    per-stream workspace of split x M x N floats and zeroed tickets, a counter per tile."""
    from tuner.runtime.runners import TmaRunner

    src = render(SPLIT_GOLDEN)
    assert ("int batch, int maps3, long long sC,\n    float* __restrict__ Wk, unsigned* "
            "__restrict__ tickets)") in src
    assert "constexpr int KSPLIT = 4;" in src and "atomicAdd(&tickets[tile], 1u)" in src
    assert "KSPLIT" not in render(DEFAULT_WGMMA) and "Wk" not in render(DEFAULT_WGMMA)
    r, asked, packed = _ran_with_a_workspace(monkeypatch, SPLIT_GOLDEN, 132, 16, 4096, 4096)
    assert r.signature == TmaRunner.SIGNATURE + "PP"
    assert asked == [("split-K workspace", 4 * 16 * 4096 * 4, False),
                     ("split-K tickets", 32 * 4, True)]
    assert packed[-1][-2:] == (0x100000, 0x200000)
    assert r.main.launches == [("gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l_nt_of16",
                                (128, 1, 1), (256, 1, 1))]


# ---- stream-K (streamk=1): the last waves' k-tiles shared out evenly -------------------------
SK_GOLDEN = WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_ts_sk_nt_of16")


def test_stream_k_name_geometry_workspace_and_reasons():
    """A stream-K config names it (``_sk``), launches the persistent grid, and asks a
    workspace of two BM x BN partial tiles per block of that grid (the SMs it launches on)
    and a counter per tile; it needs fp16 / bf16, no cluster, no ping-pong, no split-K and
    persistent blocks; it measured slower than the same tile without it, so the search
    leaves it out."""
    from codegen.families.wgmma import unproven_reasons

    c = SK_GOLDEN
    assert (c.streamk, c.split, c.has_workspace, c.last) == (1, 1, True, False)
    assert WgmmaConfig.from_name(c.name) == c and "_sk" not in DEFAULT_WGMMA.name
    assert c.grid(4096, 4096, 132) == (132, 1, 1) and c.grid(200, 300, 3) == (3, 1, 1)
    assert c.workspace_floats(4096, 4096) == 132 * 2 * 128 * 128
    assert c.workspace_floats(4096, 4096, sms=7) == 7 * 2 * 128 * 128
    assert c.workspace_floats(100, 100, batch=2, sms=132) == 2 * 2 * 128 * 128  # 2 tiles
    assert c.ticket_count(4096, 4096, batch=2) == 2 * 32 * 32
    assert check_wgmma(c, "sm_90") == []
    assert check_wgmma(dataclasses.replace(c, streamk=2), "sm_90") == ["streamk=2 is not 0 or 1"]
    why = check_wgmma(dataclasses.replace(c, cluster=2, pingpong=1, persistent=0), "sm_90")
    assert why[-1] == ("streamk=1 needs no cluster (it has cluster=2), no ping-pong (it has "
                       "pingpong=1), persistent=1: each block walks a range of k-tiles (it "
                       "has persistent=0)"), why
    assert check_wgmma(dataclasses.replace(c, split=2, store=0), "sm_90") == [
        "streamk=1 needs no split-K (it has split=2)"]
    tf32 = WgmmaConfig(dtype=DType.TF32, bk=32, bm=128, bn=128, stages=3, prep=1, streamk=1)
    assert check_wgmma(tf32, "sm_90") == ["streamk=1 needs fp16 or bf16 data (it has tf32)"]
    assert unproven_reasons(c) == [
        "stream-K is not searched: it measured 10-28% behind the same tile without it"]


def test_stream_k_golden_source():
    """Regenerate with GEMM_TUNE_UPDATE_GOLDEN=1 after a deliberate change."""
    rendered_as_golden(SK_GOLDEN)


def test_stream_k_source_and_runner_arguments(monkeypatch):
    """The kernel takes C's map, then the workspace and the tickets after the scalars; the
    runner passes a per-stream workspace of two partial tiles per block of its grid on the
    GPU's SMs and zeroed tickets, a counter per tile."""
    from tuner.runtime.runners import TmaRunner

    src = render(SK_GOLDEN)
    assert ("int batch, int maps3, long long sC,\n    float* __restrict__ Wk, unsigned* "
            "__restrict__ tickets)") in src and "const __grid_constant__ CUtensorMap tmC" in src
    assert "const int sk_tiles = " in src and "atomicAdd(&tickets[ts], 1u) == parts - 1" in src
    assert "sk_tiles" not in render(SPLIT_GOLDEN) and "sk_tiles" not in render(DEFAULT_WGMMA)
    for sms, blocks in ((132, 132), (7, 7)):
        r, asked, packed = _ran_with_a_workspace(monkeypatch, SK_GOLDEN, sms, 4096, 4096, 4096)
        assert r.signature == TmaRunner.SIGNATURE + "PP"
        assert asked == [("split-K workspace", blocks * 2 * 128 * 128 * 4, False),
                         ("split-K tickets", 32 * 32 * 4, True)]
        assert packed[-1][-2:] == (0x100000, 0x200000)
        assert r.main.launches == [(SK_GOLDEN.name, (blocks, 1, 1), (384, 1, 1))]


def test_the_model_evens_out_stream_k_and_charges_its_cut_tiles():
    """Where the tiles leave a partial wave, stream-K's busiest SM does blocks x k-tiles /
    SMs k-tiles over as many units as it has tiles (whole or cut), its wave efficiency is
    1, and the cut tiles' partial sums cost it their L2 traffic; at whole waves, or with
    fewer tiles than SMs, nothing changes."""
    from codegen.arch import parse_arch
    from tuner.model import bound_tflops, predict_before_compile, streamk_cut

    a = parse_arch("sm_90")
    sk, plain = SK_GOLDEN, dataclasses.replace(SK_GOLDEN, streamk=0)
    assert streamk_cut(sk, 1024, 64, 132) == (-(-1024 * 64 // 132) / 8, [(1, 8)])
    assert streamk_cut(plain, 1024, 64, 132) is None
    assert streamk_cut(sk, 1056, 64, 132) is None and streamk_cut(sk, 100, 64, 132) is None
    assert bound_tflops(sk, (4096, 4096, 4096), a)[1]["wave_eff"] == 1.0
    assert bound_tflops(plain, (4096, 4096, 4096), a)[1]["wave_eff"] == round(1024 / 1056, 4)
    shape = (4096, 4096, 4096)
    p_sk, p_plain = (predict_before_compile(c, shape, a) for c in (sk, plain))
    assert p_sk.terms["fixed"] > p_plain.terms["fixed"]
    whole = (128 * 132, 128, 4096)  # 132 tiles: one whole wave
    assert predict_before_compile(sk, whole, a).seconds == predict_before_compile(plain, whole, a).seconds


def test_a_cluster_wider_than_the_m_tiles_is_not_searched():
    """A cluster of 2 along M multicasts B to blocks of two M tiles; a problem of one M tile
    leaves one block of every cluster idle (128x4096x4096 bf16 on the H200, B from DRAM:
    30.0 us against 17.1 without the cluster, bench/results/decode-roof-m128-wgmma-*): the
    search rejects it with the reason; with two M tiles or more, no such reason."""
    from codegen.families.wgmma import problem_reasons, valid_configs

    x2 = WgmmaConfig(bm=128, bn=64, consumers=1, cluster=2, stages=8, dtype=DType.BF16)
    assert problem_reasons(x2, (128, 4096, 4096)) == [
        "a cluster of 2 blocks along M (B multicast) needs as many M tiles; M=128 makes 1 of "
        "128 rows, so 1 of each cluster's blocks would compute nothing"]
    assert problem_reasons(x2, (129, 4096, 4096)) == []
    assert problem_reasons(dataclasses.replace(x2, bm=64), (128, 4096, 4096)) == []
    small = list(valid_configs("sm_90", DType.F16, (64, 4096, 4096)))
    assert small and all(c.cluster <= -(-64 // c.bm) for c in small)
    assert any(c.cluster == 2 for c in valid_configs("sm_90", DType.F16, (256, 4096, 4096)))


# ---- clusters along N (A multicast), ping-pong consumers in a cluster -----------------------
def test_a_cluster_along_n_splits_a_and_walks_pairs_of_tile_columns():
    """cluster_n=1: the two blocks of a cluster take neighbouring N tiles of one M tile, each
    loads half of A's rows (K-major: BM/2 rows; M-major: BK/2 rows of each 64-row box) and
    multicasts them, and all of its own B; tiles count pairs of columns."""
    c = WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1, cluster=2, cluster_n=1)
    assert c.cluster_shape == (1, 2) and (c.a_multicast, c.b_multicast) == (2, 1)
    assert dataclasses.replace(c, cluster_n=0).cluster_shape == (2, 1)
    assert c.tma_boxes() == {"A": (64, 64), "B": (64, 64)}
    assert _at("tn", cluster=2, cluster_n=1).tma_boxes() == {"A": (32, 64), "B": (64, 64)}
    assert _at("nt", cluster=2, cluster_n=1).tma_boxes()["B"] == (256, 64)  # all of BN
    # 4095 x 4097: 32 M tiles x 33 N tiles -> 32 x 17 clusters; along M, 16 x 33
    assert c.tiles(4095, 4097) == 32 * 17
    assert dataclasses.replace(c, cluster_n=0).tiles(4095, 4097) == 16 * 33
    assert c.grid(4095, 4097, 132) == (132, 1, 1) and c.cluster_dims() == (2, 1, 1)
    assert dataclasses.replace(c, pingpong=0, bn=256, persistent=0).grid(128, 300) == (2, 1, 1)
    v = c.template_values()
    assert (v["CLUSTER_N"], v["A_BOX_ROWS"], v["B_BOX_ROWS"], v["EMPTY_ARRIVALS"]) == (1, 64, 64, 2)


def test_a_cluster_along_n_renders_a_multicast_and_b_its_own():
    nn = render(WgmmaConfig(bm=128, bn=256, cluster=2, cluster_n=1))
    assert "tma_load_multicast(a_dst + a_part, &tmA, bar, kt * BK, m0 + static_cast<int>(rank) * A_BOX_ROWS," in nn
    assert "const uint32_t b_dst = a_dst + A_STAGE_BYTES;\n" in nn
    assert "tma_load(b_dst + j * B_CHUNK_BYTES, &tmB, bar, n0 + j * 64, kt * BK, bt, b3);" in nn
    assert "tma_load_multicast(b_dst" not in nn
    assert "const int ctiles_m = tiles_m, ctiles_n = (tiles_n + CLUSTER - 1) / CLUSTER;" in nn
    assert nn.count("tile_coords(tile, ctiles_m, ctiles_n, bt, ctm, tn);") == 2
    assert nn.count("const int m0 = ctm * BM, n0 = (tn * CLUSTER + static_cast<int>(rank)) * BN;") == 2
    assert "CLUSTER=2 (along N)" in nn and "A box 64 x 64" in nn
    assert "tiles = ceil(M / 128) * ceil(ceil(N / 256) / 2) * batch" in nn
    along_m = render(WgmmaConfig(bm=128, bn=256, cluster=2))
    assert "ctiles_n" not in along_m and "A_BOX_ROWS" not in along_m
    tn = render(CLUSTER_N_GOLDEN)
    assert ("tma_load_multicast(a_dst + j * A_CHUNK_BYTES + a_part, &tmA, bar, m0 + j * 64,\n"
            "                                           kt * BK + static_cast<int>(rank) * A_BOX_ROWS,") in tn
    # ping-pong in a cluster: stages released in both blocks, the order barrier local
    assert "mbar_arrive_cluster(empty(s), cta);" in tn and "mbar_arrive(order);" in tn
    assert "EMPTY_ARRIVALS = 2;" in tn and tn.count("cluster_sync();") == 2


def test_sass_of_the_clusters(compiled_variants, compile_cache):
    """Along N, A's boxes go out multicast and B's plain; along M the other way round; a
    ping-pong consumer in a cluster arrives on both blocks' empty barriers (remote arrives);
    168 registers, no spill."""
    for name in CLUSTER_NAMES[:4]:
        c = WgmmaConfig.from_name(name)
        r = compiled_variants[c]
        assert r.ok and r.resources.registers == 168 and r.resources.spill_stores == 0, name
        code = _sass(c, compile_cache)
        loads = [line for line in code.splitlines() if "UTMALDG" in line]
        a_boxes = c.bm // 64 if c.a_mn_major else 1
        b_boxes = c.bn // 64 if c.b_mn_major else 1
        multicast = sum("MULTICAST" in line for line in loads)
        # each box a rank-2 and a rank-3 (batched operand) load
        assert multicast == 2 * (a_boxes if c.cluster_n else b_boxes), (name, loads)
        assert len(loads) - multicast == 2 * (b_boxes if c.cluster_n else a_boxes), (name, loads)
        assert "SYNCS.ARRIVE.TRANS64.RED" in code, name  # remote arrives on the peer's barriers


def test_the_runner_maps_a_cluster_along_n_and_launches_the_cluster(monkeypatch):
    """The maps' boxes are tma_boxes' (half of A's rows per block), the launch a cluster of
    two along x."""
    from tuner.runtime.runners import TmaRunner

    fake = _FakeTma(monkeypatch)
    cfg = WgmmaConfig.from_name(CLUSTER_NAMES[1])  # TN: A column-major, M-major boxes
    TmaRunner(cfg, b"").bind(fake.g, 300, 520, 136, 304, 520, 520)(0x10000, 0x20000, 0x30000,
                                                                  1.0, 0.0, 0)
    a, b, c = fake.encoded
    assert a["boxDim"] == [64, 32] and b["boxDim"] == [64, 64] and c["boxDim"] == [32, 128]
    # 3 M tiles x ceil(5 N tiles / 2) = 9 clusters of 2 blocks
    assert fake.launched == [(cfg.name, (18, 1, 1), (384, 1, 1), 0, (2, 1, 1))]


def test_the_search_leaves_ping_pong_clusters_out():
    """Buildable and tested, measured slower, not searched: the reason says so; a cluster
    along N is not in the searched space at all."""
    from codegen.families.wgmma import problem_reasons, unproven_reasons, valid_configs

    ppc = WgmmaConfig.from_name(CLUSTER_NAMES[0])
    assert check_wgmma(ppc, "sm_90") == []
    assert unproven_reasons(ppc) == problem_reasons(ppc, (4096, 4096, 4096)) == [
        "ping-pong consumers in a cluster are not searched: they measured 1-10% behind the "
        "same tile without a cluster"]
    grid = list(valid_configs("sm_90", DType.F16, (4096, 4096, 4096)))
    assert grid and not any(c.pingpong and c.cluster > 1 for c in grid)
    assert not any(c.cluster_n for c in grid)
    assert any(c.pingpong for c in grid) and any(c.cluster == 2 for c in grid)
    # along N, a cluster needs two N tiles as along M two M tiles
    xn = WgmmaConfig(bm=128, bn=256, cluster=2, cluster_n=1)
    assert problem_reasons(xn, (4096, 256, 4096)) == [
        "a cluster of 2 blocks along N (A multicast) needs as many N tiles; N=256 makes 1 of "
        "256 columns, so 1 of each cluster's blocks would compute nothing"]
    assert problem_reasons(xn, (128, 264, 4096)) == []
