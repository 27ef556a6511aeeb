"""The package's import graph has no cycles, counting the imports inside functions too (a lazy
import that closes a cycle still ties the two modules together), and the config loads without
the heavy libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from common.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "common"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The package modules `tree` imports anywhere but under `if TYPE_CHECKING:`."""
    found = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(m for m in [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if m in modules)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per module that lies on one, found by depth-first search."""
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_import_graph_finds_a_lazy_cycle():
    modules = {"a": Path("a.py"), "b": Path("b.py"), "c": Path("c.py")}
    trees = {
        "a": "import b",
        "b": "def f():\n    from c import x",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef g():\n    import a",
    }
    graph = {name: _imports(ast.parse(src), modules) for name, src in trees.items()}
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    graph["c"] = set()  # only under TYPE_CHECKING: no cycle at run time
    assert _cycles(graph) == []


def test_common_has_no_import_cycles():
    modules = _modules()
    graph = {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules) - {name} for name, path in modules.items()
    }
    assert len(graph) > 20 and graph["common.commands.train"]  # the scan sees the package
    assert _cycles(graph) == [], "import cycles: " + "; ".join(" -> ".join(c) for c in _cycles(graph))


def test_the_config_loads_without_numpy_pandas_or_torch():
    code = "import sys, common.config; heavy = {'numpy', 'pandas', 'torch'} & set(sys.modules); print(sorted(heavy))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
