"""Each kind of invalid configuration is rejected with its reason and numbers."""

import dataclasses

import pytest

from codegen import DEFAULT_CONFIG, DType, KernelConfig, UsageError, check, parse_arch


def test_default_is_valid_everywhere_it_can_be():
    for arch in ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90"):
        assert check(DEFAULT_CONFIG, arch) == []


@pytest.mark.parametrize("cfg,arch,reason", [
    (KernelConfig(bm=256, bn=256, rm=4, rn=4), "sm_90",
     "4096 threads per block exceeds the limit of 1024"),
    (KernelConfig(bm=16, bn=32, rm=4, rn=8, wt=4), "sm_90",
     "16 threads per block is not a multiple of the warp size 32"),
    (KernelConfig(bm=100), "sm_90", "BM=100 is not a multiple of RM=8"),
    (KernelConfig(bn=100), "sm_90", "BN=100 is not a multiple of RN=8"),
    (KernelConfig(bm=0), "sm_90", "tile sizes must be positive (BM=0)"),
    (KernelConfig(wt=3), "sm_90", "warp arrangement 3 x 32/3 is not a split of 32 lanes"),
    (KernelConfig(wt=32), "sm_90",
     "warp tile 256x8 (WT=32 x RM=8) does not divide BM=128"),
    (KernelConfig(wt=1), "sm_90",
     "warp tile 8x256 (32 lanes x RN=8) does not divide BN=128"),
    (KernelConfig(vec=3), "sm_90", "vector width 3 is not 1, 2 or 4 floats"),
    (KernelConfig(bk=2, vec=4), "sm_90", "BK=2 is not a multiple of the vector width 4"),
    (KernelConfig(bm=64, bn=64, rm=4, rn=4), "sm_90",
     "256 threads cannot load the 64x8 A tile evenly (128 vectors of 4)"),
    (KernelConfig(stages=3), "sm_75", "cp.async stages (3) need sm_80 or newer; sm_75 has none"),
    (KernelConfig(stages=5), "sm_90", "stages=5 is outside 1..4"),
    (KernelConfig(pad=33), "sm_90", "padding 33 words is outside 0..32"),
    (KernelConfig(swizzle=0), "sm_90", "swizzle group 0 must be at least 1"),
    (KernelConfig(split=3), "sm_90", "split-K 3 is not one of 1, 2, 4, 8, 16, 32"),
    (KernelConfig(split=16, reduce="cluster"), "sm_90",
     "a cluster split-K takes 2, 4, 8 slices (a portable cluster size), not 16"),
    (KernelConfig(reduce="cluster"), "sm_90",
     "a cluster split-K takes 2, 4, 8 slices (a portable cluster size), not 1"),
    (KernelConfig(split=4, reduce="cluster"), "sm_80",
     "a cluster split-K needs thread-block clusters (sm_90 or newer); sm_80 has none"),
    (KernelConfig(reduce="last"), "sm_90", "a last-block split-K needs a split of 2 or more, not 1"),
    (KernelConfig(split=4, reduce="atomic"), "sm_90",
     "split-K reduce 'atomic' is not one of pass, last, cluster"),
    (KernelConfig(bm=256, bn=256, rm=16, rn=8, split=2, reduce="cluster"), "sm_90",
     "shared memory 262144 B exceeds the 232448 B per-block limit of sm_90"),
    (KernelConfig(bm=256, bn=256, bk=32, rm=16, rn=16, stages=4), "sm_90",
     "shared memory 266240 B exceeds the 232448 B per-block limit of sm_90"),
    (KernelConfig(bm=256, bn=256, rm=16, rn=16), "sm_90",
     "the 16x16 accumulators and fragments need 288 registers, over the 255 per-thread limit"),
    (KernelConfig(dtype=DType.TF32), "sm_90", "the simt family has no tf32 kernel"),
    (KernelConfig(dtype=DType.BF16, stages=4), "sm_90",
     "bf16 inputs are widened to fp32 on the way through registers, so stages must be 1 "
     "or 2, not 4 (cp.async cannot convert)"),
])
def test_invalid_configs_say_why(cfg, arch, reason):
    reasons = check(cfg, arch)
    assert reason in reasons, reasons


def test_shared_memory_limit_depends_on_the_arch():
    cfg = KernelConfig(bk=32, stages=4)
    assert cfg.smem_bytes == 4 * 32 * (132 + 132) * 4 == 135168
    assert check(cfg, "sm_80") == []  # 163 KiB opt-in per block
    assert check(cfg, "sm_86") == [
        "shared memory 135168 B exceeds the 101376 B per-block limit of sm_86"]


def test_check_is_pure_and_lists_every_reason():
    cfg = KernelConfig(bm=256, bn=256, bk=32, rm=4, rn=4, stages=4, pad=33)
    first = check(cfg, "sm_75")
    assert first == check(cfg, "sm_75")
    assert len(first) >= 3  # threads, stages, padding, shared memory all reported


@pytest.mark.parametrize("text", ["sm_90", "90", 90, "9.0", "sm90", "compute_90", "sm_90a"])
def test_parse_arch_spellings(text):
    assert parse_arch(text).cc == 90


@pytest.mark.parametrize("text", ["sm_91", "gfx90a", "", "sm_"])
def test_parse_arch_rejects_unknown(text):
    with pytest.raises(UsageError, match="unknown GPU architecture"):
        parse_arch(text)


def test_the_swizzle_rules():
    from codegen.config import Layout

    ok = KernelConfig(bm=128, bn=128, bk=16, rm=8, rn=8, wt=8, pad=0, swz=1)
    assert check(ok, "sm_90") == []
    assert check(dataclasses.replace(ok, pad=4), "sm_90") == [
        "a swizzled tile takes no padding (pad=4)"]
    assert check(dataclasses.replace(ok, layout=Layout.TN), "sm_90") == [
        "nothing to swizzle: with layout tn no operand is transposed on its way in"]
    # BK=32 with VEC=4: the swizzle's chunks are 4 columns, still whole float4 reads
    assert check(dataclasses.replace(ok, bk=32), "sm_90") == []
    # VEC=1, BK=16: 2-column chunks would split the 4-wide fragment reads
    assert check(dataclasses.replace(ok, vec=1), "sm_90") == [
        "the swizzle's 2-column chunks split A's 4-wide fragment reads"]
    assert "a swizzled A tile needs its width (16) a multiple of 32" in check(
        KernelConfig(bm=16, bn=32, bk=16, rm=4, rn=4, wt=4, pad=0, swz=1), "sm_90")


def test_the_interior_path_rules():
    ok = KernelConfig(bm=128, bn=128, bk=8, rm=8, rn=8, wt=16, pad=0, swz=1, interior=2)
    assert check(ok, "sm_90") == [] and check(dataclasses.replace(ok, interior=1), "sm_75") == []
    assert check(dataclasses.replace(ok, stages=1, interior=1), "sm_90") == []
    assert check(dataclasses.replace(ok, interior=3), "sm_90") == [
        "interior path 3 is not one of 0, 1, 2"]
    assert check(dataclasses.replace(ok, stages=3), "sm_90") == [
        "the unchecked interior path is built for the register-staged loop (stages 1-2), "
        "not a cp.async ring of 3"]
    assert check(dataclasses.replace(ok, stages=1), "sm_90") == [
        "an interior path of two K tiles a turn pairs the double buffer's stages: stages "
        "2, not 1"]
    assert check(dataclasses.replace(ok, zigzag=1), "sm_90") == []
    assert check(dataclasses.replace(ok, zigzag=2, ptxas=1), "sm_90") == []
    assert check(dataclasses.replace(ok, zigzag=3), "sm_90") == ["FMA order 3 is not one of 0, 1, 2"]
    assert check(dataclasses.replace(ok, ptxas=2), "sm_90") == ["ptxas level 2 is not one of 1, 3"]
    assert check(dataclasses.replace(ok, frags=3), "sm_90") == []
    assert check(dataclasses.replace(ok, frags=4), "sm_90") == ["fragment buffers 4 must be 1, 2 or 3"]
    assert check(dataclasses.replace(ok, frags=3, interior=0), "sm_90") == [
        "fragments carried across tiles (frags 3) are built for the double buffer's interior "
        "path (stages 2, interior 1-2), not stages 2, interior 0"]
    odd = KernelConfig(bm=16, bn=16, bk=8, rm=1, rn=2, wt=4, pad=4, vec=1)
    assert check(odd, "sm_90") == [] and check(dataclasses.replace(odd, zigzag=1), "sm_90") == []
    assert check(dataclasses.replace(odd, zigzag=2), "sm_90") == [
        "the 2x2-block FMA order needs an even micro-tile, not 1x2"]


def test_epilogue_and_layout_rules():
    from codegen.config import Layout

    assert check(KernelConfig(out=DType.F16, bias="f32", act="gelu", layout=Layout.TT),
                 "sm_90") == []
    assert check(KernelConfig(bias="f32"), "sm_90") == ["an fp32 bias with fp32 C is bias='out'"]
    assert check(KernelConfig(out=DType.TF32, act="tanh", bias="yes"), "sm_90") == [
        "C cannot be tf32: it is one of f32, f16, bf16",
        "bias 'yes' is not one of none, out, f32",
        "activation 'tanh' is not one of none, relu, gelu, gelu_tanh, silu"]
    assert check(KernelConfig(vec=4, bm=16, bn=32, rm=4, rn=4, layout=Layout.TN), "sm_90") == []


def test_every_kernel_a_pairs_file_names_is_valid_for_the_h200():
    """bench/pairs/*.txt (the device's pairs step, and candidate lists): each line's kernel,
    its last word, reads back from its name and passes check for sm_90, so that a typo
    or a rule changed since costs no device time."""
    from pathlib import Path

    from codegen.config import config_from_name

    files = sorted((Path(__file__).resolve().parent.parent / "bench" / "pairs").glob("*.txt"))
    names = [line.split()[-1] for f in files for line in f.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(files) >= 10 and len(names) >= 100
    bad = {n: check(config_from_name(n), "sm_90") for n in names}
    assert not {n: why for n, why in bad.items() if why}
