"""A deterministic sample of SIMT configurations covering every value of every parameter.

Used by the CPU compile test and the GPU correctness test alike.
"""

import dataclasses
import random

from codegen import KernelConfig, check

#: Every value codegen can build, per parameter (wider than the tuner's search space).
VALUES = {
    "bm": (16, 32, 64, 128, 256),
    "bn": (32, 64, 128, 256),
    "bk": (4, 8, 16, 32),
    "rm": (1, 2, 4, 8, 16),
    "rn": (1, 2, 4, 8),
    "wt": (1, 2, 4, 8, 16, 32),
    "pad": (0, 1, 2, 4),
    "vec": (1, 2, 4),
    "stages": (1, 2, 3, 4),
    "swizzle": (1, 4, 8),
    "split": (1, 2, 4, 8, 16, 32),
    "reduce": ("pass", "last", "cluster"),
}
ARCHS = ("sm_80", "sm_90")


def _valid(c):
    """Buildable on every arch in ARCHS; a cluster split-K on sm_90 only (it needs clusters)."""
    return all(not check(c, a) for a in (("sm_90",) if c.cluster else ARCHS))


def for_arch(configs, arch: str) -> list[KernelConfig]:
    """The configurations buildable on `arch`."""
    return [c for c in configs if not check(c, arch)]


def sample_configs(n: int = 56, extra: tuple = (("cluster", 8), ("last", 6)),
                   seed: int = 2026) -> list[KernelConfig]:
    """At least `n` configurations valid on every arch in ARCHS, covering every value above,
    then, for each (reduce, count) of `extra`, that many split-K configurations of that
    reduction (the cluster ones valid on sm_90 only)."""
    rng = random.Random(seed)
    chosen: list[KernelConfig] = []

    def draw(**fixed) -> KernelConfig:
        params = {k: rng.choice(vs) for k, vs in VALUES.items() if k != "reduce"}
        return KernelConfig(**{**params, **fixed})

    # First make sure each value appears: draw until a valid config holds it.
    for key, values in VALUES.items():
        for v in values:
            if any(getattr(c, key) == v for c in chosen):
                continue
            for _ in range(200000):
                c = draw(**{key: v})
                if _valid(c):
                    chosen.append(c)
                    break
            else:
                raise AssertionError(f"no valid configuration has {key}={v}")
    while len(chosen) < n:
        c = draw()
        if _valid(c) and c not in chosen:
            chosen.append(c)
    for reduce, count in extra:
        while sum(c.split > 1 and c.reduce == reduce for c in chosen) < count:
            c = draw(reduce=reduce)
            if _valid(c) and c not in chosen:
                chosen.append(c)
    return chosen


def covering(configs: list) -> list:
    """A subset of `configs` holding every value each field takes in them (greedy: the
    configuration adding the most values not yet held first, ties in order): where one
    architecture compiles the whole sample, another (sm_80: no GPU of it here) compiles
    each parameter value at least once, in a fraction of the time."""
    def values(c):
        return {(f.name, getattr(c, f.name)) for f in dataclasses.fields(c)}

    want = set().union(*map(values, configs)) if configs else set()
    out = []
    while want:
        best = max(configs, key=lambda c: len(values(c) & want))
        out.append(best)
        want -= values(best)
    return out
