"""Compile the Triton kernels for a GPU architecture on a machine that has none.

The interpreter (how CI runs the kernels) never compiles them, so a kernel that only the
interpreter accepts would first fail on a user's GPU. This lowers every kernel variant the
backend launches through Triton's own compiler to a cubin for the asked architecture and reads
back what the hardware would need: shared memory, registers a thread, stack (spill) bytes.

    python -m graphattn.kernels.triton_aot --arch 90 --dtype bfloat16 --head-dim 64

Must run without TRITON_INTERPRET (which swaps the kernels for interpreted stand-ins).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from graphattn.kernels.triton_blocks import default_block_sizes, interpreter_active

# Largest shared memory a block may use, per compute capability (CUDA programming guide).
SHARED_MEMORY_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
_TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class CompiledVariant:
    name: str
    shared_bytes: int
    registers: int
    stack_bytes: int  # per-thread stack frame; nonzero means registers spilled
    tensor_core_ops: int  # mma / wgmma instructions in the PTX: 0 means the products run on FMA units


def _variants(head_dim: int, dtype: torch.dtype):
    """(name, kernel, pointer dtypes, constexprs, launch options) of the three launches."""
    from graphattn.kernels import triton_backward as backward
    from graphattn.kernels import triton_forward as forward

    sizes = default_block_sizes()
    states = _TRITON_TYPE[dtype]
    consts = {"BLOCK_G": sizes.global_, "BLOCK_L": sizes.long, "D": head_dim, **forward.dot_options(dtype)}
    launch = forward.launch_options(head_dim, dtype)
    pointers = {}
    for kind in "GL":
        pointers |= {f"{name}{kind}": states for name in ("Q", "O", "K", "V", "DO", "DQ", "DK", "DV")}
        pointers |= {f"{name}{kind}": "fp32" for name in ("LSE", "QAB", "DELTA", "DQAB")}
    pointers |= {name: "i16" for name in ("LAB_GG", "LAB_GL", "LAB_LG", "LAB_LL")}
    for table in ("GL", "LG", "LG_BY_KEY", "GL_BY_KEY"):
        pointers |= {f"COUNT_{table}": "i32", f"INDEX_{table}": "i32"}
    yield "forward", forward._forward_kernel, pointers, consts, launch
    yield "dq", backward._dq_kernel, pointers, consts, launch
    yield "dk dv", backward._dkdv_kernel, pointers, consts, launch


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack-frame bytes: where spills go) from cuobjdump, shipped in Triton's wheel."""
    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        report = subprocess.run([str(tool), "--dump-resource-usage", handle.name], capture_output=True, text=True, check=True).stdout
    registers = re.search(r"REG:(\d+)", report)
    stack = re.search(r"STACK:(\d+)", report)
    return int(registers.group(1)) if registers else -1, int(stack.group(1)) if stack else -1


def compile_all(arch: int, dtype: torch.dtype, head_dim: int) -> list[CompiledVariant]:
    """Compile every variant for `sm_<arch>`; raises whatever Triton raises on a kernel it rejects."""
    if interpreter_active():
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the kernels, nothing would compile")
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    results = []
    for name, kernel, pointers, consts, launch in _variants(head_dim, dtype):
        signature, attrs = {}, {}
        for index, arg in enumerate(kernel.arg_names):
            if arg in consts:
                signature[arg] = "constexpr"
            elif arg in pointers:
                signature[arg] = "*" + pointers[arg]
                attrs[(index,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned
            else:
                signature[arg] = "fp32" if arg in ("scale", "qk_scale") else "i32"
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
        compiled = triton.compile(source, target=target, options=backend.parse_options(launch).__dict__)
        registers, stack = _resource_usage(compiled.asm["cubin"])
        ptx = compiled.asm["ptx"]
        results.append(CompiledVariant(name, compiled.metadata.shared, registers, stack, ptx.count("wgmma.mma_async") + ptx.count("mma.sync")))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities, e.g. 80 90")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64])
    args = parser.parse_args(argv)
    print(f"{'arch':>4} {'dtype':>8} {'d':>3}  {'kernel':<8} {'shared':>8} {'regs':>5} {'stack':>6} {'mma':>5}")
    worst = 0
    for arch in args.arch:
        for dtype_name in args.dtype:
            for head_dim in args.head_dim:
                for v in compile_all(arch, getattr(torch, dtype_name), head_dim):
                    limit = SHARED_MEMORY_LIMIT.get(arch)
                    flag = "  OVER SHARED LIMIT" if limit is not None and v.shared_bytes > limit else ""
                    worst = max(worst, int(bool(flag)))
                    print(f"{arch:>4} {dtype_name:>8} {head_dim:>3}  {v.name:<8} {v.shared_bytes:>8} {v.registers:>5} {v.stack_bytes:>6} {v.tensor_core_ops:>5}{flag}")
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
