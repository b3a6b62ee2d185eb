"""GPU: the run path as real callers use it: a side stream, CUDA-graph capture, threads,
torch.compile, cupy's streams, and a shape first seen during capture.

The library here holds exact entries that force each path: a kernel (ratio 2 where
tuned), a split-K kernel with its workspace and reduce pass, and a shape whose kernel
lost to cuBLAS (cuBLAS runs: through torch.addmm on torch's current stream, or through
gemm-tune's own binding when the call names its stream). Measuring is off here, so the
recorded figures decide, except where a test turns it on. Every check is against a
float64 product of fresh random inputs, with outputs poisoned first.
"""

import dataclasses
import threading

import numpy as np
import pytest

from _library import BIG, SMALL, entry

pytestmark = pytest.mark.gpu

SPLIT_SHAPE = (128, 128, 4096)
KERNEL_SHAPE = (512, 512, 512)
CUBLAS_SHAPE = (1024, 1024, 1024)
SHAPES = [KERNEL_SHAPE, SPLIT_SHAPE, CUBLAS_SHAPE]


@pytest.fixture(scope="module")
def lib(tmp_path_factory, compile_cache):
    import os

    import torch

    os.environ["GEMM_TUNE_MEASURE"] = "0"
    from codegen import KernelConfig, compile_config
    from tuner.runtime.library import Library, load_library

    split = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=3, split=16)
    gpu = torch.cuda.get_device_name()
    d = tmp_path_factory.mktemp("rt")
    lib = Library.create_or_open(d / "library")
    for cfg, shape, ratio in ((SMALL, KERNEL_SHAPE, 2.0), (split, SPLIT_SHAPE, 2.0),
                              (BIG, CUBLAS_SHAPE, 0.5)):
        res = compile_config(cfg, "sm_90", compile_cache, d / "art")
        assert res.ok, res.error
        cu = d / "art" / "sm_90" / f"{cfg.name}.cu"
        lib.add(entry(cfg, res, shape, 10.0 * ratio, 10.0, gpu=gpu), cu, res.cubin)
    lib = load_library(d / "library")
    assert lib.explain(*KERNEL_SHAPE, "fp32").startswith(SMALL.name)
    assert lib.explain(*SPLIT_SHAPE, "fp32").startswith(split.name)
    assert lib.explain(*CUBLAS_SHAPE, "fp32").startswith("cuBLAS (exact)")
    yield lib
    del os.environ["GEMM_TUNE_MEASURE"]


def _err(c, a, b, alpha=1.0, beta=0.0, c0=None):
    ref = alpha * (a.double() @ b.double())
    if c0 is not None:
        ref += beta * c0.double()
    return ((c.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("named", [False, True], ids=["current", "named"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_side_stream_producer_and_consumer(lib, shape, named):
    """A and B made on a side stream, gemm called there (torch's current stream, or named
    with stream=), the result read there: the kernel must run on that stream, after the
    producer and before the consumer."""
    import torch

    m, n, k = shape
    s = torch.cuda.Stream()
    for _ in range(5):
        with torch.cuda.stream(s):
            big = torch.randn(4096, 4096, device="cuda")  # keeps the side stream busy
            big = big @ big
            a = torch.randn(m, k, device="cuda") + big[:1, :1]
            b = torch.randn(k, n, device="cuda")
            c = torch.full((m, n), float("nan"), device="cuda")
        if named:
            lib.gemm(a, b, c, stream=s)
        else:
            with torch.cuda.stream(s):
                lib.gemm(a, b, c)
        with torch.cuda.stream(s):
            err = _err(c, a, b)  # computed on s
        s.synchronize()
        assert err <= 1e-5, (shape, err)


@pytest.mark.parametrize("named", [False, True], ids=["current", "named"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_graph_capture_and_replay(lib, shape, named):
    import torch

    m, n, k = shape
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.randn(m, n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as torch's docs ask
        lib.gemm(a, b, c, alpha=0.5, beta=2.0, stream=s if named else None)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cur = torch.cuda.current_stream()
        lib.gemm(a, b, c, alpha=0.5, beta=2.0, stream=cur if named else None)
    for _ in range(3):  # new values in the same buffers; replay
        a.copy_(torch.randn(m, k, device="cuda"))
        b.copy_(torch.randn(k, n, device="cuda"))
        c0 = torch.randn(m, n, device="cuda")
        c.copy_(c0)
        g.replay()
        torch.cuda.synchronize()
        err = _err(c, a, b, 0.5, 2.0, c0)
        assert err <= 1e-5, (shape, err)


def test_four_threads_at_once(lib):
    import torch

    errors, failures = [], []

    def worker(seed):
        try:
            torch.cuda.set_device(0)
            s = torch.cuda.Stream()
            gen = torch.Generator(device="cuda").manual_seed(seed)
            with torch.cuda.stream(s):
                for i in range(12):
                    m, n, k = SHAPES[(seed + i) % len(SHAPES)]
                    a = torch.randn(m, k, device="cuda", generator=gen)
                    b = torch.randn(k, n, device="cuda", generator=gen)
                    c = lib.gemm(a, b)
                    errors.append(_err(c, a, b))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(errors) == 48 and max(errors) <= 1e-5, max(errors)


def test_a_fresh_thread_with_no_context(lib):
    """A thread that never touched CUDA (no current context) can call the library."""
    import torch

    a, b = torch.randn(*KERNEL_SHAPE[::2], device="cuda"), torch.randn(512, 512, device="cuda")
    torch.cuda.synchronize()
    out = {}
    t = threading.Thread(target=lambda: out.update(c=lib.gemm(a, b)))
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert _err(out["c"], a, b) <= 1e-5


def test_torch_compile_fullgraph(lib):
    import torch

    from tuner.runtime.torch_ops import gemm, library_key

    name = library_key(lib)

    def f(x, w, bias):
        return torch.relu(gemm(x, w, bias, alpha=1.0, beta=1.0, library=name))

    compiled = torch.compile(f, fullgraph=True)
    for m, n, k in SHAPES:
        x, w = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        bias = torch.randn(m, n, device="cuda")
        got = compiled(x, w, bias)
        ref = torch.relu(x.double() @ w.double() + bias.double())
        assert ((got.double() - ref).norm() / ref.norm()).item() <= 1e-5
    # and the op replays inside a CUDA graph
    x, w = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    bias = torch.zeros(512, 512, device="cuda")
    f(x, w, bias)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = f(x, w, bias)
    x.copy_(torch.randn(512, 512, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    ref = torch.relu(x.double() @ w.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() <= 1e-5


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cupy_on_a_non_default_stream(lib, shape):
    import cupy

    m, n, k = shape
    with cupy.cuda.Stream(non_blocking=True) as s:
        big = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
        big = big @ big
        a = cupy.random.standard_normal((m, k), dtype=cupy.float32) + big[0, 0] * 0
        b = cupy.random.standard_normal((k, n), dtype=cupy.float32)
        c = cupy.full((m, n), cupy.nan, dtype=cupy.float32)
        lib.gemm(a, b, c)
        ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
        err = float(cupy.linalg.norm(c - ref) / cupy.linalg.norm(ref))
        s.synchronize()
    assert err <= 1e-5, err


def test_a_shape_first_seen_during_capture(lib):
    """No exact entry and no measurement yet: the capture takes the estimate rule's pick,
    measures nothing, and replays correctly; outside capture the shape is measured."""
    import torch

    m, n, k = 300, 200, 100
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lib.gemm(a, b, c, measure=True)
    assert "a first call will measure" in lib.explain(m, n, k, "fp32")
    g.replay()
    torch.cuda.synchronize()
    assert _err(c, a, b) <= 1e-5
    c.fill_(float("nan"))
    lib.gemm(a, b, c, measure=True)
    torch.cuda.synchronize()
    assert "(measured, torch callers)" in lib.explain(m, n, k, "fp32")
    assert _err(c, a, b) <= 1e-5


def test_numpy_in_and_out(lib):
    rng = np.random.default_rng()
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c0 = rng.standard_normal((m, n), dtype=np.float32)
        c = c0.copy()
        lib.gemm(a, b, c, alpha=0.5, beta=2.0)
        ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + 2.0 * c0
        assert np.linalg.norm(c - ref) / np.linalg.norm(ref) <= 1e-5


def test_a_repeated_call_makes_no_new_plan(lib):
    """The decision is made once per key (bench/library_vs_cublas.py times the call)."""
    import torch

    a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    c = torch.empty(512, 512, device="cuda")
    lib.gemm(a, b, c)
    lib.gemm(a, b)
    plans = len(lib.plans)
    for _ in range(20):
        lib.gemm(a, b, c)
        lib.gemm(a, b)
    assert len(lib.plans) == plans


@pytest.mark.parametrize("shape", [KERNEL_SHAPE, (1000, 333, 257), (4097, 129, 65), (300, 1, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_host_pipeline_is_exact_to_the_plain_path(lib, shape, monkeypatch):
    """numpy in and out: the pipelined path (chunks of rows over three streams, pinned
    staging, B copied up in slices: a few rows each here) gives the bits of
    copy-compute-copy where a tuned kernel runs."""
    from tuner.runtime import host

    monkeypatch.setattr(host, "B_SLICE_BYTES", 4096)
    m, n, k = shape
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c0 = rng.standard_normal((m, n), dtype=np.float32)
    piped, plain = c0.copy(), c0.copy()
    lib.gemm(a, b, piped, alpha=0.5, beta=2.0)
    lib.gemm(a, b, plain, alpha=0.5, beta=2.0, pipeline=False)
    ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + 2.0 * c0
    assert np.linalg.norm(piped - ref) / np.linalg.norm(ref) <= 1e-5
    if not lib.explain(m, n, k, "fp32").startswith("cuBLAS"):
        assert np.array_equal(piped, plain)


@pytest.mark.parametrize("shape", [KERNEL_SHAPE, (1000, 333, 257), (4097, 129, 1000),
                                   SPLIT_SHAPE], ids=lambda s: "x".join(map(str, s)))
def test_host_pipeline_first_block_is_summed_over_k_slices(lib, shape, monkeypatch):
    """numpy in and out with a B over the block's threshold (lowered here): the first half
    of the rows is summed over K-slices as B goes up (beta 0 on the first slice, C
    poisoned with NaN first), the rest in row chunks; within the fp32 gate of float64."""
    from tuner.runtime import host

    monkeypatch.setattr(host, "BLOCK_MIN_B_BYTES", 1 << 14)
    monkeypatch.setattr(host, "BLOCK_STEP_BYTES", 1 << 18)
    monkeypatch.setattr(host, "ROW_GRAIN", 64)
    m, n, k = shape
    block = host.plan_block(m, n, k, 4)
    assert block is not None and len(block[1]) >= 2
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    for _ in range(2):  # the second time on the buffers the first left
        c = np.full((m, n), np.nan, np.float32)
        lib.gemm(a, b, c, alpha=0.5)
        ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64))
        assert np.linalg.norm(c - ref) / np.linalg.norm(ref) <= 1e-5


def test_pinned_buffers_are_reused(lib):
    from tuner.runtime import host

    rng = np.random.default_rng()
    a = rng.standard_normal((2048, 256), dtype=np.float32)
    b = rng.standard_normal((256, 128), dtype=np.float32)
    lib.gemm(a, b)
    held = dict(host.pinned()._bufs)
    for _ in range(3):
        c = lib.gemm(a, b)
    assert host.pinned()._bufs == held  # the same page-locked buffers, not new ones
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) <= 1e-5


def test_batch_of_host_pairs(lib):
    rng = np.random.default_rng()
    shapes = [KERNEL_SHAPE, (17, 33, 9), (1000, 200, 300), SPLIT_SHAPE, (1, 1, 1)]
    pairs = [(rng.standard_normal((m, k), dtype=np.float32),
              rng.standard_normal((k, n), dtype=np.float32)) for m, n, k in shapes]
    outs = lib.gemm_batch(pairs)
    for (a, b), c in zip(pairs, outs):
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert c.shape == ref.shape and np.linalg.norm(c - ref) / np.linalg.norm(ref) <= 1e-5


def test_library_runs_wgmma_and_3xtf32_kernels(tmp_path, compile_cache):
    """The run path launches the TMA family: fp16 through tensor maps, fp32 data at fp32
    accuracy through 3xTF32 (allow_3xtf32), and sends operands TMA cannot take elsewhere."""
    import dataclasses

    import torch

    from codegen import compile_config
    from codegen.config import DType
    from codegen.families.wgmma import _default
    from tuner.runtime.library import Library, load_library

    gpu = torch.cuda.get_device_name()
    half = dataclasses.replace(_default(DType.F16), bm=128, bn=128, consumers=1, pingpong=0)
    t3 = _default(DType.F32)
    lib = Library.create_or_open(tmp_path / "lib")
    shapes = [(512, 512, 512), (1, 8, 8), (127, 136, 264)]
    for cfg, dtype in ((half, "f16"), (t3, "f32x3")):
        res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
        assert res.ok, res.log[-2000:]
        for shape in shapes:  # recorded faster than cuBLAS: the exact rule runs the kernel
            lib.add(entry(cfg, res, shape, 900.0, 700.0, dtype=dtype, gpu=gpu),
                    tmp_path / "art" / "sm_90a" / f"{cfg.name}.cu", res.cubin)
    lib = load_library(tmp_path / "lib")
    for m, n, k in shapes:
        # these entries write fp32 C (an fp16 call with no C would ask for fp16 C)
        assert lib.explain(m, n, k, "fp16", out_dtype="fp32").startswith(half.name)
        assert lib.explain(m, n, k, "f32x3").startswith(t3.name)
        a16, b16 = (torch.randn(m, k, device="cuda").half(), torch.randn(k, n, device="cuda").half())
        c0 = torch.randn(m, n, device="cuda")
        assert lib.explain(a16, b16, c0).startswith(half.name)  # exactly this call
        c = c0.clone()
        lib.gemm(a16, b16, c, alpha=0.5, beta=2.0)
        assert _err(c, a16, b16, 0.5, 2.0, c0) <= 2e-5
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        c = torch.full((m, n), float("nan"), device="cuda")
        lib.gemm(a, b, c, allow_3xtf32=True)
        assert _err(c, a, b) <= 1e-5
    # A with rows of 513 halves (1026 bytes): not TMA's; another route, still right
    a16 = torch.randn(512, 513, device="cuda").half()[:, :512]
    b16 = torch.randn(512, 512, device="cuda").half()
    c = lib.gemm(a16, b16, out_dtype=torch.float32)  # fp16 C would be the default
    assert _err(c, a16, b16) <= 2e-5


def test_library_runs_the_tf32_pre_pass_kernel_on_any_leading_dimension(tmp_path, compile_cache):
    """A tf32 entry with the pre-pass (allow_tf32): through the library (the exact rule) its
    two launches on the caller's stream, right against float64 of the tf32-rounded inputs;
    and its runner on rows TMA could not read (k + 1 floats), which the dispatch may give
    to cuBLAS TF32 at small shapes (cuBLAS rounds otherwise: 1.7e-4 from this reference at
    1x8x8), so that path is run through the runner itself."""
    import torch

    from codegen import compile_config
    from codegen.config import DType
    from codegen.families.wgmma import _default
    from tuner.bench import round_to
    from tuner.runtime import driver
    from tuner.runtime.library import Library, load_library
    from tuner.runtime.runners import TmaRunner, runner_for

    gpu = torch.cuda.get_device_name()
    # the pre-pass (the default is prep 3 with its register rows in pairs, which prep 1 lacks)
    cfg = dataclasses.replace(_default(DType.TF32), prep=1, rs_pairs=0)
    assert cfg.prep
    lib = Library.create_or_open(tmp_path / "lib")
    res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
    assert res.ok, res.log[-2000:]
    shapes = [(512, 512, 512), (1, 8, 8), (127, 136, 263)]
    for shape in shapes:
        lib.add(entry(cfg, res, shape, 900.0, 400.0, dtype="tf32", gpu=gpu),
                tmp_path / "art" / "sm_90a" / f"{cfg.name}.cu", res.cubin)
    lib = load_library(tmp_path / "lib")
    runner = runner_for(cfg, res.cubin.read_bytes())
    assert type(runner) is TmaRunner and runner.prep is not None  # <name>_prep loaded too
    g = driver.gpu(torch.cuda.current_device())

    def tf32(x):
        return torch.from_numpy(round_to(x.cpu().numpy(), DType.TF32)[1]).cuda()

    side = torch.cuda.Stream()
    for m, n, k in shapes:
        for pad in (0, 1):  # pad 1: rows of k + 1 floats, not a multiple of 16 bytes
            a = torch.randn(m, k + pad, device="cuda")[:, :k]
            b = torch.randn(k, n + pad, device="cuda")[:, :n]
            c0 = torch.randn(m, n, device="cuda")
            c = c0.clone()
            if pad == 0:  # the exact entry, or (rows of 263 floats) its estimate
                assert lib.explain(a, b, c, allow_tf32=True).startswith(cfg.name)
            side.wait_stream(torch.cuda.current_stream())  # the operands are made there
            with torch.cuda.stream(side):
                if pad == 0:
                    lib.gemm(a, b, c, alpha=0.5, beta=2.0, allow_tf32=True)
                else:
                    with driver.entered(g):
                        runner.bind(g, m, n, k, k + 1, n + 1, n)(
                            a.data_ptr(), b.data_ptr(), c.data_ptr(), 0.5, 2.0, side.cuda_stream)
            side.synchronize()
            assert _err(c, tf32(a), tf32(b), 0.5, 2.0, c0) <= 1e-4 * max(1.0, k / 4096), (
                (m, n, k), pad)


#: the allow_tf32 promise (README): whichever route runs the call (a tf32 kernel, which
#: rounds the inputs to nearest, or cuBLAS TF32, which need not), C is within this of the
#: float64 product of the fp32 inputs as given, relative in norm, scaled by K above 4096.
TF32_PROMISE = 1e-3


@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_allow_tf32_keeps_its_promise_on_every_route(lib, kind):
    """allow_tf32 through lib.gemm on aligned and padded rows (padded rows: no TMA, so the
    tf32 entries cannot take them and cuBLAS TF32 or a CUDA-core kernel may), tiny to
    K-heavy shapes, with alpha and beta: within TF32_PROMISE of float64 of the inputs as
    given, C poisoned first where beta is 0."""
    import torch

    for m, n, k in ((1, 8, 8), (127, 136, 263), (512, 512, 512), (64, 64, 8192)):
        for pad in (0, 1):
            a = torch.randn(m, k + pad, device="cuda")[:, :k]
            b = torch.randn(k, n + pad, device="cuda")[:, :n]
            c0 = torch.randn(m, n, device="cuda")
            for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
                c = c0.clone() if beta else torch.full((m, n), float("nan"), device="cuda")
                if kind == "torch":
                    lib.gemm(a, b, c, alpha=alpha, beta=beta, allow_tf32=True)
                else:
                    import cupy

                    c_cp = cupy.asarray(c)
                    lib.gemm(cupy.asarray(a), cupy.asarray(b), c_cp, alpha=alpha, beta=beta,
                             allow_tf32=True)
                    c = torch.as_tensor(c_cp, device="cuda")
                torch.cuda.synchronize()
                err = _err(c, a, b, alpha, beta, c0 if beta else None)
                assert err <= TF32_PROMISE * max(1.0, k / 4096), ((m, n, k), pad, beta, err)


@pytest.mark.parametrize("kind", ["torch", "cupy", "numpy"])
def test_3xtf32_requests_on_an_untuned_shape_from_every_caller(lib, kind):
    """allow_3xtf32 on a shape with no entry: decided on first use by measuring, keyed apart
    from plain fp32 (torch callers' first use raised KeyError 'f32x3' before), right against
    float64; for torch also on a side stream and replayed from a CUDA graph."""
    import torch

    m, n, k = 333, 276, 516  # rows of 16-byte multiples: explain() speaks of such operands
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    if kind == "torch":
        c = lib.gemm(a, b, allow_3xtf32=True, measure=True)
    elif kind == "cupy":
        import cupy

        c = torch.as_tensor(lib.gemm(cupy.asarray(a), cupy.asarray(b), allow_3xtf32=True,
                                     measure=True), device="cuda")
    else:
        c = torch.from_numpy(lib.gemm(a.cpu().numpy(), b.cpu().numpy(), allow_3xtf32=True,
                                      measure=True)).cuda()
    torch.cuda.synchronize()
    assert _err(c, a, b) <= 1e-5
    assert "measured on first use" in lib.explain(m, n, k, "f32x3")
    if kind != "torch":
        return
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c2 = torch.full((m, n), float("nan"), device="cuda")
        lib.gemm(a, b, c2, allow_3xtf32=True, measure=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert _err(c2, a, b) <= 1e-5
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lib.gemm(a, b, c2, allow_3xtf32=True, measure=True)
    a.copy_(torch.randn(m, k, device="cuda"))
    c2.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert _err(c2, a, b) <= 1e-5


@pytest.mark.parametrize("nbytes", [None, (24 << 20) + 48], ids=["twice-the-l2", "odd"])
def test_the_l2_flush_reads_every_word_of_its_buffer(nbytes):
    """driver.L2Flush (PTX, compiled by the driver: the tuner's flush and a first use's)
    loads every 16-byte word of its buffer: a thread stores the XOR of what it read where
    that equals the kernel's constant, so a buffer of zeros but for the constant in one
    32-bit word reaches the sink wherever that word lies (the first, the middle, the last:
    in the four-load loop or the remainder's), and the constant twice in one 16-byte word
    does not."""
    import torch

    from tuner.runtime import driver

    g = driver.gpu(torch.cuda.current_device())
    with driver.entered(g):
        flush = driver.L2Flush(g, nbytes)
        words = flush.buf.nbytes // 4
        for at in (0, words // 2 + 1, words - 1):
            flush.buf.fill32(0)
            flush._sink.fill32(0x7FC00000)  # (a NaN: written by no XOR that reaches it)
            driver.call("cuMemsetD32", flush.buf.ptr + 4 * at, 0x9E3779B9, 1)
            flush(0)
            driver.synchronize()
            got = flush._sink.download(np.zeros(1, np.uint32))[0]
            assert got == 0x9E3779B9, (at, hex(got))
        # the constant twice in one 16-byte word: its thread's XOR is 0, nothing is written
        flush.buf.fill32(0)
        driver.call("cuMemsetD32", flush.buf.ptr + 16, 0x9E3779B9, 2)
        flush._sink.fill32(0x7FC00000)
        flush(0)
        driver.synchronize()
        assert flush._sink.download(np.zeros(1, np.uint32))[0] == 0x7FC00000


def test_the_spin_kernel_holds_a_stream_for_its_time():
    """driver.spin (PTX, compiled by the driver) keeps a stream busy for the time asked, so
    calls queued behind it run back to back (the first-use measurement's GPU-alone times)."""
    import torch

    from tuner.runtime import driver

    g = driver.gpu(torch.cuda.current_device())
    s = torch.cuda.current_stream().cuda_stream
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with driver.entered(g):
        for ms in (0.5, 2.0, 10.0):
            start.record()
            driver.spin(g, s, int(ms * 1e6))
            end.record()
            end.synchronize()
            assert ms <= start.elapsed_time(end) <= 1.1 * ms + 0.05, (ms, start.elapsed_time(end))
