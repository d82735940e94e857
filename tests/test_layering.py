"""The contract sits at the bottom: lower stages never import the ones above them."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import graphattn


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    "statement, forbidden",
    [
        (
            "import graphattn.kernels",
            {"graphattn.schema", "graphattn.tokenize", "graphattn.compile", "yaml", "networkx"},
        ),
        ("import graphattn.contract, graphattn.labels, graphattn.compact", {"torch", "graphattn.compile", "yaml"}),
        ("import graphattn.shards.format", {"torch", "graphattn.compile", "graphattn.corpus", "yaml", "networkx"}),
        ("import graphattn.shards.reader", {"torch", "graphattn.compile", "graphattn.corpus", "yaml", "networkx"}),
        ("import graphattn.hf", {"transformers", "graphattn.compile", "graphattn.train", "yaml"}),
    ],
)
def test_a_stage_does_not_load_the_stages_above_it(statement, forbidden):
    loaded = _loaded_after(statement)
    assert not forbidden & loaded, f"{statement} loads {sorted(forbidden & loaded)}"


# docs/ARCHITECTURE.md's layers, bottom first: a module imports graphattn modules of its own layer
# or the layers before it. Each stage's command module (the `graphattn X` sub-commands) sits in the
# top layer with the dispatcher, whatever package it lives in.
LAYERS = (
    ("errors", "labels", "side", "contract", "compact", "lazy"),
    ("graph", "schema", "tokenize"),
    ("ingest",),
    ("compile",),
    ("shards",),
    ("corpus",),
    ("kernels",),
    ("nn", "patterns", "hf"),
    ("train", "viz", "cli", "__init__", "__main__"),
)
COMMANDS = {
    "graphattn.corpus.cli",
    "graphattn.shards.inspect",
    "graphattn.tokenize.cli",
    "graphattn.train.cli",
    "graphattn.viz.cli",
}


def _layer(module: str) -> int:
    if module in COMMANDS:
        return len(LAYERS) - 1
    part = module.split(".")[1] if "." in module else "__init__"
    layer = next((i for i, names in enumerate(LAYERS) if part in names), None)
    assert layer is not None, f"{module} is in no layer: add it to LAYERS (and to docs/ARCHITECTURE.md's)"
    return layer


def _package_modules() -> dict[str, Path]:
    root = Path(graphattn.__file__).resolve().parent
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)] = path
    return modules


def test_every_module_is_in_a_layer_and_imports_only_from_its_layer_or_below():
    upward = []
    for module, path in _package_modules().items():
        mine = _layer(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("graphattn.") and _layer(name) > mine:
                    upward.append(f"{module}:{node.lineno} imports {name}")
    assert not upward, "imports that point up the layers of docs/ARCHITECTURE.md:\n" + "\n".join(upward)
