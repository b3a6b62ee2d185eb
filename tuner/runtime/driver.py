"""The CUDA driver for the run path, through NVIDIA's cuda-bindings (no pycuda).

- Devices: each GPU's primary context (the one torch, cupy and the runtime API use),
  retained once; its limits read off the device.
- Contexts per call: :func:`entered` makes the operands' device current on the calling
  thread for one launch, and leaves the thread as it found it. Any thread may call.
- Kernels: a cubin is loaded once per process as a context-independent library
  (cuLibraryLoadData); the driver loads it into each context on its first launch there,
  so a kernel works on every GPU of the process.
- Launches: parameters are packed with one ``struct.pack_into`` into a per-thread,
  per-signature block whose pointer array is built once; cuLaunchKernel takes its
  address. The stream is the caller's (an int handle; 0 is the legacy default stream).
- Scratch memory (split-K workspaces, tile tickets, cuBLAS workspaces, staging of host
  arrays) per (device, stream, purpose): work on two streams never shares a buffer.
  Nothing is allocated while a stream is being captured into a CUDA graph: a buffer
  that is missing then is drawn from the caller's framework (torch's allocator is
  graph-aware) or refused with an error, never silently shared.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import struct
import threading
import weakref

from codegen.arch import ARCHS, ArchLimits
from codegen.errors import UsageError
from tuner.runtime.errors import DriverError, NoGPUError

__all__ = ["DriverError", "NoGPUError", "api", "call", "DeviceInfo", "Gpu", "gpu",
           "device_count", "current_device", "entered", "KernelImage", "load_cubin",
           "ParamBlock", "LaunchEx", "DEPENDENT_MARKER", "is_capturing", "recording", "recorder",
           "launch_function", "Scratch", "scratch", "sync", "cluster_slots", "arch_with_clusters",
           "synchronize", "Buffer", "Event", "spin", "L2Flush"]


@functools.cache
def api():
    """cuda.bindings.driver, initialised (NoGPUError without it or without a GPU): for the
    driver's types and enums; calls go through :func:`call`."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise NoGPUError("NVIDIA's cuda-bindings is not installed (on a GPU machine: "
                         f"pip install 'gemm-tune[cuda]'; {e})") from None
    try:
        err, = cu.cuInit(0)
    except Exception as e:  # noqa: BLE001 - cuda-bindings raises when it finds no libcuda
        raise NoGPUError(f"no CUDA driver was found ({e})") from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise NoGPUError(f"no usable CUDA driver or GPU (cuInit: {_name(cu, err)})")
    return cu


def _name(cu, err) -> str:
    e, s = cu.cuGetErrorName(err)
    return s.decode() if e == cu.CUresult.CUDA_SUCCESS and s else str(err)


def _check(result, what: str):
    """(err, *values) from cuda-bindings -> values (one value unwrapped); DriverError."""
    err = result[0]
    if err != 0:
        raise DriverError(f"{what} failed: {_name(api(), err)}")
    return result[1] if len(result) == 2 else result[1:]


def call(name: str, *args):
    """The driver function `name` (e.g. "cuMemAlloc") called with `args`; its values (one
    unwrapped, none: None); DriverError naming the call and the driver's error."""
    err, *values = getattr(api(), name)(*args)  # cuda-bindings returns (err, *values)
    if err != 0:
        raise DriverError(f"{name} failed: {_name(api(), err)}")
    return values[0] if len(values) == 1 else tuple(values) or None


# ---- devices ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the tuner and the dispatch know of a GPU (tuner.gpu.Device is this one)."""

    index: int
    name: str
    cc: int
    arch: ArchLimits  # the table's entry with the device's own figures
    l2_bytes: int
    total_mem: int
    driver_version: int

    @property
    def sm(self) -> str:
        return f"sm_{self.cc}"


@dataclasses.dataclass(frozen=True)
class Gpu(DeviceInfo):
    """One GPU of this process: its primary context and what the dispatch needs of it."""

    ctx: int  # the primary context's handle


_GPUS: dict[int, Gpu] = {}
_GPU_LOCK = threading.Lock()


def gpu(index: int) -> Gpu:
    """The GPU `index` (primary context retained once per process, any thread)."""
    g = _GPUS.get(index)
    if g is None:
        with _GPU_LOCK:
            g = _GPUS.get(index) or _open(index)
            _GPUS[index] = g
    return g


def _open(index: int) -> Gpu:
    cu = api()
    count = device_count()
    if not 0 <= index < count:
        raise NoGPUError(f"GPU {index} does not exist ({count} CUDA device(s) here)")
    dev = _check(cu.cuDeviceGet(index), "cuDeviceGet")
    ctx = _check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    A = cu.CUdevice_attribute

    def get(attr: str) -> int:
        return int(_check(cu.cuDeviceGetAttribute(getattr(A, attr), dev), attr))

    cc = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR") * 10 \
        + get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
    name = _check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
    base = ARCHS.get(cc) or ARCHS[max(ARCHS)]
    sms = get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
    arch = base.replace(
        cc=cc, name=name, sm_count=sms,
        # the table's clusters are its typical part's: another part measures its own
        cluster_slots_table=base.cluster_slots_table if (cc, sms) == (base.cc, base.sm_count)
        else (),
        max_threads_per_sm=get("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR"),
        max_blocks_per_sm=get("CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR"),
        regs_per_sm=get("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR"),
        smem_per_sm=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        smem_per_block_optin=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        clock_mhz=get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE") // 1000 or base.clock_mhz,
    )
    return Gpu(index=index, name=name, cc=cc, arch=arch,
               l2_bytes=get("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
               total_mem=int(_check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
               driver_version=int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion")),
               ctx=int(ctx))


def current_device() -> int:
    """The device of the calling thread's current context; 0 when none is current."""
    cu = api()
    ctx = _check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if not int(ctx):
        return 0
    return int(_check(cu.cuCtxGetDevice(), "cuCtxGetDevice"))


#: a kernel that does nothing, for the driver's occupancy questions (JIT-compiled from PTX
#: for whatever GPU of sm_90 or newer asks)
_PROBE_PTX = (b".version 7.8\n.target sm_90\n.address_size 64\n"
              b".visible .entry gemm_tune_probe() { ret; }\n\0")
MAX_CLUSTER = 16  # the largest (non-portable) cluster size any GPU allows so far


@functools.cache
def _probe_kernel():
    lib = _check(api().cuLibraryLoadData(_PROBE_PTX, None, None, 0, None, None, 0),
                 "cuLibraryLoadData(probe)")
    return _check(api().cuLibraryGetKernel(lib, b"gemm_tune_probe"), "cuLibraryGetKernel")


@functools.cache
def cluster_slots(index: int, blocks_per_sm: int = 1) -> tuple[int, ...]:
    """How many clusters of 1, 2, ... blocks GPU `index` runs at once with `blocks_per_sm`
    blocks to an SM (cuOccupancyMaxActiveClusters of a kernel whose dynamic shared memory
    allows no more), up to the largest size the GPU takes; () before sm_90. A cluster's
    blocks share one GPC, so a GPC of SMs not divisible by the size leaves some idle:
    what the model's waves of cluster kernels need (ArchLimits.cluster_slots)."""
    g = gpu(index)
    if g.cc < 90:
        return ()
    cu = api()
    with entered(g):
        f = _check(cu.cuKernelGetFunction(_probe_kernel()), "cuKernelGetFunction(probe)")
        a = g.arch
        smem = (a.smem_per_sm // max(blocks_per_sm, 1) - a.smem_reserved_per_block) // 128 * 128
        smem = min(smem, a.smem_per_block_optin)
        F = cu.CUfunction_attribute
        call("cuFuncSetAttribute", f, F.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        call("cuFuncSetAttribute", f, F.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        out = []
        for size in range(1, MAX_CLUSTER + 1):
            n = _max_clusters(f, a.sm_count, 32, smem, (size, 1, 1))
            if n < 1:  # past the largest cluster the GPU takes
                break
            out.append(n)
    return tuple(out)


def _max_clusters(f, sms: int, threads: int, smem: int, dims: tuple[int, int, int],
                  compiled: bool = False) -> int:
    """cuOccupancyMaxActiveClusters of CUfunction `f` in clusters of `dims` blocks (`compiled`:
    the kernel's own __cluster_dims__, which the launch must not restate); 0 where the
    driver refuses them."""
    cu = api()
    lc = cu.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = dims[0] * sms, dims[1], dims[2]
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = threads, 1, 1
    lc.sharedMemBytes = smem
    attrs = []
    if not compiled:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = dims
        attrs.append(attr)
    lc.attrs, lc.numAttrs = attrs, len(attrs)
    err, n = cu.cuOccupancyMaxActiveClusters(f, lc)
    return int(n) if err == 0 else 0


#: blocks an SM up to which the tuner measures the clusters that fit (past it the model
#: takes a lower bound: ArchLimits.cluster_slots)
CLUSTER_ROWS = 8


def arch_with_clusters(g: "Gpu") -> ArchLimits:
    """g's limits with the clusters it runs at once measured (the model's waves)."""
    rows = tuple(cluster_slots(g.index, r) for r in range(1, CLUSTER_ROWS + 1))
    return g.arch.replace(cluster_slots_table=rows if rows[0] else ())


class entered:
    """``with entered(g):`` makes GPU g's primary context current on this thread for the
    block. A thread with no current context keeps g's afterwards (as the runtime API would
    have made it); one with another context current gets it back."""

    __slots__ = ("ctx", "pushed")

    def __init__(self, g: Gpu):
        self.ctx = g.ctx
        self.pushed = False

    def __enter__(self):
        cu = api()
        err, cur = cu.cuCtxGetCurrent()
        cur = int(cur)
        if cur != self.ctx:
            if cur:
                _check(cu.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
                self.pushed = True
            else:
                _check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        return self

    def __exit__(self, *exc):
        if self.pushed:
            _check(api().cuCtxPopCurrent(), "cuCtxPopCurrent")
        return False


def is_capturing(stream: int) -> bool:
    """Is `stream` being captured into a CUDA graph (where nothing may allocate, synchronise
    or time)? The legacy default stream also reports an illegal state while another stream
    captures in global mode: counted as capturing."""
    cu = api()
    err, status = cu.cuStreamIsCapturing(stream)
    if err == cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return True
    _check((err, status), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def sync(stream: int) -> None:
    _check(api().cuStreamSynchronize(stream), "cuStreamSynchronize")


def synchronize() -> None:
    """Wait for all work of the current context (a fault surfaces here as DriverError)."""
    call("cuCtxSynchronize")


def device_count() -> int:
    return int(call("cuDeviceGetCount"))


# ---- kernels --------------------------------------------------------------------------
_PARAM_SLOT = {"i": "i4x", "f": "f4x", "P": "Q", "L": "q"}  # each in an 8-byte slot


class ParamBlock:
    """Launch parameters of one signature ("iiifPiLPiLfPiLP": int, float, pointer, L: long
    long), packed into one buffer whose pointer array is built once; :meth:`pack` fills it
    in one call."""

    __slots__ = ("signature", "fmt", "buf", "ptrs", "address", "__weakref__")

    def __init__(self, signature: str):
        self.signature = signature
        self.fmt = struct.Struct("<" + "".join(_PARAM_SLOT[c] for c in signature))
        self.buf = ctypes.create_string_buffer(8 * len(signature))
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * len(signature))(*(base + 8 * i
                                                         for i in range(len(signature))))
        self.address = ctypes.addressof(self.ptrs)
        register_block(self)

    def pack(self, *values) -> int:
        self.fmt.pack_into(self.buf, 0, *values)
        return self.address


#: the parameter blocks alive, by the address a launch is given (what a recording reads)
_BLOCKS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register_block(blk) -> None:
    """Make a parameter block (ParamBlock, or one with tensor maps in front: `n_maps`, its
    ParamBlock `blk`) readable by a recording of a launch given its `address`."""
    _BLOCKS[blk.address] = blk


# ---- recording launches (tuner.runtime.fast replays them from C++) ----------------------
@dataclasses.dataclass
class RecordedLaunch:
    """One launch as a runner made it: its parameter block's bytes (8-byte slots, after
    `maps`: the tensor maps' cuTensorMapEncodeTiled arguments, tma.tensor_map_args')."""

    function: int
    name: str
    grid: tuple
    block: tuple
    cluster: tuple
    smem: int
    signature: str
    params: bytes
    maps: list
    dependent: bool = False  # launched with programmatic stream serialization


class Recording:
    """The launches and tensor maps of the runs made on this thread inside
    :func:`recording`: recorded, not made."""

    def __init__(self):
        self.launches: list[RecordedLaunch] = []
        self._maps: dict[int, dict] = {}  # a stand-in map's address -> its arguments

    def tensor_map(self, args: dict) -> "_RecordedMap":
        m = _RecordedMap(args)
        self._maps[m.getPtr()] = args
        return m

    def launch(self, f, name: str, grid, block, smem: int, params_address: int,
               cluster=(1, 1, 1), dependent: bool = False) -> None:
        blk = _BLOCKS.get(int(params_address))
        if blk is None:
            raise DriverError(f"recording {name}: a launch of parameters not packed by a "
                              "ParamBlock")
        maps = [self._maps[int(blk.ptrs[i])] for i in range(getattr(blk, "n_maps", 0))]
        inner = getattr(blk, "blk", blk)
        self.launches.append(RecordedLaunch(int(f), name, tuple(grid), tuple(block),
                                            tuple(cluster), int(smem), inner.signature,
                                            bytes(inner.buf), maps, bool(dependent)))

    def cu_launch_kernel(self, name: str):
        """A stand-in for cuLaunchKernel (a runner's inlined launch of kernel `name`)."""
        def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            self.launch(f, name, (gx, gy, gz), (bx, by, bz), smem, params)
            return (0,)
        return launch


class _RecordedMap:
    """A tensor map under recording: its arguments, and a distinct stand-in address."""

    __slots__ = ("args",)

    def __init__(self, args: dict):
        self.args = args

    def getPtr(self) -> int:  # noqa: N802 - CUtensorMap's method
        return id(self)


_RECORDING = threading.local()


@contextlib.contextmanager
def recording():
    """Within the block, on this thread, launches (cuLaunchKernel, KernelImage.launch,
    LaunchEx.launch) and tensor maps (tma.encode) of runners bound inside it are
    recorded instead of made: the Recording's launches."""
    rec = Recording()
    before, _RECORDING.rec = getattr(_RECORDING, "rec", None), rec
    try:
        yield rec
    finally:
        _RECORDING.rec = before


def recorder() -> Recording | None:
    """This thread's Recording, inside :func:`recording`; else None."""
    return getattr(_RECORDING, "rec", None)


def launch_function(name: str):
    """cuLaunchKernel, or the recording's stand-in when bound inside :func:`recording` (for
    kernel `name`)."""
    rec = recorder()
    return api().cuLaunchKernel if rec is None else rec.cu_launch_kernel(name)


#: the symbol a cubin of gemm-tune's templates holds when every kernel in it waits for the
#: kernel before it (griddepcontrol.wait) before touching global memory (macros.cu.j2,
#: dependent_launch_helpers): such a kernel launches with programmatic stream serialization
DEPENDENT_MARKER = b"gemm_tune_waits_for_prior_grids"


def load_cubin(cubin: bytes, what: str):
    """A cubin loaded once per process as a context-independent library (cuLibrary)."""
    return _check(api().cuLibraryLoadData(cubin, None, None, 0, None, None, 0),
                  f"cuLibraryLoadData({what})")


class KernelImage:
    """One kernel of a loaded cubin, launchable on any GPU and stream from any thread. It is
    context-independent (a CUkernel); each GPU's own CUfunction, got once with that GPU's
    context current, is what launches (cheaper than resolving the CUkernel every time).
    `dependent`: the kernel waits for the one before it in its stream before it touches
    memory (its cubin holds DEPENDENT_MARKER), so it launches with programmatic stream
    serialization: its launch overlaps the end of the kernel before."""

    def __init__(self, library, name: str, smem: int, dependent: bool = False):
        self.name, self.smem, self.dependent = name, smem, dependent
        self.kernel = _check(api().cuLibraryGetKernel(library, name.encode()),
                             f"cuLibraryGetKernel({name})")
        self.functions: dict[int, object] = {}  # GPU index -> CUfunction in its context
        self._lock = threading.Lock()
        self._tls = threading.local()

    def prepare(self, g: Gpu):
        """Once per GPU, with g's context current: load the kernel into the context now
        (not lazily at a first launch, which may be inside a graph capture), allow the
        dynamic shared memory it launches with, and return g's CUfunction."""
        f = self.functions.get(g.index)
        if f is not None:
            return f
        with self._lock:
            cu = api()
            f = _check(cu.cuKernelGetFunction(self.kernel), f"cuKernelGetFunction({self.name})")
            if self.smem > 48 * 1024:
                _check(cu.cuFuncSetAttribute(
                    f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.smem), f"cuFuncSetAttribute({self.name})")
            self.functions[g.index] = f
        return f

    def params(self, signature: str) -> ParamBlock:
        """This thread's parameter block for `signature`."""
        blk = getattr(self._tls, signature, None)
        if blk is None:
            blk = ParamBlock(signature)
            setattr(self._tls, signature, blk)
        return blk

    def launch(self, f, grid, block, stream: int, params_address: int) -> None:
        """Launch g's CUfunction `f` (from :meth:`prepare`)."""
        if self.dependent:
            return self.launcher(grid, block).launch(f, stream, params_address)
        rec = recorder()
        if rec is not None:
            return rec.launch(f, self.name, grid, block, self.smem, params_address)
        err, = api().cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                    block[2], self.smem, stream, params_address, 0)
        if err != 0:
            self.failed(err)

    def launcher(self, grid, block, cluster=(1, 1, 1)) -> "LaunchEx":
        """This thread's LaunchEx of this kernel at (grid, block, cluster), made once."""
        made = getattr(self._tls, "launchers", None)
        if made is None:
            made = self._tls.launchers = {}
        key = (grid, block, cluster)  # (tuples)
        lc = made.get(key)
        if lc is None:
            lc = made[key] = LaunchEx(self, grid, block, cluster)
        return lc

    def failed(self, err):
        raise DriverError(f"cuLaunchKernel({self.name}) failed: {_name(api(), err)}")

    def max_active_blocks(self, g: Gpu, threads: int) -> int:
        """cuOccupancyMaxActiveBlocksPerMultiprocessor on GPU g, with the dynamic shared
        memory this kernel launches with (the truth the occupancy model must match)."""
        return int(call("cuOccupancyMaxActiveBlocksPerMultiprocessor", self.prepare(g),
                        threads, self.smem))

    def max_active_clusters(self, g: Gpu, threads: int, size: int) -> int:
        """cuOccupancyMaxActiveClusters on GPU g in clusters of `size` blocks along x, or of
        the kernel's own __cluster_dims__ where it has them, with its dynamic shared memory."""
        f = self.prepare(g)
        F = api().CUfunction_attribute
        dims = tuple(call("cuFuncGetAttribute",
                          getattr(F, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{d}"), f)
                     for d in ("WIDTH", "HEIGHT", "DEPTH"))
        compiled = any(dims)
        return _max_clusters(f, g.arch.sm_count, threads, self.smem,
                             tuple(max(d, 1) for d in dims) if compiled else (size, 1, 1),
                             compiled)

    def attributes(self, g: Gpu) -> dict:
        """What the driver says of the kernel on GPU g (to check against ptxas)."""
        cu = api()
        dev = _check(cu.cuDeviceGet(g.index), "cuDeviceGet")
        F = cu.CUfunction_attribute

        def get(attr):
            return int(_check(cu.cuKernelGetAttribute(getattr(F, attr), self.kernel, dev), attr))

        return dict(registers=get("CU_FUNC_ATTRIBUTE_NUM_REGS"),
                    smem_static=get("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
                    local_bytes=get("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                    max_threads=get("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"))


# ---- scratch memory ---------------------------------------------------------------------
class Scratch:
    """Device buffers per (device, stream, purpose), grown by doubling and never freed while
    the process runs (a CUDA graph may have recorded an old one). Allocated outside graph
    capture with cuMemAlloc; during capture through `allocate_captured` (torch's
    graph-aware allocator for torch callers) or refused."""

    def __init__(self):
        self._bufs: dict[tuple, tuple[int, int]] = {}  # key -> (pointer, bytes)
        self._keep: list = []  # every allocation, alive until exit
        self._lock = threading.Lock()

    def get(self, g: Gpu, stream: int, purpose: str, nbytes: int, zero: bool = False,
            allocate_captured=None) -> int:
        key = (g.index, stream, purpose)
        have = self._bufs.get(key)
        if have is not None and have[1] >= nbytes:
            return have[0]
        with self._lock:
            have = self._bufs.get(key)
            if have is not None and have[1] >= nbytes:
                return have[0]
            size = max(nbytes, 2 * have[1] if have else 0, 256)
            if is_capturing(stream):
                if allocate_captured is None:
                    raise UsageError(
                        f"a CUDA graph is being captured and this call needs {nbytes} bytes "
                        f"of {purpose} on a stream that has none yet: make the same call once "
                        "before capturing")
                ptr, owner = allocate_captured(size)
                self._keep.append(owner)
            else:
                cu = api()
                ptr = int(_check(cu.cuMemAlloc(size), f"cuMemAlloc({size}) for {purpose}"))
                self._keep.append(_Allocation(g, ptr))
            if zero:
                _check(api().cuMemsetD32Async(ptr, 0, size // 4, stream), "cuMemsetD32Async")
            self._bufs[key] = (ptr, size)
            return ptr


class _Allocation:
    """A cuMemAlloc'd pointer freed when the process lets go of it."""

    __slots__ = ("gpu", "ptr")

    def __init__(self, g: Gpu, ptr: int):
        self.gpu, self.ptr = g, ptr

    def __del__(self):
        try:
            with entered(self.gpu):
                api().cuMemFree(self.ptr)
        except Exception:  # noqa: BLE001 - at exit the context may be gone
            pass


@functools.cache
def scratch() -> Scratch:
    return Scratch()


class LaunchEx:
    """The cuLaunchKernelEx configuration of a kernel run in thread-block clusters (a
    cluster dimension) or launched with programmatic stream serialization (a dependent
    image), built once per (thread, plan); :meth:`launch` only sets the stream and
    launches."""

    __slots__ = ("config", "image", "dims")

    def __init__(self, image: KernelImage, grid, block, cluster=(1, 1, 1)):
        cu = api()
        lc = cu.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = grid
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = block
        lc.sharedMemBytes = image.smem
        attrs = []
        if tuple(cluster) != (1, 1, 1):
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
            attrs.append(attr)
        if image.dependent:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        lc.attrs = attrs
        lc.numAttrs = len(attrs)
        self.config, self.image, self.dims = lc, image, (tuple(grid), tuple(block),
                                                         tuple(cluster))

    def launch(self, f, stream: int, params_address: int) -> None:
        rec = recorder()
        if rec is not None:
            grid, block, cluster = self.dims
            return rec.launch(f, self.image.name, grid, block, self.image.smem, params_address,
                              cluster, self.image.dependent)
        cu = api()
        self.config.hStream = cu.CUstream(stream)
        err, = cu.cuLaunchKernelEx(self.config, f, params_address, 0)
        if err != 0:
            self.image.failed(err)


# ---- plain memory and events (the tuner's problems, first-use measurement) -----------
class Buffer:
    """`nbytes` of device memory on the current context, freed with the object."""

    __slots__ = ("ptr", "nbytes", "__weakref__")

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(call("cuMemAlloc", max(self.nbytes, 1)))

    def __int__(self) -> int:
        return self.ptr

    def upload(self, host, stream: int | None = None) -> "Buffer":
        """Copy a contiguous numpy array in (synchronously unless `stream` is given)."""
        if stream is None:
            call("cuMemcpyHtoD", self.ptr, host.ctypes.data, host.nbytes)
        else:
            call("cuMemcpyHtoDAsync", self.ptr, host.ctypes.data, host.nbytes, stream)
        return self

    def download(self, host):
        """Copy into a contiguous numpy array (synchronously); returns it."""
        call("cuMemcpyDtoH", host.ctypes.data, self.ptr, host.nbytes)
        return host

    def fill32(self, value: int, words: int | None = None, stream: int | None = None) -> None:
        """Set `words` (default: all) 32-bit words to `value` (NaN bits, say)."""
        words = self.nbytes // 4 if words is None else words
        if stream is None:
            call("cuMemsetD32", self.ptr, value, words)
        else:
            call("cuMemsetD32Async", self.ptr, value, words, stream)

    @classmethod
    def of(cls, host) -> "Buffer":
        """A buffer holding a copy of the numpy array `host`."""
        import numpy as np

        host = np.ascontiguousarray(host)
        return cls(host.nbytes).upload(host)

    def __del__(self):
        try:
            api().cuMemFree(self.ptr)
        except Exception:  # noqa: BLE001 - at exit the context may be gone
            pass


class Event:
    """A CUDA event with timing."""

    __slots__ = ("handle",)

    def __init__(self):
        self.handle = call("cuEventCreate", 0)

    def record(self, stream: int = 0) -> "Event":
        call("cuEventRecord", self.handle, stream)
        return self

    def synchronize(self) -> None:
        call("cuEventSynchronize", self.handle)

    def since(self, start: "Event") -> float:
        """Milliseconds from `start` to this event (both recorded and this one done)."""
        return float(call("cuEventElapsedTime", start.handle, self.handle))

    def __del__(self):
        try:
            api().cuEventDestroy(self.handle)
        except Exception:  # noqa: BLE001 - at exit the context may be gone
            pass


#: one thread reading the global timer until `ns` nanoseconds have passed (PTX: the driver
#: compiles it for the GPU at hand, no nvcc needed)
_SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry gemm_tune_spin(.param .u64 ns)
{
    .reg .u64 %t0, %t1, %n;
    .reg .pred %p;
    ld.param.u64 %n, [ns];
    mov.u64 %t0, %globaltimer;
SPIN:
    mov.u64 %t1, %globaltimer;
    sub.u64 %t1, %t1, %t0;
    setp.lt.u64 %p, %t1, %n;
    @%p bra SPIN;
    ret;
}
\0"""


@functools.cache
def _spin_image() -> KernelImage:
    return KernelImage(load_cubin(_SPIN_PTX, "gemm-tune's spin kernel"), "gemm_tune_spin", 0)


def spin(g: Gpu, stream: int, ns: int) -> None:
    """Keep `stream` busy on GPU g for `ns` nanoseconds (one thread of one block spinning on
    the global timer): work queued behind it meanwhile then runs back to back, as it would
    behind a host that runs ahead. Bounded: a synchronising call made meanwhile waits `ns`
    at most."""
    img = _spin_image()
    img.launch(img.prepare(g), (1, 1, 1), (1, 1, 1), stream, img.params("L").pack(int(ns)))


#: every thread of a grid-stride loop loading 16-byte words of a buffer through the L2
#: (ld.global.cg), four loads in flight at a time, and XOR-ing them; the XOR is stored
#: only if it equals a constant, so no load is dropped and nothing else is written (the
#: L2's lines are left clean)
_L2_READ_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry gemm_tune_l2_read(.param .u64 buf, .param .u64 words, .param .u64 sink)
{
    .reg .u64 %base, %n, %i, %step, %step16, %p, %t64;
    .reg .b32 %x, %a<4>, %b<4>, %c<4>, %d<4>, %tx, %nt, %ct, %nc;
    .reg .pred %q;
    ld.param.u64 %base, [buf];
    cvta.to.global.u64 %base, %base;
    ld.param.u64 %n, [words];
    mov.u32 %tx, %tid.x;
    mov.u32 %nt, %ntid.x;
    mov.u32 %ct, %ctaid.x;
    mov.u32 %nc, %nctaid.x;
    mul.wide.u32 %i, %ct, %nt;
    cvt.u64.u32 %t64, %tx;
    add.u64 %i, %i, %t64;
    mul.wide.u32 %step, %nc, %nt;
    shl.b64 %step16, %step, 4;
    mov.b32 %x, 0;
FOUR:
    mad.lo.u64 %t64, %step, 3, %i;
    setp.ge.u64 %q, %t64, %n;
    @%q bra ONE;
    shl.b64 %p, %i, 4;
    add.u64 %p, %base, %p;
    ld.global.cg.v4.u32 {%a0, %a1, %a2, %a3}, [%p];
    add.u64 %p, %p, %step16;
    ld.global.cg.v4.u32 {%b0, %b1, %b2, %b3}, [%p];
    add.u64 %p, %p, %step16;
    ld.global.cg.v4.u32 {%c0, %c1, %c2, %c3}, [%p];
    add.u64 %p, %p, %step16;
    ld.global.cg.v4.u32 {%d0, %d1, %d2, %d3}, [%p];
    xor.b32 %a0, %a0, %b0;
    xor.b32 %a1, %a1, %b1;
    xor.b32 %a2, %a2, %b2;
    xor.b32 %a3, %a3, %b3;
    xor.b32 %c0, %c0, %d0;
    xor.b32 %c1, %c1, %d1;
    xor.b32 %c2, %c2, %d2;
    xor.b32 %c3, %c3, %d3;
    xor.b32 %a0, %a0, %c0;
    xor.b32 %a1, %a1, %c1;
    xor.b32 %a2, %a2, %c2;
    xor.b32 %a3, %a3, %c3;
    xor.b32 %a0, %a0, %a1;
    xor.b32 %a2, %a2, %a3;
    xor.b32 %x, %x, %a0;
    xor.b32 %x, %x, %a2;
    add.u64 %i, %t64, %step;
    bra FOUR;
ONE:
    setp.ge.u64 %q, %i, %n;
    @%q bra DONE;
    shl.b64 %p, %i, 4;
    add.u64 %p, %base, %p;
    ld.global.cg.v4.u32 {%a0, %a1, %a2, %a3}, [%p];
    xor.b32 %a0, %a0, %a1;
    xor.b32 %a2, %a2, %a3;
    xor.b32 %x, %x, %a0;
    xor.b32 %x, %x, %a2;
    add.u64 %i, %i, %step;
    bra ONE;
DONE:
    setp.ne.u32 %q, %x, 0x9E3779B9;
    @%q bra END;
    ld.param.u64 %p, [sink];
    cvta.to.global.u64 %p, %p;
    st.global.u32 [%p], %x;
END:
    ret;
}
\0"""


@functools.cache
def _l2_read_image() -> KernelImage:
    return KernelImage(load_cubin(_L2_READ_PTX, "gemm-tune's L2 read"), "gemm_tune_l2_read", 0)


class L2Flush:
    """A buffer of twice GPU g's L2, read through the L2 by a kernel on each call: what the
    L2 held before is evicted and its lines are left clean. Writing the buffer (a memset:
    the tuner's flush until 2026-12-04) left them dirty instead, and the next call's own
    reads then wrote them back to DRAM beside its reads: cuBLAS at 16x14336x4096 bf16 took
    1.24x, at 64x4096x14336 1.20x, at 128x4096x4096 1.21x its time with the weights rotated
    beyond the L2 (as a model reads them), against 1.04x, 1.00x and 1.05x after this read
    (bench/flush_effect.py; 4096^3 1.02x after either). PTX, compiled by the driver: the
    tuner and a program's first use flush alike, with no nvcc. `nbytes`: another size (a
    read of a buffer that fits in the L2, say)."""

    def __init__(self, g: Gpu, nbytes: int | None = None):
        self.buf = Buffer(max(2 * g.l2_bytes, 1 << 20) if nbytes is None else nbytes)
        self.buf.fill32(0)  # (what it holds does not matter; that it is defined does)
        self._sink = Buffer(4)
        img = _l2_read_image()
        self._image, self._f = img, img.prepare(g)
        self._block = ParamBlock("PLP")  # (packed once: every launch reads it)
        self._params = self._block.pack(self.buf.ptr, self.buf.nbytes // 16, self._sink.ptr)
        self._grid = (8 * g.arch.sm_count, 1, 1)

    def __call__(self, stream: int = 0) -> None:
        self._image.launch(self._f, self._grid, (256, 1, 1), stream, self._params)
