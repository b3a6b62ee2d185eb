"""The wgmma family in the tuner, on the CPU: the search space (grid, TPE round trip),
misaligned problems rejected before compiling, the runner's launch plumbing through a
fake driver, the model's bound and occupancy, the dry run, `inspect --sass` and the
export bundle's fp16/bf16 entries (built with nvcc)."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import optuna
import pytest

from codegen import DType, compile_config, parse_arch
from codegen.compile import Resources
from codegen.families import FAMILIES, families_for
from codegen.families.wgmma import DEFAULT_WGMMA, SEARCH_SPACE, WgmmaConfig, problem_reasons
from tuner import wgmma_launch as wl
from tuner.model import bound_tflops, judge, shape_reasons
from tuner.outcome import Outcome

ARCH = parse_arch("sm_90")
SHAPE = (4096, 4096, 4096)


# ---- the search space ------------------------------------------------------------------
def test_wgmma_is_a_family_choice_for_16_bit_on_sm90_only():
    from tuner.space import families

    assert FAMILIES["wgmma"].searched
    for d in (DType.F16, DType.BF16):
        assert families(d, ARCH) == {"simt": d, "wmma": d, "wgmma": d}
        assert "wgmma" not in families(d, parse_arch("sm_80"))
    assert "wgmma" not in families(DType.F32, ARCH)


def test_the_grid_holds_searched_wgmma_points_and_no_clusters():
    from tuner.space import valid_configs

    grid = [c for c in valid_configs(ARCH, DType.F16, SHAPE) if isinstance(c, WgmmaConfig)]
    assert len(grid) == 264  # SEARCH_SPACE's 576 points less check_wgmma's rejections
    assert {c.cluster for c in grid} == {1} and SEARCH_SPACE["cluster"] == (1,)
    assert {(c.bm, c.bn, c.consumers) for c in grid} >= {(128, 256, 2), (256, 128, 2),
                                                         (128, 128, 1), (64, 64, 1)}
    assert DEFAULT_WGMMA in grid
    # a cluster config stays buildable (checked, rendered, tested), only unsearched
    from codegen import check

    assert check(dataclasses.replace(DEFAULT_WGMMA, cluster=2), ARCH) == []


def test_tpe_suggest_round_trips_through_the_family_choice():
    from tuner.space import params_of, suggest

    for c in (DEFAULT_WGMMA, WgmmaConfig(bm=256, bn=128, persistent=0, dtype=DType.BF16),
              WgmmaConfig(bm=64, bn=192, consumers=1, stages=6, group=1)):
        p = params_of(c, c.dtype, SHAPE, ARCH)
        assert p["family"] == "wgmma"
        assert suggest(optuna.trial.FixedTrial(p), c.dtype, SHAPE, ARCH) == c
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=5))
    seen = set()
    for i in range(40):
        t = study.ask()
        cfg = suggest(t, DType.F16, SHAPE, ARCH)
        seen.add(type(cfg).__name__)
        study.tell(t, 700.0 if isinstance(cfg, WgmmaConfig) else 100.0)
    assert "WgmmaConfig" in seen
    assert study.best_params["family"] == "wgmma"


# ---- misaligned problems ----------------------------------------------------------------
def test_a_problem_tma_cannot_describe_is_rejected_before_compiling_with_numbers():
    from tuner.space import valid_configs

    odd = (4096, 4095, 4096)
    assert problem_reasons(DEFAULT_WGMMA, odd) == [
        "TMA cannot describe the operands: ldb=4095 x 2 B = 8190 B is not a multiple of 16 bytes"]
    assert shape_reasons(DEFAULT_WGMMA, (127, 129, 4097), ARCH) == [
        "TMA cannot describe the operands: lda=4097 x 2 B = 8194 B is not a multiple of 16 bytes",
        "TMA cannot describe the operands: ldb=129 x 2 B = 258 B is not a multiple of 16 bytes"]
    assert shape_reasons(DEFAULT_WGMMA, SHAPE, ARCH) == []
    assert not any(isinstance(c, WgmmaConfig) for c in valid_configs(ARCH, DType.F16, odd))


def test_the_search_never_compiles_wgmma_for_a_misaligned_shape(tmp_path, compile_cache):
    from _fakes import FakeBenchmark
    from tuner.search import search

    bench = FakeBenchmark(shape=(256, 255, 256))
    # the sampler's own asks (no model-first batch, which only queues valid configs)
    res = search(bench.shape, bench, dtype=DType.F16, trials=6, sampler="random", seed=3,
                 jobs=1, cache_dir=compile_cache, artifacts=tmp_path, model=False)
    assert not any(isinstance(c, WgmmaConfig) for c in bench.measured)
    reasons = [t.user_attrs.get("reason", "") for t in res.study.trials
               if t.params.get("family") == "wgmma"]
    assert reasons and all("TMA cannot describe the operands: ldb=255" in r for r in reasons)


# ---- the runner's plumbing, through a fake driver -------------------------------------
class _FakeDriver:
    """Just enough of cuda.bindings.driver for bind(): records what is launched."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

    class CUstream(int):
        pass

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        self.launches, self.maps = [], []
        ns = types.SimpleNamespace
        self.CUlaunchConfig = lambda: ns()
        self.CUlaunchAttribute = lambda: ns(id=None, value=ns(clusterDim=ns(x=0, y=0, z=0)))

    def cuLaunchKernelEx(self, cfg, function, params, extra):
        self.launches.append((cfg, function, params))
        return (0,)

    def cuFuncSetAttribute(self, *a):
        return (0,)


@pytest.fixture
def fake_driver(monkeypatch):
    drv = _FakeDriver()
    monkeypatch.setattr(wl, "_cu", lambda: drv)
    monkeypatch.setattr(wl, "_sm_count", lambda: 132)

    class Map:
        def __init__(self, args):
            self.args = args
            self.buf = ctypes.create_string_buffer(128)

        def getPtr(self):
            return ctypes.addressof(self.buf)

    def encode(dtype, ptr, rows, cols, ld, box_rows, box_cols, swizzle="128B"):
        drv.maps.append(wl.tensor_map_args(dtype, ptr, rows, cols, ld, box_rows, box_cols))
        return Map(drv.maps[-1])

    monkeypatch.setattr(wl, "encode_tensor_map", encode)
    monkeypatch.setattr(wl, "load_function", lambda image, name: 0xF00D)
    return drv


def test_wgmma_kernel_binds_once_and_launches_with_tensor_maps_and_cluster(fake_driver):
    cfg = WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x2_p1_g8")
    k = wl.WgmmaKernel(cfg, b"\x7fELF")
    a, b, c = 0x10000, 0x20000, 0x30000
    for _ in range(3):
        k(4096, 4096, 4096, 1.0, a, 4096, b, 4096, 0.0, c, 4096)
    assert len(fake_driver.launches) == 3 and len(fake_driver.maps) == 2  # bound once
    cfg_, fn, params = fake_driver.launches[0]
    assert fn == 0xF00D
    assert (cfg_.gridDimX, cfg_.blockDimX, cfg_.sharedMemBytes) == (132, 384, cfg.smem_bytes)
    assert cfg_.attrs[0].value.clusterDim.x == 2 and cfg_.numAttrs == 1
    ma, mb = fake_driver.maps
    assert (ma["globalDim"], ma["globalStrides"], ma["boxDim"]) == ([4096, 4096], [8192], [64, 128])
    assert (mb["globalDim"], mb["boxDim"], mb["swizzle"]) == ([4096, 4096], [64, 32],
                                                              "CU_TENSOR_MAP_SWIZZLE_128B")
    # the argument block: two tensor-map pointers, then M N K alpha beta C ldc
    ptrs = (ctypes.c_void_p * 9).from_address(params)
    assert ctypes.c_int32.from_address(ptrs[2]).value == 4096
    assert ctypes.c_float.from_address(ptrs[5]).value == 1.0
    assert ctypes.c_uint64.from_address(ptrs[7]).value == c
    # new scalars: a new binding
    k(4096, 4096, 4096, 0.5, a, 4096, b, 4096, 2.0, c, 4096)
    assert ctypes.c_float.from_address(
        (ctypes.c_void_p * 9).from_address(fake_driver.launches[-1][2])[6]).value == 2.0


def test_misaligned_operands_are_refused_before_any_launch(fake_driver):
    k = wl.WgmmaKernel(DEFAULT_WGMMA, b"\x7fELF")
    with pytest.raises(wl.TmaUnsupported, match="lda=1001 x 2 B = 2002 B"):
        k(64, 1024, 1001, 1.0, 0x10000, 1001, 0x20000, 1024, 0.0, 0x30000, 1024)
    with pytest.raises(wl.TmaUnsupported, match="not 16-byte aligned"):
        k(64, 1024, 1024, 1.0, 0x10002, 1024, 0x20000, 1024, 0.0, 0x30000, 1024)
    assert fake_driver.launches == []


def test_the_runner_loads_the_family_kernel_and_rejects_unsupported_operands(monkeypatch):
    """GpuBenchmark.measure: the family's kernel class, REJECTED (never launched) for
    operands it cannot take, LAUNCH_FAILED for a driver error, gate and timing otherwise."""
    import tuner.bench as tb
    from tuner.gpu import Kernel, kernel_class
    from tuner.outcome import LaunchError, Timing

    assert kernel_class(DEFAULT_WGMMA) is wl.WgmmaKernel
    assert kernel_class(dataclasses.replace(FAMILIES["simt"].default(DType.F32))) is Kernel

    class Err(Exception):
        pass

    drv = types.SimpleNamespace(Error=Err, Context=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(tb, "_drv", lambda: drv)
    calls = []
    behaviour = {}

    def load(config, cubin):
        def kernel(*args):
            calls.append(args)
            if behaviour.get("raise"):
                raise behaviour["raise"]
        return kernel

    monkeypatch.setattr(tb, "load_kernel", load)
    monkeypatch.setattr(tb, "do_bench", lambda fn, flush, target: (fn(), Timing((0.2, 0.2)))[1])
    p = types.SimpleNamespace(k=4096, reset_c=lambda: None, args=lambda: (1, 2, 3),
                              error=lambda rounding=None: 5e-6)
    bench = object.__new__(tb.GpuBenchmark)
    bench.problem, bench.flush, bench.target_ms = p, None, 1.0
    behaviour["raise"] = wl.TmaUnsupported("lda=1001 x 2 B = 2002 B is not a multiple of 16 bytes")
    m = bench.measure(DEFAULT_WGMMA, Path("x.cubin"))
    assert m.outcome is Outcome.REJECTED and "2002 B" in m.message
    behaviour["raise"] = LaunchError("CUDA driver error CUDA_ERROR_INVALID_VALUE")
    m = bench.measure(DEFAULT_WGMMA, Path("x.cubin"))
    assert m.outcome is Outcome.LAUNCH_FAILED and "INVALID_VALUE" in m.message
    behaviour.clear()
    m = bench.measure(DEFAULT_WGMMA, Path("x.cubin"))
    assert m.outcome is Outcome.TIMED and m.error == 5e-6 and len(calls) == 4
    p.error = lambda rounding=None: 1e-3  # over the fp16 tensor-core gate (2e-5)
    assert bench.measure(DEFAULT_WGMMA, Path("x.cubin")).outcome is Outcome.WRONG_RESULT


# ---- the model -------------------------------------------------------------------------
def test_the_bound_is_the_tensor_core_peak_times_tile_and_wave():
    bound, f = bound_tflops(DEFAULT_WGMMA, SHAPE, ARCH)
    assert f["peak"] == round(ARCH.peak_tensor_tflops(DType.F16), 2)
    assert f["tile_eff"] == 1.0 and f["issue_eff"] == 1.0
    assert f["wave_eff"] == round(512 / (132 * 4), 4)  # 32 x 16 tiles of 128 x 256
    assert bound == pytest.approx(ARCH.peak_tensor_tflops(DType.F16) * 512 / 528)
    b2, f2 = bound_tflops(WgmmaConfig(bm=256, bn=128, dtype=DType.BF16), (8192, 8192, 1024), ARCH)
    assert f2["peak"] == f["peak"] and f2["wave_eff"] == round(2048 / (132 * 16), 4)


@pytest.mark.parametrize("cfg,regs", [(DEFAULT_WGMMA, 168),
                                      (WgmmaConfig(bm=128, bn=128, consumers=1), 255)])
def test_one_block_per_sm_by_the_model(cfg, regs):
    res = Resources(registers=regs, smem_static=0, spill_stores=0, spill_loads=0,
                    stack_frame=0, barriers=1, smem_dynamic=cfg.smem_bytes)
    v = judge(cfg, res, SHAPE, ARCH)
    assert not v.hopeless and v.occupancy.blocks_per_sm == 1
    assert v.figures["bound_tflops"] > 0


def test_the_dry_run_models_the_wgmma_default(tmp_path, compile_cache):
    from tuner.dryrun import defaults, dry_run

    assert DEFAULT_WGMMA in defaults(DType.F16, ARCH)
    rep = dry_run(SHAPE, ARCH, trials=3, seed=0, artifacts=tmp_path, jobs=1,
                  cache_dir=compile_cache, dtype=DType.F16)
    row = next(r for r in rep.rows if isinstance(r.config, WgmmaConfig))
    assert row.status == "ok" and row.registers == 168 and row.spill_bytes == 0
    assert row.blocks_per_sm == 1 and row.bound_tflops == round(bound_tflops(
        DEFAULT_WGMMA, SHAPE, ARCH)[0], 2)


# ---- the library: inspect --sass and export -------------------------------------------
@pytest.fixture
def wgmma_lib(tmp_path, compile_cache):
    sys.path.insert(0, str(Path(__file__).parent))
    from _library import build, entry
    from codegen.config import DEFAULT_WMMA

    lib = build(tmp_path / "library", compile_cache, tmp_path / "art")
    for cfg, shape, tf in ((dataclasses.replace(DEFAULT_WGMMA, persistent=0), SHAPE, 696.0),
                           (WgmmaConfig.from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8"),
                            (8192, 8192, 8192), 420.0),
                           (dataclasses.replace(DEFAULT_WMMA, dtype=DType.BF16),
                            (1000, 1000, 1000), 200.0)):
        res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
        assert res.ok, res.error
        cu = next((tmp_path / "art").glob(f"*/{cfg.name}.cu"))
        lib.add(entry(cfg, res, shape, tf, 740.0, dtype=cfg.dtype.short), cu, res.cubin)
    from tuner import load_library

    return load_library(lib.path)


def test_inspect_sass_shows_hgmma(wgmma_lib, capsys):
    from tuner.cli import main
    from tuner.commands import find_cuobjdump

    if find_cuobjdump()[0] is None:
        pytest.skip("no cuobjdump (the dev extra installs nvidia-cuda-cuobjdump)")
    name = dataclasses.replace(DEFAULT_WGMMA, persistent=0).name
    assert main(["inspect", name, "--sass", "--library", str(wgmma_lib.path)]) == 0
    sass = capsys.readouterr().out
    assert "HGMMA.64x256x16.F32" in sass and "UTMALDG" in sass


@pytest.mark.gpu
def test_export_bundle_check_passes_on_the_gpu(wgmma_lib, tmp_path):
    """The bundle's own check program: every entry point (fp32, fp16 and bf16: the wgmma
    launchers building their tensor maps in C++) against cuBLAS on odd shapes, and an lda
    TMA cannot take routed to another kernel or refused."""
    from tuner.cli import main

    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out), "--library", str(wgmma_lib.path)]) == 0
    p = subprocess.run(["make", "-C", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run = subprocess.run([str(out / "gemm_tuned_check")], capture_output=True, text=True)
    print(run.stdout)
    assert run.returncode == 0 and " 0 failed" in run.stdout, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for dtype in ("f16", "bf16"):
        wgmma = [ln for ln in lines if ln.startswith(dtype) and "gemm_wgmma_" in ln]
        assert wgmma and all(ln.rstrip().endswith("ok") for ln in wgmma), lines


def test_export_builds_fp16_and_bf16_entries_and_dispatches_like_python(wgmma_lib, tmp_path):
    from tuner.cli import main

    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out), "--library", str(wgmma_lib.path)]) == 0
    header = (out / "gemm_tuned.h").read_text()
    assert "gemm_tuned_hgemm" in header and "gemm_tuned_bf16gemm" in header
    launcher = (out / "kernels" / f"{dataclasses.replace(DEFAULT_WGMMA, persistent=0).name}.cu").read_text()
    assert "cuTensorMapEncodeTiled" in launcher and "cudaLaunchKernelEx" in launcher
    assert "CU_TENSOR_MAP_SWIZZLE_128B" in launcher
    cluster = (out / "kernels" / "gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8.cu").read_text()
    assert "attr[0].val.clusterDim.x = 2;" in cluster and "cudaDevAttrMultiProcessorCount" in cluster
    assert "-gencode=arch=compute_90a,code=sm_90a" in (out / "Makefile").read_text()
    p = subprocess.run(["make", "-C", str(out), "libgemm_tuned.so"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    nm = subprocess.run(["nm", "-D", str(out / "libgemm_tuned.so")], capture_output=True,
                        text=True).stdout
    for sym in ("gemm_tuned_sgemm", "gemm_tuned_hgemm", "gemm_tuned_bf16gemm"):
        assert sym in nm
    cudart = sorted(Path("/usr/local/cuda/lib64").glob("libcudart.so*"))
    ctypes.CDLL(str(cudart[0]), mode=ctypes.RTLD_GLOBAL)
    so = ctypes.CDLL(str(out / "libgemm_tuned.so"))
    name_for = so.gemm_tuned_kernel_name_for
    name_for.restype = ctypes.c_char_p
    for dtype in (DType.F16, DType.BF16):
        for shape in (SHAPE, (8192, 8192, 8192), (1000, 1000, 1000), (100, 4096, 512)):
            exact = [e["kernel"] for e in wgmma_lib.manifest["entries"]
                     if (e["m"], e["n"], e["k"]) == shape and e["dtype"] == dtype.short]
            ranked = [e["kernel"] for _, e in wgmma_lib.ranked(*shape, dtype, 90, 132)]
            want = exact[0] if exact else ranked[0]
            assert name_for(dtype.short.encode(), *shape, 132, 1).decode() == want
            # operands TMA cannot take: the best kernel of another family, or none
            other = [n for n in ranked if not n.startswith("gemm_wgmma_")]
            got = name_for(dtype.short.encode(), *shape, 132, 0).decode()
            assert got == (other[0] if other else "")
