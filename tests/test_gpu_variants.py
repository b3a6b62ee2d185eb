"""GPU: every family that declares a layout, output type, bias and activation computes them
right: operands stored in the layout (padded leading dimensions), strided batches (B
broadcast by a zero stride), C poisoned with NaN first, against float64 references on
fresh random inputs. A family's variants are those its spec declares and check accepts,
so a family that learns one is tested here without a line changed. A kernel that cannot
take a shape's N (the TMA-store epilogue) must refuse it and runs at the next N it takes. Skipped without a GPU
(conftest.py); torch makes the operands and the references."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import pytest

from codegen import compile_many
from codegen.check import check
from codegen.families import FAMILIES
from codegen.families._common import ACTIVATIONS, DType, Layout, Variant

pytestmark = pytest.mark.gpu

#: the input types each family is asked for (its default config of that type)
DTYPES = (DType.F32, DType.F16, DType.BF16, DType.TF32)
#: unit roundoff of C's type: a 2-byte C may be off by half an ulp on top of the gate
ROUNDOFF = {DType.F32: 0.0, DType.F16: 2.0 ** -11, DType.BF16: 2.0 ** -8}
SHAPES = [(1, 1, 1), (131, 67, 97), (37, 250, 64)]


def _variants(dtype: DType):
    """Every layout x each output type with no epilogue and with bias + gelu; each
    activation with and without a bias on NT (the linear layer's layout)."""
    outs = (DType.F32,) if dtype in (DType.F32, DType.TF32) else (DType.F32, dtype)
    for layout, out in itertools.product(Layout, outs):
        yield Variant(layout, out)
        yield Variant(layout, out, "out", "gelu")
    for act, bias in itertools.product(ACTIVATIONS[1:], ("none", "f32")):
        out = outs[-1]
        if not (bias == "f32" and out is DType.F32):
            yield Variant(Layout.NT, out, bias, act)


def _configs():
    """(family, dtype, variant[, "register store"]) -> config, for each family's default
    that takes it; a default with the TMA-store epilogue also without it, so that both
    epilogues are tested."""
    out = {}
    for spec, dtype in itertools.product(FAMILIES.values(), DTYPES):
        if dtype not in spec.dtypes or spec.dtypes[dtype] is not dtype:
            continue
        default = spec.default(dtype)
        bases = {(): default}
        if getattr(default, "store", 0):
            bases[("register store",)] = dataclasses.replace(default, store=0)
        for tag, base in bases.items():
            if check(base, "sm_90"):
                continue
            for v in _variants(dtype):
                if v.layout in spec.layouts and (spec.epilogue or v.plain
                                                 or v == Variant(v.layout)):
                    cfg = v.apply(base)
                    if not check(cfg, "sm_90"):
                        out[(spec.name, dtype.short, v.key, *tag)] = cfg
    return out


def _swizzled():
    """SIMT's XOR-swizzled transposed tiles, in each layout that has one, with an epilogue."""
    from codegen.config import KernelConfig

    base = KernelConfig(bm=64, bn=128, bk=16, rm=4, rn=8, wt=8, pad=0, swz=1, stages=3)
    out = {}
    for layout in (Layout.NN, Layout.NT, Layout.TT):
        for v in (Variant(layout), Variant(layout, DType.F32, "out", "relu")):
            out[("simt-swizzled", "f32", v.key)] = v.apply(base)
    return out


CONFIGS = {**_configs(), **_swizzled()}


@pytest.fixture(scope="module")
def built(compile_cache):
    from tuner.gpu import device

    res = dict(compile_many(CONFIGS.values(), device().sm, cache_dir=compile_cache))
    bad = {c.name: r.error for c, r in res.items() if not r.ok}
    assert not bad, bad
    return res


@functools.cache
def _runner(cfg, cubin: Path):
    from tuner.runtime.runners import runner_for

    return runner_for(cfg, cubin.read_bytes())


_TORCH = {DType.F32: "float32", DType.TF32: "float32", DType.F16: "float16",
          DType.BF16: "bfloat16"}


def _operand(torch, batch, rows, cols, column_major, dtype, pad, aligned, broadcast=False):
    """A batch x rows x cols operand stored row- or column-major with `pad` elements past
    each stored row (for an operand the kernel needs 16-byte aligned, as many more as make
    a stored row a multiple of 16 bytes): (the logical view, leading dimension, batch
    stride)."""
    store_rows, store_cols = (cols, rows) if column_major else (rows, cols)
    if aligned:
        per = 16 // dtype.size
        pad += -(store_cols + pad) % per
    n = 1 if broadcast else batch
    store = torch.randn(n, store_rows, store_cols + pad, device="cuda").to(
        getattr(torch, _TORCH[dtype]))
    view = store[..., :store_cols]
    if column_major:
        view = view.transpose(-1, -2)
    if broadcast:
        view = view.expand(batch, rows, cols)
    return view, store_cols + pad, 0 if broadcast else store.stride(0)


def _as_multiplied(torch, x, dtype: DType):
    """x in float64 as the kernel multiplies it: a tf32 kernel rounds fp32 data to tf32 (to
    nearest, ties away from zero, as cvt.rna.tf32.f32); the other types as stored."""
    if dtype is DType.TF32:
        bits = x.float().contiguous().view(torch.int32)
        x = ((bits + 0x1000) & -0x2000).view(torch.float32)
    return x.double()


def _reference(torch, a, b, c0, bias, v: Variant, alpha, beta, dtype: DType):
    import torch.nn.functional as F

    ref = alpha * torch.matmul(_as_multiplied(torch, a, dtype), _as_multiplied(torch, b, dtype))
    if c0 is not None:
        ref += beta * c0.double()
    if v.bias != "none":
        ref += bias.double()
    if v.act == "relu":
        ref = F.relu(ref)
    elif v.act in ("gelu", "gelu_tanh"):
        ref = F.gelu(ref, approximate="tanh" if v.act == "gelu_tanh" else "none")
    elif v.act == "silu":
        ref = F.silu(ref)
    return ref


def _taken(cfg, shape) -> tuple:
    """`shape`, or for a kernel that cannot take its N (the TMA-store epilogue writes whole
    16 bytes of a row) the shape with the next N it takes: odd M and K still tested."""
    m, n, k = shape
    while not cfg.takes(m, n, k, (16, 16, 16)):
        n += 1
    return m, n, k


def _run(cfg, res, shape, batch=1, broadcast_b=False, alpha=1.0, beta=0.0):
    """Run cfg on fresh operands of its variant at the shape it takes (_taken); (error,
    gate, untouched padding?). Where it took another N, its runner must refuse the asked
    one."""
    import torch

    from tuner.bench import error_floor, tolerance
    from tuner.gpu import device
    from tuner.runtime.errors import TmaUnsupported

    torch.manual_seed(torch.seed())  # fresh inputs every run
    m, n, k = _taken(cfg, shape)
    if n != shape[1]:
        with pytest.raises(TmaUnsupported, match=f"N={shape[1]} is not a multiple"):
            _runner(cfg, Path(res.cubin)).bind(device(), m, shape[1], k, k + 8, n + 8, n + 8)
    v = Variant.of(cfg)
    aligned = cfg.aligned_operands
    a, lda, sa = _operand(torch, batch, m, k, v.layout in (Layout.TN, Layout.TT), cfg.dtype, 3,
                          aligned[0])
    b, ldb, sb = _operand(torch, batch, k, n, v.layout in (Layout.NT, Layout.TT), cfg.dtype, 5,
                          aligned[1], broadcast_b)
    out_t = getattr(torch, _TORCH[v.out])
    ldc = n + 2 + (-(n + 2) % (16 // v.out.size) if aligned[2] else 0)
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
    return err, gate, bool(torch.isnan(cstore[..., n:]).all())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_declared_variant_is_correct(built, shape):
    assert any(f == "simt" for f, _, _ in CONFIGS), "SIMT declares every variant"
    failures = {}
    for cfg, res in built.items():
        err, gate, untouched = _run(cfg, res, shape)
        if not err <= gate or not untouched:
            failures[cfg.name] = (err, gate, untouched)
    print(f"{len(built)} kernels at {shape}")
    assert not failures, failures


def test_batches_with_a_broadcast_operand_alpha_and_beta(built):
    failures = {}
    for cfg, res in built.items():
        for broadcast in (False, True):
            err, gate, untouched = _run(cfg, res, (45, 70, 33), batch=3, broadcast_b=broadcast,
                                        alpha=0.5, beta=2.0)
            if not err <= gate or not untouched:
                failures[(cfg.name, broadcast)] = (err, gate, untouched)
    assert not failures, failures


def test_split_k_paths_apply_the_epilogue(compile_cache):
    """SIMT's three split-K sums (a reduce pass, the last block, a cluster) each finish
    the epilogue: C's type, the bias and the activation, per problem of a batch."""
    from codegen.config import KernelConfig
    from tuner.gpu import device

    v = Variant(Layout.TT, DType.BF16, "f32", "silu")
    cfgs = [v.apply(dataclasses.replace(KernelConfig(bm=32, bn=64, bk=16, rm=4, rn=4, wt=8),
                                        dtype=DType.BF16, split=4, reduce=r))
            for r in ("pass", "last", "cluster")]
    res = dict(compile_many(cfgs, device().sm, cache_dir=compile_cache))
    for cfg, r in res.items():
        assert r.ok, r.error
        err, gate, untouched = _run(cfg, r, (50, 70, 300), batch=2, alpha=0.5, beta=2.0)
        assert err <= gate and untouched, (cfg.name, err, gate)
