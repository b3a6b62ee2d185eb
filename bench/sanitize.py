"""compute-sanitizer memcheck over a sample of configurations on odd shapes: each launch
runs in its own process under the sanitizer, and must be clean and correct.

    python bench/sanitize.py [--out DIR]     (on the GPU machine)
    python bench/sanitize.py --one NAME MxNxK   (what each sanitized process runs)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = [
    "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8",        # the default: register double buffer
    "gemm_simt_f32_64x128x16_r4x8_w8x4_p0_v4_s3_g1",        # cp.async ring
    "gemm_simt_f32_32x64x16_r2x8_w8x4_p4_v4_s4_g8_k8",      # split-K, deep ring
    "gemm_simt_f32_32x64x16_r4x4_w8x4_p0_v4_s3_g1_k8c",     # split-K across a cluster
    "gemm_simt_f32_16x32x16_r4x4_w4x8_p4_v4_s2_g8_k32l",    # split-K summed by the last block
    "gemm_simt_f16_128x128x8_r8x8_w4x8_p4_v4_s2_g8",        # fp16 widened on load
    "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8",          # tensor cores, fp16
    "gemm_wmma_bf16_64x64x32_w32x32_p8_v8_s1_g1",           # tensor cores, bf16, synchronous
    "gemm_wmma_tf32_128x128x16_w64x32_p4_v4_s3_g8",         # tensor cores, tf32
]
SHAPES = ["17x33x9", "127x129x257"]


def one(name: str, shape: str) -> None:
    from codegen import compile_config
    from codegen.config import config_from_name
    from tuner._shape import parse_shape
    from tuner.bench import Problem, tolerance
    from tuner.gpu import Kernel, _drv, device

    cfg = config_from_name(name)
    res = compile_config(cfg, device().sm)
    assert res.ok, res.error
    m, n, k = parse_shape(shape)
    p = Problem((m, n, k), cfg.dtype, seed=None, alpha=0.5, beta=2.0, lda=k + 3, ldb=n + 1,
                ldc=n + 2)
    p.reset_c()
    Kernel(cfg, res.cubin)(*p.args())
    _drv().Context.synchronize()
    err = p.error(cfg.dtype)
    print(f"{name} {shape}: error {err:.2e}")
    sys.exit(0 if err <= tolerance(cfg, k) else 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=2)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    if args.one:
        return one(*args.one)
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    rows = []
    for name in CONFIGS:
        for shape in SHAPES:
            p = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "9",
                                "--leak-check", "no", sys.executable, __file__, "--one", name,
                                shape], capture_output=True, text=True)
            summary = next((ln for ln in p.stdout.splitlines() if "ERROR SUMMARY" in ln), "")
            rows.append(dict(kernel=name, shape=shape, exit=p.returncode, summary=summary))
            print(f"{name:<48} {shape:>12}  exit {p.returncode}  {summary}", flush=True)
            if p.returncode:
                print(p.stdout[-1500:], p.stderr[-1500:])
            clean = sum(r["exit"] == 0 for r in rows)  # written as it goes: a cut run keeps it
            (args.out / "sanitize.json").write_text(
                json.dumps(dict(rows=rows, clean=clean), indent=2))
    print(f"memcheck clean and correct: {clean} of {len(rows)}")


if __name__ == "__main__":
    main()
