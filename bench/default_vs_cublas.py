"""Named kernels against cuBLAS, timed in the same process, interleaved (A B A B ...): the
recommended default on the shapes given, or any kernel of any family on any shape (--pair,
repeatable), e.g. a technique's variants side by side. Each kernel's problem is the one its
name builds (input type, layout, C's type, bias, activation); cuBLAS runs the same GEMM in
the same types, without the bias and the activation (tuner.bench.baseline_label says
what it ran: "baseline" in each row).

    python bench/default_vs_cublas.py [--shapes 4096x4096x4096 ...] [--out DIR]
    python bench/default_vs_cublas.py --label splitk --pair 127x129x4097 gemm_simt_..._k8c ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header, problem_for, side_by_side, write  # noqa: E402

from codegen import DEFAULT_CONFIG, compile_many  # noqa: E402
from codegen.config import config_from_name  # noqa: E402
from codegen.families._common import Variant  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4096x4096x4096"])
    ap.add_argument("--kernel", default=DEFAULT_CONFIG.name)
    ap.add_argument("--pair", nargs=2, action="append", metavar=("SHAPE", "KERNEL"),
                    help="time KERNEL at SHAPE (repeatable; replaces --shapes and --kernel)")
    ap.add_argument("--label", default="default-vs-cublas", help="result file name prefix")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from tuner.gpu import device

    dev = device()
    pairs = [(text, config_from_name(name)) for text, name in
             (args.pair or [(s, args.kernel) for s in args.shapes])]
    # every kernel compiled first, in parallel (a wgmma kernel takes seconds of nvcc)
    built = {c.name: r for c, r in compile_many({c.name: c for _, c in pairs}.values(), dev.sm)}
    rows, benches = [], {}
    for text, cfg in pairs:
        res = built[cfg.name]
        assert res.ok, res.error
        bench = problem_for(benches, text, cfg)
        row = dict(shape=text, dtype=cfg.dtype.short, variant=Variant.of(cfg).key,
                   baseline=bench.baseline_label, registers=res.resources.registers,
                   smem=res.resources.smem, **side_by_side(bench, cfg, res.cubin, args.rounds))
        rows.append(row)
        print(f"{text:>16}  {cfg.name:<64} {row['tflops']:6.1f} TFLOP/s   cuBLAS "
              f"{row['cublas_tflops']:6.1f}   ratio {row['ratio']:.3f}   err {row['error']:.2e}",
              flush=True)
    data = dict(header(dev), benchmark="kernels_vs_cublas", rows=rows)
    print("wrote", write(args.label, data, args.out))


if __name__ == "__main__":
    main()
