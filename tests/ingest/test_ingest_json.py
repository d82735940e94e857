"""JSON adapters (HotpotQA, WikiHop, NQ simplified), record files, and errors with locations."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ingest_samples import HOTPOT, NQ, WIKIHOP

from graphattn.errors import IngestError, LabelWarning
from graphattn.ingest.json import Record, hotpotqa_graph, iter_records, nq_graph, read_json, wikihop_graph

# HOTPOT names sentence 7 of a 3-sentence paragraph on purpose: the first test checks that warning,
# the others read the record for other reasons.
pytestmark = pytest.mark.filterwarnings("ignore::graphattn.errors.LabelWarning")


def texts(graph, type):
    return [graph.span_text(n.id) for n in graph.nodes_of_type(type)]


def test_hotpotqa_nodes_spans_and_supporting_facts():
    out_of_range = r"\$.supporting_facts\[2\]\[1\]: sentence index 7 is out of range: paragraph 'Ed Wood'"
    with pytest.warns(LabelWarning, match=out_of_range):
        graph = hotpotqa_graph(HOTPOT)
    assert graph.doc_id == "5a8b57f25542995d1e6f1371"
    assert texts(graph, "question") == ["Were Scott Derrickson and Ed Wood of the same nationality?"]
    assert texts(graph, "title") == ["Ed Wood", "Scott Derrickson"]
    assert texts(graph, "sentence") == [
        "Edward Davis Wood Jr. was an American filmmaker.",
        "He died in 1978.",
        "Scott Derrickson (born July 16, 1966) is an American director.",
        "He lives in Los Angeles.",
    ]
    assert texts(graph, "paragraph") == [
        "Ed Wood\nEdward Davis Wood Jr. was an American filmmaker. He died in 1978.",
        "Scott Derrickson\nScott Derrickson (born July 16, 1966) is an American director. He lives in Los Angeles.",
    ]
    supporting = {n.id for n in graph if n.attrs.get("supporting")}
    assert supporting == {"p0", "p0.title", "p0.s0", "p1", "p1.title", "p1.s0"}
    assert graph.node("q").attrs["unmatched_supporting_facts"] == [("Ed Wood", 7)]
    assert graph.node("q").attrs["answer"] == "yes" and graph.node("q").attrs["question_type"] == "comparison"
    assert "p0.s2" not in graph.nodes  # a whitespace-only sentence makes no node
    assert {(e.src, e.dst) for e in graph.edges_of("contains")} == {
        ("p0", "p0.title"),
        ("p0", "p0.s0"),
        ("p0", "p0.s1"),
        ("p1", "p1.title"),
        ("p1", "p1.s0"),
        ("p1", "p1.s1"),
    }


def test_wikihop_candidates_query_documents_sentences_mentions():
    graph = wikihop_graph(WIKIHOP)
    assert texts(graph, "candidate") == ["1996 summer olympics", "olympic games", "sport"]
    assert graph.node("c0").attrs["is_answer"] and not graph.node("c1").attrs["is_answer"]
    assert texts(graph, "query") == ["participant_of juan rossell"]
    assert [n.id for n in graph.nodes_of_type("document")] == ["d0", "d2"]  # the empty support is skipped
    assert texts(graph, "sentence") == [
        "The 1996 Summer Olympics were held in Atlanta.",
        "Juan Rossell competed there.",
        "The Olympic Games are a sport event.",
        "Sport is fun.",
    ]
    mentions = [(graph.span_text(m.id), m.attrs["candidate"]) for m in graph.nodes_of_type("mention")]
    assert mentions == [("1996 Summer Olympics", "c0"), ("Olympic Games", "c1"), ("sport", "c2"), ("Sport", "c2")]
    assert all(graph.node(m).span[0] >= graph.node("d0").span[0] for m in ("m0", "m1"))
    # ETC's long order: candidates, then the query, then the documents
    assert graph.node("c2").span[1] < graph.node("q").span[0] < graph.node("d0").span[0]


def test_nq_token_offsets_become_char_spans():
    graph = nq_graph(NQ)
    assert graph.text == "what is the sun\nSun The Sun is a star . Mass 2e30 kg hot"
    assert graph.doc_id == "797803103760793766"
    cands = {
        n.id: (graph.span_text(n.id), n.attrs["kind"], n.attrs["top_level"], n.attrs["is_long_answer"])
        for n in graph.nodes_of_type("candidate")
    }
    assert cands == {
        "c0": ("The Sun is a star .", "paragraph", True, True),
        "c1": ("Mass 2e30 kg", "table", True, False),
        "c2": ("Mass 2e30 kg", "other", False, False),
        "c3": ("hot", "list", True, False),
    }
    short = graph.node("q").attrs["short_answers"]
    assert [graph.text[s:e] for s, e in short] == ["star"]
    assert {(e.src, e.dst) for e in graph.edges_of("contains")} == {
        ("doc", "c0"),
        ("doc", "c1"),
        ("c1", "c2"),
        ("doc", "c3"),
    }


def test_nq_can_keep_html_tokens():
    graph = nq_graph(NQ, keep_html_tokens=True)
    assert graph.span_text("doc") == NQ["document_text"]
    assert graph.span_text("c0") == "<P> The Sun is a star . </P>"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(["<P>", "</P>", "<Td>", "<Ul>"]), st.text(alphabet="abc<>é", min_size=1, max_size=4)),
        min_size=1,
        max_size=30,
    ),
    st.data(),
    st.booleans(),
)
def test_nq_spans_match_a_token_by_token_reference(tokens, data, keep):
    n = len(tokens)
    bounds = data.draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(1, n)).filter(lambda b: b[0] < b[1]), min_size=1, max_size=6
        )
    )
    record = {
        "question_text": "q",
        "document_text": " ".join(tokens),
        "long_answer_candidates": [{"start_token": s, "end_token": e, "top_level": True} for s, e in bounds],
    }
    graph = nq_graph(record, keep_html_tokens=keep)

    def kept(token):  # the definition, one token at a time
        return keep or not (len(token) >= 2 and token[0] == "<" and token[-1] == ">")

    assert graph.span_text("doc") == " ".join(t for t in tokens if kept(t))
    for i, (s, e) in enumerate(bounds):
        expected = " ".join(t for t in tokens[s:e] if kept(t))
        if expected:
            assert graph.span_text(f"c{i}") == expected
        else:
            assert f"c{i}" not in graph.nodes


@pytest.mark.parametrize("layout", ["array", "jsonl", "jsonl.gz", "single"])
def test_record_files(tmp_path, layout):
    records = [HOTPOT, {**HOTPOT, "_id": "second"}]
    if layout == "array":
        path = tmp_path / "data.json"
        path.write_text(json.dumps(records, indent=2))
    elif layout == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    elif layout == "jsonl.gz":
        path = tmp_path / "data.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.write("\n".join(json.dumps(r) for r in records))
    else:
        path = tmp_path / "one.json"
        path.write_text(json.dumps(HOTPOT, indent=1))
        records = [HOTPOT]
    graphs = list(read_json(path, "hotpotqa"))
    assert [g.doc_id for g in graphs] == [r["_id"] for r in records]
    assert all(g.source == str(path) for g in graphs)


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(WIKIHOP) + "\n" + '{"id": "x", "query": \n')
    graphs = read_json(path, "wikihop")
    next(graphs)
    with pytest.raises(IngestError, match="not valid JSON") as err:
        next(graphs)
    assert (err.value.location.file, err.value.location.line) == (str(path), 2)


def test_missing_key_in_jsonl_names_line_and_key(tmp_path):
    path = tmp_path / "missing.jsonl"
    broken = {k: v for k, v in WIKIHOP.items() if k != "candidates"}
    path.write_text(json.dumps(WIKIHOP) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(IngestError, match="missing key 'candidates'") as err:
        list(read_json(path, "wikihop"))
    assert str(err.value) == f"{path}:2: missing key 'candidates'"


def test_wrong_type_in_array_names_record_index_and_path(tmp_path):
    path = tmp_path / "wrong.json"
    broken = json.loads(json.dumps(HOTPOT))
    broken["context"][1][1][0] = 42
    path.write_text(json.dumps([HOTPOT, HOTPOT, broken]))
    with pytest.raises(IngestError) as err:
        list(read_json(path, "hotpotqa"))
    assert str(err.value) == f"{path}: $[2].context[1][1][0]: expected a string, got an integer 42"


@pytest.mark.parametrize(
    "adapter, record, message",
    [
        (
            nq_graph,
            {**NQ, "long_answer_candidates": [{"start_token": 5, "end_token": 99}]},
            r"\$.long_answer_candidates\[0\]: token range \[5, 99\)",
        ),
        (nq_graph, {**NQ, "document_text": None}, r"\$.document_text: expected a string, got null"),
        (wikihop_graph, {**WIKIHOP, "supports": "one string"}, r"\$.supports: expected a list, got a string"),
        (
            hotpotqa_graph,
            {**HOTPOT, "supporting_facts": [["Ed Wood", "0"]]},
            r"\$.supporting_facts\[0\]\[1\]: expected an integer",
        ),
        (hotpotqa_graph, ["not", "an", "object"], r"^in.json: expected an object, got a list"),
    ],
)
def test_bad_records(adapter, record, message):
    with pytest.raises(IngestError, match=message):
        adapter(Record(record, file="in.json"))


def test_empty_and_unknown(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(IngestError, match="empty file"):
        list(iter_records(empty))
    with pytest.raises(IngestError, match="unknown JSON format 'squad'"):
        list(read_json(empty, "squad"))


def test_ten_megabyte_single_line_nq_record(tmp_path):
    words = np.array(["alpha", "beta", "gamma", "delta", "<P>", "</P>"])
    tokens = words[np.arange(1_800_000) % 6]
    record = {
        "example_id": 1,
        "question_text": "which greek letter",
        "document_text": " ".join(tokens.tolist()),
        "long_answer_candidates": [
            {"start_token": i, "end_token": i + 6, "top_level": True} for i in range(4, 60_000, 6)
        ],
    }
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert path.stat().st_size > 10_000_000
    (graph,) = read_json(path, "nq")
    assert len(graph.nodes_of_type("candidate")) == 10_000
    assert graph.span_text("c0") == "alpha beta gamma delta"


def test_yielded_errors_keep_reading_with_line_numbers_and_byte_offsets(tmp_path):
    from graphattn.ingest.records import scan_json_lines

    lines = [b'{"a": 1}\n', b"\n", b'{"a": \n', b'{"a": 3}\r\n', b'"caf\xe9"\n', b'{"a": 5}']
    offsets = [sum(map(len, lines[:i])) for i in range(len(lines))]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(lines))
    refs = list(iter_records(path, errors="yield"))
    assert [(r.index, r.line, r.offset, r.data) for r in refs] == [
        (0, 1, 0, {"a": 1}),
        (1, 3, offsets[2], None),
        (2, 4, offsets[3], {"a": 3}),
        (3, 5, offsets[4], None),
        (4, 6, offsets[5], {"a": 5}),
    ]
    assert str(refs[1].error) == f"{path}:3: not valid JSON: Expecting value (column 7)"
    assert str(refs[3].error) == f"{path}:5: line is not UTF-8 (invalid continuation byte at byte {offsets[4] + 4})"
    assert all(r.error is None for r in refs if r.data is not None)
    with pytest.raises(IngestError, match="mixed.jsonl:3: not valid JSON"):
        list(iter_records(path))
    # a byte range of the file, as a corpus worker reads it: lines starting in [start, stop)
    part = list(scan_json_lines(path, start=offsets[2], stop=offsets[5], first_line=3))
    assert [(x.line, x.offset, x.raw) for x in part] == [
        (3, offsets[2], lines[2]),
        (4, offsets[3], lines[3]),
        (5, offsets[4], lines[4]),
    ]
    gz = tmp_path / "mixed.jsonl.gz"
    gz.write_bytes(gzip.compress(b"".join(lines)))
    assert [(r.line, r.offset, r.data) for r in iter_records(gz, errors="yield")] == [
        (r.line, r.offset, r.data) for r in refs
    ]


def test_single_object_and_array_files_have_no_lines(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"a": 1}, indent=1))
    (ref,) = iter_records(path, errors="yield")
    assert (ref.data, ref.line, ref.index, ref.base_path) == ({"a": 1}, None, -1, ())
    path.write_text('[{"a": 1},\n {"a": 2}]')
    assert [(r.index, r.base_path) for r in iter_records(path)] == [(0, (0,)), (1, (1,))]
    path.write_text('[{"a": 1},\n {"a": }]')
    with pytest.raises(IngestError, match=r"one.json:2: not valid JSON: Expecting value \(column 8\)"):
        list(iter_records(path, errors="yield"))  # a broken array is one error for the whole file
