"""Triton dk/dv kernel of global-local attention (the key owner's half of the backward, see
`launches.py`): it walks the query tiles that reach its key tile, in two phases: long keys:
global queries (per-key-tile g2l table) then the local band; global keys: long queries
(per-key-tile l2g table) then all global queries. It writes dk and dv once.
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
    _probabilities,
    _program,
    _walk_bounds,
    _walk_start,
)


@triton.jit
def _dkdv_phase(
    dk,
    dv,
    k,
    v,
    kj,
    k_lo,
    k_hi,
    Q,
    DO,
    STATS,
    DELTA,
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
    BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    D: tl.constexpr,
    V_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dk (unscaled) and dv of a key tile from one kind of queries, tiles laid out [keys, queries]."""
    first, count = _walk_bounds(WALK, k_lo, n_q, radius, COUNT, BLOCK_N, BLOCK_Q)
    for step in range(count):
        q_lo = _walk_start(WALK, step, first, INDEX, BLOCK_Q)
        qi = q_lo + tl.arange(0, BLOCK_Q)
        in_q = qi < n_q
        q = _load_rows(Q, qi, n_q, D)
        do = _load_rows(DO, qi, n_q, D)
        row_max = tl.load(STATS + 2 * qi, mask=in_q, other=0.0)
        row_log2sum = tl.load(STATS + 2 * qi + 1, mask=in_q, other=float("inf"))
        delta = tl.load(DELTA + qi, mask=in_q, other=0.0)
        qab = qab_rows(QAB, qi, n_q, n_labels, V_PAD, True)
        belongs, other, right, left = row_terms(QAB, qi, n_q, n_labels, structure)
        labels, term = tile_terms(
            REGION,
            STRUCTURED,
            True,
            qi[None, :],
            kj[:, None],
            q_lo,
            tl.minimum(q_lo + BLOCK_Q, n_q),
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
            belongs[None, :],
            other[None, :],
            right[None, :],
            left[None, :],
            structure,
            n_long,
            n_global,
        )
        valid = labels >= 0
        s_t = _dot(k, tl.trans(q), None, UPCAST, PRECISION) * scale + term
        p_t = _probabilities(s_t, valid, row_max[None, :], row_log2sum[None, :])
        dv = _dot(p_t.to(do.dtype), do, dv, UPCAST, PRECISION)
        dp_t = _dot(v, tl.trans(do), None, UPCAST, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot(ds_t.to(q.dtype), q, dk, UPCAST, PRECISION)
    return dk, dv


@triton.jit
def _dkdv_tile(
    b,
    tile,
    bh,
    K,
    V,
    DK,
    DV,
    QA,
    DOA,
    STATSA,
    DELTAA,
    QABA,
    TABLE_A,
    COUNT_A,
    INDEX_A,
    QB,
    DOB,
    STATSB,
    DELTAB,
    QABB,
    TABLE_B,
    COUNT_B,
    INDEX_B,
    structure,
    n_k,
    n_qa,
    n_qb,
    n_g,
    n_l,
    n_labels,
    radius,
    scale,
    REGION_A: tl.constexpr,
    REGION_B: tl.constexpr,
    WALK_A: tl.constexpr,
    WALK_B: tl.constexpr,
    STRUCTURED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_QA: tl.constexpr,
    BLOCK_QB: tl.constexpr,
    D: tl.constexpr,
    V_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dk and dv rows of key tile `tile` of `bh`, from query kinds A then B."""
    row = b * tl.cdiv(n_k, BLOCK_N) + tile
    k_stride = bh * n_k * D
    K += k_stride
    V += k_stride
    DK += k_stride
    DV += k_stride
    QA += bh * n_qa * D
    DOA += bh * n_qa * D
    STATSA += bh * n_qa * 2
    DELTAA += bh * n_qa
    QABA += bh * n_qa * n_labels
    QB += bh * n_qb * D
    DOB += bh * n_qb * D
    STATSB += bh * n_qb * 2
    DELTAB += bh * n_qb
    QABB += bh * n_qb * n_labels
    structure = batch_structure(b, structure, n_l, n_g)
    if REGION_B == REGION_L2L:  # long keys: A = global queries (g2l [Gq, L]), B = the band [L, 2r+1]
        a_stride = n_l
        b_stride = 2 * radius + 1
    else:  # global keys: A = long queries (l2g [L, Gk]), B = global queries (g2g [Gq, Gk])
        a_stride = n_g
        b_stride = n_g
    TABLE_A += b * n_qa * a_stride
    TABLE_B += b * n_qb * b_stride

    k_lo = tile * BLOCK_N
    k_hi = tl.minimum(k_lo + BLOCK_N, n_k)
    kj = k_lo + tl.arange(0, BLOCK_N)
    k = _load_rows(K, kj, n_k, D)
    v = _load_rows(V, kj, n_k, D)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dk, dv = _dkdv_phase(
        dk,
        dv,
        k,
        v,
        kj,
        k_lo,
        k_hi,
        QA,
        DOA,
        STATSA,
        DELTAA,
        QABA,
        COUNT_A + row,
        INDEX_A + row * tl.cdiv(n_qa, BLOCK_QA),
        TABLE_A,
        a_stride,
        structure,
        n_qa,
        n_k,
        n_l,
        n_g,
        n_labels,
        radius,
        scale,
        REGION_A,
        STRUCTURED,
        WALK_A,
        BLOCK_N,
        BLOCK_QA,
        D,
        V_PAD,
        UPCAST,
        PRECISION,
    )
    dk, dv = _dkdv_phase(
        dk,
        dv,
        k,
        v,
        kj,
        k_lo,
        k_hi,
        QB,
        DOB,
        STATSB,
        DELTAB,
        QABB,
        COUNT_B + row,
        INDEX_B + row * tl.cdiv(n_qb, BLOCK_QB),
        TABLE_B,
        b_stride,
        structure,
        n_qb,
        n_k,
        n_l,
        n_g,
        n_labels,
        radius,
        scale,
        REGION_B,
        STRUCTURED,
        WALK_B,
        BLOCK_N,
        BLOCK_QB,
        D,
        V_PAD,
        UPCAST,
        PRECISION,
    )
    out = kj[:, None] * D + tl.arange(0, D)[None, :]
    in_k = (kj < n_k)[:, None]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=in_k)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=in_k)


@triton.jit
def _dkdv_kernel(
    KG,
    VG,
    DKG,
    DVG,
    KL,
    VL,
    DKL,
    DVL,
    QG,
    DOG,
    STATSG,
    DELTAG,
    QABG,
    QL,
    DOL,
    STATSL,
    DELTAL,
    QABL,
    TABLE_GG,
    TABLE_GL,
    TABLE_LG,
    TABLE_LL,
    COUNT_LG_BY_KEY,
    INDEX_LG_BY_KEY,
    COUNT_GL_BY_KEY,
    INDEX_GL_BY_KEY,
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
    """Both key kinds in one launch (key tiles BLOCK_LM / BLOCK_GM rows, walked query tiles
    BLOCK_LN / BLOCK_GN). Global key tiles go first: each hears from every long query tile its
    l2g column reaches (all of them under soft l2g), a long key tile from a few."""
    structure = (LONG, OWN, GLOB, LINK_OFF, LINK, EDGE_OFF, EDGE, n_levels, n_links, n_edges, max_distance, cross_label)
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_g, BLOCK_GM)
    if pid < global_tiles * n_batch * n_heads:  # A: long queries through l2g; B: global queries through g2g
        b, tile, bh = _program(pid, global_tiles, n_heads)
        _dkdv_tile(
            b,
            tile,
            bh,
            KG,
            VG,
            DKG,
            DVG,
            QL,
            DOL,
            STATSL,
            DELTAL,
            QABL,
            TABLE_LG,
            COUNT_LG_BY_KEY,
            INDEX_LG_BY_KEY,
            QG,
            DOG,
            STATSG,
            DELTAG,
            QABG,
            TABLE_GG,
            COUNT_LG_BY_KEY,
            INDEX_LG_BY_KEY,
            structure,
            n_g,
            n_l,
            n_gq,
            n_g,
            n_l,
            n_labels,
            radius,
            scale,
            REGION_L2G,
            REGION_G2G,
            WALK_LIST,
            WALK_ALL,
            STRUCTURED,
            BLOCK_GM,
            BLOCK_LN,
            BLOCK_GN,
            D,
            V_PAD,
            UPCAST,
            PRECISION,
        )
    else:  # A: global queries through g2l; B: long queries through the l2l band
        b, tile, bh = _program(pid - global_tiles * n_batch * n_heads, tl.cdiv(n_l, BLOCK_LM), n_heads)
        _dkdv_tile(
            b,
            tile,
            bh,
            KL,
            VL,
            DKL,
            DVL,
            QG,
            DOG,
            STATSG,
            DELTAG,
            QABG,
            TABLE_GL,
            COUNT_GL_BY_KEY,
            INDEX_GL_BY_KEY,
            QL,
            DOL,
            STATSL,
            DELTAL,
            QABL,
            TABLE_LL,
            COUNT_GL_BY_KEY,
            INDEX_GL_BY_KEY,
            structure,
            n_l,
            n_gq,
            n_l,
            n_g,
            n_l,
            n_labels,
            radius,
            scale,
            REGION_G2L,
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
