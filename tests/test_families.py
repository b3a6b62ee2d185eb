"""The family registry: every family round-trips name <-> config <-> dict and its trial
parameters; and a family registered from outside (a toy, here) is picked up by names,
dicts, check, render, the search space, the model and the precision gate without any
other module knowing of it."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re

import optuna
import pytest

from codegen import DType, GemmTuneError, UsageError, check, parse_arch, render
from codegen.config import DEFAULT_CONFIG, DEFAULT_WMMA, Family, KernelConfig, \
    config_from_dict, config_from_name
from codegen.families import (
    FAMILIES, FamilySpec, Math, families_for, family_of, register,
)
from codegen.families._common import Layout, Serial, positive_sizes

ARCH = parse_arch("sm_90")
SHAPE = (127, 129, 4097)  # few tiles, deep K: split-K variants are in the space
ALIGNED = (127, 136, 4096)  # the same for a family that needs 16-byte rows (TMA: wgmma)
SKINNY = (17, 129, 4097)  # a few rows, for a family of M <= 64 only (decode)


def _shape(spec: FamilySpec, dtype: DType) -> tuple:
    d = spec.default(spec.dtypes[dtype])
    return next(s for s in (SHAPE, ALIGNED, SKINNY) if not spec.shape_reasons(d, s, ARCH))


# ---- every registered family ------------------------------------------------------------
def _sample(spec: FamilySpec, dtype: DType, n: int = 25) -> list:
    pool = list(itertools.islice(spec.valid_configs(ARCH, spec.dtypes[dtype],
                                                    _shape(spec, dtype)), 4000))
    return random.Random(7).sample(pool, min(n, len(pool)))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_round_trips_names_dicts_and_parameters(name):
    spec = FAMILIES[name]
    assert spec.dtypes, f"{name} serves no dtype"
    for dtype in spec.dtypes:
        configs = _sample(spec, dtype)
        assert configs, f"{name} has no valid {dtype.short} config on sm_90"
        for c in configs:
            assert family_of(c) is spec and type(c) is spec.config
            assert c.name.startswith(spec.prefix) and c.to_dict()["family"] == spec.name
            assert c.dtype is spec.dtypes[dtype]
            assert config_from_name(c.name) == c
            assert config_from_dict(c.to_dict()) == c
            assert spec.config.from_name(c.name) == c
            assert check(c, ARCH) == []
            shape = _shape(spec, dtype)
            assert spec.shape_reasons(c, shape, ARCH) == []
            trial = optuna.trial.FixedTrial(spec.params_of(c, shape, ARCH))
            assert spec.suggest(trial, c.dtype, shape, ARCH) == c


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_states_its_parts(name):
    spec = FAMILIES[name]
    assert spec.name == name and re.fullmatch(r"[a-z][a-z0-9]*", name)
    assert spec.template is None or spec.template == f"gemm_{name}.cu.j2"
    assert isinstance(spec.math, Math) and spec.space_size() >= 1
    for dtype in spec.dtypes:
        d = spec.default(spec.dtypes[dtype])
        assert family_of(d) is spec and check(d, ARCH) == []
        assert 0 < spec.issue_efficiency(d) <= 1


def test_built_in_families_and_compatibility_names():
    assert list(FAMILIES)[:2] == ["simt", "wmma"]  # the grid walks them in this order
    assert family_of(DEFAULT_CONFIG) is FAMILIES["simt"] and Family.SIMT == "simt"
    assert family_of(DEFAULT_WMMA) is FAMILIES["wmma"] and Family.WMMA.template == \
        "gemm_wmma.cu.j2"
    assert FAMILIES["simt"].math is Math.CUDA_CORE and FAMILIES["wmma"].math is Math.TENSOR_CORE
    assert [s.name for s in families_for(DType.F32)] == ["simt"]  # tf32 only by consent
    assert [s.name for s in families_for(DType.BF16)] == ["simt", "wmma", "wgmma", "decode"]
    assert [s.name for s in families_for(DType.F16, parse_arch("sm_80"))] == [
        "simt", "wmma", "decode"]


def test_the_simt_space_holds_the_main_loop_parameters():
    """Micro-tiles of 16 only as 16x8 and 8x16 (RN16), the interior path only in the
    register-staged loop (paired: 2 stages); each round-trips its trial parameters."""
    spec = FAMILIES["simt"]
    grid = list(spec.valid_configs(ARCH, DType.F32, None))
    tiles = {(c.rm, c.rn) for c in grid}
    assert {(16, 8), (8, 16)} <= tiles and not {(16, 4), (4, 16), (2, 16), (16, 16)} & tiles
    assert {(c.stages, c.interior) for c in grid} == {
        (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0), (4, 0)}
    assert len(grid) == len(set(grid)) == 11830
    big = (4096, 4096, 4096)
    for name in ("gemm_simt_f32_128x256x8_r8x16_w8x4_p0_v4_s2_g1_sw_i2",
                 "gemm_simt_f32_256x128x8_r16x8_w4x8_p0_v4_s2_g1_sw_i1",
                 "gemm_simt_f32_128x128x8_r8x8_w16x2_p0_v4_s2_g1_sw",
                 "gemm_simt_f32_64x128x16_r4x8_w8x4_p0_v4_s3_g1"):
        c = config_from_name(name)
        assert c in grid
        trial = optuna.trial.FixedTrial(spec.params_of(c, big, ARCH))
        assert spec.suggest(trial, DType.F32, big, ARCH) == c


def test_unknown_names_dicts_and_types_are_refused():
    with pytest.raises(UsageError, match="is not a gemm-tune kernel name"):
        config_from_name("gemm_nope_f32_1x1x1")
    with pytest.raises(UsageError, match="unknown kernel family 'nope'"):
        config_from_dict({**DEFAULT_CONFIG.to_dict(), "family": "nope"})
    with pytest.raises(GemmTuneError, match="not the config of a registered family"):
        check(object(), ARCH)
    with pytest.raises(GemmTuneError, match="clashes"):
        register(FAMILIES["simt"])
    with pytest.raises(GemmTuneError, match="letters and digits"):  # gemm_simt_x_ is gemm_simt_
        register(dataclasses.replace(FAMILIES["simt"], name="simt_x", config=object))


# ---- a fourth family, registered here and nowhere else ------------------------------------
@dataclasses.dataclass(frozen=True)
class ToyConfig(Serial):
    """A family of one parameter that renders nothing."""

    bm: int = 32
    bn: int = 32
    bk: int = 8
    dtype: DType = DType.F32
    family: str = "toy"
    layout: Layout = Layout.NN
    split = 1

    @property
    def name(self) -> str:
        return f"gemm_toy_{self.dtype.short}_{self.bm}x{self.bn}x{self.bk}"

    @classmethod
    def from_name(cls, name: str) -> "ToyConfig":
        m = re.fullmatch(r"gemm_toy_f32_(\d+)x(\d+)x(\d+)", name)
        if not m:
            raise UsageError(f"{name!r} is not a toy kernel name")
        return cls(*map(int, m.groups()))

    @property
    def threads(self) -> int:
        return 64

    @property
    def smem_bytes(self) -> int:
        return 0

    def template_values(self) -> dict:
        return dict(name=self.name, BM=self.bm)


def _toy_check(c: ToyConfig, a) -> list[str]:
    return positive_sizes(BM=c.bm) + ([f"BM={c.bm} is over 64"] if c.bm > 64 else [])


def _toy_valid(arch, dtype, shape=None):
    return (c for c in (ToyConfig(bm=v) for v in TOY_SPACE["toy_bm"]) if not _toy_check(c, arch))


TOY_SPACE = {"toy_bm": (32, 64, 128)}
TOY = FamilySpec(
    name="toy", config=ToyConfig, template=None, check=_toy_check,
    dtypes={DType.F32: DType.F32}, math=Math.CUDA_CORE, space=TOY_SPACE,
    suggest=lambda trial, dtype, shape, arch: ToyConfig(
        bm=trial.suggest_categorical("toy_bm", TOY_SPACE["toy_bm"])),
    params_of=lambda c, shape, arch: {"toy_bm": c.bm},
    valid_configs=_toy_valid, default=lambda dtype, variant=None: ToyConfig(),
    issue_efficiency=lambda c: 0.5,
)


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    del FAMILIES[TOY.name]


def test_a_registered_family_is_picked_up_everywhere(toy):
    from tuner.bench import tolerance
    from tuner.dryrun import defaults
    from tuner.model import bound_tflops, estimate_registers, likely_spills, \
        predict_before_compile
    from tuner.space import families, is_candidate, params_of, space_size, suggest, \
        valid_configs

    c = ToyConfig(bm=64)
    # names, dicts, check, render
    assert config_from_name(c.name) == c and config_from_dict(c.to_dict()) == c
    assert c.to_dict()["family"] == "toy" and family_of(c) is toy
    assert check(c, "sm_90") == [] and check(ToyConfig(bm=128), "sm_90") == ["BM=128 is over 64"]
    with pytest.raises(GemmTuneError, match="renders no source"):
        render(c)
    # the search space of an fp32 request: simt, then the toy
    assert families(DType.F32) == {Family.SIMT: DType.F32, "toy": DType.F32}
    assert families(DType.F16) == {Family.SIMT: DType.F16, Family.WMMA: DType.F16,
                                   Family.WGMMA: DType.F16, Family.DECODE: DType.F16}
    simt_only = FAMILIES["simt"].space_size()
    assert space_size(DType.F32) == simt_only + 3
    grid = list(valid_configs(ARCH, DType.F32, (4096, 4096, 4096)))
    assert grid[-2:] == [ToyConfig(bm=32), ToyConfig(bm=64)] and type(grid[0]) is KernelConfig
    assert is_candidate(c, DType.F32) and not is_candidate(c, DType.F16)
    for cfg in (c, KernelConfig()):
        p = params_of(cfg, DType.F32, SHAPE, ARCH)
        assert p["family"] == family_of(cfg).name
        assert suggest(optuna.trial.FixedTrial(p), DType.F32, SHAPE, ARCH) == cfg
    # the model's bound, the precision gate and the dry run's defaults
    bound, figures = bound_tflops(c, (4096, 4096, 4096), ARCH)
    assert figures["issue_eff"] == 0.5 and figures["peak"] == round(ARCH.peak_fp32_tflops, 2)
    assert tolerance(c, 65536) == 1e-5  # CUDA-core math: fp32's gate
    # no register micro-tile declared (FamilySpec.micro_tile): the model's FLOP-rate path
    assert estimate_registers(c) == 128 and not likely_spills(c, ARCH)
    assert predict_before_compile(c, (4096, 4096, 4096), ARCH).seconds > 0
    assert ToyConfig() in defaults(DType.F32, ARCH)


def test_a_mixed_study_asks_for_the_registered_family(toy):
    from tuner.space import suggest

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        seen.add(family_of(suggest(trial, DType.F32, (4096, 4096, 4096), ARCH)).name)
        study.tell(trial, 1.0)
    assert seen == {"simt", "toy"}


def test_unregistered_toy_leaves_no_trace():
    assert "toy" not in FAMILIES
    with pytest.raises(UsageError):
        config_from_name("gemm_toy_f32_32x32x8")


def test_families_need_no_other_module_than_their_own():
    """A family module imports codegen only (never tuner, never optuna)."""
    import ast
    from pathlib import Path

    import codegen.families as fam

    for path in Path(fam.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in mods if m.split(".")[0] in ("tuner", "optuna", "pycuda")}, path


def test_the_search_and_the_model_ask_the_registry_not_a_family():
    """tuner's space, model, dry run and search know families only through the registry:
    no family module, no config type, no hasattr on a config."""
    import ast
    from pathlib import Path

    import tuner

    configs = {spec.config.__name__ for spec in FAMILIES.values()}
    for mod in ("space", "model", "dryrun", "search"):
        path = Path(tuner.__file__).parent / f"{mod}.py"
        tree = ast.parse(path.read_text())
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [n.module for n in froms if n.module.startswith("codegen.families.")
                    and n.module.rsplit(".", 1)[1] in FAMILIES], path
        assert not [a.name for n in froms for a in n.names if a.name in configs], path
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", None) == "hasattr"], path
