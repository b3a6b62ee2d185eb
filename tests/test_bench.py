"""The timed problem's CPU side: the precision gate for 2-byte C, operands stored in each
layout, what cuBLAS is asked for and how its figure is labelled, and the reference and
error kernels (compiled by nvcc; run on a GPU by test_gpu_tune.py)."""

from pathlib import Path

import numpy as np
import pytest

from codegen.config import DType, KernelConfig, Layout, WmmaConfig
from codegen.families._common import Variant
from tuner.bench import (
    ACT_CODES, TOLERANCE, baseline_label, blas_out, logical, output_rounding,
    reference_kernels_source, round_to, stored_shape, tolerance,
)
from tuner.runtime import driver


def test_output_rounding_is_half_an_ulp_of_cs_type():
    assert output_rounding(DType.F16) == 2.0**-11 == 0.00048828125
    assert output_rounding(DType.BF16) == 2.0**-8 == 0.00390625
    assert output_rounding(DType.F32) == 0.0


def test_the_gate_adds_one_rounding_of_c_to_the_accumulations():
    # CUDA cores: fp32's accumulation gate, whatever the inputs, plus C's rounding
    assert tolerance(KernelConfig(), 4096) == TOLERANCE[DType.F32] == 1e-5
    assert tolerance(KernelConfig(dtype=DType.F16, out=DType.F16), 4096) == 1e-5 + 2.0**-11
    assert tolerance(KernelConfig(out=DType.BF16), 65536) == 1e-5 + 2.0**-8
    # tensor cores: the input type's gate growing with K, plus C's rounding
    assert tolerance(WmmaConfig(), 8192) == pytest.approx(4e-5)


def test_a_tiny_c_is_gated_against_the_smallest_normal_norm():
    """A correctly rounded fp16 C below fp16's normal range (GELU of a negative product:
    1e-10, 3e-6) is off by up to half an absolute step (2^-25), far more than 2^-11 of
    itself; against error_floor's norm that is within one rounding. A C off by a whole
    normal-range ulp of 2^-14 still fails."""
    from tuner.bench import error_floor

    gate = tolerance(KernelConfig(dtype=DType.F16, out=DType.F16), 1)
    for ref in (np.array([1e-10]), np.array([3e-6, -2.5e-7, 4e-5])):
        c = round_to(ref.astype(np.float32), DType.F16)[1].astype(np.float64)
        raw = np.linalg.norm(c - ref) / np.linalg.norm(ref)
        floored = np.linalg.norm(c - ref) / max(np.linalg.norm(ref),
                                                error_floor(DType.F16, ref.size))
        assert raw > gate >= floored
        assert np.linalg.norm(c + 2.0**-14 - ref) / max(
            np.linalg.norm(ref), error_floor(DType.F16, ref.size)) > gate
    assert error_floor(DType.F16, 4) == 2.0**-13
    assert error_floor(DType.F32, 1) == error_floor(DType.BF16, 1) == 2.0**-126


@pytest.mark.parametrize("out", [DType.F16, DType.BF16])
def test_the_gate_passes_one_rounding_and_fails_more(out):
    """An FP32 result within the accumulation gate, rounded once to C's type, meets the
    gate (the rounding's relative error in norm is at most the unit roundoff); one that
    lost a bit more (a second rounding, say a half-precision accumulation's) does not."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((257, 129)) * 30  # float64: a reference C
    acc = (ref * (1 + 0.5e-5 * rng.standard_normal(ref.shape))).astype(np.float32)
    gate = tolerance(KernelConfig(dtype=DType.F16, out=out), 4096)

    def err(c):
        return np.linalg.norm(c - ref) / np.linalg.norm(ref)

    once = round_to(acc, out)[1].astype(np.float64)
    assert err(acc) <= 1e-5 < err(once) <= gate
    assert err(once) > output_rounding(out) / 3  # the rounding is most of the gate's room
    coarse = round_to(acc * np.float32(1 + 2 * output_rounding(out)), out)[1]
    assert err(coarse.astype(np.float64)) > gate


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
def test_operands_are_stored_as_the_layout_says(layout):
    """T: column-major, element (m, k) of A at A[k * lda + m], (k, n) of B at B[n * ldb + k];
    N: row-major, (m, k) at A[m * lda + k]; with padding past the leading dimension."""
    m, n, k = 5, 3, 4
    a_col, b_col = (x == "t" for x in layout.value)
    lda, ldb = (m if a_col else k) + 2, (k if b_col else n) + 1
    a = np.arange(np.prod(stored_shape(m, k, lda, a_col)), dtype=np.float32).reshape(
        stored_shape(m, k, lda, a_col))
    b = np.arange(np.prod(stored_shape(k, n, ldb, b_col)), dtype=np.float32).reshape(
        stored_shape(k, n, ldb, b_col))
    la, lb = logical(a, m, k, a_col), logical(b, k, n, b_col)
    assert la.shape == (m, k) and lb.shape == (k, n)
    for i in range(m):
        for j in range(k):
            assert la[i, j] == a.ravel()[j * lda + i if a_col else i * lda + j]
    for i in range(k):
        for j in range(n):
            assert lb[i, j] == b.ravel()[j * ldb + i if b_col else i * ldb + j]
    # a batch: the same per problem
    batch = np.stack([a, a + 1000])
    assert np.array_equal(logical(batch, m, k, a_col)[1], la + 1000)


def test_what_cublas_is_asked_and_the_label():
    assert blas_out(DType.F16, DType.F16) is DType.F16
    assert blas_out(DType.BF16, DType.BF16) is DType.BF16
    assert blas_out(DType.F16, DType.F32) is DType.F32
    assert blas_out(DType.F16, DType.BF16) is DType.F32  # no fp16 -> bf16 in cuBLAS
    assert blas_out(DType.F32, DType.F16) is DType.F32
    assert blas_out(DType.TF32, DType.BF16) is DType.F32
    assert baseline_label(DType.F32) == "cublasGemmEx, fp32 data, COMPUTE_32F, no TF32, fp32 C"
    assert baseline_label(DType.BF16, Variant(Layout.TT, DType.BF16, "none", "relu"), 4, True) == (
        "cublasGemmStridedBatchedEx (batch 4, B stride 0), bf16 inputs, COMPUTE_32F, "
        "op(A)=T, op(B)=T, bf16 C; GEMM alone: without relu (not fused by cuBLAS)")
    assert baseline_label(DType.F32, Variant(Layout.NN, DType.F16, "out")) == (
        "cublasGemmEx, fp32 data, COMPUTE_32F, no TF32, fp32 C (cuBLAS writes no fp16 C "
        "from these inputs); GEMM alone: without the bias (not fused by cuBLAS)")


def test_the_reference_and_error_kernels_compile(tmp_path):
    """One module: the squared error of C in each of its types, and the reference's
    epilogue in float64 with every activation (run on a GPU by test_gpu_tune.py)."""
    from codegen.compile import compile_source

    src = reference_kernels_source()
    assert set(ACT_CODES) == {"none", "relu", "gelu", "gelu_tanh", "silu"}
    res = compile_source(src, "sm_90", "gemm_tune_epilogue_ref", cache_dir=tmp_path,
                         flags=("-O3", "-Xptxas=-v"))
    assert res.ok, res.error
    for kernel in ("gemm_tune_squared_error_f32", "gemm_tune_squared_error_f16",
                   "gemm_tune_squared_error_bf16", "gemm_tune_epilogue_ref"):
        assert kernel in res.log


def test_the_l2_flush_reads_16_byte_words_four_at_a_time_and_writes_nothing_else(tmp_path):
    """The flush's PTX (driver.L2Flush: the tuner's and a first use's), assembled by ptxas
    for sm_90: its loads are 16 bytes each through the L2 (.cg: STRONG.GPU), four in the
    unrolled loop and one in the remainder's, and its only store is the guarded sink."""
    import subprocess

    from codegen.compile import nvcc_path
    from codegen.sass import disassemble, functions

    ptx = tmp_path / "l2_read.ptx"
    ptx.write_bytes(driver._L2_READ_PTX.rstrip(b"\0"))
    ptxas = Path(nvcc_path()).parent / "ptxas"
    subprocess.run([str(ptxas), "-arch=sm_90", str(ptx), "-o", str(tmp_path / "r.cubin")],
                   check=True)
    ops = [i.opcode for i in functions(disassemble(tmp_path / "r.cubin"))["gemm_tune_l2_read"]]
    loads = [op for op in ops if op.startswith("LDG")]
    assert loads == ["LDG.E.128.STRONG.GPU"] * 5, ops
    assert sum(op.startswith("STG") for op in ops) == 1, ops
