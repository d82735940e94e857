"""The dataset schemas reproduce ETC's layouts on graphs from the ingesters (docs/DESIGN.md §6).

Word-level tokens (spaCy) keep the expected arrays small enough to spell out by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from ingest_samples import NQ, PAGE

from graphattn.compile import compile_instance, compile_windows
from graphattn.ingest.html import parse_html, read_html
from graphattn.ingest.json import hotpotqa_graph, nq_graph, wikihop_graph
from graphattn.ingest.text import text_to_graph
from graphattn.schema import load_schema
from graphattn.tokenize import SpacyWordTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
TOKENIZER = ROOT / "examples" / "data" / "tokenizer.json"  # the WordPiece tokenizer the project ships
K = 12  # relative_pos_max_distance of every dataset schema
DOES_NOT_BELONG, BELONGS, FIRST_SCHEMA_LABEL = 2 * K + 1, 2 * K + 2, 2 * K + 3


@pytest.fixture
def words():
    """Word tokens; ids 1..5 exist (ETC's [unused] global-token ids) before any word is seen."""
    return SpacyWordTokenizer([f"[unused{i}]" for i in range(5)], grow=True)


def schema(name: str, **overrides):
    data = yaml.safe_load((SCHEMAS / f"{name}.yaml").read_text(encoding="utf-8"))
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return load_schema(data) if overrides else load_schema(SCHEMAS / f"{name}.yaml")


def long_texts(instance):
    return [instance.long_token_text(i) for i in range(instance.long_length)]


@pytest.mark.parametrize("name", ["hotpotqa", "wikihop", "nq", "openkp-dom", "etc-sentences", "fixed-blocks"])
def test_shipped_schemas_load(name):
    loaded = load_schema(SCHEMAS / f"{name}.yaml")
    assert loaded.name == name and loaded.max_long_length == 4096


def test_hotpotqa_layout(words):
    graph = hotpotqa_graph({"question": "Who won?", "context": [["A", ["a b.", "c."]], ["B", ["d e."]]]})
    inst = compile_instance(graph, schema("hotpotqa"), words)
    assert long_texts(inst) == ["Who", "won", "?", "A", "a", "b.", "c.", "B", "d", "e."]
    assert inst.global_node_ids == [
        "<cls>",
        "q",
        "q",
        "q",
        "p0",
        "p0.title",
        "p0.s0",
        "p0.s1",
        "p1",
        "p1.title",
        "p1.s0",
    ]
    para, sent = words.token_to_id("[unused4]"), words.token_to_id("[unused0]")  # the schema names ETC's tokens
    expected = [words.cls_id, *inst.long_token_ids[:3].tolist(), para, sent, sent, sent, para, sent, sent]
    assert inst.global_token_ids.tolist() == expected
    assert inst.global_type_ids.tolist() == [0, 5, 5, 5, 7, 0, 0, 0, 7, 0, 0]
    assert inst.long_type_ids.tolist() == [3, 3, 3, 2, 1, 1, 1, 2, 1, 1]
    owners = {level: o.tolist() for level, o in inst.long_owners.items()}
    assert owners == {
        "question": [1, 2, 3, -1, -1, -1, -1, -1, -1, -1],  # one question global per wordpiece
        "paragraph": [-1, -1, -1, 4, 4, 4, 4, 8, 8, 8],
        "title": [-1, -1, -1, 5, -1, -1, -1, 9, -1, -1],
        "sentence": [-1, -1, -1, -1, 6, 6, 7, -1, 10, 10],
    }
    side = inst.side
    # hard g2l: a sentence/title/paragraph global reads its own tokens only; the question's
    # exemption is per row (etcmodel's ignore_hard_g2l_mask): its globals read everything
    assert side.g2l_att_mask[6].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert side.g2l_att_mask[8].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert side.g2l_att_mask[1].tolist() == [1] * 10
    assert side.g2l_att_mask[0].tolist() == [1] * 10  # so does the [CLS] global (a prefix row is exempt)
    assert side.l2g_att_mask.all()  # no hard l2g in this schema
    # l2l never crosses the question/paragraph boundaries (column r is the token itself)
    r = side.local_radius
    assert side.l2l_att_mask[2, r - 2 : r + 3].tolist() == [1, 1, 1, 0, 0]  # "?" sees the question only
    assert side.l2l_att_mask[6, r - 3 : r + 3].tolist() == [1, 1, 1, 1, 0, 0]  # "c." ends paragraph 0
    cross = inst.label_vocab.id("cross_paragraph")
    assert cross == FIRST_SCHEMA_LABEL
    assert side.g2g_relative_att_ids[4, 5:9].tolist() == [1, 2, 3, cross]  # distances inside p0, then p1
    assert side.g2g_relative_att_ids[1, 4] == cross and side.g2g_att_mask.all()
    assert (
        side.l2g_relative_att_ids[4].tolist()
        == [DOES_NOT_BELONG] * 4 + [BELONGS, DOES_NOT_BELONG, BELONGS] + [DOES_NOT_BELONG] * 4
    )


WIKIHOP_SMALL = {
    "id": "w",
    "query": "capital france",
    "candidates": ["paris", "rome"],
    "supports": ["Paris is big. Rome is old.", "I like paris."],
    "answer": "paris",
}


def test_wikihop_layout_and_mention_links(words):
    inst = compile_instance(wikihop_graph(WIKIHOP_SMALL), schema("wikihop"), words)
    assert long_texts(inst) == [
        "paris",
        "rome",
        "capital",
        "france",
        "Paris",
        "is",
        "big",
        ".",
        "Rome",
        "is",
        "old",
        ".",
        "I",
        "like",
        "paris",
        ".",
    ]
    assert inst.global_node_ids == ["c0", "c1", "q", "q", "d0", "d0.s0", "d0.s1", "d1", "d1.s0"]
    assert inst.global_type_ids.tolist() == [6, 6, 5, 5, 7, 0, 0, 7, 0]
    mention = inst.label_vocab.id("mention_of")
    ids = inst.side.l2g_relative_att_ids
    N, B, M = DOES_NOT_BELONG, BELONGS, mention
    assert ids[:, :2].tolist() == [
        [B, N],
        [N, B],
        [N, N],
        [N, N],
        [M, N],
        [N, N],
        [N, N],
        [N, N],
        [N, M],
        [N, N],
        [N, N],
        [N, N],
        [N, N],
        [N, N],
        [M, N],
        [N, N],
    ]
    # ...and the candidate global reads its mentions under hard g2l (it also ignores hard masks)
    assert inst.side.g2l_relative_att_ids[0, [0, 4, 14]].tolist() == [B, M, M]
    g2g = inst.side.g2g_att_mask
    assert g2g[5, 6] == 1 and g2g[5, 8] == 0 and g2g[8, 6] == 0  # sentences of different documents: blocked
    assert g2g[4, 7] == 1 and g2g[0, 8] == 1  # documents, candidates: not blocked
    r = inst.side.local_radius
    assert inst.side.l2l_att_mask[0, r : r + 2].tolist() == [1, 0]  # each candidate is its own l2l segment
    assert inst.side.l2l_att_mask[11, r : r + 2].tolist() == [1, 0]  # document 0 ends at token 11


def test_wikihop_truncation_drops_sentences_from_the_longest_document(words):
    inst = compile_instance(wikihop_graph(WIKIHOP_SMALL), schema("wikihop", max_long_length=12), words)
    assert inst.long_length == 12
    assert "d0.s1" in inst.truncation.dropped_nodes and "d1.s0" not in inst.truncation.dropped_nodes
    assert "d0.s1" not in inst.global_node_ids and long_texts(inst)[-4:] == ["I", "like", "paris", "."]


def test_nq_layout_windows_and_nested_candidates(words):
    (inst,) = compile_windows(nq_graph(NQ), schema("nq"), words)
    assert long_texts(inst) == [
        "",
        "what",
        "is",
        "the",
        "sun",
        "",
        "Sun",
        "The",
        "Sun",
        "is",
        "a",
        "star",
        ".",
        "Mass",
        "2e30",
        "kg",
        "hot",
        "",
    ]
    assert inst.long_token_ids[[0, 5, 17]].tolist() == [words.cls_id, words.sep_id, words.sep_id]
    assert inst.global_node_ids == ["<cls>", "q", "q", "q", "q", "c0", "c1", "c2", "c3"]
    # the table row c2 nests inside the table c1: its tokens belong to the innermost candidate
    assert inst.long_owners["candidate"].tolist() == [-1] * 7 + [5] * 6 + [7, 7, 7, 8, -1]
    windows = compile_windows(nq_graph(NQ), schema("nq", max_long_length=12, truncation={"stride": 4}), words)
    assert len(windows) == 3
    for window in windows:  # the question is pinned into every window
        assert long_texts(window)[:6] == ["", "what", "is", "the", "sun", ""] and window.long_length <= 12
    assert windows[0].global_node_ids[-1] == "c0" and windows[-1].global_node_ids[-2:] == ["c2", "c3"]


def test_openkp_globals_are_vdom_text_runs_with_feature_arrays(words):
    graph = parse_html(PAGE)
    inst = compile_instance(graph, schema("openkp-dom"), words)
    texts = graph.nodes_of_type("text")
    assert inst.global_node_ids == [t.id for t in texts]
    for name in ("font_size_bucket", "is_bold", "is_leaf", "parent_is_heading", "text_share"):
        expected = np.array([float(t.attrs[name]) for t in texts])
        np.testing.assert_allclose(inst.features[f"global:{name}"], expected, rtol=1e-6)
        owner = inst.long_owners["text"]
        assert (owner >= 0).all()  # every long token is inside one text run
        np.testing.assert_allclose(inst.features[f"long:{name}"], expected[owner], rtol=1e-6)
    bold = inst.global_node_ids.index(next(t.id for t in texts if graph.span_text(t.id) == "bold"))
    assert inst.features["global:is_bold"][bold] == 1 and inst.features["global:font_size_bucket"][0] == 19  # the h1


def test_openkp_with_selected_elements_as_globals(words):
    data = yaml.safe_load((SCHEMAS / "openkp-dom.yaml").read_text())
    data["node_types"]["element"] = {"global": "node", "where": {"selected": True}}
    data["node_types"]["text"] = {"long": True}
    graph = parse_html(PAGE, selector="p, h1")
    inst = compile_instance(graph, load_schema(data), words)
    assert [graph.span_text(g) for g in inst.global_node_ids] == [
        "Main title",
        "Hello bold world & caf\u00e9.",
        "Second\nline",
    ]


def test_etc_sentences_one_global_per_sentence_hard_g2l(words):
    graph = text_to_graph("One two. Three four five!\n\nSix seven.")
    inst = compile_instance(graph, "etc-sentences", words)
    assert inst.global_node_ids == ["p0.s0", "p0.s1", "p1.s0"]
    assert inst.side.g2l_att_mask.tolist() == [
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
    ]


def test_fixed_blocks_on_plain_text(words):
    graph = text_to_graph(" ".join(f"w{i}" for i in range(60)))
    inst = compile_instance(graph, "fixed-blocks", words)
    assert inst.global_length == 3 and inst.global_node_types == ["block"] * 3
    assert inst.long_owners["block"].tolist() == (np.arange(60) // 27).tolist()


@pytest.mark.slow
def test_ten_megabyte_single_line_page_compiles_with_a_truncation_report(tmp_path):
    paragraph = "<p>" + "The quick brown fox jumps over the lazy dog near the river bank today. " * 10 + "</p>"
    path = tmp_path / "huge.html"
    path.write_text("<html><body>" + paragraph * (10_000_000 // len(paragraph)) + "</body></html>", encoding="utf-8")
    inst = compile_instance(read_html(path), schema("openkp-dom"), load_tokenizer(str(TOKENIZER)))
    report = inst.truncation
    assert inst.long_length == 4096 and report.truncated
    # Only the text that can be kept is tokenized (#16 item 3): the sizes before truncation count
    # the tokenized part, so they are lower bounds, and the message says where tokenizing stopped.
    assert 4096 < report.long_tokens_before < 100_000 and report.long_tokens_after == 4096
    assert len(report.dropped_nodes) > 20_000  # every node past the cut is reported, tokenized or not
    assert any("tail: kept the first" in m and "tokenizing stopped at character" in m for m in report.messages)
