"""benchmarks/gpu_check.py on a machine without a GPU: it says so, skips its CUDA parts, still
prints its table and exits non-zero (nothing measured); its methods run (untimed) on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]), TRITON_INTERPRET="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_cuda_it_says_so_skips_the_gpu_parts_and_fails() -> None:
    done = run("--lengths", "4096")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no CUDA GPU here" in done.stderr and "nothing was tested or timed" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| L | G | mode | method | median ms | peak MB | TFLOP/s")
    assert len(table) == 2 + 2 * 4 and all("skipped (no CUDA)" in line for line in table[2:])


@pytest.mark.slow
def test_every_method_runs_on_this_device() -> None:
    done = run("--smoke", "--lengths", "64", "--methods", "triton", "sdpa", "longformer")
    assert done.returncode == 0, done.stderr[-3000:]
    for method in ("triton", "sdpa", "longformer"):
        assert f"smoke L=64 fwd+bwd {method}: ran" in done.stdout, done.stdout


def test_help_names_the_options() -> None:
    done = run("--help", timeout=300)
    assert done.returncode == 0 and "--budget" in done.stdout and "--smoke" in done.stdout, done.stderr[-2000:]
