"""Tile sizes and block-sparsity tables for the Triton global-local kernels.

Pure PyTorch, no Triton import: the compiler or a collate function can precompute the g2l key
block lists ahead of time (they depend only on the mask), the way FlexAttention's `BlockMask`
stores `kv_num_blocks` / `kv_indices`. Hard g2l masking leaves most (global query block, long key
block) tiles empty, and the global-query programs only visit the listed ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from graphattn.errors import BatchError


@dataclass(frozen=True)
class BlockSizes:
    """Tile sizes, in tokens, of the kernels: every tile of long tokens has `long` rows, every
    tile of global tokens `global_` rows. Powers of two and at least 16 (what `tl.dot` takes)."""

    long: int
    global_: int

    def __post_init__(self) -> None:
        for name, size in (("long", self.long), ("global_", self.global_)):
            if size < 16 or size & (size - 1):
                raise BatchError(f"block size must be a power of two >= 16, got {size}", path=("block_sizes", name))


def interpreter_active() -> bool:
    """True when Triton runs kernels through its NumPy interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_block_sizes() -> BlockSizes:
    """64-token long tiles and 32-token global tiles on a GPU: 64 keeps `tl.dot` on tensor cores
    with a window overhead of (64 + 2r) / (2r + 1) keys, and 32 global rows per program give the
    few global queries (G = L/16) enough programs to fill the GPU. The interpreter gets smaller
    tiles so that tests with a few dozen tokens still cross tile boundaries."""
    return BlockSizes(long=32, global_=16) if interpreter_active() else BlockSizes(long=64, global_=32)


@dataclass
class KeyBlocks:
    """Per (batch, query block): how many key blocks hold at least one allowed pair, and which.

    `counts[b, qb]` is that number; `indices[b, qb, :counts[b, qb]]` are the key block numbers in
    ascending order (the rest of the row is padding, never read). `block_q` / `block_k` are the
    tile sizes the table was built for: a kernel with other tile sizes must not use it.
    """

    counts: torch.Tensor  # [B, n_query_blocks] int32
    indices: torch.Tensor  # [B, n_query_blocks, n_key_blocks] int32
    block_q: int
    block_k: int

    def to(self, device: torch.device | str) -> "KeyBlocks":
        return KeyBlocks(self.counts.to(device), self.indices.to(device), self.block_q, self.block_k)

    @property
    def density(self) -> float:
        """Fraction of key tiles visited; 1.0 means no skipping (diagnostics, benchmarks)."""
        total = self.indices.shape[0] * self.indices.shape[1] * self.indices.shape[2]
        return float(self.counts.sum()) / total if total else 0.0


def nonempty_key_blocks(allowed: torch.Tensor, block_q: int, block_k: int) -> KeyBlocks:
    """Block table of a [B, Q, K] mask (nonzero = may attend), tiles of block_q x block_k.

    Vectorized: one padded reshape and two `any` reductions, then a stable sort that moves the
    non-empty key blocks to the front of each row in ascending order.
    """
    if allowed.dim() != 3:
        raise BatchError(f"expected a [B, queries, keys] mask, got shape {tuple(allowed.shape)}")
    batch, n_q, n_k = allowed.shape
    q_blocks, k_blocks = -(-n_q // block_q), -(-n_k // block_k)
    padded = torch.nn.functional.pad(allowed != 0, (0, k_blocks * block_k - n_k, 0, q_blocks * block_q - n_q))
    tiles = padded.view(batch, q_blocks, block_q, k_blocks, block_k).any(dim=4).any(dim=2)
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    order = torch.sort((~tiles).to(torch.uint8), dim=-1, stable=True).indices
    return KeyBlocks(counts, order.to(torch.int32).contiguous(), block_q, block_k)


def g2l_key_blocks(g2l_att_mask: torch.Tensor, block_m: int | None = None, block_n: int | None = None) -> KeyBlocks:
    """Non-empty long key blocks per (batch, global query block) of a [B, G, L] g2l mask.

    Defaults to the tile sizes the kernels use on this machine (`default_block_sizes`), so a
    collate function can call `g2l_key_blocks(batch.side.g2l_att_mask)` and hand the result to
    `attention(..., g2l_key_blocks=...)`.
    """
    sizes = default_block_sizes()
    return nonempty_key_blocks(g2l_att_mask, block_m or sizes.global_, block_n or sizes.long)


def check_key_blocks(blocks: KeyBlocks, batch: int, n_q: int, n_k: int, block_q: int, block_k: int, name: str) -> None:
    """Refuse a precomputed table that was built for other tile sizes or another shape."""
    if (blocks.block_q, blocks.block_k) != (block_q, block_k):
        raise BatchError(
            f"{name} was built for {blocks.block_q}x{blocks.block_k} tiles but the kernels use "
            f"{block_q}x{block_k}; build it with g2l_key_blocks(mask, {block_q}, {block_k})",
            path=(name,),
        )
    expected = (batch, -(-n_q // block_q), -(-n_k // block_k))
    if tuple(blocks.indices.shape) != expected or tuple(blocks.counts.shape) != expected[:2]:
        raise BatchError(
            f"{name} has counts {tuple(blocks.counts.shape)} / indices {tuple(blocks.indices.shape)}, "
            f"expected {expected[:2]} / {expected} for this batch",
            path=(name,),
        )


def masked_labels(mask: torch.Tensor, ids: torch.Tensor, n_labels: int) -> torch.Tensor:
    """Label ids with -1 where the mask forbids the pair: the kernels read one table, not two.
    int16 when the vocabulary fits (half the bytes of the largest input the kernels stream)."""
    dtype = torch.int16 if n_labels <= torch.iinfo(torch.int16).max else torch.int32
    return torch.where(mask != 0, ids, -1).to(dtype).contiguous()


@dataclass
class AttentionPlan:
    """Everything about one batch's structure that the kernels read, built once per call.

    The four label tables are [B, queries, keys] (l2l is the [B, L, 2r+1] band). Forward key
    block tables are per query tile; the backward's key-owner programs need them transposed (per
    key tile, which query tiles reach it). All are built with the plan, once per batch.
    """

    l2l: torch.Tensor
    g2g: torch.Tensor
    l2g: torch.Tensor
    g2l: torch.Tensor
    n_labels: int
    sizes: BlockSizes
    g2l_blocks: KeyBlocks
    l2g_blocks: KeyBlocks
    _by_key: dict = field(default_factory=dict)

    @property
    def radius(self) -> int:
        return (self.l2l.shape[-1] - 1) // 2

    @property
    def n_long(self) -> int:
        return self.l2l.shape[1]

    @property
    def n_global(self) -> int:
        """Global queries."""
        return self.g2g.shape[1]

    @property
    def n_global_keys(self) -> int:
        """Global keys (>= n_global: the slots past the queries are keys only)."""
        return self.g2g.shape[2]

    def blocks_by_key(self, name: str) -> KeyBlocks:
        """'l2g': per global key tile, the long query tiles reaching it; 'g2l': per long key tile,
        the global query tiles reaching it."""
        if name not in self._by_key:
            if name == "l2g":
                table = nonempty_key_blocks(self.l2g.transpose(1, 2) >= 0, self.sizes.global_, self.sizes.long)
            else:
                table = nonempty_key_blocks(self.g2l.transpose(1, 2) >= 0, self.sizes.long, self.sizes.global_)
            self._by_key[name] = table
        return self._by_key[name]

    def build_all(self) -> "AttentionPlan":
        """Build the backward's tables now, so that no layer's backward builds them."""
        for name in ("l2g", "g2l"):
            self.blocks_by_key(name)
        return self


def make_plan(side, n_labels: int, sizes: BlockSizes, g2l_blocks: KeyBlocks | None = None) -> AttentionPlan:
    """Masked label tables and forward block tables of a batch's side inputs (torch, batched)."""
    l2g = masked_labels(side.l2g_att_mask, side.l2g_relative_att_ids, n_labels)
    g2l = masked_labels(side.g2l_att_mask, side.g2l_relative_att_ids, n_labels)
    batch, n_global, n_long = g2l.shape
    if g2l_blocks is None:
        g2l_blocks = nonempty_key_blocks(g2l >= 0, sizes.global_, sizes.long)
    else:
        check_key_blocks(g2l_blocks, batch, n_global, n_long, sizes.global_, sizes.long, "g2l_key_blocks")
        g2l_blocks = g2l_blocks.to(g2l.device)
    plan = AttentionPlan(
        l2l=masked_labels(side.l2l_att_mask, side.l2l_relative_att_ids, n_labels),
        g2g=masked_labels(side.g2g_att_mask, side.g2g_relative_att_ids, n_labels),
        l2g=l2g,
        g2l=g2l,
        n_labels=n_labels,
        sizes=sizes,
        g2l_blocks=g2l_blocks,
        l2g_blocks=nonempty_key_blocks(l2g >= 0, sizes.long, sizes.global_),
    )
    return plan.build_all()
