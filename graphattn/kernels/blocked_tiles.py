"""Tiles of the blocked backend: geometry, per-call layouts, score tiles, and the chunk runner.

Kept apart from the softmax arithmetic in blocked.py. What depends only on the side inputs (the
skewed l2l label index, each chunk's key span) is built once per batch (`BlockedPlan`); a chunk's
score tiles are built from the inputs on every call, so forward and backward rebuild the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

# Elements of one score tile (all heads of a chunk): bounds memory, keeps tiles cache-friendly.
TILE_ELEMENTS = 1 << 21
NEG_INF = float("-inf")


def default_block_size(radius: int) -> int:
    """Rows per long-query block: the window is 3w keys for 2r+1 needed, so w = r wastes least;
    very small radii get bigger blocks so that the matmuls stay worth calling."""
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

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def padded_long(self) -> int:
        return self.num_blocks * self.block


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
    """Block size and chunk sizes for one call: a chunk's score tiles (all heads) hold at most
    `tile_elements` values, whatever L is, so memory stays linear in L."""
    num_keys = num_global if num_global_keys is None else num_global_keys
    # Keys farther than L-1 away never exist, so a huge radius (BERT-style r >= L) costs nothing.
    radius = min(radius, max(num_long - 1, 0))
    block = max(block_size or default_block_size(radius), radius, 1)
    num_blocks = max(1, math.ceil(num_long / block))
    per_block = batch * heads * block * 3 * block
    blocks_per_chunk = max(1, min(num_blocks, tile_elements // per_block))
    per_global_row = batch * heads * max(num_keys, num_long)
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
    )


class Scratch:
    """One buffer reused by every chunk: large fresh tensors cost page faults on every call."""

    def __init__(self, like: torch.Tensor):
        self.like, self.buffer = like, None

    def take(self, *shape: int) -> torch.Tensor:
        size = math.prod(shape)
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = self.like.new_empty(size)
        return self.buffer[:size].view(shape)


def _label_index(mask: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 gather index: the label where the mask allows the pair, else the -inf column V."""
    return torch.where(mask != 0, ids.long(), vocab)


def pad_dim(x: torch.Tensor, size: int, dim: int, value: float | int = 0) -> torch.Tensor:
    """Pad `x` at the end of `dim` (negative) up to `size`."""
    missing = size - x.shape[dim]
    if missing == 0:
        return x
    return torch.nn.functional.pad(x, [0, 0] * (-dim - 1) + [0, missing], value=value)


def _extend_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """[B, H, n, V] -> [B, H, rows, V+1] with the -inf column for masked pairs."""
    b, h, n, v = table.shape
    out = table.new_full((b, h, rows, v + 1), NEG_INF)
    out[:, :, :n, :v] = table
    return out


@dataclass
class BlockedPlan:
    """What the blocked backend reuses across a batch's layers: the chunk geometry (the softmax
    scale is set per call), where masks and labels come from (dense slices or the compact
    structure, see blocked_sources.py), the skewed l2l label index and every chunk's key span."""

    geo: Geometry
    source: Any  # DenseSource | CompactSource
    local_index: torch.Tensor  # [B, 1, nb, w, 3w] int64
    long_spans: list[tuple[int, int]]  # per long chunk: the global keys its rows may see
    global_spans: list[tuple[int, int]]  # per global chunk: the long keys its rows may see
    workers: int


def make_plan(geo: Geometry, source, workers: int) -> BlockedPlan:
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
    return BlockedPlan(geo, source, _local_index(geo, source), long_spans, global_spans, workers)


class CallTensors:
    """Per-call tensors, built from the inputs by both passes. Everything is BH-major
    ([B*H, rows, ...]), so a chunk's window tiles ([BH*nbc, w, 3w]) and l2g tiles
    ([BH, nbc*w, G]) share one row order and their statistics merge without copies."""

    def __init__(self, geo: Geometry, plan: BlockedPlan, gq, gk, gv, lq, lk, lv, t_global, t_long):
        bh, d = geo.bh, lq.shape[-1]
        self.geo, self.dim, self.source = geo, d, plan.source
        self.gq = gq.reshape(bh, geo.num_global, d)
        self.gk, self.gv = (x.reshape(bh, geo.num_global_keys, d) for x in (gk, gv))
        self.lq, self.lk, self.lv = (x.reshape(bh, geo.num_long, d) for x in (lq, lk, lv))
        self.t_global = _extend_table(t_global, geo.num_global)  # [B, H, G, V+1]
        self.t_long = _extend_table(t_long, geo.padded_long)  # [B, H, Lp, V+1]
        self.local_index = plan.local_index
        self.long_spans, self.global_spans = plan.long_spans, plan.global_spans

    def rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Rows of blocks first..last-1 of x [BH, L, d] as a contiguous [BH*nbc, w, d], zeros past L."""
        geo = self.geo
        start, stop = first * geo.block, last * geo.block
        chunk = pad_dim(x[:, start : min(stop, geo.num_long)], stop - start, -2)
        return chunk.reshape(geo.bh * (last - first), geo.block, self.dim)

    def windows(self, x: torch.Tensor, first: int, last: int, scratch: Scratch) -> torch.Tensor:
        """Keys (or values) of blocks first..last-1 with both neighbours: [BH*nbc, 3w, d].

        Rows (first-1)*w .. (last+1)*w of x (zero-padded at the sequence ends) seen as blocks and
        unfolded three at a time: one copy into the scratch buffer."""
        geo, nbc = self.geo, last - first
        w, bh, length = geo.block, geo.bh, geo.num_long
        start, stop = (first - 1) * w, (last + 1) * w
        region = x[:, max(start, 0) : min(stop, length)]
        if start < 0 or stop > length:
            region = torch.nn.functional.pad(region, (0, 0, max(-start, 0), max(stop - length, 0)))
        blocks = region.view(bh, nbc + 2, w, self.dim).unfold(1, 3, 1)  # [BH, nbc, w, d, 3]
        out = scratch.take(bh, nbc, 3, w, self.dim)
        out.copy_(blocks.permute(0, 1, 4, 2, 3))
        return out.view(bh * nbc, 3 * w, self.dim)


def _local_index(geo: Geometry, source) -> torch.Tensor:
    """Gather index [B, 1, nb, w, 3w] of the l2l labels of every block, built once per call.

    Query a of a block needs window columns w-r+a .. w+r+a: the side-input row (2r+1 columns)
    padded to 3w+1 columns and reshaped to rows of 3w lands each row a places to the right.
    """
    w, r, big_l, nb = geo.block, geo.radius, geo.num_long, geo.num_blocks
    l2l_mask, l2l_ids = source.l2l()
    columns = slice(source.radius - r, source.radius + r + 1)  # radius clipped to L-1
    rows = torch.arange(big_l, device=l2l_mask.device)
    keys = rows[:, None] + torch.arange(-r, r + 1, device=rows.device)[None, :]
    allowed = (l2l_mask[:, :, columns] != 0) & (keys >= 0) & (keys < big_l)
    index = _label_index(allowed, l2l_ids[:, :, columns], geo.vocab)
    index = pad_dim(index, nb * w, -2, geo.vocab).view(geo.batch, nb, w, 2 * r + 1)
    index = torch.nn.functional.pad(index, (w - r, 2 * w - r), value=geo.vocab)  # [B, nb, w, 3w+1]
    return index.flatten(2)[:, :, : w * 3 * w].view(geo.batch, 1, nb, w, 3 * w)


def _gather_into(out: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[b, h, ..., m] = table[b, h, ..., index[b, 0, ..., m]]."""
    return torch.gather(table, -1, index.expand(out.shape), out=out)


class Scratches:
    """One worker's scratch buffers, one per kind of tile (reused by all its chunks)."""

    def __init__(self, like: torch.Tensor):
        names = ("local", "glob", "g2g", "g2l", "keys", "values", "d_local", "d_glob", "d_g2g", "d_g2l", "d_windows")
        for name in names:
            setattr(self, name, Scratch(like))


class LongChunk:
    """Score tiles of long-query blocks first..last-1: the windows [BH*nbc, w, 3w] and the
    l2g tile [BH, R, span] (R = nbc*w rows, the same row order)."""

    def __init__(self, lay: CallTensors, first: int, last: int, scratch: Scratches):
        geo = lay.geo
        bh, w, nbc = geo.bh, geo.block, last - first
        self.first, self.last, self.nbc = first, last, nbc
        self.row_slice = slice(first * w, last * w)
        rows = nbc * w
        self.q = lay.rows(lay.lq, first, last)  # [BH*nbc, w, d]
        self.k_windows = lay.windows(lay.lk, first, last, scratch.keys)
        self.v_windows = lay.windows(lay.lv, first, last, scratch.values)
        self.table = lay.t_long[:, :, self.row_slice]  # [B, H, R, V+1]
        self.local_index = lay.local_index[:, :, first:last]
        local = scratch.local.take(geo.batch, geo.heads, nbc, w, 3 * w)
        _gather_into(local, self.table.view(geo.batch, geo.heads, nbc, w, -1), self.local_index)
        self.local = local.view(bh * nbc, w, 3 * w).baddbmm_(self.q, self.k_windows.transpose(1, 2), alpha=geo.scale)

        self.glob = None
        lo, hi = lay.long_spans[first // geo.blocks_per_chunk] if geo.num_global_keys else (0, 0)
        if hi > lo:
            self.keys = slice(lo, hi)
            real = slice(self.row_slice.start, min(self.row_slice.stop, geo.num_long))
            index = _label_index(*lay.source.l2g(real, slice(lo, hi)), geo.vocab)
            self.glob_index = pad_dim(index, rows, -2, geo.vocab).unsqueeze(1)  # [B, 1, R, span]
            glob = _gather_into(scratch.glob.take(geo.batch, geo.heads, rows, hi - lo), self.table, self.glob_index)
            self.glob = glob.view(bh, rows, hi - lo).baddbmm_(
                self.q_rows, lay.gk[:, lo:hi].transpose(1, 2), alpha=geo.scale
            )

    @property
    def q_rows(self) -> torch.Tensor:
        return self.q.view(-1, self.nbc * self.q.shape[1], self.q.shape[2])


class GlobalChunk:
    """Score tiles of global query rows start..stop-1: g2g [BH, c, G_keys] and g2l [BH, c, span]."""

    def __init__(self, lay: CallTensors, start: int, stop: int, scratch: Scratches):
        geo = lay.geo
        bh, rows = geo.bh, stop - start
        self.rows = slice(start, stop)
        self.q = lay.gq[:, start:stop]
        table = lay.t_global[:, :, start:stop]
        self.g2g_index = _label_index(*lay.source.g2g(slice(start, stop)), geo.vocab).unsqueeze(1)
        g2g = _gather_into(scratch.g2g.take(geo.batch, geo.heads, rows, geo.num_global_keys), table, self.g2g_index)
        self.g2g = g2g.view(bh, rows, geo.num_global_keys).baddbmm_(self.q, lay.gk.transpose(1, 2), alpha=geo.scale)
        self.g2l = None
        lo, hi = lay.global_spans[start // geo.global_rows_per_chunk]
        if hi > lo:
            self.keys = slice(lo, hi)
            self.g2l_index = _label_index(*lay.source.g2l(slice(start, stop), slice(lo, hi)), geo.vocab).unsqueeze(1)
            g2l = _gather_into(scratch.g2l.take(geo.batch, geo.heads, rows, hi - lo), table, self.g2l_index)
            self.g2l = g2l.view(bh, rows, hi - lo).baddbmm_(self.q, lay.lk[:, lo:hi].transpose(1, 2), alpha=geo.scale)


def long_chunks(geo: Geometry):
    for first in range(0, geo.num_blocks, geo.blocks_per_chunk):
        yield first, min(first + geo.blocks_per_chunk, geo.num_blocks)


def global_chunks(geo: Geometry):
    for start in range(0, geo.num_global, geo.global_rows_per_chunk):
        yield start, min(start + geo.global_rows_per_chunk, geo.num_global)


def run_tasks(tasks: list[Callable[[Any], None]], make_state: Callable[[], Any], workers: int) -> list[Any]:
    """Run tasks, each given its worker's state (scratch buffers, private accumulators).

    With several workers the tasks are dealt round robin to Python threads that each run torch
    with ONE intra-op thread: a chunk is a few dozen mid-sized ops, and on a busy machine every
    multi-threaded op waits for a descheduled OpenMP thread at its barrier (measured 5-10x
    slower at L = 4096 on a loaded 2-core machine); independent threads have no barriers. The
    caller's thread count is restored in each worker, and the caller's own setting is untouched.
    """
    if workers <= 1 or len(tasks) <= 1:
        state = make_state()
        for task in tasks:
            task(state)
        return [state]
    threads, grad_enabled = torch.get_num_threads(), torch.is_grad_enabled()

    def work(part: list) -> Any:
        torch.set_num_threads(1)
        try:
            with torch.set_grad_enabled(grad_enabled):  # grad mode is per thread
                state = make_state()
                for task in part:
                    task(state)
        finally:
            torch.set_num_threads(threads)
        return state

    parts = [tasks[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers, thread_name_prefix="graphattn-blocked") as pool:
        return list(pool.map(work, parts))
