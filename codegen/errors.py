"""The root of gemm-tune's exceptions.

Expected outcomes of a candidate (rejected, compile failed, pruned, wrong
result) are data, never exceptions. Exceptions are for programmer errors and
for user mistakes the CLI turns into one line and exit status 2.
"""


class GemmTuneError(Exception):
    """Base class of every exception gemm-tune raises on purpose."""


class UsageError(GemmTuneError):
    """A mistake the user can fix: a malformed shape, an unknown dtype, a corrupt file."""


class ToolchainError(GemmTuneError):
    """nvcc is missing or unusable."""
