"""What every family shares: the closed sets (DType, Layout), the to_dict / from_dict
mixin, the procedural name declared once (:class:`Name`, :class:`Named`), the shape
rules of split-K, and the checks of limits every kernel meets."""

from __future__ import annotations

import dataclasses
import enum
import functools
import numbers
import re
from typing import Any, Callable, Mapping, NamedTuple

from codegen.arch import ArchLimits
from codegen.errors import UsageError

__all__ = ["DType", "Layout", "Variant", "OUT_DTYPES", "BIASES", "ACTIVATIONS", "EPILOGUE_NAME",
           "EPILOGUE_TEXTS", "epilogue_reasons", "epilogue_values", "Serial", "Name", "Named",
           "SplitK", "Text", "NUMBER", "FLAG", "choice",
           "Shape", "MAX_STAGES", "cdiv", "widest",
           "wants_split", "shape_reasons", "positive_sizes", "threads_reasons",
           "stages_reasons", "swizzle_reasons", "smem_reasons"]

Shape = tuple[int, int, int]

#: The deepest shared-memory pipeline any family builds.
MAX_STAGES = 4


class DType(enum.Enum):
    """Input type of a GEMM: its short name (used in names), C++ spelling, size in bytes."""

    F32 = ("f32", "float", 4)
    TF32 = ("tf32", "float", 4)
    #: a request, not a kernel type: fp32 data at fp32 accuracy, 3xTF32 tensor-core kernels
    #: allowed beside the CUDA-core ones (--allow-3xtf32); those kernels' configs are f32
    F32X3 = ("f32x3", "float", 4)
    F16 = ("f16", "__half", 2)
    BF16 = ("bf16", "__nv_bfloat16", 2)

    def __init__(self, short: str, cpp: str, size: int):
        self.short = short
        self.cpp = cpp
        self.size = size

    @classmethod
    def parse(cls, text: str) -> "DType":
        """`fp32`, `f32`, `float32`, `float` ... -> DType; UsageError otherwise."""
        aliases = {
            "fp32": cls.F32, "f32": cls.F32, "float32": cls.F32, "float": cls.F32,
            "tf32": cls.TF32, "f32x3": cls.F32X3, "3xtf32": cls.F32X3,
            "fp16": cls.F16, "f16": cls.F16, "float16": cls.F16, "half": cls.F16,
            "bf16": cls.BF16, "bfloat16": cls.BF16,
        }
        try:
            return aliases[str(text).strip().lower()]
        except KeyError:
            raise UsageError(
                f"unknown dtype {text!r} (choose from fp32, tf32, 3xtf32, fp16, bf16)"
            ) from None

    @classmethod
    def from_short(cls, short: str) -> "DType | None":
        """The DType whose short name (as in kernel names) is `short`, or None."""
        return next((d for d in cls if d.short == short), None)


class Layout(enum.Enum):
    """How A and B are stored, A's letter first: N row-major (rows contiguous, as C is), T
    column-major (a transposed view: torch's ``W.t()``, numpy's ``W.T``). C = A * B with A
    M x K and B K x N either way; C is row-major."""

    NN = "nn"  # both row-major
    NT = "nt"  # B column-major: x @ W.t() with W stored (N, K), as torch.nn.Linear keeps it
    TN = "tn"  # A column-major
    TT = "tt"  # both column-major

    @classmethod
    def of(cls, a_column_major: bool, b_column_major: bool) -> "Layout":
        """The layout of an A and a B stored so."""
        return cls(("t" if a_column_major else "n") + ("t" if b_column_major else "n"))


#: the types C may be written in (FP32 accumulation always; converted in the epilogue)
OUT_DTYPES = (DType.F32, DType.F16, DType.BF16)
#: the bias vector (length N, added to every row of C): none, of C's type, or fp32
BIASES = ("none", "out", "f32")
#: the largest M, N or K a kernel takes: its tile counts, (M + BM - 1) / BM, and tile
#: origins are 32-bit (a tile is at most 256 rows; split-K slices and clusters stay inside)
MAX_DIM = 2**31 - 4096
#: the largest count a kernel's 32-bit arguments take (a batch, an M-bucket's bound)
INT32_MAX = 2**31 - 1


def whole(x, low: int | None = None, high: int | None = None) -> bool:
    """Is `x` a whole number (an int, numpy's too, not a bool), within [low, high] where
    given? What a size, count or index read from a user or a file must be."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) \
        and (low is None or x >= low) and (high is None or x <= high)


def quantity(x, high: float = 1e15) -> bool:
    """Is `x` a measured amount (TFLOP/s, milliseconds) as a file may hold it: a real
    number, not a bool, at least 0 and below `high` (NaN, infinities and an int too large
    for a float are not)?"""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 <= x < high
#: the activation the epilogue applies last, in FP32 (gelu: the erf form; gelu_tanh: the
#: tanh approximation, as torch's approximate="tanh")
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")

#: how every family's name ends: the layout, C's type, the bias and the activation, each
#: written only when not the default (NN, fp32 C, none, none), so that the names from
#: before these fields read as they did
EPILOGUE_NAME = "[_{layout}][_o{out}][_{bias}][_{act}]"


class Serial:
    """to_dict / from_dict of a config dataclass: enums as their short strings.

    The "family" field is turned back into the type of the class's own default (its
    Family member), so this module needs no list of families.
    """

    #: which of A, B and C a kernel needs 16-byte aligned in address and row stride (the
    #: wgmma family's TMA reads and writes them); the default: any alignment runs
    aligned_operands = (False, False, False)
    #: blocks that receive each A / B tile from one load (TMA multicast in a cluster); 1: none
    a_multicast = 1
    b_multicast = 1
    #: C's type, the bias and the activation (EPILOGUE_NAME): a family whose template
    #: applies them declares them as fields; these are the values of one that does not
    out = DType.F32
    bias = "none"
    act = "none"

    def takes(self, m: int, n: int, k: int, align: tuple) -> bool:
        """Can this kernel run M x N x K on operands of alignment class `align` (the widest
        access, in bytes, each of A, B, C allows)? By default: where aligned_operands are
        16-byte aligned."""
        return all(a == 16 or not need for need, a in zip(self.aligned_operands, align))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(dtype=self.dtype.short, family=getattr(self.family, "value", self.family),
                 layout=self.layout.value)
        if "out" in d:
            d["out"] = self.out.short
        return d

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        d["dtype"] = next(x for x in DType if x.short == d["dtype"])
        default = cls.__dataclass_fields__["family"].default
        d["family"] = type(default)(d["family"])
        d["layout"] = Layout(d["layout"])
        if "out" in cls.__dataclass_fields__:
            d["out"] = DType.from_short(d.get("out", "f32"))
        return cls(**d)


# ---- the procedural name ----------------------------------------------------------------
class Text(NamedTuple):
    """How one field is written in a name: the regex of its text, and both directions."""

    pattern: str
    write: Callable[[Any], str]
    read: Callable[[str], Any]


#: a whole number (every field not given a Text of its own)
NUMBER = Text(r"\d+", str, int)
#: a 0/1 switch written as nothing: the optional part holding it, present, reads as 1
FLAG = Text("", lambda value: "", lambda text: 1)


def choice(texts: Mapping[Any, str]) -> Text:
    """A field of a few values, each written as its own text."""
    values = {text: value for value, text in texts.items()}
    alternatives = sorted(values, key=len, reverse=True)
    return Text("|".join(map(re.escape, alternatives)), texts.__getitem__, values.__getitem__)


DTYPE = choice({d: d.short for d in DType})

#: the Texts of EPILOGUE_NAME's fields (the defaults are never written, so have no text)
EPILOGUE_TEXTS = dict(
    layout=choice({x: x.value for x in Layout if x is not Layout.NN}),
    out=choice({DType.F16: "f16", DType.BF16: "bf16"}),
    bias=choice({"out": "bias", "f32": "biasf32"}),
    act=choice({"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelut", "silu": "silu"}),
)


class Name:
    """A family's procedural name, declared once as a pattern over its config's fields;
    writing the name (:meth:`write`) and reading it back (:meth:`read`) both follow.

    The pattern is the name with each field as ``{field}``. A part in ``[brackets]`` is
    left out while the first field in it has its default (and reads back as that
    default), so that a field added later leaves the older names as they were. Fields
    are whole numbers unless `texts` gives a :class:`Text`; ``{dtype}`` is the DType's
    short name. A placeholder may name a property rather than a field (SIMT's
    ``{wt_n}``): it is written, and read only as a check, for a string reads back only
    if the config it describes writes exactly that string again: one config, one name.

    Example:
        >>> n = Name("gemm_demo_{dtype}_{bm}x{bn}[_k{split}]")
        >>> n.fields
        ('dtype', 'bm', 'bn', 'split')
    """

    def __init__(self, pattern: str, **texts: Text):
        self.pattern = pattern
        self.texts = {"dtype": DTYPE, **texts}
        #: (format string, its fields, optional?) in order
        self.parts = [(p.strip("[]"), re.findall(r"\{(\w+)\}", p), p.startswith("["))
                      for p in re.split(r"(\[[^\]]*\])", pattern) if p]
        self.fields = tuple(f for _, fields, _ in self.parts for f in fields)
        self._re = re.compile("".join(f"(?:{self._regex(p)})?" if optional else self._regex(p)
                                      for p, _, optional in self.parts))

    def _text(self, field: str) -> Text:
        return self.texts.get(field, NUMBER)

    def _regex(self, part: str) -> str:
        return "".join(f"(?P<{piece[1:-1]}>{self._text(piece[1:-1]).pattern})"
                       if piece.startswith("{") else re.escape(piece)
                       for piece in re.split(r"(\{\w+\})", part))

    def write(self, config) -> str:
        """The name of `config`."""
        defaults = type(config).__dataclass_fields__
        return "".join(
            part.format_map({f: self._text(f).write(getattr(config, f)) for f in fields})
            for part, fields, optional in self.parts
            if not optional or getattr(config, fields[0]) != defaults[fields[0]].default)

    def read(self, cls: type, name: str):
        """The config of type `cls` that `name` names; UsageError for any other string."""
        text = str(name).strip()
        m = self._re.fullmatch(text)
        if m is None:
            raise UsageError(f"{name!r} is not a gemm-tune kernel name of the form "
                             f"{self.pattern}")
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        config = cls(**{f: self._text(f).read(v) for f, v in m.groupdict().items()
                        if v is not None and f in init})
        if self.write(config) != text:
            raise UsageError(f"{name!r} is not a gemm-tune kernel name: its fields make "
                             f"{self.write(config)!r}")
        return config


class Named:
    """``name`` and ``from_name`` of a config class from its ``NAME``, a :class:`Name`."""

    NAME: Name

    @functools.cached_property
    def name(self) -> str:
        """The procedural name, encoding every field: it names files, caches and logs
        (written once per config: configs are frozen, and the search names each often)."""
        return self.NAME.write(self)

    @classmethod
    def from_name(cls, name: str):
        """Inverse of :attr:`name`; UsageError for a string that is not such a name."""
        return cls.NAME.read(cls, name)


#: splits a cluster reduction takes: the blocks of a tile are one portable thread-block
#: cluster (at most 8)
CLUSTER_SPLITS = (2, 4, 8)


def split_k_reasons(c, a: ArchLimits, splits: tuple, reduces: tuple) -> list[str]:
    """Why config `c`'s split-K (its ``split`` slices and how their ``reduce`` sums them)
    cannot be built for `a`, of a family that takes `splits` and `reduces`."""
    why = []
    if c.split not in splits:
        why.append(f"split-K {c.split} is not one of {', '.join(map(str, splits))}")
    if c.reduce not in reduces:
        why.append(f"split-K reduce {c.reduce!r} is not one of {', '.join(reduces)}")
    elif c.reduce == "cluster":
        if c.split not in CLUSTER_SPLITS:
            why.append(f"a cluster split-K takes {', '.join(map(str, CLUSTER_SPLITS))} "
                       f"slices (a portable cluster size), not {c.split}")
        if a.cc < 90:
            why.append(f"a cluster split-K needs thread-block clusters (sm_90 or newer); "
                       f"{a.sm} has none")
    elif c.reduce == "last" and c.split == 1:
        why.append("a last-block split-K needs a split of 2 or more, not 1")
    return why


class SplitK:
    """How a config with ``split`` K slices and a ``reduce`` mode ("pass", "last", ...)
    sums them, as the runner (tuner.runtime.runners.Runner) asks."""

    split: int
    reduce: str

    @property
    def last(self) -> bool:
        """Split-K summed by the last block of each tile (one launch, workspace + tickets)."""
        return self.split > 1 and self.reduce == "last"

    @property
    def reduce_pass(self) -> bool:
        """Does a launch end with the <name>_reduce kernel?"""
        return self.split > 1 and self.reduce == "pass"

    @property
    def has_workspace(self) -> bool:
        """Do the partial tiles go through a workspace in global memory (pass or last)?"""
        return self.reduce_pass or self.last


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def widest(n: int, *also: int) -> int:
    """The widest of 4, 2, 1 floats that divides n and every value in `also`."""
    return next(v for v in (4, 2, 1) if n % v == 0 and all(a % v == 0 for a in also))


# ---- shape rules (split-K) ------------------------------------------------------------
def wants_split(config, shape: Shape, arch: ArchLimits) -> bool:
    """Split-K is searched only where the M x N tiles alone leave SMs idle."""
    m, n, _ = shape
    return cdiv(m, config.bm) * cdiv(n, config.bn) < max(arch.sm_count, 1)


def shape_reasons(config, shape: Shape, arch: ArchLimits) -> list[str]:
    """Reasons a buildable config is pointless for this shape (rejected before compiling)."""
    m, n, k = shape
    why = []
    if config.split > 1:
        tiles = cdiv(m, config.bm) * cdiv(n, config.bn)
        if not wants_split(config, shape, arch):
            why.append(f"split-K {config.split} is not needed: {tiles} tiles already cover "
                       f"the {arch.sm_count} SMs")
        if config.split > cdiv(k, config.bk):
            why.append(f"split-K {config.split} exceeds the {cdiv(k, config.bk)} K tiles")
    return why


# ---- the epilogue and the layout, as every family reads them ------------------------------
@dataclasses.dataclass(frozen=True)
class Variant:
    """What a problem asks of a kernel beyond its input type and shape: how A and B are
    stored, C's type, the bias and the activation (the config fields EPILOGUE_NAME
    writes). The default is the plain problem: NN, fp32 C, no bias, no activation.

    Example:
        >>> v = Variant(Layout.NT, DType.F16, "out", "gelu")
        >>> v.key, Variant.from_key(v.key) == v
        ('nt|f16|out|gelu', True)
    """

    layout: Layout = Layout.NN
    out: DType = DType.F32
    bias: str = "none"
    act: str = "none"

    @property
    def key(self) -> str:
        """The variant as text: part of cache keys, library entries and dispatch keys."""
        return f"{self.layout.value}|{self.out.short}|{self.bias}|{self.act}"

    @classmethod
    def from_key(cls, key: str) -> "Variant":
        layout, out, bias, act = key.split("|")
        return cls(Layout(layout), DType.from_short(out), bias, act)

    @property
    def plain(self) -> bool:
        """The default variant (what every family's template has always done)?"""
        return self == Variant()

    @classmethod
    def of(cls, config) -> "Variant":
        """The variant a config builds."""
        return cls(config.layout, config.out, config.bias, config.act)

    def apply(self, config):
        """`config` building this variant (its other fields as they are); a config of a
        family without the epilogue fields is returned as is when this is the plain one."""
        if Variant.of(config) == self:
            return config
        return dataclasses.replace(config, layout=self.layout, out=self.out, bias=self.bias,
                                   act=self.act)


def epilogue_reasons(config) -> list[str]:
    """Reasons the output type, bias and activation of `config` are not buildable."""
    why = []
    if config.out not in OUT_DTYPES:
        why.append(f"C cannot be {config.out.short}: it is one of "
                   f"{', '.join(d.short for d in OUT_DTYPES)}")
    if config.bias not in BIASES:
        why.append(f"bias {config.bias!r} is not one of {', '.join(BIASES)}")
    elif config.bias == "f32" and config.out is DType.F32:
        why.append("an fp32 bias with fp32 C is bias='out'")
    if config.act not in ACTIVATIONS:
        why.append(f"activation {config.act!r} is not one of {', '.join(ACTIVATIONS)}")
    return why


_CPP_OUT = {DType.F32: "float", DType.F16: "__half", DType.BF16: "__nv_bfloat16"}


def epilogue_values(config) -> dict:
    """The template values of the layout and the epilogue (the epilogue_helpers macro's
    arguments, and A_COL / B_COL: A or B column-major)."""
    out = _CPP_OUT.get(config.out, "float")
    return dict(
        A_COL=config.layout in (Layout.TN, Layout.TT),
        B_COL=config.layout in (Layout.NT, Layout.TT),
        LAYOUT=config.layout.value,
        OUT=config.out.short, OUT_T=out,
        BIAS=config.bias != "none", BIAS_T=out if config.bias == "out" else "float",
        ACT=config.act,
    )


# ---- checks every family makes (the sentences are part of the interface) ----------------
def positive_sizes(**sizes: int) -> list[str]:
    """["tile sizes must be positive (BM=0)"] where any size is below 1."""
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    return [f"tile sizes must be positive ({', '.join(bad)})"] if bad else []


def threads_reasons(threads: int, a: ArchLimits) -> list[str]:
    if threads > a.max_threads_per_block:
        return [f"{threads} threads per block exceeds the limit of {a.max_threads_per_block}"]
    return []


def stages_reasons(stages: int, a: ArchLimits, cp_async_from: int) -> list[str]:
    """Stages within 1..MAX_STAGES, and cp.async (sm_80+) from `cp_async_from` stages on."""
    if not 1 <= stages <= MAX_STAGES:
        return [f"stages={stages} is outside 1..{MAX_STAGES}"]
    if stages >= cp_async_from and not a.has_cp_async:
        return [f"cp.async stages ({stages}) need sm_80 or newer; {a.sm} has none"]
    return []


def swizzle_reasons(swizzle: int) -> list[str]:
    return [f"swizzle group {swizzle} must be at least 1"] if swizzle < 1 else []


def smem_reasons(smem: int, a: ArchLimits) -> list[str]:
    if smem > a.smem_per_block_optin:
        return [f"shared memory {smem} B exceeds the {a.smem_per_block_optin} B per-block "
                f"limit of {a.sm}"]
    return []
