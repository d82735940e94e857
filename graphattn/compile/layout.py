"""Pass 1: check one DocGraph against the schema and lay it out over its tokens.

The result (`DocLayout`) is independent of truncation: every node as a token range, the
containment forest, document order, which nodes become globals, which tokens are long text.
Later passes choose which tokens to keep and assemble instances from it. One exception, for
cost: under `tail` the text is tokenized only as far as anything can be kept (`encode`), and
which nodes past that point hold long tokens is found from the tokenizer's character classes
(`encode.long_text_past`, `long_past_cut`).
`check_graph` does the tokenizer-free part, so that `build_layouts` can tokenize many
documents in one batch.

Checks made here, each naming the node and the files involved: undeclared node types and
relations, spans past the text (the graph checks them when set; read here as they are),
crossing spans of one type, a node with two parents or a cycle in a hierarchy relation, a child
span outside its parent's (those three in `hierarchy`), an empty document.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from graphattn.compile.encode import TextPlan, encode_documents, long_text_past, long_token_bound
from graphattn.compile.hierarchy import containment, document_order, effective_spans
from graphattn.compile.ranges import coverage
from graphattn.errors import CompileError, GraphError
from graphattn.graph import DocGraph
from graphattn.schema import Schema
from graphattn.tokenize import Encoding, Tokenizer, plain_text, spans_to_token_ranges


@dataclass
class DocLayout:
    """One document over its tokens. Node arrays are indexed like `node_ids`."""

    graph: DocGraph
    token_ids: np.ndarray  # [T] int32, the text tokenized once (under tail: up to `tokenized_chars`)
    offsets: np.ndarray  # [T, 2] int32 char [start, end)
    node_ids: list[str]  # the graph's own list (`DocGraph.node_id_list`): indexed, never changed
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
    in_long: np.ndarray  # [N] bool: node covers at least one long token (or long text past the cut)
    edges: dict[str, tuple[np.ndarray, np.ndarray]]  # relation -> (src, dst) node indices
    tokenized_chars: int = -1  # the text was tokenized up to here (its length: all of it)
    long_past_cut: np.ndarray | None = None  # [N] bool: long text past `tokenized_chars` (see encode)
    text: str = ""  # the graph's text as the tokenizer saw it (`plain_text`: U+FFFD for a lone surrogate)

    @property
    def cut_short(self) -> bool:
        """Tokenizing stopped before the end of the text (nothing past it can be kept)."""
        return 0 <= self.tokenized_chars < len(self.graph.text)

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_nodes(self) -> int:
        return len(self.node_type)  # `node_ids` is the graph's own list, which may grow later

    def token_rows(self) -> np.ndarray:
        """The nodes whose token range is not empty, ascending (made once: past a cut, a page's
        nodes mostly hold none, and per-token work needs only these)."""
        if self._token_rows is None:
            self._token_rows = np.flatnonzero(self.ranges[:, 1] > self.ranges[:, 0])
        return self._token_rows

    def of_types(self, names) -> np.ndarray:
        """bool [N]: node's type is one of `names` (made once per set of names, read-only)."""
        key = frozenset(names)
        flag = self._flags.get(key)
        if flag is None:
            table = np.array([t in key for t in self.type_names] + [False])
            flag = self._flags[key] = table[self.node_type]
            flag.flags.writeable = False  # shared by every caller
        return flag

    def type_flag(self, attr: str) -> np.ndarray:
        """bool [N]: the node's type has NodeType attribute `attr` true (made once per layout:
        assembly asks for the same few flags a dozen times, each a pass over every node)."""
        flag = self._flags.get(attr)
        if flag is None:
            flag = self._flags[attr] = self._type_table[attr][self.node_type]
            flag.flags.writeable = False  # shared by every caller
        return flag

    def __post_init__(self) -> None:
        self._type_table: dict[str, np.ndarray] = {}
        self._flags: dict[str | frozenset, np.ndarray] = {}  # type_flag and of_types, by attr or names
        self._token_rows: np.ndarray | None = None
        self._whole_sizes: tuple | None = None  # (schema, sizes): `truncate.whole_sizes`, made once
        self._schema_types: tuple | None = None  # (schema, types): `assemble.schema_types`, made once

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
    """The graph's node columns as the schema's arrays: type index per node, spans, ids."""
    type_names = tuple(schema.node_types)
    type_index = {name: i for i, name in enumerate(type_names)}
    codes, graph_types = graph.type_codes()
    to_schema = np.array([type_index.get(name, -1) for name in graph_types] + [-1], dtype=np.int64)
    node_type = to_schema[codes]
    node_ids = graph.node_id_list()
    if (node_type < 0).any():
        i = int(np.argmax(node_type < 0))
        declared = ", ".join(type_names) or "none"
        message = f"node type {graph_types[codes[i]]!r} is not declared in {schema_ref(schema)}; declared: {declared}"
        _fail(graph, message, node_ids[i])
    spans = graph.span_array()
    has_span = spans[:, 0] >= 0
    # The graph checks spans when they are set; checked again here on exactly what is read.
    bad = has_span & ((spans[:, 0] > spans[:, 1]) | (spans[:, 1] > text_len))
    if bad.any():
        i = int(np.argmax(bad))
        message = f"span [{spans[i, 0]}, {spans[i, 1]}) lies outside the document text of {text_len} characters"
        _fail(graph, message, node_ids[i], GraphError)
    return node_ids, node_type, spans, has_span, type_names


def _read_edges(graph: DocGraph, schema: Schema, node_ids: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Edges grouped by relation as (source, target) node rows; every relation must be declared."""
    src, dst, codes, relations = graph.edge_arrays()
    undeclared = np.isin(codes, [code for code, name in enumerate(relations) if name not in schema.relations])
    if undeclared.any():
        e = int(np.argmax(undeclared))
        declared = ", ".join(schema.relations) or "none"
        name = relations[codes[e]]
        where = f"edge {node_ids[src[e]]!r} -[{name}]-> {node_ids[dst[e]]!r}"
        message = f"{where}: relation {name!r} is not declared in {schema_ref(schema)}; declared: {declared}"
        _fail(graph, message, node_ids[src[e]])
    code_of = {name: code for code, name in enumerate(relations)}
    out = {}
    for name in schema.relations:
        mine = codes == code_of.get(name, -1)
        out[name] = (src, dst) if mine.all() else (src[mine], dst[mine])
    return out


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
        s, e = spans[idx, 0], spans[idx, 1]
        if np.all(s[1:] >= e[:-1]):
            continue  # disjoint and in row order (text runs as readers add them): no sort needed
        order = idx[np.lexsort((-e, s))]
        s, e = spans[order, 0], spans[order, 1]
        if np.all(s[1:] >= e[:-1]) or _nested(s, e):
            continue  # disjoint (the common case) or properly nested
        open_ends: list[int] = []  # stack of enclosing nodes: finds the crossing pair to report
        for k, node in enumerate(order):
            while open_ends and e[open_ends[-1]] <= s[k]:
                open_ends.pop()
            if open_ends and e[k] > e[open_ends[-1]]:
                other = order[open_ends[-1]]
                _fail(
                    graph,
                    f"spans of {name!r} nodes {node_ids[other]!r} [{spans[other, 0]}, {spans[other, 1]}) and "
                    f"{node_ids[node]!r} [{spans[node, 0]}, {spans[node, 1]}) overlap; "
                    "nodes of one type may nest but not cross",
                    node_ids[node],
                )
            open_ends.append(k)


def _nested(s: np.ndarray, e: np.ndarray) -> bool:
    """Spans sorted by (start, -end) nest or are disjoint: every span starting inside span j
    (the next ones, up to the last that starts before j's end) ends by j's end.

    Range maxima by doubling (a sparse table built one level at a time, O(n) memory).
    """
    n = s.size
    lo = np.arange(1, n + 1)
    hi = np.searchsorted(s, e, side="left") - 1  # last span starting before j's end
    asks = np.flatnonzero(hi >= lo)
    if asks.size == 0:
        return True
    lo, hi, end = lo[asks], hi[asks], e[asks]
    level_of = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
    maxima, width, level = e, 1, 0
    while True:
        at = level_of == level
        if at.any() and (np.maximum(maxima[lo[at]], maxima[hi[at] - width + 1]) > end[at]).any():
            return False
        if 2 * width > n or not (level_of > level).any():
            return True
        maxima = np.maximum(maxima[:-width], maxima[width:])  # maxima[i] = max(e[i : i + 2 * width])
        width, level = 2 * width, level + 1


def _selected(graph: DocGraph, schema: Schema, node_type: np.ndarray, type_names) -> np.ndarray:
    is_global = np.array([schema.node_types[t].is_global for t in type_names] + [False], dtype=bool)
    selected = is_global[node_type] if node_type.size else np.zeros(0, bool)
    for t, name in enumerate(type_names):
        where = schema.node_types[name].where
        rows = np.flatnonzero(node_type == t) if where else ()
        if not len(rows):
            continue
        for key, allowed in where.items():  # `selects`: attrs.get(key) in allowed, column by column
            present, values = graph.attr_column(key)
            selected[rows] &= _in_allowed(present[rows], values[rows], allowed)
    return selected


def _in_allowed(present: np.ndarray, values: np.ndarray, allowed: tuple) -> np.ndarray:
    """bool per row: its value (None when absent) is in `allowed`, with Python's `in`.

    Typed columns (what bulk builders give) are matched per distinct value; object columns
    per row, still without a node object.
    """
    out = np.full(present.shape, None in allowed, dtype=bool)
    rows = np.flatnonzero(present)
    if rows.size == 0:
        return out
    if values.dtype != object:
        distinct, inverse = np.unique(values[rows], return_inverse=True)
        hit = np.array([v in allowed for v in distinct.tolist()], dtype=bool)
        out[rows] = hit[inverse.reshape(-1)]
    else:
        out[rows] = np.fromiter((v in allowed for v in values[rows].tolist()), dtype=bool, count=rows.size)
    return out


@dataclass
class CheckedGraph:
    """A graph checked against the schema, in the schema's terms: everything layout needs but tokens."""

    graph: DocGraph
    node_ids: list[str]
    node_type: np.ndarray
    type_names: tuple[str, ...]
    spans: np.ndarray  # effective spans (see DocLayout)
    parent: np.ndarray
    depth: np.ndarray
    rank: np.ndarray
    selected: np.ndarray
    edges: dict[str, tuple[np.ndarray, np.ndarray]]
    long_types: list[int]
    text: str  # `plain_text` of the graph's text, made once: a page's text is megabytes

    @cached_property
    def has_span(self) -> np.ndarray:
        return self.spans[:, 0] >= 0

    def text_plan(self, schema: Schema) -> TextPlan:
        """What to tokenize: the whole text, or under `tail` enough of it for what can be kept."""
        per_token = [i for i, t in enumerate(self.type_names) if schema.node_types[t].global_mode == "per_token"]
        whole = np.compress(self.selected & self.of_type_indices(per_token) & self.has_span, self.spans, axis=0)
        return TextPlan(self.text, long_token_bound(schema), self.long_spans, whole)

    @cached_property
    def long_spans(self) -> np.ndarray | None:
        """[k, 2] spans of the long-type nodes that have one; None without long types (all the text
        is long). Made once: the text plan and the nodes past the cut both need it."""
        if not self.long_types:
            return None
        return np.compress(self.of_type_indices(self.long_types) & self.has_span, self.spans, axis=0)

    def of_type_indices(self, types: list[int]) -> np.ndarray:
        """bool [N]: the node's type is one of `types`, indices into `type_names` (a layout's
        `of_types` takes names)."""
        table = np.zeros(len(self.type_names) + 1, dtype=bool)
        table[types] = True
        return table[self.node_type]


def check_graph(graph: DocGraph, schema: Schema) -> CheckedGraph:
    """Check `graph` against `schema` (every check of this module but the token-level ones)."""
    if not isinstance(graph, DocGraph):
        raise CompileError(f"compile takes DocGraph objects, got {type(graph).__name__}")
    if not graph.text.strip():
        _fail(graph, f"empty document {graph.doc_id!r}: the text has no characters to encode", graph.doc_id)
    node_ids, node_type, spans, own_span, type_names = _read_nodes(graph, schema, len(graph.text))
    edges = _read_edges(graph, schema, node_ids)
    parent, depth = containment(graph, schema, node_ids, edges)
    _check_crossing(graph, schema, node_ids, node_type, spans, own_span, type_names)
    spans = effective_spans(graph, node_ids, spans, own_span, parent, depth)
    has_span = spans[:, 0] >= 0
    n = len(node_ids)
    order = document_order(np.flatnonzero(has_span), spans, depth)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(order.size)
    rank[~has_span] = order.size + np.arange(n - order.size)
    long_types = [i for i, t in enumerate(type_names) if schema.node_types[t].long]
    return CheckedGraph(
        graph,
        node_ids,
        node_type,
        type_names,
        spans,
        parent,
        depth,
        rank,
        _selected(graph, schema, node_type, type_names),
        edges,
        long_types,
        plain_text(graph.text),
    )


def layout_from(
    checked: CheckedGraph, encoding: Encoding, tokenized_chars: int, schema: Schema, tokenizer: Tokenizer | None = None
) -> DocLayout:
    """Map every node of a checked graph to the tokens of its text (or of the prefix tokenized:
    then `tokenizer`, the one that made `encoding`, tells which nodes hold tokens past the cut)."""
    graph, spans, has_span, node_type = checked.graph, checked.spans, checked.has_span, checked.node_type
    offsets = encoding.offsets
    T = int(encoding.ids.shape[0])
    past = np.where(has_span & (spans[:, 0] >= tokenized_chars), T, 0)  # past the tokenized part no token
    ranges = np.stack([past, past], axis=1)  # starts: [T, T]; no span: [0, 0)
    looked_up = np.flatnonzero(has_span & (spans[:, 0] < tokenized_chars))
    if looked_up.size:
        ranges[looked_up] = spans_to_token_ranges(offsets, np.take(spans, looked_up, axis=0))
    holding = looked_up[ranges[looked_up, 1] > ranges[looked_up, 0]]  # the nodes that hold tokens
    long_types, type_names = checked.long_types, checked.type_names
    is_long_node = checked.of_type_indices(long_types) if long_types else None
    if long_types:
        long_ranges = np.take(ranges, holding[is_long_node[holding]], axis=0)
        is_long = coverage(T, long_ranges[:, 0], long_ranges[:, 1])
    else:
        is_long = np.ones(T, dtype=bool)
    long_past_cut = np.zeros(len(node_type), dtype=bool)
    if tokenized_chars < len(checked.text):
        if tokenizer is None:
            raise CompileError("layout_from: a text tokenized only in part needs its tokenizer")
        long_past_cut = long_text_past(checked.text, tokenized_chars, spans, checked.long_spans, tokenizer)
    if not is_long.any() and not long_past_cut.any():
        what = (
            f"inside nodes of the long types ({', '.join(type_names[i] for i in long_types)})"
            if long_types
            else "in the text"
        )
        _fail(graph, f"empty document {graph.doc_id!r}: no tokens {what}", graph.doc_id)
    cum = np.concatenate([[0], np.cumsum(is_long)])
    in_long = long_past_cut.copy()
    in_long[holding] |= cum[ranges[holding, 1]] > cum[ranges[holding, 0]]

    layout = DocLayout(
        graph=graph,
        token_ids=np.asarray(encoding.ids, dtype=np.int32),
        offsets=np.asarray(offsets, dtype=np.int32).reshape(-1, 2),
        node_ids=checked.node_ids,
        node_type=node_type,
        type_names=type_names,
        spans=spans,
        has_span=has_span,
        ranges=ranges,
        parent=checked.parent,
        depth=checked.depth,
        rank=checked.rank,
        selected=checked.selected,
        is_long=is_long,
        in_long=in_long,
        edges=checked.edges,
        tokenized_chars=tokenized_chars,
        long_past_cut=long_past_cut,
        text=checked.text,
    )
    layout._token_rows = holding
    for attr in ("long", "segment", "sep_after", "ignore_hard_g2l", "ignore_hard_l2g", "is_global"):
        layout._type_table[attr] = np.array([bool(getattr(schema.node_types[t], attr)) for t in type_names] + [False])
    return layout


def build_layout(graph: DocGraph, schema: Schema, tokenizer: Tokenizer) -> DocLayout:
    """Check `graph` against `schema`, tokenize its text (as far as the schema can keep) and map
    every node to tokens."""
    checked = check_graph(graph, schema)
    ((encoding, stop),) = encode_documents([checked.text_plan(schema)], tokenizer)
    if isinstance(encoding, Exception):
        raise encoding
    return layout_from(checked, encoding, stop, schema, tokenizer)


def build_layouts(graphs: list[DocGraph], schema: Schema, tokenizer: Tokenizer) -> list[DocLayout | Exception]:
    """`build_layout` of many documents with one tokenizer batch per round; a document that fails
    gets its exception in its place (any exception: the caller reports or raises it)."""
    checked: list[CheckedGraph | Exception] = []
    for graph in graphs:
        try:
            checked.append(check_graph(graph, schema))
        except Exception as err:  # noqa: BLE001 - per document
            checked.append(err)
    ok = [i for i, c in enumerate(checked) if not isinstance(c, Exception)]
    encoded = encode_documents([checked[i].text_plan(schema) for i in ok], tokenizer)  # type: ignore[union-attr]
    out: list[DocLayout | Exception] = list(checked)  # type: ignore[arg-type]
    for i, (encoding, stop) in zip(ok, encoded):
        if isinstance(encoding, Exception):
            out[i] = encoding
            continue
        try:
            out[i] = layout_from(checked[i], encoding, stop, schema, tokenizer)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001
            out[i] = err
    return out
