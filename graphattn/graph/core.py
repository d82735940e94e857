"""DocGraph: one document's text plus typed nodes and typed edges, stored as columns.

A node has an id, a type (declared by the relation schema), an optional character span
``[start, end)`` into the document text, and free-form attrs. An edge is ``(src, relation, dst)``.
Containment (document > paragraph > sentence) is an ordinary relation, conventionally
``contains`` from parent to child; the schema says which relations form the hierarchy.

Storage is columnar, so that a page of 100k elements is a few arrays rather than 100k objects:
node ids (a list), type codes, span starts and ends (-1: no span), edges as source/target row
indices with relation codes, and attrs as one column per name (`columns.py`). Builders add
one node at a time (`add_node`, `add_child`), many (`add_nodes`, `add_edges`: what the HTML
reader uses), or a whole graph at once (`from_columns`: what the JSON readers use), checked as
`add_node` checks but over arrays; the compiler reads the columns (`type_codes`, `span_array`,
`edge_arrays`, `attr_column`, `attr_values`). `graph.nodes`, `graph.node(id)`, `graph.edges`
and iteration give `Node` / `Edge` views of rows: reading them reads the columns, and writing a
view's span, type or attrs writes the columns, checked like `add_node` (a span past the text
raises there and then). The views live in `views.py`, the dict and networkx conversions in
`interchange.py`, the array checks of bulk building in `bulk.py`.

An edit that is refused changes nothing: every builder checks all it was given (ids, types,
relations, spans, attr columns, edge ends) before it stores any of it or registers a new type or
relation name, so a `GraphError` leaves the graph exactly as it was.

The graph checks what it can know alone (ids, dangling edges, spans: pairs of integers inside
the text); what the schema decides (which types and relations exist, overlapping spans of one
type, hierarchy cycles) is checked when compiling.
"""

from __future__ import annotations

import numbers
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphattn.errors import GraphError
from graphattn.graph.bulk import code_table, edge_rows, first_bad_span, local_codes
from graphattn.graph.columns import Column, add_columns, check_columns, set_attrs
from graphattn.graph.interchange import (
    graph_from_dict,
    graph_from_networkx,
    graph_to_dict,
    graph_to_networkx,
    plain_columns,
)
from graphattn.graph.views import Edge, EdgesView, EdgeView, Node, NodesView, NodeView, check_name, edge_name

if TYPE_CHECKING:
    import networkx as nx

CONTAINS = "contains"


class DocGraph:
    """A typed document graph. Build it with `add_node` / `add_edge`, `add_nodes`, or `from_dict`."""

    def __init__(self, text: str, doc_id: str | None = None, source: str | None = None):
        if not isinstance(text, str):
            raise GraphError(f"document text must be a str, got {type(text).__name__}", file=source, node=doc_id)
        self._text = text
        self.doc_id = doc_id
        self.source = source  # file (or other origin) the graph was read from, for error messages
        self._ids: list[str] = []
        self._index_map: dict[str, int] = {}  # id -> row, for rows [0, len(_index_map)) (built lazily after bulk adds)
        self._type_names: list[str] = []
        self._type_codes: dict[str, int] = {}
        self._types = array("q")
        self._starts, self._ends = array("q"), array("q")
        self._node_attrs: dict[str, Column] = {}
        self._src, self._dst, self._rel = array("q"), array("q"), array("q")
        self._relation_names: list[str] = []
        self._relation_codes: dict[str, int] = {}
        self._edge_attrs: dict[str, Column] = {}

    # -- the text ---------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        """Replace the text; every span must still lie inside it."""
        if not isinstance(value, str):
            raise GraphError(
                f"document text must be a str, got {type(value).__name__}", file=self.source, node=self.doc_id
            )
        ends = np.frombuffer(self._ends, dtype=np.int64) if len(self._ends) else np.zeros(0, np.int64)
        outside = np.flatnonzero(ends > len(value))
        if outside.size:
            row = int(outside[0])
            raise GraphError(
                f"span [{self._starts[row]}, {self._ends[row]}) would lie outside the new text of "
                f"{len(value)} characters",
                file=self.source,
                node=self._ids[row],
            )
        self._text = value

    # -- building -------------------------------------------------------------------------
    def add_node(self, node_id: str, type: str, span: tuple[int, int] | None = None, **attrs: Any) -> Node:
        # Written for speed: JSON readers call this once per node.
        node_id = node_id if node_id.__class__ is str else str(node_id)
        ids, index = self._ids, self._index_map
        if len(index) < len(ids):
            index = self._index()
        if node_id in index:
            raise GraphError(
                f"duplicate node id (first has type {self.node(node_id).type!r})", file=self.source, node=node_id
            )
        code = self._type_codes.get(type) if type.__class__ is str else None
        if code is None:
            check_name(type, "node type", self.source, node_id)
        start, end = (-1, -1) if span is None else self._check_span(node_id, span)
        if code is None:  # registered only once every check has passed: a failed add leaves the graph as it was
            code = self._type_code(node_id, type)
        row = len(ids)
        ids.append(node_id)
        index[node_id] = row
        self._types.append(code)
        self._starts.append(start)
        self._ends.append(end)
        if attrs:
            set_attrs(self._node_attrs, row, attrs)
        return NodeView(self, row)

    def add_edge(self, src: str, relation: str, dst: str, **attrs: Any) -> Edge:
        """Add ``src -[relation]-> dst``; both nodes must exist and the relation be a non-empty string
        (checked before anything is stored: a refused edge leaves the graph as it was)."""
        src, dst = str(src), str(dst)
        index = self._index_map
        if len(index) < len(self._ids):
            index = self._index()
        source, target = index.get(src), index.get(dst)
        if source is None or target is None:
            end, role = (src, "source") if source is None else (dst, "target")
            raise GraphError(
                f"edge {edge_name(src, relation, dst)}: {role} node {end!r} does not exist",
                file=self.source,
                node=end,
            )
        code = self._relation_codes.get(relation) if relation.__class__ is str else None
        if code is None:
            check_name(relation, "relation", self.source, src, f"edge {edge_name(src, relation, dst)}: ")
            code = self._relation_code(str(relation))
        row = len(self._src)
        self._src.append(source)
        self._dst.append(target)
        self._rel.append(code)
        if attrs:
            set_attrs(self._edge_attrs, row, attrs)
        return EdgeView(self, row)

    def add_child(
        self, parent: str, node_id: str, type: str, span: tuple[int, int] | None = None, **attrs: Any
    ) -> Node:
        """Add a node and a `contains` edge from `parent` to it (neither, if either is refused)."""
        parent = str(parent)
        if parent not in self._index():
            child = node_id if node_id.__class__ is str else str(node_id)
            raise GraphError(
                f"edge {edge_name(parent, CONTAINS, child)}: source node {parent!r} does not exist",
                file=self.source,
                node=parent,
            )
        node = self.add_node(node_id, type, span, **attrs)
        self.add_edge(parent, CONTAINS, node.id)
        return node

    def add_nodes(
        self,
        ids: Sequence[str],
        types: str | Sequence[str] | tuple[Sequence[str], np.ndarray],
        spans: np.ndarray | None = None,
        attrs: Mapping[str, Any] | None = None,
        *,
        validate: bool = True,
    ) -> int:
        """Add many nodes at once; returns the row of the first. The bulk path of builders.

        `types` is one type for all, one per node, or ``(names, codes)`` with an int array of
        indices into `names` (names are registered in the order given, those no node uses left
        out: list them in the order nodes first use them to number types as `add_node` would);
        `spans` an int array [n, 2] (-1, -1: no span); each attr a list of n values (`MISSING`
        where a node has none), an array of n, or ``(values, present)`` with a bool mask for an
        attr only some of the nodes have. Arrays are kept as given (not copied). The checks are
        `add_node`'s, run over the arrays, and the first failing row raises `add_node`'s error;
        ``validate=False`` skips ids, types and spans: for builders whose output holds the rules
        by construction (their tests should build the same graph with validation on).
        """
        n = len(ids)
        first = len(self._ids)
        ids = [i if i.__class__ is str else str(i) for i in ids] if validate else list(ids)
        spans = np.full((n, 2), -1, dtype=np.int64) if spans is None or (n == 0 and not np.size(spans)) else spans
        spans = np.asarray(spans)
        if spans.ndim != 2 or spans.shape != (n, 2) or spans.dtype.kind not in "iu":
            raise GraphError(
                f"spans must be an integer array [{n}, 2], got {spans.dtype} {list(spans.shape)}", file=self.source
            )
        type_names, local = local_codes(n, types, "nodes", self.source)
        if validate:
            self._check_new_nodes(ids, type_names, local, spans)
        if attrs:
            attrs = dict(attrs)
            bad = next((k for k in attrs if not isinstance(k, str)), None)
            if bad is not None:
                raise GraphError(f"attr names must be strings, got {bad!r}", file=self.source)
            problem = check_columns(attrs, n, "nodes")
            if problem:
                raise GraphError(problem, file=self.source)
        # every check has passed: from here on nothing raises, so a refused batch leaves the graph as it was
        table = code_table(type_names, local, lambda name: self._type_code(None, name), self._name_check("node type"))
        self._ids.extend(ids)
        self._types.frombytes(np.full(n, table[0]).tobytes() if len(table) == 1 else table[local].tobytes())
        self._starts.frombytes(np.ascontiguousarray(spans[:, 0], dtype=np.int64).tobytes())
        self._ends.frombytes(np.ascontiguousarray(spans[:, 1], dtype=np.int64).tobytes())
        if attrs:
            add_columns(self._node_attrs, first, attrs)
        return first

    def _check_new_nodes(self, ids: list[str], type_names: Sequence[Any], local: np.ndarray, spans: np.ndarray) -> None:
        """`add_node`'s checks over a batch: the first row that fails raises that row's error."""
        n = len(ids)
        index = self._index()
        duplicate = n  # first row whose id an earlier row (or the graph) has
        if len(set(ids)) < n or not index.keys().isdisjoint(ids):
            seen: dict[str, int] = {}
            for row, node_id in enumerate(ids):
                if node_id in index or node_id in seen:
                    duplicate = row
                    break
                seen[node_id] = row
        bad_names = [k for k, name in enumerate(type_names) if not isinstance(name, str) or not name]
        bad_type = int(np.flatnonzero(np.isin(local, bad_names))[0]) if bad_names and n else n
        bad_span = first_bad_span(spans, len(self._text))
        row = min(duplicate, bad_type, bad_span)
        if row == n:
            return
        node_id = ids[row]
        if row == duplicate:
            earlier = self.node(node_id).type if node_id in index else type_names[local[ids.index(node_id)]]
            raise GraphError(f"duplicate node id (first has type {earlier!r})", file=self.source, node=node_id)
        if row == bad_type:
            self._type_code(node_id, type_names[local[row]])  # raises with the usual message
        self._check_span(node_id, (int(spans[row, 0]), int(spans[row, 1])))  # raises with the usual message
        raise GraphError("a span without a start must be (-1, -1)", file=self.source, node=node_id)

    def add_edges(
        self,
        src: Sequence[int] | np.ndarray,
        relation: str | Sequence[str] | tuple[Sequence[str], np.ndarray],
        dst: Sequence[int] | np.ndarray,
    ) -> None:
        """Add many edges between node *rows* (as `add_nodes` numbers them), in the order given.

        `relation` is one relation for all, one per edge, or ``(names, codes)`` like `add_nodes`' types.
        """
        if isinstance(relation, str) and type(src) in (list, range) and type(dst) in (list, range):
            self._add_edge_rows(src, relation, dst)  # a reader's few edges: no numpy round trip
            return
        src, dst = edge_rows(src, "source", self.source), edge_rows(dst, "target", self.source)
        n_nodes = len(self._ids)
        if src.shape != dst.shape or src.ndim != 1:
            raise GraphError(
                f"edge rows must be two 1-d arrays of one length, got {src.shape} and {dst.shape}", file=self.source
            )
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n_nodes):
            bad = (src < 0) | (src >= n_nodes) | (dst < 0) | (dst >= n_nodes)
            i = int(np.argmax(bad))
            raise GraphError(
                f"edge {i} of a bulk add joins rows {int(src[i])} -> {int(dst[i])}, outside the {n_nodes} nodes",
                file=self.source,
            )
        if not src.size:
            return  # nothing to add, and no relation to register (as `add_edge` would not)
        if isinstance(relation, str):
            check_name(relation, "relation", self.source, None, "every edge of a bulk add: ")
            codes = np.full(src.shape, self._relation_code(relation), dtype=np.int64)
        else:
            names, local = local_codes(src.size, relation, "edges", self.source)
            check = self._name_check("relation", lambda k: f"edge {int(np.argmax(local == k))} of a bulk add: ")
            codes = code_table(names, local, lambda name: self._relation_code(str(name)), check)[local]
        self._src.frombytes(src.tobytes())
        self._dst.frombytes(dst.tobytes())
        self._rel.frombytes(codes.tobytes())

    def _add_edge_rows(self, src: list[int] | range, relation: str, dst: list[int] | range) -> None:
        """`add_edges` of one relation for Python lists of rows, checked with Python's min / max."""
        try:
            kinds = {int} if type(src) is range and type(dst) is range else {*map(type, src), *map(type, dst)}
            src_rows, dst_rows = (array("q", src), array("q", dst)) if kinds <= {int} else (None, None)
        except (TypeError, OverflowError):  # rows that are no (64-bit) integers: the general path says which
            src_rows = dst_rows = None
        if src_rows is None or len(src_rows) != len(dst_rows) or not len(src_rows) or not relation:
            self.add_edges(np.asarray(src), relation, np.asarray(dst))
            return
        if min(min(src_rows), min(dst_rows)) < 0 or max(max(src_rows), max(dst_rows)) >= len(self._ids):
            self.add_edges(np.asarray(src), relation, np.asarray(dst))  # raises, naming the first bad edge
            return
        self._src.extend(src_rows)
        self._dst.extend(dst_rows)
        self._rel.extend(array("q", [self._relation_code(relation)]) * len(src_rows))

    @classmethod
    def from_columns(
        cls,
        text: str,
        ids: Sequence[str],
        types: str | Sequence[str] | tuple[Sequence[str], np.ndarray],
        spans: np.ndarray | None = None,
        attrs: Mapping[str, Any] | None = None,
        edges: tuple[np.ndarray, str | Sequence[str] | tuple[Sequence[str], np.ndarray], np.ndarray] | None = None,
        *,
        doc_id: str | None = None,
        source: str | None = None,
    ) -> DocGraph:
        """A whole graph in one call, from node columns (`add_nodes`' arguments) and edges as
        ``(source rows, relation(s), target rows)`` (`add_edges`'): what readers that know every
        node up front use, so that building costs a few array operations, not calls per node.
        Checked like `add_node` / `add_edge` (the first bad row raises their error)."""
        graph = cls(text, doc_id, source)
        graph.add_nodes(ids, types, spans, attrs)
        if edges is not None:
            graph.add_edges(*edges)
        return graph

    def extend(self, nodes: Iterable[Node], edges: Iterable[Edge] = (), *, validate: bool = True) -> None:
        """Add many nodes, then many edges (they may join any nodes of the graph by then): all of
        them, or, if any is refused, none (every node and edge is checked before the first is stored).

        With ``validate=False`` the nodes go in without the checks of `add_node` (unique ids,
        spans inside the text); edge ends must exist either way, since edges are stored as rows.
        """
        ids, types, spans, attrs, edge_columns = plain_columns(self, list(nodes), list(edges), validate)
        self.add_nodes(ids, types, spans, attrs, validate=validate)
        first_edge = len(self._src)
        src, relations, dst, edge_attrs = edge_columns
        if src:
            self.add_edges(src, relations, dst)
            if edge_attrs:
                add_columns(self._edge_attrs, first_edge, edge_attrs)

    # -- checks -----------------------------------------------------------------------------
    def _index(self) -> dict[str, int]:
        index = self._index_map
        if len(index) < len(self._ids):  # rows added in bulk since the last lookup
            index.update(zip(self._ids[len(index) :], range(len(index), len(self._ids))))
        return index

    def _type_code(self, node_id: str | None, type: Any) -> int:
        code = self._type_codes.get(type) if isinstance(type, str) else None
        if code is None:
            if not isinstance(type, str) or not type:
                raise GraphError(f"node type must be a non-empty string, got {type!r}", file=self.source, node=node_id)
            code = self._type_codes[type] = len(self._type_names)
            self._type_names.append(type)
        return code

    def _relation_code(self, relation: str) -> int:
        code = self._relation_codes.get(relation)
        if code is None:
            code = self._relation_codes[relation] = len(self._relation_names)
            self._relation_names.append(relation)
        return code

    def _name_check(self, what: str, prefix: Callable[[int], str] | None = None) -> Callable[[int, Any], None]:
        """`check_name` for `_code_table`: (index into the names, name) -> None or GraphError."""
        return lambda k, name: check_name(name, what, self.source, None, prefix(k) if prefix else "")

    def _check_span(self, node_id: str, span: Any) -> tuple[int, int]:
        """A span is a pair of integers (not bools, not floats, not strings) inside the text."""
        if type(span) in (tuple, list) and len(span) == 2 and type(span[0]) is int and type(span[1]) is int:
            if 0 <= span[0] <= span[1] <= len(self._text):  # the common case, checked without the general path
                return span[0], span[1]
        pair = None
        if not isinstance(span, (str, bytes, Mapping)):
            try:
                pair = tuple(span)
            except TypeError:
                pass
        if (
            pair is None
            or len(pair) != 2
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in pair)
        ):
            raise GraphError(f"span must be a pair of ints [start, end), got {span!r}", file=self.source, node=node_id)
        start, end = int(pair[0]), int(pair[1])
        if start > end:
            raise GraphError(f"span [{start}, {end}) ends before it starts", file=self.source, node=node_id)
        if start < 0 or end > len(self._text):
            raise GraphError(
                f"span [{start}, {end}) lies outside the document text of {len(self._text)} characters",
                file=self.source,
                node=node_id,
            )
        return start, end

    def _set_span(self, row: int, span: Any) -> None:
        start, end = (-1, -1) if span is None else self._check_span(self._ids[row], span)
        self._starts[row], self._ends[row] = start, end

    # -- reading --------------------------------------------------------------------------
    @property
    def nodes(self) -> Mapping[str, Node]:
        return NodesView(self)

    @property
    def edges(self) -> EdgesView:
        return EdgesView(self)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[Node]:
        return (NodeView(self, row) for row in range(len(self._ids)))

    def node(self, node_id: str) -> Node:
        row = self._index().get(node_id)
        if row is None:
            raise GraphError("no such node", file=self.source, node=node_id)
        return NodeView(self, row)

    def nodes_of_type(self, type: str) -> list[Node]:
        code = self._type_codes.get(type)
        if code is None:
            return []
        return [NodeView(self, int(row)) for row in np.flatnonzero(self.type_codes()[0] == code)]

    def edges_of(self, relation: str) -> list[Edge]:
        code = self._relation_codes.get(relation)
        if code is None:
            return []
        return [EdgeView(self, int(row)) for row in np.flatnonzero(np.frombuffer(self._rel, np.int64) == code)]

    def span_text(self, node_id: str) -> str:
        span = self.node(node_id).span
        return "" if span is None else self._text[span[0] : span[1]]

    def __repr__(self) -> str:
        codes, names = self.type_codes()
        counts = np.bincount(codes, minlength=len(names)) if codes.size else np.zeros(0, np.int64)
        common = sorted(range(len(names)), key=lambda c: -counts[c])[:4]
        kinds = ", ".join(f"{names[c]} {counts[c]:,}" for c in common if counts[c])
        more = ", ..." if len(names) > 4 else ""
        where = f", source={self.source!r}" if self.source else ""
        return (
            f"DocGraph(doc_id={self.doc_id!r}, {len(self._text):,} chars, {len(self):,} nodes"
            f"{f' ({kinds}{more})' if kinds else ''}, {len(self._src):,} edges{where})"
        )

    # -- columns (what the compiler reads) --------------------------------------------------
    @property
    def node_ids(self) -> list[str]:
        """Node ids in row order (a copy)."""
        return list(self._ids)

    def node_id_list(self) -> list[str]:
        """Node ids in row order, the graph's own list (not a copy: read it, never change it).
        Rows are only ever appended, so a row's id stays; the compiler indexes this list rather
        than copy half a million ids of a large page."""
        return self._ids

    def type_codes(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """(int64 [N] code per node, the type name of each code)."""
        return np.frombuffer(self._types, dtype=np.int64).copy() if len(self._types) else np.zeros(0, np.int64), tuple(
            self._type_names
        )

    def span_array(self) -> np.ndarray:
        """int64 [N, 2] spans, (-1, -1) for a node without one."""
        out = np.empty((len(self._ids), 2), dtype=np.int64)
        if len(self._ids):
            out[:, 0] = np.frombuffer(self._starts, dtype=np.int64)
            out[:, 1] = np.frombuffer(self._ends, dtype=np.int64)
        return out

    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
        """(source rows, target rows, relation codes), int64 [E] each, and the relation of each code."""

        def col(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.int64).copy() if len(a) else np.zeros(0, np.int64)

        return col(self._src), col(self._dst), col(self._rel), tuple(self._relation_names)

    def attr_column(self, name: str, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(present bool [N], values [N]) of one node attr: typed where a bulk builder gave an
        array, else objects (None where absent). With `rows`, of those rows only."""
        column = self._node_attrs.get(name)
        n = len(self._ids)
        if column is None:
            m = n if rows is None else len(rows)
            return np.zeros(m, dtype=bool), np.full(m, None, dtype=object)
        return column.dense(n) if rows is None else column.rows(np.asarray(rows, dtype=np.int64))

    def attr_values(self, name: str, rows: np.ndarray | Sequence[int], default: Any = None) -> list:
        """One node attr of `rows` as plain Python values (`default` where a row has none): what
        ``[graph.node(ids[r]).attrs.get(name, default) for r in rows]`` gives, without a view per node."""
        column = self._node_attrs.get(name)
        rows = np.asarray(rows, dtype=np.int64)
        if column is None:
            return [default] * rows.size
        present, values = column.rows(rows)
        if present.all():
            return values.tolist()
        return [v if p else default for v, p in zip(values.tolist(), present.tolist())]

    # -- plain dicts and networkx (interchange) -----------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """``{"doc_id", "text", "nodes", "edges"}``, the form `from_dict` reads."""
        return graph_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> DocGraph:
        """Build from ``{"text", "doc_id"?, "nodes": [{id, type, span?, attrs?}], "edges": [{src, relation, dst,
        attrs?}]}``; every value is checked (spans are pairs of ints, attrs mappings), naming the node."""
        return graph_from_dict(cls, data, source)

    def to_networkx(self) -> nx.MultiDiGraph:
        """A MultiDiGraph: node attrs `type`, `span`, attrs; edge key and attr `relation`."""
        return graph_to_networkx(self)

    @classmethod
    def from_networkx(cls, g: nx.Graph, text: str | None = None, doc_id: str | None = None) -> DocGraph:
        """Inverse of `to_networkx`; any networkx graph whose nodes carry a `type` attribute."""
        return graph_from_networkx(cls, g, text, doc_id)
