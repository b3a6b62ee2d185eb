"""The search loop with a fake benchmark: real validation, no GPU. The budget's outcomes
and a variant's candidates compile with nvcc; the tests of the loop's mechanics (pruning,
timeouts, the grid, resuming, Ctrl-C, SIGKILL) take the model's registers instead
(_fakes.modelled_compile): what they check does not depend on a real cubin, and CI's two
cores compile slowly."""

import optuna
import pytest

from codegen import parse_arch
from _fakes import FakeBenchmark
from tuner.outcome import Outcome
from tuner.search import confirm, search
from codegen.families import FAMILIES
from tuner.space import space_size, valid_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def run(compile_cache, tmp_path):
    def _run(bench, **kw):
        kw.setdefault("trials", 10)
        kw.setdefault("jobs", 2)
        # the loop's mechanics, the sampler's own asks: the model's first batch and its
        # pruning are tested in test_model_search.py (the fake's times ignore the model)
        kw.setdefault("model", False)
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
    bench = FakeBenchmark(nvcc=False)
    res = run(bench, trials=24, seed=11, sampler="random")
    pruned = [r for r in res.records if r.outcome is Outcome.PRUNED]
    assert pruned, "with times at 60% of the bound, weak candidates must be pruned"
    for r in pruned:
        if r.reason.startswith("bound"):
            assert r.figures["bound_tflops"] < res.stats.best_tflops
    best = res.timed()[0]
    assert best.tflops == res.stats.best_tflops == max(r.tflops for r in res.timed())
    # prune=False (an exhaustive record): the same candidates, each timed unless it
    # spills or fits no SM
    bench = FakeBenchmark(nvcc=False)
    every = run(bench, trials=24, seed=11, sampler="random", prune=False)
    assert {r.config.name for r in every.records} == {r.config.name for r in res.records}
    assert all(r.reason.startswith(("spills", "no block"))
               for r in every.records if r.outcome is Outcome.PRUNED)
    assert every.stats.timed > res.stats.timed


def test_timeout_stops_the_search(run):
    res = run(FakeBenchmark(nvcc=False), trials=10_000, timeout=3.0, seed=1)
    assert res.stats.seconds < 30 and res.stats.compiled < 10_000


def test_grid_walks_the_valid_space_without_repeats(run, monkeypatch):
    space = FAMILIES["simt"].space  # the simt family's SPACE itself: changed in place
    small = dict(space, bm=(64,), bn=(64,), bk=(16,), rm=(4,), rn=(4,), wt=(4, 8), pad=(0,),
                 stages=(2, 3), swizzle=(1,))
    for k, v in small.items():
        monkeypatch.setitem(space, k, v)
    arch = parse_arch("sm_90")
    shape = (1024, 1024, 512)  # 256 tiles of 64x64 fill the SMs: no split-K variants
    valid = {c.name for c in valid_configs(arch, shape=shape)}
    # 4 points of SPACE, each unpadded tile plain and XOR-swizzled (the conditional "swz"),
    # the 2-stage ones each with no interior path, an unchecked one and a paired one (the
    # conditional "interior"): 2 x 2 x 3 + 2 x 2
    assert len(valid) == 16 and space_size() == 4
    res = run(FakeBenchmark(shape=shape, nvcc=False), sampler="grid", trials=100)
    assert {r.config.name for r in res.records} == valid
    assert res.stats.compiled == 16


def test_confirm_reports_the_best_with_cublas_side_by_side(run):
    bench = FakeBenchmark(nvcc=False)
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
    big = {(c.split, c.reduce) for c in valid_configs(arch, shape=(4096, 4096, 4096))}
    skinny = {(c.split, c.reduce) for c in valid_configs(arch, shape=(127, 129, 4097))}
    assert big == {(1, "pass")}
    assert skinny == {(s, "pass") for s in (1, 2, 4, 8, 16, 32)} | {
        (s, "cluster") for s in (2, 4, 8)}  # "last" is buildable but not searched
    old = {(c.split, c.reduce) for c in valid_configs(parse_arch("sm_80"), shape=(127, 129, 4097))}
    assert old == {(s, "pass") for s in (1, 2, 4, 8, 16, 32)}  # no clusters before sm_90
    assert shape_reasons(KernelConfig(split=4), (4096, 4096, 4096), arch) == [
        "split-K 4 is not needed: 1024 tiles already cover the 132 SMs"]
    assert "split-K 32 exceeds the 8 K tiles" in shape_reasons(
        KernelConfig(bm=32, bn=32, rm=2, rn=4, wt=16, bk=16, split=32), (32, 32, 128), arch)


def test_search_tries_split_k_on_a_skinny_shape(run):
    res = run(FakeBenchmark(shape=(64, 64, 4096), nvcc=False), trials=12, seed=2,
              sampler="random")
    assert any(r.config.split > 1 for r in res.records)
    assert all(t.params.get("split", 1) in (1, 2, 4, 8, 16, 32) for t in res.study.trials)
    # the reduction is asked for only where a cluster can hold the split
    for t in res.study.trials:
        assert ("split_reduce" in t.params) == (t.params.get("split") in (2, 4, 8)), t.params
    assert {r.config.reduce for r in res.records if r.config.split in (2, 4, 8)} == {
        "pass", "cluster"}


def _finished(study):
    return {t.user_attrs["kernel"]: t.state for t in study.trials
            if "kernel" in t.user_attrs and t.state.is_finished()}


def test_resume_repeats_no_trial(run, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = FakeBenchmark(nvcc=False)
    a = run(first, trials=6, seed=4, storage=url, study_name="resume")
    again = FakeBenchmark(nvcc=False)
    b = run(again, trials=10, seed=4, storage=url, study_name="resume")
    assert b.stats.resumed == a.stats.timed + a.stats.pruned
    assert b.stats.compiled == 10  # the budget is the study's, across runs
    assert not {c.name for c in first.measured} & {c.name for c in again.measured}
    assert len(_finished(b.study)) == 10


def test_ctrl_c_keeps_the_study_and_leaves_nothing_running(run, tmp_path):
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path / 'study.db'}"
    res = run(FakeBenchmark(interrupt_at=3, nvcc=False), trials=10, seed=6, storage=url, study_name="c")
    assert res.stats.interrupted and res.stats.timed == 2
    states = [t.state for t in optuna.load_study(study_name="c", storage=url).trials]
    assert TrialState.RUNNING not in states
    # the same search again takes over the two timed candidates and goes on
    more = FakeBenchmark(nvcc=False)
    res2 = run(more, trials=10, seed=6, storage=url, study_name="c")
    assert not res2.stats.interrupted and res2.stats.resumed >= 2
    assert res2.stats.compiled == 10


_KILLED = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from _fakes import FakeBenchmark
from tuner.search import search
search((512, 512, 512), FakeBenchmark(delay=0.3, log={log!r}, nvcc=False), trials=40, seed=8, jobs=1,
       model=False, storage={url!r}, study_name="k", cache_dir=Path({cache!r}), artifacts=Path({art!r}))
"""


def test_sigkill_loses_at_most_the_trials_in_flight(tmp_path, compile_cache):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path / 'study.db'}"
    log = tmp_path / "timed.log"
    code = _KILLED.format(tests=str(Path(__file__).parent), log=str(log), url=url,
                          cache=str(compile_cache), art=str(tmp_path / "art"))
    p = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 4:
            break
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    timed = log.read_text().splitlines()
    assert len(timed) >= 4, "the search did not get going"
    study = optuna.load_study(study_name="k", storage=url)
    done = _finished(study)
    running = [t for t in study.trials if t.state == TrialState.RUNNING]
    # every candidate timed before the kill but the last is in the study; what is left
    # RUNNING is the candidate being timed, the compile look-ahead (2 with jobs=1) and the
    # last timed one, whose result the writer thread may not have committed yet
    assert set(timed[:-1]) <= set(done)
    assert not {t.user_attrs["kernel"] for t in running} & set(timed[:-1])
    assert len(running) <= 4
    # and the next run takes over what was done
    # (its claims still RUNNING are released once the dead worker's lease runs out, 3 s)
    res = search((512, 512, 512), FakeBenchmark(nvcc=False), trials=len(done) + 2, seed=8, jobs=1,
                 storage=url, study_name="k", cache_dir=compile_cache, artifacts=tmp_path,
                 lease=(0.5, 3.0))
    assert res.stats.resumed == len(done)
    assert not [t for t in res.study.trials if t.state == TrialState.RUNNING]


def test_processes_sharing_a_study_never_time_a_candidate_twice(tmp_path, compile_cache):
    """Three processes, one journal-file study, the same sampler and seed (so they ask for
    the same candidates in the same order): each candidate is timed by one of them."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    log = tmp_path / "timed.log"
    url = f"journal:///{tmp_path / 'study.log'}"
    procs = [subprocess.Popen([sys.executable, str(here / "_share_worker.py"), url, str(log),
                               str(compile_cache), str(here)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    stats = [tuple(map(int, o[0].split()[:3])) for o in outs]
    # what each process timed itself (its benchmark's own count: a process whose first read
    # of the study finds others' finished candidates counts them as resumed, timed or
    # pruned alike, so its stats cannot say)
    own = [int(o[0].split()[5]) for o in outs]
    names = log.read_text().split()
    assert len(names) == len(set(names)) and names  # each candidate timed by one process
    assert all(o <= s[1] for o, s in zip(own, stats))  # and counted as timed by it
    assert sum(s[2] for s in stats) > 0  # the workers did ask for each other's candidates
    from tuner.search import open_storage

    study = optuna.load_study(study_name="shared", storage=open_storage(url))
    timed = [t.user_attrs["kernel"] for t in study.trials
             if t.state == optuna.trial.TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert sorted(timed) == sorted(names)  # and none lost: every timing is in the study
    # a process joining afterwards (no budget of its own) takes the whole study's best
    p = subprocess.run([sys.executable, str(here / "_share_worker.py"), url, str(log),
                        str(compile_cache), str(here), "0"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    best = max(t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert float(p.stdout.split()[3]) == pytest.approx(best)


# ---- a program's problem: layout, C's type, bias, activation, batch ----------------------
def test_a_variants_search_builds_only_that_variant_from_the_families_that_do(tmp_path):
    """NT, fp16 C, bias + gelu, a batch of 4, through a fake GPU that refuses any other
    variant (no nvcc): of the fp16 families only those whose spec declares the layout and
    the epilogue are searched (today the CUDA-core one), every candidate of the variant."""
    from _fakes import VariantBenchmark
    from codegen.config import DType, Layout
    from codegen.families import family_of
    from codegen.families._common import Variant
    from tuner.space import families

    v = Variant(Layout.NT, DType.F16, "out", "gelu")
    want = {s.name for s in FAMILIES.values()
            if s.serves(DType.F16) and Layout.NT in s.layouts and s.epilogue}
    assert set(families(DType.F16, parse_arch("sm_90"), v)) == want and "simt" in want
    bench = VariantBenchmark((256, 512, 1024), variant=v, batch=4)
    res = search(bench.shape, bench, dtype=DType.F16, trials=12, jobs=1, variant=v, batch=4,
                 artifacts=tmp_path, cache_dir=tmp_path, seed=1)
    assert res.stats.compiled == 12 and res.variant == v and res.batch == 4
    assert res.records and all(Variant.of(r.config) == v for r in res.records)
    assert {family_of(r.config).name for r in res.records} <= want
    assert len(bench.measured) == res.stats.timed > 0
    assert all(r.config.name.endswith("_nt_of16_bias_gelu") for r in res.records)
    # the model's first batch is of the variant too, and each timed TFLOP/s counts the batch
    assert res.stats.model_first > 0
    best = res.timed()[0]
    assert best.tflops == pytest.approx(bench.flops / (best.timing.median_ms * 1e-3) / 1e12)


def test_only_the_families_that_declare_a_variant_are_searched(tmp_path, monkeypatch):
    """With the wgmma family declaring NN only and no epilogue, an NT fp16-C search takes
    the other two families' kernels, built as the variant."""
    import dataclasses

    from _fakes import VariantBenchmark
    from codegen import families as registry
    from codegen.config import DType, Layout
    from codegen.families import family_of
    from codegen.families._common import Variant
    from tuner.space import families, valid_configs

    arch = parse_arch("sm_90")
    assert set(families(DType.F16, arch, Variant())) == {"simt", "wmma", "wgmma", "decode"}
    monkeypatch.setitem(registry.FAMILIES, "wgmma", dataclasses.replace(
        registry.FAMILIES["wgmma"], layouts=frozenset({Layout.NN}), epilogue=False))
    v = Variant(Layout.NT, DType.F16, "none", "relu")
    assert set(families(DType.F16, arch, v)) == {"simt", "wmma", "decode"}
    pool = list(valid_configs(arch, DType.F16, (512, 512, 512), v))  # decode: M <= 64
    assert {family_of(c).name for c in pool} == {"simt", "wmma"}
    assert all(Variant.of(c) == v for c in pool)
    bench = VariantBenchmark((512, 512, 512), variant=v)
    res = search(bench.shape, bench, dtype=DType.F16, trials=30, jobs=1, variant=v,
                 artifacts=tmp_path, cache_dir=tmp_path, seed=2, sampler="random")
    assert {family_of(r.config).name for r in res.records} == {"simt", "wmma"}
    assert all(Variant.of(r.config) == v for r in res.records)


class _VariantFake(FakeBenchmark):
    """FakeBenchmark (real nvcc cubins) refusing any config of another variant."""

    def __init__(self, shape, variant):
        super().__init__(shape=shape)
        self.variant = variant

    def measure(self, config, cubin):
        from codegen.families._common import Variant

        assert Variant.of(config) == self.variant, config.name
        return super().measure(config, cubin)


def test_a_variants_candidates_compile_with_nvcc(run):
    """The same through nvcc: each candidate's source is its variant's (the fake GPU gets a
    real cubin of a TT, bf16-C, fp32-bias, silu kernel)."""
    from codegen.config import DType, Layout
    from codegen.families._common import Variant

    v = Variant(Layout.TT, DType.BF16, "f32", "silu")
    bench = _VariantFake((96, 160, 64), v)
    res = run(bench, dtype=DType.BF16, trials=3, variant=v, batch=2)
    assert res.stats.compiled == 3 and res.stats.compile_failed == 0
    assert res.stats.timed + res.stats.pruned == 3  # pruned: by the bound, on the fake's times
    assert len(bench.measured) == res.stats.timed >= 1
    assert all(r.config.name.endswith("_tt_obf16_biasf32_silu") for r in res.records)
    assert all(r.cubin.read_bytes()[:4] == b"\x7fELF" for r in res.records)


@pytest.mark.parametrize("model", [True, False])
def test_a_3xtf32_search_spends_its_budget_on_valid_3xtf32_candidates(model):
    """3xTF32's wgmma points are valid at about 7% of the family's searched space (the
    pre-split ones, which the model ranks first, at about 3%); the default TPE models each
    family's parameters jointly, so its asks land near valid points seen, and times mostly
    the 3xTF32 kernels the model ranks far above the CUDA-core ones. Once it has converged
    on a few points it asks for invalid points and repeats on and on (2718 asks for the
    default 150 candidates on an H100, 183 s: each ask costs more as they pile up): after
    MISS_STREAK misses running the search answers an ask itself with an unasked valid
    point (the model's best predicted; without the model, one of a family drawn by the
    seed, so that 3xTF32's few points are not lost among the CUDA-core family's many), so a
    candidate costs at most MISS_STREAK + 1 asks."""
    from _fakes import ModelledBenchmark

    from codegen.families._common import DType
    from tuner.search import MISS_STREAK

    shape = (4096, 4096, 4096)
    bench = ModelledBenchmark(shape=shape)
    res = search(shape, bench, dtype=DType.F32X3, trials=150, seed=0, jobs=1, timeout=300,
                 model=model)
    s = res.stats
    assert s.compiled == 150 and s.filled > 0, s
    assert s.asked <= (MISS_STREAK + 1) * (s.compiled + 1), s
    assert s.asked == s.compiled + s.rejected + s.duplicates, s
    assert len({r.config.name for r in res.records}) == 150
    t3 = [c for c in bench.measured if c.name.endswith("_t3")]
    assert len(t3) >= (0.8 if model else 0.5) * len(bench.measured), \
        [c.name for c in bench.measured]


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_a_search_of_named_families_asks_compiles_and_times_only_them(sampler):
    """`only` (a study of one family, bench/search_quality.py --family): the grid walks that
    family's valid points alone, TPE (with the model's first batch) asks only them, and a
    trial's parameters name no family when one is left."""
    from _fakes import ModelledBenchmark

    from codegen.config import DType
    from codegen.families import family_of
    from tuner.space import params_of

    arch, shape, only = parse_arch("sm_90"), (2048, 2048, 2048), frozenset({"wgmma"})
    pool = list(valid_configs(arch, DType.F16, shape, only=only))
    every = list(valid_configs(arch, DType.F16, shape))
    assert pool == [c for c in every if family_of(c).name == "wgmma"] and len(pool) < len(every)
    assert "family" not in params_of(pool[0], DType.F16, shape, arch, only)
    assert "family" in params_of(pool[0], DType.F16, shape, arch)
    bench = ModelledBenchmark(shape=shape)
    res = search(shape, bench, dtype=DType.F16, trials=20, seed=4, jobs=1, sampler=sampler,
                 only=["wgmma"], model=sampler == "tpe")
    assert res.stats.compiled == 20, res.stats
    assert {family_of(r.config).name for r in res.records} == {"wgmma"}
    assert bench.measured and all(family_of(c).name == "wgmma" for c in bench.measured)
    assert sampler == "grid" or res.stats.model_first > 0


@pytest.mark.parametrize("model", [False, True])
def test_a_seed_is_timed_first_and_one_outside_the_space_is_left_out(run, model):
    """A re-tune into a library seeds the search with the kernel it holds (tuner.tune):
    timed first, ahead of the model's batch, so the winner is at least as fast; a seed the
    request's space does not hold (another variant, a value not searched) is left out."""
    import dataclasses

    from codegen.config import DType, Layout

    bench = FakeBenchmark(nvcc=False)
    space = list(valid_configs(parse_arch("sm_90"), DType.F32, bench.shape))
    seed = space[len(space) // 2]
    outside = [dataclasses.replace(seed, layout=Layout.NT),  # another variant
               dataclasses.replace(seed, stages=7)]          # not a valid point
    res = run(bench, trials=6, seed=3, model=model, seeds=(*outside, seed))
    assert res.records[0].config == seed
    names = [r.config.name for r in res.records]
    assert names.count(seed.name) == 1 and not {c.name for c in outside} & set(names)
