"""Input types on the CPU: which families a request searches, the trial parameters of each,
the rounding the references use, the CLI's --dtype / --allow-tf32, a mixed search, and
library dispatch by type."""

import random

import numpy as np
import optuna
import pytest

from codegen import DType, check, compile_config, parse_arch
from codegen.config import Family, KernelConfig, WmmaConfig, config_from_dict, config_from_name
from codegen.families.wgmma import WgmmaConfig
from _fakes import FakeBenchmark
from tuner.bench import round_to, tolerance
from tuner.cli import main
from tuner.search import search
from tuner.space import families, is_candidate, params_of, suggest, valid_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)
ARCH = parse_arch("sm_90")


def test_families_per_request():
    assert families(DType.F32) == {Family.SIMT: DType.F32}
    assert families(DType.TF32) == {Family.SIMT: DType.F32, Family.WMMA: DType.TF32,
                                    Family.WGMMA: DType.TF32}
    # 3xTF32 only by consent (--allow-3xtf32): fp32 accuracy, its kernels' configs are f32
    assert families(DType.F32X3) == {Family.SIMT: DType.F32, Family.WGMMA: DType.F32}
    assert families(DType.F16) == {Family.SIMT: DType.F16, Family.WMMA: DType.F16,
                                   Family.WGMMA: DType.F16, Family.DECODE: DType.F16}
    assert families(DType.BF16) == {Family.SIMT: DType.BF16, Family.WMMA: DType.BF16,
                                    Family.WGMMA: DType.BF16, Family.DECODE: DType.BF16}
    assert is_candidate(KernelConfig(), DType.TF32)
    assert not is_candidate(WmmaConfig(dtype=DType.TF32), DType.F32)  # never without consent
    from codegen.families.wgmma import _default

    t3 = _default(DType.F32)
    assert t3.terms == 3 and t3.name.endswith("_t3")
    assert is_candidate(t3, DType.F32X3) and not is_candidate(t3, DType.F32)
    assert not is_candidate(KernelConfig(), DType.F16)  # fp16 data: the widening variant


@pytest.mark.parametrize("dtype", [DType.F32, DType.TF32, DType.F16, DType.BF16],
                         ids=lambda d: d.short)
def test_grid_parameters_give_back_the_config(dtype):
    """params_of is suggest's inverse: the grid hands Optuna exactly the configuration."""
    shape = (127, 129, 4097)  # split-K is asked for here
    pool = list(valid_configs(ARCH, dtype, shape))
    assert all(is_candidate(c, dtype) and not check(c, ARCH) for c in pool)
    kinds = {type(c) for c in pool}
    # N = 129 and K = 4097 elements: rows TMA cannot read, so of the wgmma family only the
    # tf32 pre-pass kernels (which read A and B with plain loads) are candidates
    want = {KernelConfig} if dtype is DType.F32 else {KernelConfig, WmmaConfig}
    assert kinds == (want | {WgmmaConfig} if dtype is DType.TF32 else want)
    assert all(c.prep for c in pool if isinstance(c, WgmmaConfig))
    wgmma = [c for c in pool if isinstance(c, WgmmaConfig)]
    for cfg in random.Random(1).sample(pool, 60) + wgmma[:5]:
        trial = optuna.trial.FixedTrial(params_of(cfg, dtype, shape, ARCH))
        assert suggest(trial, dtype, shape, ARCH) == cfg


def test_simt_widening_takes_register_staging_only():
    assert check(KernelConfig(dtype=DType.F16, stages=3), ARCH) == [
        "f16 inputs are widened to fp32 on the way through registers, so stages must be 1 "
        "or 2, not 3 (cp.async cannot convert)"]
    assert check(KernelConfig(dtype=DType.TF32), ARCH) == ["the simt family has no tf32 kernel"]


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16], ids=lambda d: d.short)
def test_simt_widening_compiles_without_spills(dtype, compile_cache):
    for cfg in (KernelConfig(dtype=dtype), KernelConfig(dtype=dtype, stages=1, vec=2, bk=16,
                                                        split=4)):
        res = compile_config(cfg, "sm_90", compile_cache)
        assert res.ok, res.error
        assert res.resources.spill_bytes == 0 and res.resources.registers <= 255


def test_rounding_to_each_input_type():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-11), 3.0],
                 np.float32)
    assert round_to(x, DType.F32)[1] is not None and np.array_equal(round_to(x, DType.F32)[1], x)
    # tf32: 10 mantissa bits, to nearest, ties away from zero (cvt.rna.tf32.f32)
    assert list(round_to(x, DType.TF32)[1]) == [1 + 2**-10, 1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8,
                                                -(1 + 2**-10), 3.0]
    # fp16: numpy's float16 (to nearest even)
    h, hr = round_to(x, DType.F16)
    assert h.dtype == np.float16 and list(hr) == [1.0, 1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8,
                                                  -1.0, 3.0]
    # bf16: 7 mantissa bits, to nearest even, stored as the top 16 bits
    u, ur = round_to(x, DType.BF16)
    assert u.dtype == np.uint16 and list(ur) == [1.0, 1.0, 1.0, 1 + 2**-6, -1.0, 3.0]
    assert list(u[-2:]) == [0xBF80, 0x4040]


def test_tolerance_by_family_and_depth():
    assert tolerance(KernelConfig(dtype=DType.F16), 65536) == 1e-5  # FP32 FMAs
    assert tolerance(WmmaConfig(), 1000) == 2e-5
    assert tolerance(WmmaConfig(), 16384) == pytest.approx(8e-5)  # grows with K
    assert tolerance(WmmaConfig(dtype=DType.TF32, vec=4, skew=4), 4096) == 1e-4


def test_configs_round_trip_through_names_and_dicts():
    for c in (WmmaConfig(dtype=DType.BF16), KernelConfig(dtype=DType.F16, split=8)):
        assert config_from_name(c.name) == c and config_from_dict(c.to_dict()) == c


def test_mixed_search_tries_both_families(compile_cache, tmp_path):
    bench = FakeBenchmark(shape=(1024, 1024, 1024), nvcc=False)
    res = search(bench.shape, bench, dtype=DType.F16, trials=12, jobs=2, seed=5,
                 model=False, cache_dir=compile_cache, artifacts=tmp_path)
    fams = {r.config.family for r in res.records}
    # three families share 12 candidates; the CUDA-core one is asked (params below) but
    # may lose every compiled slot to the seed
    assert {Family.WMMA, Family.WGMMA} <= fams <= {Family.SIMT, Family.WMMA, Family.WGMMA}
    assert all(is_candidate(r.config, DType.F16) for r in res.records)
    # the tensor-core bound is far above the CUDA cores', so a tensor-core kernel wins the fake
    assert res.timed()[0].config.family in (Family.WMMA, Family.WGMMA)
    params = [t.params for t in res.study.trials if "family" in t.params]
    assert any("wmma_bm" in p for p in params) and any("rm" in p for p in params)


@pytest.mark.parametrize("argv,msg", [
    (["--shape", "64x64x64", "--dtype", "fp16", "--allow-tf32", "--dry-run"],
     "--allow-tf32 is for fp32 data, not --dtype fp16"),
    (["--shape", "64x64x64", "--dtype", "int8", "--dry-run"], "unknown dtype 'int8'"),
])
def test_dtype_flag_errors(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err


@pytest.mark.parametrize("argv,first", [
    # fp32 C: the problem every family's template writes (bf16 data default to bf16 C,
    # which the families without an epilogue (FamilySpec.epilogue) do not build)
    (["--dtype", "bf16", "--out", "fp32"], ["gemm_simt_bf16_128x128x8",
                                            "gemm_wmma_bf16_128x128x32",
                                            "gemm_wgmma_bf16_128x128x64"]),  # ping-pong
    (["--allow-tf32"], ["gemm_simt_f32_128x128x8", "gemm_wmma_tf32_128x128x32"]),
])
def test_dry_run_per_type(tmp_path, capsys, argv, first):
    import json

    assert main(["--shape", "256x256x256", "--dry-run", "--trials", "3", "--json",
                 "--artifacts", str(tmp_path)] + argv) == 0
    out = json.loads(capsys.readouterr().out)
    names = [c["config"] for c in out["candidates"]]
    # the table comes sorted by predicted time: the families' defaults are in it
    assert len(names) == 3 and all(any(n.startswith(p) for n in names) for p in first)
    assert all(c["status"] in ("ok", "pruned") for c in out["candidates"])


def test_library_lists_and_inspects_tensor_core_entries(tmp_path, compile_cache, capsys):
    import json

    from _library import entry
    from tuner import load_library
    from tuner.runtime.library import Library

    cfg = WmmaConfig(dtype=DType.BF16)
    lib = Library.create_or_open(tmp_path / "lib")
    res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
    cu = tmp_path / "art" / "sm_90" / f"{cfg.name}.cu"
    lib.add(entry(cfg, res, (2048, 2048, 2048), 250.0, 700.0, dtype="bf16"), cu, res.cubin)
    lib = load_library(tmp_path / "lib")  # verifies the WMMA config too
    exact = lib.select(2048, 2048, 2048, DType.BF16)  # 0.36x cuBLAS where tuned: cuBLAS runs
    assert (exact.rule, exact.kernel) == ("exact", None) and cfg.name in exact.reason
    assert lib.select(2048, 2048, 2048, DType.F16).rule == "cublas"
    assert main(["inspect", cfg.name, "--library", str(lib.path)]) == 0
    out = capsys.readouterr().out
    assert "bm=128, bn=128, bk=32, wm=64, wn=32, skew=8, vec=8, stages=3, swizzle=8" in out
    assert "2048x2048x2048 bf16" in out
    assert main(["list", "--library", str(lib.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kernel"] == cfg.name
