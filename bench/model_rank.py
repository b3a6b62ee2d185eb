"""Does the model rank? Spearman's rank correlation between predicted and measured time on
every recorded study, the pruning margin's evidence, the model's calibration, and the
trials a search needs to come within 2% of the exhaustive best, with and without the
model, replaying recorded timings (no GPU).

    python bench/model_rank.py                 # rho per study + margin evidence -> JSON
    python bench/model_rank.py --calibrate     # coordinate search over the model's constants
    python bench/model_rank.py --calibrate-stream   # the streaming model (decode) fitted
    python bench/model_rank.py --simulate      # + trials-to-2% on the exhaustive records
    python bench/model_rank.py --dtype f16 --by-kind   # measured / predicted per kind of kernel

The recorded data (bench/_recorded.py): the Optuna studies in artifacts/studies.db (TPE,
about 150 candidates each, on the H200) and the exhaustive grids of
bench/results/search-quality-exhaustive-*.json. The simulation replays an exhaustive grid
only: a study of 150 candidates cannot say what the best of the space is.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _recorded import Study, all_studies, recorded_gpu, recorded_slug  # noqa: E402

from codegen.arch import parse_arch  # noqa: E402
from codegen.families import config_from_name, family_of  # noqa: E402
from tuner import model  # noqa: E402
from codegen.occupancy import occupancy  # noqa: E402

ARCH = parse_arch("sm_90").replace(sm_count=132, clock_mhz=1980)  # the H200 of the records
TARGET_SHAPES = ((4096, 4096, 4096), (127, 129, 4097), (16, 4096, 4096))
#: the physical guesses the calibration started from (tuner/model.py's brackets)
PHYSICAL = dict(SATURATING_WARPS=8, MEM_LATENCY_CLK=1000, K_TILE_OVERHEAD=12,
                LDS_WAVEFRONT_SCALE=1.0, CP_ASYNC_A_COST=1.0, STS_CONFLICT=0.0)
TUNED = ("SATURATING_WARPS", "MEM_LATENCY_CLK", "K_TILE_OVERHEAD", "LDS_WAVEFRONT_SCALE",
         "CP_ASYNC_A_COST", "STS_CONFLICT")
GRID = dict(SATURATING_WARPS=(4, 6, 8, 12, 16), MEM_LATENCY_CLK=(500, 750, 1000, 1500, 2000),
            K_TILE_OVERHEAD=(4, 8, 12, 20, 32), LDS_WAVEFRONT_SCALE=(0.5, 0.75, 1.0, 1.25),
            CP_ASYNC_A_COST=(1.0, 2.0, 3.0, 4.0), STS_CONFLICT=(0.0, 0.5, 1.0, 2.0))


def _prepared(studies: list[Study]):
    """(study, [(config, occupancy, measured seconds, measured TFLOP/s)]) for fp32 studies."""
    out = []
    for s in studies:
        flops = 2.0 * s.shape[0] * s.shape[1] * s.shape[2]
        rows = []
        for p in s.points:
            c = config_from_name(p.kernel)
            occ = occupancy(c.threads, p.registers, p.smem, ARCH)
            if occ.blocks_per_sm and p.tflops > 0:
                rows.append((c, occ, flops / (p.tflops * 1e12), p.tflops))
        out.append((s, rows))
    return out


def rho_of(rows, shape) -> float | None:
    pred = [model.predict(c, shape, ARCH, occ).seconds for c, occ, _, _ in rows]
    return model.spearman(pred, [t for _, _, t, _ in rows])


def rhos(prepared) -> list[dict]:
    out = []
    for s, rows in prepared:
        r = rho_of(rows, s.shape)
        out.append(dict(study=s.name, shape="x".join(map(str, s.shape)), dtype=s.dtype,
                        points=len(rows), exhaustive=s.exhaustive,
                        rho=None if r is None else round(r, 3)))
    return out


def margin_evidence(prepared) -> list[dict]:
    """Per study: the largest best-measured / predicted TFLOP/s among candidates within 2%
    of the best (a margin below it would prune one of them once the best is known), and
    the share of candidates each margin prunes then."""
    out = []
    for s, rows in prepared:
        pred = [model.predict(c, s.shape, ARCH, occ).tflops for c, occ, _, _ in rows]
        meas = [m for *_, m in rows]
        best = max(meas)
        near = [best / p for p, m in zip(pred, meas) if m >= best / 1.02]
        ratios = [best / p for p in pred]
        # the model's order alone (fastest predicted first, ties in record order): where the
        # first candidate within 2% of the best comes
        order = sorted(range(len(pred)), key=lambda i: -pred[i])
        first_near = next(j for j, i in enumerate(order) if meas[i] >= best / 1.02) + 1
        out.append(dict(study=s.name, shape="x".join(map(str, s.shape)),
                        near_best_max_ratio=round(max(near), 3),
                        first_near_in_model_order=first_near,
                        pruned_share={str(g): round(sum(r > g for r in ratios) / len(ratios), 3)
                                      for g in (1.0, 1.25, 1.5, 2.0)}))
    return out


def kind_of(c) -> str:
    """A wgmma kernel's kind for by_kind: its tile and its consumers (c1, cooperative c2,
    ping-pong pp); other families by family and tile."""
    if getattr(c, "consumers", None) is None:
        return f"{c.family.value} {c.bm}x{c.bn}"
    return f"{c.bm}x{c.bn} " + ("pp" if c.pingpong else f"c{c.consumers}")


def by_kind(prepared) -> list[dict]:
    """Per study: measured over predicted TFLOP/s, median and range, for each kind of
    kernel (kind_of), slowest against the model first: where the model's error is not
    uniform, it misranks one kind against another."""
    out = []
    for s, rows in prepared:
        kinds: dict[str, list[float]] = {}
        for c, occ, _, tflops in rows:
            kinds.setdefault(kind_of(c), []).append(
                tflops / model.predict(c, s.shape, ARCH, occ).tflops)
        out.append(dict(study=s.name, shape="x".join(map(str, s.shape)), kinds=[
            dict(kind=k, n=len(v), median=round(statistics.median(v), 3),
                 low=round(min(v), 3), high=round(max(v), 3))
            for k, v in sorted(kinds.items(), key=lambda kv: statistics.median(kv[1]))]))
    return out


#: the streaming model's constants (tuner/model.py), its physical guesses and grid
STREAM_PHYSICAL = dict(STREAM_LATENCY_S=0.8e-6, SM_DRAM_SHARE=1.0, STREAM_ISSUE_SCALE=2.0,
                       STREAM_STAGE_COST=0.0, STREAM_PARTIAL_COST=1.0, STREAM_LAST_S=1e-6,
                       STREAM_CLUSTER_S=0.5e-6, STREAM_PASS_S=2e-6, STREAM_FIXED_S=2e-6)
STREAM_GRID = dict(STREAM_LATENCY_S=(0.5e-6, 0.75e-6, 1e-6, 1.5e-6, 2e-6, 3e-6),
                   SM_DRAM_SHARE=(0.8, 0.9, 1.0, 1.07, 1.15, 1.3, 1.6),
                   STREAM_ISSUE_SCALE=(1.0, 2.0, 4.0, 6.0, 8.0, 12.0),
                   STREAM_STAGE_COST=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0),
                   STREAM_PARTIAL_COST=(0.0, 1.0, 2.0, 4.0),
                   STREAM_LAST_S=(0.0, 1e-6, 2e-6, 4e-6, 6e-6, 8e-6),
                   STREAM_CLUSTER_S=(0.0, 1e-6, 2e-6, 4e-6, 6e-6),
                   STREAM_PASS_S=(0.0, 1e-6, 2.5e-6, 4e-6),
                   STREAM_FIXED_S=(1e-6, 2e-6, 3e-6, 5e-6))


def streams(study: Study) -> bool:
    """A study of the streaming model's families (decode) alone?"""
    return bool(study.points) and all(
        family_of(config_from_name(p.kernel)).streams_b for p in study.points)


def top_ratio(rows, shape) -> float:
    """Predicted over measured time, the median over a study's fastest tenth (at least 3):
    how far off the model is, in absolute terms, where it matters."""
    fastest = sorted(rows, key=lambda r: r[2])[:max(3, len(rows) // 10)]
    return statistics.median(model.predict(c, shape, ARCH, occ).seconds / t
                             for c, occ, t, _ in fastest)


def calibrate(prepared, passes: int = 2, tuned=TUNED, grid=GRID, absolute=False) -> dict:
    """Coordinate search over `tuned` (default TUNED, values of `grid`), maximising the mean
    rho of the studies (each study one vote, exhaustive or not); with `absolute`, less the
    mean |log top_ratio|: a family whose kernels a search weighs against another family's
    must be predicted at their own scale, not only in their own order."""
    def score():
        vals = [rho_of(rows, s.shape) for s, rows in prepared]
        off = statistics.mean(abs(math.log(top_ratio(rows, s.shape)))
                              for s, rows in prepared) if absolute else 0.0
        return statistics.mean(v for v in vals if v is not None) - off

    best = score()
    log = [dict(start={k: getattr(model, k) for k in tuned}, score=round(best, 4))]
    for _ in range(passes):
        for name in tuned:
            keep = getattr(model, name)
            for v in grid[name]:
                setattr(model, name, v)
                sc = score()
                if sc > best + 1e-4:
                    best, keep = sc, v
            setattr(model, name, keep)
            log.append(dict(name=name, value=keep, score=round(best, 4)))
            print(f"  {name} = {keep}: score {best:.4f}", flush=True)
    return dict(constants={k: getattr(model, k) for k in tuned}, score=round(best, 4),
                steps=log)


def holdout(prepared, groups, physical=PHYSICAL, grid=GRID, absolute=False) -> list[dict]:
    """Overfitting check: for each (label, test) of `groups`, the constants of `grid`
    calibrated (from `physical`, one pass) on the studies the test rejects, then the rho
    (with `absolute`, also the fastest tenth's top_ratio) of those it takes."""
    start = {k: getattr(model, k) for k in physical}
    out = []
    for label, held in groups:
        for k, v in physical.items():
            setattr(model, k, v)
        fit = calibrate([(s, rows) for s, rows in prepared if not held(s)], 1, tuple(grid),
                        grid, absolute)
        rho = {s.name: rho_of(rows, s.shape) for s, rows in prepared if held(s)}
        row = dict(held_out=label, constants=fit["constants"],
                   rho={n: None if r is None else round(r, 3) for n, r in rho.items()})
        if absolute:
            row["top_ratio"] = {s.name: round(top_ratio(rows, s.shape), 3)
                                for s, rows in prepared if held(s)}
        out.append(row)
        print(f"held out {label}: rho {row['rho']}"
              + (f", fastest tenth at {row['top_ratio']}x its time" if absolute else ""),
              flush=True)
    for k, v in start.items():
        setattr(model, k, v)
    return out


def roof_rank(path: Path) -> list[dict]:
    """The model against a bench/decode_roof.py run (its JSON, or .json.gz): per shape, the
    rank correlation over its decode candidates (before compiling: estimated registers),
    where the first kernel within 2% of the best falls in the model's order, and measured
    over predicted time, median, for each ring."""
    from _recorded import read_json

    out = []
    for r in read_json(path)["rows"]:
        shape = tuple(r["shape"])
        rows = [(c, model.predict_before_compile(c, shape, ARCH).seconds, v["us"] * 1e-6)
                for c, v in ((config_from_name(name), v) for name, v in r["candidates"].items())
                if family_of(c).streams_b]
        best = min(t for *_, t in rows)
        order = sorted(rows, key=lambda x: x[1])
        rings = {ring: [t / p for c, p, t in rows if c.ring == ring] for ring in ("reg", "async")}
        out.append(dict(shape="x".join(map(str, shape)), dtype=r["dtype"], n=len(rows),
                        rho=round(model.spearman([p for _, p, _ in rows],
                                                 [t for *_, t in rows]), 3),
                        first_near_in_model_order=next(
                            i for i, (*_, t) in enumerate(order) if t <= 1.02 * best),
                        measured_over_predicted={k: round(statistics.median(v), 3)
                                                 for k, v in rings.items() if v}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--roof", type=Path, default=None, metavar="JSON",
                    help="rank the streaming model on a bench/decode_roof.py run's decode "
                         "candidates (print and exit)")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--calibrate-stream", action="store_true",
                    help="fit the streaming model's constants on the decode studies (each "
                         "left out in turn first), and report those studies")
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=300)
    ap.add_argument("--dtype", action="append", default=None,
                    help="the studies of this input type (repeatable; default f32: the ones "
                         "the calibration fits)")
    ap.add_argument("--studies-db", action="append", default=[], type=Path, metavar="DB",
                    help="also the studies of this studies.db (repeatable), e.g. fresh tunes'")
    ap.add_argument("--save-studies", type=Path, default=None, metavar="JSON",
                    help="write the studies of --studies-db to JSON (bench/results/"
                         "tune-studies-*.json, which later runs read) and go on")
    ap.add_argument("--commit", default=None, help="the commit the saved studies were tuned at")
    ap.add_argument("--by-kind", action="store_true",
                    help="print measured / predicted per kind of kernel (tile, consumers)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if args.roof:
        for r in roof_rank(args.roof):
            print(r)
        return

    dtypes = {"fp32" if d == "f32" else d for d in (args.dtype or ["f32"])}
    if args.calibrate and dtypes != {"fp32"}:
        ap.error("--calibrate fits the CUDA-core constants: fp32 studies only")
    missing = [str(db) for db in args.studies_db if not db.is_file()]
    if missing:
        ap.error(f"no such studies.db: {', '.join(missing)}")
    if args.save_studies:
        from _recorded import from_studies_db, save_tune_studies

        save_tune_studies([s for db in args.studies_db for s in from_studies_db(db)],
                          args.save_studies, commit=args.commit,
                          date=time.strftime("%Y-%m-%d"))
        print(f"wrote {args.save_studies}")
    studies = [s for s in all_studies(args.studies_db)
               if args.calibrate_stream and streams(s) or not args.calibrate_stream
               and ("fp32" if s.dtype == "f32" else s.dtype) in dtypes]
    prepared = _prepared(studies)
    data = dict(benchmark="model_rank", gpu=f"{recorded_gpu(studies)} (recorded)", arch=ARCH.sm,
                date=time.strftime("%Y-%m-%d"),
                constants={k: getattr(model, k) for k in TUNED}, margin=model.PRUNE_MARGIN)
    if args.calibrate:
        data["holdout"] = holdout(prepared, [("x".join(map(str, shape)),
                                              lambda s, shape=shape: s.shape == shape)
                                             for shape in TARGET_SHAPES])
        for k, v in PHYSICAL.items():
            setattr(model, k, v)
        data["calibration"] = calibrate(prepared)
    if args.calibrate_stream:
        data["holdout"] = holdout(prepared, [(s.name, lambda t, s=s: t is s)
                                             for s, _ in prepared],
                                  STREAM_PHYSICAL, STREAM_GRID, absolute=True)
        for k, v in STREAM_PHYSICAL.items():
            setattr(model, k, v)
        data["calibration"] = calibrate(prepared, 2, tuple(STREAM_GRID), STREAM_GRID,
                                        absolute=True)
    data["rho"] = rhos(prepared)
    if args.calibrate_stream:
        for r, (s, rows) in zip(data["rho"], prepared):
            r["top_ratio"] = round(top_ratio(rows, s.shape), 3)
    for r in data["rho"]:
        print(f"{r['shape']:>16} {r['study']:<52} n={r['points']:5d} rho={r['rho']}"
              + (f" fastest tenth at {r['top_ratio']}x" if "top_ratio" in r else ""))
    data["margin_evidence"] = margin_evidence(prepared)
    for r in data["margin_evidence"]:
        print(f"{r['shape']:>16} near-best best/pred max {r['near_best_max_ratio']}, "
              f"first within 2% at {r['first_near_in_model_order']} in the model's order, "
              f"pruned at margins {r['pruned_share']}")
    data["by_kind"] = by_kind(prepared)
    if args.by_kind:
        for r in data["by_kind"]:
            print(f"{r['shape']:>16} {r['study']}: measured / predicted")
            for k in r["kinds"]:
                print(f"    {k['kind']:<14} n={k['n']:3d} median {k['median']:.3f} "
                      f"({k['low']:.2f}-{k['high']:.2f})")
    if args.simulate:
        from simulate_search import trials_to_within

        data["simulation"] = trials_to_within(
            [s for s in all_studies() if s.exhaustive], seeds=args.seeds, budget=args.budget)
    name = ("model-rank-calibrate-stream" if args.calibrate_stream else
            ("model-rank-calibrate" if args.calibrate else "model-rank") + "".join(
                f"-{d}" for d in sorted(dtypes - {"fp32"})))
    path = args.out / f"{name}-cpu-recorded-{recorded_slug(studies)}-{data['date']}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
