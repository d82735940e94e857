"""The range primitives the compiler's per-token lookups are made of, with expected arrays by hand."""

import numpy as np

from graphattn.compile.ranges import (
    coverage,
    expand_ranges,
    innermost,
    ragged_offsets,
    ragged_rows,
    searchsorted_left,
    take_or,
)


def test_coverage_of_disjoint_adjacent_overlapping_empty_and_clipped_ranges():
    # disjoint and adjacent (the int8 path): [1, 3) and [3, 4) run on, [6, 9) is clipped at 8
    np.testing.assert_array_equal(coverage(8, np.array([1, 3, 6]), np.array([3, 4, 9])), [0, 1, 1, 1, 0, 0, 1, 1])
    # overlapping (the counting path), with an empty [5, 5) and a backwards [7, 6) that cover nothing
    got = coverage(8, np.array([0, 1, 5, 7]), np.array([3, 2, 5, 6]))
    np.testing.assert_array_equal(got, [1, 1, 1, 0, 0, 0, 0, 0])
    assert got.dtype == bool
    assert coverage(0, np.array([0]), np.array([3])).shape == (0,)


def test_take_or_picks_the_default_at_minus_one():
    np.testing.assert_array_equal(take_or(np.array([10, 20, 30]), np.array([2, -1, 0]), -1), [30, -1, 10])
    np.testing.assert_array_equal(take_or(np.zeros(0, np.int64), np.array([-1, -1]), 7), [7, 7])
    rows = take_or(np.array([[1, 2], [3, 4]]), np.array([-1, 1]), 0)
    np.testing.assert_array_equal(rows, [[0, 0], [3, 4]])


def test_expand_ranges_and_innermost():
    positions, which = expand_ranges(np.array([2, 0]), np.array([4, 1]))
    np.testing.assert_array_equal(positions, [2, 3, 0])
    np.testing.assert_array_equal(which, [0, 0, 1])
    # a paragraph [0, 6) holding sentences [0, 2) and [3, 6): the higher rank (the sentence) wins
    got = innermost(7, np.array([0, 0, 3]), np.array([6, 2, 6]), np.array([0, 1, 2]))
    np.testing.assert_array_equal(got, [1, 1, 0, 2, 2, 2, -1])


def test_searchsorted_left_answers_values_past_the_end_without_searching():
    kept = np.array([2, 5])
    values = np.array([0, 2, 3, 5, 6, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9])  # more than 8 per kept token
    np.testing.assert_array_equal(searchsorted_left(kept, values), [0, 0, 1, 1] + [2] * 14)
    np.testing.assert_array_equal(searchsorted_left(np.zeros(0, np.int64), np.array([4, -1])), [0, 0])


def test_ragged_offsets_and_rows_of_pieces_laid_end_to_end():
    # three pieces of lengths 2, 0 and 3: positions 0-1 are piece 0, 2-4 piece 2; piece 1 starts (and ends) at 2
    starts, total = ragged_offsets([2, 0, 3])
    np.testing.assert_array_equal(starts, [0, 2, 2])
    assert total == 5
    np.testing.assert_array_equal(ragged_rows([2, 0, 3]), [0, 0, 2, 2, 2])
    starts, total = ragged_offsets(np.zeros(0, np.int64))
    assert starts.shape == (0,) and total == 0
    assert ragged_rows([0, 0]).shape == (0,)


def test_innermost_over_documents_laid_end_to_end_is_each_documents_own():
    # document A: [0, 4) holding [1, 3); document B (positions 4-6): [4, 7) holding [5, 6), ranks offset by 2
    starts, ends, ranks = np.array([0, 1, 4, 5]), np.array([4, 3, 7, 6]), np.array([0, 1, 2, 3])
    np.testing.assert_array_equal(innermost(7, starts, ends, ranks), [0, 1, 1, 0, 2, 3, 2])
    np.testing.assert_array_equal(innermost(4, starts[:2], ends[:2], ranks[:2]), [0, 1, 1, 0])
    np.testing.assert_array_equal(innermost(3, starts[2:] - 4, ends[2:] - 4, ranks[2:] - 2) + 2, [2, 3, 2])
