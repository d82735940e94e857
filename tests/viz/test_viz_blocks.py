"""Block summaries: shares and dominant labels by hand, and against brute force."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_instances import brute_force_grid, hand_instance, random_instance

from graphattn.errors import GraphattnError
from graphattn.viz.blocks import BlockAxis, block_summary, choose_block_size
from graphattn.viz.pattern import AxisRange, Pattern


def test_block_axis_never_straddles_global_and_long():
    axis = BlockAxis.cut(AxisRange(0, 8), global_length=3, block_size=2)
    np.testing.assert_array_equal(axis.starts, [0, 2, 3, 5, 7])
    np.testing.assert_array_equal(axis.stops, [2, 3, 5, 7, 8])
    np.testing.assert_array_equal(axis.block_of(np.arange(8)), [0, 0, 1, 2, 2, 3, 3, 4])
    part = BlockAxis.cut(AxisRange(4, 8), global_length=3, block_size=3)
    np.testing.assert_array_equal(part.starts, [4, 7])


def test_choose_block_size_is_a_power_of_two_within_budget():
    assert choose_block_size(100, 320) == 1
    assert choose_block_size(4352, 320) == 16
    assert choose_block_size(4352, 64) == 128


def test_shares_and_dominant_labels_by_hand():
    # G0 document (soft), G1 = sentence L0-L1, G2 = sentence L2-L4 (hard g2l), radius 1, k = 1.
    # ids: 0 dist:0, 1 dist:+1, 2 dist:-1, 3 does_not_belong, 4 belongs. Blocks of 2 per part:
    # queries/keys {G0,G1} {G2} {L0,L1} {L2,L3} {L4}.
    pattern = Pattern(hand_instance((2, 3), radius=1, max_distance=1))
    summary = block_summary(pattern, block_size=2)
    expected_share = np.array(
        [
            [1, 1, 1, 2 / 4, 1 / 2],  # G0 sees everything; G1 only L0, L1
            [1, 1, 0, 1, 1],  # G2 only L2..L4
            [1, 1, 1, 1 / 4, 0],  # L1 -> L2 is the only pair within radius 1
            [1, 1, 1 / 4, 1, 1 / 2],  # L2 -> L1; L3 -> L4
            [1, 1, 0, 1 / 2, 1],  # L4 -> L3
        ]
    )
    np.testing.assert_allclose(summary.share, expected_share)
    expected_dominant = np.array(
        [
            [0, 1, 4, 4, 4],
            [2, 0, -1, 4, 4],
            [4, 3, 0, 1, -1],
            [3, 4, 2, 0, 1],  # ties (2 belongs, 2 does_not_belong) go to the lower id
            [3, 4, -1, 2, 0],
        ]
    )
    np.testing.assert_array_equal(summary.dominant, expected_dominant)
    np.testing.assert_array_equal(summary.counts[2, 2], [2, 1, 1, 0, 0])
    np.testing.assert_array_equal(summary.labels_present(), [0, 1, 2, 3, 4])


def test_zoomed_summary_covers_only_the_range():
    pattern = Pattern(hand_instance((2, 3), radius=1, max_distance=1))
    summary = block_summary(pattern, AxisRange(3, 8), AxisRange(0, 3), block_size=4)
    np.testing.assert_array_equal(summary.queries.starts, [3, 7])
    np.testing.assert_array_equal(summary.keys.starts, [0])
    np.testing.assert_allclose(summary.share, [[1.0], [1.0]])  # l2g is soft
    np.testing.assert_array_equal(summary.labels_in_region(), [3, 4])


@settings(max_examples=40, deadline=None)
@given(
    G=st.integers(0, 5),
    L=st.integers(1, 14),
    radius=st.integers(0, 5),
    size=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    lo=st.integers(0, 6),
    hi=st.integers(0, 6),
)
def test_summary_matches_brute_force(G, L, radius, size, seed, lo, hi):
    instance = random_instance(np.random.default_rng(seed), G, L, radius)
    N = G + L
    span = AxisRange(min(lo, N - 1), max(min(lo, N - 1) + 1, N - hi))
    summary = block_summary(Pattern(instance), span, AxisRange(0, N), block_size=size)
    grid = brute_force_grid(instance)
    V = len(instance.label_vocab)
    for bq, (q0, q1) in enumerate(zip(summary.queries.starts, summary.queries.stops)):
        for bk, (k0, k1) in enumerate(zip(summary.keys.starts, summary.keys.stops)):
            cells = grid[q0:q1, k0:k1]
            allowed = cells[cells >= 0]
            counts = np.bincount(allowed, minlength=V)
            np.testing.assert_array_equal(summary.counts[bq, bk], counts)
            assert summary.share[bq, bk] == allowed.size / cells.size
            assert summary.dominant[bq, bk] == (counts.argmax() if allowed.size else -1)


def test_too_fine_blocks_over_a_long_range_are_refused_with_a_size_that_works(monkeypatch):
    import graphattn.viz.blocks as blocks

    monkeypatch.setattr(blocks, "MAX_HISTOGRAM", 250)  # 9 labels (k = 3): at most 5 x 5 blocks
    pattern = Pattern(hand_instance((10, 10), radius=2, max_distance=3))  # 3 globals + 20 tokens
    with pytest.raises(GraphattnError, match="use blocks of at least 8 tokens or a smaller range") as err:
        block_summary(pattern, block_size=2)
    assert "12 x 12 x 9-label histogram" in str(err.value)  # 2 + 10 blocks of 2 per axis
    assert len(block_summary(pattern, block_size=8).queries) == 4  # 1 + 3 blocks of 8
