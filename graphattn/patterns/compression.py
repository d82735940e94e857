"""Compression functions f_c and the attention-reconstruction loss (Compressive Transformer,
Rae et al. 2019, arXiv 1911.05507, section 3.2 and Algorithm 2).

f_c maps n evicted memories [B, n, D] to ceil(n / c) compressed ones. The paper evicts n_s at a
time with c dividing n_s, so this is its floor(n_s / c); a ragged tail (a short last segment)
becomes one more slot over the remaining rows instead of being dropped. Every function is told
which rows are padding (`valid`), so padding never enters a compressed memory, and reports which
evicted rows each output slot summarises (`spans`, [start, stop) into the evicted rows), which is
what the FIFO bookkeeping records.

  max_pool / mean_pool  kernel c, stride c, over valid rows only
  conv                  Conv1d(D, D, kernel c, stride c): cm_k = sum_j W_j m_{kc+j} + b
  dilated_conv          the same with dilation delta: slot k reads rows kc, kc+delta, ...,
                        kc+(c-1)delta (zero rows past the end)
  most_used             keep the ceil(n/c) rows with the highest attention usage, verbatim, in
                        their original order

Usage and the reconstruction loss both use `content_attention`: the layer's own query/key/value
projections, content scores only (no relative labels, as the paper's Algorithm 2), every
parameter and input of the main network detached, so that the loss's gradients reach the
compression network only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

COMPRESSIONS = ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")


def _pad_rows(x: torch.Tensor, valid: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad [B, n, D] and [B, n] with invalid zero rows up to a multiple of `multiple`."""
    missing = -x.shape[1] % multiple
    if missing:
        x = F.pad(x, (0, 0, 0, missing))
        valid = F.pad(valid, (0, missing), value=False)
    return x, valid


def _block_spans(slots: int, rate: int, reach: int, rows: int, batch: int, device) -> torch.Tensor:
    """[B, slots, 2]: slot k covers rows [k*rate, min(k*rate + reach, rows))."""
    start = torch.arange(slots, device=device) * rate
    stop = torch.clamp(start + reach, max=rows)
    return torch.stack((start, stop), dim=-1).expand(batch, slots, 2)


class Compressor(nn.Module):
    """f_c for one layer: (old [B, n, D], valid [B, n], usage [B, n] or None) ->
    (compressed [B, m, D], valid [B, m], spans [B, m, 2]) with m = ceil(n / rate)."""

    def __init__(self, kind: str, hidden_size: int, rate: int, dilation: int = 2):
        super().__init__()
        if kind not in COMPRESSIONS:
            raise ValueError(f"unknown compression {kind!r}; expected one of {', '.join(COMPRESSIONS)}")
        self.kind, self.rate, self.dilation = kind, rate, dilation if kind == "dilated_conv" else 1
        self.conv = (
            nn.Conv1d(hidden_size, hidden_size, rate, stride=rate, dilation=self.dilation)
            if kind.endswith("conv")
            else None
        )

    @property
    def needs_usage(self) -> bool:
        return self.kind == "most_used"

    def forward(self, old: torch.Tensor, valid: torch.Tensor, usage: torch.Tensor | None = None):
        batch, rows, _ = old.shape
        slots = math.ceil(rows / self.rate)
        if self.kind == "most_used":
            if usage is None:
                raise ValueError("most_used compression needs the attention usage of the evicted rows")
            return self._most_used(old, valid, usage, slots)
        x, mask = _pad_rows(old, valid, self.rate)
        if self.conv is not None:
            return self._convolve(x, mask, slots, rows)
        blocks = x.view(batch, slots, self.rate, -1)
        block_mask = mask.view(batch, slots, self.rate, 1)
        any_valid = block_mask.any(dim=2)  # [B, m, 1]
        if self.kind == "max_pool":
            pooled = blocks.masked_fill(~block_mask, float("-inf")).amax(dim=2)
            pooled = torch.where(any_valid, pooled, torch.zeros_like(pooled))
        else:
            count = block_mask.sum(dim=2).clamp(min=1)
            pooled = (blocks * block_mask).sum(dim=2) / count
        return pooled, any_valid.squeeze(-1), _block_spans(slots, self.rate, self.rate, rows, batch, old.device)

    def _convolve(self, x, mask, slots, rows):
        """Strided (dilated) conv over zeroed padding; a slot is valid if any tap is."""
        reach = (self.rate - 1) * self.dilation + 1
        extra = reach - self.rate  # right padding so that every slot has all its taps
        x = F.pad((x * mask.unsqueeze(-1)).transpose(1, 2), (0, extra))
        out = self.conv(x).transpose(1, 2)  # [B, m, D]
        taps = F.pad(mask.float(), (0, extra)).unsqueeze(1)
        hit = F.max_pool1d(taps, kernel_size=self.rate, stride=self.rate, dilation=self.dilation).squeeze(1) > 0
        return out, hit, _block_spans(slots, self.rate, reach, rows, x.shape[0], x.device)

    def _most_used(self, old, valid, usage, slots):
        score = usage.masked_fill(~valid, float("-inf"))
        keep = score.topk(slots, dim=1).indices.sort(dim=1).values  # [B, m], original order
        kept = torch.gather(old, 1, keep.unsqueeze(-1).expand(-1, -1, old.shape[-1]))
        return kept, torch.gather(valid, 1, keep), torch.stack((keep, keep + 1), dim=-1)


def _detached_projection(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = linear.bias.detach() if linear.bias is not None else None
    return F.linear(x, linear.weight.detach(), bias)


def content_attention(attention: nn.Module, queries: torch.Tensor, memories: torch.Tensor, memory_valid: torch.Tensor):
    """softmax((h W_q)(m W_k)^T / sqrt(d)) (m W_v), per head, with the main network frozen:
    `attention` is the layer's GlobalLocalAttention (its long-token query/key/value projections
    are used, detached). `queries` should be detached by the caller; `memories` are not, so that
    gradients reach whatever produced them (the compressor). Returns (out [B, n_q, D],
    probs [B, H, n_q, n_m])."""
    heads, dim = attention.num_heads, attention.head_dim

    def split(x):
        return x.view(x.shape[0], x.shape[1], heads, dim).transpose(1, 2)

    q = split(_detached_projection(attention.query, queries))
    k = split(_detached_projection(attention.key, memories))
    v = split(_detached_projection(attention.value, memories))
    scores = (q @ k.transpose(-1, -2)) * dim**-0.5
    scores = scores.masked_fill(~memory_valid[:, None, None, :], float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True).detach()
    weights = torch.exp(scores - torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)))
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    out = (probs @ v).transpose(1, 2).reshape(queries.shape[0], queries.shape[1], heads * dim)
    return out, probs


def attention_usage(
    attention: nn.Module,
    queries: torch.Tensor,
    query_valid: torch.Tensor,
    memories: torch.Tensor,
    memory_valid: torch.Tensor,
) -> torch.Tensor:
    """[B, n_m]: attention weight each memory receives, averaged over heads and valid queries."""
    with torch.no_grad():
        _, probs = content_attention(attention, queries, memories, memory_valid)
        weight = query_valid[:, None, :, None].to(probs.dtype)
        return (probs * weight).sum(dim=(1, 2)) / (weight.sum(dim=(1, 2)) * probs.shape[1]).clamp(min=1)


def attention_reconstruction_loss(
    attention: nn.Module,
    queries: torch.Tensor,
    query_valid: torch.Tensor,
    old: torch.Tensor,
    old_valid: torch.Tensor,
    compressed: torch.Tensor,
    compressed_valid: torch.Tensor,
) -> torch.Tensor:
    """|| attn(h, old_mem) - attn(h, f_c(old_mem)) ||^2, mean over valid query rows and features.

    h, old_mem and the attention parameters are detached (Algorithm 2's stop-gradients): only
    `compressed` carries gradients, into the compression network."""
    queries, old = queries.detach(), old.detach()
    target, _ = content_attention(attention, queries, old, old_valid)
    recon, _ = content_attention(attention, queries, compressed, compressed_valid)
    rows = query_valid.unsqueeze(-1).to(recon.dtype)
    squared = ((recon - target) ** 2 * rows).sum()
    return squared / (rows.sum() * recon.shape[-1]).clamp(min=1)
