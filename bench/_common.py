"""Shared by the benchmark scripts: where results go and what they record."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def commit() -> str:
    """$GEMM_TUNE_COMMIT (set by the caller: the GPU machine's copy has no .git), else git."""
    if os.environ.get("GEMM_TUNE_COMMIT"):
        return os.environ["GEMM_TUNE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def cpp_path() -> str:
    """The library's C++ call path for torch callers, built (or loaded) before anything is
    timed, so that every call of a run takes the path a program's steady state takes:
    tuner.runtime.fast's status ("on", or why not)."""
    from tuner.runtime import fast

    fast.wait(900)
    return fast.status()


def header(dev) -> dict:
    from codegen.compile import nvcc_version
    from tuner.gpu import cublas

    return dict(gpu=dev.name, cc=dev.cc, sms=dev.arch.sm_count, clock_mhz=dev.arch.clock_mhz,
                driver=dev.driver_version, nvcc=nvcc_version(), cublas=cublas().version,
                # $GEMM_TUNE_DATE, when set, overrides the clock (reproducing a recorded run)
                date=os.environ.get("GEMM_TUNE_DATE") or
                datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=commit())


def gpu_slug(gpu: str) -> str:
    """A GPU's name as result files carry it: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    return gpu.replace("NVIDIA ", "").replace(" ", "-").lower()


def write(name: str, data: dict, out_dir: Path | None = None) -> Path:
    slug = gpu_slug(data["gpu"])
    path = Path(out_dir or RESULTS) / f"{name}-{slug}-{data['date'][:10]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def problem_for(benches: dict, shape: str, config):
    """The GpuBenchmark of the problem `config` builds at `shape` ("MxNxK": its input type,
    layout, C's type, bias and activation), one per problem in `benches` (its GPU buffers
    made once)."""
    from codegen.families._common import Variant
    from tuner._shape import parse_shape
    from tuner.bench import GpuBenchmark

    key = (shape, config.dtype, Variant.of(config))
    if key not in benches:
        benches[key] = GpuBenchmark(parse_shape(shape), config.dtype, seed=None,
                                    variant=Variant.of(config))
    return benches[key]


def side_by_side(bench, config, cubin, rounds: int = 3) -> dict:
    """Time a kernel and cuBLAS turn about (A B A B ...) on one problem; medians of rounds."""
    import statistics

    ours, theirs, errs, errs_exact = [], [], [], []
    for _ in range(rounds):
        m = bench.measure(config, cubin)
        if m.outcome.value != "timed":
            raise RuntimeError(f"{config.name}: {m.outcome.value} {m.message}")
        ours.append(m.timing.tflops(bench.flops))
        errs.append(m.error)
        errs_exact.append(m.error_exact)
        base = bench.baseline()
        theirs.append(base.timing.tflops(bench.flops))
    row = dict(kernel=config.name, tflops=statistics.median(ours), tflops_rounds=ours,
               cublas_tflops=statistics.median(theirs), cublas_rounds=theirs, error=max(errs),
               error_exact=max(errs_exact), cublas_error=base.error,
               cublas_error_exact=base.error_exact)
    row["ratio"] = row["tflops"] / row["cublas_tflops"]
    return row


def trial_counts(trials, by: str) -> dict:
    """What a study's trials say about sharing: candidates that reached a GPU, grouped by
    the user attribute `by` ("gpu", "worker"), how many were timed twice, how many trials
    were left unfinished."""
    import collections

    measured = [t for t in trials
                if t.user_attrs.get("outcome") in ("timed", "wrong result", "launch failed")]
    names = [t.user_attrs["kernel"] for t in measured]
    return {f"by_{by}": dict(collections.Counter(str(t.user_attrs.get(by, 0)) for t in measured)),
            "measured": len(names), "measured_twice": len(names) - len(set(names)),
            "unfinished": sum(not t.state.is_finished() for t in trials)}


def geomean(values) -> float | None:
    """The geometric mean of the positive numbers among `values` (None where none is)."""
    import math

    xs = [x for x in values if x is not None and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def interleaved(timer, fns: dict, rounds: int, paired=()) -> dict:
    """Time each of `fns` (name -> no-argument callable) once per round, turn about, for
    `rounds` rounds, so that every figure comes from the same minutes. Functions named
    "GROUP/WHO" (a GEMM's "q_proj/ours", "q_proj/torch" ...) are a group, timed one after
    another, so that a drift of the clock or the power between a group's members is small;
    each round the groups' order rotates a place and so does the order within each group,
    so no group is always first after whatever ran before the round and no member is
    always first of its group (on the H200 the first of a layer's GEMMs, cuBLAS on both
    sides, read 3-5% slower where it always came first, and with the whole list rotating,
    model_gemms.py's Llama q_proj "ours" came right after the layer's forwards in two
    rounds of three: 0.96x). A name without "/" is a group of its own. `timer(fn)`
    returns a list of times (wgmma_vs_cublas.Timer: CUDA events, L2 flushed). `paired`:
    (name, name) pairs of `fns` timed together, repetition by repetition (`timer.pair(fa,
    fb)`: a, b, a, b ...), for host-paced functions compared with each other. Returns name
    -> (median of the rounds' medians, [each round's median], in round order)."""
    import statistics

    partner = dict(paired)
    per: dict = {name: [] for name in fns}
    groups: dict = {}
    for name in fns:
        groups.setdefault(name.split("/")[0] if "/" in name else name, []).append(name)
    order = list(groups.values())
    for r in range(rounds):
        turn = r % len(order) if order else 0
        for members in order[turn:] + order[:turn]:
            at = r % len(members)
            for name in members[at:] + members[:at]:
                fn = fns[name]
                if name in partner.values():
                    continue  # timed with its partner
                if name in partner:
                    other = partner[name]
                    ta, tb = timer.pair(fn, fns[other])
                    per[name].append(statistics.median(ta))
                    per[other].append(statistics.median(tb))
                else:
                    per[name].append(statistics.median(timer(fn)))
    return {name: (statistics.median(ms), ms) for name, ms in per.items()}
