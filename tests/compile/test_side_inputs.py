"""ETC side inputs: whole expected tensors for small cases (etcmodel feature_utils_test style),
then property tests against a per-pair reference written straight from the definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.compile.side_inputs import (
    SideInputError,
    allocate_side_inputs,
    example_ids_from_breakpoints,
    fixed_block_layout,
    fixed_block_side_inputs,
    l2l_window,
    owner_labels,
    relative_position_ids,
    restrict_to_owner,
    same_segment,
    side_inputs,
    side_inputs_from_example_ids,
    window_view,
)
from graphattn.contract import SIDE_INPUT_NAMES
from graphattn.errors import CompileError, GraphattnError


def assert_side(side, **expected):
    for name, value in expected.items():
        got = getattr(side, name)
        assert got.dtype == np.int32, name
        np.testing.assert_array_equal(got, np.asarray(value), err_msg=name)


# -- the worked example of docs/DESIGN.md §3 ------------------------------------------------------
def test_design_worked_example():
    """k=2, r=3, one document of sentences 5, 7, 4 padded to L=20, G=5 (3 real globals)."""
    long_bp = np.zeros(20, int)
    long_bp[15] = 1
    global_bp = [0, 0, 1, 0, 0]
    sentence_ids = [0] * 5 + [1] * 7 + [2] * 4 + [0] * 4
    side = side_inputs([long_bp], [global_bp], [sentence_ids], local_radius=3, relative_pos_max_distance=2)
    doc, pad = [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]
    assert_side(
        side,
        l2l_relative_att_ids=[[[4, 4, 3, 0, 1, 2, 2]] * 20],
        l2g_relative_att_ids=[
            [[6, 5, 5, 5, 5]] * 5 + [[5, 6, 5, 5, 5]] * 7 + [[5, 5, 6, 5, 5]] * 4 + [[6, 5, 5, 5, 5]] * 4
        ],
        l2l_att_mask=[
            [
                [0, 0, 0, 1, 1, 1, 1],
                [0, 0, 1, 1, 1, 1, 1],
                [0, 1, 1, 1, 1, 1, 1],
                *[[1, 1, 1, 1, 1, 1, 1]] * 10,
                [1, 1, 1, 1, 1, 1, 0],  # token 13: key 16 is padding
                [1, 1, 1, 1, 1, 0, 0],
                [1, 1, 1, 1, 0, 0, 0],  # token 15, the last of the document
                [0, 0, 0, 1, 1, 1, 1],  # padding attends to padding only
                [0, 0, 1, 1, 1, 1, 0],
                [0, 1, 1, 1, 1, 0, 0],
                [1, 1, 1, 1, 0, 0, 0],
            ]
        ],
        g2g_att_mask=[[doc, doc, doc, pad, pad]],
        g2g_relative_att_ids=[[[0, 1, 2, 2, 2], [3, 0, 1, 2, 2], [4, 3, 0, 1, 2], [4, 4, 3, 0, 1], [4, 4, 4, 3, 0]]],
        l2g_att_mask=[[doc] * 16 + [pad] * 4],
        g2l_att_mask=[np.array([doc] * 16 + [pad] * 4).T],
    )
    np.testing.assert_array_equal(side.g2l_relative_att_ids, side.l2g_relative_att_ids.transpose(0, 2, 1))


# -- packed documents, padding, hard masks (the reference's scenario, our own arrays) ------------
# Row 0 packs two documents (3 and 4 tokens; 2 and 1 globals) and pads 2 long, 1 global.
# Its token 2 names global 2 as owner, a global of the OTHER document: hard masks then leave
# it nothing (masks multiply), while its ids still say "belongs". Row 1 is one full document.
LONG_BP = [[0, 0, 1, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1]]
GLOBAL_BP = [[0, 1, 1, 0], [0, 0, 0, 1]]
SENTENCE_IDS = [[0, 1, 2, 2, 2, 2, 2, 3, 3], [0, 0, 1, 1, 1, 2, 3, 3, 3]]
LONG_EXAMPLE_IDS = [[2, 2, 2, 1, 1, 1, 1, 0, 0], [1] * 9]
GLOBAL_EXAMPLE_IDS = [[2, 2, 1, 0], [1, 1, 1, 1]]

PACKED_L2L_MASK = [
    [
        [0, 0, 1, 1, 1],
        [0, 1, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1],
        [0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 1, 1, 0, 0],
    ],
    [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], *[[1, 1, 1, 1, 1]] * 5, [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]],
]
PACKED_G2G_MASK = [[[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], np.ones((4, 4))]
PACKED_L2G_MASK = [[[1, 1, 0, 0]] * 3 + [[0, 0, 1, 0]] * 4 + [[0, 0, 0, 1]] * 2, np.ones((9, 4))]
PACKED_HARD_L2G_MASK = [
    [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]] + [[0, 0, 1, 0]] * 4 + [[0, 0, 0, 1]] * 2,
    [[1, 0, 0, 0]] * 2 + [[0, 1, 0, 0]] * 3 + [[0, 0, 1, 0]] + [[0, 0, 0, 1]] * 3,
]
PACKED_L2G_IDS = [
    [[4, 3, 3, 3], [3, 4, 3, 3]] + [[3, 3, 4, 3]] * 5 + [[3, 3, 3, 4]] * 2,
    [[4, 3, 3, 3]] * 2 + [[3, 4, 3, 3]] * 3 + [[3, 3, 4, 3]] + [[3, 3, 3, 4]] * 3,
]


def _expect_packed(side, hard_g2l: bool, hard_l2g: bool) -> None:
    l2g = np.array(PACKED_L2G_MASK)
    hard = np.array(PACKED_HARD_L2G_MASK)
    assert_side(
        side,
        l2l_att_mask=PACKED_L2L_MASK,
        g2g_att_mask=PACKED_G2G_MASK,
        l2g_att_mask=hard if hard_l2g else l2g,
        g2l_att_mask=(hard if hard_g2l else l2g).transpose(0, 2, 1),
        l2l_relative_att_ids=[[[2, 2, 0, 1, 1]] * 9] * 2,
        g2g_relative_att_ids=[[[0, 1, 1, 1], [2, 0, 1, 1], [2, 2, 0, 1], [2, 2, 2, 0]]] * 2,
        l2g_relative_att_ids=PACKED_L2G_IDS,
        g2l_relative_att_ids=np.array(PACKED_L2G_IDS).transpose(0, 2, 1),
    )


HARD_COMBOS = pytest.mark.parametrize(
    "hard_g2l, hard_l2g", [(False, False), (True, False), (False, True), (True, True)]
)


@HARD_COMBOS
def test_packed_documents_from_breakpoints(hard_g2l, hard_l2g):
    side = side_inputs(LONG_BP, GLOBAL_BP, SENTENCE_IDS, 2, 1, use_hard_g2l_mask=hard_g2l, use_hard_l2g_mask=hard_l2g)
    _expect_packed(side, hard_g2l, hard_l2g)


@HARD_COMBOS
def test_packed_documents_from_example_ids(hard_g2l, hard_l2g):
    # any distinct non-negative ids will do: relabel 2 -> 5, 1 -> 9
    relabel = np.array([0, 9, 5])
    side = side_inputs_from_example_ids(
        relabel[LONG_EXAMPLE_IDS],
        relabel[GLOBAL_EXAMPLE_IDS],
        SENTENCE_IDS,
        2,
        1,
        use_hard_g2l_mask=hard_g2l,
        use_hard_l2g_mask=hard_l2g,
    )
    _expect_packed(side, hard_g2l, hard_l2g)


def test_example_ids_count_breakpoints_from_the_end():
    np.testing.assert_array_equal(example_ids_from_breakpoints(LONG_BP), LONG_EXAMPLE_IDS)
    np.testing.assert_array_equal(example_ids_from_breakpoints(GLOBAL_BP), GLOBAL_EXAMPLE_IDS)


def test_ignore_masks_exempt_rows_from_hard_masks_within_their_example():
    # row 0 of the packed case, unbatched: global 0 (a CLS) and long token 2 ignore the hard masks
    args = (LONG_BP[0], GLOBAL_BP[0], SENTENCE_IDS[0], 2, 1)
    ignore_g2l, ignore_l2g = [1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0, 0]
    side = side_inputs(
        *args,
        use_hard_g2l_mask=True,
        ignore_hard_g2l_mask=ignore_g2l,
        use_hard_l2g_mask=True,
        ignore_hard_l2g_mask=ignore_l2g,
    )
    assert_side(
        side,
        g2l_att_mask=[
            [1, 1, 1, 0, 0, 0, 0, 0, 0],  # CLS: every token of its own document, no more
            [0, 1, 0, 0, 0, 0, 0, 0, 0],
            [0, 0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 0, 0, 1, 1],
        ],
        l2g_att_mask=[[1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0]] + [[0, 0, 1, 0]] * 4 + [[0, 0, 0, 1]] * 2,
        l2g_relative_att_ids=PACKED_L2G_IDS[0],  # ids never change with masks
    )
    # without the hard masks the ignore masks change nothing
    plain = side_inputs(*args, ignore_hard_g2l_mask=ignore_g2l, ignore_hard_l2g_mask=ignore_l2g)
    assert_side(plain, l2g_att_mask=PACKED_L2G_MASK[0], g2l_att_mask=np.array(PACKED_L2G_MASK[0]).T)


def test_zero_max_distance_gives_no_relative_ids_like_the_reference():
    side = side_inputs(LONG_BP, GLOBAL_BP, SENTENCE_IDS, 2, 0)
    assert side.l2l_relative_att_ids is None and side.g2g_relative_att_ids is None
    assert side.l2g_relative_att_ids is None and side.g2l_relative_att_ids is None
    assert_side(side, l2l_att_mask=PACKED_L2L_MASK, l2g_att_mask=PACKED_L2G_MASK)


def test_torch_in_torch_out():
    side = side_inputs(torch.tensor(LONG_BP), torch.tensor(GLOBAL_BP), torch.tensor(SENTENCE_IDS), 2, 1)
    for name in SIDE_INPUT_NAMES:
        value = getattr(side, name)
        assert isinstance(value, torch.Tensor) and value.dtype == torch.int32, name
    _expect_packed(side.to_numpy(), False, False)
    single = side_inputs(torch.tensor(LONG_BP[1]), torch.tensor(GLOBAL_BP[1]), torch.tensor(SENTENCE_IDS[1]), 2, 1)
    assert single.l2l_att_mask.shape == (9, 5) and single.g2l_att_mask.shape == (4, 9)


# -- fixed blocks -------------------------------------------------------------------------------
# L=11, 4 tokens per block -> G=3. Row 0 has 7 real tokens, so block 2 is all padding.
FIXED_MASK = [[1] * 7 + [0] * 4, [1] * 11]


def test_fixed_blocks():
    side, global_token_ids = fixed_block_side_inputs(FIXED_MASK, 4, 2, 2, global_token_id=7)
    real, pad = [1] * 7 + [0] * 4, [0] * 7 + [1] * 4
    assert global_token_ids.dtype == np.int32
    np.testing.assert_array_equal(global_token_ids, [[7, 7, 0], [7, 7, 7]])
    assert_side(
        side,
        l2l_att_mask=[
            [
                [0, 0, 1, 1, 1],
                [0, 1, 1, 1, 1],
                [1, 1, 1, 1, 1],
                [1, 1, 1, 1, 1],
                [1, 1, 1, 1, 1],
                [1, 1, 1, 1, 0],
                [1, 1, 1, 0, 0],  # the last real tokens
                [0, 0, 1, 1, 1],
                [0, 1, 1, 1, 1],
                [1, 1, 1, 1, 0],
                [1, 1, 1, 0, 0],  # padding
            ],
            [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], *[[1, 1, 1, 1, 1]] * 7, [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]],
        ],
        g2g_att_mask=[[[1, 1, 0], [1, 1, 0], [0, 0, 1]], np.ones((3, 3))],
        g2l_att_mask=[[real, real, pad], np.ones((3, 11))],
        l2g_att_mask=[np.array([real, real, pad]).T, np.ones((11, 3))],
        l2l_relative_att_ids=[[[4, 3, 0, 1, 2]] * 11] * 2,
        g2g_relative_att_ids=[[[0, 1, 2], [3, 0, 1], [4, 3, 0]]] * 2,
        g2l_relative_att_ids=[[[6] * 4 + [5] * 7, [5] * 4 + [6] * 4 + [5] * 3, [5] * 8 + [6] * 3]] * 2,
    )


def test_fixed_blocks_hard_g2l_keeps_padding_apart():
    side, _ = fixed_block_side_inputs(FIXED_MASK[0], 4, 2, 2, use_hard_g2l_mask=True, use_hard_l2g_mask=True)
    g2l = [[1] * 4 + [0] * 7, [0] * 4 + [1] * 3 + [0] * 4, [0] * 8 + [1] * 3]  # token 7 is padding in block 1
    assert_side(side, g2l_att_mask=g2l, l2g_att_mask=[[1, 0, 0]] * 4 + [[0, 1, 0]] * 3 + [[0, 0, 0]] + [[0, 0, 1]] * 3)
    owners, global_mask = fixed_block_layout(np.array(FIXED_MASK), 4)
    np.testing.assert_array_equal(owners, [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]] * 2)
    np.testing.assert_array_equal(global_mask, [[1, 1, 0], [1, 1, 1]])


# -- building blocks ----------------------------------------------------------------------------
def test_relative_position_ids_clip_right_then_left():
    delta = np.array([[-5, -3, -2, -1, 0, 1, 2, 3, 5]])
    np.testing.assert_array_equal(relative_position_ids(delta, 3), [[6, 6, 5, 4, 0, 1, 2, 3, 3]])
    np.testing.assert_array_equal(relative_position_ids(delta, 0), np.zeros((1, 9)))
    with pytest.raises(SideInputError, match="non-negative"):
        relative_position_ids(delta, -1)


def test_window_view_and_l2l_window():
    np.testing.assert_array_equal(window_view([5, 6, 7], 1, fill=-9), [[-9, 5, 6], [5, 6, 7], [6, 7, -9]])
    mask, ids = l2l_window([[1, 1, 0]], 2, 1)
    np.testing.assert_array_equal(mask, [[[0, 0, 1, 1, 0], [0, 1, 1, 0, 0], [0, 0, 1, 0, 0]]])
    np.testing.assert_array_equal(ids, [[[2, 2, 0, 1, 1]] * 3])


def test_same_segment_with_large_and_scattered_ids():
    got = same_segment([[1000, -4, 1000, 7]], [[7, 1000, 3]])  # takes the sorting path
    np.testing.assert_array_equal(got, [[[0, 1, 0], [0, 0, 0], [0, 1, 0], [1, 0, 0]]])


def test_owner_labels_both_layouts_and_out_of_range_owners():
    owner = [1, -1, 0, 5]  # -1 and 5 own nothing (G=2)
    np.testing.assert_array_equal(
        owner_labels(owner, 2, belongs=9, does_not_belong=8), [[8, 9], [8, 8], [9, 8], [8, 8]]
    )
    np.testing.assert_array_equal(owner_labels(owner, 2, global_major=True), [[0, 0, 1, 0], [1, 0, 0, 0]])


def test_restrict_to_owner_with_exempt_rows():
    mask = np.ones((1, 3, 4), np.int32)  # [B, G=3, L=4], g2l layout
    restrict_to_owner(mask, [[0, 2, 2, 1]], exempt=[[0, 1, 0]], global_major=True)
    np.testing.assert_array_equal(mask, [[[1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]]])
    with pytest.raises(SideInputError, match="C-contiguous int32"):
        restrict_to_owner(np.ones((1, 4, 3), np.int32).transpose(0, 2, 1), [[0, 2, 2, 1]], global_major=True)


def test_allocate_side_inputs_carves_one_buffer():
    side = allocate_side_inputs(2, 16, 3, 2)
    base = side.l2l_att_mask.base
    assert all(getattr(side, n).base is base for n in SIDE_INPUT_NAMES)
    assert side.l2l_att_mask.shape == (2, 16, 5) and side.g2l_relative_att_ids.shape == (2, 3, 16)
    assert allocate_side_inputs(1, 4, 2, 1, with_ids=False).l2g_relative_att_ids is None


# -- bad arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(local_radius=0), "local_radius must be positive, got 0"),
        (dict(local_radius=-2), "local_radius must be positive, got -2"),
        (dict(local_radius=1.5), "local_radius must be an integer"),
        (dict(relative_pos_max_distance=-1), "relative_pos_max_distance must be non-negative"),
        (dict(sentence_ids=[[0] * 8] * 2), r"sentence_ids has shape \[2, 8\] but long_breakpoints has \[2, 9\]"),
        (dict(global_breakpoints=[[0, 0, 1]]), "does not share the batch"),
        (dict(long_breakpoints=[[0, 2] + [0] * 7, [0] * 9]), r"only 0 and 1, found 2 at index \[0, 1\]"),
        (dict(long_breakpoints=np.zeros((2, 9))), "must hold integers, got dtype float64"),
        (dict(long_breakpoints=np.zeros((1, 2, 9), int)), "must be \\[batch, long_length\\]"),
        (dict(ignore_hard_g2l_mask=[[0, 1, 0]] * 2), "ignore_hard_g2l_mask has shape"),
        (dict(ignore_hard_l2g_mask=[[3] * 9] * 2), "ignore_hard_l2g_mask must hold only 0 and 1"),
    ],
)
def test_bad_arguments_raise_side_input_errors(change, message):
    args = dict(
        long_breakpoints=LONG_BP,
        global_breakpoints=GLOBAL_BP,
        sentence_ids=SENTENCE_IDS,
        local_radius=2,
        relative_pos_max_distance=1,
    )
    args.update(change)
    with pytest.raises(SideInputError, match=message) as info:
        side_inputs(**args)
    assert isinstance(info.value, CompileError) and isinstance(info.value, GraphattnError)


def test_bad_arguments_of_the_other_entry_points():
    with pytest.raises(SideInputError, match="num_tokens_per_block must be positive"):
        fixed_block_side_inputs(FIXED_MASK, 0, 2, 2)
    with pytest.raises(SideInputError, match="input_mask must hold only 0 and 1"):
        fixed_block_side_inputs([[1, 2, 0]], 2, 2, 2)
    with pytest.raises(SideInputError, match="long_example_ids must be non-negative, found -1"):
        side_inputs_from_example_ids([[-1, 0]], [[0]], [[0, 0]], 1, 1)


# -- property tests against a per-pair reference -------------------------------------------------
def reference_relative_id(delta: int, k: int) -> int:
    if delta == 0:
        return 0
    return min(delta, k) if delta > 0 else k + min(-delta, k)


def reference_side_inputs(long_ex, global_ex, owner, r, k, hard_g2l, ignore_g2l, hard_l2g, ignore_l2g):
    """Straight from docs/DESIGN.md §3 and the reference's docs, one pair at a time."""
    batch, long_length = long_ex.shape
    global_length = global_ex.shape[1]
    ignore_g2l = np.zeros_like(global_ex) if ignore_g2l is None else ignore_g2l
    ignore_l2g = np.zeros_like(long_ex) if ignore_l2g is None else ignore_l2g
    out = {
        "l2l_att_mask": np.zeros((batch, long_length, 2 * r + 1), int),
        "l2l_relative_att_ids": np.zeros((batch, long_length, 2 * r + 1), int),
        "g2g_att_mask": np.zeros((batch, global_length, global_length), int),
        "g2g_relative_att_ids": np.zeros((batch, global_length, global_length), int),
        "l2g_att_mask": np.zeros((batch, long_length, global_length), int),
        "l2g_relative_att_ids": np.zeros((batch, long_length, global_length), int),
        "g2l_att_mask": np.zeros((batch, global_length, long_length), int),
        "g2l_relative_att_ids": np.zeros((batch, global_length, long_length), int),
    }
    for b in range(batch):
        for i in range(long_length):
            for c in range(2 * r + 1):
                j = i + c - r
                out["l2l_att_mask"][b, i, c] = 0 <= j < long_length and long_ex[b, j] == long_ex[b, i]
                out["l2l_relative_att_ids"][b, i, c] = reference_relative_id(c - r, k)
        for g in range(global_length):
            for h in range(global_length):
                out["g2g_att_mask"][b, g, h] = global_ex[b, g] == global_ex[b, h]
                out["g2g_relative_att_ids"][b, g, h] = reference_relative_id(h - g, k)
        for i in range(long_length):
            for g in range(global_length):
                same_example = long_ex[b, i] == global_ex[b, g]
                owns = owner[b, i] == g
                out["l2g_att_mask"][b, i, g] = same_example and (not hard_l2g or owns or ignore_l2g[b, i] == 1)
                out["g2l_att_mask"][b, g, i] = same_example and (not hard_g2l or owns or ignore_g2l[b, g] == 1)
                out["l2g_relative_att_ids"][b, i, g] = out["g2l_relative_att_ids"][b, g, i] = 2 * k + 1 + owns
    return out


def zero_ones(draw, shape):
    return np.array(
        draw(st.lists(st.integers(0, 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))), dtype=int
    ).reshape(shape)


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_side_inputs_match_the_per_pair_reference(data):
    draw = data.draw
    batch, long_length, global_length = draw(st.integers(1, 3)), draw(st.integers(1, 18)), draw(st.integers(0, 7))
    r, k = draw(st.integers(1, 12)), draw(st.integers(0, 5))
    long_bp, global_bp = zero_ones(draw, (batch, long_length)), zero_ones(draw, (batch, global_length))
    owner_values = st.integers(-1, global_length + 1)
    owner = np.array(draw(st.lists(owner_values, min_size=batch * long_length, max_size=batch * long_length))).reshape(
        batch, long_length
    )
    hard_g2l, hard_l2g = draw(st.booleans()), draw(st.booleans())
    ignore_g2l = zero_ones(draw, (batch, global_length)) if draw(st.booleans()) else None
    ignore_l2g = zero_ones(draw, (batch, long_length)) if draw(st.booleans()) else None

    side = side_inputs(long_bp, global_bp, owner, r, k, hard_g2l, ignore_g2l, hard_l2g, ignore_l2g)
    long_ex = np.array([[long_bp[b, i:].sum() for i in range(long_length)] for b in range(batch)])
    global_ex = np.array([[global_bp[b, g:].sum() for g in range(global_length)] for b in range(batch)]).reshape(
        batch, global_length
    )
    expected = reference_side_inputs(long_ex, global_ex, owner, r, k, hard_g2l, ignore_g2l, hard_l2g, ignore_l2g)
    for name in SIDE_INPUT_NAMES:
        got = getattr(side, name)
        if k == 0 and "relative" in name:
            assert got is None
            continue
        assert got.dtype == np.int32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, expected[name], err_msg=name)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fixed_blocks_match_the_per_pair_reference(data):
    draw = data.draw
    batch, long_length, per_block = draw(st.integers(1, 3)), draw(st.integers(1, 18)), draw(st.integers(1, 7))
    r, k, token_id = draw(st.integers(1, 8)), draw(st.integers(1, 4)), draw(st.integers(0, 5))
    hard_g2l, hard_l2g = draw(st.booleans()), draw(st.booleans())
    input_mask = zero_ones(draw, (batch, long_length))  # padding anywhere, not only at the end

    side, global_token_ids = fixed_block_side_inputs(input_mask, per_block, r, k, hard_g2l, hard_l2g, token_id)
    global_length = -(-long_length // per_block)
    owner = np.array([[i // per_block for i in range(long_length)]] * batch)
    global_mask = np.array(
        [
            [int(input_mask[b, g * per_block : (g + 1) * per_block].any()) for g in range(global_length)]
            for b in range(batch)
        ]
    )
    expected = reference_side_inputs(input_mask, global_mask, owner, r, k, hard_g2l, None, hard_l2g, None)
    np.testing.assert_array_equal(global_token_ids, token_id * global_mask)
    for name in SIDE_INPUT_NAMES:
        np.testing.assert_array_equal(getattr(side, name), expected[name], err_msg=name)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 40), min_size=1, max_size=12), st.lists(st.integers(-3, 40), min_size=0, max_size=12))
def test_same_segment_matches_pairwise_equality(query, key):
    got = same_segment([query], [key])
    expected = [[[int(q == k) for k in key] for q in query]]
    np.testing.assert_array_equal(
        got.reshape(1, len(query), len(key)), np.array(expected).reshape(1, len(query), len(key))
    )
