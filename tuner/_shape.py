"""Parsing and checking problem shapes given by the user."""

from __future__ import annotations

import re
from pathlib import Path

from codegen.config import DType
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


def fp32_mode(dtype: DType, args) -> DType:
    """The request's dtype with --allow-tf32 / --allow-3xtf32 applied (fp32 data only)."""
    if args.allow_tf32 and args.allow_3xtf32:
        raise UsageError("--allow-tf32 and --allow-3xtf32 exclude each other")
    for flag, mode in (("allow_tf32", DType.TF32), ("allow_3xtf32", DType.F32X3)):
        if getattr(args, flag):
            if dtype not in (DType.F32, mode):
                raise UsageError(f"--{flag.replace('_', '-')} is for fp32 data, not "
                                 f"--dtype {args.dtype}")
            return mode
    return dtype


def shapes_file(path: Path | None) -> list:
    if path is None:
        return []
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--shapes {path}: cannot read it ({e})") from None
    out = []
    for no, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            try:
                out.append(parse_shape(text))
            except UsageError as e:
                raise UsageError(f"--shapes {path}, line {no}: {e}") from None
    if not out:
        raise UsageError(f"--shapes {path} names no shape")
    return out
