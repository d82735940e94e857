"""Labels, masks and label terms of one tile of the ETC pattern, in registers, for the Triton kernels.

A tile is (queries qi, keys kj) of one region (g2g, g2l, l2g, l2l: `REGION_*`); qi and kj are
broadcastable index tensors, so one helper serves [queries, keys] tiles (forward, dq) and
[keys, queries] tiles (dk/dv: `KEYS_FIRST`). `tile_terms` gives the label id of every pair (-1
where the pair may not attend) and its label term qab[query, label]:

* from dense tables (`STRUCTURED` off: [B, n_q, n_k] int16 tables with -1 baked in, or the
  [B, L, 2r+1] band), the term gathered from the query tile's qab rows;
* derived from the batch's compact structure (`STRUCTURED` on), the rules of
  graphattn/kernels/structure.py:

    l2l   same long segment, |j - i| <= r             distance id of j - i
    g2g   same document, unless both blockable and the segments differ
                                                       distance id, cross-segment label, edges
    l2g   same document and the long row not hard, or owned, or linked (hard: LONG row 2)
    g2l   same document and the global row not hard, or owned, or linked (hard: GLOB row 3)
                                                       link label, else belongs / does_not_belong

  where labels follow the structure, so does the term: l2g and g2l take it from two per-row
  values (belongs, does_not_belong) and one scalar per link; the band from two per-row values
  (farther than k to the right or left) except in the tiles that cross the diagonal stripe
  |j - i| <= k, which gather like g2g. No [L, G] tensor exists.

Structure tensors (batch rows already offset by the caller): LONG [3, L] (document, segment,
hard l2g), OWN [levels, L] (owner global, -1), GLOB [4, G] (document, segment, blockable, hard
g2l), LINK_OFF [L + 1] and LINK [3, E] (long, global, label; CSR by long token), EDGE_OFF [G + 1]
and EDGE [3, E2] (source, destination, label; CSR by source).
"""

from __future__ import annotations

import triton
import triton.language as tl

REGION_G2G = tl.constexpr(0)
REGION_G2L = tl.constexpr(1)
REGION_L2G = tl.constexpr(2)
REGION_L2L = tl.constexpr(3)


@triton.jit
def batch_structure(b, structure, n_long, n_global):
    """The structure tuple with its per-row tensors' pointers at batch row `b` (LINK and EDGE are flat)."""
    LONG, OWN, GLOB, LINK_OFF, LINK, EDGE_OFF, EDGE, n_levels, n_links, n_edges, max_distance, cross_label = structure
    return (
        LONG + b * 3 * n_long,
        OWN + b * n_levels * n_long,
        GLOB + b * 4 * n_global,
        LINK_OFF + b * (n_long + 1),
        LINK,
        EDGE_OFF + b * (n_global + 1),
        EDGE,
        n_levels,
        n_links,
        n_edges,
        max_distance,
        cross_label,
    )


@triton.jit
def _distance_id(delta, max_distance):
    """etcmodel's relative id of key - query: 0 same, 1..k right, k+1..2k left, clipped."""
    clipped = tl.minimum(tl.maximum(delta, -max_distance), max_distance)
    return tl.where(clipped >= 0, clipped, max_distance - clipped)


@triton.jit
def _gather_terms(qab, labels, KEYS_FIRST: tl.constexpr):
    """qab[query, label] of every pair from the query rows' qab tile ([rows, V] or, keys first,
    [V, rows]); masked pairs (label -1) read label 0 and are masked by the caller."""
    if KEYS_FIRST:
        term = tl.gather(qab, tl.maximum(labels, 0), 0)
    else:
        term = tl.gather(qab, tl.maximum(labels, 0), 1)
    return term


@triton.jit
def _long_global(
    long_idx,
    glob_idx,
    hard,
    long_lo,
    long_hi,
    QAB,
    n_labels,
    belongs_term,
    other_term,
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    n_long,
    n_global,
    n_levels,
    n_links,
    max_distance,
    LONG_QUERIES: tl.constexpr,
):
    """(labels, allowed, term) of long/global pairs: ownership at any level, documents, links.
    LONG_QUERIES: the long tokens are the queries (l2g), else the globals are (g2l); a link's
    term is the qab of its query at its label."""
    long_in = long_idx < n_long
    long_doc = tl.load(LONG + long_idx, mask=long_in, other=-1)
    glob_doc = tl.load(GLOB + glob_idx, mask=glob_idx < n_global, other=-2)
    owned = (long_idx < 0) & (glob_idx < 0)  # all False, in the tile's shape
    for level in range(n_levels):
        owner = tl.load(OWN + level * n_long + long_idx, mask=long_in, other=-1)
        owned = owned | (owner == glob_idx)
    allowed = ((long_doc == glob_doc) & (hard == 0)) | owned
    labels = tl.where(owned, 2 * max_distance + 2, 2 * max_distance + 1)  # belongs / does_not_belong
    term = tl.where(owned, belongs_term, other_term)
    first = tl.load(LINK_OFF + long_lo)
    last = tl.load(LINK_OFF + long_hi)
    for e in range(first, last):
        link_long, link_glob, label = tl.load(LINK + e), tl.load(LINK + n_links + e), tl.load(LINK + 2 * n_links + e)
        hit = (long_idx == link_long) & (glob_idx == link_glob)
        if LONG_QUERIES:
            query = link_long
        else:
            query = link_glob
        labels = tl.where(hit, label, labels)
        term = tl.where(hit, tl.load(QAB + query * n_labels + label), term)
        allowed = allowed | hit
    return labels, allowed, term


@triton.jit
def tile_terms(
    REGION: tl.constexpr,
    STRUCTURED: tl.constexpr,
    KEYS_FIRST: tl.constexpr,
    qi,
    kj,
    q_lo,
    q_hi,
    k_lo,
    k_hi,
    n_q,
    n_k,
    radius,
    TABLE,
    row_stride,
    QAB,
    qab,
    n_labels,
    belongs_term,
    other_term,
    right_term,
    left_term,
    structure,
    n_long,
    n_global,
):
    """(label id of each (query qi, key kj) pair, -1 where it may not attend; its label term).

    [q_lo, q_hi) and [k_lo, k_hi) are the tiles' token ranges (they select the links and edges
    to look at); `qab` is the query rows' qab tile, the *_term vectors their qab at belongs,
    does_not_belong, the farthest right and left distance ids (broadcast like qi)."""
    LONG, OWN, GLOB, LINK_OFF, LINK, EDGE_OFF, EDGE, n_levels, n_links, n_edges, max_distance, cross_label = structure
    inside = (qi >= 0) & (qi < n_q) & (kj >= 0) & (kj < n_k)
    if REGION == REGION_L2L:
        column = kj - qi + radius
        inside = inside & (column >= 0) & (column <= 2 * radius)
    if not STRUCTURED:
        if REGION == REGION_L2L:
            offsets = qi * row_stride + column
        else:
            offsets = qi * row_stride + kj
        labels = tl.load(TABLE + offsets, mask=inside, other=-1).to(tl.int32)
        term = _gather_terms(qab, labels, KEYS_FIRST)
    else:
        if REGION == REGION_L2L:
            q_seg = tl.load(LONG + n_long + qi, mask=qi < n_long, other=-1)
            k_seg = tl.load(LONG + n_long + kj, mask=(kj >= 0) & (kj < n_long), other=-2)
            allowed = q_seg == k_seg
            delta = kj - qi
            labels = _distance_id(delta, max_distance)
            if (k_lo - q_hi + 1 <= max_distance) & (k_hi - 1 - q_lo >= -max_distance):  # the tile crosses the stripe
                term = _gather_terms(qab, labels, KEYS_FIRST)
            else:
                term = tl.where(delta > 0, right_term, left_term)
        elif REGION == REGION_G2G:
            q_in, k_in = qi < n_global, kj < n_global
            same_doc = tl.load(GLOB + qi, mask=q_in, other=-1) == tl.load(GLOB + kj, mask=k_in, other=-2)
            cross = tl.load(GLOB + n_global + qi, mask=q_in, other=0) != tl.load(
                GLOB + n_global + kj, mask=k_in, other=0
            )
            both = (tl.load(GLOB + 2 * n_global + qi, mask=q_in, other=0) != 0) & (
                tl.load(GLOB + 2 * n_global + kj, mask=k_in, other=0) != 0
            )
            allowed = same_doc & ~(cross & both)
            labels = _distance_id(kj - qi, max_distance)
            if cross_label >= 0:
                labels = tl.where(cross & same_doc, cross_label, labels)
            first = tl.load(EDGE_OFF + q_lo)
            last = tl.load(EDGE_OFF + q_hi)
            for e in range(first, last):  # g2g edges replace the ids, never the mask
                hit = (qi == tl.load(EDGE + e)) & (kj == tl.load(EDGE + n_edges + e))
                labels = tl.where(hit, tl.load(EDGE + 2 * n_edges + e), labels)
            term = _gather_terms(qab, labels, KEYS_FIRST)
        elif REGION == REGION_L2G:
            hard = tl.load(LONG + 2 * n_long + qi, mask=qi < n_long, other=1)
            labels, allowed, term = _long_global(
                qi,
                kj,
                hard,
                q_lo,
                q_hi,
                QAB,
                n_labels,
                belongs_term,
                other_term,
                LONG,
                OWN,
                GLOB,
                LINK_OFF,
                LINK,
                n_long,
                n_global,
                n_levels,
                n_links,
                max_distance,
                True,
            )
        else:  # REGION_G2L
            hard = tl.load(GLOB + 3 * n_global + qi, mask=qi < n_global, other=1)
            labels, allowed, term = _long_global(
                kj,
                qi,
                hard,
                k_lo,
                k_hi,
                QAB,
                n_labels,
                belongs_term,
                other_term,
                LONG,
                OWN,
                GLOB,
                LINK_OFF,
                LINK,
                n_long,
                n_global,
                n_levels,
                n_links,
                max_distance,
                False,
            )
        labels = tl.where(allowed & inside, labels, -1)
    return labels, term


@triton.jit
def row_terms(QAB, rows, n_rows, n_labels, structure):
    """The query rows' qab at belongs, does_not_belong and the farthest right / left distance ids
    (ids past the vocabulary, which no label of the batch can be, read its last column)."""
    max_distance = structure[10]
    inside = rows < n_rows
    base = QAB + rows * n_labels
    last = n_labels - 1
    belongs = tl.load(base + tl.minimum(2 * max_distance + 2, last), mask=inside, other=0.0)
    other = tl.load(base + tl.minimum(2 * max_distance + 1, last), mask=inside, other=0.0)
    right = tl.load(base + tl.minimum(max_distance, last), mask=inside, other=0.0)
    left = tl.load(base + tl.minimum(2 * max_distance, last), mask=inside, other=0.0)
    return belongs, other, right, left


@triton.jit
def qab_rows(QAB, rows, n_rows, n_labels, V_PAD: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """The query rows' qab tile, [rows, V_PAD] (or [V_PAD, rows] keys first), zeros past V."""
    columns = tl.arange(0, V_PAD)
    if KEYS_FIRST:
        tile = tl.load(
            QAB + rows[None, :] * n_labels + columns[:, None],
            mask=(rows[None, :] < n_rows) & (columns[:, None] < n_labels),
            other=0.0,
        )
    else:
        tile = tl.load(
            QAB + rows[:, None] * n_labels + columns[None, :],
            mask=(rows[:, None] < n_rows) & (columns[None, :] < n_labels),
            other=0.0,
        )
    return tile


@triton.jit
def accumulate_label_grads(acc, ds, labels, V_PAD: tl.constexpr):
    """acc[i, v] += sum of ds[i, j] over the keys j with label v (acc: [rows, V_PAD] fp32 registers).

    Only the label ids present in the tile are visited (its min..max), so a tile of one label
    (most l2g tiles, the band away from the diagonal) costs one masked row sum. Every row belongs
    to this program: nothing is written to memory here, and no atomics are needed."""
    low = tl.min(tl.where(labels >= 0, labels, V_PAD))
    high = tl.max(labels)
    columns = tl.arange(0, V_PAD)
    for v in range(low, high + 1):
        part = tl.sum(tl.where(labels == v, ds, 0.0), 1)
        acc = acc + tl.where(columns[None, :] == v, part[:, None], 0.0)
    return acc
