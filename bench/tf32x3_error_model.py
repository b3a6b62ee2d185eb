"""A CPU model of 3xTF32's accumulation error, beside SGEMM's, to predict what a change to
the pre-split kernel's sums would buy before the GPU measures it.

    python bench/tf32x3_error_model.py [--elements 512] [--k 2048] [--json FILE]

The model, per element of C (a dot product of length K, fresh inputs of each distribution
of bench/tf32x3_accuracy.py):
  - big = tf32(x) (cvt.rna: 10 explicit bits, ties away), small = tf32(x - big);
    a product of two tf32 values is exact in float64;
  - a wgmma k8 step adds the exact sum of its 8 products to its accumulator and truncates
    the result to fp32 (round toward zero: the tensor cores' FP32 accumulation does not round
    to nearest), the first step of a k-tile (scale-d 0) truncating the sum alone;
  - the pre-split kernel (k-tiles of 32): per k-tile the small products first, then the big
    ones, into part; then acc += part in FP32, rounded to nearest;
  - SGEMM: a chain of FP32 FMAs (exact product, one rounding to nearest), over the whole of
    K or over S slices summed at the end (split-K).
Variants of the pre-split sum: a compensated (Kahan) acc += part; the same compensation
carried in part itself (where the next k-tile's products start; no register more); two running totals for
alternate k-tiles; k-tiles of 64; split-K over 4 slices, their totals added in FP32.

Prints ||C - ref|| / ||ref|| per distribution and variant, ref the float64 dot product.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DISTRIBUTIONS = ("normal", "uniform01", "spread", "outliers")
VARIANTS = ("pre-split", "kahan", "carried", "two totals", "k-tile 64", "split 4", "sgemm",
            "sgemm split 4")


def tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to tf32 as cvt.rna.tf32.f32 does, as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def toward_zero(x64: np.ndarray) -> np.ndarray:
    """float64 -> float32, truncated (round toward zero)."""
    x32 = x64.astype(np.float32)
    over = np.abs(x32.astype(np.float64)) > np.abs(x64)
    x32[over] = np.nextafter(x32[over], np.float32(0))
    return x32


def draw(rng, name: str, shape) -> np.ndarray:
    if name == "normal":
        return rng.standard_normal(shape)
    if name == "uniform01":
        return rng.random(shape)
    if name == "spread":
        return rng.standard_normal(shape) * 2.0 ** rng.uniform(-30, 30, shape)
    x = rng.standard_normal(shape)  # outliers: one row in a hundred scaled by 1e6
    x[rng.random(shape[0]) < 0.01] *= 1e6
    return x


def presplit(products: dict, k: int, tile: int, total: str) -> np.ndarray:
    """The pre-split kernel's result: `total` "plain", "kahan", "carried" (acc += part's
    rounding error, (acc - new acc) + part, is where the next k-tile's part starts; the
    last one is added at the end) or "two" (alternate k-tiles)."""
    n = products["bb"].shape[0]
    acc, comp, acc2 = (np.zeros(n, np.float32) for _ in range(3))
    for t, k0 in enumerate(range(0, k, tile)):
        part = comp.astype(np.float64) if total == "carried" else None
        for keys in (("bs", "sb"), ("bb",)):  # the small products first, then the big ones
            for kk in range(k0, k0 + tile, 8):
                for key in keys:
                    v = products[key][:, kk:kk + 8].sum(1)
                    part = toward_zero(v if part is None else part.astype(np.float64) + v)
        if total == "kahan":
            y = part - comp
            s = acc + y
            comp = (s - acc) - y
            acc = s
        elif total == "carried":
            s = acc + part
            comp = (acc - s) + part
            acc = s
        elif total == "two" and t % 2:
            acc2 = acc2 + part
        else:
            acc = acc + part
    if total == "carried":
        acc = acc + comp
    return (acc + acc2).astype(np.float64) if total == "two" else acc.astype(np.float64)


def sgemm(a: np.ndarray, b: np.ndarray, slices: int) -> np.ndarray:
    k = a.shape[1]
    out = np.zeros(a.shape[0], np.float32)
    for s in range(slices):
        acc = np.zeros(a.shape[0], np.float32)
        for kk in range(s * k // slices, (s + 1) * k // slices):  # FMA: one rounding
            acc = (acc.astype(np.float64) + a[:, kk].astype(np.float64) * b[:, kk]).astype(
                np.float32)
        out = out + acc
    return out.astype(np.float64)


def errors(name: str, elements: int, k: int, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    a, b = (draw(rng, name, (elements, k)).astype(np.float32) for _ in range(2))
    ref = (a.astype(np.float64) * b.astype(np.float64)).sum(1)
    ab, bb = tf32(a), tf32(b)
    asm, bsm = tf32(a - ab), tf32(b - bb)
    products = {"bb": ab.astype(np.float64) * bb, "bs": ab.astype(np.float64) * bsm,
                "sb": asm.astype(np.float64) * bb}
    got = {"pre-split": presplit(products, k, 32, "plain"),
           "kahan": presplit(products, k, 32, "kahan"),
           "carried": presplit(products, k, 32, "carried"),
           "two totals": presplit(products, k, 32, "two"),
           "k-tile 64": presplit(products, k, 64, "plain"),
           "split 4": sum(presplit({x: p[:, s * k // 4:(s + 1) * k // 4]
                                    for x, p in products.items()}, k // 4, 32, "plain")
                          .astype(np.float32) for s in range(4)).astype(np.float64),
           "sgemm": sgemm(a, b, 1), "sgemm split 4": sgemm(a, b, 4)}
    norm = np.linalg.norm(ref)
    return {v: float(np.linalg.norm(got[v] - ref) / norm) for v in VARIANTS}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=int, default=512, help="elements of C per distribution")
    p.add_argument("--k", type=int, default=2048, help="K, a multiple of 64")
    p.add_argument("--json", type=Path, help="write the table here too")
    args = p.parse_args(argv)
    rows = {d: errors(d, args.elements, args.k) for d in DISTRIBUTIONS}
    print(f"{'distribution':14}" + "".join(f"{v:>15}" for v in VARIANTS))
    for d, r in rows.items():
        print(f"{d:14}" + "".join(f"{r[v]:15.2e}" for v in VARIANTS))
    if args.json:
        args.json.write_text(json.dumps({"elements": args.elements, "k": args.k,
                                         "errors": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
