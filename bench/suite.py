"""The FP32 suite of ../shared/BASELINES.md: for each shape, the library's kernel (tuned
first with --tune) and cuBLAS timed turn about in one run; JSON and a PNG of the ratios.

    python bench/suite.py --tune [--force] [--trials N] [--devices 0,1] [--shapes ...] [--out DIR]
    python bench/suite.py --library artifacts/library      # time what is there
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, header, side_by_side, write  # noqa: E402

SHAPES = ["4096x4096x4096", "8192x8192x8192", "2048x2048x2048", "1024x1024x1024",
          "512x512x512", "1000x1000x1000", "4095x4097x1023", "127x129x4097",
          "8192x8192x1024", "128x4096x4096", "16x4096x4096", "4096x4096x256",
          "256x256x16384"]


def plot(rows, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    names = [r["shape"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    ax.bar(names, ratios, color=["tab:green" if x >= 1 else "tab:blue" for x in ratios])
    ax.axhline(1.0, color="tab:red", linestyle="--", label="cuBLAS")
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    ax.axhline(geo, color="gray", linestyle=":", label=f"geometric mean {geo:.3f}")
    for i, r in enumerate(rows):
        ax.text(i, r["ratio"], f"{r['tflops']:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("gemm-tune / cuBLAS (FP32, same run)")
    ax.set_title(f"FP32 GEMM on {gpu}: tuned kernel vs cuBLAS (labels: TFLOP/s)")
    ax.tick_params(axis="x", rotation=45, labelsize=8)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _kernel(lib, dev, m: int, n: int, k: int) -> tuple[str | None, str]:
    """(the library's fp32 kernel for the shape, the rule that names it): what it runs, or
    where it runs cuBLAS (its kernel lost where it was tuned), its exact entry's kernel,
    else the best estimate among its kernels: the suite times our kernel beside cuBLAS
    either way, and says which. An exact entry is this GPU model's (a library may hold
    the same shape tuned on an H100 and an H200: both sm_90 with 132 SMs)."""
    from codegen.config import DType, Layout
    from tuner.runtime.dispatch import FULL_ALIGN, exact_entry

    choice = lib.select(m, n, k, cc=dev.cc, sms=dev.arch.sm_count, gpu=dev.name)
    if choice.kernel is not None:
        return choice.kernel, choice.rule
    exact = exact_entry(lib.store.serving(DType.F32, dev.cc, Layout.NN), (m, n, k), 1,
                        FULL_ALIGN, dev.name)
    if exact is not None:
        return exact["kernel"], "cuBLAS runs; the exact entry's kernel"
    ranked = [e["kernel"] for _, e in lib.ranked(m, n, k, DType.F32, dev.cc, dev.arch.sm_count)]
    return (ranked[0], "cuBLAS runs; the best estimate") if ranked else (None, "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--tune", action="store_true", help="tune each shape first (gemm-tune)")
    ap.add_argument("--tune-shapes", nargs="+", default=None,
                    help="tune only these shapes first (the rest come from the library)")
    ap.add_argument("--trials", type=int, default=None, help="tuning budget (CLI default)")
    ap.add_argument("--force", action="store_true", help="re-tune shapes the cache answers")
    ap.add_argument("--devices", default=None, help="GPUs to tune on, e.g. 0,1")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    from codegen.config import config_from_name
    from tuner import load_library
    from tuner._shape import parse_shape
    from tuner.bench import GpuBenchmark
    from tuner.gpu import device

    to_tune = args.tune_shapes or (args.shapes if args.tune else [])
    for s in to_tune:
        cmd = [sys.executable, "-m", "tuner", "--shape", s, "--artifacts", str(args.artifacts),
               "--json"] + (["--trials", str(args.trials)] if args.trials else []) + (
                   ["--devices", args.devices] if args.devices else []) + (
                   ["--force"] if args.force else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(f"tuned {s}: exit {p.returncode} {p.stderr.strip()[-200:]}", flush=True)
        print(p.stdout.strip()[-3000:], flush=True)  # the winner, its ratio and the stats
    dev = device()
    lib = load_library(args.artifacts / "library")
    rows = []
    for s in args.shapes:
        m, n, k = parse_shape(s)
        kernel, rule = _kernel(lib, dev, m, n, k)
        if kernel is None:
            print(f"{s}: no fp32 kernel in the library", flush=True)
            continue
        info = lib.manifest["kernels"][f"{dev.sm}/{kernel}"]
        row = dict(shape=s, rule=rule, **side_by_side(
            GpuBenchmark((m, n, k), seed=None), config_from_name(kernel),
            lib.path / info["cubin"], args.rounds))
        rows.append(row)
        print(f"{s:>16} {row['kernel']:<52} {row['tflops']:7.2f} TFLOP/s  cuBLAS "
              f"{row['cublas_tflops']:7.2f}  ratio {row['ratio']:.3f} ({rule})", flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(f"geometric mean ratio over {len(rows)} shapes: {geo:.3f}")
    data = dict(header(dev), benchmark="suite", dtype="fp32", geomean_ratio=geo, rows=rows)
    path = write("suite", data, args.out)
    plot(rows, path.with_suffix(".png"), dev.name)
    print("wrote", path, "and", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
