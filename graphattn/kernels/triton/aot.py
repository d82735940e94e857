"""Compile the Triton kernels for a GPU architecture on a machine that has none.

The interpreter (how CI runs the kernels) never compiles them, so a kernel that only the
interpreter accepts would first fail on a user's GPU. This lowers every kernel variant the
backend launches on the asked architecture (the tiles config.py picks there) through
Triton's own compiler to a cubin and reads back what the hardware would need:

    arch dtype d mode kernel tiles  shared  regs stack  mma wgmma atomics exp2 band-loop

shared memory (bytes, against the architecture's limit), registers per thread, stack bytes per
thread (where spills go: 0 means none), tensor-core instructions (mma.sync, wgmma) in the PTX,
atomic instructions (the backward has none), exp2 operations in the TTGIR (one softmax per key
phase: 2 per loop in the forward) and the PTX instructions of the band loop's body (the forward's
last loop: one long-query tile against one key tile of its window). A configuration the wrapper
refuses is printed as "refused" with the reason.

    python -m graphattn.kernels.triton.aot --arch 80 90 --dtype bfloat16 --head-dim 64 128

Must run without TRITON_INTERPRET (which swaps the kernels for interpreted stand-ins).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from graphattn.kernels.triton.blocks import interpreter_active
from graphattn.kernels.triton.config import SHARED_MEMORY_LIMIT, SUPPORTED_HEAD_DIMS, candidates, refusal_reason

_TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPES = {
    "bfloat16": (torch.bfloat16, "half"),
    "float16": (torch.float16, "half"),
    "tf32": (torch.float32, "tf32"),
    "float32": (torch.float32, "ieee"),
}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}


def parse_arch(text: str) -> int:
    """A compute capability written 90, sm_90, sm90 or 9.0."""
    digits = text.lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
    if not digits.isdigit() or len(digits) != 2:
        raise argparse.ArgumentTypeError(f"expected a compute capability such as 80, sm_80 or 8.0, got {text!r}")
    return int(digits)


def parse_dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(text.lower(), text.lower())
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join([*DTYPES, *DTYPE_ALIASES])}, got {text!r}")
    return name


@dataclass
class CompiledVariant:
    name: str
    tiles: str
    shared_bytes: int
    registers: int
    stack_bytes: int  # per-thread stack frame; nonzero means registers spilled
    mma: int  # mma.sync instructions (Ampere-style tensor cores)
    wgmma: int  # wgmma.mma_async instructions (Hopper)
    atomics: int  # atom./red. instructions
    exp2: int  # math.exp2 in the TTGIR
    band_loop: int  # PTX instructions in the last top-level loop's body (forward: the band tile)

    @property
    def tensor_core_ops(self) -> int:
        return self.mma + self.wgmma


def _pointer_types(dtype: torch.dtype) -> dict[str, str]:
    states = _TRITON_TYPE[dtype]
    types = {}
    for kind in "GL":
        types |= {f"{name}{kind}": states for name in ("Q", "O", "K", "V", "DO", "DQ", "DK", "DV")}
        types |= {f"{name}{kind}": "fp32" for name in ("STATS", "QAB", "DELTA", "DQAB")}
    types |= {name: "i16" for name in ("TABLE_GG", "TABLE_GL", "TABLE_LG", "TABLE_LL")}
    types |= {name: "i32" for name in ("LONG", "OWN", "GLOB", "LINK_OFF", "LINK", "EDGE_OFF", "EDGE")}
    for table in ("GL", "LG", "LG_BY_KEY", "GL_BY_KEY"):
        types |= {f"COUNT_{table}": "i32", f"INDEX_{table}": "i32"}
    return types


def _variants(tiles, head_dim: int, dtype: torch.dtype, precision: str, structured: bool, v_pad: int):
    """(name, kernel, constexprs, launch options) of the three launches."""
    from graphattn.kernels.triton import dkdv, dq, forward

    dots = {"UPCAST": False, "PRECISION": "ieee" if precision == "ieee" else "tf32"}
    dq_writes = (
        [("dq", (True, False)), ("dq label", (False, True))] if tiles.dq.split_label_grads else [("dq", (True, True))]
    )
    launches = [("forward", forward._forward_kernel, tiles.forward, {})]
    launches += [
        (name, dq._dq_kernel, tiles.dq, {"WRITE_DQ": w[0], "WRITE_LABEL_GRADS": w[1]}) for name, w in dq_writes
    ]
    launches += [("dk dv", dkdv._dkdv_kernel, tiles.dkdv, {})]
    for name, kernel, kernel_tiles, extra in launches:
        constants = {key: value for key, value in kernel_tiles.constants().items() if key.startswith("BLOCK")}
        constants |= {"STRUCTURED": structured, "D": head_dim, "V_PAD": v_pad, **dots, **extra}
        launch = {"num_warps": kernel_tiles.num_warps, "num_stages": kernel_tiles.num_stages}
        yield name, kernel, constants, launch, kernel_tiles


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack-frame bytes: where spills go) from cuobjdump, shipped in Triton's wheel."""
    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        report = subprocess.run(
            [str(tool), "--dump-resource-usage", handle.name], capture_output=True, text=True, check=True
        ).stdout
    registers = re.search(r"REG:(\d+)", report)
    stack = re.search(r"STACK:(\d+)", report)
    return int(registers.group(1)) if registers else -1, int(stack.group(1)) if stack else -1


def loop_bodies(ptx: str) -> list[int]:
    """Instruction counts of the top-level loops of a PTX listing, in program order (a loop is a
    label and a later branch back to it; nested loops count inside their outer loop)."""
    lines = [line.strip() for line in ptx.splitlines()]
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\$L__\w+):", line))}
    loops = []
    for i, line in enumerate(lines):
        target = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if target and labels.get(target.group(1), i) < i:
            loops.append((labels[target.group(1)], i))
    outer = [(a, b) for a, b in loops if not any(c < a and b <= d for c, d in loops if (c, d) != (a, b))]
    instruction = re.compile(r"^(@%\w+\s+)?[a-z][\w.]*(\s|;)")
    return [sum(1 for line in lines[a : b + 1] if instruction.match(line)) for a, b in sorted(set(outer))]


def compile_all(
    arch: int,
    dtype: torch.dtype,
    head_dim: int,
    *,
    precision: str | None = None,
    structured: bool = True,
    v_pad: int = 32,
) -> list[CompiledVariant]:
    """Compile every variant the wrapper launches on `sm_<arch>` for these states (its first
    tile candidate); [] when the wrapper refuses the combination. Raises what Triton raises on
    a kernel it rejects."""
    if interpreter_active():
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the kernels, nothing would compile")
    import triton
    from triton.backends.compiler import GPUTarget

    precision = precision or ("half" if dtype != torch.float32 else "ieee")
    found = candidates(arch, head_dim, precision) if head_dim in SUPPORTED_HEAD_DIMS else []
    if not found:
        return []
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    pointers = _pointer_types(dtype)
    results = []
    for name, kernel, constants, launch, kernel_tiles in _variants(
        found[0], head_dim, dtype, precision, structured, v_pad
    ):
        signature, attrs = {}, {}
        for index, arg in enumerate(kernel.arg_names):
            if arg in constants:
                signature[arg] = "constexpr"
            elif arg in pointers:
                signature[arg] = "*" + pointers[arg]
                attrs[(index,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned
            else:
                signature[arg] = "fp32" if arg == "scale" else "i32"
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
        compiled = triton.compile(source, target=target, options=backend.parse_options(launch).__dict__)
        registers, stack = _resource_usage(compiled.asm["cubin"])
        ptx = compiled.asm["ptx"]
        loops = loop_bodies(ptx)
        tiles = (
            f"{kernel_tiles.long_rows}/{kernel_tiles.global_rows}x{kernel_tiles.long_cols}/{kernel_tiles.global_cols}"
            f" w{kernel_tiles.num_warps} s{kernel_tiles.num_stages}"
        )
        results.append(
            CompiledVariant(
                name,
                tiles,
                compiled.metadata.shared,
                registers,
                stack,
                len(re.findall(r"\bmma\.sync", ptx)),
                len(re.findall(r"\bwgmma\.mma_async", ptx)),
                len(re.findall(r"\b(?:atom|red)\.", ptx)),
                compiled.asm["ttgir"].count("math.exp2"),
                loops[-1] if loops else 0,
            )
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", type=parse_arch, nargs="+", default=[90], help="compute capabilities, e.g. 80 86 89 90 (or sm_80)"
    )
    parser.add_argument(
        "--dtype",
        type=parse_dtype,
        nargs="+",
        default=["bfloat16"],
        help="bfloat16 (bf16), float16 (fp16), float32 (fp32: exact, IEEE) or tf32 (fp32 states on TF32)",
    )
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64])
    parser.add_argument(
        "--mode",
        nargs="+",
        default=["structured"],
        choices=["structured", "dense"],
        help="labels from the compact structure or from dense tables",
    )
    parser.add_argument("--labels", type=int, default=32, help="relative vocabulary size (sets dq's label tile)")
    parser.add_argument("--json", action="store_true", help="one JSON object per variant instead of the table")
    args = parser.parse_args(argv)
    v_pad = max(16, 1 << (args.labels - 1).bit_length())
    header = (
        f"{'arch':>4} {'dtype':>8} {'d':>3} {'mode':>10} {'kernel':<7} {'tiles':<22} {'shared':>7} {'regs':>4} "
        f"{'stack':>5} "
        f"{'mma':>4} {'wgmma':>5} {'atom':>4} {'exp2':>4} {'band':>5}"
    )
    if not args.json:
        print(header)
    worst = 0
    for arch in args.arch:
        limit = SHARED_MEMORY_LIMIT.get(arch)
        for dtype_name in args.dtype:
            dtype, precision = DTYPES[dtype_name]
            for head_dim in args.head_dim:
                for mode in args.mode:
                    variants = compile_all(
                        arch, dtype, head_dim, precision=precision, structured=mode == "structured", v_pad=v_pad
                    )
                    prefix = f"{arch:>4} {dtype_name:>8} {head_dim:>3} {mode:>10}"
                    if not variants:
                        why = refusal_reason(head_dim, precision)
                        print(f"{prefix}  refused: {why} (graphattn/kernels/triton/config.py)")
                        continue
                    for v in variants:
                        flags = []
                        if limit is not None and v.shared_bytes > limit:
                            flags.append("OVER SHARED LIMIT")
                        if v.stack_bytes > 0:
                            flags.append("SPILLS")
                        worst = max(worst, int(bool(flags)))
                        if args.json:
                            import json

                            print(
                                json.dumps(
                                    {"arch": arch, "dtype": dtype_name, "head_dim": head_dim, "mode": mode, **asdict(v)}
                                )
                            )
                            continue
                        print(
                            f"{prefix} {v.name:<7} {v.tiles:<22} {v.shared_bytes:>7} {v.registers:>4} "
                            f"{v.stack_bytes:>5} {v.mma:>4} "
                            f"{v.wgmma:>5} {v.atomics:>4} {v.exp2:>4} {v.band_loop:>5}  {' '.join(flags)}"
                        )
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
