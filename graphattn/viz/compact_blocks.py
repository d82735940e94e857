"""Block summaries counted straight from the compact side inputs, in O(L + G + E + blocks) memory.

A 262,144-token instance with 20,000 globals has 5.2e9 l2g pairs and 4e8 g2g pairs: too many to
read even a row chunk at a time. Every pair's mask and label is a function of a few per-token
and per-global ids (see `graphattn.compact`), so most of the counting is a matter of classes:

* l2g / g2l: a pair is allowed by default when both ends are in one document and the query row
  is not under the hard mask; it is then labelled `does_not_belong`. Per block pair that count
  is a product of two (block x document) count matrices (scipy.sparse). The owned and linked
  pairs (`belongs`, schema labels; always allowed) are a list of O(L + E) pairs counted one by
  one, each moved out of the default count where it fell inside it.
* g2g: same-document, same-segment and blockable counts per block pair are such products too,
  which give the allowed pairs and the cross-segment label. Distance labels are `dist:+k` or
  `dist:-k` for every pair at least k apart; the pairs closer than k (a band of 2k-1 diagonals)
  are listed and counted one by one. Block pairs whose position ranges overlap hold both signs
  and are counted cell by cell. g2g edges then move their pairs to the edge label.
* l2l: the [L, 2r+1] band, derived and counted a row chunk at a time.

`compact_counts` returns the same [Bq, Bk, V] histogram that counting every pair gives (the tests
compare it with brute force).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from graphattn.labels import relative_position_ids

CHUNK_CELLS = 1 << 21  # cells derived at once (band rows, overlapping g2g blocks)


class Histogram:
    """Counts per (query block, key block, label), added with optional weights (negative ones too)."""

    def __init__(self, query_blocks: int, key_blocks: int, vocab_size: int):
        self.shape = (query_blocks, key_blocks, vocab_size)
        self.flat = np.zeros(query_blocks * key_blocks * vocab_size, dtype=np.int64)

    def add(self, query_blocks, key_blocks, labels, weights=None) -> None:
        """Count cells (each `weights` times); the arrays broadcast against each other; label -1 is skipped."""
        arrays = np.broadcast_arrays(query_blocks, key_blocks, labels, 1 if weights is None else weights)
        q, k, label, weight = (a.reshape(-1) for a in arrays)
        keep = label >= 0
        if weights is not None:
            keep &= weight != 0
        index = (q[keep].astype(np.int64) * self.shape[1] + k[keep]) * self.shape[2] + label[keep]
        if not index.size:
            return
        # a row chunk touches a few query blocks: count over just that stretch of the histogram
        lo, hi = int(index.min()), int(index.max()) + 1
        counted = np.bincount(index - lo, weights=None if weights is None else weight[keep], minlength=hi - lo)
        self.flat[lo:hi] += counted.astype(np.int64)

    def counts(self) -> np.ndarray:
        return self.flat.reshape(self.shape)


def _per_block(blocks: np.ndarray, classes: np.ndarray, n_blocks: int, n_classes: int) -> sparse.csr_matrix:
    """[blocks, classes] counts of the items with these block and class indices."""
    return sparse.coo_matrix((np.ones(len(blocks), np.int64), (blocks, classes)), shape=(n_blocks, n_classes)).tocsr()


def _pair_counts(q_blocks, q_class, k_blocks, k_class, nq: int, nk: int) -> np.ndarray:
    """[nq, nk] number of (query, key) pairs per block pair whose classes are equal."""
    if not len(q_class) or not len(k_class):
        return np.zeros((nq, nk), np.int64)
    codes, inverse = np.unique(np.concatenate([q_class, k_class]), return_inverse=True)
    inverse = inverse.reshape(-1)
    a = _per_block(q_blocks, inverse[: len(q_class)], nq, len(codes))
    b = _per_block(k_blocks, inverse[len(q_class) :], nk, len(codes))
    return (a @ b.T).toarray()


def unique_pairs(q: np.ndarray, k: np.ndarray, labels: np.ndarray, n_keys: int) -> tuple[np.ndarray, ...]:
    """Pairs once each; where a pair is listed twice the later label wins (links over ownership)."""
    key = q.astype(np.int64) * n_keys + k
    order = np.argsort(key, kind="stable")
    key, q, k, labels = key[order], q[order], k[order], labels[order]
    last = np.r_[key[1:] != key[:-1], True] if len(key) else np.zeros(0, bool)
    return q[last], k[last], labels[last]


def count_cross(hist: Histogram, q_blocks, q_doc, q_soft, k_blocks, k_doc, pairs, does_not_belong: int) -> None:
    """l2g or g2l: default pairs (same document, soft query row) as `does_not_belong`, plus the
    owned and linked `pairs` = (query index, key index, label), always allowed."""
    nq, nk = hist.shape[:2]
    soft = np.asarray(q_soft, bool)
    defaults = _pair_counts(q_blocks[soft], q_doc[soft], k_blocks, k_doc, nq, nk)
    rows, cols = np.nonzero(defaults)
    hist.add(rows, cols, does_not_belong, defaults[rows, cols])
    pq, pk, labels = pairs
    if not len(pq):
        return
    hist.add(q_blocks[pq], k_blocks[pk], labels)
    counted = soft[pq] & (q_doc[pq] == k_doc[pk])  # already in `defaults` as does_not_belong
    hist.add(q_blocks[pq[counted]], k_blocks[pk[counted]], does_not_belong, -1)


def count_g2g(hist: Histogram, compact, rows: slice, cols: slice, q_blocks, k_blocks, q_ranges, k_ranges) -> None:
    """g2g over global queries `rows` x keys `cols`; `*_blocks` the block of each, `*_ranges`
    the [first, last) positions of each block in the histogram (rows of blocks outside: empty)."""
    r0, r1 = rows.start, rows.stop
    c0, c1 = cols.start, cols.stop
    if r1 <= r0 or c1 <= c0:
        return
    nq, nk = hist.shape[:2]
    k = int(compact.max_distance)
    doc, seg, blockable = compact.global_doc, compact.global_segment, compact.global_blockable
    qd, kd, qs, ks = doc[r0:r1], doc[c0:c1], seg[r0:r1], seg[c0:c1]
    qb, kb = blockable[r0:r1], blockable[c0:c1]
    # doc * (segments + 1) + segment + 1: one class per (document, segment), -1 (no segment) included
    width = int(max(seg.max(initial=-1), 0)) + 2
    q_ds, k_ds = qd.astype(np.int64) * width + qs + 1, kd.astype(np.int64) * width + ks + 1
    same_doc = _pair_counts(q_blocks, qd, k_blocks, kd, nq, nk)
    same_segment = _pair_counts(q_blocks, q_ds, k_blocks, k_ds, nq, nk)
    blocked = _pair_counts(q_blocks[qb], qd[qb], k_blocks[kb], kd[kb], nq, nk) - _pair_counts(
        q_blocks[qb], q_ds[qb], k_blocks[kb], k_ds[kb], nq, nk
    )
    allowed = same_doc - blocked
    cross = same_doc - same_segment - blocked if compact.cross_segment_label >= 0 else np.zeros_like(allowed)
    distance = allowed - cross

    # block pairs whose ranges overlap hold keys on both sides of the query: counted cell by cell
    (qa, qz), (ka, kz) = q_ranges, k_ranges
    overlap = (qa[:, None] < kz[None, :]) & (ka[None, :] < qz[:, None])
    _count_g2g_cells(hist, compact, rows, cols, q_blocks, k_blocks, overlap)

    pure = ~overlap
    far = distance.copy()
    near = _near_band(compact, rows, cols, k)
    if near is not None:  # pairs closer than k apart in pure block pairs: their own distance ids
        g, h, label = near
        keep = pure[q_blocks[g - r0], k_blocks[h - c0]]
        g, h, label = g[keep], h[keep], label[keep]
        hist.add(q_blocks[g - r0], k_blocks[h - c0], label)
        np.subtract.at(far, (q_blocks[g - r0], k_blocks[h - c0]), 1)
    right = ka[None, :] >= qz[:, None]  # every key of the block pair lies right of every query
    far_labels = np.where(right, relative_position_ids(k, k), relative_position_ids(-k, k)) if k else np.zeros_like(far)
    rows_at, cols_at = np.nonzero(pure & (far > 0))
    hist.add(rows_at, cols_at, far_labels[rows_at, cols_at], far[rows_at, cols_at])
    if compact.cross_segment_label >= 0:
        rows_at, cols_at = np.nonzero(pure & (cross > 0))
        hist.add(rows_at, cols_at, compact.cross_segment_label, cross[rows_at, cols_at])
    _move_edge_pairs(hist, compact, rows, cols, q_blocks, k_blocks, pure)


def _pair_mask_and_label(compact, g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g2g mask and label of listed pairs, before g2g edges."""
    doc, seg, blockable = compact.global_doc, compact.global_segment, compact.global_blockable
    same_doc = doc[g] == doc[h]
    cross = same_doc & (seg[g] != seg[h])
    allowed = same_doc & ~(cross & blockable[g] & blockable[h])
    label = relative_position_ids(h - g, int(compact.max_distance))
    if compact.cross_segment_label >= 0:
        label = np.where(cross, compact.cross_segment_label, label)
    return allowed, label


def _near_band(compact, rows: slice, cols: slice, k: int):
    """(g, h, label) of the allowed, distance-labelled pairs fewer than k apart."""
    if k <= 1:
        offsets = np.zeros(1 if k == 1 else 0, np.int64)
    else:
        offsets = np.arange(-(k - 1), k, dtype=np.int64)
    if not len(offsets):
        return None
    g = np.arange(rows.start, rows.stop, dtype=np.int64)[:, None]
    h = g + offsets[None, :]
    inside = (h >= cols.start) & (h < cols.stop)
    g, h = np.broadcast_to(g, h.shape)[inside], h[inside]
    allowed, _ = _pair_mask_and_label(compact, g, h)
    if compact.cross_segment_label >= 0:  # cross-segment pairs carry that label, counted by class
        allowed &= compact.global_segment[g] == compact.global_segment[h]
    label = relative_position_ids(h - g, k)
    return g[allowed], h[allowed], label[allowed]


def _count_g2g_cells(
    hist: Histogram, compact, rows: slice, cols: slice, q_blocks, k_blocks, chosen: np.ndarray
) -> None:
    """Every cell of the chosen block pairs, derived a query block at a time."""
    r0, c0 = rows.start, cols.start
    for bq in np.flatnonzero(chosen.any(axis=1)):
        q_at = np.flatnonzero(q_blocks == bq)
        k_at = np.flatnonzero(chosen[bq][k_blocks])
        if not len(q_at) or not len(k_at):
            continue
        k_lo, k_hi = int(k_at[0]), int(k_at[-1]) + 1  # the chosen key blocks are contiguous
        step = max(1, CHUNK_CELLS // (k_hi - k_lo))
        for start in range(int(q_at[0]), int(q_at[-1]) + 1, step):
            stop = min(start + step, int(q_at[-1]) + 1)
            mask, ids = compact.g2g_rows(slice(r0 + start, r0 + stop), slice(c0 + k_lo, c0 + k_hi))
            keys = k_blocks[k_lo:k_hi][None, :]
            keep = (mask == 1) & chosen[bq][keys]
            hist.add(q_blocks[start:stop][:, None], keys, np.where(keep, ids, -1))


def _move_edge_pairs(
    hist: Histogram, compact, rows: slice, cols: slice, q_blocks, k_blocks, chosen: np.ndarray
) -> None:
    """g2g edges relabel allowed pairs (masks stay): move each from its label to the edge's."""
    src, dst, label = (np.asarray(a, np.int64) for a in (compact.g2g_src, compact.g2g_dst, compact.g2g_label))
    keep = (src >= rows.start) & (src < rows.stop) & (dst >= cols.start) & (dst < cols.stop)
    src, dst, label = src[keep], dst[keep], label[keep]
    if not len(src):
        return
    # an edge listed twice ends with its last label, as the dense derivation writes them in order
    src, dst, label = unique_pairs(src, dst, label, compact.global_length)
    qb, kb = q_blocks[src - rows.start], k_blocks[dst - cols.start]
    allowed, before = _pair_mask_and_label(compact, src, dst)
    keep = allowed & chosen[qb, kb]
    hist.add(qb[keep], kb[keep], before[keep], -1)
    hist.add(qb[keep], kb[keep], label[keep])


def count_band(hist: Histogram, pattern, rows: slice, cols: slice, q_blocks, k_block_of) -> None:
    """l2l from the band, a row chunk at a time: key j = i + c - r, kept when j is in `cols`."""
    if rows.stop <= rows.start or cols.stop <= cols.start:
        return
    r = pattern.radius
    step = max(1, CHUNK_CELLS // (2 * r + 1))
    offsets = np.arange(-r, r + 1)[None, :]
    for start in range(rows.start, rows.stop, step):
        chunk = slice(start, min(start + step, rows.stop))
        band = pattern.band(chunk)
        keys = np.arange(chunk.start, chunk.stop)[:, None] + offsets
        labels = np.where((keys >= cols.start) & (keys < cols.stop), band, -1)
        key_blocks = k_block_of(np.clip(keys, cols.start, cols.stop - 1) + pattern.global_length)
        hist.add(q_blocks[chunk.start - rows.start : chunk.stop - rows.start][:, None], key_blocks, labels)
