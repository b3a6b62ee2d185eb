"""The GPU: one pycuda context (the device's primary context, shared with cuBLAS,
torch and cupy), its limits read from the device, and kernels loaded from cubins.

pycuda is imported here, lazily, and nowhere in codegen.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
from pathlib import Path

from codegen.arch import ARCHS
from codegen.config import KernelConfig
from codegen.errors import UsageError
from tuner.runtime.driver import DeviceInfo

__all__ = ["NoGPUError", "Device", "device", "Kernel", "load_kernel", "driver_occupancy",
           "cublas"]

log = logging.getLogger(__name__)


class NoGPUError(UsageError):
    """No usable CUDA GPU (or no pycuda) on this machine."""


Device = DeviceInfo  # the tuner's view of its GPU: the run-time library's, without a context


def _drv():
    try:
        import pycuda.driver as drv
    except ImportError as e:
        raise NoGPUError(
            f"timing needs a CUDA GPU and pycuda ({e}); install '.[cuda]', or use --dry-run"
        ) from None
    return drv


@functools.cache
def device(index: int | None = None) -> Device:
    """Open the GPU once per process (primary context, pushed on this thread)."""
    drv = _drv()
    index = int(os.environ.get("GEMM_TUNE_DEVICE", 0)) if index is None else index
    try:
        drv.init()
        dev = drv.Device(index)
        ctx = dev.retain_primary_context()
        ctx.push()
    except drv.Error as e:
        raise NoGPUError(
            f"timing needs a CUDA GPU, and the driver found none usable ({e}); "
            "use --dry-run to generate, compile and model without one"
        ) from None
    atexit.register(_pop, ctx)
    A = drv.device_attribute
    attrs = dev.get_attributes()
    major, minor = dev.compute_capability()
    cc = major * 10 + minor
    base = ARCHS.get(cc) or ARCHS[max(ARCHS)]

    def get(name, default):
        key = getattr(A, name, None)
        return int(attrs.get(key, default)) if key is not None else default

    arch = base.replace(
        cc=cc,
        max_threads_per_block=get("MAX_THREADS_PER_BLOCK", base.max_threads_per_block),
        max_threads_per_sm=get("MAX_THREADS_PER_MULTIPROCESSOR", base.max_threads_per_sm),
        max_blocks_per_sm=get("MAX_BLOCKS_PER_MULTIPROCESSOR", base.max_blocks_per_sm),
        regs_per_sm=get("MAX_REGISTERS_PER_MULTIPROCESSOR", base.regs_per_sm),
        regs_per_block=get("MAX_REGISTERS_PER_BLOCK", base.regs_per_block),
        smem_per_sm=get("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", base.smem_per_sm),
        smem_per_block=get("MAX_SHARED_MEMORY_PER_BLOCK", base.smem_per_block),
        smem_per_block_optin=get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", base.smem_per_block_optin),
        smem_reserved_per_block=get("RESERVED_SHARED_MEMORY_PER_BLOCK",
                                    base.smem_reserved_per_block),
        sm_count=get("MULTIPROCESSOR_COUNT", base.sm_count),
        clock_mhz=get("CLOCK_RATE", base.clock_mhz * 1000) // 1000 or base.clock_mhz,
        name=dev.name(),
    )
    return Device(index=index, name=dev.name(), cc=cc, arch=arch,
                  l2_bytes=get("L2_CACHE_SIZE", 0), total_mem=dev.total_memory(),
                  driver_version=drv.get_driver_version())


@functools.cache
def cublas():
    """The tuner's cuBLAS handle (the baseline), in this process's primary context."""
    from tuner.runtime.cublas import Cublas

    device()  # the primary context must be current before cublasCreate
    return Cublas()


def _pop(ctx):
    try:
        ctx.pop()
    except Exception:  # noqa: BLE001 - at exit, the context may be gone already
        pass


_WORKSPACE: list = [None, 0]  # one split-K workspace per process: [allocation, bytes]


def workspace(nbytes: int):
    """A device buffer of at least `nbytes`, grown (never shrunk) as split-K kernels need."""
    if _WORKSPACE[1] < nbytes:
        _WORKSPACE[0] = None
        _WORKSPACE[0] = _drv().mem_alloc(nbytes)
        _WORKSPACE[1] = nbytes
    return _WORKSPACE[0]


_TICKETS: list = [None, 0]  # the "last" split-K's tile counters: [allocation, count]


def tickets(count: int):
    """At least `count` zeroed 32-bit tile counters, grown as needed (a launch leaves
    every counter it used at zero again, so they are zeroed only when allocated)."""
    if _TICKETS[1] < count:
        _TICKETS[0] = None
        _TICKETS[0] = _drv().mem_alloc(count * 4)
        _drv().memset_d32(_TICKETS[0], 0, count)
        _TICKETS[1] = count
    return _TICKETS[0]


class Kernel:
    """One compiled configuration, loaded into the current context, ready to launch.

    A split-K configuration reduced in a pass is two kernels: the GEMM writes one partial
    tile per K slice into a workspace, and <name>_reduce sums the slices into C with alpha
    and beta. One summed by its last block is one kernel with the workspace and a tile
    counter each; one reduced in a cluster is one kernel (the cluster shape is compiled in).
    """

    ARG_FORMAT = "iiifPiPifPi"  # M N K alpha A lda B ldb beta C ldc (+ W [+ tickets])
    REDUCE_FORMAT = "iifPfPi"  # M N alpha W beta C ldc

    def __init__(self, config: KernelConfig, cubin: Path | bytes):
        drv = _drv()
        device()
        self.config = config
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        self.module = drv.module_from_buffer(image)
        self.function = self.module.get_function(config.name)
        smem = config.smem_bytes
        if smem > 48 * 1024:
            self.function.set_attribute(
                drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        self.function.prepare(self.ARG_FORMAT + "P" * (config.has_workspace + config.last))
        self.reduce = None
        if config.reduce_pass:
            self.reduce = self.module.get_function(f"{config.name}_reduce")
            self.reduce.prepare(self.REDUCE_FORMAT)
        self.smem = smem

    @property
    def attributes(self) -> dict:
        """What the driver says of the loaded function (to check against ptxas)."""
        f = self.function
        return dict(registers=f.num_regs, smem_static=f.shared_size_bytes,
                    local_bytes=f.local_size_bytes, max_threads=f.max_threads_per_block)

    def __call__(self, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream=None):
        """Launch on GPU pointers (ints or pycuda allocations); asynchronous."""
        args = [m, n, k, alpha, int(a), lda, int(b), ldb, beta, int(c), ldc]
        if self.config.has_workspace:
            w = int(workspace(self.config.workspace_floats(m, n) * 4))
            args.append(w)
        if self.config.last:
            args.append(int(tickets(self.config.ticket_count(m, n))))
        self.function.prepared_async_call(self.config.grid(m, n), self.config.block(), stream,
                                          *args, shared_size=self.smem)
        if self.reduce is not None:
            self.reduce.prepared_async_call(((m * n + 255) // 256, 1, 1), (256, 1, 1), stream,
                                            m, n, alpha, w, beta, int(c), ldc)


def kernel_class(config):
    """The class the runner loads `config` with: its family's own (FamilySpec.kernel,
    "module:Class", imported here, lazily) or :class:`Kernel`."""
    import importlib

    from codegen.families import family_of

    spec = family_of(config).kernel
    if not spec:
        return Kernel
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def load_kernel(config, cubin: Path | bytes):
    """`config`'s kernel loaded into the current context, ready to call as
    ``kernel(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream=None)``."""
    device()
    return kernel_class(config)(config, cubin)


@functools.cache
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def driver_occupancy(cubin: Path | bytes, name: str, threads: int, smem_dynamic: int) -> int:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor for a kernel in a cubin (the truth the
    model must match), with the dynamic shared-memory opt-in set as the runner sets it."""
    device()
    cu = _libcuda()
    image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
    mod, fn, blocks = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()

    def ok(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)), "cuModuleLoadData")
    try:
        ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
        if smem_dynamic > 48 * 1024:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            ok(cu.cuFuncSetAttribute(fn, 8, smem_dynamic), "cuFuncSetAttribute")
        ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), fn, threads, ctypes.c_size_t(smem_dynamic)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    finally:
        cu.cuModuleUnload(mod)
    return blocks.value
