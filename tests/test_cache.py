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
    ("out", "f16"), ("bias", "out"), ("act", "gelu"), ("batch", 8),
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


def test_the_plain_problems_key_is_the_one_from_before_variants():
    """fp32 C, no epilogue, one problem: the text of before those fields, so that a cache
    (and a study) written then answers now; anything else appends all of them."""
    assert str(KEY) == "NVIDIA H200|sm_90|cuda 13.0|0123456789abcdef|f32|nn|4096x4096x4096"
    v = dataclasses.replace(KEY, dtype="f16", layout="nt", out="f16", bias="out", act="gelu",
                            batch=8)
    assert str(v) == ("NVIDIA H200|sm_90|cuda 13.0|0123456789abcdef|f16|nt|4096x4096x4096"
                      "|f16|out|gelu|batch 8")
    shared = dataclasses.replace(KEY, batch=4, broadcast_b=True)
    assert str(shared).endswith("|f32|nn|4096x4096x4096|f32|none|none|batch 4 B shared")
    assert str(dataclasses.replace(KEY, batch=4)) != str(shared)
    # an fp16 input with fp32 C and nothing else is the plain problem of fp16 data
    assert str(dataclasses.replace(KEY, dtype="f16")).endswith("|f16|nn|4096x4096x4096")


def test_an_old_cache_file_reads_as_the_plain_problem(tmp_path):
    """A cache written before variants (its entries' "key" without out/bias/act/batch)
    answers the plain key; an entry's key reads back as a CacheKey."""
    path = tmp_path / "cache.json"
    old_key = {f: getattr(KEY, f) for f in ("gpu", "cc", "cuda", "template_hash", "dtype",
                                            "layout", "m", "n", "k")}
    path.write_text(json.dumps({"schema": SCHEMA, "entries": {
        "NVIDIA H200|sm_90|cuda 13.0|0123456789abcdef|f32|nn|4096x4096x4096": {
            "name": "gemm_old", "key": old_key}}}))
    cache = WinnerCache(path)
    assert cache.get(KEY)["name"] == "gemm_old"
    assert CacheKey.from_entry(cache.get(KEY)["key"]) == KEY
    assert cache.get(dataclasses.replace(KEY, out="f16")) is None
    # a library entry from before the fields: the plain problem too
    entry = dict(old_key, kernel="gemm_old")
    assert CacheKey.from_entry(entry) == KEY
    new = dict(entry, out="bf16", bias="f32", act="silu", batch=2, broadcast_b=True)
    assert CacheKey.from_entry(new) == dataclasses.replace(
        KEY, out="bf16", bias="f32", act="silu", batch=2, broadcast_b=True)


def test_a_tasks_key_carries_its_variant_and_batch():
    from codegen.config import DType, Layout
    from codegen.families._common import Variant
    from tuner._shape import Task
    from tuner.tune import task_key

    plain = Task(DType.F32, (4096, 4096, 4096))
    assert task_key("NVIDIA H200", 90, "13.0", "0123456789abcdef", plain) == KEY
    t = Task(DType.F16, (16, 4096, 4096), Variant(Layout.NT, DType.F16, "out", "gelu"), 8, True)
    assert str(task_key("NVIDIA H200", 90, "13.0", "0123456789abcdef", t)) == (
        "NVIDIA H200|sm_90|cuda 13.0|0123456789abcdef|f16|nt|16x4096x4096|f16|out|gelu"
        "|batch 8 B shared")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_take_the_permissions_of_a_plain_open(tmp_path, umask, mode):
    """A library, a bundle, the cache and the tables are written atomically: through a
    temporary file that mkstemp makes 0600, which a library shared with a team, or a bundle
    built by another user, could not be read through (every file had been 0600)."""
    import os
    import stat

    from codegen._io import atomic_write, atomic_write_json

    old = os.umask(umask)
    try:
        paths = [atomic_write(tmp_path / "a.cu", "// x\n"),
                 atomic_write_json(tmp_path / "b.json", {})]
        with open(tmp_path / "c.txt", "w"):
            pass
    finally:
        os.umask(old)
    for p in paths + [tmp_path / "c.txt"]:
        assert stat.S_IMODE(p.stat().st_mode) == mode, p
