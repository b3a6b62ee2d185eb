"""The Optuna search: ask for configurations, reject the invalid at once, compile the
rest in a process pool ahead of the GPU, prune what the model calls hopeless, and
time the survivors against cuBLAS, interleaved.

The benchmark is an argument (anything with `arch`, `flops`, `measure(config, cubin)`
and `baseline()`), so the loop runs in CPU tests with a fake one.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import logging
import multiprocessing
import os
import socket
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Protocol

from codegen.arch import ArchLimits
from codegen.check import check
from codegen.compile import (
    CompileResult, Resources, compile_config, compile_task, default_cache_dir,
)
from codegen.config import DType, config_from_name
from codegen.families import Config
from tuner.model import judge, shape_reasons
from tuner.outcome import Measurement, Outcome, Timing
from tuner.space import is_candidate, params_of, suggest, valid_configs

__all__ = ["Benchmark", "TrialRecord", "SearchStats", "SearchResult", "search", "make_sampler",
           "open_storage"]

log = logging.getLogger(__name__)


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

    def timed(self) -> list[TrialRecord]:
        return sorted((r for r in self.records if r.outcome is Outcome.TIMED),
                      key=lambda r: -r.tflops)

    @property
    def cublas_ms(self) -> float:
        return statistics.median(t.median_ms for t in self.baselines)


def make_sampler(name: str, seed: int | None):
    """TPE or random. The grid is not an Optuna GridSampler (it rescans every trial on each
    ask: 3000 asks took 230 s) but :class:`_GridAsker` over the valid configurations."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=16)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


class _GridAsker:
    """Every valid configuration once, in an order shuffled by the seed; each is handed to
    Optuna through a PartialFixedSampler, so a trial's parameters are the configuration's."""

    def __init__(self, study, arch: ArchLimits, dtype: DType, shape, seed: int | None):
        import random

        self.study, self.base = study, study.sampler
        self.shape, self.arch, self.dtype = tuple(shape), arch, dtype
        self.todo = list(valid_configs(arch, dtype, shape))
        random.Random(seed).shuffle(self.todo)

    def ask(self):
        import optuna

        if not self.todo:
            return None
        cfg = self.todo.pop()
        params = params_of(cfg, self.dtype, self.shape, self.arch)
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
    on_event: Callable[[TrialRecord | None, SearchStats], None] | None = None,
) -> SearchResult:
    """Search the space for `shape`; `trials` counts candidates compiled (valid, new ones).

    `bench` may be a list, one benchmark per GPU: candidates are then timed on whichever
    GPU is free, concurrently, and told to the one study as they finish.
    """
    import optuna
    from optuna.trial import TrialState

    t0 = time.monotonic()
    deadline = t0 + timeout
    benches = list(bench) if isinstance(bench, (list, tuple)) else [bench]
    bench = benches[0]
    arch = bench.arch
    stats = SearchStats()
    records: list[TrialRecord] = []
    seen: dict[str, tuple[TrialState, float | None]] = {}
    baselines: list[Timing] = []
    shared = storage is not None  # other processes may work on the same study
    storage = open_storage(storage) if storage else optuna.storages.InMemoryStorage()
    study = optuna.create_study(
        direction="maximize", sampler=make_sampler(sampler, seed), storage=storage,
        study_name=study_name, load_if_exists=True,
    )
    _resume(study, dtype, seen, records, stats)
    grid = _GridAsker(study, arch, dtype, shape, seed) if sampler == "grid" else None
    if grid:
        grid.todo = [c for c in grid.todo if c.name not in seen]
    max_asks = trials * 50 + 2000

    def tell(trial, value=None, state=None):
        if value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)

    cache_dir = Path(cache_dir or default_cache_dir())
    jobs = max(1, jobs or os.cpu_count() or 1)
    pool = (_InlineExecutor() if jobs == 1 else cf.ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn")))
    pending: collections.deque = collections.deque()

    def emit(rec):
        stats.seconds = time.monotonic() - t0
        if on_event:
            on_event(rec, stats)

    def time_baseline(b=bench):
        m = b.baseline()
        baselines.append(m.timing)
        stats.cublas_tflops = bench.flops / (statistics.median(
            t.median_ms for t in baselines) * 1e-3) / 1e12

    def finish(trial, rec: TrialRecord, value: float | None = None, state=None):
        trial.set_user_attr("kernel", rec.config.name)
        trial.set_user_attr("outcome", rec.outcome.value)
        if rec.reason:
            trial.set_user_attr("reason", rec.reason)
        if rec.figures:
            trial.set_user_attr("figures", rec.figures)
        tell(trial, value, state)
        seen[rec.config.name] = (state or TrialState.COMPLETE, value)

    def refill():
        lookahead = 2 * jobs
        while (len(pending) < lookahead and stats.compiled < trials
               and stats.asked < max_asks and time.monotonic() < deadline):
            trial = grid.ask() if grid else study.ask()
            if trial is None:  # the grid is done
                break
            stats.asked += 1
            cfg = suggest(trial, dtype, tuple(shape), arch)
            reasons = check(cfg, arch) + shape_reasons(cfg, tuple(shape), arch)
            if reasons:
                stats.rejected += 1
                trial.set_user_attr("outcome", Outcome.REJECTED.value)
                trial.set_user_attr("reason", "; ".join(reasons))
                tell(trial, state=TrialState.PRUNED)
                continue
            if cfg.name not in seen and shared and _claimed_elsewhere(study, trial, cfg.name):
                # another process holds it (running or done): never timed twice
                stats.duplicates += 1
                trial.set_user_attr("duplicate_of", cfg.name)
                trial.set_user_attr("reason", "claimed by another worker of this study")
                tell(trial, state=TrialState.PRUNED)
                continue
            if cfg.name in seen:  # asked again: answer from the first time, free
                stats.duplicates += 1
                state, value = seen[cfg.name]
                trial.set_user_attr("duplicate_of", cfg.name)
                # still compiling or timing: nothing to copy yet
                tell(trial, value, TrialState.PRUNED if state == TrialState.RUNNING else state)
                continue
            seen[cfg.name] = (TrialState.RUNNING, None)
            stats.compiled += 1
            fut = pool.submit(compile_task, (cfg, arch.sm, cache_dir, artifacts))
            pending.append((trial, cfg, fut))

    current: list = []  # the trial between leaving `pending` and being measured
    free = collections.deque(benches)  # GPUs with nothing to time
    inflight: dict = {}  # future -> (trial, record, benchmark)
    timer = (_InlineExecutor() if len(benches) == 1
             else cf.ThreadPoolExecutor(max_workers=len(benches)))

    def measured(fut):
        """A timing finished: tell the study (here, in the search's own thread)."""
        trial, rec, b = inflight.pop(fut)
        free.append(b)
        m = fut.result()
        rec.outcome, rec.reason, rec.error = m.outcome, m.message, m.error
        rec.error_exact = m.error_exact
        if m.outcome is Outcome.TIMED:
            stats.timed += 1
            rec.timing = m.timing
            rec.tflops = m.timing.tflops(bench.flops)
            stats.best_tflops = max(stats.best_tflops or 0.0, rec.tflops)
            finish(trial, rec, value=rec.tflops)
            if stats.timed % baseline_every == 0:
                time_baseline(b)  # cuBLAS interleaved with the candidates, on that GPU
        else:
            if m.outcome is Outcome.WRONG_RESULT:
                stats.wrong += 1
            else:
                stats.launch_failed += 1
            finish(trial, rec, state=TrialState.FAIL)
        records.append(rec)
        emit(rec)

    def wait_for(free_needed: bool):
        """Collect finished timings: until a GPU is free, or (False) until none is busy."""
        while inflight and (not free or not free_needed):
            done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                measured(fut)

    try:
        time_baseline()
        refill()
        while pending:
            trial, cfg, fut = pending.popleft()
            current[:] = [trial, cfg]
            if time.monotonic() >= deadline:
                trial.set_user_attr("reason", "search stopped by --timeout before timing")
                tell(trial, state=TrialState.FAIL)
                fut.cancel()
                current.clear()
                continue
            res: CompileResult = fut.result()
            refill()  # keep the pool busy while the GPU works
            if not res.ok:
                stats.compile_failed += 1
                rec = TrialRecord(trial.number, cfg, Outcome.COMPILE_FAILED,
                                  res.error.splitlines()[0][:300] if res.error else "")
                finish(trial, rec, state=TrialState.FAIL)
                records.append(rec)
                current.clear()
                emit(rec)
                continue
            verdict = judge(cfg, res.resources, tuple(shape), arch, stats.best_tflops)
            rec = TrialRecord(trial.number, cfg, Outcome.PRUNED, verdict.reason,
                              resources=res.resources, figures=verdict.figures, cubin=res.cubin)
            if verdict.hopeless:
                stats.pruned += 1
                finish(trial, rec, state=TrialState.PRUNED)
                records.append(rec)
                current.clear()
                emit(rec)
                continue
            wait_for(free_needed=True)
            b = free.popleft()
            if len(benches) > 1:
                trial.set_user_attr("gpu", benches.index(b))
            inflight[timer.submit(b.measure, cfg, res.cubin)] = (trial, rec, b)
            current.clear()
            for f in [f for f in inflight if f.done()]:
                measured(f)
        wait_for(free_needed=False)
        if shared:
            _take_in_others(study, dtype, seen, records, stats)
        time_baseline()
    except KeyboardInterrupt:
        # Ctrl-C: every finished trial is already in the study; the unfinished ones are
        # marked failed (not left RUNNING), so the same command resumes cleanly.
        stats.interrupted = True
        unfinished = ([tuple(current)] if current else []) + [(t, c) for t, c, _ in pending]
        unfinished += [(t, r.config) for t, r, _ in inflight.values()]
        for trial, cfg in unfinished:
            if seen.get(cfg.name, (TrialState.RUNNING,))[0] == TrialState.RUNNING:
                seen.pop(cfg.name, None)
                trial.set_user_attr("reason", "interrupted (Ctrl-C) before it finished")
                tell(trial, state=TrialState.FAIL)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        timer.shutdown(wait=False, cancel_futures=True)
    stats.seconds = time.monotonic() - t0
    return SearchResult(tuple(shape), dtype, records, baselines, stats, study, storage)


def open_storage(url):
    """An Optuna storage from a URL: any RDB URL Optuna takes (sqlite:///FILE,
    postgresql://...), or journal:///PATH for a journal file (several processes or hosts
    on a shared file system). Storage objects pass through."""
    import optuna

    if not isinstance(url, str):
        return url
    if url.startswith("journal:///"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal://"):]))
    return url


#: who ran a trial of a shared study: host and process
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _claimed_elsewhere(study, trial, name: str) -> bool:
    """Claim `name` for `trial` in the shared study, then look for another holder (of any
    process). Each process writes its claim before it reads the others', so of two that
    race for one candidate at most one goes on (if both see each other, both withdraw
    and a later ask takes it). Failed trials hold nothing: they are retried."""
    from optuna.trial import TrialState

    trial.set_user_attr("claim", name)
    trial.set_user_attr("worker", _WORKER)
    held = any(t.number != trial.number and t.user_attrs.get("claim") == name
               for t in study.get_trials(deepcopy=False, states=(
                   TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)))
    if held:
        trial.set_user_attr("claim", None)
    return held


def _take_in_others(study, dtype: DType, seen: dict, records: list,
                    stats: SearchStats) -> None:
    """The candidates other processes of a shared study timed while this one ran: they
    join the records (not the budget), so the winner comes from the whole study."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        name = t.user_attrs.get("kernel")
        if name is None or name in seen or "duplicate_of" in t.user_attrs:
            continue
        cfg = config_from_name(name)
        if is_candidate(cfg, dtype):
            seen[name] = (t.state, t.value)
            stats.from_others += 1
            stats.best_tflops = max(stats.best_tflops or 0.0, t.value)
            records.append(TrialRecord(t.number, cfg, Outcome.TIMED, tflops=t.value,
                                       figures=t.user_attrs.get("figures", {})))


def _resume(study, dtype: DType, seen: dict, records: list, stats: SearchStats) -> None:
    """Take in what an earlier run of this study finished: those candidates count towards
    the budget and are never compiled or timed again. Failed ones are retried."""
    from optuna.trial import TrialState

    for t in study.trials:
        name = t.user_attrs.get("kernel")
        if name is None or "duplicate_of" in t.user_attrs or \
                t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            continue
        cfg = config_from_name(name)
        if not is_candidate(cfg, dtype) or name in seen:
            continue
        seen[name] = (t.state, t.value)
        stats.resumed += 1
        stats.compiled += 1
        if t.state == TrialState.COMPLETE:
            stats.timed += 1
            stats.best_tflops = max(stats.best_tflops or 0.0, t.value)
            records.append(TrialRecord(t.number, cfg, Outcome.TIMED, tflops=t.value,
                                       figures=t.user_attrs.get("figures", {})))
        else:
            stats.pruned += 1


def save_study(result: SearchResult, db: Path, name: str) -> None:
    """Copy the search's study into an SQLite file under `name` (replacing an older one),
    for `gemm-tune report` and Optuna's own tools (optuna-dashboard sqlite:///...)."""
    import optuna

    url = f"sqlite:///{Path(db).resolve()}"
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    try:
        optuna.delete_study(study_name=name, storage=url)
    except KeyError:
        pass
    optuna.copy_study(from_study_name=result.study.study_name, from_storage=result.storage,
                      to_storage=url, to_study_name=name)


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
