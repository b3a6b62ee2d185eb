"""GPU: a small end-to-end tune lands in the cache, and the next run answers from it."""

import json
import sys
import time

import pytest

from tuner.cli import main

pytestmark = pytest.mark.gpu


def test_small_tune_lands_in_the_cache_and_is_answered_from_it(tmp_path, capsys):
    art = tmp_path / "art"
    argv = ["--shape", "512x512x512", "--trials", "20", "--artifacts", str(art), "--json",
            "--seed", "1"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert not first["from_cache"]
    assert first["stats"]["compiled"] == 20
    assert first["stats"]["timed"] + first["stats"]["pruned"] + first["stats"]["failed"] == 20
    w = first["winner"]
    assert w["error"] <= 1e-5 and w["tflops"] > 0 and w["cublas_tflops"] > 0
    assert (art / "sm_90" / f"{w['name']}.cu").is_file()
    assert 1 <= len(first["top"]) <= 5
    print(f"512^3 tune: {w['name']} {w['tflops']} TFLOP/s, cuBLAS {w['cublas_tflops']}, "
          f"stats {first['stats']}", file=sys.stderr)

    cache = json.loads((art / "cache.json").read_text())
    assert list(cache["entries"]) == [first["key"]]

    t0 = time.monotonic()
    assert main(argv) == 0
    seconds = time.monotonic() - t0
    again = json.loads(capsys.readouterr().out)
    assert again["from_cache"] and again["winner"] == w
    assert seconds < 2.0, seconds
    print(f"answered from the cache in {seconds:.2f} s", file=sys.stderr)

    assert main(argv + ["--force", "--trials", "3"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert not forced["from_cache"] and forced["stats"]["compiled"] == 3
