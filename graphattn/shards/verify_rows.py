"""Row checks of a decoded row group: lengths, index ranges, spans and targets of every row at once.

`check_rows(table, info, classes, first_row)` raises `ShardFormatError` naming the file, the
row (counting from 0 in the shard), the column and what was expected, for the first row that
breaks a rule. It works on the Arrow buffers of the whole row group: list offsets give every
row's lengths, and the values are compared with per-row bounds repeated over each row's items
(`np.repeat`), so the cost is a few numpy passes per column and no Python per row. See
`graphattn.shards.verify` for the footer, the done marker and docs/SHARDS.md for the rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from graphattn.contract import TARGET_IGNORE
from graphattn.shards.verify import TYPE_IDS, ShardFormatError

# list columns and the row length they must have: "L" long tokens, "G" globals, "D" documents
_BY_LENGTH = {
    "L": (
        "long_token_ids",
        "long_type_ids",
        "long_char_gap",
        "long_char_length",
        "long_doc",
        "long_segment",
        "long_hard_l2g",
    ),
    "G": (
        "global_token_ids",
        "global_type_ids",
        "global_node_ids",
        "global_node_types",
        "global_doc",
        "global_segment",
        "global_blockable",
        "global_hard_g2l",
    ),
    "D": ("doc_ids", "sources", "source_lines", "source_records", "texts"),
}
_NULLABLE_ITEMS = {"doc_ids": None, "source_lines": 1, "source_records": 0}  # nulls allowed (checked as this)

_LINKS = ("link_long", "link_global", "link_label")
_EDGES = ("g2g_src", "g2g_dst", "g2g_label")


class _RowGroup:
    """Offsets, values and scalars of a row group's columns, taken from the Arrow buffers."""

    def __init__(self, table: pa.Table, path: str, first_row: int):
        self.table, self.path, self.first_row = table, path, first_row
        self.n = table.num_rows
        self._lists: dict[str, tuple[np.ndarray, Any]] = {}
        self._lengths: dict[str, np.ndarray] = {}
        self._scalars: dict[str, np.ndarray] = {}

    def fail(self, row: int, column: str, what: str) -> ShardFormatError:
        return ShardFormatError(
            f"row {self.first_row + int(row)}: column {column}: {what}; compile it again (or read a copy that is "
            "intact)",
            file=self.path,
        )

    def array(self, name: str) -> pa.Array:
        column = self.table.column(name)
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()

    def scalar(self, name: str) -> np.ndarray:
        found = self._scalars.get(name)
        if found is None:
            array = self.array(name)
            if array.null_count:
                raise self.fail(int(np.argmax(array.is_null().to_numpy(zero_copy_only=False))), name, "null")
            found = self._scalars[name] = array.to_numpy(zero_copy_only=False)
        return found

    def offsets(self, name: str) -> np.ndarray:
        return self._list(name)[0]

    def lengths(self, name: str) -> np.ndarray:
        found = self._lengths.get(name)
        if found is None:
            found = self._lengths[name] = np.diff(self.offsets(name))
        return found

    def values(self, name: str) -> np.ndarray:
        return self._list(name)[1]

    def list_column(self, name: str) -> tuple[np.ndarray, Any]:
        """(offsets from 0, values: numpy, or a pyarrow array for strings) of a checked list column."""
        return self._list(name)

    def _list(self, name: str) -> tuple[np.ndarray, Any]:
        found = self._lists.get(name)
        if found is None:
            array = self.array(name)
            if array.null_count:
                raise self.fail(int(np.argmax(array.is_null().to_numpy(zero_copy_only=False))), name, "null list")
            offsets = array.offsets.to_numpy()
            flat = array.values
            if offsets[0] != 0 or offsets[-1] != len(flat):  # a slice of a longer array
                flat = flat.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
                offsets = offsets - offsets[0]
            if flat.null_count and name not in _NULLABLE_ITEMS:
                at = int(np.argmax(flat.is_null().to_numpy(zero_copy_only=False)))
                row = self.row_of(offsets, at)
                raise self.fail(row, name, f"item {at - offsets[row]} is null")
            if flat.null_count and _NULLABLE_ITEMS.get(name) is not None:
                flat = pc.fill_null(flat, _NULLABLE_ITEMS[name])
            values = flat if pa.types.is_string(flat.type) else flat.to_numpy(zero_copy_only=False)
            found = self._lists[name] = (offsets, values)
        return found

    @staticmethod
    def row_of(offsets: np.ndarray, position: int) -> int:
        return int(np.searchsorted(offsets, position, side="right") - 1)

    def check_length(self, name: str, expected: np.ndarray, what: str, offsets: np.ndarray | None = None) -> None:
        """Row lengths of `name` equal `expected` ([n]); `offsets`: its cumulative sum, when known
        (one comparison of the offsets instead of a difference per column)."""
        if offsets is not None and np.array_equal(self.offsets(name), offsets):
            return
        lengths = self.lengths(name)
        bad = np.flatnonzero(lengths != expected)
        if bad.size:
            r = bad[0]
            raise self.fail(r, name, f"holds {lengths[r]} item(s), expected {expected[r]} ({what})")

    def check_range(self, name: str, lo: Any, hi: Any, what: str, allow_ignore: bool = False) -> None:
        """Every item of list column `name` in [lo, hi): per-row bounds (arrays [n]) or one number.
        Per-row bounds compare each row's min and max (`reduceat`), one number the column's."""
        offsets, values = self._list(name)
        if not len(values):
            return
        if allow_ignore and values.dtype.kind in "iu" and np.iinfo(values.dtype).min <= TARGET_IGNORE:
            values = np.where(values == TARGET_IGNORE, 0, values)  # every lower bound here is 0
        if np.ndim(lo) or np.ndim(hi):
            lengths = self.lengths(name)
            rows = np.flatnonzero(lengths)
            low, high = (np.minimum, np.maximum)
            smallest = low.reduceat(values, offsets[:-1][rows]).astype(np.int64)
            largest = high.reduceat(values, offsets[:-1][rows]).astype(np.int64)
            lo_rows = np.asarray(lo)[rows] if np.ndim(lo) else lo
            hi_rows = np.asarray(hi)[rows] if np.ndim(hi) else hi
            if not ((smallest < lo_rows) | (largest >= hi_rows)).any():
                return
        else:
            if values.dtype.kind in "iu":
                limits = np.iinfo(values.dtype)
                if limits.min >= lo and limits.max < hi:
                    return
            if int(values.min()) >= lo and int(values.max()) < hi:
                return
        self._range_error(name, offsets, values, lo, hi, what, allow_ignore)

    def _range_error(self, name, offsets, values, lo, hi, what: str, allow_ignore: bool) -> ShardFormatError:
        """Find the first item outside its bounds and raise, naming its row (the slow path)."""
        lengths = np.diff(offsets)
        low = np.repeat(lo, lengths) if np.ndim(lo) else lo
        high = np.repeat(hi, lengths) if np.ndim(hi) else hi
        original = self.values(name).astype(np.int64)
        values = values.astype(np.int64)
        at = int(np.argmax((values < low) | (values >= high)))
        row = self.row_of(offsets, at)
        shown = (lo[row] if np.ndim(lo) else lo, hi[row] if np.ndim(hi) else hi)
        ignore = " or -100" if allow_ignore else ""
        raise self.fail(
            row,
            name,
            f"item {at - offsets[row]} is {original[at]}, outside [{shown[0]}, {shown[1]}){ignore} ({what})",
        )

    def check_scalar_range(self, name: str, values: np.ndarray, lo: Any, hi: Any, what: str) -> None:
        values = values.astype(np.int64, copy=False)
        bad = (values < lo) | (values >= hi)
        if bad.any():
            r = int(np.argmax(bad))
            raise self.fail(
                r,
                name,
                f"is {values[r]}, outside [{lo[r] if np.ndim(lo) else lo}, {hi[r] if np.ndim(hi) else hi}) ({what})",
            )


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def check_rows(
    table: pa.Table, info: Any, classes: dict[str, int] | None = None, first_row: int = 0
) -> _RowGroup | None:
    """Check every row of `table` (a row group of the shard `info` describes); see the module doc.
    Returns the checked columns as numpy (what `DecodedRows` reads on), None for no rows.

    `classes`: per class-valued target array, the schema's class count (`verify.target_classes`);
    without it only the column's dtype bounds those values."""
    if table.num_rows == 0:
        return None
    rows = _RowGroup(table, info.path, first_row)
    layout = info.layout
    L, G = rows.scalar("long_length"), rows.scalar("global_length")
    rows.check_scalar_range("long_length", L, 0, 1 << 31, "a length")
    rows.check_scalar_range("global_length", G, 0, 1 << 31, "a length")
    D = rows.lengths("doc_numbers")
    rows.check_scalar_range("doc_numbers", D, 1, 1 << 31, "every instance holds a document")
    long_offsets, global_offsets = _offsets(L), _offsets(G)
    for name in _BY_LENGTH["L"] + tuple(f"owner_{lv}" for lv in layout.levels):
        rows.check_length(name, L, "long_length", long_offsets)
    for key, _ in layout.features:
        long = key.startswith("long:")
        rows.check_length(
            f"feature:{key}", L if long else G, "its side's length", long_offsets if long else global_offsets
        )
    for name in _BY_LENGTH["G"]:
        rows.check_length(name, G, "global_length", global_offsets)
    for name in _BY_LENGTH["D"]:
        rows.check_length(name, D, "one per document, as doc_numbers", rows.offsets("doc_numbers"))
    for group in (_LINKS, _EDGES):
        for name in group[1:]:
            rows.check_length(name, rows.lengths(group[0]), f"as many as {group[0]}", rows.offsets(group[0]))

    _check_scalars(rows, L, G)
    vocab = info.settings.get("tokenizer_vocab_size")
    token_limit = vocab if isinstance(vocab, int) else 1 << 31
    for name in ("long_token_ids", "global_token_ids"):
        rows.check_range(name, 0, token_limit, "the tokenizer's vocabulary size")
    types = (classes or {}).get(TYPE_IDS, 1 << 16)
    for name in ("long_type_ids", "global_type_ids"):
        rows.check_range(name, 0, types, "a type id the schema gives")
    rows.check_range("doc_numbers", 0, 1 << 62, "a document number")
    rows.check_range("source_lines", 1, 1 << 62, "a line number")
    rows.check_range("source_records", 0, 1 << 62, "a record index")
    rows.check_range("long_doc", 0, D, "a document of the row")
    rows.check_range("global_doc", 0, D, "a document of the row")
    rows.check_range("long_segment", 0, 1 << 31, "a segment id")
    rows.check_range("global_segment", -1, 1 << 31, "a segment id, -1 for none")
    for level in layout.levels:
        rows.check_range(f"owner_{level}", -1, G, "a global position, -1 for none")
    labels = len(info.label_vocab)
    rows.check_range("link_long", 0, L, "a long position")
    rows.check_range("link_global", 0, G, "a global position")
    rows.check_range("g2g_src", 0, G, "a global position")
    rows.check_range("g2g_dst", 0, G, "a global position")
    for name in ("link_label", "g2g_label"):
        rows.check_range(name, 0, labels, f"a label id of the footer's LabelVocab of {labels}")
    rows.check_scalar_range(
        "cross_segment_label", rows.scalar("cross_segment_label"), -1, labels, "a label id, -1 for none"
    )
    for key, dtype in layout.features:
        values = rows.values(f"feature:{key}")
        if dtype == "float32" and values.size and not np.isfinite(values).all():
            at = int(np.argmax(~np.isfinite(values)))
            raise rows.fail(rows.row_of(rows.offsets(f"feature:{key}"), at), f"feature:{key}", "holds NaN or inf")
    _check_spans(rows, D)
    _check_targets(rows, layout, classes or {}, L, G)
    return rows


def _check_scalars(rows: _RowGroup, L: np.ndarray, G: np.ndarray) -> None:
    windows = rows.scalar("windows")
    rows.check_scalar_range("windows", windows, 1, 1 << 31, "at least 1")
    rows.check_scalar_range("window", rows.scalar("window"), 0, windows, "a window of the document's")
    rows.check_scalar_range("long_tokens_after", rows.scalar("long_tokens_after"), L, L + 1, "long_length")
    rows.check_scalar_range("globals_after", rows.scalar("globals_after"), G, G + 1, "global_length")
    rows.check_scalar_range("long_tokens_before", rows.scalar("long_tokens_before"), L, 1 << 62, "at least as kept")
    rows.check_scalar_range("globals_before", rows.scalar("globals_before"), G, 1 << 62, "at least as kept")
    rows.scalar("truncated")


def _check_spans(rows: _RowGroup, D: np.ndarray) -> None:
    """Character spans (from gap / length) lie in their document's text, or are (-1, -1)."""
    offsets, gap = rows._list("long_char_gap")
    length = rows.values("long_char_length").astype(np.int64)
    if not length.size:
        return
    gap = gap.astype(np.int64)
    starts = offsets[:-1]
    previous = np.concatenate([[0], length[:-1]])
    previous[starts[starts < length.size]] = 0  # a row's first token follows end 0
    running = np.cumsum(gap + previous)
    before = np.concatenate([[0], running])[starts]  # the running sum where each row starts
    start = running - np.repeat(before, np.diff(offsets))
    end = start + length
    texts_offsets, texts = rows._list("texts")
    chars = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64) if len(texts) else np.zeros(0)
    doc = rows.values("long_doc").astype(np.int64)
    text_length = chars[np.repeat(texts_offsets[:-1], np.diff(offsets)) + doc]
    inserted = (start == -1) & (end == -1)
    bad = ~inserted & ((start < 0) | (length < 0) | (end > text_length))
    if bad.any():
        at = int(np.argmax(bad))
        row = rows.row_of(offsets, at)
        raise rows.fail(
            row,
            "long_char_gap/long_char_length",
            f"token {at - offsets[row]} spans characters [{start[at]}, {end[at]}), outside its document's "
            f"text of {text_length[at]} (or (-1, -1) for an inserted token)",
        )


def _check_targets(rows: _RowGroup, layout: Any, classes: dict[str, int], L: np.ndarray, G: np.ndarray) -> None:
    global_offsets = _offsets(G)
    """Per-global labels in [0, classes), span ends in [0, L) paired, fixed rows of (first, last)."""
    for name, axis, shape in layout.targets:
        column = f"target:{name}"
        if axis == "global":
            rows.check_length(column, G, "global_length", global_offsets)
            n = classes.get(name, 1 << 15)
            rows.check_range(column, 0, n, f"a class of the schema's {n}", allow_ignore=True)
        elif shape:
            size = int(np.prod(shape))
            rows.check_length(column, np.full(rows.n, size), f"the target's shape {list(shape)}")
            rows.check_range(column, 0, L, "a long position", allow_ignore=True)
            if shape[-1] == 2:
                pairs = rows.values(column).astype(np.int64).reshape(-1, 2)
                half = (pairs[:, 0] == TARGET_IGNORE) != (pairs[:, 1] == TARGET_IGNORE)
                bad = half | ((pairs[:, 0] != TARGET_IGNORE) & (pairs[:, 0] > pairs[:, 1]))
                if bad.any():
                    at = int(np.argmax(bad))
                    row, k = divmod(at, size // 2)
                    what = f"span {k} is {pairs[at].tolist()}: expected first <= last, or both -100"
                    raise rows.fail(row, column, what)
    scalars = {name for name, axis, shape in layout.targets if not axis and not shape}
    for name in sorted(scalars):
        values = rows.scalar(f"target:{name}").astype(np.int64)
        base = name.rsplit("_", 1)[0]
        if name.endswith("_type"):
            n = classes.get(name, 1 << 31)
            bad = (values != TARGET_IGNORE) & ((values < 0) | (values >= n))
            if bad.any():
                r = int(np.argmax(bad))
                what = f"is {values[r]}, outside [0, {n}) or -100 (a type of the schema's)"
                raise rows.fail(r, f"target:{name}", what)
        elif name.endswith(("_start", "_end")):
            bad = (values != TARGET_IGNORE) & ((values < 0) | (values >= np.maximum(L, 1)))
            if bad.any():
                r = int(np.argmax(bad))
                raise rows.fail(r, f"target:{name}", f"is {values[r]}, outside [0, {L[r]}) or -100 (a long position)")
        if name.endswith("_start") and {f"{base}_end", f"{base}_type"} <= scalars:
            start = values
            end = rows.scalar(f"target:{base}_end").astype(np.int64)
            kind = rows.scalar(f"target:{base}_type").astype(np.int64)
            ignored = start == TARGET_IGNORE
            bad = (ignored != (end == TARGET_IGNORE)) | (~ignored & (start > end))
            bad |= (kind == TARGET_IGNORE) & ~ignored
            if bad.any():
                r = int(np.argmax(bad))
                raise rows.fail(
                    r,
                    f"target:{base}_start/_end/_type",
                    f"is ({start[r]}, {end[r]}, {kind[r]}): expected start <= end, both -100 or neither, "
                    "and no span without a type",
                )
