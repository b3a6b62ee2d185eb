"""A library of real compiled kernels of several variants and batches, for the export tests
(CPU: the bundle builds and dispatches as Python does; GPU: its check program passes).

Beside the plain fp32 entries of _library.build (BIG, SMALL), it holds:
  - fp16 NT, fp16 C, bias + GELU: a SIMT kernel and a wgmma one (TMA: it needs 16-byte
    aligned operands), tuned at batch 1, 4 and 8;
  - plain fp32 SIMT kernels with split-K by a reduce pass, within a cluster and by the last
    block (the kernels of the plain dispatch test from before variants);
  - fp32 NN, bias + ReLU: SIMT kernels without split-K, with a reduce pass and by the last
    block, tuned at batches 2 and 3 (a workspace and tile tickets per problem);
  - fp32 TN, bf16 C, fp32 bias + tanh-GELU (SIMT); bf16 TT, fp32 C, SiLU (SIMT, batch 4);
  - fp32 TT, ReLU, SIMT stream-K (a block in each of the GPU's block slots);
  - bf16 NT, bf16 C, bias + GELU (WMMA);
  - bf16 NN, bf16 C, SiLU through the TMA-store epilogue (C's map in bf16, swizzled 64B;
    N a multiple of 8), and fp16 TT, fp16 C, fp32 bias through it with a cluster of 2
    along N (A multicast: half of each M-major box's K rows a block);
  - fp16 TN (plain epilogue) with a cluster of 2: column-major A as TMA boxes of M;
  - fp16 NT, fp16 C, wgmma split-K summed by the last slice (batch 1 and 3), and stream-K
    with the TMA-store epilogue;
  - decode kernels: fp16 NT, fp16 C, bias + GELU, split-K across a cluster of 4 (its
    shape compiled in), and fp16 NT, fp16 C, split-K by the last block, at one row.
"""

import dataclasses
from pathlib import Path

from _library import SMALL, build, entry
from codegen import KernelConfig, compile_many
from codegen.config import DEFAULT_WMMA, DType, Layout
from codegen.families.decode import DecodeConfig
from codegen.families.wgmma import WgmmaConfig

_W128 = WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s4_x2_p1_g8")


def kernels() -> dict:
    """name -> (config, [(shape, batch, TFLOP/s)]) of the kernels added (batch None: an
    entry written as before batches were)."""
    relu = dict(bias="out", act="relu")
    nt16 = dict(dtype=DType.F16, layout=Layout.NT, out=DType.F16, bias="out", act="gelu")
    return {
        "simt_nt_f16_bias_gelu": (dataclasses.replace(SMALL, stages=2, **nt16), [
            ((512, 512, 512), 1, 20.0), ((512, 512, 512), 8, 21.0), ((128, 128, 256), 1, 15.0)]),
        "wgmma_nt_f16_bias_gelu": (
            WgmmaConfig.from_name("gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_nt_of16_bias_gelu"),
            [((1024, 1024, 1024), 4, 480.0), ((2048, 2048, 2048), 1, 560.0)]),
        # plain fp32 split-K, by a reduce pass, within a cluster and by the last block
        "split": (KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=3, split=16),
                  [((127, 129, 4097), None, 6.6)]),
        "cluster": (KernelConfig(bm=32, bn=64, bk=16, rm=4, rn=4, wt=8, stages=3, split=8,
                                 reduce="cluster"), [((16, 4096, 4096), None, 4.0)]),
        "last": (KernelConfig(bm=16, bn=32, bk=16, rm=4, rn=4, wt=4, stages=2, split=32,
                              reduce="last"), [((129, 127, 4097), None, 7.0)]),
        # stream-K on CUDA cores: the GPU's block slots, two partial tiles a block
        "simt_streamk": (KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, streamk=1,
                                      layout=Layout.TT, act="relu"),
                         [((640, 1280, 512), None, 15.0)]),
        # the same with a bias and ReLU, tuned at batches: workspaces per problem
        "simt_nn_f32_bias_relu": (dataclasses.replace(SMALL, **relu), [
            ((512, 512, 512), 1, 12.0), ((256, 256, 256), 2, 9.5)]),
        "split_bias_relu": (KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=3, split=16,
                                         **relu), [((127, 129, 4097), 2, 6.0)]),
        "last_bias_relu": (KernelConfig(bm=16, bn=32, bk=16, rm=4, rn=4, wt=4, stages=2,
                                        split=32, reduce="last", **relu),
                           [((129, 127, 4097), 3, 7.0)]),
        "simt_tn_f32_obf16_biasf32_gelut": (
            dataclasses.replace(SMALL, layout=Layout.TN, out=DType.BF16, bias="f32",
                                act="gelu_tanh"), [((256, 384, 512), 1, 9.0)]),
        "simt_tt_bf16_silu": (dataclasses.replace(SMALL, stages=2, dtype=DType.BF16,
                                                  layout=Layout.TT, act="silu"),
                              [((1000, 1000, 1000), 4, 30.0)]),
        "wmma_nt_bf16_bias_gelu": (
            dataclasses.replace(DEFAULT_WMMA, dtype=DType.BF16, layout=Layout.NT, out=DType.BF16,
                                bias="out", act="gelu"), [((1000, 1000, 1000), 1, 200.0)]),
        "wgmma_ts_bf16_silu": (
            WgmmaConfig.from_name("gemm_wgmma_bf16_128x256x64_c2_s4_x1_p1_g8_ts_obf16_silu"),
            [((2048, 2048, 2048), 1, 600.0), ((512, 512, 512), 2, 300.0)]),
        "wgmma_ts_tt_f16_biasf32": (
            dataclasses.replace(_W128, layout=Layout.TT, store=1, out=DType.F16, bias="f32",
                                cluster_n=1),
            [((1024, 1024, 1024), 2, 450.0)]),
        "wgmma_tn_f16": (dataclasses.replace(_W128, layout=Layout.TN),
                         [((2048, 2048, 2048), 1, 590.0)]),
        # split-K by the last slice: a workspace and tile tickets per problem
        "wgmma_nt_f16_split": (
            WgmmaConfig.from_name("gemm_wgmma_f16_64x128x64_c1_s6_x1_p1_g1_k4l_nt_of16"),
            [((16, 4096, 4096), 1, 40.0), ((64, 1024, 4096), 3, 30.0)]),
        # stream-K (TMA stores): two partial tiles a block of the grid, sized at run time
        "wgmma_nt_f16_streamk": (
            WgmmaConfig.from_name("gemm_wgmma_f16_128x128x64_c2_s4_x1_p1_g8_ts_sk_nt_of16"),
            [((4096, 4096, 4096), 1, 600.0)]),
        # the decode family: split-K across a cluster, and by the last block
        "decode_nt_f16_bias_gelu_cluster": (
            DecodeConfig(mt=16, bn=64, wk=4, wn=2, split=4, reduce="cluster", **nt16),
            [((16, 4096, 4096), 1, 60.0)]),
        "decode_nt_f16_last": (
            DecodeConfig(math="fma", mt=1, bn=32, wk=8, wn=1, split=2, reduce="last",
                         dtype=DType.F16, layout=Layout.NT, out=DType.F16),
            [((1, 4096, 4096), 1, 2.0)]),
    }


def variant_library(path: Path, cache_dir: Path, artifacts: Path, gpu: str = "NVIDIA H200"):
    """_library.build's plain library plus the kernels above (each entry at 1.1x cuBLAS)."""
    from tuner.runtime.library import load_library

    lib = build(path, cache_dir, artifacts)
    built = dict(compile_many([cfg for cfg, _ in kernels().values()], "sm_90",
                              cache_dir=cache_dir, artifacts_dir=artifacts))  # in parallel
    for cfg, rows in kernels().values():
        res = built[cfg]
        assert res.ok, res.error
        cu = next(artifacts.glob(f"*/{cfg.name}.cu"))
        for shape, batch, tflops in rows:
            lib.add(entry(cfg, res, shape, tflops, tflops / 1.1, dtype=cfg.dtype.short,
                          gpu=gpu, batch=batch), cu, res.cubin)
    return load_library(path)
