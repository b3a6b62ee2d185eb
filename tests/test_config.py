import dataclasses

import pytest

from codegen import DEFAULT_CONFIG, DType, KernelConfig, UsageError


def test_name_format_is_pinned():
    assert DEFAULT_CONFIG.name == "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8"
    c = KernelConfig(bm=64, bn=256, bk=16, rm=4, rn=8, wt=8, pad=0, vec=2, stages=3, swizzle=1)
    assert c.name == "gemm_simt_f32_64x256x16_r4x8_w8x4_p0_v2_s3_g1"
    # split-K appears only when it is used, so names from before it still parse
    assert KernelConfig(split=8).name == "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k8"


@pytest.mark.parametrize("cfg", [
    DEFAULT_CONFIG,
    KernelConfig(bm=16, bn=32, bk=4, rm=1, rn=1, wt=32, pad=1, vec=1, stages=1, swizzle=4),
    KernelConfig(bm=256, bn=64, bk=32, rm=16, rn=2, wt=1, pad=2, vec=4, stages=4, swizzle=8),
    KernelConfig(bm=32, bn=32, rm=2, rn=4, wt=16, stages=3, split=32),
    KernelConfig(bm=32, bn=32, rm=2, rn=4, wt=16, stages=3, split=8, reduce="cluster", frags=2),
    KernelConfig(bm=16, bn=32, rm=4, rn=4, wt=4, stages=2, split=32, reduce="last"),
])
def test_name_round_trips(cfg):
    assert KernelConfig.from_name(cfg.name) == cfg
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("bad", [
    "", "gemm", "gemm_simt_f32_128x128x8", "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2",
    "gemm_simt_f99_128x128x8_r8x8_w4x8_p4_v4_s2_g8", "gemm_wat_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8",
    "gemm_simt_f32_128x128x8_r8x8_w4x4_p4_v4_s2_g8",  # 4x4 is not 32 lanes
])
def test_from_name_rejects_non_names(bad):
    with pytest.raises(UsageError):
        KernelConfig.from_name(bad)


def test_config_is_frozen_and_hashable():
    with pytest.raises(Exception):
        DEFAULT_CONFIG.bm = 64  # type: ignore[misc]
    assert len({DEFAULT_CONFIG, KernelConfig()}) == 1


def test_derived_geometry_of_the_default():
    v = DEFAULT_CONFIG.template_values()
    assert (v["THREADS"], v["WM"], v["WN"], v["WARPS_M"], v["WARPS_N"]) == (256, 32, 64, 4, 2)
    assert (v["VA"], v["VB"], v["A_LOADS"], v["B_LOADS"]) == (4, 4, 1, 1)
    assert v["SMEM_BYTES"] == 2 * 8 * (132 + 132) * 4 == DEFAULT_CONFIG.smem_bytes
    # Padding of 1 word breaks 16-byte alignment of shared rows: fragment reads go scalar.
    assert KernelConfig(pad=1).template_values()["VA"] == 1
    assert KernelConfig(pad=2).template_values()["VA"] == 2
    assert DEFAULT_CONFIG.grid(1000, 1000) == (8 * 8, 1, 1)


@pytest.mark.parametrize("text,want", [
    ("fp32", DType.F32), ("F32", DType.F32), ("float32", DType.F32), ("tf32", DType.TF32),
    ("fp16", DType.F16), ("bfloat16", DType.BF16),
])
def test_dtype_parse(text, want):
    assert DType.parse(text) is want


def test_dtype_parse_rejects_unknown():
    with pytest.raises(UsageError, match="unknown dtype 'int7'"):
        DType.parse("int7")


def test_fragment_double_buffering_is_named_and_checked():
    from codegen import check

    c = KernelConfig(frags=2, split=4)
    assert c.name == "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k4_f2"
    assert KernelConfig.from_name(c.name) == c and KernelConfig.from_dict(c.to_dict()) == c
    assert check(KernelConfig(frags=4), "sm_90") == ["fragment buffers 4 must be 1, 2 or 3"]
    assert check(KernelConfig(frags=3), "sm_90") == [  # (carried across tiles: below)
        "fragments carried across tiles (frags 3) are built for the double buffer's interior "
        "path (stages 2, interior 1-2), not stages 2, interior 0"]
    carried = KernelConfig(frags=3, interior=1)
    assert check(carried, "sm_90") == [] and carried.name.endswith("_f3_i1")


def test_cluster_split_k_is_named_and_sized():
    """A cluster split-K is one launch with no workspace; its shared memory holds at least
    the BM x BN partial tile."""
    c = KernelConfig(split=4, reduce="cluster")
    assert c.name == "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k4c"
    assert c.cluster and not c.reduce_pass and not c.has_workspace and c.workspace_floats(100, 100) == 0
    assert c.smem_bytes == 128 * 128 * 4  # over the 16896 B of the main loop
    assert c.grid(300, 200) == (3 * 2, 1, 4)
    p = KernelConfig(split=4)
    assert p.reduce_pass and not p.cluster and p.workspace_floats(100, 100) == 40000
    assert p.smem_bytes == 16896
    big = KernelConfig(bm=32, bn=32, bk=16, rm=2, rn=4, wt=16, stages=4, split=2,
                       reduce="cluster")
    assert big.smem_bytes == 4 * 16 * (36 + 36) * 4  # the ring is larger than 32x32x4


def test_last_block_split_k_is_named_and_sized():
    """The last block of each tile sums it: the pass's workspace, a counter per tile."""
    c = KernelConfig(split=32, reduce="last")
    assert c.name == "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k32l"
    assert c.last and c.has_workspace and not c.reduce_pass and not c.cluster
    assert c.workspace_floats(100, 300) == 32 * 100 * 300
    assert c.ticket_count(300, 200) == 3 * 2 and KernelConfig(split=32).ticket_count(300, 200) == 0
    assert c.smem_bytes == KernelConfig(split=32).smem_bytes
    # reduce only means something with a split: no mark on the name without one
    assert KernelConfig(reduce="last").name == KernelConfig().name


def test_stream_k_is_named_sized_and_checked():
    """Stream-K: the grid is the GPU's block slots, the workspace two partial tiles a
    block of each problem, a counter per tile of each problem; not with split-K."""
    from codegen import check
    from codegen.config import config_from_name

    c = KernelConfig(bm=128, bn=256, bk=16, rm=8, rn=16, wt=8, interior=1, streamk=1)
    assert c.name == "gemm_simt_f32_128x256x16_r8x16_w8x4_p4_v4_s2_g8_i1_sk"
    assert config_from_name(c.name) == c and not check(c, "sm_90")
    assert c.last and c.has_workspace and not c.reduce_pass and not c.cluster
    assert c.grid(4096, 4096, slots=132) == (132, 1, 1)
    with pytest.raises(ValueError, match="slots"):
        c.grid(4096, 4096)
    assert c.workspace_floats(4096, 4096, batch=3, slots=132) == 3 * 132 * 2 * 128 * 256
    assert c.ticket_count(4096, 4096, batch=3) == 3 * 32 * 16
    assert check(dataclasses.replace(c, split=4), "sm_90") == [
        "stream-K shares out k-tiles itself: not with split-K 4"]
    assert check(dataclasses.replace(c, streamk=2), "sm_90") == ["streamk=2 is not 0 or 1"]


def test_launch_bounds_minimum_is_named_and_checked():
    from codegen import check

    c = KernelConfig(bm=128, bn=64, bk=16, swizzle=1, minb=4)
    assert c.name == "gemm_simt_f32_128x64x16_r8x8_w4x8_p4_v4_s2_g1_b4"
    assert KernelConfig.from_name(c.name) == c and KernelConfig.from_dict(c.to_dict()) == c
    assert KernelConfig.from_name("gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k4c_f2_b2") == \
        KernelConfig(split=4, reduce="cluster", frags=2, minb=2)
    assert check(KernelConfig(minb=9), "sm_90") == [
        "__launch_bounds__ minimum of 9 blocks of 256 threads does not fit the 2048 threads "
        "of an SM"]
