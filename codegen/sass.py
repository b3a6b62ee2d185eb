"""A compiled kernel's SASS: cuobjdump found and run, its instructions parsed, and the
main loop's instruction mix (what each iteration issues, and the FFMAs' share of it).

Issue slots limit the CUDA-core kernels (Nsight Compute's top stall on the tuned fp32
kernel is "not selected"): every instruction of the main loop that is not an FFMA costs
a slot an FFMA could have had. :func:`loop_mix` counts them from the cubin, on a machine
without a GPU.

The main loop is the backward branch whose body holds the most FFMAs. An iteration's
hot path (:func:`hot_path`) runs from the branch's target to the branch through the
loop's forward branches the common way: the next tile is loaded, as whole vectors (not
the scalar fallback at the edges). A path that misses some of the body's FFMAs is
reported as incomplete.

Example:
    >>> text = '''
    ...         Function : k
    ...         /*0000*/                   LDS.128 R4, [R2] ;
    ...         /*0010*/                   FFMA R8, R4.reuse, R5, R8 ;
    ...         /*0020*/                   FFMA R9, R4, R6, R9 ;
    ...         /*0030*/                   IADD3 R2, R2, 0x10, RZ ;
    ...         /*0040*/               @P0 BRA 0x0 ;
    ... '''
    >>> m = loop_mix(text, "k", ffma_per_step=2)
    >>> m.counts["ffma"], m.issued, round(m.ffma_share, 2)
    (2, 5, 0.4)
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

from codegen.errors import ToolchainError

__all__ = ["Instr", "Mix", "CLASSES", "find_cuobjdump", "disassemble", "functions",
           "main_loop", "hot_path", "classify", "loop_mix", "kernel_mix"]

#: one SASS line: address, optional predicate, opcode with its modifiers, operands
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.M)

#: the classes of the mix, in the order they are reported, and the opcodes (without
#: modifiers) in each; an opcode in none of them is "other"
CLASSES: dict[str, frozenset[str]] = {
    "ffma": frozenset({"FFMA"}),
    "lds": frozenset({"LDS", "LDSM"}),
    "sts": frozenset({"STS"}),
    "global": frozenset({"LDG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "STG", "RED", "ATOM",
                         "ATOMG"}),
    "sync": frozenset({"BAR", "SYNCS", "MEMBAR", "WARPSYNC", "ERRBAR"}),
    "integer": frozenset({"IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "IABS", "SEL",
                          "PLOP3", "P2R", "R2P", "IMNMX", "VIADD", "VIMNMX", "ISCADD",
                          "UIADD3", "UIMAD", "ULEA", "USHF", "ULOP3", "UISETP", "USEL",
                          "UPLOP3", "UP2UR", "UR2UP"}),
    "move": frozenset({"MOV", "UMOV", "CS2R", "S2R", "S2UR", "LDC", "ULDC", "MOV32I", "R2UR",
                       "SHFL", "PRMT", "UPRMT"}),
    "control": frozenset({"BRA", "BSSY", "BSYNC", "NOP", "EXIT", "CALL", "RET", "YIELD",
                          "JMP", "BMOV", "BREAK", "WARPGROUP"}),
}


@dataclasses.dataclass(frozen=True)
class Instr:
    """One SASS instruction: its address, predicate ('' or '@P0', '@!P1'), opcode with
    modifiers ('LDS.128') and operand text."""

    addr: int
    pred: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        """The opcode without modifiers ('LDS')."""
        return self.opcode.split(".")[0]

    @property
    def target(self) -> int | None:
        """A branch's target address, else None."""
        if self.base not in ("BRA", "JMP"):
            return None
        m = re.search(r"0x([0-9a-f]+)\s*$", self.operands)
        return int(m.group(1), 16) if m else None

    @property
    def reuse(self) -> int:
        """Source operands flagged .reuse (read from the operand-reuse cache)."""
        return self.operands.count(".reuse")

    @property
    def width(self) -> int:
        """Bits per thread of a memory access (32 where no width modifier says otherwise)."""
        sizes = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}
        return next((sizes[p] for p in self.opcode.split(".")[1:] if p in sizes), 32)


def classify(i: Instr) -> str:
    """The mix class of an instruction: a key of CLASSES, or 'other'. IMAD.MOV is a move;
    one that never executes (``@!PT``, nvcc's filler before LDGSTS) is control."""
    if i.pred == "@!PT":
        return "control"
    if i.opcode.startswith("IMAD.MOV") or (i.opcode == "HFMA2.MMA" and "-RZ, RZ" in i.operands):
        return "move"  # nvcc's moves on the FMA pipe (a copy, a zero)
    return next((c for c, ops in CLASSES.items() if i.base in ops), "other")


# ---- cuobjdump -------------------------------------------------------------------------
def find_cuobjdump() -> tuple[str | None, dict]:
    """cuobjdump (and the nvdisasm it runs) from PATH, the toolkit's bin, or the pip wheels
    (nvidia-cuda-cuobjdump / -nvdisasm, the dev extra); with the environment to run it in."""
    env = dict(os.environ)
    dirs = [Path("/usr/local/cuda/bin")]
    try:
        import nvidia.cu13 as cu13
        dirs += [Path(p) / "bin" for p in cu13.__path__]
    except ImportError:
        pass
    env["PATH"] = os.pathsep.join([env.get("PATH", "")] + [str(d) for d in dirs])
    return shutil.which("cuobjdump", path=env["PATH"]), env


def disassemble(cubin: Path | str) -> str:
    """The cubin's SASS, by cuobjdump.

    Raises:
        ToolchainError: no cuobjdump, or it failed on the file.
    """
    tool, env = find_cuobjdump()
    if not tool:
        raise ToolchainError("reading SASS needs cuobjdump (the CUDA toolkit, or the dev "
                             "extra's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)")
    p = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True,
                       check=False, env=env)
    if p.returncode:
        raise ToolchainError(f"cuobjdump failed on {cubin}: {p.stderr.strip()[:300]}")
    return p.stdout


def functions(text: str) -> dict[str, list[Instr]]:
    """Each function of a SASS dump, by name, as its instructions in address order."""
    heads = list(_FUNCTION.finditer(text))
    out = {}
    for h, nxt in zip(heads, heads[1:] + [None]):
        body = text[h.end():nxt.start() if nxt else len(text)]
        out[h.group(1)] = [Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3),
                                 m.group(4).strip()) for m in _LINE.finditer(body)]
    return out


# ---- the main loop ---------------------------------------------------------------------
def _count(code: list[Instr], base: str = "FFMA") -> int:
    return sum(i.base == base for i in code)


def main_loop(code: list[Instr], base: str = "FFMA") -> tuple[int, int]:
    """(first, last) indices of the main loop: from the target of the backward branch
    whose body holds the most `base` instructions (FFMA: the CUDA-core family's; HGMMA: a
    wgmma consumer's) to that branch, among the innermost such loops (a persistent
    kernel's loop over its tiles holds every main loop).

    Raises:
        ValueError: no loop holds one.
    """
    at = {i.addr: n for n, i in enumerate(code)}
    loops = [(at[i.target], n) for n, i in enumerate(code)
             if i.target is not None and i.target <= i.addr and i.target in at]
    loops = [lo for lo in loops if _count(code[lo[0]:lo[1] + 1], base)]
    inner = [(a, b) for a, b in loops
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    best = max(inner, key=lambda lo_hi: _count(code[lo_hi[0]:lo_hi[1] + 1], base), default=None)
    if best is None:  # (every loop left holds one)
        raise ValueError(f"no loop of {base}s in this function (the mix reads the CUDA-core "
                         "family's main loop)")
    return best


def _bytes_moved(i: Instr) -> int:
    """Bytes per thread a load from global memory or a store to shared memory moves."""
    return i.width // 8 if i.base in ("LDG", "LDGSTS", "STS") else 0


def hot_path(code: list[Instr], first: int, last: int) -> list[Instr]:
    """The instructions one iteration issues on its common path, from `first` to the back
    branch `last`: of the paths through the loop's forward branches, the one that moves the
    most bytes from global memory and into shared memory (the next tile is loaded and
    stored: the predicated scalar fallback moves as many as the vector access, the skip on
    the last iteration fewer), and of those the shortest (whole vectors).

    Raises:
        ValueError: no path reaches the back branch.
    """
    at = {i.addr: n for n, i in enumerate(code)}
    # best[n] = ((bytes moved, -instructions) from n to the back branch, the next index)
    best: dict[int, tuple[tuple[int, int], int | None]] = {
        last: ((_bytes_moved(code[last]), -1), None)}
    for n in range(last - 1, first - 1, -1):
        i = code[n]
        nxt = []
        if not (i.base in ("BRA", "EXIT", "JMP", "RET") and not i.pred):
            nxt.append(n + 1)
        t = at.get(i.target) if i.target is not None else None
        if t is not None and n < t <= last:
            nxt.append(t)
        scored = [((best[m][0][0] + _bytes_moved(i), best[m][0][1] - 1), m)
                  for m in nxt if m in best]
        if scored:
            best[n] = max(scored)
    if first not in best:
        raise ValueError(f"no path through the loop at {code[first].addr:#x} reaches its "
                         f"back branch")
    path, n = [], first
    while n is not None:
        path.append(code[n])
        n = best[n][1]
    return path


@dataclasses.dataclass(frozen=True)
class Mix:
    """What one iteration of a kernel's main loop issues on its hot path.

    Attributes:
        kernel: the function's name.
        k_steps: k-steps one iteration covers (its FFMAs over those of one k-step: BK, or
            2 x BK where the loop takes two K tiles a turn).
        start, end: the loop's first address and its back branch's.
        counts: instructions issued per iteration, by class (CLASSES, then "other").
        opcodes: the same by opcode with modifiers ("LDS.128": 32, ...; one that never
            executes keeps its "@!PT ").
        lds_widths: shared loads on the path by bits per thread (128, 64, 32).
        static: instructions in the loop's address range (cold paths included).
        complete: does the hot path hold every FFMA of the loop's range?
        ffma_reuse: FFMAs on the path with at least one .reuse source operand.
        reuse_flags: .reuse flags on the path's FFMAs.
        rf_reads: the path's FFMAs' source operands read from the register file, the rest
            served by the operand-reuse cache (:func:`register_file_reads`).
        lds_lead: for each shared load, the instructions until the first use of what it
            loads, sorted (:func:`load_to_use`).
        bank_conflicts: the path's FFMAs' register-bank conflicts (:func:`bank_conflicts`).
    """

    kernel: str
    k_steps: int
    start: int
    end: int
    counts: dict
    opcodes: dict
    lds_widths: dict
    static: int
    complete: bool
    ffma_reuse: int
    reuse_flags: int
    rf_reads: int = 0
    lds_lead: tuple = ()
    bank_conflicts: int = 0

    @property
    def issued(self) -> int:
        return sum(self.counts.values())

    @property
    def ffma_share(self) -> float:
        """FFMAs over all instructions issued: the fraction of issue slots doing math."""
        return self.counts["ffma"] / self.issued if self.issued else 0.0

    def per_kstep(self) -> dict[str, float]:
        """`counts` divided by the k-steps of an iteration."""
        return {c: n / self.k_steps for c, n in self.counts.items()}

    def to_dict(self) -> dict:
        return dict(kernel=self.kernel, k_steps=self.k_steps, loop=[hex(self.start),
                    hex(self.end)], issued=self.issued, ffma_share=round(self.ffma_share, 4),
                    counts=self.counts, per_kstep={c: round(v, 2) for c, v in
                                                   self.per_kstep().items()},
                    lds_widths=self.lds_widths, opcodes=self.opcodes, static=self.static,
                    complete=self.complete, ffma_reuse=self.ffma_reuse,
                    reuse_flags=self.reuse_flags, rf_reads=self.rf_reads,
                    rf_reads_per_ffma=round(self.rf_reads / max(self.counts["ffma"], 1), 3),
                    bank_conflicts=self.bank_conflicts,
                    bank_conflicts_per_ffma=round(
                        self.bank_conflicts / max(self.counts["ffma"], 1), 3),
                    lds_lead=list(self.lds_lead))

    def summary(self) -> str:
        """Four lines for a terminal."""
        c, w = self.counts, self.lds_widths
        rest = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("ffma", "lds"))
        return (f"{self.kernel}: main loop {self.start:#06x}-{self.end:#06x}, {self.k_steps} "
                f"k-steps, {self.issued} issued per iteration ({self.issued / self.k_steps:.1f}"
                f" per k-step){'' if self.complete else ' (hot path INCOMPLETE)'}\n"
                f"  FFMA {c['ffma']} ({self.ffma_share:.1%}), LDS {c['lds']} (128-bit {w[128]}, "
                f"64-bit {w[64]}, 32-bit {w[32]}), {rest}\n"
                f"  FFMAs with a .reuse operand: {self.ffma_reuse} of {c['ffma']} "
                f"({self.reuse_flags} flags); register-file reads per FFMA "
                f"{self.rf_reads / max(c['ffma'], 1):.2f} (of 3), register-bank conflicts per "
                f"FFMA {self.bank_conflicts / max(c['ffma'], 1):.2f}\n"
                f"  a shared load's first use comes {self._lead()} instructions after it")

    def _lead(self) -> str:
        lead = self.lds_lead
        return f"{lead[0]} (least), {lead[len(lead) // 2]} (median)" if lead else "-"


def loop_mix(sass: str, kernel: str, ffma_per_step: int) -> Mix:
    """The main-loop mix of function `kernel` in a SASS dump (cuobjdump's text), whose
    k-steps issue `ffma_per_step` FFMAs each (the SIMT family's RM x RN).

    Raises:
        ValueError: no such function, it has no loop of FFMAs, or the loop's hot path is
            not a whole number of k-steps.
    """
    code = functions(sass).get(kernel)
    if code is None:
        raise ValueError(f"no function {kernel!r} in the SASS (has {sorted(functions(sass))})")
    first, last = main_loop(code)
    path = hot_path(code, first, last)
    counts = collections.Counter(classify(i) for i in path)
    ffmas = [i for i in path if i.base == "FFMA"]
    widths = collections.Counter(i.width for i in path if classify(i) == "lds")
    k_steps, odd = divmod(len(ffmas), ffma_per_step)
    if odd or not k_steps:
        raise ValueError(f"the loop at {code[first].addr:#x} issues {len(ffmas)} FFMAs, not "
                         f"a whole number of k-steps of {ffma_per_step}")
    return Mix(kernel=kernel, k_steps=k_steps, start=code[first].addr, end=code[last].addr,
               counts={c: counts[c] for c in (*CLASSES, "other")},
               opcodes=dict(collections.Counter(
                   ("@!PT " if i.pred == "@!PT" else "") + i.opcode for i in path).most_common()),
               lds_widths={b: widths[b] for b in (128, 64, 32)},
               static=last - first + 1,
               complete=len(ffmas) == _count(code[first:last + 1]),
               ffma_reuse=sum(i.reuse > 0 for i in ffmas),
               reuse_flags=sum(i.reuse for i in ffmas),
               rf_reads=register_file_reads(ffmas), lds_lead=tuple(load_to_use(path)),
               bank_conflicts=bank_conflicts(ffmas))


_REG = re.compile(r"^-?\|?R(\d+)\|?(\.reuse)?$")


def load_to_use(path: list[Instr]) -> list[int]:
    """For each shared load (LDS) of a loop's hot path, the instructions issued after it up
    to the first that reads a register it loads (around the loop's back branch), sorted:
    how far ahead the loop issues its fragments' loads. A use a few instructions on waits
    out the load's latency (some 30 clocks) unless another warp issues meanwhile.

    Example:
        >>> path = [Instr(0, "", "LDS.64", "R4, [R2]"), Instr(16, "", "FFMA", "R8, R1, R1, R8"),
        ...         Instr(32, "", "FFMA", "R9, R5, R1, R9")]
        >>> load_to_use(path)
        [2]
    """
    out = []
    for n, i in enumerate(path):
        if i.base != "LDS":
            continue
        m = re.match(r"\s*R(\d+)", i.operands)
        words = i.width // 32
        loaded = {f"R{int(m.group(1)) + w}" for w in range(words)} if m else set()
        for d in range(1, len(path)):
            j = path[(n + d) % len(path)]
            if any(op.strip().split(".")[0].lstrip("-|") in loaded
                   for op in j.operands.split(",")[1:]):
                out.append(d)
                break
    return sorted(out)


def _rf_operands(ffmas: list[Instr]) -> Iterator[list[int]]:
    """For each of `ffmas` (in issue order), the registers its sources read from the register
    file: the rest come from the operand-reuse cache, modelled as one value per operand slot
    and register bank (two banks, a register's number mod 2: the order cuBLAS's SGEMM walks
    its micro-tile in 2x2 blocks shows it). A read is served when its slot and bank hold
    that register; a .reuse flag leaves the value there, a read without one does not.
    RZ and immediates read nothing."""
    cache: dict[tuple[int, int], int] = {}
    for i in ffmas:
        reads = []
        for slot, text in enumerate(i.operands.split(",")[1:4]):
            m = _REG.match(text.strip())
            if m is None:
                continue
            reg, keep = int(m.group(1)), m.group(2) is not None
            key = (slot, reg % 2)
            if cache.get(key) != reg:
                reads.append(reg)
            if keep:
                cache[key] = reg
            elif cache.get(key) == reg:
                del cache[key]
        yield reads


def register_file_reads(ffmas: list[Instr]) -> int:
    """Source operands of `ffmas` (in issue order) read from the register file
    (:func:`_rf_operands`: the rest come from the operand-reuse cache).

    Example:
        >>> ffma = lambda ops: Instr(0, "", "FFMA", ops)
        >>> register_file_reads([ffma("R8, R0.reuse, R2.reuse, R8"),
        ...                      ffma("R9, R0.reuse, R3.reuse, R9"),
        ...                      ffma("R10, R1.reuse, R2, R10"),
        ...                      ffma("R11, R1, R3, R11")])
        8
    """
    return sum(len(reads) for reads in _rf_operands(ffmas))


def bank_conflicts(ffmas: list[Instr]) -> int:
    """Register-bank conflicts of `ffmas`: per FFMA, the distinct registers it reads from the
    register file (:func:`_rf_operands`) beyond one in the same bank (two banks, number mod
    2), each a read the bank serves a cycle late. A model, not a measurement: it does not rank
    the CUDA-core variants the H200 timed (those with the fewest ran slower; bench/NOTES.md,
    "Thirty-sixth session").

    Example:
        >>> ffma = lambda ops: Instr(0, "", "FFMA", ops)
        >>> bank_conflicts([ffma("R8, R0, R2, R8"),        # R0, R2, R8: all even
        ...                 ffma("R9, R0, R3, R9"),        # R0 | R3, R9
        ...                 ffma("R10, R1.reuse, R2, R10"),  # R1 | R2, R10
        ...                 ffma("R11, R1, R3, R11")])     # R1 cached; R3, R11
        5
    """
    return sum(max(0, sum(r % 2 == b for r in set(reads)) - 1)
               for reads in _rf_operands(ffmas) for b in (0, 1))


def kernel_mix(config, cubin: Path | str) -> Mix:
    """The main-loop mix of a SIMT `config`'s kernel in its compiled `cubin`."""
    return loop_mix(disassemble(cubin), config.name, config.rm * config.rn)
