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
* Chunks are independent: they run in torch.get_num_threads() Python threads with one intra-op
  thread each (see blocked_tiles.run_tasks), which keeps a busy machine from stalling every op.
* A custom autograd Function keeps outputs and per-row log-sum-exp and recomputes tiles in
  backward, as flash attention does; dT comes back by scatter-add over the same label index and
  autograd turns it into gradients of q, a^K and b.

Statistics and matmuls run in fp32 (fp64 stays fp64); outputs take the input dtype.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from graphattn.contract import SideInputs
from graphattn.kernels.blocked_sources import source_of
from graphattn.kernels.blocked_tiles import (
    TILE_ELEMENTS,
    BlockedPlan,
    CallTensors,
    GlobalChunk,
    LongChunk,
    Scratch,
    Scratches,
    geometry,
    global_chunks,
    long_chunks,
    make_plan,
    pad_dim,
    run_tasks,
)
from graphattn.kernels.request import PlanRequest, direct_request

__all__ = ["attention", "plan", "run", "label_tables", "TILE_ELEMENTS"]

NATIVE_COMPACT = True  # chunks derive their masks and labels from a CompactBatch (blocked_sources.py)
QUERY_SIDES = True  # run(..., queries="global" | "long") computes one query side (the other comes out as zeros)

# Rows with nothing to attend to have a -inf maximum: it is replaced by 0 (so exp(-inf - 0) = 0,
# never NaN), their zero sum by a tiny floor (so out = 0 / floor = 0 and log-sum ~ -69, which
# backward's exp(-inf - 0 + 69) again turns into 0). Any row with an allowed key keeps its true
# maximum, however negative (scores below -1e30 from huge |q|, |k| or a bias of finfo.min), and a
# sum >= 1: its softmax is the dense oracle's. The statistics are kept as (max, log sum) rather
# than their sum, the log-sum-exp, which cannot hold log(sum) next to a max of -3e38: backward
# recomputes p = exp(s - max - log sum) in that order.
_FLOOR_SUM = 1e-30


def _row_max(*maxima: torch.Tensor) -> torch.Tensor:
    """Row maximum over several tiles; 0 for fully masked rows (whose maxima are -inf)."""
    row_max = maxima[0]
    for other in maxima[1:]:
        row_max = torch.maximum(row_max, other)
    return row_max.masked_fill_(row_max == float("-inf"), 0.0)


def _finish(
    out: torch.Tensor, row_sum: torch.Tensor, row_max: torch.Tensor, stats: torch.Tensor, rows: slice
) -> torch.Tensor:
    """Normalize `out` in place (empty rows stay 0) and write (max, log sum) into stats[:, :, rows]."""
    row_sum.clamp_min_(_FLOOR_SUM)
    stats[0, :, rows], stats[1, :, rows] = row_max, row_sum.log()
    return out.div_(row_sum.unsqueeze(-1))


def _probs(scores: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """p = exp(s - max - log sum) in place, with stats [2, BH, rows]: the forward's softmax."""
    return scores.sub_(stats[0].unsqueeze(-1)).sub_(stats[1].unsqueeze(-1)).exp_()


def _chunk_tasks(geo, queries: str, long_task, global_task) -> list:
    """The chunks of the query sides asked for ("both", "global" or "long")."""
    tasks = [partial(long_task, *c) for c in long_chunks(geo)] if queries != "global" else []
    return tasks + ([partial(global_task, *c) for c in global_chunks(geo)] if queries != "long" else [])


def _forward(lay: CallTensors, workers: int, queries: str = "both"):
    geo = lay.geo
    bh, d = geo.bh, lay.dim
    new_long, new_global = (
        x.new_zeros if queries == side else x.new_empty for x, side in ((lay.lq, "global"), (lay.gq, "long"))
    )
    long_out, long_stats = new_long(bh, geo.num_long, d), new_long(2, bh, geo.padded_long)
    global_out, global_stats = new_global(bh, geo.num_global, d), new_global(2, bh, geo.num_global)

    def long_task(first: int, last: int, scratch: Scratches) -> None:
        tile = LongChunk(lay, first, last, scratch)
        rows = tile.row_slice.stop - tile.row_slice.start
        maxima = [tile.local.amax(-1).view(bh, rows)] + ([tile.glob.amax(-1)] if tile.glob is not None else [])
        row_max = _row_max(*maxima)
        tile.local.view(bh, rows, -1).sub_(row_max.unsqueeze(-1)).exp_()
        row_sum = tile.local.sum(-1).view(bh, rows)
        out = torch.bmm(tile.local, tile.v_windows).view(bh, rows, d)
        if tile.glob is not None:
            row_sum += tile.glob.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
            out.baddbmm_(tile.glob, lay.gv[:, tile.keys])
        out = _finish(out, row_sum, row_max, long_stats, tile.row_slice)
        long_out[:, tile.row_slice] = out[:, : geo.num_long - tile.row_slice.start]

    def global_task(start: int, stop: int, scratch: Scratches) -> None:
        tile = GlobalChunk(lay, start, stop, scratch)
        maxima = [tile.g2g.amax(-1)] + ([tile.g2l.amax(-1)] if tile.g2l is not None else [])
        row_max = _row_max(*maxima)
        row_sum = tile.g2g.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
        out = torch.bmm(tile.g2g, lay.gv)
        if tile.g2l is not None:
            row_sum += tile.g2l.sub_(row_max.unsqueeze(-1)).exp_().sum(-1)
            out.baddbmm_(tile.g2l, lay.lv[:, tile.keys])
        global_out[:, tile.rows] = _finish(out, row_sum, row_max, global_stats, tile.rows)

    run_tasks(_chunk_tasks(geo, queries, long_task, global_task), lambda: Scratches(lay.lq), workers)
    return global_out, global_stats, long_out, long_stats


def _score_grad(
    probs: torch.Tensor, grad_out: torch.Tensor, values: torch.Tensor, delta: torch.Tensor, scratch: Scratch
) -> torch.Tensor:
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


class _KeyGrads:
    """One worker's gradients of keys and values, which several chunks touch. Long keys are
    padded by one block on each side, where window gradients of blocks -1 and nb land."""

    def __init__(self, lay: CallTensors):
        geo = lay.geo
        self.scratch = Scratches(lay.lq)
        self.d_gk, self.d_gv = torch.zeros_like(lay.gk), torch.zeros_like(lay.gv)
        self.d_lk, self.d_lv = (lay.lk.new_zeros(geo.bh, geo.padded_long + 2 * geo.block, lay.dim) for _ in range(2))

    def add_windows(self, d_pad: torch.Tensor, windows: torch.Tensor, first: int, last: int) -> None:
        bh, _, d = d_pad.shape
        w, nbc = windows.shape[1] // 3, last - first
        parts = windows.view(bh, nbc, 3, w, d)
        for shift in range(3):
            d_pad[:, (first + shift) * w : (last + shift) * w].view(bh, nbc, w, d).add_(parts[:, :, shift])


def _backward(lay: CallTensors, outputs, grad_global, grad_long, workers: int, queries: str = "both"):
    geo = lay.geo
    bh, d, w = geo.bh, lay.dim, geo.block
    global_out, global_stats, long_out, long_stats = outputs
    grad_long = grad_long.reshape(bh, geo.num_long, d)
    long_delta = pad_dim((grad_long * long_out).sum(-1), geo.padded_long, -1)
    grad_global = grad_global.reshape(bh, geo.num_global, d)
    global_delta = (grad_global * global_out).sum(-1)
    # Rows of these belong to one chunk each, so workers can share them.
    d_lq, d_gq = lay.lq.new_zeros(bh, geo.padded_long, d), torch.zeros_like(lay.gq)
    d_t_long, d_t_global = torch.zeros_like(lay.t_long), torch.zeros_like(lay.t_global)

    def long_task(first: int, last: int, acc: _KeyGrads) -> None:
        tile = LongChunk(lay, first, last, acc.scratch)
        rows, nbc = tile.row_slice, tile.nbc
        stats, delta = long_stats[:, :, rows], long_delta[:, rows]
        g_rows = lay.rows(grad_long, first, last)  # [BH*nbc, w, d]
        probs = _probs(tile.local.view(bh, -1, 3 * w), stats).view(bh * nbc, w, 3 * w)
        windows = acc.scratch.d_windows.take(bh * nbc, 3 * w, d)
        acc.add_windows(acc.d_lv, torch.bmm(probs.transpose(1, 2), g_rows, out=windows), first, last)
        d_scores = _score_grad(probs, g_rows, tile.v_windows, delta.reshape(bh * nbc, w), acc.scratch.d_local)
        table_grad = d_t_long[:, :, rows]
        _scatter_table_grad(table_grad.view(geo.batch, geo.heads, nbc, w, -1), tile.local_index, d_scores)
        d_q = torch.bmm(d_scores, tile.k_windows).view(bh, -1, d)
        acc.add_windows(acc.d_lk, torch.bmm(d_scores.transpose(1, 2), tile.q, out=windows), first, last)
        if tile.glob is not None:
            g_flat = g_rows.view(bh, -1, d)
            probs = _probs(tile.glob, stats)
            _add_product(acc.d_gv[:, tile.keys], probs.transpose(1, 2), g_flat)
            d_scores = _score_grad(probs, g_flat, lay.gv[:, tile.keys], delta, acc.scratch.d_glob)
            _scatter_table_grad(table_grad, tile.glob_index, d_scores)
            d_q.baddbmm_(d_scores, lay.gk[:, tile.keys])
            _add_product(acc.d_gk[:, tile.keys], d_scores.transpose(1, 2), tile.q_rows)
        d_lq[:, rows] += d_q

    def global_task(start: int, stop: int, acc: _KeyGrads) -> None:
        tile = GlobalChunk(lay, start, stop, acc.scratch)
        rows = tile.rows
        stats, delta, g_rows = global_stats[:, :, rows], global_delta[:, rows], grad_global[:, rows]
        parts = [(tile.g2g, tile.g2g_index, lay.gk, lay.gv, acc.d_gk, acc.d_gv, acc.scratch.d_g2g)]
        if tile.g2l is not None:
            keys, padded = tile.keys, slice(tile.keys.start + w, tile.keys.stop + w)
            parts.append(
                (
                    tile.g2l,
                    tile.g2l_index,
                    lay.lk[:, keys],
                    lay.lv[:, keys],
                    acc.d_lk[:, padded],
                    acc.d_lv[:, padded],
                    acc.scratch.d_g2l,
                )
            )
        for scores, index, k, v, d_k, d_v, buffer in parts:
            probs = _probs(scores, stats)
            _add_product(d_v, probs.transpose(1, 2), g_rows)
            d_scores = _score_grad(probs, g_rows, v, delta, buffer)
            _scatter_table_grad(d_t_global[:, :, rows], index, d_scores)
            _add_product(d_gq[:, rows], d_scores, k)
            _add_product(d_k, d_scores.transpose(1, 2), tile.q)

    accs = run_tasks(_chunk_tasks(geo, queries, long_task, global_task), lambda: _KeyGrads(lay), workers)

    def total(name: str) -> torch.Tensor:
        """One gradient summed over the workers' private accumulators."""
        return sum((getattr(acc, name) for acc in accs[1:]), getattr(accs[0], name))

    d_gk, d_gv = total("d_gk"), total("d_gv")
    d_lk, d_lv = (total(name)[:, w : w + geo.num_long] for name in ("d_lk", "d_lv"))
    scale = geo.scale  # score = T + scale * q.k: the q.k part carries `scale`, the table part not
    d_t_long, d_t_global = d_t_long[:, :, : geo.num_long, : geo.vocab], d_t_global[..., : geo.vocab]
    return d_gq * scale, d_gk * scale, d_gv, d_lq[:, : geo.num_long] * scale, d_lk * scale, d_lv, d_t_global, d_t_long


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gq, gk, gv, lq, lk, lv, t_global, t_long, plan, geo, queries):
        outputs = _forward(CallTensors(geo, plan, gq, gk, gv, lq, lk, lv, t_global, t_long), plan.workers, queries)
        ctx.save_for_backward(gq, gk, gv, lq, lk, lv, t_global, t_long, *outputs)
        ctx.plan, ctx.geo, ctx.queries = plan, geo, queries
        shape = lambda n: (geo.batch, geo.heads, n, lq.shape[-1])  # noqa: E731
        return outputs[0].view(shape(geo.num_global)), outputs[2].view(shape(geo.num_long))

    @staticmethod
    def backward(ctx, grad_global, grad_long):
        gq, gk, gv, lq, lk, lv, t_global, t_long, *outputs = ctx.saved_tensors
        lay = CallTensors(ctx.geo, ctx.plan, gq, gk, gv, lq, lk, lv, t_global, t_long)
        grads = _backward(lay, outputs, grad_global.contiguous(), grad_long.contiguous(), ctx.plan.workers, ctx.queries)
        inputs = (gq, gk, gv, lq, lk, lv, t_global, t_long)
        return (*(g.reshape(x.shape) for g, x in zip(grads, inputs)), None, None, None)


def label_tables(
    q: torch.Tensor, rel_key_table: torch.Tensor, rel_bias_table: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """T[b, h, i, v] = scale * q_i . a^K[v, h] + b[v, h]: every label's score term, once per query."""
    table = torch.einsum("bhnd,vhd->bhnv", q, rel_key_table) * scale
    if rel_bias_table is not None:
        table = table + rel_bias_table.t()[None, :, None, :]
    return table


def plan(request: PlanRequest) -> BlockedPlan:
    """Chunk geometry, skewed l2l labels and key spans of a batch, for every layer.

    Options: `block_size` (>= r, default r) and `tile_elements` (shared by the workers) size the
    tiles; `workers` Python threads, one intra-op thread each, run the chunks (default:
    torch.get_num_threads() on CPU, 1 elsewhere); workers=1 uses torch's intra-op threads
    instead, which is 10-40% faster on an otherwise idle machine and many times slower on a
    busy one (see blocked_tiles.run_tasks)."""
    options = dict(request.options)
    workers = options.pop("workers", None)
    block_size = options.pop("block_size", None)
    tile_elements = options.pop("tile_elements", TILE_ELEMENTS)
    if options:
        raise TypeError(f"unknown blocked-backend options: {', '.join(sorted(options))}")
    if workers is None:
        workers = torch.get_num_threads() if request.device.type == "cpu" else 1
    tile_elements = max(1, tile_elements // max(workers, 1))  # same scratch memory in total
    s = request.shape
    source = source_of(request.compact if request.side is None else request.side)
    geo = geometry(
        s.batch,
        request.num_heads,
        s.num_global,
        s.num_long,
        s.local_radius,
        request.vocab_size,
        1.0,
        block_size,
        tile_elements,
        s.num_global_keys,
    )
    return make_plan(geo, source, workers)


def run(
    plan: BlockedPlan,
    states,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    global_tables: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    queries: str = "both",
):
    """One layer's attention over a planned batch: (global_out [B,H,G,d], long_out [B,H,L,d]).
    `global_tables` = (a^K, b) of the global queries when they have their own; `queries`
    "global" or "long" computes that side only (the other output is zeros)."""
    _global_q, long_q = states[0], states[3]
    out_dtype = long_q.dtype
    compute = torch.promote_types(long_q.dtype, torch.float32)  # fp32 statistics; fp64 stays fp64
    states = [t.to(compute).contiguous() for t in states]

    def side_table(side: str, q: torch.Tensor, key_table: torch.Tensor, bias_table: torch.Tensor | None):
        if queries not in ("both", side):  # this side's rows are not computed: no table either
            return q.new_zeros(()).expand(*q.shape[:3], key_table.shape[0])
        return label_tables(q, key_table.to(compute), bias_table.to(compute) if bias_table is not None else None, scale)

    t_global = side_table("global", states[0], *(global_tables or (rel_key_table, rel_bias_table)))
    t_long = side_table("long", states[3], rel_key_table, rel_bias_table)
    geo = replace(plan.geo, scale=scale)
    global_out, long_out = _BlockedAttention.apply(*states, t_global, t_long, plan, geo, queries)
    return global_out.to(out_dtype), long_out.to(out_dtype)


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
    workers: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention in blocks, planned and run in one call (see `plan` for the options);
    returns (global_out [B,H,G,d], long_out [B,H,L,d])."""
    request = direct_request(
        side,
        global_q,
        global_k,
        long_q,
        rel_key_table,
        block_size=block_size,
        tile_elements=tile_elements,
        workers=workers,
    )
    states = (global_q, global_k, global_v, long_q, long_k, long_v)
    return run(plan(request), states, rel_key_table, rel_bias_table, scale)
