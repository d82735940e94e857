"""LongNet: multi-head dilated attention (patterns/dilated.py) as an attention pattern and an nn.Module.

`LongNetPattern` has the `attend` interface of a prepared ETC attention, so an ETC layer
(`graphattn.nn.EtcLayer`, with no global tokens) runs LongNet attention through it unchanged:
its long-token projections feed `dilated_attention`, its relative tables are unused (LongNet has
no relative labels). `LongNetAttention` is the stand-alone module; its projection names follow
GlobalLocalAttention's (query/key/value/output), so weights move between the two by name. With a
process group it runs sequence-parallel: each rank passes its own chunk of the sequence and gets
its chunk of the output (patterns/dilated_parallel.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graphattn.errors import GraphattnError
from graphattn.patterns.dilated import LONGNET_SCHEDULE, check_schedule, dilated_attention
from graphattn.patterns.dilated_parallel import dilated_attention_parallel


@dataclass
class LongNetPattern:
    """Dilated attention over the long tokens for `pairs` of (segment, dilation); `key_padding`
    [B, L] (False = padding) on one process, or `group` + `valid_length` sequence-parallel.
    Global queries (there should be none) get zeros."""

    pairs: tuple[tuple[int, int], ...] = LONGNET_SCHEDULE
    causal: bool = False
    key_padding: torch.Tensor | None = None
    group: object = None
    valid_length: int | None = None

    def __post_init__(self) -> None:
        self.pairs = check_schedule(self.pairs)
        if self.group is not None and self.key_padding is not None:
            raise GraphattnError(
                "key_padding is not supported sequence-parallel; pass valid_length", path=("key_padding",)
            )

    def attend(
        self,
        global_q: torch.Tensor,
        global_k: torch.Tensor,
        global_v: torch.Tensor,
        long_q: torch.Tensor,
        long_k: torch.Tensor,
        long_v: torch.Tensor,
        rel_key_table: torch.Tensor | None = None,
        rel_bias_table: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.group is None:
            out = dilated_attention(
                long_q, long_k, long_v, self.pairs, causal=self.causal, key_padding=self.key_padding, scale=scale
            )
        else:
            out = dilated_attention_parallel(
                long_q,
                long_k,
                long_v,
                self.pairs,
                causal=self.causal,
                valid_length=self.valid_length,
                group=self.group,
                scale=scale,
            )
        return torch.zeros_like(global_q), out


class LongNetAttention(nn.Module):
    """hidden [B, L, D] -> [B, L, D] with a mixture of (segment, dilation) pairs."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        pairs: Sequence[Sequence[int]] = LONGNET_SCHEDULE,
        *,
        causal: bool = False,
    ):
        super().__init__()
        if hidden_size % num_heads:
            raise GraphattnError(
                f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}",
                path=("LongNetAttention", "hidden_size"),
            )
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
        pattern = LongNetPattern(self.pairs, self.causal, key_padding, group, valid_length)
        q, k, v = (self._heads(proj(hidden)) for proj in (self.query, self.key, self.value))
        no_globals = q[:, :, :0]
        _, out = pattern.attend(no_globals, no_globals, no_globals, q, k, v)
        batch, _, length, _ = out.shape
        return self.output(out.transpose(1, 2).reshape(batch, length, -1))
