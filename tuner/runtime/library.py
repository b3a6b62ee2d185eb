"""The tuned-kernel library: what a program loads (:func:`load_library`) to run
C = alpha*A*B + beta*C on the caller's GPU and stream with the tuned kernels, or cuBLAS
where it is faster.

A :class:`Library` joins four parts, each a module with a small public face:
    tuner.runtime.manifest   the directory on disk: manifest, .cu, .cubin, hashes
    tuner.runtime.dispatch   the rule (exact, measured, estimate) and its table
    tuner.runtime.measure    first-use timing of the candidates
    tuner.runtime.call       the call path: operands -> memoised plan -> launch
and keeps what a process learns: the runners loaded (one per kernel, the same objects the
tuner timed, tuner.runtime.runners) and the plans memoised per call key.

The call path is thin: a call's operands are read (for torch tensors: dtype, shape,
strides, device and the pointers' alignment), and that tuple, with the request (C's
type, the bias, the activation), is the key of a memo holding the call's plan (the
decision, the launch geometry, the kernel loaded), so the rule, the estimates and the
checks run once per (device, dtype, variant, batch, M, N, K, leading dimensions and
strides, alignment class), and a first-use measurement once per dispatch case (its
M-bucket, leading-dimension and alignment classes, route: tuner.runtime.dispatch). Then
the caller's stream is read (torch's raw handle) and the kernel launched through the
driver API with a parameter block packed in one call. Any thread may call; nothing is
allocated, synchronised or timed while a CUDA graph is being captured, nor anywhere with
measuring off (load_library(..., measure=False), GEMM_TUNE_MEASURE=0).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import numbers
import os
import re
import threading
import weakref
from pathlib import Path

import numpy as np

from codegen.config import DType, Layout, config_from_name
from codegen.families._common import BIASES, Variant, whole
from tuner.runtime import call, driver, measure
from tuner.runtime.dispatch import (
    FULL_ALIGN, Case, Choice, Dispatcher, MBuckets, ld_class, packed_ld,
)
from tuner.runtime.errors import LibraryError, NoGPUError, env_flag
from tuner.runtime.fast import ACT_CODES as _ACT_CODES, STATIC_B as _STATIC_B
from tuner.runtime.manifest import SCHEMA, Manifest, as_variant, static_b_twin
from tuner.runtime.operands import align_class
from tuner.runtime.operands import out_dtype as _out_dtype
from tuner.runtime.record import Recorder
from tuner.runtime.runners import Runner, runner_for

__all__ = ["SCHEMA", "LibraryError", "Library", "Choice", "load_library"]

log = logging.getLogger(__name__)


def _measure_default() -> bool:
    return env_flag("GEMM_TUNE_MEASURE")


#: the environment variable that says what sets a program's pace (measure.PACES)
PACE_ENV = "GEMM_TUNE_PACE"


def _pace(pace: str | None) -> str:
    """`pace`, or GEMM_TUNE_PACE's, or "either"; LibraryError in one line for another word."""
    where = "pace"
    if pace is None:
        pace, where = os.environ.get(PACE_ENV, "").strip() or "either", PACE_ENV
    if pace not in measure.PACES:
        raise LibraryError(f"{where}={pace!r}: expected one of {', '.join(measure.PACES)}")
    return pace


class Library:
    """A tuned-kernel library. Use :func:`load_library` to open one for running."""

    def __init__(self, store: Manifest, measure: bool | None = None,
                 m_buckets: str | MBuckets | None = None, pace: str | None = None):
        self.store = store
        if isinstance(m_buckets, str):
            m_buckets = MBuckets.parse(m_buckets)
        self.dispatcher = Dispatcher(store, m_buckets, _pace(pace))
        #: call key -> call.Plan (see tuner.runtime.call); clearing it clears the C++
        #: path's table too
        self.plans: dict = _Plans(self)
        #: the C++ call path's table for torch callers (tuner.runtime.fast), once loaded,
        #: and the call keys whose plans were offered to it
        self.fast = None
        self.fast_keys: set = set()
        self._runners: dict[str, Runner] = {}
        self._load_lock = threading.Lock()
        self._measure_lock = threading.Lock()
        #: gemm's default for `measure`: on, unless GEMM_TUNE_MEASURE=0 when the library
        #: loads, or the library was loaded with measure=False. Off, nothing is timed or
        #: written at run time: exact entries, the dispatch table's decisions and the
        #: estimates decide, the same in every process (for multi-rank jobs)
        self.measure = _measure_default() if measure is None else _flag("measure", measure)
        env_flag("GEMM_TUNE_FAST")  # its spelling checked now, not at the first torch call
        #: counts the calls of problems with no exact entry (GEMM_TUNE_RECORD, record())
        self.recorder: Recorder | None = Recorder.from_env()

    # ---- on disk (tuner.runtime.manifest) ------------------------------------------------
    @classmethod
    def create_or_open(cls, path: str | Path) -> "Library":
        return cls(Manifest.create_or_open(path))

    @classmethod
    def load(cls, path: str | Path, verify: bool = True, measure: bool | None = None,
             m_buckets: str | MBuckets | None = None, pace: str | None = None) -> "Library":
        """Read the manifest; with `verify`, check every file's hash and re-validate every
        config. Raises LibraryError, naming the file, for anything wrong. `measure`,
        `m_buckets` and `pace`: see load_library."""
        return cls(Manifest.load(path, verify), measure, m_buckets, pace)

    @property
    def m_buckets(self) -> MBuckets:
        """The M-buckets this library's decisions are shared over (tuner.runtime.dispatch)."""
        return self.dispatcher.buckets

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def manifest(self) -> dict:
        """The manifest's data: {"schema", "kernels", "entries"}."""
        return self.store.data

    @property
    def fingerprint(self) -> str:
        return self.store.fingerprint

    def verify(self) -> None:
        self.store.verify()

    def add(self, entry: dict, source: Path, cubin: Path, meta: Path | None = None,
            twins: tuple = ()) -> None:
        """Add (or replace) a tuned entry and its kernel's files, and its twins' (see
        Manifest.add)."""
        self.store.add(entry, source, cubin, meta, twins)

    def update_entry(self, entry: dict, **fields) -> dict:
        return self.store.update_entry(entry, **fields)

    # ---- the rule (tuner.runtime.dispatch) ------------------------------------------------
    @property
    def table_path(self) -> Path:
        """Where the dispatch table of this library is kept."""
        return self.dispatcher.table.path

    def ranked(self, m: int, n: int, k: int, dtype: DType, cc: int, sms: int,
               layout: Layout | Variant = Layout.NN, align: tuple = FULL_ALIGN,
               batch: int = 1) -> list[tuple[float, dict]]:
        """(estimated TFLOP/s, entry) of every kernel tuned on this cc for this dtype and
        variant (`layout`: a Variant, or a Layout for fp32 C without an epilogue) that
        takes operands aligned as `align` (A, B, C), best first."""
        return self.dispatcher.ranked(m, n, k, dtype, cc, sms, layout, align, batch)

    def select(self, m: int, n: int, k: int, dtype: DType = DType.F32, cc: int = 90,
               sms: int | None = None, layout: Layout | Variant = Layout.NN,
               gpu: str | None = None, aligned: bool = True, align: tuple | None = None,
               batch: int = 1) -> Choice:
        """The rule without measuring: exact, estimate or cuBLAS. `layout`: the request's
        Variant (or a Layout: fp32 C, no epilogue); `gpu`: the GPU's name (an exact entry
        must come from the same model); `align`: the operands' alignment class (A, B, C:
        the widest access each allows), or `aligned` False for operands that are not all
        16-byte aligned (no exact entry then); `batch`: the problems of a strided batch."""
        align = align or (FULL_ALIGN if aligned else (16, 16, 4))
        return self.dispatcher.select(m, n, k, dtype, cc, sms, layout, gpu, align, batch)

    def decide(self, m: int, n: int, k: int, dtype: DType | str = DType.F32,
               device: int | None = None, route: str | None = None,
               variant: Variant | None = None, batch: int = 1) -> Choice:
        """The kernel that runs this problem (packed operands on 256-byte boundaries) on
        this GPU, measuring now if the rule asks to and no decision is kept for its M-bucket
        (`gemm-tune prewarm`). `route`: how cuBLAS is reached, "torch" (torch tensors; the
        default where torch is installed and sees a GPU) or "gemm-tune" (cupy, pycuda,
        numpy, pointers).
        `variant`: layout, C's type, bias and activation (default: NN, fp32 C, none);
        `batch`: packed problems one after another."""
        dtype = dtype if isinstance(dtype, DType) else DType.parse(dtype)
        variant = as_variant(variant)
        if route is None:
            fp32 = dtype in (DType.F32, DType.TF32, DType.F32X3)
            route = "torch" if _torch_sees_a_gpu() and (
                variant.out is DType.F32 if fp32 else variant.out is dtype) else "gemm-tune"
        g = driver.gpu(driver.current_device() if device is None else device)
        problem = _packed(g, dtype, m, n, k, variant, batch, route == "torch")
        with driver.entered(g):  # the legacy default stream: torch's default
            return self.choose(problem, problem.timer(self), watch_capture=False)

    def explain(self, *args, **kw) -> str:
        """Which kernel `gemm` runs for a call, and why: the exact entry, the figures
        measured for its M-bucket (naming the bucket), or the estimates. Two forms:

        ``explain(A, B, C=None, *, out_dtype=None, bias=None, activation=None,
        allow_tf32=False, allow_3xtf32=False, stream=None, gpu=None, static_b=False)``: the
        call lib.gemm would make of these operands (read as gemm reads them: layout, leading
        dimensions, alignment, batch, C's type, the epilogue, the route to cuBLAS); exactly
        that call's decision; with `static_b`, also which of the kernels named runs as its
        static-B twin.

        ``explain(m, n, k, dtype="fp32", device=None, gpu=None, *, layout="nn",
        out_dtype=None, bias="none", activation=None, batch=1, ld=None, align=None,
        route=None)``: a problem by its shape. `out_dtype` defaults as gemm's does (the
        inputs' type for fp16 and bf16, fp32 for fp32); `bias` "none", "out" (of C's type)
        or "f32"; `ld` (lda, ldb, ldc): the leading dimensions, elements between rows (or
        columns of a column-major operand; default: packed); `align` (A, B, C): the widest
        access in bytes each allows (default: that of its leading dimension from a 256-byte
        boundary); `route` "torch" or "gemm-tune" (default: each that has a decision).
        `gpu` (either form): a GPU model the library was tuned on ("NVIDIA H200", or
        "H200"), to ask without one (numpy operands, or a shape): the exact entry or the
        estimates answer (the entries' recorded timings scaled by the occupancy model's
        tile and wave efficiency), with the decisions the dispatch table holds for that
        model; a model the library was not tuned on gets a one-line LibraryError, and so
        does a call without `gpu` where no GPU is usable (NoGPUError).

        Example:
            >>> print(lib.explain(x, W.t(), bias=b, activation="gelu"))   # doctest: +SKIP
            >>> print(lib.explain(16, 4096, 4096, "fp16", gpu="H200"))     # doctest: +SKIP
        """
        form = self._explain_call if args and not isinstance(args[0], numbers.Integral) \
            else self._explain_shape
        try:
            inspect.signature(form).bind(*args, **kw)
        except TypeError as e:
            raise LibraryError(f"explain: {e} (explain(A, B, C=None, ...) or explain(m, n, k, "
                               "dtype, ...))") from None
        return form(*args, **kw)

    def _explain_call(self, A, B, C=None, *, out_dtype=None, bias=None, activation=None,
                      allow_tf32: bool = False, allow_3xtf32: bool = False,
                      stream=None, gpu: str | None = None, static_b: bool = False) -> str:
        try:
            problem = call.problem_of(A, B, C, _mode(allow_tf32, allow_3xtf32), stream,
                                      out_dtype, bias, activation, offline=gpu is not None,
                                      static_b=static_b)
        except call.EmptyProblem as e:
            r = e.req
            return _explain_empty(r.m, r.n, r.k, r.batch, r.bias is not None, r.act)
        if gpu is not None:
            text = self.dispatcher.explain_offline(gpu, problem.case)
        else:
            text = self.dispatcher.explain(problem.gpu, problem.case)
        return text + "\n" + self._twins_named(text) if static_b else text

    def _twins_named(self, text: str) -> str:
        """static_b's line of explain(): which kernels named in `text` run as the static-B
        twin the library holds for them (Problem.runs)."""
        held = {key.split("/", 1)[1] for key in self.manifest["kernels"]}
        twins = {name: static_b_twin(name) for name in sorted(held)
                 if re.search(rf"\b{re.escape(name)}\b", text)}
        runs = [f"{k} runs as its twin {t}" for k, t in twins.items() if t in held]
        if not runs:
            return "static_b: no kernel named above has a static-B twin here: each runs itself"
        return ("static_b: " + "; ".join(runs) + " (it loads B before the work ahead of the "
                "call has finished)")

    def _explain_shape(self, m: int, n: int, k: int, dtype: DType | str = DType.F32,
                       device: int | None = None, gpu: str | None = None, *,
                       layout: Layout | str = Layout.NN, out_dtype=None, bias: str = "none",
                       activation: str | None = None, batch: int = 1, ld: tuple | None = None,
                       align: tuple | None = None, route: str | None = None) -> str:
        dtype = dtype if isinstance(dtype, DType) else DType.parse(str(dtype))
        sizes = dict(m=m, n=n, k=k, batch=batch)
        bias = "none" if bias is None else bias
        _check_shape_question(sizes, device, gpu, layout, bias, activation, ld, align, route)
        if any(v < 0 for v in sizes.values()):
            bad = ", ".join(f"{name} = {v}" for name, v in sizes.items() if v < 0)
            raise LibraryError(f"explain: no size may be negative ({bad})")
        if not (m and n and k and batch):
            return _explain_empty(m, n, k, batch, bias != "none", activation or "none")
        case = _case(dtype, m, n, k, layout, out_dtype, bias, activation, batch, ld, align,
                     route or "gemm-tune")
        if gpu is not None:
            return self.dispatcher.explain_offline(gpu, case)
        try:
            g = driver.gpu(driver.current_device() if device is None else device)
        except NoGPUError as e:
            models = self.dispatcher.models()
            raise NoGPUError(f"explain() needs a GPU, and here {e}. Without one, name a GPU "
                             "model the library was tuned on: "
                             f"explain(..., gpu={models[0] if models else '...'!r})") from None
        return self.dispatcher.explain(g, case, (route,) if route else ("torch", "gemm-tune"))

    def choose(self, problem, timer=None, watch_capture: bool = True) -> Choice:
        """The rule for one call's problem (tuner.runtime.call.Problem), measuring with
        `timer` (kernel names, M -> ({name or "cublas": ms per call in a loop}, {the same,
        of the GPU's time alone}): measure.time_candidates) at both ends of its M-bucket
        where the rule asks to; nothing is measured while the problem's stream is being
        captured into a CUDA graph (`watch_capture`; the estimate decides then)."""
        g, case = problem.gpu, problem.case
        if timer is None:
            return self.dispatcher.decide(g, case)

        def measured(ranked: list[str], bucket: tuple) -> dict | None:
            if watch_capture and driver.is_capturing(problem.stream):
                return None
            names = measure.candidates(ranked)
            timed = {m: timer(names, m) for m in sorted(set(bucket))}
            return measure.decision({m: loop for m, (loop, _) in timed.items()}, case.route,
                                    {m: device for m, (_, device) in timed.items()},
                                    self.dispatcher.pace)

        with self._measure_lock:
            return self.dispatcher.decide(g, case, measured)

    @contextlib.contextmanager
    def record(self, path: str | Path):
        """Within the block, count every problem called without an exact entry, and append
        the counts to `path` when it ends (the format: tuner.runtime.record).

        Example:
            >>> with lib.record("problems.jsonl"):          # doctest: +SKIP
            ...     model(x)
        """
        before, self.recorder = self.recorder, Recorder(path)
        self.plans.clear()  # plans made before count nothing: make them again
        try:
            yield self.recorder
        finally:
            self.recorder.flush()
            self.recorder = before
            self.plans.clear()

    # ---- running ---------------------------------------------------------------------------
    def runner(self, name: str, arch: str) -> Runner:
        """Kernel `name`'s runner, loaded once per process (any thread)."""
        run = self._runners.get(name)
        if run is None:
            with self._load_lock:
                run = self._runners.get(name)
                if run is None:
                    run = runner_for(config_from_name(name),
                                     self.store.file(name, arch).read_bytes())
                    self._runners[name] = run
        return run

    def gemm(self, A, B, C=None, alpha: float = 1.0, beta: float = 0.0,
             allow_tf32: bool = False, stream=None, measure: bool | None = None,
             pipeline: bool | str = True, allow_3xtf32: bool = False, out_dtype=None,
             bias=None, activation: str | None = None, static_b: bool = False):
        """C = act(alpha * A @ B + beta * C + bias) with the tuned kernels, or cuBLAS where
        it is faster or no kernel was tuned for the call's variant (see
        tuner.runtime.dispatch for the rule, tuner.runtime.call for what runs instead).

        A (M x K) and B (K x N) are matrices of one type, float32, float16 or bfloat16,
        each row-major or column-major (a transposed view such as torch's ``W.t()``: the
        layout is read off the strides, nothing is copied, and only kernels tuned for that
        layout serve it); or batches of them (batch x rows x cols, torch.bmm's and
        torch.matmul's shapes; several batch dimensions, 2 x 3 x rows x cols, where they
        fold into one stride as a view of them as one would), each at a batch stride of
        its own: a stride of 0 (an expanded tensor), a batch of one or a 2-D operand
        beside a batch is shared by every problem of it (batch dimensions broadcast as
        torch.matmul's, a batch of one against many); an A whose problems' rows lie one
        after another (x.view(-1, K) takes them) times a 2-D B runs as one product of all
        its rows, as torch.matmul runs x @ W (C, given or made, likewise). C (M x N, or
        the batch dimensions x M x N) is row-major; its type is a given C's, or
        `out_dtype` (float32, float16, bfloat16: a torch, numpy or cupy dtype, or a name),
        else the inputs' type for float16 and bfloat16 inputs
        (as torch.matmul) and float32 for float32 ones; FP32 accumulation always, one
        rounding to C's type. A vector (1-D) is one row of A or one column of B, a view of
        the caller's memory, and C loses that dimension, as torch.matmul's.
        `bias`: a vector of N elements of C's type or float32 (unit stride), added to every
        row; `activation`: "relu", "gelu" (erf), "gelu_tanh" or "silu", applied last, in
        FP32. Any dimension may be 0, as torch.matmul takes it: with M, N or the batch 0
        nothing runs (C has no elements); with K = 0, C = act(beta * C + bias).

        Operands are torch tensors, cupy arrays, pycuda GPUArrays or any object exposing
        __cuda_array_interface__, used in place, or numpy matrices: when A, B and C are all
        numpy, the product runs as a pipeline over chunks of rows, its copies through
        pinned buffers overlapping the compute (tuner.runtime.host; `pipeline=False`:
        copy in, compute, copy out, one after the other; "pageable": the same pipeline
        without pinned staging, to show why it is there). Rows (columns) may be padded: a
        leading dimension >= their length; along them the stride must be one element.
        float32 inputs run the fp32 entries, or with `allow_tf32` the tf32
        ones (cuBLAS with TF32 where none wins), or with `allow_3xtf32` the 3xTF32 ones
        beside the fp32 ones (fp32 accuracy; cuBLAS SGEMM is their rival).

        The call runs on `stream` when given (an int handle or a torch, cupy, pycuda or
        CUDA Python stream), else on torch's current stream for torch tensors, cupy's for
        cupy arrays, else the legacy default stream; on the GPU holding the operands,
        from any thread, and inside CUDA-graph capture. `measure` (default: the library's
        `measure` attribute: on, unless GEMM_TUNE_MEASURE=0 or load_library(...,
        measure=False)) lets a call with no exact entry be decided by timing the best
        candidates and cuBLAS once per M-bucket, as this call runs them; off, nothing is
        timed: the dispatch table's decisions, else the estimates, decide (see
        tuner.runtime.dispatch and Library.explain). Returns C (allocated like A when None
        is passed).
        Raises LibraryError, before any launch, for what it cannot serve.

        `static_b`: the caller's promise that B is not written by the work ahead of this
        call on its stream (a weight matrix under inference, the usual case of a decode
        shape). A kernel with a twin that starts loading B before that work has finished
        (the decode family's ``_pb1``: its loads of B overlap the previous kernel's tail
        under programmatic dependent launch), which the tuner stores beside each decode
        entry, then runs in its place; without the promise it never does, since the
        work ahead may be what writes B.

        Where autograd records a torch call (gradients on, an input requiring one),
        torch's own ops run it (torch.matmul, alpha, the bias and the activation after),
        so that gradients flow as through torch.matmul; a C passed in is refused there, as
        torch.matmul refuses out=. The tuned kernels have no backward: under
        torch.no_grad() or torch.inference_mode() they run.

        On torch tensors, a call with no `stream`, `out_dtype`, `measure` or TF32 flags is
        served from the second call of its key on by the C++ call path (tuner.runtime.fast;
        `self.fast`, once built), the same plan with no Python frame in between.

        Example:
            >>> y = lib.gemm(x, W.t(), bias=b, activation="gelu")  # doctest: +SKIP
        """
        fast = None  # the context word of a call the C++ path may serve (tuner.runtime.fast)
        static_b = static_b if static_b is False else _flag("static_b", static_b)
        if stream is None and measure is None and out_dtype is None and not allow_tf32 \
                and not allow_3xtf32 and (activation is None or type(activation) is str) \
                and activation in _ACT_CODES:
            fast = self.measure | _ACT_CODES[activation] << 2 | _STATIC_B * static_b
            if self.fast is not None:
                R = self.fast.call(A, B, C, bias, alpha, beta, fast)
                if R is not None:
                    return R
        return call.gemm(self, A, B, C, alpha, beta, _mode(allow_tf32, allow_3xtf32),
                         stream, self.measure if measure is None else _flag("measure", measure),
                         pipeline, out_dtype, bias, activation, fast, static_b)

    def gemm_batch(self, pairs, alpha: float = 1.0, beta: float = 0.0, out=None,
                   allow_tf32: bool = False, measure: bool | None = None,
                   allow_3xtf32: bool = False) -> list:
        """C_i = alpha * A_i @ B_i (+ beta * C_i) for a list of (A_i, B_i) numpy pairs, in
        a pipeline over three streams with pinned staging (tuner.runtime.host): item i+1's
        copies in and item i-1's copy out overlap item i's GEMM. `out`: the C_i (numpy, of
        float32 or the inputs' float16; read when beta != 0), else allocated as gemm
        would. Returns the C_i."""
        return call.gemm_batch(self, pairs, alpha, beta, out, _mode(allow_tf32, allow_3xtf32),
                               self.measure if measure is None else _flag("measure", measure))


class _Plans(dict):
    """A library's plans by call key; clear() also empties the C++ path's table (its
    entries are those plans)."""

    __slots__ = ("_lib",)

    def __init__(self, lib: "Library"):
        super().__init__()
        self._lib = weakref.ref(lib)

    def clear(self) -> None:
        super().clear()
        lib = self._lib()
        if lib is not None:
            if lib.fast is not None:
                lib.fast.clear()
            lib.fast_keys.clear()


def _explain_empty(m: int, n: int, k: int, batch: int, bias: bool, act: str) -> str:
    """explain()'s line for a problem with nothing to multiply (call.EmptyProblem)."""
    terms = "beta * C" + (" + bias" if bias else "")
    what = "C has no elements" if not m * n * batch else \
        f"A B has no terms: C = {terms if act == 'none' else f'{act}({terms})'}"
    return (f"an empty problem ({batch} x {m} x {n} x {k}, batch x M x N x K): no kernel and "
            f"no cuBLAS call; {what}")


def _flag(name: str, value) -> bool:
    """A call's yes-or-no argument: a bool (numpy's too), or 0 or 1; LibraryError for
    anything else (measure="no" would read as yes)."""
    if isinstance(value, (bool, np.bool_)) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise LibraryError(f"{name} must be True or False (got {type(value).__name__} "
                       f"{value!r:.40})")


def _mode(allow_tf32: bool, allow_3xtf32: bool) -> DType | None:
    """The fp32 request a call's flags make (see call.fp32_request)."""
    allow_tf32, allow_3xtf32 = _flag("allow_tf32", allow_tf32), _flag("allow_3xtf32",
                                                                      allow_3xtf32)
    if allow_tf32 and allow_3xtf32:
        raise LibraryError("allow_tf32 and allow_3xtf32 exclude each other")
    return DType.TF32 if allow_tf32 else DType.F32X3 if allow_3xtf32 else None


def _torch_sees_a_gpu() -> bool:
    """Is torch installed, with a CUDA device it can use? Only then can a call take the
    torch route: a CPU-only torch, or one whose driver finds no GPU, cannot make a torch
    caller's tensors (where gemm-tune's own driver binding may still reach the GPU)."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - not installed, or installed without its libraries
        return False
    return bool(torch.cuda.is_available())


def _check_shape_question(sizes: dict, device, gpu, layout, bias, activation, ld, align,
                          route) -> None:
    """explain(m, n, k, ...)'s arguments as gemm would take them; LibraryError (one line)
    for any other."""
    def refuse(what: str) -> None:
        raise LibraryError(f"explain: {what}")

    for name, v in sizes.items():
        if not whole(v):
            refuse(f"{name} must be a whole number (got {type(v).__name__} {v!r:.40})")
    if device is not None and not whole(device):
        refuse(f"device must be a GPU's index (got {device!r:.40})")
    if gpu is not None and not isinstance(gpu, str):
        refuse(f"gpu must name a GPU model, e.g. \"H200\" (got {gpu!r:.40})")
    if not isinstance(layout, Layout) and layout not in {x.value for x in Layout}:
        refuse(f"layout {layout!r:.40} is not one of {', '.join(x.value for x in Layout)} "
               "(A's letter first, t: column-major)")
    if bias not in BIASES:
        refuse(f"bias {bias!r:.40} is not one of {', '.join(BIASES)}")
    if activation is not None:
        call._activation(activation)
    for name, v, ok in (("ld", ld, whole), ("align", align, lambda a: a in (1, 2, 4, 8, 16))):
        if v is not None and not (isinstance(v, (tuple, list)) and len(v) == 3
                                  and all(whole(x) and ok(x) for x in v)):
            refuse(f"{name} must be three whole numbers for A, B and C"
                   + (" among 1, 2, 4, 8 and 16 (bytes)" if name == "align" else "")
                   + f" (got {v!r:.40})")
    if route not in (None, "torch", "gemm-tune"):
        refuse(f"route {route!r:.40} is not \"torch\" or \"gemm-tune\"")


def _case(dtype: DType, m: int, n: int, k: int, layout, out_dtype, bias: str, activation,
          batch: int, ld: tuple | None, align: tuple | None, route: str) -> Case:
    """The Case explain() asks about by shape (see Library.explain)."""
    out = _out_dtype(out_dtype) or (dtype if dtype in (DType.F16, DType.BF16) else DType.F32)
    variant = Variant(Layout(layout) if isinstance(layout, str) else layout, out, bias,
                      activation or "none")
    packed = packed_ld(variant.layout, m, n, k)
    ld = tuple(ld) if ld is not None else packed
    if len(ld) != 3 or any(x < p for x, p in zip(ld, packed)):
        raise LibraryError(f"ld {ld}: give (lda, ldb, ldc), each at least its line's length "
                           f"{packed}")
    sizes = (dtype.size, dtype.size, out.size)
    align = tuple(align) if align is not None else tuple(
        align_class(0, x, size) for x, size in zip(ld, sizes))
    tight = ld_class(variant.layout, m, n, k, ld)
    return Case(dtype, m, n, k, variant, batch, align, tight, route)


def _packed(g, dtype: DType, m: int, n: int, k: int, variant: Variant, batch: int,
            via_torch: bool) -> "call.Problem":
    """The Problem of a call on packed operands starting on 256-byte boundaries."""
    mode = dtype if dtype in (DType.TF32, DType.F32X3) else None
    ta, tb = variant.layout.value
    lda, ldb, _ = packed_ld(variant.layout, m, n, k)
    a = ((batch, m, k), (m * k,) + ((1, m) if ta == "t" else (k, 1)))
    b = ((batch, k, n), (k * n,) + ((1, k) if tb == "t" else (n, 1)))
    c = ((batch, m, n), (m * n, n, 1))
    geometry = (a, b, c, None if variant.bias == "none" else ((n,), (1,)))
    if batch == 1:
        geometry = tuple(x if x is None or len(x[0]) == 1 else (x[0][1:], x[1][1:])
                         for x in geometry)
    strides = (m * k, k * n, m * n) if batch > 1 else (0, 0, 0)
    align = tuple(align_class(0, ld, size, st) for ld, size, st in
                  zip((lda, ldb, n), (dtype.size, dtype.size, variant.out.size), strides))
    return call.Problem(g, dtype, m, n, k, lda, ldb, n, (0, 0, 0), via_torch, mode, True, 0,
                        None, variant, batch, strides, geometry, align)


def load_library(path: str | Path = "artifacts/library", measure: bool | None = None,
                 m_buckets: str | MBuckets | None = None, pace: str | None = None) -> Library:
    """Open a tuned-kernel library: every file's sha256 is checked and every config
    re-validated before anything runs. `measure`: False for no measuring at run time
    (decisions from the library and the dispatch table only, identical in every process:
    for multi-rank jobs; default: on unless GEMM_TUNE_MEASURE=0). `m_buckets`: the
    M-buckets that share a decision ("1,2,4,8,16,32,64,+128" by default, or
    GEMM_TUNE_M_BUCKETS; "exact": none shared; see tuner.runtime.dispatch). `pace`: what
    sets the program's pace, for the first-use measurements (tuner.runtime.measure.PACES):
    "either" (the default, or GEMM_TUNE_PACE's; both the caller's loop and the GPU's time
    alone weighed), "gpu" (a host that runs ahead, CUDA graphs: a kernel must beat cuBLAS
    on the GPU alone) or "host" (the caller's loop alone). Decisions are kept apart by it.

    Example:
        >>> lib = load_library("artifacts/library")            # doctest: +SKIP
        >>> lib.explain(4096, 4096, 4096, "fp32")               # doctest: +SKIP
        'gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g1 (exact): ...'
        >>> C = lib.gemm(A, B)   # torch / cupy / pycuda / numpy  # doctest: +SKIP
    """
    return Library.load(path, verify=True, measure=measure, m_buckets=m_buckets, pace=pace)
