"""A program's recorded problems (tuner/runtime/record.py's JSON lines) as a tuning plan:
lines of one problem merged (their calls and time summed, whatever process or run wrote
them), the costliest first, and what cannot be tuned said so.

Problems that differ only in M merge by M-bucket (tuner.runtime.dispatch.MBuckets: the
library's buckets, GEMM_TUNE_M_BUCKETS or `gemm-tune --m-buckets`): one problem per
bucket, tuned at the bucket's largest M. That is where the library's first use measures a
bucket (with its smallest M), and a kernel takes every M of its bucket, so the entry
competes for each M the program called; "exact" buckets tune each M apart.

A line names its problem by dtype, layout, out (C's type), epilogue ("none", "relu",
"bias", "bias+gelu", "biasf32+silu": tuner._shape.epilogue_text), batch (and, optionally,
broadcast_b: one B shared by the batch), m, n, k; a line without layout, out, epilogue or
batch (an older record) reads as nn, fp32 C, none, 1. Its align, gpu, calls and ms are
the call's alignment, the GPU, the calls counted and the time spent.

Example:
    >>> plan = read_problems("problems.jsonl")          # doctest: +SKIP
    >>> [(p.task.label, p.calls) for p in plan]          # doctest: +SKIP
    [('16x4096x4096 f16 nt C f16 bias+gelu', 1200), ...]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from codegen.config import DType, Layout
from codegen.errors import UsageError
from codegen.families._common import Variant, quantity, whole
from tuner._shape import Task, parse_batch, parse_epilogue, parse_layout, parse_out, parse_shape

__all__ = ["Problem", "read_problems", "merge"]


@dataclasses.dataclass
class Problem:
    """One problem of a record file, its lines merged."""

    task: Task
    calls: int = 0
    ms: float | None = None  # time the program spent in it, where the decisions knew it
    gpus: set = dataclasses.field(default_factory=set)
    lines: int = 0
    recorded_m: set = dataclasses.field(default_factory=set)  # the Ms the program called

    @property
    def dtype(self) -> DType:
        return self.task.dtype

    @property
    def layout(self) -> Layout:
        return self.task.variant.layout

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.task.shape

    @property
    def flops(self) -> float:
        return self.task.flops * self.calls

    @property
    def label(self) -> str:
        """The task's label, and the Ms recorded where the bucket's M is not one of them
        only: '64x4096x4096 f16 nn C f16 (M 40, 48 recorded)'."""
        ms = sorted(self.recorded_m)
        if ms == [self.shape[0]] or not ms:
            return self.task.label
        return f"{self.task.label} (M {', '.join(map(str, ms))} recorded)"

    def why_not(self, arch=None) -> str | None:
        """Why the tuner cannot take this problem (None: it can): no family that serves
        its input type builds its variant or runs its batch (on `arch`, if given)."""
        from tuner.space import why_unsearched

        t = self.task
        why = why_unsearched(t.dtype, t.variant, arch)
        return None if why is None else f"{why}: cuBLAS serves it"


def _parse(line: str, where: str) -> tuple[Task, dict]:
    try:
        d = json.loads(line)
        dtype = DType.from_short(d["dtype"]) or DType.parse(d["dtype"])
        layout = parse_layout(d.get("layout", "nn"))
        out = parse_out(d.get("out", "f32"))
        bias, act = parse_epilogue(d.get("epilogue", "none"), out)
        batch = parse_batch(d.get("batch", 1))
        shape = parse_shape(f"{d['m']}x{d['n']}x{d['k']}")
        calls, ms, gpu = d.get("calls", 1), d.get("ms"), d.get("gpu")
        broadcast = bool(d.get("broadcast_b", False)) and batch > 1
    except KeyError as e:
        raise UsageError(f"{where}: not a recorded problem (no {e.args[0]!r} field)") from None
    except (ValueError, TypeError, AttributeError, UsageError, RecursionError) as e:
        raise UsageError(f"{where}: not a recorded problem ({str(e)[:200]})") from None
    if not whole(calls, 0):
        raise UsageError(f"{where}: calls must be at least 0, a whole number (got {calls!r:.40})")
    if ms is not None and not quantity(ms):
        raise UsageError(f"{where}: ms must be milliseconds, at least 0 (got {ms!r:.40})")
    if gpu is not None and not isinstance(gpu, str):
        raise UsageError(f"{where}: gpu must name a GPU (got {gpu!r:.40})")
    task = Task(dtype, shape, Variant(layout, out, bias, act), batch, broadcast)
    return task, dict(calls=calls, ms=ms, gpu=gpu)


def merge(lines, source: str = "problems", buckets=None) -> list[Problem]:
    """Problems of JSON lines (blank lines and # comments skipped), one per task (dtype,
    shape, variant, batch), costliest first: by recorded time where every line knew it,
    else by the floating-point work of their calls. With `buckets` (an MBuckets), a task's
    M is its M-bucket's largest (module doc); without, each M is its own."""
    found: dict[Task, Problem] = {}
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        task, d = _parse(text, f"{source}, line {no}")
        m, n, k = task.shape
        if buckets is not None:
            task = dataclasses.replace(task, shape=(buckets.of(m)[1], n, k))
        p = found.setdefault(task, Problem(task, ms=0.0))
        p.recorded_m.add(m)
        p.calls += d["calls"]
        p.ms = None if p.ms is None or d["ms"] is None else p.ms + float(d["ms"])
        p.lines += 1
        if d["gpu"]:
            p.gpus.add(d["gpu"])
    problems = list(found.values())
    if problems and all(p.ms is not None for p in problems):
        return sorted(problems, key=lambda p: (-p.ms, -p.flops))
    return sorted(problems, key=lambda p: -p.flops)


def read_problems(path: str | Path, buckets=None) -> list[Problem]:
    """The problems of a record file (merged, by M-bucket with `buckets`, and ordered);
    UsageError naming the file and line for anything unreadable."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--problems {path}: cannot read it ({e})") from None
    problems = merge(text.splitlines(), f"--problems {path}", buckets)
    if not problems:
        raise UsageError(f"--problems {path} names no problem")
    return problems
