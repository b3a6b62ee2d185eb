"""Named kernels against cuBLAS SGEMM (FP32, no TF32), timed in the same process,
interleaved (A B A B ...): the recommended default on the shapes given, or any kernel on
any shape (--pair, repeatable), e.g. a technique's variants side by side.

    python bench/default_vs_cublas.py [--shapes 4096x4096x4096 ...] [--out DIR]
    python bench/default_vs_cublas.py --label splitk --pair 127x129x4097 gemm_simt_..._k8c ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header, side_by_side, write  # noqa: E402

from codegen import DEFAULT_CONFIG, KernelConfig, compile_config  # noqa: E402
from tuner._shape import parse_shape  # noqa: E402


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

    from tuner.bench import GpuBenchmark
    from tuner.gpu import device

    dev = device()
    pairs = args.pair or [(s, args.kernel) for s in args.shapes]
    rows, benches = [], {}
    for text, name in pairs:
        cfg = KernelConfig.from_name(name)
        res = compile_config(cfg, dev.sm)
        assert res.ok, res.error
        if text not in benches:  # one problem (and its GPU buffers) per shape
            benches[text] = GpuBenchmark(parse_shape(text), seed=None)
        bench = benches[text]
        row = dict(shape=text, registers=res.resources.registers, smem=res.resources.smem,
                   **side_by_side(bench, cfg, res.cubin, args.rounds))
        rows.append(row)
        print(f"{text:>16}  {cfg.name:<56} {row['tflops']:6.2f} TFLOP/s   cuBLAS "
              f"{row['cublas_tflops']:6.2f}   ratio {row['ratio']:.3f}   err {row['error']:.2e}",
              flush=True)
    data = dict(header(dev), benchmark="kernels_vs_cublas", dtype="fp32", rows=rows)
    print("wrote", write(args.label, data, args.out))


if __name__ == "__main__":
    main()
