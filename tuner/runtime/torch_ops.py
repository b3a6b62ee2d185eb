"""gemm-tune's GEMMs as torch custom ops, for torch.compile and CUDA graphs, and a patch
that routes a model's nn.Linear layers through a library.

    from tuner.runtime import torch_ops
    name = torch_ops.library_key(lib)            # or a library's path
    y = torch_ops.linear(x, W, b, "gelu", library=name)   # gelu(x @ W.t() + b), x (..., in)
    C = torch_ops.matmul(A, B, library=name)              # A @ B, 2-D or batched (3-D)
    C = torch_ops.gemm(A, B, C0, alpha=0.5, beta=2.0, library=name) # 0.5 A B + 2 C0, fp32
    torch_ops.patch(model, lib)   # every nn.Linear of model through lib (unpatch undoes it)

Importing this module (it needs torch) defines ``torch.ops.gemm_tune.linear``, ``.matmul``
and ``.gemm``: functional (each returns a new tensor), with fake implementations for
tracing, running Library.gemm on torch's current stream; so a function calling them
compiles under ``torch.compile(fullgraph=True)`` and records into ``torch.cuda.graph``.
In eager mode, on plain tensors (and nn.Parameters) with no gradient to record, the
functions below call the library directly: the custom op's dispatch costs tens of
microseconds a call, as much as a small GEMM (:func:`_eager`).
Operands are used as they are stored (a transposed view is a column-major operand, served
without a copy: ``linear`` multiplies by ``W.t()``, the NT layout); only one that is
neither row- nor column-major is copied first. A custom op takes no Python objects, so the
library is named by a string: its resolved path, loaded once per process (or the object
registered under it by :func:`library_key`).

The ops have no backward: they are for inference (a patched model runs torch's own
layers where autograd records the call; see :func:`patch`).
"""

from __future__ import annotations

import types

import torch
from torch import Tensor

from tuner.runtime import call, fast
from tuner.runtime.operands import batch_stride
from tuner.runtime.registry import key_of as _key
from tuner.runtime.registry import library_key
from tuner.runtime.registry import library_of as _library

__all__ = ["gemm", "linear", "matmul", "library_key", "patch", "unpatch", "ACTIVATION_MODULES"]


def _served(x: Tensor) -> Tensor:
    """x as the library takes it: each matrix row- or column-major with a unit stride, its
    batch dimensions (if several) one stride apart (a copy only of one that is not so); a
    vector as it is."""
    if x.dim() < 2:
        return x
    rows, cols = x.shape[-2], x.shape[-1]
    rs, cs = x.stride(-2), x.stride(-1)
    if x.dim() > 3 and batch_stride(x.shape, x.stride()) is None:  # (x.view(-1, rows,
        return x.contiguous()  # cols) would not take them)
    if (cs == 1 or cols == 1) and (rs >= cols or rows == 1):
        return x
    if (rs == 1 or rows == 1) and cs >= rows:
        return x
    return x.contiguous()


#: the tensor types an eager call passes straight to the library (a layer's weight and bias
#: are nn.Parameters); any other (a FakeTensor, a tracing proxy) goes through the custom op
_PLAIN = (Tensor, torch.nn.Parameter)
_compiling = torch.compiler.is_compiling
#: how many dispatch modes are active (make_fx, FakeTensorMode...): 0 in plain eager code
_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)


def _eager(*tensors) -> bool:
    """May this call run the library directly, without the custom op's dispatch (tens of
    microseconds a call, as much as a small GEMM)? Yes in eager mode on plain tensors with
    no gradient to record; under torch.compile or any dispatch mode (tracing, fake
    tensors), on tensors of another type, or where autograd records the call (the ops have
    no backward: torch's dispatch raises then), the op runs."""
    if _compiling() or _modes():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or grad and t.requires_grad):
            return False
    return True


_OUT = {"": None, "float32": torch.float32, "float16": torch.float16,
        "bfloat16": torch.bfloat16}


def _out_name(dtype) -> str:
    if dtype is None:
        return ""
    name = str(dtype).replace("torch.", "")
    if name not in _OUT:
        from tuner.runtime.errors import LibraryError

        raise LibraryError(f"out_dtype {dtype!r} is not float32, float16 or bfloat16")
    return name


# ---- gemm: alpha A B + beta C, fp32 C --------------------------------------------------------
def _gemm(a: Tensor, b: Tensor, c: Tensor | None, alpha: float, beta: float, library: str,
          allow_tf32: bool) -> Tensor:
    if c is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32, device=a.device)
        beta = 0.0
    else:
        out = c.to(torch.float32, copy=True, memory_format=torch.contiguous_format)
    _library(library).gemm(_served(a), _served(b), out, alpha=alpha, beta=beta,
                           allow_tf32=allow_tf32)
    return out


_gemm_op = torch.library.custom_op("gemm_tune::gemm", _gemm, mutates_args=(),
                                   device_types="cuda")


@_gemm_op.register_fake
def _(a, b, c, alpha, beta, library, allow_tf32):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)


def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0,
         beta: float = 0.0, *, library, allow_tf32: bool = False) -> Tensor:
    """alpha * a @ b + beta * c (fp32, a new tensor): torch.ops.gemm_tune.gemm (directly
    in eager code, :func:`_eager`);
    `library`: a Library, or the string of :func:`library_key` (inside torch.compile)."""
    call = _gemm if _eager(a, b, c) else torch.ops.gemm_tune.gemm
    return call(a, b, c, float(alpha), float(beta), _key(library), bool(allow_tf32))


# ---- linear: act(x W^T + b), x of any leading dimensions -------------------------------------
def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, lib,
            static: bool = False) -> Tensor:
    act = None if activation == "none" else activation
    w = _served(weight.t())  # (in, out): weight as nn.Linear keeps it, read by columns (NT)
    kw = dict(bias=bias, activation=act, static_b=static)
    if x.dim() == 2:  # no view in, none out
        return lib.gemm(_served(x), w, **kw)
    k, n = x.shape[-1], weight.shape[0]
    try:
        x2 = x.view(-1, k)  # the leading dimensions flattened: a view, no copy
    except RuntimeError:  # not expressible as one matrix; a 3-D x runs as a batch
        x2 = None
    if x2 is not None:
        return lib.gemm(_served(x2), w, **kw).view(*x.shape[:-1], n)
    if x.dim() == 3:
        return lib.gemm(_served(x), w, **kw)
    return lib.gemm(x.reshape(-1, k), w, **kw).view(*x.shape[:-1], n)


def _linear_call(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str,
                 library: str) -> Tensor:
    return _linear(x, weight, bias, activation, _library(library))


_linear_op = torch.library.custom_op("gemm_tune::linear", _linear_call, mutates_args=(),
                                     device_types="cuda")


@_linear_op.register_fake
def _(x, weight, bias, activation, library):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str | None = None, *, library, static_weight: bool = False) -> Tensor:
    """act(x @ weight.t() + bias), as torch.nn.functional.linear then the activation:
    x (*, in) with any leading dimensions (flattened as a view), weight (out, in) as
    nn.Linear keeps it (multiplied in place as a column-major B: the NT layout), bias
    (out) of x's type or float32; `activation` None, "relu", "gelu", "gelu_tanh" or
    "silu". Returns (*, out) in x's type. `library`: a Library, or the string of
    :func:`library_key` (pass the string inside torch.compile). `static_weight`: the
    promise that no work ahead of the call on its stream writes `weight` (patch's
    `static_weights`; eager calls only)."""
    act = None if activation == "none" else activation
    if not _eager(x, weight, bias):
        return torch.ops.gemm_tune.linear(x, weight, bias, activation or "none",
                                          _key(library))
    lib = _library(library) if isinstance(library, str) else library
    t = getattr(lib, "fast", None)
    if t is not None and act in fast.ACT_CODES:  # the C++ path: a key it has seen
        y = t.linear(x, weight, bias, fast.context(lib.measure, act, True, static_weight))
        if y is not None:
            return y
    y = _linear(x, weight, bias, activation or "none", lib, static_weight)
    call.offer_linear(lib, x, weight, bias, act, static_weight)
    return y



# ---- matmul: a @ b, 2-D or batched ------------------------------------------------------------
def _matmul(a: Tensor, b: Tensor, out_dtype: str, lib) -> Tensor:
    # (a batch times one matrix runs as one GEMM of all its rows where they fold: lib.gemm)
    if a.dim() > 2 and b.dim() > 2 and a.shape[:-2] != b.shape[:-2]:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])  # as torch.matmul: each
        a, b = a.expand(*lead, *a.shape[-2:]), b.expand(*lead, *b.shape[-2:])  # over all
    return lib.gemm(_served(a), _served(b), out_dtype=_OUT[out_dtype])


def _matmul_shape(a: Tensor, b: Tensor) -> tuple:
    sa = tuple(a.shape) if a.dim() > 1 else (1, a.shape[0])  # a vector: one row
    sb = tuple(b.shape) if b.dim() > 1 else (b.shape[0], 1)  # ... one column
    shape = (*torch.broadcast_shapes(sa[:-2], sb[:-2]), sa[-2], sb[-1])
    if a.dim() == 1:
        shape = shape[:-2] + shape[-1:]
    return shape[:-1] if b.dim() == 1 else shape


def _matmul_call(a: Tensor, b: Tensor, out_dtype: str, library: str) -> Tensor:
    return _matmul(a, b, out_dtype, _library(library))


_matmul_op = torch.library.custom_op("gemm_tune::matmul", _matmul_call, mutates_args=(),
                                     device_types="cuda")


@_matmul_op.register_fake
def _(a, b, out_dtype, library):
    return a.new_empty(_matmul_shape(a, b), dtype=_OUT[out_dtype] or a.dtype)


def matmul(a: Tensor, b: Tensor, *, library, out_dtype=None) -> Tensor:
    """a @ b as torch.matmul: (M x K) @ (K x N), a vector (K) as one row or one column, or
    batches (... x M x K) @ (... x K x N) whose batch dimensions broadcast (a 2-D operand,
    or a batch of 1, shared by the other's whole batch; batch dimensions that lib.gemm
    cannot take as one stride, a broadcast one among them, copied first, as torch.matmul
    copies them). C is of a's type (fp32 for fp32) unless `out_dtype` (float32, float16,
    bfloat16) asks for another. `library`: a Library, or the string of
    :func:`library_key`."""
    call = _matmul_call if _eager(a, b) else torch.ops.gemm_tune.matmul
    return call(a, b, _out_name(out_dtype), _key(library))


# ---- patch: a model's nn.Linear layers through a library --------------------------------------
#: the activation modules a Linear may absorb, by exact type (see :func:`patch`)
ACTIVATION_MODULES = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu", torch.nn.GELU: "gelu"}

_MARK = "_gemm_tune_patch"  # on a patched module: (the forward it had in its __dict__, or None)


def _activation_of(module) -> str | None:
    act = ACTIVATION_MODULES.get(type(module))
    if act == "gelu":
        approximate = getattr(module, "approximate", "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return act


def _plain(module) -> bool:
    """Runs its class's own forward, with no hooks of its own and none global."""
    from torch.nn.modules import module as mm

    return ("forward" not in module.__dict__ and not module._forward_hooks
            and not module._forward_pre_hooks and not mm._global_forward_hooks
            and not mm._global_forward_pre_hooks)


def _fusions(model) -> dict:
    """{Linear: (activation name, activation module)} where the structure is unambiguous:
    inside an nn.Sequential running nn.Sequential's own forward, a plain nn.Linear
    immediately followed by a plain nn.ReLU, nn.SiLU or nn.GELU (approximate "none" or
    "tanh"), each of the two appearing once in the whole model, neither with hooks."""
    uses: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        uses[id(m)] = uses.get(id(m), 0) + 1
    found = {}
    for seq in model.modules():
        if not isinstance(seq, torch.nn.Sequential) \
                or type(seq).forward is not torch.nn.Sequential.forward or not _plain(seq):
            continue
        kids = list(seq._modules.values())
        for lin, act in zip(kids, kids[1:]):
            name = _activation_of(act)
            if (type(lin) is torch.nn.Linear and name and _plain(lin) and _plain(act)
                    and uses[id(lin)] == 1 and uses[id(act)] == 1 and lin not in found):
                found[lin] = (name, act)
    return found


def _grad_recorded(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (
        b is not None and b.requires_grad))


def _cuda_autocast() -> bool:
    return torch.is_autocast_enabled("cuda")


try:
    _cuda_autocast()
    _autocast = _cuda_autocast
except TypeError:  # torch before 2.4: no device argument
    _autocast = torch.is_autocast_enabled


_TORCH_ACT = {
    "none": lambda y: y,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
}


def _patched_forward(key: str, activation: str, static: bool = False):
    torch_act = _TORCH_ACT[activation]
    act = None if activation == "none" else activation
    memo: dict = {}  # this layer's call keys (tuner.runtime.call.torch_linear)
    served = [None, None, None, False]  # W's pointer and shape, W.t(), "a view of W"
    ctx = fast.context(False, act, True, static)  # the C++ path's context word, measuring off

    def forward(self, x: Tensor) -> Tensor:
        params = self._parameters
        w, b = params["weight"], params["bias"]
        compiling = _compiling()
        if not compiling:  # (the library is looked up in eager code only)
            lib = _library(key)
            t = getattr(lib, "fast", None)
            if t is not None:  # the C++ path: a key it has seen
                y = t.linear(x, w, b, ctx | lib.measure)
                if y is not None:
                    return y
        if not x.is_cuda or x.dtype != w.dtype or _autocast() \
                or _grad_recorded(x, w, b):  # torch's own layer (and activation)
            return torch_act(torch.nn.functional.linear(x, w, b))
        if compiling or _modes() or type(x) not in _PLAIN or type(w) not in _PLAIN \
                or (b is not None and type(b) not in _PLAIN):
            return torch.ops.gemm_tune.linear(x, w, b, activation, key)
        ptr, shape = w.data_ptr(), w.shape
        if served[0] != ptr or served[1] != shape:  # W.t() once, while W's storage stays
            wt = _served(w.t())
            served[:] = ptr, shape, wt, wt.data_ptr() == ptr
        # (a W neither row- nor column-major is copied on every call: a kept copy would
        # miss writes to W)
        y = call.torch_linear(lib, memo, x, w, served[2], b, act, served[:2], static) \
            if served[3] else None
        return _linear(x, w, b, activation, lib, static) if y is None else y
    return forward


def _identity(self, x):
    return x


def patch(model: torch.nn.Module, lib, fuse: bool = True,
          static_weights: bool = False) -> torch.nn.Module:
    """Route every nn.Linear of `model` (the module itself or any below it) through `lib`:
    each one's forward is replaced, on the instance, by :func:`linear`'s computation (its
    parameters are kept and used in place; the layer keeps W.t() and its call keys between
    calls, tuner.runtime.call.torch_linear, and where cuBLAS runs it calls torch's own
    F.linear); :func:`unpatch` restores them. Returns `model`.

    With `fuse`, a Linear that an activation immediately follows where the structure
    leaves no doubt absorbs it: inside an nn.Sequential (running Sequential's own
    forward), an nn.Linear directly followed by nn.ReLU, nn.SiLU or nn.GELU (approximate
    "none" or "tanh"), each of the two used once in the model and neither with forward
    hooks (nor any global ones). The pair becomes one call (the activation in the GEMM's
    epilogue) and the activation module an identity while patched. Nothing else is
    fused: an activation called from a custom forward (F.gelu(self.fc(x))) stays as it is.

    A patched Linear runs torch's own F.linear (and the absorbed activation) instead
    where gemm-tune's ops cannot stand in: a CPU input, an input of another type than the
    weight, autocast, or autograd recording the call (the ops have no backward: run
    inference under torch.no_grad() or torch.inference_mode()).

    `static_weights`: the promise that no work ahead of a layer's call on its stream
    writes its weight (inference with weights loaded once: Library.gemm's `static_b`), so
    that a decode entry's twin may start loading the weight while that work finishes. Not
    under torch.compile, whose op takes no such promise.

    Example:
        >>> torch_ops.patch(model, lib)                  # doctest: +SKIP
        >>> with torch.inference_mode():                 # doctest: +SKIP
        ...     y = model(x)
    """
    key = library_key(lib)
    fused = _fusions(model) if fuse else {}
    for m in model.modules():
        if type(m) is torch.nn.Linear and not hasattr(m, _MARK) \
                and "forward" not in m.__dict__:
            name, act = fused.get(m, ("none", None))
            setattr(m, _MARK, None)
            m.forward = types.MethodType(_patched_forward(key, name, static_weights), m)
            if act is not None:
                setattr(act, _MARK, None)
                act.forward = types.MethodType(_identity, act)
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`patch` on every module of `model`: their own forwards again."""
    for m in model.modules():
        if hasattr(m, _MARK):
            delattr(m, _MARK)
            m.__dict__.pop("forward", None)
    return model
