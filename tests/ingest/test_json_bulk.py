"""The bulk JSON readers (columns, one `DocGraph.from_columns` call) against the node-by-node
reference (tests/ingest/json_reference.py): the same graph, LabelWarnings and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ingest_samples import HOTPOT, NQ, PEOPLE_MAPPING, WIKIHOP
from json_reference import (
    reference_hotpotqa_graph,
    reference_json_graph,
    reference_nq_graph,
    reference_wikihop_graph,
)
from test_ingest_mapping import HOTPOT_MAPPING

from graphattn.errors import GraphattnError, GraphError
from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph.columns import MISSING
from graphattn.ingest.json import Record, hotpotqa_graph, nq_graph, wikihop_graph
from graphattn.ingest.mapping import json_graph


def outcome(build, record, **options):
    """Everything a reader's result shows: the graph (dict, type and relation numbering, attr
    columns as the compiler reads them), or the error; and the warnings, in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            graph = build(record, **options)
        except GraphattnError as err:
            result = (type(err).__name__, str(err))
        else:
            names = dict.fromkeys(name for node in graph.to_dict()["nodes"] for name in node.get("attrs", {}))
            columns = {name: [a.tolist() for a in graph.attr_column(name)] for name in names}
            result = (
                graph.to_dict(),
                graph.source,
                graph.type_codes()[1],
                [a.tolist() for a in graph.edge_arrays()[:3]],
                graph.edge_arrays()[3],
                columns,
            )
    return result, [(type(w.message).__name__, str(w.message)) for w in caught]


def same_as_reference(bulk, reference, record, **options):
    got, want = outcome(bulk, record, **options), outcome(reference, record, **options)
    assert got == want
    return got


# -- a small graph spelled out by hand ---------------------------------------------------------
SMALL = {
    "_id": "s1",
    "question": " Who? ",
    "answer": "Ann",
    "supporting_facts": [["T", 1], ["Nope", 0]],
    "context": [["T", ["A b.", "  ", "Ann c."]], ["U", []]],
}


def test_a_small_hotpotqa_graph_by_hand():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = hotpotqa_graph(Record(SMALL, file="small.json"))
    assert [str(w.message) for w in caught] == [
        "small.json: $.supporting_facts[0][1]: sentence 1 of paragraph 'T' is empty",
        "small.json: $.supporting_facts[1][0]: supporting fact names title 'Nope', "
        "which no paragraph of the context has",
    ]
    assert graph.text == "Who?\n\nT\nA b. Ann c.\n\nU"
    assert graph.to_dict() == {
        "doc_id": "s1",
        "text": "Who?\n\nT\nA b. Ann c.\n\nU",
        "nodes": [
            {
                "id": "q",
                "type": "question",
                "span": [0, 4],
                "attrs": {
                    "answer": "Ann",
                    "question_type": None,
                    "level": None,
                    "unmatched_supporting_facts": [("Nope", 0), ("T", 1)],
                },
            },
            {
                "id": "p0",
                "type": "paragraph",
                "span": [6, 19],
                "attrs": {"title": "T", "index": 0, "supporting": False},
            },
            {"id": "p0.title", "type": "title", "span": [6, 7], "attrs": {"supporting": False}},
            {"id": "p0.s0", "type": "sentence", "span": [8, 12], "attrs": {"index": 0, "supporting": False}},
            {"id": "p0.s2", "type": "sentence", "span": [13, 19], "attrs": {"index": 2, "supporting": False}},
            {
                "id": "p1",
                "type": "paragraph",
                "span": [21, 22],
                "attrs": {"title": "U", "index": 1, "supporting": False},
            },
            {"id": "p1.title", "type": "title", "span": [21, 22], "attrs": {"supporting": False}},
            {
                "id": "answer",
                "type": "answer",
                "span": [13, 16],
                "attrs": {"answer_type": "span", "text": "Ann", "found_in": "p0.s2", "occurrences": 1},
            },
        ],
        "edges": [
            {"src": "p0", "relation": "contains", "dst": "p0.title"},
            {"src": "p0", "relation": "contains", "dst": "p0.s0"},
            {"src": "p0", "relation": "contains", "dst": "p0.s2"},
            {"src": "p1", "relation": "contains", "dst": "p1.title"},
        ],
    }
    assert graph.type_codes()[1] == ("question", "paragraph", "title", "sentence", "answer")
    assert graph.attr_values("index", [0, 1, 3, 4], default=-1) == [-1, 0, 0, 2]
    assert same_as_reference(hotpotqa_graph, reference_hotpotqa_graph, Record(SMALL, file="small.json"))


# -- HotpotQA ----------------------------------------------------------------------------------
_WORDS = st.sampled_from(["Ann", "ann", "b", "The", "İx", "Σ", " ", "", "yes", "no", "Anne", "joann", "Ann's", "(b)"])
_SENTENCE = st.lists(_WORDS, max_size=4).map(" ".join)
_PARAGRAPH = st.tuples(st.sampled_from(["T", "U", " T ", ""]), st.lists(_SENTENCE, max_size=4)).map(list)
_FACT = st.tuples(st.sampled_from(["T", "U", "V", " U"]), st.integers(-1, 4)).map(list)


@st.composite
def hotpot_records(draw):
    record = {"_id": draw(st.sampled_from(["a", 7])), "question": draw(_SENTENCE) + "?"}
    record["context"] = draw(st.lists(_PARAGRAPH, max_size=4))
    if draw(st.booleans()):
        record["supporting_facts"] = draw(st.lists(_FACT, max_size=3))
    if draw(st.booleans()):
        record["answer"] = draw(
            st.sampled_from(["Ann", "ann", " YES ", "no", "b", "Σ", "zz", "", "x Ann", "(b)", "nn"])
        )
    if draw(st.booleans()):
        record["type"], record["level"] = "bridge", "hard"
    broken = draw(st.sampled_from([None, "title", "sentence", "fact", "answer", "context"]))
    if broken == "title" and record["context"]:
        record["context"][-1][0] = 3
    elif broken == "sentence" and record["context"] and record["context"][0][1]:
        record["context"][0][1][-1] = None
    elif broken == "fact" and record.get("supporting_facts"):
        record["supporting_facts"][0][1] = True
    elif broken == "answer":
        record["answer"] = ["not", "text"]
    elif broken == "context":
        record["context"].append(["only a title"])
    return record


@settings(max_examples=150, deadline=None)
@given(hotpot_records())
def test_hotpotqa_bulk_equals_node_by_node(record):
    same_as_reference(hotpotqa_graph, reference_hotpotqa_graph, Record(record, file="h.jsonl", line=3))


def test_hotpotqa_samples_and_the_benchmark_records_equal_node_by_node(tmp_path):
    import sys

    from graphattn.ingest.records import iter_records

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "benchmarks"))
    from corpus import generate

    generate(tmp_path / "bench.jsonl", 40)
    records = [Record.of(ref) for ref in iter_records(tmp_path / "bench.jsonl")] + [Record(HOTPOT, file="x.json")]
    for record in records:
        same_as_reference(hotpotqa_graph, reference_hotpotqa_graph, record)


# -- Natural Questions ---------------------------------------------------------------------------
_TOKENS = st.lists(st.sampled_from(["<P>", "</P>", "<Table>", "<Ul>", "<Td>", "a", "bb", "é"]), min_size=1, max_size=25)


@st.composite
def nq_records(draw):
    tokens = draw(_TOKENS)
    n = len(tokens)
    token = st.integers(0, n - 1)
    candidates = []
    for start in draw(st.lists(token, max_size=6)):
        candidate = {"start_token": start, "end_token": draw(st.integers(start + 1, n))}
        if draw(st.booleans()):
            candidate["top_level"] = draw(st.sampled_from([True, False, "yes"]))
        candidates.append(candidate)
    short = st.fixed_dictionaries({"start_token": st.integers(-1, n), "end_token": st.integers(0, n + 1)})
    annotation = st.fixed_dictionaries(
        {
            "long_answer": st.fixed_dictionaries({"candidate_index": st.integers(-2, len(candidates))}),
            "yes_no_answer": st.sampled_from(["NONE", "YES", "NO"]),
            "short_answers": st.lists(short, max_size=2),
        }
    )
    record = {
        "example_id": draw(st.integers(0, 9)),
        "question_text": "what?",
        "document_text": " ".join(tokens),
        "long_answer_candidates": candidates,
        "annotations": draw(st.lists(annotation, max_size=3)),
    }
    if draw(st.booleans()):
        record["document_url"] = "https://example.org"
    return record


@settings(max_examples=150, deadline=None)
@given(nq_records(), st.booleans())
def test_nq_bulk_equals_node_by_node(record, keep):
    same_as_reference(nq_graph, reference_nq_graph, Record(record, file="nq.jsonl", line=9), keep_html_tokens=keep)


def test_nq_sample_and_bad_candidates_equal_node_by_node():
    same_as_reference(nq_graph, reference_nq_graph, Record(NQ, file="nq.json"))
    with_text = NQ["long_answer_candidates"][0]
    for broken in ({"start_token": "0", "end_token": 2}, 7, {**with_text, "top_level": None}):
        record = {**NQ, "long_answer_candidates": [*NQ["long_answer_candidates"], broken]}
        result, _ = same_as_reference(nq_graph, reference_nq_graph, Record(record, file="nq.json"))
        assert result[0] == "IngestError" and "$.long_answer_candidates[" in result[1]


# -- WikiHop --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change",
    [
        {},
        {"candidates": [], "answer": "x"},
        {"supports": ["", " "]},
        {"candidates": [], "supports": []},
        {"answer": "not a candidate"},
        {"candidates": ["sport", " "]},
    ],
)
def test_wikihop_bulk_equals_node_by_node(change):
    same_as_reference(wikihop_graph, reference_wikihop_graph, Record({**WIKIHOP, **change}, file="w.json", line=1))


# -- mapping-driven --------------------------------------------------------------------------------
PEOPLE = {**PEOPLE_MAPPING, "root": "doc"}
_PERSON = st.fixed_dictionaries(
    {"name": st.sampled_from(["ann", "bob", "doc", "cy"]), "bio": st.sampled_from(["Ann writes.", " ", "x"])},
    optional={
        "age": st.one_of(st.none(), st.integers(0, 99)),
        "nick": st.sampled_from(["B", ""]),
        "knows": st.one_of(st.sampled_from(["ann", "bob", "zz"]), st.lists(st.sampled_from(["ann", "cy", True]))),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_PERSON, max_size=4, unique_by=lambda p: p["name"]), st.sampled_from(["doc", "", None]))
def test_mapping_bulk_equals_node_by_node(people, root):
    mapping = {**PEOPLE, "root": root} if root is not None else {k: v for k, v in PEOPLE.items() if k != "root"}
    record = Record({"people": people}, file="people.jsonl", line=2)
    same_as_reference(json_graph, reference_json_graph, record, mapping=mapping)


@settings(max_examples=60, deadline=None)
@given(hotpot_records())
def test_mapping_of_hotpotqa_equals_node_by_node(record):
    record = {**record, "_id": str(record["_id"])}
    same_as_reference(json_graph, reference_json_graph, Record(record, file="h.jsonl", line=1), mapping=HOTPOT_MAPPING)


# -- DocGraph.from_columns ---------------------------------------------------------------------------
def test_from_columns_builds_what_add_node_builds():
    text = "one two"
    graph = DocGraph.from_columns(
        text,
        ["doc", "w0", "w1"],
        ["document", "word", "word"],
        np.array([[0, 7], [0, 3], [4, 7]]),
        {"stop": [MISSING, True, False], "n": (np.array([0, 3, 3]), np.array([False, True, True]))},
        ([0, 0], CONTAINS, [1, 2]),
        doc_id="d",
        source="d.json",
    )
    node_by_node = DocGraph(text, "d", "d.json")
    node_by_node.add_node("doc", "document", (0, 7))
    node_by_node.add_child("doc", "w0", "word", (0, 3), stop=True, n=3)
    node_by_node.add_child("doc", "w1", "word", (4, 7), stop=False, n=3)
    assert graph.to_dict() == node_by_node.to_dict()
    assert graph.attr_values("n", [2, 0]) == [3, None] and graph.attr_values("absent", [1]) == [None]


@pytest.mark.parametrize(
    "ids, types, spans, message",
    [
        (["a", "b", "a"], ["t", "t", "u"], [[0, 1], [0, 9], [0, 1]], r"node 'b': span \[0, 9\) lies outside"),
        (
            ["a", "b", "a"],
            ["t", "u", "v"],
            [[0, 1], [0, 1], [0, 9]],
            r"node 'a': duplicate node id \(first has type 't'\)",
        ),
        (["a", "b"], ["t", ""], [[0, 1], [-1, -1]], "node 'b': node type must be a non-empty string, got ''"),
        (["a", "b"], ["t", ["x"]], [[2, 1], [0, 1]], r"node 'a': span \[2, 1\) ends before it starts"),
    ],
)
def test_from_columns_raises_the_error_of_the_first_bad_row(ids, types, spans, message):
    with pytest.raises(GraphError, match=message):
        DocGraph.from_columns("abc", ids, types, np.array(spans), source="x.json")
    reference = DocGraph("abc", source="x.json")
    with pytest.raises(GraphError, match=message):
        for node_id, node_type, span in zip(ids, types, spans):
            reference.add_node(node_id, node_type, None if span[0] < 0 else tuple(span))


def test_from_columns_takes_a_missing_span_as_minus_one_twice_only():
    with pytest.raises(GraphError, match=r"node 'b': span \[-1, 3\) lies outside"):
        DocGraph.from_columns("abc", ["a", "b"], "t", np.array([[0, 1], [-1, 3]]))
