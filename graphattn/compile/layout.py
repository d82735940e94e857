"""Pass 1: check one DocGraph against the schema and lay it out over its tokens.

The result (`DocLayout`) is independent of truncation: every node as a token range, the
containment forest, document order, which nodes become globals, which tokens are long text.
Later passes choose which tokens to keep and assemble instances from it.

Checks made here, each naming the node and the files involved: undeclared node types and
relations, dangling edges, spans past the text, crossing spans of one type, a node with two
parents or a cycle in a hierarchy relation, a child span outside its parent's, an empty
document.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphattn.compile.ranges import coverage
from graphattn.errors import CompileError, GraphError
from graphattn.graph import DocGraph
from graphattn.schema import Schema
from graphattn.tokenize import Tokenizer, spans_to_token_ranges


@dataclass
class DocLayout:
    """One document over its tokens. Node arrays are indexed like `node_ids`."""

    graph: DocGraph
    token_ids: np.ndarray  # [T] int32, the whole text tokenized once
    offsets: np.ndarray  # [T, 2] int32 char [start, end)
    node_ids: list[str]
    node_type: np.ndarray  # [N] index into schema type names (`type_names`)
    type_names: tuple[str, ...]
    spans: np.ndarray  # [N, 2] int64 effective char span (span-less parents cover children); -1 none
    has_span: np.ndarray  # [N] bool
    ranges: np.ndarray  # [N, 2] int64 token range [start, end) (empty when no span)
    parent: np.ndarray  # [N] int64 hierarchy parent, -1 for roots
    depth: np.ndarray  # [N] int64
    rank: np.ndarray  # [N] int64 document order (spanned nodes in pre-order, then the rest)
    selected: np.ndarray  # [N] bool: becomes a global (global type and `where` matches)
    is_long: np.ndarray  # [T] bool: token is long text
    in_long: np.ndarray  # [N] bool: node covers at least one long token
    edges: dict[str, tuple[np.ndarray, np.ndarray]]  # relation -> (src, dst) node indices

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    def of_types(self, names) -> np.ndarray:
        """bool [N]: node's type is one of `names`."""
        wanted = [i for i, t in enumerate(self.type_names) if t in set(names)]
        return np.isin(self.node_type, wanted)

    def type_flag(self, attr: str) -> np.ndarray:
        """bool [N]: the node's type has NodeType attribute `attr` true."""
        return self._type_table[attr][self.node_type]

    def __post_init__(self) -> None:
        self._type_table: dict[str, np.ndarray] = {}

    @property
    def doc_label(self) -> str:
        return repr(self.graph.doc_id) if self.graph.doc_id is not None else "(no doc_id)"


def _fail(graph: DocGraph, message: str, node: str | None = None, cls=CompileError):
    raise cls(message, file=graph.source, node=node)


def document_error(graph: DocGraph, message: str) -> CompileError:
    """A CompileError about a whole document (it does not fit): names its file and doc id."""
    return CompileError(message, file=graph.source, node=graph.doc_id)


def schema_ref(schema: Schema) -> str:
    """How error messages name a schema: its name and file."""
    return f"schema {schema.name!r}" + (f" ({schema.source})" if schema.source else "")


def _read_nodes(graph: DocGraph, schema: Schema, text_len: int):
    type_names = tuple(schema.node_types)
    type_index = {name: i for i, name in enumerate(type_names)}
    nodes = list(graph.nodes.values())
    node_type = np.array([type_index.get(n.type, -1) for n in nodes], dtype=np.int64)
    if (node_type < 0).any():
        node = nodes[int(np.argmax(node_type < 0))]
        declared = ", ".join(type_names) or "none"
        _fail(graph, f"node type {node.type!r} is not declared in {schema_ref(schema)}; declared: {declared}", node.id)
    has_span = np.array([n.span is not None for n in nodes], dtype=bool)
    spans = np.array([n.span if n.span is not None else (-1, -1) for n in nodes], dtype=np.int64).reshape(-1, 2)
    bad = has_span & ((spans[:, 0] > spans[:, 1]) | (spans[:, 1] > text_len) | (spans[:, 0] < 0))
    if bad.any():
        i = int(np.argmax(bad))
        message = f"span [{spans[i, 0]}, {spans[i, 1]}) lies outside the document text of {text_len} characters"
        _fail(graph, message, nodes[i].id, GraphError)
    return [n.id for n in nodes], node_type, spans, has_span, type_names


def _read_edges(graph: DocGraph, schema: Schema, index: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    grouped: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in schema.relations}
    for edge in graph.edges:
        if edge.relation not in grouped:
            declared = ", ".join(schema.relations) or "none"
            where = f"edge {edge.src!r} -[{edge.relation}]-> {edge.dst!r}"
            _fail(graph, f"{where}: relation {edge.relation!r} is not declared in {schema_ref(schema)}; declared: {declared}", edge.src)
        for end, role in ((edge.src, "source"), (edge.dst, "target")):
            if end not in index:
                where = f"edge {edge.src!r} -[{edge.relation}]-> {edge.dst!r}"
                _fail(graph, f"{where}: {role} node {end!r} does not exist (dangling edge)", end, GraphError)
        src, dst = grouped[edge.relation]
        src.append(index[edge.src])
        dst.append(index[edge.dst])
    return {name: (np.asarray(s, dtype=np.int64), np.asarray(d, dtype=np.int64)) for name, (s, d) in grouped.items()}


def _hierarchy(graph, schema, node_ids, edges) -> tuple[np.ndarray, np.ndarray]:
    """Parent of each node over all hierarchy relations; depth by pointer jumping (O(N log N))."""
    n = len(node_ids)
    parent = np.full(n, -1, dtype=np.int64)
    pairs = [np.stack(edges[name], axis=1) for name in schema.hierarchy_relations]
    pairs = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)
    if pairs.size:  # the same edge twice is one edge
        _, first = np.unique(pairs[:, 0] * max(n, 1) + pairs[:, 1], return_index=True)
        pairs = pairs[np.sort(first)]
    if pairs.size:
        children, counts = np.unique(pairs[:, 1], return_counts=True)
        if (counts > 1).any():
            child = int(children[np.argmax(counts > 1)])
            parents = ", ".join(repr(node_ids[p]) for p in pairs[pairs[:, 1] == child, 0])
            _fail(graph, f"node has more than one parent in the containment hierarchy: {parents}", node_ids[child])
        parent[pairs[:, 1]] = pairs[:, 0]
    # Pointer jumping with a sentinel root n: after ceil(log2(n+1)) + 1 rounds every acyclic node points at it.
    jump = np.where(parent >= 0, parent, n)
    jump = np.append(jump, n)
    dist = np.append((parent >= 0).astype(np.int64), 0)
    for _ in range(int(np.ceil(np.log2(n + 2))) + 1):
        dist = dist + np.where(jump < n, dist[jump], 0)
        jump = jump[jump]
    on_cycle = np.flatnonzero(jump[:n] != n)
    if on_cycle.size:
        first = int(on_cycle[0])
        _fail(graph, "cycle in the containment hierarchy: " + _cycle_path(first, parent, node_ids), _cycle_start(first, parent, node_ids))
    return parent, dist[:n]


def _cycle_members(start: int, parent: np.ndarray) -> list[int]:
    seen: dict[int, int] = {}
    node = start
    while node not in seen:  # one walk, only on the error path
        seen[node] = len(seen)
        node = int(parent[node])
    order = list(seen)
    return order[seen[node] :]


def _cycle_start(start: int, parent: np.ndarray, node_ids: list[str]) -> str:
    return node_ids[_cycle_members(start, parent)[0]]


def _cycle_path(start: int, parent: np.ndarray, node_ids: list[str]) -> str:
    members = _cycle_members(start, parent)[::-1]  # parent -> child direction
    return " -> ".join(repr(node_ids[m]) for m in [*members, members[0]]) + " (parent -> child)"


def _effective_spans(graph, node_ids, spans, has_span, parent, depth) -> np.ndarray:
    """Span-less parents cover their descendants' hull; a child must lie inside its parent."""
    spans = spans.copy()
    child = np.flatnonzero((parent >= 0) & has_span)
    par = parent[child]
    both = has_span[par]
    outside = (spans[child, 0] < spans[par, 0]) | (spans[child, 1] > spans[par, 1])
    bad = both & outside
    if bad.any():
        c, p = int(child[np.argmax(bad)]), int(par[np.argmax(bad)])
        outer = f"its parent {node_ids[p]!r}'s span [{spans[p, 0]}, {spans[p, 1]})"
        _fail(graph, f"span [{spans[c, 0]}, {spans[c, 1]}) lies outside {outer}", node_ids[c])
    covered = has_span.copy()
    for d in range(int(depth.max(initial=0)), 0, -1):  # one step per hierarchy level, deepest first
        level = np.flatnonzero((depth == d) & covered)
        targets = parent[level]
        grow = ~has_span[targets]
        level, targets = level[grow], targets[grow]
        if level.size == 0:
            continue
        fresh = targets[~covered[targets]]
        spans[fresh, 0] = np.iinfo(np.int64).max
        spans[fresh, 1] = -1
        covered[fresh] = True
        np.minimum.at(spans[:, 0], targets, spans[level, 0])
        np.maximum.at(spans[:, 1], targets, spans[level, 1])
    spans[~covered] = -1
    return spans


def _owns_tokens(node_type) -> bool:
    """Whether a type's nodes take part in per-token lookups ("the innermost node covering a token")."""
    t = node_type
    flags = (t.is_global, t.long, t.segment, t.sep_after, t.type_id is not None, t.ignore_hard_g2l, t.ignore_hard_l2g)
    return any(flags)


def _check_crossing(graph, schema, node_ids, node_type, spans, own_span, type_names) -> None:
    """Nodes of one type may nest or be disjoint, never cross (their innermost owner is ambiguous).
    Types that only mark spans (task labels such as keyphrase occurrences) may cross."""
    for t, name in enumerate(type_names):
        if not _owns_tokens(schema.node_types[name]):
            continue
        idx = np.flatnonzero((node_type == t) & own_span & (spans[:, 1] > spans[:, 0]))
        if idx.size < 2:
            continue
        order = idx[np.lexsort((-spans[idx, 1], spans[idx, 0]))]
        s, e = spans[order, 0], spans[order, 1]
        if np.all(s[1:] >= e[:-1]):
            continue  # disjoint: the common case
        open_ends: list[int] = []  # stack of enclosing nodes, only for nested types
        for k, node in enumerate(order):
            while open_ends and e[open_ends[-1]] <= s[k]:
                open_ends.pop()
            if open_ends and e[k] > e[open_ends[-1]]:
                other = order[open_ends[-1]]
                _fail(
                    graph,
                    f"spans of {name!r} nodes {node_ids[other]!r} [{spans[other, 0]}, {spans[other, 1]}) and "
                    f"{node_ids[node]!r} [{spans[node, 0]}, {spans[node, 1]}) overlap; nodes of one type may nest but not cross",
                    node_ids[node],
                )
            open_ends.append(k)


def _selected(graph: DocGraph, schema: Schema, node_type: np.ndarray, type_names) -> np.ndarray:
    is_global = np.array([schema.node_types[t].is_global for t in type_names] + [False], dtype=bool)
    selected = is_global[node_type] if node_type.size else np.zeros(0, bool)
    filtered = [i for i, t in enumerate(type_names) if schema.node_types[t].where]
    if filtered:
        nodes = list(graph.nodes.values())
        for i in np.flatnonzero(np.isin(node_type, filtered)):
            selected[i] = schema.node_types[type_names[node_type[i]]].selects(nodes[i].attrs)
    return selected


def build_layout(graph: DocGraph, schema: Schema, tokenizer: Tokenizer) -> DocLayout:
    """Check `graph` against `schema`, tokenize its text and map every node to tokens."""
    if not isinstance(graph, DocGraph):
        raise CompileError(f"compile takes DocGraph objects, got {type(graph).__name__}")
    if not graph.text.strip():
        _fail(graph, f"empty document {graph.doc_id!r}: the text has no characters to encode", graph.doc_id)
    node_ids, node_type, spans, own_span, type_names = _read_nodes(graph, schema, len(graph.text))
    index = {node_id: i for i, node_id in enumerate(node_ids)}
    edges = _read_edges(graph, schema, index)
    parent, depth = _hierarchy(graph, schema, node_ids, edges)
    _check_crossing(graph, schema, node_ids, node_type, spans, own_span, type_names)
    spans = _effective_spans(graph, node_ids, spans, own_span, parent, depth)
    has_span = spans[:, 0] >= 0

    encoding = tokenizer.encode(graph.text)
    offsets = encoding.offsets
    ranges = np.zeros((len(node_ids), 2), dtype=np.int64)
    if has_span.any():
        ranges[has_span] = spans_to_token_ranges(offsets, spans[has_span])

    n = len(node_ids)
    spanned = np.flatnonzero(has_span)
    order = spanned[np.lexsort((spanned, depth[spanned], -spans[spanned, 1], spans[spanned, 0]))]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(order.size)
    rank[~has_span] = order.size + np.arange(n - order.size)

    T = int(encoding.ids.shape[0])
    long_types = [i for i, t in enumerate(type_names) if schema.node_types[t].long]
    if long_types:
        is_long_node = np.isin(node_type, long_types)
        is_long = coverage(T, ranges[is_long_node, 0], ranges[is_long_node, 1])
    else:
        is_long = np.ones(T, dtype=bool)
    if not is_long.any():
        what = f"inside nodes of the long types ({', '.join(type_names[i] for i in long_types)})" if long_types else "in the text"
        _fail(graph, f"empty document {graph.doc_id!r}: no tokens {what}", graph.doc_id)
    cum = np.concatenate([[0], np.cumsum(is_long)])
    in_long = cum[ranges[:, 1]] > cum[ranges[:, 0]]

    layout = DocLayout(
        graph=graph,
        token_ids=np.asarray(encoding.ids, dtype=np.int32),
        offsets=np.asarray(offsets, dtype=np.int32).reshape(-1, 2),
        node_ids=node_ids,
        node_type=node_type,
        type_names=type_names,
        spans=spans,
        has_span=has_span,
        ranges=ranges,
        parent=parent,
        depth=depth,
        rank=rank,
        selected=_selected(graph, schema, node_type, type_names),
        is_long=is_long,
        in_long=in_long,
        edges=edges,
    )
    for attr in ("long", "segment", "sep_after", "ignore_hard_g2l", "ignore_hard_l2g", "is_global"):
        layout._type_table[attr] = np.array([bool(getattr(schema.node_types[t], attr)) for t in type_names] + [False])
    return layout
