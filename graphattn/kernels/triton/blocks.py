"""Tile sizes, block-sparsity tables and the per-batch plan of the Triton global-local kernels.

Pure PyTorch, no Triton import: the compiler or a collate function can precompute the g2l key
block lists ahead of time (they depend only on the mask), the way FlexAttention's `BlockMask`
stores `kv_num_blocks` / `kv_indices`. Hard g2l masking leaves most (global query block, long key
block) tiles empty, and the global-query programs only visit the listed ones.

A plan reads labels one of two ways (`AttentionPlan.structured`): from the compact structure
(per-token ids, links and edges, see labels.py: O(L + G + E), the lists from
`structure.region_tiles`), or from dense tables with -1 where masked (dense side inputs,
converted once per batch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from graphattn.compact import CompactBatch
from graphattn.errors import BatchError
from graphattn.kernels.structure import dense_region_tiles, region_tiles


@dataclass(frozen=True)
class BlockSizes:
    """Uniform tile sizes, in tokens: every tile of long tokens has `long` rows, every tile of
    global tokens `global_` rows, in every kernel (tests use them to cross tile edges with few
    tokens). Powers of two and at least 16 (what `tl.dot` takes)."""

    long: int
    global_: int

    def __post_init__(self) -> None:
        for name, size in (("long", self.long), ("global_", self.global_)):
            if size < 16 or size & (size - 1):
                raise BatchError(f"block size must be a power of two >= 16, got {size}", path=("block_sizes", name))


@dataclass(frozen=True)
class KernelTiles:
    """One kernel's tiles: the program owns `long_rows` / `global_rows` tokens (queries in the
    forward and dq kernels, keys in dk/dv) and walks the other side in tiles of `long_cols` /
    `global_cols`; warps and software-pipeline stages of its launch. `split_label_grads` (dq
    only): write dq and the label gradients in two launches, each with fewer live registers."""

    long_rows: int
    global_rows: int
    long_cols: int
    global_cols: int
    num_warps: int = 4
    num_stages: int = 2
    split_label_grads: bool = False

    def constants(self) -> dict:
        return {
            "BLOCK_LM": self.long_rows,
            "BLOCK_GM": self.global_rows,
            "BLOCK_LN": self.long_cols,
            "BLOCK_GN": self.global_cols,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


@dataclass(frozen=True)
class TileConfig:
    forward: KernelTiles
    dq: KernelTiles
    dkdv: KernelTiles

    @classmethod
    def uniform(cls, sizes: BlockSizes, num_warps: int = 4, num_stages: int = 2) -> TileConfig:
        tiles = KernelTiles(sizes.long, sizes.global_, sizes.long, sizes.global_, num_warps, num_stages)
        return cls(tiles, tiles, tiles)


def interpreter_active() -> bool:
    """True when Triton runs kernels through its NumPy interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_block_sizes() -> BlockSizes:
    """The interpreter's tiles: small, so that tests with a few dozen tokens cross tile edges.
    On a GPU the tiles come from config.py (per architecture, head dim and dtype)."""
    return BlockSizes(long=32, global_=16) if interpreter_active() else BlockSizes(long=64, global_=64)


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

    def to(self, device: torch.device | str) -> KeyBlocks:
        return KeyBlocks(self.counts.to(device), self.indices.to(device), self.block_q, self.block_k)

    @property
    def density(self) -> float:
        """Fraction of key tiles visited; 1.0 means no skipping (diagnostics, benchmarks)."""
        total = self.indices.shape[0] * self.indices.shape[1] * self.indices.shape[2]
        return float(self.counts.sum()) / total if total else 0.0


def ordered_blocks(tiles: torch.Tensor, block_q: int, block_k: int) -> KeyBlocks:
    """KeyBlocks of a [B, query blocks, key blocks] bool table: a stable sort moves the set key
    blocks to the front of each row in ascending order."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    order = torch.sort((~tiles).to(torch.uint8), dim=-1, stable=True).indices
    return KeyBlocks(counts.contiguous(), order.to(torch.int32).contiguous(), block_q, block_k)


def nonempty_key_blocks(allowed: torch.Tensor, block_q: int, block_k: int) -> KeyBlocks:
    """Block table of a [B, Q, K] mask (nonzero = may attend), tiles of block_q x block_k."""
    if allowed.dim() != 3:
        raise BatchError(f"expected a [B, queries, keys] mask, got shape {tuple(allowed.shape)}")
    batch, n_q, n_k = allowed.shape
    q_blocks, k_blocks = -(-n_q // block_q), -(-n_k // block_k)
    padded = torch.nn.functional.pad(allowed != 0, (0, k_blocks * block_k - n_k, 0, q_blocks * block_q - n_q))
    tiles = padded.view(batch, q_blocks, block_q, k_blocks, block_k).any(dim=4).any(dim=2)
    return ordered_blocks(tiles, block_q, block_k)


def g2l_key_blocks(g2l_att_mask: torch.Tensor, block_m: int | None = None, block_n: int | None = None) -> KeyBlocks:
    """Non-empty long key blocks per (batch, global query block) of a [B, G, L] g2l mask, for the
    forward kernel's tiles (global query rows x long key columns; default: the interpreter's
    `default_block_sizes`; on a GPU pass the tiles `config.candidates` gives the forward
    kernel), to hand to `attention(..., g2l_key_blocks=...)` with those tiles as `block_sizes`."""
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


def _some(x: torch.Tensor) -> torch.Tensor:
    """A never-read stand-in for an empty tensor argument (kernels need a real pointer)."""
    return x if x.numel() else x.new_zeros(1)


@dataclass
class AttentionPlan:
    """Everything about one batch's structure that the kernels read, built once per batch.

    `tables` are the dense-mode label tables (g2g [B, G, G_keys], g2l, l2g, the l2l band; -1 where
    masked) or one-element stand-ins; `structure_tensors` the compact structure's packed tensors
    (or stand-ins). The lists are per kernel: the forward and dq kernels walk l2g (long query
    tile x global key tile) and g2l (global query tile x long key tile); the dk/dv kernel the same
    regions per KEY tile ('l2g': per global key tile, the long query tiles reaching it; 'g2l': per
    long key tile, the global query tiles reaching it).
    """

    n_global: int
    n_global_keys: int
    n_long: int
    radius: int
    n_labels: int
    tiles: TileConfig
    structured: bool
    tables: tuple[torch.Tensor, ...]
    structure_tensors: tuple[torch.Tensor, ...]
    structure_sizes: tuple[int, ...]  # n_levels, n_links, n_edges, max_distance, cross_label
    forward_lists: dict[str, KeyBlocks] = field(default_factory=dict)
    dq_lists: dict[str, KeyBlocks] = field(default_factory=dict)
    dkdv_lists: dict[str, KeyBlocks] = field(default_factory=dict)

    @property
    def v_pad(self) -> int:
        """The label dimension of the register tiles of qab rows and label gradients (a power of two)."""
        return max(16, 1 << (self.n_labels - 1).bit_length())

    def kernel_constants(self, kernel: str, head_dim: int, dtype: torch.dtype) -> dict:
        return dict(getattr(self.tiles, kernel).constants(), STRUCTURED=self.structured, D=head_dim, V_PAD=self.v_pad)

    # the plan's lists for legacy callers (tests, benchmarks): the forward kernel's
    @property
    def g2l_blocks(self) -> KeyBlocks:
        return self.forward_lists["g2l"]

    @property
    def l2g_blocks(self) -> KeyBlocks:
        return self.forward_lists["l2g"]


def _kernel_lists(tiles: TileConfig, tile_table) -> tuple[dict, dict, dict]:
    """Per kernel the lists; `tile_table(region, query_tile, key_tile)` gives [B, nq, nk] bool."""

    def query_owner(t: KernelTiles) -> dict[str, KeyBlocks]:
        return {
            "l2g": ordered_blocks(tile_table("l2g", t.long_rows, t.global_cols), t.long_rows, t.global_cols),
            "g2l": ordered_blocks(tile_table("g2l", t.global_rows, t.long_cols), t.global_rows, t.long_cols),
        }

    k = tiles.dkdv
    key_owner = {
        "l2g": ordered_blocks(
            tile_table("l2g", k.long_cols, k.global_rows).transpose(1, 2), k.global_rows, k.long_cols
        ),
        "g2l": ordered_blocks(
            tile_table("g2l", k.global_cols, k.long_rows).transpose(1, 2), k.long_rows, k.global_cols
        ),
    }
    forward = query_owner(tiles.forward)
    dq = forward if tiles.dq == tiles.forward else query_owner(tiles.dq)
    return forward, dq, key_owner


def make_plan(
    side, n_labels: int, sizes: BlockSizes | TileConfig, g2l_blocks: KeyBlocks | None = None
) -> AttentionPlan:
    """The dense-mode plan of a batch's torch side inputs: masked label tables and block lists."""
    tiles = sizes if isinstance(sizes, TileConfig) else TileConfig.uniform(sizes)
    l2g = masked_labels(side.l2g_att_mask, side.l2g_relative_att_ids, n_labels)
    g2l = masked_labels(side.g2l_att_mask, side.g2l_relative_att_ids, n_labels)
    g2g = masked_labels(side.g2g_att_mask, side.g2g_relative_att_ids, n_labels)
    l2l = masked_labels(side.l2l_att_mask, side.l2l_relative_att_ids, n_labels)
    batch, n_global, n_long = g2l.shape
    masks = {"l2g": l2g >= 0, "g2l": g2l >= 0}
    forward, dq, dkdv = _kernel_lists(tiles, lambda region, q, k: dense_region_tiles(masks[region], q, k).any)
    if g2l_blocks is not None:
        t = tiles.forward
        check_key_blocks(g2l_blocks, batch, n_global, n_long, t.global_rows, t.long_cols, "g2l_key_blocks")
        forward = dict(forward, g2l=g2l_blocks.to(g2l.device))
        if tiles.dq == tiles.forward:
            dq = forward
    dummy = torch.zeros(1, dtype=torch.int32, device=l2g.device)
    return AttentionPlan(
        n_global=n_global,
        n_global_keys=g2g.shape[2],
        n_long=n_long,
        radius=(l2l.shape[-1] - 1) // 2,
        n_labels=n_labels,
        tiles=tiles,
        structured=False,
        tables=tuple(_some(t) for t in (g2g, g2l, l2g, l2l)),
        structure_tensors=(dummy,) * 7,
        structure_sizes=(0, 1, 1, 0, -1),
        forward_lists=forward,
        dq_lists=dq,
        dkdv_lists=dkdv,
    )


def pack_structure(c: CompactBatch) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """The kernels' view of a torch CompactBatch: LONG [B, 3, L], OWN [B, levels, L], GLOB [B, 4, G],
    LINK_OFF [B, L+1], LINK [3, E], EDGE_OFF [B, G+1], EDGE [3, E2] (int32), and the sizes."""
    i32 = lambda *xs: torch.stack([x.to(torch.int32) for x in xs], dim=-2).contiguous()  # noqa: E731
    long = i32(c.long_doc, c.long_segment, c.long_hard_l2g)
    glob = i32(c.global_doc, c.global_segment, c.global_blockable, c.global_hard_g2l)
    links = i32(c.link_long, c.link_global, c.link_label)
    edges = i32(c.edge_src, c.edge_dst, c.edge_label)
    tensors = (
        long,
        c.owners.to(torch.int32).contiguous(),
        glob,
        c.link_offsets.to(torch.int32).contiguous(),
        links,
        c.edge_offsets.to(torch.int32).contiguous(),
        edges,
    )
    sizes = (int(c.owners.shape[1]), int(links.shape[-1]), int(edges.shape[-1]), c.max_distance, c.cross_segment_label)
    return tuple(_some(t) for t in tensors), sizes


def make_structured_plan(c: CompactBatch, n_labels: int, sizes: BlockSizes | TileConfig) -> AttentionPlan:
    """The structure-mode plan of a torch CompactBatch: no [L, G] tensor, lists from tile tables."""
    tiles = sizes if isinstance(sizes, TileConfig) else TileConfig.uniform(sizes)
    forward, dq, dkdv = _kernel_lists(tiles, lambda region, q, k: region_tiles(c, region, q, k).any)
    tensors, structure_sizes = pack_structure(c)
    dummy = torch.zeros(1, dtype=torch.int16, device=c.long_doc.device)
    return AttentionPlan(
        n_global=c.global_length,
        n_global_keys=c.global_length,
        n_long=c.long_length,
        radius=c.local_radius,
        n_labels=n_labels,
        tiles=tiles,
        structured=True,
        tables=(dummy,) * 4,
        structure_tensors=tensors,
        structure_sizes=structure_sizes,
        forward_lists=forward,
        dq_lists=dq,
        dkdv_lists=dkdv,
    )
