"""GPU: fp16, bf16 and tf32 requests (the WMMA family and the CUDA-core family widening
fp16/bf16 on load) against float64 references, by the two-reference protocol of DESIGN.md:
the gate is against a float64 product of the inputs rounded to the input type (what the
kernel multiplies), and the error against the unrounded inputs is reported beside it.
Then the same requests through the tuner and the runtime library.
"""

import pytest

from codegen import DType
from codegen.config import KernelConfig, WmmaConfig

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 257), (4095, 4097, 1023)]
CONFIGS = {
    DType.F16: [WmmaConfig(), WmmaConfig(bm=64, bn=64, bk=32, wm=32, wn=32, stages=1, swizzle=1),
                WmmaConfig(bm=128, bn=256, bk=32, wm=64, wn=64, stages=4, vec=4),
                KernelConfig(dtype=DType.F16),
                KernelConfig(dtype=DType.F16, bm=64, bn=64, bk=16, rm=4, rn=4, stages=1,
                             split=4)],
    DType.BF16: [WmmaConfig(dtype=DType.BF16), WmmaConfig(dtype=DType.BF16, vec=2, skew=16),
                 KernelConfig(dtype=DType.BF16, bk=16, vec=2, swizzle=1)],
    DType.TF32: [WmmaConfig(dtype=DType.TF32, bk=16, vec=4, skew=4),
                 WmmaConfig(dtype=DType.TF32, bm=64, bn=128, bk=32, wm=32, wn=64, vec=2,
                            skew=8, stages=2)],
}


def _tf32(x):
    """Round float32 to tf32 (10 mantissa bits) to nearest, ties away, as cvt.rna.tf32.f32."""
    import torch

    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("dtype", list(CONFIGS), ids=lambda d: d.short)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wmma_matches_the_rounded_reference(dtype, shape, compile_cache):
    from pathlib import Path

    import torch

    from codegen import compile_config
    from tuner.bench import tolerance
    from tuner.gpu import device
    from tuner.runtime.runners import runner_for

    dev = device()  # its primary context current (torch's)
    m, n, k = shape
    a32 = torch.randn(m, k, device="cuda")
    b32 = torch.randn(k, n, device="cuda")
    if dtype is DType.TF32:
        a, b = a32, b32
        ar, br = _tf32(a32), _tf32(b32)
    else:
        tt = torch.float16 if dtype is DType.F16 else torch.bfloat16
        a, b = a32.to(tt), b32.to(tt)
        ar, br = a.float(), b.float()
    ref_rounded = ar.double() @ br.double()
    ref_exact = a32.double() @ b32.double()
    for cfg in CONFIGS[dtype]:
        res = compile_config(cfg, dev.sm, compile_cache)
        assert res.ok, res.error
        c = torch.full((m, n), float("nan"), device="cuda")
        run = runner_for(cfg, Path(res.cubin).read_bytes()).bind(dev, m, n, k, k, n, n)
        run(a.data_ptr(), b.data_ptr(), c.data_ptr(), 1.0, 0.0,
            torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        err = ((c.double() - ref_rounded).norm() / ref_rounded.norm()).item()
        err_exact = ((c.double() - ref_exact).norm() / ref_exact.norm()).item()
        print(f"{cfg.name} {shape}: {err:.2e} vs rounded inputs, {err_exact:.2e} vs exact")
        assert err <= tolerance(cfg, k), (cfg.name, shape, err)
        assert err_exact < 1e-2  # the inputs' own rounding: reported, not gated


def test_tune_fp16_and_tf32_end_to_end(tmp_path, capsys):
    import json
    import sys

    from tuner.cli import main

    art = tmp_path / "art"
    for argv, dtype in ((["--dtype", "fp16", "--shape", "1000x1000x1000"], "f16"),
                        (["--allow-tf32", "--shape", "512x512x512"], "tf32")):
        assert main(argv + ["--trials", "12", "--artifacts", str(art), "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        w = r["winner"]
        print(f"{dtype} {r['shape']}: {w['name']} {w['tflops']} TFLOP/s vs cuBLAS "
              f"{w['cublas_tflops']}; error {w['error']:.2e} (exact {w['error_exact']:.2e}); "
              f"{r['stats']}", file=sys.stderr)
        assert r["dtype"] == dtype and w["tflops"] > 0 and r["stats"]["timed"] >= 1
        assert w["error"] <= 1e-4 and w["error_exact"] < 1e-2


def test_library_runs_fp16_and_bf16_tensors(tmp_path, compile_cache):
    import torch

    from _library import entry
    from codegen import compile_config
    from tuner import load_library
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "lib")
    f16, b16 = WmmaConfig(), KernelConfig(dtype=DType.BF16)
    shapes = ((4096, 4096, 4096), (127, 129, 257), (1, 1, 1))
    for cfg in (f16, b16):
        res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
        cu = tmp_path / "art" / "sm_90" / f"{cfg.name}.cu"
        for shape in shapes:  # recorded faster than cuBLAS: the exact rule runs the kernel
            lib.add(entry(cfg, res, shape, 900.0, 700.0, dtype=cfg.dtype.short,
                          gpu=torch.cuda.get_device_name()), cu, res.cubin)
    lib = load_library(tmp_path / "lib")
    for tt, cfg in ((torch.float16, f16), (torch.bfloat16, b16)):
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda").to(tt)
            b = torch.randn(k, n, device="cuda").to(tt)
            c0 = torch.randn(m, n, device="cuda")
            c = c0.clone()
            assert lib.explain(m, n, k, cfg.dtype).startswith(cfg.name)
            assert lib.gemm(a, b, c, alpha=0.5, beta=2.0) is c
            ref = 0.5 * (a.double() @ b.double()) + 2.0 * c0.double()
            err = ((c.double() - ref).norm() / ref.norm()).item()
            assert err <= 1e-5, (tt, (m, n, k), err)
            out = lib.gemm(a, b)  # C allocated: float32, like A's kind
            assert out.dtype == torch.float32 and out.shape == (m, n)
    # fp32 data with TF32 allowed and no tf32 entry: cuBLAS with TF32
    a, b = torch.randn(300, 200, device="cuda"), torch.randn(200, 100, device="cuda")
    assert lib.explain(300, 100, 200, "tf32").startswith("cuBLAS")
    c = lib.gemm(a, b, allow_tf32=True)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 2e-3
