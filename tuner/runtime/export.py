"""`gemm-tune export`: a self-contained C/C++ bundle of a library's kernels for one arch.

    out/gemm_tuned.h          the C API: gemm_tuned_sgemm / _hgemm / _bf16gemm(...),
                              gemm_tuned_kernel_name(...)
    out/gemm_tuned.cu         dispatch (the Python runtime's rule) over the tuned entries,
                              one table per input type
    out/kernels/<name>.cu     each kernel's generated source plus a host launcher (a wgmma
                              kernel's builds its TMA tensor maps with the driver's
                              cuTensorMapEncodeTiled, fetched through
                              cudaGetDriverEntryPointByVersion so nothing links libcuda,
                              and launches through cudaLaunchKernelEx with its cluster)
    out/CMakeLists.txt        cmake -B build && cmake --build build
    out/Makefile              make   (libgemm_tuned.so and gemm_tuned_check)
    out/example.cu            checks every entry point against cuBLAS (FP32 output)

fp32 entries serve gemm_tuned_sgemm, fp16 ones gemm_tuned_hgemm and bf16 ones
gemm_tuned_bf16gemm (FP32 C in all three), from any family. tf32 entries are not exported,
nor entries of another variant than the plain one (row-major A and B, fp32 C, no bias or
activation) or of a batch: the bundle's entry points take none of those.
"""

from __future__ import annotations

import collections
from pathlib import Path

from codegen._io import atomic_write
from codegen.arch import parse_arch
from codegen.config import DType, config_from_name
from codegen.occupancy import occupancy
from codegen.rendering import render_file
from tuner.runtime.dispatch import REDUCE_LAUNCH_MS
from tuner.runtime.errors import LibraryError
from tuner.runtime.library import Library
from tuner.runtime.manifest import entry_batch, entry_variant

__all__ = ["export", "EXPORTED"]

#: the input types a bundle serves: (dtype, C entry point, pointer type)
EXPORTED = ((DType.F32, "gemm_tuned_sgemm", "float"),
            (DType.F16, "gemm_tuned_hgemm", "__half"),
            (DType.BF16, "gemm_tuned_bf16gemm", "__nv_bfloat16"))

_TMA_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}


def _kernel_values(cfg, res: dict, limits) -> dict:
    """What launcher.cu.j2 and the dispatch table need of one kernel."""
    smem = res["smem_static"] + res["smem_dynamic"]
    tma = cfg.aligned_operands[0]  # A (and B) read through TMA tensor maps
    v = dict(name=cfg.name, dtype=cfg.dtype.short, ptr_t=cfg.dtype.cpp, bm=cfg.bm, bn=cfg.bn,
             bk=cfg.bk, threads=cfg.threads, smem=cfg.smem_bytes, split=cfg.split,
             last=cfg.last, reduce_pass=cfg.reduce_pass,
             workspace=cfg.has_workspace, tma=tma, store=cfg.aligned_operands[2],
             blocks_per_sm=occupancy(cfg.threads, res["registers"], smem, limits).blocks_per_sm)
    if tma:
        boxes = cfg.tma_boxes()
        v.update(tma_dtype=_TMA_DTYPE[cfg.dtype], es=cfg.dtype.size, a_box=boxes["A"],
                 b_box=boxes["B"], cluster=cfg.cluster, persistent=cfg.persistent,
                 c_box=boxes.get("C"))
    return v


def export(lib: Library, out: Path, arch: str | None = None) -> Path:
    wanted = {d.short for d, _, _ in EXPORTED}
    entries = [e for e in lib.manifest["entries"]  # the plain problem only (see the doc)
               if e["dtype"] in wanted and entry_variant(e).plain and entry_batch(e) == 1]
    if not entries:
        raise LibraryError(f"the library at {lib.path} has no fp32, fp16 or bf16 entries to "
                           f"export")
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
        cfg = config_from_name(name)
        res = next(e["resources"] for e in entries if e["kernel"] == name)
        kernels.append(_kernel_values(cfg, res, limits))
        src = (lib.path / lib.manifest["kernels"][f"{arch}/{name}"]["source"]).read_text()
        atomic_write(out / "kernels" / f"{name}.cu",
                     src + render_file("export/launcher.cu.j2", **kernels[-1]))
    groups = []
    for dtype, entry_point, ptr_t in EXPORTED:
        mine = [k for k in kernels if k["dtype"] == dtype.short]
        rows = [dict(m=e["m"], n=e["n"], k=e["k"], kernel=[k["name"] for k in mine].index(
                    e["kernel"]), tflops=e["tflops"])
                for e in entries if e["dtype"] == dtype.short]  # what Python dispatches on
        groups.append(dict(dtype=dtype.short, entry=entry_point, ptr_t=ptr_t, es=dtype.size,
                           kernels=mine, entries=rows))
    # wgmma (and any sm_XXa kernel) needs the architecture-specific target for the bundle
    target = f"{arch}a" if any(k["tma"] for k in kernels) else arch
    values = dict(arch=arch, target=target, cc=limits.cc, gpu=entries[0]["gpu"],
                  kernels=kernels, groups=groups, entries=groups[0]["entries"],
                  needs_driver=any(k["tma"] for k in kernels),
                  mem_gbs=float(limits.mem_gbs), reduce_launch_ms=REDUCE_LAUNCH_MS)
    for template, target_file in (("gemm_tuned.h.j2", "gemm_tuned.h"),
                                  ("gemm_tuned.cu.j2", "gemm_tuned.cu"),
                                  ("CMakeLists.txt.j2", "CMakeLists.txt"),
                                  ("Makefile.j2", "Makefile"), ("example.cu.j2", "example.cu")):
        atomic_write(out / target_file, render_file(f"export/{template}", **values))
    return out
