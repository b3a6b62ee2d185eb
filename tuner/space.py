"""The search space: the union of the families a request searches, each family's own
space (codegen/families/<family>.py: SPACE, its suggest and its inverse).

Which families a request searches depends on its dtype (and the GPU): see `families`.
Fixed categorical lists keep every Optuna trial on the same distributions (TPE, random
and grid samplers all work); combinations that cannot be built are rejected by
codegen.check and cost nothing but the check. With more than one family, a trial first
picks one ("family"), then asks that family's parameters, whose names are its own.
"""

from __future__ import annotations

from typing import Iterator

from codegen.arch import ArchLimits, parse_arch
from codegen.config import DType
from codegen.families import FAMILIES, Config, families_for, family_of
from codegen.families._common import Shape

__all__ = ["valid_wmma_configs", "families", "is_candidate", "params_of", "suggest",
           "space_size", "valid_configs", "Shape"]


def families(dtype: DType, arch: ArchLimits | None = None) -> dict[str, DType]:
    """The candidate families for a request in `dtype`, by name (a Family member equals
    its name), each with its configs' dtype.

    fp32: CUDA cores only (FP32 FMAs). tf32 (fp32 data; `--dtype tf32` or
    `--allow-tf32`): also TF32 tensor cores. fp16 / bf16: tensor cores, and the CUDA-core
    family widening the inputs to fp32 on load.
    """
    return {spec.name: spec.dtypes[dtype] for spec in families_for(dtype, arch)}


def is_candidate(config: Config, dtype: DType) -> bool:
    """Is `config` one of the configurations a request in `dtype` searches?"""
    spec = family_of(config)
    return spec.serves(dtype) and spec.dtypes[dtype] is config.dtype


def suggest(trial, dtype: DType = DType.F32, shape: Shape | None = None,
            arch: ArchLimits | None = None) -> Config:
    """Ask an Optuna trial for one point of the space (split-K only where it can help).

    With two families or more the trial first picks one ("family"); each family names its
    own parameters (the WMMA ones wmma_<name>), so each name keeps one distribution.
    """
    specs = families_for(dtype, arch)
    spec = specs[0]
    if len(specs) > 1:
        spec = FAMILIES[trial.suggest_categorical("family", tuple(s.name for s in specs))]
    return spec.suggest(trial, spec.dtypes[dtype], shape, arch)


def params_of(config: Config, dtype: DType, shape: Shape, arch: ArchLimits) -> dict:
    """The trial parameters that make `suggest` return `config` (the grid's inverse)."""
    spec = family_of(config)
    p = spec.params_of(config, shape, arch)
    return {"family": spec.name, **p} if len(families_for(dtype, arch)) > 1 else p


def space_size(dtype: DType = DType.F32) -> int:
    """Points in the space a request in `dtype` searches (before validation; split-K
    variants not counted)."""
    return sum(spec.space_size() for spec in families_for(dtype))


def valid_configs(arch: ArchLimits | str, dtype: DType = DType.F32,
                  shape: Shape | None = None) -> Iterator[Config]:
    """Every point of the space that codegen.check accepts for `arch` (and, given a shape,
    that the shape rules keep, split-K variants included), in grid order: family by
    family in registration order (the CUDA-core family first)."""
    arch = parse_arch(arch)
    for spec in families_for(dtype, arch):
        yield from spec.valid_configs(arch, spec.dtypes[dtype], shape)


def valid_wmma_configs(arch: ArchLimits | str, dtype: DType) -> Iterator[Config]:
    """Every point of the WMMA family's space that codegen.check accepts for `arch`, in
    grid order."""
    return FAMILIES["wmma"].valid_configs(parse_arch(arch), dtype, None)
