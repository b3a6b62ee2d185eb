"""`gemm-tune report --shape MxNxK [--layout ...]`: an HTML page and PNG figures for one
tuned shape (its newest entry, of the variant asked):
the optimisation history and parameter importances (Optuna's own visualization),
the winner and cuBLAS on a roofline of the GPU, and the best configurations."""

from __future__ import annotations

import html
import warnings
from pathlib import Path

from codegen.arch import ARCHS
from codegen.config import DType
from codegen.errors import UsageError
from tuner._shape import format_shape
from tuner.runtime.library import Library

__all__ = ["report"]

#: Memory bandwidth for the roofline, GB/s: measured where we could (a device-to-device
#: copy, bytes read + written), the vendor's figure otherwise.
BANDWIDTH_GBS = {"NVIDIA H200": 4300.0, "NVIDIA H100 80GB HBM3": 3350.0}


def bandwidth_gbs(gpu: str) -> float:
    return BANDWIDTH_GBS.get(gpu, 2000.0)


def peak_tflops(arch, dtype: DType) -> float:
    tensor = dtype is not DType.F32
    return arch.peak_tensor_tflops(dtype) if tensor else arch.peak_fp32_tflops


def _study(db: Path, name: str):
    import optuna

    if not db.is_file() or db.stat().st_size == 0:
        return None
    from tuner._study import check_studies_file

    check_studies_file(db)
    try:
        return optuna.load_study(study_name=name, storage=f"sqlite:///{db.resolve()}")
    except KeyError:
        return None


def report(lib: Library, shape, dtype: DType, studies_db: Path, out: Path,
           variant: dict | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (after the backend is chosen)
    import optuna  # noqa: F401

    e = _latest_entry(lib, shape, dtype, variant)
    out.mkdir(parents=True, exist_ok=True)
    figures = _study_figures(e, shape, _study(studies_db, _study_key(e, shape)), out)
    figures.append(_roofline_figure(lib, e, shape, dtype, out))
    top = e.get("top") or []
    if top:
        figures.append(_top_figure(e, top, out))
    page = out / "report.html"
    page.write_text(_page_html(e, shape, dtype, top, figures))
    return page


def _latest_entry(lib: Library, shape, dtype: DType, variant: dict | None = None) -> dict:
    """The library's newest entry for the shape, input type and (the fields given of) the
    variant; a usage error if none."""
    from tuner._shape import entry_variant

    m, n, k = shape
    entries = [e for e in lib.manifest["entries"]
               if (e["m"], e["n"], e["k"]) == (m, n, k) and e["dtype"] == dtype.short
               and all(entry_variant(e)[f] == v for f, v in (variant or {}).items())]
    if not entries:
        asked = "".join(f" {f}={v}" for f, v in (variant or {}).items())
        raise UsageError(f"no {dtype.short}{asked} entry for {format_shape(shape)} in "
                         f"{lib.path}: tune it first")
    return max(entries, key=lambda x: x["date"])


def _study_key(e: dict, shape) -> str:
    """The name the tune gave its Optuna study: the cache key of the problem (with its
    variant and batch; an older entry's is the plain problem's)."""
    from tuner.cache import CacheKey

    return str(CacheKey.from_entry(dict(e, m=shape[0], n=shape[1], k=shape[2])))


def _study_figures(e: dict, shape, study, out: Path) -> list[tuple[str, str]]:
    """Optuna's optimisation history and parameter importances; none without the study."""
    import optuna

    figures: list[tuple[str, str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if study is not None:
            figures.append(_history_figure(e, study, out))
            figures.append(_importances_figure(study, out))
    return figures


def _history_figure(e: dict, study, out: Path) -> tuple[str, str]:
    import matplotlib.pyplot as plt
    import optuna

    ax = optuna.visualization.matplotlib.plot_optimization_history(study)
    ax.axhline(e["cublas_tflops"], color="tab:red", linestyle="--", label="cuBLAS")
    ax.set_ylabel("TFLOP/s")
    ax.legend()
    ax.figure.savefig(out / "history.png", dpi=110, bbox_inches="tight")
    plt.close(ax.figure)
    return ("history.png", "Optimisation history (TFLOP/s per trial; pruned "
                           "and failed trials have no value)")


def _importances_figure(study, out: Path) -> tuple[str, str]:
    """The importances figure, or (no file, why not) when the study has too few trials."""
    import matplotlib.pyplot as plt
    import optuna

    try:
        ax = optuna.visualization.matplotlib.plot_param_importances(study)
        ax.figure.savefig(out / "importances.png", dpi=110, bbox_inches="tight")
        plt.close(ax.figure)
        return ("importances.png", "Parameter importances (fANOVA over the "
                                   "timed trials)")
    except (ValueError, RuntimeError) as err:  # too few completed trials
        return ("", f"No parameter importances: {err}")


def _intensity(mm: int, nn: int, kk: int, es: int, cs: int = 4) -> float:
    """FLOP per byte of A and B (es bytes an element) and C (cs bytes) moved once."""
    return 2.0 * mm * nn * kk / ((mm * kk + kk * nn) * es + mm * nn * cs)


def _c_size(e: dict) -> int:
    """Bytes of an entry's C element (an older entry's C is fp32)."""
    return 2 if e.get("out", "f32") in ("f16", "bf16") else 4


def _roofline_figure(lib: Library, e: dict, shape, dtype: DType, out: Path) -> tuple[str, str]:
    """Roofline of the GPU with the winner and cuBLAS at this shape."""
    import matplotlib.pyplot as plt

    arch = ARCHS.get(e["cc"])
    tensor = dtype is not DType.F32  # a tf32 / fp16 / bf16 request may run on tensor cores
    peak = (peak_tflops(arch, dtype) if arch
            else max(e["tflops"], e["cublas_tflops"]) * 1.3)
    what = f"{dtype.short} tensor cores" if tensor else "FP32"
    bw = bandwidth_gbs(e["gpu"])
    es = 2 if dtype in (DType.F16, DType.BF16) else 4  # bytes of A and B
    ai = _intensity(*shape, es, _c_size(e))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ridge = peak * 1e3 / bw
    ax.plot([0.5, ridge, 2 ** 14], [0.5 * bw / 1e3, peak, peak], color="black",
            label=f"roofline: {peak:.1f} TFLOP/s {what}, {bw / 1e3:.1f} TB/s")
    _plot_other_entries(ax, lib, e, es)
    ax.scatter([ai], [e["tflops"]], color="tab:blue", s=60, zorder=3,
               label=f"gemm-tune {e['tflops']:.1f}")
    ax.scatter([ai], [e["cublas_tflops"]], color="tab:red", marker="x", s=60, zorder=3,
               label=f"cuBLAS {e['cublas_tflops']:.1f}")
    _plot_measured(ax, e.get("profile"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of A, B, C)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{format_shape(shape)} {dtype.short} ({_variant(e)}) on {e['gpu']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(out / "roofline.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ("roofline.png", "The winner and cuBLAS on the GPU's roofline (faint: the "
                            "library's other entries)")


def _plot_other_entries(ax, lib: Library, e: dict, es: int) -> None:
    """The library's other entries for the same GPU and input type, faint."""
    for other in lib.manifest["entries"]:
        if other["gpu"] == e["gpu"] and other["dtype"] == e["dtype"] and other is not e:
            oa = _intensity(other["m"], other["n"], other["k"], es, _c_size(other))
            ax.scatter([oa], [other["tflops"]], color="tab:blue", alpha=0.3, s=20)


def _plot_measured(ax, prof: dict | None) -> None:
    """Measured by ncu (gemm-tune inspect --profile): DRAM bytes, kernel time."""
    if not prof:
        return
    for who, color, marker in (("ours", "tab:blue", "D"), ("cublas", "tab:red", "P")):
        mm = prof["measured"][who]
        if mm.get("intensity_dram") and mm.get("tflops"):
            ax.scatter([mm["intensity_dram"]], [mm["tflops"]], color=color, marker=marker,
                       s=60, zorder=4, facecolors="none",
                       label=f"{'gemm-tune' if who == 'ours' else 'cuBLAS'} measured "
                             f"(ncu: DRAM bytes) {mm['tflops']:.1f}")


def _top_figure(e: dict, top: list[dict], out: Path) -> tuple[str, str]:
    """The best configurations as bars, cuBLAS as a line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(top)))
    ax.barh([t["kernel"] for t in top][::-1], [t["tflops"] for t in top][::-1],
            color="tab:blue")
    ax.axvline(e["cublas_tflops"], color="tab:red", linestyle="--", label="cuBLAS")
    ax.set_xlabel("TFLOP/s (re-timed turn about with cuBLAS)")
    ax.legend(loc="lower right")
    ax.tick_params(axis="y", labelsize=7)
    fig.savefig(out / "top.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ("top.png", "The best configurations")


def _variant(e: dict) -> str:
    from tuner._shape import variant_text

    return variant_text(e)


def _cublas_note(e: dict) -> str:
    """What the cuBLAS figure is, where the entry says (its tune stored the label)."""
    return f" (cuBLAS: {html.escape(e['cublas'])})" if e.get("cublas") else ""


def _top_rows(top: list[dict]) -> str:
    return "".join(
        f"<tr><td>{t['rank']}</td><td><code>{html.escape(t['kernel'])}</code></td>"
        f"<td>{t['tflops']:.1f}</td><td>{t['pct_cublas']:.1f}%</td><td>{t['registers']}</td>"
        f"<td>{t['smem']}</td><td>{t['occupancy']:.0%}</td><td>{t['limiter']}</td></tr>"
        for t in top)


def _figures_html(figures: list[tuple[str, str]]) -> str:
    """Each figure with its caption; a caption without a file is a paragraph."""
    return "".join(f'<figure><img src="{f}"><figcaption>{html.escape(c)}</figcaption></figure>'
                   if f else f"<p>{html.escape(c)}</p>" for f, c in figures)


def _page_html(e: dict, shape, dtype: DType, top: list[dict],
               figures: list[tuple[str, str]]) -> str:
    rows, imgs = _top_rows(top), _figures_html(figures)
    stats = e.get("stats", {})
    return f"""<!doctype html><meta charset="utf-8">
<title>gemm-tune {format_shape(shape)} {dtype.short} ({html.escape(_variant(e))})</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{padding:2px 8px}}
img{{max-width:100%}}</style>
<h1>{format_shape(shape)} {dtype.short} ({html.escape(_variant(e))}) on {html.escape(e['gpu'])}</h1>
<p>Winner <code>{html.escape(e['kernel'])}</code>: {e['tflops']:.1f} TFLOP/s, cuBLAS
{e['cublas_tflops']:.1f} TFLOP/s in the same run ({e['ratio']:.2f}x){_cublas_note(e)};
tuned {e['date']};
{stats.get('compiled', '?')} candidates compiled, {stats.get('timed', '?')} timed,
{stats.get('pruned', '?')} pruned by the model; Spearman rank correlation of the model's
predicted and the measured times over the tune's timed candidates:
{stats.get('rank_rho', 'not recorded')}.</p>
<table><tr><th>#</th><th>kernel</th><th>TFLOP/s</th><th>% of cuBLAS</th><th>regs</th>
<th>smem B</th><th>occupancy</th><th>limiter</th></tr>{rows}</table>
{imgs}
"""
