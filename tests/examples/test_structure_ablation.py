"""Smoke test of examples/structure_ablation.py: the generated task is what its docstring says,
its graphs are the WikiHop adapter's, the two schemas differ exactly in the ablated structure,
and a tiny run of both settings goes end to end (seconds)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))  # appended: example module names must not shadow anything

import structure_ablation as ablation  # noqa: E402

from graphattn.compile import compile_instance  # noqa: E402
from graphattn.ingest.json import wikihop_graph  # noqa: E402


@pytest.fixture(scope="module")
def records():
    return ablation.generate_records(6, seed=5)


@pytest.fixture(scope="module")
def tok():
    return ablation.tokenizer()


def test_records_need_both_facts_and_nothing_else(records):
    for record in records:
        words = Counter(" ".join(record["supports"]).split())
        p1, p2 = record["query"].split()[1:]
        assert all(words[c] == 2 for c in record["candidates"])  # every candidate country twice
        assert words[p1] == 2 and words[p2] == 2  # each query person with the answer and one distractor
        with_person = {
            p: {c for s in record["supports"] if p in s.split() for c in record["candidates"] if c in s.split()}
            for p in (p1, p2)
        }
        assert with_person[p1] & with_person[p2] == {record["answer"]}
        assert len(with_person[p1] | with_person[p2]) == 3  # one fact alone leaves two candidates
        assert len(set(record["candidates"])) == ablation.CANDIDATES
    answer_slots = [r["candidates"].index(r["answer"]) for r in ablation.generate_records(200, seed=0)]
    assert len(set(answer_slots)) == ablation.CANDIDATES  # the answer is not always in one slot


def test_the_control_names_the_answer_in_the_query():
    for record in ablation.generate_records(5, seed=4, control=True):
        assert record["query"].split()[1:] == [record["answer"]]


def test_fillers_add_sentences(records):
    with_fillers = ablation.generate_records(20, seed=1, filler_probability=1.0)
    assert all(any(f in s for f in ablation.FILLERS) for r in with_fillers for s in r["supports"])
    graph = ablation.record_graph(with_fillers[0])
    assert len(graph.nodes_of_type("sentence")) == 2 * len(graph.nodes_of_type("document"))


def test_record_graph_matches_the_wikihop_adapter(records):
    for record in [*records, *ablation.generate_records(3, seed=2, filler_probability=0.5)]:
        assert ablation.record_graph(record).to_dict() == wikihop_graph(record).to_dict()


def test_schemas_differ_in_the_ablated_structure_only(records, tok):
    graph = ablation.record_graph(records[0])
    structured = compile_instance(graph, ablation.structured_schema(4), tok)
    flat = compile_instance(graph, ablation.flat_schema(4), tok)
    assert structured.long_token_ids.tolist() == flat.long_token_ids.tolist()  # same text, same order
    types = Counter(structured.global_node_types)
    assert Counter(flat.global_node_types) == Counter({t: n for t, n in types.items() if t != "document"})
    assert "mention_of" in structured.label_vocab and "mention_of" not in flat.label_vocab
    mention = structured.label_vocab.id("mention_of")
    assert (
        structured.side.l2g_relative_att_ids == mention
    ).sum() == 2 * ablation.CANDIDATES  # two mentions per candidate
    # l2l: the last token of document 0 sees the first of document 1 in flat, not in structured
    doc = structured.long_owners["document"]
    last = int(np.flatnonzero(doc == doc[doc >= 0].min())[-1])
    radius = 4
    assert structured.side.l2l_att_mask[last, radius + 1] == 0 and flat.side.l2l_att_mask[last, radius + 1] == 1
    # hard g2l in both: a sentence global sees only its own tokens, a candidate global its own
    # word and, in structured only, its two linked mentions
    for inst in (structured, flat):
        sentence = inst.global_node_types.index("sentence")
        owned = inst.long_owners["sentence"] == sentence
        assert inst.side.g2l_att_mask[sentence].astype(bool).tolist() == owned.tolist()
    assert structured.side.g2l_att_mask[0].sum() == 3 and flat.side.g2l_att_mask[0].sum() == 1
    exempt = compile_instance(graph, ablation.flat_schema(4, candidates_exempt=True), tok)
    assert exempt.side.g2l_att_mask[0].sum() == exempt.long_length


def test_a_tiny_run_of_both_settings(capsys):
    settings = ablation.Settings(
        train=16,
        test=8,
        steps=2,
        batch=4,
        hidden=16,
        layers=1,
        radius=4,
        lr=1e-3,
        init_std=0.1,
        fillers=0.3,
        candidates_exempt=False,
        data_seed=0,
        control_steps=1,
    )
    results = [r for setting in ablation.SCHEMAS for r in ablation.run_setting(setting, [0, 1], settings)]
    assert [(r["task"], r["setting"], r["seed"]) for r in results] == [
        ("two-fact", "structured", 0),
        ("two-fact", "structured", 1),
        ("control", "structured", 0),
        ("control", "structured", 1),
        ("two-fact", "flat", 0),
        ("two-fact", "flat", 1),
        ("control", "flat", 0),
        ("control", "flat", 1),
    ]
    assert all(0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["train_loss"]) for r in results)
    table = ablation.summarize(results)
    assert table.splitlines()[0].startswith("| task | schema | seeds | held-out accuracy % (mean)")
    assert len(table.splitlines()) == 6
    assert "spread" in ablation.verdict(results)


def test_summary_and_verdict_by_hand():
    rows = (
        [
            {"task": "two-fact", "setting": "structured", "accuracy": a, "train_accuracy": 0.7}
            for a in (0.60, 0.64, 0.62)
        ]
        + [{"task": "two-fact", "setting": "flat", "accuracy": a, "train_accuracy": 0.5} for a in (0.40, 0.44, 0.42)]
        + [{"task": "control", "setting": "flat", "accuracy": 1.0, "train_accuracy": 1.0}]
    )
    table = ablation.summarize(rows).splitlines()
    rows[0]["plateau_exit_step"] = 1200
    assert table[2] == "| two-fact | structured | 3 | 62.0 | 2.0 | 60.0 - 64.0 | 60.0, 64.0, 62.0 | 70.0 | -, -, - |"
    assert ablation.summarize(rows).splitlines()[2].endswith("| 1200, -, - |")
    assert table[3] == "| two-fact | flat | 3 | 42.0 | 2.0 | 40.0 - 44.0 | 40.0, 44.0, 42.0 | 50.0 | -, -, - |"
    assert table[4] == "| control | flat | 1 | 100.0 | 0.0 | 100.0 - 100.0 | 100.0 | 100.0 | - |"
    assert ablation.verdict(rows).startswith("structured beats flat by 20.0 points")
    close = [dict(r, accuracy=r["accuracy"] + (0.19 if r["setting"] == "flat" else 0)) for r in rows]
    assert ablation.verdict(close).startswith("structured does NOT beat flat")
