"""Dense attention inside many small independent segments, returning the log-sum-exp too.

LongNet's dilated attention (patterns/dilated.py) turns one long sequence into a batch of short
sparse segments and mixes several such batches by their softmax denominators. Mixing needs each
row's log-sum-exp AND its gradient (the mixing weights depend on it), which torch's fused SDPA
kernels do not give, so this is a small flash-style autograd Function in PyTorch:

* The forward runs in tiles of (segments x query rows) whose score matrix stays under
  `tile_elements`, so memory is O(rows), never O(segment^2) for all segments at once; causal
  tiles only read the keys up to their last query. On CPU in fp32/fp64 both passes use torch's
  own flash kernels instead (same math; the forward returns the lse, the backward takes the lse
  gradient through one extra value column, see _fused_backward; 4-10x faster than the tiles).
* It saves outputs and lse and recomputes tiles in the backward, where the lse gradient enters
  the usual flash identity dS = P * (dP - delta) as delta = rowsum(dO * O) - dlse
  (because d lse / d s = P).
* Rows with no visible key give output 0 and lse -inf, never NaN.

Statistics and matmuls run in fp32 (fp64 stays fp64); outputs take the input dtype.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def default_tile_elements(device: torch.device) -> int:
    """Score elements per tile: small on CPU (cache, page faults), large on a GPU (occupancy)."""
    return (1 << 26) if device.type == "cuda" else (1 << 22)


def _tiles(num_segments: int, rows: int, tile_elements: int):
    """Yield (segment slice, query-row slice) covering [num_segments, rows] in tiles."""
    per_segment = rows * rows
    if per_segment <= tile_elements:
        step = max(1, tile_elements // per_segment)
        for start in range(0, num_segments, step):
            yield slice(start, min(start + step, num_segments)), slice(0, rows)
        return
    row_step = max(1, tile_elements // rows)
    for start in range(num_segments):
        for q0 in range(0, rows, row_step):
            yield slice(start, start + 1), slice(q0, min(q0 + row_step, rows))


def _masked_scores(q, k, key_valid, q_rows: slice, causal: bool, scale: float) -> torch.Tensor:
    """Scores of a tile [n, rows, keys], -inf where the key is padding or (causal) in the future."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~key_valid[:, None, :], NEG_INF)
    if causal:
        query_index = torch.arange(q_rows.start, q_rows.stop, device=q.device)[:, None]
        key_index = torch.arange(k.shape[-2], device=q.device)[None, :]
        scores.masked_fill_(key_index > query_index, NEG_INF)
    return scores


def _key_stop(q_rows: slice, rows: int, causal: bool) -> int:
    """Causal queries up to row q_rows.stop - 1 never see later keys: skip them."""
    return q_rows.stop if causal else rows


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _use_fused(q: torch.Tensor) -> bool:
    return (
        _CPU_FLASH is not None
        and _CPU_FLASH_BACKWARD is not None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
    )


def _additive_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, M] bool -> [N, 1, 1, M] additive mask (0 / -inf) for torch's kernels."""
    return torch.zeros(key_valid.shape, dtype=dtype, device=key_valid.device).masked_fill_(~key_valid, NEG_INF)[
        :, None, None, :
    ]


def _empty_rows(key_valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """[N, M] rows that see no valid key: all rows of a keyless segment; causal rows before the
    segment's first valid key."""
    rows = key_valid.shape[1]
    first_valid = torch.where(key_valid.any(dim=1), key_valid.int().argmax(dim=1), rows)  # [N]
    if not causal:
        return (first_valid == rows)[:, None].expand(-1, rows)
    return torch.arange(rows, device=key_valid.device)[None, :] < first_valid[:, None]


def _fused_forward(q, k, v, key_valid, causal, scale):
    """torch's CPU flash kernel: the same softmax, returns the lse too, no score tiles in Python.
    Rows without a visible key are set to out 0 / lse -inf as in the tiled path."""
    mask = _additive_mask(key_valid, q.dtype)
    out, lse = _CPU_FLASH(q[:, None], k[:, None], v[:, None], 0.0, causal, attn_mask=mask, scale=scale)
    out, lse = out[:, 0], lse.reshape(q.shape[:2]).to(out.dtype)
    empty = _empty_rows(key_valid, causal)
    out = out.masked_fill(empty[..., None], 0.0)
    return out, lse.masked_fill(empty, NEG_INF)


def _fused_backward(q, k, v, key_valid, out, lse, grad_out, grad_lse, causal, scale):
    """torch's CPU flash backward, with the lse gradient folded in.

    The kernel computes dS = P * (dO.V^T - rowsum(dO * O)); we need delta - dlse in place of
    rowsum(dO * O). Appending a zero column to q, k, v (scores and dV unchanged), a column of
    ones to O and -dlse to dO adds exactly -dlse to that rowsum and nothing else."""

    def widen(x, column):
        return torch.cat((x, column), dim=-1)[:, None].contiguous()

    zeros = q.new_zeros(*q.shape[:2], 1)
    empty = _empty_rows(key_valid, causal)
    lse = torch.where(empty, float("inf"), lse)[:, None].contiguous()  # P = exp(-inf - inf) = 0
    grads = _CPU_FLASH_BACKWARD(
        widen(grad_out.to(q.dtype), -grad_lse.to(q.dtype)[..., None]),
        widen(q, zeros),
        widen(k, zeros),
        widen(v, zeros),
        widen(out, torch.ones_like(zeros)),
        lse,
        0.0,
        causal,
        attn_mask=_additive_mask(key_valid, q.dtype),
        scale=scale,
    )
    return tuple(g[:, 0, :, :-1] for g in grads)


def _forward(q, k, v, key_valid, causal, scale, tile_elements):
    if _use_fused(q):
        return _fused_forward(q, k, v, key_valid, causal, scale)
    num, rows, _ = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((num, rows), NEG_INF, dtype=acc, device=q.device)
    for seg, qr in _tiles(num, rows, tile_elements):
        stop = _key_stop(qr, rows, causal)
        scores = _masked_scores(q[seg, qr].to(acc), k[seg, :stop].to(acc), key_valid[seg, :stop], qr, causal, scale)
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        probs = scores.sub_(row_max).exp_()
        total = probs.sum(dim=-1, keepdim=True)
        tile_out = torch.matmul(probs, v[seg, :stop].to(acc))
        out[seg, qr] = tile_out / torch.where(total > 0, total, torch.ones_like(total))
        lse[seg, qr] = (row_max + torch.log(total)).squeeze(-1)
    return out, lse


def _backward(q, k, v, key_valid, out, lse, grad_out, grad_lse, causal, scale, tile_elements):
    num, rows, _ = q.shape
    acc = out.dtype
    grad_out = grad_out.to(acc)
    delta = (grad_out * out).sum(dim=-1) - grad_lse.to(acc)  # [N, M]
    # exp(s - lse) must be 0 on empty rows (s = lse = -inf): use +inf there.
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for seg, qr in _tiles(num, rows, tile_elements):
        stop = _key_stop(qr, rows, causal)
        q_t, k_t, v_t = q[seg, qr].to(acc), k[seg, :stop].to(acc), v[seg, :stop].to(acc)
        probs = _masked_scores(q_t, k_t, key_valid[seg, :stop], qr, causal, scale)
        probs = probs.sub_(lse_safe[seg, qr, None]).exp_()
        do_t = grad_out[seg, qr]
        dv[seg, :stop] += torch.matmul(probs.transpose(-1, -2), do_t)
        grad_scores = torch.matmul(do_t, v_t.transpose(-1, -2)).sub_(delta[seg, qr, None]).mul_(probs).mul_(scale)
        dq[seg, qr] = torch.matmul(grad_scores, k_t)
        dk[seg, :stop] += torch.matmul(grad_scores.transpose(-1, -2), q_t)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _SegmentAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_valid, causal, scale, tile_elements):
        out, lse = _forward(q, k, v, key_valid, causal, scale, tile_elements)
        ctx.save_for_backward(q, k, v, key_valid, out, lse)
        ctx.settings = (causal, scale, tile_elements)
        ctx.mark_non_differentiable(key_valid)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, key_valid, out, lse = ctx.saved_tensors
        causal, scale, tile_elements = ctx.settings
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)
        if _use_fused(q):
            dq, dk, dv = _fused_backward(q, k, v, key_valid, out, lse, grad_out, grad_lse, causal, scale)
            return dq, dk, dv, None, None, None, None
        dq, dk, dv = _backward(q, k, v, key_valid, out, lse, grad_out, grad_lse, causal, scale, tile_elements)
        return dq, dk, dv, None, None, None, None


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_valid: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    tile_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention inside each of N segments; returns (out [N, M, d], lse [N, M] fp32+).

    q, k, v: [N, M, d], row m of segment n is that segment's m-th (sparse) position.
    key_valid: [N, M] bool, False = padding key. causal: key m' is visible to query m iff m' <= m.
    """
    if tile_elements is None:
        tile_elements = default_tile_elements(q.device)
    return _SegmentAttention.apply(q, k, v, key_valid, causal, scale, tile_elements)
