"""The run path's errors, in one module (its floor's): what a caller of the library, or
the tuner timing through the same runners, catches. All derive from codegen's
:class:`GemmTuneError`; the ones a user can fix from :class:`UsageError` (the CLI prints
those in one line and exits with status 2)."""

from __future__ import annotations

import os

from codegen.errors import GemmTuneError, UsageError

__all__ = ["LibraryError", "NoGPUError", "DriverError", "Unsupported", "TmaUnsupported",
           "CublasError", "GemmTuneError", "UsageError", "env_flag"]


class LibraryError(UsageError):
    """A library that cannot be used as it is, or a call it cannot serve."""


class NoGPUError(UsageError):
    """No usable CUDA GPU, or no cuda-bindings (the '[cuda]' extra), on this machine."""


class DriverError(GemmTuneError, RuntimeError):
    """A CUDA driver call failed (a load, a launch, a copy): the tuner records the
    candidate as LAUNCH_FAILED."""


class Unsupported(GemmTuneError):
    """A kernel cannot take these operands: nothing is launched; the dispatch picks another
    kernel, the tuner records the candidate as REJECTED with the message."""


class TmaUnsupported(Unsupported):
    """The operands break a TMA rule (alignment, stride)."""


class CublasError(GemmTuneError):
    """A cuBLAS call failed."""


_ON, _OFF = ("1", "yes", "on", "true"), ("0", "no", "off", "false")


def env_flag(name: str, default: bool = True) -> bool:
    """An on/off environment variable (GEMM_TUNE_MEASURE, GEMM_TUNE_FAST): unset or empty
    is `default`; 1/yes/on/true and 0/no/off/false in any case; anything else is a
    LibraryError naming it (a typo must not leave measuring on in one rank of a job and
    off in the others)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in _ON or text in _OFF:
        return text in _ON
    raise LibraryError(f"{name}={os.environ[name]!r}: expected 0 or 1 (or no/yes, off/on, "
                       "false/true)")
