"""bench/layouts_epilogues.py without a GPU: a row's race (each candidate checked, the
fastest raced against the peer, the product's call beside them) and, for the linear rows,
the back-to-back regime beside the flushed one; the summary's bars."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import layouts_epilogues as bench  # noqa: E402


class _T:
    """The few tensor operations race() uses, over a numpy array."""

    def __init__(self, a):
        self.a = np.asarray(a, dtype=np.float64)

    def fill_(self, v):
        self.a[...] = v

    def double(self):
        return _T(self.a)

    def __sub__(self, other):
        return _T(self.a - other.a)

    def norm(self):
        return _T(np.linalg.norm(self.a))

    def clamp_min(self, v):
        return _T(np.maximum(self.a, v))

    def __truediv__(self, other):
        return _T(self.a / other.a)

    def item(self):
        return float(self.a)


class _Torch:
    class cuda:
        @staticmethod
        def synchronize():
            pass


class _Timer:
    """Each callable's time by its key: flushed (`flushed`) and back to back (`b2b`)."""

    def __init__(self, flushed, b2b):
        self.flushed, self.b2b, self.asked = flushed, b2b, []

    def __call__(self, fn):
        fn()
        return [self.flushed[fn.key]]

    def back_to_back(self, fn):
        fn()
        self.asked.append(fn.key)
        return [self.b2b[fn.key]]


def _keyed(key, fn):
    fn.key = key
    return fn


def _row(sustained):
    ref = _T(np.arange(1.0, 5.0))
    out = _T(np.zeros(4))

    def cand(name, value):
        def run():
            out.a[...] = value
        return _keyed(name, run)

    cands = {"good_slow": cand("good_slow", ref.a), "good_fast": cand("good_fast", ref.a),
             "wrong": cand("wrong", ref.a + 1.0)}
    timer = _Timer({"good_slow": 2.0, "good_fast": 1.0, "wrong": 0.1, "torch": 1.2, "lib": 1.1},
                   {"good_fast": 1.5, "torch": 1.65, "lib": 1.6})
    product = _keyed("lib", lambda: _T(ref.a))
    row = bench.race(_Torch, timer, cands, _keyed("torch", lambda: None), out, ref, 1e-6, 2.0,
                     product=(product, lambda got: "kernel_x because"), sustained=sustained)
    return row, timer


def test_a_race_keeps_the_right_candidates_and_the_back_to_back_regime_beside():
    row, timer = _row(sustained=False)
    assert row["kernel"] == "good_fast" and row["errors"]["wrong"] > 0.1
    assert set(row["first_pass_ms"]) == {"good_slow", "good_fast"}
    assert row["ratio"] == 1.2 / 1.0 and row["lib_ok"] and row["lib_kernel"] == "kernel_x"
    assert not any("b2b" in k for k in row) and timer.asked == []
    row, timer = _row(sustained=True)
    assert timer.asked.count("good_fast") == timer.asked.count("torch") == bench.ROUNDS
    assert timer.asked.count("lib") == bench.ROUNDS
    assert (row["b2b_ms"], row["torch_b2b_ms"], row["lib_b2b_ms"]) == (1.5, 1.65, 1.6)
    # flushed, ours leads torch by 20%; back to back by 10%: both reported (the bar's figure
    # is the flushed lib_ratio)
    assert row["ratio"] == 1.2 and row["b2b_ratio"] == 1.65 / 1.5
    assert row["lib_ratio"] == 1.2 / 1.1 and row["lib_b2b_ratio"] == 1.65 / 1.6
    assert "torch_b2b_ratio" not in row


def test_the_summary_reports_the_back_to_back_worst_beside_the_bar():
    rows = [dict(part="linear", lib_ratio=1.06, ratio=1.0, lib_b2b_ratio=0.98),
            dict(part="linear", lib_ratio=1.07, ratio=1.01, lib_b2b_ratio=1.02)]
    s = bench.summary(rows)
    assert s["linear_bar_met"] and s["linear_worst"] == 1.06
    assert s["linear_back_to_back_worst"] == 0.98
    assert "batched_back_to_back_worst" not in bench.summary(
        [dict(part="batched", lib_ratio=1.0, ratio=1.0)])


def test_a_family_search_says_what_its_trials_did():
    """search_outcomes: timed, or the reason's words before its figures, counted."""
    from codegen.config import DEFAULT_CONFIG
    from tuner.outcome import Outcome
    from tuner.search import TrialRecord

    recs = [TrialRecord(0, DEFAULT_CONFIG, Outcome.TIMED, tflops=1.0),
            TrialRecord(1, DEFAULT_CONFIG, Outcome.PRUNED, "spills 8 B stored, 8 B loaded"),
            TrialRecord(2, DEFAULT_CONFIG, Outcome.PRUNED, "spills 40 B stored, 40 B loaded"),
            TrialRecord(3, DEFAULT_CONFIG, Outcome.PRUNED,
                        "predicted 12.0 TFLOP/s, more than 1.25x slower than the best"),
            TrialRecord(4, DEFAULT_CONFIG, Outcome.PRUNED,
                        "no block fits on an SM (limited by registers)"),
            TrialRecord(5, DEFAULT_CONFIG, Outcome.TIMED, tflops=2.0)]
    assert bench.search_outcomes(recs) == {"timed": 2, "spills": 2, "predicted": 1,
                                           "no block fits on an SM": 1}
