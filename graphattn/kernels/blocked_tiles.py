"""Tiles of the blocked backend: geometry, per-call layouts, score tiles and their label indices.

Kept apart from the softmax arithmetic in blocked.py. What depends only on the side inputs (the
skewed l2l label index, each chunk's key span) is built once per batch (`BlockedPlan`); a chunk's
score tiles are built from the inputs on every call, so forward and backward rebuild the same ones.

A chunk's scores are ONE row-major tile [B, H, rows, K]: for long queries the band window's
w + 2r columns followed by the global keys the chunk may see, for global queries every global
key followed by the long keys it may see. The matmuls write their column ranges in place (BLAS
takes the row stride), one gather brings the labels, bias and masks in, and torch's fused softmax
(and its backward) handle a whole row in one pass while it sits in L1.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from graphattn.kernels import fused_cpu_labels
from graphattn.kernels.structure_runs import band_labels

# Elements of one score tile (all heads of a chunk): bounds memory, keeps tiles cache-friendly.
TILE_ELEMENTS = 1 << 21
NEG_INF = float("-inf")
# Copies ("lanes") of each query's label table: column j of a tile reads copy j % LANES. The
# backward's scatter-add of score gradients into the tables then adds neighbouring columns with
# the same label (most of an l2g row) to different addresses instead of waiting on one: 1.9x
# faster scatter on a Xeon (issue 29). Vocabularies wider than MAX_LANED_VOCAB get one copy.
LANES = 4
MAX_LANED_VOCAB = 256
# Bytes per token (long and global, over the batch) of finished chunk label indices a plan keeps
# for the layers and backward passes after the first forward (IndexCache); past that, chunks
# derive theirs on every call. The PyTorch path's indices of soft l2g/g2l grow as L x G (3.2 MB at
# 4K tokens, 39 MB at 16K): a budget per token keeps the plan's memory linear in L. The fused
# kernel keeps those parts as runs (blocked_fused.py), a few bytes per row: 1 KiB per token holds
# all of its labels, and at 4 KiB the dense int8 indices had made peak memory grow 4.3x from 4K
# to 16K tokens.
INDEX_CACHE_BYTES_PER_TOKEN = 1024


def default_block_size(radius: int) -> int:
    """Rows per long-query block. A block of w rows scores a window of w + 2r keys for the 2r+1
    each row may see: smaller blocks waste fewer scores (w = r: 1.5x, w = r/2: 1.25x) but make
    smaller, slower matmuls; at r = 84, d = 64 the matmul time per allowed pair was lowest at
    w = r (issue 29). Tiny radii get 16 rows so that the matmuls stay worth calling."""
    return max(radius, 16)


@dataclass
class Geometry:
    batch: int
    heads: int
    num_global: int  # global queries
    num_global_keys: int  # global keys (>= num_global: the rest are keys only)
    num_long: int
    radius: int
    block: int
    num_blocks: int
    vocab: int  # V; column V of a table is -inf and stands for "masked"
    scale: float
    blocks_per_chunk: int
    global_rows_per_chunk: int
    lanes: int = 1  # copies of each label table (see LANES); 1 in calls without gradients

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def lane_width(self) -> int:
        """Columns of one copy of a label table: V labels, the masked column V, the sink's V+1."""
        return self.vocab + 2

    def lane_offsets(self, width: int, device: torch.device) -> torch.Tensor:
        """[width] int64: what tile column j adds to its label to read table copy j % lanes."""
        return (torch.arange(width, device=device) % self.lanes) * self.lane_width

    def fold_lanes(self, table_grad: torch.Tensor) -> torch.Tensor:
        """[..., lanes * (V+2)] gradients of the copies -> [..., V] of the labels."""
        return table_grad.unflatten(-1, (self.lanes, self.lane_width)).sum(-2)[..., : self.vocab]

    @property
    def padded_long(self) -> int:
        return self.num_blocks * self.block

    @property
    def window(self) -> int:
        """Keys a block of w rows may reach: r before its first row to r after its last."""
        return self.block + 2 * self.radius

    @property
    def window_pieces(self) -> int:
        """A window cut into pieces of w rows (the last one shorter): gradients of overlapping
        windows are added piece by piece, each piece's blocks landing on disjoint rows."""
        return -(-self.window // self.block)


def geometry(
    batch: int,
    heads: int,
    num_global: int,
    num_long: int,
    radius: int,
    vocab: int,
    scale: float,
    block_size: int | None,
    tile_elements: int,
    num_global_keys: int | None = None,
) -> Geometry:
    """Block size and chunk sizes for one call: a chunk's score tile (all heads, the band window
    and every global key) holds at most `tile_elements` values (or one block / 16 global rows),
    whatever L is, so memory stays linear in L."""
    num_keys = num_global if num_global_keys is None else num_global_keys
    # Keys farther than L-1 away never exist, so a huge radius (BERT-style r >= L) costs nothing.
    radius = min(radius, max(num_long - 1, 0))
    block = max(block_size or default_block_size(radius), 1)
    num_blocks = max(1, math.ceil(num_long / block))
    per_block = batch * heads * block * (block + 2 * radius + num_keys)
    blocks_per_chunk = max(1, min(num_blocks, tile_elements // per_block))
    per_global_row = batch * heads * (num_keys + num_long)
    global_rows = max(16, tile_elements // per_global_row)
    return Geometry(
        batch,
        heads,
        num_global,
        num_keys,
        num_long,
        radius,
        block,
        num_blocks,
        vocab,
        scale,
        blocks_per_chunk,
        global_rows,
        LANES if vocab <= MAX_LANED_VOCAB else 1,
    )


class Scratch:
    """One buffer reused by every chunk: large fresh tensors cost page faults on every call."""

    def __init__(self, like: torch.Tensor, dtype: torch.dtype | None = None):
        self.like, self.dtype, self.buffer = like, dtype or like.dtype, None

    def take(self, *shape: int) -> torch.Tensor:
        size = math.prod(shape)
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = self.like.new_empty(size, dtype=self.dtype)
        return self.buffer[:size].view(shape)


def label_dtype(vocab: int) -> torch.dtype:
    """The smallest integer type that holds the labels 0..V+1 (V+1: the sink's column)."""
    return next(t for t in (torch.int8, torch.int16, torch.int32) if vocab + 1 <= torch.iinfo(t).max)


def pad_dim(x: torch.Tensor, size: int, dim: int, value: float | int = 0) -> torch.Tensor:
    """Pad `x` at the end of `dim` (negative) up to `size`."""
    missing = size - x.shape[dim]
    if missing == 0:
        return x
    return torch.nn.functional.pad(x, [0, 0] * (-dim - 1) + [0, missing], value=value)


def _extend_table(table: torch.Tensor, rows: int, lanes: int) -> torch.Tensor:
    """[B, H, n, V] -> [B, H, rows, lanes * (V+2)]: `lanes` copies of each row's table, each with
    column V (-inf) for masked pairs and column V+1 (0) for the sink of rows with no allowed key
    (see _Tile)."""
    b, h, n, v = table.shape
    out = table.new_full((b, h, rows, lanes, v + 2), NEG_INF)
    out[:, :, :n, :, :v] = table.unsqueeze(3)
    out[..., v + 1] = 0.0
    return out.flatten(3)


@dataclass
class BlockedPlan:
    """What the blocked backend reuses across a batch's layers: the chunk geometry (the softmax
    scale is set per call), where masks and labels come from (dense slices or the compact
    structure, see blocked_sources.py), the skewed l2l label index and every chunk's key span.
    `workers` is the fused kernel's worker count (None: torch.get_num_threads() at each call)."""

    geo: Geometry
    source: Any  # DenseSource | CompactSource
    local_index: torch.Tensor  # [B, nb, w, w + 2r], label_dtype(V)
    local_empty: torch.Tensor  # [B, nb*w] bool: rows without an allowed l2l key
    long_spans: list[tuple[int, int]]  # per long chunk: the global keys its rows may see
    global_spans: list[tuple[int, int]]  # per global chunk: the long keys its rows may see
    workers: int | None
    index_cache: IndexCache
    fused: bool | None = None  # the fused CPU kernel: None where usable, True required, False never
    # A plan chunked for the fused kernel keeps the PyTorch path's chunk sizes for calls that take
    # that path, which are planned when the first such call comes.
    eager_geometry: Geometry | None = None
    _eager_plan: BlockedPlan | None = None
    # A fused plan's chunks and labels as tensors, per `queries` (blocked_fused.prepare).
    fused_chunks: dict[str, Any] | None = None

    def for_pytorch_path(self) -> BlockedPlan:
        if self.eager_geometry is None:
            return self
        if self._eager_plan is None:
            plan = make_plan(self.eager_geometry, self.source, self.workers, self.index_cache.budget)
            self._eager_plan = replace(plan, fused=self.fused)
        return self._eager_plan


class IndexCache:
    """Each chunk's finished label index (masks, labels and sink; table copies are added per
    call), kept in the smallest integer type that holds V + 1 while the batch's total stays
    within `budget` bytes. A batch's first forward derives them from the side inputs; later
    layers and every backward copy them: that derivation was ~10% of a layer's time (issue 29)."""

    def __init__(self, vocab: int, budget: int):
        self.dtype = label_dtype(vocab)
        self.budget, self.used = budget, 0
        self._entries: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        return self._entries.get(key)

    def keep(self, key: tuple, index: torch.Tensor) -> None:
        """Keep a copy of `index` if the budget allows (chunks of one batch are built by several
        workers at once)."""
        self.keep_form(key, index.numel() * self.dtype.itemsize, lambda: index.to(self.dtype))

    def keep_form(self, key: tuple, size: int, make: Callable[[], Any]) -> None:
        """Keep make() (`size` bytes: another form of a chunk's labels) if the budget allows."""
        with self._lock:
            if key in self._entries or self.used + size > self.budget:
                return
            self.used += size
            self._entries[key] = make()


def make_plan(geo: Geometry, source, workers: int | None, cache_bytes: int | None = None) -> BlockedPlan:
    """Side-input work done once per batch, not per chunk or per layer (fewer, larger ops)."""
    long_rows = geo.blocks_per_chunk * geo.block
    long_spans = source.long_spans(long_rows) if geo.num_global_keys > 0 else []
    global_spans = source.global_spans(geo.global_rows_per_chunk) if geo.num_global > 0 else []
    long_blocks = [
        (slice(first * geo.block, min(last * geo.block, geo.num_long)), slice(*span))
        for (first, last), span in zip(long_chunks(geo), long_spans)
        if span[1] > span[0]
    ]
    global_blocks = [
        (slice(start, stop), slice(*span)) for (start, stop), span in zip(global_chunks(geo), global_spans)
    ]
    source.plan_chunks(long_blocks, global_blocks)
    index, local_empty = local_index(geo, source)
    if cache_bytes is None:
        cache_bytes = INDEX_CACHE_BYTES_PER_TOKEN * geo.batch * (geo.num_long + geo.num_global_keys)
    cache = IndexCache(geo.vocab, cache_bytes)
    return BlockedPlan(geo, source, index, local_empty, long_spans, global_spans, workers, cache)


class CallTensors:
    """Per-call tensors, built from the inputs by both passes. Everything is BH-major
    ([B*H, rows, ...]), so a chunk's band windows ([BH*nbc, w, w + 2r]) and its global columns
    ([BH, nbc*w, span]) are column ranges of one tile with one row order."""

    def __init__(self, geo: Geometry, plan: BlockedPlan, gq, gk, gv, lq, lk, lv, t_global=None, t_long=None):
        """t_global and t_long: the label tables of the PyTorch path (the fused kernel makes its own)."""
        bh, d = geo.bh, lq.shape[-1]
        self.geo, self.dim, self.source = geo, d, plan.source
        self.gq = gq.reshape(bh, geo.num_global, d)
        self.gk, self.gv = (x.reshape(bh, geo.num_global_keys, d) for x in (gk, gv))
        self.lq, self.lk, self.lv = (x.reshape(bh, geo.num_long, d) for x in (lq, lk, lv))
        if t_long is not None:
            self.t_global = _extend_table(t_global, geo.num_global, geo.lanes)  # [B, H, G, lanes*(V+2)]
            self.t_long = _extend_table(t_long, geo.padded_long, geo.lanes)  # [B, H, Lp, lanes*(V+2)]
        self.local_index, self.local_empty, self.index_cache = plan.local_index, plan.local_empty, plan.index_cache
        widest = max(geo.window + geo.num_global_keys, geo.num_global_keys + geo.num_long) + 1
        self.lanes = geo.lane_offsets(widest, lq.device) if geo.lanes > 1 else None  # None: one copy
        self.long_spans, self.global_spans = plan.long_spans, plan.global_spans

    def rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Rows of blocks first..last-1 of x [BH, L, d] as a contiguous [BH*nbc, w, d], zeros past L."""
        geo = self.geo
        start, stop = first * geo.block, last * geo.block
        chunk = pad_dim(x[:, start : min(stop, geo.num_long)], stop - start, -2)
        return chunk.reshape(geo.bh * (last - first), geo.block, self.dim)

    def windows(self, x: torch.Tensor, first: int, last: int, scratch: Scratch) -> torch.Tensor:
        """Keys (or values) each block of first..last-1 may reach: [BH*nbc, w + 2r, d].

        Block b's window is rows b*w - r .. b*w + w + r of x (zeros outside [0, L)), a
        contiguous run of rows: the windows are an overlapping strided view of the chunk's
        region, copied once into the scratch buffer."""
        geo, nbc, d = self.geo, last - first, self.dim
        w, bh, length, window = geo.block, geo.bh, geo.num_long, geo.window
        start, stop = first * w - geo.radius, last * w + geo.radius
        region = x[:, max(start, 0) : min(stop, length)]
        if start < 0 or stop > length:
            region = torch.nn.functional.pad(region, (0, 0, max(-start, 0), max(stop - length, 0)))
        view = region.as_strided((bh, nbc, window, d), (region.stride(0), w * d, d, 1), region.storage_offset())
        out = scratch.take(bh, nbc, window, d)
        out.copy_(view)
        return out.view(bh * nbc, window, d)


def local_index(geo: Geometry, source) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels [B, nb, w, w + 2r] of the l2l pairs of every block (int8 where they fit), built once
    per batch, and which rows have no allowed l2l key ([B, nb*w] bool); a chunk's gather index
    copies its blocks.

    Row a of a block needs window columns a .. a + 2r: the side-input row (2r+1 columns) padded
    to w + 2r + 1 columns and read back as rows of w + 2r lands each row a places to the right.
    """
    w, r, big_l, nb, window = geo.block, geo.radius, geo.num_long, geo.num_blocks, geo.window
    compact = getattr(source, "compact", None)
    if compact is not None:  # the same labels without the [B, L, 2r+1] side-input rows
        index = band_labels(compact, w, r, nb, geo.vocab, label_dtype(geo.vocab))
        return index, (index == geo.vocab).all(-1).view(geo.batch, geo.padded_long)
    l2l_mask, l2l_ids = source.l2l()
    col0 = source.radius - r  # the radius clipped to L-1
    in_c = fused_cpu_labels.dense_band(l2l_mask, l2l_ids, col0, r, w, nb, geo.vocab, label_dtype(geo.vocab))
    if in_c is not None:
        return in_c
    rows = torch.arange(big_l, device=l2l_mask.device)
    keys = rows[:, None] + torch.arange(-r, r + 1, device=rows.device)[None, :]
    columns = slice(col0, col0 + 2 * r + 1)
    allowed = (l2l_mask[:, :, columns] != 0) & (keys >= 0) & (keys < big_l)
    index = torch.where(allowed, l2l_ids[:, :, columns].to(label_dtype(geo.vocab)), geo.vocab)  # V: masked
    index = pad_dim(index, nb * w, -2, geo.vocab).view(geo.batch, nb, w, 2 * r + 1)
    index = torch.nn.functional.pad(index, (0, w), value=geo.vocab)  # [B, nb, w, window + 1]
    index = index.flatten(2)[:, :, : w * window].reshape(geo.batch, nb, w, window)
    return index, (index == geo.vocab).all(-1).view(geo.batch, geo.padded_long)


class Scratches:
    """One worker's scratch buffers (reused by all its chunks): the score tile (later its
    gradient), the probabilities, their gradient, the gather index, the key and value windows,
    and the window gradients."""

    def __init__(self, like: torch.Tensor):
        for name in ("scores", "probs", "d_probs", "keys", "values", "d_windows"):
            setattr(self, name, Scratch(like))
        self.index = Scratch(like, torch.int64)


def _gather_labels(table: torch.Tensor, index: torch.Tensor, scores: torch.Tensor) -> None:
    """scores[b, h, i, j] = table[b, h, i, index[b, i, j]] for every head. 16-bit tables are
    gathered as int16 (the same bits): torch's bf16 gather is 1.9x slower than its int16 one."""
    if table.dtype in (torch.bfloat16, torch.float16):
        table, scores = table.view(torch.int16), scores.view(torch.int16)
    torch.gather(table, -1, index.unsqueeze(1).expand(scores.shape), out=scores)


class _Tile:
    """A chunk's score tile [BH, rows, K] and the softmax over its rows.

    The last column is a sink: its score is 0 in rows with no allowed key and -inf elsewhere
    (one compare over the index, no read-back), and no value row belongs to it. An empty row's
    softmax puts all its weight there, so its output is 0 and so are its gradients (an all -inf
    row would give NaN); in other rows it has weight 0 and changes nothing."""

    scores: torch.Tensor
    index: torch.Tensor  # [B, rows, K]
    split: int  # columns before `split` are the first key set, then the second up to the sink

    def _take_index(self, lay: CallTensors, key: tuple, index: torch.Tensor, build: Callable[[], None]) -> None:
        """Fill `index` [B, rows, width] from the plan's cache, or build() it and offer it to the
        cache; then point each column at its copy of the label table (see LANES)."""
        self.index = index
        labels = lay.index_cache.get(key)
        if labels is None:
            build()
            lay.index_cache.keep(key, index)
            labels = index
        if lay.lanes is not None:
            torch.add(labels, lay.lanes[: index.shape[-1]], out=index)
        elif labels is not index:
            index.copy_(labels)

    def _add_sink(self, vocab: int, empty: torch.Tensor) -> None:
        """empty [B, rows] bool: the rows with no allowed key."""
        self.index[:, :, -1] = empty.long() + vocab  # V + 1 (score 0) where empty, else V (-inf)

    def _put_labels(self, columns: slice, mask: torch.Tensor, ids: torch.Tensor, vocab: int, rows=None) -> None:
        """index[:, rows, columns] = the label where `mask` allows the pair, else the -inf column V."""
        rows = slice(None) if rows is None else rows
        self.index[:, rows, columns].copy_(torch.where(mask != 0, ids, vocab))

    def probs(self, scratch: Scratches) -> torch.Tensor:
        """softmax(scores) in one fused pass."""
        probs = scratch.probs.take(*self.scores.shape)
        return torch.ops.aten._softmax.out(self.scores, -1, False, out=probs)

    def d_probs(self, scratch: Scratches) -> torch.Tensor:
        """The buffer for dP = dO . V^T; the sink's column (no value) is 0."""
        d_probs = scratch.d_probs.take(*self.scores.shape)
        d_probs[:, :, -1] = 0.0
        return d_probs

    def score_grad(self, d_probs: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """dS = P * (dP - rowsum(dP * P)), written over the score tile (no longer needed)."""
        return torch.ops.aten._softmax_backward_data.out(d_probs, probs, -1, probs.dtype, grad_input=self.scores)

    def second(self, tile: torch.Tensor) -> torch.Tensor:
        return tile[:, :, self.split : -1]


class LongChunk(_Tile):
    """Long-query blocks first..last-1 (R = nbc*w rows): columns [0, w + 2r) are each block's band
    window, the rest the global keys `keys` that any of its rows may see."""

    def __init__(self, lay: CallTensors, first: int, last: int, scratch: Scratches):
        geo = lay.geo
        bh, w, nbc, window = geo.bh, geo.block, last - first, geo.window
        self.first, self.last, self.nbc, self.block = first, last, nbc, w
        self.row_slice = slice(first * w, last * w)
        rows = nbc * w
        self.keys = long_chunk_keys(lay, first)
        lo, hi = self.keys.start, self.keys.stop
        self.split, width = window, window + hi - lo + 1
        index = scratch.index.take(geo.batch, rows, width)
        build = partial(self._build_index, lay, window, lo, hi)
        self._take_index(lay, ("long", first), index, build)
        self.q = lay.rows(lay.lq, first, last)  # [BH*nbc, w, d]
        self.k_windows = lay.windows(lay.lk, first, last, scratch.keys)
        self.v_windows = lay.windows(lay.lv, first, last, scratch.values)
        table = lay.t_long[:, :, self.row_slice]  # [B, H, R, lanes * (V+2)]
        scores = scratch.scores.take(geo.batch, geo.heads, rows, width)
        _gather_labels(table, index, scores)
        self.scores = scores.view(bh, rows, width)
        self.band(self.scores).baddbmm_(self.q, self.k_windows.transpose(1, 2), alpha=geo.scale)
        if hi > lo:
            self.second(self.scores).baddbmm_(self.q_rows, lay.gk[:, lo:hi].transpose(1, 2), alpha=geo.scale)

    def _build_index(self, lay: CallTensors, window: int, lo: int, hi: int) -> None:
        """The band's labels (skewed once per batch), the l2g labels of the keys lo..hi-1, and the sink."""
        geo, index = lay.geo, self.index
        index[:, :, :window] = lay.local_index[:, self.first : self.last].reshape(geo.batch, -1, window)
        empty = lay.local_empty[:, self.row_slice]
        if hi > lo:
            real = min(self.row_slice.stop, geo.num_long) - self.row_slice.start
            mask, ids = lay.source.l2g(slice(self.row_slice.start, self.row_slice.start + real), self.keys)
            self._put_labels(slice(window, -1), mask, ids, geo.vocab, slice(0, real))
            index[:, real:, window:-1] = geo.vocab
            empty = empty.clone()
            empty[:, :real] &= ~(mask != 0).any(-1)
        self._add_sink(geo.vocab, empty)

    @property
    def has_globals(self) -> bool:
        return self.keys.stop > self.keys.start

    def band(self, tile: torch.Tensor) -> torch.Tensor:
        """The band columns of a [BH, R, K] tile as [BH*nbc, w, w + 2r] (row stride K)."""
        bh, rows, width = tile.shape
        return tile.view(bh * self.nbc, self.block, width)[:, :, : self.split]

    @property
    def q_rows(self) -> torch.Tensor:
        return self.q.view(-1, self.nbc * self.q.shape[1], self.q.shape[2])


class GlobalChunk(_Tile):
    """Global query rows start..stop-1: columns [0, G_keys) are the global keys (g2g), the rest
    the long keys `keys` that any of its rows may see (g2l)."""

    def __init__(self, lay: CallTensors, start: int, stop: int, scratch: Scratches):
        geo = lay.geo
        bh, rows, num_keys = geo.bh, stop - start, geo.num_global_keys
        self.rows = slice(start, stop)
        self.q = lay.gq[:, start:stop]
        self.keys = global_chunk_keys(lay, start)
        self.split, width = num_keys, num_keys + self.keys.stop - self.keys.start + 1
        index = scratch.index.take(geo.batch, rows, width)
        self._take_index(lay, ("global", start), index, partial(self._build_index, lay))
        scores = scratch.scores.take(geo.batch, geo.heads, rows, width)
        _gather_labels(lay.t_global[:, :, start:stop], index, scores)
        self.scores = scores.view(bh, rows, width)
        self.scores[:, :, :num_keys].baddbmm_(self.q, lay.gk.transpose(1, 2), alpha=geo.scale)
        if self.has_long:
            self.second(self.scores).baddbmm_(self.q, lay.lk[:, self.keys].transpose(1, 2), alpha=geo.scale)

    def _build_index(self, lay: CallTensors) -> None:
        """The g2g labels, the g2l labels of the long keys in self.keys, and the sink."""
        vocab = lay.geo.vocab
        mask, ids = lay.source.g2g(self.rows)
        self._put_labels(slice(0, self.split), mask, ids, vocab)
        empty = ~(mask != 0).any(-1)
        if self.has_long:
            mask, ids = lay.source.g2l(self.rows, self.keys)
            self._put_labels(slice(self.split, -1), mask, ids, vocab)
            empty &= ~(mask != 0).any(-1)
        self._add_sink(vocab, empty)

    @property
    def has_long(self) -> bool:
        return self.keys.stop > self.keys.start

    def first_part(self, tile: torch.Tensor) -> torch.Tensor:
        return tile[:, :, : self.split]


def long_chunk_keys(lay: CallTensors, first: int) -> slice:
    """The global keys any row of the long chunk from block `first` may see."""
    geo = lay.geo
    lo, hi = lay.long_spans[first // geo.blocks_per_chunk] if geo.num_global_keys else (0, 0)
    return slice(lo, max(hi, lo))


def global_chunk_keys(lay: CallTensors, start: int) -> slice:
    """The long keys any row of the global chunk from row `start` may see."""
    lo, hi = lay.global_spans[start // lay.geo.global_rows_per_chunk]
    return slice(lo, max(hi, lo))


def long_chunks(geo: Geometry):
    for first in range(0, geo.num_blocks, geo.blocks_per_chunk):
        yield first, min(first + geo.blocks_per_chunk, geo.num_blocks)


def global_chunks(geo: Geometry):
    for start in range(0, geo.num_global, geo.global_rows_per_chunk):
        yield start, min(start + geo.global_rows_per_chunk, geo.num_global)


def chunk_tasks(lay: CallTensors, queries: str, long_task, global_task) -> tuple[list, list[int]]:
    """The chunks of the query sides asked for ("both", "global" or "long") as tasks of
    run_tasks, and what each costs (the scores it computes)."""
    geo = lay.geo
    tasks, costs = [], []
    if queries != "long":
        for start, stop in global_chunks(geo):
            keys = global_chunk_keys(lay, start)
            tasks.append(partial(global_task, start, stop))
            costs.append((stop - start) * (geo.num_global_keys + keys.stop - keys.start))
    if queries != "global":
        for first, last in long_chunks(geo):
            keys = long_chunk_keys(lay, first)
            tasks.append(partial(long_task, first, last))
            costs.append((last - first) * geo.block * (geo.window + keys.stop - keys.start))
    return tasks, costs


def query_outputs(lay: CallTensors, queries: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(global_out [BH, G, d], long_out [BH, L, d]): the side not computed is zeros."""
    geo, d = lay.geo, lay.dim
    new_global = lay.gq.new_zeros if queries == "long" else lay.gq.new_empty
    new_long = lay.lq.new_zeros if queries == "global" else lay.lq.new_empty
    return new_global(geo.bh, geo.num_global, d), new_long(geo.bh, geo.num_long, d)
