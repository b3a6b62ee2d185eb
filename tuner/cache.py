"""The cache of winners: one JSON file, one entry per key.

The key is every fact that changes which kernel wins or whether it still runs: GPU
name, compute capability, CUDA version, template hash, dtype, layout, M, N, K.
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

    def __str__(self) -> str:
        return (f"{self.gpu}|sm_{self.cc}|cuda {self.cuda}|{self.template_hash}|{self.dtype}"
                f"|{self.layout}|{self.m}x{self.n}x{self.k}")


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
