"""The compact side inputs: what the eight ETC tensors are derived from, in O(L + G + E) memory.

For inputs far past 4K tokens the dense [L, G] / [G, L] / [G, G] tensors are the memory problem
(a 1M-token document with 60K sentence globals would need 240 GB per [L, G] tensor). Every entry
of them is a function of a few per-token and per-global arrays plus a sparse edge list, so the
compiler stores those and derives dense rows on demand (`to_dense`, `l2g_rows`, ...):

    l2l[i, c]  key j = i + c - r: mask = 0 <= j < L and long_segment[j] == long_segment[i]
               ids = clipped distance (0 same, 1..k right, k+1..2k left), the mask handles edges
    g2g[g, h]  mask = same document, unless blocked across segments (blockable g and h)
               ids = clipped distance h - g; `cross_segment_label` across segments; g2g edges last
    l2g[i, g]  ids = belongs if g owns i at some level, an edge label if i and g are linked,
               else does_not_belong;  g2l[g, i] carries the same ids
               mask = same document and (owned or linked or long query i not under hard l2g)
    g2l[g, i]  mask = same document and (owned or linked or global query g not under hard g2l)

Hard masks are per query row, as in etcmodel (`ignore_hard_l2g_mask` [L], `ignore_hard_g2l_mask`
[G]): an exempt row sees its whole document; no column is ever exempt.

`long_segment` numbers contiguous runs that may attend each other (documents, segment nodes and
padding all start new runs), so l2l needs no separate document test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from graphattn.errors import BatchError
from graphattn.labels import (
    SideInputError,
    belongs_id,
    does_not_belong_id,
    full_relative_ids,
    local_relative_ids,
    relative_position_ids,
)
from graphattn.side import SIDE_INPUT_NAMES, SideInputs


# -- numpy building blocks shared with compile/side_inputs.py ----------------------------------
def _flat_view(out: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """`out` reshaped without a copy, so that writes land in it; int32, C-contiguous."""
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.int32
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise SideInputError(f"{name} must be a writable C-contiguous int32 numpy array")
    if out.size != int(np.prod(shape)):
        raise SideInputError(f"{name} has {out.size} elements; expected shape {list(shape)}")
    return out.reshape(shape)


def window_view(values: Any, local_radius: int, fill: int) -> np.ndarray:
    """``out[..., i, c] = values[..., i + c - r]``, or `fill` where that is outside [0, L).

    A read-only strided view over one padded copy, [.., L, 2r+1]: compare it with
    ``values[..., None]`` to get any "same X" relation restricted to the local window.
    """
    values = np.asarray(values)
    pad = [(0, 0)] * (values.ndim - 1) + [(local_radius, local_radius)]
    padded = np.pad(values, pad, constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(padded, 2 * local_radius + 1, axis=-1)


def l2l_window(
    long_example_ids: Any,
    local_radius: int,
    max_distance: int,
    *,
    out_mask: np.ndarray | None = None,
    out_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Local attention [.., L, 2r+1]: mask (same example, key inside the sequence) and ids.

    Example ids must be non-negative (-1 marks keys outside the sequence). The ids do not look
    at the mask: every row is the same distance pattern, edges and padding included. `out_*`
    are int32 arrays to write into (see `allocate_side_inputs`).
    """
    ids = np.asarray(long_example_ids, dtype=np.int32)
    shape = (*ids.shape, 2 * local_radius + 1)
    mask = np.empty(shape, dtype=np.int32) if out_mask is None else _flat_view(out_mask, shape, "out_mask")
    np.equal(window_view(ids, local_radius, fill=-1), ids[..., None], out=mask, casting="unsafe")
    if max_distance == 0:
        return mask, None
    relative = np.empty(shape, dtype=np.int32) if out_ids is None else _flat_view(out_ids, shape, "out_ids")
    relative[...] = local_relative_ids(local_radius, max_distance)
    return mask, relative


def _row_codes(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a row and each element's index into them (no sort for small ids)."""
    if row.size and row.min() >= 0 and row.max() <= row.size:
        return np.arange(int(row.max()) + 1, dtype=row.dtype), row
    values, inverse = np.unique(row, return_inverse=True)
    return values, inverse.reshape(-1)


def same_segment(query_ids: Any, key_ids: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """``out[..., q, k] = query_ids[..., q] == key_ids[..., k]`` as int32 0/1, [.., Q, K].

    Rows of equal query id are equal, so each distinct id's row is built once and the output
    is a row gather: much cheaper than a broadcast comparison plus a cast when ids are few
    (documents, segments).
    """
    query = np.asarray(query_ids, dtype=np.int32)
    key = np.asarray(key_ids, dtype=np.int32)
    batch, q_len, k_len = query.shape[:-1], query.shape[-1], key.shape[-1]
    if out is None:
        out = np.empty((*batch, q_len, k_len), dtype=np.int32)
    n_rows = int(np.prod(batch, dtype=np.int64))
    query_rows, key_rows = query.reshape(n_rows, q_len), key.reshape(n_rows, k_len)
    flat = _flat_view(out, (n_rows * q_len, k_len), "out")
    tables, indices, offset = [], [], 0
    for query_row, key_row in zip(query_rows, key_rows):
        values, codes = _row_codes(query_row)
        tables.append((values[:, None] == key_row[None, :]).astype(np.int32))
        indices.append(codes + offset)
        offset += len(values)
    if tables and q_len and k_len:
        table = tables[0] if len(tables) == 1 else np.concatenate(tables)
        index = indices[0] if len(indices) == 1 else np.concatenate(indices)
        # mode="clip" (indices are in range by construction) lets numpy write `out` unbuffered
        np.take(table, index, axis=0, out=flat, mode="clip")
    return out


def allocate_side_inputs(
    batch_size: int, long_length: int, global_length: int, local_radius: int, with_ids: bool = True
) -> SideInputs:
    """Uninitialized int32 arrays for the eight tensors, carved out of ONE buffer.

    Why: the tensors are freshly written memory, and first touches of memory are page faults.
    numpy maps buffers of 4 MiB and more with transparent huge pages, so one 22 MB buffer costs
    a few hundred faults where eight separate arrays (the l2l ones under 4 MiB) cost thousands:
    measured at L=4096, G=256, r=84 on 2 cores, 0.7 ms against 6-9 ms for the same work.
    The arrays are views; the buffer lives as long as any of them. The id fields are None
    without `with_ids`.
    """
    window = 2 * local_radius + 1
    shapes = {
        "l2l_att_mask": (batch_size, long_length, window),
        "g2g_att_mask": (batch_size, global_length, global_length),
        "l2g_att_mask": (batch_size, long_length, global_length),
        "g2l_att_mask": (batch_size, global_length, long_length),
    }
    if with_ids:
        shapes.update({name.replace("att_mask", "relative_att_ids"): shape for name, shape in list(shapes.items())})
    sizes = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    buffer = np.empty(sum(sizes.values()), dtype=np.int32)
    arrays: dict[str, np.ndarray | None] = dict.fromkeys(SIDE_INPUT_NAMES)
    start = 0
    for name, shape in shapes.items():
        arrays[name] = buffer[start : start + sizes[name]].reshape(shape)
        start += sizes[name]
    return SideInputs(**arrays)


# -- the compact form ---------------------------------------------------------------------------


@dataclass
class CompactSideInputs:
    """Per-token / per-global arrays and edge lists from which the eight tensors follow.

    Owners are global positions (-1: none), one row per hierarchy level (`levels`). Pairs in
    `link_*` are unique (long, global) pairs with their label; `g2g_*` are directed global pairs.
    `long_hard_l2g` / `global_hard_g2l` say which query rows the hard masks restrict (False:
    exempt, the row sees its whole document); hard masks have no per-column exemptions.
    """

    local_radius: int
    max_distance: int
    levels: tuple[str, ...]
    owners: np.ndarray  # [n_levels, L] int32
    long_doc: np.ndarray  # [L] int32
    long_segment: np.ndarray  # [L] int32, contiguous runs that may attend each other (l2l)
    global_doc: np.ndarray  # [G] int32
    global_segment: np.ndarray  # [G] int32 (-1: outside every segment node)
    global_blockable: np.ndarray  # [G] bool: blocked g2g across segments with other blockables
    long_hard_l2g: np.ndarray  # [L] bool: l2g row restricted to owners and links
    global_hard_g2l: np.ndarray  # [G] bool: g2l row restricted to owned and linked tokens
    link_long: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    link_global: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    link_label: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    g2g_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    g2g_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    g2g_label: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    cross_segment_label: int = -1

    # -- sizes (methods follow every field) ----------------------------------------------------
    @property
    def long_length(self) -> int:
        """L."""
        return int(self.long_doc.shape[0])

    @property
    def global_length(self) -> int:
        """G."""
        return int(self.global_doc.shape[0])

    @property
    def does_not_belong(self) -> int:
        """The first id after the distance ids (then `belongs`), as in the LabelVocab."""
        return does_not_belong_id(self.max_distance)

    @property
    def belongs(self) -> int:
        """The `belongs` label id (after does_not_belong)."""
        return belongs_id(self.max_distance)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (what a compact instance costs in memory)."""
        return sum(getattr(self, f.name).nbytes for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray))

    # -- pairs ----------------------------------------------------------------------------
    def owned_pairs(self, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """(long index, global position) of every ownership at any level, long in `rows`."""
        start = _span(rows, self.long_length)[0]
        owners = self.owners[:, rows]
        level, token = np.nonzero(owners >= 0)
        return (token + start).astype(np.int64), owners[level, token].astype(np.int64)

    def links_in(self, rows: slice, cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(long, global, label) of the links with the long index in `rows`, the global in `cols`."""
        start, stop = _span(rows, self.long_length)
        first, last = _span(cols, self.global_length)
        long_in = (self.link_long >= start) & (self.link_long < stop)
        keep = long_in & (self.link_global >= first) & (self.link_global < last)
        return self.link_long[keep].astype(np.int64), self.link_global[keep].astype(np.int64), self.link_label[keep]

    # -- dense derivation -----------------------------------------------------------------
    # Each piece for a range of query rows (and key columns): `*_into` writes into given int32
    # arrays of the range's shape, `*_rows` allocates them. Ranges are contiguous slices.
    def l2l_into(self, mask: np.ndarray, ids: np.ndarray) -> None:
        """l2l mask and ids, [L, 2r+1], written into the given int32 arrays."""
        l2l_window(self.long_segment, self.local_radius, self.max_distance, out_mask=mask, out_ids=ids)

    def l2l_rows(self, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """l2l mask and ids of long queries `rows`, [n, 2r+1], from the segments around them only."""
        start, stop = _span(rows, self.long_length)
        r = self.local_radius
        lo, hi = max(0, start - r), min(self.long_length, stop + r)
        mask, ids = l2l_window(self.long_segment[lo:hi], r, self.max_distance)
        if ids is None:  # max_distance 0: every id is 0
            ids = np.zeros_like(mask)
        return mask[start - lo : stop - lo], ids[start - lo : stop - lo]

    def g2g_into(self, mask: np.ndarray, ids: np.ndarray, rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """g2g mask and ids of global queries `rows` x keys `cols`: same document; segments; g2g edges last."""
        G = self.global_length
        (r0, r1), (c0, c1) = _span(rows, G), _span(cols, G)
        if (r0, r1, c0, c1) == (0, G, 0, G):
            ids[...] = full_relative_ids(G, self.max_distance)  # cached for the whole square
        else:
            positions = np.arange(max(r1, c1), dtype=np.int32)
            ids[...] = relative_position_ids(positions[None, c0:c1] - positions[r0:r1, None], self.max_distance)
        same_segment(self.global_doc[r0:r1], self.global_doc[c0:c1], out=mask)
        if self.cross_segment_label >= 0 or self.global_blockable.any():
            cross = (self.global_segment[r0:r1, None] != self.global_segment[None, c0:c1]) & (mask == 1)
            if self.cross_segment_label >= 0:
                ids[cross] = self.cross_segment_label
            blockable = self.global_blockable
            if blockable.any():
                mask[cross & blockable[r0:r1, None] & blockable[None, c0:c1]] = 0
        keep = (self.g2g_src >= r0) & (self.g2g_src < r1) & (self.g2g_dst >= c0) & (self.g2g_dst < c1)
        ids[self.g2g_src[keep] - r0, self.g2g_dst[keep] - c0] = self.g2g_label[keep]

    def l2g_into(self, mask: np.ndarray, ids: np.ndarray, rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """l2g mask and ids of long queries `rows` x global keys `cols`, [n, m]."""
        start = _span(rows, self.long_length)[0]
        first, last = _span(cols, self.global_length)
        ids.fill(self.does_not_belong)
        tok, glob = self.owned_pairs(rows)
        inside = (glob >= first) & (glob < last)
        tok, glob = tok[inside] - start, glob[inside] - first
        ids[tok, glob] = self.belongs
        ltok, lglob, llabel = self.links_in(rows, cols)
        ids[ltok - start, lglob - first] = llabel
        # Rows of equal (document, subject to hard l2g) are equal before owners and links.
        _rows_by_key(self.long_doc[rows], self.long_hard_l2g[rows], self.global_doc[first:last], mask)
        mask[tok, glob] = 1
        mask[ltok - start, lglob - first] = 1

    def g2l_into(self, mask: np.ndarray, ids: np.ndarray, rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """g2l mask and ids of global queries `rows` x long keys `cols`, [n, m] (the same labels as l2g)."""
        start, stop = _span(rows, self.global_length)
        first = _span(cols, self.long_length)[0]
        ids.fill(self.does_not_belong)
        tok, glob = self.owned_pairs(cols)
        ltok, lglob, llabel = self.links_in(cols, rows)
        own = (glob >= start) & (glob < stop)
        ids[glob[own] - start, tok[own] - first] = self.belongs
        ids[lglob - start, ltok - first] = llabel
        _rows_by_key(self.global_doc[rows], self.global_hard_g2l[rows], self.long_doc[cols], mask)
        mask[glob[own] - start, tok[own] - first] = 1
        mask[lglob - start, ltok - first] = 1

    def _piece_rows(
        self, name: str, rows: slice, cols: slice, n_rows: int, n_cols: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`name`'s mask and ids for a rows x cols range, allocated."""
        (r0, r1), (c0, c1) = _span(rows, n_rows), _span(cols, n_cols)
        mask, ids = (np.empty((r1 - r0, c1 - c0), np.int32) for _ in range(2))
        getattr(self, f"{name}_into")(mask, ids, slice(r0, r1), slice(c0, c1))
        return mask, ids

    def l2g_rows(self, rows: slice = slice(None), cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """l2g mask and ids of some long tokens (and globals), for consumers that work in row blocks."""
        return self._piece_rows("l2g", rows, cols, self.long_length, self.global_length)

    def g2l_rows(self, rows: slice = slice(None), cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """g2l mask and ids of some globals (and long tokens)."""
        return self._piece_rows("g2l", rows, cols, self.global_length, self.long_length)

    def g2g_rows(self, rows: slice = slice(None), cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """g2g mask and ids of some globals (queries) by some globals (keys)."""
        return self._piece_rows("g2g", rows, cols, self.global_length, self.global_length)

    def to_dense(self) -> SideInputs:
        """The eight ETC tensors (numpy int32, masks 0/1), exactly as a dense compile gives them."""
        side = allocate_side_inputs(1, self.long_length, self.global_length, self.local_radius).map(lambda a: a[0])
        self.write_dense(side)
        return side

    def write_dense(self, out: SideInputs) -> None:
        """Write the eight tensors into preallocated int32 arrays of the right shapes (a batch row)."""
        self.l2l_into(out.l2l_att_mask, out.l2l_relative_att_ids)
        self.g2g_into(out.g2g_att_mask, out.g2g_relative_att_ids)
        self.l2g_into(out.l2g_att_mask, out.l2g_relative_att_ids)
        self.g2l_into(out.g2l_att_mask, out.g2l_relative_att_ids)

    # -- padding --------------------------------------------------------------------------
    def padded(self, long_length: int, global_length: int) -> CompactSideInputs:
        """Pad with one more document (the reference's convention): padding attends padding."""
        L, G = self.long_length, self.global_length
        if long_length < L or global_length < G:
            raise BatchError(f"cannot pad an instance of L={L}, G={G} down to L={long_length}, G={global_length}")
        pad_doc = int(max(self.long_doc.max(initial=-1), self.global_doc.max(initial=-1))) + 1
        pad_segment = int(self.long_segment.max(initial=-1)) + 1
        pad_global_segment = int(self.global_segment.max(initial=-1)) + 1

        def grow(a: np.ndarray, n: int, value) -> np.ndarray:
            out = np.full((*a.shape[:-1], n), value, dtype=a.dtype)
            out[..., : a.shape[-1]] = a
            return out

        return CompactSideInputs(
            local_radius=self.local_radius,
            max_distance=self.max_distance,
            levels=self.levels,
            owners=grow(self.owners, long_length, -1),
            long_doc=grow(self.long_doc, long_length, pad_doc),
            long_segment=grow(self.long_segment, long_length, pad_segment),
            global_doc=grow(self.global_doc, global_length, pad_doc),
            global_segment=grow(self.global_segment, global_length, pad_global_segment),
            global_blockable=grow(self.global_blockable, global_length, False),
            long_hard_l2g=grow(self.long_hard_l2g, long_length, False),
            global_hard_g2l=grow(self.global_hard_g2l, global_length, False),
            link_long=self.link_long,
            link_global=self.link_global,
            link_label=self.link_label,
            g2g_src=self.g2g_src,
            g2g_dst=self.g2g_dst,
            g2g_label=self.g2g_label,
            cross_segment_label=self.cross_segment_label,
        )


def _span(rows: slice, length: int) -> tuple[int, int]:
    """[start, stop) of a contiguous slice over `length` items."""
    start, stop, step = rows.indices(length)
    if step != 1:
        raise BatchError(f"side-input rows must be a contiguous range, got a slice with step {step}")
    return start, max(start, stop)


def _rows_by_key(row_doc: np.ndarray, row_hard: np.ndarray, col_doc: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = same document and row i not under the hard mask, as one row gather.

    Rows with the same (document, hard) key are identical, so each distinct key's row is built
    once and `np.take` copies it into place: no [n, m] temporaries.
    """
    key = row_doc.astype(np.int64) * 2 + row_hard
    distinct, index = np.unique(key, return_inverse=True)
    table = (col_doc[None, :] == (distinct // 2)[:, None]) & (distinct % 2 == 0)[:, None]
    if out.size:
        np.take(table.astype(np.int32), index.reshape(-1), axis=0, out=out, mode="clip")


# -- the batched compact form -------------------------------------------------------------------


@dataclass
class CompactBatch:
    """`CompactSideInputs` of a padded batch, stacked: what the kernels read instead of the eight
    dense tensors (O(B (L + G) + E) memory, where the dense form is O(B L G)).

    Per-token arrays gain a batch dim ([B, L], [B, G], owners [B, n_levels, L]); instances are
    padded as `collate` pads them (one more document). Links and g2g edges of all rows are flat
    lists in CSR order: the links of long token i of row b are entries
    ``link_offsets[b, i] .. link_offsets[b, i + 1]`` (sorted by global within a token), the edges
    of global g are ``edge_offsets[b, g] .. edge_offsets[b, g + 1]`` (sorted by destination).
    `link_batch` / `edge_batch` repeat each entry's row for vectorized consumers. Arrays are numpy
    as built by `from_instances`, torch after `to_torch()`; `map` applies a function to all.
    """

    local_radius: int
    max_distance: int
    levels: tuple[str, ...]
    cross_segment_label: int
    owners: Any  # [B, n_levels, L] int32, -1: none
    long_doc: Any  # [B, L] int32
    long_segment: Any  # [B, L] int32
    long_hard_l2g: Any  # [B, L] bool
    global_doc: Any  # [B, G] int32
    global_segment: Any  # [B, G] int32
    global_blockable: Any  # [B, G] bool
    global_hard_g2l: Any  # [B, G] bool
    link_offsets: Any  # [B, L + 1] int32, absolute positions in the flat link lists
    link_batch: Any  # [E] int32
    link_long: Any  # [E] int32
    link_global: Any  # [E] int32
    link_label: Any  # [E] int32
    edge_offsets: Any  # [B, G + 1] int32
    edge_batch: Any  # [E2] int32
    edge_src: Any  # [E2] int32
    edge_dst: Any  # [E2] int32
    edge_label: Any  # [E2] int32

    ARRAYS = (
        "owners",
        "long_doc",
        "long_segment",
        "long_hard_l2g",
        "global_doc",
        "global_segment",
        "global_blockable",
        "global_hard_g2l",
        "link_offsets",
        "link_batch",
        "link_long",
        "link_global",
        "link_label",
        "edge_offsets",
        "edge_batch",
        "edge_src",
        "edge_dst",
        "edge_label",
    )

    @property
    def batch_size(self) -> int:
        return int(self.long_doc.shape[0])

    @property
    def long_length(self) -> int:
        return int(self.long_doc.shape[1])

    @property
    def global_length(self) -> int:
        return int(self.global_doc.shape[1])

    @property
    def does_not_belong(self) -> int:
        return does_not_belong_id(self.max_distance)

    @property
    def belongs(self) -> int:
        return belongs_id(self.max_distance)

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(self, name).nbytes) for name in self.ARRAYS)

    def map(self, fn) -> CompactBatch:
        """Apply `fn` to every array (e.g. `torch.from_numpy`, `lambda t: t.to(device)`)."""
        return _replace_arrays(self, {name: fn(getattr(self, name)) for name in self.ARRAYS})

    def to_torch(self) -> CompactBatch:
        import torch

        return self.map(lambda a: a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a)))

    @classmethod
    def from_instances(cls, sides: list[CompactSideInputs], long_length: int, global_length: int) -> CompactBatch:
        """Pad each instance to (long_length, global_length) as `collate` does and stack them."""
        if not sides:
            raise BatchError("a compact batch needs at least one instance")
        first = sides[0]
        settings = lambda side: (side.local_radius, side.max_distance, side.cross_segment_label)  # noqa: E731
        for i, side in enumerate(sides):
            if settings(side) != settings(first):
                raise BatchError(
                    f"instance {i} has (local_radius, max_distance, cross_segment_label) = {settings(side)}, "
                    f"instance 0 has {settings(first)}; compile them with one schema"
                )
        padded = [side.padded(long_length, global_length) for side in sides]
        levels = tuple(dict.fromkeys(level for side in padded for level in side.levels))
        owners = np.full((len(padded), len(levels), long_length), -1, np.int32)
        for b, side in enumerate(padded):
            for row, level in enumerate(side.levels):
                owners[b, levels.index(level)] = side.owners[row]

        def stack(name: str, dtype) -> np.ndarray:
            return np.stack([np.asarray(getattr(side, name), dtype=dtype) for side in padded])

        links = _csr([(s.link_long, s.link_global, s.link_label) for s in padded], long_length)
        edges = _csr([(s.g2g_src, s.g2g_dst, s.g2g_label) for s in padded], global_length)
        return cls(
            local_radius=first.local_radius,
            max_distance=first.max_distance,
            levels=levels,
            cross_segment_label=first.cross_segment_label,
            owners=owners,
            long_doc=stack("long_doc", np.int32),
            long_segment=stack("long_segment", np.int32),
            long_hard_l2g=stack("long_hard_l2g", bool),
            global_doc=stack("global_doc", np.int32),
            global_segment=stack("global_segment", np.int32),
            global_blockable=stack("global_blockable", bool),
            global_hard_g2l=stack("global_hard_g2l", bool),
            link_offsets=links[0],
            link_batch=links[1],
            link_long=links[2],
            link_global=links[3],
            link_label=links[4],
            edge_offsets=edges[0],
            edge_batch=edges[1],
            edge_src=edges[2],
            edge_dst=edges[3],
            edge_label=edges[4],
        )


def _replace_arrays(batch: CompactBatch, arrays: dict) -> CompactBatch:
    scalars = {f.name: getattr(batch, f.name) for f in fields(batch) if f.name not in CompactBatch.ARRAYS}
    return CompactBatch(**scalars, **arrays)


def _csr(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], length: int) -> tuple[np.ndarray, ...]:
    """Flat (offsets [B, length + 1], batch, source, target, label) of per-row (source, target,
    label) lists, sorted by (row, source, target). A (source, target) pair listed twice keeps its
    last label, as the dense derivation's fancy assignment does."""
    offsets = np.zeros((len(rows), length + 1), np.int64)
    parts, start = [], 0
    for b, (source, target, label) in enumerate(rows):
        source, target, label = (np.asarray(a, np.int64).reshape(-1) for a in (source, target, label))
        key = source * (int(target.max(initial=0)) + 1) + target
        last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]  # last occurrence of each pair
        keep = last[np.argsort(key[last], kind="stable")]
        source, target, label = source[keep], target[keep], label[keep]
        counts = np.bincount(source, minlength=length)
        offsets[b, 1:] = np.cumsum(counts) + start
        offsets[b, 0] = start
        parts.append((np.full(len(source), b), source, target, label))
        start += len(source)
    flat = [
        np.concatenate([p[i] for p in parts]).astype(np.int32) if parts else np.zeros(0, np.int32) for i in range(4)
    ]
    return (offsets.astype(np.int32), *flat)
