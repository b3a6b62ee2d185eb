"""Kernel by kernel: a patched decoder layer's forward against the unpatched one.

bench/model_gemms.py times whole forwards; where a patched forward lags although each of
its GEMMs keeps up, this says where the time goes. For each layer and token count it
builds the layer as model_gemms does (random weights, seed 0), patches a copy through the
library (torch_ops.patch), runs both a few times (first-use decisions made), then:
  - torch.profiler over 5 forwards of each: the GPU time per forward and the kernels that
    take it (per forward: calls and microseconds, largest first);
  - both forwards timed turn about (bench/wgmma_vs_cublas.Timer: CUDA events, the L2
    flushed before each repetition), 5 rounds, each round's median;
  - the host's time to issue a forward (a loop of them, not synchronized, the GPU left to
    catch up after it), and the host-side ops that take it (torch.profiler's CPU
    activity: self time per forward, largest first): where a host-paced forward lags;
  - the host's time to issue each linear (with the activation a patch fuses into it),
    unpatched and patched, the GPU held back by a sleeping kernel;
  - the library's plans at that token count: what each problem ran and why;
  - with --trace, a Chrome trace of three forwards of each (the host's ops beside the
    GPU's kernels, each forward after the flush): where a forward waits.

    python bench/forward_profile.py [--library DIR] [--cases llama:2048,gpt2:128] [--trace]
        [--out DIR]

Writes forward-profile-<gpu>-<date>.json under --out (default bench/results).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import RESULTS, commit, cpp_path, write  # noqa: E402

#: kernels listed per forward
TOP = 14


def profile_forward(torch, fn, reps: int = 5) -> dict:
    """GPU time per forward, and its kernels, largest first (per forward)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels: dict = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.time_range.elapsed_us()
    rows = sorted(((n, c / reps, us / reps) for n, (c, us) in kernels.items()),
                  key=lambda r: -r[2])
    return dict(gpu_us=sum(r[2] for r in rows),
                kernels=[dict(name=n, calls=c, us=us) for n, c, us in rows[:TOP]])


def host_forward(torch, fn, reps: int = 20) -> dict:
    """The host's time to issue one forward (median of `reps` unsynchronized calls, the
    GPU's queue never full at these sizes), and its top ops by self CPU time a forward."""
    import time

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ops = sorted(((e.key, e.count / 5, e.self_cpu_time_total / 5)
                  for e in prof.key_averages()), key=lambda r: -r[2])
    return dict(host_us=statistics.median(times),
                host_ops=[dict(name=n, calls=c, self_us=us) for n, c, us in ops[:TOP]])


def host_modules(torch, plain, patched, x, reps: int = 100, rounds: int = 5) -> list[dict]:
    """The host's microseconds a call of each linear of the layer (with the activation a
    patch fuses into it: the nn.Sequential around both) takes to issue, unpatched and
    patched, on the input it gets in a forward: `reps` calls queued behind a sleeping
    kernel (the GPU never holds the host back), turn about, median of `rounds`."""
    import time

    named, pnamed = dict(plain.named_modules()), dict(patched.named_modules())
    paths = []
    for path, m in plain.named_modules():
        if isinstance(m, torch.nn.Linear):
            parent = path.rpartition(".")[0]
            paths.append(parent if isinstance(named.get(parent), torch.nn.Sequential)
                         else path)
    inputs: dict = {}
    hooks = [named[p].register_forward_pre_hook(
        lambda mod, args, p=p: inputs.setdefault(p, args[0])) for p in paths]
    plain(x)
    for h in hooks:
        h.remove()
    rows = []
    for p in paths:
        us: dict = {"unpatched": [], "patched": []}
        for _ in range(rounds):
            for label, mod in (("unpatched", named[p]), ("patched", pnamed[p])):
                mod(inputs[p])
                torch.cuda.synchronize()
                torch.cuda._sleep(40_000_000)  # ~20 ms: longer than the host's loop
                t0 = time.perf_counter()
                for _ in range(reps):
                    mod(inputs[p])
                us[label].append((time.perf_counter() - t0) * 1e6 / reps)
                torch.cuda.synchronize()
        rows.append(dict(module=p, **{k: statistics.median(v) for k, v in us.items()}))
    return rows


def trace_forward(torch, fn, flush, path: Path, reps: int = 3) -> None:
    """A Chrome trace (torch.profiler, the host's ops and the GPU's kernels) of `reps`
    forwards, each after the L2 flush and a synchronisation, as the benches time them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            torch.cuda.synchronize()
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", default="artifacts/library")
    ap.add_argument("--cases", default="llama:2048,gpt2:128,llama:16",
                    help="layer:tokens pairs, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trace", action="store_true",
                    help="also a Chrome trace of each forward under --out (forward-trace-*)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import datetime

    import torch

    import model_gemms as mg
    from tuner.runtime import load_library, torch_ops
    from wgmma_vs_cublas import Timer

    call_path = cpp_path()
    lib = load_library(args.library)
    timer = Timer(torch)
    cases = []
    for case in args.cases.split(","):
        name, tokens = case.split(":")
        spec, tokens = mg.LAYERS[name], int(tokens)
        torch.manual_seed(0)
        plain = mg.build_layer(spec, "cuda")
        patched = copy.deepcopy(plain, memo={id(p): p for p in plain.parameters()})
        torch_ops.patch(patched, lib)
        x = torch.randn(1, tokens, spec.hidden, device="cuda", dtype=mg._tdt(spec.dtype))
        row = dict(layer=name, tokens=tokens)
        with torch.inference_mode():
            for _ in range(3):
                plain(x), patched(x)
            torch.cuda.synchronize()
            for label, f in (("unpatched", plain), ("patched", patched)):
                row[label] = profile_forward(torch, lambda: f(x))
                row[label]["rounds_ms"] = []
                row[label].update(host_forward(torch, lambda: f(x)))
            for _ in range(args.rounds):
                for label, f in (("unpatched", plain), ("patched", patched)):
                    row[label]["rounds_ms"].append(statistics.median(timer(lambda: f(x))))
            row["host_modules"] = host_modules(torch, plain, patched, x)
            if args.trace:
                for label, f in (("unpatched", plain), ("patched", patched)):
                    trace_forward(torch, lambda: f(x), timer.flush, Path(
                        args.out or RESULTS, f"forward-trace-{name}-{tokens}-{label}.json"))
        row["plans"] = [dict(mnk=[p.m, p.n, p.k], variant=p.problem.variant.key,
                             runs=p.choice.kernel or "cuBLAS", rule=p.choice.rule)
                        for p in lib.plans.values() if p.m == tokens and p.problem]
        cases.append(row)
        for label in ("unpatched", "patched"):
            r = row[label]
            print(f"== {name} T={tokens} {label}: GPU {r['gpu_us']:.1f} us a forward, "
                  f"timed {statistics.median(r['rounds_ms']):.4f} ms "
                  f"{[round(t, 4) for t in r['rounds_ms']]}")
            for k in r["kernels"]:
                print(f"   {k['calls']:4.1f}x {k['us']:9.1f} us  {k['name'][:100]}")
            print(f"   host: {r['host_us']:.1f} us to issue a forward; self CPU time a forward:")
            for k in r["host_ops"]:
                print(f"   {k['calls']:4.1f}x {k['self_us']:9.1f} us  {k['name'][:100]}")
        print("   host us a call, unpatched -> patched:")
        for m in row["host_modules"]:
            print(f"   {m['module']:<14} {m['unpatched']:7.2f} -> {m['patched']:7.2f}")
        for p in row["plans"]:
            print(f"   plan {p['mnk']} {p['variant']}: {p['runs']} ({p['rule']})")
    doc = dict(benchmark="forward-profile", gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, commit=commit(), call_path=call_path,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               library=str(args.library), cases=cases)
    print("wrote", write("forward-profile", doc, args.out))


if __name__ == "__main__":
    main()
