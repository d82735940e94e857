"""No two graphattn modules import each other, directly or around a longer circle.

The import graph is read from the source (ast), not from a running interpreter, so that an import
inside a function or under `if TYPE_CHECKING:` counts as much as one at the top of the module:
each still says "this module needs that one", and a circle of them is two modules that belong
together (merge them) or share a part that belongs below both (move it down). An edge goes from
the importing module to the most specific graphattn module it names: `from graphattn.graph import
core` is an edge to `graphattn.graph.core`, `from graphattn.graph import DocGraph` one to the
package `graphattn.graph` (its `__init__`). Relative imports are resolved the same way. Python's
running of a package's `__init__` before its submodules is not an edge: a package's `__init__`
that re-exports its submodules would otherwise form a circle with every one of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import graphattn


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `module` imports anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" for alias in node.names]
            names = [name if name in modules else source for name in names]
        else:
            continue
        for name in names:
            while name not in modules and "." in name:  # an attribute of a module, or a third-party name
                name = name.rpartition(".")[0]
            if name in modules and name != module:
                found.add(name)
    return found


def import_graph(root: Path) -> nx.DiGraph:
    modules = module_files(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        graph.add_edges_from((module, target) for target in imported_modules(module, path, modules))
    return graph


def circles(graph: nx.DiGraph) -> list[str]:
    """Every import circle, written `a -> b -> a` from its alphabetically first module (networkx
    may start a circle anywhere, depending on set order), shortest first."""

    def from_first(cycle: list[str]) -> list[str]:
        start = cycle.index(min(cycle))
        return cycle[start:] + cycle[:start]

    found = sorted((from_first(cycle) for cycle in nx.simple_cycles(graph)), key=lambda cycle: (len(cycle), cycle))
    return [" -> ".join([*cycle, cycle[0]]) for cycle in found]


def test_no_module_of_graphattn_is_on_an_import_circle():
    graph = import_graph(Path(graphattn.__file__).resolve().parent)
    assert graph.number_of_edges() > 100  # the reader sees the package's imports at all
    found = circles(graph)
    assert not found, "import circles (merge the modules, or move what both need below them):\n" + "\n".join(found)


def test_the_circle_check_names_a_circle_through_a_function_level_and_a_type_checking_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import A\n")
    type_checking = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.b import B\n"
    (package / "a.py").write_text(type_checking + "A = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def make():\n    from ..a import A\n    return A\n")
    (package / "c.py").write_text("import pkg.sub.b\nfrom pkg import a\nimport os.path\n")
    graph = import_graph(package)
    assert set(graph.edges) == {
        ("pkg", "pkg.a"),
        ("pkg.a", "pkg.sub.b"),
        ("pkg.sub.b", "pkg.a"),
        ("pkg.c", "pkg.sub.b"),
        ("pkg.c", "pkg.a"),
    }
    assert circles(graph) == ["pkg.a -> pkg.sub.b -> pkg.a"]
