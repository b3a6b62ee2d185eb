"""Occupancy model: how many blocks of a compiled kernel fit on one SM, and why not more.

Pure Python, following the rules of CUDA's occupancy calculator
(cuda_occupancy.h): registers are allocated per warp in units of
`reg_alloc_unit` and per SM sub-partition; shared memory per block is rounded
up to `smem_alloc_unit` after adding the driver's reserved bytes; blocks are
also capped by warp slots and block slots. It must agree with
cuOccupancyMaxActiveBlocksPerMultiprocessor (a GPU test checks it does).
"""

from __future__ import annotations

import dataclasses

from codegen.arch import ArchLimits, parse_arch

__all__ = ["Occupancy", "occupancy", "LIMITERS"]

LIMITERS = ("warps", "registers", "shared memory", "blocks")


@dataclasses.dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_block: int
    limits: dict  # limiter -> blocks per SM it allows
    max_warps_per_sm: int

    @property
    def active_warps(self) -> int:
        return self.blocks_per_sm * self.warps_per_block

    @property
    def occupancy(self) -> float:
        """Active warps over the SM's warp slots (0..1)."""
        return self.active_warps / self.max_warps_per_sm

    @property
    def limiter(self) -> str:
        """The resource that stops one more block (the first of LIMITERS on a tie)."""
        return min(LIMITERS, key=lambda k: (self.limits[k], LIMITERS.index(k)))

    def to_dict(self) -> dict:
        return dict(blocks_per_sm=self.blocks_per_sm, active_warps=self.active_warps,
                    occupancy=round(self.occupancy, 4), limiter=self.limiter,
                    limits=dict(self.limits))


_MAX_REGS = 256  # the calculator's per-thread register ceiling (ptxas stops at 255)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(threads: int, registers: int, smem: int, arch: str | int | ArchLimits) -> Occupancy:
    """Blocks per SM for a kernel of `threads` per block, `registers` per thread and
    `smem` bytes of shared memory per block (static + dynamic) on `arch`."""
    a = parse_arch(arch)
    warps = -(-threads // a.warp_size)
    limits: dict[str, int] = {}

    # Warp slots.
    limits["warps"] = 0 if threads > a.max_threads_per_block else a.max_warps_per_sm // warps

    # Registers: per warp, rounded to the allocation unit, allocated within sub-partitions.
    per_warp = _round_up(registers * a.warp_size, a.reg_alloc_unit)
    per_block = per_warp * warps
    assumed = per_warp * _round_up(warps, a.sub_partitions)
    if per_block > a.regs_per_block or assumed > a.regs_per_block or registers > _MAX_REGS:
        limits["registers"] = 0
    elif per_warp == 0:
        limits["registers"] = a.max_blocks_per_sm
    else:
        warps_per_part = (a.regs_per_sm // a.sub_partitions) // per_warp
        limits["registers"] = warps_per_part * a.sub_partitions // warps

    # Shared memory: reserved bytes added, rounded to the allocation unit.
    alloc = _round_up(smem + a.smem_reserved_per_block, a.smem_alloc_unit)
    limit_block = (a.smem_per_block_optin if smem > a.smem_per_block else a.smem_per_block)
    limit_block += a.smem_reserved_per_block
    if alloc > limit_block:
        limits["shared memory"] = 0
    elif alloc == 0:
        limits["shared memory"] = a.max_blocks_per_sm
    else:
        limits["shared memory"] = a.smem_per_sm // alloc

    limits["blocks"] = a.max_blocks_per_sm
    return Occupancy(
        blocks_per_sm=min(limits.values()),
        warps_per_block=warps,
        limits=limits,
        max_warps_per_sm=a.max_warps_per_sm,
    )
