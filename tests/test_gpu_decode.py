"""GPU: the decode family computes every layout, C type and epilogue right at decode shapes
(M = 1, 7, 16, 33, 64 against N, K = 4097: a partial panel, a partial K chunk), with rows
16-byte aligned (the streaming vector loads) and padded (element by element), strided
batches (B shared by a zero stride), alpha and beta, and both split-K sums; C poisoned with
NaN first, float64 references on fresh random inputs (tests/test_gpu_variants.py's
operands and reference), through the family's runner (tuner.runtime.runners.runner_for:
what the tuner times and the library ships). Skipped without a GPU (conftest.py).

Not yet run on a GPU when written (the session that wrote it had none): the kernels were
checked on the CPU by tests/test_decode_family.py's emulation of their warps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import pytest
from test_gpu_variants import ROUNDOFF, _TORCH, _operand, _reference

from codegen import compile_many
from codegen.check import check
from codegen.families._common import DType, Layout, Variant
from codegen.families.decode import DecodeConfig

#: per input type: the default, a 64-row mma tile, FMAs on 4 rows, split-K by the last
#: block and by a reduce pass, 8-byte loads with one stage, split-K across a cluster (mma
#: on 16 rows, FMAs on one); the ring in shared memory (cp.async): 4 stages of mma on 16
#: rows, FMAs on 2 rows with 8-byte copies summed across a cluster, 6 stages of a 64-row
#: tile summed by the last block; B's first chunks before the wait for the kernel before,
#: loaded (prefetch_b=1) or prefetched into L2 (2), in a register ring and in a
#: shared-memory one summed across a cluster
BASES = [
    DecodeConfig(),
    DecodeConfig(mt=64, bn=32, wk=4, wn=1, stages=2),
    DecodeConfig(math="fma", mt=4, bn=64, wk=4, wn=2),
    DecodeConfig(mt=16, bn=64, wk=4, wn=2, stages=4, split=4, reduce="last"),
    DecodeConfig(mt=32, bn=128, wk=2, wn=4, split=8),
    DecodeConfig(mt=16, bn=32, wk=8, wn=1, vec=4, stages=1, split=2, reduce="last"),
    DecodeConfig(mt=16, bn=64, wk=4, wn=2, split=4, reduce="cluster"),
    DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, split=8, reduce="cluster"),
    DecodeConfig(bn=32, wk=8, wn=1, stages=4, ring="async"),
    DecodeConfig(math="fma", mt=2, bn=64, wk=4, wn=2, vec=4, stages=3, ring="async", split=4,
                 reduce="cluster"),
    DecodeConfig(mt=64, bn=32, wk=4, wn=1, stages=6, ring="async", split=2, reduce="last"),
    DecodeConfig(bn=32, wk=8, wn=1, stages=2, prefetch_b=1),
    DecodeConfig(bn=64, wk=4, wn=2, stages=5, ring="async", prefetch_b=1, split=2,
                 reduce="cluster"),
    DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, stages=4, prefetch_b=2),
    DecodeConfig(bn=32, wk=8, wn=1, stages=5, ring="async", prefetch_b=2, split=2,
                 reduce="last"),
]
MS = (1, 7, 16, 33, 64)


def _variants(dtype: DType):
    """Every layout x C of fp32 and of the input type x {no epilogue, bias + GELU}."""
    for layout, out in itertools.product(Layout, (DType.F32, dtype)):
        yield Variant(layout, out)
        yield Variant(layout, out, "out", "gelu")


def _configs() -> list[DecodeConfig]:
    out = []
    for dtype, base in itertools.product((DType.F16, DType.BF16), BASES):
        for v in _variants(dtype):
            c = v.apply(dataclasses.replace(base, dtype=dtype))
            if not check(c, "sm_90"):
                out.append(c)
    return out


CONFIGS = _configs()


def test_every_base_builds_every_variant():
    """(on the CPU too) each base config takes each of the 16 variants of both types; a
    shared-memory ring the 8 with a row-major A (it copies rows of A)"""
    assert len(CONFIGS) == 2 * sum(8 if b.is_async else 16 for b in BASES)
    assert {c.layout for c in CONFIGS if c.is_async} == {Layout.NN, Layout.NT}


@pytest.fixture(scope="module")
def built(compile_cache):
    from tuner.gpu import device

    res = dict(compile_many(CONFIGS, device().sm, cache_dir=compile_cache))
    bad = {c.name: r.error for c, r in res.items() if not r.ok}
    assert not bad, bad
    return res


@functools.cache
def _runner(cfg, cubin: Path):
    from tuner.runtime.runners import runner_for

    return runner_for(cfg, cubin.read_bytes())


def _run(cfg, res, shape, batch=1, broadcast_b=False, alpha=1.0, beta=0.0, aligned=True,
         c_out=None):
    """Run cfg on fresh operands of its variant, rows 16-byte aligned (or padded by 3, 5
    and 2 elements); (error, gate, C's padding untouched, C)."""
    import torch

    from tuner.bench import error_floor, tolerance
    from tuner.gpu import device

    torch.manual_seed(torch.seed())
    m, n, k = shape
    v = Variant.of(cfg)
    a, lda, sa = _operand(torch, batch, m, k, v.layout in (Layout.TN, Layout.TT), cfg.dtype,
                          0 if aligned else 3, aligned)
    b, ldb, sb = _operand(torch, batch, k, n, cfg.b_col, cfg.dtype, 0 if aligned else 5,
                          aligned, broadcast_b)
    out_t = getattr(torch, _TORCH[v.out])
    ldc = n + 2 + (-(n + 2) % 8 if aligned else 0)
    cstore = torch.full((batch, m, ldc), float("nan"), device="cuda", dtype=out_t)
    c = cstore[..., :n]
    c0 = None
    if beta:
        c0 = torch.randn(batch, m, n, device="cuda").to(out_t)
        c.copy_(c0)
    bias = None
    if v.bias != "none":
        bias = torch.randn(n, device="cuda").to(out_t if v.bias == "out" else torch.float32)
    ref = _reference(torch, a, b, c0, bias, v, alpha, beta, cfg.dtype)
    run = _runner(cfg, Path(res.cubin)).bind(device(), m, n, k, lda, ldb, ldc, batch=batch,
                                              strides=(sa, sb, cstore.stride(0)))
    run(a.data_ptr(), b.data_ptr(), c.data_ptr(), alpha, beta,
        torch.cuda.current_stream().cuda_stream, bias=0 if bias is None else bias.data_ptr())
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(c.double() - ref)
                / max(float(torch.linalg.norm(ref)), error_floor(v.out, ref.numel())))
    gate = tolerance(cfg, k) + ROUNDOFF[v.out]
    return err, gate, bool(torch.isnan(cstore[..., n:]).all()), c


@pytest.mark.gpu
@pytest.mark.parametrize("m", MS)
def test_every_variant_at_decode_shapes(built, m):
    failures = {}
    for cfg, res in built.items():
        for shape, aligned in (((m, 4097, 4097), True), ((m, 4096, 4096), True),
                               ((m, 1001, 999), False)):
            err, gate, untouched, _ = _run(cfg, res, shape, aligned=aligned)
            if not err <= gate or not untouched:
                failures[(cfg.name, shape, aligned)] = (err, gate, untouched)
    assert not failures, failures


@pytest.mark.gpu
def test_batches_with_a_broadcast_operand_alpha_and_beta(built):
    failures = {}
    for (cfg, res), broadcast, aligned in itertools.product(built.items(), (False, True),
                                                            (False, True)):
        err, gate, untouched, _ = _run(cfg, res, (33, 257, 1031), batch=3,
                                       broadcast_b=broadcast, alpha=0.5, beta=2.0,
                                       aligned=aligned)
        if not err <= gate or not untouched:
            failures[(cfg.name, broadcast, aligned)] = (err, gate, untouched)
    assert not failures, failures


@pytest.mark.gpu
def test_split_k_is_deterministic_and_leaves_the_tickets_ready(built):
    """A split-K sum runs in a fixed order: the same operands give the same bits, launch
    after launch (the last-block tickets are reset by each launch)."""
    import torch

    from tuner.gpu import device

    split = [(c, r) for c, r in built.items() if c.split > 1 and c.out is c.dtype]
    assert {c.reduce for c, _ in split} == {"pass", "last", "cluster"}
    for cfg, res in split:
        m, n, k = 16, 4096, 4096
        a = torch.randn(m, k, device="cuda").to(getattr(torch, _TORCH[cfg.dtype]))
        b = torch.randn(k, n, device="cuda").to(a.dtype)
        if cfg.layout in (Layout.TN, Layout.TT):
            a = a.t().contiguous().t()
        if cfg.b_col:
            b = b.t().contiguous().t()
        bias = torch.randn(n, device="cuda").to(a.dtype)
        lda = a.stride(1) if cfg.layout in (Layout.TN, Layout.TT) else a.stride(0)
        ldb = b.stride(1) if cfg.b_col else b.stride(0)
        run = _runner(cfg, Path(res.cubin)).bind(device(), m, n, k, lda, ldb, n)
        outs = []
        for _ in range(3):
            c = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
            run(a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0,
                torch.cuda.current_stream().cuda_stream, bias=bias.data_ptr())
            torch.cuda.synchronize()
            outs.append(c)
        assert not torch.isnan(outs[0]).any(), cfg.name
        assert all(torch.equal(outs[0], o) for o in outs[1:]), cfg.name


@pytest.mark.gpu
def test_a_linear_layer_as_a_model_calls_it(built):
    """gelu(x @ W.t() + b) with W stored N x K (nn.Linear's weight) and C of x's type, at
    the decode shapes of the bar (their K and N; M as given)."""
    import torch
    import torch.nn.functional as F

    from tuner.bench import tolerance
    from tuner.gpu import device

    linear = [(c, r) for c, r in built.items()
              if Variant.of(c) == Variant(Layout.NT, c.dtype, "out", "gelu")]
    assert len(linear) == 2 * len(BASES)
    for (cfg, res), (m, n, k) in itertools.product(linear, [(1, 4096, 4096),
                                                            (16, 14336, 4096),
                                                            (64, 4096, 14336)]):
        t = getattr(torch, _TORCH[cfg.dtype])
        x = torch.randn(m, k, device="cuda").to(t)
        w = torch.randn(n, k, device="cuda").to(t) / k ** 0.5
        bias = torch.randn(n, device="cuda").to(t)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=t)
        run = _runner(cfg, Path(res.cubin)).bind(device(), m, n, k, k, k, n)
        run(x.data_ptr(), w.data_ptr(), y.data_ptr(), 1.0, 0.0,
            torch.cuda.current_stream().cuda_stream, bias=bias.data_ptr())
        torch.cuda.synchronize()
        ref = F.gelu(F.linear(x.double(), w.double(), bias.double()))
        err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
        assert err <= tolerance(cfg, k) + ROUNDOFF[cfg.out], (cfg.name, (m, n, k), err)


@pytest.mark.gpu
def test_prefetching_kernels_read_the_kernel_befores_output_after_it(built):
    """Two layers back to back on one stream, no sync between, each launched with
    programmatic dependent launch: h = x @ W1.t() by one kernel, then y = h @ W2.t() by a
    kernel that loads W2 before it waits for the first (prefetch_b) and h after. y must be
    the product of the h the first kernel wrote (h poisoned with NaN before it runs)."""
    import torch

    from tuner.bench import tolerance
    from tuner.gpu import device

    nt = [(c, r) for c, r in built.items() if Variant.of(c) == Variant(Layout.NT, c.dtype)]
    first = {c.dtype: (c, r) for c, r in nt if not c.prefetch_b and c.split == 1}
    second = [(c, r) for c, r in nt if c.prefetch_b]
    assert len(second) == 2 * sum(1 for b in BASES if b.prefetch_b)  # both types
    for cfg, res in second:
        c1, r1 = first[cfg.dtype]
        t = getattr(torch, _TORCH[cfg.dtype])
        m, k, n1, n2 = 16, 4096, 4096, 4096
        x = torch.randn(m, k, device="cuda").to(t)
        w1 = (torch.randn(n1, k, device="cuda") / k ** 0.5).to(t)
        w2 = (torch.randn(n2, n1, device="cuda") / n1 ** 0.5).to(t)
        h = torch.full((m, n1), float("nan"), device="cuda", dtype=t)
        y = torch.full((m, n2), float("nan"), device="cuda", dtype=t)
        stream = torch.cuda.current_stream().cuda_stream
        run1 = _runner(c1, Path(r1.cubin)).bind(device(), m, n1, k, k, k, n1)
        run2 = _runner(cfg, Path(res.cubin)).bind(device(), m, n2, n1, n1, n1, n2)
        torch.cuda.synchronize()
        run1(x.data_ptr(), w1.data_ptr(), h.data_ptr(), 1.0, 0.0, stream)
        run2(h.data_ptr(), w2.data_ptr(), y.data_ptr(), 1.0, 0.0, stream)
        torch.cuda.synchronize()
        ref = h.double() @ w2.double().t()
        err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
        assert not torch.isnan(y).any() and err <= tolerance(cfg, n1) + ROUNDOFF[cfg.out], \
            (cfg.name, err)


@pytest.mark.gpu
def test_kernels_prefetching_into_l2_read_a_b_that_the_kernel_before_writes(built):
    """prefetch_b=2 needs no promise about B: h = x @ W1.t() by one kernel, then
    y = a @ h.t() by a kernel that prefetches its B, h, into L2 before it waits for the
    first, which is still writing h; both launched with programmatic dependent launch, no
    sync between. y must be the product of the h written (h and y poisoned with NaN before
    each of three rounds)."""
    import torch

    from tuner.bench import tolerance
    from tuner.gpu import device

    nt = [(c, r) for c, r in built.items() if Variant.of(c) == Variant(Layout.NT, c.dtype)]
    first = {c.dtype: (c, r) for c, r in nt if not c.prefetch_b and c.split == 1}
    second = [(c, r) for c, r in nt if c.prefetch_b == 2]
    assert len(second) == 4
    for cfg, res in second:
        c1, r1 = first[cfg.dtype]
        t = getattr(torch, _TORCH[cfg.dtype])
        m, k, n1 = 16, 4096, 4096
        x = torch.randn(m, k, device="cuda").to(t)
        w1 = (torch.randn(n1, k, device="cuda") / k ** 0.5).to(t)
        a = torch.randn(m, n1, device="cuda").to(t)
        h = torch.empty((m, n1), device="cuda", dtype=t)
        y = torch.empty((m, m), device="cuda", dtype=t)
        stream = torch.cuda.current_stream().cuda_stream
        run1 = _runner(c1, Path(r1.cubin)).bind(device(), m, n1, k, k, k, n1)
        run2 = _runner(cfg, Path(res.cubin)).bind(device(), m, m, n1, n1, n1, m)
        for _ in range(3):
            h.fill_(float("nan"))
            y.fill_(float("nan"))
            torch.cuda.synchronize()
            run1(x.data_ptr(), w1.data_ptr(), h.data_ptr(), 1.0, 0.0, stream)
            run2(a.data_ptr(), h.data_ptr(), y.data_ptr(), 1.0, 0.0, stream)
            torch.cuda.synchronize()
            ref = a.double() @ h.double().t()
            err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
            assert not torch.isnan(y).any() and err <= tolerance(cfg, n1) + ROUNDOFF[cfg.out], \
                (cfg.name, err)


@pytest.mark.gpu
def test_a_library_serves_a_constant_weight_through_the_decode_entrys_twin(tmp_path,
                                                                           compile_cache):
    """A library holding a decode entry and its static-B twin (stored as the tuner stores
    them: tune._static_b_twins): two patched layers back to back, y = (x @ W1.t()) @
    W2.t(), with and without static_weights, the second layer's input the first's output
    (no sync between): the same result as torch's in float64 either way, the twin loaded
    only where the weights were promised constant, and lib.gemm(static_b=True) likewise
    (the C++ path's later calls too)."""
    import torch

    from _library import entry
    from codegen import compile_config
    from tuner.bench import tolerance
    from tuner.gpu import device
    from tuner.runtime import torch_ops
    from tuner.runtime.library import Library, load_library
    from tuner.runtime.manifest import static_b_twin
    from tuner.tune import _static_b_twins

    sm, art = device().sm, tmp_path / "art"
    m, k = 16, 4096
    cfg = Variant(Layout.NT, DType.F16).apply(DecodeConfig(dtype=DType.F16, bn=32, wk=8, wn=1,
                                                           stages=3, ring="async"))
    res = compile_config(cfg, sm, compile_cache, art)
    assert res.ok, res.error
    lib = Library.create_or_open(tmp_path / "library")
    lib.add(entry(cfg, res, (m, k, k), 20.0, 10.0, dtype="f16"),
            art / sm / f"{cfg.name}.cu", res.cubin, twins=_static_b_twins(cfg.name, sm, art))
    twin = static_b_twin(cfg.name)
    layers = torch.nn.Sequential(torch.nn.Linear(k, k, bias=False),
                                 torch.nn.Linear(k, k, bias=False)).cuda().half()
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        ref = (x.double() @ layers[0].weight.double().t()).half().double() \
            @ layers[1].weight.double().t()
    for static in (False, True):
        lib = load_library(tmp_path / "library", measure=False)
        torch_ops.patch(layers, lib, static_weights=static)
        with torch.inference_mode():
            for _ in range(3):  # the second and third calls of a key: the C++ path
                y = layers(x)
                torch.cuda.synchronize()
                err = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
                assert err <= 2 * tolerance(cfg, k) + ROUNDOFF[cfg.out], (static, err)
            assert (twin in lib._runners) == static  # loaded only where promised
            z = lib.gemm(x, layers[1].weight.t(), static_b=static)
            torch.cuda.synchronize()
            want = x.double() @ layers[1].weight.double().t()
            err = float(torch.linalg.norm(z.double() - want) / torch.linalg.norm(want))
            assert err <= tolerance(cfg, k) + ROUNDOFF[cfg.out], (static, err)
        torch_ops.unpatch(layers)
