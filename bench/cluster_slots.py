"""How many thread-block clusters of each size a GPU runs at once, against the model's
estimate (codegen.arch.ArchLimits.cluster_slots): the driver's cuOccupancyMaxActiveClusters
for clusters of 1-16 blocks at 1-4 blocks an SM, the table the tuner measures at one block
an SM (tuner.runtime.driver.cluster_slots), and where the estimate from that table differs.

A cluster's blocks share one GPC. Where a GPC's SMs are not a multiple of the size, some of
them stay idle, so a grid of clusters can need a second wave where the same blocks without
clusters fit in one (a split-K of 8 summed across a cluster, 128 blocks on 132 SMs).

    python bench/cluster_slots.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, write  # noqa: E402

from tuner.gpu import device  # noqa: E402
from tuner.runtime import driver  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--per-sm", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args(argv)
    dev = device()
    arch = driver.arch_with_clusters(dev)
    rows, misses = [], 0
    print(f"{dev.name}: {arch.sm_count} SMs; clusters that run at once (driver / model)")
    print("size " + " ".join(f"{f'{r} an SM':>13}" for r in args.per_sm))
    for size in range(1, len(arch.cluster_slots_1) + 1):
        cells = []
        for r in args.per_sm:
            measured = driver.cluster_slots(dev.index, r)
            got = measured[size - 1] if size <= len(measured) else None
            est = arch.cluster_slots(size, r)
            exact = size % r == 0 or r % size == 0
            rows.append(dict(size=size, blocks_per_sm=r, driver=got, model=est, exact=exact))
            misses += got is not None and est != got and exact
            cells.append(f"{got!s:>6} / {est:<4}" + ("" if got == est else "*"))
        print(f"{size:>4} " + " ".join(f"{c:>13}" for c in cells))
    print(f"* the model differs; {misses} of those where it claims to be exact")
    data = dict(header(dev), benchmark="cluster_slots", cluster_slots_1=arch.cluster_slots_1,
                rows=rows, exact_misses=misses)
    print("wrote", write("cluster-slots", data, args.out))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
