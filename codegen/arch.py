"""Per-architecture limits, the ones validation and the occupancy model need.

The figures follow the CUDA Programming Guide's table of compute-capability
limits and the rules of the CUDA occupancy calculator (cuda_occupancy.h). On a
GPU, :func:`tuner._runner.device_arch` reads the device's own attributes and
overrides this table.
"""

from __future__ import annotations

import dataclasses
import re

from codegen.errors import UsageError

__all__ = ["ArchLimits", "ARCHS", "parse_arch"]


@dataclasses.dataclass(frozen=True)
class ArchLimits:
    """Resource limits of one compute capability (per SM unless it says block)."""

    cc: int  # compute capability as major*10 + minor, e.g. 90
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    reg_alloc_unit: int  # registers are allocated per warp in units of this many
    smem_per_sm: int  # the largest shared-memory carveout
    smem_per_block: int  # without opt-in (static limit)
    smem_per_block_optin: int  # with cudaFuncAttributeMaxDynamicSharedMemorySize
    smem_reserved_per_block: int  # taken by the driver for every block (sm_80+)
    smem_alloc_unit: int
    sub_partitions: int = 4
    warp_size: int = 32
    sm_count: int = 0  # typical part; the device's own count overrides it
    fp32_lanes_per_sm: int = 128  # FP32 FMA lanes per SM
    tc_fp16_flops_per_clk: int = 0  # dense fp16/bf16 tensor-core FLOP/clock/SM, FP32 accumulate
    mem_gbs: int = 1000  # DRAM bandwidth of the typical part, GB/s (a lower bound for H200)
    clock_mhz: int = 0  # boost clock of the typical part; the device's own overrides it
    name: str = ""
    #: clusters of 1, 2, ... blocks that run at once (cuOccupancyMaxActiveClusters), a row
    #: for each count of blocks an SM from one: a cluster's blocks share one GPC, and a GPC
    #: whose SMs the size does not divide leaves some idle. Empty: every SM usable
    cluster_slots_table: tuple[tuple[int, ...], ...] = ()

    @property
    def sm(self) -> str:
        return f"sm_{self.cc}"

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def peak_fp32_tflops(self) -> float:
        """FMA lanes x 2 FLOP x clock x SMs."""
        return self.sm_count * self.fp32_lanes_per_sm * 2 * self.clock_mhz * 1e6 / 1e12

    def peak_tensor_tflops(self, dtype) -> float:
        """Dense tensor-core peak for fp16/bf16 inputs, FP32 accumulation; for fp32 data
        (tf32, and the f32 of 3xTF32 kernels, whose products are tf32) half of it."""
        per_clk = self.tc_fp16_flops_per_clk // (2 if dtype.short in ("tf32", "f32") else 1)
        return self.sm_count * per_clk * self.clock_mhz * 1e6 / 1e12

    def cluster_slots(self, size: int, blocks_per_sm: int = 1) -> int:
        """Clusters of `size` blocks that run at once with `blocks_per_sm` to an SM: the
        table's figure; past its rows, r times its figure at one block an SM (a lower
        bound, as every measured row is); without a table, sm_count x r / size."""
        r, s, rows = max(blocks_per_sm, 1), max(size, 1), self.cluster_slots_table
        if not rows or s > len(rows[0]):
            return self.sm_count * r // s
        if r <= len(rows):
            return rows[r - 1][s - 1]
        return r * rows[0][s - 1]

    @property
    def has_cp_async(self) -> bool:
        return self.cc >= 80

    def replace(self, **changes) -> "ArchLimits":
        return dataclasses.replace(self, **changes)


def _arch(cc, threads_sm, blocks_sm, smem_sm, smem_optin, reserved, unit, sms, lanes, tc, mhz,
          gbs, name):
    return ArchLimits(
        cc=cc,
        max_threads_per_block=1024,
        max_threads_per_sm=threads_sm,
        max_blocks_per_sm=blocks_sm,
        regs_per_sm=65536,
        regs_per_block=65536,
        max_regs_per_thread=255,
        reg_alloc_unit=256,
        smem_per_sm=smem_sm,
        smem_per_block=48 * 1024,
        smem_per_block_optin=smem_optin,
        smem_reserved_per_block=reserved,
        smem_alloc_unit=unit,
        sm_count=sms,
        fp32_lanes_per_sm=lanes,
        tc_fp16_flops_per_clk=tc,
        clock_mhz=mhz,
        mem_gbs=gbs,
        name=name,
    )


#: sm_70 is modelled for occupancy, but nvcc 13 no longer compiles for it. Tensor-core
#: FLOP/clock/SM from the vendors' dense fp16 peaks with FP32 accumulation (V100 125,
#: A100 312, H100 SXM 989 TFLOP/s at their clocks; GeForce parts are taken at the
#: datacenter rate, an upper bound, which is all the model needs).
ARCHS: dict[int, ArchLimits] = {
    a.cc: a
    for a in (
        _arch(70, 2048, 32, 96 * 1024, 96 * 1024, 0, 256, 80, 64, 1024, 1530, 900, "V100"),
        _arch(75, 1024, 16, 64 * 1024, 64 * 1024, 0, 256, 40, 64, 1024, 1590, 320, "T4"),
        _arch(80, 2048, 32, 164 * 1024, 163 * 1024, 1024, 128, 108, 64, 2048, 1410, 1555, "A100"),
        _arch(86, 1536, 16, 100 * 1024, 99 * 1024, 1024, 128, 84, 128, 1024, 1740, 696, "A40/RTX 30"),
        _arch(89, 1536, 24, 100 * 1024, 99 * 1024, 1024, 128, 142, 128, 1024, 2490, 864, "L40S/RTX 40"),
        _arch(90, 2048, 32, 228 * 1024, 227 * 1024, 1024, 128, 132, 128, 4096, 1980, 3350, "H100/H200 SXM"),
    )
}
#: an H100 SXM's clusters that run at once (bench/results/cluster-slots-*-h100-*; a GPU's
#: own table replaces it where the tuner runs): 15 clusters of 8 at one block an SM, so 16
#: of them (128 blocks) take two waves where 128 blocks without a cluster take one
ARCHS[90] = ARCHS[90].replace(cluster_slots_table=(
    (132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7),
    (264, 132, 79, 62, 47, 39, 32, 30, 23, 21, 16, 16, 14, 14, 14, 14),
    (396, 198, 124, 92, 69, 62, 47, 45, 37, 30, 28, 28, 23, 21, 21, 21),
    (528, 264, 163, 124, 94, 79, 69, 62, 51, 44, 37, 37, 30, 30, 28, 28)))

_ARCH_RE = re.compile(r"^(?:sm_?|compute_)?(\d)(\d)a?$")


def parse_arch(text: str | int | ArchLimits) -> ArchLimits:
    """`"sm_90"`, `"90"`, `90` or `"9.0"` -> the limits of that compute capability.

    Raises:
        UsageError: the text names no architecture in the table.
    """
    if isinstance(text, ArchLimits):
        return text
    s = str(text).strip().lower().replace(".", "")
    m = _ARCH_RE.match(s)
    cc = int(m.group(1) + m.group(2)) if m else None
    if cc not in ARCHS:
        known = ", ".join(a.sm for a in ARCHS.values())
        raise UsageError(f"unknown GPU architecture {text!r} (known: {known})")
    return ARCHS[cc]
