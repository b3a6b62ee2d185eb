"""GPU: what the tuner times is what the library ships. A candidate of each family (split-K,
a cluster kernel, the TMA-store epilogue and the tf32 pre-pass among them) is timed through
the tuner's GpuBenchmark; the same cubin is then served by a library as an exact entry, and
both must have launched it through the same runner class and written bit-identical C on
the same operands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from codegen import DType, compile_config
from codegen.config import config_from_name
from codegen.families.simt import KernelConfig
from codegen.families.wgmma import DEFAULT_WGMMA
from codegen.families.wmma import DEFAULT_WMMA

pytestmark = pytest.mark.gpu

SHAPE = (520, 392, 264)  # no tile divides it; rows of 16-byte multiples (TMA's rule)
CONFIGS = [
    KernelConfig(),                                                           # SIMT fp32
    config_from_name("gemm_simt_f32_128x128x16_r4x8_w16x2_p4_v4_s2_g1_k4"),    # split-K, a pass
    DEFAULT_WMMA,                                                             # WMMA fp16
    DEFAULT_WGMMA,                                                            # wgmma fp16
    config_from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x2_p1_g8"),            # a 2-block cluster
    config_from_name("gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_ts"),          # TMA-store epilogue
    config_from_name("gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre"),        # tf32 pre-pass
]


def _torch_operand(torch, host: np.ndarray, dtype: DType):
    """The problem's stored operand (bf16 as its uint16 bits) as a CUDA tensor, same bits."""
    if dtype is DType.BF16:
        return torch.from_numpy(host.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(host)).cuda()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_the_tuner_and_the_library_launch_through_one_runner(cfg, tmp_path, compile_cache,
                                                             monkeypatch):
    torch = pytest.importorskip("torch")
    import tuner.bench as tb
    from tuner.outcome import Outcome
    from tuner.runtime import runners
    from tuner.runtime.library import Library

    res = compile_config(cfg, "sm_90", compile_cache)
    assert res.ok, res.error
    used = []

    def recording_runner_for(config, cubin):
        r = runners.runner_for(config, cubin)
        used.append(type(r))
        return r

    monkeypatch.setattr(tb, "runner_for", recording_runner_for)
    request = DType.TF32 if cfg.dtype is DType.TF32 else cfg.dtype
    bench = tb.GpuBenchmark(SHAPE, request, seed=None, target_ms=2)
    m = bench.measure(cfg, res.cubin)
    assert m.outcome is Outcome.TIMED, m.message
    p = bench.problem
    tuned_c = p.c.get()[:, : p.n]  # the last timed launch's output

    dev = bench.dev
    lib = Library.create_or_open(tmp_path / "library")
    meta = Path(res.cubin).with_suffix(".json")
    source = tmp_path / f"{cfg.name}.cu"
    source.write_text(res.source)
    lib.add(dict(gpu=dev.name, cc=dev.cc, arch=dev.sm, dtype=request.short, layout="nn",
                 m=p.m, n=p.n, k=p.k, kernel=cfg.name, tflops=1.0, cublas_tflops=0.5,
                 ratio=2.0, resources=res.resources.to_dict()), source, res.cubin,
            meta if meta.is_file() else None)
    lib = Library.load(tmp_path / "library")  # hashes and configs verified
    a, b = (_torch_operand(torch, x.get(), cfg.dtype) for x in (p.a, p.b))
    c = torch.full((p.m, p.n), float("nan"), device="cuda")
    lib.gemm(a, b, c, allow_tf32=request is DType.TF32)
    torch.cuda.synchronize()
    plan = next(iter(lib.plans.values()))
    assert plan.choice.kernel == cfg.name and plan.choice.rule == "exact"
    assert used == [type(lib.runner(cfg.name, dev.sm))] == [runners.runner_class(cfg)]
    assert np.array_equal(c.cpu().numpy(), tuned_c), \
        f"the library's C differs from the tuner's in {np.sum(c.cpu().numpy() != tuned_c)} places"

