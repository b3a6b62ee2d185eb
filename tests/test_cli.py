"""The command line, called in-process through main(argv) and once as the installed script."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _gpu_reason
from tuner.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GEMM_TUNE_CACHE_DIR", str(tmp_path / "cc"))
    code, out, err = _run(capsys, "--shape", "127x129x257", "--dry-run", "--trials", "4",
                          "--arch", "sm_80", "--artifacts", str(tmp_path / "art"), "--json",
                          "--jobs", "2")
    assert code == 0, err
    report = json.loads(out)
    assert report["shape"] == [127, 129, 257] and report["arch"] == "sm_80"
    assert report["sampled"] == 4 and report["valid"] > 1000
    rows = report["candidates"]
    assert "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8" in [r["config"] for r in rows]
    ok = [r["predicted_tflops"] for r in rows if r["status"] == "ok"]
    assert ok and ok == sorted(ok, reverse=True) and all(p > 0 for p in ok)
    assert rows[: len(ok)] == [r for r in rows if r["status"] == "ok"]  # sorted: ok first
    for r in rows:
        assert r["status"] in ("ok", "pruned", "compile failed")
        if r["status"] != "compile failed":
            assert r["registers"] > 0 and r["blocks_per_sm"] is not None
        assert (tmp_path / "art" / "sm_80" / f"{r['config']}.cu").is_file()


def test_dry_run_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GEMM_TUNE_CACHE_DIR", str(tmp_path / "cc"))
    code, out, _ = _run(capsys, "--shape", "64x64x64", "--dry-run", "--trials", "2",
                        "--artifacts", str(tmp_path), "--jobs", "1")
    assert code == 0
    assert "gemm_simt_f32_128x128x8_r8x8_w4x8_p4_v4_s2_g8" in out
    assert "valid for sm_90" in out and "artifacts:" in out
    assert "predicted TFLOP/s" in out and "fastest predicted first" in out


@pytest.mark.parametrize("argv,msg", [
    (["--shape", "4096x4096"], "shape must be MxNxK"),
    (["--shape", "abc"], "shape must be MxNxK"),
    (["--shape", "0x16x16"], "M must be at least 1"),
    (["--shape", "16x-3x16"], "N must be at least 1"),
    (["--shape", "-5x4x4"], "M must be at least 1 (got -5"),  # not argparse's "expected one argument"
    (["inspect", "--shape", "-5x4x4"], "M must be at least 1 (got -5"),
    (["--shape", "16x16x99999999999"], "exceeds the largest supported size"),
    (["--shape", "16x16x16", "--dtype", "int7"], "unknown dtype 'int7'"),
    (["--shape", "16x16x16", "--trials", "0", "--dry-run"], "--trials must be at least 1"),
    (["--shape", "16x16x16", "--dry-run", "--arch", "sm_12"], "unknown GPU architecture"),
    (["--shape", "16x16x16", "--sampler", "magic"], "invalid choice: 'magic'"),
    ([], "give a problem: --shape MxNxK"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, msg):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert msg in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["x", "-1", "1.5", ""])
def test_a_bad_gemm_tune_device_is_one_line(capsys, monkeypatch, tmp_path, value):
    """GEMM_TUNE_DEVICE names the tuning GPU by index: anything else is one line, exit 2
    (it had raised ValueError from int())."""
    monkeypatch.setenv("GEMM_TUNE_DEVICE", value)
    code, out, err = _run(capsys, "--shape", "64x64x64", "--cache", str(tmp_path / "c.json"))
    assert code == 2 and f"GEMM_TUNE_DEVICE={value!r} is not a GPU's index" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_installed_script_and_module_agree(tmp_path):
    """`gemm-tune` and `python -m tuner` are the same program (run from an unrelated directory)."""
    script = shutil.which("gemm-tune", path=str(Path(sys.executable).parent))
    assert script, "the gemm-tune console script is not installed"
    for cmd in ([script], [sys.executable, "-m", "tuner"]):
        p = subprocess.run([*cmd, "--shape", "1x2"], capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 2 and "shape must be MxNxK" in p.stderr


def test_timing_without_a_gpu_names_dry_run(capsys, tmp_path, monkeypatch):
    import tuner.gpu

    from tuner.runtime import driver

    monkeypatch.setattr(driver, "api", lambda: (_ for _ in ()).throw(
        driver.NoGPUError("no usable CUDA driver (none here)")))
    tuner.gpu.device.cache_clear()
    code, _, err = _run(capsys, "--shape", "64x64x64", "--artifacts", str(tmp_path))
    assert code == 2 and "--dry-run" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(_gpu_reason() is None, reason="a GPU is present: this checks the path without")
def test_no_gpu_here_is_reported_as_such(capsys, tmp_path):
    code, _, err = _run(capsys, "--shape", "64x64x64", "--artifacts", str(tmp_path))
    assert code == 2 and "timing needs a CUDA GPU" in err and "--dry-run" in err


def test_corrupt_cache_is_reported_and_kept(capsys, tmp_path):
    bad = tmp_path / "cache.json"
    bad.write_text("{truncated")
    code, _, err = _run(capsys, "--shape", "64x64x64", "--cache", str(bad))
    assert code == 2 and f"cache file {bad} is unreadable" in err
    assert bad.read_text() == "{truncated"


@pytest.mark.parametrize("scheme,content,said", [
    ("sqlite:///", b"not a database\n", "is not an SQLite database"),
    ("journal://", b"garbage\n", "is not an Optuna journal file"),
    ("sqlite:///", b"", "no studies there (FILE is empty)"),
    ("journal://", None, "no studies there (FILE is not there)"),
])
def test_status_of_a_file_that_holds_no_studies_is_one_line_and_leaves_it(
        capsys, tmp_path, scheme, content, said):
    """`status` reads a store: a file that is not one (or not there, or empty) is one line,
    exit 2, and the file is as it was (an empty one had become a 114 KB database, a garbage
    journal had read as no studies, exit 0)."""
    f = tmp_path / "studies"
    if content is not None:
        f.write_bytes(content)
    code, out, err = _run(capsys, "status", "--storage", f"{scheme}{f}")
    assert code == 2 and said.replace("FILE", str(f)) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (f.read_bytes() if f.exists() else None) == content


def test_importing_loads_no_gpu_package():
    code = ("import sys, codegen, tuner, tuner.cli, tuner.search, tuner.cache, tuner.dryrun, "
            "tuner.bench, tuner.gpu, tuner.runtime.cublas, tuner.runtime.call, tuner.runtime.runners; "
            "bad = [m for m in ('pycuda', 'pycuda.driver', 'cupy', 'torch', 'cuda.bindings') "
            "if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_run_path_imports_nothing_of_the_search():
    """A program that only runs tuned kernels pulls in no optuna, matplotlib or rich."""
    code = ("import sys, tuner.runtime, tuner.runtime.call, tuner.runtime.measure, "
            "tuner.runtime.runners, tuner.runtime.export; "
            "bad = [m for m in ('optuna', 'matplotlib', 'rich', 'pycuda', 'tuner.search', "
            "'tuner.space') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_installed_package_finds_its_templates_from_anywhere(tmp_path):
    """The installed script renders, compiles and writes artifacts from an unrelated cwd."""
    script = shutil.which("gemm-tune", path=str(Path(sys.executable).parent))
    env = dict(os.environ, GEMM_TUNE_CACHE_DIR=str(tmp_path / "cc"))
    p = subprocess.run([script, "--shape", "64x64x64", "--dry-run", "--trials", "1", "--json"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    name = json.loads(p.stdout)["candidates"][0]["config"]
    assert (tmp_path / "artifacts" / "sm_90" / f"{name}.cu").read_text().startswith(
        "// Generated by gemm-tune from templates/gemm_simt.cu.j2")


def test_a_problem_too_large_for_the_gpu_is_one_error(monkeypatch):
    """tune._check_fits against a fake device with 80 GiB free: 1e10 floats each of A, B, C
    (111.8 GiB) plus float64 A, B and three M x N float64 buffers (372.5 GiB) plus the
    flush buffer."""
    from types import SimpleNamespace

    from codegen import DType, UsageError
    from tuner.runtime import driver
    from tuner.tune import _check_fits

    monkeypatch.setattr(driver, "call", lambda name, *args: (80 * 2**30, 141 * 2**30))
    dev = SimpleNamespace(l2_bytes=60 * 2**20)
    _check_fits(dev, (4096, 4096, 4096), DType.F32)  # fits
    with pytest.raises(UsageError, match=r"100000x100000x100000 f32 nn C f32 needs 484\.4 GiB "
                                         r"on the GPU"):
        _check_fits(dev, (100000, 100000, 100000), DType.F32)


def test_a_batch_with_an_epilogue_counts_its_operands_c_and_references(monkeypatch):
    """A batch of 8 NT fp16 problems, fp16 C, bias + gelu, B shared: A 8 x 4096^2 and one B
    in fp16 (302 MB), C 8 x 4096^2 in fp16 and the fp32-sized bias (268 MB), float64: one
    problem's A and B and 6 M x N buffers per problem (two roundings, with and without
    the epilogue, and two working ones: 6.71 GB), the flush buffer (126 MB): 6.9 GiB."""
    from types import SimpleNamespace

    from codegen import DType, UsageError
    from codegen.families._common import Layout, Variant
    from tuner._shape import Task
    from tuner.runtime import driver
    from tuner.tune import _check_fits

    monkeypatch.setattr(driver, "call", lambda name, *args: (6 * 2**30, 141 * 2**30))
    dev = SimpleNamespace(l2_bytes=60 * 2**20)
    shape = (4096, 4096, 4096)
    task = Task(DType.F16, shape, Variant(Layout.NT, DType.F16, "out", "gelu"), 8, True)
    need = ((8 * 4096**2 + 4096**2) * 2 + 8 * 4096**2 * 2 + 4096 * 4
            + (2 * 4096**2 + 6 * 8 * 4096**2) * 8 + 2 * 60 * 2**20)
    assert round(need / 2**30, 1) == 6.9
    with pytest.raises(UsageError, match=r"^4096x4096x4096 f16 nt C f16 bias\+gelu "
                                         r"batch 8, B shared needs 6\.9 GiB"):
        _check_fits(dev, shape, DType.F16, task)
    _check_fits(dev, shape, DType.F16, Task(DType.F16, shape, batch=2))  # 2 plain: 1.7 GiB


def test_ctrl_c_exits_130(capsys, monkeypatch):
    import tuner.cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner.cli, "_run", interrupted)
    assert main(["--shape", "8x8x8"]) == 130
    assert capsys.readouterr().err.strip() == "gemm-tune: interrupted"


@pytest.mark.parametrize("lines,msg", [
    ("4096x4096x4096\n# a comment\n12x0x3\n", "line 3: "),
    ("# nothing\n\n", "names no shape"),
])
def test_shapes_file_errors_name_the_line(tmp_path, capsys, lines, msg):
    f = tmp_path / "shapes.txt"
    f.write_text(lines)
    assert main(["--shapes", str(f), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and str(f) in err


@pytest.mark.parametrize("argv,msg", [
    ([], "give a problem: --shape MxNxK"),
    (["--shapes", "/nonexistent/shapes.txt"], "cannot read it"),
    (["--shape", "8x8x8", "--shape", "16x16x16", "--dry-run"], "--dry-run takes one shape"),
    (["--shape", "8x8x8", "--kernel-timeout", "0"], "--kernel-timeout must be positive"),
    (["--shape", "8x8x8", "--timeout", "-3", "--dry-run"], "--timeout must be positive (got -3)"),
    (["--shape", "8x8x8", "--timeout", "nan"], "--timeout must be positive (got nan)"),
    (["--shape", "8x8x8", "--jobs", "0", "--dry-run"], "--jobs must be at least 1 (got 0)"),
    (["--shape", "8x8x8", "--top", "-1", "--dry-run"], "--top must be at least 1 (got -1)"),
    (["tune", "--problems", "/nonexistent", "--timeout", "0"], "--timeout must be positive"),
    (["upgrade", "--jobs", "0"], "--jobs must be at least 1 (got 0)"),
    (["--shape", "8x8x8", "--devices", "0,x"], "expected distinct GPU numbers like 0,1"),
    (["--shape", "8x8x8", "--devices", "1,1"], "expected distinct GPU numbers like 0,1"),
    (["--shape", "8x8x8", "--devices", "-1"], "expected distinct GPU numbers like 0,1"),
])
def test_shape_list_errors(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err


def test_a_piped_dry_run_shows_progress_lines_and_a_table_of_120_columns(tmp_path):
    """Where stderr is a pipe, progress comes as plain lines (not a live bar that shows
    nothing until the end), and what goes to a pipe fits 120 columns."""
    script = shutil.which("gemm-tune", path=str(Path(sys.executable).parent))
    env = dict(os.environ, GEMM_TUNE_CACHE_DIR=str(tmp_path / "cc"))
    p = subprocess.run([script, "--shape", "100x100x100", "--dry-run", "--trials", "3",
                        "--artifacts", str(tmp_path / "art")], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 0, p.stderr
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("gemm-tune: compiled")]
    assert progress and progress[-1].startswith("gemm-tune: compiled 3/3, "), p.stderr
    assert max(map(len, p.stdout.splitlines())) <= 120
    assert "fastest predicted first" in p.stdout


# ---- the problem a program makes: layout, C's type, bias, activation, batch --------------
@pytest.mark.parametrize("argv,msg", [
    (["--layout", "xy"], "unknown layout 'xy' (choose from nn, nt, tn, tt"),
    (["--out", "int8"], "C cannot be 'int8' (choose from fp32, fp16, bf16)"),
    (["--out", "tf32"], "C cannot be 'tf32' (choose from fp32, fp16, bf16)"),
    (["--bias", "maybe"], "unknown bias 'maybe' (choose from none, out, f32)"),
    (["--act", "tanh"], "unknown activation 'tanh' (choose from none, relu, gelu, gelu_tanh, "
                        "silu)"),
    (["--batch", "0"], "--batch must be at least 1 (got 0)"),
    (["--batch", "two"], "--batch must be a whole number (got 'two')"),
    (["--broadcast-b"], "--broadcast-b shares B across a batch: give --batch 2 or more"),
    (["--batch", "1", "--broadcast-b", "--dry-run"], "--broadcast-b shares B across a batch"),
])
def test_bad_problem_options_are_one_line_and_exit_2(capsys, argv, msg):
    code, out, err = _run(capsys, "--shape", "64x64x64", *argv)
    assert code == 2 and msg in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_problems_name_their_own_variants(capsys, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(dict(dtype="f32", m=8, n=8, k=8)) + "\n")
    code, _, err = _run(capsys, "tune", "--problems", str(f), "--layout", "nt", "--batch", "2")
    assert code == 2 and "--problems takes no --layout, --batch: each recorded problem names " \
                          "its own" in err


def _tasks(monkeypatch, capsys, *argv):
    """The tasks `gemm-tune ARGV` hands the GPU path."""
    import tuner.tune

    seen = []
    monkeypatch.setattr(tuner.tune, "run_cli", lambda args, tasks, art: seen.extend(tasks) or 0)
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    return seen


def test_the_problem_options_make_the_task(monkeypatch, capsys):
    from codegen.config import DType, Layout
    from codegen.families._common import Variant
    from tuner._shape import Task

    # C's type defaults to the input type for fp16 / bf16 (as torch), to fp32 otherwise
    for dtype, out in (("fp16", DType.F16), ("bf16", DType.BF16), ("fp32", DType.F32),
                       ("tf32", DType.F32), ("3xtf32", DType.F32)):
        [t] = _tasks(monkeypatch, capsys, "--shape", "64x64x64", "--dtype", dtype)
        assert t.variant == Variant(Layout.NN, out) and t.batch == 1 and not t.broadcast_b
    tasks = _tasks(monkeypatch, capsys, "--shape", "16x4096x4096", "--shape", "8x8x8",
                   "--dtype", "fp16", "--layout", "NT", "--act", "silu", "--bias", "f32",
                   "--batch", "8", "--broadcast-b")
    v = Variant(Layout.NT, DType.F16, "f32", "silu")
    assert tasks == [Task(DType.F16, (16, 4096, 4096), v, 8, True),
                     Task(DType.F16, (8, 8, 8), v, 8, True)]
    # fp32 C from fp16 data (the old default) on request; an fp32 bias with fp32 C is C's
    [t] = _tasks(monkeypatch, capsys, "--shape", "64x64x64", "--dtype", "half", "--out",
                 "float32", "--bias", "f32", "--layout", "tt")
    assert t.variant == Variant(Layout.TT, DType.F32, "out", "none")
    [t] = _tasks(monkeypatch, capsys, "--shape", "64x64x64", "--out", "bf16", "--act", "gelu_tanh")
    assert t.dtype is DType.F32 and t.variant == Variant(Layout.NN, DType.BF16, "none", "gelu_tanh")


def test_dry_run_of_an_nt_fp16_c_bias_gelu_batch_of_8(tmp_path, capsys, monkeypatch):
    """No GPU: the variant's kernels generated, compiled and modelled at the batch."""
    monkeypatch.setenv("GEMM_TUNE_CACHE_DIR", str(tmp_path / "cc"))
    argv = ["--shape", "64x128x256", "--dtype", "fp16", "--layout", "nt", "--bias", "out",
            "--act", "gelu", "--batch", "8", "--dry-run", "--trials", "2", "--jobs", "2",
            "--artifacts", str(tmp_path / "art")]
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["layout"], report["out"], report["bias"], report["act"], report["batch"]) == (
        "nt", "f16", "out", "gelu", 8)
    rows = report["candidates"]
    assert len(rows) == 2 and report["valid"] > 100
    assert all(r["config"].endswith("_nt_of16_bias_gelu") for r in rows)
    assert "gemm_simt_f16_128x128x8_r8x8_w4x8_p4_v4_s2_g8_nt_of16_bias_gelu" in [
        r["config"] for r in rows]  # the CUDA-core family's default, as the variant
    assert all(r["status"] in ("ok", "pruned") for r in rows)
    assert all(r["predicted_tflops"] > 0 for r in rows if r["status"] == "ok")
    compiled = [r for r in rows if r["status"] == "ok"]  # (a pruned one is not compiled)
    assert compiled
    for r in compiled:  # (wgmma kernels are built for sm_90a)
        src = next((tmp_path / "art").glob(f"sm_90*/{r['config']}.cu")).read_text()
        assert "0.70710678118654752f" in src  # the erf GELU of the epilogue
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and "(nt, C f16, bias+gelu, batch 8)" in out


def _fake_library(tmp_path):
    """A library of two entries with fake cubins: one from before variants (no layout
    beyond nn, no out, bias, act, batch) and an NT fp16-C bias+gelu batch of 8."""
    from codegen.config import DType, KernelConfig, Layout
    from codegen.families._common import Variant
    from tuner.runtime.library import Library

    lib = Library.create_or_open(tmp_path / "lib")
    plain = KernelConfig()
    var = Variant(Layout.NT, DType.F16, "out", "gelu").apply(KernelConfig(dtype=DType.F16))
    timing = dict(median_ms=1.0, p10_ms=1.0, p90_ms=1.1, min_ms=0.9, max_ms=1.2, reps=10)
    res = dict(registers=128, smem_static=0, smem_dynamic=16896, spill_stores=0,
               spill_loads=0, stack_frame=0, barriers=1, ptxas_ms=1.0)
    base = dict(gpu="NVIDIA H200", cc=90, arch="sm_90", cuda="13.0", template_hash="0" * 16,
                m=512, n=512, k=512, tflops=10.0, timing=timing, cublas_tflops=12.5,
                cublas_timing=timing, ratio=0.8, error=1e-6, resources=res, occupancy=0.25,
                limiter="registers", date="2026-12-01T10:00:00+00:00")
    for cfg, fields in ((plain, dict(dtype="f32", layout="nn")),
                        (var, dict(dtype="f16", layout="nt", out="f16", bias="out", act="gelu",
                                   batch=8, broadcast_b=False,
                                   cublas="cublasGemmStridedBatchedEx (batch 8) ..."))):
        src = tmp_path / f"{cfg.name}.cu"
        src.write_text("// fake\n")
        cubin = src.with_suffix(".cubin")
        cubin.write_bytes(b"\x7fELF fake")
        lib.add(dict(base, kernel=cfg.name, **fields), src, cubin)
    return lib, plain, var


def test_list_and_inspect_show_the_variant_and_batch(tmp_path, capsys):
    lib, plain, var = _fake_library(tmp_path)
    code, out, err = _run(capsys, "list", "--library", str(lib.path), "--json")
    assert code == 0, err
    rows = {r["kernel"]: r for r in json.loads(out)}
    pick = ("layout", "out", "bias", "act", "epilogue", "batch", "broadcast_b")
    assert [rows[plain.name][f] for f in pick] == ["nn", "f32", "none", "none", "none", 1, False]
    assert [rows[var.name][f] for f in pick] == ["nt", "f16", "out", "gelu", "bias+gelu", 8,
                                                 False]
    code, out, _ = _run(capsys, "list", "--library", str(lib.path))
    assert code == 0 and "C=f16" in out and "x8" in out and "C=f32" in out
    # inspect --shape: the variant's options pick the entry, as the tune's options made it
    code, out, err = _run(capsys, "inspect", "--shape", "512x512x512", "--dtype", "fp16",
                          "--layout", "nt", "--act", "gelu", "--batch", "8", "--library",
                          str(lib.path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kernel"] == var.name
    assert doc["tuned_for"][0].startswith("512x512x512 f16 (nt, C f16, bias+gelu, batch 8)")
    code, _, err = _run(capsys, "inspect", "--shape", "512x512x512", "--dtype", "fp16",
                        "--layout", "tn", "--library", str(lib.path))
    assert code == 2 and "no fp16 entry for 512x512x512 --layout tn in" in err
    code, _, err = _run(capsys, "inspect", "--shape", "512x512x512", "--act", "swish",
                        "--library", str(lib.path))
    assert code == 2 and "unknown activation 'swish'" in err
    code, out, _ = _run(capsys, "inspect", "--shape", "512x512x512", "--library", str(lib.path))
    assert code == 0 and "nn, C f32, none" in out  # the entry from before: the plain problem



def test_profiling_a_variant_is_refused_in_one_line(tmp_path, capsys):
    """tuner.profile runs the plain problem: a kernel with a bias would read it from 0."""
    lib, plain, var = _fake_library(tmp_path)
    code, _, err = _run(capsys, "inspect", var.name, "--profile", "--library", str(lib.path))
    assert code == 2 and "--profile runs the plain problem" in err
    assert "was tuned for nt, C f16, bias+gelu, batch 8" in err


def test_a_variant_no_family_builds_is_one_line(capsys, monkeypatch):
    """(Every family as if without layouts beyond NN and without an epilogue.)"""
    import dataclasses

    from codegen import families
    from codegen.config import Layout

    for name, spec in list(families.FAMILIES.items()):
        monkeypatch.setitem(families.FAMILIES, name, dataclasses.replace(
            spec, layouts=frozenset({Layout.NN}), epilogue=False))
    code, _, err = _run(capsys, "--shape", "64x64x64", "--layout", "tn", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("64x64x64 f32 tn C f32 on sm_90: no family builds it (the simt template reads nn "
            "operands, not tn)") in err


@pytest.mark.parametrize("argv", [
    ["--shape", "8x8x8", "--dry-run", "--trials", "1", "--artifacts", "{bad}"],
    ["export", "--library", "{lib}", "--out", "{bad}"],
    ["report", "--library", "{lib}", "--shape", "4096x4096x4096", "--out", "{bad}"],
    ["upgrade", "--library", "{bad}"],
])
def test_a_path_that_cannot_be_made_is_one_line_and_exit_2(capsys, tmp_path, argv):
    """An output directory below a plain file (NotADirectoryError): one line naming it,
    exit 2, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "out"
    lib = Path(__file__).resolve().parent.parent / "artifacts" / "library"
    argv = [a.format(bad=bad, lib=lib) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gemm-tune: error: ") and str(blocker) in err


def test_the_gpu_a_tune_runs_on_is_checked(monkeypatch):
    """GEMM_TUNE_DEVICE (the default GPU) and --devices name GPUs this machine has; a
    word or a GPU it lacks is one UsageError naming the setting (GEMM_TUNE_DEVICE=abc was a
    ValueError with a traceback, GEMM_TUNE_DEVICE=3 on a 2-GPU machine a driver error)."""
    from codegen.errors import UsageError
    from tuner import tune
    from tuner.runtime import driver

    monkeypatch.setattr(driver, "device_count", lambda: 2)
    monkeypatch.delenv("GEMM_TUNE_DEVICE", raising=False)
    assert tune._devices(None) == [0] and tune._devices([0, 1]) == [0, 1]
    monkeypatch.setenv("GEMM_TUNE_DEVICE", "1")
    assert tune._devices(None) == [1]
    for text, msg in (("abc", "GEMM_TUNE_DEVICE='abc': expected a GPU number like 0"),
                      ("3", "GEMM_TUNE_DEVICE=3: this machine has GPUs 0..1")):
        monkeypatch.setenv("GEMM_TUNE_DEVICE", text)
        with pytest.raises(UsageError, match=msg):
            tune._devices(None)
    with pytest.raises(UsageError, match="--devices 0,5: this machine has GPUs 0..1"):
        tune._devices([0, 5])


def test_inspect_builds_a_kernel_the_library_does_not_hold(tmp_path, capsys):
    """inspect NAME of any valid kernel: with no library, or one that does not hold it, its
    source, or its resources and occupancy as ptxas reads them (built here for --arch,
    nothing timed); a kernel that cannot be built, and --profile, are one-line refusals."""
    lib, plain, _ = _fake_library(tmp_path)
    name = "gemm_decode_f16_mma16x32_w8x1_v8_a5_pbl_nt_of16"
    code, out, err = _run(capsys, "inspect", name, "--source", "--library", str(tmp_path / "none"))
    assert code == 0, err
    assert out.startswith("// Generated by gemm-tune from templates/gemm_decode.cu.j2")
    assert f"// Kernel:     {name}\n" in out
    code, out, err = _run(capsys, "inspect", name, "--library", str(lib.path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kernel"] == name and doc["arch"] == "sm_90" and not doc["in_library"]
    assert doc["config"]["ring"] == "async" and doc["config"]["prefetch_b"] == 2
    assert 0 < doc["registers"] <= 255 and doc["spill_bytes"] == 0
    assert doc["smem"] >= 5 * 1024 and doc["blocks_per_sm"] >= 1
    assert Path(doc["cubin"]).is_file()
    code, out, err = _run(capsys, "inspect", name, "--arch", "sm_80", "--library",
                          str(lib.path))
    assert code == 0 and "built here, not timed" in out and "sm_80" in out, err
    # what the library holds is still its entry (its tune's figures)
    code, out, err = _run(capsys, "inspect", plain.name, "--library", str(lib.path), "--json")
    assert code == 0 and json.loads(out)["tuned_for"], err
    code, _, err = _run(capsys, "inspect", "gemm_wmma_f16_256x256x32_w64x64_p16_v8_s4_g1",
                        "--library", str(lib.path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "is not in the library at" in err
    assert "cannot be built for sm_90: the 64x64 warp tile needs at least 176 registers" in err
    code, _, err = _run(capsys, "inspect", name, "--profile", "--library", str(lib.path))
    assert code == 2 and "is not in the library at" in err
