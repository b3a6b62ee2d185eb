"""codegen.sass on the CPU: the main loop's instruction mix of real compiled SIMT kernels
(cuobjdump on nvcc's cubins), a hand-written dump for the hot path's choices, and
`gemm-tune inspect NAME --sass-mix`."""

import collections
import dataclasses
import json

import pytest

from codegen import DType, KernelConfig, compile_config
from codegen.config import DEFAULT_CONFIG, config_from_name
from codegen.families.wgmma import DEFAULT_WGMMA
from codegen.sass import (Instr, classify, disassemble, find_cuobjdump, functions, hot_path,
                          kernel_mix, loop_mix, main_loop)

#: the tuned 4096^3 fp32 winner on the H200 (bench/NOTES.md, "Strict fp32")
WINNER = "gemm_simt_f32_128x128x8_r8x8_w16x2_p0_v4_s2_g1_sw"
#: the best main-loop mix of the new parameters (bench/NOTES.md, "the main loop's
#: instruction mix"): the paired interior path on an 8x16 micro-tile (a 64x64 warp tile)
BEST = "gemm_simt_f32_128x256x8_r8x16_w8x4_p0_v4_s2_g1_sw_i2"


@pytest.fixture(scope="module")
def tool():
    if find_cuobjdump()[0] is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")


def _mix(c, compile_cache):
    r = compile_config(c, "sm_90", compile_cache)
    assert r.ok, r.error
    return kernel_mix(c, r.cubin), r


def _expected_loads(c):
    """(LDG.128, STS, STS.128) one iteration of a 2-stage kernel issues: whole vectors of A
    and B, A (row-major) stored transposed one float at a time, B as whole vectors."""
    tv = c.template_values()
    return tv["A_LOADS"] + tv["B_LOADS"], tv["A_LOADS"] * c.vec, tv["B_LOADS"]


@pytest.mark.parametrize("name", [DEFAULT_CONFIG.name, WINNER,
                                  "gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g1"])
def test_the_mix_of_a_two_stage_kernel(name, tool, compile_cache):
    """Every FFMA of the loop is on the hot path: RM x RN per k-step; fragments read as
    RM/VA + RN/VB shared loads of 32 x VA bits per k-step; the next tile's whole vectors
    (no scalar fallback) and their stores; one barrier."""
    c = config_from_name(name)
    mix, _ = _mix(c, compile_cache)
    tv = c.template_values()
    assert mix.complete and mix.k_steps == c.bk
    assert mix.counts["ffma"] == c.rm * c.rn * c.bk
    assert mix.per_kstep()["lds"] == c.rm // tv["VA"] + c.rn // tv["VB"]
    assert mix.lds_widths[32 * tv["VA"]] == mix.counts["lds"]
    ldg, sts, sts128 = _expected_loads(c)
    assert mix.opcodes.get("LDG.E.128.CONSTANT") == ldg
    assert not any(op.startswith("LDG") and ".128" not in op for op in mix.opcodes), mix.opcodes
    assert (mix.opcodes.get("STS", 0), mix.opcodes.get("STS.128", 0)) == (sts, sts128)
    assert mix.opcodes["BAR.SYNC.DEFER_BLOCKING"] == 1
    assert mix.issued == sum(mix.opcodes.values()) < mix.static
    assert 0.5 < mix.ffma_share == mix.counts["ffma"] / mix.issued < 1
    assert 0 < mix.ffma_reuse <= mix.counts["ffma"] <= mix.reuse_flags + mix.counts["ffma"]


def test_the_new_parameters_raise_the_ffma_share(tool, compile_cache):
    """Each step issues a larger share of FFMAs than the winner, with no spill: the interior
    path (unchecked, then paired: the loop keeps only its back branch), then the 8x16
    micro-tile; the best clears the winner by 5 points (measured: 84.6% -> 93.7%)."""
    steps = [WINNER, WINNER + "_i1", WINNER + "_i2", BEST]
    mixes = []
    for name in steps:
        mix, r = _mix(config_from_name(name), compile_cache)
        assert mix.complete and r.resources.spill_bytes == 0, (name, r.resources)
        mixes.append(mix)
    shares = [m.ffma_share for m in mixes]
    assert shares == sorted(shares) and len(set(shares)) == len(shares), shares
    assert shares[-1] > shares[0] + 0.05, shares
    for m in mixes[1:]:  # no bounds check, no test of a next tile: one branch, the loop's
        assert m.counts["control"] == 1 and m.opcodes["BRA"] == 1, m.opcodes
    paired = mixes[2]
    assert paired.k_steps == 2 * config_from_name(WINNER).bk  # two K tiles a turn
    assert mixes[-1].per_kstep()["lds"] == 8 // 4 + 16 // 4  # 6 LDS.128 per 128 FFMAs


#: the tuned 4096^3 fp32 winner of 98f87cf (bench/NOTES.md, "Strict fp32"), an 8x16 micro-tile
WINNER_8X16 = "gemm_simt_f32_128x256x8_r8x16_w16x2_p4_v4_s2_g8_i1"


def test_the_2x2_fma_order_at_ptxas_o1_reads_a_pair_of_each_block_from_the_reuse_cache(
        tool, compile_cache):
    """ptxas at -O3 schedules the FFMAs its own way, whatever the source's order (the 2x2
    order changes the reuse flags by a tenth or less); at -O1 it keeps the source's order,
    and the 2x2 blocks' pairs of registers (an even and an odd one) are served by the
    reuse cache: at least 1.4x the winner's flags (measured, nvcc 13.0: 866 -> 1,314 of
    1,024 FFMAs; cuBLAS's SGEMM 1,465), with the same FFMAs and shared loads, no spill,
    one block of 256 threads an SM still (at most 255 registers), and nvcc given -O1."""
    base = config_from_name(WINNER_8X16)
    plain, r0 = _mix(base, compile_cache)
    order, _ = _mix(dataclasses.replace(base, zigzag=2), compile_cache)
    both_cfg = dataclasses.replace(base, zigzag=2, ptxas=1)
    both, r = _mix(both_cfg, compile_cache)
    assert both_cfg.name == WINNER_8X16 + "_z2_o1"
    assert r.resources.spill_bytes == 0 and r.resources.registers <= 255, r.resources
    flags = [json.loads(x.cubin.with_suffix(".json").read_text())["flags"] for x in (r0, r)]
    assert "-Xptxas=-O1" in flags[1] and not any("-Xptxas=-O" in f for f in flags[0])
    assert order.reuse_flags < 1.1 * plain.reuse_flags, (plain.reuse_flags, order.reuse_flags)
    assert both.reuse_flags >= 1.4 * plain.reuse_flags, (plain.reuse_flags, both.reuse_flags)
    # the register file's reads per FFMA (cuBLAS's SGEMM: 1.57; measured 2.15 -> 1.72)
    per = [m.rf_reads / m.counts["ffma"] for m in (plain, both)]
    assert per[0] > 2.0 and per[1] < 1.8, per
    assert both.counts["ffma"] == plain.counts["ffma"] == 1024 and both.complete
    assert both.opcodes["LDS.128"] == plain.opcodes["LDS.128"] == 48
    assert both.issued <= plain.issued + 8, (plain.opcodes, both.opcodes)


def test_fragments_carried_across_tiles_load_each_fragment_well_ahead(tool, compile_cache):
    """The winner's loop uses some shared loads' values a few instructions after issuing
    them (the first k-step of each tile: its loads wait for the barrier); with the
    fragments carried across tiles (frags 3) at ptxas -O1, every load is issued at least
    24 instructions ahead of its first use (measured 33; cuBLAS's SGEMM 67), with the 2x2
    order's reuse (at most 1.8 register-file reads a FFMA, measured 1.76), the same FFMAs
    and shared loads a k-step, and no spill."""
    base = config_from_name("gemm_simt_f32_128x256x16_r8x16_w8x4_p4_v4_s2_g1_i1")
    plain, _ = _mix(base, compile_cache)
    carried_cfg = dataclasses.replace(base, interior=2, frags=3, zigzag=2, ptxas=1)
    carried, r = _mix(carried_cfg, compile_cache)
    assert r.resources.spill_bytes == 0 and carried.complete, r.resources
    assert plain.lds_lead[0] < 12 <= 24 <= carried.lds_lead[0], (plain.lds_lead, carried.lds_lead)
    assert carried.rf_reads <= 1.8 * carried.counts["ffma"]
    assert carried.per_kstep()["ffma"] == plain.per_kstep()["ffma"] == 128
    assert carried.per_kstep()["lds"] == plain.per_kstep()["lds"] == 6


def test_the_mix_of_a_cp_async_kernel_and_of_split_k(tool, compile_cache):
    """A 3-stage ring: the loop issues LDGSTS, not LDG / STS; a split-K pass kernel: the main
    kernel's loop, not the reduce kernel's (which has no FFMA loop)."""
    c = KernelConfig(bm=64, bn=128, bk=16, rm=4, rn=8, wt=8, pad=0, stages=3, swizzle=1,
                     split=4)
    mix, r = _mix(c, compile_cache)
    assert mix.complete and mix.counts["ffma"] == c.rm * c.rn * c.bk
    assert any(op.startswith("LDGSTS") for op in mix.opcodes)
    assert not any(op.startswith(("LDG.", "STS")) for op in mix.opcodes), mix.opcodes
    sass = disassemble(r.cubin)
    assert set(functions(sass)) == {c.name, c.name + "_reduce"}
    with pytest.raises(ValueError, match="no loop of FFMAs"):
        loop_mix(sass, c.name + "_reduce", 1)
    with pytest.raises(ValueError, match="no function"):
        loop_mix(sass, "gemm_simt_nothing", 1)
    with pytest.raises(ValueError, match="not a whole number of k-steps"):
        loop_mix(sass, c.name, c.rm * c.rn * c.bk + 1)


def test_fp16_inputs_widen_on_the_path(tool, compile_cache):
    c = dataclasses.replace(DEFAULT_CONFIG, dtype=DType.F16)
    mix, _ = _mix(c, compile_cache)
    assert mix.complete and mix.counts["ffma"] == c.rm * c.rn * c.bk
    assert mix.counts["other"] > 0  # the HADD2.F32 / conversions of the widening
    assert any(op.startswith("LDG.E.64") for op in mix.opcodes), mix.opcodes  # 4 halves


# ---- the hot path, on a hand-written dump --------------------------------------------
DUMP = """
        Function : k
        /*0000*/                   MOV R1, RZ ;
        /*0010*/               @P4 BRA 0x90 ;
        /*0020*/               @P1 BRA 0x50 ;
        /*0030*/                   LDG.E.CONSTANT R8, desc[UR4][R2.64] ;
        /*0040*/                   LDG.E.CONSTANT R9, desc[UR4][R2.64+0x4] ;
        /*0045*/                   BRA 0x70 ;
        /*0050*/                   LDG.E.64.CONSTANT R8, desc[UR4][R2.64] ;
        /*0060*/                   BRA 0x70 ;
        /*0070*/                   BSYNC B0 ;
        /*0090*/                   LDS.128 R4, [R0] ;
        /*00a0*/                   FFMA R10, R4.reuse, R5.reuse, R10 ;
        /*00b0*/                   FFMA R11, R4, R6, R11 ;
        /*00c0*/                   IMAD.MOV.U32 R12, RZ, RZ, R13 ;
        /*00d0*/              @!PT LDS RZ, [RZ] ;
        /*00e0*/              @!P2 BRA 0x10 ;
        /*00f0*/                   EXIT ;
        Function : other
        /*0000*/                   EXIT ;
"""


def test_the_hot_path_loads_the_next_tile_as_whole_vectors():
    """At the skip (P4) the path that loads, at the fallback (P1, fallen into here) the
    shorter one that loads as many bytes: the 64-bit load."""
    code = functions(DUMP)["k"]
    first, last = main_loop(code)
    assert (code[first].addr, code[last].addr) == (0x10, 0xe0)
    path = [i.addr for i in hot_path(code, first, last)]
    assert path == [0x10, 0x20, 0x50, 0x60, 0x70, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0]
    mix = loop_mix(DUMP, "k", ffma_per_step=1)
    assert (mix.counts["ffma"], mix.counts["lds"], mix.counts["global"], mix.counts["move"],
            mix.counts["control"]) == (2, 1, 1, 1, 6)
    assert mix.issued == 11 and mix.static == 14 and mix.complete
    assert (mix.ffma_reuse, mix.reuse_flags) == (1, 2)
    assert mix.per_kstep()["ffma"] == 1.0 and mix.lds_widths == {128: 1, 64: 0, 32: 0}
    doc = mix.to_dict()
    assert doc["ffma_share"] == round(2 / 11, 4) and doc["loop"] == ["0x10", "0xe0"]


def test_classes():
    def cls(op, operands="", pred=""):
        return classify(Instr(0, pred, op, operands))
    assert cls("FFMA") == "ffma" and cls("LDS.128") == "lds" and cls("STS.64") == "sts"
    assert cls("LDGSTS.E.BYPASS.128") == "global" and cls("BAR.SYNC.DEFER_BLOCKING") == "sync"
    assert cls("IMAD.WIDE") == "integer" and cls("ULOP3.LUT") == "integer"
    assert cls("IMAD.MOV.U32") == "move" and cls("HFMA2.MMA", "R3, -RZ, RZ, 0, 0") == "move"
    assert cls("LDS", "RZ, [RZ]", "@!PT") == "control"  # never executes: nvcc's filler
    assert cls("F2F.F32.F16") == "other"
    assert Instr(0, "", "LDS.128", "").width == 128 and Instr(0, "", "LDG.E.U16", "").width == 16
    assert Instr(0, "", "LDGSTS.E.BYPASS.LTC128B.128", "").width == 128
    assert Instr(0, "@P0", "BRA", "0x1a0").target == 0x1a0 and Instr(0, "", "FFMA", "").target is None


PERSISTENT = """
        Function : p
        /*0000*/                   MOV R1, RZ ;
        /*0010*/                   FFMA R2, R3, R4, R2 ;
        /*0020*/                   FFMA R5, R3, R4, R5 ;
        /*0030*/                   FFMA R6, R3, R4, R6 ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   FFMA R7, R3, R4, R7 ;
        /*0060*/               @P1 BRA 0x10 ;
        /*0070*/                   EXIT ;
"""


def test_the_main_loop_of_a_persistent_kernel_is_its_innermost():
    """A persistent kernel's loop over its tiles (stream-K's units) holds the main loop and
    more FFMAs than it: the main loop is the innermost loop of FFMAs."""
    code = functions(PERSISTENT)["p"]
    first, last = main_loop(code)
    assert (code[first].addr, code[last].addr) == (0x20, 0x40)


def test_a_function_without_a_loop_is_refused():
    with pytest.raises(ValueError, match="no loop of FFMAs"):
        loop_mix(DUMP, "other", 1)


# ---- inspect --sass-mix --------------------------------------------------------------
@pytest.fixture
def lib(tmp_path, compile_cache):
    from _library import build

    return build(tmp_path / "library", compile_cache, tmp_path / "art")


def test_inspect_sass_mix(lib, tool, capsys, compile_cache):
    from _library import BIG
    from tuner.cli import main

    assert main(["inspect", BIG.name, "--sass-mix", "--library", str(lib.path)]) == 0
    out = capsys.readouterr().out
    r = compile_config(BIG, "sm_90", compile_cache)
    mix = kernel_mix(BIG, r.cubin)
    assert out.strip() == mix.summary()
    assert f"FFMA {BIG.rm * BIG.rn * BIG.bk} ({mix.ffma_share:.1%})" in out
    assert main(["inspect", BIG.name, "--sass-mix", "--json", "--library", str(lib.path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(mix.to_dict()))


def test_inspect_sass_mix_of_a_tensor_core_kernel_is_one_line(lib, tool, capsys, tmp_path,
                                                                compile_cache):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _library import entry
    from tuner.cli import main

    c = dataclasses.replace(DEFAULT_WGMMA, persistent=0)
    r = compile_config(c, "sm_90", compile_cache, tmp_path / "art")
    assert r.ok, r.error
    lib.add(entry(c, r, (4096, 4096, 4096), 600.0, 700.0, dtype="f16"),
            next((tmp_path / "art").glob(f"*/{c.name}.cu")), r.cubin)
    assert main(["inspect", c.name, "--sass-mix", "--library", str(lib.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--sass-mix reads the FFMA loop of a CUDA-core (simt) kernel" in err
    assert len(err.splitlines()) == 1


# ---- bench/sass_mix.py and the pairs the lead times ---------------------------------------
def test_the_mainloop_pairs_build_and_tabulate(tool, compile_cache):
    """Every kernel of bench/pairs/mainloop-4096.txt builds on sm_90 (the device run times
    them all); bench/sass_mix.py's row and table of one of them."""
    import sys
    from pathlib import Path

    from codegen import check

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    import sass_mix

    names = sass_mix.names_of(bench / "pairs" / "mainloop-4096.txt")
    assert WINNER in names and BEST in names and len(names) == len(set(names)) >= 10
    for name in names:
        assert check(config_from_name(name), "sm_90") == [], name
    c = config_from_name(BEST)
    row = sass_mix.row(c, compile_config(c, "sm_90", compile_cache))
    assert row["rest"] == row["issued"] - row["counts"]["ffma"] - row["counts"]["lds"] > 0
    assert row["spill_bytes"] == 0 and row["registers"] > 128
    text = sass_mix.table([row])
    assert f"| `{BEST.removeprefix('gemm_simt_')}` | {row['issued']} (16) | " \
           f"{row['ffma_share']:.1%} | 6 (96 x 128-bit) |" in text


@pytest.mark.parametrize("name", [
    "gemm_wgmma_f16_128x256x64_c2_s4_x1_p1_g8_nt_of16_bias_gelut",
    "gemm_wgmma_bf16_256x128x64_c2_s4_x1_p1_g8_nt_obf16_silu",
    "gemm_simt_f16_128x128x8_r8x8_w4x8_p4_v4_s2_g8_nt_of16_bias_gelut"])
def test_the_sigmoid_activations_call_no_slow_path(name, tool, compile_cache):
    """SiLU and tanh-GELU divide by 1 + exp(-z) in every element of an unrolled epilogue:
    with expf and IEEE division each element carried two CALLs to a slow path (256 in the
    wgmma kernel, its code twice as long), and the fp16 8192x4096x1024 linear + bias +
    tanh-GELU ran 0.28x cuBLAS's plain GEMM on the H200 where the bias alone ran 0.83x.
    The SFU's exp and reciprocal keep every element inline."""
    c = config_from_name(name)
    r = compile_config(c, "sm_90", compile_cache)
    assert r.ok, r.error
    code = [i for f in functions(disassemble(r.cubin)).values() for i in f]
    ops = collections.Counter(i.opcode.split(".")[0] for i in code)
    assert ops["CALL"] == 0, ops["CALL"]
    assert ops["MUFU"] >= 2 * 64  # an exp and a reciprocal per output of a thread's tile


def test_the_wgmma_consumer_loop_builds_no_descriptor_per_wgmma(tool, compile_cache):
    """The tuned fp16 4096^3 kernel's consumer main loop (the back edge around its HGMMAs):
    a k-tile's 8 HGMMAs (2 per k-step of 16, BK = 64), their descriptors in uniform registers
    with no R2UR moving one from a vector register, and at most 64 instructions a k-tile
    (121 when every wgmma built both its descriptors from the shared address: bench/NOTES.md,
    "Nineteenth session"). The 3xTF32 pre-split's loop keeps its vector descriptors (its
    wgmmas from uniform registers ran 10% slower)."""
    cfg = config_from_name("gemm_wgmma_f16_256x128x64_c2_s4_x1_p1_g16_ts_of16")
    r = compile_config(cfg, "sm_90a", compile_cache)
    assert r.ok, r.error
    code = functions(disassemble(r.cubin))[cfg.name]
    first, last = main_loop(code, "HGMMA")
    loop = code[first:last + 1]
    assert sum(i.base == "HGMMA" for i in loop) == 8
    assert all("gdesc[UR" in i.operands for i in loop if i.base == "HGMMA")
    assert not [i for i in loop if i.base == "R2UR"]
    assert len(loop) <= 64, len(loop)

    split = config_from_name("gemm_wgmma_f32_128x128x32_c2_s3_x1_p1_g8_pre_t3")
    r = compile_config(split, "sm_90a", compile_cache)
    assert r.ok, r.error
    first, last = main_loop(functions(disassemble(r.cubin))[split.name], "HGMMA")
    assert [i for i in functions(disassemble(r.cubin))[split.name][first:last + 1]
            if i.base == "R2UR"]


def test_register_bank_conflicts(tool, compile_cache):
    """A FFMA's sources read from the register file (not from the reuse cache) beyond one in
    a bank (two banks, number mod 2), counted by hand, then on compiled main loops: the 8x8
    micro-tile conflicts on 0.74 of its FFMAs, the 8x16 winner on 0.21 (cuBLAS's SGEMM, read
    from its SASS: 0.16)."""
    from codegen.sass import bank_conflicts

    ffma = lambda ops: Instr(0, "", "FFMA", ops)  # noqa: E731
    assert bank_conflicts([ffma("R8, R0, R2, R8")]) == 2  # three even registers
    assert bank_conflicts([ffma("R9, R0, R3, R9")]) == 1
    assert bank_conflicts([ffma("R9, R0, R0, R9")]) == 0  # one register read twice
    assert bank_conflicts([ffma("R10, R1.reuse, R2, R10"), ffma("R11, R1, R3, R11")]) == 2
    assert bank_conflicts([ffma("R10, R1, R2, RZ"), ffma("R11, R1, 0x3f800000, R10")]) == 0
    eight, _ = _mix(config_from_name("gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g8"), compile_cache)
    winner, _ = _mix(config_from_name(WINNER_8X16), compile_cache)
    per = [m.bank_conflicts / m.counts["ffma"] for m in (eight, winner)]
    assert per[0] > 0.5 > 0.3 > per[1], per
    assert winner.to_dict()["bank_conflicts_per_ffma"] == round(per[1], 3)
