"""Triton dq kernel of global-local attention (the query owner's half of the backward, see
`launches.py` for how the backward is split): it walks keys exactly as the forward does and
writes dq and the label gradient d(qab)[i, v] = sum over keys j with label v of ds_ij,
accumulated for its rows in a [rows, V] register tile (`accumulate_label_grads`) and stored once
at the end, or one of the two when a launch writes them apart (`WRITE_DQ`, `WRITE_LABEL_GRADS`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphattn.kernels.triton.labels import (
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
            structure,
            n_long,
            n_global,
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
    structure = batch_structure(b, structure, n_l, n_g)
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
    belongs, other, right, left = row_terms(QAB, qi, n_q, n_labels, structure)
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
    structure = (LONG, OWN, GLOB, LINK_OFF, LINK, EDGE_OFF, EDGE, n_levels, n_links, n_edges, max_distance, cross_label)
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
            WRITE_DQ,
            WRITE_LABEL_GRADS,
        )
