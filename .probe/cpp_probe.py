"""Probe: can a torch C++ extension be built on this machine, and what does each host path cost?"""
import os, shutil, subprocess, sys, sysconfig, time, importlib.util
import torch
out = os.environ.get("OUT", "/tmp")
inc = sysconfig.get_paths()["include"]
print("python", sys.version.split()[0], inc, "Python.h:", os.path.exists(os.path.join(inc, "Python.h")))
print("g++", shutil.which("g++"), "c++", shutil.which("c++"), "ninja", shutil.which("ninja"))
try:
    import ninja; print("ninja module", ninja.__file__)
except Exception as e: print("no ninja module", e)
from torch.utils import cpp_extension as ce
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("includes", ce.include_paths(device_type="cuda") if "device_type" in ce.include_paths.__code__.co_varnames else ce.include_paths(True))
src = r'''
#include <torch/extension.h>
#include <cuda.h>
at::Tensor mm_out(const at::Tensor& A, const at::Tensor& B, at::Tensor& C) { return at::mm_out(C, A, B); }
int64_t key(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C) {
  int64_t h = 1469598103934665603LL;
  auto mix = [&](int64_t v) { h = (h ^ v) * 1099511628211LL; };
  for (const at::Tensor* t : {&A, &B, &C}) {
    mix((int64_t)t->scalar_type()); mix(t->dim());
    for (int i = 0; i < t->dim(); ++i) { mix(t->size(i)); mix(t->stride(i)); }
    mix(((intptr_t)t->data_ptr()) & 15); mix(t->get_device());
  }
  return h;
}
void noop(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C) {}
PYBIND11_MODULE(cpp_probe, m) {
  m.def("mm_out", &mm_out); m.def("key", &key); m.def("noop", &noop);
}
'''
d = "/tmp/cpp_probe"; os.makedirs(d, exist_ok=True)
open(f"{d}/cpp_probe.cpp", "w").write(src)
incs = ce.include_paths(True) if True else []
incs = list(incs) + [inc, "/usr/local/cuda/include"]
libs = ce.library_paths(True)
import torch.utils.cpp_extension
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
       "-DTORCH_EXTENSION_NAME=cpp_probe", "-DTORCH_API_INCLUDE_EXTENSION_H",
       f"{d}/cpp_probe.cpp", "-o", f"{d}/cpp_probe.so"] + [f"-I{i}" for i in incs] + \
      [f"-L{l}" for l in libs] + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10_cuda", "-ltorch_cuda",
       "-L/usr/local/cuda/lib64/stubs", "-lcuda"] + [f"-Wl,-rpath,{l}" for l in libs]
t = time.time()
r = subprocess.run(cmd, capture_output=True, text=True)
print("g++ rc", r.returncode, "in %.1f s" % (time.time() - t)); print(r.stderr[-3000:])
spec = importlib.util.spec_from_file_location("cpp_probe", f"{d}/cpp_probe.so")
ext = importlib.util.module_from_spec(spec); spec.loader.exec_module(ext)
def bench(name, f, n=20000):
    for _ in range(200): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); us = (time.perf_counter() - t) / n * 1e6
    print(f"{name:40s} {us:7.2f} us"); return us
for sz in (64, 1000):
    A = torch.randn(sz, sz, device="cuda"); B = torch.randn(sz, sz, device="cuda"); C = torch.empty(sz, sz, device="cuda")
    print("size", sz)
    bench("torch.matmul(A,B,out=C)", lambda: torch.matmul(A, B, out=C))
    bench("torch.matmul(A,B)", lambda: torch.matmul(A, B))
    bench("torch.mm(A,B,out=C)", lambda: torch.mm(A, B, out=C))
    bench("ext.mm_out(A,B,C)", lambda: ext.mm_out(A, B, C))
    def wrap(A, B, C, alpha=1.0, beta=0.0, stream=None):
        return ext.mm_out(A, B, C)
    bench("py wrap -> ext.mm_out", lambda: wrap(A, B, C))
    bench("ext.key", lambda: ext.key(A, B, C))
    bench("ext.noop", lambda: ext.noop(A, B, C))
    bench("python key (shape,stride,ptr)", lambda: (A.shape, B.shape, A.stride(), B.stride(), A.data_ptr() & 15, B.data_ptr() & 15, C.shape, C.stride(), C.data_ptr()))
    try:
        sys.path.insert(0, ".")
        from tuner.runtime.library import Library
        lib = Library.load("artifacts/library") if hasattr(Library, "load") else None
    except Exception as e:
        lib = None; print("no lib", e)
    if lib is not None:
        lib.gemm(A, B, C)
        bench("lib.gemm(A,B,C)", lambda: lib.gemm(A, B, C), 5000)
        print(lib.explain(A, B, C) if hasattr(lib, "explain") else "")
