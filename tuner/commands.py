"""`gemm-tune list | inspect | export | report`: reading a tuned-kernel library."""

from __future__ import annotations

import dataclasses
import json

from codegen.config import DType, Family, config_from_dict, config_from_name
from codegen.errors import ToolchainError, UsageError
from codegen.sass import disassemble, find_cuobjdump, loop_mix
from tuner._shape import (
    entry_variant, epilogue_text, format_shape, fp32_mode, parse_shape, shapes_file,
    variant_text,
)
from tuner.runtime.library import Library


def _entries(lib: Library, shape=None, dtype: DType | None = None, kernel: str | None = None,
             variant: dict | None = None, replaced: bool = False):
    """The entries of a shape, input type, kernel and (the fields given of) a variant; with
    `replaced`, then the replaced entries' (Manifest.replaced), marked replaced=True."""
    out = []
    kept = [dict(e, replaced=True) for e in lib.store.replaced] if replaced else []
    for e in lib.manifest["entries"] + kept:
        if shape and (e["m"], e["n"], e["k"]) != tuple(shape):
            continue
        if dtype and e["dtype"] != dtype.short:
            continue
        if kernel and e["kernel"] != kernel:
            continue
        if variant and any(entry_variant(e)[f] != v for f, v in variant.items()):
            continue
        out.append(e)
    return out


def variant_filter(args, dtype: DType) -> dict:
    """The variant fields `inspect --shape` / `report` were given (--layout, --out (report:
    --c-type), --bias, --act, --batch), checked as the tune's options are; {} for none."""
    from tuner._shape import parse_act, parse_batch, parse_bias, parse_layout, parse_out

    f = {}
    if getattr(args, "layout", None) is not None:
        f["layout"] = parse_layout(args.layout).value
    out = parse_out(args.c_type) if getattr(args, "c_type", None) is not None else None
    if out is not None:
        f["out"] = out.short
    if getattr(args, "bias", None) is not None:
        f["bias"] = parse_bias(args.bias, out or DType.F16)
    if getattr(args, "act", None) is not None:
        f["act"] = parse_act(args.act)
    if getattr(args, "batch", None) is not None:
        f["batch"] = parse_batch(args.batch)
    return f


def cmd_list(args, console) -> int:
    from rich.table import Table

    lib = Library.load(args.library)
    rows = [dict(shape=f"{e['m']}x{e['n']}x{e['k']}", dtype=e["dtype"], **entry_variant(e),
                 epilogue=epilogue_text(e.get("bias", "none"), e.get("act", "none")),
                 gpu=e["gpu"], kernel=e["kernel"], tflops=e["tflops"],
                 pct_cublas=round(100 * e["ratio"], 1), cublas_tflops=e["cublas_tflops"],
                 date=e["date"][:10])
            for e in sorted(lib.manifest["entries"], key=lambda e: (e["gpu"], e["m"] * e["n"] * e["k"]))]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    kept = len(lib.store.replaced)
    t = Table(title=f"gemm-tune library {args.library} ({len(rows)} entries; problem: input "
                    "type, layout, C's type, epilogue, batch)", caption=(
                        f"and {kept} replaced entries, their kernels kept as candidates of "
                        "first-use measurement" if kept else None))
    for col in ("shape", "problem", "GPU", "kernel", "TFLOP/s", "% of cuBLAS", "date"):
        t.add_column(col, justify="right" if col in ("TFLOP/s", "% of cuBLAS") else "left",
                     no_wrap=col in ("kernel", "shape"))
    for r in rows:
        problem = " ".join([r["dtype"], r["layout"], f"C={r['out']}"]
                           + ([r["epilogue"]] if r["epilogue"] != "none" else [])
                           + ([f"x{r['batch']}{' B shared' if r['broadcast_b'] else ''}"]
                              if r["batch"] > 1 else []))
        t.add_row(r["shape"], problem, r["gpu"], r["kernel"], f"{r['tflops']:.1f}",
                  f"{r['pct_cublas']:.1f}%", r["date"])
    console.print(t)
    return 0


def cmd_inspect(args, console) -> int:
    lib = None
    if args.name and not args.shape:
        config_from_name(args.name)  # a malformed name is a usage error
        if (args.library / "manifest.json").is_file():
            lib = Library.load(args.library)
        if lib is None or not _entries(lib, kernel=args.name, replaced=True):
            return _inspect_built_here(args, console)
    lib = lib or Library.load(args.library)
    entries = _inspect_entries(args, lib)
    e = entries[0]
    info = lib.manifest["kernels"][f"{e['arch']}/{e['kernel']}"]
    source, cubin = lib.path / info["source"], lib.path / info["cubin"]
    if args.source:
        print(source.read_text(), end="")
        return 0
    if args.sass:
        print(_sass(cubin), end="")
        return 0
    if args.sass_mix:
        return _inspect_sass_mix(args, info, cubin)
    if args.profile:
        return _inspect_profile(args, lib, e, info, console)
    doc = _inspect_doc(e, info, entries, source, cubin)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    console.print(_inspect_table(e, info, doc))
    return 0


def _inspect_built_here(args, console) -> int:
    """`inspect NAME` of a kernel the library does not hold: its source rendered, then
    compiled here for --arch (default sm_90, as --dry-run's; the compile cache keeps it):
    the SASS, the main loop's mix, or its parameters, resources and occupancy; nothing is
    timed (a tune or the library's first use times it)."""
    from codegen import render
    from codegen.arch import parse_arch
    from codegen.check import check
    from codegen.compile import compile_config, default_cache_dir
    from codegen.occupancy import occupancy

    cfg = config_from_name(args.name)
    if args.profile:
        raise UsageError(f"--profile runs a library entry at its tuned shape; {cfg.name} is "
                         f"not in the library at {args.library}")
    if args.source:
        print(render(cfg), end="")
        return 0
    arch = parse_arch(args.arch or "sm_90")
    why = check(cfg, arch)
    if why:
        raise UsageError(f"{cfg.name} is not in the library at {args.library}, and cannot be "
                         f"built for {arch.sm}: {'; '.join(why)}")
    res = compile_config(cfg, arch, default_cache_dir())
    if not res.ok:
        raise UsageError(f"{cfg.name}: the compile failed: {res.error.splitlines()[0]}")
    if args.sass:
        print(_sass(res.cubin), end="")
        return 0
    if args.sass_mix:
        return _inspect_sass_mix(args, dict(config=cfg.to_dict()), res.cubin)
    r = res.resources
    occ = occupancy(cfg.threads, r.registers, r.smem, arch)
    doc = dict(kernel=cfg.name, arch=res.arch, config=cfg.to_dict(), in_library=False,
               registers=r.registers, smem=r.smem, spill_bytes=r.spill_stores + r.spill_loads,
               stack_frame=r.stack_frame, occupancy=occ.occupancy, limiter=occ.limiter,
               blocks_per_sm=occ.blocks_per_sm, cubin=str(res.cubin))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    from rich.table import Table

    t = Table(title=f"{cfg.name} (not in the library: built here, not timed)",
              show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for what, value in [("parameters", _parameters(cfg)), ("problem", variant_text(cfg.to_dict())),
                        ("arch", res.arch),
                        ("resources", f"{doc['registers']} registers, {doc['smem']} B shared, "
                                      f"{doc['spill_bytes']} B spilled, {doc['stack_frame']} B stack"),
                        ("occupancy", f"{doc['occupancy']:.0%}, {occ.blocks_per_sm} block"
                                      f"{'s' if occ.blocks_per_sm != 1 else ''} an SM "
                                      f"(limited by {occ.limiter})"),
                        ("cubin", doc["cubin"]),
                        ("source", f"gemm-tune inspect {cfg.name} --source")]:
        t.add_row(what, value)
    console.print(t)
    return 0


def _parameters(cfg) -> str:
    """A config's tuning parameters as name=value (not its problem's fields)."""
    return ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
                     if f.name not in ("dtype", "family", "layout", "out", "bias", "act"))


def _inspect_entries(args, lib: Library) -> list[dict]:
    """The library entries `inspect` was asked about: a kernel's, or a shape's; never none."""
    if bool(args.name) == bool(args.shape):
        raise UsageError("inspect takes a kernel name or --shape MxNxK (one of them)")
    if args.name:
        config_from_name(args.name)  # a malformed name is a usage error
        entries = _entries(lib, kernel=args.name, replaced=True)
        if not entries:
            raise UsageError(f"kernel {args.name} is not in the library at {args.library}")
        if args.profile and all(e.get("replaced") for e in entries):
            raise UsageError(f"--profile runs a library entry at its tuned shape; {args.name} "
                             "is kept only as a replaced entry's kernel (a first-use "
                             "candidate)")
        entries = [e for e in entries if not e.get("replaced")] or entries
    else:
        shape, dtype = parse_shape(args.shape), DType.parse(args.dtype)
        entries = _entries(lib, shape, dtype, variant=variant_filter(args, dtype))
        if not entries:
            raise UsageError(f"no {args.dtype} entry for {format_shape(shape)} "
                             f"{_asked(args)}in {args.library}")
    return entries


def _asked(args) -> str:
    """The variant options given, as words ('--layout nt --act gelu '), or ''."""
    given = [f"--{o.replace('c_type', 'out')} {getattr(args, o)}"
             for o in ("layout", "c_type", "bias", "act", "batch")
             if getattr(args, o, None) is not None]
    return " ".join(given) + " " if given else ""


def _sass(cubin) -> str:
    """The cubin's SASS, by cuobjdump."""
    try:
        return disassemble(cubin)
    except ToolchainError as e:
        raise UsageError(str(e)) from None


def _inspect_sass_mix(args, info: dict, cubin) -> int:
    """`inspect NAME --sass-mix`: what one iteration of a CUDA-core kernel's main loop
    issues (codegen.sass.loop_mix), FFMAs' share first."""
    cfg = config_from_dict(info["config"])
    if cfg.family is not Family.SIMT:
        raise UsageError(f"--sass-mix reads the FFMA loop of a CUDA-core (simt) kernel; "
                         f"{cfg.name} is a {cfg.family.value} kernel (--sass shows its code)")
    try:
        mix = loop_mix(_sass(cubin), cfg.name, cfg.rm * cfg.rn)
    except ValueError as e:
        raise UsageError(f"{cfg.name}: {e}") from None
    print(json.dumps(mix.to_dict(), indent=2) if args.json else mix.summary())
    return 0


def _inspect_doc(e: dict, info: dict, entries: list[dict], source, cubin) -> dict:
    """What `inspect --json` prints, and the table shows."""
    res = e["resources"]
    return dict(kernel=e["kernel"], arch=e["arch"], config=info["config"],
                registers=res["registers"], smem=res["smem_static"] + res["smem_dynamic"],
                spill_bytes=res["spill_stores"] + res["spill_loads"],
                stack_frame=res["stack_frame"], occupancy=e["occupancy"], limiter=e["limiter"],
                tuned_for=[f"{x['m']}x{x['n']}x{x['k']} {x['dtype']} ({variant_text(x)}) "
                           f"on {x['gpu']}: {x['tflops']:.1f} TFLOP/s, cuBLAS "
                           f"{x['cublas_tflops']:.1f}" + (
                               " (replaced there by a re-tune; kept as a first-use candidate)"
                               if x.get("replaced") else "") for x in entries],
                timing=e["timing"], cublas_timing=e["cublas_timing"],
                source=str(source), cubin=str(cubin), cubin_sha256=info["cubin_sha256"],
                model=_model_figures(e, info), rank_rho=(e.get("stats") or {}).get("rank_rho"),
                profile=e.get("profile"))


def _inspect_table(e: dict, info: dict, doc: dict):
    from rich.table import Table

    t = Table(title=e["kernel"], show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for what, value in _inspect_rows(e, info, doc):
        t.add_row(what, value)
    return t


def _timing_line(tm: dict) -> str:
    return (f"median {tm['median_ms']:.4f} ms (p10 {tm['p10_ms']:.4f}, p90 "
            f"{tm['p90_ms']:.4f}, {tm['reps']} reps)")


def _inspect_rows(e: dict, info: dict, doc: dict) -> list[tuple[str, str]]:
    """The (what, value) rows of `inspect`'s table."""
    rows = [("parameters", _parameters(config_from_dict(info["config"]))),
            ("problem", variant_text(e)),
            ("resources", f"{doc['registers']} registers, {doc['smem']} B shared, "
                          f"{doc['spill_bytes']} B spilled, {doc['stack_frame']} B stack"),
            ("occupancy", f"{doc['occupancy']:.0%} (limited by {doc['limiter']})")]
    rows += [("tuned for", line) for line in doc["tuned_for"]]
    rows += [("time", _timing_line(e["timing"])), ("cuBLAS", _timing_line(e["cublas_timing"]))]
    mf = doc["model"]
    rows.append(("model", f"predicted {mf['predicted_tflops']:.1f} TFLOP/s "
                          f"({mf['limiter']}-bound), bound {mf['bound_tflops']:.1f}; tile "
                          f"intensity {mf['traffic']['intensity']} FLOP/B; rank rho of its tune: "
                          f"{doc['rank_rho'] if doc['rank_rho'] is not None else '-'}"))
    if doc["profile"]:
        ours = doc["profile"]["measured"]["ours"]
        rows.append(("profiled", f"{ours['tflops']} TFLOP/s, DRAM {ours['dram_read_bytes']} B "
                                 f"read (gemm-tune inspect --profile to refresh)"))
    rows.append(("source", doc["source"]))
    rows.append(("cubin", f"{doc['cubin']} (sha256 {doc['cubin_sha256'][:16]}...)"))
    return rows


def cmd_export(args, console) -> int:
    from tuner.runtime.export import export

    out = export(Library.load(args.library), args.out, args.arch)
    console.print(f"exported to {out}: build with `make -C {out}` or "
                  f"`cmake -S {out} -B {out}/build && cmake --build {out}/build`")
    return 0


def cmd_upgrade(args, console) -> int:
    from tuner.runtime.manifest import upgrade

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {args.jobs})")
    n = upgrade(args.library, jobs=args.jobs, force=args.force)
    console.print(f"{args.library}: " + (f"{n} kernels recompiled; the library is current"
                                         if n else "already current, nothing to do"))
    return 0


def cmd_prewarm(args, console) -> int:
    shapes = shapes_file(args.shapes)
    if not shapes:
        raise UsageError(f"--shapes {args.shapes}: no shape in it")
    dtype = fp32_mode(DType.parse(args.dtype), args)
    lib = Library.load(args.library, pace=args.pace)
    rows = []
    from rich.progress import track

    for m, n, k in track(shapes, description="measuring", console=console,
                         disable=args.json):
        c = lib.decide(m, n, k, dtype)
        rows.append(dict(shape=format_shape((m, n, k)), kernel=c.kernel or "cuBLAS",
                         rule=c.rule, measured_ms=c.measured_ms, reason=c.reason))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    t = Table(title=f"dispatch decisions for {len(rows)} shapes ({dtype.short}), kept in "
                    f"{lib.table_path}")
    for col in ("shape", "runs", "rule", "ms (runs / cuBLAS)"):
        t.add_column(col)
    for r in rows:
        ms = r["measured_ms"] or {}
        ran = ms.get(r["kernel"] if r["kernel"] != "cuBLAS" else "cublas")
        figs = f"{ran:.4f} / {ms['cublas']:.4f}" if ran is not None and "cublas" in ms else "-"
        t.add_row(r["shape"], r["kernel"], r["rule"], figs)
    console.print(t)
    return 0


def cmd_report(args, console) -> int:
    from tuner.report import report

    shape, dtype = parse_shape(args.shape), DType.parse(args.dtype)
    variant = variant_filter(args, dtype)
    tag = "".join(f"-{v}" for v in variant.values())
    out = args.out or args.artifacts / "reports" / f"{format_shape(shape)}-{dtype.short}{tag}"
    page = report(Library.load(args.library), shape, dtype, args.artifacts / "studies.db", out,
                  variant)
    console.print(f"report: {page}")
    return 0


def cmd_status(args, console) -> int:
    """`gemm-tune status --storage URL [--study NAME]`: what a shared study holds."""
    from rich.table import Table

    from tuner._study import describe, open_storage, storage_file, study_state

    file = storage_file(args.storage)
    if file is not None and (not file.is_file() or file.stat().st_size == 0):
        # (opening it would make a new, empty store of it)
        raise UsageError(f"--storage {describe(args.storage)}: no studies there ({file} is "
                         f"{'empty' if file.is_file() else 'not there'})")
    rows = study_state(open_storage(args.storage, retry_s=10.0), args.study)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        t = Table(title=f"study {r['study']} in {describe(args.storage)}")
        for col in ("done", "timed", "running", "stale", "released", "trials", "best"):
            t.add_column(col, justify="right")
        best = f"{r['best']['kernel']} {r['best']['tflops']}" if r["best"] else "-"
        t.add_row(*(str(r[c]) for c in ("done", "timed", "running", "stale", "released",
                                         "trials")), best)
        console.print(t)
        for w, d in sorted(r["workers"].items()):
            age = "-" if d["age_s"] is None else f"{d['age_s']:.0f} s ago"
            console.print(f"  worker {w}: {d['state']} (lease renewed {age})")
    return 0


def _model_figures(e: dict, info: dict) -> dict:
    """The model's figures for a library entry: occupancy and limiter, tiled traffic and
    intensity, predicted time, the roofline bound."""
    from codegen.arch import parse_arch
    from tuner.model import bound_tflops, predict
    from codegen.occupancy import occupancy

    cfg = config_from_dict(info["config"])
    arch = parse_arch(e["arch"])
    res = e["resources"]
    shape = (e["m"], e["n"], e["k"])
    v = entry_variant(e)
    batch = v["batch"]
    occ = occupancy(cfg.threads, res["registers"], res["smem_static"] + res["smem_dynamic"],
                    arch)
    bound, _ = bound_tflops(cfg, shape, arch, batch)
    pred = predict(cfg, shape, arch, occ, batch) if occ.blocks_per_sm else None
    flops = 2.0 * e["m"] * e["n"] * e["k"] * batch
    es = 2 if e["dtype"] in ("f16", "bf16") else 4
    cs = 2 if v["out"] in ("f16", "bf16") else 4
    b_count = 1 if v["broadcast_b"] else batch
    min_bytes = ((e["m"] * e["k"] * batch + e["k"] * e["n"] * b_count) * es
                 + e["m"] * e["n"] * cs * batch)
    from tuner.report import bandwidth_gbs, peak_tflops

    bw, peak = bandwidth_gbs(e["gpu"]), peak_tflops(arch, DType.parse(e["dtype"]))
    return dict(occupancy=round(occ.occupancy, 4), limiter_occupancy=occ.limiter,
                blocks_per_sm=occ.blocks_per_sm,
                traffic=pred.traffic if pred else None,
                predicted_s=pred.seconds if pred else None,
                predicted_tflops=round(pred.tflops, 2) if pred else 0.0,
                limiter=pred.limiter if pred else "-", terms=pred.terms if pred else None,
                bound_tflops=round(bound, 2),
                roofline_tflops=round(min(peak, bw * 1e9 * flops / min_bytes / 1e12), 2),
                roofline_dram_tflops=(round(min(peak, bw * 1e9 * flops / pred.traffic["dram_bytes"]
                                                / 1e12), 2) if pred else None))


def _inspect_profile(args, lib: Library, e: dict, info: dict, console) -> int:
    """`inspect --profile`: ncu on the kernel and on cuBLAS at the entry's shape."""
    from tuner.profile import profile

    if variant_text(e) != "nn, C f32, none":
        raise UsageError(f"--profile runs the plain problem (nn, fp32 C, no epilogue, one "
                         f"problem); {e['kernel']} was tuned for {variant_text(e)}")

    shape = (e["m"], e["n"], e["k"])
    cubin = lib.path / info["cubin"]
    flops = 2.0 * e["m"] * e["n"] * e["k"]
    ours = profile(shape, e["dtype"], cubin=cubin, kernel=e["kernel"]).summary(flops)
    theirs = profile(shape, e["dtype"]).summary(flops)
    model = _model_figures(e, info)
    doc = dict(kernel=e["kernel"], shape=format_shape(shape), dtype=e["dtype"], model=model,
               measured=dict(ours=ours, cublas=theirs),
               rank_rho=(e.get("stats") or {}).get("rank_rho"))
    lib.update_entry(e, profile=doc)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    from rich.table import Table

    t = Table(title=f"{e['kernel']} at {format_shape(shape)} under ncu, next to the model")
    for col in ("", "model", "gemm-tune (ncu)", "cuBLAS (ncu)"):
        t.add_column(col, justify="left" if not col else "right")
    tr = model["traffic"] or {}

    def f(x, fmt="{:.1f}"):
        return "-" if x is None else fmt.format(x)
    t.add_row("time", f(model["predicted_s"] and model["predicted_s"] * 1e3, "{:.4f} ms"),
              f(ours["time_s"] * 1e3, "{:.4f} ms"), f(theirs["time_s"] * 1e3, "{:.4f} ms"))
    t.add_row("TFLOP/s", f(model["predicted_tflops"]), f(ours["tflops"]), f(theirs["tflops"]))
    t.add_row("DRAM bytes read", f(tr.get("dram_bytes"), "{:,}") + " (tiled, all)",
              f(ours["dram_read_bytes"], "{:,}"), f(theirs["dram_read_bytes"], "{:,}"))
    t.add_row("DRAM bytes written", "-", f(ours["dram_write_bytes"], "{:,}"),
              f(theirs["dram_write_bytes"], "{:,}"))
    t.add_row("intensity FLOP/B", f"{tr.get('intensity')} (block tile)",
              f(ours["intensity_dram"], "{:.1f} (DRAM)"), f(theirs["intensity_dram"], "{:.1f} (DRAM)"))
    t.add_row("block tile A / B / C bytes",
              f"{tr.get('a_bytes')} / {tr.get('b_bytes')} / {tr.get('c_bytes')}", "", "")
    t.add_row("occupancy (warps active)",
              f"{model['occupancy']:.0%} theoretical, {model['limiter_occupancy']}-limited",
              f(ours["warps_active_pct"], "{:.1f}%"), f(theirs["warps_active_pct"], "{:.1f}%"))
    t.add_row("SM / DRAM throughput", f"bound by {model['limiter']}",
              f"{f(ours['sm_throughput_pct'])}% / {f(ours['dram_throughput_pct'])}%",
              f"{f(theirs['sm_throughput_pct'])}% / {f(theirs['dram_throughput_pct'])}%")
    t.add_row("roofline bound", f"{model['roofline_tflops']} TFLOP/s (compulsory bytes); "
                                f"{model['roofline_dram_tflops']} (tiled DRAM)", "", "")
    t.add_row("smem bank conflicts ld / st / cp.async", "-",
              *(" / ".join(f(side.get(k), "{:.0f}") for k in (
                  "smem_conflicts_ld", "smem_conflicts_st", "smem_conflicts_cp_async"))
                for side in (ours, theirs)))
    t.add_row("top stalls (per issue)", "-",
              ", ".join(f"{s['reason']} {s['per_issue']}" for s in ours["stalls"]),
              ", ".join(f"{s['reason']} {s['per_issue']}" for s in theirs["stalls"]))
    t.add_row("rank rho of its tune", f(doc["rank_rho"], "{:.3f}"), "", "")
    console.print(t)
    console.print(f"stored in {lib.path / 'manifest.json'} (entry {e['kernel']}, 'profile')")
    return 0
