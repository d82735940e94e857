"""EtcLayer and EtcEncoder: ETC's post-LN transformer over global and long sequences."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphattn.compact import CompactBatch
from graphattn.contract import EtcBatch, SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import PreparedAttention
from graphattn.nn.attention import AttentionPattern, GlobalLocalAttention
from graphattn.nn.config import EtcConfig

_ACTIVATIONS = {"gelu": lambda: nn.GELU(), "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "relu": lambda: nn.ReLU()}


class EtcLayer(nn.Module):
    """Post-LN: x = LN(x + attn(x)); x = LN(x + FFN(x)), FFN = Linear -> act -> Linear.

    The long side uses `attention_norm`, `intermediate`, `output`, `output_norm`; the global
    side the same modules, or its own `global_attention_norm` (share_attention_norm off, as in
    etcmodel) and `global_intermediate`, `global_output`, `global_output_norm`
    (share_feed_forward_params off). The attention runs through the pattern it is given (a
    batch's PreparedAttention, or another pattern of graphattn.patterns), optionally over extra
    key/value `memory` rows; a pattern with its own attention module passes it in and reuses
    `residual_block`."""

    def __init__(self, config: EtcConfig, attention: nn.Module | None = None):
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.attention = attention if attention is not None else GlobalLocalAttention(config)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, config.intermediate_size)
        self.activation = _ACTIVATIONS[config.hidden_act]()
        self.output = nn.Linear(config.intermediate_size, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)
        if not config.share_attention_norm:
            self.global_attention_norm = nn.LayerNorm(hidden, eps=eps)
        if not config.share_feed_forward_params:
            self.global_intermediate = nn.Linear(hidden, config.intermediate_size)
            self.global_output = nn.Linear(config.intermediate_size, hidden)
            self.global_output_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _side(self, name: str, side: str) -> nn.Module:
        """The module `name` of the long side, or the global side's own when it has one."""
        own = getattr(self, f"global_{name}", None) if side == "global" else None
        return own if own is not None else getattr(self, name)

    def _feed_forward(self, x: torch.Tensor, side: str = "long") -> torch.Tensor:
        up, down, norm = (self._side(name, side) for name in ("intermediate", "output", "output_norm"))
        return norm(x + self.dropout(down(self.activation(up(x)))))

    def residual_block(self, hidden: torch.Tensor, attended: torch.Tensor, side: str = "long") -> torch.Tensor:
        """Everything after attention, for the "long" or "global" side: x = LN(x + dropout(attended));
        x = LN(x + FFN(x))."""
        return self._feed_forward(self._side("attention_norm", side)(hidden + self.dropout(attended)), side)

    def forward(
        self,
        global_hidden: torch.Tensor,
        long_hidden: torch.Tensor,
        attention: AttentionPattern | SideInputs | CompactBatch,
        memory: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        global_att, long_att = self.attention(global_hidden, long_hidden, attention, memory)
        return self.residual_block(global_hidden, global_att, "global"), self.residual_block(long_hidden, long_att)


class EtcEmbeddings(nn.Module):
    """Token and type embeddings shared by both sequences (so word pieces can be put in the
    global memory); optional absolute positions, separate tables for global and long as in
    etcmodel; one LayerNorm per sequence. With `embedding_size` != hidden_size the token
    embeddings are that wide and `embedding_projection` brings them to hidden_size before the
    type and position embeddings are added (etcmodel's order)."""

    def __init__(self, config: EtcConfig):
        super().__init__()
        width = config.embedding_size or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width)
        self.embedding_projection = nn.Linear(width, config.hidden_size) if width != config.hidden_size else None
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        positions = config.max_absolute_position_embeddings
        self.position_embeddings = nn.Embedding(positions, config.hidden_size) if positions else None
        self.global_position_embeddings = nn.Embedding(positions, config.hidden_size) if positions else None
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.global_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _embed(self, token_ids, type_ids, positions: nn.Embedding | None, norm: nn.LayerNorm) -> torch.Tensor:
        x = self.word_embeddings(token_ids)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)
        x = x + self.token_type_embeddings(type_ids)
        if positions is not None:
            x = x + positions(torch.arange(token_ids.shape[1], device=token_ids.device))[None]
        return self.dropout(norm(x))

    def forward(self, batch: EtcBatch) -> tuple[torch.Tensor, torch.Tensor]:
        global_x = self._embed(
            batch.global_token_ids.long(),
            batch.global_type_ids.long(),
            self.global_position_embeddings,
            self.global_layer_norm,
        )
        long_x = self._embed(
            batch.long_token_ids.long(), batch.long_type_ids.long(), self.position_embeddings, self.layer_norm
        )
        return global_x, long_x


class EtcEncoder(nn.Module):
    """EtcBatch -> (global_hidden [B, G, D], long_hidden [B, L, D]).

    Padded rows come out as whatever padding attended to (padding attends to padding, as in
    the reference); use the batch's input masks to ignore them."""

    def __init__(self, config: EtcConfig):
        super().__init__()
        self.config = config
        self.embeddings = EtcEmbeddings(config)
        self.layer = nn.ModuleList(EtcLayer(config) for _ in range(config.num_hidden_layers))
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @torch.compiler.disable  # reads tensor values; torch.compile runs around it
    def check_batch(self, batch: EtcBatch) -> None:
        """Errors a user can act on, before embedding lookups fail with an index error."""
        cfg = self.config
        if batch.vocab_size > cfg.relative_vocab_size:
            raise BatchError(
                f"the batch uses {batch.vocab_size} relative labels but the model's relative_vocab_size is "
                f"{cfg.relative_vocab_size}",
                path=("vocab_size",),
            )
        if batch.side is None and batch.compact is None:
            raise BatchError("the batch has neither dense side inputs nor a compact structure", path=("side",))
        radius = batch.compact.local_radius if batch.compact is not None else batch.side.local_radius
        if radius != cfg.local_radius:
            raise BatchError(
                f"the batch was compiled with local radius {radius} but the model's local_radius is {cfg.local_radius}",
                path=("side", "l2l_att_mask"),
            )
        for name, limit, field in (
            ("long_token_ids", cfg.vocab_size, "vocab_size"),
            ("global_token_ids", cfg.vocab_size, "vocab_size"),
            ("long_type_ids", cfg.type_vocab_size, "type_vocab_size"),
            ("global_type_ids", cfg.type_vocab_size, "type_vocab_size"),
        ):
            ids = getattr(batch, name)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
                raise BatchError(
                    f"ids must lie in [0, {limit}) (the model's {field}); found {int(ids.min())}..{int(ids.max())}",
                    path=(name,),
                )
        positions = cfg.max_absolute_position_embeddings
        longest = max(batch.long_token_ids.shape[1], batch.global_token_ids.shape[1])
        if positions and longest > positions:
            raise BatchError(
                f"sequence length {longest} exceeds max_absolute_position_embeddings={positions}",
                path=("long_token_ids",),
            )

    def prepare(self, batch: EtcBatch) -> PreparedAttention:
        """The batch's attention, validated and planned once for all layers (they share the
        configuration). The compact structure is used when the batch has one."""
        structure = batch.compact if batch.compact is not None else batch.side.to_torch()
        return self.layer[0].attention.prepare(structure, batch.long_token_ids.device)

    def forward(self, batch: EtcBatch) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_batch(batch)
        attention = self.prepare(batch)
        global_hidden, long_hidden = self.embeddings(batch)
        return self.run_layers(global_hidden, long_hidden, attention)

    def run_layers(
        self, global_hidden: torch.Tensor, long_hidden: torch.Tensor, attention: AttentionPattern
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over one prepared attention (no host-device synchronisation in here)."""
        for layer in self.layer:
            if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
                global_hidden, long_hidden = checkpoint(
                    layer, global_hidden, long_hidden, attention, use_reentrant=False
                )
            else:
                global_hidden, long_hidden = layer(global_hidden, long_hidden, attention)
        return global_hidden, long_hidden
