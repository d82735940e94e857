"""LongNet dilated attention (Ding et al. 2023, arXiv 2307.02486; docs/DESIGN.md §8).

One (w, r) pair: cut the sequence into segments of w tokens, keep every r-th row of each segment
starting at the head's offset s_j = j mod r, run dense attention inside every sparse segment and
scatter the outputs back; rows a pair does not select get nothing from it. A schedule mixes k
pairs, per head and per query:

    O = sum_i alpha_i O_i,    alpha_i = s_i / sum_j s_j,    s_i = sum_{keys of pair i} exp(score)

(s_i = 0 when pair i does not select the query). Written out, this is ONE softmax over the
keys of all pairs taken as a multiset: a key that several pairs give the query (every pair
with offset s_j = 0 shares position 0 of a segment, say) counts once per pair, i.e. its weight
is multiplied by its multiplicity. That is what the paper's formula computes (and what it
means by "gather keys in different parts and calculate softmax together"); it equals a softmax
over the plain union only when the pairs' key sets are disjoint. `dilated_attention_reference`
builds exactly this multiplicity matrix and is the oracle of the tests. Unlike torchscale's
implementation, which computes the weights under no_grad, the weights here are differentiated,
so the gradients are those of the joint softmax.

Choices the paper leaves open, made here:
* A segment longer than the sequence is clamped to it (same rows are selected either way).
* L not a multiple of w: the last segment is padded; padded rows are masked as keys and dropped
  as queries. w need not be a multiple of r (the paper's (8192, 6)): offset s keeps rows
  s, s+r, ... < w, so rows per segment differ by at most one between heads.
* Causal: inside a sparse segment a query sees the selected keys at or before it.
* scale = 1/sqrt(head_dim) unless given (the paper writes softmax(QK^T); every implementation
  scales).

Vectorized: per pair one index_select gathers [B, H, segments, w/r, d] blocks (all heads at
once; their offsets differ), segment_attention runs batched matmuls in bounded tiles, and one
index_copy scatters back. Nothing of size [L, L] exists outside the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphattn.errors import BatchError
from graphattn.patterns.segment_attention import segment_attention

# The paper's language-model schedule (section 4): w doubles, r grows with it.
LONGNET_SCHEDULE: tuple[tuple[int, int], ...] = ((2048, 1), (4096, 2), (8192, 4), (16384, 6), (32768, 12))


@dataclass(frozen=True)
class SparseLayout:
    """Which rows one (w, r) pair reads, per head: row m of segment s of head h is sequence
    position `positions[h, s, m]` (clamped into range where `valid` is False)."""

    positions: torch.Tensor  # long [H, S, M]
    valid: torch.Tensor  # bool [H, S, M]: inside its segment and inside the sequence
    segment: int  # effective w (clamped to the sequence)
    dilation: int


def check_schedule(pairs: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """Validate a (segment, dilation) schedule; errors name the offending pair."""
    if isinstance(pairs, (str, bytes)) or len(pairs) == 0:
        raise BatchError("a dilated-attention schedule needs at least one (segment, dilation) pair", path=("pairs",))
    checked = []
    for index, pair in enumerate(pairs):
        try:
            segment, dilation = (int(x) for x in pair)
        except (TypeError, ValueError):
            raise BatchError(
                f"expected a (segment, dilation) pair of two ints, got {pair!r}", path=("pairs", index)
            ) from None
        if segment < 1 or dilation < 1:
            raise BatchError(f"segment and dilation must be >= 1, got ({segment}, {dilation})", path=("pairs", index))
        if dilation > segment:
            raise BatchError(
                f"dilation {dilation} is larger than segment {segment}: a segment would keep at most one row",
                path=("pairs", index),
            )
        checked.append((segment, dilation))
    return tuple(checked)


def head_offsets(heads: int, dilation: int, device: torch.device | None = None) -> torch.Tensor:
    """s_j = j mod r: head j starts its sparse rows j mod r rows into each segment."""
    return torch.arange(heads, device=device) % dilation


def sparse_layout(
    segment: int,
    dilation: int,
    heads: int,
    first_segment: int,
    num_segments: int,
    valid_length: int,
    device: torch.device | None = None,
) -> SparseLayout:
    """Rows of segments first_segment .. first_segment+num_segments-1 (global positions)."""
    rows = math.ceil(segment / dilation)
    offset = head_offsets(heads, dilation, device)[:, None, None]  # [H, 1, 1]
    segment_ids = torch.arange(first_segment, first_segment + num_segments, device=device)[None, :, None]
    inside = offset + dilation * torch.arange(rows, device=device)[None, None, :]  # [H, 1, M]
    positions = segment_ids * segment + inside  # [H, S, M]
    valid = (inside < segment) & (positions < valid_length)
    positions = torch.where(valid, positions, torch.zeros_like(positions))
    return SparseLayout(positions, valid.expand_as(positions).contiguous(), segment, dilation)


def full_layout(length: int, segment: int, dilation: int, heads: int, device=None) -> SparseLayout:
    """All segments of a sequence of `length` tokens; w is clamped to the length."""
    segment = min(segment, length)
    return sparse_layout(segment, dilation, heads, 0, math.ceil(length / segment), length, device)


def gather_rows(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, d], positions [H, S, M] -> [B, H, S, M, d] (one index_select, all heads)."""
    batch, heads, length, dim = x.shape
    flat = (positions + torch.arange(heads, device=x.device)[:, None, None] * length).reshape(-1)
    rows = x.reshape(batch, heads * length, dim).index_select(1, flat)
    return rows.view(batch, heads, *positions.shape[1:], dim)


def _scatter_index(positions: torch.Tensor, keep: torch.Tensor, length: int) -> torch.Tensor:
    """Flat [H*L + 1] slot per sparse row; dropped rows go to the trailing dump slot H*L."""
    heads = positions.shape[0]
    flat = positions + torch.arange(heads, device=positions.device)[:, None, None] * length
    return torch.where(keep, flat, torch.full_like(flat, heads * length)).reshape(-1)


def scatter_rows(out: torch.Tensor, lse: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, length: int):
    """Inverse of gather_rows for outputs [B, H, S, M, d] and lse [B, H, S, M]; rows not kept
    (padding, or not owned by this process) are dropped. Returns ([B, H, L, d], [B, H, L])."""
    batch, heads, dim = out.shape[0], out.shape[1], out.shape[-1]
    index = _scatter_index(positions, keep, length)
    dense = out.new_zeros(batch, heads * length + 1, dim).index_copy(1, index, out.reshape(batch, -1, dim))
    dense_lse = lse.new_full((batch, heads * length + 1), float("-inf")).index_copy(1, index, lse.reshape(batch, -1))
    return dense[:, :-1].view(batch, heads, length, dim), dense_lse[:, :-1].view(batch, heads, length)


def attend_segments(qs, ks, vs, key_valid, causal: bool, scale: float, tile_elements: int | None = None):
    """Dense attention in each sparse segment: [B, H, S, M, d] blocks, key_valid [B or 1, H, S, M]."""
    batch, heads, segs, rows, dim = qs.shape
    key_valid = key_valid.expand(batch, heads, segs, ks.shape[3]).reshape(-1, ks.shape[3])
    out, lse = segment_attention(
        qs.reshape(-1, rows, dim),
        ks.reshape(-1, ks.shape[3], dim),
        vs.reshape(-1, ks.shape[3], dim),
        key_valid,
        causal=causal,
        scale=scale,
        tile_elements=tile_elements,
    )
    return out.view(qs.shape), lse.view(qs.shape[:-1])


def mix_by_denominators(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum_i alpha_i O_i with alpha_i = exp(lse_i) / sum_j exp(lse_j), per [B, H, L] row.

    Rows no pair selected (all lse = -inf) give 0; weights are formed without log(0) so that
    their gradients stay finite there too.
    """
    stacked = torch.stack(list(lses))  # [k, B, H, L]
    peak = stacked.amax(dim=0).detach()
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    mass = torch.exp(stacked - peak)
    total = mass.sum(dim=0)
    weights = mass / torch.where(total > 0, total, torch.ones_like(total))
    mixed = None
    for weight, out in zip(weights, outs):
        term = weight.unsqueeze(-1).to(out.dtype) * out
        mixed = term if mixed is None else mixed + term
    return mixed


def check_states(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise BatchError(f"expected a float tensor [batch, heads, length, head_dim], got {shape}", path=(name,))
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise BatchError(
                f"shape/dtype/device {list(t.shape)} {t.dtype} {t.device} "
                f"differ from q's {list(q.shape)} {q.dtype} {q.device}",
                path=(name,),
            )
    if q.shape[2] == 0:
        raise BatchError("the sequence is empty (length 0)", path=("q",))


def _key_padding_rows(key_padding: torch.Tensor | None, layout: SparseLayout) -> torch.Tensor:
    """Layout validity, AND the user's key padding [B, L] (True = real token) gathered per row."""
    valid = layout.valid[None]
    if key_padding is None:
        return valid
    return valid & key_padding[:, layout.positions]  # [B, H, S, M]


def dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pairs: Sequence[Sequence[int]] = LONGNET_SCHEDULE,
    *,
    causal: bool = False,
    scale: float | None = None,
    key_padding: torch.Tensor | None = None,
    tile_elements: int | None = None,
) -> torch.Tensor:
    """LongNet dilated attention over q, k, v [B, H, L, d] -> [B, H, L, d].

    pairs: (segment w, dilation r) schedule, mixed by softmax denominators (module docstring).
    key_padding: optional [B, L] bool, False = padding token (never attended to).
    """
    check_states(q, k, v)
    pairs = check_schedule(pairs)
    batch, heads, length, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    if key_padding is not None and tuple(key_padding.shape) != (batch, length):
        raise BatchError(
            f"expected [batch={batch}, length={length}], got {list(key_padding.shape)}", path=("key_padding",)
        )
    outs, lses = [], []
    for segment, dilation in pairs:
        layout = full_layout(length, segment, dilation, heads, q.device)
        key_valid = _key_padding_rows(None if key_padding is None else key_padding.to(q.device, torch.bool), layout)
        qs, ks, vs = (gather_rows(x, layout.positions) for x in (q, k, v))
        out, lse = attend_segments(qs, ks, vs, key_valid, causal, scale, tile_elements)
        dense_out, dense_lse = scatter_rows(out, lse, layout.positions, layout.valid, length)
        outs.append(dense_out)
        lses.append(dense_lse)
    return mix_by_denominators(outs, lses).to(q.dtype)


def pair_multiplicity(length: int, pairs: Sequence[Sequence[int]], heads: int, causal: bool) -> torch.Tensor:
    """[H, L, L] count of pairs through which query i sees key j (brute force, from the definition:
    both rows selected by the head's offset in the same segment, and j <= i when causal)."""
    counts = torch.zeros(heads, length, length, dtype=torch.long)
    position = torch.arange(length)
    for segment, dilation in check_schedule(pairs):
        segment = min(segment, length)
        seg_id = position // segment
        within = position - seg_id * segment
        offset = head_offsets(heads, dilation)[:, None]
        selected = (within[None] >= offset) & ((within[None] - offset) % dilation == 0)  # [H, L]
        same_segment = seg_id[:, None] == seg_id[None, :]
        sees = selected[:, :, None] & selected[:, None, :] & same_segment
        if causal:
            sees &= position[None, :] <= position[:, None]
        counts += sees.long()
    return counts


def dilated_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pairs: Sequence[Sequence[int]] = LONGNET_SCHEDULE,
    *,
    causal: bool = False,
    scale: float | None = None,
    key_padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense oracle: one softmax over all keys, each key weighted by its multiplicity (the paper's
    denominator-weighted mixture, see the module docstring). Materializes [B, H, L, L]."""
    check_states(q, k, v)
    batch, heads, length, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    counts = pair_multiplicity(length, pairs, heads, causal).to(q.device)[None]  # [1, H, L, L]
    if key_padding is not None:
        counts = counts * key_padding.bool()[:, None, None, :]
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    scores = scores.masked_fill(counts == 0, float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)).detach()
    weights = counts * torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    return (probs @ v.to(acc)).to(q.dtype)
