"""The WMMA (tensor-core) family against cuBLAS at matched precision, one shape: a seeded
sample of the WMMA search space is compiled, checked and timed once each, then the best
few are timed against cuBLAS turn about. Errors by the two-reference protocol.

    python bench/wmma_sweep.py [--dtypes fp16 bf16 tf32] [--shape 4096x4096x4096]
                               [--sample 60] [--top 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header, side_by_side, write  # noqa: E402

from codegen import DType, compile_many  # noqa: E402
from tuner._shape import parse_shape  # noqa: E402
from tuner.space import valid_wmma_configs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16", "tf32"])
    ap.add_argument("--shape", default="4096x4096x4096")
    ap.add_argument("--sample", type=int, default=60)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from tuner.bench import GpuBenchmark
    from tuner.gpu import device

    dev = device()
    shape = parse_shape(args.shape)
    data = dict(header(dev), benchmark="wmma_sweep", shape=args.shape, by_dtype={})
    for text in args.dtypes:
        dtype = DType.parse(text)
        space = list(valid_wmma_configs(dev.arch, dtype))
        sample = random.Random(args.seed).sample(space, min(args.sample, len(space)))
        built = {c: r for c, r in compile_many(sample, dev.sm) if r.ok}
        bench = GpuBenchmark(shape, dtype, seed=None)
        swept = []
        for c, r in built.items():
            m = bench.measure(c, r.cubin)
            swept.append(dict(kernel=c.name, outcome=m.outcome.value, message=m.message,
                              registers=r.resources.registers, spills=r.resources.spill_bytes,
                              error=m.error, error_exact=m.error_exact,
                              tflops=m.timing.tflops(bench.flops) if m.timing else None))
        swept.sort(key=lambda x: -(x["tflops"] or 0))
        bad = [x for x in swept if x["outcome"] != "timed"]
        print(f"{text}: {len(space)} valid, {len(sample)} sampled, {len(built)} built, "
              f"{len(bad)} not timed", flush=True)
        for x in bad[:5]:
            print("   ", x["kernel"], x["outcome"], x["message"])
        top = []
        for x in swept[: args.top]:
            c = next(c for c in built if c.name == x["kernel"])
            row = side_by_side(bench, c, built[c].cubin)
            top.append(row)
            print(f"  {row['kernel']:<48} {row['tflops']:7.1f} TFLOP/s  cuBLAS "
                  f"{row['cublas_tflops']:7.1f}  ratio {row['ratio']:.3f}  err {row['error']:.2e}"
                  f" (exact {row['error_exact']:.2e}; cuBLAS {row['cublas_error']:.2e} / "
                  f"{row['cublas_error_exact']:.2e})", flush=True)
        data["by_dtype"][text] = dict(valid=len(space), sampled=len(sample), swept=swept, top=top)
    print("wrote", write("wmma-sweep", data, args.out))


if __name__ == "__main__":
    main()
