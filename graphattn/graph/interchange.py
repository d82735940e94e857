"""A `DocGraph` to and from plain dicts (JSON documents) and networkx graphs.

Both directions go through the graph's per-node API, so what comes in is checked as `add_node`
and `add_edge` check it, and the error names the place (JSON path, node id).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from graphattn.errors import GraphError
from graphattn.graph.columns import MISSING, ColumnarGraph
from graphattn.graph.views import Edge, Node, check_name, checked_attrs, edge_name, short

if TYPE_CHECKING:
    import networkx as nx

Graph = TypeVar("Graph", bound=ColumnarGraph)  # DocGraph; the protocol keeps this module below it


def graph_to_dict(graph: ColumnarGraph) -> dict[str, Any]:
    """``{"doc_id", "text", "nodes", "edges"}``, the form `graph_from_dict` reads."""
    nodes = []
    for view in graph:
        node: dict[str, Any] = {"id": view.id, "type": view.type}
        if view.span is not None:
            node["span"] = list(view.span)
        attrs = dict(view.attrs)
        if attrs:
            node["attrs"] = attrs
        nodes.append(node)
    edges = []
    for edge in graph.edges:
        item: dict[str, Any] = {"src": edge.src, "relation": edge.relation, "dst": edge.dst}
        attrs = dict(edge.attrs)
        if attrs:
            item["attrs"] = attrs
        edges.append(item)
    return {"doc_id": graph.doc_id, "text": graph.text, "nodes": nodes, "edges": edges}


def graph_from_dict(cls: type[Graph], data: dict[str, Any], source: str | None = None) -> Graph:
    """See `DocGraph.from_dict`. Every error names the JSON path of the node or edge (and its id)."""
    if not isinstance(data, dict):
        raise GraphError(f"a document graph must be an object, got {type(data).__name__}", file=source)
    if not isinstance(data.get("text"), str):
        raise GraphError("missing or non-string key 'text'", file=source, path=("text",))
    doc_id = data.get("doc_id")
    if doc_id is not None and not _is_id(doc_id):
        raise GraphError(f"doc_id must be a string or an integer, got {short(doc_id)}", file=source, path=("doc_id",))
    graph = cls(data["text"], None if doc_id is None else str(doc_id), source)
    for i, raw in enumerate(_list_of_dicts(data, "nodes", source)):
        for key in ("id", "type"):
            if key not in raw:
                raise GraphError(f"node is missing key {key!r}", file=source, path=("nodes", i))
        if not _is_id(raw["id"]):
            message = f"a node id must be a string or an integer, got {short(raw['id'])}"
            raise GraphError(message, file=source, path=("nodes", i, "id"))
        attrs = checked_attrs(raw.get("attrs", {}), source, str(raw["id"]), ("nodes", i, "attrs"))
        with _at(source, ("nodes", i)):
            graph.add_node(raw["id"], raw["type"], raw.get("span"), **attrs)
    for i, raw in enumerate(_list_of_dicts(data, "edges", source)):
        missing = [k for k in ("src", "relation", "dst") if k not in raw]
        if missing:
            raise GraphError(f"edge is missing key(s) {missing}", file=source, path=("edges", i))
        for key in ("src", "dst"):
            if not _is_id(raw[key]):
                message = f"an edge's {key} must be a node id (a string or an integer), got {short(raw[key])}"
                raise GraphError(message, file=source, path=("edges", i, key))
        src, dst = str(raw["src"]), str(raw["dst"])
        prefix = f"edge {edge_name(src, raw['relation'], dst)}: "
        check_name(raw["relation"], "relation", source, src, prefix, ("edges", i, "relation"))
        attrs = checked_attrs(raw.get("attrs", {}), source, src, ("edges", i, "attrs"))
        with _at(source, ("edges", i)):
            graph.add_edge(src, raw["relation"], dst, **attrs)
    return graph


def _is_id(value: Any) -> bool:
    """Node and document ids are strings; integers are taken as their decimal text (never bools, floats)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


@contextmanager
def _at(source: str | None, path: tuple) -> Iterator[None]:
    """A GraphError raised inside gets the JSON path of the node or edge being added."""
    try:
        yield
    except GraphError as err:
        if err.location.path:
            raise
        raise GraphError(err.reason, file=source, path=path, node=err.location.node) from None


def plain_columns(
    graph: ColumnarGraph, nodes: list[Node], edges: list[Edge], validate: bool
) -> tuple[list, list, np.ndarray, dict, tuple[list[int], list[str], list[int], dict]]:
    """`DocGraph.extend`'s nodes and edges as `add_nodes` / `add_edges` columns, every value
    checked here (attrs, relations, edge ends, spans when `validate`) so that nothing is stored
    unless all of it can be: (ids, types, spans [n, 2], attrs, (src rows, relations, dst rows, edge attrs))."""
    source = graph.source
    ids = [n.id if n.id.__class__ is str else str(n.id) for n in nodes]
    types = [n.type for n in nodes]
    pairs = []
    for node_id, node in zip(ids, nodes):
        if node.span is None:
            pairs.append((-1, -1))
        else:
            pairs.append(graph._check_span(node_id, node.span) if validate else node.span)
    spans = np.array(pairs, dtype=np.int64) if validate or not pairs else np.asarray(pairs)
    attrs = _attr_columns([checked_attrs(n.attrs, source, node_id) for node_id, n in zip(ids, nodes)])
    index, first = graph._index(), len(graph._ids)
    new_rows = {node_id: first + k for k, node_id in enumerate(ids)}
    src_rows, relations, dst_rows, edge_attrs = [], [], [], []
    for edge in edges:
        src, dst = str(edge.src), str(edge.dst)
        name = edge_name(src, edge.relation, dst)
        rows = []
        for end, role in ((src, "source"), (dst, "target")):
            row = index.get(end, new_rows.get(end))
            if row is None:
                raise GraphError(f"edge {name}: {role} node {end!r} does not exist", file=source, node=end)
            rows.append(row)
        check_name(edge.relation, "relation", source, src, f"edge {name}: ")
        src_rows.append(rows[0])
        dst_rows.append(rows[1])
        relations.append(edge.relation)
        edge_attrs.append(checked_attrs(edge.attrs, source, src))
    return ids, types, spans, attrs, (src_rows, relations, dst_rows, _attr_columns(edge_attrs))


def _attr_columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Per-row attr dicts as one list per name (`MISSING` where a row has none), names in first-use order."""
    names = dict.fromkeys(name for attrs in rows for name in attrs)
    return {name: [attrs.get(name, MISSING) for attrs in rows] for name in names}


def graph_to_networkx(graph: ColumnarGraph) -> nx.MultiDiGraph:
    """See `DocGraph.to_networkx`."""
    import networkx as nx  # only for the conversions: reading and compiling never need it

    g = nx.MultiDiGraph(text=graph.text, doc_id=graph.doc_id)
    for n in graph:
        g.add_node(n.id, type=n.type, span=n.span, **n.attrs)
    for e in graph.edges:
        g.add_edge(e.src, e.dst, key=e.relation, relation=e.relation, **e.attrs)
    return g


def graph_from_networkx(cls: type[Graph], g: nx.Graph, text: str | None = None, doc_id: str | None = None) -> Graph:
    """See `DocGraph.from_networkx`."""
    graph = cls(text if text is not None else g.graph.get("text", ""), doc_id or g.graph.get("doc_id"))
    for node_id, data in g.nodes(data=True):
        data = dict(data)
        if "type" not in data:
            raise GraphError("networkx node has no 'type' attribute", node=str(node_id))
        graph.add_node(str(node_id), data.pop("type"), data.pop("span", None), **data)
    edge_iter: Iterable = (
        g.edges(keys=True, data=True) if g.is_multigraph() else ((u, v, None, d) for u, v, d in g.edges(data=True))
    )
    for src, dst, key, data in edge_iter:
        data = dict(data)
        named = "relation" in data
        relation = data.pop("relation", key)
        if relation is None or (not named and not isinstance(relation, str)):
            # a MultiGraph's default keys are 0, 1, ...: a number that is no relation name
            raise GraphError(f"networkx edge {src!r} -> {dst!r} has no 'relation'", node=str(src))
        graph.add_edge(str(src), relation, str(dst), **data)
    return graph


def _list_of_dicts(data: dict, key: str, source: str | None) -> list[dict]:
    items = data.get(key, [])
    if not isinstance(items, list):
        raise GraphError(f"{key!r} must be a list, got {type(items).__name__}", file=source, path=(key,))
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise GraphError(f"must be an object, got {type(item).__name__}", file=source, path=(key, i))
    return items
