"""The tree's promises about imports, read from the source (every import statement, the ones
inside functions and under TYPE_CHECKING included): no circles, the runtime's core in layers
that point one way, and the three rooms - core, export, runtime - apart."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package -> its directory (pyproject's package-dir)
ROOMS = {"personaplex_edge": ROOT / "personaplex_edge",
         "personaplex_edge.runtime": ROOT / "runtime",
         "personaplex_edge.export": ROOT / "export"}
TOP = "personaplex_edge"  # the package itself: names its public API lazily, imports nothing

# The runtime's core, bottom first: a module imports only from its own layer or below.
LAYERS = [
    ["model"],
    ["persona_cache", "persona", "lockstep"],
    ["conversation"],
    ["api"],
    ["bench", "stdio", "batch", "serve", "assistant"],
]
# core modules that are front doors: they may reach the runtime and (for a built-in model's
# first export) the torch side - the CLI, its commands (personaplex_edge/commands/), what
# --model names; every other core module reaches neither
FRONT_DOORS = {"personaplex_edge.cli", "personaplex_edge.model_ref", "personaplex_edge.commands"}


def _front_door(module: str) -> bool:
    return module in FRONT_DOORS or module.startswith("personaplex_edge.commands.")


def _modules() -> dict[str, Path]:
    found = {}
    for package, directory in ROOMS.items():
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            found.setdefault(name, path)  # export/ and runtime/ are not core submodules
    return found


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            here = module.split(".")
            if MODULES[module].name != "__init__.py":
                here.pop()
            base = here[:len(here) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        # `from pkg import sub` imports the submodule; `from mod import name`, the module
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix
                 for a in node.names]
    return [n for n in names if n in MODULES]


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(module, node))
        # importing any submodule runs the top package's lazy __init__: not an edge of meaning
        graph[module] = edges - {module, TOP}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer(module: str) -> int | None:
    prefix = "personaplex_edge.runtime."
    if not module.startswith(prefix):
        return None
    first = module[len(prefix):].split(".")[0]
    return next((i for i, names in enumerate(LAYERS) if first in names), None)


def test_the_analysis_sees_the_imports_it_judges():
    """The graph is built from real statements: the known arrows are in it (a parser that
    found nothing would pass every rule below)."""
    graph = _graph()
    assert "personaplex_edge.runtime.lockstep" in graph["personaplex_edge.runtime.conversation"]
    assert "personaplex_edge.runtime.model" in graph["personaplex_edge.runtime.api"]
    assert "personaplex_edge.runtime.serve.protocol" in graph["personaplex_edge.runtime.serve.chat"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back_through_others():
    assert _cycles(_graph()) == []


def test_the_runtime_core_is_layered_bottom_up():
    """model at the bottom; persona, its cache, lockstep and say above it; the conversation
    above them; the public API on top, under the front ends."""
    graph = _graph()
    assert all(_layer(f"personaplex_edge.runtime.{n}") is not None for row in LAYERS for n in row)
    upward = [(m, t) for m, targets in graph.items() for t in targets
              if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)]
    assert upward == []


def test_core_export_and_runtime_keep_to_their_rooms():
    graph = _graph()
    runtime, export = "personaplex_edge.runtime", "personaplex_edge.export"
    wrong = []
    for module, targets in graph.items():
        for t in targets:
            if module.startswith(runtime) and t.startswith(export):
                wrong.append((module, t))  # the runtime never needs torch
            elif module.startswith(export) and t.startswith(runtime):
                wrong.append((module, t))  # an export is checked in onnxruntime, not the runtime
            elif (not module.startswith((runtime, export)) and not _front_door(module)
                  and module != TOP and t.startswith((runtime, export))):
                wrong.append((module, t))  # the shared core stands under both
    assert wrong == []


def test_the_package_names_its_api_without_importing_it():
    """personaplex_edge/__init__.py imports the runtime only for type checkers."""
    tree = ast.parse((ROOT / "personaplex_edge" / "__init__.py").read_text())
    eager = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
             and node.module not in ("__future__", "typing")]
    assert eager == []
