"""The search space: fixed categorical lists, one per KernelConfig parameter.

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
from codegen.check import check
from codegen.config import DType, KernelConfig, WmmaConfig

__all__ = ["SPACE", "WMMA_SPACE", "SPLITS", "wmma_from_params", "valid_wmma_configs", "config_from_params", "suggest", "space_size", "valid_configs",
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

Shape = tuple[int, int, int]


def config_from_params(params: dict, dtype: DType = DType.F32) -> KernelConfig:
    return KernelConfig(dtype=dtype, split=int(params.get("split", 1)),
                        **{k: int(params[k]) for k in SPACE})


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


def suggest(trial, dtype: DType = DType.F32, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> KernelConfig:
    """Ask an Optuna trial for one point of the space (split-K only where it can help)."""
    from tuner.model import wants_split

    params = {k: trial.suggest_categorical(k, v) for k, v in SPACE.items()}
    cfg = config_from_params(params, dtype)
    if shape is not None and arch is not None and wants_split(cfg, shape, arch):
        params["split"] = trial.suggest_categorical("split", SPLITS)
        cfg = config_from_params(params, dtype)
    return cfg


def space_size() -> int:
    n = 1
    for v in SPACE.values():
        n *= len(v)
    return n


def valid_configs(arch: ArchLimits | str, dtype: DType = DType.F32,
                  shape: Shape | None = None) -> Iterator[KernelConfig]:
    """Every point of the space that codegen.check accepts for `arch` (and, given a shape,
    that the shape rules keep, split-K variants included), in grid order."""
    from codegen.arch import parse_arch
    from tuner.model import shape_reasons, wants_split

    arch = parse_arch(arch)
    for vals in itertools.product(*SPACE.values()):
        c = config_from_params(dict(zip(SPACE, vals)), dtype)
        if check(c, arch):
            continue
        splits = SPLITS if shape is not None and wants_split(c, shape, arch) else (1,)
        for s in splits:
            cs = c if s == 1 else dataclasses.replace(c, split=s)
            if shape is None or not (check(cs, arch) or shape_reasons(cs, shape, arch)):
                yield cs
