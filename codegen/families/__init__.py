"""The kernel families and their registry.

A family is one kernel design (SIMT CUDA cores, WMMA tensor cores, ...): one module
under codegen/families/ and one template under templates/. The module holds all of it
- the config, its validation, its search space, its template values - and registers a
:class:`FamilySpec` on import; everything outside (rendering, checking, the search
space, the model's bound, the precision gate, the dry run) asks the spec found by
:func:`family_of`, never the config's type. As in CUTLASS's generator, operations are
data and each kind brings its own emitter.

What a family module ``codegen/families/<name>.py`` provides:

* A config: a frozen dataclass (mix in ``_common.Serial`` for ``to_dict`` /
  ``from_dict``) with ``dtype: DType``, ``family`` (defaulting to its ``Family``
  member; a family registered from outside uses its plain name) and ``layout: Layout``
  fields, and:

  - ``name``: the procedural name ``gemm_<family>_<dtype>_...`` encoding every field
    (STYLE 3), and ``from_name(name)``, its inverse (``UsageError`` otherwise): both
    follow from one declaration, ``NAME = _common.Name("gemm_<family>_{dtype}_...")``,
    a pattern over the fields, with the ``_common.Named`` mixin (tests/test_names.py
    pins what they write);
  - ``template_values()``: every value its template uses (STYLE 5);
  - the launch interface the runner, the library and the model read: ``threads``,
    ``smem_bytes``, ``bm``, ``bn``, ``bk``, ``split``, ``reduce_pass``, ``last``,
    ``cluster``, ``has_workspace``, ``aligned_operands`` (which of A, B, C must be
    16-byte aligned; ``_common.Serial`` says none) and ``takes(m, n, k, align)`` (can it
    run that problem on operands of that alignment class), ``grid(m, n)``, ``block()``,
    ``workspace_floats(m, n)``, ``ticket_count(m, n)`` (a family without split-K
    returns 1 / False / 0 for those).

* ``check(config, arch) -> list[str]``: every reason it cannot be built, as sentences
  with numbers (``_common`` has the helpers for the limits all families share).

* The search space: ``space``, the searched values of each parameter (data; its size
  is reported), and, duck-typed so that codegen never imports optuna,
  ``suggest(trial, dtype, shape, arch) -> config`` calling only
  ``trial.suggest_categorical`` (parameter names unique to the family, e.g. prefixed
  ``<family>_``, so that each name keeps one distribution in a mixed study),
  ``params_of(config, shape, arch) -> dict``, its inverse, and
  ``valid_configs(arch, dtype, shape) -> Iterator[config]``, every searched point
  ``check`` accepts, in grid order (shape may be None).

* ``dtypes``: the requests it serves, request dtype -> the dtype of its configs (the
  CUDA-core family serves a tf32 request with fp32 kernels); ``min_cc`` / ``max_cc``:
  the compute capabilities it runs on; ``default(dtype, variant=None)``: the config it
  recommends before tuning (for the variant, if given: the tuner builds it as that variant).

* ``math``: CUDA cores or tensor cores - the model's peak and the precision gate follow
  from it - and ``issue_efficiency(config)``, the fraction of issue slots its inner loop
  gives to math (the model's bound; 1.0 where the math has a pipe of its own).

* Optionally ``micro_tile`` (the model's instruction and register count of a register
  micro-tile, see :class:`FamilySpec`), ``serial_epilogue_clk`` (the model's clocks of
  an epilogue the math waits for), ``arch_efficiency`` (the share of an arch's peak the
  family can reach), ``shape_reasons(config, shape, arch)``, the
  family's own reasons a config cannot run the tuner's dense problem at a shape (the
  wgmma family: TMA's 16-byte strides), and ``runner``, "module:Class" of its runner in the run path where the plain
  one (tuner.runtime.runners.Runner: one cuLaunchKernel, split-K) does not do (the wgmma
  family: tensor maps and a cluster launch, tuner.runtime.runners.TmaRunner).

Then: a member of :class:`Family` here, an import at the bottom of this file, and a
template ``templates/gemm_<family>.cu.j2``. Nothing else changes. A family registered
from outside (a plugin, a test) works without a ``Family`` member: the registry is keyed
by the plain name, and a ``Family`` member equals its name.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Callable, Iterator, Mapping, Protocol

from codegen.arch import ArchLimits
from codegen.errors import GemmTuneError, UsageError
from codegen.families._common import DType, Layout, Shape

__all__ = ["Family", "Math", "Config", "FamilySpec", "FAMILIES", "register", "family_of",
           "config_from_name", "config_from_dict", "families_for", "DType", "Layout", "Shape"]


class Family(str, enum.Enum):
    """The built-in families, by name. A str enum: ``Family.SIMT == "simt"``, so a family
    registered from outside, known only by its name, sits beside these as a key."""

    SIMT = "simt"  # CUDA cores, FP32 FMAs
    WMMA = "wmma"  # tensor cores through nvcuda::wmma, FP32 accumulation
    WGMMA = "wgmma"  # Hopper: TMA + mbarriers + warp-specialised wgmma (codegen/families/wgmma.py)
    DECODE = "decode"  # M <= 64 at the DRAM roof: B streamed once, split-K (codegen/families/decode.py)

    @property
    def template(self) -> str:
        return FAMILIES[self.value].template


class Math(enum.Enum):
    """Where a family's multiply-adds run: sets the model's peak and the precision gate."""

    CUDA_CORE = "cuda-core"  # FP32 FMAs (inputs widened exactly): fp32 peak, fp32 gate
    TENSOR_CORE = "tensor-core"  # MMA on the input type, FP32 accumulation: tensor peak

    def peak_tflops(self, dtype: DType, arch: ArchLimits) -> float:
        """The device's peak for this kind of math on `dtype` inputs."""
        if self is Math.TENSOR_CORE:
            return arch.peak_tensor_tflops(dtype)
        return arch.peak_fp32_tflops


class Config(Protocol):
    """What the rest of gemm-tune reads from any family's config (see the module doc)."""

    dtype: DType
    layout: Layout
    bm: int
    bn: int
    bk: int
    split: int

    @property
    def name(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def smem_bytes(self) -> int: ...
    def template_values(self) -> dict: ...
    def to_dict(self) -> dict: ...
    def grid(self, m: int, n: int) -> tuple[int, int, int]: ...
    def block(self) -> tuple[int, int, int]: ...


def _full_issue(config: Any) -> float:
    return 1.0


def _full_rate(config: Any, arch: ArchLimits) -> float:
    return 1.0


def _no_shape_rules(config: Any, shape: Shape, arch: ArchLimits) -> list[str]:
    return []


def _no_serial_epilogue(config: Any, extra_per_output: float, fill_clk: float) -> float:
    return 0.0


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """One kernel family, as data (see the module doc for what each part must do)."""

    name: str  # "simt": names start gemm_<name>_; to_dict()["family"]
    config: type  # the config dataclass
    template: str | None  # under templates/; None for a family that renders no source
    check: Callable[[Any, ArchLimits], list[str]]
    dtypes: Mapping[DType, DType]  # request dtype -> its configs' dtype
    math: Math
    space: Mapping[str, tuple]  # searched values per parameter
    suggest: Callable[..., Any]  # (trial, dtype, shape, arch) -> config
    params_of: Callable[[Any, Shape, ArchLimits], dict]
    valid_configs: Callable[[ArchLimits, DType, Shape | None], Iterator[Any]]
    default: Callable[..., Any]  # (dtype, variant=None) -> config
    issue_efficiency: Callable[[Any], float] = _full_issue
    #: ``arch_efficiency(config, arch)``: the share of the math's peak on `arch` that the
    #: family's instructions can reach at all (WMMA's mma.sync on Hopper, whose tensor peak
    #: is wgmma's); the model's bound is multiplied by it and its predicted time divided
    #: (every term: the family's own candidates keep their order). 1 by default
    arch_efficiency: Callable[[Any, ArchLimits], float] = _full_rate
    min_cc: int = 0
    max_cc: int = 10_000
    searched: bool = True  # False: buildable and tested, not yet a candidate of the search
    #: the operand layouts its template reads (others are refused by check, with a reason)
    layouts: frozenset = frozenset({Layout.NN})
    #: True: its template writes C in any of _common.OUT_DTYPES and applies the bias and
    #: the activation (the config's out, bias, act); False: FP32 C, no epilogue (others
    #: are refused by check, with a reason)
    epilogue: bool = False
    #: the search does not time a candidate the model predicts more than this many times
    #: slower than the best measured: at least the most the model has underestimated a
    #: kernel of the family, plus headroom (the default is the CUDA-core family's, from 9
    #: recorded fp32 studies: see tuner/model.py)
    prune_margin: float = 1.25
    #: reasons of the family's own why a buildable config cannot run the tuner's problem at
    #: `shape` (dense row-major operands): rejected before compiling, never timed
    shape_reasons: Callable[[Any, Shape, ArchLimits], list[str]] = _no_shape_rules
    #: "module:Class" of the runner that launches this family's kernels, in the run path
    #: (Class(config, cubin); see tuner/runtime/runners.py), used by the tuner's timing and
    #: the library alike; None: tuner.runtime.runners.Runner (one cuLaunchKernel, split-K)
    runner: str | None = None
    #: True: each thread accumulates an RM x RN register micro-tile with FMAs, its A and B
    #: fragments in `frags` sets (the SIMT design; fields rm, rn, frags, vec, pad, stages,
    #: property tile_regs): the model counts its instructions and registers from them.
    #: False: the model takes its FLOP at the peak over its issue efficiency, its registers
    #: unknown until compiled
    micro_tile: bool = False
    #: ``serial_epilogue_clk(config, extra_per_output, fill_clk)``: clocks per tile in which
    #: the math units idle for the epilogue (and, where a tile's block starts cold, the
    #: ring's first fill of `fill_clk`), added to a wave of one block per SM; the model
    #: (tuner/model.py) calls it with the epilogue's extra instructions per output (bias,
    #: activation, conversion). 0: the family's epilogue overlaps its math, or is counted
    #: in its issue (the default)
    serial_epilogue_clk: Callable[[Any, float, float], float] = _no_serial_epilogue
    #: True: a skinny kernel whose warps stream B from DRAM into registers (the decode
    #: family: fields mt, bn, warps, b_in_flight, kc, wk, bnw, a_loads, math, split,
    #: reduce): the model times it by its bytes in flight per SM (tuner/model.py,
    #: "the streaming model") instead of the tiled terms
    streams_b: bool = False

    @property
    def prefix(self) -> str:
        return f"gemm_{self.name}_"

    def variant_reasons(self, variant) -> list[str]:
        """Why this family cannot build `variant` (a _common.Variant: the layout, C's type,
        bias and activation) per what it declares; empty when it can. codegen.check and the
        search both ask this."""
        why = []
        if variant.layout not in self.layouts:
            why.append(f"the {self.name} template reads "
                       f"{', '.join(sorted(x.value for x in self.layouts))} operands, not "
                       f"{variant.layout.value}")
        if not self.epilogue and (variant.out, variant.bias, variant.act) != (
                DType.F32, "none", "none"):
            why.append(f"the {self.name} template writes fp32 C with no bias or activation")
        return why

    def serves(self, dtype: DType, arch: ArchLimits | None = None) -> bool:
        """Does a request in `dtype` (on `arch`, if given) search this family?"""
        return self.searched and dtype in self.dtypes and (
            arch is None or self.min_cc <= arch.cc <= self.max_cc)

    def space_size(self) -> int:
        n = 1
        for values in self.space.values():
            n *= len(values)
        return n


#: name -> spec, in registration order (the grid walks families in this order)
FAMILIES: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family. Its name (lower-case letters and digits, so that no family's name
    prefix gemm_<name>_ starts another's) and its config type must be new
    (GemmTuneError otherwise)."""
    if not re.fullmatch(r"[a-z][a-z0-9]*", spec.name):
        raise GemmTuneError(f"family name {spec.name!r} is not lower-case letters and digits")
    clash = [s.name for s in FAMILIES.values() if s.name == spec.name or s.config is spec.config]
    if clash:
        raise GemmTuneError(f"family {spec.name!r} clashes with the registered {clash[0]!r}")
    FAMILIES[spec.name] = spec
    return spec


def family_of(config: Any) -> FamilySpec:
    """The spec of `config`'s family (by its type); GemmTuneError for anything else."""
    for spec in FAMILIES.values():
        if type(config) is spec.config:
            return spec
    raise GemmTuneError(f"{type(config).__name__} is not the config of a registered family "
                        f"({', '.join(FAMILIES)})")


def config_from_name(name: str):
    """The config a procedural name names, by its family prefix; UsageError otherwise.

    Example:
        >>> config_from_name("gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8").bm
        128
    """
    text = str(name).strip()
    for spec in FAMILIES.values():
        if text.startswith(spec.prefix):
            return spec.config.from_name(text)
    raise UsageError(f"{name!r} is not a gemm-tune kernel name (families: "
                     f"{', '.join(FAMILIES)})")


def config_from_dict(d: dict):
    """A config from its to_dict(), by its "family" (UsageError for an unknown one)."""
    name = d.get("family")
    spec = FAMILIES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise UsageError(f"unknown kernel family {d.get('family')!r} (families: "
                         f"{', '.join(FAMILIES)})")
    return spec.config.from_dict(d)


def families_for(dtype: DType, arch: ArchLimits | None = None) -> list[FamilySpec]:
    """The families a request in `dtype` searches (on `arch`, if given), in order."""
    return [s for s in FAMILIES.values() if s.serves(dtype, arch)]


# The built-in families: each module registers its spec on import. A new family adds
# its module here (and its member to Family above).
from codegen.families import simt as _simt  # noqa: E402,F401
from codegen.families import wmma as _wmma  # noqa: E402,F401
from codegen.families import wgmma as _wgmma  # noqa: E402,F401
from codegen.families import decode as _decode  # noqa: E402,F401
