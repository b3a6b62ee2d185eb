"""The run-time decisions on the CPU, through a fake GPU: what a decision is keyed by (the
route, the leading-dimension class, the alignment, the variant, the batch), how a first use
times its candidates, and explain() of exactly a caller's call."""

import json
from pathlib import Path

import pytest

from _fake_gpu import Cai, Dev, FakeGpu
from _library import BIG, SMALL, build
from codegen.config import DType
from tuner.runtime import dispatch, driver, measure
from tuner.runtime.dispatch import Case, DispatchTable
from tuner.runtime.library import load_library


@pytest.fixture
def lib(tmp_path, compile_cache):
    build(tmp_path / "library", compile_cache, tmp_path / "art")
    return load_library(tmp_path / "library")


@pytest.fixture
def fake(monkeypatch):
    return FakeGpu(monkeypatch)


def _decisions(lib) -> dict:
    return json.loads(lib.table_path.read_text())["decisions"]


# ---- item: measure what the caller will run, keyed by all of it ----------------------------
def test_padded_and_tight_rows_are_measured_and_kept_apart(lib, fake):
    """777x555x333 with A's rows padded by 4 floats has the alignment class of the tight call
    (4-byte rows either way) but is its own decision, measured on scratch of its own leading
    dimension; explain() of each call's operands reports that call's figures."""
    m, n, k = 777, 555, 333
    tight = Cai(m, k, 0x100000), Cai(k, n, 0x200000), Cai(m, n, 0x300000)
    padded = Cai(m, k, 0x100000, ld=k + 4), Cai(k, n, 0x200000), Cai(m, n, 0x300000)
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    lib.gemm(*tight)
    fake.times = {SMALL.name: 2.0, BIG.name: 2.0, "cublas": 1.0}
    lib.gemm(*padded)
    # each at both ends of M's bucket, 769-896
    assert [x[:2] for x in fake.measured] == [
        ((769, n, k), (k, n, n)), ((896, n, k), (k, n, n)),
        ((769, n, k), (k + 4, n, n)), ((896, n, k), (k + 4, n, n))]
    assert fake.launches[-1][0] == SMALL.name and len(fake.blas) == 1  # tight: SMALL; padded: cuBLAS
    keys = sorted(_decisions(lib))
    assert len(keys) == 2 and all("|align 4.4.4|" in key for key in keys)
    assert keys[0].endswith("|ld padded.tight.tight") and keys[1].endswith("|ld tight.tight.tight")
    assert lib.explain(*tight).startswith(f"{SMALL.name} (measured, gemm-tune callers) for "
                                          "777x555x333 f32 nn")
    said = lib.explain(*padded)
    assert said.startswith("cuBLAS (measured, gemm-tune callers)") and "A padded" in said
    assert "cublas 1.0000 ms" in said
    # the same call by its shape, leading dimensions and route: the same answer
    assert lib.explain(m, n, k, ld=(k + 4, n, n), route="gemm-tune") == said
    # another padding of the same classes shares the decision; one of another alignment
    # (rows of 334 floats: 8-byte) has none yet
    assert lib.explain(m, n, k, ld=(k + 8, n, n), route="gemm-tune") == said
    assert lib.explain(m, n, k, ld=(k + 1, n, n)).endswith("a first call will measure")


def test_every_field_of_a_case_is_in_its_key(lib, fake):
    g = driver.gpu(0)
    base = Case(DType.F32, 300, 100, 200)
    key = lib.dispatcher.key(g, base)
    assert "cublas 130100 via gemm-tune" in key and "|257-384x100x200|" in key
    changes = [dict(route="torch"), dict(ld=("padded", "tight", "tight")),
               dict(align=(4, 16, 16)), dict(batch=3), dict(dtype=DType.TF32), dict(n=101),
               dict(k=201), dict(m=385)]
    import dataclasses

    from codegen.families._common import Variant

    for v in (Variant(out=DType.F16), Variant(bias="out"), Variant(act="relu")):
        changes.append(dict(variant=v))
    keys = {lib.dispatcher.key(g, dataclasses.replace(base, **c)) for c in changes}
    assert key not in keys and len(keys) == len(changes)
    assert lib.dispatcher.key(g, dataclasses.replace(base, m=257)) == key  # M's bucket


@pytest.mark.parametrize("old", [1, 2])
def test_the_table_keys_name_the_leading_dimensions_and_an_older_table_is_replaced(tmp_path,
                                                                                   old):
    args = dict(gpu_name="NVIDIA H200", driver=13000, cublas="130100 via torch",
                fingerprint="abc", dtype="f32", layout="nn", m="33-64", n=4, k=5,
                align=(16, 16, 16), ld=("tight", "tight", "tight"))
    key = DispatchTable.key(**args)
    assert key == ("NVIDIA H200|driver 13000|cublas 130100 via torch|lib abc|f32|nn|33-64x4x5"
                   "|align 16.16.16|ld tight.tight.tight")
    path = tmp_path / "dispatch.json"
    path.write_text(json.dumps({"schema": old, "decisions": {"old": {"kernel": None}}}))
    t = DispatchTable(path)
    # schema 1 keyed one M and no leading dimensions; schema 2's decisions of pace "either"
    # did not bound a kernel's GPU time
    assert t.get("old") is None
    t.put(key, dict(kernel=None, measured_ms={"cublas": 1.0}, date=""))
    data = json.loads(path.read_text())
    assert data["schema"] == 3 and list(data["decisions"]) == [key]
    assert not list(tmp_path.glob("*.corrupt-*"))  # replaced, not set aside as corrupt


def test_explain_defaults_the_out_type_as_gemm_does(lib, fake):
    assert "no kernel tuned for f16 nn, f16 C on sm_90" in lib.explain(64, 64, 64, "fp16")
    assert "no kernel tuned for f16 nn on sm_90" in lib.explain(64, 64, 64, "fp16",
                                                                  out_dtype="float32")
    assert "no kernel tuned for bf16 nn, bf16 C" in lib.explain(64, 64, 64, "bf16")
    a16, b16 = Dev((64, 64), 0x100000, "<f2"), Dev((64, 64), 0x200000, "<f2")
    assert "f16 nn, f16 C" in lib.explain(a16, b16)
    assert "f16 nn, f16 C" not in lib.explain(a16, b16, out_dtype="float32")


def test_explain_of_operands_reads_them_as_gemm_does(lib, fake):
    """Layout, alignment (an allocated C included: rows of N elements from a 256-byte
    boundary), batch and epilogue, as the call would have them."""
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    A, B = Dev((100, 64), 0x100000), Dev((64, 70), 0x200000)
    said = lib.explain(A, B)  # C allocated: rows of 70 floats, 8-byte aligned
    assert "100x70x64 f32 nn (M-bucket 65-128), operands 16.8.8-byte aligned:" in said
    assert said.endswith("a first call will measure")
    C = Dev((100, 70), 0x300000)
    lib.gemm(A, B, C)
    assert lib.explain(A, B, C).startswith(f"{SMALL.name} (measured, gemm-tune callers)")
    assert lib.explain(Dev((100, 64), 0x100004), B, C).endswith("a first call will measure")
    nt = lib.explain(A, Dev((64, 70), 0x200000, strides=(1, 64)), C, bias=Dev((70,), 0x400000),
                     activation="gelu")
    assert "f32 nt, bias + gelu" in nt and "no kernel tuned" in nt
    assert "batch 3" in lib.explain(Dev((3, 100, 64), 0x100000), Dev((3, 64, 70), 0x200000))
    # one B for a batch of A whose rows fold: x @ W, one product of its 300 rows
    assert "300x70x64 f32 nn (M-bucket 257-384)" in lib.explain(Dev((3, 100, 64), 0x100000), B)
    assert fake.launches[-1][0] == SMALL.name and len(fake.measured) == 2  # explain runs nothing


def test_measure_off_takes_the_tables_decision_and_writes_nothing(lib, fake):
    ops = Cai(300, 200, 0x10000), Cai(200, 100, 0x20000), Cai(300, 100, 0x30000)
    fake.times = {SMALL.name: 0.5, BIG.name: 2.0, "cublas": 1.0}
    lib.gemm(*ops)  # measured: SMALL
    kept = lib.table_path.read_text()
    off = load_library(lib.path, measure=False)
    assert off.measure is False
    off.gemm(*ops)
    assert fake.launches[-1][0] == SMALL.name and len(fake.measured) == 2
    off.gemm(Cai(300, 200, 0x10000), Cai(200, 101, 0x20000), Cai(300, 101, 0x30000))
    assert len(fake.measured) == 2 and lib.table_path.read_text() == kept


# ---- how a first use times its candidates ---------------------------------------------------
class _Stream:
    """One stream on a simulated clock: the host issues a call every `host` ms; the GPU runs
    each after the one before it and not before it is issued; an event completes when the
    stream reaches it. A hold keeps the GPU busy for its ms from when it is issued."""

    def __init__(self, host: float):
        self.host_ms, self.now, self.free = host, 0.0, 0.0

    def run(self, gpu_ms: float) -> None:
        self.now += self.host_ms
        self.free = max(self.free, self.now) + gpu_ms

    def reached(self) -> float:
        return max(self.free, self.now)

    def hold(self, stream, ms: float) -> None:
        self.free = max(self.free, self.now) + ms

    def clock(self) -> float:
        return self.now / 1e3

    def event(self):
        stream = self

        class Event:
            def record(self, st):
                self.t = stream.reached()

            def synchronize(self):
                stream.now = max(stream.now, self.t)

            def since(self, start):
                return self.t - start.t

        return Event()


def _simulated(monkeypatch, s: _Stream) -> None:
    monkeypatch.setattr(driver, "Event", s.event)
    monkeypatch.setattr(driver, "sync", lambda stream: setattr(s, "now", s.reached()))


@pytest.mark.parametrize("gpu_ms,host_ms", [(0.020, 0.008), (0.005, 0.012), (0.8, 0.01)],
                         ids=["gpu-bound", "host-bound", "large"])
def test_candidates_are_timed_as_a_loop_in_its_steady_state(monkeypatch, gpu_ms, host_ms):
    """The per-call time a first use records is the loop's steady state, max(GPU, host) per
    call, even for cuBLAS, whose first call takes milliseconds (choosing its algorithm): the
    loops are sized from a warm loop, and the clock starts with a call in flight. Behind a
    hold the same calls give the GPU's time alone; a loop the GPU paced gives it as it is."""
    s = _Stream(host_ms)
    _simulated(monkeypatch, s)
    first = {"cublas": True}

    def blas(stream):
        s.run(3.0 if first.pop("cublas", False) else gpu_ms)

    holds, flushes = [], []
    ms, device = measure.time_candidates(None, {"kernel": lambda st: s.run(gpu_ms * 1.5),
                                                "cublas": blas}, stream=7,
                                         hold=lambda st, t: holds.append(t) or s.hold(st, t),
                                         clock=s.clock,
                                         flush=lambda st: flushes.append(st) or s.run(0.002))
    assert ms["cublas"] == pytest.approx(max(gpu_ms, host_ms), rel=1e-6)
    assert ms["kernel"] == pytest.approx(max(1.5 * gpu_ms, host_ms), rel=1e-6)
    assert device == pytest.approx({"cublas": gpu_ms, "kernel": 1.5 * gpu_ms}, rel=1e-6)
    # held loops only where the host paced a loop or its calls are short (a long call of a
    # GPU-paced loop gives the GPU's time as it is)
    assert bool(holds) == (host_ms > measure.GPU_BOUND * gpu_ms
                           or gpu_ms < measure.FLUSHED_BELOW_MS)
    # and a flush only where a held loop runs (the default one allocates its buffer, twice
    # the L2, at its first call: none for a first use the GPU paced throughout)
    assert bool(flushes) == bool(holds)


def test_the_first_uses_flush_allocates_its_buffer_at_its_first_call(monkeypatch):
    made = []
    monkeypatch.setattr(driver, "L2Flush", lambda g: made.append(g) or (lambda st: None))
    flush = measure._Flush("gpu 0")
    assert made == []
    flush(7)
    flush(7)
    assert made == ["gpu 0"]


@pytest.mark.parametrize("flushed", [True, False])
def test_the_gpu_alone_figure_times_each_call_alone_after_the_l2_flush(monkeypatch, flushed):
    """The GPU-alone figure is the tuner's: each call after the L2 flush (a kernel of
    another op, its A, C and code out of the L2), timed alone by events around it, the
    flush's own time not in it. Back to back (flush=False), a kernel launched with
    programmatic dependent launch overlaps its own previous call's end and finds its
    operands in the L2, which a program's GEMM after another op does not: here the kernel
    takes 5 us after the flush and 4 us behind itself, cuBLAS 4.5 us either way."""
    s = _Stream(0.012)
    _simulated(monkeypatch, s)
    last = [None]

    def kernel(stream):
        s.run(0.004 if last[0] == "kernel" else 0.005)
        last[0] = "kernel"

    def blas(stream):
        s.run(0.0045)
        last[0] = "cublas"

    def flush(stream):
        s.run(0.030)
        last[0] = "flush"

    ms, device = measure.time_candidates(None, {"kernel": kernel, "cublas": blas}, stream=7,
                                         hold=s.hold, clock=s.clock,
                                         flush=flush if flushed else False)
    assert device["cublas"] == pytest.approx(0.0045, rel=1e-6)
    assert device["kernel"] == pytest.approx(0.005 if flushed else 0.004, rel=1e-6)


def test_no_gpu_alone_times_where_the_host_outlasted_the_hold(monkeypatch):
    """Where queueing the calls took the host longer than the hold lasted (here: a call
    that waits for the GPU, as a synchronising one does), the GPU waited for the host
    between them: no GPU-alone figures are reported, the loop's stand."""
    s = _Stream(0.012)
    _simulated(monkeypatch, s)

    def waits(stream):
        s.run(0.005)
        s.now = s.reached()

    ms, device = measure.time_candidates(None, {"cublas": waits, "kernel": lambda st: s.run(0.001)},
                                         stream=7, hold=s.hold, clock=s.clock,
                                         flush=lambda st: s.run(0.002))
    assert ms["cublas"] == pytest.approx(0.017) and device == {}


@pytest.mark.parametrize("span,copies", [(6 << 20, 30), (2 << 20, 64), (180 << 20, 1),
                                         (200 << 20, 1), (7 << 20, 26), (0, 1)])
def test_b_is_rotated_through_copies_that_pass_three_times_the_l2(span, copies):
    """A first use reads B from DRAM, as a program reads its weights: as many copies of B as
    span 3x the L2 (60 MiB here), at most 64; one where B alone spans that."""
    g = driver.Gpu(index=0, name="x", cc=90, arch=None, l2_bytes=60 << 20, total_mem=0,
                   driver_version=0, ctx=0)
    assert measure.b_copies(g, span) == copies
    if copies > 1:
        assert copies == 64 or copies * span >= 3 * (60 << 20) > (copies - 1) * span


def test_scratch_copies_of_b_keep_the_callers_offset_and_do_not_overlap(monkeypatch):
    """driver_operands: A, C and the bias once, B as its copies, each copy `offsets[1]`
    bytes past a 256-byte boundary as the caller's B was, one after another."""
    from types import SimpleNamespace

    allocated = []

    class Buffer:
        def __init__(self, nbytes):
            self.ptr, self.nbytes = 0x10000000 * (len(allocated) + 1), nbytes
            allocated.append(self)

    monkeypatch.setattr(driver, "Buffer", Buffer)
    monkeypatch.setattr(driver, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "_fill", lambda ptr, nbytes, rng: None)
    g = SimpleNamespace(l2_bytes=60 << 20)
    b_span = 1024 * 3000 * 2 + 6  # not a multiple of 256
    problem = SimpleNamespace(spans=lambda: (4000, b_span, 8000, 0), offsets=(16, 48, 0))
    with measure.driver_operands(g, problem) as (a, bs, c, bias):
        assert a % 256 == 16 and c % 256 == 0 and bias == 0
        assert len(bs) == measure.b_copies(g, b_span) == 31
        assert all(b % 256 == 48 for b in bs)
        assert all(later - earlier >= b_span for earlier, later in zip(bs, bs[1:]))
        buf = allocated[1]
        assert buf.ptr <= bs[0] and bs[-1] + b_span <= buf.ptr + buf.nbytes


def test_a_first_use_times_each_candidate_on_b_in_turn(lib, fake, monkeypatch):
    """Every candidate of a first use, cuBLAS included, takes the next copy of B each call,
    round and round, and A and C stay the same (an activation in the L2, as in a program)."""
    timed = fake_time = measure.time_candidates

    def rounds(g, runners, stream, **kw):
        fake.measuring = True
        for run in runners.values():
            for _ in range(2):  # then the fake's own call: three each
                run(stream)
        fake.measuring = False
        return fake_time(g, runners, stream, **kw)

    monkeypatch.setattr(measure, "time_candidates", rounds)
    m, n, k = 40, 1024, 512
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    lib.gemm(Cai(m, k, 0x100000), Cai(k, n, 0x200000), Cai(m, n, 0x300000))
    assert timed is not measure.time_candidates
    pitch = k * n * 4
    assert measure.b_copies(driver.gpu(0), pitch) == 64
    b0 = 0x10000000  # the fake's first copy
    # per M measured (33 and 64): SMALL, BIG, cuBLAS three calls each, then the fake's own
    # call of each (the third): B is copy 0, 1, 2 in every candidate's calls
    calls = fake.scratch_calls
    assert len(calls) == 2 * (3 * 2 + 3)
    for at in (0, 9):
        seen = {}
        for call in calls[at:at + 6] + calls[at + 6:at + 9]:
            name, b, a = ((call[0], call[-1][7], call[-1][4]) if isinstance(call[0], str)
                          else ("cublas", call[7], call[5]))
            assert a == 0x1000  # A stays
            seen.setdefault(name, []).append((b - b0) // pitch)
        assert seen == {SMALL.name: [0, 1, 2], BIG.name: [0, 1, 2], "cublas": [0, 1, 2]}


def test_the_decision_takes_the_worst_ratio_over_the_measured_ms():
    at = {33: {"a": 0.9, "b": 0.5, "cublas": 1.0}, 64: {"a": 1.8, "b": 2.1, "cublas": 2.0}}
    d = measure.decision(at, "torch")
    assert d["kernel"] == "a" and d["measured_m"] == [33, 64]  # b lost at 64
    assert d["measured_ms"] == at[64] and d["measured_ms_low"] == at[33]
    assert measure.decision({64: {"a": 1.99, "cublas": 2.0}}, "torch")["kernel"] is None
    # a kernel not measured at every M (it could not take the operands there) cannot run
    d = measure.decision({33: {"a": 0.1, "cublas": 1.0}, 64: {"cublas": 2.0}}, "torch")
    assert d["kernel"] is None and "measured_ms_low" in d


@pytest.mark.parametrize("loop,device,runs", [
    ((0.7, 1.0), (1.04, 1.0), True),   # a cheaper launch, a GPU time within GPU_LOSS_MAX
    ((0.5, 1.0), (1.2, 1.0), False),   # half the loop's time, but 1.2x on the GPU alone
    ((0.019, 0.019), (0.020, 0.008), False),  # a loop tie, 2.5x slower on the GPU alone
    ((1.3, 1.0), (0.5, 1.0), True),    # the reverse: the GPU's time wins
    ((1.5, 1.0), (0.7, 1.0), False),   # it would lose more (1.5x) than cuBLAS (1.43x)
    ((0.97, 1.0), (0.97, 1.0), True),  # wins both by the margin
    ((0.99, 1.0), (0.99, 1.0), False),  # wins both, within the margin
    ((1.01, 1.0), (0.5, 1.0), True),   # a tie in the loop, 2x on the GPU alone
    ((0.77, 1.0), (1.0, 1.0), True),   # 1.3x in the loop, the GPU alone tied exactly
    ((0.77, 1.0), (0.995, 1.0), True),  # 1.3x in the loop, ahead on the GPU within the margin
    ((0.995, 1.0), (1.0, 1.0), False),  # no figure won by the margin, none lost
], ids=["launch-wins", "gpu-loses-past-the-bound", "gpu-loses", "gpu-wins", "loses-more",
        "both", "within-margin", "loop-tie", "gpu-tie", "gpu-ahead-within-margin",
        "ties"])
def test_the_decision_weighs_the_loop_against_the_gpu_alone(loop, device, runs):
    """Where a kernel wins in the caller's loop and loses on the GPU alone (or the reverse),
    it runs only if what it can lose, by the margin, is less than what cuBLAS can, and its
    GPU time alone is within GPU_LOSS_MAX of cuBLAS's."""
    at = {64: {"k": loop[0], "cublas": loop[1]}}
    d = measure.decision(at, "torch", {64: {"k": device[0], "cublas": device[1]}})
    assert (d["kernel"] == "k") is runs
    assert d["device_ms"] == {"k": device[0], "cublas": device[1]}
    choice = dispatch.measured_choice(d)
    assert "on the GPU alone" in choice.reason and f"k {device[0]:.4f} ms" in choice.reason


def test_the_time_a_trade_costs_is_weighed_against_the_time_it_saves():
    """Trades are weighed in time, not ratios, within a bound on the GPU's time: on a tiny
    call (the host's 13.5 us against a GPU time of 2 us) a kernel with a cheaper launch that
    is 2.5% slower on the GPU is worth more than one that wins both by less; one that is
    1.5x slower on the GPU runs only where the program says its host sets the pace; a small
    linear whose kernel saves 4 us of host time but costs 12 us of GPU time never does."""
    at = {8: {"one_launch": 0.0088, "split": 0.0123, "cublas": 0.0135}}
    close = {8: {"one_launch": 0.00205, "split": 0.0016, "cublas": 0.002}}
    assert measure.decision(at, "torch", close)["kernel"] == "one_launch"
    slow = {8: {"one_launch": 0.003, "split": 0.0016, "cublas": 0.002}}
    assert measure.decision(at, "torch", slow)["kernel"] == "split"
    assert measure.decision(at, "torch", slow, "host")["kernel"] == "one_launch"
    linear = measure.decision({16: {"k": 0.020, "cublas": 0.024}}, "torch",
                              {16: {"k": 0.020, "cublas": 0.008}})
    assert linear["kernel"] is None


def test_a_kernel_that_trades_paces_must_still_hold_at_both_ends_of_its_bucket():
    """The trade between the two paces is made at each M; losing both at one end loses the
    bucket, and no GPU-alone figures leave the loop's rule as it was."""
    at = {33: {"k": 1.1, "cublas": 1.0}, 64: {"k": 0.5, "cublas": 2.0}}
    assert measure.decision(at, "torch", {33: {"k": 1.2, "cublas": 1.0},
                                          64: {"k": 0.5, "cublas": 2.0}})["kernel"] is None
    assert measure.decision(at, "torch", {33: {"k": 0.4, "cublas": 1.0},
                                          64: {"k": 0.5, "cublas": 2.0}})["kernel"] == "k"
    assert measure.decision(at, "torch", {})["kernel"] is None


@pytest.mark.parametrize("ratio,measured", [(1.05, True), (1.10, False), (2.0, False)])
def test_an_exact_entry_close_to_cublas_is_measured_with_its_kernel(
        lib, fake, compile_cache, tmp_path, ratio, measured):
    """An exact entry that beat cuBLAS by less than EXACT_TRUSTED where it was tuned is
    measured as the caller runs it, its kernel among the candidates, at its own M alone
    (decided apart from its M-bucket, whose other Ms are measured at the bucket's ends);
    a clearer win runs unmeasured."""
    from _library import entry
    from codegen import compile_config
    from tuner.runtime.dispatch import EXACT_TRUSTED

    assert EXACT_TRUSTED == 1.10
    res = compile_config(BIG, "sm_90", compile_cache, tmp_path / "art")
    lib.add(entry(BIG, res, (300, 256, 256), 10.0 * ratio, 10.0),
            tmp_path / "art" / "sm_90" / f"{BIG.name}.cu", res.cubin)
    lib = load_library(lib.path)
    fake.times = {SMALL.name: 2.0, BIG.name: 1.5, "cublas": 1.0}
    lib.gemm(Cai(300, 256, 0x100000), Cai(256, 256, 0x200000), Cai(300, 256, 0x300000))
    if measured:
        assert [x[0][0] for x in fake.measured] == [300]
        assert all(BIG.name in x[-1] for x in fake.measured)
        assert len(fake.blas) == 1 and not fake.launches  # cuBLAS measured faster
        assert lib.explain(300, 256, 256).startswith(
            "cuBLAS (measured, gemm-tune callers) for 300x256x256 ")
        assert "(its exact entry: this M alone)" in lib.explain(300, 256, 256)
    else:
        assert fake.measured == [] and fake.launches[-1][0] == BIG.name
    # another M of the bucket: a decision of its own, measured at the bucket's ends
    lib.gemm(Cai(301, 256, 0x100000), Cai(256, 256, 0x200000), Cai(301, 256, 0x300000))
    assert [x[0][0] for x in fake.measured][-2:] == [257, 384]
    assert "M-bucket 257-384" in lib.explain(301, 256, 256)


def test_an_exact_entry_does_not_decide_for_padded_rows(lib, fake, compile_cache, tmp_path):
    """An exact entry speaks for the operands it was tuned on: fully aligned, rows of exactly
    their length. Padded rows (still 16-byte aligned) change what cuBLAS runs, so a trusted
    entry's shape called with them is measured at its M-bucket's ends, as an untuned shape
    is, and explain names the padding, not the entry."""
    from _library import entry
    from codegen import compile_config

    res = compile_config(BIG, "sm_90", compile_cache, tmp_path / "art")
    lib.add(entry(BIG, res, (300, 256, 256), 20.0, 10.0),
            tmp_path / "art" / "sm_90" / f"{BIG.name}.cu", res.cubin)
    lib = load_library(lib.path)
    fake.times = {SMALL.name: 2.0, BIG.name: 1.5, "cublas": 1.0}
    b, c = Cai(256, 256, 0x200000), Cai(300, 256, 0x300000)
    lib.gemm(Cai(300, 256, 0x100000), b, c)  # tight rows: the entry runs, unmeasured
    assert fake.measured == [] and fake.launches[-1][0] == BIG.name
    assert lib.explain(300, 256, 256).startswith(f"{BIG.name} (exact)")
    lib.gemm(Cai(300, 256, 0x100000, ld=260), b, c)  # A's rows padded by 4 floats
    assert [(x[0][0], x[1][0]) for x in fake.measured] == [(257, 260), (384, 260)]
    assert BIG.name in fake.measured[0][-1]
    assert "(M-bucket 257-384), operands 16.16.16-byte aligned, A padded" in lib.explain(
        300, 256, 256, ld=(260, 256, 256))
    assert len(fake.blas) == 1  # cuBLAS measured faster: it ran
    assert fake.launches[-1][0] == BIG.name  # the tight call's launch was the last


@pytest.mark.parametrize("ratio", [0.99, 1.05])
def test_an_exact_entrys_kernel_is_measured_first_however_its_estimate_ranks(
        tmp_path, fake, ratio):
    """The exact entry's kernel leads the first use's candidates, whether it beat cuBLAS
    where it was tuned (by less than EXACT_TRUSTED) or lost narrowly, and however the
    estimates rank it among the library's other kernels (on the H200 a tuned decode kernel,
    3.7 us a call, went unmeasured behind three split-K kernels the estimates preferred)."""
    import dataclasses
    import types

    from _library import entry
    from tuner.runtime.dispatch import Dispatcher
    from tuner.runtime.manifest import Manifest

    res = types.SimpleNamespace(resources=types.SimpleNamespace(
        registers=64, smem=16384,
        to_dict=lambda: dict(registers=64, smem_static=16384, smem_dynamic=0, local=0)))
    cfgs = [dataclasses.replace(BIG, bm=bm, bn=bn) for bm, bn in
            ((256, 128), (128, 128), (128, 64), (64, 128), (64, 64))]
    shape = (700, 640, 512)
    # tuned elsewhere at high rates, so the estimates put them ahead of the exact entry's
    entries = [entry(c, res, (4096, 4096, 4096), 50.0, 51.0) for c in cfgs[:-1]]
    entries.append(entry(cfgs[-1], res, shape, 1.0 * ratio, 1.0))
    disp = Dispatcher(Manifest(tmp_path, dict(kernels={}, entries=entries)))
    g = driver.gpu(0)
    ranked = [e["kernel"] for _, e in disp.ranked(*shape, DType.F32, g.cc, g.arch.sm_count)]
    assert ranked.index(cfgs[-1].name) >= measure.MEASURE_TOP  # the estimates rank it last
    asked = []

    def timer(names, bucket):
        asked.append(measure.candidates(names))
        return None  # as under capture: nothing timed, nothing kept

    disp.decide(g, Case(DType.F32, *shape), timer)
    assert asked and asked[0][0] == cfgs[-1].name


# ---- explain() without a GPU ----------------------------------------------------------------
def test_explain_without_a_gpu_answers_for_a_named_model_from_the_estimates(
        lib, monkeypatch, compile_cache, tmp_path):
    """Nothing touches a driver: the exact entry or the estimates (with the time they
    predict), for a model named in full or by a unique part of its name, from a shape or
    numpy operands, and the decisions the table holds for that model; anything else one
    line saying why not."""
    import numpy as np

    from _library import entry
    from codegen import compile_config
    from tuner.runtime.errors import LibraryError

    def no_driver(*args):
        raise AssertionError("explain(gpu=...) reached for the driver")

    monkeypatch.setattr(driver, "gpu", no_driver)
    monkeypatch.setattr(driver, "current_device", no_driver)
    said = lib.explain(16, 4096, 4096, "fp32", gpu="H200")
    est = lib.select(16, 4096, 4096, DType.F32, 90, 132).estimate_tflops
    assert said.startswith(f"{SMALL.name} (estimate, for NVIDIA H200 without a GPU here)")
    assert f"about {2e-9 * 16 * 4096 * 4096 / est:.4f} ms per call" in said
    assert said.endswith("on that GPU a first call measures")
    a, b = np.ones((16, 4096), np.float32), np.ones((4096, 4096), np.float32)
    assert lib.explain(a, b, gpu="NVIDIA H200") == said  # the same call, by its operands
    assert lib.explain(4096, 4096, 4096, gpu="h200").startswith(
        "cuBLAS (exact, for NVIDIA H200 without a GPU here): tuned for exactly 4096x4096x4096")
    # a decision the table holds for that model, under the driver and cuBLAS it names
    case = Case(DType.F32, 16, 4096, 4096)
    key = DispatchTable.key("NVIDIA H200", 13000, "130100 via torch", lib.fingerprint, "f32",
                            case.variant, lib.m_buckets.text(16), 4096, 4096, case.align,
                            1, case.ld)
    lib.dispatcher.table.put(key, measure.decision({16: {BIG.name: 0.2, "cublas": 0.3}},
                                                   "torch"))
    lines = lib.explain(16, 4096, 4096, gpu="H200").splitlines()
    assert lines[0] == said and len(lines) == 2
    assert lines[1].startswith(f"{BIG.name} (measured on NVIDIA H200, driver 13000, cublas "
                               "130100 via torch): measured on first use")
    # one line where it cannot answer
    with pytest.raises(LibraryError, match=r"has no entries for 'A100' \(it has: NVIDIA "
                                           r"H200\): explain\(\) without a GPU answers only "
                                           "for a GPU model the library was tuned on") as e:
        lib.explain(64, 64, 64, gpu="A100")
    assert "\n" not in str(e.value)
    res = compile_config(SMALL, "sm_80", compile_cache, tmp_path / "art")
    lib.add(entry(SMALL, res, (512, 512, 512), 10.0, 12.0, cc=80, gpu="NVIDIA A100"),
            tmp_path / "art" / "sm_80" / f"{SMALL.name}.cu", res.cubin)
    two = load_library(lib.path)
    with pytest.raises(LibraryError, match="names several 'NVIDIA' .it has: NVIDIA A100, "
                                           "NVIDIA H200."):
        two.explain(64, 64, 64, gpu="NVIDIA")
    assert two.explain(512, 512, 512, gpu="A100").startswith(
        "cuBLAS (exact, for NVIDIA A100 without a GPU here)")


# ---- M-buckets --------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tuner.runtime.dispatch import MBuckets  # noqa: E402


def test_the_default_buckets_are_powers_of_two_to_64_then_multiples_of_128():
    b = MBuckets()
    assert str(b) == "1,2,4,8,16,32,64,+128" and MBuckets.parse(str(b)) == b
    assert [b.of(m) for m in (1, 2, 3, 4, 5, 8, 9, 33, 64, 65, 128, 129, 777, 4096, 4097)] == [
        (1, 1), (2, 2), (3, 4), (3, 4), (5, 8), (5, 8), (9, 16), (33, 64), (33, 64), (65, 128),
        (65, 128), (129, 256), (769, 896), (3969, 4096), (4097, 4224)]
    assert [b.text(m) for m in (1, 3, 100)] == ["1", "3-4", "65-128"]
    exact = MBuckets.parse("exact")
    assert exact.of(777) == (777, 777) and str(exact) == "exact"
    assert MBuckets.parse("1, 8, +100").of(50) == (9, 100)
    # the last bucket ends at the largest M a kernel takes (MAX_DIM), not a step past it
    from codegen.families._common import MAX_DIM

    assert b.of(MAX_DIM - 5) == b.of(MAX_DIM) == (MAX_DIM - 127, MAX_DIM)
    assert MBuckets.parse("1,+1000").of(MAX_DIM - 5)[1] == MAX_DIM


@pytest.mark.parametrize("spec", ["", "1,2,4", "4,2,+128", "1,2,+0", "0,+8", "a,+8", "+x",
                                  "1,2,+128,+5", "+99999999999999999999", "1,4294967296,+8"])
def test_a_bad_bucket_spec_is_one_line(spec, monkeypatch):
    from tuner.runtime.errors import LibraryError

    with pytest.raises(LibraryError, match="give increasing bounds and then") as e:
        MBuckets.parse(spec)
    assert "\n" not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(bounds=st.lists(st.integers(1, 300), max_size=8, unique=True).map(sorted),
       step=st.integers(1, 300), m=st.integers(1, 100_000))
def test_every_m_is_in_exactly_one_bucket(bounds, step, m):
    """Buckets hold their M, tile the Ms without gaps or overlaps, and every M of a bucket
    names that bucket."""
    b = MBuckets(tuple(bounds), step)
    lo, hi = b.of(m)
    assert lo <= m <= hi
    assert b.of(lo) == b.of(hi) == (lo, hi)
    assert lo == 1 or b.of(lo - 1)[1] == lo - 1  # the bucket before ends just below
    assert b.of(hi + 1)[0] == hi + 1  # and the next starts just above


def test_buckets_are_configurable_by_environment_and_argument(lib, monkeypatch):
    from tuner.runtime.errors import LibraryError

    assert lib.m_buckets == MBuckets()
    monkeypatch.setenv("GEMM_TUNE_M_BUCKETS", "1,16,+64")
    assert load_library(lib.path).m_buckets == MBuckets((1, 16), 64)
    assert load_library(lib.path, m_buckets="exact").m_buckets == MBuckets((), 1)
    monkeypatch.setenv("GEMM_TUNE_M_BUCKETS", "16,8")
    with pytest.raises(LibraryError, match="M-buckets '16,8'"):
        load_library(lib.path)


@pytest.mark.parametrize("m0,bucket", [(40, (33, 64)), (300, (257, 384)), (2, (2, 2))])
def test_a_bucket_is_measured_once_and_its_kernel_runs_every_m_in_it(lib, fake, m0, bucket):
    """The first call of a bucket measures at its two ends; every other M of the bucket runs
    the kernel chosen, whole (its grid covers M), with nothing measured again; an M of the
    next bucket is measured anew. explain() names the bucket and both measurements."""
    n, k = 4096, 512
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}
    lo, hi = bucket
    lib.gemm(Cai(m0, k, 0x100000), Cai(k, n, 0x200000), Cai(m0, n, 0x300000))
    assert [x[0][0] for x in fake.measured] == sorted({lo, hi})
    fake.times = {SMALL.name: 9.0, BIG.name: 9.0, "cublas": 0.1}  # would now pick cuBLAS
    for m in range(lo, hi + 1):
        lib.gemm(Cai(m, k, 0x100000), Cai(k, n, 0x200000), Cai(m, n, 0x300000))
        name, grid, *_, args = fake.launches[-1]
        assert (name, grid, args[0]) == (SMALL.name, SMALL.grid(m, n), m)
    assert len(fake.measured) == len({lo, hi}) and fake.blas == []
    said = lib.explain(hi, n, k)
    assert said.startswith(f"{SMALL.name} (measured, ") and f"(M-bucket {lib.m_buckets.text(hi)})" in said
    assert f"at M={hi}: " in said and (lo == hi or f"at M={lo}: " in said)
    lib.gemm(Cai(hi + 1, k, 0x100000), Cai(k, n, 0x200000), Cai(hi + 1, n, 0x300000))
    assert len(fake.blas) == 1 and fake.measured[-1][0][0] == lib.m_buckets.of(hi + 1)[1]


def test_a_kernel_must_win_at_both_ends_of_its_bucket(lib, fake):
    """SMALL is 2x faster than cuBLAS at M = 64 but slower at M = 33: cuBLAS runs the
    bucket. The record line of a call in it has its bucket and the time interpolated."""
    n, k = 4096, 512
    fake.times = {SMALL.name: lambda m: 0.5 if m == 64 else 1.2, BIG.name: 9.0,
                  "cublas": lambda m: m / 50}
    with lib.record(lib.path / "problems.jsonl"):
        lib.gemm(Cai(40, k, 0x100000), Cai(k, n, 0x200000), Cai(40, n, 0x300000))
    assert len(fake.blas) == 1 and fake.launches == []
    (line,) = (json.loads(x) for x in (lib.path / "problems.jsonl").read_text().splitlines())
    assert line["m"] == 40 and line["m_bucket"] == [33, 64]
    assert line["ms_per_call"] == pytest.approx(33 / 50 + (64 - 33) / 50 * (40 - 33) / 31)


@settings(max_examples=200, deadline=None)
@given(layout=st.sampled_from(["nn", "nt", "tn", "tt"]), m=st.integers(1, 700),
       m2=st.integers(1, 700), n=st.integers(1, 300), k=st.integers(1, 300),
       pads=st.tuples(*[st.integers(0, 9)] * 3), offsets=st.tuples(*[st.integers(0, 7)] * 3),
       batch=st.sampled_from([1, 3]), bpads=st.tuples(st.integers(0, 9), st.integers(0, 9)),
       dtype=st.sampled_from([DType.F32, DType.F16]), out=st.sampled_from([DType.F32,
                                                                           DType.F16]))
def test_a_problem_at_another_m_keeps_its_alignment_and_leading_dimension_classes(
        layout, m, m2, n, k, pads, offsets, batch, bpads, dtype, out):
    """The scratch a bucket's other end is measured on: the caller's layout, byte offsets,
    alignment class and leading-dimension class, A's and C's batch strides grown with M
    (each covering a problem), B as it was."""
    from codegen.config import Layout
    from codegen.families._common import Variant
    from tuner.runtime import call
    from tuner.runtime.dispatch import packed_ld
    from tuner.runtime.operands import align_class

    v = Variant(Layout(layout), out)
    ld = tuple(p + x for p, x in zip(packed_ld(v.layout, m, n, k), pads))
    size = dtype.size
    offs = tuple(o * size for o in offsets)
    ta, tb = layout

    def geo(rows, cols, col, ldx, stride, b3):
        strides = (1, ldx) if col else (ldx, 1)
        return ((batch, rows, cols), (stride,) + strides) if b3 else ((rows, cols), strides)

    span_a = (k - 1) * ld[0] + m if ta == "t" else (m - 1) * ld[0] + k
    span_c = (m - 1) * ld[2] + n
    sa = span_a + bpads[0] if batch > 1 else 0
    sc = span_c + bpads[1] if batch > 1 else 0
    geometry = (geo(m, k, ta == "t", ld[0], sa, batch > 1), geo(k, n, tb == "t", ld[1], 0, False),
                geo(m, n, False, ld[2], sc, batch > 1), None)
    sizes = (size, size, out.size)

    def align(ldx, strides):
        return tuple(align_class(o, x, sz, st_) for o, x, sz, st_ in zip(offs, ldx, sizes,
                                                                         strides))

    p = call.Problem(None, dtype, m, n, k, *ld, offs, False, None, True, 0, None, v, batch,
                     (sa, 0, sc), geometry, align(ld, (sa, 0, sc)))
    q = p.at_m(m2)
    assert (q.m, q.n, q.k, q.offsets, q.variant, q.batch) == (m2, n, k, offs, v, batch)
    assert align((q.lda, q.ldb, q.ldc), q.strides) == p.align and (q.ldb, q.ldc) == (p.ldb, p.ldc)
    # tight stays tight, unless (a column-major A's rows of M) that would change the alignment
    moved = ta == "t" and align_class(0, m, size) != align_class(0, m2, size)
    assert q.ld_class[1:] == p.ld_class[1:]
    assert q.ld_class[0] == ("padded" if moved else p.ld_class[0])
    (a_shape, a_st), b_geo, (c_shape, c_st), _ = q.shapes
    assert a_shape[-2:] == (m2, k) and c_shape[-2:] == (m2, n) and b_geo == geometry[1]
    assert a_st[-2:] == ((1, q.lda) if ta == "t" else (q.lda, 1)) and c_st[-2:] == (q.ldc, 1)
    need = (m2 if ta == "t" else k, k if tb == "t" else n, n)
    assert all(x >= y for x, y in zip((q.lda, q.ldb, q.ldc), need))
    if batch > 1:  # each problem of A and C clear of the next
        assert q.strides[0] >= call._span(a_shape, a_st) and q.strides[2] >= call._span(c_shape,
                                                                                         c_st)
        assert (a_st[0], c_st[0]) == (q.strides[0], q.strides[2])


# ---- measuring off: the same decisions in every process ----------------------------------
#: calls of a program: packed fp32 GEMMs, one with padded rows, one NT, one batched
_PROGRAM = [(300, 100, 200, None, False), (40, 4096, 512, None, False),
            (777, 555, 333, 337, False), (16, 4096, 4096, None, True), (100, 70, 50, None, False)]


def _run_program(lib, fake) -> list:
    """(M, N, K, what ran, rule) of each call of _PROGRAM, through lib.gemm."""
    out = []
    for m, n, k, lda, nt in _PROGRAM:
        b = Cai(k, n, 0x200000, column_major=nt)
        lib.gemm(Cai(m, k, 0x100000, ld=lda), b, Cai(m, n, 0x300000))
        plan = next(reversed(lib.plans.values()))
        out.append((m, n, k, plan.choice.kernel or "cuBLAS", plan.choice.rule))
    return out


def _program_in_a_process(path, queue) -> None:
    """A fresh process: the library loaded with GEMM_TUNE_MEASURE=0 (set by the parent),
    _PROGRAM run through a fake GPU whose timer fails if called."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    with pytest.MonkeyPatch.context() as mp:
        fake = FakeGpu(mp)
        mp.setattr(measure, "time_candidates", _no_timing)
        lib = load_library(path)
        queue.put((lib.measure, _run_program(lib, fake), len(fake.measured)))


def _no_timing(*args, **kw):
    raise AssertionError("a first-use measurement with measuring off")


def test_measuring_off_decides_from_the_library_and_table_alike_in_every_process(
        lib, fake, monkeypatch):
    """A program's decisions measured once (prewarm, or a first run) are kept in the
    table; processes started with GEMM_TUNE_MEASURE=0 (ranks of one job) then time
    nothing, write nothing and take exactly those decisions, and the estimate where the
    table has none (NT here: nothing tuned, cuBLAS), each the same."""
    import multiprocessing

    fake.times = {SMALL.name: lambda m: 0.5 if m < 100 else 2.0, BIG.name: 3.0, "cublas": 1.0}
    first = _run_program(lib, fake)
    assert {r[4] for r in first} == {"measured", "cublas"}
    assert {r[3] for r in first} == {SMALL.name, "cuBLAS"}  # each way, by M
    kept = lib.table_path.read_text()
    monkeypatch.setenv("GEMM_TUNE_MEASURE", "0")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_program_in_a_process, args=(lib.path, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    answers = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert answers == [(False, first, 0)] * 2
    assert lib.table_path.read_text() == kept
    # and here, a library loaded with measure=False on a program's new shapes: estimates
    monkeypatch.setattr(measure, "time_candidates", _no_timing)
    off = load_library(lib.path, measure=False)
    again = _run_program(off, fake)
    assert again == first
    off.gemm(Cai(1000, 999, 0x100000), Cai(999, 998, 0x200000), Cai(1000, 998, 0x300000))
    assert next(reversed(off.plans.values())).choice.rule == "estimate"
    assert lib.table_path.read_text() == kept


def test_an_exact_entry_decides_its_own_m_and_explain_says_the_bucket_is_apart(
        lib, fake, compile_cache, tmp_path):
    from _library import entry
    from codegen import compile_config

    res = compile_config(SMALL, "sm_90", compile_cache, tmp_path / "art")
    lib.add(entry(SMALL, res, (300, 256, 256), 20.0, 10.0), tmp_path / "art" / "sm_90" /
            f"{SMALL.name}.cu", res.cubin)
    lib = load_library(lib.path)
    assert lib.explain(300, 256, 256).startswith(f"{SMALL.name} (exact): tuned for exactly")
    assert lib.explain(300, 256, 256).endswith("(the other Ms of its M-bucket, 257-384, are "
                                               "decided apart)")
    fake.times = {SMALL.name: 2.0, BIG.name: 2.0, "cublas": 1.0}
    lib.gemm(Cai(300, 256, 0x100000), Cai(256, 256, 0x200000), Cai(300, 256, 0x300000))
    assert fake.launches[-1][0] == SMALL.name and fake.measured == []
    lib.gemm(Cai(301, 256, 0x100000), Cai(256, 256, 0x200000), Cai(301, 256, 0x300000))
    assert len(fake.blas) == 1 and [x[0][0] for x in fake.measured] == [257, 384]


def test_a_host_pause_in_a_held_loop_is_measured_again(monkeypatch):
    """A host that paused once while queueing a held loop (a collection, another thread)
    gets a second, longer hold: the GPU's time alone is still measured."""
    s = _Stream(0.012)
    _simulated(monkeypatch, s)
    holds = []
    paused = {"once": False}

    def kernel(stream):
        s.run(0.004)
        if holds and not paused["once"]:  # inside the first held loop: a 5 ms pause
            paused["once"] = True
            s.now += 5.0

    ms, device = measure.time_candidates(
        None, {"kernel": kernel, "cublas": lambda st: s.run(0.005)}, stream=7,
        hold=lambda st, t: holds.append(t) or s.hold(st, t), clock=s.clock,
        flush=lambda st: s.run(0.002))
    assert paused["once"] and device == pytest.approx({"kernel": 0.004, "cublas": 0.005},
                                                      rel=1e-6)
    assert max(holds) > 5.0  # the retry's hold outlasted the pause


def test_no_kernel_runs_where_the_gpu_alone_was_not_measured():
    """A kernel that wins a host-paced loop by the margin does not run where the GPU's time
    alone was to be measured and could not be: the loop's figures are the host's, and say
    nothing of what the kernel costs the GPU. Said in the reason."""
    at = {897: {"k": 0.0150, "cublas": 0.0164}, 1024: {"k": 0.0150, "cublas": 0.0160}}
    assert measure.decision(at, "torch")["kernel"] == "k"  # nothing asked of the GPU alone
    d = measure.decision(at, "torch", {897: {}, 1024: {}})
    assert d["kernel"] is None and d["gpu_alone"] == "not measured"
    assert "not measured" in dispatch.measured_choice(d).reason
    # measured at one M only: still no kernel
    assert measure.decision(at, "torch", {897: {}, 1024: {"k": 0.008, "cublas": 0.009}}
                            )["kernel"] is None


@pytest.mark.parametrize("pace,runs", [
    ("either", None),    # the cheaper launch saves more, but 1.34x on the GPU is past the bound
    ("gpu", None),       # a host that runs ahead pays the GPU's 1.34x alone
    ("host", "k"),       # a host-paced loop pays only its own time
])
def test_the_pace_a_program_names_weighs_its_figures(pace, runs):
    """The fp16 1024^3 figures of the H200 (a kernel's C++ path 8.4 against torch's 14.7 us
    a call in the caller's loop; 8.3 against 6.2 us on the GPU alone): which runs depends on
    what the program said sets its pace. The reason says on which figures it was decided."""
    at = {1024: {"k": 0.0084, "cublas": 0.0147}}
    device = {1024: {"k": 0.0083, "cublas": 0.0062}}
    d = measure.decision(at, "torch", device, pace)
    assert d["kernel"] == runs
    reason = dispatch.measured_choice(d).reason
    assert (f"(pace {pace})" in reason) is (pace != "either")
    # on the GPU alone, a kernel that wins there by the margin runs whatever its loop
    won = measure.decision({1024: {"k": 0.02, "cublas": 0.015}}, "torch",
                           {1024: {"k": 0.005, "cublas": 0.0062}}, "gpu")
    assert won["kernel"] == "k"
    # the GPU's time not measured: with pace gpu nothing tells a kernel's cost, cuBLAS runs
    assert measure.decision(at, "torch", {1024: {}}, "gpu")["kernel"] is None
    assert measure.decision(at, "torch", None, "gpu")["kernel"] is None
    assert measure.decision(at, "torch", {1024: {}}, "host")["kernel"] == "k"


def test_a_library_keeps_the_decisions_of_each_pace_apart(tmp_path, compile_cache, fake,
                                                          monkeypatch):
    """load_library(..., pace=...) or GEMM_TUNE_PACE: a program that says its GPU sets the
    pace gets decisions of its own (the table's key names the pace), and another word is a
    one-line LibraryError naming where it came from."""
    from tuner.runtime.errors import LibraryError

    build(tmp_path / "library", compile_cache, tmp_path / "art")
    m, n, k = 777, 555, 333
    call = Cai(m, k, 0x100000), Cai(k, n, 0x200000), Cai(m, n, 0x300000)
    fake.times = {SMALL.name: 0.5, BIG.name: 0.9, "cublas": 0.8}  # SMALL's loop: faster
    fake.device_times = {SMALL.name: 0.83, BIG.name: 0.95, "cublas": 0.8}  # GPU: slower
    either = load_library(tmp_path / "library")
    either.gemm(*call)
    assert fake.launches[-1][0] == SMALL.name  # saves 0.3 ms a call, costs 0.03
    monkeypatch.setenv("GEMM_TUNE_PACE", "gpu")
    gpu = load_library(tmp_path / "library")
    blas = len(fake.blas)
    gpu.gemm(*call)
    assert len(fake.blas) == blas + 1  # measured again, under its own key: cuBLAS
    keys = sorted(_decisions(gpu))
    assert len(keys) == 2 and sum(key.endswith("|pace gpu") for key in keys) == 1
    assert "(pace gpu)" in gpu.explain(*call) and "pace" not in either.explain(*call)
    monkeypatch.setenv("GEMM_TUNE_PACE", "cpu")
    with pytest.raises(LibraryError, match=r"^GEMM_TUNE_PACE='cpu': expected one of either, "
                                           r"gpu, host$"):
        load_library(tmp_path / "library")
    with pytest.raises(LibraryError, match=r"^pace='fast'"):
        load_library(tmp_path / "library", pace="fast")


def test_the_cli_offers_the_paces_measure_knows(tmp_path, monkeypatch, capsys):
    """`gemm-tune prewarm --pace` offers measure's paces; a GEMM_TUNE_PACE of another word
    is a one-line error and exit status 2 before anything is measured."""
    from tuner.cli import build_subparsers, main

    sub = next(a for a in build_subparsers()._actions if a.dest == "command")
    pace = next(a for a in sub.choices["prewarm"]._actions if a.dest == "pace")
    assert tuple(pace.choices) == measure.PACES
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("64x64x64\n")
    monkeypatch.setenv("GEMM_TUNE_PACE", "cpu")
    code = main(["prewarm", "--shapes", str(shapes), "--library",
                 str(Path(__file__).parent.parent / "artifacts" / "library")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "GEMM_TUNE_PACE='cpu'" in err
