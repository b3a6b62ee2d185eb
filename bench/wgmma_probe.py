"""GPU probe of the wgmma family (issue 13): compile, check every step, time against cuBLAS.

Run from the repository root on an sm_90 GPU machine (needs nvcc, torch, numpy, jinja2 and
cuda-bindings; not optuna, not pycuda):

    python3 bench/wgmma_probe.py                 # everything, JSON to $OUT/wgmma-probe.json
    python3 bench/wgmma_probe.py --no-time       # correctness only
    python3 bench/wgmma_probe.py --configs gemm_wgmma_f16_128x128x64_c1_s4_x1_p0_g8
    python3 bench/wgmma_probe.py --dry-run       # no GPU: compile and list what would run
    python3 bench/wgmma_probe.py --fp32          # tf32 and 3xTF32 (fp32 data), JSON to
                                                 # $OUT/wgmma-probe-fp32.json

Each config's correctness cases run in a child process that reports one JSON line per
case; a case that does not answer within its timeout is reported as "hang", the child is
killed and the config's later (larger) cases are skipped (a hung mbarrier never hangs the
probe); a case that raises (a launch fault) is "error" and a fresh child goes on.
Shapes 1x1x1 ... 4096^3, alpha=0.5, beta=2 and beta=0 (C poisoned with NaN), leading
dimensions padded to TMA's 16 bytes with NaN in the padding (it must never be read), C
with a guard band of extra rows and columns (it must never be written). Error
||C - ref|| / ||ref|| against a float64 product of the inputs as given; gate 2e-5
(scaled by K/4096 above K = 4096).

--fp32 probes the fp32-data variants instead (FP32_CONFIGS): fp32 inputs; tf32 against a
float64 product of the inputs rounded to tf32 as round_to does (to nearest, ties away), gate
1e-4 (x K/4096 above 4096), with the error against truncated inputs reported beside it (a
kernel that let the tensor cores truncate lands near 5e-4 there... and far from the gate);
3xTF32 against float64 of the inputs as given, fp32's gate 1e-5 flat. Extra cases: "deep"
(1024 x 1024 x 16384: the accumulation), "nonfinite" (NaN and +-Inf in A and B, an Inf
against a zero: the NaN / +Inf / -Inf pattern of C must equal float64's, as SGEMM's does),
"tiny" (A ~ 2^-118, B ~ 2^100: A's small parts are subnormal; measured, gated at tf32's).
Timing at 4096^3, 8192^3 and 8192 x 8192 x 1024 against cuBLAS SGEMM and cuBLAS TF32 (torch
fp32 matmul with allow_tf32 off / on), in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from codegen.config import DType  # noqa: E402
from codegen.families.wgmma import WgmmaConfig, check_wgmma, tma_reasons  # noqa: E402

#: steps (a)-(d) of issue 13, ping-pong (e) and the TMA-store epilogue (f), fp16 and bf16;
#: BN=64 makes B's LBO irrelevant (a diagnostic)
CONFIGS = [
    "gemm_wgmma_f16_64x64x64_c1_s4_x1_p0_g1",      # (a) smallest: one B box, LBO unused
    "gemm_wgmma_f16_128x128x64_c1_s4_x1_p0_g8",    # (a) two wgmmas per k-step (WM=128)
    "gemm_wgmma_bf16_128x128x64_c1_s4_x1_p0_g8",   # (a) bf16
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p0_g8",    # (b) two consumers, N=256
    "gemm_wgmma_bf16_256x128x64_c2_s4_x1_p0_g8",   # (b) two consumers of 128 rows each
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8",    # (c) persistent
    "gemm_wgmma_f16_128x192x64_c2_s4_x1_p1_g16",   # (c) persistent, N=192
    "gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8",   # (c) bf16
    "gemm_wgmma_f16_128x128x64_c1_s5_x2_p0_g8",    # (d) cluster of 2, one consumer
    "gemm_wgmma_f16_128x256x64_c2_s4_x2_p1_g8",    # (d) cluster + persistent
    "gemm_wgmma_bf16_128x256x64_c2_s4_x2_p0_g8",   # (d) bf16
    "gemm_wgmma_f16_128x128x64_c2_s5_x1_p1_g8_pp",  # (e) ping-pong consumers, 128 x 128 each
    "gemm_wgmma_bf16_64x256x64_c2_s5_x1_p1_g1_pp",  # (e) ping-pong, 64 x 256 each
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts",  # (f) the TMA-store epilogue on (c)
]
SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 257), (4095, 4097, 1023), (4096, 4096, 4096)]
BETAS = (2.0, 0.0)
ALPHA = 0.5
TIME_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]

#: fp32 data: tf32 (dtype tf32) and 3xTF32 (dtype f32, _t3), the conversion's paths between
#: them: 1 and 2 consumers, 2 stages (the extra barrier) and more, cluster, persistent
FP32_CONFIGS = [
    "gemm_wgmma_tf32_128x128x32_c2_s4_x1_p0_g8",   # two consumers, one tile per block
    "gemm_wgmma_tf32_64x128x32_c1_s4_x1_p0_g8",    # one consumer
    "gemm_wgmma_tf32_128x256x32_c2_s2_x1_p1_g8",   # two stages, N=256, persistent
    "gemm_wgmma_tf32_256x128x32_c2_s3_x1_p1_g8",   # 128 rows per consumer
    "gemm_wgmma_tf32_128x128x32_c2_s4_x2_p1_g8",   # cluster of 2 (B multicast)
    "gemm_wgmma_f32_128x128x32_c2_s2_x1_p1_g8_t3",   # 3xTF32, two stages
    "gemm_wgmma_f32_128x64x32_c2_s4_x1_p1_g8_t3",    # 3xTF32, four stages
    "gemm_wgmma_f32_64x128x32_c1_s3_x1_p0_g8_t3",    # 3xTF32, one consumer
    "gemm_wgmma_f32_128x64x32_c1_s3_x2_p1_g8_t3",    # 3xTF32, cluster, 2 m64 slices
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre",  # tf32 pre-pass: no conversion in the loop
    "gemm_wgmma_tf32_256x128x32_c2_s4_x1_p1_g8_pre",  # pre-pass, 128 rows per consumer
    "gemm_wgmma_tf32_128x128x32_c2_s6_x1_p0_g8_pre",  # pre-pass, one tile per block
]
FP32_TIME_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024)]
FP32_EXTRA = [dict(m=1024, n=1024, k=16384, beta=0.0, kind="deep"),
              dict(m=127, n=129, k=257, beta=2.0, kind="nonfinite"),
              dict(m=256, n=256, k=256, beta=0.0, kind="tiny")]
GUARD = 3  # extra rows and columns of C that must never be written
CASE_TIMEOUT_S = 15.0  # per case (the child's start-up has 30 s more)
BUDGET_S = 300.0  # correctness stops starting configs after this (the probe must end in 6 min)
TIMING_TIMEOUT_S = 150.0


def gate(k: int, dtype: DType = DType.F16) -> float:
    if dtype is DType.F32:  # 3xTF32: fp32's gate, as the CUDA-core family's
        return 1e-5
    if dtype is DType.TF32:
        return 1e-4 * max(1.0, k / 4096)
    return 2e-5 * max(1.0, k / 4096)


def step(c: WgmmaConfig) -> str:
    if c.store:
        return "f"
    if c.pingpong:
        return "e"
    if c.cluster > 1:
        return "d"
    if c.persistent:
        return "c"
    return "b" if c.consumers > 1 else "a"


def cases(fp32: bool = False) -> list[dict]:
    base = [dict(m=m, n=n, k=k, beta=b) for (m, n, k) in SHAPES for b in BETAS]
    return base + [dict(c) for c in FP32_EXTRA] if fp32 else base


def padded(x: int, dtype: DType) -> int:
    """The least leading dimension >= x whose rows are a multiple of 16 bytes."""
    per = 16 // dtype.size
    return -(-x // per) * per


def misaligned_case(dtype: DType = DType.F16, k: int = 1023) -> dict:
    """An lda that is not a multiple of 8 halves: the host must refuse it, with numbers."""
    lda = k + 1 if (k + 1) % 8 else k + 2
    reasons = tma_reasons(dtype, lda, 1024, 0x10000, 0x20000, 64, 1024, k)
    return dict(lda=lda, reasons=reasons, refused=bool(reasons))


# ---- child: correctness --------------------------------------------------------------
def _torch_dtype(torch, dtype: DType):
    return {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.TF32: torch.float32,
            DType.F32: torch.float32}[dtype]


def _tf32(torch, x, mode: str):
    """fp32 tensor x rounded to tf32: "rna" to nearest, ties away (cvt.rna, round_to in
    tuner/bench.py), or "trunc" (the low 13 bits dropped, as the tensor cores read fp32)."""
    x = x.contiguous()
    bits = x.view(torch.int32)
    if mode == "rna":
        bits = bits + 0x1000
    return torch.where(torch.isfinite(x), (bits & -0x2000).view(torch.float32), x)


def _special_inputs(torch, case: dict, a, b, k: int, n: int):
    """Fill the "nonfinite" and "tiny" cases' inputs in place."""
    if case.get("kind") == "nonfinite":
        a[5, 7] = float("nan")
        a[9, 11] = float("inf")
        a[20, 3] = float("-inf")
        b[11, 60] = 0.0                  # C[9, 60] = Inf * 0 = NaN
        b[30, 40] = float("inf")         # column 40: +-Inf, NaN in row 9 where signs meet
        b[40, 50] = float("nan")
        b[100, 10] = float("-inf")
    elif case.get("kind") == "tiny":
        a[:, :k] *= 2.0 ** -118           # A's small parts (about 2^-11 of A) are subnormal
        b[:, :n] *= 2.0 ** 100


def _child_cases(cubin: str, name: str, todo: list[dict]) -> None:
    import torch

    from tuner.runtime import driver
    from tuner.runtime.errors import TmaUnsupported
    from tuner.runtime.runners import runner_for

    cfg = WgmmaConfig.from_name(name)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    # the family's runner (tensor maps, the pre-pass, clusters, the TMA-store epilogue), as
    # the tuner times it and the library ships it, on torch's GPU (its primary context
    # current) and stream
    runner = runner_for(cfg, Path(cubin).read_bytes())
    g = driver.gpu(torch.cuda.current_device())
    stream = torch.cuda.current_stream().cuda_stream
    tdt = _torch_dtype(torch, cfg.dtype)
    print(json.dumps({"ready": True}), flush=True)
    for case in todo:
        t0 = time.perf_counter()
        out = dict(case)
        try:
            if case.get("misaligned"):
                k = case["k"]
                lda = case["lda"]
                a = torch.randn(64, lda, device="cuda").to(tdt)
                b = torch.randn(k, 1024, device="cuda").to(tdt)
                c = torch.zeros(64, 1024, device="cuda")
                try:
                    runner.bind(g, 64, 1024, k, lda, 1024, 1024)(
                        a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0, stream)
                    if cfg.pre_pass:  # the pre-pass reads any lda: it must be right, not refused
                        torch.cuda.synchronize()
                        ref = a[:, :k].double() @ b.double()
                        if cfg.dtype is DType.TF32:
                            ref = _tf32(torch, a[:, :k], "rna").double() @ \
                                _tf32(torch, b, "rna").double()
                        err = (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item()
                        out.update(status="ok" if err <= gate(k, cfg.dtype) else "fail", err=err)
                    else:
                        out.update(status="fail", error="launch accepted a misaligned lda")
                except TmaUnsupported as e:
                    out.update(status="ok", error=str(e))
                print(json.dumps(out), flush=True)
                continue
            m, n, k, beta = case["m"], case["n"], case["k"], case["beta"]
            lda, ldb = padded(k, cfg.dtype), padded(n, cfg.dtype)
            # a TMA-stored C needs rows of 16 bytes: its guard columns are the padding
            ldc = padded(n, DType.F32) + 4 if cfg.store else n + GUARD
            a = torch.randn(m, lda, device="cuda").to(tdt)
            b = torch.randn(k, ldb, device="cuda").to(tdt)
            _special_inputs(torch, case, a, b, k, n)
            a[:, k:] = float("nan")  # TMA's tensor map ends at K and N: never read
            b[:, n:] = float("nan")
            c = torch.full((m + GUARD, ldc), 12345.0, device="cuda")
            if beta != 0.0:
                c[:m, :n] = torch.randn(m, n, device="cuda")
            else:
                c[:m, :n] = float("nan")  # beta == 0 must not read C
            c0 = c[:m, :n].double().clone()
            a_in, b_in = a[:, :k], b[:, :n]
            if cfg.dtype is DType.TF32:
                a_in, b_in = _tf32(torch, a_in, "rna"), _tf32(torch, b_in, "rna")

            def product(x, y):
                r = ALPHA * (x.double() @ y.double())
                return r + beta * c0 if beta != 0.0 else r

            ref = product(a_in, b_in)
            runner.bind(g, m, n, k, lda, ldb, ldc)(a.data_ptr(), b.data_ptr(), c.data_ptr(),
                                                   ALPHA, beta, stream)
            torch.cuda.synchronize()
            got = c[:m, :n].double()

            def rel(x, r):
                return (torch.linalg.norm(x - r) / torch.linalg.norm(r).clamp_min(1e-300)).item()

            guard_ok = bool((c[:m, n:] == 12345.0).all().item() and (c[m:, :] == 12345.0).all().item())
            g = gate(k, cfg.dtype)
            if case.get("kind") == "nonfinite":
                masks = {what: (f(got) == f(ref)).all().item() for what, f in (
                    ("nan", torch.isnan), ("posinf", torch.isposinf), ("neginf", torch.isneginf))}
                fin = torch.isfinite(ref)
                err = rel(got[fin], ref[fin])
                ok = all(masks.values()) and err <= g and guard_ok
                out.update(status="ok" if ok else "fail", err=err, gate=g, guard_ok=guard_ok,
                           masks_equal=masks, nan_ref=int(torch.isnan(ref).sum().item()),
                           nan_got=int(torch.isnan(got).sum().item()),
                           inf_ref=int(torch.isinf(ref).sum().item()),
                           inf_got=int(torch.isinf(got).sum().item()))
            else:
                err = rel(got, ref)
                nan = bool(torch.isnan(got).any().item())
                if case.get("kind") == "tiny":
                    g = gate(k, DType.TF32)  # measured; gated only against gross failure
                ok = (err <= g) and guard_ok and not nan
                out.update(status="ok" if ok else "fail", err=err, gate=g, guard_ok=guard_ok,
                           nan=nan)
                if cfg.fp32_data:  # the rounding the kernel applies, told apart
                    out["err_vs_exact"] = rel(got, product(a[:, :k], b[:, :n]))
                    out["err_vs_trunc"] = rel(got, product(_tf32(torch, a[:, :k], "trunc"),
                                                           _tf32(torch, b[:, :n], "trunc")))
                    out["err_vs_rna"] = rel(got, product(_tf32(torch, a[:, :k], "rna"),
                                                         _tf32(torch, b[:, :n], "rna")))
        except Exception as e:  # noqa: BLE001 - reported as data; the parent decides
            out.update(status="error", error=f"{type(e).__name__}: {e}")
        out["seconds"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(out), flush=True)
        if out["status"] == "error":
            return  # the context may be broken (a launch fault): the parent starts a fresh child


# ---- child: timing -------------------------------------------------------------------
def _group(dt: DType) -> str:
    """Configs timed on the same inputs: fp16, bf16, or fp32 data (tf32 and 3xTF32)."""
    return "fp32" if dt in (DType.TF32, DType.F32) else dt.short


def _child_time(spec: list[dict], reps: int, warmup: int, shapes: list) -> None:
    import torch

    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    g = driver.gpu(torch.cuda.current_device())  # torch made its primary context current
    fns = {}
    for s in spec:
        cfg = WgmmaConfig.from_name(s["name"])
        fns[s["name"]] = (cfg, runner_for(cfg, Path(s["cubin"]).read_bytes()))
    print(json.dumps({"ready": True}), flush=True)
    for (m, n, k) in shapes:
        result = {"shape": [m, n, k], "kernels": {}}
        for grp in sorted({_group(c.dtype) for c, _ in fns.values()}):
            members = {name: cf for name, cf in fns.items() if _group(cf[0].dtype) == grp}
            tdt = _torch_dtype(torch, next(iter(members.values()))[0].dtype)
            a = torch.randn(m, k, device="cuda").to(tdt)
            b = torch.randn(k, n, device="cuda").to(tdt)
            c = torch.empty(m, n, device="cuda")
            runs = {}
            for name, (cfg, runner) in members.items():
                bound = runner.bind(g, m, n, k, k, n, n)  # everything but the launch, once
                runs[name] = (lambda bound=bound, pa=a.data_ptr(), pb=b.data_ptr(),
                              pc=c.data_ptr(): bound(pa, pb, pc, 1.0, 0.0, stream))
            variants = {}
            if grp == "fp32":
                def sgemm():
                    torch.backends.cuda.matmul.allow_tf32 = False
                    torch.mm(a, b, out=c)

                def tf32():
                    torch.backends.cuda.matmul.allow_tf32 = True
                    torch.mm(a, b, out=c)

                runs["cublas_sgemm"], runs["cublas_tf32"] = sgemm, tf32
                variants = {"cublas_sgemm": "torch.mm fp32, allow_tf32=False (cuBLAS SGEMM)",
                            "cublas_tf32": "torch.mm fp32, allow_tf32=True (cuBLAS TF32)"}
            else:
                try:
                    torch.mm(a, b, out_dtype=torch.float32)
                    cublas = lambda: torch.mm(a, b, out_dtype=torch.float32)  # noqa: E731
                    variant = f"torch.mm {grp} -> fp32 (out_dtype)"
                except (TypeError, RuntimeError):
                    cublas = lambda: torch.matmul(a, b)  # noqa: E731
                    variant = f"torch.matmul {grp} -> {grp}"
                runs[f"cublas_{grp}"] = cublas
                variants = {f"cublas_{grp}": variant}
            times = {name: [] for name in runs}
            for _ in range(warmup):
                for f in runs.values():
                    f()
            torch.cuda.synchronize()
            for _ in range(reps):  # interleaved: every kernel once per round
                for name, f in runs.items():
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    f()
                    e1.record()
                    times[name].append((e0, e1))
            torch.cuda.synchronize()
            torch.backends.cuda.matmul.allow_tf32 = False
            flops = 2.0 * m * n * k
            for name, ev in times.items():
                ms = sorted(x.elapsed_time(y) for x, y in ev)
                med = ms[len(ms) // 2]
                row = dict(ms=med, p10=ms[len(ms) // 10], p90=ms[(9 * len(ms)) // 10],
                           tflops=flops / med / 1e9, reps=len(ms))
                if name in variants:
                    row["variant"] = variants[name]
                result["kernels"][name] = row
            ks = result["kernels"]
            for name, (cfg, _) in members.items():
                row = ks[name]
                if grp != "fp32":
                    row["vs_cublas"] = row["tflops"] / ks[f"cublas_{grp}"]["tflops"]
                else:  # tf32 against cuBLAS TF32; 3xTF32 against SGEMM (and TF32 beside it)
                    row["vs_cublas_tf32"] = row["tflops"] / ks["cublas_tf32"]["tflops"]
                    row["vs_cublas_sgemm"] = row["tflops"] / ks["cublas_sgemm"]["tflops"]
                    row["vs_cublas"] = row["vs_cublas_sgemm" if cfg.terms == 3 else "vs_cublas_tf32"]
        print(json.dumps(result), flush=True)


# ---- parent --------------------------------------------------------------------------
class _Child:
    """A child process whose stdout lines are read with a deadline."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=ROOT, start_new_session=True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def line(self, timeout: float) -> dict | None:
        """The next JSON line, or None when the deadline passes or the child ends."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            text = self.proc.stdout.readline()
            if not text:
                return None
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                continue  # stray output

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its pid
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            err = ""
        return (err or "")[-2000:]


def run_cases(cubin: str, name: str, todo: list[dict], timeout: float = CASE_TIMEOUT_S) -> list[dict]:
    done: list[dict] = []
    while len(done) < len(todo):
        rest = todo[len(done):]
        child = _Child([sys.executable, __file__, "--child-cases", cubin, name, json.dumps(rest)])
        ready = child.line(timeout + 30)
        if not ready:
            err = child.stop()
            done += [dict(c, status="error", error=f"child did not start: {err}") for c in rest]
            break
        for case in rest:
            got = child.line(timeout)
            if got is None:
                alive = child.proc.poll() is None
                err = child.stop()
                done.append(dict(case, status="hang" if alive else "crash",
                                 error=f"no answer in {timeout:.0f} s" if alive else err))
                if alive:  # one hang costs a timeout; the later (larger) cases would hang too
                    done += [dict(c, status="skipped", error="after a hang")
                             for c in todo[len(done):]]
                break
            done.append(got)
            print(f"  {name} {case.get('m', '-')}x{case.get('n', '-')}x{case['k']} "
                  f"beta={case.get('beta', '-')}: {got['status']} "
                  f"{got.get('err', got.get('error', ''))}", flush=True)
            if got["status"] == "error":
                child.stop()
                break
        else:
            child.stop()
    return done


def time_configs(spec: list[dict], reps: int, warmup: int, shapes=None) -> list[dict]:
    if not spec:
        return []
    shapes = [list(x) for x in (shapes or TIME_SHAPES)]
    child = _Child([sys.executable, __file__, "--child-time", json.dumps(spec), str(reps),
                    str(warmup), json.dumps(shapes)])
    out = []
    if child.line(60) is None:
        return [{"error": f"timing child did not start: {child.stop()}"}]
    deadline = time.monotonic() + TIMING_TIMEOUT_S
    for _ in shapes:
        got = child.line(max(1.0, deadline - time.monotonic()))
        if got is None:
            out.append({"error": f"timing hung or crashed: {child.stop()}"})
            return out
        out.append(got)
    child.stop()
    return out


def compile_all(names: list[str], cache: Path) -> dict:
    from codegen.compile import compile_many

    cfgs = [WgmmaConfig.from_name(n) for n in names]
    res = {}
    for c, r in compile_many(cfgs, "sm_90", cache_dir=cache):
        warnings = [l for l in r.log.splitlines() if "warning" in l.lower()]
        res[c.name] = dict(
            ok=r.ok and not any("C7508" in w for w in warnings),
            cubin=str(r.cubin) if r.cubin else None, seconds=round(r.seconds, 2),
            registers=r.resources.registers if r.resources else None,
            spill_bytes=r.resources.spill_bytes if r.resources else None,
            smem=r.resources.smem if r.resources else None,
            warnings=warnings, error=None if r.ok else r.error[-3000:])
    return res


def _table(report: dict) -> str:
    lines = [f"{'config':44} {'step':4} {'regs':>4} {'spill':>5} {'cases':>7} {'max err':>9}  "
             f"{'4096 TF':>8} {'x cuBLAS':>8} {'8192 TF':>8} {'x cuBLAS':>8}"]
    timing = {tuple(t["shape"]): t["kernels"] for t in report.get("timing", []) if "shape" in t}
    time_shapes = [tuple(x) for x in report.get("time_shapes", TIME_SHAPES)]
    for c in report["configs"]:
        comp = c["compile"]
        passed = sum(x["status"] == "ok" for x in c["cases"])
        errs = [x["err"] for x in c["cases"] if isinstance(x.get("err"), float)]
        tcols = []
        for shp in time_shapes[:2]:
            row = timing.get(shp, {}).get(c["name"])
            tcols += [f"{row['tflops']:8.1f}", f"{row.get('vs_cublas', 0):8.2f}"] if row else \
                [f"{'-':>8}", f"{'-':>8}"]
        lines.append(f"{c['name']:44} {c['step']:4} {comp.get('registers') or '-':>4} "
                     f"{comp.get('spill_bytes') if comp.get('spill_bytes') is not None else '-':>5} "
                     f"{passed:>3}/{len(c['cases']):<3} "
                     f"{(max(errs) if errs else float('nan')):9.2e}  " + " ".join(tcols))
    for shp, ks in timing.items():
        for name, row in ks.items():
            if shp not in time_shapes[:2] and not name.startswith("cublas_"):
                lines.append(f"{name} {shp}: {row['tflops']:.1f} TFLOP/s "
                             f"({row.get('vs_cublas', 0):.2f}x its cuBLAS)")
        for name, row in ks.items():
            if name.startswith("cublas_"):
                lines.append(f"{name} {shp}: {row['tflops']:.1f} TFLOP/s ({row['variant']})")
    bad = [(c["name"], x) for c in report["configs"] for x in c["cases"] if x["status"] != "ok"]
    for name, x in bad[:30]:
        lines.append(f"NOT OK {name} {x}")
    return "\n".join(lines)


def timeable(results: list[dict]) -> bool:
    """Timed when every plain case passed and nothing hung or crashed: the measured extras
    ("deep", "tiny") may miss their gate and the config is still timed (and reported)."""
    return bool(results) and all(
        x["status"] == "ok" if not x.get("kind") else x["status"] in ("ok", "fail")
        for x in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", help="comma-separated kernel names (default: the probe's list)")
    ap.add_argument("--no-time", action="store_true", help="skip the timing against cuBLAS")
    ap.add_argument("--dry-run", action="store_true", help="compile and list; no GPU")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--child-cases", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--fp32", action="store_true",
                    help="probe the fp32-data variants (tf32, 3xTF32) instead")
    ap.add_argument("--child-time", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_cases:
        cubin, name, todo = args.child_cases
        _child_cases(cubin, name, json.loads(todo))
        return 0
    if args.child_time:
        spec, reps, warmup, shapes = args.child_time
        _child_time(json.loads(spec), int(reps), int(warmup), json.loads(shapes))
        return 0

    t_start = time.perf_counter()
    out_dir = Path(os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = args.configs.split(",") if args.configs else (FP32_CONFIGS if args.fp32 else CONFIGS)
    time_shapes = FP32_TIME_SHAPES if args.fp32 else TIME_SHAPES
    report: dict = dict(probe="wgmma-fp32" if args.fp32 else "wgmma",
                        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        alpha=ALPHA, betas=list(BETAS), shapes=SHAPES, configs=[],
                        time_shapes=time_shapes, misaligned=misaligned_case())
    invalid = {n: check_wgmma(WgmmaConfig.from_name(n), "sm_90") for n in names}
    invalid = {n: w for n, w in invalid.items() if w}
    if invalid:
        print(f"invalid configs: {invalid}")
        return 2
    print(f"compiling {len(names)} configs ...", flush=True)
    compiled = compile_all(names, Path(os.environ.get("GEMM_TUNE_CACHE_DIR") or out_dir) / "wgmma-probe-cache")
    try:
        import torch
        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        report["torch"] = torch.__version__
    except ImportError:
        report["gpu"] = None
    from codegen.compile import nvcc_version
    report["nvcc"] = nvcc_version()

    for name in names:
        cfg = WgmmaConfig.from_name(name)
        entry = dict(name=name, step=step(cfg), dtype=cfg.dtype.short, config=cfg.to_dict(),
                     grid_4096=list(cfg.grid(4096, 4096, 132)), smem_bytes=cfg.smem_bytes,
                     compile={k: v for k, v in compiled[name].items() if k != "cubin"}, cases=[])
        report["configs"].append(entry)
        comp = compiled[name]
        print(f"{name}: compile {'ok' if comp['ok'] else 'FAILED'} regs={comp['registers']} "
              f"spills={comp['spill_bytes']}", flush=True)
        if not comp["ok"] or args.dry_run:
            continue
        if time.perf_counter() - t_start > BUDGET_S:
            entry["cases"] = [dict(c, status="skipped", error="time budget")
                              for c in cases(cfg.fp32_data)]
            continue
        todo = cases(cfg.fp32_data)
        if name == names[0]:
            mis = report["misaligned"]
            todo.append(dict(misaligned=True, k=1023, lda=mis["lda"]))
        entry["cases"] = run_cases(comp["cubin"], name, todo)

    passing = [dict(name=c["name"], cubin=compiled[c["name"]]["cubin"]) for c in report["configs"]
               if timeable(c["cases"])]
    if not args.no_time and not args.dry_run:
        print(f"timing {len(passing)} passing configs against cuBLAS ...", flush=True)
        report["timing"] = time_configs(passing, args.reps, args.warmup, time_shapes)
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    path = out_dir / ("wgmma-probe-fp32.json" if args.fp32 else "wgmma-probe.json")
    path.write_text(json.dumps(report, indent=1, default=str))
    print(_table(report))
    print(f"wrote {path} in {report['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
