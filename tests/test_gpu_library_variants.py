"""GPU: the GEMMs real programs make, through the library: A and B stored by rows or by
columns (NN, NT, TN, TT), C of fp32, fp16 or bf16, a bias and an activation, strided
batches with a shared operand; torch_ops.linear / matmul (eager, torch.compile, CUDA
graphs) and patch() of a model. Both paths are checked: cuBLAS with the epilogue after it
(no kernel tuned for the variant: torch's own ops for torch callers, gemm-tune's binding
and epilogue kernel for cupy), and tuned SIMT kernels of a few variants in a library
built here. Every output is poisoned first and checked against float64 of the same
inputs, fresh random ones each run."""

import dataclasses
import json

import pytest

from _library import SMALL, entry
from tuner.runtime.manifest import SCHEMA

pytestmark = pytest.mark.gpu

SHAPE = (131, 77, 259)  # odd everywhere: every edge of a tile, unaligned rows
LAYOUTS = ["nn", "nt", "tn", "tt"]
EPILOGUES = [(False, None), (True, "gelu"), (True, "silu"), (False, "relu")]
#: ||C - ref|| / ||ref|| by C's type (16-bit inputs where C is 16-bit, fp32 otherwise)
GATE = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 1.5e-2}

def _kernels():
    """SIMT kernels of a few variants (SIMT builds every layout, C type, bias and
    activation), by what they build."""
    from codegen.config import DType, Layout

    return {
        # x @ W.t() + b, GELU, fp16 throughout: an nn.Linear + nn.GELU in half precision
        "nt_f16_bias_gelu": dataclasses.replace(SMALL, stages=2, dtype=DType.F16,
                                                layout=Layout.NT, out=DType.F16, bias="out",
                                                act="gelu"),
        "nt_f16_silu": dataclasses.replace(SMALL, stages=2, dtype=DType.F16, layout=Layout.NT,
                                           out=DType.F16, bias="out", act="silu"),
        "nt_f16_none": dataclasses.replace(SMALL, stages=2, dtype=DType.F16, layout=Layout.NT,
                                           out=DType.F16, bias="out"),
        # fp32 with a bias and ReLU, row-major: the batched calls' kernel
        "nn_f32_bias_relu": dataclasses.replace(SMALL, bias="out", act="relu"),
        # bf16 inputs by columns, fp32 C, SiLU
        "tt_bf16_of32_silu": dataclasses.replace(SMALL, stages=2, dtype=DType.BF16,
                                                 layout=Layout.TT, act="silu"),
        # fp32 data written as bf16 with an fp32 bias and tanh-GELU
        "tn_f32_obf16_biasf32_gelut": dataclasses.replace(SMALL, layout=Layout.TN,
                                                          out=DType.BF16, bias="f32",
                                                          act="gelu_tanh"),
    }


@pytest.fixture(scope="module")
def kernel_lib(tmp_path_factory, compile_cache):
    """A library of the kernels above, each recorded at 2x cuBLAS: with measuring off the
    estimate picks them at nearby shapes."""
    import torch

    from codegen import compile_config
    from tuner.runtime.library import Library, load_library

    d = tmp_path_factory.mktemp("variants")
    lib = Library.create_or_open(d / "library")
    gpu = torch.cuda.get_device_name()
    for cfg in _kernels().values():
        res = compile_config(cfg, "sm_90", compile_cache, d / "art")
        assert res.ok, res.log[-2000:]
        for shape in ((128, 128, 256), (512, 512, 512)):
            lib.add(entry(cfg, res, shape, 20.0, 10.0, dtype=cfg.dtype.short, gpu=gpu),
                    d / "art" / "sm_90" / f"{cfg.name}.cu", res.cubin)
    lib = load_library(d / "library")
    lib.measure = False
    return lib


@pytest.fixture(scope="module")
def empty_lib(tmp_path_factory):
    """A library with no kernel at all: every call runs cuBLAS and the epilogue after it."""
    from tuner.runtime.library import load_library

    d = tmp_path_factory.mktemp("empty") / "library"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"schema": SCHEMA, "kernels": {}, "entries": []}))
    return load_library(d)


def _stored(torch, rows, cols, by_columns, dtype):
    """A rows x cols matrix of fresh values, stored by rows or by columns (a transposed
    view, no copy)."""
    if by_columns:
        return torch.randn(cols, rows, device="cuda").to(dtype).t()
    return torch.randn(rows, cols, device="cuda").to(dtype)


def _reference(torch, a, b, alpha=1.0, beta=0.0, c0=None, bias=None, act=None):
    ref = alpha * (a.double() @ b.double())
    if beta:
        ref = ref + beta * c0.double()
    if bias is not None:
        ref = ref + bias.double()
    F = torch.nn.functional
    return {None: lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[act](ref)


def _err(got, ref) -> float:
    assert not got.isnan().any(), "C was not fully written"
    return ((got.double() - ref).norm() / ref.norm()).item()


def _ran(lib):
    """The one plan made since lib.plans was cleared: what ran."""
    (plan,) = lib.plans.values()
    return plan


def _call(torch, lib, layout, out, with_bias, act, kind="torch", alpha=1.0, beta=0.0):
    dtype = getattr(torch, out) if out != "float32" else torch.float32
    m, n, k = SHAPE
    a = _stored(torch, m, k, layout[0] == "t", dtype)
    b = _stored(torch, k, n, layout[1] == "t", dtype)
    c0 = torch.randn(m, n, device="cuda").to(dtype)
    c = c0.clone() if beta else torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda").to(dtype) if with_bias else None
    if kind == "cupy":
        import cupy

        A, B, C = (cupy.asarray(x) for x in (a, b, c))  # views keep their strides
        got = lib.gemm(A, B, C, alpha=alpha, beta=beta,
                       bias=None if bias is None else cupy.asarray(bias), activation=act)
        assert got is C
        torch.cuda.synchronize()
    else:
        assert lib.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=act) is c
    return _err(c, _reference(torch, a, b, alpha, beta, c0, bias, act))


@pytest.mark.parametrize("with_bias,act", EPILOGUES, ids=lambda x: str(x))
@pytest.mark.parametrize("out", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cublas_and_torch_compute_every_variant(empty_lib, layout, out, with_bias, act):
    """No kernel: torch callers on torch's stream get torch's matmul/addmm and the
    activation after it; the 16-bit ones of the inputs' type."""
    import torch

    empty_lib.plans.clear()
    err = _call(torch, empty_lib, layout, out, with_bias, act, alpha=0.5, beta=2.0)
    assert err <= GATE[out], (layout, out, with_bias, act, err)
    plan = _ran(empty_lib)
    assert plan.choice.kernel is None and plan.torch_run is not None


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_relu_and_tanh_gelu_with_a_bias_on_cublas_are_one_cublaslt_call(empty_lib, dtype, act):
    """No kernel: ReLU and GELU(tanh) with a bias of C's type run in cuBLASLt's epilogue
    (torch._addmm_activation), with no elementwise kernel of torch's after the GEMM, through
    lib.gemm (C allocated), torch_ops.linear on 2-D and 3-D x and a patched Linear + the
    activation module, on the Python path (first call) and the C++ path (the calls after);
    against float64. At one row torch itself runs addmm and the activation (cuBLASLt takes no
    single-row problem): still right."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tuner.runtime import fast, torch_ops

    assert fast.wait(600), fast.status()
    dt = getattr(torch, dtype)
    torch_act = torch.nn.ReLU() if act == "relu" else torch.nn.GELU(approximate="tanh")
    n, k = 77, 259
    lin = torch.nn.Linear(k, n).cuda().to(dt)
    W, b = lin.weight.detach(), lin.bias.detach()
    patched = torch_ops.patch(torch.nn.Sequential(lin, torch_act), empty_lib)

    def torch_kernels(fn):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = fn()
            torch.cuda.synchronize()
        return y, [e.name for e in prof.events()
                   if e.device_type.name == "CUDA" and "at::native" in e.name]

    with torch.inference_mode():
        for rows in ((131,), (1,), (2, 33)):
            x = torch.randn(*rows, k, device="cuda", dtype=dt)
            ref = _reference(torch, x.reshape(-1, k), W.t(), bias=b, act=act).view(*rows, n)
            calls = {"linear": lambda: torch_ops.linear(x, W, b, act, library=empty_lib),
                     "patched": lambda: patched(x)}
            if len(rows) == 1:
                calls["gemm"] = lambda: empty_lib.gemm(x, W.t(), bias=b, activation=act)
            for name, fn in calls.items():
                for i in range(3):  # the Python path, then C++ (lib.gemm: Python)
                    torch.full((*rows, n), float("nan"), device="cuda", dtype=dt)
                    hits = empty_lib.fast.stats()["hits"] if empty_lib.fast is not None else 0
                    y, extra = torch_kernels(fn)
                    if i and name != "gemm":  # served by C++ from the second call on
                        assert empty_lib.fast.stats()["hits"] - hits == 1, (name, rows, i)
                    assert y.shape == ref.shape and y.dtype == dt, (name, rows)
                    assert _err(y, ref) <= GATE[dtype], (name, rows, i, _err(y, ref))
                    if rows[0] > 1 or len(rows) > 1:
                        assert extra == [], (name, rows, i, extra)
    assert all(p.torch_run is not None for p in empty_lib.plans.values())


@pytest.mark.parametrize("with_bias,act", EPILOGUES, ids=lambda x: str(x))
@pytest.mark.parametrize("out", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["nn", "nt", "tt"])
def test_cublas_and_the_epilogue_kernel_for_cupy(empty_lib, layout, out, with_bias, act):
    """No kernel, no torch: gemm-tune's cuBLAS binding, and its epilogue kernel where there
    is a bias or an activation."""
    pytest.importorskip("cupy")
    import torch

    empty_lib.plans.clear()
    err = _call(torch, empty_lib, layout, out, with_bias, act, kind="cupy", alpha=0.5,
                beta=2.0)
    assert err <= GATE[out], (layout, out, with_bias, act, err)
    assert _ran(empty_lib).torch_run is None


def test_an_output_type_cublas_cannot_write(empty_lib):
    """fp16 data into fp32 C with a bias, fp32 data into bf16 C: cuBLAS writes fp32, the
    epilogue kernel rounds once (torch callers too: torch cannot write these)."""
    import torch

    m, n, k = SHAPE
    a, b = torch.randn(m, k, device="cuda").half(), torch.randn(n, k, device="cuda").half().t()
    bias = torch.randn(n, device="cuda")
    c = empty_lib.gemm(a, b, out_dtype=torch.float32, bias=bias, activation="gelu")
    assert c.dtype == torch.float32
    assert _err(c, _reference(torch, a, b, bias=bias, act="gelu")) <= 1e-5
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = empty_lib.gemm(a, b, out_dtype="bfloat16", bias=bias.bfloat16(), activation="silu")
    assert c.dtype == torch.bfloat16
    assert _err(c, _reference(torch, a, b, bias=bias.bfloat16(), act="silu")) <= GATE["bfloat16"]


@pytest.mark.parametrize("name", list(_kernels()))
def test_tuned_kernels_serve_their_variant(kernel_lib, name):
    import torch

    cfg = _kernels()[name]
    layout, out = cfg.layout.value, {"f32": "float32", "f16": "float16",
                                     "bf16": "bfloat16"}[cfg.out.short]
    data = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[cfg.dtype.short]
    m, n, k = SHAPE
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        a = _stored(torch, m, k, layout[0] == "t", data)
        b = _stored(torch, k, n, layout[1] == "t", data)
        c0 = torch.randn(m, n, device="cuda").to(getattr(torch, out))
        c = c0.clone() if beta else torch.full_like(c0, float("nan"))
        bias = None
        if cfg.bias != "none":
            bias = torch.randn(n, device="cuda").to(c.dtype if cfg.bias == "out"
                                                    else torch.float32)
        act = None if cfg.act == "none" else cfg.act
        kernel_lib.plans.clear()
        kernel_lib.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=act)
        assert _ran(kernel_lib).choice.kernel == cfg.name, kernel_lib.explain(
            m, n, k, cfg.dtype, layout=layout, out_dtype=cfg.out, bias=cfg.bias,
            activation=act)
        gate = GATE["bfloat16" if "bf16" in (cfg.dtype.short, cfg.out.short) else
                    "float16" if "f16" in (cfg.dtype.short, cfg.out.short) else "float32"]
        err = _err(c, _reference(torch, a, b, alpha, beta, c0, bias, act))
        assert err <= gate, (name, alpha, beta, err)


@pytest.mark.parametrize("path", ["kernel", "cublas"])
def test_batches_with_a_shared_operand(kernel_lib, empty_lib, path):
    """torch.bmm / baddbmm / 3-D matmul shapes: a batch times one matrix (2-D, expanded,
    or a batch of 1), and one matrix times a batch; C (batch, M, N)."""
    import torch

    lib = kernel_lib if path == "kernel" else empty_lib
    m, n, k = SHAPE
    batch = 5
    a3 = torch.randn(batch, m, k, device="cuda")
    b2 = torch.randn(k, n, device="cuda")
    bias = torch.randn(n, device="cuda")
    for A, B in ((a3, b2), (a3, b2.expand(batch, k, n)), (a3, b2.unsqueeze(0)),
                 (a3[0], torch.randn(batch, k, n, device="cuda")),
                 (a3, torch.randn(batch, n, k, device="cuda").transpose(1, 2))):
        c = torch.full((batch, m, n), float("nan"), device="cuda")
        lib.plans.clear()
        lib.gemm(A, B, c, bias=bias, activation="relu")
        ref = _reference(torch, A.expand(batch, m, k), B.expand(batch, k, n), bias=bias,
                         act="relu")
        assert _err(c, ref) <= 1e-5, (A.shape, B.shape, B.stride())
        if path == "kernel" and B.stride()[-1] == 1:  # the kernel is NN
            assert _ran(lib).choice.kernel == _kernels()["nn_f32_bias_relu"].name
        # allocated: (batch, M, N), as torch.matmul returns
        c2 = lib.gemm(A, B, bias=bias, activation="relu")
        assert c2.shape == (batch, m, n) and _err(c2, ref) <= 1e-5


def test_linear_on_a_3d_input_eager_compiled_and_captured(kernel_lib, empty_lib):
    import torch

    from tuner.runtime import torch_ops

    m, n, k = SHAPE
    for lib in (kernel_lib, empty_lib):
        key = torch_ops.library_key(lib)
        x = torch.randn(3, m, k, device="cuda").half()
        w = torch.randn(n, k, device="cuda").half()  # as nn.Linear keeps it
        b = torch.randn(n, device="cuda").half()
        ref = _reference(torch, x.reshape(-1, k), w.t(), bias=b, act="gelu").view(3, m, n)
        lib.plans.clear()
        y = torch_ops.linear(x, w, b, "gelu", library=lib)
        assert y.shape == (3, m, n) and y.dtype == torch.float16
        assert _err(y, ref) <= GATE["float16"]
        if lib is kernel_lib:
            assert _ran(lib).choice.kernel == _kernels()["nt_f16_bias_gelu"].name
        # a non-contiguous x whose rows cannot be one matrix: run as a batch
        xt = torch.randn(m, 3, k, device="cuda").half().transpose(0, 1)
        yt = torch_ops.linear(xt, w, b, "gelu", library=key)
        reft = _reference(torch, xt.reshape(-1, k), w.t(), bias=b, act="gelu").view(3, m, n)
        assert yt.shape == (3, m, n) and _err(yt, reft) <= GATE["float16"]

        def f(x):
            return torch_ops.linear(x, w, b, "gelu", library=key) * 2.0

        compiled = torch.compile(f, fullgraph=True)
        assert _err(compiled(x), 2.0 * ref) <= GATE["float16"]
        # CUDA graph: captured once, replayed on new values
        static = x.clone()
        f(static)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = f(static)
        for _ in range(2):
            static.copy_(torch.randn(3, m, k, device="cuda").half())
            g.replay()
            torch.cuda.synchronize()
            want = _reference(torch, static.reshape(-1, k), w.t(), bias=b, act="gelu")
            assert _err(out, 2.0 * want.view(3, m, n)) <= GATE["float16"]


def test_a_layers_parameters_take_torchs_route_to_cublas(empty_lib):
    """nn.Linear's weight and bias are nn.Parameters: a call with them is a torch caller's
    (cuBLAS through torch's addmm, the bias fused), as with plain tensors, whether through
    lib.gemm, torch_ops.linear or a patched layer; before, a Parameter bias sent the call
    through gemm-tune's binding and a separate epilogue pass (decisions measured against
    that slower cuBLAS)."""
    import torch

    from tuner.runtime import torch_ops

    m, n, k = SHAPE
    lin = torch.nn.Linear(k, n, device="cuda", dtype=torch.float16)
    x = torch.randn(m, k, device="cuda").half()
    ref = _reference(torch, x, lin.weight.t(), bias=lin.bias)
    with torch.inference_mode():
        for call in (lambda: empty_lib.gemm(x, lin.weight.t(), bias=lin.bias),
                     lambda: torch_ops.linear(x, lin.weight, lin.bias, library=empty_lib),
                     lambda: torch_ops.patch(lin, empty_lib)(x)):
            empty_lib.plans.clear()
            y = call()
            assert y.dtype == torch.float16 and _err(y, ref) <= GATE["float16"]
            assert _ran(empty_lib).problem.route == "torch"
    torch_ops.unpatch(lin)


def test_matmul_2d_and_batched(kernel_lib):
    import torch

    from tuner.runtime import torch_ops

    m, n, k = SHAPE
    a, b = torch.randn(4, m, k, device="cuda"), torch.randn(k, n, device="cuda")
    y = torch_ops.matmul(a, b, library=kernel_lib)  # folded into one 4M x N x K GEMM
    assert y.shape == (4, m, n) and _err(y, a.double() @ b.double()) <= 1e-5
    bb = torch.randn(4, k, n, device="cuda")
    y = torch_ops.matmul(a[1], bb, library=kernel_lib)
    assert y.shape == (4, m, n) and _err(y, a[1].double() @ bb.double()) <= 1e-5
    h = torch.randn(m, k, device="cuda").half()
    y = torch_ops.matmul(h, torch.randn(n, k, device="cuda").half().t(), library=kernel_lib,
                         out_dtype=torch.float32)
    assert y.dtype == torch.float32


def test_patch_an_mlp_equals_the_unpatched_model(kernel_lib, empty_lib):
    import torch

    from tuner.runtime import torch_ops

    nn = torch.nn
    m, n, k = SHAPE
    for lib in (kernel_lib, empty_lib):
        mlp = nn.Sequential(nn.Linear(k, n), nn.GELU(), nn.Linear(n, n), nn.SiLU(),
                            nn.Linear(n, 33)).cuda().half()
        x = torch.randn(2, m, k, device="cuda").half()
        with torch.inference_mode():
            want = mlp(x)
            torch_ops.patch(mlp, lib)
            lib.plans.clear()
            got = mlp(x)
        assert {p.problem.variant.act for p in lib.plans.values()} == {"gelu", "silu", "none"}
        assert _err(got, want.double()) <= GATE["float16"]
        if lib is kernel_lib:  # the first two layers' variants have kernels
            ran = {p.problem.variant.act: p.choice.kernel for p in lib.plans.values()}
            assert ran["gelu"] == _kernels()["nt_f16_bias_gelu"].name
            assert ran["silu"] == _kernels()["nt_f16_silu"].name
        # autograd recording the call: torch's own layers (the ops have no backward)
        lib.plans.clear()
        y = mlp(x)
        assert y.requires_grad and not lib.plans
        y.float().sum().backward()
        torch_ops.unpatch(mlp)
        with torch.inference_mode():
            again = mlp(x)
        assert torch.equal(again, want)


def test_a_patched_layer_follows_its_weight_and_is_recorded(kernel_lib, empty_lib, tmp_path):
    """A patched nn.Linear keeps its weight's view and its call keys between calls
    (tuner.runtime.call.torch_linear): it still computes with a weight whose storage was
    replaced (W.data = ...), written in place, or strided (copied each call, never kept),
    on a 3-D x with no view of it, and a recording counts its calls."""
    import torch

    from tuner.runtime import torch_ops

    m, n, k = SHAPE
    for name, lib in (("kernels", kernel_lib), ("cublas", empty_lib)):
        lin = torch_ops.patch(torch.nn.Linear(k, n, device="cuda", dtype=torch.float16), lib)

        def check():
            x = torch.randn(m, k, device="cuda").half()
            want = _reference(torch, x, lin.weight.t(), bias=lin.bias)
            assert _err(lin(x), want) <= GATE["float16"], name

        with torch.inference_mode():
            check()
            check()
            lin.weight.data = torch.randn(n, k, device="cuda").half()  # new storage
            check()
            lin.weight.copy_(torch.randn(n, k, device="cuda").half())  # the same, rewritten
            check()
            lin.weight.data = torch.randn(n, 2 * k, device="cuda").half()[:, ::2]  # strided
            check()
            lin.weight.copy_(torch.randn(n, k, device="cuda").half())  # (no stale copy)
            check()
            lin.weight.data = torch.randn(n, k, device="cuda").half()
            path = tmp_path / f"{name}.jsonl"
            with lib.record(path):
                x = torch.randn(3, m, k, device="cuda").half()  # leading dimensions flattened
                for _ in range(4):
                    y = lin(x)
            assert y.shape == (3, m, n)
            assert _err(y, _reference(torch, x, lin.weight.t(), bias=lin.bias)) <= GATE["float16"]
        (line,) = [json.loads(t) for t in path.read_text().splitlines()]
        assert (line["m"], line["n"], line["k"], line["calls"]) == (3 * m, n, k, 4), line
        assert line["runs"] == ("cuBLAS" if lib is empty_lib else _kernels()["nt_f16_none"].name)
        torch_ops.unpatch(lin)


@pytest.mark.parametrize("caller", ["torch", "cupy"])
def test_empty_problems_as_torch_takes_them(kernel_lib, caller):
    """M, N or the batch 0: an empty C, nothing launched; K = 0: C = act(beta C + bias) (the
    bias of C's type or fp32), C poisoned with NaN where beta is 0: torch's own ops for
    torch, gemm-tune's epilogue kernel on a zeroed product for cupy; against float64."""
    import torch

    xp = torch if caller == "torch" else pytest.importorskip("cupy")

    def dev(t):
        return t if caller == "torch" else xp.asarray(t)

    def back(t):
        return t if caller == "torch" else torch.as_tensor(t, device="cuda")

    m, n, k = 37, 29, 41
    h = torch.float16
    for a, b in (((0, k), (k, n)), ((m, k), (k, 0)), ((3, 0, k), (k, n)), ((0, m, k), (0, k, n))):
        C = kernel_lib.gemm(dev(torch.randn(a, device="cuda").to(h)),
                            dev(torch.randn(b, device="cuda").to(h)))
        want = (*a[:-1], b[-1]) if len(a) == 3 else (a[0], b[-1])
        assert tuple(C.shape) == want and C.dtype == (h if caller == "torch" else xp.float16)
    A, B = torch.empty(m, 0, device="cuda", dtype=h), torch.empty(n, 0, device="cuda", dtype=h)
    for bias_t in (h, torch.float32):
        bias = torch.randn(n, device="cuda", dtype=bias_t)
        for beta, act in ((0.0, "gelu"), (1.5, "silu"), (-2.0, None)):
            C = torch.full((m, n), float("nan"), device="cuda", dtype=h) if beta == 0 \
                else torch.randn(m, n, device="cuda", dtype=h)
            r = beta * C.double() if beta != 0 else torch.zeros(m, n, device="cuda",
                                                                 dtype=torch.double)
            r = r + bias.double()
            r = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
                 None: lambda t: t}[act](r)
            Cd = dev(C)
            out = kernel_lib.gemm(dev(A), dev(B.t()), Cd, alpha=3.0, beta=beta, bias=dev(bias),
                                  activation=act)
            assert out is Cd
            assert _err(back(out), r) <= GATE["float16"], (bias_t, beta, act)
    torch.cuda.synchronize()
    if caller == "torch":  # captured into a CUDA graph and replayed: the epilogue alone
        bias = torch.randn(n, device="cuda", dtype=h)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=h)
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(graph):
            kernel_lib.gemm(A, B.t(), out, bias=bias, activation="relu")
        graph.replay()
        torch.cuda.synchronize()
        assert _err(out, torch.relu(bias.double()).expand(m, n)) <= GATE["float16"]


def test_a_patched_model_takes_an_empty_batch(kernel_lib):
    """A patched model given no tokens (an expert with none routed to it) returns what the
    unpatched one does: an empty output of the right shape and type."""
    import torch

    from tuner.runtime import torch_ops

    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 16)).cuda().half()
    x = torch.randn(0, 64, device="cuda").half()
    with torch.inference_mode():
        want = mlp(x)
        torch_ops.patch(mlp, kernel_lib)
        got = mlp(x)
        got3 = mlp(torch.randn(2, 0, 64, device="cuda").half())
        y = torch_ops.linear(x, mlp[0].weight, mlp[0].bias, "gelu", library=kernel_lib)
    torch_ops.unpatch(mlp)
    assert got.shape == want.shape == (0, 16) and got.dtype == want.dtype
    assert got3.shape == (2, 0, 16) and y.shape == (0, 48)
