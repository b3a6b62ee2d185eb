"""The procedural name is the identity: a file name, a cache key, a library entry.

Each family declares it once (its config's NAME, a codegen.families._common.Name); these
tests pin what that declaration writes: every committed name reads back to a config that
writes it again, a sample of every family's valid configs round-trips, and the format of
each optional part is spelled out.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from codegen import UsageError
from codegen.families import FAMILIES, config_from_name
from codegen.families._common import DType, Layout
from codegen.families.simt import KernelConfig
from codegen.families.wgmma import WgmmaConfig
from codegen.families.wmma import WmmaConfig

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (1024, 1024, 4096)  # few tiles on sm_90: split-K variants in the SIMT grid
SKINNY = (16, 4096, 4096)


def _committed_names() -> list[str]:
    """The kernels of the committed library (artifacts/library) and the golden sources."""
    doc = json.loads((ROOT / "artifacts" / "library" / "manifest.json").read_text())
    names = {e["kernel"] for e in doc["entries"]}
    names |= {t["kernel"] for e in doc["entries"] for t in e.get("top", [])}
    names |= {key.split("/", 1)[1] for key in doc["kernels"]}
    names |= {p.name.removesuffix(".cu") for p in (ROOT / "tests" / "golden").glob("gemm_*.cu")}
    return sorted(names)


COMMITTED = _committed_names()


def test_the_committed_names_cover_every_family():
    assert {n.split("_")[1] for n in COMMITTED} == set(FAMILIES)


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_names_read_back_to_themselves(name):
    assert config_from_name(name).name == name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sample_of_valid_configs_round_trips(family):
    spec = FAMILIES[family]
    seen: dict[str, object] = {}
    for arch in ("sm_80", "sm_90"):
        for dtype in spec.dtypes:
            # the first shape the family's default takes (decode: M <= 64 only)
            d = spec.default(spec.dtypes[dtype])
            shape = next(x for x in (SHAPE, SKINNY) if not spec.shape_reasons(d, x, arch))
            configs = list(spec.valid_configs(arch, spec.dtypes[dtype], shape))
            for c in configs[::max(len(configs) // 150, 1)] + configs[-3:]:
                assert spec.config.from_name(c.name) == c
                assert config_from_name(c.name) == c
                assert seen.setdefault(c.name, c) == c  # one name, one config
    assert len(seen) > 100


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_name_declares_every_field(family):
    """Every field but the layout (one value so far) is in the name; the family's own name
    is the prefix."""
    cfg = FAMILIES[family].config
    fields = {f.name for f in dataclasses.fields(cfg)} - {"layout", "family"}
    assert fields <= set(cfg.NAME.fields)
    assert cfg.NAME.pattern.startswith(("gemm_{family}_", f"gemm_{family}_"))


@pytest.mark.parametrize("config,name", [
    (KernelConfig(), "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8"),
    (KernelConfig(dtype=DType.BF16, split=4), "gemm_simt_bf16_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k4"),
    (KernelConfig(split=8, reduce="last", frags=2),
     "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k8l_f2"),
    (KernelConfig(bm=32, bn=32, rm=2, rn=4, wt=16, stages=3, split=2, reduce="cluster", minb=3),
     "gemm_simt_f32_32x32x8_r2x4_w16x2_p4_v4_s3_g8_k2c_b3"),
    (KernelConfig(pad=0, swz=1, interior=2, zigzag=1, layout=Layout.NT),
     "gemm_simt_f32_128x128x8_r8x8_w4x8_p0_v4_s2_g8_sw_i2_z_nt"),
    (KernelConfig(bn=256, rn=16, wt=8, stages=1, interior=1),
     "gemm_simt_f32_128x256x8_r8x16_w8x4_p4_v4_s1_g8_i1"),
    (KernelConfig(bn=256, rn=16, wt=16, interior=1, zigzag=2, ptxas=1),
     "gemm_simt_f32_128x256x8_r8x16_w16x2_p4_v4_s2_g8_i1_z2_o1"),
    (KernelConfig(ptxas=1, layout=Layout.TN), "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_o1_tn"),
    (KernelConfig(bn=256, bk=16, rn=16, wt=8, swizzle=1, frags=3, interior=2, zigzag=2, ptxas=1),
     "gemm_simt_f32_128x256x16_r8x16_w8x4_p4_v4_s2_g1_f3_i2_z2_o1"),
    (WmmaConfig(), "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8"),
    (WmmaConfig(dtype=DType.TF32, bk=16, skew=4, vec=4),
     "gemm_wmma_tf32_128x128x16_w64x32_p4_v4_s3_g8"),
    (WgmmaConfig(), "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8"),
    (WgmmaConfig(bm=128, bn=128, stages=5, pingpong=1, store=1),
     "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts"),
    (WgmmaConfig(dtype=DType.TF32, bk=32, prep=1),
     "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre"),
    (WgmmaConfig(dtype=DType.F32, bk=32, bn=128, stages=2, terms=3, store=1),
     "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_ts_t3"),
])
def test_name_format_is_pinned(config, name):
    assert config.name == name and config_from_name(name) == config


@pytest.mark.parametrize("name", [
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_k1",    # split 1 is written as nothing
    "gemm_simt_f32_128x128x8_r8x8_w4x4_p4_v4_s2_g8",       # 4 x 4 is not 32 lanes
    "gemm_simt_f32_0128x128x8_r8x8_w4x8_p4_v4_s2_g8",      # one spelling of each number
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_b2_f2",  # parts in their order
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_z_i1",   # parts in their order
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_i0",     # no interior path: nothing
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8_i",      # the path is a number
    "gemm_wmma_f32x4_128x128x32_w64x32_p8_v8_s3_g8",
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_t1",
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts_pp",
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8 x",
])
def test_only_the_name_a_config_writes_reads_back(name):
    with pytest.raises(UsageError):
        config_from_name(name)


#: the trial parameters each family's search asks for, by the dtype of its configs: the
#: names live on in stored Optuna studies, so they must not change
PARAMETERS = {
    # (the first valid SIMT point has pad 0 and one stage, so the conditional "swz" and
    # "interior" are asked too)
    ("simt", DType.F32): ["bm", "bn", "bk", "rm", "rn", "wt", "pad", "vec", "stages", "swizzle",
                          "swz", "interior"],
    ("simt", DType.F16): ["bm", "bn", "bk", "rm", "rn", "wt", "pad", "vec", "widened_stages",
                          "swizzle", "swz", "interior"],
    ("wmma", DType.F16): ["wmma_bm", "wmma_bn", "wmma_bk", "wmma_wm", "wmma_wn", "wmma_stages",
                          "wmma_swizzle", "wmma_skew_bytes"],
    # (the first valid wgmma point is a 64x64 tile: its ring is asked as "wgmma_stages_deep")
    ("wgmma", DType.F16): ["wgmma_bm", "wgmma_bn", "wgmma_stages_deep", "wgmma_consumers",
                           "wgmma_cluster", "wgmma_persistent", "wgmma_group", "wgmma_store",
                           "wgmma_pingpong"],
    ("wgmma", DType.TF32): ["wgmma_bm", "wgmma_bn", "wgmma_stages", "wgmma_consumers",
                            "wgmma_cluster", "wgmma_persistent", "wgmma_group", "wgmma_store",
                            "wgmma_prep"],
}
#: ... and prep 3 (one operand through registers) whether its rows come in pairs
PREP3_PARAMETERS = PARAMETERS["wgmma", DType.TF32] + ["wgmma_rs_pairs"]


@pytest.mark.parametrize("family,dtype", list(PARAMETERS))
def test_search_parameter_names_are_pinned(family, dtype):
    from codegen.arch import parse_arch

    spec, arch = FAMILIES[family], parse_arch("sm_90")
    c = next(iter(spec.valid_configs(arch, dtype, None)))
    assert list(spec.params_of(c, (8192, 8192, 8192), arch)) == PARAMETERS[family, dtype]
    # split-K's, asked only where the tiles leave SMs idle
    if family == "simt":
        # an 8x8 micro-tile asks whether it is 8x16; one of 16 rows does not ask RN
        wide = KernelConfig(bm=128, bn=256, rm=8, rn=16, wt=8, dtype=dtype)
        assert list(spec.params_of(wide, (8192, 8192, 8192), arch))[-2:] == ["rn16", "interior"]
        tall = KernelConfig(bm=256, rm=16, rn=8, dtype=dtype)
        assert "rn" not in spec.params_of(tall, (8192, 8192, 8192), arch)
        small = KernelConfig(dtype=dtype, split=2, reduce="cluster")
        assert list(spec.params_of(small, (128, 128, 8192), arch))[-2:] == ["split",
                                                                           "split_reduce"]
    if family == "wgmma" and dtype is DType.F16:  # a tile of more than 24 KB a stage
        large = dataclasses.replace(c, bm=128, bn=256, stages=4)
        assert list(spec.params_of(large, (8192, 8192, 8192), arch))[2] == "wgmma_stages"
    if family == "wgmma" and dtype is DType.TF32:  # prep 3 asks whether its rows are paired
        for rp in (0, 1):
            p3 = dataclasses.replace(c, bm=256, bn=128, stages=4, prep=3, rs_pairs=rp)
            p = spec.params_of(p3, (8192, 8192, 8192), arch)
            assert list(p) == PREP3_PARAMETERS and p["wgmma_rs_pairs"] == rp
