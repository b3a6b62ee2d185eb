"""The main-loop instruction mix of named SIMT kernels, from their SASS (no GPU needed):
each is compiled (nvcc / ptxas, the compile cache), disassembled (cuobjdump) and its main
loop's hot path counted (codegen.sass); a Markdown table on stdout, the JSON under
bench/results/ (or --out).

    python bench/sass_mix.py gemm_simt_f32_128x128x8_r8x8_w16x2_p0_v4_s2_g1_sw ...
    python bench/sass_mix.py --pairs bench/pairs/mainloop-4096.txt --label mainloop-4096
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, commit  # noqa: E402

from codegen.compile import compile_many, nvcc_version  # noqa: E402
from codegen.config import config_from_name  # noqa: E402
from codegen.sass import kernel_mix  # noqa: E402


def names_of(pairs: Path) -> list[str]:
    """The kernels of a pairs file ("SHAPE KERNEL" lines, # comments), in order, once each."""
    names = [line.split()[1] for line in pairs.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return list(dict.fromkeys(names))


def row(cfg, res) -> dict:
    """One kernel's figures: the mix (codegen.sass.Mix.to_dict) and ptxas's resources."""
    mix = kernel_mix(cfg, res.cubin)
    rest = mix.issued - mix.counts["ffma"] - mix.counts["lds"]
    return dict(mix.to_dict(), rest=rest, rest_per_kstep=round(rest / mix.k_steps, 2),
                registers=res.resources.registers, spill_bytes=res.resources.spill_bytes)


def table(rows: list[dict]) -> str:
    lines = ["| kernel | issued / iteration (k-steps) | FFMA share | LDS / k-step | rest / "
             "k-step | FFMAs reusing an operand | RF reads / FFMA | bank conflicts / FFMA | "
             "LDS to use (least, median) | regs, spill |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        w = r["lds_widths"]
        widths = ", ".join(f"{n} x {b}-bit" for b, n in w.items() if n)
        lines.append(f"| `{r['kernel'].removeprefix('gemm_simt_')}` | {r['issued']} ({r['k_steps']}) "
                     f"| {r['ffma_share']:.1%} | {r['per_kstep']['lds']:g} ({widths}) | "
                     f"{r['rest_per_kstep']:g} | {r['ffma_reuse']} of {r['counts']['ffma']} | "
                     f"{r['rf_reads_per_ffma']:.2f} | {r['bank_conflicts_per_ffma']:.2f} | "
                     f"{r['lds_lead'][0]}, "
                     f"{r['lds_lead'][len(r['lds_lead']) // 2]} | {r['registers']}, "
                     f"{r['spill_bytes']} B |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="kernel names")
    ap.add_argument("--pairs", type=Path, help="a bench/pairs/ file: its kernels")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--label", default="sass-mix", help="result file name prefix")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    names = list(args.names) + (names_of(args.pairs) if args.pairs else [])
    if not names:
        ap.error("give kernel names or --pairs FILE")
    configs = [config_from_name(n) for n in names]
    done = {c.name: (c, r) for c, r in compile_many(configs, args.arch, jobs=args.jobs)}
    bad = {n: r.error for n, (_, r) in done.items() if not r.ok}
    if bad:
        sys.exit(f"compile failed: {bad}")
    rows = [row(*done[c.name]) for c in configs]
    print(table(rows))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = dict(benchmark="sass_mix", arch=args.arch, nvcc=nvcc_version(), date=date,
                commit=commit(), rows=rows)
    path = Path(args.out or RESULTS) / f"{args.label}-{args.arch}-{date[:10]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
