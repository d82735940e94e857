"""Block summaries: long inputs drawn as blocks of tokens instead of one cell per pair.

Each block cell covers a run of queries by a run of keys. Its shade is the share of pairs the
masks allow; its color is the label most of those allowed pairs carry. Blocks never straddle the
global/long boundary, so the four pieces stay separate. Counting is one `bincount` per piece
over (query block, key block, label), reading each side input once: a 4096 + 256 instance never
builds its 4352 x 4352 grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphattn.errors import GraphattnError
from graphattn.viz.pattern import MASKED, AxisRange, Pattern

DEFAULT_MAX_BLOCKS = 320  # per axis; a 4352-token axis gets blocks of 16
CHUNK_CELLS = 1 << 22  # pairs read from the side inputs at once
MAX_HISTOGRAM = 1 << 26  # (query block, key block, label) counts held at once


@dataclass(frozen=True)
class BlockAxis:
    """How one axis ([global ; long] positions in `span`) is cut into blocks."""

    starts: np.ndarray  # [B] first position of each block
    stops: np.ndarray  # [B] one past its last position
    global_length: int

    @classmethod
    def cut(cls, span: AxisRange, global_length: int, block_size: int) -> "BlockAxis":
        """Blocks of `block_size` from the start of each part (global, long) inside `span`."""
        starts, stops = [], []
        for lo, hi in ((span.start, min(span.stop, global_length)), (max(span.start, global_length), span.stop)):
            if hi > lo:
                first = np.arange(lo, hi, block_size)
                starts.append(first)
                stops.append(np.minimum(first + block_size, hi))
        return cls(np.concatenate(starts), np.concatenate(stops), global_length)

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def sizes(self) -> np.ndarray:
        return self.stops - self.starts

    @property
    def span(self) -> AxisRange:
        return AxisRange(int(self.starts[0]), int(self.stops[-1]))

    def block_of(self, positions: np.ndarray) -> np.ndarray:
        """Block index of each position (positions must lie inside the axis)."""
        return np.searchsorted(self.starts, positions, side="right") - 1

    @property
    def edges(self) -> np.ndarray:
        """[B + 1] block boundaries (for drawing)."""
        return np.append(self.starts, self.stops[-1])


def choose_block_size(length: int, max_blocks: int = DEFAULT_MAX_BLOCKS) -> int:
    """The smallest power of two that cuts `length` positions into at most `max_blocks` blocks
    (plus the one split at the global/long boundary)."""
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(length / max_blocks)))))


@dataclass
class BlockSummary:
    """Per block: allowed pairs per label, the share allowed, and the dominant label."""

    queries: BlockAxis
    keys: BlockAxis
    counts: np.ndarray  # [Bq, Bk, V] allowed pairs per label
    allowed: np.ndarray  # [Bq, Bk] allowed pairs
    share: np.ndarray  # [Bq, Bk] allowed / all pairs in the block
    dominant: np.ndarray  # [Bq, Bk] most frequent label among allowed pairs, MASKED if none

    def labels_present(self) -> np.ndarray:
        """Label ids drawn: the dominant label of at least one block."""
        return np.unique(self.dominant[self.dominant != MASKED])

    def labels_in_region(self) -> np.ndarray:
        """Label ids of any allowed pair in the region, dominant or not."""
        return np.flatnonzero(self.counts.sum(axis=(0, 1)))


class _Counter:
    """Accumulates label counts into the (query block, key block, label) histogram."""

    def __init__(self, queries: BlockAxis, keys: BlockAxis, vocab_size: int):
        self.queries, self.keys, self.vocab_size = queries, keys, vocab_size
        self.flat = np.zeros(len(queries) * len(keys) * vocab_size, dtype=np.int64)

    def add(self, query_blocks: np.ndarray, key_blocks: np.ndarray, labels: np.ndarray) -> None:
        """Count allowed cells; the three arrays broadcast against each other."""
        query_blocks, key_blocks, labels = np.broadcast_arrays(query_blocks, key_blocks, labels)
        keep = labels != MASKED
        index = (query_blocks[keep] * len(self.keys) + key_blocks[keep]) * self.vocab_size + labels[keep]
        self.flat += np.bincount(index, minlength=self.flat.size)

    def counts(self) -> np.ndarray:
        return self.flat.reshape(len(self.queries), len(self.keys), self.vocab_size)


def block_summary(
    pattern: Pattern,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
    block_size: int | None = None,
) -> BlockSummary:
    """Summarize `queries` x `keys` (default: everything) in blocks of `block_size` tokens."""
    queries = queries or pattern.full_range()
    keys = keys or pattern.full_range()
    G = pattern.global_length
    block_size = block_size or choose_block_size(max(len(queries), len(keys)))
    q_axis = BlockAxis.cut(queries, G, block_size)
    k_axis = BlockAxis.cut(keys, G, block_size)
    cells = len(q_axis) * len(k_axis) * len(pattern.vocab)
    if cells > MAX_HISTOGRAM:
        raise GraphattnError(
            f"blocks of {block_size} tokens over {len(queries)} x {len(keys)} positions need a {len(q_axis)} x {len(k_axis)} x "
            f"{len(pattern.vocab)}-label histogram; use blocks of at least "
            f"{choose_block_size(max(len(queries), len(keys)), int((MAX_HISTOGRAM / len(pattern.vocab)) ** 0.5) - 2)} tokens or a smaller range"
        )
    counter = _Counter(q_axis, k_axis, len(pattern.vocab))

    qg, ql = queries.split(G)
    kg, kl = keys.split(G)
    k_global = k_axis.block_of(np.arange(kg.start, kg.stop))[None, :]
    k_long = k_axis.block_of(np.arange(kl.start, kl.stop) + G)[None, :]
    # row chunks keep each piece read at CHUNK_CELLS at a time, however long the input
    for rows in _chunks(qg, max(len(k_global[0]), len(k_long[0]))):
        q_blocks = q_axis.block_of(np.arange(rows.start, rows.stop))[:, None]
        counter.add(q_blocks, k_global, pattern.piece("g2g", rows, kg))
        counter.add(q_blocks, k_long, pattern.piece("g2l", rows, kl))
    for rows in _chunks(ql, max(len(k_global[0]), 2 * pattern.radius + 1)):
        q_blocks = q_axis.block_of(np.arange(rows.start, rows.stop) + G)[:, None]
        counter.add(q_blocks, k_global, pattern.piece("l2g", rows, kg))
        _add_band(counter, pattern, rows, kl, q_blocks)

    counts = counter.counts()
    allowed = counts.sum(axis=2)
    pairs = q_axis.sizes[:, None] * k_axis.sizes[None, :]
    dominant = np.where(allowed > 0, counts.argmax(axis=2), MASKED)
    return BlockSummary(q_axis, k_axis, counts, allowed, allowed / pairs, dominant)


def _chunks(rows: slice, width: int):
    """Consecutive slices of `rows`, each of at most CHUNK_CELLS cells at `width` columns."""
    step = max(1, CHUNK_CELLS // max(1, width))
    for start in range(rows.start, rows.stop, step):
        yield slice(start, min(start + step, rows.stop))


def _add_band(counter: _Counter, pattern: Pattern, rows: slice, cols: slice, query_blocks: np.ndarray) -> None:
    """Count l2l straight from the [n, 2r+1] band: key j = i + c - r, kept when j is in `cols`."""
    if rows.stop <= rows.start or cols.stop <= cols.start:
        return
    band = pattern.band(rows)
    keys = np.arange(rows.start, rows.stop)[:, None] + np.arange(-pattern.radius, pattern.radius + 1)[None, :]
    inside = (keys >= cols.start) & (keys < cols.stop)
    labels = np.where(inside, band, MASKED)
    key_blocks = counter.keys.block_of(np.clip(keys, cols.start, cols.stop - 1) + pattern.global_length)
    counter.add(query_blocks, key_blocks, labels)
