"""The wgmma family in the tuner, on the CPU: the search space (grid, TPE round trip),
misaligned problems rejected before compiling, the runner's launch plumbing through a
fake driver, the model's bound and occupancy, the dry run, `inspect --sass` and the
export bundle's fp16/bf16 entries (built with nvcc)."""

from __future__ import annotations

import ctypes
import dataclasses
import re
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
from tuner.model import bound_tflops, judge, shape_reasons
from tuner.outcome import Outcome

ARCH = parse_arch("sm_90")
SHAPE = (4096, 4096, 4096)


# ---- the search space ------------------------------------------------------------------
def test_wgmma_is_a_family_choice_for_16_bit_on_sm90_only():
    from tuner.space import families

    assert FAMILIES["wgmma"].searched
    for d in (DType.F16, DType.BF16):
        assert families(d, ARCH) == {"simt": d, "wmma": d, "wgmma": d, "decode": d}
        assert "wgmma" not in families(d, parse_arch("sm_80"))
    assert "wgmma" not in families(DType.F32, ARCH)


def test_the_grid_holds_searched_wgmma_points_clusters_and_tma_stores_too():
    from tuner.space import valid_configs

    grid = [c for c in valid_configs(ARCH, DType.F16, SHAPE) if isinstance(c, WgmmaConfig)]
    assert len(grid) == 1362  # SEARCH_SPACE's 4608 points and 576 deeper rings of small tiles, less check_wgmma's rejections
    assert {(c.cluster, c.store) for c in grid} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert SEARCH_SPACE["cluster"] == (1, 2) and SEARCH_SPACE["store"] == (0, 1)
    assert {(c.bm, c.bn, c.consumers) for c in grid} >= {(128, 256, 2), (256, 128, 2),
                                                         (128, 128, 1), (64, 64, 1)}
    # ping-pong: two consumers of a persistent block without a cluster, 64 or 128 rows each
    pp = [c for c in grid if c.pingpong]
    assert DEFAULT_WGMMA in grid and len(pp) == 162
    assert {(c.consumers, c.persistent, c.cluster) for c in pp} == {(2, 1, 1)}
    assert {c.bm for c in pp} == {64, 128} and {c.store for c in pp} == {0, 1}
    # an N the TMA store cannot end on (tf32's pre-pass takes any N) has no store=1 point
    odd = [c for c in valid_configs(ARCH, DType.TF32, (4096, 4098, 4096))
           if isinstance(c, WgmmaConfig)]
    assert odd and all(c.store == 0 for c in odd) and all(c.prep for c in odd)


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

    bench = FakeBenchmark(shape=(256, 255, 256), nvcc=False)
    # the sampler's own asks (no model-first batch, which only queues valid configs)
    res = search(bench.shape, bench, dtype=DType.F16, trials=6, sampler="random", seed=3,
                 jobs=1, cache_dir=compile_cache, artifacts=tmp_path, model=False)
    assert not any(isinstance(c, WgmmaConfig) for c in bench.measured)
    reasons = [t.user_attrs.get("reason", "") for t in res.study.trials
               if t.params.get("family") == "wgmma"]
    assert reasons and all("TMA cannot describe the operands: ldb=255" in r for r in reasons)


# ---- the runner's plumbing, through a fake driver -------------------------------------
class _FakeDriver:
    """Just enough of cuda.bindings.driver (what tuner.runtime.driver.api() returns) for a
    TmaRunner: loads, the shared-memory opt-in and launches, recorded."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUlaunchAttributeID:
        CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4

    class CUstream(int):
        pass

    class CUfunction_attribute:
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        self.launches, self.plain_launches = [], []  # cuLaunchKernelEx's, cuLaunchKernel's
        self.maps, self.encoded, self.smem_optin = [], [], []
        ns = types.SimpleNamespace
        self.CUlaunchConfig = lambda: ns()
        self.CUlaunchAttribute = lambda: ns(id=None, value=ns(clusterDim=ns(x=0, y=0, z=0)))

    def cuLibraryLoadData(self, image, *rest):
        return 0, "library"

    def cuLibraryGetKernel(self, library, name):
        return 0, name

    def cuKernelGetFunction(self, kernel):
        return 0, 0xF00D

    def cuFuncSetAttribute(self, function, attr, value):
        self.smem_optin.append((function, attr, value))
        return (0,)

    def cuLaunchKernelEx(self, cfg, function, params, extra):
        self.launches.append((cfg, function, params))
        return (0,)

    def cuLaunchKernel(self, function, *rest):
        self.plain_launches.append((function, rest))
        return (0,)

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_FAKE"


#: GPU 0 as a runner sees it: its index and its SM count (the persistent grid's bound)
_GPU = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))


@pytest.fixture
def fake_driver(monkeypatch):
    from tuner.runtime import driver, tma

    drv = _FakeDriver()
    monkeypatch.setattr(driver, "api", lambda: drv)

    class Map:
        def __init__(self, args):
            self.args = args
            self.buf = ctypes.create_string_buffer(128)

        def getPtr(self):
            return ctypes.addressof(self.buf)

    def encode(args):
        drv.maps.append(args)
        drv.encoded.append(Map(args))
        return drv.encoded[-1]

    monkeypatch.setattr(tma, "encode", encode)
    return drv


def test_wgmma_runner_binds_once_and_launches_with_tensor_maps_and_cluster(fake_driver):
    from tuner.runtime.runners import TmaRunner

    cfg = WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x2_p1_g8")
    r = TmaRunner(cfg, b"\x7fELF")
    run = r.bind(_GPU, 4096, 4096, 4096, 4096, 4096, 4096)
    a, b, c = 0x10000, 0x20000, 0x30000
    for _ in range(3):
        run(a, b, c, 1.0, 0.0, 0)
    assert len(fake_driver.launches) == 3 and len(fake_driver.maps) == 2  # encoded once
    assert fake_driver.plain_launches == []  # a cluster launches with cuLaunchKernelEx
    assert fake_driver.smem_optin == [(0xF00D, 8, cfg.smem_bytes)]  # opted in once
    cfg_, fn, params = fake_driver.launches[0]
    assert fn == 0xF00D
    assert (cfg_.gridDimX, cfg_.blockDimX, cfg_.sharedMemBytes) == (132, 384, cfg.smem_bytes)
    assert cfg_.attrs[0].value.clusterDim.x == 2 and cfg_.numAttrs == 1
    ma, mb = fake_driver.maps
    assert (ma["globalDim"], ma["globalStrides"], ma["boxDim"]) == ([4096, 4096], [8192], [64, 128])
    assert (mb["globalDim"], mb["boxDim"], mb["swizzle"]) == ([4096, 4096], [64, 32],
                                                              "CU_TENSOR_MAP_SWIZZLE_128B")
    assert (ma["globalAddress"], mb["globalAddress"]) == (a, b)
    # the argument block: two tensor-map pointers, then M N K alpha beta C ldc
    ptrs = (ctypes.c_void_p * 9).from_address(params)
    assert (ptrs[0], ptrs[1]) == tuple(tm.getPtr() for tm in fake_driver.encoded)
    assert ctypes.c_int32.from_address(ptrs[2]).value == 4096
    assert ctypes.c_float.from_address(ptrs[5]).value == 1.0
    assert ctypes.c_uint64.from_address(ptrs[7]).value == c
    # new scalars: packed into the launch, the maps kept
    run(a, b, c, 0.5, 2.0, 0)
    last = (ctypes.c_void_p * 9).from_address(fake_driver.launches[-1][2])
    assert ctypes.c_float.from_address(last[5]).value == 0.5
    assert ctypes.c_float.from_address(last[6]).value == 2.0
    assert len(fake_driver.maps) == 2
    # new pointers: their own maps
    run(a + 0x100000, b, c, 1.0, 0.0, 0)
    assert len(fake_driver.maps) == 4 and fake_driver.maps[2]["globalAddress"] == a + 0x100000


def test_misaligned_operands_are_refused_before_any_launch(fake_driver):
    from tuner.runtime.errors import TmaUnsupported
    from tuner.runtime.runners import TmaRunner

    r = TmaRunner(DEFAULT_WGMMA, b"\x7fELF")
    with pytest.raises(TmaUnsupported, match="lda=1001 x 2 B = 2002 B"):
        r.bind(_GPU, 64, 1024, 1001, 1001, 1024, 1024)
    run = r.bind(_GPU, 64, 1024, 1024, 1024, 1024, 1024)
    with pytest.raises(TmaUnsupported, match="not 16-byte aligned"):
        run(0x10002, 0x20000, 0x30000, 1.0, 0.0, 0)
    assert fake_driver.launches == fake_driver.plain_launches == fake_driver.maps == []


def test_the_runner_loads_the_family_kernel_and_rejects_unsupported_operands(monkeypatch,
                                                                              tmp_path):
    """GpuBenchmark.measure: the family's runner class, REJECTED (never launched) for
    operands it cannot take, LAUNCH_FAILED for a driver error, gate and timing otherwise."""
    import tuner.bench as tb
    from tuner.outcome import Timing
    from tuner.runtime import driver
    from tuner.runtime.errors import DriverError, TmaUnsupported
    from tuner.runtime.runners import Runner, TmaRunner, runner_class

    assert runner_class(DEFAULT_WGMMA) is TmaRunner
    assert runner_class(dataclasses.replace(FAMILIES["simt"].default(DType.F32))) is Runner
    assert runner_class(FAMILIES["wmma"].default(DType.F16)) is Runner

    calls, bound = [], []
    behaviour = {}

    class FakeRunner:
        def __init__(self, config, cubin):
            assert config is DEFAULT_WGMMA and cubin == b"\x7fELF"

        def bind(self, g, *problem):
            bound.append((g, problem))
            if behaviour.get("bind"):
                raise behaviour["bind"]

            def run(*args):
                calls.append(args)
                if behaviour.get("run"):
                    raise behaviour["run"]
            return run

    monkeypatch.setattr(tb, "runner_for", FakeRunner)
    monkeypatch.setattr(driver, "synchronize", lambda: None)
    monkeypatch.setattr(tb, "do_bench", lambda fn, flush, target: (fn(), Timing((0.2, 0.2)))[1])
    p = types.SimpleNamespace(m=64, n=1024, k=4096, lda=4096, ldb=1024, ldc=1024,
                              reset_c=lambda: None, run=lambda launch: launch(1, 2, 3, 1.0, 0.0, 0),
                              error=lambda rounding=None: 5e-6)
    bench = object.__new__(tb.GpuBenchmark)
    bench.dev, bench.problem, bench.flush, bench.target_ms = "gpu", p, None, 1.0
    # TMA cannot describe the operands: refused by bind, nothing launched
    behaviour["bind"] = TmaUnsupported("lda=1001 x 2 B = 2002 B is not a multiple of 16 bytes")
    m = bench.measure(DEFAULT_WGMMA, b"\x7fELF")
    assert m.outcome is Outcome.REJECTED and "2002 B" in m.message and calls == []
    assert bound == [("gpu", (64, 1024, 4096, 4096, 1024, 1024))]
    behaviour.clear()
    # or by the launch (a pointer off 16 bytes): refused too, never timed
    behaviour["run"] = TmaUnsupported("A at 0x10002 is not 16-byte aligned (off by 2 B)")
    m = bench.measure(DEFAULT_WGMMA, b"\x7fELF")
    assert m.outcome is Outcome.REJECTED and "not 16-byte aligned" in m.message
    assert len(calls) == 1
    behaviour["run"] = DriverError("cuLaunchKernel(x) failed: CUDA_ERROR_INVALID_VALUE")
    m = bench.measure(DEFAULT_WGMMA, b"\x7fELF")
    assert m.outcome is Outcome.LAUNCH_FAILED and "INVALID_VALUE" in m.message
    assert len(calls) == 2
    behaviour.clear()
    (tmp_path / "x.cubin").write_bytes(b"\x7fELF")  # a cubin's path: its bytes are loaded
    m = bench.measure(DEFAULT_WGMMA, tmp_path / "x.cubin")
    assert m.outcome is Outcome.TIMED and m.error == 5e-6 and len(calls) == 4  # check + time
    assert calls[-1] == (1, 2, 3, 1.0, 0.0, 0)
    p.error = lambda rounding=None: 1e-3  # over the fp16 tensor-core gate (2e-5)
    assert bench.measure(DEFAULT_WGMMA, b"\x7fELF").outcome is Outcome.WRONG_RESULT


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

    # the family's default: its best measured, ping-pong 128x128 with the TMA store
    default = FAMILIES["wgmma"].default(DType.F16)
    assert default.pingpong and default.store and (default.bm, default.bn) == (128, 128)
    assert default in defaults(DType.F16, ARCH)
    rep = dry_run(SHAPE, ARCH, trials=3, seed=0, artifacts=tmp_path, jobs=1,
                  cache_dir=compile_cache, dtype=DType.F16)
    row = next(r for r in rep.rows if isinstance(r.config, WgmmaConfig))
    assert row.config == default
    assert row.status == "ok" and row.registers == 168 and row.spill_bytes == 0
    assert row.blocks_per_sm == 1 and row.bound_tflops == round(bound_tflops(
        default, SHAPE, ARCH)[0], 2)


def test_the_dry_run_leaves_out_a_default_the_shape_cannot_take(tmp_path, compile_cache):
    """At N = 1001 with fp16 C (NT: B's rows are K long, so TMA reads the operands) the
    default's TMA store cannot write C (2002-byte rows): the dry run, like the search's
    first batch, does not offer it; the kernels it compiles can all take the shape."""
    from codegen.families._common import Layout, Variant
    from tuner.dryrun import dry_run
    from tuner.model import shape_reasons

    shape, v = (1000, 1001, 1024), Variant(Layout.NT, DType.F16)
    default = v.apply(FAMILIES["wgmma"].default(DType.F16))
    assert shape_reasons(default, shape, ARCH)  # the TMA store's N rule
    rep = dry_run(shape, ARCH, trials=3, seed=0, artifacts=tmp_path, jobs=1,
                  cache_dir=compile_cache, dtype=DType.F16, variant=v)
    assert len(rep.rows) == 3 and default not in [r.config for r in rep.rows]
    assert not any(shape_reasons(r.config, shape, ARCH) for r in rep.rows)


# ---- the library: inspect --sass and export -------------------------------------------
#: a kernel with the TMA-store epilogue: C written through its own tensor map
TS_NAME = "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts"


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
                            (1000, 1000, 1000), 200.0),
                           (WgmmaConfig.from_name(TS_NAME), (2048, 2048, 2048), 610.0)):
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
    lines = run.stdout.splitlines()
    passed, total = re.fullmatch(r"(\d+) of (\d+) checks passed", lines[-1]).groups()
    assert run.returncode == 0 and passed == total, run.stdout + run.stderr
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
    # the TMA-store kernel's launcher mirrors TmaRunner: C's FP32 map (of rank 3 for a
    # batch), C's rule in tma_ok
    store = (out / "kernels" / f"{TS_NAME}.cu").read_text()
    assert ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, MapKey{C_, M, N, ldc, c_batch, sC}, 64, 32, "
            "CU_TENSOR_MAP_SWIZZLE_128B") in store
    assert "tmA, tmB, tmC, M, N, K, alpha, beta, C, ldc,\n" in store
    assert "&& a16(C, ldc, sC, 4) && N % 4 == 0;" in store
    assert "tmC" not in launcher
    assert "-gencode=arch=compute_90a,code=sm_90a" in (out / "Makefile").read_text()
    p = subprocess.run(["make", "-j2", "-C", str(out), "libgemm_tuned.so"], capture_output=True,
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
