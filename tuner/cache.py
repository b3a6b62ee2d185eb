"""The cache of winners: one JSON file, one entry per key.

The key is every fact that changes which kernel wins or whether it still runs: GPU
name, compute capability, CUDA version, template hash, dtype, layout, M, N, K, and C's
type, the bias, the activation and the batch (B shared or not). Its text (the cache's
key and the study's name) is the one from before those fields for the plain problem
(fp32 C, no epilogue, one problem), so older caches and studies still read as that:

    NVIDIA H200|sm_90|cuda 12.8|<hash>|f32|nn|4096x4096x4096
    NVIDIA H200|sm_90|cuda 12.8|<hash>|f16|nt|4096x4096x4096|f16|out|gelu|batch 8
    ...|f32|nn|64x64x64|f32|none|none|batch 4 B shared
Writes are atomic (write, fsync, rename) under an exclusive lock, so a kill at any
moment leaves the previous file intact and concurrent writers do not lose entries.
A file that cannot be read is never overwritten: the user is told, in one line.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from codegen._io import atomic_write_json, file_lock
from codegen.errors import UsageError

__all__ = ["CacheKey", "WinnerCache", "SCHEMA"]

SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class CacheKey:
    gpu: str
    cc: int
    cuda: str
    template_hash: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    out: str = "f32"  # C's type (short name)
    bias: str = "none"
    act: str = "none"
    batch: int = 1
    broadcast_b: bool = False

    @property
    def plain(self) -> bool:
        """fp32 C, no bias or activation, one problem: the key of before those fields."""
        return (self.out, self.bias, self.act, self.batch, self.broadcast_b) == (
            "f32", "none", "none", 1, False)

    def __str__(self) -> str:
        text = (f"{self.gpu}|sm_{self.cc}|cuda {self.cuda}|{self.template_hash}|{self.dtype}"
                f"|{self.layout}|{self.m}x{self.n}x{self.k}")
        if not self.plain:
            text += (f"|{self.out}|{self.bias}|{self.act}|batch {self.batch}"
                     + (" B shared" if self.broadcast_b else ""))
        return text

    @classmethod
    def from_entry(cls, e: dict) -> "CacheKey":
        """The key of a library entry (or a cached one's "key"); the fields an older one
        lacks read as the plain problem's."""
        return cls(e["gpu"], e["cc"], e["cuda"], e["template_hash"], e["dtype"],
                   e.get("layout", "nn"), e["m"], e["n"], e["k"], e.get("out", "f32"),
                   e.get("bias", "none"), e.get("act", "none"), int(e.get("batch", 1)),
                   bool(e.get("broadcast_b", False)))


class WinnerCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _read(self) -> dict:
        if not self.path.exists():
            return {"schema": SCHEMA, "entries": {}}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"cache file {self.path} is unreadable ({e}); "
                             "move it aside or pass --cache FILE") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise UsageError(f"cache file {self.path} is not a gemm-tune cache; "
                             "move it aside or pass --cache FILE")
        if data.get("schema") != SCHEMA:
            raise UsageError(f"cache file {self.path} has schema {data.get('schema')!r}, this "
                             f"gemm-tune reads schema {SCHEMA}; move it aside or upgrade")
        return data

    def entries(self) -> dict[str, dict]:
        return self._read()["entries"]

    def get(self, key: CacheKey) -> dict | None:
        return self.entries().get(str(key))

    def _lock(self):
        return file_lock(self.path.with_name(self.path.name + ".lock"))

    def put(self, key: CacheKey, entry: dict) -> None:
        """Add or replace one entry; every other entry survives (read-modify-write, locked)."""
        with self._lock():
            data = self._read()
            data["entries"][str(key)] = dict(entry, key=dataclasses.asdict(key))
            atomic_write_json(self.path, data)
