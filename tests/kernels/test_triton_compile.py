"""The Triton kernels compile for real GPUs, checked on a machine without one.

CI runs the kernels only through the interpreter, which never compiles them. Here Triton's own
compiler lowers every launched variant to a cubin for Hopper (sm_90) and Ampere (sm_80), in a
subprocess without TRITON_INTERPRET, and the result must fit the architecture's shared memory
and run its block products on tensor cores in half precision.
"""

import json
import os
import subprocess
import sys

import pytest

from graphattn.kernels.triton_aot import SHARED_MEMORY_LIMIT

KERNELS = {"forward", "dq", "dk dv"}


def compile_in_subprocess(arch: int, dtype: str, head_dim: int) -> list[dict]:
    code = (
        "import json, torch\n"
        "from graphattn.kernels.triton_aot import compile_all\n"
        f"print(json.dumps([v.__dict__ for v in compile_all({arch}, torch.{dtype}, {head_dim})]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("arch, dtype, head_dim", [(90, "bfloat16", 64), (80, "float16", 64)])
def test_kernels_compile_and_fit(arch, dtype, head_dim):
    variants = compile_in_subprocess(arch, dtype, head_dim)
    assert {v["name"] for v in variants} == KERNELS
    for v in variants:
        assert 0 < v["shared_bytes"] <= SHARED_MEMORY_LIMIT[arch], v
        assert v["registers"] > 0, v
        if dtype != "float32":  # fp32 stays IEEE fp32, which tensor cores do not compute
            assert v["tensor_core_ops"] > 0, v
