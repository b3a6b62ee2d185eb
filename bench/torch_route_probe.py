"""What the torch route costs beside torch's own calls, on the GPU (a probe; run from the
repository root, prints only):

    python3 bench/torch_route_probe.py

1. GELU after a large linear (8192 tokens, 4096 <-> 14336, fp16 and bf16), CUDA events with
   L2 flushed: F.gelu out of place, torch's in-place gelu_, F.gelu(F.linear(...)),
   F.linear then gelu_ (what the torch route ran before it went out of place), F.linear
   alone; three rounds.
2. A batched call (32 x 512x512x128, fp16 and fp32) in a loop of 300: host time per call
   and loop time per call of torch.bmm, torch_ops.matmul and lib.gemm on
   artifacts/library; then explain() of that call."""
import statistics, sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch
import torch.nn.functional as F
from wgmma_vs_cublas import Timer
from tuner.runtime import load_library, torch_ops
t = Timer(torch)
med = lambda f: statistics.median(t(f))
for dt in (torch.float16, torch.bfloat16):
    for (m, k, n) in ((8192, 4096, 14336), (8192, 14336, 4096)):
        x = torch.randn(m, k, device="cuda", dtype=dt); w = torch.randn(n, k, device="cuda", dtype=dt) / k**.5
        b = torch.randn(n, device="cuda", dtype=dt); y = F.linear(x, w, b)
        def inplace():
            z = F.linear(x, w, b); torch._C._nn.gelu_(z)
        r = [(med(lambda: F.gelu(y)), med(lambda: torch._C._nn.gelu_(y)), med(lambda: F.gelu(F.linear(x, w, b))), med(inplace), med(lambda: F.linear(x, w, b))) for _ in range(3)]
        print(dt, m, k, n, "gelu out-of-place / in-place / linear+gelu / linear+gelu_ / linear alone (ms), 3 rounds:")
        for row in r: print("   ", " ".join(f"{v:.4f}" for v in row))
lib = load_library("artifacts/library")
for dt in (torch.float16, torch.float32):
    a = torch.randn(32, 512, 128, device="cuda", dtype=dt); bb = torch.randn(32, 128, 512, device="cuda", dtype=dt)
    fs = {"torch.bmm": lambda: torch.bmm(a, bb), "torch_ops.matmul": lambda: torch_ops.matmul(a, bb, library=lib), "lib.gemm": lambda: lib.gemm(a, bb)}
    for name, f in fs.items():
        f(); torch.cuda.synchronize()
    for rnd in range(3):
        out = []
        for name, f in fs.items():
            t0 = time.perf_counter()
            for _ in range(300): f()
            host = (time.perf_counter() - t0) / 300 * 1e6
            torch.cuda.synchronize(); loop = (time.perf_counter() - t0) / 300 * 1e6
            out.append(f"{name} host {host:.1f} loop {loop:.1f} us")
        print(dt, "32x512x512x128 round", rnd, " | ".join(out))
    print(lib.explain(a, bb))
