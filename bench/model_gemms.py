"""Two decoder layers' GEMMs recorded, tuned and served by the library, against torch
(issue 22), on the GPU.

    python bench/model_gemms.py [--tokens 1,16,128,2048,8192] [--layers llama,gpt2]
                                [--budget 480] [--library DIR] [--skip-tune | --tune-only]
                                [--no-compile] [--compile-limit 180] [--rounds 3] [--out DIR]

The layers (torch, random weights: nn.Linear's own initialisation, seed 0), each a
pre-norm residual block run on one sequence of T tokens; attention is
F.scaled_dot_product_attention (causal), untouched:
  llama  bf16: hidden 4096, 32 query heads and 8 KV heads of 128 (RoPE, grouped-query
         attention), RMSNorm, a SiLU-gated MLP of 14336, no biases. Linears: q_proj,
         kv_proj (K and V in one linear, 4096 -> 2048), o_proj, gate, up, down.
  gpt2   fp16, GPT-2 medium: hidden 1024, 16 heads of 64, LayerNorm, a GELU MLP of 4096
         (GELU's tanh form, as GPT-2's), biases. Linears: c_attn (Q, K and V in one),
         c_proj, c_fc, mlp_proj (GPT-2's mlp.c_proj).
Each linear is a GEMM of M = T, N = out, K = in, layout NT (W as nn.Linear keeps it), C of
the input type, with its bias and activation (`problems()` lists them per T).

Fusion: torch_ops.patch fuses an nn.Linear with the activation module right after it
inside an nn.Sequential, so the layers are written that way where an activation is
applied to one linear's output: gpt2's c_fc is nn.Sequential(nn.Linear, nn.GELU(tanh)),
llama's gate nn.Sequential(nn.Linear, nn.SiLU()), multiplied by up's output in the MLP's
forward (down(gate(x) * up(x))). The layer code knows nothing of gemm-tune; patch finds
both. (A gated MLP written as act_fn(gate_proj(x)) * up_proj(x), as Hugging Face's Llama
is, would run its SiLU unfused: patch sees no Sequential there.)

Steps:
1. record: a child process loads the library, patches the layers and runs one forward
   at each T under lib.record(FILE) (the problems with no exact entry), then compares
   them with what the layer definitions give ("recorded_vs_expected").
2. tune: gemm-tune tune --problems FILE --budget B, all token counts in one tune: B
   defaults to 480 s in all; costliest (recorded time) first, each problem with --trials
   40 and its share of what is left of B by its work (the tuner's own sharing, at least
   tuner.tune.MIN_SHARE_S = 20 s), so the long token counts go first and problems left
   when B is spent are skipped (cuBLAS serves them). A problem started before B runs to
   its share, so the tune ends within about B + 20 s + 40 s (the confirmation against
   cuBLAS): under 10 minutes at the default, within the issue's 15 (the JSON's bar
   "tune_within_15_min" checks the time measured; keep B at most about 800). It tunes into a fresh copy of the committed library,
   artifacts/model-gemms/library (tune artifacts and winners cache beside it, kept: a
   repeated run answers from that cache), or into --library DIR in place.
3. time: the library loaded afresh; per layer and T, every function below timed once
   per round, turn about, for --rounds rounds (bench/wgmma_vs_cublas.Timer: CUDA events,
   warm-up, the L2 flushed before each repetition; each figure the median of the
   rounds' medians):
   - each GEMM: ours, torch_ops.linear(x, W, b, act) (the bias and activation in the
     kernel's epilogue); torch, act(F.linear(x, W, b)); and torch.compile(mode=
     "max-autotune", dynamic=False) of that same module (with its CUDA graphs; x is
     marked a static address, so the graph runs on it in place instead of copying it);
     and ours again through the same library loaded with pace="gpu" (gpu_*: its own
     first uses weigh the GPU's time alone, which is what these rows time, where the
     default's also weigh the caller's loop; not a bar, "gpu_paced_gemms" in the JSON);
   - the layer's forward, patched (torch_ops.patch) against unpatched (the same
     parameters), under torch.inference_mode(): the two timed repetition by repetition
     in turn (Timer.pair), since the host paces a forward of a few tokens and its speed
     drifts within a round; and again, a layer patched with the pace="gpu" library
     against the unpatched one (gpu_*: not a bar, "gpu_paced_forwards" in the JSON).
   Each output is checked before anything is timed, against float64 on fresh random
   inputs: a GEMM's (its second call's, the caching allocator first handed a NaN-filled
   block of the output's size, so an output never written reads as NaN) against
   act(x W^T + b) in float64 of the stored inputs, gated as the tuner gates the input
   type (tuner.bench: TOLERANCE x max(1, K/4096) plus one rounding of C); a forward's
   against a float64 copy of the layer: the patched layer's error must be within
   LAYER_SLACK (1.5) times the unpatched layer's own.

Cost: torch.compile max-autotune compiles and benchmarks Triton GEMM templates per shape:
measured on the H200 (915921b, "compile_s" in each row), 0-12 s for most, three of GPT-2's
at 128 tokens over 30 s; about 45 distinct shapes for both layers at all five T. Each is
cut at --compile-limit seconds (a SIGALRM in the compiling thread; the row then says so)
and --no-compile leaves them out. Inductor's caches on disk make a rerun on the same
machine faster. Building the layers, the first-use measurements and the timing itself
take minutes (measured: 66 s for both layers at all five T, --no-compile). To stay
within 10-minute commands: --tune-only first, then --skip-tune --library
artifacts/model-gemms/library, by layer or token counts if need be (each run writes its
JSON as it goes: a cut run keeps the rows it finished). A tune cut by its budget goes on
in a later run with --library DIR (no --skip-tune): the problems the library now holds
exactly are no longer recorded, so only those left are tuned; --prior-tune FILE (the
first part's model-gemms-tune JSON) adds that part's seconds to this run's for the bar
("total_seconds", the parts under "prior").

The bars ("bars" in the JSON): every GEMM at least 0.95x torch; the geometric mean over
all GEMMs at least 1.05x; each layer's forward at least 1.0x at every T; every output
within its gate.

Writes under --out (default bench/results): model-gemms-<gpu>-<date>.json (gpu, date,
commit, per-GEMM rows, per-layer forward rows, the tune's summary, the bars), a PNG per
layer, model-gemms-<layer>-<gpu>-<date>.png (ratios against T), and the tune's summary,
model-gemms-tune-<gpu>-<date>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import RESULTS, commit, cpp_path, geomean, interleaved, write  # noqa: E402
from codegen.config import DType, Layout  # noqa: E402
from codegen.families._common import Variant  # noqa: E402
from tuner._shape import epilogue_text  # noqa: E402

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError:  # the problem lists, the bars and the plots need no torch
    torch = nn = F = None

TOKENS = (1, 16, 128, 2048, 8192)
BUDGET_S = 480.0
TRIALS = 40
COMPILE_LIMIT_S = 180.0
ROUNDS = 3
WORK = ROOT / "artifacts" / "model-gemms"
COMMITTED_LIBRARY = ROOT / "artifacts" / "library"
#: the bars of issue 22
GEMM_BAR, GEOMEAN_BAR, FORWARD_BAR, TUNE_BAR_S = 0.95, 1.05, 1.0, 900.0
#: a patched forward's error against float64 may be this many times the unpatched one's
LAYER_SLACK = 1.5


# ---- the layers, as data ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Linear:
    """One linear of a layer: in and out features, a bias or not, the activation applied
    to its output alone ("none", "silu", "gelu_tanh")."""

    name: str
    fin: int
    fout: int
    bias: bool
    act: str = "none"


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """A decoder layer's sizes; `name` is its style ("llama" or "gpt2")."""

    name: str
    dtype: DType
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    bias: bool
    act: str  # the MLP's activation

    def linears(self) -> list[Linear]:
        """The layer's linears in the order a forward calls them."""
        h, q, kv, f, b = (self.hidden, self.heads * self.head_dim,
                          self.kv_heads * self.head_dim, self.ffn, self.bias)
        if self.name == "llama":
            return [Linear("q_proj", h, q, b), Linear("kv_proj", h, 2 * kv, b),
                    Linear("o_proj", q, h, b), Linear("gate", h, f, b, self.act),
                    Linear("up", h, f, b), Linear("down", f, h, b)]
        return [Linear("c_attn", h, q + 2 * kv, b), Linear("c_proj", q, h, b),
                Linear("c_fc", h, f, b, self.act), Linear("mlp_proj", f, h, b)]


LAYERS = {
    "llama": LayerSpec("llama", DType.BF16, 4096, 32, 8, 128, 14336, False, "silu"),
    "gpt2": LayerSpec("gpt2", DType.F16, 1024, 16, 16, 64, 4096, True, "gelu_tanh"),
}


def problems(spec: LayerSpec, tokens: int) -> list[dict]:
    """The GEMMs of one forward at `tokens` tokens, in call order: each linear's name and
    its problem in the fields of a record file (tuner/runtime/record.py)."""
    rows = []
    for lin in spec.linears():
        bias = "out" if lin.bias else "none"
        rows.append(dict(name=lin.name, dtype=spec.dtype.short, layout="nt",
                         out=spec.dtype.short, epilogue=epilogue_text(bias, lin.act),
                         bias=bias, act=lin.act, batch=1, m=tokens, n=lin.fout, k=lin.fin))
    return rows


def expected_lines(specs, tokens) -> list[str]:
    """The record file one forward per layer and token count would write, one line per
    call (tuner.problems.merge sums them)."""
    return [json.dumps(dict({k: v for k, v in p.items() if k != "name"}, calls=1))
            for spec in specs for t in tokens for p in problems(spec, t)]


def recorded_vs_expected(recorded: list[str], expected: list[str]) -> dict:
    """What a record file holds against what the layers give, problem by problem (label:
    shape, type, layout, C, epilogue): a missing one was served by an exact entry (or not
    recorded: a bug)."""
    from tuner.problems import merge

    got = {p.label: p.calls for p in merge(recorded)}
    want = {p.label: p.calls for p in merge(expected)}
    return dict(expected=len(want), recorded=len(got),
                missing=sorted(want.keys() - got.keys()),
                unexpected=sorted(got.keys() - want.keys()),
                calls_differ=sorted(x for x in want.keys() & got.keys() if want[x] != got[x]))


def gemm_gate(dtype: DType, k: int) -> float:
    """A GEMM's gate against float64, as the tuner gates a tensor-core kernel of this
    input type at depth K (tuner.bench), plus one rounding of C (of the input type)."""
    from tuner.bench import TOLERANCE, output_rounding

    return TOLERANCE[dtype] * max(1.0, k / 4096) + output_rounding(dtype)


# ---- the bars and the plot (from a results document) ------------------------------------------
def _worst(rows, key):
    rows = list(rows)
    if not rows:
        return None
    r = min(rows, key=lambda r: r.get(key) or 0.0)
    return {k: r.get(k) for k in ("layer", "tokens", "name", key) if k in r}


def bars(gemms: list[dict], forwards: list[dict], tune: dict | None = None) -> dict:
    """Issue 22's bars over the rows of a run; a missing figure fails its bar."""
    ratios = [r.get("ratio") for r in gemms]
    geo = geomean(ratios) if ratios and all(ratios) else None
    bad = [dict(layer=r["layer"], tokens=r["tokens"], name=r.get("name", "forward"),
                error=r.get("error"), gate=r.get("gate"))
           for r in gemms + forwards if not r.get("within_gate")]
    out = dict(
        every_gemm_vs_torch=dict(bar=GEMM_BAR, worst=_worst(gemms, "ratio"),
                                 met=bool(gemms) and all((x or 0) >= GEMM_BAR for x in ratios)),
        gemm_geomean_vs_torch=dict(bar=GEOMEAN_BAR, value=geo,
                                   met=geo is not None and geo >= GEOMEAN_BAR),
        forward_vs_unpatched=dict(bar=FORWARD_BAR, worst=_worst(forwards, "ratio"),
                                  met=bool(forwards) and all((r.get("ratio") or 0) >= FORWARD_BAR
                                                             for r in forwards)),
        outputs_within_gate=dict(met=bool(gemms or forwards) and not bad, failures=bad))
    if tune and "seconds" in tune:
        # a tune in parts (--prior-tune): every part's seconds
        seconds = tune.get("total_seconds", tune["seconds"])
        out["tune_within_15_min"] = dict(bar_s=TUNE_BAR_S, seconds=seconds,
                                         met=seconds <= TUNE_BAR_S)
    out["all_met"] = all(v["met"] for v in out.values())
    # not a bar: the GEMMs and forwards through the library loaded with pace="gpu"
    # (Session.lib_gpu)
    gpu = [r.get("gpu_ratio") for r in gemms]
    if gpu and all(gpu):
        out["gpu_paced_gemms"] = dict(worst=_worst(gemms, "gpu_ratio"), geomean=geomean(gpu),
                                      below_bar=sum(x < GEMM_BAR for x in gpu))
    gpu = [r.get("gpu_ratio") for r in forwards]
    if gpu and all(gpu):
        out["gpu_paced_forwards"] = dict(worst=_worst(forwards, "gpu_ratio"),
                                         below_bar=sum(x < FORWARD_BAR for x in gpu))
    compiled = [r.get("ratio_compile") for r in gemms]
    out["gemm_geomean_vs_compile"] = geomean(compiled) if compiled and all(compiled) else None
    return out


GPU_PACED = "x torch, pace gpu"


def series(doc: dict, layer: str) -> dict:
    """What the layer's plot draws: {"x torch": {label: [(T, ratio)]}, "x compile": ...},
    one line per GEMM (and "forward", patched against unpatched, in "x torch"), by T; and
    GPU_PACED, the GEMMs and the forward through the library loaded with pace="gpu", where
    the rows have them."""
    out: dict = {"x torch": {}, "x compile": {}}
    rows = sorted((r for r in doc["gemms"] if r["layer"] == layer), key=lambda r: r["tokens"])
    for r in rows:
        out["x torch"].setdefault(r["name"], []).append((r["tokens"], r.get("ratio")))
        out["x compile"].setdefault(r["name"], []).append((r["tokens"], r.get("ratio_compile")))
    if any(r.get("gpu_ratio") for r in rows):
        out[GPU_PACED] = {}
        for r in rows:
            out[GPU_PACED].setdefault(r["name"], []).append((r["tokens"], r.get("gpu_ratio")))
    fwd = sorted((r for r in doc["layers"] if r["layer"] == layer), key=lambda r: r["tokens"])
    if fwd:
        out["x torch"]["forward"] = [(r["tokens"], r.get("ratio")) for r in fwd]
    if fwd and any(r.get("gpu_ratio") for r in fwd):
        out.setdefault(GPU_PACED, {})["forward"] = [(r["tokens"], r.get("gpu_ratio")) for r in fwd]
    return out


def plot(doc: dict, layer: str, png: Path) -> Path:
    """Ratios against T for one layer: ours against torch (each GEMM, and the forward),
    then, where a run measured them, against torch.compile max-autotune and through the
    library loaded with pace="gpu", each a panel, with the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {title: lines for title, lines in series(doc, layer).items()  # no empty panel
              if title == "x torch" or any(y is not None for pts in lines.values() for _, y in pts)}
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.8), sharex=True,
                             squeeze=False)
    for ax, (title, lines) in zip(axes[0], groups.items()):
        drawn = 0
        for label, pts in lines.items():
            pts = [(t, y) for t, y in pts if y is not None]
            if pts:
                drawn += 1
                ax.plot(*zip(*pts), marker="o", label=label,
                        **(dict(color="black", lw=2.5) if label == "forward" else {}))
        ax.axhline(1.0, color="grey", lw=0.7)
        if title != "x compile":
            ax.axhline(GEMM_BAR, color="tab:red", ls="--", lw=1, label=f"{GEMM_BAR}x bar")
        ax.set_xscale("log", base=2)
        ticks = sorted({t for pts in lines.values() for t, _ in pts})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel(f"ours, {title} (higher: ours faster)")
        ax.set_title(f"{layer}: {title}" + (" max-autotune" if title == "x compile" else ""))
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no figures", ha="center", transform=ax.transAxes)
    fig.suptitle(f"gemm-tune, {layer} layer's GEMMs: {doc['gpu']}, {doc['date'][:10]}, "
                 f"{doc['commit']}")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# ---- the layers, in torch ---------------------------------------------------------------------
_Module = nn.Module if nn is not None else object


def _tdt(dtype: DType):
    return {DType.BF16: torch.bfloat16, DType.F16: torch.float16}[dtype]


def _act_module(act: str):
    return {"none": nn.Identity, "silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU,
            "gelu_tanh": lambda: nn.GELU(approximate="tanh")}[act]()


def _linear(spec: LayerSpec, name: str, **kw):
    lin = next(x for x in spec.linears() if x.name == name)
    return nn.Linear(lin.fin, lin.fout, bias=lin.bias, **kw)


def _fused(spec: LayerSpec, name: str, **kw):
    """nn.Sequential(the linear, its activation): the pattern torch_ops.patch fuses."""
    act = next(x for x in spec.linears() if x.name == name).act
    return nn.Sequential(_linear(spec, name, **kw), _act_module(act))


def _rope(x, base: float = 500000.0):
    """Rotary position embedding (rotate-half form) of x (batch, heads, tokens, dim)."""
    t, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _attend(q, k, v):
    """Causal attention through SDPA; grouped-query where K and V have fewer heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=q.shape[1] != k.shape[1])


class LlamaAttention(_Module):
    """q_proj, kv_proj (K and V in one), RoPE, grouped-query SDPA, o_proj."""

    def __init__(self, spec: LayerSpec, **kw):
        super().__init__()
        self.spec = spec
        self.q_proj = _linear(spec, "q_proj", **kw)
        self.kv_proj = _linear(spec, "kv_proj", **kw)
        self.o_proj = _linear(spec, "o_proj", **kw)

    def forward(self, x):
        (b, t, _), s = x.shape, self.spec
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, t, 2, s.kv_heads, s.head_dim).unbind(2)
        y = _attend(_rope(q), _rope(k.transpose(1, 2)), v.transpose(1, 2))
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Gpt2Attention(_Module):
    """c_attn (Q, K and V in one), SDPA, c_proj."""

    def __init__(self, spec: LayerSpec, **kw):
        super().__init__()
        self.spec = spec
        self.c_attn = _linear(spec, "c_attn", **kw)
        self.c_proj = _linear(spec, "c_proj", **kw)

    def forward(self, x):
        (b, t, _), s = x.shape, self.spec
        q, k, v = self.c_attn(x).view(b, t, 3, s.heads, s.head_dim).unbind(2)
        y = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


class GatedMLP(_Module):
    """down(silu(gate(x)) * up(x)), the gate an nn.Sequential(Linear, SiLU)."""

    def __init__(self, spec: LayerSpec, **kw):
        super().__init__()
        self.gate = _fused(spec, "gate", **kw)
        self.up = _linear(spec, "up", **kw)
        self.down = _linear(spec, "down", **kw)

    def forward(self, x):
        return self.down(self.gate(x) * self.up(x))


class GeluMLP(_Module):
    """mlp_proj(gelu(c_fc(x))), c_fc an nn.Sequential(Linear, GELU)."""

    def __init__(self, spec: LayerSpec, **kw):
        super().__init__()
        self.c_fc = _fused(spec, "c_fc", **kw)
        self.mlp_proj = _linear(spec, "mlp_proj", **kw)

    def forward(self, x):
        return self.mlp_proj(self.c_fc(x))


class DecoderLayer(_Module):
    """x + attn(norm1(x)), then + mlp(norm2(x)): llama's (RMSNorm) or gpt2's (LayerNorm)."""

    def __init__(self, spec: LayerSpec, **kw):
        super().__init__()
        llama = spec.name == "llama"
        norm = nn.RMSNorm if llama else nn.LayerNorm
        self.norm1 = norm(spec.hidden, eps=1e-5, **kw)
        self.attn = (LlamaAttention if llama else Gpt2Attention)(spec, **kw)
        self.norm2 = norm(spec.hidden, eps=1e-5, **kw)
        self.mlp = (GatedMLP if llama else GeluMLP)(spec, **kw)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def build_layer(spec: LayerSpec, device="cuda", dtype=None):
    """A decoder layer of `spec` on `device`, in the spec's type unless `dtype` (random
    weights: nn.Linear's initialisation under the caller's seed)."""
    return DecoderLayer(spec, device=device, dtype=dtype or _tdt(spec.dtype)).eval()


def linear_modules(layer, spec: LayerSpec) -> list:
    """(Linear spec, its nn.Linear) for each linear of `spec`, in order; a module is
    named by the last non-numeric part of its path ("mlp.gate.0": gate)."""
    found = {[p for p in path.split(".") if not p.isdigit()][-1]: m
             for path, m in layer.named_modules() if isinstance(m, nn.Linear)}
    return [(lin, found[lin.name]) for lin in spec.linears()]


def fused_activations(layer) -> list[str]:
    """The paths of the activation modules a patch absorbed into the linear before them."""
    from tuner.runtime.torch_ops import ACTIVATION_MODULES

    return [path for path, m in layer.named_modules()
            if type(m) in ACTIVATION_MODULES and "forward" in m.__dict__]


class LinearAct(_Module):
    """act(F.linear(x, W, b)) on a layer's own nn.Linear: torch's side of a GEMM row."""

    def __init__(self, linear, act: str):
        super().__init__()
        self.linear, self.act = linear, _act_module(act)

    def forward(self, x):
        return self.act(F.linear(x, self.linear.weight, self.linear.bias))


# ---- step 1 and 2: record, tune --------------------------------------------------------------
def record_forwards(specs, tokens, library: Path, path: Path) -> None:
    """One patched forward per layer and token count under lib.record(path)."""
    from tuner.runtime import load_library, torch_ops

    lib = load_library(library)
    with torch.inference_mode(), lib.record(path):
        for spec in specs:
            torch.manual_seed(0)
            layer = torch_ops.patch(build_layer(spec), lib)
            for t in tokens:
                layer(torch.randn(1, t, spec.hidden, device="cuda", dtype=_tdt(spec.dtype)))
            torch.cuda.synchronize()
            del layer


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def _run(cmd: list[str], what: str) -> str:
    """Run a child process (its stderr passed through); its stdout. Exit on failure."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=_env())
    if done.returncode:
        raise SystemExit(f"model_gemms: {what} failed (exit {done.returncode}); "
                         f"its stderr is above")
    return done.stdout


def record_and_tune(args, library: Path) -> dict:
    """Steps 1 and 2: the record file, what it holds against the layers, the tune."""
    from tuner.problems import merge

    record = WORK / "problems.jsonl"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    names, toks = ",".join(s.name for s in args.layers), ",".join(map(str, args.tokens))
    _run([sys.executable, __file__, "--record-child", str(library), str(record),
          "--layers", names, "--tokens", toks], "recording")
    lines = record.read_text().splitlines() if record.is_file() else []
    doc = dict(budget_s=args.budget, trials=TRIALS, record=[json.loads(x) for x in lines],
               recorded_vs_expected=recorded_vs_expected(
                   lines, expected_lines(args.layers, args.tokens)))
    if not lines:
        return dict(doc, seconds=0.0, problems=[], note="nothing recorded: all exact entries")
    cmd = [sys.executable, "-m", "tuner", "tune", "--problems", str(record),
           "--trials", str(TRIALS), "--budget", f"{args.budget:g}",
           "--library", str(library), "--artifacts", str(WORK / "tune-artifacts"), "--json"]
    t0 = time.monotonic()
    rows = json.loads(_run(cmd, "gemm-tune tune"))
    return dict(doc, problems_merged=len(merge(lines)), command=" ".join(cmd[1:]),
                seconds=round(time.monotonic() - t0, 1), problems=rows)


# ---- step 3: time -----------------------------------------------------------------------------
class _OverLimit(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise _OverLimit in this (the main) thread after `seconds`."""
    def stop(signum, frame):
        raise _OverLimit()

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _raise_recompile_limits() -> None:
    """One code object (LinearAct.forward) is compiled once per shape: let dynamo keep
    them all (its default falls back to eager after 8)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 4096)


def _error(y, ref) -> float | None:
    """||y - ref|| / ||ref|| (None where y holds a NaN or an infinity)."""
    if not bool(torch.isfinite(y).all()):
        return None
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _within(error, gate) -> bool:
    return error is not None and error <= gate


class Session:
    """The timing process: the tuned library, the timer, a layer built once (with a
    patched twin sharing its parameters, and a float64 copy for the references).

    `ops` (tuner.runtime.torch_ops: linear, patch, library_key), `timer` (fn -> times)
    and `device` are the GPU's unless given: a test runs the steps on the CPU with
    stand-ins."""

    def __init__(self, lib, args, ops=None, timer=None, device: str = "cuda", lib_gpu=None):
        if ops is None:
            from tuner.runtime import torch_ops as ops
        if timer is None:
            from wgmma_vs_cublas import Timer

            timer = Timer(torch)
        self.lib, self.args, self.ops, self.timer, self.device = lib, args, ops, timer, device
        self.key = ops.library_key(lib)
        # the same library loaded with pace="gpu" (a program whose host runs ahead), each
        # GEMM also timed through it (gpu_*): its own first uses, beside the default's
        self.lib_gpu = lib_gpu
        self.key_gpu = None if lib_gpu is None else ops.library_key(lib_gpu)
        self.built: dict = {}
        _raise_recompile_limits()

    def sync(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()

    def layers(self, spec: LayerSpec):
        if spec.name not in self.built:
            self.built.clear()  # one layer's memory at a time
            torch.manual_seed(0)
            plain = build_layer(spec, self.device)
            shared = {id(p): p for p in plain.parameters()}
            patched = copy.deepcopy(plain, memo=dict(shared))
            self.ops.patch(patched, self.lib)
            patched_gpu = None
            if self.lib_gpu is not None:
                patched_gpu = copy.deepcopy(plain, memo=dict(shared))
                self.ops.patch(patched_gpu, self.lib_gpu)
            self.built[spec.name] = plain, patched, copy.deepcopy(plain).double(), patched_gpu
        return self.built[spec.name]

    def run(self, spec: LayerSpec, tokens: int) -> tuple[list[dict], dict]:
        """The GEMM rows and the forward row of one layer at one token count."""
        plain, patched, ref, patched_gpu = self.layers(spec)
        rows, fns = [], {}
        with torch.inference_mode():
            for (lin, module), (_, module64) in zip(linear_modules(plain, spec),
                                                    linear_modules(ref, spec)):
                row, f = self.gemm(spec, lin, module, module64, tokens)
                rows.append(row)
                fns.update(f)
            fwd, f = self.forward(spec, tokens, plain, patched, ref, patched_gpu)
            fns.update(f)
            # the two forwards repetition by repetition: at a few tokens the host paces
            # them, and its speed drifts within a round (bench/NOTES.md, "Eighteenth session")
            times = interleaved(self.timer, fns, self.args.rounds,
                                paired=[("forward/patched", "forward/unpatched"),
                                        ("forward/gpu_patched", "forward/gpu_unpatched")])
        for row in rows:
            self._times(row, times, row["name"])
            row["ratio"] = row["torch_ms"] / row["ms"]
            if row.get("gpu_ms"):
                row["gpu_ratio"] = row["torch_ms"] / row["gpu_ms"]
            if row.get("compile_ms"):
                row["ratio_compile"] = row["compile_ms"] / row["ms"]
        (fwd["ms"], fwd["rounds_ms"]), (fwd["unpatched_ms"], fwd["unpatched_rounds_ms"]) = \
            times["forward/patched"], times["forward/unpatched"]
        fwd["ratio"] = fwd["unpatched_ms"] / fwd["ms"]
        if "forward/gpu_patched" in times:
            (fwd["gpu_ms"], fwd["gpu_rounds_ms"]), (fwd["gpu_unpatched_ms"], _) = \
                times["forward/gpu_patched"], times["forward/gpu_unpatched"]
            fwd["gpu_ratio"] = fwd["gpu_unpatched_ms"] / fwd["gpu_ms"]
        return rows, fwd

    @staticmethod
    def _times(row: dict, times: dict, name: str) -> None:
        for who, key in (("ours", ""), ("ours_gpu", "gpu_"), ("torch", "torch_"),
                         ("compile", "compile_")):
            if f"{name}/{who}" in times:
                row[f"{key}ms"], row[f"{key}rounds_ms"] = times[f"{name}/{who}"]

    def checked(self, fn, ref, dtype):
        """fn()'s error against `ref`, the caching allocator first handed a block of the
        output's size full of NaN (freed at once: the likely home of fn's output)."""
        torch.full(ref.shape, float("nan"), dtype=dtype, device=self.device)
        y = fn()
        self.sync()
        return _error(y, ref)

    def gemm(self, spec: LayerSpec, lin: Linear, module, module64, tokens: int):
        """One GEMM's row (its checks, route, compile) and its functions to time;
        `module64`: the float64 layer's copy of `module`, for the reference."""
        dt = _tdt(spec.dtype)
        x = torch.randn(tokens, lin.fin, device=self.device, dtype=dt)
        eager = LinearAct(module, lin.act)
        act = None if lin.act == "none" else lin.act

        def ours():
            return self.ops.linear(x, module.weight, module.bias, act, library=self.key)

        p = next(p for p in problems(spec, tokens) if p["name"] == lin.name)
        row = dict(layer=spec.name, tokens=tokens, name=lin.name, shape=[tokens, lin.fout, lin.fin],
                   dtype=spec.dtype.short, layout="nt", epilogue=p["epilogue"],
                   gate=gemm_gate(spec.dtype, lin.fin))
        ref = LinearAct(module64, lin.act)(x.double())
        ours()  # the first call decides the route (measuring, where the library does)
        row["error"] = self.checked(ours, ref, dt)
        row["torch_error"] = self.checked(lambda: eager(x), ref, dt)
        row["within_gate"] = _within(row["error"], row["gate"])
        row.update(self.route(self.lib, tokens, lin, spec.dtype))
        fns = {f"{lin.name}/ours": ours, f"{lin.name}/torch": lambda: eager(x)}
        if self.key_gpu is not None:
            def ours_gpu():
                return self.ops.linear(x, module.weight, module.bias, act, library=self.key_gpu)
            ours_gpu()  # its own first use, weighing the GPU's time alone
            row["gpu_error"] = self.checked(ours_gpu, ref, dt)
            row["within_gate"] = row["within_gate"] and _within(row["gpu_error"], row["gate"])
            route = self.route(self.lib_gpu, tokens, lin, spec.dtype)
            row.update(gpu_runs=route["runs"], gpu_rule=route["rule"])
            fns[f"{lin.name}/ours_gpu"] = ours_gpu
        if not self.args.no_compile:
            compiled = self.compiled(eager, x, row)
            if compiled is not None:
                row["compile_error"] = self.checked(compiled, ref, dt)
                fns[f"{lin.name}/compile"] = compiled
        return row, fns

    @staticmethod
    def route(lib, tokens: int, lin: Linear, dtype: DType) -> dict:
        """What `lib` ran for this problem: a kernel, or cuBLAS, and why."""
        want = Variant(Layout.NT, dtype, "out" if lin.bias else "none", lin.act)
        for plan in lib.plans.values():
            if (plan.m, plan.n, plan.k) == (tokens, lin.fout, lin.fin) \
                    and plan.problem is not None and plan.problem.variant == want:
                c = plan.choice
                return dict(runs=c.kernel or "cuBLAS", rule=c.rule, reason=c.reason)
        return dict(runs=None, rule=None, reason="no plan of the library holds this problem")

    def compiled(self, eager, x, row: dict):
        """torch.compile(max-autotune) of `eager` on x, cut at --compile-limit; the
        callable (a CUDA-graph step marked before each call), or None (row says why)."""
        limit = self.args.compile_limit
        fn = torch.compile(eager, mode="max-autotune", dynamic=False)
        t0 = time.monotonic()
        try:
            with _time_limit(limit):
                torch._dynamo.mark_static_address(x)
                fn(x)
                self.sync()
        except Exception as e:  # noqa: BLE001 - the rival's failure is a row's note, not a crash
            row["compile_s"] = round(time.monotonic() - t0, 1)
            over = isinstance(e, _OverLimit) or row["compile_s"] >= limit
            first = (str(e).strip().splitlines() or [""])[0][:200]
            row["compile_note"] = (f"over the --compile-limit of {limit:g} s" if over
                                   else f"failed: {type(e).__name__}: {first}")
            return None
        row["compile_s"] = round(time.monotonic() - t0, 1)
        mark = torch.compiler.cudagraph_mark_step_begin

        def call():
            mark()
            return fn(x)
        return call

    def forward(self, spec: LayerSpec, tokens: int, plain, patched, ref, patched_gpu=None):
        """The forward row's checks (patched, unpatched, against the float64 layer) and
        the functions to time (with `patched_gpu`, the layer patched with the pace="gpu"
        library, checked and timed beside another timing of the unpatched one)."""
        x = torch.randn(1, tokens, spec.hidden, device=self.device, dtype=_tdt(spec.dtype))
        want = ref(x.double())
        y_plain, y_patched = plain(x), patched(x)
        row = dict(layer=spec.name, tokens=tokens, error=_error(y_patched, want),
                   unpatched_error=_error(y_plain, want),
                   difference=_error(y_patched, y_plain.double()),
                   fused=fused_activations(patched))
        base = row["unpatched_error"]
        row["gate"] = None if base is None else LAYER_SLACK * base
        row["within_gate"] = base is not None and _within(row["error"], row["gate"])
        fns = {"forward/patched": lambda: patched(x), "forward/unpatched": lambda: plain(x)}
        if patched_gpu is not None:
            row["gpu_error"] = _error(patched_gpu(x), want)
            row["within_gate"] = row["within_gate"] and _within(row["gpu_error"], row["gate"])
            fns.update({"forward/gpu_patched": lambda: patched_gpu(x),
                        "forward/gpu_unpatched": lambda: plain(x)})
        return row, fns


def measure(args, library: Path, tune: dict | None) -> Path:
    """Step 3 on the GPU: the library loaded afresh, then :func:`run_all`."""
    from tuner.runtime import load_library

    lib = load_library(library)
    lib_gpu = load_library(library, pace="gpu")
    doc = dict(benchmark="model-gemms", gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, commit=commit(), call_path=cpp_path(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               method=__doc__, library=str(library),
               settings=dict(tokens=args.tokens, layers=[s.name for s in args.layers],
                             rounds=args.rounds, layer_slack=LAYER_SLACK,
                             compile=None if args.no_compile else dict(
                                 mode="max-autotune", limit_s=args.compile_limit)),
               tune=tune or dict(skipped=True))
    return run_all(Session(lib, args, lib_gpu=lib_gpu), doc, args.out)


def run_all(session: Session, doc: dict, out: Path) -> Path:
    """Every layer at every token count of the session's arguments into `doc` (its gemms,
    layers and bars), the JSON rewritten after each (a cut run keeps what it finished);
    then a plot per layer. Returns the JSON's path."""
    args, path = session.args, None
    doc.update(gemms=[], layers=[])
    for spec in args.layers:
        for t in args.tokens:
            rows, fwd = session.run(spec, t)
            doc["gemms"] += rows
            doc["layers"].append(fwd)
            doc["bars"] = bars(doc["gemms"], doc["layers"], doc.get("tune"))
            path = write("model-gemms", doc, out)
            _print(rows, fwd)
    for spec in args.layers:
        plot(doc, spec.name, _png(path, spec.name))
    print(json.dumps(doc["bars"], indent=1))
    return path


def _png(json_path: Path, layer: str) -> Path:
    return json_path.with_name(json_path.name.replace("model-gemms-", f"model-gemms-{layer}-", 1)
                               ).with_suffix(".png")


def _print(rows: list[dict], fwd: dict) -> None:
    for r in rows:
        comp = f"{r['ratio_compile']:.2f}x compile" if r.get("ratio_compile") else \
            r.get("compile_note", "")
        gpu = f"  pace gpu {r['gpu_ratio']:.2f}x ({r['gpu_runs']})" if r.get("gpu_ratio") else ""
        print(f"{r['layer']:5} T={r['tokens']:<5} {r['name']:8} {r['ms']:.4f} ms  "
              f"{r['ratio']:.2f}x torch  {comp}  {r['runs']} ({r['rule']}){gpu}  "
              f"err {r['error']}", flush=True)
    gpu = f"  pace gpu {fwd['gpu_ratio']:.2f}x" if fwd.get("gpu_ratio") else ""
    print(f"{fwd['layer']:5} T={fwd['tokens']:<5} forward  {fwd['ms']:.4f} ms  "
          f"{fwd['ratio']:.2f}x unpatched{gpu}  err {fwd['error']} "
          f"(unpatched {fwd['unpatched_error']})", flush=True)


# ---- the command line -------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2 (argparse's own adds the usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _tokens(text: str) -> list[int]:
    try:
        tokens = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "token counts") from None
    if any(t < 1 for t in tokens):
        raise argparse.ArgumentTypeError(f"{text!r}: token counts must be at least 1")
    return list(dict.fromkeys(tokens))


def _layers(text: str) -> list[LayerSpec]:
    bad = [x for x in text.split(",") if x not in LAYERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown layer {bad[0]!r} (layers: "
                                         f"{', '.join(LAYERS)})")
    return [LAYERS[x] for x in dict.fromkeys(text.split(","))]


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _rounds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="model_gemms.py", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=_tokens, default=list(TOKENS),
                   help="token counts, e.g. 1,16,128 (default 1,16,128,2048,8192)")
    p.add_argument("--layers", type=_layers, default=list(LAYERS.values()),
                   help="llama, gpt2 or both (default llama,gpt2)")
    p.add_argument("--budget", type=_positive, default=BUDGET_S,
                   help=f"seconds for the whole tune (default {BUDGET_S:g})")
    p.add_argument("--library", type=Path, default=None,
                   help="the library to tune into and time (default: a fresh copy of "
                        f"artifacts/library in {WORK.relative_to(ROOT)}/library)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--skip-tune", action="store_true",
                      help="no recording or tuning: time the library as it is")
    mode.add_argument("--tune-only", action="store_true",
                      help="record and tune, then stop (time later with --skip-tune)")
    p.add_argument("--prior-tune", type=Path, default=None, metavar="FILE",
                   help="the tune JSON of an earlier --tune-only part into the same "
                        "--library: its seconds count with this run's for the tune's bar")
    p.add_argument("--no-compile", action="store_true",
                   help="leave torch.compile max-autotune out (it costs minutes per shape)")
    p.add_argument("--compile-limit", type=_positive, default=COMPILE_LIMIT_S,
                   help=f"seconds each shape's compile may take (default {COMPILE_LIMIT_S:g})")
    p.add_argument("--rounds", type=_rounds, default=ROUNDS,
                   help=f"interleaved timing rounds (default {ROUNDS})")
    p.add_argument("--out", type=Path, default=RESULTS,
                   help="where the JSON and PNGs go (default bench/results)")
    p.add_argument("--record-child", nargs=2, metavar=("LIBRARY", "FILE"),
                   help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.library is not None and not (args.library / "manifest.json").is_file():
        p.error(f"--library {args.library}: no library there (no manifest.json)")
    if args.prior_tune is not None:
        if args.skip_tune or args.library is None:
            p.error("--prior-tune adds an earlier part's seconds to this run's tune: it "
                    "needs --library (the library that part tuned into), not --skip-tune")
        try:
            args.prior_tune = json.loads(args.prior_tune.read_text()) | dict(
                file=args.prior_tune.name)
            float(args.prior_tune["seconds"])
        except (OSError, ValueError, TypeError, KeyError) as e:
            p.error(f"--prior-tune {args.prior_tune}: not a tune JSON with its seconds ({e})")
    return args


def _library(args) -> Path:
    """--library, or a fresh copy of the committed library in WORK."""
    if args.library is not None:
        return args.library
    dest = WORK / "library"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(COMMITTED_LIBRARY, dest, ignore=shutil.ignore_patterns("dispatch.json*"))
    return dest


def main(argv=None) -> int:
    args = parse_args(argv)
    if torch is None or not torch.cuda.is_available():
        print("model_gemms.py: error: needs torch and a CUDA GPU "
              f"({'torch is not installed' if torch is None else 'torch sees no GPU'})",
              file=sys.stderr)
        return 2
    if args.record_child:
        record_forwards(args.layers, args.tokens, Path(args.record_child[0]),
                        Path(args.record_child[1]))
        return 0
    library = _library(args)
    tune = None
    if not args.skip_tune:
        tune = dict(record_and_tune(args, library), library=str(library),
                    gpu=torch.cuda.get_device_name(), commit=commit(),
                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))
        if args.prior_tune is not None:
            prior = args.prior_tune
            tune["prior"] = {k: prior.get(k) for k in ("file", "seconds", "commit", "date")}
            tune["total_seconds"] = round(tune["seconds"] + float(prior["seconds"]), 1)
        print(f"tune: {tune['seconds']} s; {tune['recorded_vs_expected']}; "
              f"wrote {write('model-gemms-tune', tune, args.out)}", flush=True)
        if args.tune_only:
            print(f"tuned library: {library}")
            return 0
    print(f"wrote {measure(args, library, tune)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
