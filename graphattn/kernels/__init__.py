"""Global-local (ETC) attention: one entry point, four backends.

    global_local_attention(global_q, global_k, global_v, long_q, long_k, long_v, side,
                           rel_key_table, rel_bias_table=None, backend="auto", scale=None)

Every backend computes, per head, e_ij = (q_i.k_j + q_i.a^K[label_ij]) * scale + b[label_ij]
(-inf where masked) with one softmax over [g2g ; g2l] per global query and one over
[l2g ; l2l window] per long query, and returns (global_out [B,H,G,d], long_out [B,H,L,d]).

backends: "dense" (the oracle, [G+L, G+L]), "blocked" (PyTorch, linear memory, the CPU
default), "triton" (fused kernels, the CUDA default), "flex" (torch FlexAttention).
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType

import torch

from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import blocked, dense, flex
from graphattn.kernels.validate import as_torch_side, check_head_dim, check_label_ids, check_side, check_states, check_tables

BACKENDS = ("auto", "dense", "blocked", "flex", "triton")

__all__ = ["BACKENDS", "global_local_attention", "resolve_backend", "triton_available"]


def _triton_module() -> ModuleType:
    """The Triton backend, imported on first use so that CPU-only installs never need triton."""
    try:
        return importlib.import_module("graphattn.kernels.triton_attention")
    except ImportError as err:
        raise RuntimeError(f"backend='triton' needs triton and graphattn.kernels.triton_attention ({err}); use backend='blocked' on machines without it") from err


def triton_available() -> bool:
    try:
        _triton_module()
    except RuntimeError:
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """'auto' -> 'triton' on CUDA when triton imports, else 'blocked'."""
    if backend not in BACKENDS:
        raise BatchError(f"unknown attention backend {backend!r}; expected one of {', '.join(BACKENDS)}", path=("backend",))
    if backend != "auto":
        return backend
    return "triton" if device.type == "cuda" and triton_available() else "blocked"


def _backend_module(name: str) -> ModuleType:
    if name == "triton":
        return _triton_module()
    return {"dense": dense, "blocked": blocked, "flex": flex}[name]


def _head_dim_predicate(module: ModuleType):
    """A backend may export supports_head_dim(d) -> bool or SUPPORTED_HEAD_DIMS."""
    if hasattr(module, "supports_head_dim"):
        return module.supports_head_dim
    if hasattr(module, "SUPPORTED_HEAD_DIMS"):
        return lambda d: d in module.SUPPORTED_HEAD_DIMS
    return None


@torch.compiler.disable  # data-dependent chunking and custom kernels: torch.compile runs around it
def _run_backend(module: ModuleType, args: tuple, scale: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast(device_type=device.type, enabled=False):  # kernels pick their own precision
        return module.attention(*args, scale)


def global_local_attention(
    global_q: torch.Tensor,
    global_k: torch.Tensor,
    global_v: torch.Tensor,
    long_q: torch.Tensor,
    long_k: torch.Tensor,
    long_v: torch.Tensor,
    side: SideInputs,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None = None,
    backend: str = "auto",
    scale: float | None = None,
    *,
    local_radius: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ETC attention over a batch; checks every input (raising BatchError) before any kernel runs.

    `side` holds the eight batched side inputs ([B, L, 2r+1], [B, G, G], [B, L, G], [B, G, L]);
    `rel_key_table` is a^K [V, H, d], `rel_bias_table` the optional b [V, H]; `scale` defaults
    to 1/sqrt(d); `local_radius`, when given, must match the side inputs' radius.
    """
    states = dict(global_q=global_q, global_k=global_k, global_v=global_v, long_q=long_q, long_k=long_k, long_v=long_v)
    batch, heads, num_global, num_long, dim = check_states(states)
    device = long_q.device
    side = as_torch_side(side, device)
    check_side(side, batch, num_global, num_long, local_radius)
    vocab = check_tables(rel_key_table, rel_bias_table, heads, dim, device)
    check_label_ids(side, vocab)
    name = resolve_backend(backend, device)
    module = _backend_module(name)
    check_head_dim(name, dim, _head_dim_predicate(module))
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    args = (global_q, global_k, global_v, long_q, long_k, long_v, side, rel_key_table, rel_bias_table)
    return _run_backend(module, args, scale, device)
