"""The search space: the union of the families a request searches, each family's own
space (codegen/families/<family>.py: SPACE, its suggest and its inverse), every point
built as the problem's variant (its layout, C's type, bias and activation:
codegen.families._common.Variant).

Which families a request searches depends on its dtype (and the GPU), and on the problem:
a family whose spec does not declare the variant (FamilySpec.layouts, .epilogue: what
codegen.check accepts) is left out: see `families`. Every family's runner launches strided
batches. Fixed categorical lists keep every Optuna trial on the same distributions
(TPE, random and grid samplers all work); combinations that cannot be built are rejected
by codegen.check and cost nothing but the check. With more than one family, a trial first
picks one ("family"), then asks that family's parameters, whose names are its own.
"""

from __future__ import annotations

from typing import Iterator

from codegen.arch import ArchLimits, parse_arch
from codegen.check import check
from codegen.config import DType
from codegen.families import FAMILIES, Config, FamilySpec, families_for, family_of
from codegen.families._common import Shape, Variant
from tuner.model import shape_reasons

__all__ = ["valid_wmma_configs", "families", "is_candidate", "params_of", "suggest",
           "space_size", "valid_configs", "Shape", "supports",
           "searched", "why_unsearched", "Only"]

PLAIN = Variant()

#: a restriction to some families by name (None: every family the request searches)
Only = frozenset[str] | None


def supports(spec: FamilySpec, variant: Variant) -> bool:
    """Does `spec`'s family build `variant`?"""
    return not spec.variant_reasons(variant)


def searched(dtype: DType, arch: ArchLimits | None = None,
             variant: Variant | None = None, only: Only = None) -> list[FamilySpec]:
    """The specs a request in `dtype` for `variant` (default: the plain one) searches (on
    `arch`, if given; of the families named in `only`, if given: a study of one family),
    in registration order."""
    variant = variant or PLAIN
    return [s for s in families_for(dtype, arch)
            if supports(s, variant) and (only is None or s.name in only)]


def why_unsearched(dtype: DType, variant: Variant | None = None,
                   arch: ArchLimits | None = None) -> str | None:
    """Why no family builds `variant` for `dtype` (on `arch`, if given): the reasons of
    each family that serves the input type; None when one does."""
    if searched(dtype, arch, variant):
        return None
    why = sorted({r for s in families_for(dtype, arch)
                  for r in s.variant_reasons(variant or PLAIN)})
    return "no family builds it (" + "; ".join(why) + ")" if why else \
        f"no family serves {dtype.short}"


def families(dtype: DType, arch: ArchLimits | None = None,
             variant: Variant | None = None) -> dict[str, DType]:
    """The candidate families for a request in `dtype`, by name (a Family member equals
    its name), each with its configs' dtype.

    fp32: CUDA cores only (FP32 FMAs). tf32 (fp32 data; `--dtype tf32` or
    `--allow-tf32`): also TF32 tensor cores. fp16 / bf16: tensor cores, and the CUDA-core
    family widening the inputs to fp32 on load. Of those, the ones that build `variant`.
    """
    return {spec.name: spec.dtypes[dtype] for spec in searched(dtype, arch, variant)}


def is_candidate(config: Config, dtype: DType, variant: Variant | None = None) -> bool:
    """Is `config` one of the configurations a request in `dtype` (for `variant`, if
    given) searches?"""
    spec = family_of(config)
    return (spec.serves(dtype) and spec.dtypes[dtype] is config.dtype
            and (variant is None or Variant.of(config) == variant))


def suggest(trial, dtype: DType = DType.F32, shape: Shape | None = None,
            arch: ArchLimits | None = None, variant: Variant | None = None,
            only: Only = None) -> Config:
    """Ask an Optuna trial for one point of the space (split-K only where it can help),
    built as `variant` (default: the plain one).

    With two families or more the trial first picks one ("family"); each family names its
    own parameters (the WMMA ones wmma_<name>), so each name keeps one distribution.
    """
    variant = variant or PLAIN
    specs = searched(dtype, arch, variant, only)
    if not specs:
        raise ValueError(f"no family builds {variant.key} for {dtype.short}")
    spec = specs[0]
    if len(specs) > 1:
        spec = FAMILIES[trial.suggest_categorical("family", tuple(s.name for s in specs))]
    return variant.apply(spec.suggest(trial, spec.dtypes[dtype], shape, arch))


def params_of(config: Config, dtype: DType, shape: Shape, arch: ArchLimits,
              only: Only = None) -> dict:
    """The trial parameters that make `suggest` (with the same `only`) return `config` (the
    grid's inverse; the variant is the config's own)."""
    spec = family_of(config)
    p = spec.params_of(config, shape, arch)
    many = len(searched(dtype, arch, Variant.of(config), only)) > 1
    return {"family": spec.name, **p} if many else p


def space_size(dtype: DType = DType.F32, variant: Variant | None = None) -> int:
    """Points in the space a request in `dtype` searches (before validation; split-K
    variants not counted)."""
    return sum(spec.space_size() for spec in searched(dtype, None, variant))


def valid_configs(arch: ArchLimits | str, dtype: DType = DType.F32,
                  shape: Shape | None = None,
                  variant: Variant | None = None, only: Only = None) -> Iterator[Config]:
    """Every point of the space that codegen.check accepts for `arch` (and, given a shape,
    that the shape rules keep, split-K variants included), built as `variant`, of the
    families in `only` (default: all searched), in grid order: family by family in
    registration order (the CUDA-core family first)."""
    arch = parse_arch(arch)
    variant = variant or PLAIN
    for spec in searched(dtype, arch, variant, only):
        for c in spec.valid_configs(arch, spec.dtypes[dtype], shape):
            if variant.plain:
                yield c
                continue
            cv = variant.apply(c)  # the variant may add reasons (a column-major A's vectors)
            if not check(cv, arch) and (shape is None or not shape_reasons(cv, shape, arch)):
                yield cv


def valid_wmma_configs(arch: ArchLimits | str, dtype: DType) -> Iterator[Config]:
    """Every point of the WMMA family's space that codegen.check accepts for `arch`, in
    grid order."""
    return FAMILIES["wmma"].valid_configs(parse_arch(arch), dtype, None)
