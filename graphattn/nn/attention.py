"""GlobalLocalAttention: ETC's fused global-local multi-head attention as an nn.Module.

Submodules follow HF BERT's names where the math is the same (query/key/value, output), so that
lifting BERT/RoBERTa weights is a rename: with no global tokens and a radius covering the whole
sequence this module is BERT self-attention plus its output projection.

The extension point for other attention patterns (graphattn.patterns): the module projects,
and an `AttentionPattern` attends. A batch's `PreparedAttention` is the ETC pattern; LongNet's
dilated attention is another. `memory` rows ([B, M, D], e.g. compressive memories) are keyed and
valued with the long-token projections and appended to the global KEYS only, so the pattern must
have been prepared for G + M global key slots (side inputs g2g [B, G, G+M], l2g [B, L, G+M]).

etcmodel's projection sharing (EtcConfig.projection_mode) decides which projection serves each
query side and attention kind; the module hands the kernels one tensor per role, the same
tensor wherever roles share a projection, so the shared modes run exactly as before.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from torch import nn

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.errors import GraphattnError
from graphattn.kernels import PreparedAttention, prepare_attention
from graphattn.nn.config import EtcConfig


class AttentionPattern(Protocol):
    """What a layer attends through: per-head states in, (global_out [B,H,G,d], long_out [B,H,L,d]) out.
    Keyword arguments (per-kind keys `l2g_k`, ..., `global_tables`) come only from encoders whose
    configuration does not share them; a pattern that cannot take them rejects such configs."""

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
        **per_kind: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


# Which projection module computes each role, per projection mode (see EtcConfig.projection_mode).
# Roles: the two query sides, and keys/values per attention kind (l2l: long tokens seen by long
# queries, l2g: global tokens seen by long queries, g2g, g2l). A role naming the same module as
# another is computed once and passed as the same tensor, so sharing costs nothing.
_ROLES = {
    "shared": dict(long_q="query", global_q="query", l2l="", l2g="", g2g="", g2l=""),
    "per_side": dict(long_q="query", global_q="global_query", l2l="", l2g="", g2g="global_", g2l="global_"),
    "per_kind": dict(long_q="query", global_q="global_query", l2l="", l2g="l2g_", g2g="global_", g2l="g2l_"),
    "per_token_kind": dict(long_q="query", global_q="global_query", l2l="", l2g="global_", g2g="global_", g2l=""),
}


class GlobalLocalAttention(nn.Module):
    """Projections, the relative tables a^K [V, H, d] (+ optional bias b [V, H]) per query side
    or shared, the attention kernel, and the output projection(s).

    Parameter names (what a loader maps onto): `query`, `key`, `value` are the long queries'
    and the l2l keys/values (BERT's names: with everything shared they are the only ones);
    `global_query`, `global_key`, `global_value` the global side's (g2g); `l2g_key`/`l2g_value`
    and `g2l_key`/`g2l_value` exist only when every kind has its own; `output` projects the
    long side (both when shared), `global_output` the global side; `relative_key_table` /
    `relative_bias_table` serve long queries (both when shared), `global_relative_key_table`
    / `global_relative_bias_table` global queries."""

    def __init__(self, config: EtcConfig):
        super().__init__()
        self.config = config
        hidden, heads, vocab = config.hidden_size, config.num_attention_heads, config.relative_vocab_size
        self.num_heads, self.head_dim = heads, config.head_dim
        self.roles = _ROLES[config.projection_mode]
        self.query = nn.Linear(hidden, hidden)
        if self.roles["global_q"] != "query":
            self.global_query = nn.Linear(hidden, hidden)
        for prefix in sorted(set(self.roles.values()) - {"query", "global_query"}):
            setattr(self, f"{prefix}key", nn.Linear(hidden, hidden))
            setattr(self, f"{prefix}value", nn.Linear(hidden, hidden))
        self.relative_key_table = nn.Parameter(torch.zeros(vocab, heads, self.head_dim))
        self.relative_bias_table = nn.Parameter(torch.zeros(vocab, heads)) if config.relative_bias else None
        if not config.share_relative_tables:
            self.global_relative_key_table = nn.Parameter(torch.zeros(vocab, heads, self.head_dim))
            self.global_relative_bias_table = nn.Parameter(torch.zeros(vocab, heads)) if config.relative_bias else None
            nn.init.normal_(self.global_relative_key_table, std=config.initializer_range)
        self.output = nn.Linear(hidden, hidden)
        if not config.share_att_output_projection:
            self.global_output = nn.Linear(hidden, hidden)
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

    def projections(
        self, global_hidden: torch.Tensor, long_hidden: torch.Tensor, memory: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Per-head states by role, [B, H, n, d]: global_q, long_q and {l2l, l2g, g2g, g2l}_{k, v}.
        Roles served by one module hold the same tensor (computed once). `memory` rows [B, M, D]
        are keyed and valued with the l2l projections and appended to both sides' global keys."""
        cache: dict[tuple[str, str], torch.Tensor] = {}

        def project(name: str, tokens: str) -> torch.Tensor:
            if (name, tokens) not in cache:
                x = global_hidden if tokens == "global" else long_hidden
                cache[name, tokens] = self._heads(getattr(self, name)(x))
            return cache[name, tokens]

        roles = self.roles
        states = {"global_q": project(roles["global_q"], "global"), "long_q": project(roles["long_q"], "long")}
        for kind, tokens in (("l2l", "long"), ("l2g", "global"), ("g2g", "global"), ("g2l", "long")):
            for part in ("key", "value"):
                states[f"{kind}_{part[0]}"] = project(roles[kind] + part, tokens)
        if memory is not None and memory.shape[1]:
            memory = memory.to(long_hidden.dtype)
            for part in "kv":
                extra = self._heads((self.key if part == "k" else self.value)(memory))
                g2g = states[f"g2g_{part}"]
                states[f"g2g_{part}"] = torch.cat((g2g, extra), dim=2)
                l2g = states[f"l2g_{part}"]
                states[f"l2g_{part}"] = states[f"g2g_{part}"] if l2g is g2g else torch.cat((l2g, extra), dim=2)
        return states

    def relative_tables(self) -> tuple[torch.Tensor, torch.Tensor | None, tuple | None]:
        """(a^K, b) of the long queries and, when they have their own, the global queries' pair."""
        if self.config.share_relative_tables:
            return self.relative_key_table, self.relative_bias_table, None
        return (
            self.relative_key_table,
            self.relative_bias_table,
            (self.global_relative_key_table, self.global_relative_bias_table),
        )

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
        s = self.projections(global_hidden, long_hidden, memory)
        key_table, bias_table, global_tables = self.relative_tables()
        extra: dict[str, object] = {}
        if global_tables is not None:
            extra["global_tables"] = global_tables
        for kind, same_as in (("l2g", "g2g"), ("g2l", "l2l")):
            for part in "kv":
                if s[f"{kind}_{part}"] is not s[f"{same_as}_{part}"]:
                    extra[f"{kind}_{part}"] = s[f"{kind}_{part}"]
        if extra and not isinstance(attention, PreparedAttention):
            _check_pattern_takes(attention, extra, self.config)
        global_out, long_out = attention.attend(
            s["global_q"], s["g2g_k"], s["g2g_v"], s["long_q"], s["l2l_k"], s["l2l_v"], key_table, bias_table, **extra
        )
        global_output = self.output if self.config.share_att_output_projection else self.global_output
        return global_output(self._merge(global_out)), self.output(self._merge(long_out))


def _check_pattern_takes(pattern: AttentionPattern, extra: dict[str, object], config: EtcConfig) -> None:
    """A pattern whose `attend` cannot take per-kind keys or per-side tables gets a clear error,
    not a TypeError from deep inside the layer."""
    parameters = inspect.signature(pattern.attend).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    missing = sorted(set(extra) - set(parameters))
    if missing:
        raise GraphattnError(
            f"the attention pattern {type(pattern).__name__} takes one set of keys/values and one relative table pair, "
            f"but this configuration (projections {config.projection_mode!r}, share_relative_tables="
            f"{config.share_relative_tables}) needs {', '.join(missing)}",
            path=("EtcConfig", "share_qkv_projections"),
        )
