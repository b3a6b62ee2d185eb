"""Which kernel runs a problem: the rule, its estimates, and the dispatch table that keeps
decisions made by measurement.

The rule, for a problem (device, dtype, variant, batch, M, N, K, alignment class; the
variant is the layout of A and B, C's type, the bias and the activation, see
codegen.families._common.Variant):
  0. only kernels built for exactly the problem's variant serve it (a kernel tuned for
     NN with fp32 C cannot serve NT or fp16 C); with none, cuBLAS runs (and the bias and
     activation after it: tuner.runtime.call).
  1. exact: an entry tuned for exactly this GPU model, dtype, variant, batch and shape,
     called with fully aligned operands, runs its kernel if it beat cuBLAS where it was
     tuned (its recorded ratio >= 1), else cuBLAS runs; both were timed in the same run.
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
from codegen.arch import ARCHS, parse_arch
from codegen.config import config_from_name
from codegen.occupancy import occupancy
from tuner.runtime.errors import LibraryError
from tuner.runtime.manifest import as_variant, entry_batch

__all__ = ["Choice", "efficiency", "estimate_tflops", "reduce_ms", "cublas_estimate",
           "REDUCE_LAUNCH_MS", "DispatchTable", "table_path", "TABLE_SCHEMA", "FULL_ALIGN",
           "Dispatcher", "measured_choice", "describe", "MAX_KERNEL_BATCH"]

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
    main_tuned = max(flops_tuned / (entry["tflops"] * 1e9)
                     - reduce_ms(config, tuned[0], tuned[1], mem_gbs, tb), 1e-6)  # ms
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

        {"schema": 1, "decisions": {KEY: {"kernel": NAME or null, "measured_ms": {...},
                                          "date": ISO}}}

    KEY joins the GPU model, driver version, cuBLAS version (and the route to it), the
    library's fingerprint (its kernel set), dtype, variant (the layout alone for fp32 C
    without an epilogue, as keys were before the variant), M x N x K, the batch (when not
    1) and the alignment class, so a decision is never reused where any of them differs. Writes are atomic (write, fsync, rename) under an
    exclusive lock on a sidecar file, re-reading the table first so concurrent writers lose
    nothing. A table that cannot be read is set aside (renamed *.corrupt-<time>) with a
    warning and started afresh: a lost cache costs a re-measurement, never a failure.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.decisions: dict[str, dict] = {}
        self._loaded = False

    @staticmethod
    def key(gpu_name: str, driver: int, cublas: int, fingerprint: str, dtype: str, layout,
            m: int, n: int, k: int, align: tuple, batch: int = 1) -> str:
        """`layout`: a Variant (or a Layout, or its text "nn")."""
        if not isinstance(layout, str):
            v = as_variant(layout)
            layout = v.layout.value if (v.out.short, v.bias, v.act) == ("f32", "none", "none") \
                else v.key
        shape = f"{m}x{n}x{k}" + (f"|batch {batch}" if batch != 1 else "")
        return (f"{gpu_name}|driver {driver}|cublas {cublas}|lib {fingerprint}|{dtype}|{layout}"
                f"|{shape}|align {'.'.join(map(str, align))}")

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


# ---- the rule ------------------------------------------------------------------------
#: an alignment class where every operand allows 16-byte accesses (address and row stride)
FULL_ALIGN = (16, 16, 16)


def measured_choice(d: dict) -> Choice:
    """The Choice a decision of the table stands for."""
    ms = d["measured_ms"]
    figures = ", ".join(f"{name} {t:.4f} ms" for name, t in sorted(ms.items(), key=lambda r: r[1]))
    who = d["kernel"] or f"cuBLAS (through {d.get('route', 'gemm-tune')})"
    return Choice(d["kernel"], "measured",
                  f"measured on first use ({d['date'][:10]}), ms per call in a loop: {figures}; "
                  f"{who} runs", None, ms)


class Dispatcher:
    """The rule of this module's doc over one library's manifest, and its table of
    decisions made by measurement (kept beside the library or in the user cache)."""

    def __init__(self, manifest):
        self.manifest = manifest
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
        best first, one per kernel."""
        arch = ARCHS.get(cc) or parse_arch("sm_90")
        best: dict[str, tuple[float, dict]] = {}
        if batch > MAX_KERNEL_BATCH:
            return []
        for e in self.manifest.serving(dtype, cc, variant):
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
               batch: int = 1) -> Choice:
        """The rule without measuring (rules 0, 1 and 3): exact, estimate or cuBLAS.
        `variant`: the request's Variant (or a Layout: fp32 C, no epilogue); `gpu`: the
        GPU's name (an exact entry must come from the same model); `align`: the operands'
        alignment class (an exact entry runs only on fully aligned ones; a kernel that
        needs 16-byte operands is no candidate for others); `batch`: the problems of a
        strided batch (an exact entry was tuned at that batch)."""
        variant = as_variant(variant)
        entries = self.manifest.serving(dtype, cc, variant)
        what = f"{m}x{n}x{k} {describe(dtype, variant, batch)}"
        if not entries:
            return Choice(None, "cublas", f"no kernel tuned for {describe(dtype, variant)} "
                                          f"on sm_{cc}: cuBLAS runs")
        if batch > MAX_KERNEL_BATCH:
            return Choice(None, "cublas", f"a batch of {batch} is more than a kernel launch "
                                          f"takes ({MAX_KERNEL_BATCH}): cuBLAS runs")
        for e in entries:
            if (e["m"], e["n"], e["k"], entry_batch(e)) == (m, n, k, batch) \
                    and align == FULL_ALIGN and gpu in (None, e["gpu"]):
                if e["ratio"] >= 1.0:
                    return Choice(e["kernel"], "exact",
                                  f"tuned for exactly {what} on {e['gpu']}: {e['tflops']:.1f} "
                                  f"TFLOP/s there, {e['ratio']:.2f}x cuBLAS", e["tflops"])
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

    def key(self, g, dtype, m: int, n: int, k: int, align: tuple, route: str = "gemm-tune",
            variant=None, batch: int = 1) -> str:
        """The table's key of a decision on GPU g (route: how cuBLAS is reached)."""
        from tuner.runtime.cublas import cublas_version

        return DispatchTable.key(g.name, g.driver_version, f"{cublas_version()} via {route}",
                                 self.manifest.fingerprint, dtype.short, as_variant(variant),
                                 m, n, k, align, batch)

    def decide(self, g, dtype, m: int, n: int, k: int, align: tuple, measure,
               route: str = "gemm-tune", variant=None, batch: int = 1) -> Choice:
        """The rule for one problem on GPU g. `measure`: None (decide without timing), or
        a callable (kernel names ranked best first) -> a table decision, called once per
        key: an exact entry that beat cuBLAS where it was tuned runs; anything else is
        measured against cuBLAS as this caller reaches it."""
        choice = self.select(m, n, k, dtype, g.cc, g.arch.sm_count, variant, g.name, align,
                             batch)
        if choice.rule == "cublas" or choice.kernel is not None and choice.rule == "exact" \
                or measure is None:
            return choice
        key = self.key(g, dtype, m, n, k, align, route, variant, batch)
        d = self.table.get(key)
        if d is None:
            ranked = self.ranked(m, n, k, dtype, g.cc, g.arch.sm_count, variant, align, batch)
            d = measure([e["kernel"] for _, e in ranked], choice)
            if d is None:  # a CUDA graph is being captured: nothing may be timed
                return Choice(choice.kernel, choice.rule, choice.reason + " (a CUDA graph "
                              "is being captured: nothing is measured)", choice.estimate_tflops)
            self.table.put(key, d)
        return measured_choice(d)

    def explain_offline(self, gpu: str, dtype, m: int, n: int, k: int, variant=None,
                        batch: int = 1) -> str:
        """explain() for a GPU model the library was tuned on, with no GPU here: the exact
        entry or the estimates (first-use measurements belong to a driver and a cuBLAS)."""
        ccs = {e["cc"] for e in self.manifest.entries if e["gpu"] == gpu}
        if not ccs:
            models = sorted({e["gpu"] for e in self.manifest.entries}) or ["none"]
            raise LibraryError(f"the library at {self.manifest.path} has no entries for "
                               f"{gpu!r} (it has: {', '.join(models)})")
        cc = max(ccs)
        c = self.select(m, n, k, dtype, cc, ARCHS[cc].sm_count if cc in ARCHS else None,
                        variant, gpu=gpu, batch=batch)
        settled = c.rule == "cublas" or c.rule == "exact" and c.kernel is not None
        note = "" if settled else "; on that GPU a first call measures"
        return (f"{c.kernel or 'cuBLAS'} ({c.rule}, for {gpu} without a GPU here): "
                f"{c.reason}{note}")

    def explain(self, g, dtype, m: int, n: int, k: int, align: tuple = FULL_ALIGN,
                variant=None, batch: int = 1) -> str:
        """Which kernel runs this problem on GPU g and why: the exact entry, the figures
        measured (per route to cuBLAS that has been measured), or the estimates."""
        c = self.decide(g, dtype, m, n, k, align, None, variant=variant, batch=batch)
        if c.rule == "cublas" or c.rule == "exact" and c.kernel is not None:
            return f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason}"
        lines = []
        for route in ("torch", "gemm-tune"):
            d = self.table.get(self.key(g, dtype, m, n, k, align, route, variant, batch))
            if d is not None:
                mc = measured_choice(d)
                lines.append(f"{mc.kernel or 'cuBLAS'} ({mc.rule}, {route} callers) for "
                             f"{m}x{n}x{k} {describe(dtype, variant, batch)}: {mc.reason}")
        return "\n".join(lines) or (f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason}; "
                                     "a first call will measure")
