"""gemm-tune's code generator: configurations, validation, rendering, compiling.

Pure Python plus nvcc; never creates a CUDA context.

Example:
    >>> from codegen import KernelConfig, check, render
    >>> cfg = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4)
    >>> check(cfg, "sm_90")
    []
    >>> "extern \\"C\\" __global__" in render(cfg)
    True
"""

import importlib

from codegen.arch import ARCHS, ArchLimits, parse_arch
from codegen.check import check
from codegen.config import DEFAULT_CONFIG, DType, Family, KernelConfig, Layout
from codegen.errors import GemmTuneError, ToolchainError, UsageError

#: the heavy half (jinja2, nvcc), imported on first use (PEP 562), so that the run path's
#: `import codegen.config` loads neither
_LAZY = {
    "CompileResult": "compile", "Resources": "compile",
    "compile_config": "compile", "compile_many": "compile", "parse_ptxas": "compile",
    "render": "rendering", "template_hash": "rendering",
}
__all__ = [
    "ARCHS", "ArchLimits", "parse_arch", "check", "DEFAULT_CONFIG", "DType", "Family",
    "KernelConfig", "Layout", "GemmTuneError", "ToolchainError", "UsageError", *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'codegen' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"codegen.{module}"), name)
    globals()[name] = value
    return value
