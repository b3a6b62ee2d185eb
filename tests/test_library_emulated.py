"""The committed library's kernels, as it ships them (artifacts/library/kernels/*.cu, not
today's template), compute their product on the CPU: each family's emulation
(tests/_emulation.py, tests/_wgmma_emulation.py) compiles the shipped source for the host
and runs it, the wgmma kernels launched by today's runner (its grids, tensor maps and
arguments). A change to a runner or a kernel's interface that the library's older kernels
do not follow fails here, before a GPU runs them. A subset holding every value of every
field of each family's shipped kernels (tests/_sample.covering) keeps the time down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _emulation import build as build_simt
from _emulation import emulate, emulation_source
from _sample import covering
from _wgmma_emulation import build as build_wgmma
from _wgmma_emulation import emulation_source as wgmma_source
from _wgmma_emulation import kernels_of, run

from codegen.config import config_from_name
from codegen.families import Family

LIBRARY = Path(__file__).resolve().parent.parent / "artifacts" / "library"
GATE = {"f32": 1e-6, "f16": 1e-6 + 2.0 ** -11, "bf16": 1e-6 + 2.0 ** -8}


def _shipped() -> list:
    """(config, its shipped source) of a covering subset of each family's kernels in the
    committed library."""
    manifest = json.loads((LIBRARY / "manifest.json").read_text())
    by_family: dict = {}
    for key in manifest["kernels"]:
        cfg = config_from_name(key.split("/")[-1])
        by_family.setdefault(cfg.family, []).append(cfg)
    picked = [c for cfgs in by_family.values() for c in covering(sorted(cfgs, key=str))]
    return [(c, (LIBRARY / "kernels" / "sm_90" / f"{c.name}.cu").read_text()) for c in picked]


SHIPPED = _shipped()


def test_the_library_ships_kernels_of_three_families():
    assert {c.family for c, _ in SHIPPED} == {Family.SIMT, Family.DECODE, Family.WGMMA}


def _shape(cfg) -> tuple[int, int, int]:
    """A tile and a part in M and N (edges; no more blocks than that needs: each emulated
    thread is a sanitised std::thread), K not a whole number of k-tiles."""
    tile_m = getattr(cfg, "mt", None) or cfg.bm
    n = cfg.bn + 3
    if getattr(cfg, "store", 0):  # TMA stores: whole 16 bytes of C a row
        n = -(-n // (16 // cfg.out.size)) * (16 // cfg.out.size)
    return tile_m + 1, n, 150


@pytest.mark.parametrize("cfg,src", SHIPPED, ids=[c.name for c, _ in SHIPPED])
def test_a_shipped_kernel_computes_its_product_on_the_cpu(cfg, src, tmp_path):
    """Edges in M, N and K, beta on; a batch of 2 sharing B for the wgmma kernels."""
    gate = GATE[cfg.out.short] + (1e-5 if cfg.dtype.short == "tf32" else 0.0)
    if cfg.family is Family.WGMMA:
        exe = build_wgmma(cfg, tmp_path, wgmma_source(cfg, kernels_of(cfg), src))
        err, untouched = run(exe, cfg, _shape(cfg), tmp_path, beta=0.5, land="eager")
        assert err <= gate and untouched, err
        err, untouched = run(exe, cfg, (cfg.bm + 1, cfg.bn, 70), tmp_path, batch=2,
                             shared_b=True, sms=2, seed=1)
    else:
        exe = build_simt(cfg, tmp_path, emulation_source(cfg, src))
        err, untouched = emulate(exe, cfg, _shape(cfg), tmp_path, beta=0.5)
    assert err <= gate and untouched, err
