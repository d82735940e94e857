"""Arrow columns from numpy arrays and Python lists, built from their buffers.

`pa.array` consults pyarrow's pandas shim on its first call in a process, which imports pandas
wherever it is installed: 0.4-0.8 s in every worker process, as much as compiling a hundred
small documents. Shard columns are plain numbers, strings and lists of them, so they are
assembled here from their buffers (`pa.Array.from_buffers`), which never touches pandas. The
arrays are the ones `pa.array` makes (same type, values and nulls), so the Parquet bytes are too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

_NUMPY_OF = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}
_OFFSET_LIMIT = 2**31 - 1  # int32 offsets: past this pa.array's own chunking takes over


def _validity(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap (least significant bit first) and the null count; None when no nulls."""
    nulls = int(valid.size - np.count_nonzero(valid))
    return (None, 0) if nulls == 0 else (pa.py_buffer(np.packbits(valid, bitorder="little")), nulls)


def _offsets(lengths: np.ndarray) -> pa.Buffer:
    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.py_buffer(offsets)


def numbers(values: Any, type: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A flat numeric or bool array; `valid` marks non-null slots (all, when None)."""
    if pa.types.is_boolean(type):
        data = pa.py_buffer(np.packbits(np.asarray(values, dtype=bool), bitorder="little"))
        length = len(values)
    else:
        array = np.ascontiguousarray(values, dtype=_NUMPY_OF[type])
        data, length = pa.py_buffer(array), array.size
    bitmap, nulls = _validity(valid) if valid is not None else (None, 0)
    return pa.Array.from_buffers(type, length, [bitmap, data], null_count=nulls)


def strings(values: Sequence[str | None]) -> pa.Array:
    """A string array (None is null); lone surrogates fail as UTF-8 encoding does."""
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    encoded = [v.encode("utf-8") if v is not None else b"" for v in values]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    if int(lengths.sum()) > _OFFSET_LIMIT:
        return pa.array(values, type=pa.string())
    bitmap, nulls = _validity(valid)
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(values), [bitmap, _offsets(lengths), data], null_count=nulls)


def lists(rows: Sequence[Any], type: pa.ListType) -> pa.Array:
    """A list column: one list per row (numpy arrays or Python lists; None inside is a null item)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    if int(lengths.sum()) > _OFFSET_LIMIT:
        return pa.array(rows, type=type)
    item = type.value_type
    if pa.types.is_string(item):
        flat = strings([v for row in rows for v in row])
    elif rows and all(isinstance(row, np.ndarray) for row in rows):
        flat = numbers(np.concatenate(rows), item)
    else:
        items = [v for row in rows for v in row]
        valid = np.fromiter((v is not None for v in items), dtype=bool, count=len(items))
        flat = numbers([0 if v is None else v for v in items], item, valid)
    return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(rows) + 1, [None, _offsets(lengths)]), flat)


def column(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """One shard column of any type the format uses: lists, strings, numbers, bools."""
    if pa.types.is_list(type):
        return lists(values, type)
    if pa.types.is_string(type):
        return strings(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    return numbers([0 if v is None else v for v in values], type, valid)
