"""GlobalLocalAttention: ETC's fused global-local multi-head attention as an nn.Module.

Submodules follow HF BERT's names where the math is the same (query/key/value, output), so that
lifting BERT/RoBERTa weights is a rename: with no global tokens and a radius covering the whole
sequence this module is BERT self-attention plus its output projection.

The extension point for other attention patterns (graphattn.patterns): the module projects,
and an `AttentionPattern` attends. A batch's `PreparedAttention` is the ETC pattern; LongNet's
dilated attention is another. `memory` rows ([B, M, D], e.g. compressive memories) are keyed and
valued with the long-token projections and appended to the global KEYS only, so the pattern must
have been prepared for G + M global key slots (side inputs g2g [B, G, G+M], l2g [B, L, G+M]).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.kernels import PreparedAttention, prepare_attention
from graphattn.nn.config import EtcConfig


class AttentionPattern(Protocol):
    """What a layer attends through: per-head states in, (global_out [B,H,G,d], long_out [B,H,L,d]) out."""

    def attend(
        self,
        global_q: torch.Tensor,
        global_k: torch.Tensor,
        global_v: torch.Tensor,
        long_q: torch.Tensor,
        long_k: torch.Tensor,
        long_v: torch.Tensor,
        rel_key_table: torch.Tensor,
        rel_bias_table: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class GlobalLocalAttention(nn.Module):
    """Projections, the relative key table a^K [V, H, d] (+ optional bias b [V, H]), the
    attention kernel, and the output projection. Global and long share Q/K/V unless
    `share_qkv_projections` is off, in which case global tokens get their own."""

    def __init__(self, config: EtcConfig):
        super().__init__()
        self.config = config
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads, self.head_dim = heads, config.head_dim
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        if not config.share_qkv_projections:
            self.global_query = nn.Linear(hidden, hidden)
            self.global_key = nn.Linear(hidden, hidden)
            self.global_value = nn.Linear(hidden, hidden)
        self.relative_key_table = nn.Parameter(torch.zeros(config.relative_vocab_size, heads, self.head_dim))
        self.relative_bias_table = (
            nn.Parameter(torch.zeros(config.relative_vocab_size, heads)) if config.relative_bias else None
        )
        self.output = nn.Linear(hidden, hidden)
        nn.init.normal_(self.relative_key_table, std=config.initializer_range)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n, H*d] -> [B, H, n, d]."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, n, d] -> [B, n, H*d]."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)

    def prepare(self, structure: SideInputs | CompactBatch, device: torch.device | None = None) -> PreparedAttention:
        """The batch's attention, prepared once for every layer of this configuration, for the
        dtype the projections will produce (the autocast dtype when autocast is on)."""
        cfg = self.config
        device = torch.device(device) if device is not None else self.query.weight.device
        dtype = (
            torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else self.query.weight.dtype
        )
        return prepare_attention(
            structure,
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            vocab_size=cfg.relative_vocab_size,
            backend=cfg.attention_backend,
            device=device,
            local_radius=cfg.local_radius,
            dtype=dtype,
        )

    def projections(self, global_hidden: torch.Tensor, long_hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-head (global_q, global_k, global_v, long_q, long_k, long_v), [B, H, n, d]."""
        shared = self.config.share_qkv_projections
        q_g = self.query if shared else self.global_query
        k_g = self.key if shared else self.global_key
        v_g = self.value if shared else self.global_value
        global_qkv = tuple(self._heads(proj(global_hidden)) for proj in (q_g, k_g, v_g))
        long_qkv = tuple(self._heads(proj(long_hidden)) for proj in (self.query, self.key, self.value))
        return global_qkv + long_qkv

    def forward(
        self,
        global_hidden: torch.Tensor,
        long_hidden: torch.Tensor,
        attention: AttentionPattern | SideInputs | CompactBatch,
        memory: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(global [B, G, D], long [B, L, D], pattern[, memory [B, M, D]]) -> attended (global,
        long), same shapes. Side inputs instead of a pattern are prepared here, for this call only."""
        if isinstance(attention, (SideInputs, CompactBatch)):
            attention = self.prepare(attention, long_hidden.device)
        global_q, global_k, global_v, long_q, long_k, long_v = self.projections(global_hidden, long_hidden)
        if memory is not None and memory.shape[1]:
            memory = memory.to(long_hidden.dtype)
            global_k = torch.cat((global_k, self._heads(self.key(memory))), dim=2)
            global_v = torch.cat((global_v, self._heads(self.value(memory))), dim=2)
        global_out, long_out = attention.attend(
            global_q, global_k, global_v, long_q, long_k, long_v, self.relative_key_table, self.relative_bias_table
        )
        return self.output(self._merge(global_out)), self.output(self._merge(long_out))
