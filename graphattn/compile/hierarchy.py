"""The containment forest of a checked graph: each node's parent over the hierarchy relations
(a node with two parents, or a cycle, is refused), depths, the spans that span-less parents
take from their descendants, and document order. All numpy over whole node arrays: a large page
has half a million nodes."""

from __future__ import annotations

import numpy as np

from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.graph.forest import forest_depths
from graphattn.schema import Schema


def _fail(graph: DocGraph, message: str, node: str | None = None):
    raise CompileError(message, file=graph.source, node=node)


def containment(
    graph: DocGraph, schema: Schema, node_ids: list[str], edges: dict[str, tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """Parent of each node over all hierarchy relations, and its depth: by pointer jumping over
    the nodes with children (O(N log depth)), a leaf one more than its parent."""
    n = len(node_ids)
    parent = np.full(n, -1, dtype=np.int64)
    relations = schema.hierarchy_relations
    sources = np.concatenate([edges[name][0] for name in relations]) if relations else np.zeros(0, np.int64)
    targets = np.concatenate([edges[name][1] for name in relations]) if relations else np.zeros(0, np.int64)
    parent[targets] = sources
    if np.count_nonzero(parent >= 0) < targets.size:  # a child given twice (the same edge twice is one edge)
        pairs = np.stack([sources, targets], axis=1)
        _, first = np.unique(pairs[:, 0] * max(n, 1) + pairs[:, 1], return_index=True)
        pairs = pairs[np.sort(first)]
        children, counts = np.unique(pairs[:, 1], return_counts=True)
        if (counts > 1).any():
            child = int(children[np.argmax(counts > 1)])
            parents = ", ".join(repr(node_ids[p]) for p in pairs[pairs[:, 1] == child, 0])
            _fail(graph, f"node has more than one parent in the containment hierarchy: {parents}", node_ids[child])
    inner = np.zeros(n, dtype=bool)  # nodes with children: only they can be on a cycle
    inner[parent[parent >= 0]] = True
    inner_rows = np.flatnonzero(inner)
    row_in_inner = np.full(n + 1, -1, dtype=np.int64)  # slot n: a root's parent (-1)
    row_in_inner[inner_rows] = np.arange(inner_rows.size)
    inner_depth, on_cycle = forest_depths(row_in_inner[parent[inner_rows]])
    if on_cycle.size:
        unreached = np.zeros(n + 1, dtype=bool)  # on or under a cycle: those nodes, and their leaves
        unreached[inner_rows[on_cycle]] = True
        unreached[:n] |= unreached[parent]
        first = int(np.argmax(unreached))
        _fail(
            graph,
            "cycle in the containment hierarchy: " + _cycle_path(first, parent, node_ids),
            _cycle_start(first, parent, node_ids),
        )
    depth = np.zeros(n + 1, dtype=np.int64)  # slot n: a root's parent, one above depth 0
    depth[n] = -1
    depth[inner_rows] = inner_depth
    leaves = np.flatnonzero(~inner)  # a leaf's depth is one more than its parent's (half a page)
    depth[leaves] = depth[parent[leaves]] + 1
    return parent, depth[:n]


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


def effective_spans(
    graph: DocGraph, node_ids: list[str], spans: np.ndarray, has_span: np.ndarray, parent: np.ndarray, depth: np.ndarray
) -> np.ndarray:
    """Span-less parents cover their descendants' hull; a child must lie inside its parent."""
    spans = spans.copy()
    par = np.where(parent >= 0, parent, np.arange(parent.size))  # a root is its own parent: inside
    starts, ends = spans[:, 0], spans[:, 1]
    bad = has_span & has_span[par] & ((starts < starts[par]) | (ends > ends[par]))
    if bad.any():
        c = int(np.argmax(bad))
        p = int(par[c])
        outer = f"its parent {node_ids[p]!r}'s span [{spans[p, 0]}, {spans[p, 1]})"
        _fail(graph, f"span [{spans[c, 0]}, {spans[c, 1]}) lies outside {outer}", node_ids[c])
    covered = has_span.copy()
    if has_span.all():  # every node has its own span (HTML, bulk builders): none to grow
        return spans
    # each level's nodes, without a pass over all nodes per level (int16 depths sort by radix, O(N))
    by_depth = np.argsort(depth.astype(np.int16) if depth.max(initial=0) < 2**15 else depth, kind="stable")
    level_start = np.searchsorted(depth[by_depth], np.arange(int(depth.max(initial=0)) + 2))
    for d in range(int(depth.max(initial=0)), 0, -1):  # one step per hierarchy level, deepest first
        level = by_depth[level_start[d] : level_start[d + 1]]
        level = level[covered[level]]
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


def document_order(spanned: np.ndarray, spans: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Spanned nodes sorted by (start, -end, depth, row): pre-order over the text.

    The three keys are packed into one int64 where they fit (any text under 2**27 characters
    with a shallow tree), and sorted stably (timsort): readers that walk a tree add nodes
    nearly in this order already, which timsort finds in one pass. Else four-key lexsort."""
    if spanned.size < 2:
        return spanned
    if spanned.size == spans.shape[0]:  # every node has a span (HTML, bulk builders): no gathers
        start, end, level = spans[:, 0], spans[:, 1], depth
    else:
        start, end, level = spans[spanned, 0], spans[spanned, 1], depth[spanned]
    char_bits = max(int(end.max()), 1).bit_length()
    depth_bits = max(int(level.max()), 1).bit_length()
    if 2 * char_bits + depth_bits > 62:
        return spanned[np.lexsort((spanned, level, -end, start))]
    key = (start << char_bits | ((1 << char_bits) - 1 - end)) << depth_bits | level
    if np.all(key[1:] >= key[:-1]):  # a reader's pre-order walk: in order already (stable: ties keep rows)
        return spanned
    return spanned[np.argsort(key, kind="stable")]
