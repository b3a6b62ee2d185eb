"""The Optuna search: ask for configurations, reject the invalid at once, compile the
rest in a process pool ahead of the GPU, prune what the model calls hopeless, and
time the survivors against cuBLAS, interleaved.

The benchmark is an argument (anything with `arch`, `flops`, `measure(config, cubin)`
and `baseline()`), so the loop runs in CPU tests with a fake one. The problem's variant
(layout, C's type, bias, activation) shapes every candidate: the families that build it
are searched, each suggestion is built as it (tuner.space); its batch scales the model's
blocks and bytes (tuner.model); the benchmark times that same problem. A benchmark that also
has `compile_task(args)` (a simulation replaying recorded results, bench/simulate_search.py)
compiles too: the search then runs no nvcc.

The model ranks (tuner.model.predict): with `model=True` the first `first_batch`
candidates are each family's default and then the model's best-predicted ones (enqueued
before the sampler's own), and a
compiled candidate predicted more than `margin` times slower than the best measured so far
is pruned untimed. The search's Spearman correlation between predicted and measured time
is in SearchStats.rank_rho.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import functools
import heapq
import logging
import multiprocessing
import os
import random
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator, Protocol

from codegen.arch import ArchLimits
from codegen.check import check
from codegen.compile import (
    CompileResult, Resources, compile_config, compile_task, default_cache_dir,
)
from codegen.config import DType, config_from_name
from codegen.families import Config, family_of
from codegen.families._common import Variant
from tuner.dryrun import defaults
from tuner._study import (
    LEASE_GRACE, LEASE_INTERVAL, SharedStudy, _retry, describe, open_storage as _open_storage,
)
from tuner.model import (
    judge, likely_spills, predict_before_compile, shape_reasons, spearman,
)
from tuner.outcome import Measurement, Outcome, Timing
from tuner.space import Only, is_candidate, params_of, suggest, valid_configs

__all__ = ["Benchmark", "TrialRecord", "SearchStats", "SearchResult", "search", "make_sampler",
           "open_storage", "model_first", "rank_correlation"]

log = logging.getLogger(__name__)

#: consecutive asks that brought no new valid candidate (invalid, or asked before) after
#: which the search answers the next ask itself with an unasked valid configuration: the
#: model's best predicted (with the model), else one of a family drawn by the seed. A
#: sampler that has converged on a few points in a sparse space (3xTF32's wgmma points: 7%
#: valid) otherwise asks on and on, and each ask costs more as the rejected ones pile up
#: (TPE: 2718 asks, 183 s, for 150 candidates at 4096^3 on an H100; bench/NOTES.md,
#: "Forty-third session")
MISS_STREAK = 8

#: candidates timed before the model may prune on its prediction (a tune never times fewer,
#: budget permitting): the first best is a weak yardstick, and the margins were calibrated
#: against a study's best, not its first
MIN_TIMED = 8


class Benchmark(Protocol):
    arch: ArchLimits
    flops: float

    def measure(self, config: Config, cubin: Path) -> Measurement: ...

    def baseline(self) -> Measurement: ...


@dataclasses.dataclass
class TrialRecord:
    number: int
    config: Config
    outcome: Outcome
    reason: str = ""
    tflops: float | None = None
    timing: Timing | None = None
    error: float | None = None  # against the inputs as the kernel multiplies them
    error_exact: float | None = None  # against the inputs before rounding to their type
    resources: Resources | None = None
    figures: dict = dataclasses.field(default_factory=dict)
    cubin: Path | None = None

    def to_dict(self) -> dict:
        return dict(number=self.number, kernel=self.config.name, outcome=self.outcome.value,
                    reason=self.reason, tflops=self.tflops, error=self.error,
                    error_exact=self.error_exact,
                    timing=self.timing.to_dict() if self.timing else None,
                    resources=self.resources.to_dict() if self.resources else None,
                    figures=self.figures)


@dataclasses.dataclass
class SearchStats:
    asked: int = 0
    rejected: int = 0  # invalid by codegen.check (cost: the check)
    duplicates: int = 0
    compiled: int = 0  # the budget counts these
    compile_failed: int = 0
    pruned: int = 0  # by the model, before timing: the timed runs pruning saved
    launch_failed: int = 0
    wrong: int = 0
    timed: int = 0
    best_tflops: float | None = None
    cublas_tflops: float | None = None
    seconds: float = 0.0
    resumed: int = 0  # candidates an earlier run of the same study had already done
    from_others: int = 0  # timed by other processes of a shared study, taken in at the end
    interrupted: bool = False  # stopped by Ctrl-C; the study keeps every finished trial
    lost: int = 0  # own claims another process released (this one fell silent too long)
    model_first: int = 0  # candidates enqueued first from the model's ranking
    filled: int = 0  # asks the search answered itself after the sampler's MISS_STREAK misses
    rank_rho: float | None = None  # Spearman: predicted against measured time, timed ones

    @property
    def done(self) -> int:
        return self.compile_failed + self.pruned + self.launch_failed + self.wrong + self.timed

    @property
    def failed(self) -> int:
        return self.compile_failed + self.launch_failed + self.wrong


@dataclasses.dataclass
class SearchResult:
    shape: tuple[int, int, int]
    dtype: DType
    records: list[TrialRecord]
    baselines: list[Timing]  # cuBLAS, timed at the start, every few candidates and at the end
    stats: SearchStats
    study: object  # the optuna.Study
    storage: object = None  # where the study lives (an Optuna storage object or URL)
    variant: Variant = Variant()
    batch: int = 1

    def timed(self) -> list[TrialRecord]:
        return sorted((r for r in self.records if r.outcome is Outcome.TIMED),
                      key=lambda r: -r.tflops)

    @property
    def cublas_ms(self) -> float:
        return statistics.median(t.median_ms for t in self.baselines)


def make_sampler(name: str, seed: int | None):
    """TPE or random. "tpe" models a family's parameters jointly (multivariate, grouped: each
    family's parameters, asked only when the trial picked that family, are a group of
    their own), so a new point is drawn near one good point seen, not assembled value by
    value from several: in a space as constrained as 3xTF32's (7% of the wgmma family's
    searched points valid) the independent TPE ("tpe-independent") asked 1201 points for 80
    candidates, where the joint one asked 434, and slowed as the rejected asks piled up
    (the model standing in for the GPU; bench/NOTES.md, "Ninth session"). The grid is not an Optuna GridSampler (it rescans every trial on each ask:
    3000 asks took 230 s) but :class:`_GridAsker` over the valid configurations."""
    import optuna

    if name in ("tpe", "tpe-independent"):
        joint = name == "tpe"
        with warnings.catch_warnings():  # multivariate and group are "experimental" options
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=16,
                                              multivariate=joint, group=joint)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


class _GridAsker:
    """Every valid configuration once, in an order shuffled by the seed; each is handed to
    Optuna through a PartialFixedSampler, so a trial's parameters are the configuration's."""

    def __init__(self, study, arch: ArchLimits, dtype: DType, shape, seed: int | None,
                 variant: Variant | None = None, only: Only = None):
        import random

        self.study, self.base = study, study.sampler
        self.shape, self.arch, self.dtype, self.only = tuple(shape), arch, dtype, only
        self.todo = list(valid_configs(arch, dtype, shape, variant, only))
        self.last = None
        random.Random(seed).shuffle(self.todo)

    def ask(self):
        import optuna

        if not self.todo:
            return None
        cfg = self.last = self.todo.pop()
        params = params_of(cfg, self.dtype, self.shape, self.arch, self.only)
        with warnings.catch_warnings():  # PartialFixedSampler is "experimental" since 2.4
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.sampler = optuna.samplers.PartialFixedSampler(params, self.base)
        return self.study.ask()


class _InlineExecutor(cf.Executor):
    """jobs=1: compile in this process (tests, and machines with one core)."""

    def submit(self, fn, *args, **kwargs):
        f: cf.Future = cf.Future()
        f.set_result(fn(*args, **kwargs))
        return f


def search(
    shape: tuple[int, int, int],
    bench: Benchmark | list[Benchmark],
    *,
    dtype: DType = DType.F32,
    trials: int = 100,
    timeout: float = 540.0,
    sampler: str = "tpe",
    seed: int | None = 0,
    jobs: int | None = None,
    artifacts: Path | None = None,
    cache_dir: Path | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    baseline_every: int = 10,
    lease: tuple[float, float] = (LEASE_INTERVAL, LEASE_GRACE),
    storage_retry: float = 60.0,
    on_event: Callable[[TrialRecord | None, SearchStats], None] | None = None,
    model: bool = True,
    first_batch: int = 16,
    margin: float | None | str = "family",
    variant: Variant | None = None,
    batch: int = 1,
    only: Only = None,
    prune: bool = True,
    seeds: tuple = (),
) -> SearchResult:
    """Search the space for `shape`; `trials` counts the study's candidates (valid, new
    ones, compiled by this process, an earlier run of the study, or another process).

    `bench` may be a list, one benchmark per GPU: candidates are then timed on whichever
    GPU is free, concurrently, and told to the one study as they finish.

    The sampler asks in a study in this process's memory. With `storage`, each valid new
    candidate is claimed in the shared study there (one write), and its result written
    back; what other processes finish is read back into the local study (incrementally),
    so invalid asks and duplicates cost the storage nothing. `lease` is (interval, grace)
    in seconds: see tuner._study.

    `model`: order the first `first_batch` candidates by the model's predicted time and
    prune on the prediction: a candidate predicted more than `margin` times slower than the
    best measured so far is not timed ("family": each family's calibrated
    FamilySpec.prune_margin; a number: that one for all; None: no pruning on the
    prediction), once MIN_TIMED candidates have been timed; False: neither.

    `variant` (default: the plain problem, NN with fp32 C and no epilogue) and `batch`:
    the problem `bench` times; only the families that build that variant (and run a
    batch) are searched, each candidate built as it, and the model counts the batch.

    `only`: the names of the families to search (default: every one the request
    searches), for a study of one family (bench/search_quality.py). The result is the best
    of those families, not the problem's: the tuner's cache never holds it.

    `prune=False`: time every candidate that runs (those that spill or fit no SM aside),
    the bound and the model's margin notwithstanding: an exhaustive record, whose every
    point a replayed search may ask for (bench/simulate_search.py).

    `seeds`: configurations timed first, before the model's batch (the kernel a library
    already holds for the problem: a re-tune then never loses it for a worse winner), each
    one that is a point of this request's space; the others are left out.
    """
    return _Search(shape, bench, dtype=dtype, trials=trials, timeout=timeout, sampler=sampler,
                   seed=seed, jobs=jobs, artifacts=artifacts, cache_dir=cache_dir,
                   storage=storage, study_name=study_name, baseline_every=baseline_every,
                   lease=lease, storage_retry=storage_retry, on_event=on_event, model=model,
                   first_batch=first_batch, margin=margin, variant=variant, batch=batch,
                   only=frozenset(only) if only is not None else None, prune=prune,
                   seeds=tuple(seeds)).run()


class _Search:
    """One call of :func:`search`: its state as attributes, its steps as methods.

    The loop (:meth:`run`) keeps up to `2 * jobs` candidates compiling ahead of the GPU
    (:meth:`refill`: ask, check, claim, compile) and takes the compiled ones in turn
    (:meth:`take`: judge, time), telling the study each outcome as it comes and syncing
    with the shared study, if any, between steps.
    """

    def __init__(self, shape, bench, *, dtype, trials, timeout, sampler, seed, jobs, artifacts,
                 cache_dir, storage, study_name, baseline_every, lease, storage_retry,
                 on_event, model, first_batch, margin, variant=None, batch=1, only=None,
                 prune=True, seeds=()):
        import optuna
        from optuna.trial import TrialState

        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout
        self.benches = list(bench) if isinstance(bench, (list, tuple)) else [bench]
        self.bench = self.benches[0]
        self.arch = self.bench.arch
        self.shape, self.dtype, self.trials = tuple(shape), dtype, trials
        self.variant, self.batch, self.only = variant or Variant(), batch, only
        self.prune = prune
        self.artifacts, self.baseline_every, self.on_event = artifacts, baseline_every, on_event
        self.model, self.first_batch = model, first_batch
        self.seeds = [c for c in seeds if self._in_space(c)]
        self.stats = SearchStats()
        self.records: list[TrialRecord] = []
        self.seen: dict[str, tuple[TrialState, float | None]] = {}  # own and taken-in candidates
        self.baselines: list[Timing] = []
        # the study the sampler asks in, here, and the shared one with `storage`
        self.study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed),
                                         study_name=study_name)
        self.shared = self.remote = None
        self.storage = storage
        if storage is not None:
            self.join(storage, study_name, lease, storage_retry)
        self.grid = (_GridAsker(self.study, self.arch, dtype, shape, seed, self.variant, only)
                     if sampler == "grid" else None)
        self.max_asks = trials * 50 + 2000
        self.misses = 0  # consecutive asks that brought no new candidate (MISS_STREAK)
        self.fill_rng = random.Random(seed)  # without the model: the family and its point
        self.unasked: dict | None = None  # without the model: each family's valid points
        self.own: dict[int, int] = {}  # local trial number -> shared trial id
        self.retrying: set[str] = set()
        self.synced_at, self.synced_once = 0.0, False  # the last sync; the first one done
        self.sync_every = 1.0  # seconds between reads of the shared study (see sync)
        # compiling, in a process pool ahead of the GPU
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.compiler = getattr(self.bench, "compile_task", None) or compile_task
        self.margin = margin if model else None
        self.jobs = jobs = max(1, jobs or os.cpu_count() or 1)
        self.pool = (_InlineExecutor() if jobs == 1 else cf.ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn")))
        self.pending: collections.deque = collections.deque()  # (trial, config, future)
        # timing, on whichever GPU is free
        self.current: tuple | None = None  # (trial, config) between `pending` and a GPU
        self.free = collections.deque(self.benches)  # GPUs with nothing to time
        self.inflight: dict = {}  # future -> (trial, record, benchmark, start time)
        self.timer = (_InlineExecutor() if len(self.benches) == 1
                      else cf.ThreadPoolExecutor(max_workers=len(self.benches)))

    def join(self, storage, study_name, lease, retry_s):
        """Open the shared study at `storage` (created if new) and start this worker's
        lease on it."""
        import optuna

        where = describe(storage)
        self.storage = storage = open_storage(storage, retry_s)
        self.remote = _retry(lambda: optuna.create_study(
            direction="maximize", storage=storage, study_name=study_name or self.study.study_name,
            load_if_exists=True), "opening the study", retry_s, where)
        self.shared = SharedStudy(storage, self.remote._study_id, interval=lease[0],
                                  grace=lease[1], retry_s=retry_s, where=where).start()

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> SearchResult:
        """Until the budget, the asks or the time are spent (and, shared, the others are
        done); Ctrl-C ends it early with every finished trial kept."""
        try:
            self.begin()
            while True:
                self.refill()  # ask, check, claim, compile: ahead of the GPU
                if self.pending:
                    self.take(*self.pending.popleft())  # judge, then time on a free GPU
                elif self.inflight:
                    self.wait_for(free_needed=False)  # tell the timings as they finish
                elif self.others_busy():
                    self.wait_for_others()
                else:
                    break
                self.sync()
            self.end()
        except KeyboardInterrupt:
            self.interrupted()
        finally:
            self.close()
        return self.result()

    def begin(self):
        """Take in what an earlier run, or another process, has done; enqueue the seeds
        and the model's first batch (or leave the done ones out of the grid); time cuBLAS."""
        self.sync(force=True)
        if self.grid:
            self.grid.todo = [c for c in self.grid.todo if c.name not in self.seen]
            return self.time_baseline()
        seeds = [c for c in self.seeds if c.name not in self.seen]
        for cfg in seeds:
            self.study.enqueue_trial(params_of(cfg, self.dtype, self.shape, self.arch, self.only),
                                     skip_if_exists=False)
        if self.model and self.first_batch > 0:
            exclude = set(self.seen) | {c.name for c in seeds}
            for cfg in model_first(self.shape, self.dtype, self.arch, self.first_batch,
                                   exclude, self.variant, self.batch, self.only):
                self.study.enqueue_trial(params_of(cfg, self.dtype, self.shape, self.arch,
                                                   self.only),
                                         skip_if_exists=False)
                self.stats.model_first += 1
        self.time_baseline()

    def _in_space(self, cfg) -> bool:
        """Is `cfg` a point this search may ask for (a seed that is not is left out)?"""
        import optuna

        if not is_candidate(cfg, self.dtype, self.variant) or check(cfg, self.arch):
            return False
        if self.only is not None and family_of(cfg).name not in self.only:
            return False
        try:
            params = params_of(cfg, self.dtype, self.shape, self.arch, self.only)
            asked = suggest(optuna.trial.FixedTrial(params), self.dtype, self.shape, self.arch,
                            self.variant, self.only)
        except (ValueError, KeyError):
            return False
        return asked == cfg

    def end(self):
        """Every result written and the others' taken in; cuBLAS timed once more."""
        self.shared is not None and self.shared.flush()
        self.sync(force=True)
        self.time_baseline()

    def interrupted(self):
        """Ctrl-C: every finished trial is already in the study; the unfinished ones are
        marked failed (not left RUNNING), so the same command resumes cleanly."""
        from optuna.trial import TrialState

        self.stats.interrupted = True
        unfinished = (([self.current] if self.current else [])
                      + [(t, c) for t, c, _ in self.pending])
        unfinished += [(t, r.config) for t, r, _, _ in self.inflight.values()]
        for trial, cfg in unfinished:
            if self.seen.get(cfg.name, (TrialState.RUNNING,))[0] == TrialState.RUNNING:
                self.release(trial, cfg, "interrupted (Ctrl-C) before it finished")

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.timer.shutdown(wait=False, cancel_futures=True)
        if self.shared is not None:
            try:
                self.shared.flush()
            finally:
                self.shared.stop(clean=True)

    def result(self) -> SearchResult:
        import optuna

        stats = self.stats
        stats.seconds = time.monotonic() - self.t0
        stats.rank_rho = rank_correlation(self.records)
        if self.shared is not None:
            stats.lost = self.shared.lost
            remote = optuna.load_study(study_name=self.remote.study_name, storage=self.storage)
            return SearchResult(self.shape, self.dtype, self.records, self.baselines, stats,
                                remote, self.storage, self.variant, self.batch)
        return SearchResult(self.shape, self.dtype, self.records, self.baselines, stats,
                            self.study, self.study._storage, self.variant, self.batch)

    # -- ahead of the GPU: ask, check, claim, compile ---------------------------------
    def refill(self):
        """Ask until `2 * jobs` candidates are compiling, the budget or the asks are spent,
        the time is up or the grid is done."""
        lookahead = 2 * self.jobs
        while (len(self.pending) < lookahead and not self.full()
               and self.stats.asked < self.max_asks and time.monotonic() < self.deadline):
            asked = self.ask()
            if asked is None:  # the grid is done
                break
            if self.admit(*asked):
                self.misses = 0
                self.compile(*asked)
            else:
                self.misses += 1

    def ask(self):
        """The next (trial, config): a released candidate of the shared study first, else
        the sampler's (or the grid's) choice; None when the grid is done."""
        if self.shared is not None:
            if any(c.status == "stale" for c in self.shared.claims().values()):
                # a dead worker's claims: release them now (read reaps), so that their
                # retries come before a new candidate could take their places in the budget
                self.shared.read()
            for t in self.shared.released():
                name = t.user_attrs.get("claim")
                if name not in self.retrying and name not in self.seen:
                    self.retrying.add(name)
                    self.study.enqueue_trial(t.params, skip_if_exists=False)
        grid = self.grid
        if not grid and self.misses >= MISS_STREAK:
            self.fill()
        trial = grid.ask() if grid else self.study.ask()
        if trial is None:
            return None
        self.stats.asked += 1
        cfg = suggest(trial, self.dtype, self.shape, self.arch, self.variant, self.only)
        if grid and grid.last is not None and cfg.name != grid.last.name:
            grid.todo.append(grid.last)  # a retry came first: the grid's turn waits
        return trial, cfg

    def fill(self):
        """The sampler missed MISS_STREAK times running: enqueue an unasked valid point
        (the model's best predicted; with the model off, one of a family drawn by the
        seed), which the next ask returns, so the sampler learns from it as from its own."""
        taken = set(self.seen) | (self.shared.held() if self.shared is not None else set())
        if self.model:
            cfg = next(iter(model_first(self.shape, self.dtype, self.arch, 1, taken,
                                        self.variant, self.batch, self.only)), None)
        else:  # a family drawn first, as a trial asks "family" first, then one of its points
            if self.unasked is None:
                self.unasked = collections.defaultdict(list)
                for c in valid_configs(self.arch, self.dtype, self.shape, self.variant,
                                       self.only):
                    self.unasked[c.family].append(c)
                for pool in self.unasked.values():
                    self.fill_rng.shuffle(pool)
            for pool in self.unasked.values():
                while pool and pool[-1].name in taken:
                    pool.pop()
            families = sorted((f for f, pool in self.unasked.items() if pool), key=str)
            cfg = self.unasked[self.fill_rng.choice(families)].pop() if families else None
        if cfg is not None:
            self.stats.filled += 1
            self.misses = 0
            self.study.enqueue_trial(params_of(cfg, self.dtype, self.shape, self.arch,
                                               self.only), skip_if_exists=False)

    def admit(self, trial, cfg) -> bool:
        """Whether `cfg` is to be compiled. If not (invalid, asked before, or claimed by
        another process), the trial is told at once, at no cost to the budget."""
        from optuna.trial import TrialState

        stats = self.stats
        reasons = check(cfg, self.arch) + shape_reasons(cfg, self.shape, self.arch)
        if reasons:
            stats.rejected += 1
            trial.set_user_attr("outcome", Outcome.REJECTED.value)
            trial.set_user_attr("reason", "; ".join(reasons))
            self.tell(trial, state=TrialState.PRUNED)
            return False
        if cfg.name in self.seen:  # asked again: answer from the first time, free
            stats.duplicates += 1
            state, value = self.seen[cfg.name]
            trial.set_user_attr("duplicate_of", cfg.name)
            # still compiling or timing: nothing to copy yet
            self.tell(trial, value, TrialState.PRUNED if state == TrialState.RUNNING else state)
            return False
        why = self.claim(trial, cfg)
        if why is not None:  # another process holds it, or the study is full
            stats.duplicates += 1
            trial.set_user_attr("duplicate_of", cfg.name)
            trial.set_user_attr("reason", "claimed by another worker of this study"
                                if why == "held" else "the study holds its budget")
            self.tell(trial, state=TrialState.PRUNED)
            return False
        return True

    def claim(self, trial, cfg) -> str | None:
        """Claim `cfg` in the shared study; None if it is ours, else why not."""
        if self.shared is None:
            return None
        if cfg.name in self.shared.held():  # the cached view says another worker holds it
            return "held"
        tid, why = self.shared.claim(cfg.name, trial.params, trial.distributions, {},
                                     self.trials)
        if why is None:
            self.own[trial.number] = tid
        return why

    def compile(self, trial, cfg):
        """Into the compile pool; the budget counts it."""
        from optuna.trial import TrialState

        self.seen[cfg.name] = (TrialState.RUNNING, None)
        self.stats.compiled += 1
        fut = self.pool.submit(self.compiler, (cfg, self.arch.sm, self.cache_dir, self.artifacts))
        self.pending.append((trial, cfg, fut))

    # -- a compiled candidate: judge, time --------------------------------------------
    def take(self, trial, cfg, fut):
        """One compiled candidate: judged by the model, then handed to a free GPU."""
        from optuna.trial import TrialState

        self.current = (trial, cfg)
        if time.monotonic() >= self.deadline:
            fut.cancel()
            self.release(trial, cfg, "search stopped by --timeout before timing")
            self.current = None
            return
        res: CompileResult = fut.result()
        self.refill()  # keep the pool busy while the GPU works
        if not res.ok:
            self.stats.compile_failed += 1
            why = res.error.splitlines()[0][:300] if res.error else ""
            self.conclude(trial, TrialRecord(trial.number, cfg, Outcome.COMPILE_FAILED, why),
                          TrialState.FAIL)
            return
        verdict = judge(cfg, res.resources, self.shape, self.arch,
                        self.stats.best_tflops if self.prune else None,
                        self.margin_for(cfg) if self.prune else None, batch=self.batch)
        rec = TrialRecord(trial.number, cfg, Outcome.PRUNED, verdict.reason,
                          resources=res.resources, figures=verdict.figures, cubin=res.cubin)
        if verdict.hopeless:
            self.stats.pruned += 1
            self.conclude(trial, rec, TrialState.PRUNED)
            return
        self.time_on_gpu(trial, rec, res.cubin)

    def margin_for(self, cfg) -> float | None:
        """The pruning margin for `cfg`: none before MIN_TIMED candidates are timed."""
        if self.margin is None or self.stats.timed < MIN_TIMED:
            return None
        return family_of(cfg).prune_margin if self.margin == "family" else self.margin

    def conclude(self, trial, rec: TrialRecord, state):
        """A candidate that ends before the GPU: told, recorded, reported."""
        self.finish(trial, rec, state=state)
        self.records.append(rec)
        self.current = None
        self.emit(rec)

    def time_on_gpu(self, trial, rec: TrialRecord, cubin: Path):
        """Hand the candidate to a free GPU (waiting for one), then tell what is done."""
        self.wait_for(free_needed=True)
        b = self.free.popleft()
        self.inflight[self.timer.submit(b.measure, rec.config, cubin)] = (trial, rec, b,
                                                                          time.time())
        self.current = None
        for f in [f for f in self.inflight if f.done()]:
            self.measured(f)

    def wait_for(self, free_needed: bool):
        """Collect finished timings: until a GPU is free, or (False) until none is busy."""
        while self.inflight and (not self.free or not free_needed):
            done, _ = cf.wait(list(self.inflight), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                self.measured(fut)

    def measured(self, fut):
        """A timing finished: tell the study (here, in the search's own thread)."""
        from optuna.trial import TrialState

        stats = self.stats
        trial, rec, b, started = self.inflight.pop(fut)
        self.free.append(b)
        m = fut.result()
        extra = dict(timed_at=[round(started, 3), round(time.time(), 3)])
        if len(self.benches) > 1:
            extra["gpu"] = self.benches.index(b)
        rec.outcome, rec.reason, rec.error = m.outcome, m.message, m.error
        rec.error_exact = m.error_exact
        if m.outcome is Outcome.TIMED:
            stats.timed += 1
            rec.timing = m.timing
            rec.tflops = m.timing.tflops(self.bench.flops)
            stats.best_tflops = max(stats.best_tflops or 0.0, rec.tflops)
            self.finish(trial, rec, value=rec.tflops, extra=extra)
            if stats.timed % self.baseline_every == 0:
                self.time_baseline(b)  # cuBLAS interleaved with the candidates, on that GPU
        else:
            if m.outcome is Outcome.WRONG_RESULT:
                stats.wrong += 1
            else:
                stats.launch_failed += 1
            self.finish(trial, rec, state=TrialState.FAIL, extra=extra)
        self.records.append(rec)
        self.emit(rec)

    def time_baseline(self, b=None):
        """cuBLAS, on `b` (default: the first GPU)."""
        m = (self.bench if b is None else b).baseline()
        self.baselines.append(m.timing)
        self.stats.cublas_tflops = self.bench.flops / (statistics.median(
            t.median_ms for t in self.baselines) * 1e-3) / 1e12

    # -- tell, and sync with the shared study -----------------------------------------
    def tell(self, trial, value=None, state=None):
        if value is not None:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)

    def finish(self, trial, rec: TrialRecord, value: float | None = None, state=None,
               extra=None):
        """Tell the outcome, with its attributes, here and (written later) to the shared
        study."""
        from optuna.trial import TrialState

        attrs = dict(kernel=rec.config.name, outcome=rec.outcome.value)
        if rec.reason:
            attrs["reason"] = rec.reason
        if rec.figures:
            attrs["figures"] = rec.figures
        attrs.update(extra or {})
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        self.tell(trial, value, state)
        self.seen[rec.config.name] = (state or TrialState.COMPLETE, value)
        if trial.number in self.own:
            self.shared.finish_later(self.own.pop(trial.number), attrs,
                                     state or TrialState.COMPLETE, value)

    def release(self, trial, cfg, reason: str):
        """An own claim ends unfinished (Ctrl-C, --timeout): failed without an outcome, so
        a later run or another process takes it up again."""
        from optuna.trial import TrialState

        self.seen.pop(cfg.name, None)
        trial.set_user_attr("reason", reason)
        self.tell(trial, state=TrialState.FAIL)
        if trial.number in self.own:
            self.shared.finish(self.own.pop(trial.number), {"reason": reason}, TrialState.FAIL)

    def emit(self, rec):
        self.stats.seconds = time.monotonic() - self.t0
        if self.on_event:
            self.on_event(rec, self.stats)

    def full(self) -> bool:
        if self.shared is None:
            return self.stats.compiled >= self.trials
        return len(self.shared.held()) >= self.trials

    def others_busy(self) -> bool:
        """Shared and in time: do others hold claims, or wait released ones for a retry?"""
        shared = self.shared
        return shared is not None and time.monotonic() < self.deadline and bool(
            shared.others_running() or (not self.full() and shared.released()))

    def wait_for_others(self):
        """Others still hold claims: wait for them to finish, or to go stale and be
        retried here, so the study ends with every candidate done."""
        time.sleep(min(max(self.shared.interval / 4, 0.05), 1.0,
                       max(self.deadline - time.monotonic(), 0)))
        self.sync(force=True)

    def sync(self, force=False):
        """Read the shared study (unless forced, once a second while other workers are
        busy in it, less often, up to the lease interval, while none is) and take in what
        the others finished."""
        shared = self.shared
        if shared is None or not (force or time.monotonic() - self.synced_at >= self.sync_every):
            return
        shared.read()
        self.synced_at = time.monotonic()
        if self.take_in() or shared.others_running():
            self.sync_every = 1.0
        else:  # alone so far: this worker's own trials are all a read would bring
            self.sync_every = min(self.sync_every * 2, max(shared.interval, 1.0))

    def take_in(self) -> int:
        """What the shared study finished that this process did not: into the local study
        (the sampler learns from it) and the records; the first time, as resumed. Returns
        how many."""
        import optuna

        first, n = not self.synced_once, 0
        for name, c in self.shared.claims().items():
            t = c.trial
            if c.status != "done" or name in self.seen:
                continue
            cfg = config_from_name(name)
            if not is_candidate(cfg, self.dtype, self.variant) or \
                    (self.only is not None and family_of(cfg).name not in self.only):
                continue
            self.seen[name] = (t.state, t.value)
            try:
                self.study.add_trial(optuna.trial.create_trial(
                    params=t.params, distributions=t.distributions, value=t.value,
                    state=t.state, user_attrs=dict(t.user_attrs)))
            except ValueError:  # a parameter outside this run's space: the record still counts
                pass
            self.count_taken_in(t, cfg, first)
            n += 1
        self.synced_once = True
        return n

    def count_taken_in(self, t, cfg, first: bool):
        """One trial taken in: at the first sync an earlier run's (resumed, counted as if
        done here), later another process's; its record if timed."""
        from optuna.trial import TrialState

        stats = self.stats
        if first:
            stats.resumed += 1
            stats.compiled += 1
        else:
            stats.from_others += 1
        if t.state == TrialState.COMPLETE:
            stats.best_tflops = max(stats.best_tflops or 0.0, t.value)
            if first:
                stats.timed += 1
            self.records.append(TrialRecord(t.number, cfg, Outcome.TIMED, tflops=t.value,
                                            figures=t.user_attrs.get("figures", {})))
        elif first:
            out = t.user_attrs.get("outcome")
            if out == Outcome.COMPILE_FAILED.value:
                stats.compile_failed += 1
            elif out == Outcome.LAUNCH_FAILED.value:
                stats.launch_failed += 1
            elif out == Outcome.WRONG_RESULT.value:
                stats.wrong += 1
            else:
                stats.pruned += 1


#: a family's default leads the first batch only if the model predicts it within this
#: factor of the best prediction: the model cannot order tiles within a family (hence the
#: defaults), but it does tell the CUDA cores from the tensor cores (fp16 at 4096^3: the
#: CUDA-core default measured 35 TFLOP/s, the wgmma kernels 600-700), and timing a default
#: that far behind costs a search its first seconds (a large problem's whole share)
FIRST_BATCH_MARGIN = 4.0


#: the families whose best prediction is within this factor of the best take turns in the
#: first batch (tuner.search._first); one further behind waits for the rest of the ranking
#: (fp16 at 4096^3: WMMA's best predicted 2.75x behind wgmma's, measured 2.5x)
FAMILY_TURN_MARGIN = 2.0


#: how much of the model's ranking of a space is kept between first batches (fastest
#: first): a resumed or repeated search skips at most this many already-tried candidates
#: without ranking the whole space again
RANKING_KEPT = 2048


@functools.lru_cache(maxsize=8)
def _ranking(shape: tuple, dtype: DType, arch: ArchLimits, variant: Variant | None,
             batch: int, keep: int | None = RANKING_KEPT,
             only: Only = None) -> tuple[tuple, tuple, bool]:
    """(the families' defaults that are valid points here, with their predicted seconds;
    the `keep` others (None: all) the model predicts fastest, (seconds, config), fastest
    first, ties in grid order; whether that is all of them). The whole space is enumerated
    and predicted once per arguments (at a small shape with split-K variants some 90,000
    points: seconds), and no configuration's name is made (a microsecond or two each)."""
    known = defaults(dtype, arch, variant, only)
    found = [False] * len(known)
    preds = []
    for i, c in enumerate(valid_configs(arch, dtype, shape, variant, only)):
        hit = next((j for j, d in enumerate(known)
                    if not found[j] and type(c) is type(d) and c == d), None)
        if hit is not None:
            found[hit] = True
        elif not likely_spills(c, arch):
            preds.append((predict_before_compile(c, shape, arch, batch).seconds, i, c))
    kept = heapq.nsmallest(len(preds) if keep is None else keep, preds,
                           key=lambda r: (r[0], r[1]))
    first = tuple((predict_before_compile(d, shape, arch, batch).seconds, d)
                  for d, ok in zip(known, found) if ok)
    return first, tuple((t, c) for t, _, c in kept), len(kept) == len(preds)


def model_first(shape, dtype: DType, arch: ArchLimits, n: int,
                exclude: set[str] = frozenset(), variant: Variant | None = None,
                batch: int = 1, only: Only = None) -> list[Config]:
    """The first batch, `n` valid configurations not in `exclude`: each searched family's
    default for `dtype` (its best measured on the GPU, a known good start the model cannot
    yet tell from its neighbours: within the wgmma family it predicts nearly every tile at
    the tensor-core peak) predicted within FIRST_BATCH_MARGIN of the best prediction, then
    the ones the model predicts fastest, before compiling (registers estimated; those
    likely to spill left out), fastest first (ties by name), near ties of one tile after
    the other tiles (_spread). Spreading the batch over distinct predicted times instead
    was tried on the 4096^3 replay and did worse (bench/NOTES.md). Every one is built as
    `variant` (default: the plain problem) and predicted at a batch of `batch`; of the
    families in `only`, if given. The ranking is kept between calls (_ranking)."""
    return _first(tuple(shape), dtype, arch, n, exclude, variant, batch, RANKING_KEPT, only)


def _first(shape, dtype, arch, n, exclude, variant, batch, keep, only=None) -> list[Config]:
    known, ranked, whole = _ranking(shape, dtype, arch, variant, batch, keep, only)
    best = min([t for t, _ in known] + [t for t, _ in ranked[:1]], default=0.0)
    first = [c for t, c in known if t <= FIRST_BATCH_MARGIN * best]
    # a default far behind takes its place in the ranking
    ranked = sorted([*ranked, *((t, c) for t, c in known if c not in first)],
                    key=lambda r: r[0])
    out = [c for c in first if c.name not in exclude]
    ranked_order = sorted(ranked, key=lambda r: (r[0], r[1].name))  # ties by name
    order = [c for _, c in ranked_order]
    # the families predicted within FAMILY_TURN_MARGIN of the best take turns, each its
    # own fastest first: the model orders a family's kernels better than it weighs one
    # family against another (at 1x14336x4096 bf16 it put 128x128 wgmma tiles at 3.4
    # TFLOP/s, measured 1.9, beside decode kernels predicted 3.3 and measured 3.5, and a
    # first batch of wgmma alone left the tune three decode kernels)
    leaders = list(dict.fromkeys(c.family for t, c in ranked if t <= FAMILY_TURN_MARGIN * best))
    turns = {f: _spread([(t, c) for t, c in ranked_order if c.family is f
                         and c.name not in exclude], n)
             for f in leaders}
    rest = [c for c in order if c.family not in leaders and c.name not in exclude]
    taken = {c.name for c in out}
    while len(out) < n and turns:
        for f, it in list(turns.items()):
            c = next((c for c in it if c.name not in taken), None)
            if c is None:
                del turns[f]
            elif len(out) < n:
                out.append(c)
                taken.add(c.name)
    out += [c for c in rest if c.name not in taken][:n - len(out)]
    if len(out) < n and not whole:  # more tried than the kept ranking holds: all of it
        return _first(shape, dtype, arch, n, exclude, variant, batch, None, only)
    return out


#: within a first batch, a candidate predicted within this fraction of one already in it of
#: the same tile (the same block and micro-tile, K-split and stages: it differs only in
#: padding, raster group or warp shape, which the model weighs at a fraction of a percent)
#: waits until the batch holds one of each such tile: at 128x4096x4096 fp32 a dozen 128x256
#: variants 0.4% apart filled the batch ahead of the 64x256 tile measured fastest
NEAR_TIE = 0.005


def _tile(c):
    """What a near tie shares: the block and micro-tile, K-split and stages. A streaming
    kernel (the decode family) has none: its warps' arrangement sets the bytes it keeps in
    flight, which is what the model times it by, so each is its own."""
    if family_of(c).streams_b:
        return c
    return (c.family, c.bm, c.bn, c.bk, c.split, getattr(c, "rm", 0), getattr(c, "rn", 0),
            getattr(c, "stages", 0))


def _spread(ranked: list, n: int) -> Iterator:
    """`ranked` ((seconds, config), fastest first) with, among its first `n`, each near tie
    of a tile already taken (NEAR_TIE) put after them: the first batch spreads over tiles,
    and a batch of one (the fill's next point) is the plain ranking."""
    head, waits, times = [], [], {}
    for t, c in ranked:
        if len(head) >= n:
            break
        k = _tile(c)
        if k in times and t <= times[k] * (1 + NEAR_TIE):
            waits.append(c)
        else:
            times.setdefault(k, t)
            head.append(c)
    yield from head
    yield from waits
    yield from (c for _, c in ranked[len(head) + len(waits):])


def rank_correlation(records: list[TrialRecord]) -> float | None:
    """Spearman's rho between the predicted and the measured TFLOP/s of the timed records
    (the same as between the times); None below 3 of them."""
    pairs = [(r.figures["predicted_tflops"], r.tflops) for r in records
             if r.outcome is Outcome.TIMED and r.tflops and "predicted_tflops" in r.figures]
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs]) if len(pairs) >= 3 else None
    return None if rho is None else round(rho, 4)


def open_storage(url, retry_s: float = 60.0):
    """An Optuna storage from a URL: any RDB URL Optuna takes (sqlite:///FILE,
    postgresql://...), or journal:///PATH for a journal file (several processes or hosts
    on a shared file system). Storage objects pass through. See tuner._study."""
    return _open_storage(url, retry_s)


def save_study(result: SearchResult, db: Path, name: str) -> None:
    """Copy the search's study into an SQLite file under `name` (replacing an older one),
    for `gemm-tune report` and Optuna's own tools (optuna-dashboard sqlite:///...)."""
    import optuna

    from tuner._rdb_batch import batched

    url = f"sqlite:///{Path(db).resolve()}"
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    try:
        optuna.delete_study(study_name=name, storage=url)
    except KeyError:
        pass
    src = result.study
    storage = optuna.storages.RDBStorage(url)
    writes = batched(storage)
    if writes is None:  # a schema these statements were not written for: Optuna's copy
        optuna.copy_study(from_study_name=src.study_name, from_storage=result.storage,
                          to_storage=storage, to_study_name=name)
        return
    sid = storage.create_new_study(src.directions, name)
    for k, v in src.user_attrs.items():
        storage.set_study_user_attr(sid, k, v)
    for k, v in result.storage.get_study_system_attrs(src._study_id).items():
        storage.set_study_system_attr(sid, k, v)
    try:
        writes.copy_trials(sid, src.get_trials(deepcopy=False))
    finally:
        writes.close()
        storage.engine.dispose()


def confirm(result: SearchResult, bench: Benchmark, top: int = 5, rounds: int = 3,
            artifacts: Path | None = None) -> list[tuple[TrialRecord, Timing, Timing]]:
    """Re-time the best `top` candidates and cuBLAS in turn (A B A B ...), `rounds` times,
    so the figures reported side by side come from the same minutes of the same run.

    Returns (record, candidate timing, cuBLAS timing) best first; each timing pools the
    repetitions of every round. Candidates taken over from an earlier run are compiled
    again first (a compile-cache hit) for their cubin, resources and artifacts.
    """
    best = result.timed()[:top]
    for r in best:
        if r.cubin is None:
            res = compile_config(r.config, bench.arch.sm, None, artifacts)
            r.cubin, r.resources = res.cubin, res.resources
    ours: dict[str, list[float]] = {r.config.name: [] for r in best}
    theirs: list[float] = []
    for _ in range(rounds):
        for r in best:
            m = bench.measure(r.config, r.cubin)
            if m.outcome is Outcome.TIMED:
                ours[r.config.name].extend(m.timing.times_ms)
            theirs.extend(bench.baseline().timing.times_ms)
    base = Timing(tuple(theirs)) if theirs else None
    rows = [(r, Timing(tuple(ours[r.config.name])), base) for r in best if ours[r.config.name]]
    rows.sort(key=lambda row: row[1].median_ms)
    return rows
