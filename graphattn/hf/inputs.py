"""Checks of what a user hands `pack_documents`, `pack_tree` and `PackingCollator`: every argument's
type and range, before anything is allocated, each failure one line naming the argument and index.

Token ids are non-negative integers (bools, floats, strings refused); sizes are bounded by their
length (`len`, a tensor's shape) before numpy or torch copies anything, so a huge strided view or
a typo in `max_length` costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

MAX_TOKENS = 1 << 24  # tokens of one row and of one call; a bigger request is a mistake, refused before allocation
IGNORE = -100


def _show(value) -> str:
    """A short description of a bad value for a one-line message."""
    text = repr(value) if isinstance(value, (bool, int, float, str, type(None), np.generic)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def check_int(value, name: str, lo: int, hi: int) -> int:
    """An integer (not a bool, not a float such as 2.0 or nan) in lo..hi."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer in {lo}..{hi}, got {_show(value)}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}: expected an integer in {lo}..{hi}, got {int(value)}")
    return int(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected True or False, got {_show(value)}")
    return bool(value)


def check_causal(value, name: str = "causal") -> bool | None:
    """None (each layer keeps its own rule), True or False; nothing else ("no" is not False)."""
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected None, True or False, got {_show(value)}")
    return bool(value)


def check_str(value, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a column name (a non-empty string), got {_show(value)}")
    return value


def _length(value, where: str) -> int:
    """The element count of a 1-D token list, read from its shape or len() (no copy)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 1:
            kind = "a tensor" if isinstance(value, torch.Tensor) else "an array"
            raise ValueError(
                f"{where}: expected a 1-D list of token ids, got {kind} of shape {tuple(value.shape)}"
                + (" (one document per list entry)" if value.ndim == 2 else "")
            )
        n = int(value.shape[0])
    elif isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        hint = " (a single document goes in a list: [[...]])" if isinstance(value, (int, np.integer)) else ""
        raise ValueError(f"{where}: expected a list of integer token ids, got {_show(value)}{hint}")
    else:
        n = len(value)
    if n > MAX_TOKENS:
        raise ValueError(f"{where}: {n} tokens, over the limit of {MAX_TOKENS}")
    return n


def _first_bad(values: Sequence, good) -> int:
    return next(i for i, v in enumerate(values) if not good(v))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_array(value, where: str, *, allow_ignore: bool = False, what: str = "token id") -> np.ndarray:
    """A 1-D list / tuple / array / tensor of integers >= 0 (and -100 where `allow_ignore`) as int64.
    Its length is checked before anything is copied."""
    _length(value, where)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        dtype = value.dtype
        integer = (
            (not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool)
            if isinstance(value, torch.Tensor)
            else dtype.kind in "iu"
        )
        if not integer:
            raise ValueError(f"{where}: expected integer {what}s, got dtype {dtype}")
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
            i = int(np.argmax(array > np.iinfo(np.int64).max))
            raise ValueError(f"{where}[{i}]: {what} {int(array[i])} is out of range")
        array = array.astype(np.int64)
    else:
        kinds = set(map(type, value))  # C-speed over the tokens; the index is looked for only on error
        if any(issubclass(k, (bool, np.bool_)) or not issubclass(k, (int, np.integer)) for k in kinds):
            i = _first_bad(value, _is_int)
            raise ValueError(f"{where}[{i}]: expected an integer {what}, got {_show(value[i])}")
        try:
            array = np.array(value, dtype=np.int64)
        except OverflowError:
            i = _first_bad(value, lambda v: -(1 << 63) <= int(v) < (1 << 63))
            raise ValueError(f"{where}[{i}]: {what} {int(value[i])} is out of range") from None
    bad = array < 0
    if allow_ignore:
        bad &= array != IGNORE
    if bad.any():
        i = int(np.argmax(bad))
        allowed = ">= 0 or -100 (ignored)" if allow_ignore else ">= 0"
        raise ValueError(f"{where}[{i}]: {what} {int(array[i])} is negative (expected {allowed})")
    return array


def check_documents(docs, name: str = "docs") -> list[np.ndarray]:
    """A list of documents, each a 1-D list of token ids, none empty, the total bounded. A single
    tensor or array is refused: pass `[tensor]` for one document (a 2-D one would pack its padding)."""
    if isinstance(docs, (torch.Tensor, np.ndarray)):
        raise ValueError(
            f"{name}: expected a list of documents, got a {docs.ndim}-D "
            f"{'tensor' if isinstance(docs, torch.Tensor) else 'array'}: pass [{name}] for one document, "
            "or a list of 1-D documents (a padded 2-D batch would pack its padding as tokens)"
        )
    if isinstance(docs, (str, bytes, Mapping)) or not isinstance(docs, Sequence):
        raise ValueError(f"{name}: expected a list of documents (lists of token ids), got {_show(docs)}")
    if not docs:
        raise ValueError(f"{name}: no documents")
    if len(docs) > MAX_TOKENS:
        raise ValueError(f"{name}: {len(docs)} documents, over the limit of {MAX_TOKENS}")
    lengths = [_length(d, f"{name}[{i}]") for i, d in enumerate(docs)]  # per document: shapes only
    if sum(lengths) > MAX_TOKENS:
        raise ValueError(f"{name}: {sum(lengths)} tokens in all, over the limit of {MAX_TOKENS}")
    arrays = [int_array(d, f"{name}[{i}]") for i, d in enumerate(docs)]
    for i, a in enumerate(arrays):
        if a.size == 0:
            raise ValueError(f"{name}[{i}]: empty document")
    return arrays


def check_segments(segments, name: str = "segments") -> tuple[list[int], list[np.ndarray]]:
    """`[(parent_index, tokens), ...]`: parents integers (not 1.7, "0" or None), -1 or an earlier
    segment; tokens as `check_documents`."""
    if isinstance(segments, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(segments, Sequence):
        raise ValueError(f"{name}: expected a list of (parent_index, tokens) pairs, got {_show(segments)}")
    if not segments:
        raise ValueError(f"{name}: no segments")
    if len(segments) > MAX_TOKENS:
        raise ValueError(f"{name}: {len(segments)} segments, over the limit of {MAX_TOKENS}")
    parents, tokens = [], []
    for i, item in enumerate(segments):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"{name}[{i}]: expected (parent_index, tokens), got {_show(item)}")
        parent = item[0]
        if not _is_int(parent):
            raise ValueError(f"{name}[{i}]: parent must be an integer (-1 for a root), got {_show(parent)}")
        if not -1 <= int(parent) < i:
            raise ValueError(f"{name}[{i}]: parent {int(parent)} must be -1 or an earlier segment (0..{i - 1})")
        parents.append(int(parent))
        tokens.append(item[1])
    lengths = [_length(t, f"{name}[{i}] tokens") for i, t in enumerate(tokens)]
    if sum(lengths) > MAX_TOKENS:
        raise ValueError(f"{name}: {sum(lengths)} tokens in all, over the limit of {MAX_TOKENS}")
    arrays = [int_array(t, f"{name}[{i}] tokens") for i, t in enumerate(tokens)]
    for i, a in enumerate(arrays):
        if a.size == 0:
            raise ValueError(f"{name}[{i}]: empty segment")
    return parents, arrays


ROW_MASKS = ("completion_mask", "assistant_masks")  # TRL's per-token masks, packed beside the tokens
ROW_COLUMNS = (*ROW_MASKS, "token_type_ids")  # per-token columns packed beside the tokens (0 on padding)


def check_rows(rows, input_key: str) -> tuple[list[np.ndarray], list[str], list[np.ndarray] | None, dict]:
    """Dataset rows -> documents, their names for messages, their `labels` (if the rows bring
    them) and per-token columns (`completion_mask`, `assistant_masks`, `token_type_ids`). A row with
    `seq_lengths` (TRL's packing) holds several documents and is split at them. Every row must bring
    the same columns."""
    if isinstance(rows, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(rows, Sequence):
        raise ValueError(f"rows: expected a list of dataset rows (dicts of columns), got {_show(rows)}")
    if not rows:
        raise ValueError("rows: no rows")
    if len(rows) > MAX_TOKENS:
        raise ValueError(f"rows: {len(rows)} rows, over the limit of {MAX_TOKENS}")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"rows[{i}]: expected a dict of columns, got {_show(row)}")
        if input_key not in row:
            raise ValueError(f"rows[{i}]: no {input_key!r} column (columns: {sorted(map(str, row))})")
    optional = ("labels", *ROW_COLUMNS, "seq_lengths", "attention_mask")
    present = {c: c in rows[0] for c in optional}
    for i, row in enumerate(rows):
        for c in optional:
            if (c in row) != present[c]:
                raise ValueError(f"rows[{i}]: {'no' if present[c] else 'a'} {c!r} column, unlike rows[0]")
    total = sum(_length(row[input_key], f"rows[{i}][{input_key!r}]") for i, row in enumerate(rows))
    if total > MAX_TOKENS:
        raise ValueError(f"rows: {total} tokens in all, over the limit of {MAX_TOKENS}")
    docs, names, labels, masks = [], [], [] if present["labels"] else None, {c: [] for c in ROW_COLUMNS if present[c]}
    for i, row in enumerate(rows):
        where = f"rows[{i}][{input_key!r}]"
        ids = int_array(row[input_key], where)
        if ids.size == 0:
            raise ValueError(f"{where}: empty row")

        def column(name: str, **kind) -> np.ndarray:
            values = int_array(row[name], f"rows[{i}][{name!r}]", **kind)
            if values.size != ids.size:
                raise ValueError(f"rows[{i}][{name!r}]: {values.size} values for {ids.size} tokens")
            return values

        columns = {c: column(c, what="mask value" if c in ROW_MASKS else "value") for c in masks}
        if present["attention_mask"] and not column("attention_mask", what="mask value").all():
            raise ValueError(f"rows[{i}]['attention_mask']: the row holds padding (0s); pass rows without padding")
        for c, values in columns.items():
            if c in ROW_MASKS and (values > 1).any():
                j = int(np.argmax(values > 1))
                raise ValueError(f"rows[{i}][{c!r}][{j}]: expected 0 or 1, got {int(values[j])}")
        if labels is not None:
            columns["labels"] = column("labels", allow_ignore=True, what="label")
        cuts = []
        if present["seq_lengths"]:
            lengths = int_array(row["seq_lengths"], f"rows[{i}]['seq_lengths']", what="length")
            if lengths.size == 0 or (lengths == 0).any() or lengths.sum() != ids.size:
                raise ValueError(
                    f"rows[{i}]['seq_lengths']: expected positive lengths summing to the row's {ids.size} tokens, "
                    f"got {lengths.tolist()[:8]}{'...' if lengths.size > 8 else ''}"
                )
            cuts = np.cumsum(lengths)[:-1]
        pieces = np.split(ids, cuts)
        docs += pieces
        names += [where] if len(pieces) == 1 else [f"{where} document {j} (seq_lengths)" for j in range(len(pieces))]
        for c, values in columns.items():
            (labels if c == "labels" else masks[c]).extend(np.split(values, cuts))
    return docs, names, labels, masks


def check_packing(
    *,
    causal,
    max_length=None,
    pad_token_id=0,
    pad_to_multiple_of=1,
    pad_documents_to_multiple_of=1,
    flags: Mapping[str, object] = (),
) -> dict:
    """The scalar arguments shared by the packers and the collator, checked in one place."""
    out = {
        "causal": check_causal(causal),
        "max_length": None if max_length is None else check_int(max_length, "max_length", 1, MAX_TOKENS),
        "pad_token_id": check_int(pad_token_id, "pad_token_id", 0, np.iinfo(np.int64).max),
        "pad_to_multiple_of": check_int(pad_to_multiple_of, "pad_to_multiple_of", 1, MAX_TOKENS),
        "pad_documents_to_multiple_of": check_int(
            pad_documents_to_multiple_of, "pad_documents_to_multiple_of", 1, MAX_TOKENS
        ),
    }
    for key, value in dict(flags).items():
        out[key] = check_bool(value, key)
    return out
