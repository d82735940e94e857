"""Dilated sliding windows (Longformer) on the global-local kernels, by folding residue classes.

A window of radius r with dilation d lets query i see keys i + d*m for |m| <= r: only keys in
i's residue class mod d. Reordering the sequence into d interleaved subsequences (position p
goes to subsequence p mod d at index p // d, the sequence padded to a multiple of d) turns the
dilated window into an undilated window of radius r inside each subsequence, which every ETC
backend (dense, blocked, triton, flex) already runs without an [L, L] tensor. The d
subsequences become extra batch rows, so one kernel call covers all of them; heads with
different dilations are grouped and each group is one call.

Dilation is the stride, as in the paper's formula (keys i - d*w/2, ..., i - d, i, i + d, ...,
i + d*w/2) and in allenai/longformer's and HF's `attention_dilation`: 1 is a contiguous window,
2 every other token. The paper's Table 12 counts the gaps instead ("dilation 0 on layers 0-5,
dilation 1 on layers 6-7, ..."): its value t is our t + 1.

Side inputs built here stay O(L r + L + G) in memory: the band is a strided view of the padded
key mask, and the rectangular l2g / g2l / g2g masks and all label ids (0: no relative labels)
are expanded views, never materialized per pair.
"""

from __future__ import annotations

from typing import Sequence

import torch

from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import global_local_attention

__all__ = [
    "fold_states",
    "fold_tokens",
    "unfold_states",
    "group_heads",
    "window_side_inputs",
    "global_rows_side_inputs",
    "dilated_window_attention",
    "windowed_attention",
    "global_rows_attention",
]


def _folded_length(length: int, dilation: int) -> int:
    return -(-length // dilation)


def fold_states(x: torch.Tensor, dilation: int) -> torch.Tensor:
    """[B, H, L, d] -> [B*dil, H, ceil(L/dil), d]: row b*dil + c holds positions c, c+dil, ...
    of row b, zeros past L."""
    if dilation == 1:
        return x
    batch, heads, length, dim = x.shape
    folded = _folded_length(length, dilation)
    x = torch.nn.functional.pad(x, (0, 0, 0, folded * dilation - length))
    return x.view(batch, heads, folded, dilation, dim).permute(0, 3, 1, 2, 4).reshape(batch * dilation, heads, folded, dim)


def unfold_states(x: torch.Tensor, dilation: int, length: int) -> torch.Tensor:
    """The inverse of `fold_states`: [B*dil, H, n, d] -> [B, H, length, d]."""
    if dilation == 1:
        return x
    rows, heads, folded, dim = x.shape
    batch = rows // dilation
    x = x.view(batch, dilation, heads, folded, dim).permute(0, 2, 3, 1, 4).reshape(batch, heads, folded * dilation, dim)
    return x[:, :, :length]


def fold_tokens(x: torch.Tensor, dilation: int, fill: bool | int | float = False) -> torch.Tensor:
    """[B, L] -> [B*dil, ceil(L/dil)] in the order of `fold_states`, `fill` past L."""
    if dilation == 1:
        return x
    batch, length = x.shape
    folded = _folded_length(length, dilation)
    x = torch.nn.functional.pad(x, (0, folded * dilation - length), value=fill)
    return x.view(batch, folded, dilation).transpose(1, 2).reshape(batch * dilation, folded)


def group_heads(dilations: Sequence[int]) -> list[tuple[int, list[int]]]:
    """Heads by dilation, in order of first appearance: [(dilation, [head, ...]), ...]."""
    groups: dict[int, list[int]] = {}
    for head, dilation in enumerate(dilations):
        groups.setdefault(int(dilation), []).append(head)
    return list(groups.items())


def _zeros(*shape: int, device, dtype=torch.int32) -> torch.Tensor:
    """An all-zero [*shape] tensor that occupies one element (an expanded view)."""
    return torch.zeros((1,) * len(shape), dtype=dtype, device=device).expand(*shape)


def window_side_inputs(key_ok: torch.Tensor, radius: int, global_ok: torch.Tensor) -> SideInputs:
    """Side inputs for: every long query attends the keys of its radius-r window where `key_ok`
    ([B, L] bool), and every global key where `global_ok` ([B, G] bool); global queries attend
    nothing (their rows are not needed). All label ids are 0."""
    batch, length = key_ok.shape
    num_global = global_ok.shape[1]
    device = key_ok.device
    padded = torch.nn.functional.pad(key_ok.bool(), (radius, radius), value=False)
    band = padded.unfold(1, 2 * radius + 1, 1)  # [B, L, 2r+1]: column c is key i - r + c
    return SideInputs(
        l2l_att_mask=band,
        g2g_att_mask=_zeros(batch, num_global, num_global, device=device, dtype=torch.bool),
        l2g_att_mask=global_ok.bool()[:, None, :].expand(batch, length, num_global),
        g2l_att_mask=_zeros(batch, num_global, length, device=device, dtype=torch.bool),
        l2l_relative_att_ids=_zeros(batch, length, 2 * radius + 1, device=device),
        g2g_relative_att_ids=_zeros(batch, num_global, num_global, device=device),
        l2g_relative_att_ids=_zeros(batch, length, num_global, device=device),
        g2l_relative_att_ids=_zeros(batch, num_global, length, device=device),
    )


def global_rows_side_inputs(key_ok: torch.Tensor, num_global: int) -> SideInputs:
    """Side inputs for: every global query attends every long key where `key_ok` ([B, L] bool);
    long queries attend nothing (radius 0, all masked). All label ids are 0."""
    batch, length = key_ok.shape
    device = key_ok.device
    return SideInputs(
        l2l_att_mask=_zeros(batch, length, 1, device=device, dtype=torch.bool),
        g2g_att_mask=_zeros(batch, num_global, num_global, device=device, dtype=torch.bool),
        l2g_att_mask=_zeros(batch, length, num_global, device=device, dtype=torch.bool),
        g2l_att_mask=key_ok.bool()[:, None, :].expand(batch, num_global, length),
        l2l_relative_att_ids=_zeros(batch, length, 1, device=device),
        g2g_relative_att_ids=_zeros(batch, num_global, num_global, device=device),
        l2g_relative_att_ids=_zeros(batch, length, num_global, device=device),
        g2l_relative_att_ids=_zeros(batch, num_global, length, device=device),
    )


def _no_labels(heads: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """a^K with one all-zero label: the pattern has no relative-position term."""
    return torch.zeros(1, heads, dim, dtype=like.dtype, device=like.device)


def dilated_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_ok: torch.Tensor,
    radius: int,
    dilation: int = 1,
    global_k: torch.Tensor | None = None,
    global_v: torch.Tensor | None = None,
    global_ok: torch.Tensor | None = None,
    *,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """One softmax per query i over keys i + dilation*m (|m| <= radius, where `key_ok`) and the
    global keys (where `global_ok`); returns [B, H, L, d]. q, k, v are [B, H, L, d], key_ok
    [B, L] bool, global_k / global_v [B, H, G, d] (None: no globals), global_ok [B, G] bool
    (None: all allowed). A query with nothing to attend to gets zeros."""
    batch, heads, length, dim = q.shape
    if dilation < 1 or radius < 0:
        raise BatchError(f"dilation must be >= 1 and radius >= 0, got dilation {dilation}, radius {radius}", path=("dilation",))
    if (global_k is None) != (global_v is None):
        raise BatchError("give both global_k and global_v, or neither", path=("global_k",))
    if global_k is None:
        global_k = global_v = q.new_zeros(batch, heads, 0, dim)
    if global_ok is None:
        global_ok = torch.ones(batch, global_k.shape[2], dtype=torch.bool, device=q.device)

    def per_subsequence(x: torch.Tensor) -> torch.Tensor:
        """Every folded row (subsequence) of batch row b sees row b's global tokens."""
        return x.repeat_interleave(dilation, dim=0) if dilation > 1 else x

    fq, fk, fv = (fold_states(x, dilation) for x in (q, k, v))
    gk, gv = per_subsequence(global_k), per_subsequence(global_v)
    side = window_side_inputs(fold_tokens(key_ok, dilation), radius, per_subsequence(global_ok))
    # Global query rows are fully masked here: any tensor of the right shape does.
    _, out = global_local_attention(gk, gk, gv, fq, fk, fv, side, _no_labels(heads, dim, q), backend=backend, scale=scale)
    return unfold_states(out, dilation, length)


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_ok: torch.Tensor,
    radius: int,
    dilations: Sequence[int],
    global_k: torch.Tensor | None = None,
    global_v: torch.Tensor | None = None,
    global_ok: torch.Tensor | None = None,
    *,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """`dilated_window_attention` with a dilation per head (`dilations`, one per head of q):
    heads of equal dilation run as one kernel call. Returns [B, H, L, d]."""
    heads = q.shape[1]
    if len(dilations) != heads:
        raise BatchError(f"{len(dilations)} dilations given for {heads} heads; give one per head", path=("dilations",))
    groups = group_heads(dilations)
    if len(groups) == 1:
        return dilated_window_attention(q, k, v, key_ok, radius, groups[0][0], global_k, global_v, global_ok, backend=backend, scale=scale)
    parts, order = [], []
    for dilation, members in groups:
        index = torch.tensor(members, device=q.device)
        q_g, k_g, v_g, gk_g, gv_g = (None if x is None else x.index_select(1, index) for x in (q, k, v, global_k, global_v))
        parts.append(dilated_window_attention(q_g, k_g, v_g, key_ok, radius, dilation, gk_g, gv_g, global_ok, backend=backend, scale=scale))
        order.extend(members)
    inverse = torch.empty(heads, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(heads)
    return torch.cat(parts, dim=1).index_select(1, inverse.to(q.device))


def global_rows_attention(
    global_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_ok: torch.Tensor,
    *,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """Each global query ([B, H, G, d]) attends every key of k, v ([B, H, L, d]) where `key_ok`
    ([B, L] bool): Longformer's global rows. Returns [B, H, G, d]."""
    heads, num_global, dim = global_q.shape[1], global_q.shape[2], global_q.shape[3]
    side = global_rows_side_inputs(key_ok, num_global)
    # Long query rows are fully masked (radius 0): k stands in for them at no cost.
    out, _ = global_local_attention(global_q, global_q, global_q, k, k, v, side, _no_labels(heads, dim, k), backend=backend, scale=scale)
    return out
