"""A template change, measured: each kernel of a pairs file rendered from each of several
template directories (the working tree's templates/ and older ones), compiled, and timed
turn about in one process (every version, then cuBLAS, in each round), so that the
versions meet the same GPU clocks. cuBLAS runs the same GEMM in the same types (without
the bias and the activation: tuner.bench.baseline_label).

    mkdir -p /tmp/t-old && git archive REV templates | tar x -C /tmp/t-old
    python bench/template_ab.py --templates /tmp/t-old/templates templates \
        [--pairs bench/pairs/fused-epilogue.txt] [--rounds 5] [--out DIR]

Writes template-ab-<gpu>-<date>.json under --out (default bench/results): per kernel, each
version's TFLOP/s (median of the rounds, and every round) and cuBLAS's.

--sustained S: each timing runs the calls back to back for S seconds without flushing the
L2 (bench/kernel_profile.py's `sustained`: a program's steady state, at the board's power
cap), and each round also records the median SM clock and power; every version is first
checked against the reference as in the flushed timing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import jinja2  # noqa: E402

from _common import commit, problem_for, write  # noqa: E402
from kernel_profile import kernel_call, sustained  # noqa: E402
from codegen.compile import compile_source, config_flags, target_arch  # noqa: E402
from codegen.config import config_from_name  # noqa: E402
from codegen.families import family_of  # noqa: E402
from codegen.rendering import _env  # noqa: E402


def environment(directory: str) -> jinja2.Environment:
    """codegen.rendering's Jinja2 environment, over another template directory."""
    return _env().overlay(loader=jinja2.FileSystemLoader(directory))


def sustained_call(bench, cfg, cubin):
    """A version's launch on the bench's problem, checked against the reference first
    (bench.measure); RuntimeError where it is not right."""
    m = bench.measure(cfg, cubin)
    if m.outcome.value != "timed":
        raise RuntimeError(f"{cfg.name}: {m.outcome.value} {m.message}")
    return kernel_call(bench, cfg, cubin)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(HERE / "pairs" / "fused-epilogue.txt"))
    ap.add_argument("--templates", nargs="+", required=True, help="template directories")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="time each call back to back for S seconds (the power cap) instead")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from tuner.gpu import device

    pairs = [line.split() for line in open(args.pairs) if line.strip() and not line.startswith("#")]
    envs = {d: environment(d) for d in args.templates}
    dev = device()

    def build(item):
        (shape, name), d = item
        cfg = config_from_name(name)
        src = envs[d].get_template(family_of(cfg).template).render(**cfg.template_values())
        r = compile_source(src, target_arch(cfg, dev.sm), name, flags=config_flags(cfg))
        assert r.ok, r.log[-2000:]
        return (shape, name, d), r

    with ThreadPoolExecutor(os.cpu_count()) as pool:  # nvcc runs in its own processes
        built = dict(pool.map(build, [((s, n), d) for s, n in pairs for d in args.templates]))
    rows, benches = [], {}
    for shape, name in pairs:
        cfg = config_from_name(name)
        bench = problem_for(benches, shape, cfg)
        t: dict = {d: [] for d in args.templates}
        t["cublas"] = []
        clocks: dict = {k: [] for k in t}  # (MHz, W) of each sustained timing
        if args.sustained:
            calls = {d: sustained_call(bench, cfg, built[(shape, name, d)].cubin)
                     for d in args.templates}
            calls["cublas"] = bench.baseline_call()[0]
        for r in range(args.rounds):
            # each round starts with another version: the first after cuBLAS runs cooler
            for d in args.templates[r % len(args.templates):] + args.templates[:r % len(args.templates)]:
                if args.sustained:
                    s = sustained(calls[d], args.sustained, bench.flops)
                    t[d].append(s["tflops"])
                    clocks[d].append((s["sm_mhz"], s["watts"]))
                    continue
                m = bench.measure(cfg, built[(shape, name, d)].cubin)
                if m.outcome.value != "timed":
                    raise RuntimeError(f"{name} from {d}: {m.outcome.value} {m.message}")
                t[d].append(m.timing.tflops(bench.flops))
            if args.sustained:
                s = sustained(calls["cublas"], args.sustained, bench.flops)
                t["cublas"].append(s["tflops"])
                clocks["cublas"].append((s["sm_mhz"], s["watts"]))
            else:
                t["cublas"].append(bench.baseline().timing.tflops(bench.flops))
        med = {k: statistics.median(v) for k, v in t.items()}
        rows.append(dict(shape=shape, kernel=name, baseline=bench.baseline_label,
                         tflops=med, rounds=t, **({"mhz_watts": clocks} if args.sustained else {})))
        print(f"{shape:>16} {name:<62} " + "  ".join(
            f"{d} {med[d]:6.1f} ({med[d] / med['cublas']:.3f})"
            for d in args.templates) + f"  cuBLAS {med['cublas']:6.1f}", flush=True)
    doc = dict(benchmark="template-ab", gpu=dev.name, commit=commit(), templates=args.templates,
               rounds=args.rounds, sustained_s=args.sustained or None,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               rows=rows)
    print("wrote", write("template-ab", doc, args.out))


if __name__ == "__main__":
    main()
