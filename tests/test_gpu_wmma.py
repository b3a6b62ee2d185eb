"""GPU: the WMMA family against float64 references, by the two-reference protocol of
DESIGN.md: the gate is against a float64 product of the inputs rounded to the input type
(what the tensor cores multiply; FP32 accumulation leaves ~1e-6), and the error against
the unrounded inputs is reported beside it.
"""

import pytest

from codegen import DType
from codegen.config import WmmaConfig

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 257), (4095, 4097, 1023)]
CONFIGS = {
    DType.F16: [WmmaConfig(), WmmaConfig(bm=64, bn=64, bk=32, wm=32, wn=32, stages=1, swizzle=1),
                WmmaConfig(bm=128, bn=256, bk=32, wm=64, wn=64, stages=4, vec=4)],
    DType.BF16: [WmmaConfig(dtype=DType.BF16), WmmaConfig(dtype=DType.BF16, vec=2, skew=16)],
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
    import torch

    from codegen import compile_config
    from tuner.bench import TOLERANCE
    from tuner.gpu import Kernel, _drv, device

    dev = device()
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
        Kernel(cfg, res.cubin)(m, n, k, 1.0, a.data_ptr(), k, b.data_ptr(), n, 0.0,
                               c.data_ptr(), n)
        _drv().Context.synchronize()
        err = ((c.double() - ref_rounded).norm() / ref_rounded.norm()).item()
        err_exact = ((c.double() - ref_exact).norm() / ref_exact.norm()).item()
        print(f"{cfg.name} {shape}: {err:.2e} vs rounded inputs, {err_exact:.2e} vs exact")
        assert err <= TOLERANCE[dtype], (cfg.name, shape, err)
