"""Where the blocked backend's chunks read their masks and labels: dense side inputs (slices) or
the batch's compact structure (derived per chunk, so a 128K-token batch never holds an [L, G]
tensor: a chunk's block is what the tile budget allows, and the compact form is O(L + G + E)).

Both sources answer the same questions, in [B, rows, columns] int32 (mask, ids) blocks:

    l2l()                     the band [B, L, 2r+1], once per batch
    l2g(rows, cols)           long queries `rows` x global keys `cols`
    g2l(rows, cols)           global queries x long keys
    g2g(rows)                 global queries x every global key
    long_spans / global_spans per chunk of query rows, the [lo, hi) of the keys any of them may see

and `plan_chunks` is told the chunks a batch will use, once, so that the compact source selects
each chunk's links and edges when the batch is planned, not inside a layer.
"""

from __future__ import annotations

from functools import cached_property

import torch

from graphattn.compact import CompactBatch
from graphattn.contract import SideInputs
from graphattn.kernels import fused_cpu_labels, structure
from graphattn.kernels.structure_runs import Runs, compact_runs, runs_of

# Elements of dense labels compared at once when a dense source's rows are turned into runs.
RUN_PIECE_ELEMENTS = 1 << 18


class DenseSource:
    """Slices of the eight dense side inputs (torch, batched)."""

    def __init__(self, side: SideInputs):
        self.side = side
        self.radius = side.local_radius
        self.batch = side.l2g_att_mask.shape[0]

    def l2l(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.side.l2l_att_mask, self.side.l2l_relative_att_ids

    def l2g(self, rows: slice, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return self.side.l2g_att_mask[:, rows, cols], self.side.l2g_relative_att_ids[:, rows, cols]

    def g2l(self, rows: slice, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return self.side.g2l_att_mask[:, rows, cols], self.side.g2l_relative_att_ids[:, rows, cols]

    def g2g(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return self.side.g2g_att_mask[:, rows], self.side.g2g_relative_att_ids[:, rows]

    def long_spans(self, rows_per_chunk: int) -> list[tuple[int, int]]:
        return _range_spans(*_mask_ranges(self.side.l2g_att_mask), rows_per_chunk)

    def global_spans(self, rows_per_chunk: int) -> list[tuple[int, int]]:
        return _range_spans(*self._global_ranges, rows_per_chunk)

    @cached_property
    def _global_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per global query, the [first, last + 1) of the long keys it may see: one pass over
        g2l, then any chunking is cheap."""
        return _mask_ranges(self.side.g2l_att_mask)

    def plan_chunks(self, long_blocks: list[tuple[slice, slice]], global_blocks: list[tuple[slice, slice]]) -> None:
        """Nothing to select: slices are cheap."""

    def l2g_runs(self, rows: slice, cols: slice, vocab: int) -> Runs:
        return _dense_runs(self.l2g, self.batch, rows, cols, vocab)

    def g2l_runs(self, rows: slice, cols: slice, vocab: int) -> Runs:
        return _dense_runs(self.g2l, self.batch, rows, cols, vocab)


class CompactSource:
    """The rules of graphattn.kernels.structure applied to one block at a time."""

    def __init__(self, compact: CompactBatch):
        self.compact = compact
        self.radius = compact.local_radius
        self._links: dict[tuple, structure.Links] = {}

    def l2l(self) -> tuple[torch.Tensor, torch.Tensor]:
        return structure.dense_l2l(self.compact)

    def l2g(self, rows: slice, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return structure.dense_l2g(
            self.compact, rows, cols, self._links.get(("l2g", rows.start, rows.stop, cols.start, cols.stop))
        )

    def g2l(self, rows: slice, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return structure.dense_g2l(
            self.compact, rows, cols, self._links.get(("g2l", rows.start, rows.stop, cols.start, cols.stop))
        )

    def g2g(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return structure.dense_g2g(self.compact, rows, self._links.get(("g2g", rows.start, rows.stop)))

    def long_spans(self, rows_per_chunk: int) -> list[tuple[int, int]]:
        return _range_spans(*structure.allowed_key_range(self.compact, "l2g"), rows_per_chunk)

    def global_spans(self, rows_per_chunk: int) -> list[tuple[int, int]]:
        return _range_spans(*self._global_ranges, rows_per_chunk)

    @cached_property
    def _global_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        return structure.allowed_key_range(self.compact, "g2l")

    def plan_chunks(self, long_blocks: list[tuple[slice, slice]], global_blocks: list[tuple[slice, slice]]) -> None:
        """Select every block's links and edges now (boolean selections read sizes back)."""
        c = self.compact
        for rows, cols in long_blocks:
            self._links[("l2g", rows.start, rows.stop, cols.start, cols.stop)] = structure.links_in(c, rows, cols)
        for rows, cols in global_blocks:
            self._links[("g2l", rows.start, rows.stop, cols.start, cols.stop)] = structure.links_in(
                c, cols, rows, global_major=True
            )
            self._links[("g2g", rows.start, rows.stop)] = structure.edges_in(c, rows)

    def l2g_runs(self, rows: slice, cols: slice, vocab: int) -> Runs:
        links = self._links.get(("l2g", rows.start, rows.stop, cols.start, cols.stop))
        links = structure.links_in(self.compact, rows, cols) if links is None else links
        return compact_runs(self.compact, "l2g", rows, cols, links, vocab)

    def g2l_runs(self, rows: slice, cols: slice, vocab: int) -> Runs:
        links = self._links.get(("g2l", rows.start, rows.stop, cols.start, cols.stop))
        links = structure.links_in(self.compact, cols, rows, global_major=True) if links is None else links
        return compact_runs(self.compact, "g2l", rows, cols, links, vocab)


def source_of(structure_or_side: SideInputs | CompactBatch) -> DenseSource | CompactSource:
    return (
        CompactSource(structure_or_side)
        if isinstance(structure_or_side, CompactBatch)
        else DenseSource(structure_or_side)
    )


def _dense_runs(region, batch: int, rows: slice, cols: slice, vocab: int) -> Runs:
    """Runs of a region's dense rows, with torch a piece of rows at a time (RUN_PIECE_ELEMENTS
    labels). The fused kernel's chunks get theirs in C++ (fused_cpu_labels.chunk_labels); these
    serve the layouts it cannot take."""
    step = max(1, RUN_PIECE_ELEMENTS // max(batch * (cols.stop - cols.start), 1))
    parts = []
    for start in range(rows.start, rows.stop, step):
        mask, ids = region(slice(start, min(start + step, rows.stop)), cols)
        parts.append(runs_of(torch.where(mask != 0, ids, vocab)))
    if not parts:
        none = torch.zeros(0, dtype=torch.int32)
        return Runs(torch.zeros(batch, 0, dtype=torch.int64), none, none)
    return Runs.cat(parts, batch)


def _mask_ranges(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a [B, n, m] mask, the [first, last + 1) of the columns it allows, [B, n] int32
    each ((m, 0) for none): scanned from both ends in C where the kernel is built, else with
    torch over the whole mask."""
    in_c = fused_cpu_labels.dense_extents(mask)
    if in_c is not None:
        return in_c
    allowed = mask != 0
    some, width = allowed.any(-1), allowed.shape[-1]
    first = allowed.to(torch.uint8).argmax(-1)
    last = width - allowed.flip(-1).to(torch.uint8).argmax(-1)
    return torch.where(some, first, width).int(), torch.where(some, last, 0).int()


def _range_spans(lo: torch.Tensor, hi: torch.Tensor, rows_per_chunk: int) -> list[tuple[int, int]]:
    """Per chunk of query rows, the union [min lo, max hi) over its rows and the batch ((0, 0)
    where it is empty)."""
    first = structure.tile_min(lo.amin(0, keepdim=True), rows_per_chunk)[0]
    last = structure.tile_max(hi.amax(0, keepdim=True), rows_per_chunk)[0]
    return [(a, b) if b > a else (0, 0) for a, b in zip(first.tolist(), last.tolist())]
