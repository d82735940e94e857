"""DocGraph: building, reading, dict and networkx round trips, and its own errors."""

import networkx as nx
import numpy as np
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
    with pytest.raises(
        GraphError, match=r"node 'nope': edge 's0' -\[mentions\]-> 'nope': target node 'nope' does not exist"
    ):
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
    assert (
        checked.to_dict()
        == trusted.to_dict()
        == {
            "doc_id": None,
            "text": "abc def",
            "nodes": [
                {"id": "a", "type": "sentence", "span": [0, 3]},
                {"id": "b", "type": "sentence", "span": [4, 7], "attrs": {"k": 1}},
            ],
            "edges": [{"src": "a", "relation": "next", "dst": "b"}],
        }
    )
    nodes[1].attrs["k"] = 2  # the graph stores values in its columns, not the objects handed in
    assert trusted.node("b").attrs["k"] == checked.node("b").attrs["k"] == 1
    with pytest.raises(GraphError, match=r"node 'c': span \[0, 99\) lies outside"):
        DocGraph("abc def").extend([Node("c", "sentence", (0, 99))])
    with pytest.raises(GraphError, match="target node 'zz' does not exist"):
        DocGraph("abc def").extend(nodes, [Edge("a", "next", "zz")])
    with pytest.raises(GraphError, match="target node 'zz' does not exist"):
        DocGraph("abc def").extend(nodes, [Edge("a", "next", "zz")], validate=False)  # edges join rows: ends must exist


# -- columns, views and the checks that no path around the constructors escapes (#15 item 11) --
@pytest.mark.parametrize(
    "span",
    [
        [float("inf"), 2],
        [0.2, 1.7],
        [0.0, 2.0],
        ["0", "2"],
        [True, 2],
        [0, False],
        [1],
        [0, 1, 2],
        "02",
        5,
        0,
        {"a": 0, "b": 1},
    ],
)
def test_from_dict_refuses_spans_that_are_not_two_integers(span):
    data = {"text": "abcdef", "nodes": [{"id": "n7", "type": "t", "span": span}]}
    with pytest.raises(GraphError, match=r"node 'n7': span must be a pair of ints \[start, end\), got"):
        DocGraph.from_dict(data, source="g.json")


@pytest.mark.parametrize("attrs", [[1, 2], "x", 3, None])
def test_from_dict_refuses_attrs_that_are_not_a_mapping(attrs):
    data = {"text": "abc", "nodes": [{"id": "a", "type": "t", "attrs": attrs}]}
    with pytest.raises(GraphError, match=r"^g.json: \$\.nodes\[0\]\.attrs: node 'a': attrs must be an object"):
        DocGraph.from_dict(data, source="g.json")
    data = {
        "text": "abc",
        "nodes": [{"id": "a", "type": "t"}],
        "edges": [{"src": "a", "relation": "r", "dst": "a", "attrs": attrs}],
    }
    with pytest.raises(GraphError, match=r"\$\.edges\[0\]\.attrs: node 'a': attrs must be an object"):
        DocGraph.from_dict(data, source="g.json")


def test_a_span_or_text_set_later_is_checked_then():
    g = sample()
    node = g.node("s0")
    with pytest.raises(
        GraphError, match=r"d1.json: node 's0': span \[3, 40\) lies outside the document text of 24 characters"
    ):
        node.span = (3, 40)
    with pytest.raises(GraphError, match=r"node 's0': span must be a pair of ints"):
        node.span = (0.5, 2)
    assert g.node("s0").span == (0, 13)  # a refused value leaves the graph as it was
    node.span = (1, 5)
    assert g.node("s0").span == (1, 5) and g.span_array()[1].tolist() == [1, 5]
    node.span = None
    assert g.node("s0").span is None
    with pytest.raises(GraphError, match=r"node 'doc': span \[0, 24\) would lie outside the new text of 10 characters"):
        g.text = "short text"
    with pytest.raises(GraphError, match="document text must be a str"):
        g.text = b"bytes"
    g.text = "Paris is big. It is old. And more."
    assert g.span_text("s1") == "It is old."
    with pytest.raises(GraphError, match="node type must be a non-empty string"):
        node.type = ""


def test_views_write_through_to_the_columns():
    g = sample()
    g.node("s1").attrs["topic"] = "history"
    g.node("paris").attrs["population"] = 2.1
    del g.node("paris").attrs["lang"]
    assert g.node("s1").attrs == {"topic": "history"} and g.node("paris").attrs == {"population": 2.1}
    present, values = g.attr_column("population")
    assert present.tolist() == [False, False, False, True] and values[3] == 2.1
    g.node("s0").attrs = {"a": 1}
    assert dict(g.node("s0").attrs) == {"a": 1}
    with pytest.raises(KeyError):
        del g.node("s0").attrs["nope"]
    with pytest.raises(GraphError, match="attr names must be strings, got 3"):
        g.node("s0").attrs[3] = "x"
    assert dict(g.node("s0").attrs) == {"a": 1}
    g.edges.append(g.edges[0])  # the same edge again, through the list view
    assert len(g.edges) == 4 and g.edges[-1].dst == "s0"


def test_bulk_nodes_are_columns_and_read_back_as_nodes():
    import numpy as np

    g = DocGraph("one two three")
    g.add_node("doc", "document", (0, 13))
    first = g.add_nodes(
        ["w0", "w1", "w2"],
        "word",
        np.array([[0, 3], [4, 7], [8, 13]]),
        {"length": np.array([3, 3, 5]), "stop": (np.array([True, False, False]), np.array([True, True, False]))},
    )
    g.add_edges(np.zeros(3, np.int64), CONTAINS, np.arange(first, first + 3))
    assert first == 1 and [n.id for n in g.nodes_of_type("word")] == ["w0", "w1", "w2"]
    assert g.node("w2").attrs == {"length": 5} and type(g.node("w2").attrs["length"]) is int
    assert g.node("w1").attrs == {"length": 3, "stop": False}
    assert [(e.src, e.dst) for e in g.edges_of(CONTAINS)] == [("doc", "w0"), ("doc", "w1"), ("doc", "w2")]
    present, values = g.attr_column("length")
    assert (
        present.tolist() == [False, True, True, True] and values.dtype == np.int64 and values.tolist() == [0, 3, 3, 5]
    )
    checked = DocGraph(g.text)
    checked.extend(g.nodes.values(), g.edges)
    assert checked.to_dict() == g.to_dict()
    g.node("w0").attrs["length"] = "three"  # an array column turns into a list column when it must
    assert g.node("w0").attrs["length"] == "three" and g.node("w2").attrs["length"] == 5
    with pytest.raises(GraphError, match=r"node 'x1': span \[4, 99\) lies outside"):
        g.add_nodes(["x0", "x1"], "word", np.array([[0, 3], [4, 99]]))
    with pytest.raises(GraphError, match=r"node 'w1': duplicate node id"):
        g.add_nodes(["x0", "w1"], "word")
    with pytest.raises(GraphError, match="outside the 4 nodes"):
        g.add_edges([0], CONTAINS, [4])
    assert len(g) == 4  # refused adds leave nothing behind


def test_repr_is_one_line():
    text = repr(sample())
    assert (
        text == "DocGraph(doc_id='d1', 24 chars, 4 nodes (sentence 2, document 1, entity 1), 3 edges, source='d1.json')"
    )
    assert repr(sample().node("s1")) == "Node(id='s1', type='sentence', span=(14, 24), attrs={'topic': 'age'})"


def test_graphs_pickle_with_their_columns():
    import pickle

    import numpy as np

    g = sample()
    g.add_nodes(["w"], "word", np.array([[0, 5]]), {"stop": (np.array([True]), np.array([False]))})
    back = pickle.loads(pickle.dumps(g))
    assert back.to_dict() == g.to_dict() and "stop" not in back.node("w").attrs


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 30), st.floats(allow_nan=True), st.text(max_size=3))
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(span=_JSON, attrs=_JSON)
def test_from_dict_builds_a_checked_graph_or_names_the_node(span, attrs):
    """Whatever JSON stands in a node's span and attrs: a graph whose spans are int pairs inside
    the text, or a GraphError naming the node - never a TypeError, OverflowError or coercion."""
    data = {"text": "0123456789", "nodes": [{"id": "n", "type": "t", "span": span, "attrs": attrs}]}
    try:
        graph = DocGraph.from_dict(data)
    except GraphError as err:
        assert "node 'n'" in str(err)
        return
    got = graph.node("n").span
    assert got is None or (
        type(got[0]) is int and type(got[1]) is int and 0 <= got[0] <= got[1] <= 10 and list(got) == span
    )


# -- a refused edit leaves the graph as it was (#38 item 3) ----------------------------------
def state(g: DocGraph) -> tuple:
    """Everything a graph holds, registered names and attr columns included."""
    codes, type_names = g.type_codes()
    src, dst, rel, relations = g.edge_arrays()
    node_attrs = {name: [v for v in g.attr_column(name)[1].tolist()] for name in sorted(g._node_attrs)}
    edge_attrs = {name: [e.attrs.get(name) for e in g.edges] for name in sorted(g._edge_attrs)}
    return (
        g.to_dict(),
        codes.tolist(),
        type_names,
        g.span_array().tolist(),
        src.tolist(),
        dst.tolist(),
        rel.tolist(),
        relations,
        node_attrs,
        edge_attrs,
    )


@pytest.mark.parametrize("relation", [{"x": 1}, ["r"], "", None, 5, b"r"])
def test_an_edge_with_a_bad_relation_is_refused_whole(relation):
    g = sample()
    before = state(g)
    with pytest.raises(GraphError, match=r"^d1.json: node 's0': edge 's0' -\[.*\]-> 'paris': relation must be a non"):
        g.add_edge("s0", relation, "paris", weight=1)
    assert state(g) == before
    with pytest.raises(GraphError, match="relation must be a non-empty string"):
        g.add_edges([1], [relation], [3])  # one relation per edge
    if not isinstance(relation, list):  # (a list is the one-per-edge form)
        with pytest.raises(GraphError, match="relation must be a non-empty string"):
            g.add_edges([1], relation, [3])
    with pytest.raises(GraphError, match=r"edge 1 of a bulk add: relation must be a non-empty string"):
        g.add_edges(np.array([1, 2]), ["mentions", relation], np.array([3, 3]))
    assert state(g) == before
    g.add_edge("s0", "mentions", "paris")  # the graph is still usable: the next edge takes the next row
    assert g.edges[-1].relation == "mentions" and len(g.edges) == len(before[0]["edges"]) + 1


def test_from_dict_names_the_edge_of_a_bad_relation():
    data = {
        "text": "ab",
        "nodes": [{"id": "a", "type": "t"}, {"id": "b", "type": "t"}],
        "edges": [{"src": "a", "relation": "r", "dst": "b"}, {"src": "a", "relation": {"x": 1}, "dst": "b"}],
    }
    with pytest.raises(
        GraphError,
        match=r"^g.json: \$\.edges\[1\]\.relation: node 'a': edge 'a' -\[\{'x': 1\}\]-> 'b': relation must be a non",
    ):
        DocGraph.from_dict(data, source="g.json")
    data["edges"][1] = {"src": "a", "relation": "r", "dst": "zz"}
    with pytest.raises(GraphError, match=r"^g.json: \$\.edges\[1\]: node 'zz': edge 'a' -\[r\]-> 'zz': target node"):
        DocGraph.from_dict(data, source="g.json")
    data["edges"][1] = {"src": ["a"], "relation": "r", "dst": "b"}
    with pytest.raises(GraphError, match=r"\$\.edges\[1\]\.src: an edge's src must be a node id"):
        DocGraph.from_dict(data, source="g.json")
    data["edges"] = []
    data["nodes"][1] = {"id": {"k": 1}, "type": "t"}
    with pytest.raises(GraphError, match=r"\$\.nodes\[1\]\.id: a node id must be a string or an integer"):
        DocGraph.from_dict(data, source="g.json")
    data["nodes"][1] = {"id": "b", "type": "t", "span": [0, 5]}
    with pytest.raises(GraphError, match=r"^g.json: \$\.nodes\[1\]: node 'b': span \[0, 5\) lies outside"):
        DocGraph.from_dict(data, source="g.json")
    data["nodes"][1] = {"id": "b", "type": "t"}
    with pytest.raises(GraphError, match=r"\$\.doc_id: doc_id must be a string or an integer"):
        DocGraph.from_dict({**data, "doc_id": [1]}, source="g.json")
    assert DocGraph.from_dict({**data, "doc_id": 7}).doc_id == "7"


def test_a_refused_node_or_child_leaves_no_trace():
    g = sample()
    before = state(g)
    with pytest.raises(GraphError, match=r"node 'z': span \[0, 99\) lies outside"):
        g.add_node("z", "brand-new-type", (0, 99))  # the new type is not registered either
    with pytest.raises(GraphError, match=r"node 'nope': edge 'nope' -\[contains\]-> 'z': source node 'nope' does not"):
        g.add_child("nope", "z", "sentence", (0, 5), topic="x")
    with pytest.raises(GraphError, match="node type must be a non-empty string"):
        g.add_child("doc", "z", {"t": 1})
    assert state(g) == before and "z" not in g.nodes


def test_bulk_adds_are_checked_before_anything_is_stored():
    g = sample()
    before = state(g)
    with pytest.raises(GraphError, match=r"attr column 'k' has 1 values for 2 nodes"):
        g.add_nodes(["x", "y"], "new-type", attrs={"k": [1]})
    with pytest.raises(GraphError, match=r"attr column 'k' must be a list or an array of 2 values, got int"):
        g.add_nodes(["x", "y"], "new-type", attrs={"k": 5})
    with pytest.raises(GraphError, match=r"spans must be an integer array \[2, 2\]"):
        g.add_nodes(["x", "y"], "new-type", np.array([0, 1]), validate=False)
    with pytest.raises(GraphError, match=r"spans must be an integer array \[1, 2\], got float64"):
        g.add_nodes(["x"], "new-type", np.array([[0.5, 1.7]]), validate=False)
    with pytest.raises(GraphError, match="node type must be a non-empty string"):
        g.add_nodes(["x", "y"], (["new-type", ""], np.array([0, 1])), validate=False)
    for types, says in (
        ((["new-type"], np.array([0.0, 0.0])), r"codes must be \[2\] integer indices into 1 names"),
        ((["new-type"], np.array([0, 1])), r"codes must be \[2\] integer indices into 1 names"),
        (({"new-type": 0}, np.array([0, 0])), r"\(names, codes\): names must be a list, got dict"),
        ({"new-type": 0, "b": 1}, "node type must be a non-empty string, a list of one per node or"),
    ):
        with pytest.raises(GraphError, match=says):
            g.add_nodes(["x", "y"], types)
    for rows in ([1.7], ["0"], [True], [None]):
        with pytest.raises(GraphError, match="edge source rows must be integers"):
            g.add_edges(rows, "mentions", [3])
    assert state(g) == before


@pytest.mark.parametrize("validate", [True, False])
def test_extend_adds_all_or_nothing(validate):
    from graphattn.graph import Edge, Node

    g = sample()
    before = state(g)
    nodes = [Node("n1", "new-type", (0, 5), {"k": 1}), Node("n2", "sentence", None, {"j": "x"})]
    for edges, message in (
        ([Edge("n1", "next", "n2"), Edge("n1", {"x": 1}, "n2")], r"edge 'n1' -\[\{'x': 1\}\]-> 'n2': relation must be"),
        ([Edge("n1", "next", "n2"), Edge("n2", "next", "zz")], r"edge 'n2' -\[next\]-> 'zz': target node 'zz' does"),
        ([Edge("n1", "next", "doc", [1])], r"node 'n1': attrs must be an object"),
    ):
        with pytest.raises(GraphError, match=message):
            g.extend(nodes, edges, validate=validate)
        assert state(g) == before
        with pytest.raises(GraphError, match=message.replace("n1", "doc").replace("n2", "s0")):
            g.edges.extend(
                [
                    Edge(
                        e.src.replace("n1", "doc").replace("n2", "s0"),
                        e.relation,
                        e.dst.replace("n1", "doc").replace("n2", "s0"),
                        e.attrs,
                    )
                    for e in edges
                ]
            )
        assert state(g) == before
    if validate:
        with pytest.raises(GraphError, match=r"node 's0': duplicate node id"):
            g.extend([Node("n1", "new-type"), Node("s0", "t")], [Edge("n1", "next", "doc")])
        assert state(g) == before
    g.extend(nodes, [Edge("n1", "next", "n2", {"w": 2}), Edge("doc", CONTAINS, "n1")], validate=validate)
    assert g.node("n1").attrs == {"k": 1} and g.node("n2").attrs == {"j": "x"} and g.node("n2").span is None
    assert [(e.src, e.relation, e.dst, dict(e.attrs)) for e in g.edges[-2:]] == [
        ("n1", "next", "n2", {"w": 2}),
        ("doc", CONTAINS, "n1", {}),
    ]
    assert g.edges[0].attrs == {} and g.edges_of("mentions")[0].attrs == {"weight": 2}


def test_networkx_multigraph_without_relation_is_refused():
    d = nx.MultiDiGraph()
    d.add_node("a", type="t")
    d.add_node("b", type="t")
    d.add_edge("a", "b")  # key 0: a number, not a relation name
    with pytest.raises(GraphError, match=r"networkx edge 'a' -> 'b' has no 'relation'"):
        DocGraph.from_networkx(d, text="x")
    d = nx.DiGraph()
    d.add_node("a", type="t")
    d.add_edge("a", "a", relation=3)
    with pytest.raises(GraphError, match=r"edge 'a' -\[3\]-> 'a': relation must be a non-empty string"):
        DocGraph.from_networkx(d, text="x")


@settings(max_examples=200, deadline=None)
@given(relation=_JSON, src=_JSON, attrs=_JSON)
def test_any_json_edge_builds_or_names_the_edge(relation, src, attrs):
    """Whatever JSON stands in an edge: a graph holding exactly that edge, or a GraphError with the
    edge's JSON path; and the same edge added to a graph by hand either goes in or changes nothing."""
    data = {
        "text": "ab",
        "nodes": [{"id": "a", "type": "t"}, {"id": "1", "type": "t"}],
        "edges": [{"src": src, "relation": relation, "dst": "a", "attrs": attrs}],
    }
    try:
        graph = DocGraph.from_dict(data)
    except GraphError as err:
        assert "$.edges[0]" in str(err)
    else:
        assert [(e.src, e.relation, e.dst) for e in graph.edges] == [(str(src), relation, "a")]
    g = sample()
    before = state(g)
    try:
        g.add_edge("s0", relation, "paris")
    except GraphError as err:
        assert "edge 's0' -[" in str(err)
        assert state(g) == before
