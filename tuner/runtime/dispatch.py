"""Which kernel runs a problem: the rule, its estimates, and the dispatch table that keeps
decisions made by measurement.

The rule, for a problem (device, dtype, variant, batch, M, N, K, alignment class; the
variant is the layout of A and B, C's type, the bias and the activation, see
codegen.families._common.Variant):
  0. only kernels built for exactly the problem's variant serve it (a kernel tuned for
     NN with fp32 C cannot serve NT or fp16 C); with none, cuBLAS runs (and the bias and
     activation after it: tuner.runtime.call).
  1. exact: an entry tuned for exactly this GPU model, dtype, variant, batch and shape,
     called with operands laid out as the tune's (fully aligned, rows of exactly their
     length: padded rows were not timed), runs its kernel if it beat cuBLAS by
     EXACT_TRUSTED (1.10x) where it was tuned; a closer one is measured as in rule 2 (the
     tuner times a kernel alone, a caller pays its call), with its kernel among the
     candidates, at its own M alone and kept for that M (its bucket's other end may cost
     the kernel a tile row where the entry's M did not); an entry that lost to cuBLAS
     leaves the decision to rule 2.
  2. measured: otherwise the first call of a case (below) times the library kernels with
     the best estimates (below) and cuBLAS as this caller's call runs them (its route to
     cuBLAS, on scratch operands of its layout, leading dimensions, alignment, batch
     strides, C's type and epilogue: tuner.runtime.call), at the smallest and the largest M
     of its M-bucket, each in the caller's loop and on the GPU alone (the host ahead); a
     kernel that beats cuBLAS at both Ms runs from then on, else cuBLAS; at one M it beats
     cuBLAS if it wins both figures by MEASURE_MARGIN, or one by the margin and loses
     neither, or, winning one and losing the other, costs less time (by the margin) where
     it loses than it saves where it wins (tuner.runtime.measure.decision: of several,
     the one of the least regret). The decision is kept in the dispatch
     table (on disk, beside the library or in the user cache) so later calls of the
     bucket, and later processes, do not measure again.
  3. estimated: with measuring off (`measure=False`, GEMM_TUNE_MEASURE=0) a decision the
     table holds still runs (nothing is measured or written: every process with the same
     library and table decides the same); where it holds none, and during CUDA-graph
     capture (where nothing may be timed), the kernel with the best estimate runs if that
     estimate beats cuBLAS's estimate, else cuBLAS.
  With nothing tuned for this GPU and dtype, cuBLAS runs.

A case, what a decision is made for and keyed by (:class:`Case`): dtype, variant, batch,
N, K, the M-bucket, the operands' alignment class (the widest access each of A, B and C
allows), their leading-dimension class (each "tight": rows of exactly their length, or
"padded"), the route by which the caller reaches cuBLAS ("torch": torch.matmul and
friends on torch's current stream; "gemm-tune": gemm-tune's own binding), and whether the
caller promised a constant B (static_b: its candidates run, and are timed, as their
static-B twins).

M-buckets (:class:`MBuckets`): problems that differ only in M share a decision. By
default the buckets are 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64 (powers of two up to 64) and
then every multiple of 128 (65-128, 129-256, ...); GEMM_TUNE_M_BUCKETS or
``load_library(..., m_buckets=...)`` changes them ("1,2,4,8,16,32,64,+128" is the
default; "exact" gives every M a bucket of its own). A bucket's decision names a kernel
only if it was measured at both ends of the bucket, and every kernel takes any M (its
alignment rules, `takes`, do not depend on M), so a decision made on one M runs on every
other M of its bucket; an exact entry still decides its own M (run, or measured at that
M and kept apart from its bucket's decision).

The estimate of a tuned kernel at a new shape:
    estimate = measured TFLOP/s at its tuned shape
               x min(1, efficiency(new shape) / efficiency(tuned shape))
    efficiency = tile efficiency (useful / computed work with M, N, K rounded up to the
                 tile) x wave efficiency (blocks, tiles x split-K x batch, over the block
                 slots of the waves they need; slots = SMs x blocks per SM from the
                 occupancy model),
capped at 1: no kernel is assumed faster anywhere than where it was measured. A
split-K kernel's second pass does not scale that way: its time,
    reduce(M, N) = (2 x SPLIT + 1) x M x N x batch x 4 bytes / DRAM bandwidth + 2 us,
is taken out of the measured time before the scaling and the new shape's is added back.
cuBLAS's estimate at a new shape is the same scaling of the cuBLAS rate recorded beside
the entry nearest in log-shape, for a nominal 128 x 128 x 32 tile at one block per SM.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

from codegen._io import atomic_write_json, file_lock
from codegen.arch import ARCHS, parse_arch
from codegen.config import DType, config_from_name
from codegen.families._common import INT32_MAX, MAX_DIM, Variant, quantity, whole
from codegen.occupancy import occupancy
from tuner.runtime.errors import LibraryError
from tuner.runtime.manifest import as_variant, entry_batch

__all__ = ["Choice", "Case", "MBuckets", "M_BUCKETS_ENV", "efficiency", "estimate_tflops",
           "reduce_ms", "cublas_estimate", "REDUCE_LAUNCH_MS", "DispatchTable", "table_path",
           "TABLE_SCHEMA", "FULL_ALIGN",
           "Dispatcher", "measured_choice", "describe", "MAX_KERNEL_BATCH", "packed_ld",
           "ld_class"]

#: the largest batch a kernel launch takes (its problems are the grid's y dimension)
MAX_KERNEL_BATCH = 65535


def describe(dtype, variant=None, batch: int = 1) -> str:
    """A request in words: "f16 nt", "f16 nt, f16 C, bias + gelu, batch 8" ..."""
    v = as_variant(variant)
    parts = [f"{dtype.short} {v.layout.value}"]
    if v.out.short != "f32":
        parts.append(f"{v.out.short} C")
    epi = [{"out": "bias", "f32": "fp32 bias"}[v.bias]] if v.bias != "none" else []
    epi += [v.act] if v.act != "none" else []
    if epi:
        parts.append(" + ".join(epi))
    if batch != 1:
        parts.append(f"batch {batch}")
    return ", ".join(parts)


log = logging.getLogger(__name__)

REDUCE_LAUNCH_MS = 0.002
#: 2: keys name the M-bucket, the leading-dimension class and the route (schema 1 keyed
#: one M and no leading dimensions); 3: decisions of pace "either" bound a kernel's GPU
#: time (measure.GPU_LOSS_MAX). An older table's decisions are dropped, to be measured again
TABLE_SCHEMA = 3
#: the environment variable that sets the M-buckets of every library a process loads
M_BUCKETS_ENV = "GEMM_TUNE_M_BUCKETS"


@dataclasses.dataclass(frozen=True)
class MBuckets:
    """Which Ms share a dispatch decision: a bucket per `bounds` (1, 2, 3-4, 5-8 ... for
    powers of two), then one per multiple of `step` above the last bound (65-128, 129-256
    ...). No bounds and a step of 1: every M its own bucket.

    Example:
        >>> b = MBuckets.parse("1,2,4,8,16,32,64,+128")
        >>> b.of(3), b.of(64), b.of(65), b.of(4097), b.text(1), b.text(40)
        ((3, 4), (33, 64), (65, 128), (4097, 4224), '1', '33-64')
    """

    bounds: tuple = (1, 2, 4, 8, 16, 32, 64)
    step: int = 128

    @classmethod
    def parse(cls, text: str) -> "MBuckets":
        """A bucket spec: the bounds, comma-separated and increasing, then "+STEP" (every
        multiple of STEP above them); "exact": one bucket per M. LibraryError otherwise."""
        text = str(text).strip().lower()
        if text == "exact":
            return cls((), 1)
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            step = int(items.pop()[1:]) if items and items[-1].startswith("+") else None
            bounds = tuple(int(x) for x in items)
        except ValueError:
            step = bounds = None
        if step is None or any(x.startswith("+") for x in items) \
                or not all(whole(x, 1, INT32_MAX) for x in (step, *bounds)) \
                or list(bounds) != sorted(set(bounds)):
            raise LibraryError(f"M-buckets {text!r}: give increasing bounds and then +STEP "
                               "(\"1,2,4,8,16,32,64,+128\"), or \"exact\"")
        return cls(bounds, step)

    @classmethod
    def from_env(cls) -> "MBuckets":
        """GEMM_TUNE_M_BUCKETS's buckets, or the default."""
        text = os.environ.get(M_BUCKETS_ENV, "").strip()
        return cls.parse(text) if text else cls()

    def of(self, m: int) -> tuple[int, int]:
        """(smallest, largest) M of the bucket holding `m`."""
        bounds = self.bounds
        if bounds and m <= bounds[-1]:
            i = bisect.bisect_left(bounds, m)
            return (bounds[i - 1] + 1 if i else 1), bounds[i]
        hi = -(-m // self.step) * self.step
        return max(hi - self.step, bounds[-1] if bounds else 0) + 1, max(m, min(hi, MAX_DIM))

    def text(self, m: int) -> str:
        """The bucket of `m` in words: "33-64", or "1" for a bucket of one M."""
        lo, hi = self.of(m)
        return str(lo) if lo == hi else f"{lo}-{hi}"

    def __str__(self) -> str:
        if not self.bounds and self.step == 1:
            return "exact"
        return ",".join([*map(str, self.bounds), f"+{self.step}"])


#: leading-dimension classes of A, B and C: rows (columns, for a column-major operand) of
#: exactly their length, or padded
TIGHT = ("tight", "tight", "tight")


def packed_ld(layout, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The leading dimensions of packed A, B and C stored as `layout` says (a Layout)."""
    ta, tb = layout.value
    return (m if ta == "t" else k), (k if tb == "t" else n), n


def ld_class(layout, m: int, n: int, k: int, ld: tuple) -> tuple:
    """"tight" or "padded" for A, B and C of leading dimensions `ld`: are their lines (rows,
    or columns of a column-major operand) exactly as long as the matrix's?"""
    return tuple("tight" if x == need else "padded"
                 for x, need in zip(ld, packed_ld(layout, m, n, k)))


@dataclasses.dataclass(frozen=True)
class Case:
    """One call as the rule sees it and the table keys its decision (the module doc)."""

    dtype: DType
    m: int
    n: int
    k: int
    variant: Variant = Variant()
    batch: int = 1
    align: tuple = (16, 16, 16)  # the widest access each of A, B and C allows (bytes)
    ld: tuple = TIGHT  # "tight" or "padded", for A, B and C
    route: str = "gemm-tune"  # how the caller reaches cuBLAS: "torch" or "gemm-tune"
    static_b: bool = False  # the caller promised a constant B (a kernel runs as its twin)

    def words(self, buckets: "MBuckets | None" = None) -> str:
        """"300x100x200 f32 nn (M-bucket 257-384), rows 4.16.16-byte aligned, A padded"."""
        bucket = f" (M-bucket {buckets.text(self.m)})" if buckets is not None else ""
        padded = [name for name, c in zip("ABC", self.ld) if c == "padded"]
        return (f"{self.m}x{self.n}x{self.k} {describe(self.dtype, self.variant, self.batch)}"
                f"{bucket}, operands {'.'.join(map(str, self.align))}-byte aligned"
                + (f", {' '.join(padded)} padded" if padded else "")
                + (", B constant (static_b)" if self.static_b else ""))


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs a problem: a kernel name, or None for cuBLAS."""

    kernel: str | None  # None: cuBLAS
    rule: str  # "exact", "measured", "estimate" or "cublas"
    reason: str
    estimate_tflops: float | None = None
    measured_ms: dict | None = None  # kernel name (or "cublas") -> median ms, when measured
    #: where measured over a bucket: (smallest M, largest M) and the ms at the smallest
    #: (measured_ms holds those at the largest)
    measured_m: tuple | None = None
    measured_ms_low: dict | None = None
    tuned_ratio: float | None = None  # an exact entry's ratio to cuBLAS where it was tuned

    def ms_at(self, m: int) -> float | None:
        """The measured ms per call of what runs, at `m` (linear between the bucket's ends),
        or None where nothing was measured."""
        name = self.kernel or "cublas"
        hi_ms = (self.measured_ms or {}).get(name)
        if hi_ms is None or not self.measured_m or not self.measured_ms_low:
            return hi_ms
        (lo, hi), lo_ms = self.measured_m, self.measured_ms_low.get(name, hi_ms)
        return lo_ms + (hi_ms - lo_ms) * (min(max(m, lo), hi) - lo) / max(hi - lo, 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def reduce_ms(config, m: int, n: int, mem_gbs: float, batch: int = 1) -> float:
    """Milliseconds of a split-K kernel's reduction at M x N (x batch): the workspace
    written and read again, plus a launch for a second pass (0 without a workspace: no
    split-K, or one summed within a cluster)."""
    if not config.has_workspace:
        return 0.0
    launch = REDUCE_LAUNCH_MS if config.reduce_pass else 0.0
    return (2 * config.split + 1) * m * n * batch * 4 / (mem_gbs * 1e6) + launch


def _efficiency(bm: int, bn: int, bk: int, split: int, shape, sms: int, blocks_per_sm: int,
                batch: int = 1):
    m, n, k = shape
    tile = (m * n * k) / (_cdiv(m, bm) * bm * _cdiv(n, bn) * bn * _cdiv(k, bk) * bk)
    tiles = _cdiv(m, bm) * _cdiv(n, bn) * split * batch
    slots = max(1, sms * max(blocks_per_sm, 1))
    return tile * tiles / (_cdiv(tiles, slots) * slots)


def efficiency(config, shape, sms: int, blocks_per_sm: int, batch: int = 1) -> float:
    """Tile efficiency x wave efficiency of `config` on `shape` (see the module doc)."""
    return _efficiency(config.bm, config.bn, config.bk, config.split, shape, sms, blocks_per_sm,
                       batch)


def estimate_tflops(config, entry: dict, shape, sms: int, blocks_per_sm: int,
                    mem_gbs: float, batch: int = 1) -> float:
    """The module doc's estimate for `config`, tuned and measured as `entry` (at its batch),
    at `shape` and `batch`."""
    tuned, tb = (entry["m"], entry["n"], entry["k"]), entry_batch(entry)
    ratio = min(1.0, efficiency(config, shape, sms, blocks_per_sm, batch)
                / efficiency(config, tuned, sms, blocks_per_sm, tb))
    flops_tuned, flops = 2.0 * math.prod(tuned) * tb, 2.0 * math.prod(shape) * batch
    # ms: the measured time less the modelled reduction, but never below a tenth of it
    # (a floor in absolute ms would swamp a tiny tuned shape's own time)
    whole = flops_tuned / (entry["tflops"] * 1e9)
    main_tuned = max(whole - reduce_ms(config, tuned[0], tuned[1], mem_gbs, tb), 0.1 * whole)
    main = flops / (flops_tuned / main_tuned * ratio)
    return flops / ((main + reduce_ms(config, shape[0], shape[1], mem_gbs, batch)) * 1e9)


def cublas_estimate(entries: list[dict], shape, sms: int, batch: int = 1) -> float:
    """cuBLAS's TFLOP/s at `shape` (x batch), scaled from the entry nearest in log-shape
    (module doc)."""
    def dist(e):
        return sum(abs(math.log(e[d] / s)) for d, s in zip("mnk", shape)) \
            + abs(math.log(entry_batch(e) / batch))

    e = min(entries, key=dist)
    tuned = (e["m"], e["n"], e["k"])
    ratio = min(1.0, _efficiency(128, 128, 32, 1, shape, sms, 1, batch)
                / _efficiency(128, 128, 32, 1, tuned, sms, 1, entry_batch(e)))
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

        {"schema": 3, "decisions": {KEY: {"kernel": NAME or null, "route": ROUTE,
                                          "measured_m": [LO, HI], "measured_ms": {...},
                                          "measured_ms_low": {...}, "date": ISO}}}

    (measured_ms at M = HI, measured_ms_low at M = LO, absent for a bucket of one M).
    KEY joins the GPU model, driver version, cuBLAS version and the route to it, the
    library's fingerprint (its kernel set), dtype, variant (the layout alone for fp32 C
    without an epilogue), the M-bucket x N x K, the batch (when not 1), the alignment class
    and the leading-dimension class, so a decision is never reused where any of them
    differs. Writes are atomic (write, fsync, rename) under an exclusive lock on a sidecar
    file, re-reading the table first so concurrent writers lose nothing. A table that cannot
    be read is set aside (renamed *.corrupt-<time>) with a warning and started afresh: a
    lost cache costs a re-measurement, never a failure. One of an older schema (TABLE_SCHEMA)
    is replaced by the first decision written.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.decisions: dict[str, dict] = {}
        self._loaded = False

    @staticmethod
    def key(gpu_name: str, driver: int, cublas: int | str, fingerprint: str, dtype: str,
            layout, m: int | str, n: int, k: int, align: tuple, batch: int = 1,
            ld: tuple | None = None, pace: str = "either", static_b: bool = False) -> str:
        """`layout`: a Variant (or a Layout, or its text "nn"); `m`: an M or an M-bucket's
        text ("33-64"); `ld`: the leading-dimension classes of A, B and C (None: unnamed);
        `pace`: what the program said sets its pace (named unless "either"); `static_b`:
        the caller's promise of a constant B (its candidates were timed as their static-B
        twins, so the decision is kept apart)."""
        if not isinstance(layout, str):
            v = as_variant(layout)
            layout = v.layout.value if (v.out.short, v.bias, v.act) == ("f32", "none", "none") \
                else v.key
        shape = f"{m}x{n}x{k}" + (f"|batch {batch}" if batch != 1 else "")
        rows = f"|ld {'.'.join(ld)}" if ld is not None else ""
        paced = f"|pace {pace}" if pace != "either" else ""
        static = "|static B" if static_b else ""
        return (f"{gpu_name}|driver {driver}|cublas {cublas}|lib {fingerprint}|{dtype}|{layout}"
                f"|{shape}|align {'.'.join(map(str, align))}{rows}{paced}{static}")

    def get(self, key: str) -> dict | None:
        if not self._loaded:
            self.decisions = self._read()
            self._loaded = True
        return self.decisions.get(key)

    def _read(self) -> dict:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            log.warning("dispatch table %s is unreadable (%s): not used", self.path, e)
            return {}
        try:
            data = json.loads(raw.decode())
            old = isinstance(data, dict) and data.get("schema")
            if type(old) is int and 1 <= old < TABLE_SCHEMA:
                log.info("dispatch table %s is of schema %d: its decisions will be measured "
                         "again", self.path, old)
                return {}
            if not (isinstance(data, dict) and data.get("schema") == TABLE_SCHEMA
                    and isinstance(data.get("decisions"), dict)):
                raise ValueError("not a gemm-tune dispatch table of schema "
                                 f"{TABLE_SCHEMA}")
            return self._usable(data["decisions"])
        except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
            aside = self._aside()
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.warning("dispatch table %s is corrupt (%s): set aside as %s; decisions "
                        "will be measured again", self.path, e, aside.name)
            return {}

    def _aside(self) -> Path:
        """Where a corrupt table (or a copy of one) is set aside."""
        return self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")

    def _usable(self, decisions: dict) -> dict:
        """The decisions that can be read (:func:`malformed`); where some cannot, the file
        is copied aside (*.corrupt-<time>, once) with a warning, and those cases are
        measured again (the next decision written leaves them out)."""
        bad = {key: why for key, d in decisions.items() if (why := malformed(d))}
        if bad and self.path not in _SET_ASIDE:
            _SET_ASIDE.add(self.path)
            aside = self._aside()
            with contextlib.suppress(OSError):
                shutil.copyfile(self.path, aside)
            key, why = next(iter(bad.items()))
            log.warning("dispatch table %s: %d decision(s) cannot be read (%s: %s); copied "
                        "aside as %s, those cases will be measured again", self.path,
                        len(bad), key, why, aside.name)
        return {key: d for key, d in decisions.items() if key not in bad}

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


#: tables whose unreadable decisions were copied aside in this process (once each)
_SET_ASIDE: set = set()


def _times(x) -> bool:
    """A decision's figures: {name: milliseconds}."""
    return isinstance(x, dict) and all(isinstance(k, str) and quantity(t, 1e9)
                                       for k, t in x.items())


def malformed(d) -> str | None:
    """Why a table decision cannot be used (a hand-edited or damaged table), or None."""
    if not isinstance(d, dict):
        return f"a {type(d).__name__}, not a decision"
    kernel = d.get("kernel")
    if kernel is not None and not isinstance(kernel, str):
        return f"kernel {kernel!r:.40}"
    if kernel is not None:
        try:
            config_from_name(kernel)
        except Exception as e:  # noqa: BLE001 (any way a name fails to parse)
            return f"kernel {kernel!r}: {e}"
    if not _times(d.get("measured_ms")):
        return f"measured_ms {d.get('measured_ms')!r:.60}"
    for field in ("measured_ms_low", "device_ms", "device_ms_low"):
        if d.get(field) is not None and not _times(d[field]):
            return f"{field} {d[field]!r:.60}"
    ms = d.get("measured_m")
    if ms is not None and not (isinstance(ms, list) and len(ms) == 2
                               and all(whole(m, 0, INT32_MAX) for m in ms)):
        return f"measured_m {ms!r:.60}"
    for field in ("date", "route", "pace", "gpu_alone"):
        if field in d and not isinstance(d[field], str):
            return f"{field} {d[field]!r:.60}"
    if "date" not in d:
        return "no date"
    return None


# ---- the rule ------------------------------------------------------------------------
#: an alignment class where every operand allows 16-byte accesses (address and row stride)
FULL_ALIGN = (16, 16, 16)


def _figures(ms: dict) -> str:
    return ", ".join(f"{name} {t:.4f} ms" for name, t in sorted(ms.items(), key=lambda r: r[1]))


def measured_choice(d: dict) -> Choice:
    """The Choice a decision of the table stands for."""
    ms, low = d["measured_ms"], d.get("measured_ms_low")
    lo, hi = d.get("measured_m") or (None, None)
    who = d["kernel"] or f"cuBLAS (through {d.get('route', 'gemm-tune')})"
    def at(hi_ms, low_ms):
        if low_ms:
            return f"at M={hi}: {_figures(hi_ms)}; at M={lo}: {_figures(low_ms)}"
        return (f"at M={hi}: " if hi else "") + _figures(hi_ms)

    figures = at(ms, low)
    if d.get("device_ms"):
        figures += f"; on the GPU alone (the host ahead) {at(d['device_ms'], d.get('device_ms_low'))}"
    elif d.get("gpu_alone") == "not measured":
        figures += ("; on the GPU alone not measured (the host could not queue the calls "
                    "behind a hold), so no kernel runs")
    if d.get("pace") in ("gpu", "host"):
        figures += (f"; decided on {'the GPU' if d['pace'] == 'gpu' else 'the loop'}'s "
                    f"figures alone (pace {d['pace']})")
    return Choice(d["kernel"], "measured",
                  f"measured on first use ({d['date'][:10]}), ms per call in a loop {figures}; "
                  f"{who} runs", None, ms, (lo, hi) if hi else None, low)


def exact_entry(entries, shape: tuple, batch: int, align: tuple, gpu: str | None,
                ld: tuple = TIGHT):
    """Of `entries` (a dtype's and variant's), the one tuned for exactly `shape` and `batch`
    on GPU model `gpu` (None: any), if the operands are laid out as the tune's were: fully
    aligned, rows of exactly their length (`ld`, the leading-dimension class); else None.
    Neither the entry's kernel nor cuBLAS was timed on padded rows (cuBLAS picks its kernel
    by the leading dimensions too), so such a call is decided as an untuned shape is."""
    if align != FULL_ALIGN or ld != TIGHT:
        return None
    return next((e for e in entries if (e["m"], e["n"], e["k"], entry_batch(e)) ==
                 (*shape, batch) and gpu in (None, e["gpu"])), None)


#: an exact entry runs without a first-use measurement only if it beat cuBLAS by this much
#: where it was tuned: a closer one is measured as the caller runs it (the tuner times a
#: kernel alone; a call pays its host path, and a torch caller's cuBLAS is torch's)
EXACT_TRUSTED = 1.10


def settled(choice: Choice) -> bool:
    """Does the rule's `choice` stand without the table or a measurement? cuBLAS where no
    kernel serves the case does, and an exact entry's kernel that beat cuBLAS by
    EXACT_TRUSTED where it was tuned."""
    return choice.rule == "cublas" or choice.rule == "exact" and choice.kernel is not None \
        and (choice.tuned_ratio or 0.0) >= EXACT_TRUSTED


class Dispatcher:
    """The rule of this module's doc over one library's manifest, and its table of
    decisions made by measurement (kept beside the library or in the user cache).
    `buckets`: the M-buckets decisions are shared over (default: GEMM_TUNE_M_BUCKETS's, or
    MBuckets())."""

    def __init__(self, manifest, buckets: MBuckets | None = None, pace: str = "either"):
        self.manifest = manifest
        self.buckets = buckets if buckets is not None else MBuckets.from_env()
        self.pace = pace  # measure.PACES: what the program said sets its pace
        self._table: DispatchTable | None = None

    @property
    def table(self) -> DispatchTable:
        if self._table is None:
            self._table = DispatchTable(table_path(self.manifest.path))
        return self._table

    def ranked(self, m: int, n: int, k: int, dtype, cc: int, sms: int, variant=None,
               align: tuple = FULL_ALIGN, batch: int = 1) -> list[tuple[float, dict]]:
        """(estimated TFLOP/s, entry) of every kernel tuned on this cc for this dtype and
        variant (a Variant, or a Layout) that takes operands of alignment class `align`,
        best first, one per kernel; the kernels of replaced entries among them (a kernel a
        re-tune replaced may still serve the problems around its shape best)."""
        arch = ARCHS.get(cc) or parse_arch("sm_90")
        best: dict[str, tuple[float, dict]] = {}
        if batch > MAX_KERNEL_BATCH:
            return []
        for e in self.manifest.serving(dtype, cc, variant, replaced=True):
            cfg = config_from_name(e["kernel"])
            if not cfg.takes(m, n, k, align):
                continue
            res = e["resources"]
            bps = occupancy(cfg.threads, res["registers"],
                            res["smem_static"] + res["smem_dynamic"], arch).blocks_per_sm
            est = estimate_tflops(cfg, e, (m, n, k), sms, bps, arch.mem_gbs, batch)
            if e["kernel"] not in best or est > best[e["kernel"]][0]:
                best[e["kernel"]] = (est, e)
        return sorted(best.values(), key=lambda r: -r[0])

    def select(self, m: int, n: int, k: int, dtype, cc: int = 90, sms: int | None = None,
               variant=None, gpu: str | None = None, align: tuple = FULL_ALIGN,
               batch: int = 1, ld: tuple = TIGHT) -> Choice:
        """The rule without measuring (rules 0, 1 and 3): exact, estimate or cuBLAS.
        `variant`: the request's Variant (or a Layout: fp32 C, no epilogue); `gpu`: the
        GPU's name (an exact entry must come from the same model); `align`: the operands'
        alignment class (an exact entry runs only on fully aligned ones; a kernel that
        needs 16-byte operands is no candidate for others); `batch`: the problems of a
        strided batch (an exact entry was tuned at that batch); `ld`: the leading-dimension
        class (an exact entry runs only on tight rows, as it was tuned)."""
        variant = as_variant(variant)
        entries = self.manifest.serving(dtype, cc, variant)
        what = f"{m}x{n}x{k} {describe(dtype, variant, batch)}"
        if not entries:
            return Choice(None, "cublas", f"no kernel tuned for {describe(dtype, variant)} "
                                          f"on sm_{cc}: cuBLAS runs")
        if batch > MAX_KERNEL_BATCH:
            return Choice(None, "cublas", f"a batch of {batch} is more than a kernel launch "
                                          f"takes ({MAX_KERNEL_BATCH}): cuBLAS runs")
        e = exact_entry(entries, (m, n, k), batch, align, gpu, ld)
        if e is not None and e["ratio"] >= 1.0:
            return Choice(e["kernel"], "exact",
                          f"tuned for exactly {what} on {e['gpu']}: {e['tflops']:.1f} "
                          f"TFLOP/s there, {e['ratio']:.2f}x cuBLAS", e["tflops"],
                          tuned_ratio=e["ratio"])
        if e is not None:
            return Choice(None, "exact",
                          f"tuned for exactly {what} on {e['gpu']}, but its kernel "
                          f"{e['kernel']} ran {e['tflops']:.1f} TFLOP/s, {e['ratio']:.2f}x "
                          f"cuBLAS's {e['cublas_tflops']:.1f}: cuBLAS runs",
                          e["cublas_tflops"])
        sms = sms or (ARCHS.get(cc) or parse_arch("sm_90")).sm_count
        ranked = self.ranked(m, n, k, dtype, cc, sms, variant, align, batch)
        if not ranked:
            return Choice(None, "cublas", f"no kernel tuned for {describe(dtype, variant)} "
                                          f"on sm_{cc} takes operands aligned as these "
                                          f"({'.'.join(map(str, align))}): cuBLAS runs")
        est, e = ranked[0]
        blas = cublas_estimate(entries, (m, n, k), sms, batch)
        tuned_at = f"{e['m']}x{e['n']}x{e['k']}" + (
            f" x {entry_batch(e)}" if entry_batch(e) != 1 else "")
        figures = (f"{e['kernel']} (tuned at {tuned_at}, {e['tflops']:.1f} "
                   f"TFLOP/s) has the best estimate, {est:.1f} TFLOP/s, against cuBLAS's "
                   f"estimated {blas:.1f}")
        if est > blas:
            return Choice(e["kernel"], "estimate", f"no entry for {what}; {figures}", est)
        return Choice(None, "estimate", f"no entry for {what}; {figures}: cuBLAS runs", blas)

    def key(self, g, case: Case, apart: bool | None = None) -> str:
        """The table's key of `case` on GPU g: its M-bucket's, or its own M's where an
        exact entry serves it (`apart`, looked up where None: such a case is measured at
        its own M alone and decided apart from its bucket, as a trusted exact entry is,
        since the bucket's other end may cost the kernel a tile row: M = 1921 costs a
        128-row tile for one row where the entry was tuned at 2048)."""
        from tuner.runtime.cublas import cublas_version

        if apart is None:
            apart = self._exact(g, case) is not None
        return DispatchTable.key(g.name, g.driver_version,
                                 f"{cublas_version()} via {case.route}",
                                 self.manifest.fingerprint, case.dtype.short, case.variant,
                                 case.m if apart else self.buckets.text(case.m), case.n,
                                 case.k, case.align, case.batch, case.ld, self.pace,
                                 case.static_b)

    def _exact(self, g, case: Case) -> dict | None:
        return exact_entry(self.manifest.serving(case.dtype, g.cc, case.variant),
                           (case.m, case.n, case.k), case.batch, case.align, g.name,
                           case.ld)

    def select_case(self, case: Case, cc: int, sms: int | None, gpu: str | None) -> Choice:
        """select() of a case (on a GPU of compute capability cc, `sms` SMs, model `gpu`)."""
        return self.select(case.m, case.n, case.k, case.dtype, cc, sms, case.variant, gpu,
                           case.align, case.batch, case.ld)

    def decide(self, g, case: Case, measure=None) -> Choice:
        """The rule for `case` on GPU g. An exact entry that beat cuBLAS by EXACT_TRUSTED
        where it was tuned runs; else the table's decision for the case's key; else, with
        `measure` (a callable (kernel names ranked best first, (smallest M, largest M) of
        the bucket) -> a table decision, or None where nothing may be timed), one is
        measured and kept; else the rule's own choice (the estimate, or a closer exact
        entry) decides."""
        choice = self.select_case(case, g.cc, g.arch.sm_count, g.name)
        if settled(choice):
            return choice
        e = self._exact(g, case)
        key = self.key(g, case, e is not None)
        d = self.table.get(key)
        if d is None and measure is not None:
            lo, hi = (case.m, case.m) if e is not None else self.buckets.of(case.m)
            names = [x["kernel"] for _, x in self.ranked(
                hi, case.n, case.k, case.dtype, g.cc, g.arch.sm_count, case.variant,
                case.align, case.batch)]
            if e is not None:  # an exact entry's kernel is measured first, won or lost
                names = [e["kernel"]] + [x for x in names if x != e["kernel"]]
            d = measure(names, (lo, hi))
            if d is None:  # a CUDA graph is being captured: nothing may be timed
                return dataclasses.replace(choice, reason=choice.reason + " (a CUDA graph is "
                                           "being captured: nothing is measured)")
            self.table.put(key, d)
        return choice if d is None else measured_choice(d)

    def _table_lines(self, g, case: Case, routes) -> list[str]:
        lines, apart = [], self._exact(g, case) is not None
        for route in routes:
            d = self.table.get(self.key(g, dataclasses.replace(case, route=route), apart))
            if d is not None:
                mc = measured_choice(d)
                lines.append(f"{mc.kernel or 'cuBLAS'} (measured, {route} callers) for "
                             f"{case.words(None if apart else self.buckets)}"
                             f"{' (its exact entry: this M alone)' if apart else ''}: "
                             f"{mc.reason}")
        return lines

    def explain(self, g, case: Case, routes=None) -> str:
        """Which kernel runs `case` on GPU g and why: the exact entry, the figures measured
        for its M-bucket (for each route in `routes`, default the case's own), or the
        estimates."""
        c = self.select_case(case, g.cc, g.arch.sm_count, g.name)
        if settled(c):
            if c.rule == "cublas":
                return f"cuBLAS (cublas): {c.reason}"
            return (f"{c.kernel} (exact): {c.reason} (the other Ms of its M-bucket, "
                    f"{self.buckets.text(case.m)}, are decided apart)")
        lines = self._table_lines(g, case, routes or (case.route,))
        return "\n".join(lines) or (f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason} (so with "
                                     f"measuring off); for {case.words(self.buckets)}: a first "
                                     "call will measure")

    def models(self) -> list[str]:
        """The GPU models the library's entries were tuned on."""
        return sorted({e["gpu"] for e in self.manifest.entries})

    def gpu_model(self, gpu: str) -> str:
        """The library's GPU model `gpu` names: exactly, or as a unique part of one
        ("H200"); LibraryError in one line otherwise."""
        models = self.models()
        if gpu in models:
            return gpu
        found = [x for x in models if gpu.strip().lower() in x.lower()]
        if len(found) == 1:
            return found[0]
        what = "names several" if found else "has no entries for"
        raise LibraryError(f"the library at {self.manifest.path} {what} {gpu!r} (it has: "
                           f"{', '.join(models) or 'none'}): explain() without a GPU answers "
                           "only for a GPU model the library was tuned on")

    def explain_offline(self, gpu: str, case: Case) -> str:
        """explain() for a GPU model the library was tuned on, with no GPU here: the exact
        entry or the estimates (from the entries' recorded timings and the occupancy
        model), and the decisions the table holds for that model (made under the driver
        and cuBLAS they name)."""
        gpu = self.gpu_model(gpu)
        cc = max(e["cc"] for e in self.manifest.entries if e["gpu"] == gpu)
        c = self.select_case(case, cc, ARCHS[cc].sm_count if cc in ARCHS else None, gpu)
        final = settled(c)
        note = "" if final else ("; with measuring off a decision the table holds, else "
                                   "this estimate, decides; on that GPU a first call measures")
        per = "" if not c.estimate_tflops else (
            f", about {2e-9 * case.m * case.n * case.k * case.batch / c.estimate_tflops:.4f} "
            "ms per call")
        lines = [f"{c.kernel or 'cuBLAS'} ({c.rule}, for {gpu} without a GPU here): "
                 f"{c.reason}{per}; the call: {case.words(self.buckets)}{note}"]
        if not final:
            lines += self._offline_table_lines(gpu, case)
        return "\n".join(lines)

    def _offline_table_lines(self, gpu: str, case: Case) -> list[str]:
        """The table's decisions for `case` on GPU model `gpu`, under any driver, cuBLAS
        and route."""
        want = DispatchTable.key(gpu, 0, 0, self.manifest.fingerprint, case.dtype.short,
                                 case.variant, self.buckets.text(case.m), case.n, case.k,
                                 case.align, case.batch, case.ld, self.pace,
                                 case.static_b).split("|")
        self.table.get("")  # loads it
        lines = []
        for key, d in sorted(self.table.decisions.items()):
            parts = key.split("|")
            if parts[0] == want[0] and parts[3:] == want[3:]:
                mc = measured_choice(d)
                lines.append(f"{mc.kernel or 'cuBLAS'} (measured on {gpu}, {parts[1]}, "
                             f"{parts[2]}): {mc.reason}")
        return lines
