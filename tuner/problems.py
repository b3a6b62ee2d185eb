"""A program's recorded problems (tuner/runtime/record.py's JSON lines) as a tuning plan:
lines of one problem merged (their calls and time summed, whatever process or run wrote
them), the costliest first, and what cannot be tuned yet said so.

Example:
    >>> plan = read_problems("problems.jsonl")          # doctest: +SKIP
    >>> [(p.dtype.short, p.shape, p.calls) for p in plan]  # doctest: +SKIP
    [('f16', (16, 4096, 4096), 1200), ...]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from codegen.config import DType, Layout
from codegen.errors import UsageError
from tuner._shape import format_shape, parse_shape

__all__ = ["Problem", "read_problems", "merge"]


@dataclasses.dataclass
class Problem:
    """One problem of a record file, its lines merged."""

    dtype: DType
    layout: Layout
    shape: tuple[int, int, int]
    calls: int = 0
    ms: float | None = None  # time the program spent in it, where the decisions knew it
    gpus: set = dataclasses.field(default_factory=set)
    lines: int = 0

    @property
    def flops(self) -> float:
        return 2.0 * self.shape[0] * self.shape[1] * self.shape[2] * self.calls

    @property
    def label(self) -> str:
        return f"{format_shape(self.shape)} {self.dtype.short} {self.layout.value}"

    def why_not(self) -> str | None:
        """Why the tuner cannot take this problem yet (None: it can)."""
        if self.layout is not Layout.NN:
            return (f"layout {self.layout.value}: no family's template reads it yet "
                    "(cuBLAS serves it)")
        return None


def _parse(line: str, where: str) -> tuple[tuple, dict]:
    try:
        d = json.loads(line)
        dtype = DType.from_short(d["dtype"]) or DType.parse(d["dtype"])
        layout = Layout(d.get("layout", "nn"))
        shape = parse_shape(f"{d['m']}x{d['n']}x{d['k']}")
        calls = int(d.get("calls", 1))
    except (ValueError, KeyError, TypeError, UsageError) as e:
        raise UsageError(f"{where}: not a recorded problem ({e})") from None
    if calls < 0:
        raise UsageError(f"{where}: calls must be at least 0 (got {calls})")
    return (dtype, layout, shape), dict(calls=calls, ms=d.get("ms"), gpu=d.get("gpu"))


def merge(lines, source: str = "problems") -> list[Problem]:
    """Problems of JSON lines (blank lines and # comments skipped), one per dtype, layout
    and shape, costliest first: by recorded time where every line knew it, else by the
    floating-point work of their calls."""
    found: dict[tuple, Problem] = {}
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, d = _parse(text, f"{source}, line {no}")
        p = found.setdefault(key, Problem(*key, ms=0.0))
        p.calls += d["calls"]
        p.ms = None if p.ms is None or d["ms"] is None else p.ms + float(d["ms"])
        p.lines += 1
        if d["gpu"]:
            p.gpus.add(d["gpu"])
    problems = list(found.values())
    if problems and all(p.ms is not None for p in problems):
        return sorted(problems, key=lambda p: (-p.ms, -p.flops))
    return sorted(problems, key=lambda p: -p.flops)


def read_problems(path: str | Path) -> list[Problem]:
    """The problems of a record file (merged and ordered); UsageError naming the file and
    line for anything unreadable."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--problems {path}: cannot read it ({e})") from None
    problems = merge(text.splitlines(), f"--problems {path}")
    if not problems:
        raise UsageError(f"--problems {path} names no problem")
    return problems
