"""bench/model_gemms.py (issue 22's benchmark): the GEMMs the two layers' definitions give
per token count, the record file they make for the tuner, the bars, the plot, the
command line's errors (no torch needed); the layers themselves and the timing steps on
the CPU with stand-ins for the library and the timer (torch needed); end to end on a
GPU (marked gpu)."""

import dataclasses
import json
import math
import shutil
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402
import model_gemms as mg  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.fast
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

# (name, N, K, epilogue) of each GEMM, in call order: M is the token count
LLAMA = [("q_proj", 4096, 4096, "none"), ("kv_proj", 2048, 4096, "none"),
         ("o_proj", 4096, 4096, "none"), ("gate", 14336, 4096, "silu"),
         ("up", 14336, 4096, "none"), ("down", 4096, 14336, "none")]
GPT2 = [("c_attn", 3072, 1024, "bias"), ("c_proj", 1024, 1024, "bias"),
        ("c_fc", 4096, 1024, "bias+gelu_tanh"), ("mlp_proj", 1024, 4096, "bias")]


@pytest.mark.parametrize("tokens", [1, 16, 128, 2048, 8192])
@pytest.mark.parametrize("layer, dtype, want", [("llama", "bf16", LLAMA), ("gpt2", "f16", GPT2)])
def test_each_layer_gives_its_gemms_at_each_token_count(layer, dtype, want, tokens):
    got = mg.problems(mg.LAYERS[layer], tokens)
    assert [(p["name"], p["m"], p["n"], p["k"], p["epilogue"]) for p in got] == \
        [(name, tokens, n, k, epi) for name, n, k, epi in want]
    for p in got:  # every one: NT (W as nn.Linear keeps it), C of the input type, no batch
        assert (p["dtype"], p["layout"], p["out"], p["batch"]) == (dtype, "nt", dtype, 1)
        assert p["bias"] == ("out" if layer == "gpt2" else "none")


def test_the_defaults_are_the_issues():
    args = mg.parse_args([])
    assert args.tokens == [1, 16, 128, 2048, 8192]
    assert [s.name for s in args.layers] == ["llama", "gpt2"]
    assert args.budget == 480 and not args.skip_tune and not args.no_compile
    llama, gpt2 = mg.LAYERS["llama"], mg.LAYERS["gpt2"]
    assert (llama.hidden, llama.heads, llama.kv_heads, llama.head_dim, llama.ffn) == \
        (4096, 32, 8, 128, 14336)
    assert (gpt2.hidden, gpt2.heads, gpt2.head_dim, gpt2.ffn) == (1024, 16, 64, 4096)


def test_the_expected_record_is_what_the_tuner_reads():
    """One forward per layer and token count: 45 distinct problems (q_proj and o_proj are
    one problem, called twice), every one a problem some family can tune."""
    from tuner.problems import merge

    plan = merge(mg.expected_lines(mg.LAYERS.values(), mg.TOKENS))
    labels = {p.label: p.calls for p in plan}
    assert len(plan) == 5 * (5 + 4) == 45
    assert labels["8192x4096x4096 bf16 nt C bf16"] == 2  # q_proj and o_proj
    assert labels["8192x14336x4096 bf16 nt C bf16 silu"] == 1
    assert labels["1x4096x1024 f16 nt C f16 bias+gelu_tanh"] == 1
    assert all(c == 1 for lab, c in labels.items() if "x4096x4096 bf16" not in lab)
    assert [p.why_not() for p in plan] == [None] * 45
    assert plan[0].label.startswith("8192x") and plan[-1].label.startswith("1x")


def test_recorded_against_expected_names_each_difference():
    want = mg.expected_lines([mg.LAYERS["gpt2"]], [16])
    got = [json.loads(x) for x in want[1:]]  # c_attn had an exact entry: not recorded
    got[0]["calls"] = 3  # c_proj called thrice
    got.append(dict(got[1], m=17))  # and one the layers do not make
    res = mg.recorded_vs_expected([json.dumps(x) for x in got], want)
    assert res == dict(expected=4, recorded=4, missing=["16x3072x1024 f16 nt C f16 bias"],
                       unexpected=["17x4096x1024 f16 nt C f16 bias+gelu_tanh"],
                       calls_differ=["16x1024x1024 f16 nt C f16 bias"])
    assert mg.recorded_vs_expected(want, want)["missing"] == []


def test_the_tune_budget_is_shared_and_ends_within_15_minutes():
    from tuner.tune import MIN_SHARE_S

    # the tuner shares --budget; the last problem starts before it is spent and runs to
    # its share, at least MIN_SHARE_S, then the confirmation against cuBLAS
    assert mg.BUDGET_S + MIN_SHARE_S + 60 < mg.TUNE_BAR_S
    assert "480 s" in mg.__doc__ and "15" in mg.__doc__ and f"{MIN_SHARE_S:g} s" in mg.__doc__


def test_the_gemm_gate_is_the_tuners_plus_one_rounding():
    assert mg.gemm_gate(mg.DType.BF16, 4096) == pytest.approx(2e-5 + 2.0 ** -8)
    assert mg.gemm_gate(mg.DType.F16, 14336) == pytest.approx(2e-5 * 3.5 + 2.0 ** -11)


def _gemm(layer, tokens, name, ratio, compile_ratio=1.0, ok=True):
    return dict(layer=layer, tokens=tokens, name=name, ratio=ratio,
                ratio_compile=compile_ratio, within_gate=ok, error=1e-3, gate=4e-3)


def _fwd(layer, tokens, ratio, ok=True):
    return dict(layer=layer, tokens=tokens, ratio=ratio, within_gate=ok, error=1e-3,
                gate=2e-3)


def test_the_bars_pass_when_every_figure_does():
    gemms = [_gemm("llama", 16, "q_proj", 1.0), _gemm("llama", 16, "up", 1.21)]
    out = mg.bars(gemms, [_fwd("llama", 16, 1.0)], dict(seconds=600.0))
    assert out["gemm_geomean_vs_torch"]["value"] == pytest.approx(1.1)
    assert out["every_gemm_vs_torch"]["worst"] == dict(layer="llama", tokens=16,
                                                       name="q_proj", ratio=1.0)
    assert out["all_met"] and out["tune_within_15_min"]["met"]
    assert out["gemm_geomean_vs_compile"] == pytest.approx(1.0)


@pytest.mark.parametrize("change, failed", [
    (dict(gemm=0.94), ["every_gemm_vs_torch"]),  # the geomean still 1.105
    (dict(gemm=None), ["every_gemm_vs_torch", "gemm_geomean_vs_torch"]),  # a missing figure
    (dict(geo=0.99), ["gemm_geomean_vs_torch"]),  # 1.044, each at least 0.95
    (dict(fwd=0.99), ["forward_vs_unpatched"]),
    (dict(gemm_ok=False), ["outputs_within_gate"]),
    (dict(fwd_ok=False), ["outputs_within_gate"]),
    (dict(tune_s=901.0), ["tune_within_15_min"]),
])
def test_each_bar_fails_on_its_own(change, failed):
    gemms = [_gemm("gpt2", 1, "c_fc", change.get("gemm", 1.1), ok=change.get("gemm_ok", True)),
             _gemm("gpt2", 8192, "c_attn", change.get("geo", 1.3))]
    fwds = [_fwd("gpt2", 1, change.get("fwd", 1.02), change.get("fwd_ok", True))]
    out = mg.bars(gemms, fwds, dict(seconds=change.get("tune_s", 100.0)))
    assert [k for k, v in out.items() if isinstance(v, dict) and not v["met"]] == failed
    assert not out["all_met"]
    if failed == ["outputs_within_gate"]:
        assert len(out["outputs_within_gate"]["failures"]) == 1


def test_a_tune_in_parts_counts_every_part(tmp_path, capsys):
    """--prior-tune: the first part's seconds join this run's for the tune's bar; a file
    that is not a tune JSON is a one-line error."""
    lib = tmp_path / "library"
    lib.mkdir()
    (lib / "manifest.json").write_text("{}")
    part1 = tmp_path / "model-gemms-tune-part1.json"
    part1.write_text(json.dumps(dict(seconds=490.0, commit="915921b", date="2026-12-04")))
    args = mg.parse_args(["--library", str(lib), "--prior-tune", str(part1)])
    assert args.prior_tune["seconds"] == 490.0 and args.prior_tune["file"] == part1.name
    tune = dict(seconds=306.8, total_seconds=796.8)
    assert mg.bars([], [], tune)["tune_within_15_min"] == dict(bar_s=900.0, seconds=796.8,
                                                                met=True)
    assert not mg.bars([], [], dict(seconds=306.8, total_seconds=901.0))[
        "tune_within_15_min"]["met"]
    part1.write_text("[1, 2]")
    with pytest.raises(SystemExit) as stop:
        mg.main(["--library", str(lib), "--prior-tune", str(part1)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "not a tune JSON" in err


def test_no_rows_meet_no_bar():
    out = mg.bars([], [])
    assert not out["all_met"] and "tune_within_15_min" not in out


def _doc():
    gemms = [dict(_gemm("llama", t, n, r, c), ms=0.1) for t, n, r, c in
             [(16, "gate", 1.2, 0.9), (1, "gate", 0.97, 1.1), (1, "up", 1.0, None)]]
    return dict(gpu="NVIDIA H200", date="2026-12-02T10:00:00+00:00", commit="abc1234",
                gemms=gemms + [dict(_gemm("gpt2", 1, "c_fc", 2.0), ms=0.1)],
                layers=[_fwd("llama", 16, 1.1), _fwd("llama", 1, 0.98), _fwd("gpt2", 1, 1.0)])


def test_the_plot_draws_each_gemm_and_the_forward_against_tokens(tmp_path):
    s = mg.series(_doc(), "llama")
    assert s == {"x torch": {"gate": [(1, 0.97), (16, 1.2)], "up": [(1, 1.0)],
                             "forward": [(1, 0.98), (16, 1.1)]},
                 "x compile": {"gate": [(1, 1.1), (16, 0.9)], "up": [(1, None)]}}
    png = mg.plot(_doc(), "llama", tmp_path / "llama.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_gpu_paced_figures_get_a_panel_of_their_own(tmp_path):
    doc = _doc()
    for r, g in zip(doc["gemms"], (1.3, 0.99, 1.02, 1.5)):
        r["gpu_ratio"] = g
    for r, g in zip(doc["layers"], (1.01, 0.97)):
        r["gpu_ratio"] = g
    s = mg.series(doc, "llama")
    assert s[mg.GPU_PACED] == {"gate": [(1, 0.99), (16, 1.3)], "up": [(1, 1.02)],
                               "forward": [(1, 0.97), (16, 1.01)]}
    assert list(s) == ["x torch", "x compile", mg.GPU_PACED]
    data = mg.plot(doc, "llama", tmp_path / "llama.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_png_is_named_after_the_json_and_layer():
    p = Path("/r/model-gemms-h200-2026-12-02.json")
    assert mg._png(p, "gpt2") == Path("/r/model-gemms-gpt2-h200-2026-12-02.png")


@pytest.mark.parametrize("argv, says", [
    (["--tokens", "0,16"], "token counts must be at least 1"),
    (["--tokens", "1,x"], "not a comma-separated list"),
    (["--layers", "llama,bert"], "unknown layer 'bert'"),
    (["--budget", "0"], "not a positive number"),
    (["--budget", "soon"], "not a positive number"),
    (["--compile-limit", "-5"], "not a positive number"),
    (["--rounds", "0"], "not a positive whole number"),
    (["--skip-tune", "--tune-only"], "not allowed with"),
    (["--library", "/nonexistent/lib"], "no library there"),
    (["--frobnicate"], "unrecognized arguments"),
    (["--prior-tune", "part1.json"], "needs --library"),
])
def test_argument_errors_are_one_line_and_status_2(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        mg.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and err.startswith("model_gemms.py: error: ") and says in err


@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="has a GPU")
def test_without_a_gpu_it_says_so_in_one_line(capsys):
    assert mg.main(["--skip-tune", "--no-compile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs torch and a CUDA GPU" in err


def test_interleaved_times_each_function_once_a_round_in_turn():
    """Each function once a round, the order rotating by a place each round (none always
    first), the figures kept in round order."""
    calls = []
    ms = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 5.0, 4.0])}

    def timer(fn):
        calls.append(fn())
        return [next(ms[calls[-1]]), 99.0, -99.0]  # a median of three: the middle one

    out = _common.interleaved(timer, {"a": lambda: "a", "b": lambda: "b"}, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out == {"a": (2.0, [3.0, 1.0, 2.0]), "b": (5.0, [5.0, 5.0, 4.0])}
    # a pair timed together (timer.pair), the others alone, in the same rounds
    pairs = []
    ms = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 5.0, 4.0]), "c": iter([7.0] * 3)}
    timer.pair = lambda fa, fb: pairs.append((fa(), fb())) or (timer(fa), timer(fb))
    calls.clear()
    out = _common.interleaved(timer, {"c": lambda: "c", "a": lambda: "a", "b": lambda: "b"},
                              3, paired=[("a", "b")])
    assert pairs == [("a", "b")] * 3
    assert calls == ["c", "a", "b", "a", "b", "c", "c", "a", "b"]  # a pair is timed as one
    assert out == {"a": (2.0, [3.0, 1.0, 2.0]), "b": (5.0, [5.0, 5.0, 4.0]),
                   "c": (7.0, [7.0] * 3)}
    assert _common.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert _common.geomean([]) is None


def test_interleaved_times_a_gemms_functions_together_each_first_of_them_once():
    """Functions named GROUP/WHO run one after another; the groups rotate a place a round
    and so do the members within a group: over three rounds each of a group of three is
    first of its group once, and no group is always first."""
    calls = []

    def timer(fn):
        calls.append(fn())
        return [1.0]

    names = ["q/ours", "q/torch", "q/gpu", "k/ours", "k/torch", "forward"]
    _common.interleaved(timer, {n: (lambda n=n: n) for n in names}, 3)
    rounds = [calls[i:i + 6] for i in (0, 6, 12)]
    assert rounds[0] == names
    assert rounds[1] == ["k/torch", "k/ours", "forward", "q/torch", "q/gpu", "q/ours"]
    assert rounds[2] == ["forward", "q/gpu", "q/ours", "q/torch", "k/ours", "k/torch"]
    for group in ("q/", "k/"):
        spans = [[i for i, c in enumerate(r) if c.startswith(group)] for r in rounds]
        assert all(s == list(range(s[0], s[0] + len(s))) for s in spans)  # together
    firsts = {[c for c in r if c.startswith("q/")][0] for r in rounds}
    assert firsts == {"q/ours", "q/torch", "q/gpu"}
    assert len({r[0] for r in rounds}) == 3


# ---- the layers in torch (CPU) ----------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("layer, fused", [("llama", ["mlp.gate.1"]), ("gpt2", ["mlp.c_fc.1"])])
def test_the_layers_hold_their_linears_and_patch_fuses_the_activation(layer, fused, tmp_path):
    """Built on the meta device (no memory): each linear as the spec says; patch absorbs
    exactly the activation applied to one linear's output (llama's gate, gpt2's c_fc)."""
    from tuner.runtime import torch_ops

    spec = mg.LAYERS[layer]
    model = mg.build_layer(spec, "meta")
    mods = mg.linear_modules(model, spec)
    assert [(lin.name, tuple(m.weight.shape), m.bias is not None) for lin, m in mods] == \
        [(lin.name, (lin.fout, lin.fin), lin.bias) for lin in spec.linears()]
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == len(mods)
    assert all(m.weight.dtype == mg._tdt(spec.dtype) for _, m in mods)
    assert mg.fused_activations(model) == []
    torch_ops.patch(model, types.SimpleNamespace(path=tmp_path))
    assert mg.fused_activations(model) == fused


def _small(name):
    """The layer's style at a size the CPU runs in a blink."""
    return dataclasses.replace(mg.LAYERS[name], hidden=128, heads=4,
                               kv_heads=2 if name == "llama" else 4, head_dim=32, ffn=256)


@needs_torch
@pytest.mark.parametrize("layer", ["llama", "gpt2"])
def test_a_layer_is_causal_and_patched_on_the_cpu_runs_torchs_own(layer, tmp_path):
    from tuner.runtime import torch_ops

    torch.manual_seed(0)
    model = mg.build_layer(_small(layer), "cpu", torch.float64)
    x = torch.randn(1, 6, 128, dtype=torch.float64)
    y = model(x)
    x2 = x.clone()
    x2[0, 4] += 1.0
    y2 = model(x2)
    assert y.shape == x.shape and bool(torch.isfinite(y).all())
    assert torch.equal(y[0, :4], y2[0, :4])  # earlier tokens do not see later ones
    assert not torch.allclose(y[0, 4:], y2[0, 4:])
    torch_ops.patch(model, types.SimpleNamespace(path=tmp_path))
    assert torch.equal(model(x), y)  # CPU input: F.linear and the activation, as before


def _cpu_linear(drop_act=False):
    def linear(x, w, b, act, library):
        y = torch.nn.functional.linear(x, w, b)
        if drop_act or act is None:
            return y
        return {"silu": torch.nn.functional.silu,
                "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[act](y)
    return linear


def _cpu_session(tmp_path, linear, tokens="1,5", gpu_paced=False):
    from tuner.runtime import torch_ops

    args = mg.parse_args(["--no-compile", "--rounds", "2", "--tokens", tokens])
    args.layers = [_small("llama"), _small("gpt2")]
    ops = types.SimpleNamespace(linear=linear, patch=torch_ops.patch,
                                library_key=lambda lib: getattr(lib, "key", "cpu"))
    timer = {"n": 0}

    def fake_timer(fn):
        fn()
        timer["n"] += 1
        return [1.0]
    fake_timer.pair = lambda fa, fb: (fake_timer(fa), fake_timer(fb))
    lib = types.SimpleNamespace(path=tmp_path / "lib", plans={})
    lib_gpu = types.SimpleNamespace(path=tmp_path / "lib", plans={}, key="cpu gpu") \
        if gpu_paced else None
    return mg.Session(lib, args, ops=ops, timer=fake_timer, device="cpu",
                      lib_gpu=lib_gpu), timer


@needs_torch
def test_the_timing_steps_run_on_the_cpu_and_write_rows_bars_and_plots(tmp_path):
    """Step 3 with stand-ins (CPU; ours computed by torch, a timer that counts): a row per
    GEMM and per forward with its checks, the JSON and a PNG per layer."""
    session, timer = _cpu_session(tmp_path, _cpu_linear())
    doc = dict(gpu="CPU test", date="2026-12-02T00:00:00+00:00", commit="test", tune=None)
    path = mg.run_all(session, doc, tmp_path / "out")
    saved = json.loads(path.read_text())
    assert path.name == "model-gemms-cpu-test-2026-12-02.json"
    assert [(r["layer"], r["tokens"], r["name"]) for r in saved["gemms"]] == [
        (layer, t, lin.name) for layer in ("llama", "gpt2") for t in (1, 5)
        for lin in _small(layer).linears()]
    assert len(saved["layers"]) == 4
    # two rounds of (two per GEMM, two forwards) per layer and token count
    assert timer["n"] == 2 * 2 * ((6 * 2 + 2) + (4 * 2 + 2))
    for r in saved["gemms"]:
        assert r["within_gate"] and r["error"] <= r["gate"] and r["torch_error"] <= r["gate"]
        assert r["ratio"] == 1.0 and r["rounds_ms"] == [1.0, 1.0] and "compile_ms" not in r
        assert r["runs"] is None and "no plan" in r["reason"]
    for r in saved["layers"]:
        assert r["within_gate"] and r["error"] == r["unpatched_error"] > 0
        assert r["difference"] == 0.0 and r["ratio"] == 1.0
    assert saved["bars"]["outputs_within_gate"]["met"]
    assert saved["bars"]["gemm_geomean_vs_torch"]["value"] == pytest.approx(1.0)
    for layer in ("llama", "gpt2"):
        assert mg._png(path, layer).stat().st_size > 10_000


@needs_torch
def test_each_gemm_and_forward_is_also_timed_through_the_gpu_paced_library(tmp_path):
    """With the library loaded a second time with pace="gpu", every GEMM is called and
    checked through that one's name too, timed beside the others (one more function a
    round), its ratio in gpu_ratio and summed up outside the bars; and a layer patched
    with it is checked and timed against the unpatched one (one more pair a round)."""
    calls = []

    def linear(x, w, b, act, library):
        calls.append(library)
        return _cpu_linear()(x, w, b, act, library)

    session, timer = _cpu_session(tmp_path, linear, tokens="5", gpu_paced=True)
    rows, fwd = session.run(_small("gpt2"), 5)
    assert {"cpu", "cpu gpu"} <= set(calls)
    assert timer["n"] == 2 * (4 * 3 + 4)  # two rounds of three per GEMM and four forwards
    for r in rows:
        assert r["gpu_ratio"] == 1.0 and r["gpu_rounds_ms"] == [1.0, 1.0]
        assert r["gpu_error"] <= r["gate"] and r["within_gate"] and r["gpu_runs"] is None
    assert fwd["gpu_ratio"] == 1.0 and fwd["gpu_rounds_ms"] == [1.0, 1.0]
    assert fwd["gpu_error"] == fwd["error"] and fwd["within_gate"]
    b = mg.bars(rows, [fwd])
    assert b["gpu_paced_gemms"]["geomean"] == pytest.approx(1.0)
    assert b["gpu_paced_gemms"]["below_bar"] == 0 and b["all_met"] is not None
    assert b["gpu_paced_forwards"] == dict(worst=dict(layer="gpt2", tokens=5, gpu_ratio=1.0),
                                           below_bar=0)


@needs_torch
def test_a_gemm_that_drops_its_activation_fails_its_gate(tmp_path):
    session, _ = _cpu_session(tmp_path, _cpu_linear(drop_act=True), tokens="5")
    rows, fwd = session.run(_small("gpt2"), 5)
    assert {r["name"]: r["within_gate"] for r in rows} == dict(
        c_attn=True, c_proj=True, c_fc=False, mlp_proj=True)
    assert not mg.bars(rows, [fwd])["outputs_within_gate"]["met"]


@needs_torch
def test_a_gemm_that_never_writes_its_output_fails_its_gate(tmp_path):
    def unwritten(x, w, b, act, library):
        return torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)

    session, _ = _cpu_session(tmp_path, unwritten, tokens="1")
    rows, _ = session.run(_small("llama"), 1)
    assert all(r["error"] is None and not r["within_gate"] for r in rows)


@needs_torch
def test_the_route_is_read_from_the_librarys_plan(tmp_path):
    from codegen.families._common import Variant

    session, _ = _cpu_session(tmp_path, _cpu_linear())
    lin = _small("gpt2").linears()[2]  # c_fc: bias and GELU
    plan = types.SimpleNamespace(
        m=5, n=lin.fout, k=lin.fin,
        problem=types.SimpleNamespace(variant=Variant(mg.Layout.NT, mg.DType.F16, "out",
                                                      "gelu_tanh")),
        choice=types.SimpleNamespace(kernel="gemm_wgmma_f16_x", rule="exact", reason="tuned"))
    other = types.SimpleNamespace(**dict(vars(plan), problem=types.SimpleNamespace(
        variant=Variant(mg.Layout.NT, mg.DType.F16, "out", "none"))))
    session.lib.plans.update(a=other, b=plan)
    assert session.route(session.lib, 5, lin, mg.DType.F16) == dict(
        runs="gemm_wgmma_f16_x", rule="exact", reason="tuned")
    assert session.route(session.lib, 6, lin, mg.DType.F16)["runs"] is None


@needs_torch
def test_a_compile_over_its_limit_is_a_note_not_a_crash(tmp_path):
    """The per-shape limit cuts torch.compile where it is (a SIGALRM): the row says so
    and the GEMM goes on without a compile figure."""
    session, _ = _cpu_session(tmp_path, _cpu_linear())
    session.args.compile_limit = 0.05
    lin = torch.nn.Linear(64, 32)
    row = {}
    with torch.inference_mode():
        assert session.compiled(mg.LinearAct(lin, "silu"), torch.randn(4, 64), row) is None
    assert row["compile_note"] == "over the --compile-limit of 0.05 s"
    assert 0 <= row["compile_s"] < 5


# ---- on the GPU --------------------------------------------------------------------------------
@pytest.fixture
def library_copy(tmp_path):
    dest = tmp_path / "library"
    shutil.copytree(ROOT / "artifacts" / "library", dest,
                    ignore=shutil.ignore_patterns("dispatch.json*"))
    return dest


@pytest.mark.gpu
def test_gpu_the_record_holds_what_the_layers_give(library_copy, tmp_path):
    """Every problem of the layers' forwards is recorded with its calls, but those that an
    exact entry of the library serves on this GPU (lib.record counts only the others: on
    the H100, the decode entries of 16x14336x4096 and 1x4096x4096 bf16 NT)."""
    from tuner._shape import epilogue_text
    from tuner.gpu import device
    from tuner.problems import merge

    record = tmp_path / "problems.jsonl"
    specs = [mg.LAYERS["gpt2"], mg.LAYERS["llama"]]
    mg.record_forwards(specs, [1, 16], library_copy, record)
    expected = mg.expected_lines(specs, [1, 16])
    res = mg.recorded_vs_expected(record.read_text().splitlines(), expected)
    entries = json.loads((library_copy / "manifest.json").read_text())["entries"]
    exact = {p.label for p in merge(json.dumps(dict(
        dtype=e["dtype"], layout=e["layout"], out=e["out"], m=e["m"], n=e["n"], k=e["k"],
        epilogue=epilogue_text(e["bias"], e["act"]), batch=e["batch"])) for e in entries
        if e["gpu"] == device().name)}
    served = sorted(exact & {p.label for p in merge(expected)})
    assert res["unexpected"] == [] and res["calls_differ"] == [] and res["missing"] == served
    assert res["recorded"] == 2 * (4 + 5) - len(served)


@pytest.mark.gpu
@pytest.mark.parametrize("compile_too", [False, True], ids=["eager", "max-autotune"])
def test_gpu_gpt2_rows_are_checked_timed_and_written(library_copy, tmp_path, compile_too):
    """The whole step 3 for gpt2 at 16 tokens on the committed library: every output
    within its gate against float64 (fresh random inputs), times and ratios, the fusion,
    the JSON and the plot; with max-autotune (minutes), its rows too."""
    out = tmp_path / "out"
    argv = ["--layers", "gpt2", "--tokens", "16", "--skip-tune", "--rounds", "2",
            "--library", str(library_copy), "--out", str(out)]
    assert mg.main(argv + ([] if compile_too else ["--no-compile"])) == 0
    path, = out.glob("model-gemms-*.json")
    doc = json.loads(path.read_text())
    assert [r["name"] for r in doc["gemms"]] == ["c_attn", "c_proj", "c_fc", "mlp_proj"]
    for r in doc["gemms"]:
        assert r["error"] <= r["gate"] and r["torch_error"] <= r["gate"], r
        assert r["ms"] > 0 and math.isclose(r["ratio"], r["torch_ms"] / r["ms"])
        assert r["runs"] is not None and r["rule"] in ("exact", "measured", "estimate", "cublas")
        if compile_too:
            assert ("compile_note" in r) != (r.get("compile_error") is not None), r
            assert "compile_note" in r or r["compile_error"] <= r["gate"]
    fwd, = doc["layers"]
    assert fwd["within_gate"] and fwd["fused"] == ["mlp.c_fc.1"] and fwd["ratio"] > 0
    assert (out / path.name.replace("model-gemms-", "model-gemms-gpt2-")).with_suffix(
        ".png").is_file()
