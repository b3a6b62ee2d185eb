"""The library's call path in C++ for torch callers (fast.cpp, a torch extension).

A small call's time is the host's: through Python, reading the operands and building the
memo key alone costs 2-3 us on the H200's host, where torch.matmul's whole call costs
10-16 us (bench/NOTES.md). So `lib.gemm` on torch tensors first asks a C++ table, keyed by
what the call reads off its tensors (type, shape, strides, 16-byte alignment and device of
A, B, C and the bias), the current stream and torch's TF32 flag. A key it holds runs with
no Python frame in between:
  - cuBLAS as torch runs it: a plain product (2-D, no bias or activation, C of the inputs'
    type) calls cuBLAS itself on torch's handle (cublasSgemm / cublasGemmEx as
    at::cuda::blas::gemm calls them, on the handle's stream, workspace and math mode as
    torch sets them, wherever torch would call cuBLAS itself: cuBLAS preferred over
    cuBLASLt, TunableOp off, default reduced-precision settings, no deterministic mode),
    torch.mm's bits, ATen's dispatch and checks skipped (measured: no cheaper than
    torch.mm's own call, cuBLAS's host work being most of it; bench/NOTES.md); anything
    else goes through ATen (at::mm, at::addmm, at::linear; at::bmm and at::baddbmm for a
    batch, a 2-D operand expanded over it) as the Python path calls it;
  - or the plan's kernel launches, recorded once: the plan's runner (the same one the tuner
    times: tuner.runtime.runners) is bound afresh and run inside driver.recording() with
    stand-in pointers and scalars (SENTINELS), which marks the parameter-block slots and
    tensor-map addresses that come from A, B, C, the bias, alpha and beta; C++ replays the
    launches with the call's own, encoding the tensor maps per call.
Everything else (a first call, which decides and measures; a recording of problems; a
batch with a bias on cuBLAS; streams passed by hand; fp32 requests for TF32 or 3xTF32;
another output type or an activation) takes the Python path (tuner.runtime.call), which
adds the plan of an eligible key here once.

The extension is compiled on first use in a background thread (torch.utils.cpp_extension,
which needs ninja and a host C++ compiler; about 20 s) into the cache directory, keyed by
the source and torch's version, and loaded from there by later processes. One process
builds at a time (:func:`builder_lock`); a process that ends mid-build (a short program, a
kill) leaves nothing that stops the next one from building. Until it is ready, or where it
cannot be built (:func:`status` says why), calls take the Python path.
GEMM_TUNE_FAST=0 turns it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import threading
from pathlib import Path

from tuner.runtime import driver
from tuner.runtime.errors import env_flag

__all__ = ["SENTINELS", "ACT_CODES", "context", "status", "start", "wait", "builder_lock",
           "new_table", "table", "offer", "record", "translate", "blas_report", "blas_calls"]

log = logging.getLogger(__name__)

#: the sources a launch slot may come from (fast.cpp's Source)
A, B, C, BIAS, ALPHA, BETA, FIXED = 0, 1, 2, 3, 4, 5, -1
#: stand-in pointers for A, B, C and the bias while a plan's launches are recorded: far
#: above any device address, each with 2^48 bytes of room for offsets into its operand
SENTINELS = {A: 0x7A << 52, B: 0x7B << 52, C: 0x7C << 52, BIAS: 0x7D << 52}
_SPAN = 1 << 48
#: stand-in alpha and beta: large finite floats no kernel parameter takes otherwise
_ALPHA_BITS, _BETA_BITS = 0x7F7EA1F1, 0x7F7EBE7A
ALPHA_STANDIN = struct.unpack("<f", struct.pack("<I", _ALPHA_BITS))[0]
BETA_STANDIN = struct.unpack("<f", struct.pack("<I", _BETA_BITS))[0]
_OUT_CODE = {"f32": 0, "f16": 1, "bf16": 2}  # C's type, by DType.short
#: an activation's code in the context word (fast.cpp's Entry::act)
ACT_CODES = {None: 0, "none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_LINEAR = 2  # the context word's bit of a linear call's key
#: ... of a call whose B the caller promised constant (static_b: its plan may run a twin)
STATIC_B = 1 << 5


def context(measure: bool, act: str | None = None, linear: bool = False,
            static_b: bool = False) -> int:
    """The context word of a call's key: measuring on or off, the activation, linear, a
    constant B (only ever part of the key: fast.cpp reads nothing else of it)."""
    return int(measure) | _LINEAR * linear | ACT_CODES[act] << 2 | STATIC_B * static_b

_LOCK = threading.Lock()
_STATE: dict = {"module": None, "error": None, "thread": None}


def status() -> str:
    """Whether the C++ call path serves torch callers here, and if not, why."""
    if not env_flag("GEMM_TUNE_FAST"):
        return f"off (GEMM_TUNE_FAST={os.environ['GEMM_TUNE_FAST']})"
    if _STATE["module"] is not None:
        return "on"
    if _STATE["error"] is not None:
        return f"off: it could not be built ({_STATE['error']})"
    if _STATE["thread"] is not None:
        return "building (the Python path serves calls until it is ready)"
    return "not built yet (it builds on the first call with torch tensors)"


def start() -> None:
    """Build or load the extension in a background thread, once per process."""
    if _STATE["thread"] is not None or not env_flag("GEMM_TUNE_FAST"):
        return
    with _LOCK:
        if _STATE["thread"] is None:
            _STATE["thread"] = threading.Thread(target=_load, name="gemm-tune-fast",
                                                daemon=True)
            _STATE["thread"].start()


def wait(timeout: float | None = None) -> bool:
    """Start the build if needed and wait for it (`timeout` seconds); is the path on?"""
    start()
    t = _STATE["thread"]
    if t is not None:
        t.join(timeout)
    return _STATE["module"] is not None


def _load() -> None:
    try:
        _STATE["module"] = _build()
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path serving
        msg = str(e).strip().splitlines()
        _STATE["error"] = (msg[-1] if msg else type(e).__name__)[:300]
        log.info("gemm-tune: the C++ call path is off: %s", _STATE["error"])


def _build():
    import torch
    from torch.utils import cpp_extension

    from tuner.runtime.dispatch import _cache_root

    src = Path(__file__).with_name("fast.cpp")
    tag = hashlib.sha256(src.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    where = _cache_root() / "fast" / tag
    where.mkdir(parents=True, exist_ok=True)
    home = Path(cpp_extension.CUDA_HOME or "/usr/local/cuda")
    if not (home / "include" / "cuda.h").exists():
        raise RuntimeError(f"cuda.h is not under {home}/include: set CUDA_HOME to the "
                           "CUDA toolkit")
    with builder_lock(where):
        return cpp_extension.load(
            name=f"gemm_tune_fast_{tag}", sources=[str(src)], build_directory=str(where),
            extra_include_paths=[str(home / "include")], extra_cflags=["-O2"],
            extra_ldflags=[f"-L{home / 'lib64'}", f"-L{home / 'lib64' / 'stubs'}", "-lcuda"],
            verbose=False)


@contextlib.contextmanager
def builder_lock(where: Path):
    """Hold the build directory `where` for one builder: an flock, which the kernel drops
    when its process ends, however it ends. torch's own lock there (cpp_extension's
    FileBaton, the file `lock`) is a file that a builder killed mid-build leaves behind,
    and every later build would wait on it for ever (a program that exits within the
    build's 20 s does so: its build thread is a daemon). Under the flock no other builder
    can hold it, so one found there is stale and is removed."""
    with open(where / "build.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = where / "lock"
            if stale.exists():
                log.info("gemm-tune: removing %s, left by a build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def blas_report() -> dict | None:
    """Why the C++ path calls cuBLAS itself for a plain product on the torch route, or goes
    through ATen (fast.cpp's Blas: its symbols found, torch preferring cuBLAS to cuBLASLt,
    no deterministic algorithms, TunableOp off, the reduced-precision settings torch's
    defaults); None while the extension is not loaded."""
    m = _STATE["module"]
    return None if m is None else dict(m.blas_report())


def blas_calls() -> int:
    """How many products the C++ path has handed cuBLAS itself in this process (0 while the
    extension is not loaded)."""
    m = _STATE["module"]
    return 0 if m is None else int(m.blas_calls())


def new_table():
    """An empty C++ table, or None while the extension is not loaded (its build started)."""
    m = _STATE["module"]
    if m is None:
        start()
        return None
    import torch

    return m.new_table((torch.Tensor, torch.nn.Parameter))


def table(lib):
    """`lib`'s C++ table (made on first use), or None while the extension is not loaded."""
    t = lib.fast
    if t is None:
        t = new_table()
        if t is not None:
            with _LOCK:
                t = lib.fast = lib.fast or t
    return t


def offer(t, lib, plan, A, B, C, bias, ctx: int, stream: int) -> bool:
    """Add the plan of a torch call on these operands (made on `stream`) to C++ table `t`,
    where it may be replayed; is it there now? A linear call's (`ctx` says so) are x, its
    weight W (not W.t()) and the bias, C None."""
    if plan.tally is not None or not plan.memo:
        return False
    act, linear = plan.problem.variant.act, bool(ctx & _LINEAR)
    # x @ W with x's batch folded into one matrix of rows (call._rows): fast.cpp folds it
    # alike, and a C it allocates has x's leading dimensions
    folded = A.dim() >= 3 and len(plan.out_shape) == 2
    if plan.torch_run is not None:  # torch's ops, as the Python path calls them
        if linear:
            if bias is not None and bias.dtype != A.dtype:
                return False
        else:  # fast.cpp's torch_call: matrices by mm/addmm (folded ones among them), a
            # batch (no bias) by bmm/baddbmm
            matrices = B.dim() == 2 and len(plan.out_shape) == 2
            as_cpp = B.dim() == 2 and (folded or A.dim() == 2 and (C is None or C.dim() == 2))
            if act != "none" or matrices != as_cpp or (bias is not None and not matrices):
                return False
        t.add(A, B, C, bias, ctx, True, 0, [] if linear else list(plan.out_shape), [],
              ACT_CODES[act], linear)
        return True
    if plan.choice.kernel is None or driver.is_capturing(stream):
        return False  # cuBLAS through gemm-tune's binding: not a kernel launch
    launches = record(lib, plan, stream, bias is not None)
    shape = list(A.shape[:-1]) + [plan.n] if linear or folded else list(plan.out_shape)
    t.add(A, B, C, bias, ctx, False, _OUT_CODE[plan.out.short], shape, launches, 0, linear)
    return True


def record(lib, plan, stream: int, bias: bool) -> list:
    """The launches of `plan`'s kernel on stand-in operands, for fast.cpp (translate)."""
    with driver.recording() as rec, driver.entered(plan.gpu):
        run = plan.problem.build(lib, plan.choice).run
        run(SENTINELS[A], SENTINELS[B], SENTINELS[C], ALPHA_STANDIN, BETA_STANDIN, stream,
            SENTINELS[BIAS] if bias else 0)
    return [translate(launch) for launch in rec.launches]


def _source(value: int) -> tuple[int, int] | None:
    for src, base in SENTINELS.items():
        if base <= value < base + _SPAN:
            return src, value - base
    return None


def translate(launch: driver.RecordedLaunch) -> tuple:
    """A recorded launch as fast.cpp's Table.add takes it: (function, name, grid, block,
    cluster, smem, parameter bytes, patches (offset, source, offset into it), tensor maps
    (source, offset or address, then cuTensorMapEncodeTiled's arguments as integers),
    dependent (launched with programmatic stream serialization)).
    Raises ValueError where a stand-in shows up anywhere but whole in a slot."""
    params, patches = launch.params, []
    for i, kind in enumerate(launch.signature):
        off = 8 * i
        slot = params[off:off + 8]
        if kind in "PL":
            hit = _source(int.from_bytes(slot, "little"))
            if hit is not None:
                patches.append((off, *hit))
                continue
        elif kind == "f":
            bits = int.from_bytes(slot[:4], "little")
            if bits in (_ALPHA_BITS, _BETA_BITS):
                patches.append((off, ALPHA if bits == _ALPHA_BITS else BETA, 0))
                continue
        if _stand_in(slot):
            raise ValueError(f"{launch.name}: parameter {i} ({kind}) holds a stand-in value "
                             "that is not a whole pointer or scalar")
    return (launch.function, launch.name, launch.grid, launch.block, launch.cluster,
            launch.smem, params, patches, [_map(m) for m in launch.maps], launch.dependent)


def _stand_in(slot: bytes) -> bool:
    """Does an 8-byte slot hold any part of a stand-in (a pointer's top bits, a scalar)?"""
    v = int.from_bytes(slot, "little")
    return (v >> 52) in _TOPS or (v & 0xFFFFFFFF) in _SCALARS or (v >> 32) in _SCALARS


_TOPS = {base >> 52 for base in SENTINELS.values()}
_SCALARS = (_ALPHA_BITS, _BETA_BITS)


def _map(args: dict) -> tuple:
    from cuda.bindings import driver as cu  # the enums' values (no GPU needed)

    address = int(args["globalAddress"])
    src, add = _source(address) or (FIXED, address)
    return (src, add, int(getattr(cu.CUtensorMapDataType, args["tensorDataType"])),
            int(args["tensorRank"]), list(args["globalDim"]), list(args["globalStrides"]),
            list(args["boxDim"]), list(args["elementStrides"]),
            int(getattr(cu.CUtensorMapInterleave, args["interleave"])),
            int(getattr(cu.CUtensorMapSwizzle, args["swizzle"])),
            int(getattr(cu.CUtensorMapL2promotion, args["l2Promotion"])),
            int(getattr(cu.CUtensorMapFloatOOBfill, args["oobFill"])))
