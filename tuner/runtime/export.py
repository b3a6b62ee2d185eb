"""`gemm-tune export`: a self-contained C/C++ bundle of a library's kernels for one arch.

    out/gemm_tuned.h          the C API: gemm_tuned_gemm_ex(...) (the layout of A and B,
                              C's type, a bias, an activation, a strided batch), the plain
                              gemm_tuned_sgemm / _hgemm / _bf16gemm(...) as thin wrappers,
                              gemm_tuned_kernel_name_ex(...) and the older name queries, and
                              a typed C++ wrapper, gemm_tuned::gemm
    out/gemm_tuned.cu         dispatch (the Python runtime's rule, without cuBLAS) over the
                              tuned entries, one table per input type and variant
    out/kernels/<name>.cu     each kernel's generated source plus a host launcher that
                              mirrors its family's runner (tuner/runtime/runners.py): the
                              same grid, arguments, batch strides, bias and, for a wgmma
                              kernel, TMA tensor maps (of rank 3 for a batched operand) built
                              with the driver's cuTensorMapEncodeTiled, fetched through
                              cudaGetDriverEntryPointByVersion so nothing links libcuda, and
                              a launch through cudaLaunchKernelEx with its cluster
    out/CMakeLists.txt        cmake -B build && cmake --build build
    out/Makefile              make   (libgemm_tuned.so and gemm_tuned_check)
    out/example.cu            gemm_tuned_check: every exported variant, its tuned shapes and
                              batches and a few odd ones, against cuBLAS plus an epilogue on
                              the host; one line per check and "N of N checks passed"

Exported: every entry of fp32, fp16 or bf16 inputs tuned for the chosen arch, of any
variant (layout, C's type, bias, activation) and batch, from any family, with the kernel
built for exactly that variant. Not exported: tf32 and 3xTF32 entries (the bundle has no
such request), and wgmma kernels with the tf32 pre-pass.
"""

from __future__ import annotations

import collections
from pathlib import Path

from codegen._io import atomic_write
from codegen.arch import parse_arch
from codegen.config import DType, config_from_name
from codegen.families._common import ACTIVATIONS, Variant
from codegen.occupancy import occupancy
from codegen.rendering import render_file
from tuner.runtime.dispatch import MAX_KERNEL_BATCH, REDUCE_LAUNCH_MS, describe
from tuner.runtime.errors import LibraryError
from tuner.runtime.library import Library
from tuner.runtime.manifest import entry_batch, entry_variant

__all__ = ["export", "EXPORTED"]

#: the input types a bundle serves, each with its plain entry point (row-major A and B,
#: fp32 C, no epilogue, one problem) and pointer type
EXPORTED = ((DType.F32, "gemm_tuned_sgemm", "float"),
            (DType.F16, "gemm_tuned_hgemm", "__half"),
            (DType.BF16, "gemm_tuned_bf16gemm", "__nv_bfloat16"))

#: cudaDataType_t of each element type (inputs, C, bias)
_CUDA_TYPE = {DType.F32: "CUDA_R_32F", DType.F16: "CUDA_R_16F", DType.BF16: "CUDA_R_16BF"}
#: CUtensorMapDataType of each element type a TMA map describes
_TMA_DTYPE = {DType.F32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
              DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
              DType.TF32: "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32"}
#: the header's names of the 16-bit types, which C spells as their bits (__half_raw ...)
_C_NAME = {DType.F16: "gemm_tuned_half_t", DType.BF16: "gemm_tuned_bf16_t"}
#: gemm_tuned.cu's code of each bias kind (Table.bias)
_BIAS_CODE = {"none": 0, "out": 1, "f32": 2}
#: the header's gemm_tuned_act_t, in the order of codegen's ACTIVATIONS
ACT_ENUM = {a: f"GEMM_TUNED_ACT_{a.upper()}" for a in ACTIVATIONS}


def _exportable(e: dict, inputs: set) -> bool:
    """Can the bundle serve this entry: an input type it has, and a kernel of that type
    built for exactly the entry's variant (as Manifest.serving asks), not a pre-pass one?"""
    if e["dtype"] not in inputs:
        return False
    cfg = config_from_name(e["kernel"])
    return (cfg.dtype.short == e["dtype"] and Variant.of(cfg) == entry_variant(e)
            and not getattr(cfg, "pre_pass", False))


def _kernel_values(cfg, res: dict, limits) -> dict:
    """What launcher.cu.j2 and the dispatch table need of one kernel."""
    smem = res["smem_static"] + res["smem_dynamic"]
    tma = hasattr(cfg, "tma_boxes")  # the wgmma family: A and B read through tensor maps
    need_a, need_b, need_c = cfg.aligned_operands
    v = dict(name=cfg.name, dtype=cfg.dtype.short, bm=cfg.bm, bn=cfg.bn, bk=cfg.bk,
             threads=cfg.threads, smem=cfg.smem_bytes, split=cfg.split, last=cfg.last,
             reduce_pass=cfg.reduce_pass, workspace=cfg.has_workspace, tma=tma,
             store=bool(need_c), needs=int(need_a) | int(need_b) << 1 | int(need_c) << 2,
             n_multiple=16 // cfg.out.size if need_c else 1,
             blocks_per_sm=occupancy(cfg.threads, res["registers"], smem, limits).blocks_per_sm,
             streamk=getattr(cfg, "streamk", 0))
    if tma:
        boxes = cfg.tma_boxes()
        # the maps describe A and B as stored: a column-major A is K x M, a column-major B
        # N x K (rows, cols), as TmaRunner's
        v.update(tma_dtype=_TMA_DTYPE[cfg.tma_dtype], es=cfg.tma_dtype.size,
                 a_dims=("K", "M") if cfg.a_col else ("M", "K"),
                 b_dims=("N", "K") if cfg.b_col else ("K", "N"),
                 a_box=boxes["A"], b_box=boxes["B"], cluster=cfg.cluster,
                 cluster_n=cfg.cluster_n, cluster_shape=cfg.cluster_shape,
                 persistent=cfg.persistent, streamk=cfg.streamk, c_box=boxes.get("C"),
                 c_tma_dtype=_TMA_DTYPE[cfg.out], c_es=cfg.out.size,
                 c_swizzle=f"CU_TENSOR_MAP_SWIZZLE_{cfg.c_row_bytes}B")
    return v


def _group(dtype: DType, variant: Variant, entries: list[dict], index: dict,
           gpus: list[str]) -> dict:
    """One dispatch table: the entries of an input type and variant, in manifest order (the
    order Python's rule meets them in)."""
    rows, first = [], {}
    for e in entries:
        first.setdefault(e["kernel"], len(rows))
        rows.append(dict(m=e["m"], n=e["n"], k=e["k"], batch=entry_batch(e),
                         kernel=index[e["kernel"]], first=first[e["kernel"]],
                         tflops=e["tflops"], gpu=gpus.index(e["gpu"])))
    plain = next((f for d, f, _ in EXPORTED if d is dtype), None) if variant.plain else None
    bias_t = variant.out if variant.bias == "out" else DType.F32
    return dict(dtype=dtype.short, cpp=dtype.cpp, a_t=_CUDA_TYPE[dtype],
                transa=int(variant.layout.value[0] == "t"),
                transb=int(variant.layout.value[1] == "t"), layout=variant.layout.value,
                out=variant.out.short, c_cpp=variant.out.cpp, c_t=_CUDA_TYPE[variant.out],
                bias=_BIAS_CODE[variant.bias], has_bias=variant.bias != "none",
                bias_cpp=bias_t.cpp, bias_t=_CUDA_TYPE[bias_t], act=variant.act,
                act_enum=ACT_ENUM[variant.act], what=describe(dtype, variant), plain=plain,
                entries=rows, kernels=sorted({e["kernel"] for e in entries}),
                cases=_cases(rows))


def _cases(rows: list[dict]) -> list[dict]:
    """What the check program runs for one table: every tuned shape and batch (fully
    aligned, beta 0, C poisoned), then odd shapes (beta 0.5 on some), a strided batch
    with B shared by its problems, and an lda no 16-byte rule allows."""
    def case(m, n, k, batch=1, shared_b=0, beta=0, odd_ld=0, tuned=0):
        return dict(m=m, n=n, k=k, batch=batch, shared_b=shared_b, beta=beta, odd_ld=odd_ld,
                    tuned=tuned)

    tuned = {(r["m"], r["n"], r["k"], r["batch"]) for r in rows}
    out = [case(*t, tuned=1) for t in sorted(tuned)]
    return out + [case(1, 1, 1), case(127, 129, 257, beta=1), case(1000, 1000, 1000),
                  case(16, 4096, 512, beta=1), case(127, 129, 257, 3, shared_b=1, beta=1),
                  case(64, 96, 128, 2), case(300, 264, 1000, odd_ld=1)]


def _entries(lib: Library, arch: str | None) -> tuple[list[dict], str]:
    """The exportable entries of the arch asked for (default: the one with most entries)."""
    inputs = {d.short for d, _, _ in EXPORTED}
    entries = [e for e in lib.manifest["entries"] if _exportable(e, inputs)]
    if not entries:
        raise LibraryError(f"the library at {lib.path} has no fp32, fp16 or bf16 entries to "
                           f"export")
    archs = collections.Counter(e["arch"] for e in entries)
    arch = parse_arch(arch).sm if arch else archs.most_common(1)[0][0]
    entries = [e for e in entries if e["arch"] == arch]
    if not entries:
        raise LibraryError(f"the library at {lib.path} has no entries for {arch} "
                           f"(it has {', '.join(sorted(archs))})")
    return entries, arch


def export(lib: Library, out: Path, arch: str | None = None) -> Path:
    """Write the bundle of `lib`'s kernels for `arch` into `out` (module doc); returns out.
    Raises LibraryError where the library has nothing to export for that arch."""
    entries, arch = _entries(lib, arch)
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
    index = {k["name"]: i for i, k in enumerate(kernels)}
    by_key = collections.defaultdict(list)
    for e in entries:
        by_key[(e["dtype"], entry_variant(e))].append(e)
    order = [d.short for d, _, _ in EXPORTED]
    gpus = sorted({e["gpu"] for e in entries})
    groups = [_group(DType.from_short(d), v, rows, index, gpus)
              for (d, v), rows in sorted(by_key.items(),
                                         key=lambda kv: (order.index(kv[0][0]), kv[0][1].key))]
    # wgmma (and any sm_XXa kernel) needs the architecture-specific target for the bundle
    target = f"{arch}a" if any(k["tma"] for k in kernels) else arch
    values = dict(arch=arch, target=target, cc=limits.cc, gpus=gpus,
                  kernels=kernels, groups=groups,
                  plain=[dict(entry=f, ptr_t=p, a_t=_CUDA_TYPE[d], c_ptr_t=_C_NAME.get(d, p))
                         for d, f, p in EXPORTED],
                  needs_driver=any(k["tma"] for k in kernels), mem_gbs=float(limits.mem_gbs),
                  reduce_launch_ms=REDUCE_LAUNCH_MS, max_batch=MAX_KERNEL_BATCH)
    for template, target_file in (("gemm_tuned.h.j2", "gemm_tuned.h"),
                                  ("gemm_tuned.cu.j2", "gemm_tuned.cu"),
                                  ("CMakeLists.txt.j2", "CMakeLists.txt"),
                                  ("Makefile.j2", "Makefile"), ("example.cu.j2", "example.cu")):
        atomic_write(out / target_file, render_file(f"export/{template}", **values))
    return out
