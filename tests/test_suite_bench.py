"""bench/suite.py on the CPU: the kernel it times beside cuBLAS for each shape of the suite,
from the committed library, and the rule it names."""

import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import suite  # noqa: E402


def test_every_shape_gets_a_kernel_and_says_where_cublas_runs():
    from codegen import parse_arch
    from tuner import load_library
    from tuner._shape import parse_shape
    from codegen.config import DType, Layout
    from codegen.families._common import Variant
    from tuner.runtime.manifest import entry_batch, entry_variant

    lib = load_library(ROOT / "artifacts" / "library")
    gpus = {e["gpu"] for e in lib.manifest["entries"]}
    assert gpus == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}  # the committed library's models
    dev = SimpleNamespace(cc=90, arch=parse_arch("sm_90"), name="NVIDIA H200")
    plain = Variant(Layout.NN, DType.F32)  # the suite's problem: NN, fp32 C, no epilogue
    exact = {(e["m"], e["n"], e["k"]): e["kernel"] for e in lib.manifest["entries"]
             if e["dtype"] == "f32" and entry_variant(e) == plain and entry_batch(e) == 1
             and e["gpu"] == dev.name}
    ran_cublas = 0
    for s in suite.SHAPES:
        m, n, k = parse_shape(s)
        kernel, rule = suite._kernel(lib, dev, m, n, k)
        choice = lib.select(m, n, k, cc=90, sms=dev.arch.sm_count, gpu=dev.name)
        assert kernel is not None and kernel.startswith("gemm_"), s
        if choice.kernel is not None:  # what the library runs, as it says
            assert (kernel, rule) == (choice.kernel, choice.rule), s
        elif (m, n, k) in exact:  # cuBLAS runs: the kernel tuned at this shape
            ran_cublas += 1
            assert (kernel, rule) == (exact[m, n, k], "cuBLAS runs; the exact entry's kernel"), s
        else:
            ran_cublas += 1
            assert rule == "cuBLAS runs; the best estimate", s
    assert ran_cublas  # the committed library loses some of the suite to cuBLAS


def test_an_exact_entry_is_the_gpu_models_own():
    """An H100 and an H200 are both sm_90 with 132 SMs: on the H100 the suite times the H100's
    own tune of a shape, not the H200's entry for it (which the suite once timed instead)."""
    import copy

    from codegen import parse_arch
    from tuner import load_library
    from tuner.runtime.manifest import entry_batch, entry_variant

    lib = load_library(ROOT / "artifacts" / "library")
    h200 = next(e for e in lib.manifest["entries"] if e["dtype"] == "f32"
                and (e["m"], e["n"], e["k"]) == (128, 4096, 4096))
    other = next(e["kernel"] for e in lib.manifest["entries"] if e["dtype"] == "f32"
                 and entry_variant(e) == entry_variant(h200) and entry_batch(e) == 1
                 and e["kernel"] != h200["kernel"])
    h100 = copy.deepcopy(h200) | dict(gpu="NVIDIA H100 80GB HBM3", kernel=other)
    lib.manifest["entries"].append(h100)
    arch = parse_arch("sm_90")
    for name, want in (("NVIDIA H200", h200["kernel"]), (h100["gpu"], other)):
        dev = SimpleNamespace(cc=90, arch=arch, name=name)
        assert suite._kernel(lib, dev, 128, 4096, 4096) == (
            want, "cuBLAS runs; the exact entry's kernel"), name
