"""A `DocGraph` to and from plain dicts (JSON documents) and networkx graphs.

Both directions go through the graph's per-node API, so what comes in is checked as `add_node`
and `add_edge` check it, and the error names the place (JSON path, node id).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from graphattn.errors import GraphError
from graphattn.graph.columns import ColumnarGraph
from graphattn.graph.views import checked_attrs

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
    """See `DocGraph.from_dict`."""
    if not isinstance(data, dict):
        raise GraphError(f"a document graph must be an object, got {type(data).__name__}", file=source)
    if not isinstance(data.get("text"), str):
        raise GraphError("missing or non-string key 'text'", file=source, path=("text",))
    graph = cls(data["text"], data.get("doc_id"), source)
    for i, raw in enumerate(_list_of_dicts(data, "nodes", source)):
        for key in ("id", "type"):
            if key not in raw:
                raise GraphError(f"node is missing key {key!r}", file=source, path=("nodes", i))
        attrs = checked_attrs(raw.get("attrs", {}), source, str(raw["id"]), ("nodes", i, "attrs"))
        graph.add_node(raw["id"], raw["type"], raw.get("span"), **attrs)
    for i, raw in enumerate(_list_of_dicts(data, "edges", source)):
        missing = [k for k in ("src", "relation", "dst") if k not in raw]
        if missing:
            raise GraphError(f"edge is missing key(s) {missing}", file=source, path=("edges", i))
        attrs = checked_attrs(raw.get("attrs", {}), source, str(raw["src"]), ("edges", i, "attrs"))
        graph.add_edge(raw["src"], raw["relation"], raw["dst"], **attrs)
    return graph


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
        relation = data.pop("relation", key)
        if relation is None:
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
