"""Block summaries: long inputs drawn as blocks of tokens instead of one cell per pair.

Each block cell covers a run of queries by a run of keys. What it shows (`BlockSummary.drawn`)
is its structure label when it has one, else its most common label: a schema label (links such
as `mention_of`) before `belongs`, `belongs` before the distance and `does_not_belong` labels,
so a block of 1,024 long tokens by 1,024 globals where each token belongs to one global reads
as `belongs`, not as the million `does_not_belong` pairs around those, and l2g looks like the
g2l of the same ownership. Its shade is the share of the block's pairs that carry that label.
Blocks never straddle the global/long boundary, so the four pieces stay separate.

Counting reads each side input once: dense side inputs a row chunk at a time, compact ones
through `compact_blocks` (products of per-block class counts; memory O(L + G + E + blocks)),
so neither a 4096 + 256 nor a 262,144 + 20,000 instance ever builds its full grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from graphattn.errors import GraphattnError
from graphattn.labels import first_schema_label_id
from graphattn.viz.compact_blocks import Histogram, count_band, count_cross, count_g2g, unique_pairs
from graphattn.viz.pattern import MASKED, AxisRange, Pattern

DEFAULT_MAX_BLOCKS = 320  # per axis; a 4352-token axis gets blocks of 16
CHUNK_CELLS = 1 << 22  # pairs read from dense side inputs at once
MAX_HISTOGRAM = 1 << 26  # (query block, key block, label) counts held at once


@dataclass(frozen=True)
class BlockAxis:
    """How one axis ([global ; long] positions in `span`) is cut into blocks."""

    starts: np.ndarray  # [B] first position of each block
    stops: np.ndarray  # [B] one past its last position
    global_length: int
    block_size: int = 0  # blocks of this size from the start of each part (0: irregular, found by search)

    @classmethod
    def cut(cls, span: AxisRange, global_length: int, block_size: int) -> BlockAxis:
        """Blocks of `block_size` from the start of each part (global, long) inside `span`."""
        starts, stops = [], []
        for lo, hi in ((span.start, min(span.stop, global_length)), (max(span.start, global_length), span.stop)):
            if hi > lo:
                first = np.arange(lo, hi, block_size)
                starts.append(first)
                stops.append(np.minimum(first + block_size, hi))
        return cls(np.concatenate(starts), np.concatenate(stops), global_length, block_size)

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
        positions = np.asarray(positions, dtype=np.int64)
        if not self.block_size:
            return np.searchsorted(self.starts, positions, side="right") - 1
        G = self.global_length
        global_blocks = int(np.count_nonzero(self.starts < G))
        first_global = int(self.starts[0])
        first_long = int(self.starts[global_blocks]) if global_blocks < len(self) else G
        in_long = positions >= G
        return np.where(
            in_long,
            global_blocks + (positions - first_long) // self.block_size,
            (positions - first_global) // self.block_size,
        )

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
    """Per block: allowed pairs per label, the share allowed, the dominant and the drawn label."""

    queries: BlockAxis
    keys: BlockAxis
    counts: np.ndarray  # [Bq, Bk, V] allowed pairs per label
    allowed: np.ndarray  # [Bq, Bk] allowed pairs
    share: np.ndarray  # [Bq, Bk] allowed / all pairs in the block
    dominant: np.ndarray  # [Bq, Bk] most frequent label among allowed pairs, MASKED if none
    drawn: np.ndarray  # [Bq, Bk] the label the block shows (structure first, see the module), MASKED if none
    drawn_share: np.ndarray  # [Bq, Bk] pairs carrying `drawn` / all pairs in the block

    def labels_present(self) -> np.ndarray:
        """Label ids drawn: the shown label of at least one block."""
        return np.unique(self.drawn[self.drawn != MASKED])

    def labels_in_region(self) -> np.ndarray:
        """Label ids of any allowed pair in the region, shown or not."""
        return np.flatnonzero(self.counts.sum(axis=(0, 1)))


def drawn_labels(counts: np.ndarray, max_distance: int, belongs: int) -> np.ndarray:
    """Per block the label it shows: the most frequent schema label if any pair has one, else
    `belongs` if any pair has it, else the most frequent label; MASKED where nothing is allowed."""
    first_schema = first_schema_label_id(max_distance)
    schema = counts[..., first_schema:]
    most = counts.argmax(axis=-1)
    out = np.where(counts[..., belongs] > 0, belongs, most)
    if schema.shape[-1]:
        out = np.where(schema.max(axis=-1) > 0, first_schema + schema.argmax(axis=-1), out)
    return np.where(counts.sum(axis=-1) > 0, out, MASKED)


def block_summary(
    pattern: Pattern,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
    block_size: int | None = None,
) -> BlockSummary:
    """Summarize `queries` x `keys` (default: everything) in blocks of `block_size` tokens."""
    queries, keys = pattern.checked(queries, "queries"), pattern.checked(keys, "keys")
    block_size = block_size or choose_block_size(max(len(queries), len(keys)))
    q_axis = BlockAxis.cut(queries, pattern.global_length, block_size)
    k_axis = BlockAxis.cut(keys, pattern.global_length, block_size)
    cells = len(q_axis) * len(k_axis) * len(pattern.vocab)
    if cells > MAX_HISTOGRAM:
        raise GraphattnError(
            f"blocks of {block_size} tokens over {len(queries)} x {len(keys)} positions "
            f"need a {len(q_axis)} x {len(k_axis)} x {len(pattern.vocab)}-label histogram; use blocks of at least "
            f"{choose_block_size(max(len(queries), len(keys)), int((MAX_HISTOGRAM / len(pattern.vocab)) ** 0.5) - 2)}"
            " tokens or a smaller range"
        )
    hist = Histogram(len(q_axis), len(k_axis), len(pattern.vocab))
    count = _count_compact if pattern.compact is not None else _count_dense
    count(hist, pattern, queries, keys, q_axis, k_axis)

    counts = hist.counts()
    allowed = counts.sum(axis=2)
    pairs = q_axis.sizes[:, None] * k_axis.sizes[None, :]
    dominant = np.where(allowed > 0, counts.argmax(axis=2), MASKED)
    drawn = drawn_labels(counts, pattern.vocab.max_distance, pattern.vocab.belongs)
    drawn_count = np.take_along_axis(counts, np.maximum(drawn, 0)[..., None], axis=2)[..., 0]
    drawn_share = np.where(drawn >= 0, drawn_count / pairs, 0.0)
    return BlockSummary(q_axis, k_axis, counts, allowed, allowed / pairs, dominant, drawn, drawn_share)


def _count_dense(
    hist: Histogram, pattern: Pattern, queries: AxisRange, keys: AxisRange, q_axis: BlockAxis, k_axis: BlockAxis
) -> None:
    """One pass over the stored pieces, a row chunk at a time."""
    G = pattern.global_length
    qg, ql = queries.split(G)
    kg, kl = keys.split(G)
    k_global = k_axis.block_of(np.arange(kg.start, kg.stop))[None, :]
    k_long = k_axis.block_of(np.arange(kl.start, kl.stop) + G)[None, :]
    # row chunks keep each piece read at CHUNK_CELLS at a time, however long the input
    for rows in _chunks(qg, max(len(k_global[0]), len(k_long[0]))):
        q_blocks = q_axis.block_of(np.arange(rows.start, rows.stop))[:, None]
        hist.add(q_blocks, k_global, pattern.piece("g2g", rows, kg))
        hist.add(q_blocks, k_long, pattern.piece("g2l", rows, kl))
    for rows in _chunks(ql, len(k_global[0])):
        q_blocks = q_axis.block_of(np.arange(rows.start, rows.stop) + G)[:, None]
        hist.add(q_blocks, k_global, pattern.piece("l2g", rows, kg))
    count_band(hist, pattern, ql, kl, q_axis.block_of(np.arange(ql.start, ql.stop) + G), k_axis.block_of)


def _count_compact(
    hist: Histogram, pattern: Pattern, queries: AxisRange, keys: AxisRange, q_axis: BlockAxis, k_axis: BlockAxis
) -> None:
    """From owner ids, documents, segments, links and the band (see compact_blocks)."""
    compact, G = pattern.compact, pattern.global_length
    qg, ql = queries.split(G)
    kg, kl = keys.split(G)
    q_global, q_long = q_axis.block_of(np.arange(qg.start, qg.stop)), q_axis.block_of(np.arange(ql.start, ql.stop) + G)
    k_global, k_long = k_axis.block_of(np.arange(kg.start, kg.stop)), k_axis.block_of(np.arange(kl.start, kl.stop) + G)
    dnb = compact.does_not_belong

    if ql.stop > ql.start and kg.stop > kg.start:
        pairs = _structure_pairs(compact, ql, kg)
        count_cross(
            hist, q_long, compact.long_doc[ql], ~compact.long_hard_l2g[ql], k_global, compact.global_doc[kg], pairs, dnb
        )
    if qg.stop > qg.start and kl.stop > kl.start:
        tok, glob, label = _structure_pairs(compact, kl, qg)
        count_cross(
            hist,
            q_global,
            compact.global_doc[qg],
            ~compact.global_hard_g2l[qg],
            k_long,
            compact.long_doc[kl],
            (glob, tok, label),
            dnb,
        )
    ranges = lambda axis: (axis.starts, axis.stops)  # noqa: E731
    count_g2g(hist, compact, qg, kg, q_global, k_global, ranges(q_axis), ranges(k_axis))
    count_band(hist, pattern, ql, kl, q_long, k_axis.block_of)


def _structure_pairs(compact, longs: slice, globals_: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(long, global, label) relative to the ranges' starts: every owned pair (`belongs`) and
    every link (its label; a link wins over ownership of the same pair), each pair once."""
    tok, glob = compact.owned_pairs(longs)
    inside = (glob >= globals_.start) & (glob < globals_.stop)
    ltok, lglob, llabel = compact.links_in(longs, globals_)
    tok = np.concatenate([tok[inside], ltok]) - longs.start
    glob = np.concatenate([glob[inside], lglob]) - globals_.start
    labels = np.concatenate([np.full(int(inside.sum()), compact.belongs, np.int64), np.asarray(llabel, np.int64)])
    return unique_pairs(tok, glob, labels, compact.global_length)


def _chunks(rows: slice, width: int):
    """Consecutive slices of `rows`, each of at most CHUNK_CELLS cells at `width` columns."""
    step = max(1, CHUNK_CELLS // max(1, width))
    for start in range(rows.start, rows.stop, step):
        yield slice(start, min(start + step, rows.stop))
