"""Where a host-resident GEMM's time goes: a timeline of the pipeline (tuner.runtime.host).

One call of the pipeline on numpy operands (fp32 A, B and C in host memory), with every
copy up, GEMM and copy down bracketed by CUDA events on its own stream, and every staging
copy between numpy and the pinned buffers timed on the host clock. The GPU's spans are
placed on the host's clock through one event recorded after a synchronisation. Writes:
  - the spans (lane, what, start and end in ms from the call's start, bytes);
  - a summary: the call's time, each lane's busy time, the GEMMs' share of the call, the
    gaps of more than 0.5 ms between GEMMs (the GPU waiting) and what the CPU did then;
  - a Gantt chart of the lanes (PNG).

    python bench/host_timeline.py [--shape 16384x16384x16384] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit, write  # noqa: E402

#: a gap between GEMMs longer than this (ms) is listed
GAP_MS = 0.5


@contextlib.contextmanager
def instrumented(driver, host):
    """Within: the pipeline's copies and staging record spans. Yields (spans, Traced):
    `Traced(plan)` wraps a plan so that its run records a span too; `spans` is filled as
    (lane, what, start event or host time, end, bytes) and resolved by `resolve`."""
    spans = []
    call, copy_rows = driver.call, host.copy_rows

    def event(stream):
        e = call("cuEventCreate", 0)
        call("cuEventRecord", e, stream)
        return e

    def traced(name, *args):
        if name in ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"):
            stream, nbytes = args[3], args[2]
            start = event(stream)
            out = call(name, *args)
            spans.append((f"stream {stream}", "H2D" if "HtoD" in name else "D2H", start,
                          event(stream), nbytes))
            return out
        return call(name, *args)

    def staged(dst, src):
        t = time.perf_counter()
        copy_rows(dst, src)
        spans.append(("CPU", "staging", t, time.perf_counter(), dst.nbytes))

    class Traced:
        def __init__(self, plan):
            self.plan = plan

        def run(self, a, b, c, alpha, beta, stream, bias=0):
            start = event(stream)
            self.plan.run(a, b, c, alpha, beta, stream, bias)
            spans.append((f"stream {stream}", "GEMM", start, event(stream), 0))

    driver.call, host.copy_rows = traced, staged
    try:
        yield spans, Traced
    finally:
        driver.call, host.copy_rows = call, copy_rows


def resolve(driver, spans, origin_event, origin_time: float) -> list[tuple]:
    """The spans in ms from the origin: GPU events through cuEventElapsedTime from
    `origin_event`, host times from `origin_time` (perf_counter, taken when the origin
    event completed)."""
    out = []
    for lane, what, start, end, nbytes in spans:
        if lane == "CPU":
            t0, t1 = (start - origin_time) * 1e3, (end - origin_time) * 1e3
        else:
            t0 = float(driver.call("cuEventElapsedTime", origin_event, start))
            t1 = float(driver.call("cuEventElapsedTime", origin_event, end))
            for e in (start, end):
                driver.call("cuEventDestroy", e)
        out.append((lane, what, t0, t1, nbytes))
    # streams by the order they first appear: "stream 0", "stream 1", ...
    names = {}
    for lane, *_ in sorted(out, key=lambda s: s[2]):
        if lane != "CPU" and lane not in names:
            names[lane] = f"stream {len(names)}"
    return sorted(((names.get(lane, lane), *rest) for lane, *rest in out), key=lambda s: s[2])


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for t0, t1 in sorted(intervals):
        if t1 > end:
            total += t1 - max(t0, end)
            end = t1
    return total


def summary(spans: list[tuple]) -> dict:
    """The call's time, each lane's busy time (overlaps counted once), the GEMMs' share of
    the call, and the gaps between GEMMs longer than GAP_MS with the CPU's busy time in
    each."""
    if not spans:
        return dict(total_ms=0.0, busy_ms={}, gemm_share=0.0, gaps=[])
    total = max(s[3] for s in spans) - min(s[2] for s in spans)
    busy = {}
    for lane in sorted({s[0] for s in spans}):
        for what in sorted({s[1] for s in spans if s[0] == lane}):
            busy[f"{lane} {what}"] = _union([(s[2], s[3]) for s in spans
                                             if s[0] == lane and s[1] == what])
    gemms = sorted((s[2], s[3]) for s in spans if s[1] == "GEMM")
    cpu = [(s[2], s[3]) for s in spans if s[0] == "CPU"]
    gaps, end = [], min(s[2] for s in spans)
    for t0, t1 in gemms:
        if t0 - end > GAP_MS:
            inside = [(max(a, end), min(b, t0)) for a, b in cpu if b > end and a < t0]
            gaps.append(dict(start_ms=round(end, 3), ms=round(t0 - end, 3),
                             cpu_busy_ms=round(_union(inside), 3)))
        end = max(end, t1)
    return dict(total_ms=total, busy_ms=busy, gemm_share=_union(gemms) / total if total else 0,
                gaps=gaps)


def plot(spans, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = sorted({s[0] for s in spans}, key=lambda x: (x != "CPU", x))
    colours = {"staging": "tab:gray", "H2D": "tab:blue", "GEMM": "tab:green", "D2H": "tab:red"}
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(lanes)))
    for i, lane in enumerate(lanes):
        for what, colour in colours.items():
            bars = [(s[2], s[3] - s[2]) for s in spans if s[0] == lane and s[1] == what]
            if bars:
                ax.broken_barh(bars, (i - 0.35, 0.7), color=colour, label=what)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper right", ncol=4)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_xlabel("ms from the call's start")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def timeline(lib, A, B, C) -> list[tuple]:
    """One pipelined call of lib.gemm(A, B, C)'s plan, instrumented; its resolved spans."""
    from tuner.runtime import call, driver, host

    plan, *_ = call._general_plan(lib, A, B, C, None, None, lib.measure)
    g = plan.gpu
    with driver.entered(g):
        driver.synchronize()
        origin = driver.call("cuEventCreate", 0)
        driver.call("cuEventRecord", origin, 0)
        driver.call("cuEventSynchronize", origin)
        t0 = time.perf_counter()
        with instrumented(driver, host) as (spans, traced):
            host.run_pipelined(g, lambda rows, k=None: traced(plan.chunk(lib, rows, k)),
                               A, B, C, 1.0, 0.0, k_slices=True)
        driver.synchronize()
        out = resolve(driver, spans, origin, t0)
        driver.call("cuEventDestroy", origin)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default=str(HERE.parent / "artifacts" / "library"))
    p.add_argument("--shape", default="16384x16384x16384")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import datetime

    from tuner.runtime import driver, host, load_library

    m, n, k = (int(v) for v in args.shape.split("x"))
    lib = load_library(args.library)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((k, n), dtype=np.float32)
    C = np.empty((m, n), np.float32)
    lib.gemm(A, B, C)  # decides, builds the plans, allocates every buffer
    spans = timeline(lib, A, B, C)
    s = summary(spans)
    g = driver.gpu(0)
    data = dict(gpu=g.name, commit=commit(), shape=args.shape,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                block=host.plan_block(m, n, k, 4), summary=s,
                spans=[dict(lane=a, what=b, start_ms=round(c, 4), end_ms=round(d, 4), bytes=e)
                       for a, b, c, d, e in spans])
    path = write(f"host-timeline-{args.shape}", data, args.out)
    plot(spans, path.with_suffix(".png"), f"host pipeline {args.shape} fp32 on {g.name}")
    print(f"{args.shape}: {s['total_ms']:.1f} ms, GEMMs busy {100 * s['gemm_share']:.0f}% of it; "
          + ", ".join(f"{lane} {ms:.1f}" for lane, ms in s["busy_ms"].items()))
    for gap in s["gaps"]:
        print(f"  GPU idle {gap['ms']:.2f} ms at {gap['start_ms']:.1f} ms "
              f"(CPU staging {gap['cpu_busy_ms']:.2f} ms of it)")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
