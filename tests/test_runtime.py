"""The run path on the CPU, through a fake driver: the dispatch table, memoised plans, the
measure-off rule, decisions measured once and kept, graph capture, streams and launch
arguments, per-stream scratch."""

import dataclasses
import json
import logging
import multiprocessing
import struct

import numpy as np
import pytest

from _fake_gpu import Cai, Dev, FakeGpu
from _library import BIG, SMALL, build
from codegen.arch import ARCHS
from codegen.config import DType, Layout
from codegen.errors import UsageError
from codegen.families._common import Variant
from tuner.runtime import call, driver, measure, operands, runners
from tuner.runtime.dispatch import DispatchTable, table_path
from tuner.runtime.errors import LibraryError
from tuner.runtime.library import load_library


@pytest.fixture
def lib(tmp_path, compile_cache):
    build(tmp_path / "library", compile_cache, tmp_path / "art")
    return load_library(tmp_path / "library")


@pytest.fixture
def fake(monkeypatch):
    return FakeGpu(monkeypatch)


def test_launch_arguments_and_the_callers_stream(lib, fake):
    a, b, c = Cai(100, 50, 0x10000), Cai(50, 70, 0x20000), Cai(100, 70, 0x30000, ld=72)
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    assert lib.gemm(a, b, c, alpha=0.5, beta=2.0, stream=1234) is c
    # measured on scratch operands of the call's leading dimensions, each candidate once at
    # each end of M's bucket (65-128)
    names = sorted([SMALL.name, BIG.name, "cublas"])
    assert fake.measured == [((65, 70, 50), (50, 70, 72), (0, 0, 0), names),
                             ((128, 70, 50), (50, 70, 72), (0, 0, 0), names)]
    # ... on the call's own stream
    assert fake.measure_streams == [1234, 1234]
    assert {(call[0], call[3], call[4][4]) for call in fake.scratch_calls[:2]} == {
        (SMALL.name, 1234, 0x1000), (BIG.name, 1234, 0x1000)}
    assert fake.scratch_calls[2][5:7] == (0x1000, 50) and fake.scratch_calls[2][12] == 1234
    name, grid, block, stream, args = fake.launches[-1]
    assert (name, stream) == (SMALL.name, 1234)
    assert grid == SMALL.grid(100, 70) and block == SMALL.block()
    assert args == (100, 70, 50, 0.5, 0x10000, 50, 0, 0x20000, 70, 0, 2.0, 0x30000, 72, 0, 0)
    # the stream a __cuda_array_interface__ producer names, when the call names none
    lib.gemm(Cai(100, 50, 0x10000, stream=77), b, c, alpha=0.5, beta=2.0)
    assert fake.launches[-1][3] == 77
    lib.gemm(a, b, c)  # no stream anywhere: the legacy default stream
    assert fake.launches[-1][3] == 0
    lib.gemm(Cai(100, 50, 0x10004), b, c, stream=3)  # measured where the caller's A was
    assert fake.measured[-1][2] == (4, 0, 0)
    # any stream object: torch's .cuda_stream, cupy's .ptr, pycuda's .handle, the protocol
    for obj in (type("T", (), {"cuda_stream": 5})(), type("C", (), {"ptr": 6})(),
                type("P", (), {"handle": 7})(),
                type("S", (), {"__cuda_stream__": lambda self: (0, 8)})()):
        lib.gemm(a, b, c, stream=obj)
        assert fake.launches[-1][3] == operands.stream_handle(obj)
    assert len(fake.measured) == 4  # decided once per alignment class (two Ms each)


def test_plans_are_memoised_per_shape_and_alignment(lib, fake, monkeypatch):
    calls = []
    decide = type(lib).choose

    def counted(self, *args, **kw):
        calls.append(args[1:5])
        return decide(self, *args, **kw)

    monkeypatch.setattr(type(lib), "choose", counted)
    fake.times = {SMALL.name: 0.5}
    a, b, c = Cai(100, 50, 0x10000), Cai(50, 70, 0x20000), Cai(100, 70, 0x30000)
    for _ in range(5):
        lib.gemm(a, b, c)
    assert len(calls) == 1 and len(fake.launches) == 5
    lib.gemm(Cai(100, 50, 0x10004), b, c)  # A 4-byte aligned: another alignment class
    lib.gemm(a, Cai(50, 71, 0x20000), Cai(100, 71, 0x30000))  # another shape
    assert len(calls) == 3


def test_measure_off_compares_estimates_with_cublas(lib, fake):
    a, b, c = Cai(8192, 8192, 0x10000), Cai(8192, 8192, 0x20000), Cai(8192, 8192, 0x30000)
    lib.gemm(a, b, c, measure=False)
    assert fake.measured == [] and fake.launches == [] and len(fake.blas) == 1
    assert lib.explain(8192, 8192, 8192).endswith("a first call will measure")
    assert fake.blas[0][1:4] == (8192, 8192, 8192)
    skinny = Cai(16, 4096, 0x10000), Cai(4096, 4096, 0x20000), Cai(16, 4096, 0x30000)
    lib.gemm(*skinny, measure=False)
    assert fake.launches[-1][0] == SMALL.name and fake.measured == []


def test_measure_off_by_environment(lib, fake, monkeypatch):
    monkeypatch.setenv("GEMM_TUNE_MEASURE", "0")
    lib = load_library(lib.path)  # read as the library loads
    lib.gemm(Cai(16, 4096, 0x10000), Cai(4096, 4096, 0x20000), Cai(16, 4096, 0x30000))
    assert fake.measured == [] and fake.launches[-1][0] == SMALL.name


def test_an_exact_entry_that_lost_to_cublas_is_measured(lib, fake):
    ops = Cai(4096, 4096, 0x10000), Cai(4096, 4096, 0x20000), Cai(4096, 4096, 0x30000)
    lib.gemm(*ops, measure=False)  # the recorded ratio (0.90x) decides: cuBLAS
    assert fake.launches == [] and len(fake.blas) == 1 and fake.measured == []
    fake.times = {BIG.name: 0.9, SMALL.name: 5.0, "cublas": 1.0}
    lib.gemm(*ops)  # measured against cuBLAS as this caller reaches it, at its own M alone
    assert [x[0] for x in fake.measured] == [(4096, 4096, 4096)]
    assert fake.launches[-1][0] == BIG.name
    assert "(measured, gemm-tune callers)" in lib.explain(4096, 4096, 4096)
    assert "(its exact entry: this M alone)" in lib.explain(4096, 4096, 4096)


def test_a_measured_decision_is_kept_for_the_next_process(lib, fake):
    fake.times = {SMALL.name: 0.9, BIG.name: 2.0, "cublas": 0.5}
    ops = Cai(300, 200, 0x10000), Cai(200, 100, 0x20000), Cai(300, 100, 0x30000)
    lib.gemm(*ops)
    assert len(fake.blas) == 1 and len(fake.measured) == 2  # M's bucket: 257 and 384
    table = json.loads((lib.path / "dispatch.json").read_text())
    (key, d), = table["decisions"].items()
    assert "257-384x100x200" in key and "align 16.16.16" in key and "NVIDIA H200" in key
    assert "via gemm-tune" in key and d["route"] == "gemm-tune"
    del d["route"]
    assert d["kernel"] is None and d["measured_ms"] == {SMALL.name: 0.9, BIG.name: 2.0,
                                                        "cublas": 0.5}
    assert d["measured_m"] == [257, 384] and d["measured_ms_low"] == d["measured_ms"]
    again = load_library(lib.path)  # a new process: no measurement, the same choice
    again.gemm(*ops)
    again.gemm(Cai(301, 200, 0x10000), Cai(200, 100, 0x20000), Cai(301, 100, 0x30000))
    assert len(fake.measured) == 2 and len(fake.blas) == 3  # M 301: the same bucket
    assert again.explain(300, 100, 200, "fp32").startswith(
        "cuBLAS (measured, gemm-tune callers)")
    assert "cublas 0.5000 ms" in again.explain(300, 100, 200, "fp32")
    # a kernel must win by the margin: 1% faster than cuBLAS is not enough
    fake.times = {SMALL.name: 0.99, BIG.name: 2.0, "cublas": 1.0}
    again.gemm(Cai(301, 200, 0x10000), Cai(200, 101, 0x20000), Cai(301, 101, 0x30000))
    assert len(fake.blas) == 4 and len(fake.measured) == 4
    fake.times = {SMALL.name: 0.5, BIG.name: 2.0, "cublas": 1.0}
    again.gemm(Cai(302, 200, 0x10000), Cai(200, 102, 0x20000), Cai(302, 102, 0x30000))
    assert fake.launches[-1][0] == SMALL.name


def test_a_shape_first_seen_during_capture_uses_the_estimate(lib, fake):
    ops = Cai(16, 4096, 0x10000), Cai(4096, 4096, 0x20000), Cai(16, 4096, 0x30000)
    fake.capturing.add(99)
    fake.times = {SMALL.name: 5.0, BIG.name: 9.0, "cublas": 1.0}
    lib.gemm(*ops, stream=99)  # nothing measured, nothing kept: the estimate's kernel
    assert fake.measured == [] and fake.launches[-1][0] == SMALL.name
    assert not (lib.path / "dispatch.json").exists()
    lib.gemm(*ops, stream=5)  # outside capture: measured (M 9 and 16), cuBLAS wins, kept
    assert len(fake.measured) == 2 and len(fake.blas) == 1
    lib.gemm(*ops, stream=99)  # during a later capture the measured decision holds
    assert len(fake.blas) == 2 and len(fake.measured) == 2


def test_errors_before_any_launch(lib, fake):
    a, b = Cai(64, 32, 0x10000), Cai(32, 48, 0x20000)
    cases = [
        ((a, Cai(16, 48, 0x20000)), "A's columns must equal B's rows"),
        ((a, b, Cai(64, 47, 0x30000)), "C is 64x47"),
        ((Cai(64, 32, 0x10000, typestr="<f8"), b), "A is float64"),
        ((a, Cai(32, 48, 0x20000, typestr="<f2")), "they must be of one type"),
        ((a, b, Cai(64, 48, 0x30000, typestr="<f8")), "C must be float32, float16 or bfloat16"),
        ((Cai(64, 32, 0x10000, typestr="|V2"), b),  # cupy's view of a torch bfloat16 tensor
         "A is a 2-byte type cupy cannot name .*pass bfloat16 data as torch tensors"),
        ((a, Cai(32, 48, 0x20000, ld=40)),
         r"B is 32x48 with strides \(160, 4\) bytes: it must be row-major or column-major"),
        ((a, b, Cai(64, 48, 0x30000, column_major=True)),
         r"C is 64x48 with strides \(4, 256\) bytes: it must be row-major with a unit"),
        (([[1.0]], b), "got list"),
    ]
    for args, msg in cases:
        with pytest.raises(LibraryError, match=msg):
            lib.gemm(*args)
    with pytest.raises(LibraryError, match="beta != 0 needs a C"):
        lib.gemm(a, b, None, beta=1.0)
    with pytest.raises(LibraryError, match="stream must be"):
        lib.gemm(a, b, Cai(64, 48, 0x30000), stream="s")
    assert fake.launches == [] and fake.blas == []


def test_operands_on_two_gpus_are_refused(lib, fake, monkeypatch):
    monkeypatch.setattr(operands, "_device_of", lambda ptr, name: 1 if name == "B" else 0)
    with pytest.raises(LibraryError, match="A on GPU 0, B on GPU 1"):
        lib.gemm(Cai(4, 4, 0x10000), Cai(4, 4, 0x20000), Cai(4, 4, 0x30000))


def test_split_k_workspaces_are_per_stream(lib, fake, monkeypatch, compile_cache, tmp_path):
    from _library import entry
    from codegen import KernelConfig, compile_config

    monkeypatch.setattr(driver, "scratch", lambda s=driver.Scratch(): s)
    split = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=3, split=16)
    res = compile_config(split, "sm_90", compile_cache, tmp_path / "art")
    lib.add(entry(split, res, (128, 128, 4096), 20.0, 10.0),
            tmp_path / "art" / "sm_90" / f"{split.name}.cu", res.cubin)
    lib = load_library(lib.path)
    ops = Cai(128, 4096, 0x10000), Cai(4096, 128, 0x20000), Cai(128, 128, 0x30000)
    lib.gemm(*ops, alpha=0.5, beta=2.0, stream=1)
    lib.gemm(*ops, alpha=0.5, beta=2.0, stream=2)
    lib.gemm(*ops, alpha=0.5, beta=2.0, stream=1)
    main = [x for x in fake.launches if x[0] == split.name]
    reduce = [x for x in fake.launches if x[0] == split.name + "_reduce"]
    assert [x[3] for x in main] == [1, 2, 1] and [x[3] for x in reduce] == [1, 2, 1]
    w = [x[4][15] for x in main]  # after M N K alpha A lda sA B ldb sB beta C ldc sC bias
    assert w[0] == w[2] != w[1]  # one workspace per stream, reused on it
    assert fake.allocs == [16 * 128 * 128 * 4] * 2
    assert main[0][1] == (4, 1, 16)  # 2 x 2 tiles, 16 K slices
    # the reduce pass reads the same workspace and applies alpha and beta to C
    assert [r[4] for r in reduce[:1]] == [(128, 128, 0.5, w[0], 2.0, 0x30000, 128, 0, 0)]


def test_a_stream_k_kernel_launches_on_the_gpus_block_slots(lib, fake, monkeypatch,
                                                            compile_cache, tmp_path):
    """A CUDA-core stream-K kernel's grid is the GPU's block slots (SMs x what the driver's
    occupancy query says), its workspace two partial tiles a block of each problem, its
    tickets one a tile of each problem, zeroed once per stream."""
    from _library import entry
    from codegen import KernelConfig, compile_config

    monkeypatch.setattr(driver, "scratch", lambda s=driver.Scratch(): s)
    fake.blocks_per_sm = 2
    sk = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, streamk=1)
    res = compile_config(sk, "sm_90", compile_cache, tmp_path / "art")
    assert res.ok, res.log[-2000:]
    lib.add(entry(sk, res, (640, 1280, 512), 20.0, 10.0),
            tmp_path / "art" / "sm_90" / f"{sk.name}.cu", res.cubin)
    lib = load_library(lib.path)
    ops = Cai(640, 512, 0x10000), Cai(512, 1280, 0x20000), Cai(640, 1280, 0x30000)
    lib.gemm(*ops, alpha=0.5, beta=2.0, stream=1)
    lib.gemm(*ops, alpha=0.5, beta=2.0, stream=1)
    main = [x for x in fake.launches if x[0] == sk.name]
    assert len(main) == 2 and main[0][1] == (132 * 2, 1, 1)  # 200 tiles on 264 slots
    w, tickets = main[0][4][15:17]
    assert main[1][4][15:17] == (w, tickets)  # the stream's own, reused
    assert fake.allocs == [264 * 2 * 64 * 64 * 4, 10 * 20 * 4]
    assert [m[0] for m in fake.memsets] == [tickets]  # zeroed once: each launch leaves zeros


def test_wgmma_kernels_get_tensor_maps_and_only_aligned_operands(
        lib, fake, monkeypatch, compile_cache, tmp_path):
    import ctypes

    from _library import entry
    from codegen import compile_config
    from codegen.families.wgmma import WgmmaConfig
    from tuner.runtime import tma

    cfg = WgmmaConfig(bm=128, bn=128, bk=64, stages=4, consumers=1, cluster=1, persistent=0,
                      group=8, dtype=DType.F16)
    res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
    assert res.ok, res.log[-2000:]
    lib.add(entry(cfg, res, (256, 256, 256), 900.0, 700.0, dtype="f16"),
            tmp_path / "art" / "sm_90a" / f"{cfg.name}.cu", res.cubin)
    lib = load_library(lib.path)

    class Map:  # a CUtensorMap's stand-in: 128 bytes at a fixed address
        def __init__(self, args):
            self.args, self.buf = args, ctypes.create_string_buffer(128)

        def getPtr(self):
            return ctypes.addressof(self.buf)

    encoded = []
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map(args))
    launched = []

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, address, extra):
        ptrs = (ctypes.c_void_p * 9).from_address(address)
        scalars = struct.unpack("<i4xi4xi4xf4xf4xQi4x", ctypes.string_at(ptrs[2], 56))
        launched.append((f, (gx, gy, gz), (bx, by, bz), smem, stream, ptrs[0], ptrs[1],
                         scalars))
        return (0,)

    monkeypatch.setattr(fake.cu, "cuLaunchKernel", launch_kernel, raising=False)
    a, b = Cai(256, 256, 0x100000, typestr="<f2"), Cai(256, 256, 0x200000, typestr="<f2")
    c = Cai(256, 256, 0x300000)
    lib.gemm(a, b, c, alpha=0.5, beta=2.0, stream=9)  # the exact entry: the wgmma kernel
    f, grid, block, smem, stream, tma, tmb, scalars = launched[-1]
    assert f == f"{cfg.name} on GPU 0" and stream == 9 and smem == cfg.smem_bytes
    assert grid == cfg.grid(256, 256, 132) and block == cfg.block()
    assert scalars == (256, 256, 256, 0.5, 2.0, 0x300000, 256)
    assert [e["globalAddress"] for e in encoded] == [0x100000, 0x200000]
    assert encoded[0]["boxDim"] == [64, 128] and encoded[1]["globalStrides"] == [512]
    lib.gemm(a, b, c, stream=9)  # the same pointers: the maps are reused
    assert len(encoded) == 2 and launched[-1][5:7] == (tma, tmb)
    # A 2-byte aligned (not TMA's 16): the wgmma kernel is never a candidate
    lib.gemm(Cai(256, 256, 0x100002, typestr="<f2"), b, c, stream=9)
    assert len(launched) == 2 and fake.blas


def test_tf32_pre_pass_kernels_run_their_pre_pass_into_a_per_stream_workspace(
        lib, fake, monkeypatch, compile_cache, tmp_path):
    import ctypes

    from _library import entry
    from codegen import compile_config
    from codegen.families.wgmma import WgmmaConfig
    from tuner.runtime import tma

    cfg = WgmmaConfig(bm=128, bn=128, bk=32, stages=4, consumers=2, cluster=1, persistent=1,
                      group=8, dtype=DType.TF32, prep=1)
    res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
    assert res.ok, res.log[-2000:]
    lib.add(entry(cfg, res, (256, 256, 256), 400.0, 300.0, dtype="tf32"),
            tmp_path / "art" / "sm_90a" / f"{cfg.name}.cu", res.cubin)
    lib = load_library(lib.path)

    class Map:
        def __init__(self, args):
            self.args, self.buf = args, ctypes.create_string_buffer(128)

        def getPtr(self):
            return ctypes.addressof(self.buf)

    encoded, launched = [], []
    monkeypatch.setattr(tma, "encode", lambda args: encoded.append(args) or Map(args))
    plain = fake.cu.cuLaunchKernel  # records ParamBlock launches (the pre-pass) in fake.launches

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, address, extra):
        if f.startswith(cfg.name + "_prep"):
            launched.append(("prep", stream))
            return plain(f, gx, gy, gz, bx, by, bz, smem, stream, address, extra)
        ptrs = (ctypes.c_void_p * 9).from_address(address)
        scalars = struct.unpack("<i4xi4xi4xf4xf4xQi4x", ctypes.string_at(ptrs[2], 56))
        launched.append(("main", stream, (gx, gy, gz), ptrs[0], ptrs[1], scalars))
        return (0,)

    monkeypatch.setattr(fake.cu, "cuLaunchKernel", launch_kernel, raising=False)
    a, b, c = Cai(256, 256, 0x100000), Cai(256, 256, 0x200000), Cai(256, 256, 0x300000)
    lib.gemm(a, b, c, alpha=0.5, beta=2.0, stream=9, allow_tf32=True)
    assert [x[:2] for x in launched] == [("prep", 9), ("main", 9)]
    name, grid, block, stream, args = fake.launches[-1]
    assert name == cfg.name + "_prep" and grid == (cfg.prep_grid(256, 256, 256)[0], 1, 1)
    w, ldw = args[7], cfg.prep_ld(256)
    assert args == (0x100000, 256, 0x200000, 256, 256, 256, 256, w, w + 256 * ldw * 4, ldw,
                    cfg.prep_grid(256, 256, 256)[1])
    assert fake.allocs[-1] == cfg.prep_floats(256, 256, 256) * 4  # this stream's workspace
    # the maps describe the pre-pass's copies, K-major: At (M x K) and Bt (N x K)
    assert [e["globalAddress"] for e in encoded] == [w, w + 256 * ldw * 4]
    assert [e["boxDim"] for e in encoded] == [[32, 128], [32, 128]]
    assert launched[-1][5] == (256, 256, 256, 0.5, 2.0, 0x300000, 256)
    lib.gemm(a, b, c, stream=9, allow_tf32=True)  # same stream: its workspace and maps again
    assert len(encoded) == 2 and fake.launches[-1][4][7] == w
    lib.gemm(a, b, c, stream=10, allow_tf32=True)  # another stream: its own workspace
    assert len(encoded) == 4 and fake.launches[-1][4][7] != w
    # A at a 4-byte offset with an odd leading dimension: TMA could not read it, but the
    # pre-pass does, so the kernel stays a candidate (measured against cuBLAS) and runs
    fake.times = {cfg.name: 0.5, "cublas": 1.0}
    lib.gemm(Cai(256, 256, 0x100004, ld=257), b, c, stream=9, allow_tf32=True)
    assert cfg.name in fake.measured[-1][-1]
    assert fake.launches[-1][0] == cfg.name + "_prep"
    assert fake.launches[-1][4][:2] == (0x100004, 257) and not fake.blas


# ---- per-stream scratch ----------------------------------------------------------------------
class FakeCu:
    def __init__(self):
        self.next, self.memsets = 0x100000, []

    def cuMemAlloc(self, size):
        self.next += 1 << 30
        return 0, self.next

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.memsets.append((ptr, count, stream))
        return (0,)


def test_scratch_is_per_stream_and_graph_safe(monkeypatch):
    cu = FakeCu()
    monkeypatch.setattr(driver, "api", lambda: cu)
    capturing = set()
    monkeypatch.setattr(driver, "is_capturing", lambda s: s in capturing)
    g = driver.Gpu(0, "NVIDIA H200", 90, ARCHS[90], 0, 0, 0, 1)
    s = driver.Scratch()
    w1 = s.get(g, 1, "split-K workspace", 1000)
    w2 = s.get(g, 2, "split-K workspace", 1000)
    assert w1 != w2  # two streams never share a workspace
    assert s.get(g, 1, "split-K workspace", 500) == w1  # reused
    assert s.get(g, 1, "split-K workspace", 1500) not in (w1, w2)  # grown
    t = s.get(g, 1, "split-K tickets", 64, zero=True)
    assert cu.memsets == [(t, 64, 1)]
    capturing.add(3)
    with pytest.raises(driver.UsageError, match="make the same call once before capturing"):
        s.get(g, 3, "split-K workspace", 1000)
    kept = []
    p = s.get(g, 3, "split-K workspace", 1000,
              allocate_captured=lambda n: (0xABC00, kept.append(n) or "owner"))
    assert p == 0xABC00 and kept == [1000] and "owner" in s._keep


def test_param_block_packs_every_argument():
    blk = driver.ParamBlock(runners.Runner.SIGNATURE + "P")
    address = blk.pack(7, 8, 9, 0.5, 0xDEAD0000, 9, -(1 << 40), 0xBEEF0000, 8, 0, 2.0,
                       0xF00D0000, 8, 1 << 33, 0xB1A5, 0x1000)
    assert address == blk.address
    ptrs = [blk.ptrs[i] for i in range(16)]
    base = ptrs[0]
    assert ptrs == [base + 8 * i for i in range(16)]
    raw = bytes(blk.buf)
    assert struct.unpack_from("<i", raw, 0)[0] == 7
    assert struct.unpack_from("<f", raw, 24)[0] == 0.5
    assert struct.unpack_from("<Q", raw, 32)[0] == 0xDEAD0000
    assert struct.unpack_from("<q", raw, 48)[0] == -(1 << 40)  # a batch stride, 64-bit
    assert struct.unpack_from("<q", raw, 104)[0] == 1 << 33
    assert struct.unpack_from("<Q", raw, 112)[0] == 0xB1A5  # the bias
    assert struct.unpack_from("<Q", raw, 120)[0] == 0x1000


# ---- the dispatch table ----------------------------------------------------------------------
def _key(**kw):
    args = dict(gpu_name="NVIDIA H200", driver=13000, cublas=130100, fingerprint="abc",
                dtype="f32", layout="nn", m=3, n=4, k=5, align=(16, 16, 16))
    args.update(kw)
    return DispatchTable.key(**args)


def test_table_round_trip_and_keying(tmp_path):
    t = DispatchTable(tmp_path / "dispatch.json")
    d = dict(kernel=SMALL.name, measured_ms={SMALL.name: 1.0, "cublas": 2.0},
             date="2026-12-01T00:00:00")
    t.put(_key(), d)
    again = DispatchTable(tmp_path / "dispatch.json")
    assert again.get(_key()) == d
    for change in (dict(gpu_name="NVIDIA H100"), dict(driver=12080), dict(cublas=120900),
                   dict(fingerprint="abd"), dict(dtype="tf32"), dict(m=4),
                   dict(align=(16, 4, 16))):
        assert again.get(_key(**change)) is None, change


def test_table_beside_a_read_only_library_goes_to_the_user_cache(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    assert table_path(lib) == lib / "dispatch.json"
    monkeypatch.setenv("GEMM_TUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("os.access", lambda p, mode: False)
    p = table_path(lib)
    assert p.parent == tmp_path / "cache" / "dispatch" and p.suffix == ".json"


@pytest.mark.parametrize("text", [b"{trunc", b"[1, 2]", b'{"schema": 99, "decisions": {}}',
                                  b'{"schema": 3, "decisions": {"\xff\xfe": 1}}',
                                  b"[" * 100_000 + b"]" * 100_000],
                         ids=["truncated", "a list", "schema 99", "not utf-8", "deep"])
def test_a_corrupt_table_is_set_aside_with_a_warning(tmp_path, caplog, text):
    path = tmp_path / "dispatch.json"
    path.write_bytes(text)
    t = DispatchTable(path)
    with caplog.at_level(logging.WARNING):
        assert t.get(_key()) is None
    assert "is corrupt" in caplog.text and "set aside" in caplog.text
    aside = list(tmp_path.glob("dispatch.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == text
    t.put(_key(), dict(kernel=None, measured_ms={}, date=""))
    assert DispatchTable(path).get(_key()) is not None


def test_a_decision_that_cannot_be_read_is_measured_again_and_kept_aside(tmp_path, caplog):
    """A table whose file reads but some of whose decisions do not (hand-edited, damaged):
    those are no decision (measured again), the file is copied aside once with a warning,
    and the readable decisions stay."""
    path = tmp_path / "dispatch.json"
    good = dict(kernel=SMALL.name, measured_ms={SMALL.name: 1.0, "cublas": 2.0},
                measured_m=[3, 3], date="2026-12-01T00:00:00")
    bad = {4: dict(good, measured_ms=[1, 2]), 5: dict(good, measured_m="x"), 6: "x",
           7: dict(good, kernel=5), 8: dict(good, kernel="bogus"),
           9: dict(good, device_ms={"cublas": "fast"}),
           10: {k: v for k, v in good.items() if k != "date"},
           11: dict(good, measured_ms={"cublas": 10**400})}
    text = json.dumps({"schema": 3, "decisions": {_key(): good, **{
        _key(m=m): d for m, d in bad.items()}}})
    path.write_text(text)
    t = DispatchTable(path)
    with caplog.at_level(logging.WARNING):
        assert t.get(_key()) == good
        assert all(t.get(_key(m=m)) is None for m in bad)
    assert "8 decision(s) cannot be read" in caplog.text
    (aside,) = tmp_path.glob("dispatch.json.corrupt-*")
    assert aside.read_text() == text
    t.put(_key(m=4), dict(good, measured_m=[4, 4]))
    assert json.loads(path.read_text())["decisions"] == {_key(): good,
                                                         _key(m=4): dict(good, measured_m=[4, 4])}


#: a kernel name per writer of the test below
_WRITERS = [dataclasses.replace(SMALL, swizzle=s).name for s in (1, 2, 4, 8)]


def _writer(path, worker, count):
    t = DispatchTable(path)
    for i in range(count):
        t.put(_key(m=worker * 1000 + i), dict(kernel=_WRITERS[worker], measured_ms={}, date=""))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "dispatch.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    decisions = json.loads(path.read_text())["decisions"]
    assert len(decisions) == 60
    assert {d["kernel"] for d in decisions.values()} == set(_WRITERS)


def test_prewarm_without_a_gpu_is_one_line(lib, tmp_path, capsys):
    from tuner.cli import main

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# warm these\n300x200x100\n16x4096x4096\n")
    assert main(["prewarm", "--shapes", str(shapes), "--library", str(lib.path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "cuda" in err.lower()  # no cuda-bindings, or no driver: it says which
    shapes.write_text("300x200\n")
    assert main(["prewarm", "--shapes", str(shapes), "--library", str(lib.path)]) == 2
    assert "shape must be MxNxK" in capsys.readouterr().err


def test_prewarm_measures_each_shape_and_keeps_it(lib, fake, tmp_path, capsys):
    from tuner.cli import main

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("300x200x100\n16x4096x4096\n")
    fake.times = {SMALL.name: 0.5}
    assert main(["prewarm", "--shapes", str(shapes), "--library", str(lib.path),
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["shape"], r["kernel"], r["rule"]) for r in rows] == [
        ("300x200x100", SMALL.name, "measured"), ("16x4096x4096", SMALL.name, "measured")]
    assert [m[0] for m in fake.measured] == [(257, 200, 100), (384, 200, 100),
                                             (9, 4096, 4096), (16, 4096, 4096)]
    assert len(json.loads((lib.path / "dispatch.json").read_text())["decisions"]) == 2


# ---- host-resident GEMMs ---------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 200_000), n=st.integers(1, 20_000), k=st.integers(1, 20_000),
       elem=st.sampled_from([2, 4]), target=st.sampled_from([1 << 20, 16 << 20, 64 << 20]))
def test_chunks_cover_the_rows_in_order(m, n, k, elem, target):
    from tuner.runtime.host import ROW_GRAIN, STREAMS, plan_chunks

    chunks = plan_chunks(m, n, k, elem, target)
    assert chunks[0][0] == 0 and chunks[-1][1] == m
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))  # no gap, no overlap
    assert all(r1 > r0 for r0, r1 in chunks)
    assert all((r1 - r0) % ROW_GRAIN == 0 for r0, r1 in chunks[:-1])  # whole tiles
    assert len(chunks) <= 64
    # enough chunks for the copies to overlap the compute, wherever M has the rows
    assert len(chunks) >= min(2 * STREAMS, m // ROW_GRAIN) or m <= ROW_GRAIN
    sizes = [r1 - r0 for r0, r1 in chunks]
    assert max(sizes) - min(sizes[:-1] or sizes) == 0  # all equal but the last


def test_gemm_batch_takes_numpy_pairs_only(lib, fake):
    with pytest.raises(LibraryError, match="gemm_batch takes numpy arrays; A is Cai"):
        lib.gemm_batch([(Cai(4, 4, 0x1000), np.ones((4, 4), np.float32))])
    with pytest.raises(LibraryError, match="2 outputs for 1"):
        lib.gemm_batch([(np.ones((4, 4), np.float32),) * 2], out=[None, None])
    a = np.ones((4, 4), np.float32)
    for pairs, said in (([(a,)], "item 0 is not an .A, B. pair .got tuple"),
                        ([a], "item 0 is not an .A, B. pair .got ndarray"),
                        (None, "takes a list of .A, B. pairs .*got NoneType")):
        with pytest.raises(LibraryError, match=said):
            lib.gemm_batch(pairs)
    # beta reads C: an output allocated here would be read uninitialised
    with pytest.raises(LibraryError, match="beta != 0 needs a C to read"):
        lib.gemm_batch([(a, a), (a, a)], beta=1.0, out=[np.ones((4, 4), np.float32), None])
    assert fake.launches == [] and fake.blas == []


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (5000, 700), (123457, 3)])
def test_copy_rows_copies_everything(shape):
    from tuner.runtime.host import copy_rows

    src = np.random.default_rng().standard_normal(shape).astype(np.float32)
    dst = np.full_like(src, np.nan)
    copy_rows(dst, src)
    assert np.array_equal(dst, src)
    wide = np.full((shape[0], shape[1] + 3), np.nan, np.float32)
    copy_rows(wide[:, :shape[1]], src)  # into a view with padded rows
    assert np.array_equal(wide[:, :shape[1]], src) and np.isnan(wide[:, shape[1]:]).all()


def test_every_request_has_torch_scratch_operands_for_its_first_use_measurement():
    """A torch caller's first use times candidates on torch tensors of the request's data
    type: fp32 data for tf32 and 3xTF32 requests (an f32x3 request raised KeyError here)."""
    assert set(measure.TORCH_DATA) == set(DType)
    assert {measure.TORCH_DATA[d] for d in (DType.F32, DType.TF32, DType.F32X3)} == {"float32"}
    assert (measure.TORCH_DATA[DType.F16], measure.TORCH_DATA[DType.BF16]) == \
        ("float16", "bfloat16")


@pytest.mark.parametrize("a_t,b_t", [(False, True), (True, False), (True, True)])
def test_transposed_views_run_without_a_copy_on_cublas_with_their_layout(lib, fake, a_t, b_t):
    """x @ W.t() and the other layouts: the strides say which operand is stored by columns;
    this library holds NN kernels only, so cuBLAS runs them in place (its op flags), and the
    decision is keyed by layout (nothing measured: there is nothing to measure against)."""
    from codegen.config import Layout

    a = Cai(100, 50, 0x10000, column_major=a_t)
    b = Cai(50, 70, 0x20000, column_major=b_t)
    lib.gemm(a, b, Cai(100, 70, 0x30000))
    layout = Layout.of(a_t, b_t)
    assert fake.launches == [] and fake.measured == [] and fake.blas_layouts == [layout]
    m, n, k, alpha, pa, lda, pb, ldb = fake.blas[0][1:9]
    assert (m, n, k, pa, pb) == (100, 70, 50, 0x10000, 0x20000)
    assert (lda, ldb) == (100 if a_t else 50, 50 if b_t else 70)  # between lines as stored
    assert "cuBLAS" in lib.select(100, 70, 50, DType.F32, 90, 132, layout=layout).reason


def test_record_counts_each_problem_without_an_exact_entry(lib, fake, tmp_path):
    """lib.record(FILE): a line per problem run without an exact entry (its layout, shape,
    alignment, calls and the time the decision knew of), appended when the block ends."""
    fake.times = {"cublas": 0.25}
    path = tmp_path / "problems.jsonl"
    a, b, c = Cai(100, 50, 0x10000), Cai(50, 70, 0x20000), Cai(100, 70, 0x30000)
    with lib.record(path) as rec:
        for _ in range(3):
            lib.gemm(a, b, c)
        for _ in range(2):
            lib.gemm(a, Cai(50, 70, 0x40000, column_major=True), c)  # x @ W.t()
        for _ in range(4):  # exactly tuned (BIG, where cuBLAS won): not a problem to tune
            lib.gemm(Cai(4096, 4096, 0x10000), Cai(4096, 4096, 0x20000),
                     Cai(4096, 4096, 0x30000))
        assert not path.exists()  # nothing written until the block ends
    assert rec.flush() == 0 and lib.recorder is None
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()),
                  key=lambda r: r["layout"])
    assert [(r["layout"], r["m"], r["n"], r["k"], r["calls"]) for r in rows] == [
        ("nn", 100, 70, 50, 3), ("nt", 100, 70, 50, 2)]
    nn, nt = rows
    assert nn["rule"] == "measured" and nn["ms_per_call"] == 0.25 and nn["ms"] == 0.75
    assert nt["rule"] == "cublas" and nt["ms_per_call"] is None and nt["ms"] is None
    assert nn["align"] == [8, 8, 8] and nn["dtype"] == "f32" and nn["gpu"] == "NVIDIA H200"
    lib.gemm(a, b, c)  # after the block: nothing counted
    assert len(path.read_text().splitlines()) == 2


def _recorder(path, worker, count):
    from tuner.runtime.record import Recorder

    rec = Recorder(path)
    for i in range(count):
        t = rec.tally(dict(dtype="f32", m=worker, n=i, k=1, ms_per_call=0.5))
        t[0] += worker + 1
        rec.flush()


def test_record_files_take_appends_from_several_processes(tmp_path):
    path = tmp_path / "problems.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_recorder, args=(path, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 100 and {(r["m"], r["n"]) for r in rows} == {
        (w, i) for w in range(4) for i in range(25)}
    assert all(r["calls"] == r["m"] + 1 and r["ms"] == 0.5 * r["calls"] for r in rows)


# ---- variants (layout, C's type, bias, activation) and batches --------------------------------
#: SMALL building NT (x @ W.t()), fp16 C, a bias of C's type and GELU: a variant kernel
VARIANT = dataclasses.replace(SMALL, layout=Layout.NT, out=DType.F16, bias="out", act="gelu")
VSHAPE = (256, 128, 64)


@pytest.fixture
def vlib(tmp_path, compile_cache, monkeypatch):
    """The library of `lib` plus VARIANT tuned at VSHAPE (2x cuBLAS there); the run-time
    epilogue kernel compiles into the session's compile cache."""
    from _library import entry
    from codegen import compile_config

    monkeypatch.setenv("GEMM_TUNE_CACHE_DIR", str(compile_cache))
    lib = build(tmp_path / "library", compile_cache, tmp_path / "art")
    res = compile_config(VARIANT, "sm_90", compile_cache, tmp_path / "art")
    assert res.ok, res.log[-2000:]
    lib.add(entry(VARIANT, res, VSHAPE, 20.0, 10.0), tmp_path / "art" / "sm_90" /
            f"{VARIANT.name}.cu", res.cubin)
    return load_library(tmp_path / "library")


def _variant(layout="nn", out=DType.F32, bias="none", act="none"):
    return Variant(Layout(layout), out, bias, act)


def test_3d_operands_are_batches_with_a_stride_each(fake):
    op = operands.operand
    a = op(Dev((4, 100, 50), 0x10000), "A", inputs=True)
    assert (a.batch, a.rows, a.cols, a.ld, a.bstride, a.batched) == (4, 100, 50, 50, 5000, True)
    # a transposed view per problem: column-major, its columns 100 apart
    t = op(Dev((4, 100, 50), 0x10000, strides=(6000, 1, 100)), "A", inputs=True)
    assert (t.column_major, t.ld, t.bstride) == (True, 100, 6000)
    # expanded over the batch (stride 0), or a batch of one: one matrix for every problem
    e = op(Dev((4, 50, 70), 0x20000, strides=(0, 70, 1)), "B", inputs=True)
    assert (e.batch, e.bstride) == (4, 0)
    one = op(Dev((1, 50, 70), 0x20000), "B", inputs=True)
    assert (one.batch, one.bstride, one.batched) == (1, 0, True)
    b = op(Dev((50, 70), 0x20000), "B", inputs=True)
    req = call.request(a, b, None)
    assert (req.m, req.n, req.k, req.batch, req.batched) == (100, 70, 50, 4, True)
    assert call.request(op(Dev((100, 50), 0x10000), "A", inputs=True), e, None).batch == 4
    assert call.request(a, one, None).batch == 4
    assert a.geometry() == ((4, 100, 50), (5000, 50, 1))
    assert t.geometry() == ((4, 100, 50), (6000, 1, 100))
    # several batch dimensions, as torch.matmul takes them: one batch of their problems,
    # wherever they fold into one stride (a dimension of 1 has any stride)
    nd = op(Dev((2, 1, 3, 100, 50), 0x10000, strides=(15000, 7, 5000, 50, 1)), "A", inputs=True)
    assert (nd.batch, nd.bstride, nd.lead, nd.batched) == (6, 5000, (2, 1, 3), True)
    assert nd.geometry() == ((6, 100, 50), (5000, 50, 1))
    en = op(Dev((2, 3, 50, 70), 0x20000, strides=(0, 0, 70, 1)), "B", inputs=True)
    assert (en.batch, en.bstride) == (6, 0)  # expanded throughout: one B for every problem
    req = call.request(nd, op(Dev((1, 50, 70), 0x20000), "B", inputs=True), None)
    assert (req.batch, req.lead) == (6, (2, 1, 3))  # B's batch of one broadcast over A's


@pytest.mark.parametrize("args,msg", [
    ((Dev((4, 100, 50), 0x10000), Dev((3, 50, 70), 0x20000)),
     "A is a batch of 4 and B a batch of 3: batches must be of one size, or 1"),
    ((Dev((4, 100, 50), 0x10000), Dev((50, 70), 0x20000), Dev((100, 70), 0x30000)),
     r"C is 100x70; A @ B is 4x100x70"),
    ((Dev((4, 100, 50), 0x10000), Dev((50, 70), 0x20000),
      Dev((4, 100, 70), 0x30000, strides=(0, 70, 1))),
     "C's problems are 0 elements apart and each spans 7000: every problem of the batch "
     "needs a C of its own"),
    ((Dev((), 0x10000), Dev((100, 70), 0x20000)),
     r"A must be a 2-D matrix or a batch of them \(got 0 dimensions\)"),
    ((Dev((2, 3, 100, 50), 0x10000, strides=(20000, 5000, 50, 1)), Dev((50, 70), 0x20000)),
     r"A is 2x3x100x50 with strides \(80000, 20000, 200, 4\) bytes: its batch dimensions "
     "do not fold into one"),
    ((Dev((2, 3, 100, 50), 0x10000), Dev((3, 2, 50, 70), 0x20000)),
     "A is 2x3x100x50 and B is 3x2x50x70: their batch dimensions do not broadcast"),
    ((Dev((2, 3, 100, 50), 0x10000), Dev((50, 70), 0x20000), Dev((6, 100, 70), 0x30000)),
     "C is 6x100x70; A @ B is 2x3x100x70"),
    ((Dev((3, 1, 100, 50), 0x10000), Dev((1, 3, 50, 70), 0x20000),
      Dev((3, 3, 100, 70), 0x30000)),
     "A is 3x1x100x50 and B is 1x3x50x70: their batch dimensions broadcast to 3x3, 9 "
     "problems, where a strided batch pairs A's 3 with B's 3 in step"),
    ((Dev((3, 1, 100, 50), 0x10000), Dev((3, 50, 70), 0x20000)),
     "broadcast to 3x3, 9 problems"),
    ((Dev((4, 100, 50), 0x10000, strides=(-5000, 50, 1)), Dev((50, 70), 0x20000)),
     r"A is 4x100x50 with strides \(-20000, 200, 4\) bytes: it must be row-major or "
     r"column-major \(each problem of the batch\) with a unit stride"),
    ((Dev((4, 100, 50), 0x10000, strides=(5000, 2, 200)), Dev((50, 70), 0x20000)),
     r"A is 4x100x50 with strides \(20000, 8, 800\) bytes"),
    ((Dev((100, 50), 0x10000), Dev((50, 70), 0x20000), Dev((100, 70), 0x30000),
      0.5, 0.0, "gelu_erf"), "activation 'gelu_erf' is not one of none, relu, gelu, "
                             "gelu_tanh, silu"),
])
def test_batch_and_epilogue_errors_are_one_line_before_any_launch(lib, fake, args, msg):
    A, B, *rest = args
    C = rest[0] if rest else None
    act = rest[3] if len(rest) > 3 else None
    with pytest.raises(LibraryError, match=msg) as e:
        lib.gemm(A, B, C, activation=act)
    assert "\n" not in str(e.value)
    assert fake.launches == [] and fake.blas == []


def _bent(**cai):
    """A device array whose __cuda_array_interface__ is 100x50 float32, changed by `cai`
    (None: the key removed)."""
    x = Dev((100, 50), 0x10000)
    for key, v in cai.items():
        if v is None:
            del x.__cuda_array_interface__[key]
        else:
            x.__cuda_array_interface__[key] = v
    return x


@pytest.mark.parametrize("A,kw,said", [
    (None, dict(out_dtype=("f4", -1)), r"out_dtype \('f4', -1\) is not float32, float16"),
    (_bent(data=None), {}, r"A's __cuda_array_interface__ is malformed \(KeyError: 'data'\)"),
    (_bent(typestr="zz"), {}, "A's __cuda_array_interface__ is malformed .TypeError"),
    (_bent(strides=(4,)), {}, r"A's __cuda_array_interface__ is malformed \(shape \(100, 50\)"),
    (_bent(shape=(100, -50)), {}, "A's __cuda_array_interface__ is malformed"),
    (None, dict(stream=True), r"stream must be an int handle \(0 to 2\*\*64 - 1\).*bool True"),
    (None, dict(stream=-1), "stream must be an int handle .*got int -1"),
    (None, dict(stream=2**70), "stream must be an int handle"),
    (None, dict(measure="no"), "measure must be True or False .got str 'no'."),
    (None, dict(static_b="yes"), "static_b must be True or False"),
    (None, dict(allow_tf32="no"), "allow_tf32 must be True or False"),
])
def test_call_arguments_out_of_their_kind_are_one_line(lib, fake, A, kw, said):
    """Arguments a caller gets wrong in kind (a malformed array interface, a stream handle
    no CUstream has, a word where a flag goes): one line, nothing launched (they had raised
    KeyError or ValueError from inside, or been taken: measure="no" measured)."""
    with pytest.raises(LibraryError, match=said) as e:
        lib.gemm(A if A is not None else Dev((100, 50), 0x10000), Dev((50, 70), 0x20000),
                 Dev((100, 70), 0x30000), **kw)
    assert "\n" not in str(e.value)
    assert fake.launches == [] and fake.blas == []


def test_out_dtype_defaults_and_refusals(lib, fake):
    op = operands.operand
    a16, b16 = op(Dev((64, 32), 0x10000, "<f2"), "A", True), op(Dev((32, 48), 0x20000, "<f2"),
                                                                "B", True)
    a32, b32 = op(Dev((64, 32), 0x10000), "A", True), op(Dev((32, 48), 0x20000), "B", True)
    assert call.request(a16, b16, None).out is DType.F16  # as torch.matmul: the inputs' type
    assert call.request(a32, b32, None).out is DType.F32
    assert call.request(a16, b16, None, out="float32").out is DType.F32
    assert call.request(a32, b32, None, out="bf16").out is DType.BF16
    assert call.request(a32, b32, None, out=np.float16).out is DType.F16
    c32 = op(Dev((64, 48), 0x30000), "C", writable=True)
    assert call.request(a16, b16, c32).out is DType.F32  # a given C's type
    with pytest.raises(LibraryError, match="C is f32 but out_dtype asks for f16"):
        call.request(a16, b16, c32, out="float16")
    with pytest.raises(LibraryError, match="out_dtype 'int8' is not float32, float16 or "
                                           "bfloat16"):
        call.request(a32, b32, None, out="int8")
    with pytest.raises(LibraryError, match="C is needed: gemm-tune cannot allocate"):
        lib.gemm(Dev((64, 32), 0x10000), Dev((32, 48), 0x20000))  # no kind to allocate


def test_bias_must_be_a_vector_of_n_of_cs_type_or_fp32(lib, fake):
    op = operands.operand
    a, b = op(Dev((64, 32), 0x10000), "A", True), op(Dev((32, 48), 0x20000), "B", True)
    a16, b16 = op(Dev((64, 32), 0x10000, "<f2"), "A", True), op(Dev((32, 48), 0x20000, "<f2"),
                                                                "B", True)
    assert call.request(a, b, None, bias=Dev((48,), 0x40000)).bias_kind == "out"
    assert call.request(a16, b16, None, bias=Dev((48,), 0x40000, "<f2")).bias_kind == "out"
    req = call.request(a16, b16, None, bias=Dev((48,), 0x40000))
    assert req.bias_kind == "f32" and req.bias.ptr == 0x40000
    assert req.variant(a16, b16) == _variant("nn", DType.F16, "f32")
    cases = [
        ((a, b, Dev((47,), 0x40000)), r"the bias is 47 with strides \(1,\) elements: it must "
                                      "be a vector of N = 48 elements with a unit stride"),
        ((a, b, Dev((48,), 0x40000, strides=(2,))), r"strides \(2,\) elements"),
        ((a, b, Dev((1, 48), 0x40000)), "the bias is 1x48"),
        ((a, b, Dev((48,), 0x40000, "<f2")), r"the bias is f16; it must be of C's type \(f32\) "
                                             "or float32"),
        ((a, b, np.zeros(48, np.float32)), "the bias is a numpy array: pass it on the GPU"),
        ((a, b, [0.0] * 48), "the bias must be a torch tensor, a cupy array"),
    ]
    for (x, y, bias), msg in cases:
        with pytest.raises(LibraryError, match=msg):
            call.request(x, y, None, bias=bias)


def test_an_entry_serves_only_its_own_variant(vlib):
    """A kernel tuned for NT, fp16 C, bias and GELU serves that request and no other; and
    the plain kernels serve none of the variant's requests."""
    v = _variant("nt", DType.F16, "out", "gelu")
    m, n, k = VSHAPE
    exact = vlib.select(m, n, k, DType.F32, 90, 132, layout=v)
    assert (exact.kernel, exact.rule) == (VARIANT.name, "exact")
    assert "nt, f16 C, bias + gelu" in exact.reason
    for other in (Variant(), _variant("nt"), _variant("nt", DType.F16, "out", "relu"),
                  _variant("nt", DType.F16, "f32", "gelu"), _variant("nt", DType.F16),
                  _variant("nn", DType.F16, "out", "gelu"), _variant("tt", DType.F16, "out",
                                                                     "gelu")):
        c = vlib.select(m, n, k, DType.F32, 90, 132, layout=other)
        assert c.kernel != VARIANT.name, other
        assert VARIANT.name not in [e["kernel"] for _, e in
                                    vlib.ranked(16, 4096, 4096, DType.F32, 90, 132, other)]
    assert vlib.select(m, n, k, DType.F32, 90, 132, layout=_variant("nt")).reason.startswith(
        "no kernel tuned for f32 nt on sm_90")
    # another shape or batch: the estimate (no exact entry), still only this kernel
    est = vlib.select(m, n, k, DType.F32, 90, 132, layout=v, batch=3)
    assert est.rule == "estimate" and "batch 3" in est.reason
    assert [e["kernel"] for _, e in vlib.ranked(m, n, k, DType.F32, 90, 132, v, batch=3)] \
        == [VARIANT.name]
    assert vlib.ranked(m, n, k, DType.F32, 90, 132, v, batch=70000) == []
    # the entry was written with its variant; entries from before read as the plain one
    entries = {e["kernel"]: e for e in vlib.manifest["entries"]}
    assert (entries[VARIANT.name]["layout"], entries[VARIANT.name]["out"]) == ("nt", "f16")
    assert "out" not in entries[SMALL.name] and "batch" not in entries[SMALL.name]


def test_a_variant_call_launches_its_kernel_with_the_layouts_strides_and_the_bias(vlib, fake):
    m, n, k = VSHAPE
    A = Dev((m, k), 0x100000)
    B = Dev((k, n), 0x200000, strides=(1, k))  # W.t() of W (N x K) as nn.Linear keeps it
    C = Dev((m, n), 0x300000, "<f2")
    bias = Dev((n,), 0x400000, "<f2")
    assert vlib.gemm(A, B, C, bias=bias, activation="gelu", stream=5) is C
    name, grid, block, stream, args = fake.launches[-1]
    assert (name, stream, grid) == (VARIANT.name, 5, VARIANT.grid(m, n))
    # M N K alpha A lda sA B ldb sB beta C ldc sC bias: B's columns are K apart
    assert args == (m, n, k, 1.0, 0x100000, k, 0, 0x200000, k, 0, 0.0, 0x300000, n, 0,
                    0x400000)
    assert fake.measured == [] and fake.blas == []  # the exact entry decided
    # the same operands with another activation, or none: no kernel builds that variant
    vlib.gemm(A, B, C, bias=bias, activation="relu", stream=5)
    vlib.gemm(A, B, C, stream=5)
    assert len([x for x in fake.launches if x[0] == VARIANT.name]) == 1
    assert len(fake.blas) == 2


def test_without_a_kernel_cublas_computes_the_same_thing(vlib, fake, monkeypatch):
    """cuBLAS writes C itself where it can (fp32 C, or C of the inputs' type, no epilogue);
    else alpha A B in fp32 (in C, or in per-stream scratch for a 16-bit C) and gemm-tune's
    epilogue kernel finishes it: the bias, the activation, beta C and one rounding."""
    monkeypatch.setattr(driver, "scratch", lambda s=driver.Scratch(): s)
    m, n, k = 100, 70, 50
    A, B = Dev((m, k), 0x100000), Dev((k, n), 0x200000)
    C32, C16 = Dev((m, n), 0x300000), Dev((m, n), 0x380000, "<f2")
    bias32 = Dev((n,), 0x400000)
    vlib.gemm(A, B, C32, alpha=0.5, beta=2.0, bias=bias32, activation="silu", stream=7)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=1, strides=(0, 0, 0))
    assert fake.blas[-1][1:13] == (m, n, k, 0.5, 0x100000, k, 0x200000, n, 2.0, 0x300000, n, 7)
    name, grid, block, stream, args = fake.launches[-1]
    assert name == "gemm_tune_epilogue_of32_bias_silu" and stream == 7
    # M N batch W ldw sW beta C ldc sC bias: in place on C, beta already applied
    assert args == (m, n, 1, 0x300000, n, 0, 0.0, 0x300000, n, 0, 0x400000)
    # fp16 C of fp32 data: cuBLAS cannot write it; fp32 scratch, then beta C and one rounding
    vlib.gemm(A, B, C16, alpha=0.5, beta=2.0, bias=bias32, activation="gelu_tanh", stream=7)
    assert fake.blas_kw[-1]["out"] is DType.F32
    w = fake.blas[-1][10]
    assert w not in (0x300000, 0x380000) and fake.blas[-1][9] == 0.0
    name, grid, block, stream, args = fake.launches[-1]
    assert name == "gemm_tune_epilogue_of16_biasf32_gelu_tanh"
    assert args == (m, n, 1, w, n, m * n, 2.0, 0x380000, n, 0, 0x400000)
    assert fake.allocs[-1] >= m * n * 4
    # C of the inputs' type and no epilogue: cuBLAS alone
    launches = len(fake.launches)
    vlib.gemm(Dev((m, k), 0x100000, "<f2"), Dev((k, n), 0x200000, "<f2"), C16, stream=7)
    assert fake.blas_kw[-1]["out"] is DType.F16 and len(fake.launches) == launches


def test_batched_calls_launch_one_grid_row_per_problem(lib, fake, monkeypatch):
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    A = Dev((4, 100, 50), 0x100000)
    B = Dev((50, 70), 0x200000)  # one B for the whole batch
    C = Dev((4, 100, 70), 0x300000, strides=(7200, 70, 1))
    lib.gemm(A, B, C, alpha=0.5, stream=3)
    # measured on scratch laid out as the caller's, at both ends of M's bucket (65-128): the
    # batch strides grown with M (C's padding kept; both 16-byte multiples, as the caller's
    # are), a shared B
    lo, hi = fake.scratch_problems
    assert (lo.m, hi.m) == (65, 128) and lo.strides == (3252, 0, 4752)
    assert (hi.batch, hi.strides, hi.variant) == (4, (6400, 0, 9160), Variant())
    assert hi.geometry[:3] == (((4, 128, 50), (6400, 50, 1)), ((50, 70), (70, 1)),
                               ((4, 128, 70), (9160, 70, 1)))
    assert hi.spans() == (4 * 6400 * 4, 50 * 70 * 4, (3 * 9160 + 128 * 70) * 4, 0)
    name, grid, block, stream, args = fake.launches[-1]
    assert name == SMALL.name and grid == (SMALL.grid(100, 70)[0], 4, 1)
    assert args == (100, 70, 50, 0.5, 0x100000, 50, 5000, 0x200000, 70, 0, 0.0, 0x300000, 70,
                    7200, 0)
    # cuBLAS where it wins: strided batched, B's stride 0 (C's problems 400 elements apart
    # past their rows: they do not fold into one matrix)
    fake.times = {SMALL.name: 2.0, BIG.name: 2.0, "cublas": 1.0}
    lib.gemm(Dev((4, 200, 50), 0x100000), B, Dev((4, 200, 70), 0x300000, strides=(14400, 70, 1)),
             stream=3)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=4, strides=(10000, 0, 14400))
    keys = list(json.loads((lib.path / "dispatch.json").read_text())["decisions"])
    assert any("|65-128x70x50|batch 4|" in key for key in keys)
    assert any("|129-256x70x50|batch 4|" in key for key in keys)
    # A's and C's problems one after another: x @ W as torch.matmul runs it, one product of
    # the 800 rows (W read once), decided in 800's M-bucket
    lib.gemm(Dev((4, 200, 50), 0x100000), B, Dev((4, 200, 70), 0x300000), stream=3)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=1, strides=(0, 0, 0))
    assert fake.blas[-1][1:4] == (800, 70, 50) and fake.blas[-1][10:12] == (0x300000, 70)
    assert "800x70x50 f32 nn (M-bucket 769-896)" in lib.explain(
        Dev((4, 200, 50), 0x100000), B, Dev((4, 200, 70), 0x300000))
    # one row a problem, the problems 64 and 72 elements apart: they are the rows of one
    # matrix at those leading dimensions
    lib.gemm(Dev((4, 1, 50), 0x100000, strides=(64, 50, 1)), B,
             Dev((4, 1, 70), 0x300000, strides=(72, 70, 1)), stream=3)
    assert fake.blas_kw[-1]["batch"] == 1
    assert fake.blas[-1][1:4] == (4, 70, 50) and fake.blas[-1][6] == 64 \
        and fake.blas[-1][10:12] == (0x300000, 72)


def test_several_batch_dimensions_run_as_one_batch_or_one_product_of_rows(lib, fake,
                                                                            monkeypatch):
    """An A of 2 x 3 problems (attention's batch x heads): times one B, one product of all
    600 rows, as torch.matmul runs it; times B of the same batch dimensions (or of one
    problem), a strided batch of the 6 problems; C of those batch dimensions."""
    fake.times = {SMALL.name: 2.0, BIG.name: 2.0, "cublas": 1.0}
    A, C = Dev((2, 3, 100, 50), 0x100000), Dev((2, 3, 100, 70), 0x300000)
    lib.gemm(A, Dev((50, 70), 0x200000), C, stream=3)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=1, strides=(0, 0, 0))
    assert fake.blas[-1][1:4] == (600, 70, 50)
    lib.gemm(A, Dev((2, 3, 50, 70), 0x200000), C, stream=3)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=6, strides=(5000, 3500, 7000))
    assert fake.blas[-1][1:4] == (100, 70, 50)
    lib.gemm(A, Dev((1, 1, 50, 70), 0x200000), C, stream=3)
    assert fake.blas_kw[-1] == dict(out=DType.F32, batch=6, strides=(5000, 0, 7000))
    assert "batch 6" in lib.explain(A, Dev((2, 3, 50, 70), 0x200000), C)

    class Made(Dev):  # a C the call allocates (as a cupy array would be), reshaped after
        def reshape(self, shape):
            self.reshaped = tuple(shape)
            return self

    monkeypatch.setattr(call, "empty_like", lambda a, shape, dev, dtype: Made(shape, 0x400000))
    for B, rows in ((Dev((2, 3, 50, 70), 0x200000), 100), (Dev((50, 70), 0x200000), 600)):
        made = lib.gemm(A, B, stream=3)
        assert made.reshaped == (2, 3, 100, 70) and fake.blas[-1][1] == rows
    # an empty batch: C of the batch dimensions, nothing run
    launches, blas = len(fake.launches), len(fake.blas)
    made = lib.gemm(Dev((2, 0, 4, 5), 0x100000), Dev((5, 6), 0x200000))
    assert made.__cuda_array_interface__["shape"] == (2, 0, 4, 6)
    assert (len(fake.launches), len(fake.blas)) == (launches, blas)


def test_vectors_are_one_row_or_one_column_as_torch_matmul_takes_them(lib, fake):
    """A 1-D A is one row (1 x K), a 1-D B one column (K x N of 1), views of the caller's
    memory; C is of torch.matmul's shape (the vector's dimension dropped: N, M, or a 0-D
    dot product), given or allocated; a strided vector is a column-major row. A C of
    another rank is refused in one line, before any launch."""
    fake.times = {SMALL.name: 2.0, BIG.name: 2.0, "cublas": 1.0}
    lib.gemm(Dev((50,), 0x100000), Dev((50, 70), 0x200000), Dev((70,), 0x300000), stream=3)
    assert fake.blas[-1][1:4] == (1, 70, 50) and fake.blas_kw[-1]["batch"] == 1
    lib.gemm(Dev((100, 50), 0x100000), Dev((50,), 0x200000), Dev((100,), 0x300000), stream=3)
    assert fake.blas[-1][1:4] == (100, 1, 50)
    lib.gemm(Dev((50,), 0x100000), Dev((50,), 0x200000), Dev((), 0x300000), stream=3)
    assert fake.blas[-1][1:4] == (1, 1, 50)
    # a vector over a batch: B of 4 problems, A's one row shared by them
    lib.gemm(Dev((50,), 0x100000), Dev((4, 50, 70), 0x200000), Dev((4, 70), 0x300000),
             stream=3)
    assert fake.blas[-1][1:4] == (1, 70, 50) and fake.blas_kw[-1]["batch"] == 4
    strided = Dev((50,), 0x100000, strides=(3,))  # every third element: 1 x 50 by columns
    assert "f32 tn on sm_90" in lib.explain(strided, Dev((50, 70), 0x200000))
    launches, blas = len(fake.launches), len(fake.blas)
    v = Dev((50,), 0x100000)
    for args, msg in (((v, Dev((50, 70), 0x200000), Dev((1, 70), 0x300000)),
                       r"C is 1x70 \(2-D\); with A a vector, A @ B is 1-D"),
                      ((Dev((100, 50), 0x100000), v, Dev((100, 1), 0x300000)),
                       r"with B a vector, A @ B is 1-D"),
                      ((v, Dev((), 0x200000), Dev((), 0x300000)),
                       "B is 0-D: A and B have a dimension at least"),
                      ((3, v, None), "A must be a numpy array")):
        with pytest.raises(LibraryError, match=msg) as e:
            lib.gemm(*args)
        assert "\n" not in str(e.value)
    assert (len(fake.launches), len(fake.blas)) == (launches, blas)
    # numpy vectors with K = 0 (no GPU needed): C = beta C, or zeros of torch.matmul's shape
    a0, b0 = np.ones(0, np.float32), np.ones((0, 5), np.float32)
    assert lib.gemm(a0, b0).shape == (5,) and lib.gemm(a0, a0).shape == ()
    assert lib.gemm(np.ones((6, 0), np.float32), a0).shape == (6,)
    c = np.arange(5, dtype=np.float32)
    assert lib.gemm(a0, b0, c, beta=2.0) is c and np.array_equal(c, 2 * np.arange(5))


def test_plan_and_dispatch_keys_hold_the_variant_and_the_batch(lib, fake):
    base = dict(gpu_name="NVIDIA H200", driver=13000, cublas=130100, fingerprint="abc",
                dtype="f16", m=3, n=4, k=5, align=(16, 16, 16))
    plain = DispatchTable.key(layout=Variant(), **base)
    assert plain == DispatchTable.key(layout="nn", **base)  # as keys were before variants
    assert DispatchTable.key(layout=Layout.NT, **base) == DispatchTable.key(layout="nt", **base)
    keys = {plain, DispatchTable.key(layout=_variant("nt"), **base),
            DispatchTable.key(layout=_variant(out=DType.F16), **base),
            DispatchTable.key(layout=_variant(out=DType.F16, bias="out"), **base),
            DispatchTable.key(layout=_variant(out=DType.F16, bias="f32"), **base),
            DispatchTable.key(layout=_variant(out=DType.F16, act="gelu"), **base),
            DispatchTable.key(layout=Variant(), batch=8, **base)}
    assert len(keys) == 7
    assert "|nn|f16|out|gelu|" in DispatchTable.key(layout=_variant("nn", DType.F16, "out",
                                                                    "gelu"), **base)
    # one plan per variant and batch of the same operands
    fake.times = {"cublas": 0.1}
    A, B = Dev((100, 50), 0x100000), Dev((50, 70), 0x200000)
    C, bias = Dev((100, 70), 0x300000), Dev((70,), 0x400000)
    for act in (None, "relu", "relu", "gelu"):
        lib.gemm(A, B, C, activation=act)
    lib.gemm(A, B, C, bias=bias)
    lib.gemm(A, B, Dev((100, 70), 0x300000, "<f2"))
    lib.gemm(Dev((3, 100, 50), 0x100000), Dev((3, 50, 70), 0x200000),
             Dev((3, 100, 70), 0x300000))
    assert len(lib.plans) == 6
    assert sorted((p.problem.variant.key, p.problem.batch) for p in lib.plans.values()) == [
        ("nn|f16|none|none", 1), ("nn|f32|none|gelu", 1), ("nn|f32|none|none", 1),
        ("nn|f32|none|none", 3), ("nn|f32|none|relu", 1), ("nn|f32|out|none", 1)]


def test_record_lines_name_the_variant_and_the_batch(vlib, fake, tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "scratch", lambda s=driver.Scratch(): s)
    fake.times = {"cublas": 0.25, VARIANT.name: 0.1}
    path = tmp_path / "problems.jsonl"
    m, n, k = 300, 128, 64
    A, B = Dev((m, k), 0x100000), Dev((k, n), 0x200000, strides=(1, k))
    C, bias = Dev((m, n), 0x300000, "<f2"), Dev((n,), 0x400000, "<f2")
    with vlib.record(path):
        for _ in range(3):
            vlib.gemm(A, B, C, bias=bias, activation="gelu")
        vlib.gemm(Dev((2, m, k), 0x100000), Dev((2, k, n), 0x200000, strides=(k * n, 1, k)),
                  Dev((2, m, n), 0x300000), bias=Dev((n,), 0x4000), activation="silu")
        vlib.gemm(Dev(VSHAPE[::2], 0x100000), Dev(VSHAPE[:0:-1], 0x200000, strides=(1, 64)),
                  Dev(VSHAPE[:2], 0x300000, "<f2"), bias=bias, activation="gelu")  # exact
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()),
                  key=lambda r: r["batch"])
    assert [(r["layout"], r["out"], r["epilogue"], r["bias"], r["act"], r["batch"], r["calls"])
            for r in rows] == [("nt", "f16", "bias+gelu", "out", "gelu", 1, 3),
                               ("nt", "f32", "bias+silu", "out", "silu", 2, 1)]
    assert rows[0]["rule"] == "measured" and rows[0]["runs"] == VARIANT.name
    assert rows[1]["rule"] == "cublas"


def test_decide_takes_the_torch_route_only_where_torch_sees_a_gpu(monkeypatch):
    """A CPU-only torch (or one whose driver finds no GPU) cannot make a torch caller's
    tensors: decide() then measures through gemm-tune's own route; no torch at all, the
    same."""
    import sys
    import types

    from tuner.runtime.library import _torch_sees_a_gpu

    for available in (False, True):
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda a=available: a))
        monkeypatch.setitem(sys.modules, "torch", fake)
        assert _torch_sees_a_gpu() is available
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert _torch_sees_a_gpu() is False


@pytest.mark.parametrize("where", ["below a file", "a folder"])
def test_a_record_file_that_cannot_be_appended_to_is_refused_when_recording_starts(
        tmp_path, monkeypatch, capsys, where):
    """GEMM_TUNE_RECORD (or lib.record) naming a file below a plain file, or a folder, is a
    one-line LibraryError when the recorder is made, not a traceback at the program's exit
    with its records lost. A record file that goes away later is a one-line warning."""
    from tuner.runtime import record
    from tuner.runtime.errors import LibraryError

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = blocker / "r.jsonl" if where == "below a file" else tmp_path
    monkeypatch.setenv(record.ENV, str(path))
    with pytest.raises(LibraryError, match=f"GEMM_TUNE_RECORD={path}: cannot append to it"):
        record.Recorder.from_env()
    with pytest.raises(LibraryError, match="cannot append to it"):
        record.Recorder(path)

    ok = tmp_path / "sub" / "r.jsonl"
    rec = record.Recorder(ok)  # its folder made, the file not yet written
    assert ok.parent.is_dir() and not ok.exists()
    rec.tally(dict(dtype="f32", m=1, n=1, k=1))[0] += 1
    ok.parent.rename(tmp_path / "moved")
    (tmp_path / "sub").write_text("now a file")
    rec._flush_at_exit()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the records were not written" in err


@pytest.mark.parametrize("name", ["GEMM_TUNE_MEASURE", "GEMM_TUNE_FAST"])
def test_on_off_variables_take_their_spellings_and_refuse_others(monkeypatch, name):
    """1/yes/on/true and 0/no/off/false in any case, unset or empty the default; a typo
    ("flase", "maybe") is a one-line LibraryError naming the variable when a library
    loads, not measuring left on in one rank of a job."""
    from pathlib import Path

    from tuner.runtime import fast
    from tuner.runtime.errors import env_flag

    for text, on in (("1", True), ("Yes", True), ("ON", True), ("true", True), ("0", False),
                     ("no", False), ("Off", False), ("FALSE", False), (" 0 ", False)):
        monkeypatch.setenv(name, text)
        assert env_flag(name) is on
    monkeypatch.setenv(name, "")
    assert env_flag(name) is True and env_flag(name, default=False) is False
    monkeypatch.setenv(name, "off")
    committed = Path(__file__).resolve().parent.parent / "artifacts" / "library"
    lib = load_library(committed)
    if name == "GEMM_TUNE_MEASURE":
        assert lib.measure is False
    else:
        assert fast.status() == "off (GEMM_TUNE_FAST=off)"
    monkeypatch.setenv(name, "flase")
    with pytest.raises(LibraryError, match=f"{name}='flase': expected 0 or 1"):
        load_library(committed)


def test_alpha_and_beta_must_be_real_numbers():
    """A string, None or a bool (a flag passed in alpha's place: lib.gemm(A, B, C, True))
    in alpha or beta is a one-line LibraryError before anything runs, in gemm and
    gemm_batch; ints, floats and numpy scalars pass on (here to the missing GPU)."""
    from pathlib import Path

    from tuner.runtime.errors import NoGPUError

    lib = load_library(Path(__file__).resolve().parent.parent / "artifacts" / "library")
    a, b = np.ones((4, 5), np.float32), np.ones((5, 7), np.float32)
    for kw, msg in ((dict(alpha="x"), "alpha must be a real number (got str 'x')"),
                    (dict(beta=None), "beta must be a real number (got NoneType None)"),
                    (dict(alpha=True), "alpha must be a real number (got bool True)")):
        with pytest.raises(LibraryError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            lib.gemm(a, b, **kw)
        with pytest.raises(LibraryError, match="must be a real number"):
            lib.gemm_batch([(a, b)], **kw)
    for kw in (dict(alpha=2), dict(alpha=np.float32(0.5)), dict(beta=np.int64(0))):
        try:
            lib.gemm(a, b, **kw)
        except NoGPUError:
            pass  # past the check (CI has no GPU)


def test_empty_outputs_run_nothing(lib, fake):
    """M, N or the batch 0 (a mixture-of-experts layer with no tokens for an expert, say):
    nothing to multiply, as torch.matmul and BLAS take it: C returned as given, or
    allocated with no elements; no launch, no cuBLAS call, no first-use measurement; and
    explain() says so."""
    B = Dev((50, 70), 0x200000)
    for A, B_, C in ((Dev((0, 50), 0x100000), B, Dev((0, 70), 0x300000)),
                     (Dev((100, 50), 0x100000), Dev((50, 0), 0), Dev((100, 0), 0)),
                     (Dev((0, 100, 50), 0x100000), B, Dev((0, 100, 70), 0x300000))):
        assert lib.gemm(A, B_, C, alpha=2.0, beta=3.0, stream=7) is C
    out = lib.gemm(np.ones((0, 50), np.float32), np.ones((50, 70), np.float32))
    assert isinstance(out, np.ndarray) and out.shape == (0, 70) and out.dtype == np.float32
    assert not fake.launches and not fake.blas and not fake.measured and not fake.memsets
    assert lib.explain(Dev((0, 50), 0x100000), B) == (
        "an empty problem (1 x 0 x 70 x 50, batch x M x N x K): no kernel and no cuBLAS "
        "call; C has no elements")
    with pytest.raises(LibraryError, match="A is 0x40 and B is 50x70"):
        lib.gemm(Dev((0, 40), 0x100000), B)  # shapes are still checked
    assert lib.explain(64, 64, 0, "fp16", bias="f32", activation="silu") == (
        "an empty problem (1 x 64 x 64 x 0, batch x M x N x K): no kernel and no cuBLAS "
        "call; A B has no terms: C = silu(beta * C + bias)")
    with pytest.raises(LibraryError, match=r"^explain: no size may be negative \(m = -1\)$"):
        lib.explain(-1, 4, 4)


@pytest.mark.parametrize("args,kw,said", [
    ((16, 16), {}, "explain: missing a required argument: 'k'"),
    ((16, 16, "16"), {}, "explain: k must be a whole number .got str '16'."),
    ((True, 16, 16), {}, "explain: m must be a whole number .got bool True."),
    ((16, 16, 16), dict(batch=2.5), "explain: batch must be a whole number"),
    ((16, 16, 16), dict(layout="xx"), "explain: layout 'xx' is not one of nn, nt, tn, tt"),
    ((16, 16, 16), dict(bias="yes"), "explain: bias 'yes' is not one of none, out, f32"),
    ((16, 16, 16), dict(activation="tanh"), "activation 'tanh' is not one of none, relu"),
    ((16, 16, 16), dict(ld=16), r"explain: ld must be three whole numbers for A, B and C"),
    ((16, 16, 16), dict(align=(3, 3, 3)), "explain: align must be three whole numbers .* "
                                          "among 1, 2, 4, 8 and 16"),
    ((16, 16, 16), dict(route="foo"), "explain: route 'foo' is not \"torch\" or"),
    ((16, 16, 16), dict(gpu=0), "explain: gpu must name a GPU model"),
    ((16, 16, 16), dict(device="0"), "explain: device must be a GPU's index"),
    ((16, 16, 16, "int8"), {}, "unknown dtype 'int8'"),
    ((16, 16, 16), dict(colour="red"), "explain: got an unexpected keyword argument 'colour'"),
])
def test_explain_by_shape_refuses_what_gemm_would_in_one_line(lib, fake, args, kw, said):
    """explain(m, n, k, ...) takes its arguments as gemm takes a call's: anything else is
    one line naming it, before any GPU or table is asked (it had raised TypeError,
    KeyError or AttributeError from inside, or answered for an activation gemm refuses)."""
    with pytest.raises(UsageError, match=said) as e:
        lib.explain(*args, **kw)
    assert "\n" not in str(e.value)


def test_k_zero_is_the_epilogue_on_a_zero_product(lib, fake, monkeypatch):
    """K = 0: A B has no terms, so C = act(beta C + bias): on device arrays gemm-tune's
    epilogue kernel on a zeroed fp32 product (the one rounding to C's type, the bias and
    the activation as every epilogue applies them), on C's stream, and no cuBLAS call."""
    monkeypatch.setattr(driver, "scratch", lambda s=driver.Scratch(): s)
    m, n = 100, 70
    A, B = Dev((m, 0), 0x100000, "<f2"), Dev((0, n), 0x200000, "<f2")
    C, bias = Dev((m, n), 0x300000, "<f2"), Dev((n,), 0x400000)
    assert lib.gemm(A, B, C, alpha=3.0, beta=2.0, bias=bias, activation="gelu", stream=7) is C
    assert not fake.blas and not fake.measured
    name, grid, block, stream, args = fake.launches[-1]
    assert name == "gemm_tune_epilogue_of16_biasf32_gelu" and stream == 7
    w = args[3]  # M N batch W ldw sW beta C ldc sC bias
    assert args == (m, n, 1, w, n, m * n, 2.0, 0x300000, n, 0, 0x400000)
    assert fake.memsets == [(w, 0, m * n, 7)]  # zeroed as made, never written after
    lib.gemm(A, B, C, beta=0.0, stream=7)
    assert fake.memsets == [(w, 0, m * n, 7)] and fake.launches[-1][4][3] == w
    assert "A B has no terms: C = gelu(beta * C + bias)" in lib.explain(A, B, C, bias=bias,
                                                                      activation="gelu")


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu"])
def test_host_activations_keep_their_relative_precision_where_they_are_tiny(act):
    """The host's activations (a numpy call with K = 0) in float32, against float64 over
    [-8, 8]: within 2e-5 relative everywhere, the negative tail included, as the GPU
    epilogue's forms are (erfc; x sigmoid(2 z) for GELU's tanh form): x/2 (1 + tanh(z))
    in float32 kept a thousandth of its bits near x = -4."""
    import math

    ref_act = {"gelu": lambda x: 0.5 * x * math.erfc(-x / math.sqrt(2)),
               "gelu_tanh": lambda x: x / (1 + math.exp(-2 * math.sqrt(2 / math.pi) * (
                   x + 0.044715 * x ** 3))),
               "silu": lambda x: x / (1 + math.exp(-x))}[act]
    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    ref = np.vectorize(ref_act)(x.astype(np.float64))
    got = call._numpy_activation(x, act)
    assert got.dtype == np.float32
    assert np.allclose(got, ref, rtol=2e-5, atol=1e-35), float(
        np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-35)))


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_k_zero_on_numpy_is_beta_c_then_the_activation(act, lib):
    """numpy operands with K = 0 need no GPU: C = act(beta C) on the host (C NaN where beta
    is 0 stays unread), against a float64 reference; C allocated is act(0)."""
    import math

    ref_act = {"none": lambda x: x, "relu": lambda x: max(x, 0.0),
               "gelu": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
               "gelu_tanh": lambda x: 0.5 * x * (1 + math.tanh(
                   math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
               "silu": lambda x: x / (1 + math.exp(-x))}[act]
    rng = np.random.default_rng()
    A, B = np.ones((6, 0), np.float32), np.ones((0, 5), np.float32)
    C = rng.standard_normal((6, 5)).astype(np.float32)
    ref = np.vectorize(ref_act)(-1.5 * C.astype(np.float64))
    out = lib.gemm(A, B, C, beta=-1.5, activation=None if act == "none" else act)
    assert out is C and np.allclose(C, ref, rtol=1e-6, atol=1e-7), (C, ref)
    poisoned = np.full((6, 5), np.nan, np.float32)
    lib.gemm(A, B, poisoned, beta=0.0, activation=None if act == "none" else act)
    assert np.array_equal(poisoned, np.zeros((6, 5), np.float32))
    fresh = lib.gemm(A, B)
    assert fresh.shape == (6, 5) and np.array_equal(fresh, np.zeros((6, 5), np.float32))
    out, empty = lib.gemm_batch([(A, B), (np.ones((0, 3), np.float32), np.ones((3, 4),
                                                                              np.float32))])
    assert np.array_equal(out, np.zeros((6, 5), np.float32)) and empty.shape == (0, 4)


def test_a_static_b_calls_first_use_is_its_own_decision(tmp_path, compile_cache, fake):
    """A first use under the promise of a constant B times each candidate as it would run,
    a decode kernel as its static-B twin: its decision is kept apart from the same case's
    without the promise (its dispatch key says "static B"), and each call measures once."""
    from _library import entry
    from codegen import compile_config
    from codegen.families.decode import DEFAULT_DECODE
    from tuner.runtime.manifest import static_b_twin
    from tuner.tune import _static_b_twins

    art = tmp_path / "art"
    lib = build(tmp_path / "library", compile_cache, art)
    dec = dataclasses.replace(DEFAULT_DECODE, dtype=DType.F16, out=DType.F16)
    twin = static_b_twin(dec.name)
    res = compile_config(dec, "sm_90", compile_cache, art)
    shape = (16, 4096, 4096)  # 1.05x cuBLAS where tuned: measured on first use
    lib.add(entry(dec, res, shape, 21.0, 20.0, dtype="f16"), art / "sm_90" / f"{dec.name}.cu",
            res.cubin, twins=_static_b_twins(dec.name, "sm_90", art))
    lib = load_library(tmp_path / "library")
    fake.times = {dec.name: 0.5, "cublas": 1.0}
    m, n, k = shape
    A, B = Dev((m, k), 0x100000, "<f2"), Dev((k, n), 0x200000, "<f2")
    C = Dev((m, n), 0x300000, "<f2")
    for static_b, runs in ((True, twin), (False, dec.name), (True, twin), (False, dec.name)):
        lib.gemm(A, B, C, stream=5, static_b=static_b)
        assert fake.launches[-1][0] == runs
    # measured once each, at the entry's own M, the first on a problem whose plans run twins
    assert [(p.m, p.static_b) for p in fake.scratch_problems] == [(16, True), (16, False)]
    keys = list(json.loads((lib.path / "dispatch.json").read_text())["decisions"])
    assert len(keys) == 2 and sum(key.endswith("|static B") for key in keys) == 1
    assert "B constant (static_b)" in lib.explain(A, B, C, stream=5, static_b=True)
    assert "static_b" not in lib.explain(A, B, C, stream=5).splitlines()[0]


def test_a_static_b_call_runs_the_decode_entrys_twin_which_the_library_keeps(
        tmp_path, compile_cache, fake, monkeypatch):
    """A decode entry is stored with its twin for a constant B (the tuner compiles it:
    tune._static_b_twins); a call that promises a constant B (static_b) launches the twin,
    one that does not the entry's own kernel, each under a plan of its own; a kernel with no
    twin runs itself either way. Replacing the entry's kernel keeps the replaced kernel
    (manifest's replaced) and its twin; a second replacement drops both."""
    from _library import entry
    from codegen import compile_config
    from codegen.families.decode import DEFAULT_DECODE
    from tuner.runtime.manifest import static_b_twin
    from tuner.tune import _static_b_twins

    art = tmp_path / "art"
    lib = build(tmp_path / "library", compile_cache, art)
    dec = dataclasses.replace(DEFAULT_DECODE, dtype=DType.F16, out=DType.F16)
    twin = static_b_twin(dec.name)
    assert twin == dataclasses.replace(dec, prefetch_b=1).name and twin.endswith("_a3_pb_of16")
    assert static_b_twin(twin) is None and static_b_twin(SMALL.name) is None
    res = compile_config(dec, "sm_90", compile_cache, art)
    assert res.ok, res.log[-2000:]
    twins = _static_b_twins(dec.name, "sm_90", art)
    assert [t[0] for t in twins] == [twin] and all(p.is_file() for p in twins[0][1:3])
    shape = (16, 4096, 4096)
    lib.add(entry(dec, res, shape, 30.0, 20.0, dtype="f16"), art / "sm_90" / f"{dec.name}.cu",
            res.cubin, twins=twins)
    lib = load_library(tmp_path / "library")
    assert f"sm_90/{twin}" in lib.manifest["kernels"]
    m, n, k = shape
    A, B = Dev((m, k), 0x100000, "<f2"), Dev((k, n), 0x200000, "<f2")
    C = Dev((m, n), 0x300000, "<f2")
    for static_b, runs in ((False, dec.name), (True, twin), (False, dec.name)):
        lib.gemm(A, B, C, stream=5, static_b=static_b)
        assert fake.launches[-1][0] == runs and fake.launches[-1][3] == 5
    assert fake.measured == [] and fake.blas == []  # the exact entry decided each
    said = lib.explain(A, B, C, gpu="H200", static_b=True).splitlines()
    assert said[0].startswith(f"{dec.name} (exact, for NVIDIA H200 without a GPU here)")
    assert said[1] == f"static_b: {dec.name} runs as its twin {twin} (it loads B before the " \
        "work ahead of the call has finished)"
    assert len(lib.explain(A, B, C, gpu="H200").splitlines()) == 1
    # the decode entry re-tuned to another kernel (stored without a twin), then to a third:
    # the first kernel and its twin stay as replaced, then leave, and the entry's kernel
    # runs itself with or without the promise
    for stages in (4, 5):
        other = dataclasses.replace(dec, stages=stages)
        res2 = compile_config(other, "sm_90", compile_cache, art)
        lib.add(entry(other, res2, shape, 31.0 + stages, 20.0, dtype="f16"),
                art / "sm_90" / f"{other.name}.cu", res2.cubin)
        lib = load_library(tmp_path / "library")
        kernels = lib.manifest["kernels"]
        assert f"sm_90/{other.name}" in kernels
        kept = stages == 4
        assert (f"sm_90/{dec.name}" in kernels) == kept == (f"sm_90/{twin}" in kernels)
        assert bool(list((tmp_path / "library" / "kernels" / "sm_90").glob(f"{twin}.*"))) \
            == kept
    for static_b in (True, False):
        lib.gemm(A, B, C, stream=5, static_b=static_b)
        assert fake.launches[-1][0] == other.name
    assert lib.explain(A, B, C, gpu="H200", static_b=True).splitlines()[1] == \
        "static_b: no kernel named above has a static-B twin here: each runs itself"
