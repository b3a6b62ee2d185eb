"""The occupancy model against results worked out by the CUDA occupancy calculator's rules."""

import pytest

from codegen.occupancy import occupancy


@pytest.mark.parametrize("arch,threads,regs,smem,blocks,limiter,occ", [
    # sm_90: 125 regs -> 4096 per warp -> 4 warps per sub-partition -> 16 warps -> 2 blocks of 8
    ("sm_90", 256, 125, 16896, 2, "registers", 0.25),
    # sm_90: (100000 + 1024 reserved) rounded to 128 = 101120 B; 233472 // 101120 = 2
    ("sm_90", 128, 32, 100000, 2, "shared memory", 0.125),
    # sm_90: 64 warp slots / 2 warps = 32 = registers' 32 = the 32 block slots: warps first on a tie
    ("sm_90", 64, 32, 0, 32, "warps", 1.0),
    ("sm_90", 32, 32, 0, 32, "blocks", 0.5),
    # sm_80: 255 regs -> 8192 per warp -> 2 warps per sub-partition -> 8 warps -> 1 block
    ("sm_80", 256, 255, 0, 1, "registers", 0.125),
    # sm_80: 164 KiB per SM; (40000 + 1024) -> 41088 B per block -> 4 blocks
    ("sm_80", 128, 40, 40000, 4, "shared memory", 0.25),
    # sm_86: 48 warp slots / 32 warps = 1 block
    ("sm_86", 1024, 32, 0, 1, "warps", 32 / 48),
    # sm_89: 24 block slots
    ("sm_89", 32, 16, 0, 24, "blocks", 0.5),
    # sm_75: 65 regs -> 2304 per warp -> 7 warps per sub-partition -> 28 warps < 32: none fit
    ("sm_75", 1024, 65, 0, 0, "registers", 0.0),
    # sm_75: 64 KiB per SM, no reservation, 256 B unit: 20000 -> 20224 -> 3 blocks
    ("sm_75", 128, 32, 20000, 3, "shared memory", 0.375),
    # over the per-block opt-in limit (227 KiB): nothing fits
    ("sm_90", 128, 32, 232449, 0, "shared memory", 0.0),
])
def test_known_calculator_results(arch, threads, regs, smem, blocks, limiter, occ):
    o = occupancy(threads, regs, smem, arch)
    assert o.blocks_per_sm == blocks
    assert o.limiter == limiter
    assert o.occupancy == pytest.approx(occ)
