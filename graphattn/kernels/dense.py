"""The dense oracle: ETC global-local attention over the concatenated [global; long] sequence.

It materializes the full [G+L, G+L] score matrix, so it is only for small inputs. Every other
backend is tested against it, which is why it is written straight from the definition:

    e_ij = (q_i . k_j + q_i . a^K[label_ij]) * scale + b[label_ij],   -inf where the mask is 0

(a^K, b: the table pair of query i's side, global or long).

A global query's row is [g2g ; g2l] and a long query's row is [l2g ; l2l window]; one softmax
over the concatenated row is exactly ETC's two fused softmaxes. q . a^K is computed once per
label ([.., n, V]) and gathered by label id, never built per pair.
"""

from __future__ import annotations

import torch

from graphattn.contract import SideInputs
from graphattn.kernels.request import PlanRequest, direct_request


def full_labels_and_mask(side: SideInputs, num_global: int, num_long: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter the four side-input blocks into one [B, G+L, G_keys+L] label map and a bool mask
    (G_keys = G unless the side inputs carry key-only global slots).

    l2l column c of long query i is key i - r + c; keys outside [0, L) do not exist and stay
    masked whatever the side input says.
    """
    l2l_mask, l2l_ids = side.l2l_att_mask, side.l2l_relative_att_ids
    batch, radius = l2l_mask.shape[0], side.local_radius
    num_keys = side.g2g_att_mask.shape[-1]
    device = l2l_mask.device
    labels = torch.zeros(batch, num_global + num_long, num_keys + num_long, dtype=torch.long, device=device)
    mask = torch.zeros(batch, num_global + num_long, num_keys + num_long, dtype=torch.bool, device=device)
    glob, long = slice(0, num_global), slice(num_global, num_global + num_long)
    glob_keys, long_keys = slice(0, num_keys), slice(num_keys, num_keys + num_long)

    labels[:, glob, glob_keys] = side.g2g_relative_att_ids.long()
    labels[:, glob, long_keys] = side.g2l_relative_att_ids.long()
    labels[:, long, glob_keys] = side.l2g_relative_att_ids.long()
    mask[:, glob, glob_keys] = side.g2g_att_mask != 0
    mask[:, glob, long_keys] = side.g2l_att_mask != 0
    mask[:, long, glob_keys] = side.l2g_att_mask != 0

    query = torch.arange(num_long, device=device)[:, None]
    key = query + torch.arange(-radius, radius + 1, device=device)[None, :]  # [L, 2r+1]
    inside = (key >= 0) & (key < num_long)
    rows = query.expand_as(key)[inside]
    cols = key[inside]
    window_mask = (l2l_mask != 0) & inside
    local_labels = torch.zeros(batch, num_long, num_long, dtype=torch.long, device=device)
    local_mask = torch.zeros(batch, num_long, num_long, dtype=torch.bool, device=device)
    local_labels[:, rows, cols] = l2l_ids.long()[:, inside]
    local_mask[:, rows, cols] = window_mask[:, inside]
    labels[:, long, long_keys] = local_labels
    mask[:, long, long_keys] = local_mask
    return labels, mask


def plan(request: PlanRequest) -> tuple[torch.Tensor, torch.Tensor]:
    """The [B, G+L, G_keys+L] label map and mask, built once per batch."""
    return full_labels_and_mask(request.dense_side(), request.shape.num_global, request.shape.num_long)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global-local attention by brute force; returns (global_out [B,H,G,d], long_out [B,H,L,d])."""
    states = (global_q, global_k, global_v, long_q, long_k, long_v)
    return run(
        plan(direct_request(side, global_q, global_k, long_q, rel_key_table)),
        states,
        rel_key_table,
        rel_bias_table,
        scale,
    )


def run(
    labels_and_mask,
    states,
    rel_key_table: torch.Tensor,
    rel_bias_table: torch.Tensor | None,
    scale: float,
    *,
    global_tables: tuple[torch.Tensor, torch.Tensor | None] | None = None,
):
    """`global_tables` = (a^K, b) of the global queries when they have their own (default: the
    long queries' pair)."""
    global_q, global_k, global_v, long_q, long_k, long_v = states
    labels, mask = labels_and_mask  # [B, N_q, N_k]
    out_dtype = long_q.dtype
    num_global = global_q.shape[2]
    f32 = torch.promote_types(long_q.dtype, torch.float32)  # fp32 statistics; fp64 stays fp64
    q = torch.cat([global_q, long_q], dim=2).to(f32)
    k = torch.cat([global_k, long_k], dim=2).to(f32)
    v = torch.cat([global_v, long_v], dim=2).to(f32)

    heads = q.shape[1]
    label_index = labels[:, None].expand(-1, heads, -1, -1)  # [B, H, N, N]
    global_key_table, global_bias_table = global_tables or (rel_key_table, rel_bias_table)
    sides = ((global_q, global_key_table, global_bias_table), (long_q, rel_key_table, rel_bias_table))
    q_dot_a = torch.cat([torch.einsum("bhnd,vhd->bhnv", x.to(f32), a.to(f32)) for x, a, _ in sides], dim=2)
    scores = q @ k.transpose(-1, -2) + torch.gather(q_dot_a, -1, label_index)  # q_dot_a: [B, H, N, V]
    scores = scores * scale
    if rel_bias_table is not None or global_bias_table is not None:
        bias = torch.cat(
            [
                (b.to(f32).t() if b is not None else q.new_zeros(heads, a.shape[0]))[None, :, None, :].expand(
                    q.shape[0], -1, x.shape[2], -1
                )
                for x, a, b in sides
            ],
            dim=2,
        )  # [B, H, N, V]
        scores = scores + torch.gather(bias, -1, label_index)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))

    # Softmax that gives exact zeros (not NaN) on rows with nothing to attend to.
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = (probs @ v).to(out_dtype)
    return out[:, :, :num_global], out[:, :, num_global:]
