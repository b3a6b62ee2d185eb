"""`gemm-tune export`: a self-contained C/C++ bundle of a library's kernels for one arch.

    out/gemm_tuned.h          the C API: gemm_tuned_sgemm(...), gemm_tuned_kernel_name(...)
    out/gemm_tuned.cu         dispatch (the Python runtime's rule) over the tuned entries
    out/kernels/<name>.cu     each kernel's generated source plus a host launcher
    out/CMakeLists.txt        cmake -B build && cmake --build build
    out/Makefile              make   (libgemm_tuned.so and gemm_tuned_check)
    out/example.cu            checks gemm_tuned_sgemm against cuBLAS
"""

from __future__ import annotations

import collections
from pathlib import Path

from codegen._io import atomic_write
from codegen.arch import parse_arch
from codegen.config import KernelConfig
from codegen.render import render_file
from tuner.runtime.dispatch import REDUCE_LAUNCH_MS
from tuner.runtime.library import Library, LibraryError
from tuner.occupancy import occupancy

__all__ = ["export"]


def export(lib: Library, out: Path, arch: str | None = None) -> Path:
    entries = [e for e in lib.manifest["entries"] if e["dtype"] == "f32" and e["layout"] == "nn"]
    if not entries:
        raise LibraryError(f"the library at {lib.path} has no fp32 entries to export")
    archs = collections.Counter(e["arch"] for e in entries)
    arch = parse_arch(arch).sm if arch else archs.most_common(1)[0][0]
    entries = [e for e in entries if e["arch"] == arch]
    if not entries:
        raise LibraryError(f"the library at {lib.path} has no entries for {arch} "
                           f"(it has {', '.join(sorted(archs))})")
    limits = parse_arch(arch)
    names = sorted({e["kernel"] for e in entries})
    kernels = []
    for name in names:
        cfg = KernelConfig.from_name(name)
        res = next(e["resources"] for e in entries if e["kernel"] == name)
        smem = res["smem_static"] + res["smem_dynamic"]
        kernels.append(dict(name=name, bm=cfg.bm, bn=cfg.bn, bk=cfg.bk, threads=cfg.threads,
                            smem=cfg.smem_bytes, split=cfg.split,
                            reduce=cfg.reduce, reduce_pass=cfg.reduce_pass,
                            workspace=cfg.has_workspace,
                            blocks_per_sm=occupancy(cfg.threads, res["registers"], smem,
                                                    limits).blocks_per_sm))
        src = (lib.path / lib.manifest["kernels"][f"{arch}/{name}"]["source"]).read_text()
        atomic_write(out / "kernels" / f"{name}.cu",
                     src + render_file("export/launcher.cu.j2", **kernels[-1]))
    rows = [dict(m=e["m"], n=e["n"], k=e["k"], kernel=names.index(e["kernel"]),
                 tflops=e["tflops"]) for e in entries]  # exactly what Python dispatches on
    values = dict(arch=arch, cc=limits.cc, gpu=entries[0]["gpu"], kernels=kernels, entries=rows,
                  mem_gbs=float(limits.mem_gbs), reduce_launch_ms=REDUCE_LAUNCH_MS)
    for template, target in (("gemm_tuned.h.j2", "gemm_tuned.h"),
                             ("gemm_tuned.cu.j2", "gemm_tuned.cu"),
                             ("CMakeLists.txt.j2", "CMakeLists.txt"),
                             ("Makefile.j2", "Makefile"), ("example.cu.j2", "example.cu")):
        atomic_write(out / target, render_file(f"export/{template}", **values))
    return out
