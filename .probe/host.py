import time, sys, torch
sys.path.insert(0, ".")
from tuner.runtime import fast
from tuner.runtime.library import load_library
t = time.time(); ok = fast.wait(600); print("fast", ok, fast.status(), "%.1f s" % (time.time() - t))
lib = load_library("artifacts/library")
def bench(f, n=3000):
    for _ in range(50): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
for (m, n, k, dt) in [(64, 64, 64, torch.float32), (1000, 1, 1000, torch.float32), (97, 89, 83, torch.float32),
                      (16, 4096, 4096, torch.float16), (512, 512, 512, torch.float16), (256, 32768, 256, torch.float16)]:
    A = torch.randn(m, k, device="cuda", dtype=dt); B = torch.randn(k, n, device="cuda", dtype=dt)
    C = torch.empty(m, n, device="cuda", dtype=dt)
    lib.gemm(A, B, C); lib.gemm(A, B, C)
    ref = A.double() @ B.double(); err = ((C.double() - ref).norm() / ref.norm()).item()
    t_fast = bench(lambda: lib.gemm(A, B, C))
    saved = lib.fast; lib.fast = None
    t_py = bench(lambda: lib.gemm(A, B, C)); lib.fast = saved
    t_torch = bench(lambda: torch.matmul(A, B, out=C))
    plan = next(p for p in lib.plans.values() if (p.m, p.n, p.k) == (m, n, k))
    print(f"{m}x{n}x{k} {str(dt)[6:]:8s} {plan.choice.kernel or 'cuBLAS':60s} fast {t_fast:6.2f} us  python {t_py:6.2f}  torch {t_torch:6.2f}  ratio {t_torch/t_fast:.3f}  err {err:.2e}")
print(lib.fast.stats() if lib.fast is not None else None)
