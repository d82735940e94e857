"""Hand-written whole tensors for small graphs, one feature at a time (etcmodel test style).

Conventions in the expected arrays: k = relative_pos_max_distance, so 2k+1 is does_not_belong
and 2k+2 belongs; l2l columns are key offsets -r..+r.
"""

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc

from graphattn import collate, compile_instance, load_schema
from graphattn.compact import CompactSideInputs
from graphattn.contract import SideInputs


@pytest.fixture
def tok():
    return WordTokenizer()


def assert_side(side, **expected):
    for name, value in expected.items():
        got = np.asarray(getattr(side, name))
        np.testing.assert_array_equal(got, np.asarray(value, dtype=np.int32), err_msg=name)
        assert got.dtype == np.int32, name


def test_worked_example_of_the_design_notes(tok):
    """docs/DESIGN.md §3: k=2, r=3, sentences of 5, 7 and 4 tokens, padded to L=20, G=5."""
    schema = load_schema(schema_dict(masks={"hard_g2l": True}))
    inst = compile_instance(sentences_doc([[5, 7, 4]]), schema, tok)
    assert inst.global_node_ids == ["p0.s0", "p0.s1", "p0.s2"]
    assert inst.label_vocab.names[5:] == ["does_not_belong", "belongs"]
    batch = collate([inst], pad_to_long=20, pad_to_global=5)
    side = batch.side.to_numpy().map(lambda a: a[0])
    real = [[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]] + [[1] * 7] * 10
    real += [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0]]
    pad = [
        [0, 0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
    ]  # padding: own document
    l2g_ids = [[6, 5, 5, 5, 5]] * 5 + [[5, 6, 5, 5, 5]] * 7 + [[5, 5, 6, 5, 5]] * 4 + [[5, 5, 5, 5, 5]] * 4
    l2g_mask = [[1, 1, 1, 0, 0]] * 16 + [[0, 0, 0, 1, 1]] * 4
    g2l_mask = [
        [1] * 5 + [0] * 15,
        [0] * 5 + [1] * 7 + [0] * 8,
        [0] * 12 + [1] * 4 + [0] * 4,
        [0] * 16 + [1] * 4,
        [0] * 16 + [1] * 4,
    ]
    assert_side(
        side,
        l2l_relative_att_ids=[[4, 4, 3, 0, 1, 2, 2]] * 20,
        l2l_att_mask=real + pad,
        g2g_att_mask=[[1, 1, 1, 0, 0]] * 3 + [[0, 0, 0, 1, 1]] * 2,
        g2g_relative_att_ids=[[0, 1, 2, 2, 2], [3, 0, 1, 2, 2], [4, 3, 0, 1, 2], [4, 4, 3, 0, 1], [4, 4, 4, 3, 0]],
        l2g_relative_att_ids=l2g_ids,
        g2l_relative_att_ids=np.asarray(l2g_ids).T,
        l2g_att_mask=l2g_mask,
        g2l_att_mask=g2l_mask,
    )
    np.testing.assert_array_equal(batch.long_input_mask[0].numpy(), [1] * 16 + [0] * 4)
    np.testing.assert_array_equal(batch.global_input_mask[0].numpy(), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch.global_token_ids[0].numpy(), [5, 5, 5, 0, 0])
    assert batch.vocab_size == 7


def test_two_level_hierarchy_with_segments(tok):
    """Paragraph and sentence globals interleaved in document order; l2l blocked across paragraphs."""
    schema = load_schema(
        schema_dict(
            local_radius=2,
            node_types={
                "document": {},
                "paragraph": {"global": "node", "segment": True, "type_id": 1},
                "sentence": {"global": "node", "long": True, "type_id": 2, "global_type_id": 3},
            },
            global_order=[["paragraph", "sentence"]],
        )
    )
    inst = compile_instance(sentences_doc([[2, 1], [2]]), schema, tok)
    assert inst.global_node_ids == ["p0", "p0.s0", "p0.s1", "p1", "p1.s0"]
    assert inst.global_node_types == ["paragraph", "sentence", "sentence", "paragraph", "sentence"]
    np.testing.assert_array_equal(inst.global_type_ids, [1, 3, 3, 1, 3])
    np.testing.assert_array_equal(inst.long_type_ids, [2, 2, 2, 2, 2])  # the innermost typed node
    np.testing.assert_array_equal(inst.long_owners["paragraph"], [0, 0, 0, 3, 3])
    np.testing.assert_array_equal(inst.long_owners["sentence"], [1, 1, 2, 4, 4])
    assert_side(
        inst.side,
        l2l_att_mask=[
            [0, 0, 1, 1, 1],
            [0, 1, 1, 1, 0],
            [1, 1, 1, 0, 0],  # token 2 ends paragraph 0: tokens 3, 4 are another segment
            [0, 0, 1, 1, 0],
            [0, 1, 1, 0, 0],
        ],
        l2l_relative_att_ids=[[4, 3, 0, 1, 2]] * 5,
        l2g_relative_att_ids=[
            [6, 6, 5, 5, 5],
            [6, 6, 5, 5, 5],
            [6, 5, 6, 5, 5],
            [5, 5, 5, 6, 6],
            [5, 5, 5, 6, 6],
        ],
        l2g_att_mask=np.ones((5, 5)),
        g2l_att_mask=np.ones((5, 5)),
        g2g_att_mask=np.ones((5, 5)),
        g2g_relative_att_ids=[[0, 1, 2, 2, 2], [3, 0, 1, 2, 2], [4, 3, 0, 1, 2], [4, 4, 3, 0, 1], [4, 4, 4, 3, 0]],
    )


def test_compact_form_gives_the_same_tensors_and_batches(tok):
    schema = load_schema(schema_dict(masks={"hard_g2l": True, "hard_l2g": True}))
    docs = [sentences_doc([[3, 2], [4]]), sentences_doc([[1, 1, 5]])]
    dense = [compile_instance(d, schema, tok) for d in docs]
    compact = [compile_instance(d, schema, tok, compact=True) for d in docs]
    for a, b in zip(dense, compact):
        assert isinstance(a.side, SideInputs) and isinstance(b.side, CompactSideInputs)
        for name, value in b.side.to_dense().as_dict().items():
            np.testing.assert_array_equal(value, getattr(a.side, name), err_msg=name)
    batch_a, batch_b = collate(dense, pad_to_long=12), collate(compact, pad_to_long=12)
    assert batch_a.side.l2l_att_mask.shape == (2, 12, 7)
    for name, value in batch_a.side.as_dict().items():
        assert value.shape[0] == 2
        np.testing.assert_array_equal(value.numpy(), getattr(batch_b.side, name).numpy(), err_msg=name)
