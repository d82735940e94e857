"""Truncation policies and the report that says what was dropped; greedy packing."""

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc

from graphattn import compile_instance, load_schema
from graphattn.compile import pack, pack_groups
from graphattn.errors import CompileError


@pytest.fixture
def tok():
    return WordTokenizer()


def test_nothing_dropped_gives_an_empty_report(tok):
    inst = compile_instance(sentences_doc([[2, 3]]), load_schema(schema_dict()), tok)
    report = inst.truncation
    assert not report.truncated and report.dropped_nodes == [] and report.messages == []
    assert (report.long_tokens_before, report.long_tokens_after, report.globals_before, report.globals_after) == (
        5,
        5,
        2,
        2,
    )


def test_tail_keeps_the_first_tokens_and_reports_whole_sentences_lost(tok):
    schema = load_schema(schema_dict(max_long_length=6))
    inst = compile_instance(sentences_doc([[3, 2], [4]]), schema, tok)  # 9 tokens
    assert inst.long_length == 6
    assert inst.global_node_ids == ["p0.s0", "p0.s1", "p1.s0"]  # p1.s0 keeps its first token
    np.testing.assert_array_equal(inst.long_owners["sentence"], [0, 0, 0, 1, 1, 2])
    report = inst.truncation
    assert report.truncated and report.dropped_nodes == []
    assert (report.long_tokens_before, report.long_tokens_after) == (9, 6)
    assert report.messages == ["tail: kept the first 6 of 9 long tokens to fit max_long_length 6"]
    inst = compile_instance(sentences_doc([[3, 2], [4]]), load_schema(schema_dict(max_long_length=5)), tok)
    assert inst.truncation.dropped_nodes == ["p1", "p1.s0"]  # the paragraph went with its only sentence
    assert inst.global_node_ids == ["p0.s0", "p0.s1"]


def test_tail_counts_prefix_and_separators(tok):
    schema = load_schema(
        schema_dict(
            long_prefix=["cls"],
            node_types={"document": {}, "paragraph": {"sep_after": True}, "sentence": {"global": "node", "long": True}},
            max_long_length=7,
        )
    )
    inst = compile_instance(sentences_doc([[2], [2], [2]]), schema, tok)
    # [CLS] a a [SEP] b b [SEP] = 7: the third paragraph does not fit at all
    np.testing.assert_array_equal(inst.long_token_ids[[0, 3, 6]], [2, 3, 3])
    assert inst.long_length == 7 and inst.truncation.dropped_nodes == ["p2", "p2.s0"]


def test_drop_longest_first_drops_last_sentences_of_the_longest_context(tok):
    """WikiHop's recipe: contexts (paragraphs) of 6 and 5 tokens, max 6 -> drop 2 sentences."""
    schema = load_schema(
        schema_dict(max_long_length=6, truncation={"policy": "drop_longest_first", "unit": "sentence"})
    )
    inst = compile_instance(sentences_doc([[3, 3], [3, 2]]), schema, tok)
    # p0 (6) loses p0.s1 -> 3; then p1 (5) is the longest and loses p1.s1 -> 6 tokens left
    assert inst.global_node_ids == ["p0.s0", "p1.s0"]
    assert inst.truncation.dropped_nodes == ["p0.s1", "p1.s1"]
    assert inst.long_length == 6 and inst.long_token_text(3) == "w6"
    assert "drop_longest_first: dropped 2 sentence node(s)" in inst.truncation.messages[0]
    assert (inst.truncation.globals_before, inst.truncation.globals_after) == (4, 2)


def test_drop_longest_first_with_an_explicit_context_type_and_the_global_budget(tok):
    schema = load_schema(
        schema_dict(
            max_global_length=3,
            truncation={"policy": "drop_longest_first", "unit": "sentence", "context": "document"},
        )
    )
    inst = compile_instance(sentences_doc([[1, 1], [1, 1, 1]]), schema, tok)  # 5 sentence globals, 3 allowed
    assert inst.global_node_ids == ["p0.s0", "p0.s1", "p1.s0"]  # one context: the last sentences go
    assert inst.truncation.dropped_nodes == ["p1.s1", "p1.s2"]


def test_drop_longest_first_falls_back_to_tail_when_units_do_not_suffice(tok):
    from graphattn.graph import DocGraph

    schema = load_schema(
        schema_dict(
            max_long_length=1,
            node_types={
                "document": {},
                "paragraph": {},
                "sentence": {"global": "node", "long": True},
                "title": {"long": True},
            },
            truncation={"policy": "drop_longest_first", "unit": "sentence"},
        )
    )
    g = DocGraph("t0 t1 w0", doc_id="t")
    g.add_node("title", "title", (0, 5))
    g.add_node("s", "sentence", (6, 8))
    inst = compile_instance(g, schema, tok)
    assert inst.long_token_text(0) == "t0" and inst.long_length == 1
    assert inst.truncation.dropped_nodes == ["s"]
    # the last unit is never dropped whole, so tail cuts: the title's first token stays
    assert inst.truncation.messages == ["tail: kept the first 1 of 3 long tokens to fit max_long_length 1"]


def test_globals_past_the_limit_are_cut_from_the_end(tok):
    schema = load_schema(schema_dict(max_global_length=2))
    inst = compile_instance(sentences_doc([[1, 1, 1, 1]]), schema, tok)
    assert inst.global_node_ids == ["p0.s0", "p0.s1"]
    assert inst.truncation.dropped_nodes == ["p0.s2", "p0.s3"]
    assert inst.truncation.messages == ["cut the last 2 global token(s) to fit max_global_length 2"]
    np.testing.assert_array_equal(inst.long_owners["sentence"], [0, 1, -1, -1])  # tokens stay, unowned
    np.testing.assert_array_equal(inst.side.l2g_relative_att_ids[2:], 5)


def test_pack_fills_instances_greedily(tok):
    schema = load_schema(schema_dict(max_long_length=6, packing={"max_documents": 2}))
    docs = [sentences_doc([[3]], "a"), sentences_doc([[2]], "b"), sentences_doc([[4]], "c"), sentences_doc([[9]], "d")]
    instances = list(pack(docs, schema, tok))
    assert [i.doc_ids for i in instances] == [["a", "b"], ["c"], ["d"]]
    assert instances[2].long_length == 6 and instances[2].truncation.truncated
    assert [i.long_length for i in instances[:2]] == [5, 4]
    three = load_schema(schema_dict(packing={"max_documents": 3}))
    assert [i.doc_ids for i in pack(docs, three, tok)] == [["a", "b", "c"], ["d"]]


def test_pack_groups_say_which_inputs_and_on_error_leaves_out_only_the_bad_document(tok):
    schema = load_schema(
        schema_dict(
            packing={"max_documents": 3},
            relations={"contains": {"hierarchy": True}, "mentions": {"link": "l2g", "label": "m"}},
        )
    )
    bad_layout = sentences_doc([[2]], "x")
    bad_layout.add_node("q", "question")  # a type the schema does not declare: fails before packing
    bad_link = sentences_doc([[1]], "y")
    bad_link.add_edge("p0.s0", "mentions", "p0")  # a link to a global-less node: fails when assembled
    docs = [sentences_doc([[2]], "a"), bad_layout, sentences_doc([[1]], "b"), bad_link, sentences_doc([[3]], "c")]
    failures = []
    packs = list(
        pack_groups(docs, schema, tok, on_error=lambda i, graph, err: failures.append((i, graph.doc_id, type(err))))
    )
    assert failures == [(1, "x", CompileError), (3, "y", CompileError)]
    # a, b and y fit together, but y fails to assemble: a, b and (later) c go on alone / packed
    assert [(p.members, p.instance.doc_ids) for p in packs] == [((0,), ["a"]), ((2,), ["b"]), ((4,), ["c"])]
    assert [i.doc_ids for i in pack(docs[::2], schema, tok)] == [["a", "b", "c"]]  # the good ones alone pack as one
    with pytest.raises(CompileError, match="node type 'question' is not declared"):
        list(pack(docs, schema, tok))  # without on_error the first bad document raises
    with pytest.raises(CompileError, match="compile takes DocGraph objects, got dict"):
        list(pack_groups([sentences_doc([[1]], "z"), {"not": "a graph"}], schema, tok))
