"""The blocked backend's fused plans: chunk sizes, and every chunk's table row and labels, made
once per plan (`prepare`) for the fused operators (fused_op.py), which run a whole pass as one
call of the C++ kernel (kernels/cpu/fused.cpp) on PyTorch's intra-op threads.

The plan's chunks and key spans, as the PyTorch passes in blocked.py have. What differs:

* Labels: the band's come from the plan's skewed index as they are; l2g and g2l rows as runs of
  equal labels; each row's sink label (V, or V + 1 for a row with no allowed key). Every chunk's
  are made at once in C++ on the workers (fused_cpu_labels.chunk_labels), from the dense side inputs or
  from runs over whole rows derived from the compact structure without [rows x keys] tensors
  (structure_runs.py); torch makes them chunk by chunk where C++ cannot take a layout. They are made
  when the batch is planned, outside any compiled region, and kept with the plan (1 KiB per token
  holds them): a layer's call passes only tensors to the operator (FusedChunks).
* Label terms: each block of rows computes its own from the relative key table and bias, so no
  [B, H, L, V] table exists, forward or backward (the operator takes the tables themselves).
* Band: a long block takes the band's keys in BAND_PARTS sub-blocks of rows, each against only the
  keys its rows may see.
* Softmax: the second key set is read in pieces of KEY_BLOCK keys (online softmax), and each
  row's max and log sum are kept for the backward, which recomputes probabilities from them,
  piece by piece.
* Chunks: global chunks of GLOBAL_ROWS rows, long chunks TASKS_PER_WORKER per worker. The
  forward's threads take them as they come, costliest first (no chunk writes another's rows);
  the backward's are dealt to the workers by cost (the operator's deal), a fixed
  deal, and each worker's key-side gradients accumulate in its own buffers (the first
  worker's become the gradients, the others' are kept between calls by the operator), summed in
  worker order: results repeat bit for bit.

Used for fp32 tiles on CPU when the kernel could be built (fused_cpu.available()).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch

from graphattn.kernels import fused_cpu, fused_cpu_labels
from graphattn.kernels.blocked_sources import CompactSource
from graphattn.kernels.blocked_tiles import (
    Geometry,
    chunk_tasks,
    global_chunk_keys,
    global_chunks,
    long_chunk_keys,
)

# Chunks of plans that will run fused: the kernel holds one head's block of rows at a time (its
# own bound, GLOBAL_TILE_BYTES) and the labels are kept as runs, so a chunk holds no tile that
# blocked_tiles.TILE_ELEMENTS would bound; only a `tile_elements` a user gives caps a chunk's
# [B, rows, keys] extent (each worker's share of it). Within that every worker gets
# TASKS_PER_WORKER long chunks (the operator's deal balances their costs) and global
# chunks take up to GLOBAL_ROWS rows (_global_rows).
TASKS_PER_WORKER = 4
# Rows of a global chunk and of the kernel's blocks of global rows: every block streams all the
# chunk's long keys and values through the cache, so more rows per block use each of them more:
# 256 rows ran the global side 1.6x faster than 80 (measured at L = 4096, one core). Blocks take
# fewer rows when GLOBAL_TILE_BYTES of scores cannot hold them.
GLOBAL_ROWS = 256
SMALL_BLOCK_ROWS = 64  # the cost model of _global_rows: 80-row blocks ran 1.4-1.6x slower per score than 256
GLOBAL_TILE_BYTES = 1 << 24
# Keys of the second key set (a global row's long keys, a long row's global keys) per piece of
# the kernel's online softmax: a block of 256 rows then scores [256, G + KEY_BLOCK] at a time,
# which stays in L2 with the piece's keys and values whatever L is.
KEY_BLOCK = 512
# A long block takes the band's keys in BAND_PARTS sub-blocks of rows, each against only the keys
# its rows may see (cpu/passes.h's Part): at w = r = 84 two halves score 210 keys instead of 252,
# which ran the band's matmuls 8% faster (MKL alone; a whole call 2-4%); blocks of fewer than
# BAND_PARTS * BAND_PART_ROWS rows stay whole (smaller matmuls would cost more than they save).
BAND_PARTS = 2
BAND_PART_ROWS = 16
# What a long chunk's score costs against a global chunk's, forward and backward (a block of 84
# long rows reuses each key less than one of 256 global rows): measured 1.06-1.16 at L = 2048
# and 4096. Costs order the forward's chunks and deal the backward's to the workers.
LONG_SCORE_COST = 1.12
# A global chunk's g2g labels are derived this many [row, key] pairs at a time (their masks take
# ~20 bytes a pair while they are built): 256 rows at G = 256, 64 at G = 1024.
G2G_PIECE_ELEMENTS = 1 << 16


def chunking(geo: Geometry, tile_elements: int | None, workers: int, source) -> Geometry:
    """The chunk sizes of a fused plan: `tile_elements` (a worker's share of the user's bound, or
    None: none) caps a chunk's [B, rows, keys] extent."""
    per_block = geo.batch * geo.block * (geo.window + geo.num_global_keys + 1)
    balanced = -(-geo.num_blocks // (TASKS_PER_WORKER * max(workers, 1)))
    per_row = geo.batch * (geo.num_global_keys + geo.num_long + 1)
    blocks = max(1, balanced if tile_elements is None else min(balanced, tile_elements // per_block))
    most = max(1, GLOBAL_ROWS if tile_elements is None else min(GLOBAL_ROWS, tile_elements // per_row))
    rows = _global_rows(geo, source, most) if geo.num_global else most
    return replace(geo, blocks_per_chunk=blocks, global_rows_per_chunk=rows)


def _global_rows(geo: Geometry, source, most: int) -> int:
    """Rows per global chunk, at most `most`, that cost least. A chunk scores its rows against
    every long key any of them may see, and a block of fewer rows reuses each key less: a row of
    n rows' chunk spanning s long keys is taken to cost (G + s)(1 + SMALL_BLOCK_ROWS / n). Soft
    g2l rows all span the document, so the largest chunks win; hard g2l rows (ETC's
    pre-training masks: a sentence's own tokens) span little apiece, and small chunks keep the
    union of their spans small: 32 rows instead of 256 score 4.3x fewer keys at L = 4096."""
    sizes = sorted({most, *(n for n in (16, 32, 64, 128, 256) if n < most)}, reverse=True)

    def cost(rows: int) -> float:
        total = 0.0
        for (start, stop), (lo, hi) in zip(
            global_chunks(replace(geo, global_rows_per_chunk=rows)), source.global_spans(rows)
        ):
            n = stop - start
            total += n * (geo.num_global_keys + max(hi - lo, 0)) * (1 + SMALL_BLOCK_ROWS / n)
        return total

    return min(sizes, key=cost)


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 tiles on CPU, with the kernel built (fp64 and bf16 tiles take the PyTorch path)."""
    return device.type == "cpu" and dtype == torch.float32 and fused_cpu.available()


def likely(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether a plan's calls will run fused, as far as the plan can tell (bf16 and fp16 inputs
    compute in fp32 when they need gradients)."""
    computes_fp32 = dtype in (None, torch.float32, torch.bfloat16, torch.float16)
    return device.type == "cpu" and computes_fp32 and fused_cpu.available()


def why_not(device: torch.device, dtype: torch.dtype) -> str:
    if device.type != "cpu" or dtype != torch.float32:
        return f"it runs fp32 tiles on CPU, and these are {dtype} on {device}"
    return fused_cpu.why_not()


def _global_block(width: int) -> int:
    return max(16, min(GLOBAL_ROWS, GLOBAL_TILE_BYTES // (4 * width)))


# The columns of a chunk table (FusedChunks.table, int64 [chunks, len(COLUMNS)]): which query side,
# its first query row, its rows (the first `valid` exist), the kernel's rows per block, key set A
# (the block at chunk row i sees rows a_start + a_step*i .. + na, a band in a_parts sub-blocks)
# and key set B's keys key_lo ..< key_hi, read key_block at a time.
COLUMNS = ("side", "start", "rows", "valid", "block", "a_start", "a_step", "na", "a_parts", "key_lo", "key_hi")
COLUMNS += ("key_block",)
LONG, GLOBAL = 0, 1
LABEL_TENSORS = 5  # per chunk in FusedChunks.labels: fused_cpu.Labels' fields, in order


@dataclass
class FusedChunks:
    """Every chunk of a fused plan as tensors only, what the fused operators take
    (fused_op.py): the chunk table and each chunk's labels (LABEL_TENSORS tensors apiece: A's
    labels, the sinks, B's runs). Made once per plan (`prepare`), outside any compiled region."""

    table: torch.Tensor
    labels: list[torch.Tensor]

    def side(self, queries: str) -> FusedChunks:
        """The chunks of one query side ("global" or "long"), or all ("both")."""
        if queries == "both":
            return self
        keep = [
            i for i, side in enumerate(self.table[:, 0].tolist()) if side == (GLOBAL if queries == "global" else LONG)
        ]
        labels = [t for i in keep for t in self.labels[i * LABEL_TENSORS : (i + 1) * LABEL_TENSORS]]
        return FusedChunks(self.table[keep], labels)


def prepare(plan, workers: int) -> dict[str, FusedChunks]:
    """The plan's chunks and labels for each `queries` of blocked.run: labels made for every
    chunk at once in C on `workers` threads (fused_cpu_labels.chunk_labels), or by torch where C
    cannot take a layout; rows of a chunk table in chunk_tasks' order."""
    view = _PlanView(plan)
    named, _ = chunk_tasks(view, "both", partial(_ChunkName, "long"), partial(_ChunkName, "global"))
    names = [name() for name in named]
    chunks = _Chunks(view)
    chunks.make_labels(names, workers)
    rows, labels = [], []
    for name in names:
        row, made = chunks.long(*name.span) if name.side == "long" else chunks.global_(*name.span)
        rows.append(row)
        labels += [made.dense, made.sink, made.run_ptr, made.run_start, made.run_label]
    table = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), len(COLUMNS))
    both = FusedChunks(table, labels)
    return {queries: both.side(queries) for queries in ("both", "global", "long")}


class _PlanView:
    """What chunk_tasks and the label makers read of a plan (a CallTensors without the call's tensors)."""

    def __init__(self, plan):
        self.geo, self.source, self.index_cache = plan.geo, plan.source, plan.index_cache
        self.local_index, self.local_empty = plan.local_index, plan.local_empty
        self.long_spans, self.global_spans = plan.long_spans, plan.global_spans


@dataclass(frozen=True)
class _ChunkName:
    side: str  # "long": blocks span[0] ..< span[1]; "global": rows
    first: int
    last: int

    @property
    def span(self) -> tuple[int, int]:
        return self.first, self.last

    def key(self) -> tuple:
        return (f"fused {self.side}", self.first)


class _Chunks:
    """Each chunk's table row and labels: from the side inputs (key set B's as runs,
    structure_runs.py), made for all at once in C where it can (make_labels)."""

    def __init__(self, lay: _PlanView):
        self.lay = lay
        self._made: dict[tuple, fused_cpu.Labels] = {}  # by make_labels

    def make_labels(self, names: list[_ChunkName], workers: int) -> None:
        """The labels of every chunk the plan's cache lacks, in two calls of C on the workers
        (fused_cpu_labels.chunk_labels) instead of a dozen torch ops per chunk here: B's from the dense
        side inputs, or from the structure's runs over whole rows (one derivation per region,
        structure_runs.compact_runs, instead of one per chunk)."""
        lay, geo = self.lay, self.lay.geo
        missing = names
        if not missing or not fused_cpu.available():
            return
        whole = {}
        if isinstance(lay.source, CompactSource):
            for side, rows, keys, region in (
                ("long", geo.num_long, geo.num_global_keys, "l2g"),
                ("global", geo.num_global, geo.num_long, "g2l"),
            ):
                if any(name.side == side for name in missing):
                    runs = getattr(lay.source, f"{region}_runs")(slice(0, rows), slice(0, keys), geo.vocab)
                    whole[side] = fused_cpu_labels.WholeRuns.of(runs, keys)
        blocks = [self._label_block(name, whole.get(name.side)) for name in missing]
        made = fused_cpu_labels.chunk_labels(blocks, geo.batch, geo.vocab, lay.index_cache.dtype, workers)
        self._made = {name.key(): labels for name, labels in zip(missing, made or [])}

    def _label_block(self, name: _ChunkName, whole: fused_cpu_labels.WholeRuns | None) -> fused_cpu_labels.LabelBlock:
        lay, geo, source = self.lay, self.lay.geo, self.lay.source
        if name.side == "global":
            rows, keys = slice(name.first, name.last), global_chunk_keys(lay, name.first)
            a_mask, a_ids = source.g2g(rows)
            b_mask, b_ids = (None, None) if whole else source.g2l(rows, keys)
            count = name.last - name.first
            return fused_cpu_labels.LabelBlock(
                count, count, keys, b_mask, b_ids, whole, name.first, a_mask=a_mask, a_ids=a_ids
            )
        start, rows = name.first * geo.block, (name.last - name.first) * geo.block
        real, keys = min(name.last * geo.block, geo.num_long) - start, long_chunk_keys(lay, name.first)
        b_mask, b_ids = (None, None) if whole else source.l2g(slice(start, start + real), keys)
        band = lay.local_index[:, name.first : name.last].reshape(geo.batch, rows, geo.window)
        empty = lay.local_empty[:, start : start + rows]
        return fused_cpu_labels.LabelBlock(rows, real, keys, b_mask, b_ids, whole, start, a_labels=band, a_empty=empty)

    def _long_labels(self, first: int, last: int, keys: slice) -> fused_cpu.Labels:
        """The band's labels (skewed once per batch, blocked_tiles.local_index) and the l2g runs
        of the global keys `keys`; rows past L get no runs (the kernel never reads them)."""
        lay, geo = self.lay, self.lay.geo
        start, rows = first * geo.block, (last - first) * geo.block
        real = min(last * geo.block, geo.num_long) - start
        runs = lay.source.l2g_runs(slice(start, start + real), keys, geo.vocab)
        empty = lay.local_empty[:, start : start + rows].clone()
        empty[:, :real] &= ~runs.allowed_rows(geo.vocab)
        runs.counts = torch.nn.functional.pad(runs.counts, (0, rows - real))
        band = lay.local_index[:, first:last].reshape(geo.batch, rows, geo.window)
        return fused_cpu.Labels.of(band, empty, runs, geo.vocab, lay.index_cache.dtype)

    def _global_labels(self, start: int, stop: int, keys: slice) -> fused_cpu.Labels:
        """The g2g labels of every global key and the g2l runs of the long keys `keys`."""
        lay, geo = self.lay, self.lay.geo
        step = max(1, G2G_PIECE_ELEMENTS // max(geo.batch * geo.num_global_keys, 1))
        firsts, empties = [], []
        for piece in range(start, stop, step):  # a few pieces of rows: their [rows, G] masks stay small
            mask, ids = lay.source.g2g(slice(piece, min(piece + step, stop)))
            firsts.append(torch.where(mask != 0, ids, geo.vocab).to(lay.index_cache.dtype))
            empties.append(~(mask != 0).any(-1))
        runs = lay.source.g2l_runs(slice(start, stop), keys, geo.vocab)
        empty = torch.cat(empties, 1) & ~runs.allowed_rows(geo.vocab)
        return fused_cpu.Labels.of(torch.cat(firsts, 1), empty, runs, geo.vocab, lay.index_cache.dtype)

    def long(self, first: int, last: int) -> tuple[list[int], fused_cpu.Labels]:
        """Block b's keys are its band window, rows b*w - r .. b*w + w + r of the long keys."""
        geo = self.lay.geo
        keys, start = long_chunk_keys(self.lay, first), first * geo.block
        made = self._made.pop(_ChunkName("long", first, last).key(), None)
        labels = made or self._long_labels(first, last, keys)
        parts = BAND_PARTS if geo.block >= BAND_PARTS * BAND_PART_ROWS else 1
        rows, valid = (last - first) * geo.block, min(last * geo.block, geo.num_long) - start
        row = [LONG, start, rows, valid, geo.block, start - geo.radius, 1, geo.window, parts]
        return [*row, keys.start, keys.stop, KEY_BLOCK], labels

    def global_(self, start: int, stop: int) -> tuple[list[int], fused_cpu.Labels]:
        """Every block sees every global key, then the chunk's long keys."""
        geo = self.lay.geo
        keys = global_chunk_keys(self.lay, start)
        made = self._made.pop(_ChunkName("global", start, stop).key(), None)
        labels = made or self._global_labels(start, stop, keys)
        block = min(stop - start, _global_block(geo.num_global_keys + min(keys.stop - keys.start, KEY_BLOCK) + 1))
        row = [GLOBAL, start, stop - start, stop - start, block, 0, 0, geo.num_global_keys, 1]
        return [*row, keys.start, keys.stop, KEY_BLOCK], labels


def release_workspace() -> None:
    """Drop the backward's kept accumulators (the operator keeps those of workers 1, 2, ...
    between calls, up to 256 MiB: kernels/cpu/fused.cpp; the next backward makes them again):
    after the longest batches of a run, say, or before measuring what one call needs."""
    if fused_cpu.loaded():
        torch.ops.graphattn.release_workspace()
