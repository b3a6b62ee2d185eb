"""GPU: the committed library (artifacts/library, copied) called as users call it, on
problems drawn at random each run: any input type (fp32 strict, tf32, 3xTF32, fp16, bf16),
any layout, padded and misaligned rows, C of any type (given and poisoned, or allocated),
alpha and beta, a bias of C's type or fp32, each activation, 2-D or strided batches with a
shared operand (of one batch dimension or two: batch x heads), torch and cupy callers,
first-use measuring on, off or the library's default; each problem called twice, on fresh
operands (the second call of a torch caller's key with no flags is served by the C++ path,
tuner.runtime.fast). No problem is one the library was tuned for, so each call goes through
the dispatch rule for shapes nobody listed: M-buckets, neighbouring entries, the estimate,
cuBLAS and the epilogue after it.

Each result is checked against a float64 product of the inputs as given, within the
request's gate (tuner.bench: the accumulation's, growing with K on tensor cores, plus two
roundings of a 16-bit C: cuBLAS through torch rounds the product, then its activation's
result), taken against a norm of at least tuner.bench.error_floor. The draw's seed is in
every failure message: GEMM_TUNE_FUZZ_SEED=<seed> replays it; GEMM_TUNE_FUZZ_N sets the
number of problems (default 160).
"""

import collections
import dataclasses
import os
import random
import shutil
from pathlib import Path

import pytest
from test_gpu_library_variants import _reference  # float64, the bias and activation

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = int(os.environ.get("GEMM_TUNE_FUZZ_N", "160"))
#: fp32 data by request: (torch dtype name, allow_tf32, allow_3xtf32)
REQUESTS = {"fp32": ("float32", False, False), "tf32": ("float32", True, False),
            "3xtf32": ("float32", False, True), "fp16": ("float16", False, False),
            "bf16": ("bfloat16", False, False)}
ACTIVATIONS = (None, None, "relu", "gelu", "gelu_tanh", "silu")
#: what lib.gemm promises for allow_tf32, route-independent (README; test_gpu_runtime)
TF32_PROMISE = 1e-3


@dataclasses.dataclass
class Problem:
    request: str
    m: int
    n: int
    k: int
    batch: int  # 0: 2-D operands
    heads: int  # 0: one batch dimension; else two, (batch // heads) x heads
    shared: str  # "", "a" or "b": that operand is one matrix (2-D) for the whole batch
    a_cols: bool  # A stored by columns (a transposed view)
    b_cols: bool
    pad: int  # elements added to every leading dimension
    offset: int  # elements of storage before A's first (misaligns A's pointer)
    out: str | None  # out_dtype asked (None: the default)
    given_c: bool
    alpha: float
    beta: float
    bias: str | None  # None, "out" (C's type) or "f32"
    act: str | None
    caller: str  # "torch" or "cupy"
    measure: bool | None  # None: the library's default (the C++ path may serve the call)


def _size(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.2:
        return rng.randint(1, 8)
    if kind < 0.55:
        return rng.choice((17, 31, 61, 97, 127, 131, 211, 257, 383, 509, 769))
    if kind < 0.85:
        return rng.choice((64, 128, 192, 256, 320, 512, 768, 1024)) + rng.choice((0, 0, 1, -1, 8))
    return rng.choice((1536, 2048, 3000, 4096))


def draw(rng: random.Random) -> Problem:
    """A problem as a user might pose it. Half are plain (NN, C of the default type, no
    bias or activation: the variants the committed library's kernels were tuned for), so
    that its kernels, not only cuBLAS, run at shapes they were not tuned at. cupy has no
    bfloat16, so its callers pass none."""
    caller = rng.choice(("torch", "torch", "cupy"))
    requests = [r for r in REQUESTS if caller == "torch" or r != "bf16"]
    request = rng.choice(requests)
    m, n, k = _size(rng), _size(rng), _size(rng)
    if rng.random() < 0.25:  # decode-like: a few rows through a wide weight
        m, n, k = rng.randint(1, 64), rng.choice((1024, 2048, 4096)), rng.choice((1024, 4096))
    while m * n * k > 2**31:  # the float64 reference and the buffers stay small
        k = max(1, k // 2)
    batch = rng.choice((0, 0, 0, 2, 3, 4, 6))
    shared = rng.choice(("", "", "a", "b")) if batch else ""
    heads = rng.choice((0, 2)) if batch in (4, 6) else 0
    given_c = rng.random() < 0.6
    beta = rng.choice((0.0, 0.0, 0.5)) if given_c else 0.0
    p = Problem(request, m, n, k, batch, heads, shared, False, False,
                rng.choice((0, 0, 0, 1, 3, 8)),
                rng.choice((0, 0, 0, 0, 1)), None, given_c, rng.choice((1.0, 1.0, 0.75)), beta,
                None, None, caller, rng.choice((True, True, False, None, None)))
    if rng.random() < 0.5:
        return p
    two_byte = request in ("fp16", "bf16")
    outs = [None, "float32", "float16", "bfloat16"] if two_byte else [None, "float16", "bfloat16"]
    if caller == "cupy":
        outs.remove("bfloat16")
    return dataclasses.replace(
        p, a_cols=rng.random() < 0.3, b_cols=rng.random() < 0.5, out=rng.choice(outs),
        bias=rng.choice((None, "out", "f32")), act=rng.choice(ACTIVATIONS))


def c_type(p: Problem) -> str:
    if p.out is not None:
        return p.out
    return REQUESTS[p.request][0]  # fp32 data writes fp32 C, 16-bit data its own type


def gate(p: Problem) -> float:
    from codegen.config import DType
    from tuner.bench import TOLERANCE, output_rounding
    from tuner.runtime.operands import out_dtype

    out = out_dtype(c_type(p))
    grow = max(1.0, p.k / 4096)
    acc = {"fp32": TOLERANCE[DType.F32], "3xtf32": TOLERANCE[DType.F32],
           "tf32": TF32_PROMISE * grow, "fp16": TOLERANCE[DType.F16] * grow,
           "bf16": TOLERANCE[DType.BF16] * grow}[p.request]
    return acc + 2 * output_rounding(out)


def _matrix(torch, p: Problem, rows: int, cols: int, by_columns: bool, dtype, batched: bool,
            offset: int = 0):
    """rows x cols (x batch) of fresh values, stored by rows or columns with `p.pad` more
    elements per leading dimension, `offset` elements into its storage: a view, no copy."""
    lead, inner = (cols, rows) if by_columns else (rows, cols)
    nb = p.batch if batched else 1
    flat = torch.randn(offset + nb * lead * (inner + p.pad), device="cuda").to(dtype)
    x = flat[offset:].view(nb, lead, inner + p.pad)[:, :, :inner]
    if by_columns:
        x = x.transpose(1, 2)
    if batched and p.heads:
        return x.unflatten(0, (nb // p.heads, p.heads))
    return x if batched else x[0]


def operands(torch, p: Problem):
    dtype = getattr(torch, REQUESTS[p.request][0])
    ctype = getattr(torch, c_type(p))
    a = _matrix(torch, p, p.m, p.k, p.a_cols, dtype, p.batch > 0 and p.shared != "a", p.offset)
    b = _matrix(torch, p, p.k, p.n, p.b_cols, dtype, p.batch > 0 and p.shared != "b")
    lead = ((p.batch // p.heads, p.heads) if p.heads else (p.batch,)) if p.batch else ()
    shape = (*lead, p.m, p.n)
    c0 = torch.randn(shape, device="cuda").to(ctype)
    bias = None
    if p.bias is not None:
        bias = torch.randn(p.n, device="cuda").to(ctype if p.bias == "out" else torch.float32)
    return a, b, c0, bias


def run(torch, lib, p: Problem):
    """C as lib.gemm computed it for `p` (and whether a given C came back as itself)."""
    _, tf32, x3 = REQUESTS[p.request]
    a, b, c0, bias = operands(torch, p)
    c = None
    if p.given_c:
        c = c0.clone() if p.beta else torch.full_like(c0, float("nan"))
    kw = dict(alpha=p.alpha, beta=p.beta, allow_tf32=tf32, allow_3xtf32=x3,
              out_dtype=p.out, activation=p.act, measure=p.measure)
    if p.caller == "cupy":
        import cupy

        cp = [None if x is None else cupy.asarray(x) for x in (a, b, c, bias)]
        got = lib.gemm(cp[0], cp[1], cp[2], bias=cp[3], **kw)
        same = c is None or got is cp[2]
        got = torch.as_tensor(got, device="cuda")
    else:
        got = lib.gemm(a, b, c, bias=bias, **kw)
        same = c is None or got is c
    torch.cuda.synchronize()
    return got, same, _reference(torch, a, b, p.alpha, p.beta, c0, bias, p.act)


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A copy of the committed library: first-use decisions write its dispatch table."""
    from tuner.runtime.library import load_library

    d = tmp_path_factory.mktemp("fuzz") / "library"
    shutil.copytree(ROOT / "artifacts" / "library", d)
    return load_library(d)


def test_random_problems_through_the_committed_library(committed):
    import torch

    from tuner.bench import error_floor
    from tuner.runtime.operands import out_dtype

    seed = int(os.environ.get("GEMM_TUNE_FUZZ_SEED", "0")) or random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    failures, ran = [], {}
    served = committed.fast.stats()["hits"] if committed.fast is not None else 0
    for i in range(PROBLEMS):
        p = draw(rng)
        committed.plans.clear()  # so that the one plan made below says what ran
        # twice, on fresh operands: the second call of a torch caller's key with no flags
        # is the C++ path's (tuner.runtime.fast) where it serves the call
        for call in (1, 2):
            try:
                got, same, ref = run(torch, committed, p)
            except Exception as e:  # noqa: BLE001: every drawn request is one the API serves
                failures.append(f"#{i} call {call} {p}: {type(e).__name__}: {e}")
                break
            plans = list(committed.plans.values())
            ran[i] = (plans[0].choice.kernel or "cuBLAS") if len(plans) == 1 else "unmemoised"
            wrong = _wrong(torch, p, got, same, ref, error_floor, out_dtype)
            if wrong:
                failures.append(f"#{i} call {call} {p} ran {ran[i]}: {'; '.join(wrong)}")
    what = collections.Counter(name.split("_")[1] if name.startswith("gemm_") else name
                               for name in ran.values())
    served = (committed.fast.stats()["hits"] if committed.fast is not None else 0) - served
    print(f"seed {seed}: {PROBLEMS} problems, each called twice, {len(failures)} failed; "
          f"{served} calls served by the C++ path; ran: "
          + ", ".join(f"{n} {k}" for k, n in what.most_common()))
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)


def _wrong(torch, p: Problem, got, same: bool, ref, error_floor, out_dtype) -> list[str]:
    """What is wrong with C as lib.gemm returned it for `p` (empty: nothing)."""
    norm = max(ref.norm().item(), error_floor(out_dtype(c_type(p)), ref.numel()))
    err = (got.double() - ref).norm().item() / norm
    wrong = []
    if tuple(got.shape) != tuple(ref.shape) or got.dtype != getattr(torch, c_type(p)):
        wrong.append(f"C is {tuple(got.shape)} {got.dtype}")
    if got.isnan().any() and not ref.isnan().any():
        wrong.append("C not fully written")
    if not err <= gate(p):
        wrong.append(f"error {err:.3g} > gate {gate(p):.3g}")
    if not same:
        wrong.append("the C passed in was not returned")
    return wrong
