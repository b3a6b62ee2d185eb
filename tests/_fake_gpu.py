"""A fake GPU for the run path's CPU tests: operands known only by their
__cuda_array_interface__, and a driver, cuBLAS and first-use timer that record what they
are asked instead of running it."""

import contextlib

import numpy as np

from codegen.arch import ARCHS
from tuner.runtime import driver, epilogue, measure, operands
from tuner.runtime import cublas as cublas_mod


class Cai:
    """A device matrix known only by its __cuda_array_interface__."""

    def __init__(self, rows, cols, ptr, typestr="<f4", ld=None, stream=None,
                 column_major=False):
        size = np.dtype(typestr).itemsize
        strides = None if ld is None else (ld * size, size)
        if column_major:  # a transposed view: columns ld (default: rows) elements apart
            strides = (size, (ld or rows) * size)
        self.__cuda_array_interface__ = dict(
            shape=(rows, cols), typestr=typestr, data=(ptr, False), version=3, stream=stream,
            strides=strides)


class _NoContext:
    def __init__(self, g):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeGpu:
    """Records every launch and cuBLAS call instead of running it."""

    def __init__(self, monkeypatch):
        self.launches, self.blas, self.capturing, self.measured = [], [], set(), []
        self.blocks_per_sm = 1  # what the driver's occupancy query answers of every kernel
        self.blas_layouts = []  # the layout each cuBLAS call was given
        self.blas_kw = []  # its out type, batch and strides
        self.scratch_problems = []  # the problems first-use measurements made scratch for
        self.scratch_calls = []  # launches and cuBLAS calls made by a measurement
        self.measure_streams = []
        self.measuring = False
        #: kernel name or "cublas" -> the ms a first-use measurement reports (or a function
        #: of the M it measures at)
        self.times = {}
        #: the same, of the GPU's time alone (none given: not measured)
        self.device_times = {}
        g = driver.Gpu(index=0, name="NVIDIA H200", cc=90, arch=ARCHS[90], l2_bytes=60 << 20,
                       total_mem=140 << 30, driver_version=13000, ctx=1)
        world = self

        blocks = {}  # parameter-block address -> block

        class Image:
            def __init__(self, library, name, smem, dependent=False):
                self.name, self.smem, self.dependent, self.blocks = name, smem, dependent, {}

            def prepare(self, g):
                return f"{self.name} on GPU {g.index}"

            def params(self, signature):
                blk = self.blocks.setdefault(signature, driver.ParamBlock(signature))
                blocks[blk.address] = blk
                return blk

            def launch(self, f, grid, block, stream, address):
                cu.cuLaunchKernel(f, *grid, *block, self.smem, stream, address, 0)

            def max_active_blocks(self, g, threads):
                return world.blocks_per_sm

        class Cu:
            def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, address, extra):
                name, on = f.split(" on GPU ")
                assert on == "0" and extra == 0
                blk = blocks[address]
                (world.scratch_calls if world.measuring else world.launches).append(
                    (name, (gx, gy, gz), (bx, by, bz), stream, blk.fmt.unpack_from(blk.buf)))
                return (0,)

            def cuMemAlloc(self, size):
                world.allocs.append(size)
                return 0, 0x7000000 + len(world.allocs) * 0x100000

            def cuMemsetD32Async(self, ptr, value, count, stream):
                world.memsets.append((ptr, value, count, stream))
                return (0,)

        cu = self.cu = Cu()
        self.allocs, self.memsets = [], []

        class Blas:
            version = 130100

            def gemm(self, *args, allocate_captured=None, layout=None, **kw):
                (world.scratch_calls if world.measuring else world.blas).append(args)
                world.blas_layouts.append(layout)
                world.blas_kw.append(kw)

        @contextlib.contextmanager
        def scratch_operands(g, problem):
            world.measured.append(((problem.m, problem.n, problem.k),
                                   (problem.lda, problem.ldb, problem.ldc), problem.offsets))
            world.scratch_problems.append(problem)
            # B's copies as measure.driver_operands lays them out (a pitch of 256 bytes'
            # multiples past its span), from 0x10000000
            span = problem.spans()[1]
            pitch = -(-span // 256) * 256
            bs = tuple(0x10000000 + j * pitch for j in range(measure.b_copies(g, span)))
            yield 0x1000, bs, 0x3000, 0x4000 if problem.variant.bias != "none" else 0

        def time_candidates(g, runners, stream, budget_ms=2.0, rounds=3):
            world.measure_streams.append(stream)
            world.measured[-1] += (sorted(runners),)
            world.measuring = True
            for run in runners.values():  # each runs on the scratch operands
                run(stream)
            world.measuring = False
            m = world.scratch_problems[-1].m
            # as measure.time_candidates: the GPU's time alone of each, its loop's own time
            # where the GPU paced the loop (device_times: where a held loop measured another)
            loop = {name: _at(world.times.get(name, 1.0), m) for name in runners}
            return loop, {name: _at(world.device_times[name], m) if name in world.device_times
                          else t for name, t in loop.items()}

        monkeypatch.setattr(driver, "gpu", lambda i: g)
        monkeypatch.setattr(driver, "current_device", lambda: 0)
        monkeypatch.setattr(driver, "entered", _NoContext)
        monkeypatch.setattr(driver, "is_capturing", lambda s: s in self.capturing)
        monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: what)
        monkeypatch.setattr(driver, "KernelImage", Image)
        monkeypatch.setattr(driver, "api", lambda: cu)
        monkeypatch.setattr(cublas_mod, "device_blas", lambda g: Blas())
        monkeypatch.setattr(cublas_mod, "has_handle", lambda g: True)
        monkeypatch.setattr(cublas_mod, "cublas_version", lambda: 130100)
        monkeypatch.setattr(operands, "_device_of", lambda ptr, name: 0)
        monkeypatch.setattr(measure, "time_candidates", time_candidates)
        monkeypatch.setattr(measure, "driver_operands", scratch_operands)
        epilogue._image.cache_clear()  # loaded through this fake, not an earlier test's


class Dev:
    """A device array of any rank known only by its __cuda_array_interface__ (strides in
    elements; None: packed)."""

    def __init__(self, shape, ptr, typestr="<f4", strides=None):
        size = np.dtype(typestr).itemsize
        self.__cuda_array_interface__ = dict(
            shape=tuple(shape), typestr=typestr, data=(ptr, False), version=3, stream=None,
            strides=None if strides is None else tuple(s * size for s in strides))

    def reshape(self, shape):
        """The same memory with unit dimensions added or dropped (as cupy's view), or None
        for any other reshape (the fake models no copy)."""
        cai = self.__cuda_array_interface__
        old, size = cai["shape"], np.dtype(cai["typestr"]).itemsize
        st = [s // size for s in cai["strides"]] if cai["strides"] else \
            [int(np.prod(old[i + 1:])) for i in range(len(old))]
        kept = [(d, s) for d, s in zip(old, st) if d != 1]
        if [d for d in shape if d != 1] != [d for d, _ in kept]:
            return None
        it = iter(kept)
        strides = [1 if d == 1 else next(it)[1] for d in shape]
        return Dev(shape, cai["data"][0], cai["typestr"], strides)


def _at(t, m: int) -> float:
    return t(m) if callable(t) else t
