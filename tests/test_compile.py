"""Rendering and compiling for real with nvcc (no GPU). A missing nvcc fails, it does not skip."""

from pathlib import Path

import pytest

from _sample import ARCHS, VALUES, covering, for_arch, sample_configs
from codegen import DEFAULT_CONFIG, KernelConfig, compile_config, compile_many, parse_ptxas, render
from codegen.compile import compile_source, nvcc_path

FIXTURES = Path(__file__).parent / "fixtures"


def test_nvcc_is_present():
    assert Path(nvcc_path()).is_file()


@pytest.mark.parametrize("name,want", [
    ("default_sm_90.txt", dict(registers=125, smem_static=0, spill_stores=0, spill_loads=0,
                               stack_frame=0, barriers=1, ptxas_ms=118.236)),
    ("default_sm_80.txt", dict(registers=136, smem_static=0, spill_stores=0, spill_loads=0,
                               stack_frame=0, barriers=1, ptxas_ms=97.82)),
    ("spilling_sm_90.txt", dict(registers=32, smem_static=0, spill_stores=10140,
                                spill_loads=10384, stack_frame=3008, barriers=1,
                                ptxas_ms=694.474)),
])
def test_parse_recorded_ptxas_reports(name, want):
    res = parse_ptxas((FIXTURES / "ptxas" / name).read_text())
    assert {k: getattr(res, k) for k in want} == want


def test_parse_picks_the_named_entry():
    text = (FIXTURES / "ptxas" / "two_entries_sm_90.txt").read_text()
    second = parse_ptxas(text, "second_kernel")
    gemm = parse_ptxas(text, "gemm_simt_f32_64x64x16_r4x4_w4x8_p4_v4_s1_g8")
    assert (second.registers, second.smem_static, second.ptxas_ms) == (10, 256, 2.169)
    assert (gemm.registers, gemm.smem_static, gemm.ptxas_ms) == (64, 0, 32.4)
    with pytest.raises(ValueError, match="not in the ptxas report"):
        parse_ptxas(text, "missing")
    with pytest.raises(ValueError, match="no 'Compiling entry function'"):
        parse_ptxas("nvcc: nothing here")


def test_default_compiles_without_spills(compile_cache):
    for arch in ARCHS:
        r = compile_config(DEFAULT_CONFIG, arch, compile_cache)
        assert r.ok, r.log
        assert r.resources.spill_bytes == 0 and r.resources.stack_frame == 0
        assert 64 <= r.resources.registers <= 255
        assert r.resources.smem == DEFAULT_CONFIG.smem_bytes
        assert r.cubin.read_bytes()[:4] == b"\x7fELF"


def test_sample_covers_every_value():
    sample = sample_configs()
    assert len(sample) >= 50
    for key, values in VALUES.items():
        assert {getattr(c, key) for c in sample} == set(values), key


@pytest.mark.parametrize("arch", ARCHS)
def test_sample_compiles(arch, compile_cache, tmp_path):
    """A subset of the sample holding every value of every parameter the sample has on
    `arch` (the cluster split-K ones on sm_90 only) renders and compiles (in parallel), with
    resources read back. The whole sample compiles and runs against float64 on the GPU
    (tests/test_gpu_kernels.py); the subset is 9 of its 68 configurations on sm_90."""
    whole = for_arch(sample_configs(), arch)
    assert len(whole) >= (68 if arch == "sm_90" else 60)
    sample = covering(whole)
    assert len(sample) < len(whole) and all(
        {getattr(c, f) for c in sample} == {getattr(c, f) for c in whole} for f in VALUES)
    results = dict(compile_many(sample, arch, jobs=2, cache_dir=compile_cache,
                                artifacts_dir=tmp_path))
    failed = {c.name: r.error for c, r in results.items() if not r.ok}
    assert not failed, failed
    for c, r in results.items():
        assert r.resources.registers > 0
        assert r.resources.smem == c.smem_bytes
        for ext in (".cu", ".cubin", ".json"):
            assert (tmp_path / arch / f"{c.name}{ext}").is_file()


def test_compile_error_is_an_outcome_with_the_message(compile_cache):
    src = render(DEFAULT_CONFIG).replace("constexpr int BM = 128", "constexpr int BM = 100")
    r = compile_source(src, "sm_90", DEFAULT_CONFIG.name, compile_cache)
    assert not r.ok and r.cubin is None
    assert 'static assertion failed with "THREADS must be (BM/RM)*(BN/RN)"' in r.error


def test_unsupported_arch_is_an_outcome(compile_cache):
    r = compile_config(DEFAULT_CONFIG, "sm_70", compile_cache)
    assert not r.ok and "Unsupported gpu architecture" in r.error


def test_compile_cache_hits_on_the_same_source(tmp_path):
    cfg = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=1)
    first = compile_config(cfg, "sm_90", tmp_path)
    again = compile_config(cfg, "sm_90", tmp_path)
    assert first.ok and not first.cached and again.cached
    assert again.resources == first.resources and again.cubin == first.cubin
    other = compile_config(cfg, "sm_80", tmp_path)
    assert not other.cached and other.cubin != first.cubin


def test_static_asserts_guard_hand_edits():
    text = (FIXTURES / "static_assert_failure.txt").read_text()
    assert 'static assertion failed with "threads must load the A tile evenly"' in text


def test_launch_bounds_minimum_caps_the_registers(compile_cache):
    """__launch_bounds__(128, 4) leaves 65536 / 512 = 128 registers a thread: ptxas obeys,
    spilling what does not fit (the model then prunes it)."""
    free = KernelConfig(bm=128, bn=64, bk=16, rm=8, rn=8, wt=4, swizzle=1)
    capped = KernelConfig(bm=128, bn=64, bk=16, rm=8, rn=8, wt=4, swizzle=1, minb=4)
    a, b = (compile_config(c, "sm_90", compile_cache) for c in (free, capped))
    assert a.ok and b.ok, (a.log, b.log)
    assert a.resources.registers > 128 and a.resources.spill_bytes == 0
    assert b.resources.registers <= 128 and b.resources.spill_bytes > 0
    assert "__launch_bounds__(THREADS, 4)" in render(capped)
