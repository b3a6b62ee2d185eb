"""Parsing and checking problem shapes given by the user."""

from __future__ import annotations

import re

from codegen.errors import UsageError

INT32_MAX = 2**31 - 1
_SHAPE_RE = re.compile(r"^\s*(-?\d+)\s*[xX*,]\s*(-?\d+)\s*[xX*,]\s*(-?\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int, int]:
    """'4096x4096x4096' -> (4096, 4096, 4096); UsageError for anything else.

    Sizes must be >= 1 and, with their products into the leading dimensions,
    fit the kernels' 32-bit indices.
    """
    m = _SHAPE_RE.match(str(text))
    if not m:
        raise UsageError(f"shape must be MxNxK, e.g. 4096x4096x4096 (got {text!r})")
    dims = tuple(int(g) for g in m.groups())
    for label, v in zip("MNK", dims):
        if v < 1:
            raise UsageError(f"{label} must be at least 1 (got {v} in {text!r})")
        if v > INT32_MAX:
            raise UsageError(f"{label}={v} exceeds the largest supported size {INT32_MAX}")
    return dims  # type: ignore[return-value]


def problem_bytes(shape: tuple[int, int, int], elem: int = 4) -> int:
    m, n, k = shape
    return (m * k + k * n + m * n) * elem


def format_shape(shape: tuple[int, int, int]) -> str:
    return "x".join(str(v) for v in shape)
