"""The Triton kernels compile for real GPUs, checked on a machine without one.

CI runs the kernels only through the interpreter, which never compiles them. Here Triton's own
compiler lowers every launched variant (the tiles triton/config.py picks for the architecture) to a
cubin for Hopper (sm_90) and Ampere (sm_80), in a subprocess without TRITON_INTERPRET, and each
must fit the architecture's shared memory without spilling registers, run its block products on
tensor cores (wgmma on Hopper), use no atomics, and compute the softmax once per key tile.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphattn.kernels.triton.config import SHARED_MEMORY_LIMIT

KERNELS = {"forward", "dq", "dk dv"}
TOOLS = ("ptxas", "cuobjdump")


def compiler_available() -> bool:
    """Triton's NVIDIA backend with a ptxas and cuobjdump (shipped in its wheel) that run here."""
    try:
        spec = importlib.util.find_spec("triton.backends.nvidia")
    except ImportError:  # no triton at all
        return False
    if spec is None or spec.origin is None:
        return False
    tools = Path(spec.origin).parent / "bin"
    try:
        runs = [subprocess.run([str(tools / name), "--version"], capture_output=True, timeout=60) for name in TOOLS]
    except (OSError, subprocess.TimeoutExpired):  # missing, or built for another platform
        return False
    return all(done.returncode == 0 for done in runs)


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not compiler_available(), reason="Triton's CUDA compiler (ptxas, cuobjdump) is not installed"),
]


def aot(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """`python -m graphattn.kernels.triton.aot ARGS` without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    command = [sys.executable, "-W", "ignore", "-m", "graphattn.kernels.triton.aot", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def compile_in_subprocess(arch: int, dtype: str, head_dim: int, mode: str = "structured") -> list[dict]:
    done = aot("--json", "--arch", str(arch), "--dtype", dtype, "--head-dim", str(head_dim), "--mode", mode)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"nothing compiled (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return lines


@pytest.mark.parametrize(
    "arch, dtype, head_dim", [(90, "bfloat16", 64), (90, "bfloat16", 128), (80, "bfloat16", 64), (80, "bfloat16", 128)]
)
def test_kernels_fit_without_spills_on_tensor_cores(arch, dtype, head_dim):
    variants = compile_in_subprocess(arch, dtype, head_dim)
    assert {v["name"] for v in variants} >= KERNELS
    for v in variants:
        assert 0 < v["shared_bytes"] <= SHARED_MEMORY_LIMIT[arch], v
        assert v["stack_bytes"] == 0, f"registers spill: {v}"
        assert v["atomics"] == 0, v
        if arch >= 90:
            assert v["wgmma"] > 0 and v["mma"] == 0, f"a product is not on wgmma: {v}"
        else:
            assert v["mma"] > 0, v
    forward = next(v for v in variants if v["name"] == "forward")
    assert forward["exp2"] == 8, (
        f"the softmax is computed more than once per tile: {forward}"
    )  # 4 key loops x (p, rescale)


def test_exact_fp32_and_unknown_head_dims_are_refused_with_the_reason() -> None:
    done = aot("--arch", "sm_86", "--dtype", "fp32", "--head-dim", "128", timeout=600)
    assert done.returncode == 0 and "refused: exact fp32 products" in done.stdout, done.stdout + done.stderr
    done = aot("--arch", "8.0", "--dtype", "bf16", "--head-dim", "96", timeout=600)
    assert done.returncode == 0 and "refused: no kernel is built for that head dim" in done.stdout, done.stdout
