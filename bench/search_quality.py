"""How good is the default budget? Run `gemm-tune` as a user would (a fresh process, the
default budget) and, with --exhaustive, the grid over the whole valid space; record
every candidate, the pruning savings and the distance between the two bests. With
--family, the grid covers those families only (a study of one family: its record is what
bench/simulate_search.py replays); with --variant, the problem is a program's (its layout,
C's type, bias and activation, as a library key writes them: "nt|bf16|none|none").

    python bench/search_quality.py --shape 4096x4096x4096 [--exhaustive] [--out DIR]
    python bench/search_quality.py --exhaustive --skip-default --dtype fp16 --family wgmma
    python bench/search_quality.py --exhaustive --skip-default --dtype bf16 --family decode \
        --shape 1x4096x4096 --variant "nt|bf16|none|none"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import header, write  # noqa: E402


def default_budget(shape: str, dtype: str, work: Path, variant=None) -> dict:
    """The CLI in a fresh process, twice: the tune, then the answer from the cache."""
    cmd = [sys.executable, "-m", "tuner", "--shape", shape, "--dtype", dtype, "--json",
           "--artifacts", str(work)]
    if variant is not None:
        cmd += ["--layout", variant.layout.value, "--out", variant.out.short, "--bias",
                variant.bias, "--act", variant.act]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    tune_s = time.monotonic() - t0
    if p.returncode:
        raise SystemExit(f"gemm-tune failed ({p.returncode}): {p.stderr[-2000:]}")
    t0 = time.monotonic()
    q = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    cached_s = time.monotonic() - t0
    assert q.returncode == 0 and json.loads(q.stdout)["from_cache"], q.stderr
    return dict(result=json.loads(p.stdout), wall_s=round(tune_s, 1),
                cached_answer_s=round(cached_s, 2))


def exhaustive(shape: tuple[int, int, int], dtype, families, timeout: float,
               work: Path, variant=None) -> dict:
    from tuner.bench import GpuBenchmark
    from tuner.search import search
    from tuner.space import valid_configs

    bench = GpuBenchmark(shape, dtype, seed=0, target_ms=20, variant=variant)
    n_valid = sum(1 for _ in valid_configs(bench.arch, dtype, shape, variant=variant,
                                           only=families))
    # an exhaustive record times every candidate that runs: a replay may ask for any
    res = search(shape, bench, dtype=dtype, trials=n_valid, timeout=timeout, sampler="grid",
                 seed=0, artifacts=work, model=False, only=families, prune=False,
                 variant=variant)
    s = res.stats
    timed = res.timed()
    return dict(families=sorted(families) if families else None, valid=n_valid,
                complete=s.compiled == n_valid, seconds=round(s.seconds, 1),
                stats=dict(compiled=s.compiled, timed=s.timed, pruned=s.pruned,
                           failed=s.failed, rejected=s.rejected),
                cublas_tflops=round(bench.flops / (res.cublas_ms * 1e-3) / 1e12, 2),
                best=dict(kernel=timed[0].config.name, tflops=round(timed[0].tflops, 2)),
                top10=[dict(kernel=r.config.name, tflops=round(r.tflops, 2)) for r in timed[:10]],
                records=[r.to_dict() for r in res.records])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x4096x4096")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--family", action="append", default=None,
                    help="search only this family (repeatable; default: all the dtype's)")
    ap.add_argument("--variant", default=None, metavar="KEY",
                    help='the problem\'s layout, C type, bias and activation, "nt|bf16|none|none" '
                    "(default: the plain problem, NN with fp32 C)")
    ap.add_argument("--exhaustive", action="store_true")
    ap.add_argument("--skip-default", action="store_true")
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from codegen.config import DType
    from codegen.families._common import Variant
    from tuner._shape import parse_shape
    from tuner.gpu import device

    dtype = DType.parse(args.dtype)
    variant = Variant.from_key(args.variant) if args.variant else None
    data = dict(header(device()), benchmark="search_quality", shape=args.shape,
                dtype=dtype.short)
    if variant is not None:
        data["variant"] = variant.key
    # a search cut by its timeout may leave compiles writing into its artifacts: the
    # record is written all the same
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        if not args.skip_default:
            d = default_budget(args.shape, args.dtype, Path(tmp) / "default", variant)
            data["default_budget"] = d
            r, w = d["result"], d["result"]["winner"]
            print(f"default budget: {w['name']} {w['tflops']} TFLOP/s vs cuBLAS "
                  f"{w['cublas_tflops']} (ratio {w['ratio']}) in {d['wall_s']} s; "
                  f"from cache in {d['cached_answer_s']} s; stats {r['stats']}")
        if args.exhaustive:
            e = exhaustive(parse_shape(args.shape), dtype,
                           frozenset(args.family) if args.family else None, args.timeout,
                           Path(tmp) / "grid", variant)
            data["exhaustive"] = e
            print(f"exhaustive: {e['stats']} of {e['valid']} valid in {e['seconds']} s, "
                  f"complete={e['complete']}; best {e['best']}; cuBLAS {e['cublas_tflops']}")
            if "default_budget" in data:
                got = data["default_budget"]["result"]["winner"]["tflops"]
                print(f"default budget reaches {100 * got / e['best']['tflops']:.1f}% of the "
                      "exhaustive best")
    name = ("search-quality" + ("-exhaustive" if args.exhaustive else "")
            + (f"-{dtype.short}" if dtype is not DType.F32 else "")
            + "".join(f"-{f}" for f in sorted(args.family or ()))
            + (f"-{args.shape}-{variant.layout.value}-o{variant.out.short}"
               if variant is not None else ""))
    print("wrote", write(name, data, args.out))


if __name__ == "__main__":
    main()
