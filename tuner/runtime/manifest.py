"""The library on disk: a versioned manifest and, per kernel, its .cu, its .cubin (sha256
in the manifest) and its metadata. Read, verified, and added to atomically.

Layout:
    library/manifest.json                 {"schema": 2, "kernels": {...}, "entries": [...],
                                           "replaced": [...]}
    library/kernels/<arch>/<name>.cu      the generated source
    library/kernels/<arch>/<name>.cubin   nvcc's output (sha256 checked on load)
    library/kernels/<arch>/<name>.json    config, resources, flags, nvcc, template hash

An entry a re-tune replaced with another kernel is kept under "replaced" (one per entry key,
the latest) with its kernel: the exact rule and the exported C++ table never use it, but
the estimate and the first-use measurement rank it with the entries' kernels. A kernel that
wins a tune after an L2 flush can lose in a loop, and the one it replaced may have been the
better kernel for the problems around it.

Schema 2: the kernels take the argument list with batch strides and a bias (see
tuner/runtime/runners.py). A schema-1 library's kernels were compiled for the list before;
:func:`upgrade` recompiles them from their names, keeping the entries.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from codegen._io import atomic_write, atomic_write_json, file_lock
from codegen.arch import parse_arch
from codegen.check import check
from codegen.config import DType, Layout, config_from_dict, config_from_name
from codegen.families._common import (
    ACTIVATIONS, BIASES, INT32_MAX, MAX_DIM, Variant, quantity, whole,
)
from tuner.runtime.errors import LibraryError, UsageError

__all__ = ["SCHEMA", "Manifest", "ENTRY_KEY", "ENTRY_DEFAULTS", "entry_variant", "entry_batch",
           "as_variant", "upgrade", "static_b_twin"]

SCHEMA = 2
#: the fields that identify an entry: one per GPU model, dtype, variant (layout, C's type,
#: bias, activation), batch and shape
ENTRY_KEY = ("cc", "dtype", "layout", "out", "bias", "act", "batch", "m", "n", "k", "gpu")
#: the value of each field an entry written before it existed lacks
ENTRY_DEFAULTS = {"layout": "nn", "out": "f32", "bias": "none", "act": "none", "batch": 1}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _field(e: dict, f: str):
    return e.get(f, ENTRY_DEFAULTS.get(f))


def _same(a: dict, b: dict) -> bool:
    return all(_field(a, f) == _field(b, f) for f in ENTRY_KEY)


#: an entry's fields that every reader takes, and what each must be
_ENTRY_FIELDS = {
    "gpu": lambda x: isinstance(x, str), "cc": lambda x: whole(x, 10, INT32_MAX),
    "arch": lambda x: isinstance(x, str), "kernel": lambda x: isinstance(x, str),
    "dtype": lambda x: x in {d.short for d in DType},
    "m": lambda x: whole(x, 1, MAX_DIM), "n": lambda x: whole(x, 1, MAX_DIM),
    "k": lambda x: whole(x, 1, MAX_DIM),
    "tflops": lambda x: quantity(x) and x > 0, "cublas_tflops": quantity, "ratio": quantity,
}
#: ... and those an entry may lack (ENTRY_DEFAULTS), or hold as a record of its tune
_ENTRY_OPTIONAL = {
    "layout": lambda x: x in {v.value for v in Layout},
    "out": lambda x: x in ("f32", "f16", "bf16"),
    "bias": lambda x: x in BIASES, "act": lambda x: x in ACTIVATIONS,
    "batch": lambda x: whole(x, 1, INT32_MAX), "broadcast_b": lambda x: isinstance(x, bool),
    "date": lambda x: isinstance(x, str), "resources": lambda x: isinstance(x, dict),
    "timing": lambda x: isinstance(x, dict), "cublas_timing": lambda x: isinstance(x, dict),
    "stats": lambda x: isinstance(x, dict), "top": lambda x: isinstance(x, list),
}


def _entry_reason(e) -> str | None:
    """Why a manifest's entry cannot be read (None: it can)."""
    if not isinstance(e, dict):
        return f"is a {type(e).__name__}, not an entry"
    for field, ok in _ENTRY_FIELDS.items():
        if field not in e:
            return f"has no {field}"
        if not ok(e[field]):
            return f"has {field} {e[field]!r:.40}"
    for field, ok in _ENTRY_OPTIONAL.items():
        if field in e and not ok(e[field]):
            return f"has {field} {e[field]!r:.40}"
    return None


def _inside(rel) -> bool:
    """Is `rel` a path inside the library (relative, no "..")?"""
    return isinstance(rel, str) and bool(rel) and not Path(rel).is_absolute() \
        and ".." not in Path(rel).parts


def _kernel_reason(key, k) -> str | None:
    """Why a manifest's kernel record cannot be read (None: it can)."""
    if not isinstance(k, dict):
        return f"is a {type(k).__name__}, not a kernel record"
    for field in ("name", "arch", "source_sha256", "cubin_sha256"):
        if not isinstance(k.get(field), str):
            return f"has {field} {k.get(field)!r:.40}"
    if key != f"{k['arch']}/{k['name']}":
        return f"is filed under {key!r} but names {k['arch']}/{k['name']}"
    try:
        parse_arch(k["arch"])
        config_from_name(k["name"])
    except UsageError as e:
        return str(e)
    for field in ("source", "cubin", "meta"):
        if field in k and not _inside(k[field]) or field != "meta" and field not in k:
            return f"has {field} {k.get(field)!r:.60}: a path inside the library is needed"
    if not isinstance(k.get("config"), dict):
        return f"has config {k.get('config')!r:.40}"
    return None


def _structure_reason(data: dict) -> str | None:
    """Why a manifest's kernels or entries cannot be read (a hand-edited or damaged one),
    or None."""
    for key, k in data["kernels"].items():
        if (why := _kernel_reason(key, k)) is not None:
            return f"kernel {key!r:.60} {why}"
    replaced = data.get("replaced", [])
    if not isinstance(replaced, list):
        return f"its replaced entries are a {type(replaced).__name__}, not a list"
    for what, entries in (("entry", data["entries"]), ("replaced entry", replaced)):
        for i, e in enumerate(entries):
            if (why := _entry_reason(e)) is not None:
                return f"{what} {i} {why}"
    return None


def entry_variant(e: dict) -> Variant:
    """The variant an entry was tuned for (an entry from before the fields: the plain one)."""
    return Variant(Layout(_field(e, "layout")), DType.from_short(_field(e, "out")),
                   _field(e, "bias"), _field(e, "act"))


def entry_batch(e: dict) -> int:
    """The batch an entry was tuned at (1 for an entry from before the field)."""
    return int(_field(e, "batch"))


def as_variant(v) -> Variant:
    """A Variant of a Variant, a Layout (the plain epilogue) or None (the plain problem)."""
    if v is None:
        return Variant()
    return Variant(v) if isinstance(v, Layout) else v


@functools.lru_cache(maxsize=4096)
def _kernel_variant(name: str) -> Variant:
    return Variant.of(config_from_name(name))


@functools.lru_cache(maxsize=4096)
def static_b_twin(name: str) -> str | None:
    """The name of kernel `name`'s twin for a constant B, or None: a kernel that starts
    loading B before the kernel ahead of it on the stream has finished (the decode family's
    prefetch_b=1, ``_pb1``), right only where that kernel does not write B (a weight matrix
    under inference: the caller's promise, Library.gemm's `static_b`). A library keeps it
    beside the entry kernel it is the twin of (Manifest.add's `twins`)."""
    cfg = config_from_name(name)
    if getattr(cfg, "prefetch_b", None) != 0:
        return None
    import dataclasses

    twin = dataclasses.replace(cfg, prefetch_b=1)  # (griddepcontrol: sm_90 and later)
    return None if check(twin, "sm_90") else twin.name


class Manifest:
    """A library directory's manifest (``data``: schema, kernels, entries) and its files."""

    def __init__(self, path: str | Path, data: dict):
        self.path = Path(path)
        self.data = data

    # ---- reading -----------------------------------------------------------------------
    @classmethod
    def create_or_open(cls, path: str | Path) -> "Manifest":
        path = Path(path)
        if (path / "manifest.json").exists():
            return cls.load(path, verify=False)
        return cls(path, {"schema": SCHEMA, "kernels": {}, "entries": []})

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> "Manifest":
        """Read the manifest; with `verify`, check every file's hash and re-validate every
        config. Raises LibraryError, naming the file, for anything wrong."""
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise LibraryError(f"no library at {path}: {mpath} does not exist")
        try:
            data = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LibraryError(f"library manifest {mpath} is unreadable ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict) \
                or not isinstance(data.get("entries"), list):
            raise LibraryError(f"library manifest {mpath} is not a gemm-tune manifest")
        schema = data.get("schema")
        if not isinstance(schema, int) or schema > SCHEMA:
            raise LibraryError(f"library manifest {mpath} has schema {schema!r}; this gemm-tune "
                               f"reads schema {SCHEMA} and older: upgrade gemm-tune")
        if schema < SCHEMA:
            raise LibraryError(f"the library at {path} is of schema {schema}: its kernels take "
                               "an older argument list; recompile them with `gemm-tune upgrade "
                               f"--library {path}` (its entries are kept)")
        if (why := _structure_reason(data)) is not None:
            raise LibraryError(f"library manifest {mpath}: {why}")
        manifest = cls(path, data)
        if verify:
            manifest.verify()
        return manifest

    def verify(self) -> None:
        where = self.path / "manifest.json"
        for key, k in self.data["kernels"].items():
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
                raise LibraryError(f"kernel {key} in {where} has a bad config ({e})") from None
            why = check(cfg, k["arch"])
            if why or cfg.name != k["name"]:
                raise LibraryError(f"kernel {key} in {where} does not validate: "
                                   f"{'; '.join(why) or 'name does not match config'}")
        for e in self.entries + self.replaced:
            if f"{e['arch']}/{e['kernel']}" not in self.data["kernels"]:
                raise LibraryError(f"entry {e['m']}x{e['n']}x{e['k']} in {where} names a "
                                   "missing kernel")

    @property
    def entries(self) -> list[dict]:
        return self.data["entries"]

    def entry_for(self, entry: dict) -> dict | None:
        """The stored entry of `entry`'s ENTRY_KEY (gpu, cc, dtype, variant, batch, shape),
        or None."""
        return next((e for e in self.entries if _same(e, entry)), None)

    @property
    def replaced(self) -> list[dict]:
        """Entries that re-tunes replaced with another kernel, kept as candidates of the
        estimate and the first-use measurement (this module's doc); [] in a manifest from
        before they were kept."""
        return self.data.get("replaced", [])

    def serving(self, dtype: DType, cc: int, variant: Variant | Layout | None = None,
                replaced: bool = False) -> list[dict]:
        """Entries that serve a request of `variant` (a Layout: that layout, fp32 C, no
        epilogue): its dtype's, and for an f32x3 request (3xTF32 allowed) the fp32 ones too
        (they are as accurate); only those whose kernel builds exactly that variant (a
        kernel tuned for NN and fp32 C cannot serve NT or fp16 C). Any batch: a kernel runs
        any batch (its entry's batch says where it was measured). With `replaced`, the
        replaced entries that would serve it follow."""
        variant = as_variant(variant)
        shorts = {dtype.short, DType.F32.short} if dtype is DType.F32X3 else {dtype.short}
        return [e for e in self.entries + (self.replaced if replaced else [])
                if e["cc"] == cc and e["dtype"] in shorts and entry_variant(e) == variant
                and _kernel_variant(e["kernel"]) == variant]

    @property
    def fingerprint(self) -> str:
        """The library's kernel set and entries, hashed: a dispatch decision is keyed with it.
        (An entry of the plain variant at batch 1 hashes as before those fields existed.)"""
        def row(e):
            v, batch = entry_variant(e), entry_batch(e)
            extra = ("" if v.plain else f"|{v.key}") + ("" if batch == 1 else f"|batch {batch}")
            return f"{e['gpu']}|{e['dtype']}|{e['m']}x{e['n']}x{e['k']}|{e['kernel']}{extra}"

        rows = sorted([row(e) for e in self.entries]
                      + [f"replaced|{row(e)}" for e in self.replaced])
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:12]

    def file(self, name: str, arch: str, field: str = "cubin") -> Path:
        """The path of kernel `name`'s .cubin (or .cu: field "source") for `arch`."""
        return self.path / self.data["kernels"][f"{arch}/{name}"][field]

    def holds(self, name: str, arch: str) -> bool:
        """Does the library hold kernel `name` for `arch`?"""
        return f"{arch}/{name}" in self.data["kernels"]

    # ---- writing -----------------------------------------------------------------------
    def _lock(self):
        return file_lock(self.path / ".lock")

    def _reread(self) -> None:
        if (self.path / "manifest.json").exists():
            self.data = Manifest.load(self.path, verify=False).data

    def add(self, entry: dict, source: Path, cubin: Path, meta: Path | None = None,
            twins: tuple = ()) -> None:
        """Add (or replace) a tuned entry and its kernel's files, and `twins`: (name, source,
        cubin, meta) of kernels kept beside it (its static_b_twin); the manifest is rewritten
        atomically under a lock, and re-read first so concurrent writers lose nothing. An
        entry replaced by one of another kernel is kept as replaced (this module's doc), in
        place of any replaced before it. A kernel that no entry or replaced entry uses, and
        that is not the twin of one that does, is dropped."""
        arch = entry["arch"]
        for name, *_ in (entry["kernel"], source, cubin, meta), *twins:
            # a kernel the library could not load again is refused before anything is written
            why = check(config_from_name(name), arch)
            if why:
                raise LibraryError(f"kernel {name} does not validate for {arch}: "
                                   f"{'; '.join(why)}; the library is unchanged")
        with self._lock():
            d = self.path / "kernels" / arch
            d.mkdir(parents=True, exist_ok=True)
            files = [(entry["kernel"], source, cubin, meta), *twins]
            for name, src, cub, met in files:
                atomic_write(d / f"{name}.cu", Path(src).read_bytes())
                atomic_write(d / f"{name}.cubin", Path(cub).read_bytes())
                if met is not None and Path(met).is_file():
                    atomic_write(d / f"{name}.json", Path(met).read_bytes())
            self._reread()
            for name, *_ in files:
                self.data["kernels"][f"{arch}/{name}"] = _kernel_record(self.path, arch, name)
            old = self.entry_for(entry)
            replaced = self.replaced
            if old is not None and old["kernel"] != entry["kernel"]:
                replaced = [e for e in replaced if not _same(e, entry)] + [old]
            self.data["replaced"] = replaced
            self.data["entries"] = [e for e in self.entries if not _same(e, entry)] + [entry]
            self.data["schema"] = SCHEMA
            kept = self.entries + replaced
            used = {f"{e['arch']}/{e['kernel']}" for e in kept}
            used |= {f"{e['arch']}/{static_b_twin(e['kernel'])}" for e in kept}
            orphans = [k for k in self.data["kernels"] if k not in used]
            for key in orphans:
                del self.data["kernels"][key]
            atomic_write_json(self.path / "manifest.json", self.data)
            for key in orphans:  # after the manifest no longer names them
                for ext in (".cu", ".cubin", ".json"):
                    (self.path / "kernels" / f"{key}{ext}").unlink(missing_ok=True)

    def update_entry(self, entry: dict, **fields) -> dict:
        """Set `fields` on the stored entry of `entry`'s ENTRY_KEY (gpu, cc, dtype, variant,
        batch, shape), the manifest rewritten atomically under the lock (re-read first); the
        updated entry.
        KeyError when no stored entry matches (gemm-tune inspect --profile uses it)."""
        with self._lock():
            self._reread()
            for e in self.entries:
                if _same(e, entry):
                    e.update(fields)
                    atomic_write_json(self.path / "manifest.json", self.data)
                    return e
        raise KeyError(f"no library entry for {entry.get('kernel')} at "
                       f"{entry.get('m')}x{entry.get('n')}x{entry.get('k')}")


def upgrade(path: str | Path, jobs: int | None = None, on_done=None,
            force: bool = False) -> int:
    """Recompile an older library's kernels from their names with this gemm-tune's
    templates (nvcc needed), replacing each kernel's files, and mark it of this schema; its
    entries (and their timings) are kept. A library already of this schema has only the
    kernels whose files are missing or do not match their sha256 recompiled (one that
    travelled as its manifest alone, or was copied in part), every one with `force`.
    The static-B twins of its entries' kernels that it lacks (static_b_twin: a library
    tuned before they were stored) are compiled and added too.
    Returns the number of kernels compiled. Raises LibraryError for what it cannot do."""
    import tempfile

    from codegen.compile import compile_many

    path = Path(path)
    with file_lock(path / ".lock"):
        try:
            Manifest.load(path, verify=False)
            data = json.loads((path / "manifest.json").read_text())
            todo = [key for key, k in data["kernels"].items() if force or not _intact(path, k)]
        except LibraryError as why_not:  # an older schema's (upgraded below), or unreadable
            try:
                data = json.loads((path / "manifest.json").read_text())
            except (OSError, UnicodeDecodeError, ValueError):
                raise why_not from None
            if not isinstance(data, dict) or not isinstance(data.get("schema"), int) \
                    or data["schema"] >= SCHEMA or not isinstance(data.get("kernels"), dict) \
                    or not isinstance(data.get("entries"), list):
                raise why_not from None
            why = next((f"kernel {key!r:.60} {w}" for key, k in data["kernels"].items()
                        if (w := _kernel_reason(key, k))), None) or next(
                (f"entry {i} has no arch and kernel" for i, e in enumerate(data["entries"])
                 if not (isinstance(e, dict) and isinstance(e.get("arch"), str)
                         and isinstance(e.get("kernel"), str))), None)
            if why is not None:
                raise LibraryError(f"library manifest {path / 'manifest.json'}: {why}") \
                    from None
            todo = list(data["kernels"])
        twins = _missing_twins(data)
        if not todo and not twins and data["schema"] == SCHEMA:
            return 0
        by_arch: dict[str, list] = {}
        for key in todo:
            k = data["kernels"][key]
            by_arch.setdefault(k["arch"], []).append(config_from_name(k["name"]))
        for arch, name in twins:
            by_arch.setdefault(arch, []).append(config_from_name(name))
        with tempfile.TemporaryDirectory() as tmp:
            for arch, configs in by_arch.items():
                for cfg, res in compile_many(configs, arch, jobs=jobs, cache_dir=Path(tmp),
                                             on_done=on_done):
                    key = f"{arch}/{cfg.name}"
                    if not res.ok and key not in data["kernels"]:  # a twin: the entry runs
                        continue  # without it
                    if not res.ok:
                        raise LibraryError(f"recompiling {cfg.name} for {arch} failed: "
                                           f"{res.error.splitlines()[0] if res.error else ''}")
                    k = data["kernels"].get(key)
                    if k is None:  # a twin, stored as Manifest.add stores one
                        d = path / "kernels" / arch
                        d.mkdir(parents=True, exist_ok=True)
                        atomic_write(d / f"{cfg.name}.cu", res.source.encode())
                        atomic_write(d / f"{cfg.name}.cubin", Path(res.cubin).read_bytes())
                        data["kernels"][key] = _kernel_record(path, arch, cfg.name)
                        continue
                    atomic_write(path / k["source"], res.source.encode())
                    atomic_write(path / k["cubin"], Path(res.cubin).read_bytes())
                    k.update(source_sha256=_sha256(path / k["source"]),
                             cubin_sha256=_sha256(path / k["cubin"]))
        data["schema"] = SCHEMA
        atomic_write_json(path / "manifest.json", data)
    return len(todo) + sum(f"{arch}/{t}" in data["kernels"] for arch, t in twins)


def _kernel_record(path: Path, arch: str, name: str) -> dict:
    """The manifest's record of kernel `name` for `arch`, its files in place under `path`."""
    rel = Path("kernels") / arch
    return dict(name=name, arch=arch, config=config_from_name(name).to_dict(),
                source=str(rel / f"{name}.cu"), source_sha256=_sha256(path / rel / f"{name}.cu"),
                cubin=str(rel / f"{name}.cubin"),
                cubin_sha256=_sha256(path / rel / f"{name}.cubin"),
                meta=str(rel / f"{name}.json"))


def _missing_twins(data: dict) -> list[tuple[str, str]]:
    """(arch, name) of the static-B twins (static_b_twin) of entry kernels that the library
    does not hold (a library stored before twins were)."""
    want = {(e["arch"], static_b_twin(e["kernel"])) for e in data["entries"]}
    return sorted((arch, t) for arch, t in want
                  if t is not None and f"{arch}/{t}" not in data["kernels"])


def _intact(path: Path, kernel: dict) -> bool:
    """Are a kernel's source and cubin there and as the manifest's sha256 says?"""
    files = [(path / kernel[f], kernel.get(f"{f}_sha256")) for f in ("source", "cubin")]
    return all(f.is_file() and _sha256(f) == sha for f, sha in files)
