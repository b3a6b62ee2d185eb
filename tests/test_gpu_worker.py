"""GPU: planted kernels that fault (an illegal address) and hang cost only the timing
worker, which is restarted; good kernels before and after are timed as usual."""

import pytest

from codegen import KernelConfig, compile_config
from codegen.compile import compile_source
from tuner.outcome import Outcome

pytestmark = pytest.mark.gpu

GOOD = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=2)
PLANTED = KernelConfig(bm=64, bn=64, bk=16, rm=4, rn=4, stages=1)  # its name, a bad body
SIGNATURE = ("(int M, int N, int K, float alpha, const float* A, int lda, const float* B, "
             "int ldb, float beta, float* C, int ldc)")
BODIES = {
    "fault": "{ reinterpret_cast<float*>(0x10)[threadIdx.x] = alpha; }",
    "hang": "{ for (;;) asm volatile(\"nanosleep.u32 1000;\"); }",
}


def _planted(kind, cache):
    src = f'extern "C" __global__ void {PLANTED.name}{SIGNATURE}\n{BODIES[kind]}\n'
    res = compile_source(src, "sm_90", PLANTED.name, cache)
    assert res.ok, res.error
    return res.cubin


def test_fault_and_hang_are_isolated(compile_cache):
    from tuner.worker import GpuWorker

    good = compile_config(GOOD, "sm_90", compile_cache).cubin
    with GpuWorker((256, 256, 256), timeout_s=10.0) as w:
        assert w.measure(GOOD, good).outcome is Outcome.TIMED
        fault = w.measure(PLANTED, _planted("fault", compile_cache))
        print("fault:", fault.message)
        assert fault.outcome is Outcome.LAUNCH_FAILED and w.restarts == 1
        assert "illegal" in fault.message.lower() and "worker restarted" in fault.message
        assert w.measure(GOOD, good).outcome is Outcome.TIMED
        hang = w.measure(PLANTED, _planted("hang", compile_cache))
        print("hang:", hang.message)
        assert hang.outcome is Outcome.LAUNCH_FAILED and w.restarts == 2
        assert "no answer within 10 s" in hang.message
        again = w.measure(GOOD, good)
        assert again.outcome is Outcome.TIMED and again.error <= 1e-5
