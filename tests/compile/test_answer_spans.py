"""Answer labels found where they are: whole words first, a LabelWarning for what cannot be
found (and --strict rejects it), and no span target whose type has characters but no span.

The last is checked over generated HotpotQA records (hypothesis): answers that are whole words,
parts of longer words, other cases, yes / no, or absent, each compiled with the shipped schema;
whatever the record, a target of type "span" points at long tokens whose text is the answer.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphattn.cli import main
from graphattn.compile import compile_instance
from graphattn.compile.targets import span_target
from graphattn.errors import LabelWarning
from graphattn.graph import DocGraph
from graphattn.ingest.json import hotpotqa_graph
from graphattn.schema import load_schema
from graphattn.tokenize import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "examples" / "data" / "tokenizer.json")
I = -100  # noqa: E741 - TARGET_IGNORE
CLASS_RECORD = {
    "_id": "r1",
    "question": "Which word?",
    "answer": "class",
    "supporting_facts": [["Objects", 1]],
    "context": [
        ["Objects", ["Subclasses inherit from a base.", "A class has methods; each class has fields."]],
        ["Other", ["The class of 1990."]],
    ],
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


def _graph(record: dict) -> tuple[DocGraph, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LabelWarning)
        graph = hotpotqa_graph(record)
    return graph, [str(w.message) for w in caught if isinstance(w.message, LabelWarning)]


def test_a_whole_word_wins_over_an_earlier_part_of_a_word_and_says_which_occurrence(tok):
    graph, said = _graph(CLASS_RECORD)
    answer = graph.node("answer")
    assert said == []
    assert graph.span_text("answer") == "class"
    assert answer.span == (graph.text.index("A class") + 2, graph.text.index("A class") + 7)
    assert answer.attrs["found_in"] == "p0.s1" and answer.attrs["occurrences"] == 3  # two in p0.s1, one in p1.s0
    instance = compile_instance(graph, "hotpotqa", tok)
    start, end = int(instance.targets["answer_start"]), int(instance.targets["answer_end"])
    spans = instance.long_char_spans[start : end + 1]
    assert instance.texts[0][spans[0, 0] : spans[-1, 1]] == "class"
    assert int(instance.targets["answer_type"]) == 1


def test_a_supporting_sentence_comes_first_then_exact_case():
    record = {**CLASS_RECORD, "answer": "Class", "supporting_facts": [["Other", 0]]}
    graph, said = _graph(record)
    assert said == [] and graph.node("answer").attrs["found_in"] == "p1.s0"  # case folded, in the supporting one
    record["context"][1][1] = ["The Class of 1990."]
    graph, _ = _graph(record)
    assert graph.span_text("answer") == "Class"


def test_an_answer_only_inside_longer_words_is_a_label_warning():
    record = {**CLASS_RECORD, "answer": "lass"}
    graph, said = _graph(record)
    assert "answer" not in graph.nodes
    assert said == ["$.answer: answer 'lass' occurs in the context only inside longer words, never as a whole word"]
    _, said = _graph({**CLASS_RECORD, "answer": "zebra"})
    assert said == ["$.answer: answer 'zebra' is not in any paragraph of the context"]


def test_compile_writes_the_warning_and_strict_rejects_the_record(tmp_path, capsys):
    source = tmp_path / "records.json"
    source.write_text(json.dumps([CLASS_RECORD, {**CLASS_RECORD, "_id": "r2", "answer": "lass"}]))
    assert main(["compile", str(source), "--schema", "hotpotqa", "--out", str(tmp_path / "out"), "-q"]) == 0
    entries = [json.loads(line) for line in (tmp_path / "out" / "warnings.jsonl").read_text().splitlines()]
    assert [(e["doc_id"], e["label"], e["error"]) for e in entries] == [("r2", "answer", "LabelWarning")]
    assert "only inside longer words" in entries[0]["message"]
    argv = ["compile", str(source), "--schema", "hotpotqa", "--out", str(tmp_path / "strict"), "--strict"]
    assert main([*argv, "--max-rejected", "0.5", "-q"]) == 0
    rejected = [json.loads(line) for line in (tmp_path / "strict" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["doc_id"], r["error"]) for r in rejected] == [("r2", "LabelError")]
    capsys.readouterr()


def test_span_target_with_characters_but_no_token_is_ignored_everywhere():
    first, last = np.array([-1, -1]), np.array([-1, -1])
    complete, text = np.array([False, False]), np.array([False, False])
    chars = np.array([True, False])  # node 0: an answer with characters; node 1: yes / no, none
    assert span_target(first, last, complete, np.array([0]), np.array([1]), text, chars) == (I, I, I)
    assert span_target(first, last, complete, np.array([1]), np.array([2]), text, chars) == (I, I, 2)
    assert span_target(first, last, complete, np.array([0]), np.array([1]), text) == (I, I, 1)  # the old reading


def test_an_answer_that_holds_no_whole_token_is_a_label_warning_through_compile(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "tests" / "train"))
    import train_cases

    text = "red fox blue whale Subclasses inherit red fox ."
    graph = DocGraph(text, doc_id="d0")
    graph.add_node("doc", "document", (0, len(text)))
    graph.add_child("doc", "c0", "candidate", (0, 7), is_answer=True, text="red fox")
    graph.add_child("doc", "c1", "candidate", (8, 18), is_answer=False, text="blue whale")
    graph.add_child("doc", "s0", "sentence", (19, len(text)), supporting=True)
    graph.add_node("m0", "mention", (38, 45))
    graph.add_edge("m0", "mention_of", "c0")
    graph.add_node("a", "answer", (20, 21), answer_type="short")  # "u" inside "Subclasses": no token starts there
    instance = compile_instance(graph, train_cases.SCHEMA, train_cases.tokenizer())
    assert [int(instance.targets[f"span_{p}"]) for p in ("start", "end", "type")] == [I, I, I]
    (tmp_path / "doc.jsonl").write_text(json.dumps(graph.to_dict()) + "\n")
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(train_cases.SCHEMA, sort_keys=False))
    argv = ["compile", str(tmp_path / "doc.jsonl"), "--schema", str(tmp_path / "schema.yaml"), "--tokenizer", TOKENIZER]
    assert main([*argv, "--out", str(tmp_path / "out"), "-q"]) == 0
    (entry,) = [json.loads(line) for line in (tmp_path / "out" / "warnings.jsonl").read_text().splitlines()]
    assert entry["label"] == "span" and "hold no whole long token" in entry["message"]
    assert main([*argv, "--out", str(tmp_path / "strict"), "--strict", "-q"]) == 1  # nothing compiled
    (rejected,) = [json.loads(line) for line in (tmp_path / "strict" / "rejected.jsonl").read_text().splitlines()]
    assert rejected["error"] == "LabelError"
    capsys.readouterr()


# -- generated records: a span type always has its span --------------------------------------------
_WORDS = ["class", "Class", "subclasses", "classic", "base", "yes", "no", "1990", "1990s", "a", "(b)", "b"]
_SENTENCE = st.lists(st.sampled_from(_WORDS), min_size=1, max_size=6).map(lambda w: " ".join(w) + ".")
_ANSWERS = ["class", "CLASS", "lass", "1990", "yes", "no", "(b)", "a class", "zebra", "s", "classic base"]


@st.composite
def records(draw):
    titles = draw(st.lists(st.sampled_from(["Objects", "Class", "Years"]), min_size=1, max_size=3, unique=True))
    context = [[title, draw(st.lists(_SENTENCE, min_size=1, max_size=3))] for title in titles]
    facts = [[draw(st.sampled_from(titles)), draw(st.integers(0, 2))]]
    return {
        "_id": "g",
        "question": "Which?",
        "answer": draw(st.sampled_from(_ANSWERS)),
        "supporting_facts": facts,
        "context": context,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=records())
def test_no_span_type_without_its_span_over_generated_records(tok, record):
    schema = load_schema("hotpotqa")
    types = schema.targets["answer"].types
    graph, said = _graph(record)
    instance = compile_instance(graph, schema, tok)
    start, end, kind = (int(instance.targets[f"answer_{p}"]) for p in ("start", "end", "type"))
    if kind == types.index("span"):
        assert 0 <= start <= end < instance.long_length
        spans = instance.long_char_spans[start : end + 1]
        found = instance.texts[0][spans[0, 0] : spans[-1, 1]]
        assert found.lower() == record["answer"].lower(), (found, record["answer"])
    if start == I:
        assert end == I and (kind == I or types[kind] in ("yes", "no")), (start, end, kind)
    if kind == I:  # no label at all: only when the reader said the answer is not there
        about_answer = [line for line in said if line.startswith("$.answer:")]
        assert start == end == I and "answer" not in graph.nodes and len(about_answer) == 1, (said, record)
