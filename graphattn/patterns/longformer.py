"""Longformer encoder mode: sliding windows (per layer), dilation (per head per layer) and
task-chosen global positions with their own Q/K/V projections (Beltagy et al. 2020; docs/DESIGN.md §8).

In graphattn terms a Longformer input is an ETC input whose global tokens are copies of chosen
long positions (CLS, question tokens, candidates: `global: per_token` types and prefix tokens of
a schema such as schemas/longformer.yaml; `longformer_inputs` finds the position each global
copies). The math is HF transformers' LongformerSelfAttention, reproduced exactly:

* a non-global query i attends, in one softmax, the keys of its window (i - d*w/2 ... i + d*w/2
  in steps of its head's dilation d, real tokens only) that are NOT global, plus every global
  position once, all with the local projections Q_s, K_s, V_s;
* a global position's output row comes from the global projections instead: Q_g of that
  position against K_g, V_g of every real token;
* padded rows come out as zeros.

Both parts run on the ETC kernels through graphattn.patterns.sliding (dilated windows folded into
the batch, heads grouped by dilation, the global positions as key-only global slots), so memory
is O(L w + L G), never [L, L]. `LongformerPattern` prepares a batch once (global positions
checked, every distinct window of the layers prepared) and each layer attends through it.

Dilation counts the stride (1 = contiguous, 2 = every other token), as HF's and allenai's
`attention_dilation`; the paper's Table 12 counts gaps (its "dilation 0..3" are our 1..4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphattn.contract import EtcBatch
from graphattn.errors import BatchError, GraphattnError
from graphattn.kernels import PreparedAttention
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEmbeddings, EtcLayer
from graphattn.patterns.sliding import PreparedWindows, global_rows_attention, prepare_global_rows, prepare_windows

__all__ = [
    "LongformerConfig",
    "LongformerAttention",
    "LongformerLayer",
    "LongformerEmbeddings",
    "LongformerEncoder",
    "LongformerPattern",
    "check_global_positions",
    "lm_schedule",
    "load_hf_self_attention",
]


def _fail(message: str, *path: Any) -> None:
    raise GraphattnError(message, path=("LongformerConfig", *path))


def _per_layer_windows(value: Any, layers: int) -> tuple[int, ...]:
    windows = (value,) * layers if isinstance(value, int) else tuple(value)
    if len(windows) != layers:
        _fail(
            f"{len(windows)} windows given for num_hidden_layers={layers}; give one int or one per layer",
            "attention_window",
        )
    for i, w in enumerate(windows):
        if not isinstance(w, int) or w < 2 or w % 2:
            _fail(
                f"a window must be an even int >= 2 (w/2 keys each side, as HF's attention_window), got {w!r}",
                "attention_window",
                i,
            )
    return windows


def _per_head_dilations(value: Any, layers: int, heads: int) -> tuple[tuple[int, ...], ...]:
    rows = (value,) * layers if isinstance(value, int) else tuple(value)
    if len(rows) != layers:
        _fail(
            f"{len(rows)} dilation rows given for num_hidden_layers={layers}; give one int, or per layer an int or "
            "one per head",
            "attention_dilation",
        )
    out = []
    for i, row in enumerate(rows):
        row = (row,) * heads if isinstance(row, int) else tuple(row)
        if len(row) != heads:
            _fail(f"layer {i} has {len(row)} dilations for num_attention_heads={heads}", "attention_dilation", i)
        for j, d in enumerate(row):
            if not isinstance(d, int) or d < 1:
                _fail(f"a dilation is a stride >= 1 (1 = contiguous window), got {d!r}", "attention_dilation", i, j)
        out.append(row)
    return tuple(out)


def lm_schedule(num_layers: int, num_heads: int, first_window: int, last_window: int, dilated_heads: int = 2):
    """(windows, dilations) of the paper's character-LM models (section 4.1, Table 12): windows
    grow with depth from `first_window` to `last_window` (the paper gives only the ends; linear
    in between, rounded to even here); the lower half of the layers is undilated and the upper
    half, split in three, dilates the last `dilated_heads` heads by strides 2, 3, 4 (Table 12's
    gap counts 1, 2, 3). For 12 layers: strides 2 on layers 6-7, 3 on 8-9, 4 on 10-11; for 30:
    15-19, 20-24, 25-29, as in the paper."""
    if num_layers == 1:
        windows = (first_window,)
    else:
        step = (last_window - first_window) / (num_layers - 1)
        windows = tuple(2 * round((first_window + step * i) / 2) for i in range(num_layers))
    half = num_layers // 2
    upper = max(num_layers - half, 1)
    dilations = []
    for layer in range(num_layers):
        stride = 1 if layer < half else 2 + min(2, (layer - half) * 3 // upper)
        dilations.append(tuple(stride if head >= num_heads - dilated_heads else 1 for head in range(num_heads)))
    return windows, tuple(dilations)


@dataclass
class LongformerConfig(EtcConfig):
    """EtcConfig plus Longformer's pattern. `attention_window` is w (even; w/2 keys each side),
    one int or one per layer; `attention_dilation` one int, or per layer an int or one per head.
    Global positions get their own Q/K/V unless `share_qkv_projections` (the paper's "no linear
    proj." ablation). `local_radius` and the relative-label settings are not used: Longformer
    has no relative labels and takes its windows from here, not from compiled side inputs."""

    attention_window: Any = 512
    attention_dilation: Any = 1
    share_qkv_projections: bool = False
    max_absolute_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        self.attention_window = _per_layer_windows(self.attention_window, self.num_hidden_layers)
        self.attention_dilation = _per_head_dilations(
            self.attention_dilation, self.num_hidden_layers, self.num_attention_heads
        )

    @classmethod
    def char_lm_small(cls, **overrides: Any) -> LongformerConfig:
        """The paper's small character-LM model (12 layers, 8 heads, hidden 512) with its phase-1
        schedule: windows 32 -> 8192, dilation on 2 heads of the upper layers."""
        windows, dilations = lm_schedule(12, 8, 32, 8192)
        small = dict(
            vocab_size=256,
            hidden_size=512,
            num_hidden_layers=12,
            num_attention_heads=8,
            intermediate_size=2048,
            attention_window=windows,
            attention_dilation=dilations,
            max_absolute_position_embeddings=0,
        )
        return cls(**{**small, **overrides})


def check_global_positions(global_positions: torch.Tensor, long_mask: torch.Tensor) -> None:
    """[B, G] long positions of the global tokens (-1: an empty slot) against the [B, L] mask of
    real tokens: in range, on real tokens, no position twice in a row."""
    batch, length = long_mask.shape
    if global_positions.dim() != 2 or global_positions.shape[0] != batch or global_positions.is_floating_point():
        raise BatchError(
            f"global_positions must be an integer tensor [batch={batch}, G], got {global_positions.dtype} "
            f"{list(global_positions.shape)}",
            path=("global_positions",),
        )
    if global_positions.numel() == 0:
        return
    bad = (global_positions < -1) | (global_positions >= length)
    if bool(bad.any()):
        where = torch.nonzero(bad)[0].tolist()
        raise BatchError(
            f"global position {int(global_positions[tuple(where)])} at {where} is outside [0, {length}) (-1 marks an "
            "empty slot)",
            path=("global_positions",),
        )
    valid = global_positions >= 0
    on_padding = valid & ~torch.gather(long_mask, 1, global_positions.clamp(min=0))
    if bool(on_padding.any()):
        where = torch.nonzero(on_padding)[0].tolist()
        raise BatchError(
            f"global position {int(global_positions[tuple(where)])} at {where} is a padding token",
            path=("global_positions",),
        )
    ordered = (
        torch.where(
            valid, global_positions, -1 - torch.arange(global_positions.shape[1], device=global_positions.device)
        )
        .sort(dim=1)
        .values
    )
    repeated = ordered[:, 1:] == ordered[:, :-1]
    if bool(repeated.any()):
        row, col = torch.nonzero(repeated)[0].tolist()
        raise BatchError(
            f"long position {int(ordered[row, col])} is global twice in batch row {row}", path=("global_positions",)
        )


def _gather_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, H, L, d] at [B, G] positions -> [B, H, G, d]."""
    return torch.gather(x, 2, positions[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


@dataclass
class LongformerPattern:
    """A batch's Longformer attention, prepared once for every layer: the checked global positions
    and, per distinct (radius, dilations) among the layers, the prepared dilated windows; the
    global rows' preparation. `attend` is one layer's attention."""

    positions: torch.Tensor  # [B, G] long positions of the global slots, empty slots at 0
    slots: torch.Tensor  # [B, G] bool, False: empty slot
    target: torch.Tensor  # [B, G] positions, empty slots at the dummy column L
    long_mask: torch.Tensor  # [B, L] bool
    has_globals: bool
    windows: dict[tuple[int, tuple[int, ...]], PreparedWindows] = field(default_factory=dict)
    global_rows: PreparedAttention | None = None

    @classmethod
    def prepare(
        cls,
        global_positions: torch.Tensor,
        long_mask: torch.Tensor | None,
        *,
        windows: Sequence[tuple[int, Sequence[int]]],
        num_heads: int,
        head_dim: int,
        backend: str = "auto",
    ) -> LongformerPattern:
        """`global_positions` [B, G] (-1: empty slot), `long_mask` [B, L] (None: all real),
        `windows` the (radius, dilations per head) of the layers that will attend through it."""
        if long_mask is None:
            raise BatchError("long_mask is needed to prepare a Longformer pattern", path=("long_mask",))
        batch, length = long_mask.shape
        long_mask = long_mask.bool()
        global_positions = global_positions.to(long_mask.device).long()
        check_global_positions(global_positions, long_mask)
        slots = global_positions >= 0
        # Empty slots point at a dummy column L, so that scatters never touch a real position.
        target = torch.where(slots, global_positions, length)
        is_global = torch.zeros(batch, length + 1, dtype=torch.bool, device=long_mask.device).scatter_(1, target, True)[
            :, :length
        ]
        pattern = cls(global_positions.clamp(min=0), slots, target, long_mask, bool(slots.any()))
        window_keys = long_mask & ~is_global  # a global position is reached as a global key, not in the window
        for radius, dilations in windows:
            key = (int(radius), tuple(int(d) for d in dilations))
            if key not in pattern.windows:
                pattern.windows[key] = prepare_windows(window_keys, key[0], key[1], head_dim, slots, backend=backend)
        if pattern.has_globals:
            pattern.global_rows = prepare_global_rows(
                long_mask, global_positions.shape[1], num_heads, head_dim, backend=backend
            )
        return pattern

    def attend(
        self,
        global_q: torch.Tensor,
        global_k: torch.Tensor,
        global_v: torch.Tensor,
        long_q: torch.Tensor,
        long_k: torch.Tensor,
        long_v: torch.Tensor,
        *,
        radius: int,
        dilations: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer: long_q/k/v are the local projections of every token [B, H, L, d]; global_q
        the global projection of the global positions [B, H, G, d], global_k / global_v that of
        every token [B, H, L, d]. Returns (global rows [B, H, G, d], every row [B, H, L, d]: the
        window rows with the global positions' rows put in and padding zeroed)."""
        windows = self.windows[(int(radius), tuple(int(d) for d in dilations))]
        global_keys, global_values = (_gather_positions(x, self.positions) for x in (long_k, long_v))  # K_s, V_s, as HF
        out = windows.attend(long_q, long_k, long_v, global_keys, global_values)
        global_out = long_q.new_zeros(global_q.shape)
        if self.has_globals:
            global_out = global_rows_attention(global_q, global_k, global_v, self.long_mask, prepared=self.global_rows)
            heads, dim = out.shape[1], out.shape[3]
            index = self.target[:, None, :, None].expand(-1, heads, -1, dim)
            out = torch.nn.functional.pad(out, (0, 0, 0, 1)).scatter(2, index, global_out)[:, :, : out.shape[2]]
        return global_out, out * self.long_mask[:, None, :, None].to(out.dtype)


class LongformerAttention(nn.Module):
    """hidden [B, L, D] -> [B, L, D] for layer `layer` of `config`; submodule names follow
    GlobalLocalAttention's (query/key/value, global_*, output)."""

    def __init__(self, config: LongformerConfig, layer: int = 0):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads, self.head_dim = heads, config.head_dim
        self.radius = config.attention_window[layer] // 2
        self.dilations = config.attention_dilation[layer]
        self.backend = config.attention_backend
        self.shared = config.share_qkv_projections
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        if not self.shared:
            self.global_query, self.global_key, self.global_value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)

    def copy_local_to_global(self) -> None:
        """Q_g, K_g, V_g <- Q_s, K_s, V_s: the paper's initialisation of the global projections."""
        if self.shared:
            return
        with torch.no_grad():
            for local, glob in (
                (self.query, self.global_query),
                (self.key, self.global_key),
                (self.value, self.global_value),
            ):
                glob.weight.copy_(local.weight)
                glob.bias.copy_(local.bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def prepare(self, global_positions: torch.Tensor, long_mask: torch.Tensor) -> LongformerPattern:
        """This layer's pattern over a batch (an encoder prepares one for all its layers)."""
        return LongformerPattern.prepare(
            global_positions,
            long_mask,
            windows=[(self.radius, self.dilations)],
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            backend=self.backend,
        )

    def context(
        self, hidden: torch.Tensor, pattern: LongformerPattern | torch.Tensor, long_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The attended values before the output projection, [B, L, D]: what HF's
        LongformerSelfAttention returns. `pattern` is a batch's LongformerPattern, or its global
        positions [B, G] (-1: empty slot) with `long_mask` [B, L] (True/1 = real; None: all real)."""
        batch, length, _ = hidden.shape
        if not isinstance(pattern, LongformerPattern):
            long_mask = (
                torch.ones(batch, length, dtype=torch.bool, device=hidden.device) if long_mask is None else long_mask
            )
            pattern = self.prepare(pattern, long_mask)
        query, key, value = (
            (self.query, self.key, self.value)
            if self.shared
            else (self.global_query, self.global_key, self.global_value)
        )
        picked = torch.gather(hidden, 1, pattern.positions[:, :, None].expand(-1, -1, hidden.shape[2]))
        long_qkv = (self._heads(proj(hidden)) for proj in (self.query, self.key, self.value))
        global_q, global_k, global_v = self._heads(query(picked)), self._heads(key(hidden)), self._heads(value(hidden))
        _, out = pattern.attend(global_q, global_k, global_v, *long_qkv, radius=self.radius, dilations=self.dilations)
        return out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)

    def forward(
        self, hidden: torch.Tensor, pattern: LongformerPattern | torch.Tensor, long_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.output(self.context(hidden, pattern, long_mask))


_HF_NAMES = {
    "query": "query",
    "key": "key",
    "value": "value",
    "query_global": "global_query",
    "key_global": "global_key",
    "value_global": "global_value",
}


def load_hf_self_attention(attention: LongformerAttention, state: Mapping[str, torch.Tensor]) -> None:
    """Copy an HF LongformerSelfAttention state dict (query, key, value, query_global, key_global,
    value_global) into `attention`; the output projection is HF's LongformerSelfOutput, not here."""
    own = dict(attention.named_parameters())
    for hf_name, name in _HF_NAMES.items():
        if attention.shared and name.startswith("global_"):
            continue
        for part in ("weight", "bias"):
            key = f"{hf_name}.{part}"
            if key not in state:
                raise GraphattnError(
                    f"missing {key} in the HF state dict (keys: {', '.join(sorted(state)[:8])}...)", path=(key,)
                )
            if tuple(state[key].shape) != tuple(own[f"{name}.{part}"].shape):
                raise GraphattnError(
                    f"{key} has shape {list(state[key].shape)}, expected {list(own[f'{name}.{part}'].shape)}",
                    path=(key,),
                )
            with torch.no_grad():
                own[f"{name}.{part}"].copy_(state[key])


class LongformerLayer(EtcLayer):
    """EtcLayer's post-LN block (`residual_block`: x = LN(x + attn); x = LN(x + FFN)) around
    LongformerAttention: one sequence, the global positions inside it."""

    def __init__(self, config: LongformerConfig, layer: int):
        super().__init__(config, LongformerAttention(config, layer))

    def forward(
        self, hidden: torch.Tensor, pattern: LongformerPattern | torch.Tensor, long_mask: torch.Tensor | None = None
    ) -> torch.Tensor:  # type: ignore[override]
        return self.residual_block(hidden, self.attention(hidden, pattern, long_mask))


class LongformerEmbeddings(EtcEmbeddings):
    """EtcEmbeddings' long half (word + type + absolute position, LayerNorm): a global token is a
    long position, so it has no embedding of its own and no unused parameters are left."""

    def __init__(self, config: LongformerConfig):
        super().__init__(config)
        del self.global_position_embeddings, self.global_layer_norm

    def forward(self, batch: EtcBatch) -> torch.Tensor:  # type: ignore[override]
        return self._embed(
            batch.long_token_ids.long(), batch.long_type_ids.long(), self.position_embeddings, self.layer_norm
        )


class LongformerEncoder(nn.Module):
    """(EtcBatch, global_positions [B, G]) -> (global_hidden [B, G, D], long_hidden [B, L, D]).

    Only the long sequence is encoded: a global token is its long position, so global_hidden is
    long_hidden gathered at `global_positions` (zeros for empty slots), aligned with the batch's
    global tokens when the positions come from `longformer_inputs.collate_longformer`."""

    def __init__(self, config: LongformerConfig):
        super().__init__()
        if not isinstance(config, LongformerConfig):
            raise GraphattnError(
                f"LongformerEncoder needs a LongformerConfig, got {type(config).__name__}", path=("config",)
            )
        self.config = config
        self.embeddings = LongformerEmbeddings(config)
        self.layer = nn.ModuleList(LongformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.apply(self._init_weights)
        for layer in self.layer:
            layer.attention.copy_local_to_global()

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation, as EtcEncoder's."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def _check_batch(self, batch: EtcBatch) -> None:
        cfg = self.config
        for name, limit, config_field in (
            ("long_token_ids", cfg.vocab_size, "vocab_size"),
            ("long_type_ids", cfg.type_vocab_size, "type_vocab_size"),
        ):
            ids = getattr(batch, name)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
                raise BatchError(
                    f"ids must lie in [0, {limit}) (the model's {config_field}); "
                    f"found {int(ids.min())}..{int(ids.max())}",
                    path=(name,),
                )
        positions = cfg.max_absolute_position_embeddings
        longest = batch.long_token_ids.shape[1]
        if positions and longest > positions:
            raise BatchError(
                f"long length {longest} exceeds max_absolute_position_embeddings={positions}", path=("long_token_ids",)
            )

    def prepare(self, global_positions: torch.Tensor, long_mask: torch.Tensor) -> LongformerPattern:
        """One pattern for all layers: positions checked once, each distinct window prepared once."""
        cfg = self.config
        windows = [(layer.attention.radius, layer.attention.dilations) for layer in self.layer]
        return LongformerPattern.prepare(
            global_positions,
            long_mask,
            windows=windows,
            num_heads=cfg.num_attention_heads,
            head_dim=cfg.head_dim,
            backend=cfg.attention_backend,
        )

    def forward(self, batch: EtcBatch, global_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_batch(batch)
        long_mask = batch.long_input_mask != 0
        global_positions = global_positions.to(long_mask.device).long()
        pattern = self.prepare(global_positions, long_mask)
        hidden = self.embeddings(batch)
        for layer in self.layer:
            if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden = checkpoint(layer, hidden, pattern, use_reentrant=False)
            else:
                hidden = layer(hidden, pattern)
        slots = (global_positions >= 0)[:, :, None]
        picked = torch.gather(hidden, 1, global_positions.clamp(min=0)[:, :, None].expand(-1, -1, hidden.shape[2]))
        return picked * slots.to(hidden.dtype), hidden
