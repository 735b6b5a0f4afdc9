"""The package's layers (docs/architecture.md, "Layers"): every import of a
``gnn_faas`` module, at module top or inside a function, points to the same
layer or one below, and no modules import each other in a circle.

The imports are read from the source with :mod:`ast` (nothing is imported), so
a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gnn_faas"

# lowest first; a module may import its own layer and the layers before it
LAYERS: list[tuple[str, ...]] = [
    # base: shared by all, import nothing above them
    (
        "gnn_faas",
        "gnn_faas.errors",
        "gnn_faas.deadline",
        "gnn_faas.graph_version",
        "gnn_faas.extras",
        "gnn_faas.request_id",
        "gnn_faas.metrics",
        "gnn_faas.clock",
        "gnn_faas.paths",
        "gnn_faas.ports",
        "gnn_faas.parent_death",
        "gnn_faas.owner_lease",
        "gnn_faas.logs",
        "gnn_faas.health",
        "gnn_faas.wire",
        "gnn_faas.http",
        "gnn_faas.choices",
        "gnn_faas.config_schema",
        "gnn_faas.config",
        # the gateway's Python client: traces, bench, cli and users import it
        "gnn_faas.client",
    ),
    ("gnn_faas.storage",),
    ("gnn_faas.functions",),
    ("gnn_faas.scheduler",),
    ("gnn_faas.gateway",),
    ("gnn_faas.stack", "gnn_faas.stack_memory"),
    ("gnn_faas.traces",),
    ("gnn_faas.bench",),
    ("gnn_faas.cli", "gnn_faas.__main__"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    """The layer whose longest prefix names ``module`` (the package itself is base)."""
    best, depth = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and name.count(".") > depth:
                if name == "gnn_faas" and module != "gnn_faas":
                    continue  # the bare package name is base only for gnn_faas/__init__.py
                best, depth = i, name.count(".")
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return best


def imports_of(module: str) -> set[str]:
    """The ``gnn_faas`` modules ``module`` imports (``from pkg import mod`` names the
    submodule when there is one)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "gnn_faas"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "gnn_faas":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    out.discard(module)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_up_the_layers(module):
    mine = layer_of(module)
    upward = sorted(t for t in GRAPH[module] if layer_of(t) > mine)
    assert not upward, f"{module} (layer {mine}) imports a higher layer: {upward}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules on it, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path: list[str] = []
        stack = [(root, iter(sorted(graph[root])))]
        state[root] = 1
        path.append(root)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif not state.get(child) and child in graph:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_no_import_circles():
    # a package's __init__ re-exporting its submodules is not a circle of its own
    graph = {
        m: {t for t in ts if not (MODULES[t].name == "__init__.py" and m.startswith(t + "."))}
        for m, ts in GRAPH.items()
    }
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_the_checks_catch_what_they_claim():
    """The checker itself: an upward import and a circle are found."""
    assert layer_of("gnn_faas.storage.format") < layer_of("gnn_faas.gateway.app")
    assert layer_of("gnn_faas.wire") == 0
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
