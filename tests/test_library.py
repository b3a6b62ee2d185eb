"""The tuned-kernel library on the CPU: manifest, integrity, dispatch, inspection (the export
bundle: tests/test_export.py)."""

import json

import pytest

from _library import BIG, SMALL, build
from codegen import DType, compile_config
from tuner import LibraryError, load_library
from tuner.cli import main
from tuner.runtime.library import SCHEMA
from tuner.runtime.manifest import Manifest


@pytest.fixture
def lib(tmp_path, compile_cache):
    return build(tmp_path / "library", compile_cache, tmp_path / "art")


def test_manifest_round_trip(lib):
    again = load_library(lib.path)
    m = again.manifest
    assert m["schema"] == SCHEMA
    assert set(m["kernels"]) == {f"sm_90/{BIG.name}", f"sm_90/{SMALL.name}"}
    assert [(e["m"], e["kernel"]) for e in m["entries"]] == [(4096, BIG.name), (512, SMALL.name)]
    for k in m["kernels"].values():
        for f in ("source", "cubin", "meta"):
            assert (lib.path / k[f]).is_file()


def test_the_committed_library_loads_with_every_file_as_its_manifest_records():
    """artifacts/library, as committed: every kernel's source, cubin and metadata present
    with the sha256 its manifest records (a recompile committed without its manifest is
    refused by load_library), and every entry's kernel among its kernels."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "artifacts" / "library"
    doc = json.loads((root / "manifest.json").read_text())
    lib = load_library(root)
    assert set(lib.manifest["kernels"]) == set(doc["kernels"]) and doc["kernels"]
    assert {e["kernel"] for e in doc["entries"]} <= {k.split("/", 1)[1] for k in doc["kernels"]}


def test_adding_the_same_shape_replaces_its_entry_and_keeps_the_replaced_one(
        lib, tmp_path, compile_cache, capsys):
    """A re-tune's entry replaces the shape's entry; the replaced entry is kept, with its
    kernel, as a candidate of the estimate and the first-use measurement, never of the
    exact rule; a later replacement of the same shape drops it (and its kernel, when
    nothing else uses that)."""
    import dataclasses

    from _library import entry
    from tuner.runtime.dispatch import FULL_ALIGN, exact_entry

    def add(cfg, tflops):
        res = compile_config(cfg, "sm_90", compile_cache, tmp_path / "art")
        assert res.ok, res.error
        lib.add(entry(cfg, res, (4096, 4096, 4096), tflops, 51.3),
                tmp_path / "art" / "sm_90" / f"{cfg.name}.cu", res.cubin)
        return load_library(lib.path)

    before = lib.fingerprint
    again = add(SMALL, 30.0)
    assert [(e["m"], e["kernel"]) for e in again.manifest["entries"]] == [
        (512, SMALL.name), (4096, SMALL.name)]
    assert [(e["m"], e["kernel"], e["tflops"]) for e in again.manifest["replaced"]] == [
        (4096, BIG.name, 46.1)]
    assert set(again.manifest["kernels"]) == {f"sm_90/{BIG.name}", f"sm_90/{SMALL.name}"}
    assert again.fingerprint != before
    assert main(["list", "--library", str(lib.path)]) == 0
    assert "and 1 replaced entries" in " ".join(capsys.readouterr().out.split())
    assert main(["inspect", BIG.name, "--library", str(lib.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tuned_for"] == [
        "4096x4096x4096 f32 (nn, C f32, none) on NVIDIA H200: 46.1 TFLOP/s, cuBLAS 51.3 "
        "(replaced there by a re-tune; kept as a first-use candidate)"]
    assert main(["inspect", BIG.name, "--profile", "--library", str(lib.path)]) == 2
    assert "kept only as a replaced entry's kernel" in capsys.readouterr().err
    # the exact rule sees the new entry alone; the ranking holds the replaced kernel too
    exact = exact_entry(again.store.serving(DType.F32, 90), (4096,) * 3, 1, FULL_ALIGN, None)
    assert exact["kernel"] == SMALL.name
    assert {e["kernel"] for _, e in again.ranked(4096, 4096, 4096, DType.F32, 90, 132)} \
        == {BIG.name, SMALL.name}
    # a second replacement keeps only the latest replaced entry; BIG, now used by nothing,
    # leaves the manifest and the disk
    third = dataclasses.replace(SMALL, stages=2)
    again = add(third, 35.0)
    assert [e["kernel"] for e in again.manifest["replaced"]] == [SMALL.name]
    assert set(again.manifest["kernels"]) == {f"sm_90/{SMALL.name}", f"sm_90/{third.name}"}
    assert not list((lib.path / "kernels" / "sm_90").glob(f"{BIG.name}.*"))
    # the same kernel again keeps what was replaced; a replaced kernel back as the winner
    # replaces the entry and is no longer kept as replaced
    assert [e["kernel"] for e in add(third, 36.0).manifest["replaced"]] == [SMALL.name]
    again = add(SMALL, 37.0)
    assert [e["kernel"] for e in again.manifest["replaced"]] == [third.name]
    assert [e["kernel"] for e in again.manifest["entries"]] == [SMALL.name, SMALL.name]


def test_a_kernel_that_would_not_load_again_is_refused_before_anything_is_written(
        lib, tmp_path, compile_cache):
    """An entry whose kernel does not validate (here tf32's register rows in pairs on the
    pre-pass kernel, which has no register operand) is refused at add, naming why, and the
    library stays as it was and loads: before, it was written and every later load failed."""
    import dataclasses

    from _library import entry
    from codegen.families.wgmma import _default

    bad = dataclasses.replace(_default(DType.TF32), prep=1, rs_pairs=1)
    res = compile_config(SMALL, "sm_90", compile_cache, tmp_path / "art")  # files never read
    before = (lib.path / "manifest.json").read_bytes()
    files = sorted(p.name for p in (lib.path / "kernels" / "sm_90").iterdir())
    with pytest.raises(LibraryError, match=r"does not validate for sm_90: rs_pairs=1: .*the "
                                           r"library is unchanged"):
        lib.add(entry(bad, res, (512, 512, 512), 300.0, 250.0, dtype="tf32"),
                tmp_path / "art" / "sm_90" / f"{SMALL.name}.cu", res.cubin)
    assert (lib.path / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in (lib.path / "kernels" / "sm_90").iterdir()) == files
    assert len(load_library(lib.path).manifest["entries"]) == 2


def test_tampered_cubin_is_refused_naming_it(lib):
    cubin = lib.path / lib.manifest["kernels"][f"sm_90/{BIG.name}"]["cubin"]
    data = bytearray(cubin.read_bytes())
    data[100] ^= 0xFF
    cubin.write_bytes(bytes(data))
    with pytest.raises(LibraryError, match=f"{cubin}.*does not match its sha256"):
        load_library(lib.path)


def test_truncated_source_is_refused(lib):
    src = lib.path / lib.manifest["kernels"][f"sm_90/{SMALL.name}"]["source"]
    src.write_text(src.read_text()[:100])
    with pytest.raises(LibraryError, match=str(src)):
        load_library(lib.path)


@pytest.mark.parametrize("mutate,msg", [
    (lambda t: t[: len(t) // 2], "is unreadable"),
    (lambda t: json.dumps(dict(json.loads(t), schema=SCHEMA + 1)), f"has schema {SCHEMA + 1}"),
    (lambda t: "[]", "is not a gemm-tune manifest"),
    (lambda t: t.replace('"bm": 256', '"bm": 100'), "does not validate"),
])
def test_bad_manifest_is_refused(lib, mutate, msg):
    path = lib.path / "manifest.json"
    path.write_text(mutate(path.read_text()))
    with pytest.raises(LibraryError, match=msg):
        load_library(lib.path)


def _first(t: str, part: str, change) -> str:
    """The manifest text `t` with its first entry ("entries") or kernel record ("kernels")
    changed by `change` (that dict -> the new one)."""
    data = json.loads(t)
    if part == "entries":
        data["entries"][0] = change(data["entries"][0])
    else:
        key = next(iter(data["kernels"]))
        data["kernels"][key] = change(data["kernels"][key])
    return json.dumps(data)


def _without(field):
    return lambda d: {k: v for k, v in d.items() if k != field}


def _with(**kw):
    return lambda d: dict(d, **kw)


@pytest.mark.parametrize("part,change,msg", [
    ("entries", _without("m"), "entry 0 has no m"),
    ("entries", _without("gpu"), "entry 0 has no gpu"),
    ("entries", _with(m="4096"), "entry 0 has m '4096'"),
    ("entries", _with(m=0), "entry 0 has m 0"),
    ("entries", _with(k=2**40), "entry 0 has k 1099511627776"),
    ("entries", _with(tflops="fast"), "entry 0 has tflops 'fast'"),
    ("entries", _with(tflops=10**400), "entry 0 has tflops 1000"),  # no float holds it
    ("entries", _with(ratio=None), "entry 0 has ratio None"),
    ("entries", _with(cc="90"), "entry 0 has cc '90'"),
    ("entries", _with(layout="zz"), "entry 0 has layout 'zz'"),
    ("entries", _with(out="f64"), "entry 0 has out 'f64'"),
    ("entries", _with(batch=-3), "entry 0 has batch -3"),
    ("entries", _with(bias="weird"), "entry 0 has bias 'weird'"),
    ("entries", lambda d: 5, "entry 0 is a int, not an entry"),
    ("kernels", _without("cubin"), "has cubin None: a path inside the library is needed"),
    ("kernels", _with(source="../precious.txt"), "has source '../precious.txt': a path inside"),
    ("kernels", _with(source="/etc/passwd"), "has source '/etc/passwd': a path inside"),
    ("kernels", _with(cubin=5), "has cubin 5"),
    ("kernels", _with(config="x"), "has config 'x'"),
    ("kernels", _with(arch="sm_xx"), "is filed under .* but names sm_xx/"),
    ("kernels", lambda d: 5, "is a int, not a kernel record"),
])
def test_a_hand_edited_manifest_is_one_error_naming_what(lib, part, change, msg):
    """Entries and kernel records are checked field by field when a library loads (they had
    passed and crashed a later explain, list or report with KeyError, TypeError or
    ZeroDivisionError; a kernel's file outside the library was read, and written by
    upgrade)."""
    path = lib.path / "manifest.json"
    path.write_text(_first(path.read_text(), part, change))
    for verify in (True, False):
        with pytest.raises(LibraryError, match=msg) as e:
            Manifest.load(lib.path, verify=verify)
        assert "\n" not in str(e.value)


def test_missing_library_is_one_error(tmp_path):
    with pytest.raises(LibraryError, match="no library at"):
        load_library(tmp_path / "nowhere")


def test_dispatch_exact_estimate_and_cublas(lib):
    # BIG was tuned at 4096^3 at 0.90x cuBLAS in the same run: cuBLAS runs there
    exact = lib.select(4096, 4096, 4096, DType.F32, 90, 132)
    assert (exact.kernel, exact.rule) == (None, "exact") and "0.90x" in exact.reason
    # ... unless the operands are misaligned (then the rule measures) or from another GPU
    assert lib.select(4096, 4096, 4096, DType.F32, 90, 132, aligned=False).rule == "estimate"
    assert lib.select(4096, 4096, 4096, DType.F32, 90, 132, gpu="NVIDIA H100").rule \
        == "estimate"
    # A skinny problem: the big tile would compute 16 rows of 256 and fill 32 of 132 SMs;
    # the small kernel's estimate beats cuBLAS's (scaled from the nearest entry's figure)
    skinny = lib.select(16, 4096, 4096, DType.F32, 90, 132)
    assert (skinny.kernel, skinny.rule) == (SMALL.name, "estimate")
    est = dict((e["kernel"], t) for t, e in lib.ranked(16, 4096, 4096, DType.F32, 90, 132))
    assert skinny.estimate_tflops == est[SMALL.name] > est[BIG.name]
    # A big untuned square: the big kernel's estimate stays near its measured rate, under
    # cuBLAS's (51.3 there): cuBLAS runs
    big = lib.select(8192, 8192, 8192, DType.F32, 90, 132)
    assert (big.kernel, big.rule) == (None, "estimate")
    assert 40 < lib.ranked(8192, 8192, 8192, DType.F32, 90, 132)[0][0] <= 46.1 * 1.05
    assert big.estimate_tflops == pytest.approx(51.3)
    assert lib.select(64, 64, 64, DType.F32, 80, 108).rule == "cublas"  # nothing for sm_80
    assert lib.select(64, 64, 64, DType.F16, 90, 132).rule == "cublas"  # nor for fp16


def test_cublas_estimate_scales_from_the_nearest_entry():
    from tuner.runtime.dispatch import cublas_estimate

    entries = [dict(m=4096, n=4096, k=4096, cublas_tflops=51.0),
               dict(m=16, n=4096, k=4096, cublas_tflops=6.6)]
    assert cublas_estimate(entries, (4096, 4096, 4096), 132) == 51.0
    assert cublas_estimate(entries, (8192, 8192, 8192), 132) == pytest.approx(51.0)
    assert cublas_estimate(entries, (16, 4096, 4096), 132) == 6.6
    # 32 rows is nearer the skinny entry, and no faster than it
    assert cublas_estimate(entries, (32, 4096, 4096), 132) == 6.6
    # 3000^3 is nearest the square one: 24 x 24 tiles of 128 fill 5 waves of 132 to 87%
    assert cublas_estimate(entries, (3000, 3000, 3000), 132) == pytest.approx(
        51.0 * (3000 ** 3 / (3072 ** 2 * 3008)) * (576 / 660) / (1024 / 1056))


def test_list_and_inspect(lib, capsys):
    assert main(["list", "--library", str(lib.path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["shape"] for r in rows] == ["512x512x512", "4096x4096x4096"]
    assert rows[1]["kernel"] == BIG.name and rows[1]["pct_cublas"] == pytest.approx(89.9, 0.01)
    assert main(["list", "--library", str(lib.path)]) == 0
    assert BIG.name in capsys.readouterr().out

    assert main(["inspect", BIG.name, "--library", str(lib.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["bm"] == 256 and doc["registers"] > 0 and doc["spill_bytes"] == 0
    assert doc["limiter"] == "registers" and doc["timing"]["reps"] == 20
    assert main(["inspect", "--shape", "512x512x512", "--library", str(lib.path)]) == 0
    out = capsys.readouterr().out
    assert SMALL.name in out and "occupancy" in out and "cuBLAS" in out
    assert main(["inspect", SMALL.name, "--source", "--library", str(lib.path)]) == 0
    assert capsys.readouterr().out.startswith("// Generated by gemm-tune")


@pytest.mark.parametrize("argv,msg", [
    (["inspect", "gemm_simt_f32_8x8x8_r1x1_w4x8_p0_v4_s2_g1"], "is not in the library"),
    (["inspect", "not-a-kernel"], "is not a gemm-tune kernel name"),
    (["inspect", "--shape", "3x3x3"], "no fp32 entry for 3x3x3"),
    (["inspect"], "a kernel name or --shape"),
    (["export"], "the following arguments are required: --out"),
])
def test_inspect_errors(lib, capsys, argv, msg):
    assert main(argv + ["--library", str(lib.path)]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_report_draws_the_figures(lib, tmp_path, capsys):
    import optuna

    e = lib.manifest["entries"][0]
    key = (f"{e['gpu']}|sm_90|cuda 13.0|{e['template_hash']}|f32|nn|4096x4096x4096")
    db = tmp_path / "art" / "studies.db"
    study = optuna.create_study(direction="maximize", study_name=key,
                                storage=f"sqlite:///{db}")
    dist = {"bm": optuna.distributions.CategoricalDistribution([64, 128, 256]),
            "stages": optuna.distributions.CategoricalDistribution([1, 2, 3])}
    for i, (bm, st) in enumerate([(64, 1), (128, 2), (256, 2), (128, 3), (256, 3), (64, 2)]):
        study.add_trial(optuna.trial.create_trial(params={"bm": bm, "stages": st},
                                                  distributions=dist, value=20.0 + bm / 10 + i))
    assert main(["report", "--shape", "4096x4096x4096", "--library", str(lib.path),
                 "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "rep")]) == 0
    for f in ("report.html", "history.png", "importances.png", "roofline.png", "top.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 1000, f
    page = (tmp_path / "rep" / "report.html").read_text()
    assert BIG.name in page and "46.1 TFLOP/s" in page


def test_report_refuses_a_studies_file_that_is_not_sqlite_and_keeps_it(lib, tmp_path, capsys):
    """A studies.db that is not an SQLite database is one line naming it (it had been a
    94-line sqlalchemy traceback), read and left as it was."""
    db = tmp_path / "art" / "studies.db"
    db.parent.mkdir(exist_ok=True)
    db.write_text("not a database\n")
    assert main(["report", "--shape", "4096x4096x4096", "--library", str(lib.path),
                 "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"studies {db} is not an SQLite database" in err[0], err
    assert db.read_text() == "not a database\n"


def test_reduce_pass_is_modelled_apart():
    """A split-K kernel's reduce time does not shrink with the tile and wave efficiency."""
    from codegen import KernelConfig
    from tuner.runtime.dispatch import efficiency, estimate_tflops, reduce_ms

    cfg = KernelConfig(bm=128, bn=128, bk=16, rm=8, rn=4, wt=16, split=32)
    e = dict(m=256, n=256, k=16384, tflops=33.4)
    assert reduce_ms(cfg, 256, 256, 3350) == pytest.approx(65 * 256 * 256 * 4 / 3.35e9 + 0.002)
    assert estimate_tflops(cfg, e, (256, 256, 16384), 132, 1, 3350) == pytest.approx(33.4)
    # at 1000^3 the reduce pass moves 65 x 4 MB: the estimate falls well below what tile
    # and wave efficiency alone would say (the old rule, which picked this kernel there)
    scaled = 33.4 * min(1.0, efficiency(cfg, (1000,) * 3, 132, 1)
                        / efficiency(cfg, (256, 256, 16384), 132, 1))
    assert estimate_tflops(cfg, e, (1000, 1000, 1000), 132, 1, 3350) < 0.6 * scaled
    # the last block's sum moves the same workspace, without a second launch
    last = KernelConfig(bm=128, bn=128, bk=16, rm=8, rn=4, wt=16, split=32, reduce="last")
    assert reduce_ms(last, 256, 256, 3350) == pytest.approx(65 * 256 * 256 * 4 / 3.35e9)
    # a split-K summed within a cluster has no workspace: it scales like any kernel
    c8 = KernelConfig(bm=128, bn=128, bk=16, rm=8, rn=4, wt=16, split=8, reduce="cluster")
    assert reduce_ms(c8, 256, 256, 3350) == 0.0
    assert estimate_tflops(c8, e, (1000, 1000, 1000), 132, 1, 3350) == pytest.approx(
        33.4 * min(1.0, efficiency(c8, (1000,) * 3, 132, 1)
                   / efficiency(c8, (256, 256, 16384), 132, 1)))


def test_a_tiny_tuned_shape_keeps_its_own_rate():
    """At the shape it was tuned at, a kernel's estimate is its measured rate, however small
    the shape: 1x1x1 takes picoseconds' worth of FLOPs (an absolute floor on the measured
    time once turned 900 TFLOP/s into 0.002 there); a split-K kernel whose modelled
    reduction exceeds its measured time keeps a tenth of that time for its main loop."""
    from codegen import KernelConfig
    from tuner.runtime.dispatch import estimate_tflops

    cfg = KernelConfig()
    for shape in ((1, 1, 1), (7, 3, 5), (4096, 4096, 4096)):
        e = dict(zip("mnk", shape), tflops=900.0)
        assert estimate_tflops(cfg, e, shape, 132, 1, 3350) == pytest.approx(900.0)
    split = KernelConfig(bm=128, bn=128, bk=16, rm=8, rn=4, wt=16, split=32)
    e = dict(m=64, n=64, k=64, tflops=1e-3)  # 0.52 ms measured, a 0.002 ms reduction
    assert estimate_tflops(split, e, (64, 64, 64), 132, 1, 3350) == pytest.approx(1e-3)
    e = dict(m=64, n=64, k=64, tflops=1.0)  # 0.5 us measured: below the modelled reduction
    assert estimate_tflops(split, e, (64, 64, 64), 132, 1, 3350) < 1.0


def test_explain_without_a_gpu_answers_for_a_named_gpu_model_or_says_why_not(lib):
    from conftest import _gpu_reason
    from tuner.runtime.errors import NoGPUError

    skinny = lib.explain(16, 4096, 4096, "fp32", gpu="NVIDIA H200")
    assert skinny.startswith(f"{SMALL.name} (estimate, for NVIDIA H200 without a GPU here)")
    assert skinny.endswith("on that GPU a first call measures")
    exact = lib.explain(4096, 4096, 4096, "fp32", gpu="NVIDIA H200")
    assert exact.startswith("cuBLAS (exact, for NVIDIA H200") and "0.90x" in exact
    with pytest.raises(LibraryError, match=r"no entries for 'NVIDIA A100' \(it has: NVIDIA H200\)"):
        lib.explain(64, 64, 64, gpu="NVIDIA A100")
    if _gpu_reason() is not None:  # no GPU here: one line that says what to do
        with pytest.raises(NoGPUError, match=r"explain\(\.\.\., gpu='NVIDIA H200'\)") as e:
            lib.explain(64, 64, 64)
        assert "\n" not in str(e.value)


def test_entries_of_a_variant_or_a_batch_are_their_own(lib, tmp_path, compile_cache):
    """An entry's key holds its variant and batch: an NT, fp16-C, bias + GELU entry at the
    shape of a plain one replaces nothing, entries from before the fields read as the
    plain variant at batch 1 (and hash into the fingerprint as they did), and the C++
    export serves both: the variant's kernel has a table of its own, with its batches."""
    import dataclasses
    import hashlib

    from _library import entry
    from codegen.config import Layout
    from codegen.families._common import Variant
    from tuner.runtime.export import export
    from tuner.runtime.manifest import entry_batch, entry_variant

    def old_fingerprint(entries):  # the formula from before variants
        rows = sorted(f"{e['gpu']}|{e['dtype']}|{e['m']}x{e['n']}x{e['k']}|{e['kernel']}"
                      for e in entries)
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:12]

    assert lib.fingerprint == old_fingerprint(lib.manifest["entries"])
    assert all(entry_variant(e) == Variant() and entry_batch(e) == 1
               for e in lib.manifest["entries"])
    var = dataclasses.replace(SMALL, layout=Layout.NT, out=DType.F16, bias="out", act="gelu")
    res = compile_config(var, "sm_90", compile_cache, tmp_path / "art")
    cu = tmp_path / "art" / "sm_90" / f"{var.name}.cu"
    lib.add(entry(var, res, (512, 512, 512), 20.0, 10.0), cu, res.cubin)
    lib.add(entry(var, res, (512, 512, 512), 21.0, 10.0, batch=8), cu, res.cubin)
    again = load_library(lib.path)
    rows = sorted((e["kernel"], entry_batch(e)) for e in again.manifest["entries"]
                  if (e["m"], e["n"], e["k"]) == (512, 512, 512))
    assert rows == sorted([(SMALL.name, 1), (var.name, 1), (var.name, 8)])
    assert again.fingerprint != old_fingerprint(again.manifest["entries"])
    v = Variant(Layout.NT, DType.F16, "out", "gelu")
    assert again.select(512, 512, 512, DType.F32, 90, 132, layout=v, batch=8).reason.startswith(
        "tuned for exactly 512x512x512 f32 nt, f16 C, bias + gelu, batch 8 on NVIDIA H200: "
        "21.0 TFLOP/s")
    assert again.select(512, 512, 512, DType.F32, 90, 132).kernel is None  # SMALL: 0.85x
    out = export(again, tmp_path / "bundle")
    kernels = {p.stem for p in (out / "kernels").iterdir()}
    assert {SMALL.name, var.name} <= kernels
    table = (out / "gemm_tuned.cu").read_text().split("// f32 nt, f16 C, bias + gelu: ")[1]
    assert table.startswith("2 entries, 1 kernels") and "{ 512, 512, 512, 8, " in table
