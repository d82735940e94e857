"""Hard masks are per query row, as in etcmodel: `ignore_hard_g2l` exempts a global's g2l row,
`ignore_hard_l2g` the l2g rows of the long tokens inside a node; no column is ever exempt."""

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict

from graphattn import compile_instance, load_schema
from graphattn.compile.side_inputs import side_inputs
from graphattn.errors import SchemaError
from graphattn.graph import DocGraph


def question_doc(question: list[str], sentences: list[list[str]], doc_id: str) -> DocGraph:
    """A question followed by a document of sentences; node ids ``q``, ``doc``, ``s0``, ``s1``..."""
    words = question + [w for s in sentences for w in s]
    text = " ".join(words)
    graph = DocGraph(text, doc_id=doc_id)
    q_end = len(" ".join(question))
    graph.add_node("q", "question", (0, q_end))
    graph.add_node("doc", "document", (q_end + 1, len(text)))
    start = q_end + 1
    for i, sentence in enumerate(sentences):
        end = start + len(" ".join(sentence))
        graph.add_child("doc", f"s{i}", "sentence", (start, end))
        start = end + 1
    return graph


def qa_schema(hard_g2l: bool, hard_l2g: bool, **overrides):
    settings = dict(
        node_types={
            "question": {"global": "node", "long": True, "ignore_hard_masks": True},
            "document": {},
            "sentence": {"global": "node", "long": True},
        },
        masks={"hard_g2l": hard_g2l, "hard_l2g": hard_l2g},
        global_order=[["question", "sentence"]],
    )
    return load_schema(schema_dict(**{**settings, **overrides}))


def test_exemptions_are_per_query_row():
    doc = question_doc(["q0", "q1"], [["w0", "w1", "w2"], ["w3", "w4"]], "d")
    inst = compile_instance(doc, qa_schema(True, True), WordTokenizer())
    assert inst.global_node_ids == ["q", "s0", "s1"]
    # long: q0 q1 | w0 w1 w2 | w3 w4; k = 2, so 5 = does_not_belong, 6 = belongs
    np.testing.assert_array_equal(inst.side.l2g_relative_att_ids, [[6, 5, 5]] * 2 + [[5, 6, 5]] * 3 + [[5, 5, 6]] * 2)
    np.testing.assert_array_equal(
        inst.side.g2l_att_mask,
        [
            [1, 1, 1, 1, 1, 1, 1],  # the question global ignores hard g2l: it sees every long token
            [0, 0, 1, 1, 1, 0, 0],  # s0 sees its own tokens only, not the (exempt) question's
            [0, 0, 0, 0, 0, 1, 1],
        ],
    )
    np.testing.assert_array_equal(
        inst.side.l2g_att_mask,
        [
            [1, 1, 1],  # question tokens ignore hard l2g: they see every global
            [1, 1, 1],
            [0, 1, 0],  # a sentence token sees its own sentence, not the (exempt) question global
            [0, 1, 0],
            [0, 1, 0],
            [0, 0, 1],
            [0, 0, 1],
        ],
    )
    compact = compile_instance(doc, qa_schema(True, True), WordTokenizer(), compact=True).side
    np.testing.assert_array_equal(compact.long_hard_l2g, [0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(compact.global_hard_g2l, [0, 1, 1])


@pytest.mark.parametrize("hard_g2l, hard_l2g", [(False, False), (True, False), (False, True), (True, True)])
def test_one_level_hierarchy_equals_etcmodel_side_inputs(hard_g2l, hard_l2g):
    """Two packed documents, [CLS] prefixes, exempt question rows: the graph compiler's eight
    tensors are `side_inputs`' for the same breakpoints, owners and ignore masks."""
    docs = [
        question_doc(["q0", "q1"], [["a0", "a1"], ["a2", "a3", "a4"]], "a"),
        question_doc(["r0"], [["b0", "b1"]], "b"),
    ]
    schema = qa_schema(
        hard_g2l, hard_l2g, local_radius=3, long_prefix=["cls"], global_prefix=["cls"], packing={"max_documents": 2}
    )
    inst = compile_instance(docs, schema, WordTokenizer())
    # long:   [CLS] q0 q1 a0 a1 a2 a3 a4 | [CLS] r0 b0 b1
    # global: <cls> q s0 s1 | <cls> q s0
    assert inst.global_node_ids == ["<cls>", "q", "s0", "s1", "<cls>", "q", "s0"]
    long_breakpoints = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    global_breakpoints = [0, 0, 0, 1, 0, 0, 1]
    sentence_ids = [-1, 1, 1, 2, 2, 3, 3, 3, -1, 5, 6, 6]  # the owning global of each long token
    ignore_g2l = [1, 1, 0, 0, 1, 1, 0]  # prefix and question globals
    ignore_l2g = [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0]  # prefix and question tokens
    expected = side_inputs(
        long_breakpoints,
        global_breakpoints,
        sentence_ids,
        schema.local_radius,
        schema.relative_pos_max_distance,
        use_hard_g2l_mask=hard_g2l,
        ignore_hard_g2l_mask=ignore_g2l,
        use_hard_l2g_mask=hard_l2g,
        ignore_hard_l2g_mask=ignore_l2g,
    )
    for name, value in expected.as_dict().items():
        np.testing.assert_array_equal(getattr(inst.side, name), value, err_msg=name)


def test_a_block_only_hard_l2g_beside_node_globals_is_refused():
    raw = schema_dict(fixed_blocks={"tokens_per_block": 4, "hard_l2g": True}, global_order=["sentence", "block"])
    with pytest.raises(SchemaError, match="set masks.hard_l2g: true instead") as err:
        load_schema(raw)
    assert tuple(err.value.location.path) == ("fixed_blocks", "hard_l2g")
    # the same value as masks.hard_l2g, or blocks as the only global level, are fine
    load_schema({**raw, "masks": {"hard_l2g": True}})
    load_schema({**raw, "node_types": {"document": {}}, "global_order": ["block"]})
