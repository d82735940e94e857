"""Every benchmark script starts: it imports what it times and answers --help (timings are not tested)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 8


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_script_imports_and_answers_help(script):
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:200]
