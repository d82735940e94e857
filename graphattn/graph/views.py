"""The per-row face of a `DocGraph`: plain `Node` / `Edge` values, and live views of rows.

A view reads the graph's columns when asked and writes them back through the graph's own checks
(a span past the text raises there and then), so code written against objects keeps working
while the graph stays columnar. The views reach into the graph's private columns: this module is
the graph's other half, split off only to keep `core.py` about storage and building.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphattn.errors import GraphError
from graphattn.graph.columns import ColumnarGraph, RowAttrs


@dataclass
class Node:
    """A node as plain values (what `DocGraph.extend` takes); graphs hand out live views of it."""

    id: str
    type: str
    span: tuple[int, int] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Edge:
    """An edge as plain values; `graph.edges` holds live views of it."""

    src: str
    relation: str
    dst: str
    attrs: dict[str, Any] = field(default_factory=dict)


class NodeView(Node):
    """Row `row` of a graph, read (and written, with the graph's checks) through its columns."""

    def __init__(self, graph: ColumnarGraph, row: int):  # noqa: D107 - no dataclass fields of its own
        self._graph, self._row = graph, row

    @property
    def id(self) -> str:  # type: ignore[override]
        return self._graph._ids[self._row]

    @property
    def type(self) -> str:  # type: ignore[override]
        return self._graph._type_names[self._graph._types[self._row]]

    @type.setter
    def type(self, value: str) -> None:
        self._graph._types[self._row] = self._graph._type_code(self.id, value)

    @property
    def span(self) -> tuple[int, int] | None:  # type: ignore[override]
        start = self._graph._starts[self._row]
        return None if start < 0 else (start, self._graph._ends[self._row])

    @span.setter
    def span(self, value: Any) -> None:
        self._graph._set_span(self._row, value)

    @property
    def attrs(self) -> RowAttrs:  # type: ignore[override]
        return RowAttrs(self._graph._node_attrs, self._row)

    @attrs.setter
    def attrs(self, value: Mapping[str, Any]) -> None:
        value = checked_attrs(value, self._graph.source, self.id)
        view = self.attrs
        for key in list(view):
            del view[key]
        view.update(value)

    def __repr__(self) -> str:
        return f"Node(id={self.id!r}, type={self.type!r}, span={self.span!r}, attrs={dict(self.attrs)!r})"


class EdgeView(Edge):
    def __init__(self, graph: ColumnarGraph, row: int):  # noqa: D107
        self._graph, self._row = graph, row

    @property
    def src(self) -> str:  # type: ignore[override]
        return self._graph._ids[self._graph._src[self._row]]

    @property
    def relation(self) -> str:  # type: ignore[override]
        return self._graph._relation_names[self._graph._rel[self._row]]

    @property
    def dst(self) -> str:  # type: ignore[override]
        return self._graph._ids[self._graph._dst[self._row]]

    @property
    def attrs(self) -> RowAttrs:  # type: ignore[override]
        return RowAttrs(self._graph._edge_attrs, self._row)

    def __repr__(self) -> str:
        return f"Edge(src={self.src!r}, relation={self.relation!r}, dst={self.dst!r}, attrs={dict(self.attrs)!r})"


class NodesView(Mapping):
    """`graph.nodes`: node id -> Node view, in insertion order."""

    def __init__(self, graph: ColumnarGraph):
        self._graph = graph

    def __getitem__(self, node_id: str) -> Node:
        return NodeView(self._graph, self._graph._index()[node_id])

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._graph._index()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._graph._ids))

    def __len__(self) -> int:
        return len(self._graph._ids)

    def __repr__(self) -> str:
        return f"<{len(self)} nodes of {self._graph!r}>"


class EdgesView(Sequence):
    """`graph.edges`: Edge views in insertion order; `append` adds an edge (checked)."""

    def __init__(self, graph: ColumnarGraph):
        self._graph = graph

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [EdgeView(self._graph, row) for row in range(len(self))[i]]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return EdgeView(self._graph, i)

    def __len__(self) -> int:
        return len(self._graph._src)

    def append(self, edge: Edge) -> None:
        self._graph.add_edge(edge.src, edge.relation, edge.dst, **dict(edge.attrs))

    def extend(self, edges: Iterable[Edge]) -> None:
        """Append every edge, or none if one is refused (`DocGraph.extend`)."""
        self._graph.extend((), edges)

    def __repr__(self) -> str:
        return f"<{len(self)} edges of {self._graph!r}>"


def checked_attrs(attrs: Any, source: str | None, node: str, path: tuple = ()) -> dict[str, Any]:
    """Attrs are a mapping with string keys (they become keyword arguments and column names)."""
    if not isinstance(attrs, Mapping):
        raise GraphError(
            f"attrs must be an object (a mapping of names to values), got {type(attrs).__name__}",
            file=source,
            path=path,
            node=node,
        )
    bad = next((k for k in attrs if not isinstance(k, str)), None)
    if bad is not None:
        raise GraphError(f"attr names must be strings, got {bad!r}", file=source, path=path, node=node)
    return dict(attrs)


def check_name(name: Any, what: str, source: str | None, node: str | None, prefix: str = "", path: tuple = ()) -> None:
    """A node type or relation is a non-empty string (it becomes a schema key and a column code)."""
    if not isinstance(name, str) or not name:
        message = f"{prefix}{what} must be a non-empty string, got {short(name)}"
        raise GraphError(message, file=source, path=path, node=node)


def edge_name(src: str, relation: Any, dst: str) -> str:
    """How messages name an edge: ``'a' -[mentions]-> 'b'``."""
    return f"{src!r} -[{relation if isinstance(relation, str) else short(relation)}]-> {dst!r}"


def short(value: Any, limit: int = 60) -> str:
    """repr of a value for a one-line message, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
