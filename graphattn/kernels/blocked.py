"""Blocked global-local attention in PyTorch: linear memory, autograd, the CPU default.

On a CPU the time goes to matmuls, to a handful of passes over the score tiles, and (for large
fresh tensors) to page faults. The layout is chosen for all three:

* Long queries are cut into blocks of w >= r rows. Block b sees key blocks b-1, b, b+1 (a
  window of 3w keys, copied per chunk into a reused buffer), so the local scores of a chunk of
  blocks are one batched matmul with a contiguous output. Their l2l labels are the [w, 2r+1]
  side-input rows skewed into [w, 3w] by pad-and-reshape (once per call), never a loop over keys.
* All tiles are BH-major: the window tiles [B*H*nbc, w, 3w] and the l2g tile [B*H, nbc*w, G] of
  a chunk share one row order, so one softmax spans both without moving data.
* Labels, bias and masks enter as ONE gather: per query a table T = scale * q.a^K + b with an
  extra column V holding -inf; masked pairs point at column V. The gathered tile is the input
  of an in-place baddbmm, so score = T[label] + scale * q.k costs one gemm pass.
* Long queries run in chunks of blocks, global queries in chunks of rows, sized so that one
  score tile stays within TILE_ELEMENTS: memory is linear in L and no [H, L, G] tensor exists.
  Each chunk only touches the key span its masks allow (hard l2g/g2l masks and packed
  documents shrink it a lot), and tiles live in scratch buffers reused across chunks.
* A custom autograd Function keeps outputs and per-row log-sum-exp and recomputes tiles in
  backward, as flash attention does; dT comes back by scatter-add over the same label index and
  autograd turns it into gradients of q, a^K and b.

Statistics and matmuls run in fp32 (fp64 stays fp64); outputs take the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphattn.compile.contract import SideInputs

# Elements of one score tile (all heads of a chunk): bounds memory, keeps tiles cache-friendly.
TILE_ELEMENTS = 1 << 21
NEG_INF = float("-inf")


def default_block_size(radius: int) -> int:
    """Rows per long-query block: the window is 3w keys for 2r+1 needed, so w = r wastes least;
    very small radii get bigger blocks so that the matmuls stay worth calling."""
    return max(radius, 16)


@dataclass
class _Geometry:
    batch: int
    heads: int
    num_global: int
    num_long: int
    radius: int
    block: int
    num_blocks: int
    vocab: int  # V; column V of a table is -inf and stands for "masked"
    scale: float
    blocks_per_chunk: int
    global_rows_per_chunk: int

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def padded_long(self) -> int:
        return self.num_blocks * self.block


def _geometry(batch, heads, num_global, num_long, radius, vocab, scale, block_size, tile_elements) -> _Geometry:
    # Keys farther than L-1 away never exist, so a huge radius (BERT-style r >= L) costs nothing.
    radius = min(radius, max(num_long - 1, 0))
    block = max(block_size or default_block_size(radius), radius, 1)
    num_blocks = max(1, math.ceil(num_long / block))
    per_block = batch * heads * block * 3 * block
    blocks_per_chunk = max(1, min(num_blocks, tile_elements // per_block))
    per_global_row = batch * heads * max(num_global, num_long)
    global_rows = max(16, tile_elements // per_global_row)
    return _Geometry(batch, heads, num_global, num_long, radius, block, num_blocks, vocab, scale, blocks_per_chunk, global_rows)


class _Scratch:
    """One buffer reused by every chunk: large fresh tensors cost page faults on every call."""

    def __init__(self, like: torch.Tensor):
        self.like, self.buffer = like, None

    def take(self, *shape: int) -> torch.Tensor:
        size = math.prod(shape)
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = self.like.new_empty(size)
        return self.buffer[:size].view(shape)


def _label_index(mask: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 gather index: the label where the mask allows the pair, else the -inf column V."""
    return torch.where(mask != 0, ids.long(), vocab)


def _pad_dim(x: torch.Tensor, size: int, dim: int, value: float | int = 0) -> torch.Tensor:
    """Pad `x` at the end of `dim` (negative) up to `size`."""
    missing = size - x.shape[dim]
    if missing == 0:
        return x
    return torch.nn.functional.pad(x, [0, 0] * (-dim - 1) + [0, missing], value=value)


def _extend_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """[B, H, n, V] -> [B, H, rows, V+1] with the -inf column for masked pairs."""
    b, h, n, v = table.shape
    out = table.new_full((b, h, rows, v + 1), NEG_INF)
    out[:, :, :n, :v] = table
    return out


def _spans(mask: torch.Tensor, rows_per_chunk: int) -> list[tuple[int, int]]:
    """Per chunk of `rows_per_chunk` query rows of a [B, n, m] mask: the [lo, hi) of the key
    columns any of them may attend to ((0, 0) if none). One pass over the mask per call."""
    batch, rows, cols = mask.shape
    full = rows // rows_per_chunk
    groups = [mask[:, : full * rows_per_chunk].reshape(batch, full, rows_per_chunk, cols).any(2).any(0)]
    if rows > full * rows_per_chunk:
        groups.append(mask[:, full * rows_per_chunk :].any(1).any(0, keepdim=True))
    allowed = torch.cat(groups)  # [chunks, m]
    if cols == 0:
        return [(0, 0)] * allowed.shape[0]
    first = allowed.int().argmax(1)
    last = cols - allowed.flip(1).int().argmax(1)
    some = allowed.any(1)
    return [(lo, hi) if ok else (0, 0) for lo, hi, ok in zip(first.tolist(), last.tolist(), some.tolist())]


class _Layout:
    """Per-call tensors, built from the inputs by both passes. Everything is BH-major
    ([B*H, rows, ...]), so a chunk's window tiles ([BH*nbc, w, 3w]) and l2g tiles
    ([BH, nbc*w, G]) share one row order and their statistics merge without copies."""

    def __init__(self, geo: _Geometry, side: SideInputs, gq, gk, gv, lq, lk, lv, t_global, t_long):
        bh, d = geo.bh, lq.shape[-1]
        self.geo, self.dim, self.side = geo, d, side
        self.gq, self.gk, self.gv = (x.reshape(bh, geo.num_global, d) for x in (gq, gk, gv))
        self.lq, self.lk, self.lv = (x.reshape(bh, geo.num_long, d) for x in (lq, lk, lv))
        self.t_global = _extend_table(t_global, geo.num_global)  # [B, H, G, V+1]
        self.t_long = _extend_table(t_long, geo.padded_long)  # [B, H, Lp, V+1]
        # Side-input work done once per call, not per chunk (fewer, larger ops).
        self.local_index = _local_index(geo, side)  # [B, 1, nb, w, 3w]
        has_global = geo.num_global > 0
        self.long_spans = _spans(side.l2g_att_mask, geo.blocks_per_chunk * geo.block) if has_global else []
        self.global_spans = _spans(side.g2l_att_mask, geo.global_rows_per_chunk) if has_global else []

    def rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Rows of blocks first..last-1 of x [BH, L, d] as a contiguous [BH*nbc, w, d], zeros past L."""
        geo = self.geo
        start, stop = first * geo.block, last * geo.block
        chunk = _pad_dim(x[:, start : min(stop, geo.num_long)], stop - start, -2)
        return chunk.reshape(geo.bh * (last - first), geo.block, self.dim)

    def windows(self, x: torch.Tensor, first: int, last: int, scratch: _Scratch) -> torch.Tensor:
        """Keys (or values) of blocks first..last-1 with both neighbours: [BH*nbc, 3w, d].

        Rows (first-1)*w .. (last+1)*w of x (zero-padded at the sequence ends) seen as blocks and
        unfolded three at a time: one copy into the scratch buffer."""
        geo, nbc = self.geo, last - first
        w, bh, length = geo.block, geo.bh, geo.num_long
        start, stop = (first - 1) * w, (last + 1) * w
        region = x[:, max(start, 0) : min(stop, length)]
        if start < 0 or stop > length:
            region = torch.nn.functional.pad(region, (0, 0, max(-start, 0), max(stop - length, 0)))
        blocks = region.view(bh, nbc + 2, w, self.dim).unfold(1, 3, 1)  # [BH, nbc, w, d, 3]
        out = scratch.take(bh, nbc, 3, w, self.dim)
        out.copy_(blocks.permute(0, 1, 4, 2, 3))
        return out.view(bh * nbc, 3 * w, self.dim)


def _local_index(geo: _Geometry, side: SideInputs) -> torch.Tensor:
    """Gather index [B, 1, nb, w, 3w] of the l2l labels of every block, built once per call.

    Query a of a block needs window columns w-r+a .. w+r+a: the side-input row (2r+1 columns)
    padded to 3w+1 columns and reshaped to rows of 3w lands each row a places to the right.
    """
    w, r, big_l, nb = geo.block, geo.radius, geo.num_long, geo.num_blocks
    columns = slice(side.local_radius - r, side.local_radius + r + 1)  # radius clipped to L-1
    rows = torch.arange(big_l, device=side.l2l_att_mask.device)
    keys = rows[:, None] + torch.arange(-r, r + 1, device=rows.device)[None, :]
    allowed = (side.l2l_att_mask[:, :, columns] != 0) & (keys >= 0) & (keys < big_l)
    index = _label_index(allowed, side.l2l_relative_att_ids[:, :, columns], geo.vocab)
    index = _pad_dim(index, nb * w, -2, geo.vocab).view(geo.batch, nb, w, 2 * r + 1)
    index = torch.nn.functional.pad(index, (w - r, 2 * w - r), value=geo.vocab)  # [B, nb, w, 3w+1]
    return index.flatten(2)[:, :, : w * 3 * w].view(geo.batch, 1, nb, w, 3 * w)


def _gather_into(out: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[b, h, ..., m] = table[b, h, ..., index[b, 0, ..., m]]."""
    return torch.gather(table, -1, index.expand(out.shape), out=out)


class _Scratches:
    def __init__(self, like: torch.Tensor):
        names = ("local", "glob", "g2g", "g2l", "keys", "values", "d_local", "d_glob", "d_g2g", "d_g2l", "d_windows")
        for name in names:
            setattr(self, name, _Scratch(like))


class _LongChunk:
    """Score tiles of long-query blocks first..last-1: the windows [BH*nbc, w, 3w] and the
    l2g tile [BH, R, span] (R = nbc*w rows, the same row order)."""

    def __init__(self, lay: _Layout, first: int, last: int, scratch: _Scratches):
        geo, side = lay.geo, lay.side
        bh, w, nbc = geo.bh, geo.block, last - first
        self.first, self.last, self.nbc = first, last, nbc
        self.row_slice = slice(first * w, last * w)
        rows = nbc * w
        self.q = lay.rows(lay.lq, first, last)  # [BH*nbc, w, d]
        self.k_windows = lay.windows(lay.lk, first, last, scratch.keys)
        self.v_windows = lay.windows(lay.lv, first, last, scratch.values)
        self.table = lay.t_long[:, :, self.row_slice]  # [B, H, R, V+1]
        self.local_index = lay.local_index[:, :, first:last]
        local = scratch.local.take(geo.batch, geo.heads, nbc, w, 3 * w)
        _gather_into(local, self.table.view(geo.batch, geo.heads, nbc, w, -1), self.local_index)
        self.local = local.view(bh * nbc, w, 3 * w).baddbmm_(self.q, self.k_windows.transpose(1, 2), alpha=geo.scale)

        self.glob = None
        lo, hi = lay.long_spans[first // geo.blocks_per_chunk] if geo.num_global else (0, 0)
        if hi > lo:
            self.keys = slice(lo, hi)
            real = slice(self.row_slice.start, min(self.row_slice.stop, geo.num_long))
            index = _label_index(side.l2g_att_mask[:, real, lo:hi], side.l2g_relative_att_ids[:, real, lo:hi], geo.vocab)
            self.glob_index = _pad_dim(index, rows, -2, geo.vocab).unsqueeze(1)  # [B, 1, R, span]
            glob = _gather_into(scratch.glob.take(geo.batch, geo.heads, rows, hi - lo), self.table, self.glob_index)
            self.glob = glob.view(bh, rows, hi - lo).baddbmm_(self.q_rows, lay.gk[:, lo:hi].transpose(1, 2), alpha=geo.scale)

    @property
    def q_rows(self) -> torch.Tensor:
        return self.q.view(-1, self.nbc * self.q.shape[1], self.q.shape[2])


class _GlobalChunk:
    """Score tiles of global query rows start..stop-1: g2g [BH, c, G] and g2l [BH, c, span]."""

    def __init__(self, lay: _Layout, start: int, stop: int, scratch: _Scratches):
        geo, side = lay.geo, lay.side
        bh, rows = geo.bh, stop - start
        self.rows = slice(start, stop)
        self.q = lay.gq[:, start:stop]
        table = lay.t_global[:, :, start:stop]
        self.g2g_index = _label_index(side.g2g_att_mask[:, start:stop], side.g2g_relative_att_ids[:, start:stop], geo.vocab).unsqueeze(1)
        g2g = _gather_into(scratch.g2g.take(geo.batch, geo.heads, rows, geo.num_global), table, self.g2g_index)
        self.g2g = g2g.view(bh, rows, geo.num_global).baddbmm_(self.q, lay.gk.transpose(1, 2), alpha=geo.scale)
        self.g2l = None
        lo, hi = lay.global_spans[start // geo.global_rows_per_chunk]
        if hi > lo:
            self.keys = slice(lo, hi)
            mask, ids = side.g2l_att_mask[:, start:stop, lo:hi], side.g2l_relative_att_ids[:, start:stop, lo:hi]
            self.g2l_index = _label_index(mask, ids, geo.vocab).unsqueeze(1)
            g2l = _gather_into(scratch.g2l.take(geo.batch, geo.heads, rows, hi - lo), table, self.g2l_index)
            self.g2l = g2l.view(bh, rows, hi - lo).baddbmm_(self.q, lay.lk[:, lo:hi].transpose(1, 2), alpha=geo.scale)


def _long_chunks(geo: _Geometry):
    for first in range(0, geo.num_blocks, geo.blocks_per_chunk):
        yield first, min(first + geo.blocks_per_chunk, geo.num_blocks)


def _global_chunks(geo: _Geometry):
    for start in range(0, geo.num_global, geo.global_rows_per_chunk):
        yield start, min(start + geo.global_rows_per_chunk, geo.num_global)


# Floor for row maxima and sums: a fully masked row keeps a finite max (so exp(-inf - max) = 0,
# never NaN), divides its zero output by a tiny sum, and gets lse ~ -1e30, which backward's
# exp(-inf - lse) again turns into 0. Real scores never come near -1e30.
_FLOOR_MAX, _FLOOR_SUM = -1e30, 1e-30


def _row_max(*maxima: torch.Tensor) -> torch.Tensor:
    """Row maximum over several tiles, floored (fully masked rows give -inf maxima)."""
    row_max = maxima[0]
    for other in maxima[1:]:
        row_max = torch.maximum(row_max, other)
    return row_max.clamp_min_(_FLOOR_MAX)


def _finish(out: torch.Tensor, row_sum: torch.Tensor, row_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalize in place and return (out, log-sum-exp); empty rows stay 0."""
    row_sum.clamp_min_(_FLOOR_SUM)
    return out.div_(row_sum.unsqueeze(-1)), row_sum.log_().add_(row_max)


def _forward(lay: _Layout):
    geo, scratch = lay.geo, _Scratches(lay.lq)
    bh, d = geo.bh, lay.dim
    long_out = lay.lq.new_empty(bh, geo.num_long, d)
    long_lse = lay.lq.new_empty(bh, geo.padded_long)
    for first, last in _long_chunks(geo):
        tile = _LongChunk(lay, first, last, scratch)
        rows = tile.row_slice.stop - tile.row_slice.start
        maxima = [tile.local.amax(-1).view(bh, rows)] + ([tile.glob.amax(-1)] if tile.glob is not None else [])
        row_max = _row_max(*maxima)
        tile.local.view(bh, rows, -1).sub_(row_max.unsqueeze(-1)).exp_()
        row_sum = tile.local.sum(-1).view(bh, rows)
        out = torch.bmm(tile.local, tile.v_windows).view(bh, rows, d)
        if tile.glob is not None:
            row_sum += tile.glob.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
            out.baddbmm_(tile.glob, lay.gv[:, tile.keys])
        out, long_lse[:, tile.row_slice] = _finish(out, row_sum, row_max)
        long_out[:, tile.row_slice] = out[:, : geo.num_long - tile.row_slice.start]

    global_out = lay.gq.new_empty(bh, geo.num_global, d)
    global_lse = lay.gq.new_empty(bh, geo.num_global)
    for start, stop in _global_chunks(geo):
        tile = _GlobalChunk(lay, start, stop, scratch)
        maxima = [tile.g2g.amax(-1)] + ([tile.g2l.amax(-1)] if tile.g2l is not None else [])
        row_max = _row_max(*maxima)
        row_sum = tile.g2g.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
        out = torch.bmm(tile.g2g, lay.gv)
        if tile.g2l is not None:
            row_sum += tile.g2l.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
            out.baddbmm_(tile.g2l, lay.lv[:, tile.keys])
        global_out[:, tile.rows], global_lse[:, tile.rows] = _finish(out, row_sum, row_max)
    return global_out, global_lse, long_out, long_lse


def _score_grad(probs: torch.Tensor, grad_out: torch.Tensor, values: torch.Tensor, delta: torch.Tensor, scratch: _Scratch) -> torch.Tensor:
    """dS = P * (dO . V^T - delta), written over a scratch tile."""
    d_scores = scratch.take(*probs.shape)
    torch.bmm(grad_out, values.transpose(1, 2), out=d_scores)
    return d_scores.sub_(delta.unsqueeze(-1)).mul_(probs)


def _scatter_table_grad(grad_table: torch.Tensor, index: torch.Tensor, grad_scores: torch.Tensor) -> None:
    """Accumulate score gradients into the per-query label table (the reverse of the gather)."""
    shape = [*grad_table.shape[:-1], index.shape[-1]]
    grad_table.scatter_add_(-1, index.expand(shape), grad_scores.view(shape))


def _add_product(dest: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """dest += a @ b. baddbmm_ into a sliced view takes a per-matrix slow path on CPU (10x+),
    so the product goes to a fresh contiguous tensor first."""
    if dest.is_contiguous():
        dest.baddbmm_(a, b)
    else:
        dest += torch.bmm(a, b)


def _backward(lay: _Layout, outputs, grad_global, grad_long):
    geo, scratch = lay.geo, _Scratches(lay.lq)
    bh, d, w = geo.bh, lay.dim, geo.block
    global_out, global_lse, long_out, long_lse = outputs
    grad_long = grad_long.reshape(bh, geo.num_long, d)
    long_delta = _pad_dim((grad_long * long_out).sum(-1), geo.padded_long, -1)

    d_lq = lay.lq.new_zeros(bh, geo.padded_long, d)
    d_gq, d_gk, d_gv = (torch.zeros_like(x) for x in (lay.gq, lay.gk, lay.gv))
    d_lk, d_lv = torch.zeros_like(lay.lk), torch.zeros_like(lay.lv)
    # Window gradients land on key blocks -1 .. nb: rows shifted by one block.
    d_k_pad, d_v_pad = (lay.lk.new_zeros(bh, geo.padded_long + 2 * w, d) for _ in range(2))
    d_t_long, d_t_global = torch.zeros_like(lay.t_long), torch.zeros_like(lay.t_global)

    def add_windows(d_pad: torch.Tensor, windows: torch.Tensor, first: int, last: int) -> None:
        nbc = last - first
        parts = windows.view(bh, nbc, 3, w, d)
        for shift in range(3):
            d_pad[:, (first + shift) * w : (last + shift) * w].view(bh, nbc, w, d).add_(parts[:, :, shift])

    for first, last in _long_chunks(geo):
        tile = _LongChunk(lay, first, last, scratch)
        rows, nbc = tile.row_slice, tile.nbc
        lse, delta = long_lse[:, rows], long_delta[:, rows]
        g_rows = lay.rows(grad_long, first, last)  # [BH*nbc, w, d]
        probs = tile.local.view(bh, -1, 3 * w).sub_(lse.unsqueeze(-1)).exp_().view(bh * nbc, w, 3 * w)
        windows = scratch.d_windows.take(bh * nbc, 3 * w, d)
        add_windows(d_v_pad, torch.bmm(probs.transpose(1, 2), g_rows, out=windows), first, last)
        d_scores = _score_grad(probs, g_rows, tile.v_windows, delta.reshape(bh * nbc, w), scratch.d_local)
        table_grad = d_t_long[:, :, rows]
        _scatter_table_grad(table_grad.view(geo.batch, geo.heads, nbc, w, -1), tile.local_index, d_scores)
        d_q = torch.bmm(d_scores, tile.k_windows).view(bh, -1, d)
        add_windows(d_k_pad, torch.bmm(d_scores.transpose(1, 2), tile.q, out=windows), first, last)
        if tile.glob is not None:
            g_flat = g_rows.view(bh, -1, d)
            probs = tile.glob.sub_(lse.unsqueeze(-1)).exp_()
            _add_product(d_gv[:, tile.keys], probs.transpose(1, 2), g_flat)
            d_scores = _score_grad(probs, g_flat, lay.gv[:, tile.keys], delta, scratch.d_glob)
            _scatter_table_grad(table_grad, tile.glob_index, d_scores)
            d_q.baddbmm_(d_scores, lay.gk[:, tile.keys])
            _add_product(d_gk[:, tile.keys], d_scores.transpose(1, 2), tile.q_rows)
        d_lq[:, rows] += d_q

    grad_global = grad_global.reshape(bh, geo.num_global, d)
    global_delta = (grad_global * global_out).sum(-1)
    for start, stop in _global_chunks(geo):
        tile = _GlobalChunk(lay, start, stop, scratch)
        rows = tile.rows
        lse, delta, g_rows = global_lse[:, rows].unsqueeze(-1), global_delta[:, rows], grad_global[:, rows]
        parts = [(tile.g2g, tile.g2g_index, slice(None), lay.gk, lay.gv, d_gk, d_gv, scratch.d_g2g)]
        if tile.g2l is not None:
            parts.append((tile.g2l, tile.g2l_index, tile.keys, lay.lk, lay.lv, d_lk, d_lv, scratch.d_g2l))
        for scores, index, keys, k, v, d_k, d_v, buffer in parts:
            probs = scores.sub_(lse).exp_()
            _add_product(d_v[:, keys], probs.transpose(1, 2), g_rows)
            d_scores = _score_grad(probs, g_rows, v[:, keys], delta, buffer)
            _scatter_table_grad(d_t_global[:, :, rows], index, d_scores)
            _add_product(d_gq[:, rows], d_scores, k[:, keys])
            _add_product(d_k[:, keys], d_scores.transpose(1, 2), tile.q)

    d_lk += d_k_pad[:, w : w + geo.num_long]
    d_lv += d_v_pad[:, w : w + geo.num_long]
    scale = geo.scale  # score = T + scale * q.k: the q.k part carries `scale`, the table part not
    d_t_long, d_t_global = d_t_long[:, :, : geo.num_long, : geo.vocab], d_t_global[..., : geo.vocab]
    return d_gq * scale, d_gk * scale, d_gv, d_lq[:, : geo.num_long] * scale, d_lk * scale, d_lv, d_t_global, d_t_long


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gq, gk, gv, lq, lk, lv, t_global, t_long, side, geo):
        outputs = _forward(_Layout(geo, side, gq, gk, gv, lq, lk, lv, t_global, t_long))
        ctx.save_for_backward(gq, gk, gv, lq, lk, lv, t_global, t_long, *outputs)
        ctx.side, ctx.geo = side, geo
        shape = lambda n: (geo.batch, geo.heads, n, lq.shape[-1])  # noqa: E731
        return outputs[0].view(shape(geo.num_global)), outputs[2].view(shape(geo.num_long))

    @staticmethod
    def backward(ctx, grad_global, grad_long):
        gq, gk, gv, lq, lk, lv, t_global, t_long, *outputs = ctx.saved_tensors
        lay = _Layout(ctx.geo, ctx.side, gq, gk, gv, lq, lk, lv, t_global, t_long)
        grads = _backward(lay, outputs, grad_global.contiguous(), grad_long.contiguous())
        inputs = (gq, gk, gv, lq, lk, lv, t_global, t_long)
        return (*(g.reshape(x.shape) for g, x in zip(grads, inputs)), None, None)


def label_tables(q: torch.Tensor, rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, scale: float) -> torch.Tensor:
    """T[b, h, i, v] = scale * q_i . a^K[v, h] + b[v, h]: every label's score term, once per query."""
    table = torch.einsum("bhnd,vhd->bhnv", q, rel_key_table) * scale
    if rel_bias_table is not None:
        table = table + rel_bias_table.t()[None, :, None, :]
    return table


def attention(
    global_q: torch.Tensor,
    global_k: torch.Tensor,
    global_v: torch.Tensor,
    long_q: torch.Tensor,
    long_k: torch.Tensor,
    long_v: torch.Tensor,
    side: SideInputs,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    block_size: int | None = None,
    tile_elements: int = TILE_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention in blocks; returns (global_out [B,H,G,d], long_out [B,H,L,d])."""
    out_dtype = long_q.dtype
    compute = torch.promote_types(long_q.dtype, torch.float32)  # fp32 statistics; fp64 stays fp64
    states = [t.to(compute).contiguous() for t in (global_q, global_k, global_v, long_q, long_k, long_v)]
    key_table = rel_key_table.to(compute)
    bias_table = rel_bias_table.to(compute) if rel_bias_table is not None else None
    t_global = label_tables(states[0], key_table, bias_table, scale)
    t_long = label_tables(states[3], key_table, bias_table, scale)
    batch, heads, num_long, _ = long_q.shape
    geo = _geometry(batch, heads, global_q.shape[2], num_long, side.local_radius, rel_key_table.shape[0], scale, block_size, tile_elements)
    global_out, long_out = _BlockedAttention.apply(*states, t_global, t_long, side, geo)
    return global_out.to(out_dtype), long_out.to(out_dtype)
