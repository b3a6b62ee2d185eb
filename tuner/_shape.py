"""Parsing and checking the problems given by the user: shapes, and what a problem asks
beyond its shape (layout, C's type, bias, activation, batch) as one :class:`Task`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from codegen.config import DType, Layout
from codegen.errors import UsageError
from codegen.families._common import (
    ACTIVATIONS, BIASES, INT32_MAX, MAX_DIM, OUT_DTYPES, Variant,
)
_SHAPE_RE = re.compile(r"^\s*(-?\d+)\s*[xX*,]\s*(-?\d+)\s*[xX*,]\s*(-?\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int, int]:
    """'4096x4096x4096' -> (4096, 4096, 4096); UsageError for anything else.

    Sizes must be >= 1 and, with their products into the leading dimensions,
    fit the kernels' 32-bit indices.
    """
    m = _SHAPE_RE.match(str(text))
    if not m:
        raise UsageError(f"shape must be MxNxK, e.g. 4096x4096x4096 (got {text!r})")
    dims = tuple(int(g) for g in m.groups())
    for label, v in zip("MNK", dims):
        if v < 1:
            raise UsageError(f"{label} must be at least 1 (got {v} in {text!r})")
        if v > MAX_DIM:
            raise UsageError(f"{label}={v} exceeds the largest supported size {MAX_DIM}")
    return dims  # type: ignore[return-value]


def problem_bytes(shape: tuple[int, int, int], elem: int = 4) -> int:
    m, n, k = shape
    return (m * k + k * n + m * n) * elem


def format_shape(shape: tuple[int, int, int]) -> str:
    return "x".join(str(v) for v in shape)


def fp32_mode(dtype: DType, args) -> DType:
    """The request's dtype with --allow-tf32 / --allow-3xtf32 applied (fp32 data only)."""
    if args.allow_tf32 and args.allow_3xtf32:
        raise UsageError("--allow-tf32 and --allow-3xtf32 exclude each other")
    for flag, mode in (("allow_tf32", DType.TF32), ("allow_3xtf32", DType.F32X3)):
        if getattr(args, flag):
            if dtype not in (DType.F32, mode):
                raise UsageError(f"--{flag.replace('_', '-')} is for fp32 data, not "
                                 f"--dtype {args.dtype}")
            return mode
    return dtype


def shapes_file(path: Path | None) -> list:
    if path is None:
        return []
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--shapes {path}: cannot read it ({e})") from None
    out = []
    for no, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            try:
                out.append(parse_shape(text))
            except UsageError as e:
                raise UsageError(f"--shapes {path}, line {no}: {e}") from None
    if not out:
        raise UsageError(f"--shapes {path} names no shape")
    return out


# ---- what a problem asks beyond its shape: the variant and the batch ----------------------
#: the spelling of each input type's default C: torch's (fp16 / bf16 data write fp16 /
#: bf16 C; fp32, tf32 and 3xtf32 write fp32 C)
def default_out(dtype: DType) -> DType:
    """C's type when none is asked for: the input type for fp16 / bf16 (as torch), fp32
    for fp32 data (fp32, tf32, 3xtf32)."""
    return dtype if dtype in (DType.F16, DType.BF16) else DType.F32


def parse_layout(text: str) -> Layout:
    """'nt' (any case) -> Layout.NT; UsageError otherwise."""
    try:
        return Layout(str(text).strip().lower())
    except ValueError:
        raise UsageError(f"unknown layout {text!r} (choose from "
                         f"{', '.join(x.value for x in Layout)}: A's letter first, "
                         "T = column-major)") from None


def parse_out(text: str) -> DType:
    """C's type: fp32, fp16 or bf16 (any alias DType.parse reads); UsageError otherwise."""
    try:
        out = DType.parse(text)
    except UsageError:
        out = None
    if out not in OUT_DTYPES:
        raise UsageError(f"C cannot be {text!r} (choose from fp32, fp16, bf16)")
    return out


def parse_bias(text: str, out: DType) -> str:
    """The bias vector: none, out (C's type) or f32; with fp32 C, f32 is out."""
    bias = str(text).strip().lower()
    if bias not in BIASES:
        raise UsageError(f"unknown bias {text!r} (choose from {', '.join(BIASES)})")
    return "out" if bias == "f32" and out is DType.F32 else bias


def parse_act(text: str) -> str:
    act = str(text).strip().lower()
    if act not in ACTIVATIONS:
        raise UsageError(f"unknown activation {text!r} (choose from {', '.join(ACTIVATIONS)})")
    return act


def parse_batch(value) -> int:
    try:
        if isinstance(value, (bool, float)):  # a flag, or a count with a fraction
            raise ValueError
        batch = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"--batch must be a whole number (got {value!r})") from None
    if batch < 1:
        raise UsageError(f"--batch must be at least 1 (got {batch})")
    if batch > INT32_MAX:
        raise UsageError(f"--batch {batch} exceeds the largest supported count {INT32_MAX}")
    return batch


#: how the bias is written in an epilogue text ("bias+gelu"): of C's type, or fp32
_BIAS_TEXT = {"out": "bias", "f32": "biasf32"}


def epilogue_text(bias: str, act: str) -> str:
    """The bias and the activation as one word, as record files write them: "none",
    "relu", "bias", "bias+gelu", "biasf32+silu" (bias: of C's type; biasf32: fp32).

    Example:
        >>> epilogue_text("out", "gelu"), epilogue_text("none", "none")
        ('bias+gelu', 'none')
    """
    parts = ([_BIAS_TEXT[bias]] if bias != "none" else []) + ([act] if act != "none" else [])
    return "+".join(parts) or "none"


def parse_epilogue(text: str, out: DType) -> tuple[str, str]:
    """(bias, act) of an epilogue text (:func:`epilogue_text`'s inverse; also "bias_f32"
    or "bias:f32" for the fp32 bias); UsageError for anything else."""
    bias, act = "none", "none"
    words = [w.strip().lower() for w in str(text).split("+")]
    for w in words:
        if w in ("", "none") and len(words) == 1:
            continue
        if w in ("bias", "biasf32", "bias_f32", "bias:f32") and bias == "none":
            bias = "out" if w == "bias" else "f32"
        elif w in ACTIVATIONS and w != "none" and act == "none":
            act = w
        else:
            raise UsageError(f"epilogue {text!r} is not bias, an activation "
                             f"({', '.join(a for a in ACTIVATIONS if a != 'none')}) or "
                             "bias+activation")
    return parse_bias(bias, out), act


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem to tune: input type, shape, the variant (layout, C's type, bias,
    activation: codegen's Variant) and a strided batch of `batch` problems, each with its
    own A, B and C, or (`broadcast_b`) one B shared by all (stride 0).

    Example:
        >>> t = Task(DType.F16, (16, 4096, 4096), Variant(Layout.NT, DType.F16, "out", "gelu"), 8)
        >>> t.label
        '16x4096x4096 f16 nt C f16 bias+gelu batch 8'
    """

    dtype: DType
    shape: tuple[int, int, int]
    variant: Variant = Variant()
    batch: int = 1
    broadcast_b: bool = False

    @property
    def flops(self) -> float:
        m, n, k = self.shape
        return 2.0 * m * n * k * self.batch

    @property
    def epilogue(self) -> str:
        return epilogue_text(self.variant.bias, self.variant.act)

    @property
    def batch_text(self) -> str:
        """"1", "8" or "8, B shared"."""
        return f"{self.batch}{', B shared' if self.broadcast_b else ''}"

    @property
    def label(self) -> str:
        """Shape, input type, layout and C's type, then the epilogue and the batch where
        there is one: '16x4096x4096 f16 nt C f16 bias+gelu batch 8'."""
        v = self.variant
        text = f"{format_shape(self.shape)} {self.dtype.short} {v.layout.value} C {v.out.short}"
        if self.epilogue != "none":
            text += f" {self.epilogue}"
        if self.batch > 1:
            text += f" batch {self.batch_text}"
        return text

    def fields(self) -> dict:
        """The variant and batch as a result's and a library entry's fields."""
        v = self.variant
        return dict(layout=v.layout.value, out=v.out.short, bias=v.bias, act=v.act,
                    batch=self.batch, broadcast_b=self.broadcast_b)


def entry_variant(e: dict) -> dict:
    """A library entry's variant and batch; an entry from before those fields is the plain
    problem (nn, fp32 C, no bias, no activation, one problem)."""
    return dict(layout=e.get("layout", "nn"), out=e.get("out", "f32"),
                bias=e.get("bias", "none"), act=e.get("act", "none"),
                batch=int(e.get("batch", 1)), broadcast_b=bool(e.get("broadcast_b", False)))


def variant_text(e: dict) -> str:
    """'nt, C f16, bias+gelu, batch 8': an entry's variant and batch in words."""
    v = entry_variant(e)
    return (f"{v['layout']}, C {v['out']}, {epilogue_text(v['bias'], v['act'])}"
            + (f", batch {v['batch']}{' B shared' if v['broadcast_b'] else ''}"
               if v["batch"] > 1 else ""))
