"""GPU: the C++ call path (tuner.runtime.fast) serves repeated torch calls as the Python path
would. A library holds one exact entry of a kernel of each runner form: a plain launch,
split-K with a reduce pass, split-K summed by the last block (tile tickets; the decode and
wgmma families), WMMA, wgmma
with TMA maps, a cluster, the TMA-store epilogue, a bias epilogue, the decode family; and
an empty library (cuBLAS through ATen). The first call of a key takes the Python path and
offers its plan; the later ones, with fresh operands at new addresses, other alpha and
beta and C poisoned, must be served by C++ (the table's hit count) and match a float64
product within the request's gate. Then a side stream, and a CUDA graph of C++ calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gpu_library_variants import _reference  # float64, the bias and activation

from codegen import compile_config
from codegen.config import DType, Layout, config_from_name
from codegen.families._common import Variant
from codegen.families.simt import KernelConfig
from codegen.families.wgmma import DEFAULT_WGMMA
from codegen.families.wmma import DEFAULT_WMMA

pytestmark = pytest.mark.gpu

SHAPE = (520, 392, 264)  # no tile divides it; rows of 16-byte multiples (TMA's rule)
CASES = [
    (KernelConfig(), SHAPE),
    (config_from_name("gemm_simt_f32_128x128x16_r4x8_w16x2_p4_v4_s2_g1_k4"), SHAPE),
    (config_from_name("gemm_simt_f32_16x128x16_r8x4_w2x16_p0_v4_s3_g1_k16"), (16, 1024, 2048)),
    (Variant(Layout.NN, DType.F32, "out", "none").apply(KernelConfig()), SHAPE),
    (DEFAULT_WMMA, SHAPE),
    (DEFAULT_WGMMA, SHAPE),
    (config_from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8"), SHAPE),
    (config_from_name("gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts"), SHAPE),
    (Variant(Layout.NT, DType.F16, "out", "none").apply(DEFAULT_WGMMA), SHAPE),
    (config_from_name("gemm_decode_f16_mma16x32_w8x1_v8_s2_k2l_of16"), (16, 392, 1024)),
    (config_from_name("gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l_nt_of16"), (16, 392, 1024)),
]


@pytest.fixture(scope="module")
def fast_on():
    from tuner.runtime import fast

    assert fast.wait(600), fast.status()
    return fast


def _library(tmp_path: Path, cfg, shape, compile_cache):
    from tuner.runtime import driver
    from tuner.runtime.library import Library

    res = compile_config(cfg, "sm_90", compile_cache)
    assert res.ok, res.error
    g = driver.gpu(0)
    v = Variant.of(cfg)
    lib = Library.create_or_open(tmp_path / "library")
    source = tmp_path / f"{cfg.name}.cu"
    source.write_text(res.source)
    m, n, k = shape
    lib.add(dict(gpu=g.name, cc=g.cc, arch=g.sm, dtype=cfg.dtype.short, layout=v.layout.value,
                 out=v.out.short, bias=v.bias, act=v.act, m=m, n=n, k=k, kernel=cfg.name,
                 tflops=1.0, cublas_tflops=0.5, ratio=2.0,
                 resources=res.resources.to_dict()), source, res.cubin)
    return Library.load(tmp_path / "library")


def _stored(torch, rows, cols, by_columns, dtype):
    if by_columns:
        return torch.randn(cols, rows, device="cuda").to(dtype).t()
    return torch.randn(rows, cols, device="cuda").to(dtype)


def _gate(dtype: DType, out: DType, k: int) -> float:
    from tuner.bench import TOLERANCE, output_rounding

    grow = 1.0 if dtype is DType.F32 else max(1.0, k / 4096)
    return TOLERANCE[dtype] * grow + 2 * output_rounding(out)


def _calls(torch, lib, shape, dtype, out, layout=Layout.NN, bias_kind="none", given=True,
           times=3):
    """`times` calls of one key, each on fresh operands (C poisoned, or None), alpha and
    beta changing from call to call; each checked against float64. Returns the table's
    hits over the calls."""
    m, n, k = shape
    tdt = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    scalars = [(1.0, 0.0), (0.5, 0.25), (1.5, 0.0)] if given else [(1.0, 0.0)] * times
    before = lib.fast.stats()["hits"] if lib.fast is not None else 0
    for i in range(times):
        alpha, beta = scalars[i % len(scalars)]
        a = _stored(torch, m, k, layout.value[0] == "t", tdt[dtype])
        b = _stored(torch, k, n, layout.value[1] == "t", tdt[dtype])
        c0 = torch.randn(m, n, device="cuda").to(tdt[out])
        c = (c0.clone() if beta else torch.full_like(c0, float("nan"))) if given else None
        bias = None if bias_kind == "none" else torch.randn(n, device="cuda").to(
            tdt[out] if bias_kind == "out" else torch.float32)
        got = lib.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias)
        torch.cuda.synchronize()
        ref = _reference(torch, a, b, alpha, beta, c0, bias)
        assert got.dtype == tdt[out] and tuple(got.shape) == (m, n)
        assert given is False or got is c
        assert not got.isnan().any(), f"call {i}: C not fully written"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err <= _gate(dtype, out, k), f"call {i}: error {err:.3g}"
    return lib.fast.stats()["hits"] - before


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0].name)
def test_the_cpp_path_replays_each_runner_form(case, fast_on, tmp_path, compile_cache):
    torch = pytest.importorskip("torch")
    cfg, shape = case
    lib = _library(tmp_path, cfg, shape, compile_cache)
    v = Variant.of(cfg)
    dtype = cfg.dtype
    hits = _calls(torch, lib, shape, dtype, v.out, v.layout, v.bias)
    (plan,) = lib.plans.values()
    assert plan.choice.kernel == cfg.name and plan.choice.rule == "exact"
    assert hits == 2, f"the C++ path served {hits} of the 2 repeated calls ({fast_on.status()})"
    if v.out is dtype:  # C allocated by the call: the C++ path allocates it too
        assert _calls(torch, lib, shape, dtype, v.out, v.layout, v.bias, given=False) == 2


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16], ids=lambda d: d.short)
def test_the_cpp_path_calls_cublas_through_aten(dtype, fast_on, tmp_path):
    """An empty library: cuBLAS through torch for every call, in each form the Python path
    has (mm into C, addmm with alpha and beta, mm allocating C, addmm with the bias)."""
    torch = pytest.importorskip("torch")
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "empty")
    shape = (257, 129, 96)
    assert _calls(torch, lib, shape, dtype, dtype) == 2
    assert _calls(torch, lib, shape, dtype, dtype, given=False) == 2
    assert _calls(torch, lib, shape, dtype, dtype, bias_kind="out", given=False) == 2
    assert _calls(torch, lib, shape, dtype, dtype, Layout.NT) == 2


def test_x_at_w_over_a_batch_runs_as_one_product_of_its_rows(fast_on, tmp_path,
                                                            compile_cache):
    """x (batch x T x K) @ W (K x N) folds x's rows into one matrix, as torch.matmul does: a
    library whose exact entry is at (batch * T) x N x K runs it, C allocated of x's leading
    dimensions or given, and C++ serves the repeated calls; an x whose rows do not fold
    without a copy (each problem stored by columns) stays a batch of problems. Each result
    against float64, C poisoned."""
    torch = pytest.importorskip("torch")
    cfg = KernelConfig()
    lib = _library(tmp_path, cfg, SHAPE, compile_cache)
    m, n, k = SHAPE
    batch = 4
    w = torch.randn(k, n, device="cuda")
    hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
    for given in (False, True, True, False, False):
        x = torch.randn(batch, m // batch, k, device="cuda")
        c = torch.full((batch, m // batch, n), float("nan"), device="cuda") if given else None
        got = lib.gemm(x, w, c)
        torch.cuda.synchronize()
        assert tuple(got.shape) == (batch, m // batch, n) and (c is None or got is c)
        ref = x.double() @ w.double()
        assert ((got.double() - ref).norm() / ref.norm()).item() <= _gate(DType.F32, DType.F32, k)
    assert {(p.choice.kernel, p.problem.m, p.problem.batch) for p in lib.plans.values()} == {
        (cfg.name, m, 1)}
    assert f"{cfg.name} (exact)" in lib.explain(x, w)
    assert lib.fast.stats()["hits"] == hits + 3  # the second call of each key on
    xt = torch.randn(batch, k, m // batch, device="cuda").transpose(1, 2)  # by columns
    got = lib.gemm(xt, w)
    ref = xt.double() @ w.double()
    assert ((got.double() - ref).norm() / ref.norm()).item() <= _gate(DType.F32, DType.F32, k)
    assert tuple(got.shape) == (batch, m // batch, n)
    assert any((p.problem.m, p.problem.batch) == (m // batch, batch)
               for p in lib.plans.values())


def test_several_batch_dimensions_as_torch_matmul_takes_them(fast_on, tmp_path,
                                                             compile_cache):
    """Operands of 4-D (attention's batch x heads x rows x cols), from torch and cupy: x @ W
    folds all of x's rows into the exact entry's product (C++ serving the repeats); a batch
    against a batch of the same dimensions, or of one problem (broadcast), runs as one
    batch of 6; C allocated of the batch dimensions or given (poisoned). A batch whose
    dimensions do not fold into one stride is refused in one line by lib.gemm, and copied
    by torch_ops.matmul, which broadcasts (2 x 3) against (3) as torch.matmul does. Each
    result against float64."""
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    from tuner.runtime import torch_ops
    from tuner.runtime.errors import LibraryError

    cfg = KernelConfig()
    lib = _library(tmp_path, cfg, SHAPE, compile_cache)
    m, n, k = SHAPE
    gate = _gate(DType.F32, DType.F32, k)

    def check(got, a, b, shape):
        torch.cuda.synchronize()
        ref = torch.matmul(a.double(), b.double())
        assert tuple(got.shape) == shape == tuple(ref.shape)
        assert ((torch.as_tensor(got).double() - ref).norm() / ref.norm()).item() <= gate

    w = torch.randn(k, n, device="cuda")
    hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
    for given in (False, False, True, True):
        x = torch.randn(2, 2, m // 4, k, device="cuda")
        c = torch.full((2, 2, m // 4, n), float("nan"), device="cuda") if given else None
        got = lib.gemm(x, w, c)
        assert c is None or got is c
        check(got, x, w, (2, 2, m // 4, n))
    assert lib.fast.stats()["hits"] == hits + 2  # the second call of each key
    assert {(p.choice.kernel, p.problem.m) for p in lib.plans.values()} == {(cfg.name, m)}
    x = torch.randn(2, 3, 40, 72, device="cuda")
    for b in (torch.randn(2, 3, 72, 56, device="cuda"), torch.randn(1, 1, 72, 56, device="cuda"),
              torch.randn(2, 3, 56, 72, device="cuda").transpose(-1, -2)):
        check(lib.gemm(x, b), x, b, (2, 3, 40, 56))
        c = torch.full((2, 3, 40, 56), float("nan"), device="cuda")
        assert lib.gemm(x, b, c) is c
        check(c, x, b, (2, 3, 40, 56))
        xc, bc = cupy.asarray(x), cupy.asarray(b)
        got = lib.gemm(xc, bc)
        assert isinstance(got, cupy.ndarray)
        check(torch.as_tensor(got, device="cuda"), x, b, (2, 3, 40, 56))
    assert any(p.problem.batch == 6 for p in lib.plans.values())
    xp = torch.randn(3, 2, 40, 72, device="cuda").transpose(0, 1)  # batch dimensions swapped
    with pytest.raises(LibraryError, match="batch dimensions do not fold into one") as e:
        lib.gemm(xp, torch.randn(2, 3, 72, 56, device="cuda"))
    assert "\n" not in str(e.value)
    b3 = torch.randn(3, 72, 56, device="cuda")
    check(torch_ops.matmul(xp, b3, library=lib), xp, b3, (2, 3, 40, 56))
    check(torch_ops.matmul(x, b3, library=lib), x, b3, (2, 3, 40, 56))


def test_vectors_as_torch_matmul_takes_them(fast_on, tmp_path, compile_cache):
    """A 1-D operand is one row (A) or one column (B), from torch and cupy, C of
    torch.matmul's shape (given, poisoned, or allocated): v @ W, W @ v, v @ v, v over a
    batch of two dimensions, a strided vector (a row by columns); torch_ops.matmul alike,
    and a vector that requires grad (torch's ops: its gradient). Against float64."""
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    from tuner.runtime import torch_ops

    lib = _library(tmp_path, KernelConfig(), SHAPE, compile_cache)
    m, n, k = SHAPE
    gate = _gate(DType.F32, DType.F32, k)

    def check(got, a, b):
        torch.cuda.synchronize()
        ref = torch.matmul(a.detach().double(), b.detach().double())
        got = torch.as_tensor(got, device="cuda")
        assert tuple(got.shape) == tuple(ref.shape)
        assert ((got.double() - ref).norm() / ref.norm()).item() <= gate

    v, w, big = (torch.randn(k, device="cuda"), torch.randn(k, n, device="cuda"),
                 torch.randn(m, k, device="cuda"))
    batch = torch.randn(2, 3, k, 40, device="cuda")
    strided = torch.randn(2 * k, device="cuda")[::2]
    for a, b in ((v, w), (big, v), (v, v), (v, batch), (strided, w),
                 (batch.transpose(-1, -2), v)):
        check(lib.gemm(a, b), a, b)
        check(lib.gemm(cupy.asarray(a), cupy.asarray(b)), a, b)
        check(torch_ops.matmul(a, b, library=lib), a, b)
        shape = torch.matmul(a, b).shape
        c = torch.full(shape, float("nan"), device="cuda")
        assert lib.gemm(a, b, c) is c
        check(c, a, b)
    g = torch.randn(k, device="cuda", requires_grad=True)
    y = lib.gemm(g, w)
    y.backward(torch.ones_like(y))
    assert ((g.grad.double() - w.double().sum(1)).norm() / w.double().sum(1).norm()).item() \
        <= 1e-5


def test_a_call_that_autograd_records_runs_torchs_ops_and_its_gradients_flow(
        fast_on, tmp_path, compile_cache):
    """With gradients on and an input requiring one, lib.gemm runs torch's own ops, so the
    result has a grad_fn and backward gives x's, W's and the bias's gradients (against
    float64, with the activation after alpha x W + bias), also on the second call of a key
    (the C++ path serves none of them) and after that key was served by the tuned kernel
    under torch.no_grad(); C's type other than the inputs' too. A C passed in is refused
    in one line there, as torch.matmul refuses out=."""
    torch = pytest.importorskip("torch")
    from tuner.runtime.errors import LibraryError

    cfg = KernelConfig()
    lib = _library(tmp_path, cfg, SHAPE, compile_cache)
    m, n, k = SHAPE

    def leaf(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda").to(dtype).requires_grad_()

    def check(x, w, b, alpha, act, out=None):
        y = lib.gemm(x, w, bias=b, alpha=alpha, activation=act, out_dtype=out)
        assert y.grad_fn is not None and y.dtype == (out or x.dtype)
        g = torch.randn_like(y)
        y.backward(g)
        leaves = [t for t in (x, w, b) if t is not None]
        ref = [t.detach().double().requires_grad_() for t in leaves]
        yd = _reference(torch, ref[0], ref[1], alpha, 0.0, None, ref[2] if b is not None
                        else None, act)
        yd.backward(g.double())
        gate = 1e-5 if x.dtype == torch.float32 else 2e-3
        for got, want in ((y, yd), *((t.grad, r.grad) for t, r in zip(leaves, ref))):
            assert ((got.double() - want).norm() / want.norm()).item() <= gate
        for t in leaves:
            t.grad = None

    x, w, b = leaf(m, k), leaf(k, n), leaf(n)
    hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
    for act in (None, None, "gelu", "gelu"):  # each key twice
        check(x, w, b, 0.5, act)
    assert not lib.plans  # nothing planned: torch's ops ran
    with torch.no_grad():  # the tuned kernel, the second call through the C++ path
        for _ in range(2):
            assert lib.gemm(x, w).grad_fn is None
    assert lib.fast.stats()["hits"] == hits + 1
    assert {p.choice.kernel for p in lib.plans.values()} == {cfg.name}
    check(x, w, None, 1.0, None)  # the same key again, recorded: torch's ops, not C++'s
    assert lib.fast.stats()["hits"] == hits + 1
    h = leaf(64, 96, dtype=torch.float16)
    check(h, leaf(96, 80, dtype=torch.float16), leaf(80), 1.0, "silu", out=torch.float32)
    with pytest.raises(LibraryError, match="C is given while autograd records the call") as e:
        lib.gemm(x, w, torch.empty(m, n, device="cuda"))
    assert "\n" not in str(e.value)


def _calls_cublas(report: dict | None, dtype: DType) -> bool:
    """Would the C++ path call cuBLAS itself for a plain product of this type, as torch
    would (fast.blas_report: every condition of fast.cpp's Blas::as_torch and blas_call)?"""
    kind = {DType.F16: "fp16", DType.BF16: "bf16"}.get(dtype)
    return report is not None and report["symbols"] and report["prefers_cublas"] \
        and not report["deterministic"] and not report["tunable_op"] \
        and (kind is None or report[f"{kind}_reduction_default"])


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16], ids=lambda d: d.short)
@pytest.mark.parametrize("shape", [(257, 129, 96), (1000, 1, 1000), (1, 1000, 1000),
                                   (5, 3, 1)], ids=lambda s: "x".join(map(str, s)))
def test_a_plain_product_on_cublas_has_torchs_bits(dtype, shape, fast_on, tmp_path):
    """The C++ path calls cuBLAS itself for a plain product on the torch route: in every
    layout, C given (alpha and beta) or allocated, GEMV shapes and K = 1 included, C is
    what torch.mm / torch.addmm write on the same operands, bit for bit."""
    torch = pytest.importorskip("torch")
    from tuner.runtime.library import Library

    from tuner.runtime import fast

    lib = Library.create_or_open(tmp_path / "empty")
    tdt = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    m, n, k = shape
    report = fast.blas_report()
    direct = _calls_cublas(report, dtype)
    for layout in Layout:
        hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
        calls = fast.blas_calls()
        for alpha, beta, given in ((1.0, 0.0, True), (0.5, 0.25, True), (1.0, 0.0, False)):
            for _ in range(2):
                a = _stored(torch, m, k, layout.value[0] == "t", tdt[dtype])
                b = _stored(torch, k, n, layout.value[1] == "t", tdt[dtype])
                c0 = torch.randn(m, n, device="cuda").to(tdt[dtype])
                c = c0.clone() if given else None
                got = lib.gemm(a, b, c, alpha=alpha, beta=beta)
                want = torch.addmm(c0, a, b, beta=beta, alpha=alpha) if given else a @ b
                assert torch.equal(got, want), (layout, alpha, beta, given)
        # two keys a layout (C given, whatever alpha and beta; C allocated): the first call
        # of each plans, the other four calls are served, by cuBLAS called from C++ where
        # torch would call it so (fast.blas_report), through ATen otherwise
        assert lib.fast.stats()["hits"] == hits + 4, layout
        assert fast.blas_calls() - calls == (4 if direct else 0), (layout, report)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16], ids=lambda d: d.short)
def test_a_batch_on_cublas_takes_the_cpp_path_with_torchs_bits(dtype, fast_on, tmp_path):
    """An empty library: batched products (both operands 3-D, or a 2-D one shared by the
    other's batch), C given (alpha and beta, C poisoned where beta is 0) or allocated (alpha
    1 or not). From each key's second call on C++ serves them, and C is what torch writes on
    the same operands, bit for bit: torch.bmm / baddbmm, but for x @ W (B 2-D), whose rows
    fold into one matrix as torch.matmul folds them: torch.mm / addmm on x's rows."""
    torch = pytest.importorskip("torch")
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "empty")
    tdt = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}[dtype]
    batch, m, n, k = 3, 37, 29, 40
    forms = {"both 3-D": ((batch, m, k), (batch, k, n)), "A shared": ((m, k), (batch, k, n)),
             "B shared": ((batch, m, k), (k, n))}
    for form, (sa, sb) in forms.items():
        hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
        for alpha, beta, given in ((1.0, 0.0, True), (0.5, 0.25, True), (1.0, 0.0, False),
                                   (2.0, 0.0, False)):
            for _ in range(2):
                a = torch.randn(sa, device="cuda").to(tdt)
                b = torch.randn(sb, device="cuda").to(tdt)
                c0 = torch.randn(batch, m, n, device="cuda").to(tdt)
                c = (c0.clone() if beta else torch.full_like(c0, float("nan"))) if given \
                    else None
                got = lib.gemm(a, b, c, alpha=alpha, beta=beta)
                a3, b3 = (x if x.dim() == 3 else x.expand(batch, -1, -1) for x in (a, b))
                if form == "B shared":  # x's rows, as torch.matmul(a, b) runs it
                    rows, c_rows = a.view(-1, k), c0.view(-1, n)
                    want = (torch.mm(rows, b) if alpha == 1.0 and beta == 0.0 else
                            torch.addmm(c_rows, rows, b, beta=beta, alpha=alpha)).view(
                                batch, m, n)
                    assert alpha != 1.0 or beta != 0.0 or torch.equal(want, a @ b)
                else:
                    want = torch.bmm(a3, b3) if alpha == 1.0 and beta == 0.0 else \
                        torch.baddbmm(c0, a3, b3, beta=beta, alpha=alpha)
                assert got.shape == (batch, m, n) and torch.equal(got, want), \
                    (form, alpha, beta, given)
        # two keys a form (C given, whatever alpha and beta; C allocated): the first call of
        # each plans, the other six calls are served
        assert lib.fast.stats()["hits"] == hits + 6, form


def test_a_side_stream_and_a_graph_of_cpp_calls(fast_on, tmp_path, compile_cache):
    torch = pytest.importorskip("torch")
    cfg = KernelConfig()
    lib = _library(tmp_path, cfg, SHAPE, compile_cache)
    m, n, k = SHAPE
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # a key of its own: the Python path once, then C++
        assert _calls(torch, lib, SHAPE, DType.F32, DType.F32) == 2
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    lib.gemm(a, b, c)
    lib.gemm(a, b, c)  # served by C++ on the default stream
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lib.gemm(a, b, c)
    for _ in range(2):
        a.copy_(torch.randn(m, k, device="cuda"))
        c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err = ((c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm())
        assert err.item() <= 1e-5


def test_patched_layers_and_linear_take_the_cpp_path(fast_on, tmp_path, compile_cache):
    """A patched MLP: its first Linear and GELU fused in an exact entry's wgmma kernel, its
    second on cuBLAS through ATen with the bias; then torch_ops.linear on a 3-D x with
    SiLU. From the second call of each on, C++ serves them, each output as torch's."""
    torch = pytest.importorskip("torch")
    from tuner.runtime import torch_ops

    m, n, k = SHAPE
    cfg = Variant(Layout.NT, DType.F16, "out", "gelu").apply(DEFAULT_WGMMA)
    lib = _library(tmp_path, cfg, (m, n, k), compile_cache)
    mlp = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.GELU(),
                              torch.nn.Linear(n, k)).cuda().half()
    patched = torch_ops.patch(__import__("copy").deepcopy(mlp), lib)
    with torch.inference_mode():
        for i in range(3):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
            got, want = patched(x), mlp(x)
            err = ((got.double() - want.double()).norm() / want.double().norm()).item()
            assert err <= 4e-3, f"forward {i}: {err:.3g} from the unpatched MLP"
            if i:
                assert lib.fast.stats()["hits"] - hits == 2, f"forward {i}"
        assert any(p.choice.kernel == cfg.name for p in lib.plans.values())
        W, b = mlp[2].weight, mlp[2].bias
        for i in range(3):
            x = torch.randn(4, 33, n, device="cuda", dtype=torch.float16)
            hits = lib.fast.stats()["hits"]
            got = torch_ops.linear(x, W, b, "silu", library=lib)
            want = torch.nn.functional.silu(torch.nn.functional.linear(x, W, b))
            assert got.shape == want.shape and torch.equal(got, want), f"call {i}"
            if i:
                assert lib.fast.stats()["hits"] - hits == 1, f"call {i}"


@pytest.mark.parametrize("bias,act", [(True, None), (False, None), (False, "silu")])
def test_each_geometry_of_a_linear_takes_the_cpp_path(fast_on, tmp_path, bias, act):
    """One patched nn.Linear (an empty library: cuBLAS through torch), with a bias, without
    one (cuBLAS called by C++ itself), and without one before a SiLU it absorbs, called on
    x of (T, K), then the same rows as (1, T, K) and (2, T/2, K): one plan, three C++ keys.
    From the second call of each geometry on, C++ serves it, whichever geometry came first,
    and its output is torch's, bit for bit."""
    torch = pytest.importorskip("torch")
    from tuner.runtime import fast, torch_ops
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "empty")
    lin = torch.nn.Linear(96, 80, bias=bias)
    if act:
        lin = torch.nn.Sequential(lin, torch.nn.SiLU())
    lin = lin.cuda().half()
    patched = torch_ops.patch(__import__("copy").deepcopy(lin), lib)
    with torch.inference_mode():
        for shape in ((32, 96), (1, 32, 96), (2, 16, 96)):
            for i in range(3):
                x = torch.randn(shape, device="cuda", dtype=torch.float16)
                hits = lib.fast.stats()["hits"] if lib.fast is not None else 0
                calls = fast.blas_calls()
                got, want = patched(x), lin(x)
                assert got.shape == want.shape and torch.equal(got, want), (shape, i)
                if i:
                    assert lib.fast.stats()["hits"] - hits == 1, (shape, i)
                    # without a bias, cuBLAS called from C++ where torch would call it so
                    direct = not bias and _calls_cublas(fast.blas_report(), DType.F16)
                    assert fast.blas_calls() - calls == direct, fast.blas_report()
