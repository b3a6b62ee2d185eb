"""bench/library_vs_cublas.py on the CPU: its shapes (at least 60, each from a family of its
own, every family the issue names), its spec grammar, and a bad spec in one line."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import library_vs_cublas as bench  # noqa: E402


def test_the_sweep_has_60_shapes_of_distinct_families_covering_the_issue():
    specs = [s for s, _ in bench.SWEEP]
    families = [f for _, f in bench.SWEEP]
    assert len(specs) >= 60 and len(set(specs)) == len(specs)
    assert len(set(families)) == len(families)
    cases = [bench.parse(s) for s in specs]
    assert any(c["n"] == 1 for c in cases) and any(c["m"] == 1 for c in cases)  # GEMV
    assert sum(c["pad"] % 4 != 0 for c in cases) >= 3  # padded, rows 4-byte aligned at best
    assert sum(c["offset"] > 0 for c in cases) >= 3  # misaligned pointers
    assert sum(c["k"] >= 16 * max(c["m"], c["n"]) for c in cases) >= 4  # K-heavy
    assert sum(c["m"] * c["n"] * c["k"] <= 64**3 for c in cases) >= 5  # tiny
    assert sum(c["m"] * c["n"] * c["k"] >= 4096**3 for c in cases) >= 5  # large
    assert sum(all(v % 2 for v in (c["m"], c["n"], c["k"])) for c in cases) >= 6  # odd
    assert {c["dtype"] for c in cases} == {"float32", "float16", "bfloat16"}
    assert any(c["nt"] for c in cases)
    assert sum(c["batch"] > 1 for c in cases) >= 2  # x @ W over a batch of sequences
    assert bench.M_SWEEP[:64] == list(range(1, 65)) and max(bench.M_SWEEP) >= 4096


def test_specs_parse_into_their_parts():
    assert bench.parse("777x555x333+1") == dict(m=777, n=555, k=333, pad=1, offset=0,
                                                nt=False, dtype="float32", batch=1)
    assert bench.parse("2048x2048x2048@2:f16")["offset"] == 2
    assert bench.parse("16x4096x4096/nt:bf16") == dict(m=16, n=4096, k=4096, pad=0, offset=0,
                                                       nt=True, dtype="bfloat16", batch=1)
    assert bench.parse("8*100x4096x4096/nt:f16") == dict(m=100, n=4096, k=4096, pad=0,
                                                         offset=0, nt=True, dtype="float16",
                                                         batch=8)


@pytest.mark.parametrize("spec", ["4096x4096", "axbxc", "1x2x3:f64"])
def test_a_bad_spec_is_one_line_and_status_2(spec, capsys):
    assert bench.main(["--shapes", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a bad shape spec" in err
