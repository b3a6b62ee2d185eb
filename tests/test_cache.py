import dataclasses
import json
import multiprocessing

import pytest

from codegen import UsageError
from tuner.cache import SCHEMA, CacheKey, WinnerCache

KEY = CacheKey("NVIDIA H200", 90, "13.0", "0123456789abcdef", "f32", "nn", 4096, 4096, 4096)


def test_round_trip(tmp_path):
    cache = WinnerCache(tmp_path / "cache.json")
    assert cache.get(KEY) is None
    cache.put(KEY, {"name": "gemm_x", "tflops": 50.0})
    again = WinnerCache(tmp_path / "cache.json").get(KEY)
    assert again["name"] == "gemm_x" and again["tflops"] == 50.0
    assert again["key"] == dataclasses.asdict(KEY)
    assert json.loads((tmp_path / "cache.json").read_text())["schema"] == SCHEMA


@pytest.mark.parametrize("field,value", [
    ("gpu", "NVIDIA H100 80GB HBM3"), ("cc", 80), ("cuda", "12.8"), ("template_hash", "f" * 16),
    ("dtype", "tf32"), ("layout", "nt"), ("m", 4095), ("n", 4097), ("k", 1023),
])
def test_every_key_field_changes_the_key(tmp_path, field, value):
    other = dataclasses.replace(KEY, **{field: value})
    assert str(other) != str(KEY)
    cache = WinnerCache(tmp_path / "c.json")
    cache.put(KEY, {"name": "a"})
    assert cache.get(other) is None
    cache.put(other, {"name": "b"})
    assert cache.get(KEY)["name"] == "a" and cache.get(other)["name"] == "b"


@pytest.mark.parametrize("content,msg", [
    (b"{not json", "is unreadable"),
    (b"\xff\xfe\x00", "is unreadable"),
    (b"[1, 2]", "is not a gemm-tune cache"),
    (json.dumps({"schema": 99, "entries": {}}).encode(), "has schema 99"),
])
def test_corrupt_file_is_one_error_and_kept(tmp_path, content, msg):
    path = tmp_path / "cache.json"
    path.write_bytes(content)
    cache = WinnerCache(path)
    with pytest.raises(UsageError, match=msg):
        cache.get(KEY)
    with pytest.raises(UsageError, match=msg):
        cache.put(KEY, {"name": "x"})
    assert path.read_bytes() == content  # nothing lost, nothing overwritten


def _writer(path, i):
    key = dataclasses.replace(KEY, m=i)
    WinnerCache(path).put(key, {"name": f"k{i}"})


def test_concurrent_writers_lose_no_entry(tmp_path):
    path = tmp_path / "cache.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(1, 9)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    entries = WinnerCache(path).entries()
    assert len(entries) == 8
    assert not list(tmp_path.glob(".cache.json.*.tmp"))  # no temporary file left behind
