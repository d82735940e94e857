"""Bad graphs and bad schema/tokenizer combinations: each error names the node, file and schema."""

import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc

from graphattn import compile_instance, load_schema
from graphattn.errors import CompileError, GraphError
from graphattn.graph import DocGraph, Edge


@pytest.fixture
def tok():
    return WordTokenizer()


@pytest.fixture
def schema(tmp_path):
    import yaml

    path = tmp_path / "test-schema.yaml"
    path.write_text(yaml.safe_dump(schema_dict()))
    return load_schema(path)


def graph(text="w0 w1 w2 w3", source="docs/a.json"):
    g = DocGraph(text, doc_id="a", source=source)
    g.add_node("doc", "document", (0, len(text)))
    return g


def test_undeclared_node_type_names_node_schema_and_file(tok, schema):
    g = graph()
    g.add_child("doc", "s0", "sentense", (0, 5))
    with pytest.raises(CompileError) as err:
        compile_instance(g, schema, tok)
    msg = str(err.value)
    assert msg.startswith("docs/a.json: node 's0': node type 'sentense' is not declared in schema 'test'")
    assert schema.source in msg and "declared: document, paragraph, sentence" in msg
    assert err.value.location.node == "s0"


def test_undeclared_relation_is_an_error(tok, schema):
    g = graph()
    g.add_child("doc", "s0", "sentence", (0, 5))
    g.add_edge("s0", "mentions", "doc")
    with pytest.raises(
        CompileError,
        match=r"node 's0': edge 's0' -\[mentions\]-> 'doc': relation 'mentions' is not declared in schema 'test'",
    ):
        compile_instance(g, schema, tok)


def test_dangling_edge_names_the_missing_node(tok, schema):
    g = graph()
    g.add_child("doc", "s0", "sentence", (0, 5))
    with pytest.raises(
        GraphError, match=r"node 's9': edge 'doc' -\[contains\]-> 's9': target node 's9' does not exist"
    ):
        g.edges.append(Edge("doc", "contains", "s9"))  # the edge list is checked too: edges join existing rows


def test_span_past_the_text(tok, schema):
    g = graph()
    node = g.add_child("doc", "s0", "sentence", (0, 5))
    with pytest.raises(
        GraphError, match=r"docs/a.json: node 's0': span \[3, 40\) lies outside the document text of 11 characters"
    ):
        node.span = (3, 40)  # a span set later is checked when it is set
    compile_instance(g, schema, tok)  # and the graph is left as it was


def test_crossing_spans_of_one_type(tok, schema):
    g = graph()
    g.add_child("doc", "s0", "sentence", (0, 5))
    g.add_child("doc", "s1", "sentence", (3, 8))
    with pytest.raises(
        CompileError, match=r"node 's1': spans of 'sentence' nodes 's0' \[0, 5\) and 's1' \[3, 8\) overlap"
    ):
        compile_instance(g, schema, tok)


def test_nested_spans_of_one_type_are_allowed(tok, schema):
    g = graph()
    g.add_child("doc", "s0", "sentence", (0, 8))
    g.add_child("s0", "s1", "sentence", (3, 5))
    inst = compile_instance(g, schema, tok)
    assert inst.global_node_ids == ["s0", "s1"]
    assert inst.long_owners["sentence"].tolist() == [0, 1, 0]  # the innermost sentence owns w1


def test_cycle_in_the_containment_hierarchy(tok, schema):
    g = DocGraph("w0 w1", doc_id="a", source="docs/a.json")
    g.add_node("p", "paragraph")
    g.add_node("q", "paragraph")
    g.add_node("s", "sentence", (0, 2))
    g.add_edge("p", "contains", "q")
    g.add_edge("q", "contains", "p")
    g.add_edge("q", "contains", "s")
    with pytest.raises(
        CompileError, match=r"cycle in the containment hierarchy: '(p|q)' -> '(p|q)' -> '(p|q)' \(parent -> child\)"
    ):
        compile_instance(g, schema, tok)


def test_self_loop_is_a_cycle(tok, schema):
    g = graph()
    g.add_edge("doc", "contains", "doc")
    with pytest.raises(CompileError, match=r"node 'doc': cycle in the containment hierarchy: 'doc' -> 'doc'"):
        compile_instance(g, schema, tok)


def test_two_parents(tok, schema):
    g = graph()
    g.add_child("doc", "p0", "paragraph", (0, 5))
    g.add_child("doc", "p1", "paragraph", (6, 11))
    g.add_child("p0", "s0", "sentence", (0, 2))
    g.add_edge("p1", "contains", "s0")
    with pytest.raises(
        CompileError, match=r"node 's0': node has more than one parent in the containment hierarchy: 'p0', 'p1'"
    ):
        compile_instance(g, schema, tok)


def test_child_span_outside_its_parent(tok, schema):
    g = graph()
    g.add_child("doc", "p0", "paragraph", (0, 5))
    g.add_child("p0", "s0", "sentence", (3, 8))
    with pytest.raises(CompileError, match=r"node 's0': span \[3, 8\) lies outside its parent 'p0''s span \[0, 5\)"):
        compile_instance(g, schema, tok)


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_document(tok, schema, text):
    g = DocGraph(text, doc_id="e", source="docs/e.json")
    with pytest.raises(CompileError, match=r"docs/e.json: node 'e': empty document 'e'"):
        compile_instance(g, schema, tok)


def test_document_without_long_text(tok, schema):
    g = graph()  # a document node but no sentence: nothing of a long type
    with pytest.raises(
        CompileError, match=r"empty document 'a': no tokens inside nodes of the long types \(sentence\)"
    ):
        compile_instance(g, schema, tok)


def test_link_to_a_type_without_globals(tok):
    schema = load_schema(
        schema_dict(relations={"contains": {"hierarchy": True}, "mentions": {"link": "l2g", "label": "m"}})
    )
    g = sentences_doc([[2]])
    g.add_edge("p0.s0", "mentions", "p0")
    with pytest.raises(
        CompileError, match=r"node 'p0': edge 'p0.s0' -\[mentions\]-> 'p0': a l2g link needs a global at 'p0'"
    ):
        compile_instance(g, schema, tok)


def test_special_token_missing_from_the_vocabulary(tok, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nspecial_tokens:\n  global: '[unused9]'\nnode_types:\n  sentence: {global: node, long: true}\n"
    )
    with pytest.raises(
        CompileError,
        match=r"s.yaml:3: \$\.special_tokens\.global: token '\[unused9\]' is not in the tokenizer's vocabulary",
    ):
        compile_instance(sentences_doc([[2]]), load_schema(path), tok)


def test_token_id_outside_the_vocabulary(tok):
    schema = load_schema(schema_dict(special_tokens={"global": 10_000}))
    with pytest.raises(
        CompileError, match=r"\$\.special_tokens\.global: token id 10000 is outside the tokenizer's vocabulary"
    ):
        compile_instance(sentences_doc([[2]]), schema, tok)


def test_more_documents_than_packing_allows(tok, schema):
    with pytest.raises(CompileError, match=r"2 documents given, but the schema packs at most 1 per instance"):
        compile_instance([sentences_doc([[1]]), sentences_doc([[1]])], schema, tok)


def test_error_policy_refuses_long_documents(tok):
    schema = load_schema(schema_dict(max_long_length=4, truncation={"policy": "error"}))
    with pytest.raises(
        CompileError, match=r"node 'd': document needs 5 long and 1 global tokens; the schema allows 4 and 64"
    ):
        compile_instance(sentences_doc([[5]]), schema, tok)


def test_not_a_graph(tok, schema):
    with pytest.raises(CompileError, match="compile takes DocGraph objects, got dict"):
        compile_instance([{"text": "x"}], load_schema(schema_dict(packing={"max_documents": 2})), tok)


def test_nothing_fits(tok):
    schema = load_schema(
        schema_dict(
            max_long_length=1,
            node_types={"document": {}, "paragraph": {"sep_after": True}, "sentence": {"global": "node", "long": True}},
        )
    )
    with pytest.raises(
        CompileError, match=r"node 'd': no text fits: max_long_length 1 leaves no room for a single token"
    ):
        compile_instance(sentences_doc([[1]]), schema, tok)
