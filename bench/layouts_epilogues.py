"""Layouts, output types, the fused epilogue and batches against torch, in one run, on the GPU.

    python3 bench/layouts_epilogues.py [--out DIR] [--library artifacts/library]
                                       [--parts layouts,linear,outtype,batched]
                                       [--family-trials N]

Four parts, each row "ours" against the torch call a user would otherwise make, with the
same input and output types:
  layouts   each family's 4096^3 kernel in NN, NT, TN and TT (the families that serve that
            shape: not decode, M <= 64): the library's entry tuned
            for that layout (plain epilogue, the NN entry's C type) where it holds one
            ("tuned": "library"); else, with --family-trials N, the three fastest of a
            search of N candidates of that family alone for that layout, raced again
            here ("tuned": "search": the library holds one entry a problem, the best
            family's, so the other families are tuned here; a search times each once,
            so its order within a few percent is noise); else the family's NN kernel
            re-targeted to the layout ("tuned": false); the ratio of each layout's time to the family's NN, the
            family's layouts timed turn about (the bar: NT, TN, TT within 5%);
            torch.matmul on the same views beside it.
  linear    tokens x in x out of 8192x4096x14336 and 8192x14336x4096, bf16 and fp16:
            ours C = gelu(x W^T + b) in one kernel (layout NT, C of the input type, a bias,
            GELU) against F.gelu(F.linear(x, W, b)) (the bar: 1.05x); each also timed back
            to back, 20 calls between two events (*_b2b_*: a forward's regime, at the
            power cap's clock; the flushed race and the first use can order them apart).
  outtype   the 13 suite shapes in fp16 and bf16 with C of the input type, against
            torch.matmul (the bar: each at least 0.95x, geometric mean at least 1.0).
  batched   torch.bmm shapes (batch 32) 512x512x128 and (batch 64) 2048x128x2048, in
            fp16 and fp32 (the bar: 1.0x).

Ours, as a user calls it (the bars' figures, lib_*): lib.gemm (outtype), torch_ops.linear
(linear) and torch_ops.matmul (batched) on the library given, its first call deciding as
usual (an exact entry, else the first-use measurement against cuBLAS); explain() names what
ran. For outtype and batched, also the same call through the library loaded with
pace="gpu" (lib_gpu_*: what a program that says its GPU sets the pace gets; its first uses
weigh the GPU's time alone). Beside them, the best kernel alone: the library's tuned kernels of that input type (every
entry's config, at any shape), the wgmma bench's candidate list and each family's default, re-targeted to the
row's layout, output type, bias and activation (codegen.families._common.Variant), those
that codegen.check accepts, compiled here and launched through their runners
(tuner.runtime.runners: what the tuner times and the library ships). Where the library
holds an entry tuned for the row's exact problem, its config is among them, and the row
says whether the winner is that entry ("tuned"). Each row takes the candidate fastest in
a first pass (a best-of-N selection, stated), checked against torch's output first, then times it against torch in
three interleaved rounds (CUDA events, L2 flushed before each repetition; medians).
Writes layouts-epilogues-<gpu>-<date>.json and .png under --out (default bench/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codegen.families._common import DType, Layout, Variant  # noqa: E402

SUITE = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (1024, 1024, 1024),
         (512, 512, 512), (1000, 1000, 1000), (4095, 4097, 1023), (127, 129, 4097),
         (8192, 8192, 1024), (128, 4096, 4096), (16, 4096, 4096), (4096, 4096, 256),
         (256, 256, 16384)]
LINEAR = [(8192, 4096, 14336), (8192, 14336, 4096)]  # tokens, in_features, out_features
BATCHED = [(32, 512, 512, 128), (64, 2048, 128, 2048)]  # batch, M, N, K
ROUNDS = 3


def _tdt(torch, dtype: DType):
    return {DType.F32: torch.float32, DType.F16: torch.float16,
            DType.BF16: torch.bfloat16}[dtype]


class Candidates:
    """The kernels a row may run: compiled once per config, runners kept."""

    def __init__(self, library: Path, family_trials: int = 0):
        from tuner.runtime import load_library
        from tuner.runtime.manifest import Manifest

        self.entries = Manifest.load(library, verify=False).entries
        self.built: dict = {}
        self.family_trials = family_trials  # the layouts part's searches (tuned())
        self.searches: dict = {}  # (dtype, family, layout) -> what each search's trials did
        self.lib = load_library(library)  # the product, as a user loads it
        # as a program whose GPU sets the pace loads it (its decisions kept apart)
        self.lib_gpu = load_library(library, pace="gpu")

    def product(self, call, *args, **kw) -> tuple:
        """(a user's call of the product, why it ran what it ran): `call` with these
        arguments, and the explain() of that call by the library it calls (a Library's
        method's own, or the library= argument's; its first word the kernel, or cuBLAS)."""
        lib = getattr(call, "__self__", None) or kw.get("library") or self.lib
        return (lambda: call(*args, **kw),
                lambda got: lib.explain(*args[:2], **{k: v for k, v in kw.items()
                                                       if k != "library"}))

    def base(self, dtype: DType) -> list:
        """The library's configs of `dtype`, the wgmma bench's candidates, each family's
        default (as tuned: NN, fp32 C, no epilogue)."""
        from codegen.config import config_from_name
        from codegen.families import FAMILIES, family_of
        from wgmma_vs_cublas import configs as wgmma_configs

        out = [config_from_name(e["kernel"]) for e in self.entries if e["dtype"] == dtype.short]
        if dtype in (DType.F16, DType.BF16):
            out += wgmma_configs(dtype)
            # each with the TMA-store epilogue too (the previous tunes' winners were such)
            out += [dataclasses.replace(c, store=1) for c in wgmma_configs(dtype)]
            # the CUDA-core kernels tuned for fp32 (split-K for the skinny shapes), widening
            # this type on load instead (codegen.check drops those with cp.async stages)
            out += [dataclasses.replace(c, dtype=dtype) for c in
                    (config_from_name(e["kernel"]) for e in self.entries if e["dtype"] == "f32")
                    if family_of(c).name == "simt"]
        out += [s.default(dtype) for s in FAMILIES.values()
                if dtype in s.dtypes and s.dtypes[dtype] is dtype]
        return list(dict.fromkeys(out))

    def tuned(self, dtype: DType, shape) -> dict:
        """family -> {layout: (configs, how they were tuned)}: the family's config tuned
        at `shape` for each layout in the library (the plain epilogue, of the NN entry's C
        type: "library"); else, with family_trials, the fastest of a search of that many of the
        family's candidates for the layout ("search"); else its NN config (or its
        default) re-targeted to the layout (False)."""
        from codegen.arch import parse_arch
        from codegen.config import config_from_name
        from codegen.families import FAMILIES, family_of
        from tuner.runtime.manifest import entry_batch, entry_variant

        found: dict = {}
        for e in self.entries:
            v = entry_variant(e)
            if e["dtype"] == dtype.short and (e["m"], e["n"], e["k"]) == tuple(shape) \
                    and entry_batch(e) == 1 and (v.bias, v.act) == ("none", "none"):
                cfg = config_from_name(e["kernel"])
                found.setdefault(family_of(cfg).name, {})[v.layout] = cfg
        out = {}
        for s in FAMILIES.values():
            if not (s.searched and dtype in s.dtypes and s.dtypes[dtype] is dtype):
                continue
            mine = found.get(s.name, {})
            nn = mine.get(Layout.NN, s.default(dtype))
            if s.shape_reasons(nn, tuple(shape), parse_arch("sm_90")):
                continue  # a family that never serves this shape (decode: M <= 64)
            out[s.name] = {}
            for layout in Layout:
                cfg = mine.get(layout)
                if cfg is not None and cfg.out is nn.out:
                    out[s.name][layout] = ([cfg], "library")
                    continue
                cs = []
                if self.family_trials:
                    cs, outcomes = family_search(s.name, dtype, shape, Variant(layout, nn.out),
                                                 self.family_trials)
                    self.searches[(dtype.short, s.name, layout.value)] = outcomes
                if cs:
                    out[s.name][layout] = (cs, "search")
                    continue
                cs = retarget([nn], Variant(layout, nn.out))
                if cs:
                    out[s.name][layout] = (cs[:1], False)
        return out

    def exact(self, dtype: DType, shape, variant: Variant, batch: int = 1) -> set:
        """Names (as re-targeted to `variant`) of the library's entries tuned for exactly
        this problem."""
        from codegen.config import config_from_name
        from tuner.runtime.manifest import entry_batch, entry_variant

        return {variant.apply(config_from_name(e["kernel"])).name for e in self.entries
                if e["dtype"] == dtype.short and (e["m"], e["n"], e["k"]) == tuple(shape)
                and entry_variant(e) == variant and entry_batch(e) == batch}

    def build(self, configs) -> None:
        from codegen.compile import compile_many
        from tuner.runtime.runners import runner_for

        todo = [c for c in dict.fromkeys(configs) if c not in self.built]
        for cfg, res in compile_many(todo, "sm_90", jobs=16):
            self.built[cfg] = runner_for(cfg, Path(res.cubin).read_bytes()) if res.ok else None
            if not res.ok:
                print(f"{cfg.name}: compile failed: {res.error.splitlines()[0]}", flush=True)


def family_search(family: str, dtype: DType, shape, variant: Variant, trials: int,
                  keep: int = 3) -> tuple[list, dict]:
    """The `keep` fastest of a search of `trials` candidates of `family` alone for this
    problem (the tuner's search, the model's first batch and pruning as in a tune; its
    records kept nowhere), fastest first (empty where none ran), and what its trials did
    (:func:`search_outcomes`)."""
    import tempfile

    from tuner.bench import GpuBenchmark
    from tuner.search import search

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as work:
        res = search(tuple(shape), GpuBenchmark(shape, dtype, seed=0, variant=variant),
                     dtype=dtype, trials=trials, timeout=120, seed=0, artifacts=Path(work),
                     only={family}, variant=variant)
    timed, outcomes = res.timed(), search_outcomes(res.records)
    print(f"search {dtype.short} {family} {variant.key}: {len(timed)} timed in "
          f"{time.monotonic() - t0:.0f} s, best {timed[0].config.name if timed else None}; "
          f"{outcomes}", flush=True)
    return [r.config for r in timed[:keep]], outcomes


def search_outcomes(records) -> dict:
    """How many of a search's trials ended each way: "timed", else the reason's words before
    its figures ("spills", "predicted", "no block fits on an SM", ...) or the outcome."""
    import collections
    import re

    def why(r) -> str:
        if r.outcome.value == "timed" or not r.reason:
            return r.outcome.value
        return re.split(r"[\d(:]", r.reason, maxsplit=1)[0].strip() or r.outcome.value

    return dict(collections.Counter(why(r) for r in records).most_common())


def retarget(configs, v: Variant) -> list:
    """Each config building variant `v`, where codegen.check accepts it."""
    from codegen.check import check

    out = []
    for c in configs:
        try:
            cv = v.apply(c)
        except TypeError:  # a family without the epilogue fields
            continue
        if not check(cv, "sm_90"):
            out.append(cv)
    return list(dict.fromkeys(out))


def operand(torch, batch, rows, cols, col_major, dtype, broadcast=False):
    """(logical view, leading dimension as stored, batch stride) of a fresh random operand."""
    shape = (cols, rows) if col_major else (rows, cols)
    store = torch.randn((1 if broadcast or batch is None else batch, *shape), device="cuda")
    store = store.to(_tdt(torch, dtype))
    view = store.transpose(-1, -2) if col_major else store
    if batch is None:
        return view[0], shape[1], 0
    if broadcast:
        view = view.expand(batch, rows, cols)
    return view, shape[1], 0 if broadcast else store.stride(0)


def launcher(runner, g, m, n, k, lda, ldb, ldc, batch, strides, a, b, c, bias, stream):
    """A no-argument launch of `runner` on these buffers, or None where it refuses them."""
    from tuner.runtime.errors import TmaUnsupported

    try:
        bound = runner.bind(g, m, n, k, lda, ldb, ldc, batch=batch, strides=strides)
    except TmaUnsupported:
        return None
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
    pbias = 0 if bias is None else bias.data_ptr()
    return lambda: bound(pa, pb, pc, 1.0, 0.0, stream, bias=pbias)


def race(torch, timer, cands: dict, peer, out, ref, gate: float, flops: float,
         product=None, gpu_paced=None, sustained: bool = False) -> dict:
    """Check each candidate against `ref`, time the right ones once, then the fastest and
    the peer turn about for ROUNDS; the row's figures. `product`: (the call a user makes of
    gemm-tune for this row, a function of that call's result giving its explain()): run
    once (its first use decides), checked against `ref`, and timed in the same rounds
    (lib_*); `gpu_paced` the same call through the library loaded with pace="gpu"
    (lib_gpu_*). `sustained`: each also timed back to back (Timer.back_to_back, turn about
    for ROUNDS: b2b_ms, torch_b2b_ms, lib_b2b_ms and their ratios), the regime a program's
    forward runs in, beside the flushed one of the bars."""
    calls = {"lib": product, "lib_gpu": gpu_paced}
    lib = {}
    for prefix, call in calls.items():
        if call is not None:
            lib.update(_product(torch, call, ref, gate, prefix))
    first, errors = {}, {}
    for name, run in cands.items():
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        errors[name] = err
        if err <= gate:
            first[name] = statistics.median(timer(run))
    if not first:
        return dict(kernel=None, errors=errors, note="no candidate ran right", **lib)
    best = min(first, key=first.get)
    times = {best: [], "torch": [], **{prefix: [] for prefix in calls}}
    for _ in range(ROUNDS):
        times[best].append(statistics.median(timer(cands[best])))
        times["torch"].append(statistics.median(timer(peer)))
        for prefix, call in calls.items():
            if lib.get(f"{prefix}_ok"):
                times[prefix].append(statistics.median(timer(call[0])))
    ours, theirs = statistics.median(times[best]), statistics.median(times["torch"])
    for prefix in calls:
        if times[prefix]:
            mine = statistics.median(times[prefix])
            lib.update({f"{prefix}_ms": mine, f"{prefix}_ratio": theirs / mine,
                        f"{prefix}_rounds_ms": times[prefix]})
    if sustained:
        runs = {"": cands[best], "torch_": peer,
                **{f"{p}_": call[0] for p, call in calls.items() if lib.get(f"{p}_ok")}}
        b2b = {key: [] for key in runs}
        for _ in range(ROUNDS):
            for key, run in runs.items():
                b2b[key].append(statistics.median(timer.back_to_back(run)))
        t = {key: statistics.median(v) for key, v in b2b.items()}
        lib.update({f"{key}b2b_ms": v for key, v in t.items()})
        lib.update({f"{key}b2b_ratio": t["torch_"] / v for key, v in t.items() if key != "torch_"})
    return dict(kernel=best, ms=ours, torch_ms=theirs, ratio=theirs / ours,
                tflops=flops / ours / 1e9, torch_tflops=flops / theirs / 1e9,
                rounds_ms=times[best], torch_rounds_ms=times["torch"], error=errors[best],
                candidates=len(cands), first_pass_ms=first, errors=errors, **lib)


def _product(torch, product, ref, gate: float, prefix: str = "lib") -> dict:
    """The product's call of a row: its first call (the decision, timed on the host), its
    error against `ref`, what ran and why (PREFIX_*: explain()'s words, with the figures
    of a first-use measurement)."""
    call, ran = product
    t0 = time.perf_counter()
    try:
        got = call()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a refusal is the row's result
        return {f"{prefix}_ok": False, f"{prefix}_error": f"{type(e).__name__}: {e}"}
    first = (time.perf_counter() - t0) * 1e3
    err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    why = ran(got)
    return {f"{prefix}_ok": err <= gate, f"{prefix}_err": err,
            f"{prefix}_first_call_ms": first, f"{prefix}_kernel": why.split(" ")[0],
            f"{prefix}_explain": why}


def _gate(dtype: DType, out: DType, k: int) -> float:
    """Ours against the float64 reference: the inputs' accumulation gate (tuner.bench)
    plus C's rounding (twice its unit roundoff, in norm)."""
    acc = 1e-5 if dtype is DType.F32 else 2e-5 * max(1.0, k / 4096)
    return acc + 2 * {DType.F32: 2.0 ** -24, DType.F16: 2.0 ** -11, DType.BF16: 2.0 ** -8}[out]


def part_layouts(torch, timer, cands, g, stream) -> list:
    rows = []
    m = n = k = 4096
    for dtype in (DType.F32, DType.F16, DType.BF16):
        for family, per in cands.tuned(dtype, (m, n, k)).items():
            cands.build([cfg for cfgs, _ in per.values() for cfg in cfgs])
            res, runs = {}, {}
            for layout, (cfgs, tuned) in per.items():
                out = cfgs[0].out  # the family's NN C type, every candidate's
                a, lda, _ = operand(torch, None, m, k, layout in (Layout.TN, Layout.TT), dtype)
                b, ldb, _ = operand(torch, None, k, n, layout in (Layout.NT, Layout.TT), dtype)
                c = torch.empty(m, n, device="cuda", dtype=_tdt(torch, out))
                mine = {cfg.name: run for cfg in cfgs if cands.built.get(cfg) is not None
                        for run in [launcher(cands.built[cfg], g, m, n, k, lda, ldb, n, 1,
                                             (0, 0, 0), a, b, c, None, stream)]
                        if run is not None}
                if not mine:
                    continue
                ref = torch.matmul(a.double(), b.double())
                row = race(torch, timer, mine, lambda a=a, b=b: torch.matmul(a, b), c, ref,
                           _gate(dtype, out, k), 2.0 * m * n * k)
                res[layout] = dict(row, tuned=tuned)
                if row.get("kernel"):
                    runs[layout] = mine[row["kernel"]]
            # the family's layouts against its NN turn about, in the same rounds (each
            # layout's race above is against torch, at its own time)
            turns = {layout: [] for layout in runs}
            for _ in range(ROUNDS if Layout.NN in runs else 0):
                for layout, run in runs.items():
                    turns[layout].append(statistics.median(timer(run)))
            nn = statistics.median(turns[Layout.NN]) if Layout.NN in runs else None
            for layout, row in res.items():
                mine = statistics.median(turns[layout]) if turns.get(layout) else None
                row.update(part="layouts", dtype=dtype.short, family=family,
                           layout=layout.value, shape=[m, n, k], turns_ms=turns.get(layout),
                           vs_nn=(nn / mine) if nn and mine else None,
                           search=cands.searches.get((dtype.short, family, layout.value)))
                rows.append(row)
                print(f"layouts {dtype.short:4} {family:5} {layout.value} "
                      f"{row.get('tflops') or 0:7.1f} TFLOP/s  vs NN {row['vs_nn'] or 0:.3f}  "
                      f"torch {row.get('torch_tflops') or 0:7.1f}", flush=True)
    return rows


def part_linear(torch, timer, cands, g, stream) -> list:
    import torch.nn.functional as F

    from tuner.runtime import torch_ops

    rows = []
    for dtype in (DType.BF16, DType.F16):
        v = Variant(Layout.NT, dtype, "out", "gelu")
        configs = retarget(cands.base(dtype), v)
        cands.build(configs)
        for tokens, fin, fout in LINEAR:
            m, n, k = tokens, fout, fin
            x = torch.randn(m, k, device="cuda").to(_tdt(torch, dtype))
            w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(_tdt(torch, dtype))
            bias = torch.randn(n, device="cuda").to(_tdt(torch, dtype))
            c = torch.empty(m, n, device="cuda", dtype=_tdt(torch, dtype))
            runs = {cfg.name: run for cfg in configs if cands.built.get(cfg) is not None
                    for run in [launcher(cands.built[cfg], g, m, n, k, k, k, n, 1, (0, 0, 0),
                                         x, w, c, bias, stream)] if run is not None}
            ref = F.gelu(F.linear(x.double(), w.double(), bias.double()))
            row = race(torch, timer, runs, lambda: F.gelu(F.linear(x, w, bias)), c, ref,
                       _gate(dtype, dtype, k), 2.0 * m * n * k,
                       product=(lambda: torch_ops.linear(x, w, bias, "gelu", library=cands.lib),
                                lambda got: cands.lib.explain(x, w.t(), bias=bias,
                                                              activation="gelu")),
                       sustained=True)
            row.update(part="linear", dtype=dtype.short, shape=[m, n, k], variant=v.key,
                       tuned=row.get("kernel") in cands.exact(dtype, (m, n, k), v),
                       peer="F.gelu(F.linear(x, W, b))")
            rows.append(row)
            print(f"linear  {dtype.short:4} {tokens}x{fin}x{fout}  linear() {row.get('lib_ms') or 0:.3f} ms"
                  f" {row.get('lib_ratio') or 0:.3f}x ({row.get('lib_kernel')})"
                  f"  best kernel {row.get('ms') or 0:.3f} ms {row.get('ratio') or 0:.3f}x"
                  f"  torch {row.get('torch_ms') or 0:.3f} ms  {row.get('kernel')}", flush=True)
            print(f"        back to back: linear() {row.get('lib_b2b_ms') or 0:.3f} ms "
                  f"{row.get('lib_b2b_ratio') or 0:.3f}x  best kernel "
                  f"{row.get('b2b_ms') or 0:.3f} ms {row.get('b2b_ratio') or 0:.3f}x  torch "
                  f"{row.get('torch_b2b_ms') or 0:.3f} ms", flush=True)
    return rows


def part_outtype(torch, timer, cands, g, stream) -> list:
    rows = []
    for dtype in (DType.F16, DType.BF16):
        configs = retarget(cands.base(dtype), Variant(Layout.NN, dtype))
        cands.build(configs)
        for m, n, k in SUITE:
            a = torch.randn(m, k, device="cuda").to(_tdt(torch, dtype))
            b = torch.randn(k, n, device="cuda").to(_tdt(torch, dtype))
            c = torch.empty(m, n, device="cuda", dtype=_tdt(torch, dtype))
            runs = {cfg.name: run for cfg in configs if cands.built.get(cfg) is not None
                    for run in [launcher(cands.built[cfg], g, m, n, k, k, n, n, 1, (0, 0, 0),
                                         a, b, c, None, stream)] if run is not None}
            ref = torch.matmul(a.double(), b.double())
            row = race(torch, timer, runs, lambda a=a, b=b: torch.matmul(a, b), c, ref,
                       _gate(dtype, dtype, k), 2.0 * m * n * k,
                       product=cands.product(cands.lib.gemm, a, b),
                       gpu_paced=cands.product(cands.lib_gpu.gemm, a, b))
            row.update(part="outtype", dtype=dtype.short, shape=[m, n, k], peer="torch.matmul",
                       tuned=row.get("kernel") in cands.exact(dtype, (m, n, k),
                                                              Variant(Layout.NN, dtype)))
            rows.append(row)
            print(f"outtype {dtype.short:4} {m}x{n}x{k}  lib.gemm {row.get('lib_ratio') or 0:.3f}x "
                  f"({row.get('lib_kernel')})  pace gpu {row.get('lib_gpu_ratio') or 0:.3f}x "
                  f"({row.get('lib_gpu_kernel')})  best kernel {row.get('ratio') or 0:.3f}x "
                  f"{row.get('kernel')}", flush=True)
    return rows


def part_batched(torch, timer, cands, g, stream) -> list:
    from tuner.runtime import torch_ops

    rows = []
    for dtype in (DType.F16, DType.F32):
        configs = retarget(cands.base(dtype), Variant(Layout.NN, dtype))
        cands.build(configs)
        for batch, m, n, k in BATCHED:
            a, lda, sa = operand(torch, batch, m, k, False, dtype)
            b, ldb, sb = operand(torch, batch, k, n, False, dtype)
            c = torch.empty(batch, m, n, device="cuda", dtype=_tdt(torch, dtype))
            runs = {cfg.name: run for cfg in configs if cands.built.get(cfg) is not None
                    for run in [launcher(cands.built[cfg], g, m, n, k, lda, ldb, n, batch,
                                         (sa, sb, m * n), a, b, c, None, stream)]
                    if run is not None}
            ref = torch.bmm(a.double(), b.double())
            row = race(torch, timer, runs, lambda a=a, b=b: torch.bmm(a, b), c, ref,
                       _gate(dtype, dtype, k), 2.0 * batch * m * n * k,
                       product=cands.product(torch_ops.matmul, a, b, library=cands.lib),
                       gpu_paced=cands.product(torch_ops.matmul, a, b, library=cands.lib_gpu))
            row.update(part="batched", dtype=dtype.short, shape=[batch, m, n, k],
                       tuned=row.get("kernel") in cands.exact(dtype, (m, n, k),
                                                              Variant(Layout.NN, dtype), batch),
                       peer="torch.bmm")
            rows.append(row)
            print(f"batched {dtype.short:4} {batch}x{m}x{n}x{k}  matmul {row.get('lib_ratio') or 0:.3f}x "
                  f"({row.get('lib_kernel')})  pace gpu {row.get('lib_gpu_ratio') or 0:.3f}x "
                  f"({row.get('lib_gpu_kernel')})  best kernel {row.get('ratio') or 0:.3f}x "
                  f"{row.get('kernel')}", flush=True)
    return rows


PARTS = {"layouts": part_layouts, "linear": part_linear, "outtype": part_outtype,
         "batched": part_batched}


def summary(rows: list) -> dict:
    def geo(xs):
        xs = [x for x in xs if x]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

    out = {}
    lay = [r for r in rows if r["part"] == "layouts" and r["layout"] != "nn"]
    if lay:
        out["layouts_worst_vs_nn"] = min((r["vs_nn"] or 0) for r in lay)
        out["layouts_bar_met"] = all((r["vs_nn"] or 0) >= 0.95 for r in lay)
    # the bars are the product's (lib_ratio: the user's call); the best kernel's beside them
    for part, bar in (("linear", 1.05), ("batched", 1.0)):
        rs = [r for r in rows if r["part"] == part]
        if rs:
            out[f"{part}_worst"] = min((r.get("lib_ratio") or 0) for r in rs)
            out[f"{part}_bar_met"] = all((r.get("lib_ratio") or 0) >= bar for r in rs)
            out[f"{part}_best_kernel_worst"] = min((r.get("ratio") or 0) for r in rs)
            if any("lib_b2b_ratio" in r for r in rs):  # back to back (not the bar's regime)
                out[f"{part}_back_to_back_worst"] = min((r.get("lib_b2b_ratio") or 0)
                                                        for r in rs)
    rs = [r for r in rows if r["part"] == "outtype"]
    if rs:
        out["outtype_worst"] = min((r.get("lib_ratio") or 0) for r in rs)
        out["outtype_geomean"] = geo(r.get("lib_ratio") for r in rs)
        out["outtype_bar_met"] = out["outtype_worst"] >= 0.95 and (out["outtype_geomean"] or 0) >= 1.0
        out["outtype_best_kernel_geomean"] = geo(r.get("ratio") for r in rs)
        # the same calls through the library loaded with pace="gpu" (not the bar's figure:
        # a program that says its GPU sets the pace)
        out["outtype_gpu_paced_worst"] = min((r.get("lib_gpu_ratio") or 0) for r in rs)
        out["outtype_gpu_paced_geomean"] = geo(r.get("lib_gpu_ratio") for r in rs)
    return out


def plot(doc: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in PARTS if any(r["part"] == p for r in doc["rows"])]
    fig, axes = plt.subplots(len(parts), 1, figsize=(12, 3.2 * len(parts)), squeeze=False)
    for ax, part in zip(axes[:, 0], parts):
        rs = [r for r in doc["rows"] if r["part"] == part]
        labels = [f"{r['dtype']} {'x'.join(map(str, r['shape']))}" +
                  (f" {r['family']} {r['layout']}" if part == "layouts" else "") for r in rs]
        x = range(len(rs))
        if part == "layouts":
            ax.bar(x, [r.get("vs_nn") or 0 for r in rs], color="tab:blue")
        else:
            ax.bar([i - 0.2 for i in x], [r.get("lib_ratio") or 0 for r in rs], width=0.4,
                   color="tab:blue", label="gemm-tune as called")
            ax.bar([i + 0.2 for i in x], [r.get("ratio") or 0 for r in rs], width=0.4,
                   color="tab:grey", label="best kernel alone")
            ax.legend(fontsize=7)
        bar = {"layouts": 0.95, "linear": 1.05, "outtype": 0.95, "batched": 1.0}[part]
        ax.axhline(bar, color="tab:red", ls="--", lw=1)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("x NN" if part == "layouts" else "x torch")
        ax.set_title(part)
    fig.suptitle(f"gemm-tune layouts, output types, epilogue, batches: {doc['gpu']}, "
                 f"{doc['date'][:10]}, {doc['commit']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--library", type=Path, default=ROOT / "artifacts" / "library")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--family-trials", type=int, default=0, metavar="N",
                    help="layouts: tune each family's kernel per layout where the library "
                    "holds none, in a search of N of that family's candidates (default 0: "
                    "re-target its NN kernel)")
    args = ap.parse_args(argv)

    import torch

    from _common import commit, cpp_path, gpu_slug
    from tuner.runtime import driver
    from wgmma_vs_cublas import Timer

    torch.zeros(1, device="cuda")
    gpu = torch.cuda.get_device_name(0)
    doc = dict(benchmark="layouts-epilogues", gpu=gpu, torch=torch.__version__, call_path=cpp_path(),
               commit=commit(), rounds=ROUNDS, method=__doc__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               rows=[])
    slug = gpu_slug(gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"layouts-epilogues-{slug}-{doc['date'][:10]}.json"
    cands = Candidates(args.library, args.family_trials)
    timer = Timer(torch)
    g = driver.gpu(torch.cuda.current_device())
    stream = torch.cuda.current_stream().cuda_stream
    for part in args.parts.split(","):
        t0 = time.monotonic()
        doc["rows"] += PARTS[part](torch, timer, cands, g, stream)
        doc["summary"] = summary(doc["rows"])
        print(f"== {part}: {time.monotonic() - t0:.0f} s", flush=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")  # as it goes: a cut run keeps it
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {path}")
    plot(doc, path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
