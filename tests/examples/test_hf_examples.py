"""The three Hugging Face examples of docs/HF.md run as a user runs them and print their checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(name: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_sft_with_packed_documents():
    out = _run("hf_sft_packed.py")
    assert "step 0:" in out and "step 5:" in out
    assert out.rstrip().endswith("True"), out  # packed loss = the documents' own losses


@pytest.mark.slow
def test_grpo_on_a_prefix_tree():
    out = _run("hf_grpo_tree.py")
    assert "= each run alone" in out and ": True" in out.splitlines()[0], out
    assert "tokens: tree" in out and "fewer" in out


@pytest.mark.slow
def test_a_structured_encoder_from_a_schema():
    out = _run("hf_schema_encoder.py")
    lines = out.splitlines()
    assert lines[0].startswith("2 records -> rows of 47 globals + 387 long tokens, 28 relative labels"), out
    assert lines[1].endswith("True"), out
    moved = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("step ")]
    assert len(moved) == 3 and moved[0] > 0  # the zero-initialised tables moved
