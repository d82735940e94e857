"""Global-local (ETC) attention: prepared once per batch, four backends.

    attention = prepare_attention(side_or_compact, num_heads=H, head_dim=d, vocab_size=V, backend="auto")
    global_out, long_out = attention.attend(global_q, global_k, global_v, long_q, long_k, long_v,
                                            rel_key_table, rel_bias_table=None, scale=None)

Every backend computes, per head, e_ij = (q_i.k_j + q_i.a^K[label_ij]) * scale + b[label_ij]
(-inf where masked) with one softmax over [g2g ; g2l] per global query and one over
[l2g ; l2l window] per long query, and returns (global_out [B,H,G,d], long_out [B,H,L,d]).
`global_local_attention(...)` prepares and runs in one call. `attend` also takes keys/values
per attention kind (l2g_k, g2l_k, ...) and a table pair for the global queries (global_tables),
for etcmodel's unshared projections (graphattn.nn.EtcConfig).

backends: "dense" (the oracle, [G+L, G+L]), "blocked" (PyTorch, linear memory, the CPU
default), "triton" (fused kernels, the CUDA default), "flex" (torch FlexAttention).
"""

from __future__ import annotations

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels.prepared import (
    BACKENDS,
    PreparedAttention,
    prepare_attention,
    resolve_backend,
    triton_available,
)
from graphattn.kernels.validate import check_states, check_tables

__all__ = [
    "BACKENDS",
    "PreparedAttention",
    "global_local_attention",
    "prepare_attention",
    "resolve_backend",
    "triton_available",
]


def global_local_attention(
    global_q: torch.Tensor,
    global_k: torch.Tensor,
    global_v: torch.Tensor,
    long_q: torch.Tensor,
    long_k: torch.Tensor,
    long_v: torch.Tensor,
    side: SideInputs | CompactBatch,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None = None,
    backend: str = "auto",
    scale: float | None = None,
    *,
    local_radius: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ETC attention over a batch: `prepare_attention` then `attend`, for a single call.

    `side` holds the eight batched side inputs ([B, L, 2r+1], [B, G, G], [B, L, G], [B, G, L]) or
    a `CompactBatch`; `rel_key_table` is a^K [V, H, d], `rel_bias_table` the optional b [V, H];
    `scale` defaults to 1/sqrt(d); `local_radius`, when given, must match the side inputs'.
    Everything is checked (raising BatchError) before any kernel runs. A model that calls
    attention once per layer should prepare once per batch instead.
    """
    states = dict(global_q=global_q, global_k=global_k, global_v=global_v, long_q=long_q, long_k=long_k, long_v=long_v)
    _, heads, _, _, _, dim = check_states(states)
    resolve_backend(backend, long_q.device)  # an unknown name fails before the side inputs are read
    if not isinstance(side, (SideInputs, CompactBatch)):
        raise BatchError(
            f"side must be a graphattn SideInputs or CompactBatch, got {type(side).__name__}", path=("side",)
        )
    vocab = check_tables(rel_key_table, rel_bias_table, heads, dim, long_q.device)
    prepared = prepare_attention(
        side,
        num_heads=heads,
        head_dim=dim,
        vocab_size=vocab,
        backend=backend,
        device=long_q.device,
        local_radius=local_radius,
    )
    return prepared.attend(global_q, global_k, global_v, long_q, long_k, long_v, rel_key_table, rel_bias_table, scale)
