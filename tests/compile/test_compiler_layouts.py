"""Whole expected tensors for the layout features: prefixes and [SEP]s, per-token globals,
links with their own labels, hard-mask exceptions, g2g labels and blocking, packing, fixed
blocks, type ids, features and `where` filters."""

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc

from graphattn import collate, compile_instance, load_schema
from graphattn.compile.side_inputs import fixed_block_side_inputs
from graphattn.graph import DocGraph


@pytest.fixture
def tok():
    return WordTokenizer()


def assert_side(side, **expected):
    for name, value in expected.items():
        np.testing.assert_array_equal(getattr(side, name), np.asarray(value, dtype=np.int32), err_msg=name)


def window_mask(L: int, r: int) -> np.ndarray:
    """l2l mask of one unsegmented document: key inside [0, L)."""
    return np.array([[int(0 <= i + c - r < L) for c in range(2 * r + 1)] for i in range(L)])


def distance_ids(G: int, k: int) -> np.ndarray:
    d = np.arange(G)[None, :] - np.arange(G)[:, None]
    return np.where(d > 0, np.minimum(d, k), np.where(d < 0, k + np.minimum(-d, k), 0))


def nq_graph() -> DocGraph:
    """Question "q0 q1", a document of two answer candidates, one entity mentioned in c1."""
    text = "q0 q1 a0 a1 a2 b0 b1"
    g = DocGraph(text, doc_id="nq")
    g.add_node("q", "question", (0, 5))
    g.add_node("doc", "document", (6, len(text)))
    g.add_child("doc", "c0", "candidate", (6, 14))
    g.add_child("doc", "c1", "candidate", (15, 20))
    g.add_node("ent", "entity")
    g.add_edge("c1", "mentions", "ent")
    return g


def nq_schema(**overrides):
    settings = dict(
        local_radius=2,
        long_prefix=["cls"],
        global_prefix=["cls"],
        node_types={
            "question": {
                "global": "per_token",
                "long": True,
                "sep_after": True,
                "ignore_hard_masks": True,
                "type_id": 0,
            },
            "document": {"long": True, "sep_after": True, "type_id": 1},
            "candidate": {"global": "node", "global_token": "[unused1]"},
            "entity": {"global": "node", "ignore_hard_masks": True},
        },
        relations={"contains": {"hierarchy": True}, "mentions": {"link": "l2g", "label": "mention"}},
        masks={"hard_g2l": True},
        global_order=["question", "candidate", "entity"],
    )
    return load_schema(schema_dict(**{**settings, **overrides}))


def test_prefix_separators_per_token_globals_links_and_hard_mask_exceptions(tok):
    inst = compile_instance(nq_graph(), nq_schema(), tok)
    # [CLS] q0 q1 [SEP] a0 a1 a2 b0 b1 [SEP]; words get ids 8.. in order of appearance
    np.testing.assert_array_equal(inst.long_token_ids, [2, 8, 9, 3, 10, 11, 12, 13, 14, 3])
    np.testing.assert_array_equal(inst.long_type_ids, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(inst.long_char_spans[:5], [[-1, -1], [0, 2], [3, 5], [-1, -1], [6, 8]])
    assert inst.long_token_text(2) == "q1" and inst.long_token_text(3) == ""
    assert inst.global_node_ids == ["<cls>", "q", "q", "c0", "c1", "ent"]
    assert inst.global_node_types == ["special", "question", "question", "candidate", "candidate", "entity"]
    np.testing.assert_array_equal(inst.global_token_ids, [2, 8, 9, 6, 6, 5])  # per-token globals copy wordpieces
    assert inst.label_vocab.names[5:] == ["does_not_belong", "belongs", "mention"]
    # each question wordpiece is owned by its own global copy; a [SEP] belongs to the node it closes
    np.testing.assert_array_equal(inst.long_owners["question"], [-1, 1, 2, -1, -1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(inst.long_owners["candidate"], [-1, -1, -1, -1, 3, 3, 3, 4, 4, -1])
    np.testing.assert_array_equal(inst.long_owners["entity"], [-1] * 10)
    l2g_ids = [
        [5, 5, 5, 5, 5, 5],  # [CLS]
        [5, 6, 5, 5, 5, 5],
        [5, 5, 6, 5, 5, 5],
        [5, 5, 5, 5, 5, 5],  # the question's [SEP]
        [5, 5, 5, 6, 5, 5],
        [5, 5, 5, 6, 5, 5],
        [5, 5, 5, 6, 5, 5],
        [5, 5, 5, 5, 6, 7],  # b0, b1: in c1 and mentions of the entity (label 7)
        [5, 5, 5, 5, 6, 7],
        [5, 5, 5, 5, 5, 5],  # the document's [SEP]
    ]
    assert_side(
        inst.side,
        l2g_relative_att_ids=l2g_ids,
        g2l_relative_att_ids=np.array(l2g_ids).T,
        l2g_att_mask=np.ones((10, 6)),
        g2l_att_mask=[
            [1] * 10,  # [CLS] global: a prefix global's row is exempt from hard masks
            [1] * 10,  # question globals: ignore_hard_masks exempts their rows
            [1] * 10,
            [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # c0: its own tokens only (exemptions are per row, not column)
            [0, 0, 0, 0, 0, 0, 0, 1, 1, 0],  # c1
            [1] * 10,  # entity: ignore_hard_masks
        ],
        g2g_att_mask=np.ones((6, 6)),
        g2g_relative_att_ids=distance_ids(6, 2),
        l2l_att_mask=window_mask(10, 2),
        l2l_relative_att_ids=[[4, 3, 0, 1, 2]] * 10,
    )


def test_hard_l2g_keeps_owned_linked_and_exempt_pairs(tok):
    inst = compile_instance(nq_graph(), nq_schema(masks={"hard_g2l": False, "hard_l2g": True}), tok)
    assert_side(
        inst.side,
        l2g_att_mask=[
            [1, 1, 1, 1, 1, 1],  # the long [CLS] row is exempt
            [1, 1, 1, 1, 1, 1],  # question tokens ignore hard masks: their rows see every global
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1],  # the question's [SEP] is inside the question
            [0, 0, 0, 1, 0, 0],  # a*: only their candidate c0 (the [CLS], question and entity
            [0, 0, 0, 1, 0, 0],  #     globals are not exempt as columns)
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 0, 1, 1],  # b*: candidate c1 and the entity they mention (a link)
            [0, 0, 0, 0, 1, 1],
            [0, 0, 0, 0, 0, 0],  # the document's [SEP]: no owner, no link
        ],
        g2l_att_mask=np.ones((6, 10)),
    )


def test_windows_with_stride_give_several_instances(tok):
    from graphattn.compile import compile_windows

    schema = nq_schema(max_long_length=8, truncation={"policy": "windows", "stride": 2, "pin": ["question"]})
    windows = compile_windows(nq_graph(), schema, tok)
    assert len(windows) == 2
    first, second = windows
    # [CLS] q0 q1 [SEP] + 3 document tokens + [SEP] = 8; windows start 2 tokens apart
    np.testing.assert_array_equal(first.long_token_ids, [2, 8, 9, 3, 10, 11, 12, 3])
    np.testing.assert_array_equal(second.long_token_ids, [2, 8, 9, 3, 12, 13, 14, 3])
    assert first.global_node_ids == ["<cls>", "q", "q", "c0", "ent"]
    assert second.global_node_ids == ["<cls>", "q", "q", "c0", "c1", "ent"]
    assert first.truncation.dropped_nodes == ["c1"] and second.truncation.dropped_nodes == []
    assert first.truncation.messages == ["window 1 of 2: long tokens [0, 3) of the 5 unpinned ones (stride 2)"]
    assert (first.truncation.long_tokens_before, first.truncation.long_tokens_after) == (10, 8)
    np.testing.assert_array_equal(second.long_owners["candidate"], [-1, -1, -1, -1, 3, 4, 4, -1])
    only = compile_instance(nq_graph(), schema, tok)
    np.testing.assert_array_equal(only.long_token_ids, first.long_token_ids)
    assert "compile_windows() returns all of them" in only.truncation.messages[-1]


def test_g2g_hierarchy_labels_cross_segment_label_and_blocking(tok):
    schema = load_schema(
        schema_dict(
            local_radius=1,
            global_prefix=["cls"],
            node_types={
                "document": {},
                "paragraph": {"global": "node", "segment": True},
                "sentence": {"global": "node", "long": True},
            },
            relations={"contains": {"hierarchy": True, "link": "g2g", "label": "child", "reverse_label": "parent"}},
            segments={"block_g2g": ["sentence"], "cross_segment_label": "cross"},
            global_order=[["paragraph", "sentence"]],
        )
    )
    inst = compile_instance(sentences_doc([[1, 1], [1]]), schema, tok)
    assert inst.global_node_ids == ["<cls>", "p0", "p0.s0", "p0.s1", "p1", "p1.s0"]
    assert inst.label_vocab.names[7:] == ["child", "parent", "cross"]  # ids 7, 8, 9
    assert_side(
        inst.side,
        g2g_att_mask=[
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 0],  # sentence -> sentence of another paragraph: blocked
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1, 1],
        ],
        g2g_relative_att_ids=[
            [0, 9, 9, 9, 9, 9],  # [CLS] is outside every segment: cross to all paragraph globals
            [9, 0, 7, 7, 9, 9],  # p0 -> its sentences: child
            [9, 8, 0, 1, 9, 9],  # p0.s0 -> p0: parent; -> p0.s1: distance +1
            [9, 8, 3, 0, 9, 9],
            [9, 9, 9, 9, 0, 7],
            [9, 9, 9, 9, 8, 0],
        ],
        l2l_att_mask=[[0, 1, 1], [1, 1, 0], [0, 1, 0]],  # paragraphs are segments
        l2g_relative_att_ids=[[5, 6, 6, 5, 5, 5], [5, 6, 5, 6, 5, 5], [5, 5, 5, 5, 6, 6]],
    )


def test_packed_documents_never_attend_across(tok):
    schema = load_schema(schema_dict(local_radius=2, packing={"max_documents": 2}))
    inst = compile_instance([sentences_doc([[2]], "a"), sentences_doc([[1, 2]], "b", word="v")], schema, tok)
    assert inst.doc_ids == ["a", "b"]
    np.testing.assert_array_equal(inst.long_doc_index, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(inst.global_doc_index, [0, 1, 1])
    assert inst.long_token_text(2) == "v0" and inst.texts[1].startswith("v0")
    assert_side(
        inst.side,
        l2l_att_mask=[[0, 0, 1, 1, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 0, 0]],
        g2g_att_mask=[[1, 0, 0], [0, 1, 1], [0, 1, 1]],
        g2g_relative_att_ids=distance_ids(3, 2),
        l2g_att_mask=[[1, 0, 0], [1, 0, 0], [0, 1, 1], [0, 1, 1], [0, 1, 1]],
        g2l_att_mask=[[1, 1, 0, 0, 0], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1]],
        l2g_relative_att_ids=[[6, 5, 5], [6, 5, 5], [5, 6, 5], [5, 5, 6], [5, 5, 6]],
    )


@pytest.mark.parametrize("hard_g2l, hard_l2g", [(False, False), (True, False), (False, True), (True, True)])
def test_fixed_blocks_match_the_etcmodel_compatible_primitive(tok, hard_g2l, hard_l2g):
    schema = load_schema(
        schema_dict(
            local_radius=2,
            node_types={"document": {}},
            fixed_blocks={"tokens_per_block": 3, "global_token": 1},
            masks={"hard_g2l": hard_g2l, "hard_l2g": hard_l2g},
        )
    )
    text = " ".join(f"w{i}" for i in range(10))
    inst = compile_instance(DocGraph(text, doc_id="plain"), schema, tok)  # no long types: the whole text
    assert inst.global_node_ids == ["<block:0>", "<block:1>", "<block:2>", "<block:3>"]
    np.testing.assert_array_equal(inst.long_owners["block"], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    np.testing.assert_array_equal(inst.global_token_ids, [1, 1, 1, 1])
    ref, ref_ids = fixed_block_side_inputs(np.ones(10, np.int32), 3, 2, 2, hard_g2l, hard_l2g)
    np.testing.assert_array_equal(inst.global_token_ids, ref_ids)
    for name, value in ref.as_dict().items():
        np.testing.assert_array_equal(getattr(inst.side, name), value, err_msg=name)
    # padded: masks agree with the reference everywhere; ids on real tokens
    batch = collate([inst], pad_to_long=12)
    ref, _ = fixed_block_side_inputs(np.array([[1] * 10 + [0] * 2], np.int32), 3, 2, 2, hard_g2l, hard_l2g)
    for name, value in ref.as_dict().items():
        got = getattr(batch.side, name).numpy()
        if "mask" in name:
            np.testing.assert_array_equal(got, value, err_msg=name)
        elif name.startswith("l2g"):
            np.testing.assert_array_equal(got[:, :10], value[:, :10], err_msg=name)


def test_type_ids_features_and_where_filter(tok):
    """OpenKP-like DOM: only block elements become globals; features travel per global and token."""
    text = "t0 t1 b0 b1 b2"
    g = DocGraph(text, doc_id="page")
    g.add_node("html", "element", (0, len(text)), block=True, font=0)
    g.add_child("html", "h1", "element", (0, 5), block=True, heading=1, font=20)
    g.add_child("html", "div", "element", (6, len(text)), block=True, font=12)
    g.add_child("div", "b", "element", (9, 11), block=False, bold=1)
    schema = load_schema(
        schema_dict(
            local_radius=1,
            node_types={"element": {"global": "node", "long": True, "where": {"block": True}, "type_id": 3}},
            features=["heading", "bold", {"name": "font", "dtype": "float32", "default": -1}],
            global_order=["element"],
        )
    )
    inst = compile_instance(g, schema, tok)
    assert inst.global_node_ids == ["html", "h1", "div"]  # the inline <b> is no global
    np.testing.assert_array_equal(inst.long_owners["element"], [1, 1, 2, 2, 2])  # innermost block element
    np.testing.assert_array_equal(inst.long_type_ids, [3] * 5)
    np.testing.assert_array_equal(inst.global_type_ids, [3, 3, 3])
    np.testing.assert_array_equal(inst.features["global:heading"], [0, 1, 0])
    np.testing.assert_array_equal(inst.features["long:heading"], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(inst.features["long:bold"], [0, 0, 0, 1, 0])  # from the inline <b>
    np.testing.assert_array_equal(inst.features["global:font"], np.array([0, 20, 12], np.float32))
    np.testing.assert_array_equal(inst.features["long:font"], np.array([20, 20, 12, 12, 12], np.float32))
    assert inst.features["long:font"].dtype == np.float32 and inst.features["long:bold"].dtype == np.int32
    # one level: only the innermost element global owns a token (html owns none directly)
    np.testing.assert_array_equal(
        inst.side.l2g_relative_att_ids, [[5, 6, 5], [5, 6, 5], [5, 5, 6], [5, 5, 6], [5, 5, 6]]
    )
    batch = collate([inst], pad_to_long=7, pad_to_global=4)
    np.testing.assert_array_equal(batch.features["long:bold"].numpy(), [[0, 0, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(batch.features["global:heading"].numpy(), [[0, 1, 0, 0]])


def test_hf_tokenizer_offsets_map_back_to_the_text():
    from pathlib import Path

    from graphattn.tokenize import load_tokenizer

    tokenizer = load_tokenizer(Path(__file__).resolve().parents[2] / "examples" / "data" / "tokenizer.json")
    text = "Global tokens summarise sentences. Long tokens attend locally, within a radius."
    g = DocGraph(text, doc_id="hf")
    g.add_node("doc", "document", (0, len(text)))
    g.add_child("doc", "s0", "sentence", (0, 34))
    g.add_child("doc", "s1", "sentence", (35, len(text)))
    inst = compile_instance(g, load_schema(schema_dict(special_tokens={"global": 1})), tokenizer)
    encoding = tokenizer.encode(text)
    np.testing.assert_array_equal(inst.long_token_ids, encoding.ids)
    for i in range(inst.long_length):
        start, end = inst.long_char_spans[i]
        assert inst.long_token_text(i) == text[start:end]
        assert inst.long_owners["sentence"][i] == (0 if start < 34 else 1)


def test_g2l_links_and_where_lists(tok):
    """A g2l relation links its source's global to its target's tokens; `where` takes a list."""
    text = "w0 w1 w2"
    g = DocGraph(text, doc_id="g")
    g.add_node("s0", "sentence", (0, 5), kind="a")
    g.add_node("s1", "sentence", (6, 8), kind="c")
    g.add_node("topic", "topic", kind="b")
    g.add_edge("topic", "about", "s1")
    schema = load_schema(
        schema_dict(
            local_radius=1,
            node_types={
                "sentence": {"global": "node", "long": True, "where": {"kind": ["a", "b"]}},
                "topic": {"global": "node"},
            },
            relations={"about": {"link": "g2l", "label": "about"}},
            masks={"hard_g2l": True},
            global_order=["sentence", "topic"],
        )
    )
    inst = compile_instance(g, schema, tok)
    assert inst.global_node_ids == ["s0", "topic"]  # s1 has kind "c": no global
    assert_side(
        inst.side,
        l2g_relative_att_ids=[[6, 5], [6, 5], [5, 7]],
        g2l_relative_att_ids=[[6, 6, 5], [5, 5, 7]],
        g2l_att_mask=[[1, 1, 0], [0, 0, 1]],  # the link opens a hard g2l mask
    )


def test_compact_row_blocks_equal_the_dense_rows(tok):
    schema = nq_schema(masks={"hard_g2l": True, "hard_l2g": True})
    inst = compile_instance(nq_graph(), schema, tok, compact=True)
    dense = inst.side.to_dense()
    for rows in (slice(0, 3), slice(3, 7), slice(7, 10)):
        mask, ids = inst.side.l2g_rows(rows)
        np.testing.assert_array_equal(mask, dense.l2g_att_mask[rows])
        np.testing.assert_array_equal(ids, dense.l2g_relative_att_ids[rows])
    mask, ids = inst.side.g2l_rows(slice(2, 5))
    np.testing.assert_array_equal(mask, dense.g2l_att_mask[2:5])
    np.testing.assert_array_equal(ids, dense.g2l_relative_att_ids[2:5])
    assert inst.side.nbytes < sum(a.nbytes for a in dense.as_dict().values())


def test_document_order_sorts_by_start_then_outer_first_and_keeps_tree_order():
    """Rank is pre-order over the text: start, then the longer (outer) span, then the shallower
    node, then the row. Rows already in that order come back as they are (a tree walk); others
    are sorted."""
    from graphattn.compile.hierarchy import document_order

    spans = np.array([[0, 10], [0, 4], [0, 4], [4, 10], [6, 6], [-1, -1]])
    depth = np.array([0, 1, 2, 1, 2, 0])
    spanned = np.array([0, 1, 2, 3, 4])
    np.testing.assert_array_equal(document_order(spanned, spans, depth), [0, 1, 2, 3, 4])
    shuffled = np.array([[4, 10], [0, 4], [6, 6], [0, 10], [0, 4]])  # rows 3, 1, 4, 0, 2 above
    shuffled_depth = np.array([1, 2, 2, 0, 1])
    np.testing.assert_array_equal(document_order(np.arange(5), shuffled, shuffled_depth), [3, 4, 1, 0, 2])
