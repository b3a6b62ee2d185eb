"""Compiling: CUDA source -> cubin with nvcc, and the ptxas resource report parsed.

Results are cached on disk by content hash (source, arch, flags, nvcc version),
and many configurations compile in parallel in a spawn process pool whose
workers never touch a GPU (codegen imports no CUDA binding).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from codegen._io import atomic_write, atomic_write_json
from codegen.arch import ArchLimits, parse_arch
from codegen.families import Config, Family
from codegen.errors import ToolchainError
from codegen.rendering import render, template_hash

__all__ = [
    "Resources", "CompileResult", "ToolchainError", "nvcc_path", "nvcc_version",
    "parse_ptxas", "compile_source", "compile_config", "compile_many", "default_cache_dir",
    "NVCC_FLAGS", "compile_task", "target_arch", "arch_target", "config_flags",
]

log = logging.getLogger(__name__)

NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v")


@dataclasses.dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel, plus the dynamic shared memory it launches with."""

    registers: int
    smem_static: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    barriers: int
    smem_dynamic: int = 0
    ptxas_ms: float = 0.0  # ptxas's own "Compile time" for this entry

    @property
    def smem(self) -> int:
        """Shared memory per block: static plus dynamic."""
        return self.smem_static + self.smem_dynamic

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """The outcome of compiling one source: a cubin and its resources, or the compiler's message."""

    name: str
    arch: str
    ok: bool
    log: str
    seconds: float
    cubin: Path | None = None
    resources: Resources | None = None
    cached: bool = False
    source: str = dataclasses.field(default="", repr=False)

    @property
    def error(self) -> str:
        """The compiler's error lines (the whole log if none is marked as an error)."""
        lines = [l for l in self.log.splitlines() if "error" in l.lower() or "fatal" in l.lower()]
        return "\n".join(lines) or self.log.strip()


# ---- the toolchain ---------------------------------------------------------------
@functools.cache
def nvcc_path() -> str:
    """nvcc from $CUDA_HOME or $CUDA_PATH, the PATH, or /usr/local/cuda."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    found = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
    )
    if not found:
        raise ToolchainError(
            "nvcc not found: install the CUDA toolkit, or set CUDA_HOME to its directory"
        )
    return found


@functools.cache
def nvcc_version() -> str:
    """e.g. 'release 13.0, V13.0.88' (part of every compile-cache key)."""
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V[\d.]+", out)
    if not m:
        raise ToolchainError(f"cannot read the version of {nvcc_path()}: {out.strip()!r}")
    return m.group(0)


def default_cache_dir() -> Path:
    root = os.environ.get("GEMM_TUNE_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "gemm-tune"
    )
    return Path(root)


# ---- the ptxas report ------------------------------------------------------------
_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BAR_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_TIME_RE = re.compile(r"Compile time = ([\d.]+) ms")


def parse_ptxas(text: str, entry: str | None = None) -> Resources:
    """Resources of `entry` (the first entry function if None) from `ptxas -v` output.

    Raises:
        ValueError: the report has no such entry or lacks its register line.
    """
    blocks: list[tuple[str, str]] = []
    for m in _ENTRY_RE.finditer(text):
        blocks.append((m.group(1), m.start()))
    if not blocks:
        raise ValueError("no 'Compiling entry function' line in the ptxas report")
    names = [b[0] for b in blocks]
    idx = 0 if entry is None else (names.index(entry) if entry in names else -1)
    if idx < 0:
        raise ValueError(f"entry {entry!r} not in the ptxas report (has {names})")
    start = blocks[idx][1]
    end = blocks[idx + 1][1] if idx + 1 < len(blocks) else len(text)
    part = text[start:end]
    used = _USED_RE.search(part)
    if not used:
        raise ValueError(f"no register count for {names[idx]!r} in the ptxas report")
    frame = _FRAME_RE.search(part)
    bars = _BAR_RE.search(part)
    smem = _SMEM_RE.search(part)
    ms = _TIME_RE.search(part)
    stack, st, ld = (int(g) for g in frame.groups()) if frame else (0, 0, 0)
    return Resources(
        registers=int(used.group(1)),
        smem_static=int(smem.group(1)) if smem else 0,
        spill_stores=st,
        spill_loads=ld,
        stack_frame=stack,
        barriers=int(bars.group(1)) if bars else 0,
        ptxas_ms=float(ms.group(1)) if ms else 0.0,
    )


# ---- compiling -------------------------------------------------------------------
def _key(source: str, arch: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, arch, " ".join(flags), nvcc_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def arch_target(arch: str | int | ArchLimits) -> tuple[str, list[str]]:
    """The target name and nvcc's flag for `arch`: ("sm_90", ["-arch=sm_90"]), or for an
    architecture-specific target such as "sm_90a" (wgmma, setmaxnreg) one -gencode, since
    nvcc's -arch=sm_90a shorthand may add a plain sm_90 pass that rejects those."""
    sm = parse_arch(arch).sm
    if isinstance(arch, str) and arch.strip().lower().endswith("a"):
        cc = sm.removeprefix("sm_")
        return f"{sm}a", [f"-gencode=arch=compute_{cc}a,code=sm_{cc}a"]
    return sm, [f"-arch={sm}"]


def compile_source(
    source: str,
    arch: str | int | ArchLimits,
    name: str,
    cache_dir: Path | None = None,
    flags: tuple[str, ...] = NVCC_FLAGS,
    smem_dynamic: int = 0,
) -> CompileResult:
    """Compile `source` to a cubin for `arch`; an error is a result with the compiler's message."""
    sm, target = arch_target(arch)
    cache_dir = Path(cache_dir or default_cache_dir()) / "cubin"
    key = _key(source, sm, flags)
    cubin = cache_dir / f"{key}.cubin"
    meta = cache_dir / f"{key}.json"
    if cubin.is_file() and meta.is_file():
        try:
            m = json.loads(meta.read_text())
            return CompileResult(
                name=name, arch=sm, ok=True, log=m["log"], seconds=m["seconds"], cubin=cubin,
                resources=dataclasses.replace(parse_ptxas(m["log"], name), smem_dynamic=smem_dynamic),
                cached=True, source=source,
            )
        except (ValueError, KeyError, OSError) as e:
            log.warning("ignoring a damaged compile-cache entry %s: %s", meta, e)

    with tempfile.TemporaryDirectory(prefix="gemm-tune-") as tmp:
        src = Path(tmp, f"{name}.cu")
        out = Path(tmp, f"{name}.cubin")
        src.write_text(source)
        cmd = [nvcc_path(), "-cubin", *target, *flags, "-o", str(out), str(src)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        seconds = time.perf_counter() - t0
        text = (proc.stdout + proc.stderr).replace(tmp + "/", "")
        if proc.returncode != 0 or not out.is_file():
            return CompileResult(name=name, arch=sm, ok=False, log=text, seconds=seconds,
                                 source=source)
        try:
            res = parse_ptxas(text, name)
        except ValueError as e:
            return CompileResult(name=name, arch=sm, ok=False, log=f"{text}\n{e}", seconds=seconds,
                                 source=source)
        atomic_write(cubin, out.read_bytes())
        atomic_write_json(meta, {"log": text, "seconds": seconds, "arch": sm,
                                 "flags": list(flags), "nvcc": nvcc_version(), "name": name})
    return CompileResult(
        name=name, arch=sm, ok=True, log=text, seconds=seconds, cubin=cubin,
        resources=dataclasses.replace(res, smem_dynamic=smem_dynamic), source=source,
    )


def config_flags(config: Config) -> tuple[str, ...]:
    """nvcc's flags for `config`: NVCC_FLAGS, then any of its own (`nvcc_extra`: the SIMT
    family's ptxas level)."""
    return NVCC_FLAGS + tuple(getattr(config, "nvcc_extra", ()))


def target_arch(config: Config, arch: str | int | ArchLimits) -> str:
    """The target `config` compiles for, and its artifacts' folder: the architecture, or
    its architecture-specific variant (sm_90a) for the wgmma family (wgmma, setmaxnreg)."""
    sm = parse_arch(arch).sm
    return sm + "a" if config.family is Family.WGMMA else sm


def compile_config(
    config: Config,
    arch: str | int | ArchLimits,
    cache_dir: Path | None = None,
    artifacts_dir: Path | None = None,
) -> CompileResult:
    """Render and compile one configuration; write its artifacts if `artifacts_dir` is given.
    The wgmma family always compiles for the architecture-specific target (sm_90a)."""
    arch = target_arch(config, arch)
    source = render(config)
    result = compile_source(source, arch, config.name, cache_dir, config_flags(config),
                            smem_dynamic=config.smem_bytes)
    if artifacts_dir is not None:
        write_artifacts(config, result, artifacts_dir)
    return result


def write_artifacts(config: Config, result: CompileResult, artifacts_dir: Path) -> Path:
    """artifacts/<arch>/<name>.cu, .cubin (when compiled) and .json; returns the .cu path."""
    d = Path(artifacts_dir) / result.arch
    cu = atomic_write(d / f"{config.name}.cu", result.source or render(config))
    if result.ok and result.cubin is not None:
        atomic_write(d / f"{config.name}.cubin", result.cubin.read_bytes())
    atomic_write_json(d / f"{config.name}.json", {
        "name": config.name,
        "config": config.to_dict(),
        "arch": result.arch,
        "ok": result.ok,
        "resources": result.resources.to_dict() if result.resources else None,
        "error": None if result.ok else result.error,
        "flags": list(config_flags(config)),
        "nvcc": nvcc_version(),
        "template_hash": template_hash(),
        "compile_seconds": round(result.seconds, 3),
        "launch": {"block": list(config.block()), "smem_dynamic": config.smem_bytes,
                   "grid": f"ceil(M/{config.bm}) * ceil(N/{config.bn})"},
    })
    return cu


def compile_task(args) -> CompileResult:
    """compile_config over one picklable tuple (config, arch, cache_dir, artifacts_dir):
    what a process-pool worker runs."""
    config, arch, cache_dir, artifacts_dir = args
    return compile_config(config, arch, cache_dir, artifacts_dir)


def compile_many(
    configs: Iterable[Config],
    arch: str | int | ArchLimits,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    artifacts_dir: Path | None = None,
    on_done: Callable[[Config, CompileResult], None] | None = None,
) -> Iterator[tuple[Config, CompileResult]]:
    """Compile many configurations in a spawn process pool; yields (config, result) as each ends."""
    configs = list(configs)
    arch = parse_arch(arch).sm
    nvcc_version()  # fail here, once, if there is no nvcc
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(configs) or 1))
    cache_dir = Path(cache_dir or default_cache_dir())
    if jobs == 1:
        for c in configs:
            r = compile_config(c, arch, cache_dir, artifacts_dir)
            if on_done:
                on_done(c, r)
            yield c, r
        return
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(compile_task, (c, arch, cache_dir, artifacts_dir)): c
                   for c in configs}
        for fut in cf.as_completed(futures):
            c = futures[fut]
            r = fut.result()
            if on_done:
                on_done(c, r)
            yield c, r
