"""The shape of the package, as ARCHITECTURE.md states it.

* No import cycle between detaudit's modules, counting imports inside
  functions (a function-local import that closes a cycle only hides it) and
  the package ``__init__`` files an import runs; ``TYPE_CHECKING`` imports
  aside (they never run).
* No module over 800 lines: a longer one holds more than one concern.
* Every package's ``__init__`` opens with a docstring saying what lives there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import detaudit

PACKAGE = Path(detaudit.__file__).parent
MAX_MODULE_LINES = 800


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def import_graph() -> dict[str, set[str]]:
    """Module -> the detaudit modules importing it runs (packages included)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                imported.update(filter(None, (known(alias.name) for alias in node.names if alias.name.startswith("detaudit"))))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                if base.startswith("detaudit"):
                    for alias in node.names:
                        target = f"{base}.{alias.name}"
                        imported.add(target if target in modules else known(base))
        runs = set()
        for target in filter(None, imported):
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                ran = ".".join(parts[:end])
                if ran in modules and ran != name and not name.startswith(ran + "."):
                    runs.add(ran)
        graph[name] = runs
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_counting_function_local_imports():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_a_cycle_closed_inside_a_function():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(graph) == [["a", "b"]]
    assert import_graph()["detaudit.dynamic.compare.state_diff"] >= {"detaudit.dynamic.record.final_state"}


def test_no_module_is_over_800_lines():
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_every_package_says_what_lives_there():
    for init in PACKAGE.rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring and len(docstring) > 80, f"{init.relative_to(PACKAGE.parent)} has no docstring"
