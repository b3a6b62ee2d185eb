"""The model that prunes compiled candidates before they reach the GPU.

A candidate is hopeless, and never timed, when
  1. it spills registers to local memory (spill stores or loads > 0 bytes), or
  2. no block fits on an SM (occupancy model: 0 blocks per SM), or
  3. its *bound* is below the best time already measured.

The bound is an upper bound on the TFLOP/s a kernel of this shape can reach, the
product of:
  peak            by the family's math (codegen.families.Math): CUDA cores: SMs x FMA
                  lanes x 2 x clock (the device's own figures on a GPU); tensor cores:
                  SMs x tensor-core FLOP/clock x clock (tf32 half of fp16)
  tile efficiency useful / computed work when M, N, K are rounded up to the tile
  wave efficiency blocks / (SMs x ceil(blocks / SMs)), blocks = tiles x split-K:
                  SMs idle in the last wave
  issue efficiency the family's own figure (FamilySpec.issue_efficiency); SIMT:
                  FFMA / (FFMA + LDS) in the inner loop, RM*RN FMAs per RM/VA + RN/VB
                  shared loads, each taking an issue slot; WMMA: 1
Every factor only removes work a real kernel must do, so a kernel can never beat
its bound; pruning on it loses nothing that could have won.
"""

from __future__ import annotations

import dataclasses

from codegen.arch import ArchLimits
from codegen.compile import Resources
from codegen.families import Config, family_of
# the shape rules live with the configs (the families' spaces use them); re-exported here
from codegen.families._common import cdiv as _cdiv, shape_reasons as _shape_reasons, wants_split
from tuner.occupancy import Occupancy, occupancy

__all__ = ["Verdict", "judge", "bound_tflops", "shape_reasons", "wants_split"]


def shape_reasons(config: Config, shape: tuple[int, int, int], arch: ArchLimits) -> list[str]:
    """Reasons a buildable config is pointless or unusable at this shape (rejected before
    compiling): the split-K rules every family shares, then the family's own."""
    return _shape_reasons(config, shape, arch) + family_of(config).shape_reasons(
        config, shape, arch)


@dataclasses.dataclass(frozen=True)
class Verdict:
    hopeless: bool
    reason: str
    figures: dict
    occupancy: Occupancy


def bound_tflops(config: Config, shape: tuple[int, int, int],
                 arch: ArchLimits) -> tuple[float, dict]:
    """Upper bound on the TFLOP/s of `config` at `shape` on `arch`, and its factors."""
    m, n, k = shape
    c = config
    tile = (m * n * k) / (_cdiv(m, c.bm) * c.bm * _cdiv(n, c.bn) * c.bn * _cdiv(k, c.bk) * c.bk)
    tiles = _cdiv(m, c.bm) * _cdiv(n, c.bn) * c.split
    sms = max(arch.sm_count, 1)
    wave = tiles / (sms * _cdiv(tiles, sms))
    family = family_of(c)
    issue, peak = family.issue_efficiency(c), family.math.peak_tflops(c.dtype, arch)
    figures = dict(peak=round(peak, 2), tile_eff=round(tile, 4), wave_eff=round(wave, 4),
                   issue_eff=round(issue, 4))
    bound = peak * tile * wave * issue
    figures["bound_tflops"] = round(bound, 2)
    return bound, figures


def judge(
    config: Config,
    resources: Resources,
    shape: tuple[int, int, int],
    arch: ArchLimits,
    best_tflops: float | None = None,
) -> Verdict:
    """Is this compiled candidate worth timing? The reason and figures are stored on the trial."""
    occ = occupancy(config.threads, resources.registers, resources.smem, arch)
    bound, figures = bound_tflops(config, shape, arch)
    figures.update(registers=resources.registers, smem=resources.smem,
                   spill_bytes=resources.spill_bytes, **occ.to_dict())
    if resources.spill_bytes:
        return Verdict(True, f"spills {resources.spill_stores} B stored, "
                             f"{resources.spill_loads} B loaded", figures, occ)
    if occ.blocks_per_sm == 0:
        return Verdict(True, f"no block fits on an SM (limited by {occ.limiter})", figures, occ)
    if best_tflops is not None and bound < best_tflops:
        return Verdict(True, f"bound {bound:.1f} < best {best_tflops:.1f} TFLOP/s", figures, occ)
    return Verdict(False, "", figures, occ)
