"""A library of an older schema is refused with the command that upgrades it, and the
upgrade recompiles its kernels from their names (their sources then carry the argument
list the runners pass) and keeps its entries. nvcc is needed, for real."""

import hashlib
import json

import pytest

from _library import build
from tuner.runtime.errors import LibraryError
from tuner.runtime.manifest import SCHEMA, Manifest, upgrade


def test_an_older_library_is_refused_then_upgraded(tmp_path, compile_cache):
    lib = build(tmp_path / "lib", compile_cache, tmp_path / "art")
    mpath = lib.path / "manifest.json"
    data = json.loads(mpath.read_text())
    entries = data["entries"]
    # what a schema-1 library held: the kernels' sources of the argument list before
    data["schema"] = 1
    for k in data["kernels"].values():
        (lib.path / k["source"]).write_text("// an older kernel\n")
    mpath.write_text(json.dumps(data))
    with pytest.raises(LibraryError, match=r"schema 1: .*`gemm-tune upgrade --library"):
        Manifest.load(lib.path)

    assert upgrade(lib.path, jobs=1) == len(data["kernels"]) == 2
    m = Manifest.load(lib.path)  # verifies every file's sha256 and config
    assert m.data["schema"] == SCHEMA and m.entries == entries
    for k in m.data["kernels"].values():
        src = (lib.path / k["source"]).read_text()
        assert "long long sA" in src and "const BiasT* __restrict__ bias" in src
    assert upgrade(lib.path, jobs=1) == 0  # nothing left to do


def test_the_upgrade_command(tmp_path, compile_cache, capsys):
    from tuner.cli import main

    lib = build(tmp_path / "lib", compile_cache, tmp_path / "art")
    mpath = lib.path / "manifest.json"
    data = json.loads(mpath.read_text())
    data["schema"] = 1
    mpath.write_text(json.dumps(data))
    assert main(["list", "--library", str(lib.path)]) == 2  # refused, one line, the command
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gemm-tune upgrade --library" in err[0], err
    assert main(["upgrade", "--library", str(lib.path), "--jobs", "1"]) == 0
    assert "2 kernels recompiled" in capsys.readouterr().out
    assert main(["upgrade", "--library", str(lib.path)]) == 0
    assert "already current" in capsys.readouterr().out
    assert main(["list", "--library", str(lib.path)]) == 0
    # --force: a current library's kernels recompiled from the templates, entries kept
    data = json.loads(mpath.read_text())
    for k in data["kernels"].values():
        (lib.path / k["source"]).write_text("// a kernel of an older template\n")
        k["source_sha256"] = hashlib.sha256(b"// a kernel of an older template\n").hexdigest()
    mpath.write_text(json.dumps(data))
    assert main(["upgrade", "--library", str(lib.path), "--force", "--jobs", "1"]) == 0
    assert "2 kernels recompiled" in capsys.readouterr().out
    m = Manifest.load(lib.path)
    assert m.entries == data["entries"]
    for k in m.data["kernels"].values():
        assert "older template" not in (lib.path / k["source"]).read_text()


def test_a_current_library_has_its_missing_or_altered_kernels_rebuilt(tmp_path, compile_cache):
    """A library carried as its manifest alone (or copied in part): upgrade recompiles
    just the kernels whose files are missing or do not match their sha256, each from its
    name, keeps the others' bytes, and the library then verifies."""
    lib = build(tmp_path / "lib", compile_cache, tmp_path / "art")
    data = json.loads((lib.path / "manifest.json").read_text())
    (gone, kept) = data["kernels"].values()
    (lib.path / gone["cubin"]).unlink()
    (lib.path / gone["source"]).unlink()
    kept_bytes = (lib.path / kept["cubin"]).read_bytes()
    with pytest.raises(LibraryError, match="is missing"):
        Manifest.load(lib.path)
    assert upgrade(lib.path, jobs=1) == 1
    assert (lib.path / kept["cubin"]).read_bytes() == kept_bytes
    Manifest.load(lib.path)  # verifies every file's sha256
    (lib.path / gone["cubin"]).write_bytes(b"not this kernel")
    assert upgrade(lib.path, jobs=1) == 1
    assert upgrade(lib.path, jobs=1) == 0
    assert Manifest.load(lib.path).entries == data["entries"]


def test_upgrade_adds_the_static_b_twins_a_library_lacks(tmp_path, compile_cache):
    """A library whose decode entry was stored before twins were: upgrade compiles the
    entry kernel's static-B twin and adds it (the other kernels' bytes kept); a second
    upgrade has nothing to do, and the library verifies."""
    import dataclasses

    from _library import entry

    from codegen import compile_config
    from codegen.config import DType
    from codegen.families.decode import DEFAULT_DECODE
    from tuner.runtime.manifest import static_b_twin

    lib = build(tmp_path / "lib", compile_cache, tmp_path / "art")
    dec = dataclasses.replace(DEFAULT_DECODE, dtype=DType.F16, out=DType.F16)
    res = compile_config(dec, "sm_90", compile_cache, tmp_path / "art")
    lib.add(entry(dec, res, (16, 4096, 4096), 30.0, 20.0, dtype="f16"),
            tmp_path / "art" / "sm_90" / f"{dec.name}.cu", res.cubin)
    before = json.loads((lib.path / "manifest.json").read_text())
    twin = f"sm_90/{static_b_twin(dec.name)}"
    assert twin not in before["kernels"] and len(before["kernels"]) == 3
    assert upgrade(lib.path, jobs=1) == 1
    m = Manifest.load(lib.path)  # verifies every file's sha256
    assert set(m.data["kernels"]) == set(before["kernels"]) | {twin}
    assert all(m.data["kernels"][k] == v for k, v in before["kernels"].items())
    assert m.data["kernels"][twin]["config"]["prefetch_b"] == 1
    assert m.entries == before["entries"] and upgrade(lib.path, jobs=1) == 0


def test_upgrade_writes_nothing_outside_the_library_and_refuses_what_it_cannot_read(
        tmp_path, compile_cache):
    """An older manifest whose kernel record names a file outside the library (hand-edited,
    or crafted) is refused before anything is compiled or written: upgrade had overwritten
    that file with the generated CUDA. A truncated manifest is one LibraryError, as load's."""
    lib = build(tmp_path / "lib", compile_cache, tmp_path / "art")
    mpath = lib.path / "manifest.json"
    data = json.loads(mpath.read_text())
    data["schema"] = 1
    key = next(iter(data["kernels"]))
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own file\n")
    data["kernels"][key]["source"] = "../precious.txt"
    mpath.write_text(json.dumps(data))
    with pytest.raises(LibraryError, match=r"has source '\.\./precious\.txt': a path inside"):
        upgrade(lib.path, jobs=1)
    assert precious.read_text() == "the user's own file\n"
    text = mpath.read_text()
    mpath.write_text(text[: len(text) // 2])
    with pytest.raises(LibraryError, match="is unreadable"):
        upgrade(lib.path, jobs=1)
    assert mpath.read_text() == text[: len(text) // 2]  # kept as it was
