"""The README quotes results files that exist, and the figures it quotes from the latest
library run are that file's (a figure the README states must come from a committed run)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_results_file_the_readme_cites_exists():
    cited = set(re.findall(r"bench/results/[\w.-]+\.(?:jsonl|json|png|log)", README))
    assert cited, "the README cites no results file"
    missing = sorted(p for p in cited if not (ROOT / p).is_file())
    assert not missing, missing


def test_the_library_figures_are_those_of_the_file_cited():
    cited = re.search(r"bench/results/(library-vs-cublas-[\w-]+\.json)", README).group(1)
    doc = json.loads((ROOT / "bench" / "results" / cited).read_text())
    s, steps = doc["summary"], doc["host_steps_us"]
    assert f"geometric mean of {s['geomean']:.2f}x torch.matmul" in " ".join(README.split())
    assert f"from {s['min_ratio']:.2f}x" in README
    assert f"{len(s['below_095'])} shapes below 0.95x".replace("4 ", "four ") in \
        " ".join(README.split())
    assert f"{steps['lib.gemm(a, b, c), whole call']:.1f} us of host time" in README
    assert f"torch.matmul's {steps['torch.matmul(a, b, out=c), whole call']:.1f}" in README


def _tunes(name: str) -> dict:
    cited = re.search(rf"bench/results/({name}[\w-]*\.jsonl)", README).group(1)
    return {json.loads(x)["dtype"]: json.loads(x)
            for x in (ROOT / "bench" / "results" / cited).read_text().splitlines()}


def test_the_4096_tune_figures_are_those_of_the_files_cited():
    fp32 = _tunes("tunes-4096-fp32-")["fp32"]
    fp16 = _tunes("tunes-4096-fp16-")["fp16"]
    text = " ".join(README.split())
    assert f"took {fp32['wall_s']:.0f} s and found `{fp32['kernel']}` at {fp32['tflops']:.1f}" \
        f" TFLOP/s against cuBLAS's {fp32['cublas_tflops']:.1f}" in text
    assert f"({fp32['ratio']:.2f}x)" in text
    assert f"took {fp16['wall_s']:.0f} s and won at {fp16['ratio']:.2f}x cuBLAS with " \
        f"`{fp16['kernel']}` ({fp16['tflops']:.1f} against {fp16['cublas_tflops']:.1f}" in text


def test_the_layouts_and_epilogue_figures_are_those_of_the_file_cited():
    cited = re.search(r"bench/results/(layouts-epilogues-[\w-]+\.json)", README).group(1)
    rows = json.loads((ROOT / "bench" / "results" / cited).read_text())["rows"]

    def span(part, keep=lambda r: True):
        xs = [r["ratio"] for r in rows if r["part"] == part and keep(r)]
        return f"{min(xs):.2f}x-{max(xs):.2f}x"

    def big(r):  # at least 2048^3
        return r["shape"][0] * r["shape"][1] * r["shape"][2] >= 8 * 2 ** 30

    def rows16(r):  # rows of 16-byte multiples: what TMA (the wgmma kernels) reads
        return all(x % 8 == 0 for x in r["shape"])

    text = " ".join(README.split())
    assert f"ran {span('linear')} of `F.gelu(F.linear(x, W, b))`" in text
    assert f"2-byte C ran {span('outtype', lambda r: big(r) and rows16(r))} of torch.matmul " \
        "on the large suite shapes with rows TMA can read, " \
        f"{span('outtype', lambda r: r['shape'] == [4095, 4097, 1023])} at 4095x4097x1023" in text
    assert f"but {span('outtype', lambda r: not big(r))} on the small and skinny ones" in text
