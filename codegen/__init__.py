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

#: public name -> the module that defines it, imported on first use (PEP 562), so that
#: `import codegen.config` (the run path's floor) loads neither jinja2 nor the compiler
_EXPORTS = {
    "ARCHS": "arch", "ArchLimits": "arch", "parse_arch": "arch", "check": "check",
    "CompileResult": "compile", "Resources": "compile", "ToolchainError": "compile",
    "compile_config": "compile", "compile_many": "compile", "parse_ptxas": "compile",
    "DEFAULT_CONFIG": "config", "DType": "config", "Family": "config",
    "KernelConfig": "config", "Layout": "config", "GemmTuneError": "errors",
    "UsageError": "errors", "render": "render", "template_hash": "render",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'codegen' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"codegen.{module}"), name)
    globals()[name] = value
    return value
