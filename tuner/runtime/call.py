"""The call path of Library.gemm: operands -> memoised plan -> launch on the caller's stream.

A plan is made once per call key, which for torch tensors is the tuple of what a call
reads off them anyway (dtypes, shapes, strides, devices and the pointers' alignment, and
the request: output type, bias, activation), so a repeated call costs a tuple, one dict
lookup, the raw current-stream handle, one context check and one cuLaunchKernel. Other
operand kinds are parsed in full on every call (a few microseconds more) and keyed by
what the parse found.

What a call asks is a problem of a variant (codegen's Variant: how A and B are stored,
C's type, the bias and the activation) and a batch; only kernels built for exactly that
variant serve it (tuner.runtime.dispatch). Where cuBLAS runs instead, it computes the
same thing:
  - a torch caller on torch's current stream whose C has the inputs' type (fp32 C for
    fp32 data, at torch's own TF32 setting): torch itself, as that caller would have
    written it: torch.matmul / addmm (bias fused where it is of C's type) / bmm /
    baddbmm into C, then the bias and the activation in place (torch.nn.functional);
  - anyone else: gemm-tune's cuBLAS binding (cublasGemmEx, cublasGemmStridedBatchedEx
    for a batch) writing C directly where cuBLAS can (C of the inputs' type, or fp32, and
    no bias or activation), else into fp32 (C itself, or per-stream scratch for a 16-bit
    C) followed by gemm-tune's epilogue kernel (tuner.runtime.epilogue: the bias, the
    activation and the one rounding to C's type, the tuned kernels' own arithmetic).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from typing import Callable

import numpy as np

from codegen.config import DType, Layout
from codegen.families._common import ACTIVATIONS, MAX_DIM, Variant
from tuner.runtime import driver, fast
from tuner.runtime.errors import LibraryError, Unsupported
from tuner.runtime.manifest import static_b_twin
from tuner.runtime.operands import (
    Operand, align_class, bias_operand, empty_like, operand, out_dtype, resolve_stream,
    same_device, stream_handle,
)

__all__ = ["Plan", "Problem", "Request", "EmptyProblem", "gemm", "gemm_batch", "fp32_request",
           "check_call", "request", "torch_linear"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything about a call that its key fixes."""

    gpu: driver.Gpu
    dtype: DType  # what runs: F32, TF32, F16 or BF16
    m: int
    n: int
    k: int
    choice: object  # dispatch.Choice
    run: Callable | None  # (a, b, c, alpha, beta, stream, bias=0) -> None, on pointers
    memo: bool  # False: decided by the estimate only because a graph was being captured
    #: (A, B, C, alpha, beta, bias): cuBLAS through torch, bias and activation after it
    torch_run: Callable | None = None
    problem: "Problem | None" = None  # what it was built from
    out: DType = DType.F32  # C's type
    #: the shape of a C the call allocates, (M, N) or (batch, M, N): its problem's C's
    out_shape: tuple = ()
    #: rows -> the plan running the same choice on a chunk of that many packed rows
    chunks: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    #: the call counter of a recorded problem (tuner.runtime.record), or None
    tally: list | None = dataclasses.field(default=None, compare=False, repr=False)

    def chunk(self, lib, rows: int, k: int | None = None) -> "Plan":
        """This plan's choice (the same kernel) on `rows` packed rows of A and C, over a
        K-slice `k` columns wide of A (packed too) and as many rows of B where given."""
        k = self.k if k is None else k
        p = self.chunks.get((rows, k))
        if p is None:
            problem = dataclasses.replace(self.problem, m=rows, k=k, lda=k, ldb=self.n,
                                          ldc=self.n, offsets=(0, 0, 0))
            p = self.chunks[rows, k] = problem.build(lib, self.choice)
        return p


@dataclasses.dataclass(frozen=True)
class Request:
    """What a call asks, its operands read and checked: the problem's size, C's type, the
    bias and the activation (the variant with the operands' layout)."""

    m: int
    n: int
    k: int
    batch: int
    out: DType
    bias: Operand | None
    bias_kind: str  # "none", "out" (of C's type) or "f32"
    act: str
    batched: bool  # an operand of 3-D or more: C (allocated) is lead x M x N
    lead: tuple = ()  # C's batch dimensions, those of A and B broadcast (() for matrices)

    def variant(self, a: Operand, b: Operand) -> Variant:
        return Variant(Layout.of(a.column_major, b.column_major), self.out, self.bias_kind,
                       self.act)


def _torch_tf32() -> bool:
    """Does torch let its fp32 matmuls use TF32 (torch.backends.cuda.matmul.allow_tf32)?"""
    import torch

    return torch.backends.cuda.matmul.allow_tf32


def torch_epilogue(C, bias, act: str, inplace: bool = True):
    """C + bias (broadcast over the rows), then the activation, through torch (what a torch
    program writes after its matmul); returns the result. The bias is added in place; the
    activation too (`inplace`: C is the caller's), else out of place, as
    F.gelu(F.linear(...)) runs it, for a C the call allocated itself: after a large GEMM an
    in-place GELU measured 0.13-0.18 ms more than torch's out-of-place one on the H200
    (8192 x 14336 and 8192 x 4096 outputs, fp16 and bf16; bench/NOTES.md, "Ninth session")."""
    import torch
    import torch.nn.functional as F

    if bias is not None:
        C.add_(bias)
    if act == "relu":
        return torch.relu_(C) if inplace else torch.relu(C)
    if act == "silu":
        return F.silu(C, inplace=inplace)
    if act in ("gelu", "gelu_tanh"):
        return _gelu(C, "tanh" if act == "gelu_tanh" else "none", inplace)
    return C


#: the activations cuBLASLt applies in its epilogue together with the bias, through
#: torch._addmm_activation(bias, A, B, use_gelu=...) on CUDA tensors: one kernel where
#: torch's F.linear and the activation are two, and C written once. Its GELU is the tanh
#: form on CUDA (cuBLASLt's, and torch's own where it runs addmm and the activation
#: instead: a single row), but the erf form on the CPU: CUDA tensors only.
LT_ACTIVATIONS = {"relu": False, "gelu_tanh": True}


def _gelu(C, approximate: str, inplace: bool):
    """GELU through torch's own binding (torch.ops.aten's dispatch costs a microsecond more
    a call), where this torch has it."""
    import torch

    if inplace:
        return getattr(torch._C._nn, "gelu_", torch.ops.aten.gelu_)(C, approximate=approximate)
    return getattr(torch._C._nn, "gelu", torch.ops.aten.gelu)(C, approximate=approximate)


def _torch_fallback(batch: int, act: str, matrices: bool, out_shape: tuple = ()) -> Callable:
    """cuBLAS through torch on its current stream: C = act(alpha A B + beta C + bias) (beta 0:
    C unread), with the calls such a caller would have made: torch.mm (alpha 1, beta 0:
    torch.matmul's own 2-D call, without its dispatch on rank), torch.addmm (the bias fused
    when it is of C's type and beta is 0; ReLU or GELU(tanh) as well where the call
    allocates C, by torch._addmm_activation: LT_ACTIVATIONS), torch.bmm / baddbmm for a
    batch (a 2-D operand expanded over it, no copy). `matrices`: A, B and C are all 2-D
    (the plan's key fixes every operand's rank). Returns C; with C None (the call allocates
    it: beta is 0) torch.mm, torch.bmm and addmm allocate it themselves, as torch.matmul
    does (one dispatch less than torch.empty and out=), others an `out_shape` tensor of A's
    type."""
    import torch

    mm, addmm, bmm, baddbmm = torch.mm, torch.addmm, torch.bmm, torch.baddbmm
    fused = act != "none"
    use_gelu = LT_ACTIVATIONS.get(act)  # None: the activation is torch's own op after

    def batched(X):  # X over the whole batch: 3-D as it is, else expanded (no copy)
        if X.dim() == 3 and X.shape[0] == batch:
            return X
        return (X if X.dim() == 3 else X.unsqueeze(0)).expand(batch, -1, -1)

    def run(A, B, C, alpha: float, beta: float, bias=None):
        if C is None:
            if alpha == 1.0 and bias is None:  # as torch.matmul: the product allocates C
                C = mm(A, B) if matrices else bmm(batched(A), batched(B))
            elif matrices and bias is not None and bias.dtype == A.dtype:
                if alpha == 1.0 and use_gelu is not None and A.is_cuda:  # in cuBLASLt
                    return torch._addmm_activation(bias, A, B, use_gelu=use_gelu)
                C = addmm(bias, A, B) if alpha == 1.0 else addmm(bias, A, B, alpha=alpha)
                bias = None
            else:
                return run(A, B, torch.empty(out_shape, dtype=A.dtype, device=A.device),
                           alpha, 0.0, bias)
            return torch_epilogue(C, bias, act, inplace=False) if bias is not None or fused \
                else C
        if matrices and alpha == 1.0 and beta == 0.0 and bias is None:
            mm(A, B, out=C)  # the common call first: the host sets a small call's time
        elif not matrices:
            A3, B3 = batched(A), batched(B)
            C3 = C if C.dim() == 3 else C.unsqueeze(0)
            if alpha == 1.0 and beta == 0.0:
                bmm(A3, B3, out=C3)
            else:
                baddbmm(C3, A3, B3, beta=beta, alpha=alpha, out=C3)
        elif bias is not None and beta == 0.0 and bias.dtype == C.dtype:
            addmm(bias, A, B, alpha=alpha, out=C)
            bias = None
        else:
            addmm(C, A, B, beta=beta, alpha=alpha, out=C)
        if bias is not None or fused:
            torch_epilogue(C, bias, act)
        return C
    return run


#: torch.Tensor and nn.Parameter (a layer's weight or bias, as torch's ops take them), once
#: a torch tensor has been seen
_TENSORS: tuple = ()
_TF32 = None  # torch's fp32-matmul TF32 flag, read cheaply, once torch has been seen
_GRAD = None  # torch.is_grad_enabled, once torch has been seen
_DEVICE = None  # torch's current device (torch._C._cuda_getDevice), once torch has been seen
_TORCH_OUT = {}  # DType -> torch dtype, once torch has been seen
_F_LINEAR = None  # torch.nn.functional.linear, once torch has been seen
_ADDMM_ACT = None  # torch._addmm_activation (LT_ACTIVATIONS), once torch has been seen


def _scalars(alpha, beta) -> None:
    """LibraryError unless alpha and beta are real numbers (a bool is taken for a flag
    passed in alpha's place: lib.gemm(A, B, C, True))."""
    for name, x in (("alpha", alpha), ("beta", beta)):
        if type(x) is not float and type(x) is not int \
                and (isinstance(x, bool) or not isinstance(x, numbers.Real)):
            raise LibraryError(f"{name} must be a real number (got {type(x).__name__} {x!r:.40})")


def gemm(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline=True, out=None,
         bias=None, act=None, fast: int | None = None, static_b: bool = False):
    """Library.gemm (see its doc). `fast`: the context word of a call the C++ path
    (tuner.runtime.fast) may serve next time: its plan is offered to it. `static_b`: the
    caller's promise that B is not written by the work ahead of the call on its stream."""
    _scalars(alpha, beta)
    if C is None and beta != 0:
        raise LibraryError("beta != 0 needs a C to read")
    if _vectors(A, B):
        return _vector_call(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline, out,
                            bias, act, static_b=static_b)
    t = type(A)
    if not _TENSORS and t.__module__.startswith("torch") \
            and t.__name__ in ("Tensor", "Parameter"):
        _see_torch()
    tensors = _TENSORS
    try:
        if t in tensors and type(B) in tensors and (C is None or type(C) in tensors) \
                and (bias is None or type(bias) in tensors):
            if _GRAD() and (A.requires_grad or B.requires_grad or (
                    C is not None and C.requires_grad) or (
                    bias is not None and bias.requires_grad)):
                return _autograd_call(A, B, C, alpha, stream, out, bias, act)
            return _torch_call(lib, A, B, C, alpha, beta, mode, stream, measure, out, bias,
                               act, fast, static_b)
        return _general_call(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline, out,
                             bias, act, static_b)
    except EmptyProblem as e:  # raised by request(), before any plan: nothing has run
        return _empty_call(e, C, beta, stream)


def _shape(x) -> tuple | None:
    """An operand's shape (None for what has none: gemm then says what it takes)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = (getattr(x, "__cuda_array_interface__", None) or {}).get("shape")
    return None if shape is None else tuple(shape)


def _vectors(A, B) -> bool:
    """Is A or B a vector (1-D), both arrays (gemm refuses what is not one)? (ndim first:
    every call asks, and torch, numpy, cupy and pycuda arrays have it)"""
    ra, rb = getattr(A, "ndim", None), getattr(B, "ndim", None)
    if ra is not None and rb is not None:
        return ra == 1 or rb == 1
    sa, sb = _shape(A), _shape(B)
    return sa is not None and sb is not None and 1 in (len(sa), len(sb))


def _reshaped(x, shape, name: str):
    """x as `shape`: a unit dimension added or dropped, a view of the same memory."""
    try:
        return x.reshape(shape)
    except AttributeError:
        raise LibraryError(f"{name} is a vector of {type(x).__name__}, which has no reshape: "
                           "pass it as a matrix (1 x K, or K x 1)") from None


def _as_matrices(A, B, C):
    """torch.matmul's vectors as matrices: a 1-D A (K) is one row, 1 x K; a 1-D B (K) one
    column, K x 1; a given C is of the product's shape, which loses that dimension again
    (both vectors: a 0-D dot product). Returns (A, B, C as matrices, the product's shape
    without them: a function of the matrices' product's shape)."""
    sa, sb = _shape(A), _shape(B)
    for name, shape in (("A", sa), ("B", sb)):
        if not shape:
            raise LibraryError(f"{name} is 0-D: A and B have a dimension at least (a vector), "
                               "as torch.matmul's")
    va, vb = len(sa) == 1, len(sb) == 1
    A2 = _reshaped(A, (1, *sa), "A") if va else A
    B2 = _reshaped(B, (*sb, 1), "B") if vb else B

    def drop(shape: tuple) -> tuple:  # the matrices' product's shape -> torch.matmul's
        return () if va and vb else shape[:-2] + shape[-1:] if va else shape[:-1]

    if C is None:
        return A2, B2, None, drop
    sc, rank = _shape(C), 0 if va and vb else len(sb) - 1 if va else len(sa) - 1
    if sc is None:  # not an array: the operand parse says what C must be
        return A2, B2, C, drop
    if len(sc) != rank:
        raise LibraryError(f"C is {'x'.join(map(str, sc))} ({len(sc)}-D); with "
                           f"{'A' if va else 'B'} a vector, A @ B is {rank}-D, as torch.matmul's")
    shape = (1, 1) if va and vb else sc[:-1] + (1, sc[-1]) if va else sc + (1,)
    return A2, B2, _reshaped(C, shape, "C"), drop


def _vector_call(lib, A, B, C, *args, **kw):
    """A call with a vector operand (`_as_matrices`) run as the matrices' call (views, no
    copy; the C++ path takes none of them): C as given, or the product of its shape."""
    A2, B2, C2, drop = _as_matrices(A, B, C)
    R = gemm(lib, A2, B2, C2, *args, **kw)
    return C if C is not None else _reshaped(R, drop(_shape(R)), "C")


def _autograd_call(A, B, C, alpha, stream, out, bias, act):
    """A torch call that autograd records (gradients enabled, an input requiring one): run
    by torch's own ops, so that gradients flow as through torch.matmul: act(alpha A @ B +
    bias), in C's type (a C of another type than the inputs' computed in fp32). The call is
    checked as any other first; a C passed in is refused, as torch.matmul refuses out=
    where autograd records. (The tuned kernels have no backward; under torch.no_grad() or
    torch.inference_mode() they run.)"""
    import contextlib

    import torch

    ops = (operand(A, "A", inputs=True), operand(B, "B", inputs=True))
    try:
        req = request(*ops, None, out, bias, act)
    except EmptyProblem as e:  # (torch's ops answer an empty problem as torch.matmul)
        req = e.req
    if C is not None:
        raise LibraryError("C is given while autograd records the call (an input requires "
                           "grad): a C passed in takes no gradient, as torch.matmul's out= "
                           "takes none; pass no C, or call under torch.no_grad()")
    dtype = _TORCH_OUT[req.out]
    with contextlib.nullcontext() if stream is None else \
            torch.cuda.stream(torch.cuda.ExternalStream(stream_handle(stream))):
        if dtype is not A.dtype:  # one rounding, to C's type, as the kernels round
            A, B = A.float(), B.float()
        y = torch.matmul(A, B)
        if alpha != 1:
            y = y * alpha
        if bias is not None:
            y = y + bias
        F = torch.nn.functional
        y = {"none": lambda x: x, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[req.act](y)
        return y.to(dtype)


def fp32_request(dtype: DType, mode: DType | None) -> DType:
    """What a call asks for: fp32 data under `mode` (TF32 or F32X3: the caller's
    allow_tf32 / allow_3xtf32) is that request; other data is its own type."""
    return mode if mode is not None and dtype is DType.F32 else dtype


def _see_torch() -> None:
    """Bind torch's cheap accessors, once torch tensors are seen."""
    global _TENSORS, _TF32, _DEVICE, _F_LINEAR, _ADDMM_ACT, _GRAD
    import torch

    _GRAD = torch.is_grad_enabled
    _TF32 = getattr(torch._C, "_get_cublas_allow_tf32", _torch_tf32)
    _DEVICE = torch._C._cuda_getDevice
    _TORCH_OUT.update({DType.F32: torch.float32, DType.F16: torch.float16,
                       DType.BF16: torch.bfloat16})
    _TENSORS = (torch.Tensor, torch.nn.Parameter)
    _F_LINEAR = torch.nn.functional.linear
    _ADDMM_ACT = torch._addmm_activation


def _torch_key(A, B, C, mode, measure, stream, out=None, bias=None, act=None,
               static_b=False):
    """The memo key of a torch call: what the call reads off its tensors anyway, and the
    request's arguments as given."""
    pa, pb = A.data_ptr(), B.data_ptr()
    if C is None:
        ckey, pc = None, 0
    else:
        pc = C.data_ptr()
        ckey = (C.dtype, C.shape, C.stride(), C.get_device(), pc & 15)
    key = ("torch", A.dtype, B.dtype, A.shape, B.shape, A.stride(), B.stride(), A.get_device(),
           B.get_device(), pa & 15, pb & 15, ckey, mode, measure, stream is None,
           _TF32(), out, act,
           None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.get_device()))
    if static_b:
        key += ("static B",)
    return key, pa, pb, pc


def _torch_call(lib, A, B, C, alpha, beta, mode, stream, measure, out, bias, act,
                fast=None, static_b=False):
    rows = _rows(A, B, C)
    if rows is None and max(A.dim(), B.dim(), 0 if C is None else C.dim()) > 3:
        return _torch_batches(lib, A, B, C, alpha, beta, mode, stream, measure, out, bias,
                              act, static_b)
    A2, C2 = (A, C) if rows is None else rows
    key, pa, pb, pc = _torch_key(A2, B, C2, mode, measure, stream, out, bias, act, static_b)
    plan = lib.plans.get(key)
    s = None
    if plan is None:
        plan, s = _torch_plan(lib, key, A2, B, C2, mode, stream, measure, out, bias, act, fast,
                              static_b)
    R = _torch_run(plan, A2, B, C2, alpha, beta, bias, pa, pb, pc, stream, s)
    if fast is not None:
        _offer(lib, key, plan, A, B, C, bias, fast)
    if rows is not None and C is None:  # x's leading dimensions again
        return R.view(*A.shape[:-1], R.shape[-1])
    return C if rows is not None else R


def _torch_batches(lib, A, B, C, alpha, beta, mode, stream, measure, out, bias, act,
                   static_b):
    """A torch call with several batch dimensions (2 x 3 problems, say) that do not fold
    into x's rows: one batch of their problems, each operand viewed as a 3-D batch (its
    batch dimensions checked first: one stride between its problems, and broadcasting as
    torch.matmul's); C, if allocated, of the batch dimensions again. The Python path
    serves it (the C++ path takes matrices and x @ W)."""
    ops = (operand(A, "A", inputs=True), operand(B, "B", inputs=True),
           None if C is None else operand(C, "C", writable=True))
    lead = check_call(*ops)[4]

    def as_batch(X):
        return X if X is None or X.dim() < 4 else X.view(-1, *X.shape[-2:])

    R = _torch_call(lib, as_batch(A), as_batch(B), as_batch(C), alpha, beta, mode, stream,
                    measure, out, bias, act, static_b=static_b)
    return C if C is not None else R.view(*lead, *R.shape[-2:])


def _rows(A, B, C):
    """(A's rows as one matrix, C's likewise) for a batch of x (3-D or more) times one
    matrix W (2-D), where both fold without a copy; else None. torch.matmul runs x @ W so,
    one product of all of x's rows: W is read once, and the rows fill whole tiles, where a
    batch of problems each M rows high (B shared at a batch stride of 0) would read W per
    problem and round each M up to a tile. fast.cpp's torch_call folds the same calls."""
    if A.dim() < 3 or B.dim() != 2 or not A.numel() or not B.numel() \
            or (C is not None and C.shape[:-1] != A.shape[:-1]):
        return None  # (an empty problem answers as the batch it is; a C of another shape
        # is refused as one)
    try:
        return A.view(-1, A.shape[-1]), None if C is None else C.view(-1, C.shape[-1])
    except RuntimeError:  # not one matrix without a copy: a batch of problems
        return None


def _fold_rows(a: Operand, b: Operand, c: Operand | None):
    """_rows for operands of any kind: (a, c) with a batch of A (and of C) that meets one B
    folded into one matrix of their rows, where they fold without a copy (row-major, each
    problem's rows right after the last one's, as x.view(-1, K) takes them); else None.
    (A batch is of device arrays: numpy operands are matrices.)"""
    def rows(o: Operand) -> Operand | None:
        if o.column_major:
            return None
        if o.batch == 1 or o.bstride == o.rows * o.ld:
            ld = o.ld
        elif o.rows == 1:  # one row a problem: the problems are the rows
            ld = o.bstride
        else:
            return None
        return dataclasses.replace(o, rows=o.batch * o.rows, ld=ld, batch=1, bstride=0,
                                   batched=False, lead=())

    if not a.batched or b.batched or (c is not None and (c.lead, c.rows) != (a.lead, a.rows)) \
            or 0 in (a.batch, a.rows, a.cols, b.cols):  # (an empty problem stays a batch)
        return None
    a2, c2 = rows(a), None if c is None else rows(c)
    return None if a2 is None or (c is not None and c2 is None) else (a2, c2)


def _offer(lib, key, plan, A, B, C, bias, ctx: int) -> None:
    """Offer a torch call's plan to the C++ path, once per C++ key: the plan's key, the
    stream, the context word and what fast.cpp's key reads of the operands that the plan's
    key may not (:func:`_operand_features`: a linear's x of (1, T, K) and one of (T, K)
    share a plan, but not a C++ key)."""
    keys = getattr(lib, "fast_keys", None)
    if keys is None:  # (a stand-in for a Library)
        return
    t = fast.table(lib)
    if t is None:  # not loaded (yet: offered on a later call), or off
        return
    import torch

    s = torch._C._cuda_getCurrentRawStream(plan.gpu.index)
    seen = (key, s, ctx, _operand_features(A, B, C, bias))
    if seen in keys:
        return
    keys.add(seen)
    try:
        with driver.entered(plan.gpu):
            fast.offer(t, lib, plan, A, B, C, bias, ctx, s)
    except Exception as e:  # noqa: BLE001 - the Python path goes on serving the key
        log.warning("gemm-tune: the C++ path does not take %s: %s",
                    plan.choice.kernel or "cuBLAS", e)


def _operand_features(*tensors) -> tuple:
    """Each operand's shape, strides and address modulo 16, as fast.cpp's key reads them
    (features()), None for one not given."""
    return tuple(None if t is None else (tuple(t.shape), t.stride(), t.data_ptr() & 15)
                 for t in tensors)


def _torch_plan(lib, key, A, B, C, mode, stream, measure, out, bias, act, fast=None,
                static_b=False):
    """(the plan of a torch call of memo key `key`, memoised where it may be; its stream).
    `fast`: the context word under which later calls of the key may take the C++ path
    (its candidates are timed so)."""
    ops = (operand(A, "A", inputs=True), operand(B, "B", inputs=True),
           None if C is None else operand(C, "C", writable=True))
    req = request(*ops, out, bias, act)
    dev = same_device(*(o for o in ops + (req.bias,) if o is not None))
    s = resolve_stream(stream, ops[:2], dev)
    plan = _plan(lib, *ops, req, mode, measure, dev, s, allocate=_torch_allocator(A),
                 torch_stream=stream is None, torch_tf32=key[15], fast=fast, static_b=static_b)
    if plan.memo:
        lib.plans[key] = plan
    return plan, s


def _torch_run(plan, A, B, C, alpha, beta, bias, pa, pb, pc, stream, s=None):
    """Run a torch call's plan on its operands (pointers pa, pb, pc; `s` the stream, or None:
    torch's current one, or `stream`'s)."""
    if plan.tally is not None:
        plan.tally[0] += 1
    if plan.torch_run is not None:
        return plan.torch_run(A, B, C, alpha, beta, bias)
    if C is None:
        import torch

        C = torch.empty(plan.out_shape, dtype=_TORCH_OUT[plan.out], device=A.device)
        pc = C.data_ptr()
    g = plan.gpu
    if s is None:
        import torch

        s = torch._C._cuda_getCurrentRawStream(g.index) if stream is None \
            else stream_handle(stream)
    pbias = 0 if bias is None else bias.data_ptr()
    if _DEVICE() == g.index:  # torch's device is current: launch; if no context is, retry
        try:
            plan.run(pa, pb, pc, alpha, beta, s, pbias)
            return C
        except driver.DriverError as e:
            if "CONTEXT" not in str(e) and "INVALID_HANDLE" not in str(e):
                raise
    with driver.entered(g):
        plan.run(pa, pb, pc, alpha, beta, s, pbias)
    return C


#: the most call keys one caller's memo (torch_linear) keeps before it starts again
LINEAR_MEMO = 256


def torch_linear(lib, memo: dict, x, W, B, bias, act, w_at: tuple | None = None,
                 static_b: bool = False):
    """act(x @ W.t() + bias) through the library for a caller that passes the same weight W
    (B: its view W.t(), the same object while W's storage and shape stay) and bias on
    every call, as a patched nn.Linear does; x of any rank whose leading dimensions fold
    into rows without a copy (else None: the caller folds it). On torch's current stream.

    The call's key is kept in the caller's `memo` under x's geometry and W's and the
    bias's pointers, so a repeated call reads x's shape, strides, type, device and pointer
    and two pointers instead of every attribute of every operand. The plan stays in
    lib.plans (a recording, which makes plans afresh, sees these calls too). Where cuBLAS
    runs through torch and the bias is of x's type, the call is torch's own
    F.linear(x, W, bias) (x as it is, no view), the activation after it as torch's
    F.gelu(F.linear(...)) (out of place: see torch_epilogue), except ReLU and GELU(tanh)
    with a bias: one cuBLASLt call with both in its epilogue (LT_ACTIVATIONS).
    `w_at`: (W.data_ptr(), W.shape), where the caller has read them already (B a view of
    W: the same pointer). `static_b`: the caller's promise that W is constant (gemm's)."""
    if not _TENSORS:
        _see_torch()
    pb, wshape = w_at if w_at is not None else (B.data_ptr(), W.shape)
    px = x.data_ptr()
    mkey = (x.shape, x.stride(), x.dtype, x.get_device(), px & 15, pb, wshape,
            None if bias is None else (bias.data_ptr(), bias.dtype), _TF32())
    hit = memo.get(mkey)
    plan = None if hit is None else lib.plans.get(hit[0])
    if plan is None:
        try:
            x2 = x if x.dim() == 2 else x.view(-1, x.shape[-1])
        except RuntimeError:  # not one matrix without a copy
            return None
        key = _torch_key(x2, B, None, None, lib.measure, None, None, bias, act, static_b)[0]
        plan = lib.plans.get(key)
        if plan is None:
            try:
                plan = _torch_plan(lib, key, x2, B, None, None, None, lib.measure, None,
                                   bias, act, static_b=static_b)[0]
            except EmptyProblem:  # nothing to multiply: the caller's lib.gemm answers it
                return None
        hit = (key, (*x.shape[:-1], B.shape[1]))
        if plan.memo:
            if len(memo) >= LINEAR_MEMO:
                memo.clear()
            memo[mkey] = hit
    _offer(lib, hit[0], plan, x, W, None, bias, fast.context(lib.measure, act, True, static_b))
    if plan.torch_run is not None:
        if bias is None or bias.dtype is x.dtype:
            if plan.tally is not None:
                plan.tally[0] += 1
            if bias is not None and act in LT_ACTIVATIONS:  # one cuBLASLt call (_torch_fallback)
                return _ADDMM_ACT(bias, x if x.dim() == 2 else x.view(-1, x.shape[-1]), B,
                                  use_gelu=LT_ACTIVATIONS[act]).view(hit[1])
            y = _F_LINEAR(x, W, bias)
            return y if act is None or act == "none" else torch_epilogue(y, None, act, False)
        rows = x.view(-1, x.shape[-1])  # (a bias of another type than x: torch's route)
        return _torch_run(plan, rows, B, None, 1.0, 0.0, bias, px, pb, 0, None).view(hit[1])
    C = x.new_empty(hit[1], dtype=_TORCH_OUT[plan.out])
    return _torch_run(plan, x, B, C, 1.0, 0.0, bias, px, pb, C.data_ptr(), None)


def offer_linear(lib, x, W, bias, act, static_b: bool = False) -> None:
    """After a linear call the Python path served through lib.gemm(x's rows, W.t(), bias,
    act) (torch_ops.linear), offer its plan to the C++ path under the linear call's key."""
    if getattr(lib, "fast_keys", None) is None or x.dim() < 2:
        return
    B = W.t()
    try:
        x2 = x if x.dim() == 2 else x.view(-1, x.shape[-1])
    except RuntimeError:  # not one matrix without a copy: no linear key
        return
    key = _torch_key(x2, B, None, None, lib.measure, None, None, bias, act, static_b)[0]
    plan = lib.plans.get(key)
    if plan is not None:
        _offer(lib, key, plan, x, W, None, bias,
               fast.context(lib.measure, act, True, static_b))


def _torch_allocator(A):
    """Graph-safe scratch for torch callers: torch's caching allocator, which serves a
    capture from the graph's private pool."""
    import torch

    device = A.device

    def allocate(nbytes: int):
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return t.data_ptr(), t

    return allocate


def _general_plan(lib, A, B, C, mode, stream, measure, out=None, bias=None, act=None,
                  static_b=False):
    """(plan, operands a, b, c, bias, stream) of a call with operands of any kind but
    torch's fast path: each parsed in full, the plan memoised on what the parse found."""
    a, b = operand(A, "A", inputs=True), operand(B, "B", inputs=True)
    c = None if C is None else operand(C, "C", writable=True)
    rows, shape = _fold_rows(a, b, c), None
    if rows is not None:  # x @ W over a batch: one product of x's rows, as torch.matmul
        shape = (*a.lead, a.rows, b.cols)
        a, c = rows
    ops = (a, b) if c is None else (a, b, c)
    req = request(a, b, c, out, bias, act)
    if len(req.lead) > 1:  # several batch dimensions, run as one batch of their problems
        shape = (*req.lead, req.m, req.n)
    dev = same_device(*ops, *(() if req.bias is None else (req.bias,)))
    host = a.host is not None or b.host is not None or (c is not None and c.host is not None)
    if dev is None:
        dev = driver.current_device()
    s = resolve_stream(stream, ops, dev)
    key = ("general", dev, a.dtype, b.dtype,
           *((o.rows, o.cols, o.ld, o.column_major, o.batch, o.bstride, o.batched)
             for o in (a, b)),
           None if c is None else (c.rows, c.cols, c.ld, c.host is None, c.batch, c.bstride,
                                   c.batched, c.dtype), host,
           tuple(align_class(o.ptr or 0, o.ld, o.dtype.size, o.bstride) for o in ops),
           mode, measure, req.out, req.bias_kind, req.act, static_b)
    plan = lib.plans.get(key)
    if plan is None:
        allocate = _torch_allocator(A) if a.kind == "torch" else None
        plan = _plan(lib, a, b, c, req, mode, measure, dev, s, allocate=allocate,
                     static_b=static_b)
        if plan.memo:
            lib.plans[key] = plan
    return plan, a, b, c, req.bias, s, shape


def _general_call(lib, A, B, C, alpha, beta, mode, stream, measure, pipeline=True, out=None,
                  bias=None, act=None, static_b=False):
    plan, a, b, c, bop, s, shape = _general_plan(lib, A, B, C, mode, stream, measure, out,
                                                 bias, act, static_b)
    if plan.tally is not None:
        plan.tally[0] += 1
    if C is None:
        C = empty_like(a, plan.out_shape, plan.gpu.index, plan.out)
        c = operand(C, "C", writable=True)
        if shape is not None:  # C of the caller's batch dimensions (a fold's rows, or a
            C = C.reshape(shape)  # batch of several dimensions run as one)
    pbias = 0 if bop is None else bop.ptr
    g = plan.gpu
    with driver.entered(g):
        if all(o.host is not None for o in (a, b, c)):
            from tuner.runtime.host import run_pipelined

            run_pipelined(g, lambda rows, k=None: plan.chunk(lib, rows, k), a.host, b.host,
                          c.host, alpha, beta, chunks=None if pipeline else [(0, plan.m)],
                          pinned_staging=pipeline != "pageable", bias=pbias,
                          k_slices=plan.out is DType.F32 and plan.problem.epilogue == "none")
        elif a.host is not None or b.host is not None or c.host is not None:
            _staged(plan, a, b, c, alpha, beta, s, pbias)
        else:
            plan.run(a.ptr, b.ptr, c.ptr, alpha, beta, s, pbias)
    return C


def gemm_batch(lib, pairs, alpha, beta, outs, mode, measure):
    """Library.gemm_batch (see its doc)."""
    from tuner.runtime.host import run_batch

    _scalars(alpha, beta)
    pairs, outs = _batch_lists(pairs, outs)
    if beta != 0 and any(C is None for C in outs):
        raise LibraryError("beta != 0 needs a C to read: pass out=[C_0, C_1, ...]")
    items, results = [], []
    for (A, B), C in zip(pairs, outs):
        for x, name in ((A, "A"), (B, "B"), (C, "C")):
            if x is not None and not isinstance(x, np.ndarray):
                raise LibraryError(f"gemm_batch takes numpy arrays; {name} is "
                                   f"{type(x).__name__} (lib.gemm runs device arrays)")
        try:
            plan, a, b, c, _, _, _ = _general_plan(lib, A, B, C, mode, None, measure)
        except EmptyProblem as e:  # nothing to multiply: answered here, on the host
            results.append(_empty_call(e, C, beta, None))
            continue
        if C is None:
            C = np.empty((plan.m, plan.n), _ELEMENT[plan.out])
        items.append((plan, a.host, b.host, C))
        results.append(C)
    if items:
        g = items[0][0].gpu
        with driver.entered(g):
            run_batch(g, items, alpha, beta)
    return results


def _batch_lists(pairs, outs) -> tuple[list, list]:
    """gemm_batch's (A, B) pairs and its outputs (None each where not given) as lists of
    one length; LibraryError for anything else."""
    try:
        pairs = list(pairs)
        outs = [None] * len(pairs) if outs is None else list(outs)
    except TypeError:
        raise LibraryError(f"gemm_batch takes a list of (A, B) pairs and out a list of C "
                           f"(got {type(pairs).__name__} and {type(outs).__name__})") from None
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise LibraryError(f"gemm_batch's item {i} is not an (A, B) pair "
                               f"(got {type(pair).__name__})")
    if len(outs) != len(pairs):
        raise LibraryError(f"{len(outs)} outputs for {len(pairs)} (A, B) pairs")
    return pairs, outs


def _staged(plan: Plan, a: Operand, b: Operand, c: Operand, alpha, beta, s: int,
            bias: int = 0) -> None:
    """Host operands copied into per-stream device buffers, C copied back; synchronous."""
    ptrs = []
    for o in (a, b, c):
        if o.host is None:
            ptrs.append(o.ptr)
            continue
        host = np.ascontiguousarray(o.host)
        dptr = driver.scratch().get(plan.gpu, s, f"staged {o.name}", host.nbytes)
        if o.name != "C" or beta != 0:
            driver.call("cuMemcpyHtoDAsync", dptr, host.ctypes.data, host.nbytes, s)
        ptrs.append(dptr)
    plan.run(*ptrs, alpha, beta, s, bias)
    if c.host is not None:
        out = np.empty_like(c.host) if not c.host.flags.c_contiguous else c.host
        driver.call("cuMemcpyDtoHAsync", out.ctypes.data, ptrs[2], out.nbytes, s)
        driver.sync(s)
        if out is not c.host:
            c.host[...] = out
    else:
        driver.sync(s)  # the host inputs' staging buffers are reused by the next call


def check_call(a: Operand, b: Operand, c: Operand | None) -> tuple[int, int, int, int, tuple]:
    """M, N, K, the batch and C's batch dimensions of a call whose operands agree;
    LibraryError otherwise (no GPU touched). Batches: A's and B's of one size, or 1 (that
    operand shared by every problem); their batch dimensions broadcast as torch.matmul's
    (A of 2 x 3 problems with one B: C is 2 x 3 x M x N); C holds one M x N problem each,
    none overlapping another, under those batch dimensions where there are several."""
    if a.dtype is not b.dtype:
        raise LibraryError(f"A is {a.dtype.short} and B is {b.dtype.short}: "
                           "they must be of one type")
    if a.cols != b.rows:
        raise LibraryError(f"A is {_size(a)} and B is {_size(b)}: "
                           "A's columns must equal B's rows")
    m, n, k = a.rows, b.cols, a.cols
    if max(m, n, k) > MAX_DIM:
        raise LibraryError(f"A @ B is {m}x{n}x{k} (M x N x K): no size may exceed {MAX_DIM} "
                           "(the kernels' tile counts are 32-bit)")
    batch = 0 if 0 in (a.batch, b.batch) else max(a.batch, b.batch)
    if a.batch not in (1, batch) or b.batch not in (1, batch):
        raise LibraryError(f"A is a batch of {a.batch} and B a batch of {b.batch}: batches "
                           "must be of one size, or 1 (one matrix for every problem)")
    try:
        lead = a.lead if a.lead == b.lead or not b.lead else b.lead if not a.lead \
            else np.broadcast_shapes(a.lead, b.lead)
    except ValueError:  # (2 x 3 problems against 3 x 2: as many, but not the same ones)
        raise LibraryError(f"A is {_size(a)} and B is {_size(b)}: their batch dimensions "
                           "do not broadcast") from None
    if batch and math.prod(lead) != batch:  # (3 x 1 against 1 x 3: 9 problems from 3 and 3)
        raise LibraryError(
            f"A is {_size(a)} and B is {_size(b)}: their batch dimensions broadcast to "
            f"{'x'.join(map(str, lead))}, {math.prod(lead)} problems, where a strided batch "
            f"pairs A's {a.batch} with B's {b.batch} in step: expand one of them "
            "(torch_ops.matmul copies it)")
    if c is not None:
        nd = max(len(lead), len(c.lead)) > 1  # several batch dimensions: C must have them
        if (c.rows, c.cols) != (m, n) or c.batch != batch or (batch > 1 and not c.batched) \
                or (nd and c.lead != lead):
            want = "x".join(map(str, (*lead, m, n))) if batch > 1 or nd else f"{m}x{n}"
            raise LibraryError(f"C is {_size(c)}; A @ B is {want}")
        span = (m - 1) * c.ld + n
        if batch > 1 and c.bstride < span:
            raise LibraryError(f"C's problems are {c.bstride} elements apart and each spans "
                               f"{span}: every problem of the batch needs a C of its own")
    return m, n, k, batch, lead


def _size(o: Operand) -> str:
    return "x".join(map(str, (*o.lead, o.rows, o.cols)))


def _activation(act) -> str:
    if act is None:
        return "none"
    if act not in ACTIVATIONS:
        raise LibraryError(f"activation {act!r} is not one of {', '.join(ACTIVATIONS)}")
    return act


def request(a: Operand, b: Operand, c: Operand | None, out=None, bias=None,
            act=None) -> Request:
    """The checked request of a call. C's type: a given C's own (out_dtype, if given too,
    must name it), else `out` (out_dtype), else the inputs' type for fp16 and bf16 data
    (as torch.matmul) and fp32 for fp32 data."""
    m, n, k, batch, lead = check_call(a, b, c)
    want = out_dtype(out)
    if c is not None:
        if want is not None and c.dtype is not want:
            raise LibraryError(f"C is {c.dtype.short} but out_dtype asks for {want.short}: "
                               "pass a C of that type, or no out_dtype")
        want = c.dtype
    elif want is None:
        want = a.dtype if a.dtype in (DType.F16, DType.BF16) else DType.F32
    act = _activation(act)
    bop, kind = (None, "none") if bias is None else bias_operand(bias, n, want)
    batched = a.batched or b.batched or (c is not None and c.batched)
    req = Request(m, n, k, batch, want, bop, kind, act, batched, lead)
    if not (m and n and k and batch):
        raise EmptyProblem(a, b, c, req)
    return req


class EmptyProblem(Exception):
    """A checked call with nothing to multiply: M, N, K or the batch is 0 (what `request`
    raises instead of returning; gemm answers it with :func:`_empty_call`)."""

    def __init__(self, a: Operand, b: Operand, c: Operand | None, req: Request):
        super().__init__(f"an empty problem: {req.batch}x{req.m}x{req.n}x{req.k}")
        self.a, self.b, self.c, self.req = a, b, c, req


def _empty_call(e: EmptyProblem, C, beta: float, stream):
    """What gemm returns for an empty problem, as torch.matmul and BLAS do: with M, N or
    the batch 0, C as it is (or allocated, with no elements) and nothing run; with K = 0
    (A B has no terms), C = act(beta C + bias), in FP32 before the one rounding to C's
    type as the kernels' epilogue: through torch's own ops for a torch C, numpy's for a
    numpy C, gemm-tune's epilogue kernel on a zero product for other device arrays; on
    the call's stream."""
    a, c, req = e.a, e.c, e.req
    ops = tuple(o for o in (a, e.b, c, req.bias) if o is not None)
    dev = same_device(*ops)
    kind = a.kind if c is None else c.kind  # (a C the call allocates is of A's kind)
    if C is None:
        shape = (*req.lead, req.m, req.n)
        on = dev if dev is not None or kind in ("torch", "numpy") else driver.current_device()
        C, beta = empty_like(a, shape, on, req.out), 0.0
    if not (req.m and req.n and req.batch):  # C has no elements: nothing to compute
        return C
    bias, act = req.bias, req.act
    if kind == "torch":
        import contextlib

        import torch

        with contextlib.nullcontext() if stream is None else \
                torch.cuda.stream(torch.cuda.ExternalStream(stream_handle(stream))):
            if beta == 0:
                C.zero_()  # (C unread: a NaN in it stays out)
            if beta not in (0, 1) or bias is not None or act != "none":
                R = C.float() * beta
                if bias is not None:
                    R += bias.obj.float()
                C.copy_(torch_epilogue(R, None, act))
        return C
    if kind == "numpy":
        R = C.astype(np.float32) * np.float32(beta) if beta != 0 else \
            np.zeros(C.shape, np.float32)
        if bias is not None:
            R += _host_vector(bias)
        C[...] = _numpy_activation(R, act)
        return C
    dev = driver.current_device() if dev is None else dev
    g = driver.gpu(dev)
    s = resolve_stream(stream, tuple(o for o in (a, e.b, c) if o is not None), dev)
    c = c or operand(C, "C", writable=True)
    from tuner.runtime.epilogue import epilogue_launcher

    with driver.entered(g):  # (the zero product is only ever read: zeroed once, as made)
        w = driver.scratch().get(g, s, "a zero product", 4 * req.batch * req.m * req.n,
                                 zero=True)
        epilogue_launcher(g, req.m, req.n, req.batch, req.variant(a, e.b))(
            w, req.n, req.m * req.n, beta, c.ptr, c.ld, c.bstride if req.batch > 1 else 0,
            0 if bias is None else bias.ptr, s)
    return C


def _host_vector(bias: Operand):
    """A device vector's values on the host, as float32."""
    if bias.kind == "torch":
        return bias.obj.float().cpu().numpy()
    host = np.empty(bias.cols, _ELEMENT[bias.dtype])
    with driver.entered(driver.gpu(bias.device)):
        driver.call("cuMemcpyDtoH", host.ctypes.data, bias.ptr, host.nbytes)
    return host.astype(np.float32)


def _numpy_activation(x, act: str):
    """The epilogue's activations (templates/macros.cu.j2) in numpy, in x's type."""
    if act == "relu":
        return np.maximum(x, 0)
    # as the epilogue, in forms free of cancellation for negative x: gelu through erfc,
    # gelu_tanh's x/2 (1 + tanh(z)) as x sigmoid(2 z) (1 + tanh(z) of a z near -4 keeps a
    # thousandth of its bits)
    if act == "silu":
        with np.errstate(over="ignore"):
            return x / (1 + np.exp(-x))
    if act == "gelu":
        import math

        return x * np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2)),
                                otypes=[x.dtype])(x)
    if act == "gelu_tanh":
        with np.errstate(over="ignore"):
            return x / (1 + np.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
    return x


def _problem(a: Operand, b: Operand, c: Operand | None, req: Request, mode: DType | None,
             measure: bool, g: "driver.Gpu | None", stream: int, allocate=None,
             torch_stream: bool = False, torch_tf32: bool = False) -> "Problem":
    """The Problem of a checked call on GPU g (None: a problem only to explain, without a
    GPU): what its plan is built from and its decision keyed by. `torch_stream`: a torch caller on torch's current stream, `torch_tf32` torch's TF32
    setting: cuBLAS is reached through torch where torch computes exactly what is asked (C
    of the inputs' type, or fp32 C for fp32 data at torch's TF32 setting), else through
    gemm-tune's own binding."""
    m, n, k, batch = req.m, req.n, req.k, req.batch
    dtype = fp32_request(a.dtype, mode)
    fp32_data = dtype in (DType.F32, DType.TF32, DType.F32X3)
    via_torch = torch_stream and (
        (fp32_data and (dtype is DType.TF32) == torch_tf32 and req.out is DType.F32)
        or (not fp32_data and req.out is dtype))
    ldc = c.ld if c is not None else n
    sc = c.bstride if c is not None else (m * n if batch > 1 else 0)
    # a C the call allocates starts on a 256-byte boundary, its rows n elements apart
    align = tuple(align_class(o.ptr or 0, o.ld, o.dtype.size, o.bstride) for o in (a, b)) + (
        align_class(c.ptr or 0, ldc, c.dtype.size, sc) if c is not None else
        align_class(0, ldc, req.out.size, sc),)
    offsets = tuple((o.ptr or 0) & 255 for o in (a, b)) + ((c.ptr or 0) & 255 if c else 0,)
    variant = req.variant(a, b)
    out_shape = (batch, m, n) if req.batched else (m, n)
    geometry = (a.geometry(), b.geometry(),
                c.geometry() if c is not None else (out_shape, (m * n, n, 1)[-len(out_shape):]),
                None if req.bias is None else ((n,), (1,)))
    return Problem(g, dtype, m, n, k, a.ld, b.ld, ldc, offsets, via_torch, mode,
                   measure, stream, allocate, variant, batch, (a.bstride, b.bstride, sc),
                   geometry, align, c is not None)


def _plan(lib, a: Operand, b: Operand, c: Operand | None, req: Request, mode: DType | None,
          measure: bool, dev: int, stream: int, allocate=None, torch_stream: bool = False,
          torch_tf32: bool = False, fast: int | None = None, static_b: bool = False) -> Plan:
    """Decide a checked call (dispatch.py's rule; the arguments as _problem's)."""
    problem = _problem(a, b, c, req, mode, measure, driver.gpu(dev), stream, allocate,
                       torch_stream, torch_tf32)
    if fast is not None or static_b:
        problem = dataclasses.replace(problem, fast=fast, static_b=static_b)
    g = problem.gpu
    with driver.entered(g):
        choice = lib.choose(problem, problem.timer(lib) if measure else None)
        capturing = driver.is_capturing(stream)
        try:
            plan = problem.build(lib, choice, capturing)
        except Unsupported as e:  # the kernel cannot take these operands: cuBLAS can
            from tuner.runtime.dispatch import Choice

            log.info("%s cannot run this call (%s): cuBLAS runs it", choice.kernel, e)
            choice = Choice(None, choice.rule, f"{choice.reason}; but {choice.kernel} cannot "
                                               f"take these operands ({e}): cuBLAS runs")
            plan = problem.build(lib, choice, capturing)
    if measure and choice.rule == "estimate" and capturing:
        plan = dataclasses.replace(plan, memo=False)
    if lib.recorder is not None and lib.dispatcher.select_case(
            problem.case, g.cc, g.arch.sm_count, g.name).rule != "exact":
        plan = dataclasses.replace(plan, tally=lib.recorder.tally(
            problem.record(choice, lib.dispatcher.buckets.of(problem.m))))
    return plan


def problem_of(A, B, C=None, mode: DType | None = None, stream=None, out=None, bias=None,
               act=None, offline: bool = False, static_b: bool = False) -> "Problem":
    """The Problem lib.gemm(A, B, C, ...) makes of these operands (read and checked as a
    call reads them; nothing runs): Library.explain's view of a call. `offline`: without
    a GPU (the problem's gpu is None; its stream 0); `static_b`: gemm's."""
    if _vectors(A, B):  # as the call takes them
        A, B, C, _ = _as_matrices(A, B, C)
    a, b = operand(A, "A", inputs=True), operand(B, "B", inputs=True)
    c = None if C is None else operand(C, "C", writable=True)
    a, c = _fold_rows(a, b, c) or (a, c)  # x @ W over a batch, as the call runs it
    ops = (a, b) if c is None else (a, b, c)
    req = request(a, b, c, out, bias, act)
    every = ops + (() if req.bias is None else (req.bias,))
    dev = same_device(*every)
    torch_call = all(o.kind == "torch" for o in every) and stream is None
    tf32 = torch_call and _torch_tf32()
    if offline:
        problem = _problem(a, b, c, req, mode, False, None, 0, torch_stream=torch_call,
                           torch_tf32=tf32)
    else:
        dev = driver.current_device() if dev is None else dev
        problem = _problem(a, b, c, req, mode, False, driver.gpu(dev),
                           resolve_stream(stream, ops, dev), torch_stream=torch_call,
                           torch_tf32=tf32)
    return dataclasses.replace(problem, static_b=static_b) if static_b else problem


def _span(shape, strides) -> int:
    """Elements from the first of one problem's matrix to its last (the last two dims)."""
    return 1 + sum((d - 1) * st for d, st in zip(shape[-2:], strides[-2:]))


def _grow(x: int, need: int, need2: int, size: int) -> int:
    """A stride `x` >= `need` for a matrix that needs `need2` instead: the same padding past
    it, or the least more that keeps the widest access it allows (16, 8, 4, 2 bytes), so
    that the operand keeps its alignment class."""
    y = need2 + x - need
    while align_class(0, y, size) != align_class(0, x, size):
        y += 1
    return y


#: the torch (and numpy) name of each element type a problem's operands may have
_ELEMENT = {DType.F32: "float32", DType.TF32: "float32", DType.F32X3: "float32",
            DType.F16: "float16", DType.BF16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a plan for a call is built from, and how its candidates are timed."""

    gpu: driver.Gpu
    dtype: DType
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    offsets: tuple  # the operands' byte offsets past a 256-byte boundary
    via_torch: bool
    mode: DType | None  # the caller's fp32 mode (TF32, F32X3) or None
    measure: bool
    stream: int  # the call's stream: candidates are timed there, as the call would run
    allocate: Callable | None = None  # graph-safe scratch (torch callers)
    variant: Variant = Variant()  # how A and B are stored (C is row-major), C's type, epilogue
    batch: int = 1
    strides: tuple = (0, 0, 0)  # elements between the problems of A, B and C (0: shared)
    #: (shape, strides) in elements of A, B, C and the bias (None: no bias) as the caller's
    #: are: the first-use measurement's scratch operands are made so
    geometry: tuple | None = None
    align: tuple = (16, 16, 16)  # the alignment class of A, B and C (operands.align_class)
    #: the caller passes C (False: the call allocates it, and its first use is timed so)
    c_given: bool = True
    #: the context word of a torch call the C++ path serves once planned
    #: (tuner.runtime.fast), or None: its candidates are timed through it
    fast: int | None = None
    #: the caller's promise that B is not written by the work ahead of the call on its
    #: stream: a kernel with a static-B twin in the library runs the twin (build)
    static_b: bool = False

    @property
    def layout(self) -> Layout:
        return self.variant.layout

    @property
    def ld_class(self) -> tuple:
        """"tight" or "padded" for A, B and C (tuner.runtime.dispatch.ld_class)."""
        from tuner.runtime.dispatch import ld_class

        return ld_class(self.layout, self.m, self.n, self.k, (self.lda, self.ldb, self.ldc))

    @property
    def case(self):
        """The dispatch's view of this problem (tuner.runtime.dispatch.Case)."""
        from tuner.runtime.dispatch import Case

        return Case(self.dtype, self.m, self.n, self.k, self.variant, self.batch, self.align,
                    self.ld_class, self.route, self.static_b)

    def at_m(self, m: int) -> "Problem":
        """This problem with `m` rows (another M of its bucket, to measure there): the same
        layout, byte offsets, padding and alignment class; A's leading dimension (when A is
        column-major) and A's and C's batch strides, which grow with M, grown alike."""
        if m == self.m:
            return self
        (ash, ast), b, (csh, cst), bias = self.shapes
        size, csize = self.dtype.size, self.variant.out.size
        a_col = self.layout.value[0] == "t"
        lda = _grow(self.lda, self.m, m, size) if a_col else self.lda
        a = (ash[:-2] + (m, ash[-1]), ast[:-2] + ((1, lda) if a_col else ast[-2:]))
        c = (csh[:-2] + (m, csh[-1]), cst)
        sa, sb, sc = self.strides
        if sa:
            sa = _grow(sa, _span(ash, ast), _span(*a), size)
            a = (a[0], (sa,) + a[1][1:]) if len(a[0]) == 3 else a
        if sc:
            sc = _grow(sc, _span(csh, cst), _span(*c), csize)
            c = (c[0], (sc,) + c[1][1:]) if len(c[0]) == 3 else c
        return dataclasses.replace(self, m=m, lda=lda, strides=(sa, sb, sc),
                                   geometry=(a, b, c, bias))

    @property
    def route(self) -> str:
        return "torch" if self.via_torch else "gemm-tune"

    @property
    def elements(self) -> tuple:
        """The element types (torch / numpy names) of A, B, C and the bias."""
        v = self.variant
        data = _ELEMENT[self.dtype]
        return (data, data, _ELEMENT[v.out], "float32" if v.bias == "f32" else _ELEMENT[v.out])

    @property
    def shapes(self) -> tuple:
        """(shape, strides) of A, B, C and the bias (None: no bias): the caller's geometry,
        or for a problem made without operands (Library.decide) packed matrices of its
        leading dimensions."""
        if self.geometry is not None:
            return self.geometry
        m, n, k, (ta, tb) = self.m, self.n, self.k, self.layout.value
        a = ((m, k), (1, self.lda)) if ta == "t" else ((m, k), (self.lda, 1))
        b = ((k, n), (1, self.ldb)) if tb == "t" else ((k, n), (self.ldb, 1))
        return a, b, ((m, n), (self.ldc, 1)), None

    def spans(self) -> tuple:
        """Bytes of A, B, C and the bias (0: none) from the first element to the last."""
        sizes = {"float32": 4, "float16": 2, "bfloat16": 2}
        return tuple(0 if g is None else
                     (1 + sum((d - 1) * s for d, s in zip(*g))) * sizes[e]
                     for g, e in zip(self.shapes, self.elements))

    @property
    def epilogue(self) -> str:
        """The bias and activation in a word: "none", "bias", "biasf32+gelu", "relu" ..."""
        v = self.variant
        parts = ([] if v.bias == "none" else ["bias" if v.bias == "out" else "biasf32"]) \
            + ([] if v.act == "none" else [v.act])
        return "+".join(parts) or "none"

    def record(self, choice, bucket: tuple) -> dict:
        """This problem as a line of a record file (tuner.runtime.record), with what the
        decision knew of a call's time and its M-bucket (smallest M, largest M)."""
        per = choice.ms_at(self.m)
        if per is None and choice.estimate_tflops:
            per = 2.0 * self.m * self.n * self.k * self.batch / (choice.estimate_tflops * 1e9)
        v = self.variant
        return dict(gpu=self.gpu.name, dtype=self.dtype.short, layout=v.layout.value,
                    out=v.out.short, epilogue=self.epilogue, bias=v.bias, act=v.act,
                    batch=self.batch, m=self.m, n=self.n, k=self.k, m_bucket=list(bucket),
                    align=list(self.align), ms_per_call=None if per is None else round(per, 5),
                    rule=choice.rule, runs=choice.kernel or "cuBLAS")

    def build(self, lib, choice, capturing: bool = False) -> Plan:
        """The plan that runs `choice` (a kernel, or cuBLAS by this problem's route); raises
        Unsupported where the kernel cannot take these operands (a batch, say)."""
        g, dtype, m, n, k = self.gpu, self.dtype, self.m, self.n, self.k
        run = torch_run = None
        if choice.kernel is not None:
            run = lib.runner(self.runs(lib, choice.kernel), g.sm).bind(
                g, m, n, k, self.lda, self.ldb, self.ldc, self.allocate, batch=self.batch,
                strides=self.strides)
        elif self.via_torch:
            torch_run = _torch_fallback(self.batch, self.variant.act,
                                        all(len(shape) == 2 for shape, _ in self.shapes[:3]),
                                        self.shapes[2][0])
        else:
            run = self._blas(capturing)
        return Plan(g, dtype, m, n, k, choice, run, True, torch_run, self, self.variant.out,
                    self.shapes[2][0])

    def runs(self, lib, kernel: str) -> str:
        """The kernel that runs where the decision is `kernel`: its static-B twin where the
        caller promised a constant B (static_b) and the library holds the twin for this
        GPU (manifest.static_b_twin), else `kernel`."""
        if self.static_b:
            twin = static_b_twin(kernel)
            if twin is not None and lib.store.holds(twin, self.gpu.sm):
                return twin
        return kernel

    def _blas(self, capturing: bool) -> Callable:
        """cuBLAS through gemm-tune's binding, and the epilogue kernel after it where cuBLAS
        cannot write C as asked (module doc)."""
        from tuner.runtime.cublas import device_blas, has_handle, writes

        g, dtype, m, n, k = self.gpu, self.dtype, self.m, self.n, self.k
        lda, ldb, ldc, allocate = self.lda, self.ldb, self.ldc, self.allocate
        v, batch, (sa, sb, sc) = self.variant, self.batch, self.strides
        layout, out = v.layout, v.out
        if capturing and not has_handle(g):
            raise LibraryError("a CUDA graph is being captured and cuBLAS has not run on "
                               f"GPU {g.index} yet (its handle cannot be made during "
                               "capture): make one call before capturing")
        blas = device_blas(g)
        if v.bias == "none" and v.act == "none" and writes(dtype, out):
            def run(pa, pb, pc, alpha, beta, s, bias=0):
                blas.gemm(dtype, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc, s, allocate,
                          layout=layout, out=out, batch=batch, strides=(sa, sb, sc))
            return run
        from tuner.runtime.epilogue import epilogue_launcher

        epi = epilogue_launcher(g, m, n, batch, v)
        if out is DType.F32:  # cuBLAS writes C (alpha, beta); the bias and activation after
            def run(pa, pb, pc, alpha, beta, s, bias=0):
                blas.gemm(dtype, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc, s, allocate,
                          layout=layout, out=out, batch=batch, strides=(sa, sb, sc))
                epi(pc, ldc, sc, 0.0, pc, ldc, sc, bias, s)
            return run
        scratch, wbytes = driver.scratch(), batch * m * n * 4

        def run(pa, pb, pc, alpha, beta, s, bias=0):  # alpha A B in fp32, then one rounding
            w = scratch.get(g, s, "cuBLAS's fp32 C", wbytes, allocate_captured=allocate)
            blas.gemm(dtype, m, n, k, alpha, pa, lda, pb, ldb, 0.0, w, n, s, allocate,
                      layout=layout, out=DType.F32, batch=batch,
                      strides=(sa, sb, m * n if batch > 1 else 0))
            epi(w, n, m * n, beta, pc, ldc, sc, bias, s)
        return run

    def timer(self, lib) -> Callable:
        """time(kernel names, m=None) -> ({name or "cublas": ms per call in a loop}, {the
        same, of the GPU's time alone}): each candidate timed on scratch operands like the
        caller's (layout, leading dimensions, batch strides, byte offsets, C's type, a
        bias; B a new copy each call, from DRAM as a program's weights), at M = `m` (default: this problem's; see at_m), on the call's stream, as the
        call would run it (tuner.runtime.measure.time_candidates). A kernel that cannot
        take the operands is left out."""
        def time(names, m=None):
            p = self if m is None else self.at_m(m)
            return p._time_torch(lib, names) if p.via_torch else p._time_pointers(lib, names)

        return time

    def _plans(self, lib, names) -> dict:
        """name (or "cublas") -> the plan running it on this problem."""
        from tuner.runtime.dispatch import Choice

        out = {}
        for name in names:
            try:
                out[name] = self.build(lib, Choice(name, "measured", ""))
            except Unsupported as e:
                log.info("%s is not measured: %s", name, e)
        out["cublas"] = self.build(lib, Choice(None, "measured", ""))
        return out

    def _time_torch(self, lib, names) -> dict:
        """A torch caller's candidates, timed through lib.gemm itself (the call's whole host
        path, each plan swapped in under the call's key) on torch tensors laid out as the
        caller's: cuBLAS as torch.matmul, addmm, bmm ... (_torch_fallback); with no C where
        the caller passes none (each call allocates its C then, a kernel's and torch's
        alike, and torch's product is the allocating one, not out=)."""
        from tuner.runtime import measure

        _see_torch()
        with measure.torch_operands(self.gpu, self) as (A, Bs, C, bias):
            C = C if self.c_given else None
            act = self.variant.act
            key = _torch_key(A, Bs[0], C, self.mode, self.measure, None, None, bias, act)[0]
            saved = lib.plans.get(key)

            def runner(plan):
                b = measure.rotation(Bs)
                t = self._fast_table(lib, plan, A, Bs[0], C, bias)
                if t is not None:
                    return lambda stream: t.call(A, b(), C, bias, 1.0, 0.0, self.fast)

                def run(stream):
                    lib.plans[key] = plan
                    gemm(lib, A, b(), C, 1.0, 0.0, self.mode, None, self.measure, bias=bias,
                         act=act)
                return run

            try:
                return measure.time_candidates(
                    self.gpu, {name: runner(p) for name, p in self._plans(lib, names).items()},
                    self.stream)
            finally:
                if saved is None:
                    lib.plans.pop(key, None)
                else:
                    lib.plans[key] = saved

    def _fast_table(self, lib, plan, A, B, C, bias):
        """A C++ table serving this call's key with `plan` alone (the C++ path as the call
        will take it), or None where the call takes the Python path."""
        if self.fast is None:
            return None
        t = fast.new_table()
        try:
            if t is not None and fast.offer(t, lib, plan, A, B, C, bias, self.fast,
                                            self.stream):
                return t
        except Exception as e:  # noqa: BLE001 - timed through the Python path instead
            log.info("%s is timed through the Python path: %s", plan.choice.kernel, e)
        return None

    def _time_pointers(self, lib, names) -> dict:
        """Anyone else's candidates, through each plan's launcher on scratch device memory:
        cuBLAS through gemm-tune's binding (tuner/runtime/cublas.py)."""
        from tuner.runtime import measure

        with measure.driver_operands(self.gpu, self) as (a, bs, c, bias):
            return measure.time_candidates(
                self.gpu, {name: (lambda st, p=p, b=measure.rotation(bs):
                                  p.run(a, b(), c, 1.0, 0.0, st, bias))
                           for name, p in self._plans(lib, names).items()}, self.stream)
