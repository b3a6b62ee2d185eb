"""GPU tests carry @pytest.mark.gpu and are skipped, once, here, when no CUDA GPU is usable."""

import functools
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/_sample.py and friends


@functools.cache
def _gpu_reason() -> str | None:
    try:
        from cuda.bindings import driver as cu  # the one driver binding gemm-tune uses
    except ImportError as e:
        return f"cuda-bindings is not installed ({e})"
    try:
        err, = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"no usable CUDA driver (cuInit: {err})"
        err, count = cu.cuDeviceGetCount()
        if err != cu.CUresult.CUDA_SUCCESS or count < 1:
            return "no CUDA device"
    except Exception as e:  # noqa: BLE001 - any driver failure means no GPU here
        return f"no usable CUDA driver ({e})"
    return None


#: the test files of `pytest -m fast` (README): pure logic, the CLI, the run path through a
#: fake driver, the family rules and names; none compiles a grid of kernels (README gives
#: the latest times of both)
FAST = {"test_floors.py", "test_config.py", "test_names.py", "test_check.py",
        "test_occupancy.py", "test_model.py", "test_runtime.py", "test_cache.py",
        "test_families.py", "test_properties.py", "test_distributed.py", "test_cli.py",
        "test_render.py", "test_profile.py", "test_cli_status.py", "test_problems.py",
        "test_readme.py", "test_torch_ops.py", "test_decisions.py", "test_fast_path.py",
        "test_host_pipeline.py"}
#: ... less these tests of them, each seconds to tens of seconds on two cores: processes
#: sharing a PostgreSQL study (killed, restarted), whole-space enumerations, searches and
#: dry runs through the CLI beyond the first (the full suite runs them all)
NOT_FAST = {"test_postgres_sigkill_one_of_three", "test_postgres_restart_mid_study",
            "test_postgres_three_processes_one_study", "test_a_sample_of_valid_configs_round_trips",
            "test_first_batch_starts_with_each_familys_default", "test_first_batch_is_the_models_top",
            "test_dry_run_of_an_nt_fp16_c_bias_gelu_batch_of_8",
            "test_a_piped_dry_run_shows_progress_lines_and_a_table_of_120_columns",
            "test_dry_run_table", "test_installed_package_finds_its_templates_from_anywhere",
            "test_recorded_variants_are_tuned_through_a_fake_gpu_into_the_cache_and_library"}


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (README): a worker per core on a CPU-only machine, one in all where a GPU
    is usable (its tests time kernels and must not share it)."""
    return 1 if _gpu_reason() is None else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in FAST and item.originalname not in NOT_FAST:
            item.add_marker(pytest.mark.fast)
    if os.environ.get("GEMM_TUNE_REQUIRE_GPU") and _gpu_reason():
        raise pytest.UsageError(f"GEMM_TUNE_REQUIRE_GPU is set but {_gpu_reason()}")
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """One compile cache for the whole run, shared by the parallel compiles and, under
    pytest-xdist, by every worker (its entries are written atomically)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "compile-cache"
        path.mkdir(exist_ok=True)
        return path
    return tmp_path_factory.mktemp("compile-cache")
