"""The contract sits at the bottom: lower stages never import the ones above them."""

import json
import subprocess
import sys

import pytest


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    "statement, forbidden",
    [
        ("import graphattn.kernels", {"graphattn.schema", "graphattn.tokenize", "graphattn.compile", "yaml", "networkx"}),
        ("import graphattn.contract, graphattn.labels, graphattn.compact", {"torch", "graphattn.compile", "yaml"}),
        ("import graphattn.shards.format", {"torch", "graphattn.compile", "graphattn.corpus", "yaml", "networkx"}),
    ],
)
def test_a_stage_does_not_load_the_stages_above_it(statement, forbidden):
    loaded = _loaded_after(statement)
    assert not forbidden & loaded, f"{statement} loads {sorted(forbidden & loaded)}"
