"""torch_ops without a GPU (needs torch; skipped where it is not installed): the custom ops'
fake implementations (shapes and types as the real ops return them), and patch/unpatch
of a model traced on fake CUDA tensors: which Linear layers go through gemm-tune and
which activations they absorb, and torch's own layers where gemm-tune cannot stand in."""

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from tuner.runtime import torch_ops  # noqa: E402

nn = torch.nn


class FakeLibrary:
    path = "/nonexistent/gemm-tune-library"


KEY = torch_ops.library_key(FakeLibrary.path)


def _on_fake_cuda(model, dtype=torch.float16):
    """`model`'s parameters replaced by fake CUDA ones (call inside a FakeTensorMode)."""
    for m in model.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            setattr(m, name, nn.Parameter(torch.empty(p.shape, device="cuda", dtype=dtype),
                                          requires_grad=False))
    return model


def _calls(model, shape=(3, 5, 32), dtype=torch.float16, patch=True, **kw):
    """[(op name, activation argument or None)] of `model`, patched, traced on fake CUDA
    tensors."""
    with FakeTensorMode():
        _on_fake_cuda(model, dtype)
        if patch:
            torch_ops.patch(model, FakeLibrary(), **kw)
        x = torch.empty(shape, device="cuda", dtype=dtype)
        with torch.no_grad():
            gm = make_fx(model)(x)
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            name = str(node.target)
            if "gemm_tune" in name:
                out.append(("gemm_tune.linear", node.args[3]))
            elif name.split(".")[1] in ("gelu", "silu", "relu", "addmm", "mm", "linear"):
                out.append((name.split(".")[1], None))
    return out


def test_fake_linear_and_matmul_return_what_the_ops_return():
    with FakeTensorMode():
        x = torch.empty(2, 5, 32, dtype=torch.float16, device="cuda")
        w = torch.empty(48, 32, dtype=torch.float16, device="cuda")
        b = torch.empty(48, dtype=torch.float32, device="cuda")
        y = torch_ops.linear(x, w, b, "gelu", library=KEY)
        assert (y.shape, y.dtype, y.is_contiguous()) == ((2, 5, 48), torch.float16, True)
        one = torch.empty(32, dtype=torch.float16, device="cuda")
        assert torch_ops.linear(one, w, library=KEY).shape == (48,)
        a = torch.empty(4, 7, 32, device="cuda")
        m = torch.empty(32, 9, device="cuda")
        assert torch_ops.matmul(a, m, library=KEY).shape == (4, 7, 9)
        a2 = torch.empty(7, 32, device="cuda")
        assert torch_ops.matmul(a2, torch.empty(6, 32, 9, device="cuda"),
                                library=KEY).shape == (6, 7, 9)
        assert torch_ops.matmul(a2, m, library=KEY).dtype == torch.float32
        a4 = torch.empty(2, 3, 7, 32, device="cuda")  # batch dimensions broadcast
        assert torch_ops.matmul(a4, torch.empty(3, 32, 9, device="cuda"),
                                library=KEY).shape == (2, 3, 7, 9)
        assert torch_ops.matmul(torch.empty(1, 7, 32, device="cuda"), a4.transpose(-1, -2),
                                library=KEY).shape == (2, 3, 7, 7)
        v = torch.empty(32, device="cuda")  # vectors, as torch.matmul's
        assert torch_ops.matmul(v, m, library=KEY).shape == (9,)
        assert torch_ops.matmul(a4, v, library=KEY).shape == (2, 3, 7)
        assert torch_ops.matmul(v, v, library=KEY).shape == ()
        assert torch_ops.matmul(v, a4.transpose(-1, -2), library=KEY).shape == (2, 3, 7)
        h = torch.empty(7, 32, dtype=torch.bfloat16, device="cuda")
        hm = torch.empty(32, 9, dtype=torch.bfloat16, device="cuda")
        assert torch_ops.matmul(h, hm, library=KEY).dtype == torch.bfloat16
        assert torch_ops.matmul(h, hm, library=KEY, out_dtype=torch.float32).dtype \
            == torch.float32
    with pytest.raises(Exception, match="out_dtype torch.int8 is not float32"):
        torch_ops.matmul(h, hm, library=KEY, out_dtype=torch.int8)


def test_patch_fuses_a_linear_and_the_activation_after_it_in_a_sequential():
    mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64),
                        nn.GELU(approximate="tanh"), nn.Linear(64, 64), nn.SiLU(),
                        nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 8))
    assert _calls(mlp) == [("gemm_tune.linear", a)
                           for a in ("gelu", "gelu_tanh", "silu", "relu", "none")]
    assert isinstance(mlp[1].__dict__["forward"], type(mlp[0].forward))  # an identity now
    torch_ops.unpatch(mlp)
    assert not any("forward" in m.__dict__ for m in mlp.modules())
    assert [op for op, _ in _calls(mlp, patch=False)] == [
        "addmm" if op == "linear" else op for op in
        ("linear", "gelu", "linear", "gelu", "linear", "silu", "linear", "relu", "linear")]


def test_patch_fuses_nothing_ambiguous():
    shared = nn.ReLU()  # one module used twice: its second use is not after this Linear only
    hooked = nn.Linear(32, 32)
    hooked.register_forward_hook(lambda m, i, o: None)

    class Custom(nn.Module):  # an activation in a forward of its own: not a module pair
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return nn.functional.gelu(self.fc(x))

    class Reversed(nn.Sequential):  # a Sequential whose forward is not Sequential's
        def forward(self, x):
            for m in reversed(self):
                x = m(x)
            return x

    cases = [
        (nn.Sequential(nn.Linear(32, 32), shared, nn.Linear(32, 32), shared),
         [("gemm_tune.linear", "none"), ("relu", None)] * 2),
        (nn.Sequential(hooked, nn.SiLU()), [("gemm_tune.linear", "none"), ("silu", None)]),
        (nn.Sequential(Custom()), [("gemm_tune.linear", "none"), ("gelu", None)]),
        (Reversed(nn.ReLU(), nn.Linear(32, 32)), [("gemm_tune.linear", "none"),
                                                  ("relu", None)]),
        (nn.Sequential(nn.Linear(32, 32), nn.GELU()),
         [("gemm_tune.linear", "gelu")]),
    ]
    for model, want in cases:
        assert _calls(model) == want, model
    assert _calls(nn.Sequential(nn.Linear(32, 32), nn.GELU()), fuse=False) == [
        ("gemm_tune.linear", "none"), ("gelu", None)]


def test_a_patched_model_runs_torch_where_gemm_tune_cannot_stand_in():
    """On CPU tensors: torch's layers, the absorbed activation applied there once; the
    outputs equal the unpatched model's (autograd recording a call is the same path:
    test_gpu_runtime checks it, fake CUDA tensors carry no autograd here)."""
    cpu = nn.Sequential(nn.Linear(32, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 8),
                        nn.SiLU())
    x = torch.randn(3, 32)
    with torch.no_grad():
        want = cpu(x)
        torch_ops.patch(cpu, FakeLibrary())
        got = cpu(x)
        torch_ops.unpatch(cpu)
        again = cpu(x)
    assert torch.equal(got, want) and torch.equal(again, want)


def test_patch_is_idempotent_and_keeps_the_parameters():
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    params = [p.data_ptr() for p in mlp.parameters()]
    torch_ops.patch(mlp, FakeLibrary())
    torch_ops.patch(mlp, FakeLibrary())
    assert [p.data_ptr() for p in mlp.parameters()] == params
    assert _calls(mlp, shape=(2, 8), patch=False) == [("gemm_tune.linear", "relu")]


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 2.0)])
@pytest.mark.parametrize("bias", [None, "vector"])
@pytest.mark.parametrize("shapes", [((7, 5), (5, 3)), ((4, 7, 5), (5, 3)), ((7, 5), (4, 5, 3)),
                                    ((4, 7, 5), (1, 5, 3)), ((4, 7, 5), (4, 5, 3))])
def test_the_torch_fallback_computes_the_variant(shapes, bias, alpha, beta, act):
    """What runs a torch caller's call when no kernel serves it (torch's matmul, addmm,
    bmm, baddbmm and the epilogue after them), on CPU tensors against float64."""
    from tuner.runtime.call import _torch_fallback

    sa, sb = shapes
    A, B = torch.randn(sa, dtype=torch.float64), torch.randn(sb, dtype=torch.float64)
    batch = max(x[0] if len(x) == 3 else 1 for x in shapes)
    out = (batch, 7, 3) if len(sa) == 3 or len(sb) == 3 else (7, 3)
    c0 = torch.randn(out, dtype=torch.float64)
    vec = None if bias is None else torch.randn(3, dtype=torch.float64)
    ref = alpha * (A @ B) + beta * c0
    ref = ref + (0 if vec is None else vec)
    F = torch.nn.functional
    ref = {"none": lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[act](ref)
    C = c0.clone() if beta else torch.full(out, float("nan"), dtype=torch.float64)
    run = _torch_fallback(batch, act, len(sa) == len(sb) == len(out) == 2, out)
    assert run(A, B, C, alpha, beta, vec) is C
    assert torch.allclose(C, ref, rtol=1e-12, atol=1e-12)
    if not beta:  # C allocated by the call (by torch's own product where it can)
        C = run(A, B, None, alpha, beta, vec)
        assert C.shape == out and torch.allclose(C, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("out", [torch.float32, torch.float16, torch.bfloat16])
def test_an_empty_product_in_torch_is_the_epilogue_alone(out, act):
    """K = 0 for a torch C: act(beta C + bias) in FP32, one rounding to C's type (fp16 or
    bf16 C with an fp32 bias too), C NaN-poisoned where beta is 0; C allocated where none
    is given; M = 0: an empty C of the right shape. On CPU tensors (the operands as the
    call reads them), against float64."""
    from codegen.config import DType
    from tuner.runtime import call
    from tuner.runtime.operands import Operand

    call._see_torch()
    F = torch.nn.functional
    ref_act = {"none": lambda x: x, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[act]
    dt = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}[out]

    def op(t, name, kind="torch"):
        return Operand(name, t, t.shape[-2], t.shape[-1], max(t.shape[-1], 1), 0, kind=kind,
                       dtype=dt)

    A, B = torch.empty(6, 0, dtype=out), torch.empty(0, 5, dtype=out)
    bias = torch.randn(5)
    for beta, C in ((0.0, torch.full((6, 5), float("nan"), dtype=out)),
                    (-1.5, torch.randn(6, 5).to(out)), (1.0, None)):
        product = torch.zeros(6, 5, dtype=torch.float64) if not beta or C is None else \
            beta * C.double()  # (a C the call allocates: beta is 0 whatever was asked)
        want = ref_act(product + bias.double())
        req = call.Request(6, 5, 0, 1, dt, Operand("bias", bias, 1, 5, 5, 0, dtype=DType.F32),
                           "f32", act, False)
        e = call.EmptyProblem(op(A, "A"), op(B, "B"), None if C is None else op(C, "C"), req)
        got = call._empty_call(e, C, beta, None)
        assert got.dtype == out and got.shape == (6, 5) and (C is None or got is C)
        tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[out]
        assert torch.allclose(got.double(), want, rtol=tol, atol=tol), (beta, got, want)
    empty = call.EmptyProblem(op(torch.empty(0, 3, dtype=out), "A"), op(B[:, :0], "B"), None,
                              call.Request(0, 7, 3, 1, dt, None, "none", act, False))
    got = call._empty_call(empty, None, 0.0, None)
    assert got.shape == (0, 7) and got.dtype == out


def test_the_torch_fallback_applies_the_activation_in_place_only_into_the_callers_c(monkeypatch):
    """Into a C the caller gave, the activation runs in place (it must land there); into a C
    the call allocated, out of place, as F.gelu(F.linear(...)) runs it (faster after a large
    GEMM on the H200)."""
    from tuner.runtime import call

    inplace = []
    real = torch._C._nn.gelu_
    monkeypatch.setattr(torch._C._nn, "gelu_", lambda C, **kw: inplace.append(1) or real(C, **kw))
    A, B = torch.randn(7, 5), torch.randn(5, 3)
    want = torch.nn.functional.gelu(A @ B)
    run = call._torch_fallback(1, "gelu", True, (7, 3))
    got = run(A, B, None, 1.0, 0.0)
    assert torch.allclose(got, want) and inplace == []
    C = torch.full((7, 3), float("nan"))
    assert run(A, B, C, 1.0, 0.0) is C and torch.allclose(C, want) and inplace == [1]


@pytest.mark.parametrize("act,use_gelu", [("relu", False), ("gelu_tanh", True)])
def test_relu_and_tanh_gelu_with_a_bias_are_one_addmm_activation(monkeypatch, act, use_gelu):
    """Where the call allocates C (alpha 1, a bias of A's type, CUDA tensors: traced here on
    fake ones), ReLU and GELU(tanh) go into cuBLASLt's epilogue with the bias:
    torch._addmm_activation, no activation after it (its numbers: the GPU tests). Into a
    given C, with alpha != 1, or on CPU tensors (whose _addmm_activation applies GELU's erf
    form), addmm and the activation after it, as before."""
    from tuner.runtime import call

    fused, after = [], []
    real = torch._addmm_activation
    monkeypatch.setattr(torch, "_addmm_activation",
                        lambda *a, **kw: fused.append(kw["use_gelu"]) or real(*a, **kw))
    monkeypatch.setattr(call, "torch_epilogue", lambda C, *a, **kw: after.append(1) or C)
    run = call._torch_fallback(1, act, True, (7, 3))
    with FakeTensorMode():
        A, B, vec = (torch.empty(s, device="cuda") for s in ((7, 5), (5, 3), (3,)))
        assert run(A, B, None, 1.0, 0.0, vec).shape == (7, 3)
        assert (fused, after) == ([use_gelu], [])
        run(A, B, None, 0.5, 0.0, vec)
        run(A, B, torch.empty(7, 3, device="cuda"), 1.0, 0.0, vec)
        assert (fused, after) == ([use_gelu], [1, 1])
    run(torch.randn(7, 5), torch.randn(5, 3), None, 1.0, 0.0, torch.randn(3))
    assert (fused, after) == ([use_gelu], [1, 1, 1])


def test_eager_calls_skip_the_ops_dispatch_only_where_nothing_traces_or_records():
    """Plain tensors and nn.Parameters in eager code with no gradient to record call the
    library directly; torch.compile, a dispatch mode (make_fx, fake tensors) or autograd
    recording keep the custom op."""
    x, w = torch.ones(2, 3), torch.ones(4, 3)
    p = nn.Parameter(torch.ones(4))  # requires_grad, as a layer's bias
    assert torch_ops._eager(x, w, None)
    assert not torch_ops._eager(x, w, p)  # autograd would record the call
    with torch.no_grad():
        assert torch_ops._eager(x, w, p)
    with torch.inference_mode():
        assert torch_ops._eager(x, w, p)
    with FakeTensorMode():
        assert not torch_ops._eager(torch.empty(2, 3))
    with torch.no_grad():
        traced = make_fx(lambda t: t + float(torch_ops._eager(t)))(x)  # real tensors, traced
        assert torch.equal(traced(x), x)  # + 0.0: not eager while tracing
        compiled = torch.compile(lambda t: t + float(torch_ops._eager(t)), backend="eager",
                                 fullgraph=True)
        assert torch.equal(compiled(x), x)


class _Recorder:
    """A library stand-in that records its gemm calls and returns a marked output."""

    path = "/nonexistent/gemm-tune-recorder"

    def __init__(self):
        self.calls = []

    def gemm(self, a, b, *args, **kw):
        self.calls.append((a, b, kw))
        return torch.full((a.shape[0], b.shape[1]), 7.0)


def test_an_eager_linear_passes_the_layers_parameters_to_the_library_as_they_are():
    """torch_ops.linear in inference: the library gets x's rows as one matrix, W.t() (a
    view: the NT layout) and the bias Parameter itself, with no custom-op dispatch between
    (the call works on CPU tensors with a stand-in library, which the op, registered for
    CUDA only, would refuse)."""
    rec = _Recorder()
    lin = nn.Linear(3, 4)
    x = torch.randn(2, 5, 3)
    with torch.inference_mode():
        y = torch_ops.linear(x, lin.weight, lin.bias, "gelu", library=rec)
        assert y.shape == (2, 5, 4) and bool((y == 7.0).all())
        a, b, kw = rec.calls[-1]
        assert a.shape == (10, 3) and a.data_ptr() == x.data_ptr()
        assert b.shape == (3, 4) and b.stride() == (1, 3) and b.data_ptr() == lin.weight.data_ptr()
        assert kw["bias"] is lin.bias and kw["activation"] == "gelu" and not kw["static_b"]
        x2 = torch.randn(6, 3)  # a 2-D x goes as it is, and its result comes back as it is
        y2 = torch_ops.linear(x2, lin.weight, None, library=rec)
        assert rec.calls[-1][0] is x2 and y2.shape == (6, 4)
        # the promise that the weight is constant goes to the library as static_b
        torch_ops.linear(x, lin.weight, lin.bias, library=rec, static_weight=True)
        assert rec.calls[-1][2]["static_b"] is True



class _Plan:
    """A plan stand-in: cuBLAS through torch, counting its calls as a recording does."""

    memo = True

    def __init__(self):
        self.tally = [0]

    def torch_run(self, A, B, C, alpha, beta, bias):
        raise AssertionError("a layer's torch route is F.linear itself")


def test_a_layers_calls_reuse_its_key_while_the_operands_geometry_stays(monkeypatch):
    """call.torch_linear (a patched nn.Linear's path) reads the whole call key once per
    geometry of x and storage of W: a repeated call finds it in the layer's memo, and still
    looks the plan up in lib.plans (a recording makes plans afresh); a new x shape, a moved
    W or another bias makes the key again. Where cuBLAS runs through torch the call is
    F.linear on x as it is (any leading dimensions) and the activation after it."""
    from types import SimpleNamespace

    from tuner.runtime import call

    call._see_torch()
    keys = []
    real = call._torch_key
    monkeypatch.setattr(call, "_torch_key", lambda *a: keys.append(a) or real(*a))
    lib, memo = SimpleNamespace(plans={}, measure=True), {}
    w, b = torch.randn(4, 3), torch.randn(4)

    def plan_for(x, w, bias):  # what lib.gemm would have made and kept for this call
        key = real(x.view(-1, x.shape[-1]), w.t(), None, None, True, None, None, bias, "gelu")[0]
        lib.plans[key] = _Plan()
        return lib.plans[key]

    def linear(x, w, bias):
        y = call.torch_linear(lib, memo, x, w, w.t(), bias, "gelu")
        want = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias))
        assert y.shape == want.shape and torch.allclose(y, want)

    first = plan_for(torch.randn(2, 3), w, b)
    for _ in range(3):
        linear(torch.randn(2, 3), w, b)
    assert first.tally == [3] and len(keys) == 1 and len(memo) == 1
    again = plan_for(torch.randn(2, 3), w, b)  # the plans made afresh: the new one runs
    linear(torch.randn(2, 3), w, b)
    assert again.tally == [1] and len(keys) == 1
    x3 = torch.randn(2, 5, 3)  # leading dimensions: the rows of one problem, x as it is
    rows = plan_for(x3, w, b)
    linear(x3, w, b)
    linear(torch.randn(2, 5, 3), w, b)
    assert rows.tally == [2] and len(keys) == 2
    w2 = torch.randn(4, 3)  # the weight's storage moved (W.data = ...)
    plan_for(x3, w2, b)
    linear(x3, w2, b)
    b2 = torch.randn(4)  # another bias
    plan_for(x3, w2, b2)
    linear(x3, w2, b2)
    assert len(keys) == 4 and len(memo) == 4
    assert call.torch_linear(lib, memo, torch.randn(5, 2, 3).transpose(0, 1), w, w.t(), b,
                             "gelu") is None  # rows that do not fold without a copy


@pytest.mark.parametrize("c_given", [True, False])
def test_a_first_use_is_timed_with_the_callers_c_or_none(monkeypatch, c_given):
    """A torch caller that passes no C has each call allocate one (a kernel's plan into
    torch.empty of C's shape, cuBLAS through torch's allocating product): its first use
    times that same call, C None, and the plans it times know the shape to allocate; a
    caller's C is passed as given."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from codegen.families._common import DType
    from tuner.runtime import call, measure
    from tuner.runtime.dispatch import Choice

    m, n, k, batch = 6, 5, 4, 3
    geometry = (((batch, m, k), (m * k, k, 1)), ((k, n), (n, 1)),
                ((batch, m, n), (m * n, n, 1)), None)
    problem = call.Problem(SimpleNamespace(index=0), DType.F32, m, n, k, k, n, n, (0, 0, 0),
                           True, None, True, 0, strides=(m * k, 0, m * n), batch=batch,
                           geometry=geometry, c_given=c_given)
    plan = problem.build(SimpleNamespace(), Choice(None, "measured", ""))
    assert plan.out_shape == (batch, m, n) and plan.torch_run is not None

    operands = tuple(torch.randn(shape).as_strided(shape, strides)
                     for shape, strides in geometry[:3]) + (None,)
    passed = []

    @contextmanager
    def torch_operands(g, p):
        yield operands[0], operands[1:2], *operands[2:]

    monkeypatch.setattr(measure, "torch_operands", torch_operands)
    monkeypatch.setattr(measure, "time_candidates",
                        lambda g, runners, stream: [r(stream) for r in runners.values()])
    monkeypatch.setattr(call.Problem, "_plans", lambda self, lib, names: {"cublas": plan})
    monkeypatch.setattr(call, "gemm", lambda lib, A, B, C, *a, **kw: passed.append(C))
    lib = SimpleNamespace(plans={})
    problem._time_torch(lib, [])
    assert passed == [operands[2] if c_given else None] and lib.plans == {}
