"""DocGraph: one document's text plus typed nodes and typed edges.

A node has an id, a type (declared by the relation schema), an optional character span
``[start, end)`` into the document text, and free-form attrs. An edge is ``(src, relation, dst)``.
Containment (document > paragraph > sentence) is an ordinary relation, conventionally
``contains`` from parent to child; the schema says which relations form the hierarchy.

The graph checks what it can know alone (ids, dangling edges, spans inside the text); what the
schema decides (which types and relations exist, overlapping spans of one type, hierarchy
cycles) is checked when compiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import networkx as nx

from graphattn.errors import GraphError

CONTAINS = "contains"


@dataclass
class Node:
    id: str
    type: str
    span: tuple[int, int] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Edge:
    src: str
    relation: str
    dst: str
    attrs: dict[str, Any] = field(default_factory=dict)


class DocGraph:
    """A typed document graph. Build it with `add_node` / `add_edge` or `from_dict`."""

    def __init__(self, text: str, doc_id: str | None = None, source: str | None = None):
        if not isinstance(text, str):
            raise GraphError(f"document text must be a str, got {type(text).__name__}", file=source, node=doc_id)
        self.text = text
        self.doc_id = doc_id
        self.source = source  # file (or other origin) the graph was read from, for error messages
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []

    # -- building -------------------------------------------------------------------------
    def add_node(self, node_id: str, type: str, span: tuple[int, int] | None = None, **attrs: Any) -> Node:
        node_id = str(node_id)
        if node_id in self.nodes:
            raise GraphError(f"duplicate node id (first has type {self.nodes[node_id].type!r})", file=self.source, node=node_id)
        if not isinstance(type, str) or not type:
            raise GraphError(f"node type must be a non-empty string, got {type!r}", file=self.source, node=node_id)
        if span is not None:
            span = self._check_span(node_id, span)
        node = Node(node_id, type, span, dict(attrs))
        self.nodes[node_id] = node
        return node

    def add_edge(self, src: str, relation: str, dst: str, **attrs: Any) -> Edge:
        src, dst = str(src), str(dst)
        for end, role in ((src, "source"), (dst, "target")):
            if end not in self.nodes:
                raise GraphError(
                    f"edge {src!r} -[{relation}]-> {dst!r}: {role} node {end!r} does not exist",
                    file=self.source,
                    node=end,
                )
        edge = Edge(src, str(relation), dst, dict(attrs))
        self.edges.append(edge)
        return edge

    def add_child(self, parent: str, node_id: str, type: str, span: tuple[int, int] | None = None, **attrs: Any) -> Node:
        """Add a node and a `contains` edge from `parent` to it."""
        node = self.add_node(node_id, type, span, **attrs)
        self.add_edge(parent, CONTAINS, node.id)
        return node

    def extend(self, nodes: Iterable[Node], edges: Iterable[Edge] = (), *, validate: bool = True) -> None:
        """Add many nodes, then many edges (they may join any nodes of the graph by then).

        With ``validate=False`` the objects go in as they are, without the per-item checks of
        `add_node` / `add_edge` (unique ids, spans inside the text, edge ends that exist). That
        is for builders whose output holds those rules by construction: on large HTML pages the
        checks are half the reading time. Nothing re-checks later, so a builder that passes
        False owns the rules (and its tests should build the same graph with validation on).
        """
        if validate:
            for node in nodes:
                self.add_node(node.id, node.type, node.span, **node.attrs)
            for edge in edges:
                self.add_edge(edge.src, edge.relation, edge.dst, **edge.attrs)
            return
        self.nodes.update((node.id, node) for node in nodes)
        self.edges.extend(edges)

    def _check_span(self, node_id: str, span: Any) -> tuple[int, int]:
        try:
            start, end = (int(s) for s in span)
        except (TypeError, ValueError):
            raise GraphError(f"span must be a pair of ints [start, end), got {span!r}", file=self.source, node=node_id) from None
        if start > end:
            raise GraphError(f"span [{start}, {end}) ends before it starts", file=self.source, node=node_id)
        if not 0 <= start <= end <= len(self.text):
            raise GraphError(
                f"span [{start}, {end}) lies outside the document text of {len(self.text)} characters",
                file=self.source,
                node=node_id,
            )
        return start, end

    # -- reading --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise GraphError("no such node", file=self.source, node=node_id) from None

    def nodes_of_type(self, type: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.type == type]

    def edges_of(self, relation: str) -> list[Edge]:
        return [e for e in self.edges if e.relation == relation]

    def span_text(self, node_id: str) -> str:
        span = self.node(node_id).span
        return "" if span is None else self.text[span[0] : span[1]]

    # -- plain dicts ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "text": self.text,
            "nodes": [
                {"id": n.id, "type": n.type, **({"span": list(n.span)} if n.span else {}), **({"attrs": n.attrs} if n.attrs else {})}
                for n in self.nodes.values()
            ],
            "edges": [
                {"src": e.src, "relation": e.relation, "dst": e.dst, **({"attrs": e.attrs} if e.attrs else {})}
                for e in self.edges
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "DocGraph":
        """Build from ``{"text", "doc_id"?, "nodes": [{id, type, span?, attrs?}], "edges": [{src, relation, dst}]}``."""
        if not isinstance(data, dict):
            raise GraphError(f"a document graph must be an object, got {type(data).__name__}", file=source)
        if not isinstance(data.get("text"), str):
            raise GraphError("missing or non-string key 'text'", file=source, path=("text",))
        graph = cls(data["text"], data.get("doc_id"), source)
        for i, raw in enumerate(_list_of_dicts(data, "nodes", source)):
            for key in ("id", "type"):
                if key not in raw:
                    raise GraphError(f"node is missing key {key!r}", file=source, path=("nodes", i))
            graph.add_node(raw["id"], raw["type"], raw.get("span"), **raw.get("attrs", {}))
        for i, raw in enumerate(_list_of_dicts(data, "edges", source)):
            missing = [k for k in ("src", "relation", "dst") if k not in raw]
            if missing:
                raise GraphError(f"edge is missing key(s) {missing}", file=source, path=("edges", i))
            graph.add_edge(raw["src"], raw["relation"], raw["dst"], **raw.get("attrs", {}))
        return graph

    # -- networkx -------------------------------------------------------------------------
    def to_networkx(self) -> nx.MultiDiGraph:
        """A MultiDiGraph: node attrs `type`, `span`, attrs; edge key and attr `relation`."""
        g = nx.MultiDiGraph(text=self.text, doc_id=self.doc_id)
        for n in self.nodes.values():
            g.add_node(n.id, type=n.type, span=n.span, **n.attrs)
        for e in self.edges:
            g.add_edge(e.src, e.dst, key=e.relation, relation=e.relation, **e.attrs)
        return g

    @classmethod
    def from_networkx(cls, g: nx.Graph, text: str | None = None, doc_id: str | None = None) -> "DocGraph":
        """Inverse of `to_networkx`; any networkx graph whose nodes carry a `type` attribute."""
        graph = cls(text if text is not None else g.graph.get("text", ""), doc_id or g.graph.get("doc_id"))
        for node_id, data in g.nodes(data=True):
            data = dict(data)
            if "type" not in data:
                raise GraphError("networkx node has no 'type' attribute", node=str(node_id))
            graph.add_node(str(node_id), data.pop("type"), data.pop("span", None), **data)
        edge_iter: Iterable = g.edges(keys=True, data=True) if g.is_multigraph() else ((u, v, None, d) for u, v, d in g.edges(data=True))
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
