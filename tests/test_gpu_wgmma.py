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


# ---- C's type, the fused epilogue, the layouts and strided batches ---------------------------
# Each case runs the kernel through its runner (TmaRunner) on fresh random inputs stored as
# the layout says (padded leading dimensions, C poisoned with NaN first and its padding
# checked untouched), against a float64 reference of the inputs as the tensor cores take
# them. C in fp16 / bf16 must be within one rounding of its type of the reference, plus the
# accumulation gate (tuner.bench.tolerance): ||max(|C - ref| - u |ref| - tiny, 0)|| / ||ref||
# <= tolerance, u the type's unit roundoff (that is at most (1 + u) times the gate of the
# FP32 value before its rounding).
import math  # noqa: E402

from codegen.families._common import OUT_DTYPES, Layout  # noqa: E402

#: unit roundoff, and half the smallest subnormal, of each type C may be written in
_U = {DType.F32: 2.0 ** -24, DType.F16: 2.0 ** -11, DType.BF16: 2.0 ** -8}
_TINY = {DType.F32: 2.0 ** -150, DType.F16: 2.0 ** -25, DType.BF16: 2.0 ** -134}
_erf = np.vectorize(math.erf)
_ACT = {"none": lambda x: x,
        "relu": lambda x: np.maximum(x, 0.0),
        "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
        "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                        * (x + 0.044715 * x ** 3))),
        "silu": lambda x: x / (1.0 + np.exp(-x))}


def _stored(x32: np.ndarray, d: DType) -> np.ndarray:
    """float32 values as an array of type d (fp16; bf16 as uint16 bits; fp32)."""
    from tuner.bench import round_to

    return round_to(x32, d)[0] if d in (DType.F16, DType.BF16) else x32.astype(np.float32)


def _value(x: np.ndarray, d: DType) -> np.ndarray:
    """An array of type d (as _stored makes them) as float64."""
    if d is DType.BF16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def _poison(shape, d: DType) -> np.ndarray:
    if d is DType.BF16:
        return np.full(shape, 0x7FC0, np.uint16)  # a bf16 NaN
    return np.full(shape, np.nan, np.float16 if d is DType.F16 else np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.itemsize == 2 else np.uint32)


def _check_variant(cfg, cubin: bytes, shape, batch: int = 1, shared: str = "",
                   alpha: float = 0.75, beta: float = 0.5, seed: int = 0) -> float:
    """Run `cfg` on one problem (or `batch` problems, `shared` naming the operands, "a" and
    or "b", that the whole batch shares: stride 0) and check C; returns the error."""
    from tuner.bench import round_to, tolerance
    from tuner.gpu import device
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    dev = device()
    m, n, k = shape
    rng = np.random.default_rng(seed)
    stored = DType.F32 if cfg.fp32_data else cfg.dtype
    per = 16 // stored.size

    def ld_of(cols: int, copied: bool) -> int:  # TMA: rows of whole 16 bytes, plus one more;
        return cols + 1 if copied else -(-cols // per) * per + per  # the pre-pass: any

    a_rows, a_cols = (k, m) if cfg.a_col else (m, k)
    b_rows, b_cols = (n, k) if cfg.b_col else (k, n)
    lda = ld_of(a_cols, getattr(cfg, "copies_a", False))
    ldb = ld_of(b_cols, getattr(cfg, "copies_b", False))
    na, nb = (1 if "a" in shared else batch), (1 if "b" in shared else batch)
    a32 = rng.standard_normal((na, a_rows, lda), dtype=np.float32)
    b32 = rng.standard_normal((nb, b_rows, ldb), dtype=np.float32)
    # what the tensor cores multiply: tf32 rounds (cvt.rna), 3xTF32 takes every bit
    taken = DType.TF32 if cfg.dtype is DType.TF32 else stored
    a = round_to(a32, taken)[1].astype(np.float64)[:, :a_rows, :a_cols]
    b = round_to(b32, taken)[1].astype(np.float64)[:, :b_rows, :b_cols]
    a = a.transpose(0, 2, 1) if cfg.a_col else a  # (na, M, K)
    b = b.transpose(0, 2, 1) if cfg.b_col else b  # (nb, K, N)
    acc = np.matmul(a, b)  # (batch, M, N)

    out = cfg.out
    ldc = -(-n // 8) * 8 + 8 if cfg.store else n + 3  # TMA stores: rows of whole 16 bytes
    c_host = _poison((batch, m, ldc), out)
    c_old = np.zeros((batch, m, n))
    if beta:
        c0 = _stored(rng.standard_normal((batch, m, n), dtype=np.float32), out)
        c_host[:, :, :n] = c0
        c_old = _value(c0, out)
    bias_type = {"none": None, "out": out, "f32": DType.F32}[cfg.bias]
    bias_val, bias_buf = 0.0, None
    if bias_type is not None:
        bias_host = _stored(rng.standard_normal(n, dtype=np.float32), bias_type)
        bias_val, bias_buf = _value(bias_host, bias_type), driver.Buffer.of(bias_host)
    ref = _ACT[cfg.act](alpha * acc + beta * c_old + bias_val)

    bufs = [driver.Buffer.of(_stored(x, stored)) for x in (a32, b32)]
    c_buf = driver.Buffer.of(c_host)
    strides = (0 if "a" in shared else a_rows * lda, 0 if "b" in shared else b_rows * ldb,
               m * ldc)
    run = runner_for(cfg, cubin).bind(dev, m, n, k, lda, ldb, ldc, batch=batch,
                                      strides=strides)
    run(bufs[0].ptr, bufs[1].ptr, c_buf.ptr, alpha, beta, 0,
        bias=bias_buf.ptr if bias_buf is not None else 0)
    driver.synchronize()
    got = c_buf.download(np.empty_like(c_host))
    assert np.array_equal(_bits(got[:, :, n:]), _bits(c_host[:, :, n:])), \
        (cfg.name, shape, "C's padding past N was written")
    g = _value(got[:, :, :n], out)
    assert np.isfinite(g).all(), (cfg.name, shape, batch, shared,
                                  f"{int((~np.isfinite(g)).sum())} elements unwritten or not finite")
    excess = np.maximum(np.abs(g - ref) - 1.001 * _U[out] * np.abs(ref) - _TINY[out], 0.0)
    err = float(np.linalg.norm(excess) / (np.linalg.norm(ref) or 1.0))
    assert err <= tolerance(cfg, k), (cfg.name, shape, batch, shared, err, tolerance(cfg, k))
    return err


_BASE = WgmmaConfig(bm=128, bn=128, stages=4, consumers=2, persistent=1, group=8)
_ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def _epilogue_configs(store: int, acts=_ACTS) -> list[WgmmaConfig]:
    """Each layout x each C type x each of `acts` (with a bias whenever there is an
    activation: of C's type or fp32, in turn), fp16 and bf16 inputs in turn."""
    cfgs = []
    for li, layout in enumerate(Layout):
        for oi, out in enumerate(OUT_DTYPES):
            for ei, act in enumerate(acts):
                bias = "none" if act == "none" else ("out" if out is DType.F32 or ei % 2 else "f32")
                cfgs.append(dataclasses.replace(
                    _BASE, dtype=(DType.F16, DType.BF16)[(li + oi + ei) % 2], layout=layout,
                    out=out, bias=bias, act=act, store=store))
    return cfgs


#: the register epilogue: 4 layouts x 3 C types x {no epilogue, bias + each activation}
REG_VARIANTS = _epilogue_configs(store=0)
#: the TMA-store epilogue: 4 layouts x 3 C types x {no epilogue, bias + gelu}
TS_VARIANTS = _epilogue_configs(store=1, acts=("none", "gelu"))
#: and a 2-byte C staged by stmatrix (store=2): 4 layouts x fp16 / bf16 C x the same two
TSM_VARIANTS = [c for c in _epilogue_configs(store=2, acts=("none", "gelu")) if c.out.size == 2]
#: 3xTF32 pre-split (prep=1, terms=3): the pre-pass writes big and small K-major copies of A
#: and B, so it takes every layout and any leading dimension; each C type and both epilogues
PRESPLIT = WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3")
PRESPLIT_VARIANTS = [
    PRESPLIT,
    WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3_nt_of16_bias_gelu"),
    WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_ts_t3_tn_bias_relu"),
    WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_ts_t3_tt_obf16_biasf32_silu"),
    WgmmaConfig.from_name("gemm_wgmma_f32_128x64x32_c1_s4_x1_p0_g1_pre_t3_tt"),  # one consumer, 128 rows
    # one consumer, 64 rows (64x192, 192 + 192 accumulators, spills with the compensated sum)
    WgmmaConfig.from_name("gemm_wgmma_f32_64x128x32_c1_s3_x1_p1_g8_pre_t3_tn"),
]
#: fp32 data in every layout it takes: the pre-pass (any), tf32 / 3xTF32 in shared memory (NN, NT)
FP32_VARIANTS = PRESPLIT_VARIANTS + [
    dataclasses.replace(CONFIGS[6], layout=Layout.TN, out=DType.F16, bias="f32", act="gelu"),
    dataclasses.replace(CONFIGS[6], layout=Layout.TT, out=DType.BF16, act="relu", store=1),
    dataclasses.replace(CONFIGS[6], layout=Layout.NT),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c2_s4_x1_p1_g8_nt_of16_bias_silu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c2_s4_x2_p0_g8_nt"),
    WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3_nt_obf16_gelut"),
    # tf32 rounded by TMA as it loads (prep=2): NT (no pre-pass), NN (B copied), TT (A
    # copied); round_to's reference is the test of TMA's rounding
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pret_nt"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c2_s4_x1_p0_g8_pret_ts_nt_of16_bias_gelu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pret"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c2_s4_x1_p1_g8_pret_tt_obf16_relu"),
    # tf32 through registers (prep=3): NN computes C^T (B's tile through the registers, C
    # written transposed), TT and NT feed A through them; one and two consumers, 64 and 128
    # of wgmma's rows a consumer, each C type and an epilogue
    WgmmaConfig.from_name("gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_obf16_bias_silu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c1_s4_x1_p1_g8_prer_of16_biasf32_gelu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_tt"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_64x128x32_c1_s5_x1_p0_g1_prer_tt_of16_biasf32_relu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_nt_bias_gelut"),
    # ... with the register operand's rows in pairs (rs_pairs: one 8-byte load a k, NN's
    # transposed epilogue with no lane exchange): NN, NN with 128 rows a consumer and an
    # epilogue, TT with 64
    WgmmaConfig.from_name("gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_rp"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x128x32_c1_s4_x1_p1_g8_prer_rp_obf16_bias_silu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_64x128x32_c1_s5_x1_p0_g1_prer_rp_tt_of16_biasf32_relu"),
    # ... on TN: A (M-major) through the registers, B transposed by the pre-pass; with and
    # without the pairs, a cluster, ping-pong, an epilogue
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_rp_tn"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_prer_tn"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x2_p1_g8_prer_rp_tn_of16_biasf32_gelu"),
    WgmmaConfig.from_name("gemm_wgmma_tf32_64x256x32_c2_s4_x1_p1_g8_pp_prer_rp_tn"),
]
#: batches: the register and TMA-store epilogues, a cluster, ping-pong, the pre-pass
BATCH_VARIANTS = [
    WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_nt_of16_bias_relu"),
    WgmmaConfig.from_name("gemm_wgmma_bf16_128x128x64_c2_s4_x1_p1_g8_ts_tt_obf16_silu"),
    WgmmaConfig.from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p0_g8_tn"),
    WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp_ts_of16"),
    WgmmaConfig.from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_tsm_nt_obf16"),
    FP32_VARIANTS[len(PRESPLIT_VARIANTS)],  # the tf32 pre-pass, TN
    PRESPLIT_VARIANTS[3],  # 3xTF32 pre-split, TT, through TMA stores
    WgmmaConfig.from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pret"),  # TMA's rounding, B's pre-pass (NN)
    WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s5_x2n_p1_g16_pp_ts_tn_of16"),  # A multicast
    WgmmaConfig.from_name("gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer"),  # tf32 C^T, registers
    WgmmaConfig.from_name("gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_prer_rp"),  # ... rows in pairs
]
#: split-K (the last slice of a tile sums them): each layout, C type, one and two consumers,
#: persistent or a block per slice, 2 to 16 slices (more slices than k-tiles: empty ones),
#: a ring of 7
SPLITK_VARIANTS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l_nt_of16",
    "gemm_wgmma_bf16_64x64x64_c1_s4_x1_p0_g1_k16l_obf16_bias_silu",
    "gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_k2l_tn_biasf32_gelu",
    "gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_k8l_tt",
    "gemm_wgmma_f16_64x256x64_c1_s4_x1_p0_g8_k4l_nt_of16_bias_gelut",
    "gemm_wgmma_bf16_128x64x64_c1_s7_x1_p1_g1_k2l_nt_obf16",
)]
#: stream-K: fp32 C from registers with the largest tile, 2-byte C through TMA stores, a
#: 256-row tile with a bias and GELU, one consumer
STREAMK_VARIANTS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_sk",
    "gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_ts_sk_nt_of16",
    "gemm_wgmma_bf16_256x128x64_c2_s4_x1_p1_g8_ts_sk_obf16_bias_gelu",
    "gemm_wgmma_bf16_64x128x64_c1_s6_x1_p1_g8_sk_tt_obf16",
)]
#: odd shapes TMA takes (leading dimensions padded): M = 1, M and N below a tile, prime K
#: ping-pong consumers (searched): tiles of 64 and 128 rows, N 64-256, both stores, a layout
#: and an epilogue each
PINGPONG_VARIANTS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_f16_64x64x64_c2_s6_x1_p1_g1_pp_tn_of16",
    "gemm_wgmma_bf16_64x256x64_c2_s4_x1_p1_g8_pp_ts_nt_obf16_bias_gelu",
    "gemm_wgmma_f16_128x64x64_c2_s5_x1_p1_g16_pp_tt_biasf32_silu",
    "gemm_wgmma_bf16_128x128x64_c2_s4_x1_p1_g8_pp_ts_obf16_relu",
    "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g16_pp_tsm_nt_of16_bias_gelu",
    # tf32 with nothing converted in the loop: the pre-pass (TMA store), TMA's rounding, and
    # registers (NN: each consumer all 64 columns of C^T's tile; TT)
    "gemm_wgmma_tf32_128x128x32_c2_s4_x1_p1_g8_pp_pre_ts_tn_obf16_bias_gelu",
    "gemm_wgmma_tf32_128x128x32_c2_s4_x1_p1_g8_pp_pret_nt",
    "gemm_wgmma_tf32_256x64x32_c2_s4_x1_p1_g8_pp_prer_of16_biasf32_silu",
    "gemm_wgmma_tf32_64x256x32_c2_s4_x1_p1_g8_pp_prer_tt",
    "gemm_wgmma_tf32_256x64x32_c2_s4_x1_p1_g8_pp_prer_rp")]
#: N tiles a K-major B allows that are not multiples of 64 (x @ W.t(): NT, TT): 112 from
#: registers with ping-pong, a cluster (56-row halves of B) and split-K; 96 and 160 through
#: TMA stores; 224 cooperative
K_MAJOR_N_VARIANTS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_bf16_128x112x64_c2_s5_x1_p1_g16_pp_nt_obf16_silu",
    "gemm_wgmma_f16_128x112x64_c2_s5_x2_p1_g8_tt_of16_bias",
    "gemm_wgmma_bf16_64x112x64_c1_s8_x1_p1_g16_k2l_nt_obf16",
    "gemm_wgmma_f16_128x96x64_c2_s6_x1_p1_g16_pp_ts_nt_of16_bias_gelut",
    "gemm_wgmma_bf16_128x160x64_c2_s4_x1_p1_g16_ts_tt_obf16",
    "gemm_wgmma_f16_128x224x64_c2_s4_x1_p1_g8_nt",
)]
#: clusters along N (A multicast: each block loads half of A's rows, K-major or M-major)
#: and ping-pong consumers in a cluster either way, in each layout, both stores and
#: epilogues; tf32 converted in shared memory along N, and tf32's other feeds
CLUSTER_VARIANTS = [WgmmaConfig.from_name(n) for n in (
    "gemm_wgmma_f16_128x128x64_c2_s5_x2_p1_g16_pp_ts_of16",
    "gemm_wgmma_f16_128x128x64_c2_s5_x2n_p1_g16_pp_ts_tn_of16_gelut",
    "gemm_wgmma_bf16_128x128x64_c2_s5_x2n_p1_g16_pp_tsm_nt_obf16_bias_silu",
    "gemm_wgmma_bf16_128x64x64_c2_s6_x2_p1_g8_pp_tt_biasf32_relu",
    "gemm_wgmma_bf16_128x256x64_c2_s4_x2n_p1_g8_ts_nt_obf16",
    "gemm_wgmma_f16_128x256x64_c2_s4_x2n_p0_g1_tt",
    "gemm_wgmma_bf16_128x112x64_c2_s5_x2n_p1_g16_pp_nt_obf16_silu",
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2n_p1_g8_nt_of16",
    # tf32 with nothing converted in the loop, in clusters: C^T through registers (B's
    # MN-major tile multicast along M, A's K-major one along N), TT along N, TMA's rounding
    # (NT: B as stored; NN: the pre-pass's Bt), the pre-pass with ping-pong and TMA stores
    "gemm_wgmma_tf32_256x128x32_c2_s4_x2_p1_g8_prer",
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2n_p1_g8_prer_obf16_bias_silu",
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2n_p1_g8_prer_tt",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x2_p1_g8_pret_nt",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x2_p1_g8_pret",
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2_p1_g8_pp_pre_ts_tn_of16",
    # ... the register operand's rows in pairs (the tf32 default's) along M and N
    "gemm_wgmma_tf32_256x128x32_c2_s4_x2_p1_g8_prer_rp",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x2n_p1_g8_prer_rp_tt",
)]
REG_SHAPES = [(1, 1, 7), (17, 33, 131), (127, 129, 257), (300, 263, 1009)]
#: the TMA store: N a whole number of 16 bytes of C
TS_SHAPES = [(1, 8, 7), (17, 40, 131), (127, 136, 257), (300, 264, 1009)]


@pytest.fixture(scope="module")
def compiled_variants(compile_cache):
    import os

    from codegen import compile_many

    cfgs = list(dict.fromkeys(REG_VARIANTS + TS_VARIANTS + TSM_VARIANTS + FP32_VARIANTS
                              + BATCH_VARIANTS
                              + SPLITK_VARIANTS + STREAMK_VARIANTS + PINGPONG_VARIANTS
                              + K_MAJOR_N_VARIANTS
                              + CLUSTER_VARIANTS))
    out = dict(compile_many(cfgs, "sm_90", jobs=os.cpu_count(), cache_dir=compile_cache))
    failed = {c.name: r.error for c, r in out.items() if not r.ok}
    assert not failed, failed
    return {c: Path(r.cubin).read_bytes() for c, r in out.items()}


@pytest.mark.parametrize("cfg", REG_VARIANTS, ids=lambda c: c.name)
def test_each_layout_c_type_and_epilogue_from_registers(cfg, compiled_variants):
    for i, shape in enumerate(REG_SHAPES):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.0, 0.5)[i % 2], seed=i)


@pytest.mark.parametrize("cfg", TS_VARIANTS + TSM_VARIANTS, ids=lambda c: c.name)
def test_each_layout_c_type_and_epilogue_through_tma_stores(cfg, compiled_variants):
    for i, shape in enumerate(TS_SHAPES):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.5, 0.0)[i % 2], seed=i)


@pytest.mark.parametrize("cfg", FP32_VARIANTS, ids=lambda c: c.name)
def test_fp32_data_in_its_layouts(cfg, compiled_variants):
    for i, shape in enumerate(TS_SHAPES if cfg.store else REG_SHAPES):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.0, 0.5)[i % 2], seed=i)


@pytest.mark.parametrize("cfg", PINGPONG_VARIANTS, ids=lambda c: c.name)
def test_ping_pong_consumers_take_turns_over_many_tiles(cfg, compiled_variants):
    """The odd shapes, then one of more than two tiles per SM (2100 x 2056: 289 tiles of
    128x128 and up on 132 SMs), so each block's consumers alternate over several tiles,
    each waiting for the other's main loop (the order barrier) and storing its own."""
    shapes = (TS_SHAPES if cfg.store else REG_SHAPES) + [(2100, 2056, 131)]
    for i, shape in enumerate(shapes):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.0, 0.5)[i % 2], seed=i)


@pytest.mark.parametrize("cfg", CLUSTER_VARIANTS, ids=lambda c: c.name)
def test_clusters_along_n_and_ping_pong_in_a_cluster(cfg, compiled_variants):
    """The odd shapes (one N tile or one M tile: a cluster's second block computes nothing
    but still multicasts its half), then 2100 x 2056 (an odd count of tile columns or rows
    for every tile here, many tiles a block: ping-pong's turns in both blocks)."""
    shapes = (TS_SHAPES if cfg.store else REG_SHAPES) + [(2100, 2056, 131)]
    for i, shape in enumerate(shapes):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.5, 0.0)[i % 2], seed=40 + i)


@pytest.mark.parametrize("cfg", K_MAJOR_N_VARIANTS, ids=lambda c: c.name)
def test_k_major_b_in_n_tiles_of_any_8_columns(cfg, compiled_variants):
    """Odd shapes (N below, across and past a tile of 96-224 columns), then 2100 x 2056,
    whose last tile column is partial for every such BN, over many tiles per block."""
    shapes = (TS_SHAPES if cfg.store else REG_SHAPES) + [(2100, 2056, 131)]
    for i, shape in enumerate(shapes):
        _check_variant(cfg, compiled_variants[cfg], shape, beta=(0.5, 0.0)[i % 2], seed=20 + i)


@pytest.mark.parametrize("cfg", SPLITK_VARIANTS, ids=lambda c: c.name)
def test_split_k_slices_summed_by_the_last(cfg, compiled_variants):
    """Odd shapes and a deep K (slices of unequal k-tiles, and empty ones where K has fewer
    k-tiles than slices), beta on and off, then a batch of 3 with B shared; launched twice,
    so the tile tickets must have been left at zero; the same bits from both launches."""
    for i, shape in enumerate(REG_SHAPES + [(16, 4096, 4160)]):
        errs = {_check_variant(cfg, compiled_variants[cfg], shape, beta=(0.0, 0.5)[i % 2],
                               seed=i) for _ in range(2)}
        assert len(errs) == 1, (cfg.name, shape, errs)
    _check_variant(cfg, compiled_variants[cfg], (33, 200, 1000), batch=3, shared="b", seed=9)


@pytest.mark.parametrize("cfg", STREAMK_VARIANTS, ids=lambda c: c.name)
def test_stream_k_shares_out_the_last_waves(cfg, compiled_variants):
    """Shapes whose tiles leave a partial last wave on the GPU's SMs (so the kernel shares
    the last wave and the remainder out as runs of k-tiles, tiles cut between blocks), beta
    on and off, a batch; launched twice, so the tile tickets must have been left at zero,
    and the cut tiles summed in k order: the same bits from both launches."""
    for i, shape in enumerate([(2100, 2056, 131), (4096, 4096, 1000), (4000, 4104, 4160)]):
        errs = {_check_variant(cfg, compiled_variants[cfg], shape, beta=(0.0, 0.5)[i % 2],
                               seed=i) for _ in range(2)}
        assert len(errs) == 1, (cfg.name, shape, errs)
    _check_variant(cfg, compiled_variants[cfg], (1000, 1032, 700), batch=3, shared="b", seed=9)


@pytest.mark.parametrize("cfg", BATCH_VARIANTS, ids=lambda c: c.name)
@pytest.mark.parametrize("shared", ["", "a", "b", "ab"])
def test_strided_batches_with_shared_operands(cfg, shared, compiled_variants):
    """Five problems in one launch, each operand batched or shared by all (stride 0: a map
    of rank 2); every problem's C against its own reference."""
    for i, shape in enumerate([(17, 40, 131), (127, 136, 257)]):
        _check_variant(cfg, compiled_variants[cfg], shape, batch=5, shared=shared,
                       beta=(0.5, 0.0)[i], seed=10 + i)


def test_the_variants_run_at_one_block_per_sm_without_local_memory(compiled_variants):
    from tuner.gpu import device
    from tuner.runtime.runners import runner_for

    dev = device()
    for cfg, cubin in compiled_variants.items():
        runner = runner_for(cfg, cubin)
        assert runner.max_active_blocks(dev) == 1, cfg.name
        attrs = runner.attributes(dev)
        assert attrs["local_bytes"] == 0 and attrs["registers"] == cfg.launch_regs, cfg.name


# ---- 3xTF32 pre-split: NaN and Inf as SGEMM's, error no worse than SGEMM's, speed -----------
#: the in-loop 3xTF32 kernel the pre-split one is raced against (the accuracy bench's default)
INLOOP = WgmmaConfig.from_name("gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3")


@pytest.fixture(scope="module")
def compiled_presplit(compile_cache):
    out = {}
    for c in dict.fromkeys([PRESPLIT, INLOOP] + [dataclasses.replace(PRESPLIT, layout=l)
                                                 for l in Layout]):
        res = compile_config(c, "sm_90", compile_cache)
        assert res.ok, res.error
        out[c] = res
    return out


def _run_fp32(cfg, res, a_stored: np.ndarray, b_stored: np.ndarray, m: int, n: int, k: int):
    """C = A * B by `cfg` through its runner, A and B float32 arrays as its layout stores them
    (their rows of any length: the leading dimensions), C poisoned first; float64 C."""
    from tuner.gpu import device
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    dev = device()
    ldc = n + 3
    c_host = np.full((m, ldc), np.nan, np.float32)
    bufs = [driver.Buffer.of(np.ascontiguousarray(x)) for x in (a_stored, b_stored, c_host)]
    run = runner_for(cfg, Path(res.cubin).read_bytes()).bind(
        dev, m, n, k, a_stored.shape[1], b_stored.shape[1], ldc)
    run(bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, 1.0, 0.0, 0)
    driver.synchronize()
    got = bufs[2].download(np.empty_like(c_host))
    return got[:, :n].astype(np.float64)


def _sgemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cuBLAS SGEMM (COMPUTE_32F, no TF32) of row-major float32 A and B, as float64."""
    from tuner.gpu import cublas, device
    from tuner.runtime import driver

    device()
    m, k = a.shape
    n = b.shape[1]
    c = np.full((m, n), np.nan, np.float32)
    bufs = [driver.Buffer.of(np.ascontiguousarray(x)) for x in (a, b, c)]
    cublas().gemm(DType.F32, m, n, k, 1.0, bufs[0].ptr, k, bufs[1].ptr, n, 0.0, bufs[2].ptr, n)
    driver.synchronize()
    return bufs[2].download(c).astype(np.float64)


def _as_stored(x: np.ndarray, col: bool, pad: int = 1) -> np.ndarray:
    """Logical x (rows x cols) as a layout stores it: column-major as x^T row-major, each
    row `pad` floats longer than it needs (a leading dimension TMA could not read)."""
    s = x.T if col else x
    out = np.full((s.shape[0], s.shape[1] + pad), 7.0, np.float32)  # padding never read
    out[:, :s.shape[1]] = s
    return out


def _masks(x: np.ndarray) -> dict:
    return {"nan": np.isnan(x), "+inf": np.isposinf(x), "-inf": np.isneginf(x)}


@pytest.mark.parametrize("layout", list(Layout), ids=lambda l: l.value)
def test_presplit_nan_and_inf_propagate_as_in_sgemm(layout, compiled_presplit):
    """NaN and +-Inf in A and B, an Inf against a zero, infinities of both signs meeting in one
    element, finite products whose sum passes FLT_MAX: C's NaN / +Inf / -Inf elements are
    exactly those of the float64 product rounded to fp32 (SGEMM's, checked too on the
    row-major inputs), the finite ones within fp32's gate."""
    from tuner.bench import tolerance

    cfg = dataclasses.replace(PRESPLIT, layout=layout)
    m, n, k = 127, 129, 257
    rng = np.random.default_rng(24)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    a[5, 7] = np.nan
    a[9, 11], a[20, 3], a[64, 200] = np.inf, -np.inf, np.inf  # row 64: past the first 64-row slice
    b[11, 60] = 0.0                                          # C[9, 60] = Inf * 0 = NaN
    b[30, 40], b[40, 50], b[100, 10] = np.inf, np.nan, -np.inf
    b[3, 128] = np.inf                                       # C[20, 128] = -Inf * Inf = -Inf
    a[20, 30], b[3, 40] = 2.0, 1.0                           # C[20, 40] = -Inf + 2 * Inf = NaN
    a[70, 100:104], b[100:104, 90] = 1.0e19, 1.0e19          # C[70, 90]: 4e38 of 1e38s = +Inf
    a[71, 100:104], b[100:104, 91] = -1.0e19, 1.0e19         # C[71, 91]: -Inf
    with np.errstate(all="ignore"):
        ref = (a.astype(np.float64)[:, :, None] * b.astype(np.float64)[None, :, :]).sum(axis=1)
        ref = ref.astype(np.float32).astype(np.float64)  # past FLT_MAX: +-Inf, as SGEMM's sum
    assert np.isposinf(ref[70, 90]) and np.isneginf(ref[71, 91])
    got = _run_fp32(cfg, compiled_presplit[cfg], _as_stored(a, cfg.a_col), _as_stored(b, cfg.b_col),
                    m, n, k)
    want = _masks(ref)
    assert all(want[w].any() for w in want), "the case lost a kind of special"
    for what, mask in _masks(got).items():
        assert np.array_equal(mask, want[what]), (layout, what, np.argwhere(mask != want[what])[:8])
    if layout is Layout.NN:  # cuBLAS SGEMM of the same inputs: the same pattern
        for what, mask in _masks(_sgemm(a, b)).items():
            assert np.array_equal(mask, want[what]), ("sgemm", what)
    fin = np.isfinite(ref)
    err = np.linalg.norm(got[fin] - ref[fin]) / np.linalg.norm(ref[fin])
    assert err <= tolerance(cfg, k), (layout, err)


#: bench/tf32x3_accuracy.py's five distributions, at sizes a test can afford
def _distribution(name: str, rng, m: int, n: int, k: int):
    if name == "normal":
        return rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if name == "uniform01":
        return rng.random((m, k)), rng.random((k, n))
    if name == "uniform_pm1":
        return rng.random((m, k)) * 2 - 1, rng.random((k, n)) * 2 - 1
    if name == "spread":  # magnitudes log-uniform over 2^-30 .. 2^30, random signs
        def spread(r, c):
            return np.exp2(rng.random((r, c)) * 60 - 30) * np.where(rng.random((r, c)) < 0.5, -1, 1)
        return spread(m, k), spread(k, n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))  # "outliers"
    a[[3, 100, 777 % m, m - 1]] *= 1e6
    b[:, [5, 200 % n, 901 % n, n - 1]] *= 1e6
    return a, b


@pytest.mark.parametrize("dist,shape", [
    ("normal", (1024, 1024, 2048)), ("uniform01", (1024, 1024, 2048)),
    ("uniform_pm1", (512, 512, 16384)), ("spread", (1024, 1024, 2048)),
    ("outliers", (1024, 1024, 2048))], ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x)))
def test_presplit_error_is_no_worse_than_sgemms(dist, shape, compiled_presplit):
    """||C - ref|| / ||ref|| against the float64 product of the fp32 inputs as given: the
    pre-split kernel's at most cuBLAS SGEMM's on the same inputs (the in-loop kernel's is
    printed beside them)."""
    m, n, k = shape
    a, b = (x.astype(np.float32) for x in _distribution(dist, np.random.default_rng(3), m, n, k))
    ref = a.astype(np.float64) @ b.astype(np.float64)

    def rel(c):
        assert np.isfinite(c).all()
        return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))

    pre = rel(_run_fp32(PRESPLIT, compiled_presplit[PRESPLIT], a, b, m, n, k))
    loop = rel(_run_fp32(INLOOP, compiled_presplit[INLOOP], a, b, m, n, k))
    sgemm = rel(_sgemm(a, b))
    print(f"\n{dist} {m}x{n}x{k}: pre-split {pre:.2e}, in-loop {loop:.2e}, SGEMM {sgemm:.2e}")
    assert pre <= sgemm, (dist, pre, sgemm)


def test_presplit_is_timed_beside_the_in_loop_kernel_and_sgemm(compiled_presplit):
    """At 4096^3, through the tuner's benchmark (L2 flushed, the output checked first): the
    pre-split kernel, whose loop only multiplies, beats the in-loop one (measured 1.16-1.19x
    SGEMM); its ratio to SGEMM is printed against issue 24's bar of 2x."""
    from tuner.bench import GpuBenchmark, tolerance
    from tuner.outcome import Outcome

    bench = GpuBenchmark((4096, 4096, 4096), DType.F32X3, seed=None, target_ms=30)
    got = {}
    for cfg in (PRESPLIT, INLOOP):
        r = bench.measure(cfg, compiled_presplit[cfg].cubin)
        assert r.outcome is Outcome.TIMED, (cfg.name, r.message)
        assert r.error <= tolerance(cfg, 4096), (cfg.name, r.error)
        got[cfg] = r.timing.tflops(bench.flops)
    sgemm = bench.baseline().timing.tflops(bench.flops)
    print(f"\n4096^3: pre-split {got[PRESPLIT]:.1f} TFLOP/s ({got[PRESPLIT] / sgemm:.2f}x SGEMM), "
          f"in-loop {got[INLOOP]:.1f} ({got[INLOOP] / sgemm:.2f}x), SGEMM {sgemm:.1f}")
    assert got[PRESPLIT] > got[INLOOP]
