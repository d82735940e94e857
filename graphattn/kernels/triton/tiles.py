"""The device helpers every Triton kernel of the backend shares: how a program finds its tile and
walks the other side's tiles (`WALK_ALL`, `WALK_LIST`, `WALK_BAND`), row loads, the dot product
with its precision switch, and the softmax recomputed from saved statistics (the backward's).
"""

from __future__ import annotations

import triton
import triton.language as tl

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
def _walk_bounds(
    WALK: tl.constexpr, own_start, n_other, radius, count_ptr, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr
):
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
def _program(pid, n_tiles, n_heads):
    """(batch, tile, batch x head) of a program; the heads of one (batch, tile) are neighbours."""
    head = pid % n_heads
    tile = (pid // n_heads) % n_tiles
    b = pid // (n_heads * n_tiles)
    return b, tile, (b * n_heads + head).to(tl.int64)


@triton.jit
def _probabilities(s, valid, row_max, row_log2sum):
    """The forward's softmax of a tile from its saved statistics (0 where masked: -inf goes in, so
    that a masked pair's raw score never overflows the exponent)."""
    s = tl.where(valid, s, float("-inf"))
    return tl.exp2((s - row_max) * 1.4426950408889634 - row_log2sum)
