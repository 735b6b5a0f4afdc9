"""No function in ``gnn_faas/`` is longer than ``MAX_LINES`` lines
(docs/architecture.md, "Layers": small files doing one thing, and functions a
reader can hold), counted with :mod:`ast` from ``def`` to its last line,
nested functions inside their parent's count.

``ALLOWED`` names the exceptions and says why each is one; an entry that no
longer needs to be there (gone, or back under the limit) fails too, so the
list stays honest.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gnn_faas"
MAX_LINES = 100

# "path relative to gnn_faas/:function" -> why it may be longer
ALLOWED = {
    "gateway/openapi.py:build_openapi": (
        "a literal OpenAPI document (paths, parameters, responses): data written as "
        "one dict so it reads like the document it produces; splitting it scatters the spec"
    ),
    "gateway/openapi.py:_schemas": (
        "the literal JSON schemas of the request and answer bodies, one dict per schema"
    ),
}


def function_lengths(source: str) -> dict[str, int]:
    """Lines of every function and method (``name`` or ``Class.name``; nested
    ones as ``outer.inner``) in ``source``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def all_lengths() -> dict[str, int]:
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name, n in function_lengths(path.read_text()).items():
            lengths[f"{rel}:{name}"] = n
    return lengths


def test_no_function_is_longer_than_the_limit():
    long = {k: n for k, n in all_lengths().items() if n > MAX_LINES and k not in ALLOWED}
    assert not long, (
        f"functions over {MAX_LINES} lines (split them where a reader gains, or add them "
        f"to ALLOWED with the reason): {dict(sorted(long.items(), key=lambda kv: -kv[1]))}"
    )


def test_every_allowed_function_still_needs_it():
    lengths = all_lengths()
    for key in ALLOWED:
        assert key in lengths, f"{key} is allowed but no longer exists: drop it from ALLOWED"
        assert lengths[key] > MAX_LINES, f"{key} is {lengths[key]} lines now: drop it"


def test_the_count_covers_methods_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    src = f"class C:\n  def m(self):\n{body}\n\ndef f():\n    def g():\n        return 1\n    return g\n"
    lengths = function_lengths(src)
    assert lengths["C.m"] == 102 and lengths["f"] == 4 and lengths["f.g"] == 2
