"""GPU: the wgmma family through the tuner's benchmark (GpuBenchmark: tensor maps and a
cluster launch through its runner, tuner.runtime.runners.TmaRunner, on the problem's
device buffers, the same do_bench, L2 flush and two-reference gate as every family), odd
shapes with alpha, beta and padded leading dimensions, misaligned operands refused, and
the driver's occupancy equal to the model's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from codegen import DType, compile_config
from codegen.families.wgmma import DEFAULT_WGMMA, WgmmaConfig
from _pycuda import pycuda_driver

pytestmark = pytest.mark.gpu

CONFIGS = [
    dataclasses.replace(DEFAULT_WGMMA, persistent=0),                      # the probe's fp16 winner
    WgmmaConfig.from_name("gemm_wgmma_bf16_256x128x64_c2_s4_x1_p0_g8"),    # the bf16 winner
    WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8"),     # persistent
    WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c1_s5_x1_p0_g1"),     # one consumer
    WgmmaConfig.from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p0_g8"),    # cluster (unsearched)
    WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp"),  # ping-pong consumers
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre"),  # tf32 pre-pass
]
#: the TMA-store epilogue (store=1, unsearched until measured here): on the winner, one
#: consumer of 128 rows, ping-pong, the tf32 pre-pass and a cluster
STORE_CONFIGS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts",
    "gemm_wgmma_bf16_128x128x64_c1_s5_x1_p0_g1_ts",
    "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre_ts",
    "gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8_ts")]
ODD = [(1, 1, 1), (17, 33, 9), (127, 129, 257), (4095, 4097, 1023)]


def _pad(x: int, dtype: DType) -> int:
    per = 16 // dtype.size
    return -(-x // per) * per


@pytest.fixture(scope="module")
def compiled(compile_cache):
    out = {}
    for c in CONFIGS + STORE_CONFIGS:
        res = compile_config(c, "sm_90", compile_cache)
        assert res.ok, res.error
        out[c] = res
    return out


@pytest.mark.parametrize("cfg", CONFIGS[:3] + CONFIGS[5:] + STORE_CONFIGS[:1],
                         ids=lambda c: c.name)
def test_the_runner_times_a_wgmma_candidate(cfg, compiled):
    from tuner.bench import GpuBenchmark, tolerance
    from tuner.outcome import Outcome

    bench = GpuBenchmark((4096, 4096, 4096), cfg.dtype, seed=None, target_ms=20)
    m = bench.measure(cfg, compiled[cfg].cubin)
    assert m.outcome is Outcome.TIMED, m.message
    assert m.error <= tolerance(cfg, 4096) and m.error_exact > m.error
    base = bench.baseline()
    ours, blas = m.timing.tflops(bench.flops), base.timing.tflops(bench.flops)
    print(f"\n{cfg.name}: {ours:.1f} TFLOP/s, cuBLAS {blas:.1f} ({ours / blas:.2f}x), "
          f"error {m.error:.2e} (exact {m.error_exact:.2e})")
    assert ours > 0.6 * blas  # the probe measured 0.93-0.94x at this shape


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1], CONFIGS[3], CONFIGS[4], CONFIGS[5],
                                 CONFIGS[6]], ids=lambda c: c.name)
@pytest.mark.parametrize("shape", ODD, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_with_alpha_beta_and_padded_leading_dimensions(cfg, shape, compiled):
    from tuner.bench import GpuBenchmark, Problem, tolerance
    from tuner.outcome import Outcome

    m, n, k = shape
    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem(shape, cfg.dtype, seed=None, alpha=0.5, beta=2.0,
                            lda=_pad(k, cfg.dtype) + 8, ldb=_pad(n, cfg.dtype) + 8, ldc=n + 3)
    bench.flops = bench.problem.flops
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.TIMED, r.message
    assert r.error <= tolerance(cfg, k), (cfg.name, shape, r.error)


@pytest.mark.parametrize("shape", ODD + [(300, 264, 1000)], ids=lambda s: "x".join(map(str, s)))
def test_the_tf32_pre_pass_takes_any_leading_dimension(shape, compiled):
    """Odd leading dimensions (rows of A and B not a multiple of 16 bytes): the pre-pass
    reads them with plain loads, so the kernel runs them, right, instead of refusing."""
    from tuner.bench import GpuBenchmark, Problem, tolerance
    from tuner.outcome import Outcome

    cfg = CONFIGS[6]
    m, n, k = shape
    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem(shape, cfg.dtype, seed=None, alpha=0.5, beta=2.0, lda=k + 1,
                            ldb=n + 1, ldc=n + 3)
    bench.flops = bench.problem.flops
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.TIMED, r.message
    assert r.error <= tolerance(cfg, k), (shape, r.error)


#: odd M and K, N a multiple of 4 floats (TMA stores write a row in 16-byte pieces: an N that
#: is not was seen written past, up to the next 16 bytes, and is refused)
STORE_ODD = [(1, 4, 1), (17, 36, 9), (127, 132, 257), (4095, 4100, 1023)]


@pytest.mark.parametrize("cfg", STORE_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("shape", STORE_ODD, ids=lambda s: "x".join(map(str, s)))
def test_the_tma_store_epilogue_on_odd_shapes(cfg, shape, compiled):
    """C written by TMA stores from shared memory: clipped at odd M and at N, beta read, the
    padding of ldc (a multiple of 4 floats, TMA's rule) never written (poisoned, checked)."""
    from tuner.bench import GpuBenchmark, Problem, tolerance
    from tuner.outcome import Outcome

    m, n, k = shape
    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem(shape, cfg.dtype, seed=None, alpha=0.5, beta=2.0,
                            lda=(k + 1 if cfg.prep else _pad(k, cfg.dtype) + 8),
                            ldb=(n + 1 if cfg.prep else _pad(n, cfg.dtype) + 8),
                            ldc=n + 8)
    bench.flops = bench.problem.flops
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.TIMED, r.message
    assert r.error <= tolerance(cfg, k), (cfg.name, shape, r.error)
    p = bench.problem  # after the check and every timed launch: the padding as it was
    assert np.array_equal(p.c.get()[:, n:], p.c0[:, n:]), "a TMA store wrote past N"


@pytest.mark.parametrize("cfg", STORE_CONFIGS[:2], ids=lambda c: c.name)
def test_the_tma_store_epilogue_refuses_an_n_that_is_not_a_multiple_of_4(cfg, compiled):
    from tuner.bench import GpuBenchmark, Problem
    from tuner.outcome import Outcome

    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem((127, 129, 257), cfg.dtype, seed=None, lda=264, ldb=136, ldc=136)
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.REJECTED and "N=129 is not a multiple of 4" in r.message


def test_the_tma_store_epilogue_refuses_a_c_tma_cannot_describe(compiled):
    from tuner.bench import GpuBenchmark, Problem
    from tuner.outcome import Outcome

    cfg = STORE_CONFIGS[0]
    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem((64, 1024, 1024), cfg.dtype, seed=None, ldc=1027)
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.REJECTED and "ldc=1027 x 4 B = 4108 B" in r.message


def test_misaligned_operands_are_rejected_not_timed(compiled):
    from tuner.bench import GpuBenchmark, Problem
    from tuner.outcome import Outcome

    cfg = CONFIGS[0]
    bench = GpuBenchmark((16, 16, 16), cfg.dtype, seed=None, target_ms=1)
    bench.problem = Problem((64, 1024, 1001), cfg.dtype, seed=None)  # lda = 1001 halves
    r = bench.measure(cfg, compiled[cfg].cubin)
    assert r.outcome is Outcome.REJECTED and "lda=1001 x 2 B = 2002 B" in r.message


def test_the_driver_occupancy_equals_the_model(compiled):
    from codegen.occupancy import occupancy
    from tuner.gpu import device
    from tuner.runtime.runners import TmaRunner, runner_for

    dev = device()
    pycuda = pycuda_driver(dev)
    for cfg, res in compiled.items():
        r = res.resources
        runner = runner_for(cfg, Path(res.cubin).read_bytes())
        assert type(runner) is TmaRunner, cfg.name
        # the runner launches with the dynamic shared memory ptxas was told of
        assert runner.main.smem == r.smem_dynamic == cfg.smem_bytes, cfg.name
        model = occupancy(cfg.threads, r.registers, r.smem, dev.arch).blocks_per_sm
        truth = runner.max_active_blocks(dev)
        assert model == truth == 1, (cfg.name, model, truth)
        attrs = runner.attributes(dev)
        assert attrs["registers"] == r.registers and attrs["local_bytes"] == 0, cfg.name
        if pycuda is not None:  # a second loader reads the same registers
            f = pycuda.module_from_buffer(Path(res.cubin).read_bytes()).get_function(cfg.name)
            assert f.num_regs == r.registers == attrs["registers"], cfg.name
            assert f.local_size_bytes == 0, cfg.name


def test_a_short_fp16_search_times_wgmma_candidates(tmp_path, compile_cache):
    """The search on the GPU, wgmma forced as the family: candidates timed, not failed."""
    from tuner.bench import GpuBenchmark
    from tuner.search import search

    bench = GpuBenchmark((2048, 2048, 2048), DType.F16, seed=None, target_ms=5)
    res = search((2048, 2048, 2048), bench, dtype=DType.F16, trials=24, sampler="random",
                 seed=5, jobs=4, cache_dir=compile_cache, artifacts=tmp_path, timeout=240)
    wg = [r for r in res.records if isinstance(r.config, WgmmaConfig)]
    assert wg, "no wgmma candidate was asked"
    assert all(r.outcome.value in ("timed", "pruned") for r in wg), \
        [(r.config.name, r.outcome.value, r.reason) for r in wg]
    assert any(r.outcome.value == "timed" for r in wg)
