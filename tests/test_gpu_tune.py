"""GPU: a small end-to-end tune lands in the cache, and the next run answers from it."""

import json
import sys
import time

import pytest

from tuner.cli import main

pytestmark = pytest.mark.gpu


def test_small_tune_lands_in_the_cache_and_is_answered_from_it(tmp_path, capsys):
    art = tmp_path / "art"
    argv = ["--shape", "512x512x512", "--trials", "20", "--artifacts", str(art), "--json",
            "--seed", "1"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert not first["from_cache"]
    assert first["stats"]["compiled"] == 20
    assert first["stats"]["timed"] + first["stats"]["pruned"] + first["stats"]["failed"] == 20
    w = first["winner"]
    assert w["error"] <= 1e-5 and w["tflops"] > 0 and w["cublas_tflops"] > 0
    assert (art / "sm_90" / f"{w['name']}.cu").is_file()
    assert 1 <= len(first["top"]) <= 5
    print(f"512^3 tune: {w['name']} {w['tflops']} TFLOP/s, cuBLAS {w['cublas_tflops']}, "
          f"stats {first['stats']}", file=sys.stderr)

    cache = json.loads((art / "cache.json").read_text())
    assert list(cache["entries"]) == [first["key"]]

    t0 = time.monotonic()
    assert main(argv) == 0
    seconds = time.monotonic() - t0
    again = json.loads(capsys.readouterr().out)
    assert again["from_cache"] and again["winner"] == w
    assert seconds < 2.0, seconds
    print(f"answered from the cache in {seconds:.2f} s", file=sys.stderr)

    assert main(argv + ["--force", "--trials", "3"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert not forced["from_cache"] and forced["stats"]["compiled"] == 3


# ---- a program's problem: layout, C's type, bias + activation, batch --------------------
def _library_entry(art, name):
    from tuner.runtime.library import Library

    [e] = [e for e in Library.load(art / "library").manifest["entries"] if e["kernel"] == name]
    return e


def test_a_short_tune_of_an_nt_fp16_problem_with_fp16_c_bias_and_gelu(tmp_path, capsys):
    from codegen.config import config_from_name
    from codegen.families._common import Variant
    from tuner.bench import output_rounding, tolerance

    art = tmp_path / "art"
    assert main(["--shape", "256x384x512", "--dtype", "fp16", "--layout", "nt", "--bias",
                 "out", "--act", "gelu", "--trials", "6", "--artifacts", str(art), "--json",
                 "--seed", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    w = res["winner"]
    cfg = config_from_name(w["name"])
    assert Variant.of(cfg).key == "nt|f16|out|gelu" and w["name"].endswith("_nt_of16_bias_gelu")
    assert (res["layout"], res["out"], res["bias"], res["act"], res["batch"]) == (
        "nt", "f16", "out", "gelu", 1)
    # within the gate: the accumulation's plus one fp16 rounding, and not by a free pass
    assert 0 < w["error"] <= tolerance(cfg, 512) and tolerance(cfg, 512) > output_rounding(
        cfg.out)
    assert "GEMM alone: without the bias and gelu" in res["cublas"] and "fp16 C" in res["cublas"]
    assert res["key"].endswith("|f16|nt|256x384x512|f16|out|gelu|batch 1")
    e = _library_entry(art, w["name"])
    assert (e["layout"], e["out"], e["bias"], e["act"], e["batch"], e["dtype"]) == (
        "nt", "f16", "out", "gelu", 1, "f16")
    print(f"nt fp16-C bias+gelu: {w['name']} {w['tflops']} TFLOP/s, error {w['error']:.3g}, "
          f"cuBLAS {w['cublas_tflops']} ({res['cublas']})", file=sys.stderr)


def test_a_short_tune_of_a_batch_with_a_shared_b(tmp_path, capsys):
    from codegen.config import config_from_name
    from tuner.bench import tolerance

    art = tmp_path / "art"
    assert main(["--shape", "128x256x320", "--dtype", "bf16", "--batch", "6", "--broadcast-b",
                 "--act", "relu", "--trials", "5", "--artifacts", str(art), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    w = res["winner"]
    cfg = config_from_name(w["name"])
    assert cfg.out.short == "bf16" and cfg.act == "relu"
    assert 0 < w["error"] <= tolerance(cfg, 320)
    assert (res["batch"], res["broadcast_b"]) == (6, True)
    assert res["cublas"].startswith("cublasGemmStridedBatchedEx (batch 6, B stride 0)")
    e = _library_entry(art, w["name"])
    assert (e["batch"], e["broadcast_b"], e["out"], e["act"]) == (6, True, "bf16", "relu")
    # the TFLOP/s count the whole batch's work
    assert w["tflops"] == pytest.approx(
        6 * 2 * 128 * 256 * 320 / (w["timing"]["median_ms"] * 1e-3) / 1e12, abs=0.006)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_the_reference_applies_the_epilogue_per_problem_in_the_layout(layout):
    """The float64 reference of a small batch (B shared), against numpy's: each problem's
    operands read in the layout, then alpha, beta * C0, the bias and the activation; the
    error of C rounded once to fp16 is within the rounding; an unwritten C is NaN; and
    cuBLAS's batched call (op flags, stride 0) computes the same GEMM."""
    import math

    import numpy as np

    from codegen.config import DType, Layout
    from codegen.families._common import Variant
    from tuner import bench as tb

    v = Variant(Layout(layout), DType.F16, "f32", "gelu")
    p = tb.Problem((33, 47, 29), DType.F16, seed=3, alpha=0.5, beta=0.25, variant=v, batch=3,
                   broadcast_b=True)
    ref, norm = p.reference(DType.F16)
    got = ref.download(np.empty((3, 33, 47), np.float64))  # packed: batch x M rows of N
    a = tb.round_to(p.a32, DType.F16)[1].astype(np.float64)
    b = tb.round_to(p.b32, DType.F16)[1].astype(np.float64)
    c0 = tb.round_to(p.c0, DType.F16)[1].astype(np.float64)[..., :47]
    erf = np.vectorize(math.erf)
    want = np.empty((3, 33, 47))
    for i in range(3):
        x = 0.5 * tb.logical(a[i], 33, 29, p.a_col) @ tb.logical(b, 29, 47, p.b_col)
        x += 0.25 * c0[i] + p.bias64
        want[i] = 0.5 * x * (1 + erf(x / math.sqrt(2)))
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert norm == pytest.approx(np.linalg.norm(want))
    # C as a kernel would leave it: rounded once to fp16, rows of ldc
    c = np.full((3, 33, p.ldc), np.nan, np.float16)
    c[..., :47] = want.astype(np.float16)
    p.c.set(c)
    assert 0 < p.error() <= tb.output_rounding(DType.F16)
    tb._poison(p.c.buf, DType.F16, 3 * 33 * p.ldc)  # NaN in every element (cuMemsetD16)
    assert math.isnan(p.error())
    c[1, 32, 46] = np.nan  # one element unwritten
    p.c.set(c)
    assert math.isnan(p.error())
    # cuBLAS: the same GEMM, without the bias and the activation
    bench = object.__new__(tb.GpuBenchmark)
    bench.dev, bench.problem, bench.flush, bench.target_ms = tb.device(), p, None, 1.0
    bench.dtype, bench._blas_c = DType.F16, None
    m = bench.baseline()  # fp16 C (cuBLAS writes it from fp16 inputs)
    assert m.outcome.value == "timed"
    assert 0 < m.error <= tb.TOLERANCE[DType.F16] + tb.output_rounding(DType.F16), m.error
