"""The fused kernel's labels made by its operators (kernels/cpu/labels.cpp: graphattn::dense_band,
dense_extents, chunk_labels): from dense side inputs (the band's skewed labels, rows' key
extents) and for every chunk of a pass at once (`chunk_labels`, on PyTorch's intra-op threads),
from dense blocks or from runs over whole rows derived from the compact structure. Each returns
None where the kernel is not built or a tensor is not laid out for it; the callers then use
torch. The operators check every tensor they read; the layout checks here only choose the path."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphattn.kernels.fused_cpu import Labels, available
from graphattn.kernels.structure_runs import Runs


def _dense_blocks_usable(*blocks: torch.Tensor) -> bool:
    """Dense int32 CPU blocks laid out alike with contiguous rows (the side inputs' slices are)."""
    first = blocks[0]
    return available() and all(
        t.dtype == torch.int32 and t.device.type == "cpu" and t.stride(-1) == 1 and t.stride() == first.stride()
        for t in blocks
    )


@dataclass
class WholeRuns:
    """Runs over whole rows of a region (structure_runs.Runs of [B, n, keys]), with their CSR
    row pointer [B*n + 1], for chunks to take their rows and keys of."""

    runs: Runs
    ptr: torch.Tensor
    keys: int

    @staticmethod
    def of(runs: Runs, keys: int) -> WholeRuns:
        ptr = torch.zeros(runs.counts.numel() + 1, dtype=torch.int64)
        torch.cumsum(runs.counts.flatten(), 0, out=ptr[1:])
        return WholeRuns(runs, ptr, keys)


@dataclass
class LabelBlock:
    """One chunk's sources of labels: `rows` (the kernel's; the first `valid_rows` exist) against
    `keys` (a slice of key set B), B's labels either as the [B, valid, m] dense mask and ids
    (`b_mask`, `b_ids`) or taken from `whole` runs over whole rows from row `row0`; and key set
    A's either made already (`a_labels` [B, rows, na], the band's view, with `a_empty` [B, rows]
    bool, its rows with no allowed key) or as [B, valid, na] mask and ids (`a_mask`, `a_ids`:
    the g2g rows) whose labels are made with the rest."""

    rows: int
    valid_rows: int
    keys: slice
    b_mask: torch.Tensor | None = None
    b_ids: torch.Tensor | None = None
    whole: WholeRuns | None = None
    row0: int = 0
    a_labels: torch.Tensor | None = None
    a_empty: torch.Tensor | None = None
    a_mask: torch.Tensor | None = None
    a_ids: torch.Tensor | None = None

    def usable(self) -> bool:
        b_given = self.whole is not None if self.b_mask is None else _dense_blocks_usable(self.b_mask, self.b_ids)
        a_given = self.a_mask is None or _dense_blocks_usable(self.a_mask, self.a_ids)
        empty = self.a_empty is None or (self.a_empty.dtype == torch.bool and self.a_empty.stride(-1) == 1)
        return available() and b_given and a_given and empty


def chunk_labels(
    blocks: list[LabelBlock], batch: int, vocab: int, dtype: torch.dtype, workers: int
) -> list[Labels] | None:
    """Every chunk's Labels in one call of the chunk_labels operator (A's labels, sinks and run
    counts, then the runs), the chunks shared among up to `workers` threads; None where the
    kernel is not available or a block is not laid out for it."""
    if not blocks or not all(block.usable() for block in blocks):
        return None
    whole = [block.whole for block in blocks]
    geometry = []
    for block in blocks:
        runs = block.whole.runs.counts.shape[1] if block.whole is not None else 0
        keys = block.whole.keys if block.whole is not None else 0
        geometry += [block.rows, block.valid_rows, block.keys.start, block.keys.stop, block.row0, runs, keys]
    made = torch.ops.graphattn.chunk_labels(
        [block.b_mask for block in blocks],
        [block.b_ids for block in blocks],
        [block.a_mask for block in blocks],
        [block.a_ids for block in blocks],
        [block.a_empty if block.a_mask is None else None for block in blocks],
        [None if w is None else w.ptr for w in whole],
        [None if w is None else w.runs.start for w in whole],
        [None if w is None else w.runs.label for w in whole],
        geometry,
        batch,
        vocab,
        dtype,
        workers,
    )
    labels = []
    for i, block in enumerate(blocks):
        a_out, sink, run_ptr, run_start, run_label = made[5 * i : 5 * i + 5]
        labels.append(
            Labels(a_out if block.a_mask is not None else block.a_labels, sink, run_ptr, run_start, run_label)
        )
    return labels


def dense_band(
    mask: torch.Tensor,
    ids: torch.Tensor,
    col0: int,
    radius: int,
    block: int,
    blocks: int,
    vocab: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """blocked_tiles.local_index's skewed band labels [B, blocks, block, block + 2r] (`dtype`)
    and the rows without an allowed key [B, blocks * block], from the dense [B, L, width] l2l
    mask and ids (offsets -r .. r at columns col0 .. col0 + 2r), in one pass; None where the
    kernel is not available or the tensors are not contiguous int32."""
    if not (_dense_blocks_usable(mask, ids) and mask.is_contiguous() and ids.is_contiguous()):
        return None
    return torch.ops.graphattn.dense_band(mask, ids, col0, radius, block, blocks, vocab, dtype)


def dense_extents(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per row of a dense [B, n, m] int32 mask: its first allowed column and one past its last
    ([B, n] int32 each; m and 0 for a row with none), scanned from both ends; None where the
    kernel is not available or the mask's rows are not contiguous int32."""
    if not _dense_blocks_usable(mask):
        return None
    return torch.ops.graphattn.dense_extents(mask)
