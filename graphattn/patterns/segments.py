"""Cutting one compiled long batch into consecutive segments, and widening a segment's side
inputs with memory keys: the two pieces of plumbing the compressive encoder needs.

A segment keeps long tokens [s, s + n_s) and the global tokens that attend to or are attended by
one of them (for every row of the batch: the union, so that the batch stays rectangular). Local
windows are cut at the segment edges: what lies before the segment is reached through memory.

Memory keys enter a segment as extra global KEY slots after its own global tokens, ordered
[globals; compressed memory; memory]. They are keys only: the side inputs keep G query rows
(g2g [B, G, G+C+M], g2g/g2l rows for the segment's own globals), and every ETC backend computes
nothing for the memory slots' queries. Labels:
  long query -> memory key       the relative-distance id of (key position - query position) in
                                 the stream, clipped at k like l2l ids: the last tokens of the
                                 previous segment keep their exact distances, older ones read
                                 "far left" (TransformerXL's relative positions, in ETC's
                                 clipped-distance vocabulary)
  long query -> compressed key   `compressed_label`: one id (a compressed slot has no single
                                 position)
  global query -> memory key     `memory_label`;  global query -> compressed key `compressed_label`
"""

from __future__ import annotations

from dataclasses import replace

import torch

from graphattn.contract import EtcBatch, SideInputs
from graphattn.errors import BatchError


def clipped_distance_ids(delta: torch.Tensor, max_distance: int) -> torch.Tensor:
    """etcmodel's relative ids for delta = key - query: 0 same, 1..k right, k+1..2k left."""
    clipped = delta.clamp(-max_distance, max_distance)
    return torch.where(clipped >= 0, clipped, max_distance - clipped).to(torch.int32)


def _segment_globals(side: SideInputs, rows: slice) -> torch.Tensor:
    """Indices of the global tokens linked (either direction) to a long token in `rows`."""
    linked = (side.g2l_att_mask[:, :, rows] != 0).any(dim=-1) | (side.l2g_att_mask[:, rows, :] != 0).any(dim=1)
    return torch.nonzero(linked.any(dim=0)).flatten()


def _cut_local_windows(l2l_mask: torch.Tensor, rows: slice) -> torch.Tensor:
    """Zero the l2l window columns whose key falls outside the segment."""
    width = l2l_mask.shape[-1]
    radius = (width - 1) // 2
    query = torch.arange(rows.start, rows.stop, device=l2l_mask.device)[:, None]
    key = query + torch.arange(-radius, radius + 1, device=l2l_mask.device)[None, :]
    inside = (key >= rows.start) & (key < rows.stop)
    return l2l_mask[:, rows] * inside.to(l2l_mask.dtype)


def _cut_features(features: dict, rows: slice, keep: torch.Tensor, long_length: int, global_length: int) -> dict:
    out = {}
    for name, value in features.items():
        if long_length == global_length:
            raise BatchError(
                f"cannot tell whether feature {name!r} is per long or per global token (L = G = {long_length})",
                path=("features", name),
            )
        if value.shape[1] == long_length:
            out[name] = value[:, rows]
        elif value.shape[1] == global_length:
            out[name] = value[:, keep]
        else:
            raise BatchError(
                f"feature {name!r} has length {value.shape[1]}, neither L = {long_length} nor G = {global_length}",
                path=("features", name),
            )
    return out


def split_segments(batch: EtcBatch, segment_length: int) -> list[tuple[EtcBatch, torch.Tensor]]:
    """Consecutive segments of `segment_length` long tokens (the last may be shorter), each with
    the index of the global tokens it kept (into the batch's global dim)."""
    if segment_length < 1:
        raise BatchError(f"segment_length must be >= 1, got {segment_length}", path=("segment_length",))
    side = batch.side.to_torch()
    long_length, global_length = batch.long_token_ids.shape[1], batch.global_token_ids.shape[1]
    segments = []
    for start in range(0, long_length, segment_length):  # per segment, not per token
        rows = slice(start, min(start + segment_length, long_length))
        keep = _segment_globals(side, rows)
        cut = SideInputs(
            l2l_att_mask=_cut_local_windows(side.l2l_att_mask, rows),
            g2g_att_mask=side.g2g_att_mask[:, keep][:, :, keep],
            l2g_att_mask=side.l2g_att_mask[:, rows][:, :, keep],
            g2l_att_mask=side.g2l_att_mask[:, keep][:, :, rows],
            l2l_relative_att_ids=side.l2l_relative_att_ids[:, rows],
            g2g_relative_att_ids=side.g2g_relative_att_ids[:, keep][:, :, keep],
            l2g_relative_att_ids=side.l2g_relative_att_ids[:, rows][:, :, keep],
            g2l_relative_att_ids=side.g2l_relative_att_ids[:, keep][:, :, rows],
        )
        segment = replace(
            batch,
            long_token_ids=batch.long_token_ids[:, rows],
            long_type_ids=batch.long_type_ids[:, rows],
            long_input_mask=batch.long_input_mask[:, rows],
            global_token_ids=batch.global_token_ids[:, keep],
            global_type_ids=batch.global_type_ids[:, keep],
            global_input_mask=batch.global_input_mask[:, keep],
            side=cut,
            features=_cut_features(batch.features, rows, keep, long_length, global_length),
        )
        segments.append((segment, keep))
    return segments


def widen_with_memory(
    side: SideInputs,
    query_positions: torch.Tensor,
    compressed_valid: torch.Tensor,
    memory_positions: torch.Tensor,
    memory_valid: torch.Tensor,
    *,
    max_distance: int,
    memory_label: int,
    compressed_label: int,
) -> SideInputs:
    """Side inputs of a segment with [compressed; memory] appended as key-only global slots.

    query_positions [B, L]: stream positions of the segment's long tokens; compressed_valid
    [B, C]; memory_positions / memory_valid [B, M]. Returns side inputs with G query rows and
    G + C + M global keys: g2g [B, G, G+C+M], l2g [B, L, G+C+M], g2l unchanged [B, G, L].
    """
    batch, num_global = side.g2g_att_mask.shape[0], side.g2g_att_mask.shape[-1]
    num_long = side.l2l_att_mask.shape[1]
    num_compressed, num_memory = compressed_valid.shape[1], memory_valid.shape[1]
    extra = num_compressed + num_memory
    if extra == 0:
        return side
    device, itype = side.g2g_att_mask.device, side.g2g_att_mask.dtype
    key_valid = torch.cat((compressed_valid, memory_valid), dim=1).to(itype)  # [B, C+M]
    key_label = torch.cat(
        (
            torch.full((batch, num_compressed), compressed_label, dtype=torch.int32, device=device),
            torch.full((batch, num_memory), memory_label, dtype=torch.int32, device=device),
        ),
        dim=1,
    )
    g2g_mask = torch.cat((side.g2g_att_mask, key_valid[:, None, :].expand(-1, num_global, -1)), dim=2)
    g2g_ids = torch.cat(
        (side.g2g_relative_att_ids.to(torch.int32), key_label[:, None, :].expand(-1, num_global, -1)), dim=2
    )
    memory_ids = clipped_distance_ids(
        memory_positions[:, None, :] - query_positions[:, :, None], max_distance
    )  # [B, L, M]
    compressed_ids = torch.full((batch, num_long, num_compressed), compressed_label, dtype=torch.int32, device=device)
    return SideInputs(
        l2l_att_mask=side.l2l_att_mask,
        g2g_att_mask=g2g_mask,
        l2g_att_mask=torch.cat((side.l2g_att_mask, key_valid[:, None, :].expand(-1, num_long, -1)), dim=2),
        g2l_att_mask=side.g2l_att_mask,
        l2l_relative_att_ids=side.l2l_relative_att_ids,
        g2g_relative_att_ids=g2g_ids,
        l2g_relative_att_ids=torch.cat((side.l2g_relative_att_ids.to(torch.int32), compressed_ids, memory_ids), dim=2),
        g2l_relative_att_ids=side.g2l_relative_att_ids,
    )
