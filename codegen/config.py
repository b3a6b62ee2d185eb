"""Kernel configurations: frozen dataclasses whose procedural name is their identity.

Each family's config lives in its own module under codegen/families/ (with its check,
search space and template values); this module gathers the names the rest of gemm-tune
imports, and dispatches names and dicts to the family that owns them.
"""

from __future__ import annotations

from codegen.families import Family, config_from_dict, config_from_name
from codegen.families._common import DType, Layout
from codegen.families.simt import DEFAULT_CONFIG, KernelConfig
from codegen.families.wmma import DEFAULT_WMMA, WmmaConfig

__all__ = ["DType", "Family", "Layout", "KernelConfig", "WmmaConfig", "DEFAULT_CONFIG",
           "DEFAULT_WMMA", "config_from_name", "config_from_dict"]
