"""The package's modules import each other in layers: no import cycle.

Every import counts, module-level or inside a function (an import moved into a
function to dodge a cycle is still a cycle); only `if TYPE_CHECKING:` blocks are
left out, since they never run. A cycle is printed as the chain of imports with
their line numbers, so the failure says what to move.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lagdoctor

PACKAGE_ROOT = Path(lagdoctor.__file__).parent


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, dict[str, int]]:
    """module -> {imported package module: line of its first import}. `from a import b`
    points at the module a.b when there is one, else at a."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        edges: dict[str, int] = {}
        package = name.split(".") if is_package else name.split(".")[:-1]

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for other in child.orelse:
                        visit(other)
                    continue
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        if alias.name in modules:
                            edges.setdefault(alias.name, child.lineno)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parent = package[:len(package) - (child.level - 1)]
                        base = ".".join(parent + ([base] if base else []))
                    for alias in child.names:
                        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                        if target in modules:
                            edges.setdefault(target, child.lineno)
                visit(child)

        visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges.pop(name, None)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return "\n".join(f"  {a} imports {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_find_cycle_reports_a_cycle_and_accepts_layers():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1, "c": 1}, "b": {"c": 2}, "c": {}}) is None


def test_a_function_level_import_counts_and_type_checking_does_not(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from pkg import high\n")
    (pkg / "high.py").write_text("from pkg.low import f\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n")
    graph = import_graph(pkg)
    assert find_cycle(graph) == ["pkg.high", "pkg.low", "pkg.high"]
    assert graph["pkg.typed"] == {}


def test_lagdoctor_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle:\n" + describe(cycle, graph)
