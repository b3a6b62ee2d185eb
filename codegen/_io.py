"""Atomic file writes (write a temporary file beside the target, fsync, rename) and the
exclusive lock that read-modify-write updates of a shared file take."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: str | os.PathLike):
    """Hold an exclusive flock on `path` (created, with its folder, if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _umask() -> int:
    """The process's umask: Linux's /proc says it; elsewhere it is read by setting it and
    setting it back (a moment in which another thread's new file would take 022)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Replace `path` with `data` so that a reader sees the old file or the new one, never
    half; the file gets the permissions a plain open() would give it (0666 less the umask:
    mkstemp's own 0600 would keep a library, a bundle or a cache from the user's team)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
