"""The recommended default configuration against cuBLAS SGEMM (FP32, no TF32), timed
in the same process, interleaved (A B A B ...), on the shapes given.

    python bench/default_vs_cublas.py [--shapes 4096x4096x4096 ...] [--out DIR]
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from tuner.bench import GpuBenchmark
    from tuner.gpu import device

    dev = device()
    cfg = KernelConfig.from_name(args.kernel)
    res = compile_config(cfg, dev.sm)
    assert res.ok, res.error
    rows = []
    for text in args.shapes:
        shape = parse_shape(text)
        row = dict(shape=text, registers=res.resources.registers,
                   **side_by_side(GpuBenchmark(shape, seed=None), cfg, res.cubin, args.rounds))
        rows.append(row)
        print(f"{text:>16}  {cfg.name}  {row['tflops']:6.1f} TFLOP/s   cuBLAS "
              f"{row['cublas_tflops']:6.1f}   ratio {row['ratio']:.3f}   err {row['error']:.2e}")
    data = dict(header(dev), benchmark="default_vs_cublas", dtype="fp32", rows=rows)
    print("wrote", write("default-vs-cublas", data, args.out))


if __name__ == "__main__":
    main()
