"""The tuner's errors, in one module (its floor's): failures of the search's machinery that
are not a candidate's fault. Each is a UsageError or GemmTuneError, so the CLI prints one
line for it; a candidate's own failures are outcomes (tuner.outcome), never exceptions.
The run path's errors are in tuner.runtime.errors, codegen's in codegen.errors."""

from __future__ import annotations

from codegen.errors import GemmTuneError, UsageError

__all__ = ["WorkerError", "StorageError", "ProfileError"]


class WorkerError(GemmTuneError):
    """The worker could not start (no GPU, no memory), or cuBLAS failed in it: not a
    candidate's fault; the CLI reports it in one line."""


class StorageError(UsageError):
    """The study's storage could not be reached (after retrying); one line names it."""


class ProfileError(UsageError):
    """ncu is missing, may not read the counters, or profiled nothing."""
