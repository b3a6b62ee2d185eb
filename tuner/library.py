"""The tuned kernel library: a directory with a versioned manifest and, per kernel, its
.cu, its .cubin (sha256 in the manifest) and its metadata; and the runtime that loads
it and runs C = alpha*A*B + beta*C on the GPU.

Layout:
    library/manifest.json                 {"schema": 1, "kernels": {...}, "entries": [...]}
    library/kernels/<arch>/<name>.cu      the generated source
    library/kernels/<arch>/<name>.cubin   nvcc's output (sha256 checked on load)
    library/kernels/<arch>/<name>.json    config, resources, flags, nvcc, template hash

Dispatch (Library.select), for a problem (M, N, K, dtype) on a GPU of compute
capability cc:
  1. an entry tuned for exactly (cc, dtype, layout, M, N, K) runs its kernel;
  2. otherwise every kernel tuned on this cc for this dtype and layout is a candidate
     (each handles any shape, alignment and leading dimension: edges are predicated
     and vector accesses fall back to scalar at run time), and the one with the best
     estimate runs, where
        estimate = measured TFLOP/s at its tuned shape
                   x min(1, efficiency(new shape) / efficiency(tuned shape))
        efficiency = tile efficiency (useful / computed work with M, N, K rounded up
                     to the tile) x wave efficiency (blocks, tiles x split-K, over the
                     block slots of the waves they need; slots = SMs x blocks per SM
                     from the occupancy model);
     capped at 1: no kernel is assumed faster anywhere than where it was measured
     (a kernel tuned on a small problem would otherwise be extrapolated upward).
     A split-K kernel's second pass does not scale that way: its time,
        reduce(M, N) = (2 x SPLIT + 1) x M x N x 4 bytes / DRAM bandwidth + 2 us
     (the partial tiles written and read back, C written, and a launch), is taken out
     of the measured time before the scaling and the new shape's is added back;
  3. with no candidate, cuBLAS runs.
`Library.explain` says which of these applies and with what figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
from pathlib import Path

from codegen._io import atomic_write, atomic_write_json
from codegen.arch import ARCHS, parse_arch
from codegen.check import check
from codegen.config import DType, KernelConfig, Layout, WmmaConfig, config_from_dict, config_from_name
from codegen.errors import UsageError
from tuner.occupancy import occupancy

__all__ = ["SCHEMA", "LibraryError", "Library", "Choice", "load_library", "efficiency",
           "estimate_tflops", "reduce_ms"]

log = logging.getLogger(__name__)

SCHEMA = 1


class LibraryError(UsageError):
    """A library that cannot be used as it is, or a call it cannot serve."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


REDUCE_LAUNCH_MS = 0.002


def reduce_ms(config: KernelConfig | WmmaConfig, m: int, n: int, mem_gbs: float) -> float:
    """Milliseconds of a split-K kernel's reduction at M x N: the workspace written and read
    again, plus a launch for a second pass (0 without a workspace: no split-K, or one
    summed within a cluster)."""
    if not config.has_workspace:
        return 0.0
    launch = REDUCE_LAUNCH_MS if config.reduce_pass else 0.0
    return (2 * config.split + 1) * m * n * 4 / (mem_gbs * 1e6) + launch


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


def efficiency(config: KernelConfig | WmmaConfig, shape, sms: int, blocks_per_sm: int) -> float:
    """Tile efficiency x wave efficiency of `config` on `shape` (see the module doc)."""
    m, n, k = shape
    tile = (m * n * k) / (_cdiv(m, config.bm) * config.bm * _cdiv(n, config.bn) * config.bn
                          * _cdiv(k, config.bk) * config.bk)
    tiles = _cdiv(m, config.bm) * _cdiv(n, config.bn) * config.split
    slots = max(1, sms * max(blocks_per_sm, 1))
    wave = tiles / (_cdiv(tiles, slots) * slots)
    return tile * wave


@dataclasses.dataclass(frozen=True)
class Choice:
    kernel: str | None  # None: cuBLAS
    rule: str  # "exact", "estimate" or "cublas"
    reason: str
    estimate_tflops: float | None = None


class Library:
    """A tuned-kernel library on disk. Use :func:`load_library` to open one for running."""

    def __init__(self, path: str | Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self._kernels: dict = {}  # name -> tuner.gpu.Kernel, loaded on first use

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

    @contextlib.contextmanager
    def _lock(self):
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

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

    def _unreferenced(self) -> list[str]:
        used = {f"{e['arch']}/{e['kernel']}" for e in self.manifest["entries"]}
        return [k for k in self.manifest["kernels"] if k not in used]

    # ---- dispatch (pure) ---------------------------------------------------------------
    def select(self, m: int, n: int, k: int, dtype: DType = DType.F32, cc: int = 90,
               sms: int | None = None, layout: Layout = Layout.NN) -> Choice:
        entries = [e for e in self.manifest["entries"]
                   if e["cc"] == cc and e["dtype"] == dtype.short and e["layout"] == layout.value]
        for e in entries:
            if (e["m"], e["n"], e["k"]) == (m, n, k):
                return Choice(e["kernel"], "exact",
                              f"tuned for exactly {m}x{n}x{k} {dtype.short} on sm_{cc}: "
                              f"{e['tflops']:.1f} TFLOP/s there, {e['ratio']:.2f}x cuBLAS",
                              e["tflops"])
        if not entries:
            return Choice(None, "cublas", f"no kernel tuned for {dtype.short} "
                                          f"{layout.value} on sm_{cc}: cuBLAS runs")
        arch = ARCHS.get(cc) or parse_arch("sm_90")
        sms = sms or arch.sm_count
        best: tuple[float, dict] | None = None
        for e in entries:
            cfg = config_from_name(e["kernel"])
            res = e["resources"]
            bps = occupancy(cfg.threads, res["registers"],
                            res["smem_static"] + res["smem_dynamic"], arch).blocks_per_sm
            est = estimate_tflops(cfg, e, (m, n, k), sms, bps, arch.mem_gbs)
            if best is None or est > best[0]:
                best = (est, e)
        est, e = best
        return Choice(e["kernel"], "estimate",
                      f"no entry for {m}x{n}x{k}; of {len(entries)} kernels tuned on sm_{cc}, "
                      f"{e['kernel']} (tuned at {e['m']}x{e['n']}x{e['k']}, {e['tflops']:.1f} "
                      f"TFLOP/s) has the best estimate, {est:.1f} TFLOP/s, from tile and wave "
                      "efficiency (and split-K's reduce pass)", est)

    def explain(self, m: int, n: int, k: int, dtype: DType | str = DType.F32) -> str:
        """Which kernel `gemm` would run for this problem on this GPU, and why."""
        dtype = dtype if isinstance(dtype, DType) else DType.parse(dtype)
        dev = self._device()
        c = self.select(m, n, k, dtype, dev.cc, dev.arch.sm_count)
        return f"{c.kernel or 'cuBLAS'} ({c.rule}): {c.reason}"

    # ---- running ----------------------------------------------------------------------
    def _device(self):
        from tuner.gpu import device

        return device()

    def _kernel(self, name: str, arch: str):
        """Load a kernel once per process (this process uses the device's primary context)."""
        if name not in self._kernels:
            from tuner.gpu import Kernel

            info = self.manifest["kernels"][f"{arch}/{name}"]
            self._kernels[name] = Kernel(config_from_name(name), self.path / info["cubin"])
        return self._kernels[name]

    def gemm(self, A, B, C=None, alpha: float = 1.0, beta: float = 0.0,
             allow_tf32: bool = False):
        """C = alpha * A @ B + beta * C with the tuned kernels (see the module doc).

        A (M x K) and B (K x N) are row-major matrices of one type, float32, float16 or
        bfloat16; C (M x N) is float32 (FP32 accumulation and output for every type).
        They are numpy arrays (copied to the GPU and C back), pycuda GPUArrays, torch
        tensors, or any object exposing __cuda_array_interface__ (cupy), used in place.
        Rows may be padded (a leading dimension >= the row length); columns must be
        contiguous. float32 inputs run the fp32 entries, or with `allow_tf32` the tf32
        ones (TF32 tensor cores; cuBLAS with TF32 when none is tuned). Returns C
        (allocated, float32, like A when None is passed). Checks everything before
        launching; raises LibraryError for what it cannot serve.
        """
        from tuner import _operands as ops

        a = ops.operand(A, "A", inputs=True)
        b = ops.operand(B, "B", inputs=True)
        if a.dtype is not b.dtype:
            raise LibraryError(f"A is {a.dtype.short} and B is {b.dtype.short}: "
                               "they must be of one type")
        dtype = a.dtype
        if allow_tf32 and dtype is DType.F32:
            dtype = DType.TF32
        if a.cols != b.rows:
            raise LibraryError(f"A is {a.rows}x{a.cols} and B is {b.rows}x{b.cols}: "
                               "A's columns must equal B's rows")
        m, n, k = a.rows, b.cols, a.cols
        if C is None and beta != 0:
            raise LibraryError("beta != 0 needs a C to read")
        if C is not None:
            c = ops.operand(C, "C", writable=True)
            if (c.rows, c.cols) != (m, n):
                raise LibraryError(f"C is {c.rows}x{c.cols}; A @ B is {m}x{n}")
        dev = self._device()  # everything above is checked before the GPU is touched
        if C is None:
            C = ops.empty_like(A, (m, n))
            c = ops.operand(C, "C", writable=True)
        ops.check_devices(dev.index, a, b, c)
        choice = self.select(m, n, k, dtype, dev.cc, dev.arch.sm_count)
        with ops.on_device(a, b, c) as (pa, pb, pc):
            if choice.kernel is None:
                from tuner.cublas import cublas

                cublas().gemm(dtype, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld)
            else:
                self._kernel(choice.kernel, dev.sm)(m, n, k, alpha, pa, a.ld, pb, b.ld, beta,
                                                    pc, c.ld)
        return C



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
