"""The gemm-tune command line.

    gemm-tune --shape 4096x4096x4096            tune on the GPU, compare with cuBLAS
    gemm-tune --shape 4096x4096x4096 --dry-run  generate, compile and model, no GPU
    gemm-tune --shape 16x4096x4096 --dtype fp16 --layout nt --bias out --act gelu --batch 8
                                                the problem a program makes: operands'
                                                layout, C's type (--out), a fused bias
                                                and activation, a strided batch

Errors the user can fix print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from codegen.arch import parse_arch
from codegen.config import DType
from codegen.errors import GemmTuneError, UsageError
from codegen.families._common import Variant
from tuner._shape import (
    Task, default_out, format_shape, fp32_mode, parse_act, parse_batch, parse_bias,
    parse_layout, parse_out, parse_shape, shapes_file,
)
from tuner.runtime.measure import PACES

__all__ = ["main", "build_parser"]

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # main() prints one line and exits with status 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gemm-tune",
        exit_on_error=False,
        description="Generate, compile and tune CUDA GEMM kernels for one problem shape; "
        "time the winner against cuBLAS and cache it.",
        epilog="`gemm-tune tune ...` is the same command. Also: gemm-tune list | "
        "inspect NAME|--shape MxNxK | export --out DIR | "
        "report --shape MxNxK | prewarm --shapes FILE | status --storage URL [--study NAME] "
        "(each with --help).",
    )
    _problem_arguments(p.add_argument_group("the problem"))
    _variant_arguments(p.add_argument_group("its variant and precision"))
    _search_arguments(p.add_argument_group("the search"))
    _sharing_arguments(p.add_argument_group("storage and GPUs"))
    p.add_argument("--top", type=int, default=5, help="rows in the result table (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    return p


def _problem_arguments(g) -> None:
    g.add_argument("--shape", action="append", default=[],
                   help="problem size MxNxK, e.g. 4096x4096x4096 (repeat for several shapes)")
    g.add_argument("--shapes", type=Path, default=None,
                   help="a file of shapes, one MxNxK per line (# comments), tuned in turn")
    g.add_argument("--problems", type=Path, default=None,
                   help="a program's recorded problems (GEMM_TUNE_RECORD=FILE or lib.record: "
                        "JSON lines), merged and tuned costliest first, each with --trials and "
                        "--timeout (with --budget, its share of that); their dtypes are the "
                        "file's")
    g.add_argument("--budget", type=float, default=None,
                   help="seconds for all of --problems, each problem's search getting its "
                        "share of what is left by its work (at least 20 s, at most --timeout); "
                        "problems left when it is spent are listed as skipped (run again to "
                        "go on)")
    g.add_argument("--m-buckets", default=None,
                   help="with --problems: problems differing only in M are tuned once per "
                        "M-bucket, at its largest M (default: GEMM_TUNE_M_BUCKETS or the "
                        "library's 1,2,4,8,16,32,64,+128; 'exact': each M)")
    g.add_argument("--dtype", default="fp32",
                   help="input type, always with FP32 accumulation (C's type: --out): fp32 "
                        "(default; CUDA-core FP32 FMAs only), tf32 (fp32 data; TF32 tensor "
                        "cores are candidates too), 3xtf32 (fp32 data at fp32 accuracy; "
                        "3xTF32 tensor-core kernels are candidates too), fp16 or bf16 "
                        "(tensor cores, and CUDA "
                        "cores widening the inputs on load)")


def _variant_arguments(g) -> None:
    g.add_argument("--layout", default="nn",
                   help="how A and B are stored, A's letter first: nn (default; both "
                        "row-major), nt (B column-major: x @ W.t() with W stored N x K, as "
                        "torch.nn.Linear keeps it), tn, tt (T: column-major)")
    g.add_argument("--out", default=None,
                   help="C's type: fp32, fp16 or bf16 (default: the input type for fp16 and "
                        "bf16, as torch; fp32 for fp32, tf32 and 3xtf32 data); accumulation "
                        "is FP32, rounded once to C's type")
    g.add_argument("--bias", default="none",
                   help="a bias vector of N values added to every row of C: none (default), "
                        "out (in C's type) or f32 (fp32; with fp32 C the same as out)")
    g.add_argument("--act", default="none",
                   help="the activation applied last, in FP32: none (default), relu, gelu "
                        "(erf form), gelu_tanh (tanh approximation), silu")
    g.add_argument("--batch", default="1",
                   help="a strided batch of this many problems, each with its own A, B and "
                        "C (default 1)")
    g.add_argument("--broadcast-b", action="store_true",
                   help="with --batch: one B shared by the batch (stride 0), as x @ W for a "
                        "batch of x whose problems lie apart (where x's rows lie one after "
                        "another the library runs one product of them: tune "
                        "(batch*M)xNxK instead)")
    g.add_argument("--allow-tf32", action="store_true",
                   help="with fp32 data, let TF32 tensor cores compete (the tf32 error gate "
                        "then applies to them, and cuBLAS runs with TF32 too): --dtype tf32")
    g.add_argument("--allow-3xtf32", action="store_true",
                   help="with fp32 data, let 3xTF32 tensor-core kernels compete: each input "
                        "split into two tf32 parts, three TF32 products, FP32 accumulation; "
                        "held to the fp32 gate (1e-5), timed against cuBLAS SGEMM: "
                        "--dtype 3xtf32")


def _search_arguments(g) -> None:
    g.add_argument("--arch", default=None,
                   help="target, e.g. sm_90 (default: the GPU's own; sm_90 for --dry-run)")
    g.add_argument("--dry-run", action="store_true",
                   help="no GPU: sample the space, validate, compile, model occupancy")
    g.add_argument("--trials", type=int, default=150,
                   help="candidates to compile and time (default 150)")
    g.add_argument("--timeout", type=float, default=540.0,
                   help="stop the search after this many seconds (default 540)")
    g.add_argument("--sampler", choices=("tpe", "tpe-independent", "random", "grid"),
                   default="tpe", help="Optuna sampler (default tpe: each family's parameters "
                   "modelled jointly; tpe-independent: one by one; grid walks the whole valid "
                   "space)")
    g.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    g.add_argument("--no-model", action="store_true",
                   help="neither start from the model's best-predicted candidates nor prune "
                        "on its predicted time (the bound and the occupancy model still prune)")
    g.add_argument("--force", action="store_true", help="re-tune even if the cache has a winner")
    g.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: all cores)")
    g.add_argument("--artifacts", type=Path, default=None,
                   help="where .cu/.cubin/.json go (default ./artifacts or $GEMM_TUNE_ARTIFACTS)")
    g.add_argument("--cache", type=Path, default=None,
                   help="winners cache file (default <artifacts>/cache.json)")
    g.add_argument("--library", type=Path, default=None,
                   help="tuned-kernel library the winner joins (default <artifacts>/library)")


def _sharing_arguments(g) -> None:
    g.add_argument("--storage", default=None,
                   help="Optuna storage: sqlite:///tune.db, postgresql://..., or "
                        "journal:///PATH for a journal file (default: in memory); the same "
                        "command resumes a study kept there without repeating trials, and "
                        "processes on several hosts can share one study")
    g.add_argument("--study", default=None,
                   help="study name in --storage (default: the cache key of the problem; "
                        "with --problems: the study of the set's claims, default 'problems')")
    g.add_argument("--devices", default=None,
                   help="GPUs to time on, e.g. 0,1: one timing worker process per GPU, all in "
                        "one study (default: $GEMM_TUNE_DEVICE or 0)")
    g.add_argument("--lease", type=float, default=60.0,
                   help="with --storage: seconds a process may go without renewing its lease "
                        "(every lease/6 s) before the others fail its claims and retry them "
                        "(default 60)")
    g.add_argument("--kernel-timeout", type=float, default=60.0,
                   help="seconds a candidate may take before its worker is killed and "
                        "restarted as hung (default 60)")


def _artifacts_dir(args) -> Path:
    return Path(args.artifacts or os.environ.get("GEMM_TUNE_ARTIFACTS") or "artifacts")


def _console():
    from rich.console import Console

    from tuner._progress import PIPE_WIDTH

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _print_dry_run(report, console) -> None:
    from rich import box
    from rich.table import Table

    t = Table(title=f"gemm-tune --dry-run {format_shape(report.shape)} {report.dtype} "
                    f"({report.problem}) on {report.arch}, fastest predicted first",
              box=box.SIMPLE_HEAD)
    for col in ("kernel", "regs", "smem B", "occupancy", "limiter", "predicted TFLOP/s",
                "status"):
        # the figures keep their line; a long kernel name (a variant's) folds instead
        t.add_column(col, justify="left" if col in ("kernel", "limiter", "status") else "right",
                     no_wrap=col != "kernel", overflow="fold" if col == "kernel" else "ellipsis")
    for r in report.rows:
        occ = "-" if r.occupancy is None else f"{r.occupancy:.0%} ({r.blocks_per_sm}/SM)"
        t.add_row(r.config.name, "-" if r.registers is None else str(r.registers),
                  "-" if r.smem is None else str(r.smem), occ, r.limiter or "-",
                  "-" if r.predicted_tflops is None else f"{r.predicted_tflops:.1f}", r.status)
    console.print(t)
    for r in report.rows:  # why, for those that will not run (--json has every figure)
        if r.reason:
            console.print(f"{r.config.name}: {r.status}: {r.reason}")
    ok = sum(r.status == "ok" for r in report.rows)
    console.print(
        f"space {report.space} configurations (and their split-K variants where the tiles "
        f"leave SMs idle): {report.valid} valid for {report.arch} at this shape; "
        f"compiled {len(report.rows)}: {ok} ok, "
        f"{sum(r.status == 'pruned' for r in report.rows)} pruned by the model, "
        f"{sum(r.status == 'compile failed' for r in report.rows)} failed to compile."
    )
    console.print(f"artifacts: {report.artifacts / report.arch}/<kernel>.cu, .cubin, .json")


def _dry_run(args, task: Task) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn

    from tuner._progress import progress
    from tuner.dryrun import dry_run

    from tuner.space import why_unsearched

    arch = parse_arch(args.arch or "sm_90")
    why = why_unsearched(task.dtype, task.variant, arch)
    if why is not None:
        raise UsageError(f"{task.label} on {arch.sm}: {why}")
    out = _console()
    with progress("compiling", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=args.json) as bar:
        bar_task = bar.add_task("compiled", total=None)
        report = dry_run(task.shape, arch, args.trials, args.seed, _artifacts_dir(args),
                         args.jobs, progress=lambda done, total: bar.update(
                             bar_task, completed=done, total=total),
                         dtype=task.dtype, variant=task.variant, batch=task.batch)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_dry_run(report, out)
    return 0


SUBCOMMANDS = ("list", "inspect", "export", "report", "prewarm", "status", "upgrade")


def build_subparsers() -> argparse.ArgumentParser:
    p = _Parser(prog="gemm-tune", exit_on_error=False,
                description="Inspect and export a tuned-kernel library.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(q):
        q.add_argument("--artifacts", type=Path, default=None,
                       help="artifacts directory (default ./artifacts or $GEMM_TUNE_ARTIFACTS)")
        q.add_argument("--library", type=Path, default=None,
                       help="library directory (default <artifacts>/library)")
        return q

    def variant(q, out_flag="--out"):
        """Which of a shape's tuned problems: any, unless these say (as the tune's; C's
        type is --c-type where --out names a directory)."""
        for opt, what in (("--layout", "nn, nt, tn or tt"), (out_flag, "C's type"),
                          ("--bias", "none, out or f32"), ("--act", "the activation"),
                          ("--batch", "the batch")):
            q.add_argument(opt, default=None, help=f"only the entries of this {what} "
                                                   "(default: any)",
                           dest="c_type" if opt == out_flag else None)
        return q

    q = common(sub.add_parser("list", help="tuned entries: shape, kernel, TFLOP/s, % of cuBLAS"))
    q.add_argument("--json", action="store_true")
    q = common(sub.add_parser("inspect", help="one kernel (by name) or one tuned shape"))
    q.add_argument("name", nargs="?", help="kernel name, e.g. gemm_simt_f32_128x128x8_...")
    q.add_argument("--shape", help="the tuned shape MxNxK instead of a kernel name")
    q.add_argument("--dtype", default="fp32")
    variant(q)
    q.add_argument("--source", action="store_true", help="print the generated .cu")
    q.add_argument("--sass", action="store_true", help="print the SASS (cuobjdump)")
    q.add_argument("--sass-mix", action="store_true",
                   help="a CUDA-core kernel's main loop from its SASS: instructions issued per "
                        "iteration and k-step by class, the FFMAs' share, shared loads by width")
    q.add_argument("--profile", action="store_true",
                   help="run the kernel and cuBLAS at its shape under Nsight Compute (ncu, "
                        "GPU): DRAM bytes, time, occupancy, throughputs, stalls, bank "
                        "conflicts, next to the model's figures; stored in the library entry")
    q.add_argument("--arch", default=None,
                   help="a kernel the library does not hold is built for this architecture "
                        "(default sm_90)")
    q.add_argument("--json", action="store_true")
    q = common(sub.add_parser("export", help="a C/C++ bundle with gemm_tuned.h, CMake and make"))
    q.add_argument("--out", type=Path, required=True, help="directory for the bundle")
    q.add_argument("--arch", default=None, help="the arch to export (default: the most tuned)")
    q = common(sub.add_parser(
        "prewarm", help="decide, by measuring on this GPU, the kernel for each shape of a file "
                        "(the dispatch table a library's first calls would fill)"))
    q.add_argument("--shapes", type=Path, required=True, help="one MxNxK per line (# comments)")
    q.add_argument("--dtype", default="fp32")
    q.add_argument("--allow-tf32", action="store_true", help="decide the tf32 calls of fp32 data")
    q.add_argument("--allow-3xtf32", action="store_true",
                   help="decide the 3xTF32 calls of fp32 data")
    q.add_argument("--pace", choices=PACES, default=None,
                   help="what sets the program's pace: either (default, or GEMM_TUNE_PACE: "
                        "the caller's loop and the GPU's time alone weighed), gpu (its host "
                        "runs ahead, CUDA graphs: a kernel must win on the GPU alone) or host "
                        "(the loop alone); decisions are kept apart by it")
    q.add_argument("--json", action="store_true")
    q = common(sub.add_parser(
        "upgrade", help="recompile an older library's kernels for this gemm-tune's argument "
                        "list, or a current one's kernels whose files are missing or do not "
                        "match their sha256 (a library carried as its manifest alone), and "
                        "compile the static-B twins its decode entries lack; nvcc needed, its "
                        "entries are kept"))
    q.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPUs)")
    q.add_argument("--force", action="store_true",
                   help="recompile a current library's kernels too, from this gemm-tune's "
                        "templates (after a change to a kernel's code)")
    q = common(sub.add_parser("report", help="HTML + PNG report of one tuned shape (its "
                                             "newest entry of the variant asked)"))
    q.add_argument("--shape", required=True)
    q.add_argument("--dtype", default="fp32")
    variant(q, out_flag="--c-type")
    q.add_argument("--out", type=Path, default=None,
                   help="report directory (default <artifacts>/reports/<shape>-<dtype>)")
    q = common(sub.add_parser("status", help="a shared study's state: candidates done, "
                                             "running, stale, released; its workers' leases"))
    q.add_argument("--storage", required=True, help="the study's storage URL (as --storage)")
    q.add_argument("--study", default=None, help="one study (default: every study there)")
    q.add_argument("--json", action="store_true")
    return p


def _run_subcommand(argv) -> int:
    from tuner import commands

    args = build_subparsers().parse_args(argv)
    args.artifacts = _artifacts_dir(args)
    args.library = args.library or args.artifacts / "library"
    return getattr(commands, f"cmd_{args.command}")(args, _console())


#: options whose value is a shape: "--shape -5x4x4" would read to argparse as two options
_SHAPE_OPTIONS = ("--shape",)


def _joined_shapes(argv: list[str]) -> list[str]:
    """--shape followed by a value that starts with '-' (a negative size) as --shape=VALUE,
    so that the size check, not argparse, answers it."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in _SHAPE_OPTIONS and i + 1 < len(argv) and argv[i + 1][:2] != "--" \
                and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _run(argv) -> int:
    argv = _joined_shapes(sys.argv[1:] if argv is None else list(argv))
    if argv and argv[0] in SUBCOMMANDS:
        return _run_subcommand(argv)
    if argv and argv[0] == "tune":  # `gemm-tune tune --problems FILE` reads as it is meant
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive (got {args.timeout:g})")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {args.jobs})")
    if args.top < 1:
        raise UsageError(f"--top must be at least 1 (got {args.top})")
    if args.problems is not None:
        return _run_problems(args)
    for option, given in (("--budget", args.budget), ("--m-buckets", args.m_buckets)):
        if given is not None:
            raise UsageError(f"{option} goes with --problems FILE")
    shapes = [parse_shape(x) for x in args.shape] + shapes_file(args.shapes)
    if not shapes:
        raise UsageError("give a problem: --shape MxNxK (or --shapes FILE, or --problems FILE)")
    if args.devices is not None:
        args.devices = _device_list(args.devices)
    if args.kernel_timeout <= 0:
        raise UsageError(f"--kernel-timeout must be positive (got {args.kernel_timeout:g})")
    dtype = fp32_mode(DType.parse(args.dtype), args)
    variant, batch = problem_options(args, dtype)
    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1 (got {args.trials})")
    tasks = [Task(dtype, shape, variant, batch, args.broadcast_b) for shape in shapes]
    if args.dry_run:
        if len(tasks) > 1:
            raise UsageError("--dry-run takes one shape")
        return _dry_run(args, tasks[0])
    from tuner import tune as _tune  # the GPU path

    return _tune.run_cli(args, tasks, _artifacts_dir(args))


def problem_options(args, dtype: DType) -> tuple[Variant, int]:
    """The problem's variant and batch from --layout, --out, --bias, --act, --batch and
    --broadcast-b (UsageError, one line, for a bad value). C's type defaults to the
    input type for fp16 / bf16 data and fp32 otherwise (tuner._shape.default_out)."""
    out = default_out(dtype) if args.out is None else parse_out(args.out)
    variant = Variant(parse_layout(args.layout), out, parse_bias(args.bias, out),
                      parse_act(args.act))
    batch = parse_batch(args.batch)
    if args.broadcast_b and batch < 2:
        raise UsageError("--broadcast-b shares B across a batch: give --batch 2 or more")
    return variant, batch


def _run_problems(args) -> int:
    from tuner.problems import read_problems

    if args.shape or args.shapes or args.dry_run:
        raise UsageError("--problems takes no --shape, --shapes or --dry-run")
    given = [f"--{o.replace('_', '-')}" for o, plain in (
        ("layout", "nn"), ("out", None), ("bias", "none"), ("act", "none"), ("batch", "1"),
        ("broadcast_b", False)) if getattr(args, o) != plain]
    if given:
        raise UsageError(f"--problems takes no {', '.join(given)}: each recorded problem "
                         "names its own")
    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget must be positive (got {args.budget:g})")
    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1 (got {args.trials})")
    if args.devices is not None:
        args.devices = _device_list(args.devices)
    from tuner.runtime.dispatch import MBuckets

    buckets = MBuckets.parse(args.m_buckets) if args.m_buckets else MBuckets.from_env()
    problems = read_problems(args.problems, buckets)
    from tuner import tune as _tune  # the GPU path

    return _tune.run_problems(args, problems, _artifacts_dir(args))


def _device_list(text: str) -> list[int]:
    """--devices 0,1 -> [0, 1]: GPU numbers, each once (checked against the GPUs later)."""
    try:
        ids = [int(x) for x in str(text).split(",")]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise UsageError(f"--devices {text!r}: expected distinct GPU numbers like 0,1")
    return ids


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and of `python -m tuner`."""
    try:
        return _run(argv)
    except (GemmTuneError, argparse.ArgumentError) as e:
        print(f"gemm-tune: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None:  # not a path the user gave: a fault to show whole
            raise
        # a directory or file the user named that cannot be made, read or written
        print(f"gemm-tune: error: cannot use {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gemm-tune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
