"""Compressive memory encoder mode (Compressive Transformer, Rae et al. 2019; docs/DESIGN.md §8).

A document longer than one window is read as a stream of segments. Per layer i the encoder keeps
a FIFO memory of the last n_m long-token activations that entered layer i (its inputs, as
TransformerXL) and a compressed memory of n_cm older ones. After each segment (Algorithm 1):

    memory     <- concat(memory, h_i)[-n_m:]          the overflow old_mem leaves the memory
    compressed <- concat(compressed, f_c(old_mem))[-n_cm:]   (the oldest compressed ones are lost)

Both hold detached tensors: no gradient flows across segments, so one segment's cost never
depends on how much of the stream came before (tests assert the key shapes). Attention of the
current segment runs over [compressed; memory; current] through the unchanged ETC layer of
graphattn.nn (`EtcLayer.forward(..., memory=...)`): long tokens keep their local window and
global keys, and BOTH long and global tokens see every memory, which enters as key-only global
slots (patterns/segments.py says how, and which labels they carry): no query rows are computed
for them. Memories are keyed and valued with the layer's long-token projections.

The compression network f_c (patterns/compression.py) is trained by the attention-reconstruction loss
returned with every segment, computed with the main network frozen: add it to the task loss;
its gradients reach the compressors only, and the task loss never reaches them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from graphattn.contract import EtcBatch, SideInputs
from graphattn.errors import BatchError, GraphattnError
from graphattn.kernels import PreparedAttention
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEncoder, EtcLayer
from graphattn.patterns.compression import COMPRESSIONS, Compressor, attention_reconstruction_loss, attention_usage
from graphattn.patterns.segments import split_segments, widen_with_memory


@dataclass
class CompressiveConfig:
    """Memory sizes (in tokens), compression rate c and function f_c; ids of the two memory labels
    (default: the last two rows of the relative table, which compiled batches must leave free)."""

    segment_length: int = 768  # n_s
    memory_length: int = 768  # n_m
    compressed_length: int = 1152  # n_cm
    compression_rate: int = 3  # c
    compression: str = "conv"
    conv_dilation: int = 2  # for "dilated_conv"
    memory_label: int | None = None
    compressed_label: int | None = None

    def __post_init__(self) -> None:
        for name in ("segment_length", "compression_rate", "conv_dilation"):
            if getattr(self, name) < 1:
                raise GraphattnError(f"must be >= 1, got {getattr(self, name)}", path=("CompressiveConfig", name))
        for name in ("memory_length", "compressed_length"):
            if getattr(self, name) < 0:
                raise GraphattnError(f"must be >= 0, got {getattr(self, name)}", path=("CompressiveConfig", name))
        if self.compression not in COMPRESSIONS:
            raise GraphattnError(
                f"{self.compression!r} is not one of {', '.join(COMPRESSIONS)}",
                path=("CompressiveConfig", "compression"),
            )

    @classmethod
    def enwik8(cls, **overrides) -> CompressiveConfig:
        """The paper's Enwik8 setting: n_s = n_m = 768, n_cm = 1152, c = 3 (conv compression)."""
        return cls(
            **{**dict(segment_length=768, memory_length=768, compressed_length=1152, compression_rate=3), **overrides}
        )

    def label_ids(self, relative_vocab_size: int) -> tuple[int, int]:
        memory = relative_vocab_size - 2 if self.memory_label is None else self.memory_label
        compressed = relative_vocab_size - 1 if self.compressed_label is None else self.compressed_label
        return memory, compressed


@dataclass
class LayerMemory:
    """One layer's memories. Positions are stream positions of the long tokens; a compressed
    slot records the [start, stop) positions it summarises (start, start+1 for most_used)."""

    memory: torch.Tensor  # [B, n, D]
    memory_positions: torch.Tensor  # [B, n] long
    memory_valid: torch.Tensor  # [B, n] bool (False: padding)
    compressed: torch.Tensor  # [B, c, D]
    compressed_spans: torch.Tensor  # [B, c, 2] long
    compressed_valid: torch.Tensor  # [B, c] bool

    @classmethod
    def empty(cls, batch: int, hidden: int, device=None, dtype=None) -> LayerMemory:
        rows = lambda *shape, **kw: torch.zeros(batch, 0, *shape, device=device, **kw)  # noqa: E731
        return cls(
            rows(hidden, dtype=dtype),
            rows(dtype=torch.long),
            rows(dtype=torch.bool),
            rows(hidden, dtype=dtype),
            rows(2, dtype=torch.long),
            rows(dtype=torch.bool),
        )


@dataclass
class Evicted:
    hidden: torch.Tensor  # [B, e, D]
    positions: torch.Tensor  # [B, e]
    valid: torch.Tensor  # [B, e]


def push_segment(memory: LayerMemory, hidden, positions, valid, memory_length: int) -> tuple[LayerMemory, Evicted]:
    """memory <- concat(memory, h)[-n_m:]; returns the new memory and the rows pushed out."""
    joined = [
        torch.cat(pair, dim=1)
        for pair in (
            (memory.memory, hidden.detach()),
            (memory.memory_positions, positions),
            (memory.memory_valid, valid),
        )
    ]
    overflow = max(joined[0].shape[1] - memory_length, 0)
    kept = [x[:, overflow:] for x in joined]
    evicted = Evicted(*(x[:, :overflow] for x in joined))
    return LayerMemory(*kept, memory.compressed, memory.compressed_spans, memory.compressed_valid), evicted


def append_compressed(memory: LayerMemory, compressed, spans, valid, compressed_length: int) -> LayerMemory:
    """compressed <- concat(compressed, new)[-n_cm:]."""
    joined = [
        torch.cat(pair, dim=1)
        for pair in (
            (memory.compressed, compressed.detach()),
            (memory.compressed_spans, spans),
            (memory.compressed_valid, valid),
        )
    ]
    start = max(joined[0].shape[1] - compressed_length, 0)
    return LayerMemory(memory.memory, memory.memory_positions, memory.memory_valid, *(x[:, start:] for x in joined))


def _stream_spans(positions: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Compressor spans (row indices into the evicted rows) -> stream positions [start, stop)."""
    start = torch.gather(positions, 1, spans[..., 0])
    last = torch.gather(positions, 1, (spans[..., 1] - 1).clamp(min=0))
    return torch.stack((start, last + 1), dim=-1)


@dataclass
class MemoryState:
    layers: list[LayerMemory]
    next_position: int = 0  # stream position of the next segment's first long token


@dataclass
class CompressiveOutput:
    global_hidden: torch.Tensor  # [B, G, D] the segment's global tokens
    long_hidden: torch.Tensor  # [B, n_s, D]
    state: MemoryState  # memories after this segment, for the next one
    reconstruction_loss: torch.Tensor  # scalar, summed over layers; grads reach compressors only
    key_counts: dict[str, int] = field(default_factory=dict)  # keys each query could see, by kind


class CompressiveEncoder(nn.Module):
    """An EtcEncoder (its weights, unchanged names under `encoder.`) reading segment streams."""

    def __init__(self, config: EtcConfig, memory: CompressiveConfig | None = None, encoder: EtcEncoder | None = None):
        super().__init__()
        self.config = config
        self.memory_config = memory or CompressiveConfig()
        self.encoder = encoder if encoder is not None else EtcEncoder(config)
        mc = self.memory_config
        self.compressors = nn.ModuleList(
            Compressor(mc.compression, config.hidden_size, mc.compression_rate, mc.conv_dilation)
            for _ in range(config.num_hidden_layers)
        )
        self.memory_label, self.compressed_label = mc.label_ids(config.relative_vocab_size)
        for name, label in (("memory_label", self.memory_label), ("compressed_label", self.compressed_label)):
            if not 0 <= label < config.relative_vocab_size:
                raise GraphattnError(
                    f"label id {label} is outside the relative vocabulary of {config.relative_vocab_size}",
                    path=("CompressiveConfig", name),
                )

    def initial_state(self, batch_size: int, device=None, dtype=None) -> MemoryState:
        hidden = self.config.hidden_size
        return MemoryState([LayerMemory.empty(batch_size, hidden, device, dtype) for _ in self.encoder.layer])

    def _check(self, segment: EtcBatch, state: MemoryState) -> None:
        self.encoder.check_batch(segment)
        lowest = min(self.memory_label, self.compressed_label)
        if segment.vocab_size > lowest:
            raise BatchError(
                f"the batch uses relative labels up to {segment.vocab_size - 1}, but ids {self.memory_label} and "
                f"{self.compressed_label} "
                "are reserved for memory keys; raise relative_vocab_size or set "
                "CompressiveConfig.memory_label/compressed_label",
                path=("vocab_size",),
            )
        if state.layers and state.layers[0].memory.shape[0] != segment.batch_size:
            raise BatchError(
                f"the memory holds batch size {state.layers[0].memory.shape[0]}, the segment has {segment.batch_size}",
                path=("long_token_ids",),
            )

    def forward(self, segment: EtcBatch, state: MemoryState | None = None) -> CompressiveOutput:
        """Encode one segment over the memories in `state` (None: start of a stream)."""
        device = segment.long_token_ids.device
        state = state if state is not None else self.initial_state(segment.batch_size, device)
        self._check(segment, state)
        global_hidden, long_hidden = self.encoder.embeddings(segment)
        num_long = long_hidden.shape[1]
        positions = (state.next_position + torch.arange(num_long, device=device)).expand(segment.batch_size, -1)
        valid = segment.long_input_mask != 0
        first = state.layers[0]
        side = self._widen(segment.side.to_torch(), positions, first)
        prepared = self._prepare(side, long_hidden.device)  # once per segment, for every layer with the same slots

        layer_inputs = []
        for layer, memory in zip(self.encoder.layer, state.layers):
            layer_inputs.append(long_hidden)
            attention = (
                prepared
                if _same_slots(memory, first)
                else self._prepare(self._widen(segment.side.to_torch(), positions, memory), long_hidden.device)
            )
            keys = torch.cat((memory.compressed, memory.memory), dim=1).to(long_hidden.dtype)
            if self.config.gradient_checkpointing and self.training and torch.is_grad_enabled():
                global_hidden, long_hidden = checkpoint(
                    layer, global_hidden, long_hidden, attention, keys, use_reentrant=False
                )
            else:
                global_hidden, long_hidden = layer(global_hidden, long_hidden, attention, keys)

        new_layers, losses = [], []
        for layer, compressor, memory, h in zip(self.encoder.layer, self.compressors, state.layers, layer_inputs):
            updated, loss = self._update_memory(layer, compressor, memory, h, positions, valid)
            new_layers.append(updated)
            losses.append(loss)
        counts = {
            "global": global_hidden.shape[1],
            "compressed": first.compressed.shape[1],
            "memory": first.memory.shape[1],
            "local_window": side.l2l_att_mask.shape[-1],
        }
        next_state = MemoryState(new_layers, state.next_position + num_long)
        return CompressiveOutput(global_hidden, long_hidden, next_state, torch.stack(losses).sum(), counts)

    def _prepare(self, side: SideInputs, device: torch.device) -> PreparedAttention:
        return self.encoder.layer[0].attention.prepare(side, device)

    def _widen(self, side: SideInputs, positions: torch.Tensor, memory: LayerMemory) -> SideInputs:
        return widen_with_memory(
            side,
            positions,
            memory.compressed_valid,
            memory.memory_positions,
            memory.memory_valid,
            max_distance=self.config.relative_pos_max_distance,
            memory_label=self.memory_label,
            compressed_label=self.compressed_label,
        )

    def _update_memory(self, layer: EtcLayer, compressor: Compressor, memory: LayerMemory, h, positions, valid):
        mc = self.memory_config
        memory, evicted = push_segment(memory, h, positions, valid, mc.memory_length)
        zero = h.new_zeros(())
        if evicted.hidden.shape[1] == 0 or mc.compressed_length == 0:
            return memory, zero
        usage = (
            attention_usage(layer.attention, h.detach(), valid, evicted.hidden, evicted.valid)
            if compressor.needs_usage
            else None
        )
        compressed, compressed_valid, spans = compressor(evicted.hidden, evicted.valid, usage)
        # Also computed for parameter-free compressions: there it measures their loss, untrained.
        loss = attention_reconstruction_loss(
            layer.attention, h, valid, evicted.hidden, evicted.valid, compressed, compressed_valid
        )
        memory = append_compressed(
            memory, compressed, _stream_spans(evicted.positions, spans), compressed_valid, mc.compressed_length
        )
        return memory, loss

    def encode_document(
        self, batch: EtcBatch, *, progress: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, list[CompressiveOutput]]:
        """Read a whole compiled batch as a stream of segment_length segments.

        Returns (global_hidden [B, G, D] from the last segment that kept each global token,
        zeros for globals no segment kept; long_hidden [B, L, D]; the per-segment outputs)."""
        segments = split_segments(batch, self.memory_config.segment_length)
        state, outputs, long_parts = None, [], []
        hidden = self.config.hidden_size
        global_out = None
        for segment, kept in tqdm(segments, desc="segments", disable=not progress):
            out = self(segment, state)
            state = out.state
            outputs.append(out)
            long_parts.append(out.long_hidden)
            if global_out is None:
                global_out = out.long_hidden.new_zeros(batch.batch_size, batch.global_token_ids.shape[1], hidden)
            global_out = global_out.index_copy(1, kept.to(global_out.device), out.global_hidden)
        return global_out, torch.cat(long_parts, dim=1), outputs


def _same_slots(a: LayerMemory, b: LayerMemory) -> bool:
    """Layers share one widened side input unless their valid slots differ (most_used can keep
    padding rows in one layer and not in another)."""
    return torch.equal(a.compressed_valid, b.compressed_valid) and torch.equal(a.memory_valid, b.memory_valid)


def stream_segments(
    encoder: CompressiveEncoder, segments: Iterable[EtcBatch], *, progress: bool = False
) -> list[CompressiveOutput]:
    """Encode already-cut segments one after another, carrying the memory."""
    state, outputs = None, []
    for segment in tqdm(segments, desc="segments", disable=not progress):
        out = encoder(segment, state)
        state = out.state
        outputs.append(out)
    return outputs
