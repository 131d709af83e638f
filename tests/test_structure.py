"""The house rules, checked on the source (architecture.md; issue 17's "done means"):

- the dependency direction: the compiler and the emulator never import each other, and neither
  imports the tools; isa and platforms import neither;
- no import circle between npuemu modules, counting imports inside functions;
- no function longer than 80 lines outside tests.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("platforms", "isa", "compiler", "emulator", "tools")
#: room -> the rooms it may import (architecture.md, "Dependency direction")
ALLOWED = {
    "platforms": {"platforms", "isa"},
    "isa": {"isa", "platforms"},
    "compiler": {"compiler", "isa", "platforms"},
    "emulator": {"emulator", "isa", "platforms"},
    "tools": set(ROOMS),
}
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    modules = {}
    for room in ROOMS:
        for path in (ROOT / room).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules["npuemu." + ".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    """The npuemu modules an import statement names (a package's submodule where it is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[module] = {target for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _imported(module, path, node, known)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for node in graph:
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_rooms_import_only_what_the_architecture_allows() -> None:
    wrong = [f"{module} imports {target}" for module, targets in _graph().items() for target in targets
             if target.split(".")[1] not in ALLOWED[module.split(".")[1]]]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_function_longer_than_80_lines() -> None:
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)
