"""Host side of the wgmma family: TMA tensor maps and the cluster launch, through
cuda.bindings (the CUDA driver API), imported only when first used.

The pure parts (:func:`tensor_map_args`, from tuner/runtime/tma.py, and
:func:`kernel_arg_layout`) run anywhere and
are tested without a GPU; :func:`encode_tensor_map`, :func:`load_function` and
:func:`launch` need the driver and a current context (torch's primary context, for one).

Example (on a GPU):
    >>> fn = load_function(cubin_bytes, cfg.name)                # doctest: +SKIP
    >>> launch(fn, cfg, m, n, k, 1.0, a_ptr, lda, b_ptr, ldb, 0.0, c_ptr, ldc, stream)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import logging

from codegen.config import DType
from codegen.families.wgmma import SWIZZLE_BYTES, WgmmaConfig, c_tma_reasons, tma_reasons
from tuner.outcome import LaunchError
from tuner.runtime import tma
from tuner.runtime.tma import TmaUnsupported, tensor_map_args

__all__ = ["TmaUnsupported", "tensor_map_args", "encode_tensor_map", "load_function",
           "load_functions", "load_kernel_functions",
           "launch", "bind", "WgmmaKernel", "kernel_arg_layout", "clear_caches"]

log = logging.getLogger(__name__)


def _cu():
    from cuda.bindings import driver as cu  # lazily: importing tuner loads no GPU package

    return cu


def _check(result):
    """(CUresult, *values) -> values; LaunchError (a RuntimeError) naming the driver's
    error otherwise."""
    cu = _cu()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise LaunchError(f"CUDA driver error {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


# ---- tensor maps (the rules and the encoding are tuner/runtime/tma.py's) -----------------
_MAPS: dict[tuple, object] = {}


def encode_tensor_map(dtype: DType, ptr: int, rows: int, cols: int, ld: int, box_rows: int,
                      box_cols: int, swizzle: str = "128B"):
    """A CUtensorMap for the row-major matrix at ptr, cached per (dtype, pointer, shape,
    leading dimension, box, swizzle). Raises TmaUnsupported where TMA cannot describe it."""
    key = (dtype, ptr, rows, cols, ld, box_rows, box_cols, swizzle)
    tm = _MAPS.get(key)
    if tm is None:
        tm = _MAPS[key] = tma.encode(tensor_map_args(dtype, ptr, rows, cols, ld, box_rows,
                                                     box_cols, swizzle))
    return tm


def clear_caches() -> None:
    """Forget cached tensor maps (after freeing the buffers they describe)."""
    _MAPS.clear()


# ---- modules and launches -----------------------------------------------------------
def ensure_context():
    """Make sure a CUDA context is current (the device's primary one, as torch uses)."""
    cu = _cu()
    _check(cu.cuInit(0))
    ctx = _check(cu.cuCtxGetCurrent())
    if ctx is None or int(ctx) == 0:
        dev = _check(cu.cuDeviceGet(0))
        ctx = _check(cu.cuDevicePrimaryCtxRetain(dev))
        _check(cu.cuCtxSetCurrent(ctx))
    return ctx


_MODULES: list = []  # loaded modules stay loaded for the process


def load_functions(cubin: bytes, *names: str) -> list:
    """cuModuleLoadData + cuModuleGetFunction of each name (the module is kept alive)."""
    cu = _cu()
    ensure_context()
    module = _check(cu.cuModuleLoadData(cubin))
    _MODULES.append(module)
    return [_check(cu.cuModuleGetFunction(module, name.encode())) for name in names]


def load_function(cubin: bytes, name: str):
    """One function of a cubin (see load_functions)."""
    return load_functions(cubin, name)[0]


def load_kernel_functions(cubin: bytes, config: WgmmaConfig) -> tuple:
    """(GEMM function, pre-pass function or None) of a config's cubin."""
    if config.prep:
        main, prep = load_functions(cubin, config.name, f"{config.name}_prep")
        return main, prep
    return load_function(cubin, config.name), None


_WORKSPACE: list = []  # [(pointer, bytes)]: the pre-pass's copies, grown, kept for the process


def _workspace(nbytes: int) -> int:
    """A device buffer of at least `nbytes` for the tf32 pre-pass (one for the process: the
    tuner times one candidate at a time)."""
    if not _WORKSPACE or _WORKSPACE[-1][1] < nbytes:
        cu = _cu()
        _WORKSPACE.append((int(_check(cu.cuMemAlloc(max(nbytes, 1 << 20)))), max(nbytes, 1 << 20)))
    return _WORKSPACE[-1][0]


@functools.cache
def _sm_count() -> int:
    cu = _cu()
    dev = _check(cu.cuCtxGetDevice())
    return _check(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))


_SMEM_SET: set[int] = set()


def _allow_smem(function, nbytes: int) -> None:
    key = int(function)
    if key not in _SMEM_SET:
        cu = _cu()
        _check(cu.cuFuncSetAttribute(
            function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            nbytes))
        _SMEM_SET.add(key)


def kernel_arg_layout(m: int, n: int, k: int, alpha: float, beta: float, c: int,
                      ldc: int) -> list[tuple[str, object]]:
    """The scalar kernel arguments after the tensor maps (A and B, and C with the TMA-store
    epilogue), as (name, ctypes value)."""
    return [("M", ctypes.c_int32(m)), ("N", ctypes.c_int32(n)), ("K", ctypes.c_int32(k)),
            ("alpha", ctypes.c_float(alpha)), ("beta", ctypes.c_float(beta)),
            ("C", ctypes.c_uint64(c)), ("ldc", ctypes.c_int32(ldc))]


def launch(function, config: WgmmaConfig, m: int, n: int, k: int, alpha: float, a: int,
           lda: int, b: int, ldb: int, beta: float, c: int, ldc: int, stream=0,
           prep_function=None) -> None:
    """C = alpha * A * B + beta * C with the wgmma kernel `function` of `config`; a, b, c
    are device addresses, stream a CUstream or its integer handle.

    Raises:
        TmaUnsupported: A or B (or, with the TMA-store epilogue, C) break a TMA rule
            (tma_reasons and c_tma_reasons say which); nothing is launched.
    """
    bind(function, config, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream,
         prep_function)()


def launch_config(config: WgmmaConfig, m: int, n: int, sms: int) -> dict:
    """The launch geometry of `config` at M x N on `sms` SMs, as plain values: what
    cuLaunchKernelEx is given (pure; tested without a GPU)."""
    return dict(grid=config.grid(m, n, sms), block=config.block(), smem=config.smem_bytes,
                cluster=config.cluster_dims())


def bind(function, config: WgmmaConfig, m: int, n: int, k: int, alpha: float, a: int,
         lda: int, b: int, ldb: int, beta: float, c: int, ldc: int, stream=0,
         prep_function=None):
    """Everything of a launch but the launch: the TMA checks, the tensor maps, the argument
    block and the launch configuration, built once; returns a callable that only calls
    cuLaunchKernelEx (a few microseconds of host time, so a timing loop measures the
    kernel, not Python).

    Raises:
        TmaUnsupported: A or B (or, with the TMA-store epilogue, C) break a TMA rule
            (tma_reasons and c_tma_reasons say which).
    """
    cu = _cu()
    boxes = config.tma_boxes()
    if config.store:  # the TMA-store epilogue writes C through its own map
        why = c_tma_reasons(ldc, c, n)
        if why:
            raise TmaUnsupported("; ".join(why))
    prep = None
    if config.prep:  # the maps describe the pre-pass's copies: At (M x K), Bt (N x K)
        if prep_function is None:
            raise ValueError(f"{config.name} needs its pre-pass function ({config.name}_prep)")
        ldw = config.prep_ld(k)
        at = _workspace(config.prep_floats(m, n, k) * 4)
        bt = at + m * ldw * 4
        tm_a = encode_tensor_map(DType.F32, at, m, k, ldw, *boxes["A"])
        tm_b = encode_tensor_map(DType.F32, bt, n, k, ldw, *boxes["B"])
        blocks, a_blocks = config.prep_grid(m, n, k)
        prep_args = [ctypes.c_uint64(a), ctypes.c_int32(lda), ctypes.c_uint64(b),
                     ctypes.c_int32(ldb), ctypes.c_int32(m), ctypes.c_int32(n),
                     ctypes.c_int32(k), ctypes.c_uint64(at), ctypes.c_uint64(bt),
                     ctypes.c_int32(ldw), ctypes.c_int32(a_blocks)]
        prep_params = (ctypes.c_void_p * len(prep_args))(*[ctypes.addressof(v) for v in prep_args])
        prep = (prep_function, blocks, prep_args, prep_params)
    else:
        why = tma_reasons(config.dtype, lda, ldb, a, b, m, n, k)
        if why:
            raise TmaUnsupported("; ".join(why))
        # fp32 data (tf32, 3xTF32) travels as FLOAT32, bit for bit: the kernel rounds it
        tm_a = encode_tensor_map(config.tma_dtype, a, m, k, lda, *boxes["A"])
        tm_b = encode_tensor_map(config.tma_dtype, b, k, n, ldb, *boxes["B"])
    maps = [tm_a, tm_b]
    if config.store:
        maps.append(encode_tensor_map(DType.F32, c, m, n, ldc, *boxes["C"]))
    _allow_smem(function, config.smem_bytes)

    scalars = kernel_arg_layout(m, n, k, alpha, beta, c, ldc)
    ptrs = [tm.getPtr() for tm in maps] + [ctypes.addressof(v) for _, v in scalars]
    params = (ctypes.c_void_p * len(ptrs))(*ptrs)
    geometry = launch_config(config, m, n, _sm_count())

    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = geometry["grid"]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = geometry["block"]
    cfg.sharedMemBytes = geometry["smem"]
    cfg.hStream = stream if isinstance(stream, cu.CUstream) else cu.CUstream(int(stream or 0))
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = \
        geometry["cluster"]
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    address = ctypes.addressof(params)
    keep = (maps, scalars, params, cfg, prep)  # alive as long as the closure

    def run() -> None:
        if prep is not None:
            _check(cu.cuLaunchKernel(prep[0], prep[1], 1, 1, 256, 1, 1, 0, cfg.hStream,
                                     ctypes.addressof(prep[3]), 0))
        _check(cu.cuLaunchKernelEx(cfg, function, address, 0))

    run.keep = keep
    return run


class WgmmaKernel:
    """A wgmma configuration loaded into the current context (pycuda's primary context is
    the one cuda.bindings sees), called like tuner.gpu.Kernel: the tuner's runner loads
    this family's candidates through it (FamilySpec.kernel).

    Each distinct call (problem, pointers, scalars, stream) is bound once (:func:`bind`)
    and replayed, so repeated timing launches cost only cuLaunchKernelEx.
    """

    def __init__(self, config: WgmmaConfig, cubin):
        from pathlib import Path

        self.config = config
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        self.function, self.prep_function = load_kernel_functions(image, config)
        self.smem = config.smem_bytes
        self._bound: dict[tuple, object] = {}

    @property
    def attributes(self) -> dict:
        """What the driver says of the loaded function (to check against ptxas)."""
        cu = _cu()
        A = cu.CUfunction_attribute

        def get(a):
            return int(_check(cu.cuFuncGetAttribute(a, self.function)))

        return dict(registers=get(A.CU_FUNC_ATTRIBUTE_NUM_REGS),
                    smem_static=get(A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                    local_bytes=get(A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                    max_threads=get(A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))

    def __call__(self, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream=None):
        """Launch on device addresses (ints or objects int() takes); asynchronous.
        TmaUnsupported where the operands break a TMA rule (nothing launched)."""
        s = int(getattr(stream, "handle", stream) or 0)
        key = (m, n, k, float(alpha), int(a), lda, int(b), ldb, float(beta), int(c), ldc, s)
        run = self._bound.get(key)
        if run is None:
            run = self._bound[key] = bind(self.function, self.config, m, n, k, alpha, int(a),
                                          lda, int(b), ldb, beta, int(c), ldc, s,
                                          self.prep_function)
        run()
