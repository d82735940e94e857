"""`DocGraph`'s bulk building, the parts that need no graph: names to codes, spans and edge rows
checked over whole arrays. `core.py` keeps what reads or writes the graph's columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphattn.errors import GraphError


def local_codes(n: int, types: Any, what: str, source: str | None) -> tuple[Sequence[Any], np.ndarray]:
    """`add_nodes`' types (or `add_edges`' relations) as (names, int64 [n] index into names),
    names not yet checked."""
    if isinstance(types, str):
        return (types,), np.zeros(n, dtype=np.int64)
    if isinstance(types, tuple) and len(types) == 2 and isinstance(types[1], np.ndarray):
        names, local = types
        if not isinstance(names, (Sequence, np.ndarray)) or isinstance(names, (str, bytes)):
            raise GraphError(f"(names, codes): names must be a list, got {type(names).__name__}", file=source)
        typed = local.shape == (n,) and local.dtype.kind in "iu"
        if not typed or (n and not 0 <= local.min() <= local.max() < len(names)):
            raise GraphError(f"codes must be [{n}] integer indices into {len(names)} names", file=source)
        return names, local.astype(np.int64, copy=False)
    if not isinstance(types, (Sequence, np.ndarray)) or isinstance(types, (str, bytes)):
        name = "node type" if what == "nodes" else "relation"
        raise GraphError(
            f"{name} must be a non-empty string, a list of one per {what[:-1]} or (names, codes), "
            f"got {type(types).__name__}",
            file=source,
        )
    if len(types) != n:
        raise GraphError(f"{len(types)} names for {n} {what}", file=source)
    try:
        table = {t: k for k, t in enumerate(dict.fromkeys(types))}
    except TypeError:  # an unhashable name (a list, a dict)
        table = {None: 0}
    if not all(t.__class__ is str for t in table):  # a bad name: kept one per row, so the row is named
        return list(types), np.arange(n, dtype=np.int64)
    return list(table), np.fromiter((table[t] for t in types), dtype=np.int64, count=n)


def first_bad_span(spans: np.ndarray, length: int) -> int:
    """The first row whose span is neither (-1, -1) nor inside a text of `length` characters; len(spans)
    if none."""
    if not len(spans):
        return 0
    starts, ends = spans[:, 0], spans[:, 1]
    if starts.min() >= 0 and ends.max() <= length and (ends - starts).min() >= 0:
        return len(spans)  # every node has a span, inside the text: the common case, four operations
    has = starts >= 0
    bad = (has & ((ends < starts) | (ends > length))) | (~has & ((starts != -1) | (ends != -1)))
    return int(np.argmax(bad)) if bad.any() else len(spans)


def code_table(
    names: Sequence[Any], local: np.ndarray, register: Callable[[Any], int], check: Callable[[int, Any], None]
) -> np.ndarray:
    """The graph's code of each of `names` (those `local` uses, registered in the order given); every
    used name passes `check` (index, name) before the first is registered."""
    table = np.zeros(len(names), dtype=np.int64)
    used = np.bincount(local, minlength=len(names)) > 0 if len(names) > 1 else [len(local) > 0]
    for k, name in enumerate(names):
        if used[k]:
            check(k, name)
    for k, name in enumerate(names):
        if used[k]:
            table[k] = register(name)
    return table


def edge_rows(rows: Any, end: str, source: str | None) -> np.ndarray:
    """Edge end rows as int64: integers only (1.7 or "0" is refused, not rounded or parsed)."""
    array_ = np.asarray(rows)
    if array_.size and array_.dtype.kind not in "iu":
        raise GraphError(f"edge {end} rows must be integers, got {array_.dtype} values", file=source)
    return array_.astype(np.int64, copy=False)
