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
    with pytest.raises(UsageError, match=r"100000x100000x100000 needs 484\.4 GiB on the GPU"):
        _check_fits(dev, (100000, 100000, 100000), DType.F32)


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
