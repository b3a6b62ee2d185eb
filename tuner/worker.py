"""GPU timing in a worker process per GPU, so that a kernel that faults or hangs costs
only that worker.

A :class:`GpuWorker` is a benchmark (``arch``, ``flops``, ``measure``, ``baseline``) whose
work runs in a child process (spawned) that owns one GPU and one problem. When a
candidate's launch fails (an illegal address leaves the CUDA context unusable), the
child dies, or it does not answer within ``timeout_s`` (a hang), the child is killed
and a fresh one started; the candidate is reported as LAUNCH_FAILED with the reason, and
the search goes on. The benchmark class the child builds is named by (module, class),
so tests can plant a fake one that crashes or hangs.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import time
from pathlib import Path

from codegen.config import DType
from tuner.errors import WorkerError
from tuner.outcome import Measurement, Outcome

__all__ = ["GpuWorker", "WorkerError"]

log = logging.getLogger(__name__)

GPU_BENCHMARK = ("tuner.bench", "GpuBenchmark")


def _serve(conn, factory, kwargs, device_index) -> None:
    """The child: build the benchmark on its GPU, then answer requests until told to stop."""
    if device_index is not None:
        os.environ["GEMM_TUNE_DEVICE"] = str(device_index)
    try:
        module, name = factory
        bench = getattr(importlib.import_module(module), name)(**kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", bench.arch, bench.flops))
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req[0] == "stop":
            return
        if req[0] == "measure":
            m = bench.measure(req[1], Path(req[2]))
        else:
            m = bench.baseline()
        conn.send(("ok", m))
        if m.outcome is Outcome.LAUNCH_FAILED:
            return  # the context may be unusable: the parent starts a fresh worker


class GpuWorker:
    """One GPU's benchmark in a child process, restarted after a fault or a hang."""

    def __init__(self, shape, dtype: DType = DType.F32, seed: int | None = None,
                 device: int | None = None, timeout_s: float = 60.0,
                 factory: tuple[str, str] = GPU_BENCHMARK, **kwargs):
        self.device, self.timeout_s, self.factory = device, timeout_s, factory
        self.kwargs = dict(shape=tuple(shape), dtype=dtype, seed=seed, **kwargs)
        self.restarts = 0
        self.proc = self.conn = None
        self._start()

    @property
    def label(self) -> str:
        return f"GPU {self.device if self.device is not None else 0}"

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.factory, self.kwargs,
                                                     self.device), daemon=True)
        self.proc.start()
        child.close()
        reply = self._recv(max(self.timeout_s, 300.0))  # the first start compiles references
        if reply is None or reply[0] != "ready":
            self._kill()
            why = reply[1] if reply else "no answer"
            raise WorkerError(f"the timing worker for {self.label} did not start: {why}")
        _, self.arch, self.flops = reply

    def _recv(self, timeout: float):
        """The child's reply, or None if it died or said nothing within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.conn.poll(min(0.2, max(deadline - time.monotonic(), 0))):
                    return self.conn.recv()
                if not self.proc.is_alive():  # dead, and nothing was left in the pipe
                    return self.conn.recv() if self.conn.poll(0) else None
        except (EOFError, OSError):
            pass
        return None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        log.warning("restarting the timing worker for %s (restart %d)", self.label,
                    self.restarts)
        self._start()

    def _call(self, request: tuple, what: str) -> Measurement:
        try:
            self.conn.send(request)
        except (BrokenPipeError, OSError):
            self._restart()
            self.conn.send(request)
        reply = self._recv(self.timeout_s)
        if reply is None:
            self.proc.join(2)  # a child that closed the pipe by dying: reap it for its status
            code = self.proc.exitcode
            why = (f"no answer within {self.timeout_s:g} s (a hang?)" if code is None
                   else f"the worker died (exit status {code})")
            self._restart()
            return Measurement(Outcome.LAUNCH_FAILED,
                               message=f"{what} on {self.label}: {why}; worker restarted")
        m = reply[1]
        if m.outcome is Outcome.LAUNCH_FAILED:
            self._restart()
            m = Measurement(m.outcome, m.timing, m.error, m.error_exact,
                            m.message + "; worker restarted")
        return m

    def measure(self, config, cubin) -> Measurement:
        return self._call(("measure", config, str(cubin)), config.name)

    def baseline(self) -> Measurement:
        m = self._call(("baseline",), "cuBLAS")
        if m.outcome is not Outcome.TIMED:
            raise WorkerError(f"cuBLAS failed on {self.label}: {m.message}")
        return m

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        if self.proc is not None:
            self.proc.join(5)
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
