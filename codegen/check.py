"""Validation: every reason a configuration cannot be built, as sentences with numbers.

Invalid is a result, not an exception: ``check`` returns an empty list for a
buildable configuration. Each family states its own rules (codegen/families/); the
template repeats the structural invariants as ``static_assert``s so that a hand-edited
artifact fails loudly.
"""

from __future__ import annotations

from codegen.arch import ArchLimits, parse_arch
from codegen.families import family_of
from codegen.families._common import MAX_STAGES, Variant, epilogue_reasons
from codegen.families.simt import CLUSTER_SPLITS, REDUCES, SPLITS, WARP_ARRANGEMENTS

__all__ = ["check", "MAX_STAGES", "SPLITS", "REDUCES", "CLUSTER_SPLITS", "WARP_ARRANGEMENTS"]


def check(config, arch: str | int | ArchLimits) -> list[str]:
    """Reasons `config` cannot be built for `arch`; empty when it can.

    Example:
        >>> from codegen.config import KernelConfig
        >>> check(KernelConfig(stages=3), "sm_75")
        ['cp.async stages (3) need sm_80 or newer; sm_75 has none']
    """
    spec = family_of(config)
    why = spec.check(config, parse_arch(arch)) + epilogue_reasons(config)
    why += spec.variant_reasons(Variant.of(config))
    return why
