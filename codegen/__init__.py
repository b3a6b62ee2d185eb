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

from codegen.arch import ARCHS, ArchLimits, parse_arch
from codegen.check import check
from codegen.compile import (
    CompileResult, Resources, ToolchainError, compile_config, compile_many, parse_ptxas,
)
from codegen.config import DEFAULT_CONFIG, DType, Family, KernelConfig, Layout
from codegen.errors import GemmTuneError, UsageError
from codegen.render import render, template_hash

__all__ = [
    "ARCHS", "ArchLimits", "parse_arch", "check", "CompileResult", "Resources",
    "ToolchainError", "compile_config", "compile_many", "parse_ptxas", "DEFAULT_CONFIG",
    "DType", "Family", "KernelConfig", "Layout", "GemmTuneError", "UsageError", "render",
    "template_hash",
]
