"""Programmatic dependent launch on the CPU: every kernel the templates render waits for the
kernel before it (griddepcontrol.wait, SASS ACQBULK) before its first access to global
memory, in nvcc's own output, and its cubin carries the marker the runtime reads; the
runtime launches a marked kernel with programmatic stream serialization (cuLaunchKernelEx),
directly and as recorded for the C++ path, and an unmarked one (an older library's) as
before (cuLaunchKernel)."""

import types

import pytest

from codegen import compile_config
from codegen.config import config_from_name
from codegen.sass import disassemble, find_cuobjdump, functions
from tuner.runtime import driver, fast
from tuner.runtime.runners import Runner, runner_for

#: one of each kernel the templates hold: each family's main kernel, the split-K reduce
#: kernels (decode: macros.cu.j2's; SIMT: its own), split-K by the last block, a cluster,
#: the tf32 pre-pass, the wgmma split-K with tickets and the TMA-store epilogue
SAMPLE = [
    "gemm_decode_f16_mma16x32_w8x1_v8_s2_k4_nt_of16_bias",
    "gemm_decode_f16_fma1x32_w8x1_v8_s2_k4l_nt_of16_bias",
    "gemm_simt_f32_64x128x16_r4x8_w8x4_p0_v4_s3_g1_k4",
    "gemm_simt_f32_16x32x16_r4x4_w4x8_p4_v4_s2_g8_k32l",
    "gemm_simt_f32_32x64x16_r4x4_w8x4_p4_v4_s3_g1_k8c",
    "gemm_wmma_f16_128x128x32_w64x32_p8_v8_s3_g8_nt_of16_bias_gelu",
    "gemm_wgmma_f16_128x128x64_c2_s6_x1_p1_g8_pp_ts_nt_of16_bias",
    "gemm_wgmma_tf32_128x256x32_c2_s4_x1_p1_g8_pre_tn",
    "gemm_wgmma_f16_64x64x64_c1_s8_x1_p1_g16_k2l_nt_of16",
]
#: SASS opcodes (before the first '.') that read or write global memory
GLOBAL = {"LDG", "STG", "ATOMG", "RED", "REDG", "LDGSTS", "UTMALDG", "UTMASTG", "UBLKCP",
          "LD", "ST", "ATOM"}


@pytest.fixture(scope="module")
def tool():
    if find_cuobjdump()[0] is None:
        pytest.fail("no cuobjdump: install the dev extra (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")


@pytest.mark.parametrize("name", SAMPLE)
def test_every_kernel_waits_for_the_one_before_it_first(name, tool, compile_cache):
    cfg = config_from_name(name)
    r = compile_config(cfg, "sm_90", compile_cache)
    assert r.ok, r.error
    assert driver.DEPENDENT_MARKER in r.cubin.read_bytes()
    kernels = functions(disassemble(r.cubin))
    want = {cfg.name} | ({f"{cfg.name}_reduce"} if cfg.reduce_pass else set()) \
        | ({f"{cfg.name}_prep"} if getattr(cfg, "prep", False) else set())
    assert want <= set(kernels), sorted(kernels)
    for kernel, code in kernels.items():
        ops = [i.base for i in code]
        assert "ACQBULK" in ops and "PREEXIT" in ops, kernel
        first_global = next((j for j, op in enumerate(ops) if op in GLOBAL), len(ops))
        assert ops.index("ACQBULK") < first_global, (kernel, code[first_global])


class _Api:
    """cuda.bindings' driver module with the calls that need a GPU answered here: each
    launch is recorded as ("cuLaunchKernel", grid) or ("cuLaunchKernelEx", grid,
    attributes)."""

    def __init__(self):
        import cuda.bindings.driver as cu

        self.cu, self.launches, self.functions = cu, [], {}  # handle -> kernel name

    def __getattr__(self, name):
        return getattr(self.cu, name)

    def cuLibraryGetKernel(self, library, name):  # noqa: N802 - the driver's names
        return 0, name.decode()

    def cuKernelGetFunction(self, kernel):  # noqa: N802
        handle = 0x100 + len(self.functions)
        self.functions[handle] = kernel
        return 0, handle

    def cuFuncSetAttribute(self, f, attr, value):  # noqa: N802
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, *rest):  # noqa: N802
        self.launches.append(("cuLaunchKernel", self.functions.get(f, f), (gx, gy, gz)))
        return (0,)

    def cuLaunchKernelEx(self, config, f, params, extra):  # noqa: N802
        attrs = [(a.id.name, a.value.programmaticStreamSerializationAllowed)
                 for a in config.attrs[:config.numAttrs]]
        self.launches.append(("cuLaunchKernelEx", self.functions.get(f, f),
                              (config.gridDimX, config.gridDimY, config.gridDimZ), attrs))
        return (0,)


@pytest.fixture
def api(monkeypatch):
    a = _Api()
    monkeypatch.setattr(driver, "api", lambda: a)
    monkeypatch.setattr(driver, "load_cubin", lambda cubin, what: None)
    return a


G = types.SimpleNamespace(index=0, arch=types.SimpleNamespace(sm_count=132))
PDL = ("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 1)


@pytest.mark.parametrize("name,kernels", [
    ("gemm_decode_f16_mma16x32_w8x1_v8_s4_nt_of16_bias", 1),  # the inlined launch
    ("gemm_decode_f16_mma16x32_w8x1_v8_s2_k4_nt_of16_bias", 2),  # main, then reduce
])
def test_a_marked_kernel_launches_with_programmatic_serialization(api, name, kernels,
                                                                  monkeypatch):
    cfg = config_from_name(name)
    monkeypatch.setattr(driver, "scratch", lambda: types.SimpleNamespace(
        get=lambda *a, **kw: 0x5000000))
    run = Runner(cfg, b"\x7fELF..." + driver.DEPENDENT_MARKER + b"\0").bind(
        G, 16, 3072, 1024, 1024, 1024, 3072)
    run(0x1000000, 0x2000000, 0x3000000, 1.0, 0.0, 7, 0x4000000)
    run(0x1000000, 0x2000000, 0x3000000, 1.0, 0.0, 7, 0x4000000)  # the thread's config again
    assert [x[0] for x in api.launches] == ["cuLaunchKernelEx"] * 2 * kernels
    assert all(x[3] == [PDL] for x in api.launches)
    assert api.launches[0][1:3] == (name, cfg.grid(16, 3072))

    api.launches.clear()
    old = Runner(cfg, b"\x7fELF...").bind(G, 16, 3072, 1024, 1024, 1024, 3072)
    old(0x1000000, 0x2000000, 0x3000000, 1.0, 0.0, 7, 0x4000000)
    assert [x[0] for x in api.launches] == ["cuLaunchKernel"] * kernels


def test_a_cluster_kernel_carries_both_attributes(api):
    cfg = config_from_name("gemm_wgmma_f16_128x128x64_c2_s4_x2_p1_g8")
    assert cfg.cluster == 2
    image = driver.KernelImage(None, cfg.name, cfg.smem_bytes, dependent=True)
    image.launcher((132, 1, 1), (384, 1, 1), (2, 1, 1)).launch("f", 7, 0)
    (_, _, grid, attrs), = api.launches
    assert grid == (132, 1, 1)
    assert [a for a, _ in attrs] == ["CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", PDL[0]]


def test_the_c_path_gets_the_dependent_launch_as_recorded(api):
    """A marked runner's launches recorded for fast.cpp say dependent, an unmarked one's
    do not (fast.cpp then launches with cuLaunchKernelEx and the attribute)."""
    cfg = config_from_name("gemm_decode_f16_mma16x32_w8x1_v8_s4_nt_of16_bias")
    for cubin, dependent in ((driver.DEPENDENT_MARKER, True), (b"", False)):
        runner = runner_for(cfg, cubin)
        with driver.recording() as rec:
            run = runner.bind(G, 16, 3072, 1024, 1024, 1024, 3072)
            s = fast.SENTINELS
            run(s[fast.A], s[fast.B], s[fast.C], fast.ALPHA_STANDIN, fast.BETA_STANDIN, 7,
                s[fast.BIAS])
        (launch,) = rec.launches
        assert launch.dependent is dependent
        assert fast.translate(launch)[9] is dependent
    assert api.launches == []  # recorded, not made
