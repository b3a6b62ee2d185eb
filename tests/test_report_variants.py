"""`gemm-tune report` of a tuned problem's variant (a library of fake cubins: no GPU)."""

from test_cli import _fake_library, _run


def test_the_report_is_of_the_variant_asked(tmp_path, capsys):
    lib, plain, var = _fake_library(tmp_path)
    code, out, err = _run(capsys, "report", "--shape", "512x512x512", "--dtype", "fp16",
                          "--layout", "nt", "--c-type", "fp16", "--library", str(lib.path),
                          "--artifacts", str(tmp_path / "art"))
    assert code == 0, err
    page = tmp_path / "art" / "reports" / "512x512x512-f16-nt-f16" / "report.html"
    assert str(page) in out
    html = page.read_text()
    assert "512x512x512 f16 (nt, C f16, bias+gelu, batch 8)" in html and var.name in html
    assert "cuBLAS: cublasGemmStridedBatchedEx (batch 8)" in html
    code, _, err = _run(capsys, "report", "--shape", "512x512x512", "--dtype", "fp16",
                        "--batch", "2", "--library", str(lib.path))
    assert code == 2 and "no f16 batch=2 entry for 512x512x512" in err
    # the study's name is the tune's cache key: the variant's, and an older entry's plain one
    from tuner.report import _study_key

    e = {x["kernel"]: x for x in lib.manifest["entries"]}
    assert _study_key(e[var.name], (512, 512, 512)).endswith(
        "|f16|nt|512x512x512|f16|out|gelu|batch 8")
    assert _study_key(e[plain.name], (512, 512, 512)).endswith("|f32|nn|512x512x512")
