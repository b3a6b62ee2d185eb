"""Recording the problems a program runs without a tuned entry, for tuning them offline.

Switched on by ``GEMM_TUNE_RECORD=FILE`` when a library loads, or for a block by
``with lib.record(FILE):``. Every distinct problem that a call ran without an exact
library entry (the rule measured, estimated, or found nothing tuned) is counted; the
counts are appended to FILE when the block ends or the process exits.

The file holds one JSON object per line (JSON Lines), appended whole under an exclusive
lock, so several processes may record into one file; a problem seen by several processes,
or in several runs, has several lines, which ``gemm-tune tune --problems FILE`` merges:

    {"gpu": "NVIDIA H200", "dtype": "f16", "layout": "nt", "out": "f16",
     "epilogue": "bias+gelu", "bias": "out", "act": "gelu", "batch": 1, "m": 16,
     "n": 4096, "k": 4096, "m_bucket": [9, 16], "align": [16, 16, 16], "calls": 1200,
     "ms_per_call": 0.0251, "ms": 30.1, "rule": "measured", "runs": "cuBLAS", "pid": 4242}

`layout`, `out` (C's type), `bias` ("none", "out": of C's type, "f32") and `act` (the
activation) are the problem's variant (codegen.families._common.Variant; a kernel entry
serves only its own), `epilogue` the bias and activation in a word ("none", "bias",
"biasf32", "gelu", "bias+gelu", "biasf32+silu" ...), `batch` the problems of a strided
batch (1: a plain GEMM).

`m_bucket` is the smallest and largest M of the M-bucket that shares the problem's
dispatch decision (tuner.runtime.dispatch; a tune of one M of it serves that M exactly).

`ms_per_call` is what the decision knew of the call (the first-use measurement of what
runs, at the ends of the M-bucket and taken linearly between them, or the estimate; null
where neither exists) and `ms` is calls x ms_per_call: the time the program spent in that
problem, so that a tune can take the costliest first.

On the hot path a recorded call costs one increment of a counter that its memoised plan
holds; nothing is written until the block ends.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path

from codegen._io import file_lock
from tuner.runtime.errors import LibraryError

__all__ = ["Recorder", "ENV"]

#: the environment variable that names a record file for every library a process loads
ENV = "GEMM_TUNE_RECORD"


class Recorder:
    """Call counts per problem, appended to `path` by :meth:`flush`."""

    def __init__(self, path: str | Path, origin: str = "record file "):
        """LibraryError now, in one line, where `path` cannot be appended to (its folder
        cannot be made, it is a folder, or it may not be written): found at the end, the
        program's records would be lost."""
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LibraryError(f"{origin}{self.path}: cannot append to it "
                               f"({e.strerror or e})") from None
        if self.path.is_dir() or not os.access(
                self.path if self.path.exists() else self.path.parent, os.W_OK):
            raise LibraryError(f"{origin}{self.path}: cannot append to it ("
                               + ("a folder" if self.path.is_dir() else "not writable") + ")")
        self._tallies: dict[tuple, tuple[dict, list]] = {}  # key -> (problem, [calls])
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> "Recorder | None":
        """The recorder GEMM_TUNE_RECORD asks for (flushed at exit), or None."""
        path = os.environ.get(ENV, "").strip()
        if not path:
            return None
        rec = cls(path, f"{ENV}=")
        atexit.register(rec._flush_at_exit)
        return rec

    def _flush_at_exit(self) -> None:
        """flush(), with a one-line warning (not a traceback) where the file went away."""
        try:
            self.flush()
        except OSError as e:
            print(f"gemm-tune: warning: {ENV}={self.path}: the records were not written "
                  f"({e.strerror or e})", file=sys.stderr)

    def tally(self, problem: dict) -> list:
        """The counter of `problem` (a one-element list a plan increments per call)."""
        key = tuple(sorted((k, str(v)) for k, v in problem.items() if k != "ms_per_call"))
        with self._lock:
            found = self._tallies.get(key)
            if found is None:
                found = self._tallies[key] = (problem, [0])
            return found[1]

    def flush(self) -> int:
        """Append a line per problem called since the last flush; the lines written."""
        with self._lock:
            lines = []
            for problem, count in self._tallies.values():
                calls, count[0] = count[0], 0
                if calls:
                    per = problem.get("ms_per_call")
                    lines.append(json.dumps(dict(
                        problem, calls=calls,
                        ms=None if per is None else round(per * calls, 4), pid=os.getpid())))
        if lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.path.with_name(self.path.name + ".lock")):
                with open(self.path, "a") as f:
                    f.write("\n".join(lines) + "\n")
        return len(lines)
