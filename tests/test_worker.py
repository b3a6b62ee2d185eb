"""Fault isolation on the CPU: the timing worker process dies or hangs on planted kernels,
is restarted, and the search goes on; two workers share one search without repeats."""

import collections

import optuna
import pytest

from codegen import KernelConfig, compile_config
from tuner.outcome import Outcome
from tuner.search import search
from tuner.worker import GpuWorker, WorkerError

optuna.logging.set_verbosity(optuna.logging.WARNING)
FAKE = ("_fakes", "WorkerBenchmark")
GOOD = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=2)
CRASH = KernelConfig(bm=16, bn=64, bk=16, rm=2, rn=4, stages=2)
HANG = KernelConfig(bm=32, bn=64, bk=16, rm=2, rn=4, stages=2)


def test_a_crash_and_a_hang_cost_only_the_worker(compile_cache):
    cubin = {c: compile_config(c, "sm_90", compile_cache).cubin for c in (GOOD, CRASH, HANG)}
    with GpuWorker((256, 256, 256), timeout_s=3.0, factory=FAKE) as w:
        assert w.arch.sm == "sm_90" and w.flops == 2 * 256**3
        assert w.measure(GOOD, cubin[GOOD]).outcome is Outcome.TIMED
        crashed = w.measure(CRASH, cubin[CRASH])
        assert crashed.outcome is Outcome.LAUNCH_FAILED and w.restarts == 1
        assert "the worker died (exit status 3); worker restarted" in crashed.message
        assert w.measure(GOOD, cubin[GOOD]).outcome is Outcome.TIMED
        hung = w.measure(HANG, cubin[HANG])
        assert hung.outcome is Outcome.LAUNCH_FAILED and w.restarts == 2
        assert "no answer within 3 s (a hang?); worker restarted" in hung.message
        assert w.measure(GOOD, cubin[GOOD]).outcome is Outcome.TIMED
        assert w.baseline().outcome is Outcome.TIMED


def test_a_worker_that_cannot_start_is_one_error():
    with pytest.raises(WorkerError, match="did not start: ModuleNotFoundError"):
        GpuWorker((8, 8, 8), factory=("no_such_module", "X"))


def test_two_workers_share_one_search_and_survive_a_crash(compile_cache, tmp_path,
                                                          monkeypatch):
    from codegen.families import FAMILIES

    # tiles of 16 rows (the planted crash) or 64: a sixteen-trial sample meets the crash
    # whatever else the space holds
    monkeypatch.setitem(FAMILIES["simt"].space, "bm", (16, 64))
    log = tmp_path / "timed.log"
    workers = [GpuWorker((512, 512, 512), device=i, factory=FAKE, timeout_s=5.0, log=str(log),
                         delay=0.05) for i in (0, 1)]
    try:
        res = search((512, 512, 512), workers, trials=16, jobs=2, seed=2, sampler="random",
                     model=False, cache_dir=compile_cache, artifacts=tmp_path / "art")
    finally:
        for w in workers:
            w.close()
    s = res.stats
    assert s.compiled == 16 == s.done
    timed_where = collections.Counter(t.user_attrs.get("gpu") for t in res.study.trials
                                      if t.user_attrs.get("outcome") in ("timed",
                                                                         "launch failed"))
    assert set(timed_where) == {0, 1}, timed_where  # both GPUs worked
    names = log.read_text().split()
    assert len(names) == len(set(names)) == s.timed  # no candidate timed twice
    failed = [t for t in res.study.trials if t.user_attrs.get("outcome") == "launch failed"]
    assert len(failed) == s.launch_failed
    for t in failed:  # the planted faults: recorded with the reason, the study went on
        bm = t.user_attrs["kernel"].split("_")[3].split("x")[0]
        assert bm in ("16", "32"), t.user_attrs["kernel"]
        assert ("worker died" if bm == "16" else "no answer within 5 s") in t.user_attrs["reason"]
    assert s.launch_failed >= 1 and sum(w.restarts for w in workers) == s.launch_failed
