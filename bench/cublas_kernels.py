"""Which cuBLAS kernels torch.matmul and the library's cuBLAS call run, shape by shape, and
their times side by side, on the GPU:

    python3 bench/cublas_kernels.py [--ms 16,24,32,35,40] [--n 4096] [--k 4096]
                                    [--dtype float16] [--out DIR]

The library falls back to cuBLAS through its own binding (tuner/runtime/cublas.py:
cublasGemmEx, a 32 MiB workspace, the cuBLAS that binding loads); torch.matmul calls the
cuBLAS torch ships with. At a few Ms of the M-sweep the library's cuBLAS rows read 0.88x-
0.93x torch's where their neighbours read 1.05x (bench/NOTES.md, "Thirtieth session"):
this names the kernels each side runs (torch.profiler, one call each) and the cuBLAS
library files each side loaded (/proc/self/maps), and times each in loops turn about
(library_vs_cublas.interleaved). "ours" is the binding called from Python here, not the
library's call path (whose C++ path calls cuBLAS on torch's handle): at these sizes its
loop is paced by that Python call's host time, so the times compare the two calls'
host costs more than their kernels. Row-major A (M x K), B (K x N), C of the input type,
as the M-sweep calls them. JSON to --out (cublas-kernels-<commit>-<gpu>-<date>.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def kernels(torch, fn) -> list[str]:
    """The names of the GPU kernels one call of `fn` runs, longest first (after a warm-up
    call; bench/forward_profile.profile_forward)."""
    from forward_profile import profile_forward

    fn()
    torch.cuda.synchronize()
    return [k["name"] for k in profile_forward(torch, fn, reps=1)["kernels"]]


def cublas_files() -> list[str]:
    """The cuBLAS shared libraries mapped into this process."""
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libcublas" in line})


def main(argv=None) -> int:
    import torch

    from _common import commit, gpu_slug
    from library_vs_cublas import interleaved
    from codegen.config import DType
    from tuner.runtime import driver
    from tuner.runtime.cublas import cublas_version, device_blas

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="16,23,24,25,32,34,35,36,40,41,43,48,64")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    typ = getattr(torch, args.dtype)
    dtype = DType.F16 if typ is torch.float16 else DType.BF16
    torch.zeros(1, device="cuda")
    g = driver.gpu(torch.cuda.current_device())
    blas = device_blas(g)
    b = torch.randn(args.k, args.n, device="cuda", dtype=typ)
    rows = []
    for m in (int(x) for x in args.ms.split(",")):
        a = torch.randn(m, args.k, device="cuda", dtype=typ)
        c = torch.empty(m, args.n, device="cuda", dtype=typ)

        def ours():
            blas.gemm(dtype, m, args.n, args.k, 1.0, a.data_ptr(), args.k, b.data_ptr(),
                      args.n, 0.0, c.data_ptr(), args.n,
                      torch.cuda.current_stream().cuda_stream, out=dtype)

        def theirs():
            torch.matmul(a, b, out=c)

        ours_ms, torch_ms, _, _ = interleaved(torch, ours, theirs)
        row = dict(m=m, ours_us=ours_ms * 1e3, torch_us=torch_ms * 1e3,
                   ratio=torch_ms / ours_ms, ours_kernels=kernels(torch, ours),
                   torch_kernels=kernels(torch, theirs))
        rows.append(row)
        same = sorted(row["ours_kernels"]) == sorted(row["torch_kernels"])
        print(f"M={m:3d} ours {row['ours_us']:6.2f} us torch {row['torch_us']:6.2f} us "
              f"ratio {row['ratio']:.3f} {'same kernels' if same else 'DIFFERENT'}", flush=True)
        for side in ("ours", "torch"):
            print(f"    {side:5}: {' + '.join(k[:100] for k in row[f'{side}_kernels'])}")
    gpu = torch.cuda.get_device_name(0)
    date = datetime.date.today().isoformat()
    doc = dict(benchmark="cublas-kernels", gpu=gpu, commit=commit(), date=date,
               torch=torch.__version__, torch_cuda=torch.version.cuda,
               ours_cublas_version=cublas_version(), cublas_files=cublas_files(),
               n=args.n, k=args.k, dtype=args.dtype, method=__doc__, rows=rows)
    print("cuBLAS files mapped:", *doc["cublas_files"], sep="\n    ")
    print(f"ours: cuBLAS {doc['ours_cublas_version']}; torch {torch.__version__} "
          f"(CUDA {torch.version.cuda})")
    args.out.mkdir(parents=True, exist_ok=True)
    slug = gpu_slug(gpu)
    path = args.out / f"cublas-kernels-{commit()}-{slug}-{date}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
