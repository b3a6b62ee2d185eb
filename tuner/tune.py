"""`gemm-tune --shape MxNxK` on a GPU: answer from the cache, or search, confirm the
best against cuBLAS side by side, cache the winner and show the top candidates.

What is tuned is a :class:`tuner._shape.Task`: the input type and shape, the variant
(layout, C's type, bias, activation) and the batch; its cache key, study name and library
entry carry all of them."""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

from codegen.compile import nvcc_version, target_arch
from codegen.config import DType
from codegen.errors import UsageError
from codegen.occupancy import occupancy
from codegen.rendering import template_hash
from tuner._progress import PIPE_WIDTH
from tuner._shape import Task, format_shape
from tuner.cache import CacheKey, WinnerCache

__all__ = ["run_cli", "run_problems", "cache_key", "task_key"]


class _Interrupted(Exception):
    """Ctrl-C during the search: the study is kept; the CLI prints the best so far."""

    def __init__(self, result):
        super().__init__("interrupted")
        self.result = result


#: what cuBLAS was asked for, by request, in results cached before the label was stored
#: (the plain problem; tuner.bench.baseline_label says it for any)
CUBLAS_PRECISION = {"f32": "SGEMM, FP32, no TF32", "tf32": "GemmEx FP32 data, FAST_TF32",
                    "f32x3": "SGEMM, FP32, no TF32",
                    "f16": "GemmEx fp16 inputs, COMPUTE_32F", "bf16": "GemmEx bf16 inputs, COMPUTE_32F"}


def task_key(gpu: str, cc: int, cuda: str, templates: str, task: Task) -> CacheKey:
    """The cache key (and study name) of `task` on a GPU, CUDA and template version."""
    v = task.variant
    return CacheKey(gpu, cc, cuda, templates, task.dtype.short, v.layout.value, *task.shape,
                    out=v.out.short, bias=v.bias, act=v.act, batch=task.batch,
                    broadcast_b=task.broadcast_b)


def cache_key(dev, task: Task) -> CacheKey:
    cuda = re.search(r"release ([\d.]+)", nvcc_version()).group(1)
    return task_key(dev.name, dev.cc, cuda, template_hash(), task)


def _check_fits(dev, shape, dtype, task: Task | None = None) -> None:
    """The problem (its batch, B once where shared, C in its type, the bias), its float64
    references (one or two roundings of the inputs, with and without an epilogue) and one
    problem's float64 operands, and the L2 flush buffer must fit in free memory."""
    from tuner.runtime import driver

    task = task or Task(dtype, tuple(shape))
    m, n, k = shape
    v, b = task.variant, task.batch
    stored = 4 if dtype.size == 4 else dtype.size
    inputs = (m * k * b + k * n * (1 if task.broadcast_b else b)) * stored
    out = m * n * b * v.out.size + (n * 4 if v.bias != "none" else 0)
    refs = (1 if dtype is DType.F32 else 2) * (2 if (v.bias, v.act) != ("none", "none") else 1)
    need = inputs + out + (m * k + k * n + (refs + 2) * m * n * b) * 8 + 2 * dev.l2_bytes
    free, _total = driver.call("cuMemGetInfo")
    if need > free:
        raise UsageError(f"{task.label} needs {need / 2**30:.1f} GiB on the GPU "
                         f"(inputs, output, float64 references); {free / 2**30:.1f} GiB is free")


def _row(rank, rec, timing, cublas_ms, flops, arch) -> dict:
    occ = occupancy(rec.config.threads, rec.resources.registers, rec.resources.smem, arch)
    tflops = flops / (timing.median_ms * 1e-3) / 1e12
    return dict(rank=rank, kernel=rec.config.name, tflops=round(tflops, 2),
                pct_cublas=round(100 * cublas_ms / timing.median_ms, 1),
                registers=rec.resources.registers, smem=rec.resources.smem,
                occupancy=round(occ.occupancy, 3), limiter=occ.limiter,
                timing=timing.to_dict(), error=rec.error, error_exact=rec.error_exact)


def _print(result: dict, console) -> None:
    from rich.table import Table

    src = "cache" if result["from_cache"] else "this run"
    t = Table(title=f"gemm-tune {result.get('problem') or result['shape'] + ' ' + result['dtype']}"
                    f" on {result['gpu']} (from {src})")
    for col in ("#", "kernel", "TFLOP/s", "% of cuBLAS", "regs", "smem B", "occupancy",
                "limiter"):
        t.add_column(col, justify="left" if col in ("kernel", "limiter") else "right",
                     no_wrap=col == "kernel")
    for r in result["top"]:
        t.add_row(str(r["rank"]), r["kernel"], f"{r['tflops']:.1f}", f"{r['pct_cublas']:.1f}%",
                  str(r["registers"]), str(r["smem"]), f"{r['occupancy']:.0%}", r["limiter"])
    console.print(t)
    label = result.get("cublas") or CUBLAS_PRECISION.get(result["dtype"], result["dtype"])
    console.print(f"cuBLAS ({label}): {result['cublas_tflops']:.1f} TFLOP/s, measured in the "
                  "same run")
    s = result["stats"]
    console.print(
        f"search: {s['compiled']} compiled, {s['timed']} timed, {s['pruned']} pruned by the "
        f"model, {s['failed']} failed, {s['rejected']} invalid rejected, in {s['seconds']:.0f} s")
    console.print(f"winner source: {result['winner']['source']}")


class _Session:
    """What a run of the tuner shares across its problems: the cache, the GPU, the
    devices to time on, and where results are printed."""

    def __init__(self, args, artifacts: Path):
        from rich.console import Console

        from tuner.gpu import device

        self.args, self.artifacts = args, artifacts
        self.cache = WinnerCache(args.cache or artifacts / "cache.json")
        self.cache.entries()  # a corrupt cache is reported before any GPU work, kept as it is
        self.dev = device()
        if args.arch and args.arch.replace("sm_", "") != str(self.dev.cc):
            raise UsageError(f"--arch {args.arch} does not match the GPU ({self.dev.name}, "
                             f"{self.dev.sm}); use --dry-run to build for another architecture")
        self.devices = _devices(args.devices)
        self.out = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)

    def key(self, task: Task) -> CacheKey:
        return cache_key(self.dev, task)

    def result(self, task: Task, timeout: float | None = None) -> dict:
        """The cached winner of `task`, or a tune of it (cached and added to the library),
        its search stopped after `timeout` s (default --timeout); _Interrupted on Ctrl-C."""
        from tuner.space import why_unsearched

        why = why_unsearched(task.dtype, task.variant, self.dev.arch)
        if why is not None:
            raise UsageError(f"{task.label}: {why}")
        key = self.key(task)
        entry = self.cache.get(key)
        if entry and not self.args.force:
            result = dict(entry["result"], from_cache=True)
            # a library that lacks it (another --library than the tune's) gets it too
            _add_to_library(self.args, self.artifacts, self.dev, key, result, missing=True)
            return result
        _check_fits(self.dev, task.shape, task.dtype, task)
        # stdout carries the result alone (--json): what libraries print goes to stderr
        args = self.args
        if timeout is not None:
            args = copy.copy(args)
            args.timeout = timeout
        with contextlib.redirect_stdout(sys.stderr):
            result = dict(_tune(args, task, self.artifacts, self.dev, key, self.devices),
                          from_cache=False)
        self.cache.put(key, dict(result=result, **result["winner"]))
        _add_to_library(self.args, self.artifacts, self.dev, key, result)
        return result


def _interrupted(args, stop: _Interrupted) -> int:
    best = stop.result.timed()
    where = (f"; run the same command to resume (study in {args.storage})"
             if args.storage else "; pass --storage sqlite:///FILE to keep a study")
    print("gemm-tune: interrupted; best so far: " + (
        f"{best[0].config.name} at {best[0].tflops:.1f} TFLOP/s" if best else "none") + where,
        file=sys.stderr)
    return 130


def run_cli(args, tasks: list[Task], artifacts: Path) -> int:
    """Tune each task in turn (every task's candidates spread over all of --devices);
    print one table per task, or with --json one document (a list for several)."""
    session = _Session(args, artifacts)
    results = []
    for task in tasks:
        try:
            result = session.result(task)
        except _Interrupted as stop:
            return _interrupted(args, stop)
        results.append(result)
        if not args.json:
            _print(result, session.out)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    return 0


def run_problems(args, problems, artifacts: Path, clock=None) -> int:
    """Tune a program's recorded problems (tuner.problems), costliest first, each within
    --trials and --timeout, all within --budget seconds; a problem tuned before answers
    from the cache (so a killed run, run again, goes on where it stopped). Prints a
    summary: each problem's winner, its ratio to cuBLAS and the time spent.

    With --storage the set is shared by every worker (process, GPU, host) run with the
    same storage (tuner._shared_problems): each takes problems no one else holds, waits
    for those others hold, and shows every problem's winner, whoever tuned it."""
    import time

    storage, study = getattr(args, "storage", None), getattr(args, "study", None)
    if storage:  # --study names the set's claims; each problem's search has its own study
        args = copy.copy(args)
        args.study = None
    run = _ProblemRun(_Session(args, artifacts), args, problems, clock or time.monotonic)
    try:
        rows = run.shared(storage, study) if storage else run.alone()
    except _Interrupted as stop:
        return _interrupted(args, stop)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_problems(rows, run.session.out, run.me)
    return 0


#: the least search time a problem gets from a shared --budget: a cold start compiles its
#: first candidates (a wgmma kernel about a second of ptxas each) before anything is timed;
#: with 10 s the 8192x14336x4096 bf16 problems of bench/model_gemms.py timed only CUDA-core
#: kernels, at 0.05x cuBLAS
MIN_SHARE_S = 20.0


class _ProblemRun:
    """One `gemm-tune tune --problems` run: each problem in turn skipped (no family builds
    it, or the budget is spent), answered from the cache, or tuned; alone, or sharing the
    set with other workers through the storage. With --budget each problem's search gets
    its share of what is left (:meth:`share`)."""

    def __init__(self, session, args, problems, clock):
        self.session, self.args, self.problems, self.clock = session, args, problems, clock
        self.start = clock()
        self.me = None  # this worker, when shared

    def alone(self) -> list[dict]:
        rows = []
        for i, p in enumerate(self.problems, 1):
            why = self.not_tunable(p) or self.over_budget()
            self.say(i, p, f": skipped, {why}" if why else "")
            rows.append(self.skipped(p, why) if why else self.tune(p))
        return rows

    def shared(self, storage: str, study: str | None) -> list[dict]:
        """Until every problem has a row: take the free ones in turn (claimed first),
        answer the done ones from the study, and wait for those others hold."""
        from tuner._shared_problems import DEFAULT_STUDY, SharedProblems

        lease = float(getattr(self.args, "lease", 60.0))
        claims = SharedProblems(storage, study or DEFAULT_STUDY, (max(lease / 6, 0.1), lease))
        self.me, rows, waiting = claims.worker, {}, set()
        try:
            claims.read()
            while True:
                for i, p in enumerate(self.problems, 1):
                    row = None if i in rows else self.take(i, p, claims, waiting)
                    if row is not None:
                        rows[i] = row
                if len(rows) == len(self.problems):
                    return [rows[i] for i in sorted(rows)]
                claims.wait()
        finally:
            claims.close()

    def take(self, i: int, p, claims, waiting: set) -> dict | None:
        """Problem `p`'s row: skipped, another worker's result, or tuned here after a claim;
        None while another worker holds it."""
        why = self.not_tunable(p)
        if why:
            self.say(i, p, f": skipped, {why}")
            return self.skipped(p, why)
        key = str(self.session.key(p.task))
        state, got = claims.status(key)
        if state == "done":
            self.say(i, p, f": tuned by {got['worker']}")
            return self.theirs(p, got)
        if state == "free":
            why = self.over_budget()
            if why:
                self.say(i, p, f": skipped, {why}")
                return self.skipped(p, why)
            if claims.claim(key, p.label):
                self.say(i, p)
                try:
                    row = self.tune(p)
                except BaseException:
                    claims.release(key, "interrupted or failed before it finished")
                    raise
                claims.done(key, row)
                return dict(row, worker=claims.worker)
        if i not in waiting:  # held by another worker: its result is read when it is done
            waiting.add(i)
            self.say(i, p, f": held by {(got or {}).get('worker', 'another worker')}, waiting")
        return None

    def not_tunable(self, p) -> str | None:
        return p.why_not(getattr(getattr(self.session, "dev", None), "arch", None))

    def over_budget(self) -> str | None:
        budget = self.args.budget
        if budget is not None and self.clock() - self.start >= budget:
            return f"the --budget of {budget:g} s was spent"
        return None

    def say(self, i: int, p, note: str = "") -> None:
        print(f"gemm-tune: problem {i}/{len(self.problems)}: {p.label} ({p.calls} calls)"
              + note, file=sys.stderr, flush=True)

    @staticmethod
    def skipped(p, why: str) -> dict:
        return dict(problem=p.label, calls=p.calls, ms=p.ms, skipped=why, **p.task.fields())

    def share(self, p) -> float | None:
        """With --budget, `p`'s search time: what is left of the budget, shared by `p` and
        the problems after it in proportion to their work (the time the program spent in
        each where the record has it for all, else FLOPs x calls: the order they are
        taken in), at least MIN_SHARE_S and at most --timeout. None without a budget."""
        budget = self.args.budget
        if budget is None:
            return None
        rest = self.problems[self.problems.index(p):]
        work = ((lambda q: q.ms) if all(q.ms for q in rest) else (lambda q: q.flops))
        left = budget - (self.clock() - self.start)
        share = left * work(p) / max(sum(work(q) for q in rest), 1e-30)
        return min(getattr(self.args, "timeout", None) or math.inf, max(MIN_SHARE_S, share))

    def tune(self, p) -> dict:
        """The problem's winner (tuned here, or from the cache) as a summary row."""
        began = self.clock()
        result = self.session.result(p.task, self.share(p))
        w = result["winner"]
        return dict(problem=p.label, **p.task.fields(), calls=p.calls, ms=p.ms,
                    kernel=w["name"], tflops=w["tflops"], ratio=w["ratio"],
                    seconds=round(self.clock() - began, 1), from_cache=result["from_cache"])

    @staticmethod
    def theirs(p, got: dict) -> dict:
        """Another worker's result for `p`: its winner, with this run's record of `p`."""
        return dict(problem=p.label, **p.task.fields(), calls=p.calls, ms=p.ms,
                    **{k: got.get(k) for k in ("kernel", "tflops", "ratio", "seconds",
                                               "from_cache", "worker")})


def _print_problems(rows: list[dict], console, me: str | None = None) -> None:
    """The summary table; shared (`me`: this worker), a column says who tuned each."""
    from rich.table import Table

    t = Table(title=f"gemm-tune: {len(rows)} recorded problems, costliest first (problem: "
                    "shape, input type, layout, C's type, epilogue, batch)")
    cols = ("problem", "calls", "recorded ms", "winner", "x cuBLAS", "tune s")
    for col in cols + (("tuned by",) if me else ()):
        t.add_column(col, justify="left" if col in ("problem", "winner", "tuned by")
                     else "right")
    for r in rows:
        ms = "-" if r["ms"] is None else f"{r['ms']:.1f}"
        if "skipped" in r:
            cells = [r["problem"], str(r["calls"]), ms, f"skipped: {r['skipped']}", "-", "-"]
        else:
            cells = [r["problem"], str(r["calls"]), ms, r["kernel"], f"{r['ratio']:.2f}",
                     "cached" if r["from_cache"] else f"{r['seconds']:.0f}"]
        if me:
            who = r.get("worker")
            cells.append("-" if who is None else "this worker" if who == me else who)
        t.add_row(*cells)
    console.print(t)


def _devices(ids: list[int] | None) -> list[int]:
    """--devices (parsed by the CLI) checked against this machine's GPUs; default:
    $GEMM_TUNE_DEVICE or 0."""
    import os

    from tuner.runtime.driver import device_count

    option = "--devices " + ",".join(map(str, ids or ()))
    if ids is None:
        text = os.environ.get("GEMM_TUNE_DEVICE", "").strip()
        if not text:
            return [0]  # (GPU 0: no count asked of a driver the tests fake)
        if not text.isdigit():
            raise UsageError(f"GEMM_TUNE_DEVICE={text!r}: expected a GPU number like 0")
        ids, option = [int(text)], f"GEMM_TUNE_DEVICE={text}"
    count = device_count()
    bad = [i for i in ids if i >= count]
    if bad:
        raise UsageError(f"{option}: this machine has GPUs 0..{count - 1}")
    return ids


def _add_to_library(args, artifacts: Path, dev, key: CacheKey, result: dict,
                    missing: bool = False) -> None:
    """Add the tune's winner to the library (--library, or the artifacts' one); with
    `missing`, only where the library has no entry for the problem on this GPU model (a
    cached winner: the entry a library holds stays), the winner's files compiled again
    where the artifacts no longer hold them."""
    from codegen.compile import compile_config
    from codegen.config import config_from_name
    from tuner.runtime.library import Library

    w = result["winner"]
    entry = dict(gpu=dev.name, cc=dev.cc, arch=dev.sm, cuda=key.cuda,
                 template_hash=key.template_hash, dtype=key.dtype, layout=key.layout,
                 out=key.out, bias=key.bias, act=key.act, batch=key.batch,
                 broadcast_b=key.broadcast_b,
                 m=key.m, n=key.n, k=key.k, kernel=w["name"], tflops=w["tflops"],
                 timing=w["timing"], cublas_tflops=w["cublas_tflops"],
                 cublas_timing=w["cublas_timing"], cublas=result.get("cublas"),
                 ratio=w["ratio"], error=w["error"],
                 resources=w["resources"], occupancy=w["occupancy"], limiter=w["limiter"],
                 date=w["date"], stats=result["stats"], top=result["top"])
    lib = Library.create_or_open(args.library or artifacts / "library")
    if missing and lib.store.entry_for(entry) is not None:
        return
    source, cubin = Path(w["source"]), Path(w["cubin"])
    if not (source.is_file() and cubin.is_file()):
        res = compile_config(config_from_name(w["name"]), dev.sm, artifacts_dir=artifacts)
        if not res.ok:
            print(f"gemm-tune: {w['name']} did not compile again, so it is not added to "
                  f"{lib.path}", file=sys.stderr)
            return
        source, cubin = artifacts / res.arch / f"{w['name']}.cu", Path(res.cubin)
    lib.add(entry, source, cubin, source.with_suffix(".json"),
            _static_b_twins(w["name"], dev.sm, artifacts))


def _static_b_twins(name: str, arch: str, artifacts: Path) -> tuple:
    """The winner's twin for a constant B (manifest.static_b_twin), compiled beside it, as
    Manifest.add's `twins`; none where it has none or it does not compile (logged)."""
    from codegen.compile import compile_config
    from codegen.config import config_from_name
    from tuner.runtime.manifest import static_b_twin

    twin = static_b_twin(name)
    if twin is None:
        return ()
    res = compile_config(config_from_name(twin), arch, artifacts_dir=artifacts)
    if not res.ok:
        print(f"gemm-tune: the static-B twin {twin} did not compile (the entry is stored "
              f"without it): {(res.error or '').strip().splitlines()[:1]}", file=sys.stderr)
        return ()
    source = artifacts / res.arch / f"{twin}.cu"
    return ((twin, source, Path(res.cubin), source.with_suffix(".json")),)


def _library_seeds(args, artifacts: Path, task: Task, dev) -> tuple:
    """The kernels the target library holds for exactly this problem on this GPU model, if
    any: its entry's and the one that entry replaced (Manifest.replaced). The search times
    them first, so a re-tune (a wider space, more trials) replaces the entry only with a
    kernel that beats both in the same run."""
    from codegen.config import config_from_name
    from tuner.runtime.dispatch import FULL_ALIGN, exact_entry
    from tuner.runtime.errors import LibraryError
    from tuner.runtime.manifest import Manifest

    path = Path(args.library or artifacts / "library")
    if not (path / "manifest.json").is_file():
        return ()
    try:
        held = Manifest.load(path, verify=False).serving(task.dtype, dev.cc, task.variant,
                                                          replaced=True)
        names = [e["kernel"] for e in held if exact_entry(
            [e], tuple(task.shape), task.batch, FULL_ALIGN, dev.name) is not None]
        return tuple(config_from_name(name) for name in dict.fromkeys(names))
    except (LibraryError, ValueError, UsageError):  # a library that cannot seed: none
        return ()


def _tune(args, task: Task, artifacts, dev, key, devices) -> dict:
    from tuner.worker import GpuWorker

    # one timing worker process per GPU: a kernel that faults or hangs costs only its worker
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(GpuWorker(
            task.shape, task.dtype, seed=args.seed, device=i, timeout_s=args.kernel_timeout,
            variant=task.variant, batch=task.batch, broadcast_b=task.broadcast_b))
            for i in devices]
        return _tune_with(args, task, artifacts, dev, key, workers, began)


def _tune_with(args, task: Task, artifacts, dev, key, workers, began: float | None = None
               ) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from tuner._progress import progress

    from tuner.bench import baseline_label
    from tuner.search import confirm, save_study, search

    from tuner._study import check_studies_file

    shape, dtype = task.shape, task.dtype
    check_studies_file(artifacts / "studies.db")  # before the search, not when saving it
    bench = workers[0]
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(),
               TextColumn("pruned {task.fields[pruned]} failed {task.fields[failed]} "
                          "best {task.fields[best]} TFLOP/s ({task.fields[pct]} of cuBLAS)"),
               TimeElapsedColumn())
    fields = ("pruned {pruned}, failed {failed}, best {best} TFLOP/s ({pct} of cuBLAS)")
    with progress(*columns, fields_text=fields, disable=args.json) as bar:
        bar_task = bar.add_task("tuning", total=args.trials, pruned=0, failed=0, best="-",
                                pct="-")

        def on_event(rec, s):
            best = f"{s.best_tflops:.1f}" if s.best_tflops else "-"
            pct = (f"{100 * s.best_tflops / s.cublas_tflops:.0f}%"
                   if s.best_tflops and s.cublas_tflops else "-")
            bar.update(bar_task, completed=s.done, pruned=s.pruned, failed=s.failed, best=best,
                       pct=pct)

        marks = [("workers", began if began is not None else time.monotonic()),
                 ("search", time.monotonic())]
        res = search(shape, workers, dtype=dtype, trials=args.trials, timeout=args.timeout,
                     sampler=args.sampler, seed=args.seed, jobs=args.jobs, artifacts=artifacts,
                     storage=args.storage, study_name=args.study or (str(key) if args.storage
                                                                     else None),
                     lease=(max(args.lease / 6, 0.1), args.lease), on_event=on_event,
                     model=not getattr(args, "no_model", False), variant=task.variant,
                     batch=task.batch, seeds=_library_seeds(args, artifacts, task, dev))
        bar.update(bar_task, description="confirming")
        marks.append(("save study", time.monotonic()))
        save_study(res, artifacts / "studies.db", str(key))
        if not res.timed():
            raise UsageError("no candidate passed verification; see the artifacts' .json files")
        if res.stats.interrupted:
            raise _Interrupted(res)
        marks.append(("confirm", time.monotonic()))
        rows = confirm(res, bench, top=args.top, artifacts=artifacts)
        marks.append(("end", time.monotonic()))
    cublas_ms = rows[0][2].median_ms
    top = [_row(i + 1, rec, t, cublas_ms, bench.flops, dev.arch)
           for i, (rec, t, _) in enumerate(rows)]
    win_rec = rows[0][0]
    folder = artifacts / target_arch(win_rec.config, dev.sm)  # sm_90a for the wgmma family
    source = folder / f"{win_rec.config.name}.cu"
    cubin = folder / f"{win_rec.config.name}.cubin"
    s = res.stats
    winner = dict(
        name=win_rec.config.name, config=win_rec.config.to_dict(), source=str(source),
        cubin=str(cubin), cubin_sha256=hashlib.sha256(cubin.read_bytes()).hexdigest(),
        resources=win_rec.resources.to_dict(), occupancy=top[0]["occupancy"],
        limiter=top[0]["limiter"], timing=top[0]["timing"], tflops=top[0]["tflops"],
        error=win_rec.error, error_exact=win_rec.error_exact, cublas_timing=rows[0][2].to_dict(),
        cublas_tflops=round(bench.flops / (cublas_ms * 1e-3) / 1e12, 2),
        ratio=round(cublas_ms / rows[0][1].median_ms, 4),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    return dict(
        shape=format_shape(shape), dtype=dtype.short, **task.fields(), problem=task.label,
        gpu=dev.name, key=str(key), cublas_tflops=winner["cublas_tflops"],
        cublas=baseline_label(dtype, task.variant, task.batch, task.broadcast_b),
        winner=winner, top=top,
        stats=dict(asked=s.asked, rejected=s.rejected, duplicates=s.duplicates,
                   compiled=s.compiled, compile_failed=s.compile_failed, pruned=s.pruned,
                   launch_failed=s.launch_failed, wrong=s.wrong, timed=s.timed,
                   failed=s.failed, resumed=s.resumed, from_others=s.from_others,
                   seconds=round(s.seconds, 1), sampler=args.sampler,
                   rank_rho=s.rank_rho, model_first=s.model_first, filled=s.filled,
                   trials=args.trials, seed=args.seed,
                   # seconds of each step: the timing workers' start, the search, the
                   # study's copy to studies.db, the best re-timed beside cuBLAS
                   steps_s={name: round(end - start, 2) for (name, start), (_, end)
                            in zip(marks, marks[1:])}),
    )
