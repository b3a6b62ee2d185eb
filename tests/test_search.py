"""The search loop with a fake benchmark: real validation, real nvcc compiles, no GPU."""

import math

import optuna
import pytest

from codegen import parse_arch
from tuner.model import bound_tflops
from tuner.outcome import Measurement, Outcome, Timing
from tuner.search import confirm, search
from tuner.space import SPACE, space_size, valid_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)
SHAPE = (512, 512, 512)


class FakeBenchmark:
    """Times are a fixed fraction of the model's bound; some configs launch-fail or are wrong."""

    def __init__(self, shape=SHAPE, wrong=lambda c: False, launch_fails=lambda c: False):
        self.arch = parse_arch("sm_90")
        self.shape = shape
        self.flops = 2.0 * math.prod(shape)
        self.wrong, self.launch_fails = wrong, launch_fails
        self.measured, self.baselines = [], 0

    def _ms(self, tflops):
        return self.flops / (tflops * 1e12) * 1e3

    def measure(self, config, cubin):
        assert cubin.read_bytes()[:4] == b"\x7fELF"
        self.measured.append(config)
        if self.launch_fails(config):
            return Measurement(Outcome.LAUNCH_FAILED, message="an illegal memory access")
        if self.wrong(config):
            return Measurement(Outcome.WRONG_RESULT, error=0.5, message="||C-ref||/||ref|| = 0.5")
        bound, _ = bound_tflops(config, self.shape, self.arch)
        ms = self._ms(0.6 * bound)
        return Measurement(Outcome.TIMED, Timing((ms, ms * 1.01, ms * 0.99)), error=1e-7)

    def baseline(self):
        self.baselines += 1
        return Measurement(Outcome.TIMED, Timing((self._ms(30.0),) * 3), error=1e-7)


@pytest.fixture
def run(compile_cache, tmp_path):
    def _run(bench, **kw):
        kw.setdefault("trials", 10)
        kw.setdefault("jobs", 2)
        return search(bench.shape, bench, cache_dir=compile_cache, artifacts=tmp_path, **kw)
    return _run


def test_budget_outcomes_and_attributes(run):
    bench = FakeBenchmark(wrong=lambda c: c.stages == 4, launch_fails=lambda c: c.bm == 16)
    res = run(bench, trials=14, seed=3, baseline_every=3)
    s = res.stats
    assert s.compiled == 14  # the budget counts compiled candidates only
    assert s.done == 14 == len(res.records)
    assert s.asked == s.compiled + s.rejected + s.duplicates
    assert s.rejected > 0  # invalid combinations were asked for and rejected for free
    by = {o: [r for r in res.records if r.outcome is o] for o in Outcome}
    assert all(r.config.stages == 4 for r in by[Outcome.WRONG_RESULT])
    assert all(r.config.bm == 16 for r in by[Outcome.LAUNCH_FAILED])
    assert s.timed == len(by[Outcome.TIMED]) and s.pruned == len(by[Outcome.PRUNED])
    assert s.timed + s.pruned + s.wrong + s.launch_failed + s.compile_failed == 14
    # never timed what the model pruned; cuBLAS interleaved: start, every 3 timed, end
    assert len(bench.measured) == s.timed + s.wrong + s.launch_failed
    assert bench.baselines == 2 + s.timed // 3
    # Optuna holds every trial's outcome and reason
    states = {t.number: t for t in res.study.trials}
    for r in res.records:
        t = states[r.number]
        assert t.user_attrs["kernel"] == r.config.name
        assert t.user_attrs["outcome"] == r.outcome.value
        if r.outcome is Outcome.TIMED:
            assert t.state == optuna.trial.TrialState.COMPLETE and t.value == r.tflops
        elif r.outcome is Outcome.PRUNED:
            assert t.state == optuna.trial.TrialState.PRUNED and "figures" in t.user_attrs
        else:
            assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["reason"]
    rejected = [t for t in res.study.trials if t.user_attrs.get("outcome") == "rejected"]
    assert rejected and all(t.user_attrs["reason"] for t in rejected)


def test_model_prunes_against_the_best_so_far(run):
    bench = FakeBenchmark()
    res = run(bench, trials=24, seed=11, sampler="random")
    pruned = [r for r in res.records if r.outcome is Outcome.PRUNED]
    assert pruned, "with times at 60% of the bound, weak candidates must be pruned"
    for r in pruned:
        if r.reason.startswith("bound"):
            assert r.figures["bound_tflops"] < res.stats.best_tflops
    best = res.timed()[0]
    assert best.tflops == res.stats.best_tflops == max(r.tflops for r in res.timed())


def test_timeout_stops_the_search(run):
    res = run(FakeBenchmark(), trials=10_000, timeout=3.0, seed=1)
    assert res.stats.seconds < 30 and res.stats.compiled < 10_000


def test_grid_walks_the_valid_space_without_repeats(run, monkeypatch):
    import tuner.search as ts
    import tuner.space as sp

    small = dict(SPACE, bm=(64,), bn=(64,), bk=(16,), rm=(4,), rn=(4,), wt=(4, 8), pad=(0,),
                 stages=(2, 3), swizzle=(1,))
    monkeypatch.setattr(sp, "SPACE", small)
    monkeypatch.setattr(ts, "SPACE", small)
    arch = parse_arch("sm_90")
    shape = (1024, 1024, 512)  # 256 tiles of 64x64 fill the SMs: no split-K variants
    valid = {c.name for c in valid_configs(arch, shape=shape)}
    assert len(valid) == 4 and space_size() == 4
    res = run(FakeBenchmark(shape=shape), sampler="grid", trials=100)
    assert {r.config.name for r in res.records} == valid
    assert res.stats.compiled == 4


def test_confirm_reports_the_best_with_cublas_side_by_side(run):
    bench = FakeBenchmark()
    res = run(bench, trials=8, seed=5)
    rows = confirm(res, bench, top=3, rounds=2)
    assert 1 <= len(rows) <= 3
    medians = [t.median_ms for _, t, _ in rows]
    assert medians == sorted(medians)
    assert all(base.median_ms == pytest.approx(bench._ms(30.0)) for _, _, base in rows)


def test_split_k_is_searched_only_where_tiles_leave_sms_idle():
    from codegen import KernelConfig
    from tuner.model import shape_reasons

    arch = parse_arch("sm_90")
    big = {c.split for c in valid_configs(arch, shape=(4096, 4096, 4096))}
    skinny = {c.split for c in valid_configs(arch, shape=(127, 129, 4097))}
    assert big == {1} and skinny == {1, 2, 4, 8, 16, 32}
    assert shape_reasons(KernelConfig(split=4), (4096, 4096, 4096), arch) == [
        "split-K 4 is not needed: 1024 tiles already cover the 132 SMs"]
    assert "split-K 32 exceeds the 8 K tiles" in shape_reasons(
        KernelConfig(bm=32, bn=32, rm=2, rn=4, wt=16, bk=16, split=32), (32, 32, 128), arch)


def test_search_tries_split_k_on_a_skinny_shape(run):
    res = run(FakeBenchmark(shape=(64, 64, 4096)), trials=12, seed=2, sampler="random")
    assert any(r.config.split > 1 for r in res.records)
    assert all(t.params.get("split", 1) in (1, 2, 4, 8, 16, 32) for t in res.study.trials)
