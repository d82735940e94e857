"""Structured prompts at inference: passages encoded once and reused at any offset (`BlockCache`).

A retrieval prompt `[p1 | p2 | ... | tail]` whose passages need not see each other is block
attention (arXiv 2409.15355): each passage attends only to itself, the tail (the question) and
every generated token attend to everything. A passage's keys and values then depend only on its
own tokens, so they are computed once (at positions 0..n-1) and kept. RoPE makes the move exact:
a key rotated for position j and rotated again by the angle of offset o is the key of position
o + j (rotations compose), so "continue" places each cached passage at its offset in the prompt
with one rotation per layer, computed with the model's own rotary embedding (its inv_freq and
rope scaling) and its own `apply_rotary_pos_emb`. "restart" leaves every passage at 0..n-1 and
starts the tail after the longest one (APE, arXiv 2502.05431: training-free, approximate).

The tail is then one ordinary forward against a transformers `DynamicCache` holding every passage;
the returned cache holds every prompt token but the last, so `model.generate(input_ids=...,
cache=...)` continues from it (it computes that last token again, as it must compute one).
transformers is imported only when a BlockCache is built (graphattn.hf loads without it).
"""

from __future__ import annotations

import inspect
import sys
from collections import OrderedDict
from typing import NamedTuple

import torch

from graphattn.hf.attention import GraphattnMaskError
from graphattn.hf.hybrid import recurrent_layers
from graphattn.hf.inputs import check_int
from graphattn.hf.kv import (
    GENERATE_OWNED,
    cache_argument,
    expand_size,
    fill,
    forward_cached,
    new_cache,
    shared_prefix_cache,
    tokens_of,
)

POSITIONS = ("continue", "restart")
MAX_BLOCKS = 1 << 16  # passages of one prompt
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
UNMOVABLE_ROPE = {
    "dynamic": "recomputes its frequencies from the sequence length",
    "longrope": "switches its frequencies with the sequence length",
}


class Prefill(NamedTuple):
    """What `BlockCache.prefill` returns. `cache` holds every prompt token but the last, so
    `model.generate(input_ids=input_ids, position_ids=position_ids, cache=cache)` continues the
    prompt (position_ids matter only for "restart"; "continue" positions are the token indices)."""

    logits: torch.Tensor  # [1, len(tail), vocab]: the tail's logits
    cache: object  # a transformers DynamicCache
    input_ids: torch.Tensor  # [1, N]: the passages' tokens, then the tail's
    position_ids: torch.Tensor  # [1, N]


class _Rope:
    """A decoder's RoPE as seen from outside: the rotary module, the apply function of its
    attention modules and each layer's type (Gemma 3 keeps one rotation per layer type)."""

    def __init__(self, model):
        config = model.config
        name = str(getattr(config, "model_type", None) or type(model).__name__)
        base = getattr(model, "model", None)
        self.rotary = getattr(base, "rotary_emb", None)
        layers = getattr(base, "layers", None)
        if self.rotary is None or layers is None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has no rotary position embedding (model.model.rotary_emb); a passage's "
                "keys cannot be moved to another offset without RoPE"
            )
        if recurrent_layers(config) is not None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has recurrent / linear-attention layers: their state cannot be moved "
                "between passages"
            )
        self.attention = [getattr(layer, "self_attn", None) for layer in layers]
        if any(a is None for a in self.attention):
            raise GraphattnMaskError(f"BlockCache: a layer of the {name} model has no self_attn module")
        if any(isinstance(getattr(a, "sinks", None), torch.Tensor) for a in self.attention):
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has attention sinks (learned per-head sink logits); graphattn's "
                "block-attention reference does not cover them, so passages are not reused"
            )
        types = getattr(config, "layer_types", None) or ["full_attention"] * len(layers)
        odd = sorted({str(t) for t in types} - set(ATTENTION_LAYER_TYPES))
        if odd:
            raise GraphattnMaskError(f"BlockCache: the {name} model has {odd[0]} layers; only full and sliding-window "
                                     "attention layers can take moved passages")  # fmt: skip
        self.layer_types = [str(t) for t in types]
        self._check_rope_type(config, name)
        module = sys.modules.get(type(self.attention[0]).__module__)
        self.apply = getattr(module, "apply_rotary_pos_emb", None)
        if self.apply is None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model's attention module has no apply_rotary_pos_emb function to rotate with"
            )
        self.by_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.windows = self._windows(config)

    def _check_rope_type(self, config, name: str) -> None:
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        groups = [params] if not params or "rope_type" in params or "type" in params else list(params.values())
        for group in groups:
            group = group if isinstance(group, dict) else {}
            kind = str(group.get("rope_type", group.get("type", "default")))
            if kind in UNMOVABLE_ROPE:
                raise GraphattnMaskError(
                    f"BlockCache: the {name} model's rope_type {kind!r} {UNMOVABLE_ROPE[kind]}; a key rotated at one "
                    "length cannot be re-rotated exactly at another"
                )
            if "mrope_section" in group or kind in ("mrope", "3d"):
                raise GraphattnMaskError(
                    f"BlockCache: the {name} model uses multimodal RoPE (mrope): its positions are not one offset"
                )

    @staticmethod
    def _windows(config) -> dict[int, int]:
        """Layer index -> sliding window, for the layers that have one."""
        window = getattr(config, "sliding_window", None)
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            return {}
        types = getattr(config, "layer_types", None)  # without them (Mistral) every layer slides
        types = types or ["sliding_attention"] * int(config.num_hidden_layers)
        return {i: window for i, t in enumerate(types) if t == "sliding_attention"}

    def rotation(self, offsets: torch.Tensor, layer: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin of the rotation by `offsets` (one per token), float32, without the rope's
        attention scaling (read as the value at offset 0): [1, n, head_dim]."""
        x = torch.empty(0, dtype=torch.float32, device=device)
        extra = (self.layer_types[layer],) if self.by_type else ()
        positions = torch.cat([offsets.new_zeros(1), offsets]).to(device)[None]
        cos, sin = self.rotary(x, positions, *extra)
        scale = cos[:, :1, :1].float()
        return cos[:, 1:].float() / scale, sin[:, 1:].float() / scale

    def rotate(self, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Keys [1, H, n, d] rotated further by cos / sin, in float32, cast back."""
        keys32 = keys.float()
        _, rotated = self.apply(keys32[:, :1, :1], keys32, cos, sin)  # a one-row query: only the keys matter
        return rotated.to(keys.dtype)


class BlockCache:
    """Passages' keys and values, encoded once each, kept by token content (least recently used
    evicted past `max_tokens`), and placed into prompts `[block 1 | ... | block k | tail]`.

        cache = graphattn.hf.BlockCache(model, max_tokens=1_000_000)
        out = cache.prefill([passage_a, passage_b], question)      # out.logits, out.cache
        ids = cache.generate([passage_b, passage_a], question, max_new_tokens=32)  # both passages reused

    A passage longer than `max_tokens` is encoded when asked for and not kept."""

    def __init__(self, model, max_tokens: int = 1 << 20):
        self.max_tokens = check_int(max_tokens, "max_tokens", 1, 1 << 40)
        self.model = model
        self.rope = _Rope(model)
        config = model.config
        self.vocab = check_int(getattr(config, "vocab_size", None), "model.config.vocab_size", 1, 1 << 40)
        self.max_positions = int(getattr(config, "max_position_embeddings", None) or (1 << 40))
        self._entries: OrderedDict[bytes, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = OrderedDict()
        self.num_tokens = 0  # tokens of the kept passages
        self.hits = self.misses = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values."""
        return sum(t.nbytes for keys, values in self._entries.values() for t in (*keys, *values))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens) -> bool:
        return self._key(tokens_of(tokens, "tokens", self.vocab, "cpu")) in self._entries

    @staticmethod
    def _key(tokens: torch.Tensor) -> bytes:
        return tokens.cpu().numpy().tobytes()

    def _encode(self, tokens: torch.Tensor):
        if tokens.numel() > self.max_positions:
            raise ValueError(
                f"tokens: {tokens.numel()} tokens, over the model's max_position_embeddings {self.max_positions}"
            )
        key = self._key(tokens)
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        cache = new_cache()
        with torch.no_grad():
            positions = torch.arange(tokens.numel(), device=tokens.device)[None]
            forward_cached(self.model, tokens[None], positions, cache, logits=False)
        entry = (tuple(layer.keys for layer in cache.layers), tuple(layer.values for layer in cache.layers))
        n = tokens.numel()
        if n <= self.max_tokens:
            self._entries[key] = entry
            self.num_tokens += n
            while self.num_tokens > self.max_tokens:
                old_key, _ = self._entries.popitem(last=False)
                self.num_tokens -= len(old_key) // 8
        return entry

    def encode(self, tokens) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """One passage alone at positions 0..n-1: per layer its keys and values ([1, kv_heads, n, d]),
        kept for later prompts (a second call with the same tokens is a lookup)."""
        return self._encode(tokens_of(tokens, "tokens", self.vocab, self.device))

    def _blocks(self, blocks) -> list[torch.Tensor]:
        if isinstance(blocks, (str, bytes, torch.Tensor)) or not isinstance(blocks, (list, tuple)):
            raise ValueError(f"blocks: expected a list of passages (token-id lists), got {type(blocks).__name__}")
        if len(blocks) > MAX_BLOCKS:
            raise ValueError(f"blocks: {len(blocks)} passages, over the limit of {MAX_BLOCKS}")
        return [tokens_of(b, f"blocks[{i}]", self.vocab, self.device) for i, b in enumerate(blocks)]

    def _layout(self, blocks: list[torch.Tensor], tail: torch.Tensor, positions: str):
        """Per block token the rotation offset, and the positions of every prompt token."""
        lengths = torch.tensor([b.numel() for b in blocks], dtype=torch.long)
        total = int(lengths.sum()) + tail.numel()
        if positions == "continue":
            starts = torch.cumsum(lengths, 0) - lengths
            tail_start = int(lengths.sum())
        else:
            starts = torch.zeros_like(lengths)
            tail_start = int(lengths.max()) if len(blocks) else 0
            edge = min((int(s) for s in torch.cumsum(lengths, 0)[:-1]), default=None)
            for layer, window in self.rope.windows.items():
                if edge is not None and window < total:
                    raise GraphattnMaskError(
                        f"positions='restart': layer {layer}'s sliding window of {window} tokens would cross a block "
                        f"edge (the prompt has {total} tokens); windows count cache slots, which restarted positions "
                        "no longer equal (use positions='continue')"
                    )
        if tail_start + tail.numel() > self.max_positions:
            raise ValueError(
                f"the prompt reaches position {tail_start + tail.numel()}, over the model's max_position_embeddings "
                f"{self.max_positions}"
            )
        offsets = torch.repeat_interleave(starts, lengths)
        block_positions = offsets + torch.cat([torch.arange(int(n)) for n in lengths]) if len(blocks) else offsets
        tail_positions = torch.arange(tail_start, tail_start + tail.numel())
        return offsets, torch.cat([block_positions, tail_positions])[None]

    def prefill(self, blocks, tail, positions: str = "continue", logits_to_keep: int = 0) -> Prefill:
        """The prompt `[blocks... | tail]`: passages from the cache (encoded on a miss), moved to their
        offsets ("continue": block attention, exact against a full forward under the block mask) or
        left at 0 ("restart": APE-style, the tail after the longest), then the tail against all of
        them. Returns the tail's logits (the last `logits_to_keep` only, as transformers' argument;
        0: all) and a cache `model.generate` continues from (`Prefill`)."""
        if positions not in POSITIONS:
            raise ValueError(f"positions: expected one of {POSITIONS}, got {positions!r}")
        logits_to_keep = check_int(logits_to_keep, "logits_to_keep", 0, 1 << 40)
        blocks = self._blocks(blocks)
        tail = tokens_of(tail, "tail", self.vocab, self.device)
        offsets, position_ids = self._layout(blocks, tail, positions)
        device = self.device
        position_ids = position_ids.to(device)
        entries = [self._encode(b) for b in blocks]
        cache = new_cache()
        moved = bool(offsets.any())
        with torch.no_grad():
            rotations: dict = {}  # one rotation per layer type (one for most models)
            for layer in range(len(self.rope.attention)) if entries else ():
                keys = torch.cat([e[0][layer] for e in entries], dim=2)
                values = torch.cat([e[1][layer] for e in entries], dim=2)
                if moved:
                    kind = self.rope.layer_types[layer] if self.rope.by_type else None
                    if kind not in rotations:
                        rotations[kind] = self.rope.rotation(offsets, layer, device)
                    keys = self.rope.rotate(keys, *rotations[kind])
                fill(cache, layer, keys, values)
            n_blocks = int(offsets.numel())
            keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
            logits = forward_cached(self.model, tail[None], position_ids[:, n_blocks:], cache, **keep)
        cache.crop(-1)
        input_ids = torch.cat([*blocks, tail])[None]
        return Prefill(logits, cache, input_ids, position_ids)

    def generate(self, blocks, tail, positions: str = "continue", **generate_kwargs):
        """`prefill`, then `model.generate` from its cache; returns what `generate` returns (the prompt's
        tokens, then the new ones). input_ids, attention_mask, position_ids and the cache are built here."""
        owned = sorted(set(generate_kwargs) & set(GENERATE_OWNED))
        if owned:
            raise ValueError(f"generate_kwargs: {owned[0]} is built from blocks and tail; do not pass it")
        out = self.prefill(blocks, tail, positions, logits_to_keep=1)  # generate computes its own
        rows = expand_size(self.model, generate_kwargs)  # generate repeats the prompt for beams / samples
        kwargs = {cache_argument(self.model): shared_prefix_cache(out.cache, rows) if rows > 1 else out.cache}
        return self.model.generate(input_ids=out.input_ids, position_ids=out.position_ids, **kwargs, **generate_kwargs)
