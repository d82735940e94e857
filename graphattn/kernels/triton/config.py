"""Which tiles the Triton kernels launch with, per GPU architecture, head dim and precision, and
which combinations are refused before launch.

The tables below were fitted with Triton's own compiler for sm_80 / 86 / 89 / 90 (`python -m
graphattn.kernels.triton.aot`, which needs no GPU, prints every kernel's shared memory, registers,
spilled stack bytes and tensor-core instructions): each entry's kernels fit the architecture's
shared memory without register spills. An architecture's entry is an ordered list of candidates;
at its first launch on a GPU each kernel is compiled (`warmup`) and a candidate whose compiled
shared memory passes the device's limit is kept (`PreparedAttention` rebuilds the block lists if
it had to move on), so a GPU with less shared memory than its table assumed is served by a
smaller candidate, and one that fits none is refused with a message, never an opaque launch
failure.

Precision classes: "half" (bf16/fp16: tensor cores, wgmma on sm_90), "tf32" (fp32 states with
torch.backends.cuda.matmul.allow_tf32: tensor cores at TF32 precision, head dims up to 64) and
"ieee" (fp32 without TF32), which is refused: exact fp32 products run on the FMA units and spill
registers at every tile size tried (ptxas: 16-3600 stack bytes at 32x16 tiles). `attention_backend
="auto"` therefore picks FlexAttention (or the blocked backend) for fp32 states on a GPU unless
TF32 is allowed (graphattn.kernels.resolve_backend).
"""

from __future__ import annotations

import torch

from graphattn.errors import BatchError
from graphattn.kernels.triton.blocks import KernelTiles, TileConfig

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)

# Largest shared memory a block may use, per compute capability (CUDA programming guide, opt-in).
SHARED_MEMORY_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448}


def precision_class(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def candidates(arch: int, head_dim: int, precision: str) -> list[TileConfig]:
    """Tile configurations for sm_<arch>, in order of preference (empty: refused).

    All tiles are 64 query (or, in dk/dv, key) rows, which every tensor-core generation takes
    (wgmma needs 64-row tiles per warpgroup), against 32- or 16-token tiles of the other side:
    the per-pair label derivation keeps 8 warps busy and the register file full, and a wider tile
    spills. At head dim 128, dq writes dq and the label gradients in two launches."""
    hopper = arch >= 90
    stages = 3 if SHARED_MEMORY_LIMIT.get(arch, 101376) >= 166912 else 2
    wide, narrow = 32, 16
    if precision == "ieee":  # exact fp32 on the FMA units spills registers: refused
        return []
    if precision == "tf32":
        if head_dim > 64:
            return []
        tiles = KernelTiles(64, 64, narrow, narrow, num_warps=8, num_stages=2)
        return [TileConfig(tiles, KernelTiles(64, 64, narrow, narrow, 8, 2, split_label_grads=True), tiles)]
    fallback = TileConfig(
        KernelTiles(64, 64, narrow, narrow, 8, 1),
        KernelTiles(64, 64, narrow, narrow, 8, 1, split_label_grads=True),
        KernelTiles(64, 64, narrow, narrow, 8, 1),
    )
    forward = KernelTiles(64, 64, wide, wide, num_warps=8, num_stages=stages)
    if head_dim <= 64:
        dq = KernelTiles(64, 64, wide, wide, 8, stages) if hopper else KernelTiles(64, 64, narrow, narrow, 8, stages)
        dkdv = KernelTiles(64, 64, wide, wide, 8, stages) if hopper else KernelTiles(64, 64, narrow, narrow, 8, stages)
    else:
        dq = KernelTiles(64, 64, narrow, narrow, 8, stages, split_label_grads=True)
        dkdv = KernelTiles(64, 64, narrow, narrow, 8, stages) if hopper else KernelTiles(64, 64, wide, wide, 8, stages)
    return [TileConfig(forward, dq, dkdv), fallback]


def refusal(cc: tuple[int, int], head_dim: int, dtype: torch.dtype, why: str) -> BatchError:
    """The error for a configuration the kernels do not launch, with what to do instead."""
    advice = (
        "use head_dim 16, 32, 64 or 128"
        if head_dim not in SUPPORTED_HEAD_DIMS
        else "cast the states to bfloat16/float16 (e.g. under torch.autocast), or set "
        "torch.backends.cuda.matmul.allow_tf32 = True"
        if dtype == torch.float32
        else "use a smaller head_dim"
    )
    return BatchError(
        f"the triton kernels do not run head_dim {head_dim} in {str(dtype).replace('torch.', '')} on this GPU "
        f"(compute capability {cc[0]}.{cc[1]}): {why}; {advice}, or attention_backend='flex' or 'blocked'",
        path=("global_q",),
    )


def tile_candidates(device: torch.device, head_dim: int, dtype: torch.dtype) -> list[TileConfig]:
    """The candidates for a CUDA device, or a BatchError saying why there are none."""
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 0):
        raise refusal(cc, head_dim, dtype, "the kernels need compute capability 8.0 or newer (Ampere, Ada, Hopper)")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise refusal(cc, head_dim, dtype, refusal_reason(head_dim, "half"))
    arch = cc[0] * 10 + cc[1]
    precision = precision_class(dtype)
    found = candidates(arch if arch in SHARED_MEMORY_LIMIT else 90 if cc[0] >= 9 else 86, head_dim, precision)
    if not found:
        raise refusal(cc, head_dim, dtype, refusal_reason(head_dim, precision))
    return found


def refusal_reason(head_dim: int, precision: str) -> str:
    """Why `candidates` has nothing for this head dim and precision class (the AOT tool prints it)."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return "no kernel is built for that head dim"
    if precision == "ieee":
        return "exact fp32 products (TF32 is off) spill registers in these kernels"
    return f"{precision} products at this head dim spill registers or exceed shared memory"


def launches_without_refusal(dtype: torch.dtype | None) -> bool:
    """Whether states of `dtype` (None: unknown) have kernels on a capable GPU: what 'auto' asks."""
    return dtype is None or precision_class(dtype) != "ieee"


def shared_memory_limit(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(
        getattr(props, "shared_memory_per_block_optin", 0)
        or SHARED_MEMORY_LIMIT.get(props.major * 10 + props.minor, 101376)
    )


class SharedMemoryExceeded(BatchError):
    """A kernel compiled for this GPU needs more shared memory than a block may have."""


_checked: set = set()


def launch(kernel, grid: tuple, args: tuple, constants: dict) -> None:
    """Launch a kernel over `grid` (nothing when the grid is empty); on a GPU the first launch of
    each compiled variant is preceded by a compile-only check of its shared memory."""
    if grid[0] == 0:
        return
    first = next(a for a in args if isinstance(a, torch.Tensor))
    if first.device.type == "cuda":
        check_shared_memory(kernel, grid, args, constants, first.device)
    kernel[grid](*args, **constants)


def check_shared_memory(kernel, grid: tuple, args: tuple, constants: dict, device: torch.device) -> None:
    """Compile (Triton's `warmup`, no launch) and refuse a variant over the device's shared memory.
    `args` may hold dtypes instead of tensors (a check before the tensors exist)."""
    dtypes = tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args)
    key = (kernel.fn.__name__, str(device), dtypes, tuple(sorted(constants.items())))
    if key in _checked:
        return
    compiled = kernel.warmup(*dtypes, grid=grid, **constants)
    needed, limit = compiled.metadata.shared, shared_memory_limit(device)
    if needed > limit:
        cc = torch.cuda.get_device_capability(device)
        raise SharedMemoryExceeded(
            f"the {kernel.fn.__name__} kernel ({constants}) needs {needed} bytes of shared memory, this GPU (compute "
            f"capability {cc[0]}.{cc[1]}) allows {limit} per block",
            path=("global_q",),
        )
    _checked.add(key)
