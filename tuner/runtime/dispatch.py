"""Which kernel runs a problem: the rule, its estimates, and the dispatch table that keeps
decisions made by measurement.

The rule, for a problem (device, dtype, layout, M, N, K, alignment class):
  1. exact: an entry tuned for exactly this GPU model, dtype, layout and shape, called
     with fully aligned operands, runs its kernel if it beat cuBLAS where it was tuned
     (its recorded ratio >= 1), else cuBLAS runs; both were timed in the same run.
  2. measured: otherwise the first call times, on scratch buffers of the same shape and
     alignment, the library kernels with the best estimates (below) and cuBLAS, and the
     fastest runs from then on. The decision is kept in the dispatch table (on disk, beside
     the library or in the user cache) so later processes do not measure again.
  3. estimated: with measuring off (`measure=False`, GEMM_TUNE_MEASURE=0), or during
     CUDA-graph capture (where nothing may be timed), the kernel with the best estimate
     runs if that estimate beats cuBLAS's estimate, else cuBLAS.
  With nothing tuned for this GPU and dtype, cuBLAS runs.

The estimate of a tuned kernel at a new shape:
    estimate = measured TFLOP/s at its tuned shape
               x min(1, efficiency(new shape) / efficiency(tuned shape))
    efficiency = tile efficiency (useful / computed work with M, N, K rounded up to the
                 tile) x wave efficiency (blocks, tiles x split-K, over the block slots of
                 the waves they need; slots = SMs x blocks per SM from the occupancy model),
capped at 1: no kernel is assumed faster anywhere than where it was measured. A
split-K kernel's second pass does not scale that way: its time,
    reduce(M, N) = (2 x SPLIT + 1) x M x N x 4 bytes / DRAM bandwidth + 2 us,
is taken out of the measured time before the scaling and the new shape's is added back.
cuBLAS's estimate at a new shape is the same scaling of the cuBLAS rate recorded beside
the entry nearest in log-shape, for a nominal 128 x 128 x 32 tile at one block per SM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

from codegen._io import atomic_write_json, file_lock

__all__ = ["Choice", "efficiency", "estimate_tflops", "reduce_ms", "cublas_estimate",
           "REDUCE_LAUNCH_MS", "DispatchTable", "table_path", "TABLE_SCHEMA"]

log = logging.getLogger(__name__)

REDUCE_LAUNCH_MS = 0.002
TABLE_SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs a problem: a kernel name, or None for cuBLAS."""

    kernel: str | None  # None: cuBLAS
    rule: str  # "exact", "measured", "estimate" or "cublas"
    reason: str
    estimate_tflops: float | None = None
    measured_ms: dict | None = None  # kernel name (or "cublas") -> median ms, when measured


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def reduce_ms(config, m: int, n: int, mem_gbs: float) -> float:
    """Milliseconds of a split-K kernel's reduction at M x N: the workspace written and read
    again, plus a launch for a second pass (0 without a workspace: no split-K, or one
    summed within a cluster)."""
    if not config.has_workspace:
        return 0.0
    launch = REDUCE_LAUNCH_MS if config.reduce_pass else 0.0
    return (2 * config.split + 1) * m * n * 4 / (mem_gbs * 1e6) + launch


def _efficiency(bm: int, bn: int, bk: int, split: int, shape, sms: int, blocks_per_sm: int):
    m, n, k = shape
    tile = (m * n * k) / (_cdiv(m, bm) * bm * _cdiv(n, bn) * bn * _cdiv(k, bk) * bk)
    tiles = _cdiv(m, bm) * _cdiv(n, bn) * split
    slots = max(1, sms * max(blocks_per_sm, 1))
    return tile * tiles / (_cdiv(tiles, slots) * slots)


def efficiency(config, shape, sms: int, blocks_per_sm: int) -> float:
    """Tile efficiency x wave efficiency of `config` on `shape` (see the module doc)."""
    return _efficiency(config.bm, config.bn, config.bk, config.split, shape, sms, blocks_per_sm)


def estimate_tflops(config, entry: dict, shape, sms: int, blocks_per_sm: int,
                    mem_gbs: float) -> float:
    """The module doc's estimate for `config`, tuned and measured as `entry`, at `shape`."""
    tuned = (entry["m"], entry["n"], entry["k"])
    ratio = min(1.0, efficiency(config, shape, sms, blocks_per_sm)
                / efficiency(config, tuned, sms, blocks_per_sm))
    flops_tuned, flops = 2.0 * math.prod(tuned), 2.0 * math.prod(shape)
    main_tuned = max(flops_tuned / (entry["tflops"] * 1e9)
                     - reduce_ms(config, tuned[0], tuned[1], mem_gbs), 1e-6)  # ms
    main = flops / (flops_tuned / main_tuned * ratio)
    return flops / ((main + reduce_ms(config, shape[0], shape[1], mem_gbs)) * 1e9)


def cublas_estimate(entries: list[dict], shape, sms: int) -> float:
    """cuBLAS's TFLOP/s at `shape`, scaled from the entry nearest in log-shape (module doc)."""
    def dist(e):
        return sum(abs(math.log(e[d] / s)) for d, s in zip("mnk", shape))

    e = min(entries, key=dist)
    tuned = (e["m"], e["n"], e["k"])
    ratio = min(1.0, _efficiency(128, 128, 32, 1, shape, sms, 1)
                / _efficiency(128, 128, 32, 1, tuned, sms, 1))
    return e["cublas_tflops"] * ratio


# ---- the dispatch table -------------------------------------------------------------------
def _cache_root() -> Path:
    return Path(os.environ.get("GEMM_TUNE_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "gemm-tune"))


def table_path(library_dir: Path) -> Path:
    """dispatch.json beside the library where it is writable, else in the user cache
    directory under a name derived from the library's real path."""
    library_dir = Path(library_dir)
    if os.access(library_dir, os.W_OK):
        return library_dir / "dispatch.json"
    tag = hashlib.sha256(str(library_dir.resolve()).encode()).hexdigest()[:16]
    return _cache_root() / "dispatch" / f"{tag}.json"


class DispatchTable:
    """Decisions made by measurement, persisted as JSON:

        {"schema": 1, "decisions": {KEY: {"kernel": NAME or null, "measured_ms": {...},
                                          "date": ISO}}}

    KEY joins the GPU model, driver version, cuBLAS version, the library's fingerprint (its
    kernel set), dtype, layout, M x N x K and the alignment class, so a decision is never
    reused where any of them differs. Writes are atomic (write, fsync, rename) under an
    exclusive lock on a sidecar file, re-reading the table first so concurrent writers lose
    nothing. A table that cannot be read is set aside (renamed *.corrupt-<time>) with a
    warning and started afresh: a lost cache costs a re-measurement, never a failure.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.decisions: dict[str, dict] = {}
        self._loaded = False

    @staticmethod
    def key(gpu_name: str, driver: int, cublas: int, fingerprint: str, dtype: str, layout: str,
            m: int, n: int, k: int, align: tuple) -> str:
        return (f"{gpu_name}|driver {driver}|cublas {cublas}|lib {fingerprint}|{dtype}|{layout}"
                f"|{m}x{n}x{k}|align {'.'.join(map(str, align))}")

    def get(self, key: str) -> dict | None:
        if not self._loaded:
            self.decisions = self._read()
            self._loaded = True
        return self.decisions.get(key)

    def _read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("dispatch table %s is unreadable (%s): not used", self.path, e)
            return {}
        try:
            data = json.loads(text)
            if not (isinstance(data, dict) and data.get("schema") == TABLE_SCHEMA
                    and isinstance(data.get("decisions"), dict)):
                raise ValueError("not a gemm-tune dispatch table of schema "
                                 f"{TABLE_SCHEMA}")
            return data["decisions"]
        except (ValueError, UnicodeDecodeError) as e:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.warning("dispatch table %s is corrupt (%s): set aside as %s; decisions "
                        "will be measured again", self.path, e, aside.name)
            return {}

    def _lock(self):
        return file_lock(self.path.with_name(self.path.name + ".lock"))

    def put(self, key: str, decision: dict) -> None:
        """Record a decision; persisted at once (best effort: a read-only disk only warns)."""
        self.decisions[key] = decision
        try:
            with self._lock():
                on_disk = self._read()
                on_disk[key] = decision
                atomic_write_json(self.path, {"schema": TABLE_SCHEMA, "decisions": on_disk})
                self.decisions = {**on_disk, **self.decisions}
        except OSError as e:
            log.warning("dispatch table %s not written (%s): the decision holds for this "
                        "process only", self.path, e)
