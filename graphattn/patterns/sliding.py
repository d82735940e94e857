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
are expanded views, never materialized per pair. The window's global keys are key-only global
slots (no global query rows), and each window is prepared once (`prepare_windows`,
`prepare_global_rows`) for all the layers of a batch that share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import PreparedAttention, prepare_attention

__all__ = [
    "fold_states",
    "fold_tokens",
    "unfold_states",
    "group_heads",
    "window_side_inputs",
    "global_rows_side_inputs",
    "PreparedWindows",
    "prepare_windows",
    "prepare_global_rows",
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
    return (
        x.view(batch, heads, folded, dilation, dim).permute(0, 3, 1, 2, 4).reshape(batch * dilation, heads, folded, dim)
    )


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
    ([B, L] bool), and every global key where `global_ok` ([B, G] bool). The G global slots are
    keys only (no global query rows: g2g [B, 0, G], g2l [B, 0, L]). All label ids are 0."""
    batch, length = key_ok.shape
    num_global = global_ok.shape[1]
    device = key_ok.device
    padded = torch.nn.functional.pad(key_ok.bool(), (radius, radius), value=False)
    band = padded.unfold(1, 2 * radius + 1, 1)  # [B, L, 2r+1]: column c is key i - r + c
    return SideInputs(
        l2l_att_mask=band,
        g2g_att_mask=_zeros(batch, 0, num_global, device=device, dtype=torch.bool),
        l2g_att_mask=global_ok.bool()[:, None, :].expand(batch, length, num_global),
        g2l_att_mask=_zeros(batch, 0, length, device=device, dtype=torch.bool),
        l2l_relative_att_ids=_zeros(batch, length, 2 * radius + 1, device=device),
        g2g_relative_att_ids=_zeros(batch, 0, num_global, device=device),
        l2g_relative_att_ids=_zeros(batch, length, num_global, device=device),
        g2l_relative_att_ids=_zeros(batch, 0, length, device=device),
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


def _check_window(radius: int, dilation: int) -> None:
    if dilation < 1 or radius < 0:
        raise BatchError(
            f"dilation must be >= 1 and radius >= 0, got dilation {dilation}, radius {radius}", path=("dilation",)
        )


def _per_subsequence(x: torch.Tensor, dilation: int) -> torch.Tensor:
    """Every folded row (subsequence) of batch row b sees row b's global tokens."""
    return x.repeat_interleave(dilation, dim=0) if dilation > 1 else x


@dataclass
class _Window:
    dilation: int
    heads: list[int]  # the heads of this dilation, in order
    attention: PreparedAttention  # over the folded batch


@dataclass
class PreparedWindows:
    """One layer shape's dilated windows over a batch, prepared once: per distinct dilation, the
    folded side inputs and their prepared ETC attention (heads of equal dilation run together).
    `attend` is the per-layer part."""

    radius: int
    length: int
    windows: list[_Window]
    num_heads: int

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        global_k: torch.Tensor | None = None,
        global_v: torch.Tensor | None = None,
        *,
        scale: float | None = None,
    ) -> torch.Tensor:
        """[B, H, L, d]: each query over its dilated window and the global keys (see `windowed_attention`)."""
        if (global_k is None) != (global_v is None):
            raise BatchError("give both global_k and global_v, or neither", path=("global_k",))
        batch, heads, length, dim = q.shape
        if (heads, length) != (self.num_heads, self.length):
            raise BatchError(
                f"q has {heads} heads and {length} tokens; the windows were prepared for {self.num_heads} and "
                f"{self.length}",
                path=("q",),
            )
        if global_k is None:
            global_k = global_v = q.new_zeros(batch, heads, 0, dim)
        parts = []
        for window in self.windows:
            index = None if len(self.windows) == 1 else torch.tensor(window.heads, device=q.device)
            pick = (lambda x: x) if index is None else (lambda x: x.index_select(1, index))  # noqa: B023 (used at once)
            d = window.dilation
            fq, fk, fv = (fold_states(pick(x), d) for x in (q, k, v))
            gk, gv = (_per_subsequence(pick(x), d) for x in (global_k, global_v))
            no_queries = fq.new_zeros(fq.shape[0], fq.shape[1], 0, dim)  # the global slots are keys only
            _, out = window.attention.attend(
                no_queries, gk, gv, fq, fk, fv, _no_labels(len(window.heads), dim, q), None, scale
            )
            parts.append(unfold_states(out, d, length))
        if len(parts) == 1:
            return parts[0]
        order = [h for window in self.windows for h in window.heads]
        inverse = torch.empty(heads, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(heads)
        return torch.cat(parts, dim=1).index_select(1, inverse.to(q.device))


def prepare_windows(
    key_ok: torch.Tensor,
    radius: int,
    dilations: Sequence[int],
    head_dim: int,
    global_ok: torch.Tensor | None = None,
    num_global: int = 0,
    *,
    backend: str = "auto",
) -> PreparedWindows:
    """Prepare dilated windows of `radius` (a dilation per head) over a batch: key_ok [B, L]
    bool, global_ok [B, G] bool (None: `num_global` keys, all allowed)."""
    batch, length = key_ok.shape
    if global_ok is None:
        global_ok = torch.ones(batch, num_global, dtype=torch.bool, device=key_ok.device)
    windows = []
    for dilation, heads in group_heads(dilations):
        _check_window(radius, dilation)
        side = window_side_inputs(fold_tokens(key_ok, dilation), radius, _per_subsequence(global_ok, dilation))
        attention = prepare_attention(
            side, num_heads=len(heads), head_dim=head_dim, vocab_size=1, backend=backend, device=key_ok.device
        )
        windows.append(_Window(dilation, heads, attention))
    return PreparedWindows(radius, length, windows, len(dilations))


def prepare_global_rows(
    key_ok: torch.Tensor, num_global: int, num_heads: int, head_dim: int, *, backend: str = "auto"
) -> PreparedAttention:
    """Prepare Longformer's global rows: every global query attends every key where `key_ok`."""
    side = global_rows_side_inputs(key_ok, num_global)
    return prepare_attention(
        side, num_heads=num_heads, head_dim=head_dim, vocab_size=1, backend=backend, device=key_ok.device
    )


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
    return windowed_attention(
        q, k, v, key_ok, radius, [dilation] * q.shape[1], global_k, global_v, global_ok, backend=backend, scale=scale
    )


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
    heads of equal dilation run as one kernel call. Returns [B, H, L, d]. Prepares and runs in
    one call; a model that runs several layers over one batch uses `prepare_windows`."""
    heads = q.shape[1]
    if len(dilations) != heads:
        raise BatchError(f"{len(dilations)} dilations given for {heads} heads; give one per head", path=("dilations",))
    if (global_k is None) != (global_v is None):
        raise BatchError("give both global_k and global_v, or neither", path=("global_k",))
    num_global = 0 if global_k is None else global_k.shape[2]
    windows = prepare_windows(key_ok, radius, dilations, q.shape[-1], global_ok, num_global, backend=backend)
    return windows.attend(q, k, v, global_k, global_v, scale=scale)


def global_rows_attention(
    global_q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_ok: torch.Tensor,
    *,
    backend: str = "auto",
    scale: float | None = None,
    prepared: PreparedAttention | None = None,
) -> torch.Tensor:
    """Each global query ([B, H, G, d]) attends every key of k, v ([B, H, L, d]) where `key_ok`
    ([B, L] bool): Longformer's global rows. Returns [B, H, G, d]. `prepared` (from
    `prepare_global_rows`) reuses a batch's preparation."""
    heads, num_global, dim = global_q.shape[1], global_q.shape[2], global_q.shape[3]
    if prepared is None:
        prepared = prepare_global_rows(key_ok, num_global, heads, dim, backend=backend)
    # Long query rows are fully masked (radius 0): k stands in for them at no cost.
    out, _ = prepared.attend(global_q, global_q, global_q, k, k, v, _no_labels(heads, dim, k), None, scale)
    return out
