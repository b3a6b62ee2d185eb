"""Libraries named by strings (tuner.runtime.registry): what torch's custom ops and
patched layers carry instead of a Library object."""

import shutil
from pathlib import Path

import pytest

from tuner.runtime import load_library
from tuner.runtime.errors import LibraryError
from tuner.runtime.registry import key_of, library_key, library_of

COMMITTED = Path(__file__).resolve().parent.parent / "artifacts" / "library"


@pytest.fixture
def library_dir(tmp_path):
    """A copy of the committed library at a path no other test has named."""
    d = tmp_path / "library"
    shutil.copytree(COMMITTED, d, ignore=shutil.ignore_patterns(".lock"))
    return d


def test_two_libraries_of_one_path_keep_their_own_names(library_dir):
    """The same manifest loaded with two paces: each object's name finds that object,
    not the first one loaded from the path (which the path's own name finds)."""
    either = load_library(library_dir)
    gpu = load_library(library_dir, pace="gpu")
    a, b = library_key(either), library_key(gpu)
    assert a == str(library_dir.resolve()) and b == f"{a}#2"
    assert library_of(a) is either and library_of(b) is gpu
    assert library_of(b).dispatcher.pace == "gpu" and library_of(a).dispatcher.pace == "either"
    assert library_key(gpu) == b and key_of(gpu) == b and key_of(b) == b  # stable
    assert library_key(str(library_dir)) == a  # a path names the first, default one
    third = load_library(library_dir, measure=False)
    assert library_key(third) == f"{a}#3" and library_of(f"{a}#3") is third


def test_a_suffixed_name_this_process_never_registered_is_a_one_line_error(library_dir):
    key = f"{library_dir.resolve()}#7"
    with pytest.raises(LibraryError, match="registered in another process") as e:
        library_of(key)
    assert "\n" not in str(e.value)


def test_a_path_name_loads_the_library_there_once(library_dir):
    key = library_key(library_dir)
    lib = library_of(key)
    assert library_of(key) is lib and Path(lib.path).resolve() == library_dir.resolve()
