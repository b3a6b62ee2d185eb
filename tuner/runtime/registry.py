"""Libraries named by strings, for what cannot hold a Python object (a torch custom op's
arguments, a compiled graph's constants): :func:`library_key` names a Library or a path,
:func:`library_of` finds the Library a name stands for. Torch-free, so the CPU tests
check it."""

from __future__ import annotations

import re
import threading
from pathlib import Path

__all__ = ["library_key", "key_of", "library_of"]

_LIBRARIES: dict[str, object] = {}
_LOCK = threading.Lock()


def library_key(library) -> str:
    """The string that names `library` (a Library, or the path of one): a path names the
    library loaded from it with the default options (loaded on first use); a Library
    object is registered under its resolved path, or, where another Library of that path
    holds the path (the same manifest loaded with another pace, say), under the path with
    a "#N" suffix, so each object's calls run on that object and not on the first one
    loaded from its path."""
    if isinstance(library, (str, Path)):
        return str(Path(library).resolve())
    key = getattr(library, "_torch_ops_key", None)
    if key is None:
        base = key = str(Path(library.path).resolve())
        with _LOCK:
            n = 1
            while _LIBRARIES.setdefault(key, library) is not library:
                n += 1
                key = f"{base}#{n}"
        library._torch_ops_key = key  # the next call skips resolving the path
    return key


def key_of(library) -> str:
    """`library`'s name: a string as it is, a Library's as :func:`library_key` gives it."""
    if isinstance(library, str):
        return library
    return getattr(library, "_torch_ops_key", None) or library_key(library)


def library_of(key: str):
    """The Library `key` names: the one registered under it, or the library at that path,
    loaded once (LibraryError for a "#N" name of a Library this process never
    registered)."""
    lib = _LIBRARIES.get(key)
    if lib is None:
        from tuner.runtime.library import LibraryError, load_library

        if re.search(r"#\d+$", key) and not Path(key).exists():
            raise LibraryError(f"library key {key!r} names a Library registered in another "
                               "process: pass the Library, or its path")
        with _LOCK:
            lib = _LIBRARIES.get(key) or load_library(key)
            _LIBRARIES[key] = lib
    return lib
