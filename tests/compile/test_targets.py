"""Task targets: the pure lowering functions by hand, then per task a hand-written record compiled
with the shipped schema (made small) and every target array spelled out, truncation and windows
included. Token positions are those of the tokenizer the project ships (listed in comments)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from graphattn.compile import compile_instance, compile_windows
from graphattn.compile.targets import choice_labels, class_ids, global_labels, span_rows, span_target
from graphattn.errors import CompileError, LabelWarning, SchemaError
from graphattn.ingest.json import hotpotqa_graph, nq_graph, wikihop_graph
from graphattn.ingest.openkp import openkp_graph
from graphattn.schema import SCHEMA_DIR, load_schema
from graphattn.tokenize import load_tokenizer

TOKENIZER = str(Path(__file__).resolve().parents[2] / "examples" / "data" / "tokenizer.json")
I = -100  # noqa: E741 - TARGET_IGNORE, one letter so that expected arrays read as arrays


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


def shipped(name: str, **changes) -> dict:
    data = yaml.safe_load((SCHEMA_DIR / f"{name}.yaml").read_text())
    truncation = changes.pop("truncation", {})
    data.update(changes)
    data.setdefault("truncation", {}).update(truncation)
    return data


def arrays(instance) -> dict:
    return {name: value.tolist() for name, value in instance.targets.items()}


# -- the pure functions ---------------------------------------------------------------------------
def test_global_labels_by_hand():
    # globals: [CLS] (no node), node 2, node 0, node 1; node classes: 1, IGNORE, 0
    assert global_labels(np.array([-1, 2, 0, 1]), np.array([1, I, 0])).tolist() == [I, 0, 1, I]


def test_class_ids_by_hand():
    # bools match bools only (the int 1 is not the class True); None is no label, or the default
    ids, bad = class_ids([True, None, False, True], (False, True))
    assert ids.tolist() == [1, I, 0, 1] and bad == -1
    ids, bad = class_ids([True, None, False], (False, True), default=False)
    assert ids.tolist() == [1, 0, 0] and bad == -1
    ids, bad = class_ids([1, 1.0, True, 2], (1, 2))  # 1.0 == 1; True is no number here
    assert ids.tolist() == [0, 0, I, 1] and bad == 2
    ids, bad = class_ids(["no", "maybe", "yes"], ("no", "yes"))  # the first value without a class
    assert ids.tolist() == [0, I, 1] and bad == 1
    ids, bad = class_ids([], ("no", "yes"))
    assert ids.tolist() == [] and bad == -1


def test_choice_labels_by_hand():
    nodes = np.array([-1, 0, 1, 2, 3])  # global 0 is [CLS]; nodes 0-2 are candidates, node 3 is not
    candidate = np.array([True, True, True, False])
    assert choice_labels(nodes, candidate, np.array([False, True, False, False]), 0).tolist() == [0, 0, 1, 0, I]
    assert choice_labels(nodes, candidate, np.zeros(4, bool), 0).tolist() == [1, 0, 0, 0, I]  # none chosen here: [CLS]
    assert choice_labels(nodes, candidate, np.array([False, True, False, False]), None).tolist() == [I, 0, 1, 0, I]
    assert choice_labels(nodes, candidate, np.zeros(4, bool), None).tolist() == [I, I, I, I, I]  # nothing to learn
    assert choice_labels(np.array([-1, 0, 0]), candidate, np.array([True, False, False, False]), None).tolist() == [
        I,
        1,
        1,
    ]


def test_span_target_by_hand():
    first, last = np.array([4, -1, 9, -1]), np.array([6, -1, 9, -1])
    complete, text = np.array([True, False, True, False]), np.array([True, True, True, False])
    assert span_target(first, last, complete, np.array([0, 2]), np.array([3, 1]), text) == (4, 6, 3)
    assert span_target(first, last, complete, np.array([1, 2]), np.array([3, 1]), text) == (
        9,
        9,
        1,
    )  # first complete one
    assert span_target(first, last, complete, np.array([1]), np.array([3]), text) == (0, 0, 0)  # cut: null
    assert span_target(first, last, complete, np.array([3]), np.array([2]), text) == (I, I, 2)  # yes / no: no span
    assert span_target(first, last, complete, np.array([3]), np.array([0]), text) == (0, 0, 0)  # a null answer
    assert span_target(first, last, complete, np.array([], np.int64), np.array([], np.int32), text) == (I, I, I)


def test_span_rows_by_hand():
    first, last = np.array([1, 5, -1, 8]), np.array([2, 5, -1, 9])
    complete = np.array([True, True, False, True])
    rows, extra = span_rows(first, last, complete, np.array([0, 1, 2, 3]), 2)
    assert rows.tolist() == [[1, 2], [5, 5]] and extra == 1
    rows, extra = span_rows(first, last, complete, np.array([2, 3]), 3)
    assert rows.tolist() == [[8, 9], [I, I], [I, I]] and extra == 0


# -- HotpotQA --------------------------------------------------------------------------------------
HOTPOT = {
    "_id": "h1",
    "question": "Who built the dam?",
    "answer": "Ann Lee",
    "supporting_facts": [["Dam", 0]],
    "context": [
        ["Dam", ["The dam was built by Ann Lee.", " It is tall."]],
        ["River", ["The river is long.", " Ann Lee swam in it."]],
    ],
}
# long: Who built the d am ? | D am | The d am was built by An n Le e . | It is tall . | River | The river ...
#        0   1     2   3 4  5   6 7   8   9 10 11  12    13 14 15 16 17 18  19 20 21  22  23      24 ...
# globals: [CLS], 6 question wordpieces, p0, p0.title, p0.s0, p0.s1, p1, p1.title, p1.s0, p1.s1


def test_hotpotqa_supporting_flags_and_answer_span(tok):
    instance = compile_instance(hotpotqa_graph(HOTPOT), shipped("hotpotqa"), tok)
    assert instance.global_node_ids[7:] == ["p0", "p0.title", "p0.s0", "p0.s1", "p1", "p1.title", "p1.s0", "p1.s1"]
    assert arrays(instance) == {
        "supporting": [I, I, I, I, I, I, I, I, I, 1, 0, I, I, 0, 0],
        "answer_start": 14,
        "answer_end": 17,
        "answer_type": 1,  # "An n Le e" in the supporting sentence; type "span"
    }
    assert instance.target_axes == {"supporting": "global", "answer_start": "", "answer_end": "", "answer_type": ""}
    assert instance.truncation.dropped_targets == []


def test_hotpotqa_truncation_cutting_the_answer_gives_the_null_answer_and_says_so(tok):
    instance = compile_instance(
        hotpotqa_graph(HOTPOT), shipped("hotpotqa", max_long_length=16), tok
    )  # keeps ... by An n
    assert instance.global_node_ids[7:] == ["p0", "p0.title", "p0.s0"]
    assert arrays(instance) == {
        "supporting": [I, I, I, I, I, I, I, I, I, 1],
        "answer_start": 0,
        "answer_end": 0,
        "answer_type": 0,
    }
    report = instance.truncation
    assert report.dropped_targets == ["answer"] and report.truncated
    assert "target answer: truncation cut the answer span; the target is the null answer 'null'" in report.messages


def test_hotpotqa_yes_no_answers_have_a_type_and_no_span(tok):
    record = {**HOTPOT, "answer": "yes"}
    instance = compile_instance(hotpotqa_graph(record), shipped("hotpotqa"), tok)
    assert (arrays(instance)["answer_start"], arrays(instance)["answer_end"], arrays(instance)["answer_type"]) == (
        I,
        I,
        2,
    )


def test_hotpotqa_answer_not_in_the_context_warns_and_leaves_no_label(tok):
    with pytest.warns(LabelWarning, match=r"\$.answer: answer 'Bob Ray' is not in any paragraph of the context"):
        graph = hotpotqa_graph({**HOTPOT, "answer": "Bob Ray"})
    targets = arrays(compile_instance(graph, shipped("hotpotqa"), tok))
    assert (targets["answer_start"], targets["answer_end"], targets["answer_type"]) == (I, I, I)


# -- WikiHop ---------------------------------------------------------------------------------------
WIKIHOP = {
    "id": "w1",
    "query": "located_in dam",
    "candidates": ["lake", "river"],
    "answer": "river",
    "supports": ["The dam is on the river."],
}


def test_wikihop_answer_among_the_candidate_globals(tok):
    instance = compile_instance(wikihop_graph(WIKIHOP), shipped("wikihop"), tok)
    assert instance.global_node_ids == ["c0", "c1", "q", "q", "q", "q", "q", "q", "q", "d0", "d0.s0"]
    assert arrays(instance) == {"answer": [0, 1, I, I, I, I, I, I, I, I, I]}


def test_wikihop_answer_that_is_no_candidate_warns_and_labels_nothing(tok):
    with pytest.warns(LabelWarning, match=r"\$.answer: answer 'sea' is not one of the 2 candidates"):
        graph = wikihop_graph({**WIKIHOP, "answer": "sea"})
    assert arrays(compile_instance(graph, shipped("wikihop"), tok)) == {"answer": [I] * 11}


# -- NQ ----------------------------------------------------------------------------------------------
NQ = {
    "example_id": 7,
    "question_text": "when did it open",
    "document_text": "<P> The dam opened in 1984 . </P> <P> It is on the river . </P>",
    "long_answer_candidates": [
        {"start_token": 0, "end_token": 8, "top_level": True},
        {"start_token": 8, "end_token": 16, "top_level": True},
    ],
    "annotations": [
        {
            "long_answer": {"start_token": 0, "end_token": 8, "candidate_index": 0},
            "short_answers": [{"start_token": 5, "end_token": 6}],
            "yes_no_answer": "NONE",
        }
    ],
}


def test_nq_windows_move_the_answer_and_a_window_without_it_gets_the_null_target(tok):
    schema = shipped("nq", max_long_length=16, local_radius=4, truncation={"stride": 4})
    windows = compile_windows(nq_graph(NQ), schema, tok)
    assert [i.global_node_ids for i in windows] == [["<cls>", "q", "q", "q", "q", "c0"]] + [
        ["<cls>", "q", "q", "q", "q", "c0", "c1"]
    ] * 2
    # window 1: [CLS] when did it open [SEP] The d am opened in 19 8 4 . [SEP]
    assert arrays(windows[0]) == {
        "long_answer": [0, I, I, I, I, 1],
        "answer_start": 11,
        "answer_end": 13,
        "answer_type": 3,
    }
    # window 2: [CLS] when did it open [SEP] in 19 8 4 . It is on the [SEP]: the short answer moves to 7-9; the
    # long answer started in window 1, so here it is the [CLS] global
    assert arrays(windows[1]) == {
        "long_answer": [1, I, I, I, I, 0, 0],
        "answer_start": 7,
        "answer_end": 9,
        "answer_type": 3,
    }
    # window 3: [CLS] when did it open [SEP] . It is on the river . [SEP]: no answer here
    assert arrays(windows[2]) == {
        "long_answer": [1, I, I, I, I, 0, 0],
        "answer_start": 0,
        "answer_end": 0,
        "answer_type": 0,
    }
    assert all(w.truncation.dropped_targets == [] for w in windows)  # another window holds it: nothing was lost


def test_nq_without_an_answer_trains_the_null_target(tok):
    record = {
        **NQ,
        "annotations": [
            {
                "long_answer": {"start_token": -1, "end_token": -1, "candidate_index": -1},
                "short_answers": [],
                "yes_no_answer": "NONE",
            }
        ],
    }
    (instance,) = compile_windows(nq_graph(record), shipped("nq"), tok)
    assert arrays(instance) == {
        "long_answer": [1, I, I, I, I, 0, 0],
        "answer_start": 0,
        "answer_end": 0,
        "answer_type": 0,
    }


def test_nq_yes_no_takes_the_long_answer_span(tok):
    record = {**NQ, "annotations": [{**NQ["annotations"][0], "short_answers": [], "yes_no_answer": "YES"}]}
    (instance,) = compile_windows(nq_graph(record), shipped("nq"), tok)
    # [CLS] when did it open [SEP] The d am opened in 19 8 4 . ...: candidate c0 covers 6-14
    assert arrays(instance) == {
        "long_answer": [0, I, I, I, I, 1, 0],
        "answer_start": 6,
        "answer_end": 14,
        "answer_type": 1,
    }


def test_nq_labels_that_match_nothing_warn(tok):
    record = {
        **NQ,
        "annotations": [
            {
                "long_answer": {"start_token": 0, "end_token": 8, "candidate_index": 5},
                "short_answers": [{"start_token": 5, "end_token": 40}, {"start_token": 0, "end_token": 1}],
            }
        ],
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nq_graph(record)
    assert [str(w.message) for w in caught] == [
        "$.annotations[0].long_answer.candidate_index: long answer candidate 5 is not among the 2 long-answer "
        "candidates",
        "$.annotations[0].short_answers[0]: short answer tokens [5, 40) are empty or outside the document's 16 tokens",
        "$.annotations[0].short_answers[1]: short answer covers no text (only HTML tag tokens)",
    ]


# -- OpenKP ------------------------------------------------------------------------------------------
FEATURES = [0, 100, 0, 20, 1, 0, 1, 1, 24, 1] + [0, 100, 0, 40, 1, 0, 0, 0, 16, 0]
OPENKP = {
    "url": "http://example.org/storm",
    "text": "Storm surge barriers close when a storm surge comes",
    "VDOM": [
        {"Id": 0, "text": "Storm surge barriers", "feature": FEATURES, "start_idx": 0, "end_idx": 3},
        {"Id": 0, "text": "close when a storm surge comes", "feature": FEATURES, "start_idx": 3, "end_idx": 9},
    ],
    "KeyPhrases": [["Storm", "Surge"], ["barriers"]],
}
# long: Storm sur ge bar ri ers clo se when a storm sur ge comes
#        0     1   2  3   4  5   6   7  8    9  10   11  12 13


def test_openkp_keyphrase_occurrences_as_spans(tok):
    instance = compile_instance(
        openkp_graph(OPENKP),
        shipped("openkp-dom", targets={"keyphrases": {"kind": "spans", "node_types": "keyphrase", "max_spans": 4}}),
        tok,
    )
    assert instance.global_node_ids == ["t0", "t1"]
    assert arrays(instance) == {"keyphrases": [[0, 2], [3, 5], [10, 12], [I, I]]}  # in document order: k0.0, k1.0, k0.1


def test_openkp_truncation_cuts_an_occurrence_and_counts_it(tok):
    schema = shipped(
        "openkp-dom",
        max_long_length=12,
        targets={"keyphrases": {"kind": "spans", "node_types": "keyphrase", "max_spans": 2}},
    )
    instance = compile_instance(openkp_graph(OPENKP), schema, tok)
    assert arrays(instance) == {"keyphrases": [[0, 2], [3, 5]]}  # "storm sur | ge" lost its last token
    assert instance.truncation.dropped_targets == ["keyphrases"]


def test_openkp_keyphrase_not_in_the_text_warns():
    with pytest.warns(LabelWarning, match=r"\$.KeyPhrases\[1\]: keyphrase 'tide gates' is not in the text"):
        graph = openkp_graph({**OPENKP, "KeyPhrases": [["storm", "surge"], ["tide", "gates"]]})
    assert [n.attrs["phrase"] for n in graph.nodes_of_type("keyphrase")] == ["storm surge", "storm surge"]


# -- schema errors and values the schema does not know -----------------------------------------------
@pytest.mark.parametrize(
    "targets, message",
    [
        (
            {"x": {"kind": "span", "node_types": "sentence", "type_attr": "t"}},
            r"targets.x: a span target needs `types`",
        ),
        (
            {"x": {"kind": "choice", "node_types": "sentence", "attr": "a", "null_global": "sep"}},
            r"targets.x.null_global: null_global names the global_prefix",
        ),
        (
            {"x": {"kind": "choice", "node_types": "answer", "attr": "a"}},
            r"targets.x.node_types: choice labels globals, but node type 'answer'",
        ),
        (
            {"x": {"kind": "global_labels", "node_types": "sentense", "attr": "a"}},
            r"unknown node type 'sentense' \(did you mean 'sentence'\?\)",
        ),
        (
            {"x": {"kind": "spans", "node_types": "answer", "max_spans": 2, "attr": "a"}},
            r"targets.x.attr: `attr` applies to kind",
        ),
        (
            {"x": {"kind": "spans", "node_types": "answer", "max_spans": 2, "metric": "squad"}},
            r"metric 'squad' does not score a spans",
        ),
        ({"x": {"kind": "spans", "node_types": "answer", "max_spans": 99999}}, r"targets.x.max_spans"),
        (
            {
                "x_start": {"kind": "global_labels", "node_types": "sentence", "attr": "a"},
                "x": {"kind": "span", "node_types": "answer", "type_attr": "t", "types": ["null"]},
            },
            r"makes an array 'x_start', which target 'x_start' makes too",
        ),
    ],
)
def test_target_mistakes_are_schema_errors_at_their_line(targets, message):
    with pytest.raises(SchemaError, match=message):
        load_schema(shipped("hotpotqa", targets=targets))


def test_target_errors_in_a_file_name_the_line(tmp_path):
    text = (SCHEMA_DIR / "wikihop.yaml").read_text().replace("attr: is_answer", "attr: is_answer\n    null_global: cls")
    path = tmp_path / "wikihop.yaml"
    path.write_text(text)
    line = text.splitlines().index("    null_global: cls") + 1
    with pytest.raises(
        SchemaError,
        match=rf"wikihop.yaml:{line}: \$.targets.answer.null_global: null_global names the global_prefix token",
    ):
        load_schema(path)


def test_a_class_the_schema_does_not_declare_names_the_node(tok):
    graph = hotpotqa_graph(HOTPOT)
    graph.node("p0.s1").attrs["supporting"] = "maybe"
    with pytest.raises(
        CompileError, match=r"node 'p0.s1': target 'supporting': supporting = 'maybe' is not one of \[False, True\]"
    ):
        compile_instance(graph, shipped("hotpotqa"), tok)
