"""A synthetic library made of real compiled kernels (for CPU tests of the library)."""

from pathlib import Path

from codegen import KernelConfig, compile_config

BIG = KernelConfig(bm=256, bn=128, bk=16, rm=8, rn=8, wt=16, pad=0, vec=4, stages=2, swizzle=1)
SMALL = KernelConfig(bm=32, bn=64, bk=16, rm=4, rn=4, wt=4, pad=0, vec=4, stages=3, swizzle=1)


def entry(cfg, res, shape, tflops, cublas, cc=90, dtype="f32", gpu="NVIDIA H200", batch=None):
    """A library entry of `cfg` tuned at `shape` (and `batch`: the field is left out when
    None, as entries from before batches were written)."""
    m, n, k = shape
    timing = dict(median_ms=2 * m * n * k / tflops / 1e9, p10_ms=1.0, p90_ms=1.2, min_ms=0.9,
                  max_ms=1.3, reps=20)
    variant = {} if (cfg.out.short, cfg.bias, cfg.act) == ("f32", "none", "none") else dict(
        out=cfg.out.short, bias=cfg.bias, act=cfg.act)  # the plain one as older entries
    if batch is not None:
        variant["batch"] = batch
    return dict(gpu=gpu, cc=cc, arch=f"sm_{cc}", cuda="13.0", template_hash="0" * 16,
                dtype=dtype, layout=cfg.layout.value, **variant, m=m, n=n, k=k,
                kernel=cfg.name, tflops=tflops,
                timing=timing, cublas_tflops=cublas, cublas_timing=timing,
                ratio=tflops / cublas, error=1e-6, resources=res.resources.to_dict(),
                occupancy=0.25, limiter="registers", date="2026-11-30T17:00:00+00:00",
                stats=dict(compiled=150, timed=136, pruned=14),
                top=[dict(rank=1, kernel=cfg.name, tflops=tflops, pct_cublas=100 * tflops / cublas,
                          registers=res.resources.registers, smem=res.resources.smem,
                          occupancy=0.25, limiter="registers")])


def build(path: Path, cache_dir: Path, artifacts: Path):
    from tuner.runtime.library import Library

    lib = Library.create_or_open(path)
    for cfg, shape, tflops, cublas in ((BIG, (4096, 4096, 4096), 46.1, 51.3),
                                       (SMALL, (512, 512, 512), 12.8, 15.0)):
        res = compile_config(cfg, "sm_90", cache_dir, artifacts)
        assert res.ok, res.error
        cu = artifacts / "sm_90" / f"{cfg.name}.cu"
        lib.add(entry(cfg, res, shape, tflops, cublas), cu, res.cubin, cu.with_suffix(".json"))
    return lib
