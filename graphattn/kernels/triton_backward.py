"""Triton backward kernels of global-local attention: one kernel per concern, no atomics.

Flash-style: the forward saved only outputs and each row's softmax statistics (max m and log2 of
the sum l); probabilities are recomputed tile by tile as p = exp2((s - m) * log2(e) - l), and
with delta_i = o_i . do_i (PyTorch), ds = p * (dp - delta).

Every key receives gradient from two query kinds (a long key from its window's long queries and
from the global queries whose g2l row reaches it; a global key from the long queries via l2g and
the global queries via g2g), so the work is split by owner and every output is written once by
the one program that owns it:

- `_dq_kernel` (query owner; walks keys exactly as the forward does) writes dq and the label
  gradient d(qab)[i, v] = sum over keys j with label v of ds_ij, accumulated for its rows in a
  [rows, V] register tile (`accumulate_label_grads`) and stored once at the end.
- `_dkdv_kernel` (key owner) walks the query tiles that reach its key tile, in two phases:
  long keys: global queries (per-key-tile g2l table) then the local band; global keys: long
  queries (per-key-tile l2g table) then all global queries. It writes dk and dv once.

Without atomics the gradients are deterministic: two backward passes are bitwise equal. Each
kernel covers both kinds in one launch, long-running global tiles first; the backward recomputes
q.k twice (once per kernel), as FlashAttention-2 does. d a^K and d b follow from d(qab) through
PyTorch autograd (qab = scale * q a^K^T + b is an einsum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphattn.kernels.triton_forward import (
    WALK_ALL,
    WALK_BAND,
    WALK_LIST,
    _dot,
    _load_rows,
    _program,
    _walk_bounds,
    _walk_start,
    dot_options,
    program_count,
)
from graphattn.kernels.triton_labels import (
    REGION_G2G,
    REGION_G2L,
    REGION_L2G,
    REGION_L2L,
    accumulate_label_grads,
    batch_structure,
    qab_rows,
    row_terms,
    tile_terms,
)


@triton.jit
def _probabilities(s, valid, row_max, row_log2sum):
    """The forward's softmax of a tile from its saved statistics (0 where masked: -inf goes in, so
    that a masked pair's raw score never overflows the exponent)."""
    s = tl.where(valid, s, float("-inf"))
    return tl.exp2((s - row_max) * 1.4426950408889634 - row_log2sum)


@triton.jit
def _dq_phase(
    dq,
    dqab,
    q,
    do,
    qab,
    belongs_term,
    other_term,
    right_term,
    left_term,
    row_max,
    row_log2sum,
    delta,
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
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    EDGE_OFF,
    EDGE,
    n_q,
    n_k,
    n_long,
    n_global,
    n_levels,
    n_links,
    n_edges,
    max_distance,
    cross_label,
    n_labels,
    radius,
    scale,
    REGION: tl.constexpr,
    STRUCTURED: tl.constexpr,
    WALK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    V_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    WRITE_DQ: tl.constexpr,
    WRITE_LABEL_GRADS: tl.constexpr,
):
    """dq (unscaled) and the label gradients of one key phase (either or both)."""
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
            LONG,
            OWN,
            GLOB,
            LINK_OFF,
            LINK,
            EDGE_OFF,
            EDGE,
            n_long,
            n_global,
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
        )
        valid = labels >= 0
        s = _dot(q, tl.trans(k), None, UPCAST, PRECISION) * scale + term
        p = _probabilities(s, valid, row_max[:, None], row_log2sum[:, None])
        dp = _dot(do, tl.trans(v), None, UPCAST, PRECISION)
        ds = p * (dp - delta[:, None])
        if WRITE_DQ:
            dq = _dot(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
        if WRITE_LABEL_GRADS:
            dqab = accumulate_label_grads(dqab, ds, labels, V_PAD)
    return dq, dqab


@triton.jit
def _dq_tile(
    b,
    tile,
    bh,
    Q,
    DO,
    STATS,
    DELTA,
    QAB,
    DQ,
    DQAB,
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
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    EDGE_OFF,
    EDGE,
    n_q,
    n_g,
    n_l,
    n_levels,
    n_links,
    n_edges,
    max_distance,
    cross_label,
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
    WRITE_DQ: tl.constexpr,
    WRITE_LABEL_GRADS: tl.constexpr,
):
    """dq rows and/or d(qab) rows of query tile `tile` of (batch x head) `bh`."""
    row = b * tl.cdiv(n_q, BLOCK_M) + tile
    q_stride = bh * n_q * D
    Q += q_stride
    DO += q_stride
    DQ += q_stride
    STATS += bh * n_q * 2
    DELTA += bh * n_q
    QAB += bh * n_q * n_labels
    DQAB += bh * n_q * n_labels
    KG += bh * n_g * D
    VG += bh * n_g * D
    KL += bh * n_l * D
    VL += bh * n_l * D
    LONG, OWN, GLOB, LINK_OFF, EDGE_OFF = batch_structure(b, LONG, OWN, GLOB, LINK_OFF, EDGE_OFF, n_l, n_g, n_levels)
    if REGION_L == REGION_L2L:
        l_stride = 2 * radius + 1
    else:
        l_stride = n_l
    TABLE_G += b * n_q * n_g
    TABLE_L += b * n_q * l_stride

    q_lo = tile * BLOCK_M
    q_hi = tl.minimum(q_lo + BLOCK_M, n_q)
    qi = q_lo + tl.arange(0, BLOCK_M)
    in_q = qi < n_q
    q = _load_rows(Q, qi, n_q, D)
    do = _load_rows(DO, qi, n_q, D)
    row_max = tl.load(STATS + 2 * qi, mask=in_q, other=0.0)
    row_log2sum = tl.load(STATS + 2 * qi + 1, mask=in_q, other=float("inf"))
    delta = tl.load(DELTA + qi, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    dqab = tl.zeros([BLOCK_M, V_PAD], dtype=tl.float32)
    qab = qab_rows(QAB, qi, n_q, n_labels, V_PAD, False)
    belongs, other, right, left = row_terms(QAB, qi, n_q, n_labels, max_distance)
    belongs, other, right, left = belongs[:, None], other[:, None], right[:, None], left[:, None]
    dq, dqab = _dq_phase(
        dq,
        dqab,
        q,
        do,
        qab,
        belongs,
        other,
        right,
        left,
        row_max,
        row_log2sum,
        delta,
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
        LONG,
        OWN,
        GLOB,
        LINK_OFF,
        LINK,
        EDGE_OFF,
        EDGE,
        n_q,
        n_g,
        n_l,
        n_g,
        n_levels,
        n_links,
        n_edges,
        max_distance,
        cross_label,
        n_labels,
        radius,
        scale,
        REGION_G,
        STRUCTURED,
        WALK_G,
        BLOCK_M,
        BLOCK_GN,
        D,
        V_PAD,
        UPCAST,
        PRECISION,
        WRITE_DQ,
        WRITE_LABEL_GRADS,
    )
    dq, dqab = _dq_phase(
        dq,
        dqab,
        q,
        do,
        qab,
        belongs,
        other,
        right,
        left,
        row_max,
        row_log2sum,
        delta,
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
        LONG,
        OWN,
        GLOB,
        LINK_OFF,
        LINK,
        EDGE_OFF,
        EDGE,
        n_q,
        n_l,
        n_l,
        n_g,
        n_levels,
        n_links,
        n_edges,
        max_distance,
        cross_label,
        n_labels,
        radius,
        scale,
        REGION_L,
        STRUCTURED,
        WALK_L,
        BLOCK_M,
        BLOCK_LN,
        D,
        V_PAD,
        UPCAST,
        PRECISION,
        WRITE_DQ,
        WRITE_LABEL_GRADS,
    )
    if WRITE_DQ:
        tl.store(
            DQ + qi[:, None] * D + tl.arange(0, D)[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=in_q[:, None]
        )
    if WRITE_LABEL_GRADS:
        columns = tl.arange(0, V_PAD)
        tl.store(
            DQAB + qi[:, None] * n_labels + columns[None, :], dqab, mask=in_q[:, None] & (columns[None, :] < n_labels)
        )


@triton.jit
def _dq_kernel(
    QG,
    DOG,
    STATSG,
    DELTAG,
    QABG,
    DQG,
    DQABG,
    QL,
    DOL,
    STATSL,
    DELTAL,
    QABL,
    DQL,
    DQABL,
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
    WRITE_DQ: tl.constexpr,
    WRITE_LABEL_GRADS: tl.constexpr,
):
    """Both query kinds in one launch, the long-running global tiles first (as the forward).
    WRITE_DQ / WRITE_LABEL_GRADS: what this launch writes; where registers allow, one launch
    writes both, else one launch each (`KernelTiles.split_label_grads`)."""
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_gq, BLOCK_GM)
    if pid < global_tiles * n_batch * n_heads:
        b, tile, bh = _program(pid, global_tiles, n_heads)
        _dq_tile(
            b,
            tile,
            bh,
            QG,
            DOG,
            STATSG,
            DELTAG,
            QABG,
            DQG,
            DQABG,
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
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
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
            WRITE_DQ,
            WRITE_LABEL_GRADS,
        )
    else:
        b, tile, bh = _program(pid - global_tiles * n_batch * n_heads, tl.cdiv(n_l, BLOCK_LM), n_heads)
        _dq_tile(
            b,
            tile,
            bh,
            QL,
            DOL,
            STATSL,
            DELTAL,
            QABL,
            DQL,
            DQABL,
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
            LONG,
            OWN,
            GLOB,
            LINK_OFF,
            LINK,
            EDGE_OFF,
            EDGE,
            n_l,
            n_g,
            n_l,
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
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
            WRITE_DQ,
            WRITE_LABEL_GRADS,
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
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    EDGE_OFF,
    EDGE,
    n_q,
    n_k,
    n_long,
    n_global,
    n_levels,
    n_links,
    n_edges,
    max_distance,
    cross_label,
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
        belongs, other, right, left = row_terms(QAB, qi, n_q, n_labels, max_distance)
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
            LONG,
            OWN,
            GLOB,
            LINK_OFF,
            LINK,
            EDGE_OFF,
            EDGE,
            n_long,
            n_global,
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
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
    LONG,
    OWN,
    GLOB,
    LINK_OFF,
    LINK,
    EDGE_OFF,
    EDGE,
    n_k,
    n_qa,
    n_qb,
    n_g,
    n_l,
    n_levels,
    n_links,
    n_edges,
    max_distance,
    cross_label,
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
    LONG, OWN, GLOB, LINK_OFF, EDGE_OFF = batch_structure(b, LONG, OWN, GLOB, LINK_OFF, EDGE_OFF, n_l, n_g, n_levels)
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
        LONG,
        OWN,
        GLOB,
        LINK_OFF,
        LINK,
        EDGE_OFF,
        EDGE,
        n_qa,
        n_k,
        n_l,
        n_g,
        n_levels,
        n_links,
        n_edges,
        max_distance,
        cross_label,
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
        LONG,
        OWN,
        GLOB,
        LINK_OFF,
        LINK,
        EDGE_OFF,
        EDGE,
        n_qb,
        n_k,
        n_l,
        n_g,
        n_levels,
        n_links,
        n_edges,
        max_distance,
        cross_label,
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
            LONG,
            OWN,
            GLOB,
            LINK_OFF,
            LINK,
            EDGE_OFF,
            EDGE,
            n_g,
            n_l,
            n_gq,
            n_g,
            n_l,
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
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
            LONG,
            OWN,
            GLOB,
            LINK_OFF,
            LINK,
            EDGE_OFF,
            EDGE,
            n_l,
            n_gq,
            n_l,
            n_g,
            n_l,
            n_levels,
            n_links,
            n_edges,
            max_distance,
            cross_label,
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


def _delta(out: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    """delta_i = o_i . do_i in fp32, the softmax-backward correction of each query row."""
    return (out.float() * d_out.float()).sum(-1).contiguous()


def _queries(t: dict, kind: str) -> list:
    return [t[f"{name}_{kind}"] for name in ("q", "do", "stats", "delta", "qab")]


def _sizes(plan, batch: int, heads: int, scale: float) -> tuple:
    return (
        plan.n_global,
        plan.n_global_keys,
        plan.n_long,
        batch,
        heads,
        *plan.structure_sizes,
        plan.n_labels,
        plan.radius,
        scale,
    )


def dq_launch(
    t: dict,
    plan,
    scale: float,
    batch: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    write: tuple[bool, bool] = (True, True),
):
    """(kernel, grid, args, constants) of a dq launch writing (dq, label gradients) as `write`
    says; `t` as in `forward_launch`, plus do_*, delta_*, dq_* and dqab_*."""
    tiles = plan.tiles.dq
    grid = (
        program_count(
            triton.cdiv(plan.n_global, tiles.global_rows), triton.cdiv(plan.n_long, tiles.long_rows), batch * heads
        ),
    )
    lists = plan.dq_lists
    args = (
        *_queries(t, "g"),
        t["dq_g"],
        t["dqab_g"],
        *_queries(t, "l"),
        t["dq_l"],
        t["dqab_l"],
        t["k_g"],
        t["v_g"],
        t["k_l"],
        t["v_l"],
        *plan.tables,
        lists["g2l"].counts,
        lists["g2l"].indices,
        lists["l2g"].counts,
        lists["l2g"].indices,
        *plan.structure_tensors,
        *_sizes(plan, batch, heads, scale),
    )
    constants = {
        **plan.kernel_constants("dq", head_dim, dtype),
        **dot_options(dtype),
        "WRITE_DQ": write[0],
        "WRITE_LABEL_GRADS": write[1],
    }
    return _dq_kernel, grid, args, constants


def dq_launches(t: dict, plan, scale: float, batch: int, heads: int, head_dim: int, dtype: torch.dtype) -> list:
    """The dq launches of a plan: one writing both, or (dq, label gradients) apart."""
    if plan.tiles.dq.split_label_grads:
        return [
            dq_launch(t, plan, scale, batch, heads, head_dim, dtype, (True, False)),
            dq_launch(t, plan, scale, batch, heads, head_dim, dtype, (False, True)),
        ]
    return [dq_launch(t, plan, scale, batch, heads, head_dim, dtype)]


def dkdv_launch(t: dict, plan, scale: float, batch: int, heads: int, head_dim: int, dtype: torch.dtype):
    """(kernel, grid, args, constants) of the dk/dv launch; `t` as in `dq_launch`, plus dk_*, dv_*."""
    tiles = plan.tiles.dkdv
    grid = (
        program_count(
            triton.cdiv(plan.n_global_keys, tiles.global_rows), triton.cdiv(plan.n_long, tiles.long_rows), batch * heads
        ),
    )
    lists = plan.dkdv_lists
    args = (
        t["k_g"],
        t["v_g"],
        t["dk_g"],
        t["dv_g"],
        t["k_l"],
        t["v_l"],
        t["dk_l"],
        t["dv_l"],
        *_queries(t, "g"),
        *_queries(t, "l"),
        *plan.tables,
        lists["l2g"].counts,
        lists["l2g"].indices,
        lists["g2l"].counts,
        lists["g2l"].indices,
        *plan.structure_tensors,
        *_sizes(plan, batch, heads, scale),
    )
    return _dkdv_kernel, grid, args, {**plan.kernel_constants("dkdv", head_dim, dtype), **dot_options(dtype)}


def backward(saved: dict[str, torch.Tensor], plan, scale: float) -> dict[str, torch.Tensor]:
    """Gradients dq/dk/dv_{g,l} ([B, H, n, d]) and dqab_{g,l} ([B, H, n, V] fp32).

    `saved` holds q, k, v, qab, o, stats and the incoming do for both kinds (suffix _g / _l).
    """
    from graphattn.kernels.triton_config import launch

    batch, heads, _, head_dim = saved["q_l"].shape
    dtype = saved["q_l"].dtype
    grads = {f"d{name}_{kind}": torch.empty_like(saved[f"{name}_{kind}"]) for name in "qkv" for kind in "gl"}
    for kind in "gl":
        grads[f"dqab_{kind}"] = torch.empty_like(saved[f"qab_{kind}"])
        saved[f"delta_{kind}"] = _delta(saved[f"o_{kind}"], saved[f"do_{kind}"])
    tensors = {**saved, **grads}
    for dq in dq_launches(tensors, plan, scale, batch, heads, head_dim, dtype):
        launch(*dq)
    launch(*dkdv_launch(tensors, plan, scale, batch, heads, head_dim, dtype))
    return grads
