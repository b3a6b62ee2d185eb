"""GPU: every sampled configuration is correct on fresh random data; the runner, cuBLAS
and the occupancy model agree with the driver. Skipped without a GPU (conftest.py)."""

import functools
from pathlib import Path

import numpy as np
import pytest

from _sample import sample_configs
from codegen import DEFAULT_CONFIG, compile_many
from codegen.occupancy import occupancy
from tuner.space import valid_configs
from _pycuda import pycuda_driver

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (3, 5, 7), (127, 129, 257), (4095, 4097, 1023), (64, 64, 64)]


def _runner(cfg, res):
    """The config's runner (tuner.runtime.runners: the one the tuner times and the library
    ships) on its compiled cubin, loaded once per process."""
    return _load_runner(cfg, Path(res.cubin))


@functools.cache
def _load_runner(cfg, cubin: Path):
    from tuner.runtime.runners import runner_for

    return runner_for(cfg, cubin.read_bytes())


@pytest.fixture(scope="module")
def dev():
    from tuner.gpu import device

    return device()


@pytest.fixture(scope="module")
def compiled(dev, compile_cache):
    configs = sample_configs()
    out = dict(compile_many(configs, dev.sm, cache_dir=compile_cache))
    bad = {c.name: r.error for c, r in out.items() if not r.ok}
    assert not bad, bad
    return out


def _check_all(compiled, problem, tol=1e-5):
    from tuner.gpu import device
    from tuner.runtime import driver

    dev, p = device(), problem
    failures, worst = {}, 0.0
    for cfg, res in compiled.items():
        problem.reset_c()  # NaN poison (and C0 where beta reads it)
        problem.run(_runner(cfg, res).bind(dev, p.m, p.n, p.k, p.lda, p.ldb, p.ldc))
        driver.synchronize()
        err = problem.error()
        worst = max(worst, err) if err == err else float("nan")
        if not err <= tol:
            failures[cfg.name] = err
        if problem.ldc > problem.n:  # columns past N must be untouched
            tail = problem.c.get()[:, problem.n:]
            if not np.array_equal(tail, problem.c0[:, problem.n:]):
                failures[cfg.name + " (wrote past N)"] = True
    return failures, worst


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_sampled_config_is_correct(compiled, shape):
    from tuner.bench import Problem

    p = Problem(shape, seed=None)  # fresh random inputs every run
    failures, worst = _check_all(compiled, p)
    print(f"{len(compiled)} configs at {shape}: worst ||C-ref||/||ref|| = {worst:.3g}")
    assert not failures, failures


def test_leading_dimensions_alpha_beta(compiled):
    from tuner.bench import Problem

    p = Problem((100, 70, 50), seed=None, alpha=0.5, beta=2.0, lda=53, ldb=75, ldc=77)
    failures, worst = _check_all(compiled, p)
    print(f"lda=53 ldb=75 ldc=77 alpha=0.5 beta=2: worst {worst:.3g}")
    assert not failures, failures


def test_misaligned_pointers_fall_back_to_scalar(compiled):
    """A base pointer off a 16-byte boundary must not use vector accesses."""
    from tuner.bench import NAN_BITS, Problem
    from tuner.gpu import device
    from tuner.runtime import driver

    dev = device()
    p = Problem((33, 65, 17), seed=None, lda=18, ldb=66, ldc=66)
    # shift every matrix by one float: still valid memory, now only 4-byte aligned
    m, n, k = 33, 64, 16
    a = np.asarray(p.a.get())[:, 1:].astype(np.float64)
    b = np.asarray(p.b.get())[1:, 1:].astype(np.float64)
    ref = a[:, :k] @ b[:k, :n]
    for cfg, res in compiled.items():
        p.c.buf.fill32(NAN_BITS, 33 * 66)
        _runner(cfg, res).bind(dev, m, n, k, 18, 66, 66)(
            p.a.ptr + 4, p.b.ptr + 4 + 66 * 4, p.c.ptr + 4, 1.0, 0.0, 0)
        driver.synchronize()
        c = p.c.get()[:, 1:1 + n].astype(np.float64)
        err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
        assert err <= 1e-5, (cfg.name, err)


def test_runner_reads_back_what_ptxas_reported(compiled, dev):
    """The driver's figures of each loaded kernel (through its runner) are ptxas's; where
    pycuda is installed, a second loader (pycuda's module_from_buffer) reads the same."""
    pycuda = pycuda_driver(dev)
    for cfg, res in list(compiled.items())[:20]:
        attrs = _runner(cfg, res).attributes(dev)
        assert attrs["registers"] == res.resources.registers, cfg.name
        assert attrs["smem_static"] == res.resources.smem_static, cfg.name
        assert attrs["local_bytes"] == res.resources.stack_frame, cfg.name
        if pycuda is not None:
            f = pycuda.module_from_buffer(Path(res.cubin).read_bytes()).get_function(cfg.name)
            assert (f.num_regs, f.shared_size_bytes, f.local_size_bytes) == (
                res.resources.registers, res.resources.smem_static,
                res.resources.stack_frame) == (attrs["registers"], attrs["smem_static"],
                                               attrs["local_bytes"]), cfg.name


def test_device_limits_match_the_table_for_its_arch(dev):
    from codegen import ARCHS

    base = ARCHS[dev.cc]
    a = dev.arch
    assert (a.max_threads_per_sm, a.max_blocks_per_sm, a.regs_per_sm, a.smem_per_sm,
            a.smem_per_block_optin, a.smem_reserved_per_block) == (
        base.max_threads_per_sm, base.max_blocks_per_sm, base.regs_per_sm, base.smem_per_sm,
        base.smem_per_block_optin, base.smem_reserved_per_block)
    print(f"{dev.name}: {a.sm_count} SMs, {a.clock_mhz} MHz, L2 {dev.l2_bytes >> 20} MiB")


def test_occupancy_model_equals_the_driver(dev, compile_cache):
    """The model's blocks/SM equals cuOccupancyMaxActiveBlocksPerMultiprocessor for >= 100
    compiled variants drawn across the space (and the codegen sample)."""
    import random

    pool = list(valid_configs(dev.arch))
    configs = random.Random(7).sample(pool, 110) + sample_configs() + [DEFAULT_CONFIG]
    agree, disagree = 0, []
    for cfg, res in compile_many(configs, dev.sm, cache_dir=compile_cache):
        assert res.ok, res.error
        model = occupancy(cfg.threads, res.resources.registers, res.resources.smem, dev.arch)
        truth = _runner(cfg, res).max_active_blocks(dev)
        if model.blocks_per_sm == truth:
            agree += 1
        else:
            disagree.append((cfg.name, res.resources.registers, res.resources.smem,
                             model.blocks_per_sm, truth))
    print(f"occupancy model vs driver: {agree}/{len(configs)} agree")
    assert not disagree, disagree


def test_cluster_slots_the_model_counts_equal_the_driver(dev, compile_cache):
    """The clusters that run at once, as the tuner's model counts them (the table it measures
    with a probe kernel, ArchLimits.cluster_slots), equal cuOccupancyMaxActiveClusters of
    real split-K kernels summed across clusters of 4 and 8; the table shrinks (a cluster's
    blocks share a GPC) and every row is at least r times the first (the model's bound past
    its rows)."""
    from codegen.families import config_from_name
    from tuner.runtime import driver

    arch = driver.arch_with_clusters(dev)
    rows = arch.cluster_slots_table
    print(f"{dev.name}: clusters of 1-{len(rows[0])} at one block an SM: {rows[0]}")
    assert len(rows) == driver.CLUSTER_ROWS and len(rows[0]) >= 8
    for r, row in enumerate(rows, 1):
        assert row[0] == r * arch.sm_count and list(row) == sorted(row, reverse=True)
        assert all(got >= r * first for got, first in zip(row, rows[0])), r
    names = ["gemm_simt_f32_128x256x16_r16x8_w4x8_p4_v4_s2_g1_k8c_i2",
             "gemm_simt_f32_128x128x16_r8x8_w16x2_p4_v4_s2_g1_k4c_i2"]
    configs = [config_from_name(n) for n in names]
    for cfg, res in compile_many(configs, dev.sm, cache_dir=compile_cache):
        assert res.ok, res.error
        runner = _runner(cfg, res)
        r = runner.max_active_blocks(dev)
        got = runner.max_active_clusters(dev, cfg.split)
        print(f"{cfg.name}: {r} an SM, {got} clusters of {cfg.split} at once")
        assert got == arch.cluster_slots(cfg.split, r), (cfg.name, r, got)


@pytest.mark.parametrize("shape", [(512, 512, 512), (127, 129, 257)])
def test_cublas_baseline_is_fp32_accurate(shape):
    from tuner.bench import GpuBenchmark

    b = GpuBenchmark(shape, seed=None, target_ms=5)
    m = b.baseline()
    assert m.error <= 1e-5 and m.timing.median_ms > 0 and len(m.timing.times_ms) >= 10


def test_measure_times_a_correct_kernel_and_flags_a_wrong_one(compiled, compile_cache):
    from codegen import render
    from codegen.compile import compile_source
    from tuner.bench import GpuBenchmark
    from tuner.outcome import Outcome

    b = GpuBenchmark((256, 256, 256), seed=None, target_ms=5)
    cfg, res = next(iter(compiled.items()))
    good = b.measure(cfg, res.cubin)
    assert good.outcome is Outcome.TIMED and good.error <= 1e-5
    assert good.timing.quantile(0.1) <= good.timing.median_ms <= good.timing.quantile(0.9)
    # A planted bug: the epilogue drops the product for every other row.
    good_src = render(DEFAULT_CONFIG)
    line = "v[s] = a_out * acc[c * VA + i][d * VB + e + s];"
    assert good_src.count(line) == 1, "the planted bug no longer applies: update the test"
    broken = good_src.replace(line, "v[s] = (gm & 1) ? 0.0f : a_out * acc[c * VA + i][d * VB + e + s];")
    bad = compile_source(broken, "sm_90", DEFAULT_CONFIG.name, compile_cache,
                         smem_dynamic=DEFAULT_CONFIG.smem_bytes)
    assert bad.ok
    wrong = b.measure(DEFAULT_CONFIG, bad.cubin)
    assert wrong.outcome is Outcome.WRONG_RESULT and wrong.error > 0.1
