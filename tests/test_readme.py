"""The README quotes results files that exist, and the figures it quotes from the latest
library run are that file's (a figure the README states must come from a committed run)."""

import gzip
import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_results_file_the_readme_cites_exists():
    cited = set(re.findall(r"bench/results/[\w.-]+\.(?:jsonl|json|png|log)(?:\.gz)?", README))
    assert cited, "the README cites no results file"
    missing = sorted(p for p in cited if not (ROOT / p).is_file())
    assert not missing, missing


def test_the_library_figures_are_those_of_the_file_cited():
    cited = re.search(r"bench/results/(library-vs-cublas-[\w-]+\.json)", README).group(1)
    doc = json.loads((ROOT / "bench" / "results" / cited).read_text())
    s, steps = doc["summary"], doc["host_steps_us"]
    assert f"geometric mean of {s['geomean']:.2f}x torch.matmul" in " ".join(README.split())
    assert f"from {s['min_ratio']:.2f}x" in README
    assert f"{len(s['below_095'])} shapes below 0.95x".replace("4 ", "four ") in \
        " ".join(README.split())
    assert f"{steps['lib.gemm(a, b, c), whole call']:.1f} us of host time" in README
    assert f"torch.matmul's {steps['torch.matmul(a, b, out=c), whole call']:.1f}" in README


def _tunes(name: str, shape: str = "4096x4096x4096") -> dict:
    """The tunes of the file cited whose name starts with `name`, by dtype, at `shape` (a
    line that names no shape is 4096^3's)."""
    cited = re.search(rf"bench/results/({name}[\w-]*\.jsonl)", README).group(1)
    rows = [json.loads(x) for x in (ROOT / "bench" / "results" / cited).read_text().splitlines()]
    return {r["dtype"]: r for r in rows if r.get("shape", "4096x4096x4096") == shape}


def test_the_4096_tune_figures_are_those_of_the_files_cited():
    fp32 = _tunes("tunes-4096-fp32-")["fp32"]
    fp16 = _tunes("tunes-fp16-five-shapes-")["fp16"]
    text = " ".join(README.split())
    assert f"took {fp32['wall_s']:.0f} s and found `{fp32['kernel']}` at {fp32['tflops']:.1f}" \
        f" TFLOP/s against cuBLAS's {fp32['cublas_tflops']:.1f}" in text
    assert f"({fp32['ratio']:.2f}x)" in text
    assert f"4096^3 took {fp16['wall_s']:.0f} s and won at {fp16['ratio']:.2f}x cuBLAS " \
        f"(`{fp16['kernel']}`, {fp16['tflops']:.1f} against {fp16['cublas_tflops']:.1f} " \
        f"TFLOP/s, {fp16['timed']} candidates timed)" in text
    shapes = ("8192x8192x1024", "4096x14336x4096", "2048x8192x3072", "12288x4096x2048")
    others = [_tunes("tunes-fp16-five-shapes-", shape)["fp16"] for shape in shapes]
    for shape, r in zip(shapes, others):
        assert f"{shape} {r['wall_s']:.0f} s ({r['ratio']:.2f}x)" in text
    rhos = [f"{r['rank_rho']:.2f}" for r in [fp16] + others]
    assert "the model's rank correlation over the candidates each timed " + \
        ", ".join(rhos[:-1]) + f" and {rhos[-1]}" in text
    t3 = _tunes("tune-3xtf32-default-")["3xtf32"]
    assert re.search(rf"took {t3['wall_s']:.0f} s and won on (the H200|an H100) with the "
                     "pre-split", text)
    assert f"with the pre-split `{t3['kernel']}` " \
        f"at {t3['tflops']:.1f} TFLOP/s, {t3['ratio']:.2f}x cuBLAS SGEMM's " \
        f"{t3['cublas_tflops']:.1f} in the same run ({t3['timed']} of its {t3['compiled']}" in text
    assert f"had a Spearman correlation of {t3['rank_rho']:.2f} with their" in text
    steps = t3["steps_s"]
    assert f"Its steps took {sum(steps.values()):.0f} s ({steps['workers']:.1f} s for the " \
        f"timing worker, {steps['search']:.0f} s of search" in text



def test_the_latest_fresh_fp16_tunes_are_those_of_the_file_cited():
    """The latest fresh fp16 tunes: each shape's wall time, ratio to cuBLAS and the model's
    rank correlation over what it timed, as the file cited holds them."""
    text = " ".join(README.split())
    shapes = ("4096x4096x4096", "8192x8192x1024", "4096x14336x4096")
    rows = [_tunes("tunes-fp16-three-shapes-", shape)["fp16"] for shape in shapes]
    first = rows[0]
    assert f"4096^3 {first['wall_s']:.1f} s, {first['ratio']:.2f}x cuBLAS (`{first['kernel']}`, " \
        f"{first['tflops']:.0f} against {first['cublas_tflops']:.0f} TFLOP/s)" in text
    for shape, r in zip(shapes[1:], rows[1:]):
        assert f"{shape} {r['wall_s']:.1f} s, {r['ratio']:.2f}x" in text
    rhos = [f"{r['rank_rho']:.2f}" for r in rows]
    assert f"the model's rank correlation over what each timed {rhos[0]}, {rhos[1]} and " \
        f"{rhos[2]}" in text

def test_the_layouts_and_epilogue_figures_are_those_of_the_files_cited():
    """The product's figures (lib_ratio: the user's call, its first use deciding) of the
    complete run cited."""
    text = " ".join(README.split())
    rows = _cited("layouts-epilogues-[0-9a-f]{7}-h200")["rows"]

    def lib(part, rs=rows):
        return [r["lib_ratio"] for r in rs if r["part"] == part]

    out = lib("outtype")
    assert len(out) == 26 and f"2-byte C ran {_span(out)} of torch.matmul" in text
    assert f"(geometric mean {math.exp(sum(map(math.log, out)) / len(out)):.2f})" in text
    assert f"A 3-D matmul ran {_span(lib('batched'))} of torch.bmm" in text
    linear = [r for r in rows if r["part"] == "linear"]
    assert f"`linear(x, W, b, \"gelu\")` at 8192 tokens ran {_span(lib('linear'))} of " \
        "`F.gelu(F.linear(x, W, b))`" in text
    assert f"the best fused kernel alone runs {_span([r['ratio'] for r in linear])}" in text
    vs_nn = [r["vs_nn"] for r in rows if r["part"] == "layouts" and r["layout"] != "nn"]
    assert f"NT, TN and TT kernels at 4096^3 ran {_span(vs_nn)} of its NN" in text


def test_the_decode_prefetch_figures_are_those_of_the_file_cited():
    import gzip

    text = " ".join(README.split())
    name = re.search(r"bench/results/(decode-roof-prefetch-b-(?!bf16)[\w-]*\.json\.gz)",
                     README).group(1)
    rows = json.loads(gzip.open(ROOT / "bench" / "results" / name).read())["rows"]
    at = {tuple(r["shape"]): r for r in rows if r["dtype"] == "f16"}
    one, sixteen = at[1, 4096, 4096], at[16, 4096, 4096]
    assert f"1x4096x4096 ran {one['us']:.2f} us, {one['roof']:.0%} of the DRAM roof and " \
        f"{one['ratio']:.2f}x torch.matmul" in text
    assert f"16x4096x4096 {sixteen['us']:.2f} us ({sixteen['roof']:.0%}, " \
        f"{sixteen['ratio']:.2f}x)" in text


def _standing() -> str:
    """The README's "Where it stands" table, one line a row, whitespace folded."""
    table = README.split("## Where it stands", 1)[1].split("\n## ", 1)[0]
    return "\n".join(" ".join(line.split()) for line in table.splitlines() if line.startswith("|"))


def test_where_it_stands_quotes_the_files_it_cites():
    """Each row of the status table: the figures of the file it cites."""
    rows = {line.split("|")[1].strip(): line for line in _standing().splitlines()}
    fp32 = _tunes("tunes-4096-fp32-8192-")
    big = _tunes("tunes-4096-fp32-8192-", "8192x8192x8192")
    assert f"{fp32['fp32']['ratio']:.2f}x at 4096^3, {big['fp32']['ratio']:.2f}x at 8192^3" \
        in rows["strict fp32, a fresh default tune"]
    t3 = [_tunes("tune-3xtf32-default-", shape)["3xtf32"]
          for shape in ("4096x4096x4096", "8192x8192x8192", "8192x8192x1024")]
    assert f"| {t3[0]['ratio']:.2f}x ({t3[0]['wall_s']:.0f} s), {t3[1]['ratio']:.2f}x" \
        f" (missed), {t3[2]['ratio']:.2f}x," in rows[
        "3xTF32 (fp32's accuracy on tensor cores), a fresh tune at 4096^3, 8192^3, "
        "8192x8192x1024"]
    decode = _cited("decode-roof-library-[0-9a-f]{7}-")["rows"]
    line = rows["decode shapes through the library, fp16 and bf16, the weights read from DRAM, "
                "back to back"]
    roofs = {s: _span([r["roof"] for r in decode if r["shape"] == [s, 4096, 4096]], ".0%", "")
             for s in (1, 16)}
    assert _span([r["ratio"] for r in decode]) + f"; 1x4096x4096 at {roofs[1]}, " \
        f"16x4096x4096 at {roofs[16]}" in line
    assert {r["kernel"] for r in decode} <= {"library", "library static_b"}
    depth = _cited("decode-depth-f16-bf16-")["rows"]
    best = {s: _span([max(c["roof"] for c in r["candidates"].values()) for r in depth
                      if r["shape"] == [s, 4096, 4096]], ".0%", "") for s in (1, 16)}
    assert f"the best kernels reach {best[1]} and {best[16]}" in line
    lib = _cited("library-vs-cublas-[0-9a-f]{7}-")["summary"]  # the latest run, cited first
    row = rows[f"the library end to end, {lib['shapes']} shapes through `lib.gemm`"]
    assert f"geometric mean {lib['geomean']:.2f}x torch.matmul, none below 0.95x" in row \
        and not lib["below_095"]


def _cited(prefix: str) -> dict:
    name = re.search(rf"bench/results/({prefix}[\w-]*\.json(?:\.gz)?)", README).group(1)
    data = (ROOT / "bench" / "results" / name).read_bytes()
    return json.loads(gzip.decompress(data) if name.endswith(".gz") else data)


def _span(xs, fmt=".2f", unit="x") -> str:
    return f"{min(xs):{fmt}}{unit}-{max(xs):{fmt}}{unit}"


def test_the_wgmma_figures_are_those_of_the_files_cited():
    text = " ".join(README.split())
    rows = _cited("wgmma-vs-cublas-[0-9a-f]{7}-h[12]00")["rows"]
    at = {(r["dtype"], *r["shape"]): r for r in rows}
    assert len(rows) == 10 and {r["peer"].split()[0] for r in rows} == {"torch.matmul"}
    assert f"runs fp16 and bf16 at {_span([r['ratio'] for r in rows])} of torch.matmul " \
        "over issue 23's ten rows" in text
    assert all(r["tflops"] > r["triton_tflops"] for r in rows)
    assert f"(Triton {_span([r['triton_ratio'] for r in rows])} of torch.matmul)" in text
    r = at["f16", 4096, 4096, 4096]
    assert f"4096^3 fp16 {r['tflops']:.0f} against {r['peer_tflops']:.0f} TFLOP/s" in text
    tf32 = _cited("wgmma-vs-cublas-tf32")["rows"]
    assert f"reaches {_span([r['ratio'] for r in tf32])} cuBLAS TF32" in text
    at = {tuple(r["shape"]): r for r in tf32}
    for shape, said in (((4096, 4096, 4096), "4096^3"), ((8192, 8192, 8192), "8192^3")):
        r = at[shape]
        assert f"{r['tflops']:.0f} against {r['peer_tflops']:.0f} TFLOP/s at {said} " \
            f"({r['ratio']:.2f}x)" in text, said
    wmma = [r for r in _cited("layouts-epilogues")["rows"] if r["part"] == "layouts"
            and r["family"] == "wmma" and r["layout"] == "nn"]
    assert f"WMMA family's default kernels reach {_span([r['ratio'] for r in wmma])} of " \
        "torch.matmul" in text


def test_the_3xtf32_figures_are_those_of_the_file_cited():
    text = " ".join(README.split())
    doc = _cited("tf32x3-accuracy")
    acc = {a["distribution"]: a["methods"] for a in doc["accuracy"]}
    for dist, words in (("normal", "normal"), ("uniform_pm1_k16384", "K=16384")):
        t3, sg = acc[dist]["wgmma_3xtf32"]["rel_fro"], acc[dist]["cublas_sgemm"]["rel_fro"]
        pre = acc[dist]["wgmma_3xtf32_presplit"]["rel_fro"]
        assert t3 <= sg and pre <= sg
        assert f"{words} {t3:.1e} against {sg:.1e}".replace("e-0", "e-") in text
        assert f"{words} {pre:.1e}".replace("e-0", "e-") in text
    speed = doc["speed"]
    for method, ratio, said in (("wgmma_3xtf32", "t3_vs_sgemm", "in-loop ran"),
                                ("wgmma_3xtf32_presplit", "presplit_vs_sgemm", "pre-split")):
        tflops = [s["methods"][method]["tflops"] for s in speed]
        assert f"{said} {_span(tflops, '.1f', '')} TFLOP/s " \
            f"({_span([s[ratio] for s in speed])} cuBLAS SGEMM)" in text


def test_the_record_and_tune_figures_are_those_of_the_file_cited():
    text = " ".join(README.split())
    doc = _cited("record-and-tune")
    assert f"were tuned in {doc['tune_seconds']:.0f} s" in text
    for r in doc["tune"]:
        if r["problem"].startswith(("16x4096x1024 f32 nn", "16x1024x4096 f32 nn")):
            assert f"{r['problem'].split()[0]} at {r['ratio']:.2f}x" in text


def test_the_fp32_suite_exhaustive_and_pipeline_figures_are_those_of_the_files_cited():
    text = " ".join(README.split())
    suite = _cited("suite-[0-9a-f]{7}-h200")
    rows = {r["shape"]: r for r in suite["rows"]}
    ratios = {shape: r["ratio"] for shape, r in rows.items()}
    low, high = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    assert f"Over all {len(rows)} shapes of the suite the kernels of the committed library's " \
        f"exact entries run at a geometric mean of {suite['geomean_ratio']:.3f}x cuBLAS, from " \
        f"{ratios[low]:.2f}x ({low}) to {ratios[high]:.2f}x ({high})" in text
    for shape, words in (("16x4096x4096", "16x4096x4096 ran"), ("1024x1024x1024", "1024^3")):
        r = rows[shape]
        assert f"{words} {r['tflops']:.1f} TFLOP/s against cuBLAS's {r['cublas_tflops']:.1f} " \
            f"({r['ratio']:.1f}x)" in text or f"{words} {r['tflops']:.1f} against " \
            f"{r['cublas_tflops']:.1f} ({r['ratio']:.2f}x)" in text, shape
    ex = _cited("search-quality-exhaustive-h200")["exhaustive"]
    assert f"over the {ex['valid']} valid configurations of the space before the swizzle " \
        f"({ex['seconds']:.0f} s, 2026-11-30) found {ex['best']['tflops']:.1f} TFLOP/s at best " \
        f"(`{ex['best']['kernel']}`" in text
    host = {r["m"]: r for r in _cited("host-overlap-[0-9a-f]{7}-h200")["rows"]}
    speedup = {m: f"{host[m]['speedup_vs_sequential']:.2f}x" for m in (8192, 12288, 16384)}
    assert f"16384^3 fp32 {speedup[16384]} faster than copy, compute, copy (12288^3: " \
        f"{speedup[12288]}, 8192^3: {speedup[8192]}; the staging and copies moved " \
        f"{host[16384]['copy_gb_per_s']:.1f} GB/s there, and the pipeline took " \
        f"{host[16384]['over_ideal']:.2f}x of max(copy, compute))" in text
    assert f"(4096^3: {host[4096]['copy_ms'] / host[4096]['compute_ms']:.0f}x)" in text


def test_the_main_loop_figures_are_those_of_the_file_cited():
    cited = re.search(r"bench/results/(mainloop-4096-[\w-]+\.json)", README).group(1)
    rows = {r["kernel"]: r for r in
            json.loads((ROOT / "bench" / "results" / cited).read_text())["rows"]}
    plain = rows["gemm_simt_f32_128x128x8_r8x8_w16x2_p0_v4_s2_g1_sw"]
    paired = rows["gemm_simt_f32_128x128x8_r8x8_w16x2_p0_v4_s2_g1_sw_i2"]
    wide = rows["gemm_simt_f32_128x128x8_r8x16_w8x4_p0_v4_s2_g1_sw_i2"]
    text = " ".join(README.split())
    assert f"ran {paired['tflops']:.1f} and {wide['tflops']:.1f} TFLOP/s at 4096^3 " \
        f"({min(paired['ratio'], wide['ratio']):.2f}x cuBLAS) where the plain loop ran " \
        f"{plain['tflops']:.1f} ({plain['ratio']:.2f}x)" in text


def test_the_m_sweep_figures_are_those_of_the_file_cited():
    doc = _cited("library-vs-cublas-m-sweep-(?:[0-9a-f]{7}-)?h200")
    s, rows = doc["summary"], doc["rows"]
    skinny = [r["ratio"] for r in rows if r["m"] <= 64]
    text = " ".join(README.split())
    assert f"a geometric mean of {s['geomean']:.2f}x torch.matmul, every M up to 64 at " \
        f"{_span(skinny)}" in text
    low = [r["ratio"] for r in rows if r["ratio"] < 0.95]
    if not low:
        assert f"none below 0.95x (the lowest {s['min_ratio']:.2f}x)" in text
        return
    assert f"below 0.95x at M = {', '.join(map(str, s['below_095'][:-1]))} and " \
        f"{s['below_095'][-1]} ({_span(low)})" in text


def test_the_decoder_layer_figures_are_those_of_the_file_cited():
    cited = re.search(r"bench/results/(model-gemms-(?:[0-9a-f]{7}-)?h200-[\w-]+\.json)",
                      README).group(1)
    doc = json.loads((ROOT / "bench" / "results" / cited).read_text())
    ratios = [r["ratio"] for r in doc["gemms"]]
    forwards = [r["ratio"] for r in doc["layers"]]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    text = " ".join(README.split())
    assert f"Its {len(ratios)} GEMMs against F.linear plus the activation: a geometric " \
        f"mean of {geo:.3f}x (bar 1.05x), {min(ratios):.2f}x-{max(ratios):.2f}x, " \
        f"{sum(r < 0.95 for r in ratios)} below 0.95x" in text
    tune = doc["tune"]
    if tune.get("skipped"):  # a timing-only run (--skip-tune): the README names its tune's file
        tune_file = re.search(r"bench/results/(model-gemms-[0-9a-f]{7}-tune-[\w-]+\.json)",
                              README).group(1)
        tune = json.loads((ROOT / "bench" / "results" / tune_file).read_text())
    assert f"tuned in {tune['seconds']:.1f} s" in text
    assert f"forwards at {min(forwards):.2f}x-{max(forwards):.2f}x" in text
    assert doc["commit"] in text and doc["bars"]["outputs_within_gate"]["met"]


def test_the_gpu_suite_figures_are_those_of_the_logs_cited():
    """The whole suite's paragraph: the logs it cites (one run may span calls of the GPU
    machine), each log's own count and their sum, at the commit it names."""
    text = " ".join(README.split())
    para = text[text.index("The latest whole GPU suite, at "):]
    para = para[:para.index("## ")]
    commit = re.match(r"The latest whole GPU suite, at ([0-9a-f]{7}) ", para).group(1)
    logs = re.findall(r"bench/results/(gpu-tests-[\w-]*?" + commit + r"-h[12]00-[\w-]+\.log)",
                      para)
    assert logs
    total = {"passed": 0, "failed": 0}
    for name in dict.fromkeys(logs):
        last = (ROOT / "bench" / "results" / name).read_text().strip().splitlines()[-1]
        assert re.search(r"\d+ passed", last), name  # complete: pytest's summary
        for w in total:
            found = re.search(rf"(\d+) {w}", last)
            total[w] += int(found.group(1)) if found else 0
        seconds = float(re.search(r" in ([\d.]+)s", last).group(1))
        assert f"{name}`, " in para
        passed = re.search(r"(\d+) passed", last).group(1)
        assert f"{passed} passed in {seconds:.0f} s" in para
    said = "none failed" if not total["failed"] else f"{total['failed']} failed"
    assert f"{total['passed']} passed, {said}" in para


def test_the_storage_figures_are_those_of_the_file_cited():
    rows = {r["storage"]: r for r in _cited("storage-overhead-gpu-")["rows"]}
    text = " ".join(README.split())
    cpu = {r["storage"]: r["ratio_to_memory"] for r in _cited("storage-overhead-cpu-")["rows"]}
    assert f"took {cpu['sqlite']:.2f}x on SQLite, {cpu['journal']:.2f}x on a journal file and " \
        f"{cpu['postgresql']:.2f}x on PostgreSQL 15" in text
    assert f"took {rows['sqlite']['ratio_to_memory']:.2f}x its in-memory time on SQLite, " \
        f"{rows['journal']['ratio_to_memory']:.2f}x on a journal file and " \
        f"{rows['postgresql']['ratio_to_memory']:.2f}x on a local PostgreSQL" in text


def test_the_search_replay_figures_are_those_of_the_files_cited():
    """The trials to within 2% of each wgmma grid's best, with and without the model."""
    text = " ".join(README.split())
    for dtype, runs in (("f16", "10"), ("f32x3", "5")):
        rec = _cited(f"simulate-search-tpe-{dtype}-wgmma-cpu")["shapes"][0]
        with_, without = rec["with_model"], rec["without_model"]
        assert with_["reached"] == f"{runs}/{runs}" and set(with_["each"]) == {3}
        assert "was the 3rd compiled in all 10 fp16 runs" in text
        got = sorted(x for x in without["each"] if x is not None)
        assert f"a median of {without['median_compiled']:g} compiled ({got[0]} to {got[-1]}" \
            in text or f"a median of {without['median_compiled']:g} ({got[0]} to {got[-1]};" \
            in text
    rank = {r["study"].split("-exhaustive-")[1].split("-h200")[0]: r
            for r in _cited("model-rank-f16-f32x3-cpu")["rho"] if "exhaustive" in r["study"]}
    assert f"Spearman correlation of {rank['f16-wgmma']['rho']:.2f} (fp16) and " \
        f"{rank['f32x3-wgmma']['rho']:.2f} (3xTF32)" in text
    # the decode family's streaming model: its fit over the grids, and the replays with it
    # and with the tiled terms it replaced
    fit = [r for r in _cited("model-rank-calibrate-stream-cpu")["rho"] if r["exhaustive"]]
    rhos, tops = [r["rho"] for r in fit], [r["top_ratio"] for r in fit]
    assert "nine whole decode grids" in text and len(fit) == 9
    assert f"rank correlation {min(rhos):.2f}-{max(rhos):.2f} per grid" in text
    assert f"predicted at {min(tops):.2f}x-{max(tops):.2f}x its time" in text

    def replay(prefix):
        shapes = _cited(prefix)["shapes"]
        runs = [r for s in shapes for r in s["runs"] if r["model"]]
        hit = [s["with_model"]["median_compiled"] for s in shapes
               if s["with_model"]["median_compiled"] <= s["budget"]]
        return sum(r["compiled_to_2pct"] is not None for r in runs), len(runs), hit

    got, n, hit = replay("simulate-search-tpe-decode-cpu")
    got_t, n_t, hit_t = replay("simulate-search-tpe-decode-tiled-model-cpu")
    assert n == n_t == 45
    assert f"within 2% of the best in {got} of {n} runs with it and {got_t} with the tiled " \
        f"terms, after a median of {min(hit):g}-{max(hit):g} compiled candidates where it got " \
        f"there (the tiled terms: {min(hit_t):g}-{max(hit_t):g})" in text
