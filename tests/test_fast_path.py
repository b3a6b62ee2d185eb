"""CPU: how the C++ call path learns a plan (tuner.runtime.fast): launches recorded from a
runner's own packing (driver.recording) and translated into the slots fast.cpp patches per
call, the tensor maps' arguments, stand-ins that would be replayed wrongly refused, and the
switch. The replay itself runs on the GPU (tests/test_gpu_fast_path.py)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from codegen.config import DType
from tuner.runtime import driver, fast, tma
from tuner.runtime.runners import Runner, TmaRunner, _MapParams

S = fast.SENTINELS


def _recorded(signature: str, values, maps=(), name="k"):
    with driver.recording() as rec:
        if maps:
            blk = _MapParams(signature, len(maps))
            address = blk.pack(tuple(tma.encode(m) for m in maps), *values)
        else:
            blk = driver.ParamBlock(signature)
            address = blk.pack(*values)
        launch = driver.launch_function(name)
        assert launch(0xF00, 3, 2, 1, 256, 1, 1, 4096, 7, address, 0) == (0,)
    (rec_launch,) = rec.launches
    return rec_launch


def test_a_plain_launch_becomes_patches_of_its_pointer_and_scalar_slots():
    values = (520, 392, 264, fast.ALPHA_STANDIN, S[fast.A], 264, 0, S[fast.B] + 64, 392, 0,
              fast.BETA_STANDIN, S[fast.C], 392, 0, S[fast.BIAS])
    rec = _recorded(Runner.SIGNATURE, values, name="gemm_x")
    assert (rec.function, rec.name, rec.grid, rec.block, rec.cluster, rec.smem) == \
        (0xF00, "gemm_x", (3, 2, 1), (256, 1, 1), (1, 1, 1), 4096)
    f, name, grid, block, cluster, smem, params, patches, maps, dependent = fast.translate(rec)
    assert dependent is False  # a cuLaunchKernel launch (a kernel without the wait)
    # slots (8 bytes each): m n k alpha A lda sA B ldb sB beta C ldc sC bias
    assert patches == [(24, fast.ALPHA, 0), (32, fast.A, 0), (56, fast.B, 64),
                       (80, fast.BETA, 0), (88, fast.C, 0), (112, fast.BIAS, 0)]
    assert maps == [] and len(params) == 8 * len(Runner.SIGNATURE)
    assert int.from_bytes(params[0:4], "little") == 520  # the fixed slots as packed
    assert int.from_bytes(params[40:44], "little") == 264


def test_tensor_maps_keep_their_arguments_and_their_operand():
    a_map = tma.tensor_map_args(DType.F16, S[fast.A] + 128, 520, 264, 264, 128, 64)
    w_map = tma.tensor_map_args(DType.F32, 0x7000_0000, 392, 264, 272, 256, 32)
    values = (520, 392, 264, fast.ALPHA_STANDIN, fast.BETA_STANDIN, S[fast.C], 392, 0, 1, 0, 0)
    rec = _recorded(TmaRunner.SIGNATURE, values, maps=(a_map, w_map))
    *_, params, patches, maps, _ = fast.translate(rec)
    assert patches == [(24, fast.ALPHA, 0), (32, fast.BETA, 0), (40, fast.C, 0)]
    from cuda.bindings import driver as cu

    (src, add, dt, rank, dims, strides, box, estr, il, sw, l2, oob), w = maps
    assert (src, add, rank, dims, strides, box, estr) == \
        (fast.A, 128, 2, [264, 520], [528], [64, 128], [1, 1])
    assert dt == int(cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16)
    assert sw == int(cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B)
    assert w[:2] == (fast.FIXED, 0x7000_0000)  # a workspace: its own address, fixed


def test_a_stand_in_that_is_not_a_whole_slot_is_refused():
    """alpha's bits in a pointer slot: C++ would patch nothing there, so the plan is kept
    off the C++ path rather than replayed with the stand-in."""
    bits = int.from_bytes(struct.pack("<f", fast.ALPHA_STANDIN), "little")
    values = (1, 1, 1, 1.0, S[fast.A], 1, 0, S[fast.B], 1, 0, 0.0, S[fast.C], 1, 0, bits)
    with pytest.raises(ValueError, match="parameter 14"):
        fast.translate(_recorded(Runner.SIGNATURE, values))


def test_recording_is_this_threads_alone():
    seen = []
    with driver.recording() as rec:
        t = threading.Thread(target=lambda: seen.append(driver.recorder()))
        t.start()
        t.join()
        assert driver.recorder() is rec
    assert seen == [None] and driver.recorder() is None


def test_the_switch_and_the_status(monkeypatch):
    monkeypatch.setenv("GEMM_TUNE_FAST", "0")
    monkeypatch.setitem(fast._STATE, "thread", None)
    fast.start()
    assert fast._STATE["thread"] is None and fast.status() == "off (GEMM_TUNE_FAST=0)"
    monkeypatch.setenv("GEMM_TUNE_FAST", "1")
    monkeypatch.setitem(fast._STATE, "error", "ninja is required")
    assert fast.status() == "off: it could not be built (ninja is required)"


_HOLDER = """
import sys, time
from pathlib import Path
from tuner.runtime import fast
where = Path(sys.argv[1])
with fast.builder_lock(where):
    (where / "lock").touch()  # what torch's FileBaton makes while it builds
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_builder_killed_mid_build_does_not_stop_the_next(tmp_path):
    """A process that dies while it builds the extension (killed, or a short program whose
    daemon build thread dies with it) leaves torch's lock file, on which torch's own
    cpp_extension.load would wait for ever: the next builder waits only while the first
    lives, then removes the stale lock and builds."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        assert holder.stdout.readline().strip() == "held"
        entered = threading.Event()

        def build():
            with fast.builder_lock(tmp_path):
                entered.set()
                assert not (tmp_path / "lock").exists()

        t = threading.Thread(target=build)
        t.start()
        time.sleep(0.5)
        assert not entered.is_set() and (tmp_path / "lock").exists()  # the builder lives
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        t.join(10)
        assert entered.is_set() and not (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait()


class _Table:
    """A stand-in for fast.cpp's Table: records what lib.gemm asks it, serves `answer`."""

    def __init__(self, answer):
        self.asked, self.answer, self.cleared = [], answer, 0

    def call(self, *args):
        self.asked.append(args)
        return self.answer

    def clear(self):
        self.cleared += 1


def test_lib_gemm_asks_the_cpp_path_only_for_calls_it_may_serve(tmp_path):
    """What lib.gemm hands the C++ table: the operands, alpha, beta and the context word
    (measuring, the activation); a call with a stream, an out_dtype, measure= or a TF32
    flag, or an activation the library does not know, never reaches it."""
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "lib")
    served = object()
    lib.fast = _Table(served)
    a, b, c, bias = object(), object(), object(), object()
    assert lib.gemm(a, b, c, alpha=0.5, beta=0.25, bias=bias) is served
    assert lib.gemm(a, b, activation="silu") is served
    assert lib.fast.asked == [(a, b, c, bias, 0.5, 0.25, fast.context(lib.measure)),
                              (a, b, None, None, 1.0, 0.0, fast.context(lib.measure, "silu"))]
    assert fast.context(True, "silu") == 1 | 4 << 2 and fast.context(False, None, True) == 2
    lib.fast = _Table(None)  # a key it has not seen: the Python path, which checks the call
    for kw in (dict(stream=0), dict(out_dtype="float32"), dict(measure=False),
               dict(allow_tf32=True), dict(allow_3xtf32=True), dict(activation="tanh"),
               dict(activation=["gelu"])):
        with pytest.raises(Exception) as e:
            lib.gemm(a, b, **kw)
        assert type(e.value).__name__ in ("LibraryError", "NoGPUError"), (kw, e.value)
    assert lib.fast.asked == []


def test_clearing_the_plans_clears_the_cpp_table(tmp_path):
    """A recording, and anyone else, makes plans afresh by clearing lib.plans: the C++
    table's entries are those plans, so they go too."""
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "lib")
    lib.fast, lib.plans["k"] = _Table(None), "plan"
    lib.fast_keys.add(("k", 0, 0))
    lib.plans.clear()
    assert lib.fast.cleared == 1 and not lib.fast_keys and not lib.plans


class _Operand:
    """A stand-in for a torch tensor: what the offer reads of one."""

    def __init__(self, shape, strides, ptr):
        self.shape, self._strides, self._ptr = shape, strides, ptr

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    def dim(self):
        return len(self.shape)


def test_every_cpp_key_of_a_plan_is_offered(tmp_path, monkeypatch):
    """A linear's x of (T, K), (1, T, K) or (2, T/2, K) is one plan of the library, but
    fast.cpp keys each geometry (and x's address modulo 16) apart: each is offered once,
    whichever came first. (Offered once per plan, a patched layer whose linears had first
    been called on 2-D x took the Python path on every 3-D call: 0.70x-0.87x of the
    unpatched layer's forward, where the C++ path serves it at 1.0x; bench/NOTES.md.)"""
    import contextlib
    import types

    from tuner.runtime import call
    from tuner.runtime.library import Library

    fake_torch = types.SimpleNamespace(_C=types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda index: 7))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(call.driver, "entered", lambda g: contextlib.nullcontext())
    offered = []
    monkeypatch.setattr(fast, "offer", lambda t, lib, plan, A, B, C, bias, ctx, s: offered.append(
        (A.shape, A.data_ptr() & 15, s)))
    lib = Library.create_or_open(tmp_path / "lib")
    lib.fast = _Table(None)
    plan = types.SimpleNamespace(gpu=types.SimpleNamespace(index=0))
    W = _Operand((64, 32), (32, 1), 0x1000)
    ctx = fast.context(True, None, True)
    for shape, strides, ptr in [((16, 32), (32, 1), 0x2000), ((1, 16, 32), (512, 32, 1), 0x2000),
                                ((16, 32), (32, 1), 0x3000), ((2, 8, 32), (256, 32, 1), 0x2000),
                                ((16, 32), (32, 1), 0x2008), ((1, 16, 32), (512, 32, 1), 0x4000)]:
        call._offer(lib, "one plan", plan, _Operand(shape, strides, ptr), W, None, None, ctx)
    assert offered == [((16, 32), 0, 7), ((1, 16, 32), 0, 7), ((2, 8, 32), 0, 7),
                       ((16, 32), 8, 7)]
