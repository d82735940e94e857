"""Triton backward kernels of global-local attention: one kernel per concern.

Flash-style: the forward saved only outputs and each row's softmax statistics (max m and log2 of
the sum l); probabilities are recomputed tile by tile as p = exp2((s - m) * log2(e) - l), and
with delta_i = o_i . do_i (PyTorch), ds = p * (dp - delta).

Why a query-owner and a key-owner kernel, and no atomics for dk/dv: every key receives gradient
from two query kinds (a long key from its window's long queries and from the global queries
whose g2l row reaches it; a global key from the long queries via l2g and the global queries via
g2g). Atomically adding [tile, d] partial dk/dv from every query program would serialize the
many long-query programs on the few global keys. Instead:

- `_dq_kernel` (query owner; walks keys exactly as the forward does) writes dq and the label
  gradient d(qab)[i, v] = sum over keys j with label v of ds_ij. Many keys of one query share a
  label inside a tile, so that scatter is a `tl.atomic_add`; the rows belong to this program
  alone, so programs never contend for them. (Float atomics make d a^K and d b bitwise
  non-deterministic from run to run; the values agree to rounding.)
- `_dkdv_kernel` (key owner) walks the query tiles that reach its key tile, in two phases:
  long keys: global queries (per-key-tile g2l table) then the local band; global keys: long
  queries (per-key-tile l2g table) then all global queries. It writes dk and dv once.

Each kernel covers both kinds in one launch, long-running global tiles first. The backward
recomputes q.k twice (once per kernel), as FlashAttention-2 does. d a^K and d b follow from
d(qab) through PyTorch autograd (qab = scale * q a^K^T + b is an einsum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphattn.kernels.triton_blocks import AttentionPlan
from graphattn.kernels.triton_forward import (
    WALK_ALL,
    WALK_BAND,
    WALK_LIST,
    _dot,
    _load_rows,
    _tile_labels,
    _tile_scores,
    _walk_bounds,
    _walk_start,
    dot_options,
    launch_options,
    program_count,
)


@triton.jit
def _dq_phase(dq, q, do, row_max, row_log2sum, delta, qi, q_start, K, Vals, LAB, QAB, DQAB, COUNT, INDEX,
              n_q, n_k, n_labels, label_row_stride, radius, qk_scale,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WALK: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """dq (unscaled) of one key phase; scatters this phase's d(qab) by label id."""
    first, count = _walk_bounds(WALK, q_start, n_k, radius, COUNT, BLOCK_M, BLOCK_N)
    for step in range(count):
        kj = _walk_start(WALK, step, first, INDEX, BLOCK_N) + tl.arange(0, BLOCK_N)
        k = _load_rows(K, kj, n_k, D)
        v = _load_rows(Vals, kj, n_k, D)
        labels = _tile_labels(LAB, qi[:, None], kj[None, :], n_q, n_k, label_row_stride, radius, WALK == WALK_BAND)
        s, valid = _tile_scores(_dot(q, tl.trans(k), None, UPCAST, PRECISION), labels, QAB, qi[:, None], n_labels, qk_scale)
        p = tl.where(valid, tl.exp2((s - row_max[:, None]) * 1.4426950408889634 - row_log2sum[:, None]), 0.0)
        dp = _dot(do, tl.trans(v), None, UPCAST, PRECISION)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
        tl.atomic_add(DQAB + qi[:, None] * n_labels + labels, ds, mask=valid, sem="relaxed")
    return dq


@triton.jit
def _dq_tile(tile, bh, Q, DO, LSE, DELTA, QAB, DQ, DQAB, KG, VG, KL, VL,
             LAB_G, LAB_L, COUNT_G, INDEX_G, COUNT_L, INDEX_L,
             n_q, n_g, n_l, n_heads, n_labels, radius, scale, qk_scale, label_l_row_stride,
             BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, D: tl.constexpr,
             WALK_G: tl.constexpr, WALK_L: tl.constexpr,
             UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """dq rows and d(qab) rows of query tile `tile` of (batch x head) `bh`."""
    b = bh // n_heads
    row = b * tl.cdiv(n_q, BLOCK_M) + tile
    Q += bh * n_q * D
    DO += bh * n_q * D
    DQ += bh * n_q * D
    LSE += bh * n_q * 2
    DELTA += bh * n_q
    QAB += bh * n_q * n_labels
    DQAB += bh * n_q * n_labels
    KG += bh * n_g * D
    VG += bh * n_g * D
    KL += bh * n_l * D
    VL += bh * n_l * D
    LAB_G += b * n_q * n_g
    LAB_L += b * n_q * label_l_row_stride

    q_start = tile * BLOCK_M
    qi = q_start + tl.arange(0, BLOCK_M)
    in_q = qi < n_q
    q = _load_rows(Q, qi, n_q, D)
    do = _load_rows(DO, qi, n_q, D)
    row_max = tl.load(LSE + 2 * qi, mask=in_q, other=0.0)
    row_log2sum = tl.load(LSE + 2 * qi + 1, mask=in_q, other=float("inf"))
    delta = tl.load(DELTA + qi, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    dq = _dq_phase(dq, q, do, row_max, row_log2sum, delta, qi, q_start, KG, VG, LAB_G, QAB, DQAB,
                   COUNT_G + row, INDEX_G + row * tl.cdiv(n_g, BLOCK_G),
                   n_q, n_g, n_labels, n_g, radius, qk_scale,
                   BLOCK_M, BLOCK_G, D, WALK_G, UPCAST, PRECISION)
    dq = _dq_phase(dq, q, do, row_max, row_log2sum, delta, qi, q_start, KL, VL, LAB_L, QAB, DQAB,
                   COUNT_L + row, INDEX_L + row * tl.cdiv(n_l, BLOCK_L),
                   n_q, n_l, n_labels, label_l_row_stride, radius, qk_scale,
                   BLOCK_M, BLOCK_L, D, WALK_L, UPCAST, PRECISION)
    tl.store(DQ + qi[:, None] * D + tl.arange(0, D)[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=in_q[:, None])


@triton.jit
def _dq_kernel(QG, DOG, LSEG, DELTAG, QABG, DQG, DQABG, QL, DOL, LSEL, DELTAL, QABL, DQL, DQABL,
               KG, VG, KL, VL, LAB_GG, LAB_GL, LAB_LG, LAB_LL, COUNT_GL, INDEX_GL, COUNT_LG, INDEX_LG,
               n_gq, n_g, n_l, n_batch_heads, n_heads, n_labels, radius, scale, qk_scale,
               BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, D: tl.constexpr,
               UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Both query kinds in one launch, the long-running global tiles first (as the forward)."""
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_gq, BLOCK_G)
    if pid < global_tiles * n_batch_heads:
        bh = (pid // global_tiles).to(tl.int64)
        _dq_tile(pid % global_tiles, bh, QG, DOG, LSEG, DELTAG, QABG, DQG, DQABG, KG, VG, KL, VL,
                 LAB_GG, LAB_GL, COUNT_GL, INDEX_GL, COUNT_GL, INDEX_GL,
                 n_gq, n_g, n_l, n_heads, n_labels, radius, scale, qk_scale, n_l,
                 BLOCK_G, BLOCK_G, BLOCK_L, D, WALK_ALL, WALK_LIST, UPCAST, PRECISION)
    else:
        pid -= global_tiles * n_batch_heads
        long_tiles = tl.cdiv(n_l, BLOCK_L)
        bh = (pid // long_tiles).to(tl.int64)
        _dq_tile(pid % long_tiles, bh, QL, DOL, LSEL, DELTAL, QABL, DQL, DQABL, KG, VG, KL, VL,
                 LAB_LG, LAB_LL, COUNT_LG, INDEX_LG, COUNT_LG, INDEX_LG,
                 n_l, n_g, n_l, n_heads, n_labels, radius, scale, qk_scale, 2 * radius + 1,
                 BLOCK_L, BLOCK_G, BLOCK_L, D, WALK_LIST, WALK_BAND, UPCAST, PRECISION)


@triton.jit
def _dkdv_phase(dk, dv, k, v, kj, k_start, Q, DO, LSE, DELTA, QAB, LAB, COUNT, INDEX,
                n_q, n_k, n_labels, label_row_stride, radius, qk_scale,
                BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr, D: tl.constexpr, WALK: tl.constexpr,
                UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """dk (unscaled) and dv of a key tile from one kind of queries, tiles laid out [keys, queries]."""
    first, count = _walk_bounds(WALK, k_start, n_q, radius, COUNT, BLOCK_N, BLOCK_Q)
    for step in range(count):
        qi = _walk_start(WALK, step, first, INDEX, BLOCK_Q) + tl.arange(0, BLOCK_Q)
        in_q = qi < n_q
        q = _load_rows(Q, qi, n_q, D)
        do = _load_rows(DO, qi, n_q, D)
        row_max = tl.load(LSE + 2 * qi, mask=in_q, other=0.0)
        row_log2sum = tl.load(LSE + 2 * qi + 1, mask=in_q, other=float("inf"))
        delta = tl.load(DELTA + qi, mask=in_q, other=0.0)
        labels = _tile_labels(LAB, qi[None, :], kj[:, None], n_q, n_k, label_row_stride, radius, WALK == WALK_BAND)
        s_t, valid = _tile_scores(_dot(k, tl.trans(q), None, UPCAST, PRECISION), labels, QAB, qi[None, :], n_labels, qk_scale)
        p_t = tl.where(valid, tl.exp2((s_t - row_max[None, :]) * 1.4426950408889634 - row_log2sum[None, :]), 0.0)
        dv = _dot(p_t.to(do.dtype), do, dv, UPCAST, PRECISION)
        dp_t = _dot(v, tl.trans(do), None, UPCAST, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot(ds_t.to(q.dtype), q, dk, UPCAST, PRECISION)
    return dk, dv


@triton.jit
def _dkdv_tile(tile, bh, K, V, DK, DV,
               QA, DOA, LSEA, DELTAA, QABA, LABA, COUNTA, INDEXA,
               QB, DOB, LSEB, DELTAB, QABB, LABB, COUNTB, INDEXB,
               n_k, n_qa, n_qb, n_heads, n_labels, radius, scale, qk_scale,
               label_a_row_stride, label_b_row_stride,
               BLOCK_N: tl.constexpr, BLOCK_QA: tl.constexpr, BLOCK_QB: tl.constexpr, D: tl.constexpr,
               WALK_A: tl.constexpr, WALK_B: tl.constexpr,
               UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """dk and dv rows of key tile `tile` of `bh`, from query kinds A then B."""
    b = bh // n_heads
    row = b * tl.cdiv(n_k, BLOCK_N) + tile
    K += bh * n_k * D
    V += bh * n_k * D
    DK += bh * n_k * D
    DV += bh * n_k * D
    QA += bh * n_qa * D
    DOA += bh * n_qa * D
    LSEA += bh * n_qa * 2
    DELTAA += bh * n_qa
    QABA += bh * n_qa * n_labels
    LABA += b * n_qa * label_a_row_stride
    QB += bh * n_qb * D
    DOB += bh * n_qb * D
    LSEB += bh * n_qb * 2
    DELTAB += bh * n_qb
    QABB += bh * n_qb * n_labels
    LABB += b * n_qb * label_b_row_stride

    k_start = tile * BLOCK_N
    kj = k_start + tl.arange(0, BLOCK_N)
    k = _load_rows(K, kj, n_k, D)
    v = _load_rows(V, kj, n_k, D)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dk, dv = _dkdv_phase(dk, dv, k, v, kj, k_start, QA, DOA, LSEA, DELTAA, QABA, LABA,
                         COUNTA + row, INDEXA + row * tl.cdiv(n_qa, BLOCK_QA),
                         n_qa, n_k, n_labels, label_a_row_stride, radius, qk_scale,
                         BLOCK_N, BLOCK_QA, D, WALK_A, UPCAST, PRECISION)
    dk, dv = _dkdv_phase(dk, dv, k, v, kj, k_start, QB, DOB, LSEB, DELTAB, QABB, LABB,
                         COUNTB + row, INDEXB + row * tl.cdiv(n_qb, BLOCK_QB),
                         n_qb, n_k, n_labels, label_b_row_stride, radius, qk_scale,
                         BLOCK_N, BLOCK_QB, D, WALK_B, UPCAST, PRECISION)
    out = kj[:, None] * D + tl.arange(0, D)[None, :]
    in_k = (kj < n_k)[:, None]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=in_k)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=in_k)


@triton.jit
def _dkdv_kernel(KG, VG, DKG, DVG, KL, VL, DKL, DVL,
                 QG, DOG, LSEG, DELTAG, QABG, QL, DOL, LSEL, DELTAL, QABL,
                 LAB_GG, LAB_GL, LAB_LG, LAB_LL, COUNT_LG_BY_KEY, INDEX_LG_BY_KEY, COUNT_GL_BY_KEY, INDEX_GL_BY_KEY,
                 n_gq, n_g, n_l, n_batch_heads, n_heads, n_labels, radius, scale, qk_scale,
                 BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, D: tl.constexpr,
                 UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Both key kinds in one launch. Global key tiles go first: each hears from every long query
    tile its l2g column reaches (all of them under soft l2g), a long key tile from a few."""
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_g, BLOCK_G)
    if pid < global_tiles * n_batch_heads:  # A: long queries through l2g; B: global queries through g2g
        bh = (pid // global_tiles).to(tl.int64)
        _dkdv_tile(pid % global_tiles, bh, KG, VG, DKG, DVG,
                   QL, DOL, LSEL, DELTAL, QABL, LAB_LG, COUNT_LG_BY_KEY, INDEX_LG_BY_KEY,
                   QG, DOG, LSEG, DELTAG, QABG, LAB_GG, COUNT_LG_BY_KEY, INDEX_LG_BY_KEY,
                   n_g, n_l, n_gq, n_heads, n_labels, radius, scale, qk_scale, n_g, n_g,
                   BLOCK_G, BLOCK_L, BLOCK_G, D, WALK_LIST, WALK_ALL, UPCAST, PRECISION)
    else:  # A: global queries through g2l; B: long queries through the l2l band
        pid -= global_tiles * n_batch_heads
        long_tiles = tl.cdiv(n_l, BLOCK_L)
        bh = (pid // long_tiles).to(tl.int64)
        _dkdv_tile(pid % long_tiles, bh, KL, VL, DKL, DVL,
                   QG, DOG, LSEG, DELTAG, QABG, LAB_GL, COUNT_GL_BY_KEY, INDEX_GL_BY_KEY,
                   QL, DOL, LSEL, DELTAL, QABL, LAB_LL, COUNT_GL_BY_KEY, INDEX_GL_BY_KEY,
                   n_l, n_gq, n_l, n_heads, n_labels, radius, scale, qk_scale, n_l, 2 * radius + 1,
                   BLOCK_L, BLOCK_G, BLOCK_L, D, WALK_LIST, WALK_BAND, UPCAST, PRECISION)


def _delta(out: torch.Tensor, d_out: torch.Tensor) -> torch.Tensor:
    """delta_i = o_i . do_i in fp32, the softmax-backward correction of each query row."""
    return (out.float() * d_out.float()).sum(-1).contiguous()


def backward(saved: dict[str, torch.Tensor], plan: AttentionPlan, scale: float) -> dict[str, torch.Tensor]:
    """Gradients dq/dk/dv_{g,l} ([B, H, n, d]) and dqab_{g,l} ([B, H, n, V] fp32).

    `saved` holds q, k, v, qab, o, lse and the incoming do for both kinds (suffix _g / _l).
    """
    batch, heads, _, head_dim = saved["q_l"].shape
    dtype = saved["q_l"].dtype
    grads = {f"d{name}_{kind}": torch.empty_like(saved[f"{name}_{kind}"]) for name in "qkv" for kind in "gl"}
    for kind in "gl":
        grads[f"dqab_{kind}"] = torch.zeros_like(saved[f"qab_{kind}"])
        saved[f"delta_{kind}"] = _delta(saved[f"o_{kind}"], saved[f"do_{kind}"])
    grid = (program_count(plan.n_global, plan.n_long, batch * heads, plan.sizes),)
    key_grid = (program_count(plan.n_global_keys, plan.n_long, batch * heads, plan.sizes),)
    if grid[0] == 0:
        return grads
    shape = (plan.n_global, plan.n_global_keys, plan.n_long, batch * heads, heads, plan.n_labels, plan.radius, scale, scale)
    options = dict(BLOCK_G=plan.sizes.global_, BLOCK_L=plan.sizes.long, D=head_dim,
                   **dot_options(dtype), **launch_options(head_dim, dtype))
    labels = (plan.g2g, plan.g2l, plan.l2g, plan.l2l)

    def queries(kind: str) -> list[torch.Tensor]:
        return [saved[f"{name}_{kind}"] for name in ("q", "do", "lse", "delta", "qab")]

    _dq_kernel[grid](
        *queries("g"), grads["dq_g"], grads["dqab_g"], *queries("l"), grads["dq_l"], grads["dqab_l"],
        saved["k_g"], saved["v_g"], saved["k_l"], saved["v_l"], *labels,
        plan.g2l_blocks.counts, plan.g2l_blocks.indices, plan.l2g_blocks.counts, plan.l2g_blocks.indices,
        *shape, **options,
    )
    l2g_by_key, g2l_by_key = plan.blocks_by_key("l2g"), plan.blocks_by_key("g2l")
    _dkdv_kernel[key_grid](
        saved["k_g"], saved["v_g"], grads["dk_g"], grads["dv_g"], saved["k_l"], saved["v_l"], grads["dk_l"], grads["dv_l"],
        *queries("g"), *queries("l"), *labels,
        l2g_by_key.counts, l2g_by_key.indices, g2l_by_key.counts, g2l_by_key.indices,
        *shape, **options,
    )
    return grads
