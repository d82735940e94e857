"""The Python side of fused_cpu_labels.c: the fused kernel's labels made in C, from dense side
inputs (the band's skewed labels, rows' key extents) and for every chunk
of a pass at once (`chunk_labels`, on the kernel's OpenMP threads), from dense blocks or from
runs over whole rows derived from the compact structure. Each returns None where the kernel
is not built or a tensor is not laid out for it; the callers then use torch."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from graphattn.kernels.fused_cpu import _LABEL_BYTES, Labels, _ptr, _threads, library
from graphattn.kernels.structure_runs import Runs


class ChunkLabels(ctypes.Structure):
    """Mirror of the C struct `ChunkLabels` of fused_cpu_labels.c (field for field, same order)."""

    _fields_ = [
        ("b_mask", ctypes.c_void_p),
        ("b_ids", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("b_batch", "b_row", "m")),
        *((name, ctypes.c_void_p) for name in ("whole_ptr", "whole_start", "whole_label")),
        *((name, ctypes.c_int64) for name in ("whole_rows", "whole_keys", "row0", "key0")),
        ("a_mask", ctypes.c_void_p),
        ("a_ids", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("a_batch", "a_row", "na")),
        ("a_out", ctypes.c_void_p),
        ("a_empty", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("a_empty_batch", "batch", "rows", "valid_rows")),
        *((name, ctypes.c_void_p) for name in ("run_ptr", "start", "label", "sink")),
    ]


_SIGNED: list[ctypes.CDLL] = []  # the library whose signatures were set last


def _lib() -> ctypes.CDLL | None:
    """The kernel's library with these functions' signatures set (None where it is not built)."""
    lib = library()
    if lib is None or (_SIGNED and _SIGNED[0] is lib):
        return lib
    _SIGNED[:] = [lib]
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.graphattn_dense_band.argtypes = [ptr, ptr, *[i64] * 7, ctypes.c_int32, ptr, i64, ptr]
    lib.graphattn_dense_band.restype = None
    lib.graphattn_dense_extents.argtypes = [ptr, i64, i64, i64, ptr, ptr]
    lib.graphattn_dense_extents.restype = None
    lib.graphattn_chunk_labels.argtypes = [ctypes.POINTER(ChunkLabels), i64, i64, ctypes.c_int32, i64, ctypes.c_int]
    lib.graphattn_chunk_labels.restype = None
    return lib


def _dense_blocks_usable(*blocks: torch.Tensor) -> bool:
    """Dense int32 CPU blocks laid out alike with contiguous rows (the side inputs' slices are)."""
    first = blocks[0]
    return _lib() is not None and all(
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
        return _lib() is not None and b_given and a_given and empty

    def described(self, batch: int, out: Labels) -> ChunkLabels:
        """The C description, writing into `out` (its A labels, sinks and run pointer)."""
        b, a, whole, empty = self.b_mask, self.a_mask, self.whole, self.a_empty
        return ChunkLabels(
            b_mask=_ptr(b), b_ids=_ptr(self.b_ids), b_batch=0 if b is None else b.stride(0),
            b_row=0 if b is None else b.stride(1), m=self.keys.stop - self.keys.start,
            whole_ptr=None if whole is None else _ptr(whole.ptr),
            whole_start=None if whole is None else _ptr(whole.runs.start),
            whole_label=None if whole is None else _ptr(whole.runs.label),
            whole_rows=0 if whole is None else whole.runs.counts.shape[1],
            whole_keys=0 if whole is None else whole.keys, row0=self.row0, key0=self.keys.start,
            a_mask=_ptr(a), a_ids=_ptr(self.a_ids), a_batch=0 if a is None else a.stride(0),
            a_row=0 if a is None else a.stride(1), na=0 if a is None else a.shape[2], a_out=_ptr(out.dense),
            a_empty=_ptr(empty), a_empty_batch=0 if empty is None else empty.stride(0),
            batch=batch, rows=self.rows, valid_rows=self.valid_rows, run_ptr=_ptr(out.run_ptr), sink=_ptr(out.sink),
        )  # fmt: skip


def chunk_labels(
    blocks: list[LabelBlock], batch: int, vocab: int, dtype: torch.dtype, workers: int
) -> list[Labels] | None:
    """Every chunk's Labels in two calls of C (fused_cpu_labels.c: A's labels, sinks and run
    counts; then the runs), the chunks shared among `workers` OpenMP threads; None where the
    kernel is not available or a block is not laid out for it."""
    if not blocks or not all(block.usable() for block in blocks):
        return None
    made = []
    for block in blocks:
        a_labels = block.a_labels
        if block.a_mask is not None:
            a_labels = torch.empty(batch, block.rows, block.a_mask.shape[2], dtype=dtype)
        sink = torch.empty(batch, block.rows, dtype=dtype)
        run_ptr = torch.empty(batch * block.rows + 1, dtype=torch.int64)
        made.append(Labels(a_labels, sink, run_ptr, run_start=None, run_label=None))  # the runs: after counting
    array = (ChunkLabels * len(blocks))(*(block.described(batch, labels) for block, labels in zip(blocks, made)))
    threads, bytes_ = _threads(max(1, min(workers, len(blocks)))), _LABEL_BYTES[dtype]
    _lib().graphattn_chunk_labels(array, len(blocks), threads, vocab, bytes_, 0)
    for labels, chunk in zip(made, array):
        # the count read through C's pointer: a layer's loop reads no tensor back (as on a GPU)
        runs = ctypes.cast(chunk.run_ptr, ctypes.POINTER(ctypes.c_int64))[labels.run_ptr.numel() - 1]
        labels.run_start, labels.run_label = (torch.empty(runs, dtype=torch.int32) for _ in range(2))
        chunk.start, chunk.label = _ptr(labels.run_start), _ptr(labels.run_label)
    _lib().graphattn_chunk_labels(array, len(blocks), threads, vocab, bytes_, 1)
    return made


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
    mask and ids (offsets -r .. r at columns col0 .. col0 + 2r), in one pass of C; None where
    the kernel is not available or the tensors are not contiguous int32."""
    if not (_dense_blocks_usable(mask, ids) and mask.is_contiguous()):
        return None
    batch, length, width = mask.shape
    window = block + 2 * radius
    index = torch.empty(batch, blocks, block, window, dtype=dtype)
    empty = torch.empty(batch, blocks * block, dtype=torch.bool)
    _lib().graphattn_dense_band(
        _ptr(mask), _ptr(ids), batch, length, width, col0, radius, block, blocks, vocab, _ptr(index),
        _LABEL_BYTES[dtype], _ptr(empty),
    )  # fmt: skip
    return index, empty


def dense_extents(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per row of a dense [B, n, m] int32 mask: its first allowed column and one past its last
    ([B, n] int32 each; m and 0 for a row with none), scanned from both ends in C; None where
    the kernel is not available or the mask's rows are not contiguous int32."""
    if not _dense_blocks_usable(mask):
        return None
    batch, rows, m = mask.shape
    first, last = (torch.empty(batch, rows, dtype=torch.int32) for _ in range(2))
    for b in range(batch):
        _lib().graphattn_dense_extents(_ptr(mask[b]), rows, m, mask.stride(1), _ptr(first[b]), _ptr(last[b]))
    return first, last
