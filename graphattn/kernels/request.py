"""What a backend builds its per-batch plan from (see prepared.py): sizes and validated tensors.

Each backend module exposes

    plan(request: PlanRequest) -> plan        once per batch: everything that depends on the structure
    run(plan, states, rel_key_table, rel_bias_table, scale) -> (global_out, long_out)   once per layer

and may set NATIVE_COMPACT = True when it reads a CompactBatch itself (otherwise the request
carries the dense tensors derived from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    num_global: int  # global queries
    num_global_keys: int  # global key slots; those past num_global are keys only
    num_long: int
    local_radius: int


@dataclass
class PlanRequest:
    """Validated device tensors and the sizes a plan depends on. `side` is None when only the
    compact form was given and the backend reads it natively."""

    shape: AttentionShape
    num_heads: int
    head_dim: int
    vocab_size: int
    device: torch.device
    side: SideInputs | None
    compact: CompactBatch | None
    options: dict[str, Any] = field(default_factory=dict)
    dtype: torch.dtype | None = None  # the states' expected dtype (a hint: plans may depend on it)

    def dense_side(self) -> SideInputs:
        """The eight dense tensors, derived from the compact form if that is all there is."""
        if self.side is None:
            from graphattn.kernels.structure import compact_to_side

            self.side = compact_to_side(self.compact)
        return self.side


def direct_request(
    side: SideInputs,
    global_q: torch.Tensor,
    global_k: torch.Tensor,
    long_q: torch.Tensor,
    rel_key_table: torch.Tensor,
    **options: Any,
) -> PlanRequest:
    """A request for a backend's one-call `attention(...)` (tests, benchmarks): no checks."""
    batch, heads, num_global, dim = global_q.shape
    shape = AttentionShape(batch, num_global, global_k.shape[2], long_q.shape[2], side.local_radius)
    return PlanRequest(shape, heads, dim, rel_key_table.shape[0], long_q.device, side, None, options, long_q.dtype)
