"""How many thread-block clusters of each size a GPU runs at once: the driver's
cuOccupancyMaxActiveClusters for clusters of 1-16 blocks at 1-8 blocks an SM (the table the
tuner measures, tuner.runtime.driver.cluster_slots), marked where it differs from sm_90's
table (codegen.arch: an H100 SXM's, what the model takes without a GPU).

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

from codegen.arch import ARCHS  # noqa: E402
from tuner.gpu import device  # noqa: E402
from tuner.runtime import driver  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dev = device()
    arch = driver.arch_with_clusters(dev)
    rows = arch.cluster_slots_table
    typical = ARCHS[90].cluster_slots_table
    print(f"{dev.name}: {arch.sm_count} SMs; clusters that run at once, by blocks an SM")
    print("size " + " ".join(f"{f'{r} an SM':>8}" for r in range(1, len(rows) + 1)))
    for size in range(1, len(rows[0]) + 1):
        cells = [f"{row[size - 1]:>7}" + ("*" if r < len(typical) and size <= len(typical[r])
                                          and typical[r][size - 1] != row[size - 1] else " ")
                 for r, row in enumerate(rows)]
        print(f"{size:>4} " + " ".join(cells))
    same = rows[:len(typical)] == typical
    print("* differs from sm_90's table; " + ("none" if same else "this GPU is laid out "
                                               "otherwise than the H100 the table holds"))
    data = dict(header(dev), benchmark="cluster_slots", table=rows, same_as_sm90=same)
    print("wrote", write("cluster-slots", data, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
