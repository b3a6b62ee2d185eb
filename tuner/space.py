"""The search space: fixed categorical lists, one per parameter of each family
(SPACE for the CUDA-core KernelConfig, WMMA_SPACE for the tensor-core WmmaConfig; which
families a request searches depends on its dtype, see `families`).

Fixed lists keep every Optuna trial on the same distributions (TPE, random and
grid samplers all work); combinations that cannot be built are rejected by
codegen.check and cost nothing but the check. The space is narrower than what
codegen can build: values that rarely win on a real GPU (narrower global
vectors, which help only where a leading dimension is 2 mod 4; BK=32; a padding
that breaks 16-byte shared reads) stay buildable and tested, but are not
searched, which keeps the valid space small enough (2736 on sm_90) for an
exhaustive grid run to finish in minutes.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from codegen.arch import ArchLimits
from codegen.check import CLUSTER_SPLITS, check
from codegen.config import DType, Family, KernelConfig, WmmaConfig

__all__ = ["SPACE", "WMMA_SPACE", "SPLITS", "wmma_from_params", "valid_wmma_configs",
           "families", "is_candidate", "params_of", "config_from_params", "suggest", "space_size", "valid_configs",
           "Shape"]

SPACE: dict[str, tuple[int, ...]] = {
    "bm": (16, 32, 64, 128, 256),
    "bn": (32, 64, 128, 256),
    "bk": (8, 16),
    "rm": (2, 4, 8),
    "rn": (4, 8),
    "wt": (2, 4, 8, 16),
    "pad": (0, 4),
    "vec": (4,),  # the kernel falls back to scalar at run time where 4 is not allowed
    "stages": (1, 2, 3, 4),
    "swizzle": (1, 8),
}

#: The tensor-core (WMMA) family: tiles in elements; skew and vector width in bytes
#: (16 B rows for wmma's ldm; 16-byte copies), turned into elements per input type.
WMMA_SPACE: dict[str, tuple[int, ...]] = {
    "bm": (64, 128, 256),
    "bn": (64, 128, 256),
    "bk": (16, 32, 64),
    "wm": (32, 64),
    "wn": (32, 64),
    "skew_bytes": (16, 32),
    "stages": (2, 3, 4),
    "swizzle": (1, 8),
}

#: Split-K, a conditional parameter: asked for only where the tiles of C leave SMs idle.
SPLITS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
#: How split-K sums its slices ("split_reduce"): asked for only where a cluster can hold the
#: split (sm_90 or newer). The "last" reduction (codegen.check.REDUCES) stays buildable and
#: tested but is not searched: it lost to the pass on every shape measured (bench/NOTES.md).
SPLIT_REDUCES: tuple[str, ...] = ("pass", "cluster")

Shape = tuple[int, int, int]


def config_from_params(params: dict, dtype: DType = DType.F32) -> KernelConfig:
    return KernelConfig(dtype=dtype, split=int(params.get("split", 1)),
                        reduce=params.get("split_reduce", "pass"),
                        **{k: int(params[k]) for k in SPACE})


def _reduces(split: int, arch: ArchLimits) -> tuple[str, ...]:
    """The split-K reductions searched for a split of `split` slices on `arch`."""
    return SPLIT_REDUCES if split in CLUSTER_SPLITS and arch.cc >= 90 else ("pass",)


def wmma_from_params(params: dict, dtype: DType) -> WmmaConfig:
    es = dtype.size
    return WmmaConfig(dtype=dtype, skew=int(params["skew_bytes"]) // es, vec=16 // es,
                      **{k: int(params[k]) for k in WMMA_SPACE if k != "skew_bytes"})


def valid_wmma_configs(arch: ArchLimits | str, dtype: DType) -> Iterator[WmmaConfig]:
    """Every point of WMMA_SPACE that codegen.check accepts for `arch`, in grid order."""
    from codegen.arch import parse_arch

    arch = parse_arch(arch)
    for vals in itertools.product(*WMMA_SPACE.values()):
        c = wmma_from_params(dict(zip(WMMA_SPACE, vals)), dtype)
        if not check(c, arch):
            yield c


def families(dtype: DType) -> dict[Family, DType]:
    """The candidate families for a request in `dtype`, each with its configs' dtype.

    fp32: CUDA cores only (FP32 FMAs). tf32 (fp32 data; `--dtype tf32` or
    `--allow-tf32`): also TF32 tensor cores. fp16 / bf16: tensor cores, and the CUDA-core
    family widening the inputs to fp32 on load.
    """
    if dtype is DType.F32:
        return {Family.SIMT: DType.F32}
    return {Family.SIMT: DType.F32 if dtype is DType.TF32 else dtype, Family.WMMA: dtype}


def is_candidate(config, dtype: DType) -> bool:
    """Is `config` one of the configurations a request in `dtype` searches?"""
    return families(dtype).get(config.family) is config.dtype


#: fp16 / bf16 inputs on CUDA cores are widened on their way through registers, so that
#: variant takes stages 1-2 only: a parameter of its own, so no ask is wasted on 3-4.
WIDENED_STAGES = (1, 2)


def _simt_param(name: str, widened: bool) -> str:
    return "widened_stages" if widened and name == "stages" else name


def _simt_values(name: str, widened: bool) -> tuple[int, ...]:
    return WIDENED_STAGES if widened and name == "stages" else SPACE[name]


def suggest(trial, dtype: DType = DType.F32, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> KernelConfig | WmmaConfig:
    """Ask an Optuna trial for one point of the space (split-K only where it can help).

    With two families the trial first picks one ("family"); the WMMA parameters are
    named wmma_<name>, so each parameter name keeps one distribution in the study.
    """
    from tuner.model import wants_split

    fams = families(dtype)
    family = Family.SIMT
    if len(fams) > 1:
        family = Family(trial.suggest_categorical("family", tuple(f.value for f in fams)))
    if family is Family.WMMA:
        return wmma_from_params({k: trial.suggest_categorical(f"wmma_{k}", v)
                                 for k, v in WMMA_SPACE.items()}, fams[family])
    widened = fams[family] is not DType.F32  # register-staged only: its own stages list
    params = {k: trial.suggest_categorical(_simt_param(k, widened), _simt_values(k, widened))
              for k in SPACE}
    cfg = config_from_params(params, fams[family])
    if shape is not None and arch is not None and wants_split(cfg, shape, arch):
        params["split"] = trial.suggest_categorical("split", SPLITS)
        if len(_reduces(params["split"], arch)) > 1:
            params["split_reduce"] = trial.suggest_categorical("split_reduce", SPLIT_REDUCES)
        cfg = config_from_params(params, fams[family])
    return cfg


def params_of(config: KernelConfig | WmmaConfig, dtype: DType, shape: Shape,
              arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config` (the grid's inverse)."""
    from tuner.model import wants_split

    multi = len(families(dtype)) > 1
    if isinstance(config, WmmaConfig):
        p = {f"wmma_{k}": getattr(config, k) for k in WMMA_SPACE if k != "skew_bytes"}
        p["wmma_skew_bytes"] = config.skew * config.elem
        return {"family": Family.WMMA.value, **p}
    widened = config.dtype is not DType.F32
    p = {_simt_param(k, widened): getattr(config, k) for k in SPACE}
    if wants_split(config, shape, arch):
        p["split"] = config.split
        if len(_reduces(config.split, arch)) > 1:
            p["split_reduce"] = config.reduce
    return {"family": Family.SIMT.value, **p} if multi else p


def space_size(dtype: DType = DType.F32) -> int:
    """Points in the space a request in `dtype` searches (before validation; split-K
    variants not counted)."""
    n = 1
    for v in SPACE.values():
        n *= len(v)
    if Family.WMMA in families(dtype):
        w = 1
        for v in WMMA_SPACE.values():
            w *= len(v)
        n += w
    return n


def valid_configs(arch: ArchLimits | str, dtype: DType = DType.F32,
                  shape: Shape | None = None) -> Iterator[KernelConfig | WmmaConfig]:
    """Every point of the space that codegen.check accepts for `arch` (and, given a shape,
    that the shape rules keep, split-K variants included), in grid order: the CUDA-core
    family first, then (for tf32, fp16, bf16) the WMMA family."""
    from codegen.arch import parse_arch
    from tuner.model import shape_reasons, wants_split

    arch = parse_arch(arch)
    fams = families(dtype)
    for vals in itertools.product(*SPACE.values()):
        c = config_from_params(dict(zip(SPACE, vals)), fams[Family.SIMT])
        if check(c, arch):
            continue
        splits = SPLITS if shape is not None and wants_split(c, shape, arch) else (1,)
        for s, r in ((s, r) for s in splits for r in _reduces(s, arch)):
            cs = c if s == 1 else dataclasses.replace(c, split=s, reduce=r)
            if shape is None or not (check(cs, arch) or shape_reasons(cs, shape, arch)):
                yield cs
    if Family.WMMA in fams:
        yield from valid_wmma_configs(arch, fams[Family.WMMA])
