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

Blocks may form a tree (`parents=`: a shared system prompt, passages under it, at any depth): a
block sees its ancestors and itself, is encoded once after them and kept under its whole path
(tokens and root-relative starts); every block is then rotated by where its root went.

The tail is then one ordinary forward against a transformers `DynamicCache` holding every passage;
the returned cache holds every prompt token but the last, so `model.generate(input_ids=...,
cache=...)` continues from it (it computes that last token again, as it must compute one).
transformers is imported only when a BlockCache is built (graphattn.hf loads without it).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import NamedTuple

import torch

from graphattn.hf.inputs import check_int
from graphattn.hf.kv import (
    GENERATE_OWNED,
    cache_argument,
    encode_after,
    expand_size,
    fill,
    forward_cached,
    new_cache,
    shared_prefix_cache,
    tokens_of,
)
from graphattn.hf.rope import Rope
from graphattn.hf.structure import GraphattnMaskError

POSITIONS = ("continue", "restart")
MAX_BLOCKS = 1 << 16  # passages of one prompt


class Prefill(NamedTuple):
    """What `BlockCache.prefill` returns. `cache` holds every prompt token but the last, so
    `model.generate(input_ids=input_ids, position_ids=position_ids, cache=cache)` continues the
    prompt (position_ids matter only for "restart"; "continue" positions are the token indices)."""

    logits: torch.Tensor  # [1, len(tail), vocab]: the tail's logits
    cache: object  # a transformers DynamicCache
    input_ids: torch.Tensor  # [1, N]: the passages' tokens, then the tail's
    position_ids: torch.Tensor  # [1, N]


class Entry(NamedTuple):
    """One kept block: per layer its keys and values [1, kv_heads, n, d] at positions relative to its root."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    length: int


class Layout(NamedTuple):
    placed: list[int]  # each block's first position in the prompt
    roots: list[int]  # each block's root block
    relative: list[int]  # each block's first position relative to its root's
    tail_start: int


def _root_key(tokens: torch.Tensor) -> bytes:
    """A root block is kept by its token ids' bytes (non-negative int64)."""
    return tokens.cpu().numpy().tobytes()


def _path_key(path: list[torch.Tensor], starts: list[int]) -> bytes:
    """A child block is kept by its path: a header beginning with -1 (no root key does) with the
    path's length, then each block's length and root-relative start, then the tokens."""
    header = [-1, len(path)] + [v for tokens, start in zip(path, starts) for v in (tokens.numel(), start)]
    return torch.tensor(header).numpy().tobytes() + b"".join(_root_key(t) for t in path)


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
        self.rope = Rope(model)
        config = model.config
        self.vocab = check_int(getattr(config, "vocab_size", None), "model.config.vocab_size", 1, 1 << 40)
        self.max_positions = int(getattr(config, "max_position_embeddings", None) or (1 << 40))
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.num_tokens = 0  # tokens of the kept passages
        self.hits = self.misses = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values."""
        return sum(t.nbytes for entry in self._entries.values() for t in (*entry.keys, *entry.values))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens) -> bool:
        return _root_key(tokens_of(tokens, "tokens", self.vocab, "cpu")) in self._entries

    def _lookup(self, key: bytes, n: int, compute) -> Entry:
        """The entry under `key`, computed on a miss and kept unless longer than max_tokens (LRU)."""
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        if self.model.training:
            raise ValueError(
                "model: in training mode its dropout would make a kept passage one random draw; call model.eval()"
            )
        with torch.no_grad():
            entry = compute()
        if n <= self.max_tokens:
            self._entries[key] = entry
            self.num_tokens += n
            while self.num_tokens > self.max_tokens:
                self.num_tokens -= self._entries.popitem(last=False)[1].length
        return entry

    def _encode_node(self, tokens: torch.Tensor, start: int, ancestors: list[Entry]) -> Entry:
        """A block's keys and values at `start` + 0..n-1 (positions relative to its root), seeing its
        ancestors' (already at root-relative positions) in a cache before it."""
        keys, values = encode_after(self.model, tokens, start, ancestors)
        return Entry(keys, values, tokens.numel())

    def encode(self, tokens) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """One passage alone at positions 0..n-1: per layer its keys and values ([1, kv_heads, n, d]),
        kept for later prompts (a second call with the same tokens is a lookup)."""
        tokens = tokens_of(tokens, "tokens", self.vocab, self.device)
        if tokens.numel() > self.max_positions:
            raise ValueError(
                f"tokens: {tokens.numel()} tokens, over the model's max_position_embeddings {self.max_positions}"
            )
        entry = self._lookup(_root_key(tokens), tokens.numel(), lambda: self._encode_node(tokens, 0, []))
        return entry.keys, entry.values

    def _blocks(self, blocks, parents) -> tuple[list[torch.Tensor], list[int]]:
        if isinstance(blocks, (str, bytes, torch.Tensor)) or not isinstance(blocks, (list, tuple)):
            raise ValueError(f"blocks: expected a list of passages (token-id lists), got {type(blocks).__name__}")
        if len(blocks) > MAX_BLOCKS:
            raise ValueError(f"blocks: {len(blocks)} passages, over the limit of {MAX_BLOCKS}")
        tokens = [tokens_of(b, f"blocks[{i}]", self.vocab, self.device) for i, b in enumerate(blocks)]
        if parents is None:
            return tokens, [-1] * len(tokens)
        if isinstance(parents, (str, bytes)) or not isinstance(parents, (list, tuple)):
            raise ValueError(f"parents: expected a list of block indices (-1 for a root), got {type(parents).__name__}")
        if len(parents) != len(blocks):
            raise ValueError(f"parents: {len(parents)} entries for {len(blocks)} blocks")
        return tokens, [
            check_int(p, f"parents[{i}] (-1 or an earlier block)", -1, i - 1) for i, p in enumerate(parents)
        ]

    def _layout(self, lengths: list[int], parents: list[int], tail: int, positions: str) -> Layout:
        """Where every block goes: its position (flat offset for "continue"; its parent's end, 0 for a
        root, for "restart"), its root and its start relative to that root, and the tail's start."""
        placed, roots = [0] * len(lengths), list(range(len(lengths)))
        flat = 0
        for i, (n, parent) in enumerate(zip(lengths, parents)):
            if positions == "continue":
                placed[i] = flat
            elif parent >= 0:
                placed[i] = placed[parent] + lengths[parent]
            if parent >= 0:
                roots[i] = roots[parent]
            flat += n
        ends = [p + n for p, n in zip(placed, lengths)]
        tail_start = flat if positions == "continue" else max(ends, default=0)
        total = flat + tail
        if tail_start + tail > self.max_positions:
            raise ValueError(
                f"the prompt reaches position {tail_start + tail}, over the model's max_position_embeddings "
                f"{self.max_positions}"
            )
        gaps = positions == "restart" and len(lengths) > 1 or any(p >= 0 for p in parents)
        for layer, window in self.rope.windows.items():
            if gaps and window < total:
                what = "positions='restart'" if positions == "restart" else "blocks with parents"
                raise GraphattnMaskError(
                    f"{what}: layer {layer}'s sliding window of {window} tokens would cross a block edge (the prompt "
                    f"has {total} tokens); windows count cache slots, which these positions no longer equal"
                    + (" (use positions='continue')" if positions == "restart" else "")
                )
        relative = [placed[i] - placed[roots[i]] for i in range(len(lengths))]
        return Layout(placed, roots, relative, tail_start)

    def _entries_of(self, blocks: list[torch.Tensor], parents: list[int], layout: Layout) -> list[Entry]:
        """Every block's entry, parents first: a root by its tokens, a child by its path (the tokens
        and root-relative starts of its ancestors and its own)."""
        entries: list[Entry] = []
        paths: list[list[int]] = []
        for i, (tokens, parent) in enumerate(zip(blocks, parents)):
            paths.append([*paths[parent], i] if parent >= 0 else [i])
            if parent < 0:
                key, compute = _root_key(tokens), functools.partial(self._encode_node, tokens, 0, [])
            else:
                ancestors = [entries[j] for j in paths[i][:-1]]
                key = _path_key([blocks[j] for j in paths[i]], [layout.relative[j] for j in paths[i]])
                compute = functools.partial(self._encode_node, tokens, layout.relative[i], ancestors)
            entries.append(self._lookup(key, tokens.numel(), compute))
        return entries

    def prefill(self, blocks, tail, positions: str = "continue", logits_to_keep: int = 0, parents=None) -> Prefill:
        """The prompt `[blocks... | tail]`: passages from the cache (encoded on a miss), moved to their
        offsets ("continue": block attention, exact against a full forward under the block mask) or
        left at 0 ("restart": APE-style, the tail after the longest), then the tail against all of
        them. Returns the tail's logits (the last `logits_to_keep` only, as transformers' argument;
        0: all) and a cache `model.generate` continues from (`Prefill`).

        `parents` (one per block: -1 for a root, else an earlier block) makes the blocks a tree: a
        block sees its ancestors and itself (a shared system prompt, then passages under it), and is
        kept under its whole path; the tail still sees every block."""
        if positions not in POSITIONS:
            raise ValueError(f"positions: expected one of {POSITIONS}, got {positions!r}")
        logits_to_keep = check_int(logits_to_keep, "logits_to_keep", 0, 1 << 40)
        blocks, parents = self._blocks(blocks, parents)
        tail = tokens_of(tail, "tail", self.vocab, self.device)
        lengths = [b.numel() for b in blocks]
        layout = self._layout(lengths, parents, tail.numel(), positions)
        device = self.device
        counts = torch.tensor(lengths, dtype=torch.long)
        offsets = torch.repeat_interleave(
            torch.tensor([layout.placed[r] for r in layout.roots], dtype=torch.long), counts
        )
        starts = torch.repeat_interleave(torch.tensor(layout.placed, dtype=torch.long), counts)
        within = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        tail_positions = torch.arange(layout.tail_start, layout.tail_start + tail.numel())
        position_ids = torch.cat([starts + within, tail_positions])[None].to(device)
        entries = self._entries_of(blocks, parents, layout)
        cache = new_cache()
        moved = bool(offsets.any())
        with torch.no_grad():
            rotations: dict = {}  # one rotation per layer type (one for most models)
            for layer in range(len(self.rope.attention)) if entries else ():
                keys = torch.cat([e.keys[layer] for e in entries], dim=2)
                values = torch.cat([e.values[layer] for e in entries], dim=2)
                if moved and self.rope.rotated[layer]:
                    kind = self.rope.layer_types[layer] if self.rope.by_type else None
                    if kind not in rotations:
                        rotations[kind] = self.rope.rotation(offsets, layer, device)
                    keys = self.rope.rotate(keys, *rotations[kind])
                fill(cache, layer, keys, values)
            keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
            logits = forward_cached(self.model, tail[None], position_ids[:, offsets.numel() :], cache, **keep)
        cache.crop(-1)
        input_ids = torch.cat([*blocks, tail])[None]
        return Prefill(logits, cache, input_ids, position_ids)

    def generate(self, blocks, tail, positions: str = "continue", parents=None, **generate_kwargs):
        """`prefill`, then `model.generate` from its cache; returns what `generate` returns (the prompt's
        tokens, then the new ones). input_ids, attention_mask, position_ids and the cache are built here."""
        owned = sorted(set(generate_kwargs) & set(GENERATE_OWNED))
        if owned:
            raise ValueError(f"generate_kwargs: {owned[0]} is built from blocks and tail; do not pass it")
        out = self.prefill(blocks, tail, positions, logits_to_keep=1, parents=parents)  # generate computes its own
        rows = expand_size(self.model, generate_kwargs)  # generate repeats the prompt for beams / samples
        kwargs = {cache_argument(self.model): shared_prefix_cache(out.cache, rows) if rows > 1 else out.cache}
        return self.model.generate(input_ids=out.input_ids, position_ids=out.position_ids, **kwargs, **generate_kwargs)
