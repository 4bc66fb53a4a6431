"""Import hygiene: imports at the top of each module, and no import circles through ``polyfuse.tiling`` or
``polyfuse.emit_cpp``.

An import inside a function usually hides a circle that a later refactor turns into an ``ImportError``;
a type-only import belongs under a module-level ``if TYPE_CHECKING:``.  The checks parse the source
(nothing is imported), except the last, which imports each of their modules alone in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "polyfuse"


def _modules(directory: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``directory`` (a package's ``__init__`` is the package)."""
    found = {}
    for path in sorted(directory.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


TILING = _modules(PACKAGE / "tiling")
EMIT_CPP = _modules(PACKAGE / "emit_cpp")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nested_imports(tree: ast.Module) -> list[str]:
    """``line: statement`` of every import inside a function, method or class body."""
    found = []
    for scope in ast.walk(tree):
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for stmt in scope.body:
                for node in ast.walk(stmt):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def _runtime_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is loaded (not under ``if TYPE_CHECKING:``, not in a body)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found.append(stmt)
        elif isinstance(stmt, ast.If):
            found += _runtime_imports(stmt.orelse if _is_type_checking(stmt.test) else stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            found += _runtime_imports(stmt.body + [s for h in stmt.handlers for s in h.body]
                                      + stmt.orelse + stmt.finalbody)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the ``polyfuse`` modules it imports when loaded."""
    modules = _modules(PACKAGE)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            assert node.level == 0 and node.module, f"{name}:{node.lineno}: polyfuse imports absolutely"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A shortest import path from ``start`` back to itself, or None."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for nxt in sorted(graph[current]):
            if nxt == start:
                path = [current]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt not in parent:
                parent[nxt] = current
                queue.append(nxt)
    return None


@pytest.mark.parametrize("module", sorted(TILING))
def test_tiling_imports_are_at_module_level(module: str) -> None:
    nested = _nested_imports(ast.parse(TILING[module].read_text()))
    assert not nested, f"{module} imports inside a function or class:\n" + "\n".join(nested)


@pytest.mark.parametrize("module", sorted(EMIT_CPP))
def test_emit_cpp_imports_are_at_module_level(module: str) -> None:
    nested = _nested_imports(ast.parse(EMIT_CPP[module].read_text()))
    assert not nested, f"{module} imports inside a function or class:\n" + "\n".join(nested)


def test_no_import_cycle_through_tiling_or_emit_cpp() -> None:
    graph = _import_graph()
    cycles = [_cycle_through(graph, name) for name in sorted({**TILING, **EMIT_CPP})]
    found = sorted({" -> ".join(c) for c in cycles if c is not None})
    assert not found, "import cycles through polyfuse.tiling or polyfuse.emit_cpp:\n" + "\n".join(found)


@pytest.mark.parametrize("module", sorted({**TILING, **EMIT_CPP}))
def test_module_imports_alone(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"import {module} in a fresh interpreter failed:\n{done.stderr}"
