"""Triton forward kernel of global-local attention, and the tile helpers the backward shares.

One program owns a tile of queries of one kind (long or global) for one (batch, head) and
streams two key phases through ONE online softmax (fp32 max, sum and accumulator, base-2
exponentials as in Triton's fused-attention tutorial, of (score - max) * log2(e): scores stay in
natural units, so a score near finfo.min, e.g. from a bias of finfo.min, never overflows):

    long queries:   global keys (l2g labels, tiles listed per query tile) then the local window
                    (l2l band: key i-r..i+r, only the key tiles that overlap the band)
    global queries: global keys (g2g labels, all tiles) then long keys (g2l labels, only the
                    key tiles that the g2l mask leaves non-empty: hard g2l skips most)

One launch covers both kinds, global tiles first (see `_forward_kernel`). How a phase walks its
key tiles is a compile-time switch (`WALK_ALL`, `WALK_LIST`, `WALK_BAND`)
rather than a copy of the loop. Labels arrive pre-masked: `label = -1` where the mask is 0, so
one gather gives both. The label term is gathered from a per-query table `qab[i, v] = scale *
q_i . a^K_v + b_v` (computed once per label in PyTorch), never built per pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphattn.kernels.triton_blocks import AttentionPlan

LOG2E = 1.4426950408889634

WALK_ALL = tl.constexpr(0)  # every tile of the other side, in order
WALK_LIST = tl.constexpr(1)  # the tiles a KeyBlocks table lists for this tile
WALK_BAND = tl.constexpr(2)  # the long tiles overlapping the local window [i - r, i + r] of the tile


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ b with fp32 accumulation, accumulating in place (on sm_90 a separate add would
    serialize the wgmma pipeline). UPCAST feeds fp32 operands to `tl.dot`: the interpreter
    multiplies bf16 operands wrongly; on a GPU it is never set."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def _load_rows(ptr, rows, n_rows, D: tl.constexpr):
    """Rows `rows` of a contiguous [n_rows, D] matrix, zeros outside it."""
    cols = tl.arange(0, D)
    inside = (rows[:, None] >= 0) & (rows[:, None] < n_rows)
    return tl.load(ptr + rows[:, None] * D + cols[None, :], mask=inside, other=0.0)


@triton.jit
def _walk_bounds(WALK: tl.constexpr, own_start, n_other, radius, count_ptr, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr):
    """(first token, number of tiles) of the other side's tiles a program visits."""
    if WALK == WALK_LIST:
        first = 0
        count = tl.load(count_ptr)
    elif WALK == WALK_BAND:
        first = tl.maximum(own_start - radius, 0)
        last = tl.minimum(own_start + BLOCK_OWN + radius, n_other)
        count = tl.cdiv(last - first, BLOCK_WALK)
    else:
        first = 0
        count = tl.cdiv(n_other, BLOCK_WALK)
    return first, count


@triton.jit
def _walk_start(WALK: tl.constexpr, step, first, index_ptr, BLOCK_WALK: tl.constexpr):
    """First token of the `step`-th visited tile."""
    if WALK == WALK_LIST:
        start = tl.load(index_ptr + step) * BLOCK_WALK
    else:
        start = first + step * BLOCK_WALK
    return start


@triton.jit
def _tile_labels(label_ptr, qi, kj, n_q, n_k, label_row_stride, radius, BAND: tl.constexpr):
    """Label id of each (query qi, key kj) pair, -1 where it may not attend.

    `qi` and `kj` are broadcastable 2D index tensors, so one helper serves [queries, keys] tiles
    (forward, dq) and [keys, queries] tiles (dk/dv). BAND reads an l2l [L, 2r+1] table, column
    kj - qi + r; otherwise a dense [n_q, n_k] table.
    """
    inside = (qi >= 0) & (qi < n_q) & (kj >= 0) & (kj < n_k)
    if BAND:
        column = kj - qi + radius
        inside = inside & (column >= 0) & (column <= 2 * radius)
        offsets = qi * label_row_stride + column
    else:
        offsets = qi * label_row_stride + kj
    return tl.load(label_ptr + offsets, mask=inside, other=-1).to(tl.int32)


@triton.jit
def _tile_scores(qk, labels, qab_ptr, qi, n_labels, qk_scale):
    """Scores q.k * scale + qab[qi, label] (natural units), -inf where masked, and where they count."""
    valid = labels >= 0
    label_term = tl.load(qab_ptr + qi * n_labels + labels, mask=valid, other=0.0)
    scores = qk * qk_scale + label_term
    return tl.where(valid, scores, float("-inf")), valid


@triton.jit
def _attend(acc, m_i, l_i, q, qi, q_start, K, Vals, LAB, QAB, COUNT, INDEX,
            n_q, n_k, n_labels, label_row_stride, radius, qk_scale,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WALK: tl.constexpr,
            UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one key phase into the running softmax (m_i, l_i) and accumulator of a query tile.

    Fully masked tiles keep m_i = -inf; exponentials are taken against 0 then, so no NaN.
    """
    first, count = _walk_bounds(WALK, q_start, n_k, radius, COUNT, BLOCK_M, BLOCK_N)
    for step in range(count):
        kj = _walk_start(WALK, step, first, INDEX, BLOCK_N) + tl.arange(0, BLOCK_N)
        k = _load_rows(K, kj, n_k, D)
        v = _load_rows(Vals, kj, n_k, D)
        labels = _tile_labels(LAB, qi[:, None], kj[None, :], n_q, n_k, label_row_stride, radius, WALK == WALK_BAND)
        s, valid = _tile_scores(_dot(q, tl.trans(k), None, UPCAST, PRECISION), labels, QAB, qi[:, None], n_labels, qk_scale)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2((s - m_ref[:, None]) * 1.4426950408889634)
        alpha = tl.exp2((m_i - m_ref) * 1.4426950408889634)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _forward_tile(tile, bh, Q, O, LSE, QAB, KG, VG, KL, VL,
                  LAB_G, LAB_L, COUNT_G, INDEX_G, COUNT_L, INDEX_L,
                  n_q, n_g, n_l, n_heads, n_labels, radius, qk_scale, label_l_row_stride,
                  BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, D: tl.constexpr,
                  WALK_G: tl.constexpr, WALK_L: tl.constexpr,
                  UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Output rows and log-sum-exp of query tile `tile` of (batch x head) `bh`."""
    b = bh // n_heads
    row = b * tl.cdiv(n_q, BLOCK_M) + tile  # this tile's row of the key-block tables
    Q += bh * n_q * D
    O += bh * n_q * D
    LSE += bh * n_q * 2
    QAB += bh * n_q * n_labels
    KG += bh * n_g * D
    VG += bh * n_g * D
    KL += bh * n_l * D
    VL += bh * n_l * D
    LAB_G += b * n_q * n_g
    LAB_L += b * n_q * label_l_row_stride

    q_start = tile * BLOCK_M
    qi = q_start + tl.arange(0, BLOCK_M)
    q = _load_rows(Q, qi, n_q, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, qi, q_start, KG, VG, LAB_G, QAB,
                            COUNT_G + row, INDEX_G + row * tl.cdiv(n_g, BLOCK_G),
                            n_q, n_g, n_labels, n_g, radius, qk_scale,
                            BLOCK_M, BLOCK_G, D, WALK_G, UPCAST, PRECISION)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, qi, q_start, KL, VL, LAB_L, QAB,
                            COUNT_L + row, INDEX_L + row * tl.cdiv(n_l, BLOCK_L),
                            n_q, n_l, n_labels, label_l_row_stride, radius, qk_scale,
                            BLOCK_M, BLOCK_L, D, WALK_L, UPCAST, PRECISION)

    alive = l_i > 0.0
    l_safe = tl.where(alive, l_i, 1.0)
    out = acc / l_safe[:, None]
    in_q = qi < n_q
    tl.store(O + qi[:, None] * D + tl.arange(0, D)[None, :], out.to(O.dtype.element_ty), mask=in_q[:, None])
    # (max, log2 sum), not their sum: next to a max near finfo.min the log-sum-exp drops log(sum)
    tl.store(LSE + 2 * qi, tl.where(alive, m_i, 0.0), mask=in_q)
    tl.store(LSE + 2 * qi + 1, tl.where(alive, tl.log2(l_safe), float("inf")), mask=in_q)


@triton.jit
def _forward_kernel(QG, OG, LSEG, QABG, QL, OL, LSEL, QABL, KG, VG, KL, VL,
                    LAB_GG, LAB_GL, LAB_LG, LAB_LL, COUNT_GL, INDEX_GL, COUNT_LG, INDEX_LG,
                    n_gq, n_g, n_l, n_batch_heads, n_heads, n_labels, radius, qk_scale,
                    BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, D: tl.constexpr,
                    UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """One launch for both query kinds, global tiles first (n_gq global queries, n_g global keys:
    the slots past n_gq are keys only).

    A global tile streams far more keys (its whole g2l row) than a long tile (a few global
    tiles and its window), and there are few of them: started first, they overlap with the
    many short long-query programs instead of trailing a second launch on an idle GPU.
    """
    pid = tl.program_id(0)
    global_tiles = tl.cdiv(n_gq, BLOCK_G)
    if pid < global_tiles * n_batch_heads:
        bh = (pid // global_tiles).to(tl.int64)
        _forward_tile(pid % global_tiles, bh, QG, OG, LSEG, QABG, KG, VG, KL, VL,
                      LAB_GG, LAB_GL, COUNT_GL, INDEX_GL, COUNT_GL, INDEX_GL,
                      n_gq, n_g, n_l, n_heads, n_labels, radius, qk_scale, n_l,
                      BLOCK_G, BLOCK_G, BLOCK_L, D, WALK_ALL, WALK_LIST, UPCAST, PRECISION)
    else:
        pid -= global_tiles * n_batch_heads
        long_tiles = tl.cdiv(n_l, BLOCK_L)
        bh = (pid // long_tiles).to(tl.int64)
        _forward_tile(pid % long_tiles, bh, QL, OL, LSEL, QABL, KG, VG, KL, VL,
                      LAB_LG, LAB_LL, COUNT_LG, INDEX_LG, COUNT_LG, INDEX_LG,
                      n_l, n_g, n_l, n_heads, n_labels, radius, qk_scale, 2 * radius + 1,
                      BLOCK_L, BLOCK_G, BLOCK_L, D, WALK_LIST, WALK_BAND, UPCAST, PRECISION)


def dot_options(dtype: torch.dtype) -> dict:
    """Compile-time switches for `_dot`: fp32 stays IEEE fp32 (like torch's default matmul)
    unless the user allowed TF32; bf16 is upcast under the interpreter only."""
    from graphattn.kernels.triton_blocks import interpreter_active

    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    precision = "tf32" if dtype != torch.float32 or allow_tf32 else "ieee"
    return {"UPCAST": interpreter_active() and dtype == torch.bfloat16, "PRECISION": precision}


def launch_options(head_dim: int, dtype: torch.dtype) -> dict:
    """Warps and pipeline stages. 8 warps: the 64 x 64 label and score gathers of a tile need
    about 250 registers a thread at 4 warps and spill at d <= 32 on sm_90 (ptxas, by
    `python -m graphattn.kernels.triton_aot`); at 8 none spill for d <= 64 in fp16/bf16. Two
    stages overlap the next key tile's loads with this tile's products, except fp32 at
    d = 128, whose two-stage buffers pass the 163 KB of shared memory an A100 has."""
    stages = 1 if head_dim >= 128 and dtype == torch.float32 else 2
    return {"num_warps": 8, "num_stages": stages}


def program_count(n_global: int, n_long: int, batch_heads: int, sizes) -> int:
    """Programs of a launch that covers every global tile and every long tile of every head
    (global query tiles for the query-owner kernels, global key tiles for the key-owner one)."""
    return (triton.cdiv(n_global, sizes.global_) + triton.cdiv(n_long, sizes.long)) * batch_heads


def forward(states: dict[str, torch.Tensor], plan: AttentionPlan, scale: float) -> dict[str, torch.Tensor]:
    """Outputs o_g, o_l ([B, H, n, d]) and softmax statistics lse_g, lse_l ([B, H, n, 2]: each
    row's max score and log2 of its sum of exp(score - max); +inf for rows with no key).

    `states` maps q_g, k_g, v_g, q_l, k_l, v_l (contiguous [B, H, n, d]) and qab_g, qab_l
    ([B, H, n, V] fp32) to tensors; g = global, l = long.
    """
    q_g, q_l = states["q_g"], states["q_l"]
    batch, heads, _, head_dim = q_l.shape
    out = {"o_g": torch.empty_like(q_g), "o_l": torch.empty_like(q_l)}
    for kind, q in (("g", q_g), ("l", q_l)):
        out[f"lse_{kind}"] = torch.empty((*q.shape[:3], 2), dtype=torch.float32, device=q.device)
    grid = (program_count(plan.n_global, plan.n_long, batch * heads, plan.sizes),)
    if grid[0] == 0:
        return out
    _forward_kernel[grid](
        q_g, out["o_g"], out["lse_g"], states["qab_g"], q_l, out["o_l"], out["lse_l"], states["qab_l"],
        states["k_g"], states["v_g"], states["k_l"], states["v_l"],
        plan.g2g, plan.g2l, plan.l2g, plan.l2l,
        plan.g2l_blocks.counts, plan.g2l_blocks.indices, plan.l2g_blocks.counts, plan.l2g_blocks.indices,
        plan.n_global, plan.n_global_keys, plan.n_long, batch * heads, heads, plan.n_labels, plan.radius, scale,
        BLOCK_G=plan.sizes.global_, BLOCK_L=plan.sizes.long, D=head_dim,
        **dot_options(q_l.dtype), **launch_options(head_dim, q_l.dtype),
    )
    return out
