"""The search replayed on recorded timings (no GPU, no nvcc), as Kernel Tuner's simulation
mode replays a cache file: :class:`ReplayBenchmark` answers `compile_task` with the
recorded ptxas resources and `measure` with the recorded time of an exhaustive grid
(bench/results/search-quality-exhaustive-*.json), so `tuner.search.search` runs unchanged.

    python bench/simulate_search.py [--seeds 5] [--budget 300]

Reports, per shape with an exhaustive record, sampler and seed, the candidates compiled
(the search's budget counts these) and timed until one is within 2% of the exhaustive
best, with the model (its first batch and its pruning margin) and without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _recorded import (Study, from_exhaustive, read_json, recorded_gpu,  # noqa: E402
                       recorded_slug)

from codegen.arch import parse_arch  # noqa: E402
from codegen.compile import CompileResult, Resources  # noqa: E402
from tuner.outcome import Measurement, Outcome, Timing  # noqa: E402

#: the H200 the records were taken on
ARCH = parse_arch("sm_90").replace(sm_count=132, clock_mhz=1980)


class ReplayBenchmark:
    """A benchmark (tuner.search.Benchmark) and compiler replaying one recorded grid."""

    def __init__(self, study: Study, cublas_tflops: float, cubin: Path):
        self.arch = ARCH
        self.shape = study.shape
        self.flops = 2.0 * study.shape[0] * study.shape[1] * study.shape[2]
        self.points = {p.kernel: p for p in [*study.points, *study.untimed]}
        self.cublas_tflops = cublas_tflops
        self.cubin = cubin
        self.measured = 0

    def _ms(self, tflops: float) -> float:
        return self.flops / (tflops * 1e12) * 1e3

    def compile_task(self, args) -> CompileResult:
        cfg, arch, *_ = args
        p = self.points.get(cfg.name)
        if p is None:
            return CompileResult(cfg.name, arch, False, "not in the recorded grid", 0.0)
        res = Resources(p.registers, 0, p.spill_bytes, 0, 0, 1, p.smem)
        return CompileResult(cfg.name, arch, True, "", 0.0, self.cubin, res)

    def measure(self, config, cubin) -> Measurement:
        self.measured += 1
        p = self.points[config.name]
        ms = self._ms(p.tflops)
        return Measurement(Outcome.TIMED, Timing((ms, ms, ms)), error=1e-7)

    def baseline(self) -> Measurement:
        ms = self._ms(self.cublas_tflops)
        return Measurement(Outcome.TIMED, Timing((ms, ms, ms)), error=1e-7)


def trials_to(study: Study, cublas_tflops: float, *, model: bool, seed: int, budget: int,
              sampler: str = "tpe", within: float = 0.02) -> dict:
    """One replayed search: the compiled and timed counts when a candidate first came
    within `within` of the grid's best (None: not within the budget)."""
    import optuna

    from codegen.config import DType
    from codegen.families._common import Variant
    from tuner.search import search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = max(p.tflops for p in study.points)
    target = best / (1 + within)
    hit: dict = {}
    loose: dict = {}  # the first compiled count within 5%

    def on_event(rec, stats):
        if not hit and rec is not None and rec.tflops and rec.tflops >= target:
            hit.update(compiled=stats.compiled, timed=stats.timed, tflops=round(rec.tflops, 2))
        if not loose and rec is not None and rec.tflops and rec.tflops >= best / 1.05:
            loose.update(compiled=stats.compiled)

    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "replay.cubin"
        cubin.write_bytes(b"\x7fELF replayed")
        bench = ReplayBenchmark(study, cublas_tflops, cubin)
        t0 = time.monotonic()
        res = search(study.shape, bench, dtype=DType.parse(study.dtype), trials=budget,
                     sampler=sampler, seed=seed, jobs=1, artifacts=Path(tmp),
                     cache_dir=Path(tmp), model=model, on_event=on_event, timeout=3600,
                     only=study.families,
                     variant=Variant.from_key(study.variant) if study.variant else None)
    s = res.stats
    return dict(model=model, seed=seed, sampler=sampler, compiled_to_2pct=hit.get("compiled"),
                timed_to_2pct=hit.get("timed"), compiled_to_5pct=loose.get("compiled"),
                best_found=round(s.best_tflops or 0, 2),
                grid_best=round(best, 2), compiled=s.compiled, timed=s.timed, pruned=s.pruned,
                model_first=s.model_first, rank_rho=s.rank_rho,
                seconds=round(time.monotonic() - t0, 1))


def label(st: Study) -> str:
    """A record's shape, type and families, as a table names it."""
    return (f"{'x'.join(map(str, st.shape))} {st.dtype}"
            + (f" {st.variant.split('|')[0]} C {st.variant.split('|')[1]}" if st.variant else "")
            + (f" ({'+'.join(sorted(st.families))})" if st.families else ""))


#: a replay's budget is at most this share of its grid, so that "trials to within 2%"
#: measures the search and not the grid's size (a budget of most of a small grid finds its
#: best by exhaustion). Before the search answered its own asks after MISS_STREAK misses
#: (tuner.search), this also kept the replays short: the 3xTF32 wgmma grid, 300 points,
#: took 410-430 s a run at a budget of 150, now about 10 s.
GRID_SHARE = 0.2


def trials_to_within(studies: list[Study], seeds: int = 5, budget: int = 300,
                     sampler: str = "tpe") -> list[dict]:
    out = []
    for st in studies:
        rec = read_json(HERE / "results" / st.name)
        cublas = rec["exhaustive"]["cublas_tflops"]
        budget_of = min(budget, int(GRID_SHARE * st.valid)) if st.valid else budget
        runs = []
        for model in (True, False):
            for seed in range(seeds):
                r = trials_to(st, cublas, model=model, seed=seed, budget=budget_of,
                              sampler=sampler)
                runs.append(r)
                print(f"{label(st)} model={model} seed={seed}: compiled "
                      f"{r['compiled_to_2pct']} timed {r['timed_to_2pct']} to 2% "
                      f"(5%: {r['compiled_to_5pct']}; best {r['best_found']} of {r['grid_best']}; pruned {r['pruned']}, "
                      f"rho {r['rank_rho']}, {r['seconds']} s)", flush=True)

        def summary(model):
            xs = [r["compiled_to_2pct"] for r in runs if r["model"] is model]
            got = [x for x in xs if x is not None]
            five = [r["compiled_to_5pct"] or budget_of + 1 for r in runs if r["model"] is model]
            return dict(reached=f"{len(got)}/{len(xs)}",
                        median_compiled=statistics.median(x if x is not None else budget_of + 1
                                                          for x in xs),
                        each=xs, median_compiled_to_5pct=statistics.median(five),
                        each_5pct=five)

        out.append(dict(shape="x".join(map(str, st.shape)), dtype=st.dtype,
                        families=sorted(st.families) if st.families else None,
                        label=label(st), record=st.name, budget=budget_of,
                        sampler=sampler, with_model=summary(True), without_model=summary(False),
                        runs=runs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=300,
                    help="compiled candidates a replay may spend (at most a fifth of its grid)")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "tpe-independent", "random"))
    ap.add_argument("--record", default="",
                    help="only the records whose file name contains this (default: all)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    studies = [s for s in from_exhaustive() if args.record in s.name]
    rows = trials_to_within(studies, args.seeds, args.budget, args.sampler)
    data = dict(benchmark="simulate_search", date=time.strftime("%Y-%m-%d"),
                gpu=f"{recorded_gpu(studies)} (recorded)",
                note="replayed on recorded timings (no GPU); budget counts compiled "
                     "candidates; a run that never came within 2% counts as budget + 1 in "
                     "the median", shapes=rows)
    for r in rows:
        print(f"{r['label']}: with the model {r['with_model']['reached']} reached, median "
              f"{r['with_model']['median_compiled']}; without {r['without_model']['reached']}"
              f", median {r['without_model']['median_compiled']}")
    tag = f"-{args.record}" if args.record else ""
    path = (args.out / f"simulate-search-{args.sampler}{tag}-cpu-recorded-"
            f"{recorded_slug(studies)}-{data['date']}.json")
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
