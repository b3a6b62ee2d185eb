"""A fake benchmark for the search (no GPU): times are a fixed fraction of the model's bound."""

import math
import time

from codegen import parse_arch
from tuner.model import bound_tflops
from tuner.outcome import Measurement, Outcome, Timing

SHAPE = (512, 512, 512)


def modelled_compile(args, cubin: str, seconds: float = 0.0):
    """What a compile of `args` (tuner.search's compile_task arguments) would give, without
    nvcc: the model's estimated registers (tuner.model.estimate_registers; what they exceed
    of the cap, spilled), the config's shared memory, a stand-in cubin; after `seconds` of
    sleep (a compile's time, without its CPU, where a test's timing depends on it)."""
    import time
    from pathlib import Path

    from codegen.compile import CompileResult, Resources
    from tuner.model import estimate_registers, register_cap

    time.sleep(seconds)
    cfg, arch, *_ = args
    regs = estimate_registers(cfg)
    cap = register_cap(cfg, parse_arch(arch))
    res = Resources(min(regs, cap), 0, max(regs - cap, 0) * 4, 0, 0, 1, cfg.smem_bytes)
    return CompileResult(cfg.name, arch, True, "", 0.0, Path(cubin), res)


def _stand_in_cubin() -> str:
    import tempfile
    from pathlib import Path

    cubin = Path(tempfile.mkdtemp()) / "fake.cubin"
    cubin.write_bytes(b"\x7fELF fake")
    return str(cubin)


class FakeBenchmark:
    """Times are a fixed fraction of the model's bound; some configs launch-fail or are wrong.
    Candidates compile with nvcc, or with `nvcc=False` through :func:`modelled_compile`
    (for tests of the loop's mechanics, which need no real kernel), each taking
    `compile_s` seconds."""

    def __init__(self, shape=SHAPE, wrong=lambda c: False, launch_fails=lambda c: False,
                 interrupt_at=None, delay=0.0, log=None, nvcc=True, compile_s=0.0):
        import functools

        if not nvcc:
            self.compile_task = functools.partial(modelled_compile, cubin=_stand_in_cubin(),
                                                  seconds=compile_s)
        self.arch = parse_arch("sm_90")
        self.shape = shape
        self.flops = 2.0 * math.prod(shape)
        self.wrong, self.launch_fails = wrong, launch_fails
        self.interrupt_at, self.delay, self.log = interrupt_at, delay, log
        self.measured, self.baselines = [], 0

    def _ms(self, tflops):
        return self.flops / (tflops * 1e12) * 1e3

    def measure(self, config, cubin):
        assert cubin.read_bytes()[:4] == b"\x7fELF"
        self.measured.append(config)
        if self.interrupt_at is not None and len(self.measured) == self.interrupt_at:
            raise KeyboardInterrupt  # as if Ctrl-C arrived while timing this candidate
        time.sleep(self.delay)
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(config.name + "\n")
        if self.launch_fails(config):
            return Measurement(Outcome.LAUNCH_FAILED, message="an illegal memory access")
        if self.wrong(config):
            return Measurement(Outcome.WRONG_RESULT, error=0.5, message="||C-ref||/||ref|| = 0.5")
        bound, _ = bound_tflops(config, self.shape, self.arch)
        ms = self._ms(0.6 * bound)
        return Measurement(Outcome.TIMED, Timing((ms, ms * 1.01, ms * 0.99)), error=1e-7)

    def baseline(self):
        self.baselines += 1
        return Measurement(Outcome.TIMED, Timing((self._ms(30.0),) * 3), error=1e-7)


class WorkerBenchmark(FakeBenchmark):
    """What a GpuWorker's child builds in CPU tests: a kernel with BM=16 "faults" (the
    process dies, as after an illegal address) and one with BM=32 hangs."""

    def __init__(self, shape=SHAPE, dtype=None, seed=None, log=None, delay=0.0):
        super().__init__(shape=shape, log=log, delay=delay)

    def measure(self, config, cubin):
        import os

        if config.bm == 16:
            os._exit(3)
        if config.bm == 32:
            time.sleep(3600)
        return super().measure(config, cubin)


class ModelledBenchmark:
    """A simulation benchmark (no nvcc, no GPU): `compile_task` answers with the model's
    estimated registers (tuner.model.estimate_registers), `measure` with the model's
    predicted time times `slow(config)`; what tuner.search needs of a replay."""

    def __init__(self, shape=SHAPE, slow=lambda c: 1.0):
        from pathlib import Path

        self.arch = parse_arch("sm_90")
        self.shape = shape
        self.flops = 2.0 * math.prod(shape)
        self.slow = slow
        self.measured = []
        self.cubin = Path(_stand_in_cubin())

    def compile_task(self, args):
        return modelled_compile(args, str(self.cubin))

    def measure(self, config, cubin):
        from tuner.model import predict_before_compile

        self.measured.append(config)
        s = predict_before_compile(config, self.shape, self.arch).seconds * self.slow(config)
        return Measurement(Outcome.TIMED, Timing((s * 1e3,) * 3), error=1e-7)

    def baseline(self):
        ms = self.flops / 30e12 * 1e3
        return Measurement(Outcome.TIMED, Timing((ms,) * 3), error=1e-7)


class VariantBenchmark(ModelledBenchmark):
    """A fake GPU for a program's problem (no nvcc, no GPU): `variant` and `batch` as
    GpuBenchmark takes them; `measure` refuses (fails the test on) a config of another
    variant, and times the model's prediction at the batch. `compile_task` writes a fake
    .cu / .cubin / .json under the artifacts, as nvcc's would be, so that a tune can take
    its winner into the library."""

    def __init__(self, shape=SHAPE, dtype=None, seed=None, variant=None, batch=1,
                 broadcast_b=False, slow=lambda c: 1.0):
        from codegen.families._common import Variant

        super().__init__(shape=shape, slow=slow)
        self.variant, self.batch, self.broadcast_b = variant or Variant(), batch, broadcast_b
        self.flops *= batch
        self.baselines = 0

    def compile_task(self, args):
        import json
        from pathlib import Path

        res = super().compile_task(args)
        cfg, arch, _cache, artifacts = args
        if artifacts is not None:
            from codegen.compile import target_arch

            folder = Path(artifacts) / target_arch(cfg, arch)  # sm_90a for the wgmma family
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{cfg.name}.cu").write_text(f"// {cfg.name}\n")
            (folder / f"{cfg.name}.cubin").write_bytes(b"\x7fELF " + cfg.name.encode())
            (folder / f"{cfg.name}.json").write_text(json.dumps(dict(config=cfg.to_dict())))
            res = type(res)(res.name, res.arch, True, "", 0.0, folder / f"{cfg.name}.cubin",
                            res.resources)
        return res

    def measure(self, config, cubin):
        from codegen.families._common import Variant
        from tuner.model import predict_before_compile

        assert Variant.of(config) == self.variant, (config.name, self.variant)
        self.measured.append(config)
        s = (predict_before_compile(config, self.shape, self.arch, self.batch).seconds
             * self.slow(config))
        return Measurement(Outcome.TIMED, Timing((s * 1e3,) * 3), error=1e-7)

    def baseline(self):
        self.baselines += 1
        return super().baseline()
