"""Outcomes of one candidate: data, not crashes (no GPU needed to use these types)."""

from __future__ import annotations

import dataclasses
import enum
import statistics

__all__ = ["Outcome", "Timing", "Measurement"]


class Outcome(str, enum.Enum):
    REJECTED = "rejected"  # codegen.check said why
    COMPILE_FAILED = "compile failed"  # with the compiler's message
    PRUNED = "pruned"  # by the model, with its figures
    LAUNCH_FAILED = "launch failed"
    WRONG_RESULT = "wrong result"  # with the error
    TIMED = "timed"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Distribution of one kernel's time over repetitions, in milliseconds."""

    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    def quantile(self, q: float) -> float:
        xs = sorted(self.times_ms)
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    def tflops(self, flops: float) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12

    def to_dict(self) -> dict:
        return dict(median_ms=self.median_ms, p10_ms=self.quantile(0.1),
                    p90_ms=self.quantile(0.9), min_ms=min(self.times_ms),
                    max_ms=max(self.times_ms), reps=len(self.times_ms))


@dataclasses.dataclass(frozen=True)
class Measurement:
    outcome: Outcome
    timing: Timing | None = None
    error: float | None = None  # ||C - ref|| / ||ref||, ref on the inputs as given
    error_exact: float | None = None  # against the inputs before rounding to their type
    message: str = ""
