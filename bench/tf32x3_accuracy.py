"""Issue 14's accuracy study and speed bar: 3xTF32 (the wgmma family's _t3 variant) beside
cuBLAS SGEMM, cuBLAS TF32, our SIMT winner and our 1xTF32, on fp32 inputs; and issue 24's
comparison of its two split modes: in-loop (each stage split in shared memory, `_t3`) and
pre-split (a pre-pass writes big and small copies of A and B, `_pre_t3`).

Run from the repository root on an H200 (needs torch, nvcc, jinja2, numpy, matplotlib,
cuda-bindings; not optuna, not pycuda):

    python3 bench/tf32x3_accuracy.py                  # JSON + PNG to $OUT (else bench/results)
    python3 bench/tf32x3_accuracy.py --t3 gemm_wgmma_f32_128x64x32_c2_s4_x1_p1_g8_t3
    python3 bench/tf32x3_accuracy.py --presplit gemm_wgmma_f32_128x64x32_c2_s4_x1_p1_g8_pre_t3
    python3 bench/tf32x3_accuracy.py --no-speed       # the accuracy study only

Accuracy: for each input distribution, ||C - ref||_F / ||ref||_F and the largest
elementwise |C - ref| / |ref| (over elements with ref != 0; near-zero elements of a signed
product make it large for every method alike, so |C - ref| / (|A| |B|), the componentwise
bound's scale, is reported beside it), ref = the float64 product of the inputs as given.
Distributions (M = N = 2048, K = 2048 unless said): standard normal; uniform [0, 1);
uniform [-1, 1) with K = 16384 (M = N = 1024); values spread over 2^-30 .. 2^30 (random
sign, log-uniform magnitude); standard normal with 4 rows of A and 4 columns of B 1e6 times
larger. Target (issue 14): 3xTF32's error at most 2x SGEMM's on each; issue 24: the
pre-split kernel's at most SGEMM's. NaN and Inf: 127 x 132 x 256 with NaN, +-Inf, an Inf
against a zero and infinities of both signs in one element; each method's NaN / +Inf / -Inf
elements against SGEMM's ("nonfinite" in the JSON).

Speed: 4096^3, 8192^3 and 8192 x 8192 x 1024, every method in the same run, interleaved
rounds, CUDA events, median of --reps (the pre-split kernel's time includes its pre-pass).
The bar: 3xTF32 >= 2.0x SGEMM at 4096^3 and 8192^3, and its ratio to cuBLAS TF32; each split
mode's ratio to SGEMM, and pre-split over in-loop.

The SIMT winner is the library's fp32 4096^3 entry (artifacts/library), launched through the
run path's kernel runner; where that fails, its column says why and the study goes on.
Everything is bounded: the whole run takes about a minute on an H200 (the budget is 5).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from codegen.config import DType  # noqa: E402
from codegen.families.wgmma import WgmmaConfig, check_wgmma  # noqa: E402

T3_DEFAULT = "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3"
PRESPLIT_DEFAULT = "gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3"
TF32_DEFAULT = "gemm_wgmma_tf32_128x256x32_c2_s2_x1_p1_g8"
SIMT_DEFAULT = "gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g8"  # the library's 4096^3 fp32
DISTRIBUTIONS = {
    "normal": dict(m=2048, n=2048, k=2048),
    "uniform01": dict(m=2048, n=2048, k=2048),
    "uniform_pm1_k16384": dict(m=1024, n=1024, k=16384),
    "spread_2^-30..2^30": dict(m=2048, n=2048, k=2048),
    "outlier_rows_1e6": dict(m=2048, n=2048, k=2048),
}
SPEED_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024)]
METHODS = ["cublas_sgemm", "cublas_tf32", "simt", "wgmma_tf32", "wgmma_3xtf32",
           "wgmma_3xtf32_presplit"]
#: the methods that are our wgmma kernels
WGMMA_METHODS = ("wgmma_3xtf32", "wgmma_3xtf32_presplit", "wgmma_tf32")


def make_inputs(torch, dist: str, m: int, n: int, k: int, gen):
    dev = "cuda"
    if dist == "normal":
        return (torch.randn(m, k, device=dev, generator=gen),
                torch.randn(k, n, device=dev, generator=gen))
    if dist == "uniform01":
        return (torch.rand(m, k, device=dev, generator=gen),
                torch.rand(k, n, device=dev, generator=gen))
    if dist.startswith("uniform_pm1"):
        return (torch.rand(m, k, device=dev, generator=gen) * 2 - 1,
                torch.rand(k, n, device=dev, generator=gen) * 2 - 1)
    if dist.startswith("spread"):
        def spread(r, c):
            mag = torch.exp2(torch.rand(r, c, device=dev, generator=gen) * 60 - 30)
            sign = torch.where(torch.rand(r, c, device=dev, generator=gen) < 0.5, -1.0, 1.0)
            return (mag * sign).float()
        return spread(m, k), spread(k, n)
    if dist.startswith("outlier"):
        a = torch.randn(m, k, device=dev, generator=gen)
        b = torch.randn(k, n, device=dev, generator=gen)
        a[[3, 100, 777, m - 1]] *= 1e6
        b[:, [5, 200, 901, n - 1]] *= 1e6
        return a, b
    raise ValueError(dist)


class Methods:
    """Each method as f(a, b, c): c = a @ b, fp32 row-major, on torch's current stream."""

    def __init__(self, torch, t3: str, tf32: str, simt: str, cache: Path,
                 presplit: str = PRESPLIT_DEFAULT):
        self.torch = torch
        self.errors: dict[str, str] = {}
        self.names = {"wgmma_3xtf32": t3, "wgmma_3xtf32_presplit": presplit,
                      "wgmma_tf32": tf32, "simt": simt}
        self.stream = torch.cuda.current_stream().cuda_stream
        self.wgmma = {}
        from codegen.compile import compile_config
        from tuner.runtime import driver
        from tuner.runtime.runners import runner_for

        # every kernel launches through its family's runner (tuner.runtime.runners), bound
        # once per shape, on torch's GPU and stream
        self.driver = driver
        self.g = driver.gpu(torch.cuda.current_device())
        self._bound: dict = {}
        for key in WGMMA_METHODS:
            name = self.names[key]
            try:
                cfg = WgmmaConfig.from_name(name)
                why = check_wgmma(cfg, "sm_90")
                if why:
                    raise ValueError("; ".join(why))
                r = compile_config(cfg, "sm_90", cache)
                if not r.ok:
                    raise RuntimeError(r.error[-500:])
                self.wgmma[key] = runner_for(cfg, Path(r.cubin).read_bytes())
            except Exception as e:  # noqa: BLE001 - reported, the study goes on
                self.errors[key] = f"{type(e).__name__}: {e}"
        self.simt = None
        try:
            from tuner.runtime import load_library

            self.lib = load_library(ROOT / "artifacts" / "library")
            self.simt = self.lib.runner(simt, self.g.sm)
        except Exception as e:  # noqa: BLE001
            self.errors["simt"] = f"{type(e).__name__}: {e}"

    def available(self) -> list[str]:
        return [m for m in METHODS if m not in self.errors]

    def fn(self, method: str, a, b, c):
        torch = self.torch
        m, k = a.shape
        n = b.shape[1]
        if method == "cublas_sgemm":
            def run():
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.mm(a, b, out=c)
        elif method == "cublas_tf32":
            def run():
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.mm(a, b, out=c)
        else:  # simt and the wgmma methods: our kernels, through their runners (a pre-pass
            # kernel's runner launches its pre-pass first, on the same stream)
            key = (method, m, n, k)
            if key not in self._bound:
                runner = self.simt if method == "simt" else self.wgmma[method]
                with self.driver.entered(self.g):
                    self._bound[key] = runner.bind(self.g, m, n, k, k, n, n)
            bound = self._bound[key]

            def run():
                with self.driver.entered(self.g):
                    bound(a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0, self.stream)
        return run


def accuracy(torch, methods: Methods, seed: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for dist, shp in DISTRIBUTIONS.items():
        m, n, k = shp["m"], shp["n"], shp["k"]
        a, b = make_inputs(torch, dist, m, n, k, gen)
        ref = a.double() @ b.double()
        scale = a.double().abs() @ b.double().abs()
        row = dict(distribution=dist, m=m, n=n, k=k, methods={})
        for meth in methods.available():
            c = torch.full((m, n), float("nan"), device="cuda")
            try:
                methods.fn(meth, a, b, c)()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                row["methods"][meth] = dict(error=f"{type(e).__name__}: {e}")
                continue
            d = (c.double() - ref).abs()
            nz = ref != 0
            row["methods"][meth] = dict(
                rel_fro=(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item(),
                max_rel=(d[nz] / ref[nz].abs()).max().item(),
                max_rel_absAB=(d / scale.clamp_min(1e-300)).max().item(),
                nan=int(torch.isnan(c).sum().item()))
        ms = row["methods"]
        if "rel_fro" in ms.get("wgmma_3xtf32", {}) and "rel_fro" in ms.get("cublas_sgemm", {}):
            row["t3_over_sgemm"] = ms["wgmma_3xtf32"]["rel_fro"] / ms["cublas_sgemm"]["rel_fro"]
            row["t3_within_2x_sgemm"] = row["t3_over_sgemm"] <= 2.0
        if ("rel_fro" in ms.get("wgmma_3xtf32_presplit", {})
                and "rel_fro" in ms.get("cublas_sgemm", {})):
            row["presplit_over_sgemm"] = (ms["wgmma_3xtf32_presplit"]["rel_fro"]
                                          / ms["cublas_sgemm"]["rel_fro"])
            row["presplit_no_worse_than_sgemm"] = row["presplit_over_sgemm"] <= 1.0
        rows.append(row)
        print(f"{dist:22} " + "  ".join(
            f"{meth}={v['rel_fro']:.2e}" if "rel_fro" in v else f"{meth}=ERR"
            for meth, v in row["methods"].items()), flush=True)
        del a, b, ref, scale
    return rows


def special_inputs(torch, gen, m: int = 127, n: int = 132, k: int = 256):
    """Normal A and B (rows of whole 16 bytes: every method takes them) with NaN, +-Inf, an Inf against a zero (C[9, 60] = NaN) and
    infinities of both signs in one element (C[20, 40] = NaN; C[20, 128] = -Inf)."""
    a = torch.randn(m, k, device="cuda", generator=gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    inf, nan = float("inf"), float("nan")
    a[5, 7], a[9, 11], a[20, 3], a[64, 200], a[20, 30] = nan, inf, -inf, inf, 2.0
    b[11, 60], b[30, 40], b[40, 50], b[100, 10], b[3, 128], b[3, 40] = 0.0, inf, nan, -inf, inf, 1.0
    return a, b


def nonfinite(torch, methods: Methods, seed: int) -> dict:
    """Each method's NaN / +Inf / -Inf elements against cuBLAS SGEMM's on special_inputs."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b = special_inputs(torch, gen)
    outs = {}
    for meth in methods.available():
        c = torch.full((a.shape[0], b.shape[1]), 12345.0, device="cuda")
        try:
            methods.fn(meth, a, b, c)()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            outs[meth] = dict(error=f"{type(e).__name__}: {e}")
            continue
        outs[meth] = c
    ref = outs.get("cublas_sgemm")
    row = {}
    for meth, c in outs.items():
        if isinstance(c, dict) or not torch.is_tensor(ref):
            row[meth] = c if isinstance(c, dict) else dict(error="no SGEMM to compare with")
            continue
        row[meth] = {what: bool(torch.equal(f(c), f(ref))) for what, f in (
            ("nan_as_sgemm", torch.isnan), ("posinf_as_sgemm", torch.isposinf),
            ("neginf_as_sgemm", torch.isneginf))}
        row[meth].update(nan=int(torch.isnan(c).sum()), inf=int(torch.isinf(c).sum()))
    print("nonfinite: " + "  ".join(
        f"{m}={'ok' if all(v for k, v in r.items() if k.endswith('sgemm')) else 'DIFFERS'}"
        for m, r in row.items() if "error" not in r), flush=True)
    return row


def speed(torch, methods: Methods, reps: int, warmup: int, budget_s: float) -> list[dict]:
    out = []
    t_end = time.monotonic() + budget_s
    for (m, n, k) in SPEED_SHAPES:
        if time.monotonic() > t_end:
            out.append(dict(shape=[m, n, k], skipped="time budget"))
            continue
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        c = torch.empty(m, n, device="cuda")
        runs = {meth: methods.fn(meth, a, b, c) for meth in methods.available()}
        for _ in range(warmup):
            for f in runs.values():
                f()
        torch.cuda.synchronize()
        ev = {meth: [] for meth in runs}
        for _ in range(reps):  # interleaved rounds
            for meth, f in runs.items():
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                f()
                e1.record()
                ev[meth].append((e0, e1))
        torch.cuda.synchronize()
        torch.backends.cuda.matmul.allow_tf32 = False
        flops = 2.0 * m * n * k
        row = dict(shape=[m, n, k], methods={})
        for meth, pairs in ev.items():
            ms = sorted(x.elapsed_time(y) for x, y in pairs)
            med = ms[len(ms) // 2]
            row["methods"][meth] = dict(ms=med, p10=ms[len(ms) // 10],
                                        p90=ms[(9 * len(ms)) // 10], tflops=flops / med / 1e9)
        t = row["methods"]
        if "wgmma_3xtf32" in t:
            row["t3_vs_sgemm"] = t["wgmma_3xtf32"]["tflops"] / t["cublas_sgemm"]["tflops"]
            row["t3_vs_cublas_tf32"] = t["wgmma_3xtf32"]["tflops"] / t["cublas_tf32"]["tflops"]
        if "wgmma_tf32" in t:
            row["tf32_vs_cublas_tf32"] = t["wgmma_tf32"]["tflops"] / t["cublas_tf32"]["tflops"]
        if "wgmma_3xtf32_presplit" in t:
            pre = t["wgmma_3xtf32_presplit"]["tflops"]
            row["presplit_vs_sgemm"] = pre / t["cublas_sgemm"]["tflops"]
            if "wgmma_3xtf32" in t:
                row["presplit_vs_inloop"] = pre / t["wgmma_3xtf32"]["tflops"]
        out.append(row)
        print(f"{m}x{n}x{k}: " + "  ".join(f"{meth}={v['tflops']:.1f}"
                                           for meth, v in t.items())
              + (f"  3xTF32/SGEMM={row['t3_vs_sgemm']:.2f}" if "t3_vs_sgemm" in row else "")
              + (f"  pre-split/SGEMM={row['presplit_vs_sgemm']:.2f}"
                 if "presplit_vs_sgemm" in row else ""),
              flush=True)
        del a, b, c
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5))
    dists = [r["distribution"] for r in report["accuracy"]]
    meths = [m for m in METHODS if any(m in r["methods"] and "rel_fro" in r["methods"][m]
                                       for r in report["accuracy"])]
    w = 0.8 / max(len(meths), 1)
    for i, meth in enumerate(meths):
        vals = [r["methods"].get(meth, {}).get("rel_fro", float("nan")) for r in report["accuracy"]]
        ax1.bar([x + i * w for x in range(len(dists))], vals, w, label=meth)
    ax1.set_yscale("log")
    ax1.set_xticks([x + 0.4 - w / 2 for x in range(len(dists))], dists, rotation=20, fontsize=8)
    ax1.set_ylabel("||C - ref||_F / ||ref||_F  (ref: float64)")
    ax1.set_title("accuracy on fp32 inputs")
    ax1.legend(fontsize=8)
    rows = [r for r in report.get("speed", []) if "methods" in r]
    shapes = ["x".join(map(str, r["shape"])) for r in rows]
    smeths = [m for m in METHODS if any(m in r["methods"] for r in rows)]
    w = 0.8 / max(len(smeths), 1)
    for i, meth in enumerate(smeths):
        vals = [r["methods"].get(meth, {}).get("tflops", 0.0) for r in rows]
        ax2.bar([x + i * w for x in range(len(rows))], vals, w, label=meth)
    ax2.set_xticks([x + 0.4 - w / 2 for x in range(len(rows))], shapes, fontsize=8)
    ax2.set_ylabel("TFLOP/s")
    ax2.set_title(f"speed ({report.get('gpu')})")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t3", default=T3_DEFAULT, help="the in-loop 3xTF32 kernel (a wgmma _t3 name)")
    ap.add_argument("--presplit", default=PRESPLIT_DEFAULT,
                    help="the pre-split 3xTF32 kernel (a wgmma _pre_t3 name)")
    ap.add_argument("--tf32", default=TF32_DEFAULT, help="our 1xTF32 kernel (a wgmma tf32 name)")
    ap.add_argument("--simt", default=SIMT_DEFAULT, help="the SIMT kernel (in artifacts/library)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args(argv)

    import torch

    t0 = time.perf_counter()
    out_dir = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("GEMM_TUNE_CACHE_DIR") or "/tmp/gemm-tune-tf32x3-cache")
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    methods = Methods(torch, args.t3, args.tf32, args.simt, cache, args.presplit)
    from codegen.compile import nvcc_version

    report = dict(bench="tf32x3_accuracy", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
                  nvcc=nvcc_version(), kernels=methods.names, method_errors=methods.errors,
                  ref="float64 product of the fp32 inputs as given")
    for meth, err in methods.errors.items():
        print(f"{meth} unavailable: {err}", flush=True)
    report["accuracy"] = accuracy(torch, methods, args.seed)
    report["nonfinite"] = nonfinite(torch, methods, args.seed)
    if not args.no_speed:
        report["speed"] = speed(torch, methods, args.reps, args.warmup,
                                budget_s=max(30.0, 240.0 - (time.perf_counter() - t0)))
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    stem = f"tf32x3-accuracy-{report['gpu'].replace('NVIDIA ', '').replace(' ', '-').lower()}-" \
           f"{report['date'][:10]}"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    try:
        plot(report, out_dir / f"{stem}.png")
    except Exception as e:  # noqa: BLE001 - the JSON is the record
        print(f"no PNG: {type(e).__name__}: {e}")
    print(f"wrote {out_dir / stem}.json/.png in {report['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
