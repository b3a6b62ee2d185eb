"""Measured truth next to the model: one kernel (and cuBLAS at the same shape) under
Nsight Compute.

`profile(...)` runs ``ncu`` on a child process (``python -m tuner.profile --child``) that
launches the kernel once to warm up, then once more between cuProfilerStart and
cuProfilerStop (``ncu --profile-from-start off``): only that call is profiled, with ncu's
default cache control (caches flushed before each replay pass, as the timing flushes the
L2). ncu runs with ``--clock-control none`` (the clocks the timings ran at), ``--csv
--page raw --print-units base``, and :func:`parse_csv` reads its output; a call that
launches two kernels (split-K summed in a second pass, or a cuBLAS split) is summed.

Errors the user can fix (no ncu, counters not permitted, nothing profiled) raise
:class:`ProfileError`, a UsageError: the CLI prints one line and exits 2.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tuner.errors import ProfileError

__all__ = ["METRICS", "STALLS", "ProfileError", "Profile", "parse_csv", "ncu_path", "profile",
           "ncu_command"]

log = logging.getLogger(__name__)

#: stall reasons of the WarpStateStats section: warps stalled per issued instruction
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
          "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
          "no_instruction", "not_selected", "selected", "short_scoreboard", "sleeping",
          "tex_throttle", "wait")
_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum",  # cp.async's stores
    *(_STALL.format(s) for s in STALLS),
)
_SUMMED = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum")

#: what ncu prints when it cannot do its work, and the cause the user is told
_FAILURES = (
    ("ERR_NVGPUCTRPERM", "ncu may not read the GPU's performance counters here "
                         "(ERR_NVGPUCTRPERM: run as root or allow profiling for all users, "
                         "NVreg_RestrictProfilingToAdminUsers=0)"),
    ("ERR_NVGPUCTRBUSY", "the GPU's performance counters are in use by another tool "
                         "(ERR_NVGPUCTRBUSY)"),
    ("not supported on this device", "ncu does not support this GPU"),
    ("No kernels were profiled", "ncu profiled no kernel (the child launched none, or "
                                 "failed first)"),
)


@dataclasses.dataclass(frozen=True)
class Profile:
    """The counters of one profiled call (summed over its kernels where that makes sense;
    percentages from the longest kernel)."""

    kernels: tuple[str, ...]
    metrics: dict  # metric name -> value (base units: bytes, nanoseconds, percent)

    @property
    def seconds(self) -> float:
        return self.metrics["gpu__time_duration.sum"] * 1e-9

    @property
    def dram_bytes(self) -> float:
        return self.metrics["dram__bytes_read.sum"] + self.metrics["dram__bytes_write.sum"]

    def stalls(self, top: int = 4) -> list[tuple[str, float]]:
        """The largest stall reasons (warps stalled per issued instruction), largest first."""
        got = [(s, self.metrics.get(_STALL.format(s))) for s in STALLS if s != "selected"]
        got = [(s, v) for s, v in got if v is not None]
        return sorted(got, key=lambda x: -x[1])[:top]

    def summary(self, flops: float) -> dict:
        """The figures shown and stored: achieved TFLOP/s, DRAM bytes and intensity, ..."""
        m = self.metrics
        secs = self.seconds
        return dict(
            kernels=list(self.kernels),
            time_s=secs,
            tflops=round(flops / secs / 1e12, 2) if secs else None,
            dram_read_bytes=int(m["dram__bytes_read.sum"]),
            dram_write_bytes=int(m["dram__bytes_write.sum"]),
            intensity_dram=round(flops / self.dram_bytes, 2) if self.dram_bytes else None,
            dram_gbs=round(self.dram_bytes / secs / 1e9, 1) if secs else None,
            warps_active_pct=m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
            sm_throughput_pct=m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            dram_throughput_pct=m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            smem_conflicts_ld=m.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
            smem_conflicts_st=m.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
            smem_conflicts_cp_async=m.get(
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum"),
            stalls=[dict(reason=s, per_issue=round(v, 3)) for s, v in self.stalls()],
        )


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _failure(text: str) -> str | None:
    for needle, cause in _FAILURES:
        if needle in text:
            return cause
    return None


def parse_csv(text: str) -> Profile:
    """ncu's ``--csv --page raw`` output (any ``==PROF==`` / ``==WARNING==`` lines around it;
    a units row after the header, as ``--print-units base`` prints, is skipped) -> one
    :class:`Profile` of every kernel row. ProfileError naming the cause otherwise."""
    cause = _failure(text)
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ProfileError(cause or "ncu printed no CSV table (is it Nsight Compute 2020 or "
                                    "newer?)")
    rows = list(csv.reader(io.StringIO("\n".join(
        ln for ln in lines[start:] if ln.startswith('"')))))
    header, body = rows[0], rows[1:]
    if body and body[0][0] == "":  # the units row
        body = body[1:]
    if not body:
        raise ProfileError(cause or "ncu profiled no kernel")
    col = {name: i for i, name in enumerate(header)}
    missing = [m for m in ("Kernel Name", "gpu__time_duration.sum") if m not in col]
    if missing:
        raise ProfileError(f"ncu's table lacks {', '.join(missing)}")
    kernels, per_kernel = [], []
    for r in body:
        kernels.append(r[col["Kernel Name"]])
        per_kernel.append({m: _number(r[i]) for m, i in col.items() if m in METRICS})
    longest = max(per_kernel, key=lambda d: d.get("gpu__time_duration.sum") or 0.0)
    metrics = {m: v for m, v in longest.items() if v is not None}
    for m in _SUMMED:
        vals = [d.get(m) for d in per_kernel if d.get(m) is not None]
        if vals:
            metrics[m] = sum(vals)
    for m in ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"):
        if m not in metrics:
            raise ProfileError(f"ncu reported no {m} (counters not collected)")
    return Profile(tuple(kernels), metrics)


def ncu_path() -> str:
    """ncu on PATH, or under $CUDA_HOME / /usr/local/cuda; ProfileError otherwise."""
    found = shutil.which("ncu")
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if not found and base and (Path(base) / "bin" / "ncu").is_file():
            found = str(Path(base) / "bin" / "ncu")
    if not found:
        raise ProfileError("--profile needs Nsight Compute: no ncu on PATH, $CUDA_HOME/bin "
                           "or /usr/local/cuda/bin")
    return found


def ncu_command(ncu: str, child: list[str]) -> list[str]:
    return [ncu, "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
            "--profile-from-start", "off", "--metrics", ",".join(METRICS), *child]


def profile(shape, dtype: str, *, cubin: Path | None = None, kernel: str | None = None,
            timeout: float = 240.0) -> Profile:
    """Profile `kernel` (its cubin) at `shape`, or cuBLAS when no kernel is given."""
    m, n, k = shape
    child = [sys.executable, "-m", "tuner.profile", "--child", f"{m}x{n}x{k}", dtype]
    if kernel is not None:
        child += [kernel, str(cubin)]
    cmd = ncu_command(ncu_path(), child)
    log.info("profiling: %s", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"ncu did not finish in {timeout:.0f} s") from None
    out = p.stdout + "\n" + p.stderr
    cause = _failure(out)
    if cause and ('"ID"' not in p.stdout):
        raise ProfileError(cause)
    if p.returncode and '"ID"' not in p.stdout:
        last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "")
        raise ProfileError(f"ncu failed ({p.returncode}): {last[:200]}")
    return parse_csv(p.stdout)


def _child(argv: list[str]) -> None:
    """Launch one call twice (warm-up, then profiled between cuProfilerStart/Stop)."""
    from codegen.config import DType, config_from_name
    from tuner._shape import parse_shape
    from tuner.bench import Problem
    from tuner.gpu import cublas, device
    from tuner.runtime import driver
    from tuner.runtime.runners import runner_for

    g = device()  # the context first: the operands are allocated in it
    shape, dtype = parse_shape(argv[0]), DType.parse(argv[1])
    problem = Problem(shape, dtype, seed=0)
    if len(argv) > 2:
        config = config_from_name(argv[2])
        # its family's runner, the one the library ships (wgmma: tensor maps, clusters)
        run = runner_for(config, Path(argv[3]).read_bytes()).bind(
            g, problem.m, problem.n, problem.k, problem.lda, problem.ldb, problem.ldc)

        def call():
            problem.run(run)
    else:
        blas, args = cublas(), problem.args()

        def call():
            blas.gemm(dtype, *args)
    call()
    driver.synchronize()
    driver.call("cuProfilerStart")
    call()
    driver.synchronize()
    driver.call("cuProfilerStop")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
