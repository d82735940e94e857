"""DocGraph: building, reading, dict and networkx round trips, and its own errors."""

import networkx as nx
import pytest

from graphattn.errors import GraphError
from graphattn.graph import CONTAINS, DocGraph


def sample() -> DocGraph:
    text = "Paris is big. It is old."
    g = DocGraph(text, doc_id="d1", source="d1.json")
    g.add_node("doc", "document", (0, len(text)))
    g.add_child("doc", "s0", "sentence", (0, 13))
    g.add_child("doc", "s1", "sentence", (14, 24), topic="age")
    g.add_node("paris", "entity", lang="fr")
    g.add_edge("s0", "mentions", "paris", weight=2)
    return g


def test_building_and_reading():
    g = sample()
    assert len(g) == 4 and [n.id for n in g] == ["doc", "s0", "s1", "paris"]
    assert g.span_text("s0") == "Paris is big." and g.span_text("paris") == ""
    assert [n.id for n in g.nodes_of_type("sentence")] == ["s0", "s1"]
    assert [(e.src, e.dst) for e in g.edges_of(CONTAINS)] == [("doc", "s0"), ("doc", "s1")]
    assert g.node("s1").attrs == {"topic": "age"}
    assert g.edges_of("mentions")[0].attrs == {"weight": 2}


def test_dict_round_trip():
    g = sample()
    data = g.to_dict()
    back = DocGraph.from_dict(data)
    assert back.to_dict() == data
    assert data["nodes"][3] == {"id": "paris", "type": "entity", "attrs": {"lang": "fr"}}


def test_networkx_round_trip():
    g = sample()
    nxg = g.to_networkx()
    assert isinstance(nxg, nx.MultiDiGraph)
    assert nxg.nodes["s0"]["type"] == "sentence" and nxg.nodes["s0"]["span"] == (0, 13)
    assert nxg.graph["text"] == g.text
    back = DocGraph.from_networkx(nxg)
    assert back.to_dict() == g.to_dict()


def test_from_plain_networkx_digraph():
    d = nx.DiGraph()
    d.add_node(1, type="sentence", span=(0, 2))
    d.add_node(2, type="entity")
    d.add_edge(1, 2, relation="mentions")
    g = DocGraph.from_networkx(d, text="ab cd", doc_id="x")
    assert [n.id for n in g] == ["1", "2"] and g.edges[0].relation == "mentions" and g.doc_id == "x"


def test_networkx_errors_name_the_node():
    d = nx.DiGraph()
    d.add_node("a")
    with pytest.raises(GraphError, match="node 'a': networkx node has no 'type' attribute"):
        DocGraph.from_networkx(d, text="x")
    d = nx.DiGraph()
    d.add_node("a", type="t")
    d.add_node("b", type="t")
    d.add_edge("a", "b")
    with pytest.raises(GraphError, match=r"networkx edge 'a' -> 'b' has no 'relation'"):
        DocGraph.from_networkx(d, text="x")


def test_graph_errors():
    g = sample()
    with pytest.raises(GraphError, match=r"^d1.json: node 's0': duplicate node id"):
        g.add_node("s0", "sentence")
    with pytest.raises(GraphError, match="node type must be a non-empty string"):
        g.add_node("z", "")
    with pytest.raises(GraphError, match=r"node 'z': span \[0, 99\) lies outside the document text of 24 characters"):
        g.add_node("z", "sentence", (0, 99))
    with pytest.raises(GraphError, match=r"span \[5, 2\) ends before it starts"):
        g.add_node("z", "sentence", (5, 2))
    with pytest.raises(GraphError, match="span must be a pair of ints"):
        g.add_node("z", "sentence", ("a", None))
    with pytest.raises(GraphError, match=r"node 'nope': edge 's0' -\[mentions\]-> 'nope': target node 'nope' does not exist"):
        g.add_edge("s0", "mentions", "nope")
    with pytest.raises(GraphError, match="no such node"):
        g.node("nope")
    with pytest.raises(GraphError, match="document text must be a str"):
        DocGraph(b"bytes")


def test_from_dict_errors_name_the_key_path():
    with pytest.raises(GraphError, match=r"^f.json: \$\.text: missing or non-string key 'text'"):
        DocGraph.from_dict({"nodes": []}, source="f.json")
    with pytest.raises(GraphError, match=r"\$\.nodes\[1\]: node is missing key 'type'"):
        DocGraph.from_dict({"text": "x", "nodes": [{"id": "a", "type": "t"}, {"id": "b"}]})
    with pytest.raises(GraphError, match=r"\$\.edges\[0\]: edge is missing key\(s\) \['relation'\]"):
        DocGraph.from_dict({"text": "x", "nodes": [{"id": "a", "type": "t"}], "edges": [{"src": "a", "dst": "a"}]})
    with pytest.raises(GraphError, match=r"\$\.nodes: 'nodes' must be a list, got dict"):
        DocGraph.from_dict({"text": "x", "nodes": {}})
    with pytest.raises(GraphError, match="a document graph must be an object"):
        DocGraph.from_dict([1, 2])


def test_extend_adds_in_bulk_checked_or_as_built():
    from graphattn.graph import Edge, Node

    nodes = [Node("a", "sentence", (0, 3)), Node("b", "sentence", (4, 7), {"k": 1})]
    edges = [Edge("a", "next", "b")]
    checked, trusted = DocGraph("abc def"), DocGraph("abc def")
    checked.extend(nodes, edges)
    trusted.extend(nodes, edges, validate=False)
    assert checked.to_dict() == trusted.to_dict() == {
        "doc_id": None, "text": "abc def",
        "nodes": [{"id": "a", "type": "sentence", "span": [0, 3]}, {"id": "b", "type": "sentence", "span": [4, 7], "attrs": {"k": 1}}],
        "edges": [{"src": "a", "relation": "next", "dst": "b"}],
    }
    assert trusted.nodes["b"] is nodes[1] and checked.nodes["b"] is not nodes[1]  # as built vs copied
    with pytest.raises(GraphError, match=r"node 'c': span \[0, 99\) lies outside"):
        DocGraph("abc def").extend([Node("c", "sentence", (0, 99))])
    with pytest.raises(GraphError, match="target node 'zz' does not exist"):
        DocGraph("abc def").extend(nodes, [Edge("a", "next", "zz")])
