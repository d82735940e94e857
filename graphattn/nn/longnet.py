"""LongNetAttention: multi-head dilated attention (kernels/dilated.py) as an nn.Module.

Projection names follow GlobalLocalAttention's (query/key/value/output), so weights move between
the two by name. With a process group it runs sequence-parallel: each rank passes its own chunk
of the sequence and gets its chunk of the output (kernels/dilated_parallel.py).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from graphattn.errors import GraphattnError
from graphattn.kernels.dilated import LONGNET_SCHEDULE, check_schedule, dilated_attention
from graphattn.kernels.dilated_parallel import dilated_attention_parallel


class LongNetAttention(nn.Module):
    """hidden [B, L, D] -> [B, L, D] with a mixture of (segment, dilation) pairs."""

    def __init__(self, hidden_size: int, num_heads: int, pairs: Sequence[Sequence[int]] = LONGNET_SCHEDULE, *, causal: bool = False):
        super().__init__()
        if hidden_size % num_heads:
            raise GraphattnError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}", path=("LongNetAttention", "hidden_size"))
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.pairs = check_schedule(pairs)
        self.causal = causal
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        *,
        group=None,
        valid_length: int | None = None,
    ) -> torch.Tensor:
        """key_padding [B, L] (False = padding) on one process; with `group`, `hidden` is this
        rank's chunk and `valid_length` the true length of the whole sequence."""
        q, k, v = (self._heads(proj(hidden)) for proj in (self.query, self.key, self.value))
        if group is None:
            out = dilated_attention(q, k, v, self.pairs, causal=self.causal, key_padding=key_padding)
        else:
            if key_padding is not None:
                raise GraphattnError("key_padding is not supported sequence-parallel; pass valid_length", path=("key_padding",))
            out = dilated_attention_parallel(q, k, v, self.pairs, causal=self.causal, valid_length=valid_length, group=group)
        batch, _, length, _ = out.shape
        return self.output(out.transpose(1, 2).reshape(batch, length, -1))
