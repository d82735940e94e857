"""The generic, mapping-driven JSON reader."""

from __future__ import annotations

import functools
import json

import pytest
from ingest_samples import PEOPLE_MAPPING

from graphattn.errors import IngestError
from graphattn.ingest.json import Record, read_json
from graphattn.ingest.mapping import json_graph, load_mapping

HOTPOT_MAPPING = {
    "id": "_id",
    "root": "document",
    "separator": "\n\n",
    "fields": {
        "question": {"type": "question"},
        "context": {
            "separator": "\n\n",
            "each": {
                "type": "paragraph",
                "fields": {0: {"type": "title"}, 1: {"each": {"type": "sentence"}, "separator": " "}},
            },
        },
    },
}

RECORD = {"_id": "r1", "question": " Who? ", "context": [["T1", ["s1.", " s2. "]], ["T2", ["", "s3."]], ["T3", []]]}


def test_containers_text_and_separators():
    graph = json_graph(RECORD, HOTPOT_MAPPING)
    assert graph.doc_id == "r1"
    assert graph.text == "Who?\n\nT1\ns1. s2.\n\nT2\ns3.\n\nT3"
    spans = {n.id: graph.span_text(n.id) for n in graph}
    assert spans == {
        "doc": graph.text,
        "question0": "Who?",
        "paragraph0": "T1\ns1. s2.",
        "title0": "T1",
        "sentence0": "s1.",
        "sentence1": "s2.",
        "paragraph1": "T2\ns3.",
        "title1": "T2",
        "sentence3": "s3.",  # the empty sentence2 made no node
        "paragraph2": "T3",
        "title2": "T3",
    }
    assert ("paragraph1", "sentence3") in {(e.src, e.dst) for e in graph.edges_of("contains")}
    assert ("doc", "paragraph0") in {(e.src, e.dst) for e in graph.edges_of("contains")}


def test_ids_attrs_links_and_relations():
    mapping = PEOPLE_MAPPING
    record = {
        "people": [
            {"name": "ann", "age": 31, "bio": "Ann writes.", "knows": ["bob"]},
            {"name": "bob", "age": 40, "bio": "Bob reads.", "nick": "B", "knows": "ann"},
        ]
    }
    graph = json_graph(record, mapping)
    assert graph.node("ann").attrs == {"years": 31} and graph.span_text("bob") == "Bob reads.\nB"
    assert sorted((e.src, e.relation, e.dst) for e in graph.edges) == [
        ("ann", "described_by", "bio0"),
        ("ann", "knows", "bob"),
        ("bob", "contains", "nick0"),
        ("bob", "described_by", "bio1"),
        ("bob", "knows", "ann"),
    ]


@pytest.mark.parametrize(
    "record, message",
    [
        ({"_id": "r", "context": []}, r"^data.jsonl:4: missing key 'question'"),
        (
            {"_id": "r", "question": "q", "context": [["T", "not a list"]]},
            r"\$.context\[0\]\[1\]: expected a list, got str",
        ),
        (
            {"_id": "r", "question": {"text": "q"}, "context": []},
            r"\$.question: expected text .* give this key `fields:` or `each:`",
        ),
        ({"_id": "r", "question": "q", "context": [["T"]]}, r"\$.context\[0\]: missing item 1"),
    ],
)
def test_record_errors_name_line_and_path(record, message):
    with pytest.raises(IngestError, match=message):
        json_graph(Record(record, file="data.jsonl", line=4), HOTPOT_MAPPING)


def test_dangling_link_and_duplicate_id():
    mapping = {
        "fields": {"items": {"each": {"type": "item", "id": "id", "links": {"next": "next"}, "fields": {"t": {}}}}}
    }
    with pytest.raises(IngestError, match=r"\$.items\[0\].next: link to node id 'zz'"):
        json_graph({"items": [{"id": "a", "t": "x", "next": "zz"}]}, mapping)
    with pytest.raises(IngestError, match=r"\$.items\[1\]: node id 'a' is used twice"):
        json_graph({"items": [{"id": "a", "t": "x"}, {"id": "a", "t": "y"}]}, mapping)


def test_mapping_file_typos_are_caught(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("fields:\n  question: {tpye: question}\n")
    with pytest.raises(
        IngestError, match=r"\$.fields.question.tpye: unknown mapping key 'tpye' \(did you mean 'type'\?\)"
    ):
        load_mapping(path)
    path.write_text("id: _id\nfields:\n  question: {type: question}\n")
    assert load_mapping(path).fields[0][1].type == "question"


def test_read_json_with_a_mapping(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(RECORD) + "\n" + json.dumps({**RECORD, "_id": "r2"}) + "\n")
    graphs = list(read_json(path, functools.partial(json_graph, mapping=load_mapping(HOTPOT_MAPPING))))
    assert [g.doc_id for g in graphs] == ["r1", "r2"]


def test_mapping_files_are_read_within_bounds_and_errors_name_the_line(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("id: _id\nfields:\n  question: {tpye: question}\n")
    with pytest.raises(IngestError, match=r"m.yaml:3: \$.fields.question.tpye: unknown mapping key"):
        load_mapping(path)
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]" for p, c in zip("abcd", "bcde")]
    path.write_text("\n".join(bomb) + "\n")
    with pytest.raises(IngestError, match=r"m.yaml:\d+: .*more than 10000 values \(YAML aliases expanded\)"):
        load_mapping(path)
    path.write_text("fields: {question: {type: question}\n")
    with pytest.raises(IngestError, match=r"m.yaml:\d+: not valid YAML/JSON"):
        load_mapping(path)
    path.write_text("#" * (300 << 10))
    with pytest.raises(IngestError, match=r"m.yaml: mapping has 307200 bytes, over the 262144"):
        load_mapping(path)
    json_path = tmp_path / "m.json"
    json_path.write_text('{"fields": {"question": {"type": 3}}}')
    with pytest.raises(IngestError, match=r"m.json:1: \$.fields.question.type: expected a string, got int"):
        load_mapping(json_path)
