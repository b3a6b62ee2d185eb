"""`inspect --profile` without a GPU: ncu's CSV parsed from hand-written fixtures (in the
layout of `ncu --csv --page raw --print-units base`), the error paths, the library entry
written with the figures, and the report's roofline drawing the measured points."""

import json
import subprocess
from pathlib import Path

import pytest

from tuner import profile as prof
from tuner.cli import main
from tuner.profile import ProfileError, parse_csv

FIX = Path(__file__).parent / "fixtures" / "ncu"


@pytest.fixture
def lib(tmp_path, compile_cache):
    from _library import build

    return build(tmp_path / "library", compile_cache, tmp_path / "art")


def test_parse_one_kernel():
    p = parse_csv((FIX / "simt_4096.csv").read_text())
    assert p.kernels == ("gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g1",)
    assert p.metrics["dram__bytes_read.sum"] == 241172480
    assert p.metrics["dram__bytes_write.sum"] == 67305472
    assert p.seconds == pytest.approx(2979424e-9)
    assert p.metrics["sm__warps_active.avg.pct_of_peak_sustained_active"] == 24.87
    assert [s for s, _ in p.stalls(3)] == ["math_pipe_throttle", "not_selected", "barrier"]
    s = p.summary(2.0 * 4096 ** 3)
    assert s["tflops"] == pytest.approx(2 * 4096 ** 3 / 2979424e-9 / 1e12, abs=0.01)
    assert s["intensity_dram"] == pytest.approx(2 * 4096 ** 3 / (241172480 + 67305472), abs=0.01)
    assert s["smem_conflicts_st"] == 1835008 and s["smem_conflicts_ld"] == 0
    assert s["stalls"][0] == dict(reason="math_pipe_throttle", per_issue=2.35)


def test_parse_two_kernels_sums_bytes_and_time():
    p = parse_csv((FIX / "cublas_splitk_2kernels.csv").read_text())
    assert len(p.kernels) == 2 and p.kernels[1] == "splitKreduce_kernel"
    assert p.metrics["dram__bytes_read.sum"] == 67239936 + 1310720
    assert p.metrics["gpu__time_duration.sum"] == 21504 + 3008
    # percentages are the longest kernel's
    assert p.metrics["sm__warps_active.avg.pct_of_peak_sustained_active"] == 31.5


def test_counters_not_permitted_is_named():
    with pytest.raises(ProfileError, match="ERR_NVGPUCTRPERM"):
        parse_csv((FIX / "err_nvgpuctrperm.txt").read_text())
    with pytest.raises(ProfileError, match="no CSV table"):
        parse_csv("==PROF== something else\n")


def test_no_ncu(monkeypatch, tmp_path):
    monkeypatch.setattr(prof.shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(prof, "Path", lambda p: tmp_path / "none" / str(p).lstrip("/"))
    with pytest.raises(ProfileError, match="needs Nsight Compute"):
        prof.ncu_path()


def test_ncu_command_flags():
    cmd = prof.ncu_command("ncu", ["python", "-m", "tuner.profile", "--child"])
    assert cmd[:9] == ["ncu", "--csv", "--page", "raw", "--print-units", "base",
                       "--clock-control", "none", "--profile-from-start"]
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert "dram__bytes_read.sum" in metrics and "gpu__time_duration.sum" in metrics
    assert any("long_scoreboard" in m for m in metrics)


@pytest.fixture
def fake_ncu(monkeypatch):
    """ncu "runs": the recorded fixture for our kernel, the two-kernel one for cuBLAS. Other
    commands (matplotlib's fc-list on a machine with no font cache yet) run for real."""
    calls = []
    real = subprocess.run

    def run(cmd, **kw):
        if "--child" not in cmd:
            return real(cmd, **kw)
        calls.append(cmd)
        ours = len(cmd) > cmd.index("--child") + 3
        text = (FIX / ("simt_4096.csv" if ours else "cublas_splitk_2kernels.csv")).read_text()
        return subprocess.CompletedProcess(cmd, 0, text, "")
    monkeypatch.setattr(prof, "ncu_path", lambda: "/opt/ncu")
    monkeypatch.setattr(prof.subprocess, "run", run)
    return calls


def test_inspect_profile_stores_figures(lib, capsys, fake_ncu, tmp_path):
    from _library import BIG

    assert main(["inspect", BIG.name, "--profile", "--library", str(lib.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(fake_ncu) == 2 and "--clock-control" in fake_ncu[0]
    assert doc["measured"]["ours"]["dram_read_bytes"] == 241172480
    assert doc["measured"]["cublas"]["kernels"][1] == "splitKreduce_kernel"
    m = doc["model"]
    assert m["traffic"]["a_bytes"] == 256 * 4096 * 4 and m["limiter_occupancy"] == "registers"
    assert m["predicted_tflops"] > 0 and m["bound_tflops"] > 0
    stored = json.loads((lib.path / "manifest.json").read_text())
    e = next(x for x in stored["entries"] if x["kernel"] == BIG.name)
    assert e["profile"]["measured"]["ours"]["tflops"] == doc["measured"]["ours"]["tflops"]
    # the table form, and the report's roofline with the measured points
    assert main(["inspect", BIG.name, "--profile", "--library", str(lib.path)]) == 0
    out = capsys.readouterr().out
    assert "under ncu" in out and "math_pipe_throttle" in out
    from codegen.config import DType
    from tuner.report import report
    from tuner.runtime.library import Library

    page = report(Library.load(lib.path), (4096, 4096, 4096), DType.F32, tmp_path / "none.db",
                  tmp_path / "rep")
    assert (tmp_path / "rep" / "roofline.png").stat().st_size > 0 and page.is_file()


def test_inspect_profile_without_counters_is_one_line(lib, capsys, monkeypatch):
    from _library import BIG

    monkeypatch.setattr(prof, "ncu_path", lambda: "/opt/ncu")
    monkeypatch.setattr(prof.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", (FIX / "err_nvgpuctrperm.txt").read_text()))
    assert main(["inspect", BIG.name, "--profile", "--library", str(lib.path)]) == 2
    err = capsys.readouterr().err
    assert "ERR_NVGPUCTRPERM" in err and len(err.strip().splitlines()) == 1


def test_inspect_profile_without_ncu_is_one_line(lib, capsys, monkeypatch):
    from _library import BIG

    monkeypatch.setattr(prof.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    real = prof.Path
    monkeypatch.setattr(prof, "Path", lambda p: real("/nonexistent") / str(p).lstrip("/"))
    assert main(["inspect", BIG.name, "--profile", "--library", str(lib.path)]) == 2
    err = capsys.readouterr().err
    assert "needs Nsight Compute" in err and len(err.strip().splitlines()) == 1
