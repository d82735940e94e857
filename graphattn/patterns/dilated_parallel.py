"""Sequence-parallel LongNet dilated attention over torch.distributed (LongNet section 3.4).

Rank p of a group of P holds the contiguous chunk [p*n, (p+1)*n) of one long sequence (n tokens
per rank, the same n on every rank). For each (w, r) pair:

* if every segment lies inside one rank (n is a multiple of the clamped w), the pair runs
  locally, exactly as on one process;
* otherwise (w > n, the paper's case, or segments straddling rank boundaries) each rank
  sparsifies its OWN keys and values with the pair's per-head offsets, the ranks all-gather these
  sparse rows (w/r per segment and head, not n: the communication does not grow with the
  sequence), and each rank attends with its local sparse queries over the gathered rows of the
  segments it overlaps. The all-gather is an autograd Function whose backward is the matching
  reduce-scatter: every rank's gradient for the gathered rows is summed and each owner receives
  the part for the rows it sent.

Outputs of the pairs are mixed by their softmax denominators as in patterns/dilated.py, so the
result on P ranks equals `dilated_attention` on the concatenated sequence (tests check forward
and backward on 2 gloo processes). Works with any backend that has all-gather and
reduce-scatter (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from graphattn.errors import BatchError
from graphattn.patterns.dilated import (
    LONGNET_SCHEDULE,
    SparseLayout,
    attend_segments,
    check_schedule,
    check_states,
    full_layout,
    gather_rows,
    mix_by_denominators,
    scatter_rows,
    sparse_layout,
)

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class AllGatherRows(torch.autograd.Function):
    """[...] on each rank -> [P, ...] on every rank; backward: reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        x = x.contiguous()
        out = x.new_empty((world, *x.shape))
        _all_gather(out.view(-1), x.view(-1), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        mine = grad.new_empty(grad.shape[1:])
        _reduce_scatter(mine.view(-1), grad.view(-1), group=ctx.group)
        return mine, None


def all_gather_rows(x: torch.Tensor, group=None) -> torch.Tensor:
    """Autograd-aware all-gather along a new leading rank dim."""
    return AllGatherRows.apply(x, group)


def _local_pair(q, k, v, segment, dilation, start, valid_length, causal, scale, tile_elements):
    """Segments that lie inside this rank: no communication."""
    heads, length = q.shape[1], q.shape[2]
    layout = sparse_layout(segment, dilation, heads, start // segment, length // segment, valid_length, q.device)
    local = layout.positions - start
    local = torch.where(layout.valid, local, torch.zeros_like(local))
    qs, ks, vs = (gather_rows(x, local) for x in (q, k, v))
    out, lse = attend_segments(qs, ks, vs, layout.valid[None], causal, scale, tile_elements)
    return scatter_rows(out, lse, local, layout.valid, length)


def _rank_order(layout: SparseLayout, owner: torch.Tensor, world: int):
    """For every valid sparse row: its slot in its owner's send buffer; and the buffer size C.

    Each rank sends its rows in the flat (head, segment, row) order of the global layout, padded
    to the largest rank's count so that all-gather sees equal sizes on every rank.
    """
    flat_valid, flat_owner = layout.valid.reshape(-1), owner.reshape(-1)
    slot = torch.zeros_like(flat_owner)
    counts = []
    for rank in range(world):
        mine = flat_valid & (flat_owner == rank)
        slot = torch.where(mine, torch.cumsum(mine.long(), 0) - 1, slot)
        counts.append(int(mine.sum()))
    return slot.view(layout.positions.shape), max(max(counts), 1)


def _gathered_pair(q, k, v, segment, dilation, rank, world, valid_length, causal, scale, tile_elements, group):
    """Segments crossing rank boundaries: all-gather the sparse keys/values, attend locally."""
    heads, length = q.shape[1], q.shape[2]
    start = rank * length
    layout = full_layout(world * length, segment, dilation, heads, q.device)
    valid = layout.valid & (layout.positions < valid_length)
    owner = layout.positions // length
    layout = SparseLayout(layout.positions, valid, layout.segment, dilation)
    slot, capacity = _rank_order(layout, owner, world)

    # Send buffer: this rank's sparse key/value rows in global flat order, padded to `capacity`.
    heads_index = torch.arange(heads, device=q.device)[:, None, None].expand_as(layout.positions)
    mine = valid & (owner == rank)
    send_rows = torch.zeros(capacity, dtype=torch.long, device=q.device)
    send_rows[slot[mine]] = heads_index[mine] * length + (layout.positions[mine] - start)
    batch, dim = q.shape[0], q.shape[-1]
    kv = torch.stack((k, v)).reshape(2, batch, heads * length, dim).index_select(2, send_rows)
    gathered = all_gather_rows(kv, group)  # [P, 2, B, C, d]
    gathered = gathered.permute(1, 2, 0, 3, 4).reshape(2, batch, world * capacity, dim)

    # Only the segments that overlap this rank's chunk have local queries.
    first, last = start // layout.segment, (start + length - 1) // layout.segment
    part = slice(first, last + 1)
    positions, valid_part = layout.positions[:, part], valid[:, part]
    receive = torch.where(valid_part, owner[:, part] * capacity + slot[:, part], torch.zeros_like(slot[:, part]))
    ks, vs = gathered.index_select(2, receive.reshape(-1)).view(2, batch, heads, *positions.shape[1:], dim)

    local_query = valid_part & (owner[:, part] == rank)
    local = torch.where(local_query, positions - start, torch.zeros_like(positions))
    qs = gather_rows(q, local)
    out, lse = attend_segments(qs, ks, vs, valid_part[None], causal, scale, tile_elements)
    return scatter_rows(out, lse, local, local_query, length)


def dilated_attention_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pairs: Sequence[Sequence[int]] = LONGNET_SCHEDULE,
    *,
    causal: bool = False,
    scale: float | None = None,
    valid_length: int | None = None,
    group=None,
    tile_elements: int | None = None,
) -> torch.Tensor:
    """This rank's output [B, H, n, d] of dilated attention over the sequence split across ranks.

    q, k, v: this rank's chunk [B, H, n, d]; rank p holds positions [p*n, (p+1)*n).
    valid_length: true length of the whole sequence when the last chunks are padding (keys at or
    past it are never attended to); defaults to P*n.
    """
    check_states(q, k, v)
    pairs = check_schedule(pairs)
    if not dist.is_available() or not dist.is_initialized():
        raise BatchError(
            "torch.distributed is not initialized; call init_process_group first (or use dilated_attention)",
            path=("group",),
        )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    batch, heads, length, dim = q.shape
    total = world * length
    valid_length = total if valid_length is None else int(valid_length)
    if not 0 < valid_length <= total:
        raise BatchError(
            f"valid_length {valid_length} must be in 1..{total} (ranks x tokens per rank)", path=("valid_length",)
        )
    scale = dim**-0.5 if scale is None else scale
    outs, lses = [], []
    for segment, dilation in pairs:
        segment = min(segment, total)
        if length % segment == 0:
            out, lse = _local_pair(
                q, k, v, segment, dilation, rank * length, valid_length, causal, scale, tile_elements
            )
        else:
            out, lse = _gathered_pair(
                q, k, v, segment, dilation, rank, world, valid_length, causal, scale, tile_elements, group
            )
        outs.append(out)
        lses.append(lse)
    return mix_by_denominators(outs, lses).to(q.dtype)


def split_sequence(x: torch.Tensor, world: int, rank: int, dim: int = 2) -> torch.Tensor:
    """This rank's chunk of a sequence padded (with zeros) to a multiple of `world`."""
    length = x.shape[dim]
    per_rank = math.ceil(length / world)
    pad = per_rank * world - length
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat((x, x.new_zeros(shape)), dim=dim)
    return x.narrow(dim, rank * per_rank, per_rank)
