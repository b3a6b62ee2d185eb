"""`gemm-tune export` on the CPU: the C/C++ bundle of a library holding entries of several
variants (layout, C's type, bias, activation) and batches, from the SIMT, WMMA and wgmma
families, builds with nvcc; its header declares the API (C and C++ compile against it);
its dispatch agrees with the Python runtime's rule over every variant key, batch and
alignment; bad requests are refused with a status code, not launched."""

import ctypes
import itertools
import re
import subprocess
from pathlib import Path

import pytest

from _export_library import kernels, variant_library
from _library import BIG, SMALL
from codegen import DType
from codegen.config import config_from_name
from codegen.families._common import Variant
from tuner.cli import main
from tuner.runtime.dispatch import FULL_ALIGN, MAX_KERNEL_BATCH, describe
from tuner.runtime.export import ACT_ENUM
from tuner.runtime.manifest import entry_batch, entry_variant

CUDA_INCLUDE = "/usr/local/cuda/include"
#: cudaDataType_t values (library_types.h)
CUDA_TYPE = {"f32": 0, "f16": 2, "bf16": 14}
CUDA_R_8I = 3
#: cudaError_t values
INVALID_VALUE, NOT_SUPPORTED = 1, 801
#: the alignment masks asked (GEMM_TUNED_ALIGNED_*), as Python's alignment classes
MASKS = {7: FULL_ALIGN, 0: (4, 4, 4), 3: (16, 16, 4), 4: (4, 4, 16)}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, compile_cache):
    """(library, bundle directory, the built libgemm_tuned.so through ctypes)."""
    d = tmp_path_factory.mktemp("export")
    lib = variant_library(d / "library", compile_cache, d / "art")
    out = d / "bundle"
    assert main(["export", "--out", str(out), "--library", str(lib.path)]) == 0
    p = subprocess.run(["make", "-j2", "-C", str(out), "libgemm_tuned.so"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    cudart = sorted(Path("/usr/local/cuda/lib64").glob("libcudart.so*"))
    ctypes.CDLL(str(cudart[0]), mode=ctypes.RTLD_GLOBAL)
    so = ctypes.CDLL(str(out / "libgemm_tuned.so"))
    for f in ("gemm_tuned_kernel_name_ex", "gemm_tuned_kernel_name_on",
              "gemm_tuned_kernel_name_for"):
        getattr(so, f).restype = ctypes.c_char_p
    return lib, out, so


def _variants(lib) -> list[tuple[DType, Variant]]:
    return sorted({(DType.from_short(e["dtype"]), entry_variant(e))
                   for e in lib.manifest["entries"]}, key=lambda x: (x[0].short, x[1].key))


def python_choice(lib, dtype, v, m, n, k, batch, sms, align) -> str:
    """The Python runtime's rule among the library's kernels alone (the bundle has no cuBLAS
    rival): an exact entry where the operands are fully aligned, else the best estimate of
    a kernel that takes them; "" for none."""
    if batch > MAX_KERNEL_BATCH:
        return ""
    if align == FULL_ALIGN:
        for e in lib.store.serving(dtype, 90, v):
            if (e["m"], e["n"], e["k"], entry_batch(e)) == (m, n, k, batch):
                return e["kernel"]
    ranked = lib.ranked(m, n, k, dtype, 90, sms, v, align, batch)
    return ranked[0][1]["kernel"] if ranked else ""


def bundle_choice(so, dtype, v, m, n, k, batch, sms, mask) -> str:
    bias_type = CUDA_TYPE[v.out.short if v.bias == "out" else "f32"]
    return so.gemm_tuned_kernel_name_ex(
        int(v.layout.value[0] == "t"), int(v.layout.value[1] == "t"), m, n, k,
        CUDA_TYPE[dtype.short], CUDA_TYPE[v.out.short], int(v.bias != "none"), bias_type,
        list(ACT_ENUM).index(v.act), batch, sms, mask).decode()


def test_export_builds_with_nvcc(bundle):
    lib, out, _ = bundle
    names = {p.name for p in out.iterdir()}
    assert {"gemm_tuned.h", "gemm_tuned.cu", "CMakeLists.txt", "Makefile", "example.cu",
            "kernels", "libgemm_tuned.so"} <= names
    exported = {p.stem for p in (out / "kernels").glob("*.cu")}
    assert exported == {e["kernel"] for e in lib.manifest["entries"]}  # every variant's
    dispatch = (out / "gemm_tuned.cu").read_text()
    assert f"gemm_tuned_launch_{BIG.name}" in dispatch and "{ 4096, 4096, 4096, 1, " in dispatch
    assert "{ 512, 512, 512, 8, " in dispatch  # an entry's batch is part of its key
    assert (out / "libgemm_tuned.so").stat().st_size > 10000
    # each entry names the GPU model it was tuned on (the exact rule asks for the same
    # model, as Python's), and the header lists them
    gpus = sorted({e["gpu"] for e in lib.manifest["entries"]})
    assert "const char* const kGpus[] = {\n" + "".join(f'    "{g}",\n' for g in gpus) \
        + "};" in dispatch
    assert f"for sm_90 (tuned on {', '.join(gpus)})." in (out / "gemm_tuned.h").read_text()
    rows = re.findall(r"\{ (\d+), (\d+), (\d+), (\d+), \d+, \d+, [\d.e+]+, (\d+) \},", dispatch)
    assert len(rows) == len(lib.manifest["entries"])
    assert {int(r[4]) for r in rows} == set(range(len(gpus)))
    # a split-K reduce pass runs only after its main kernel launched
    reduce = next(k for k in lib.manifest["entries"] if config_from_name(k["kernel"]).reduce_pass)
    launcher = (out / "kernels" / f"{reduce['kernel']}.cu").read_text()
    main_at = launcher.index(f"    {reduce['kernel']}<<<grid")
    assert launcher.index("    e = cudaGetLastError();\n    if (e == cudaSuccess) {", main_at) \
        < launcher.index(f"{reduce['kernel']}_reduce<<<", main_at)
    # a cluster along N (A multicast) counts its tiles in pairs of columns, as tiles() does
    xn = kernels()["wgmma_ts_tt_f16_biasf32"][0]
    launcher = (out / "kernels" / f"{xn.name}.cu").read_text()
    assert xn.cluster_shape == (1, 2) and "(a cluster's blocks lie along N)" in launcher
    assert "const unsigned long long tiles = static_cast<unsigned long long>((tiles_m + 1 - 1) / 1)\n" \
           "        * ((tiles_n + 2 - 1) / 2) * batch;" in launcher
    # a map the driver will not build: NotSupported without an encoder, else InvalidValue
    assert launcher.count("        return map_error(r);") == 2  # A and B's, C's
    assert "return r == CUDA_ERROR_NOT_FOUND ? cudaErrorNotSupported : cudaErrorInvalidValue;" \
        in launcher
    # stream-K sizes its workspace by the grid it launches (the SMs, persistent)
    sk = kernels()["wgmma_nt_f16_streamk"][0]
    launcher = (out / "kernels" / f"{sk.name}.cu").read_text()
    assert "const size_t w_floats = static_cast<size_t>(clusters) * 2 * 128 * 128;" in launcher
    assert "tmA, tmB, tmC, M, N, K, alpha, beta, C, ldc,\n                               bias, batch, maps3, sC, W, tickets);" in launcher
    # the CUDA-core family's stream-K: a block in each of the GPU's block slots
    sk = kernels()["simt_streamk"][0]
    launcher = (out / "kernels" / f"{sk.name}.cu").read_text()
    slots = re.search(r"const dim3 grid\(static_cast<unsigned>\(sms \* (\d+)\), "
                      r"static_cast<unsigned>\(batch\), 1\);", launcher)
    assert slots and int(slots[1]) >= 1 and "sC, bias, W, tickets);" in launcher
    nm = subprocess.run(["nm", "-D", "--defined-only", str(out / "libgemm_tuned.so")],
                        capture_output=True, text=True).stdout
    for sym in ("gemm_tuned_gemm_ex", "gemm_tuned_kernel_name_ex", "gemm_tuned_sgemm",
                "gemm_tuned_hgemm", "gemm_tuned_bf16gemm", "gemm_tuned_kernel_name",
                "gemm_tuned_kernel_name_on", "gemm_tuned_kernel_name_for"):
        assert f" T {sym}\n" in nm, sym


def test_the_header_declares_the_variant_api(bundle):
    lib, out, _ = bundle
    h = " ".join((out / "gemm_tuned.h").read_text().split())
    for decl in (
        "typedef enum gemm_tuned_op { GEMM_TUNED_OP_N = 0, GEMM_TUNED_OP_T = 1 } gemm_tuned_op_t;",
        "GEMM_TUNED_ACT_NONE = 0, GEMM_TUNED_ACT_RELU = 1, // max(x, 0) GEMM_TUNED_ACT_GELU = 2,",
        "GEMM_TUNED_ACT_GELU_TANH = 3, // the tanh approximation (torch's approximate=\"tanh\") "
        "GEMM_TUNED_ACT_SILU = 4 // x * sigmoid(x) } gemm_tuned_act_t;",
        "cudaError_t gemm_tuned_gemm_ex(gemm_tuned_op_t transa, gemm_tuned_op_t transb, int M, "
        "int N, int K, float alpha, const void* A, cudaDataType_t Atype, int lda, long long "
        "strideA, const void* B, cudaDataType_t Btype, int ldb, long long strideB, float beta, "
        "void* C, cudaDataType_t Ctype, int ldc, long long strideC, const void* bias, "
        "cudaDataType_t bias_type, gemm_tuned_act_t act, int batch_count, cudaStream_t stream);",
        "const char* gemm_tuned_kernel_name_ex(gemm_tuned_op_t transa, gemm_tuned_op_t transb, "
        "int M, int N, int K, cudaDataType_t Atype, cudaDataType_t Ctype, int has_bias, "
        "cudaDataType_t bias_type, gemm_tuned_act_t act, int batch_count, int sms, int aligned);",
        # the plain entry points, source compatible (in C++ the typedefs are __half ...)
        "cudaError_t gemm_tuned_sgemm(int M, int N, int K, float alpha, const float* A, int lda, "
        "const float* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream);",
        "cudaError_t gemm_tuned_hgemm(int M, int N, int K, float alpha, const gemm_tuned_half_t* "
        "A, int lda, const gemm_tuned_half_t* B, int ldb, float beta, float* C, int ldc, "
        "cudaStream_t stream);",
        "typedef __half gemm_tuned_half_t; typedef __nv_bfloat16 gemm_tuned_bf16_t;",
        "const char* gemm_tuned_kernel_name_for(const char* dtype, int M, int N, int K, int sms, "
        "int aligned);",
        "cudaErrorNotSupported no exported kernel serves this input type and variant",
        "There is no cuBLAS fallback in this bundle",
        f"batch_count exceeds {MAX_KERNEL_BATCH}",
        "namespace gemm_tuned {",
    ):
        assert decl in h, decl
    # what the bundle serves, one line per variant with its tuned shapes and batches
    assert f"Exported ({len(_variants(lib))} variants;" in h
    assert ("// f16 nt, f16 C, bias + gelu: 512x512x512, 512x512x512 x 8, 128x128x256, "
            "1024x1024x1024 x 4, 2048x2048x2048, 16x4096x4096 //") in h
    assert ("// f16 nt, f16 C: 16x4096x4096, 64x1024x4096 x 3, 4096x4096x4096, 1x4096x4096 //"
            in h)
    assert "// f32 tn, bf16 C, fp32 bias + gelu_tanh: 256x384x512 //" in h


def test_c_and_cxx_programs_compile_against_the_header(bundle, tmp_path):
    """The header is C (the 16-bit types as their bits there) and C++ (the typed wrapper
    deduces the element types, with and without a bias)."""
    _, out, _ = bundle
    c = tmp_path / "use.c"
    c.write_text('#include "gemm_tuned.h"\n'
                 "cudaError_t f(const gemm_tuned_half_t* a, float* c) {\n"
                 "  gemm_tuned_hgemm(8, 8, 8, 1.0f, a, 8, a, 8, 0.0f, c, 8, 0);\n"
                 "  return gemm_tuned_gemm_ex(GEMM_TUNED_OP_N, GEMM_TUNED_OP_T, 8, 8, 8, 1.0f,"
                 " a, CUDA_R_16F, 8, 64, a, CUDA_R_16F, 8, 0, 0.0f, c, CUDA_R_32F, 8, 64, 0,"
                 " CUDA_R_32F, GEMM_TUNED_ACT_GELU, 2, 0);\n}\n")
    p = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only",
                        f"-I{out}", f"-I{CUDA_INCLUDE}", str(c)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    cxx = tmp_path / "use.cu"
    cxx.write_text('#include "gemm_tuned.h"\n'
                   "cudaError_t f(const __half* a, __half* c, const float* bias) {\n"
                   "  gemm_tuned_hgemm(8, 8, 8, 1.0f, a, 8, a, 8, 0.0f, nullptr, 8, 0);\n"
                   "  gemm_tuned::gemm(GEMM_TUNED_OP_N, GEMM_TUNED_OP_T, 8, 8, 8, 1.0f, a, 8, 0,"
                   " a, 8, 0, 0.0f, c, 8, 0, 1, 0);\n"
                   "  return gemm_tuned::gemm(GEMM_TUNED_OP_N, GEMM_TUNED_OP_T, 8, 8, 8, 1.0f, a,"
                   " 8, 64, a, 8, 0, 0.0f, c, 8, 64, 2, 0, bias, GEMM_TUNED_ACT_SILU);\n}\n")
    p = subprocess.run(["nvcc", "-std=c++17", "-c", "-o", str(tmp_path / "use.o"), f"-I{out}",
                        str(cxx)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_exported_dispatch_agrees_with_python(bundle):
    """The bundle's choice (split-K reduce model, batches and TMA alignment included) is
    the Python runtime's among the tuned kernels, for every exported variant, over shapes,
    batches, SM counts and operand alignments: asked of the built library on the host."""
    lib, _, so = bundle
    dims = (1, 127, 500, 4096)
    picked = set()
    for dtype, v in _variants(lib):
        mine = [e for e in lib.manifest["entries"]
                if e["dtype"] == dtype.short and entry_variant(e) == v]
        exact = {(e["m"], e["n"], e["k"], entry_batch(e)) for e in mine}
        shapes = set(itertools.product(dims, dims, (257, 4097), (1, 3, 8))) | exact | {
            (m, n, k, b + 1) for m, n, k, b in exact}
        for (m, n, k, batch), sms, mask in itertools.product(sorted(shapes), (108, 132),
                                                             MASKS):
            want = python_choice(lib, dtype, v, m, n, k, batch, sms, MASKS[mask])
            got = bundle_choice(so, dtype, v, m, n, k, batch, sms, mask)
            assert got == want, (dtype.short, v.key, (m, n, k, batch), sms, mask, got, want)
            picked.add(got)
    assert picked - {""} == {e["kernel"] for e in lib.manifest["entries"]}  # every kernel wins
    assert "" in picked  # TMA kernels alone and unaligned operands: none


def test_the_plain_queries_are_the_plain_variants(bundle):
    """gemm_tuned_kernel_name_on / _for answer for the plain variant as before: the fp32
    kernels' dispatch test from before variants (BIG, SMALL and the split-K kernels)."""
    lib, _, so = bundle
    plain = {e["kernel"] for e in lib.manifest["entries"]
             if e["dtype"] == "f32" and entry_variant(e).plain}
    assert plain == {BIG.name, SMALL.name} | {kernels()[k][0].name
                                              for k in ("split", "cluster", "last")}
    dims = (1, 16, 127, 129, 500, 1000, 4096, 8192)
    picked = set()
    for (m, n, k), sms in itertools.product(itertools.product(dims, dims, (257, 4096, 4097)),
                                            (108, 132)):
        exact = [e["kernel"] for e in lib.manifest["entries"] if (e["m"], e["n"], e["k"]) ==
                 (m, n, k) and e["dtype"] == "f32" and entry_variant(e).plain]
        want = exact[0] if exact else lib.ranked(m, n, k, DType.F32, 90, sms)[0][1]["kernel"]
        got = so.gemm_tuned_kernel_name_on(m, n, k, sms).decode()
        assert got == want, ((m, n, k), sms, got, want)
        assert so.gemm_tuned_kernel_name_for(b"f32", m, n, k, sms, 1).decode() == want
        picked.add(got)
    assert picked == plain
    # fp16: only the NT kernels of a bias + GELU and the TN one were tuned: nothing plain
    assert so.gemm_tuned_kernel_name_for(b"f16", 512, 512, 512, 132, 1) == b""
    assert so.gemm_tuned_kernel_name_for(b"f64", 512, 512, 512, 132, 1) == b""


@pytest.mark.parametrize("change,status", [
    (dict(M=0), INVALID_VALUE),
    (dict(lda=511), INVALID_VALUE),  # A is row-major M x K: lda >= K
    (dict(transa=1, lda=511), INVALID_VALUE),  # column-major: lda >= M = 512
    (dict(ldc=100), INVALID_VALUE),
    (dict(Btype=CUDA_TYPE["bf16"]), INVALID_VALUE),  # A and B of one type
    (dict(Atype=CUDA_R_8I, Btype=CUDA_R_8I), INVALID_VALUE),
    (dict(bias=16, bias_type=CUDA_TYPE["bf16"]), INVALID_VALUE),  # C's type or fp32
    (dict(act=7), INVALID_VALUE),
    (dict(transb=2), INVALID_VALUE),
    (dict(batch=0), INVALID_VALUE),
    (dict(batch=2, sC=512 * 512 - 1), INVALID_VALUE),  # the problems' C overlap
    (dict(batch=2, sA=-1, sC=512 * 512), INVALID_VALUE),
    (dict(A=0), INVALID_VALUE),
    (dict(M=2**31 - 4095, lda=4096, transa=0), INVALID_VALUE),  # past MAX_DIM: 32-bit tiles
    (dict(K=2**31 - 1, lda=2**31 - 1, ldb=2**31 - 1), INVALID_VALUE),
    (dict(transa=1, lda=512), NOT_SUPPORTED),  # f16 tn, f16 C, bias + gelu: none exported
    (dict(act=3), NOT_SUPPORTED),
    (dict(Ctype=CUDA_TYPE["f32"], bias_type=CUDA_TYPE["f32"]), NOT_SUPPORTED),
    (dict(batch=MAX_KERNEL_BATCH + 1, sC=512 * 512), NOT_SUPPORTED),
])
def test_bad_requests_get_a_status_and_launch_nothing(bundle, change, status):
    """Checked before any kernel is chosen, so no GPU is needed: the arguments a kernel
    cannot take (cudaErrorInvalidValue) and requests no exported kernel serves
    (cudaErrorNotSupported)."""
    _, _, so = bundle
    f16 = CUDA_TYPE["f16"]
    a = dict(transa=0, transb=1, M=512, N=512, K=512, alpha=1.0, A=16, Atype=f16, lda=512,
             sA=0, B=16, Btype=f16, ldb=512, sB=0, beta=0.0, C=16, Ctype=f16, ldc=512, sC=0,
             bias=16, bias_type=f16, act=2, batch=1, stream=0)  # f16 nt, f16 C, bias + gelu
    a.update(change)
    f = so.gemm_tuned_gemm_ex
    f.argtypes = [ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_longlong] \
        + [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_float,
           ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p,
           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    assert f(*a.values()) == status
    if status == NOT_SUPPORTED:  # and the query says so beforehand
        assert so.gemm_tuned_kernel_name_ex(a["transa"], a["transb"], 512, 512, 512, a["Atype"],
                                            a["Ctype"], 1, a["bias_type"], a["act"],
                                            a["batch"], 132, 7) == b""


def test_the_check_program_covers_every_variant(bundle):
    """gemm_tuned_check (run on a GPU: tests/test_gpu_export.py) has a block per exported
    variant, each tuned shape and batch among its cases, and prints the summary line."""
    lib, out, _ = bundle
    src = (out / "example.cu").read_text()
    for dtype, v in _variants(lib):
        assert f'{{  // {describe(dtype, v)}\n' in src
    for e in lib.manifest["entries"]:
        assert f"{{ {e['m']}, {e['n']}, {e['k']}, {entry_batch(e)}, 0, 0, 0, 1 }}" in src
    assert '"gemm_tuned_sgemm"' in src and '"gemm_tuned_bf16gemm"' not in src  # no plain bf16
    assert 'std::printf("%d of %d checks passed\\n", passed, total);' in src
    assert "cublasGemmStridedBatchedEx" in src


def test_the_check_program_compiles(bundle, tmp_path):
    """example.cu compiles with the bundle's flags: against cuBLAS's headers where they are
    installed, else against the declarations it uses (tests/fixtures/cublas_decls)."""
    _, out, _ = bundle
    decls = [] if Path(CUDA_INCLUDE, "cublas_v2.h").is_file() else [
        f"-I{Path(__file__).parent / 'fixtures' / 'cublas_decls'}"]
    p = subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                        "-Xcompiler", "-Wall", *decls, f"-I{out}", "-c", "-o",
                        str(tmp_path / "example.o"), str(out / "example.cu")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "warning" not in p.stderr, p.stderr[-3000:]
