"""Reading the pattern: ranges, the l2l band unrolled to true positions, compact side inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_instances import brute_force_grid, hand_instance, random_instance

from graphattn.contract import SideInputs
from graphattn.errors import BatchError, GraphattnError
from graphattn.viz.pattern import MASKED, AxisRange, Pattern, parse_range


def test_parse_range_plain_prefixed_and_open_ends():
    assert parse_range(None, 4, 10) == AxisRange(0, 14)
    assert parse_range(":", 4, 10) == AxisRange(0, 14)
    assert parse_range("2:9", 4, 10) == AxisRange(2, 9)
    assert parse_range("l3:l7", 4, 10) == AxisRange(7, 11)
    assert parse_range("g1:l2", 4, 10) == AxisRange(1, 6)
    assert parse_range(":g3", 4, 10) == AxisRange(0, 3)
    assert parse_range("l5:", 4, 10) == AxisRange(9, 14)


@pytest.mark.parametrize(
    "text, fragment",
    [("3", "expected A:B"), ("x:4", "is not a position"), ("5:2", "0 <= A < B <= 14"), ("0:15", "G=4 globals, L=10")],
)
def test_parse_range_errors_say_what_was_expected(text, fragment):
    with pytest.raises(GraphattnError, match="--keys") as err:
        parse_range(text, 4, 10, "--keys")
    assert fragment in str(err.value)


def test_axis_range_split_into_global_and_long_parts():
    assert AxisRange(2, 7).split(4) == (slice(2, 4), slice(0, 3))
    assert AxisRange(5, 7).split(4) == (slice(4, 4), slice(1, 3))
    assert AxisRange(0, 3).split(4) == (slice(0, 3), slice(0, 0))


def test_l2l_band_unrolled_at_true_positions():
    # radius 2, max distance 2, one document of 5 tokens, no document global: the l2l piece at
    # true positions is the clipped distance (0 same, 1..2 right, 3..4 left) inside |j - i| <= 2
    pattern = Pattern(hand_instance((5,), radius=2, max_distance=2, document_global=False))
    l2l = pattern.labels(AxisRange(1, 6), AxisRange(1, 6))
    expected = np.array(
        [
            [0, 1, 2, -1, -1],
            [3, 0, 1, 2, -1],
            [4, 3, 0, 1, 2],
            [-1, 4, 3, 0, 1],
            [-1, -1, 4, 3, 0],
        ]
    )
    np.testing.assert_array_equal(l2l, expected)


def test_hard_sentence_global_sees_only_its_tokens():
    instance = hand_instance((2, 3), radius=1, max_distance=1)
    vocab = instance.label_vocab
    g2l = Pattern(instance).labels(AxisRange(0, 3), AxisRange(3, 8))
    B = vocab.belongs
    np.testing.assert_array_equal(g2l, [[B, B, B, B, B], [B, B, -1, -1, -1], [-1, -1, B, B, B]])


def test_names_of_positions_and_owners():
    pattern = Pattern(hand_instance((2, 3)))
    assert pattern.position_name(1) == "G1 sentence:s0"
    assert pattern.position_name(3) == "L0 the"
    assert pattern.position_name(3, width=4) == "L0 …"
    assert pattern.owner_names(0) == ["document:doc (G0)", "sentence:s0 (G1)"]
    assert pattern.owner_names(3) == ["document:doc (G0)", "sentence:s1 (G2)"]


def test_inserted_tokens_are_named_by_id():
    instance = hand_instance((3,))
    instance.long_char_spans[0] = (-1, -1)
    assert Pattern(instance).position_name(instance.global_length) == "L0 <id 100>"


def test_shape_mismatch_is_a_clear_error():
    instance = hand_instance((3, 3))
    s = instance.side
    instance.side = SideInputs(
        s.l2l_att_mask,
        s.g2g_att_mask,
        s.l2g_att_mask[:, :1],
        s.g2l_att_mask,
        s.l2l_relative_att_ids,
        s.g2g_relative_att_ids,
        s.l2g_relative_att_ids,
        s.g2l_relative_att_ids,
    )
    with pytest.raises(BatchError, match=r"l2g_att_mask has shape \(6, 1\), expected \(6, 3\)"):
        Pattern(instance)


@settings(max_examples=40, deadline=None)
@given(
    G=st.integers(0, 4),
    L=st.integers(1, 9),
    radius=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    q=st.tuples(st.integers(0, 12), st.integers(1, 13)),
    k=st.tuples(st.integers(0, 12), st.integers(1, 13)),
)
def test_labels_match_brute_force_on_any_range(G, L, radius, seed, q, k):
    instance = random_instance(np.random.default_rng(seed), G, L, radius)
    N = G + L
    q0, q1 = sorted((min(q[0], N - 1), min(q[1], N)))
    k0, k1 = sorted((min(k[0], N - 1), min(k[1], N)))
    q1, k1 = max(q1, q0 + 1), max(k1, k0 + 1)
    expected = brute_force_grid(instance)[q0:q1, k0:k1]
    np.testing.assert_array_equal(Pattern(instance).labels(AxisRange(q0, q1), AxisRange(k0, k1)), expected)


def _compact_instance():
    """A CompactSideInputs by hand: 2 sentence globals + 1 document, 6 tokens, one link."""
    from graphattn.compact import CompactSideInputs

    instance = hand_instance((3, 3), radius=2, max_distance=2, extra_labels=("mention_of",))
    L, G = 6, 3
    compact = CompactSideInputs(
        local_radius=2,
        max_distance=2,
        levels=("document", "sentence"),
        owners=np.array([[0] * 6, [1, 1, 1, 2, 2, 2]], np.int32),
        long_doc=np.zeros(L, np.int32),
        long_segment=np.zeros(L, np.int32),
        global_doc=np.zeros(G, np.int32),
        global_segment=np.full(G, -1, np.int32),
        global_blockable=np.zeros(G, bool),
        long_hard_l2g=np.zeros(L, bool),
        global_hard_g2l=np.array([False, True, True]),
        link_long=np.array([4], np.int32),
        link_global=np.array([1], np.int32),
        link_label=np.array([instance.label_vocab.id("mention_of")], np.int32),
    )
    instance.side = compact
    return instance


def test_compact_side_inputs_read_by_rows_match_their_dense_form():
    pytest.importorskip("graphattn.compact")
    compact_instance = _compact_instance()
    dense_instance = _compact_instance()
    dense_instance.side = dense_instance.side.to_dense()
    compact, dense = Pattern(compact_instance), Pattern(dense_instance)
    assert type(compact.reader).__name__ == "_CompactReader"  # rows on demand, not to_dense()
    full = compact.full_range()
    np.testing.assert_array_equal(compact.labels(full, full), dense.labels(full, full))
    np.testing.assert_array_equal(
        compact.labels(AxisRange(1, 2), AxisRange(5, 9)), dense.labels(AxisRange(1, 2), AxisRange(5, 9))
    )
    # the linked token (L4) is visible to sentence s0 (G1) with the link's label despite the hard mask
    assert compact.labels(AxisRange(1, 2), AxisRange(7, 8))[0, 0] == compact.vocab.id("mention_of")
    assert compact.labels(AxisRange(1, 2), AxisRange(6, 7))[0, 0] == MASKED
