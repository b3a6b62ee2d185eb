"""The dry run: sample the space, validate, compile in parallel, model. No GPU needed.
The rows come sorted by the model's predicted time (tuner.model.predict), fastest first."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Callable

from codegen.arch import ArchLimits
from codegen.compile import compile_many
from codegen.check import check
from codegen.config import DType
from codegen.families import Config
from codegen.families._common import Variant
from tuner._shape import epilogue_text
from tuner.model import judge, shape_reasons
from tuner.space import Only, searched, space_size, valid_configs

__all__ = ["DryRunRow", "DryRunReport", "dry_run"]


@dataclasses.dataclass
class DryRunRow:
    config: Config
    status: str  # "ok", "pruned" (by the model) or "compile failed"
    reason: str = ""
    registers: int | None = None
    smem: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    blocks_per_sm: int | None = None
    limiter: str = ""
    bound_tflops: float | None = None
    predicted_tflops: float | None = None  # tuner.model.predict: the table's order
    predicted_limiter: str = ""

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
    dtype: str = "f32"
    variant: Variant = Variant()
    batch: int = 1

    @property
    def problem(self) -> str:
        """The variant and batch in words: 'nt, C f16, bias+gelu, batch 8'."""
        v = self.variant
        return (f"{v.layout.value}, C {v.out.short}, {epilogue_text(v.bias, v.act)}"
                + (f", batch {self.batch}" if self.batch > 1 else ""))

    def to_dict(self) -> dict:
        v = self.variant
        return dict(shape=list(self.shape), dtype=self.dtype, layout=v.layout.value,
                    out=v.out.short, bias=v.bias, act=v.act, batch=self.batch,
                    arch=self.arch, space=self.space, valid=self.valid,
                    sampled=len(self.rows), artifacts=str(self.artifacts),
                    candidates=[r.to_dict() for r in self.rows])


def defaults(dtype: DType, arch: ArchLimits, variant: Variant | None = None,
             only: Only = None) -> list[Config]:
    """The recommended configuration of each family a request in `dtype` for `variant`
    (default: the plain one) searches (of those in `only`, if given), built as that
    variant."""
    variant = variant or Variant()
    out = [variant.apply(spec.default(spec.dtypes[dtype], variant))
           for spec in searched(dtype, arch, variant, only)]
    return [c for c in out if not check(c, arch)]


def dry_run(
    shape: tuple[int, int, int],
    arch: ArchLimits,
    trials: int,
    seed: int | None,
    artifacts: Path,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    dtype: DType = DType.F32,
    variant: Variant | None = None,
    batch: int = 1,
) -> DryRunReport:
    """Compile the default configuration of each family (where the shape's rules take it,
    as the search's first batch does) and others drawn from the valid space, `trials` in
    all, every one built as `variant` (default: the plain one) and modelled at a batch of
    `batch`."""
    variant = variant or Variant()
    valid = list(valid_configs(arch, dtype, shape, variant))
    first = [c for c in defaults(dtype, arch, variant)
             if not shape_reasons(c, shape, arch)][: max(trials, 0)]
    pool = [c for c in valid if c not in first]
    sample = random.Random(seed).sample(pool, min(max(trials - len(first), 0), len(pool)))
    configs = [*first, *sample]
    rows: dict[Config, DryRunRow] = {}
    done = 0
    for cfg, res in compile_many(configs, arch, jobs, cache_dir, artifacts):
        if not res.ok:
            rows[cfg] = DryRunRow(cfg, "compile failed", res.error.splitlines()[0][:200])
        else:
            v = judge(cfg, res.resources, shape, arch, batch=batch)
            f = v.figures
            rows[cfg] = DryRunRow(
                cfg, "pruned" if v.hopeless else "ok", v.reason, f["registers"], f["smem"],
                f["spill_bytes"], f["occupancy"], f["blocks_per_sm"], f["limiter"],
                f["bound_tflops"], f.get("predicted_tflops"), f.get("predicted_limiter", ""),
            )
        done += 1
        if progress:
            progress(done, len(configs))
    # fastest predicted first; pruned and failed ones after, in the order drawn
    ordered = sorted((rows[c] for c in configs),
                     key=lambda r: (r.status != "ok", -(r.predicted_tflops or 0.0)))
    return DryRunReport(shape, arch.sm, space_size(dtype, variant), len(valid), ordered,
                        Path(artifacts), dtype.short, variant, batch)
