"""Property-based tests (hypothesis): hard input to the CLI and to the library API gets a
clear one-line error (exit status 2), never a traceback, and never touches the GPU."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tuner import LibraryError
from tuner._shape import parse_shape
from tuner.cli import main
from tuner.runtime.library import Library

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

dim = st.one_of(st.integers(-5, 5), st.integers(2**31 - 2, 2**40), st.integers(1, 10**6))
shape_text = st.one_of(
    st.text(max_size=20),
    st.builds(lambda a, b, c, sep: f"{a}{sep}{b}{sep}{c}", dim, dim, dim,
              st.sampled_from(["x", "X", "*", ",", "x ", " by "])),
    st.builds(lambda a, b: f"{a}x{b}", dim, dim),
)


def _shape_ok(text):
    try:
        parse_shape(text)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not a valid shape" here
        return False


@SETTINGS
@given(shape=shape_text,
       dtype=st.one_of(st.sampled_from(["fp32", "fp16", "bf16", "tf32", "float64"]),
                       st.text(max_size=8)),
       trials=st.one_of(st.integers(-3, 0), st.integers(1, 3)),
       arch=st.one_of(st.sampled_from(["sm_90", "sm_80", "sm_12", "gfx90a"]), st.text(max_size=6)))
def test_cli_bad_input_is_one_line_exit_2(capsys, shape, dtype, trials, arch):
    # only combinations that are wrong somewhere (a valid one would start a compile)
    # (an empty --arch means the default, sm_90)
    assume(not (_shape_ok(shape) and dtype in ("fp32", "fp16", "bf16", "tf32") and trials >= 1
                and arch in ("sm_90", "sm_80", "")))
    assume(not arch.startswith("-") and not shape.startswith("-") and not dtype.startswith("-"))
    code = main(["--shape", shape, "--dtype", dtype, "--trials", str(trials), "--arch", arch,
                 "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("gemm-tune: error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


class _Touched(Exception):
    pass


@pytest.fixture
def offline_lib(tmp_path, monkeypatch):
    from tuner.runtime import driver

    def no_gpu(*args):
        raise _Touched

    for name in ("gpu", "current_device", "entered", "api"):
        monkeypatch.setattr(driver, name, no_gpu)
    return Library.create_or_open(tmp_path)


float_dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.complex64])
matrices = hnp.arrays(float_dtypes, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                     max_side=6))
operands = st.one_of(matrices, st.none(), st.integers(), st.text(max_size=3),
                     st.lists(st.floats(), max_size=3))


def _valid(a, b, c, beta):
    """A and B float32 or float16 (one type), matrices or vectors as torch.matmul takes them
    (A of K elements one row, B of K one column); C float32 or float16 (FP32 accumulation)
    of the product's shape (the vector's dimension dropped)."""
    ok = lambda x, types, ranks: isinstance(x, np.ndarray) and x.dtype in types \
        and x.ndim in ranks and min(x.shape, default=1) >= 1
    inputs = (np.float32, np.float16)
    if not (ok(a, inputs, (1, 2)) and ok(b, inputs, (1, 2))) or a.dtype != b.dtype \
            or a.shape[-1] != b.shape[0]:
        return False
    if c is None:
        return beta == 0
    want = a.shape[:-1] + b.shape[1:]
    return ok(c, (np.float32, np.float16), (len(want),)) and c.shape == want \
        and c.flags.writeable


@pytest.mark.parametrize("a,b,c,msg", [
    (np.float16, np.float32, None, "A is f16 and B is f32: they must be of one type"),
    (np.float16, np.float16, np.float64, "C is float64; C must be float32, float16 or bfloat16"),
    (np.float64, np.float64, None, "A is float64; A must be float32, float16 or bfloat16"),
])
def test_input_types_are_checked_before_the_gpu(offline_lib, a, b, c, msg):
    args = [np.ones((4, 3), a), np.ones((3, 5), b)] + ([np.ones((4, 5), c)] if c else [])
    with pytest.raises(LibraryError) as e:
        offline_lib.gemm(*args)
    assert str(e.value) == msg


def test_valid_fp16_inputs_reach_the_gpu(offline_lib):
    with pytest.raises(_Touched):  # everything checked: the next step is the GPU
        offline_lib.gemm(np.ones((4, 3), np.float16), np.ones((3, 5), np.float16),
                         np.zeros((4, 5), np.float32))


#: float32 scalars, vectors and matrices of up to 3 a side: shapes that often fit each other
small = hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))


@SETTINGS
@given(a=operands, b=operands, c=operands, beta=st.sampled_from([0.0, 1.0]),
       transpose=st.booleans())
def test_library_api_checks_everything_before_the_gpu(offline_lib, a, b, c, beta, transpose):
    _checked_before_the_gpu(offline_lib, a, b, c, beta, transpose)


@SETTINGS
@given(a=small, b=small, c=st.one_of(st.none(), small), beta=st.sampled_from([0.0, 1.0]))
def test_vectors_and_matrices_are_checked_before_the_gpu(offline_lib, a, b, c, beta):
    _checked_before_the_gpu(offline_lib, a, b, c, beta, False)


def _checked_before_the_gpu(offline_lib, a, b, c, beta, transpose):
    if transpose and isinstance(a, np.ndarray) and a.ndim == 2:
        a = a.T  # a non-contiguous view
    try:
        offline_lib.gemm(a, b, c, beta=beta)
    except LibraryError as e:
        assert str(e) and "\n" not in str(e)
        assert not _valid(a, b, c, beta) or (isinstance(a, np.ndarray) and not a.flags.c_contiguous)
    except _Touched:  # reached the GPU: only with inputs that are right
        assert _valid(a, b, c, beta)
