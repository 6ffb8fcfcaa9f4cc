"""The layering rules, read from the code's imports (every import: module level, inside functions, type-only):

- wire (the cluster's vocabulary) imports nothing of the project but itself, and no torch;
- router imports neither the engine (corun) nor torch;
- the engine (corun) imports no transfer, node, router or launcher code;
- transfer imports no engine;
- no import circles between the project's modules.

Inverse: the same reading finds a rule broken in a module written to break it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wire", "corun", "router", "transfer", "node_core", "prefill_node", "decode_node", "colocated_node",
            "launch", "planner", "cli", "benchmarks")
NODE_AND_ABOVE = ("transfer", "node_core", "prefill_node", "decode_node", "colocated_node", "router", "launch",
                  "planner", "cli", "benchmarks")
FORBIDDEN = {
    "wire": ("torch", *(p for p in PACKAGES if p != "wire")),
    "router": ("torch", "corun", "transfer", "node_core", "prefill_node", "decode_node", "colocated_node"),
    "corun": NODE_AND_ABOVE,
    "transfer": ("corun",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module path imports, as absolute names (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def project_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def broken_rules(files: list[Path]) -> list[str]:
    broken = []
    for path in files:
        top = module_name(path).split(".")[0]
        for name in sorted(imported_modules(path)):
            if name.split(".")[0] in FORBIDDEN.get(top, ()):
                broken.append(f"{path.relative_to(ROOT)} imports {name}")
    return broken


def import_graph(files: list[Path]) -> dict[str, set[str]]:
    modules = {module_name(path): path for path in files}
    graph = {}
    for name, path in modules.items():
        # NOTE: `from a.b import c` names a.b and a.b.c: keep those that are modules; a package's own __init__
        # importing its submodules is no circle
        graph[name] = {target for target in imported_modules(path)
                       if target in modules and target != name and not target.startswith(name + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's cycles, one per strongly connected component of more than one module (Tarjan's)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node):
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

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_layering_rule_holds():
    assert broken_rules(project_files()) == []


def test_the_project_has_no_import_circles():
    assert circles(import_graph(project_files())) == []


@pytest.fixture
def broken_tree(tmp_path):
    """A tree that breaks each rule once: wire imports the engine, the router torch, the engine a node, and two
    router modules import each other."""
    files = {"wire/bad.py": "from corun.llm import LLM\n",
             "router/bad.py": "def f():\n    import torch\n",
             "corun/bad.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from prefill_node import server\n",
             "router/a.py": "from router import b\n", "router/b.py": "from .a import x\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path, [tmp_path / name for name in files]


def test_the_reading_finds_each_broken_rule_and_circle(broken_tree, monkeypatch):
    root, files = broken_tree
    monkeypatch.setattr(f"{__name__}.ROOT", root)
    assert broken_rules(files) == ["wire/bad.py imports corun.llm", "wire/bad.py imports corun.llm.LLM",
                                   "router/bad.py imports torch", "corun/bad.py imports prefill_node",
                                   "corun/bad.py imports prefill_node.server"]
    assert circles(import_graph(files)) == [["router.a", "router.b"]]
