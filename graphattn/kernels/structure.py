"""The ETC pattern from a batch's compact structure, in torch: dense rows where a consumer needs
them, and which tiles of the pattern are empty, partly or fully allowed without building it.

`graphattn.compact.CompactBatch` holds per-token ids (owners per level, documents, segments, hard
flags) and sparse links/edges. The rules (as `CompactSideInputs.to_dense`, see graphattn/compact.py):

    l2l[i, j]  |j - i| <= r, j inside, same long segment;            ids: distance id of j - i
    g2g[g, h]  same document, unless the segments differ and both are blockable;
               ids: distance id of h - g, the cross-segment label across segments, edges last
    l2g[i, g]  same document and row i not hard, or g owns i at some level, or (i, g) linked
    g2l[g, i]  same document and row g not hard, or g owns i, or linked
               ids (both): a link's label, else belongs if owned, else does_not_belong

`dense_*` give the tensors (the dense oracle and the tests use them; consumers that only need a
few rows pass a row range). `BlockSummary` reduces each tile of tokens to a few numbers (document
and segment ranges, owner ranges per level, hard flags), from which `region_tiles` says for every
(query tile, key tile) of a region whether it may hold an allowed pair and whether all its pairs
are allowed, in O(tiles + L + G + E): what FlexAttention's BlockMask and the Triton block lists
need. The answers are conservative (a tile said non-empty may be empty; "full" is exact), which
is all a kernel that masks every element needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs

BIG = torch.iinfo(torch.int32).max  # an empty range is (BIG, -BIG)


def distance_ids(delta: torch.Tensor, max_distance: int) -> torch.Tensor:
    """Relative id of key - query: 0 same, 1..k right, k+1..2k left, farther clipped (labels.py)."""
    clipped = delta.clamp(-max_distance, max_distance)
    return torch.where(clipped >= 0, clipped, max_distance - clipped).to(torch.int32)


# -- dense rows from the structure -------------------------------------------------------------
def dense_l2l(c: CompactBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, 2r+1] mask and ids of the band (column r is the query itself)."""
    r, length = c.local_radius, c.long_length
    offsets = torch.arange(-r, r + 1, device=c.long_doc.device)
    keys = torch.arange(length, device=offsets.device)[:, None] + offsets
    inside = (keys >= 0) & (keys < length)
    key_segment = c.long_segment[:, keys.clamp(0, max(length - 1, 0))]  # [B, L, 2r+1]
    mask = inside & (key_segment == c.long_segment[:, :, None])
    ids = distance_ids(offsets, c.max_distance).expand(c.batch_size, length, -1)
    return mask.to(torch.int32), ids.contiguous()


@dataclass
class Links:
    """Links (or g2g edges) that fall into one block of rows x columns: (batch, row, column)
    indices relative to the block, and their labels. Selected once, when a batch is planned."""

    batch: torch.Tensor
    row: torch.Tensor
    column: torch.Tensor
    label: torch.Tensor


def links_in(c: CompactBatch, long_rows: slice, global_cols: slice, *, global_major: bool = False) -> Links:
    """The links of long tokens `long_rows` to globals `global_cols`, indexed for an [n_long, n_global]
    block (or, `global_major`, for a [n_global, n_long] one)."""
    keep = (c.link_long >= long_rows.start) & (c.link_long < long_rows.stop)
    keep &= (c.link_global >= global_cols.start) & (c.link_global < global_cols.stop)
    b, i, g, label = (x[keep].long() for x in (c.link_batch, c.link_long, c.link_global, c.link_label))
    i, g = i - long_rows.start, g - global_cols.start
    return Links(b, g, i, label) if global_major else Links(b, i, g, label)


def edges_in(c: CompactBatch, rows: slice) -> Links:
    """The g2g edges out of globals `rows`, indexed for a [n, G] block."""
    keep = (c.edge_src >= rows.start) & (c.edge_src < rows.stop)
    b, src, dst, label = (x[keep].long() for x in (c.edge_batch, c.edge_src, c.edge_dst, c.edge_label))
    return Links(b, src - rows.start, dst, label)


def _owned(c: CompactBatch, long_rows: torch.Tensor, global_cols: torch.Tensor) -> torch.Tensor:
    """[B, n, m] bool: global global_cols[m] owns long token long_rows[n] at some level."""
    owners = c.owners[:, :, long_rows]  # [B, levels, n]
    return (owners[..., None] == global_cols[None, None, None, :]).any(dim=1)


def _apply_links(ids: torch.Tensor, mask: torch.Tensor | None, links: Links) -> None:
    """Links overwrite ids and allow their pairs (edges, mask None, only overwrite ids)."""
    index = (links.batch, links.row, links.column)
    ids[index] = links.label.to(ids.dtype)
    if mask is not None:
        mask[index] = 1


def _span(rows: slice | None, n: int) -> slice:
    return rows if rows is not None else slice(0, n)


def dense_l2g(
    c: CompactBatch, rows: slice | None = None, cols: slice | None = None, links: Links | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, n, m] mask and ids of long queries `rows` against globals `cols` (default: all);
    `links` the block's links when already selected."""
    rows, cols = _span(rows, c.long_length), _span(cols, c.global_length)
    device = c.long_doc.device
    owned = _owned(
        c, torch.arange(rows.start, rows.stop, device=device), torch.arange(cols.start, cols.stop, device=device)
    )
    same_doc = c.long_doc[:, rows, None] == c.global_doc[:, None, cols]
    mask = ((same_doc & ~c.long_hard_l2g[:, rows, None]) | owned).to(torch.int32)
    ids = torch.where(owned, c.belongs, c.does_not_belong).to(torch.int32)
    _apply_links(ids, mask, links if links is not None else links_in(c, rows, cols))
    return mask, ids


def dense_g2l(
    c: CompactBatch, rows: slice | None = None, cols: slice | None = None, links: Links | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, n, m] mask and ids of global queries `rows` against long tokens `cols` (default: all)."""
    rows, cols = _span(rows, c.global_length), _span(cols, c.long_length)
    device = c.long_doc.device
    owned = _owned(
        c, torch.arange(cols.start, cols.stop, device=device), torch.arange(rows.start, rows.stop, device=device)
    ).transpose(1, 2)
    same_doc = c.global_doc[:, rows, None] == c.long_doc[:, None, cols]
    mask = ((same_doc & ~c.global_hard_g2l[:, rows, None]) | owned).to(torch.int32)
    ids = torch.where(owned, c.belongs, c.does_not_belong).to(torch.int32)
    _apply_links(ids, mask, links if links is not None else links_in(c, cols, rows, global_major=True))
    return mask.contiguous(), ids.contiguous()


def dense_g2g(
    c: CompactBatch, rows: slice | None = None, edges: Links | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, n, G] mask and ids of global queries `rows` (default: all)."""
    rows = _span(rows, c.global_length)
    device = c.global_doc.device
    query, key = torch.arange(rows.start, rows.stop, device=device), torch.arange(c.global_length, device=device)
    same_doc = c.global_doc[:, rows, None] == c.global_doc[:, None, :]
    cross = (c.global_segment[:, rows, None] != c.global_segment[:, None, :]) & same_doc
    blocked = cross & c.global_blockable[:, rows, None] & c.global_blockable[:, None, :]
    ids = distance_ids(key[None, :] - query[:, None], c.max_distance).expand(c.batch_size, -1, -1).clone()
    if c.cross_segment_label >= 0:
        ids = torch.where(cross, c.cross_segment_label, ids).to(torch.int32)
    _apply_links(ids, None, edges if edges is not None else edges_in(c, rows))
    return (same_doc & ~blocked).to(torch.int32), ids


def allowed_key_range(c: CompactBatch, region: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query token the [first, last + 1) of the keys it may attend ('l2g': per long token, its
    globals; 'g2l': per global, its long tokens), [B, n] each; (BIG, -BIG) when none. A superset of
    the allowed keys' range, in O(L + G + E)."""
    batch = c.batch_size
    docs = int(max(c.long_doc.max(), c.global_doc.max())) + 1 if c.long_length and c.global_length else 1
    device = c.long_doc.device

    def doc_range(doc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First and last index of each document in a [B, n] doc row, [B, docs]."""
        index = torch.arange(doc.shape[1], device=device, dtype=torch.int32).expand_as(doc)
        first = torch.full((batch, docs), BIG, dtype=torch.int32, device=device).scatter_reduce_(
            1, doc.long(), index, "amin"
        )
        last = torch.full((batch, docs), -BIG, dtype=torch.int32, device=device).scatter_reduce_(
            1, doc.long(), index, "amax"
        )
        return first, last

    if region == "l2g":
        first, last = doc_range(c.global_doc)
        lo = torch.where(c.long_hard_l2g, BIG, first.gather(1, c.long_doc.long()))
        hi = torch.where(c.long_hard_l2g, -BIG, last.gather(1, c.long_doc.long()))
        owners = c.owners
        lo = torch.minimum(lo, torch.where(owners >= 0, owners, BIG).amin(1) if owners.shape[1] else lo)
        hi = torch.maximum(hi, torch.where(owners >= 0, owners, -BIG).amax(1) if owners.shape[1] else hi)
        rows, keys = c.link_long, c.link_global
    else:
        first, last = doc_range(c.long_doc)
        lo = torch.where(c.global_hard_g2l, BIG, first.gather(1, c.global_doc.long()))
        hi = torch.where(c.global_hard_g2l, -BIG, last.gather(1, c.global_doc.long()))
        owned_first, owned_last = _owned_long_range(c)
        lo = torch.minimum(lo, owned_first.amin(1) if owned_first.shape[1] else lo)
        hi = torch.maximum(hi, owned_last.amax(1) if owned_last.shape[1] else hi)
        rows, keys = c.link_global, c.link_long
    flat = c.link_batch.long() * lo.shape[1] + rows.long()
    lo = lo.flatten().scatter_reduce(0, flat, keys.to(torch.int32), "amin").view_as(lo)
    hi = hi.flatten().scatter_reduce(0, flat, keys.to(torch.int32), "amax").view_as(hi)
    return lo, torch.where(hi > -BIG, hi + 1, hi)


def compact_to_side(c: CompactBatch) -> SideInputs:
    """The eight dense tensors of a torch CompactBatch (what collate builds from the instances)."""
    l2l, g2g, l2g, g2l = dense_l2l(c), dense_g2g(c), dense_l2g(c), dense_g2l(c)
    return SideInputs(l2l[0], g2g[0], l2g[0], g2l[0], l2l[1], g2g[1], l2g[1], g2l[1])


# -- tiles ---------------------------------------------------------------------------------------
def _tile_view(x: torch.Tensor, tile: int, fill) -> torch.Tensor:
    """[..., n] -> [..., ceil(n / tile), tile], padded with `fill`."""
    n = x.shape[-1]
    tiles = -(-n // tile)
    return torch.nn.functional.pad(x, (0, tiles * tile - n), value=fill).unflatten(-1, (tiles, tile))


def tile_min(x: torch.Tensor, tile: int) -> torch.Tensor:
    """Per tile of `tile` entries along the last dim, the minimum (BIG for padding)."""
    return _tile_view(x, tile, BIG).amin(-1)


def tile_max(x: torch.Tensor, tile: int) -> torch.Tensor:
    return _tile_view(x, tile, -BIG).amax(-1)


def _range(x: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile min and max of x [B, n] (padding ignored; an all-padding tile gives (BIG, -BIG))."""
    return tile_min(x, tile), tile_max(x, tile)


@dataclass
class BlockSummary:
    """One side's tokens (long or global) reduced per tile of `tile` tokens. Ranges are [B, n_tiles]
    (owner ranges [B, levels, n_tiles]); empty ranges are (BIG, -BIG)."""

    tile: int
    length: int
    doc: tuple[torch.Tensor, torch.Tensor]
    segment: tuple[torch.Tensor, torch.Tensor]
    owner: tuple[
        torch.Tensor, torch.Tensor
    ]  # long: the globals owning the tile's tokens; global: the long tokens its globals own
    any_soft: torch.Tensor  # some row not under the hard mask (l2g for long, g2l for global)
    all_soft: torch.Tensor
    any_blockable: torch.Tensor | None = None  # global only

    @property
    def tiles(self) -> int:
        return -(-self.length // self.tile)


def long_summary(c: CompactBatch, tile: int) -> BlockSummary:
    owners = torch.where(c.owners >= 0, c.owners, BIG)
    low = _tile_view(owners, tile, BIG).amin(-1)
    high = _tile_view(torch.where(c.owners >= 0, c.owners, -BIG), tile, -BIG).amax(-1)
    soft = _tile_view(~c.long_hard_l2g, tile, False)
    pad = _tile_view(torch.ones_like(c.long_hard_l2g), tile, False)  # real (inside L) positions
    return BlockSummary(
        tile,
        c.long_length,
        _range(c.long_doc, tile),
        _range(c.long_segment, tile),
        (low, high),
        soft.any(-1),
        (soft | ~pad).all(-1),
    )


def _owned_long_range(c: CompactBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, levels, G]: first and last long token each global owns at each level ((BIG, -BIG): none)."""
    batch, levels, length = c.owners.shape
    device = c.owners.device
    first = torch.full((batch, levels, c.global_length + 1), BIG, dtype=torch.int32, device=device)
    last = torch.full_like(first, -BIG)
    target = torch.where(c.owners >= 0, c.owners, c.global_length).long()  # column G collects "no owner"
    token = torch.arange(length, device=device, dtype=torch.int32).expand_as(c.owners)
    first.scatter_reduce_(2, target, token, "amin")
    last.scatter_reduce_(2, target, token, "amax")
    return first[..., :-1], last[..., :-1]


def global_summary(c: CompactBatch, tile: int) -> BlockSummary:
    first, last = _owned_long_range(c)
    soft = _tile_view(~c.global_hard_g2l, tile, False)
    pad = _tile_view(torch.ones_like(c.global_hard_g2l), tile, False)
    return BlockSummary(
        tile,
        c.global_length,
        _range(c.global_doc, tile),
        _range(c.global_segment, tile),
        (_tile_view(first, tile, BIG).amin(-1), _tile_view(last, tile, -BIG).amax(-1)),
        soft.any(-1),
        (soft | ~pad).all(-1),
        _tile_view(c.global_blockable, tile, False).any(-1),
    )


def _overlap(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[B, nq, nk]: the ranges of query tile and key tile intersect."""
    return (a[0][:, :, None] <= b[1][:, None, :]) & (b[0][:, None, :] <= a[1][:, :, None])


def _single_equal(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[B, nq, nk]: both tiles hold one and the same value."""
    one_a, one_b = a[0] == a[1], b[0] == b[1]
    return one_a[:, :, None] & one_b[:, None, :] & (a[0][:, :, None] == b[0][:, None, :])


def _index_ranges(n: int, tile: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    start = torch.arange(0, n, tile, device=device)
    return start, (start + tile).clamp(max=n) - 1


def _owner_hits(owner: tuple[torch.Tensor, torch.Tensor], other_tile: int, other_length: int) -> torch.Tensor:
    """[B, nq, nk]: some level's owner range of a query tile meets key tile nk (index ranges)."""
    start, stop = _index_ranges(other_length, other_tile, owner[0].device)
    low, high = owner[0][..., :, None], owner[1][..., :, None]  # [B, levels, nq, 1]
    return ((low <= stop) & (start <= high)).any(dim=1)


def _link_tiles(c: CompactBatch, long_tile: int, global_tile: int) -> torch.Tensor:
    """[B, long tiles, global tiles]: the tile holds a link."""
    out = torch.zeros(
        c.batch_size,
        -(-c.long_length // long_tile),
        -(-c.global_length // global_tile),
        dtype=torch.bool,
        device=c.link_long.device,
    )
    out[c.link_batch.long(), (c.link_long // long_tile).long(), (c.link_global // global_tile).long()] = True
    return out


@dataclass
class RegionTiles:
    """Per (query tile, key tile) of one region: `any` (may hold an allowed pair) and `full` (every
    pair allowed), [B, n_query_tiles, n_key_tiles] bool."""

    any: torch.Tensor
    full: torch.Tensor


def region_tiles(c: CompactBatch, region: str, query_tile: int, key_tile: int) -> RegionTiles:
    """`any` / `full` of the tiles of region 'l2l', 'l2g', 'g2l' or 'g2g' (see the module docstring)."""
    if region == "l2l":
        q = long_summary(c, query_tile)
        k = long_summary(c, key_tile)
        q_start, q_stop = _index_ranges(c.long_length, query_tile, c.long_doc.device)
        k_start, k_stop = _index_ranges(c.long_length, key_tile, c.long_doc.device)
        r = c.local_radius
        near = (k_start[None, :] <= q_stop[:, None] + r) & (k_stop[None, :] >= q_start[:, None] - r)
        inside = (k_stop[None, :] - q_start[:, None] <= r) & (q_stop[:, None] - k_start[None, :] <= r)
        full_tiles = ((k_stop - k_start + 1) == key_tile)[None, :] & ((q_stop - q_start + 1) == query_tile)[:, None]
        return RegionTiles(
            near[None] & _overlap(q.segment, k.segment),
            (inside & full_tiles)[None] & _single_equal(q.segment, k.segment),
        )
    if region == "l2g":
        q, k = long_summary(c, query_tile), global_summary(c, key_tile)
        soft = _overlap(q.doc, k.doc) & q.any_soft[:, :, None]
        any_ = soft | _owner_hits(q.owner, key_tile, c.global_length) | _link_tiles(c, query_tile, key_tile)
        return RegionTiles(any_, _single_equal(q.doc, k.doc) & q.all_soft[:, :, None] & _whole(q, k))
    if region == "g2l":
        q, k = global_summary(c, query_tile), long_summary(c, key_tile)
        soft = _overlap(q.doc, k.doc) & q.any_soft[:, :, None]
        any_ = (
            soft | _owner_hits(q.owner, key_tile, c.long_length) | _link_tiles(c, key_tile, query_tile).transpose(1, 2)
        )
        return RegionTiles(any_, _single_equal(q.doc, k.doc) & q.all_soft[:, :, None] & _whole(q, k))
    if region == "g2g":
        q, k = global_summary(c, query_tile), global_summary(c, key_tile)
        unblocked = ~(q.any_blockable[:, :, None] & k.any_blockable[:, None, :]) | _single_equal(q.segment, k.segment)
        return RegionTiles(_overlap(q.doc, k.doc), _single_equal(q.doc, k.doc) & unblocked & _whole(q, k))
    raise ValueError(f"unknown region {region!r}")


def _whole(q: BlockSummary, k: BlockSummary) -> torch.Tensor:
    """[1, nq, nk]: neither tile runs past the end of its sequence."""
    q_whole = torch.arange(q.tiles, device=q.all_soft.device) * q.tile + q.tile <= q.length
    k_whole = torch.arange(k.tiles, device=q.all_soft.device) * k.tile + k.tile <= k.length
    return (q_whole[:, None] & k_whole[None, :])[None]


def dense_region_tiles(mask: torch.Tensor, query_tile: int, key_tile: int) -> RegionTiles:
    """`any` / `full` of the tiles of a dense [B, Q, K] mask (nonzero = allowed); padding past the
    ends counts as not allowed, so a tile running past an end is never full."""
    batch, n_q, n_k = mask.shape
    q_tiles, k_tiles = -(-n_q // query_tile), -(-n_k // key_tile)
    padded = torch.nn.functional.pad(mask != 0, (0, k_tiles * key_tile - n_k, 0, q_tiles * query_tile - n_q))
    tiles = padded.view(batch, q_tiles, query_tile, k_tiles, key_tile)
    return RegionTiles(tiles.any(dim=4).any(dim=2), tiles.all(dim=4).all(dim=2))
