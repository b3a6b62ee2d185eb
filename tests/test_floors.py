"""The import graph: codegen (ground) <- the run path (tuner.runtime) <- the tuner's search,
timing and model <- the CLI and reports. No circles, no upward imports, and importing the
run path loads neither the code generator's jinja2 nor the search's optuna, matplotlib or
rich (read from `python -X importtime`)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("codegen", "tuner")
#: what the run path may import besides codegen, itself and the standard library: numpy,
#: and the GPU bindings and frameworks of the caller's operands, each only where a call
#: needs it
RUN_PATH_THIRD_PARTY = {"numpy", "cuda", "torch", "cupy", "pycuda"}
SEARCH_ONLY = ("optuna", "matplotlib", "rich", "jinja2")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {r for r in map(resolve, _imports(f, m)) if r and r != m}
            for m, f in mods.items()}


def test_codegen_imports_nothing_of_the_tuner():
    up = {m: sorted(d for d in deps if d.startswith("tuner"))
          for m, deps in _graph().items() if m.startswith("codegen")}
    assert not {m: d for m, d in up.items() if d}


def test_the_run_path_imports_only_codegen_the_standard_library_and_gpu_bindings():
    mods = _modules()
    bad = {}
    for m, f in mods.items():
        if not m.startswith("tuner.runtime"):
            continue
        for name in _imports(f, m):
            top = name.split(".")[0]
            if top == "tuner" and not (name.startswith("tuner.runtime") or name == "tuner"):
                bad.setdefault(m, []).append(name)
            elif top not in ("tuner", "codegen") and top not in sys.stdlib_module_names \
                    and top not in RUN_PATH_THIRD_PARTY and top != "__future__":
                bad.setdefault(m, []).append(name)
    assert not bad, bad


def test_no_import_circles():
    graph = _graph()
    state, circles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if d == m.rpartition(".")[0] or m.startswith(d + "."):
                continue  # a package's own __init__ (it imports its children): not a circle
            if state.get(d) == "open":
                circles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, circles


def test_importing_the_run_path_loads_no_search_package():
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import tuner.runtime"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    loaded = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if "|" in line}
    assert "tuner.runtime.library" in loaded  # the measurement is of the real import
    heavy = sorted(m for m in loaded if m.split(".")[0] in SEARCH_ONLY
                   or m in ("codegen.rendering", "codegen.compile", "tuner.search", "tuner.cli"))
    assert not heavy, heavy
