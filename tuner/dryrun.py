"""The dry run: sample the space, validate, compile in parallel, model. No GPU needed."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Callable

from codegen.arch import ArchLimits
from codegen.compile import compile_many
from codegen.config import DEFAULT_CONFIG, KernelConfig
from tuner.model import judge
from tuner.space import space_size, valid_configs

__all__ = ["DryRunRow", "DryRunReport", "dry_run"]


@dataclasses.dataclass
class DryRunRow:
    config: KernelConfig
    status: str  # "ok", "pruned" (by the model) or "compile failed"
    reason: str = ""
    registers: int | None = None
    smem: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    blocks_per_sm: int | None = None
    limiter: str = ""
    bound_tflops: float | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["config"] = self.config.name
        return d


@dataclasses.dataclass
class DryRunReport:
    shape: tuple[int, int, int]
    arch: str
    space: int
    valid: int
    rows: list[DryRunRow]
    artifacts: Path

    def to_dict(self) -> dict:
        return dict(shape=list(self.shape), arch=self.arch, space=self.space, valid=self.valid,
                    sampled=len(self.rows), artifacts=str(self.artifacts),
                    candidates=[r.to_dict() for r in self.rows])


def dry_run(
    shape: tuple[int, int, int],
    arch: ArchLimits,
    trials: int,
    seed: int | None,
    artifacts: Path,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DryRunReport:
    """Compile the default configuration and `trials - 1` others drawn from the valid space."""
    valid = list(valid_configs(arch, shape=shape))
    pool = [c for c in valid if c != DEFAULT_CONFIG]
    sample = random.Random(seed).sample(pool, min(max(trials - 1, 0), len(pool)))
    configs = [DEFAULT_CONFIG, *sample] if trials > 0 else []
    rows: dict[KernelConfig, DryRunRow] = {}
    done = 0
    for cfg, res in compile_many(configs, arch, jobs, cache_dir, artifacts):
        if not res.ok:
            rows[cfg] = DryRunRow(cfg, "compile failed", res.error.splitlines()[0][:200])
        else:
            v = judge(cfg, res.resources, shape, arch)
            f = v.figures
            rows[cfg] = DryRunRow(
                cfg, "pruned" if v.hopeless else "ok", v.reason, f["registers"], f["smem"],
                f["spill_bytes"], f["occupancy"], f["blocks_per_sm"], f["limiter"],
                f["bound_tflops"],
            )
        done += 1
        if progress:
            progress(done, len(configs))
    ordered = [rows[c] for c in configs]
    return DryRunReport(shape, arch.sm, space_size(), len(valid), ordered, Path(artifacts))
