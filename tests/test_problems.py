"""A program's recorded problems as a tuning plan: lines merged across processes and runs,
the costliest first, untunable layouts and a spent budget said so, a killed run resumed
from the cache; bad files are one line and exit status 2."""

import json
from types import SimpleNamespace

import pytest

from codegen.config import DType, Layout
from codegen.errors import UsageError
from tuner.problems import merge, read_problems


def _line(m, n, k, calls, ms, dtype="f32", layout="nn", gpu="NVIDIA H200"):
    return json.dumps(dict(gpu=gpu, dtype=dtype, layout=layout, m=m, n=n, k=k, calls=calls,
                           ms=ms, align=[16, 16, 16], pid=1))


def test_lines_of_one_problem_merge_and_the_costliest_comes_first():
    lines = [_line(16, 4096, 4096, 100, 2.5), _line(4096, 4096, 4096, 3, 2.0),
             "", "# a comment", _line(16, 4096, 4096, 50, 1.25),  # another process
             _line(16, 4096, 4096, 7, 0.5, dtype="f16"), _line(64, 64, 64, 9, 9.0, layout="nt")]
    plan = merge(lines)
    assert [(p.label, p.calls, p.ms, p.lines) for p in plan] == [
        ("64x64x64 f32 nt", 9, 9.0, 1), ("16x4096x4096 f32 nn", 150, 3.75, 2),
        ("4096x4096x4096 f32 nn", 3, 2.0, 1), ("16x4096x4096 f16 nn", 7, 0.5, 1)]
    assert plan[0].why_not().startswith("layout nt: no family's template reads it yet")
    assert plan[1].why_not() is None and plan[1].dtype is DType.F32
    assert plan[1].layout is Layout.NN and plan[1].gpus == {"NVIDIA H200"}


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
    ("# only a comment\n", "names no problem"),
])
def test_a_bad_record_file_is_one_error_naming_the_line(tmp_path, text, msg):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=msg.replace("(", r"\(")):
        read_problems(path)


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
    """tune._Session without a GPU: each problem 'tunes' for 10 clock seconds, unless the
    cache (a set of shapes) answers it."""

    def __init__(self, clock, cached=()):
        self.clock, self.cached, self.tuned = clock, set(cached), []
        self.out = None

    def result(self, shape, dtype):
        if shape in self.cached:
            return dict(winner=dict(name="k_cached", tflops=1.0, ratio=1.5), from_cache=True)
        self.clock.t += 10.0
        self.tuned.append((shape, dtype))
        self.cached.add(shape)
        return dict(winner=dict(name=f"k_{shape[0]}", tflops=2.0, ratio=1.1), from_cache=False)


class _Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _run(monkeypatch, capsys, problems, session, budget):
    import tuner.tune as tt

    monkeypatch.setattr(tt, "_Session", lambda args, artifacts: session)
    args = SimpleNamespace(budget=budget, json=True)
    assert tt.run_problems(args, problems, None, clock=session.clock) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_problems_are_tuned_costliest_first_within_the_budget_and_resume(monkeypatch, capsys):
    lines = [_line(16, 4096, 4096, 100, 30.0), _line(4096, 4096, 4096, 3, 20.0),
             _line(64, 64, 64, 9, 9.0, layout="nt"), _line(1024, 1024, 1024, 5, 5.0)]
    clock = _Clock()
    session = _FakeSession(clock)
    rows, err = _run(monkeypatch, capsys, merge(lines), session, budget=15.0)
    # the first two fit (0 s and 10 s spent when they start); the nt one is untunable; the
    # last finds the budget spent
    assert [r["problem"] for r in rows] == ["16x4096x4096 f32 nn", "4096x4096x4096 f32 nn",
                                            "64x64x64 f32 nt", "1024x1024x1024 f32 nn"]
    assert [r.get("kernel") for r in rows] == ["k_16", "k_4096", None, None]
    assert rows[2]["skipped"].startswith("layout nt") and "--budget of 15 s" in rows[3]["skipped"]
    assert rows[0]["seconds"] == 10.0 and rows[0]["from_cache"] is False
    assert "gemm-tune: problem 1/4: 16x4096x4096 f32 nn (100 calls)" in err
    # run again (after a kill, or with more budget): the tuned ones answer from the cache
    rows, _ = _run(monkeypatch, capsys, merge(lines), session, budget=15.0)
    assert [r.get("from_cache") for r in rows] == [True, True, None, False]
    assert session.tuned[-1] == ((1024, 1024, 1024), DType.F32)
