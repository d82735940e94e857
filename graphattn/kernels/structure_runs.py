"""The l2g and g2l labels of a block of rows as runs of equal labels, as the fused CPU kernel
reads them (fused_cpu.Labels), from either form of the side inputs.

A long token's labels over the global keys, or a global's over the long keys, are mostly one or
two labels in long stretches. From the dense tensors the runs are found by comparing neighbours
(`runs_of`), O(rows x keys). From the compact structure (`compact_runs`) they are found without
any [rows x keys] tensor: a row's label can only change at a key where something that matters to
this row changes (graphattn.kernels.structure's rules):

    the key's document           for rows of either document (their soft mask starts or stops)
    the key's owner (g2l)         for the globals that own or stop owning it
    the row's owners (l2g)        at each owning global and the key after it
    a link                        at the linked key and the key after it

so the labels are evaluated at those keys only (and at each row's first key), and neighbours with
equal labels are merged: O(rows + document changes x their rows + owner changes + links).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphattn.compact import CompactBatch
from graphattn.kernels.structure import Links, distance_ids


@dataclass
class Runs:
    """Runs of equal labels per row of a [B, n, m] block, rows in (batch, row) order: `counts`
    [B, n] int64, then per run its first column (from 0) and label, int32. Masked pairs have label
    `vocab`; every row with m > 0 has at least one run, starting at column 0."""

    counts: torch.Tensor
    start: torch.Tensor
    label: torch.Tensor

    def allowed_rows(self, vocab: int) -> torch.Tensor:
        """[B, n] bool: rows with at least one run not masked."""
        flat = self.counts.flatten()
        rows = torch.repeat_interleave(torch.arange(flat.numel(), device=flat.device), flat)
        hits = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
        hits[rows[self.label != vocab]] = True
        return hits.view_as(self.counts)

    @staticmethod
    def cat(parts: list[Runs], batch: int) -> Runs:
        """Runs of consecutive row ranges of one block (each part holds all batch rows)."""
        if len(parts) == 1:
            return parts[0]
        starts, labels = [], []
        for b in range(batch):  # regroup (part, batch) into (batch, part): a loop over parts, not rows
            for p in parts:
                first = int(p.counts[:b].sum())
                stop = first + int(p.counts[b].sum())
                starts.append(p.start[first:stop])
                labels.append(p.label[first:stop])
        return Runs(torch.cat([p.counts for p in parts], 1), torch.cat(starts), torch.cat(labels))


def runs_of(labels: torch.Tensor) -> Runs:
    """The runs of a dense [B, n, m] label block (masked pairs already set to V)."""
    flat = labels.flatten(0, 1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[:, 1:] = flat[:, 1:] != flat[:, :-1]
    rows, columns = starts.nonzero(as_tuple=True)  # row-major: each row's runs in order
    counts = starts.sum(1).view(labels.shape[:2])
    return Runs(counts, columns.to(torch.int32), flat[rows, columns].to(torch.int32))


def compact_runs(c: CompactBatch, region: str, rows: slice, cols: slice, links: Links, vocab: int) -> Runs:
    """Runs of region "l2g" (long rows x global keys) or "g2l" (global rows x long keys) in the
    block rows x cols, with the block's links (structure.links_in, row-major for the region)."""
    batch, n, m = c.batch_size, rows.stop - rows.start, cols.stop - cols.start
    device = c.long_doc.device
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    if n <= 0 or m <= 0:
        return Runs(torch.zeros(batch, max(n, 0), dtype=torch.int64, device=device), empty, empty)
    if region == "l2g":
        row_doc, row_hard, key_doc = c.long_doc[:, rows], c.long_hard_l2g[:, rows], c.global_doc[:, cols]
    else:
        row_doc, row_hard, key_doc = c.global_doc[:, rows], c.global_hard_g2l[:, rows], c.long_doc[:, cols]
    row_of = torch.arange(batch * n, device=device)  # (batch, row) flattened
    events = [row_of * m]  # every row's first key
    events.append(_document_changes(row_doc, key_doc))
    events.append(_owner_events(c, region, rows, cols))
    link_row = links.batch * n + links.row
    events += [link_row * m + links.column, (link_row * m + links.column + 1)[links.column + 1 < m]]
    code = torch.unique(torch.cat(events))  # sorted: by (batch, row), then key
    flat_row, key = code // m, code % m
    b = flat_row // n
    same_doc = row_doc.flatten()[flat_row] == key_doc[b, key]
    owned = _owned_at(c, region, rows, cols, flat_row, key, b)
    link_code = link_row * m + links.column
    link_code, order = torch.sort(link_code)
    at = torch.searchsorted(link_code, code).clamp(max=max(link_code.numel() - 1, 0))
    linked = (link_code[at] == code) if link_code.numel() else torch.zeros_like(owned)
    link_label = links.label[order][at] if link_code.numel() else torch.zeros_like(code)
    allowed = (same_doc & ~row_hard.flatten()[flat_row]) | owned | linked
    label = torch.where(owned, c.belongs, c.does_not_belong).to(torch.int64)
    label = torch.where(linked, link_label.to(torch.int64), label)
    label = torch.where(allowed, label, vocab)
    keep = torch.ones_like(allowed)
    keep[1:] = (flat_row[1:] != flat_row[:-1]) | (label[1:] != label[:-1])
    counts = torch.bincount(flat_row[keep], minlength=batch * n).view(batch, n)
    return Runs(counts, key[keep].to(torch.int32), label[keep].to(torch.int32))


def _document_changes(row_doc: torch.Tensor, key_doc: torch.Tensor) -> torch.Tensor:
    """Events (flat row * m + key) at every key whose document differs from the previous key's,
    for the rows of either of the two documents."""
    batch, n = row_doc.shape
    m = key_doc.shape[1]
    b, key = (key_doc[:, 1:] != key_doc[:, :-1]).nonzero(as_tuple=True)
    key = key + 1
    if key.numel() == 0:
        return key
    docs = int(max(row_doc.max(), key_doc.max())) + 1
    row_key = (torch.arange(batch, device=row_doc.device)[:, None] * docs + row_doc.long()).flatten()
    sorted_key, row_order = torch.sort(row_key, stable=True)
    target = torch.cat([b * docs + key_doc[b, key].long(), b * docs + key_doc[b, key - 1].long()])
    at_key = torch.cat([key, key])
    lo = torch.searchsorted(sorted_key, target)
    count = torch.searchsorted(sorted_key, target, right=True) - lo
    change = torch.repeat_interleave(torch.arange(target.numel(), device=lo.device), count)
    first_of = torch.cumsum(count, 0) - count
    rows = row_order[lo[change] + torch.arange(change.numel(), device=lo.device) - first_of[change]]
    return rows * m + at_key[change]


def _owner_events(c: CompactBatch, region: str, rows: slice, cols: slice) -> torch.Tensor:
    """Events where ownership changes along a row's keys."""
    n, m = rows.stop - rows.start, cols.stop - cols.start
    batch_of = torch.arange(c.batch_size, device=c.owners.device)
    if region == "l2g":  # row i's owners g: the keys g and g + 1
        owner = c.owners[:, :, rows].long() - cols.start  # [B, levels, n]
        row = (batch_of[:, None, None] * n + torch.arange(n, device=owner.device)).expand_as(owner)
        inside = (owner >= 0) & (owner < m)
        after = inside & (owner + 1 < m)
        return torch.cat([(row * m + owner)[inside], (row * m + owner + 1)[after]])
    # g2l: where key j's owner (per level) differs from key j-1's, for both owners' rows
    owner = c.owners[:, :, cols].long() - rows.start  # [B, levels, m]
    b, level, key = (owner[:, :, 1:] != owner[:, :, :-1]).nonzero(as_tuple=True)
    key = key + 1
    events = []
    for shift in (0, 1):  # the new owner, the old owner
        row = owner[b, level, key - shift]
        inside = (row >= 0) & (row < n)
        events.append(((b * n + row) * m + key)[inside])
    return torch.cat(events)


def _owned_at(c, region, rows, cols, flat_row, key, b) -> torch.Tensor:
    """Whether the row owns (g2l) or is owned by (l2g) the key, at each event."""
    n, m = rows.stop - rows.start, cols.stop - cols.start
    levels = c.owners.shape[1]
    if levels == 0:
        return torch.zeros_like(key, dtype=torch.bool)
    if region == "l2g":
        owners = c.owners[:, :, rows].transpose(1, 2).reshape(-1, levels)  # [(B, n), levels]
        return (owners[flat_row] == (key + cols.start)[:, None]).any(1)
    owners = c.owners[:, :, cols].transpose(1, 2).reshape(-1, levels)  # [(B, m), levels]
    return (owners[b * m + key] == (flat_row % n + rows.start)[:, None]).any(1)


def band_labels(c: CompactBatch, block: int, radius: int, blocks: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """The band's labels skewed into windows, [B, blocks, w, w + 2r] (blocked_tiles.local_index's
    form, V where masked), straight from the structure: column j of block b's row a is key
    b*w - r + j, at offset j - r - a from the row; its label is that offset's distance id where
    the key lies within r, inside the sequence and in the row's long segment."""
    w, length, window = block, c.long_length, block + 2 * radius
    device = c.long_segment.device
    offset = torch.arange(window, device=device)[None, :] - radius - torch.arange(w, device=device)[:, None]
    ids = torch.where(offset.abs() <= radius, distance_ids(offset, c.max_distance), vocab).to(dtype)  # [w, window]
    key = torch.arange(blocks, device=device)[:, None] * w - radius + torch.arange(window, device=device)
    row = torch.arange(blocks * w, device=device).view(blocks, w)
    segment = c.long_segment.long()
    key_segment = torch.where((key >= 0) & (key < length), segment[:, key.clamp(0, max(length - 1, 0))], -1)
    row_segment = torch.where(row < length, segment[:, row.clamp(max=max(length - 1, 0))], -2)
    same = row_segment[:, :, :, None] == key_segment[:, :, None, :]  # [B, blocks, w, window]
    return torch.where(same, ids, torch.tensor(vocab, dtype=dtype, device=device))
