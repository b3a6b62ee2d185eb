"""A program's recorded problems as a tuning plan: lines merged across processes and runs,
the costliest first, their variants (layout, C's type, epilogue, batch) read and tuned,
what no family builds and a spent budget said so, a killed run resumed from the cache;
bad files are one line and exit status 2."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from codegen.config import DType, Layout
from codegen.errors import UsageError
from codegen.families._common import Variant
from tuner._shape import Task
from tuner.problems import merge, read_problems


def _line(m, n, k, calls, ms, dtype="f32", layout="nn", gpu="NVIDIA H200", **more):
    return json.dumps(dict(gpu=gpu, dtype=dtype, layout=layout, m=m, n=n, k=k, calls=calls,
                           ms=ms, align=[16, 16, 16], pid=1, **more))


@pytest.fixture
def nn_only(monkeypatch):
    """Every family as if its template read NN operands only and wrote fp32 C only (as
    the tensor-core ones did before their epilogues)."""
    from codegen import families

    for name, spec in list(families.FAMILIES.items()):
        monkeypatch.setitem(families.FAMILIES, name, dataclasses.replace(
            spec, layouts=frozenset({Layout.NN}), epilogue=False))


def test_lines_of_one_problem_merge_and_the_costliest_comes_first():
    lines = [_line(16, 4096, 4096, 100, 2.5), _line(4096, 4096, 4096, 3, 2.0),
             "", "# a comment", _line(16, 4096, 4096, 50, 1.25),  # another process
             _line(16, 4096, 4096, 7, 0.5, dtype="f16"), _line(64, 64, 64, 9, 9.0, layout="nt")]
    plan = merge(lines)
    assert [(p.label, p.calls, p.ms, p.lines) for p in plan] == [
        ("64x64x64 f32 nt C f32", 9, 9.0, 1), ("16x4096x4096 f32 nn C f32", 150, 3.75, 2),
        ("4096x4096x4096 f32 nn C f32", 3, 2.0, 1), ("16x4096x4096 f16 nn C f32", 7, 0.5, 1)]
    assert plan[0].why_not() is None  # the CUDA-core family reads every layout
    assert plan[1].why_not() is None and plan[1].dtype is DType.F32
    assert plan[1].layout is Layout.NN and plan[1].gpus == {"NVIDIA H200"}


def test_a_records_variant_is_its_own_problem():
    """layout, out, epilogue and batch (the run path's record fields) name the problem; a
    line without them (an older record) is the plain one: nn, fp32 C, none, 1."""
    lines = [_line(16, 4096, 4096, 10, 1.0, dtype="f16", layout="nt", out="f16",
                   epilogue="bias+gelu", batch=8),
             _line(16, 4096, 4096, 5, 0.5, dtype="f16", layout="nt", out="f16",
                   epilogue="bias+gelu", batch=8, gpu="other"),
             _line(16, 4096, 4096, 3, 0.4, dtype="f16", layout="nt", out="f16",
                   epilogue="bias+gelu", batch=8, broadcast_b=True),
             _line(16, 4096, 4096, 2, 0.3, dtype="bf16", out="bf16", epilogue="biasf32+silu"),
             _line(16, 4096, 4096, 1, 0.2, dtype="f32", out="f32", epilogue="biasf32"),
             _line(16, 4096, 4096, 1, 0.1, dtype="f16", epilogue="relu", out="bf16"),
             json.dumps(dict(dtype="f32", m=8, n=8, k=8, calls=1, ms=0.05))]
    plan = merge(lines)
    assert [(p.label, p.calls, p.lines) for p in plan] == [
        ("16x4096x4096 f16 nt C f16 bias+gelu batch 8", 15, 2),
        ("16x4096x4096 f16 nt C f16 bias+gelu batch 8, B shared", 3, 1),
        ("16x4096x4096 bf16 nn C bf16 biasf32+silu", 2, 1),
        ("16x4096x4096 f32 nn C f32 bias", 1, 1),  # an fp32 bias with fp32 C is C's type
        ("16x4096x4096 f16 nn C bf16 relu", 1, 1),
        ("8x8x8 f32 nn C f32", 1, 1)]
    t = plan[0].task
    assert t == Task(DType.F16, (16, 4096, 4096), Variant(Layout.NT, DType.F16, "out", "gelu"), 8)
    assert t.flops == 2.0 * 16 * 4096 * 4096 * 8 and plan[0].flops == t.flops * 15
    assert plan[2].task.variant == Variant(Layout.NN, DType.BF16, "f32", "silu")
    assert plan[-1].task == Task(DType.F32, (8, 8, 8))
    assert all(p.why_not() is None for p in plan)  # the CUDA-core family builds them all


def test_what_no_family_builds_is_skipped_with_the_reason(nn_only):
    plan = merge([_line(64, 64, 64, 9, 9.0, layout="nt"),
                  _line(64, 64, 64, 9, 8.0, dtype="f16", out="f16", epilogue="relu"),
                  _line(64, 64, 64, 9, 7.0)])
    assert plan[0].why_not() == ("no family builds it (the simt template reads nn operands, "
                                 "not nt): cuBLAS serves it")
    why = plan[1].why_not()
    assert why.startswith("no family builds it (") and why.endswith("): cuBLAS serves it")
    assert "the wmma template writes fp32 C with no bias or activation" in why
    assert plan[2].why_not() is None


@pytest.mark.parametrize("fields,msg", [
    (dict(out="f64"), "C cannot be 'f64'"),
    (dict(out="tf32"), "C cannot be 'tf32'"),
    (dict(epilogue="bias+tanh"), "epilogue 'bias+tanh' is not bias, an activation"),
    (dict(epilogue="gelu+relu"), "epilogue 'gelu+relu' is not bias"),
    (dict(batch=0), "--batch must be at least 1"),
    (dict(batch="x"), "--batch must be a whole number"),
    (dict(layout="NX"), "unknown layout 'NX'"),
])
def test_a_bad_variant_in_a_record_is_one_error_naming_the_line(tmp_path, fields, msg):
    path = tmp_path / "p.jsonl"
    path.write_text(_line(4, 4, 4, 1, 1.0) + "\n" + _line(4, 4, 4, 1, 1.0, **fields) + "\n")
    with pytest.raises(UsageError, match="line 2: not a recorded problem \\(" + msg.replace(
            "(", r"\(").replace("+", r"\+")):
        read_problems(path)


def test_without_recorded_times_the_work_orders_them():
    plan = merge([_line(16, 4096, 4096, 100, None), _line(4096, 4096, 4096, 3, 2.0)])
    assert [p.shape for p in plan] == [(4096, 4096, 4096), (16, 4096, 4096)]  # 4.1e11 > 5.4e10
    assert plan[1].ms is None


@pytest.mark.parametrize("text,msg", [
    ("{not json", "line 1: not a recorded problem"),
    (_line(0, 4, 4, 1, 1.0), "line 1: not a recorded problem (M must be at least 1"),
    ("\n" + _line(4, 4, 4, 1, 1.0, dtype="int7"), "line 2: not a recorded problem (unknown dtype"),
    (_line(4, 4, 4, 1, 1.0, layout="xy"), "line 1: not a recorded problem"),
    (_line(4, 4, 4, -1, 1.0), "line 1: calls must be at least 0"),
    (_line(4, 4, 4, 1e400, 1.0), "line 1: calls must be at least 0, a whole number (got inf"),
    (_line(4, 4, 4, 2.7, 1.0), "line 1: calls must be at least 0, a whole number (got 2.7"),
    (_line(4, 4, 4, 1, "x"), "line 1: ms must be milliseconds, at least 0 (got 'x'"),
    (_line(4, 4, 4, 1, [1]), "line 1: ms must be milliseconds"),
    (_line(4, 4, 4, 1, 1.0, gpu=["a"]), "line 1: gpu must name a GPU (got "),
    (_line(4, 4, 4, 1, 1.0, batch=2.5), "line 1: not a recorded problem (--batch must be a "
                                        "whole number (got 2.5"),
    ("[" * 100_000 + "]" * 100_000, "line 1: not a recorded problem (maximum recursion depth"),
    ('{"dtype": "f32", "m": 4, "n": 4}', "line 1: not a recorded problem (no 'k' field"),
    ("# only a comment\n", "names no problem"),
])
def test_a_bad_record_file_is_one_error_naming_the_line(tmp_path, text, msg):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=msg.replace("(", r"\(")):
        read_problems(path)


def test_problems_differing_only_in_m_merge_by_m_bucket_at_its_largest_m():
    """A serving loop's Ms (tokens) share one problem per M-bucket, tuned at the bucket's
    largest M, with the calls and time of every M in it; another N, K, dtype or variant
    stays apart; "exact" buckets keep each M; the label names the Ms recorded."""
    from tuner.runtime.dispatch import MBuckets

    lines = [_line(m, 4096, 4096, 10, 0.1 * m, dtype="f16", out="f16")
             for m in (1, 3, 4, 5, 40, 48, 64, 65, 1000)]
    lines += [_line(40, 4096, 1024, 1, 0.5, dtype="f16", out="f16"),
              _line(40, 4096, 4096, 1, 0.5, dtype="f16", out="f16", layout="nt")]
    plan = merge(lines, buckets=MBuckets())
    got = {(p.shape, p.layout.value): (sorted(p.recorded_m), p.calls) for p in plan}
    assert got == {
        ((1, 4096, 4096), "nn"): ([1], 10), ((4, 4096, 4096), "nn"): ([3, 4], 20),
        ((8, 4096, 4096), "nn"): ([5], 10), ((64, 4096, 4096), "nn"): ([40, 48, 64], 30),
        ((128, 4096, 4096), "nn"): ([65], 10), ((1024, 4096, 4096), "nn"): ([1000], 10),
        ((64, 4096, 1024), "nn"): ([40], 1), ((64, 4096, 4096), "nt"): ([40], 1)}
    by = {p.shape: p for p in plan if p.layout is Layout.NN and p.shape[2] == 4096}
    assert by[(64, 4096, 4096)].ms == pytest.approx(0.1 * (40 + 48 + 64))
    assert by[(64, 4096, 4096)].label == "64x4096x4096 f16 nn C f16 (M 40, 48, 64 recorded)"
    assert by[(1, 4096, 4096)].label == "1x4096x4096 f16 nn C f16"
    assert by[(8, 4096, 4096)].label == "8x4096x4096 f16 nn C f16 (M 5 recorded)"
    assert plan[0].shape == (1024, 4096, 4096)  # the costliest first: 100 ms
    exact = merge(lines, buckets=MBuckets.parse("exact"))
    assert len(exact) == len(merge(lines)) == 11
    assert {p.shape[0] for p in exact if p.shape[2] == 4096 and p.layout is Layout.NN} == {
        1, 3, 4, 5, 40, 48, 64, 65, 1000}


def test_the_cli_tunes_by_the_buckets_asked_and_refuses_them_without_problems(
        tmp_path, capsys, monkeypatch):
    import tuner.tune as tt
    from tuner.cli import main

    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(_line(m, 64, 64, 1, 1.0) for m in (5, 6, 9)) + "\n")
    seen = []
    monkeypatch.setattr(tt, "run_problems",
                        lambda args, problems, art: seen.append([p.shape[0] for p in problems]))
    main(["tune", "--problems", str(f)])
    main(["tune", "--problems", str(f), "--m-buckets", "exact"])
    monkeypatch.setenv("GEMM_TUNE_M_BUCKETS", "16,+64")
    main(["tune", "--problems", str(f)])
    assert [sorted(x) for x in seen] == [[8, 16], [5, 6, 9], [16]]
    assert main(["--shape", "64x64x64", "--m-buckets", "exact"]) == 2
    assert capsys.readouterr().err.strip() == \
        "gemm-tune: error: --m-buckets goes with --problems FILE"
    assert main(["tune", "--problems", str(f), "--m-buckets", "9,3"]) == 2
    assert "M-buckets '9,3': give increasing bounds" in capsys.readouterr().err


def test_the_cli_reports_a_bad_or_missing_file_in_one_line(tmp_path, capsys):
    from tuner.cli import main

    missing = tmp_path / "none.jsonl"
    assert main(["tune", "--problems", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gemm-tune: error: --problems {missing}: cannot read it")
    assert "\n" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_line(4, 4, 4, 1, 1.0) + "\n{oops\n")
    assert main(["tune", "--problems", str(bad)]) == 2
    assert "line 2: not a recorded problem" in capsys.readouterr().err
    assert main(["--problems", str(bad), "--shape", "4x4x4"]) == 2
    assert "--problems takes no --shape" in capsys.readouterr().err


class _FakeSession:
    """tune._Session without a GPU: each problem 'tunes' for 10 clock seconds (its winner
    named `prefix`_M), unless the cache (a set of shapes) answers it."""

    def __init__(self, clock, cached=(), prefix="k"):
        self.clock, self.cached, self.tuned, self.prefix = clock, set(cached), [], prefix
        self.timeouts = []  # the search time each problem was given
        self.out = None

    def key(self, task):
        return f"fake|{task.label}"

    def result(self, task, timeout=None):
        self.timeouts.append(timeout)
        if task in self.cached:
            return dict(winner=dict(name="k_cached", tflops=1.0, ratio=1.5), from_cache=True)
        self.clock.t += 10.0
        self.tuned.append(task)
        self.cached.add(task)
        return dict(winner=dict(name=f"{self.prefix}_{task.shape[0]}", tflops=2.0, ratio=1.1),
                    from_cache=False)


class _Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _run(monkeypatch, capsys, problems, session, budget, **shared):
    import tuner.tune as tt

    monkeypatch.setattr(tt, "_Session", lambda args, artifacts: session)
    args = SimpleNamespace(budget=budget, json=True, **shared)
    assert tt.run_problems(args, problems, None, clock=session.clock) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_problems_are_tuned_costliest_first_within_the_budget_and_resume(monkeypatch, capsys,
                                                                         nn_only):
    lines = [_line(16, 4096, 4096, 100, 30.0), _line(4096, 4096, 4096, 3, 20.0),
             _line(64, 64, 64, 9, 9.0, layout="nt"), _line(1024, 1024, 1024, 5, 5.0)]
    clock = _Clock()
    session = _FakeSession(clock)
    rows, err = _run(monkeypatch, capsys, merge(lines), session, budget=15.0)
    # the first two fit (0 s and 10 s spent when they start); no family (here) reads the nt
    # one; the last finds the budget spent
    assert [r["problem"] for r in rows] == ["16x4096x4096 f32 nn C f32",
                                            "4096x4096x4096 f32 nn C f32",
                                            "64x64x64 f32 nt C f32", "1024x1024x1024 f32 nn C f32"]
    assert [r.get("kernel") for r in rows] == ["k_16", "k_4096", None, None]
    assert rows[2]["skipped"].startswith("no family builds it") and rows[2]["layout"] == "nt"
    assert "--budget of 15 s" in rows[3]["skipped"]
    assert rows[0]["seconds"] == 10.0 and rows[0]["from_cache"] is False
    assert "gemm-tune: problem 1/4: 16x4096x4096 f32 nn C f32 (100 calls)" in err
    # run again (after a kill, or with more budget): the tuned ones answer from the cache
    rows, _ = _run(monkeypatch, capsys, merge(lines), session, budget=15.0)
    assert [r.get("from_cache") for r in rows] == [True, True, None, False]
    assert session.tuned[-1] == Task(DType.F32, (1024, 1024, 1024))


def test_the_budget_is_shared_by_work_with_a_floor_and_a_cap(monkeypatch, capsys, nn_only):
    """Each problem's search gets what is left of --budget in proportion to its work among
    the problems from it on (recorded ms where every one has it, else FLOPs x calls), at
    least MIN_SHARE_S and at most --timeout; without a budget, --timeout."""
    from tuner.tune import MIN_SHARE_S

    lines = [_line(16, 4096, 4096, 100, 60.0), _line(4096, 4096, 4096, 3, 30.0),
             _line(1024, 1024, 1024, 5, 10.0)]
    session = _FakeSession(_Clock())  # each tune takes 10 clock seconds
    _run(monkeypatch, capsys, merge(lines), session, budget=200.0, timeout=540.0)
    # 200 s for 60:30:10 ms; then 190 s for 30:10; then 180 s alone
    assert session.timeouts == [pytest.approx(120.0), pytest.approx(142.5),
                                pytest.approx(180.0)]
    session = _FakeSession(_Clock())
    _run(monkeypatch, capsys, merge(lines), session, budget=200.0, timeout=100.0)
    assert session.timeouts == [100.0, 100.0, 100.0]  # --timeout caps each
    session = _FakeSession(_Clock())
    _run(monkeypatch, capsys, merge(lines), session, budget=30.0, timeout=540.0)
    assert session.timeouts == [pytest.approx(MIN_SHARE_S)] * 3  # 18, 15, 10 s: the floor
    # a problem recorded without its time: FLOPs x calls decide for all
    lines[2] = _line(1024, 1024, 1024, 5, None)
    session = _FakeSession(_Clock())
    _run(monkeypatch, capsys, merge(lines), session, budget=1000.0, timeout=5000.0)
    work = [3 * 4096 ** 3, 100 * 16 * 4096 * 4096, 5 * 1024 ** 3]  # the order they run in
    assert session.timeouts[:2] == [pytest.approx(1000.0 * work[0] / sum(work)),
                                    pytest.approx(990.0 * work[1] / sum(work[1:]))]
    session = _FakeSession(_Clock())
    _run(monkeypatch, capsys, merge(lines), session, budget=None)
    assert session.timeouts == [None, None, None]  # the session's own --timeout


def test_a_shared_set_is_split_between_workers_who_show_each_others_winners(
        monkeypatch, capsys, tmp_path, nn_only):
    """With --storage, a second worker (another host: its own cache) tunes only what the
    first left (it ran out of budget), and both show every problem that is done."""
    lines = [_line(16, 4096, 4096, 100, 30.0), _line(4096, 4096, 4096, 3, 20.0),
             _line(64, 64, 64, 9, 9.0, layout="nt"), _line(1024, 1024, 1024, 5, 5.0)]
    shared = dict(storage=f"sqlite:///{tmp_path / 'p.db'}", study=None, lease=3.0)
    first = _FakeSession(_Clock(), prefix="first")
    rows, err = _run(monkeypatch, capsys, merge(lines), first, budget=15.0, **shared)
    assert [r.get("kernel") for r in rows] == ["first_16", "first_4096", None, None]
    assert "--budget of 15 s" in rows[3]["skipped"]
    me = rows[0]["worker"]
    second = _FakeSession(_Clock(), prefix="second")
    rows, err = _run(monkeypatch, capsys, merge(lines), second, budget=None, **shared)
    assert second.tuned == [Task(DType.F32, (1024, 1024, 1024))]  # only what was left
    assert [r.get("kernel") for r in rows] == ["first_16", "first_4096", None, "second_1024"]
    assert [r.get("worker") for r in rows] == [me, me, None, me]  # (one process here)
    assert rows[0]["seconds"] == 10.0 and rows[1]["ratio"] == 1.1
    assert "problem 1/4: 16x4096x4096 f32 nn C f32 (100 calls): tuned by " in err
    assert rows[2]["skipped"].startswith("no family builds it")


def test_a_problem_held_by_a_silent_worker_is_taken_over_once_its_lease_runs_out(
        monkeypatch, capsys, tmp_path, nn_only):
    """A problem claimed by a worker that never renews its lease (killed) is waited for,
    then, after --lease seconds, failed, claimed and tuned by this one."""
    import optuna

    from tuner._shared_problems import DEFAULT_STUDY
    from tuner._study import SharedStudy, open_storage

    url = f"sqlite:///{tmp_path / 'p.db'}"
    storage = open_storage(url)
    sid = optuna.create_study(storage=storage, study_name=DEFAULT_STUDY)._study_id
    ghost = SharedStudy(storage, sid, worker="ghost:1")
    lines = [_line(16, 4096, 4096, 100, 30.0), _line(1024, 1024, 1024, 5, 5.0)]
    held = merge(lines)[1].task
    assert ghost.claim(f"fake|{held.label}", {}, {}, {}, None)[1] is None
    session = _FakeSession(_Clock())
    rows, err = _run(monkeypatch, capsys, merge(lines), session, budget=None, storage=url,
                     study=None, lease=0.6)
    assert "problem 2/2: 1024x1024x1024 f32 nn C f32 (5 calls): held by ghost:1, waiting" in err
    assert session.tuned == [merge(lines)[0].task, held]
    assert [r["kernel"] for r in rows] == ["k_16", "k_1024"]
    trials = storage.get_all_trials(sid)
    assert [(t.state.name, t.user_attrs.get("outcome")) for t in trials] == [
        ("FAIL", None), ("COMPLETE", "tuned"), ("COMPLETE", "tuned")]
    assert "released: worker ghost:1 stopped renewing its lease" in trials[0].user_attrs["reason"]


def _tune_args(tmp_path, **kw):
    args = dict(budget=None, json=True, force=False, cache=None, library=None, devices=None,
                arch=None, trials=6, timeout=120.0, sampler="grid", seed=0, jobs=1,
                storage=None, study=None, lease=60.0, no_model=True, top=3,
                kernel_timeout=60.0)
    args.update(kw)
    return SimpleNamespace(**args)


def test_recorded_variants_are_tuned_through_a_fake_gpu_into_the_cache_and_library(
        tmp_path, monkeypatch, capsys):
    """tune.run_problems end to end but for the GPU: each recorded problem's search (a
    fake GPU that refuses any config of another variant, times the model's prediction at
    the batch, and a compile that writes fake artifacts), confirm, the cache under a key
    with the variant and batch, the library entry with its fields; a second run answers
    from the cache."""
    import tuner.gpu
    import tuner.tune as tt
    from _fakes import VariantBenchmark
    from codegen import parse_arch
    from codegen.families import family_of
    from tuner.runtime.library import Library

    dev = SimpleNamespace(name="Fake H200", cc=90, sm="sm_90", arch=parse_arch("sm_90"),
                          l2_bytes=50 << 20)
    monkeypatch.setattr(tuner.gpu, "device", lambda: dev)
    monkeypatch.setattr(tt, "_check_fits", lambda *a, **k: None)
    benches = []

    def fake_tune(args, task, artifacts, dev, key, devices):
        bench = VariantBenchmark(task.shape, variant=task.variant, batch=task.batch,
                                 broadcast_b=task.broadcast_b)
        benches.append(bench)
        return tt._tune_with(args, task, artifacts, dev, key, [bench])

    monkeypatch.setattr(tt, "_tune", fake_tune)
    lines = [_line(64, 128, 64, 10, 5.0, dtype="f16", layout="nt", out="f16",
                   epilogue="bias+gelu", batch=4),
             _line(32, 64, 48, 10, 1.0, dtype="f32", layout="tn", out="f32", epilogue="relu",
                   batch=3, broadcast_b=True)]
    art = tmp_path / "art"
    assert tt.run_problems(_tune_args(tmp_path), merge(lines), art) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["problem"] for r in rows] == ["64x128x64 f16 nt C f16 bias+gelu batch 4",
                                            "32x64x48 f32 tn C f32 relu batch 3, B shared"]
    assert [(r["layout"], r["out"], r["bias"], r["act"], r["batch"], r["broadcast_b"])
            for r in rows] == [("nt", "f16", "out", "gelu", 4, False),
                               ("tn", "f32", "none", "relu", 3, True)]
    assert rows[0]["kernel"].endswith("_nt_of16_bias_gelu") and rows[1]["kernel"].endswith(
        "_tn_relu")
    assert all(not r["from_cache"] for r in rows)
    wants = [Variant(Layout.NT, DType.F16, "out", "gelu"), Variant(Layout.TN, DType.F32, "none",
                                                                    "relu")]
    for bench, want in zip(benches, wants):  # every timed config is of the problem's variant
        assert bench.measured and {Variant.of(c) for c in bench.measured} == {want}
        assert all(family_of(c).epilogue for c in bench.measured)
    assert benches[0].batch == 4 and benches[1].broadcast_b
    # the cache: keyed by the variant and batch
    cached = json.loads((art / "cache.json").read_text())["entries"]
    keys = list(cached)
    assert len(keys) == 2
    for entry in cached.values():  # each step's time
        stats = entry["result"]["stats"]
        assert set(stats["steps_s"]) == {"workers", "search", "save study", "confirm"}
        assert min(stats["steps_s"].values()) >= 0
        assert stats["steps_s"]["search"] >= stats["seconds"] - 0.1
    assert keys[0].endswith("|f16|nt|64x128x64|f16|out|gelu|batch 4")
    assert keys[1].endswith("|f32|tn|32x64x48|f32|none|relu|batch 3 B shared")
    # the library: the entries carry the variant and the batch
    entries = Library.load(art / "library").manifest["entries"]
    assert sorted((e["dtype"], e["layout"], e["out"], e["bias"], e["act"], e["batch"],
                   e["broadcast_b"], e["kernel"]) for e in entries) == sorted(
        ("f16" if r["out"] == "f16" else "f32", r["layout"], r["out"], r["bias"], r["act"],
         r["batch"], r["broadcast_b"], r["kernel"]) for r in rows)
    # run again: both answer from the cache
    assert tt.run_problems(_tune_args(tmp_path), merge(lines), art) == 0
    assert [r["from_cache"] for r in json.loads(capsys.readouterr().out)] == [True, True]
    assert len(benches) == 2
    # ... into another library: the cache's winners are added to it, which lacked them (the
    # first's files compiled again: the artifacts no longer hold them)
    gone = list((art / "sm_90").glob(f"{rows[0]['kernel']}.*"))
    assert {f.suffix for f in gone} >= {".cu", ".cubin"}
    for f in gone:
        f.unlink()
    other = tmp_path / "other-library"
    assert tt.run_problems(_tune_args(tmp_path, library=other), merge(lines), art) == 0
    assert [r["from_cache"] for r in json.loads(capsys.readouterr().out)] == [True, True]
    assert sorted(e["kernel"] for e in Library.load(other).manifest["entries"]) == sorted(
        r["kernel"] for r in rows)
    assert len(benches) == 2
    # the tune's table says the problem (C's type among it) and what cuBLAS was timed doing
    task = merge(lines)[0].task
    assert tt.run_cli(_tune_args(tmp_path, json=False), [task], art) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "gemm-tune 64x128x64 f16 nt C f16 bias+gelu batch 4 on Fake H200 (from cache)" in out
    assert ("cuBLAS (cublasGemmStridedBatchedEx (batch 4), fp16 inputs, COMPUTE_32F, op(B)=T, "
            "fp16 C; GEMM alone: without the bias and gelu (not fused by cuBLAS))") in out
    # a re-tune into the library (past the cache) times the kernel it holds first, so it
    # is replaced only by a faster one; another GPU model's entry seeds nothing
    from codegen.config import config_from_name

    held = config_from_name(rows[0]["kernel"])
    assert tt._library_seeds(_tune_args(tmp_path), art, task, dev) == (held,)
    other = SimpleNamespace(**{**vars(dev), "name": "Fake H100"})
    assert tt._library_seeds(_tune_args(tmp_path), art, task, other) == ()
    # ... and the kernel the entry replaced, second (a replaced entry of another shape: none)
    manifest = art / "library" / "manifest.json"
    saved, doc = manifest.read_text(), json.loads(manifest.read_text())
    was = dataclasses.replace(held, stages=held.stages + 1)
    entry = next(e for e in doc["entries"] if e["kernel"] == held.name)
    elsewhere = dataclasses.replace(held, stages=held.stages + 2)
    doc["replaced"] = [dict(entry, kernel=was.name), dict(entry, kernel=elsewhere.name, m=8)]
    manifest.write_text(json.dumps(doc))
    assert tt._library_seeds(_tune_args(tmp_path), art, task, dev) == (held, was)
    manifest.write_text(saved)
    assert tt.run_problems(_tune_args(tmp_path, force=True, sampler="tpe"), merge(lines[:1]),
                           art) == 0
    assert benches[-1].measured[0] == held


def test_a_studies_file_that_is_not_sqlite_stops_a_tune_before_its_search(tmp_path):
    """The artifacts' studies.db is written when a search ends: one that is not SQLite is
    said before the search starts, in one line, and kept (saving the study had failed after
    the whole search, with a traceback)."""
    import tuner.tune as tt
    from _fakes import VariantBenchmark
    from codegen import parse_arch

    art = tmp_path / "art"
    art.mkdir()
    (art / "studies.db").write_text("not a database\n")
    dev = SimpleNamespace(name="Fake H200", cc=90, sm="sm_90", arch=parse_arch("sm_90"),
                          l2_bytes=50 << 20)
    task = Task(DType.F32, (64, 64, 64), Variant(Layout.NN, DType.F32, "none", "none"), 1)
    bench = VariantBenchmark(task.shape, variant=task.variant)
    with pytest.raises(UsageError, match=f"studies {art / 'studies.db'} is not an SQLite "
                                         "database: move it aside") as e:
        tt._tune_with(_tune_args(tmp_path), task, art, dev, "key", [bench])
    assert "\n" not in str(e.value) and not bench.measured
    assert (art / "studies.db").read_text() == "not a database\n"
