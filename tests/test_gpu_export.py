"""GPU: the export bundle of a library with entries of many variants and batches (SIMT, WMMA
and wgmma kernels: tests/_export_library.py) builds with make, and its check program
passes: every exported variant through every entry point, on its tuned shapes and batches
and on odd ones, against cuBLAS plus the epilogue on the host, C poisoned first, fresh
random inputs each run."""

import re
import subprocess

import pytest

from _export_library import variant_library
from tuner.runtime.manifest import entry_batch, entry_variant

pytestmark = pytest.mark.gpu

#: the cases of a variant besides its tuned shapes (tuner/runtime/export.py, _cases)
OTHER_CASES = 7


def test_the_bundle_check_passes_for_every_variant_and_batch(tmp_path, compile_cache):
    import torch

    from tuner.cli import main

    lib = variant_library(tmp_path / "library", compile_cache, tmp_path / "art",
                          gpu=torch.cuda.get_device_name())
    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out), "--library", str(lib.path)]) == 0
    p = subprocess.run(["make", "-j8", "-C", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run = subprocess.run([str(out / "gemm_tuned_check")], capture_output=True, text=True,
                         timeout=900)
    print(run.stdout)
    lines = run.stdout.splitlines()
    summary = re.fullmatch(r"(\d+) of (\d+) checks passed", lines[-1])
    assert summary, run.stdout[-3000:] + run.stderr[-2000:]
    tuned = {}
    for e in lib.manifest["entries"]:
        tuned.setdefault((e["dtype"], entry_variant(e)), set()).add(
            (e["m"], e["n"], e["k"], entry_batch(e)))
    want = sum(len(shapes) + OTHER_CASES for shapes in tuned.values())
    assert summary.groups() == (str(want), str(want)), [ln for ln in lines if "FAIL" in ln]
    assert run.returncode == 0
    checks = lines[:-1]
    assert len(checks) == want and all(ln.rstrip().endswith("ok") for ln in checks)
    # every kernel ran and was checked (at its tuned shapes, at least)
    for name in {e["kernel"] for e in lib.manifest["entries"]}:
        assert any(name in ln and " err " in ln for ln in checks), name
    # batches ran, B shared by a batch too, and each entry point was used
    assert any(" x8 " in ln and " err " in ln for ln in checks)
    assert any("(B shared)" in ln and " err " in ln for ln in checks)
    for via in ("gemm_tuned_sgemm", "gemm_tuned_gemm_ex", "gemm_tuned::gemm"):
        assert any(f" {via} " in ln for ln in checks), via
    # a request TMA cannot take, where only wgmma kernels serve its variant: refused
    assert any(ln.startswith("bf16 nn, bf16 C, silu") and "refused" in ln for ln in checks)
