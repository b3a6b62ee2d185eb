"""Validation: every reason a configuration cannot be built, as sentences with numbers.

Invalid is a result, not an exception: ``check`` returns an empty list for a
buildable configuration. The template repeats the structural invariants as
``static_assert``s so that a hand-edited artifact fails loudly.
"""

from __future__ import annotations

from codegen.arch import ArchLimits, parse_arch
from codegen.config import DType, Family, KernelConfig, WmmaConfig

__all__ = ["check", "MAX_STAGES", "SPLITS", "REDUCES", "CLUSTER_SPLITS", "WARP_ARRANGEMENTS"]

MAX_STAGES = 4
SPLITS = (1, 2, 4, 8, 16, 32)
REDUCES = ("pass", "last", "cluster")
CLUSTER_SPLITS = (2, 4, 8)
WARP_ARRANGEMENTS = (1, 2, 4, 8, 16, 32)


def check(config: KernelConfig, arch: str | int | ArchLimits) -> list[str]:
    """Reasons `config` cannot be built for `arch`; empty when it can.

    Example:
        >>> check(KernelConfig(stages=3), "sm_75")
        ['cp.async stages (3) need sm_80 or newer; sm_75 has none']
    """
    a = parse_arch(arch)
    if isinstance(config, WmmaConfig):
        return _check_wmma(config, a)
    c = config
    why: list[str] = []

    if c.family is not Family.SIMT or c.dtype is DType.TF32:
        why.append(f"the {c.family.value} family has no {c.dtype.short} kernel")
    elif c.dtype is not DType.F32 and c.stages > 2:
        why.append(f"{c.dtype.short} inputs are widened to fp32 on the way through registers, "
                   f"so stages must be 1 or 2, not {c.stages} (cp.async cannot convert)")

    sizes = dict(BM=c.bm, BN=c.bn, BK=c.bk, RM=c.rm, RN=c.rn)
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    if bad:
        why.append(f"tile sizes must be positive ({', '.join(bad)})")
        return why  # nothing below is meaningful
    if c.bm % c.rm:
        why.append(f"BM={c.bm} is not a multiple of RM={c.rm}")
    if c.bn % c.rn:
        why.append(f"BN={c.bn} is not a multiple of RN={c.rn}")
    if c.wt not in WARP_ARRANGEMENTS:
        why.append(f"warp arrangement {c.wt} x 32/{c.wt} is not a split of 32 lanes")
        return why
    if why:
        return why

    t = c.threads
    if t % a.warp_size:
        why.append(f"{t} threads per block is not a multiple of the warp size {a.warp_size}")
    if t > a.max_threads_per_block:
        why.append(f"{t} threads per block exceeds the limit of {a.max_threads_per_block}")
    wm, wn = c.warp_tile
    if c.bm % wm:
        why.append(f"warp tile {wm}x{wn} (WT={c.wt} x RM={c.rm}) does not divide BM={c.bm}")
    if c.bn % wn:
        why.append(f"warp tile {wm}x{wn} ({c.wt_n} lanes x RN={c.rn}) does not divide BN={c.bn}")

    if c.vec not in (1, 2, 4):
        why.append(f"vector width {c.vec} is not 1, 2 or 4 floats")
    else:
        if c.bk % c.vec:
            why.append(f"BK={c.bk} is not a multiple of the vector width {c.vec}")
        if c.bn % c.vec:
            why.append(f"BN={c.bn} is not a multiple of the vector width {c.vec}")
        if t and not why:
            for op, rows, cols in (("A", c.bm, c.bk), ("B", c.bk, c.bn)):
                vecs = rows * cols // c.vec
                if vecs % t:
                    why.append(
                        f"{t} threads cannot load the {rows}x{cols} {op} tile evenly "
                        f"({vecs} vectors of {c.vec})"
                    )

    if not 1 <= c.stages <= MAX_STAGES:
        why.append(f"stages={c.stages} is outside 1..{MAX_STAGES}")
    elif c.stages >= 3 and not a.has_cp_async:
        why.append(f"cp.async stages ({c.stages}) need sm_80 or newer; {a.sm} has none")
    if not 0 <= c.pad <= 32:
        why.append(f"padding {c.pad} words is outside 0..32")
    if c.swizzle < 1:
        why.append(f"swizzle group {c.swizzle} must be at least 1")
    if c.frags not in (1, 2):
        why.append(f"fragment buffers {c.frags} must be 1 or 2")
    if c.minb < 1 or c.minb * t > a.max_threads_per_sm:
        why.append(f"__launch_bounds__ minimum of {c.minb} blocks of {t} threads does not fit "
                   f"the {a.max_threads_per_sm} threads of an SM")
    if c.split not in SPLITS:
        why.append(f"split-K {c.split} is not one of {', '.join(map(str, SPLITS))}")
    if c.reduce not in REDUCES:
        why.append(f"split-K reduce {c.reduce!r} is not one of {', '.join(REDUCES)}")
    elif c.reduce == "cluster":
        if c.split not in CLUSTER_SPLITS:
            why.append(f"a cluster split-K takes {', '.join(map(str, CLUSTER_SPLITS))} "
                       f"slices (a portable cluster size), not {c.split}")
        if a.cc < 90:
            why.append(f"a cluster split-K needs thread-block clusters (sm_90 or newer); "
                       f"{a.sm} has none")
    elif c.reduce == "last" and c.split == 1:
        why.append("a last-block split-K needs a split of 2 or more, not 1")

    smem = c.smem_bytes
    if smem > a.smem_per_block_optin:
        why.append(
            f"shared memory {smem} B exceeds the {a.smem_per_block_optin} B per-block "
            f"limit of {a.sm}"
        )
    regs = c.rm * c.rn + (c.rm + c.rn) * c.frags
    if regs > a.max_regs_per_thread:
        why.append(
            f"the {c.rm}x{c.rn} accumulators and fragments need {regs} registers, over "
            f"the {a.max_regs_per_thread} per-thread limit"
        )
    return why


def _check_wmma(c: WmmaConfig, a: ArchLimits) -> list[str]:
    why: list[str] = []
    if c.family is not Family.WMMA:
        why.append(f"a WmmaConfig must be of the wmma family, not {c.family.value}")
    if c.dtype not in (DType.F16, DType.BF16, DType.TF32):
        why.append(f"the wmma family takes f16, bf16 or tf32 inputs, not {c.dtype.short} "
                   "(f32 runs on the simt family)")
        return why
    if c.dtype in (DType.BF16, DType.TF32) and a.cc < 80:
        why.append(f"{c.dtype.short} tensor cores need sm_80 or newer; {a.sm} has none")
    sizes = dict(BM=c.bm, BN=c.bn, BK=c.bk, WM=c.wm, WN=c.wn)
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    if bad:
        return why + [f"tile sizes must be positive ({', '.join(bad)})"]
    shape = []  # what the rest of the checks need to be true
    if c.wm % 16 or c.wn % 16:
        shape.append(f"warp tile {c.wm}x{c.wn} is not made of 16x16 fragments")
    if c.bm % c.wm or c.bn % c.wn:
        shape.append(f"warp tile {c.wm}x{c.wn} does not divide the block tile {c.bm}x{c.bn}")
    if c.bk % c.frag_k:
        shape.append(f"BK={c.bk} is not a multiple of the {c.dtype.short} fragment depth "
                     f"{c.frag_k}")
    if shape:
        return why + shape
    t = c.threads
    if t > a.max_threads_per_block:
        why.append(f"{t} threads per block exceeds the limit of {a.max_threads_per_block}")
    if c.vec * c.elem not in (4, 8, 16):
        why.append(f"vector width {c.vec} x {c.elem} B is not a 4, 8 or 16 byte copy")
    else:
        for op, rows, cols in (("A", c.bm, c.bk), ("B", c.bk, c.bn)):
            if cols % c.vec or (rows * cols // c.vec) % t:
                why.append(f"{t} threads cannot load the {rows}x{cols} {op} tile evenly "
                           f"in vectors of {c.vec}")
    if c.skew < 0 or (c.skew * c.elem) % 16:
        why.append(f"skew {c.skew} x {c.elem} B must keep shared rows 16-byte aligned "
                   "(wmma's ldm)")
    if not 1 <= c.stages <= MAX_STAGES:
        why.append(f"stages={c.stages} is outside 1..{MAX_STAGES}")
    elif c.stages >= 2 and not a.has_cp_async:
        why.append(f"cp.async stages ({c.stages}) need sm_80 or newer; {a.sm} has none")
    if c.swizzle < 1:
        why.append(f"swizzle group {c.swizzle} must be at least 1")
    if c.smem_bytes > a.smem_per_block_optin:
        why.append(f"shared memory {c.smem_bytes} B exceeds the {a.smem_per_block_optin} B "
                   f"per-block limit of {a.sm}")
    acc = (c.wm // 16) * (c.wn // 16) * 8
    if acc > 128:
        why.append(f"the {c.wm}x{c.wn} warp tile holds {acc} accumulator registers per thread, "
                   "over 128")
    return why
