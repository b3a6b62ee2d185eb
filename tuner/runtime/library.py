"""The tuned kernel library: a directory with a versioned manifest and, per kernel, its
.cu, its .cubin (sha256 in the manifest) and its metadata; and the runtime that loads
it and runs C = alpha*A*B + beta*C on the caller's GPU and stream.

Layout:
    library/manifest.json                 {"schema": 1, "kernels": {...}, "entries": [...]}
    library/kernels/<arch>/<name>.cu      the generated source
    library/kernels/<arch>/<name>.cubin   nvcc's output (sha256 checked on load)
    library/kernels/<arch>/<name>.json    config, resources, flags, nvcc, template hash
    library/dispatch.json                 decisions measured on first use (see dispatch.py;
                                          in the user cache where the library is read-only)

Which kernel runs what is tuner.runtime.dispatch's rule; cuBLAS is always a candidate.

The call path (Library.gemm) is thin: a call's operands are read (for torch tensors:
dtype, shape, strides, device and the pointers' alignment), and that tuple is the key of
a memo holding the call's plan (the decision, the launch geometry, the kernel loaded), so
the rule, the estimates and the checks run once per (device, dtype, layout, M, N, K,
leading dimensions, alignment class). Then the caller's stream is read (torch's raw
handle) and the kernel launched through the driver API with a parameter block packed in
one call. Any thread may call; kernels are loaded once per process and into each GPU's
primary context on first launch there; nothing is allocated, synchronised or timed while
a CUDA graph is being captured.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from codegen._io import atomic_write, atomic_write_json, file_lock
from codegen.arch import ARCHS, parse_arch
from codegen.check import check
from codegen.config import DType, Layout, config_from_dict, config_from_name
from codegen.errors import UsageError
from tuner.occupancy import occupancy
from tuner.runtime import launch
from tuner.runtime.dispatch import (
    Choice, DispatchTable, cublas_estimate, estimate_tflops, table_path,
)

__all__ = ["SCHEMA", "LibraryError", "Library", "Choice", "load_library"]

log = logging.getLogger(__name__)

SCHEMA = 1
#: how many library kernels (best estimates first) a first-use measurement times beside cuBLAS
MEASURE_TOP = 3
#: a kernel must beat cuBLAS by this much in a first-use measurement to be chosen
MEASURE_MARGIN = 1.02
FULL_ALIGN = (16, 16, 16)


class LibraryError(UsageError):
    """A library that cannot be used as it is, or a call it cannot serve."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def runnable(name: str) -> bool:
    """Can the run-time library and the export bundle launch kernel `name`? Not the wgmma
    family's TMA-store epilogue (store=1, ``_ts``) yet: it is built and run by the tuner's
    runner only (and not searched) until the GPU has measured it; such an entry is passed
    over, never launched with the wrong arguments."""
    return not getattr(config_from_name(name), "store", 0)


def _measure_default() -> bool:
    return os.environ.get("GEMM_TUNE_MEASURE", "1").strip().lower() not in ("0", "no", "off",
                                                                           "false")


class Library:
    """A tuned-kernel library on disk. Use :func:`load_library` to open one for running."""

    def __init__(self, path: str | Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self._runners: dict = {}  # kernel name -> launch.KernelRunner, loaded on first use
        self._plans: dict = {}  # call key -> launch.Plan (see launch.gemm)
        self._dispatch: DispatchTable | None = None
        self._load_lock = threading.Lock()
        self._measure_lock = threading.Lock()
        #: gemm's default for `measure`: on, unless GEMM_TUNE_MEASURE=0 when the library loads
        self.measure = _measure_default()

    # ---- on disk ------------------------------------------------------------------
    @classmethod
    def create_or_open(cls, path: str | Path) -> "Library":
        path = Path(path)
        if (path / "manifest.json").exists():
            return cls.load(path, verify=False)
        return cls(path, {"schema": SCHEMA, "kernels": {}, "entries": []})

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> "Library":
        """Read the manifest; with `verify`, check every file's hash and re-validate every
        config. Raises LibraryError, naming the file, for anything wrong."""
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise LibraryError(f"no library at {path}: {mpath} does not exist")
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LibraryError(f"library manifest {mpath} is unreadable ({e})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("kernels"), dict) \
                or not isinstance(manifest.get("entries"), list):
            raise LibraryError(f"library manifest {mpath} is not a gemm-tune manifest")
        schema = manifest.get("schema")
        if not isinstance(schema, int) or schema > SCHEMA:
            raise LibraryError(f"library manifest {mpath} has schema {schema!r}; this gemm-tune "
                               f"reads schema {SCHEMA} and older: upgrade gemm-tune")
        lib = cls(path, manifest)
        if verify:
            lib.verify()
        return lib

    def verify(self) -> None:
        for key, k in self.manifest["kernels"].items():
            for field in ("source", "cubin"):
                f = self.path / k[field]
                if not f.is_file():
                    raise LibraryError(f"library file {f} is missing")
                if _sha256(f) != k[f"{field}_sha256"]:
                    raise LibraryError(f"library file {f} does not match its sha256 in the "
                                       "manifest (tampered or truncated): refusing to load it")
            try:
                cfg = config_from_dict(k["config"])
            except (KeyError, TypeError, ValueError, StopIteration) as e:
                raise LibraryError(f"kernel {key} in {self.path / 'manifest.json'} has a bad "
                                   f"config ({e})") from None
            why = check(cfg, k["arch"])
            if why or cfg.name != k["name"]:
                raise LibraryError(f"kernel {key} in {self.path / 'manifest.json'} does not "
                                   f"validate: {'; '.join(why) or 'name does not match config'}")
        for e in self.manifest["entries"]:
            if f"{e['arch']}/{e['kernel']}" not in self.manifest["kernels"]:
                raise LibraryError(f"entry {e['m']}x{e['n']}x{e['k']} in "
                                   f"{self.path / 'manifest.json'} names a missing kernel")

    def _lock(self):
        return file_lock(self.path / ".lock")

    def add(self, entry: dict, source: Path, cubin: Path, meta: Path | None = None) -> None:
        """Add (or replace) a tuned entry and its kernel's files; the manifest is rewritten
        atomically under a lock, and re-read first so concurrent writers lose nothing."""
        arch, name = entry["arch"], entry["kernel"]
        rel = Path("kernels") / arch
        with self._lock():
            d = self.path / rel
            d.mkdir(parents=True, exist_ok=True)
            atomic_write(d / f"{name}.cu", Path(source).read_bytes())
            atomic_write(d / f"{name}.cubin", Path(cubin).read_bytes())
            if meta is not None and Path(meta).is_file():
                atomic_write(d / f"{name}.json", Path(meta).read_bytes())
            if (self.path / "manifest.json").exists():
                self.manifest = Library.load(self.path, verify=False).manifest
            self.manifest["kernels"][f"{arch}/{name}"] = dict(
                name=name, arch=arch, config=config_from_name(name).to_dict(),
                source=str(rel / f"{name}.cu"), source_sha256=_sha256(d / f"{name}.cu"),
                cubin=str(rel / f"{name}.cubin"), cubin_sha256=_sha256(d / f"{name}.cubin"),
                meta=str(rel / f"{name}.json"),
            )
            same = ("cc", "dtype", "layout", "m", "n", "k", "gpu")
            self.manifest["entries"] = [
                e for e in self.manifest["entries"]
                if tuple(e[f] for f in same) != tuple(entry[f] for f in same)
            ] + [entry]
            self.manifest["schema"] = SCHEMA
            orphans = self._unreferenced()
            for key in orphans:
                del self.manifest["kernels"][key]
            atomic_write_json(self.path / "manifest.json", self.manifest)
            for key in orphans:  # after the manifest no longer names them
                for ext in (".cu", ".cubin", ".json"):
                    (self.path / "kernels" / f"{key}{ext}").unlink(missing_ok=True)

    def update_entry(self, entry: dict, **fields) -> dict:
        """Set `fields` on the stored entry of `entry`'s (gpu, cc, dtype, layout, m, n, k),
        the manifest rewritten atomically under the lock (re-read first); the updated entry.
        KeyError when no stored entry matches (gemm-tune inspect --profile uses it)."""
        same = ("cc", "dtype", "layout", "m", "n", "k", "gpu")
        with self._lock():
            self.manifest = Library.load(self.path, verify=False).manifest
            for e in self.manifest["entries"]:
                if tuple(e[f] for f in same) == tuple(entry[f] for f in same):
                    e.update(fields)
                    atomic_write_json(self.path / "manifest.json", self.manifest)
                    return e
        raise KeyError(f"no library entry for {entry.get('kernel')} at "
                       f"{entry.get('m')}x{entry.get('n')}x{entry.get('k')}")

    def _unreferenced(self) -> list[str]:
        used = {f"{e['arch']}/{e['kernel']}" for e in self.manifest["entries"]}
        return [k for k in self.manifest["kernels"] if k not in used]

    # ---- dispatch (pure) ---------------------------------------------------------------
    def _entries(self, dtype: DType, cc: int, layout: Layout) -> list[dict]:
        """Entries that serve a request: its own, and for an f32x3 request (3xTF32 allowed)
        the fp32 ones too (they are as accurate)."""
        shorts = {dtype.short, DType.F32.short} if dtype is DType.F32X3 else {dtype.short}
        return [e for e in self.manifest["entries"]
                if e["cc"] == cc and e["dtype"] in shorts and e["layout"] == layout.value
                and runnable(e["kernel"])]

    @property
    def fingerprint(self) -> str:
        """The library's kernel set and entries, hashed: a dispatch decision is keyed with it."""
        rows = sorted(f"{e['gpu']}|{e['dtype']}|{e['m']}x{e['n']}x{e['k']}|{e['kernel']}"
                      for e in self.manifest["entries"])
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:12]

    def ranked(self, m: int, n: int, k: int, dtype: DType, cc: int, sms: int,
               layout: Layout = Layout.NN, tma_ok: bool = True) -> list[tuple[float, dict]]:
        """(estimated TFLOP/s, entry) of every kernel tuned on this cc for this dtype and
        layout, best first, one row per kernel; without `tma_ok` (A or B not 16-byte aligned
        in address or row stride), none whose TMA reads the caller's A and B."""
        arch = ARCHS.get(cc) or parse_arch("sm_90")
        best: dict[str, tuple[float, dict]] = {}
        for e in self._entries(dtype, cc, layout):
            cfg = config_from_name(e["kernel"])
            if not tma_ok and getattr(cfg, "tma_operands", False):
                continue
            res = e["resources"]
            bps = occupancy(cfg.threads, res["registers"],
                            res["smem_static"] + res["smem_dynamic"], arch).blocks_per_sm
            est = estimate_tflops(cfg, e, (m, n, k), sms, bps, arch.mem_gbs)
            if e["kernel"] not in best or est > best[e["kernel"]][0]:
                best[e["kernel"]] = (est, e)
        return sorted(best.values(), key=lambda r: -r[0])

    def select(self, m: int, n: int, k: int, dtype: DType = DType.F32, cc: int = 90,
               sms: int | None = None, layout: Layout = Layout.NN, gpu: str | None = None,
               aligned: bool = True, tma_ok: bool = True) -> Choice:
        """The rule without measuring (dispatch.py's rules 1 and 3): exact, estimate or
        cuBLAS. `gpu`: the GPU's name (an exact entry must come from the same model);
        `aligned`: every operand fully (16-byte) aligned; `tma_ok`: A and B are (TMA's
        rule: without it no wgmma kernel is a candidate)."""
        entries = self._entries(dtype, cc, layout)
        what = f"{m}x{n}x{k} {dtype.short}"
        if not entries:
            return Choice(None, "cublas", f"no kernel tuned for {dtype.short} "
                                          f"{layout.value} on sm_{cc}: cuBLAS runs")
        for e in entries:
            if (e["m"], e["n"], e["k"]) == (m, n, k) and aligned and gpu in (None, e["gpu"]):
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
        ranked = self.ranked(m, n, k, dtype, cc, sms, layout, tma_ok)
        if not ranked:
            return Choice(None, "cublas", f"no kernel tuned for {dtype.short} {layout.value} "
                                          f"on sm_{cc} takes these operands (TMA needs A and B "
                                          "16-byte aligned): cuBLAS runs")
        est, e = ranked[0]
        blas = cublas_estimate(entries, (m, n, k), sms)
        figures = (f"{e['kernel']} (tuned at {e['m']}x{e['n']}x{e['k']}, {e['tflops']:.1f} "
                   f"TFLOP/s) has the best estimate, {est:.1f} TFLOP/s, against cuBLAS's "
                   f"estimated {blas:.1f}")
        if est > blas:
            return Choice(e["kernel"], "estimate", f"no entry for {what}; {figures}", est)
        return Choice(None, "estimate", f"no entry for {what}; {figures}: cuBLAS runs", blas)

    @property
    def table_path(self) -> Path:
        """Where the dispatch table of this library is kept."""
        return self._table().path

    def decide(self, m: int, n: int, k: int, dtype: DType | str = DType.F32,
               device: int | None = None, route: str | None = None) -> Choice:
        """The kernel that runs this problem (fully aligned, packed operands) on this GPU,
        measuring now if the rule asks to and no decision is kept (`gemm-tune prewarm`).
        `route`: how cuBLAS is reached, "torch" (torch tensors; the default where torch is
        installed) or "gemm-tune" (cupy, pycuda, numpy, pointers)."""
        from tuner.runtime import driver

        dtype = dtype if isinstance(dtype, DType) else DType.parse(dtype)
        if route is None:
            route = "torch" if _torch_importable() \
                and dtype in (DType.F32, DType.TF32, DType.F32X3) \
                else "gemm-tune"
        g = driver.gpu(driver.current_device() if device is None else device)
        stream = 0  # the legacy default stream: torch's default stream too
        mode = dtype if dtype in (DType.TF32, DType.F32X3) else None
        problem = launch.Problem(g, dtype, m, n, k, k, n, n, (0, 0, 0), route == "torch",
                                 mode, True, stream)
        with driver.entered(g):
            return self._decide(g, dtype, m, n, k, FULL_ALIGN, None, True, route,
                                problem.timer(self))

    def explain(self, m: int, n: int, k: int, dtype: DType | str = DType.F32,
                device: int | None = None) -> str:
        """Which kernel `gemm` runs for this problem (fully aligned, packed operands) on this
        GPU, and why: the exact entry, the figures measured (for each route to cuBLAS that
        has been measured: torch callers', and everyone else's), or the estimates."""
        from tuner.runtime import driver

        dtype = dtype if isinstance(dtype, DType) else DType.parse(dtype)
        g = driver.gpu(driver.current_device() if device is None else device)
        c = self._decide(g, dtype, m, n, k, FULL_ALIGN, stream=None, measure=False)
        if c.rule == "exact" and c.kernel is not None or not self._entries(dtype, g.cc,
                                                                           Layout.NN):
            return f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason}"
        lines = []
        for route in ("torch", "gemm-tune"):
            d = self._table().get(self._table_key(g, dtype, m, n, k, FULL_ALIGN, route))
            if d is not None:
                mc = _measured_choice(d)
                lines.append(f"{mc.kernel or 'cuBLAS'} ({mc.rule}, {route} callers): "
                             f"{mc.reason}")
        return "\n".join(lines) or (f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason}; "
                                     "a first call will measure")

    # ---- deciding ----------------------------------------------------------------------
    def _table(self) -> DispatchTable:
        if self._dispatch is None:
            self._dispatch = DispatchTable(table_path(self.path))
        return self._dispatch

    def _table_key(self, g, dtype: DType, m: int, n: int, k: int, align: tuple,
                   route: str = "gemm-tune") -> str:
        from tuner.runtime.cublas import cublas_version

        return DispatchTable.key(g.name, g.driver_version, f"{cublas_version()} via {route}",
                                 self.fingerprint, dtype.short, Layout.NN.value, m, n, k, align)

    def _decide(self, g, dtype: DType, m: int, n: int, k: int, align: tuple,
                stream: int | None, measure: bool, route: str = "gemm-tune",
                timer=None) -> Choice:
        """dispatch.py's rule for one problem on GPU g, measuring with `timer` (kernel
        names -> {name or "cublas": ms per call}) if asked and allowed. `route`: how cuBLAS
        is reached ("torch": through torch for a torch caller; "gemm-tune": its own binding)."""
        from tuner.runtime import driver

        tma_ok = align[0] == align[1] == 16
        choice = self.select(m, n, k, dtype, g.cc, g.arch.sm_count, gpu=g.name,
                             aligned=align == FULL_ALIGN, tma_ok=tma_ok)
        # an exact entry that beat cuBLAS where it was tuned runs; one that lost is measured
        # against cuBLAS as this caller reaches it, like any other shape
        if choice.rule == "cublas" or choice.kernel is not None and choice.rule == "exact" \
                or not measure or timer is None:
            return choice
        key = self._table_key(g, dtype, m, n, k, align, route)
        with self._measure_lock:
            d = self._table().get(key)
            if d is None:
                if stream is not None and driver.is_capturing(stream):
                    return Choice(choice.kernel, choice.rule, choice.reason + " (a CUDA graph "
                                  "is being captured: nothing is measured)",
                                  choice.estimate_tflops)
                d = self._measure(g, dtype, m, n, k, route, timer, tma_ok)
                self._table().put(key, d)
        return _measured_choice(d)

    def _measure(self, g, dtype, m, n, k, route, timer, tma_ok=True) -> dict:
        import datetime

        ranked = [e["kernel"] for _, e in self.ranked(m, n, k, dtype, g.cc, g.arch.sm_count,
                                                      tma_ok=tma_ok)]
        names = ranked[:MEASURE_TOP]
        # and the best-estimated kernel of one launch, where a host-bound call is decided
        single = [name for name in ranked if not config_from_name(name).reduce_pass]
        if single and single[0] not in names:
            names.append(single[0])
        ms = timer(names)
        best = min((t, name) for name, t in ms.items() if name != "cublas")
        kernel = best[1] if best[0] * MEASURE_MARGIN < ms["cublas"] else None
        log.info("dispatch %dx%dx%d %s measured: %s", m, n, k, dtype.short, ms)
        return dict(kernel=kernel, route=route,
                    measured_ms={name: round(t, 5) for name, t in ms.items()},
                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))

    # ---- running ----------------------------------------------------------------------
    def _runner(self, name: str, arch: str):
        """A kernel's launcher, loaded once per process (any thread)."""
        run = self._runners.get(name)
        if run is None:
            with self._load_lock:
                run = self._runners.get(name)
                if run is None:
                    info = self.manifest["kernels"][f"{arch}/{name}"]
                    run = launch.runner_for(config_from_name(name),
                                            (self.path / info["cubin"]).read_bytes())
                    self._runners[name] = run
        return run

    def gemm(self, A, B, C=None, alpha: float = 1.0, beta: float = 0.0,
             allow_tf32: bool = False, stream=None, measure: bool | None = None,
             pipeline: bool | str = True, allow_3xtf32: bool = False):
        """C = alpha * A @ B + beta * C with the tuned kernels, or cuBLAS where it is faster
        (see tuner.runtime.dispatch for the rule).

        A (M x K) and B (K x N) are row-major matrices of one type, float32, float16 or
        bfloat16; C (M x N) is float32 (FP32 accumulation and output for every type).
        They are torch tensors, cupy arrays, pycuda GPUArrays or any object exposing
        __cuda_array_interface__, used in place, or numpy arrays: when A, B and C are all
        numpy, the product runs as a pipeline over chunks of rows, its copies through
        pinned buffers overlapping the compute (tuner.runtime.host; `pipeline=False`:
        copy in, compute, copy out, one after the other; "pageable": the same pipeline
        without pinned staging, to show why it is there). Rows may be padded (a leading dimension >= the row length); columns must
        be contiguous. float32 inputs run the fp32 entries, or with `allow_tf32` the tf32
        ones (cuBLAS with TF32 where none wins), or with `allow_3xtf32` the 3xTF32 ones
        beside the fp32 ones (fp32 accuracy; cuBLAS SGEMM is their rival).

        The call runs on `stream` when given (an int handle or a torch, cupy, pycuda or
        CUDA Python stream), else on torch's current stream for torch tensors, cupy's for
        cupy arrays, else the legacy default stream; on the GPU holding the operands,
        from any thread, and inside CUDA-graph capture. `measure` (default: on, unless
        GEMM_TUNE_MEASURE=0) lets a shape with no exact entry be decided by timing the
        best candidates and cuBLAS once (see Library.explain); its default is the
        library's `measure` attribute. Returns C (allocated like A,
        float32, when None is passed). Raises LibraryError, before any launch, for what it
        cannot serve.
        """
        return launch.gemm(self, A, B, C, alpha, beta, _mode(allow_tf32, allow_3xtf32),
                           stream, self.measure if measure is None else measure, pipeline)

    def gemm_batch(self, pairs, alpha: float = 1.0, beta: float = 0.0, out=None,
                   allow_tf32: bool = False, measure: bool | None = None,
                   allow_3xtf32: bool = False) -> list:
        """C_i = alpha * A_i @ B_i (+ beta * C_i) for a list of (A_i, B_i) numpy pairs, in
        a pipeline over three streams with pinned staging (tuner.runtime.host): item i+1's
        copies in and item i-1's copy out overlap item i's GEMM. `out`: the C_i (float32
        numpy, read when beta != 0), else allocated. Returns the C_i."""
        return launch.gemm_batch(self, pairs, alpha, beta, out, _mode(allow_tf32, allow_3xtf32),
                                 self.measure if measure is None else measure)


def _mode(allow_tf32: bool, allow_3xtf32: bool) -> DType | None:
    """The fp32 request a call's flags make (see launch.fp32_request)."""
    if allow_tf32 and allow_3xtf32:
        raise LibraryError("allow_tf32 and allow_3xtf32 exclude each other")
    return DType.TF32 if allow_tf32 else DType.F32X3 if allow_3xtf32 else None


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _measured_choice(d: dict) -> Choice:
    ms = d["measured_ms"]
    figures = ", ".join(f"{name} {t:.4f} ms" for name, t in sorted(ms.items(), key=lambda r: r[1]))
    who = d["kernel"] or f"cuBLAS (through {d.get('route', 'gemm-tune')})"
    return Choice(d["kernel"], "measured",
                  f"measured on first use ({d['date'][:10]}), ms per call in a loop: {figures}; "
                  f"{who} runs", None, ms)


def load_library(path: str | Path = "artifacts/library") -> Library:
    """Open a tuned-kernel library: every file's sha256 is checked and every config
    re-validated before anything runs.

    Example:
        >>> lib = load_library("artifacts/library")            # doctest: +SKIP
        >>> lib.explain(4096, 4096, 4096, "fp32")               # doctest: +SKIP
        'gemm_simt_f32_256x128x16_r8x8_w16x2_p0_v4_s2_g1 (exact): ...'
        >>> C = lib.gemm(A, B)   # torch / cupy / pycuda / numpy  # doctest: +SKIP
    """
    return Library.load(path, verify=True)
