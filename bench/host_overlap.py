"""Host-resident GEMMs: the pipeline that hides host-device copies behind the compute.

For each shape (numpy fp32 A, B and C in host memory), one row:
  - pipelined: lib.gemm(A, B, C) (chunks of rows over three streams, pinned staging);
  - sequential: lib.gemm(..., pipeline=False) (copy in, compute, copy out);
  - copy: the pipeline with the GEMM left out (staging, H2D and D2H only);
  - compute: the GEMM alone on device-resident operands (the same plan);
  - ideal: max(copy, compute); the copy rate: A, B and C's bytes over the copy time;
  - the first block (rows summed over K-slices as B goes up, where B is large) and the
    chunks after it;
  - pageable: the same pipeline with the copies straight from pageable memory (the
    pitfall: the driver makes them synchronous, so nothing overlaps);
  - the batch API over 8 pairs of a quarter of the rows, against the same pairs one by one.
Medians of 3 runs after a warm-up; results are checked against float64 first.

    python bench/host_overlap.py [--shapes 8192x8192x8192 ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit, write  # noqa: E402


def wall(fn, reps=3) -> float:
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default=str(HERE.parent / "artifacts" / "library"))
    p.add_argument("--shapes", nargs="*", default=["4096x4096x4096", "8192x8192x8192",
                                                   "12288x12288x12288", "16384x16384x16384"])
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import datetime

    import torch

    from tuner.runtime import call, driver, host, load_library
    from tuner.runtime.cublas import cublas_version

    lib = load_library(args.library)
    rows = []
    rng = np.random.default_rng(0)
    for spec in args.shapes:
        m, n, k = (int(v) for v in spec.split("x"))
        A = rng.standard_normal((m, k), dtype=np.float32)
        B = rng.standard_normal((k, n), dtype=np.float32)
        C = np.empty((m, n), np.float32)
        lib.gemm(A, B, C)
        a, b = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
        ref = (a.double() @ b.double()).cpu().numpy()
        err = float(np.linalg.norm(C - ref) / np.linalg.norm(ref))
        C2 = np.empty_like(C)
        lib.gemm(A, B, C2, pipeline=False)
        exact = bool(np.array_equal(C, C2))
        del ref
        plan, *_ = call._general_plan(lib, A, B, C, None, None, lib.measure)
        g = plan.gpu
        c = torch.empty((m, n), device="cuda")

        class NoGemm:
            def run(self, *args):
                pass

        def copy_only():
            with driver.entered(g):
                host.run_pipelined(g, lambda rows, k=None: NoGemm(), A, B, C, 1.0, 0.0,
                                   k_slices=True)

        def compute_only():
            with driver.entered(g):
                plan.run(a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0, 0)
                driver.sync(0)

        row = dict(shape=spec, m=m, n=n, k=k, kernel=plan.choice.kernel or "cuBLAS",
                   error=err, pipelined_equals_sequential=exact,
                   chunks=len(host.plan_chunks(m, n, k, 4)),
                   first_block=_block(host.plan_block(m, n, k, 4)),
                   pipelined_ms=wall(lambda: lib.gemm(A, B, C)),
                   sequential_ms=wall(lambda: lib.gemm(A, B, C, pipeline=False)),
                   copy_ms=wall(copy_only), compute_ms=wall(compute_only),
                   pageable_ms=wall(lambda: lib.gemm(A, B, C, pipeline="pageable")))
        row["ideal_ms"] = max(row["copy_ms"], row["compute_ms"])
        row["copy_gb_per_s"] = (A.nbytes + B.nbytes + C.nbytes) / row["copy_ms"] / 1e6
        row["speedup_vs_sequential"] = row["sequential_ms"] / row["pipelined_ms"]
        row["over_ideal"] = row["pipelined_ms"] / row["ideal_ms"]
        q = max(1, m // 4)
        pairs = [(A[i * q:(i + 1) * q], B) for i in range(4)] * 2
        row["batch8_ms"] = wall(lambda: lib.gemm_batch(pairs))
        row["one_by_one8_ms"] = wall(lambda: [lib.gemm(x, y, pipeline=False)
                                              for x, y in pairs])
        rows.append(row)
        print(f"{spec:>18} {row['kernel'][:40]:>40} pipelined {row['pipelined_ms']:8.1f} ms "
              f"sequential {row['sequential_ms']:8.1f} (x{row['speedup_vs_sequential']:.2f}) "
              f"copy {row['copy_ms']:7.1f} ({row['copy_gb_per_s']:.1f} GB/s) "
              f"compute {row['compute_ms']:7.1f} "
              f"ideal x{row['over_ideal']:.2f} pageable {row['pageable_ms']:8.1f} "
              f"batch {row['batch8_ms']:.1f} vs {row['one_by_one8_ms']:.1f} err {err:.1e} "
              f"exact {exact}", flush=True)
        del a, b, c
        torch.cuda.empty_cache()
    g = driver.gpu(0)
    data = dict(gpu=g.name, cc=g.cc, driver=g.driver_version, cublas=cublas_version(),
                commit=commit(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                rows=rows)
    path = write("host-overlap", data, args.out)
    plot(rows, path.with_suffix(".png"), g.name)
    print(path)
    return 0


def _block(block) -> dict | None:
    """The first block's rows and K-slices (host.plan_block), or None."""
    if block is None:
        return None
    rows, slices = block
    return dict(rows=rows, k_slices=len(slices), slice_width=slices[0][1] - slices[0][0])


def plot(rows, path: Path, gpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("sequential_ms", "sequential"), ("pageable_ms", "pipelined, pageable"),
            ("pipelined_ms", "pipelined, pinned"), ("ideal_ms", "ideal max(copy, compute)")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        ax.bar([j + i * width for j in range(len(rows))], [r[key] for r in rows], width,
               label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["shape"] for r in rows])
    ax.set_ylabel("ms per GEMM, numpy in and out")
    ax.set_title(f"host-resident fp32 GEMM on {gpu}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
