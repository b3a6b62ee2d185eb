"""One runner per kernel family: the object that launches a compiled kernel, wherever it
runs. The tuner times a candidate through it, the run-time library ships it, and the
export bundle's C++ launchers mirror it (the same grids, arguments and tensor maps).

A runner is made from a config and its cubin (:func:`runner_for`; a family's spec names
its runner class, "module:Class", or none for :class:`Runner`). ``bind(g, m, n, k, lda,
ldb, ldc, batch=1, strides=(0, 0, 0))`` fixes everything of a problem on GPU g but the
pointers, scalars and stream, and returns ``run(a, b, c, alpha, beta, stream, bias=0)``,
which packs the parameters and calls the driver (a few microseconds of host time). The
leading dimensions are those of the operands as stored (a column-major operand's is its
column stride, as the config's layout says); `batch` problems follow each other at
`strides` elements of A, B and C (0: one operand shared by the whole batch); `bias` is
the bias vector's pointer, for a config with a bias. Kernels load once per process
(:class:`driver.KernelImage`) and into each GPU's context on first use there.

Example (on a GPU):
    >>> r = runner_for(config, cubin_bytes)                         # doctest: +SKIP
    >>> run = r.bind(driver.gpu(0), m, n, k, lda, ldb, ldc)        # doctest: +SKIP
    >>> run(a_ptr, b_ptr, c_ptr, 1.0, 0.0, stream)                  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Callable

from codegen.config import DType
from codegen.families import family_of
from codegen.families.wgmma import c_tma_reasons
from tuner.runtime import driver, tma
from tuner.runtime.errors import TmaUnsupported

__all__ = ["Runner", "TmaRunner", "runner_for", "runner_class"]


class Runner:
    """A kernel launched with cuLaunchKernel (the CUDA-core and WMMA families), with its
    split-K reduce kernel where it has one.

    Split-K workspaces and tile tickets come from the per-(device, stream) scratch, so
    two streams never share one; during graph capture a missing one is drawn through
    `allocate_captured` (torch's graph-aware allocator) or refused.
    """

    #: M N K alpha A lda sA B ldb sB beta C ldc sC bias (+ W [+ tickets])
    SIGNATURE = "iiifPiLPiLfPiLP"
    REDUCE_SIGNATURE = "iifPfPiLP"  # M N alpha W beta C ldc sC bias

    def __init__(self, config, cubin: bytes):
        self.config = config
        self.library = driver.load_cubin(cubin, config.name)
        #: every kernel of the cubin waits for the kernel before it (driver.DEPENDENT_MARKER):
        #: each launches with programmatic stream serialization (a cubin of older templates,
        #: without the wait, launches as before)
        self.dependent = driver.DEPENDENT_MARKER in cubin
        self.main = driver.KernelImage(self.library, config.name, config.smem_bytes,
                                       self.dependent)
        self.reduce = (driver.KernelImage(self.library, f"{config.name}_reduce", 0,
                                          self.dependent)
                       if config.reduce_pass else None)
        self.signature = self.SIGNATURE + "P" * (config.has_workspace + config.last)

    def attributes(self, g) -> dict:
        """What the driver says of the main kernel on GPU g (to check against ptxas)."""
        return self.main.attributes(g)

    def max_active_blocks(self, g) -> int:
        """Blocks of the main kernel per SM on GPU g, as the driver computes it."""
        return self.main.max_active_blocks(g, self.config.threads)

    def max_active_clusters(self, g, size: int) -> int:
        """Clusters of `size` blocks of the main kernel that run at once on GPU g (driver)."""
        return self.main.max_active_clusters(g, self.config.threads, size)

    def bind(self, g, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
             allocate_captured=None, batch: int = 1, strides: tuple = (0, 0, 0)) -> Callable:
        """A launcher of this kernel for one problem on GPU g (its context current while
        binding and launching): run(a, b, c, alpha, beta, stream, bias=0) with everything
        but the pointers, scalars and stream fixed now."""
        cfg, main, sig = self.config, self.main, self.signature
        f = main.prepare(g)
        # a stream-K kernel's grid: the GPU's block slots (its SMs x the kernel's blocks an SM)
        slots = g.arch.sm_count * self.max_active_blocks(g) if getattr(cfg, "streamk", 0) else 0
        gx, _, gz = cfg.grid(m, n, slots) if slots else cfg.grid(m, n)
        grid, block = (gx, batch, gz), cfg.block()
        sa, sb, sc = strides
        if not cfg.has_workspace and main.dependent:  # one cuLaunchKernelEx
            def run(a, b, c, alpha, beta, stream, bias=0):
                main.launch(f, grid, block, stream, main.params(sig).pack(
                    m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, bias))
            return run
        if not cfg.has_workspace:  # the hot path of a library call: one driver call, inline
            launch, smem = driver.launch_function(main.name), main.smem

            def run(a, b, c, alpha, beta, stream, bias=0):
                err, = launch(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                              stream, main.params(sig).pack(m, n, k, alpha, a, lda, sa, b, ldb,
                                                            sb, beta, c, ldc, sc, bias), 0)
                if err != 0:
                    main.failed(err)
            return run
        reduce = self.reduce
        fr = reduce.prepare(g) if reduce is not None else None
        scratch = driver.scratch()
        wbytes = (cfg.workspace_floats(m, n, batch, slots) if slots else
                  cfg.workspace_floats(m, n, batch)) * 4
        tickets = cfg.ticket_count(m, n, batch) * 4

        def run(a, b, c, alpha, beta, stream, bias=0):
            w = scratch.get(g, stream, "split-K workspace", wbytes,
                            allocate_captured=allocate_captured)
            args = [m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, bias, w]
            if cfg.last:
                args.append(scratch.get(g, stream, "split-K tickets", tickets, zero=True,
                                        allocate_captured=allocate_captured))
            main.launch(f, grid, block, stream, main.params(sig).pack(*args))
            if fr is not None:
                reduce.launch(fr, ((m * n + 255) // 256, batch, 1), (256, 1, 1), stream,
                              reduce.params(self.REDUCE_SIGNATURE).pack(
                                  m, n, alpha, w, beta, c, ldc, sc, bias))
        return run


class _MapParams:
    """One thread's parameter block of a TMA kernel: the tensor maps (128-byte structs,
    passed by value: their addresses) in front of the scalars."""

    __slots__ = ("blk", "ptrs", "maps", "address", "n_maps", "__weakref__")

    def __init__(self, signature: str, n_maps: int):
        self.blk = driver.ParamBlock(signature)
        self.ptrs = (ctypes.c_void_p * (n_maps + len(signature)))(*([0] * n_maps),
                                                                   *self.blk.ptrs)
        self.address = ctypes.addressof(self.ptrs)
        self.maps, self.n_maps = (), n_maps
        driver.register_block(self)

    def pack(self, maps: tuple, *scalars) -> int:
        for i, tm in enumerate(maps):
            self.ptrs[i] = tm.getPtr()
        self.maps = maps  # alive while this thread's launch reads them
        self.blk.pack(*scalars)
        return self.address


class TmaRunner(Runner):
    """A wgmma + TMA kernel (the wgmma family). A and B go in as TMA tensor maps of the
    operands as stored (config.layout: a column-major A is mapped K x M, a column-major B
    N x K), and with the TMA-store epilogue (config.store) C too, in C's type (config.out;
    SWIZZLE_64B for a 2-byte C); the maps are encoded once per pointer set of a plan and
    kept (a few per plan). The bias pointer (config.bias) follows the scalars. A cluster
    kernel launches with cuLaunchKernelEx and its cluster dimension. A kernel of fp32 data
    with a pre-pass (config.pre_pass: tf32, or pre-split 3xTF32) launches <name>_prep first, into
    a per-stream workspace that its A and B maps describe.

    A strided batch is one launch: each batched operand's map has rank 3 (the batch its
    third dimension, its stride in bytes a multiple of 16), an operand of stride 0 keeps a
    map of rank 2 that every problem reads, and the persistent blocks walk the tiles of all
    the problems (the kernel's `maps3` says which maps have rank 3; C's register epilogue
    steps sC elements a problem). With the pre-pass, each problem's copies are written
    one pre-pass launch after another (once when A and B are both shared).

    Operands TMA cannot describe raise TmaUnsupported before anything is launched (the
    library dispatches such calls elsewhere; the tuner records the candidate REJECTED).
    """

    #: after the tensor maps: M N K alpha beta C ldc bias batch maps3 sC (the first seven as
    #: they were before the epilogue and the batch)
    SIGNATURE = "iiiffPiPiiL"
    SPLIT_SIGNATURE = SIGNATURE + "PiL"  # pre-split 3xTF32: then W ldw sW (its copies)
    SPLIT_K_SIGNATURE = SIGNATURE + "PP"  # split-K: then the workspace and the tile tickets
    PREP_SIGNATURE = "PiPiiiiPPii"  # A lda B ldb M N K At Bt ldw a_blocks
    #: pointer sets whose tensor maps a plan keeps: one per layer's weights of a model whose
    #: layers share a shape, and the copies of B a first use rotates through
    #: (measure.ROTATE_MAX), so neither encodes maps on every call
    MAPS_PER_PLAN = 128

    def __init__(self, config, cubin: bytes):
        super().__init__(config, cubin)
        self.signature = (self.SPLIT_SIGNATURE if config.presplit else
                          self.SPLIT_K_SIGNATURE if config.has_workspace else self.SIGNATURE)
        self.prep = (driver.KernelImage(self.library, f"{config.name}_prep", 0, self.dependent)
                     if config.pre_pass else None)

    def bind(self, g, m: int, n: int, k: int, lda: int, ldb: int, ldc: int,
             allocate_captured=None, batch: int = 1, strides: tuple = (0, 0, 0)) -> Callable:
        cfg, main = self.config, self.main
        sa, sb, sc = (int(s) for s in strides) if batch > 1 else (0, 0, 0)
        why = []
        if batch < 1:
            why.append(f"a batch of {batch}: at least one problem")
        elif batch > 1 and sc <= 0:
            why.append(f"sC={sc}: every problem of the batch needs a C of its own (a "
                       "positive stride)")
        if why:
            raise TmaUnsupported("; ".join(why))
        f = main.prepare(g)
        grid, block = cfg.grid(m, n, g.arch.sm_count, batch), cfg.block()
        boxes, tls, maps = cfg.tma_boxes(), threading.local(), {}
        n_maps = 2 + bool(cfg.store)  # A, B and, with either TMA-store epilogue, C
        c3 = batch > 1 and bool(cfg.store)  # C's map of rank 3

        def c_map(c: int) -> tuple:
            if not cfg.store:
                return ()
            why = c_tma_reasons(ldc, c, n, cfg.out, sc)
            if why:
                raise TmaUnsupported("; ".join(why))
            return (tma.encode(tma.tensor_map_args(cfg.out, c, m, n, ldc, *boxes["C"],
                                                   swizzle=f"{cfg.c_row_bytes}B",
                                                   batch=batch if c3 else 1, batch_stride=sc)),)

        def remember(key, made: tuple) -> tuple:
            """Keep the maps of a pointer set (the oldest of a full cache goes)."""
            if len(maps) >= self.MAPS_PER_PLAN:
                maps.pop(next(iter(maps)), None)
            maps[key] = made
            return made

        if cfg.cluster > 1:
            cluster = tuple(cfg.cluster_dims())

            def launch(stream, address):
                main.launcher(grid, block, cluster).launch(f, stream, address)
        else:
            def launch(stream, address):
                main.launch(f, grid, block, stream, address)

        def packed(mps, alpha, beta, c, bias, maps3, *split) -> int:
            blk = getattr(tls, "blk", None)
            if blk is None:
                blk = tls.blk = _MapParams(self.signature, n_maps)
            return blk.pack(mps, m, n, k, alpha, beta, c, ldc, bias, batch, maps3, sc, *split)

        # C's strides and N, now
        why = c_tma_reasons(ldc, 0, n, cfg.out, sc) if cfg.store else []
        if self.prep is not None:
            if why:
                raise TmaUnsupported("; ".join(why))
            return self._bind_prep(g, m, n, k, lda, ldb, allocate_captured, maps, remember,
                                   c_map, packed, launch, batch, sa, sb, c3)
        why = cfg.direct_tma_reasons(lda, ldb, 0, 0, m, n, k, sa, sb) + why
        if why:
            raise TmaUnsupported("; ".join(why))
        # the maps describe A and B as stored: a column-major A is K x M, a column-major B N x K
        a_dims = (k, m) if cfg.a_col else (m, k)
        b_dims = (n, k) if cfg.b_col else (k, n)
        # a batched operand's map has rank 3; a shared one (stride 0) rank 2
        a_batch, b_batch = (batch if sa else 1), (batch if sb else 1)
        maps3 = (a_batch > 1) | (b_batch > 1) << 1 | c3 << 2

        def make_maps(a: int, b: int, c: int) -> tuple:
            why = cfg.direct_tma_reasons(lda, ldb, a, b, m, n, k, sa, sb)
            if why:
                raise TmaUnsupported("; ".join(why))
            # fp32 data (tf32, 3xTF32) travels as FLOAT32, bit for bit (the kernel rounds it),
            # or as TFLOAT32 with prep=2 or 3 (TMA rounds it)
            return (tma.encode(tma.tensor_map_args(cfg.tma_dtype, a, *a_dims, lda, *boxes["A"],
                                                   batch=a_batch, batch_stride=sa)),
                    tma.encode(tma.tensor_map_args(cfg.tma_dtype, b, *b_dims, ldb, *boxes["B"],
                                                   batch=b_batch, batch_stride=sb)),
                    *c_map(c))

        if cfg.has_workspace:  # split- or stream-K: partial tiles, a counter a tile, per stream
            scratch = driver.scratch()
            wbytes = cfg.workspace_floats(m, n, batch, g.arch.sm_count) * 4
            tbytes = cfg.ticket_count(m, n, batch) * 4

            def run(a, b, c, alpha, beta, stream, bias=0):
                mps = maps.get((a, b)) or remember((a, b), make_maps(a, b, c))
                w = scratch.get(g, stream, "split-K workspace", wbytes,
                                allocate_captured=allocate_captured)
                tickets = scratch.get(g, stream, "split-K tickets", tbytes, zero=True,
                                      allocate_captured=allocate_captured)
                launch(stream, packed(mps, alpha, beta, c, bias, maps3, w, tickets))
            return run

        def run(a, b, c, alpha, beta, stream, bias=0):
            key = (a, b, c) if cfg.store else (a, b)
            mps = maps.get(key) or remember(key, make_maps(a, b, c))
            launch(stream, packed(mps, alpha, beta, c, bias, maps3))
        return run

    def _bind_prep(self, g, m, n, k, lda, ldb, allocate_captured, maps, remember, c_map,
                   packed, launch, batch=1, sa=0, sb=0, c3=False) -> Callable:
        """The pre-pass variant: A and B are read by <name>_prep (any alignment, as the
        layout stores them), which writes At (M x K) and Bt (N x K) into this stream's
        workspace; the maps describe those. Pre-split 3xTF32 (config.presplit) writes four
        copies, At = [Abig; Asmall] (2M x K) and Bt = [Bbig; Bsmall] (2N x K), one map over
        each pair; the GEMM also gets their address, ldw and a problem's stride (its slow
        path for sums that are not finite reads them). A batch gets a set of copies per
        problem (one pre-pass launch each, at the problem's A and B), the maps rank 3 over
        them; one set when what is copied is shared. With prep=2 (and prep=3 on TN) the
        pre-pass copies one operand (config.copies_a, copies_b): the other's map is over the
        caller's matrix as stored, of type TFLOAT32 (TMA rounds it), under TMA's rules."""
        cfg, prep = self.config, self.prep
        fp = prep.prepare(g)
        why = cfg.direct_tma_reasons(lda, ldb, 0, 0, m, n, k, sa, sb)
        if why:
            raise TmaUnsupported("; ".join(why))
        boxes, ldw, rows = cfg.tma_boxes(), cfg.prep_ld(k), cfg.prep_copies
        ca, cb = cfg.copies_a, cfg.copies_b
        # floats of a problem's copies, and Bt's offset in them (bytes)
        per, bt_off = cfg.prep_floats(m, n, k), (rows * m * ldw * 4 if ca else 0)
        copies = batch if (ca and sa) or (cb and sb) else 1
        wbytes = copies * per * 4
        blocks, a_blocks = cfg.prep_grid(m, n, k)
        scratch = driver.scratch()
        # a map of rank 3 over the copies, or (read as stored) over a batched operand
        a_batch = copies if ca else (batch if sa else 1)
        b_batch = copies if cb else (batch if sb else 1)
        maps3 = (a_batch > 1) | (b_batch > 1) << 1 | c3 << 2
        steps = [(i * sa * 4, i * sb * 4, i * per * 4) for i in range(copies)]  # bytes
        purpose = "3xTF32 pre-split" if cfg.presplit else "tf32 pre-pass"
        # the pre-split GEMM's last scalars: the copies, ldw, a problem's stride (0: one set)
        split = (ldw, per if copies > 1 else 0) if cfg.presplit else None

        def make_maps(w: int, a: int, b: int, c: int) -> tuple:
            ma = (tma.tensor_map_args(DType.F32, w, rows * m, k, ldw, *boxes["A"],
                                      batch=copies, batch_stride=per) if ca else
                  tma.tensor_map_args(cfg.tma_dtype, a, *((k, m) if cfg.a_col else (m, k)),
                                      lda, *boxes["A"], batch=a_batch,
                                      batch_stride=sa))  # A as stored (prep 2, 3)
            mb = (tma.tensor_map_args(DType.F32, w + bt_off, rows * n, k, ldw, *boxes["B"],
                                      batch=copies, batch_stride=per) if cb else
                  tma.tensor_map_args(cfg.tma_dtype, b, n, k, ldb, *boxes["B"],
                                      batch=b_batch, batch_stride=sb))  # a column-major B
            return tma.encode(ma), tma.encode(mb), *c_map(c)

        def run(a, b, c, alpha, beta, stream, bias=0):
            w = scratch.get(g, stream, purpose, wbytes,
                            allocate_captured=allocate_captured)
            key = (w, None if ca else a, None if cb else b, c if cfg.store else None)
            mps = maps.get(key) or remember(key, make_maps(w, a, b, c))
            for da, db, dw in steps:
                prep.launch(fp, (blocks, 1, 1), (256, 1, 1), stream,
                            prep.params(self.PREP_SIGNATURE).pack(
                                a + da, lda, b + db, ldb, m, n, k, w + dw, w + dw + bt_off,
                                ldw, a_blocks))
            launch(stream, packed(mps, alpha, beta, c, bias, maps3,
                                  *(() if split is None else (w, *split))))
        return run


def runner_class(config) -> type:
    """The runner class of `config`'s family: the one its spec names ("module:Class"),
    imported on first use, or :class:`Runner`."""
    spec = family_of(config).runner
    if not spec:
        return Runner
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def runner_for(config, cubin: bytes) -> Runner:
    """The runner of a compiled kernel of any family."""
    return runner_class(config)(config, cubin)
