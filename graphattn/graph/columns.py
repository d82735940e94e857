"""The storage under `DocGraph`: attrs as columns over node (or edge) rows, and mapping views.

A column holds one attr name's values for a run of rows ``[start, start + len)``; rows outside
it, or marked absent, do not have the attr. Values are a Python list (what per-node building
appends to, absent rows hold `MISSING`) or a numpy array with an optional presence mask (what
bulk builders such as the HTML reader hand over, never copied into Python objects), or a
`Deferred` that computes such an array the first time the column is read (the HTML reader's
xpaths: built only for whoever reads them). Reading one row gives a plain Python value either
way; `dense` gives the whole column as arrays, which is how the compiler reads attrs (no object
per node).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any, Protocol

import numpy as np

from graphattn.errors import GraphError

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING", "__reduce__": lambda self: "MISSING"})()
"""The value of a row that does not have the attr (a singleton that survives pickling)."""


class Deferred:
    """Column values computed on first read: ``fn(*args)`` must return a numpy array."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., np.ndarray], *args: Any):
        self.fn, self.args = fn, args

    def __len__(self) -> int:
        return len(self._array())

    def _array(self) -> np.ndarray:
        return self.fn(*self.args)


class Column:
    """One attr over rows: list or numpy values from row `start`, plus a presence mask for arrays."""

    __slots__ = ("start", "_values", "present")

    def __init__(
        self, start: int = 0, values: list | np.ndarray | Deferred | None = None, present: np.ndarray | None = None
    ):
        self.start = start
        self._values: list | np.ndarray | Deferred = [] if values is None else values
        self.present = present  # bool array like `values` (arrays only); None: every row present

    @property
    def values(self) -> list | np.ndarray:
        if isinstance(self._values, Deferred):
            self._values = self._values._array()
        return self._values

    @values.setter
    def values(self, values: list | np.ndarray) -> None:
        self._values = values

    def get(self, row: int) -> Any:
        i = row - self.start
        values = self.values
        if i < 0 or i >= len(values):
            return MISSING
        if isinstance(values, list):
            return values[i]
        if self.present is not None and not self.present[i]:
            return MISSING
        return values.item(i)  # a plain Python value (bool, int, float, str, object)

    def set(self, row: int, value: Any) -> None:
        values = self._values
        if type(values) is list and values and row >= self.start + len(values):  # what building node by node does
            if row > self.start + len(values):
                values.extend([MISSING] * (row - self.start - len(values)))
            values.append(value)
            return
        self._as_list()
        values: list = self.values  # type: ignore[assignment]
        if not values:
            self.start = row
        elif row < self.start:
            values[:0] = [MISSING] * (self.start - row)
            self.start = row
        i = row - self.start
        if i < len(values):
            values[i] = value
        else:
            values.extend([MISSING] * (i - len(values)))
            values.append(value)

    def delete(self, row: int) -> None:
        if self.get(row) is not MISSING:
            self.set(row, MISSING)

    def extend(self, start: int, values: list | np.ndarray | Deferred, present: np.ndarray | None) -> None:
        """Rows ``[start, start + len(values))`` get `values` (where `present`, if given)."""
        if isinstance(values, Deferred) and not len(self.values):
            self.start, self.values, self.present = start, values, present  # type: ignore[assignment]
            return
        if isinstance(values, Deferred):
            values = values._array()
        if not len(self.values) and isinstance(values, np.ndarray):
            self.start, self.values, self.present = start, values, present
            return
        self._as_list()
        new = values.tolist() if isinstance(values, np.ndarray) else list(values)
        if present is not None:
            new = [v if p else MISSING for v, p in zip(new, present.tolist())]
        if not self.values:
            self.start, self.values = start, new
            return
        end = self.start + len(self.values)
        self.values.extend([MISSING] * (start - end))  # type: ignore[union-attr]
        self.values.extend(new)  # type: ignore[union-attr]

    def _as_list(self) -> None:
        if isinstance(self.values, np.ndarray):
            values = self.values.tolist()
            if self.present is not None:
                values = [v if p else MISSING for v, p in zip(values, self.present.tolist())]
            self.values, self.present = values, None

    def rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`dense` of just these rows (without materializing the others)."""
        values = self.values
        i = rows - self.start
        inside = (i >= 0) & (i < len(values))
        j = np.where(inside, i, 0)
        if isinstance(values, np.ndarray):
            if not len(values):
                return inside, np.zeros(rows.size, dtype=values.dtype)
            present = inside if self.present is None else inside & self.present[j]
            out = values[j]
            out[~present] = None if values.dtype == object else 0  # as `dense` has them
            return present, out
        picked = np.full(rows.size, None, dtype=object)
        got = [values[k] for k in j[inside].tolist()]
        present = inside.copy()
        if got:
            picked[inside] = np.fromiter(got, dtype=object, count=len(got))
            present[inside] = np.fromiter((v is not MISSING for v in got), dtype=bool, count=len(got))
        picked[~present] = None
        return present, picked

    def dense(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(present bool [n], values [n]) over rows 0..n-1: a typed array where the builder gave
        one, else an object array (absent rows hold None)."""
        present = np.zeros(n, dtype=bool)
        stop = min(self.start + len(self.values), n)
        count = max(stop - self.start, 0)
        if isinstance(self.values, np.ndarray):
            values = (
                np.zeros(n, dtype=self.values.dtype) if self.values.dtype != object else np.full(n, None, dtype=object)
            )
            values[self.start : stop] = self.values[:count]
            present[self.start : stop] = True if self.present is None else self.present[:count]
            return present, values
        window = self.values[:count]
        values = np.full(n, None, dtype=object)
        if count:
            values[self.start : stop] = np.fromiter(window, dtype=object, count=count)
            present[self.start : stop] = np.fromiter((v is not MISSING for v in window), dtype=bool, count=count)
            values[~present] = None
        return present, values


class RowAttrs(MutableMapping):
    """The attrs of one row, read from and written to the graph's columns (a live view)."""

    __slots__ = ("_columns", "_row")

    def __init__(self, columns: dict[str, Column], row: int):
        self._columns = columns
        self._row = row

    def __getitem__(self, key: str) -> Any:
        column = self._columns.get(key)
        value = MISSING if column is None else column.get(self._row)
        if value is MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        column = self._columns.get(key)
        value = MISSING if column is None else column.get(self._row)
        return default if value is MISSING else value

    def __contains__(self, key: object) -> bool:
        column = self._columns.get(key)  # type: ignore[call-overload]
        return column is not None and column.get(self._row) is not MISSING

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):  # names become keyword arguments and column names, as in `add_node`
            raise GraphError(f"attr names must be strings, got {key!r}")
        column = self._columns.get(key)
        if column is None:
            column = self._columns[key] = Column()
        column.set(self._row, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._columns[key].delete(self._row)

    def __iter__(self) -> Iterator[str]:
        row = self._row
        return (key for key, column in self._columns.items() if column.get(row) is not MISSING)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


def set_attrs(columns: dict[str, Column], row: int, attrs: dict[str, Any]) -> None:
    """Give a new row its attrs (one `Column.set` per key)."""
    for key, value in attrs.items():
        column = columns.get(key)
        if column is None:
            column = columns[key] = Column()
        column.set(row, value)


def check_columns(attrs: dict[str, Any], n: int, what: str) -> str | None:
    """Why the bulk attrs cannot go in (None when they can): every attr holds one value per row, as a
    list, an array, a `Deferred` or (values, present). Checked before any column changes."""
    for key, given in attrs.items():
        if given.__class__ is tuple and len(given) != 2:
            return f"attr column {key!r} must be values or (values, present), got a tuple of {len(given)}"
        values, present = given if given.__class__ is tuple else (given, None)
        if isinstance(values, Deferred):
            count = n
        elif isinstance(values, (list, tuple, np.ndarray)):
            count = len(values)
        else:
            return f"attr column {key!r} must be a list or an array of {n} values, got {type(values).__name__}"
        if count != n:
            return f"attr column {key!r} has {count} values for {n} {what}"
        if present is not None and (np.ndim(present) != 1 or len(present) != n):
            return f"attr column {key!r}: its presence mask must hold {n} values, one per row"
    return None


def add_columns(columns: dict[str, Column], start: int, attrs: dict[str, Any]) -> None:
    """Bulk attrs for rows ``[start, start + n)`` (`check_columns` first): each value a list of n
    (`MISSING` where a row has none), an array of n (or a `Deferred` one), or (values, present)."""
    for key, given in attrs.items():
        column = columns.get(key)
        if column is None and given.__class__ is list:  # a reader's new column: kept as one list
            columns[key] = Column(start, list(given))
            continue
        values, present = given if given.__class__ is tuple else (given, None)
        if present is not None:
            present = np.asarray(present, dtype=bool)
        if column is None:
            column = columns[key] = Column()
        column.extend(start, values, present)


class ColumnarGraph(Protocol):
    """What the row views (`graphattn.graph.views`) and the conversions (`.interchange`) use of a
    `DocGraph` (`graphattn.graph.core`): its columns and checks. A protocol here, below all three,
    so that the graph imports its views and conversions and they never import the graph."""

    doc_id: str | None
    source: str | None
    _ids: list[str]
    _type_names: list[str]
    _types: array
    _starts: array
    _ends: array
    _node_attrs: dict[str, Column]
    _src: array
    _dst: array
    _rel: array
    _relation_names: list[str]
    _edge_attrs: dict[str, Column]

    @property
    def text(self) -> str: ...

    @property
    def edges(self) -> Sequence[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...

    def _index(self) -> dict[str, int]: ...

    def _type_code(self, node_id: str | None, type: Any) -> int: ...

    def _set_span(self, row: int, span: Any) -> None: ...

    def _check_span(self, node_id: str, span: Any) -> tuple[int, int]: ...

    def add_node(self, node_id: str, type: str, span: tuple[int, int] | None = None, **attrs: Any) -> Any: ...

    def add_edge(self, src: str, relation: str, dst: str, **attrs: Any) -> Any: ...
