"""Blocked global-local attention in PyTorch: linear memory, autograd, the CPU default.

On a CPU the time goes to matmuls, to the passes over the score tiles, and (for large fresh
tensors) to page faults. The layout is chosen for all three:

* Long queries are cut into blocks of w rows (default r). Block b may reach keys b*w - r ..
  b*w + w + r, a window of w + 2r keys for the 2r+1 each row sees (any w: smaller blocks
  waste fewer scores but make slower matmuls, see blocked_tiles.default_block_size). Their
  l2l labels are the [w, 2r+1] side-input rows skewed into [w, w + 2r] by pad-and-reshape
  (once per batch), never a loop over keys.
* A chunk of blocks has ONE row-major score tile [B*H, rows, K]: the band windows, then the
  global keys the chunk may see, then a sink column (blocked_tiles._Tile). The band matmul
  writes each block's [w, w + 2r] piece in place and the global matmul its columns (BLAS takes
  the row stride), so one softmax spans the whole row without moving data.
* Labels, bias and masks enter as ONE gather per tile: per query a table T = scale * q.a^K + b
  with a column V holding -inf; masked pairs point at column V. The gathered tile is the input
  of the in-place matmuls, so score = T[label] + scale * q.k costs no extra pass.
* torch's fused softmax (one pass per row while it sits in L1) replaces separate max, exp and sum
  passes; backward recomputes the tile and its softmax (as flash attention does) and gets dS from
  torch's fused softmax backward, so no statistics are kept between the passes, only the inputs.
  dT comes back by scatter-add over the same label index; autograd turns it into gradients of
  q, a^K and b.
* Long queries run in chunks of blocks, global queries in chunks of rows, sized so that one
  score tile stays within TILE_ELEMENTS: memory is linear in L and no [H, L, G] tensor exists.
  Each chunk only touches the key span its masks allow (hard l2g/g2l masks and packed
  documents shrink it a lot), and tiles live in scratch buffers reused across chunks.
* Chunks run one after another on the calling thread, each op on torch's own intra-op threads
  (blocked_modes.run_tasks): no thread of ours and no change of torch's process-wide thread count,
  and the same order on every call, so results repeat bit for bit.

Softmax and matmuls run in fp32 (fp64 stays fp64; fp16 inputs, and bf16 inputs of calls that
will run backward, are computed in fp32); bf16 inputs of calls without gradients stay bf16 where
the CPU multiplies bf16 in hardware (`compute_dtype`). Outputs take the input dtype.

fp32 calls on CPU run each chunk on the fused C++ kernel instead (blocked_fused.py, kernels/cpu/):
the plan's chunk spans and workers, with a block's scores kept in cache between its matmuls, its
label terms (computed per block from the tables) and an online softmax; 2-2.6x the PyTorch path
below, which stays for fp64, bf16 tiles and machines where the kernel cannot be built.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import torch

from graphattn.contract import SideInputs
from graphattn.kernels import blocked_fused, fused_op
from graphattn.kernels.blocked_modes import run_tasks
from graphattn.kernels.blocked_sources import source_of
from graphattn.kernels.blocked_tiles import (
    TILE_ELEMENTS,
    BlockedPlan,
    CallTensors,
    GlobalChunk,
    LongChunk,
    Scratches,
    chunk_tasks,
    geometry,
    make_plan,
    query_outputs,
)
from graphattn.kernels.request import PlanRequest, direct_request

__all__ = ["attention", "plan", "run", "label_tables", "TILE_ELEMENTS"]

NATIVE_COMPACT = True  # chunks derive their masks and labels from a CompactBatch (blocked_sources.py)
QUERY_SIDES = True  # run(..., queries="global" | "long") computes one query side (the other comes out as zeros)


def _forward(lay: CallTensors, queries: str = "both"):
    geo = lay.geo
    bh, d = geo.bh, lay.dim
    global_out, long_out = query_outputs(lay, queries)

    def long_task(first: int, last: int, scratch: Scratches) -> None:
        tile = LongChunk(lay, first, last, scratch)
        probs = tile.probs(scratch)
        out = torch.bmm(tile.band(probs), tile.v_windows).view(bh, -1, d)
        if tile.has_globals:
            out.baddbmm_(tile.second(probs), lay.gv[:, tile.keys])
        start = tile.row_slice.start
        long_out[:, start : min(tile.row_slice.stop, geo.num_long)] = out[:, : geo.num_long - start]

    def global_task(start: int, stop: int, scratch: Scratches) -> None:
        tile = GlobalChunk(lay, start, stop, scratch)
        probs = tile.probs(scratch)
        out = torch.bmm(tile.first_part(probs), lay.gv)
        if tile.has_long:
            out.baddbmm_(tile.second(probs), lay.lv[:, tile.keys])
        global_out[:, tile.rows] = out

    run_tasks(chunk_tasks(lay, queries, long_task, global_task)[0], lambda: Scratches(lay.lq))
    return global_out, long_out


def _scatter_table_grad(grad_table: torch.Tensor, index: torch.Tensor, grad_scores: torch.Tensor) -> None:
    """Accumulate score gradients [BH, rows, K] into the per-query label tables
    [B, H, rows, lanes*(V+2)] through the tile's gather index [B, rows, K] (the reverse of the
    gather)."""
    shape = [*grad_table.shape[:-1], index.shape[-1]]
    grad_table.scatter_add_(-1, index.unsqueeze(1).expand(shape), grad_scores.view(shape))


def _add_product(dest: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """dest += alpha * a @ b, dest a row range of a [BH, n, d] gradient: baddbmm_ runs one gemm
    per head into it (measured faster than bmm + add on torch 2.13, whose per-matrix path costs
    little for BH large matrices)."""
    dest.baddbmm_(a, b, alpha=alpha)


class _KeyGrads:
    """One worker's gradients of keys and values, which several chunks touch. Long keys are
    offset by r rows and padded past the last block, where the windows' edges land."""

    def __init__(self, lay: CallTensors):
        geo = lay.geo
        self.geo = geo
        self.scratch = Scratches(lay.lq)
        self.d_gk, self.d_gv = torch.zeros_like(lay.gk), torch.zeros_like(lay.gv)
        rows = (geo.num_blocks + geo.window_pieces) * geo.block
        self.d_lk, self.d_lv = (lay.lk.new_zeros(geo.bh, rows, lay.dim) for _ in range(2))

    def add_windows(self, d_pad: torch.Tensor, windows: torch.Tensor, first: int, last: int) -> None:
        """Add window gradients [BH*nbc, w + 2r, d] at their keys, a piece of w rows at a time:
        piece p of block b lands on padded rows (b + p)*w .., disjoint across the blocks."""
        geo = self.geo
        bh, _, d = d_pad.shape
        w, nbc, window = geo.block, last - first, geo.window
        parts = windows.view(bh, nbc, window, d)
        for piece in range(geo.window_pieces):
            size = min(w, window - piece * w)
            dest = d_pad[:, (first + piece) * w : (last + piece) * w].view(bh, nbc, w, d)
            dest[:, :, :size].add_(parts[:, :, piece * w : piece * w + size])

    def long_keys(self, name: str) -> torch.Tensor:
        """The [BH, L, d] rows of a padded long-key gradient."""
        return getattr(self, name)[:, self.geo.radius : self.geo.radius + self.geo.num_long]


def _backward(lay: CallTensors, grad_global, grad_long, queries: str = "both"):
    geo = lay.geo
    bh, d, r = geo.bh, lay.dim, geo.radius
    scale = geo.scale  # score = T + scale * q.k: gradients of q and k carry it, the tables' not
    grad_long = grad_long.reshape(bh, geo.num_long, d)
    grad_global = grad_global.reshape(bh, geo.num_global, d)
    # Rows of these belong to one chunk each, so workers can share them.
    d_lq, d_gq = lay.lq.new_zeros(bh, geo.padded_long, d), torch.zeros_like(lay.gq)
    d_t_long, d_t_global = torch.zeros_like(lay.t_long), torch.zeros_like(lay.t_global)

    def long_task(first: int, last: int, acc: _KeyGrads) -> None:
        scratch = acc.scratch
        tile = LongChunk(lay, first, last, scratch)
        probs = tile.probs(scratch)
        g_blocks = lay.rows(grad_long, first, last)  # [BH*nbc, w, d]
        g_rows = g_blocks.view(bh, -1, d)
        d_probs = tile.d_probs(scratch)
        tile.band(d_probs).baddbmm_(g_blocks, tile.v_windows.transpose(1, 2), beta=0)
        windows = scratch.d_windows.take(*tile.v_windows.shape)
        acc.add_windows(acc.d_lv, torch.bmm(tile.band(probs).transpose(1, 2), g_blocks, out=windows), first, last)
        if tile.has_globals:
            keys = tile.keys
            tile.second(d_probs).baddbmm_(g_rows, lay.gv[:, keys].transpose(1, 2), beta=0)
            _add_product(acc.d_gv[:, keys], tile.second(probs).transpose(1, 2), g_rows)
        d_scores = tile.score_grad(d_probs, probs)
        _scatter_table_grad(d_t_long[:, :, tile.row_slice], tile.index, d_scores)
        d_q = tile.q.new_empty(tile.q.shape).baddbmm_(tile.band(d_scores), tile.k_windows, beta=0, alpha=scale)
        d_q = d_q.view(bh, -1, d)
        windows.baddbmm_(tile.band(d_scores).transpose(1, 2), tile.q, beta=0, alpha=scale)
        acc.add_windows(acc.d_lk, windows, first, last)
        if tile.has_globals:
            d_q.baddbmm_(tile.second(d_scores), lay.gk[:, keys], alpha=scale)
            _add_product(acc.d_gk[:, keys], tile.second(d_scores).transpose(1, 2), tile.q_rows, scale)
        d_lq[:, tile.row_slice] += d_q

    def global_task(start: int, stop: int, acc: _KeyGrads) -> None:
        scratch = acc.scratch
        tile = GlobalChunk(lay, start, stop, scratch)
        probs = tile.probs(scratch)
        g_rows = grad_global[:, tile.rows]
        d_probs = tile.d_probs(scratch)
        parts = [(tile.first_part, lay.gk, lay.gv, acc.d_gk, acc.d_gv)]
        if tile.has_long:
            keys, padded = tile.keys, slice(tile.keys.start + r, tile.keys.stop + r)
            parts.append((tile.second, lay.lk[:, keys], lay.lv[:, keys], acc.d_lk[:, padded], acc.d_lv[:, padded]))
        for part, _, v, _, d_v in parts:
            part(d_probs).baddbmm_(g_rows, v.transpose(1, 2), beta=0)
            _add_product(d_v, part(probs).transpose(1, 2), g_rows)
        d_scores = tile.score_grad(d_probs, probs)
        _scatter_table_grad(d_t_global[:, :, tile.rows], tile.index, d_scores)
        for part, k, _, d_k, _ in parts:
            _add_product(d_gq[:, tile.rows], part(d_scores), k, scale)
            _add_product(d_k, part(d_scores).transpose(1, 2), tile.q, scale)

    acc = run_tasks(chunk_tasks(lay, queries, long_task, global_task)[0], lambda: _KeyGrads(lay))
    d_gk, d_gv, d_lk, d_lv = acc.d_gk, acc.d_gv, acc.long_keys("d_lk"), acc.long_keys("d_lv")
    d_t_long, d_t_global = geo.fold_lanes(d_t_long[:, :, : geo.num_long]), geo.fold_lanes(d_t_global)
    return d_gq, d_gk, d_gv, d_lq[:, : geo.num_long], d_lk, d_lv, d_t_global, d_t_long


class _BlockedAttention(torch.autograd.Function):
    """Outputs only are computed forward; backward rebuilds each tile and its softmax (as flash
    attention does), so nothing but the inputs is kept between the passes."""

    @staticmethod
    def forward(ctx, gq, gk, gv, lq, lk, lv, t_global, t_long, plan, geo, queries):
        lay = CallTensors(geo, plan, gq, gk, gv, lq, lk, lv, t_global, t_long)
        global_out, long_out = _forward(lay, queries)
        ctx.save_for_backward(gq, gk, gv, lq, lk, lv, t_global, t_long)
        ctx.plan, ctx.geo, ctx.queries = plan, geo, queries
        shape = lambda n: (geo.batch, geo.heads, n, lq.shape[-1])  # noqa: E731
        return global_out.view(shape(geo.num_global)), long_out.view(shape(geo.num_long))

    @staticmethod
    def backward(ctx, grad_global, grad_long):
        inputs = ctx.saved_tensors
        lay = CallTensors(ctx.geo, ctx.plan, *inputs)
        grad_global, grad_long = grad_global.contiguous(), grad_long.contiguous()
        grads = _backward(lay, grad_global, grad_long, ctx.queries)
        return (*(g.reshape(x.shape) for g, x in zip(grads, inputs)), None, None, None)


def compute_dtype(dtype: torch.dtype, device: torch.device, backward: bool) -> torch.dtype:
    """The dtype of the tiles and matmuls: fp32 (fp64 stays fp64), except bf16 inputs of a call
    without gradients on a CPU that multiplies bf16 in hardware (AVX512-BF16, AMX). There scores
    and probabilities are rounded to bf16, as Hugging Face's eager attention does in bf16, and
    softmax sums in fp32: 1.46x faster at L = 4096, within 1% of the fp64 result (issue 29).
    Calls that will run backward keep fp32, so that the backward's recomputed tiles are the
    forward's."""
    if dtype == torch.bfloat16 and not backward and _native_bf16(device):
        return dtype
    return torch.promote_types(dtype, torch.float32)


@cache
def _native_bf16(device: torch.device) -> bool:
    cpu = getattr(torch, "cpu", None)
    names = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return device.type == "cpu" and any(getattr(cpu, name, lambda: False)() for name in names)


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

    Options: `block_size` (default r, see blocked_tiles.default_block_size) and `tile_elements`
    (the one tile bound, TILE_ELEMENTS by default: a PyTorch-path chunk's score tile over all heads;
    a fused plan's chunks hold no such tile, so there it caps only what a user gives, each
    worker's share bounding a chunk's extent per head, blocked_fused.chunking) size the chunks;
    `index_cache_bytes` bounds the PyTorch path's chunk label indices the plan keeps for later
    layers and backward passes (IndexCache; default 1 KiB per token, 0: none; a fused plan keeps
    all of its labels, made when it is planned, blocked_fused.prepare); `workers` is the fused
    kernel's worker count (default None and "auto": torch.get_num_threads() on CPU), each worker
    with a fixed deal of the chunks, so results repeat bit for bit; the PyTorch path runs its
    chunks on the calling thread, each op on torch's intra-op threads. `fused` (default None:
    wherever it can) runs fp32 CPU calls on the fused C kernel (blocked_fused.py); True requires
    it (an error names why it cannot run), False keeps the eager PyTorch path. Fused plans size
    their chunks for the kernel, and keep the PyTorch path's sizes for calls that take that
    path; their calls are one operator each way (fused_op.py), so torch.compile(fullgraph=True)
    traces through `run` when the plan is made outside the compiled function."""
    options = dict(request.options)
    workers = options.pop("workers", None)
    if workers == "auto":
        workers = None if request.device.type == "cpu" else 1
    elif workers is None:
        workers = torch.get_num_threads() if request.device.type == "cpu" else 1
    elif not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise TypeError(f"blocked-backend option workers must be a positive int or 'auto', got {workers!r}")
    fused = options.pop("fused", None)
    if fused not in (None, True, False):
        raise TypeError(f"blocked-backend option fused must be True, False or None, got {fused!r}")
    block_size = options.pop("block_size", None)
    tile_elements = options.pop("tile_elements", None)
    cache_bytes = options.pop("index_cache_bytes", None)
    if cache_bytes is not None and (type(cache_bytes) is not int or cache_bytes < 0):
        raise TypeError(f"blocked-backend option index_cache_bytes must be a non-negative int, got {cache_bytes!r}")
    if options:
        raise TypeError(f"unknown blocked-backend options: {', '.join(sorted(options))}")
    sharing = workers if workers is not None else torch.get_num_threads()

    per_worker = None if tile_elements is None else max(1, tile_elements // max(sharing, 1))

    s = request.shape
    source = source_of(request.compact if request.side is None else request.side)
    eager = geometry(
        s.batch,
        request.num_heads,
        s.num_global,
        s.num_long,
        s.local_radius,
        request.vocab_size,
        1.0,
        block_size,
        TILE_ELEMENTS if tile_elements is None else tile_elements,
        s.num_global_keys,
    )
    if fused is False or not blocked_fused.likely(request.device, request.dtype):
        return replace(make_plan(eager, source, workers, cache_bytes), fused=fused)
    # Chunked for the kernel; a call that takes the PyTorch path (fp64, bf16 tiles, whose tiles
    # hold all heads) gets the eager geometry's chunks.
    geo = blocked_fused.chunking(eager, per_worker, sharing, source)
    fused_plan = make_plan(geo, source, workers, cache_bytes)
    # Chunks and labels made now, outside any compiled region: a call passes them as tensors.
    chunks = blocked_fused.prepare(fused_plan, sharing)
    return replace(fused_plan, fused=fused, eager_geometry=eager, fused_chunks=chunks)


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
    tables = (rel_key_table, rel_bias_table, *(global_tables or ()))
    backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*states, *tables))
    compute = compute_dtype(long_q.dtype, long_q.device, backward)
    states = [t.to(compute).contiguous() for t in states]

    def side_table(side: str, q: torch.Tensor, key_table: torch.Tensor, bias_table: torch.Tensor | None):
        if queries not in ("both", side):  # this side's rows are not computed: no table either
            return q.new_zeros(()).expand(*q.shape[:3], key_table.shape[0])
        return label_tables(q, key_table.to(compute), bias_table.to(compute) if bias_table is not None else None, scale)

    fused = plan.fused is not False and blocked_fused.usable(long_q.device, compute)
    if plan.fused and not fused:
        why = blocked_fused.why_not(long_q.device, compute)
        raise RuntimeError(f"the blocked backend's fused CPU kernel was asked for, but {why}")
    if fused:  # the kernel makes each block's label terms from the tables itself
        tables = [None if t is None else t.to(compute).contiguous() for t in tables]
        if global_tables is None:
            tables += tables[:2]
        geo, chunks = plan.geo, plan.fused_chunks[queries]
        workers = plan.workers or 0  # 0: torch.get_num_threads() at the call
        global_out, long_out = fused_op.attention(
            states, tables, chunks.table, chunks.labels, geo.heads, scale, workers
        )
        return global_out.to(out_dtype), long_out.to(out_dtype)
    t_global = side_table("global", states[0], *(global_tables or (rel_key_table, rel_bias_table)))
    t_long = side_table("long", states[3], rel_key_table, rel_bias_table)
    plan = plan.for_pytorch_path()
    geo = replace(plan.geo, scale=scale, lanes=plan.geo.lanes if backward else 1)  # lanes serve the backward
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
    tile_elements: int | None = None,
    workers: int | str | None = None,
    index_cache_bytes: int | None = None,
    fused: bool | None = None,
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
        index_cache_bytes=index_cache_bytes,
        fused=fused,
    )
    states = (global_q, global_k, global_v, long_q, long_k, long_v)
    return run(plan(request), states, rel_key_table, rel_bias_table, scale)
