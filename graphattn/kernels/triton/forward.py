"""Triton forward kernel of global-local attention, and the tile helpers the backward shares.

One program owns a tile of queries of one kind (long or global) for one (batch, head) and
streams two key phases through ONE online softmax (fp32 max, sum and accumulator, base-2
exponentials as in Triton's fused-attention tutorial, of (score - max) * log2(e): scores stay in
natural units, so a score near finfo.min, e.g. from a bias of finfo.min, never overflows):

    long queries:   global keys (l2g, the key tiles listed for this query tile) then the local
                    window (the l2l band: only the key tiles that overlap i-r..i+r)
    global queries: global keys (g2g, every tile) then long keys (g2l, the listed tiles: hard
                    g2l and packed documents leave most of them out)

One launch covers both kinds, global tiles first; the heads of one tile are neighbouring
programs, so they share the structure and label reads in L2. How a phase walks its key tiles is
a compile-time switch (`WALK_ALL`, `WALK_LIST`, `WALK_BAND`), where labels come from is another
(`STRUCTURED`: derived in registers from the compact structure, or read from dense tables, see
labels.py). The label term is gathered from a per-query table `qab[i, v] = scale *
q_i . a^K_v + b_v` (computed once per label in PyTorch), never built per pair. Query tiles
(BLOCK_LM long, BLOCK_GM global rows) and key tiles (BLOCK_LN, BLOCK_GN) are sized apart.
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphattn.kernels.triton.labels import (
    REGION_G2G,
    REGION_G2L,
    REGION_L2G,
    REGION_L2L,
    batch_structure,
    qab_rows,
    row_terms,
    tile_terms,
)
from graphattn.kernels.triton.tiles import (
    WALK_ALL,
    WALK_BAND,
    WALK_LIST,
    _dot,
    _load_rows,
    _program,
    _walk_bounds,
    _walk_start,
)


@triton.jit
def _attend(
    acc,
    m_i,
    l_i,
    q,
    qab,
    belongs_term,
    other_term,
    right_term,
    left_term,
    qi,
    q_lo,
    q_hi,
    K,
    Vals,
    QAB,
    COUNT,
    INDEX,
    TABLE,
    row_stride,
    structure,
    n_q,
    n_k,
    n_long,
    n_global,
    n_labels,
    radius,
    scale,
    REGION: tl.constexpr,
    STRUCTURED: tl.constexpr,
    WALK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold one key phase into the running softmax (m_i, l_i) and accumulator of a query tile.

    Fully masked tiles keep m_i = -inf; exponentials are taken against 0 then, so no NaN.
    """
    first, count = _walk_bounds(WALK, q_lo, n_k, radius, COUNT, BLOCK_M, BLOCK_N)
    for step in range(count):
        k_lo = _walk_start(WALK, step, first, INDEX, BLOCK_N)
        kj = k_lo + tl.arange(0, BLOCK_N)
        k = _load_rows(K, kj, n_k, D)
        v = _load_rows(Vals, kj, n_k, D)
        labels, term = tile_terms(
            REGION,
            STRUCTURED,
            False,
            qi[:, None],
            kj[None, :],
            q_lo,
            q_hi,
            k_lo,
            tl.minimum(k_lo + BLOCK_N, n_k),
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
        )
        valid = labels >= 0
        s = tl.where(valid, _dot(q, tl.trans(k), None, UPCAST, PRECISION) * scale + term, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2((s - m_ref[:, None]) * 1.4426950408889634)
        alpha = tl.exp2((m_i - m_ref) * 1.4426950408889634)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _forward_tile(
    b,
    tile,
    bh,
    Q,
    O,
    STATS,
    QAB,
    KG,
    VG,
    KL,
    VL,
    TABLE_G,
    TABLE_L,
    COUNT_G,
    INDEX_G,
    COUNT_L,
    INDEX_L,
    structure,
    n_q,
    n_g,
    n_l,
    n_labels,
    radius,
    scale,
    REGION_G: tl.constexpr,
    REGION_L: tl.constexpr,
    WALK_G: tl.constexpr,
    WALK_L: tl.constexpr,
    STRUCTURED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_GN: tl.constexpr,
    BLOCK_LN: tl.constexpr,
    D: tl.constexpr,
    V_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Output rows and softmax statistics of query tile `tile` of (batch x head) `bh`: phase G
    over the global keys, phase L over the long keys."""
    row = b * tl.cdiv(n_q, BLOCK_M) + tile  # this tile's row of the key-block tables
    q_stride = bh * n_q * D
    Q += q_stride
    O += q_stride
    STATS += bh * n_q * 2
    QAB += bh * n_q * n_labels
    KG += bh * n_g * D
    VG += bh * n_g * D
    KL += bh * n_l * D
    VL += bh * n_l * D
    structure = batch_structure(b, structure, n_l, n_g)
    if REGION_L == REGION_L2L:
        l_stride = 2 * radius + 1  # the band [L, 2r+1]
    else:
        l_stride = n_l
    TABLE_G += b * n_q * n_g
    TABLE_L += b * n_q * l_stride

    q_lo = tile * BLOCK_M
    q_hi = tl.minimum(q_lo + BLOCK_M, n_q)
    qi = q_lo + tl.arange(0, BLOCK_M)
    q = _load_rows(Q, qi, n_q, D)
    qab = qab_rows(QAB, qi, n_q, n_labels, V_PAD, False)
    belongs, other, right, left = row_terms(QAB, qi, n_q, n_labels, structure)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    acc, m_i, l_i = _attend(
        acc,
        m_i,
        l_i,
        q,
        qab,
        belongs[:, None],
        other[:, None],
        right[:, None],
        left[:, None],
        qi,
        q_lo,
        q_hi,
        KG,
        VG,
        QAB,
        COUNT_G + row,
        INDEX_G + row * tl.cdiv(n_g, BLOCK_GN),
        TABLE_G,
        n_g,
        structure,
        n_q,
        n_g,
        n_l,
        n_g,
        n_labels,
        radius,
        scale,
        REGION_G,
        STRUCTURED,
        WALK_G,
        BLOCK_M,
        BLOCK_GN,
        D,
        UPCAST,
        PRECISION,
    )
    acc, m_i, l_i = _attend(
        acc,
        m_i,
        l_i,
        q,
        qab,
        belongs[:, None],
        other[:, None],
        right[:, None],
        left[:, None],
        qi,
        q_lo,
        q_hi,
        KL,
        VL,
        QAB,
        COUNT_L + row,
        INDEX_L + row * tl.cdiv(n_l, BLOCK_LN),
        TABLE_L,
        l_stride,
        structure,
        n_q,
        n_l,
        n_l,
        n_g,
        n_labels,
        radius,
        scale,
        REGION_L,
        STRUCTURED,
        WALK_L,
        BLOCK_M,
        BLOCK_LN,
        D,
        UPCAST,
        PRECISION,
    )

    alive = l_i > 0.0
    l_safe = tl.where(alive, l_i, 1.0)
    in_q = qi < n_q
    tl.store(
        O + qi[:, None] * D + tl.arange(0, D)[None, :],
        (acc / l_safe[:, None]).to(O.dtype.element_ty),
        mask=in_q[:, None],
    )
    # (max, log2 sum), not their sum: next to a max near finfo.min the log-sum-exp drops log(sum)
    tl.store(STATS + 2 * qi, tl.where(alive, m_i, 0.0), mask=in_q)
    tl.store(STATS + 2 * qi + 1, tl.where(alive, tl.log2(l_safe), float("inf")), mask=in_q)


@triton.jit
def _forward_kernel(
    QG,
    OG,
    STATSG,
    QABG,
    QL,
    OL,
    STATSL,
    QABL,
    KG,
    VG,
    KL,
    VL,
    TABLE_GG,
    TABLE_GL,
    TABLE_LG,
    TABLE_LL,
    COUNT_GL,
    INDEX_GL,
    COUNT_LG,
    INDEX_LG,
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    EDGE_OFF,
    EDGE,
    n_gq,
    n_g,
    n_l,
    n_batch,
    n_heads,
    n_levels,
    n_links,
    n_edges,
    max_distance,
    cross_label,
    n_labels,
    radius,
    scale,
    STRUCTURED: tl.constexpr,
    BLOCK_LM: tl.constexpr,
    BLOCK_GM: tl.constexpr,
    BLOCK_LN: tl.constexpr,
    BLOCK_GN: tl.constexpr,
    D: tl.constexpr,
    V_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One launch for both query kinds, global tiles first (n_gq global queries, n_g global keys:
    the slots past n_gq are keys only).

    A global tile streams far more keys (its whole g2l row) than a long tile (a few global
    tiles and its window), and there are few of them: started first, they overlap with the
    many short long-query programs instead of trailing a second launch on an idle GPU.
    """
    structure = (LONG, OWN, GLOB, LINK_OFF, LINK, EDGE_OFF, EDGE, n_levels, n_links, n_edges, max_distance, cross_label)
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_gq, BLOCK_GM)
    if pid < global_tiles * n_batch * n_heads:
        b, tile, bh = _program(pid, global_tiles, n_heads)
        _forward_tile(
            b,
            tile,
            bh,
            QG,
            OG,
            STATSG,
            QABG,
            KG,
            VG,
            KL,
            VL,
            TABLE_GG,
            TABLE_GL,
            COUNT_GL,
            INDEX_GL,
            COUNT_GL,
            INDEX_GL,
            structure,
            n_gq,
            n_g,
            n_l,
            n_labels,
            radius,
            scale,
            REGION_G2G,
            REGION_G2L,
            WALK_ALL,
            WALK_LIST,
            STRUCTURED,
            BLOCK_GM,
            BLOCK_GN,
            BLOCK_LN,
            D,
            V_PAD,
            UPCAST,
            PRECISION,
        )
    else:
        b, tile, bh = _program(pid - global_tiles * n_batch * n_heads, tl.cdiv(n_l, BLOCK_LM), n_heads)
        _forward_tile(
            b,
            tile,
            bh,
            QL,
            OL,
            STATSL,
            QABL,
            KG,
            VG,
            KL,
            VL,
            TABLE_LG,
            TABLE_LL,
            COUNT_LG,
            INDEX_LG,
            COUNT_LG,
            INDEX_LG,
            structure,
            n_l,
            n_g,
            n_l,
            n_labels,
            radius,
            scale,
            REGION_L2G,
            REGION_L2L,
            WALK_LIST,
            WALK_BAND,
            STRUCTURED,
            BLOCK_LM,
            BLOCK_GN,
            BLOCK_LN,
            D,
            V_PAD,
            UPCAST,
            PRECISION,
        )
